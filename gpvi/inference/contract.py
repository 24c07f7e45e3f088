r"""The engine contract: what every iterative engine offers the driver (:mod:`gpvi.inference.driver`).

An engine is a small object of validated settings (its ``__init__`` only checks and stores them). Everything
that evolves during a run lives in a *state* object the engine creates and advances; the run loop itself --
progress bar, Ctrl-C, fault counting, the stop rule, checkpoints, the memory budget -- belongs to the driver, so
every engine is run the same way (after BlackJAX's ``init``/``step`` kernels with ``run_inference_algorithm``,
and NumPyro's ``MCMCKernel`` / ``MCMC`` split):

.. code-block:: text

    state = engine.init(target, start, generator)        # start: a Start from gpvi.inference.init
    while not stop(state, info):                          # stop = engine.stop_rule()
        state, info = engine.step(target, state)          # info["skipped"]: a step that changed nothing
    posterior = engine.result(target, state, report)      # report: RunReport (interrupted, times, budget)

``step`` may update the state's buffers in place where that is the point (a cached Cholesky factor kept current
by rank-one updates); the driver therefore works on its own copy of any state handed to it, so
``engine.run(target, state=s)`` never changes ``s``, and a posterior never aliases a state that is still running.

Names: ``num_steps`` is the cap on steps of an iterative engine, ``num_draws`` a number of Monte Carlo draws
(per step, or for an estimate), ``seed`` the seed of the run's generator (default 0 everywhere: runs repeat).
"""

from __future__ import annotations

import copy
import math
import warnings
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

import torch

from ..exceptions import NumericalWarning
from ..rng import generator_from_state
from ..validation import check_nonnegative_int, check_positive_int
from .progress import trace_from_tensor, trace_to_tensor

__all__ = ["EngineState", "StopRule", "IterativeEngine", "RunReport", "FaultPolicy", "NeverStop", "RunState",
           "resume_copy", "count_draws", "skip_step", "record_bound", "clone_tensors", "run_state_dict", "run_state_fields",
           "warn_faults", "bound_draws"]


@runtime_checkable
class EngineState(Protocol):
    """What the driver needs of a state: the step counter, the generator, copies and a plain ``state_dict``."""

    t: int
    generator: torch.Generator

    def copy(self) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...


@runtime_checkable
class StopRule(Protocol):
    """Decides after each step whether the run ends before the engine's ``num_steps`` cap.

    ``may_stop_early`` tells the driver whether the number of steps is known in advance (it is not when the rule
    can end the run early: the progress bar then counts steps without pretending to know the total).
    """

    may_stop_early: bool

    def __call__(self, state: Any, info: dict[str, Any]) -> bool: ...


class NeverStop:
    """The stop rule of an engine that always runs its ``num_steps`` steps."""

    may_stop_early = False

    def __call__(self, state: Any, info: dict[str, Any]) -> bool:
        return False

    def __repr__(self) -> str:
        return "NeverStop()"


@runtime_checkable
class IterativeEngine(Protocol):
    """The contract of an iterative engine (DSVI, DSVI-ARD, Salimans-Knowles, CVI).

    Attributes
    ----------
    name : str
        Shown in progress bars, warnings and errors.
    num_steps : int
        Cap on the total number of steps (a resumed run continues up to it).
    seed : int or None
        Seed of a fresh run's generator.
    progress_bar : bool
    faults : FaultPolicy
    """

    name: str
    num_steps: int
    seed: int | None
    progress_bar: bool
    faults: FaultPolicy

    def default_init(self, target: Any) -> Any:
        """The init strategy used when ``run`` gets ``init=None`` (a value from :mod:`gpvi.inference.init`)."""

    def init(self, target: Any, start: Any, generator: torch.Generator) -> Any:
        """A fresh state at ``start`` (a :class:`gpvi.inference.init.Start`) using ``generator``."""

    def resume(self, target: Any, state: Any) -> Any:
        """Check ``state`` (a state or its ``state_dict``) against ``target`` and the settings; return a copy."""

    def step(self, target: Any, state: Any) -> tuple[Any, dict[str, Any]]:
        """One step; ``info["skipped"]`` is True when the step found no usable update (a fault)."""

    def stop_rule(self) -> StopRule:
        """The rule that may end the run before ``num_steps``."""

    def result(self, target: Any, state: Any, report: RunReport) -> Any:
        """The posterior for ``state`` (it keeps a copy of the state, never the state itself)."""


@dataclass(frozen=True)
class FaultPolicy:
    """How a run survives steps that fail numerically (no draw with a finite log joint and gradient, say).

    Parameters
    ----------
    max_consecutive : int
        A run with this many skipped steps in a row ends with :class:`~gpvi.exceptions.NumericalFaultError`,
        whose ``state`` is the run's last state (the skipped steps changed nothing but the step counter and the
        generator) and ``partial`` the posterior built from it.
    max_resample : int
        Rounds of redrawing, within one step, the Monte Carlo draws whose log joint or derivatives are NaN/inf
        (>= 0; used by the engines that draw theta: DSVI, DSVI-ARD, Salimans-Knowles). Draws still invalid
        after these rounds are dropped and counted; a step left with no valid draw is skipped.

    Examples
    --------
    >>> FaultPolicy(max_consecutive=5, max_resample=2)
    FaultPolicy(max_consecutive=5, max_resample=2)
    """

    max_consecutive: int = 20
    max_resample: int = 10

    def __post_init__(self) -> None:
        if isinstance(self.max_consecutive, bool) or not isinstance(self.max_consecutive, int) \
                or self.max_consecutive < 1:
            raise ValueError(f"max_consecutive must be an int >= 1; got {self.max_consecutive!r}")
        object.__setattr__(self, "max_resample", check_nonnegative_int(self.max_resample, "max_resample"))

    @classmethod
    def coerce(cls, value: Any, default: FaultPolicy | None = None) -> Any:
        """``value`` as this class: ``None`` gives ``default`` (else ``cls()``), an instance is kept, a plain
        :class:`FaultPolicy` is extended with this class's defaults; anything else is a ``TypeError``."""
        if value is None:
            return cls() if default is None else default
        if isinstance(value, cls):
            return value
        if isinstance(value, FaultPolicy):
            return cls(max_consecutive=value.max_consecutive, max_resample=value.max_resample)
        raise TypeError(f"faults must be a gpvi.inference.contract.FaultPolicy (or {cls.__name__}); got "
                        f"{type(value).__name__}")


# ------------------------------------------------------------------ shared by the Monte Carlo engines' states
def resume_copy(state: Any, cls: type, dim: int | None = None) -> Any:
    """What ``engine.resume`` starts from: a copy of ``state`` (an instance of the engine's state class ``cls``) or
    ``cls.from_state_dict(state)`` for its ``state_dict``; ``TypeError`` for anything else, ``ValueError`` for a
    dict that lacks an entry of this gpvi's ``state_dict`` or when ``dim`` is given and the state's ``dim`` differs
    (the target's D)."""
    if isinstance(state, dict):
        try:
            state = cls.from_state_dict(state)
        except KeyError as exc:
            raise ValueError(f"state lacks the entry {exc}: not a state_dict() of this gpvi's {cls.__name__}") from None
    elif isinstance(state, cls):
        state = state.copy()
    else:
        raise TypeError(f"state must be a {cls.__name__} or its state_dict; got {type(state).__name__}")
    if dim is not None and state.dim != dim:
        raise ValueError(f"state has dimension {state.dim} but the target has D = {dim}")
    return state


class RunState:
    """What the states of DSVI and Salimans-Knowles share beyond their fields: the rolling bound average, copies
    and in-place loading, both through the subclass's ``state_dict`` / ``from_state_dict``."""

    def bound_average(self) -> float:
        """Rolling-window average of the instantaneous bound (NaN before the first valid step)."""
        window = self.window  # type: ignore[attr-defined]
        return sum(window) / len(window) if window else math.nan

    def copy(self) -> Any:
        """An independent deep copy (tensors cloned, generator state copied)."""
        return type(self).from_state_dict(self.state_dict())  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Overwrite this state with the contents of ``state_dict()`` output."""
        new = type(self).from_state_dict(state)  # type: ignore[attr-defined]
        for f in fields(self):  # type: ignore[arg-type]
            setattr(self, f.name, getattr(new, f.name))


def count_draws(state: Any, name: str, what: str, *, resampled: int, dropped: int, calls: int) -> None:
    """Add one step's redrawn and dropped draws and log-joint calls to ``state.counters``, with a
    :class:`~gpvi.exceptions.NumericalWarning` at the run's first redraw (``what`` was NaN/inf)."""
    cnt = state.counters
    if cnt["resampled_draws"] == 0 and resampled > 0:
        warnings.warn(f"{name}: {what} was NaN/inf for {resampled} draw(s) at step {state.t}; redrawn (counted in "
                      f"info['resampled_draws'])", NumericalWarning, stacklevel=3)
    cnt["resampled_draws"] += resampled
    cnt["dropped_draws"] += dropped
    cnt["log_joint_calls"] += calls


def bound_draws(num_draws: int | None, num_elbo_draws: int) -> int:
    """The draws of a public ``estimate_bound`` call: ``num_draws`` (>= 1), else the engine's ``num_elbo_draws``
    (``ValueError`` when that is 0)."""
    n = num_elbo_draws if num_draws is None else check_positive_int(num_draws, "num_draws")
    if n == 0:
        raise ValueError("num_draws must be >= 1 for a bound estimate (num_elbo_draws is 0)")
    return n


def warn_faults(name: str, counters: dict[str, int], before: dict[str, int], keys: tuple[str, ...], *,
                stacklevel: int) -> None:
    """One :class:`~gpvi.exceptions.NumericalWarning` at the end of a run whose fault ``counters`` (those named in
    ``keys``) grew since ``before`` (the counters when the run started), naming each that did."""
    diff = {k: counters.get(k, 0) - before.get(k, 0) for k in keys}
    if any(v > 0 for v in diff.values()):
        parts = ", ".join(f"{k}={v}" for k, v in diff.items() if v > 0)
        warnings.warn(f"{name} survived numerical faults in this run: {parts} (see q.info)", NumericalWarning,
                      stacklevel=stacklevel)


def skip_step(state: Any, info: dict[str, Any], name: str, finite: str, max_resample: int) -> None:
    """Book a step left with no valid draw: counted in ``skipped_steps``, ``info["skipped"]``, one
    :class:`~gpvi.exceptions.NumericalWarning` per streak of such steps, and ``t + 1`` (nothing else changes;
    the driver counts the streak against :class:`FaultPolicy`)."""
    state.counters["skipped_steps"] += 1
    info["skipped"] = True
    if state.consecutive_failures == 0:
        warnings.warn(f"{name}: step {state.t} skipped (no draw with a finite {finite} after {max_resample} "
                      f"resampling rounds)", NumericalWarning, stacklevel=3)
    state.t += 1


def record_bound(state: Any, bound: float, info: dict[str, Any], **trace: float) -> float:
    """Record one step's instantaneous bound: into the rolling window when finite, and into ``state.trace`` with
    its rolling average and the other per-step values in ``trace``; ``info`` gets ``t``, ``bound`` and
    ``bound_avg``. Returns the rolling average (the states of DSVI and Salimans-Knowles keep both the same way)."""
    if math.isfinite(bound):
        state.window.append(bound)
    avg = state.bound_average()
    tr = state.trace
    tr["bound"].append(bound)
    tr["bound_avg"].append(avg)
    for k, v in trace.items():
        tr[k].append(v)
    info.update(t=state.t, bound=bound, bound_avg=avg)
    return avg


def clone_tensors(d: dict[str, Any]) -> dict[str, Any]:
    """A shallow copy of ``d`` with its tensor values cloned."""
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}


def run_state_dict(state: Any) -> dict[str, Any]:
    """The part of a DSVI / Salimans-Knowles ``state_dict`` both share: generator, rolling window, trace,
    counters, fault streak, wall time and how the run started (plain values, ``torch.save``-able)."""
    return {
        "generator_state": state.generator.get_state(), "generator_device": str(state.generator.device),
        "window": list(state.window), "window_size": state.window.maxlen,
        "trace": {k: trace_to_tensor(v) for k, v in state.trace.items()},
        "counters": dict(state.counters), "consecutive_failures": state.consecutive_failures,
        "wall_time": state.wall_time, "init_info": copy.deepcopy(state.init_info),
    }


def run_state_fields(saved: dict[str, Any]) -> dict[str, Any]:
    """The constructor arguments rebuilt from :func:`run_state_dict`'s keys."""
    return {
        "generator": generator_from_state(saved),
        "window": deque(saved["window"], maxlen=saved["window_size"]),
        "trace": {k: trace_from_tensor(v) for k, v in saved["trace"].items()},
        "counters": dict(saved["counters"]),
        "consecutive_failures": int(saved["consecutive_failures"]), "wall_time": float(saved["wall_time"]),
        "init_info": copy.deepcopy(saved["init_info"]),
    }


@dataclass
class RunReport:
    """What the driver tells ``engine.result`` about the run that produced a state.

    Attributes
    ----------
    interrupted : bool
        Ctrl-C (or a callback raising ``KeyboardInterrupt``) ended the run; the result is partial.
    stopped_early : bool
        The stop rule ended the run before ``num_steps``.
    time_s : float
        Seconds spent in this call of ``run`` (the steps; the final estimate is timed by the engine).
    steps_this_run : int
    budget : MemoryBudget
        The budget every batched evaluation of the result must respect.
    progress_bar : bool
        Whether the result may show a bar of its own (the final bound estimate).
    faulted : bool
        The run ended on a :class:`~gpvi.exceptions.NumericalFaultError`; the result is partial.
    """

    interrupted: bool
    stopped_early: bool
    time_s: float
    steps_this_run: int
    budget: Any
    progress_bar: bool = False
    faulted: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        """Whether the result is partial (interrupted or faulted): no final estimate is computed then."""
        return self.interrupted or self.faulted

