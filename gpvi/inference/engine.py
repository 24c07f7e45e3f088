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

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["EngineState", "StopRule", "IterativeEngine", "RunReport", "FaultPolicy", "NeverStop"]


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
    """

    max_consecutive: int = 20

    def __post_init__(self) -> None:
        if isinstance(self.max_consecutive, bool) or not isinstance(self.max_consecutive, int) \
                or self.max_consecutive < 1:
            raise ValueError(f"max_consecutive must be an int >= 1; got {self.max_consecutive!r}")


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

