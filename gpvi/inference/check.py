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
reach only where their draws are far out in all the others too (``benchmarks/studies/results/trust_stress_tailcheck.md``:
every variant tried, on every cached weighted case). The coordinate components also lower :math:`\hat k` where
they reach nothing: on the suite's boston-0 seed 3 the check passed with them (:math:`\hat k` 0.48) and failed
without them (0.80), and the answer's sds were 0.77x the reference's. So a passed check gets a **second opinion**:
the scaled copies alone, new draws (the same generator, continued), the same rule (and the same refinement for the
starts' mixture); the weighted answer is reliable only when both pass, and it is the first proposal's. On the 58
cases of the suite cached when this was decided, no answer both accepted was outside the tolerance
(``trust_stress.md``).

When the base is the starts' mixture and the check fails on its batch MCSE alone (:math:`\hat k` and the weights'
ESS pass) by at most ``REFINE_REACH`` x ``MCSE_TOL``, one step of adaptive importance sampling (population Monte
Carlo: Cappé, Guillin, Marin & Robert, *Population Monte Carlo*, JCGS 2004) refines the proposal before NUTS is
called (:func:`refine`): each Gaussian of the base is moved to the weighted mean and marginal sds of the check's
draws it accounts for (its correlations kept), its weight set to their weighted mass (:func:`refined_base`), the
defensive components are kept around the refined base, and its draws, again all new (the same generator,
continued), are drawn in rounds of as many as the check drew, at most ``REFINE_ROUNDS``, and judged by the same rule
on their own (the first draws only chose the proposal). What it corrects is the mixture's basin weights and
placement (weights :math:`\propto e^{\mathcal L_k}`): on Boston the starts' second basin holds 42% of the mass while
its Gaussian is 0.36 sd off and up to 0.68x too narrow there, and more draws of the same proposal leave the batch
MCSE at 0.05-0.07 sd up to 16,000 (``benchmarks/results/trust_stress_refine.md``). A single q is not refined: moved
towards where its first draws put the mass, it passed on new draws that still never reached a heavy tail, in three
of the stress suite's four unflagged misses before the coordinate components (``trust_stress_tailcheck.md``,
variant ``scales+refine``).
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import torch

from ..linalg import cholesky_with_jitter
from ..posteriors.gaussian import GaussianPosterior
from ..posteriors.mixture import GaussianMixture
from ..posteriors.weighted import batch_mcse, khat_threshold, psis
from .dsvi.starts import BASIN_SEPARATION

__all__ = ["basins", "diagnose", "starts_mixture", "defensive_proposal", "check_weighted", "q_agrees",
           "refined_base", "refine", "relative_mcse", "mixed", "extended_length", "run_until_mixed",
           "BASIN_MASS_TOL", "CHECK_SCALES", "COORD_SCALE", "COORD_WEIGHT", "CHECK_BATCHES", "EXTENSION_MARGIN", "MCSE_TOL", "Q_AGREE_MEAN",
           "Q_AGREE_SD", "REFINE_REACH", "REFINE_ROUNDS"]

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
REFINE_REACH = 2.0
"""The refinement (of the starts' mixture only) is tried only when the check's batch MCSE is at most this multiple
of ``MCSE_TOL``."""
REFINE_ROUNDS = 3
"""At most this many rounds of new draws of the refined proposal (each as many as the check's)."""


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
    if not 0.0 <= coord_weight < 1.0:
        raise ValueError(f"coord_weight must be in [0, 1); got {coord_weight!r}")
    if not coord_scale >= 1.0:
        raise ValueError(f"coord_scale must be at least 1; got {coord_scale!r}")
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


def _refinable(check: dict[str, Any], min_ess: float) -> bool:
    """The check failed on its batch MCSE alone, by at most ``REFINE_REACH`` times ``MCSE_TOL``."""
    mcse = max(check["mcse_mean"], check["mcse_sd"])
    return (not check["reliable"] and math.isfinite(check["khat"]) and check["khat"] <= check["threshold"]
            and check["ess"] >= min_ess and mcse <= REFINE_REACH * MCSE_TOL)


def refined_base(base: Any, w: Any, target: Any) -> Any:
    r"""The base with each Gaussian moved to the weighted mean and marginal sds of the draws it accounts for.

    With PSIS weights :math:`w_s` of draws :math:`\theta_s` and the base's responsibilities :math:`r_{sk}`
    (1 for a single Gaussian), component :math:`\mathcal N(\mu_k, \Sigma_k)` becomes
    :math:`\mathcal N(\hat\mu_k, S_k\Sigma_k S_k)` with

    .. math:: a_{sk} \propto w_s r_{sk}, \quad \hat\mu_k = \sum_s a_{sk}\theta_s, \quad
              S_k = \mathrm{diag}(\hat\sigma_{kj} / \sigma_{kj}), \quad
              \hat\sigma_{kj}^2 = \sum_s a_{sk}(\theta_{sj} - \hat\mu_{kj})^2,

    (its correlations kept: a full weighted covariance from a basin's few effective draws, 116 for Boston's second
    basin in 15 dimensions, is too noisy to propose from), and its weight :math:`\hat m_k = \sum_s w_s r_{sk}`
    (floored at 0.001 so that no basin is dropped). A component whose draws' ESS
    :math:`(\sum_s a_{sk})^2/\sum_s a_{sk}^2` is under :math:`2D` is kept as it is.

    Parameters
    ----------
    base : GaussianPosterior or GaussianMixture
    w : WeightedPosterior
        PSIS of a proposal around ``base`` (the check's).
    target : model

    Returns
    -------
    GaussianPosterior or GaussianMixture
    """
    comps = list(base.components) if isinstance(base, GaussianMixture) else [base]
    x, wt = w.draws, w.weights
    resp = base.responsibilities(x) if len(comps) > 1 else torch.ones_like(wt)[:, None]
    out = []
    for k, c in enumerate(comps):
        a = wt * resp[:, k]
        total = float(a.sum())
        if not total > 0 or total ** 2 / float((a * a).sum()) < 2 * x.shape[1]:
            out.append(c)
            continue
        a = a / total
        mu = a @ x
        sd = torch.sqrt(a @ (x - mu) ** 2)
        out.append(GaussianPosterior(mu, (sd / c.std)[:, None] * c.scale_tril, list(base.names), target))
    if len(out) == 1:
        return out[0]
    mass = (wt @ resp).clamp(min=1e-3)
    return GaussianMixture(out, torch.log(mass), target)


def refine(base: Any, w: Any, target: Any, check: dict[str, Any], min_ess: float,
           generator: torch.Generator, *, coord_weight: float = COORD_WEIGHT) -> tuple[Any, dict[str, Any]]:
    r"""The check again with the refined proposal (module docstring): ``(weighted posterior, its check)``.

    The defensive proposal around :func:`refined_base` draws rounds of ``len(w.draws)`` new draws from
    ``generator``; after each, PSIS of all its draws so far is checked (batches of the first check's size), and the
    rounds stop when it is reliable, when it fails on anything but its MCSE, or when that MCSE, falling as
    :math:`1/\sqrt S`, could not reach ``MCSE_TOL`` within ``REFINE_ROUNDS``. The check returned has ``refined``
    (rounds drawn) and ``first`` (the first check's k-hat, ESS, draws and batch MCSEs). ``coord_weight`` is the
    proposal's (:func:`defensive_proposal`).
    """
    S0 = int(w.draws.shape[0])
    prop = defensive_proposal(refined_base(base, w, target), target, coord_weight=coord_weight)
    first = {k: check[k] for k in ("khat", "ess", "num_draws", "mcse_mean", "mcse_sd")}
    draws, log_joint = [], []
    for r in range(1, REFINE_ROUNDS + 1):
        part = psis(prop, target, S0, generator=generator)
        draws.append(part.draws)
        log_joint.append(part.log_joint)
        wr = part if r == 1 else psis(prop, target, draws=torch.cat(draws), log_joint=torch.cat(log_joint))
        out = check_weighted(wr, check["proposal"], min_ess, CHECK_BATCHES * r)
        mcse = max(out["mcse_mean"], out["mcse_sd"])
        if out["reliable"] or not _refinable(out, min_ess) or mcse * math.sqrt(r / REFINE_ROUNDS) > MCSE_TOL:
            break
    out.update(refined=r, first=first)
    return wr, out


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


def basins(q: Any, target: Any, seed: int, num_psis_draws: int) -> tuple:
    """Steps 2-3: PSIS of q and of the starts' mixture (its components' draws reused, q's first).

    Returns
    -------
    (w, wm, mix, mass, several)
        PSIS of q, of the mixture (None without one), the mixture, each basin's mass, and whether the other basins
        hold more than ``BASIN_MASS_TOL`` (then the check's base is the mixture, else q).
    """
    n = num_psis_draws
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                       # the report says what k-hat means
        w = _psis_of_q(q, target, n, seed)
        mix = starts_mixture(q, target)
        wm = None
        if mix is not None:
            pools = {k: p for k, p in ((k, _pool(c, n)) for k, c in enumerate(mix.components) if k)
                     if p is not None}
            th, lp = mix.sample_reusing(n, {0: (w.draws, w.log_joint), **pools}, seed=seed)
            wm = psis(mix, target, draws=th, log_joint=lp)
    mass = [] if wm is None else [float(x) for x in mix.basin_mass(wm)]
    return w, wm, mix, mass, bool(mass) and 1.0 - mass[0] > BASIN_MASS_TOL


def diagnose(q: Any, target: Any, seed: int, num_psis_draws: int, min_ess: float) -> tuple:
    """Steps 2-4: :func:`basins`, then the defensive proposal's weighted answer and its check.

    Returns
    -------
    (w, wm, wb, mix, mass, several, check)
        PSIS of q, of the starts' mixture (None without one) and of the defensive proposal; the mixture, each
        basin's mass, whether the other basins hold more than ``BASIN_MASS_TOL``, and :func:`check_weighted`
        (of the refined proposal's draws, with ``refined`` and ``first``, when :func:`refine` ran; with
        ``second``, the second opinion's, when the first passed: ``reliable`` is then both).
    """
    n = num_psis_draws
    w, wm, mix, mass, several = basins(q, target, seed, n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                       # the report says what k-hat means
        base = mix if several else q                          # the check's draws are all new (module docstring)
        gen = torch.Generator().manual_seed(seed)

        def checked(coord_weight: float) -> tuple[Any, dict[str, Any]]:
            wb = psis(defensive_proposal(base, target, coord_weight=coord_weight), target, 4 * n, generator=gen)
            check = check_weighted(wb, "mixture" if several else "q", min_ess)
            if several and _refinable(check, min_ess):        # new draws of a refined mixture (module docstring)
                wb, check = refine(base, wb, target, check, min_ess, gen, coord_weight=coord_weight)
            return wb, check

        wb, check = checked(COORD_WEIGHT)
        if check["reliable"]:                                 # the second opinion: the scaled copies alone
            _, second = checked(0.0)
            check["second"] = {k: second[k] for k in ("khat", "threshold", "ess", "num_draws", "mcse_mean",
                                                      "mcse_sd", "reliable")}
            check["reliable"] = second["reliable"]
    return w, wm, wb, mix, mass, several, check


def relative_mcse(d: dict[str, Any], std: Any) -> tuple[float, float]:
    """The largest Monte Carlo error of a mean and of a sd in the chains' diagnostics ``d``, each in units of its
    parameter's sd ``std``."""
    sd = std.detach().cpu()
    return float((d["mcse_mean"].cpu() / sd).max()), float((d["mcse_sd"].cpu() / sd).max())


def mixed(d: dict[str, Any], min_ess: float, std: Any) -> bool:
    """The chains' diagnostics ``d`` meet :func:`gpvi.infer`'s targets: every bulk and tail ESS >= ``min_ess``,
    R-hat <= 1.01, and every Monte Carlo error of a mean and of a sd at most ``MCSE_TOL`` of that parameter's sd
    ``std`` (the weighted answer's tolerance)."""
    return (bool((d["ess_bulk"] >= min_ess).all()) and bool((d["ess_tail"] >= min_ess).all())
            and bool((d["r_hat"] <= 1.01).all()) and max(relative_mcse(d, std)) <= MCSE_TOL)


EXTENSION_MARGIN = 1.1
"""An extension asks for this multiple of the draws the shortfall says are needed (:func:`extended_length`)."""


def extended_length(d: dict[str, Any], min_ess: float, std: Any, length: int, cap: int) -> int:
    """The draws per chain after an extension of chains of ``length`` draws whose diagnostics ``d`` miss the
    targets: ``length`` times ``EXTENSION_MARGIN`` x need, clamped to 1.25-2 and rounded up to 50, at most ``cap``.
    need is the largest of min_ess / ESS (bulk and tail) and (MCSE / ``MCSE_TOL``)^2 over the parameters (ESS grows
    and the squared MCSE falls in proportion to the draws), or 2 while R-hat misses 1.01. Chosen against doubling on
    the stress suite's cached chains (``benchmarks/studies/results/nuts_extension_adapted.md``: on the tuning half
    0.94x the draws' gradients with the same runs meeting the targets and the same answers outside the tolerance;
    held out, 0.81x, one more run meeting them, no new miss)."""
    if not bool((d["r_hat"] <= 1.01).all()):
        need = 2.0
    else:
        ess = min(float(d["ess_bulk"].min()), float(d["ess_tail"].min()))
        need = max(min_ess / ess if ess > 0 else math.inf, (max(relative_mcse(d, std)) / MCSE_TOL) ** 2)
    factor = min(2.0, max(1.25, EXTENSION_MARGIN * need))
    return min(cap, 50 * math.ceil(length * factor / 50))


def run_until_mixed(sampler: Any, target: Any, init: Any = None, *, min_ess: float, max_extensions: int,
                    post: Any = None) -> tuple[Any, dict[str, Any], int]:
    """Run ``sampler`` from ``init`` (or continue the run ``post``) and, while the chains miss :func:`mixed`'s
    targets, extend them from their last state to :func:`extended_length`'s draws per chain, up to the sampler's
    ``num_draws`` x 2^``max_extensions`` (the cap three doublings had); an interrupted run is not extended. An
    extension continues every chain exactly as one longer run would. Returns (the run, its diagnostics, the
    number of extensions)."""
    if post is None:
        post = sampler.run(target, init=init)
    cap = int(sampler.num_draws) * 2 ** max_extensions
    d, ext = post.diagnostics(), 0
    while (not mixed(d, min_ess, post.std) and post.draws.shape[1] < cap
           and not post.info.get("interrupted")):
        sampler = copy.copy(sampler)
        sampler.num_draws = extended_length(d, min_ess, post.std, int(post.draws.shape[1]), cap)
        post = sampler.run(target, state=post.engine_state)
        d, ext = post.diagnostics(), ext + 1
    return post, d, ext
