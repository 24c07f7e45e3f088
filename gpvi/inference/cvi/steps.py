r"""The two CVI steps, full-batch (Algorithm 1) and doubly stochastic single-site (eq. 14), for sites of one latent
function, shape (N,), or of K, shape (N, K). Both mutate the state.

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

K latent functions
------------------
The variational family is **class-factorised** (GPflow's SVGP with independent latents and inducing points at the
data, GPyTorch's ``IndependentMultitaskVariationalStrategy``): :math:`q(F) = \prod_k q_k(\mathbf f_k)`. With sites
(Khan & Lin 2017, the display after eq. 13, one per data point and class)

.. math::

    q_k(\mathbf f_k) \propto \Big[\prod_n \exp\big(\tilde\lambda^{(1)}_{nk} f_{nk} + \tilde\lambda^{(2)}_{nk} f_{nk}^2\big)\Big]
      \mathcal N(\mathbf f_k \mid 0, K),\qquad \tilde\lambda^{(2)}_{nk} < 0,

each :math:`q_k` is a GP-regression posterior with pseudo-targets :math:`\tilde y_{nk} = -\tilde\lambda^{(1)}_{nk}/(2\tilde\lambda^{(2)}_{nk})`
and pseudo-noise :math:`s_{nk} = -1/(2\tilde\lambda^{(2)}_{nk})`: 2NK numbers. This is no restriction within the
family: the data term depends on :math:`q_k` only through the marginals :math:`(m_{nk}, v_{nk})`, so the optimal
:math:`V_k` has exactly this form. The bound is

.. math::

    \mathcal L = \sum_n \mathbb E_q[\log p(y_n \mid \mathbf f_n)] - \sum_k \mathrm{KL}(q_k \,\|\, \mathcal N(0, K)),

each KL in the form of :func:`gpvi.numerics.sites.site_elbo` (one Cholesky factor of :math:`K + S_k` per class;
the K factorisations are batched). A CVI step (eq. 13) applies, per site and class,
:math:`\tilde\lambda_{nk} \leftarrow (1-\beta)\tilde\lambda_{nk} + \beta\hat g_{nk}` with the gradients of
:math:`\mathbb E_q[\log p(y_n\mid\mathbf f_n)]` with respect to the mean parameters :math:`(m_{nk}, v_{nk} + m_{nk}^2)`.

A single-site step takes the next ``batch_size`` data points and updates all their K sites: one batched triangular
solve gives their marginals in every class, and each class's factor gets one rank-one update per point (O(K N^2)
per step). At each check the sites are also moved along the common mode (:func:`center`).

Names: ``lam1``, ``lam2`` (N,) or (N, K) sites; ``ytilde``, ``s`` likewise; ``L`` (N, N) or (K, N, N) factors of
:math:`K + S_k`; ``alpha`` (N,) or (K, N); ``m``, ``v`` marginals of the sites' shape.
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

__all__ = ["beta_at", "expectations", "elbo_from_sites", "center", "full_step", "keep_monotone", "forget_kept",
           "stochastic_step", "refactor", "update_factor_", "record_check", "HUGE_NOISE"]

HUGE_NOISE = 1e6
"""Pseudo-noise (in units of the mean prior variance) above which a single-site step refactorises instead of a
rank-one update: such an update cancels catastrophically (1e-6 relative error in the factor)."""


def beta_at(cvi: Any, state: Any) -> float:
    r""":math:`\beta_t = ` ``cvi.beta_rate(t)`` for the state's completed sweeps :math:`t` (a schedule of
    :mod:`gpvi.inference.schedules`), times the fault back-off ``state.beta_scale``."""
    t = int(state.sites_updated // max(state.num_sites, 1))
    b = float(cvi.beta_rate(t))
    if not 0.0 < b <= 1.0:
        raise ValueError(f"beta_schedule({t}) must be in (0, 1]; got {b:g}")
    return b * state.beta_scale


def expectations(cvi: Any, model: Any, m: torch.Tensor, v: torch.Tensor, gen: torch.Generator | None,
                 method: str | None = None, idx: torch.Tensor | None = None):
    """The likelihood's expectations and derivatives at the marginals ``m``, ``v`` of the sites ``idx`` (all when
    None) by ``method`` (default: the engine's estimator), times the model's weights."""
    use = method or cvi.estimator
    mc = cvi.monte_carlo
    return model.site_expectations(m, v, idx, method=use, quadrature=cvi.quadrature,
                                   num_draws=cvi.num_fixed_draws if use == "fixed" else mc.num_draws,
                                   mc_variance_grad=mc.variance_grad, generator=gen)


def _bound(cvi: Any, model: Any, lam1: torch.Tensor, lam2: torch.Tensor, K: torch.Tensor, L: torch.Tensor,
           m: torch.Tensor, v: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """The ELBO of the sites by the deterministic rule given their factors and marginals, and its expectations."""
    ex = expectations(cvi, model, m, v, None, cvi.elbo_method)
    return sites.site_elbo(ex.value.sum(), lam1, lam2, m, v, L, alpha), ex


def elbo_from_sites(cvi: Any, model: Any, lam1: torch.Tensor, lam2: torch.Tensor, theta: torch.Tensor
                    ) -> tuple[float, dict[str, torch.Tensor]]:
    """The ELBO (eq. 5, by the deterministic rule) of the sites at ``theta`` and the pieces (``m``, ``v``, ``L``,
    ``alpha``)."""
    K = model.kernel_matrix(theta)
    ytilde, s = sites.pseudo_data(lam1, lam2)
    L, _ = sites.site_factor(K, s, theta)
    m, v, alpha = sites.marginals(K, L, ytilde)
    elbo, _ = _bound(cvi, model, lam1, lam2, K, L, m, v, alpha)
    return float(elbo), {"m": m, "v": v, "L": L, "alpha": alpha}


def center(lam1: torch.Tensor, lam2: torch.Tensor, m: torch.Tensor, alpha: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Move the class-mean of the latent means to zero: the exact maximiser of the bound along the common mode.

    Softmax and robust-max depend on :math:`\mathbf f_n` only through the differences :math:`f_{nk} - f_{nj}`,
    so shifting every class's mean by the same :math:`\mathbf c` (variances kept) leaves the data term unchanged
    and changes only the KL terms, :math:`\tfrac12\sum_k (\mathbf m_k - \mathbf c)^\top K^{-1}(\mathbf m_k - \mathbf c)`,
    minimised by :math:`\mathbf c = \bar{\mathbf m} = \tfrac1C\sum_k\mathbf m_k`; the bound rises by
    :math:`\tfrac C2\,\bar{\mathbf m}^\top\bar{\boldsymbol\alpha}\ge 0` with
    :math:`\bar{\boldsymbol\alpha} = K^{-1}\bar{\mathbf m} = \tfrac1C\sum_k\boldsymbol\alpha_k`. Every optimum
    therefore has :math:`\sum_k \mathbf m_k = 0` (also from the stationarity conditions:
    :math:`K^{-1}\sum_k\mathbf m_k = \sum_k\partial_{\mathbf m_k}E = 0`). In sites, with
    :math:`\mathbf m_k = V_k\tilde{\boldsymbol\lambda}^{(1)}_k` and :math:`V_k^{-1} = K^{-1} - 2\operatorname{diag}\tilde{\boldsymbol\lambda}^{(2)}_k`,

    .. math::

        \tilde{\boldsymbol\lambda}^{(1)}_k \leftarrow \tilde{\boldsymbol\lambda}^{(1)}_k - \bar{\boldsymbol\alpha}
          + 2\tilde{\boldsymbol\lambda}^{(2)}_k\odot\bar{\mathbf m},\qquad
        \mathbf m_k \leftarrow \mathbf m_k - \bar{\mathbf m},\qquad
        \boldsymbol\alpha_k \leftarrow \boldsymbol\alpha_k - \bar{\boldsymbol\alpha},

    O(NC), no factorisation (the factors of :math:`K + S_k` do not change). CVI alone converges slowly along this
    mode: its site precisions :math:`-2\tilde\lambda^{(2)}_{nk} = \mathbb E[p_k(1-p_k)]` treat the likelihood as
    curved where it is flat, and the damped map contracts the common mode by only
    :math:`1-\beta + \beta\,\lambda_{\max}(K\Lambda)/(1 + \lambda_{\max}(K\Lambda))`, near 1 when the signal
    variance is large (0.97 per step on iris at its MAP-II theta: 844 steps to a relative change of 1e-14; 44 with
    this step).

    Returns
    -------
    (lam1, m, alpha) : the new sites' first natural parameters (N, C), means (N, C) and ``alpha`` (C, N).
    """
    abar = alpha.mean(0)
    mbar = m.mean(1, keepdim=True)
    return lam1 - abar.unsqueeze(-1) + 2.0 * lam2 * mbar, m - mbar, alpha - abar


def _centres(cvi: Any, st: Any) -> bool:
    """Whether the steps move the sites along the common mode: K latent functions and ``cvi.center``."""
    return st.lam1.dim() == 2 and getattr(cvi, "center", False)


def full_step(cvi: Any, model: Any, st: Any, K: torch.Tensor, gen: torch.Generator | None,
              method: str | None = None, work: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, Any]:
    """Evaluate the current q (marginals, ELBO), then update every site (eq. 13). Mutates ``st``; returns info.

    With K latent functions and ``cvi.center`` the sites are first moved along the common mode by :func:`center`
    (an exact partial maximisation: the bound reported is that of the centred sites). ``info["pieces"]`` holds
    what :func:`gpvi.inference.cvi.typeii.theta_objective` needs of the evaluated sites (factors, marginals,
    expectations, the sites themselves).

    ``work``: two buffers of the factors' shape, (N, N) or (K, N, N), that the factors and their inverses are
    written into (:func:`gpvi.numerics.sites.site_factor`, :func:`gpvi.numerics.sites.marginals`) instead of fresh
    allocations (the inner runs: :func:`gpvi.inference.cvi.inner.converge_sites`).

    Raises :class:`~gpvi.numerics.sites.SiteFault` (non-finite ELBO) or :class:`~gpvi.exceptions.NotPSDError`
    (failed factorisation) before changing anything but the counters.
    """
    pieces = None
    if not st.initialised:
        m = torch.zeros_like(st.lam1, dtype=K.dtype, device=K.device)
        v = K.diagonal().clone() if st.lam1.dim() == 1 else K.diagonal().unsqueeze(-1).expand_as(m).clone()
        ex_elbo = expectations(cvi, model, m, v, None, cvi.elbo_method)
        elbo = ex_elbo.value.sum()                                           # KL(prior || prior) = 0
    else:
        ytilde, s = sites.pseudo_data(st.lam1, st.lam2)
        L, jit = sites.site_factor(K, s, st.theta) if work is None else sites.site_factor(K, s, st.theta, out=work[0])
        if jit > 0:
            st.counters["jitter_events"] += 1
        inv = "Linv" if sites.keeps_inverse(K.shape[-1]) else "P"      # what the type-II gradient gets cheaper
        m, v, alpha, kept = sites.marginals(K, L, ytilde, keep_inverse=inv == "Linv", keep_precision=inv == "P",
                                            out=None if work is None else work[1])
        if _centres(cvi, st):
            st.lam1, m, alpha = center(st.lam1, st.lam2, m, alpha)
        elbo, ex_elbo = _bound(cvi, model, st.lam1, st.lam2, K, L, m, v, alpha)
        pieces = {"L": L, inv: kept, "m": m, "v": v, "alpha": alpha}
    elbo_f = sites.finite_or_fault(elbo, st.t)
    use = method or cvi.estimator
    # the bound's expectations are by the deterministic rule whatever the estimator; with that rule as the
    # estimator the same call gives the gradients (one pass over the nodes instead of two)
    ex = ex_elbo if use == cvi.elbo_method else expectations(cvi, model, m, v, gen, use)
    g1, g2 = mean_parameter_gradients(ex.dm, ex.dv, m)
    evaluated = (st.lam1, st.lam2)
    residual = float(torch.maximum((g1 - st.lam1).abs(), (g2 - st.lam2).abs()).nan_to_num(nan=math.inf).max())
    beta = beta_at(cvi, st)
    info = {"elbo": elbo_f, "residual": residual, "beta": beta, "sites": st.lam1.numel(), "checked": True,
            "elbo_step": st.t, "evaluated": evaluated}
    if pieces is not None:
        pieces.update(elbo=elbo_f, lam1=evaluated[0], lam2=evaluated[1], ex=ex_elbo)
        info["pieces"] = pieces
    cap = sites.lam2_cap(K)
    info["update"] = (g1, g2, m, cap)          # what update_sites needs to step from the evaluated sites again
    st.lam1, st.lam2 = sites.update_sites(st.lam1, st.lam2, g1, g2, beta, st.counters, cap, cvi.invalid, m=m)
    st.initialised = True
    st.t += 1
    st.sites_updated += st.num_sites
    st.factor = None
    return info


def keep_monotone(st: Any, info: dict[str, Any], tol: float) -> None:
    r"""Keep a run of full-batch steps ELBO-monotone (after :func:`full_step`, which evaluated the bound of the
    sites ``info["evaluated"]`` and then updated them).

    If that bound is below the last accepted one (``st.elbo``, the last check) by more than
    ``tol * max(1, |bound|)``, the last step made things worse: the sites go back to the accepted ones
    (``st.kept_lam1``, ``st.kept_lam2``), ``info["backtracked"]`` is set (the caller halves the step) and the
    next step, from those sites, is not compared again
    (``st.redo``: its bound is the kept one). Otherwise the evaluated sites become the accepted ones. Neither the
    undone step nor the redo is a check (``info["checked"] = False``): the stop rule compares accepted bounds only.

    Why: the damped CVI map of the class-factorised softmax can settle on a 2-cycle instead of its fixed point (an
    eigenvalue of its Jacobian below -1 where the signal variance is large and ``beta`` near 1; on the iris split
    at its MAP-II theta, ``beta`` = 0.8 and 1 cycled for 1,000 steps and MAP-II returned a bound of -24.8 and
    -46,176 against -22.9). An ELBO-monotone sequence converges to the fixed point, as the inner runs of
    :func:`gpvi.inference.cvi.typeii.monotone_run` do.

    For the quadrature estimator only (:attr:`gpvi.inference.cvi.engine.CVI.monotone`): the fixed
    quasi-Monte Carlo rule's :math:`\partial_v E` is Price's average, consistent with the rule's own value only to
    the rule's error, so near the fixed point its bound wobbles (relative decreases of 1e-11 in a K = 4 run);
    undoing those moved the sites 2e-5 away from the CVI fixed point that single-site runs reach, and a slack large
    enough to ignore them let a beta = 1 run cycle below it for 1,000 steps.
    """
    elbo = info["elbo"]
    slack = tol * max(1.0, abs(elbo))
    if st.redo:
        st.redo = False
        info["checked"] = False
        return
    if st.kept_lam1 is not None and math.isfinite(st.elbo) and elbo < st.elbo - slack:
        st.lam1, st.lam2 = st.kept_lam1, st.kept_lam2
        st.redo = True
        st.counters["backtracks"] = st.counters.get("backtracks", 0) + 1
        info["checked"] = False
        info["backtracked"] = True
        return
    st.kept_lam1, st.kept_lam2 = info["evaluated"]      # their bound becomes st.elbo at this step's check


def forget_kept(st: Any) -> None:
    """Drop the accepted sites of :func:`keep_monotone` (their bound belongs to the theta and sites they were
    accepted at): for a state whose theta or sites were set by hand."""
    st.kept_lam1 = st.kept_lam2 = None
    st.redo = False


def _next_batch(st: Any, gen: torch.Generator, batch_size: int) -> torch.Tensor:
    n = st.num_sites
    if st.order is None or st.order_pos >= n:
        st.order = torch.randperm(n, generator=gen, device=gen.device).to(st.lam1.device)
        st.order_pos = 0
    idx = st.order[st.order_pos:st.order_pos + batch_size]
    st.order_pos += idx.shape[0]
    return idx


def refactor(st: Any, K: torch.Tensor, *, measure: bool) -> float:
    """Recompute the factor(s) from scratch; return the drift max |L_updated - L_fresh| (nan if not measured)."""
    _, s = sites.pseudo_data(st.lam1, st.lam2)
    L, jit = sites.site_factor(K, s, st.theta)
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


def _refresh(st: Any, K: torch.Tensor) -> None:
    """Recompute the factor(s) from scratch without moving the refactorisation (check) schedule."""
    since = st.since_refactor
    refactor(st, K, measure=False)
    st.since_refactor = since


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


def _check(cvi: Any, model: Any, st: Any, K: torch.Tensor) -> dict[str, Any]:
    """Refactorise (measuring the drift), centre the sites along the common mode (K latent functions) and
    evaluate the ELBO."""
    drift = refactor(st, K, measure=True)
    ytilde, _ = sites.pseudo_data(st.lam1, st.lam2)
    m, v, alpha = sites.marginals(K, st.factor, ytilde)
    if _centres(cvi, st):
        st.lam1, m, alpha = center(st.lam1, st.lam2, m, alpha)
    elbo = sites.finite_or_fault(_bound(cvi, model, st.lam1, st.lam2, K, st.factor, m, v, alpha)[0], st.t)
    return {"elbo": elbo, "drift": drift, "checked": True, "elbo_step": st.t}


def _batch_marginals(K: torch.Tensor, L: torch.Tensor, ytilde: torch.Tensor, idx: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Marginals ``m``, ``v`` of the sites ``idx`` from the cached factor(s): one (batched) triangular solve with
    the columns :math:`\mathbf k_n`, :math:`\tilde{\mathbf y}` and :math:`e_{n_0}`, O(K N^2 (B + 2)); also
    :math:`L^{-1} e_{n_0}` (per factor), the vector the rank-one update of the batch's first site needs."""
    N, B = K.shape[0], idx.shape[0]
    e = torch.zeros(N, 1, dtype=L.dtype, device=L.device)
    e[idx[0], 0] = 1.0
    if L.dim() == 2:
        R = torch.linalg.solve_triangular(L, torch.cat([K[:, idx], ytilde.unsqueeze(-1), e], dim=1), upper=False)
        Vb = R[:, :B]
        return Vb.T @ R[:, B], K.diagonal()[idx] - (Vb * Vb).sum(0), R[:, B + 1].unsqueeze(0)
    C = L.shape[0]
    rhs = torch.cat([K[:, idx].expand(C, N, B), ytilde.T.unsqueeze(-1), e.expand(C, N, 1)], dim=-1)
    R = torch.linalg.solve_triangular(L, rhs, upper=False)                   # (C, N, B + 2)
    Vb = R[..., :B]
    m_b = (Vb * R[..., B].unsqueeze(-1)).sum(1).T                             # (B, C)
    return m_b, K.diagonal()[idx].unsqueeze(-1) - (Vb * Vb).sum(1).T, R[..., B + 1]


def stochastic_step(cvi: Any, model: Any, st: Any, K: torch.Tensor, gen: torch.Generator) -> dict[str, Any]:
    """One doubly stochastic step on ``batch_size`` data points (all their sites) with the cached factor(s),
    updated in place. Returns info (``checked``, with ``elbo`` and ``drift``, at refactorisations).

    The first step of a run is a full-batch step from the prior (unvisited sites would have infinite
    pseudo-noise). A ``KeyboardInterrupt`` during the in-place factor update leaves ``st.factor = None`` (it is
    recomputed from scratch at the next step, keeping the refactorisation schedule).
    """
    opts = cvi.single_site
    if not st.initialised:
        info = full_step(cvi, model, st, K, gen)
        refactor(st, K, measure=False)
        return info
    if st.factor is None:                      # resumed without a factor: recompute it, keep the schedule
        _refresh(st, K)
    if not st.factor.mT.is_contiguous():
        st.factor = st.factor.mT.contiguous().mT
    L = st.factor
    idx = _next_batch(st, gen, opts.batch_size)
    ytilde, s_old = sites.pseudo_data(st.lam1, st.lam2)
    m_b, v_b, p0 = _batch_marginals(K, L, ytilde, idx)
    ex = expectations(cvi, model, m_b, v_b, gen, idx=idx)
    g1, g2 = mean_parameter_gradients(ex.dm, ex.dv, m_b)
    beta = beta_at(cvi, st)
    new1, new2 = sites.update_sites(st.lam1[idx].reshape(-1), st.lam2[idx].reshape(-1), g1.reshape(-1),
                                    g2.reshape(-1), beta, st.counters, sites.lam2_cap(K), cvi.invalid,
                                    m=m_b.reshape(-1))
    new1, new2 = new1.view_as(m_b), new2.view_as(m_b)
    lam1, lam2 = st.lam1.clone(), st.lam2.clone()
    lam1[idx], lam2[idx] = new1, new2
    st.lam1, st.lam2 = lam1, lam2
    # keep the factor of K + S_k current: one diagonal entry per site, only the trailing block moves. A site near
    # the precision floor has pseudo-noise up to 1e10 mean(diag K) (e.g. robust-max sites where the likelihood is
    # flat): a rank-one update by such an amount cancels catastrophically, so those steps refactorise instead
    s_new = -0.5 / new2
    delta = (s_new - s_old[idx]).reshape(idx.shape[0], -1)                    # (B, number of factors)
    big = HUGE_NOISE * float(K.diagonal().mean())
    unstable = bool(((delta != 0) & ((s_new > big) | (s_old[idx] > big)).reshape(delta.shape)).any())
    Ls = L if L.dim() == 3 else L.unsqueeze(0)
    try:
        try:
            if unstable:
                _refresh(st, K)
                st.counters["unstable_updates"] = st.counters.get("unstable_updates", 0) + 1
            else:
                for c in range(Ls.shape[0]):
                    update_factor_(Ls[c], idx, delta[:, c], p0[c], opts.factor_update)
            st.since_refactor += 1
        except NotPSDError:
            st.counters["factor_faults"] += 1
            warnings.warn("CVI: a rank-one downdate of the cached factor failed; refactorising from scratch",
                          NumericalWarning, stacklevel=4)
            refactor(st, K, measure=False)
        st.t += 1
        st.sites_updated += idx.shape[0]
        info: dict[str, Any] = {"beta": beta, "sites": new1.numel(), "checked": False}
        if st.since_refactor >= opts.refactor_period(st.num_sites)[0]:
            info.update(_check(cvi, model, st, K))
    except KeyboardInterrupt:
        st.factor = None                       # possibly half updated: the engine rolls the step back
        raise
    return info


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


def run_result(cvi: Any, target: Any, state: Any, report: Any) -> Any:
    """The engine contract's ``result``: ``cvi.posterior`` of ``state`` with the run report's
    flags and times in ``info`` (no convergence warning for a partial run); ``None`` for a run that ended on a
    fault when even the last good sites cannot be factorised."""
    extra = {"interrupted": report.interrupted, "faulted": report.faulted, "stopped_early": report.stopped_early,
             "time_s": report.time_s, "steps_this_run": report.steps_this_run}
    try:
        return cvi.posterior(target, state, extra, warn=not report.partial)
    except NotPSDError:
        if report.faulted:
            return None
        raise
