"""DSVI (Titsias & Lazaro-Gredilla, ICML 2014) and DSVI-ARD."""

from .ard import ARDTerm, DSVIARD
from .engine import DSVI, DSVIState, EntropyTerm, GradientEstimate, finite_difference_hessian, laplace_approximation

__all__ = ["DSVI", "DSVIARD", "DSVIState", "ARDTerm", "EntropyTerm", "GradientEstimate", "laplace_approximation",
           "finite_difference_hessian"]
