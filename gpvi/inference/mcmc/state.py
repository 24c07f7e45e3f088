r"""What evolves during a NUTS/HMC run: one :class:`ChainState` per chain, gathered in an :class:`MCMCState`.

A state is a snapshot: the engines never change a state they were given (``run(target, state=s)`` works on
:meth:`MCMCState.copy`), and a posterior keeps its own copy. ``state_dict()`` holds only tensors, numbers, strings,
lists and dicts, so ``torch.save(state.state_dict(), path)`` and ``torch.load(path, weights_only=True)`` round-trip.

Names: ``theta`` (:math:`\theta`), ``step_size`` (:math:`\epsilon`), ``inverse_mass_matrix`` (:math:`M^{-1}`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["ChainState", "MCMCState", "COUNTERS"]

COUNTERS = ("num_evaluations", "num_nonfinite", "num_numerical_warnings", "num_numerical_warnings_warmup")
"""Per-chain counters summed by :attr:`MCMCState.counters`."""


def _plain(obj: Any) -> Any:
    """Tensors, numbers, strings, lists and dicts only (``repr`` of anything else): safe for a weights-only load."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return repr(obj)


@dataclass
class ChainState:
    """Progress of one chain (a snapshot; the engines never mutate a state they were given).

    Attributes
    ----------
    seed : int
        Seed of the chain's RNG stream (derived from the run's ``seed`` / ``generator``).
    init : torch.Tensor of shape (D,)
        Starting point of the warm-up.
    draws : torch.Tensor of shape (s, D)
        Post-warm-up draws so far.
    stats : dict of str to torch.Tensor of shape (s,)
        Per-draw statistics: ``diverging`` (bool), ``acceptance_rate`` (mean Metropolis acceptance
        probability over the trajectory, Stan's ``accept_stat``), ``step_size``, ``n_steps`` (gradient
        evaluations), ``lp`` (log joint at the draw) and, for NUTS, ``tree_depth``.
    warmup_draws : torch.Tensor of shape (w, D)
        Warm-up draws (``w = num_warmup`` once the warm-up is complete, else 0).
    warmup_stats : dict of str to torch.Tensor of shape (w,)
        As ``stats`` without ``diverging`` and ``energy`` (recorded only after warm-up).
    step_size : float or None
        Adapted step size after warm-up; ``None`` while the warm-up is not complete.
    inverse_mass_matrix : torch.Tensor of shape (D,) or (D, D), or None
        Adapted :math:`M^{-1}` after warm-up.
    position : torch.Tensor of shape (D,) or None
        Current state of the chain (the last draw, or the last warm-up state).
    rng_state : torch.Tensor or None
        State of the chain's torch generator before its next transition.
    warmup_time_s, sampling_time_s : float
        Wall time spent in warm-up and in sampling.
    num_evaluations : int
        Log-joint gradient evaluations (warm-up and sampling).
    num_nonfinite : int
        Evaluations where the log joint was not finite (counted, handled as zero density).
    num_numerical_warnings, num_numerical_warnings_warmup : int
        :class:`~gpvi.exceptions.NumericalWarning` s raised by the target (e.g. Cholesky jitter) while
        sampling and during warm-up.
    """

    seed: int
    init: torch.Tensor
    draws: torch.Tensor
    stats: dict[str, torch.Tensor]
    warmup_draws: torch.Tensor
    warmup_stats: dict[str, torch.Tensor]
    step_size: float | None = None
    inverse_mass_matrix: torch.Tensor | None = None
    position: torch.Tensor | None = None
    rng_state: torch.Tensor | None = None
    warmup_time_s: float = 0.0
    sampling_time_s: float = 0.0
    num_evaluations: int = 0
    num_nonfinite: int = 0
    num_numerical_warnings: int = 0
    num_numerical_warnings_warmup: int = 0

    @property
    def warmed_up(self) -> bool:
        """Whether the warm-up is complete (adapted step size and mass matrix available)."""
        return self.step_size is not None

    @property
    def num_draws(self) -> int:
        """Post-warm-up draws so far."""
        return int(self.draws.shape[0])

    def finished(self, num_draws: int) -> bool:
        """Warmed up with at least ``num_draws`` draws: nothing left to run."""
        return self.warmed_up and self.num_draws >= num_draws

    def transitions(self, num_warmup: int) -> int:
        """Transitions this state accounts for: the warm-up once it is complete, plus the draws."""
        return (num_warmup if self.warmed_up else 0) + self.num_draws

    def copy(self) -> ChainState:
        """An independent copy (tensors cloned)."""
        return copy.deepcopy(self)

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> ChainState:
        return cls(**{k: state[k] for k in cls.__dataclass_fields__})


@dataclass
class MCMCState:
    """Everything needed to resume or extend a NUTS/HMC run (see :meth:`NUTS.run` with ``state=``).

    Attributes
    ----------
    names : list of str
        Parameter names of the target.
    settings : dict
        The sampler settings that must match on resume (kind, chains, warm-up and kernel settings).
    chains : list of ChainState
    init_info : dict
        How the starting points were found (the init strategy's record and how the chains' starts were drawn).
    wall_time : float
        Wall seconds of every run of this state together (resumes and extensions included; the chains advance
        together, so their own times overlap).

    Notes
    -----
    The randomness lives in the chains (each has its own ``seed`` and ``rng_state``); the run's generator is used
    once, by :meth:`NUTS.init`, for the starting points and the chains' seeds.
    """

    names: list[str]
    settings: dict[str, Any]
    chains: list[ChainState] = field(default_factory=list)
    init_info: dict[str, Any] = field(default_factory=dict)
    wall_time: float = 0.0

    @property
    def num_chains(self) -> int:
        return len(self.chains)

    @property
    def t(self) -> int:
        """Transitions done over all chains (a chain's warm-up counts once it is complete)."""
        W = int(self.settings.get("num_warmup", 0))
        return sum(c.transitions(W) for c in self.chains)

    @property
    def counters(self) -> dict[str, int]:
        """Per-chain counters summed over the chains (:data:`COUNTERS`), and ``divergences`` after warm-up."""
        out = {k: sum(int(getattr(c, k)) for c in self.chains) for k in COUNTERS}
        out["divergences"] = sum(int(c.stats["diverging"].sum()) for c in self.chains if "diverging" in c.stats)
        return out

    def copy(self) -> MCMCState:
        """An independent copy: running from it, or changing it, never changes this state."""
        return MCMCState(list(self.names), copy.deepcopy(self.settings), [c.copy() for c in self.chains],
                         copy.deepcopy(self.init_info), self.wall_time)

    def state_dict(self) -> dict[str, Any]:
        """Plain dict of tensors, numbers and strings (``torch.save`` it; load with :meth:`from_state_dict`)."""
        return {"kind": "mcmc", "names": list(self.names), "settings": dict(self.settings),
                "chains": [c.state_dict() for c in self.chains], "init_info": _plain(self.init_info),
                "wall_time": float(self.wall_time)}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> MCMCState:
        if not isinstance(state, dict) or state.get("kind") != "mcmc":
            raise ValueError("state must be an MCMCState or the dict returned by MCMCState.state_dict()")
        chains = [ChainState.from_state_dict(c) for c in state["chains"]]
        # (a state saved before wall_time was kept: its chains' own times, the closest record there is)
        wall = state.get("wall_time", sum(c.warmup_time_s + c.sampling_time_s for c in chains))
        return cls(list(state["names"]), dict(state["settings"]), chains, dict(state["init_info"]), float(wall))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace this state's contents by ``state`` (from :meth:`state_dict`)."""
        other = MCMCState.from_state_dict(state)
        self.names, self.settings, self.chains, self.init_info, self.wall_time = (
            other.names, other.settings, other.chains, other.init_info, other.wall_time)
