"""Bundled real data sets, returned as standardised float64 train/test splits.

Every loader returns a frozen :class:`Dataset`. The CSV files ship inside the package
(``gpvi/datasets/data/``, located with :mod:`importlib.resources`) and are never
downloaded; ``data/PROVENANCE.md`` says where each one comes from, with SHA-256 sums.
Breast cancer is read from scikit-learn's bundled copy (optional dependency).

==============  ==============  =====  ==  ========================================
name            task            N      D   default split (train / test)
==============  ==============  =====  ==  ========================================
boston          regression      506    13  random 90/10, seed=0: 455 / 51
bodyfat         regression      252    14  random 90/10, seed=0: 227 / 25 (13 w/o Density)
pendulum        regression      630    9   random, n_train=315, seed=0: 315 / 315
pima            classification  532    7   original (MASS Pima.tr / Pima.te): 200 / 332
ionosphere      classification  351    34  random stratified 70/30, seed=0: 246 / 105
sonar           classification  208    60  random stratified 70/30, seed=0: 146 / 62
ripley          classification  1250   2   original (MASS synth.tr / synth.te): 250 / 1000
breast_cancer   classification  569    30  random stratified 70/30, seed=0: 398 / 171
==============  ==============  =====  ==  ========================================

Split rule: a random split puts ``floor(test_fraction * N + 0.5)`` rows (round half up)
in the test set, chosen with ``numpy.random.default_rng(seed).permutation``; the global
numpy and torch random states are never used. Inputs (and regression targets) are
standardised with the training rows' mean and population standard deviation; see
:class:`Dataset`.

Examples
--------
>>> from gpvi import datasets
>>> ds = datasets.load("pima")
>>> ds
Dataset('pima', classification, train 200 x 7, test 332 x 7, split='original')
>>> datasets.load_boston(seed=1).split
'random 90/10 seed=1'
"""

from __future__ import annotations

import csv
import functools
import io
from importlib import resources
from typing import Any, Callable

import numpy as np

from ._dataset import (
    Dataset,
    _build,
    _check_bool,
    _check_fraction,
    _check_seed,
    _n_test_rows,
    _percent,
    _random_split,
)

__all__ = [
    "Dataset",
    "load",
    "load_bodyfat",
    "load_boston",
    "load_breast_cancer",
    "load_ionosphere",
    "load_pendulum",
    "load_pima",
    "load_ripley",
    "load_sonar",
]

#: 1-based StatLib case numbers of the known anomalous Bodyfat rows (kept in the data).
_BODYFAT_BAD_CASES = (42, 48, 76, 96, 182)


@functools.lru_cache(maxsize=None)
def _read_csv(filename: str) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """Header and data rows (as strings) of a bundled CSV file; cached, immutable."""
    text = resources.files(__name__).joinpath("data").joinpath(filename).read_text(encoding="utf-8")
    rows = [tuple(row) for row in csv.reader(io.StringIO(text, newline="")) if row]
    return rows[0], tuple(rows[1:])


def _columns(filename: str, names: tuple[str, ...] | list[str]) -> np.ndarray:
    """The named numeric columns of a bundled CSV file, as a float64 array (N, len(names))."""
    header, rows = _read_csv(filename)
    idx = [header.index(name) for name in names]
    return np.array([[float(row[j]) for j in idx] for row in rows], dtype=np.float64)


def _strings(filename: str, name: str) -> np.ndarray:
    header, rows = _read_csv(filename)
    j = header.index(name)
    return np.array([row[j] for row in rows])


def _inputs(filename: str, exclude: tuple[str, ...]) -> tuple[str, ...]:
    header, _ = _read_csv(filename)
    return tuple(name for name in header if name not in exclude)


def _random_regression(
    name: str,
    filename: str,
    feature_names: tuple[str, ...],
    seed: Any,
    test_fraction: Any,
) -> Dataset:
    seed = _check_seed(seed)
    test_fraction = _check_fraction(test_fraction)
    X = _columns(filename, feature_names)
    y = _columns(filename, ["y"])[:, 0]
    train, test = _random_split(len(y), _n_test_rows(len(y), test_fraction), seed)
    split = f"random {_percent(1.0 - test_fraction)}/{_percent(test_fraction)} seed={seed}"
    return _build(
        name=name,
        task="regression",
        X=X,
        y=y,
        feature_names=feature_names,
        train=train,
        test=test,
        seed=seed,
        split=split,
    )


def _random_classification(
    name: str,
    X: np.ndarray,
    y: np.ndarray,
    feature_names: tuple[str, ...],
    seed: Any,
    test_fraction: Any,
    stratify: Any,
) -> Dataset:
    seed = _check_seed(seed)
    test_fraction = _check_fraction(test_fraction)
    stratify = _check_bool(stratify, "stratify")
    n_test = _n_test_rows(len(y), test_fraction)
    train, test = _random_split(len(y), n_test, seed, labels=y if stratify else None)
    kind = "random stratified" if stratify else "random"
    split = f"{kind} {_percent(1.0 - test_fraction)}/{_percent(test_fraction)} seed={seed}"
    return _build(
        name=name,
        task="classification",
        X=X,
        y=y,
        feature_names=feature_names,
        train=train,
        test=test,
        seed=seed,
        split=split,
    )


def _original_classification(name: str, filename: str) -> Dataset:
    feature_names = _inputs(filename, exclude=("split", "label"))
    part = _strings(filename, "split")
    return _build(
        name=name,
        task="classification",
        X=_columns(filename, feature_names),
        y=_columns(filename, ["label"])[:, 0],
        feature_names=feature_names,
        train=np.flatnonzero(part == "train"),
        test=np.flatnonzero(part == "test"),
        seed=None,
        split="original",
    )


# ---------------------------------------------------------------------------------------------
# Regression


def load_boston(seed: int = 0, test_fraction: float = 0.1) -> Dataset:
    """Boston housing (Harrison & Rubinfeld 1978): 506 rows, 13 inputs, target MEDV.

    The target is the median value of owner-occupied homes in $1000s; it is censored
    at 50 (16 rows have ``y == 50``). This is the original, uncorrected data (as in
    ``MASS::Boston``). The ``black`` column is the original variable, kept unchanged
    for comparability with published results.

    Parameters
    ----------
    seed : int, default 0
        Non-negative seed of the random split (``numpy.random.default_rng``).
    test_fraction : float in (0, 1), default 0.1
        Fraction of rows in the test set; ``floor(test_fraction * 506 + 0.5)`` rows
        are used (51 for the default: 455 train / 51 test).

    Returns
    -------
    Dataset
        ``task="regression"``, inputs and target standardised with training statistics.

    Raises
    ------
    TypeError, ValueError
        If ``seed`` or ``test_fraction`` is invalid (the message names the argument).

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
    seed : int, default 0
        Non-negative seed of the random split (``numpy.random.default_rng``).
    test_fraction : float in (0, 1), default 0.1
        Fraction of rows in the test set; ``floor(test_fraction * 252 + 0.5)`` rows
        (25 for the default: 227 train / 25 test).
    include_density : bool, default True
        Keep the ``Density`` column as the first input (14 inputs) or drop it (13).

    Returns
    -------
    Dataset
        ``task="regression"``, inputs and target standardised with training statistics.

    Raises
    ------
    TypeError, ValueError
        If ``seed``, ``test_fraction`` or ``include_density`` is invalid.

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
    seed : int, default 0
        Non-negative seed of the random split (``numpy.random.default_rng``).
    n_train : int in [1, 629], default 315
        Number of training rows; the other ``630 - n_train`` rows are the test set.

    Returns
    -------
    Dataset
        ``task="regression"``, inputs and target standardised with training statistics.

    Raises
    ------
    TypeError, ValueError
        If ``seed`` or ``n_train`` is invalid (the message names the argument).

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


# ---------------------------------------------------------------------------------------------
# Classification


def load_pima() -> Dataset:
    """Pima Indians diabetes, Ripley's (1996) complete-case version with its original split.

    532 women, 7 inputs (``npreg, glu, bp, skin, bmi, ped, age``); label 1 = diabetic
    ("Yes"), 0 = "No". Split as in ``MASS::Pima.tr`` / ``MASS::Pima.te``: 200 training
    rows (68 Yes / 132 No) and 332 test rows (109 Yes / 223 No).

    Returns
    -------
    Dataset
        ``task="classification"``, ``split="original"``, ``seed=None``; inputs
        standardised with training statistics, labels float64 0/1.

    References
    ----------
    Ripley, B. D. (1996). *Pattern Recognition and Neural Networks*. Cambridge
    University Press.

    Examples
    --------
    >>> from gpvi.datasets import load_pima
    >>> ds = load_pima()
    >>> ds.n_train, ds.n_test, int(ds.y_train.sum()), int(ds.y_test.sum())
    (200, 332, 68, 109)
    """
    return _original_classification("pima", "pima.csv")


def load_ripley() -> Dataset:
    """Ripley's (1994) synthetic two-class problem with its original split.

    Two inputs (``xs, ys``); each class is a mixture of two Gaussians. 250 training rows
    (125 per class) and 1000 test rows (500 per class), as ``MASS::synth.tr`` /
    ``MASS::synth.te``. The inputs are standardised like every other data set; map a
    plotting grid with ``x_mean`` / ``x_std`` to draw decision boundaries in the
    original coordinates.

    Returns
    -------
    Dataset
        ``task="classification"``, ``split="original"``, ``seed=None``.

    References
    ----------
    Ripley, B. D. (1994). Neural networks and related methods for classification.
    *JRSS B* 56, 409-456.

    Examples
    --------
    >>> from gpvi.datasets import load_ripley
    >>> ds = load_ripley()
    >>> ds.n_train, ds.n_test, int(ds.y_train.sum()), int(ds.y_test.sum())
    (250, 1000, 125, 500)
    """
    return _original_classification("ripley", "ripley_synth.csv")


def load_ionosphere(seed: int = 0, test_fraction: float = 0.3, *, stratify: bool = True) -> Dataset:
    """UCI Ionosphere (Sigillito et al. 1989): 351 radar returns, 34 inputs.

    Label 1 = "good" (225 rows), 0 = "bad" (126 rows). ``V1`` is binary and ``V2`` is 0
    in every row: it is kept (so column numbers match the source) and, being constant,
    is standardised with mean 0 and sd 1, i.e. it stays exactly 0. Rows 103 and 249
    (1-based) are exact duplicates ("bad"), so a split may put one copy on each side.
    There is no standard split: the default is a seeded, stratified 70/30 split
    (``floor(0.3 * 351 + 0.5) = 105`` test rows: 246 train / 105 test).

    Parameters
    ----------
    seed : int, default 0
        Non-negative seed of the random split (``numpy.random.default_rng``).
    test_fraction : float in (0, 1), default 0.3
        Fraction of rows in the test set (round half up).
    stratify : bool, default True
        Keep the class proportions in both parts (largest-remainder allocation, so
        the total number of test rows is the same as without stratification).

    Returns
    -------
    Dataset
        ``task="classification"``; labels float64 0/1.

    Raises
    ------
    TypeError, ValueError
        If ``seed``, ``test_fraction`` or ``stratify`` is invalid.

    References
    ----------
    Sigillito, V. G., Wing, S. P., Hutton, L. V. and Baker, K. B. (1989). Classification
    of radar returns from the ionosphere using neural networks. *Johns Hopkins APL
    Technical Digest* 10, 262-266.

    Examples
    --------
    >>> from gpvi.datasets import load_ionosphere
    >>> ds = load_ionosphere(seed=0)
    >>> ds.n_train, ds.n_test, ds.split
    (246, 105, 'random stratified 70/30 seed=0')
    >>> float(ds.x_std[1]), float(ds.X_train[:, 1].abs().max())   # constant V2
    (1.0, 0.0)
    """
    feature_names = _inputs("ionosphere.csv", exclude=("label",))
    X = _columns("ionosphere.csv", feature_names)
    y = _columns("ionosphere.csv", ["label"])[:, 0]
    return _random_classification("ionosphere", X, y, feature_names, seed, test_fraction, stratify)


def load_sonar(seed: int = 0, test_fraction: float = 0.3, *, stratify: bool = True) -> Dataset:
    """UCI Sonar, mines vs. rocks (Gorman & Sejnowski 1988): 208 rows, 60 inputs.

    Inputs ``V1`` ... ``V60`` are energies in frequency bands, in [0, 1]. Label 1 = mine
    ("M", 111 rows), 0 = rock ("R", 97 rows). There is no standard split: the default is
    a seeded, stratified 70/30 split (``floor(0.3 * 208 + 0.5) = 62`` test rows:
    146 train / 62 test).

    Parameters
    ----------
    seed : int, default 0
        Non-negative seed of the random split (``numpy.random.default_rng``).
    test_fraction : float in (0, 1), default 0.3
        Fraction of rows in the test set (round half up).
    stratify : bool, default True
        Keep the class proportions in both parts.

    Returns
    -------
    Dataset
        ``task="classification"``; labels float64 0/1.

    Raises
    ------
    TypeError, ValueError
        If ``seed``, ``test_fraction`` or ``stratify`` is invalid.

    References
    ----------
    Gorman, R. P. and Sejnowski, T. J. (1988). Analysis of hidden units in a layered
    network trained to classify sonar targets. *Neural Networks* 1, 75-89.

    Examples
    --------
    >>> from gpvi.datasets import load_sonar
    >>> ds = load_sonar(seed=3)
    >>> ds.n_train, ds.n_test, ds.n_features
    (146, 62, 60)
    """
    feature_names = _inputs("sonar.csv", exclude=("label",))
    X = _columns("sonar.csv", feature_names)
    y = _columns("sonar.csv", ["label"])[:, 0]
    return _random_classification("sonar", X, y, feature_names, seed, test_fraction, stratify)


def load_breast_cancer(
    seed: int = 0, test_fraction: float = 0.3, *, stratify: bool = True
) -> Dataset:
    """Wisconsin Diagnostic Breast Cancer: 569 rows, 30 inputs, from scikit-learn.

    Read with ``sklearn.datasets.load_breast_cancer()``, which ships inside
    scikit-learn (nothing is downloaded). The labels keep scikit-learn's coding:
    **1 = benign** (357 rows), 0 = malignant (212 rows). There is no standard split: the
    default is a seeded, stratified 70/30 split (``floor(0.3 * 569 + 0.5) = 171`` test
    rows: 398 train / 171 test). ``train_indices`` refer to scikit-learn's row order.

    Parameters
    ----------
    seed : int, default 0
        Non-negative seed of the random split (``numpy.random.default_rng``).
    test_fraction : float in (0, 1), default 0.3
        Fraction of rows in the test set (round half up).
    stratify : bool, default True
        Keep the class proportions in both parts.

    Returns
    -------
    Dataset
        ``task="classification"``; labels float64 0/1.

    Raises
    ------
    ImportError
        If scikit-learn is not installed (``pip install gpvi[test]`` or
        ``pip install scikit-learn``).
    TypeError, ValueError
        If ``seed``, ``test_fraction`` or ``stratify`` is invalid.

    References
    ----------
    Street, W. N., Wolberg, W. H. and Mangasarian, O. L. (1993). Nuclear feature
    extraction for breast tumor diagnosis. *Proc. SPIE* 1905, 861-870.

    Examples
    --------
    >>> from gpvi.datasets import load_breast_cancer
    >>> ds = load_breast_cancer(seed=0)
    >>> ds.n_train, ds.n_test, ds.feature_names[0]
    (398, 171, 'mean radius')
    """
    # Validate first so that argument errors do not depend on scikit-learn being installed.
    _check_seed(seed)
    _check_fraction(test_fraction)
    _check_bool(stratify, "stratify")
    try:
        from sklearn.datasets import load_breast_cancer as _sklearn_load
    except ImportError as err:
        raise ImportError(
            "load_breast_cancer needs scikit-learn, an optional dependency of gpvi; "
            "install it with `pip install gpvi[test]` or `pip install scikit-learn`"
        ) from err
    bunch = _sklearn_load()
    X = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.float64)
    feature_names = tuple(str(name) for name in bunch.feature_names)
    return _random_classification(
        "breast_cancer", X, y, feature_names, seed, test_fraction, stratify
    )


# ---------------------------------------------------------------------------------------------

_LOADERS: dict[str, Callable[..., Dataset]] = {
    "boston": load_boston,
    "bodyfat": load_bodyfat,
    "pendulum": load_pendulum,
    "pima": load_pima,
    "ionosphere": load_ionosphere,
    "sonar": load_sonar,
    "ripley": load_ripley,
    "breast_cancer": load_breast_cancer,
}


def load(name: str, **kwargs: Any) -> Dataset:
    """Load a bundled data set by name.

    Parameters
    ----------
    name : str
        One of ``"boston"``, ``"bodyfat"``, ``"pendulum"``, ``"pima"``,
        ``"ionosphere"``, ``"sonar"``, ``"ripley"``, ``"breast_cancer"``
        (case-insensitive).
    **kwargs
        Passed on to the loader, e.g. ``seed=1`` or ``include_density=False``.

    Returns
    -------
    Dataset

    Raises
    ------
    TypeError
        If ``name`` is not a string, or the loader does not accept a keyword.
    ValueError
        If ``name`` is unknown (the message lists the valid names).

    Examples
    --------
    >>> from gpvi.datasets import load
    >>> load("bodyfat", include_density=False).n_features
    13
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str; got {name!r} of type {type(name).__name__}")
    loader = _LOADERS.get(name.strip().lower())
    if loader is None:
        valid = ", ".join(repr(key) for key in _LOADERS)
        raise ValueError(f"unknown data set name {name!r}; valid names are {valid}")
    return loader(**kwargs)
