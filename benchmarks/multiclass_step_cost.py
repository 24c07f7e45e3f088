"""Multi-class CVI: cost of a single-site step against a full-batch step, and time to the same bound, vs N.

Synthetic 3-class data (d = 2, inputs uniform on [-2, 2]^2, labels ``(x0 > -0.5) + (x1 > 0.5)`` with 10% flipped at
random), softmax likelihood, quadrature expectations, the default kernel at its data-scaled start (no
hyperparameter learning). For each N:

* full-batch step: ``CVI(mode="full").step`` (K batched factorisations of K + S_k, all marginals, the
  expectations of every point, the site update), median of ``--repeats`` steps after one warm-up;
* single-site step: ``CVI(mode="stochastic").step`` with one point per step (a triangular solve per
  class for its marginals, its K site updates, K in-place rank-one factor updates), timed over blocks of steps
  that contain no refactorisation (median per-step time of the blocks);
* a sweep of single-site steps costs N of them plus one refactorisation; the columns give both per-step ratios;
* time to the bound: wall time of a full-batch run and of a single-site run (``tol = 1e-9``, each to its own stop
  rule), their final bounds and the difference (N <= ``--converge-max``).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.multiclass_step_cost [--ns 250 500 1000 2000]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks._common import header, write
from gpvi.inference.cvi import SingleSite
from gpvi.inference.cvi.engine import CVI
from gpvi.models.multiclass import GPMulticlass


def make_model(n: int, seed: int = 0) -> GPMulticlass:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand((n, 2), generator=g, dtype=torch.float64) * 4 - 2
    y = (X[:, 0] > -0.5).long() + (X[:, 1] > 0.5).long()
    flip = torch.rand(n, generator=g, dtype=torch.float64) < 0.1
    y = torch.where(flip, torch.randint(0, 3, (n,), generator=g), y)
    return GPMulticlass(X, y)


def full_step_time(model: GPMulticlass, repeats: int) -> float:
    eng = CVI(progress_bar=False)
    eng._configure(model)
    st = eng.init(model)
    st, _ = eng.step(model, st)                                 # leave the prior; warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        st, _ = eng.step(model, st)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def single_step_time(model: GPMulticlass, blocks: int, block: int) -> float:
    eng = CVI(mode="stochastic", single_site=SingleSite(refactor_every=10**9), progress_bar=False)
    eng._configure(model)
    st = eng.init(model)
    st, _ = eng.step(model, st)                                 # the full-batch first step and the factors
    for _ in range(5):
        st, _ = eng.step(model, st)
    per = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(block):
            st, _ = eng.step(model, st)
        per.append((time.perf_counter() - t0) / block)
    return statistics.median(per)


def converge(model: GPMulticlass, mode: str) -> tuple[float, float, int, float]:
    steps = 3000 if mode == "full" else 1 + 400 * model.num_data
    eng = CVI(mode=mode, tol=1e-9, num_steps=steps, progress_bar=False)
    t0 = time.perf_counter()
    post = eng.run(model)
    return time.perf_counter() - t0, post.elbo, int(post.info["steps"]), float(post.info["sweeps"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", type=int, nargs="+", default=[250, 500, 1000, 2000])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--converge-max", type=int, default=1000)
    args = ap.parse_args()
    rows, data = [], []
    for n in args.ns:
        model = make_model(n)
        tf = full_step_time(model, args.repeats)
        ts = single_step_time(model, blocks=5, block=max(20, min(200, n // 10)))
        rec = {"N": n, "full_step_s": tf, "single_step_s": ts, "ratio": tf / ts, "load": os.getloadavg()[0]}
        if n <= args.converge_max:
            for mode in ("full", "stochastic"):
                w, elbo, steps, sweeps = converge(model, mode)
                rec[mode] = {"wall_s": w, "elbo": elbo, "steps": steps, "sweeps": sweeps}
        data.append(rec)
        conv = ""
        if "full" in rec:
            f, s = rec["full"], rec["stochastic"]
            conv = (f"{f['wall_s']:.2f} s ({f['steps']} steps) | {s['wall_s']:.2f} s ({s['sweeps']:.0f} sweeps) | "
                    f"{s['elbo'] - f['elbo']:+.2e}")
        else:
            conv = "- | - | -"
        rows.append(f"| {n} | {1e3 * tf:.1f} | {1e3 * ts:.2f} | {tf / ts:.0f} | {n * ts / tf:.2f} | {conv} | "
                    f"{rec['load']:.1f} |")
        print(rows[-1], flush=True)
    md = header("Multi-class CVI (K = 3, softmax): single-site vs full-batch steps") + "\n" + __doc__.split("\n\n", 1)[1]
    md += ("\n| N | full-batch step (ms) | single-site step (ms) | full / single | sweep / full step "
           "| full run to tol 1e-9 | single-site run | bound single - full | load |\n"
           "|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    print(write("multiclass_step_cost", md, data))


if __name__ == "__main__":
    main()
