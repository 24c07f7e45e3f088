r"""Closed-form log densities and scores :math:`\frac{d}{du}\log p(u)` of the standard one-dimensional priors.

:class:`gpvi.models.model_prior.ModelPrior` uses them to give its log density and gradient without autograd
(:meth:`~gpvi.models.model_prior.ModelPrior.log_prob_and_grad`), for torch's and GPyTorch's Normal, HalfNormal,
LogNormal, Gamma, InverseGamma, HalfCauchy, Cauchy, StudentT and Exponential distributions. One formula per family
serves tensors (:func:`density_and_score`) and Python floats (:func:`float_density_and_score`, a sampler's single
theta). Positive families give :math:`-\infty` (score 0) at :math:`u \le 0`.

The formulas, with :math:`z = (u - \mu)/\sigma`:

=============  =====================================================================  ===============================
family         :math:`\log p(u)`                                                      :math:`d\log p/du`
=============  =====================================================================  ===============================
Normal         :math:`-\log\sigma - \tfrac12\log 2\pi - \tfrac12 z^2`                 :math:`-z/\sigma`
HalfNormal     :math:`\tfrac12\log(2/\pi) - \log\sigma - \tfrac12 (u/\sigma)^2`        :math:`-u/\sigma^2`
LogNormal      :math:`-\log u - \log\sigma - \tfrac12\log 2\pi - \tfrac12 z_{\log}^2`  :math:`-(1 + z_{\log}/\sigma)/u`
Gamma          :math:`a\log b - \log\Gamma(a) + (a - 1)\log u - bu`                   :math:`(a - 1)/u - b`
InverseGamma   :math:`a\log b - \log\Gamma(a) - (a + 1)\log u - b/u`                  :math:`-(a + 1)/u + b/u^2`
HalfCauchy     :math:`\log(2/\pi) + \log s - \log(s^2 + u^2)`                         :math:`-2u/(s^2 + u^2)`
Cauchy         :math:`-\log\pi + \log s - \log(s^2 + (u-\mu)^2)`                      :math:`-2(u-\mu)/(s^2 + (u-\mu)^2)`
StudentT       :math:`\log\Gamma(\tfrac{\nu+1}2) - \log\Gamma(\tfrac\nu2) - \tfrac12\log\nu\pi - \log s
               - \tfrac{\nu+1}2\log(1 + z^2/\nu)`                                      :math:`-(\nu+1)(u-\mu)/(\nu s^2 + (u-\mu)^2)`
Exponential    :math:`\log\lambda - \lambda u`                                         :math:`-\lambda`
=============  =====================================================================  ===============================

(:math:`z_{\log} = (\log u - \mu)/\sigma`.) GPyTorch's HalfNormal and HalfCauchy priors keep a float32 base
distribution even in a float64 model, so their own ``log_prob`` rounds to float32; these formulas do not.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["family", "density_and_score", "float_density_and_score"]

_LOG_2PI = math.log(2.0 * math.pi)
_POSITIVE = {"halfnormal", "halfcauchy", "lognormal", "invgamma", "gamma", "exponential"}


def family(dist: Any) -> tuple[str, dict[str, Any]] | None:
    """``(family name, parameters)`` of a standard distribution, or None (also for a GPyTorch prior with a
    transform)."""
    D = torch.distributions
    if getattr(dist, "_transform", None) is not None:
        return None
    for cls, name, keys in ((D.HalfNormal, "halfnormal", ("scale",)), (D.HalfCauchy, "halfcauchy", ("scale",)),
                            (D.LogNormal, "lognormal", ("loc", "scale")),
                            (D.InverseGamma, "invgamma", ("concentration", "rate")),
                            (D.Normal, "normal", ("loc", "scale")), (D.Gamma, "gamma", ("concentration", "rate")),
                            (D.Cauchy, "cauchy", ("loc", "scale")), (D.StudentT, "studentt", ("df", "loc", "scale")),
                            (D.Exponential, "exponential", ("rate",))):
        if isinstance(dist, cls):
            return name, {k: getattr(dist, k) for k in keys}
    return None


def _formula(name: str, p: dict[str, Any], u: Any, log: Any, lgamma: Any, log1p: Any) -> tuple[Any, Any]:
    if name == "halfnormal":
        sc = p["scale"]
        return 0.5 * math.log(2.0 / math.pi) - log(sc) - 0.5 * (u / sc) ** 2, -u / sc ** 2
    if name == "halfcauchy":
        sc = p["scale"]
        return math.log(2.0 / math.pi) + log(sc) - log(sc ** 2 + u * u), -2.0 * u / (sc ** 2 + u * u)
    if name == "lognormal":
        lu, sc = log(u), p["scale"]
        z = (lu - p["loc"]) / sc
        return -lu - log(sc) - 0.5 * _LOG_2PI - 0.5 * z * z, -(1.0 + z / sc) / u
    if name == "invgamma":
        a, b = p["concentration"], p["rate"]
        return a * log(b) - lgamma(a) - (a + 1.0) * log(u) - b / u, -(a + 1.0) / u + b / (u * u)
    if name == "gamma":
        a, b = p["concentration"], p["rate"]
        return a * log(b) - lgamma(a) + (a - 1.0) * log(u) - b * u, (a - 1.0) / u - b
    if name == "exponential":
        lam = p["rate"]
        return log(lam) - lam * u, -lam + 0.0 * u
    if name == "normal":
        sc = p["scale"]
        z = (u - p["loc"]) / sc
        return -log(sc) - 0.5 * _LOG_2PI - 0.5 * z * z, -z / sc
    if name == "cauchy":
        sc, z = p["scale"], u - p["loc"]
        return -math.log(math.pi) + log(sc) - log(sc ** 2 + z * z), -2.0 * z / (sc ** 2 + z * z)
    nu, sc, z = p["df"], p["scale"], u - p["loc"]               # studentt
    lp = (lgamma(0.5 * (nu + 1.0)) - lgamma(0.5 * nu) - 0.5 * log(nu * math.pi) - log(sc)
          - 0.5 * (nu + 1.0) * log1p(z * z / (nu * sc ** 2)))
    return lp, -(nu + 1.0) * z / (nu * sc ** 2 + z * z)


def density_and_score(dist: Any, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(log p(u), d log p / du)`` elementwise for tensors, or None for a distribution :func:`family` does not
    know (the caller then uses its ``log_prob`` and autograd)."""
    fam = family(dist)
    if fam is None:
        return None
    name, p = fam
    if name in _POSITIVE:
        u_safe = torch.where(u > 0, u, torch.ones_like(u))
        lp, s = _formula(name, p, u_safe, torch.log, torch.lgamma, torch.log1p)
        lp, s = torch.broadcast_tensors(lp, s)
        bad = u <= 0
        return torch.where(bad, torch.full_like(lp, -math.inf), lp), torch.where(bad, torch.zeros_like(s), s)
    lp, s = _formula(name, p, u, torch.log, torch.lgamma, torch.log1p)
    return torch.broadcast_tensors(lp, s)


def float_density_and_score(name: str, p: dict[str, float], u: float) -> tuple[float, float]:
    """The same for one Python float ``u`` and float parameters (``name`` and ``p`` from :func:`family`)."""
    if name in _POSITIVE and not u > 0:
        return -math.inf, 0.0
    return _formula(name, p, u, math.log, math.lgamma, math.log1p)
