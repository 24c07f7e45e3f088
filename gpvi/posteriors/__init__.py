"""Posteriors: what every engine returns (points, Gaussians, draws, CVI's latent GP) and their predictives.

All share the surface of :class:`~gpvi.posteriors.base.Posterior` (``names``, ``dim``, ``mean``, ``std``, ``sample``,
``quantile``, ``marginals``, ``summary``, ``predict``, ``to_arviz``, ``state_dict`` / ``from_state_dict``, ``info``: a
:class:`~gpvi.posteriors.info.RunInfo`);
:func:`posterior_from_state_dict` (or ``Posterior.from_state_dict``) rebuilds any of them from its ``state_dict()``.
"""

from .base import STATE_VERSION, Posterior, posterior_from_state_dict
from .gaussian import GaussianPosterior
from .info import RunInfo
from .latent import LatentPosterior
from .mixture import GaussianMixture
from .observation import ObservationPredictive
from .point import PointPosterior
from .samples import SamplePosterior
from .weighted import WeightedPosterior, psis

__all__ = ["Posterior", "PointPosterior", "GaussianPosterior", "SamplePosterior", "LatentPosterior",
           "WeightedPosterior", "GaussianMixture", "psis", "posterior_from_state_dict",
           "RunInfo", "STATE_VERSION", "ObservationPredictive"]
