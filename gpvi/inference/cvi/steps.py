r"""The two CVI steps: full-batch (Algorithm 1) and doubly stochastic single-site (eq. 14). Both mutate the state.

**Step 3** (eq. 13): for each site, the gradients :math:`\hat g^{(1)}_n, \hat g^{(2)}_n` of
:math:`\mathbb E_q[\log p(y_n\mid f_n)]` with respect to the mean parameters :math:`(m_n, V_{nn} + m_n^2)` of the
marginal (:func:`gpvi.models.likelihoods.mean_parameter_gradients`), then
:math:`\tilde\lambda_n \leftarrow (1 - \beta_t)\tilde\lambda_n + \beta_t \hat g_n`
(:func:`gpvi.numerics.sites.update_sites`).

``mode="full"`` (:func:`full_step`): every site every step, one factorisation of :math:`K + S` per step, O(N^3). The
step evaluates the ELBO of the current :math:`q` (the marginals are needed anyway) before updating the sites.

``mode="stochastic"`` (:func:`stochastic_step`, "doubly stochastic CVI", eq. 14 and the paragraph after it): each
step takes the next ``batch_size`` sites of a random permutation of the sites (a fresh permutation every sweep),
computes only their marginals from the cached factor :math:`L` of :math:`K + S` (one triangular solve with the
columns :math:`\mathbf k_n` and :math:`\tilde{\mathbf y}`, O(N^2)), updates only those sites, and keeps :math:`L`
current **in place**: changing site :math:`n` changes one diagonal entry of :math:`K + S`, a rank-one update
:math:`\alpha\, e_n e_n^\top` with :math:`\alpha = s_n^{new} - s_n^{old}`; only the trailing block :math:`L_{n:,n:}`
changes, so the update is :func:`gpvi.linalg.cholesky_site_update_` on that block, O((N - n)^2). Every
``refactor_every`` steps the factor is recomputed from scratch, the largest entry of
:math:`|L_{updated} - L_{fresh}|` is recorded as the **drift** (``info["drift"]``, ``trace["drift"]``), and the ELBO
is evaluated for monitoring and convergence. The run starts with one full-batch step from the prior (unvisited
sites would have infinite pseudo-noise), counted as one sweep.

Step-size rule for single-site steps and why it reaches the full-batch fixed point
---------------------------------------------------------------------------------
A single-site step applies eq. 13 to the selected sites only and leaves the others unchanged. (Read literally,
eq. 14 also multiplies every unselected site by :math:`1 - \beta_t`; that moves all :math:`N` sites, costs a
refactorisation per step, and without rescaling :math:`\hat g` by :math:`N` has a different fixed point, so gpvi does
not do it.) :math:`\beta_t` is the constant ``beta`` or, with ``beta_schedule="robbins_monro"``,
:math:`\beta / (1 + t)^{0.6}` (:class:`~gpvi.inference.schedules.RobbinsMonro` with :math:`\tau = 1`,
:math:`\kappa = 0.6`) with :math:`t` the number of completed sweeps (needed for convergence with Monte Carlo
gradients, and their default; with exact quadrature gradients a constant step converges). A full-batch step maps
:math:`\tilde\lambda \mapsto (1-\beta)\tilde\lambda + \beta g(\tilde\lambda)`, whose fixed points are exactly
:math:`\tilde\lambda = g(\tilde\lambda)` for any :math:`\beta > 0`; a single-site step leaves site :math:`n` unchanged iff
:math:`\tilde\lambda_n = g_n(\tilde\lambda)`, so the points left unchanged by every single-site step are the same set.
Since :math:`\nabla_\mu \mathcal L = g(\tilde\lambda) - \tilde\lambda` for this model, these are the stationary points
of the ELBO; for log-concave likelihoods (logit, probit) the ELBO has a unique maximiser, so both modes converge to
the same sites and ELBO (checked to 1e-4 in ``tests/test_cvi.py``).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from ...exceptions import NotPSDError, NumericalWarning
from ...linalg import cholesky_site_update_, cholesky_update
from ...models.likelihoods import mean_parameter_gradients
from ...numerics import sites
from .options import flat_elbo_window

__all__ = ["beta_at", "expectations", "elbo_from_sites", "full_step", "stochastic_step", "refactor", "update_factor_",
           "record_check"]


def beta_at(cvi: Any, state: Any) -> float:
    r""":math:`\beta_t = ` ``cvi.beta_rate(t)`` for the state's completed sweeps :math:`t` (a schedule of
    :mod:`gpvi.inference.schedules`), times the fault back-off ``state.beta_scale``; binary and multi-class CVI."""
    t = int(state.sites_updated // max(state.num_sites, 1))
    b = float(cvi.beta_rate(t))
    if not 0.0 < b <= 1.0:
        raise ValueError(f"beta_schedule({t}) must be in (0, 1]; got {b:g}")
    return b * state.beta_scale


def expectations(cvi: Any, model: Any, idx: torch.Tensor | None, m: torch.Tensor, v: torch.Tensor,
                 gen: torch.Generator | None, method: str | None = None):
    """Site expectations and their derivatives for the sites ``idx`` (all when None) by the engine's estimator."""
    mc = cvi.monte_carlo
    return model.site_expectations(m, v, idx, method=method or cvi.estimator, quadrature=cvi.quadrature,
                                   num_mc=mc.num_draws, mc_variance_grad=mc.variance_grad, generator=gen)


def elbo_from_sites(cvi: Any, model: Any, lam1: torch.Tensor, lam2: torch.Tensor, theta: torch.Tensor
                    ) -> tuple[float, dict[str, torch.Tensor]]:
    """The ELBO (eq. 5, by quadrature) of one latent function's sites at ``theta`` and the pieces (``m``, ``v``,
    ``L``, ``alpha``); :func:`gpvi.inference.cvi.multiclass_sites.elbo_from_sites` is that of K."""
    K = model.kernel_matrix(theta)
    ytilde, s = sites.pseudo_data(lam1, lam2)
    L, _ = sites.site_factor(K, s, theta)
    m, v, alpha = sites.marginals(K, L, ytilde)
    elbo = sites.site_elbo(sites.expected_value_sum(model, m, v, cvi.quadrature), lam1, lam2, m, v, L, alpha)
    return float(elbo), {"m": m, "v": v, "L": L, "alpha": alpha}


def full_step(cvi: Any, model: Any, st: Any, K: torch.Tensor, gen: torch.Generator | None,
              method: str | None = None) -> dict[str, Any]:
    """Evaluate the current q (marginals, ELBO), then update every site (eq. 13). Mutates ``st``; returns info.

    Raises :class:`~gpvi.numerics.sites.SiteFault` (non-finite ELBO) or :class:`~gpvi.exceptions.NotPSDError`
    (failed factorisation) before changing anything but the counters.
    """
    n = st.num_sites
    if not st.initialised:
        m = torch.zeros(n, dtype=K.dtype, device=K.device)
        v = K.diagonal().clone()
    else:
        ytilde, s = sites.pseudo_data(st.lam1, st.lam2)
        L, jit = sites.site_factor(K, s, st.theta)
        if jit > 0:
            st.counters["jitter_events"] += 1
        m, v, alpha = sites.marginals(K, L, ytilde)
    # the ELBO's data term is by quadrature whatever the estimator; with quadrature gradients the same call
    # gives them (one pass over the nodes instead of two; the values are the same tensors)
    exq = model.site_expectations(m, v, quadrature=cvi.quadrature)
    value = exq.value.sum()
    if not st.initialised:
        elbo = value                                                        # KL(prior || prior) = 0
    else:
        elbo = sites.site_elbo(value, st.lam1, st.lam2, m, v, L, alpha)
    elbo_f = sites.finite_or_fault(elbo, st.t)
    ex = exq if (method or cvi.estimator) == "quadrature" else expectations(cvi, model, None, m, v, gen, method)
    g1, g2 = mean_parameter_gradients(ex.dm, ex.dv, m)
    residual = float(torch.maximum((g1 - st.lam1).abs(), (g2 - st.lam2).abs()).nan_to_num(nan=math.inf).max())
    beta = beta_at(cvi, st)
    info = {"elbo": elbo_f, "residual": residual, "beta": beta, "sites": n, "checked": True, "elbo_step": st.t}
    st.lam1, st.lam2 = sites.update_sites(st.lam1, st.lam2, g1, g2, beta, st.counters, sites.lam2_cap(K),
                                          cvi.invalid)
    st.initialised = True
    st.t += 1
    st.sites_updated += n
    st.factor = None
    return info


def _next_batch(st: Any, gen: torch.Generator, batch_size: int) -> torch.Tensor:
    n = st.num_sites
    if st.order is None or st.order_pos >= n:
        st.order = torch.randperm(n, generator=gen, device=gen.device).to(st.lam1.device)
        st.order_pos = 0
    idx = st.order[st.order_pos:st.order_pos + batch_size]
    st.order_pos += idx.shape[0]
    return idx


def refactor(st: Any, K: torch.Tensor, *, measure: bool, factorise: Any = sites.site_factor) -> float:
    """Recompute the factor from scratch; return the drift max |L_updated - L_fresh| (nan if not measured).

    ``factorise(K, s, theta) -> (L, jitter)``: :func:`gpvi.numerics.sites.site_factor` (one factor), or
    :func:`gpvi.inference.cvi.multiclass_sites.factors` (one per class, ``s`` of shape (N, K))."""
    _, s = sites.pseudo_data(st.lam1, st.lam2)
    L, jit = factorise(K, s, st.theta)
    if jit > 0:
        st.counters["jitter_events"] += 1
    drift = math.nan
    if measure and st.factor is not None:
        drift = float((st.factor - L).abs().max())
        st.counters["max_drift"] = max(float(st.counters["max_drift"]), drift)
    st.factor = L.mT.contiguous().mT          # lower factor viewed from contiguous upper storage U
    st.since_refactor = 0
    st.counters["refactorisations"] += 1
    return drift


def update_factor_(L: torch.Tensor, idx: torch.Tensor, delta: torch.Tensor, p0: torch.Tensor,
                   factor_update: str) -> None:
    r"""In place: the factor ``L`` (N, N; lower, viewed from contiguous upper storage) of :math:`A` becomes that of
    :math:`A + \sum_i \delta_i e_{n_i} e_{n_i}^\top` for the sites ``idx``, one rank-one update per site.

    ``p0`` is :math:`L^{-1} e_{n_0}` for the first site (the extra column of the step's triangular solve);
    ``factor_update``: ``"blocked"`` (:func:`gpvi.linalg.cholesky_site_update_`) or ``"generic"``
    (:func:`gpvi.linalg.cholesky_update` on the trailing block). Raises :class:`~gpvi.exceptions.NotPSDError`
    when a downdate would make :math:`A` indefinite.
    """
    U, N = L.mT, L.shape[0]
    for i, (j, dlt) in enumerate(zip(idx.tolist(), delta.tolist())):
        if dlt == 0.0:
            continue
        if factor_update == "blocked":
            cholesky_site_update_(U, j, dlt, p=p0[j:] if i == 0 else None)
        else:
            unit = torch.zeros(N - j, dtype=L.dtype, device=L.device)
            unit[0] = 1.0
            L[j:, j:] = cholesky_update(L[j:, j:], unit, dlt)


def record_check(state: Any, info: dict[str, Any], tol: float, *, noisy: bool = False) -> None:
    """Append a check (a step that evaluated the ELBO) to ``state.trace`` and decide ``state.converged``: the
    relative ELBO change against the last check is at most ``tol``, or with ``noisy`` (Monte Carlo site gradients)
    :func:`gpvi.inference.cvi.options.flat_elbo_window`. Sets ``info["converged"]``."""
    elbo, prev = info["elbo"], state.elbo
    tr = state.trace
    tr["step"].append(info.get("elbo_step", state.t))
    tr["sweep"].append(state.sweeps)
    tr["elbo"].append(elbo)
    tr["residual"].append(info.get("residual", math.nan))
    tr["drift"].append(info.get("drift", math.nan))
    tr["time_s"].append(state.step_time_s)
    state.elbo = elbo
    if noisy:
        state.converged = tol > 0 and flat_elbo_window(tr["elbo"], tol)
    else:
        state.converged = tol > 0 and math.isfinite(prev) and abs(elbo - prev) <= tol * max(1.0, abs(elbo))
    info["converged"] = state.converged


def stochastic_step(cvi: Any, model: Any, st: Any, K: torch.Tensor, gen: torch.Generator) -> dict[str, Any]:
    """One doubly stochastic step on ``batch_size`` sites with the cached factor, updated in place. Returns info.

    A ``KeyboardInterrupt`` during the in-place factor update leaves ``st.factor = None`` (it is recomputed from
    scratch at the next step, keeping the refactorisation schedule).
    """
    opts = cvi.single_site
    if not st.initialised:
        info = full_step(cvi, model, st, K, gen)
        refactor(st, K, measure=False)
        return info
    if st.factor is None:                      # resumed without a factor: recompute it, keep the schedule
        since = st.since_refactor
        refactor(st, K, measure=False)
        st.since_refactor = since
    if not st.factor.mT.is_contiguous():
        st.factor = st.factor.mT.contiguous().mT
    L = st.factor
    N = L.shape[0]
    idx = _next_batch(st, gen, opts.batch_size)
    B = idx.shape[0]
    ytilde, s_old = sites.pseudo_data(st.lam1, st.lam2)
    # marginals of the selected sites from the cached factor: one triangular solve, O(N^2 (B + 2)); the extra
    # column L^{-1} e_n is the vector p the factor update needs (first site of the batch)
    e = torch.zeros(N, 1, dtype=L.dtype, device=L.device)
    e[idx[0], 0] = 1.0
    rhs = torch.cat([K[:, idx], ytilde.unsqueeze(-1), e], dim=1)
    R = torch.linalg.solve_triangular(L, rhs, upper=False)
    Vb, w = R[:, :B], R[:, B]
    m_b = Vb.T @ w
    v_b = K.diagonal()[idx] - (Vb * Vb).sum(0)
    ex = expectations(cvi, model, idx, m_b, v_b, gen)
    g1, g2 = mean_parameter_gradients(ex.dm, ex.dv, m_b)
    beta = beta_at(cvi, st)
    new1, new2 = sites.update_sites(st.lam1[idx], st.lam2[idx], g1, g2, beta, st.counters, sites.lam2_cap(K),
                                    cvi.invalid)
    lam1, lam2 = st.lam1.clone(), st.lam2.clone()
    lam1[idx], lam2[idx] = new1, new2
    st.lam1, st.lam2 = lam1, lam2
    # keep the factor of K + diag(s) current: one diagonal entry per site, only the trailing block moves
    delta = (-0.5 / new2) - s_old[idx]
    try:
        try:
            update_factor_(L, idx, delta, R[:, B + 1], opts.factor_update)
            st.since_refactor += 1
        except NotPSDError:
            st.counters["factor_faults"] += 1
            warnings.warn("CVI: a rank-one downdate of the cached factor failed; refactorising from scratch",
                          NumericalWarning, stacklevel=4)
            refactor(st, K, measure=False)
        st.t += 1
        st.sites_updated += B
        info: dict[str, Any] = {"beta": beta, "sites": B, "checked": False}
        if st.since_refactor >= opts.refactor_period(st.num_sites)[0]:
            drift = refactor(st, K, measure=True)
            ytilde, _ = sites.pseudo_data(st.lam1, st.lam2)
            m, v, alpha = sites.marginals(K, st.factor, ytilde)
            value = sites.expected_value_sum(model, m, v, cvi.quadrature)
            elbo = sites.finite_or_fault(sites.site_elbo(value, st.lam1, st.lam2, m, v, st.factor, alpha), st.t)
            info.update({"elbo": elbo, "drift": drift, "checked": True, "elbo_step": st.t})
    except KeyboardInterrupt:
        st.factor = None                       # possibly half updated: the engine rolls the step back
        raise
    return info


def run_result(eng: Any, target: Any, state: Any, report: Any) -> Any:
    """The engine contract's ``result`` of both CVI engines: ``eng.posterior`` of ``state`` with the run report's
    flags and times in ``info`` (no convergence warning for a partial run); ``None`` for a run that ended on a
    fault when even the last good sites cannot be factorised."""
    extra = {"interrupted": report.interrupted, "faulted": report.faulted, "stopped_early": report.stopped_early,
             "time_s": report.time_s, "steps_this_run": report.steps_this_run}
    try:
        return eng.posterior(target, state, extra, warn=not report.partial)
    except NotPSDError:
        if report.faulted:
            return None
        raise
