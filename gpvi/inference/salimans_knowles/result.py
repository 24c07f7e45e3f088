r"""The end of a Salimans-Knowles run: the window-averaged Gaussian, the window-split drift check and the final
Monte Carlo estimate of the bound (:func:`build_posterior`, behind :meth:`gpvi.SKGaussian.result`).

The returned :math:`q = \mathcal N(m, V)` comes from the statistics averaged over the window (Algorithm 2:
:math:`V = \bar P^{-1}`, :math:`m = V\bar a + \bar z`; the Hessian-free variant: eq. (47)-(49)). The two halves
of the window give two such Gaussians; their largest differences (means in sds, log sds) are the drift check.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from ...exceptions import ConvergenceWarning, NumericalFaultError, NumericalWarning
from ...posteriors.gaussian import GaussianPosterior
from ...posteriors.info import RunInfo
from ...rng import copy_generator
from ..contract import RunReport, warn_faults
from ..progress import trace_to_tensor
from .estimates import averaged, estimate_bound, scale_from_precision, window_bound, window_drift
from .state import SKState

__all__ = ["build_posterior"]

FAULT_COUNTERS = ("resampled_draws", "dropped_draws", "skipped_steps", "non_pd_steps")
"""The counters whose increase in a run ends it with a :class:`~gpvi.exceptions.NumericalWarning`."""


def _warn_drift(drift_tol: float, drift_mean: float, drift_sd: float) -> None:
    if drift_mean <= drift_tol and drift_sd <= drift_tol:
        return
    what = ("one half of the averaging window gives an indefinite precision" if math.isinf(drift_mean) else
            f"means differ by up to {drift_mean:.3g} sd, sds by a factor up to exp({drift_sd:.3g})")
    warnings.warn(f"SKGaussian: the two halves of the averaging window disagree ({what}); q may still be moving "
                  f"or unstable: do not trust it without more steps or a start closer to the posterior",
                  ConvergenceWarning, stacklevel=6)


def build_posterior(engine: Any, target: Any, state: SKState, report: RunReport) -> GaussianPosterior:
    """The posterior of an S&K run (see :meth:`gpvi.SKGaussian.run` for what it holds); ``state`` is copied.

    Raises
    ------
    NumericalFaultError
        The averaged :math:`\\bar P` is not positive definite; ``err.partial`` is the current :math:`q_t`.
    """
    averaged_ok, n_avg = False, 0
    drift_mean, drift_sd = math.nan, math.nan
    if not report.faulted:
        warn_faults("SKGaussian", state.counters, report.extra.get("counters_before", {}), FAULT_COUNTERS,
                    stacklevel=6)
    if report.faulted:
        m, L = state.m, state.L
    else:
        sol, n_avg = averaged(state)
        if n_avg == 0:
            m, L = state.m, state.L              # interrupted before the averaging window
        elif sol is None:
            partial = build_posterior(engine, target, state, RunReport(
                interrupted=report.interrupted, stopped_early=report.stopped_early, time_s=report.time_s,
                steps_this_run=report.steps_this_run, budget=report.budget, faulted=True, extra=report.extra))
            raise NumericalFaultError(
                f"SKGaussian: the averaged precision P_bar over {n_avg} steps is not positive definite "
                f"(N = {state.num_steps}, w = {state.w:.3g}, {state.counters['non_pd_steps']} non-PD steps); "
                f"increase num_steps (smaller w, longer average) or start closer to the posterior (init=, e.g. "
                f"an ML-II/MAP point or a DSVI posterior). err.state holds the final state and err.partial the "
                f"current q_t", state=state, partial=partial)
        else:
            (m, L), averaged_ok = sol, True
            if not report.interrupted and state.sums[0]["n"] > 0 and state.sums[1]["n"] > 0:
                drift_mean, drift_sd = window_drift(state, L)
                _warn_drift(engine.schedule.drift_tol, drift_mean, drift_sd)
    scale_tril = scale_from_precision(L)
    elbo_method = "rolling window average of the instantaneous bound"
    elbo, se, invalid, kept = state.bound_average(), math.nan, 0, None
    window = engine.num_elbo_draws == "window"
    if not report.partial and window and state.window_draws:
        elbo, se, ess = window_bound(state.window_draws, m, scale_tril)
        elbo_method = (f"the window's {sum(d.shape[0] for d in state.window_draws)} draws importance-weighted to the "
                       f"returned (m, V) (effective sample size {ess:.0f})")
    elif not report.partial and not window and engine.num_elbo_draws > 0:
        elbo, se, invalid, kept = estimate_bound(target, m, scale_tril, engine.num_elbo_draws,
                                                 generator=copy_generator(state.generator), budget=report.budget,
                                                 progress_bar=report.progress_bar, desc=f"{engine.name} bound",
                                                 keep=True)
        elbo_method = f"Monte Carlo, {engine.num_elbo_draws} draws at the returned (m, V)"
        if invalid:
            warnings.warn(f"SKGaussian: {invalid} of {engine.num_elbo_draws} draws for the final bound estimate "
                          f"had a non-finite log joint and were left out", NumericalWarning, stacklevel=5)
    tol = engine.schedule.drift_tol
    details = dict(
        method=state.method, hessian=state.hessian, hessian_note=state.hessian_note, init=dict(state.init_info),
        averaged=averaged_ok, num_averaged=n_avg, drift_mean_sd=drift_mean, drift_log_sd=drift_sd,
        steps_this_run=report.steps_this_run, step_size=state.w, faulted=report.faulted, elbo_method=elbo_method,
        elbo_invalid=invalid,
        memory=(report.budget.describe(target, 0 if window else engine.num_elbo_draws) if report.budget is not None
                else None),
    )
    info = RunInfo(engine="SKGaussian", converged=averaged_ok and drift_mean <= tol and drift_sd <= tol,
                   interrupted=report.interrupted, steps=state.t, time_s=report.time_s,
                   total_time_s=state.wall_time, settings=engine.settings(), counters=dict(state.counters),
                   details=details)
    trace = {k: trace_to_tensor(v) for k, v in state.trace.items()}
    q = GaussianPosterior(m.clone(), scale_tril.clone(), list(target.names), target, elbo=elbo, elbo_se=se,
                          trace=trace, info=info, engine_state=state.copy())
    q.bound_draws = kept                  # the bound's independent draws of q and their log joint (not saved)
    return q
