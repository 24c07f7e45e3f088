"""The generator families of ``benchmarks/classification_heldout.py`` (issue 59) and their split into a tuning half
and a held-out half, fixed before any timing.

Binary (:data:`FAMILIES`): scikit-learn's ``make_moons`` and ``make_circles``, XOR and a 3 x 3 checkerboard with
label noise, two spirals, ``make_classification`` with 2, 8 and 20 informative inputs. Multi-class:
``make_classification`` (``mc_clf``) and ``make_blobs`` (``mc_blobs``). Each draw gives N training rows and
:data:`NUM_TEST` test rows by a stratified split, standardised by the training rows.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

__all__ = ["SPLIT", "MULTICLASS_SPLIT", "FAMILIES", "NUM_TEST", "half_of", "binary_data", "multiclass_data"]

SPLIT = {"tuning": ("clf8", "xor", "spirals", "checkerboard"),
         "heldout": ("clf2", "clf20", "moons", "circles")}
"""Binary families by half, fixed before any timing: the sorted family names permuted by
``numpy.random.default_rng(59).permutation(8)`` (issue 59) gave ``clf8, clf2, xor, clf20, spirals, moons,
checkerboard, circles``; alternate entries go to the tuning half (first, third, ...) and the held-out half. A change
of the type-II rule is decided on the tuning half only; the held-out rows are reported as measured."""

MULTICLASS_SPLIT = {"tuning": ("mc_clf",), "heldout": ("mc_blobs",)}
"""Multi-class families by half, fixed before any timing: ``numpy.random.default_rng(59).permutation(2)`` of the
sorted names ``mc_blobs, mc_clf`` is ``(1, 0)``: the first (``mc_clf``) tunes, the second is held out."""

NUM_TEST = 1000


def _flip(y: np.ndarray, p: float, rng: np.random.Generator) -> np.ndarray:
    """Labels with a fraction ``p`` flipped at random (label noise)."""
    return np.where(rng.uniform(size=y.shape) < p, 1 - y, y)


def _xor(n: int, noise: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    X = rng.uniform(-1.0, 1.0, size=(n, 2))
    return X, _flip((X[:, 0] * X[:, 1] > 0).astype(int), noise, rng)


def _checkerboard(n: int, noise: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    X = rng.uniform(0.0, 3.0, size=(n, 2))
    return X, _flip((np.floor(X).sum(1) % 2).astype(int), noise, rng)


def _spirals(n: int, noise: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, 2, size=n)
    t = np.sqrt(rng.uniform(size=n)) * 3.0 * np.pi        # 1.5 turns each
    r = t / (3.0 * np.pi)
    a = t + np.pi * y
    X = np.stack([r * np.cos(a), r * np.sin(a)], 1) + noise * rng.normal(size=(n, 2))
    return X, y


def _sk(name: str) -> Callable[..., Any]:
    from sklearn import datasets

    return getattr(datasets, name)


def _moons(n: int, noise: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return _sk("make_moons")(n, noise=noise, random_state=int(rng.integers(2**31)))


def _circles(n: int, noise: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return _sk("make_circles")(n, noise=noise, factor=0.5, random_state=int(rng.integers(2**31)))


def _clf(d: int) -> Callable[[int, float, np.random.Generator], tuple[np.ndarray, np.ndarray]]:
    def gen(n: int, noise: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return _sk("make_classification")(n, n_features=d, n_informative=d, n_redundant=0, n_repeated=0,
                                          n_clusters_per_class=2, flip_y=noise, class_sep=1.0,
                                          random_state=int(rng.integers(2**31)))
    return gen


FAMILIES: dict[str, tuple[Callable[..., Any], tuple[float, float]]] = {
    "moons": (_moons, (0.2, 0.4)),                 # Gaussian input noise (sd)
    "circles": (_circles, (0.1, 0.2)),
    "xor": (_xor, (0.05, 0.15)),                   # label-flip probability
    "checkerboard": (_checkerboard, (0.05, 0.15)),
    "spirals": (_spirals, (0.05, 0.15)),           # Gaussian input noise (sd)
    "clf2": (_clf(2), (0.02, 0.1)),                # make_classification flip_y
    "clf8": (_clf(8), (0.02, 0.1)),
    "clf20": (_clf(20), (0.02, 0.1)),
}
"""name -> (generator(n, noise, rng) -> (X, y), the two noise levels)."""


def half_of(family: str) -> str:
    for table in (SPLIT, MULTICLASS_SPLIT):
        for half, names in table.items():
            if family in names:
                return half
    raise KeyError(family)


def split(X: np.ndarray, y: np.ndarray, n: int, seed: int) -> tuple[np.ndarray, ...]:
    """Stratified ``n`` training rows and the rest as test rows, standardised by the training rows."""
    from sklearn.model_selection import train_test_split

    Xtr, Xte, ytr, yte = train_test_split(X, y, train_size=n, stratify=y, random_state=seed)
    mu, sd = Xtr.mean(0), Xtr.std(0)
    sd[sd == 0] = 1.0
    return (Xtr - mu) / sd, ytr, (Xte - mu) / sd, yte


def binary_data(family: str, n: int, level: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    gen, noises = FAMILIES[family]
    rng = np.random.default_rng([59, seed, n, level, sorted(FAMILIES).index(family)])
    X, y = gen(n + NUM_TEST, noises[level], rng)
    return split(np.asarray(X, dtype=np.float64), np.asarray(y), n, seed)


def multiclass_data(family: str, n: int, k: int, level: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """``mc_clf``: make_classification, 5 informative inputs, one cluster per class, flip_y 0.02 / 0.1;
    ``mc_blobs``: make_blobs in 3 inputs, cluster_std 1.5 / 3.0 (centres in a box of +-6)."""
    from sklearn.datasets import make_blobs, make_classification

    rs = int(np.random.default_rng([59, seed, n, k, level]).integers(2**31))
    if family == "mc_clf":
        X, y = make_classification(n + NUM_TEST, n_features=5, n_informative=5, n_redundant=0, n_classes=k,
                                   n_clusters_per_class=1, flip_y=(0.02, 0.1)[level], random_state=rs)
    else:
        X, y = make_blobs(n + NUM_TEST, n_features=3, centers=k, cluster_std=(1.5, 3.0)[level],
                          center_box=(-6.0, 6.0), random_state=rs)
    return split(X.astype(np.float64), y, n, seed)
