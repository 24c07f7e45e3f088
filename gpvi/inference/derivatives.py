r"""Derivatives of a target's log joint: value and gradient, Hessians by autograd or finite differences.

Every engine that needs :math:`\log g(\theta)`, :math:`\nabla\log g` or :math:`\nabla^2\log g` (DSVI and its
Laplace start, Salimans-Knowles, ML-II) goes through these functions, so a target is called, shape-checked and
differentiated in one way everywhere. All of them take a batch ``theta`` of shape ``(S, D)`` and evaluate it in
batched log-joint calls (for :class:`gpvi.GPRegression`: one batched Cholesky per call).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..models.target import as_target, call_log_joint
from ..validation import as_float_tensor, check_choice, check_positive, check_positive_int

__all__ = ["log_joint_and_grad", "value_grad_hessian", "finite_difference_hessian"]


def log_joint_and_grad(target: Any, theta: torch.Tensor, batch: Any = None, *, chunk: int | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log joint ``(S,)`` and its autograd gradient ``(S, D)`` at the rows of ``theta``, detached.

    ``chunk`` caps the rows per log-joint call (``None``: one call). A target with its own ``log_joint_and_grad``
    (:meth:`gpvi.GPRegression.log_joint_and_grad`) is asked directly. A target that does not depend on
    ``theta`` (no autograd graph) gets a zero gradient; so does a row whose value is ``-inf`` and carries none.
    """
    if chunk is not None and theta.shape[0] > chunk:
        parts = [log_joint_and_grad(target, part, batch) for part in torch.split(theta, chunk)]
        return torch.cat([v for v, _ in parts]), torch.cat([g for _, g in parts])
    fast = getattr(target, "log_joint_and_grad", None)
    if batch is None and callable(fast):              # gpvi.GPRegression: closed form, no autograd graph
        return fast(theta.detach())
    theta = theta.detach().requires_grad_(True)
    with torch.enable_grad():
        lj = call_log_joint(target, theta, batch)
        if lj.requires_grad:
            (g,) = torch.autograd.grad(lj.sum(), theta, allow_unused=True)
            g = torch.zeros_like(theta) if g is None else g
        else:
            g = torch.zeros_like(theta)
    return lj.detach(), g.detach()


class _NoDoubleBackward(RuntimeError):
    """The target's gradient cannot be differentiated again by autograd."""


def _autograd_hessian(target: Any, theta: torch.Tensor, batch: Any
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Value, gradient and Hessian of each row of ``theta`` by double backward (D extra backward passes)."""
    S, D = theta.shape
    theta = theta.detach().requires_grad_(True)
    try:
        with torch.enable_grad():
            lj = call_log_joint(target, theta, batch)
            if not lj.requires_grad:
                z = torch.zeros_like(theta)
                return lj.detach(), z, torch.zeros(S, D, D, dtype=theta.dtype, device=theta.device), 0
            (g,) = torch.autograd.grad(lj.sum(), theta, create_graph=True, allow_unused=True)
            if g is None:
                z = torch.zeros_like(theta)
                return lj.detach(), z, torch.zeros(S, D, D, dtype=theta.dtype, device=theta.device), 0
            if not g.requires_grad:
                raise _NoDoubleBackward("the gradient of target.log_joint carries no autograd graph (its backward "
                                        "is not differentiable)")
            rows = []
            for i in range(D):
                (hi,) = torch.autograd.grad(g[:, i].sum(), theta, retain_graph=i < D - 1, allow_unused=True)
                rows.append(torch.zeros_like(theta) if hi is None else hi)
    except NotImplementedError as exc:
        raise _NoDoubleBackward(str(exc)) from exc
    except RuntimeError as exc:
        if isinstance(exc, _NoDoubleBackward):
            raise
        msg = str(exc)
        if "does not require grad" in msg or "double backward" in msg.lower() or "twice" in msg:
            raise _NoDoubleBackward(msg) from exc
        raise
    H = torch.stack(rows, 1).detach()                  # H[s, i, :] = d g_i / d theta
    H = 0.5 * (H + H.transpose(-1, -2))
    return lj.detach(), g.detach(), H, D


def _fd_hessian(target: Any, theta: torch.Tensor, batch: Any, fd_step: float, chunk: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Value, gradient and central-difference Hessian from log-joint calls on the ``S (2D + 1)`` rows
    (one call unless ``chunk`` caps the rows per call).

    Returns also ``ok_aux`` (S,): whether every perturbed row had a finite value and gradient.
    """
    S, D = theta.shape
    h = fd_step * (1.0 + theta.abs())                          # (S, D) per-coordinate step
    E = torch.diag_embed(h)                                    # (S, D, D), row i = h_i e_i
    tp = theta[:, None, :] + E
    tm = theta[:, None, :] - E
    # the steps actually taken (rounding of theta +- h): exact differences of the evaluation points
    denom = torch.diagonal(tp - tm, dim1=-2, dim2=-1)          # (S, D) = 2 h_i up to rounding
    pts = torch.cat([theta, tp.reshape(S * D, D), tm.reshape(S * D, D)], 0)
    lj_all, g_all = log_joint_and_grad(target, pts, batch, chunk=chunk)
    lj, g = lj_all[:S], g_all[:S]
    gp = g_all[S:S + S * D].reshape(S, D, D)
    gm = g_all[S + S * D:].reshape(S, D, D)
    H = (gp - gm) / denom[:, :, None]                          # H[s, i, :] ~ d g / d theta_i
    H = 0.5 * (H + H.transpose(-1, -2))
    aux_ok = (torch.isfinite(lj_all[S:]) & torch.isfinite(g_all[S:]).all(-1)).reshape(2, S, D).all(0).all(-1)
    return lj, g, H, aux_ok


def value_grad_hessian(target: Any, theta: Any, *, hessian: str = "auto", fd_step: float = 1e-4,
                       batch: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Log joint, gradient and Hessian at each row of ``theta``: ``(S, D) -> (S,), (S, D), (S, D, D)``.

    Parameters
    ----------
    target : target
        Anything with ``log_joint(theta)`` (``(S, D) -> (S,)``) differentiable by autograd, and ``names``.
    theta : array-like of shape (D,) or (S, D)
    hessian : {"auto", "autograd", "fd"}
        ``"autograd"``: :math:`D` extra backward passes through the gradient (``create_graph=True``); needs a
        target whose backward is itself differentiable (logistic regression, :class:`gpvi.Target` callables of
        torch operations). ``"fd"``: central differences of the autograd gradient,

        .. math::

            H_{:, i} \approx \frac{\nabla\log g(\theta + h_i e_i) - \nabla\log g(\theta - h_i e_i)}{2h_i},
            \qquad h_i = \texttt{fd\_step}\,(1 + |\theta_i|),\qquad H \leftarrow \tfrac12(H + H^\top),

        evaluated with ONE log-joint call on the ``(S (2D + 1), D)`` batch of :math:`\theta` and
        :math:`\theta \pm h_i e_i` (the value and gradient at :math:`\theta` come from the same call). The
        error is :math:`O(h^2)` (third derivatives) plus :math:`O(\epsilon_{\rm mach}|\nabla\log g| / h)`
        rounding: about :math:`10^{-8}` relative for the default step. ``"auto"``: autograd, falling back to
        finite differences when the target refuses second derivatives (e.g. :class:`gpvi.GPRegression`,
        whose closed-form gradient raises ``NotImplementedError`` under double backward).
    fd_step : float
        Relative finite-difference step (> 0).
    batch : optional
        Minibatch passed as ``log_joint(theta, batch=batch)`` (the same batch for every row).

    Returns
    -------
    (log_joint, grad, hess) : tensors of shape (S,), (S, D), (S, D, D)
        Unbatched ``theta`` of shape (D,) gives shapes (), (D,), (D, D). Hessians are symmetrised.

    Raises
    ------
    ValueError
        ``hessian="autograd"`` on a target whose gradient cannot be differentiated again.

    Examples
    --------
    >>> import torch, gpvi
    >>> target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1) - th[:, 0] ** 3 / 6, names=2)
    >>> theta = torch.tensor([1.0, 2.0], dtype=torch.float64)
    >>> _, _, H_ad = value_grad_hessian(target, theta, hessian="autograd")
    >>> _, _, H_fd = value_grad_hessian(target, theta, hessian="fd")
    >>> H_ad.tolist(), bool((H_fd - H_ad).abs().max() < 1e-7)
    ([[-2.0, 0.0], [0.0, -1.0]], True)
    """
    target = as_target(target)
    hessian = check_choice(hessian, "hessian", ("auto", "autograd", "fd"))
    fd_step = check_positive(fd_step, "fd_step")
    D = len(target.names)
    th = as_float_tensor(theta, "theta", ndim=(1, 2))
    single = th.dim() == 1
    th = th.unsqueeze(0) if single else th
    if th.shape[1] != D:
        raise ValueError(f"theta must have D = {D} columns; got shape {tuple(th.shape)}")
    if hessian == "fd":
        lj, g, H, _ = _fd_hessian(target, th, batch, fd_step)
    else:
        try:
            lj, g, H, _ = _autograd_hessian(target, th, batch)
        except _NoDoubleBackward as exc:
            if hessian == "autograd":
                raise ValueError(f"hessian='autograd' is not available for this target ({exc}); use hessian='fd' "
                                 f"(or 'auto')") from None
            lj, g, H, _ = _fd_hessian(target, th, batch, fd_step)
    if single:
        return lj[0], g[0], H[0]
    return lj, g, H




def finite_difference_hessian(target: Any, theta: Any, *, step: float = 1e-4, chunk: int = 32) -> torch.Tensor:
    r"""Hessian of :math:`\log g` at one point ``theta`` by central differences of the gradient, symmetrised.

    .. math::

        H_{:,j} \approx \frac{\nabla\log g(\theta + h_j e_j) - \nabla\log g(\theta - h_j e_j)}{2h_j},\qquad
        h_j = \text{step}\,(1 + |\theta_j|),\qquad H \leftarrow \tfrac12(H + H^\top).

    The :math:`2D` shifted gradients are evaluated in batched log-joint calls of ``chunk`` rows, so a GP target
    pays one batched Cholesky per chunk. Needed because :class:`gpvi.GPRegression` is not twice differentiable
    by autograd. The truncation error is :math:`O(h^2)` and the rounding error
    :math:`O(\epsilon\,|\nabla \log g| / h)`: about 1e-8 relative in float64. The same computation as
    ``value_grad_hessian(target, theta, hessian="fd")``, except that columns whose shifted points have a
    non-finite log joint (e.g. a failed Cholesky: value ``-inf``, zero gradient) are marked NaN.

    Parameters
    ----------
    target : target
        ``log_joint`` ``(S, D) -> (S,)``, differentiable once.
    theta : array-like of shape (D,)
    step : float
        Relative finite-difference step (> 0).
    chunk : int
        Rows per log-joint call.

    Returns
    -------
    torch.Tensor of shape (D, D)
        Symmetric; NaN entries in the rows and columns of coordinates whose shifted points failed.

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.inference.derivatives import finite_difference_hessian
    >>> A = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    >>> target = gpvi.Target(lambda th: -0.5 * ((th @ A) * th).sum(-1), names=2)
    >>> torch.allclose(finite_difference_hessian(target, torch.ones(2)), -A, atol=1e-8)
    True
    """
    target = as_target(target)
    theta = as_float_tensor(theta, "theta", ndim=1)
    step = check_positive(step, "step")
    chunk = check_positive_int(chunk, "chunk")
    D = theta.shape[0]
    if D != len(target.names):
        raise ValueError(f"theta has length {D} but the target has D = {len(target.names)}")
    th = theta.unsqueeze(0)
    h = step * (1.0 + th.abs())
    E = torch.diag_embed(h)
    pts = torch.cat([(th[:, None, :] + E).reshape(D, D), (th[:, None, :] - E).reshape(D, D)], 0)
    lj, G = log_joint_and_grad(target, pts, chunk=chunk)
    denom = torch.diagonal(pts[:D] - pts[D:])                   # the steps actually taken, 2 h_j up to rounding
    H = (G[:D] - G[D:]) / denom[:, None]                        # row j = d grad / d theta_j
    bad = ~(torch.isfinite(lj[:D] + lj[D:]) & torch.isfinite(G).reshape(2, D, D).all(0).all(-1))
    H = 0.5 * (H + H.T)
    H[bad, :] = math.nan
    H[:, bad] = math.nan
    return H
