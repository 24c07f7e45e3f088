"""NUTS warm-started from q: q's covariance as a fixed metric (``gpvi.infer``'s route) against an adapted metric
(issue 57, a finding for the next rule change), on small_data's 14-point model.

For seeds 0-2: ``gpvi.infer``'s variational fit q, then ``gpvi.NUTS(num_chains=4, num_warmup=200, num_draws=500)``
from q with (a) ``Adaptation()`` (q's covariance as the dense metric, step size adapted: what ``infer`` runs), (b)
``Adaptation(mass_from_init=False)`` (diagonal metric adapted in Stan's windows from q's draws), (c) the same with a
dense metric. Recorded: wall, gradient evaluations, divergences, min bulk and tail ESS, largest MCSE of an sd over
the sd.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.nuts_metric_from_q
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gpvi  # noqa: E402
from benchmarks.studies._common import header, write  # noqa: E402
from benchmarks.small_data import tiny_model  # noqa: E402
from gpvi.inference import infer as infer_mod  # noqa: E402
from gpvi.inference.mcmc import Adaptation  # noqa: E402

VARIANTS = {"q's covariance, fixed (infer's route)": Adaptation(),
            "diagonal, adapted": Adaptation(mass_from_init=False),
            "dense, adapted": Adaptation(mass_from_init=False, dense_mass=True)}


def main() -> None:
    rows = []
    model = tiny_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in (0, 1, 2):
            q = infer_mod.variational_fit(model, seed=seed, progress_bar=False)
            for name, ad in VARIANTS.items():
                t0 = time.perf_counter()
                mc = gpvi.NUTS(num_chains=4, num_warmup=200, num_draws=500, seed=seed, progress_bar=False,
                               adaptation=ad).run(model, init=q)
                d = mc.diagnostics()
                row = {"seed": seed, "metric": name, "wall": time.perf_counter() - t0,
                       "grads": sum(mc.info["num_evaluations"]), "divergences": int(mc.info["divergences"]),
                       "ess_bulk": float(d["ess_bulk"].min()), "ess_tail": float(d["ess_tail"].min()),
                       "mcse_sd": float((d["mcse_sd"] / mc.std).max())}
                print(row, flush=True)
                rows.append(row)
    md = [header("NUTS from q: q's covariance as a fixed metric against an adapted one (issue 57)"), "",
          "14-point model of `small_data.py`; 4 chains x (200 warm-up + 500 draws) from q, per seed.", "",
          "| seed | metric | wall (s) | gradients | divergences | min bulk ESS | min tail ESS | max MCSE of sd / sd |",
          "|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['seed']} | {r['metric']} | {r['wall']:.1f} | {r['grads']} | {r['divergences']} | "
           f"{r['ess_bulk']:.0f} | {r['ess_tail']:.0f} | {r['mcse_sd']:.3f} |" for r in rows]
    write("nuts_metric_from_q", "\n".join(md) + "\n", rows)


if __name__ == "__main__":
    main()
