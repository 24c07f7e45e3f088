"""Salimans & Knowles (2013) stochastic linear regression: Gaussian (Algorithm 2) and exponential-family engines."""

from .engine import SKExpFamily, SKExpFamilyResult, SKGaussian, SKState

__all__ = ["SKGaussian", "SKState", "SKExpFamily", "SKExpFamilyResult"]
