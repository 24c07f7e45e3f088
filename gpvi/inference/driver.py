"""The driver: the one run loop every iterative engine goes through (:func:`run`).

It owns what is the same for every engine (:mod:`gpvi.inference.contract` states the contract):

* the start: ``init`` becomes a strategy (:func:`gpvi.inference.init.resolve_init`), called once; or a given
  ``state`` is checked and *copied* (``run(target, state=s)`` never changes ``s``);
* the loop up to the engine's ``num_steps``, ended early by the engine's stop rule;
* a progress bar (``engine.progress_bar``) that shows the work actually left: the steps, counted against the cap
  only when the rule cannot end the run early, then the engine's final estimate with a bar of its own;
* Ctrl-C (or a callback raising ``KeyboardInterrupt``), also while the start was found (a start whose
  ``info["interrupted"]`` is set: no step is taken): the partial result and an
  :class:`~gpvi.exceptions.InterruptedRunWarning`; the interrupted step's randomness is rewound, so resuming
  from ``result.engine_state`` repeats the uninterrupted run bit for bit;
* fault counting: steps the engine reports as ``skipped`` are counted; ``engine.faults.max_consecutive`` in a row
  end the run with :class:`~gpvi.exceptions.NumericalFaultError` carrying the state and the partial result;
* the memory budget (:class:`~gpvi.numerics.budget.MemoryBudget`) that every batched evaluation respects.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from ..exceptions import NumericalFaultError
from ..rng import resolve_generator
from ..numerics.budget import MemoryBudget
from .contract import RunReport
from .init import find_start
from .progress import Progress, warn_interrupted

__all__ = ["run"]


def _postfix(engine: Any, info: dict[str, Any]) -> dict[str, Any]:
    fn = getattr(engine, "postfix", None)
    return fn(info) if callable(fn) else {}


def run(engine: Any, target: Any, init: Any = None, *, state: Any = None, generator: torch.Generator | None = None,
        callback: Callable[[Any, dict[str, Any]], None] | None = None, budget: MemoryBudget | None = None) -> Any:
    """Run an iterative ``engine`` on ``target`` and return its posterior.

    Parameters
    ----------
    engine : IterativeEngine
    target : target
        Anything with ``log_joint`` and ``names`` (or the model an engine such as CVI needs).
    init : optional
        Where to start (see :func:`gpvi.inference.init.resolve_init`); ``None``: ``engine.default_init(target)``.
        Not allowed together with ``state``.
    state : engine state or its ``state_dict``, optional
        Resume from this state (never changed: the run works on a copy) up to ``engine.num_steps`` steps.
    generator : torch.Generator, optional
        The run's random stream (default: a fresh one seeded with ``engine.seed``). Not with ``state``.
    callback : callable, optional
        ``callback(state, info)`` after every step; raising ``KeyboardInterrupt`` stops the run like Ctrl-C.
    budget : MemoryBudget, optional
        Cap on the memory of one batched evaluation (default: :class:`MemoryBudget` ()).

    Returns
    -------
    posterior
        ``engine.result(...)``; partial (``info["interrupted"]``) after Ctrl-C.

    Raises
    ------
    NumericalFaultError
        ``engine.faults.max_consecutive`` steps in a row were skipped; ``err.state`` is the run's state,
        ``err.partial`` the posterior built from it.
    """
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable; got {type(callback).__name__}")
    if budget is None:
        budget = MemoryBudget()
    elif not isinstance(budget, MemoryBudget):
        raise TypeError(f"budget must be a gpvi.numerics.budget.MemoryBudget; got {type(budget).__name__}")
    start_interrupted = False
    if state is not None:
        if init is not None or generator is not None:
            raise ValueError("state cannot be combined with init or generator (the state carries both)")
        state = engine.resume(target, state)                # a copy: the caller's state is never changed
    else:
        start = find_start(target, init, engine.default_init(target), seed=engine.seed)
        state = engine.init(target, start, resolve_generator(engine.seed, generator))
        start_interrupted = bool(start.info.get("interrupted"))   # Ctrl-C while finding the start: no step
    stop = engine.stop_rule()
    counters_before = dict(getattr(state, "counters", {}))
    t_start, t0 = state.t, time.perf_counter()
    interrupted = stopped = False
    total = None if stop.may_stop_early else engine.num_steps
    bar = Progress(total, enabled=engine.progress_bar, desc=engine.name, initial=state.t)
    try:
        if start_interrupted:
            raise KeyboardInterrupt
        while state.t < engine.num_steps:
            snap = state.generator.get_state()
            try:
                state, info = engine.step(target, state)
            except KeyboardInterrupt:
                state.generator.set_state(snap)             # the step did not happen: rewind its randomness
                raise
            if info.get("skipped"):
                state.consecutive_failures += 1
                if state.consecutive_failures >= engine.faults.max_consecutive:
                    raise NumericalFaultError(
                        f"{engine.name}: {state.consecutive_failures} consecutive steps failed (no usable update, "
                        f"last at step {state.t - 1}); err.state holds the parameters of the last good step (the "
                        f"skipped steps changed nothing else)", state=state)
            else:
                state.consecutive_failures = 0
            bar.update(1, **_postfix(engine, info))
            if callback is not None:
                callback(state, info)
            if stop(state, info):
                stopped = True
                break
    except KeyboardInterrupt:
        interrupted = True
        bar.close()
        warn_interrupted(engine.name, state.t, engine.num_steps)
    except NumericalFaultError as err:
        bar.close()
        run_time = time.perf_counter() - t0
        state.wall_time += run_time
        report = RunReport(interrupted=False, stopped_early=False, time_s=run_time,
                           steps_this_run=state.t - t_start, budget=budget, faulted=True,
                           extra={"counters_before": counters_before})
        err.partial = engine.result(target, state, report)
        raise
    finally:
        bar.close()
    run_time = time.perf_counter() - t0
    state.wall_time += run_time
    report = RunReport(interrupted=interrupted, stopped_early=stopped, time_s=run_time,
                       steps_this_run=state.t - t_start, budget=budget, progress_bar=engine.progress_bar,
                       extra={"counters_before": counters_before})
    return engine.result(target, state, report)

