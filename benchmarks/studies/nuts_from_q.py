"""NUTS warm-started from DSVI's q on Boston, and gpvi.infer end to end (issue "trustworthy posteriors", item 3).

DSVI's default q, then ``gpvi.NUTS(num_chains=4, num_warmup=W, num_draws=S, seed=0).run(model, init=q)``: chains start
at draws of q, q's covariance is the dense inverse mass matrix, only the step size adapts. Records wall time,
gradient evaluations and ArviZ's bulk/tail ESS and R-hat; then ``gpvi.infer(model, seed=0)`` with its report.
Compare with ``nuts_boston.md`` (default adaptation from an ML-II start) only loosely: different runs and ESS
estimators; a same-run comparison at equal bulk ESS is still to be written.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/studies/nuts_from_q.py     # ~30 min here

Writes ``benchmarks/studies/results/nuts_from_q.{md,json}``.
"""

from __future__ import annotations

import time
import warnings

import gpvi

try:
    from benchmarks.studies._common import header, write
except ImportError:                                   # run as a script from benchmarks/
    from _common import header, write


def main() -> None:
    warnings.simplefilter("ignore")
    ds = gpvi.datasets.load_boston(seed=0)
    model = gpvi.GPRegression(ds.X_train, ds.y_train)
    t0 = time.perf_counter()
    q = gpvi.DSVI(scale="full", seed=0, progress_bar=False).run(model)
    t_dsvi = time.perf_counter() - t0
    rows, data = [], {"dsvi_s": t_dsvi, "nuts": []}
    for W, S in ((200, 500), (500, 1000)):
        t0 = time.perf_counter()
        mc = gpvi.NUTS(num_chains=4, num_warmup=W, num_draws=S, seed=0, progress_bar=False).run(model, init=q)
        t = time.perf_counter() - t0
        d = mc.diagnostics()
        rec = {"warmup": W, "draws": S, "time_s": t, "grad_evals": int(mc.stats["n_steps"].sum()),
               "min_ess_bulk": float(d["ess_bulk"].min()), "min_ess_tail": float(d["ess_tail"].min()),
               "max_r_hat": float(d["r_hat"].max()), "divergences": int(mc.stats["diverging"].sum())}
        data["nuts"].append(rec)
        rows.append(f"| 4 × ({W} + {S}) | {t:.1f} | {rec['grad_evals']} | {rec['min_ess_bulk']:.0f} | "
                    f"{rec['min_ess_tail']:.0f} | {rec['max_r_hat']:.4f} | {rec['divergences']} |")
        print(rows[-1], flush=True)
    t0 = time.perf_counter()
    post = gpvi.infer(model, seed=0, progress_bar=False)
    data["infer_s"], data["infer_report"] = time.perf_counter() - t0, str(post.report)
    md = header("NUTS warm-started from DSVI's q, Boston; gpvi.infer")
    md += (f"\nDSVI default q: {t_dsvi:.1f} s, bound {q.elbo:.3f} ± {q.elbo_se:.3f}.\n\n"
           "| NUTS from q | wall (s) | gradient evaluations | min bulk ESS | min tail ESS | max R-hat | divergences |\n"
           "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
           f"gpvi.infer: {data['infer_s']:.1f} s\n\n```\n{post.report}\n```\n")
    print(write("nuts_from_q", md, data))


if __name__ == "__main__":
    main()
