"""Regression data sets: Boston housing, Bodyfat, the pendulum."""

from __future__ import annotations

import numpy as np

from ._dataset import Dataset, _build, _check_bool, _check_seed, _fill_doc, _random_split
from ._files import _columns, _inputs, _random_regression


@_fill_doc
def load_boston(seed: int = 0, test_fraction: float = 0.1) -> Dataset:
    """Boston housing (Harrison & Rubinfeld 1978): 506 rows, 13 inputs, target MEDV.

    The target is the median value of owner-occupied homes in $1000s; it is censored
    at 50 (16 rows have ``y == 50``). This is the original, uncorrected data (as in
    ``MASS::Boston``). The ``black`` column is the original variable, kept unchanged
    for comparability with published results.

    Parameters
    ----------
    %(seed)s
    test_fraction : float in (0, 1), default 0.1
        Fraction of rows in the test set; ``floor(test_fraction * 506 + 0.5)`` rows
        are used (51 for the default: 455 train / 51 test).

    %(returns_regression)s

    References
    ----------
    Harrison, D. and Rubinfeld, D. L. (1978). Hedonic prices and the demand for clean
    air. *J. Environ. Economics & Management* 5, 81-102.

    Examples
    --------
    >>> from gpvi.datasets import load_boston
    >>> ds = load_boston(seed=0)
    >>> ds.n_train, ds.n_test, ds.feature_names[-1]
    (455, 51, 'lstat')
    """
    feature_names = _inputs("boston.csv", exclude=("y",))
    return _random_regression("boston", "boston.csv", feature_names, seed, test_fraction)


@_fill_doc
def load_bodyfat(
    seed: int = 0, test_fraction: float = 0.1, include_density: bool = True
) -> Dataset:
    """StatLib bodyfat (Penrose et al. 1985): 252 men, target percent body fat (Siri).

    Inputs are ``Density`` (g/cm^3), ``Age`` (years), ``Weight`` (lbs), ``Height``
    (inches) and ten circumferences in cm (``Neck`` ... ``Wrist``).

    Because the target is computed from density by Siri's equation,
    ``y = 495 / Density - 450``, keeping ``Density`` as an input makes the task nearly
    trivial. ``include_density=True`` (the default) nevertheless reproduces the
    14-input task of the DSVI paper (Titsias & Lazaro-Gredilla 2014, Table 5; there are
    only 13 other inputs); ``include_density=False`` gives the realistic 13-input task.

    The known anomalous rows of the original data are **kept unchanged**. In the
    1-based StatLib case order (``train_indices``/``test_indices`` are 0-based, so
    subtract 1):

    * case 42: Height 29.5 inches;
    * cases 48, 76 and 96: Density and body fat disagree (a digit error in Density),
      which matters with ``include_density=True``;
    * case 182: body fat 0 (a negative Siri estimate truncated to 0).

    Parameters
    ----------
    %(seed)s
    test_fraction : float in (0, 1), default 0.1
        Fraction of rows in the test set; ``floor(test_fraction * 252 + 0.5)`` rows
        (25 for the default: 227 train / 25 test).
    include_density : bool, default True
        Keep the ``Density`` column as the first input (14 inputs) or drop it (13).

    %(returns_regression)s

    References
    ----------
    Penrose, K., Nelson, A. and Fisher, A. (1985). Generalized body composition
    prediction equation for men using simple measurement techniques. *Medicine and
    Science in Sports and Exercise* 17(2), 189.

    Titsias, M. K. and Lazaro-Gredilla, M. (2014). Doubly stochastic variational Bayes
    for non-conjugate inference. *ICML*.

    Examples
    --------
    >>> from gpvi.datasets import load_bodyfat
    >>> load_bodyfat().n_features, load_bodyfat(include_density=False).n_features
    (14, 13)
    >>> bad = [41, 47, 75, 95, 181]          # cases 42, 48, 76, 96, 182, 0-based
    >>> ds = load_bodyfat(seed=0)
    >>> sorted(set(bad) & set(ds.test_indices.tolist()))   # bad rows in this test set
    []
    """
    include_density = _check_bool(include_density, "include_density")
    exclude = ("y",) if include_density else ("y", "Density")
    feature_names = _inputs("bodyfat.csv", exclude=exclude)
    return _random_regression("bodyfat", "bodyfat.csv", feature_names, seed, test_fraction)


@_fill_doc
def load_pendulum(seed: int = 0, n_train: int = 315) -> Dataset:
    """Pendulum (Lazaro-Gredilla et al. 2010): 630 rows, 9 inputs, a simulated pendulum.

    The target is the change in angular velocity; the meanings of the inputs ``x1`` ...
    ``x9`` are not recorded. The SSGP paper used 315 training and 315 test points, but
    its split is not recorded in this copy, so this loader draws a seeded random split
    of ``n_train`` training rows (315 by default); results are therefore not exactly
    comparable with the paper's. Every column of this copy was centred (mean 0 over all
    630 rows) but not scaled. The file's ``fold`` column (10-fold CV folds of the
    ``uci_datasets`` collection) is not used.

    Parameters
    ----------
    %(seed)s
    n_train : int in [1, 629], default 315
        Number of training rows; the other ``630 - n_train`` rows are the test set.

    %(returns_regression)s

    References
    ----------
    Lazaro-Gredilla, M., Quinonero-Candela, J., Rasmussen, C. E. and Figueiras-Vidal,
    A. R. (2010). Sparse spectrum Gaussian process regression. *JMLR* 11, 1865-1881.

    Examples
    --------
    >>> from gpvi.datasets import load_pendulum
    >>> ds = load_pendulum(seed=0)
    >>> ds.n_train, ds.n_test, ds.split
    (315, 315, 'random 315/315 seed=0')
    """
    seed = _check_seed(seed)
    feature_names = _inputs("pendulum.csv", exclude=("y", "fold"))
    y = _columns("pendulum.csv", ["y"])[:, 0]
    n = len(y)
    if isinstance(n_train, (bool, np.bool_)) or not isinstance(n_train, (int, np.integer)):
        raise TypeError(f"n_train must be an int in [1, {n - 1}]; got {n_train!r}")
    if not 1 <= n_train <= n - 1:
        raise ValueError(f"n_train must be in [1, {n - 1}]; got {n_train}")
    n_train = int(n_train)
    train, test = _random_split(n, n - n_train, seed)
    return _build(
        name="pendulum",
        task="regression",
        X=_columns("pendulum.csv", feature_names),
        y=y,
        feature_names=feature_names,
        train=train,
        test=test,
        seed=seed,
        split=f"random {n_train}/{n - n_train} seed={seed}",
    )
