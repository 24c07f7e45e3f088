r"""The regression statistics of Salimans & Knowles (2013), Algorithm 2 and its Hessian-free variant.

One step draws S points from :math:`q_t = \mathcal N(m_t, P_t^{-1})`, evaluates :math:`\log g`, its gradient and
(Algorithm 2) its Hessian there, redraws invalid points, and averages the per-draw statistics
(:func:`draw_statistics`); :func:`solve` turns (running or window-averaged) statistics into :math:`(m, L)` with
:math:`P = LL^\top`; :func:`estimate_bound` is the Monte Carlo bound of the returned q.

Names follow the paper: ``a`` = mean gradient :math:`\overline{\nabla\log g}`, ``z`` = mean draw, ``P`` =
:math:`-\overline{\nabla^2\log g}`; the Hessian-free variant's ``A`` = :math:`\overline{\tfrac12(x_+ -
x_-)\varepsilon^\top}`, ``B`` = :math:`\overline{\tfrac12(\nabla\log g(x_+) - \nabla\log g(x_-))\varepsilon^\top}`.
The standard-normal noise behind a draw is ``eps``: :math:`x^* = m + L^{-\top}\varepsilon`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from ...exceptions import NumericalWarning
from ...linalg import cholesky_with_jitter
from ...models.target import as_target
from ...rng import randn
from ...validation import as_float_tensor, check_positive_int
from ...numerics.budget import MemoryBudget
from ...models.target import call_log_joint, is_minibatch_target
from ..derivatives import _autograd_hessian, _fd_hessian, _NoDoubleBackward, log_joint_and_grad
from ..progress import Progress
from .options import HessianSource
from .state import SKState

__all__ = ["Estimate", "strict_cholesky", "scale_from_precision", "draw_statistics", "solve", "averaged",
           "window_drift", "window_bound", "estimate_bound", "BOUND_DRAW_BLOCK"]

LOG_2PI = math.log(2.0 * math.pi)
_PD_JITTER = 1e-13        # relative jitter of the strict positive-definiteness test (rounding level only)
BOUND_DRAW_BLOCK = 250
"""Draws of a bound estimate are generated in blocks of this size, so the estimate does not depend on how the
memory budget cuts its evaluation into log-joint calls."""


def strict_cholesky(M: torch.Tensor) -> torch.Tensor | None:
    """Lower Cholesky factor of a symmetric ``M`` if it is positive definite (beyond rounding), else None.

    Goes through :func:`gpvi.linalg.cholesky_with_jitter` with a jitter cap at rounding level, so an indefinite
    matrix is reported as such rather than "fixed".
    """
    if not bool(torch.isfinite(M).all()):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumericalWarning)
        res = cholesky_with_jitter(M, jitter=_PD_JITTER, max_jitter=_PD_JITTER, raise_on_failure=False,
                                   what="precision P")
    return res.L if bool(res.ok) else None


def scale_from_precision(L: torch.Tensor) -> torch.Tensor:
    """Lower-triangular :math:`C` with :math:`CC^\\top = (LL^\\top)^{-1}` (the posterior's ``scale_tril``)."""
    V = torch.cholesky_inverse(L)
    V = 0.5 * (V + V.T)
    return cholesky_with_jitter(V, what="covariance V = P^-1", raise_on_failure=True).L


@dataclass
class Estimate:
    """Per-step Monte Carlo estimates (averages over the valid draws) and their cost."""

    num_valid: int
    resampled: int
    dropped: int
    calls: int
    evals: int
    backward: int
    bound: float
    parts: dict[str, torch.Tensor] | None      # a, z (+ P) or (+ A, B); None when no draw was valid
    draws: torch.Tensor | None = None          # the valid draws' rows [x, log g(x), log q_t(x)] (S', D + 2)


def _evaluate(target: Any, state: SKState, theta: torch.Tensor, batch: Any, hessian: HessianSource
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, int, int]:
    """lj, g, H (or None), valid mask, rows evaluated, extra backward passes.

    With ``hessian.kind == "auto"`` a target that refuses double backward mid-run switches the state to finite
    differences (recorded in ``state.hessian_note``).
    """
    S = theta.shape[0]
    if state.method == "gradient":
        lj, g = log_joint_and_grad(target, theta, batch)
        return lj, g, None, torch.isfinite(lj) & torch.isfinite(g).all(-1), S, 0
    if state.hessian == "autograd":
        try:
            lj, g, H, nb = _autograd_hessian(target, theta, batch)
            valid = torch.isfinite(lj) & torch.isfinite(g).all(-1) & torch.isfinite(H).flatten(1).all(-1)
            return lj, g, H, valid, S, nb * 1
        except _NoDoubleBackward as exc:
            if hessian.kind != "auto":
                raise ValueError(f"hessian='autograd' is not available for this target ({exc}); use "
                                 f"hessian='fd' or 'auto'") from None
            state.hessian = "fd"
            state.hessian_note = f"auto: switched to finite differences at step {state.t} ({exc})"[:400]
    D = theta.shape[1]
    lj, g, H, aux_ok = _fd_hessian(target, theta, batch, hessian.fd_step)
    valid = torch.isfinite(lj) & torch.isfinite(g).all(-1) & torch.isfinite(H).flatten(1).all(-1) & aux_ok
    return lj, g, H, valid, S * (2 * D + 1), 0


def draw_statistics(target: Any, state: SKState, num_draws: int, max_resample: int, hessian: HessianSource
                    ) -> Estimate:
    r"""Draw S points from :math:`q_t`, evaluate, resample invalid ones; average the regression statistics.

    Draws are organised in *units*: single draws (``method="hessian"``) or antithetic pairs
    :math:`m \pm R\varepsilon` (``method="gradient"``; rows u and u + U of the batch). A unit with an invalid
    row is redrawn whole, up to ``max_resample`` rounds. A minibatch target gets one fresh batch, shared by all
    the rows of the step.
    """
    gen, D, S = state.generator, state.dim, num_draws
    pairs = state.method == "gradient"
    U = S // 2 if pairs else S
    batch = target.sample_minibatch(gen) if is_minibatch_target(target) else None
    L, m = state.L, state.m

    def draw(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        eps = state.standard_normals(k)
        if pairs:
            eps = torch.cat([eps, -eps], 0)
        x = m + torch.linalg.solve_triangular(L.T, eps.T, upper=True).T      # m + L^-T eps
        return eps, x

    def unit_ok(v: torch.Tensor) -> torch.Tensor:
        return v[: v.shape[0] // 2] & v[v.shape[0] // 2:] if pairs else v

    def rows(units: torch.Tensor, k: int) -> torch.Tensor:
        return torch.cat([units, units + k]) if pairs else units

    eps, theta = draw(U)
    lj, g, H, valid, evals, back = _evaluate(target, state, theta, batch, hessian)
    ok = unit_ok(valid)
    calls, resampled = 1, 0
    for _ in range(max_resample):
        bad = (~ok).nonzero().flatten()
        if bad.numel() == 0:
            break
        e_new, x_new = draw(bad.numel())
        lj_n, g_n, H_n, v_n, ev, bk = _evaluate(target, state, x_new, batch, hessian)
        calls, evals, back = calls + 1, evals + ev, back + bk
        resampled += x_new.shape[0]
        r = rows(bad, U)
        eps[r], theta[r], lj[r], g[r] = e_new, x_new, lj_n, g_n
        if H is not None:
            H[r] = H_n
        ok[bad] = unit_ok(v_n)
    nu = int(ok.sum())
    nv = 2 * nu if pairs else nu
    est = Estimate(nv, resampled, S - nv, calls, evals, back, math.nan, None)
    if nu == 0:
        return est
    keep = rows(ok.nonzero().flatten(), U)
    eps, theta, lj, g = eps[keep], theta[keep], lj[keep], g[keep]
    H = None if H is None else H[keep]
    # instantaneous bound: mean of log g(x) - log q_t(x), log q_t(x) = -|eps|^2/2 - D/2 log 2pi + sum log L_dd
    log_q = -0.5 * (eps * eps).sum(-1) - 0.5 * D * LOG_2PI + float(torch.log(torch.diagonal(L)).sum())
    est.bound = float((lj - log_q).mean())
    est.draws = torch.cat([theta.detach(), lj.detach().unsqueeze(-1), log_q.unsqueeze(-1)], -1)
    parts = {"a": g.mean(0), "z": theta.mean(0)}
    if H is not None:
        parts["P"] = -H.mean(0)
    else:
        # antithetic pairs: half-differences (x+ - x-)/2 = R eps and (g+ - g-)/2 against the instrument eps
        e_u = eps[:nu]
        dx = 0.5 * (theta[:nu] - theta[nu:])
        dg = 0.5 * (g[:nu] - g[nu:])
        parts.update(A=dx.T @ e_u / nu, B=dg.T @ e_u / nu)
    est.parts = parts
    return est


def solve(method: str, st: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
    r"""``(m, L)`` with :math:`P = LL^\top` from (running or averaged) statistics, or None when P is not PD.

    Algorithm 2: :math:`P = \mathrm{sym}(P)`; Hessian-free: :math:`P = -\mathrm{sym}(BA^{-1})`; then
    :math:`m = z + P^{-1}a`.
    """
    if method == "hessian":
        P = 0.5 * (st["P"] + st["P"].T)
    else:
        try:
            M = torch.linalg.solve(st["A"].T, st["B"].T).T              # B A^-1
        except RuntimeError:                                          # singular A
            return None
        if not bool(torch.isfinite(M).all()):
            return None
        P = -0.5 * (M + M.T)
    L = strict_cholesky(P)
    if L is None:
        return None
    m = st["z"] + torch.cholesky_solve(st["a"].unsqueeze(-1), L).squeeze(-1)   # m = P^-1 a + z
    if not bool(torch.isfinite(m).all()):
        return None
    return m, L


def averaged(state: SKState, which: tuple[int, ...] = (0, 1)
             ) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, int]:
    """:func:`solve` on the plain averages over the window halves ``which``, and the number of steps averaged."""
    n = sum(state.sums[i]["n"] for i in which)
    if n == 0:
        return None, 0
    keys = [k for k in state.sums[0] if k != "n"]
    st = {k: sum(state.sums[i][k] for i in which) / n for k in keys}
    return solve(state.method, st), n


def window_drift(state: SKState, L: torch.Tensor) -> tuple[float, float]:
    r"""The window-split check: ``(max |m_1 - m_2| / sd, max |log(sd_1 / sd_2)|)`` between the two halves of the
    averaging window (sd from the full window's :math:`P = LL^\top`); ``(inf, inf)`` when a half gives an
    indefinite precision. Both halves must hold steps."""
    halves = [averaged(state, (i,))[0] for i in (0, 1)]
    if halves[0] is None or halves[1] is None:
        return math.inf, math.inf
    sd = torch.sqrt(torch.diagonal(torch.cholesky_inverse(L)))
    sds = [torch.sqrt(torch.diagonal(torch.cholesky_inverse(h[1]))) for h in halves]
    return float(((halves[0][0] - halves[1][0]).abs() / sd).max()), float(torch.log(sds[0] / sds[1]).abs().max())


def window_bound(rows: list[torch.Tensor], mean: torch.Tensor, scale_tril: torch.Tensor
                 ) -> tuple[float, float, float]:
    r"""The bound :math:`\mathbb E_q[\log g(x) - \log q(x)]` of the returned :math:`q = \mathcal N(m, CC^\top)`
    from the averaging window's draws, importance-weighted: ``(estimate, standard error, effective sample size)``.

    Each window draw :math:`x_i` came from that step's :math:`q_{t_i}`, with :math:`\log g(x_i)` already evaluated
    (``rows``: :attr:`SKState.window_draws <gpvi.inference.salimans_knowles.state.SKState.window_draws>`). With
    :math:`w_i \propto q(x_i)/q_{t_i}(x_i)` normalised to sum 1, the estimate is :math:`\sum_i w_i(\log g(x_i) -
    \log q(x_i))` (self-normalised importance sampling: consistent, no new evaluation of the target) and its
    standard error :math:`\sqrt{\sum_i w_i^2 (v_i - \hat v)^2}`. The window's :math:`q_t` move little about the
    returned q, so the weights are near uniform (the effective sample size :math:`1/\sum_i w_i^2` is returned)."""
    R = torch.cat(rows)
    D = mean.shape[0]
    x, lg, lq_t = R[:, :D], R[:, D], R[:, D + 1]
    C = torch.tril(scale_tril)
    eps = torch.linalg.solve_triangular(C, (x - mean).T, upper=False).T
    log_q = -0.5 * (eps * eps).sum(-1) - 0.5 * D * LOG_2PI - torch.log(torch.diagonal(C)).sum()
    ok = torch.isfinite(lg) & torch.isfinite(log_q) & torch.isfinite(lq_t)
    if not bool(ok.any()):
        return math.nan, math.nan, 0.0
    lw = (log_q - lq_t)[ok]
    w = torch.softmax(lw, 0)
    v = (lg - log_q)[ok]
    est = float((w * v).sum())
    se = float(torch.sqrt((w * w * (v - est) ** 2).sum()))
    return est, se, float(1.0 / (w * w).sum())


def estimate_bound(target: Any, mean: Any, scale_tril: Any, num_draws: int, *,
                   generator: torch.Generator, budget: MemoryBudget | None = None, progress_bar: bool = False,
                   desc: str = "bound", keep: bool = False) -> tuple:
    r"""Monte Carlo estimate of the Gaussian bound :math:`\mathbb E_q[\log g(x) - \log q(x)]` and its se.

    Averages :math:`\log g(x_i) - \log q(x_i)` over draws :math:`x_i = m + C\varepsilon_i` from
    :math:`q = \mathcal N(m, CC^\top)`, with :math:`\log q(x_i) = -\tfrac12\lVert\varepsilon_i\rVert^2 -
    \tfrac D2\log 2\pi - \sum_d\log C_{dd}`. Same mean as :math:`\overline{\log g} + \mathcal H[q]` (the
    form DSVI reports) but a smaller variance when q is close to the posterior (zero when q is exact).
    Full-data log joint for minibatch targets; invalid draws are left out and counted. The draws come in blocks
    of :data:`BOUND_DRAW_BLOCK`; each block is evaluated in chunks of ``budget.draws_per_call`` draws.

    Parameters
    ----------
    target : target
    mean : array-like of shape (D,)
    scale_tril : array-like of shape (D, D)
        Lower-triangular C with a strictly positive diagonal.
    num_draws : int
    generator : torch.Generator
        Advanced by the draws.
    budget : MemoryBudget, optional
    progress_bar : bool
    desc : str
    keep : bool
        Also return the draws and the log joint at them (independent draws of q, e.g. for PSIS).

    Returns
    -------
    (estimate, standard_error, num_invalid), with ``(draws (n, D), log_joint (n,))`` appended when ``keep``
    """
    n = check_positive_int(num_draws, "num_draws")
    target = as_target(target)
    mean = as_float_tensor(mean, "mean", ndim=1)
    C = as_float_tensor(scale_tril, "scale_tril", ndim=2)
    D = mean.shape[0]
    if D != len(target.names) or C.shape != (D, D):
        raise ValueError(f"mean must be ({len(target.names)},) and scale_tril square of the same size; got "
                         f"{tuple(mean.shape)} and {tuple(C.shape)}")
    if not bool((torch.diagonal(C) > 0).all()):
        raise ValueError("scale_tril must have a strictly positive diagonal")
    budget = MemoryBudget() if budget is None else budget
    per_call = budget.draws_per_call(target, min(n, BOUND_DRAW_BLOCK))
    Ct = torch.tril(C).T
    vals, draws, lgs = [], [], []
    bar = Progress(n, enabled=progress_bar, desc=desc, leave=False)
    try:
        with torch.no_grad():
            for start in range(0, n, BOUND_DRAW_BLOCK):
                k = min(BOUND_DRAW_BLOCK, n - start)
                eps = randn((k, D), generator, dtype=mean.dtype, device=mean.device)
                for e in torch.split(eps, per_call):
                    x = mean + e @ Ct
                    lg = call_log_joint(target, x, None).detach()
                    vals.append(lg + 0.5 * (e * e).sum(-1))
                    if keep:
                        draws.append(x)
                        lgs.append(lg)
                    bar.update(e.shape[0])
    finally:
        bar.close()
    kept = (torch.cat(draws), torch.cat(lgs)) if keep else None
    v = torch.cat(vals)
    ok = torch.isfinite(v)
    bad = int((~ok).sum())
    v = v[ok]
    if v.numel() == 0:
        return (math.nan, math.nan, bad) + ((kept,) if keep else ())
    log_q_const = -0.5 * D * LOG_2PI - float(torch.log(torch.diagonal(C)).sum())   # log q = const - |eps|^2/2
    se = float(v.std() / math.sqrt(v.numel())) if v.numel() > 1 else math.nan
    return (float(v.mean()) - log_q_const, se, bad) + ((kept,) if keep else ())
