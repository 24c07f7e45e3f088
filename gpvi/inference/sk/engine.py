r"""Salimans & Knowles (2013): fixed-form variational Bayes by stochastic linear regression.

*Fixed-form variational posterior approximation through stochastic linear regression*, Bayesian Analysis 8(4).
For an exponential-family :math:`q_\eta(x) \propto \exp(\tilde T(x)\tilde\eta)` with statistics
:math:`\tilde T(x) = [1, T(x)]`, the KL-optimal natural parameters satisfy the fixed point (paper eq. 9)

.. math::

    \tilde\eta = \mathbb E_q[\tilde T(x)^\top\tilde T(x)]^{-1}\,\mathbb E_q[\tilde T(x)^\top\log p(x, y)],

a linear regression of :math:`\log p` on the sufficient statistics. The paper solves it by stochastic
approximation: draws :math:`x_t^* \sim q_{\eta_t}`, running averages :math:`C_{t+1} = (1-w)C_t + w\hat C_t`,
:math:`g_{t+1} = (1-w)g_t + w\hat g_t` with a constant step :math:`w = 1/\sqrt N`, and the regression computed
from plain averages over the second half of the :math:`N` steps (Algorithm 1, eq. 11).

This module implements

* :class:`SKGaussian` — a Gaussian :math:`q = \mathcal N(m, V)` fitted to any target (``log_joint`` +
  autograd gradient), with two sources of regression statistics:

  - ``method="hessian"``: **Algorithm 2** (sections 6.3-6.4, Appendix B). Running averages of the gradient
    :math:`a`, of the negative Hessian :math:`P` (a precision) and of the draws :math:`z`,

    .. math::

        a_{t+1} = (1-w)a_t + w g_t,\quad P_{t+1} = (1-w)P_t - wH_t,\quad z_{t+1} = (1-w)z_t + w x_t^*,\quad
        V_{t+1} = P_{t+1}^{-1},\quad m_{t+1} = V_{t+1}a_{t+1} + z_{t+1},

    and the output :math:`V = \bar P^{-1}`, :math:`m = V\bar a + \bar z` from averages over the second half.
    Hessians :math:`H_t` come from autograd where the target supports double backward, else from batched
    central finite differences of the gradient (:func:`value_grad_hessian`).
  - ``method="gradient"``: the **Hessian-free** variant of section 6.2 (gradients only, eq. 27), in the
    transformed parametrisation of section 6.4, eq. (47)-(49), see *Notes* of :class:`SKGaussian`.

  Data subsampling (section 6.5, eq. 50) comes for free: a target with the minibatch protocol of
  :mod:`gpvi.models.minibatch` gets a fresh minibatch at every step. The result is the same
  :class:`~gpvi.posteriors.base.GaussianPosterior` as :class:`gpvi.inference.dsvi.engine.DSVI` returns.
* :class:`SKExpFamily` — **Algorithm 1** for a low-dimensional exponential family (:class:`Exponential`,
  :class:`Gamma`, :class:`Normal`, or any object with the same methods), with the paper's section-5 quantities:
  the bound :math:`\hat\eta_0 + U(\hat\eta)`, the evidence estimate of eq. (19) and :math:`R^2`. When the
  posterior is in the family the regression is noise free and recovers it exactly after :math:`2(k+1)` steps
  (eq. 13, section 4.0.1).

Names in code follow the paper: ``w`` = :math:`w`; ``num_steps`` = :math:`N`; ``a``, ``P``, ``z`` and their
second-half averages ``a_bar``, ``P_bar``, ``z_bar`` (Algorithm 2); ``m`` = :math:`m`; ``theta`` = the draws
:math:`x_t^*`; ``eta`` = :math:`\eta`, ``eta0`` = the intercept :math:`\eta_0`; ``C``, ``g`` (Algorithm 1).
Because the paper's :math:`z` is a running mean of draws, the standard-normal noise behind a draw is called
``eps``: :math:`x^* = m + L^{-\top}\varepsilon` with :math:`P = LL^\top`.
"""

from __future__ import annotations

import copy
import math
import numbers
import time
import warnings
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import scipy.special
import torch

from ..derivatives import (
    _autograd_hessian,
    _fd_hessian,
    _NoDoubleBackward,
    call_log_joint,
    is_minibatch_target,
    log_joint_and_grad,
    value_grad_hessian,
)
from ...exceptions import ConvergenceWarning, NumericalFaultError, NumericalWarning
from ...linalg import cholesky_solve, cholesky_with_jitter
from ...posteriors.base import GaussianPosterior, PointPosterior
from ..progress import Progress, trace_from_tensor, trace_to_tensor, warn_interrupted
from ...rng import generator_from_state, resolve_generator
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

__all__ = [
    "SKGaussian",
    "SKState",
    "value_grad_hessian",
    "SKExpFamily",
    "SKExpFamilyResult",
    "Exponential",
    "Gamma",
    "Normal",
]

_LOG_2PI = math.log(2.0 * math.pi)
_TRACE_KEYS = ("bound", "bound_avg", "num_valid", "pd")
_COUNTERS = ("resampled_draws", "dropped_draws", "skipped_steps", "non_pd_steps", "log_joint_calls",
             "log_joint_evals", "hessian_backward_passes")
_PD_JITTER = 1e-13        # relative jitter of the strict positive-definiteness test (rounding level only)


def _strict_cholesky(M: torch.Tensor) -> torch.Tensor | None:
    """Lower Cholesky factor of a symmetric ``M`` if it is positive definite (beyond rounding), else None.

    Goes through :func:`gpvi.linalg.cholesky_with_jitter` with a jitter cap at rounding level, so an indefinite
    matrix is reported as such rather than "fixed".
    """
    if not bool(torch.isfinite(M).all()):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumericalWarning)
        res = cholesky_with_jitter(M, jitter=_PD_JITTER, max_jitter=_PD_JITTER, raise_on_failure=False,
                                   what="precision P")
    return res.L if bool(res.ok) else None


def _scale_from_precision(L: torch.Tensor) -> torch.Tensor:
    """Lower-triangular :math:`C` with :math:`CC^\\top = (LL^\\top)^{-1}` (the posterior's ``scale_tril``)."""
    V = torch.cholesky_inverse(L)
    V = 0.5 * (V + V.T)
    return cholesky_with_jitter(V, what="covariance V = P^-1", raise_on_failure=True).L


# ==========================================================================================================
@dataclass
class SKState:
    r"""Everything that evolves during a :class:`SKGaussian` run (settings stay in the engine).

    :meth:`SKGaussian.step` advances a state in place. ``state_dict()`` / :meth:`from_state_dict` round-trip
    through ``torch.save`` and resume bit for bit (``SKGaussian.run(target, state=...)``).

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
        :class:`SKGaussian`).
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
        How :math:`V_1` was set (``scale``: "init_scale", "laplace", "laplace_diagonal ...", "given ..."; the
        Laplace start's evaluation cost).
    generator : torch.Generator
        The run's random stream (draws, resampled draws, minibatches).
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
    wall_time : float
        Seconds spent in :meth:`SKGaussian.run` over all segments.

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.inference.sk.engine import SKGaussian, SKState
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
    trace: dict[str, array] = field(default_factory=lambda: {k: array("d") for k in _TRACE_KEYS})
    counters: dict[str, int] = field(default_factory=lambda: {k: 0 for k in _COUNTERS})
    consecutive_failures: int = 0
    wall_time: float = 0.0

    @property
    def dim(self) -> int:
        """Number of parameters D."""
        return self.m.shape[0]

    def bound_average(self) -> float:
        """Rolling-window average of the instantaneous bound (NaN before the first valid step)."""
        return sum(self.window) / len(self.window) if self.window else math.nan

    def copy(self) -> SKState:
        """An independent deep copy (tensors cloned, generator state copied)."""
        return SKState.from_state_dict(self.state_dict())

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors, numbers and lists (``torch.save``-able), including the generator state."""
        def cl(d):
            return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}
        return {
            "version": 1, "m": self.m.clone(), "L": self.L.clone(), "stats": cl(self.stats),
            "sums": [cl(s) for s in self.sums], "t": self.t, "num_steps": self.num_steps, "w": self.w,
            "method": self.method, "hessian": self.hessian, "hessian_note": self.hessian_note,
            "init_info": copy.deepcopy(self.init_info),
            "generator_state": self.generator.get_state(), "generator_device": str(self.generator.device),
            "window": list(self.window), "window_size": self.window.maxlen,
            "trace": {k: trace_to_tensor(v) for k, v in self.trace.items()},
            "counters": dict(self.counters), "consecutive_failures": self.consecutive_failures,
            "wall_time": self.wall_time,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Overwrite this state with the contents of :meth:`state_dict` output."""
        new = SKState.from_state_dict(state)
        for f in self.__dataclass_fields__:
            setattr(self, f, getattr(new, f))

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> SKState:
        """Rebuild a state from :meth:`state_dict` output (e.g. after ``torch.load``)."""
        if not isinstance(state, dict) or "stats" not in state or "generator_state" not in state:
            raise TypeError("state must be an SKState or the dict returned by SKState.state_dict()")
        gen = generator_from_state(state)

        def cl(d):
            return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}
        return cls(
            m=state["m"].clone(), L=state["L"].clone(), stats=cl(state["stats"]),
            sums=[cl(s) for s in state["sums"]], t=int(state["t"]), num_steps=int(state["num_steps"]),
            w=float(state["w"]), method=state["method"], hessian=state["hessian"],
            hessian_note=state.get("hessian_note", ""), init_info=copy.deepcopy(state.get("init_info", {})),
            generator=gen,
            window=deque(state["window"], maxlen=state.get("window_size")),
            trace={k: trace_from_tensor(v) for k, v in state["trace"].items()},
            counters=dict(state["counters"]), consecutive_failures=int(state["consecutive_failures"]),
            wall_time=float(state["wall_time"]),
        )


@dataclass
class _Estimate:
    """Per-step Monte Carlo estimates (averages over the valid draws)."""

    num_valid: int
    resampled: int
    dropped: int
    calls: int
    evals: int
    backward: int
    bound: float
    parts: dict[str, torch.Tensor] | None      # g, x (+ H) or (+ eps, A, B)


# ==========================================================================================================
class SKGaussian:
    r"""Gaussian variational approximation by stochastic linear regression (Salimans & Knowles 2013, Alg. 2).

    Parameters
    ----------
    num_steps : int
        N, the total number of iterations (default 500). It fixes the step size :math:`w = 1/\sqrt N` and the
        averaging window (the last ``average_fraction`` of the steps), so it is part of the algorithm, not a
        budget to extend. In ``benchmarks/results/sk_vs_dsvi.md`` N = 50 reaches the optimal bound on Pima
        logistic regression (D = 8) and N = 125-250 (Hessian-free) or 200-400 (Algorithm 2) on the Boston GP
        hyperparameter posterior (D = 15); the window-split check warns when N was too small.
    method : {"hessian", "gradient"}
        Regression statistics: ``"hessian"`` is Algorithm 2 (gradient and Hessian of log g at each draw);
        ``"gradient"`` the Hessian-free variant of section 6.2 (gradients only; see Notes). Prefer
        ``"gradient"`` when Hessians need finite differences (e.g. :class:`gpvi.GPRegression`: 2D + 1 log-joint
        rows per draw against 2 per antithetic pair); ``"hessian"`` needs the fewest log-joint evaluations when
        autograd Hessians are available. It needs at least D antithetic pairs in the averaging window (more in
        practice: N = 50 failed and N = 125 worked on the D = 15 Boston posterior with 2 pairs per step).
    hessian : {"auto", "autograd", "fd"}, optional
        Source of Hessians for ``method="hessian"`` (default ``"auto"``; rejected for ``method="gradient"``),
        see :func:`value_grad_hessian`. ``"auto"`` probes the target once at the initial mean: autograd if it
        supports double backward, else central finite differences (recorded in ``info["hessian"]``).
    num_samples : int, optional
        S, draws per step; the per-step estimates are averages over the S draws. Default 1 for
        ``method="hessian"`` (the paper's single draw) and 2 (one antithetic pair) for ``method="gradient"``,
        which needs an even S.
    step_size : float, optional
        :math:`w` in (0, 1]; default :math:`1/\sqrt N` (paper Algorithm 2).
    average_fraction : float
        Fraction of the final steps whose statistics are averaged for the output (paper: 0.5, the second half).
    fd_step : float
        Relative finite-difference step of ``hessian="fd"``.
    init_scale : float, (D,) or (D, D) array-like, or "laplace"
        Initial scale when ``init`` is not a Gaussian posterior: :math:`V_1 = CC^\top` with ``C =
        init_scale * I`` (default 0.1: q starts narrow, as DSVI's non-Laplace default), a diagonal, or a
        lower-triangular matrix. ``"laplace"``: :math:`V_1 = (-\nabla^2\log g(m_1))^{-1}`, matching the curvature
        of log g at the initial mean (the paper's advice for difficult cases, section 4; best with ``init`` at the
        mode, e.g. an ML-II/MAP point), with the Hessian from :func:`value_grad_hessian` (``hessian`` source, or
        ``"auto"`` for the gradient variant; counted in ``info``); where :math:`-H` is not positive definite, the
        diagonal :math:`1/\sqrt{-H_{dd}}` (0.1 where :math:`-H_{dd} \le 0`). ``info["init"]`` records which.
    on_non_pd : {"reject", "keep", "raise"}
        What to do when the update would make the running precision :math:`P_{t+1}` not positive definite
        (possible early on, with a large :math:`w`, a poor start or a heavy-tailed target; paper section 4).
        ``"reject"`` (default): the step is rejected — its draws do not enter the running statistics and
        :math:`q_t` is kept, so the iteration only moves between valid Gaussians (an update that would flip
        :math:`P` indefinite is an outlier against the running average; absorbing it can start a runaway towards
        ever wider q on heavy-tailed targets). ``"keep"``: the statistics absorb the draws (the paper's
        recursion) but draws keep coming from the last valid :math:`q_t` until :math:`P` is positive definite
        again. ``"raise"``: stop at once with :class:`~gpvi.exceptions.NumericalFaultError`. In all cases the step is
        counted in ``info["non_pd_steps"]`` with one :class:`~gpvi.exceptions.NumericalWarning`; the averaged
        statistics of the output always use every draw of the window, and an averaged :math:`\bar P` that is not
        positive definite raises :class:`~gpvi.exceptions.NumericalFaultError` (advice: more steps, i.e. a
        smaller :math:`w`, or a start closer to the posterior). Never a NaN.
    max_resample : int
        Rounds of redrawing draws whose log joint, gradient or Hessian is NaN/inf, per step.
    max_failed_steps : int
        Consecutive steps without any valid draw that end the run with
        :class:`~gpvi.exceptions.NumericalFaultError` (carrying the last good state).
    drift_tol : float
        Convergence check: the averaging window is split in two halves and :math:`(m, V)` computed from each;
        a :class:`~gpvi.exceptions.ConvergenceWarning` is issued when the means differ by more than
        ``drift_tol`` posterior sds or the sds by more than a factor ``exp(drift_tol)``.
    window : int
        Length of the rolling average of the instantaneous bound in the trace.
    num_elbo_samples : int
        Draws for the final Monte Carlo bound estimate ``elbo`` / ``elbo_se`` (0: report the rolling average).
    elbo_batch : int
        Draws per log-joint call in that estimate.
    seed : int, optional
        Seed of the run's generator (default 0); ``run(..., generator=)`` overrides it.
    progress_bar : bool

    Notes
    -----
    *Why it works* (paper section 4 and Appendix B). With :math:`\phi = (m, V)` and the linear transformation of
    section 6.4, the regression (eq. 45) needs :math:`\mathbb E_q[\nabla\log g]`, :math:`\mathbb E_q[\nabla^2\log
    g]` and :math:`\mathbb E_q[x]`; its solution :math:`P = -\mathbb E_q[\nabla^2\log g]`, :math:`m = P^{-1}
    \mathbb E_q[\nabla\log g] + \mathbb E_q[x]` is the fixed point of Gaussian VI (:math:`\mathbb E_q[\nabla\log g]
    = 0` at the optimum). For a Gaussian target the Hessian is constant and the gradient linear in :math:`x`, so
    the averaged regression returns the target exactly, whatever the draws (the "noise-free regression").

    *Hessian-free statistics* (``method="gradient"``, section 6.2, eq. 27 and 47-49). Draw
    :math:`x = s(\phi, \varepsilon) = m + R\varepsilon` and use the paper's reparametrised estimates
    :math:`\hat g = \nabla_\phi\log g(s(\phi,\varepsilon))`, :math:`\hat C = \nabla_\phi T(s(\phi,\varepsilon))`
    with :math:`T(x) = (x, -\tfrac12 xx^\top)` and :math:`\phi = (m, R)`. Since :math:`\hat C\eta =
    J^\top(\eta_1 - Px)` and :math:`\hat g = J^\top\nabla\log g(x)` with :math:`J^\top v = (v,
    v\varepsilon^\top)`, the normal equations :math:`\bar C\eta = \bar g` say: regress the gradient on the draw,
    :math:`\nabla\log g(x) \approx \eta_1 - Px`, with instruments :math:`(1, \varepsilon)`. gpvi draws
    antithetic pairs :math:`x_\pm = m \pm R\varepsilon` (``num_samples`` even; the paper's section 6.0.1 suggests
    antithetic draws) and estimates the slope from the half-differences within each pair, so the moving mean
    :math:`m_t` cannot leak into it,

    .. math::

        A = \overline{\tfrac12(x_+ - x_-)\varepsilon^\top} = \overline{R\varepsilon\varepsilon^\top},\qquad
        B = \overline{\tfrac12(\nabla\log g(x_+) - \nabla\log g(x_-))\varepsilon^\top},\qquad
        P = -\mathrm{sym}(BA^{-1}),\qquad m = \bar z + P^{-1}\bar a,

    with :math:`a`, :math:`z` the averages of all gradients and draws as in Algorithm 2 (the intercept block).
    One :math:`D\times D` solve: an unconstrained square root :math:`R` gives :math:`D^2` equations, symmetrised,
    instead of the :math:`D(D+1)/2`-dimensional system of a triangular :math:`R`. For a Gaussian target
    :math:`\nabla\log g(x_+) - \nabla\log g(x_-) = -2\Lambda R\varepsilon`, so :math:`B = -\Lambda A` exactly and
    this variant also recovers the target exactly once the averaging window holds at least D pairs; for other
    targets it converges to the fixed point of Algorithm 2 (:math:`B \to \mathbb E_q[\nabla^2\log g]R` by
    Stein's lemma) with more Monte Carlo noise, since each pair carries rank-one curvature information, but with
    :math:`O(SD^2 + D^3)` work per step and no Hessian. The running statistics start from the values a Gaussian
    target equal to :math:`q_1` would give (:math:`A = R_1`, :math:`B = -P_1R_1`).

    *Cost per step*: the log joint (S rows; ``hessian="fd"``: S(2D+1) rows in one call; ``"autograd"``: D extra
    backward passes) plus :math:`O(D^3)` for the Cholesky factor of :math:`P_{t+1}`. Memory: a few
    :math:`D\times D` matrices — the "stored matrix" that makes the method costly for large D.

    *Subsampling* (section 6.5): the statistics are linear in log g and its derivatives, so an unbiased
    minibatch estimate (eq. 50; :class:`gpvi.models.minibatch.MinibatchTarget`) keeps them unbiased; a fresh batch is
    drawn from the run's generator at every step and shared by all the rows of that step.

    *Departures from the paper*: S draws per step may be averaged; a step that would make :math:`P_{t+1}`
    indefinite is rejected by default (the paper only advises more iterations; ``on_non_pd``); draws with a
    non-finite log joint are redrawn/dropped as in :class:`gpvi.inference.dsvi.engine.DSVI`; the window-split drift check is gpvi's.

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.inference.sk.engine import SKGaussian
    >>> Lam = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=torch.float64)    # target precision
    >>> mu = torch.tensor([1.0, -1.0], dtype=torch.float64)
    >>> target = gpvi.Target(lambda th: -0.5 * (((th - mu) @ Lam) * (th - mu)).sum(-1), names=["a", "b"])
    >>> q = SKGaussian(num_steps=20, progress_bar=False).run(target)
    >>> bool((q.mean - mu).abs().max() < 1e-10), bool((q.covariance - torch.linalg.inv(Lam)).abs().max() < 1e-10)
    (True, True)
    """

    def __init__(self, num_steps: int = 500, *, method: str = "hessian", hessian: str | None = None,
                 num_samples: int | None = None, step_size: float | None = None, average_fraction: float = 0.5,
                 fd_step: float = 1e-4, init_scale: Any = 0.1, on_non_pd: str = "reject", max_resample: int = 10,
                 max_failed_steps: int = 20, drift_tol: float = 0.5, window: int = 200,
                 num_elbo_samples: int = 1000, elbo_batch: int = 250, seed: int | None = 0,
                 progress_bar: bool = True) -> None:
        self.num_steps = check_positive_int(num_steps, "num_steps")
        self.method = check_choice(method, "method", ("hessian", "gradient"))
        if hessian is not None:
            check_choice(hessian, "hessian", ("auto", "autograd", "fd"))
            if self.method == "gradient":
                raise ValueError("hessian is only used with method='hessian' (method='gradient' needs no Hessian)")
        self.hessian = hessian if hessian is not None else ("auto" if self.method == "hessian" else None)
        if num_samples is None:
            num_samples = 1 if self.method == "hessian" else 2
        self.num_samples = check_positive_int(num_samples, "num_samples")
        if self.method == "gradient" and self.num_samples % 2:
            raise ValueError(f"num_samples must be even for method='gradient' (draws come in antithetic pairs "
                             f"m +- R eps); got {self.num_samples}")
        self.step_size = None if step_size is None else check_fraction(step_size, "step_size")
        self.average_fraction = check_fraction(average_fraction, "average_fraction")
        self.fd_step = check_positive(fd_step, "fd_step")
        if self.fd_step >= 0.1:
            raise ValueError(f"fd_step must be < 0.1 (a relative finite-difference step); got {self.fd_step:g}")
        if isinstance(init_scale, numbers.Real) and not isinstance(init_scale, bool):
            check_positive(init_scale, "init_scale")
        elif isinstance(init_scale, str):
            check_choice(init_scale, "init_scale", ("laplace",))
        elif init_scale is None or isinstance(init_scale, bool):
            raise TypeError(f"init_scale must be a positive number, an array or 'laplace'; got "
                            f"{type(init_scale).__name__}")
        self.init_scale = init_scale
        self.on_non_pd = check_choice(on_non_pd, "on_non_pd", ("reject", "keep", "raise"))
        self.max_resample = check_nonnegative_int(max_resample, "max_resample")
        self.max_failed_steps = check_positive_int(max_failed_steps, "max_failed_steps")
        self.drift_tol = check_positive(drift_tol, "drift_tol", allow_inf=True)
        self.window = check_positive_int(window, "window")
        self.num_elbo_samples = check_nonnegative_int(num_elbo_samples, "num_elbo_samples")
        self.elbo_batch = check_positive_int(elbo_batch, "elbo_batch")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
            raise ValueError(f"seed must be a non-negative int or None; got {seed!r}")
        self.seed = seed
        self.progress_bar = check_bool(progress_bar, "progress_bar")

    # ------------------------------------------------------------------ helpers
    @property
    def w(self) -> float:
        """The step size :math:`w` (``step_size`` or :math:`1/\\sqrt N`)."""
        return self.step_size if self.step_size is not None else 1.0 / math.sqrt(self.num_steps)

    def settings(self) -> dict[str, Any]:
        """The constructor settings as a plain dict (recorded in ``info["settings"]``)."""
        return {"num_steps": self.num_steps, "method": self.method, "hessian": self.hessian,
                "num_samples": self.num_samples, "step_size": self.w, "average_fraction": self.average_fraction,
                "fd_step": self.fd_step, "on_non_pd": self.on_non_pd, "max_resample": self.max_resample,
                "max_failed_steps": self.max_failed_steps, "drift_tol": self.drift_tol, "seed": self.seed}

    def _window_bounds(self) -> tuple[int, int]:
        """(start, mid): steps t (1-based) with start < t <= mid go to sums[0], mid < t <= N to sums[1]."""
        N = self.num_steps
        start = N - max(1, int(math.ceil(self.average_fraction * N)))
        mid = start + (N - start) // 2
        return start, mid

    def _empty_sums(self, D: int) -> dict[str, Any]:
        keys = ("a", "z", "P") if self.method == "hessian" else ("a", "z", "A", "B")
        out: dict[str, Any] = {}
        for k in keys:
            out[k] = torch.zeros((D, D) if k in ("P", "A", "B") else (D,), dtype=torch.float64)
        out["n"] = 0
        return out

    def _initial(self, target: Any, init: Any, D: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        C0 = None
        how: dict[str, Any] = {"scale": "given (GaussianPosterior)"}
        if init is None:
            if callable(getattr(target, "initial_theta", None)):
                m0 = torch.as_tensor(target.initial_theta()).detach().to(torch.float64).cpu()
            else:
                m0 = torch.zeros(D, dtype=torch.float64)
        elif isinstance(init, GaussianPosterior):
            m0 = init.mean.detach().to(torch.float64).cpu()
            C0 = init.scale_tril.detach().to(torch.float64).cpu()
            if C0.shape != (D, D):
                raise ValueError(f"init (a GaussianPosterior) has dimension {C0.shape[0]} but the target has D = {D}")
            if getattr(init.base, "kind", None) != "normal":
                raise ValueError("init must be a Gaussian posterior (standard-normal base) to set V_1; got a base "
                                 f"of kind {getattr(init.base, 'kind', type(init.base).__name__)!r}")
        elif isinstance(init, PointPosterior):
            m0 = init.theta.detach().to(torch.float64).cpu()
        else:
            m0 = as_float_tensor(init, "init", ndim=1)
        if m0.shape != (D,):
            raise ValueError(f"init must have length D = {D}; got shape {tuple(m0.shape)}")
        if not bool(torch.isfinite(m0).all()):
            raise ValueError("init contains non-finite values")
        if C0 is None:
            s = self.init_scale
            how = {"scale": "init_scale"}
            if isinstance(s, str):                                    # "laplace"
                C0, how = self._laplace_scale(target, m0)
            elif isinstance(s, numbers.Real) and not isinstance(s, bool):
                C0 = float(s) * torch.eye(D, dtype=torch.float64)
            else:
                st = as_float_tensor(s, "init_scale", ndim=(1, 2))
                if st.dim() == 1:
                    if st.shape[0] != D:
                        raise ValueError(f"init_scale must have length D = {D}; got {st.shape[0]}")
                    C0 = torch.diag(st)
                else:
                    if st.shape != (D, D):
                        raise ValueError(f"init_scale must be ({D}, {D}); got {tuple(st.shape)}")
                    if bool((torch.triu(st, 1) != 0).any()):
                        raise ValueError("init_scale must be lower triangular")
                    C0 = st.clone()
                if not bool((torch.diagonal(C0) > 0).all()):
                    raise ValueError("init_scale must have a strictly positive diagonal")
        return m0.clone(), C0, how

    def _laplace_scale(self, target: Any, m0: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        """chol((-H)^-1) at m0, or a diagonal fallback; with the evaluation cost for the counters."""
        hessian = self.hessian if self.hessian is not None else "auto"
        D = m0.shape[0]
        th = m0.unsqueeze(0)
        how: dict[str, Any] = {}
        if hessian in ("auto", "autograd"):
            try:
                _, _, H, _ = _autograd_hessian(target, th, None)
                how.update(hessian_rows=1, hessian_backward=D)
            except _NoDoubleBackward as exc:
                if hessian == "autograd":
                    raise ValueError(f"hessian='autograd' is not available for this target ({exc}); use "
                                     f"hessian='fd' or 'auto'") from None
                hessian = "fd"
        if hessian == "fd":
            _, _, H, _ = _fd_hessian(target, th, None, self.fd_step)
            how.update(hessian_rows=2 * D + 1, hessian_backward=0)
        H = H[0]
        if not bool(torch.isfinite(H).all()):
            raise ValueError("init_scale='laplace': the Hessian of log g at the initial mean is not finite")
        L = _strict_cholesky(-H)
        if L is not None:
            how["scale"] = "laplace"
            return _scale_from_precision(L), how
        d = -torch.diagonal(H)
        how["scale"] = "laplace_diagonal (-H not positive definite)"
        return torch.diag(torch.where(d > 0, d.clamp_min(1e-300).rsqrt(), torch.full_like(d, 0.1))), how

    # ------------------------------------------------------------------ functional core
    def init(self, target: Any, init: Any = None, *, generator: torch.Generator | None = None) -> SKState:
        r"""Initial state: :math:`m_1`, :math:`P_1 = V_1^{-1}`, :math:`a_1 = 0`, :math:`z_1 = m_1` (Algorithm 2).

        Parameters
        ----------
        target : target
            Anything with ``log_joint`` (``(S, D) -> (S,)``) and ``names``.
        init : None, array-like of shape (D,), PointPosterior or GaussianPosterior
            Initial mean (``None``: ``target.initial_theta()`` if it exists, else zeros); a Gaussian posterior
            also sets :math:`V_1` (warm start, e.g. from DSVI or a Laplace approximation).
        generator : torch.Generator, optional
            Used (and advanced) instead of a fresh generator seeded with ``seed``.

        Returns
        -------
        SKState

        Examples
        --------
        >>> import torch, gpvi
        >>> target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=2)
        >>> state = SKGaussian(init_scale=0.5).init(target, torch.ones(2))
        >>> state.m.tolist(), torch.diagonal(state.stats["P"]).tolist(), state.hessian
        ([1.0, 1.0], [4.0, 4.0], 'autograd')
        """
        target = as_target(target)
        D = len(target.names)
        check_memory(D, copies=10, what="the Salimans-Knowles engine's D x D statistics")
        m0, C0, how = self._initial(target, init, D)
        P0 = torch.cholesky_inverse(C0)                     # (C0 C0^T)^-1
        P0 = 0.5 * (P0 + P0.T)
        L0 = _strict_cholesky(P0)
        if L0 is None:
            raise ValueError("the initial scale is too ill-conditioned: V_1^-1 is not numerically positive definite")
        gen = resolve_generator(self.seed, generator)
        counters = {k: 0 for k in _COUNTERS}
        if "hessian_rows" in how:
            counters["log_joint_calls"] += 1
            counters["log_joint_evals"] += how["hessian_rows"]
            counters["hessian_backward_passes"] += how["hessian_backward"]
        hessian, note = None, ""
        if self.method == "hessian":
            hessian = self.hessian
            if hessian == "auto":
                batch = target.sample_minibatch(gen) if is_minibatch_target(target) else None
                counters["log_joint_calls"] += 1
                counters["log_joint_evals"] += 1
                try:
                    _autograd_hessian(target, m0.unsqueeze(0), batch)
                    hessian, note = "autograd", "auto: the target supports double backward"
                except _NoDoubleBackward as exc:
                    hessian = "fd"
                    note = f"auto: finite differences because autograd refused second derivatives ({exc})"[:400]
        stats: dict[str, torch.Tensor] = {"a": torch.zeros(D, dtype=torch.float64), "z": m0.clone()}
        if self.method == "hessian":
            stats["P"] = P0
        else:
            R0 = torch.linalg.solve_triangular(L0.T, torch.eye(D, dtype=torch.float64), upper=True)  # L^-T
            stats.update(A=R0, B=-L0.clone())
        return SKState(m=m0, L=L0, stats=stats, sums=[self._empty_sums(D), self._empty_sums(D)], t=0,
                       num_steps=self.num_steps, w=self.w, method=self.method, hessian=hessian, hessian_note=note,
                       generator=gen, window=deque(maxlen=self.window), counters=counters, init_info=how)

    def _evaluate(self, target: Any, state: SKState, theta: torch.Tensor, batch: Any
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, int, int]:
        """lj, g, H (or None), valid mask, rows evaluated, extra backward passes."""
        S = theta.shape[0]
        if state.method == "gradient":
            lj, g = log_joint_and_grad(target, theta, batch)
            return lj, g, None, torch.isfinite(lj) & torch.isfinite(g).all(-1), S, 0
        if state.hessian == "autograd":
            try:
                lj, g, H, nb = _autograd_hessian(target, theta, batch)
                valid = torch.isfinite(lj) & torch.isfinite(g).all(-1) & torch.isfinite(H).flatten(1).all(-1)
                return lj, g, H, valid, S, nb * 1
            except _NoDoubleBackward as exc:
                if self.hessian != "auto":
                    raise ValueError(f"hessian='autograd' is not available for this target ({exc}); use "
                                     f"hessian='fd' or 'auto'") from None
                state.hessian = "fd"
                state.hessian_note = f"auto: switched to finite differences at step {state.t} ({exc})"[:400]
        D = theta.shape[1]
        lj, g, H, aux_ok = _fd_hessian(target, theta, batch, self.fd_step)
        valid = torch.isfinite(lj) & torch.isfinite(g).all(-1) & torch.isfinite(H).flatten(1).all(-1) & aux_ok
        return lj, g, H, valid, S * (2 * D + 1), 0

    def _estimate(self, target: Any, state: SKState) -> _Estimate:
        """Draw S points from q_t, evaluate, resample invalid ones; average the regression statistics.

        Draws are organised in *units*: single draws (``method="hessian"``) or antithetic pairs
        :math:`m \pm R\varepsilon` (``method="gradient"``; rows u and u + U of the batch). A unit with an invalid
        row is redrawn whole.
        """
        gen, D, S = state.generator, state.dim, self.num_samples
        pairs = state.method == "gradient"
        U = S // 2 if pairs else S
        batch = target.sample_minibatch(gen) if is_minibatch_target(target) else None
        L, m = state.L, state.m

        def draw(k: int) -> tuple[torch.Tensor, torch.Tensor]:
            eps = torch.randn((k, D), generator=gen, dtype=torch.float64)
            if pairs:
                eps = torch.cat([eps, -eps], 0)
            x = m + torch.linalg.solve_triangular(L.T, eps.T, upper=True).T      # m + L^-T eps
            return eps, x

        def unit_ok(v: torch.Tensor) -> torch.Tensor:
            return v[: v.shape[0] // 2] & v[v.shape[0] // 2:] if pairs else v

        def rows(units: torch.Tensor, k: int) -> torch.Tensor:
            return torch.cat([units, units + k]) if pairs else units

        eps, theta = draw(U)
        lj, g, H, valid, evals, back = self._evaluate(target, state, theta, batch)
        ok = unit_ok(valid)
        calls, resampled = 1, 0
        for _ in range(self.max_resample):
            bad = (~ok).nonzero().flatten()
            if bad.numel() == 0:
                break
            e_new, x_new = draw(bad.numel())
            lj_n, g_n, H_n, v_n, ev, bk = self._evaluate(target, state, x_new, batch)
            calls, evals, back = calls + 1, evals + ev, back + bk
            resampled += x_new.shape[0]
            r = rows(bad, U)
            eps[r], theta[r], lj[r], g[r] = e_new, x_new, lj_n, g_n
            if H is not None:
                H[r] = H_n
            ok[bad] = unit_ok(v_n)
        nu = int(ok.sum())
        nv = 2 * nu if pairs else nu
        est = _Estimate(nv, resampled, S - nv, calls, evals, back, math.nan, None)
        if nu == 0:
            return est
        keep = rows(ok.nonzero().flatten(), U)
        eps, theta, lj, g = eps[keep], theta[keep], lj[keep], g[keep]
        H = None if H is None else H[keep]
        # instantaneous bound: mean of log g(x) - log q_t(x), log q_t(x) = -|eps|^2/2 - D/2 log 2pi + sum log L_dd
        log_q = -0.5 * (eps * eps).sum(-1) - 0.5 * D * _LOG_2PI + float(torch.log(torch.diagonal(L)).sum())
        est.bound = float((lj - log_q).mean())
        parts = {"a": g.mean(0), "z": theta.mean(0)}
        if H is not None:
            parts["P"] = -H.mean(0)
        else:
            # antithetic pairs: half-differences (x+ - x-)/2 = R eps and (g+ - g-)/2 against the instrument eps
            e_u = eps[:nu]
            dx = 0.5 * (theta[:nu] - theta[nu:])
            dg = 0.5 * (g[:nu] - g[nu:])
            parts.update(A=dx.T @ e_u / nu, B=dg.T @ e_u / nu)
        est.parts = parts
        return est

    @staticmethod
    def _solve(method: str, st: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(m, L) with P = L L^T from (averaged) statistics, or None when P is not positive definite."""
        if method == "hessian":
            P = 0.5 * (st["P"] + st["P"].T)
        else:
            try:
                M = torch.linalg.solve(st["A"].T, st["B"].T).T              # B A^-1
            except RuntimeError:                                          # singular A
                return None
            if not bool(torch.isfinite(M).all()):
                return None
            P = -0.5 * (M + M.T)
        L = _strict_cholesky(P)
        if L is None:
            return None
        m = st["z"] + cholesky_solve(L, st["a"].unsqueeze(-1)).squeeze(-1)   # m = P^-1 a + z
        if not bool(torch.isfinite(m).all()):
            return None
        return m, L

    def step(self, target: Any, state: SKState) -> tuple[SKState, dict[str, Any]]:
        r"""One iteration of Algorithm 2 (or its gradient variant): advance ``state`` in place and return it.

        Returns
        -------
        state : SKState
            The same object, advanced (``t`` + 1).
        info : dict
            ``t``, ``bound`` (instantaneous bound at :math:`q_t`), ``bound_avg``, ``num_valid``, ``resampled``,
            ``dropped``, ``skipped``, ``pd`` (whether :math:`P_{t+1}` was positive definite).

        Raises
        ------
        NumericalFaultError
            ``max_failed_steps`` consecutive steps without a valid draw, or (``on_non_pd="raise"``) a
            non-positive-definite :math:`P_{t+1}`; ``err.state`` is the last good state.

        Examples
        --------
        >>> import torch, gpvi
        >>> target = gpvi.Target(lambda th: -0.5 * ((th - 3.0) ** 2).sum(-1), names=2)
        >>> engine = SKGaussian(num_steps=4)
        >>> state = engine.init(target, torch.zeros(2))
        >>> state, info = engine.step(target, state)
        >>> info["t"], info["pd"]
        (1, True)
        """
        t = state.t
        w = state.w
        est = self._estimate(target, state)
        cnt = state.counters
        first_resample = cnt["resampled_draws"] == 0 and est.resampled > 0
        cnt["resampled_draws"] += est.resampled
        cnt["dropped_draws"] += est.dropped
        cnt["log_joint_calls"] += est.calls
        cnt["log_joint_evals"] += est.evals
        cnt["hessian_backward_passes"] += est.backward
        info: dict[str, Any] = {"num_valid": est.num_valid, "resampled": est.resampled, "dropped": est.dropped,
                                "skipped": False, "pd": True}
        if first_resample:
            warnings.warn(f"SKGaussian: log joint, gradient or Hessian was NaN/inf for {est.resampled} draw(s) at "
                          f"step {t}; redrawn (counted in info['resampled_draws'])", NumericalWarning, stacklevel=2)
        if est.parts is None:
            state.consecutive_failures += 1
            cnt["skipped_steps"] += 1
            info["skipped"] = True
            if state.consecutive_failures == 1:
                warnings.warn(f"SKGaussian: step {t} skipped (no draw with a finite log joint and derivatives "
                              f"after {self.max_resample} resampling rounds)", NumericalWarning, stacklevel=2)
            state.t = t + 1
            self._record(state, math.nan, 0, True, info)
            if state.consecutive_failures >= self.max_failed_steps:
                raise NumericalFaultError(
                    f"SKGaussian: {state.consecutive_failures} consecutive steps failed (no valid draw, last at "
                    f"step {t}); err.state holds the last good state", state=state)
            return state, info
        state.consecutive_failures = 0
        # --- running statistics (Algorithm 2: a, P, z; gradient variant: a, z, e, A, B)
        new_stats = {k: (1.0 - w) * v + w * est.parts[k] for k, v in state.stats.items()}
        sol = self._solve(state.method, new_stats)
        pd = sol is not None
        info["pd"] = pd
        if not pd:
            cnt["non_pd_steps"] += 1
            if self.on_non_pd == "reject":
                new_stats = state.stats             # the draw is not absorbed into the running statistics
            if self.on_non_pd == "raise":
                raise NumericalFaultError(
                    f"SKGaussian: the running precision P is not positive definite after step {t + 1} (w = {w:.3g});"
                    f" use more steps (smaller w), a start closer to the posterior (init=), or on_non_pd='keep'. "
                    f"err.state is the state before this step", state=state)
            if cnt["non_pd_steps"] == 1:
                what = ("the step is rejected (its draw does not enter the running statistics)"
                        if self.on_non_pd == "reject" else "drawing from the last valid q until it is")
                warnings.warn(f"SKGaussian: running precision P would not be positive definite at step {t + 1}; {what} "
                              f"(counted in info['non_pd_steps']; paper section 4: more steps help)", NumericalWarning,
                              stacklevel=2)
        # --- commit
        state.stats = new_stats
        if pd:
            state.m, state.L = sol
        state.t = t + 1
        start, mid = self._window_bounds()
        if state.t > start:
            s = state.sums[0 if state.t <= mid else 1]
            for k, v in est.parts.items():
                s[k] = s[k] + v
            s["n"] += 1
        self._record(state, est.bound, est.num_valid, pd, info)
        return state, info

    def _record(self, state: SKState, bound: float, num_valid: int, pd: bool, info: dict[str, Any]) -> None:
        if math.isfinite(bound):
            state.window.append(bound)
        avg = state.bound_average()
        tr = state.trace
        tr["bound"].append(bound)
        tr["bound_avg"].append(avg)
        tr["num_valid"].append(float(num_valid))
        tr["pd"].append(1.0 if pd else 0.0)
        info.update(t=state.t, bound=bound, bound_avg=avg)

    # ------------------------------------------------------------------ output
    def _averaged(self, state: SKState, which: tuple[int, ...] = (0, 1)
                  ) -> tuple[tuple[torch.Tensor, torch.Tensor] | None, int]:
        n = sum(state.sums[i]["n"] for i in which)
        if n == 0:
            return None, 0
        keys = [k for k in state.sums[0] if k != "n"]
        st = {k: sum(state.sums[i][k] for i in which) / n for k in keys}
        return self._solve(state.method, st), n

    def estimate_bound(self, target: Any, mean: torch.Tensor, scale_tril: torch.Tensor, *,
                       num_samples: int | None = None, generator: torch.Generator | None = None,
                       seed: int | None = None) -> tuple[float, float, int]:
        r"""Monte Carlo estimate of the Gaussian bound :math:`\mathbb E_q[\log g(x) - \log q(x)]` and its se.

        Averages :math:`\log g(x_i) - \log q(x_i)` over draws :math:`x_i = m + C\varepsilon_i` from
        :math:`q = \mathcal N(m, CC^\top)`, with :math:`\log q(x_i) = -\tfrac12\lVert\varepsilon_i\rVert^2 -
        \tfrac D2\log 2\pi - \sum_d\log C_{dd}`. Same mean as :math:`\overline{\log g} + \mathcal H[q]` (the
        form DSVI reports) but a smaller variance when q is close to the posterior (zero when q is exact).
        Full-data log joint for minibatch targets; invalid draws are left out and counted.

        Returns
        -------
        (estimate, standard_error, num_invalid)

        Examples
        --------
        >>> import math, torch, gpvi
        >>> lognormal = lambda th: -0.5 * (th ** 2).sum(-1) - math.log(2 * math.pi)
        >>> est, se, bad = SKGaussian().estimate_bound(gpvi.Target(lognormal, names=2), torch.zeros(2),
        ...                                            torch.eye(2, dtype=torch.float64), num_samples=500)
        >>> abs(est) < 1e-12, se < 1e-12, bad           # q = target: log g - log q = log Z = 0 for every draw
        (True, True, 0)
        """
        n = self.num_elbo_samples if num_samples is None else check_positive_int(num_samples, "num_samples")
        if n == 0:
            raise ValueError("num_samples must be >= 1 for a bound estimate (num_elbo_samples is 0)")
        target = as_target(target)
        mean = as_float_tensor(mean, "mean", ndim=1)
        C = as_float_tensor(scale_tril, "scale_tril", ndim=2)
        D = mean.shape[0]
        if D != len(target.names) or C.shape != (D, D):
            raise ValueError(f"mean must be ({len(target.names)},) and scale_tril square of the same size; got "
                             f"{tuple(mean.shape)} and {tuple(C.shape)}")
        if not bool((torch.diagonal(C) > 0).all()):
            raise ValueError("scale_tril must have a strictly positive diagonal")
        gen = resolve_generator(seed if seed is not None else 0, generator)
        vals = []
        with torch.no_grad():
            for start in range(0, n, self.elbo_batch):
                k = min(self.elbo_batch, n - start)
                eps = torch.randn((k, D), generator=gen, dtype=torch.float64)
                vals.append(call_log_joint(target, mean + eps @ torch.tril(C).T, None).detach() + 0.5 * (eps * eps).sum(-1))
        v = torch.cat(vals)
        ok = torch.isfinite(v)
        bad = int((~ok).sum())
        v = v[ok]
        if v.numel() == 0:
            return math.nan, math.nan, bad
        log_q_const = -0.5 * D * _LOG_2PI - float(torch.log(torch.diagonal(C)).sum())   # log q = const - |eps|^2/2
        se = float(v.std() / math.sqrt(v.numel())) if v.numel() > 1 else math.nan
        return float(v.mean()) - log_q_const, se, bad

    def run(self, target: Any, init: Any = None, *, generator: torch.Generator | None = None,
            callback: Callable[[SKState, dict[str, Any]], None] | None = None,
            state: SKState | dict[str, Any] | None = None) -> GaussianPosterior:
        r"""Run the N steps and return :math:`q = \mathcal N(m, V)`, :math:`V = \bar P^{-1}`, :math:`m = V\bar a + \bar z`.

        Parameters
        ----------
        target : target
            Anything with ``log_joint(theta)`` (``(S, D) -> (S,)``, differentiable) and ``names``:
            :class:`gpvi.GPRegression`, :class:`gpvi.Target`, :class:`gpvi.models.logistic.BayesianLogisticRegression`,
            :class:`gpvi.models.minibatch.MinibatchTarget` (section 6.5), ...
        init : None, array-like (D,), PointPosterior or GaussianPosterior
            See :meth:`init`. Not allowed together with ``state``.
        generator : torch.Generator, optional
            Overrides ``seed``. Not allowed together with ``state``.
        callback : callable, optional
            ``callback(state, info)`` after every step; raising ``KeyboardInterrupt`` stops the run like Ctrl-C.
        state : SKState or its state_dict, optional
            Resume (e.g. from ``q.engine_state`` of an interrupted run, or a state_dict loaded from disk); the
            engine must have the same ``num_steps`` and ``method``. The result equals an uninterrupted run's.

        Returns
        -------
        GaussianPosterior
            ``mean``, ``scale_tril`` (Cholesky factor of :math:`V`), ``elbo``/``elbo_se`` (fresh Monte Carlo
            estimate at the returned q), ``trace`` (``bound``, ``bound_avg``, ``num_valid``, ``pd`` per step),
            ``info`` (counters, ``hessian``, ``init``, ``averaged`` and ``num_averaged``, ``drift_mean_sd`` and
            ``drift_log_sd`` of the window-split check, ``steps``, ``time_s``, ``interrupted``, ``settings``) and
            ``engine_state``. An interrupted run returns the average so far (or the current :math:`q_t` before
            the averaging window, ``info["averaged"] = False``).

        Raises
        ------
        NumericalFaultError
            The averaged :math:`\bar P` is not positive definite, ``max_failed_steps`` consecutive failed steps,
            or ``on_non_pd="raise"``. ``err.state`` is the last state and ``err.partial`` the posterior built from
            the current :math:`q_t` (always a valid Gaussian).

        Warns
        -----
        InterruptedRunWarning, NumericalWarning, ConvergenceWarning

        Examples
        --------
        >>> import gpvi
        >>> from gpvi.models.logistic import BayesianLogisticRegression
        >>> ds = gpvi.datasets.load_pima()
        >>> model = BayesianLogisticRegression(ds.X_train, ds.y_train)
        >>> q = SKGaussian(num_steps=400, progress_bar=False).run(model)
        >>> q.mean.shape, q.info["hessian"], q.info["num_averaged"]
        (torch.Size([8]), 'autograd', 200)
        """
        target = as_target(target)
        D = len(target.names)
        if state is not None:
            if init is not None or generator is not None:
                raise ValueError("state cannot be combined with init or generator (the state carries both)")
            if isinstance(state, dict):
                state = SKState.from_state_dict(state)
            elif not isinstance(state, SKState):
                raise TypeError(f"state must be an SKState or its state_dict; got {type(state).__name__}")
            if state.dim != D:
                raise ValueError(f"state has dimension {state.dim} but the target has D = {D}")
            if state.method != self.method:
                raise ValueError(f"state was made with method={state.method!r} but this engine has "
                                 f"method={self.method!r}")
            if state.num_steps != self.num_steps or state.w != self.w:
                raise ValueError(f"state was made with num_steps={state.num_steps} (w = {state.w:.6g}) but this engine "
                                 f"has num_steps={self.num_steps} (w = {self.w:.6g}); N sets the step size and the "
                                 f"averaging window, so a run cannot be extended")
            if state.window.maxlen != self.window:
                state.window = deque(state.window, maxlen=self.window)
        else:
            state = self.init(target, init, generator=generator)
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be callable; got {type(callback).__name__}")
        before = dict(state.counters)
        interrupted = False
        t_start = state.t
        t0 = time.perf_counter()
        bar = Progress(self.num_steps, enabled=self.progress_bar, desc=f"SK-{self.method}", initial=state.t)
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
        except KeyboardInterrupt:
            interrupted = True
            bar.close()
            warn_interrupted("SKGaussian", state.t, self.num_steps)
        except NumericalFaultError as err:
            bar.close()
            state.wall_time += time.perf_counter() - t0
            err.partial = self._posterior(target, state, interrupted=True, run_time=time.perf_counter() - t0,
                                          steps_this_run=state.t - t_start, current=True)
            raise
        finally:
            bar.close()
        run_time = time.perf_counter() - t0
        state.wall_time += run_time
        self._warn_counters(state, before)
        return self._posterior(target, state, interrupted=interrupted, run_time=run_time,
                               steps_this_run=state.t - t_start)

    def _warn_counters(self, state: SKState, before: dict[str, int]) -> None:
        keys = ("resampled_draws", "dropped_draws", "skipped_steps", "non_pd_steps")
        diff = {k: state.counters[k] - before.get(k, 0) for k in keys}
        if any(v > 0 for v in diff.values()):
            parts = ", ".join(f"{k}={v}" for k, v in diff.items() if v > 0)
            warnings.warn(f"SKGaussian survived numerical faults in this run: {parts} (see q.info)", NumericalWarning,
                          stacklevel=3)

    def _posterior(self, target: Any, state: SKState, *, interrupted: bool, run_time: float, steps_this_run: int,
                   current: bool = False) -> GaussianPosterior:
        averaged, n_avg = False, 0
        drift_mean, drift_sd = math.nan, math.nan
        if current:
            m, L = state.m, state.L
        else:
            sol, n_avg = self._averaged(state)
            if n_avg == 0:
                m, L = state.m, state.L              # interrupted before the averaging window
            elif sol is None:
                partial = self._posterior(target, state, interrupted=True, run_time=run_time,
                                          steps_this_run=steps_this_run, current=True)
                raise NumericalFaultError(
                    f"SKGaussian: the averaged precision P_bar over {n_avg} steps is not positive definite "
                    f"(N = {state.num_steps}, w = {state.w:.3g}, {state.counters['non_pd_steps']} non-PD steps); "
                    f"increase num_steps (smaller w, longer average) or start closer to the posterior (init=, e.g. "
                    f"an ML-II/MAP point or a DSVI posterior). err.state holds the final state and err.partial the "
                    f"current q_t", state=state, partial=partial)
            else:
                m, L = sol
                averaged = True
                halves = [self._averaged(state, (i,))[0] for i in (0, 1)]
                if state.sums[0]["n"] > 0 and state.sums[1]["n"] > 0 and not interrupted:
                    if halves[0] is None or halves[1] is None:
                        drift_mean = drift_sd = math.inf
                    else:
                        sd = torch.sqrt(torch.diagonal(torch.cholesky_inverse(L)))
                        sds = [torch.sqrt(torch.diagonal(torch.cholesky_inverse(h[1]))) for h in halves]
                        drift_mean = float(((halves[0][0] - halves[1][0]).abs() / sd).max())
                        drift_sd = float(torch.log(sds[0] / sds[1]).abs().max())
                    if not (drift_mean <= self.drift_tol and drift_sd <= self.drift_tol):
                        what = ("one half of the averaging window gives an indefinite precision"
                                if math.isinf(drift_mean) else
                                f"means differ by up to {drift_mean:.3g} sd, sds by a factor up to exp({drift_sd:.3g})")
                        warnings.warn(f"SKGaussian: the two halves of the averaging window disagree ({what}); q may "
                                      f"still be moving or unstable: do not trust it without more steps or a start "
                                      f"closer to the posterior", ConvergenceWarning, stacklevel=3)
        scale_tril = _scale_from_precision(L)
        elbo_method = "rolling window average of the instantaneous bound"
        elbo, se, invalid = state.bound_average(), math.nan, 0
        if not interrupted and self.num_elbo_samples > 0:
            g = torch.Generator(device=state.generator.device)
            g.set_state(state.generator.get_state())        # a copy: the state's stream is not advanced
            elbo, se, invalid = self.estimate_bound(target, m, scale_tril, generator=g)
            elbo_method = f"Monte Carlo, {self.num_elbo_samples} draws at the returned (m, V)"
            if invalid:
                warnings.warn(f"SKGaussian: {invalid} of {self.num_elbo_samples} draws for the final bound estimate "
                              f"had a non-finite log joint and were left out", NumericalWarning, stacklevel=3)
        info: dict[str, Any] = dict(state.counters)
        info.update(
            method=state.method, hessian=state.hessian, hessian_note=state.hessian_note, init=dict(state.init_info),
            averaged=averaged,
            num_averaged=n_avg, drift_mean_sd=drift_mean, drift_log_sd=drift_sd, steps=state.t,
            steps_this_run=steps_this_run, time_s=run_time, total_time_s=state.wall_time, step_size=state.w,
            interrupted=interrupted, elbo_method=elbo_method, elbo_invalid=invalid, settings=self.settings(),
        )
        trace = {k: trace_to_tensor(v) for k, v in state.trace.items()}
        return GaussianPosterior(m.clone(), scale_tril.clone(), list(target.names), target, elbo=elbo, elbo_se=se,
                                 trace=trace, info=info, engine_state=state)

    def __repr__(self) -> str:
        return (f"SKGaussian(num_steps={self.num_steps}, method={self.method!r}, hessian={self.hessian!r}, "
                f"num_samples={self.num_samples}, step_size={self.w:.4g})")


# ==========================================================================================================
# Algorithm 1: general exponential families (low-dimensional)
class Exponential:
    r"""Exponential family member :math:`q(x) = \lambda e^{-\lambda x}`, :math:`x > 0`.

    :math:`T(x) = x`, :math:`\eta = -\lambda` (valid for :math:`\eta < 0`), log normaliser
    :math:`U(\eta) = -\log(-\eta)`. Draws by inverse CDF. The paper's section 4.0.1 example.

    Examples
    --------
    >>> fam = Exponential()
    >>> eta = fam.natural(rate=2.0)
    >>> eta.tolist(), fam.params(eta), fam.is_valid(eta)
    ([-2.0], {'rate': 2.0}, True)
    """

    num_stats = 1
    stat_names = ("x",)

    def natural(self, rate: float) -> torch.Tensor:
        """:math:`\\eta` from the rate :math:`\\lambda > 0`."""
        return torch.tensor([-check_positive(rate, "rate")], dtype=torch.float64)

    def params(self, eta: torch.Tensor) -> dict[str, float]:
        return {"rate": -float(eta[0])}

    def is_valid(self, eta: torch.Tensor) -> bool:
        return bool(torch.isfinite(eta).all()) and float(eta[0]) < 0

    def stats(self, x: torch.Tensor) -> torch.Tensor:
        """:math:`T(x)`, ``(n,) -> (n, 1)``."""
        return x.unsqueeze(-1)

    def sample(self, eta: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        return -torch.log1p(-u) / (-eta[0])

    def log_normalizer(self, eta: torch.Tensor) -> float:
        return -math.log(-float(eta[0]))

    def second_moment(self, eta: torch.Tensor) -> torch.Tensor:
        r""":math:`\mathbb E_q[\tilde T^\top\tilde T]` for :math:`\tilde T = [1, x]` (paper eq. 16, in x)."""
        lam = -float(eta[0])
        return torch.tensor([[1.0, 1 / lam], [1 / lam, 2 / lam ** 2]], dtype=torch.float64)


class Gamma:
    r"""Gamma family :math:`q(x) \propto x^{\alpha-1}e^{-\beta x}` (shape :math:`\alpha`, rate :math:`\beta`).

    :math:`T(x) = (\log x, x)`, :math:`\eta = (\alpha - 1, -\beta)` (valid for :math:`\eta_1 > -1`,
    :math:`\eta_2 < 0`), :math:`U(\eta) = \log\Gamma(\eta_1 + 1) - (\eta_1 + 1)\log(-\eta_2)`. Draws by inverse CDF
    (``scipy.special.gammaincinv`` of generator uniforms; no global RNG).

    Examples
    --------
    >>> fam = Gamma()
    >>> eta = fam.natural(shape=3.0, rate=2.0)
    >>> eta.tolist(), fam.params(eta)
    ([2.0, -2.0], {'shape': 3.0, 'rate': 2.0})
    """

    num_stats = 2
    stat_names = ("log x", "x")

    def natural(self, shape: float, rate: float) -> torch.Tensor:
        """:math:`\\eta` from shape :math:`\\alpha > 0` and rate :math:`\\beta > 0`."""
        a = check_positive(shape, "shape")
        b = check_positive(rate, "rate")
        return torch.tensor([a - 1.0, -b], dtype=torch.float64)

    def params(self, eta: torch.Tensor) -> dict[str, float]:
        return {"shape": float(eta[0]) + 1.0, "rate": -float(eta[1])}

    def is_valid(self, eta: torch.Tensor) -> bool:
        return bool(torch.isfinite(eta).all()) and float(eta[0]) > -1.0 and float(eta[1]) < 0.0

    def stats(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.log(x), x], -1)

    def sample(self, eta: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
        p = self.params(eta)
        u = torch.rand(n, generator=generator, dtype=torch.float64).clamp_(2.0 ** -60, 1.0 - 2.0 ** -53)
        return torch.from_numpy(scipy.special.gammaincinv(p["shape"], u.numpy())) / p["rate"]

    def log_normalizer(self, eta: torch.Tensor) -> float:
        a, b = float(eta[0]) + 1.0, -float(eta[1])
        return math.lgamma(a) - a * math.log(b)

    def second_moment(self, eta: torch.Tensor) -> torch.Tensor:
        r""":math:`\mathbb E_q[\tilde T^\top\tilde T]` for :math:`\tilde T = [1, \log x, x]` (digamma/trigamma)."""
        p = self.params(eta)
        a, b = p["shape"], p["rate"]
        El = float(scipy.special.digamma(a)) - math.log(b)
        Ex = a / b
        Ell = float(scipy.special.polygamma(1, a)) + El ** 2
        Exl = a / b * (float(scipy.special.digamma(a + 1.0)) - math.log(b))
        Exx = a * (a + 1.0) / b ** 2
        return torch.tensor([[1.0, El, Ex], [El, Ell, Exl], [Ex, Exl, Exx]], dtype=torch.float64)


class Normal:
    r"""Univariate normal family :math:`q(x) = \mathcal N(\mu, \sigma^2)`.

    :math:`T(x) = (x, x^2)`, :math:`\eta = (\mu/\sigma^2, -1/(2\sigma^2))` (valid for :math:`\eta_2 < 0`),
    :math:`U(\eta) = \tfrac12\log(\pi / -\eta_2) - \eta_1^2/(4\eta_2)`.

    Examples
    --------
    >>> fam = Normal()
    >>> fam.params(fam.natural(mean=1.0, var=4.0))
    {'mean': 1.0, 'var': 4.0}
    """

    num_stats = 2
    stat_names = ("x", "x^2")

    def natural(self, mean: float, var: float) -> torch.Tensor:
        """:math:`\\eta` from the mean and the variance :math:`\\sigma^2 > 0`."""
        v = check_positive(var, "var")
        if not isinstance(mean, numbers.Real) or not math.isfinite(float(mean)):
            raise ValueError(f"mean must be a finite number; got {mean!r}")
        return torch.tensor([float(mean) / v, -0.5 / v], dtype=torch.float64)

    def params(self, eta: torch.Tensor) -> dict[str, float]:
        var = -0.5 / float(eta[1])
        return {"mean": float(eta[0]) * var, "var": var}

    def is_valid(self, eta: torch.Tensor) -> bool:
        return bool(torch.isfinite(eta).all()) and float(eta[1]) < 0.0

    def stats(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([x, x * x], -1)

    def sample(self, eta: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
        p = self.params(eta)
        return p["mean"] + math.sqrt(p["var"]) * torch.randn(n, generator=generator, dtype=torch.float64)

    def log_normalizer(self, eta: torch.Tensor) -> float:
        e1, e2 = float(eta[0]), float(eta[1])
        return 0.5 * math.log(math.pi / -e2) - e1 * e1 / (4.0 * e2)

    def second_moment(self, eta: torch.Tensor) -> torch.Tensor:
        r""":math:`\mathbb E_q[\tilde T^\top\tilde T]` for :math:`\tilde T = [1, x, x^2]` (moments up to 4)."""
        p = self.params(eta)
        mu, s2 = p["mean"], p["var"]
        m1, m2 = mu, mu * mu + s2
        m3 = mu ** 3 + 3 * mu * s2
        m4 = mu ** 4 + 6 * mu * mu * s2 + 3 * s2 * s2
        return torch.tensor([[1.0, m1, m2], [m1, m2, m3], [m2, m3, m4]], dtype=torch.float64)


@dataclass
class SKExpFamilyResult:
    r"""Result of :class:`SKExpFamily` (Algorithm 1) with the section-5 quantities.

    Attributes
    ----------
    eta : torch.Tensor of shape (k,)
        :math:`\hat\eta = (\bar C^{-1}\bar g)_{1:k}`, natural parameters of q.
    eta0 : float
        The intercept :math:`\hat\eta_0` of the regression.
    family : object
        The exponential family (``family.params(eta)`` gives the usual parameters).
    log_bound : float
        :math:`\hat\eta_0 + U(\hat\eta)`, the variational lower bound on :math:`\log p(y)` at convergence
        (section 5).
    log_evidence : float
        :math:`\hat\eta_0 + U(\hat\eta) + \tfrac12 s^2` (eq. 19), :math:`s^2` the mean squared residual of the
        regression over the averaging window.
    kl : float
        :math:`\tfrac12 s^2`, the approximate KL divergence of q from the posterior.
    r_squared : float
        :math:`R^2 = 1 - s^2/\mathrm{Var}[\log p]` over the averaging window (1 for an exact fit).
    trace : dict
        ``eta`` of shape (N, k): the natural parameters used for drawing at each step; ``valid`` (N,): whether
        the regression's :math:`\tilde\eta_{t+1}` was a proper distribution.
    info : dict
        ``steps``, ``step_size``, ``num_averaged``, ``improper_steps``, ``log_p_evals``, ``time_s``.
    """

    eta: torch.Tensor
    eta0: float
    family: Any
    log_bound: float
    log_evidence: float
    kl: float
    r_squared: float
    trace: dict[str, torch.Tensor]
    info: dict[str, Any]

    @property
    def params(self) -> dict[str, float]:
        """The usual parameters of q (e.g. ``{"shape": ..., "rate": ...}`` for :class:`Gamma`)."""
        return self.family.params(self.eta)


class SKExpFamily:
    r"""Algorithm 1 of Salimans & Knowles (2013): stochastic linear regression for an exponential-family q.

    For :math:`\tilde T(x) = [1, T(x)]` and a single draw :math:`x_t^* \sim q_{\eta_t}` per step,

    .. math::

        \hat g_t = \tilde T(x_t^*)^\top\log p(x_t^*, y),\quad \hat C_t = \tilde T(x_t^*)^\top\tilde T(x_t^*),\quad
        g_{t+1} = (1-w)g_t + w\hat g_t,\quad C_{t+1} = (1-w)C_t + w\hat C_t,\quad
        \tilde\eta_{t+1} = C_{t+1}^{-1}g_{t+1}

    (eq. 11), :math:`w = 1/\sqrt N`, and the output :math:`\hat\eta = \bar C^{-1}\bar g` from the sums over the
    second half (:math:`t > N/2`). When :math:`\log p(x, y) = \tilde T(x)\xi` (the posterior is in the family)
    every regression is exact, so :math:`\hat\eta = \xi` as soon as the averaging window holds :math:`k + 1`
    distinct draws: after :math:`N = 2(k+1)` steps (eq. 13).

    Parameters
    ----------
    family : Exponential, Gamma, Normal or compatible object
        Provides ``num_stats`` (k), ``stats(x) -> (n, k)``, ``sample(eta, n, generator)``, ``is_valid(eta)``,
        ``log_normalizer(eta)``, ``params(eta)`` and optionally ``second_moment(eta)``.
    num_steps : int
        N (>= 2).
    num_samples : int
        Draws per step (the paper uses 1); :math:`\hat g`, :math:`\hat C` are averaged over them.
    step_size : float, optional
        :math:`w` in (0, 1]; default :math:`1/\sqrt N`.
    init_C : {"moments", "identity"} or array-like of shape (k+1, k+1)
        :math:`C_1`: ``"moments"`` = :math:`\mathbb E_{q_1}[\tilde T^\top\tilde T]` (the paper's default; analytic
        via ``family.second_moment``, else a Monte Carlo estimate with 1000 draws), ``"identity"`` = :math:`I`
        (the paper's section 4.0.1 example), or a given symmetric positive-definite matrix.
    init_intercept : float
        :math:`\eta_{0,1}`; :math:`g_1 = C_1\tilde\eta_1`. Only the first half of the run depends on it.
    seed : int, optional

    Notes
    -----
    An update :math:`\tilde\eta_{t+1}` that is not a proper distribution (e.g. a negative rate; paper section 4)
    is kept in the statistics but not used for drawing: the next draws come from the last proper
    :math:`q_t` (counted in ``info["improper_steps"]``). The final :math:`\hat\eta` must be proper, else
    :class:`~gpvi.exceptions.NumericalFaultError` (more steps are the paper's remedy).

    Examples
    --------
    Exponential posterior, approximated in its own family: exact after :math:`2(k+1) = 4` steps (section 4.0.1).

    >>> import math, torch
    >>> from gpvi.inference.sk.engine import SKExpFamily, Exponential
    >>> fam = Exponential()
    >>> res = SKExpFamily(fam, num_steps=4, init_C="identity").run(lambda x: math.log(2.0) - 2.0 * x,
    ...                                                               fam.natural(rate=1.0))
    >>> abs(res.params["rate"] - 2.0) < 1e-12, abs(res.log_evidence) < 1e-12, res.r_squared
    (True, True, 1.0)
    """

    def __init__(self, family: Any, num_steps: int = 1000, *, num_samples: int = 1, step_size: float | None = None,
                 init_C: Any = "moments", init_intercept: float = 0.0, seed: int | None = 0) -> None:
        for attr in ("num_stats", "stats", "sample", "is_valid", "log_normalizer", "params"):
            if not hasattr(family, attr):
                raise TypeError(f"family must provide {attr} (like gpvi.inference.sk.engine.Gamma); got {type(family).__name__}")
        self.family = family
        self.num_steps = check_positive_int(num_steps, "num_steps", minimum=2)
        self.num_samples = check_positive_int(num_samples, "num_samples")
        self.step_size = None if step_size is None else check_fraction(step_size, "step_size")
        k1 = int(family.num_stats) + 1
        if isinstance(init_C, str):
            check_choice(init_C, "init_C", ("moments", "identity"))
        else:
            C = as_float_tensor(init_C, "init_C", ndim=2)
            if C.shape != (k1, k1) or not torch.allclose(C, C.T) or _strict_cholesky(C) is None:
                raise ValueError(f"init_C must be a symmetric positive-definite ({k1}, {k1}) matrix")
            init_C = C
        self.init_C = init_C
        if not isinstance(init_intercept, numbers.Real) or isinstance(init_intercept, bool) \
                or not math.isfinite(float(init_intercept)):
            raise ValueError(f"init_intercept must be a finite number; got {init_intercept!r}")
        self.init_intercept = float(init_intercept)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
            raise ValueError(f"seed must be a non-negative int or None; got {seed!r}")
        self.seed = seed

    def _log_p(self, log_p: Any, x: torch.Tensor) -> torch.Tensor:
        if callable(getattr(log_p, "log_joint", None)):
            out = log_p.log_joint(x.reshape(x.shape[0], -1))
        else:
            out = log_p(x)
        out = torch.as_tensor(out, dtype=torch.float64)
        if out.shape != x.shape[:1]:
            raise ValueError(f"log_p returned shape {tuple(out.shape)} for {x.shape[0]} draws; expected "
                             f"({x.shape[0]},)")
        return out

    def run(self, log_p: Any, init: Any, *, generator: torch.Generator | None = None) -> SKExpFamilyResult:
        r"""Run Algorithm 1.

        Parameters
        ----------
        log_p : callable or target
            Unnormalised log posterior :math:`\log p(x, y)` of a batch of draws, ``(n,) -> (n,)`` (or a target
            whose ``log_joint`` takes ``(n, 1)``).
        init : array-like of shape (k,)
            :math:`\eta_1`, a proper member of the family (e.g. ``family.natural(...)`` of the prior).
        generator : torch.Generator, optional
            Overrides ``seed``.

        Returns
        -------
        SKExpFamilyResult

        Raises
        ------
        ValueError
            ``init`` is not a proper member of the family.
        NumericalFaultError
            The final :math:`\hat\eta` is not a proper distribution, or a log density is NaN/inf.
        """
        fam = self.family
        k = int(fam.num_stats)
        eta1 = as_float_tensor(init, "init", ndim=1)
        if eta1.shape != (k,):
            raise ValueError(f"init must have length k = {k} (natural parameters of the family); got "
                             f"{tuple(eta1.shape)}")
        if not fam.is_valid(eta1):
            raise ValueError(f"init {eta1.tolist()} is not a proper member of {type(fam).__name__}")
        gen = resolve_generator(self.seed, generator)
        N = self.num_steps
        w = self.step_size if self.step_size is not None else 1.0 / math.sqrt(N)
        t0 = time.perf_counter()
        n_evals = 0
        if isinstance(self.init_C, torch.Tensor):
            C = self.init_C.clone()
        elif self.init_C == "identity":
            C = torch.eye(k + 1, dtype=torch.float64)
        elif callable(getattr(fam, "second_moment", None)):
            C = fam.second_moment(eta1).to(torch.float64)
        else:
            Tt = self._tilde(fam.sample(eta1, 1000, gen))
            C = Tt.T @ Tt / Tt.shape[0]
        eta_t = torch.cat([torch.tensor([self.init_intercept], dtype=torch.float64), eta1])
        g = C @ eta_t
        C_bar = torch.zeros_like(C)
        g_bar = torch.zeros_like(g)
        window: list[tuple[torch.Tensor, torch.Tensor]] = []
        eta_draw = eta1.clone()
        improper = 0
        tr_eta, tr_valid = [], []
        for t in range(1, N + 1):
            x = fam.sample(eta_draw, self.num_samples, gen)
            y = self._log_p(log_p, x)
            n_evals += x.shape[0]
            if not bool(torch.isfinite(y).all()):
                raise NumericalFaultError(f"SKExpFamily: log_p returned a non-finite value at step {t} (draws "
                                          f"{x.tolist()})", state={"t": t, "eta": eta_draw})
            Tt = self._tilde(x)                                           # (S, k+1)
            g_hat = Tt.T @ y / Tt.shape[0]
            C_hat = Tt.T @ Tt / Tt.shape[0]
            g = (1.0 - w) * g + w * g_hat
            C = (1.0 - w) * C + w * C_hat
            tr_eta.append(eta_draw.clone())
            try:
                eta_new = torch.linalg.solve(C, g)
                ok = bool(torch.isfinite(eta_new).all()) and fam.is_valid(eta_new[1:])
            except RuntimeError:
                ok = False
            tr_valid.append(ok)
            if ok:
                eta_draw = eta_new[1:].clone()
            else:
                improper += 1
            if t > N // 2:
                g_bar = g_bar + g_hat
                C_bar = C_bar + C_hat
                window.append((Tt, y))
        try:
            eta_hat = torch.linalg.solve(C_bar, g_bar)
        except RuntimeError:
            eta_hat = torch.full_like(g_bar, math.nan)
        info = {"steps": N, "step_size": w, "num_averaged": N - N // 2, "improper_steps": improper,
                "log_p_evals": n_evals, "time_s": time.perf_counter() - t0}
        if not bool(torch.isfinite(eta_hat).all()) or not fam.is_valid(eta_hat[1:]):
            raise NumericalFaultError(
                f"SKExpFamily: the averaged regression gives eta = {eta_hat[1:].tolist()}, not a proper "
                f"{type(fam).__name__}; increase num_steps (paper section 4)", state={"eta": eta_hat, "info": info})
        Tw = torch.cat([a for a, _ in window])
        yw = torch.cat([b for _, b in window])
        resid = yw - Tw @ eta_hat
        s2 = float((resid * resid).mean())
        var_y = float(yw.var(unbiased=False))
        r2 = 1.0 - s2 / var_y if var_y > 0 else 1.0
        eta = eta_hat[1:].clone()
        eta0 = float(eta_hat[0])
        bound = eta0 + float(fam.log_normalizer(eta))
        trace = {"eta": torch.stack(tr_eta), "valid": torch.tensor(tr_valid)}
        return SKExpFamilyResult(eta=eta, eta0=eta0, family=fam, log_bound=bound, log_evidence=bound + 0.5 * s2,
                                 kl=0.5 * s2, r_squared=r2, trace=trace, info=info)

    def _tilde(self, x: torch.Tensor) -> torch.Tensor:
        T = self.family.stats(x).to(torch.float64).reshape(x.shape[0], -1)
        return torch.cat([torch.ones(T.shape[0], 1, dtype=torch.float64), T], 1)

    def __repr__(self) -> str:
        return f"SKExpFamily({type(self.family).__name__}(), num_steps={self.num_steps})"
