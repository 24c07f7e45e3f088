"""The fully Bayesian classifier's predictive stage: the inner CVI tolerance of its runs at the draws of q(theta)
(issue 59, item 3), on the tuning half only.

Per case (``--cases``: a tuning family of ``benchmarks/heldout_families.py`` at N training rows, binary at the higher
noise level; ``mc_clf/N`` with 4 classes at the lower), one ``GPClassifier(hyperparameters="bayes",
random_state=0)`` fit, one thread; then the predictive (:class:`gpvi.posteriors.bayes_classification.
BayesClassificationPosterior`, the same 32 draws of the fitted q) rebuilt with its CVI runs stopped at relative
bound changes of 1e-6, 1e-5 and 1e-4: inner steps over the 32 runs, the stage's wall (indicative on a shared
machine), and the largest and mean change of the test probabilities against 1e-6.

Run: ``OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python -m benchmarks.studies.bayes_predictive``. Results:
``benchmarks/studies/results/bayes_predictive_<label>.{md,json}``.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from typing import Any

import numpy as np
import torch

from benchmarks.heldout_families import MULTICLASS_SPLIT, SPLIT, binary_data, multiclass_data
from benchmarks.studies._common import header, write

TOLS = (1e-6, 1e-5, 1e-4)


def run_case(case: str) -> list[dict[str, Any]]:
    from gpvi import GPClassifier
    from gpvi.posteriors.bayes_classification import BayesClassificationPosterior

    fam, n = case.split("/")
    if fam not in SPLIT["tuning"] + MULTICLASS_SPLIT["tuning"]:
        raise SystemExit(f"{fam} is not in the tuning half: this study decides on tuning families only")
    multi = fam in MULTICLASS_SPLIT["tuning"]
    Xtr, ytr, Xte, _ = multiclass_data(fam, int(n), 4, 0) if multi else binary_data(fam, int(n), 1)
    clf = GPClassifier(random_state=0, hyperparameters="bayes").fit(Xtr, ytr)
    post = clf.posterior_
    bound = getattr(post.target, "bound", post.target)
    keep = bound.inner_tol
    rows, first = [], None
    try:
        for tol in TOLS:
            bound.inner_tol = tol
            s0, load = bound.counters["inner_steps"], os.getloadavg()[0]
            t0 = time.perf_counter()
            pred = BayesClassificationPosterior(post.q, post.target, num_draws=32, seed=0)
            wall = time.perf_counter() - t0
            p = pred.predict_proba(torch.as_tensor(Xte)).numpy()
            first = p if first is None else first
            rows.append({"case": case, "K": 4 if multi else 2, "tol": tol, "inner_steps":
                         int(bound.counters["inner_steps"] - s0), "wall_s": wall, "load": load,
                         "p_change_max": float(np.abs(p - first).max()),
                         "p_change_mean": float(np.abs(p - first).mean())})
            print(rows[-1], flush=True)
    finally:
        bound.inner_tol = keep
    return rows


def report(rows: list[dict[str, Any]], label: str) -> str:
    lines = [header(f"The predictive's CVI tolerance ({label})"), "",
             "Protocol in the docstring of `benchmarks/studies/bayes_predictive.py` (tuning families only, one "
             "thread; the same 32 draws of the fitted q at each tolerance). Walls are indicative (shared machine).",
             "", "| case | K | tolerance | inner steps (32 runs) | wall s [load] | test p change: max / mean |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['K']} | {r['tol']:.0e} | {r['inner_steps']} | {r['wall_s']:.2f} "
              f"[{r['load']:.1f}] | {r['p_change_max']:.1e} / {r['p_change_mean']:.1e} |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["xor/100", "spirals/200", "clf8/100", "checkerboard/200",
                                                    "xor/400", "mc_clf/100"])
    ap.add_argument("--label", default="h59c")
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in a.cases:
            rows += run_case(case)
            write(f"bayes_predictive_{a.label}", report(rows, a.label), {"rows": rows})


if __name__ == "__main__":
    main()
