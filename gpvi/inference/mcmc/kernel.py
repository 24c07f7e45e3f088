r"""One Hamiltonian transition in NumPy: the leapfrog integrator, multinomial NUTS and fixed-length HMC.

At tens to hundreds of data points a GP log joint and its gradient cost about a hundred microseconds, so a
sampler's own work per leapfrog step must cost far less. Everything here works on NumPy vectors of length D, and
every function is a **generator** that asks for the log density and gradient at a point instead of calling a
function: it yields ``z`` and is sent back ``(log density, gradient)``. :mod:`gpvi.inference.mcmc.chains` answers
the current requests of every chain with one batched call of the log joint: the chains advance together without
waiting for each other at the end of a transition.

Dynamics. Potential :math:`U(\theta) = -\log g(\theta)`, kinetic energy :math:`K(r) = \tfrac12 r^\top M^{-1} r`,
:math:`r \sim \mathcal N(0, M)`, leapfrog with step size :math:`\epsilon` (Neal 2011, eqs. 5.18-5.20):

.. math::

    r \leftarrow r + \tfrac\epsilon2\nabla\log g(\theta),\quad \theta \leftarrow \theta + \epsilon M^{-1} r,\quad
    r \leftarrow r + \tfrac\epsilon2\nabla\log g(\theta).

NUTS (:func:`nuts_transition`): the trajectory doubles forwards or backwards at random until the generalised
no-U-turn criterion fails, :math:`p^\sharp_-\cdot\rho \le 0` or :math:`p^\sharp_+\cdot\rho \le 0` with
:math:`p^\sharp = M^{-1}r` at the two ends and :math:`\rho` the sum of the momenta (Betancourt 2017, sec. A.4.2),
checked on every subtree and, as Stan does since 2.26, across the seam of every merge; the next state is drawn
from the trajectory with weights :math:`e^{-H}` (multinomial sampling), uniformly within subtrees and biased towards
the new half at the top level (Betancourt 2017, sec. A.3.2). A step whose energy error exceeds 1000 is divergent
and ends the trajectory. The acceptance statistic is the mean of :math:`\min(1, e^{H_0 - H})` over the new states
(Stan's ``accept_stat``), which drives the step-size adaptation (:mod:`gpvi.inference.mcmc.adaptation`).

With numba installed, :mod:`gpvi.inference.mcmc.trees` runs NUTS's transitions compiled, all chains in one call a
round; :func:`nuts_transition` is the reference they repeat bit for bit.

HMC (:func:`hmc_transition`): :math:`L` leapfrog steps and a Metropolis correction (Neal 2011, sec. 5.3.2.1).

Randomness: a :class:`Uniforms` stream over a torch generator (the chain's own), drawn in blocks, so a chain's
state is its generator's state and a resumed chain repeats the draws of an uninterrupted one.

References
----------
R. M. Neal (2011). MCMC using Hamiltonian dynamics. Handbook of Markov Chain Monte Carlo, ch. 5.
M. D. Hoffman and A. Gelman (2014). The No-U-Turn Sampler. JMLR 15, 1593-1623.
M. Betancourt (2017). A conceptual introduction to Hamiltonian Monte Carlo. arXiv:1701.02434.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

__all__ = ["Metric", "Uniforms", "nuts_transition", "hmc_transition", "find_step_size", "MAX_ENERGY_ERROR"]

T = TypeVar("T")
Asks = Generator[np.ndarray, tuple[float, np.ndarray], T]
"""A computation that yields points ``z`` and is sent ``(log density, gradient)`` at each; its return value is
its result."""

MAX_ENERGY_ERROR = 1000.0
"""An energy error :math:`H - H_0` above this marks a divergent transition (Stan's value)."""


class Uniforms:
    """Standard normal and uniform draws from a torch generator, fetched in blocks of ``block`` (no per-draw call)."""

    def __init__(self, generator: torch.Generator, block: int = 64) -> None:
        self.g, self.block = generator, block
        self._u = np.empty(0)
        self._i = 0
        self._saved: torch.Tensor | None = None

    def uniform(self) -> float:
        if self._i >= self._u.shape[0]:
            self._u = torch.rand(self.block, generator=self.g, dtype=torch.float64, device="cpu").numpy()
            self._i = 0
        self._i += 1
        return float(self._u[self._i - 1])

    def normal(self, d: int) -> np.ndarray:
        return torch.randn(d, generator=self.g, dtype=torch.float64, device="cpu").numpy()

    def reset(self) -> None:
        """Drop the unused part of the block, so the generator's state alone determines what comes next."""
        self._u, self._i = np.empty(0), 0

    def ahead(self, blocks: int) -> np.ndarray:
        """The next uniforms :meth:`uniform` would return if it fetched up to ``blocks`` new blocks: the rest of the
        current block, then ``blocks`` blocks drawn now. :meth:`advance` must follow, before any other draw."""
        self._saved = self.g.get_state()
        fresh = torch.rand(self.block * blocks, generator=self.g, dtype=torch.float64, device="cpu").numpy()
        return np.concatenate([self._u[self._i:], fresh])

    def advance(self, used: int) -> None:
        """Leave the stream as if :meth:`uniform` had returned the first ``used`` of :meth:`ahead`'s uniforms: the
        generator set back, then moved on by the blocks they used (``torch.rand`` of k blocks at once draws the same
        numbers as k draws of one block)."""
        self.g.set_state(self._saved)
        extra = used - (self._u.shape[0] - self._i)
        if extra <= 0:
            self._i += used
            return
        k = -(-extra // self.block)
        self._u = torch.rand(self.block * k, generator=self.g, dtype=torch.float64, device="cpu").numpy()[-self.block:]
        self._i = extra - self.block * (k - 1)


class Metric:
    r"""The inverse mass matrix :math:`M^{-1}`: a vector (diagonal) or a dense ``(D, D)`` matrix."""

    def __init__(self, inverse_mass: np.ndarray) -> None:
        self.inv = np.array(inverse_mass, dtype=np.float64)
        self.dense = self.inv.ndim == 2
        if self.dense:
            # r = chol(M) n with M = (M^-1)^-1: M^-1 = C C^T gives M = C^-T C^-1, so r = C^-T n
            self._c = np.linalg.cholesky(self.inv)
        else:
            self._sd = 1.0 / np.sqrt(self.inv)

    def velocity(self, r: np.ndarray) -> np.ndarray:
        """:math:`M^{-1} r`."""
        return self.inv @ r if self.dense else self.inv * r

    def momentum(self, rng: Uniforms, d: int) -> np.ndarray:
        """A draw :math:`r \\sim \\mathcal N(0, M)`."""
        n = rng.normal(d)
        if self.dense:
            return np.linalg.solve(self._c.T, n)
        return n * self._sd


@dataclass(slots=True)
class _Tree:
    """A trajectory piece: its two ends (left = earlier in time), the summed momenta, its weight and proposal."""

    zl: np.ndarray
    rl: np.ndarray
    gl: np.ndarray
    zr: np.ndarray
    rr: np.ndarray
    gr: np.ndarray
    psl: np.ndarray
    psr: np.ndarray
    rho: np.ndarray
    logw: float
    z: np.ndarray
    lp: float
    g: np.ndarray
    turning: bool = False
    diverging: bool = False
    n: int = 0
    accept: float = 0.0


def _leapfrog(z: np.ndarray, r: np.ndarray, g: np.ndarray, eps: float, metric: Metric
              ) -> Asks[tuple[np.ndarray, np.ndarray, float, np.ndarray]]:
    """One leapfrog step of size ``eps`` (negative: backwards in time): ``(z, r, log density, gradient)``."""
    r = r + (0.5 * eps) * g
    z = z + eps * metric.velocity(r)
    lp, g = yield z
    return z, r + (0.5 * eps) * g, lp, g


def _merge(old: _Tree, new: _Tree, forward: bool, biased: bool, rng: Uniforms) -> _Tree:
    r"""``old`` and its continuation ``new`` in the direction of travel, as one tree (``new`` neither turned nor
    diverged). The proposal moves to ``new``'s with probability ``w_new / w_old`` capped at 1 (``biased``, top level)
    or ``w_new / (w_old + w_new)`` (within a subtree). No U-turn: :math:`p^\sharp \cdot \rho > 0` at both ends of
    the merged tree and, across the seam, of each half extended by the other's first state (checked in that order,
    stopping at the first failure)."""
    left, right = (old, new) if forward else (new, old)
    hi, lo = (old.logw, new.logw) if old.logw >= new.logw else (new.logw, old.logw)
    logw = hi + math.log1p(math.exp(lo - hi)) if lo > -math.inf else hi
    p = math.exp(min(0.0, new.logw - old.logw)) if biased else math.exp(new.logw - logw)
    take = rng.uniform() < p
    rho = left.rho + right.rho
    psl, psr = left.psl, right.psr
    turning = not (psl.dot(rho) > 0.0 and psr.dot(rho) > 0.0
                   and psl.dot(seam := left.rho + right.rl) > 0.0 and right.psl.dot(seam) > 0.0
                   and left.psr.dot(seam := right.rho + left.rr) > 0.0 and psr.dot(seam) > 0.0)
    return _Tree(left.zl, left.rl, left.gl, right.zr, right.rr, right.gr, psl, psr, rho, logw,
                 new.z if take else old.z, new.lp if take else old.lp, new.g if take else old.g,
                 turning=turning, n=old.n + new.n, accept=old.accept + new.accept)


class _Integrator:
    """Leapfrog steps at a fixed step size and metric, counting gradient evaluations."""

    def __init__(self, eps: float, metric: Metric, h0: float) -> None:
        self.eps, self.metric, self.h0 = eps, metric, h0
        self._steps = {True: (eps, 0.5 * eps), False: (-eps, 0.5 * -eps)}
        self._velocity = metric.velocity

    def leaf(self, z: np.ndarray, r: np.ndarray, g: np.ndarray, forward: bool) -> Asks[_Tree]:
        eps, half = self._steps[forward]
        velocity = self._velocity
        r = r + half * g                                          # _leapfrog, written out (one generator less a step)
        z1 = z + eps * velocity(r)
        lp1, g1 = yield z1
        r1 = r + half * g1
        ps = velocity(r1)
        h = -lp1 + 0.5 * float(r1 @ ps)
        if not math.isfinite(h):
            h = math.inf
        delta = h - self.h0
        return _Tree(z1, r1, g1, z1, r1, g1, ps, ps, r1, -delta, z1, lp1, g1, diverging=delta > MAX_ENERGY_ERROR,
                     n=1, accept=math.exp(min(0.0, -delta)) if delta == delta else 0.0)

    def build(self, z: np.ndarray, r: np.ndarray, g: np.ndarray, forward: bool, depth: int, rng: Uniforms
              ) -> Asks[_Tree]:
        """A subtree of ``2^depth`` steps from the state ``(z, r, g)`` (Hoffman & Gelman 2014, Algorithm 3)."""
        if depth == 0:
            return (yield from self.leaf(z, r, g, forward))
        sub = depth - 1                                           # (leaves are asked for directly)
        first = yield from (self.leaf(z, r, g, forward) if sub == 0 else self.build(z, r, g, forward, sub, rng))
        if first.turning or first.diverging:
            return first
        edge = (first.zr, first.rr, first.gr) if forward else (first.zl, first.rl, first.gl)
        second = yield from (self.leaf(*edge, forward) if sub == 0 else self.build(*edge, forward, sub, rng))
        if second.turning or second.diverging:
            first.turning, first.diverging = second.turning, second.diverging
            first.n += second.n
            first.accept += second.accept
            return first
        return _merge(first, second, forward, False, rng)


def nuts_transition(z: np.ndarray, lp: float, g: np.ndarray, eps: float, metric: Metric, max_depth: int,
                    rng: Uniforms) -> Asks[tuple[np.ndarray, float, np.ndarray, dict[str, Any]]]:
    """One multinomial NUTS transition from ``z`` (log density ``lp``, gradient ``g``); a generator
    (module docstring).

    Returns
    -------
    z, lp, g : the next state
    stats : dict
        ``acceptance_rate`` (mean Metropolis probability over the new states), ``n_steps`` (gradient evaluations),
        ``tree_depth``, ``diverging``, ``energy`` (:math:`H` at the start, with the drawn momentum).
    """
    d = z.shape[0]
    r = metric.momentum(rng, d)
    ps = metric.velocity(r)
    h0 = -lp + 0.5 * float(r @ ps)
    integ = _Integrator(eps, metric, h0)
    tree = _Tree(z, r, g, z, r, g, ps, ps, r, 0.0, z, lp, g)
    n, accept, depth, diverging = 0, 0.0, 0, False
    while depth < max_depth:
        forward = rng.uniform() < 0.5
        edge = (tree.zr, tree.rr, tree.gr) if forward else (tree.zl, tree.rl, tree.gl)
        new = yield from integ.build(*edge, forward, depth, rng)
        n += new.n
        accept += new.accept
        depth += 1
        if new.diverging:
            diverging = True
            break
        if new.turning:
            break
        tree = _merge(tree, new, forward, True, rng)
        if tree.turning:
            break
    stats = {"acceptance_rate": accept / max(n, 1), "n_steps": n, "tree_depth": depth, "diverging": diverging,
             "energy": h0}
    return tree.z, tree.lp, tree.g, stats


def hmc_transition(z: np.ndarray, lp: float, g: np.ndarray, eps: float, metric: Metric, num_steps: int,
                   rng: Uniforms) -> Asks[tuple[np.ndarray, float, np.ndarray, dict[str, Any]]]:
    """``num_steps`` leapfrog steps and a Metropolis correction; stats as :func:`nuts_transition` (no depth)."""
    d = z.shape[0]
    r = metric.momentum(rng, d)
    h0 = -lp + 0.5 * float(r @ metric.velocity(r))
    z1, r1, lp1, g1 = z, r, lp, g
    diverging = False
    for _ in range(num_steps):
        z1, r1, lp1, g1 = yield from _leapfrog(z1, r1, g1, eps, metric)
        if not math.isfinite(lp1):
            diverging = True
            break
    h = -lp1 + 0.5 * float(r1 @ metric.velocity(r1)) if not diverging else math.inf
    delta = h - h0
    diverging = diverging or delta > MAX_ENERGY_ERROR
    a = math.exp(min(0.0, -delta)) if delta == delta else 0.0
    stats = {"acceptance_rate": a, "n_steps": num_steps, "diverging": diverging, "energy": h0}
    if rng.uniform() < a:
        return z1, lp1, g1, stats
    return z, lp, g, stats


def find_step_size(z: np.ndarray, lp: float, g: np.ndarray, eps: float, metric: Metric, rng: Uniforms, *,
                   max_iter: int = 100) -> Asks[float]:
    r"""A step size whose single leapfrog step has acceptance about 0.8: double or halve :math:`\epsilon` until
    :math:`\Delta H` crosses :math:`\log 0.8` (Hoffman & Gelman 2014, Algorithm 4; Stan's ``init_stepsize``)."""
    d = z.shape[0]
    direction = 0
    for _ in range(max_iter):
        r = metric.momentum(rng, d)
        h0 = -lp + 0.5 * float(r @ metric.velocity(r))
        _, r1, lp1, _ = yield from _leapfrog(z, r, g, eps, metric)
        h = -lp1 + 0.5 * float(r1 @ metric.velocity(r1))
        dh = h0 - h if math.isfinite(h) else -math.inf
        up = dh > math.log(0.8)
        if direction == 0:
            direction = 1 if up else -1
        elif (direction == 1) != up:
            break
        eps = eps * 2.0 if direction == 1 else eps * 0.5
        if eps > 1e7 or eps < 1e-12:
            break
    return float(min(max(eps, 1e-12), 1e7))
