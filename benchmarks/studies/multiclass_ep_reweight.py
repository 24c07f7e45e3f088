r"""A prototype correction of q(theta) at K = 10: pseudo-marginal importance sampling over theta (issue 41).

``multiclass_ep_is.md`` shows EP's evidence falling behind the exact one as the signal variance grows. This
measures what correcting for it would give, before anything is built: draws :math:`\theta_m` from a proposal g
around the fitted q(theta) (its stored means and sds, the sds inflated 1.25x, independent coordinates: the stored
results keep no correlations; scrambled Sobol' points, seeded), and at each, EP and the importance-sampling estimate
:math:`\hat Z(\theta_m)` of :math:`p(\mathbf y\mid\theta_m)` of ``multiclass_ep_is`` (EP's latent posterior as the
proposal, 16,000 draws). Self-normalised weights

.. math:: w_m \propto \hat Z(\theta_m)\,p(\theta_m) / g(\theta_m)

give a consistent estimate of the exact posterior's moments (an unbiased :math:`\hat Z` suffices: pseudo-marginal
importance sampling), and :math:`w_m^{EP}\propto Z_{EP}(\theta_m)p(\theta_m)/g(\theta_m)` those of EP's posterior,
which q(theta) approximates; each against NUTS's over (theta, latents) (``multiclass_bayes_*_merged.md``), with the
weights' ESS and a Monte Carlo error from it (sd / sqrt(ESS)).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.multiclass_ep_reweight synth10 [M]`` (about 4.5 s per theta
draw at K = 10 here; M = 128 by default). Each set writes ``results/multiclass_ep_reweight_<set>.{md,json}``.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from typing import Any

import numpy as np
import torch
from scipy.stats import norm, qmc

from benchmarks.studies._common import header, write
from benchmarks.multiclass_bayes import synthetic
from benchmarks.studies.multiclass_ep_is import ep_posterior, is_evidence, stored
from gpvi.inference.cvi.bound import CVIBoundTarget
from gpvi.models.multiclass import GPMulticlass
from gpvi.numerics.ep_multiclass import multiclass_ep

INFLATE = 1.25


def moments(theta: np.ndarray, lw: np.ndarray) -> dict[str, Any]:
    w = np.exp(lw - lw.max())
    w /= w.sum()
    m = w @ theta
    sd = np.sqrt(w @ (theta - m) ** 2)
    ess = 1.0 / float((w * w).sum())
    return {"mean": m.tolist(), "sd": sd.tolist(), "ess": ess}


def main(name: str, M: int = 128) -> None:
    warnings.simplefilter("ignore")
    res = stored(name)
    Xtr, _, ytr, _, _ = synthetic(name)
    model = GPMulticlass(Xtr, ytr)
    bound = CVIBoundTarget(model)
    qm, qs = np.array(res["bayes_ep"]["mean"]), np.array(res["bayes_ep"]["std"])
    nm, ns = np.array(res["nuts"]["mean"]), np.array(res["nuts"]["std"])
    gs = INFLATE * qs
    u = qmc.Sobol(len(qm), scramble=True, seed=0).random(M)
    theta = qm + gs * norm.ppf(u)
    log_g = norm.logpdf(theta, qm, gs).sum(1)
    g = torch.Generator().manual_seed(0)
    rows, t0 = [], time.perf_counter()
    for m in range(M):
        th = torch.tensor(theta[m], dtype=torch.float64)
        Kn = bound._kernel(th.unsqueeze(0))[0].detach()
        r = multiclass_ep(Kn, model.y, model.num_classes, tol=1e-6)
        est = is_evidence(Kn, model.y, *ep_posterior(Kn, r), g)
        rows.append({"log_z_ep": float(r.log_z), "log_prior": float(bound.log_prior(th.unsqueeze(0))[0]), **est})
        if m % 8 == 7:
            print(name, m + 1, f"{time.perf_counter() - t0:.0f} s", flush=True)
    lp = np.array([r["log_prior"] for r in rows])
    out: dict[str, Any] = {"set": name, "M": M, "inflate": INFLATE, "names": list(model.names), "theta": theta.tolist(),
                           "rows": rows, "q": {"mean": qm.tolist(), "sd": qs.tolist()},
                           "nuts": {"mean": nm.tolist(), "sd": ns.tolist()}, "wall_s": time.perf_counter() - t0}
    out["ep"] = moments(theta, np.array([r["log_z_ep"] for r in rows]) + lp - log_g)
    out["is"] = moments(theta, np.array([r["log_z"] for r in rows]) + lp - log_g)
    lines = [header(f"Pseudo-marginal reweighting of q(theta) at K = 10: {name} (issue 41)"), "",
             __doc__.split("\n\n")[1].replace("\n", " "), "",
             f"M = {M} theta draws, {out['wall_s']:.0f} s. Differences in NUTS sds; MC error = sd / sqrt(ESS) of the "
             "weights, in NUTS sds.", "",
             "| parameter | NUTS mean (sd) | q(theta) on EP | EP posterior, reweighted | exact, reweighted (IS) |",
             "|---|---|---|---|---|"]
    for j, p in enumerate(model.names):
        cells = [f"{(qm[j] - nm[j]) / ns[j]:+.2f} (sd {qs[j] / ns[j]:.2f}x)"]
        for key in ("ep", "is"):
            e = out[key]
            err = e["sd"][j] / math.sqrt(e["ess"]) / ns[j]
            cells.append(f"{(e['mean'][j] - nm[j]) / ns[j]:+.2f} ± {err:.2f} (sd {e['sd'][j] / ns[j]:.2f}x)")
        lines.append(f"| {p} | {nm[j]:.3f} ({ns[j]:.3f}) | " + " | ".join(cells) + " |")
    lines += ["", f"Weights' ESS of {M}: EP {out['ep']['ess']:.1f}, IS {out['is']['ess']:.1f}; latent IS weights' "
              f"ESS of 16,000 per theta: median {np.median([r['ess'] for r in rows]):.0f}, min "
              f"{min(r['ess'] for r in rows):.0f}."]
    write(f"multiclass_ep_reweight_{name}", "\n".join(lines) + "\n", out)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
