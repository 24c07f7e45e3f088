r"""CVI runs whose posterior is built only if it is used: the engine runs of :class:`~gpvi.inference.cvi.TypeII`.

A CVI run ends by building its posterior (:meth:`gpvi.CVI.posterior` through the driver's ``result``: the Cholesky
factor of :math:`K + S`, the marginals and the bound, one :math:`O(N^3)` evaluation). Inside the type-II loop a run
is almost always followed by a hyperparameter phase, which needs only the run's state, and the loop's answer is the
posterior of the phase's end; so the first run's posterior and those of the runs between phases were built and
dropped (two of the three posteriors of a binary fit at N = 2,000, about 0.2 s each, 2-3% of the fit:
``benchmarks/studies/results/typeii_trace_h59d.md``). :func:`run_deferred` runs the engine the same way and returns
a :class:`RunEnd` (the state and the run's report); :meth:`RunEnd.posterior` builds the posterior the run would have
returned, bit for bit, where the loop does end on a run (interrupted, not converged, Ctrl-C in a phase).
"""

from __future__ import annotations

import copy
from typing import Any

from ...exceptions import NumericalFaultError
from .steps import run_result

__all__ = ["RunEnd", "run_deferred", "built"]


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


def run_deferred(engine: Any, model: Any, init: Any = None, **kw: Any) -> RunEnd:
    """``engine.run(model, init, **kw)`` returning a :class:`RunEnd` instead of the posterior (a copy of ``engine``
    runs, whose ``result`` keeps the state and report). A run that ends on
    :class:`~gpvi.exceptions.NumericalFaultError` raises it with ``err.partial`` the posterior, as ``engine.run``
    does."""
    lazy = copy.copy(engine)
    lazy.result = lambda target, state, report: RunEnd(lazy, target, state, report)
    try:
        return lazy.run(model, init, **kw)
    except NumericalFaultError as err:
        if isinstance(getattr(err, "partial", None), RunEnd):
            err.partial = err.partial.posterior()
        raise


def built(post: Any) -> Any:
    """``post`` itself, or the posterior of a :class:`RunEnd`."""
    return post.posterior() if isinstance(post, RunEnd) else post
