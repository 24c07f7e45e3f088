"""The :class:`Dataset` container returned by every loader in :mod:`gpvi.datasets`.

A :class:`Dataset` is an immutable record of one train/test split: standardised
float64 tensors plus everything needed to undo the standardisation and to trace
each row back to the source file.

Symbols used in the docstrings and their names in code: :math:`\\bar x, s_x` are
``x_mean``, ``x_std``; :math:`\\bar y, s_y` are ``y_mean``, ``y_std`` (all training
statistics); :math:`N, N_*, D` are ``n_train``, ``n_test``, ``n_features``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..rng import check_seed
from ..validation import check_column_spread

__all__ = ["Dataset"]

_TASKS = ("regression", "classification")


@dataclass(frozen=True, eq=False, repr=False)
class Dataset:
    r"""A standardised train/test split of a bundled data set.

    Inputs are standardised with the training rows' statistics only,

    .. math::

        \tilde x_{ij} = (x_{ij} - \bar x_j) / s_{x,j},

    where :math:`\bar x_j` and :math:`s_{x,j}` are the mean and the population
    standard deviation (ddof = 0) of column :math:`j` over the training rows.
    The test inputs use the same :math:`\bar x, s_x`. A column that is constant
    on the training rows (for example Ionosphere's ``V2``) gets
    :math:`\bar x_j` = that constant and :math:`s_{x,j} = 1`, so it becomes
    exactly zero and nothing divides by zero. Regression targets are
    standardised the same way, :math:`\tilde y = (y - \bar y) / s_y`;
    classification labels are left as 0/1 (``y_mean=0.0``, ``y_std=1.0``).

    Instances are frozen (fields cannot be reassigned) and compare by identity.
    The tensors themselves are ordinary tensors: do not modify them in place.

    Parameters
    ----------
    name : str
        Data set name as accepted by :func:`gpvi.datasets.load`, e.g. ``"boston"``.
    task : {"regression", "classification"}
        Kind of target.
    X_train : torch.Tensor of shape (n_train, n_features), float64
        Standardised training inputs.
    y_train : torch.Tensor of shape (n_train,), float64
        Standardised training targets (regression) or 0/1 labels (classification).
    X_test : torch.Tensor of shape (n_test, n_features), float64
        Test inputs, standardised with the *training* statistics.
    y_test : torch.Tensor of shape (n_test,), float64
        Test targets, standardised with the training statistics, or 0/1 labels.
    feature_names : tuple of str, length n_features
        Column names of the inputs, in order.
    x_mean, x_std : torch.Tensor of shape (n_features,), float64
        Training mean and standard deviation of each input column (``x_std`` is
        1 for columns that are constant on the training rows).
    y_mean, y_std : float
        Training mean and standard deviation of the target (regression), or
        ``0.0`` and ``1.0`` (classification: labels untouched).
    seed : int or None
        Seed of the random split, or ``None`` for a split fixed by the source.
    split : str
        Human-readable description of the split, e.g. ``"original"`` or
        ``"random 90/10 seed=0"``.
    train_indices, test_indices : torch.Tensor of shape (n_train,) / (n_test,), int64
        0-based row numbers in the source (the CSV data rows, or scikit-learn's
        order for breast cancer) of the training and test rows, in the order
        the rows appear in ``X_train`` / ``X_test``.

    Raises
    ------
    ValueError
        If the shapes, dtypes, task or labels are inconsistent.

    Examples
    --------
    >>> from gpvi.datasets import load_boston
    >>> ds = load_boston(seed=0)
    >>> ds.n_train, ds.n_test, ds.n_features
    (455, 51, 13)
    >>> ds.X_train.dtype
    torch.float64
    >>> medv = ds.y_to_original(ds.y_test)   # back to $1000s
    >>> bool(medv.min() >= 5.0)
    True
    """

    name: str
    task: str
    X_train: torch.Tensor
    y_train: torch.Tensor
    X_test: torch.Tensor
    y_test: torch.Tensor
    feature_names: tuple[str, ...]
    x_mean: torch.Tensor
    x_std: torch.Tensor
    y_mean: float
    y_std: float
    seed: int | None
    split: str
    train_indices: torch.Tensor
    test_indices: torch.Tensor

    def __post_init__(self) -> None:
        if self.task not in _TASKS:
            raise ValueError(f"task must be one of {_TASKS}; got {self.task!r}")
        for field in ("X_train", "y_train", "X_test", "y_test", "x_mean", "x_std"):
            value = getattr(self, field)
            if not isinstance(value, torch.Tensor) or value.dtype != torch.float64:
                got = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(f"{field} must be a torch.float64 tensor; got {got}")
        for field in ("train_indices", "test_indices"):
            value = getattr(self, field)
            if not isinstance(value, torch.Tensor) or value.dtype != torch.int64:
                raise ValueError(f"{field} must be a torch.int64 tensor")
        if self.X_train.ndim != 2 or self.X_test.ndim != 2:
            raise ValueError(
                f"X_train and X_test must be 2-D; got {self.X_train.ndim}-D "
                f"and {self.X_test.ndim}-D"
            )
        d = self.X_train.shape[1]
        if self.X_test.shape[1] != d:
            raise ValueError(f"X_train has {d} columns but X_test has {self.X_test.shape[1]}")
        for X, y, idx, part in (
            (self.X_train, self.y_train, self.train_indices, "train"),
            (self.X_test, self.y_test, self.test_indices, "test"),
        ):
            if y.shape != (X.shape[0],) or idx.shape != (X.shape[0],):
                raise ValueError(
                    f"X_{part} has {X.shape[0]} rows but y_{part} has shape {tuple(y.shape)} "
                    f"and {part}_indices has shape {tuple(idx.shape)}"
                )
        if self.x_mean.shape != (d,) or self.x_std.shape != (d,):
            raise ValueError(
                f"x_mean and x_std must have shape ({d},); got {tuple(self.x_mean.shape)} "
                f"and {tuple(self.x_std.shape)}"
            )
        if len(self.feature_names) != d:
            raise ValueError(f"{len(self.feature_names)} feature_names for {d} input columns")
        if not self.y_std > 0:
            raise ValueError(f"y_std must be positive; got {self.y_std}")
        if self.task == "classification":
            if (self.y_mean, self.y_std) != (0.0, 1.0):
                raise ValueError(
                    "classification labels are not standardised: y_mean must be 0.0 "
                    f"and y_std 1.0; got {self.y_mean} and {self.y_std}"
                )
            for y, field in ((self.y_train, "y_train"), (self.y_test, "y_test")):
                if not bool(((y == 0) | (y == 1)).all()):
                    raise ValueError(f"{field} must contain only 0/1 labels")

    @property
    def n_train(self) -> int:
        """Number of training rows."""
        return int(self.X_train.shape[0])

    @property
    def n_test(self) -> int:
        """Number of test rows."""
        return int(self.X_test.shape[0])

    @property
    def n_features(self) -> int:
        """Number of input columns."""
        return int(self.X_train.shape[1])

    def y_to_original(self, y: Any) -> torch.Tensor:
        r"""Map standardised targets (or predictive means) back to original units.

        Computes :math:`y \, s_y + \bar y`. For a predictive standard deviation
        multiply by ``y_std`` only, and for a variance by ``y_std ** 2``. For
        classification data sets this is the identity.

        Parameters
        ----------
        y : torch.Tensor, numpy.ndarray or float, any shape
            Values on the standardised scale.

        Returns
        -------
        torch.Tensor, same shape as ``y``, float64
            Values in the units of the source file.

        Examples
        --------
        >>> from gpvi.datasets import load_bodyfat
        >>> ds = load_bodyfat(seed=0)
        >>> back = ds.y_to_original(ds.y_train)
        >>> abs(float(back.mean()) - ds.y_mean) < 1e-10
        True
        """
        y = torch.as_tensor(np.asarray(y) if not isinstance(y, torch.Tensor) else y)
        return y.to(torch.float64) * self.y_std + self.y_mean

    def __repr__(self) -> str:
        return (
            f"Dataset({self.name!r}, {self.task}, train {self.n_train} x {self.n_features}, "
            f"test {self.n_test} x {self.n_features}, split={self.split!r})"
        )


# ---------------------------------------------------------------------------------------------
# Private helpers shared by the loaders in gpvi/datasets/__init__.py.


# The docstring sections the loaders share, written once: a loader's docstring names them as ``%(name)s`` and
# :func:`_fill_doc` fills them in (scipy's ``doccer`` convention), so ``help()`` shows the full text.
_SEED_DOC = """seed : int, default 0
        Non-negative seed of the random split (``numpy.random.default_rng``)."""
_DOC_PARTS: dict[str, str] = {
    "seed": _SEED_DOC,
    "random_split_classification": f"""Parameters
    ----------
    {_SEED_DOC}
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
        If ``seed``, ``test_fraction`` or ``stratify`` is invalid.""",
    "returns_regression": """Returns
    -------
    Dataset
        ``task="regression"``, inputs and target standardised with training statistics.

    Raises
    ------
    TypeError, ValueError
        If an argument is invalid (the message names it).""",
}


def _fill_doc(func: Any) -> Any:
    """Fill the ``%(name)s`` placeholders of ``func``'s docstring from ``_DOC_PARTS``; return ``func``."""
    func.__doc__ = func.__doc__ % _DOC_PARTS
    return func


def _check_seed(seed: Any) -> int:
    """Return ``seed`` as an int, or raise naming ``seed`` (:func:`gpvi.rng.check_seed`; None is refused here)."""
    return check_seed(seed, "seed", allow_none=False)


def _check_fraction(test_fraction: Any) -> float:
    """Return ``test_fraction`` as a float in (0, 1), or raise naming it."""
    if isinstance(test_fraction, (bool, np.bool_)) or not isinstance(
        test_fraction, (int, float, np.integer, np.floating)
    ):
        raise TypeError(
            f"test_fraction must be a float in (0, 1); got {test_fraction!r} "
            f"of type {type(test_fraction).__name__}"
        )
    value = float(test_fraction)
    if not 0.0 < value < 1.0:  # also rejects NaN
        raise ValueError(f"test_fraction must be in (0, 1); got {test_fraction}")
    return value


def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {value!r}")
    return bool(value)


def _n_test_rows(n: int, test_fraction: float) -> int:
    """Number of test rows: ``floor(test_fraction * n + 0.5)`` (round half up), in [1, n - 1]."""
    n_test = int(np.floor(test_fraction * n + 0.5))
    if not 1 <= n_test <= n - 1:
        raise ValueError(
            f"test_fraction={test_fraction} gives {n_test} test rows out of {n}; "
            f"it must leave at least one training and one test row"
        )
    return n_test


def _percent(x: float) -> str:
    return f"{100.0 * x:.6g}"


def _random_split(
    n: int, n_test: int, seed: int, labels: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded train/test row indices (each sorted ascending).

    Uses only ``numpy.random.default_rng(seed)``; the global numpy and torch RNGs are
    untouched. Without ``labels`` the test rows are the first ``n_test`` entries of
    ``rng.permutation(n)``. With ``labels`` the split is stratified: class ``c`` (in
    sorted order) gets ``floor(n_test * n_c / n)`` test rows plus one for the classes
    with the largest remainders until the total is ``n_test``, drawn as the first rows
    of ``rng.permutation`` of that class's rows.
    """
    rng = np.random.default_rng(seed)
    if labels is None:
        perm = rng.permutation(n)
        test, train = perm[:n_test], perm[n_test:]
    else:
        classes, counts = np.unique(labels, return_counts=True)
        quota = n_test * counts / n
        k = np.floor(quota).astype(np.int64)
        order = np.argsort(-(quota - k), kind="stable")
        k[order[: n_test - int(k.sum())]] += 1
        test_parts, train_parts = [], []
        for c, k_c in zip(classes, k):
            perm = rng.permutation(np.flatnonzero(labels == c))
            test_parts.append(perm[:k_c])
            train_parts.append(perm[k_c:])
        test, train = np.concatenate(test_parts), np.concatenate(train_parts)
    return np.sort(train), np.sort(test)


def _standardise(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column mean and population sd (ddof=0); constant columns get mean=the constant, sd=1.

    The caller checks first that no column's sd overflows (:func:`gpvi.validation.check_column_spread`).
    """
    mean = values.mean(axis=0)
    std = values.std(axis=0)
    constant = values.max(axis=0) == values.min(axis=0)
    mean = np.where(constant, values[0], mean)
    std = np.where(constant, 1.0, std)
    return mean, std


def _build(
    *,
    name: str,
    task: str,
    X: np.ndarray,
    y: np.ndarray,
    feature_names: tuple[str, ...],
    train: np.ndarray,
    test: np.ndarray,
    seed: int | None,
    split: str,
) -> Dataset:
    """Standardise with the training rows only and wrap everything in a :class:`Dataset`."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    # a column whose sd overflows would silently standardise to all zeros: an error naming the column instead
    check_column_spread(X[train], f"data set {name!r}: input", list(feature_names))
    if task == "regression":
        check_column_spread(y[train, None], f"data set {name!r}: target", ["y"])
    x_mean, x_std = _standardise(X[train])
    if task == "regression":
        y_mean_arr, y_std_arr = _standardise(y[train, None])
        y_mean, y_std = float(y_mean_arr[0]), float(y_std_arr[0])
    else:
        y_mean, y_std = 0.0, 1.0

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.tensor(a, dtype=torch.float64)

    return Dataset(
        name=name,
        task=task,
        X_train=tensor((X[train] - x_mean) / x_std),
        y_train=tensor((y[train] - y_mean) / y_std),
        X_test=tensor((X[test] - x_mean) / x_std),
        y_test=tensor((y[test] - y_mean) / y_std),
        feature_names=tuple(feature_names),
        x_mean=tensor(x_mean),
        x_std=tensor(x_std),
        y_mean=y_mean,
        y_std=y_std,
        seed=seed,
        split=split,
        train_indices=torch.tensor(train, dtype=torch.int64),
        test_indices=torch.tensor(test, dtype=torch.int64),
    )
