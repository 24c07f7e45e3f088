r"""Site algebra, state and full-batch step of multi-class CVI (the class-factorised family).

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

Names: ``lam1``, ``lam2`` (N, K) sites; ``ytilde``, ``s`` (N, K); ``L`` (K, N, N) factors of :math:`K + S_k`;
``alpha`` (K, N); ``m``, ``v`` (N, K) marginals.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from ...exceptions import NotPSDError
from ...models.likelihoods import mean_parameter_gradients
from ...models.priors import prior_log_prob
from ...numerics import sites
from . import steps
from .state import CVIState

__all__ = ["MulticlassCVIState", "center", "elbo_from_sites", "full_step", "keep_monotone", "forget_kept",
           "theta_objective"]


class MulticlassCVIState(CVIState):
    r"""Everything that evolves during a multi-class CVI run (settings stay in the engine): a
    :class:`~gpvi.inference.cvi.state.CVIState` whose sites hold K numbers per data point.

    Attributes
    ----------
    lam1, lam2 : torch.Tensor of shape (N, K)
        Sites (``lam2 < 0`` once initialised).
    theta : torch.Tensor of shape (D,)
    generator : torch.Generator
        Monte Carlo draws.
    factor : torch.Tensor of shape (K, N, N) or None
        Single-site mode: the cached lower Cholesky factors of :math:`K + S_k`, one per class, each viewed from
        contiguous upper storage (rank-one updated in place). ``None``: computed from scratch at the next step.
    since_refactor, order, order_pos
        Single-site steps since the last refactorisation; the sweep's permutation of the data points and the next
        position in it.
    t, sites_updated, initialised, elbo, beta_scale, converged, consecutive_failures, wall_time, step_time_s,
    counters, trace
        As in :class:`~gpvi.inference.cvi.state.CVIState` (``sites_updated`` counts data points, so
        ``sites_updated / N`` are sweeps).

    Examples
    --------
    >>> import torch
    >>> z = torch.zeros(4, 3, dtype=torch.float64)
    >>> st = MulticlassCVIState(z, z.clone(), torch.zeros(2, dtype=torch.float64), torch.Generator().manual_seed(0))
    >>> MulticlassCVIState.from_state_dict(st.state_dict()).lam1.shape
    torch.Size([4, 3])
    """

    SITE_NDIM: ClassVar[int] = 2
    VERSION: ClassVar[int] = 1

    def __repr__(self) -> str:
        return (f"MulticlassCVIState(t={self.t}, N={self.num_sites}, K={self.lam1.shape[1]}, "
                f"elbo={self.elbo:.6g}, converged={self.converged})")


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


def expectations(eng: Any, model: Any, m: torch.Tensor, v: torch.Tensor, gen: torch.Generator | None,
                 method: str | None = None):
    """The likelihood's expectations by ``method`` (default: the engine's estimator), times the model's weights."""
    use = method or eng.estimator
    return model.site_expectations(m, v, method=use, quadrature=eng.quadrature,
                                   num_draws=eng.num_draws if use == "mc" else eng.num_fixed_draws, generator=gen)


def elbo_from_sites(eng: Any, model: Any, lam1: torch.Tensor, lam2: torch.Tensor, theta: torch.Tensor,
                    K: torch.Tensor | None = None) -> tuple[float, dict[str, torch.Tensor]]:
    """The bound (deterministic expectations) of the sites at ``theta`` and the pieces (``m``, ``v``, ``L``,
    ``alpha``)."""
    K = model.kernel_matrix(theta) if K is None else K
    ytilde, s = sites.pseudo_data(lam1, lam2)
    L, _ = sites.class_factors(K, s, theta)
    m, v, alpha = sites.class_marginals(K, L, ytilde)
    value = expectations(eng, model, m, v, None, eng.elbo_method).value.sum()
    return float(value - 0.5 * sites.class_kl2(lam2, m, v, L, alpha)), {"m": m, "v": v, "L": L, "alpha": alpha}


def full_step(eng: Any, model: Any, st: MulticlassCVIState, K: torch.Tensor, gen: torch.Generator | None,
              method: str | None = None) -> dict[str, Any]:
    """Evaluate the current q (marginals, bound), then update every site (eq. 13). Mutates ``st``; returns info.

    With ``eng.center`` the sites are first moved along the common mode by :func:`center` (an exact partial
    maximisation: the bound reported is that of the centred sites).

    Raises :class:`~gpvi.numerics.sites.SiteFault` or :class:`~gpvi.exceptions.NotPSDError` before changing
    anything but the counters.
    """
    N, C = st.lam1.shape
    pieces = None
    if not st.initialised:
        m = torch.zeros(N, C, dtype=K.dtype, device=K.device)
        v = K.diagonal().unsqueeze(-1).expand(N, C).clone()
        ex_elbo = expectations(eng, model, m, v, None, eng.elbo_method)
        elbo = ex_elbo.value.sum()                                                      # KL(prior || prior) = 0
    else:
        ytilde, s = sites.pseudo_data(st.lam1, st.lam2)
        L, jit = sites.class_factors(K, s, st.theta)
        if jit > 0:
            st.counters["jitter_events"] += 1
        m, v, alpha = sites.class_marginals(K, L, ytilde)
        if getattr(eng, "center", False):
            st.lam1, m, alpha = center(st.lam1, st.lam2, m, alpha)
        ex_elbo = expectations(eng, model, m, v, None, eng.elbo_method)
        elbo = ex_elbo.value.sum() - 0.5 * sites.class_kl2(st.lam2, m, v, L, alpha)
        pieces = {"L": L, "m": m, "alpha": alpha}
    elbo_f = sites.finite_or_fault(elbo, st.t)
    use = method or eng.estimator
    ex = ex_elbo if use == eng.elbo_method else expectations(eng, model, m, v, gen, use)
    g1, g2 = mean_parameter_gradients(ex.dm, ex.dv, m)
    evaluated = (st.lam1, st.lam2)
    residual = float(torch.maximum((g1 - st.lam1).abs(), (g2 - st.lam2).abs()).nan_to_num(nan=math.inf).max())
    beta = steps.beta_at(eng, st)
    st.lam1, st.lam2 = sites.update_sites(st.lam1, st.lam2, g1, g2, beta, st.counters, sites.lam2_cap(K),
                                          eng.invalid)
    st.initialised = True
    st.t += 1
    st.sites_updated += N
    info = {"elbo": elbo_f, "residual": residual, "beta": beta, "sites": N * C, "checked": True,
            "elbo_step": st.t - 1, "evaluated": evaluated}
    if pieces is not None:                  # what theta_objective(evaluated=) needs of the evaluated sites
        pieces.update(elbo=elbo_f, lam1=evaluated[0], lam2=evaluated[1], ex=ex_elbo)
        info["pieces"] = pieces
    return info


def keep_monotone(st: MulticlassCVIState, info: dict[str, Any], tol: float) -> None:
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


def forget_kept(st: MulticlassCVIState) -> None:
    """Drop the accepted sites of :func:`keep_monotone` (their bound belongs to the theta and sites they were
    accepted at): for a state whose theta or sites were set by hand."""
    st.kept_lam1 = st.kept_lam2 = None
    st.redo = False


def theta_objective(eng: Any, model: Any, lam1: torch.Tensor, lam2: torch.Tensor, theta: torch.Tensor,
                    prior: Any = None, *, evaluated: dict[str, Any] | None = None
                    ) -> tuple[float, torch.Tensor | None]:
    r"""The bound at ``theta`` with the sites held fixed, plus :math:`\log p(\theta)` when ``prior`` is given, and
    its gradient in ``theta``. ``(-inf, None)`` when a factorisation fails or the value is not finite.

    The classes share :math:`K_\theta`, so :math:`\partial\mathcal L/\partial K = \sum_k G_k` with :math:`G_k` the
    binary closed form of each class's site term (:func:`gpvi.numerics.sites.kernel_gradient`, batched over
    the K factors), pushed through :math:`K(\theta)` by autograd (the same gradient as autograd through the K
    Cholesky factors and the marginals, to 2e-15 relative, at half the cost).

    ``evaluated``: the ``info["pieces"]`` of a :func:`full_step` at this ``theta`` (its bound, the sites it
    evaluated, their factors, marginals and expectations). Then ``lam1``, ``lam2`` are ignored and nothing is
    factorised or integrated again: the value and gradient are those of the sites that step evaluated.
    """
    th = theta.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        Kg = model.kernel_matrix(th)
    if evaluated is not None:
        lam1, lam2, L, m, alpha, ex = (evaluated[k] for k in ("lam1", "lam2", "L", "m", "alpha", "ex"))
        val = torch.as_tensor(evaluated["elbo"], dtype=Kg.dtype, device=Kg.device)
    else:
        K = Kg.detach()
        ytilde, s = sites.pseudo_data(lam1, lam2)
        try:
            L, _ = sites.class_factors(K, s, theta.detach())
        except NotPSDError:
            return -math.inf, None
        m, v, alpha = sites.class_marginals(K, L, ytilde)
        ex = expectations(eng, model, m, v, None, eng.elbo_method)
        val = ex.value.sum() - 0.5 * sites.class_kl2(lam2, m, v, L, alpha)
    if not bool(torch.isfinite(val)):
        return -math.inf, None
    G = sites.kernel_gradient(L, lam1.T, lam2.T, m.T, alpha, ex.dm.T, ex.dv.T).sum(0)
    with torch.enable_grad():
        out = (Kg * G).sum()
        if prior is not None:
            lp = prior_log_prob(prior, th)
            out = out + lp
            val = val + lp.detach()
        (grad,) = torch.autograd.grad(out, th)
    value = float(val)
    if not math.isfinite(value) or not bool(torch.isfinite(grad).all()):
        return -math.inf, None
    return value, grad.detach()
