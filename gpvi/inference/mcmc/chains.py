r"""The per-chain loop: warm-up with adaptation, then sampling from a frozen snapshot.

The transitions are :mod:`gpvi.inference.mcmc.kernel`'s (NumPy, one ``logp_grad`` call per leapfrog step); the
adaptation is :mod:`gpvi.inference.mcmc.adaptation`'s. This module runs one chain: seeding, per-draw statistics,
progress, interruption.

Each chain ``c`` has its own seed and its own torch generator, so the draws of a chain do not depend on the others,
on the number of chains, on callbacks or on interruptions, and the caller's global RNG is never touched. After
warm-up a chain's step size and inverse mass matrix are frozen; the snapshot (position, step size, mass matrix,
generator state), updated after every draw, is what :class:`~gpvi.inference.mcmc.state.ChainState` stores, so
resuming an interrupted run, or extending a finished one to more draws, reproduces the uninterrupted run exactly. A
chain interrupted during warm-up repeats its warm-up on resume (same result, time lost).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ...exceptions import NotPSDError, NumericalWarning
from ...models.target import target_device
from ..derivatives import log_joint_and_grad
from ..progress import Progress
from .adaptation import DualAveraging, Welford, Windows
from .kernel import Metric, Uniforms, find_step_size
from .state import ChainState, MCMCState

__all__ = ["Potential", "tree_depth", "run_chain", "SAMPLE_STATS", "WARMUP_STATS"]

SAMPLE_STATS = ("diverging", "acceptance_rate", "step_size", "n_steps", "lp", "energy")
WARMUP_STATS = ("acceptance_rate", "step_size", "n_steps", "lp")

Callback = Callable[[int, int, dict[str, Any]], None]


class Potential:
    r"""``logp_grad(z) -> (log g(z), gradient)`` on NumPy vectors, counting evaluations.

    A target with ``log_joint_and_grad`` (:class:`gpvi.GPRegression`: the closed form of
    :mod:`gpvi.models.lean_joint`) is called directly; any other target through ``log_joint`` and autograd. The
    target is evaluated as a batch of one, so a kernel matrix that cannot be factorised gives ``-inf`` (zero density,
    zero gradient) instead of an exception, and the transition rejects it (or marks the trajectory divergent).
    :class:`~gpvi.exceptions.NumericalWarning` s raised by the target (e.g. Cholesky jitter at extreme theta, common
    in early warm-up) are counted instead of repeated at every leapfrog step (:meth:`watching`, around a whole
    chain); the run reports the counts and warns once if any happened after warm-up. Other warnings of the target
    are raised once each at the end of the chain.
    """

    def __init__(self, target: Any) -> None:
        self.target = target
        closed = getattr(target, "closed_form", None)          # gpvi.GPRegression: the unchecked closed form
        self._fast = closed.log_joint if closed is not None else None
        self.device = target_device(target) or torch.device("cpu")
        self._on_cpu = self.device.type == "cpu"
        self.evaluations = 0
        self.nonfinite = 0
        self.numerical_warnings = 0

    def _eval(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._fast(theta) if self._fast is not None else log_joint_and_grad(self.target, theta)

    def __call__(self, z: np.ndarray) -> tuple[float, np.ndarray]:
        self.evaluations += 1
        if not math.isfinite(z.sum()):                # a diverged trajectory: zero density, never evaluated
            self.nonfinite += 1
            return -math.inf, np.zeros_like(z)
        theta = torch.from_numpy(z).unsqueeze(0)
        if not self._on_cpu:
            theta = theta.to(self.device)
        try:
            v, g = self._eval(theta)
        except NotPSDError:
            self.nonfinite += 1
            return -math.inf, np.zeros_like(z)
        lp = v.item()
        if not math.isfinite(lp):
            self.nonfinite += 1
            return -math.inf, np.zeros_like(z)
        grad = g.numpy()[0] if self._on_cpu and g.dtype == torch.float64 else g[0].detach().to("cpu", torch.float64).numpy()
        if not math.isfinite(grad.sum()):          # a NaN or an infinity anywhere makes the sum non-finite
            self.nonfinite += 1
            return -math.inf, np.zeros_like(z)
        return lp, grad

    @contextmanager
    def watching(self):
        """Record every warning the target raises while the block runs (one ``catch_warnings`` for a whole chain,
        not one per call); :meth:`flush` counts the NumericalWarnings, and the others are raised again, once each,
        when the block ends."""
        others: list[Any] = []
        self._others = others
        with warnings.catch_warnings(record=True) as log:
            warnings.simplefilter("always")
            self._log = log
            try:
                yield
            finally:
                self.flush()
                self._log = None
        seen = set()
        for w in others:
            key = (str(w.message), w.category, w.filename, w.lineno)
            if key not in seen:
                seen.add(key)
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)

    def flush(self) -> None:
        """Count the NumericalWarnings recorded so far (:meth:`watching`); keep the others for the end."""
        log = getattr(self, "_log", None)
        if not log:
            return
        for w in log:
            if issubclass(w.category, NumericalWarning):
                self.numerical_warnings += 1
            else:
                self._others.append(w)
        log.clear()


def tree_depth(n_steps: torch.Tensor) -> torch.Tensor:
    """Number of trajectory doublings of a full tree, ``ceil(log2(n_steps + 1))`` (a tree of depth j has 2^j - 1
    steps)."""
    return torch.ceil(torch.log2(n_steps.to(torch.float64) + 1)).to(torch.int64)


def _generator(seed: int, state: torch.Tensor | None = None) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    if state is not None:
        g.set_state(state)
    return g


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
    with Progress(W + S, enabled=engine.progress_bar, desc=desc, initial=cs.transitions(W)) as bar, \
            potential.watching():
        if not cs.warmed_up:
            # on interruption the chain keeps no warm-up progress (resume repeats it exactly)
            st.chains[c] = _warmup(engine, c, cs, potential, callback, bar,
                                   st.init_info.get("inverse_mass_matrix_init"))
        _sample(engine, c, st, potential, callback, bar)


def _start_point(potential: Potential, theta: torch.Tensor) -> tuple[np.ndarray, float, np.ndarray]:
    z = theta.detach().to("cpu", torch.float64).numpy().copy()
    lp, g = potential(z)
    return z, lp, g


def _warmup(engine: Any, c: int, cs: ChainState, potential: Potential, callback: Callback | None,
            bar: Progress, mass: torch.Tensor | None = None) -> ChainState:
    W = engine.num_warmup
    a = engine.adaptation
    t0 = time.perf_counter()
    e0, n0, w0 = potential.evaluations, potential.nonfinite, potential.numerical_warnings
    gen = _generator(cs.seed)
    rng = Uniforms(gen)
    z, lp, g = _start_point(potential, cs.init)
    D = z.shape[0]
    dense = a.dense_mass or mass is not None
    if mass is not None:
        inv = mass.detach().to("cpu", torch.float64).numpy()
    else:
        inv = np.eye(D) if dense else np.ones(D)
    metric = Metric(inv)
    eps = engine.step_size
    adapt_eps = a.adapt_step_size and W > 0
    adapt_mass = a.adapt_mass_matrix and mass is None and W > 0
    windows = Windows(W) if adapt_mass else None
    welford = Welford(D, dense) if adapt_mass else None
    if adapt_eps:
        eps = find_step_size(z, lp, g, potential, eps, metric, rng)
    dual = DualAveraging(eps, a.target_accept)
    draws: list[torch.Tensor] = []
    rec: dict[str, list[float]] = {k: [] for k in WARMUP_STATS}
    depths: list[dict[str, Any]] = []
    for i in range(W):
        step = eps
        e = potential.evaluations
        z, lp, g, stats = engine._transition(z, lp, g, potential, step, metric, rng)
        if adapt_eps:
            eps = dual.update(stats["acceptance_rate"])
        if windows is not None and windows.collects(i):
            welford.add(z)
            if windows.window_ends(i):
                metric = Metric(welford.inverse_mass())
                welford.reset()
                if adapt_eps:
                    eps = find_step_size(z, lp, g, potential, eps, metric, rng)
                    dual.restart(eps)
        theta = torch.from_numpy(z.copy())
        draws.append(theta)
        row = {"acceptance_rate": stats["acceptance_rate"], "step_size": step,
               "n_steps": potential.evaluations - e, "lp": lp}
        for k in WARMUP_STATS:
            rec[k].append(row[k])
        depths.append({k: v for k, v in stats.items() if k == "tree_depth"})
        bar.update(1, **engine.postfix({"phase": "warmup", **row}))
        if callback is not None:
            callback(c, i, {"theta": theta, "phase": "warmup", **row})
    final_eps = dual.final if adapt_eps else eps
    rng.reset()
    potential.flush()
    wstats = {k: torch.tensor(v, dtype=torch.int64 if k == "n_steps" else torch.float64, device="cpu")
              for k, v in rec.items()}                   # per-draw statistics live on the CPU
    wstats.update(engine._extra_stats(wstats, depths))
    dev = cs.init.device
    return replace(cs, warmup_draws=(torch.stack(draws) if draws else torch.empty((0, D), dtype=torch.float64)).to(dev),
                   warmup_stats=wstats, step_size=float(final_eps),
                   inverse_mass_matrix=torch.from_numpy(metric.inv.copy()),
                   position=torch.from_numpy(z.copy()).to(dev), rng_state=gen.get_state(),
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
    gen = _generator(cs.seed, cs.rng_state)
    rng = Uniforms(gen)
    metric = Metric(cs.inverse_mass_matrix.detach().to("cpu", torch.float64).numpy())
    eps = float(cs.step_size)
    z, lp, g = _start_point(potential, cs.position)
    # committed draws: [theta, stats row, generator state after it]; one list append commits a draw atomically, so
    # an interruption anywhere leaves a consistent snapshot (only the last generator state is kept)
    committed: list[list[Any]] = []
    num_div = int(cs.stats["diverging"].sum()) if "diverging" in cs.stats else 0
    dev = cs.position.device

    def snapshot() -> ChainState:
        potential.flush()
        rows = [e[1] for e in committed]
        new_stats = {k: torch.tensor([r[k] for r in rows], device="cpu", dtype=torch.bool if k == "diverging" else
                                     torch.int64 if k == "n_steps" else torch.float64)
                     for k in SAMPLE_STATS}
        new_stats.update(engine._extra_stats(new_stats, rows))
        stats = {k: torch.cat([cs.stats[k], v]) for k, v in new_stats.items()} if cs.stats else new_stats
        new_draws = torch.stack([e[0] for e in committed]).to(dev) if committed else cs.draws[:0]
        return replace(cs, draws=torch.cat([cs.draws, new_draws]), stats=stats,
                       position=committed[-1][0].clone().to(dev) if committed else cs.position,
                       rng_state=committed[-1][2] if committed else cs.rng_state,
                       sampling_time_s=cs.sampling_time_s + time.perf_counter() - t0,
                       num_evaluations=cs.num_evaluations + potential.evaluations - e0,
                       num_nonfinite=cs.num_nonfinite + potential.nonfinite - n0,
                       num_numerical_warnings=cs.num_numerical_warnings + potential.numerical_warnings - w0)

    try:
        for i in range(cs.num_draws, S):
            e = potential.evaluations
            z, lp, g, stats = engine._transition(z, lp, g, potential, eps, metric, rng)
            rng.reset()                                   # the generator's state alone determines the next draw
            theta = torch.from_numpy(z.copy())
            row = {**stats, "step_size": eps, "n_steps": potential.evaluations - e, "lp": lp}
            committed.append([theta, row, gen.get_state()])
            if len(committed) > 1:
                committed[-2][2] = None
            num_div += int(row["diverging"])
            bar.update(1, **engine.postfix({"phase": "sampling", "divergences": num_div, **row}))
            if callback is not None:
                callback(c, engine.num_warmup + i, {"theta": theta, "phase": "sampling", **row})
    finally:
        st.chains[c] = snapshot()
