r"""Site likelihoods beyond classification: counts, outliers and proportions (issue 60), for CVI on a latent GP.

Each is :math:`p(y_n \mid f_n)` with the latent value :math:`f_n` of a GP and gives what CVI needs (Khan & Lin 2017,
eq. 13, through :func:`gpvi.models.likelihoods.expected_log_lik`): :math:`h(f) = \log p(y \mid f)` with its first
two derivatives in :math:`f`, exactly, and the expectations :math:`\mathbb E_{\mathcal N(m, v)}[h]` with their
:math:`m, v` derivatives in closed form where they exist (Poisson, Laplace); otherwise by the quadrature rule.

* :class:`Poisson` -- counts, log link: :math:`y \sim \mathrm{Poisson}(e^f)`; log-concave, closed form.
* :class:`NegativeBinomial` -- over-dispersed counts, log link: mean :math:`e^f`, dispersion :math:`r`
  (variance :math:`\mu + \mu^2/r`); log-concave.
* :class:`StudentT` -- regression with outliers: :math:`y = f + \sigma\,t_\nu`; **not** log-concave
  (:math:`h'' > 0` where :math:`|y - f| > \sigma\sqrt\nu`): CVI's site precisions can turn negative there, see
  :func:`gpvi.numerics.sites.update_sites` and :class:`gpvi.models.generalised.GPGeneralisedRegression`.
* :class:`Laplace` -- regression with heavy-ish tails: :math:`y = f + b\,\mathrm{Laplace}(0, 1)`; log-concave but
  with a kink at :math:`f = y` (:math:`h'' = 0` elsewhere), so only its closed form is used (a rule over
  :math:`h''` would miss the kink).
* :class:`Beta` -- proportions in (0, 1), GPyTorch's ``BetaLikelihood`` exactly.

Each also gives ``response(f)``, :math:`p(y \mid f)` as a ``torch.distributions`` object, which the predictive of
new targets (:class:`gpvi.posteriors.observation.ObservationPredictive`) integrates over :math:`q(f_*)`.

Parameters of the likelihoods (``df``, ``scale``, ``dispersion``) are fixed numbers here; targets are checked by
``check_targets`` (counts: non-negative integers; Beta: strictly inside (0, 1)), which the models call.

Quadrature: the default rule (:class:`gpvi.numerics.quadrature.Quadrature`, 96 Gauss-Legendre nodes on
:math:`m \pm 8.5\sqrt v`) is exact to about 1e-10 for these likelihoods when their bend is not much narrower than
the marginal's window; the Student-t log-density bends on a width :math:`\sigma\sqrt\nu` around :math:`y`, and for
:math:`\sigma\sqrt\nu \ll \sqrt v` use more nodes (``CVI(quadrature=Quadrature(256))``).

Names: ``y`` targets, ``f`` latent values, ``m``, ``v`` marginal means and variances, ``h``, ``h1``, ``h2`` the
log-likelihood and its derivatives in ``f``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..validation import check_positive
from .likelihood_base import Likelihood

__all__ = ["Poisson", "NegativeBinomial", "StudentT", "Laplace", "Beta", "LATENT_LIKELIHOODS", "check_counts",
           "describe_rows", "log_count_sites"]

_LOG_PI = math.log(math.pi)


def describe_rows(mask: torch.Tensor, y: torch.Tensor, limit: int = 5) -> str:
    """``"rows [i, ...] hold [y_i, ...]"`` for the first ``limit`` rows where ``mask`` is set (error messages)."""
    idx = mask.nonzero().flatten()[:limit].tolist()
    more = " ..." if int(mask.sum()) > limit else ""
    return f"rows {idx}{more} hold {[float(y[i]) for i in idx]}{more}"


def check_counts(y: torch.Tensor, name: str = "y") -> torch.Tensor:
    """``y`` if every entry is a non-negative integer (a count), else ``ValueError`` naming ``name`` and the rows."""
    bad = ~(y >= 0) | (y != torch.round(y))
    if bool(bad.any()):
        raise ValueError(f"{name} must hold counts (non-negative integers); {describe_rows(bad, y)}")
    return y


def log_count_sites(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""CVI's start for counts: the Gaussian sites of the log counts, ``(lam1, lam2)`` of shape ``y.shape``.

    Each count gets the pseudo-observation :math:`\tilde y_n = \log(y_n + \tfrac12)` of the log rate with the
    pseudo-noise :math:`s_n = 1/(y_n + \tfrac12)`, the delta method's variance of :math:`\log y` for a Poisson count
    of mean :math:`y_n` (:math:`\operatorname{Var}\log y \approx 1/\mu`; the :math:`\tfrac12` keeps zeros finite).
    In CVI's site parameters (Khan & Lin 2017, the display after eq. 13: a site :math:`\exp(\tilde\lambda^{(1)} f +
    \tilde\lambda^{(2)} f^2)`):

    .. math::

        \tilde\lambda^{(1)}_n = \tilde y_n / s_n = (y_n + \tfrac12)\log(y_n + \tfrac12),\qquad
        \tilde\lambda^{(2)}_n = -1/(2 s_n) = -\tfrac12 (y_n + \tfrac12).

    Why: from :math:`q` = prior (sites 0, Algorithm 1 line 1) the first step's site gradients are those at
    :math:`m_n = 0`, :math:`y_n - e^{v_n/2}` for the Poisson, far from the fixed point when the counts are in the
    hundreds, and full-batch CVI from there can fail (measured on 40 Poisson counts at rates 180-900: the ELBO at
    -1e94 after 500 steps, against convergence in 11 steps from these sites); these sites put :math:`q`'s mean near
    the log counts at once. The same start serves the negative binomial (its variance of :math:`\log y` adds
    :math:`1/r`, which the start ignores: the fixed point does not depend on where CVI starts, both likelihoods
    being log-concave).

    Examples
    --------
    >>> lam1, lam2 = log_count_sites(torch.tensor([0.0, 499.5], dtype=torch.float64))
    >>> [round(float(x), 4) for x in lam1], lam2.tolist()
    ([-0.3466, 3107.304], [-0.25, -250.0])
    """
    c = y + 0.5
    return torch.log(c) * c, -0.5 * c


class _Site(Likelihood):
    """Shared bookkeeping: the fixed parameters (``params``), ``spec``, ``repr`` and the default target check."""

    params: tuple[str, ...] = ()

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, **{p: getattr(self, p) for p in self.params}}

    def check_targets(self, y: torch.Tensor, name: str = "y") -> torch.Tensor:
        """Real targets (finiteness is checked on conversion): ``y`` unchanged."""
        return y

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{p}={getattr(self, p):g}' for p in self.params)})"


class Poisson(_Site):
    r"""Poisson counts with the log link, :math:`p(y \mid f) = e^{yf - e^f} / y!`.

    .. math::

        h = y f - e^f - \log y!,\qquad h' = y - e^f,\qquad h'' = -e^f < 0,

    and in closed form, for :math:`f \sim \mathcal N(m, v)` (:math:`\mathbb E[e^f] = e^{m + v/2}`):

    .. math::

        E = y m - e^{m + v/2} - \log y!,\qquad \partial_m E = y - e^{m + v/2},\qquad
        \partial_v E = -\tfrac12 e^{m + v/2}.

    GPyTorch's ``PoissonLikelihood`` has a softplus link instead (rate :math:`\log(1 + e^f)`); passed as an object
    it keeps that link (:mod:`gpvi.models.gpytorch_likelihoods`).

    Examples
    --------
    >>> import torch
    >>> y, m, v = (torch.tensor([x], dtype=torch.float64) for x in (2.0, 0.0, 0.0))
    >>> E, dm, dv = Poisson().closed_form(y, m, v)
    >>> round(float(E), 6), float(dm), float(dv)
    (-1.693147, 1.0, -0.5)
    """

    name = "poisson"

    def derivatives(self, y, f):
        ef = torch.exp(f)
        return y * f - ef - torch.lgamma(y + 1.0), y - ef, -ef

    def closed_form(self, y, m, v):
        mu = torch.exp(m + 0.5 * v)
        return y * m - mu - torch.lgamma(y + 1.0), y - mu, -0.5 * mu

    def check_targets(self, y: torch.Tensor, name: str = "y") -> torch.Tensor:
        return check_counts(y, name)

    def initial_sites(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """CVI's default start: the sites of the log counts (:func:`log_count_sites`)."""
        return log_count_sites(y)

    def response(self, f: torch.Tensor) -> torch.distributions.Distribution:
        """:math:`p(y \\mid f)` as a torch distribution (``Poisson(e^f)``)."""
        return torch.distributions.Poisson(torch.exp(f), validate_args=False)


class NegativeBinomial(_Site):
    r"""Negative-binomial counts with the log link: mean :math:`\mu = e^f`, dispersion :math:`r > 0`.

    .. math::

        p(y \mid f) = \frac{\Gamma(y + r)}{\Gamma(r)\,y!}\Big(\frac{r}{r + \mu}\Big)^r\Big(\frac{\mu}{r + \mu}\Big)^y,
        \qquad \operatorname{Var}(y) = \mu + \mu^2 / r

    (``torch.distributions.NegativeBinomial(total_count=r, logits=f - log r)``, scipy's ``nbinom(r, r/(r + mu))``;
    :math:`r \to \infty` is the Poisson). With :math:`p = \sigma(f - \log r)`:

    .. math::

        h = \log\tfrac{\Gamma(y + r)}{\Gamma(r)\,y!} + r\log r + y f - (y + r)\log(r + e^f),\quad
        h' = y - (y + r)\,p,\quad h'' = -(y + r)\,p\,(1 - p) < 0.

    Parameters
    ----------
    dispersion : float
        :math:`r > 0` (fixed).
    """

    name = "negative_binomial"
    params = ("dispersion",)

    def __init__(self, dispersion: float = 1.0) -> None:
        self.dispersion = check_positive(dispersion, "dispersion")

    def derivatives(self, y, f):
        r = self.dispersion
        log_r = torch.full_like(f, math.log(r))
        p = torch.sigmoid(f - log_r)
        h = (torch.lgamma(y + r) - math.lgamma(r) - torch.lgamma(y + 1.0) + r * math.log(r) + y * f
             - (y + r) * torch.logaddexp(log_r, f))
        return h, y - (y + r) * p, -(y + r) * p * (1.0 - p)

    def check_targets(self, y: torch.Tensor, name: str = "y") -> torch.Tensor:
        return check_counts(y, name)

    def initial_sites(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """CVI's default start: the sites of the log counts (:func:`log_count_sites`)."""
        return log_count_sites(y)

    def response(self, f: torch.Tensor) -> torch.distributions.Distribution:
        """:math:`p(y \\mid f)` as a torch distribution (``NegativeBinomial(r, logits=f - log r)``)."""
        return torch.distributions.NegativeBinomial(torch.full_like(f, self.dispersion),
                                                    logits=f - math.log(self.dispersion), validate_args=False)


class StudentT(_Site):
    r"""Student-t observations, :math:`y = f + \sigma\,\varepsilon`, :math:`\varepsilon \sim t_\nu` (robust regression).

    With :math:`r = y - f` and :math:`a = \nu\sigma^2`:

    .. math::

        h = \log\frac{\Gamma(\frac{\nu+1}{2})}{\Gamma(\frac\nu2)\sqrt{\pi a}}
          - \frac{\nu + 1}{2}\log\Big(1 + \frac{r^2}{a}\Big),
        \quad h' = \frac{(\nu + 1)\,r}{a + r^2},\quad h'' = \frac{(\nu + 1)(r^2 - a)}{(a + r^2)^2}.

    :math:`h'' > 0` for :math:`|r| > \sigma\sqrt\nu`: the likelihood is not log-concave, and an outlying site can
    have :math:`\mathbb E_q[h''] > 0` (a negative CVI site precision; how CVI handles it:
    :func:`gpvi.numerics.sites.update_sites`). GPyTorch's ``StudentTLikelihood`` is this with
    :math:`\nu` = ``deg_free`` and :math:`\sigma^2` = ``noise``.

    Parameters
    ----------
    df : float
        Degrees of freedom :math:`\nu > 0`.
    scale : float
        :math:`\sigma > 0` (not the standard deviation: that is :math:`\sigma\sqrt{\nu/(\nu - 2)}` for :math:`\nu > 2`).
    """

    name = "student_t"
    params = ("df", "scale")

    def __init__(self, df: float = 4.0, scale: float = 1.0) -> None:
        self.df = check_positive(df, "df")
        self.scale = check_positive(scale, "scale")

    def derivatives(self, y, f):
        nu, a = self.df, self.df * self.scale ** 2
        r = y - f
        den = a + r * r
        const = math.lgamma(0.5 * (nu + 1.0)) - math.lgamma(0.5 * nu) - 0.5 * (_LOG_PI + math.log(a))
        h = const - 0.5 * (nu + 1.0) * torch.log1p(r * r / a)
        return h, (nu + 1.0) * r / den, (nu + 1.0) * (r * r - a) / (den * den)

    def response(self, f: torch.Tensor) -> torch.distributions.Distribution:
        """:math:`p(y \\mid f)` as a torch distribution (``StudentT(df, loc=f, scale)``)."""
        return torch.distributions.StudentT(torch.full_like(f, self.df), f, torch.full_like(f, self.scale),
                                            validate_args=False)


class Laplace(_Site):
    r"""Laplace observations, :math:`p(y \mid f) = \frac{1}{2b} e^{-|y - f|/b}` (GPyTorch's ``LaplaceLikelihood``
    with :math:`b` = ``sqrt(noise)``).

    :math:`h = -\log 2b - |y - f|/b`, :math:`h' = \operatorname{sign}(y - f)/b` and :math:`h'' = 0` away from the
    kink at :math:`f = y`, whose curvature is a point mass; so the expectations are always the closed form. With
    :math:`d = y - m`, :math:`s = \sqrt v`, :math:`z = d/s` (the mean of a folded normal):

    .. math::

        E = -\log 2b - \frac{d\,\operatorname{erf}(z/\sqrt2) + 2 s\,\phi(z)}{b},\qquad
        \partial_m E = \frac{\operatorname{erf}(z/\sqrt2)}{b},\qquad \partial_v E = -\frac{\phi(z)}{s\,b} < 0.

    Parameters
    ----------
    scale : float
        :math:`b > 0`.
    """

    name = "laplace"
    params = ("scale",)

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = check_positive(scale, "scale")

    def derivatives(self, y, f):
        b = self.scale
        r = y - f
        return -math.log(2.0 * b) - r.abs() / b, torch.sign(r) / b, torch.zeros_like(r)

    def closed_form(self, y, m, v):
        b = self.scale
        s = torch.sqrt(v.clamp_min(torch.finfo(v.dtype).tiny))
        d = y - m
        z = d / s
        erf = torch.erf(z / math.sqrt(2.0))
        phi = torch.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
        return -math.log(2.0 * b) - (d * erf + 2.0 * s * phi) / b, erf / b, -phi / (s * b)

    def response(self, f: torch.Tensor) -> torch.distributions.Distribution:
        """:math:`p(y \\mid f)` as a torch distribution (``Laplace(f, b)``)."""
        return torch.distributions.Laplace(f, torch.full_like(f, self.scale), validate_args=False)


class Beta(_Site):
    r"""Beta-distributed proportions, GPyTorch's ``BetaLikelihood`` exactly: with :math:`\mu = \sigma(f)` and
    precision :math:`s` (``scale``),

    .. math::

        y \sim \mathrm{Beta}(\alpha, \beta),\qquad \alpha = s\mu + 1,\quad \beta = s(1 - \mu) + 1,

    the parametrisation of GPyTorch's code (its docstring writes :math:`\alpha = s\mu`): :math:`\mu` is the **mode**
    of :math:`y`, the mean is :math:`(s\mu + 1)/(s + 2)`. With
    :math:`A = s\,[\operatorname{logit} y - \psi(\alpha) + \psi(\beta)]`
    and :math:`\mu' = \mu(1 - \mu)`:

    .. math::

        h = \log\frac{\Gamma(s + 2)}{\Gamma(\alpha)\Gamma(\beta)} + (\alpha - 1)\log y + (\beta - 1)\log(1 - y),\quad
        h' = \mu' A,\quad h'' = \mu'(1 - 2\mu)\,A - s^2\mu'^2\,[\psi_1(\alpha) + \psi_1(\beta)].

    Parameters
    ----------
    scale : float
        :math:`s > 0`.
    """

    name = "beta"
    params = ("scale",)

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = check_positive(scale, "scale")

    def derivatives(self, y, f):
        s = self.scale
        mu, mu_c = torch.sigmoid(f), torch.sigmoid(-f)
        a, b = s * mu + 1.0, s * mu_c + 1.0
        log_y, log_1my = torch.log(y), torch.log1p(-y)
        h = math.lgamma(s + 2.0) - torch.lgamma(a) - torch.lgamma(b) + (a - 1.0) * log_y + (b - 1.0) * log_1my
        A = s * (log_y - log_1my - torch.digamma(a) + torch.digamma(b))
        dmu = mu * mu_c
        h2 = dmu * (mu_c - mu) * A - (s * dmu) ** 2 * (torch.polygamma(1, a) + torch.polygamma(1, b))
        return h, dmu * A, h2

    def response(self, f: torch.Tensor) -> torch.distributions.Distribution:
        """:math:`p(y \\mid f)` as a torch distribution (``Beta(s sigma(f) + 1, s sigma(-f) + 1)``)."""
        s = self.scale
        return torch.distributions.Beta(s * torch.sigmoid(f) + 1.0, s * torch.sigmoid(-f) + 1.0, validate_args=False)

    def check_targets(self, y: torch.Tensor, name: str = "y") -> torch.Tensor:
        bad = ~((y > 0) & (y < 1))
        if bool(bad.any()):
            raise ValueError(f"{name} must be strictly between 0 and 1 for the Beta likelihood; "
                             f"{describe_rows(bad, y)}")
        return y


LATENT_LIKELIHOODS: dict[str, type[_Site]] = {c.name: c for c in (Poisson, NegativeBinomial, StudentT, Laplace, Beta)}
"""``{name: class}``: what :func:`gpvi.models.likelihoods.make_likelihood` builds from a name or a spec dict."""
