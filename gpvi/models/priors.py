"""Priors over the unconstrained hyperparameter vector theta.

The default is the DSVI paper's vague prior (section 3.4; the slides write it as N(theta | 0, 10 I)):
independent normals with mean 0 and **variance 10** (sd sqrt(10)) on every log-hyperparameter.
Any object with a ``log_prob`` method (a ``torch.distributions.Distribution``) can replace it. Priors registered
on the GPyTorch kernel and priors on named natural-scale quantities (``prior={"lengthscale": HalfNormal(1.0)}``)
are combined with it by :class:`gpvi.models.model_prior.ModelPrior` (one rule, stated there).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from ..exceptions import InputScaleWarning
from .model_prior import ModelPrior

__all__ = ["default_prior", "scaled_prior", "prior_log_prob", "check_prior", "check_prior_choice", "resolve_prior",
           "prior_name"]

DEFAULT_PRIOR_VARIANCE = 10.0


def default_prior(dim: int, *, variance: float = DEFAULT_PRIOR_VARIANCE, dtype: torch.dtype = torch.float64,
                  device: torch.device | str | None = None) -> torch.distributions.Distribution:
    r"""Independent :math:`\mathcal N(0, \text{variance})` on each of ``dim`` components (event shape ``(dim,)``)."""
    return scaled_prior(torch.zeros(dim, dtype=dtype, device=device), variance=variance)


def scaled_prior(center: torch.Tensor, *, variance: float = DEFAULT_PRIOR_VARIANCE) -> torch.distributions.Distribution:
    r"""Independent :math:`\mathcal N(\theta_0, \text{variance})` on each component, centred at ``center``
    (:math:`\theta_0`, e.g. a model's data-scaled ``initial_theta()``); dtype and device follow ``center``."""
    loc = center.detach().clone()
    scale = torch.full_like(loc, math.sqrt(variance))
    return torch.distributions.Independent(torch.distributions.Normal(loc, scale), 1)


def prior_log_prob(prior: Any, theta: torch.Tensor) -> torch.Tensor:
    """``log p(theta)`` summed over theta's components: ``(D,) -> ()``, ``(S, D) -> (S,)``.

    A prior whose ``log_prob`` returns one value per component (shape equal to ``theta``'s, e.g. a plain
    ``Normal`` with ``(D,)`` parameters) is summed over the last dimension; one whose ``log_prob`` already
    returns one value per vector (event shape ``(D,)``) is used as is.
    """
    lp = prior.log_prob(theta)
    if lp.shape == theta.shape:
        lp = lp.sum(-1)
    return lp


def check_prior(prior: Any, dim: int, *, dtype: torch.dtype = torch.float64,
                device: torch.device | str | None = None, start: torch.Tensor | None = None,
                names: list[str] | None = None, arg: str = "prior") -> Any:
    """Validate a user prior over theta (has ``log_prob``; one value per theta; finite at ``start``, default 0) or
    build the default.

    Raises
    ------
    TypeError
        No ``log_prob``.
    ValueError
        ``log_prob`` fails or gives the wrong shape at ``start``, or is -inf or NaN there (naming the components
        when ``log_prob`` gives one value per component): e.g. a ``GammaPrior`` meant for a natural-scale value,
        given as a prior on the log values theta, is -inf at theta = 0 and below.
    """
    if prior is None:
        return default_prior(dim, dtype=dtype, device=device)
    if not callable(getattr(prior, "log_prob", None)):
        raise TypeError(f"{arg} must have a log_prob method (e.g. a torch.distributions.Distribution); "
                        f"got {type(prior).__name__}")
    theta0 = torch.zeros(dim, dtype=dtype, device=device) if start is None else start.detach().to(dtype)
    try:
        raw = prior.log_prob(theta0)
        lp = prior_log_prob(prior, theta0)
    except Exception as exc:
        raise ValueError(f"{arg}.log_prob failed on a theta of shape ({dim},): {exc}") from None
    if lp.dim() != 0:
        raise ValueError(f"{arg}.log_prob must give one value per theta of length {dim}; got shape {tuple(lp.shape)}")
    if not math.isfinite(float(lp)):
        where = "theta = 0" if start is None else "the model's start"
        bad = ""
        if raw.shape == theta0.shape:
            idx = [j for j in range(dim) if not math.isfinite(float(raw[j]))]
            labels = [names[j] if names is not None and j < len(names) else f"theta[{j}]" for j in idx]
            bad = f" (component(s) {', '.join(labels)})"
        raise ValueError(f"{arg} ({type(prior).__name__}) has log_prob {float(lp)} at {where}{bad}, theta = "
                         f"{theta0.tolist()}: a prior must be finite where the fit starts. {arg}= is a prior on "
                         f"theta, the log values; for a prior on a natural-scale value (lengthscale, signal or "
                         f"noise sd/variance) give it by name, {arg}={{'lengthscale': ...}}, or register it on the "
                         f"kernel (lengthscale_prior=...)")
    return prior


def check_prior_choice(prior: Any, name: str = "prior") -> Any:
    """Check the ``prior`` setting of the type-II loops and bounds: ``"default"``, ``"scaled"``, ``None`` (no prior),
    a ``{name: distribution}`` dict of priors on natural-scale quantities, or an object with a ``log_prob`` method;
    returns it unchanged. Its shape and names are checked later, by :func:`resolve_prior`, once the model is
    known."""
    if isinstance(prior, dict):
        return prior
    if isinstance(prior, str):
        if prior not in ("default", "scaled"):
            raise ValueError(f"{name} must be 'default', 'scaled', None or a distribution with log_prob; got "
                             f"{prior!r}")
    elif prior is not None and not callable(getattr(prior, "log_prob", None)):
        raise TypeError(f"{name} must have a log_prob method (e.g. a torch.distributions.Distribution), or be "
                        f"'default', 'scaled', None or a dict of named priors; got {type(prior).__name__}")
    return prior


def resolve_prior(prior: Any, model: Any) -> Any:
    r"""The prior object for ``model``'s theta (length ``model.dim``, on ``model.device``).

    ``"default"``: :func:`default_prior`, :math:`\mathcal N(0, 10 I)`. ``"scaled"``: :func:`scaled_prior` centred at
    ``model.scaled_theta()`` when the model has it, else ``model.initial_theta()`` (for the GP classifiers:
    lengthscale^2 = d var(x_j) on every input, signal variance 1, whatever values the kernel holds), the same
    variance 10. ``None`` stays ``None`` (no prior). A user prior is checked by :func:`check_prior`.

    When the model's kernel has registered priors, or ``prior`` is a ``{name: distribution}`` dict, the result is a
    :class:`~gpvi.models.model_prior.ModelPrior`: those priors on their natural values (with the log-Jacobian),
    and ``"default"`` / ``"scaled"`` / none (``None``) on the other components (a dict: ``"default"``). A
    distribution over all of theta together with registered priors is refused (``ValueError``). Every prior is
    checked to be finite at the model's start (``model.theta`` when it has one, else ``model.initial_theta()``).
    """
    check_prior_choice(prior)
    parts = getattr(model, "prior_parts", None)
    blocks, registered = parts() if parts is not None else ([], [])
    start = getattr(model, "theta", None)
    if start is None or not isinstance(start, torch.Tensor):
        start = model.initial_theta()
    if isinstance(prior, dict) or registered:
        if not (prior is None or isinstance(prior, (str, dict))):
            raise ValueError(f"prior is a {type(prior).__name__} over all of theta, but the kernel registers priors "
                             f"({', '.join(r.name for r in registered)}): give one or the other (named priors, "
                             f"prior={{name: distribution}}, combine with registered ones)")
        base = "default" if isinstance(prior, dict) else prior
        center = _scaled_centre(model) if base == "scaled" else None
        if base == "default":
            _warn_if_not_unit_scale(model)
        mp = ModelPrior(blocks, registered, prior if isinstance(prior, dict) else None, base, dim=model.dim,
                        names=list(model.names), center=center)
        mp.check(start.to(torch.float64))
        return mp
    if prior is None:
        return None
    if prior == "scaled":
        return scaled_prior(_scaled_centre(model).to(device=model.device))
    if isinstance(prior, str):
        _warn_if_not_unit_scale(model)
        return default_prior(model.dim, device=model.device)
    return check_prior(prior, model.dim, device=model.device, start=start.to(torch.float64),
                       names=list(getattr(model, "names", [])))


def _scaled_centre(model: Any) -> torch.Tensor:
    """The centre of the ``"scaled"`` prior: ``model.scaled_theta()`` (data-scaled, whatever the kernel holds) when
    the model has it, else ``model.initial_theta()``."""
    centre = getattr(model, "scaled_theta", None) or model.initial_theta
    return centre().to(torch.float64)


_UNIT_SCALE_LOG_VAR = math.log(100.0)
"""The default prior is centred at lengthscale 1 on every input: an input whose variance is outside [1e-2, 1e2]
(standard deviation outside [0.1, 10]) gets an :class:`~gpvi.exceptions.InputScaleWarning`."""


def _warn_if_not_unit_scale(model: Any) -> None:
    scale = getattr(model, "log_input_scale", None)
    if scale is None:
        return
    shift = scale()
    worst = int(shift.abs().argmax()) if shift.numel() else 0
    if shift.numel() and float(shift[worst].abs()) > _UNIT_SCALE_LOG_VAR:
        names = list(getattr(model, "names", []))
        what = names[worst] if worst < len(names) else f"theta[{worst}]"
        warnings.warn(f"the default prior N(0, 10 I) on the log-hyperparameters is centred at lengthscale 1, but the "
                      f"input of {what} has variance {math.exp(float(shift[worst])):.3g}: standardise the inputs, or "
                      f"use prior='scaled' (centred at the inputs' own scale) or another prior",
                      InputScaleWarning, stacklevel=3)


def prior_name(prior: Any) -> str | None:
    """What a run records of its ``prior`` setting: ``None``, ``"default"``, ``"scaled"`` or the object's type."""
    if prior is None or isinstance(prior, str):
        return prior
    return type(prior).__name__
