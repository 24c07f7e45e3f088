r"""The state of a :class:`~gpvi.inference.salimans_knowles.engine.SKGaussian` run: everything that evolves, nothing that is set.

Names follow the paper (Salimans & Knowles 2013, Algorithm 2): ``m`` = :math:`m_t`, ``L`` the Cholesky factor of
the precision :math:`P_t = LL^\top`, ``a``, ``z``, ``P`` the running statistics, ``w`` = :math:`w`.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from ...rng import randn
from ..contract import RunState, clone_tensors, run_state_dict, run_state_fields

__all__ = ["SKState", "TRACE_KEYS", "COUNTERS"]

TRACE_KEYS = ("bound", "bound_avg", "num_valid", "pd")
COUNTERS = ("resampled_draws", "dropped_draws", "skipped_steps", "non_pd_steps", "log_joint_calls",
            "log_joint_evals", "hessian_backward_passes")


@dataclass
class SKState(RunState):
    r"""Everything that evolves during a :class:`~gpvi.inference.salimans_knowles.engine.SKGaussian` run (settings stay in
    the engine).

    ``SKGaussian.step`` advances a state in place. ``state_dict()`` / :meth:`from_state_dict` round-trip
    through ``torch.save`` and resume bit for bit (``SKGaussian.run(target, state=...)``, which works on a
    copy: the state handed to it is never changed).

    Attributes
    ----------
    m : torch.Tensor of shape (D,)
        Current mean :math:`m_t` of the sampling distribution :math:`q_t`.
    L : torch.Tensor of shape (D, D)
        Lower Cholesky factor of the current precision, :math:`P_t = LL^\top` (:math:`q_t = \mathcal N(m_t,
        P_t^{-1})`). Only positive-definite precisions are ever stored here.
    stats : dict of str to tensor
        Running (exponentially weighted) statistics. ``method="hessian"``: ``a`` (D,), ``z`` (D,), ``P`` (D, D)
        of Algorithm 2. ``method="gradient"``: ``a``, ``z``, ``A`` = mean of :math:`\tfrac12(x_+ - x_-)
        \varepsilon^\top`, ``B`` = mean of :math:`\tfrac12(g_+ - g_-)\varepsilon^\top` over antithetic pairs (see
        :class:`~gpvi.inference.salimans_knowles.engine.SKGaussian`).
    sums : list of two dicts
        Plain sums of the per-step estimates over the two halves of the averaging window, with counts ``n``.
    t : int
        Steps taken (including skipped ones).
    num_steps : int
        N of the run (it sets :math:`w` and the averaging window, so a resumed run must use the same N).
    w : float
        Step size of the running averages.
    method : {"hessian", "gradient"}
    hessian : {"autograd", "fd"} or None
        Resolved Hessian source (None for the gradient method); ``hessian_note`` says why "auto" chose it.
    init_info : dict
        How the run started: the :class:`~gpvi.inference.init.Start`'s record (``mean``: "initial_theta",
        "zeros", "given", "map", ...) and how :math:`V_1` was set (``scale``: "init_scale", "laplace",
        "laplace_diagonal ...", "given (GaussianPosterior)", ...; an ``init_scale="laplace"`` start's evaluation
        cost).
    generator : torch.Generator
        The run's random stream (draws, resampled draws, minibatches; with ``draws="sobol"`` minibatches only).
    qmc_seed : int or None
        Scramble seed of the run's Sobol' sequence (``SKGaussian(draws="sobol")``, drawn from ``generator`` at
        ``init``); None for pseudo-random draws.
    qmc_drawn : int
        Sobol' points used so far (a resumed run continues the sequence where it stopped).
    window : collections.deque of float
        Last instantaneous bounds (rolling average).
    trace : dict of str to array.array
        Per step: ``bound`` (:math:`\frac1{S'}\sum_s[\log g(x_s^*) - \log q_t(x_s^*)]`, NaN when skipped),
        ``bound_avg`` (rolling average), ``num_valid``, ``pd`` (1 if :math:`P_{t+1}` was positive definite).
    counters : dict of str to int
        ``resampled_draws``, ``dropped_draws``, ``skipped_steps``, ``non_pd_steps``, ``log_joint_calls``,
        ``log_joint_evals`` (rows, i.e. points where log g and its gradient were evaluated),
        ``hessian_backward_passes`` (extra backward passes of autograd Hessians).
    consecutive_failures : int
        Skipped steps in a row (counted by the driver, :func:`gpvi.inference.driver.run`).
    wall_time : float
        Seconds spent in ``SKGaussian.run`` over all segments.
    window_draws : list of torch.Tensor
        With ``SKGaussian(num_elbo_draws="window")``: per step of the averaging window, its valid draws as rows
        ``[x, log g(x), log q_t(x)]`` ``(S, D + 2)`` (the final bound reweights them to the returned q); else empty.

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.inference.salimans_knowles import SKGaussian, SKState
    >>> target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=2)
    >>> engine = SKGaussian(num_steps=10, progress_bar=False)
    >>> state = engine.init(target)
    >>> saved = state.state_dict()
    >>> state, info = engine.step(target, state)
    >>> SKState.from_state_dict(saved).t, state.t
    (0, 1)
    """

    m: torch.Tensor
    L: torch.Tensor
    stats: dict[str, torch.Tensor]
    sums: list[dict[str, Any]]
    t: int
    num_steps: int
    w: float
    method: str
    hessian: str | None
    generator: torch.Generator
    hessian_note: str = ""
    init_info: dict[str, Any] = field(default_factory=dict)
    window: deque = field(default_factory=deque)
    trace: dict[str, array] = field(default_factory=lambda: {k: array("d") for k in TRACE_KEYS})
    counters: dict[str, int] = field(default_factory=lambda: {k: 0 for k in COUNTERS})
    consecutive_failures: int = 0
    wall_time: float = 0.0
    qmc_seed: int | None = None
    qmc_drawn: int = 0
    window_draws: list = field(default_factory=list)
    _sobol: Any = field(default=None, repr=False, compare=False)

    @property
    def dim(self) -> int:
        """Number of parameters D."""
        return self.m.shape[0]

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors, numbers and lists (``torch.save``-able), including the generator state."""
        return {
            "version": 1, "m": self.m.clone(), "L": self.L.clone(), "stats": clone_tensors(self.stats),
            "sums": [clone_tensors(s) for s in self.sums], "t": self.t, "num_steps": self.num_steps, "w": self.w,
            "method": self.method, "hessian": self.hessian, "hessian_note": self.hessian_note,
            "qmc_seed": self.qmc_seed, "qmc_drawn": self.qmc_drawn, **run_state_dict(self),
            "window_draws": [d.clone() for d in self.window_draws],
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> SKState:
        """Rebuild a state from :meth:`state_dict` output (e.g. after ``torch.load``)."""
        if not isinstance(state, dict) or "stats" not in state or "generator_state" not in state:
            raise TypeError("state must be an SKState or the dict returned by SKState.state_dict()")
        return cls(
            m=state["m"].clone(), L=state["L"].clone(), stats=clone_tensors(state["stats"]),
            sums=[clone_tensors(s) for s in state["sums"]], t=int(state["t"]), num_steps=int(state["num_steps"]),
            w=float(state["w"]), method=state["method"], hessian=state["hessian"],
            hessian_note=state["hessian_note"], qmc_seed=state["qmc_seed"], qmc_drawn=int(state["qmc_drawn"]),
            window_draws=[d.clone() for d in state.get("window_draws", [])], **run_state_fields(state),
        )

    def standard_normals(self, k: int) -> torch.Tensor:
        r"""``(k, D)`` standard-normal draws for the next step: pseudo-random from ``generator``, or the next ``k``
        points of the run's scrambled Sobol' sequence through the normal quantile (``qmc_seed`` set)."""
        D, like = self.dim, self.m
        if self.qmc_seed is None:
            return randn((k, D), self.generator, dtype=like.dtype, device=like.device)
        if self._sobol is None or self._sobol.num_generated != self.qmc_drawn:
            self._sobol = torch.quasirandom.SobolEngine(D, scramble=True, seed=self.qmc_seed)
            if self.qmc_drawn:
                self._sobol.fast_forward(self.qmc_drawn)
        u = self._sobol.draw(k, dtype=torch.float64)
        self.qmc_drawn += k
        tiny = torch.finfo(torch.float64).eps
        return torch.special.ndtri(u.clamp(tiny, 1.0 - tiny)).to(dtype=like.dtype, device=like.device)
