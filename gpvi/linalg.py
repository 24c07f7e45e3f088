"""All Cholesky work in gpvi: bounded jitter, the exact Gaussian log marginal, rank-one updates.

Symbols: ``K`` is a symmetric positive definite matrix (kernel matrix plus noise), ``L`` its lower Cholesky factor
(``K = L L^T``), ``alpha = K^{-1} y``. Leading dimensions of ``K`` are batch dimensions: one factorisation call
handles a whole ``(S, N, N)`` batch.

Jitter policy (one place, auditable): a factorisation that fails is retried on the failing batch members only, with
``jitter * mean(diag K)`` added to the diagonal, ``jitter`` going ``1e-8, 1e-7, ..., 1e-2`` by default. A
:class:`~gpvi.exceptions.NumericalWarning` says how much was added. Past the cap, a single matrix raises
:class:`~gpvi.exceptions.NotPSDError`; in a batch the failed members are reported in ``ok`` (callers give them log
density ``-inf``) unless ``raise_on_failure=True``. NaN or inf entries fail at once (jitter never "fixes" them). A
factorisation whose smallest pivot is at rounding level (``L_ii^2 <= N eps mean(diag K)``) counts as failed: the
matrix is numerically singular (e.g. duplicated inputs with a tiny noise variance), and jitter is added.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch
from scipy.linalg import lapack

from .exceptions import NotPSDError, NumericalWarning

__all__ = ["CholeskyResult", "cholesky_with_jitter", "cholesky_in_place", "cholesky_plain", "cholesky_update",
           "cholesky_site_update_", "logdet_from_cholesky", "gaussian_log_marginal", "triangular_inverse",
           "sum_of_squares", "DEFAULT_JITTER", "DEFAULT_MAX_JITTER"]

DEFAULT_JITTER = 1e-8
"""First relative jitter tried after a failed factorisation (times ``mean(diag K)``)."""
DEFAULT_MAX_JITTER = 1e-2
"""Largest relative jitter tried before giving up."""

_LOG_2PI = math.log(2.0 * math.pi)


class CholeskyResult(NamedTuple):
    """Result of :func:`cholesky_with_jitter`.

    Attributes
    ----------
    L : torch.Tensor of shape (..., N, N)
        Lower Cholesky factor of ``K + jitter_abs I``; identity for failed batch members.
    jitter : torch.Tensor of shape (...)
        Absolute jitter added to each member's diagonal (0 when none was needed).
    ok : torch.Tensor of shape (...), bool
        Whether each member was factorised.
    """

    L: torch.Tensor
    jitter: torch.Tensor
    ok: torch.Tensor


def cholesky_with_jitter(K: torch.Tensor, *, jitter: float = DEFAULT_JITTER, max_jitter: float = DEFAULT_MAX_JITTER,
                         raise_on_failure: bool | None = None, theta: Any = None, what: str = "kernel matrix",
                         overwrite: bool = False) -> CholeskyResult:
    r"""Cholesky factor :math:`K = L L^\top` with bounded, relative jitter retries.

    Parameters
    ----------
    K : torch.Tensor of shape (N, N) or (..., N, N)
        Symmetric matrices (only the lower triangle is read).
    jitter, max_jitter : float
        First and last relative jitter; each retry multiplies by 10. The absolute jitter is
        ``rel * mean(|diag K|)`` per batch member.
    raise_on_failure : bool, optional
        Raise :class:`NotPSDError` if any member still fails. Default: True for a single matrix,
        False for a batch.
    theta : optional
        Hyperparameters that produced ``K``, quoted in the error message.
    what : str
        Name of the matrix for messages.
    overwrite : bool
        ``K`` (both triangles symmetric) is a buffer the caller gives up: on the CPU (C-contiguous float64 or
        float32) the first attempt is LAPACK's ``potrf`` through SciPy (OpenBLAS; :func:`_potrf_`) in place, and
        ``L`` is a (column-major) view of ``K``'s memory; members that need jitter are restored first. Same policy.

    Returns
    -------
    CholeskyResult
        ``(L, jitter, ok)``.

    Raises
    ------
    NotPSDError
        When a member cannot be factorised even with ``max_jitter`` and ``raise_on_failure`` is true.
    """
    if K.dim() < 2 or K.shape[-1] != K.shape[-2]:
        raise ValueError(f"{what} must be square; got shape {tuple(K.shape)}")
    single = K.dim() == 2
    if raise_on_failure is None:
        raise_on_failure = single
    K = K.detach()
    batch_shape = K.shape[:-2]
    n = K.shape[-1]
    Kb = K.reshape(-1, n, n)
    dK = Kb.diagonal(dim1=-2, dim2=-1).clone()
    in_place = overwrite and Kb.device.type == "cpu" and Kb.dtype in (torch.float64, torch.float32) \
        and Kb.is_contiguous()
    L, info = _potrf_(Kb) if in_place else torch.linalg.cholesky_ex(Kb)
    # LAPACK stops at NaN pivots; an infinite diagonal entry would pass, so check the factor's diagonal (O(N)). A
    # pivot at rounding level (L_ii^2 < N eps mean(diag K)): numerically singular, the factor is noise; add jitter.
    diagL = L.diagonal(dim1=-2, dim2=-1)
    finite = torch.isfinite(diagL).all(-1) | (info != 0)
    floor = n * torch.finfo(K.dtype).eps * dK.abs().mean(-1)
    ok = (info == 0) & finite & ((diagL * diagL).amin(-1) > floor)
    for i, good in enumerate(ok.tolist() if in_place else []):    # L's strict upper triangle still holds K's:
        if good:                                    # zeroed (Kb's lower triangle, L = Kb.mT), or the member
            Kb[i].triu_()                           # rebuilt from it and the saved diagonal, for the jitter
        else:
            Kb[i].copy_(Kb[i].tril(-1) + Kb[i].tril(-1).mT).diagonal().copy_(dK[i])
    if not bool(ok.all()):
        finite = finite & torch.isfinite(Kb).flatten(1).all(dim=1)
    jit = torch.zeros(Kb.shape[0], dtype=K.dtype, device=K.device)
    if not bool(ok.all()):
        diag_mean = dK.abs().mean(-1)
        diag_mean = torch.where(diag_mean > 0, diag_mean, torch.ones_like(diag_mean))
        eye = torch.eye(n, dtype=K.dtype, device=K.device)
        level = jitter
        retry = (~ok) & finite
        while bool(retry.any()) and level <= max_jitter * (1 + 1e-9):
            idx = retry.nonzero().flatten()
            absj = level * diag_mean[idx]
            Lj, infoj = torch.linalg.cholesky_ex(Kb[idx] + absj[:, None, None] * eye)
            dj = Lj.diagonal(dim1=-2, dim2=-1)
            good = (infoj == 0) & torch.isfinite(dj).all(-1) & ((dj * dj).amin(-1) > floor[idx])
            if bool(good.any()):
                gi = idx[good]
                L[gi] = Lj[good]
                jit[gi] = absj[good]
                ok[gi] = True
                retry[gi] = False
            level *= 10.0
        n_jit = int((jit > 0).sum())
        n_fail = int((~ok).sum())
        if n_jit:
            warnings.warn(
                f"{what} not positive definite: added jitter up to {float(jit.max()):.2e} to the diagonal "
                f"of {n_jit} of {Kb.shape[0]} matrices",
                NumericalWarning,
                stacklevel=2,
            )
        if n_fail:
            if raise_on_failure:
                th = ""
                if theta is not None:
                    th_t = torch.as_tensor(theta).detach().cpu()
                    th = f" at theta = {th_t.tolist()}"
                reason = "non-finite entries" if not bool(finite.all()) else (
                    f"not positive definite even with jitter {max_jitter:g} x mean(diag)")
                raise NotPSDError(f"{what}{th}: {reason}", theta=theta, jitter=max_jitter)
            L[~ok] = eye
    return CholeskyResult(L.reshape(*batch_shape, n, n), jit.reshape(batch_shape), ok.reshape(batch_shape))


def _potrf_(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """LAPACK ``potrf`` (SciPy's OpenBLAS: 1.6x torch's MKL on AMD CPUs) of each symmetric member of a C-contiguous
    CPU batch ``A`` (B, N, N) in place, as the Fortran matrix ``A[i].T``; returns ``(L = A.mT, info)``, ``L`` lower
    and column-major as torch's factors, its strict upper triangle still holding ``A``'s entries."""
    potrf = lapack.dpotrf if A.dtype == torch.float64 else lapack.spotrf
    info = torch.zeros(A.shape[0], dtype=torch.int32, device=A.device)
    for i, Ai in enumerate(A.numpy()):
        c, info[i] = potrf(Ai.T, lower=1, overwrite_a=1, clean=0)       # in place (Fortran-contiguous input)
        if not np.shares_memory(c, Ai):
            np.copyto(Ai.T, c)
    return A.mT, info


def cholesky_in_place(build: Callable[[], torch.Tensor], *, jitter: float = DEFAULT_JITTER,
                      max_jitter: float = DEFAULT_MAX_JITTER, raise_on_failure: bool = True, theta: Any = None,
                      what: str = "kernel matrix") -> tuple[torch.Tensor | None, float]:
    r"""Lower Cholesky factor of one matrix written over the matrix itself (one N x N buffer), same jitter policy.

    For large N, where a second N x N buffer does not fit: ``build()`` returns a fresh (N, N) matrix, LAPACK's
    ``potrf`` overwrites it with :math:`L` (on a backend without aliased ``out=``, a second buffer is used). A
    failed factorisation (non-zero ``info``, a non-finite or rounding-level pivot, as in
    :func:`cholesky_with_jitter`) calls ``build()`` again and retries with ``rel * mean(|diag K|)`` added to the
    diagonal, ``rel`` going ``jitter, 10 jitter, ..., max_jitter``, with one
    :class:`~gpvi.exceptions.NumericalWarning` when jitter was needed.

    Returns
    -------
    L : torch.Tensor of shape (N, N) or None
        The factor (the buffer ``build()`` returned), or ``None`` when even ``max_jitter`` failed and
        ``raise_on_failure`` is false.
    jitter : float
        The absolute jitter added (0 when none was needed; NaN on failure).

    Raises
    ------
    NotPSDError
        When even ``max_jitter`` fails and ``raise_on_failure`` is true.
    """
    level, added = 0.0, 0.0
    while True:
        K = build()
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
                warnings.warn(f"{what} not positive definite: added jitter {added:.2e} to the diagonal (N = {n})",
                              NumericalWarning, stacklevel=3)
            return L, added
        del L
        level = jitter if level == 0 else level * 10.0
        if level > max_jitter * (1 + 1e-9):
            if raise_on_failure:
                th = f" at theta = {torch.as_tensor(theta).detach().cpu().tolist()}" if theta is not None else ""
                raise NotPSDError(f"{what}{th}: not positive definite even with jitter {max_jitter:g} x mean(diag)",
                                  theta=theta, jitter=max_jitter)
            return None, math.nan


def cholesky_plain(A: torch.Tensor, *, raise_on_failure: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Cholesky factors :math:`A = L L^\top` **without** jitter, for the places where jitter would change the
    algorithm rather than rescue it.

    Those are: EP's cavity and tilted covariances (a matrix that is not positive definite means the EP step is
    invalid, and the caller backs off its damping), the small per-site covariance matrices of the softmax
    quadrature (a zero variance falls back to the diagonal square roots), the whitened NUTS target and the batched
    CVI bound targets (which add their own documented jitter or give a failed row :math:`-\infty`), and the Laplace
    scale of a start (a Hessian that is not negative definite falls back to its diagonal). Everything else
    factorises through :func:`cholesky_with_jitter`.

    Parameters
    ----------
    A : torch.Tensor of shape (..., n, n)
    raise_on_failure : bool
        Raise ``torch.linalg.LinAlgError`` (as ``torch.linalg.cholesky``) when a member is not positive definite;
        otherwise report it in ``ok`` (its rows of ``L`` are then meaningless).

    Returns
    -------
    L : torch.Tensor of shape (..., n, n)
    ok : torch.Tensor of shape (...), bool
    """
    if raise_on_failure:
        L = torch.linalg.cholesky(A)
        return L, torch.ones(A.shape[:-2], dtype=torch.bool, device=A.device)
    L, info = torch.linalg.cholesky_ex(A)
    return L, info == 0


def logdet_from_cholesky(L: torch.Tensor) -> torch.Tensor:
    """``log |L L^T| = 2 sum(log diag L)``, batched."""
    return 2.0 * torch.log(L.diagonal(dim1=-2, dim2=-1)).sum(-1)


def triangular_inverse(L: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    r""":math:`L^{-1}` of a lower-triangular ``L`` (..., N, N), batched, lower triangular, on ``L``'s device and dtype:
    LAPACK's ``trtri`` on the CPU (:func:`scipy.linalg.lapack.dtrtri`, :math:`N^3/3` flops, a third of a triangular
    solve with N right-hand sides), :func:`torch.linalg.solve_triangular` against the identity elsewhere. ``out``: a
    contiguous buffer of ``L``'s shape to write into on the CPU (a fresh one is allocated otherwise)."""
    if L.device.type != "cpu" or L.dtype not in (torch.float64, torch.float32) or L.requires_grad:
        eye = torch.eye(L.shape[-1], dtype=L.dtype, device=L.device).expand_as(L)
        return torch.linalg.solve_triangular(L, eye, upper=False)
    trtri = lapack.dtrtri if L.dtype == torch.float64 else lapack.strtri
    cm = not L.is_contiguous() and L.mT.is_contiguous()     # column-major (torch's and _potrf_'s factors)
    src = L.detach().mT if cm else L.detach()
    out = src.clone(memory_format=torch.contiguous_format) if out is None else out.copy_(src)
    for Li in out.reshape(-1, *L.shape[-2:]).numpy():
        # the Fortran view Li.T of C-ordered memory is L itself (column-major L) or U = L^T (C-ordered L), inverted
        # in place; U^{-1} = L^{-T} read back in C order is L^{-1} (the zero triangles are left as they are)
        _, info = trtri(Li.T, lower=int(cm), overwrite_c=1)
        if info != 0:
            raise NotPSDError(f"triangular_inverse: the factor is singular (LAPACK trtri info {info})")
    return out.mT if cm else out


def sum_of_squares(A: torch.Tensor, dim: int) -> torch.Tensor:
    r""":math:`\sum_i A_{ij}^2` along ``dim`` (-1: rows, -2: columns) of a batch of matrices (..., M, N), on ``A``'s
    device and dtype: one pass of :func:`numpy.einsum` on the CPU (the squared column norms of an N x N triangular
    inverse in a tenth of :func:`torch.linalg.vector_norm`'s time), ``(A * A).sum(dim)`` elsewhere or under autograd."""
    if dim not in (-1, -2):
        raise ValueError(f"dim must be -1 or -2, got {dim!r}")
    if A.device.type != "cpu" or A.dtype not in (torch.float64, torch.float32) or A.requires_grad:
        return (A * A).sum(dim)
    if not A.is_contiguous() and A.mT.is_contiguous():          # column-major: the same pass over its memory
        return sum_of_squares(A.mT, -3 - dim)
    a = A.detach().numpy()
    return torch.from_numpy(np.einsum("...ij,...ij->...j" if dim == -2 else "...ij,...ij->...i", a, a))


class _GaussianLogMarginal(torch.autograd.Function):
    r"""log N(y | 0, K) with the analytic gradient dlogN/dK = 1/2 (alpha alpha^T - K^{-1}).

    Autograd through a Cholesky costs about 8x the forward pass; this backward costs one
    ``cholesky_inverse`` (Rasmussen & Williams 2006, eq. 5.9).
    """

    @staticmethod
    def forward(ctx, K, y, L, ok):  # type: ignore[override]
        n = K.shape[-1]
        yb = y.expand(*K.shape[:-2], n)
        alpha = torch.cholesky_solve(yb.unsqueeze(-1), L).squeeze(-1)
        quad = (yb * alpha).sum(-1)
        val = -0.5 * quad - 0.5 * logdet_from_cholesky(L) - 0.5 * n * _LOG_2PI
        val = torch.where(ok, val, torch.full_like(val, -math.inf))
        ctx.save_for_backward(L, alpha, ok)
        ctx.y_shape = y.shape
        return val

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if torch.is_grad_enabled():  # create_graph=True: refuse rather than return a silently wrong Hessian
            raise NotImplementedError("second derivatives are not available: gpvi computes the gradient of the exact log marginal in closed form (1/2 (alpha alpha^T - K^-1)), which autograd cannot differentiate again; use finite differences of the gradient (e.g. batched central differences) for Hessians")
        L, alpha, ok = ctx.saved_tensors
        g = torch.where(ok, grad, torch.zeros_like(grad))
        grad_K = grad_y = None
        if ctx.needs_input_grad[0]:
            # 1/2 g (alpha alpha^T - K^{-1}), in two passes over the (S, N, N) buffer
            grad_K = torch.cholesky_inverse(L)
            grad_K.mul_((-0.5 * g)[..., None, None])
            grad_K.add_((0.5 * g)[..., None, None] * alpha.unsqueeze(-1) * alpha.unsqueeze(-2)) if grad_K.dim() == 2 \
                else grad_K.baddbmm_((0.5 * g)[..., None, None] * alpha.unsqueeze(-1), alpha.unsqueeze(-2))
        if ctx.needs_input_grad[1]:
            grad_y = -alpha * g[..., None]
            while grad_y.dim() > len(ctx.y_shape):
                grad_y = grad_y.sum(0)
        return grad_K, grad_y, None, None


def gaussian_log_marginal(K: torch.Tensor, y: torch.Tensor, *, jitter: float = DEFAULT_JITTER,
                          max_jitter: float = DEFAULT_MAX_JITTER, raise_on_failure: bool | None = None,
                          theta: Any = None, chol: CholeskyResult | None = None) -> torch.Tensor:
    r"""Exact Gaussian log density :math:`\log \mathcal N(y \mid 0, K)` through a Cholesky factorisation.

    .. math::

        \log \mathcal N(y \mid 0, K) = -\tfrac12 y^\top K^{-1} y - \sum_i \log L_{ii} - \tfrac N2 \log 2\pi

    Differentiable in ``K`` (and ``y``) with the closed-form gradient
    :math:`\partial/\partial K = \tfrac12(\alpha\alpha^\top - K^{-1})`, :math:`\alpha = K^{-1}y`
    (Rasmussen & Williams 2006, eq. 5.9): the backward pass costs one ``cholesky_inverse`` instead of
    autograd through the factorisation.

    Parameters
    ----------
    K : torch.Tensor of shape (N, N) or (S, N, N)
        Covariance matrices (kernel plus noise), float64 recommended.
    y : torch.Tensor of shape (N,)
        Observations.
    jitter, max_jitter, raise_on_failure, theta
        See :func:`cholesky_with_jitter`. Failed batch members get value ``-inf`` and zero gradient.
    chol : CholeskyResult, optional
        A factorisation of ``K`` already computed by :func:`cholesky_with_jitter` (then not repeated).

    Returns
    -------
    torch.Tensor of shape () or (S,)
    """
    if chol is None:
        chol = cholesky_with_jitter(K, jitter=jitter, max_jitter=max_jitter,
                                    raise_on_failure=raise_on_failure, theta=theta)
    return _GaussianLogMarginal.apply(K, y, chol.L, chol.ok)


def cholesky_update(L: torch.Tensor, x: torch.Tensor, alpha: float | torch.Tensor = 1.0) -> torch.Tensor:
    r"""Rank-one update/downdate of a Cholesky factor in O(N^2), with no Python loop.

    Returns :math:`L'` lower triangular with :math:`L' L'^\top = L L^\top + \alpha x x^\top`.

    With :math:`p = L^{-1} x`, :math:`L L^\top + \alpha x x^\top = L (I + \alpha p p^\top) L^\top` and
    the factor of :math:`I + \alpha p p^\top` is known in closed form (Gill, Golub, Murray & Saunders 1974):
    with :math:`t_0 = 1`, :math:`t_j = 1 + \alpha \sum_{k \le j} p_k^2`,

    .. math::

        \tilde L_{jj} = \sqrt{t_j / t_{j-1}}, \qquad
        \tilde L_{ij} = \alpha\, p_i\, p_j / \sqrt{t_j t_{j-1}} \quad (i > j).

    Then :math:`L' = L \tilde L`, and column :math:`j` of :math:`L\,\mathrm{tril}(p\beta^\top, -1)` is
    :math:`\beta_j \sum_{i>j} L_{:,i} p_i`: a reverse cumulative sum over columns, so the whole
    update is one triangular solve plus O(N^2) vectorised arithmetic.

    Parameters
    ----------
    L : torch.Tensor of shape (N, N) or (..., N, N)
        Lower Cholesky factor.
    x : torch.Tensor of shape (N,) or (..., N)
        Update vector.
    alpha : float or tensor
        Weight; negative for a downdate.

    Raises
    ------
    NotPSDError
        A downdate would make the matrix indefinite (some :math:`t_j \le 0`).
    """
    p = torch.linalg.solve_triangular(L, x.unsqueeze(-1), upper=False).squeeze(-1)
    alpha_t = torch.as_tensor(alpha, dtype=L.dtype, device=L.device)
    if alpha_t.dim() > 0:
        alpha_t = alpha_t.unsqueeze(-1)
    t = 1.0 + alpha_t * torch.cumsum(p * p, dim=-1)
    if bool((t <= 0).any()) or not bool(torch.isfinite(t).all()):
        raise NotPSDError("Cholesky downdate would make the matrix indefinite", jitter=0.0)
    t_prev = torch.cat([torch.ones_like(t[..., :1]), t[..., :-1]], dim=-1)
    d = torch.sqrt(t / t_prev)
    beta = alpha_t * p / torch.sqrt(t * t_prev)
    W = L * p.unsqueeze(-2)
    # S[:, j] = sum_{i >= j} W[:, i]; R[:, j] = S[:, j + 1] (exclusive), R[:, N-1] = 0
    S = torch.flip(torch.cumsum(torch.flip(W, dims=(-1,)), dim=-1), dims=(-1,))
    R = torch.zeros_like(W)
    R[..., :, :-1] = S[..., :, 1:]
    return L * d.unsqueeze(-2) + R * beta.unsqueeze(-2)


def cholesky_site_update_(U: torch.Tensor, n: int, alpha: float, *, p: torch.Tensor | None = None,
                           block: int | None = None) -> torch.Tensor:
    r"""In place: the upper factor of :math:`A + \alpha\, e_n e_n^\top` from that of :math:`A = U^\top U`. O((N-n)^2).

    A single-site CVI step changes one diagonal entry of :math:`K + S`. With :math:`L = U^\top`, only the trailing
    block :math:`L_{n:,n:}` changes, and for it the update vector is :math:`e_0`. This is the closed form of
    :func:`gpvi.linalg.cholesky_update` (Gill, Golub, Murray & Saunders 1974) with :math:`p = L_{n:,n:}^{-1}e_0`,
    :math:`t_j = 1 + \alpha\sum_{i\le j}p_i^2`, :math:`d_j = \sqrt{t_j/t_{j-1}}`,
    :math:`\beta_j = \alpha p_j/\sqrt{t_j t_{j-1}}`, written row-wise on :math:`U`:

    .. math::

        U'_{j,:} = d_j U_{j,:} + \beta_j\Big(T - \sum_{i \le j} p_i U_{i,:}\Big),\qquad T = \sum_i p_i U_{i,:},

    evaluated in blocks of ``block`` rows whose prefix sums stay in cache, touching only the upper triangle. No
    N x N temporary is allocated (the generic routine allocates several, which at N = 4000 costs more in page
    faults than the arithmetic): about 1.2 passes over the trailing block instead of about 11.

    Parameters
    ----------
    U : torch.Tensor of shape (N, N)
        Contiguous upper-triangular factor, modified in place (``U.mT`` is the lower factor :math:`L`).
    n : int
        The diagonal entry that changes.
    alpha : float
        The change of :math:`A_{nn}` (negative for a downdate).
    p : torch.Tensor of shape (N - n,), optional
        :math:`L_{n:,n:}^{-1} e_0` if already known (it is :math:`(L^{-1}e_n)_{n:}`); solved for otherwise.
    block : int, optional
        Rows per block (default: one block when ``N - n <= 256``, else ``max(64, ceil((N - n) / 16))``).

    Returns
    -------
    torch.Tensor
        ``U`` (modified in place).

    Raises
    ------
    NotPSDError
        The downdate would make :math:`A` indefinite (``U`` is left unchanged).

    Examples
    --------
    >>> import torch
    >>> A = torch.tensor([[4.0, 2.0], [2.0, 3.0]], dtype=torch.float64)
    >>> U = torch.linalg.cholesky(A).mT.contiguous()
    >>> _ = cholesky_site_update_(U, 1, 0.5)
    >>> torch.allclose(U.mT @ U, A + torch.diag(torch.tensor([0.0, 0.5], dtype=torch.float64)))
    True
    """
    M = U[n:, n:]
    k = M.shape[0]
    if p is None:
        e = torch.zeros(k, 1, dtype=U.dtype, device=U.device)
        e[0, 0] = 1.0
        p = torch.linalg.solve_triangular(M.mT, e, upper=False)[:, 0]
    t = 1.0 + alpha * torch.cumsum(p * p, 0)
    if not bool((t > 0).all()) or not bool(torch.isfinite(t).all()):
        raise NotPSDError("Cholesky downdate would make the matrix indefinite", jitter=0.0)
    tp = torch.cat([t.new_ones(1), t[:-1]])
    d = torch.sqrt(t / tp)
    beta = alpha * p / torch.sqrt(t * tp)
    T = p @ M
    b = block if block is not None else (k if k <= 256 else max(64, -(-k // 16)))
    P = torch.zeros_like(T)
    for j0 in range(0, k, b):
        j1 = min(k, j0 + b)
        blk = M[j0:j1, j0:]
        W = blk * p[j0:j1, None]
        W.cumsum_(0)
        W += P[j0:]
        P[j0:] = W[-1]
        torch.sub(T[j0:], W, out=W)
        W.mul_(beta[j0:j1, None])
        blk.mul_(d[j0:j1, None]).add_(W)
        blk[:, :j1 - j0].triu_()
    return U
