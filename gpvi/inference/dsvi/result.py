r"""The end of a DSVI run: what is returned (final iterate, Polyak or converged-window average) and the final
Monte Carlo estimate of the bound, evaluated in chunks that respect the run's memory budget.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from typing import Any

import torch

from ...exceptions import ConvergenceWarning, NumericalWarning
from ...posteriors.gaussian import GaussianPosterior
from ...posteriors.info import RunInfo
from ...numerics.budget import MemoryBudget
from ...models.target import call_log_joint
from ...rng import copy_generator
from ...validation import as_float_tensor
from ..contract import warn_faults
from ..progress import Progress, trace_to_tensor
from .convergence import batch_average
from .state import COUNTERS, DSVIState

__all__ = ["estimate_bound", "check_moments", "build_posterior", "DRAW_BLOCK"]

DRAW_BLOCK = 250
"""Draws of z generated at a time for the bound estimate (their evaluation is chunked by the memory budget)."""


def estimate_bound(target: Any, base: Any, term: Any, mu: torch.Tensor, C: torch.Tensor, n: int,
                   generator: torch.Generator, budget: MemoryBudget, *, progress_bar: bool = False,
                   desc: str = "DSVI bound") -> tuple[float, float, int, dict[str, Any]]:
    r"""Monte Carlo estimate of the bound :math:`\mathcal F(\mu, C)` (eq. 4) with its standard error.

    :math:`\hat{\mathcal F} = \frac1n\sum_i \log g(Cz_i + \mu) + \text{analytic term}` with the full-data log
    joint, no gradients; the log joint is called on at most ``budget.draws_per_call(target, ...)`` draws at once.

    Returns
    -------
    (estimate, standard_error, num_invalid, record)
        Invalid draws (NaN/inf log joint) are left out of the average and counted; ``record`` says how the
        draws were chunked (``budget_bytes``, ``bytes_per_draw``, ``draws_per_call``, ``calls``).
    """
    diag = C.dim() == 1
    per_call = budget.draws_per_call(target, DRAW_BLOCK)
    vals, calls = [], 0
    with torch.no_grad(), Progress(n, enabled=progress_bar, desc=desc, leave=False) as bar:
        for start in range(0, n, DRAW_BLOCK):
            k = min(DRAW_BLOCK, n - start)
            z = base.sample(k, generator, dtype=mu.dtype, device=mu.device)
            theta = mu + z * C if diag else torch.addmm(mu, z, C.T)
            for part in torch.split(theta, per_call):
                vals.append(call_log_joint(target, part, None).detach())
                calls += 1
                bar.update(part.shape[0])
    v = torch.cat(vals)
    ok = torch.isfinite(v)
    bad = int((~ok).sum())
    v = v[ok]
    record = {**budget.describe(target, DRAW_BLOCK), "calls": calls}
    term_value, _, _ = term(mu, C if diag else torch.diagonal(C))
    if v.numel() == 0:
        return math.nan, math.nan, bad, record
    se = float(v.std() / math.sqrt(v.numel())) if v.numel() > 1 else math.nan
    return float(v.mean()) + term_value, se, bad, record


def check_moments(target: Any, mu: Any, C: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``mu`` (D,) and ``C`` -- ``(D, D)`` lower triangular or the ``(D,)`` diagonal, strictly positive diagonal --
    as float64 tensors, checked against the target's D."""
    mu = as_float_tensor(mu, "mu", ndim=1)
    C = as_float_tensor(C, "C", ndim=(1, 2))
    D = mu.shape[0]
    if D != len(target.names):
        raise ValueError(f"mu has length {D} but the target has D = {len(target.names)}")
    if C.shape not in ((D,), (D, D)):
        raise ValueError(f"C must be ({D}, {D}) lower triangular or ({D},) diagonal; got {tuple(C.shape)}")
    if not bool(((torch.diagonal(C) if C.dim() == 2 else C) > 0).all()):
        raise ValueError("C must have a strictly positive diagonal")
    return mu, C


def _returned(state: DSVIState, stopped: bool) -> tuple[torch.Tensor, torch.Tensor, str]:
    ck = state.check
    batches = ck.get("batches")
    if batches:                                   # the finish: the average over the windows since the plateau
        mu, C, n = batch_average(batches)
        gap = ck.get("gap", math.nan)
        how = "converged" if stopped and state.converged else "not converged"
        return mu, C, (f"average of the last {len(batches)} window(s) ({n} iterates) since the bound's plateau at "
                       f"step {ck.get('plateau_t')}; estimated gap to the optimum {gap:.3g} nats ({how})")
    hist = ck.get("history") or []
    if stopped and state.converged and hist:
        mu, C, n = batch_average(hist)
        return mu, C, (f"average of the last {len(hist)} window(s) ({n} iterates) "
                       f"over which the convergence rule held")
    if state.polyak_n > 0:
        return state.polyak_mu, state.polyak_C, f"Polyak average of the last {state.polyak_n} iterates"
    return state.mu, state.C, "final iterate"


FAULT_COUNTERS = tuple(k for k in COUNTERS if k not in ("log_joint_calls", "trust_clips", "c_shrinks"))
"""The counters whose increase in a run ends it with a :class:`~gpvi.exceptions.NumericalWarning` (a damped or
trust-region-clipped step is part of the iteration, not a fault)."""


def build_posterior(engine: Any, target: Any, state: DSVIState, report: Any) -> GaussianPosterior:
    """The posterior of a DSVI run (see :meth:`gpvi.DSVI.run` for what it holds); ``state`` is copied."""
    if not report.faulted:
        warn_faults(engine.name, state.counters, report.extra.get("counters_before", {}), FAULT_COUNTERS,
                    stacklevel=5)
    if not report.partial and not state.converged:
        last = state.check.get("last")
        detail = "" if last is None else (f" (last check at step {last['t']}: bound change {last['dbound']:.3g} "
                                          f"vs se {last['se']:.3g}, max change of mu {last['dmu_sd']:.3g} sd, "
                                          f"of C {last['dC_sd']:.3g} sd)")
        warnings.warn(f"{engine.name}: convergence rule not met after {state.t} steps{detail}; consider more steps, "
                      f"a decaying schedule or polyak averaging", ConvergenceWarning, stacklevel=5)
    state.check["stopped"] = bool(report.stopped_early)
    mu, C, returned = _returned(state, report.stopped_early)
    base = engine.make_base(state.dim)
    elbo_method, elbo, se, invalid, chunks, t_est = "rolling window average", state.bound_average(), math.nan, 0, {}, 0.0
    if not report.partial and engine.num_elbo_draws > 0:
        t0 = time.perf_counter()
        elbo, se, invalid, chunks = estimate_bound(target, base, engine.term(base), mu, C, engine.num_elbo_draws,
                                                   copy_generator(state.generator), report.budget,
                                                   progress_bar=report.progress_bar, desc=f"{engine.name} bound")
        t_est = time.perf_counter() - t0
        elbo_method = f"Monte Carlo, {engine.num_elbo_draws} draws at the returned (mu, C)"
        if invalid:
            warnings.warn(f"{engine.name}: {invalid} of {engine.num_elbo_draws} draws for the final bound estimate "
                          f"had a non-finite log joint and were left out", NumericalWarning, stacklevel=5)
    details = dict(
        steps_this_run=report.steps_this_run, bound_time_s=t_est, lr_mu=state.rho0_mu, lr_C=state.rho0_C,
        polyak_n=state.polyak_n, elbo_method=elbo_method, elbo_invalid=invalid, elbo_chunks=chunks,
        convergence={**dict(state.check.get("last") or {}),
                     **{k: state.check[k] for k in ("plateau_t", "gap") if k in state.check}},
        optimizer=state.optimizer, returned=returned, stopped_on_convergence=bool(report.stopped_early),
        schedule=repr(engine.schedule_for(state)), init=copy.deepcopy(state.init_info),
    )
    info = RunInfo(engine=engine.name, converged=state.converged, interrupted=report.interrupted, steps=state.t,
                   time_s=report.time_s, total_time_s=state.wall_time, settings=engine.settings(),
                   counters=dict(state.counters), details=details)
    trace = {k: trace_to_tensor(v) for k, v in state.trace.items()}
    return GaussianPosterior(mu.clone(), C.clone(), list(target.names), target, base=base, elbo=elbo, elbo_se=se,
                             trace=trace, info=info, engine_state=state)
