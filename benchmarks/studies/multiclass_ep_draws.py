"""Multi-class EP at K = 10: is q(theta)'s offset in the log signal variance the quasi-Monte Carlo rule's? (issue 41)

On ``synth10`` (K = 10, 100 training rows) q(theta) on multi-class EP puts the log signal variance 0.32 NUTS sd
below NUTS's mean (``results/multiclass_bayes_v2_synth10_merged.md``). For K >= 4 the tilted moments come from a
shifted quasi-Monte Carlo rule of ``num_draws`` points (default 2,048; :mod:`gpvi.numerics.ep_multiclass`). This
evaluates :math:`\\log Z_{EP}(\\theta) + \\log p(\\theta)` along the log signal variance at NUTS's posterior mean
(the lengthscales held there), at NUTS mean + {-1, -0.5, 0, 0.5, 1} NUTS sd, with 2,048, 8,192 and 32,768 points
(EP tolerance 1e-6, the same warm start: zero sites), and fits a parabola: where it peaks (in NUTS sds from NUTS's
mean) and its curvature's sd. If the peak moves towards 0 as the points grow, the rule is the cause; if not, EP's
evidence itself is.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.multiclass_ep_draws`` (about 75 s).
"""

from __future__ import annotations

import json
import time
import warnings

import numpy as np
import torch

from benchmarks.studies._common import RESULTS, header, write
from benchmarks.multiclass_bayes import synthetic
from gpvi.inference.cvi.bound import CVIBoundTarget
from gpvi.models.multiclass import GPMulticlass
from gpvi.numerics.ep_multiclass import multiclass_ep

GRID = [-1.0, -0.5, 0.0, 0.5, 1.0]
DRAWS = [2048, 8192, 32768]


def main() -> None:
    warnings.simplefilter("ignore")
    nuts = json.loads((RESULTS / "multiclass_bayes_v2_synth10_merged.json").read_text())["data"]["results"][0]
    Xtr, _, ytr, _, _ = synthetic("synth10")
    model = GPMulticlass(Xtr, ytr)
    bound = CVIBoundTarget(model)
    j = list(model.names).index("log_signal_var")
    mean = torch.tensor(nuts["nuts"]["mean"], dtype=torch.float64)
    sd = float(nuts["nuts"]["std"][j])
    rows = []
    for nd in DRAWS:
        vals, t0 = [], time.perf_counter()
        for g in GRID:
            th = mean.clone()
            th[j] += g * sd
            K = bound._kernel(th.unsqueeze(0))[0].detach()
            r = multiclass_ep(K, model.y, model.num_classes, num_draws=nd, tol=1e-6)
            vals.append(float(r.log_z + bound.log_prior(th.unsqueeze(0))[0]))
        c = np.polyfit(np.array(GRID), np.array(vals), 2)
        rows.append({"num_draws": nd, "log_joint": vals, "peak_nuts_sd": float(-c[1] / (2 * c[0])),
                     "curvature_sd_nuts_sd": float(np.sqrt(-1.0 / (2.0 * c[0]))), "wall_s": time.perf_counter() - t0})
        print(rows[-1], flush=True)
    q_off = nuts["bayes_ep"]["theta_diff_sd"][j]
    md = [header("Multi-class EP at K = 10: the quasi-Monte Carlo rule and the signal-variance offset"), "",
          f"synth10, log Z_EP + log prior along the log signal variance at NUTS's mean (lengthscales held there), "
          f"in NUTS sds ({sd:.3f}) from NUTS's mean {float(mean[j]):.3f}; q(theta) on EP is {q_off:+.2f} NUTS sd "
          "off (`multiclass_bayes_v2_synth10_merged`).", "",
          "| QMC points | " + " | ".join(f"{g:+.1f} sd" for g in GRID) + " | peak (NUTS sd) | curvature sd (NUTS sd) "
          "| wall (s) |", "|---|" + "---|" * (len(GRID) + 3)]
    for r in rows:
        v0 = r["log_joint"][GRID.index(0.0)]
        md.append(f"| {r['num_draws']:,} | " + " | ".join(f"{v - v0:+.3f}" for v in r["log_joint"]) +
                  f" | {r['peak_nuts_sd']:+.3f} | {r['curvature_sd_nuts_sd']:.3f} | {r['wall_s']:.1f} |")
    moved = abs(rows[-1]["peak_nuts_sd"] - rows[0]["peak_nuts_sd"])
    md += ["", f"From {DRAWS[0]:,} to {DRAWS[-1]:,} points the peak moves by {moved:.3f} NUTS sd: "
           + ("the rule is not the cause of the offset; EP's evidence itself peaks below NUTS's mean along this "
              "slice." if moved < 0.05 else "the rule's error moves the peak."), ""]
    write("multiclass_ep_draws", "\n".join(md), {"grid_nuts_sd": GRID, "nuts_sd": sd, "rows": rows,
                                                 "q_offset_nuts_sd": q_off})


if __name__ == "__main__":
    main()
