"""gpvi: Gaussian-process inference — DSVI hyperparameter posteriors, CVI classification, ML-II and NUTS.

Architecture, top to bottom: :mod:`gpvi.datasets` -> models (:class:`GPRegression`, kernel + noise + prior over
theta) -> engines (:class:`ML2`, DSVI, CVI, NUTS) -> posteriors (:mod:`gpvi.posteriors.base`) ->
:mod:`gpvi.metrics` and plots. Importing gpvi changes no global state (no default dtype, no RNG seeding).
"""

from __future__ import annotations

import sys as _sys

from . import datasets, io, linalg
from .evaluation import metrics, plots
from .inference import schedules
from .models import likelihoods as expectations

# The public sub-modules ``gpvi.metrics``, ``gpvi.plots``, ``gpvi.schedules`` and ``gpvi.expectations`` keep their
# names (``import gpvi.metrics`` and ``from gpvi.metrics import nlpd`` work as before the package was reorganised).
for _name, _mod in (("metrics", metrics), ("plots", plots), ("schedules", schedules), ("expectations", expectations)):
    _sys.modules.setdefault(f"{__name__}.{_name}", _mod)
del _name, _mod
from .inference.dsvi.ard import DSVIARD
from .models.classification import GPClassification, LatentGP
from .sklearn import GPClassifier
from .inference.cvi.engine import CVI, CVIState, LatentPosterior
from .inference.dsvi.engine import DSVI, DSVIState
from .inference.dsvi import SGD, Adam, BlockDiagonal, Convergence, Natural
from .inference.engine import FaultPolicy
from .models.logistic import BayesianLogisticRegression
from .models.minibatch import MinibatchTarget
from .exceptions import (
    BoundWarning,
    ConvergenceWarning,
    InputScaleWarning,
    PSISWarning,
    InterruptedRunWarning,
    NotPSDError,
    NumericalFaultError,
    NumericalWarning,
)
from .inference.mcmc import HMC, NUTS, Adaptation, ConvergenceChecks, MCMCState
from .inference.ml2 import ML2
from .models.regression import GPRegression
from .posteriors.base import GaussianPosterior, PointPosterior, SamplePosterior
from .posteriors.predictive import MixturePredictive
from .inference.sk import SKExpFamily, SKGaussian
from .inference.families import Factorised, StandardMultivariateT, StandardNormal, StandardStudentT
from .evaluation.table import Table
from .models.target import Target
from .inference.infer import InferenceReport, infer
from .posteriors.weighted import WeightedPosterior

__version__ = "0.1.0"

__all__ = [
    "BayesianLogisticRegression",
    "CVI",
    "CVIState",
    "GPClassification",
    "GPClassifier",
    "LatentGP",
    "LatentPosterior",
    "DSVI",
    "DSVIARD",
    "DSVIState",
    "SGD",
    "Natural",
    "Adam",
    "Convergence",
    "BlockDiagonal",
    "FaultPolicy",
    "MinibatchTarget",
    "BoundWarning",
    "ConvergenceWarning",
    "InputScaleWarning",
    "PSISWarning",
    "Factorised",
    "GPRegression",
    "GaussianPosterior",
    "HMC",
    "Adaptation",
    "ConvergenceChecks",
    "MCMCState",
    "NUTS",
    "InterruptedRunWarning",
    "ML2",
    "MixturePredictive",
    "NotPSDError",
    "NumericalFaultError",
    "NumericalWarning",
    "PointPosterior",
    "SKExpFamily",
    "SKGaussian",
    "SamplePosterior",
    "StandardNormal",
    "StandardStudentT",
    "StandardMultivariateT",
    "Table",
    "Target",
    "WeightedPosterior",
    "InferenceReport",
    "infer",
    "datasets",
    "io",
    "expectations",
    "linalg",
    "metrics",
    "plots",
    "schedules",
    "__version__",
]
