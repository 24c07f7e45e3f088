r"""Hand-written training covariance with analytic backward for the paper's kernel (ScaleKernel over an RBF).

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
"""

from __future__ import annotations

import gpytorch
import torch

__all__ = ["is_scaled_rbf", "is_stationary", "input_centre", "centre_inputs", "scaled_rbf_covariance"]


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
        return grad, None


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
