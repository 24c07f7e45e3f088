"""A longer, dispersed NUTS reference for one problem of the stress suite (issue 39): is the suite's reference right?

The suite's references (``benchmarks/trust_stress.py``, phase ``ref``) are default NUTS with 4 chains, doubled until
bulk ESS >= 400 and split R-hat <= 1.01. Where ``gpvi.infer``'s NUTS from q and that reference disagree although
both "mixed", this runs ``gpvi.NUTS(num_chains=8, num_warmup=1000, num_draws=2000, init_scale=1.0, seed=11)``
(eight chains from starts jittered by 1.0 around the data-scaled start) and reports its means and sds against the
reference's: a shift of the mean in reference sds and the ratio of sds per parameter, with bulk and tail ESS and
R-hat of the long run.

Run: ``OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python -m benchmarks.trust_stress_longref synth-2`` (after the suite's
``ref`` phase for that problem: it reads the reference from the suite's cache).
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import gpvi

from benchmarks import trust_stress as ts
from benchmarks._common import header, write


def main() -> None:
    pid = sys.argv[1] if len(sys.argv) > 1 else "synth-2"
    p = {q["id"]: q for q in ts.problems()}[pid]
    model = ts.model_of(p)
    ref = json.loads((ts.CACHE / f"ref_{pid}.json").read_text())
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mc = gpvi.NUTS(num_chains=8, num_warmup=1000, num_draws=2000, init_scale=1.0, seed=11,
                       progress_bar=False).run(model)
    wall = time.perf_counter() - t0
    d, x = mc.diagnostics(), mc.samples
    rows = []
    for j, name in enumerate(model.names):
        m, s = float(x[:, j].mean()), float(x[:, j].std())
        rows.append({"name": name, "mean": m, "sd": s, "ref_mean": ref["mean"][j], "ref_sd": ref["sd"][j],
                     "dmean_ref_sd": (m - ref["mean"][j]) / ref["sd"][j], "sd_ratio": s / ref["sd"][j],
                     "ess_bulk": float(d["ess_bulk"][j]), "ess_tail": float(d["ess_tail"][j]),
                     "r_hat": float(d["r_hat"][j])})
    md = [header(f"Long dispersed NUTS reference for {pid} (issue 39)"), "",
          f"Problem {pid} ({p['half']}); the suite's reference: min bulk ESS {ref['min_ess_bulk']:.0f}, max R-hat "
          f"{ref['max_r_hat']:.3f}. Long run: 8 chains x (1,000 + 2,000), starts jittered by 1.0, wall {wall:.0f} s.",
          "", "| parameter | long mean | long sd | Δmean (ref sd) | sd long / ref | bulk ESS | tail ESS | R-hat |",
          "|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['name']} | {r['mean']:.3f} | {r['sd']:.3f} | {r['dmean_ref_sd']:+.2f} | {r['sd_ratio']:.2f} | "
           f"{r['ess_bulk']:.0f} | {r['ess_tail']:.0f} | {r['r_hat']:.3f} |" for r in rows]
    write(f"trust_stress_longref_{pid.replace('-', '_')}", "\n".join(md) + "\n",
          {"problem": pid, "wall_s": wall, "rows": rows, "reference": {k: ref[k] for k in ("mean", "sd")}})


if __name__ == "__main__":
    main()
