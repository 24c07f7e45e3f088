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

from typing import Any, Callable

from ._dataset import Dataset
from .classification import load_breast_cancer, load_ionosphere, load_pima, load_ripley, load_sonar
from .regression import load_bodyfat, load_boston, load_pendulum

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
