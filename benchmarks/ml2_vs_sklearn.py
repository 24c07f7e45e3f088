"""ML-II on Boston: gpvi against scikit-learn's GaussianProcessRegressor, same restarts (issue 2).

Both optimise the same exact log marginal likelihood (ARD squared-exponential kernel with signal and noise
variance, zero mean, standardised targets) with L-BFGS-B from the same R starting points and the same box
(theta in [-25, 25], i.e. lengthscales in [e^-12.5, e^12.5]). scikit-learn runs one fit per starting point
(``n_restarts_optimizer=0``) so that the starts match exactly. Reports wall time (median of repeats) and the
best log marginal likelihood of each.

Usage: ``OMP_NUM_THREADS=1 python benchmarks/ml2_vs_sklearn.py [--quick]``
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpvi  # noqa: E402
from benchmarks._common import header, write  # noqa: E402


def sklearn_fit(X, y, starts, bound=25.0):
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    d = X.shape[1]
    b = math.exp(bound)
    best = -math.inf
    for th in starts.numpy():
        kern = ConstantKernel(math.exp(th[d]), (1 / b, b)) * RBF(np.exp(0.5 * th[:d]), (b ** -0.5, b ** 0.5)) \
            + WhiteKernel(math.exp(th[d + 1]), (1 / b, b))
        gpr = GaussianProcessRegressor(kern, alpha=0.0, n_restarts_optimizer=0).fit(X.numpy(), y.numpy())
        best = max(best, gpr.log_marginal_likelihood_value_)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--restarts", type=int, default=5)
    args = ap.parse_args()
    repeats = 1 if args.quick else 3
    R = 2 if args.quick else args.restarts
    ds = gpvi.datasets.load_boston(seed=0)
    model = gpvi.GPRegression(ds.X_train, ds.y_train)
    engine = gpvi.ML2(num_restarts=R, seed=0)
    starts = engine.starting_points(model)
    t_ours, t_skl = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fit = engine.run(model, init=starts)
        t_ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        best_skl = sklearn_fit(ds.X_train, ds.y_train, starts)
        t_skl.append(time.perf_counter() - t0)
        print(f"gpvi {t_ours[-1]:.1f} s (lml {fit.value:.4f}), sklearn {t_skl[-1]:.1f} s (lml {best_skl:.4f})", flush=True)
    mo, ms = statistics.median(t_ours), statistics.median(t_skl)
    md = header("ML-II on Boston: gpvi vs scikit-learn, same starting points (issue 2)")
    md += (f"\nN = {model.num_data}, D = {model.dim}, {R} starting points (gpvi's data-scaled start + {R - 1} seeded "
           f"perturbations), box theta in [-25, 25]; median of {repeats} repeat(s).\n\n"
           "| | wall time s | best log marginal likelihood | evaluations (gpvi) |\n|---|---|---|---|\n"
           f"| gpvi ML2 | {mo:.1f} | {fit.value:.4f} | {sum(r['evaluations'] for r in fit.info['records'])} |\n"
           f"| scikit-learn GPR | {ms:.1f} | {best_skl:.4f} | |\n\n"
           f"Time ratio sklearn / gpvi: {ms / mo:.2f}. Optimum difference gpvi - sklearn: {fit.value - best_skl:+.2e}.\n\n"
           f"Restarts (gpvi):\n\n{fit.info['restarts'].to_markdown()}\n")
    print(md)
    write("ml2_vs_sklearn" + ("_quick" if args.quick else ""), md,
          {"gpvi_s": t_ours, "sklearn_s": t_skl, "gpvi_lml": fit.value, "sklearn_lml": best_skl})


if __name__ == "__main__":
    main()
