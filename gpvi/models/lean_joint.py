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

Maths. With :math:`r^2_{ij} = \sum_k (x_{ik} - x_{jk})^2 / \ell_k^2` (:class:`gpvi.models.lean_terms._Distances`), a term :math:`s\,\kappa(r^2)` and
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
:math:`K^{-1}` and :math:`\alpha`: up to :data:`TRIANGULAR_MAX_N` points (and a batch of up to
:data:`TRIANGULAR_MAX_BATCH`) one triangular solve against :math:`[I \mid
\tilde y]` and one product (:meth:`LeanLogJoint._solve`), beyond, LAPACK's ``potri`` and ``potrs``. For gpvi's default
model (log hyperparameters, one ``ScaleKernel(RBF)``, no mean) the gradient is chained to theta directly,
:math:`\partial/\partial\theta = p\,v\,\partial/\partial v` for :math:`v = e^{p\theta}`, and a normal prior is added in
the same pass: fewer tensor operations, which is what a call costs at tens of points.

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
import threading
from typing import Any

import torch

from ..linalg import cholesky_with_jitter
from .lean_terms import PRECOMPUTED_MAX_ELEMENTS, _Distances, _kappa, _Param, _Term, _terms

__all__ = ["LeanLogJoint", "LEAN_JOINT_MAX_N", "PRECOMPUTED_MAX_ELEMENTS", "TRIANGULAR_MAX_N", "TRIANGULAR_MAX_BATCH",
           "CHUNK_BYTES", "WORKSPACE_MAX_BYTES", "WORKSPACE_MIN_BYTES", "lean_apply"]

LEAN_JOINT_MAX_N = 1024
"""Largest number of training points for which models take this path."""

_TERM_COPIES = {"rbf": 1, "const": 1, "m12": 4, "m32": 4, "m52": 4, "rq": 6}
"""Dense ``N x N`` matrices per theta a term holds at the peak besides K, L, G (peak RSS measured at N = 1,000:
4.0 copies for ``ScaleKernel(RBF)`` in all, 7.0 for Matern 5/2, 9.0 for RQ)."""

TRIANGULAR_MAX_N = 64
r"""Largest number of points for which :math:`K^{-1}` and :math:`\alpha` come from one triangular solve against
:math:`[I \mid y]` and one product (faster there than ``cholesky_inverse`` + ``cholesky_solve``; measured in
``benchmarks/results/small_data_lean_ops.md``); beyond, LAPACK's ``potri``."""

TRIANGULAR_MAX_BATCH = 64
"""Largest batch that takes the triangular route (a sampler's chains; the kept right-hand side and the two extra
``N x N`` matrices per theta it needs then stay below 7 MB); larger batches (importance sampling, DSVI draws) take
``potri``, within :attr:`LeanLogJoint.copies`."""

CHUNK_BYTES = 1 << 22
r"""On the CPU, beyond :data:`TRIANGULAR_MAX_N` points and with expanded distances, the log marginal of a batch is
evaluated in chunks of at most this many bytes of one ``(S, N, N)`` matrix (at least one theta a chunk): larger
batches left the processor's caches and cost more per theta, not less
(``benchmarks/studies/results/lean_workspace.md``). Each theta's value is the same bit for bit whatever the chunk
(tested); its gradient is the same to rounding (tested to 1e-12): the lengthscale contraction's matrix products
are blocked by the number of rows, so a chunked batch's gradient can differ from a one-pass batch's in the last
bits. Precomputed distances contract the gradient as one product over the whole batch: those models are not
chunked, nor is the prior."""

WORKSPACE_MAX_BYTES = 1 << 26
r"""Largest size of the three ``(S, N, N)`` buffers (:math:`K`, its factor :math:`L` and :math:`G`) kept between
calls, one set per thread, on the CPU (:func:`_buffers`); larger batches allocate afresh."""

WORKSPACE_MIN_BYTES = 1 << 20
"""Smallest ``(S, N, N)`` matrix of a batch (one of the three) for which the buffers are used: below it fresh
matrices come from the heap without page faults, and a steady loop of calls measured the buffers 9-22 % slower at
N = 14 and 56 (section ``small`` of ``benchmarks/studies/results/lean_workspace.md``)."""

_LOG_2PI = math.log(2.0 * math.pi)
_WORKSPACE = threading.local()


def _buffers(S: int, n: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(K, L, G)`` ``(S, N, N)`` buffers, reused across calls (one set per thread, CPU only, at most
    :data:`WORKSPACE_MAX_BYTES` kept, for matrices of at least :data:`WORKSPACE_MIN_BYTES`), or None. K is
    row-major; L and G are column-major, as LAPACK writes them, so ``cholesky_ex`` and ``cholesky_inverse`` fill
    them in place with the same bits as a fresh result. From about 200 points, N x N matrices allocated afresh at
    every call can cost page faults, as the heap is returned to the system and taken back (measured in
    ``benchmarks/studies/results/lean_workspace.md``); callers never return views of these buffers."""
    numel = S * n * n
    size = numel * like.element_size()
    if like.device.type != "cpu" or not WORKSPACE_MIN_BYTES <= size <= WORKSPACE_MAX_BYTES // 3 or \
            (like.requires_grad and torch.is_grad_enabled()):           # out= takes no part in autograd
        return None
    buf = getattr(_WORKSPACE, "buf", None)
    if buf is None or buf.dtype != like.dtype or buf.shape[1] < numel:
        buf = _WORKSPACE.buf = torch.empty(3, numel, dtype=like.dtype, device=like.device)
    return (buf[0, :numel].view(S, n, n), buf[1, :numel].view(S, n, n).mT, buf[2, :numel].view(S, n, n).mT)


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
        """Dense ``N x N`` matrices per theta at the peak of a batched evaluation (a bound used by memory budgets)."""
        self._kernel_terms = [t for t in terms if t.kind != "const"]
        self._const_terms = [t for t in terms if t.kind == "const"]
        self._single = len(self._kernel_terms) == 1 and not self._const_terms     # K may then be the term itself
        self._true = torch.ones(1, dtype=torch.bool, device=X.device)
        self._cpu = X.device.type == "cpu"
        expanded = all(d.pre is None for d in self._dist.values())
        self._chunk = max(1, CHUNK_BYTES // (self.n * self.n * X.element_size())) \
            if self._cpu and self.n > TRIANGULAR_MAX_N and expanded else None
        """Largest batch of the log marginal evaluated in one pass (:data:`CHUNK_BYTES`); None: any."""
        self._buffered_from = -(-WORKSPACE_MIN_BYTES // (self.n * self.n * X.element_size()))
        """Smallest batch that may use the kept buffers (:data:`WORKSPACE_MIN_BYTES`)."""
        self._rhs: dict[int, torch.Tensor] = {}                                  # [I | y] per batch size
        t0 = self._kernel_terms[0] if self._kernel_terms else None
        m = t0.lengthscale.width if t0 is not None and t0.lengthscale is not None else 0
        self._plain_rbf = bool(self._single and self._all_log and t0.kind == "rbf" and t0.scale is not None
                               and mean is None and t0.lengthscale.free and t0.scale.free and noise.free
                               and (t0.lengthscale.start, t0.scale.start, noise.start, noise.stop) == (0, m, m + 1, m + 2)
                               and self._powers.shape[0] == m + 2)
        """The paper's model (one ScaleKernel(RBF), free log lengthscales, signal and noise variances, in that order,
        no mean): :meth:`_plain_log_marginal`, fewer tensor operations."""

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
        return cls(list(model._blocks), terms, X, model._y, noise, mean, model.prior, jitter=model.jitter,
                   max_jitter=model.max_jitter)

    # ------------------------------------------------------------------ evaluation
    def _mask_failed(self, val: torch.Tensor, ok: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """``(val with -inf where the factorisation failed, whether none failed)``."""
        all_ok = ok is self._true or bool(ok.all())
        return (val if all_ok else torch.where(ok, val, torch.full_like(val, -math.inf))), all_ok

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

    def _kept_buffers(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The kept buffers for this batch (:func:`_buffers`), or None; small batches skip the call."""
        S = theta.shape[0]
        return _buffers(S, self.n, theta) if S >= self._buffered_from else None

    def _chunked(self, fn, theta: torch.Tensor, *args):
        """``fn(chunk, *args)`` ``-> (value, gradient or None, all ok)`` over chunks of :attr:`_chunk` thetas."""
        parts = [fn(t, *args) for t in theta.split(self._chunk)]
        g = torch.cat([p[1] for p in parts]) if parts[0][1] is not None else None
        return torch.cat([p[0] for p in parts]), g, all(p[2] for p in parts)

    def _log_marginal(self, theta: torch.Tensor, grad: bool, raise_on_failure: bool):
        """:meth:`log_marginal` and whether every member was factorised."""
        if self._chunk is not None and theta.shape[0] > self._chunk:
            return self._chunked(self._log_marginal, theta, grad, raise_on_failure)
        if self._plain_rbf:
            return self._plain_log_marginal(theta, grad, raise_on_failure)
        S, n = theta.shape[0], self.n
        V, dV = self.natural(theta)
        parts, K = [], None
        for t in self._kernel_terms:
            part = self._term(t, V, grad)
            parts.append(part)
            # K is the first term's matrix itself until a sum replaces it (a single term's then also holds the noise)
            K = part[1] if K is None else K + part[1]
        const = None
        for t in self._const_terms:                                              # constant kernels
            c = t.scale.value(V)                                                 # (S, 1)
            const = c if const is None else const + c
            parts.append((t, None, c, None))
        if K is None:
            K = const.unsqueeze(-1).expand(S, n, n).clone()
        elif const is not None:
            K = K + const.unsqueeze(-1)
        sn = self.noise.value(V)                                                 # (S, 1)
        K.diagonal(dim1=-2, dim2=-1).add_(sn)
        yc = self.y.expand(S, n)
        if self.mean is not None:
            yc = yc - self.mean.value(V)
        bufs = self._kept_buffers(theta)
        L, ok, diag_l = self._cholesky(K, theta, raise_on_failure, bufs)
        quad, alpha, G = self._solve(L, yc, grad, bufs)
        val = -0.5 * quad - torch.log(diag_l).sum(-1) - 0.5 * n * _LOG_2PI
        val, all_ok = self._mask_failed(val, ok)
        if not grad:
            return val, None, all_ok
        tr = G.diagonal(dim1=-2, dim2=-1).sum(-1, keepdim=True)
        pieces = []                                            # (first column, gradient in those natural values)
        if self.noise.free:
            pieces.append((self.noise.start, tr))
        if self.mean is not None and self.mean.free:
            pieces.append((self.mean.start, alpha.sum(-1, keepdim=True)))
        for t, sk, s, extra in parts:
            if t.kind == "const":
                if t.scale.free:
                    pieces.append((t.scale.start, G.sum((-1, -2)).unsqueeze(-1)))
                continue
            ls = extra[0]
            if t.kind == "rbf":
                GK = G * sk                                                       # G o (s kappa)
                if t.scale is not None and t.scale.free:
                    tot = GK.sum((-1, -2)).unsqueeze(-1)
                    if sk is K:                                                   # K's diagonal also holds the noise
                        tot = tot - tr * sn
                    pieces.append((t.scale.start, tot / s))
                if t.lengthscale.free:                                            # s kappa' = -s kappa / 2
                    pieces.append((t.lengthscale.start, self._dist[ls.shape[-1]].contract(GK) / ls.pow(3)))
                continue
            k, kp, ka, a = extra[1:]
            # (K may be this term's s k, never k itself when a scale is free: its gradient reads k and kappa')
            if t.scale is not None and t.scale.free:
                pieces.append((t.scale.start, (G * k).sum((-1, -2)).unsqueeze(-1)))
            Gs = G if s is None else G * s.unsqueeze(-1)
            if t.lengthscale.free:                                                # d r^2 / d l_k = -2 D_k / l_k^3
                pieces.append((t.lengthscale.start, -2.0 * self._dist[ls.shape[-1]].contract(Gs * kp) / ls.pow(3)))
            if t.alpha is not None and t.alpha.free:
                pieces.append((t.alpha.start, (Gs * ka).sum((-1, -2)).unsqueeze(-1)))
        pieces.sort(key=lambda p: p[0])
        if sum(p[1].shape[-1] for p in pieces) == theta.shape[-1]:             # every column: one concatenation
            gn = torch.cat([p[1] for p in pieces], -1)
        else:
            gn = torch.zeros_like(theta)
            for start, p in pieces:
                gn[:, start:start + p.shape[-1]] = p
        g = gn * dV
        if not all_ok:
            g = torch.where(ok[:, None], g, torch.zeros_like(g))
        return val, g, all_ok

    def _plain_log_marginal(self, theta: torch.Tensor, grad: bool, raise_on_failure: bool, prior: bool = False):
        r""":meth:`_log_marginal` for the paper's model, theta = log natural values over ``powers`` (``_plain_rbf``),
        with the gradient chained to theta directly: :math:`\partial/\partial\theta = p\,v\,\partial/\partial v`
        for :math:`v = e^{p\theta}`, so :math:`\ell_k^{-3}` and :math:`1/s` cancel against :math:`v`. ``prior``: the
        independent normal prior is included (the log joint in one pass)."""
        if self._chunk is not None and theta.shape[0] > self._chunk:
            return self._chunked(self._plain_log_marginal, theta, grad, raise_on_failure, prior)
        S, n, m = theta.shape[0], self.n, self._powers.shape[0] - 2
        V = torch.exp(theta * self._powers)
        ils2 = V[:, :m].pow(-2)
        bufs = self._kept_buffers(theta)
        K = self._dist[m].neg_half_r2(ils2, None if bufs is None else bufs[0])
        K.exp_().mul_(V[:, m:m + 1, None])                                       # s exp(-r^2 / 2)
        sn = V[:, m + 1:]
        K.diagonal(dim1=-2, dim2=-1).add_(sn)                                    # K's diagonal also holds the noise
        L, ok, diag_l = self._cholesky(K, theta, raise_on_failure, bufs)
        quad, _, G = self._solve(L, self.y.expand(S, n), grad, bufs)
        if prior:
            loc, nivar, const = self._normal_prior
            z = theta - loc
            pg = z * nivar                                                        # -z / var
            quad = quad - torch.linalg.vecdot(z, pg)
        val = torch.add(torch.log(diag_l).sum(-1), quad, alpha=0.5).neg_().add_(self._val_const(prior))
        val, all_ok = self._mask_failed(val, ok)
        if not grad:
            return val, None, all_ok
        tr = G.diagonal(dim1=-2, dim2=-1).sum(-1, keepdim=True)
        GK = G.mul_(K)                                                            # G o K
        trsn = tr * sn
        gl = torch.cat([self._dist[m].contract(GK).mul_(ils2), GK.sum((-1, -2)).unsqueeze(-1).sub_(trsn), trsn], -1)
        g = torch.addcmul(pg, gl, self._powers) if prior else gl.mul_(self._powers)
        if not all_ok:
            g = torch.where(ok[:, None], g, torch.zeros_like(g))
        return val, g, all_ok

    def _val_const(self, prior: bool) -> float:
        c = -0.5 * self.n * _LOG_2PI
        return c + self._normal_prior[2] if prior else c

    def _solve(self, L: torch.Tensor, yc: torch.Tensor, grad: bool, bufs: tuple | None = None):
        r"""``(quad, alpha, G)``: :math:`\tilde y^\top K^{-1}\tilde y` ``(S,)`` and, with ``grad``,
        :math:`\alpha = K^{-1}\tilde y` ``(S, N)`` and :math:`G = \tfrac12(\alpha\alpha^\top - K^{-1})` ``(S, N, N)``.

        Up to :data:`TRIANGULAR_MAX_N` points and :data:`TRIANGULAR_MAX_BATCH` thetas, one triangular solve :math:`[W \mid \beta] = L^{-1}[I \mid \tilde y]`
        and one product :math:`[W \mid \beta]^\top[W \mid \beta] = \begin{pmatrix} K^{-1} & \alpha \\ \alpha^\top &
        \text{quad} \end{pmatrix}` (at these sizes cheaper than LAPACK's ``potri`` and a separate solve); beyond,
        ``cholesky_solve`` and ``cholesky_inverse`` (into ``bufs[2]`` when given: :func:`_buffers`). The
        right-hand side :math:`[I \mid y]` is kept per batch size."""
        S, n = L.shape[0], self.n
        if n > TRIANGULAR_MAX_N or S > TRIANGULAR_MAX_BATCH:
            alpha = torch.cholesky_solve(yc.unsqueeze(-1), L).squeeze(-1)       # (S, N)
            quad = torch.linalg.vecdot(yc, alpha)
            if not grad:
                return quad, None, None
            G = (torch.cholesky_inverse(L) if bufs is None else torch.cholesky_inverse(L, out=bufs[2])).mul_(-0.5)
            return quad, alpha, G.baddbmm_(alpha.unsqueeze(-1), alpha.unsqueeze(-2), alpha=0.5)
        if not grad:
            beta = torch.linalg.solve_triangular(L, yc.unsqueeze(-1), upper=False).squeeze(-1)
            return torch.linalg.vecdot(beta, beta), None, None
        B = self._rhs.get(S)
        if B is None:
            eye = torch.eye(n, dtype=L.dtype, device=L.device).expand(S, n, n)
            self._rhs[S] = B = torch.cat([eye, self.y.unsqueeze(-1).expand(S, n, 1)], -1)
        if self.mean is not None:
            B[:, :, n].copy_(yc)
        WB = torch.linalg.solve_triangular(L, B, upper=False)
        P = torch.bmm(WB.mT, WB)
        a = P[:, :n, n:]
        G = torch.baddbmm(P[:, :n, :n], a, a.mT, beta=-0.5, alpha=0.5)
        return P[:, n, n], P[:, :n, n], G

    def _term(self, t: _Term, V: torch.Tensor, grad: bool):
        """``(term, s kappa (S, N, N), s (S, 1) or None, what the gradient needs)`` for a kernel (non-constant)
        term."""
        s = t.scale.value(V) if t.scale is not None else None                   # (S, 1)
        ls = t.lengthscale.value(V)                                              # (S, m), m = 1 or d
        if t.kind == "rbf":                                                      # s exp(-r^2/2), in place
            sk = self._dist[ls.shape[-1]].neg_half_r2(ls.pow(-2)).exp_()
            if s is not None:
                sk.mul_(s.unsqueeze(-1))
            return t, sk, s, (ls,)
        a = t.alpha.value(V).unsqueeze(-1) if t.alpha is not None else None
        k, kp, ka = _kappa(t.kind, self._dist[ls.shape[-1]].r2(ls.pow(-2)), a, grad)
        return t, (k if s is None else s.unsqueeze(-1) * k), s, (ls, k, kp, ka, a)

    def _cholesky(self, K: torch.Tensor, theta: torch.Tensor, raise_on_failure: bool, bufs: tuple | None = None):
        """``(L, ok, diag L)``: LAPACK first (into ``bufs[1]`` when given: :func:`_buffers`);
        :func:`gpvi.linalg.cholesky_with_jitter` (same acceptance rule: no pivot below ``N eps mean(diag K)``; jitter
        retries; warnings) only when a member fails it. The kernels here are stationary, so every diagonal entry of K
        equals its mean, ``K[:, 0, 0]``. ``ok`` is ``self._true`` when every member passed."""
        if bufs is None:
            L, info = torch.linalg.cholesky_ex(K)
        else:
            info = torch.empty(K.shape[0], dtype=torch.int32, device=K.device)
            L, info = torch.linalg.cholesky_ex(K, out=(bufs[1], info))
        dl = L.diagonal(dim1=-2, dim2=-1)
        if self._cpu and not K.requires_grad:        # the acceptance test on NumPy views: no tensor operations
            d = dl.numpy().min(-1)
            if ((info.numpy() == 0) & (d * d > self._floor * K.numpy()[:, 0, 0])).all():     # NaN: False
                return L, self._true, dl
        else:
            dmin = dl.amin(-1)
            ok = (info == 0) & (dmin * dmin > self._floor * K[:, 0, 0])                 # NaN: False
            if bool(ok.all()):
                return L, self._true, dl
        chol = cholesky_with_jitter(K, jitter=self.jitter, max_jitter=self.max_jitter,
                                    raise_on_failure=raise_on_failure, theta=theta.detach())
        return chol.L, chol.ok, chol.L.diagonal(dim1=-2, dim2=-1)

    def log_prior(self, theta: torch.Tensor, *, grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``log p(theta)`` ``(S,)`` and its gradient ``(S, D)`` (closed form for an independent normal prior)."""
        if self._normal_prior is not None:
            loc, nivar, const = self._normal_prior
            z = theta - loc
            pg = z * nivar                                                        # -z / var
            return torch.linalg.vecdot(z, pg).mul_(0.5).add_(const), (pg if grad else None)
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
        if self._plain_rbf and self._normal_prior is not None:
            return self._plain_log_marginal(theta, grad, raise_on_failure, prior=True)[:2]
        v, g, all_ok = self._log_marginal(theta, grad, raise_on_failure)
        pv, pg = self.log_prior(theta, grad=grad)
        if g is None:
            return v + pv, None
        return v + pv, (g + pg if all_ok else torch.where(torch.isfinite(v)[:, None], g + pg, torch.zeros_like(g)))


# ---------------------------------------------------------------------- helpers
def _independent_normal(prior: Any) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """``(loc, -1 / var, log normaliser)`` of an ``Independent(Normal)`` over all of theta (gpvi's default), else
    None."""
    if type(prior) is not torch.distributions.Independent or type(prior.base_dist) is not torch.distributions.Normal:
        return None
    if prior.reinterpreted_batch_ndims != 1 or prior.base_dist.loc.dim() != 1:
        return None
    loc, scale = prior.base_dist.loc.detach(), prior.base_dist.scale.detach()
    const = float(-torch.log(scale).sum() - 0.5 * loc.numel() * _LOG_2PI)
    return loc, -1.0 / (scale * scale), const


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
