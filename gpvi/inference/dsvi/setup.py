"""Setting up a DSVI run: what ``optimizer="auto"`` resolves to, the initial (mu, C) from a start and
``init_scale``, the block mask, the SGD rate."""

from __future__ import annotations

import math
import numbers
import warnings
from collections import deque
from typing import Any

import torch

from ...exceptions import NumericalWarning
from ...rng import randn
from ...validation import as_float_tensor
from ...models.target import is_minibatch_target
from ..derivatives import log_joint_and_grad
from ..init import LAPLACE_MAX_DIM, Start, check_start, laplace_scale_at
from .state import DSVIState

__all__ = ["auto_optimizer", "initial_state", "resumed_state", "initial_moments", "block_mask", "curvature_rate"]


def auto_optimizer(target: Any, analytic_term: Any) -> tuple[str, str]:
    """What ``optimizer="auto"`` resolves to on ``target``, and why: ``"natural"`` when the target offers a cheap
    MAP/Laplace start (an exact ``log_marginal_likelihood``, full data, D <= ``LAPLACE_MAX_DIM``, no analytic term
    of the bound's own), else ``"sgd"`` (Algorithm 1)."""
    laplace_ok = (analytic_term is None and not is_minibatch_target(target)
                  and callable(getattr(target, "log_marginal_likelihood", None))
                  and len(target.names) <= LAPLACE_MAX_DIM)
    if laplace_ok:
        return "natural", "the target has an exact log_marginal_likelihood and D <= 200: MAP/Laplace start"
    return "sgd", "no cheap MAP/Laplace start (not an exact GP target, a minibatch target, D > 200 or an " \
                  "analytic term): Algorithm 1"


def initial_state(engine: Any, target: Any, start: Start, generator: torch.Generator) -> DSVIState:
    """The state of a fresh run of ``engine`` at ``start`` (see :meth:`gpvi.DSVI.init`): the base and the rule
    checked against D, the start against the log joint, the initial moments, the resolved step sizes."""
    D = len(target.names)
    base = engine.make_base(D)
    if base.dim != D:
        raise ValueError(f"base has dimension {base.dim} but the target has D = {D}")
    optimizer, why = engine._resolve(target)
    rule = engine.rule_for(optimizer)
    if rule.fixed_mean is not None and rule.fixed_mean.shape[0] != D:
        raise ValueError(f"fixed_mean must have length D = {D}; got {rule.fixed_mean.shape[0]}")
    batch = target.sample_minibatch(generator) if is_minibatch_target(target) else None
    check_start(target, start.theta, batch)
    mu0, C0, init_info = initial_moments(engine, target, start, D, optimizer)
    init_info["time_s"] = start.info.get("time_s", init_info.get("time_s", 0.0))
    init_info["auto"] = {"optimizer": optimizer, "why": why}
    rho0 = rule.initial_rate(target, mu0, generator, batch)
    return DSVIState(mu=mu0, C=C0, t=0, generator=generator, scale=engine.scale, rho0_mu=rho0,
                     rho0_C=rho0 * rule.lr_scale, opt=rule.init_opt(mu0, C0),
                     window=deque(maxlen=engine.convergence.window_for(optimizer)), optimizer=optimizer,
                     init_info=init_info)


def resumed_state(engine: Any, state: DSVIState) -> DSVIState:
    """``state`` (a copy) checked against ``engine``'s scale and update rule and made ready to continue: the
    window resized to the engine's, a run stopped at its plateau set to go on to the finish."""
    if state.scale != engine.scale:
        raise ValueError(f"state was made with scale={state.scale!r} but this engine has scale={engine.scale!r}")
    if not isinstance(engine.optimizer, str) and state.optimizer != engine.optimizer.name:
        raise ValueError(f"state was made with optimizer={state.optimizer!r} but this engine has "
                         f"optimizer={engine.optimizer!r}")
    if state.window.maxlen != engine.convergence.window_for(state.optimizer):
        state.window = deque(state.window, maxlen=engine.convergence.window_for(state.optimizer))
    state.check["stopped"] = False
    if engine.convergence.finishes(state) and state.check.get("batches") is None:
        state.converged = False                   # stopped at its plateau: the finish is still to come
    return state


def initial_moments(engine: Any, target: Any, start: Start, D: int, optimizer: str
                    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """(mu0, C0) from the start and ``init_scale``: a posterior's scale wins, then an explicit
    ``init_scale``, then a Laplace scale (given by the start, or built at mu0 for ``"natural"``)."""
    info = {k: v for k, v in start.info.items() if k not in ("time_s", "hessian")}
    mu0 = start.theta.clone()                       # length D: checked by gpvi.inference.init.start_point
    auto = isinstance(engine.init_scale, str)
    C0 = start.scale_tril if (start.scale_source == "posterior" or (auto and start.scale_tril is not None)) \
        else None
    if C0 is None and auto and optimizer == "natural" and start.scale_source is None \
            and "scale" not in info and not is_minibatch_target(target) and D <= LAPLACE_MAX_DIM:
        C0, how = laplace_scale_at(target, mu0)
        info.update({k: v for k, v in how.items() if k != "hessian"})
        if C0 is None:
            warnings.warn(f"DSVI: no Laplace scale at the initial mean ({how['scale_reason']}); starting from "
                          f"C = 0.1 I", NumericalWarning, stacklevel=4)
            info["scale"] = "init_scale (laplace failed: " + how["scale_reason"] + ")"
    if C0 is None:
        C0 = scale_from_setting(0.1 if auto else engine.init_scale, D, device=mu0.device)
        if C0.dim() == 1 and engine.scale == "full":
            C0 = torch.diag(C0)
        if not auto or "scale" not in info:
            info["scale"] = "init_scale"
    c0 = C0 if C0.dim() == 1 else torch.diagonal(C0)
    if not bool((c0 > 0).all()) or not bool(torch.isfinite(C0).all()):
        raise ValueError("init_scale must be finite with a strictly positive diagonal")
    if engine.scale == "diag":
        if C0.dim() == 2:
            C0 = torch.sqrt((C0 ** 2).sum(-1))        # marginal scales of the given C
    else:
        mask = engine._block_mask(D)
        C0 = torch.tril(C0) if mask is None else C0 * mask
    return mu0, C0.clone(), info


def theta_from(mu: torch.Tensor, C: torch.Tensor, z: torch.Tensor, diag: bool) -> torch.Tensor:
    return mu + z * C if diag else torch.addmm(mu, z, C.T)


def scale_from_setting(s: Any, D: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``init_scale`` as a (D,) diagonal or a (D, D) lower-triangular matrix, on ``device`` (the start's)."""
    if isinstance(s, numbers.Real) and not isinstance(s, bool):
        return torch.full((D,), float(s), dtype=torch.float64, device=device)
    st = as_float_tensor(s, "init_scale", ndim=(1, 2), device=device)
    if st.dim() == 1 and st.shape[0] != D:
        raise ValueError(f"init_scale must have length D = {D}; got {st.shape[0]}")
    if st.dim() == 2:
        if st.shape != (D, D):
            raise ValueError(f"init_scale must be ({D}, {D}); got {tuple(st.shape)}")
        if bool((torch.triu(st, 1) != 0).any()):
            raise ValueError("init_scale must be lower triangular")
    return st.clone()


def block_mask(blocks: list[Any], D: int) -> torch.Tensor:
    """Lower-triangular boolean mask of a block-diagonal C from block sizes or index groups."""
    if all(isinstance(b, numbers.Integral) and not isinstance(b, bool) for b in blocks):
        sizes = [int(b) for b in blocks]
        if any(s < 1 for s in sizes) or sum(sizes) != D:
            raise ValueError(f"blocks as sizes must be positive and sum to D = {D}; got {sizes}")
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        groups = [list(range(s, s + n)) for s, n in zip(starts, sizes)]
    else:
        try:
            groups = [[int(i) for i in g] for g in blocks]
        except TypeError:
            raise TypeError("blocks must be a list of block sizes or a list of index groups") from None
        if sorted(i for g in groups for i in g) != list(range(D)):
            raise ValueError(f"blocks must partition range(D) with D = {D} (every index exactly once)")
    M = torch.zeros(D, D, dtype=torch.bool)
    for g in groups:
        ix = torch.tensor(g)
        M[ix.unsqueeze(1), ix.unsqueeze(0)] = True
    return torch.tril(M)


def curvature_rate(target: Any, mu0: torch.Tensor, gen: torch.Generator, batch: Any) -> float:
    """0.5 / |largest eigenvalue of the Hessian of log g at mu0| by power iteration (finite differences)."""
    v = randn((mu0.shape[0],), gen, dtype=mu0.dtype, device=mu0.device)
    v = v / v.norm()
    h = 1e-4 * (1.0 + float(mu0.abs().max()))
    lam = math.nan
    for _ in range(20):
        _, g = log_joint_and_grad(target, torch.stack([mu0 + h * v, mu0 - h * v]), batch)
        Hv = -(g[0] - g[1]) / (2 * h)
        if not bool(torch.isfinite(Hv).all()):
            lam = math.nan
            break
        lam = float(v @ Hv)
        nrm = float(Hv.norm())
        if nrm == 0.0:
            break
        v = Hv / nrm
    lam = abs(lam)
    if not math.isfinite(lam) or lam <= 1e-12:
        warnings.warn("DSVI SGD(lr='auto'): could not estimate the curvature of log g at the initial mean; "
                      "using lr = 1e-3 (pass optimizer=SGD(lr=...) explicitly)", NumericalWarning, stacklevel=4)
        return 1e-3
    return 0.5 / lam
