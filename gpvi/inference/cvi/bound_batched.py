r"""The rows of an ``(S, D)`` call of :class:`gpvi.inference.cvi.bound.CVIBoundTarget` run together (one latent
function): the ELBO-monotone inner runs of :func:`gpvi.inference.cvi.inner.converge_sites` with masks over the
rows and batched factorisations, then the envelope gradient of :func:`gpvi.inference.cvi.inner.theta_objective`,
batched. Rows that need jitter or fail a site update are left to the sequential path.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...linalg import cholesky_plain, logdet_from_cholesky
from ...models.likelihoods import expected_log_lik, mean_parameter_gradients
from ...models.scaled_rbf import scaled_rbf_covariance
from ...numerics import sites
from ...numerics.sites import MIN_SITE_PRECISION

__all__ = ["batched_bound", "batched_kernel"]


def batched_kernel(target: Any, theta: torch.Tensor) -> torch.Tensor:
    r"""Batched :math:`K_\theta` ``(S, N, N)``, the same values as ``model.kernel_matrix`` row by row."""
    m = target.model
    if m.kernel_params.fast_path and m.use_fast_path:
        pad = torch.full((*theta.shape[:-1], 1), -math.inf, dtype=theta.dtype, device=theta.device)
        return scaled_rbf_covariance(torch.cat([theta, pad], -1), m._Xc)
    return m.kernel_params.matrix(theta, m._Xc)



def _site_terms(target: Any, K: torch.Tensor, lam1: torch.Tensor, lam2: torch.Tensor):
    """Batched factor of K + S, marginals, ELBO and site expectations; ``ok`` flags rows that factorised."""
    S, N = lam1.shape
    s = -0.5 / lam2
    ytilde = s * lam1
    A = K.clone()
    A.diagonal(dim1=-2, dim2=-1).add_(s)
    L, ok = cholesky_plain(A)
    eye = torch.eye(N, dtype=K.dtype, device=K.device)
    L = torch.where(ok[:, None, None], L, eye)
    alpha = torch.cholesky_solve(ytilde.unsqueeze(-1), L).squeeze(-1)
    m = (K @ alpha.unsqueeze(-1)).squeeze(-1)
    W = torch.linalg.solve_triangular(L, K, upper=False)
    v = K.diagonal(dim1=-2, dim2=-1) - (W * W).sum(-2)
    y = target.model.y.expand(S, N)
    ex = expected_log_lik(target.model.likelihood, y.reshape(-1), m.reshape(-1), v.reshape(-1),
                          quadrature=target.cvi.quadrature)
    value = ex.value.reshape(S, N).sum(-1)
    kl2 = (m * alpha).sum(-1) - (v / s).sum(-1) + logdet_from_cholesky(L) - torch.log(s).sum(-1)
    elbo = value - 0.5 * kl2
    ok = ok & torch.isfinite(elbo)
    return L, alpha, m, v, s, elbo, ex.dm.reshape(S, N), ex.dv.reshape(S, N), ok



def batched_bound(target: Any, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All rows at once: monotone full-batch CVI from the anchor (the rules of ``converge_sites``, row by row,
    with masks), then the envelope gradient. Returns values, gradients and the rows that succeeded."""
    S = theta.shape[0]
    with torch.no_grad():
        K = batched_kernel(target, theta)
    _, a1, a2 = target.anchor
    lam1, lam2 = a1.expand(S, -1).clone(), a2.expand(S, -1).clone()
    keep1, keep2 = lam1.clone(), lam2.clone()
    prev = torch.full((S,), math.nan, dtype=torch.float64, device=theta.device)
    scale = torch.ones(S, dtype=torch.float64, device=theta.device)
    redo = torch.zeros(S, dtype=torch.bool, device=theta.device)
    active = torch.ones(S, dtype=torch.bool, device=theta.device)
    good = torch.ones(S, dtype=torch.bool, device=theta.device)
    cap = -0.5 * MIN_SITE_PRECISION / K.diagonal(dim1=-2, dim2=-1).mean(-1).clamp_min(1e-300)
    beta, tol = float(target.cvi.beta), target.inner_tol
    steps = 0
    with torch.no_grad():
        for _ in range(target.inner_num_steps):
            idx = (active & good).nonzero().flatten()
            if idx.numel() == 0:
                break
            steps += idx.numel()
            l1, l2 = lam1[idx], lam2[idx]
            _, _, m, _, _, elbo, dm, dv, ok = _site_terms(target, K[idx], l1, l2)
            g1, g2 = mean_parameter_gradients(dm, dv, m)
            b = (beta * scale[idx]).unsqueeze(-1)
            new1, new2 = (1.0 - b) * l1 + b * g1, (1.0 - b) * l2 + b * g2
            new2 = torch.minimum(new2, cap[idx].unsqueeze(-1))            # the precision floor of update_sites
            ok = ok & torch.isfinite(new1).all(-1) & (new2 < 0).all(-1)
            good[idx[~ok]] = False                                          # left to the sequential path
            r, p = redo[idx], prev[idx]
            pf = torch.isfinite(p)
            conv = ~r & pf & ((elbo - p).abs() <= tol * elbo.abs().clamp_min(1.0))
            down = ~r & pf & ~conv & (elbo < p)
            accept = ~r & ~conv & ~down
            lam1[idx] = torch.where(down.unsqueeze(-1), keep1[idx], new1)
            lam2[idx] = torch.where(down.unsqueeze(-1), keep2[idx], new2)
            keep1[idx] = torch.where(accept.unsqueeze(-1), l1, keep1[idx])
            keep2[idx] = torch.where(accept.unsqueeze(-1), l2, keep2[idx])
            prev[idx] = torch.where(accept, elbo, p)
            scale[idx] = torch.where(accept, (1.5 * scale[idx]).clamp_max(1.0),
                                     torch.where(down, 0.5 * scale[idx], scale[idx]))
            target.counters["inner_backtracks"] = target.counters.get("inner_backtracks", 0) + int(down.sum())
            redo[idx] = down
            active[idx[conv]] = False
    target.counters["inner_steps"] += steps
    target.counters["unconverged"] += int((active & good).sum())
    # the envelope gradient at the final sites (inner.theta_objective, batched)
    th = theta.detach().clone().requires_grad_(True)
    Kg = batched_kernel(target, th)
    Kd = Kg.detach()
    L, alpha, m, v, s, elbo, dm, dv, ok = _site_terms(target, Kd, lam1, lam2)
    good = good & ok
    G = sites.kernel_gradient(L, lam1, lam2, m, alpha, dm, dv)
    G = torch.where(good[:, None, None], G, torch.zeros_like(G))
    (grad,) = torch.autograd.grad(Kg, th, grad_outputs=G)
    good = good & torch.isfinite(grad).all(-1)
    return elbo.detach(), grad.detach(), good
