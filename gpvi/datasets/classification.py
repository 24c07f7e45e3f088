"""Classification data sets: Pima, Ripley, Ionosphere, Sonar, breast cancer."""

from __future__ import annotations

import numpy as np

from ._dataset import Dataset, _check_bool, _check_fraction, _check_seed, _fill_doc
from ._files import _original_classification, _random, _random_classification


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


@_fill_doc
def load_ionosphere(seed: int = 0, test_fraction: float = 0.3, *, stratify: bool = True) -> Dataset:
    """UCI Ionosphere (Sigillito et al. 1989): 351 radar returns, 34 inputs.

    Label 1 = "good" (225 rows), 0 = "bad" (126 rows). ``V1`` is binary and ``V2`` is 0
    in every row: it is kept (so column numbers match the source) and, being constant,
    is standardised with mean 0 and sd 1, i.e. it stays exactly 0. Rows 103 and 249
    (1-based) are exact duplicates ("bad"), so a split may put one copy on each side.
    There is no standard split: the default is a seeded, stratified 70/30 split
    (``floor(0.3 * 351 + 0.5) = 105`` test rows: 246 train / 105 test).

    %(random_split_classification)s

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
    return _random_classification("ionosphere", seed, test_fraction, stratify)


@_fill_doc
def load_sonar(seed: int = 0, test_fraction: float = 0.3, *, stratify: bool = True) -> Dataset:
    """UCI Sonar, mines vs. rocks (Gorman & Sejnowski 1988): 208 rows, 60 inputs.

    Inputs ``V1`` ... ``V60`` are energies in frequency bands, in [0, 1]. Label 1 = mine
    ("M", 111 rows), 0 = rock ("R", 97 rows). There is no standard split: the default is
    a seeded, stratified 70/30 split (``floor(0.3 * 208 + 0.5) = 62`` test rows:
    146 train / 62 test).

    %(random_split_classification)s

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
    return _random_classification("sonar", seed, test_fraction, stratify)


@_fill_doc
def load_breast_cancer(
    seed: int = 0, test_fraction: float = 0.3, *, stratify: bool = True
) -> Dataset:
    """Wisconsin Diagnostic Breast Cancer: 569 rows, 30 inputs, from scikit-learn.

    Read with ``sklearn.datasets.load_breast_cancer()``, which ships inside
    scikit-learn (nothing is downloaded). The labels keep scikit-learn's coding:
    **1 = benign** (357 rows), 0 = malignant (212 rows). There is no standard split: the
    default is a seeded, stratified 70/30 split (``floor(0.3 * 569 + 0.5) = 171`` test
    rows: 398 train / 171 test). ``train_indices`` refer to scikit-learn's row order.

    %(random_split_classification)s

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
    _check_seed(seed)
    _check_fraction(test_fraction)
    _check_bool(stratify, "stratify")
    from sklearn.datasets import load_breast_cancer as _sklearn_load    # imported on use: scikit-learn takes ~1 s

    bunch = _sklearn_load()
    X = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.float64)
    feature_names = tuple(str(name) for name in bunch.feature_names)
    return _random("breast_cancer", "classification", X, y, feature_names, seed, test_fraction, stratify)
