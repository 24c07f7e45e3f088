r"""What evolves during a CVI run: :class:`CVIState`.

:meth:`gpvi.CVI.step` advances a state **in place** -- the point of a single-site step is to update the cached
N x N factor of :math:`K + S` without copying it -- and returns it. The driver (:func:`gpvi.inference.driver.run`)
works on its own copy of any state handed to ``run(state=...)``; keep a checkpoint yourself with :meth:`CVIState.copy`
or :meth:`CVIState.state_dict`.

Names: ``lam1``, ``lam2`` (the sites :math:`\tilde\lambda^{(1)}, \tilde\lambda^{(2)}`), ``theta`` (kernel
log-hyperparameters), ``t`` (steps taken), ``factor`` (the lower Cholesky factor of :math:`K + S`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ...rng import generator_from_state
from ...validation import as_float_tensor

__all__ = ["CVIState", "COUNTERS", "TRACE_KEYS"]

COUNTERS = ("sites_shrunk", "sites_rejected", "sites_nonfinite", "sites_floored", "faults", "refactorisations",
            "factor_faults", "jitter_events")
TRACE_KEYS = ("step", "sweep", "elbo", "residual", "drift", "time_s")
STATE_VERSION = 2
"""Version of :meth:`CVIState.state_dict`; :meth:`CVIState.from_state_dict` refuses other versions."""


def _counters() -> dict[str, float]:
    return {**{k: 0 for k in COUNTERS}, "max_drift": 0.0}


@dataclass
class CVIState:
    r"""Everything that evolves during a CVI run (settings stay in :class:`gpvi.CVI`).

    Attributes
    ----------
    lam1, lam2 : torch.Tensor of shape (N,) or (N, K)
        Site parameters :math:`\tilde\lambda^{(1)}, \tilde\lambda^{(2)}` of one latent function or of K
        (``lam2 < 0`` once initialised). A step replaces them by new tensors (never writes into them).
    theta : torch.Tensor of shape (D,)
        Kernel log-hyperparameters.
    generator : torch.Generator
        The run's random stream (site order, Monte Carlo draws).
    t : int
        Steps taken (a full-batch step or a single-site batch each count as one; skipped steps too).
    sites_updated : int
        Data points visited so far (``sites_updated / N`` = sweeps).
    initialised : bool
        ``False``: the sites are still 0 and :math:`q` is the prior.
    factor : torch.Tensor of shape (N, N) or (K, N, N), or None
        The cached (rank-one-updated, in place) lower Cholesky factor(s) of :math:`K + S_k` (stochastic mode),
        viewed from contiguous upper storage. ``None``: computed from scratch at the next step.
    since_refactor : int
        Single-site steps since the factor was last computed from scratch.
    order : torch.Tensor of shape (N,) or None
        The current sweep's random permutation of the sites; ``order_pos`` the next position in it.
    elbo : float
        ELBO at the last check (nan before the first).
    beta_scale : float
        Fault back-off: the step size is multiplied by this (1 normally; halved after each failed step).
    converged : bool
        Whether the last check met the tolerance.
    consecutive_failures : int
        Current streak of skipped steps (kept by the driver).
    wall_time : float
        Seconds spent in ``run`` (all segments of a resumed run; kept by the driver).
    step_time_s : float
        Seconds spent inside steps (what ``trace["time_s"]`` records at each check).
    counters : dict of str to float
        ``sites_shrunk``, ``sites_rejected``, ``sites_nonfinite``, ``sites_floored``, ``faults``,
        ``refactorisations``, ``factor_faults``, ``jitter_events``, ``max_drift`` (single-site steps may add
        ``unstable_updates``, the ELBO-monotone runs ``backtracks``, the type-II loop
        ``theta_phases``, ``theta_evaluations``, ``inner_steps``).
    kept_lam1, kept_lam2, redo
        The ELBO-monotone full-batch runs of K latent functions (:func:`gpvi.inference.cvi.steps.keep_monotone`):
        the last accepted sites (their ELBO is ``elbo``, the last check) and whether the next step starts from
        them again after a step that lowered the ELBO was undone (``None``, False elsewhere).
    trace : dict of str to list
        Per check: ``step``, ``sweep``, ``elbo``, ``residual`` (:math:`\max_n|\hat g_n - \tilde\lambda_n|`, full
        mode), ``drift`` (stochastic mode), ``time_s``.

    Examples
    --------
    >>> import torch
    >>> st = CVIState(torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64),
    ...               torch.zeros(2, dtype=torch.float64), torch.Generator().manual_seed(0))
    >>> CVIState.from_state_dict(st.state_dict()).t
    0
    >>> z = torch.zeros(4, 3, dtype=torch.float64)
    >>> CVIState(z, z.clone(), torch.zeros(2, dtype=torch.float64), torch.Generator()).num_latent
    3
    """

    VERSION: ClassVar[int] = STATE_VERSION
    """The ``version`` that :meth:`state_dict` writes."""

    lam1: torch.Tensor
    lam2: torch.Tensor
    theta: torch.Tensor
    generator: torch.Generator
    t: int = 0
    sites_updated: int = 0
    initialised: bool = False
    factor: torch.Tensor | None = None
    since_refactor: int = 0
    order: torch.Tensor | None = None
    order_pos: int = 0
    elbo: float = math.nan
    beta_scale: float = 1.0
    converged: bool = False
    consecutive_failures: int = 0
    wall_time: float = 0.0
    step_time_s: float = 0.0
    counters: dict[str, float] = field(default_factory=_counters)
    trace: dict[str, list] = field(default_factory=lambda: {k: [] for k in TRACE_KEYS})
    kept_lam1: torch.Tensor | None = None
    kept_lam2: torch.Tensor | None = None
    redo: bool = False

    @property
    def num_sites(self) -> int:
        """N."""
        return self.lam1.shape[0]

    @property
    def num_latent(self) -> int:
        """Latent functions: 1 for sites (N,), K for sites (N, K)."""
        return 1 if self.lam1.dim() == 1 else self.lam1.shape[1]

    @property
    def sweeps(self) -> float:
        """Site updates divided by N."""
        return self.sites_updated / max(self.num_sites, 1)

    def copy(self) -> CVIState:
        """An independent deep copy (tensors cloned, the factor included, generator state copied)."""
        return type(self).from_state_dict(self.state_dict())

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume bit for bit: plain tensors, numbers, lists and dicts (``torch.save``-able)."""
        def c(t):
            return None if t is None else t.detach().clone()
        return {"version": self.VERSION, "lam1": c(self.lam1), "lam2": c(self.lam2), "theta": c(self.theta),
                "generator_state": self.generator.get_state(), "generator_device": str(self.generator.device),
                "t": self.t, "sites_updated": self.sites_updated, "initialised": self.initialised,
                "factor": c(self.factor), "since_refactor": self.since_refactor, "order": c(self.order),
                "order_pos": self.order_pos, "elbo": self.elbo, "beta_scale": self.beta_scale,
                "converged": self.converged, "consecutive_failures": self.consecutive_failures,
                "wall_time": self.wall_time, "step_time_s": self.step_time_s, "counters": dict(self.counters),
                "trace": {k: list(v) for k, v in self.trace.items()}, "kept_lam1": c(self.kept_lam1),
                "kept_lam2": c(self.kept_lam2), "redo": self.redo}

    def load_state_dict(self, state: dict[str, Any]) -> CVIState:
        """Overwrite this state from :meth:`state_dict` output (in place); returns ``self``."""
        new = type(self).from_state_dict(state)
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(new, f.name))
        return self

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> CVIState:
        """Build a state from :meth:`state_dict` output (e.g. after ``torch.load``)."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a {cls.__name__} or its state_dict(); got {type(state).__name__}")
        if state.get("version") != cls.VERSION:
            raise ValueError(f"state has version {state.get('version')!r}; this gpvi reads {cls.__name__} states of "
                             f"version {cls.VERSION} (written by {cls.__name__}.state_dict)")
        missing = {"lam1", "lam2", "theta", "generator_state"} - set(state)
        if missing:
            raise ValueError(f"state is missing {sorted(missing)}")
        lam1 = as_float_tensor(state["lam1"], "state['lam1']", ndim=(1, 2))
        lam2 = as_float_tensor(state["lam2"], "state['lam2']", ndim=lam1.dim())
        if lam1.shape != lam2.shape:
            raise ValueError(f"state['lam1'] and state['lam2'] differ in shape: {tuple(lam1.shape)} vs "
                             f"{tuple(lam2.shape)}")
        theta = as_float_tensor(state["theta"], "state['theta']", ndim=1, allow_empty=True)

        def opt(key: str, dtype: torch.dtype) -> torch.Tensor | None:
            v = state.get(key)
            return None if v is None else torch.as_tensor(v).to(dtype).clone()

        factor = opt("factor", torch.float64)
        if factor is not None:              # the layout the in-place rank-one updates need: contiguous upper storage
            factor = factor.mT.contiguous().mT

        gen = generator_from_state(state)
        trace = {k: [] for k in TRACE_KEYS}
        trace.update({k: list(v) for k, v in dict(state.get("trace", {})).items()})
        return cls(lam1.clone(), lam2.clone(), theta.clone(), gen, t=int(state.get("t", 0)),
                   sites_updated=int(state.get("sites_updated", 0)), initialised=bool(state.get("initialised", False)),
                   factor=factor, since_refactor=int(state.get("since_refactor", 0)),
                   order=opt("order", torch.long), order_pos=int(state.get("order_pos", 0)),
                   elbo=float(state.get("elbo", math.nan)), beta_scale=float(state.get("beta_scale", 1.0)),
                   converged=bool(state.get("converged", False)),
                   consecutive_failures=int(state.get("consecutive_failures", 0)),
                   wall_time=float(state.get("wall_time", 0.0)), step_time_s=float(state.get("step_time_s", 0.0)),
                   counters={**_counters(), **dict(state.get("counters", {}))}, trace=trace,
                   kept_lam1=opt("kept_lam1", torch.float64), kept_lam2=opt("kept_lam2", torch.float64),
                   redo=bool(state.get("redo", False)))

    def __repr__(self) -> str:
        k = "" if self.lam1.dim() == 1 else f", K={self.num_latent}"
        return (f"CVIState(t={self.t}, N={self.num_sites}{k}, sweeps={self.sweeps:.3g}, elbo={self.elbo:.6g}, "
                f"converged={self.converged}, factor={'cached' if self.factor is not None else None})")
