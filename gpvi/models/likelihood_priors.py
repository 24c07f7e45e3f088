r"""The likelihood's own parameters :math:`\phi` as quantities to learn or sample: their log density in the
parameters, and their priors (issue 60).

The likelihoods of :class:`gpvi.GPGeneralisedRegression` with parameters (:data:`LIKELIHOOD_PARAMS`) are the
negative binomial (``dispersion`` :math:`r`), the Student-t (``df`` :math:`\nu`, ``scale`` :math:`\sigma`), the
Laplace (``scale`` :math:`b`) and the Beta (``scale`` :math:`s`), all positive. They are learned
(:class:`gpvi.inference.cvi.LikelihoodTypeII`) and sampled (:class:`gpvi.models.whitened.WhitenedLatentGP`) on the
log scale, :math:`\psi = \log\phi`, as theta holds the kernel's log-hyperparameters.

**Priors** (:class:`LikelihoodPrior`) are given per parameter, in either space, by the key:

* ``{"df": GammaPrior(2.0, 0.1)}``: a prior on the parameter itself (its natural value, as GPyTorch's
  ``deg_free_prior`` and ``noise_prior`` are), which enters the density over :math:`\psi` with the log-Jacobian of
  :math:`\phi = e^\psi`,

  .. math::

      \log p(\psi) = \log p_\phi(e^\psi) + \psi;

  the same change of variables as the kernel's registered and named priors
  (:class:`gpvi.models.model_prior.ModelPrior`), so a MAP over :math:`\psi` is the mode of the density over the log
  parameter, not of :math:`p_\phi`. The distribution must live on the positive reals (a ``Normal`` is refused by
  name: give it as ``"log_df"``);
* ``{"log_df": NormalPrior(2.0, 1.0)}``: a prior on :math:`\psi = \log\phi` directly (no Jacobian).

A parameter given neither way gets the **base** prior: none (a flat density over :math:`\psi`, the type-II
maximum) or ``"default"``, gpvi's :math:`\mathcal N(0, 10)` on :math:`\psi`, the prior that
:func:`gpvi.models.priors.default_prior` puts on every log-hyperparameter of the kernel (centred at
:math:`\phi = 1`: sensible for parameters of standardised targets and for the dispersion and df of counts; 95% of
its mass within :math:`\phi \in [e^{-6.2}, e^{6.2}]`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import distributions as td

from .latent_likelihoods import LATENT_LIKELIHOODS
from .prior_densities import density_and_score, family

__all__ = ["LIKELIHOOD_PARAMS", "log_lik_in", "LikelihoodPrior", "DEFAULT_LOG_VARIANCE"]

LIKELIHOOD_PARAMS: dict[str, tuple[str, ...]] = {name: cls.params for name, cls in LATENT_LIKELIHOODS.items()
                                                 if cls.params}
"""``{likelihood name: its positive parameters}``: ``negative_binomial``: dispersion; ``student_t``: df, scale;
``laplace``: scale; ``beta``: scale."""

DEFAULT_LOG_VARIANCE = 10.0
r"""Variance of the ``"default"`` base prior :math:`\mathcal N(0, 10)` on each :math:`\psi = \log\phi`."""

_LOG_2PI = math.log(2.0 * math.pi)


def log_lik_in(name: str, y: torch.Tensor, f: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
    r""":math:`\log p(y_n \mid f_n, \phi)` per point, differentiable in the parameters ``params``.

    The same densities as the likelihood objects of :mod:`gpvi.models.latent_likelihoods` (``derivatives``'
    :math:`h`), written with the parameters as tensors that broadcast against ``f`` (e.g. ``(S, 1)`` per draw
    against ``(S, N)``).

    Parameters
    ----------
    name : str
        A key of :data:`LIKELIHOOD_PARAMS`.
    y : torch.Tensor
        Targets, broadcast against ``f``.
    f : torch.Tensor
        Latent values.
    params : dict of str to torch.Tensor
        Every parameter of the likelihood (natural scale).
    """
    if name == "negative_binomial":
        r = params["dispersion"]
        return td.NegativeBinomial(r, logits=f - torch.log(r), validate_args=False).log_prob(y)
    if name == "student_t":
        return td.StudentT(params["df"], f, params["scale"], validate_args=False).log_prob(y)
    if name == "laplace":
        b = params["scale"]
        return -torch.log(2.0 * b) - (y - f).abs() / b
    if name == "beta":
        s = params["scale"]
        return td.Beta(s * torch.sigmoid(f) + 1.0, s * torch.sigmoid(-f) + 1.0, validate_args=False).log_prob(y)
    raise ValueError(f"likelihood {name!r} has no parameters; those with parameters: {sorted(LIKELIHOOD_PARAMS)}")


_FAMILIES = {"halfnormal": td.HalfNormal, "halfcauchy": td.HalfCauchy, "lognormal": td.LogNormal,
             "invgamma": td.InverseGamma, "normal": td.Normal, "gamma": td.Gamma, "cauchy": td.Cauchy,
             "studentt": td.StudentT, "exponential": td.Exponential}


def _float64(dist: Any) -> Any:
    """A float64 copy of a standard distribution (:func:`gpvi.models.prior_densities.family`), whose closed form
    then has no float32 rounding (GPyTorch's priors keep float32 parameters when built from Python floats);
    ``dist`` itself otherwise."""
    fam = family(dist)
    if fam is None:
        return dist
    name, params = fam
    return _FAMILIES[name](**{k: torch.as_tensor(v).detach().to(torch.float64) for k, v in params.items()},
                           validate_args=False)


def _positive_only(dist: Any) -> bool:
    support = getattr(dist, "support", None)
    if support is None:
        return True
    try:
        return not bool(torch.as_tensor(support.check(torch.tensor(-1.0, dtype=torch.float64))).any())
    except Exception:                               # exotic supports: the start check decides
        return True


class LikelihoodPrior:
    r""":math:`\log p(\psi)` of the likelihood's learned log parameters :math:`\psi = \log\phi` (module docstring).

    Parameters
    ----------
    likelihood : str
        The likelihood's name (a key of :data:`LIKELIHOOD_PARAMS`).
    names : sequence of str
        The parameters in :math:`\psi`, in order (a subset of the likelihood's).
    priors : dict, "default" or None
        ``{name: distribution}`` on the natural parameter (``"df"``, with the log-Jacobian) or
        ``{"log_" + name: distribution}`` on its log; any object with ``log_prob`` (GPyTorch priors, torch
        distributions). ``"default"``: the base prior ``"default"`` for every parameter.
    base : "default" or None
        The prior of the parameters ``priors`` does not name: :math:`\mathcal N(0, 10)` on :math:`\psi` or none.
    arg : str
        The argument's name in messages.

    Raises
    ------
    ValueError
        A key naming no learned parameter, a parameter given in both spaces, a natural-space distribution that
        allows negative values, a bad ``base``.
    TypeError
        ``priors`` not a dict, or an entry without ``log_prob``.

    Examples
    --------
    >>> import torch, gpytorch
    >>> p = LikelihoodPrior("student_t", ["df", "scale"], {"df": gpytorch.priors.GammaPrior(2.0, 0.1)})
    >>> psi = torch.tensor([math.log(10.0), 0.0], dtype=torch.float64)
    >>> want = torch.distributions.Gamma(2.0, 0.1).log_prob(torch.tensor(10.0)) + math.log(10.0)
    >>> bool(abs(p.log_prob(psi) - want) < 1e-6), p.summary()["scale"]
    (True, 'flat (no prior)')
    """

    def __init__(self, likelihood: str, names: Any, priors: Any = None, *, base: str | None = None,
                 arg: str = "priors") -> None:
        if likelihood not in LIKELIHOOD_PARAMS:
            raise ValueError(f"likelihood {likelihood!r} has no parameters; those with parameters: "
                             f"{sorted(LIKELIHOOD_PARAMS)}")
        if base not in (None, "default"):
            raise ValueError(f"base must be 'default' or None; got {base!r}")
        self.likelihood, self.names, self.arg = likelihood, tuple(names), arg
        if priors == "default":
            priors, base = {}, "default"
        elif priors is None:
            priors = {}
        elif not isinstance(priors, dict):
            raise TypeError(f"{arg} must be a dict {{parameter name: distribution}}, 'default' or None; got "
                            f"{type(priors).__name__}")
        self.base = base
        self.terms: dict[int, tuple[Any, bool]] = {}          # index in psi -> (distribution, on the log scale)
        self._kinds: dict[int, str] = {}                       # the user's class names, for summary()
        for key, dist in priors.items():
            if not isinstance(key, str):
                raise TypeError(f"{arg}'s keys must be parameter names (str); got {key!r}")
            log = key.startswith("log_")
            name = key[4:] if log else key
            if name not in self.names:
                known = [*self.names, *(f"log_{n}" for n in self.names)]
                raise ValueError(f"{arg}[{key!r}] names no learned parameter of the {likelihood} likelihood; "
                                 f"known: {known}")
            if not callable(getattr(dist, "log_prob", None)):
                raise TypeError(f"{arg}[{key!r}] must have a log_prob method (e.g. a GPyTorch prior or a torch "
                                f"distribution); got {type(dist).__name__}")
            i = self.names.index(name)
            if i in self.terms:
                raise ValueError(f"{arg} gives {name!r} two priors ({name!r} and 'log_{name}'); give one")
            if not log and not _positive_only(dist):
                raise ValueError(f"{arg}[{key!r}] is a {type(dist).__name__} with support {dist.support}, but "
                                 f"{name} is positive: use a distribution on the positive reals (Gamma, LogNormal, "
                                 f"HalfNormal ...), or give a prior on the log value as {arg}['log_{name}']")
            self.terms[i] = (_float64(dist), log)
            self._kinds[i] = type(dist).__name__

    @property
    def dim(self) -> int:
        """The number of log parameters in :math:`\\psi`."""
        return len(self.names)

    def log_prob(self, psi: torch.Tensor) -> torch.Tensor:
        r""":math:`\log p(\psi)` for ``psi`` of shape ``(..., P)``: shape ``(...)``; differentiable. Natural-scale
        priors are evaluated at :math:`e^\psi` with the log-Jacobian :math:`+\psi`."""
        total = torch.zeros(psi.shape[:-1], dtype=psi.dtype, device=psi.device)
        for i in range(self.dim):
            x = psi[..., i]
            if i in self.terms:
                dist, log = self.terms[i]
                u = x if log else torch.exp(x)
                ds = density_and_score(dist, u)
                lp = ds[0] if ds is not None else torch.as_tensor(dist.log_prob(u))
                total = total + lp.to(psi.dtype) + (0.0 if log else x)
            elif self.base == "default":
                total = total - 0.5 * x * x / DEFAULT_LOG_VARIANCE - 0.5 * (math.log(DEFAULT_LOG_VARIANCE) + _LOG_2PI)
        return total

    def check(self, psi: torch.Tensor) -> None:
        """Refuse a prior that is -inf or NaN at ``psi`` (the start), naming the parameter (``ValueError``)."""
        for i in self.terms:
            with torch.no_grad():
                try:
                    lp = float(self._one(psi, i))
                except ValueError:                  # torch's support validation: outside the support
                    lp = -math.inf
            if not math.isfinite(lp):
                raise ValueError(f"{self.arg}: the prior on {self.names[i]} is {lp} at the start "
                                 f"({self.names[i]} = {math.exp(float(psi[i])):.6g}); a prior must be finite "
                                 f"where the fit starts")

    def _one(self, psi: torch.Tensor, i: int) -> torch.Tensor:
        dist, log = self.terms[i]
        x = psi[..., i].detach().to(torch.float64)
        u = x if log else torch.exp(x)
        return torch.as_tensor(dist.log_prob(u)).sum()

    def summary(self) -> dict[str, str]:
        """``{parameter: its prior}``, in :math:`\\psi`'s order."""
        out = {}
        for i, n in enumerate(self.names):
            if i in self.terms:
                kind, log = self._kinds[i], self.terms[i][1]
                out[n] = (f"{kind} on log {n}" if log else f"{kind} on {n} (with the log-Jacobian of log {n} -> {n})")
            else:
                out[n] = (f"N(0, {DEFAULT_LOG_VARIANCE:g}) on log {n} (gpvi default)" if self.base == "default"
                          else "flat (no prior)")
        return out

    def __repr__(self) -> str:
        return f"LikelihoodPrior({self.likelihood!r}, names={list(self.names)}, base={self.base!r})"
