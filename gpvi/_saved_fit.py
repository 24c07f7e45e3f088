r"""The fit object of :mod:`gpvi.io`: :class:`SavedFit`, what :func:`gpvi.io.load_fit` returns and
:func:`gpvi.io.save_fit` writes, with predictions at raw (unstandardised) inputs in the CSV's units.

Names: ``x_mean``/``x_std`` and ``y_mean``/``y_std`` (the standardisation of the CSV's inputs and target: the model
sees :math:`(x - \bar x)/s_x` and :math:`(y - \bar y)/s_y`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .validation import check_feature_columns

__all__ = ["SavedFit", "KINDS"]

KINDS = ("regression", "classification", "generalised_regression")
"""The kinds of fit a file can hold."""


@dataclass
class SavedFit:
    r"""A fit saved by :func:`gpvi.io.save_fit` (``gpvi fit-regression/fit-classifier --save FILE``), read by
    :func:`gpvi.io.load_fit`.

    Attributes
    ----------
    kind : {"regression", "classification", "generalised_regression"}
        ``"generalised_regression"``: a :class:`gpvi.GPGeneralisedRegression` fitted by CVI (counts, outliers,
        proportions; ``gpvi fit-regression --likelihood ...``).
    method : str
        ``"ml2"``, ``"dsvi"``, ``"nuts"`` (or another engine's name) for regression; ``"cvi-full"`` /
        ``"cvi-stochastic"`` for classification; ``"cvi-type2"`` (or ``"cvi"``) for a generalised regression.
    features : list of str
        Input column names, in the order :meth:`predict` expects.
    target : str
        Name of the target (label) column.
    x_mean, x_std : numpy.ndarray of shape (d,)
        Standardisation of the inputs: the model sees :math:`(x - \bar x) / s_x`.
    y_mean, y_std : float
        Standardisation of the target (regression; a generalised regression with a real-valued likelihood,
        Student-t or Laplace; 0 and 1 otherwise: counts and proportions are modelled as they are).
    posterior : posterior or None
        Regression: the posterior over log-hyperparameters; its ``target`` is a :class:`gpvi.GPRegression` on the
        standardised training data, so ``posterior.predict`` and ``posterior.summary()`` work. Generalised
        regression: the CVI :class:`~gpvi.posteriors.latent.LatentPosterior`, whose ``model`` is the
        :class:`gpvi.GPGeneralisedRegression` with its likelihood and that likelihood's parameters.
    classifier : GPClassifier or None
        Classification: the fitted estimator (it expects standardised inputs; use :meth:`predict`).
    extra : dict
        Plain data stored with the fit (strings, numbers, lists, dicts).
    """

    kind: str
    method: str
    features: list[str]
    target: str
    x_mean: Any
    x_std: Any
    y_mean: float = 0.0
    y_std: float = 1.0
    posterior: Any = None
    classifier: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def classes(self) -> list[Any]:
        """The class labels (classification), sorted; ``predict_proba`` columns follow this order."""
        if self.kind != "classification":
            raise TypeError(f"classes exist only for classification fits; this fit is a {self.kind}")
        return self.classifier.classes_.tolist()

    def _standardised(self, X: Any) -> np.ndarray:
        """Check ``X`` against the fit's features (a DataFrame's columns by name, in order) and standardise it."""
        check_feature_columns(X, self.features, "X", what="the fit")
        d = len(self.features)
        Xa = np.asarray(X.detach().cpu() if isinstance(X, torch.Tensor) else X, dtype=np.float64)
        if Xa.ndim != 2:
            raise ValueError(f"X must be 2-D of shape (n, {d}); got {Xa.ndim}-D shape {Xa.shape}")
        if Xa.shape[1] != d:
            raise ValueError(f"X has {Xa.shape[1]} columns but the fit was made with {d} features "
                             f"({', '.join(self.features)})")
        if Xa.shape[0] == 0:
            raise ValueError("X has no rows")
        if not np.isfinite(Xa).all():
            raise ValueError("X contains NaN or infinite values")
        return (Xa - np.asarray(self.x_mean, dtype=np.float64)) / np.asarray(self.x_std, dtype=np.float64)

    def predict(self, X: Any, num_draws: int = 200, *, seed: int | None = 0,
                generator: torch.Generator | None = None) -> Any:
        r"""Predict at raw (unstandardised) inputs.

        Parameters
        ----------
        X : array-like of shape (n, d)
            Columns in the order of :attr:`features`, in the CSV's units (a DataFrame: those columns by name, in that
            order).
        num_draws : int
            Regression: hyperparameter draws of the mixture predictive (DSVI/NUTS; ignored for ML-II and for a
            generalised regression).
        seed, generator
            Randomness of those draws (default ``seed=0``: reproducible).

        Returns
        -------
        (mean, var) : tuple of numpy.ndarray of shape (n,)
            Regression: mean and variance of the predictive of :math:`y_*` in the CSV's units,
            :math:`\bar y + s_y m_*` and :math:`s_y^2 v_*` (a mixture over ``num_draws`` draws of theta).
            Generalised regression: the same of the observation predictive
            :math:`p(y_* \mid \mathcal D) = \int p(y_* \mid f_*)\,q(f_*)\,df_*`
            (:class:`~gpvi.posteriors.observation.ObservationPredictive`; for counts :math:`\mathbb E[y_*]` and
            :math:`\operatorname{Var}[y_*]` of the counts).
        p : numpy.ndarray of shape (n,) or (n, K)
            Classification with two classes: probability of the larger label ``classes[1]``; with K > 2 classes:
            the class probabilities, columns in :attr:`classes` order (as :meth:`predict_proba`).

        Raises
        ------
        ValueError
            ``X`` not 2-D, with a number of columns other than ``len(features)`` (the message gives both numbers),
            empty, or non-finite; a DataFrame whose columns are not :attr:`features` in that order.
        """
        Xs = self._standardised(X)
        if self.kind == "classification":
            proba = self.classifier.predict_proba(Xs)
            return proba[:, 1] if proba.shape[1] == 2 else proba
        if self.kind == "generalised_regression":
            pred = self.posterior.predict(Xs)
        else:
            pred = self.posterior.predict(Xs, num_draws=num_draws, seed=seed, generator=generator)
        mean = pred.mean.detach().cpu().numpy() * self.y_std + self.y_mean
        var = pred.var.detach().cpu().numpy() * self.y_std ** 2
        return mean, var

    def interval(self, X: Any, level: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        r"""Generalised regression: the central predictive interval of :math:`y_*` at raw inputs, in the CSV's units.

        The :math:`(1 - \text{level})/2` and :math:`(1 + \text{level})/2` quantiles of the observation predictive
        (:meth:`~gpvi.posteriors.observation.ObservationPredictive.interval`; integers for counts), mapped by
        :math:`\bar y + s_y\,\cdot` (an increasing map, so quantiles stay quantiles).

        Parameters
        ----------
        X : array-like of shape (n, d)
            As for :meth:`predict`.
        level : float
            Mass of the interval, in (0, 1).

        Returns
        -------
        lower, upper : numpy.ndarray of shape (n,)

        Raises
        ------
        TypeError
            The fit is not a generalised regression.
        ValueError
            As for :meth:`predict`; ``level`` outside (0, 1).
        """
        if self.kind != "generalised_regression":
            raise TypeError(f"interval needs a generalised-regression fit (gpvi fit-regression --likelihood ...); "
                            f"this fit is a {self.kind}")
        lo, hi = self.posterior.predict(self._standardised(X)).interval(level)
        return (lo.detach().cpu().numpy() * self.y_std + self.y_mean,
                hi.detach().cpu().numpy() * self.y_std + self.y_mean)

    def predict_proba(self, X: Any) -> np.ndarray:
        """Classification: class probabilities at raw inputs ``X`` of shape (n, d).

        Returns
        -------
        numpy.ndarray of shape (n, K)
            Columns in :attr:`classes` order (two classes: :math:`[1 - p_*, p_*]`).

        Raises
        ------
        TypeError
            The fit is not a classification.
        ValueError
            As for :meth:`predict`.
        """
        if self.kind != "classification":
            raise TypeError(f"predict_proba needs a classification fit; this fit is a {self.kind} (use predict)")
        return self.classifier.predict_proba(self._standardised(X))
