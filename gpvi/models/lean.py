r"""The exact log marginal likelihood of the paper's kernel in two N x N buffers, for large N.

For :math:`K_y = \sigma_f^2 \exp(-\tfrac12 \sum_k (x_{ik} - x_{jk})^2 / \ell_k^2) + \sigma^2 I` and one
:math:`\theta = [\log \ell^2_{1..m}, \log\sigma_f^2, \log\sigma^2]`,

.. math::

    \log \mathcal N(y \mid 0, K_y) = -\tfrac12 y^\top\alpha - \sum_i \log L_{ii} - \tfrac N2 \log 2\pi,
    \qquad L L^\top = K_y,\ \alpha = K_y^{-1} y,

    \frac{\partial}{\partial K_y} = G = \tfrac12(\alpha\alpha^\top - K_y^{-1})
    \quad\text{(Rasmussen \& Williams 2006, eq. 5.9)},

and the chain rule through the kernel as in :mod:`gpvi.models.fastpaths` (with :math:`\tilde G = G\circ K_f`):
:math:`\partial/\partial\log\sigma^2 = \sigma^2\operatorname{tr}G`, :math:`\partial/\partial\log\sigma_f^2 =
\sum_{ij}\tilde G_{ij}`, :math:`\partial/\partial\log\ell_k^2 = \ell_k^{-2}[\tfrac12\sum_i x_{ik}^2(r_i + c_i) -
(X^\top\tilde G X)_{kk}]`.

Memory. The batched path (:func:`gpvi.models.fastpaths.scaled_rbf_covariance` + :func:`gpvi.linalg.
gaussian_log_marginal`) keeps :math:`K_y`, :math:`L`, :math:`K_y^{-1}` and :math:`G\circ K` alive together: about
five N x N copies per draw. Here every step works in place, so at most **two** N x N float64 buffers exist at
once: :math:`K_y` is built into one buffer and factorised in place (LAPACK's ``potrf`` overwrites its input), the
backward pass inverts the factor in place (``potri``), turns it into :math:`G` in place (a scaled identity and a
rank-one ``addr_``), and only then builds :math:`K_f` a second time into the one other buffer. At N = 50,000 a
copy is 20 GB (:math:`8N^2` bytes), so the largest N for a device with F free bytes is about
:math:`\sqrt{F / 16}` (plus the d-column workspaces): N = 50,000 needs 40 GB.

The models use this path for one :math:`\theta` at a time once :math:`N \ge` ``LEAN_MIN_N`` (a batch of draws
is then evaluated draw by draw: at that size the O(N^3) factorisation dominates and batching gains nothing, and
batched factorisations of large matrices hit size limits on CUDA). Values agree with the batched path to rounding
(tested); jitter retries follow :func:`gpvi.linalg.cholesky_with_jitter` (relative jitter, x10 per retry).
"""

from __future__ import annotations

import math
import warnings

import torch

from ..exceptions import NotPSDError, NumericalWarning

__all__ = ["LEAN_MIN_N", "LEAN_COPIES", "lean_log_marginal", "largest_n"]

LEAN_MIN_N = 4096
"""From this many training points on, the paper's kernel takes the two-buffer path, one theta at a time."""

LEAN_COPIES = 2
"""Dense N x N buffers alive at once on the two-buffer path."""

_LOG_2PI = math.log(2.0 * math.pi)


def largest_n(free_bytes: int, *, copies: int = LEAN_COPIES, itemsize: int = 8) -> int:
    """The largest N whose ``copies`` dense N x N matrices of ``itemsize`` bytes fit into ``free_bytes``."""
    return int(math.isqrt(max(int(free_bytes), 0) // (copies * itemsize)))


def _kernel_into(theta: torch.Tensor, X: torch.Tensor, *, noise: bool) -> torch.Tensor:
    """:math:`K_f` (+ :math:`\\sigma^2 I` if ``noise``) built in one N x N buffer (no autograd)."""
    m = theta.shape[-1] - 2
    Xs = X * torch.exp(-0.5 * theta[:m])                       # (N, d) / l
    half_sq = -0.5 * (Xs * Xs).sum(-1)                        # (N,)
    E = Xs @ Xs.T                                              # the one N x N buffer
    E.add_(half_sq[:, None] + theta[m]).add_(half_sq[None, :])
    torch.clamp_max_(E, float(theta[m]))                       # Q >= 0
    K = E.exp_()
    if noise:
        K.diagonal().add_(torch.exp(theta[m + 1]))
    return K


def _factor_in_place(theta: torch.Tensor, X: torch.Tensor, jitter: float, max_jitter: float,
                     raise_on_failure: bool) -> tuple[torch.Tensor | None, float]:
    """Build :math:`K_y` and overwrite it with its lower Cholesky factor; bounded relative-jitter retries."""
    level, added = 0.0, 0.0
    while True:
        K = _kernel_into(theta, X, noise=True)
        n = K.shape[-1]
        mean_diag = float(K.diagonal().abs().mean())
        floor = n * torch.finfo(K.dtype).eps * mean_diag
        if level > 0:
            added = level * (mean_diag if mean_diag > 0 else 1.0)
            K.diagonal().add_(added)
        info = torch.empty((), dtype=torch.int32, device=K.device)
        try:
            L, info = torch.linalg.cholesky_ex(K, out=(K, info))      # potrf in place: no second buffer
        except RuntimeError:                                          # a backend without aliased out=
            L, info = torch.linalg.cholesky_ex(K)
            del K
        d = L.diagonal()
        if int(info) == 0 and bool(torch.isfinite(d).all()) and float((d * d).min()) > floor:
            if added > 0:
                warnings.warn(f"kernel matrix not positive definite: added jitter {added:.2e} to the diagonal "
                              f"(N = {n})", NumericalWarning, stacklevel=4)
            return L, added
        del L
        level = jitter if level == 0 else level * 10.0
        if level > max_jitter * (1 + 1e-9):
            if raise_on_failure:
                raise NotPSDError(f"kernel matrix at theta = {theta.tolist()}: not positive definite even with "
                                  f"jitter {max_jitter:g} x mean(diag)", theta=theta, jitter=max_jitter)
            return None, math.nan


class _LeanLogMarginal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, theta, X, y, jitter, max_jitter, raise_on_failure):  # type: ignore[override]
        th = theta.detach()
        L, _ = _factor_in_place(th, X, jitter, max_jitter, raise_on_failure)
        ctx.theta, ctx.X = th, X
        if L is None:
            ctx.L = None
            return torch.full((), -math.inf, dtype=X.dtype, device=X.device)
        alpha = torch.cholesky_solve(y.unsqueeze(-1), L, upper=False).squeeze(-1)
        n = L.shape[-1]
        val = -0.5 * (y * alpha).sum() - torch.log(L.diagonal()).sum() - 0.5 * n * _LOG_2PI
        ctx.L, ctx.alpha = L, alpha          # attributes (not saved tensors) so backward can free L early
        return val

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        if torch.is_grad_enabled():
            raise NotImplementedError("second derivatives are not available on the two-buffer path (closed-form "
                                      "gradient); use finite differences of the gradient for Hessians")
        th, X = ctx.theta, ctx.X
        if ctx.L is None:
            return torch.zeros_like(th), None, None, None, None, None
        W, alpha = ctx.L, ctx.alpha
        ctx.L = ctx.alpha = None
        try:
            W = torch.cholesky_inverse(W, upper=False, out=W)          # potri in place
        except RuntimeError:                                          # pragma: no cover - backend dependent
            W = torch.cholesky_inverse(W, upper=False)
        g = g.to(W.dtype)
        W.mul_(-0.5 * g).addr_(alpha, alpha, alpha=float(0.5 * g))     # G = g/2 (alpha alpha^T - K^-1)
        m = th.shape[-1] - 2
        grad = torch.empty_like(th)
        noise = torch.exp(th[m + 1])
        grad[m + 1] = noise * W.diagonal().sum()
        Kf = _kernel_into(th, X, noise=False)                          # the second buffer
        W.mul_(Kf)                                                     # G o K_f
        del Kf
        r, c = W.sum(-1), W.sum(-2)
        grad[m] = r.sum()
        per_dim = 0.5 * ((r + c) @ (X * X)) - (X * (W @ X)).sum(0)     # (d,)
        inv_ls2 = torch.exp(-th[:m])
        if m == 1:
            grad[0] = inv_ls2[0] * per_dim.sum()
        else:
            grad[:m] = inv_ls2 * per_dim
        return grad, None, None, None, None, None


def lean_log_marginal(theta: torch.Tensor, X: torch.Tensor, y: torch.Tensor, *, jitter: float,
                      max_jitter: float, raise_on_failure: bool = True) -> torch.Tensor:
    r"""Exact :math:`\log\mathcal N(y\mid 0, K_f + \sigma^2 I)` of ScaleKernel(RBF) for one ``theta``, two buffers.

    Parameters
    ----------
    theta : torch.Tensor of shape (m + 2,)
        ``[log l^2 (1 or d entries), log sf^2, log noise]``; differentiable (closed-form backward).
    X : torch.Tensor of shape (N, d)
        Centred training inputs (:func:`gpvi.models.fastpaths.centre_inputs`).
    y : torch.Tensor of shape (N,)
    jitter, max_jitter : float
        Relative jitter of the first and last retry (see :func:`gpvi.linalg.cholesky_with_jitter`).
    raise_on_failure : bool
        Raise :class:`~gpvi.exceptions.NotPSDError` if even ``max_jitter`` fails; otherwise return ``-inf`` (zero
        gradient).

    Returns
    -------
    torch.Tensor of shape ()
    """
    if theta.dim() != 1:
        raise ValueError(f"theta must have shape (m + 2,) on the two-buffer path; got {tuple(theta.shape)}")
    return _LeanLogMarginal.apply(theta, X, y, jitter, max_jitter, raise_on_failure)
