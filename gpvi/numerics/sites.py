r"""Site algebra of CVI: pseudo-data, the factor of :math:`K + S`, marginals, the site ELBO and the site update.

The variational posterior is a Gaussian :math:`q(\mathbf f) = \mathcal N(\mathbf m, V)` written through :math:`2N`
**site parameters** (Khan & Lin 2017, the display after eq. 13):

.. math::

    q(\mathbf f) \propto \Big[\prod_n \exp\big(\tilde\lambda^{(1)}_n f_n + \tilde\lambda^{(2)}_n f_n^2\big)\Big]
    \,\mathcal N(\mathbf f \mid 0, K), \qquad \tilde\lambda^{(2)}_n < 0.

:math:`V` is never stored. Each site is a Gaussian pseudo-observation: pseudo-target
:math:`\tilde y_n = -\tilde\lambda^{(1)}_n / (2\tilde\lambda^{(2)}_n)` with pseudo-noise variance
:math:`s_n = -1/(2\tilde\lambda^{(2)}_n)` (:func:`pseudo_data`), so step 4 of Algorithm 1 is GP regression:

.. math::

    \mathbf m = K (K + S)^{-1}\tilde{\mathbf y},\qquad
    V_{nn} = K_{nn} - \| L^{-1} \mathbf k_n \|^2,\qquad L L^\top = K + S,\; S = \operatorname{diag}(s)

(:func:`site_factor`, :func:`marginals`).

Why :math:`K + S` rather than :math:`B = I + W^{1/2} K W^{1/2}`: both have condition number at most
:math:`1 + \lambda_{max}(K)\max_n W_n` with :math:`W_n = 1/s_n`; for logit :math:`-h'' \le 1/4` so :math:`s_n \ge 4`,
for probit :math:`s_n \ge 1`, and every convex combination of valid estimates keeps that bound. :math:`K + S` needs
no :math:`W^{1/2}` scaling, is exactly GP regression's matrix (the conjugacy check reuses the regression
formulas), and is the very factor the stochastic mode maintains, so both modes share one code path.

Site validity (:func:`update_sites`)
-----------------------------------
:math:`\tilde\lambda^{(2)}_n` must stay negative. Logit and probit with quadrature or the ``"hessian"`` Monte Carlo
estimator always give :math:`\hat g^{(2)} < 0`, so every convex combination is valid. When an estimate would make a
site invalid (``"reparam"`` Monte Carlo, other likelihoods), ``invalid="shrink"`` shrinks that site's step to half
the distance to the boundary (:math:`\beta' = \tfrac12\,\tilde\lambda^{(2)}/(\tilde\lambda^{(2)} - \hat g^{(2)})`, so
the precision at most halves; counted in ``sites_shrunk``), ``invalid="reject"`` skips that site's update
(``sites_rejected``). A site's precision :math:`-2\tilde\lambda^{(2)}_n` is floored at :math:`10^{-10}/\overline{K_{nn}}`
(pseudo-noise at most :math:`10^{10}` times the mean prior variance; such a site changes :math:`q` by less than
1e-10 relative, and the floor keeps :math:`s_n` finite when :math:`\mathbb E[h'']` underflows, e.g. for a
diverging :math:`\beta = 1` run); floored updates are counted in ``sites_floored``. Non-finite estimates are skipped
(``sites_nonfinite``) with a :class:`~gpvi.exceptions.NumericalWarning`.

Negative curvature
------------------
A likelihood that is not log-concave (Student-t) can have :math:`\mathbb E_q[h''] > 0` at an outlying site: the
exact gradient :math:`\hat g^{(2)}_n > 0` asks for a negative site precision, which a Gaussian pseudo-observation
(:math:`s_n > 0`) cannot carry. The site's precision is then damped towards 0 and clipped at the floor as above
(counted), the choice of BayesNewton and of damped natural-gradient VI, rather than an indefinite :math:`K + S`.
Its :math:`\tilde\lambda^{(1)}` must not stall with it: the mean gradient of the bound at fixed :math:`V`,
:math:`\partial_{\mathbf m}\mathcal L = \partial_m E - K^{-1}\mathbf m = \partial_m E - \tilde\lambda^{(1)} -
2\tilde\lambda^{(2)}\odot\mathbf m` (with :math:`V^{-1} = K^{-1} - 2\operatorname{diag}\tilde\lambda^{(2)}`,
:math:`\mathbf m = V\tilde\lambda^{(1)}`), vanishes at :math:`\tilde\lambda^{(1)}_n = \partial_m E_n -
2 m_n\tilde\lambda^{(2)}_n`. With ``m`` given (the engines' steps), such a site's :math:`\tilde\lambda^{(1)}` takes
the full step :math:`\beta` towards that target with its new :math:`\tilde\lambda^{(2)}`, so a fixed point has the
best mean for the clipped covariance (otherwise the shrunk step would freeze :math:`\tilde\lambda^{(1)}` where the
precision reached the floor). At a fixed point with no site clipped this is eq. 13's fixed point.

With K class-factorised latent functions (multi-class CVI) the sites are (N, K), and :func:`site_factor`,
:func:`marginals`, :func:`kl2` are the same algebra batched over the K factors of :math:`K + S_k`.

Names: ``lam1``, ``lam2`` (:math:`\tilde\lambda^{(1)}, \tilde\lambda^{(2)}`), ``ytilde`` (:math:`\tilde{\mathbf y}`),
``s`` (pseudo-noise), ``m``, ``var`` (:math:`\operatorname{diag}V`), ``alpha`` (:math:`(K+S)^{-1}\tilde{\mathbf y}`),
``g1``, ``g2`` (:math:`\hat g^{(1)}, \hat g^{(2)}`), ``beta`` (:math:`\beta_t`).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from scipy.linalg import blas, lapack

from ..exceptions import NumericalWarning
from ..linalg import cholesky_with_jitter, logdet_from_cholesky, sum_of_squares, triangular_inverse

__all__ = ["pseudo_data", "site_factor", "marginals", "keeps_inverse", "INVERSE_MIN", "site_elbo", "kl2",
           "kernel_gradient", "kernel_gradient_summed", "lam2_cap", "finite_or_fault", "update_sites", "SiteFault", "MIN_SITE_PRECISION"]

_WEAK = 1e4
"""A site with pseudo-noise above this many times its marginal variance gets :func:`marginals`' direct formula."""

MIN_SITE_PRECISION = 1e-10
"""Floor on a site's precision -2 lam2, relative to 1 / mean(diag K) (see the module docstring)."""


class SiteFault(Exception):
    """A numerical fault inside a CVI step (a non-finite ELBO); the engine rolls the step back."""


def pseudo_data(lam1: torch.Tensor, lam2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pseudo-targets ``ytilde = -lam1 / (2 lam2)`` and pseudo-noise variances ``s = -1 / (2 lam2)``, each (N,)."""
    s = -0.5 / lam2
    return s * lam1, s


def site_factor(K: torch.Tensor, s: torch.Tensor, theta: torch.Tensor | None = None, *,
                out: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
    """Lower Cholesky factor(s) of :math:`K + \\operatorname{diag}(s)` through the shared jitter policy; returns
    ``(L, largest jitter)``. ``s`` of shape (N,): one factor (N, N); (N, K): one per latent function, (K, N, N).
    ``out``: a contiguous buffer of that shape to build the matrices in (on the CPU ``L`` is then factorised in place,
    a view of it); a fresh one otherwise. Raises :class:`~gpvi.exceptions.NotPSDError` when a factorisation fails
    even with the largest jitter."""
    if s.dim() == 1:
        A = K.clone() if out is None else out.copy_(K)
        A.diagonal().add_(s)
    else:
        A = K.unsqueeze(0).repeat(s.shape[1], 1, 1) if out is None else out.copy_(K.expand_as(out))
        A.diagonal(dim1=-2, dim2=-1).add_(s.T)
    res = cholesky_with_jitter(A, theta=theta, raise_on_failure=True, what="K + diag(pseudo-noise)", overwrite=True)
    return res.L, float(res.jitter.max())


def marginals(K: torch.Tensor, L: torch.Tensor, ytilde: torch.Tensor, *, keep_inverse: bool = False,
              keep_precision: bool = False, out: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    r"""All marginals from the factor(s): ``m = K alpha``, ``var`` = :math:`\operatorname{diag}V` and ``alpha``
    (and, as a fourth result, :math:`P = (K + S)^{-1}` with ``keep_precision``, or :math:`L^{-1}` with
    ``keep_inverse``, for :func:`kernel_gradient`; written into ``out``, a buffer of ``L``'s shape, when given).

    ``ytilde`` (N,): ``m``, ``var``, ``alpha`` (N,); (N, K) with ``L`` (K, N, N): ``m``, ``var`` (N, K), ``alpha``
    (K, N). With :math:`P = (LL^\top)^{-1} = (K + S)^{-1}`, :math:`V = K - KPK = S - SPS`, so

    .. math::

        V_{nn} = s_n - s_n^2 P_{nn},

    the diagonal of :math:`P` from the factor, instead of the triangular solve :math:`L^{-1}K` (:math:`N^3` flops) of
    :math:`V_{nn} = K_{nn} - \lVert L^{-1}\mathbf k_n\rVert^2`. Two ways, chosen by the order
    (:func:`keeps_inverse`, ``benchmarks/studies/results/typeii_inverse.md``): below :data:`INVERSE_MIN`, LAPACK's
    ``potri`` (:func:`torch.cholesky_inverse`: the triangular inverse and :math:`L^{-\top}L^{-1}`,
    :math:`2N^3/3` flops, through torch's LAPACK), which leaves :math:`P` itself for :func:`kernel_gradient_summed`
    and took less time than SciPy's ``trtri`` alone there; from it on, the triangular inverse
    (:func:`gpvi.linalg.triangular_inverse`, SciPy's ``trtri``, :math:`N^3/3`) and
    :math:`P_{nn} = \lVert L^{-1} e_n\rVert^2`, 0.5-0.7x the time of ``potri`` at N = 2,000-5,000 (both
    measured in ``typeii_inverse.md``). The default (neither ``keep_*``) takes the cheaper one; ``keep_precision``
    and ``keep_inverse`` ask for ``potri`` and for the triangular inverse.

    The :math:`s_n` are read off the factor, :math:`s_n = (LL^\top)_{nn} - K_{nn}` (jitter included). The
    subtraction loses about :math:`\log_{10}(s_n/V_{nn})` digits (measured: 2e-12 relative at
    :math:`s_n/V_{nn} = 10^3`), so sites with :math:`s_n > 10^4\,V_{nn}` (or a non-positive result) are recomputed
    by the direct formula, one column of :math:`L^{-1}K` (a triangular solve) each.
    """
    if keep_inverse and keep_precision:
        raise ValueError("keep_inverse and keep_precision are exclusive")
    batched = ytilde.dim() == 2
    rhs = ytilde.T.unsqueeze(-1) if batched else ytilde.unsqueeze(-1)
    # two triangular solves (torch.cholesky_solve copies the factors first: 15x slower at N = 2,000)
    alpha = torch.linalg.solve_triangular(L.mT, torch.linalg.solve_triangular(L, rhs, upper=False),
                                          upper=True).squeeze(-1)
    m = (alpha @ K).T if batched else K @ alpha
    dK = K.diagonal()
    s = sum_of_squares(L, -1) - dK
    if keep_inverse or (not keep_precision and keeps_inverse(L.shape[-1])):
        extra = Linv = triangular_inverse(L, out)
        dP = sum_of_squares(Linv, -2)
    else:
        extra = _precision(L, out)
        dP = extra.diagonal(dim1=-2, dim2=-1)
    var = s - s * s * dP
    weak = (s > _WEAK * var) | ~(var > 0)
    if bool(weak.any()):
        for c, row in enumerate(weak.reshape(-1, weak.shape[-1])):
            idx = row.nonzero().flatten()
            if idx.numel():
                W = torch.linalg.solve_triangular(L[c] if batched else L, K[:, idx], upper=False)
                exact = dK[idx] - (W * W).sum(0)
                if batched:
                    var[c, idx] = exact
                else:
                    var[idx] = exact
    if keep_inverse or keep_precision:
        return m, (var.T if batched else var), alpha, extra
    return m, (var.T if batched else var), alpha


def _precision(L: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    r""":math:`P = (LL^\top)^{-1}` (symmetric, both triangles) from lower factor(s) ``L`` (..., N, N) by LAPACK's
    ``potri`` (:func:`torch.cholesky_inverse`), into ``out`` (a buffer of ``L``'s shape) when given."""
    if out is None or L.requires_grad or out.shape != L.shape:
        return torch.cholesky_inverse(L)
    return torch.cholesky_inverse(L, out=out)


INVERSE_MIN = 1000
"""Order from which :func:`marginals` takes the diagonal of :math:`P` from the triangular inverse (SciPy's
``trtri``, :math:`N^3/3` flops, and column norms; the type-II gradient then forms :math:`P` by one ``lauum``)
instead of from ``potri`` (:func:`torch.cholesky_inverse`, :math:`2N^3/3`, which leaves :math:`P` itself):
``benchmarks/studies/results/typeii_inverse.md``, where per evaluation of 5 inner steps ``potri`` took less time
at N = 300 and 768 (one factor or three: 0.52-0.80 of the other) and more from N = 1,024 on (1.02-1.57; the
ratio crosses 1 at about N = 920-1,010 between the two measured orders; alternated calls, one thread, load 2-3)."""


def keeps_inverse(n: int) -> bool:
    """Whether :func:`marginals` of order ``n`` is cheaper with ``keep_inverse`` (:math:`L^{-1}`) than with
    ``keep_precision`` (:math:`P`): from :data:`INVERSE_MIN` on."""
    return n >= INVERSE_MIN


def site_elbo(value_sum: torch.Tensor, lam1: torch.Tensor, lam2: torch.Tensor, m: torch.Tensor,
              var: torch.Tensor, L: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    r"""The ELBO (Khan & Lin 2017, eq. 5) of the site-parametrised :math:`q` given its marginals and factor.

    With :math:`V = S(K+S)^{-1}K`, :math:`K^{-1}V = (K+S)^{-1}S` and :math:`\mathbf m = K\boldsymbol\alpha`, the
    Gaussian KL divergence needs only the marginals, :math:`\boldsymbol\alpha = (K+S)^{-1}\tilde{\mathbf y}` and
    the factor :math:`L L^\top = K + S`:

    .. math::

        \mathcal L = \sum_n \mathbb E_q[\log p(y_n \mid f_n)] - \tfrac12\Big[\mathbf m^\top\boldsymbol\alpha
          - \sum_n \frac{V_{nn}}{s_n} + \log|K + S| - \sum_n \log s_n\Big]

    (:math:`\operatorname{tr}(K^{-1}V) = N - \sum_n V_{nn}/s_n`, :math:`\log|K| - \log|V| = \log|K+S| - \sum_n\log s_n`;
    the bracket is :math:`2\,\mathrm{KL}(q\,\|\,p)`). This form has no :math:`\tilde y_n^2/s_n` terms, which cancel
    catastrophically for weak sites (large :math:`s_n`). O(N) given its inputs.

    Parameters
    ----------
    value_sum : torch.Tensor of shape ()
        :math:`\sum_n \mathbb E_q[\log p(y_n\mid f_n)]`.
    lam1, lam2, m, var : torch.Tensor of shape (N,)
    L : torch.Tensor of shape (N, N)
        Cholesky factor of :math:`K + S`.
    alpha : torch.Tensor of shape (N,)
        :math:`(K + S)^{-1}\tilde{\mathbf y}`.

    Returns
    -------
    torch.Tensor of shape ()

    Examples
    --------
    >>> import math, torch
    >>> K = torch.eye(2, dtype=torch.float64); lam1 = torch.zeros(2, dtype=torch.float64)
    >>> lam2 = torch.full((2,), -0.5, dtype=torch.float64)       # s = 1: q = N(0, 0.5 I)
    >>> L = torch.linalg.cholesky(2 * K); z = torch.zeros(2, dtype=torch.float64)
    >>> kl = -site_elbo(torch.tensor(0.0, dtype=torch.float64), lam1, lam2, z, torch.full((2,), 0.5,
    ...                 dtype=torch.float64), L, z)
    >>> round(float(kl), 6) == round(2 * 0.5 * (0.5 - 1 - math.log(0.5)), 6)   # KL(N(0, .5) || N(0, 1)) per site
    True
    """
    return value_sum - 0.5 * kl2(lam2, m, var, L, alpha)


def kl2(lam2: torch.Tensor, m: torch.Tensor, var: torch.Tensor, L: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    r""":math:`2\,\mathrm{KL}(q\,\|\,p)` in the site form of :func:`site_elbo`, summed over the latent functions
    (sites (N,) with ``L`` (N, N) and ``alpha`` (N,), or (N, K) with ``L`` (K, N, N) and ``alpha`` (K, N))."""
    s = -0.5 / lam2
    a = alpha if m.dim() == 1 else alpha.T
    return (m * a).sum() - (var / s).sum() + logdet_from_cholesky(L).sum() - torch.log(s).sum()


def kernel_gradient(L: torch.Tensor, lam1: torch.Tensor, lam2: torch.Tensor, m: torch.Tensor, alpha: torch.Tensor,
                    dm: torch.Tensor, dv: torch.Tensor, *, Linv: torch.Tensor | None = None,
                    P: torch.Tensor | None = None) -> torch.Tensor:
    r""":math:`\partial\mathcal L/\partial K` of :func:`site_elbo` with the sites held fixed, in closed form
    (:mod:`gpvi.inference.cvi.typeii`, "Inner runs are monotone"):

    .. math::

        \frac{\partial\mathcal L}{\partial K} = \operatorname{sym}\Big(P\,(a\odot s)\,\boldsymbol\alpha^\top
          + P\operatorname{diag}(b\odot s^2)P + \tfrac12\boldsymbol\alpha\boldsymbol\alpha^\top - \tfrac12 P\Big),

    :math:`P = (LL^\top)^{-1} = (K + S)^{-1}`, :math:`a = \partial_m E - \tilde\lambda^{(1)} - 2\tilde\lambda^{(2)}\mathbf m`,
    :math:`b = \partial_v E - \tilde\lambda^{(2)}`. Batched: every argument may carry the same leading dimensions
    (``L`` (..., N, N), the others (..., N)); returns (..., N, N). ``Linv``: :math:`L^{-1}` where the caller has it
    (:func:`marginals`); then :math:`P = L^{-\top}L^{-1}` is one ``lauum`` (:math:`N^3/3` flops) instead of
    ``cholesky_inverse`` (:math:`2N^3/3`); ``P``: :math:`P` itself (``marginals(keep_precision=True)``), no
    factorisation work at all. About :math:`N^3` flops per factor with ``P``.
    """
    s = -0.5 / lam2
    if P is None:
        P = torch.cholesky_inverse(L) if Linv is None else _gram_of_inverse(Linv)
    a = dm - lam1 - 2.0 * lam2 * m
    # sym(P (a s) alpha^T + 1/2 alpha alpha^T) = 1/2 (w alpha^T + alpha w^T) with w = P (a s) + alpha / 2
    w = (P @ (a * s).unsqueeze(-1)).squeeze(-1) + 0.5 * alpha
    G = _sandwich(P, (dv - lam2) * s * s)
    G.add_(P, alpha=-0.5)
    G.add_(torch.stack((w, alpha), -1) @ torch.stack((alpha, w), -2), alpha=0.5)
    return G


def kernel_gradient_summed(L: torch.Tensor, lam1: torch.Tensor, lam2: torch.Tensor, m: torch.Tensor,
                           alpha: torch.Tensor, dm: torch.Tensor, dv: torch.Tensor, Linv: torch.Tensor | None = None,
                           *, P: torch.Tensor | None = None) -> torch.Tensor:
    r""":func:`kernel_gradient` summed over the factors (latent functions sharing :math:`K`), as a matrix :math:`T`
    (N, N) with :math:`T + T^\top = 2\sum_k G_k`: what a contraction with a symmetric matrix needs,
    :math:`\sum_{ij} T_{ij}A_{ij} = \sum_{ij}(\sum_k G_k)_{ij}A_{ij}` (e.g. autograd through :math:`K(\theta)`).

    ``P``: the factors' :math:`P_k = (K + S_k)^{-1}` (``marginals(keep_precision=True)``), or ``Linv``: their
    :math:`L_k^{-1}` (then each :math:`P_k` is one ``lauum``, :math:`N^3/3` flops); one of the two is needed.

    On the CPU (float64) no :math:`N\times N` matrix is symmetrised or stacked per factor: the sandwiches
    :math:`\sum_k P_k\operatorname{diag}(\mathbf c_k)P_k`, :math:`\mathbf c_k = \mathbf b_k\odot\mathbf s_k^2`,
    accumulate in one lower triangle by ``syrk`` (:math:`N^3` flops per factor, in double precision). Elsewhere:
    ``kernel_gradient(...).sum(0)``.
    """
    if P is None and Linv is None:
        raise ValueError("kernel_gradient_summed needs P or Linv")
    given = P if P is not None else Linv
    if L.device.type != "cpu" or L.dtype != torch.float64 or given.requires_grad:
        G = kernel_gradient(L, lam1, lam2, m, alpha, dm, dv, Linv=Linv, P=P)
        return G if G.dim() == 2 else G.sum(0)
    n = L.shape[-1]
    s = (-0.5 / lam2).reshape(-1, n)
    a = (dm - lam1 - 2.0 * lam2 * m).reshape(-1, n)
    c = ((dv - lam2).reshape(-1, n) * s * s).numpy()
    al = alpha.reshape(-1, n)
    Pb = P.detach().reshape(-1, n, n) if P is not None else None
    Lb = Linv.detach().reshape(-1, n, n) if P is None else None
    # 1/2 sum_k (w_k alpha_k^T + alpha_k w_k^T), w = P (a s) + alpha / 2 (P u = Linv^T (Linv u) from Linv)
    u = (a * s).unsqueeze(-1)
    w = (Pb @ u if Pb is not None else Lb.mT @ (Lb @ u)).squeeze(-1) + 0.5 * al
    T = torch.cat((w, al)).T @ torch.cat((al, w))
    T.mul_(0.5)
    S = np.zeros((n, n), dtype=np.float64, order="F")
    for k in range(al.shape[0]):
        Pk = _gram_of_inverse(Lb[k]) if Pb is None else Pb[k]
        T.add_(Pk, alpha=-0.5)
        if not Pk.is_contiguous():             # symmetric: its transpose is the same matrix, in C order
            Pk = Pk.mT
        Pn, ck = Pk.contiguous().numpy(), c[k]
        for sign, cols in ((1.0, ck > 0), (-1.0, ck < 0)):
            if cols.any():             # P symmetric: its columns are its rows, gathered contiguously
                X = (Pn[cols] * np.sqrt(sign * ck[cols])[:, None]).T
                S = blas.dsyrk(sign, X, beta=1.0, c=S, lower=1, overwrite_c=1)
        del Pk, Pn
    S64 = torch.from_numpy(S)                          # lower triangle, zeros above
    T.add_(S64, alpha=2.0)
    T.diagonal().sub_(S64.diagonal())
    return T


def _gram_of_inverse(Linv: torch.Tensor) -> torch.Tensor:
    r""":math:`P = L^{-\top}L^{-1}` (symmetric, (..., N, N)) from a lower-triangular :math:`L^{-1}` (..., N, N):
    LAPACK's ``lauum`` through SciPy on the CPU (float64), one triangle then mirrored; ``Linv.mT @ Linv``
    elsewhere."""
    if Linv.device.type != "cpu" or Linv.dtype != torch.float64 or Linv.requires_grad:
        return Linv.mT @ Linv
    cm = not Linv.is_contiguous() and Linv.mT.is_contiguous()
    out = Linv.detach().mT.clone() if cm else Linv.detach().clone(memory_format=torch.contiguous_format)
    for W in out.reshape(-1, *Linv.shape[-2:]).numpy():
        # W.T (Fortran view) is Linv (column-major Linv) or Linv^T (C-ordered): lauum of its lower / upper triangle
        _, info = lapack.dlauum(W.T, lower=int(cm), overwrite_c=1)
        if info != 0:
            raise ValueError(f"lauum failed (info {info})")
    if not cm:                                  # P's triangle in C order: the upper one (cm) or the lower one
        out = out.mT
    return mirror_upper_(out)


def mirror_upper_(A: torch.Tensor, block: int = 256) -> torch.Tensor:
    r"""``A`` (..., N, N) made symmetric from its upper triangle, in place (the strictly lower one is overwritten),
    returned: the same numbers as ``A.triu_().add_(A.triu(1).mT)``, by copies of blocks of ``block`` columns of the
    upper triangle into the rows below them, without that expression's N x N temporary and its passes over the whole
    matrix (a third of its time at N = 2,000; once per type-II evaluation with :math:`L^{-1}` kept)."""
    n = A.shape[-1]
    for i in range(0, n, block):
        j = min(i + block, n)
        A[..., j:, i:j].copy_(A[..., i:j, j:].mT)
        diag = A[..., i:j, i:j]
        diag.copy_(diag.triu().add_(diag.triu(1).mT))
    return A


def _sandwich(P: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    r""":math:`P\operatorname{diag}(\mathbf c)P` for a symmetric ``P`` (..., N, N) and ``c`` (..., N), batched.

    On the CPU two symmetric rank-k updates, :math:`X_+X_+^\top - X_-X_-^\top` with
    :math:`X_\pm = P_{:,\pm}\operatorname{diag}(\sqrt{\pm c_\pm})` over the columns with positive and negative
    :math:`c` (BLAS ``syrk`` through :func:`scipy.linalg.blas.dsyrk`: :math:`N^3` flops in all, half of a general
    product); elsewhere ``(P * c) @ P``."""
    if P.device.type != "cpu" or P.dtype != torch.float64 or P.requires_grad or c.requires_grad:
        return (P * c.unsqueeze(-2)) @ P
    out = []
    for Pi, ci in zip(P.detach().reshape(-1, *P.shape[-2:]).numpy(), c.detach().reshape(-1, P.shape[-1]).numpy()):
        G = np.zeros(Pi.shape, order="F")
        for sign, cols in ((1.0, ci > 0), (-1.0, ci < 0)):
            if cols.any():
                X = np.asfortranarray(Pi[:, cols] * np.sqrt(sign * ci[cols]))
                G = blas.dsyrk(sign, X, beta=1.0, c=G, lower=1, overwrite_c=1)
        G = torch.from_numpy(G)                 # lower triangle filled, zeros above
        G = G + G.mT
        G.diagonal().mul_(0.5)
        out.append(G)
    return out[0].reshape(P.shape) if len(out) == 1 else torch.stack(out).reshape(P.shape)


def lam2_cap(K: torch.Tensor) -> float:
    """Largest allowed lam2: site precision -2 lam2 >= 1e-10 / mean(diag K), i.e. s <= 1e10 mean(diag K)."""
    return -0.5 * MIN_SITE_PRECISION / max(float(K.diagonal().mean()), 1e-300)


def update_sites(lam1: torch.Tensor, lam2: torch.Tensor, g1: torch.Tensor, g2: torch.Tensor, beta: float,
                 counters: dict[str, float], cap: float, invalid: str, *, m: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Eq. 13 on the given sites, :math:`\tilde\lambda \leftarrow (1-\beta)\tilde\lambda + \beta\hat g`, with the validity rule.

    Parameters
    ----------
    lam1, lam2, g1, g2 : torch.Tensor of shape (B,)
        The sites and their estimated gradients.
    beta : float
        :math:`\beta_t`.
    counters : dict
        ``sites_shrunk``, ``sites_rejected``, ``sites_nonfinite``, ``sites_floored`` are incremented here.
    cap : float
        :func:`lam2_cap` of the kernel matrix.
    invalid : {"shrink", "reject"}
    m : torch.Tensor of shape (B,), optional
        The sites' marginal means. Given, a site whose :math:`\tilde\lambda^{(2)}` step was shrunk or rejected
        keeps the full step in :math:`\tilde\lambda^{(1)}` towards the target that makes the mean stationary for
        its new :math:`\tilde\lambda^{(2)}` (module docstring, "Negative curvature").

    Returns
    -------
    (lam1, lam2) : new tensors of shape (B,)
    """
    finite = torch.isfinite(g1) & torch.isfinite(g2)
    b = torch.full_like(lam1, beta)
    new2 = (1.0 - b) * lam2 + b * g2
    bad = finite & ~(new2 < 0)
    if bool(bad.any()):
        if invalid == "shrink":
            # half-way to the boundary lam2 = 0 along the segment from lam2 to g2
            # an empty site with a zero gradient (a point of weight 0: lam2 = g2 = 0) has no crossing; it moves to
            # 0 and is floored below
            crossing = torch.where(lam2 != g2, lam2 / (lam2 - g2), b)
            b = torch.where(bad, 0.5 * torch.minimum(crossing, b), b)
            counters["sites_shrunk"] += int(bad.sum())
        else:
            b = torch.where(bad, torch.zeros_like(b), b)
            counters["sites_rejected"] += int(bad.sum())
    if not bool(finite.all()):
        nbad = int((~finite).sum())
        counters["sites_nonfinite"] += nbad
        warnings.warn(f"CVI: {nbad} site gradient estimate(s) were not finite; those sites were not updated",
                      NumericalWarning, stacklevel=5)
        b = torch.where(finite, b, torch.zeros_like(b))
        g1 = torch.where(finite, g1, torch.zeros_like(g1))
        g2 = torch.where(finite, g2, torch.zeros_like(g2))
    new1, new2 = (1.0 - b) * lam1 + b * g1, (1.0 - b) * lam2 + b * g2
    weak = new2 > cap
    if bool(weak.any()):
        counters["sites_floored"] += int(weak.sum())
        new2 = torch.where(weak, torch.full_like(new2, cap), new2)
    if m is not None and bool(bad.any()):
        # g1 = dE/dm - 2 m dE/dv; with lam2 held at new2 instead of dE/dv, the mean is stationary at
        # lam1 = dE/dm - 2 m new2 = g1 + 2 m (g2 - new2)
        target1 = g1 + 2.0 * m * (g2 - new2)
        new1 = torch.where(bad, (1.0 - beta) * lam1 + beta * target1, new1)
    return new1, new2


def finite_or_fault(elbo: torch.Tensor, t: int) -> float:
    """``float(elbo)``, or :class:`SiteFault` when it is not finite (the step is then rolled back)."""
    value = float(elbo)
    if not math.isfinite(value):
        raise SiteFault(f"ELBO is not finite ({value}) at step {t}")
    return value
