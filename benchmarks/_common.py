"""Shared helpers for benchmark scripts: machine record, timing medians, result files.

Every result file starts with the date, the machine (cores, load, torch version, threads) and the command
that produced it, so numbers can be traced and compared.
"""

from __future__ import annotations

import datetime as _dt
import json
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


def write(name: str, markdown: str, data: Any | None = None) -> Path:
    """Write ``results/<name>.md`` (and ``results/<name>.json`` when ``data`` is given)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.md"
    path.write_text(markdown)
    if data is not None:
        (RESULTS / f"{name}.json").write_text(json.dumps({"machine": machine_info(), "data": data}, indent=2,
                                                         default=str))
    return path
