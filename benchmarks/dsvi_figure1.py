"""DSVI paper Figure 1: DSVI's reparametrised gradient vs the score-function gradient of Paisley et al. (2012).

Target (section 2.2): log g(theta) = log N(theta | m, I), D = 10, m = 2 * 1 (normalised, so the optimal bound is
0); variational q = N(mu, Sigma) with Sigma = I held fixed (as in the paper's analysis) and mu0 = 0. The exact
bound at any mu is F(mu) = -||mu - m||^2 / 2. Both methods take one draw theta ~ N(mu, I) per step and a constant
step size rho:

* DSVI (Algorithm 1, gpvi.inference.dsvi.engine.DSVI with lr_scale=0 so C stays I): mu <- mu + rho grad log g(theta) = mu + rho (m - theta);
* score function (eq. 12):                                          mu <- mu + rho f(theta) (theta - mu), f = log g.

Usage: ``OMP_NUM_THREADS=1 python benchmarks/dsvi_figure1.py [--quick]``
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpvi  # noqa: E402
from benchmarks._common import RESULTS, header, write  # noqa: E402
from gpvi.inference.dsvi.engine import DSVI, SGD  # noqa: E402

D = 10
M = torch.full((D,), 2.0, dtype=torch.float64)
LOGZ = -0.5 * D * math.log(2 * math.pi)


def log_g(th: torch.Tensor) -> torch.Tensor:
    return -0.5 * ((th - M) ** 2).sum(-1) + LOGZ


def exact_bound(mu: torch.Tensor) -> float:
    return -0.5 * float(((mu - M) ** 2).sum())


def run_dsvi(rho: float, T: int, seed: int) -> list[float]:
    curve: list[float] = []
    eng = DSVI(num_draws=1, num_steps=T, optimizer=SGD(lr=rho, lr_scale=0.0, schedule="constant"), polyak=None,
               init_scale=1.0, seed=seed, progress_bar=False, num_elbo_draws=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eng.run(gpvi.Target(log_g, names=D), init=torch.zeros(D, dtype=torch.float64),
                callback=lambda s, i: curve.append(exact_bound(s.mu)))
    return curve


def run_score(rho: float, T: int, seed: int) -> list[float]:
    gen = torch.Generator().manual_seed(seed)
    mu = torch.zeros(D, dtype=torch.float64)
    curve = []
    for _ in range(T):
        th = mu + torch.randn(D, generator=gen, dtype=torch.float64)
        mu = mu + rho * log_g(th) * (th - mu)
        curve.append(exact_bound(mu) if bool(torch.isfinite(mu).all()) else -math.inf)
        if not math.isfinite(curve[-1]) or curve[-1] < -1e8:
            curve += [-math.inf] * (T - len(curve))
            break
    return curve


def summarise(curve: list[float]) -> tuple[float, int | None]:
    tail = curve[-len(curve) // 5:]
    final = statistics.fmean(tail) if all(math.isfinite(v) for v in tail) else -math.inf
    reach = next((i + 1 for i, v in enumerate(curve) if v > -1.0), None)
    return final, reach


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    T = 1000 if args.quick else 5000
    seeds = [0, 1] if args.quick else [0, 1, 2, 3, 4]
    rates = [0.002, 0.02]
    curves: dict[tuple[str, float], list[list[float]]] = {}
    t0 = time.perf_counter()
    for rho in rates:
        curves[("DSVI", rho)] = [run_dsvi(rho, T, s) for s in seeds]
        curves[("score function", rho)] = [run_score(rho, T, s) for s in seeds]
    elapsed = time.perf_counter() - t0

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    styles = {("DSVI", rates[0]): ("tab:blue", "-"), ("DSVI", rates[1]): ("navy", "-"),
              ("score function", rates[0]): ("tab:green", "--"), ("score function", rates[1]): ("tab:red", "--")}
    for key, runs in curves.items():
        c = [v if math.isfinite(v) else float("nan") for v in runs[0]]
        col, ls = styles[key]
        ax.plot(range(1, len(c) + 1), c, color=col, ls=ls, lw=1.2, label=f"{key[0]}, rho = {key[1]:g}")
    ax.set_ylim(-25, 2)
    ax.axhline(0.0, color="k", lw=0.6)
    ax.set_xlabel("iteration")
    ax.set_ylabel("lower bound  -||mu - m||^2 / 2  (optimum 0)")
    ax.set_title("Figure 1: fitting N(m, I), D = 10, m = 2, mu0 = 0 (seed 0)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    name = "dsvi_figure1" + ("_quick" if args.quick else "")
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(RESULTS / f"{name}.png", dpi=100)
    plt.close(fig)

    rows, data = [], {}
    for (meth, rho), runs in curves.items():
        stats = [summarise(c) for c in runs]
        finals = [s[0] for s in stats]
        reach = [s[1] for s in stats]
        fin = [f for f in finals if math.isfinite(f)]
        reached = [r for r in reach if r is not None]
        rows.append(f"| {meth} | {rho:g} | {statistics.median(finals):.3f} | "
                    f"{(min(fin) if fin else float('nan')):.3f} .. {(max(fin) if fin else float('nan')):.3f} | "
                    f"{len(reached)}/{len(runs)} | {statistics.median(reached) if reached else '-'} | "
                    f"{sum(1 for f in finals if not math.isfinite(f))} |")
        data[f"{meth} rho={rho:g}"] = {"final_tail_mean": finals, "first_iter_above_-1": reach}
    md = header("DSVI paper Figure 1: reparametrised (DSVI) vs score-function gradient")
    md += (f"\nD = {D}, m = 2*1, mu0 = 0, Sigma = I fixed, one draw per step, constant rates, {T} iterations, "
           f"seeds {seeds}. Exact bound F(mu) = -||mu - m||^2/2 (optimum 0). Total time {elapsed:.1f} s.\n\n"
           "| method | rho | median final bound (mean of last 20%) | range over seeds | runs reaching F > -1 | "
           "median first iteration with F > -1 | diverged |\n|---|---|---|---|---|---|---|\n" + "\n".join(rows) +
           f"\n\n![Figure 1]({name}.png)\n\n"
           "Reading: with the gradient of log g, DSVI moves mu to m in a short, nearly deterministic transient "
           "(about 1/rho iterations) and then diffuses around the optimum with a spread that grows with rho "
           "(stationary E[F] = -D rho / (2 (2 - rho)) for this target). The score-function gradient "
           "f(theta)(theta - mu) points in a random direction and only drifts towards m through the size of f; it "
           "random-walks even in the transient, needs a much smaller rate to stay stable, and ends far below the "
           "optimum - the behaviour the paper describes.\n")
    print(md)
    write(name, md, data)


if __name__ == "__main__":
    main()
