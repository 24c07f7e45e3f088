"""Shared helpers for benchmark scripts: machine record, timing medians, result files.

Every result file starts with the date, the machine (cores, load, torch version, threads) and the command
that produced it, so numbers can be traced and compared.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import re
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(os.environ.get("GPVI_BENCH_OUT") or Path(__file__).resolve().parent / "results")
"""Where results go: ``benchmarks/results`` or ``$GPVI_BENCH_OUT`` (set by ``gpvi bench --out DIR``)."""


def machine_info() -> dict[str, Any]:
    """Date, host facts, torch version, thread settings, load average and the command line."""
    try:
        load = os.getloadavg()
    except OSError:  # pragma: no cover
        load = (float("nan"),) * 3
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "unset"),
        "load_avg_1_5_15": [round(x, 2) for x in load],
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }


def header(title: str) -> str:
    """Markdown header block with the machine record."""
    info = machine_info()
    lines = [f"# {title}", ""]
    lines += [f"- {k}: {v}" for k, v in info.items()]
    return "\n".join(lines) + "\n"


def median_time(fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1) -> tuple[float, list[float]]:
    """Median wall time (seconds) of ``fn()`` over ``repeats`` runs after ``warmup`` runs, and all times."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def markdown_tables(markdown: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """The pipe tables of a markdown report: ``(nearest heading above, header cells, body rows)`` each.

    Cells lose markdown emphasis (``**``) and escaped pipes (``\\|``) become ``|``.
    """
    def cells(line: str) -> list[str]:
        parts = re.split(r"(?<!\\)\|", line.strip()[1:-1])
        return [c.strip().replace("\\|", "|").replace("**", "") for c in parts]

    tables, heading, current = [], "", None
    for line in markdown.splitlines():
        t = line.strip()
        if t.startswith("#"):
            heading = t.lstrip("#").strip()
        if t.startswith("|") and t.endswith("|"):
            if current is None:
                current = (heading, cells(t), [])
            elif not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", t):
                current[2].append(cells(t))
            continue
        if current is not None:
            tables.append(current)
            current = None
    if current is not None:
        tables.append(current)
    return tables


def write_csv_tables(name: str, markdown: str, out: Path | None = None) -> list[Path]:
    """Write every table of ``markdown`` as ``<out>/csv/<name>_<k>_<heading>.csv`` (k = 1, 2, ...)."""
    folder = (out or RESULTS) / "csv"
    for old in folder.glob(f"{name}_[0-9]*_*.csv"):
        old.unlink()
    paths = []
    for k, (heading, head, rows) in enumerate(markdown_tables(markdown), 1):
        folder.mkdir(parents=True, exist_ok=True)
        slug = re.sub(r"[^a-z0-9]+", "_", heading.lower()).strip("_")[:48] or "table"
        path = folder / f"{name}_{k}_{slug}.csv"
        with path.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(head)
            w.writerows(rows)
        paths.append(path)
    return paths


def write(name: str, markdown: str, data: Any | None = None, *, folder: Path | None = None) -> Path:
    """Write ``<folder>/<name>.md``, its tables as CSV under ``<folder>/csv/``, and ``<folder>/<name>.json`` when
    ``data`` is given (``folder``: :data:`RESULTS` by default; the studies pass ``benchmarks/studies/results``)."""
    folder = RESULTS if folder is None else folder
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.md"
    path.write_text(markdown)
    write_csv_tables(name, markdown, folder)
    if data is not None:
        (folder / f"{name}.json").write_text(json.dumps({"machine": machine_info(), "data": data}, indent=2,
                                                        default=str))
    return path


if __name__ == "__main__":  # python -m benchmarks._common: (re)write the CSV tables of every committed report
    for results in (RESULTS, Path(__file__).resolve().parent / "studies" / "results"):
        for md in sorted(results.glob("*.md")):
            print(md.name, len(write_csv_tables(md.stem, md.read_text(), results)), "tables")


def nuts_latent_summary(mc: Any, target: Any, X_test: torch.Tensor, dim: int, pred_draws: int
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
    """A NUTS run over (theta, whitened latents) of a classification target: the test probabilities from
    ``pred_draws`` evenly spaced draws, the theta marginals' means and sds (the first ``dim`` coordinates) and the
    diagnostics record (R-hat max and bulk ESS min over all coordinates and over theta, divergences)."""
    d = mc.samples
    diag = mc.diagnostics()
    rhat, ess = diag["r_hat"], diag["ess_bulk"]
    idx = torch.linspace(0, d.shape[0] - 1, min(pred_draws, d.shape[0])).round().long()
    p = target.predict_proba(d[idx], X_test)
    record = {"rhat_max_all": float(rhat.max()), "rhat_max_theta": float(rhat[:dim].max()),
              "ess_bulk_min_all": float(ess.min()), "ess_bulk_min_theta": float(ess[:dim].min()),
              "divergences": mc.info.get("divergences")}
    return p, d[:, :dim].mean(0), d[:, :dim].std(0), record
