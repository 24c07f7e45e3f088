"""Binary EP's tilted moments in the fully Bayesian classifier: 64 against 48 quadrature nodes (issue 59, item 3), on
the tuning half only.

Two parts, one thread:

* the time of one tilted-moment pass (:func:`gpvi.numerics.ep._tilted`, logit, cavities with means N(0, 4) and
  variances 0.1-3.1) over 400, 800 and 1,600 cavities (the sites of one EP sweep over 4 rows of N = 100, 200, 400)
  with 40-64 nodes: min and median of 300 calls, the node counts alternated;
* ``GPClassifier(hyperparameters="bayes", random_state=0)`` on tuning families (``--cases``, the higher noise
  level) with :data:`gpvi.inference.cvi.ep_evidence.EP_QUADRATURE_POINTS` 64 and 48, alternated, ``--repeats``
  times: EP sweeps per evaluation, the walls (indicative on a shared machine), q(theta)'s largest change of mean
  (in the 64-node fit's sds) and of log sd, the test probabilities' largest change.

The rules' errors against a 1,000-node rule are in ``benchmarks/studies/bayes_profile.py``'s quadrature table.
Run: ``OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python -m benchmarks.studies.bayes_nodes``. Results:
``benchmarks/studies/results/bayes_nodes_<label>.{md,json}``.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from typing import Any

import numpy as np
import torch

from benchmarks.heldout_families import SPLIT, binary_data
from benchmarks.studies._common import header, write


def tilted_times(sizes: tuple[int, ...] = (400, 800, 1600), nodes: tuple[int, ...] = (64, 48, 56, 64, 48, 40),
                 calls: int = 300) -> list[dict[str, Any]]:
    from gpvi.models.likelihoods import BernoulliLogit
    from gpvi.numerics.ep import _tilted
    from gpvi.numerics.quadrature import Quadrature

    g = torch.Generator().manual_seed(0)
    lik = BernoulliLogit()
    out = []
    for B in sizes:
        m = 2.0 * torch.randn(B, generator=g, dtype=torch.float64)
        v = 3.0 * torch.rand(B, generator=g, dtype=torch.float64) + 0.1
        y = (torch.rand(B, generator=g) > 0.5).double()
        for pts in nodes:
            q = Quadrature(pts)
            _tilted(lik, y, m, v, q)
            ts = []
            for _ in range(calls):
                t0 = time.perf_counter()
                _tilted(lik, y, m, v, q)
                ts.append(time.perf_counter() - t0)
            ts.sort()
            out.append({"cavities": B, "nodes": pts, "min_ms": 1e3 * ts[0], "median_ms": 1e3 * ts[calls // 2],
                        "load": round(os.getloadavg()[0], 2)})
    return out


def fits(case: str, repeats: int) -> list[dict[str, Any]]:
    import gpvi.inference.cvi.ep_evidence as E
    from gpvi import GPClassifier

    fam, n = case.split("/")
    if fam not in SPLIT["tuning"]:
        raise SystemExit(f"{fam} is not in the tuning half: this study decides on tuning families only")
    Xtr, ytr, Xte, _ = binary_data(fam, int(n), 1)
    keep = E.EP_QUADRATURE_POINTS
    rows, first = [], None
    try:
        for rep in range(repeats):
            for pts in (64, 48):
                E.EP_QUADRATURE_POINTS = pts
                load = os.getloadavg()[0]
                t0 = time.perf_counter()
                clf = GPClassifier(random_state=0, hyperparameters="bayes").fit(Xtr, ytr)
                wall = time.perf_counter() - t0
                info, post = clf.posterior_.info, clf.posterior_
                m, s = post.mean.numpy(), post.std.numpy()
                p = np.asarray(clf.predict_proba(Xte))[:, 1]
                first = first if first is not None else (m, s, p)
                c = info["ep_counters"]
                rows.append({"case": case, "repeat": rep, "nodes": pts, "wall_s": wall, "q_s": info["q_time_s"],
                             "load": load, "ep_evaluations": c["evaluations"], "ep_sweeps": c["sweeps"],
                             "mean_change_sd": float(np.abs((m - first[0]) / first[1]).max()),
                             "log_sd_change": float(np.abs(np.log(s / first[1])).max()),
                             "p_change_max": float(np.abs(p - first[2]).max())})
                print(rows[-1], flush=True)
    finally:
        E.EP_QUADRATURE_POINTS = keep
    return rows


def report(tilt: list[dict[str, Any]], rows: list[dict[str, Any]], label: str) -> str:
    lines = [header(f"Binary EP's tilted moments: 64 against 48 quadrature nodes ({label})"), "",
             "Protocol in the docstring of `benchmarks/studies/bayes_nodes.py` (tuning families only, one thread). "
             "Walls are indicative (shared machine); the counts and the changes of q are the comparison.", "",
             "One tilted-moment pass (ms, 300 calls):", "", "| cavities | nodes | min | median | load |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['cavities']} | {r['nodes']} | {r['min_ms']:.3f} | {r['median_ms']:.3f} | {r['load']:.1f} |"
              for r in tilt]
    lines += ["", "Fits (changes against the first 64-node fit of the case):", "",
              "| case | repeat | nodes | wall s [load] | q s | EP evaluations | sweeps per evaluation | "
              "q mean change (sd) / log sd | test p change (max) |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['repeat']} | {r['nodes']} | {r['wall_s']:.2f} [{r['load']:.1f}] | {r['q_s']:.2f} | "
              f"{r['ep_evaluations']} | {r['ep_sweeps'] / r['ep_evaluations']:.3f} | {r['mean_change_sd']:.1e} / "
              f"{r['log_sd_change']:.1e} | {r['p_change_max']:.1e} |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["xor/100", "spirals/100", "clf8/100", "xor/400"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--label", default="h59c")
    a = ap.parse_args()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from gpvi import GPClassifier
        X, y, _, _ = binary_data("xor", 40, 0)
        GPClassifier(random_state=0, hyperparameters="bayes").fit(X, y)       # warm-up, untimed
        tilt = tilted_times()
        rows: list[dict[str, Any]] = []
        for case in a.cases:
            rows += fits(case, a.repeats)
            write(f"bayes_nodes_{a.label}", report(tilt, rows, a.label), {"tilted": tilt, "fits": rows})


if __name__ == "__main__":
    main()
