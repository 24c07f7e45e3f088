"""Issue 57: ``gpvi.infer``'s variational route (``grid=False``: q, PSIS, the check, NUTS) judged by quadrature on
the small models of ``grid_route``, where the exact answer is cheap.

The stress suite judges the route on 5-16 parameters against long NUTS runs. With three or four parameters the
lattice quadrature of ``gpvi.inference.grid`` (checked there against brute-force boxes) gives the posterior's means
and sds to about 1%: every model of ``grid_route`` (both halves; the one the grid declined is skipped) is answered
by ``infer(grid=False, seed=0)`` and compared with the grid at h = 0.35 Laplace sd (the default's half, within a
budget of 2,000,000 cells), by the stress suite's tolerance (0.2 sd, sd ratios 0.8-1.25). An answer outside it
that the route trusted is an unflagged miss of the route the grid now replaces for these models; the route still
answers every model of five or more parameters.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.route_low_d
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import numpy as np

import gpvi
from gpvi.inference.grid import GRID_STEP, grid_posterior
from gpvi.inference.infer import map_laplace_start

from benchmarks.studies._common import header, write
from benchmarks.studies.grid_route import cases

TOL_MEAN, SD_LO, SD_HI = 0.2, 0.8, 1.25


def run() -> None:
    rows, data = [], []
    for name, half, make in cases():
        model = make()
        start = map_laplace_start(model, 0)
        ref, info = grid_posterior(model, start, step=GRID_STEP / 2, max_cells=2_000_000)
        if ref is None:
            print(name, "skipped:", info["reason"], flush=True)
            continue
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            post = gpvi.infer(model, seed=0, progress_bar=False, grid=False)
        wall = time.perf_counter() - t0
        r = post.report
        dm = ((post.mean - ref.mean).abs() / ref.std).numpy()
        sr = (post.std / ref.std).numpy()
        within = bool(dm.max() <= TOL_MEAN and sr.min() >= SD_LO and sr.max() <= SD_HI)
        verdict = "ok" if within else ("flagged" if not r.trusted else "UNFLAGGED MISS")
        rec = {"case": name, "half": half, "D": len(model.names), "answer": r.answer, "trusted": r.trusted,
               "wall": wall, "grid_cells": info["cells"], "grid_step": info["step"], "dmean": dm.tolist(),
               "sd_ratio": sr.tolist(), "within": within, "verdict": verdict, "load": list(os.getloadavg())}
        data.append(rec)
        print(name, r.answer, r.trusted, f"{wall:.1f} s", f"dmean {dm.max():.3f}", np.round(sr, 3), verdict,
              flush=True)
        rows.append(f"| {name} | {half} | {rec['D']} | {r.answer} | {'yes' if r.trusted else 'no'} | {wall:.1f} | "
                    f"{dm.max():.3f} | {sr.min():.2f}-{sr.max():.2f} | {verdict} |")
        write("route_low_d", report(rows, data), data)


def report(rows: list[str], data: list[dict[str, Any]]) -> str:
    miss = [d["case"] for d in data if d["verdict"] == "UNFLAGGED MISS"]
    flagged = [d["case"] for d in data if d["verdict"] == "flagged"]
    walls = sorted(d["wall"] for d in data)
    summary = (f"{len(data)} models: {len(data) - len(miss) - len(flagged)} ok, {len(flagged)} flagged, "
               f"{len(miss)} unflagged misses ({', '.join(miss) or 'none'}); the route's median wall "
               f"{walls[len(walls) // 2]:.1f} s." if data else "")
    return "\n".join([header("gpvi.infer's variational route judged by quadrature on small models (issue 57)"), "",
                      __doc__.split("\n\n")[1].replace("\n", " "), "", summary, "",
                      "| case | half | D | answer | trusted | wall (s) | max abs(mean diff) (grid sd) | sd ratios | "
                      "verdict |", "|---|---|---|---|---|---|---|---|---|", *rows]) + "\n"


if __name__ == "__main__":
    run()
