"""Issue 57: three checks behind ``grid_route``'s text, each against a reference independent of the default grid.

1. ``rbf-1d n=20 noise=1.0`` (tuning; two basins): a wide box of 80 x 80 x 100 points over (-10, 14) x (-12, 8) x
   (-20, 4) against the default grid, the grid at h = 0.175 and ``infer(grid=False)``.
2. ``rbf-ard-2d n=40 noise=0.3`` (tuning, four parameters): the default grid (h = 0.7, coset spread 4.8%) against the
   grid at h = 0.35, to see how much the coset spread overstates the lattice's error.
3. ``rbf-ard-2d n=30 noise=0.2`` (held out): ``grid_route``'s box (34 points, +- 8 sd) put the grid's second
   lengthscale sd 1.094x the box's; here a box twice as wide in that lengthscale (68 points there), and
   ``infer(grid=False)``.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.grid_checks
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import torch

import gpvi
from gpvi.inference.grid import grid_posterior
from gpvi.inference.infer import map_laplace_start

from benchmarks.studies._common import header, write
from benchmarks.studies.grid_route import _synthetic, box_moments

F64 = {"dtype": torch.float64}


def _box(model: Any, axes: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return box_moments(model, axes)[2:]


def _row(name: str, what: str, mean: Any, sd: Any, ref: tuple[torch.Tensor, torch.Tensor], extra: str = "") -> dict:
    dm = float(((mean - ref[0]).abs() / ref[1]).max())
    sr = (sd / ref[1]).tolist()
    return {"case": name, "what": what, "dmean_sd": dm, "sd_ratio": sr, "extra": extra}


def _quiet_infer(model: Any, **kw: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gpvi.infer(model, seed=0, progress_bar=False, **kw)


def run() -> list[dict[str, Any]]:
    rows = []
    name = "rbf-1d n=20 noise=1.0"
    m = _synthetic(20, 1, 1.0, 120)
    axes = [torch.linspace(-10, 14, 80, **F64), torch.linspace(-12, 8, 80, **F64), torch.linspace(-20, 4, 100, **F64)]
    ref = _box(m, axes)
    g = _quiet_infer(m)
    rows.append(_row(name, f"default grid (h = {g.report.grid['step']:g}) / wide box", g.mean, g.std, ref))
    fine, info = grid_posterior(m, map_laplace_start(m, 0), step=0.175, max_cells=2_000_000)
    rows.append(_row(name, "grid at h = 0.175 / wide box", fine.mean, fine.std, ref, f"{info['cells']:,} cells"))
    old = _quiet_infer(m, grid=False)
    rows.append(_row(name, f"infer(grid=False) ({old.report.answer}, trusted {old.report.trusted}) / wide box",
                     old.mean, old.std, ref))

    name = "rbf-ard-2d n=40 noise=0.3"
    m = _synthetic(40, 2, 0.3, 340)
    s = map_laplace_start(m, 0)
    g, gi = grid_posterior(m, s, step=0.7)
    h, hi = grid_posterior(m, s, step=0.35, max_cells=3_000_000)
    rows.append(_row(name, "grid at h = 0.7 / grid at h = 0.35", g.mean, g.std, (h.mean, h.std),
                     f"coset sd spread at 0.7: {gi['coset_sd']:.1%}; {hi['cells']:,} cells at 0.35"))

    name = "rbf-ard-2d n=30 noise=0.2 (seed 630)"
    m = _synthetic(30, 2, 0.2, 630)
    g = _quiet_infer(m)
    for widen in (8.0, 16.0):
        lo, hi_ = g.mean - 8 * g.std, g.mean + 8 * g.std
        lo[1], hi_[1] = g.mean[1] - widen * g.std[1], g.mean[1] + widen * g.std[1]
        lo[-1] = g.mean[-1] - 14 * g.std[-1]
        k = [34, int(34 * widen / 8), 34, 34]
        ref = _box(m, [torch.linspace(float(a), float(b), n, **F64) for a, b, n in zip(lo, hi_, k)])
        rows.append(_row(name, f"default grid / box +- {widen:g} sd in the second lengthscale ({k[1]} points)",
                         g.mean, g.std, ref))
    old = _quiet_infer(m, grid=False)
    rows.append(_row(name, f"infer(grid=False) ({old.report.answer}, trusted {old.report.trusted}) / default grid",
                     old.mean, old.std, (g.mean, g.std)))
    return rows


def main() -> None:
    t0 = time.perf_counter()
    rows = run()
    md = [header("Checks of infer's grid step against independent references (issue 57)"), "",
          __doc__.split("\n\n")[1].replace("\n", " "), "", f"Wall {time.perf_counter() - t0:.0f} s, load "
          f"{os.getloadavg()[0]:.1f} at the end.", "",
          "| case | compared | max abs(mean diff) (reference sd) | sd ratios | note |", "|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['case']} | {r['what']} | {r['dmean_sd']:.4f} | "
                  + ", ".join(f"{x:.3f}" for x in r["sd_ratio"]) + f" | {r['extra']} |")
    write("grid_checks", "\n".join(md) + "\n", rows)
    print("\n".join(md[-len(rows):]))


if __name__ == "__main__":
    main()
