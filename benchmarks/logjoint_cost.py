"""Cost of one batched log joint + gradient against the bare Cholesky floor and GPyTorch (issue 2).

For Boston's training set (N = 455, D = 15) and S = 1, 8, 32 draws of theta:

* ``gpvi``: ``model.log_joint(theta)`` for theta of shape (S, D) and its gradient (fast path for the default
  ScaleKernel(RBF) kernel), and the generic GPyTorch-kernel path of gpvi (``use_fast_path = False``);
* ``floor``: ``torch.linalg.cholesky`` + ``torch.cholesky_inverse`` of an (S, N, N) SPD batch — any exact
  gradient needs K^{-1};
* ``gpytorch``: ``ExactMarginalLogLikelihood`` forward + backward of an ExactGP with the same kernel, one theta at
  a time (its kernels are not batched over hyperparameters), Cholesky forced (``max_cholesky_size``).

Reports the median time per draw over several repeats and the ratios. Also: one log joint + gradient for
N = 250 ... 4000 (S = 1) with the log-log slope (expect about 3), and 1 vs 2 torch threads at N = 455.

Usage: ``OMP_NUM_THREADS=1 python benchmarks/logjoint_cost.py [--quick]``

Before/after a change: ``--ab DIR`` times the same batched log joint + gradient (Boston, S = 1, 8, 32) with the
gpvi of this tree and with the gpvi under ``DIR`` (another checkout, e.g.
``git archive HEAD | tar -x -C /tmp/base``), each in its own fresh process, alternating which goes first, over
``--ab-rounds`` rounds; it reports medians and the median per-round ratio, with the load average before and after,
in ``results/logjoint_cost_ab.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import gpytorch
import numpy as np
import torch

_HERE = Path(__file__).resolve().parents[1]
# --ab-worker ROOT: this process times the gpvi found under ROOT (a baseline checkout or this tree)
_ROOT = Path(sys.argv[sys.argv.index("--ab-worker") + 1]) if "--ab-worker" in sys.argv[:-1] else _HERE
sys.path.insert(0, str(_HERE))
sys.path.insert(0, str(_ROOT))
import gpvi  # noqa: E402
from benchmarks._common import header, median_time, write  # noqa: E402


def gpvi_runner(model, theta, fast=True):
    th = theta.clone().requires_grad_(True)

    def run():
        model.use_fast_path = fast
        try:
            v = model.log_joint(th)
            (g,) = torch.autograd.grad(v.sum(), th)
        finally:
            model.use_fast_path = True
        return g

    return run


def gpvi_cost(model, theta, repeats):
    return median_time(gpvi_runner(model, theta), repeats=repeats)[0] / theta.shape[0]


def floor_runner(N, S, gen):
    A = torch.randn(S, N, N, generator=gen, dtype=torch.float64)
    K = A @ A.transpose(-1, -2) / N + torch.eye(N, dtype=torch.float64)

    def run():
        L = torch.linalg.cholesky(K)
        return torch.cholesky_inverse(L)

    return run


def floor_cost(N, S, repeats, gen):
    return median_time(floor_runner(N, S, gen), repeats=repeats)[0] / S


def interleaved(runners, repeats):
    """Time each runner once per round, ``repeats`` rounds (after one warm-up round): all times, per runner.

    Interleaving makes the per-round ratios comparable on a machine whose load drifts.
    """
    for fn in runners.values():
        fn()
    times = {k: [] for k in runners}
    for _ in range(repeats):
        for k, fn in runners.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return times


class _ExactGP(gpytorch.models.ExactGP):
    def __init__(self, X, y, lik, d):
        super().__init__(X, y, lik)
        self.mean = gpytorch.means.ZeroMean()
        self.cov = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=d))

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean(x), self.cov(x))


def gpytorch_runner(X, y, theta):
    d = X.shape[1]
    lik = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(1e-8))
    gp = _ExactGP(X, y, lik, d).double()
    gp.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(lik, gp)

    def run():
        for t in theta:
            gp.cov.base_kernel.lengthscale = torch.exp(0.5 * t[:d])
            gp.cov.outputscale = torch.exp(t[d])
            lik.noise = torch.exp(t[d + 1])
            gp.zero_grad()
            with gpytorch.settings.max_cholesky_size(10**7):
                loss = -mll(gp(X), y)
            loss.backward()

    return run


AB_SIZES = (1, 8, 32)


def ab_worker(repeats: int) -> None:
    """Print ``{"wall"|"cpu": {S: [seconds per draw, ...]}}`` for the batched log joint + gradient of the gpvi under
    ``_ROOT``, its S runners interleaved (one warm-up round). CPU time (``time.process_time``, one thread) is kept
    beside wall time: on a loaded machine it is not inflated by the time the process waits for a core."""
    assert Path(gpvi.__file__).resolve().is_relative_to(_ROOT.resolve()), gpvi.__file__
    torch.set_num_threads(1)
    ds = gpvi.datasets.load_boston(seed=0)
    model = gpvi.GPRegression(ds.X_train, ds.y_train)
    gen = torch.Generator().manual_seed(0)
    runners = {S: gpvi_runner(model, model.initial_theta() + 0.1 * torch.randn(S, model.dim, generator=gen,
                                                                                dtype=torch.float64))
               for S in AB_SIZES}
    for fn in runners.values():
        fn()
    out = {"wall": {S: [] for S in AB_SIZES}, "cpu": {S: [] for S in AB_SIZES}}
    for _ in range(repeats):
        for S, fn in runners.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            out["cpu"][S].append((time.process_time() - c0) / S)
            out["wall"][S].append((time.perf_counter() - w0) / S)
    print(json.dumps(out))


def ab_compare(baseline: Path, rounds: int, repeats: int, note: str = "") -> None:
    """Alternate fresh worker processes of the baseline and of this tree; write ``logjoint_cost_ab``."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    trees = {"baseline": baseline.resolve(), "current": _HERE}
    med = {clock: {k: {S: [] for S in AB_SIZES} for k in trees} for clock in ("wall", "cpu")}
    load_before = os.getloadavg()
    for r in range(rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for k in order:
            out = subprocess.run([sys.executable, __file__, "--ab-worker", str(trees[k]), "--ab-repeats",
                                  str(repeats)], env=env, check=True, capture_output=True, text=True).stdout
            per = json.loads(out.strip().splitlines()[-1])
            for clock in med:
                for S in AB_SIZES:
                    med[clock][k][S].append(statistics.median(per[clock][str(S)]))
        print(f"round {r + 1}/{rounds} (cpu): " + "  ".join(
            f"S={S} base {med['cpu']['baseline'][S][-1] * 1e3:.2f} ms, current {med['cpu']['current'][S][-1] * 1e3:.2f}"
            f" ms" for S in AB_SIZES), flush=True)
    load_after = os.getloadavg()
    md = header("Log joint + gradient: this tree against a baseline checkout")
    md += (f"\n{note + chr(10) + chr(10) if note else ''}Baseline: `{baseline}`, current: `{_HERE}`. Boston training set (N = 455, D = 15), batched log joint + autograd gradient "
           f"at initial_theta + 0.1 N(0, I) (seed 0), default kernel (fast path), one thread. {rounds} rounds; each "
           f"round runs one fresh process per tree (order alternating), which times {repeats} interleaved repeats of "
           f"every S after a warm-up; per-process medians per draw, then medians over rounds; ratio = median over "
           f"rounds of current / baseline. CPU = process time (not inflated while the process waits for a core), "
           f"wall = elapsed. Load average (1, 5, 15 min) before {[round(x, 2) for x in load_before]}, after "
           f"{[round(x, 2) for x in load_after]} on {os.cpu_count()} cores.\n")
    rows = []
    for clock in ("cpu", "wall"):
        md += (f"\n## {clock.upper()} time\n\n| S | baseline ms/draw | current ms/draw | current / baseline | "
               f"per-round ratios |\n|---|---|---|---|---|\n")
        for S in AB_SIZES:
            b, c = med[clock]["baseline"][S], med[clock]["current"][S]
            ratios = [x / y for x, y in zip(c, b)]
            rows.append((clock, S, statistics.median(b), statistics.median(c), statistics.median(ratios), ratios))
            md += (f"| {S} | {statistics.median(b) * 1e3:.2f} | {statistics.median(c) * 1e3:.2f} | "
                   f"{statistics.median(ratios):.3f} | {', '.join(f'{x:.3f}' for x in ratios)} |\n")
    print(md)
    write("logjoint_cost_ab", md, {"baseline": str(baseline), "current": str(_HERE), "note": note, "rows": rows, "per_round": med,
                                   "load_before": load_before, "load_after": load_after})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ab", type=Path, default=None, metavar="DIR",
                    help="compare with the gpvi under DIR (a baseline checkout) instead of the full benchmark")
    ap.add_argument("--ab-rounds", type=int, default=7)
    ap.add_argument("--ab-repeats", type=int, default=15)
    ap.add_argument("--ab-note", default="", help="a line saying what the two trees are, put into the report")
    ap.add_argument("--ab-worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ab_worker is not None:
        return ab_worker(args.ab_repeats)
    if args.ab is not None:
        return ab_compare(args.ab, args.ab_rounds, args.ab_repeats, args.ab_note)
    repeats = 3 if args.quick else 15
    gen = torch.Generator().manual_seed(0)
    ds = gpvi.datasets.load_boston(seed=0)
    model = gpvi.GPRegression(ds.X_train, ds.y_train)
    N, D = model.num_data, model.dim
    base = gpvi.ML2(num_restarts=1).run(model).theta
    rows = []
    for S in (1, 8, 32):
        theta = base + 0.1 * torch.randn(S, D, generator=gen, dtype=torch.float64)
        S_gp = min(S, 8)                    # GPyTorch is timed on at most 8 thetas (one at a time), per draw
        times = interleaved({"floor": floor_runner(N, S, gen), "gpvi": gpvi_runner(model, theta),
                             "generic": gpvi_runner(model, theta, fast=False),
                             "gpytorch": gpytorch_runner(ds.X_train, ds.y_train, theta[:S_gp])}, repeats)
        per = {k: [t / (S_gp if k == "gpytorch" else S) for t in v] for k, v in times.items()}
        med = {k: statistics.median(v) for k, v in per.items()}
        r_floor = statistics.median(a / f for a, f in zip(per["gpvi"], per["floor"]))
        r_gen = statistics.median(a / f for a, f in zip(per["generic"], per["floor"]))
        r_gpyt = statistics.median(p / a for p, a in zip(per["gpytorch"], per["gpvi"]))
        rows.append((S, med["floor"], med["gpvi"], med["generic"], med["gpytorch"], r_floor, r_gen, r_gpyt))
        print(f"S={S:3d} floor {med['floor']*1e3:7.2f} ms  gpvi {med['gpvi']*1e3:7.2f} ms ({r_floor:.2f}x floor, "
              f"{r_gpyt:.2f}x faster than GPyTorch)  generic {med['generic']*1e3:7.2f} ms  "
              f"gpytorch {med['gpytorch']*1e3:7.2f} ms", flush=True)

    # threads
    thread_rows = []
    theta8 = base + 0.1 * torch.randn(8, D, generator=gen, dtype=torch.float64)
    for nt in (1, 2):
        torch.set_num_threads(nt)
        thread_rows.append((nt, gpvi_cost(model, theta8, repeats), floor_cost(N, 8, repeats, gen)))
    torch.set_num_threads(1)

    # scaling in N (synthetic inputs with Boston's dimension)
    sizes = (250, 500, 1000, 2000) if args.quick else (250, 500, 1000, 2000, 4000)
    scale_rows = []
    for n in sizes:
        X = torch.randn(n, 13, generator=gen, dtype=torch.float64)
        y = torch.sin(X[:, 0]) + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
        m = gpvi.GPRegression(X, y)
        th = m.initial_theta().unsqueeze(0)
        t = gpvi_cost(m, th, 3 if n >= 2000 else repeats)
        tf = floor_cost(n, 1, 3 if n >= 2000 else repeats, gen)
        scale_rows.append((n, t, tf))
        print(f"N={n:5d} gpvi {t*1e3:9.1f} ms  floor {tf*1e3:9.1f} ms  ratio {t/tf:.2f}", flush=True)
    ln = np.log([r[0] for r in scale_rows])
    slope = float(np.polyfit(ln[-3:], np.log([r[1] for r in scale_rows])[-3:], 1)[0])
    slope_floor = float(np.polyfit(ln[-3:], np.log([r[2] for r in scale_rows])[-3:], 1)[0])

    md = header("Log joint + gradient: cost against the Cholesky floor and GPyTorch (issue 2)")
    md += (f"\nBoston training set, N = {N}, D = {D}; {repeats} interleaved rounds (each round times floor, gpvi, "
           "generic and GPyTorch once, so load drift hits all alike); times are medians per draw of theta, ratios "
           "are medians of the per-round ratios.\n"
           "floor = torch.linalg.cholesky + torch.cholesky_inverse of an (S, N, N) batch; gpvi = batched log joint "
           "+ autograd gradient (hand-written ScaleKernel(RBF) covariance); generic = gpvi through GPyTorch's "
           "kernel code (functional_call); gpytorch = ExactMarginalLogLikelihood forward+backward, one theta at a "
           "time, Cholesky forced. Targets: gpvi <= 2x floor, >= 2x faster than GPyTorch.\n\n")
    md += "| S | floor ms | gpvi ms | gpvi / floor | generic ms | generic / floor | GPyTorch ms | GPyTorch / gpvi |\n"
    md += "|---|---|---|---|---|---|---|---|\n"
    for S, tf, ta, tg, tp, rf, rg, rp in rows:
        md += (f"| {S} | {tf*1e3:.2f} | {ta*1e3:.2f} | {rf:.2f} | {tg*1e3:.2f} | {rg:.2f} | {tp*1e3:.2f} | "
               f"{rp:.2f} |\n")
    md += "\n## Threads (S = 8, N = 455)\n\n| torch threads | gpvi ms/draw | floor ms/draw |\n|---|---|---|\n"
    for nt, ta, tf in thread_rows:
        md += f"| {nt} | {ta*1e3:.2f} | {tf*1e3:.2f} |\n"
    md += (f"\n## Scaling in N (S = 1, d = 13, synthetic)\n\nlog-log slope over the largest three sizes: gpvi "
           f"{slope:.2f}, floor {slope_floor:.2f} (expect about 3).\n\n| N | gpvi ms | floor ms | ratio |\n|---|---|---|---|\n")
    for n, t, tf in scale_rows:
        md += f"| {n} | {t*1e3:.1f} | {tf*1e3:.1f} | {t/tf:.2f} |\n"
    print(md)
    write("logjoint_cost" + ("_quick" if args.quick else ""), md,
          {"rows": rows, "threads": thread_rows, "scaling": scale_rows, "slope": slope})


if __name__ == "__main__":
    main()
