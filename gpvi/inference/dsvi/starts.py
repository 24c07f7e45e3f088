r"""DSVI from several starts: one run from each distinct optimum, the best Gaussian kept.

The bound of a Gaussian q on GP hyperparameters can have several local optima (skewed and two-mode marginals of
log-lengthscales); a run started at one MAP optimum converges to the q of that basin. The default start of an
exact GP target (:meth:`gpvi.DSVI.default_init`) is therefore ``init_to_laplace(init_to_map(MAP_RESTARTS,
max_starts=MAX_STARTS, init_scale=MAP_INIT_SCALE))``: the *distinct* optima that ``MAP_RESTARTS`` seeded L-BFGS
restarts of the MAP find (:func:`gpvi.inference.ml2.distinct_optima`), each with its Laplace scale. :func:`run_starts` runs the engine
from each (through :func:`gpvi.inference.driver.run`, so every run is an ordinary run with its own progress
bar, stop rule and state): every start to its bound's plateau, then the finish (the iterate averaging to
0.01 nats) only for the starts whose plateau bound can still win, and returns the posterior with the best
final bound. Usually every restart reaches the same optimum, and there is one ordinary run: the cost multiplies
only where the posterior has several basins, and then mostly for the part of the runs up to the plateau.

The engine contract holds: the engine never runs another engine to find its start (the strategy runs ML-II
once, before any engine step); the runs share the run's generator in turn (runs repeat for a seed); the
finish of a start resumes its plateau state (``engine.run(target, state=...)``); the returned posterior's
``engine_state`` is its own run's state.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import replace
from typing import Any

import torch

from ...exceptions import NumericalFaultError
from ...rng import resolve_generator
from .. import driver
from ..init import Start, init_to_laplace, init_to_map, init_to_start

__all__ = ["run_starts", "map_laplace_starts", "MAP_RESTARTS", "MAP_INIT_SCALE", "MAX_STARTS"]

MAP_RESTARTS = 30
"""L-BFGS restarts of the MAP behind DSVI's default start for exact GP targets."""
MAP_INIT_SCALE = (1.0, 2.0, 3.0)
"""Spreads (sd, log scale) of those restarts around the data-scaled first start, cycled over the restarts: the
wider spreads reach basins far from the data-scaled start (e.g. Bodyfat's second basin), the narrow one keeps
restarts near it."""
MAX_STARTS = 3
"""Most distinct MAP optima DSVI's default runs from (the best three by log joint)."""
FINISH_MARGIN = 0.1
"""Nats a start's plateau bound may lie below the best one's (beyond 2 se) and still be finished: a bound on what
the finish gains over the plateau."""
BASIN_SEPARATION = 0.5
"""Two starts' Gaussians are the same basin when every mean component differs by less than this many sds (of the
first)."""


def map_laplace_starts(seed: int) -> init_to_laplace:
    """DSVI's default start for exact GP targets: the distinct MAP optima of ``MAP_RESTARTS`` seeded restarts
    spread by ``MAP_INIT_SCALE`` (at most ``MAX_STARTS``), each with its Laplace scale."""
    return init_to_laplace(init_to_map(MAP_RESTARTS, seed=seed, max_starts=MAX_STARTS, init_scale=MAP_INIT_SCALE))


def _given(start: Start) -> init_to_start:
    """The init strategy that returns ``start`` without its alternatives (one run from that start alone)."""
    return init_to_start(replace(start, alternatives=()))


def _record(k: int, start: Start, q: Any, failed: str | None = None) -> dict[str, Any]:
    info = {} if q is None else q.info
    return {"start": k, "theta": start.theta.clone(), "map_value": start.info.get("map_value"),
            "laplace_log_evidence": start.info.get("laplace_log_evidence"),
            "elbo": math.nan if q is None else float(q.elbo),
            "elbo_se": math.nan if q is None else float(getattr(q, "elbo_se", math.nan)),
            "steps": info.get("steps"), "converged": info.get("converged"), "interrupted": info.get("interrupted"),
            "finished": False, "time_s": info.get("total_time_s", info.get("time_s")), "failed": failed}


def _agree(records: list[dict[str, Any]], best: dict[str, Any]) -> bool:
    """Every other start's bound (final, or at its plateau) is within 2 combined standard errors of the best's."""
    for r in records:
        if r is best or r["failed"] or r["interrupted"]:
            continue
        se = math.sqrt(sum(x * x for x in (r["elbo_se"], best["elbo_se"]) if math.isfinite(x)))
        if not best["elbo"] - r["elbo"] <= 2.0 * se:
            return False
    return True


def _best(records: list[dict[str, Any]], ks: list[int]) -> int:
    best = ks[0]
    for k in ks[1:]:
        if math.isfinite(records[k]["elbo"]) and not records[k]["elbo"] <= records[best]["elbo"]:
            best = k
    return best


def run_starts(engine: Any, target: Any, start: Start, *, generator: torch.Generator | None = None,
               callback: Any = None, budget: Any = None) -> Any:
    r"""Run ``engine`` from ``start`` and from each of its alternatives; return the posterior with the best bound.

    With one start this is one ordinary run. With several, and an engine whose stop rule finishes
    (:meth:`~gpvi.inference.dsvi.convergence.Convergence.finishes`): every start is run to its bound's plateau
    (the rule with ``gap_tol=None``, bound estimated there), the starts whose plateau bound is within
    ``2 se + FINISH_MARGIN`` of the best one's are finished (the same run resumed under the full rule), and the
    best final bound wins; the others keep their plateau record (as does a start that reached ``num_steps``
    before its plateau). Without a finish each start is run once.

    Parameters
    ----------
    engine : DSVI or SKGaussian
        DSVI finishes as described; an engine without a ``convergence`` rule (S&K, whose step count is part of
        the algorithm) runs each start once.
    target : target
    start : Start
        The start (its ``alternatives``: further starts, best first).
    generator, callback, budget
        As in :func:`gpvi.inference.driver.run`; the runs use the one generator in turn.

    Returns
    -------
    GaussianPosterior
        The run with the highest final bound ``elbo`` (the first start on ties and when bounds are missing), with
        ``info["starts"]`` (one record per start: ``theta``, ``map_value``, ``laplace_log_evidence``, ``elbo``,
        ``elbo_se``, ``steps``, ``converged``, ``finished`` (run through the finish), ``interrupted``,
        ``time_s``, ``failed``), the attribute ``start_posteriors`` (each start's posterior, ``None`` where its run
        failed or was interrupted; not saved by ``state_dict``: :func:`gpvi.infer` mixes them when the starts
        found several basins), ``info["start_chosen"]`` (its index), ``info["starts_agree"]`` (every other
        start's bound within 2 combined standard errors of the best: the starts reached optima of equal bound)
        and ``info["starts_time_s"]`` (all runs). After Ctrl-C no further run is started: the best run so far is
        returned (a finished one if any, else the interrupted one) with ``info["interrupted"] = True`` and
        ``info["interrupted_stage"] = "q"``. A start found under Ctrl-C (``start.info["interrupted"]``: ``"map"``
        when the MAP restarts were interrupted, ``"laplace"`` when its Laplace scales were) gives one run that
        takes no step: q is that start's Gaussian, ``info["interrupted_stage"]`` names the stage.

    Raises
    ------
    NumericalFaultError
        When every start's run failed (the first failure); a failed alternative is recorded and skipped.
    """
    stage = start.info.get("interrupted")                    # Ctrl-C while the starts were found
    starts = [start] if stage else [start, *start.alternatives]
    kw = dict(callback=callback, budget=budget)
    if len(starts) == 1:
        q = driver.run(engine, target, _given(start), generator=generator, **kw)
        rec = _record(0, start, q)
        rec["finished"] = bool(q.info.get("converged"))
        q.info.update(starts=[rec], start_chosen=0, starts_agree=True, starts_time_s=rec["time_s"] or 0.0)
        q.start_posteriors = [q]
        if q.info.get("interrupted"):
            q.info["interrupted_stage"] = stage or "q"
        return q
    generator = resolve_generator(engine.seed, generator)     # one stream, used by the runs in turn
    conv = getattr(engine, "convergence", None)               # S&K (fixed N, no finish) runs each start once
    finishes = conv is not None and conv.gap_tol is not None
    first = engine
    if finishes:                                              # phase 1: every start to its plateau
        first = copy.copy(engine)
        first.convergence = copy.copy(engine.convergence)
        first.convergence.gap_tol = None
    posts: list[Any] = []
    records: list[dict[str, Any]] = []
    first_error: NumericalFaultError | None = None
    interrupted = False
    for k, s in enumerate(starts):
        try:
            q = driver.run(first, target, _given(s), generator=generator, **kw)
        except NumericalFaultError as err:
            first_error = first_error or err
            warnings.warn(f"{engine.name}: the run from start {k} failed ({err}); the other starts go on",
                          RuntimeWarning, stacklevel=3)
            posts.append(None)
            records.append(_record(k, s, None, failed=str(err)[:200]))
            continue
        posts.append(q)
        records.append(_record(k, s, q))
        if q.info.get("interrupted"):
            interrupted = True
            break
    done = [k for k, q in enumerate(posts) if q is not None and not q.info.get("interrupted")]
    if not done and not any(q is not None for q in posts):
        assert first_error is not None
        raise first_error
    if finishes and not interrupted:                          # phase 2: finish the starts that can still win
        top = records[_best(records, done)]
        for k in list(done):
            r = records[k]
            se = math.sqrt(sum(x * x for x in (r["elbo_se"], top["elbo_se"]) if math.isfinite(x)))
            if r is not top and not top["elbo"] - r["elbo"] <= 2.0 * se + FINISH_MARGIN:
                continue
            if not posts[k].info.get("converged"):            # no plateau before num_steps: nothing to finish
                continue
            try:
                q = driver.run(engine, target, state=posts[k].engine_state, **kw)
            except NumericalFaultError as err:
                r["failed"] = str(err)[:200]
                done.remove(k)
                continue
            posts[k] = q
            records[k] = {**_record(k, starts[k], q), "finished": True}
            if q.info.get("interrupted"):
                interrupted = True
                break
    candidates = done or [k for k, q in enumerate(posts) if q is not None]
    best = _best(records, candidates)
    q = posts[best]
    q.info["starts"] = records
    q.info["start_chosen"] = best
    q.info["starts_agree"] = _agree(records, records[best])
    q.info["starts_time_s"] = sum(r["time_s"] or 0.0 for r in records)
    q.start_posteriors = [p if p is not None and not p.info.get("interrupted") else None for p in posts]
    if interrupted:
        q.info["interrupted"], q.info["interrupted_stage"] = True, "q"
    return q
