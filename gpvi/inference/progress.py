"""Progress bars and interruption for long runs (DSVI, CVI, HMC, ML-II restarts).

Every engine's ``run`` accepts ``progress_bar=True`` (a tqdm bar, with the running bound or acceptance
rate in its postfix) and ``callback=`` (called after each step; it may raise ``KeyboardInterrupt`` to
stop). Ctrl-C or such a callback ends the loop cleanly: the engine returns what was computed so far and
warns with :class:`~gpvi.exceptions.InterruptedRunWarning`. Callers that must not go on with a partial result
(:meth:`gpvi.GPClassifier.fit`, the demo) run engines inside :func:`interrupt_propagates`, where Ctrl-C leaves
the call as ``KeyboardInterrupt``.
"""

from __future__ import annotations

import contextlib
import logging
from array import array
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..exceptions import InterruptedRunWarning

__all__ = ["Progress", "warn_interrupted", "interrupt_propagates", "trace_to_tensor", "trace_from_tensor", "logger"]

logger = logging.getLogger("gpvi")


class Progress:
    """A tqdm bar that can be switched off, with a throttled postfix.

    Parameters
    ----------
    total : int or None
        Number of steps; ``None`` when it is not known in advance (a run that a stop rule may end early): the bar
        then counts steps and shows the rate without a misleading percentage.
    enabled : bool
        ``False`` gives a silent object with the same methods.
    desc : str
    initial : int
        Steps already done (resumed runs).
    min_interval : float
        Seconds between postfix refreshes.
    """

    def __init__(self, total: int | None, *, enabled: bool = True, desc: str = "", initial: int = 0,
                 min_interval: float = 0.25, leave: bool = True) -> None:
        self.enabled = bool(enabled)
        self._bar = None
        self._last = 0.0
        self._pending: dict[str, Any] | None = None     # newest postfix not yet shown (throttled)
        self.min_interval = min_interval
        if self.enabled:
            self._bar = tqdm(total=total, desc=desc, initial=initial, leave=leave, dynamic_ncols=True)

    def update(self, n: int = 1, **postfix: Any) -> None:
        if self._bar is None:
            return
        self._bar.update(n)
        now = time.monotonic()
        if not postfix:
            return
        if now - self._last >= self.min_interval:
            self._set_postfix(postfix, refresh=False)
            self._last = now
            self._pending = None
        else:
            self._pending = postfix

    def _set_postfix(self, postfix: dict[str, Any], refresh: bool) -> None:
        self._bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in postfix.items()},
                              refresh=refresh)

    def close(self) -> None:
        if self._bar is not None:
            if self._pending is not None:               # the bar's last line shows the final values
                self._set_postfix(self._pending, refresh=True)
                self._pending = None
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def warn_interrupted(what: str, done: int, total: int, *, unit: str = "steps",
                     resume: str = "resume from its state_dict to continue") -> None:
    """Warn that ``what`` stopped after ``done`` of ``total`` ``unit`` and returned its partial result (``resume``:
    how to go on)."""
    warnings.warn(f"{what} interrupted after {done} of {total} {unit}; returning the result so far ({resume})",
                  InterruptedRunWarning, stacklevel=3)


@contextlib.contextmanager
def interrupt_propagates() -> Iterator[None]:
    """Inside this context, Ctrl-C leaves the call: an engine's partial result is not returned.

    An interrupted engine warns with :class:`~gpvi.exceptions.InterruptedRunWarning` before it returns its partial
    result; here that warning is an error, re-raised as ``KeyboardInterrupt`` (chained to it) where the engine
    stopped, so nothing after it runs. Other warnings are left to the caller's filters.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("error", InterruptedRunWarning)
        try:
            yield
        except InterruptedRunWarning as stop:
            raise KeyboardInterrupt(str(stop)) from stop


def trace_to_tensor(a: array) -> torch.Tensor:
    """Copy a float64 ``array.array`` run trace (cheap to append to per step) into a new float64 tensor."""
    # traces live on the CPU: from_numpy ignores a default device set with torch.set_default_device
    return torch.from_numpy(np.frombuffer(a.tobytes(), dtype=np.float64).copy())


def trace_from_tensor(t: torch.Tensor) -> array:
    """The inverse of :func:`trace_to_tensor`: a float64 ``array.array`` holding the values of ``t``."""
    return array("d", torch.as_tensor(t, dtype=torch.float64, device="cpu").numpy().tobytes())
