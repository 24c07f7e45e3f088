"""Input and label checks of :class:`gpvi.GPClassifier`, worded as scikit-learn words them (its estimator checks
match on the messages): sparse and malformed ``X``, DataFrame columns, class labels, and scikit-learn's
``NotFittedError`` / ``DataConversionWarning`` (or stand-ins when scikit-learn is not installed).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch


def _is_sparse(X: Any) -> bool:
    return type(X).__module__.startswith("scipy.sparse")


def _precheck_X(X: Any, n_features: int | None = None) -> None:
    """The checks whose messages scikit-learn's estimator checks read; the rest is :func:`gpvi.validation.check_X`."""
    if _is_sparse(X):
        raise TypeError(f"X is a scipy sparse {type(X).__name__}: sparse input is not supported (GP kernels are "
                        f"dense); pass X.toarray()")
    if isinstance(X, torch.Tensor):
        shape, complex_ = tuple(X.shape), X.is_complex()
    else:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                arr = np.asarray(X)
        except Exception:                                   # ragged and the like: check_X says what is wrong
            return
        shape, complex_ = arr.shape, arr.dtype.kind == "c"
    if complex_:
        raise ValueError("Complex data not supported: X is complex; pass its real part or split real and imaginary "
                         "parts into columns")
    if len(shape) == 1:
        raise ValueError(f"X must be 2-D (n_samples, n_features); got a 1-D array of shape {shape}. Reshape your "
                         f"data with X.reshape(-1, 1) if it has a single feature or X.reshape(1, -1) if it is a "
                         f"single sample")
    if len(shape) == 2 and shape[1] == 0:
        raise ValueError(f"X has 0 feature(s) (shape={shape}) while a minimum of 1 is required.")
    if n_features is not None and len(shape) == 2 and shape[1] != n_features:
        raise ValueError(f"X has {shape[1]} features, but GPClassifier is expecting {n_features} features as input")


def _check_feature_names(fitted: Any, names: list[str] | None) -> None:
    """scikit-learn's rule for DataFrame columns at prediction time: same names in the same order."""
    if fitted is None and names is not None:
        warnings.warn("X has feature names, but GPClassifier was fitted without feature names", UserWarning,
                      stacklevel=4)
        return
    if fitted is not None and names is None:
        warnings.warn("X does not have valid feature names, but GPClassifier was fitted with feature names",
                      UserWarning, stacklevel=4)
        return
    if fitted is None or list(names) == list(fitted):
        return
    seen, now = set(fitted), set(names)

    def listed(items: list[str]) -> str:
        shown = "".join(f"- {n}\n" for n in items[:5])
        return shown + ("- ...\n" if len(items) > 5 else "")

    msg = "The feature names should match those that were passed during fit.\n"
    unseen, missing = sorted(now - seen), sorted(seen - now)
    if unseen:
        msg += "Feature names unseen at fit time:\n" + listed(unseen)
    if missing:
        msg += "Feature names seen at fit time, yet now missing:\n" + listed(missing)
    if not unseen and not missing:
        msg += "Feature names must be in the same order as they were in fit.\n"
    raise ValueError(msg + f"(X has columns {list(names)} but the classifier was fitted with columns {list(fitted)})")


def _label_array(y: Any, name: str) -> np.ndarray:
    """``y`` as a 1-D numpy array of labels (a column vector is flattened with scikit-learn's warning)."""
    if y is None:
        raise ValueError(f"GPClassifier requires {name} to be passed, but the target {name} is None")
    if isinstance(y, torch.Tensor):
        y = y.detach().cpu().numpy()
    try:
        arr = np.asarray(y)
    except Exception as exc:
        raise TypeError(f"{name} must be a 1-D array of class labels; could not convert it: {exc}") from None
    if arr.dtype.kind == "c":
        raise ValueError(f"Complex data not supported: {name} is complex; class labels must be real or strings")
    if arr.ndim == 2 and arr.shape[1] == 1:
        warnings.warn("A column-vector y was passed when a 1d array was expected. Please change the shape of y to "
                      "(n_samples,), for example using ravel().", _data_conversion_warning(), stacklevel=4)
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one label per row); got shape {arr.shape}")
    if arr.dtype.kind in "mMV":
        raise TypeError(f"{name} must hold class labels (numbers, strings or booleans); got dtype {arr.dtype}")
    return arr


def _class_labels(y: Any, num_rows: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Labels of any sortable type -> ``(indices (N,) int64 in 0..K-1, classes (K,) sorted)``, K >= 2.

    Real labels must be integer-valued (they are then kept as int64 labels); others are scikit-learn's
    "continuous" targets, a ``ValueError``.
    """
    arr = _label_array(y, "y")
    if arr.shape[0] == 0:
        raise ValueError("y is empty")
    if num_rows == 1 or arr.shape[0] == 1:
        raise ValueError("need at least 2 samples to fit a classifier; got n_samples = 1")
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            raise ValueError(f"y contains {int((~np.isfinite(arr)).sum())} NaN or infinite label(s)")
        if not (arr == np.round(arr)).all():
            bad = arr[arr != np.round(arr)][0]
            raise ValueError(f"Unknown label type: continuous. y holds real values such as {bad!r}, not class "
                             f"labels; use a regressor (gpvi.GPRegression) for a real-valued target")
        if np.abs(arr).max() < 2.0 ** 53:
            arr = arr.astype(np.int64)
    if arr.dtype.kind == "O" and any(v is None or (isinstance(v, float) and v != v) for v in arr):
        raise ValueError("y contains missing labels (None or NaN)")
    try:
        classes, idx = np.unique(arr, return_inverse=True)
    except TypeError as exc:
        raise TypeError(f"y holds labels that cannot be sorted (mixed types?): {exc}") from None
    if classes.shape[0] < 2:
        label = classes[0].item() if isinstance(classes[0], np.generic) else classes[0]
        raise ValueError(f"y holds one class only ({label!r}): a classifier needs at least two classes")
    return idx.reshape(-1).astype(np.int64), classes


class _NotFittedError(ValueError, AttributeError):
    """Stands in for ``sklearn.exceptions.NotFittedError`` when scikit-learn is not installed."""


class _DataConversionWarning(UserWarning):
    """Stands in for ``sklearn.exceptions.DataConversionWarning`` when scikit-learn is not installed."""


def _not_fitted_error() -> type:
    try:
        from sklearn.exceptions import NotFittedError
        return NotFittedError
    except ImportError:                          # pragma: no cover - scikit-learn is optional
        return _NotFittedError


def _data_conversion_warning() -> type:
    try:
        from sklearn.exceptions import DataConversionWarning
        return DataConversionWarning
    except ImportError:                          # pragma: no cover - scikit-learn is optional
        return _DataConversionWarning
