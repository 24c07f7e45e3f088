"""``gpvi.NUTS`` with its trees compiled (numba, ``gpvi.inference.mcmc.trees``) against the NumPy kernel: issue 57's
strict sampler overhead (at most 20 % of the gradient cost at N = 56).

``nuts_round_cost`` found the NumPy kernel's own work at 308 us a round against a 921 us batched call (33 %), and
that vectorising it over the chains in NumPy would leave about 28 %. The compiled trees do a round's tree work for
all chains in one call, and are the NumPy kernel's transitions bit for bit (``tests/inference/mcmc/test_trees.py``).
A first version of this study (commit b3e205e) measured a prototype of the state machine on the sampling phase
alone. This one measures the library:

* ``rounds``: ``gpvi.NUTS(num_chains=4, num_warmup=--warmup, num_draws=--draws, seed=1)`` on boston-0 of the stress
  suite (N = 56, D = 15) and ``small_data``'s 14-point model (D = 3), with the compiled trees and with the NumPy
  kernel (``gpvi.inference.mcmc.nuts.compiled`` patched to ``None``), alternated ``--repeats`` times. The log joint
  is timed around every call (``small_data.run_gpvi_nuts``): overhead = the chains' wall over the time inside the
  calls, minus 1. The two kernels' draws are checked equal bit for bit;
* ``compile``: what a fresh process pays before its first draw, torch, gpvi and ArviZ already imported: importing numba
  and the compiled module, a first 2-draw run with an empty numba cache (compiling) and with the cache it left
  (loading), a second run; and the size of the installed ``numba`` and ``llvmlite``.

Needs numba (``pip install gpvi[fast]``; the ``test`` extra has it). Run:
``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.nuts_compiled``. Results:
``benchmarks/studies/results/nuts_compiled.{md,json}``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.studies._common import header, write


def _problems() -> list[tuple[str, Any]]:
    from benchmarks.small_data import stress, tiny_model
    return [("boston-0", next(p["model"] for p in stress()[0] if p["id"] == "boston-0")), ("tiny", tiny_model())]


def section_rounds(a: argparse.Namespace) -> list[dict[str, Any]]:
    from benchmarks.small_data import run_gpvi_nuts
    from gpvi.inference.mcmc import nuts, trees

    assert trees.compiled() is not None, "numba is not installed"
    rows, C = [], 4
    for name, model in _problems():
        run_gpvi_nuts(model, 5, 5)                                   # load the compiled trees, warm caches
        draws = {}
        for rep in range(a.repeats):
            for kernel in ("numpy", "compiled"):
                nuts.compiled = trees.compiled if kernel == "compiled" else (lambda: None)
                try:
                    r = run_gpvi_nuts(model, a.warmup, a.draws, keep_draws=True)
                finally:
                    nuts.compiled = trees.compiled
                assert r["kernel"] == kernel
                draws.setdefault(kernel, []).append(r.pop("draws"))
                inside = r["logjoint_ms_per_grad"] * r["evals"] / 1000
                rows.append({"section": "rounds", "problem": name, "kernel": kernel, "repeat": rep, "wall_s": r["wall"],
                             "inside_s": inside, "overhead": r["overhead"], "evaluations": r["evals"],
                             "own_us_per_round": (r["wall"] - inside) / r["evals"] * C * 1e6,
                             "call_us_per_round": inside / r["evals"] * C * 1e6})
        same = all(torch.equal(x, draws["numpy"][0]) for x in draws["numpy"] + draws["compiled"])
        rows.append({"section": "same", "problem": name, "bit_for_bit": same})
    return rows


_PROBE = """
import time, warnings, numpy as np, torch, gpvi, arviz
t0 = time.perf_counter()
import numba
t1 = time.perf_counter()
from gpvi.inference.mcmc import _trees_jit
t2 = time.perf_counter()
target = gpvi.Target(lambda th: -0.5 * (th * th).sum(-1), names=["a", "b"])
def run(seed):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gpvi.NUTS(num_chains=1, num_warmup=0, num_draws=2, seed=seed, progress_bar=False).run(target)
run(0)
t3 = time.perf_counter()
run(1)
t4 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3)
"""


def _size_mb(mod: str) -> float:
    import importlib.util
    root = Path(importlib.util.find_spec(mod).origin).parent
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 2 ** 20


def section_compile(a: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=os.pathsep.join(sys.path))
        for what in ("empty cache (compiling)", "cache left by the first (loading)"):
            out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                                 check=True, cwd=Path(__file__).resolve().parents[2]).stdout.split()
            t = [float(x) for x in out[-4:]]
            rows.append({"section": "compile", "what": what, "import_numba_s": t[0], "import_kernel_s": t[1],
                         "first_run_s": t[2], "second_run_s": t[3]})
    rows += [{"section": "size", "package": m, "mb": _size_mb(m)} for m in ("numba", "llvmlite")]
    return rows


def report(rows: list[dict[str, Any]], cmd: str, a: argparse.Namespace) -> str:
    import numba

    out = [header(f"gpvi.NUTS with compiled trees against the NumPy kernel, issue 57 ({cmd})"),
           f"- numba: {numba.__version__}", "", __doc__.split("\n\n")[1], ""]
    rs = [r for r in rows if r["section"] == "rounds"]
    if rs:
        out += [f"## gpvi.NUTS, 4 chains x ({a.warmup} + {a.draws}), seed 1", "",
                "| problem | kernel | repeat | wall (s) | inside the calls (s) | evaluations | overhead | sampler's own "
                "us per round | call us per round |", "|---|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['problem']} | {r['kernel']} | {r['repeat']} | {r['wall_s']:.2f} | {r['inside_s']:.2f} | "
                f"{r['evaluations']} | {100 * r['overhead']:.0f}% | {r['own_us_per_round']:.0f} | "
                f"{r['call_us_per_round']:.0f} |" for r in rs] + [""]
        for p in dict.fromkeys(r["problem"] for r in rs):
            for k in ("numpy", "compiled"):
                sel = [r for r in rs if r["problem"] == p and r["kernel"] == k]
                out.append(f"- {p}, {k}: median overhead {100 * statistics.median(r['overhead'] for r in sel):.0f}%, "
                           f"wall {statistics.median(r['wall_s'] for r in sel):.2f} s, sampler's own "
                           f"{statistics.median(r['own_us_per_round'] for r in sel):.0f} us per round")
        out += [""] + [f"- {r['problem']}: every run's draws equal bit for bit: {r['bit_for_bit']}"
                       for r in rows if r["section"] == "same"] + [""]
    rs = [r for r in rows if r["section"] in ("compile", "size")]
    if rs:
        out += ["## What a fresh process pays first (torch, gpvi and ArviZ already imported), and install size", "",
                "| numba cache | import numba (s) | import the compiled module (s) | first run, 2 draws (s) | second "
                "run (s) |", "|---|---|---|---|---|"]
        out += [f"| {r['what']} | {r['import_numba_s']:.2f} | {r['import_kernel_s']:.2f} | {r['first_run_s']:.2f} | "
                f"{r['second_run_s']:.3f} |" for r in rs if r["section"] == "compile"]
        out += [""] + [f"- installed {r['package']}: {r['mb']:.0f} MB" for r in rs if r["section"] == "size"]
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", nargs="+", default=["rounds", "compile"])
    p.add_argument("--draws", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    cmd = "--sections " + " ".join(a.sections) + f" --draws {a.draws} --warmup {a.warmup} --repeats {a.repeats}"
    for sec in a.sections:
        rows += globals()[f"section_{sec}"](a)
    text = report(rows, cmd, a)
    write("nuts_compiled", text, {"args": vars(a), "rows": rows})
    print(text)


if __name__ == "__main__":
    main()
