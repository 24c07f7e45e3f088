"""Salimans & Knowles (2013) stochastic linear regression: Gaussian (Algorithm 2) and exponential-family engines.

* :mod:`~gpvi.inference.sk.engine` -- :class:`SKGaussian` (settings, init, step; run by the driver);
* :mod:`~gpvi.inference.sk.options` -- its option groups :class:`SKSchedule`, :class:`HessianSource`,
  :class:`SKFaultPolicy`;
* :mod:`~gpvi.inference.sk.state` -- :class:`SKState`;
* :mod:`~gpvi.inference.sk.estimates` -- the regression statistics and the final bound estimate;
* :mod:`~gpvi.inference.sk.start` -- the initial mean, scale, precision and statistics, and the Hessian probe;
* :mod:`~gpvi.inference.sk.result` -- the returned Gaussian, the window-split drift check, the final bound;
* :mod:`~gpvi.inference.sk.expfamily` -- Algorithm 1 (:class:`SKExpFamily`) and the families :class:`Exponential`,
  :class:`Gamma`, :class:`Normal`.
"""

from .engine import SKGaussian
from .expfamily import Exponential, Gamma, Normal, SKExpFamily, SKExpFamilyResult
from .options import HessianSource, SKFaultPolicy, SKSchedule
from .state import SKState

__all__ = ["SKGaussian", "SKState", "SKExpFamily", "SKExpFamilyResult", "SKSchedule", "HessianSource",
           "SKFaultPolicy", "Exponential", "Gamma", "Normal"]
