r"""How a posterior was computed: :class:`RunInfo`, the ``info`` of every posterior.

Every engine fills the same named fields -- which engine ran, whether its convergence rule held, whether Ctrl-C
ended it, how many steps it took and how long -- and keeps what is its own (learning rates, tree depths, the
restarts' table, ...) in ``details``. The fields are read as attributes (``q.info.converged``); every entry, a
field, a counter, a detail or a setting, is also read by name (``q.info["converged"]``, ``q.info["skipped_steps"]``,
``q.info["lr_mu"]``, ``q.info["num_steps"]``), so engine-specific entries need no field of their own.

Times: ``time_s`` is the wall time of the call that returned the posterior, ``total_time_s`` that of every call of
a resumed run together (equal for a run that was never resumed).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["RunInfo"]


@dataclass(eq=False)
class RunInfo(MutableMapping):
    """What a run did: the same named fields for every engine, engine-specific entries in ``details``.

    Attributes
    ----------
    engine : str
        The engine's name (``"DSVI"``, ``"SKGaussian"``, ``"CVI"``, ``"ML2"``, ``"NUTS"``, ...); empty for a
        posterior no engine produced (e.g. one built by hand or by :func:`gpvi.infer`'s weighting).
    converged : bool or None
        The engine's own convergence rule held (DSVI's plateau rule, S&K's window-split check, CVI's relative ELBO
        change, the optimiser's tolerance for ML-II; for NUTS / HMC no problem in ESS, R-hat, divergences, tree
        depth or E-BFMI); None where no rule applies.
    interrupted : bool
        Ctrl-C ended the run: the posterior is partial (and the state kept in it resumes the run).
    steps : int or None
        Steps taken over the whole run (engine steps, MCMC iterations per chain, optimiser iterations).
    time_s, total_time_s : float
        Wall time (s) of the call that returned the posterior, and of every call of a resumed run.
    settings : dict
        The engine's settings as plain values; each is also read by name unless a detail has the same name.
    counters : dict of str to int
        Event counts (skipped steps, resampled draws, non-positive-definite updates, log-joint calls, ...); each is
        also read by name.
    details : dict
        Everything else the engine records (its docstring lists the entries).

    Examples
    --------
    >>> info = RunInfo(engine="DSVI", converged=True, steps=800, counters={"skipped_steps": 0}, details={"lr_mu": 0.1})
    >>> info.converged, info["steps"], info["skipped_steps"], info["lr_mu"]
    (True, 800, 0, 0.1)
    >>> info["lr_mu"] = 0.05                        # a new or changed entry goes to details
    >>> RunInfo.of(dict(info)).details["lr_mu"]     # plain-dict round trip (saved files)
    0.05
    """

    engine: str = ""
    converged: bool | None = None
    interrupted: bool = False
    steps: int | None = None
    time_s: float = math.nan
    total_time_s: float = math.nan
    settings: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, info: Mapping[str, Any] | None) -> RunInfo:
        """A new ``RunInfo`` from another one (a shallow copy: its dicts are copied) or from a plain mapping, whose
        entries named like a field fill that field and the rest become ``details``."""
        if isinstance(info, RunInfo):
            return cls(**{f.name: (dict(v) if isinstance(v := getattr(info, f.name), dict) else v)
                          for f in fields(cls)})
        if info is not None and not isinstance(info, Mapping):
            raise TypeError(f"info must be a RunInfo, a mapping or None; got {type(info).__name__}")
        out = cls()
        for key, value in (info or {}).items():
            out[str(key)] = value
        return out

    # -- mapping access: fields, then counters, then details, then settings
    def __getitem__(self, key: str) -> Any:
        if key in _FIELDS:
            return getattr(self, key)
        for group in (self.counters, self.details, self.settings):
            if key in group:
                return group[key]
        raise KeyError(key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key in _FIELDS:
            setattr(self, key, dict(value) if key in _DICT_FIELDS else value)
        elif key in self.counters:
            self.counters[key] = value
        else:
            self.details[key] = value

    def __delitem__(self, key: str) -> None:
        if key in _FIELDS:
            raise KeyError(f"{key!r} is a field of RunInfo and cannot be deleted")
        del self.details[key]

    def __contains__(self, key: object) -> bool:
        return key in _FIELDS or key in self.counters or key in self.details or key in self.settings

    def __iter__(self) -> Iterator[str]:
        """The fields, then the details (counters and settings under their fields): ``dict(info)`` is the plain
        form that :meth:`of` reads back."""
        yield from _FIELDS
        yield from self.details

    def __len__(self) -> int:
        return len(_FIELDS) + len(self.details)

    def __repr__(self) -> str:
        def short(v: Any) -> str:
            return f"{v:.3g}" if isinstance(v, float) else repr(v)

        head = ", ".join(f"{k}={short(getattr(self, k))}" for k in _FIELDS[:6])
        fired = {k: v for k, v in self.counters.items() if v}
        return (f"RunInfo({head}, counters={fired or '{}'}"
                + (f", details: {', '.join(self.details)}" if self.details else "") + ")")


_FIELDS = tuple(f.name for f in fields(RunInfo) if f.name != "details")
_DICT_FIELDS = ("settings", "counters")
