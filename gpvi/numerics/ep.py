r"""Expectation propagation for a latent GP: the approximate evidence :math:`\log Z_{EP}(\theta)` and its gradient.

For a latent GP :math:`\mathbf f \sim \mathcal N(0, K)` with a factorised likelihood :math:`\prod_n p(y_n\mid f_n)`,
EP (Minka 2001; Rasmussen & Williams 2006, section 3.6, algorithm 3.5) replaces each likelihood factor by a
Gaussian site :math:`\tilde t_n(f_n) \propto \exp(\tilde\nu_n f_n - \tfrac12\tilde\tau_n f_n^2)`, so that the
approximate posterior is :math:`q(\mathbf f) = \mathcal N(\boldsymbol\mu, \Sigma)` with
:math:`\Sigma = (K^{-1} + \tilde T)^{-1}`, :math:`\boldsymbol\mu = \Sigma\tilde{\boldsymbol\nu}`, and chooses each
site so that :math:`q` matches the first two moments of the *tilted* distribution
:math:`\hat p_n(f_n) \propto p(y_n\mid f_n)\,\mathcal N(f_n\mid\mu_{-n}, \sigma^2_{-n})`, where the cavity
:math:`\mathcal N(\mu_{-n}, \sigma^2_{-n})` is :math:`q`'s marginal with site :math:`n` divided out
(R&W eqs. 3.56-3.59). The tilted normaliser :math:`\hat Z_n` and moments :math:`\hat\mu_n, \hat\sigma^2_n` are
computed by the deterministic quadrature rule of :class:`gpvi.numerics.quadrature.Quadrature` (any likelihood with a
``log_prob``).

This module runs **parallel EP** (all sites updated from one factorisation per sweep, damped:
:math:`\tilde\tau \leftarrow (1-\delta)\tilde\tau + \delta\tilde\tau^{new}`), batched over rows of :math:`K`
(one row per hyperparameter value), in the numerically stable form of R&W section 3.6.3
(:math:`B = I + \tilde S^{1/2} K \tilde S^{1/2}`, never :math:`K^{-1}`; :math:`\tilde\tau_n = 0` allowed). The
approximate log evidence (R&W eq. 3.65, rearranged so that no :math:`1/\tilde\tau_n` appears) is

.. math::

    \log Z_{EP} = \sum_n \log\hat Z_n - \tfrac12\log|B| + \tfrac12\tilde{\boldsymbol\nu}^\top\Sigma
      \tilde{\boldsymbol\nu} + \tfrac12\sum_n \log\Big(1 + \frac{\tilde\tau_n}{\tau_{-n}}\Big)
      + \sum_n \frac{\mu_{-n}^2\tilde\tau_n\tau_{-n} - 2\mu_{-n}\tilde\nu_n\tau_{-n} - \tilde\nu_n^2}
        {2(\tilde\tau_n + \tau_{-n})},

with :math:`\tau_{-n} = 1/\sigma^2_{-n}`. At a fixed point of EP its derivative in :math:`K` holds the sites fixed
(R&W eq. 5.27):

.. math::

    \frac{\partial \log Z_{EP}}{\partial K} = \tfrac12\big(\mathbf b\mathbf b^\top - R\big),\qquad
    \mathbf b = \tilde{\boldsymbol\nu} - \tilde{\boldsymbol\tau}\circ\boldsymbol\mu,\quad
    R = \tilde S^{1/2} B^{-1} \tilde S^{1/2} = (K + \tilde T^{-1})^{-1}.

For a Gaussian likelihood EP is exact (one undamped sweep): :math:`\log Z_{EP} = \log\mathcal N(\mathbf y\mid 0,
K + \sigma^2 I)`. For GP classification it is known to track the exact :math:`\log p(\mathbf y\mid\theta)` far more
closely than the Laplace approximation or the Gaussian variational bound, most of all at large signal variances
where the posterior of :math:`\mathbf f` is skewed (Kuss & Rasmussen 2005; Nickisch & Rasmussen 2008); measured in
``benchmarks/classification_evidence.py``.

Names: ``tau``, ``nu`` (the sites' natural parameters :math:`\tilde\tau, \tilde\nu`), ``damping`` (:math:`\delta`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from .anderson import Anderson
from .quadrature import Quadrature
from ..linalg import cholesky_plain
from ..validation import check_nonnegative_int, check_positive, check_positive_int

__all__ = ["EPResult", "expectation_propagation"]

_LOW_Z = 1e-200
r""":func:`_tilted` redoes a site in the log domain where the tilted normaliser is below this (or not finite)."""

_WEAK = 1e-4
r""":func:`_marginals` takes the direct formula for a site with :math:`\tilde\tau_n\Sigma_{nn}` below this."""


class EPResult(NamedTuple):
    r"""What :func:`expectation_propagation` returns; every field is batched over the rows of ``K``."""

    log_z: torch.Tensor
    """``(S,)`` :math:`\\log Z_{EP}` (``-inf`` where the row failed)."""
    grad_k: torch.Tensor | None
    """``(S, N, N)`` :math:`\\partial\\log Z_{EP}/\\partial K` at the final sites (zero where the row failed; None
    when called with ``gradient=False``)."""
    tau: torch.Tensor
    """``(S, N)`` site precisions :math:`\\tilde\\tau \\ge 0`."""
    nu: torch.Tensor
    """``(S, N)`` site shifts :math:`\\tilde\\nu`."""
    mean: torch.Tensor
    """``(S, N)`` posterior marginal means :math:`\\mu_n`."""
    var: torch.Tensor
    """``(S, N)`` posterior marginal variances :math:`\\Sigma_{nn}`."""
    sweeps: torch.Tensor
    """``(S,)`` sweeps each row ran."""
    converged: torch.Tensor
    """``(S,)`` rows whose largest site change fell below ``tol``."""
    ok: torch.Tensor
    """``(S,)`` rows with a finite result."""


def _tilted(likelihood: Any, y: torch.Tensor, mc: torch.Tensor, vc: torch.Tensor, quad: Quadrature
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``log Z_hat``, mean and variance of the tilted distributions, by quadrature over the cavities (flat (B,));
    the nodes are laid out node-major, (num_points, B), so every pass runs along the sites.

    For the Bernoulli logit and probit likelihoods the sums run on the probabilities themselves,
    :math:`\\hat Z = \\sum_k w_k\\,p(y\\mid f_k)` (one transcendental per node, :func:`torch.sigmoid` or
    :math:`\\Phi` by :func:`torch.special.erfc`, against four in the log domain), a sum of positive terms without
    cancellation; a site whose :math:`\\hat Z` falls below 1e-200 (a cavity deep in the likelihood's tail) is redone
    in the log domain (:func:`_tilted_log`), the rule for every other likelihood."""
    response = _bernoulli_response(likelihood)
    if response is None:
        return _tilted_log(likelihood, y, mc, vc, quad)
    f, w = quad.nodes_by_node(mc, vc)
    p = response((2.0 * y - 1.0) * f).mul_(w.clamp_min(0.0))
    z = p.sum(0)
    pw = p.div_(z)
    mean = (pw * f).sum(0)
    var = (pw * (f - mean).square_()).sum(0)
    log_z = torch.log(z)
    low = ~(z >= _LOW_Z)
    if bool(low.any()):
        log_z[low], mean[low], var[low] = _tilted_log(likelihood, y[low], mc[low], vc[low], quad)
    return log_z, mean, var


def _bernoulli_response(likelihood: Any) -> Any:
    r""":math:`p(y = 1\mid f)` as a function of :math:`f` for a binary likelihood (``binary``: the Bernoulli logit and
    probit, whose ``response`` is that probability; then :math:`p(y\mid f)` is it at :math:`(2y - 1)f`), else None."""
    return likelihood.response if getattr(likelihood, "binary", False) else None


def _tilted_log(likelihood: Any, y: torch.Tensor, mc: torch.Tensor, vc: torch.Tensor, quad: Quadrature
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_tilted` in the log domain, for any likelihood with ``log_prob``."""
    f, w = quad.nodes_by_node(mc, vc)
    lp = likelihood.log_prob(y.expand_as(f), f).add_(torch.log(w.clamp_min(0.0)))
    log_z = torch.logsumexp(lp, 0)
    pw = lp.sub_(log_z).exp_()
    mean = (pw * f).sum(0)
    var = (pw * (f - mean).square_()).sum(0)
    return log_z, mean, var


def _marginals(K: torch.Tensor, tau: torch.Tensor, nu: torch.Tensor):
    r"""Factor of B, :math:`B^{-1}`, posterior marginal means and variances, and flags of rows that factorised.

    With :math:`\tilde S = \operatorname{diag}\tilde\tau`, :math:`\tilde S^{1/2}\Sigma\tilde S^{1/2} = I - B^{-1}`,
    so :math:`\Sigma_{nn} = (1 - (B^{-1})_{nn})/\tilde\tau_n`: one inverse from the factor
    (:func:`torch.cholesky_inverse`, LAPACK's ``potri``, :math:`2N^3/3` flops, which the gradient
    :math:`R = \tilde S^{1/2}B^{-1}\tilde S^{1/2}` then reuses; faster than :func:`gpvi.linalg.triangular_inverse`
    plus the column norms at N = 100-400: ``benchmarks/studies/results/bayes_profile_after.md``)
    instead of the solve :math:`L_B^{-1}\tilde S^{1/2}K` (:math:`N^3`). Where the subtraction would lose more than 4
    digits (:math:`\tilde\tau_n\Sigma_{nn} < 10^{-4}`, e.g. the prior's zero sites) the direct
    :math:`K_{nn} - \mathbf k_n^\top\tilde S^{1/2}B^{-1}\tilde S^{1/2}\mathbf k_n` is used.
    :math:`\boldsymbol\mu = K\tilde{\boldsymbol\nu} - K\tilde S^{1/2}B^{-1}\tilde S^{1/2}K\tilde{\boldsymbol\nu}`
    by a product with that inverse rather than a one-column ``cholesky_solve``
    (``benchmarks/studies/results/ep_chunks.md``)."""
    sW = tau.sqrt()
    B = (K * sW.unsqueeze(-1)).mul_(sW.unsqueeze(-2))
    B.diagonal(dim1=-2, dim2=-1).add_(1.0)
    LB, ok = cholesky_plain(B)
    del B
    if not bool(ok.all()):                      # rows that failed get an identity factor (flagged in ok)
        LB[~ok] = torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)
    Binv = torch.cholesky_inverse(LB)
    Knu = (K @ nu.unsqueeze(-1)).squeeze(-1)
    z = (Binv @ (sW * Knu).unsqueeze(-1)).squeeze(-1)
    mean = Knu - (K @ (sW * z).unsqueeze(-1)).squeeze(-1)
    var = (1.0 - Binv.diagonal(dim1=-2, dim2=-1)) / tau
    weak = ~(tau * var >= _WEAK) | ~(var > 0)
    if bool(weak.any()):
        for r, row in enumerate(weak):
            idx = row.nonzero().flatten()
            if idx.numel():
                Q = sW[r].unsqueeze(-1) * K[r][:, idx]
                var[r, idx] = K[r].diagonal()[idx] - (Q * (Binv[r] @ Q)).sum(0)
    return LB, Binv, mean, var, ok


def _rows_of(Kb: torch.Tensor, idx: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """The rows ``idx`` (``rows``, the same as a list) of ``Kb``: ``Kb`` itself for all of them, a view for a run
    of consecutive rows (e.g. the one row left of two), a copy (gathered) only for any other subset."""
    if len(rows) == Kb.shape[0]:
        return Kb
    if rows[-1] - rows[0] + 1 == len(rows):
        return Kb[rows[0]:rows[-1] + 1]
    return Kb[idx]


class _Final:
    r"""Per row, the state of EP at its final sites: :math:`B^{-1}`, :math:`\tfrac12\log|B|` (the sum of the log
    diagonal of its factor), marginals, cavities, tilted :math:`\log\hat Z_n`, and whether it factorised; ``kept``
    flags the rows filled in. Without ``gradient`` no :math:`B^{-1}` is stored (``Binv`` is None)."""

    __slots__ = ("Binv", "half_logdet", "mean", "var", "tc", "mc", "lz", "ok", "kept", "gradient")

    def __init__(self, S: int, N: int, like: torch.Tensor, gradient: bool = True) -> None:
        z = torch.zeros(S, N, dtype=like.dtype, device=like.device)
        self.Binv: torch.Tensor | None = None                 # allocated at the first partial keep
        self.half_logdet = like.new_zeros(S)
        self.mean, self.var, self.tc, self.mc, self.lz = z, z.clone(), z.clone(), z.clone(), z.clone()
        self.ok = torch.zeros(S, dtype=torch.bool, device=like.device)
        self.kept = self.ok.clone()
        self.gradient = bool(gradient)

    def keep(self, idx: torch.Tensor, sel: torch.Tensor, LB: torch.Tensor, Binv: torch.Tensor, mean: torch.Tensor,
             var: torch.Tensor, tc: torch.Tensor, mc: torch.Tensor, lz: torch.Tensor) -> None:
        """Store the rows ``idx[sel]`` of a sweep's state (its tensors indexed like ``idx``); where every row of
        the call is stored at once, the sweep's :math:`B^{-1}` itself, without a copy."""
        rows = idx[sel]
        S = self.kept.shape[0]
        if self.gradient:
            whole = rows.numel() == S and not bool(self.kept.any())
            if whole and Binv.shape[0] == S:
                self.Binv = Binv
            else:
                if self.Binv is None:
                    self.Binv = Binv.new_empty((S, *Binv.shape[1:]))
                self.Binv.index_copy_(0, rows, Binv if bool(sel.all()) else Binv[sel])
        self.half_logdet[rows] = torch.log(LB.diagonal(dim1=-2, dim2=-1)[sel]).sum(-1)
        for name, value in (("mean", mean), ("var", var), ("tc", tc), ("mc", mc), ("lz", lz)):
            getattr(self, name)[rows] = value[sel]
        self.ok[rows] = True
        self.kept[rows] = True


def expectation_propagation(K: torch.Tensor, y: torch.Tensor, likelihood: Any, *,
                            quadrature: Quadrature | None = None, damping: float = 0.8, tol: float = 1e-8,
                            max_sweeps: int = 200, tau: torch.Tensor | None = None,
                            nu: torch.Tensor | None = None, anderson: int = 0, gradient: bool = True) -> EPResult:
    r"""Parallel, damped EP on each row of ``K`` (module docstring).

    Parameters
    ----------
    K : torch.Tensor of shape (N, N) or (S, N, N)
        Prior covariances (float64; device and dtype of everything created follow it).
    y : torch.Tensor of shape (N,)
        Targets (0/1 labels for the Bernoulli likelihoods).
    likelihood : Likelihood
        Any factorised likelihood with ``log_prob(y, f)`` (e.g. :class:`~gpvi.models.likelihoods.BernoulliLogit`).
    quadrature : Quadrature, optional
        Rule of the tilted moments (default ``Quadrature()``, 96-point asinh-mapped Gauss-Legendre).
    damping : float in (0, 1]
        :math:`\delta` (default 0.8).
    tol : float
        A row stops when the largest undamped site change, :math:`|\Delta\tilde\tau_n|/(1 + \tilde\tau_n)` and
        :math:`|\Delta\tilde\nu_n|/(1 + |\tilde\nu_n|)`, falls below ``tol`` (default 1e-8: the gradient formula
        holds at the fixed point, and its error is first order in the sites' error).
    max_sweeps : int
        Cap on the sweeps (rows that reach it are returned with ``converged`` False).
    tau, nu : torch.Tensor of shape (N,) or (S, N), optional
        Starting sites (default zero: the prior).
    anderson : int
        Memory of Anderson acceleration of each row's damped site map (:class:`gpvi.numerics.anderson.Anderson`,
        as in :func:`gpvi.numerics.ep_multiclass.multiclass_ep`; default 0: plain damped sweeps). It changes the
        path, not the fixed point or the stop rule. An extrapolation with a negative site precision is replaced by
        the plain damped step; a sweep that fails at an extrapolated point goes back to the plain damped step of
        the sweep before, with an empty history (at most 3 times per row, then the row goes on unaccelerated).
    gradient : bool
        Also return :math:`\partial\log Z_{EP}/\partial K` (default True). False: ``grad_k`` is None, and no
        :math:`B^{-1}` is kept per row (the evidence alone, e.g. for a Monte Carlo bound: the same values).

    Returns
    -------
    EPResult

    Examples
    --------
    EP is exact for a Gaussian likelihood:

    >>> import math, torch
    >>> from gpvi.models.likelihoods import Gaussian
    >>> X = torch.linspace(0, 1, 5, dtype=torch.float64)
    >>> K = torch.exp(-0.5 * (X[:, None] - X[None, :]) ** 2 / 0.3 ** 2)
    >>> y = torch.sin(6 * X)
    >>> res = expectation_propagation(K, y, Gaussian(0.1), damping=1.0)
    >>> exact = torch.distributions.MultivariateNormal(torch.zeros(5, dtype=torch.float64),
    ...                                                K + 0.1 * torch.eye(5, dtype=torch.float64)).log_prob(y)
    >>> abs(float(res.log_z[0] - exact)) < 1e-8
    True
    """
    if not isinstance(K, torch.Tensor) or K.dim() not in (2, 3) or K.shape[-1] != K.shape[-2]:
        raise ValueError(f"K must be a tensor of shape (N, N) or (S, N, N); got {getattr(K, 'shape', type(K))}")
    Kb = K.unsqueeze(0) if K.dim() == 2 else K
    S, N = Kb.shape[0], Kb.shape[-1]
    y = torch.as_tensor(y, dtype=Kb.dtype, device=Kb.device)
    if y.shape != (N,):
        raise ValueError(f"y must have shape ({N},); got {tuple(y.shape)}")
    damping = check_positive(damping, "damping")
    if damping > 1.0:
        raise ValueError(f"damping must be in (0, 1]; got {damping!r}")
    tol = check_positive(tol, "tol")
    max_sweeps = check_positive_int(max_sweeps, "max_sweeps")
    quad = quadrature if quadrature is not None else Quadrature()
    zeros = torch.zeros(S, N, dtype=Kb.dtype, device=Kb.device)
    tau = zeros.clone() if tau is None else torch.as_tensor(tau, dtype=Kb.dtype, device=Kb.device).expand(S, N).clone()
    nu = zeros.clone() if nu is None else torch.as_tensor(nu, dtype=Kb.dtype, device=Kb.device).expand(S, N).clone()
    if bool((tau < 0).any()):
        raise ValueError("tau (starting site precisions) must be >= 0")
    active = torch.ones(S, dtype=torch.bool, device=Kb.device)
    good = torch.ones(S, dtype=torch.bool, device=Kb.device)
    converged = torch.zeros(S, dtype=torch.bool, device=Kb.device)
    sweeps = torch.zeros(S, dtype=torch.long, device=Kb.device)
    yb = y.expand(S, N)
    memory = check_nonnegative_int(anderson, "anderson")
    accs = [Anderson(memory) if memory > 0 else None for _ in range(S)]
    plain: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * S   # G of the last accepted sites, per row
    restarts = [0] * S
    # a row that converges keeps its sites, so the state of its last sweep is the final state: kept, not recomputed
    fin = _Final(S, N, Kb, bool(gradient))
    with torch.no_grad():
        for _ in range(max_sweeps):
            idx = (active & good).nonzero().flatten()
            if idx.numel() == 0:
                break
            t, n, rows = tau[idx], nu[idx], idx.tolist()
            LB, Binv, mean, var, ok = _marginals(_rows_of(Kb, idx, rows), t, n)
            # a sweep that failed at an extrapolated point: back to that row's plain damped step, history cleared
            ok_rows = ok.tolist()                              # one transfer, not one per row
            retry = [i for k, i in enumerate(rows) if not ok_rows[k] and plain[i] is not None and restarts[i] < 3]
            if retry:
                for i in retry:
                    tau[i], nu[i] = plain[i]
                    plain[i] = None
                    restarts[i] += 1
                    accs[i] = Anderson(memory) if restarts[i] < 3 else None
                continue
            tc = (1.0 / var - t).clamp_min(torch.finfo(Kb.dtype).tiny)       # cavity precisions
            mc = (mean / var - n) / tc
            lz, mh, vh = _tilted(likelihood, yb[idx].reshape(-1), mc.reshape(-1), (1.0 / tc).reshape(-1), quad)
            mh, vh = mh.reshape(mc.shape), vh.reshape(mc.shape)
            t_new = (1.0 / vh - tc).clamp_min(0.0)
            n_new = mh / vh - tc * mc
            ok = ok & torch.isfinite(t_new).all(-1) & torch.isfinite(n_new).all(-1)
            change = torch.maximum(((t_new - t).abs() / (1.0 + t)).amax(-1),
                                   ((n_new - n).abs() / (1.0 + n.abs())).amax(-1))
            done = ok & (change <= tol)
            if bool(done.any()):
                fin.keep(idx, done, LB, Binv, mean, var, tc, mc, lz.reshape(mc.shape))
            step = ok & ~done
            g_t = torch.where(step.unsqueeze(-1), (1.0 - damping) * t + damping * t_new, t)
            g_n = torch.where(step.unsqueeze(-1), (1.0 - damping) * n + damping * n_new, n)
            tau[idx], nu[idx] = g_t, g_n
            for k, (i, stepped) in enumerate(zip(rows, step.tolist())):
                acc = accs[i]
                if acc is None or not stepped:
                    continue
                plain[i] = (g_t[k].clone(), g_n[k].clone())
                first = not acc.r                 # an empty history: the step is the plain one, already in place
                nxt = acc.step(torch.cat([t[k], n[k]]), torch.cat([g_t[k], g_n[k]]))
                if first:
                    continue
                if bool(torch.isfinite(nxt).all()) and bool((nxt[:N] >= 0).all()):
                    tau[i], nu[i] = nxt[:N], nxt[N:]
                else:
                    plain[i] = None
                    acc.clear()
            sweeps[idx] += 1
            good[idx[~ok]] = False
            converged[idx[done]] = True
            active[idx[done]] = False
        # the evidence and its gradient at the final sites (recomputed only for rows that did not converge)
        rest = (~fin.kept).nonzero().flatten()
        if rest.numel():
            t, n = tau[rest], nu[rest]
            LB, Binv, mean, var, ok_r = _marginals(_rows_of(Kb, rest, rest.tolist()), t, n)
            tc = (1.0 / var - t).clamp_min(torch.finfo(Kb.dtype).tiny)
            mc = (mean / var - n) / tc
            lz, _, _ = _tilted(likelihood, yb[rest].reshape(-1), mc.reshape(-1), (1.0 / tc).reshape(-1), quad)
            fin.keep(rest, torch.ones_like(ok_r), LB, Binv, mean, var, tc, mc, lz.reshape(mc.shape))
            fin.ok[rest] = ok_r
        mean, var, tc, mc, sW = fin.mean, fin.var, fin.tc, fin.mc, tau.sqrt()
        log_z = (fin.lz.sum(-1) - fin.half_logdet + 0.5 * (nu * mean).sum(-1) + 0.5 * torch.log1p(tau / tc).sum(-1)
                 + ((mc * mc * tau * tc - 2.0 * mc * nu * tc - nu * nu) / (2.0 * (tau + tc))).sum(-1))
        ok = good & fin.ok & torch.isfinite(log_z)
        grad_k = None
        if gradient:                          # 0.5 (b b^T - R), R = S^1/2 B^-1 S^1/2, in place in the kept B^-1
            b = nu - tau * mean
            grad_k = fin.Binv.mul_(sW.unsqueeze(-1)).mul_(-0.5 * sW.unsqueeze(-2))   # -1/2 exact: two passes
            grad_k.baddbmm_(b.unsqueeze(-1), b.unsqueeze(-2), alpha=0.5)
            ok = ok & torch.isfinite(grad_k.sum((-2, -1)))     # a NaN or an infinity anywhere reaches the sum
            if not bool(ok.all()):
                grad_k[~ok] = 0.0
    log_z = torch.where(ok, log_z, torch.full_like(log_z, -float("inf")))
    return EPResult(log_z, grad_k, tau, nu, mean, var, sweeps, converged & ok, ok)
