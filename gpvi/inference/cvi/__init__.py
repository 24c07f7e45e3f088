"""CVI (Khan & Lin, AISTATS 2017) for latent GP models: full-batch and doubly stochastic single-site steps.

* :mod:`~gpvi.inference.cvi.engine` -- :class:`CVI`, the engine (settings, init, step, result; run by the driver);
* :mod:`~gpvi.inference.cvi.options` -- its small settings objects (:class:`MonteCarlo`, :class:`SingleSite`), the
  stop rule and the start (:class:`init_to_sites`);
* :mod:`~gpvi.inference.cvi.state` -- :class:`CVIState`;
* :mod:`~gpvi.numerics.sites` -- site algebra and the site ELBO;
* :mod:`~gpvi.inference.cvi.steps` -- the full-batch and the single-site step;
* :mod:`~gpvi.inference.cvi.typeii` -- :class:`TypeII`, the outer loop that learns the kernel hyperparameters;
* :mod:`~gpvi.inference.cvi.multiclass`, :mod:`~gpvi.inference.cvi.multiclass_sites`,
  :mod:`~gpvi.inference.cvi.multiclass_single` -- :class:`MulticlassCVI` (K latent GPs, softmax or robust-max,
  class-factorised sites; full-batch and single-site steps);
* :mod:`~gpvi.inference.cvi.multiclass_typeii` -- its MAP-II loop :class:`MulticlassTypeII`;
* :mod:`~gpvi.inference.cvi.bayes` -- :class:`FullyBayesianCVI`: a Gaussian q(theta) by DSVI on the CVI bound.

The posterior is :class:`gpvi.posteriors.latent.LatentPosterior`.
"""

from .engine import CVI
from .options import MonteCarlo, SingleSite, SitesConverged, init_to_sites, num_steps_for_sweeps
from .state import CVIState
from .typeii import TypeII, theta_objective
from .multiclass import MulticlassCVI
from .multiclass_typeii import MulticlassTypeII
from .multiclass_sites import MulticlassCVIState
from .bayes import FullyBayesianCVI

__all__ = ["CVI", "CVIState", "MonteCarlo", "SingleSite", "SitesConverged", "init_to_sites", "num_steps_for_sweeps",
           "TypeII", "theta_objective", "MulticlassCVI", "MulticlassTypeII", "MulticlassCVIState", "FullyBayesianCVI"]
