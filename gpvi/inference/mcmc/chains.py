r"""The per-chain loop around Pyro's kernel: warm-up, then sampling from a frozen snapshot.

The Hamiltonian machinery is Pyro's (``pyro.infer.mcmc.NUTS`` / ``HMC`` with ``potential_fn``); this module
runs one chain of it: seeding, per-draw statistics, progress, interruption.

Each chain ``c`` has its own seed and its own RNG stream, so the draws of a chain do not depend on the others, on
the number of chains, on callbacks, or on interruptions. Pyro draws momenta from torch's *global* RNG: the engine
wraps the run in :func:`torch.random.fork_rng`, and here the global state is set from the chain's saved stream
before each transition and read back after it.

After warm-up a chain's adapted step size and inverse mass matrix are frozen and sampling continues with a fresh
non-adapting kernel started at the last warm-up state: that snapshot (state, step size, mass matrix, RNG state),
updated after every draw, is what :class:`~gpvi.inference.mcmc.state.ChainState` stores. Resuming an interrupted
run, or extending a finished one to more draws, therefore reproduces the uninterrupted run exactly. A chain
interrupted during warm-up repeats its warm-up on resume (same result, time lost).

Pyro internals used (checked by the tests, pyro-ppl 1.9): ``kernel._t``, ``kernel._warmup_steps``,
``kernel._mean_accept_prob``, ``kernel._divergences``, ``kernel._potential_energy_last``,
``kernel.mass_matrix_adapter.inverse_mass_matrix`` and ``kernel._adapter.reset_step_size_adaptation``.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from ...exceptions import NotPSDError, NumericalWarning
from ..progress import Progress
from .state import ChainState, MCMCState

__all__ = ["Potential", "tree_depth", "run_chain", "SITE", "SAMPLE_STATS", "WARMUP_STATS"]

SITE = "theta"
_KEY = (SITE,)
SAMPLE_STATS = ("diverging", "acceptance_rate", "step_size", "n_steps", "lp", "energy")
WARMUP_STATS = ("acceptance_rate", "step_size", "n_steps", "lp")

Callback = Callable[[int, int, dict[str, Any]], None]


class Potential:
    r"""Pyro ``potential_fn``: :math:`U(\theta) = -\log g(\theta)` on ``{"theta": (D,)}``, counting evaluations.

    The target is evaluated as a batch of one (``(1, D) -> (1,)``), so a kernel matrix that cannot be
    factorised gives ``-inf`` (zero density, zero gradient) instead of an exception; Pyro then rejects the
    proposal (or marks the trajectory divergent). :class:`~gpvi.exceptions.NumericalWarning` s raised by the
    target (e.g. Cholesky jitter at extreme theta, common in early warm-up) are counted instead of repeated
    at every leapfrog step; the run reports the counts and warns once if any happened after warm-up.
    """

    def __init__(self, target: Any) -> None:
        self.target = target
        self.evaluations = 0
        self.nonfinite = 0
        self.numerical_warnings = 0

    def __call__(self, z: dict[str, torch.Tensor]) -> torch.Tensor:
        theta = z[SITE]
        self.evaluations += 1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                lj = self.target.log_joint(theta.unsqueeze(0))[0]
            except NotPSDError:
                lj = None
        for w in caught:
            if issubclass(w.category, NumericalWarning):
                self.numerical_warnings += 1
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        if lj is None:
            self.nonfinite += 1
            return theta.sum() * 0.0 + math.inf
        if not bool(torch.isfinite(lj)):
            self.nonfinite += 1
        return -lj


def tree_depth(n_steps: torch.Tensor) -> torch.Tensor:
    """Number of trajectory doublings, ``ceil(log2(n_steps + 1))`` (a full tree of depth j has 2^j - 1 steps)."""
    return torch.ceil(torch.log2(n_steps.to(torch.float64) + 1)).to(torch.int64)


def run_chain(engine: Any, c: int, st: MCMCState, potential: Potential, callback: Callback | None) -> None:
    """Run chain ``c`` of ``st`` to ``engine.num_warmup + engine.num_draws`` transitions, updating ``st.chains[c]``.

    ``st.chains[c]`` holds a consistent snapshot whenever this returns or raises (``KeyboardInterrupt``
    included): the committed draws, or the chain as it was before an unfinished warm-up.
    """
    cs = st.chains[c]
    W, S = engine.num_warmup, engine.num_draws
    if cs.warmed_up and cs.num_draws >= S:
        return
    desc = f"{engine.name} chain {c + 1}/{engine.num_chains}"
    with Progress(W + S, enabled=engine.progress_bar, desc=desc, initial=cs.transitions(W)) as bar:
        if not cs.warmed_up:
            # on interruption the chain keeps no warm-up progress (resume repeats it exactly)
            st.chains[c] = _warmup(engine, c, cs, potential, callback, bar, st.init_info.get("inverse_mass_matrix_init"))
        _sample(engine, c, st, potential, callback, bar)


def _warmup(engine: Any, c: int, cs: ChainState, potential: Potential, callback: Callback | None,
            bar: Progress, mass: torch.Tensor | None = None) -> ChainState:
    W = engine.num_warmup
    t0 = time.perf_counter()
    e0, n0, w0 = potential.evaluations, potential.nonfinite, potential.numerical_warnings
    torch.default_generator.manual_seed(cs.seed)       # CPU only (the engine's fork_rng restores it)
    kernel = engine._make_kernel(potential, engine.step_size, adapt=True, fixed_mass=mass is not None)
    kernel.initial_params = {SITE: cs.init.clone()}
    kernel.setup(warmup_steps=W)
    if mass is not None:
        # Pyro's setup() resets M^-1 to I and finds a step size for it: set q's covariance, then find it again
        kernel.mass_matrix_adapter.inverse_mass_matrix = {_KEY: mass.clone()}
        if W > 0 and engine.adaptation.adapt_step_size:
            kernel._adapter.reset_step_size_adaptation({SITE: cs.init.clone()})
    z = {SITE: cs.init.clone()}
    rng = torch.get_rng_state()
    draws: list[torch.Tensor] = []
    rec: dict[str, list[float]] = {k: [] for k in WARMUP_STATS}
    for i in range(W):
        eps = float(kernel.step_size)
        torch.set_rng_state(rng)
        kernel._mean_accept_prob = 0.0
        e = potential.evaluations
        z = kernel.sample(z)
        rng = torch.get_rng_state()
        # Pyro's running mean over n = t draws, restarted from 0: accept = mean * n
        accept = float(kernel._mean_accept_prob) * kernel._t
        theta = z[SITE].detach().clone()
        draws.append(theta)
        row = {"acceptance_rate": accept, "step_size": eps, "n_steps": potential.evaluations - e,
               "lp": -float(kernel._potential_energy_last)}
        for k in WARMUP_STATS:
            rec[k].append(row[k])
        bar.update(1, **engine.postfix({"phase": "warmup", **row}))
        if callback is not None:
            callback(c, i, {"theta": theta, "phase": "warmup", **row})
    wstats = {k: torch.tensor(v, dtype=torch.int64 if k == "n_steps" else torch.float64, device="cpu")
              for k, v in rec.items()}                   # per-draw statistics live on the CPU
    wstats.update(engine._extra_stats(wstats))
    D = cs.init.shape[0]
    inv = kernel.mass_matrix_adapter.inverse_mass_matrix[_KEY].detach().clone()
    return replace(cs, warmup_draws=torch.stack(draws) if draws else torch.empty((0, D), dtype=torch.float64, device=cs.init.device),
                   warmup_stats=wstats, step_size=float(kernel.step_size), inverse_mass_matrix=inv,
                   position=z[SITE].detach().clone(), rng_state=rng,
                   warmup_time_s=time.perf_counter() - t0,
                   num_evaluations=cs.num_evaluations + potential.evaluations - e0,
                   num_nonfinite=cs.num_nonfinite + potential.nonfinite - n0,
                   num_numerical_warnings_warmup=potential.numerical_warnings - w0)


def _sample(engine: Any, c: int, st: MCMCState, potential: Potential, callback: Callback | None,
            bar: Progress) -> None:
    cs = st.chains[c]
    S = engine.num_draws
    t0 = time.perf_counter()
    e0, n0, w0 = potential.evaluations, potential.nonfinite, potential.numerical_warnings
    # a fresh, non-adapting kernel at the snapshot: identical for first runs and resumed ones
    kernel = engine._make_kernel(potential, cs.step_size, adapt=False,
                                 fixed_mass=st.init_info.get("inverse_mass_matrix_init") is not None)
    kernel.initial_params = {SITE: cs.position.clone()}
    kernel.setup(warmup_steps=0)
    kernel.mass_matrix_adapter.inverse_mass_matrix = {_KEY: cs.inverse_mass_matrix.clone()}
    z = {SITE: cs.position.clone()}
    # energy of each transition (for E-BFMI): the Hamiltonian U(z) + K(r) at its start, with the freshly drawn
    # momentum; Pyro computes it first thing in sample() and does not return it, so its kinetic energy is recorded
    # here (no randomness is used; the trajectory conserves H up to the integrator's error, so this is Stan's
    # energy__ of the selected state to that accuracy)
    kinetic: list[float] = []
    pyro_kinetic = kernel._kinetic_energy

    def _kinetic(r_unscaled: Any) -> Any:
        k = pyro_kinetic(r_unscaled)
        kinetic.append(float(k))
        return k

    kernel._kinetic_energy = _kinetic
    # committed draws: [theta, stats row, RNG state after it]; one list append commits a draw atomically,
    # so an interruption anywhere leaves a consistent snapshot (only the last RNG state is kept)
    committed: list[list[Any]] = []
    num_div = int(cs.stats["diverging"].sum()) if "diverging" in cs.stats else 0
    eps = float(kernel.step_size)

    def snapshot() -> ChainState:
        rows = [e[1] for e in committed]
        new_stats = {k: torch.tensor([r[k] for r in rows], device="cpu", dtype=torch.bool if k == "diverging" else
                                     torch.int64 if k == "n_steps" else torch.float64)
                     for k in SAMPLE_STATS}
        new_stats.update(engine._extra_stats(new_stats))
        stats = {k: torch.cat([cs.stats[k], v]) for k, v in new_stats.items()} if cs.stats else new_stats
        new_draws = torch.stack([e[0] for e in committed]) if committed else cs.draws[:0]
        return replace(cs, draws=torch.cat([cs.draws, new_draws]), stats=stats,
                       position=committed[-1][0].clone() if committed else cs.position,
                       rng_state=committed[-1][2] if committed else cs.rng_state,
                       sampling_time_s=cs.sampling_time_s + time.perf_counter() - t0,
                       num_evaluations=cs.num_evaluations + potential.evaluations - e0,
                       num_nonfinite=cs.num_nonfinite + potential.nonfinite - n0,
                       num_numerical_warnings=cs.num_numerical_warnings + potential.numerical_warnings - w0)

    try:
        for i in range(cs.num_draws, S):
            torch.set_rng_state(committed[-1][2] if committed else cs.rng_state)
            kernel._t = kernel._warmup_steps            # Pyro's running means then cover this draw only
            kernel._mean_accept_prob = 0.0
            d0, e = len(kernel._divergences), potential.evaluations
            u0 = float(kernel._potential_energy_last)
            kinetic.clear()
            z = kernel.sample(z)
            theta = z[SITE].detach().clone()
            row = {"diverging": len(kernel._divergences) > d0,
                   "acceptance_rate": float(kernel._mean_accept_prob), "step_size": eps,
                   "n_steps": potential.evaluations - e, "lp": -float(kernel._potential_energy_last),
                   "energy": u0 + kinetic[0] if kinetic else math.nan}
            committed.append([theta, row, torch.get_rng_state()])
            if len(committed) > 1:
                committed[-2][2] = None
            num_div += int(row["diverging"])
            bar.update(1, **engine.postfix({"phase": "sampling", "divergences": num_div, **row}))
            if callback is not None:
                callback(c, engine.num_warmup + i, {"theta": theta, "phase": "sampling", **row})
    finally:
        st.chains[c] = snapshot()
