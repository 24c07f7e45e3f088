r"""Salimans & Knowles (2013), Algorithm 2: a Gaussian fitted by stochastic linear regression (:class:`SKGaussian`).

*Fixed-form variational posterior approximation through stochastic linear regression*, Bayesian Analysis 8(4).
For an exponential-family :math:`q_\eta` with statistics :math:`\tilde T(x) = [1, T(x)]` the KL-optimal natural
parameters solve a linear regression of :math:`\log p` on the statistics (paper eq. 9); the paper solves it by
stochastic approximation with running averages of step :math:`w = 1/\sqrt N` and a final regression from plain
averages over the second half of the :math:`N` steps (Algorithm 1: :mod:`gpvi.inference.salimans_knowles.expfamily`).

For a Gaussian :math:`q = \mathcal N(m, V)` fitted to any target (``log_joint`` + autograd gradient) there are two
sources of regression statistics (:mod:`gpvi.inference.salimans_knowles.estimates` derives both):

- ``method="hessian"``: **Algorithm 2** (sections 6.3-6.4, Appendix B). Running averages of the gradient
  :math:`a`, of the negative Hessian :math:`P` (a precision) and of the draws :math:`z`,

  .. math::

      a_{t+1} = (1-w)a_t + w g_t,\quad P_{t+1} = (1-w)P_t - wH_t,\quad z_{t+1} = (1-w)z_t + w x_t^*,\quad
      V_{t+1} = P_{t+1}^{-1},\quad m_{t+1} = V_{t+1}a_{t+1} + z_{t+1},

  and the output :math:`V = \bar P^{-1}`, :math:`m = V\bar a + \bar z` from averages over the second half.
  Hessians :math:`H_t` come from autograd where the target supports double backward, else from batched central
  finite differences of the gradient (:func:`gpvi.inference.derivatives.value_grad_hessian`).
- ``method="gradient"``: the **Hessian-free** variant of section 6.2 (gradients only, eq. 27) in the transformed
  parametrisation of section 6.4, eq. (47)-(49).

Data subsampling (section 6.5, eq. 50) comes for free: a target with the minibatch protocol of
:mod:`gpvi.models.minibatch` gets a fresh minibatch at every step. The run loop is the shared driver
(:func:`gpvi.inference.driver.run`); the result is the same :class:`~gpvi.posteriors.gaussian.GaussianPosterior` as
DSVI returns.

Names in code follow the paper: ``w`` = :math:`w`; ``num_steps`` = :math:`N`; ``a``, ``P``, ``z`` (Algorithm 2);
``m`` = :math:`m`; ``theta`` = the draws :math:`x_t^*`. Because the paper's :math:`z` is a running mean of draws,
the standard-normal noise behind a draw is called ``eps``: :math:`x^* = m + L^{-\top}\varepsilon` with
:math:`P = LL^\top`.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from ...exceptions import NumericalFaultError, NumericalWarning
from ...models.target import as_target, is_minibatch_target
from ...numerics.budget import MemoryBudget
from ...posteriors.gaussian import GaussianPosterior
from ...rng import check_seed, resolve_generator
from ...validation import check_bool, check_choice, check_memory, check_nonnegative_int, check_positive_int
from .. import driver
from ..contract import NeverStop, RunReport, bound_draws, count_draws, record_bound, resume_copy, skip_step
from ..init import Start, check_start, init_to_default, start_point
from .estimates import draw_statistics, estimate_bound, solve
from .options import HessianSource, SKFaultPolicy, SKSchedule
from .result import build_posterior
from .start import (check_gaussian_warm_start, check_init_scale, initial_precision, initial_scale,
                    initial_statistics, probe_hessian)
from .state import COUNTERS, SKState

__all__ = ["SKGaussian"]


class SKGaussian:
    r"""Gaussian variational approximation by stochastic linear regression (Salimans & Knowles 2013, Alg. 2).

    Parameters
    ----------
    num_steps : int
        N, the total number of iterations (default 500). It fixes the step size :math:`w = 1/\sqrt N` and the
        averaging window (the last ``schedule.average_fraction`` of the steps), so it is part of the algorithm,
        not a budget to extend (``benchmarks/results/sk_vs_dsvi.md`` measures the N each target needs); the
        window-split check warns when N was too small.
    method : {"hessian", "gradient"}
        Regression statistics: ``"hessian"`` is Algorithm 2 (gradient and Hessian of log g at each draw);
        ``"gradient"`` the Hessian-free variant of section 6.2 (gradients only; see
        :mod:`gpvi.inference.salimans_knowles.estimates`). Prefer ``"gradient"`` when Hessians need finite differences (e.g.
        :class:`gpvi.GPRegression`: 2D + 1 log-joint rows per draw against 2 per antithetic pair); ``"hessian"``
        needs the fewest log-joint evaluations when autograd Hessians are available. ``"gradient"`` needs at
        least D antithetic pairs in the averaging window (several times more in practice).
    hessian : {"auto", "autograd", "fd"} or HessianSource, optional
        Source of Hessians for ``method="hessian"`` (default ``HessianSource("auto")``; rejected for
        ``method="gradient"``, which needs none except for ``init_scale="laplace"``, then by ``"auto"``).
        ``"auto"`` probes the target once at the initial mean: autograd if it supports double backward, else
        central finite differences (resolved source and reason in ``info["hessian"]``, ``info["hessian_note"]``).
        ``HessianSource(kind, fd_step=...)`` also sets the relative finite-difference step.
    num_draws : int, optional
        S, draws per step; the per-step estimates are averages over the S draws. Default 1 for
        ``method="hessian"`` (the paper's single draw) and 2 (one antithetic pair) for ``method="gradient"``,
        which needs an even S.
    draws : {"random", "sobol"}
        Where the standard-normal noise :math:`\varepsilon` of the draws comes from: ``"random"`` (default,
        the paper's pseudo-random draws from the run's generator) or ``"sobol"``: consecutive points of one
        scrambled Sobol' sequence per run (scramble seed drawn from the generator) through the normal quantile
        (randomised quasi-Monte Carlo). The averaged statistics of the window are then a quasi-Monte Carlo
        average over the slowly moving :math:`q_t`, with a smaller error at the same N
        (``benchmarks/results/sk_length.md``). Minibatches still come from the generator.
    schedule : SKSchedule, optional
        The step size :math:`w` (default :math:`1/\sqrt N`), the averaged fraction of the final steps (0.5: the
        paper's second half), the window-split drift check (``drift_tol``) and the draws per step before the window
        (``burn_in_draws``): see :class:`SKSchedule`.
    init_scale : "auto", float, (D,) or (D, D) array-like, or "laplace"
        Initial scale :math:`V_1 = CC^\top` unless the start is a Gaussian posterior (a warm start keeps its
        scale): ``C = init_scale * I``, a diagonal, a lower-triangular matrix, or ``"laplace"``:
        :math:`V_1 = (-\nabla^2\log g(m_1))^{-1}`, matching the curvature of log g at the initial mean (the
        paper's advice for difficult cases, section 4; best with ``init`` at the mode), by the engine's Hessian
        source (counted in ``info``), with the diagonal :math:`1/\sqrt{-H_{dd}}` (0.1 where :math:`-H_{dd} \le
        0`) where :math:`-H` is not positive definite. ``"auto"`` (default): the start's scale if it has one
        (``init="laplace"``), else 0.1 I (q starts narrow). ``info["init"]["scale"]`` records which.
    faults : SKFaultPolicy or FaultPolicy, optional
        The shared :class:`~gpvi.inference.contract.FaultPolicy` (a plain one means ``on_non_pd="reject"``):
        ``max_consecutive`` skipped steps (no valid draw) end the run with
        :class:`~gpvi.exceptions.NumericalFaultError`; ``max_resample`` rounds of redrawing invalid draws per
        step; ``on_non_pd`` ("reject", "keep" or "raise"): what an update that would make the running precision
        :math:`P_{t+1}` not positive definite does (see :class:`SKFaultPolicy`). Such a step is counted in
        ``info["non_pd_steps"]`` with one :class:`~gpvi.exceptions.NumericalWarning`; the averaged statistics
        of the output always use every draw of the window, and an averaged :math:`\bar P` that is not positive
        definite raises :class:`~gpvi.exceptions.NumericalFaultError` (advice: more steps, i.e. a smaller
        :math:`w`, or a start closer to the posterior). Never a NaN.
    window : int
        Length of the rolling average of the instantaneous bound in the trace.
    num_elbo_draws : int or "window"
        Draws for the final Monte Carlo bound estimate ``elbo`` / ``elbo_se`` (0: report the rolling average),
        evaluated in chunks that respect the run's memory budget; ``"window"``: the window's draws reweighted to
        the returned q, no new ones (:func:`~.estimates.window_bound`; no ``q.bound_draws``).
    seed : int, optional
        Seed of the run's generator (default 0); ``run(..., generator=)`` overrides it.
    progress_bar : bool

    Notes
    -----
    *Cost per step*: the log joint (S rows; ``hessian="fd"``: S(2D+1) rows in one call; ``"autograd"``: D extra
    backward passes) plus :math:`O(D^3)` for the Cholesky factor of :math:`P_{t+1}`. Memory: a few
    :math:`D\times D` matrices — the "stored matrix" that makes the method costly for large D.

    *Subsampling* (section 6.5): the statistics are linear in log g and its derivatives, so an unbiased
    minibatch estimate (eq. 50; :class:`gpvi.models.minibatch.MinibatchTarget`) keeps them unbiased; a fresh batch
    is drawn from the run's generator at every step and shared by all the rows of that step.

    *Departures from the paper*: S draws per step may be averaged; a step that would make :math:`P_{t+1}`
    indefinite is rejected by default (the paper only advises more iterations; ``faults.on_non_pd``); draws with
    a non-finite log joint are redrawn/dropped as in DSVI; the window-split drift check is gpvi's.

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.inference.salimans_knowles import SKGaussian
    >>> Lam = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=torch.float64)    # target precision
    >>> mu = torch.tensor([1.0, -1.0], dtype=torch.float64)
    >>> target = gpvi.Target(lambda th: -0.5 * (((th - mu) @ Lam) * (th - mu)).sum(-1), names=["a", "b"])
    >>> q = SKGaussian(num_steps=20, progress_bar=False).run(target)
    >>> bool((q.mean - mu).abs().max() < 1e-10), bool((q.covariance - torch.linalg.inv(Lam)).abs().max() < 1e-10)
    (True, True)
    """

    name = "SKGaussian"

    def __init__(self, num_steps: int = 500, *, method: str = "hessian", hessian: str | HessianSource | None = None,
                 num_draws: int | None = None, draws: str = "random", schedule: SKSchedule | None = None,
                 init_scale: Any = "auto",
                 faults: SKFaultPolicy | None = None, window: int = 200, num_elbo_draws: int = 1000,
                 seed: int | None = 0, progress_bar: bool = True) -> None:
        self.num_steps = check_positive_int(num_steps, "num_steps")
        self.method = check_choice(method, "method", ("hessian", "gradient"))
        if hessian is not None and self.method == "gradient":
            HessianSource.coerce(hessian)
            raise ValueError("hessian is only used with method='hessian' (method='gradient' needs no Hessian)")
        self.hessian = HessianSource() if hessian is None else HessianSource.coerce(hessian)
        if num_draws is None:
            num_draws = 1 if self.method == "hessian" else 2
        self.num_draws = check_positive_int(num_draws, "num_draws")
        if self.method == "gradient" and self.num_draws % 2:
            raise ValueError(f"num_draws must be even for method='gradient' (draws come in antithetic pairs "
                             f"m +- R eps); got {self.num_draws}")
        self.draws = check_choice(draws, "draws", ("random", "sobol"))
        if schedule is not None and not isinstance(schedule, SKSchedule):
            raise TypeError(f"schedule must be a gpvi.inference.salimans_knowles.SKSchedule; got {type(schedule).__name__}")
        self.schedule = SKSchedule() if schedule is None else schedule
        if self.method == "gradient" and (self.schedule.burn_in_draws or 0) % 2:
            raise ValueError(f"schedule.burn_in_draws must be even for method='gradient'; got {self.schedule}")
        self.init_scale = check_init_scale(init_scale)
        self.faults = SKFaultPolicy.coerce(faults)
        self.window = check_positive_int(window, "window")
        self.num_elbo_draws = (num_elbo_draws if isinstance(num_elbo_draws, str) and num_elbo_draws == "window" else
                               check_nonnegative_int(num_elbo_draws, "num_elbo_draws"))
        self.seed = check_seed(seed)
        self.progress_bar = check_bool(progress_bar, "progress_bar")

    # ------------------------------------------------------------------ settings
    @property
    def w(self) -> float:
        """The step size :math:`w` (``schedule.step_size`` or :math:`1/\\sqrt N`)."""
        return self.schedule.w(self.num_steps)

    def settings(self) -> dict[str, Any]:
        """The constructor settings as a plain dict (recorded in ``info["settings"]``)."""
        s = self.init_scale
        return {"num_steps": self.num_steps, "method": self.method,
                "hessian": self.hessian.kind if self.method == "hessian" else None, "fd_step": self.hessian.fd_step,
                "num_draws": self.num_draws, "draws": self.draws, "step_size": self.w,
                "average_fraction": self.schedule.average_fraction, "drift_tol": self.schedule.drift_tol,
                "burn_in_draws": self.schedule.burn_in_draws,
                "init_scale": s if isinstance(s, (str, numbers.Real)) else "array",
                "on_non_pd": self.faults.on_non_pd, "max_resample": self.faults.max_resample,
                "max_consecutive": self.faults.max_consecutive, "num_elbo_draws": self.num_elbo_draws,
                "seed": self.seed}

    # ------------------------------------------------------------------ the engine contract
    def default_init(self, target: Any) -> init_to_default:
        """The start when ``run`` gets no ``init``: ``target.initial_theta()`` when the target has it, else zeros
        (:class:`~gpvi.inference.init.init_to_default`)."""
        return init_to_default()

    def init(self, target: Any, start: Any = None, generator: torch.Generator | None = None) -> SKState:
        r"""Initial state: :math:`m_1`, :math:`P_1 = V_1^{-1}`, :math:`a_1 = 0`, :math:`z_1 = m_1` (Algorithm 2).

        Parameters
        ----------
        target : target
            Anything with ``log_joint`` (``(S, D) -> (S,)``) and ``names``.
        start : Start or anything ``run(init=...)`` accepts, optional
            A :class:`~gpvi.inference.init.Start` (what the driver passes), or ``None`` (:meth:`default_init`), a
            point ``(D,)``, a PointPosterior, a GaussianPosterior (also sets :math:`V_1`: a warm start, e.g.
            from DSVI or a Laplace approximation) or an init strategy.
        generator : torch.Generator, optional
            Used (and advanced) instead of a fresh generator seeded with ``seed``.

        Returns
        -------
        SKState

        Raises
        ------
        ValueError
            ``start`` of the wrong length, or where the log joint or its gradient is NaN/inf (checked once on the
            full data, :func:`~gpvi.inference.init.check_start`; counted in ``log_joint_calls``).

        Examples
        --------
        >>> import torch, gpvi
        >>> target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=2)
        >>> state = SKGaussian(init_scale=0.5).init(target, torch.ones(2))
        >>> state.m.tolist(), torch.diagonal(state.stats["P"]).tolist(), state.hessian
        ([1.0, 1.0], [4.0, 4.0], 'autograd')
        """
        target = as_target(target)
        if not isinstance(start, Start):
            check_gaussian_warm_start(start)
        start = start_point(target, start, self.default_init(target), seed=self.seed)
        D = len(target.names)
        check_memory(D, copies=10, what="the Salimans-Knowles engine's D x D statistics")
        m0 = start.theta.detach().to(torch.float64).clone()
        check_start(target, m0)                             # full data: no minibatch drawn, the stream is untouched
        counters = {k: 0 for k in COUNTERS}
        counters["log_joint_calls"] += 1
        counters["log_joint_evals"] += 1
        C0, how = initial_scale(target, start, self.init_scale, self.hessian)
        P0, L0 = initial_precision(C0)
        gen = resolve_generator(self.seed, generator)
        qmc_seed = (int(torch.randint(0, 2 ** 31 - 1, (1,), generator=gen, device=gen.device))
                    if self.draws == "sobol" else None)
        if "hessian_rows" in how:
            counters["log_joint_calls"] += 1
            counters["log_joint_evals"] += how.pop("hessian_rows")
            counters["hessian_backward_passes"] += how.pop("hessian_backward")
        init_info = {**{k: v for k, v in start.info.items() if k != "hessian"}, **how}
        hessian, note = None, ""
        if self.method == "hessian":
            hessian = self.hessian.kind
            if hessian == "auto":
                batch = target.sample_minibatch(gen) if is_minibatch_target(target) else None
                counters["log_joint_calls"] += 1
                counters["log_joint_evals"] += 1
                hessian, note = probe_hessian(target, m0, batch)
        stats, sums = initial_statistics(self.method, m0, P0, L0)
        return SKState(m=m0, L=L0, stats=stats, sums=sums, t=0,
                       num_steps=self.num_steps, w=self.w, method=self.method, hessian=hessian, hessian_note=note,
                       generator=gen, window=deque(maxlen=self.window), counters=counters, init_info=init_info,
                       qmc_seed=qmc_seed)

    def resume(self, target: Any, state: SKState | dict[str, Any]) -> SKState:
        """Check ``state`` (an :class:`SKState` or its ``state_dict``) against ``target`` and the settings; a copy.

        The engine must have the same ``num_steps`` (N sets :math:`w` and the averaging window, so a run cannot
        be extended), step size and ``method``.
        """
        state = resume_copy(state, SKState, len(as_target(target).names))
        if state.method != self.method:
            raise ValueError(f"state was made with method={state.method!r} but this engine has "
                             f"method={self.method!r}")
        if (state.qmc_seed is not None) != (self.draws == "sobol"):
            raise ValueError(f"state was made with draws={'sobol' if state.qmc_seed is not None else 'random'!r} but "
                             f"this engine has draws={self.draws!r}")
        if state.num_steps != self.num_steps or state.w != self.w:
            raise ValueError(f"state was made with num_steps={state.num_steps} (w = {state.w:.6g}) but this engine "
                             f"has num_steps={self.num_steps} (w = {self.w:.6g}); N sets the step size and the "
                             f"averaging window, so a run cannot be extended")
        if state.window.maxlen != self.window:
            state.window = deque(state.window, maxlen=self.window)
        return state

    def stop_rule(self) -> NeverStop:
        """Every run takes its N steps (N is part of the algorithm): :class:`~gpvi.inference.contract.NeverStop`."""
        return NeverStop()

    def postfix(self, info: dict[str, Any]) -> dict[str, Any]:
        """The progress bar's postfix: the rolling average of the instantaneous bound."""
        return {"bound": info["bound_avg"]}

    def step(self, target: Any, state: SKState) -> tuple[SKState, dict[str, Any]]:
        r"""One iteration of Algorithm 2 (or its gradient variant): advance ``state`` in place and return it.

        Returns
        -------
        state : SKState
            The same object, advanced (``t`` + 1).
        info : dict
            ``t``, ``bound`` (instantaneous bound at :math:`q_t`), ``bound_avg``, ``num_valid``, ``resampled``,
            ``dropped``, ``skipped`` (no valid draw: only ``t`` and the generator moved), ``pd`` (whether
            :math:`P_{t+1}` was positive definite).

        Raises
        ------
        NumericalFaultError
            ``faults.on_non_pd="raise"`` and :math:`P_{t+1}` is not positive definite; ``err.state`` is the
            state before the step. (Consecutive skipped steps are counted by the driver.)

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
        t, w, faults = state.t, state.w, self.faults
        S = self.schedule.draws_at(t, state.num_steps, self.num_draws)
        est = draw_statistics(target, state, S, faults.max_resample, self.hessian)
        cnt = state.counters
        count_draws(state, "SKGaussian", "log joint, gradient or Hessian", resampled=est.resampled,
                    dropped=est.dropped, calls=est.calls)
        cnt["log_joint_evals"] += est.evals
        cnt["hessian_backward_passes"] += est.backward
        info: dict[str, Any] = {"num_valid": est.num_valid, "resampled": est.resampled, "dropped": est.dropped,
                                "skipped": False, "pd": True}
        if est.parts is None:
            skip_step(state, info, "SKGaussian", "log joint and derivatives", faults.max_resample)
            self._record(state, math.nan, 0, True, info)
            return state, info
        # --- running statistics (Algorithm 2: a, P, z; gradient variant: a, z, A, B)
        new_stats = {k: (1.0 - w) * v + w * est.parts[k] for k, v in state.stats.items()}
        sol = solve(state.method, new_stats)
        pd = sol is not None
        info["pd"] = pd
        if not pd:
            cnt["non_pd_steps"] += 1
            if faults.on_non_pd == "reject":
                new_stats = state.stats             # the draw is not absorbed into the running statistics
            if faults.on_non_pd == "raise":
                raise NumericalFaultError(
                    f"SKGaussian: the running precision P is not positive definite after step {t + 1} (w = {w:.3g});"
                    f" use more steps (smaller w), a start closer to the posterior (init=), or "
                    f"SKFaultPolicy(on_non_pd='keep'). err.state is the state before this step", state=state)
            if cnt["non_pd_steps"] == 1:
                what = ("the step is rejected (its draw does not enter the running statistics)"
                        if faults.on_non_pd == "reject" else "drawing from the last valid q until it is")
                warnings.warn(f"SKGaussian: running precision P would not be positive definite at step {t + 1}; {what} "
                              f"(counted in info['non_pd_steps']; paper section 4: more steps help)", NumericalWarning,
                              stacklevel=2)
        # --- commit
        state.stats = new_stats
        if pd:
            state.m, state.L = sol
        state.t = t + 1
        start, mid = self.schedule.window_bounds(state.num_steps)
        if state.t > start:
            s = state.sums[0 if state.t <= mid else 1]
            for k, v in est.parts.items():
                s[k] = s[k] + v
            s["n"] += 1
            if self.num_elbo_draws == "window":
                state.window_draws.append(est.draws)
        self._record(state, est.bound, est.num_valid, pd, info)
        return state, info

    @staticmethod
    def _record(state: SKState, bound: float, num_valid: int, pd: bool, info: dict[str, Any]) -> None:
        record_bound(state, bound, info, num_valid=float(num_valid), pd=1.0 if pd else 0.0)

    # ------------------------------------------------------------------ output
    def estimate_bound(self, target: Any, mean: torch.Tensor, scale_tril: torch.Tensor, *,
                       num_draws: int | None = None, generator: torch.Generator | None = None,
                       seed: int | None = None, budget: MemoryBudget | None = None) -> tuple[float, float, int]:
        r"""Monte Carlo estimate of the Gaussian bound :math:`\mathbb E_q[\log g(x) - \log q(x)]` and its se.

        See :func:`gpvi.inference.salimans_knowles.estimates.estimate_bound`; ``num_draws`` defaults to ``num_elbo_draws``,
        the draws come from ``generator`` (else a fresh one seeded with ``seed``, default 0).

        Returns
        -------
        (estimate, standard_error, num_invalid)

        Examples
        --------
        >>> import math, torch, gpvi
        >>> lognormal = lambda th: -0.5 * (th ** 2).sum(-1) - math.log(2 * math.pi)
        >>> est, se, bad = SKGaussian().estimate_bound(gpvi.Target(lognormal, names=2), torch.zeros(2),
        ...                                            torch.eye(2, dtype=torch.float64), num_draws=500)
        >>> abs(est) < 1e-12, se < 1e-12, bad           # q = target: log g - log q = log Z = 0 for every draw
        (True, True, 0)
        """
        n = bound_draws(num_draws, 100 if self.num_elbo_draws == "window" else self.num_elbo_draws)
        gen = resolve_generator(seed if seed is not None else 0, generator)
        return estimate_bound(target, mean, scale_tril, n, generator=gen, budget=budget)

    def result(self, target: Any, state: SKState, report: RunReport) -> GaussianPosterior:
        r""":math:`q = \mathcal N(m, V)`, :math:`V = \bar P^{-1}`, :math:`m = V\bar a + \bar z` (window averages).

        A faulted run gives the current :math:`q_t`; an interrupted one the average so far (the current
        :math:`q_t` before the averaging window, ``info["averaged"] = False``) and no final estimate. Issues the
        end-of-run warnings (faults survived, the window-split drift check); see
        :func:`gpvi.inference.salimans_knowles.result.build_posterior`.

        Raises
        ------
        NumericalFaultError
            The averaged :math:`\bar P` is not positive definite; ``err.partial`` is the current :math:`q_t`.
        """
        return build_posterior(self, target, state, report)

    def run(self, target: Any, init: Any = None, *, state: SKState | dict[str, Any] | None = None,
            generator: torch.Generator | None = None,
            callback: Callable[[SKState, dict[str, Any]], None] | None = None) -> GaussianPosterior:
        r"""Run the N steps through :func:`gpvi.inference.driver.run` and return :meth:`result`.

        Parameters
        ----------
        target : target
            Anything with ``log_joint(theta)`` (``(S, D) -> (S,)``, differentiable) and ``names``:
            :class:`gpvi.GPRegression`, :class:`gpvi.Target`,
            :class:`gpvi.models.logistic.BayesianLogisticRegression`, :class:`gpvi.models.minibatch.MinibatchTarget`
            (section 6.5), ...
        init : optional
            Where to start (:func:`gpvi.inference.init.resolve_init`: a point, a posterior, ``"laplace"``, an init
            strategy; ``None``: :meth:`default_init`). A Gaussian posterior also sets :math:`V_1`. Not with
            ``state``.
        state : SKState or its state_dict, optional
            Resume (e.g. from ``q.engine_state`` of an interrupted run, or a state_dict loaded from disk); the
            engine must have the same ``num_steps`` and ``method``. The result equals an uninterrupted run's;
            ``state`` itself is never changed.
        generator : torch.Generator, optional
            Overrides ``seed``. Not with ``state``.
        callback : callable, optional
            ``callback(state, info)`` after every step; raising ``KeyboardInterrupt`` stops the run like Ctrl-C.

        Returns
        -------
        GaussianPosterior
            ``mean``, ``scale_tril`` (Cholesky factor of :math:`V`), ``elbo``/``elbo_se`` (fresh Monte Carlo
            estimate at the returned q), ``trace`` (``bound``, ``bound_avg``, ``num_valid``, ``pd`` per step),
            ``info`` (a :class:`~gpvi.posteriors.info.RunInfo`: ``converged`` (the run reached its averaging
            window and the two halves of the window agree within ``schedule.drift_tol``: the window-split check
            passed), ``interrupted``, ``steps``, ``time_s``, ``total_time_s``, ``settings``, ``counters``; details
            ``hessian``, ``init``, ``averaged`` and ``num_averaged``, ``drift_mean_sd`` and ``drift_log_sd`` of that
            check) and ``engine_state`` (a copy of the final state).

        Raises
        ------
        NumericalFaultError
            The averaged :math:`\bar P` is not positive definite, ``faults.max_consecutive`` consecutive skipped
            steps, or ``faults.on_non_pd="raise"``. ``err.state`` is the last state and ``err.partial`` the
            posterior built from the current :math:`q_t` (always a valid Gaussian).

        Warns
        -----
        InterruptedRunWarning, NumericalWarning, ConvergenceWarning

        Examples
        --------
        >>> import gpvi
        >>> pima = gpvi.datasets.load_pima()
        >>> q = SKGaussian(num_steps=400, progress_bar=False).run(gpvi.BayesianLogisticRegression(pima.X_train,
        ...                                                                                        pima.y_train))
        >>> q.mean.shape, q.info["hessian"], q.info["num_averaged"], q.info["converged"]
        (torch.Size([8]), 'autograd', 200, True)
        """
        check_gaussian_warm_start(init)
        return driver.run(self, target, init, state=state, generator=generator, callback=callback)

    def __repr__(self) -> str:
        hess = f", hessian={self.hessian!r}" if self.method == "hessian" else ""
        qmc = ", draws='sobol'" if self.draws == "sobol" else ""
        return (f"SKGaussian(num_steps={self.num_steps}, method={self.method!r}{hess}, num_draws={self.num_draws}"
                f"{qmc}, step_size={self.w:.4g})")
