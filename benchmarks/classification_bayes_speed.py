"""Fully Bayesian binary GP classification: EP's stopping tolerance against fit time and accuracy (issue 41, item 5).

:class:`gpvi.inference.cvi.bayes.FullyBayesianCVI` with its defaults except ``ep_tol`` (EP's stopping rule on the
largest relative site change, :class:`gpvi.inference.cvi.ep_evidence.EPEvidenceTarget`), the settings alternated
within each repeat in one process, so that every pair of fits sees the same load. Sets: the stratified seeded
training subsamples of ``benchmarks/classification_bayes.py`` (``--n-train``, seed 0), logit link, ARD RBF, prior
N(0, 10 I). Where the long NUTS reference of ``benchmarks/results/classification_nuts_ref.json`` exists for the same
set and subsample size, every fit is compared with it: theta means in reference sds, q sds as ratios of the
reference's, and the mean absolute difference of the test probabilities.

Reported per fit: wall time, its phases (MAP-II, EP MAP, Laplace, S&K, predictive), EP evaluations and sweeps, the
largest change of q(theta)'s mean and sd from the first setting's fit (same seed), and the comparison with NUTS.

Run: ``OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python -m benchmarks.classification_bayes_speed --datasets pima
--n-train 100 140 --tols 1e-8 1e-6``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from typing import Any

import numpy as np
import torch

from benchmarks._common import RESULTS, header, write
from benchmarks.classification_bayes import subsample
import gpvi
from gpvi.inference.cvi.bayes import FullyBayesianCVI


def reference(name: str, n: int) -> dict[str, Any] | None:
    """The long NUTS reference of ``name`` at ``n`` training rows, if stored."""
    path = RESULTS / "classification_nuts_ref.json"
    if not path.exists():
        return None
    for r in json.loads(path.read_text())["data"]["results"]:
        if r["dataset"] == name and int(r["N"]) == n:
            return r
    return None


def run(name: str, n: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    ds = gpvi.datasets.load(name)
    X, y = subsample(torch.as_tensor(ds.X_train, dtype=torch.float64),
                     torch.as_tensor(ds.y_train, dtype=torch.float64), n, 0)
    Xt = torch.as_tensor(ds.X_test, dtype=torch.float64)
    model = gpvi.GPClassification(X, y)
    ref = reference(name, n)
    rows, first = [], None
    for rep in range(args.repeats):
        for tol in args.tols:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t0 = time.perf_counter()
                fb = FullyBayesianCVI(ep_tol=tol, seed=0).run(model)
                wall = time.perf_counter() - t0
                p = fb.predict_proba(Xt)
            c = fb.info["ep_counters"]
            row = {"set": name, "N": n, "repeat": rep, "ep_tol": tol, "time_s": wall, "load_1min": os.getloadavg()[0],
                   **{k: fb.info[k] for k in ("map_time_s", "ep_map_time_s", "laplace_time_s", "q_time_s",
                                              "predictive_time_s")},
                   "ep_evaluations": c["evaluations"], "ep_sweeps": c["sweeps"], "mean": fb.mean.tolist(),
                   "std": fb.std.tolist(), "p_test": p.tolist()}
            if first is None:
                first = row
            row["mean_change"] = float(np.abs(np.subtract(row["mean"], first["mean"])).max())
            row["std_change"] = float(np.abs(np.subtract(row["std"], first["std"])).max())
            if ref is not None:
                rm, rs = np.asarray(ref["mean"]), np.asarray(ref["std"])
                row["theta_diff_sd_max"] = float(np.abs((np.asarray(row["mean"]) - rm) / rs).max())
                row["sd_ratio_min"] = float((np.asarray(row["std"]) / rs).min())
                row["sd_ratio_max"] = float((np.asarray(row["std"]) / rs).max())
                row["prob_mad_vs_nuts"] = float(np.abs(np.asarray(row["p_test"]) - np.asarray(ref["prob"])).mean())
            print(f"{name} N={n} tol={tol:g} rep {rep}: {wall:.1f} s (load {row['load_1min']:.1f}), "
                  f"{c['sweeps'] / max(c['evaluations'], 1):.1f} sweeps / evaluation", flush=True)
            rows.append(row)
    return rows


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    md = header("Fully Bayesian binary GP classification: EP tolerance vs fit time and accuracy")
    md += ("\nProtocol in the docstring of `benchmarks/classification_bayes_speed.py`: `FullyBayesianCVI(ep_tol=...)`, "
           "defaults otherwise, settings alternated within each repeat (same process, same seed). Changes of q are "
           "against the first fit of the set. NUTS: the long reference of `classification_nuts_ref.json` where it "
           "exists for the same subsample.\n\n| set | N | rep | EP tol | wall s [load] | MAP-II | EP MAP | Laplace | "
           "S&K | predictive | EP evaluations | sweeps / evaluation | max change of q mean / sd | max theta diff "
           "(NUTS sd) | q sd / NUTS sd | mean abs diff of p vs NUTS |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        nuts = ("| | | " if "theta_diff_sd_max" not in r else
                f"| {r['theta_diff_sd_max']:.2f} | {r['sd_ratio_min']:.2f}-{r['sd_ratio_max']:.2f} | "
                f"{r['prob_mad_vs_nuts']:.4f} ")
        md += (f"| {r['set']} | {r['N']} | {r['repeat']} | {r['ep_tol']:g} | {r['time_s']:.1f} [{r['load_1min']:.1f}] "
               f"| {r['map_time_s']:.1f} | {r['ep_map_time_s']:.1f} | {r['laplace_time_s']:.1f} | {r['q_time_s']:.1f} "
               f"| {r['predictive_time_s']:.1f} | {r['ep_evaluations']} | "
               f"{r['ep_sweeps'] / max(r['ep_evaluations'], 1):.1f} | {r['mean_change']:.1e} / {r['std_change']:.1e} "
               f"{nuts}|\n")
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["pima"])
    ap.add_argument("--n-train", nargs="+", type=int, default=[100, 140])
    ap.add_argument("--tols", nargs="+", type=float, default=[1e-8, 1e-6])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--name", default="classification_bayes_speed")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for name in args.datasets:
        for n in args.n_train:
            rows += run(name, n, args)
            write(args.name, report(rows, args), {"args": vars(args), "results": rows})
    print(report(rows, args))


if __name__ == "__main__":
    main()
