r"""Doubly stochastic single-site steps of multi-class CVI (Khan & Lin 2017, eq. 14) on cached, rank-one-updated
Cholesky factors, one per class.

A data point :math:`n` holds K sites :math:`(\tilde\lambda^{(1)}_{nk}, \tilde\lambda^{(2)}_{nk})`, one per class. A
single-site step takes the next ``batch_size`` data points of a random permutation (a fresh one every sweep) and,
with the class factors :math:`L_k` of :math:`K + S_k` cached:

1. computes their marginals for every class from the factors, one batched triangular solve with the columns
   :math:`\mathbf k_n` and :math:`\tilde{\mathbf y}_k` (O(K N^2 B));
2. evaluates the expectations of the selected points only (:meth:`~gpvi.models.multiclass_likelihoods.Softmax.expected_log_lik`,
   the engine's estimator) and applies eq. 13 to their K sites;
3. keeps every class factor current **in place**: a new site of point :math:`n` in class :math:`k` changes one
   diagonal entry of :math:`K + S_k`, a rank-one update :math:`\alpha\,e_n e_n^\top` of that class's factor
   (:func:`gpvi.linalg.cholesky_site_update_`, O((N - n)^2)), so a step costs O(K N^2) rather than the full-batch
   step's O(K N^3).

Every ``refactor_every`` steps (default: once per sweep) the factors are recomputed from scratch, the largest
entry of :math:`|L_{updated} - L_{fresh}|` over the classes is recorded as the drift, the sites are moved along the
common mode to its exact maximiser (:func:`gpvi.inference.cvi.multiclass_sites.center`: O(NK), it needs every
class mean, so only at these checks) and the bound is evaluated for monitoring and the stop rule. The step-size
argument of :mod:`gpvi.inference.cvi.steps` carries over unchanged: a single-site step leaves point :math:`n`'s
sites unchanged iff they equal their gradients, so single-site and full-batch CVI share their fixed points
(checked against the full-batch engine in ``tests/test_multiclass_single.py``).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from ...exceptions import NotPSDError, NumericalWarning
from ...models.likelihoods import mean_parameter_gradients
from . import multiclass_sites as ms
from ...numerics import sites
from . import steps
from .steps import _next_batch

__all__ = ["refactor", "stochastic_step", "HUGE_NOISE"]

HUGE_NOISE = 1e6
"""Pseudo-noise (in units of the mean prior variance) above which a site's factor update refactorises instead."""


def refactor(st: ms.MulticlassCVIState, K: torch.Tensor, *, measure: bool) -> float:
    """Recompute the class factors from scratch (:func:`gpvi.inference.cvi.steps.refactor` with one factor per
    class); returns the drift max |L_updated - L_fresh| over the classes (nan if not measured)."""
    return steps.refactor(st, K, measure=measure, factorise=sites.class_factors)


def _refresh(st: ms.MulticlassCVIState, K: torch.Tensor) -> None:
    """Recompute the class factors from scratch without moving the refactorisation (check) schedule."""
    since = st.since_refactor
    refactor(st, K, measure=False)
    st.since_refactor = since


def _check(eng: Any, model: Any, st: ms.MulticlassCVIState, K: torch.Tensor) -> dict[str, Any]:
    """Refactorise (measuring the drift), centre the sites along the common mode and evaluate the bound."""
    drift = refactor(st, K, measure=True)
    ytilde, _ = sites.pseudo_data(st.lam1, st.lam2)
    m, v, alpha = sites.class_marginals(K, st.factor, ytilde)
    if getattr(eng, "center", False):
        st.lam1, m, alpha = ms.center(st.lam1, st.lam2, m, alpha)
    value = ms.expectations(eng, model, m, v, None, eng.elbo_method).value.sum()
    elbo = sites.finite_or_fault(value - 0.5 * sites.class_kl2(st.lam2, m, v, st.factor, alpha), st.t)
    return {"elbo": elbo, "drift": drift, "checked": True, "elbo_step": st.t, "residual": math.nan}


def stochastic_step(eng: Any, model: Any, st: ms.MulticlassCVIState, K: torch.Tensor,
                    gen: torch.Generator) -> dict[str, Any]:
    """One single-site step on ``eng.single_site.batch_size`` data points (all their K sites) with the cached
    class factors, updated in place. Returns info (``checked`` with ``elbo`` and ``drift`` at refactorisations).

    The first step of a run is a full-batch step from the prior (unvisited sites would have infinite
    pseudo-noise). A ``KeyboardInterrupt`` during the in-place update leaves ``st.factor = None`` (recomputed at
    the next step, keeping the refactorisation schedule).
    """
    opts = eng.single_site
    if not st.initialised:
        info = ms.full_step(eng, model, st, K, gen)
        refactor(st, K, measure=False)
        return info
    if st.factor is None:                      # resumed without factors: recompute them, keep the schedule
        _refresh(st, K)
    if not st.factor.mT.is_contiguous():
        st.factor = st.factor.mT.contiguous().mT
    L = st.factor
    C, N = L.shape[0], L.shape[1]
    idx = _next_batch(st, gen, opts.batch_size)
    B = idx.shape[0]
    ytilde, s_old = sites.pseudo_data(st.lam1, st.lam2)
    # marginals of the selected points in every class: one batched triangular solve, O(C N^2 (B + 2)); the last
    # column L_k^{-1} e_n is the vector the factor update of the batch's first point needs
    e = torch.zeros(N, 1, dtype=L.dtype, device=L.device)
    e[idx[0], 0] = 1.0
    rhs = torch.cat([K[:, idx].expand(C, N, B), ytilde.T.unsqueeze(-1), e.expand(C, N, 1)], dim=-1)
    R = torch.linalg.solve_triangular(L, rhs, upper=False)                   # (C, N, B + 2)
    Vb, w = R[..., :B], R[..., B]
    m_b = (Vb * w.unsqueeze(-1)).sum(1).T                                     # (B, C)
    v_b = K.diagonal()[idx].unsqueeze(-1) - (Vb * Vb).sum(1).T
    n_draws = eng.num_draws if eng.estimator == "mc" else eng.num_fixed_draws
    ex = model.site_expectations(m_b, v_b, idx, method=eng.estimator, quadrature=eng.quadrature, num_draws=n_draws,
                                 generator=gen)
    g1, g2 = mean_parameter_gradients(ex.dm, ex.dv, m_b)
    beta = steps.beta_at(eng, st)
    new1, new2 = sites.update_sites(st.lam1[idx].reshape(-1), st.lam2[idx].reshape(-1), g1.reshape(-1),
                                    g2.reshape(-1), beta, st.counters, sites.lam2_cap(K), eng.invalid)
    new1, new2 = new1.view(B, C), new2.view(B, C)
    lam1, lam2 = st.lam1.clone(), st.lam2.clone()
    lam1[idx], lam2[idx] = new1, new2
    st.lam1, st.lam2 = lam1, lam2
    s_new = -0.5 / new2
    delta = s_new - s_old[idx]                                                # (B, C) changes of K + S_k's diagonal
    # a site near the precision floor has pseudo-noise up to 1e10 mean(diag K) (robust-max sites where the
    # likelihood is flat): a rank-one update by such an amount cancels catastrophically (1e-6 relative error
    # in the factor), so those steps refactorise instead, keeping the check schedule
    big = HUGE_NOISE * float(K.diagonal().mean())
    unstable = bool(((delta != 0) & ((s_new > big) | (s_old[idx] > big))).any())
    try:
        try:
            if unstable:
                _refresh(st, K)
                st.counters["unstable_updates"] = st.counters.get("unstable_updates", 0) + 1
            else:
                for c in range(C):
                    steps.update_factor_(L[c], idx, delta[:, c], R[c, :, B + 1], opts.factor_update)
            st.since_refactor += 1
        except NotPSDError:
            st.counters["factor_faults"] += 1
            warnings.warn("CVI: a rank-one downdate of a cached class factor failed; refactorising from "
                          "scratch", NumericalWarning, stacklevel=4)
            refactor(st, K, measure=False)
        st.t += 1
        st.sites_updated += B
        info: dict[str, Any] = {"beta": beta, "sites": B * C, "checked": False}
        if st.since_refactor >= opts.refactor_period(st.num_sites)[0]:
            info.update(_check(eng, model, st, K))
    except KeyboardInterrupt:
        st.factor = None                       # possibly half updated: the engine rolls the step back
        raise
    return info
