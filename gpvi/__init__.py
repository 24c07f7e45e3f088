"""gpvi: Gaussian-process inference — DSVI hyperparameter posteriors, CVI classification, ML-II and NUTS.

The names a user needs are here; everything else lives in the sub-packages, which follow the data down the tree:
:mod:`gpvi.datasets` -> :mod:`gpvi.models` (kernel + likelihood + prior over theta, a log joint) ->
:mod:`gpvi.inference` (the engines) -> :mod:`gpvi.posteriors` -> :mod:`gpvi.evaluation` (metrics, plots).
Warnings and errors are in :mod:`gpvi.exceptions`. Importing gpvi sets no default dtype and seeds no RNG; it sets
glibc malloc's two thresholds for large temporaries (:mod:`gpvi.allocator`: otherwise the first fit in a process
runs slower than a repeated one; ``GPVI_MALLOC_THRESHOLDS=0`` opts out).
"""

from __future__ import annotations

from .allocator import set_malloc_thresholds as _set_malloc_thresholds

_set_malloc_thresholds()          # before any engine allocates (gpvi.allocator; GPVI_MALLOC_THRESHOLDS=0 opts out)

from . import datasets, io  # noqa: E402
from .evaluation import metrics, plots
from .exceptions import ConvergenceWarning, NotPSDError, NumericalWarning
from .inference.cvi.engine import CVI
from .inference.dsvi.engine import DSVI
from .inference.infer import infer
from .inference.mcmc import HMC, NUTS
from .inference.ml2 import ML2
from .inference.salimans_knowles import SKGaussian
from .models.classification import GPClassification
from .models.logistic import BayesianLogisticRegression
from .models.regression import GPRegression
from .models.target import Target
from .posteriors import GaussianPosterior, LatentPosterior, PointPosterior, SamplePosterior, WeightedPosterior
from .sklearn import GPClassifier

__version__ = "0.1.0"

__all__ = [
    # models
    "GPRegression", "GPClassification", "BayesianLogisticRegression", "Target",
    # engines
    "ML2", "DSVI", "CVI", "NUTS", "HMC", "SKGaussian", "infer",
    # scikit-learn estimator
    "GPClassifier",
    # posteriors
    "PointPosterior", "GaussianPosterior", "SamplePosterior", "LatentPosterior", "WeightedPosterior",
    # errors users catch or filter
    "NotPSDError", "NumericalWarning", "ConvergenceWarning",
    # modules
    "datasets", "metrics", "plots", "io",
    "__version__",
]
