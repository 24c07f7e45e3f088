r"""Step-size schedules :math:`\rho_t` shared by the stochastic engines (DSVI's :math:`\rho_t`, CVI's :math:`\beta_t`).

A schedule is a small immutable object: ``schedule(t)`` returns the step size used by the update number
``t = 0, 1, 2, ...`` (``t`` = number of updates already done). Being a pure function of ``t``, a schedule has
no state of its own, so resuming a run from its step count reproduces the uninterrupted sequence exactly.

* :class:`RobbinsMonro` — :math:`\rho_t = \rho_0 / (1 + t/\tau)^\kappa` with :math:`0.5 < \kappa \le 1`:
  :math:`\sum_t \rho_t = \infty` and :math:`\sum_t \rho_t^2 < \infty`, the conditions under which the
  stochastic iteration converges (Robbins & Monro 1951; DSVI paper section 2, below Algorithm 1).
* :class:`DecayEveryK` — the DSVI paper's schedule (section 3.2): start at :math:`\rho_0` and multiply by
  ``factor`` (0.95 in the paper) every ``every`` steps, :math:`\rho_t = \rho_0\,\text{factor}^{\lfloor t/k \rfloor}`.
  Over a finite run it behaves like a slowly annealed constant rate.
* :class:`Constant` — :math:`\rho_t = \rho_0`. It violates :math:`\sum \rho_t^2 < \infty`: the iterate keeps
  diffusing around the optimum with a spread that grows with :math:`\rho_0` (the paper's Figure 1); use
  Polyak averaging or a decaying schedule for a final answer.

:func:`make_schedule` builds one from a name, so engines take ``schedule="robbins_monro"`` and so on; a name means
the same formula in every engine, and each engine documents its defaults for :math:`\tau` and :math:`\kappa`.
:func:`rate` also passes through a bare ``callable(t)`` (CVI's ``beta_schedule``).

Names: ``rho0`` = :math:`\rho_0`, ``tau`` = :math:`\tau`, ``kappa`` = :math:`\kappa`, ``factor`` and
``every`` = the 0.95 and the k of "multiply by 0.95 every k steps".

Examples
--------
>>> from gpvi.inference.schedules import RobbinsMonro, DecayEveryK
>>> s = RobbinsMonro(0.1, tau=100.0, kappa=1.0)
>>> s(0), round(s(100), 6)
(0.1, 0.05)
>>> d = DecayEveryK(1.0, factor=0.5, every=10)
>>> d(9), d(10), d(25)
(1.0, 0.5, 0.25)
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Protocol, runtime_checkable

from ..validation import check_choice, check_positive, check_positive_int

__all__ = ["Schedule", "Constant", "RobbinsMonro", "DecayEveryK", "make_schedule", "rate", "SCHEDULES"]

SCHEDULES = ("constant", "robbins_monro", "decay")


def _check_step(t: Any) -> int:
    if isinstance(t, bool) or not isinstance(t, numbers.Integral):
        raise TypeError(f"t must be an int step count; got {type(t).__name__}")
    if t < 0:
        raise ValueError(f"t must be >= 0; got {t}")
    return int(t)


@runtime_checkable
class Schedule(Protocol):
    """Protocol: ``rho0`` (initial step size) and ``__call__(t) -> rho_t`` for ``t >= 0``."""

    rho0: float

    def __call__(self, t: int) -> float: ...


class Constant:
    r"""Constant step size :math:`\rho_t = \rho_0`.

    Parameters
    ----------
    rho0 : float
        Step size, > 0.

    Examples
    --------
    >>> Constant(0.01)(12345)
    0.01
    """

    def __init__(self, rho0: float) -> None:
        self.rho0 = check_positive(rho0, "rho0")

    def __call__(self, t: int) -> float:
        _check_step(t)
        return self.rho0

    def spec(self) -> dict[str, Any]:
        """Serialisable description."""
        return {"kind": "constant", "rho0": self.rho0}

    def __repr__(self) -> str:
        return f"Constant(rho0={self.rho0:g})"


class RobbinsMonro:
    r"""Robbins–Monro schedule :math:`\rho_t = \rho_0 / (1 + t/\tau)^{\kappa}`.

    With :math:`0.5 < \kappa \le 1` the sequence satisfies :math:`\sum_t\rho_t = \infty` and
    :math:`\sum_t\rho_t^2 < \infty` (Robbins & Monro 1951), the conditions quoted in the DSVI paper
    (section 2) for convergence to a local maximum of the bound.

    Parameters
    ----------
    rho0 : float
        Initial step size, > 0.
    tau : float
        Delay, > 0: the rate halves (for kappa = 1) after ``tau`` steps. Large ``tau`` keeps the rate near
        ``rho0`` for longer.
    kappa : float
        Forgetting rate in (0.5, 1].

    Raises
    ------
    ValueError
        ``rho0 <= 0``, ``tau <= 0`` or ``kappa`` outside (0.5, 1].

    Examples
    --------
    >>> s = RobbinsMonro(1.0, tau=1.0, kappa=1.0)
    >>> [s(t) for t in range(4)]
    [1.0, 0.5, 0.3333333333333333, 0.25]
    """

    def __init__(self, rho0: float, *, tau: float = 1000.0, kappa: float = 0.6) -> None:
        self.rho0 = check_positive(rho0, "rho0")
        self.tau = check_positive(tau, "tau")
        k = check_positive(kappa, "kappa")
        if not 0.5 < k <= 1.0:
            raise ValueError(f"kappa must be in (0.5, 1] so that sum(rho) = inf and sum(rho^2) < inf; got {k:g}")
        self.kappa = k

    def __call__(self, t: int) -> float:
        t = _check_step(t)
        return self.rho0 / (1.0 + t / self.tau) ** self.kappa

    def spec(self) -> dict[str, Any]:
        return {"kind": "robbins_monro", "rho0": self.rho0, "tau": self.tau, "kappa": self.kappa}

    def __repr__(self) -> str:
        return f"RobbinsMonro(rho0={self.rho0:g}, tau={self.tau:g}, kappa={self.kappa:g})"


class DecayEveryK:
    r"""The DSVI paper's schedule: :math:`\rho_t = \rho_0\, \text{factor}^{\lfloor t / k\rfloor}`.

    Section 3.2 of the paper: "initialised to :math:`\rho_0` and scaled every 5000 iterations by a factor
    of 0.95".

    Parameters
    ----------
    rho0 : float
        Initial step size, > 0.
    factor : float
        Multiplier in (0, 1].
    every : int
        Number of steps k between multiplications, >= 1.

    Examples
    --------
    >>> s = DecayEveryK(0.1, factor=0.95, every=5000)
    >>> s(4999) == 0.1, round(s(5000), 6)
    (True, 0.095)
    """

    def __init__(self, rho0: float, *, factor: float = 0.95, every: int = 1000) -> None:
        self.rho0 = check_positive(rho0, "rho0")
        f = check_positive(factor, "factor")
        if f > 1.0:
            raise ValueError(f"factor must be in (0, 1]; got {f:g}")
        self.factor = f
        self.every = check_positive_int(every, "every")

    def __call__(self, t: int) -> float:
        t = _check_step(t)
        return self.rho0 * self.factor ** (t // self.every)

    def spec(self) -> dict[str, Any]:
        return {"kind": "decay", "rho0": self.rho0, "factor": self.factor, "every": self.every}

    def __repr__(self) -> str:
        return f"DecayEveryK(rho0={self.rho0:g}, factor={self.factor:g}, every={self.every})"


def make_schedule(schedule: Any, rho0: float, *, num_steps: int | None = None, **options: Any) -> Schedule:
    r"""Build a schedule from a name (or check and return a schedule object).

    Parameters
    ----------
    schedule : {"constant", "robbins_monro", "decay"} or Schedule
        A name, or an object with ``rho0`` and ``__call__(t)`` (returned unchanged; ``rho0`` is then ignored).
    rho0 : float
        Initial step size for named schedules.
    num_steps : int, optional
        Length of the run, used for the defaults of named schedules: ``"decay"`` multiplies by 0.95 every
        ``max(1, num_steps // 20)`` steps (20 decays per run, as in the paper's 10^5 iterations with k = 5000);
        ``"robbins_monro"`` uses ``tau = max(1, num_steps / 10)``, ``kappa = 0.6``.
    **options
        Passed on to the schedule (``tau``, ``kappa``, ``factor``, ``every``); overrides the defaults.

    Returns
    -------
    Schedule

    Raises
    ------
    ValueError, TypeError
        Unknown name, invalid options, or an object without ``rho0`` / ``__call__``.

    Examples
    --------
    >>> make_schedule("decay", 0.1, num_steps=100_000)
    DecayEveryK(rho0=0.1, factor=0.95, every=5000)
    """
    if isinstance(schedule, str):
        check_choice(schedule, "schedule", SCHEDULES)
        n = num_steps if num_steps is not None else 20_000
        if schedule == "constant":
            if options:
                raise ValueError(f"schedule 'constant' takes no options; got {sorted(options)}")
            return Constant(rho0)
        if schedule == "robbins_monro":
            opts = {"tau": max(1.0, n / 10.0), "kappa": 0.6}
            unknown = set(options) - set(opts)
            if unknown:
                raise ValueError(f"unknown options for schedule 'robbins_monro': {sorted(unknown)}")
            opts.update(options)
            return RobbinsMonro(rho0, **opts)
        opts = {"factor": 0.95, "every": max(1, n // 20)}
        unknown = set(options) - set(opts)
        if unknown:
            raise ValueError(f"unknown options for schedule 'decay': {sorted(unknown)}")
        opts.update(options)
        return DecayEveryK(rho0, **opts)
    if callable(schedule) and hasattr(schedule, "rho0"):
        r0 = getattr(schedule, "rho0")
        if not isinstance(r0, numbers.Real) or not (r0 > 0) or math.isinf(r0):
            raise ValueError(f"schedule.rho0 must be a positive finite number; got {r0!r}")
        return schedule
    raise TypeError(f"schedule must be one of {list(SCHEDULES)} or a schedule object with rho0 and __call__(t); "
                    f"got {type(schedule).__name__}")


def rate(schedule: Any, rho0: float, **options: Any) -> Schedule:
    r"""The step size of an engine as a function of ``t``: a name, a schedule object, or any ``callable(t)``.

    A name goes through :func:`make_schedule` (``options`` are the engine's defaults for ``tau``, ``kappa``,
    ``factor``, ``every``; ignored by ``"constant"``); a callable is returned as it is.

    Examples
    --------
    >>> rate("robbins_monro", 0.5, tau=1.0, kappa=0.6)
    RobbinsMonro(rho0=0.5, tau=1, kappa=0.6)
    >>> rate("constant", 0.5, tau=1.0, kappa=0.6)(10)
    0.5
    """
    if isinstance(schedule, str):
        return make_schedule(schedule, rho0, **({} if schedule == "constant" else options))
    if callable(schedule):
        return schedule
    raise TypeError(f"schedule must be one of {list(SCHEDULES)} or a callable(t); got {type(schedule).__name__}")
