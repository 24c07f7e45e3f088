"""Posteriors: what every engine returns (points, Gaussians, draws) and their predictive distributions."""

from .base import GaussianPosterior, PointPosterior, Posterior, SamplePosterior
from .predictive import MixturePredictive

__all__ = ["Posterior", "PointPosterior", "GaussianPosterior", "SamplePosterior", "MixturePredictive"]
