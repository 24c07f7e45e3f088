"""DSVI-ARD (paper section 3.2, eq. 14; Table 2, Figure 3) on D >> N problems, against DSVI with a fixed prior.

The repository has no gene-expression data (Colon / Leukemia / Breast of the paper), so:

* **Synthetic, Colon-sized** (N = 62 split 42 train / 20 test, D = 2000, 10 relevant features): balanced labels
  y in {0, 1}; every feature ~ N(0, 1), the 10 relevant ones shifted by +-delta between the classes (a
  gene-expression-like design: each relevant feature is individually informative, the rest is noise); delta = 1
  and delta = 0.75.
* **Synthetic, logistic design**: X ~ N(0, I), y ~ Bernoulli(sigmoid(X w)) with 10 weights of +-3 — a harder
  problem where 42 points are fewer than sparse recovery needs (about k log(D/k) = 53).
* **Sonar** (bundled UCI data, 146 train / 62 test, D = 60 + bias) as a small real case.

Methods (both diagonal scale, one draw per step, the paper's rho0 = 0.05/N, x0.95 every 5000 steps, 0.1 rho for c,
10^5 steps; Polyak average of the last 25%): **ARD** = DSVI-ARD (gpvi.inference.dsvi.ard.DSVIARD), **CONCAV** = DSVI with a
fixed N(0, 1) prior (the paper's non-sparse baseline). Errors are counts, as in the paper's Table 2.

Usage: ``OMP_NUM_THREADS=1 python benchmarks/dsvi_ard.py [--quick]``
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpvi  # noqa: E402
from benchmarks._common import RESULTS, header, write  # noqa: E402
from gpvi.inference.dsvi.ard import DSVIARD  # noqa: E402
from gpvi.inference.dsvi.engine import DSVI, SGD  # noqa: E402
from gpvi.models.logistic import BayesianLogisticRegression  # noqa: E402


def mean_shift(delta: float, seed: int = 0, N: int = 62, D: int = 2000, k: int = 10):
    g = torch.Generator().manual_seed(seed)
    y = (torch.arange(N) % 2).double()[torch.randperm(N, generator=g)]
    rel = torch.randperm(D, generator=g)[:k]
    X = torch.randn(N, D, generator=g, dtype=torch.float64)
    X[:, rel] += delta * (2 * y[:, None] - 1)
    return X[:42], y[:42], X[42:], y[42:], rel


def logistic_design(seed: int = 0, N: int = 62, D: int = 2000, k: int = 10):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(N, D, generator=g, dtype=torch.float64)
    w = torch.zeros(D, dtype=torch.float64)
    rel = torch.randperm(D, generator=g)[:k]
    w[rel] = 3.0 * torch.sign(torch.randn(k, generator=g, dtype=torch.float64))
    y = (torch.rand(N, generator=g, dtype=torch.float64) < torch.sigmoid(X @ w)).double()
    return X[:42], y[:42], X[42:], y[42:], rel


def fit(method: str, Xtr, ytr, steps: int, bias: bool):
    N = Xtr.shape[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        if method == "ARD":
            lik = BayesianLogisticRegression(Xtr, ytr, prior_var=None, bias=bias)
            q = DSVIARD(num_steps=steps, seed=0, progress_bar=False).run(lik)
        else:
            lik = BayesianLogisticRegression(Xtr, ytr, prior_var=1.0, bias=bias)
            q = DSVI("diag", num_draws=1, num_steps=steps, optimizer=SGD(lr=0.05 / N), seed=0, progress_bar=False).run(
                lik, init=torch.zeros(lik.dim, dtype=torch.float64))
        wall = time.perf_counter() - t0
    return lik, q, wall


def evaluate(name, Xtr, ytr, Xte, yte, rel, steps, bias):
    out = {}
    for method in ("ARD", "CONCAV"):
        lik, q, wall = fit(method, Xtr, ytr, steps, bias)
        ptr, pte = lik.predict_proba(Xtr, q), lik.predict_proba(Xte, q)
        etr = int(((ptr > 0.5).double() != ytr).sum())
        ete = int(((pte > 0.5).double() != yte).sum())
        mu = q.mean[1:] if bias else q.mean
        amu = mu.abs()
        rec = {"train_errors": f"{etr}/{len(ytr)}", "test_errors": f"{ete}/{len(yte)}", "time_s": wall,
               "bound": q.elbo, "bound_se": q.elbo_se, "selected_10pct": int((amu > 0.1 * amu.max()).sum()),
               "mu": mu.tolist(), "bound_avg": q.trace["bound_avg"][::50].tolist()}
        if rel is not None:
            k = rel.numel()
            mask = torch.ones(amu.numel(), dtype=torch.bool)
            mask[rel] = False
            rec["relevant_in_top_k"] = f"{len(set(amu.topk(k).indices.tolist()) & set(rel.tolist()))}/{k}"
            rec["max_irrelevant_abs_mu"] = float(amu[mask].max())
            sel = set((amu > 0.1 * amu.max()).nonzero().flatten().tolist())
            rec["selected_relevant"] = f"{len(sel & set(rel.tolist()))}/{len(sel)}"
            rec["min_relevant_abs_mu"] = float(amu[rel].min())
        out[method] = rec
        print(name, method, {k: v for k, v in rec.items() if k not in ("mu", "bound_avg")}, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    steps = 10_000 if args.quick else 100_000
    problems = {}
    for delta in (1.0, 0.75):
        problems[f"synthetic mean-shift delta={delta:g}"] = (*mean_shift(delta), False)
    problems["synthetic logistic w=+-3"] = (*logistic_design(), False)
    sonar = gpvi.datasets.load_sonar(seed=0)
    problems["Sonar (UCI, seed-0 split)"] = (sonar.X_train, sonar.y_train, sonar.X_test, sonar.y_test, None, True)
    results = {}
    for name, (Xtr, ytr, Xte, yte, rel, bias) in problems.items():
        results[name] = evaluate(name, Xtr, ytr, Xte, yte, rel, steps, bias)
        results[name]["relevant"] = None if rel is None else sorted(rel.tolist())

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(problems)
    fig, axes = plt.subplots(2, len(names), figsize=(3.2 * len(names), 5.2))
    for j, name in enumerate(names):
        for method, col in (("ARD", "tab:blue"), ("CONCAV", "tab:orange")):
            r = results[name][method]
            axes[0, j].plot([50 * i for i in range(len(r["bound_avg"]))], r["bound_avg"], color=col, label=method)
            axes[1, j].plot(r["mu"], color=col, lw=0.8, alpha=0.9 if method == "ARD" else 0.6, label=method)
        rel = results[name]["relevant"]
        if rel:
            axes[1, j].plot(rel, [0.0] * len(rel), "k|", ms=10, label="relevant")
        axes[0, j].set_title(name, fontsize=8)
        axes[0, j].set_ylim(top=0)
        lo = min(min(results[name][m]["bound_avg"][len(results[name][m]["bound_avg"]) // 10:]) for m in ("ARD", "CONCAV"))
        axes[0, j].set_ylim(lo - 5, 0)
        axes[1, j].set_xlabel("feature")
    axes[0, 0].set_ylabel("rolling-average bound")
    axes[1, 0].set_ylabel("final mu")
    axes[0, 0].legend(fontsize=7)
    axes[1, 0].legend(fontsize=7)
    fig.tight_layout()
    name = "dsvi_ard" + ("_quick" if args.quick else "")
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(RESULTS / f"{name}.png", dpi=100)
    plt.close(fig)

    md = header("DSVI-ARD vs DSVI with a fixed prior (CONCAV) on D >> N logistic regression (paper 3.2, Table 2)")
    md += (f"\n{steps} steps per fit, one draw per step, rho0 = 0.05 / N_train, x0.95 every {steps // 20} steps, "
           "0.1 rho for c, diagonal scale, Polyak average of the last 25%. Synthetic problems: 42 train / 20 test, "
           "D = 2000, 10 relevant features (no bias). Sonar: seed-0 stratified split, 146 / 62, D = 60 + bias.\n\n"
           "| problem | method | train errors | test errors | relevant in top 10 abs(mu) | max abs(mu) irrelevant | "
           "min abs(mu) relevant | selected: abs(mu) > 10% of max | of which relevant | bound (eq. 14 / eq. 4) | "
           "time s |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    for pname in names:
        for method in ("ARD", "CONCAV"):
            r = results[pname][method]
            md += (f"| {pname} | {method} | {r['train_errors']} | {r['test_errors']} | "
                   f"{r.get('relevant_in_top_k', '-')} | "
                   f"{r['max_irrelevant_abs_mu'] if 'max_irrelevant_abs_mu' in r else float('nan'):.3g} | "
                   f"{r['min_relevant_abs_mu'] if 'min_relevant_abs_mu' in r else float('nan'):.3g} | "
                   f"{r['selected_10pct']} | {r.get('selected_relevant', '-')} | {r['bound']:.2f} +- "
                   f"{r['bound_se']:.2f} | {r['time_s']:.1f} |\n")
    md += (f"\n![Figure 3 analogue]({name}.png)\n\n"
           "Paper (Table 2, gene-expression data): Colon ARD 0/42 train, 1/20 test; CONCAV 0/42, 0/20. "
           "Leukemia ARD 3/34 test, CONCAV 12/34; Breast ARD 2/4, CONCAV 0/4.\n\n"
           "Notes: the bounds of ARD (eq. 14, prior optimised) and CONCAV (eq. 4 with N(0, 1)) are different "
           "objectives and are not comparable with each other. 'relevant in top 10' counts true relevant features "
           "among the 10 largest abs(mu); 'selected' are the weights with abs(mu) above 10% of the largest, and "
           "'of which relevant' how many of those are truly relevant (ARD may keep fewer than 10: with 42 points, "
           "some equally informative relevant features are redundant, and the bound prefers pruning them). On the "
           "logistic design 42 points are below what sparse recovery of 10 of 2000 weights needs, and ARD "
           "overfits with a few spurious features - an honest failure case, like the paper's Breast / Colon "
           "results where CONCAV did better.\n")
    print(md)
    write(name, md, results)


if __name__ == "__main__":
    main()
