"""CVI (Khan & Lin, AISTATS 2017) for GP classification: full-batch and doubly stochastic single-site steps."""

from .engine import CVI, CVIState, LatentPosterior, site_elbo

__all__ = ["CVI", "CVIState", "LatentPosterior", "site_elbo"]
