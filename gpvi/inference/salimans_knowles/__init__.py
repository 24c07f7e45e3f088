"""Salimans & Knowles (2013) stochastic linear regression: Gaussian (Algorithm 2) and exponential-family engines.

* :mod:`~gpvi.inference.salimans_knowles.engine` -- :class:`SKGaussian` (settings, init, step; run by the driver);
* :mod:`~gpvi.inference.salimans_knowles.options` -- its option groups :class:`SKSchedule`, :class:`HessianSource`,
  :class:`SKFaultPolicy`;
* :mod:`~gpvi.inference.salimans_knowles.state` -- :class:`SKState`;
* :mod:`~gpvi.inference.salimans_knowles.estimates` -- the regression statistics and the final bound estimate;
* :mod:`~gpvi.inference.salimans_knowles.start` -- the initial mean, scale, precision and statistics, and the Hessian probe;
* :mod:`~gpvi.inference.salimans_knowles.result` -- the returned Gaussian, the window-split drift check, the final bound;
* :mod:`~gpvi.inference.salimans_knowles.expfamily` -- Algorithm 1 (:class:`SKExpFamily`) and the families :class:`Exponential`,
  :class:`Gamma`, :class:`Normal`.
"""

from .engine import SKGaussian
from .expfamily import Exponential, Gamma, Normal, SKExpFamily, SKExpFamilyResult
from .options import HessianSource, SKFaultPolicy, SKSchedule
from .state import SKState

__all__ = ["SKGaussian", "SKState", "SKExpFamily", "SKExpFamilyResult", "SKSchedule", "HessianSource",
           "SKFaultPolicy", "Exponential", "Gamma", "Normal"]
