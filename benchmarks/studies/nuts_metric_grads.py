"""NUTS's diagonal metric estimated from draws and gradients (nutpie's estimate,
``Adaptation(mass_estimate="draws_and_gradients")``) against Stan's from the draws alone (the default).

``small_data`` found nutpie's NUTS needing fewer gradients per ESS than ``gpvi.NUTS`` on some stress problems
(synth-2: 0.6x gpvi's ESS per second with a slower call). nutpie adapts its diagonal metric as
:math:`\\sqrt{\\operatorname{Var}(x)/\\operatorname{Var}(\\nabla\\log p)}`; gpvi now offers that estimate inside Stan's
windows (``gpvi.inference.mcmc.adaptation``). This study measures whether it buys ESS per gradient:

* every problem of the stress suite (24, N = 20-60, D = 4-16; its tuning and held-out halves) and ``small_data``'s
  14-point model: ``gpvi.NUTS(num_chains=4, num_warmup=500, num_draws=1000, seed=--seed)``, both estimates from the
  same seed and the same starts;
* recorded: gradient evaluations (warm-up and draws), min bulk and tail ESS, gradients per ESS (the smaller of bulk
  and tail), max split R-hat, divergences, and against the stress suite's long references the largest
  :math:`|\\Delta\\text{mean}|` in reference sds and the range of sd ratios.

The estimate has no constant to tune; a default would be chosen on the tuning half, the held-out half reported.
Boston (N = 455, held out) with ``--boston --draws 500 --estimates E --out NAME``, one process per estimate.
Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.nuts_metric_grads [--seed 1] [--only ID ...]``.
Results: ``benchmarks/studies/results/nuts_metric_grads.{md,json}`` (Boston: ``NAME.json``).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any

import numpy as np
import torch

import gpvi
from benchmarks.small_data import boston_model, stress, tiny_model
from benchmarks.studies._common import header, write
from gpvi.inference.mcmc import Adaptation

ESTIMATES = ("draws", "draws_and_gradients")


def _run(model: Any, estimate: str, seed: int, draws: int = 1000) -> dict[str, Any]:
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mc = gpvi.NUTS(num_chains=4, num_warmup=500, num_draws=draws, seed=seed, progress_bar=False,
                       adaptation=Adaptation(mass_estimate=estimate)).run(model)
    wall = time.perf_counter() - t0
    info = mc.info
    total = int(sum(info["num_evaluations"]))
    warm = int(info["warmup_stats"]["n_steps"].sum())
    bulk, tail = float(info["ess_bulk"].min()), float(info["ess_tail"].min())
    return {"wall": wall, "gradients": total, "warmup_gradients": warm, "min_ess_bulk": bulk, "min_ess_tail": tail,
            "gradients_per_ess": total / min(bulk, tail), "max_r_hat": float(info["r_hat"].max()),
            "divergences": int(sum(info["num_divergent"])), "mean": mc.mean.tolist(), "sd": mc.std.tolist()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only", nargs="*", default=None)
    p.add_argument("--boston", action="store_true", help="Boston's 455 training rows instead (held out), "
                   "4 x (500 + --draws) per estimate")
    p.add_argument("--draws", type=int, default=1000)
    p.add_argument("--estimates", nargs="*", default=list(ESTIMATES))
    p.add_argument("--out", default="nuts_metric_grads")
    a = p.parse_args()
    torch.set_num_threads(1)
    probs, refs = stress()
    cases = [{"id": "tiny", "model": tiny_model(), "half": "tuning"}] + probs
    if a.boston:
        cases = [{"id": "boston", "model": boston_model(), "half": "held-out"}]
    if a.only:
        cases = [c for c in cases if c["id"] in a.only]
    rows = []
    for c in cases:
        row: dict[str, Any] = {"problem": c["id"], "half": c["half"], "N": c["model"].num_data, "D": c["model"].dim}
        for est in a.estimates:
            r = _run(c["model"], est, a.seed, a.draws)
            ref = refs.get(c["id"])
            if ref is not None:
                dm = np.abs(np.array(r["mean"]) - ref["mean"]) / np.array(ref["sd"])
                sr = np.array(r["sd"]) / np.array(ref["sd"])
                r.update(max_dmean_sd=float(dm.max()), sd_ratio_min=float(sr.min()), sd_ratio_max=float(sr.max()))
            del r["mean"], r["sd"]
            row[est] = r
        if all(e in row for e in ESTIMATES):
            row["ratio"] = row["draws_and_gradients"]["gradients_per_ess"] / row["draws"]["gradients_per_ess"]
        print({k: (v if not isinstance(v, dict) else {kk: round(vv, 3) for kk, vv in v.items()})
               for k, v in row.items()}, flush=True)
        rows.append(row)
    data = {"seed": a.seed, "draws": a.draws, "rows": rows}
    write(a.out, render(rows, a.seed) if all("ratio" in r for r in rows) else "# partial run: see the JSON\n", data)


def render(rows: list[dict[str, Any]], seed: int) -> str:
    out = [header("NUTS's diagonal metric from draws and gradients (nutpie's) against Stan's from draws"), "",
           f"`gpvi.NUTS(num_chains=4, num_warmup=500, num_draws=1000, seed={seed})`, both estimates on each problem. "
           "grad/ESS = gradient evaluations (warm-up and draws) over the smaller of min bulk and min tail ESS; "
           "ratio = the gradients-and-draws estimate's grad/ESS over the default's (below 1: fewer gradients per "
           "ESS). vs ref = largest |Δmean| in the stress suite's reference sds and the range of sd ratios.", "",
           "| problem | half | N | D | grad/ESS, draws | grad/ESS, draws + gradients | ratio | warm-up gradients "
           "(draws / + gradients) | divergences | max R-hat | vs ref, draws | vs ref, draws + gradients |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def ref(r: dict[str, Any]) -> str:
        return f"{r['max_dmean_sd']:.2f}, {r['sd_ratio_min']:.2f}-{r['sd_ratio_max']:.2f}" if "max_dmean_sd" in r \
            else "-"

    for row in rows:
        d, g = row["draws"], row["draws_and_gradients"]
        out.append(f"| {row['problem']} | {row['half']} | {row['N']} | {row['D']} | {d['gradients_per_ess']:.1f} | "
                   f"{g['gradients_per_ess']:.1f} | {row['ratio']:.2f} | {d['warmup_gradients']:,} / "
                   f"{g['warmup_gradients']:,} | {d['divergences']} / {g['divergences']} | {d['max_r_hat']:.3f} / "
                   f"{g['max_r_hat']:.3f} | {ref(d)} | {ref(g)} |")
    out.append("")
    for half in ("tuning", "held-out"):
        rs = [r["ratio"] for r in rows if r["half"] == half]
        if rs:
            out.append(f"- {half}: ratio median {statistics.median(rs):.2f} (range {min(rs):.2f}-{max(rs):.2f}, "
                       f"below 1 on {sum(x < 1 for x in rs)} of {len(rs)})")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
