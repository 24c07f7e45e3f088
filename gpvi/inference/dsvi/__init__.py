"""DSVI (Titsias & Lazaro-Gredilla, ICML 2014) and DSVI-ARD, with DSVI's option objects.

``DSVI(optimizer=SGD(lr=0.1), convergence=Convergence(stop=False), faults=FaultPolicy(max_resample=3),
scale=BlockDiagonal([2, 3]))``: the update rules :class:`SGD`, :class:`Natural`, :class:`Adam` carry their step
sizes and schedules (:mod:`~gpvi.inference.dsvi.options`), :class:`Convergence` is the monitoring and stop rule
(:mod:`~gpvi.inference.dsvi.convergence`), :class:`~gpvi.inference.contract.FaultPolicy` is shared by the engines.

Modules: :mod:`~gpvi.inference.dsvi.engine` (:class:`DSVI`: Algorithm 1 and the engine contract),
:mod:`~gpvi.inference.dsvi.state` (the state), :mod:`~gpvi.inference.dsvi.options` (update rules and block
structure as settings), :mod:`~gpvi.inference.dsvi.updates` (their maths), :mod:`~gpvi.inference.dsvi.gradient`
(the stochastic gradient of one step), :mod:`~gpvi.inference.dsvi.convergence` (monitoring and stop rule),
:mod:`~gpvi.inference.dsvi.setup` (the initial and the resumed state, what ``optimizer="auto"`` resolves to),
:mod:`~gpvi.inference.dsvi.starts` (runs from several starts), :mod:`~gpvi.inference.dsvi.result` (what is
returned, the final bound estimate), :mod:`~gpvi.inference.dsvi.ard` (DSVI-ARD).
"""

from ..contract import FaultPolicy
from .ard import ARDTerm, DSVIARD
from .convergence import Convergence
from .engine import DSVI, DSVIState, EntropyTerm, GradientEstimate
from .options import SGD, Adam, BlockDiagonal, Natural

__all__ = ["DSVI", "DSVIARD", "DSVIState", "SGD", "Natural", "Adam", "Convergence", "BlockDiagonal", "FaultPolicy",
           "ARDTerm", "EntropyTerm", "GradientEstimate"]
