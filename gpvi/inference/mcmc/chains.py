r"""The chains: warm-up with adaptation, then sampling from a frozen snapshot, all chains advancing together.

The transitions are :mod:`gpvi.inference.mcmc.kernel`'s (NumPy generators that ask for the log density and gradient
at one point at a time) or, when a chain asks for a whole NUTS transition (a
:class:`~gpvi.inference.mcmc.trees.TreeRequest`, with numba installed), a row of a compiled
:class:`~gpvi.inference.mcmc.trees.Trees` batch that advances every such chain in one call a round; the adaptation is
:mod:`gpvi.inference.mcmc.adaptation`'s. Each chain is one generator (:func:`_chain`: warm-up, then draws).
:func:`run_chains` answers the current request of **every** chain with one batched call of the log joint,
``(num_chains, D) -> (num_chains,)`` and its gradient: a chain whose transition ends starts its next one at once, so
no chain waits for another's trajectory, and at tens of data points four chains cost little more than one (the call's
cost is Python and framework overhead, not arithmetic). Above ``BATCH_MAX_N`` data points, where a call's cost is
arithmetic, the chains run one after another (a batch of one). Chain ``c`` is always row ``c`` of a batch of
``num_chains`` rows (a finished chain's row repeats its last point): for gpvi's own models a row's value and gradient
do not depend on the other rows, so a chain's draws are those of the same chain run in any company of the same size
(``benchmarks/results/small_data.md``).

Each chain ``c`` has its own seed and its own torch generator, so the draws of a chain do not depend on what the
other chains do, on callbacks or on interruptions (they do depend, in the last bits, on the number of chains: a
batch of one row is computed by other kernels than a batch of four), and the caller's global RNG is never touched.
After warm-up a chain's step size and inverse mass matrix are frozen; the snapshot (position, step size, mass
matrix, generator state), updated after every draw, is what :class:`~gpvi.inference.mcmc.state.ChainState` stores,
so resuming an interrupted run, or extending a finished one to more draws, reproduces the uninterrupted run
exactly. A chain interrupted during warm-up repeats its warm-up on resume (same result, time lost).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from ...exceptions import NotPSDError, NumericalWarning
from ...models.target import target_device
from ...numerics.budget import MemoryBudget
from ..derivatives import log_joint_and_grad
from ..progress import Progress
from .adaptation import DualAveraging, Welford, Windows, draws_and_gradients_diagonal
from .kernel import Asks, Metric, Uniforms, find_step_size
from .state import ChainState, MCMCState
from .trees import TreeRequest, Trees

__all__ = ["Potential", "tree_depth", "run_chains", "chain_groups", "BATCH_MAX_N", "SAMPLE_STATS", "WARMUP_STATS"]

SAMPLE_STATS = ("diverging", "acceptance_rate", "step_size", "n_steps", "lp", "energy")
WARMUP_STATS = ("acceptance_rate", "step_size", "n_steps", "lp")

Callback = Callable[[int, int, dict[str, Any]], None]


class Potential:
    r"""The log density and gradient at a batch of points: ``(S, D)`` NumPy rows in, ``(S,)`` and ``(S, D)`` out.

    A target with ``closed_form`` (:class:`gpvi.GPRegression`: :mod:`gpvi.models.lean_joint`) is called through
    it directly; any other target through :func:`~gpvi.inference.derivatives.log_joint_and_grad`. A row whose
    point, value or gradient is not finite, or whose kernel matrix cannot be factorised, gives ``-inf`` (zero
    density, zero gradient), which the transition rejects (or marks divergent). A non-finite point is never
    evaluated (its row is computed at zero and discarded). If the target raises
    :class:`~gpvi.exceptions.NotPSDError` for the batch, each row is computed again in a batch of its own copies,
    at the same row (so its bits do not depend on the other rows). :class:`~gpvi.exceptions.NumericalWarning` s
    of the target (e.g. Cholesky jitter at extreme theta, common in early warm-up) are counted instead of repeated
    at every call (:meth:`watching`, around a whole run); other warnings of the target are raised once each at the
    end.
    """

    def __init__(self, target: Any) -> None:
        self.target = target
        closed = getattr(target, "closed_form", None)          # gpvi.GPRegression: the unchecked closed form
        self._fast = closed.log_joint if closed is not None else None
        self.device = target_device(target) or torch.device("cpu")
        self._on_cpu = self.device.type == "cpu"
        self._log: list[Any] | None = None
        self._others: list[Any] = []

    def _eval(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._fast(theta) if self._fast is not None else log_joint_and_grad(self.target, theta)

    def _rows(self, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        theta = torch.from_numpy(Z)
        if not self._on_cpu:
            theta = theta.to(self.device)
        try:
            v, g = self._eval(theta)
        except NotPSDError:
            lp, grad = np.full(Z.shape[0], -math.inf), np.zeros_like(Z)
            for i in range(Z.shape[0]):                # row i alone, in a batch of its copies at row i
                try:
                    vi, gi = self._eval(theta[i].expand_as(theta).clone())
                except NotPSDError:
                    continue
                lp[i], grad[i] = vi[i].item(), gi[i].detach().to("cpu", torch.float64).numpy()
            return lp, grad
        if self._on_cpu and v.dtype == torch.float64:
            return (v.numpy(), g.numpy()) if not v.requires_grad else (v.detach().numpy(), g.detach().numpy())
        return v.detach().to("cpu", torch.float64).numpy(), g.detach().to("cpu", torch.float64).numpy()

    def __call__(self, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(log densities (S,), gradients (S, D), failed (S,) bool)`` at the rows of ``Z``."""
        if np.isfinite(Z).all():                                # the common case: two checks on the whole batch
            lp, grad = self._rows(Z)
            if np.isfinite(lp).all() and np.isfinite(grad).all():
                return lp, grad, np.zeros(Z.shape[0], dtype=bool)
            finite = np.ones(Z.shape[0], dtype=bool)
        else:
            finite = np.isfinite(Z).all(axis=1)
            lp, grad = self._rows(np.where(finite[:, None], Z, 0.0))
        bad = ~(finite & np.isfinite(lp) & np.isfinite(grad).all(axis=1))
        if bad.any():
            lp[bad] = -math.inf
            grad[bad] = 0.0
        return lp, grad, bad

    @contextmanager
    def watching(self):
        """Record every warning the target raises while the block runs (one ``catch_warnings`` for a whole run,
        not one per call); :meth:`flush` counts the NumericalWarnings, and the others are raised again, once each,
        when the block ends."""
        self._others = others = []
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

    def flush(self) -> int:
        """The number of NumericalWarnings recorded since the last flush (:meth:`watching`); the others are kept
        for the end."""
        log = self._log
        if not log:
            return 0
        n = 0
        for w in log:
            if issubclass(w.category, NumericalWarning):
                n += 1
            else:
                self._others.append(w)
        log.clear()
        return n


@dataclass
class _Counts:
    """One chain's evaluation counters, kept by :func:`run_chains`: its points evaluated, those that failed, and
    the NumericalWarnings raised by the calls that evaluated its points (a warning of a batched call counts for
    every chain in the call)."""

    evaluations: int = 0
    nonfinite: int = 0
    numerical_warnings: int = 0


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


BATCH_MAX_N = 200
"""On the CPU the chains advance together when the target has at most this many data points (or no ``num_data``);
above it they run one after another. A call on 4 thetas costs 1.2 / 2.0 / 3.1 / 4.0x a call on one at N = 14 / 56 /
200 / 455 (``benchmarks/results/small_data.md``): below the line four chains cost little more than one, above it
batching saves nothing and the rows of chains that finished first would still be computed. On an accelerator
batching pays far beyond that (on an H200 a call on 4 thetas at N = 1,000 cost 2.0x a call on one:
``benchmarks/results/gpu_scaling.md``; at N = 455 a call on 256 thetas cost about 11x one:
``gpu_check_h200_run8.md``), so there the chains always advance together, in groups that fit the accelerator's
budget (a quarter of its free memory). At N = 5,000 a call there cost the same per theta at any batch."""


def chain_groups(target: Any, num_chains: int) -> list[list[int]]:
    """The chains that advance together: consecutive groups of as many as one call of the log joint may take within
    :class:`~gpvi.numerics.budget.MemoryBudget` (all of them, at the sizes where four chains cost little more than
    one), or one group per chain for a CPU target above ``BATCH_MAX_N`` data points."""
    n = getattr(target, "num_data", None)
    device = target_device(target)
    if n is not None and n > BATCH_MAX_N and (device is None or device.type == "cpu"):
        return [[c] for c in range(num_chains)]
    k = MemoryBudget().draws_per_call(target, num_chains)
    return [list(range(i, min(i + k, num_chains))) for i in range(0, num_chains, k)]


def run_chains(engine: Any, st: MCMCState, potential: Potential, callback: Callback | None) -> None:
    """Run every chain of ``st`` to ``engine.num_warmup + engine.num_draws`` transitions, updating ``st.chains``.

    The chains of a group (:func:`chain_groups`) advance together: one batched ``potential`` call per round answers
    every unfinished chain's request (module docstring); the groups run one after another. Each ``st.chains[c]``
    holds a consistent snapshot whenever this returns or raises (``KeyboardInterrupt`` included): the committed
    draws, or the chain as it was before an unfinished warm-up.
    """
    W, S, C = engine.num_warmup, engine.num_draws, len(st.chains)
    if all(cs.finished(S) for cs in st.chains):
        return
    counts = [_Counts() for _ in range(C)]
    desc = f"{engine.name} chain 1/1" if C == 1 else f"{engine.name} {C} chains"
    with Progress(C * (W + S), enabled=engine.progress_bar, desc=desc,
                  initial=sum(cs.transitions(W) for cs in st.chains)) as bar, potential.watching():
        for group in chain_groups(potential.target, C):
            _run_group(engine, st, potential, callback, group, counts, bar)


def _run_group(engine: Any, st: MCMCState, potential: Potential, callback: Callback | None, group: list[int],
               counts: list[_Counts], bar: Progress) -> None:
    """The chains ``group`` advancing together: chain ``group[r]`` is row ``r`` of every call."""
    S = engine.num_draws
    todo = [r for r, c in enumerate(group) if not st.chains[c].finished(S)]
    if not todo:
        return
    Z = torch.stack([st.chains[c].position if st.chains[c].warmed_up else st.chains[c].init for c in group]
                    ).detach().to("cpu", torch.float64).numpy().copy()
    mass = st.init_info.get("inverse_mass_matrix_init")
    first = st.init_info.get("inverse_mass_matrix_start")
    chains = {r: _chain(engine, group[r], st, counts[group[r]], bar, callback, mass, first) for r in todo}
    trees: Trees | None = None
    growing: set[int] = set()                       # rows whose NUTS transition is in `trees`
    try:
        asked = {}
        for r in todo:
            asked[r] = next(chains[r])              # every chain has at least its start point to ask for
        while chains:
            started = False
            for r, z in asked.items():
                if isinstance(z, TreeRequest):
                    if trees is None:
                        trees = Trees(Z, engine.max_tree_depth)      # writes its rows' points into Z
                    trees.begin(r, z)
                    growing.add(r)
                    started = True
                else:
                    Z[r] = z
            if started:
                trees.step(None, None)              # the new transitions' first points
            lp, grad, bad = potential(Z)
            warned = potential.flush()
            failed = bad.any()
            lps = lp.tolist() if len(growing) < len(chains) else None
            asked = {}
            for r in list(chains):
                k = counts[group[r]]
                k.evaluations += 1
                if failed:
                    k.nonfinite += int(bad[r])
                if warned:
                    k.numerical_warnings += warned
                if r not in growing:
                    _ask(chains, asked, r, (lps[r], grad[r]))
            if growing:
                for r, result in trees.step(lp, grad):
                    growing.discard(r)
                    _ask(chains, asked, r, result)
    finally:
        for gen in chains.values():                 # interrupted: each chain commits what it has
            gen.close()


def _ask(chains: dict[int, Asks[None]], asked: dict[int, Any], r: int, answer: Any) -> None:
    """Send chain ``r`` its answer; keep what it asks next, or drop it when it is done."""
    try:
        asked[r] = chains[r].send(answer)
    except StopIteration:
        del chains[r]


def _chain(engine: Any, c: int, st: MCMCState, counts: _Counts, bar: Progress, callback: Callback | None,
           mass: torch.Tensor | None, first: torch.Tensor | None = None) -> Asks[None]:
    """Chain ``c``: its warm-up (unless done), then its draws; a generator of requests (module docstring)."""
    if not st.chains[c].warmed_up:
        # on interruption the chain keeps no warm-up progress (resume repeats it exactly)
        st.chains[c] = yield from _warmup(engine, c, st.chains[c], counts, callback, bar, mass, first)
    yield from _sample(engine, c, st, counts, callback, bar)


def _start_point(theta: torch.Tensor) -> Asks[tuple[np.ndarray, float, np.ndarray]]:
    z = theta.detach().to("cpu", torch.float64).numpy().copy()
    lp, g = yield z
    return z, lp, g


def _warmup(engine: Any, c: int, cs: ChainState, counts: _Counts, callback: Callback | None,
            bar: Progress, mass: torch.Tensor | None = None, first: torch.Tensor | None = None
            ) -> Asks[ChainState]:
    W = engine.num_warmup
    a = engine.adaptation
    t0 = time.perf_counter()
    e0, n0, w0 = counts.evaluations, counts.nonfinite, counts.numerical_warnings
    gen = _generator(cs.seed)
    rng = Uniforms(gen)
    z, lp, g = yield from _start_point(cs.init)
    D = z.shape[0]
    dense = a.dense_mass or mass is not None
    if mass is not None:
        inv = mass.detach().to("cpu", torch.float64).numpy()
    elif first is not None:                               # Adaptation.mass_start == "init"
        inv = first.detach().to("cpu", torch.float64).numpy().copy()
    else:
        inv = np.eye(D) if dense else np.ones(D)
    metric = Metric(inv)
    eps = engine.step_size
    adapt_eps = a.adapt_step_size and W > 0
    adapt_mass = a.adapt_mass_matrix and mass is None and W > 0
    windows = Windows(W) if adapt_mass else None
    welford = Welford(D, dense) if adapt_mass else None
    grads = Welford(D, False) if adapt_mass and a.mass_estimate == "draws_and_gradients" else None   # diagonal
    if adapt_eps:
        eps = yield from find_step_size(z, lp, g, eps, metric, rng)
    dual = DualAveraging(eps, a.target_accept)
    draws: list[torch.Tensor] = []
    rec: dict[str, list[float]] = {k: [] for k in WARMUP_STATS}
    depths: list[dict[str, Any]] = []
    for i in range(W):
        step = eps
        e = counts.evaluations
        z, lp, g, stats = yield from engine._transition(z, lp, g, step, metric, rng)
        if adapt_eps:
            eps = dual.update(stats["acceptance_rate"])
        if windows is not None and windows.collects(i):
            welford.add(z)
            if grads is not None:
                grads.add(g)
            if windows.window_ends(i):
                metric = Metric(welford.inverse_mass() if grads is None else
                                draws_and_gradients_diagonal(welford, grads))
                welford.reset()
                if grads is not None:
                    grads.reset()
                if adapt_eps:
                    eps = yield from find_step_size(z, lp, g, eps, metric, rng)
                    dual.restart(eps)
        theta = torch.from_numpy(z.copy())
        draws.append(theta)
        row = {"acceptance_rate": stats["acceptance_rate"], "step_size": step,
               "n_steps": counts.evaluations - e, "lp": lp}
        for k in WARMUP_STATS:
            rec[k].append(row[k])
        depths.append({k: v for k, v in stats.items() if k == "tree_depth"})
        if bar.enabled:                                   # (no postfix built for a silent bar)
            bar.update(1, **engine.postfix({"phase": "warmup", **row}))
        if callback is not None:
            callback(c, i, {"theta": theta, "phase": "warmup", **row})
    final_eps = dual.final if adapt_eps else eps
    rng.reset()
    wstats = {k: torch.tensor(v, dtype=torch.int64 if k == "n_steps" else torch.float64, device="cpu")
              for k, v in rec.items()}                   # per-draw statistics live on the CPU
    wstats.update(engine._extra_stats(wstats, depths))
    dev = cs.init.device
    return replace(cs, warmup_draws=(torch.stack(draws) if draws else torch.empty((0, D), dtype=torch.float64)).to(dev),
                   warmup_stats=wstats, step_size=float(final_eps),
                   inverse_mass_matrix=torch.from_numpy(metric.inv.copy()),
                   position=torch.from_numpy(z.copy()).to(dev), rng_state=gen.get_state(),
                   warmup_time_s=time.perf_counter() - t0,
                   num_evaluations=cs.num_evaluations + counts.evaluations - e0,
                   num_nonfinite=cs.num_nonfinite + counts.nonfinite - n0,
                   num_numerical_warnings_warmup=counts.numerical_warnings - w0)


def _sample(engine: Any, c: int, st: MCMCState, counts: _Counts, callback: Callback | None,
            bar: Progress) -> Asks[None]:
    cs = st.chains[c]
    S = engine.num_draws
    if cs.num_draws >= S:
        return
    t0 = time.perf_counter()
    e0, n0, w0 = counts.evaluations, counts.nonfinite, counts.numerical_warnings
    gen = _generator(cs.seed, cs.rng_state)
    rng = Uniforms(gen)
    metric = Metric(cs.inverse_mass_matrix.detach().to("cpu", torch.float64).numpy())
    eps = float(cs.step_size)
    # committed draws: [theta, stats row, generator state after it]; one list append commits a draw atomically, so
    # an interruption anywhere leaves a consistent snapshot (only the last generator state is kept)
    committed: list[list[Any]] = []
    num_div = int(cs.stats["diverging"].sum()) if "diverging" in cs.stats else 0
    dev = cs.position.device

    def snapshot() -> ChainState:
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
                       num_evaluations=cs.num_evaluations + counts.evaluations - e0,
                       num_nonfinite=cs.num_nonfinite + counts.nonfinite - n0,
                       num_numerical_warnings=cs.num_numerical_warnings + counts.numerical_warnings - w0)

    try:
        z, lp, g = yield from _start_point(cs.position)
        for i in range(cs.num_draws, S):
            e = counts.evaluations
            z, lp, g, stats = yield from engine._transition(z, lp, g, eps, metric, rng)
            rng.reset()                                   # the generator's state alone determines the next draw
            theta = torch.from_numpy(z.copy())
            row = {**stats, "step_size": eps, "n_steps": counts.evaluations - e, "lp": lp}
            committed.append([theta, row, gen.get_state()])
            if len(committed) > 1:
                committed[-2][2] = None
            num_div += int(row["diverging"])
            if bar.enabled:
                bar.update(1, **engine.postfix({"phase": "sampling", "divergences": num_div, **row}))
            if callback is not None:
                callback(c, engine.num_warmup + i, {"theta": theta, "phase": "sampling", **row})
    finally:
        st.chains[c] = snapshot()
