"""gpvi: Gaussian-process inference — DSVI hyperparameter posteriors, CVI classification, ML-II and NUTS.

The names a user needs are here; everything else lives in the sub-packages, which follow the data down the tree:
:mod:`gpvi.datasets` -> :mod:`gpvi.models` (kernel + likelihood + prior over theta, a log joint) ->
:mod:`gpvi.inference` (the engines) -> :mod:`gpvi.posteriors` -> :mod:`gpvi.evaluation` (metrics, plots).
Warnings and errors are in :mod:`gpvi.exceptions`. Importing gpvi changes nothing in the process: it sets no default
dtype, seeds no RNG and leaves glibc malloc's thresholds alone (:mod:`gpvi.allocator` sets them on request: its
:func:`~gpvi.allocator.set_malloc_thresholds`, ``GPVI_MALLOC_THRESHOLDS=1`` at import, or the ``gpvi`` command in its
own process). :class:`GPClassifier` is imported on first use, with scikit-learn.
"""

from __future__ import annotations

import os as _os
from typing import TYPE_CHECKING, Any

if _os.environ.get("GPVI_MALLOC_THRESHOLDS", "").strip() == "1":     # asked for (gpvi.allocator), before any fit
    from .allocator import set_malloc_thresholds as _set_malloc_thresholds

    _set_malloc_thresholds()

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
from .models.generalised import GPGeneralisedRegression
from .models.logistic import BayesianLogisticRegression
from .models.regression import GPRegression
from .models.target import Target
from .posteriors import GaussianPosterior, LatentPosterior, PointPosterior, SamplePosterior, WeightedPosterior

if TYPE_CHECKING:
    from .sklearn import GPClassifier

__version__ = "0.1.0"

__all__ = [
    # models
    "GPRegression", "GPClassification", "GPGeneralisedRegression", "BayesianLogisticRegression", "Target",
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


def __getattr__(name: str) -> Any:
    """``gpvi.GPClassifier`` on first use: it imports scikit-learn, which ``import gpvi`` does not need."""
    if name == "GPClassifier":
        from .sklearn import GPClassifier

        globals()[name] = GPClassifier
        return GPClassifier
    raise AttributeError(f"module 'gpvi' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
