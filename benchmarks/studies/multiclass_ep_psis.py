r"""The free half of a correction of q(theta) on multi-class EP: PSIS of q's own bound draws (issue 41).

``FullyBayesianCVI``'s S&K engine ended with an estimate of its bound from 100 independent draws of the returned
q(theta) (``q.bound_draws``: the draws and their log joint :math:`\log Z_{EP}(\theta) + \log p(\theta)`, already
evaluated; since issue 59 the default reuses the window's draws instead, so this study sets
:data:`gpvi.inference.cvi.bayes.BOUND_DRAWS` back to 100). Pareto-smoothed importance sampling of those draws
(:func:`gpvi.posteriors.weighted.psis`) estimates the moments of EP's posterior over theta, which q approximates by
a Gaussian; ``multiclass_ep_reweight.md`` found that about half of q's K = 10 offset in the log signal variance is
that approximation. This refits each set with the benchmark's settings (``FullyBayesianCVI(seed=0, evidence="ep")``,
which must reproduce the stored q), and reports k-hat, the weights' ESS and the weighted moments against NUTS's
(``multiclass_bayes_*`` runs; synth10 and synth10b against their long runs). Nothing is evaluated beyond the fit.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.multiclass_ep_psis synth10 [...]``; each set writes
``results/multiclass_ep_psis_<set>.{md,json}``.
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np
import torch

from benchmarks.studies._common import header, write
from benchmarks.multiclass import load
from benchmarks.multiclass_bayes import SYNTH, synthetic
from benchmarks.studies.multiclass_ep_is import stored
from gpvi.inference.cvi import bayes
from gpvi.inference.cvi.bayes import FullyBayesianCVI
from gpvi.models.multiclass import GPMulticlass
from gpvi.posteriors.weighted import psis

def main(name: str) -> None:
    warnings.simplefilter("ignore")
    ref = stored(name)
    nuts = ref["nuts"]
    Xtr, _, ytr, _, _ = synthetic(name) if name in SYNTH else load(name, 300)
    model = GPMulticlass(Xtr, ytr)
    bayes.BOUND_DRAWS = 100       # 100 new draws of q for the final bound (issue 59's default reuses the window's)
    t0 = time.perf_counter()
    fb = FullyBayesianCVI(seed=0, evidence="ep").run(model)
    wall = time.perf_counter() - t0
    q = fb.q
    draws, log_joint = q.bound_draws
    w = psis(q, q.target, draws=draws, log_joint=log_joint)
    nm, ns = np.array(nuts["mean"]), np.array(nuts["std"])
    out = {"set": name, "wall_s": wall, "names": list(model.names), "q_mean": q.mean.tolist(), "q_sd": q.std.tolist(),
           "khat": float(w.khat), "ess": float(w.ess), "num_draws": int(draws.shape[0]),
           "w_mean": w.mean.tolist(), "w_sd": w.std.tolist(), "nuts_mean": nm.tolist(), "nuts_sd": ns.tolist()}
    stored_q = ref.get("bayes_ep", {}).get("mean")
    out["q_reproduced"] = None if stored_q is None else float(np.abs(np.array(stored_q) - q.mean.numpy()).max())
    lines = [header(f"PSIS of q's bound draws on multi-class EP: {name} (issue 41)"), "",
             __doc__.split("\n\n")[1].replace("\n", " "), "",
             f"Fit {wall:.0f} s; q reproduces the stored fit's means to {out['q_reproduced']}; {out['num_draws']} "
             f"draws, k-hat {out['khat']:.2f}, weights' ESS {out['ess']:.1f}.", "",
             "| parameter | NUTS mean (sd) | q: Δ (NUTS sd), sd ratio | PSIS-weighted: Δ, sd ratio |", "|---|---|---|---|"]
    for j, p in enumerate(model.names):
        lines.append(f"| {p} | {nm[j]:.3f} ({ns[j]:.3f}) | {(out['q_mean'][j] - nm[j]) / ns[j]:+.2f}, "
                     f"{out['q_sd'][j] / ns[j]:.2f} | {(out['w_mean'][j] - nm[j]) / ns[j]:+.2f}, "
                     f"{out['w_sd'][j] / ns[j]:.2f} |")
    write(f"multiclass_ep_psis_{name}", "\n".join(lines) + "\n", out)
    print("\n".join(lines[-len(model.names) - 4:]), flush=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    for n in sys.argv[1:]:
        main(n)
