r"""CVI runs whose posterior is built only if it is used: the engine runs of :class:`~gpvi.inference.cvi.TypeII`.

A CVI run ends by building its posterior (:meth:`gpvi.CVI.posterior` through the driver's ``result``: the Cholesky
factor of :math:`K + S`, the marginals and the bound, one :math:`O(N^3)` evaluation). Inside the type-II loop a run
is almost always followed by a hyperparameter phase, which needs only the run's state, and the loop's answer is the
posterior of the phase's end; so the first run's posterior and those of the runs between phases were built and
dropped (two of the three posteriors of a binary fit at N = 2,000, 2-3% of the fit:
``benchmarks/studies/results/typeii_trace_h59d.md``). :func:`run_deferred` runs the engine the same way and returns
a :class:`RunEnd` (the state and the run's report); :meth:`RunEnd.posterior` builds the posterior the run would have
returned, bit for bit, where the loop does end on a run (interrupted, not converged, Ctrl-C in a phase).
"""

from __future__ import annotations

import copy
from typing import Any

from ...exceptions import NumericalFaultError
from .steps import run_result

__all__ = ["RunEnd", "run_deferred", "built", "final_posterior"]


class RunEnd:
    """The end of a CVI run without its posterior: ``engine_state`` (the final state, as the posterior would hold
    it), ``info`` (``{"interrupted": ...}``), and :meth:`posterior`."""

    def __init__(self, engine: Any, model: Any, state: Any, report: Any) -> None:
        self.engine, self.model, self.engine_state, self.report = engine, model, state, report
        self.info = {"interrupted": bool(report.interrupted)}

    def posterior(self) -> Any:
        """The posterior the run would have returned (the engine's ``result``,
        :func:`gpvi.inference.cvi.steps.run_result`)."""
        return run_result(self.engine, self.model, self.engine_state, self.report)


def run_deferred(engine: Any, model: Any, init: Any = None, *, unscored: bool = False, **kw: Any) -> RunEnd:
    r"""``engine.run(model, init, **kw)`` returning a :class:`RunEnd` instead of the posterior (a copy of ``engine``
    runs, whose ``result`` keeps the state and report). A run that ends on
    :class:`~gpvi.exceptions.NumericalFaultError` raises it with ``err.partial`` the posterior, as ``engine.run``
    does.

    ``unscored``: ``kw["state"]``'s sites come without their bound (a phase's end at a new theta), for a
    full-batch engine whose steps evaluate the sites they are given (no centring of K latent functions). Its first
    check compares the bound its step evaluated with the bound of the sites the run started from, which are the
    same sites: the type-II loop computed that bound first (``steps.elbo_from_sites``, one :math:`O(N^3)`
    evaluation) only for this comparison, which then always passes. So the first check is counted as passed
    (``tol > 0``), without it; the Monte Carlo rule's flat-window test (one latent function) never used it."""
    lazy = copy.copy(engine)
    lazy.result = lambda target, state, report: RunEnd(lazy, target, state, report)
    if unscored and not (engine.estimator == "mc" and not engine.class_factorised):
        plain, first = type(engine).step, [True]

        def step(target: Any, state: Any) -> tuple[Any, dict[str, Any]]:
            state, info = plain(lazy, target, state)
            if first[0] and info.get("checked"):
                first[0] = False
                state.converged = info["converged"] = lazy.tol > 0
            return state, info

        lazy.step = step
    try:
        return lazy.run(model, init, **kw)
    except NumericalFaultError as err:
        if isinstance(getattr(err, "partial", None), RunEnd):
            err.partial = err.partial.posterior()
        raise


def built(post: Any) -> Any:
    """``post`` itself, or the posterior of a :class:`RunEnd`."""
    return post.posterior() if isinstance(post, RunEnd) else post


def final_posterior(cvi: Any, model: Any, state: Any, end: dict[str, Any] | None, extra: dict[str, Any], *,
                    warn: bool, same_rule: bool) -> Any:
    r"""The type-II loop's posterior at the end of its last phase: ``cvi.posterior(model, state, extra)``.

    ``end`` (:meth:`~gpvi.inference.cvi.typeii.TypeII.phase`'s ``final``): the sites whose bound and gradient the
    phase's objective was at its returned point (``lam1``, ``lam2``: the best sites its inner run evaluated) and
    their ``pieces`` (:func:`gpvi.inference.cvi.steps.full_step`'s: factor, marginals, bound) where that point was
    the phase's last evaluation, else None. With ``same_rule`` (the phases' inner runs use the engine's own
    expectations, so their bound is the posterior's) the posterior is of those sites, from their pieces where at
    hand: the objective reported is then the value the phase maximised, and the factorisation, marginals and bound
    of the sites one inner step past them (``state``'s, within the inner tolerance of the same fixed point) are not
    computed again (one of the two posteriors a binary fit built). Without ``end`` or
    ``same_rule`` (the softmax's cheaper inner rule), ``state``'s sites as they are.
    """
    pieces = None
    if end is not None and same_rule:
        state.lam1, state.lam2, pieces = end["lam1"], end["lam2"], end["pieces"]
    return cvi.posterior(model, state, extra, warn=warn, pieces=pieces)
