r"""Doubly stochastic variational inference (Titsias & Lázaro-Gredilla, ICML 2014): Algorithm 1.

The variational family is the location-scale transform of a standard distribution :math:`\phi` (paper eq. 1)

.. math::

    \theta = C z + \mu,\quad z \sim \phi,\qquad q(\theta\mid\mu, C) = \frac{1}{|C|}\,\phi\big(C^{-1}(\theta-\mu)\big),

with :math:`C` lower triangular with a strictly positive diagonal. It maximises the bound (eq. 4)

.. math::

    \mathcal F(\mu, C) = \mathbb E_{\phi(z)}[\log g(Cz + \mu)] + \sum_d \log C_{dd} + \mathcal H_\phi,

by stochastic gradient ascent with the reparametrised gradients (eq. 5-8): for draws
:math:`z_s \sim \phi`, :math:`\theta_s = Cz_s + \mu`, :math:`g_s = \nabla_\theta \log g(\theta_s)`,

.. math::

    \mu \leftarrow \mu + \rho_\mu\,\frac1S\sum_s g_s,\qquad
    C \leftarrow C + \rho_C\Big(\frac1S\sum_s \operatorname{tril}(g_s z_s^\top) + \Delta_C\Big),
    \quad \Delta_C = \operatorname{diag}(1/C_{11}, \dots, 1/C_{DD}),

(Algorithm 1, averaged over :math:`S` draws) and, for a diagonal scale :math:`C = \operatorname{diag}(c)`,
:math:`c_d \leftarrow c_d + \rho_C(\frac1S\sum_s g_{s,d}\, z_{s,d} + 1/c_d)` (eq. 9). The log joint is called
once per step on the whole ``(S, D)`` batch and differentiated by ``torch.autograd.grad`` of its sum.

Cost per step of Algorithm 1, excluding the log joint: :math:`O(SD^2)` for a full scale (the product :math:`Cz`
and the outer products), :math:`O(SD)` for a diagonal one; no matrix is ever inverted or factorised.

Monitoring (paper supplement, slides "Monitoring convergence"): the instantaneous bound
:math:`\mathcal L^{(t)} = \frac1S\sum_s\log g(\theta_s) + \sum_d\log C_{dd} + \mathcal H_\phi` at every step, its
rolling-window average (window 200 by default, 100 for ``optimizer="natural"``), and a convergence rule on that
average and on the
stabilisation of :math:`\mu` and :math:`C` (see :class:`DSVI`).

Optimizers. ``optimizer="sgd"`` is Algorithm 1 exactly (above). ``optimizer="natural"`` (gpvi's, a departure
from the paper) uses *the same stochastic gradients* :math:`\hat\nabla_\mu, \hat\nabla_C` but preconditions them
by q's own scale, i.e. takes plain gradient steps in the coordinates :math:`\mu = \mu_0 + C_0 b`,
:math:`C = C_0(I + A)` around the current iterate:

.. math::

    \mu \leftarrow \mu + \rho\, C C^\top \hat\nabla_\mu,\qquad
    C \leftarrow C\big(I + \rho\,\operatorname{tril}(C^\top \hat\nabla_C)\big).

The mean step is the natural gradient of the Gaussian bound in :math:`\mu` (Fisher information
:math:`(CC^\top)^{-1}`); the scale step is a relative (multiplicative) step, invariant to affine
reparametrisations of :math:`\theta`. The preconditioner is positive definite, so the fixed points (where the
expected gradients vanish) are those of Algorithm 1: the same bound is maximised, only the path differs. Each
step is shrunk by halving until the Gaussian KL divergence between the old and the new q is at most
``max_step_kl`` (a trust region; counted in ``info["trust_clips"]``), which also keeps the diagonal of C
positive. Cost per step :math:`O(D^3)` for the products with a full C (negligible next to a GP log joint).
It is meant to start from a good scale: by default at the MAP with the Laplace scale
:math:`C_0 = \operatorname{chol}((-\nabla^2\log g(\hat\theta))^{-1})` (:func:`laplace_approximation`, Hessian by
central differences of the gradient, :func:`finite_difference_hessian`). ``optimizer="adam"`` feeds the gradients
to Adam (per-coordinate rates, also a departure).

GP hyperparameters (paper section 3.4). For an exact GP regression target (:class:`gpvi.GPRegression`), the
default ``optimizer="auto"`` resolves to ``"natural"`` started at the MAP/Laplace point, with
``stop_on_convergence``: the run stops when the convergence rule holds and returns the average of the windows
over which it held. Every other target keeps Algorithm 1 (``"sgd"``) and the issue-3 defaults. See the
"GP hyperparameter posterior" section of :class:`DSVI`.

Data subsampling (the "doubly" of section 3.3): a target that implements the *minibatch protocol*
(``sample_minibatch(generator)`` and ``log_joint(theta, batch=...)``, e.g. :class:`gpvi.models.minibatch.MinibatchTarget`)
gets a fresh minibatch, drawn from the engine's generator, at every step.

Names in code: ``mu`` = :math:`\mu`; ``C`` = :math:`C` (``(D, D)`` lower triangular for ``scale="full"``,
the ``(D,)`` vector :math:`c` for ``scale="diag"``); ``z``, ``theta``, ``g`` as above; ``rho`` =
:math:`\rho_\mu`, ``rho * lr_scale`` = :math:`\rho_C`; ``S`` = ``num_samples``; ``base`` = :math:`\phi`.
"""

from __future__ import annotations

import copy
import math
from array import array
import numbers
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..derivatives import call_log_joint, finite_difference_hessian, is_minibatch_target, log_joint_and_grad
from ...exceptions import ConvergenceWarning, NumericalFaultError, NumericalWarning
from ...posteriors.base import GaussianPosterior, PointPosterior
from ..progress import Progress, trace_from_tensor, trace_to_tensor, warn_interrupted
from ...rng import generator_from_state, resolve_generator
from ..schedules import SCHEDULES, make_schedule
from ..families import make_standard
from ...models.target import as_target
from ...validation import (
    as_float_tensor,
    check_bool,
    check_choice,
    check_fraction,
    check_memory,
    check_nonnegative_int,
    check_positive,
    check_positive_int,
)

__all__ = ["DSVI", "DSVIState", "GradientEstimate", "EntropyTerm", "laplace_approximation",
           "finite_difference_hessian"]

_TRACE_KEYS = ("bound", "bound_avg", "rho", "num_valid")
_COUNTERS = ("resampled_draws", "dropped_draws", "skipped_steps", "c_shrinks", "c_rejects", "trust_clips",
             "log_joint_calls")
OPTIMIZERS = ("auto", "sgd", "natural", "adam")
NATURAL_LR = 0.05
"""Initial step size rho_0 of ``optimizer="natural"`` with ``lr="auto"`` (in units of q's own scale)."""
NATURAL_SCHEDULE = {"tau": 200.0, "kappa": 0.6}
"""Robbins-Monro options of ``optimizer="natural"`` with ``schedule="auto"``: rho_t = rho_0 / (1 + t/200)^0.6."""
NATURAL_WINDOW = 100
"""Rolling window (and convergence-check period) of ``optimizer="natural"`` with ``window="auto"``."""
LAPLACE_MAX_DIM = 200
"""Largest D for which DSVI builds a Laplace scale by finite differences (2D gradient evaluations)."""


# ----------------------------------------------------------------------------------------------------------
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
class DSVIState:
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
        Initial step sizes for :math:`\mu` and :math:`C` (resolved from ``lr="auto"`` at :meth:`DSVI.init`).
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
    >>> engine = DSVI(num_steps=100, lr=0.1, progress_bar=False)
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
    trace: dict[str, array] = field(default_factory=lambda: {k: array("d") for k in _TRACE_KEYS})
    counters: dict[str, int] = field(default_factory=lambda: {k: 0 for k in _COUNTERS})
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

    def bound_average(self) -> float:
        """Current rolling-window average of the instantaneous bound (NaN before the first valid step)."""
        return sum(self.window) / len(self.window) if self.window else math.nan

    def copy(self) -> DSVIState:
        """An independent deep copy (tensors cloned, generator state copied)."""
        return DSVIState.from_state_dict(self.state_dict())

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors, numbers and lists (``torch.save``-able), including the generator state."""
        return {
            "version": 1,
            "mu": self.mu.clone(), "C": self.C.clone(), "t": self.t,
            "generator_state": self.generator.get_state(), "generator_device": str(self.generator.device),
            "scale": self.scale, "rho0_mu": self.rho0_mu, "rho0_C": self.rho0_C,
            "opt": {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in self.opt.items()},
            "window": list(self.window), "window_size": self.window.maxlen,
            "trace": {k: trace_to_tensor(v) for k, v in self.trace.items()},
            "counters": dict(self.counters), "consecutive_failures": self.consecutive_failures,
            "polyak_mu": None if self.polyak_mu is None else self.polyak_mu.clone(),
            "polyak_C": None if self.polyak_C is None else self.polyak_C.clone(),
            "polyak_n": self.polyak_n,
            "check": {k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in self.check.items()},
            "converged": self.converged, "wall_time": self.wall_time,
            "optimizer": self.optimizer, "init_info": copy.deepcopy(self.init_info),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Overwrite this state with the contents of :meth:`state_dict` output."""
        new = DSVIState.from_state_dict(state)
        for f in self.__dataclass_fields__:
            setattr(self, f, getattr(new, f))

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> DSVIState:
        """Rebuild a state from :meth:`state_dict` output (e.g. after ``torch.load``)."""
        if not isinstance(state, dict) or "mu" not in state or "generator_state" not in state:
            raise TypeError("state must be a DSVIState or the dict returned by DSVIState.state_dict()")
        gen = generator_from_state(state)
        maxlen = state.get("window_size")
        return cls(
            mu=state["mu"].clone(), C=state["C"].clone(), t=int(state["t"]), generator=gen,
            scale=state["scale"], rho0_mu=float(state["rho0_mu"]), rho0_C=float(state["rho0_C"]),
            opt={k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in state["opt"].items()},
            window=deque(state["window"], maxlen=maxlen),
            trace={k: trace_from_tensor(v) for k, v in state["trace"].items()},
            counters={**{k: 0 for k in _COUNTERS}, **state["counters"]},
            consecutive_failures=int(state["consecutive_failures"]),
            polyak_mu=None if state["polyak_mu"] is None else state["polyak_mu"].clone(),
            polyak_C=None if state["polyak_C"] is None else state["polyak_C"].clone(),
            polyak_n=int(state["polyak_n"]),
            check={k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in state["check"].items()},
            converged=bool(state["converged"]), wall_time=float(state["wall_time"]),
            optimizer=str(state.get("optimizer", "adam" if state["opt"] else "sgd")),
            init_info=copy.deepcopy(state.get("init_info", {})),
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


def _laplace_scale(H: torch.Tensor) -> tuple[torch.Tensor | None, str]:
    """chol((-H)^-1) if -H is finite and positive definite, else the diagonal -diag(H) (0 where unusable)."""
    P = -H
    L, info = torch.linalg.cholesky_ex(torch.nan_to_num(P, nan=0.0, posinf=0.0, neginf=0.0))
    if bool(torch.isfinite(H).all()) and int(info) == 0:
        # C C^T = P^-1 with C lower triangular: C = chol(P^-1) (computed from the inverse, symmetrised)
        Pinv = torch.cholesky_inverse(L)
        C, info2 = torch.linalg.cholesky_ex(0.5 * (Pinv + Pinv.T))
        if int(info2) == 0 and bool(torch.isfinite(C).all()):
            return C, "laplace"
    d = torch.nan_to_num(torch.diagonal(P), nan=0.0, posinf=0.0, neginf=0.0)
    if bool((d > 0).any()):
        return d, "laplace_diagonal"
    return None, "negative hessian has no positive diagonal entry"


def laplace_approximation(target: Any, mode: Any = None, *, map_restarts: int = 1, step: float = 1e-4,
                          fallback_scale: float = 0.1, seed: int = 0) -> GaussianPosterior:
    r"""Laplace approximation :math:`\mathcal N(\hat\theta, (-\nabla^2\log g(\hat\theta))^{-1})` at the MAP.

    The mode :math:`\hat\theta = \arg\max\log g` is found by :class:`gpvi.ML2` with ``prior=True`` (L-BFGS-B
    on the log joint) unless ``mode`` is given; the Hessian by :func:`finite_difference_hessian`. When
    :math:`-H` is not positive definite, the scale falls back to a diagonal: :math:`1/\sqrt{-H_{dd}}` where
    :math:`-H_{dd} > 0` and ``fallback_scale`` elsewhere (reported in ``info["scale"]``).

    This is the starting point of :class:`DSVI` with ``optimizer="natural"`` (and ``init="laplace"``) and a
    baseline in the Table-5 benchmark; on GP hyperparameters it is *not* a substitute for DSVI (the posterior
    is skewed, and the Laplace mean is the mode, not the mean).

    Parameters
    ----------
    target : target
        ``log_joint`` ``(D,) -> ()`` and ``(S, D) -> (S,)``, differentiable once; ``names``.
    mode : array-like (D,) or PointPosterior, optional
        Point at which to expand (default: the MAP found here).
    map_restarts : int
        Restarts of the MAP search (``ML2(num_restarts=..., prior=True, seed=seed)``).
    step : float
        Relative finite-difference step.
    fallback_scale : float
        Scale of directions with no usable curvature.
    seed : int
        Seed of the MAP restarts.

    Returns
    -------
    GaussianPosterior
        ``mean`` = the mode, ``scale_tril`` = the Laplace scale; ``info`` has ``mode`` ("map" or "given"),
        ``scale`` ("laplace", "laplace_diagonal" or "fallback"), ``map_value``, ``map_time_s``,
        ``hessian_time_s``, ``hessian`` (D, D) and ``map_warnings``.

    Examples
    --------
    >>> import gpvi
    >>> ds = gpvi.datasets.load_bodyfat(seed=0)
    >>> lap = laplace_approximation(gpvi.GPRegression(ds.X_train, ds.y_train))
    >>> lap.info["scale"], lap.mean.shape
    ('laplace', torch.Size([16]))
    """
    target = as_target(target)
    D = len(target.names)
    map_restarts = check_positive_int(map_restarts, "map_restarts")
    fallback_scale = check_positive(fallback_scale, "fallback_scale")
    info: dict[str, Any] = {}
    if mode is None:
        theta, map_info = _find_map(target, map_restarts, seed)
        info.update(map_info)
    else:
        theta = (mode.theta if isinstance(mode, PointPosterior) else as_float_tensor(mode, "mode", ndim=1))
        theta = theta.detach().to(torch.float64).cpu().clone()
        if theta.shape != (D,):
            raise ValueError(f"mode must have length D = {D}; got shape {tuple(theta.shape)}")
        if not bool(torch.isfinite(theta).all()):
            raise ValueError("mode contains non-finite values")
        info["mode"] = "given"
    t0 = time.perf_counter()
    H = finite_difference_hessian(target, theta, step=step)
    C, how = _laplace_scale(H)
    info["hessian_time_s"] = time.perf_counter() - t0
    info["hessian"] = H
    if C is None:
        C = torch.full((D,), fallback_scale, dtype=torch.float64)
        info["scale"] = "fallback"
        info["scale_reason"] = how
    elif C.dim() == 1:
        d = C
        C = torch.where(d > 0, 1.0 / torch.sqrt(d.clamp_min(1e-300)), torch.full_like(d, fallback_scale))
        info["scale"] = how
    else:
        info["scale"] = how
    scale_tril = C if C.dim() == 2 else torch.diag(C)
    return GaussianPosterior(theta, scale_tril, list(target.names), target, info=info)


def _find_map(target: Any, restarts: int, seed: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """MAP by ``gpvi.ML2(prior=True)``; its warnings are recorded (the MAP is only a starting point)."""
    from ..ml2 import ML2

    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        try:
            fit = ML2(num_restarts=restarts, prior=True, seed=seed).run(target)
        except RuntimeError as exc:
            if "interrupted" in str(exc):
                raise KeyboardInterrupt from exc
            raise
    info = {"mode": "map", "map_value": fit.value, "map_time_s": time.perf_counter() - t0,
            "map_warnings": sorted({f"{w.category.__name__}: {w.message}" for w in rec})}
    return fit.theta.detach().to(torch.float64).cpu().clone(), info


# ----------------------------------------------------------------------------------------------------------
class DSVI:
    r"""Doubly stochastic variational inference (paper Algorithm 1) on any differentiable log joint.

    Parameters
    ----------
    scale : {"full", "diag"}
        Full lower-triangular :math:`C` (:math:`D(D+1)/2` free entries, :math:`O(D^2)` per step) or diagonal
        :math:`C = \operatorname{diag}(c)` (eq. 9, :math:`O(D)` per step).
    base : {"normal", "t"}, sequence of univariate distributions, or a standard-distribution object
        The standard distribution :math:`\phi`: standard normal (default; q is Gaussian and the bound is the
        Gaussian bound eq. 10), independent standard Student-t components with ``df`` degrees of freedom, or a
        product of univariate standard distributions (``torch.distributions`` objects with ``icdf``), see
        :mod:`gpvi.inference.families`.
    df : float, optional
        Degrees of freedom :math:`\nu > 0` for ``base="t"`` (required there, rejected otherwise).
    num_samples : int
        S, draws of z per step, averaged (>= 1).
    num_steps : int
        Total number of steps T of the run (a resumed run continues up to T, not T more).
    lr : float or "auto"
        :math:`\rho_0` for :math:`\mu`. ``"auto"`` (default): for ``"natural"``, :math:`\rho_0 = 0.05` (steps are
        in units of q's own scale, so no problem-dependent rate is needed); for SGD, :math:`\rho_0 = 0.5 / \hat\lambda`, where
        :math:`\hat\lambda` is the largest curvature :math:`|\mathrm{eig}(\nabla^2\log g)|` at the initial mean,
        estimated by 20 power iterations with finite-difference Hessian-vector products (2 log-joint evaluations
        each, batched). This keeps the mean update stable whatever the scale of the problem; it is a heuristic
        of gpvi, not the paper's (the paper hand-picks :math:`\rho_0`, e.g. 0.05 / N for DSVI-ARD). For Adam,
        ``"auto"`` means 0.01. The resolved rates are in ``info["lr_mu"]``, ``info["lr_C"]``. With a minibatch
        target the gradient noise grows like :math:`\sqrt{N/M}`: keep ``"auto"`` for a fast transient but let
        the rate decay by about N / M over the run, e.g. ``schedule="robbins_monro",
        schedule_options={"kappa": 1.0, "tau": num_steps * M / N}``, and keep Polyak averaging on; a rate that
        stays large leaves C biased (the :math:`1/C_{dd}` term is non-linear in the noisy C).
    lr_scale : float, optional
        :math:`\rho_C / \rho_\mu`. Default: 0.1 for SGD (the paper's :math:`0.1\rho_t`), 1 for Adam and for
        ``"natural"`` (whose steps are already scale-free). ``0`` keeps C fixed at its initial value.
    schedule : {"auto", "decay", "robbins_monro", "constant"} or schedule object
        Step-size schedule (:mod:`gpvi.schedules`) applied to both rates. ``"auto"`` (default): ``"decay"`` for
        SGD and Adam, and for ``"natural"`` :math:`\rho_t = \rho_0/(1 + t/200)^{0.6}` (Robbins–Monro, independent of
        ``num_steps`` so that a run stopped by the convergence rule does not depend on it). ``"decay"`` is the
        paper's "multiply by 0.95 every k steps" with k = ``num_steps // 20``; ``"robbins_monro"`` is
        :math:`\rho_0/(1+t/\tau)^\kappa` (:math:`\tau` = ``num_steps / 10``, :math:`\kappa = 0.6`);
        ``"constant"`` keeps :math:`\rho_0`. A schedule object carries its own :math:`\rho_0` (then leave ``lr``
        at ``"auto"``).
    schedule_options : dict, optional
        Options of a named schedule (``tau``, ``kappa``, ``factor``, ``every``).
    optimizer : {"auto", "sgd", "natural", "adam"}
        ``"sgd"``: Algorithm 1 exactly. ``"natural"``: Algorithm 1's stochastic gradients preconditioned by q's
        scale, :math:`\mu \leftarrow \mu + \rho CC^\top\hat\nabla_\mu`,
        :math:`C \leftarrow C(I + \rho\operatorname{tril}(C^\top\hat\nabla_C))`, with a KL trust region (see the
        module docstring) — a departure from the paper with the same fixed points. ``"adam"``: the same stochastic
        gradients fed to Adam (Kingma & Ba 2015) with ``adam_betas`` and ``adam_eps`` — a departure from the paper
        (per-coordinate step sizes, no Robbins–Monro guarantee). ``"auto"`` (default): ``"natural"`` when the target
        offers a cheap MAP/Laplace start — it has ``log_marginal_likelihood`` (exact GP regression,
        :class:`gpvi.GPRegression`), is not a minibatch target, has D <= 200, and no ``analytic_term`` is set —
        and ``"sgd"`` otherwise (:meth:`resolve_optimizer`; the resolved rule is ``info["optimizer"]``).
    adam_betas : tuple of float
    adam_eps : float
    max_step_kl : float
        ``"natural"`` only: largest Gaussian KL divergence between q before and after one step (> 0, default 0.1);
        larger proposed steps are halved until they fit (``info["trust_clips"]`` counts them). At the default rate
        it binds only on rare outlying gradient estimates and during the first steps.
    window : int or "auto"
        Length W of the rolling-window average of the instantaneous bound, >= 1; the convergence rule is checked
        every W steps. ``"auto"`` (default): 200 as in the paper, 100 for ``"natural"`` (whose iterates move in
        units of q's scale, so 100 steps suffice to see drift).
    tol : float
        Convergence rule, bound part: successive window averages differ by at most
        ``tol * max(1, |avg|) + 2 * se`` (se = standard error of the difference, from the windows' variances).
    param_tol : float
        Convergence rule, parameter part: the window averages of :math:`\mu` and :math:`C` (over the W steps
        since the last check) moved by at most ``param_tol``: :math:`\max_d |\Delta\bar\mu_d| / \mathrm{sd}_d`
        and :math:`\max_{ij} |\Delta\bar C_{ij}| / \mathrm{sd}_i` (sd = marginal scales of q, the row norms of
        C). Averages over a window measure drift rather than the step-to-step noise of the iterates.
    patience : int
        The rule must hold at ``patience`` consecutive checks for ``converged`` to be True.
    stop_on_convergence : bool or "auto"
        Stop before ``num_steps`` once converged. A run stopped this way returns the average of
        :math:`(\mu, C)` over the last ``patience`` windows (the windows over which the rule held), not the final
        iterate. ``"auto"`` (default): True for ``"natural"``, False otherwise (always run ``num_steps``).
    polyak : float or None
        Average :math:`(\mu, C)` over the last fraction ``polyak`` (in (0, 1]) of the ``num_steps`` steps and
        return the average (Polyak–Ruppert averaging). Default 0.25: the last quarter of the run. Not in the
        paper; it does not change the iteration, only what is reported, and removes most of the step-to-step
        noise of the final iterate. ``None``: return the final iterate (the paper's output), which is also what
        an interrupted run returns before the averaging window. (A run stopped by the convergence rule returns
        its converged-window average instead, see ``stop_on_convergence``.) ``info["returned"]`` says which.
    fixed_mean_mask : array-like of bool, shape (D,), optional
        True where :math:`\mu_d` is held at its initial value (the slides' tip "some components of :math:`\mu`
        can be fixed at zero").
    blocks : sequence, optional
        Block-diagonal structure of C (``scale="full"`` only): a partition of ``range(D)`` into groups of
        indices, or a list of contiguous block sizes. Entries of C linking different groups stay zero.
    init_scale : "auto", float, (D,) or (D, D) array-like
        Initial C when ``init`` is not a Gaussian posterior: ``init_scale * I``, a diagonal, or a lower-triangular
        matrix. ``"auto"`` (default): for ``"natural"`` (and for ``init="laplace"``), the Laplace scale at the
        initial mean, :math:`\operatorname{chol}((-H)^{-1})` with H the Hessian of :math:`\log g` by central
        differences of the gradient (2D gradient evaluations in batched log-joint calls); if :math:`-H` is not
        positive definite, the diagonal :math:`1/\sqrt{-H_{dd}}` (0.1 where :math:`-H_{dd} \le 0`); for D > 200 or
        minibatch targets 0.1 I. For SGD and Adam, 0.1 I (q starts narrow, which suits log-hyperparameters of GPs
        and standardised regression weights). ``info["init"]`` records what was done.
    max_resample : int
        Rounds of redrawing draws whose log joint (or gradient) is NaN/inf, per step (>= 0).
    max_failed_steps : int
        Consecutive skipped steps (no valid draw at all) that end the run with
        :class:`~gpvi.exceptions.NumericalFaultError` (carrying the last good state).
    num_elbo_samples : int
        Draws for the final bound estimate ``elbo`` and its standard error (0: report the rolling average).
    elbo_batch : int
        Draws per log-joint call in the final estimate.
    analytic_term : callable, optional
        Advanced: replaces the closed-form part of the bound (default :class:`EntropyTerm`,
        :math:`\sum\log C_{dd} + \mathcal H_\phi`). Called as ``term(mu, C_diag) -> (value, grad_mu, grad_C_diag)``;
        used by :class:`gpvi.inference.dsvi.ard.DSVIARD`.
    seed : int, optional
        Seed of the run's generator (default 0: runs are reproducible); ``run(..., generator=)`` overrides it.
    progress_bar : bool
        tqdm bar with the rolling bound in its postfix.

    Notes
    -----
    *Invalid draws.* When :math:`\log g(\theta_s)` or its gradient is NaN/±inf (e.g. a GP kernel matrix that
    fails Cholesky: :meth:`gpvi.GPRegression.log_joint` returns -inf for such rows), those draws are redrawn
    up to ``max_resample`` times (counted in ``info["resampled_draws"]``); draws still invalid are dropped
    (``dropped_draws``) and the gradient averages the valid ones. This is an unbiased estimate of the gradient
    of the bound for :math:`q` *restricted to the region where the log joint is valid*, not of the bound for
    q itself: if a noticeable fraction of q's mass is invalid the answer is biased, which the counters reveal.
    A step with no valid draw is skipped (``skipped_steps``, :class:`~gpvi.exceptions.NumericalWarning`).

    *Positivity of C.* A C update that would make any diagonal entry non-positive is never applied: the C step
    is scaled down so that no diagonal entry falls below half its current value (``c_shrinks``), or dropped if
    that is impossible (``c_rejects``). The mean update is applied unchanged. (``"natural"`` steps never need
    this: the KL trust region keeps every :math:`1 + \rho A_{dd}` positive.)

    **GP hyperparameter posterior** (paper section 3.4). ``DSVI(scale="full").run(model)`` on a
    :class:`gpvi.GPRegression` model (:math:`\theta` = log lengthscales², log signal and noise variances, prior
    N(0, 10) each by default; full C over all D = d + 2 components; S = 4 draws of :math:`\theta` per step through
    one batched Cholesky; no data subsampling) does, with every default:

    1. MAP :math:`\hat\theta` by ``gpvi.ML2(num_restarts=1, prior=True, seed=seed)`` (L-BFGS-B from the
       data-scaled ``model.initial_theta()``; under a second on the bundled sets) — or ``init`` if given;
    2. :math:`C_0` = Laplace scale at :math:`\mu_0` (above; :math:`2D` gradients in one batched call);
    3. ``"natural"`` steps with :math:`\rho_t = 0.05/(1+t/200)^{0.6}`, trust region ``max_step_kl = 0.1``;
    4. the convergence rule every 100 steps (bound, :math:`\mu` and C window averages, ``param_tol = 0.2``
       q-sds, ``patience = 3``), stopping when it holds and returning the average of the last 3 windows
       (``info["returned"]``); ``num_steps = 20000`` is only a cap (then a ``ConvergenceWarning``);
    5. a final bound estimate from ``num_elbo_samples = 1000`` draws (``q.elbo``, ``q.elbo_se``).

    On the bundled sets (5 splits each) every run converged, after 400–1300 steps: Boston (N = 455, D = 15)
    20–52 s, Bodyfat and Pendulum 4–13 s on a busy 2-core machine, 24x faster than a NUTS run reaching ESS 400
    on Boston (``benchmarks/results/dsvi_table5.md``). Any setting can be overridden; ``optimizer="sgd"`` runs the
    paper's Algorithm 1 (from the same start with ``init="laplace"``; it reaches the same bound on Boston in about
    3000 steps, 3x the time, with no automatic stop). Where the posterior has skewed or two-mode marginals
    (Boston's lengthscales 4, 7, 11) q, being Gaussian, is narrower than the posterior and centred on the main
    mode: it is the best Gaussian by the bound, not the Gaussian with the posterior's moments.

    *Failed Cholesky draws.* :meth:`gpvi.GPRegression.log_joint` retries a kernel matrix that is not positive
    definite with bounded jitter; a draw of :math:`\theta` whose matrix still fails gets :math:`-\infty`, and
    DSVI *redraws* it (up to ``max_resample`` rounds per step, counted in ``info["resampled_draws"]``), drops
    what is still invalid (``dropped_draws``) and skips a step with no valid draw (``skipped_steps``), warning
    once per run with the counts (policy above). Nothing is dropped silently; non-zero counters on a GP mean q
    puts mass where the model cannot be evaluated, and the answer should be treated with suspicion.

    Predictions: ``q.predict(X_test, num_draws=200)`` is the mixture over :math:`\theta \sim q` of the GP
    predictives (:class:`~gpvi.posteriors.predictive.MixturePredictive`), and ``q.summary()`` gives the marginals by name on
    the log and natural scales (example below).

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.inference.dsvi.engine import DSVI
    >>> m = torch.full((3,), 2.0, dtype=torch.float64)
    >>> target = gpvi.Target(lambda th: -0.5 * ((th - m) ** 2).sum(-1), names=3)
    >>> q = DSVI(num_steps=3000, lr=0.1, polyak=0.5, progress_bar=False, seed=0).run(target)
    >>> bool((q.mean - m).abs().max() < 0.1), bool((q.covariance - torch.eye(3)).abs().max() < 0.15)
    (True, True)

    GP hyperparameter posterior (Bodyfat without Density, D = 15; about 5 s):

    >>> import gpvi
    >>> ds = gpvi.datasets.load_bodyfat(seed=0, include_density=False)
    >>> model = gpvi.GPRegression(ds.X_train, ds.y_train)
    >>> q = DSVI(scale="full", seed=0, progress_bar=False).run(model)
    >>> q.info["optimizer"], q.info["init"]["scale"], q.info["converged"]
    ('natural', 'laplace', True)
    >>> pred = q.predict(ds.X_test, num_draws=200)
    >>> round(gpvi.metrics.smse(pred, ds.y_test), 2)
    0.32
    >>> q.summary().index[-2:]
    ['log_signal_var', 'log_noise_var']
    """

    def __init__(self, scale: str = "full", base: Any = "normal", df: float | None = None, *,
                 num_samples: int = 4, num_steps: int = 20_000, lr: float | str = "auto", lr_scale: float | None = None,
                 schedule: Any = "auto", schedule_options: dict[str, Any] | None = None, optimizer: str = "auto",
                 adam_betas: tuple[float, float] = (0.9, 0.999), adam_eps: float = 1e-8, max_step_kl: float = 0.1,
                 window: int | str = "auto", tol: float = 1e-3, param_tol: float = 0.2, patience: int = 3,
                 stop_on_convergence: bool | str = "auto", polyak: float | None = 0.25, fixed_mean_mask: Any = None,
                 blocks: Sequence[Any] | None = None, init_scale: Any = "auto", max_resample: int = 10,
                 max_failed_steps: int = 20,
                 num_elbo_samples: int = 1000, elbo_batch: int = 250,
                 analytic_term: Callable[..., Any] | None = None, seed: int | None = 0,
                 progress_bar: bool = True) -> None:
        self.scale = check_choice(scale, "scale", ("full", "diag"))
        # base / df: checked now, built at init (needs D)
        if df is not None:
            df = check_positive(df, "df")
        if isinstance(base, str):
            check_choice(base, "base", ("normal", "t"))
            if base == "t" and df is None:
                raise ValueError("df must be given (degrees of freedom nu > 0) when base='t'")
            if base == "normal" and df is not None:
                raise ValueError("df is only used with base='t'; got base='normal'")
        elif base is None:
            raise TypeError("base must be 'normal', 't', a sequence of univariate distributions or a standard "
                            "distribution object; got None")
        self.base = base
        self.df = df
        self.num_samples = check_positive_int(num_samples, "num_samples")
        self.num_steps = check_positive_int(num_steps, "num_steps")
        self.optimizer = check_choice(optimizer, "optimizer", OPTIMIZERS)
        if isinstance(lr, str):
            check_choice(lr, "lr", ("auto",))
        else:
            lr = check_positive(lr, "lr")
        self.lr = lr
        self.lr_scale = None if lr_scale is None else check_positive(lr_scale, "lr_scale", allow_zero=True)
        self.schedule_options = dict(schedule_options or {})
        if isinstance(schedule, str):
            check_choice(schedule, "schedule", ("auto",) + tuple(SCHEDULES))
            if schedule == "auto":
                if self.schedule_options:
                    raise ValueError("schedule_options need a named schedule (schedule='auto' picks its own options)")
            else:
                make_schedule(schedule, 1.0, num_steps=self.num_steps, **self.schedule_options)   # validates
        else:
            make_schedule(schedule, 1.0)
            if lr != "auto":
                raise ValueError("lr must be left at 'auto' when schedule is a schedule object (it carries rho0)")
            if self.schedule_options:
                raise ValueError("schedule_options only apply to a named schedule")
        self.schedule = schedule
        if not isinstance(adam_betas, (tuple, list)) or len(adam_betas) != 2:
            raise TypeError("adam_betas must be a pair (beta1, beta2)")
        for i, b in enumerate(adam_betas):
            check_fraction(b, f"adam_betas[{i}]", low_open=False, high_closed=False)
        self.adam_betas = (float(adam_betas[0]), float(adam_betas[1]))
        self.adam_eps = check_positive(adam_eps, "adam_eps")
        self.max_step_kl = check_positive(max_step_kl, "max_step_kl")
        if isinstance(window, str):
            check_choice(window, "window", ("auto",))
        else:
            window = check_positive_int(window, "window")
        self.window = window
        self.tol = check_positive(tol, "tol")
        self.param_tol = check_positive(param_tol, "param_tol")
        self.patience = check_positive_int(patience, "patience")
        if isinstance(stop_on_convergence, str):
            check_choice(stop_on_convergence, "stop_on_convergence", ("auto",))
        else:
            stop_on_convergence = check_bool(stop_on_convergence, "stop_on_convergence")
        self.stop_on_convergence = stop_on_convergence
        self.polyak = None if polyak is None else check_fraction(polyak, "polyak")
        self.fixed_mean_mask = None
        if fixed_mean_mask is not None:
            t = as_float_tensor(fixed_mean_mask, "fixed_mean_mask", ndim=1)
            if not bool(((t == 0) | (t == 1)).all()):
                raise ValueError("fixed_mean_mask must hold booleans (True = component of mu held fixed)")
            self.fixed_mean_mask = t.bool()
        if blocks is not None and self.scale != "full":
            raise ValueError("blocks needs scale='full' (a diagonal scale has no off-diagonal entries)")
        self.blocks = None if blocks is None else list(blocks)
        self.init_scale = init_scale
        if isinstance(init_scale, str):
            check_choice(init_scale, "init_scale", ("auto",))
        elif isinstance(init_scale, numbers.Real) and not isinstance(init_scale, bool):
            check_positive(init_scale, "init_scale")
        self.max_resample = check_nonnegative_int(max_resample, "max_resample")
        self.max_failed_steps = check_positive_int(max_failed_steps, "max_failed_steps")
        self.num_elbo_samples = check_nonnegative_int(num_elbo_samples, "num_elbo_samples")
        self.elbo_batch = check_positive_int(elbo_batch, "elbo_batch")
        if analytic_term is not None and not callable(analytic_term):
            raise TypeError(f"analytic_term must be callable; got {type(analytic_term).__name__}")
        self.analytic_term = analytic_term
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
            raise ValueError(f"seed must be a non-negative int or None; got {seed!r}")
        self.seed = seed
        self.progress_bar = check_bool(progress_bar, "progress_bar")
        self._cache: dict[str, Any] = {}     # derived from settings only (schedule object, block mask)

    # ------------------------------------------------------------------ helpers
    def settings(self) -> dict[str, Any]:
        """The constructor settings as a plain dict (recorded in ``info["settings"]``)."""
        base = self.base if isinstance(self.base, str) else repr(self.base)
        sched = self.schedule if isinstance(self.schedule, str) else repr(self.schedule)
        return {"scale": self.scale, "base": base, "df": self.df, "num_samples": self.num_samples,
                "num_steps": self.num_steps, "lr": self.lr, "lr_scale": self.lr_scale, "schedule": sched,
                "schedule_options": dict(self.schedule_options), "optimizer": self.optimizer,
                "max_step_kl": self.max_step_kl, "stop_on_convergence": self.stop_on_convergence,
                "init_scale": self.init_scale if isinstance(self.init_scale, (str, numbers.Real)) else "array",
                "window": self.window, "tol": self.tol, "param_tol": self.param_tol, "patience": self.patience,
                "polyak": self.polyak, "max_resample": self.max_resample,
                "max_failed_steps": self.max_failed_steps, "seed": self.seed}

    def make_base(self, dim: int) -> Any:
        """The standard distribution :math:`\\phi` for dimension ``dim`` (built once per dimension, cached)."""
        cached = self._cache.get("base")
        if cached is None or cached[0] != dim:
            cached = (dim, make_standard(self.base, dim, df=self.df))
            self._cache["base"] = cached
        return cached[1]

    def _term(self, base: Any) -> Callable[..., Any]:
        if self.analytic_term is not None:
            return self.analytic_term
        term = self._cache.get("term")
        if term is None or term[0] is not base:
            term = (base, EntropyTerm(base.entropy()))
            self._cache["term"] = term
        return term[1]

    def _schedule(self, state: DSVIState) -> Any:
        if not isinstance(self.schedule, str):
            return self.schedule
        key = (state.rho0_mu, state.optimizer)
        cached = self._cache.get("schedule")
        if cached is None or cached[0] != key:
            if self.schedule == "auto":
                sched = (make_schedule("robbins_monro", state.rho0_mu, **NATURAL_SCHEDULE)
                         if state.optimizer == "natural" else
                         make_schedule("decay", state.rho0_mu, num_steps=self.num_steps))
            else:
                sched = make_schedule(self.schedule, state.rho0_mu, num_steps=self.num_steps, **self.schedule_options)
            cached = (key, sched)
            self._cache["schedule"] = cached
        return cached[1]

    # ------------------------------------------------------------------ "auto" settings
    def resolve_optimizer(self, target: Any) -> str:
        """The update rule a run on ``target`` uses: ``optimizer``, or for ``"auto"`` the rule below.

        ``"natural"`` when the target offers a cheap MAP/Laplace start: it has ``log_marginal_likelihood``
        (the ML-II protocol of :class:`gpvi.ML2`, e.g. :class:`gpvi.GPRegression`), is not a minibatch target,
        has D <= 200, and no ``analytic_term`` is set; ``"sgd"`` (Algorithm 1 exactly) for every other target.

        Examples
        --------
        >>> import torch, gpvi
        >>> X = torch.linspace(0, 1, 20, dtype=torch.float64).unsqueeze(-1)
        >>> gp = gpvi.GPRegression(X, torch.sin(6 * X[:, 0]))
        >>> DSVI().resolve_optimizer(gp), DSVI().resolve_optimizer(gpvi.Target(lambda t: -t.pow(2).sum(-1), names=2))
        ('natural', 'sgd')
        >>> DSVI(optimizer="sgd").resolve_optimizer(gp)
        'sgd'
        """
        if self.optimizer != "auto":
            return self.optimizer
        target = as_target(target)
        laplace_ok = (self.analytic_term is None and not is_minibatch_target(target)
                      and callable(getattr(target, "log_marginal_likelihood", None))
                      and len(target.names) <= LAPLACE_MAX_DIM)
        return "natural" if laplace_ok else "sgd"

    def _stop_on_convergence(self, state: DSVIState) -> bool:
        if self.stop_on_convergence == "auto":
            return state.optimizer == "natural"
        return bool(self.stop_on_convergence)

    def _window(self, optimizer: str) -> int:
        if self.window == "auto":
            return NATURAL_WINDOW if optimizer == "natural" else 200
        return int(self.window)

    def _lr_scale(self, optimizer: str) -> float:
        if self.lr_scale is not None:
            return self.lr_scale
        return 0.1 if optimizer == "sgd" else 1.0

    def _block_mask(self, D: int) -> torch.Tensor | None:
        """The cached block mask of C (None without ``blocks``)."""
        if self.blocks is None:
            return None
        mask = self._cache.get("mask")
        if mask is None or mask.shape[0] != D:
            mask = self._cache["mask"] = self._mask(D)
        return mask

    def _mask(self, D: int) -> torch.Tensor | None:
        if self.blocks is None:
            return None
        groups: list[list[int]]
        if all(isinstance(b, numbers.Integral) and not isinstance(b, bool) for b in self.blocks):
            sizes = [int(b) for b in self.blocks]
            if any(s < 1 for s in sizes) or sum(sizes) != D:
                raise ValueError(f"blocks as sizes must be positive and sum to D = {D}; got {sizes}")
            starts = [sum(sizes[:i]) for i in range(len(sizes))]
            groups = [list(range(s, s + n)) for s, n in zip(starts, sizes)]
        else:
            try:
                groups = [[int(i) for i in g] for g in self.blocks]
            except TypeError:
                raise TypeError("blocks must be a list of block sizes or a list of index groups") from None
            flat = sorted(i for g in groups for i in g)
            if flat != list(range(D)):
                raise ValueError(f"blocks must partition range(D) with D = {D} (every index exactly once)")
        M = torch.zeros(D, D, dtype=torch.bool)
        for g in groups:
            ix = torch.tensor(g)
            M[ix.unsqueeze(1), ix.unsqueeze(0)] = True
        return torch.tril(M)

    def _initial(self, target: Any, init: Any, D: int, optimizer: str
                 ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Initial (mu0, C0) and a record of how they were obtained (see :meth:`init`)."""
        C0 = None
        info: dict[str, Any] = {}
        natural = optimizer == "natural"
        laplace_possible = not is_minibatch_target(target) and D <= LAPLACE_MAX_DIM
        if isinstance(init, str):
            check_choice(init, "init", ("laplace",))
        want_laplace_scale = (isinstance(init, str) or natural) and isinstance(self.init_scale, str) \
            and laplace_possible
        if isinstance(init, str) or (init is None and natural and laplace_possible):
            if not laplace_possible:
                raise ValueError(f"init='laplace' needs a full-data target with D <= {LAPLACE_MAX_DIM} "
                                 f"(got {'a minibatch target' if is_minibatch_target(target) else f'D = {D}'})")
            mu0, map_info = _find_map(target, 1, 0 if self.seed is None else self.seed)
            info.update(map_info)
            info["mean"] = "map"
        elif init is None:
            if callable(getattr(target, "initial_theta", None)):
                mu0 = torch.as_tensor(target.initial_theta()).detach().to(torch.float64).cpu()
                info["mean"] = "initial_theta"
            else:
                mu0 = torch.zeros(D, dtype=torch.float64)
                info["mean"] = "zeros"
        elif isinstance(init, GaussianPosterior):
            mu0 = init.mean.detach().to(torch.float64).cpu()
            C0 = init.scale_tril.detach().to(torch.float64).cpu()
            if C0.shape != (D, D):
                raise ValueError(f"init (a GaussianPosterior) has dimension {C0.shape[0]} but the target has D = {D}")
            info["mean"], info["scale"] = "given", "given"
            want_laplace_scale = False
        elif isinstance(init, PointPosterior):
            mu0 = init.theta.detach().to(torch.float64).cpu()
            info["mean"] = "given"
        else:
            mu0 = as_float_tensor(init, "init", ndim=1)
            info["mean"] = "given"
        if mu0.shape != (D,):
            raise ValueError(f"init must have length D = {D}; got shape {tuple(mu0.shape)}")
        if not bool(torch.isfinite(mu0).all()):
            raise ValueError("init contains non-finite values")
        mu0 = mu0.clone()
        diag = self.scale == "diag"
        if C0 is None and want_laplace_scale:
            t0 = time.perf_counter()
            H = finite_difference_hessian(target, mu0)
            L, how = _laplace_scale(H)
            info["hessian_time_s"] = time.perf_counter() - t0
            if L is None:
                warnings.warn(f"DSVI: no Laplace scale at the initial mean ({how}); starting from C = 0.1 I",
                              NumericalWarning, stacklevel=4)
                info["scale"] = "init_scale (laplace failed: " + how + ")"
            elif L.dim() == 1:
                C0 = torch.diag(torch.where(L > 0, 1.0 / torch.sqrt(L.clamp_min(1e-300)),
                                            torch.full_like(L, 0.1)))
                info["scale"] = "laplace_diagonal"
            else:
                C0 = L
                info["scale"] = "laplace"
        if C0 is None:
            s = 0.1 if isinstance(self.init_scale, str) else self.init_scale
            info.setdefault("scale", "init_scale")
            if isinstance(s, numbers.Real) and not isinstance(s, bool):
                C0 = torch.full((D,), float(s), dtype=torch.float64) if diag else \
                    float(s) * torch.eye(D, dtype=torch.float64)
            else:
                st = as_float_tensor(s, "init_scale", ndim=(1, 2))
                if st.dim() == 1:
                    if st.shape[0] != D:
                        raise ValueError(f"init_scale must have length D = {D}; got {st.shape[0]}")
                    C0 = st.clone() if diag else torch.diag(st)
                else:
                    if st.shape != (D, D):
                        raise ValueError(f"init_scale must be ({D}, {D}); got {tuple(st.shape)}")
                    if bool((torch.triu(st, 1) != 0).any()):
                        raise ValueError("init_scale must be lower triangular")
                    C0 = st.clone()
        c0 = C0 if C0.dim() == 1 else torch.diagonal(C0)
        if not bool((c0 > 0).all()) or not bool(torch.isfinite(C0).all()):
            raise ValueError("init_scale must be finite with a strictly positive diagonal")
        if diag:
            if C0.dim() == 2:
                C0 = torch.sqrt((C0 ** 2).sum(-1))        # marginal scales of the given C
        else:
            mask = self._mask(D)
            C0 = torch.tril(C0) if mask is None else C0 * mask
        return mu0, C0, info

    def _theta(self, mu: torch.Tensor, C: torch.Tensor, z: torch.Tensor, scale: str) -> torch.Tensor:
        return mu + z * C if scale == "diag" else torch.addmm(mu, z, C.T)

    def _curvature_rate(self, target: Any, mu0: torch.Tensor, gen: torch.Generator, batch: Any) -> float:
        """0.5 / |largest eigenvalue of the Hessian of log g at mu0| by power iteration (finite differences)."""
        D = mu0.shape[0]
        v = torch.randn(D, generator=gen, dtype=torch.float64)
        v = v / v.norm()
        h = 1e-4 * (1.0 + float(mu0.abs().max()))
        lam = math.nan
        for _ in range(20):
            pts = torch.stack([mu0 + h * v, mu0 - h * v])
            _, g = log_joint_and_grad(target, pts, batch)
            Hv = -(g[0] - g[1]) / (2 * h)
            if not bool(torch.isfinite(Hv).all()):
                lam = math.nan
                break
            lam = float(v @ Hv)
            nrm = float(Hv.norm())
            if nrm == 0.0:
                break
            v = Hv / nrm
        lam = abs(lam)
        if not math.isfinite(lam) or lam <= 1e-12:
            warnings.warn("DSVI lr='auto': could not estimate the curvature of log g at the initial mean; "
                          "using lr = 1e-3 (pass lr= explicitly)", NumericalWarning, stacklevel=3)
            return 1e-3
        return 0.5 / lam

    # ------------------------------------------------------------------ functional core
    def init(self, target: Any, init: Any = None, *, generator: torch.Generator | None = None) -> DSVIState:
        """Initial state: :math:`\\mu_0`, :math:`C_0`, resolved step sizes and the run's generator.

        Parameters
        ----------
        target : target
            Anything with ``log_joint`` (``(S, D) -> (S,)``) and ``names``.
        init : None, "laplace", array-like of shape (D,), PointPosterior or GaussianPosterior
            Initial mean. ``None``: for ``"natural"`` (see :meth:`resolve_optimizer`), the MAP found by
            ``gpvi.ML2(num_restarts=1, prior=True)`` (full-data targets with D <= 200; its warnings are recorded in
            ``info["init"]["map_warnings"]``, not raised); otherwise ``target.initial_theta()`` if it exists, else
            zeros. ``"laplace"``: the MAP and the Laplace scale, whatever the optimizer. A point (array or
            ``PointPosterior``, e.g. an ML-II fit) sets the mean; with ``init_scale="auto"`` and ``"natural"`` the
            scale is then the Laplace scale at that point. A Gaussian posterior sets mean and scale (warm start).
        generator : torch.Generator, optional
            Used (and advanced) instead of a fresh generator seeded with ``seed``.

        Returns
        -------
        DSVIState
            With ``optimizer`` (resolved) and ``init_info`` (how :math:`\\mu_0, C_0` were found, and the time).

        Examples
        --------
        >>> import torch, gpvi
        >>> target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=3)
        >>> state = DSVI(init_scale=0.5).init(target, torch.ones(3))
        >>> state.mu.tolist(), torch.diagonal(state.C).tolist(), round(state.rho0_mu, 6)   # lr='auto': 0.5 / 1
        ([1.0, 1.0, 1.0], [0.5, 0.5, 0.5], 0.5)
        """
        target = as_target(target)
        D = len(target.names)
        base = self.make_base(D)
        if self.fixed_mean_mask is not None and self.fixed_mean_mask.shape[0] != D:
            raise ValueError(f"fixed_mean_mask must have length D = {D}; got {self.fixed_mean_mask.shape[0]}")
        optimizer = self.resolve_optimizer(target)
        t_init = time.perf_counter()
        mu0, C0, init_info = self._initial(target, init, D, optimizer)
        init_info["time_s"] = time.perf_counter() - t_init
        if base.dim != D:
            raise ValueError(f"base has dimension {base.dim} but the target has D = {D}")
        gen = resolve_generator(self.seed, generator)
        batch = target.sample_minibatch(gen) if is_minibatch_target(target) else None
        lj0, _ = log_joint_and_grad(target, mu0.unsqueeze(0), batch)
        if not bool(torch.isfinite(lj0).all()):
            warnings.warn(f"log joint at the initial mean is {float(lj0[0])}; DSVI will try anyway (draws with "
                          f"non-finite values are resampled)", NumericalWarning, stacklevel=2)
        if isinstance(self.schedule, str):
            if self.lr == "auto":
                if optimizer == "adam":
                    rho0 = 0.01
                elif optimizer == "natural":
                    rho0 = NATURAL_LR
                else:
                    rho0 = self._curvature_rate(target, mu0, gen, batch)
            else:
                rho0 = float(self.lr)
        else:
            rho0 = float(self.schedule.rho0)
        opt: dict[str, Any] = {}
        if optimizer == "adam":
            opt = {"m_mu": torch.zeros_like(mu0), "v_mu": torch.zeros_like(mu0), "m_C": torch.zeros_like(C0),
                   "v_C": torch.zeros_like(C0), "n": 0}
        return DSVIState(mu=mu0, C=C0, t=0, generator=gen, scale=self.scale, rho0_mu=rho0,
                         rho0_C=rho0 * self._lr_scale(optimizer), opt=opt, window=deque(maxlen=self._window(optimizer)),
                         optimizer=optimizer, init_info=init_info)

    def estimate_gradient(self, target: Any, state: DSVIState, *, base: Any = None) -> GradientEstimate:
        r"""Draw S values of z and return the stochastic gradient of the bound at ``(state.mu, state.C)``.

        Uses (and advances) ``state.generator`` but changes nothing else. This is exactly what :meth:`step`
        applies: :math:`\hat\nabla_\mu = \frac1{S'}\sum_s g_s`, :math:`\hat\nabla_C =
        \frac1{S'}\sum_s\operatorname{tril}(g_s z_s^\top) + \Delta_C` (eq. 5-8), averaged over the S' valid draws.

        Parameters
        ----------
        target : target
        state : DSVIState
        base : standard distribution, optional
            :math:`\phi` (built from the settings when omitted).

        Returns
        -------
        GradientEstimate
        """
        mu, C, gen, scale = state.mu, state.C, state.generator, state.scale
        D = mu.shape[0]
        if base is None:
            base = self.make_base(D)
        S = self.num_samples
        batch = target.sample_minibatch(gen) if is_minibatch_target(target) else None
        z = base.sample(S, gen, dtype=torch.float64)
        theta = self._theta(mu, C, z, scale)
        lj, g = log_joint_and_grad(target, theta, batch)
        calls = 1
        valid = torch.isfinite(lj + g.sum(-1))       # value and every gradient entry finite
        resampled = 0
        if not bool(valid.all()):
            for _ in range(self.max_resample):
                bad = (~valid).nonzero().flatten()
                if bad.numel() == 0:
                    break
                z_new = base.sample(bad.numel(), gen, dtype=torch.float64)
                th_new = self._theta(mu, C, z_new, scale)
                lj_new, g_new = log_joint_and_grad(target, th_new, batch)
                calls += 1
                resampled += bad.numel()
                z[bad], theta[bad], lj[bad], g[bad] = z_new, th_new, lj_new, g_new
                valid[bad] = torch.isfinite(lj_new + g_new.sum(-1))
        nv = int(valid.sum())
        dropped = S - nv
        if nv == 0:
            return GradientEstimate(None, None, math.nan, 0, resampled, dropped, calls, z, theta, valid)
        if nv < S:
            zv, gv, ljv = z[valid], g[valid], lj[valid]
        else:
            zv, gv, ljv = z, g, lj
        c = C if scale == "diag" else torch.diagonal(C)
        term_value, term_mu, term_c = self._term(base)(mu, c)
        grad_mu = gv.mean(0)
        if term_mu is not None:
            grad_mu = grad_mu + term_mu
        if self.fixed_mean_mask is not None:
            grad_mu = grad_mu.masked_fill(self.fixed_mean_mask, 0.0)
        if scale == "diag":
            grad_C = (gv * zv).mean(0) + term_c
        else:
            G = gv.T @ zv / nv
            if self.blocks is not None:
                G = G * self._block_mask(D)
            else:
                G = torch.tril(G)
            G.diagonal().add_(term_c)
            grad_C = G
        bound = float(ljv.mean()) + term_value
        return GradientEstimate(grad_mu, grad_C, bound, nv, resampled, dropped, calls, z, theta, valid)

    def step(self, target: Any, state: DSVIState) -> tuple[DSVIState, dict[str, Any]]:
        r"""One iteration of Algorithm 1 (or its Adam variant): advance ``state`` in place and return it.

        Parameters
        ----------
        target : target
        state : DSVIState

        Returns
        -------
        state : DSVIState
            The same object, advanced (``t`` + 1).
        info : dict
            ``t`` (steps done), ``bound`` (instantaneous bound at the parameters before the update),
            ``bound_avg``, ``rho`` (:math:`\rho_\mu`), ``num_valid``, ``resampled``, ``dropped``, ``skipped``,
            ``c_shrink`` (factor applied to the C step, 1 if none), ``converged``.

        Raises
        ------
        NumericalFaultError
            ``max_failed_steps`` consecutive steps had no valid draw; ``err.state`` is the last good state.

        Examples
        --------
        >>> import torch, gpvi
        >>> target = gpvi.Target(lambda th: -0.5 * ((th - 3.0) ** 2).sum(-1), names=2)
        >>> engine = DSVI(lr=0.2, schedule="constant")
        >>> state = engine.init(target, torch.zeros(2))
        >>> for _ in range(200):
        ...     state, info = engine.step(target, state)
        >>> bool((state.mu - 3.0).abs().max() < 0.5), info["t"]
        (True, 200)
        """
        t = state.t
        sched = self._schedule(state)
        rho = float(sched(t))
        rho_C = rho * (state.rho0_C / state.rho0_mu) if state.rho0_mu > 0 else 0.0
        est = self.estimate_gradient(target, state)
        cnt = state.counters
        info: dict[str, Any] = {"rho": rho, "num_valid": est.num_valid, "resampled": est.resampled,
                                "dropped": est.dropped, "skipped": False, "c_shrink": 1.0}
        first_resample = cnt["resampled_draws"] == 0 and est.resampled > 0
        cnt["resampled_draws"] += est.resampled
        cnt["dropped_draws"] += est.dropped
        cnt["log_joint_calls"] += est.log_joint_calls
        if first_resample:
            warnings.warn(f"DSVI: log joint was NaN/inf for {est.resampled} draw(s) at step {t}; redrawn "
                          f"(counted in info['resampled_draws'])", NumericalWarning, stacklevel=2)
        # one reduction checks both gradients (a sum of finite entries that overflows also counts as a fault)
        ok = est.num_valid > 0 and math.isfinite(float(est.grad_mu.sum() + est.grad_C.sum()))
        if not ok:
            state.consecutive_failures += 1
            cnt["skipped_steps"] += 1
            info["skipped"] = True
            if state.consecutive_failures == 1:
                warnings.warn(f"DSVI: step {t} skipped (no draw with a finite log joint and gradient after "
                              f"{self.max_resample} resampling rounds)", NumericalWarning, stacklevel=2)
            state.t = t + 1
            self._record(state, math.nan, rho, 0, info)
            if state.consecutive_failures >= self.max_failed_steps:
                raise NumericalFaultError(
                    f"DSVI: {state.consecutive_failures} consecutive steps failed (log joint or gradient NaN/inf "
                    f"for all draws, last at step {t}); err.state holds mu and C from the last good step (the "
                    f"skipped steps changed neither)", state=state)
            return state, info
        state.consecutive_failures = 0
        # --- proposed steps
        if state.optimizer == "sgd":
            d_mu = rho * est.grad_mu
            d_C = rho_C * est.grad_C
        elif state.optimizer == "natural":
            d_mu, d_C, shrink = self._natural(state, est.grad_mu, est.grad_C, rho, rho_C)
            info["trust_shrink"] = shrink
            if shrink < 1.0:
                cnt["trust_clips"] = cnt.get("trust_clips", 0) + 1
        else:
            d_mu, d_C = self._adam(state, est.grad_mu, est.grad_C, rho, rho_C)
        # --- C positivity: never apply a step that makes a diagonal entry <= 0
        c_old = state.C if state.scale == "diag" else torch.diagonal(state.C)
        dc = d_C if state.scale == "diag" else torch.diagonal(d_C)
        apply_C = rho_C > 0
        if apply_C and bool(((c_old + dc) <= 0).any()):
            neg = dc < 0
            alpha = float((0.5 * c_old[neg] / (-dc[neg])).min())
            if math.isfinite(alpha) and alpha > 0:
                d_C = alpha * d_C
                cnt["c_shrinks"] += 1
                info["c_shrink"] = alpha
            else:
                apply_C = False
                cnt["c_rejects"] += 1
                info["c_shrink"] = 0.0
        new_mu = state.mu + d_mu
        new_C = state.C + d_C if apply_C else state.C
        if self.fixed_mean_mask is not None:
            new_mu = torch.where(self.fixed_mean_mask, state.mu, new_mu)
        # --- commit
        state.mu, state.C = new_mu, new_C
        state.t = t + 1
        if self.polyak is not None:
            start = int(math.floor((1.0 - self.polyak) * self.num_steps))
            if state.t > start:
                state.polyak_n += 1
                if state.polyak_mu is None:
                    state.polyak_mu, state.polyak_C = new_mu.clone(), new_C.clone()
                else:
                    w = 1.0 / state.polyak_n
                    state.polyak_mu = state.polyak_mu + w * (new_mu - state.polyak_mu)
                    state.polyak_C = state.polyak_C + w * (new_C - state.polyak_C)
        self._accumulate(state)
        self._record(state, est.bound, rho, est.num_valid, info)
        return state, info

    def _natural(self, state: DSVIState, g_mu: torch.Tensor, g_C: torch.Tensor, rho: float, rho_C: float
                 ) -> tuple[torch.Tensor, torch.Tensor, float]:
        r"""Preconditioned step from Algorithm 1's gradients, with a KL trust region (``optimizer="natural"``).

        :math:`b = C^\top \hat\nabla_\mu`, :math:`A = \operatorname{tril}(C^\top \hat\nabla_C)` (block mask
        applied); proposed :math:`\mu' = \mu + \alpha\rho\, C b`, :math:`C' = C(I + \alpha\rho_C A)`, with
        :math:`\alpha = 2^{-k}` the largest for which the Gaussian KL of the step
        :math:`\tfrac12[\lVert I+\alpha\rho_C A\rVert_F^2 - D + \alpha^2\rho^2\lVert b\rVert^2
        - 2\sum_d\log(1+\alpha\rho_C A_{dd})]` is at most ``max_step_kl`` (so the diagonal stays positive).
        """
        C = state.C
        if state.scale == "diag":
            b = C * g_mu
            A = C * g_C
            d_mu_unit, d_C_unit, a_diag = rho * C * b, rho_C * C * A, A
        else:
            b = C.T @ g_mu
            A = C.T @ g_C
            mask = self._block_mask(C.shape[0])
            A = torch.tril(A) if mask is None else A * mask
            d_mu_unit, d_C_unit, a_diag = rho * (C @ b), rho_C * (C @ A), torch.diagonal(A)
        bb = float(b @ b)
        D = C.shape[0]
        alpha = 1.0
        for _ in range(60):
            dg = 1.0 + alpha * rho_C * a_diag
            if bool((dg > 0).all()):
                if state.scale == "diag":
                    fro = float((dg ** 2).sum())
                else:
                    fro = float(((alpha * rho_C) ** 2) * (A ** 2).sum() + 2.0 * alpha * rho_C * a_diag.sum()) + D
                kl = 0.5 * (fro - D + alpha * alpha * rho * rho * bb - 2.0 * float(torch.log(dg).sum()))
                if kl <= self.max_step_kl:
                    break
            alpha *= 0.5
        return alpha * d_mu_unit, alpha * d_C_unit, alpha

    def _adam(self, state: DSVIState, g_mu: torch.Tensor, g_C: torch.Tensor, rho: float, rho_C: float
              ) -> tuple[torch.Tensor, torch.Tensor]:
        b1, b2 = self.adam_betas
        o = state.opt
        n = o["n"] + 1
        o["m_mu"] = b1 * o["m_mu"] + (1 - b1) * g_mu
        o["v_mu"] = b2 * o["v_mu"] + (1 - b2) * g_mu * g_mu
        o["m_C"] = b1 * o["m_C"] + (1 - b1) * g_C
        o["v_C"] = b2 * o["v_C"] + (1 - b2) * g_C * g_C
        o["n"] = n
        c1, c2 = 1 - b1 ** n, 1 - b2 ** n
        d_mu = rho * (o["m_mu"] / c1) / (torch.sqrt(o["v_mu"] / c2) + self.adam_eps)
        d_C = rho_C * (o["m_C"] / c1) / (torch.sqrt(o["v_C"] / c2) + self.adam_eps)
        return d_mu, d_C

    def _record(self, state: DSVIState, bound: float, rho: float, num_valid: int, info: dict[str, Any]) -> None:
        if math.isfinite(bound):
            state.window.append(bound)
        avg = state.bound_average()
        tr = state.trace
        tr["bound"].append(bound)
        tr["bound_avg"].append(avg)
        tr["rho"].append(rho)
        tr["num_valid"].append(float(num_valid))
        W = state.window.maxlen
        if state.t % W == 0 and len(state.window) == W:
            self._check_convergence(state)
        info.update(t=state.t, bound=bound, bound_avg=avg, converged=state.converged)

    def _accumulate(self, state: DSVIState) -> None:
        ck = state.check
        if ck.get("sum_mu") is None:
            ck["sum_mu"], ck["sum_C"], ck["n"] = state.mu.clone(), state.C.clone(), 1
        else:
            ck["sum_mu"].add_(state.mu)
            ck["sum_C"].add_(state.C)
            ck["n"] += 1

    def _check_convergence(self, state: DSVIState) -> None:
        """Compare this window's averages (bound, mu, C) with the previous window's."""
        W = len(state.window)
        avg = sum(state.window) / W
        var = sum((b - avg) ** 2 for b in state.window) / max(W - 1, 1)
        ck = state.check
        n = max(ck.get("n", 0), 1)
        mu_bar = ck["sum_mu"] / n if ck.get("sum_mu") is not None else state.mu.clone()
        C_bar = ck["sum_C"] / n if ck.get("sum_C") is not None else state.C.clone()
        sd = C_bar.abs() if state.scale == "diag" else torch.sqrt((C_bar ** 2).sum(-1))
        if ck.get("avg") is not None:
            se = math.sqrt((var + ck["var"]) / W)
            ok_bound = abs(avg - ck["avg"]) <= self.tol * max(1.0, abs(avg)) + 2.0 * se
            dmu = float(((mu_bar - ck["mu"]).abs() / sd).max())
            dC_abs = (C_bar - ck["C"]).abs()
            dC = float((dC_abs / sd).max()) if state.scale == "diag" else float((dC_abs / sd[:, None]).max())
            ok = ok_bound and dmu <= self.param_tol and dC <= self.param_tol
            ck["streak"] = ck.get("streak", 0) + 1 if ok else 0
            ck["last"] = {"t": state.t, "dbound": abs(avg - ck["avg"]), "se": se, "dmu_sd": dmu, "dC_sd": dC}
            state.converged = ck["streak"] >= self.patience
        hist = list(ck.get("history") or [])[-(self.patience - 1):] if self.patience > 1 else []
        hist.append({"t": state.t, "n": n, "mu": mu_bar, "C": C_bar})
        ck.update(avg=avg, var=var, mu=mu_bar, C=C_bar, sum_mu=None, sum_C=None, n=0, history=hist)

    # ------------------------------------------------------------------ bound estimate
    def estimate_bound(self, target: Any, mu: torch.Tensor, C: torch.Tensor, *, num_samples: int | None = None,
                       generator: torch.Generator | None = None, seed: int | None = None
                       ) -> tuple[float, float, int]:
        r"""Monte Carlo estimate of the bound :math:`\mathcal F(\mu, C)` (eq. 4) with its standard error.

        :math:`\hat{\mathcal F} = \frac1n\sum_i \log g(Cz_i + \mu) + \text{analytic term}`, with the full-data log
        joint for minibatch targets (streamed in chunks), ``elbo_batch`` draws per call, no gradients.

        Parameters
        ----------
        target : target
        mu : tensor of shape (D,)
        C : tensor of shape (D, D) (lower triangular) or (D,) (diagonal scale)
        num_samples : int, optional
            n (default ``num_elbo_samples``).
        generator, seed
            Randomness of the draws.

        Returns
        -------
        (estimate, standard_error, num_invalid)
            Invalid draws (NaN/inf log joint) are left out of the average and counted.

        Examples
        --------
        >>> import math, torch, gpvi
        >>> lognormal = lambda th: -0.5 * (th ** 2).sum(-1) - math.log(2 * math.pi)     # normalised, D = 2
        >>> est, se, bad = DSVI().estimate_bound(gpvi.Target(lognormal, names=2), torch.zeros(2), torch.eye(2),
        ...                                      num_samples=4000)
        >>> abs(est) < 5 * se, bad                      # q = target: the bound is log Z = 0
        (True, 0)
        """
        n = self.num_elbo_samples if num_samples is None else check_positive_int(num_samples, "num_samples")
        if n == 0:
            raise ValueError("num_samples must be >= 1 for a bound estimate (num_elbo_samples is 0)")
        target = as_target(target)
        mu = as_float_tensor(mu, "mu", ndim=1)
        C = as_float_tensor(C, "C", ndim=(1, 2))
        D = mu.shape[0]
        if D != len(target.names):
            raise ValueError(f"mu has length {D} but the target has D = {len(target.names)}")
        if C.shape not in ((D,), (D, D)):
            raise ValueError(f"C must be ({D}, {D}) lower triangular or ({D},) diagonal; got {tuple(C.shape)}")
        if not bool(((torch.diagonal(C) if C.dim() == 2 else C) > 0).all()):
            raise ValueError("C must have a strictly positive diagonal")
        base = self.make_base(D)
        gen = resolve_generator(seed if seed is not None else 0, generator)
        scale = "diag" if C.dim() == 1 else "full"
        vals = []
        with torch.no_grad():
            for start in range(0, n, self.elbo_batch):
                k = min(self.elbo_batch, n - start)
                z = base.sample(k, gen, dtype=torch.float64)
                vals.append(call_log_joint(target, self._theta(mu, C, z, scale), None).detach())
        v = torch.cat(vals)
        ok = torch.isfinite(v)
        bad = int((~ok).sum())
        v = v[ok]
        c = C if scale == "diag" else torch.diagonal(C)
        term_value, _, _ = self._term(base)(mu, c)
        if v.numel() == 0:
            return math.nan, math.nan, bad
        se = float(v.std() / math.sqrt(v.numel())) if v.numel() > 1 else math.nan
        return float(v.mean()) + term_value, se, bad

    # ------------------------------------------------------------------ driver
    def run(self, target: Any, init: Any = None, *, generator: torch.Generator | None = None,
            callback: Callable[[DSVIState, dict[str, Any]], None] | None = None,
            state: DSVIState | dict[str, Any] | None = None) -> GaussianPosterior:
        r"""Run Algorithm 1 until ``num_steps`` steps are done and return the posterior.

        Parameters
        ----------
        target : target
            Anything with ``log_joint(theta)`` (``(S, D) -> (S,)``, differentiable) and ``names``:
            :class:`gpvi.GPRegression`, :class:`gpvi.Target`, :class:`gpvi.models.logistic.BayesianLogisticRegression`,
            :class:`gpvi.models.minibatch.MinibatchTarget`, ...
        init : None, "laplace", array-like (D,), PointPosterior or GaussianPosterior
            See :meth:`init`. Not allowed together with ``state``.
        generator : torch.Generator, optional
            Overrides ``seed``. Not allowed together with ``state`` (the state carries its generator).
        callback : callable, optional
            ``callback(state, info)`` after every step; raising ``KeyboardInterrupt`` stops the run like Ctrl-C.
        state : DSVIState or its state_dict, optional
            Resume from this state (e.g. ``q.engine_state``, or a state_dict loaded from disk) and continue up to
            ``num_steps`` total steps. The result equals that of an uninterrupted run with the same settings.

        Returns
        -------
        GaussianPosterior
            ``mean``, ``scale_tril`` (the Polyak average when ``polyak`` is set, else the final iterate),
            ``elbo`` and ``elbo_se`` (a fresh estimate with ``num_elbo_samples`` draws at the returned
            :math:`(\mu, C)`), ``trace`` (tensors ``bound``, ``bound_avg``, ``rho``, ``num_valid`` per step),
            ``info`` (counters, ``converged``, ``steps``, ``time_s``, ``lr_mu``, ``lr_C``, ``interrupted``,
            ``settings``, ``convergence`` diagnostics) and ``engine_state`` (the final :class:`DSVIState`).

        Raises
        ------
        NumericalFaultError
            ``max_failed_steps`` consecutive failed steps; ``err.state`` is the last good state and
            ``err.partial`` the posterior built from it.

        Warns
        -----
        InterruptedRunWarning
            Ctrl-C / KeyboardInterrupt from the callback: the posterior so far is returned.
        NumericalWarning
            Draws were resampled or dropped, steps skipped, or C steps shrunk during the run.
        ConvergenceWarning
            The convergence rule did not hold at the end of the run.

        Examples
        --------
        >>> import gpvi
        >>> from gpvi.models.logistic import BayesianLogisticRegression
        >>> ds = gpvi.datasets.load_pima()
        >>> model = BayesianLogisticRegression(ds.X_train, ds.y_train)
        >>> q = DSVI(num_steps=2000, progress_bar=False).run(model)
        >>> q.mean.shape, q.info["steps"], q.trace["bound_avg"].shape
        (torch.Size([8]), 2000, torch.Size([2000]))
        """
        target = as_target(target)
        D = len(target.names)
        if state is not None:
            if init is not None or generator is not None:
                raise ValueError("state cannot be combined with init or generator (the state carries both)")
            if isinstance(state, dict):
                state = DSVIState.from_state_dict(state)
            elif not isinstance(state, DSVIState):
                raise TypeError(f"state must be a DSVIState or its state_dict; got {type(state).__name__}")
            if state.dim != D:
                raise ValueError(f"state has dimension {state.dim} but the target has D = {D}")
            if state.scale != self.scale:
                raise ValueError(f"state was made with scale={state.scale!r} but this engine has scale={self.scale!r}")
            if state.window.maxlen != self._window(state.optimizer):
                state.window = deque(state.window, maxlen=self._window(state.optimizer))
            if self.optimizer != "auto" and state.optimizer != self.optimizer:
                raise ValueError(f"state was made with optimizer={state.optimizer!r} but this engine has "
                                 f"optimizer={self.optimizer!r}")
            state.check["stopped"] = False
        else:
            state = self.init(target, init, generator=generator)
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be callable; got {type(callback).__name__}")
        before = dict(state.counters)
        interrupted = False
        t_start = state.t
        stop = self._stop_on_convergence(state)
        t0 = time.perf_counter()
        bar = Progress(self.num_steps, enabled=self.progress_bar, desc="DSVI", initial=state.t)
        try:
            while state.t < self.num_steps:
                snap = state.generator.get_state()
                try:
                    state, info = self.step(target, state)
                except KeyboardInterrupt:
                    state.generator.set_state(snap)     # the step did not happen: rewind its randomness
                    raise
                bar.update(1, bound=info["bound_avg"])
                if callback is not None:
                    callback(state, info)
                if stop and state.converged:
                    state.check["stopped"] = True
                    break
        except KeyboardInterrupt:
            interrupted = True
            bar.close()
            warn_interrupted("DSVI", state.t, self.num_steps)
        except NumericalFaultError as err:
            bar.close()
            state.wall_time += time.perf_counter() - t0
            err.partial = self._posterior(target, state, interrupted=True, run_time=time.perf_counter() - t0,
                                          steps_this_run=state.t - t_start)
            raise
        finally:
            bar.close()
        run_time = time.perf_counter() - t0
        state.wall_time += run_time
        self._warn_counters(state, before)
        if not interrupted and not state.converged:
            last = state.check.get("last")
            detail = "" if last is None else (f" (last check at step {last['t']}: bound change {last['dbound']:.3g} "
                                              f"vs se {last['se']:.3g}, max change of mu {last['dmu_sd']:.3g} sd, "
                                              f"of C {last['dC_sd']:.3g} sd)")
            warnings.warn(f"DSVI: convergence rule not met after {state.t} steps{detail}; consider more steps, a "
                          f"decaying schedule or polyak averaging", ConvergenceWarning, stacklevel=2)
        return self._posterior(target, state, interrupted=interrupted, run_time=run_time,
                               steps_this_run=state.t - t_start)

    def _warn_counters(self, state: DSVIState, before: dict[str, int]) -> None:
        diff = {k: state.counters.get(k, 0) - before.get(k, 0) for k in _COUNTERS
                if k not in ("log_joint_calls", "trust_clips")}
        if any(v > 0 for v in diff.values()):
            parts = ", ".join(f"{k}={v}" for k, v in diff.items() if v > 0)
            warnings.warn(f"DSVI survived numerical faults in this run: {parts} (see q.info)", NumericalWarning,
                          stacklevel=3)

    def _posterior(self, target: Any, state: DSVIState, *, interrupted: bool, run_time: float,
                   steps_this_run: int) -> GaussianPosterior:
        D = state.dim
        base = self.make_base(D)
        hist = state.check.get("history") or []
        if state.check.get("stopped") and state.converged and hist:
            w = torch.tensor([float(h["n"]) for h in hist], dtype=torch.float64)
            w = w / w.sum()
            mu = sum(wi * h["mu"] for wi, h in zip(w, hist))
            C = sum(wi * h["C"] for wi, h in zip(w, hist))
            returned = f"average of the last {len(hist)} window(s) ({int(sum(h['n'] for h in hist))} iterates) " \
                       f"over which the convergence rule held"
        elif state.polyak_n > 0:
            mu, C = state.polyak_mu, state.polyak_C
            returned = f"Polyak average of the last {state.polyak_n} iterates"
        else:
            mu, C = state.mu, state.C
            returned = "final iterate"
        elbo_method = "rolling window average"
        elbo, se, invalid = state.bound_average(), math.nan, 0
        if not interrupted and self.num_elbo_samples > 0:
            g = torch.Generator(device=state.generator.device)
            g.set_state(state.generator.get_state())   # a copy: the state's stream is not advanced
            elbo, se, invalid = self.estimate_bound(target, mu, C, generator=g)
            elbo_method = f"Monte Carlo, {self.num_elbo_samples} draws at the returned (mu, C)"
            if invalid:
                warnings.warn(f"DSVI: {invalid} of {self.num_elbo_samples} draws for the final bound estimate had "
                              f"a non-finite log joint and were left out", NumericalWarning, stacklevel=3)
        if state.scale == "diag":
            check_memory(D, copies=2, what=f"the ({D}, {D}) scale_tril of the GaussianPosterior for scale='diag'")
            scale_tril = torch.diag(C)
        else:
            scale_tril = C
        info = dict(state.counters)
        info.update(
            converged=state.converged, steps=state.t, steps_this_run=steps_this_run, time_s=run_time,
            total_time_s=state.wall_time, lr_mu=state.rho0_mu, lr_C=state.rho0_C, interrupted=interrupted,
            polyak_n=state.polyak_n, elbo_method=elbo_method, elbo_invalid=invalid,
            convergence=dict(state.check.get("last") or {}), settings=self.settings(),
            optimizer=state.optimizer, returned=returned, stopped_on_convergence=bool(state.check.get("stopped")),
            schedule=repr(self._schedule(state)), init=copy.deepcopy(state.init_info),
        )
        trace = {k: trace_to_tensor(v) for k, v in state.trace.items()}
        return GaussianPosterior(mu.clone(), scale_tril.clone(), list(target.names), target, base=base, elbo=elbo,
                                 elbo_se=se, trace=trace, info=info, engine_state=state)

    def __repr__(self) -> str:
        return (f"DSVI(scale={self.scale!r}, base={self.base if isinstance(self.base, str) else type(self.base).__name__}"
                f", num_samples={self.num_samples}, num_steps={self.num_steps}, lr={self.lr!r}, "
                f"optimizer={self.optimizer!r})")
