r"""The multi-class likelihoods of K latent GPs -- softmax and robust-max -- and their expectations for CVI.

* :class:`Softmax`: :math:`p(y = k \mid \mathbf f) = e^{f_k} / \sum_j e^{f_j}`;
* :class:`RobustMax` (GPflow's robust-max, Hernández-Lobato et al. 2011): :math:`p(y = k \mid \mathbf f) = 1 - \epsilon`
  if :math:`k = \arg\max_j f_j`, else :math:`\epsilon / (K - 1)`.

Expectations for CVI
--------------------
Under the class-factorised variational family :math:`q(\mathbf f_n) = \mathcal N(\mathbf m_n, \operatorname{diag}\mathbf v_n)`
CVI (Khan & Lin 2017, eq. 13) needs :math:`E_n = \mathbb E_q[\log p(y_n \mid \mathbf f_n)]` and its derivatives in
:math:`m_{nk}` and :math:`v_{nk}`. Bonnet's and Price's theorems give, for the softmax,

.. math::

    \partial_{m_k} E = \mathbb 1[k = y] - \mathbb E_q[p_k(\mathbf f)],\qquad
    \partial_{v_k} E = -\tfrac12\,\mathbb E_q[p_k(\mathbf f)(1 - p_k(\mathbf f))] < 0,

so every site estimate has a negative second natural parameter. The estimators (``method``):

* ``"quadrature"``, softmax: everything is a function of the K - 1 differences :math:`d_j = f_j - f_y`
  (:math:`j \ne y`), :math:`\mathbf d \sim \mathcal N(\boldsymbol\mu, \operatorname{diag}(\mathbf v_{-y}) + v_y\mathbf 1\mathbf 1^\top)`,
  since :math:`\log p(y \mid \mathbf f) = -\log(1 + \sum_j e^{d_j})`. The (K-1)-dimensional integral is computed
  as an iterated integral over the conditionals :math:`d_i \mid d_{<i}` (a Cholesky factor of the covariance), each
  with the 1-D rule :class:`~gpvi.numerics.quadrature.Quadrature` (asinh-mapped Gauss-Legendre: accurate for every
  marginal variance), i.e. :math:`Q^{K-1}` nodes per site. K = 2 is exactly the logit case. Affordable for
  :math:`K \le 3` (``max_quadrature_classes``).
* ``"quadrature"``, robust-max: exact up to a 1-D rule, because
  :math:`P(y = \arg\max \mathbf f) = \mathbb E_{f_y}\big[\prod_{j\ne y}\Phi((f_y - m_j)/\sqrt{v_j})\big]` and
  :math:`E = \log(1-\epsilon)\,P + \log\tfrac{\epsilon}{K-1}\,(1 - P)`; the integral over :math:`f_y` is
  Gauss-Hermite with ``robust_points`` nodes (GPflow uses 20), its derivatives in :math:`m, v` are the exact
  derivatives of the rule (autograd).
* ``"mc"`` (softmax only): reparameterised draws :math:`\mathbf f = \mathbf m + \sqrt{\mathbf v}\odot\boldsymbol\varepsilon`
  from a ``torch.Generator``; :math:`\partial_v E` is the Price (Hessian) average, so sites stay valid. The
  robust-max likelihood is piecewise constant in :math:`\mathbf f` (its pathwise derivatives vanish), hence no
  Monte Carlo there.
* ``"fixed"`` (softmax): the same average over a **fixed** set of standard-normal points (a scrambled Sobol'
  sequence through the normal quantile function, :func:`fixed_draws`; common random numbers): a deterministic
  quasi-Monte Carlo approximation of the bound, for K > 3 where quadrature is too costly. Its
  :math:`\partial_v E` is Price's average, which is not the derivative of the rule's own value
  (:math:`\tfrac{1}{2\sqrt{v_k}}\operatorname{mean}_s[(\mathbf e_y - \mathbf p_s)_k\varepsilon_{sk}]`): the two agree
  to the rule's error, so CVI's fixed point is a stationary point of the reported bound only to that error (on
  digits, 300 rows, the monotone inner runs of MAP-II undo 10 of 195 steps for it). The exact derivative was
  tried (with an antithetic, whitened point set so that it stays finite as :math:`v \to 0`): MAP-II on the same
  digits split then needed 62 instead of 28 evaluations of theta (1.7x the time), so Price's form stays.

Names: ``m``, ``v`` (N, K) marginal means and variances, ``dm``, ``dv`` (N, K) the derivatives, ``y`` (N,) class
indices in 0..K-1, ``F`` latent values (..., K).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from ..linalg import cholesky_plain
from ..numerics.quadrature import Quadrature, _gauss_hermite
from ..numerics.softmax_rules import (_others, _workspace, default_quadrature, fixed_draws,
                                      nested_nodes, two_level_moments)
from ..rng import randn, resolve_generator
from ..validation import check_fraction, check_positive_int
from .likelihoods import Likelihood

__all__ = ["Softmax", "RobustMax", "MulticlassExpectations", "make_multiclass_likelihood"]

_SAMPLE_BLOCK_BYTES = 5 << 18
"""Bytes of one (K, n, S) block of the no-autograd softmax averages: 1.25 MiB, to stay in a 2 MiB L2 cache."""

_SHIFT_SAFE_SD = 15.0
r"""Largest marginal standard deviation for which the softmax averages shift by each site's largest mean instead of
each point's maximum: the fixed points have :math:`|\varepsilon| \le 8.2` (the normal quantile of the clamped
Sobol' points) and standard normal draws exceed 40 with probability below 1e-300, so
:math:`|f - c| \le 15 \cdot 40 = 600 < 709` and no exponential overflows or underflows to zero for the largest class."""


class MulticlassExpectations(NamedTuple):
    r"""Per site :math:`E_n` (N,), and :math:`\partial E_n/\partial m_{nk}`, :math:`\partial E_n/\partial v_{nk}` (N, K)."""

    value: torch.Tensor
    dm: torch.Tensor
    dv: torch.Tensor


def _check(y: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> None:
    if m.dim() != 2 or v.shape != m.shape or y.shape != m.shape[:1]:
        raise ValueError(f"y must be (N,) and m, v (N, K); got {tuple(y.shape)}, {tuple(m.shape)}, {tuple(v.shape)}")
    if m.shape[1] < 2:
        raise ValueError(f"need K >= 2 classes; got m with {m.shape[1]} column(s)")


class Softmax(Likelihood):
    r"""Softmax likelihood :math:`p(y = k \mid \mathbf f) = \operatorname{softmax}(\mathbf f)_k`.

    With :math:`\mathbf p = \operatorname{softmax}(\mathbf f)`: :math:`h = f_y - \log\sum_j e^{f_j}`,
    :math:`\nabla h = \mathbf e_y - \mathbf p`, :math:`\operatorname{diag}\nabla^2 h = -\mathbf p\odot(1 - \mathbf p)`.

    Examples
    --------
    >>> import torch
    >>> lik = Softmax()
    >>> h, g, d2 = lik.derivatives(torch.tensor([0]), torch.zeros(1, 2, dtype=torch.float64))
    >>> round(float(h), 6), g.tolist(), d2.tolist()
    (-0.693147, [[0.5, -0.5]], [[-0.25, -0.25]])
    """

    name = "softmax"
    binary = False
    multiclass = True

    def derivatives(self, y: torch.Tensor, F: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r"""``(h, grad, diag Hessian)`` of :math:`h(\mathbf f) = \log p(y \mid \mathbf f)`; ``F`` (..., K), ``y`` (...)."""
        logp = torch.log_softmax(F, -1)
        p = torch.exp(logp)
        onehot = torch.nn.functional.one_hot(y.long(), F.shape[-1]).to(F)
        h = (logp * onehot).sum(-1)
        return h, onehot - p, -p * (1.0 - p)

    def log_prob(self, y: torch.Tensor, F: torch.Tensor) -> torch.Tensor:
        return self.derivatives(y, F)[0]

    def probs(self, F: torch.Tensor) -> torch.Tensor:
        """:math:`p(y = k \\mid \\mathbf f)` for every k, ``(..., K)``."""
        return torch.softmax(F, -1)

    def has_quadrature(self, num_classes: int, max_classes: int) -> bool:
        return num_classes <= max_classes

    # ------------------------------------------------------------------ expectations
    @staticmethod
    def _differences(y: torch.Tensor, m: torch.Tensor, v: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The differences d = f_{-y} - f_y: their means (N, K-1), the Cholesky factors of their covariances
        (N, K-1, K-1) and the classes they belong to (N, K-1)."""
        N, K = m.shape
        oth = _others(y, K)
        my, vy = m.gather(1, y.unsqueeze(-1)), v.gather(1, y.unsqueeze(-1))
        mu = m.gather(1, oth) - my
        cov = torch.diag_embed(v.gather(1, oth)) + vy.unsqueeze(-1)
        Lc, ok = cholesky_plain(cov)
        if not bool(ok.all()):                     # a zero variance: fall back to square roots of the diagonal
            Lc = torch.where((~ok).view(-1, 1, 1), torch.diag_embed(torch.sqrt(cov.diagonal(dim1=-2, dim2=-1)
                                                                                     .clamp_min(0.0))), Lc)
        return mu, Lc, oth

    def _reference_moments(self, y: torch.Tensor, m: torch.Tensor, v: torch.Tensor, quadrature: Quadrature):
        """Nodes in the differences d = f_{-y} - f_y: returns (d (K-1, N, P), w (N, P), others (N, K-1))."""
        mu, Lc, oth = self._differences(y, m, v)
        d, w = nested_nodes(mu, Lc, quadrature)
        return d, w, oth

    def _rule_moments(self, y: torch.Tensor, m: torch.Tensor, v: torch.Tensor, quadrature: Quadrature
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r"""The rule's :math:`\mathbb E[\log p_y]` (N,), :math:`\mathbb E[p]`, :math:`\mathbb E[p(1-p)]` (N, K) in the
        classes' own columns: :func:`two_level_moments` for K <= 3, else :func:`nested_nodes` with
        :meth:`_quadrature_moments` (the same rule and numbers, to rounding)."""
        mu, Lc, oth = self._differences(y, m, v)
        if mu.shape[1] <= 2:
            value, Ep, Eq = two_level_moments(mu, Lc, quadrature)
        else:
            value, Ep, Eq = self._quadrature_moments(*nested_nodes(mu, Lc, quadrature))
        idx = torch.cat([y.unsqueeze(-1), oth], 1)
        return value, torch.empty_like(m).scatter_(1, idx, Ep), torch.empty_like(m).scatter_(1, idx, Eq)

    @staticmethod
    def _quadrature_moments(d: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r"""From nodes ``d`` (K-1, N, P) of the differences and weights ``w`` (N, P): :math:`\mathbb E[\log p_y]` (N,),
        :math:`\mathbb E[p]` and :math:`\mathbb E[p(1-p)]` (N, K) with class y in column 0, the others after it.

        One exponential per node and difference and one logarithm per node: with :math:`\mu = \max(0, \max_j d_j)`,
        :math:`e_0 = e^{-\mu}`, :math:`e_j = e^{d_j - \mu}` and :math:`s = e_0 + \sum_j e_j`, the class probabilities
        are :math:`e_j / s` (:math:`e_0/s` for y), :math:`1 - p_j = (s - e_j)/s` and
        :math:`\log(1 + \sum_j e^{d_j}) = \mu + \log s`.

        Without autograd the arrays live in a reused scratch buffer (:func:`_workspace`): the same arithmetic with
        no fresh (N, P) allocation per call (K = 3, N = 105, 784 nodes: 1,700 page faults per call before)."""
        if not (torch.is_grad_enabled() and (d.requires_grad or w.requires_grad)):
            return Softmax._quadrature_moments_inplace(d, w)
        mx = d.amax(0).clamp_min(0.0)                               # d is (K-1, N, P): contiguous per class
        ex = torch.exp(d - mx)
        e0 = torch.exp(-mx)
        rest = ex.sum(0)
        den = e0 + rest
        r = w / den                                                 # weight / s
        rr = r / den                                                # weight / s^2
        value = -(w * (mx + torch.log(den))).sum(-1)
        Ep = torch.cat([(e0 * r).sum(-1).unsqueeze(0), (ex * r).sum(-1)], 0).T
        Eq = torch.cat([(e0 * rest * rr).sum(-1).unsqueeze(0), (ex * (den - ex) * rr).sum(-1)], 0).T
        return value, Ep, Eq

    @staticmethod
    def _quadrature_moments_inplace(d: torch.Tensor, w: torch.Tensor
                                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`_quadrature_moments` in a scratch buffer (no autograd): (K-1 + 5) arrays of (N, P), one pass each."""
        D, N, P = d.shape
        work = _workspace((D + 5) * N * P, d)
        ex = work[:D * N * P].view(D, N, P)
        mx, e0, den, t, r = (work[(D + i) * N * P:(D + i + 1) * N * P].view(N, P) for i in range(5))
        torch.amax(d, 0, out=mx).clamp_min_(0.0)
        torch.sub(d, mx, out=ex).exp_()                                 # e_j
        torch.neg(mx, out=e0).exp_()                                    # e_0
        torch.sum(ex, 0, out=den)                                       # sum_j e_j
        torch.mul(den, e0, out=t)                                       # e_0 (s - e_0)
        den.add_(e0)                                                    # s
        value = -torch.log(den, out=r).add_(mx).mul_(w).sum(-1)
        torch.div(w, den, out=r)                                        # weight / s
        Ep, Eq = [torch.mul(e0, r, out=mx).sum(-1)], [t.mul_(r).div_(den).sum(-1)]
        for j in range(D):
            torch.mul(ex[j], r, out=e0)                                 # weight p_j
            Ep.append(e0.sum(-1))
            Eq.append(torch.sub(den, ex[j], out=mx).mul_(e0).div_(den).sum(-1))
        return value, torch.stack(Ep, -1), torch.stack(Eq, -1)

    @staticmethod
    def _sample_moments(y: torch.Tensor | None, m: torch.Tensor, v: torch.Tensor, eps: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r"""Averages over the points :math:`\mathbf f_s = \mathbf m + \sqrt{\mathbf v}\odot\boldsymbol\varepsilon_s`:
        :math:`\operatorname{mean}_s \log p_y(\mathbf f_s)` (N,; zeros when ``y`` is None), and the means of
        :math:`\mathbf p(\mathbf f_s)` and of :math:`\mathbf p\odot(1 - \mathbf p)` (N, K).

        ``eps`` is (S, K) (the same points for every site) or (N, S, K). The work runs class-major, on (K, N, S)
        blocks, so that every softmax reduction over the K classes is an elementwise pass over contiguous memory
        (``torch.log_softmax`` over a short last dimension ran about 8x slower at N = 210, S = 1,024, K = 10)."""
        N, K = m.shape
        E = eps.T.unsqueeze(1) if eps.dim() == 2 else eps.permute(2, 0, 1)
        sd = torch.sqrt(v.clamp_min(0.0))
        S = E.shape[-1]
        if torch.is_grad_enabled() and (m.requires_grad or v.requires_grad):    # differentiable, out of place
            logp = torch.log_softmax(torch.addcmul(m.T.unsqueeze(-1), sd.T.unsqueeze(-1), E), 0)
            p = torch.exp(logp)
            value = (logp.gather(0, y.view(1, N, 1).expand(1, N, S)).squeeze(0).mean(-1) if y is not None
                     else m.new_zeros(N))
            return value, p.mean(-1).T, (p * (1.0 - p)).mean(-1).T
        # no autograd: in the reused scratch buffer, a few sites at a time (each block of K x n x S stays in cache)
        n = max(1, min(N, _SAMPLE_BLOCK_BYTES // (K * S * m.element_size())))
        work = _workspace((K + 2) * n * S, m)
        value, Ep, Eq = m.new_zeros(N), m.new_empty(K, N), m.new_empty(K, N)
        per_point_max = bool(sd.amax() > _SHIFT_SAFE_SD) if N else False
        for i in range(0, N, n):
            j = min(N, i + n)
            Softmax._sample_block(None if y is None else y[i:j], m[i:j], sd[i:j], E[:, i:j] if E.shape[1] > 1 else E,
                                  work, per_point_max, value[i:j], Ep[:, i:j], Eq[:, i:j])
        return value, Ep.T, Eq.T

    @staticmethod
    def _sample_block(y: torch.Tensor | None, m: torch.Tensor, sd: torch.Tensor, E: torch.Tensor,
                      work: torch.Tensor, per_point_max: bool, value: torch.Tensor, Ep: torch.Tensor,
                      Eq: torch.Tensor) -> None:
        r""":meth:`_sample_moments` for one block of n sites, in place in ``work``, into ``value`` (n,), ``Ep`` and
        ``Eq`` (K, n). The softmax is shifted by each site's largest mean :math:`c_n = \max_k m_{nk}` (one
        number per site: no pass over the points for a maximum), safe while
        :math:`|f_{snk} - c_n| \le \sqrt{v_{nk}}\,|\varepsilon| < 700`; with a standard deviation above
        ``_SHIFT_SAFE_SD`` the caller asks for the per-point maximum instead."""
        K, n = Ep.shape
        S = E.shape[-1]
        F = work[:K * n * S].view(K, n, S)
        Fy, sm = (work[(K + i) * n * S:(K + i + 1) * n * S].view(n, S) for i in range(2))
        if per_point_max:
            torch.addcmul(m.T.unsqueeze(-1), sd.T.unsqueeze(-1), E, out=F)             # f_s, (K, n, S)
            F.sub_(torch.amax(F, 0, out=sm))
        else:
            torch.addcmul((m - m.amax(1, keepdim=True)).T.unsqueeze(-1), sd.T.unsqueeze(-1), E, out=F)
        if y is not None:
            torch.gather(F, 0, y.view(1, n, 1).expand(1, n, S), out=Fy.unsqueeze(0))   # f_y - shift
        F.exp_()
        torch.sum(F, 0, out=sm)
        if y is not None:
            torch.mean(Fy.sub_(torch.log(sm)), -1, out=value)                          # log p_y
        F.mul_(sm.reciprocal_())                                                        # probabilities p_k(f_s)
        torch.mean(F, -1, out=Ep)
        torch.mean(F.addcmul_(F, F, value=-1.0), -1, out=Eq)                           # p - p^2 >= 0 in floating point

    def expected_log_lik(self, y: torch.Tensor, m: torch.Tensor, v: torch.Tensor, *, method: str = "quadrature",
                         quadrature: Quadrature | None = None, num_draws: int = 10,
                         generator: torch.Generator | None = None, **_: Any) -> MulticlassExpectations:
        r""":math:`E_n`, :math:`\partial_m E_n`, :math:`\partial_v E_n` by ``method`` (see the module docstring)."""
        _check(y, m, v)
        N, K = m.shape
        if method == "quadrature":
            value, Ep_k, Eq_k = self._rule_moments(y, m, v, quadrature if quadrature is not None
                                                   else default_quadrature(K))
        else:
            if method == "mc":
                gen = resolve_generator(None, generator)
                eps = randn((N, check_positive_int(num_draws, "num_draws"), K), gen, dtype=m.dtype, device=m.device)
            elif method == "fixed":
                eps = fixed_draws(num_draws, K, m)
                eps = eps.unsqueeze(0).expand(N, -1, -1)
            else:
                raise ValueError(f"method must be 'quadrature', 'mc' or 'fixed'; got {method!r}")
            value, Ep_k, Eq_k = self._sample_moments(y, m, v, eps)
        onehot = torch.nn.functional.one_hot(y, K).to(m)
        return MulticlassExpectations(value, onehot - Ep_k, -0.5 * Eq_k)

    def predict_proba(self, m: torch.Tensor, v: torch.Tensor, *, quadrature: Quadrature | None = None,
                      num_draws: int = 4096, max_quadrature_classes: int = 3) -> torch.Tensor:
        r""":math:`\mathbb E_{\mathcal N(\mathbf m, \operatorname{diag}\mathbf v)}[\operatorname{softmax}(\mathbf f)]`, rows normalised.

        By the quadrature of :meth:`expected_log_lik` when :math:`K \le` ``max_quadrature_classes``, else by
        ``num_draws`` fixed quasi-Monte Carlo points (:func:`fixed_draws`).
        """
        M, K = m.shape
        if K <= max_quadrature_classes:
            y = torch.zeros(M, dtype=torch.long, device=m.device)
            p = self._rule_moments(y, m, v, quadrature if quadrature is not None else default_quadrature(K))[1]
        else:
            p = self._sample_moments(None, m, v, fixed_draws(num_draws, K, m))[1]
        p = p.clamp_min(0.0)
        return p / p.sum(-1, keepdim=True)

    def spec(self) -> dict[str, Any]:
        return {"name": self.name}


class RobustMax(Likelihood):
    r"""Robust-max likelihood: :math:`p(y \mid \mathbf f) = 1 - \epsilon` if :math:`y = \arg\max_k f_k`, else :math:`\epsilon/(K-1)`.

    Parameters
    ----------
    epsilon : float
        Label-noise probability in (0, 1) (default 1e-3, GPflow's).
    num_points : int
        Gauss-Hermite nodes of the 1-D integral over :math:`f_y` (default 64).

    Examples
    --------
    >>> import torch
    >>> lik = RobustMax(0.1)
    >>> [round(x, 6) for x in lik.probs(torch.tensor([[0.0, 2.0, 1.0]], dtype=torch.float64))[0].tolist()]
    [0.05, 0.9, 0.05]
    """

    name = "robustmax"
    binary = False
    multiclass = True

    def __init__(self, epsilon: float = 1e-3, num_points: int = 64) -> None:
        self.epsilon = check_fraction(epsilon, "epsilon", high_closed=False)
        self.num_points = check_positive_int(num_points, "num_points", minimum=2)

    def _logs(self, K: int) -> tuple[float, float]:
        return math.log1p(-self.epsilon), math.log(self.epsilon / (K - 1))

    def probs(self, F: torch.Tensor) -> torch.Tensor:
        K = F.shape[-1]
        top = torch.nn.functional.one_hot(F.argmax(-1), K).to(F)
        return top * (1.0 - self.epsilon) + (1.0 - top) * (self.epsilon / (K - 1))

    def derivatives(self, y: torch.Tensor, F: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(h, 0, 0)``: the log-likelihood is piecewise constant in ``F``."""
        hi, lo = self._logs(F.shape[-1])
        h = torch.where(F.argmax(-1) == y.long(), torch.full_like(F[..., 0], hi), torch.full_like(F[..., 0], lo))
        return h, torch.zeros_like(F), torch.zeros_like(F)

    def log_prob(self, y: torch.Tensor, F: torch.Tensor) -> torch.Tensor:
        return self.derivatives(y, F)[0]

    def has_quadrature(self, num_classes: int, max_classes: int) -> bool:
        return True

    def prob_argmax(self, y: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        r""":math:`P(y_n = \arg\max_k f_{nk})` under :math:`\mathcal N(\mathbf m_n, \operatorname{diag}\mathbf v_n)`, (N,).

        :math:`\mathbb E_{f_y}[\prod_{j\ne y}\Phi((f_y - m_j)/\sqrt{v_j})]` by Gauss-Hermite; differentiable.
        """
        N, K = m.shape
        x, wq = _gauss_hermite(self.num_points)
        xt = torch.as_tensor(x, dtype=m.dtype, device=m.device)
        wt = torch.as_tensor(wq, dtype=m.dtype, device=m.device)
        my, vy = m.gather(1, y.unsqueeze(-1)), v.gather(1, y.unsqueeze(-1))
        fy = my + torch.sqrt(vy.clamp_min(1e-300)) * xt                           # (N, Q)
        oth = _others(y, K)
        mo, so = m.gather(1, oth), torch.sqrt(v.gather(1, oth).clamp_min(1e-300))
        logphi = torch.special.log_ndtr((fy.unsqueeze(-1) - mo.unsqueeze(1)) / so.unsqueeze(1)).sum(-1)
        return (wt * torch.exp(logphi)).sum(-1)

    def expected_log_lik(self, y: torch.Tensor, m: torch.Tensor, v: torch.Tensor, *, method: str = "quadrature",
                         **_: Any) -> MulticlassExpectations:
        r""":math:`E_n = \log(1-\epsilon)P_n + \log\tfrac{\epsilon}{K-1}(1 - P_n)` and its exact derivatives (1-D rule)."""
        _check(y, m, v)
        if method != "quadrature":
            raise ValueError(f"the robust-max likelihood has expectations by quadrature only (its pathwise "
                             f"derivatives vanish); got estimator {method!r}")
        hi, lo = self._logs(m.shape[1])
        with torch.enable_grad():
            mm = m.detach().clone().requires_grad_(True)
            vv = v.detach().clone().requires_grad_(True)
            P = self.prob_argmax(y, mm, vv)
            dPm, dPv = torch.autograd.grad(P.sum(), (mm, vv))
        P = P.detach()
        return MulticlassExpectations(lo + (hi - lo) * P, (hi - lo) * dPm, (hi - lo) * dPv)

    def predict_proba(self, m: torch.Tensor, v: torch.Tensor, **_: Any) -> torch.Tensor:
        r""":math:`(1-\epsilon)P_k + \tfrac{\epsilon}{K-1}(1 - P_k)` with :math:`P_k = P(k = \arg\max \mathbf f)`; rows normalised."""
        M, K = m.shape
        P = torch.stack([self.prob_argmax(torch.full((M,), k, dtype=torch.long, device=m.device), m, v)
                         for k in range(K)], -1)
        p = (1.0 - self.epsilon) * P + self.epsilon / (K - 1) * (1.0 - P)
        return p / p.sum(-1, keepdim=True)

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "epsilon": self.epsilon, "num_points": self.num_points}

    def __repr__(self) -> str:
        return f"RobustMax(epsilon={self.epsilon:g})"


def make_multiclass_likelihood(likelihood: Any) -> Likelihood:
    """``"softmax"``, ``"robustmax"``, a spec dict, or a :class:`Softmax` / :class:`RobustMax` object."""
    if isinstance(likelihood, dict):
        spec = dict(likelihood)
        name = spec.pop("name", None)
        if name == "robustmax":
            return RobustMax(**spec)
        likelihood = name
    if isinstance(likelihood, str):
        if likelihood == "softmax":
            return Softmax()
        if likelihood == "robustmax":
            return RobustMax()
        raise ValueError(f"likelihood must be 'softmax' or 'robustmax'; got {likelihood!r}")
    if isinstance(likelihood, (Softmax, RobustMax)):
        return likelihood
    raise TypeError(f"likelihood must be 'softmax', 'robustmax', Softmax() or RobustMax(); got "
                    f"{type(likelihood).__name__}")
