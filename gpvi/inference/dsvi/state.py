r"""What evolves during a DSVI run: :class:`DSVIState`, one :class:`GradientEstimate`, and the bound's closed form.

Names follow the paper (see :mod:`gpvi.inference.dsvi.engine`): ``mu`` = :math:`\mu`, ``C`` = :math:`C` (``(D, D)``
lower triangular, or the ``(D,)`` diagonal for ``scale="diag"``), ``z`` the standard draws, ``theta = C z + mu``.
"""

from __future__ import annotations

import copy
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from ..contract import RunState, clone_tensors, run_state_dict, run_state_fields

__all__ = ["DSVIState", "GradientEstimate", "EntropyTerm", "TRACE_KEYS", "COUNTERS"]

TRACE_KEYS = ("bound", "bound_avg", "rho", "num_valid")
COUNTERS = ("resampled_draws", "dropped_draws", "skipped_steps", "c_shrinks", "c_rejects", "trust_clips",
             "log_joint_calls")


# the closed-form part of the bound
class EntropyTerm:
    r"""The closed-form part of the DSVI bound (eq. 4): :math:`\sum_d \log C_{dd} + \mathcal H_\phi`.

    Its gradient is :math:`\Delta_C = \operatorname{diag}(1/C_{dd})` (eq. 6) and nothing for :math:`\mu`.
    Engines call ``term(mu, C_diag) -> (value, grad_mu or None, grad_C_diag)``; DSVI-ARD replaces this term by
    its own (:class:`gpvi.inference.dsvi.ard.ARDTerm`, eq. 14).

    Parameters
    ----------
    entropy : float
        :math:`\mathcal H_\phi`.

    Examples
    --------
    >>> import torch
    >>> value, g_mu, g_c = EntropyTerm(0.0)(torch.zeros(2), torch.tensor([1.0, 2.0]))
    >>> round(value, 4), g_mu, g_c.tolist()
    (0.6931, None, [1.0, 0.5])
    """

    def __init__(self, entropy: float) -> None:
        self.entropy = float(entropy)

    def __call__(self, mu: torch.Tensor, c: torch.Tensor) -> tuple[float, torch.Tensor | None, torch.Tensor]:
        return float(torch.log(c).sum()) + self.entropy, None, 1.0 / c


# ----------------------------------------------------------------------------------------------------------
@dataclass
class DSVIState(RunState):
    r"""Everything that evolves during a DSVI run (settings stay in :class:`DSVI`).

    :meth:`DSVI.step` advances a state **in place** and returns it; keep a checkpoint with :meth:`copy` or
    :meth:`state_dict`. A state saved with ``torch.save(state.state_dict(), path)`` and restored with
    :meth:`from_state_dict` resumes bit-for-bit (``DSVI.run(target, state=...)``).

    Attributes
    ----------
    mu : torch.Tensor of shape (D,)
        Variational mean :math:`\mu`.
    C : torch.Tensor of shape (D, D) or (D,)
        Scale :math:`C` (lower triangular, positive diagonal), or the diagonal :math:`c` for ``scale="diag"``.
    t : int
        Number of steps taken (including skipped ones).
    generator : torch.Generator
        The run's random stream (draws of z, resampled draws, minibatches). Advanced by every step.
    scale : {"full", "diag"}
    rho0_mu, rho0_C : float
        Initial step sizes for :math:`\mu` and :math:`C` (resolved from the rule's ``lr`` at :meth:`DSVI.init`).
    opt : dict of str to tensor
        Optimiser state (Adam moments ``m_mu, v_mu, m_C, v_C`` and update count ``n``); empty for SGD.
    window : collections.deque of float
        The last ``window`` instantaneous bounds (for the rolling average).
    trace : dict of str to array.array
        Per step: ``bound`` (instantaneous bound, NaN for skipped steps), ``bound_avg`` (rolling average),
        ``rho`` (:math:`\rho_\mu` used), ``num_valid`` (draws that entered the gradient). Compact float64
        arrays (8 bytes per entry: a :math:`10^6`-step run keeps 32 MB of trace).
    counters : dict of str to int
        ``resampled_draws``, ``dropped_draws``, ``skipped_steps``, ``c_shrinks``, ``c_rejects``,
        ``log_joint_calls``.
    consecutive_failures : int
        Current streak of skipped steps.
    polyak_mu, polyak_C : torch.Tensor or None
        Running averages of :math:`(\mu, C)` over the Polyak window; ``polyak_n`` iterates averaged.
    check : dict
        Convergence-rule bookkeeping (previous window's average and variance, :math:`\mu`, :math:`C`, streak).
    converged : bool
        Whether the convergence rule currently holds.
    wall_time : float
        Seconds spent in :meth:`DSVI.run` (all segments of a resumed run).
    optimizer : {"sgd", "natural", "adam"}
        The update rule in use (``optimizer="auto"`` resolved at :meth:`DSVI.init`).
    init_info : dict
        How the initial :math:`(\mu, C)` were found (``mean``: "given", "initial_theta", "zeros", "map";
        ``scale``: "given", "init_scale", "laplace", "laplace_diagonal", ...; times and MAP details).

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.inference.dsvi.engine import DSVI, DSVIState
    >>> target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=2)
    >>> from gpvi.inference.dsvi import SGD
    >>> engine = DSVI(num_steps=100, optimizer=SGD(lr=0.1), progress_bar=False)
    >>> state = engine.init(target)
    >>> saved = state.state_dict()                 # torch.save(saved, path) works too
    >>> state, info = engine.step(target, state)
    >>> DSVIState.from_state_dict(saved).t, state.t
    (0, 1)
    """

    mu: torch.Tensor
    C: torch.Tensor
    t: int
    generator: torch.Generator
    scale: str
    rho0_mu: float
    rho0_C: float
    opt: dict[str, Any] = field(default_factory=dict)
    window: deque = field(default_factory=deque)
    trace: dict[str, array] = field(default_factory=lambda: {k: array("d") for k in TRACE_KEYS})
    counters: dict[str, int] = field(default_factory=lambda: {k: 0 for k in COUNTERS})
    consecutive_failures: int = 0
    polyak_mu: torch.Tensor | None = None
    polyak_C: torch.Tensor | None = None
    polyak_n: int = 0
    check: dict[str, Any] = field(default_factory=dict)
    converged: bool = False
    wall_time: float = 0.0
    optimizer: str = "sgd"
    init_info: dict[str, Any] = field(default_factory=dict)

    @property
    def dim(self) -> int:
        """Number of parameters D."""
        return self.mu.shape[0]

    def scale_tril(self) -> torch.Tensor:
        """C as a ``(D, D)`` lower-triangular matrix (builds ``diag(c)`` for a diagonal scale)."""
        return torch.diag(self.C) if self.scale == "diag" else self.C

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors, numbers and lists (``torch.save``-able), including the generator state."""
        return {
            "version": 1, "mu": self.mu.clone(), "C": self.C.clone(), "t": self.t,
            "scale": self.scale, "rho0_mu": self.rho0_mu, "rho0_C": self.rho0_C, "opt": clone_tensors(self.opt),
            "polyak_mu": None if self.polyak_mu is None else self.polyak_mu.clone(),
            "polyak_C": None if self.polyak_C is None else self.polyak_C.clone(), "polyak_n": self.polyak_n,
            "check": {k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v))
                      for k, v in self.check.items()},
            "converged": self.converged, "optimizer": self.optimizer, **run_state_dict(self),
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> DSVIState:
        """Rebuild a state from :meth:`state_dict` output (e.g. after ``torch.load``)."""
        if not isinstance(state, dict) or "mu" not in state or "generator_state" not in state:
            raise TypeError("state must be a DSVIState or the dict returned by DSVIState.state_dict()")
        return cls(
            mu=state["mu"].clone(), C=state["C"].clone(), t=int(state["t"]), scale=state["scale"],
            rho0_mu=float(state["rho0_mu"]), rho0_C=float(state["rho0_C"]), opt=clone_tensors(state["opt"]),
            polyak_mu=None if state["polyak_mu"] is None else state["polyak_mu"].clone(),
            polyak_C=None if state["polyak_C"] is None else state["polyak_C"].clone(),
            polyak_n=int(state["polyak_n"]), check=clone_tensors(state["check"]), converged=bool(state["converged"]),
            optimizer=str(state["optimizer"]),
            **run_state_fields(state),
        )




@dataclass
class GradientEstimate:
    r"""One stochastic estimate of the bound's gradient (what a DSVI step uses).

    Attributes
    ----------
    grad_mu : torch.Tensor of shape (D,)
        :math:`\frac1{S'}\sum_s g_s` (+ the analytic term's gradient; zero on fixed components of :math:`\mu`).
    grad_C : torch.Tensor of shape (D, D) or (D,)
        :math:`\frac1{S'}\sum_s \operatorname{tril}(g_s z_s^\top) + \Delta_C` (masked to the block pattern), or
        its diagonal for ``scale="diag"``.
    bound : float
        Instantaneous bound :math:`\frac1{S'}\sum_s \log g(\theta_s)` + analytic term.
    num_valid : int
        :math:`S'`, the draws with finite log joint and gradient (0: no estimate, the step is skipped).
    resampled, dropped : int
        Draws redrawn because they were invalid, and draws still invalid after ``max_resample`` rounds.
    log_joint_calls : int
        Calls to the target's log joint (1 unless draws were resampled).
    z, theta : torch.Tensor of shape (S, D)
        The final draws (invalid rows included; see ``valid``).
    valid : torch.Tensor of shape (S,), bool
    """

    grad_mu: torch.Tensor | None
    grad_C: torch.Tensor | None
    bound: float
    num_valid: int
    resampled: int
    dropped: int
    log_joint_calls: int
    z: torch.Tensor
    theta: torch.Tensor
    valid: torch.Tensor
