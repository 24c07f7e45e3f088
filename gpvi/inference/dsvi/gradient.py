"""One stochastic estimate of the gradient of the DSVI bound (paper eq. 5-8), with invalid draws redrawn."""

from __future__ import annotations

import math
from typing import Any

import torch

from ...models.target import is_minibatch_target
from ..derivatives import log_joint_and_grad
from .setup import theta_from
from .state import DSVIState, GradientEstimate

__all__ = ["estimate_gradient"]


def estimate_gradient(engine: Any, target: Any, state: DSVIState, base: Any = None) -> GradientEstimate:
    """See :meth:`gpvi.inference.dsvi.engine.DSVI.estimate_gradient`."""
    mu, C, gen = state.mu, state.C, state.generator
    diag = state.scale == "diag"
    D = mu.shape[0]
    base = engine.make_base(D) if base is None else base
    S = engine.num_draws
    batch = target.sample_minibatch(gen) if is_minibatch_target(target) else None
    z = base.sample(S, gen, dtype=mu.dtype, device=mu.device)
    theta = theta_from(mu, C, z, diag)
    lj, g = log_joint_and_grad(target, theta, batch)
    calls, resampled = 1, 0
    valid = torch.isfinite(lj + g.sum(-1))       # value and every gradient entry finite
    for _ in range(engine.faults.max_resample if not bool(valid.all()) else 0):
        bad = (~valid).nonzero().flatten()
        if bad.numel() == 0:
            break
        z_new = base.sample(bad.numel(), gen, dtype=mu.dtype, device=mu.device)
        th_new = theta_from(mu, C, z_new, diag)
        lj_new, g_new = log_joint_and_grad(target, th_new, batch)
        calls += 1
        resampled += bad.numel()
        z[bad], theta[bad], lj[bad], g[bad] = z_new, th_new, lj_new, g_new
        valid[bad] = torch.isfinite(lj_new + g_new.sum(-1))
    nv = int(valid.sum())
    if nv == 0:
        return GradientEstimate(None, None, math.nan, 0, resampled, S, calls, z, theta, valid)
    zv, gv, ljv = (z[valid], g[valid], lj[valid]) if nv < S else (z, g, lj)
    term_value, term_mu, term_c = engine.term(base)(mu, C if diag else torch.diagonal(C))
    grad_mu = gv.mean(0) if term_mu is None else gv.mean(0) + term_mu
    fixed = engine.rule_for(state.optimizer).fixed_mean
    if fixed is not None:
        grad_mu = grad_mu.masked_fill(fixed, 0.0)
    if diag:
        grad_C = (gv * zv).mean(0) + term_c
    else:
        grad_C = gv.T @ zv / nv
        grad_C = torch.tril(grad_C) if engine.blocks is None else grad_C * engine._block_mask(D)
        grad_C.diagonal().add_(term_c)
    return GradientEstimate(grad_mu, grad_C, float(ljv.mean()) + term_value, nv, resampled, S - nv, calls, z,
                            theta, valid)
