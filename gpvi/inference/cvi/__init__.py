"""CVI (Khan & Lin, AISTATS 2017) for latent GP models with one or K latent functions.

* :mod:`~gpvi.inference.cvi.engine` -- :class:`CVI`, the engine for one latent function (binary) and for K
  class-factorised ones (softmax, robust-max): settings, init, step, result; run by the driver;
* :mod:`~gpvi.inference.cvi.options` -- its small settings objects (:class:`MonteCarlo`, :class:`SingleSite`), the
  stop rule and the start (:class:`init_to_sites`);
* :mod:`~gpvi.inference.cvi.state` -- :class:`CVIState`, sites (N,) or (N, K);
* :mod:`~gpvi.inference.cvi.steps` -- the full-batch and the single-site step, for one latent function or K;
  their site algebra is :mod:`gpvi.numerics.sites`;
* :mod:`~gpvi.inference.cvi.inner`, :mod:`~gpvi.inference.cvi.typeii` -- the ELBO-monotone inner runs and the
  profiled objective; :class:`TypeII`, the outer loop that learns the kernel hyperparameters;
* :mod:`~gpvi.inference.cvi.likelihood_params` -- :class:`LikelihoodTypeII`: the likelihood's parameters (Student-t,
  negative binomial, Laplace, Beta) with the kernel's, alternating an M-step with :class:`TypeII`;
* :mod:`~gpvi.inference.cvi.bayes` -- :class:`FullyBayesianCVI`: a Gaussian q(theta) on the EP evidence or the CVI
  bound (:mod:`~gpvi.inference.cvi.ep_evidence`, :mod:`~gpvi.inference.cvi.bound`).

The posterior is :class:`gpvi.posteriors.latent.LatentPosterior`.
"""

from .engine import CVI
from .options import MonteCarlo, SingleSite, SitesConverged, init_to_sites, num_steps_for_sweeps
from .state import CVIState
from .typeii import TypeII
from .bayes import FullyBayesianCVI
from .likelihood_params import LikelihoodTypeII

__all__ = ["CVI", "CVIState", "MonteCarlo", "SingleSite", "SitesConverged", "init_to_sites", "num_steps_for_sweeps",
           "TypeII", "FullyBayesianCVI", "LikelihoodTypeII"]
