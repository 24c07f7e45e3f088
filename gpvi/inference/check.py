r"""Steps 2-4 of :func:`gpvi.infer`: PSIS of q, the starts' basins, and the check of the weighted answer drawn
from a defensive proposal (the maths and the rule are in :mod:`gpvi.inference.infer`'s docstring).

S&K's final bound estimate draws independent draws of q and evaluates the log joint at each (``q.bound_draws``):
these are PSIS's draws of q and of each start's Gaussian in the starts' mixture, whose log joints are then not
evaluated again (:meth:`~gpvi.posteriors.mixture.GaussianMixture.sample_reusing`: pooled draws are independent of
the mixture's component counts and of its new draws, so the PSIS draws are still independent draws of each
proposal). The check's own draws are all new, from a generator seeded with ``seed``: on the stress suite's synth-2
its verdict sits at the MCSE threshold, and drawing it partly from the base's draws turned a NUTS answer into a
weighted one that missed (``benchmarks/results/trust_stress_recheck_variant1.md``).

The check's proposal adds, to the scaled copies of the base, one component per coordinate that is wide in that
coordinate alone (:func:`defensive_proposal`). The stress suite's unflagged misses were weighted answers on
posteriors with a heavy one-sided tail in one parameter (the log noise variance towards zero noise, where the
likelihood flattens and the posterior follows the prior) that the scaled copies, wide in every coordinate at once,
reach only where their draws are far out in all the others too; and three of the four had passed after a
*refinement* (the proposal moved to the weighted moments of its first draws, its new draws judged on their own),
which was removed: a proposal moved towards where the first draws put the mass passes on draws that still never
reach the tail (``benchmarks/results/trust_stress_tailcheck.md``: every variant tried, on every cached weighted case).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from ..linalg import cholesky_with_jitter
from ..posteriors.gaussian import GaussianPosterior
from ..posteriors.mixture import GaussianMixture
from ..posteriors.weighted import batch_mcse, khat_threshold, psis
from .dsvi.starts import BASIN_SEPARATION

__all__ = ["diagnose", "starts_mixture", "defensive_proposal", "check_weighted", "q_agrees",
           "BASIN_MASS_TOL", "CHECK_SCALES", "COORD_SCALE", "COORD_WEIGHT", "CHECK_BATCHES", "MCSE_TOL", "Q_AGREE_MEAN",
           "Q_AGREE_SD"]

BASIN_MASS_TOL = 0.01
"""Posterior mass (estimated by PSIS of the starts' mixture) the basins other than the best q's may hold before
the mixture replaces q."""
CHECK_SCALES = ((1.0, 0.6), (1.5, 0.3), (2.5, 0.1))
"""(scale of the base's sd, weight) of each scaled copy of the base in the check's defensive proposal (their weights
are then multiplied by ``1 - COORD_WEIGHT``)."""
COORD_SCALE, COORD_WEIGHT = 3.0, 0.2
"""Each coordinate's wide component has ``COORD_SCALE`` times the base's sd in that coordinate; together they weigh
``COORD_WEIGHT``."""
CHECK_BATCHES = 8
"""Independent batches of the check's draws whose spread gives the Monte Carlo error."""
MCSE_TOL = 0.05
"""Largest batch MCSE of a weighted mean or sd, in posterior sds, for a reliable weighted answer."""
Q_AGREE_MEAN, Q_AGREE_SD = 0.1, (0.9, 1.1)
"""q is the answer only when its means are within 0.1 weighted sd of the checked weighted ones, its sds 0.9-1.1x."""


def starts_mixture(q: Any, target: Any) -> Any:
    r"""The mixture of the starts' Gaussians (``q.start_posteriors``, set by DSVI's multi-start run) that lie in
    distinct basins (every mean component more than ``BASIN_SEPARATION`` sds apart), q first, weights
    :math:`\propto e^{\mathcal L_k}`; None when there is one basin."""
    posts = [p for p in getattr(q, "start_posteriors", None) or [q] if p is not None]
    posts = sorted(posts, key=lambda p: (p is not q, -float(getattr(p, "elbo", -math.inf))))
    kept: list[Any] = []
    for p in posts:
        if not math.isfinite(float(getattr(p, "elbo", math.nan))):
            continue
        if any(float(((p.mean - k.mean).abs() / k.std).max()) < BASIN_SEPARATION for k in kept):
            continue
        kept.append(p)
    if len(kept) < 2:
        return None
    return GaussianMixture(kept, [float(p.elbo) for p in kept], target)


def check_weighted(w: Any, proposal: str, min_ess: float, num_batches: int = CHECK_BATCHES) -> dict[str, Any]:
    """Whether the weighted posterior ``w`` is a reliable answer (:mod:`gpvi.inference.infer`, step 4), its batch
    MCSE from ``num_batches`` batches."""
    m = batch_mcse(w, num_batches)
    sd = w.std
    mm, ms = float((m["mean"] / sd).max()), float((m["std"] / sd).max())
    thr = khat_threshold(w.draws.shape[0])
    ok = (math.isfinite(w.khat) and w.khat <= thr and w.ess >= min_ess and mm <= MCSE_TOL and ms <= MCSE_TOL)
    return {"proposal": proposal, "khat": w.khat, "threshold": thr, "ess": w.ess, "num_draws": int(w.draws.shape[0]),
            "mcse_mean": mm, "mcse_sd": ms, "reliable": bool(ok)}


def defensive_proposal(base: Any, target: Any, *, coord_scale: float = COORD_SCALE,
                       coord_weight: float = COORD_WEIGHT) -> Any:
    r"""The check's proposal around ``base`` (moments :math:`\mu_0, \Sigma_0`):

    .. math:: g = (1 - \beta)\sum_k \alpha_k\,\mathcal N(\mu_0, s_k^2\Sigma_0)
              + \frac{\beta}{D}\sum_{j=1}^D \mathcal N(\mu_0, \Sigma_j), \qquad
              \Sigma_j = \Sigma_0 + (c^2 - 1)\,\frac{\Sigma_0 e_j e_j^\top \Sigma_0}{\Sigma_{0,jj}},

    the scaled copies :math:`(s_k, \alpha_k)` = ``CHECK_SCALES`` (the first term is ``base`` itself: q, or the
    starts' mixture), and per coordinate j a Gaussian whose marginal sd in :math:`\theta_j` is c times the base's and
    whose conditional given :math:`\theta_j` is the base's (its regression of the other coordinates on
    :math:`\theta_j` kept), :math:`c` = ``coord_scale``, :math:`\beta` = ``coord_weight`` (0: the scaled copies
    alone). A scaled copy is wide in every coordinate at once, so its draws reach a one-coordinate tail only where
    they are far out in the others too, with weights near zero; the coordinate's own component reaches it with the
    others typical.
    """
    C = 0.5 * (base.covariance + base.covariance.T)
    L = cholesky_with_jitter(C, what="proposal covariance").L
    comps = [base] + [GaussianPosterior(base.mean, s * L, list(base.names), target) for s, _ in CHECK_SCALES[1:]]
    log_w = [math.log((1.0 - coord_weight) * a) for _, a in CHECK_SCALES]
    D = C.shape[0]
    for j in range(D if coord_weight > 0 else 0):
        Cj = C + (coord_scale ** 2 - 1.0) * torch.outer(C[:, j], C[:, j]) / C[j, j]
        Lj = cholesky_with_jitter(0.5 * (Cj + Cj.T), what="proposal covariance").L
        comps.append(GaussianPosterior(base.mean, Lj, list(base.names), target))
        log_w.append(math.log(coord_weight / D))
    return GaussianMixture(comps, log_w, target)


def q_agrees(q: Any, w: Any) -> bool:
    """q's means within ``Q_AGREE_MEAN`` of ``w``'s sds of its means, its sds within ``Q_AGREE_SD`` of ``w``'s."""
    sd = w.std
    ratio = q.std / sd
    return (bool(((q.mean - w.mean).abs() / sd).max() <= Q_AGREE_MEAN)
            and bool(ratio.min() >= Q_AGREE_SD[0]) and bool(ratio.max() <= Q_AGREE_SD[1]))


def _pool(p: Any, n: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """At most ``n`` independent draws of ``p`` with their log joint, made by its engine (``p.bound_draws``)."""
    kept = getattr(p, "bound_draws", None)
    if kept is None or kept[0].shape[1] != len(p.names):
        return None
    return kept[0][:n], kept[1][:n]


def _psis_of_q(q: Any, target: Any, n: int, seed: int) -> Any:
    """PSIS of q from its engine's bound draws where there are enough, else from ``n`` new draws."""
    pool = _pool(q, n)
    if pool is None or pool[0].shape[0] < n:
        return psis(q, target, n, seed=seed)
    return psis(q, target, draws=pool[0], log_joint=pool[1])


def diagnose(q: Any, target: Any, seed: int, num_psis_draws: int, min_ess: float) -> tuple:
    """Steps 2-4: PSIS of q, the basins, the defensive proposal's weighted answer and its check.

    Returns
    -------
    (w, wm, wb, mix, mass, several, check)
        PSIS of q, of the starts' mixture (None without one) and of the defensive proposal; the mixture, each
        basin's mass, whether the other basins hold more than ``BASIN_MASS_TOL``, and :func:`check_weighted`.
    """
    n = num_psis_draws
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                       # the report says what k-hat means
        w = _psis_of_q(q, target, n, seed)
        mix = starts_mixture(q, target)
        wm = None
        if mix is not None:                                   # its components' draws are reused, q's first
            pools = {k: p for k, p in ((k, _pool(c, n)) for k, c in enumerate(mix.components) if k)
                     if p is not None}
            th, lp = mix.sample_reusing(n, {0: (w.draws, w.log_joint), **pools}, seed=seed)
            wm = psis(mix, target, draws=th, log_joint=lp)
        mass = [] if wm is None else [float(x) for x in mix.basin_mass(wm)]
        several = bool(mass) and 1.0 - mass[0] > BASIN_MASS_TOL
        base = mix if several else q                          # the check's draws are all new (module docstring)
        gen = torch.Generator().manual_seed(seed)
        wb = psis(defensive_proposal(base, target), target, 4 * n, generator=gen)
        check = check_weighted(wb, "mixture" if several else "q", min_ess)
    return w, wm, wb, mix, mass, several, check
