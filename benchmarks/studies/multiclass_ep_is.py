r"""Multi-class EP's evidence against importance sampling at K = 10: where q(theta)'s offset comes from (issue 41).

On ``synth10`` and the held-out ``synth10b`` (K = 10, 100 training rows) q(theta) on multi-class EP puts the log
signal variance 0.32 and 0.68 NUTS sd below the mean of NUTS over (theta, latents)
(``results/multiclass_bayes_v2_synth10_merged.md``, ``results/multiclass_bayes_synth10b_merged.md``), and
``multiclass_ep_draws.md`` showed that the quasi-Monte Carlo tilted moments are not the cause. This estimates the
exact evidence :math:`p(\mathbf y\mid\theta) = \int p(\mathbf y\mid F)\,\mathcal N(F\mid 0, I_K\otimes K_\theta)\,dF`
by importance sampling with EP's own Gaussian posterior :math:`\mathcal N(\boldsymbol\mu, \Sigma)` over the N K
stacked latent values as the proposal (rebuilt from EP's sites: :math:`\Sigma = K_F - K_F S B^{-1} S K_F`,
:math:`B = I + S K_F S`, :math:`S = \tilde\Pi^{1/2}`, :math:`\boldsymbol\mu = \Sigma\tilde{\boldsymbol\nu}`),

.. math:: \hat Z = \frac1S\sum_s \frac{p(\mathbf y\mid F_s)\,\mathcal N(F_s\mid 0, K_F)}
          {\mathcal N(F_s\mid\boldsymbol\mu,\Sigma)}, \qquad F_s\sim\mathcal N(\boldsymbol\mu,\Sigma),

unbiased for :math:`p(\mathbf y\mid\theta)` (its log is biased low by about half the relative variance, so with a
small ESS it understates the evidence), along the log signal variance at NUTS's mean (the lengthscales held there), at
NUTS mean + {-1, -0.5, 0, 0.5, 1} NUTS sd; S = 16,000 draws (seeded), its weights' ESS and the log-mean's standard
error from 4 batches. A parabola through each of :math:`\log Z_{EP} + \log p(\theta)` and
:math:`\log\hat Z + \log p(\theta)` gives where each peaks, in NUTS sds from NUTS's mean.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.multiclass_ep_is [synth10 synth10b]`` (about 1 minute a set).
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from typing import Any

import numpy as np
import torch

from benchmarks.studies._common import RESULTS, header, write
from benchmarks.multiclass_bayes import synthetic
from gpvi.inference.cvi.bound import CVIBoundTarget
from gpvi.models.multiclass import GPMulticlass
from gpvi.numerics.ep_multiclass import multiclass_ep

GRID = [-1.0, -0.5, 0.0, 0.5, 1.0]
DRAWS, BATCHES = 16000, 4
SOURCE = {"synth10": "multiclass_bayes_v2_synth10_merged", "synth10b": "multiclass_bayes_synth10b_merged",
          "synth4": "multiclass_bayes_v2_synth4", "synth6": "multiclass_bayes_v2_synth6",
          "iris": "multiclass_bayes_v2_iris_wine", "wine": "multiclass_bayes_v2_iris_wine"}
"""The stored ``multiclass_bayes`` run whose NUTS row is each set's reference (synth10, synth10b: the long runs)."""


def stored(name: str) -> dict[str, Any]:
    """The set's row of its stored ``multiclass_bayes`` run (``SOURCE``): NUTS's and the fits' results."""
    rows = json.loads((RESULTS / f"{SOURCE[name]}.json").read_text())["data"]["results"]
    return next(r for r in rows if r["set"] == name)


def ep_posterior(Kn: torch.Tensor, r: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """EP's Gaussian posterior over the class-major stacked latents (module docstring): ``(mu, Sigma)``."""
    N, Kc = r.mean.shape
    NK = N * Kc
    KF = torch.block_diag(*[Kn] * Kc)
    Pi = torch.zeros(NK, NK, dtype=Kn.dtype)
    idx = torch.arange(Kc) * N
    for n in range(N):
        ii = idx + n
        Pi[ii[:, None], ii[None, :]] = r.pi[n]
    ev, V = torch.linalg.eigh(Pi)
    Sq = (V * ev.clamp(min=0).sqrt()) @ V.T
    LB = torch.linalg.cholesky(torch.eye(NK, dtype=Kn.dtype) + Sq @ KF @ Sq)
    Sig = KF - KF @ Sq @ torch.cholesky_solve(Sq @ KF, LB)
    Sig = 0.5 * (Sig + Sig.T)
    mu = Sig @ r.nu.T.reshape(-1)
    if not torch.allclose(mu.reshape(Kc, N).T, r.mean, atol=1e-5):
        raise RuntimeError("the rebuilt EP posterior mean differs from EP's")
    return mu, Sig


def is_evidence(Kn: torch.Tensor, y: torch.Tensor, mu: torch.Tensor, Sig: torch.Tensor,
                g: torch.Generator) -> dict[str, float]:
    """log of the importance-sampling evidence (module docstring), its batch se and the weights' ESS."""
    N, NK = Kn.shape[0], mu.shape[0]
    Kc = NK // N
    Ls = torch.linalg.cholesky(Sig + 1e-10 * torch.eye(NK, dtype=Kn.dtype))
    LK = torch.linalg.cholesky(Kn + 1e-8 * torch.eye(N, dtype=Kn.dtype))
    eps = torch.randn(NK, DRAWS, generator=g, dtype=Kn.dtype)
    F = (mu[:, None] + Ls @ eps).reshape(Kc, N, DRAWS)
    log_q = -0.5 * (eps ** 2).sum(0) - Ls.diagonal().log().sum()
    z = torch.linalg.solve_triangular(LK, F, upper=False)
    log_prior = -0.5 * (z ** 2).sum((0, 1)) - Kc * LK.diagonal().log().sum()
    log_lik = torch.log_softmax(F, 0).gather(0, y.view(1, N, 1).expand(1, N, DRAWS))[0].sum(0)
    lw = log_lik + log_prior - log_q                          # the 2 pi terms cancel
    w = torch.exp(lw - lw.max())
    parts = [float(torch.logsumexp(b, 0)) - math.log(b.numel()) for b in lw.chunk(BATCHES)]
    return {"log_z": float(torch.logsumexp(lw, 0)) - math.log(DRAWS), "ess": float(w.sum() ** 2 / (w * w).sum()),
            "se": float(np.std(parts, ddof=1) / math.sqrt(BATCHES))}


def peak(vals: list[float]) -> float:
    c = np.polyfit(np.array(GRID), np.array(vals), 2)
    return float(-c[1] / (2 * c[0]))


def run_set(name: str) -> dict[str, Any]:
    res = stored(name)
    Xtr, _, ytr, _, _ = synthetic(name)
    model = GPMulticlass(Xtr, ytr)
    bound = CVIBoundTarget(model)
    j = list(model.names).index("log_signal_var")
    mean = torch.tensor(res["nuts"]["mean"], dtype=torch.float64)
    sd = float(res["nuts"]["std"][j])
    g = torch.Generator().manual_seed(0)
    rows = []
    for off in GRID:
        t0 = time.perf_counter()
        th = mean.clone()
        th[j] += off * sd
        Kn = bound._kernel(th.unsqueeze(0))[0].detach()
        r = multiclass_ep(Kn, model.y, model.num_classes, tol=1e-6)
        mu, Sig = ep_posterior(Kn, r)
        est = is_evidence(Kn, model.y, mu, Sig, g)
        lp = float(bound.log_prior(th.unsqueeze(0))[0])
        rows.append({"offset_sd": off, "log_z_ep": float(r.log_z), "log_prior": lp, **est,
                     "wall_s": time.perf_counter() - t0})
        print(name, rows[-1], flush=True)
    return {"set": name, "nuts_mean": float(mean[j]), "nuts_sd": sd, "q_offset_sd": res["bayes_ep"]["theta_diff_sd"][j],
            "rows": rows, "peak_ep": peak([r["log_z_ep"] + r["log_prior"] for r in rows]),
            "peak_is": peak([r["log_z"] + r["log_prior"] for r in rows])}


def report(out: list[dict[str, Any]]) -> str:
    md = [header("Multi-class EP's evidence against importance sampling at K = 10 (issue 41)"), "",
          __doc__.split("\n\n")[1].replace("\n", " "), "",
          "| set | offset (NUTS sd) | log Z_EP | log Z_IS (± se) | IS − EP (nats) | weights' ESS of 16,000 |",
          "|---|---|---|---|---|---|"]
    for s in out:
        for r in s["rows"]:
            md.append(f"| {s['set']} | {r['offset_sd']:+.1f} | {r['log_z_ep']:.3f} | {r['log_z']:.3f} ± {r['se']:.3f} "
                      f"| {r['log_z'] - r['log_z_ep']:+.3f} | {r['ess']:.0f} |")
    md += ["", "| set | q(theta) on EP: offset (NUTS sd) | peak of log Z_EP + log prior | peak of log Z_IS + log prior |",
           "|---|---|---|---|"]
    md += [f"| {s['set']} | {s['q_offset_sd']:+.2f} | {s['peak_ep']:+.2f} | {s['peak_is']:+.2f} |" for s in out]
    return "\n".join(md) + "\n"


def main(names: list[str]) -> None:
    warnings.simplefilter("ignore")
    out = [run_set(n) for n in names]
    write("multiclass_ep_is", report(out), out)


if __name__ == "__main__":
    main(sys.argv[1:] or ["synth10", "synth10b"])
