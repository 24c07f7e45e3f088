r"""DSVI's update rules: from a stochastic gradient of the bound to a proposed step of :math:`(\mu, C)`.

* ``"sgd"`` (:class:`~gpvi.inference.dsvi.options.SGD`) -- Algorithm 1: :math:`\Delta\mu = \rho\hat\nabla_\mu`,
  :math:`\Delta C = \rho_C\hat\nabla_C`;
* ``"natural"`` (:class:`~gpvi.inference.dsvi.options.Natural`) -- the same gradients preconditioned by q's scale,
  with a KL trust region (:func:`natural_step`);
* ``"adam"`` (:class:`~gpvi.inference.dsvi.options.Adam`) -- the same gradients fed to Adam (:func:`adam_step`).

:func:`keep_diagonal_positive` then makes sure no step makes a diagonal entry of :math:`C` non-positive, and
:func:`polyak_update` keeps the running average the run may return.

Update rules. ``"sgd"`` is Algorithm 1 exactly (above). ``"natural"`` (gpvi's, a departure
from the paper) uses *the same stochastic gradients* :math:`\hat\nabla_\mu, \hat\nabla_C` but preconditions them
by q's own scale, i.e. takes plain gradient steps in the coordinates :math:`\mu = \mu_0 + C_0 b`,
:math:`C = C_0(I + A)` around the current iterate:

.. math::

    \mu \leftarrow \mu + \rho\, C C^\top \hat\nabla_\mu,\qquad
    C \leftarrow C\big(I + \rho\,\operatorname{tril}(C^\top \hat\nabla_C)\big).

The mean step is the natural gradient of the Gaussian bound in :math:`\mu` (Fisher information
:math:`(CC^\top)^{-1}`); the scale step is a relative (multiplicative) step, invariant to affine
reparametrisations of :math:`\theta`. The preconditioner is positive definite, so the fixed points (where the
expected gradients vanish) are those of Algorithm 1: the same bound is maximised, only the path differs. Each
step is shrunk by halving until the Gaussian KL divergence between the old and the new q is at most
``Natural(max_step_kl=...)`` (a trust region; counted in ``info["trust_clips"]``), which also keeps the diagonal of C
positive. Cost per step :math:`O(D^3)` for the products with a full C (negligible next to a GP log joint).
It is meant to start from a good scale: by default at the MAP with the Laplace scale
:math:`C_0 = \operatorname{chol}((-\nabla^2\log g(\hat\theta))^{-1})` (:func:`gpvi.inference.laplace.laplace_approximation`, Hessian by
central differences of the gradient). ``"adam"`` feeds the gradients
to Adam (per-coordinate rates, also a departure).
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["natural_step", "adam_step", "keep_diagonal_positive", "polyak_update"]


def natural_step(C: torch.Tensor, diag: bool, g_mu: torch.Tensor, g_C: torch.Tensor, rho: float, rho_C: float,
                 max_step_kl: float, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, float]:
    r"""Preconditioned step from Algorithm 1's gradients, with a KL trust region (``optimizer="natural"``).

    :math:`b = C^\top \hat\nabla_\mu`, :math:`A = \operatorname{tril}(C^\top \hat\nabla_C)` (block ``mask``
    applied); proposed :math:`\mu' = \mu + \alpha\rho\, C b`, :math:`C' = C(I + \alpha\rho_C A)`, with
    :math:`\alpha = 2^{-k}` the largest for which the Gaussian KL of the step
    :math:`\tfrac12[\lVert I+\alpha\rho_C A\rVert_F^2 - D + \alpha^2\rho^2\lVert b\rVert^2
    - 2\sum_d\log(1+\alpha\rho_C A_{dd})]` is at most ``max_step_kl`` (so the diagonal stays positive).

    Returns
    -------
    (d_mu, d_C, alpha)
    """
    if diag:
        b = C * g_mu
        A = C * g_C
        d_mu_unit, d_C_unit, a_diag = rho * C * b, rho_C * C * A, A
    else:
        b = C.T @ g_mu
        A = C.T @ g_C
        A = torch.tril(A) if mask is None else A * mask
        d_mu_unit, d_C_unit, a_diag = rho * (C @ b), rho_C * (C @ A), torch.diagonal(A)
    bb = float(b @ b)
    D = C.shape[0]
    alpha = 1.0
    for _ in range(60):
        dg = 1.0 + alpha * rho_C * a_diag
        if bool((dg > 0).all()):
            if diag:
                fro = float((dg ** 2).sum())
            else:
                fro = float(((alpha * rho_C) ** 2) * (A ** 2).sum() + 2.0 * alpha * rho_C * a_diag.sum()) + D
            kl = 0.5 * (fro - D + alpha * alpha * rho * rho * bb - 2.0 * float(torch.log(dg).sum()))
            if kl <= max_step_kl:
                break
        alpha *= 0.5
    return alpha * d_mu_unit, alpha * d_C_unit, alpha


def adam_step(opt: dict[str, Any], g_mu: torch.Tensor, g_C: torch.Tensor, rho: float, rho_C: float,
              betas: tuple[float, float], eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Adam (Kingma & Ba 2015) on the ascent direction; advances the moments in ``opt`` (the state's)."""
    b1, b2 = betas
    n = opt["n"] + 1
    opt["m_mu"] = b1 * opt["m_mu"] + (1 - b1) * g_mu
    opt["v_mu"] = b2 * opt["v_mu"] + (1 - b2) * g_mu * g_mu
    opt["m_C"] = b1 * opt["m_C"] + (1 - b1) * g_C
    opt["v_C"] = b2 * opt["v_C"] + (1 - b2) * g_C * g_C
    opt["n"] = n
    c1, c2 = 1 - b1 ** n, 1 - b2 ** n
    d_mu = rho * (opt["m_mu"] / c1) / (torch.sqrt(opt["v_mu"] / c2) + eps)
    d_C = rho_C * (opt["m_C"] / c1) / (torch.sqrt(opt["v_C"] / c2) + eps)
    return d_mu, d_C


def keep_diagonal_positive(C: torch.Tensor, d_C: torch.Tensor, diag: bool) -> tuple[torch.Tensor | None, float]:
    """Scale ``d_C`` so that no diagonal entry of ``C + d_C`` falls below half its value.

    Returns ``(d_C, 1.0)`` when the step is safe as it is, ``(alpha * d_C, alpha)`` when it was shrunk, and
    ``(None, 0.0)`` when no positive factor works (the C step is then dropped).
    """
    c_old = C if diag else torch.diagonal(C)
    dc = d_C if diag else torch.diagonal(d_C)
    if not bool(((c_old + dc) <= 0).any()):
        return d_C, 1.0
    neg = dc < 0
    alpha = float((0.5 * c_old[neg] / (-dc[neg])).min())
    if math.isfinite(alpha) and alpha > 0:
        return alpha * d_C, alpha
    return None, 0.0


def polyak_update(state: Any, mu: torch.Tensor, C: torch.Tensor) -> None:
    """Add the iterate ``(mu, C)`` to the state's Polyak-Ruppert running average."""
    state.polyak_n += 1
    if state.polyak_mu is None:
        state.polyak_mu, state.polyak_C = mu.clone(), C.clone()
    else:
        w = 1.0 / state.polyak_n
        state.polyak_mu = state.polyak_mu + w * (mu - state.polyak_mu)
        state.polyak_C = state.polyak_C + w * (C - state.polyak_C)
