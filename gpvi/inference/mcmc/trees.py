r"""NUTS transitions of all the chains of a round in one compiled call, when numba is installed (``pip install
gpvi[fast]``).

:func:`~gpvi.inference.mcmc.kernel.nuts_transition` is NumPy code that asks for one point at a time, so at tens of
data points its own work per leapfrog step (node objects, generator switches, small NumPy calls) is a third of what
the batched log joint costs. With numba installed, :class:`~gpvi.inference.mcmc.nuts.NUTS` hands each transition to
this module instead: the chain's generator yields a :class:`TreeRequest`, :mod:`gpvi.inference.mcmc.chains` places it
in a :class:`Trees` batch, and one compiled call a round (:mod:`gpvi.inference.mcmc._trees_jit`) advances every
chain's tree to its next point, between the batched log-joint calls.

The transitions are the NumPy kernel's bit for bit, random numbers included: the momentum is drawn by
:meth:`~gpvi.inference.mcmc.kernel.Metric.momentum` as there, and a transition's uniforms are the chain's
:class:`~gpvi.inference.mcmc.kernel.Uniforms` stream (:meth:`~gpvi.inference.mcmc.kernel.Uniforms.ahead` draws the
blocks the transition could use, :meth:`~gpvi.inference.mcmc.kernel.Uniforms.advance` then leaves the generator where
the uniforms it did use leave it). So seeded results do not depend on whether numba is installed
(``tests/inference/mcmc/test_trees.py``). Diagonal metrics and ``max_tree_depth`` up to :data:`MAX_DEPTH`; otherwise
the NumPy kernel runs. ``GPVI_NUMBA=0`` in the environment (read once per process) runs the NumPy kernel everywhere.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from .kernel import Asks, Metric, Uniforms

__all__ = ["TreeRequest", "Trees", "compiled", "request", "MAX_DEPTH"]

MAX_DEPTH = 12
"""The deepest trees compiled: a transition may use up to :math:`2^{d} + d` uniforms, all drawn ahead of it."""


@functools.cache
def compiled() -> Any:
    """The compiled module, or ``None`` without numba (or with ``GPVI_NUMBA=0`` in the environment).

    Raises
    ------
    ValueError
        ``GPVI_NUMBA`` set to anything but ``0`` or ``1``.
    """
    import os
    switch = os.environ.get("GPVI_NUMBA", "1").strip()
    if switch not in ("0", "1"):
        raise ValueError(f"the environment variable GPVI_NUMBA must be 0 (the NumPy kernel) or 1 (compiled trees "
                         f"when numba is installed); got {switch!r}")
    if switch == "0":
        return None
    try:
        from . import _trees_jit
    except (ImportError, RuntimeError):              # no numba, a numba too old for this NumPy, no cache location
        return None
    return _trees_jit


class TreeRequest:
    """What a chain asks of :class:`Trees`: one NUTS transition from ``z`` (log density ``lp``, gradient ``g``)."""

    __slots__ = ("z", "lp", "g", "eps", "metric", "rng")

    def __init__(self, z: np.ndarray, lp: float, g: np.ndarray, eps: float, metric: Metric, rng: Uniforms) -> None:
        self.z, self.lp, self.g, self.eps, self.metric, self.rng = z, lp, g, eps, metric, rng


def request(z: np.ndarray, lp: float, g: np.ndarray, eps: float, metric: Metric, rng: Uniforms
            ) -> Asks[tuple[np.ndarray, float, np.ndarray, dict[str, Any]]]:
    """A NUTS transition done by :class:`Trees`: yields one :class:`TreeRequest` and is sent its result, what
    :func:`~gpvi.inference.mcmc.kernel.nuts_transition` returns."""
    return (yield TreeRequest(z, lp, g, eps, metric, rng))


class Trees:
    """The transitions in progress of a group's chains: row ``r`` of ``Z`` (rows, D), where each active row's next
    point is written, is chain ``r``'s."""

    def __init__(self, Z: np.ndarray, max_depth: int) -> None:
        self.J = J = compiled()
        rows, d = Z.shape
        self.max_depth = max_depth
        self.blocks = math.ceil((2 ** max_depth + max_depth) / 64)
        nslots = max_depth + 3                       # the tree, the waiting halves, a scratch slot, the new leaf
        self.nd, self.sc = np.zeros((rows, nslots, J.NF, d)), np.zeros((rows, nslots, 3))
        self.ist, self.fst = np.zeros((rows, 6), dtype=np.int64), np.zeros((rows, 4))
        self.ist[:, J.PHASE] = J.IDLE
        self.pend, self.inv = np.zeros((rows, 2, d)), np.ones((rows, d))
        self.U = np.zeros((rows, 64 * (self.blocks + 1)))
        self.Zout, self._lp, self._g = Z, np.zeros(rows), np.zeros((rows, d))
        self.requests: list[TreeRequest | None] = [None] * rows

    def begin(self, r: int, req: TreeRequest) -> None:
        """Row ``r`` starts ``req``'s transition: the momentum, then the uniforms it may use, as the NumPy kernel
        draws them; :meth:`step` gives its first point."""
        J = self.J
        r_mom = req.metric.momentum(req.rng, req.z.shape[0])
        u = req.rng.ahead(self.blocks)
        self.U[r, :u.shape[0]] = u
        self.nd[r, 0, J.Z], self.nd[r, 0, J.G], self.nd[r, 0, J.RL] = req.z, req.g, r_mom
        self.sc[r, 0, 1], self.fst[r, J.EPS], self.inv[r] = req.lp, req.eps, req.metric.inv
        self.ist[r, J.UI], self.ist[r, J.PHASE] = 0, J.START
        self.requests[r] = req

    def step(self, lp: np.ndarray | None, grad: np.ndarray | None
             ) -> list[tuple[int, tuple[np.ndarray, float, np.ndarray, dict[str, Any]]]]:
        """Rows that :meth:`begin` started ask for their first point; with ``lp`` and ``grad`` (every row's log
        density and gradient at ``Zout``), the waiting rows take theirs and go on. Returns the rows whose transition
        ended, with its result; every other active row's next point is in ``Zout``."""
        J = self.J
        fresh = lp is not None
        ended = J.advance(self.nd, self.sc, self.ist, self.fst, self.pend, self.inv, self.U,
                          lp if fresh else self._lp, grad if fresh else self._g, self.Zout, self.max_depth, fresh)
        done = []
        if not ended:
            return done
        for r in np.flatnonzero(self.ist[:, J.PHASE] == J.ENDED).tolist():
            req, n = self.requests[r], int(self.ist[r, J.NSTEP])
            req.rng.advance(int(self.ist[r, J.UI]))
            stats = {"acceptance_rate": float(self.fst[r, J.ACC] / max(n, 1)), "n_steps": n,
                     "tree_depth": int(self.ist[r, J.DEPTH]), "diverging": bool(self.fst[r, J.DIV]),
                     "energy": float(self.fst[r, J.H0])}
            done.append((r, (self.nd[r, 0, J.Z].copy(), float(self.sc[r, 0, 1]), self.nd[r, 0, J.G].copy(), stats)))
            self.ist[r, J.PHASE], self.requests[r] = J.IDLE, None
        return done
