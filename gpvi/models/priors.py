"""Priors over the unconstrained hyperparameter vector theta.

The default is the DSVI paper's vague prior (section 3.4; the slides write it as N(theta | 0, 10 I)):
independent normals with mean 0 and **variance 10** (sd sqrt(10)) on every log-hyperparameter.
Any object with a ``log_prob`` method (a ``torch.distributions.Distribution``) can replace it.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from ..exceptions import InputScaleWarning

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
                device: torch.device | str | None = None) -> Any:
    """Validate a user prior (has ``log_prob``; finite at 0; right shape) or build the default."""
    if prior is None:
        return default_prior(dim, dtype=dtype, device=device)
    if not callable(getattr(prior, "log_prob", None)):
        raise TypeError(f"prior must have a log_prob method (e.g. a torch.distributions.Distribution); "
                        f"got {type(prior).__name__}")
    theta0 = torch.zeros(dim, dtype=dtype, device=device)
    try:
        lp = prior_log_prob(prior, theta0)
    except Exception as exc:
        raise ValueError(f"prior.log_prob failed on a theta of shape ({dim},): {exc}") from None
    if lp.dim() != 0:
        raise ValueError(f"prior.log_prob must give one value per theta of length {dim}; got shape {tuple(lp.shape)}")
    return prior


def check_prior_choice(prior: Any, name: str = "prior") -> Any:
    """Check the ``prior`` setting of the type-II loops and bounds: ``"default"``, ``"scaled"``, ``None`` (no prior)
    or an object with a ``log_prob`` method; returns it unchanged. Its shape is checked later, by
    :func:`resolve_prior`, once the model's theta length is known."""
    if isinstance(prior, str):
        if prior not in ("default", "scaled"):
            raise ValueError(f"{name} must be 'default', 'scaled', None or a distribution with log_prob; got "
                             f"{prior!r}")
    elif prior is not None and not callable(getattr(prior, "log_prob", None)):
        raise TypeError(f"{name} must have a log_prob method (e.g. a torch.distributions.Distribution), or be "
                        f"'default', 'scaled' or None; got {type(prior).__name__}")
    return prior


def resolve_prior(prior: Any, model: Any) -> Any:
    r"""The prior object for ``model``'s theta (length ``model.dim``, on ``model.device``).

    ``"default"``: :func:`default_prior`, :math:`\mathcal N(0, 10 I)`. ``"scaled"``: :func:`scaled_prior` centred at
    ``model.initial_theta()`` (for the GP classifiers: lengthscale^2 = d var(x_j) on every input, signal variance
    1), the same variance 10. ``None`` stays ``None`` (no prior). A user prior is checked by :func:`check_prior`.
    """
    check_prior_choice(prior)
    if prior is None:
        return None
    if prior == "scaled":
        return scaled_prior(model.initial_theta().to(device=model.device, dtype=torch.float64))
    if isinstance(prior, str):
        _warn_if_not_unit_scale(model)
        return default_prior(model.dim, device=model.device)
    return check_prior(prior, model.dim, device=model.device)


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
