"""Warning and error types shared by every gpvi module.

One place for the categories lets users filter them (``warnings.simplefilter("error", NumericalWarning)``)
and lets tests assert on them.

A warning that advises a setting names one its reader can change. An engine's warning names the engine's own
argument (``ML2(bounds=...)``); a layer that runs the engine for its user with settings of its own
(:class:`gpvi.GPClassifier`, the ``gpvi`` command) states its own advice around the run with :func:`advising`,
and the warning takes that text from :func:`advice` instead.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

__all__ = [
    "PSISWarning",
    "NumericalWarning",
    "ConvergenceWarning",
    "InterruptedRunWarning",
    "BoundWarning",
    "InputScaleWarning",
    "NotPSDError",
    "NumericalFaultError",
    "advice",
    "advising",
]

_ADVICE: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("gpvi_advice", default={})


def advice(topic: str, default: str) -> str:
    """The advice a warning on ``topic`` ends with: the text set with :func:`advising` by the outermost caller, else
    ``default`` (the warning engine's own setting). Topics: ``"bound"`` (a point estimate on its search box,
    :class:`BoundWarning`), ``"ml2_convergence"`` (ML-II's doubtful optimum)."""
    return _ADVICE.get().get(topic, default)


@contextlib.contextmanager
def advising(**topics: str) -> Iterator[None]:
    """Inside the block, warnings on these topics end with these texts (:func:`advice`); a topic an enclosing
    block already set keeps the outer text, as the outermost caller is the one its user called."""
    token = _ADVICE.set({**topics, **_ADVICE.get()})
    try:
        yield
    finally:
        _ADVICE.reset(token)


class NumericalWarning(RuntimeWarning):
    """A numerical fault was survived (jitter added, draw resampled, step rejected)."""


class ConvergenceWarning(UserWarning):
    """An iterative method stopped before its convergence rule was met, or diagnostics look poor."""


class InterruptedRunWarning(UserWarning):
    """A long run was interrupted (Ctrl-C or a callback); the partial result was returned."""


class BoundWarning(UserWarning):
    """A point estimate of theta ends on the box it was searched in (e.g. an ML-II lengthscale at its upper bound:
    the input is irrelevant to the fit; the value is the box's, not an estimate)."""


class InputScaleWarning(UserWarning):
    """Inputs far from unit scale (a column's standard deviation outside [0.1, 10]) meet the default prior
    N(0, 10 I) on the log-hyperparameters, which is centred at lengthscale 1 on every input: standardise the inputs or
    use the prior ``"scaled"`` (centred at the data's own scale)."""


class PSISWarning(UserWarning):
    """The Pareto k-hat of a posterior approximation's importance weights exceeds 0.7: neither the approximation
    nor its PSIS correction is reliable (:func:`gpvi.posteriors.weighted.psis`)."""


class NotPSDError(ValueError):
    """A matrix stayed non positive definite after the bounded jitter retries.

    Attributes
    ----------
    theta : torch.Tensor or None
        The hyperparameter vector whose kernel matrix failed (when known).
    jitter : float
        The largest jitter that was tried (absolute, added to the diagonal).
    """

    def __init__(self, message: str, *, theta: Any = None, jitter: float = float("nan")) -> None:
        super().__init__(message)
        self.theta = theta
        self.jitter = jitter


class NumericalFaultError(RuntimeError):
    """A run could not continue after repeated numerical faults.

    The last good state is kept on the exception, so nothing computed is lost::

        try:
            q = gpvi.DSVI(...).run(model)
        except gpvi.exceptions.NumericalFaultError as err:
            state = err.state          # resume or inspect from here
    """

    def __init__(self, message: str, *, state: Any = None, partial: Any = None) -> None:
        super().__init__(message)
        self.state = state
        self.partial = partial
