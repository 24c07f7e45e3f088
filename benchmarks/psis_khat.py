"""PSIS k-hat of DSVI's q on the GP hyperparameter posteriors of the paper's regression sets: Gaussian vs the
multivariate Student-t family (issue "trustworthy posteriors", item 6: does the order-free t lower k-hat?).

For each dataset (Boston, Bodyfat, pendulum; default splits) and each family, DSVI runs with its defaults for exact
GP regression (MAP/Laplace start, natural-gradient-preconditioned steps, convergence stop), then
``q.psis(num_draws=...)`` computes k-hat, the weights' ESS and the importance-sampling log evidence next to the bound.
k-hat <= 0.5: q is reliable; <= 0.7: its PSIS-weighted estimates are; above: sample the posterior.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/psis_khat.py            # full (~6 min here)
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/psis_khat.py --quick    # smoke test

Writes ``benchmarks/results/psis_khat{,_quick}.{md,json}``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import gpvi

try:
    from benchmarks._common import header, write
except ImportError:                                   # run as a script from benchmarks/
    from _common import header, write

DATASETS = {"boston": {}, "bodyfat": {}, "pendulum": {}}
FAMILIES = {"gaussian": "normal", "multivariate t (df 5)": ("t", 5.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    num_draws = 200 if args.quick else 2000
    rows, data = [], []
    for name in DATASETS:
        ds = gpvi.datasets.load(name)
        X, y = (ds.X_train[:100], ds.y_train[:100]) if args.quick else (ds.X_train, ds.y_train)
        model = gpvi.GPRegression(X, y)
        for label, base in FAMILIES.items():
            kw = {"num_steps": 300, "num_elbo_draws": 100} if args.quick else {}
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                q = gpvi.DSVI(scale="full", base=base, seed=0, progress_bar=False, **kw).run(model)
                t_fit = time.perf_counter() - t0
                t0 = time.perf_counter()
                w = q.psis(num_draws=num_draws, seed=0)
            t_psis = time.perf_counter() - t0
            rec = {"dataset": name, "family": label, "N": int(X.shape[0]), "D": model.dim,
                   "optimizer": q.info.get("optimizer"), "converged": bool(q.info.get("converged")),
                   "elbo": q.elbo, "elbo_se": q.elbo_se, "khat": w.khat, "psis_ess": w.ess,
                   "log_evidence": w.log_evidence, "log_evidence_se": w.log_evidence_se,
                   "fit_s": t_fit, "psis_s": t_psis}
            data.append(rec)
            rows.append(f"| {name} | {label} | {rec['N']} | {rec['optimizer']} | {rec['converged']} | "
                        f"{q.elbo:.3f} ± {q.elbo_se:.3f} | **{w.khat:.2f}** | {w.ess:.0f} | "
                        f"{w.log_evidence:.3f} ± {w.log_evidence_se:.3f} | {t_fit:.1f} | {t_psis:.1f} |")
            print(rows[-1], flush=True)
    md = header("PSIS k-hat of DSVI's q: Gaussian vs multivariate Student-t" + (" (quick)" if args.quick else ""))
    md += (f"\nDSVI defaults for exact GP regression, seed 0; PSIS with {num_draws} draws of q (ArviZ's smoothing). "
           "k-hat <= 0.5: q reliable; <= 0.7: PSIS-weighted estimates reliable; > 0.7: sample the posterior.\n\n"
           "| dataset | family | N | optimizer | converged | bound ± se | k-hat | weights' ESS | IS log evidence ± se"
           " | fit (s) | PSIS (s) |\n|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    print(write("psis_khat" + ("_quick" if args.quick else ""), md, data))


if __name__ == "__main__":
    main()
