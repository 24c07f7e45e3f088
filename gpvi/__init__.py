"""gpvi: Gaussian-process inference — DSVI hyperparameter posteriors, CVI classification, ML-II and NUTS.

Architecture, top to bottom: :mod:`gpvi.datasets` -> models (:class:`GPRegression`, kernel + noise + prior over
theta) -> engines (:class:`ML2`, DSVI, CVI, NUTS) -> posteriors (:mod:`gpvi.posterior`) ->
:mod:`gpvi.metrics` and plots. Importing gpvi changes no global state (no default dtype, no RNG seeding).
"""

from __future__ import annotations

from . import datasets, expectations, linalg, metrics, plots, schedules
from .ard import DSVIARD
from .classification import GPClassification, LatentGP
from .classifier import GPClassifier
from .cvi import CVI, CVIState, LatentPosterior
from .dsvi import DSVI, DSVIState
from .logistic import BayesianLogisticRegression
from .subsample import MinibatchTarget
from .exceptions import (
    ConvergenceWarning,
    InterruptedRunWarning,
    NotPSDError,
    NumericalFaultError,
    NumericalWarning,
)
from .hmc import HMC, NUTS, MCMCState
from .ml2 import ML2
from .model import GPRegression
from .posterior import GaussianPosterior, PointPosterior, SamplePosterior
from .predictive import MixturePredictive
from .sk import SKExpFamily, SKGaussian
from .standard import Factorised, StandardNormal, StandardStudentT
from .table import Table
from .target import Target

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
    "MinibatchTarget",
    "ConvergenceWarning",
    "Factorised",
    "GPRegression",
    "GaussianPosterior",
    "HMC",
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
    "Table",
    "Target",
    "datasets",
    "expectations",
    "linalg",
    "metrics",
    "plots",
    "schedules",
    "__version__",
]
