r"""Option groups of :class:`~gpvi.inference.salimans_knowles.engine.SKGaussian`: small frozen, validated values.

* :class:`SKSchedule` -- the paper's step size :math:`w` and averaging window, and the window-split check;
* :class:`HessianSource` -- where Algorithm 2's Hessians come from (autograd or central finite differences);
* :class:`SKFaultPolicy` -- the shared :class:`~gpvi.inference.contract.FaultPolicy` (consecutive skipped steps,
  resampling of invalid draws) plus what a non-positive-definite precision update does.

Names follow the paper: ``step_size`` = :math:`w`, ``num_steps`` = :math:`N`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...validation import check_choice, check_fraction, check_positive, check_positive_int
from ..contract import FaultPolicy

__all__ = ["SKSchedule", "HessianSource", "SKFaultPolicy", "HESSIAN_SOURCES", "ON_NON_PD"]

HESSIAN_SOURCES = ("auto", "autograd", "fd")
ON_NON_PD = ("reject", "keep", "raise")


@dataclass(frozen=True)
class SKSchedule:
    r"""Step size and averaging window of Algorithms 1-2 (Salimans & Knowles 2013), and the window-split check.

    Parameters
    ----------
    step_size : float, optional
        :math:`w` in (0, 1], the weight of the newest estimate in the running averages; default
        :math:`1/\sqrt N` (paper Algorithm 2), resolved by :meth:`w`.
    average_fraction : float
        Fraction in (0, 1] of the final steps whose statistics are averaged for the output (paper: 0.5).
    drift_tol : float
        The averaging window is split in two halves and :math:`(m, V)` computed from each; a
        :class:`~gpvi.exceptions.ConvergenceWarning` is issued when the means differ by more than ``drift_tol``
        posterior sds or the sds by more than a factor ``exp(drift_tol)`` (``inf`` switches the check off).
    burn_in_draws : int, optional
        Draws per step before the averaging window (default None: the engine's ``num_draws`` throughout; even for
        ``method="gradient"``). Those steps only move :math:`q_t` towards the optimum: the output is the regression
        on the window's draws alone, so fewer draws there cost less than fewer in the window
        (``benchmarks/studies/results/bayes_steps_h59d_burn.md``).

    Examples
    --------
    >>> s = SKSchedule()
    >>> s.w(100), s.window_bounds(100)
    (0.1, (50, 75))
    """

    step_size: float | None = None
    average_fraction: float = 0.5
    drift_tol: float = 0.5
    burn_in_draws: int | None = None

    def __post_init__(self) -> None:
        if self.burn_in_draws is not None:
            object.__setattr__(self, "burn_in_draws", check_positive_int(self.burn_in_draws, "burn_in_draws"))
        if self.step_size is not None:
            object.__setattr__(self, "step_size", check_fraction(self.step_size, "step_size"))
        object.__setattr__(self, "average_fraction", check_fraction(self.average_fraction, "average_fraction"))
        object.__setattr__(self, "drift_tol", check_positive(self.drift_tol, "drift_tol", allow_inf=True))

    def w(self, num_steps: int) -> float:
        r"""The step size :math:`w` of a run of ``num_steps`` steps (``step_size`` or :math:`1/\sqrt N`)."""
        return self.step_size if self.step_size is not None else 1.0 / math.sqrt(num_steps)

    def draws_at(self, t: int, num_steps: int, num_draws: int) -> int:
        """Draws of step ``t + 1`` (``t`` steps taken) of a run of ``num_steps`` steps with ``num_draws`` per step in
        the window: ``burn_in_draws`` before the window where set."""
        if self.burn_in_draws is None or t >= self.window_bounds(num_steps)[0]:
            return num_draws
        return self.burn_in_draws

    def window_bounds(self, num_steps: int) -> tuple[int, int]:
        """``(start, mid)``: steps t (1-based) with start < t <= mid are the window's first half, mid < t <= N the
        second half."""
        start = num_steps - max(1, int(math.ceil(self.average_fraction * num_steps)))
        return start, start + (num_steps - start) // 2


@dataclass(frozen=True)
class HessianSource:
    r"""Where the Hessians :math:`\nabla^2\log g` of Algorithm 2 (and of ``init_scale="laplace"``) come from.

    Parameters
    ----------
    kind : {"auto", "autograd", "fd"}
        ``"autograd"``: double backward (D extra backward passes per call); ``"fd"``: central differences of
        the gradient, :math:`2D + 1` log-joint rows per point in one batched call; ``"auto"``: autograd if the
        target supports double backward (probed once at the initial mean), else finite differences -- the
        engine records what it resolved to and why in ``info["hessian"]`` / ``info["hessian_note"]``.
    fd_step : float
        Relative step of the finite differences, :math:`h_d = \text{fd\_step}\,(1 + |\theta_d|)`, in (0, 0.1).

    Examples
    --------
    >>> HessianSource("fd", fd_step=1e-5)
    HessianSource(kind='fd', fd_step=1e-05)
    """

    kind: str = "auto"
    fd_step: float = 1e-4

    def __post_init__(self) -> None:
        check_choice(self.kind, "hessian", HESSIAN_SOURCES)
        step = check_positive(self.fd_step, "fd_step")
        if step >= 0.1:
            raise ValueError(f"fd_step must be < 0.1 (a relative finite-difference step); got {step:g}")
        object.__setattr__(self, "fd_step", step)

    @classmethod
    def coerce(cls, value: Any) -> HessianSource:
        """A :class:`HessianSource` from itself or from one of the kind names."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(value)
        raise TypeError(f"hessian must be one of {list(HESSIAN_SOURCES)} or a HessianSource; got "
                        f"{type(value).__name__}")


@dataclass(frozen=True)
class SKFaultPolicy(FaultPolicy):
    r"""The shared :class:`~gpvi.inference.contract.FaultPolicy` plus what S&K does with a non-positive-definite update.

    Parameters
    ----------
    max_consecutive, max_resample : int
        As in :class:`~gpvi.inference.contract.FaultPolicy`: consecutive skipped steps (no draw with a finite log
        joint and derivatives) that end the run with :class:`~gpvi.exceptions.NumericalFaultError`, and rounds of
        redrawing draws whose log joint, gradient or Hessian is NaN/inf, per step.
    on_non_pd : {"reject", "keep", "raise"}
        What to do when an update would make the running precision :math:`P_{t+1}` not positive definite
        (possible early on, with a large :math:`w`, a poor start or a heavy-tailed target; paper section 4).
        ``"reject"``: the step's draws do not enter the running statistics and :math:`q_t` is kept, so the
        iteration only moves between valid Gaussians (an update that would flip :math:`P` indefinite is an
        outlier against the running average; absorbing it can start a runaway towards ever wider q on
        heavy-tailed targets). ``"keep"``: the statistics absorb the draws (the paper's recursion) but draws keep
        coming from the last valid :math:`q_t` until :math:`P` is positive definite again. ``"raise"``: stop at
        once with :class:`~gpvi.exceptions.NumericalFaultError`.

    A plain ``FaultPolicy`` given to :class:`~gpvi.inference.salimans_knowles.engine.SKGaussian` means ``on_non_pd="reject"``.

    Examples
    --------
    >>> SKFaultPolicy(max_consecutive=5, on_non_pd="keep")
    SKFaultPolicy(max_consecutive=5, max_resample=10, on_non_pd='keep')
    """

    on_non_pd: str = "reject"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self.on_non_pd, "on_non_pd", ON_NON_PD)
