r"""The exact GP log joint and its gradient in closed form, batched over theta, for the kernels people use most.

At tens to hundreds of points an exact log marginal is microseconds of arithmetic: building :math:`K`, a Cholesky
factorisation, a solve and, for the gradient, :math:`K^{-1}`. Through GPyTorch's modules and autograd the same
evaluation costs several times that in dispatch and bookkeeping. :class:`LeanLogJoint` computes value and gradient
directly, for a batch ``theta`` of shape ``(S, D)``, with no autograd graph.

Supported models (:meth:`LeanLogJoint.from_model` returns ``None`` for anything else, which keeps the GPyTorch
path): a kernel that is one term or an ``AdditiveKernel`` of terms, each

* ``ScaleKernel(base)`` or a bare ``base``, ``base`` one of ``RBFKernel``, ``MaternKernel`` (:math:`\nu = 1/2, 3/2,
  5/2`), ``RQKernel``, with one lengthscale or one per input column (ARD), no ``active_dims``; or
* ``ConstantKernel``,

with any parameter free (in theta, through its bijection) or frozen; the noise and constant mean of
:class:`gpvi.GPRegression` (gpvi's own ``log_noise_var``, a ``GaussianLikelihood``'s constrained noise, a
``ConstantMean``); and the model's prior, whatever it is.

Maths. With :math:`r^2_{ij} = \sum_k (x_{ik} - x_{jk})^2 / \ell_k^2` (:class:`_Distances`), a term :math:`s\,\kappa(r^2)` and
:math:`K_y = \sum_t s_t \kappa_t + \sigma^2 I`, :math:`\tilde y = y - c\mathbf 1`, :math:`\alpha = K_y^{-1}\tilde y`:

.. math::

    \log \mathcal N(\tilde y \mid 0, K_y) = -\tfrac12 \tilde y^\top\alpha - \sum_i \log L_{ii} - \tfrac N2 \log 2\pi,
    \qquad G = \frac{\partial}{\partial K_y} = \tfrac12(\alpha\alpha^\top - K_y^{-1})

(Rasmussen & Williams 2006, eq. 5.9), and the chain rule: :math:`\partial/\partial\sigma^2 = \operatorname{tr} G`,
:math:`\partial/\partial c = \mathbf 1^\top\alpha`, :math:`\partial/\partial s_t = \sum_{ij} G_{ij}\kappa_{t,ij}`,

.. math::

    \frac{\partial}{\partial \ell_k} = -\frac{2 s}{\ell_k^3}\sum_{ij} G_{ij}\,\kappa'(r^2_{ij})\,(x_{ik} - x_{jk})^2,

with :math:`\kappa'= d\kappa/dr^2`: RBF :math:`\kappa = e^{-r^2/2}`, :math:`\kappa' = -\kappa/2`; Matern 1/2
:math:`e^{-r}`, :math:`\kappa' = -e^{-r}/(2r)`; Matern 3/2 :math:`(1 + \sqrt3 r)e^{-\sqrt3 r}`,
:math:`\kappa' = -\tfrac32 e^{-\sqrt3 r}`; Matern 5/2 :math:`(1 + \sqrt5 r + \tfrac53 r^2)e^{-\sqrt5 r}`,
:math:`\kappa' = -\tfrac56(1 + \sqrt5 r)e^{-\sqrt5 r}`; RQ :math:`(1 + u)^{-a}`, :math:`u = r^2/(2a)`,
:math:`\kappa' = -\tfrac12(1+u)^{-a-1}`, :math:`\partial\kappa/\partial a = \kappa\,(u/(1+u) - \log(1+u))`.
Each natural value then chains to its theta entry through the derivative of its bijection
(:class:`gpvi.models.parameters.Bijection`). The Cholesky factorisation and its jitter policy are
:func:`gpvi.linalg.cholesky_with_jitter`'s, as on the GPyTorch path; values agree with it to rounding (tests: 1e-10).

Distances, on the models' centred inputs (:mod:`gpvi.models.scaled_rbf`): for small problems (``m N^2`` up to
:data:`PRECOMPUTED_MAX_ELEMENTS`, ``m`` = 1 or the number of ARD columns) the squared differences per column are
precomputed, so a batch of :math:`r^2` and the lengthscale gradient's contraction are one matrix product each; beyond,
they are expanded as GPyTorch does, :math:`r^2_{ij} = \|x_i/\ell\|^2 + \|x_j/\ell\|^2 - 2 (x_i/\ell)^\top (x_j/\ell)`
(clamped at 0, zero diagonal), and the contraction is :math:`\sum_{ij} H_{ij}(x_{ik} - x_{jk})^2 = 2\sum_i x_{ik}^2
\sum_j H_{ij} - 2(X^\top H X)_{kk}` for symmetric :math:`H`. Memory: :attr:`LeanLogJoint.copies` ``(S, N, N)``
matrices per batch (4 for one RBF term, measured), so models use this path up to :data:`LEAN_JOINT_MAX_N` points
(beyond, the factorisation dominates and the GPyTorch or two-buffer paths keep memory lower). A model hands its
evaluator out as :attr:`gpvi.GPRegression.closed_form`: the samplers' inner loop calls it directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gpytorch
import torch

from ..linalg import cholesky_with_jitter

__all__ = ["LeanLogJoint", "LEAN_JOINT_MAX_N", "PRECOMPUTED_MAX_ELEMENTS", "lean_apply"]

LEAN_JOINT_MAX_N = 1024
"""Largest number of training points for which models take this path."""

_TERM_COPIES = {"rbf": 1, "const": 1, "m12": 4, "m32": 4, "m52": 4, "rq": 6}
"""Dense ``N x N`` matrices per theta a term holds at the peak besides K, L, G (peak RSS measured at N = 1,000:
4.0 copies for ``ScaleKernel(RBF)`` in all, 7.0 for Matern 5/2, 9.0 for RQ)."""

PRECOMPUTED_MAX_ELEMENTS = 2 ** 16
"""Largest ``m N^2`` for which squared differences are precomputed; beyond, distances are expanded (measured in
``benchmarks/small_data.py``: equal at N = 56 with 13 inputs, the expanded form 1.5x faster at N = 200)."""

_LOG_2PI = math.log(2.0 * math.pi)
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
        self._X2 = X.square()

    def r2(self, ils2: torch.Tensor) -> torch.Tensor:
        """``(S, N, N)`` from inverse squared lengthscales ``(S, m)`` (a new tensor, free to modify)."""
        S, n = ils2.shape[0], self.n
        if self.pre is not None:
            return (ils2 @ self.pre).view(S, n, n)
        Xs = self.X * ils2.sqrt().unsqueeze(-2)                                  # (S, N, d)
        sq = Xs.square().sum(-1)
        r2 = torch.baddbmm(sq.unsqueeze(-1) + sq.unsqueeze(-2), Xs, Xs.transpose(-1, -2), alpha=-2.0)
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


class LeanLogJoint:
    r"""Value and gradient of an exact GP regression's log joint for a batch of theta, in closed form.

    Built by :meth:`from_model` (see the module notes for what is supported and the maths). Every method takes
    ``theta`` of shape ``(S, D)`` (finite) and creates its tensors on the data's device and dtype.
    """

    def __init__(self, blocks: list, terms: list[_Term], X: torch.Tensor, y: torch.Tensor, noise: _Param,
                 mean: _Param | None, prior: Any, *, jitter: float, max_jitter: float) -> None:
        self.blocks, self.terms, self.y, self.noise, self.mean = blocks, terms, y, noise, mean
        self.jitter, self.max_jitter = jitter, max_jitter
        self.n = y.shape[0]
        self._floor = self.n * torch.finfo(X.dtype).eps
        self._all_log = all(b.bijection.kind == "log" for b in blocks)
        self._powers = torch.tensor([b.bijection.power for b in blocks for _ in range(b.stop - b.start)],
                                    dtype=X.dtype, device=X.device)
        widths = {t.lengthscale.width for t in terms if t.lengthscale is not None}
        self._dist = {w: _Distances(X, w > 1) for w in widths}
        self.prior = prior
        self._normal_prior = _independent_normal(prior)
        self.copies = 4 + sum(_TERM_COPIES[t.kind] for t in terms)
        self._kernel_terms = [t for t in terms if t.kind != "const"]
        self._const_terms = [t for t in terms if t.kind == "const"]
        self._single = len(self._kernel_terms) == 1 and not self._const_terms     # K may then be the term itself
        self._true = torch.ones(1, dtype=torch.bool, device=X.device)
        t0 = self._kernel_terms[0] if self._kernel_terms else None
        self._plain_rbf = bool(self._single and t0.kind == "rbf" and t0.scale is not None and mean is None
                               and t0.lengthscale.free and t0.scale.free and noise.free
                               and (t0.lengthscale.start, t0.lengthscale.stop, t0.scale.start, t0.scale.stop,
                                    noise.start, noise.stop) == (0, t0.lengthscale.width, t0.lengthscale.width,
                                                                 t0.lengthscale.width + 1, t0.lengthscale.width + 1,
                                                                 t0.lengthscale.width + 2))
        """The paper's model (one ScaleKernel(RBF), free lengthscales, signal and noise variances, in that order, no
        mean): its gradient is assembled by one concatenation."""
        """Dense ``N x N`` matrices per theta at the peak of a batched evaluation (a bound used by memory budgets)."""

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_model(cls, model: Any) -> LeanLogJoint | None:
        """The lean evaluator of a :class:`gpvi.GPRegression`, or ``None`` when its kernel is not supported."""
        kp = model.kernel_params
        blocks = {b.path: b for b in kp.blocks}
        X = model._Xc
        terms = _terms(kp.kernel, "", blocks, X.shape[1], X)
        if terms is None:
            return None
        used = {p.start for t in terms for p in (t.scale, t.lengthscale, t.alpha) if p is not None and p.free}
        if len(used) != len(kp.blocks):          # a kernel parameter the lean path does not know
            return None
        nb, mb = model._noise_block, model._mean_block
        noise = _Param(nb.start, nb.stop) if nb is not None else \
            _Param(fixed=torch.tensor([[float(model._fixed_noise)]], dtype=X.dtype, device=X.device))
        if mb is not None:
            mean = _Param(mb.start, mb.stop)
        elif model._fixed_mean is not None:
            mean = _Param(fixed=torch.tensor([[float(model._fixed_mean)]], dtype=X.dtype, device=X.device))
        else:
            mean = None
        return cls(list(model._blocks), terms, X, model.y, noise, mean, model.prior, jitter=model.jitter,
                   max_jitter=model.max_jitter)

    # ------------------------------------------------------------------ evaluation
    def natural(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Natural values ``V`` ``(S, D)`` of every theta entry and their derivatives ``dV/dtheta``."""
        if self._all_log:
            V = torch.exp(theta * self._powers)
            return V, V * self._powers
        V, dV = torch.empty_like(theta), torch.empty_like(theta)
        for b in self.blocks:
            t = theta[:, b.start:b.stop]
            V[:, b.start:b.stop] = v = b.bijection.forward(t)
            dV[:, b.start:b.stop] = b.bijection.derivative(t, v)
        return V, dV

    def log_marginal(self, theta: torch.Tensor, *, grad: bool = True, raise_on_failure: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        r""":math:`\log\mathcal N(y\mid c\mathbf 1, K_\theta + \sigma^2 I)` ``(S,)`` and its gradient ``(S, D)``.

        Members that cannot be factorised even with the largest jitter get ``-inf`` and a zero gradient (or a
        :class:`~gpvi.exceptions.NotPSDError` with ``raise_on_failure``).
        """
        return self._log_marginal(theta, grad, raise_on_failure)[:2]

    def _log_marginal(self, theta: torch.Tensor, grad: bool, raise_on_failure: bool):
        """:meth:`log_marginal` and whether every member was factorised."""
        S, n = theta.shape[0], self.n
        V, dV = self.natural(theta)
        parts, K = [], None
        for t in self._kernel_terms:
            part = self._term(t, V, grad)
            parts.append(part)
            # a single kernel term's matrix becomes K itself (it then also holds the noise)
            K = part[1] if K is None and self._single else (part[1].clone() if K is None else K + part[1])
        const = None
        for t in self._const_terms:                                              # constant kernels: added in place
            c = t.scale.value(V)                                                 # (S, 1)
            const = c if const is None else const + c
            parts.append((t, None, c, None))
        if K is None:
            K = const.unsqueeze(-1).expand(S, n, n).clone()
        elif const is not None:
            K.add_(const.unsqueeze(-1))
        sn = self.noise.value(V)                                                 # (S, 1)
        K.diagonal(dim1=-2, dim2=-1).add_(sn)
        yc = self.y.expand(S, n)
        if self.mean is not None:
            yc = yc - self.mean.value(V)
        L, ok, diag_l = self._cholesky(K, theta, raise_on_failure)
        alpha = torch.cholesky_solve(yc.unsqueeze(-1), L).squeeze(-1)           # (S, N)
        val = -0.5 * torch.linalg.vecdot(yc, alpha) - torch.log(diag_l).sum(-1) - 0.5 * n * _LOG_2PI
        all_ok = ok is self._true or bool(ok.all())
        if not all_ok:
            val = torch.where(ok, val, torch.full_like(val, -math.inf))
        if not grad:
            return val, None, all_ok
        G = torch.cholesky_inverse(L).mul_(-0.5)
        G.baddbmm_(alpha.unsqueeze(-1), alpha.unsqueeze(-2), alpha=0.5)       # G = (alpha alpha^T - K^-1) / 2
        tr = G.diagonal(dim1=-2, dim2=-1).sum(-1, keepdim=True)
        if self._plain_rbf:                  # theta = [lengthscales, signal variance, noise]: one concatenation
            t, sk, s, extra = parts[0]
            GK = G * sk                                                           # sk is K: its diagonal holds sn
            ls = extra[0]
            gn = torch.cat([self._dist[ls.shape[-1]].contract(GK) / ls.pow(3),
                            (GK.sum((-1, -2)).unsqueeze(-1) - tr * sn) / s, tr], -1)
            g = gn * dV
            return val, (g if all_ok else torch.where(ok[:, None], g, torch.zeros_like(g))), all_ok
        gn = torch.zeros_like(theta)                                             # gradient in the natural values
        if self.noise.free:
            gn[:, self.noise.start:self.noise.stop] = tr
        if self.mean is not None and self.mean.free:
            gn[:, self.mean.start:self.mean.stop] = alpha.sum(-1, keepdim=True)
        for t, sk, s, extra in parts:
            if t.kind == "const":
                if t.scale.free:
                    gn[:, t.scale.start:t.scale.stop] += G.sum((-1, -2)).unsqueeze(-1)
                continue
            ls = extra[0]
            if t.kind == "rbf":
                GK = G * sk                                                       # G o (s kappa)
                if t.scale is not None and t.scale.free:
                    tot = GK.sum((-1, -2)).unsqueeze(-1)
                    if sk is K:                                                   # K's diagonal also holds the noise
                        tot = tot - tr * sn
                    gn[:, t.scale.start:t.scale.stop] += tot / s
                if t.lengthscale.free:                                            # s kappa' = -s kappa / 2
                    gn[:, t.lengthscale.start:t.lengthscale.stop] += \
                        self._dist[ls.shape[-1]].contract(GK) / ls.pow(3)
                continue
            k, kp, ka, a = extra[1:]
            # (K may be this term's s k, never k itself when a scale is free: its gradient reads k and kappa')
            if t.scale is not None and t.scale.free:
                gn[:, t.scale.start:t.scale.stop] += (G * k).sum((-1, -2)).unsqueeze(-1)
            Gs = G if s is None else G * s.unsqueeze(-1)
            if t.lengthscale.free:                                                # d r^2 / d l_k = -2 D_k / l_k^3
                gn[:, t.lengthscale.start:t.lengthscale.stop] += \
                    -2.0 * self._dist[ls.shape[-1]].contract(Gs * kp) / ls.pow(3)
            if t.alpha is not None and t.alpha.free:
                gn[:, t.alpha.start:t.alpha.stop] += (Gs * ka).sum((-1, -2)).unsqueeze(-1)
        g = gn * dV
        if not all_ok:
            g = torch.where(ok[:, None], g, torch.zeros_like(g))
        return val, g, all_ok

    def _term(self, t: _Term, V: torch.Tensor, grad: bool):
        """``(term, s kappa (S, N, N), s (S, 1) or None, what the gradient needs)`` for a kernel (non-constant)
        term."""
        s = t.scale.value(V) if t.scale is not None else None                   # (S, 1)
        ls = t.lengthscale.value(V)                                              # (S, m), m = 1 or d
        r2 = self._dist[ls.shape[-1]].r2(ls.pow(-2))
        if t.kind == "rbf":                                                      # s exp(-r^2/2), in place
            sk = r2.mul_(-0.5).exp_()
            if s is not None:
                sk.mul_(s.unsqueeze(-1))
            return t, sk, s, (ls,)
        a = t.alpha.value(V).unsqueeze(-1) if t.alpha is not None else None
        k, kp, ka = _kappa(t.kind, r2, a, grad)
        return t, (k if s is None else s.unsqueeze(-1) * k), s, (ls, k, kp, ka, a)

    def _cholesky(self, K: torch.Tensor, theta: torch.Tensor, raise_on_failure: bool):
        """``(L, ok, diag L)``: LAPACK first; :func:`gpvi.linalg.cholesky_with_jitter` (same acceptance rule: no pivot
        below ``N eps mean(diag K)``; jitter retries; warnings) only when a member fails it. The kernels here are
        stationary, so every diagonal entry of K equals its mean, ``K[:, 0, 0]``."""
        L, info = torch.linalg.cholesky_ex(K)
        dl = L.diagonal(dim1=-2, dim2=-1)
        if K.shape[0] == 1:                          # a sampler's single theta: three numbers, no tensor algebra
            dmin = float(dl.min())
            good = int(info) == 0 and dmin * dmin > self._floor * float(K[0, 0, 0])     # NaN: False
            if good:
                return L, self._true, dl
        else:
            dmin = dl.amin(-1)
            ok = (info == 0) & (dmin * dmin > self._floor * K[:, 0, 0])                 # NaN: False
            if bool(ok.all()):
                return L, ok, dl
        chol = cholesky_with_jitter(K, jitter=self.jitter, max_jitter=self.max_jitter,
                                    raise_on_failure=raise_on_failure, theta=theta.detach())
        return chol.L, chol.ok, chol.L.diagonal(dim1=-2, dim2=-1)

    def log_prior(self, theta: torch.Tensor, *, grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``log p(theta)`` ``(S,)`` and its gradient ``(S, D)`` (closed form for an independent normal prior)."""
        if self._normal_prior is not None:
            loc, var, const = self._normal_prior
            z = theta - loc
            val = const - 0.5 * (z * z / var).sum(-1)
            return val, (-z / var if grad else None)
        if not grad:
            from .priors import prior_log_prob
            with torch.no_grad():
                return prior_log_prob(self.prior, theta), None
        if callable(getattr(self.prior, "log_prob_and_grad", None)):       # ModelPrior: closed form per term
            return self.prior.log_prob_and_grad(theta)
        from .priors import prior_log_prob
        with torch.enable_grad():
            t = theta.detach().requires_grad_(True)
            lp = prior_log_prob(self.prior, t)
            (g,) = torch.autograd.grad(lp.sum(), t, allow_unused=True)
        return lp.detach(), (torch.zeros_like(theta) if g is None else g)

    def log_joint(self, theta: torch.Tensor, *, grad: bool = True, raise_on_failure: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log joint ``(S,)`` and gradient ``(S, D)``: :meth:`log_marginal` plus :meth:`log_prior`."""
        v, g, all_ok = self._log_marginal(theta, grad, raise_on_failure)
        pv, pg = self.log_prior(theta, grad=grad)
        if g is None:
            return v + pv, None
        return v + pv, (g + pg if all_ok else torch.where(torch.isfinite(v)[:, None], g + pg, torch.zeros_like(g)))


# ---------------------------------------------------------------------- helpers
def _independent_normal(prior: Any) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """``(loc, var, log normaliser)`` of an ``Independent(Normal)`` over all of theta (gpvi's default), else None."""
    if type(prior) is not torch.distributions.Independent or type(prior.base_dist) is not torch.distributions.Normal:
        return None
    if prior.reinterpreted_batch_ndims != 1 or prior.base_dist.loc.dim() != 1:
        return None
    loc, scale = prior.base_dist.loc.detach(), prior.base_dist.scale.detach()
    const = float(-torch.log(scale).sum() - 0.5 * loc.numel() * _LOG_2PI)
    return loc, scale * scale, const


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


class _LeanFunction(torch.autograd.Function):
    """One autograd node: the forward computes value and closed-form gradient, the backward only scales it."""

    @staticmethod
    def forward(ctx, theta, lean, prior, strict):  # type: ignore[override]
        fn = lean.log_joint if prior else lean.log_marginal
        v, g = fn(theta.detach(), grad=bool(ctx.needs_input_grad[0]), raise_on_failure=strict)[:2]
        ctx.g = g
        return v

    @staticmethod
    def backward(ctx, gv):  # type: ignore[override]
        if torch.is_grad_enabled():  # create_graph=True: refuse rather than return a silently wrong Hessian
            raise NotImplementedError("second derivatives are not available: gpvi computes the gradient of the exact "
                                      "log marginal in closed form (gpvi.models.lean_joint), which autograd cannot "
                                      "differentiate again; use finite differences of the gradient for Hessians")
        return gv.unsqueeze(-1) * ctx.g, None, None, None


def lean_apply(lean: LeanLogJoint, theta: torch.Tensor, *, prior: bool) -> torch.Tensor:
    """The log joint (``prior``) or log marginal of ``theta`` ``(D,)`` or ``(S, D)`` through one autograd node.

    A single theta that cannot be factorised raises :class:`~gpvi.exceptions.NotPSDError`; batch members get
    ``-inf`` with a zero gradient (the GPyTorch path's rule).
    """
    single = theta.dim() == 1
    th = theta.unsqueeze(0) if single else theta
    v = _LeanFunction.apply(th, lean, prior, single)
    return v[0] if single else v
