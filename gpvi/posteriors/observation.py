r"""The predictive of new targets under a non-Gaussian likelihood: counts, outliers, proportions (issue 60).

Given the Gaussian :math:`q(f_*) = \mathcal N(m_*, v_*)` of the latent value at a test input (CVI's
:meth:`~gpvi.posteriors.latent.LatentPosterior.predict_latent`) and the likelihood's :math:`p(y \mid f)`
(``likelihood.response(f)``, a ``torch.distributions`` object), the predictive of :math:`y_*` is the continuous
mixture

.. math::

    p(y_* \mid \mathcal D) = \int p(y_* \mid f_*)\,\mathcal N(f_* \mid m_*, v_*)\,df_*
    \approx \sum_k w_k\,p(y_* \mid f_k),

by the quadrature rule (nodes :math:`f_k`, weights :math:`w_k`; :class:`gpvi.numerics.quadrature.Quadrature`).

* **Moments.** :math:`\mathbb E[y_*] = \mathbb E_q[\mu(f_*)]` and
  :math:`\operatorname{Var}[y_*] = \mathbb E_q[\sigma^2(f_*)] + \operatorname{Var}_q[\mu(f_*)]` with the
  conditional mean :math:`\mu(f)` and variance :math:`\sigma^2(f)`; in closed form where they exist, with
  :math:`\mathbb E[e^{f}] = e^{m + v/2}`, :math:`\mathbb E[e^{2f}] = e^{2m + 2v}`:
  Poisson :math:`\mathbb E y = e^{m + v/2}`, :math:`\operatorname{Var} y = e^{m + v/2} + (e^v - 1)e^{2m + v}`;
  negative binomial the same mean and :math:`e^{m + v/2} + (1 + 1/r)e^{2m + 2v} - e^{2m + v}`; Student-t
  :math:`m` and :math:`v + \sigma^2\nu/(\nu - 2)` (infinite for :math:`\nu \le 2`, no mean for :math:`\nu \le 1`);
  Laplace :math:`m` and :math:`v + 2b^2`. Otherwise (Beta, GPyTorch likelihoods) by the rule.
* **Log density** :math:`\log\sum_k w_k\,p(y_* \mid f_k)` by ``logsumexp`` (never averaging densities).
  Laplace: log density and CDF in closed form (the Gaussian convolved with the Laplace), as a rule over its kink
  at :math:`f = y` errs by ~1e-3.
* **CDF and quantiles.** :math:`F(y) = \sum_k w_k F(y \mid f_k)` with the conditional CDF: Poisson
  :math:`Q(\lfloor y\rfloor + 1, e^f)` (``torch.special.gammaincc``), negative binomial
  :math:`I_{r/(r + \mu)}(r, \lfloor y\rfloor + 1)`, Student-t and Beta through ``scipy.special`` (``stdtr``,
  ``betainc``; on the CPU, then back to the data's device), a GPyTorch likelihood's
  distribution through its ``cdf`` where it has one. The :math:`p`-quantile is the smallest :math:`y` with
  :math:`F(y) \ge p`: for counts an **integer**, by bisection over the integers; otherwise by bisection on
  :math:`F` to :math:`10^{-10}` relative, after widening a bracket around :math:`m_*` until it holds the level.

Accuracy: with the default rule (96 asinh-mapped Gauss-Legendre nodes on :math:`m_* \pm 8.5\sqrt{v_*}`) the log
density and CDF are exact to about 1e-10 when :math:`p(y \mid f)` bends in :math:`f` on a scale not much narrower
than :math:`\sqrt{v_*}`; for a Student-t or Laplace scale :math:`\ll \sqrt{v_*}` pass more nodes
(``quadrature=Quadrature(512)``).

Names: ``m``, ``v`` the latent predictive mean and variance (shape (n,)), ``f``, ``w`` nodes and weights (Q, n).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.special
import torch
from torch import distributions as td

from ..numerics.predictive import at_levels, central_interval
from ..numerics.quadrature import Quadrature
from ..validation import as_float_tensor

__all__ = ["ObservationPredictive"]

_BISECTION_STEPS = 200
_RTOL = 1e-10


def _scipy(fn: Any, *args: torch.Tensor) -> torch.Tensor:
    """``fn`` of tensors through scipy on the CPU, returned on the first argument's device and dtype."""
    like = args[0]
    out = fn(*np.broadcast_arrays(*(a.detach().cpu().numpy() for a in args)))
    return torch.as_tensor(out, dtype=like.dtype, device=like.device)


def _conditional_cdf(dist: Any, y: torch.Tensor) -> torch.Tensor:
    """:math:`P(Y \\le y \\mid f)` for the conditional distribution ``dist``, broadcasting ``y`` against its batch."""
    if isinstance(dist, td.Poisson):
        k, rate = torch.broadcast_tensors(torch.floor(y), dist.rate)
        out = torch.special.gammaincc((k + 1.0).clamp_min(1.0), rate)
        return torch.where(k < 0, torch.zeros_like(out), out)
    if isinstance(dist, td.NegativeBinomial):
        k, r, logits = torch.broadcast_tensors(torch.floor(y), dist.total_count, dist.logits)
        out = _scipy(scipy.special.betainc, r, (k + 1.0).clamp_min(1.0), torch.sigmoid(-logits))   # p = r/(r + mu)
        return torch.where(k < 0, torch.zeros_like(out), out)
    if isinstance(dist, td.StudentT):
        z = (y - dist.loc) / dist.scale
        return _scipy(scipy.special.stdtr, *torch.broadcast_tensors(dist.df, z))
    if isinstance(dist, td.Beta):
        a, b, yy = torch.broadcast_tensors(dist.concentration1, dist.concentration0, y.clamp(0.0, 1.0))
        return _scipy(scipy.special.betainc, a, b, yy)
    try:
        return dist.cdf(y)
    except NotImplementedError:
        raise TypeError(f"the predictive's CDF and quantiles need the conditional CDF of the likelihood's "
                        f"distribution, and {type(dist).__name__} has none") from None


def _is_discrete(dist: Any) -> bool:
    support = getattr(dist, "support", None)
    return bool(getattr(support, "is_discrete", False))


class ObservationPredictive:
    r"""The predictive distribution of new targets :math:`y_*`, one per test point, by quadrature over :math:`f_*`.

    What :meth:`LatentPosterior.predict <gpvi.posteriors.latent.LatentPosterior.predict>` returns for a
    non-binary likelihood (:class:`gpvi.GPGeneralisedRegression`). It works with ``gpvi.metrics`` (``mean``,
    ``log_prob``). The formulas and their accuracy: the module docstring.

    Parameters
    ----------
    likelihood : Likelihood
        With ``response(f)`` (:mod:`gpvi.models.latent_likelihoods`, or a GPyTorch likelihood's ``forward``).
    latent_mean, latent_var : torch.Tensor of shape (n,)
        :math:`m_*` and :math:`v_* \ge 0` of :math:`q(f_*)`.
    quadrature : Quadrature, optional
        The rule over :math:`f_*` (default ``Quadrature()``, 96 nodes).

    Attributes
    ----------
    latent_mean, latent_var : torch.Tensor of shape (n,)
    discrete : bool
        Whether the targets are counts (integer quantiles).

    Examples
    --------
    >>> import torch
    >>> from gpvi.models.latent_likelihoods import Poisson
    >>> m, v = torch.tensor([1.0], dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64)
    >>> pred = ObservationPredictive(Poisson(), m, v)
    >>> round(float(pred.mean), 6), round(float(torch.exp(m + v / 2)), 6)
    (3.490343, 3.490343)
    >>> pred.interval(0.9)[1].tolist()        # an integer count
    [10.0]
    """

    def __init__(self, likelihood: Any, latent_mean: torch.Tensor, latent_var: torch.Tensor,
                 quadrature: Quadrature | None = None) -> None:
        if not hasattr(likelihood, "response"):
            raise TypeError(f"likelihood {getattr(likelihood, 'name', likelihood)!r} has no response(f): "
                            f"the predictive of targets needs p(y | f) as a distribution")
        if latent_mean.shape != latent_var.shape or latent_mean.dim() != 1:
            raise ValueError(f"latent_mean and latent_var must have equal shape (n,); got "
                             f"{tuple(latent_mean.shape)} and {tuple(latent_var.shape)}")
        self.likelihood = likelihood
        self.latent_mean = latent_mean.detach()
        self.latent_var = latent_var.detach().clamp_min(0.0)
        self.quadrature = quadrature if quadrature is not None else Quadrature()
        self._f, self._w = self.quadrature.nodes_by_node(self.latent_mean, self.latent_var)     # (Q, n)
        self.discrete = _is_discrete(likelihood.response(self.latent_mean))

    @property
    def num_points(self) -> int:
        """The number of test points n."""
        return self.latent_mean.shape[0]

    def _moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        m, v = self.latent_mean, self.latent_var
        name = getattr(self.likelihood, "name", "")
        if name in ("poisson", "negative_binomial"):
            mean = torch.exp(m + 0.5 * v)
            second = torch.exp(2.0 * m + 2.0 * v)                         # E[mu^2]
            extra = second / self.likelihood.dispersion if name == "negative_binomial" else 0.0
            return mean, mean + extra + second - mean * mean
        if name == "student_t":
            nu, s = self.likelihood.df, self.likelihood.scale
            mean = m if nu > 1 else torch.full_like(m, math.nan)
            return mean, v + (s * s * nu / (nu - 2.0) if nu > 2 else math.inf)
        if name == "laplace":
            return m, v + 2.0 * self.likelihood.scale ** 2
        dist = self.likelihood.response(self._f)
        mu, var = dist.mean, dist.variance
        mean = (self._w * mu).sum(0)
        return mean, (self._w * (var + mu * mu)).sum(0) - mean * mean

    @property
    def mean(self) -> torch.Tensor:
        r""":math:`\mathbb E[y_*]`, shape (n,) (closed form where it exists, else the rule)."""
        return self._moments()[0]

    @property
    def var(self) -> torch.Tensor:
        r""":math:`\operatorname{Var}[y_*]` (law of total variance), shape (n,)."""
        return self._moments()[1]

    @property
    def stddev(self) -> torch.Tensor:
        """Predictive standard deviation, shape (n,)."""
        return self.var.sqrt()

    def _targets(self, y: Any) -> torch.Tensor:
        y = as_float_tensor(y, "y", ndim=1, device=self.latent_mean.device)
        if y.shape[0] != self.num_points:
            raise ValueError(f"y has {y.shape[0]} values but the predictive has {self.num_points} points")
        return y

    def _laplace(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r"""For the Laplace likelihood, whose kink at :math:`f = y` a rule resolves only to ~1e-3: with
        :math:`d = y - m`, :math:`s = \sqrt v`, ``(a, c, Phi(d/s))`` where
        :math:`a = \tfrac{v}{2b^2} - \tfrac db + \log\Phi(\tfrac{d - v/b}{s})`,
        :math:`c = \tfrac{v}{2b^2} + \tfrac db + \log\Phi(-\tfrac{d + v/b}{s})`; then
        :math:`p(y) = (e^a + e^c)/2b` and :math:`F(y) = \Phi(d/s) - \tfrac12 e^a + \tfrac12 e^c` (the Gaussian
        convolved with the Laplace, in closed form)."""
        b = self.likelihood.scale
        v = self.latent_var.clamp_min(torch.finfo(y.dtype).tiny)
        s, d = v.sqrt(), y - self.latent_mean
        e = v / (2.0 * b * b)
        a = e - d / b + torch.special.log_ndtr((d - v / b) / s)
        c = e + d / b + torch.special.log_ndtr(-(d + v / b) / s)
        return a, c, torch.special.ndtr(d / s)

    def log_prob(self, y: Any) -> torch.Tensor:
        r"""Log predictive density (or mass, for counts) of each test target, :math:`\log\sum_k w_k p(y_i\mid f_k)`,
        shape (n,) (Laplace: the closed form of :meth:`_laplace`)."""
        y = self._targets(y)
        if getattr(self.likelihood, "name", "") == "laplace":
            a, c, _ = self._laplace(y)
            return torch.logaddexp(a, c) - math.log(2.0 * self.likelihood.scale)
        h = self.likelihood.response(self._f).log_prob(y.expand_as(self._f))
        return torch.logsumexp(torch.log(self._w) + h, dim=0)

    def _cdf(self, y: torch.Tensor) -> torch.Tensor:
        """The mixture CDF at ``y`` of shape (..., n) (Laplace: the closed form of :meth:`_laplace`)."""
        if getattr(self.likelihood, "name", "") == "laplace":
            a, c, phi = self._laplace(y)
            return (phi - 0.5 * torch.exp(a) + 0.5 * torch.exp(c)).clamp(0.0, 1.0)
        dist = self.likelihood.response(self._f)                             # batch (Q, n)
        c = _conditional_cdf(dist, y.unsqueeze(-2))                          # (..., Q, n)
        return (self._w * c).sum(-2).clamp(0.0, 1.0)

    def cdf(self, y: Any) -> torch.Tensor:
        r"""Predictive CDF :math:`P(y_* \le y_i \mid \mathcal D)`, shape (n,)."""
        return self._cdf(self._targets(y))

    def quantile(self, p: Any) -> torch.Tensor:
        """Predictive quantiles at the levels ``p`` (:func:`gpvi.numerics.predictive.at_levels`: shape (n,) for one
        level, (len(p), n) for several): the smallest ``y`` with ``cdf(y) >= p``, an integer for counts."""
        return at_levels(p, self._quantiles)

    def _quantiles(self, probs: torch.Tensor) -> torch.Tensor:
        m, sd = self.latent_mean, self.latent_var.sqrt()
        target = probs.to(m).unsqueeze(-1).expand(-1, self.num_points)      # (P, n)
        if self.discrete:
            lo = torch.full_like(target, -1.0)                               # F(-1) = 0 < p
            hi = torch.ones_like(target)
            for _ in range(64):                                              # F(hi) >= p
                short = self._cdf(hi) < target
                if not bool(short.any()):
                    break
                hi = torch.where(short, 2.0 * hi, hi)
            while bool((hi - lo > 1).any()):                                 # invariant F(lo) < p <= F(hi)
                mid = torch.floor(0.5 * (lo + hi))
                up = self._cdf(mid) >= target
                hi, lo = torch.where(up, mid, hi), torch.where(up, lo, mid)
            return hi
        support = getattr(self.likelihood.response(m), "support", None)
        if support is td.constraints.unit_interval or getattr(self.likelihood, "name", "") == "beta":
            lo, hi = torch.zeros_like(target), torch.ones_like(target)
        else:
            half = (sd + 1.0).expand_as(target)
            lo, hi = m - half, m + half
            for _ in range(200):
                below, above = self._cdf(lo) > target, self._cdf(hi) < target
                if not bool((below | above).any()):
                    break
                lo, hi = torch.where(below, lo - 2.0 * half, lo), torch.where(above, hi + 2.0 * half, hi)
                half = 2.0 * half
        scale = (hi - lo).abs()
        for _ in range(_BISECTION_STEPS):
            if not bool((hi - lo > _RTOL * scale).any()):
                break
            mid = 0.5 * (lo + hi)
            up = self._cdf(mid) >= target
            hi, lo = torch.where(up, mid, hi), torch.where(up, lo, mid)
        return 0.5 * (lo + hi)

    def interval(self, level: float = 0.9) -> tuple[torch.Tensor, torch.Tensor]:
        """Central predictive interval holding at least mass ``level`` at each test point: the
        ``(1 - level)/2`` and ``(1 + level)/2`` quantiles (integers for counts, and then ``[lower, upper]`` holds
        at least ``level``: :math:`F(\text{upper}) - F(\text{lower} - 1) > \tfrac{1 + \text{level}}2 -
        \tfrac{1 - \text{level}}2`).

        Returns
        -------
        lower, upper : torch.Tensor of shape (n,)
        """
        return central_interval(self.quantile, level)

    def __repr__(self) -> str:
        return (f"ObservationPredictive(likelihood={getattr(self.likelihood, 'name', self.likelihood)!r}, "
                f"n={self.num_points})")
