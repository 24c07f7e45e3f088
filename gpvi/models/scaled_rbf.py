r"""The paper's kernel (ScaleKernel over an RBF) in closed form: covariance with analytic backward, large-N log marginal.

For :math:`K_y = \sigma_f^2 \exp(-\tfrac12 \sum_k (x_{ik} - x_{jk})^2 / \ell_k^2) + \sigma^2 I` with
:math:`\theta = [\log \ell_1^2, \dots, \log \ell_d^2, \log \sigma_f^2, \log \sigma^2]`, an upstream gradient
:math:`G = \partial F / \partial K_y` and :math:`\tilde G = G \circ K_f` (kernel part only):

.. math::

    \frac{\partial F}{\partial \log \ell_k^2}
      = \frac{1}{2\ell_k^2} \sum_{ij} \tilde G_{ij} (x_{ik} - x_{jk})^2
      = \frac{1}{\ell_k^2}\Big[\tfrac12 \sum_i x_{ik}^2 (r_i + c_i) - (X^\top \tilde G X)_{kk}\Big],

    \frac{\partial F}{\partial \log \sigma_f^2} = \sum_{ij} \tilde G_{ij}, \qquad
    \frac{\partial F}{\partial \log \sigma^2} = \sigma^2 \operatorname{tr} G,

with :math:`r, c` the row and column sums of :math:`\tilde G`. Forward and backward are each one batched
matrix product plus a few O(S N^2) passes, instead of the half-dozen ``(S, N, N)`` temporaries autograd keeps
through GPyTorch's generic distance code. GPyTorch's generic path stays the reference: tests compare values
and gradients of both paths.

Shift invariance. The expansion :math:`\|x_i\|^2 + \|x_j\|^2 - 2 x_i^\top x_j` (and the gradient's
:math:`\sum_i x_{ik}^2(\cdot) - (X^\top \tilde G X)_{kk}`) cancels catastrophically when the inputs sit far from the
origin compared with their spread: its rounding error is about :math:`\epsilon \max_i \|x_i\|^2 / \ell^2`. Years or
timestamps (offset :math:`10^3 \ldots 10^9`) made the log marginal drift in the 6th digit and the kernel matrix lose
positive definiteness. The models therefore never pass raw inputs: for a stationary kernel
(:func:`is_stationary`) they centre the columns once, :math:`\tilde X = X - \mathbf 1 c^\top` with :math:`c` the column
medians of the training inputs (:func:`input_centre`), and apply the same :math:`c` to every ``X_new``
(:func:`centre_inputs`); the generic GPyTorch path gets the same centred inputs (GPyTorch divides by the
lengthscale before it centres, and ``torch.cdist`` in cross-covariances does not centre at all).

What "exact" means: a median is one of the column's own values, so for a shift :math:`X + \mathbf 1 a^\top` whose
entries are all exactly representable in float64, the median of the shifted column is exactly :math:`m_k + a_k`
and each centred entry, the float64 rounding of the real number :math:`(x_{ik} + a_k) - (m_k + a_k) = x_{ik} - m_k`,
is the very float computed for :math:`X`: the centred inputs, and every number computed from them, are
bit-identical to those of :math:`X`. When :math:`X + a` is not representable (e.g. offsets of :math:`10^9` on inputs
finer than the float64 spacing there, :math:`1.2 \times 10^{-7}`), the inputs themselves already differ by that
rounding and results agree to the accuracy those inputs carry. The medians are permutation invariant, so a
reordering of the rows leaves the centred inputs' values unchanged as well.

The exact log marginal in two N x N buffers, for large N
--------------------------------------------------------

For :math:`K_y = \sigma_f^2 \exp(-\tfrac12 \sum_k (x_{ik} - x_{jk})^2 / \ell_k^2) + \sigma^2 I` and one
:math:`\theta = [\log \ell^2_{1..m}, \log\sigma_f^2, \log\sigma^2]`,

.. math::

    \log \mathcal N(y \mid 0, K_y) = -\tfrac12 y^\top\alpha - \sum_i \log L_{ii} - \tfrac N2 \log 2\pi,
    \qquad L L^\top = K_y,\ \alpha = K_y^{-1} y,

    \frac{\partial}{\partial K_y} = G = \tfrac12(\alpha\alpha^\top - K_y^{-1})
    \quad\text{(Rasmussen \& Williams 2006, eq. 5.9)},

and the chain rule through the kernel as above (with :math:`\tilde G = G\circ K_f`):
:math:`\partial/\partial\log\sigma^2 = \sigma^2\operatorname{tr}G`, :math:`\partial/\partial\log\sigma_f^2 =
\sum_{ij}\tilde G_{ij}`, :math:`\partial/\partial\log\ell_k^2 = \ell_k^{-2}[\tfrac12\sum_i x_{ik}^2(r_i + c_i) -
(X^\top\tilde G X)_{kk}]`.

Memory. The batched path (:func:`scaled_rbf_covariance` + :func:`gpvi.linalg.
gaussian_log_marginal`) keeps :math:`K_y`, :math:`L`, :math:`K_y^{-1}` and :math:`G\circ K` alive together: about
five N x N copies per draw. Here every step works in place, so at most **two** N x N float64 buffers exist at
once: :math:`K_y` is built into one buffer and factorised in place (LAPACK's ``potrf`` overwrites its input), the
backward pass inverts the factor in place (``potri``), turns it into :math:`G` in place (a scaled identity and a
rank-one ``addr_``), and only then builds :math:`K_f` a second time into the one other buffer. At N = 50,000 a
copy is 20 GB (:math:`8N^2` bytes), so the largest N for a device with F free bytes is about
:math:`\sqrt{F / 16}` (plus the d-column workspaces): N = 50,000 needs 40 GB. On CUDA a third buffer was measured
(:data:`LEAN_COPIES_CUDA`): :math:`\sqrt{F / 24}`, 60 GB (55.9 GiB peak measured) at N = 50,000.

The models use this path for one :math:`\theta` at a time once :math:`N \ge` ``LEAN_MIN_N`` (a batch of draws
is then evaluated draw by draw: at that size the O(N^3) factorisation dominates and batching gains nothing, and
batched factorisations of large matrices hit size limits on CUDA). Values agree with the batched path to rounding
(tested); the factorisation and its jitter retries are :func:`gpvi.linalg.cholesky_in_place` (the policy of
:func:`gpvi.linalg.cholesky_with_jitter`, in one buffer).
"""


from __future__ import annotations

import math

import gpytorch
import torch

from ..linalg import cholesky_in_place

__all__ = ["is_scaled_rbf", "is_stationary", "input_centre", "centre_inputs", "scaled_rbf_covariance",
           "LEAN_MIN_N", "LEAN_COPIES", "LEAN_COPIES_CUDA", "lean_copies", "lean_log_marginal",
           "largest_n"]


def is_scaled_rbf(kernel: gpytorch.kernels.Kernel) -> bool:
    """Whether ``kernel`` is exactly ``ScaleKernel(RBFKernel(...))`` with no active_dims (fast path applies)."""
    return (
        type(kernel) is gpytorch.kernels.ScaleKernel
        and type(kernel.base_kernel) is gpytorch.kernels.RBFKernel
        and kernel.active_dims is None
        and kernel.base_kernel.active_dims is None
    )


_STATIONARY = (
    gpytorch.kernels.RBFKernel,
    gpytorch.kernels.MaternKernel,
    gpytorch.kernels.RQKernel,
    gpytorch.kernels.PeriodicKernel,
    gpytorch.kernels.CosineKernel,
    gpytorch.kernels.PiecewisePolynomialKernel,
    gpytorch.kernels.SpectralMixtureKernel,
    gpytorch.kernels.ConstantKernel,
)


def is_stationary(kernel: gpytorch.kernels.Kernel) -> bool:
    r"""Whether ``kernel`` depends on its inputs only through :math:`x - x'` (so inputs may be centred).

    True for GPyTorch's RBF, Matern, RQ, periodic, cosine, piecewise-polynomial, spectral-mixture and constant
    kernels (exact types, not subclasses, which may override ``forward``) and for ``ScaleKernel``, sums and
    products built only from them; False for anything else (linear, polynomial, user kernels), whose inputs are
    then passed unchanged.
    """
    t = type(kernel)
    if t in _STATIONARY:
        return True
    if t is gpytorch.kernels.ScaleKernel:
        return is_stationary(kernel.base_kernel)
    if t in (gpytorch.kernels.AdditiveKernel, gpytorch.kernels.ProductKernel):
        return all(is_stationary(k) for k in kernel.kernels)
    return False


def input_centre(X: torch.Tensor, kernel: gpytorch.kernels.Kernel) -> torch.Tensor | None:
    r"""The centre :math:`c` that the models subtract from every input, or ``None`` to leave inputs as they are.

    Parameters
    ----------
    X : torch.Tensor of shape (N, d)
        Training inputs (finite, float64).
    kernel : gpytorch.kernels.Kernel
        The model's kernel; only a stationary one (:func:`is_stationary`) is centred, since centring would change
        a kernel such as :math:`x^\top x'`.

    Returns
    -------
    torch.Tensor of shape (d,) or None
        The column medians (the lower median for even N: a value of the column itself, which is what makes
        centring exact under representable shifts; see the module notes), on ``X``'s device and dtype.
    """
    if not is_stationary(kernel):
        return None
    return X.median(dim=0).values


def centre_inputs(X: torch.Tensor, centre: torch.Tensor | None) -> torch.Tensor:
    """``X - centre`` (rows minus the centre of :func:`input_centre`), or ``X`` itself when ``centre`` is None."""
    return X if centre is None else X - centre


class _ScaledRBFCovariance(torch.autograd.Function):
    @staticmethod
    def forward(ctx, theta, X):  # theta: (S, m + 2), m = 1 (isotropic) or d lengthscales
        m = theta.shape[-1] - 2
        inv_ls = torch.exp(-0.5 * theta[:, :m])                     # 1 / l, (S, m)
        Xs = X.unsqueeze(0) * inv_ls.unsqueeze(-2)                  # (S, N, d)
        log_sf2 = theta[:, m]
        half_sq = -0.5 * (Xs * Xs).sum(-1)                          # (S, N)
        # -Q/2 + log sf2 = x_i.x_j - |x_i|^2/2 - |x_j|^2/2 + log sf2, clamped so that Q >= 0
        E = torch.baddbmm((half_sq + log_sf2.unsqueeze(-1)).unsqueeze(-1) + half_sq.unsqueeze(-2),
                          Xs, Xs.transpose(-1, -2))
        torch.minimum(E, log_sf2[:, None, None], out=E)
        K = E.exp_()
        noise = torch.exp(theta[:, m + 1])
        K.diagonal(dim1=-2, dim2=-1).add_(noise.unsqueeze(-1))
        ctx.save_for_backward(theta, X, K)
        return K

    @staticmethod
    def backward(ctx, G):
        if torch.is_grad_enabled():  # create_graph=True: refuse rather than return a silently wrong Hessian
            raise NotImplementedError("second derivatives are not available: gpvi computes the gradient of the exact log marginal in closed form (1/2 (alpha alpha^T - K^-1)), which autograd cannot differentiate again; use finite differences of the gradient (e.g. batched central differences) for Hessians")
        theta, X, K = ctx.saved_tensors
        return _covariance_vjp(theta, X, K, G), None


def _covariance_vjp(theta: torch.Tensor, X: torch.Tensor, K: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """The gradient in ``theta`` (S, m + 2) of ``sum(K * G)`` from ``K`` (S, N, N) = the covariance at ``theta``."""
    m = theta.shape[-1] - 2
    noise = torch.exp(theta[:, m + 1])
    GK = G * K
    g_diag = G.diagonal(dim1=-2, dim2=-1)
    GK.diagonal(dim1=-2, dim2=-1).sub_(g_diag * noise.unsqueeze(-1))     # remove the noise part
    r = GK.sum(-1)
    c = GK.sum(-2)
    grad = torch.empty_like(theta)
    grad[:, m] = r.sum(-1)
    grad[:, m + 1] = noise * g_diag.sum(-1)
    Xb = X.unsqueeze(0).expand(GK.shape[0], -1, -1)
    M = torch.bmm(GK, Xb)                                                # (S, N, d)
    per_dim = 0.5 * torch.bmm((r + c).unsqueeze(-2), Xb * Xb).squeeze(-2) - (Xb * M).sum(-2)   # (S, d)
    inv_ls2 = torch.exp(-theta[:, :m])
    if m == 1:
        grad[:, 0] = inv_ls2[:, 0] * per_dim.sum(-1)
    else:
        grad[:, :m] = inv_ls2 * per_dim
    return grad


def scaled_rbf_covariance(theta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """Training covariance ``K_f + sigma^2 I`` for theta ``(m + 2,)`` or ``(S, m + 2)``: ``(N, N)`` or ``(S, N, N)``.

    ``theta`` ends with ``log sigma_f^2, log sigma^2``; ``m`` lengthscale entries (1 or ``d``) come first.
    ``X`` should be centred (:func:`centre_inputs`): the result is mathematically shift invariant, but its
    rounding error grows with the inputs' distance from the origin (see the module notes).
    """
    single = theta.dim() == 1
    th = theta.unsqueeze(0) if single else theta
    K = _ScaledRBFCovariance.apply(th, X)
    return K[0] if single else K


def scaled_rbf_vjp(theta: torch.Tensor, X: torch.Tensor, K: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """The gradient in ``theta`` of ``(K * G).sum()`` for ``K = scaled_rbf_covariance(theta, X)`` given (theta
    ``(m + 2,)``, ``K`` and ``G`` ``(N, N)``): what autograd through :func:`scaled_rbf_covariance` returns, from a
    ``K`` already at hand instead of building it again (the same arithmetic as its backward)."""
    return _covariance_vjp(theta.unsqueeze(0), X, K.unsqueeze(0), G.unsqueeze(0))[0]


# ------------------------------------------------------------------ the two-buffer path for large N
LEAN_MIN_N = 4096
"""From this many training points on, the paper's kernel takes the two-buffer path, one theta at a time."""

LEAN_COPIES = 2
"""Dense N x N buffers alive at once on the two-buffer path (measured 2.1 on the CPU)."""

LEAN_COPIES_CUDA = 3
"""The same on CUDA, measured (3.00 at N = 5,000-50,000 on an H200: the in-place ``potrf``/``potri`` calls hold a
third buffer there); the memory check at construction counts this many."""


def lean_copies(device: torch.device | str | None) -> int:
    """N x N buffers the two-buffer path holds at its peak on ``device``: :data:`LEAN_COPIES_CUDA` on CUDA, else
    :data:`LEAN_COPIES`."""
    return LEAN_COPIES_CUDA if device is not None and torch.device(device).type == "cuda" else LEAN_COPIES

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


class _LeanLogMarginal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, theta, X, y, jitter, max_jitter, raise_on_failure):  # type: ignore[override]
        th = theta.detach()
        L, _ = cholesky_in_place(lambda: _kernel_into(th, X, noise=True), jitter=jitter, max_jitter=max_jitter,
                                 raise_on_failure=raise_on_failure, theta=th)
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
        Centred training inputs (:func:`centre_inputs`).
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
