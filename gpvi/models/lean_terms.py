r"""The kernel terms and squared distances of the closed-form log joint (:mod:`gpvi.models.lean_joint`).

A supported kernel is read into a list of :class:`_Term` (one per summand: kind, scale, lengthscale, RQ's alpha, each
a :class:`_Param`: columns of theta or a fixed value); :class:`_Distances` gives :math:`r^2` and the lengthscale
gradient's contraction; :func:`_kappa` the non-RBF profiles and their derivatives (formulas in
:mod:`gpvi.models.lean_joint`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gpytorch
import torch

__all__ = ["PRECOMPUTED_MAX_ELEMENTS"]

PRECOMPUTED_MAX_ELEMENTS = 2 ** 16
"""Largest ``m N^2`` for which squared differences are precomputed; beyond, distances are expanded (measured in
``benchmarks/small_data.py``: equal at N = 56 with 13 inputs, the expanded form 1.5x faster at N = 200)."""


_SQRT3, _SQRT5 = math.sqrt(3.0), math.sqrt(5.0)


@dataclass
class _Param:
    """One natural parameter vector: columns ``start:stop`` of the natural values, or a fixed ``(1, n)`` value."""

    start: int | None = None
    stop: int | None = None
    fixed: torch.Tensor | None = None

    def value(self, V: torch.Tensor) -> torch.Tensor:
        """``(S, n)`` from the natural values ``V`` ``(S, D)``."""
        return self.fixed.expand(V.shape[0], -1) if self.start is None else V[:, self.start:self.stop]

    @property
    def free(self) -> bool:
        return self.start is not None

    @property
    def width(self) -> int:
        return self.stop - self.start if self.start is not None else self.fixed.shape[-1]


@dataclass
class _Term:
    kind: str                         # "rbf", "m12", "m32", "m52", "rq", "const"
    scale: _Param | None              # ScaleKernel's outputscale (None: 1), or ConstantKernel's constant
    lengthscale: _Param | None        # width 1 (isotropic) or d (ARD)
    alpha: _Param | None = None       # RQ only


class _Distances:
    r"""Squared scaled distances :math:`r^2 = \sum_k D_k / \ell_k^2` (:math:`D_k` the squared differences in column
    k) and the contraction :math:`\sum_{ij} H_{ij} D_{k,ij}` the lengthscale gradient needs.

    Small problems precompute :math:`D` (``m N^2`` numbers: each is then one matrix product); larger ones expand
    :math:`\|x_i\|^2 + \|x_j\|^2 - 2x_i^\top x_j` as GPyTorch does (clamped at 0, zero diagonal) and contract with
    :math:`2\sum_i x_{ik}^2 \sum_j H_{ij} - 2(X^\top H X)_{kk}` (H symmetric).
    """

    def __init__(self, X: torch.Tensor, ard: bool) -> None:
        n, d = X.shape
        self.X, self.n, self.ard = X, n, ard
        m = d if ard else 1
        self.pre = None
        if m * n * n <= PRECOMPUTED_MAX_ELEMENTS:
            diff2 = (X.unsqueeze(1) - X.unsqueeze(0)).square_().reshape(n * n, d)
            self.pre = (diff2 if ard else diff2.sum(-1, keepdim=True)).T.contiguous()     # (m, N^2)
            self._preT = self.pre.T
            self._pre_half = -0.5 * self.pre                # exact: -r^2/2 is then one product, no rounding added
        self._X2 = X.square()

    def neg_half_r2(self, ils2: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``-r^2 / 2`` ``(S, N, N)`` (what the RBF exponentiates): a new tensor, or written into ``out`` (a
        contiguous ``(S, N, N)`` buffer), with the same bits."""
        if self.pre is not None:
            if out is None:
                return (ils2 @ self._pre_half).view(ils2.shape[0], self.n, self.n)
            return torch.matmul(ils2, self._pre_half, out=out.view(ils2.shape[0], -1)).view_as(out)
        return self.r2(ils2, out).mul_(-0.5)

    def r2(self, ils2: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``(S, N, N)`` from inverse squared lengthscales ``(S, m)`` (a new tensor, free to modify, or, with expanded
        distances, ``out``)."""
        S, n = ils2.shape[0], self.n
        if self.pre is not None:
            return (ils2 @ self.pre).view(S, n, n)
        Xs = self.X * ils2.sqrt().unsqueeze(-2)                                  # (S, N, d)
        sq = Xs.square().sum(-1)
        if out is None:
            r2 = torch.baddbmm(sq.unsqueeze(-1) + sq.unsqueeze(-2), Xs, Xs.transpose(-1, -2), alpha=-2.0)
        else:
            r2 = torch.add(sq.unsqueeze(-1), sq.unsqueeze(-2), out=out).baddbmm_(Xs, Xs.transpose(-1, -2), alpha=-2.0)
        r2.clamp_min_(0.0).diagonal(dim1=-2, dim2=-1).zero_()
        return r2

    def contract(self, H: torch.Tensor) -> torch.Tensor:
        r"""``(S, m)``: :math:`\sum_{ij} H_{ij} D_{k,ij}` for ``H`` ``(S, N, N)`` symmetric."""
        S = H.shape[0]
        if self.pre is not None:
            return H.reshape(S, -1) @ self._preT
        out = 2.0 * (H.sum(-1) @ self._X2) - 2.0 * (self.X * torch.matmul(H, self.X)).sum(-2)   # (S, d)
        return out if self.ard else out.sum(-1, keepdim=True)


def _kappa(kind: str, r2: torch.Tensor, a: torch.Tensor | None, need_grad: bool):
    """``kappa(r2)``, ``d kappa / d r2`` and (RQ) ``d kappa / d a`` for the non-RBF kinds (``a`` broadcasts)."""
    if kind == "rq":
        u = r2 / (2.0 * a)
        lu = torch.log1p(u)
        k = torch.exp(-a * lu)
        if not need_grad:
            return k, None, None
        return k, -0.5 * k / (1.0 + u), k * (u / (1.0 + u) - lu)
    r = r2.sqrt()
    if kind == "m12":
        e = torch.exp(-r)
        if not need_grad:
            return e, None, None
        return e, torch.where(r > 0, -0.5 * e / torch.where(r > 0, r, 1.0), torch.zeros_like(r)), None
    if kind == "m32":
        e = torch.exp(-_SQRT3 * r)
        return (1.0 + _SQRT3 * r) * e, (-1.5 * e if need_grad else None), None
    e = torch.exp(-_SQRT5 * r)                                  # m52
    k = (1.0 + _SQRT5 * r + (5.0 / 3.0) * r2) * e
    return k, (-(5.0 / 6.0) * (1.0 + _SQRT5 * r) * e if need_grad else None), None


_BASES = {gpytorch.kernels.RBFKernel: "rbf", gpytorch.kernels.RQKernel: "rq"}
_MATERN = {0.5: "m12", 1.5: "m32", 2.5: "m52"}


def _param(module: torch.nn.Module, prefix: str, raw: str, natural: str, blocks: dict, X: torch.Tensor) -> _Param:
    b = blocks.get(prefix + raw)
    if b is not None:
        return _Param(b.start, b.stop)
    return _Param(fixed=getattr(module, natural).detach().to(dtype=X.dtype, device=X.device).reshape(1, -1))


def _terms(k: gpytorch.kernels.Kernel, prefix: str, blocks: dict, d: int, X: torch.Tensor) -> list[_Term] | None:
    """The kernel as a list of supported terms, or None."""
    if getattr(k, "active_dims", None) is not None:
        return None
    t = type(k)
    if t is gpytorch.kernels.AdditiveKernel:
        out: list[_Term] = []
        for i, sub in enumerate(k.kernels):
            part = _terms(sub, f"{prefix}kernels.{i}.", blocks, d, X)
            if part is None:
                return None
            out += part
        return out
    if t is gpytorch.kernels.ConstantKernel:
        return [_Term("const", _param(k, prefix, "raw_constant", "constant", blocks, X), None)]
    scale = None
    base, bprefix = k, prefix
    if t is gpytorch.kernels.ScaleKernel:
        scale = _param(k, prefix, "raw_outputscale", "outputscale", blocks, X)
        base, bprefix = k.base_kernel, prefix + "base_kernel."
        if base.active_dims is not None:
            return None
    bt = type(base)
    kind = _MATERN.get(float(base.nu)) if bt is gpytorch.kernels.MaternKernel else _BASES.get(bt)
    if kind is None:
        return None
    ls = _param(base, bprefix, "raw_lengthscale", "lengthscale", blocks, X)
    if ls.width not in (1, d):
        return None
    alpha = _param(base, bprefix, "raw_alpha", "alpha", blocks, X) if kind == "rq" else None
    return [_Term(kind, scale, ls, alpha)]
