"""Reading the bundled CSV files and building splits from them (shared by the regression and classification loaders)."""

from __future__ import annotations

import csv
import functools
import io
from importlib import resources
from typing import Any

import numpy as np

from ._dataset import Dataset, _build, _check_bool, _check_fraction, _check_seed, _n_test_rows, _percent, _random_split

#: 1-based StatLib case numbers of the known anomalous Bodyfat rows (kept in the data).
_BODYFAT_BAD_CASES = (42, 48, 76, 96, 182)


@functools.lru_cache(maxsize=None)
def _read_csv(filename: str) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """Header and data rows (as strings) of a bundled CSV file; cached, immutable."""
    text = resources.files(__package__).joinpath("data").joinpath(filename).read_text(encoding="utf-8")
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


def _random(name: str, task: str, X: np.ndarray, y: np.ndarray, feature_names: tuple[str, ...], seed: Any,
            test_fraction: Any, stratify: Any = False) -> Dataset:
    """A seeded random split (stratified by label if asked) of ``X, y``, standardised by :func:`_build`."""
    seed = _check_seed(seed)
    test_fraction = _check_fraction(test_fraction)
    stratify = _check_bool(stratify, "stratify")
    train, test = _random_split(len(y), _n_test_rows(len(y), test_fraction), seed, labels=y if stratify else None)
    kind = "random stratified" if stratify else "random"
    split = f"{kind} {_percent(1.0 - test_fraction)}/{_percent(test_fraction)} seed={seed}"
    return _build(name=name, task=task, X=X, y=y, feature_names=feature_names, train=train, test=test, seed=seed,
                  split=split)


def _random_regression(name: str, filename: str, feature_names: tuple[str, ...], seed: Any,
                       test_fraction: Any) -> Dataset:
    """A bundled regression CSV (target column ``y``) split at random."""
    y = _columns(filename, ["y"])[:, 0]
    return _random(name, "regression", _columns(filename, feature_names), y, feature_names, seed, test_fraction)


def _random_classification(name: str, seed: Any, test_fraction: Any, stratify: Any) -> Dataset:
    """A bundled classification CSV ``<name>.csv`` (every column but ``label`` an input) split at random."""
    filename = f"{name}.csv"
    feature_names = _inputs(filename, exclude=("label",))
    X = _columns(filename, feature_names)
    y = _columns(filename, ["label"])[:, 0]
    return _random(name, "classification", X, y, feature_names, seed, test_fraction, stratify)


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

