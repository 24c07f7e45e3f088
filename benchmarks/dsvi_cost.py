"""Per-step cost of DSVI versus the dimension D: O(D^2) for a full scale C, O(D) for a diagonal one.

Target: log g(theta) = -||theta||^2 / 2 (its value and gradient cost O(S D), negligible next to the O(S D^2) of a
full-scale step). For each D: the median over 5 repeats of the time per step of ``DSVI.step`` (S = 4 draws), and
the time per call of the log joint + ``autograd.grad`` alone on the same (S, D) batch; "engine" = step - log joint.
Slopes are least-squares fits of log(time) on log(D) over the largest three sizes (1 = linear, 2 = quadratic).

Usage: ``OMP_NUM_THREADS=1 python benchmarks/dsvi_cost.py [--quick]``
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpvi  # noqa: E402
from benchmarks._common import header, write  # noqa: E402
from gpvi.inference.derivatives import log_joint_and_grad  # noqa: E402
from gpvi.inference.dsvi.engine import DSVI, SGD, Convergence  # noqa: E402


def per_call(fn, min_time: float = 0.2) -> float:
    """Median over 5 repeats of the time per call, each repeat lasting >= min_time seconds."""
    fn()
    n, t = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - t0
        if t >= min_time:
            break
        n *= 2
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times)


def slope(ds: list[int], ts: list[float]) -> float:
    x = [math.log(d) for d in ds[-3:]]
    y = [math.log(t) for t in ts[-3:]]
    mx, my = statistics.fmean(x), statistics.fmean(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)


def measure(scale: str, D: int, S: int = 4) -> tuple[float, float]:
    target = gpvi.Target(lambda th: -0.5 * (th * th).sum(-1), names=D)
    eng = DSVI(scale, num_draws=S, num_steps=10 ** 9, optimizer=SGD(lr=1e-3), progress_bar=False, polyak=None,
               convergence=Convergence(window=200))
    state = eng.init(target, torch.zeros(D, dtype=torch.float64))
    t_step = per_call(lambda: eng.step(target, state))
    theta = torch.randn(S, D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    t_lj = per_call(lambda: log_joint_and_grad(target, theta))
    return t_step, t_lj


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    sizes = {"diag": [10, 100, 1000, 2000, 10_000, 100_000] if not args.quick else [10, 1000, 10_000],
             "full": [10, 25, 50, 100, 200, 400, 1000] if not args.quick else [10, 50, 200]}
    rows, data = [], {}
    for scale, Ds in sizes.items():
        steps, ljs, engs = [], [], []
        for D in Ds:
            t_step, t_lj = measure(scale, D)
            steps.append(t_step)
            ljs.append(t_lj)
            engs.append(max(t_step - t_lj, 1e-9))
            print(scale, D, f"{1e6 * t_step:.0f} us/step, log joint {1e6 * t_lj:.0f} us", flush=True)
            rows.append(f"| {scale} | {D} | {1e6 * t_step:.0f} | {1e6 * t_lj:.0f} | {1e6 * (t_step - t_lj):.0f} |")
        data[scale] = {"D": Ds, "step_s": steps, "log_joint_s": ljs, "engine_s": engs,
                       "slope_step": slope(Ds, steps), "slope_engine": slope(Ds, engs)}
    md = header("DSVI per-step cost vs dimension D (S = 4)")
    md += ("\nTime per step (median of 5 repeats). 'log joint' = target value + autograd gradient on the (S, D) "
           "batch; 'engine' = step - log joint (draws, theta = mu + C z, outer products, checks, update, trace).\n\n"
           "| scale | D | step us | log joint us | engine us |\n|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n")
    for scale in sizes:
        d = data[scale]
        md += (f"- {scale}: log-log slope of the engine time over the three largest D = "
               f"{d['slope_engine']:.2f} (step time: {d['slope_step']:.2f})\n")
    md += ("\nExpected: ~1 for diag (O(D): z * c, g * z) and ~2 for full (O(D^2): C z and tril(g z^T)) once D is "
           "large enough that the fixed per-step Python/dispatch overhead (~100-200 us) no longer dominates. No "
           "matrix is inverted or factorised per step. At large D the diagonal engine's time is mostly drawing the "
           "S x D float64 standard normals (torch.randn float64 costs ~25 ns per number here, 7x its float32 "
           "cost). Timings on a shared 2-core machine: see the load average above.\n")
    print(md)
    write("dsvi_cost" + ("_quick" if args.quick else ""), md, data)


if __name__ == "__main__":
    main()
