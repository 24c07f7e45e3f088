"""Arrays at the public boundary: data, targets, labels, weights and parameter vectors, converted once.

Numeric arrays become float64 tensors on the requested device, never downcast; shapes, finiteness and label sets
are checked, and the columns' spread, feature names and a predictive's finiteness are checked where they matter.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .settings import _describe

__all__ = ["as_float_tensor", "check_device", "check_not_meta", "check_X", "check_X_y", "check_theta",
           "check_sample_weight", "check_binary_labels", "check_column_spread", "feature_names_of",
           "check_feature_names", "check_feature_columns", "check_finite_prediction"]

_MAX_EXACT_INT = 2**53


_NO_ENTRY = object()


def _is_real_scalar(v: Any) -> bool:
    """Whether an entry of an object array is a real number (Python, numpy or 0-d torch; booleans count)."""
    if isinstance(v, (str, bytes)):
        return False
    if isinstance(v, torch.Tensor):
        return v.numel() == 1 and not v.is_complex()
    return isinstance(v, (numbers.Real, np.bool_)) or (isinstance(v, np.number) and not np.iscomplexobj(v))


def as_float_tensor(
    x: Any,
    name: str,
    *,
    ndim: int | Sequence[int] | None = None,
    allow_empty: bool = False,
    finite: bool = True,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    copy: bool = False,
) -> torch.Tensor:
    """Convert array-like ``x`` to a float tensor, checking kind, shape and values.

    Parameters
    ----------
    x : array-like
        numpy array, torch tensor, or (nested) sequence of numbers. Integer, boolean and float32 inputs
        are converted to ``dtype`` without loss; object, string and complex arrays are rejected.
    name : str
        Argument name used in error messages.
    ndim : int or sequence of int, optional
        Allowed numbers of dimensions.
    allow_empty : bool
        Whether a tensor with zero elements is acceptable.
    finite : bool
        Reject NaN and infinite values.
    dtype : torch.dtype
        Target floating dtype (float64 by default; a float64 input is never downcast).
    device : torch.device or str, optional
        Target device (default: the input tensor's device, or CPU).
    copy : bool
        Never return the caller's memory (a model's training data: a later in-place edit of the caller's array
        must not reach the model); the data are copied only when no conversion already did.

    Returns
    -------
    torch.Tensor
        A tensor of dtype ``dtype`` (a copy when a conversion was needed, or ``copy``).

    Raises
    ------
    TypeError
        ``x`` is not numeric (strings, objects, complex, None).
    ValueError
        Wrong number of dimensions, empty, non-finite values, or integers too large to be exact in float64.
    """
    if x is None:
        raise TypeError(f"{name} must be an array of numbers; got None")
    if isinstance(x, (str, bytes)):
        raise TypeError(f"{name} must be an array of numbers; got a string")
    if isinstance(x, torch.Tensor):
        check_not_meta(x, name)
        t = src = x.detach()
        if t.is_complex():
            raise TypeError(f"{name} must be real-valued; got complex dtype {t.dtype}")
        if t.dtype == torch.float64 and dtype == torch.float32:
            raise ValueError(f"{name} is float64; refusing to downcast it to float32")
    else:
        try:
            arr = src = np.asarray(x)
        except Exception as exc:  # ragged sequences and the like
            raise TypeError(f"{name} must be an array of numbers; could not convert {_describe(x)}: {exc}") from None
        if arr.dtype.kind in "OUSV" or arr.dtype.kind == "M" or arr.dtype.kind == "m":
            if arr.dtype.kind == "O":
                # an object array is accepted only when every entry is itself a real number: numpy's astype would
                # also parse strings ("2" -> 2.0) and turn None into NaN
                bad = next((v for v in arr.flat if not _is_real_scalar(v)), _NO_ENTRY)
                if bad is not _NO_ENTRY:
                    raise TypeError(f"{name} must be an array of numbers; got dtype object with a non-numeric "
                                    f"entry {bad!r} of type {_describe(bad)}")
                try:
                    arr = arr.astype(np.float64)
                except (TypeError, ValueError, OverflowError):
                    raise TypeError(
                        f"{name} must be an array of numbers; got dtype object with non-numeric entries"
                    ) from None
            else:
                raise TypeError(f"{name} must be an array of numbers; got dtype {arr.dtype}")
        if arr.dtype.kind == "c":
            raise TypeError(f"{name} must be real-valued; got complex dtype {arr.dtype}")
        if arr.dtype.kind in "iu" and arr.size and int(np.max(np.abs(arr.astype(object)))) > _MAX_EXACT_INT:
            raise ValueError(f"{name} holds integers larger than 2**53 that float64 cannot represent exactly")
        arr = np.ascontiguousarray(arr)
        if not arr.flags.writeable:      # a read-only view (a pandas DataFrame's or Series' values): copied, quietly
            arr = arr.copy()             # (torch warns on a tensor over read-only memory)
        t = torch.from_numpy(arr)
    if t.dtype in (torch.int64, torch.uint64) and t.numel() and int(t.abs().max()) > _MAX_EXACT_INT:
        raise ValueError(f"{name} holds integers larger than 2**53 that float64 cannot represent exactly")
    dev = check_device(device) if device is not None else t.device
    try:
        t = t.to(device=dev, dtype=dtype)
    except RuntimeError as exc:        # e.g. "cuda" on a machine without a GPU
        raise ValueError(f"device {str(dev)!r} is not available: {exc}") from None
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed:
            want = " or ".join(f"{k}-D" for k in allowed)
            raise ValueError(f"{name} must be {want}; got shape {tuple(t.shape)}")
    if not allow_empty and t.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)})")
    if finite and t.numel() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise ValueError(f"{name} contains {bad} non-finite value(s) (NaN or inf)")
    return t.clone() if copy and _shares_memory(t, src) else t


def _shares_memory(t: torch.Tensor, src: Any) -> bool:
    """Whether tensor ``t`` lies in the memory of ``src`` (the caller's tensor, or the NumPy view of its input)."""
    if isinstance(src, torch.Tensor):
        return t.device == src.device and t.untyped_storage().data_ptr() == src.untyped_storage().data_ptr()
    return t.device.type == "cpu" and bool(np.may_share_memory(t.numpy(), src))   # bounds only: cheap, safe


def check_not_meta(x: Any, name: str) -> None:
    """Refuse a tensor on torch's ``meta`` device: it has a shape but no values to compute with.

    Raises
    ------
    ValueError
        ``x`` is a tensor on the ``meta`` device (the message names ``name``); anything else passes.
    """
    if isinstance(x, torch.Tensor) and x.is_meta:
        raise ValueError(f"{name} is on torch's 'meta' device, which holds shapes but no values (gpvi computes with "
                         f"the values); create it on 'cpu' or 'cuda'")


def check_device(device: Any, name: str = "device") -> torch.device:
    """A ``torch.device`` from a device argument (``"cpu"``, ``"cuda:0"``, a ``torch.device``) that can hold data.

    Raises
    ------
    TypeError
        Not a string or ``torch.device`` (an int is refused: ``device=3`` would silently mean ``cuda:3``).
    ValueError
        A string torch does not read as a device, or the ``meta`` device (no values).
    """
    if isinstance(device, torch.device):
        dev = device
    elif not isinstance(device, str):
        raise TypeError(f"{name} must be a str such as 'cpu' or 'cuda:0', or a torch.device; got "
                        f"{_describe(device)}")
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, ValueError) as exc:
            raise ValueError(f"{name} {device!r} is not a device torch knows: {exc}") from None
    if dev.type == "meta":
        raise ValueError(f"{name} 'meta' is torch's shapes-only device: it holds no values, and gpvi computes with "
                         f"the values; use 'cpu' or 'cuda'")
    return dev


def check_X(
    X: Any, name: str = "X", *, n_features: int | None = None, device: torch.device | str | None = None,
    copy: bool = False,
) -> torch.Tensor:
    """Check a design matrix of shape ``(n_samples, n_features)`` and return it as float64.

    ``copy=True`` (a model's training data) never returns the caller's memory (:func:`as_float_tensor`): a float64
    array or tensor is otherwise used in place, and a later in-place edit of it would silently change the model.

    Raises
    ------
    ValueError
        Not 2-D (a 1-D array is rejected rather than guessed: reshape it to ``(n, 1)`` or ``(1, d)``),
        empty, non-finite, or with a number of columns other than ``n_features``.
    """
    t = as_float_tensor(X, name, ndim=2, device=device, copy=copy)
    if t.shape[0] == 0 or t.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)})")
    if n_features is not None and t.shape[1] != n_features:
        raise ValueError(f"{name} has {t.shape[1]} features but the model was built with {n_features}")
    return t


def check_X_y(
    X: Any,
    y: Any,
    *,
    X_name: str = "X",
    y_name: str = "y",
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check paired inputs ``X`` of shape ``(n, d)`` and targets ``y`` of shape ``(n,)`` (or ``(n, 1)``): a model's
    training data.

    Returns float64 tensors on one device, in memory of their own (a later in-place edit of the caller's arrays
    does not reach the model); ``y`` is returned 1-D.
    """
    Xt = check_X(X, X_name, device=device, copy=True)
    yt = as_float_tensor(y, y_name, ndim=(1, 2), device=Xt.device, copy=True)
    if yt.dim() == 2:
        if yt.shape[1] != 1:
            raise ValueError(f"{y_name} must be 1-D (one target per row); got shape {tuple(yt.shape)}")
        yt = yt[:, 0]
    if yt.shape[0] != Xt.shape[0]:
        raise ValueError(f"{X_name} has {Xt.shape[0]} rows but {y_name} has {yt.shape[0]}")
    return Xt, yt


def _column_label(j: int, name: str, feature_names: Sequence[str] | None) -> str:
    return f"{name} column {j} ({feature_names[j]!r})" if feature_names is not None else f"{name} column {j}"


def check_column_spread(X: Any, name: str = "X", feature_names: Sequence[str] | None = None) -> None:
    r"""Refuse a column whose spread float64 cannot represent: its variance overflows.

    The variance :math:`s_j^2 = \frac1n \sum_i (x_{ij} - \bar x_j)^2` is computed scaled by
    :math:`a_j = \max_i |x_{ij}|` (so a constant column of huge values passes with :math:`s_j = 0`); when
    :math:`a_j^2 \cdot \operatorname{var}(x_j / a_j)` exceeds the largest float64 (about 1.8e308, i.e.
    :math:`s_j` above about 1.3e154, e.g. a CSV cell of ``1e308``), standardising the column, a data-scaled
    lengthscale or a squared distance on it overflows, and the column would silently become all zeros or NaN.

    Parameters
    ----------
    X : torch.Tensor or numpy.ndarray of shape (n, d) or (n,)
        Finite values (check them first); a vector is one column named ``name``.
    name : str
        Argument name used in the message.
    feature_names : sequence of str, optional
        Column names, used in the message.

    Raises
    ------
    ValueError
        Naming the first such column (by index and name) and its largest absolute value.
    """
    t = torch.from_numpy(np.asarray(X, dtype=np.float64)) if not isinstance(X, torch.Tensor) else X.detach()
    vector = t.dim() == 1
    if vector:
        t = t.unsqueeze(-1)
    if t.dim() != 2 or t.shape[0] == 0 or t.shape[1] == 0:
        return
    a = t.abs().amax(0)
    scale = torch.where(a > 0, a, torch.ones_like(a))
    z = t / scale
    sd = scale * (z - z.mean(0)).pow(2).mean(0).sqrt()
    var = sd * sd
    bad = ~torch.isfinite(var)
    if bool(bad.any()):
        j = int(bad.nonzero()[0, 0])
        what = name if vector else _column_label(j, name, feature_names)
        raise ValueError(f"{what} has a spread float64 cannot represent (its "
                         f"standard deviation overflows; largest |value| {float(a[j]):.3g}); rescale "
                         f"{'it' if vector else 'that column'}, e.g. express it in larger units")


def feature_names_of(X: Any) -> list[str] | None:
    """Column names of a pandas-style DataFrame ``X`` when they are all strings (scikit-learn's rule), else None."""
    if isinstance(X, (np.ndarray, torch.Tensor)):
        return None
    cols = getattr(X, "columns", None)
    if cols is None or not hasattr(X, "to_numpy"):
        return None
    names = list(cols)
    if not names or not all(isinstance(c, str) for c in names):
        return None
    return names


def check_feature_names(feature_names: Any, n_features: int, name: str = "feature_names") -> list[str] | None:
    """Check user feature names: ``None``, or ``n_features`` distinct non-empty strings; returns a list or None.

    Raises
    ------
    TypeError
        Not a sequence of strings.
    ValueError
        Wrong length, an empty name, or duplicates.
    """
    if feature_names is None:
        return None
    if isinstance(feature_names, (str, bytes)) or not isinstance(feature_names, (Sequence, np.ndarray)):
        raise TypeError(f"{name} must be a sequence of str (one per column of X); got {_describe(feature_names)}")
    names = list(feature_names)
    bad = next((v for v in names if not isinstance(v, str)), _NO_ENTRY)
    if bad is not _NO_ENTRY:
        raise TypeError(f"{name} must hold strings; got {bad!r} of type {_describe(bad)}")
    if len(names) != n_features:
        raise ValueError(f"{name} has {len(names)} names but X has {n_features} columns")
    if any(not n.strip() for n in names):
        raise ValueError(f"{name} holds an empty name")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{name} holds duplicate names: {', '.join(map(repr, dup))}")
    return names


def check_feature_columns(X: Any, feature_names: Sequence[str] | None, name: str = "X_new", *,
                          what: str = "the model") -> None:
    """Refuse a DataFrame ``X`` whose columns are not the ones seen in fit (``feature_names``), in the same order.

    Plain arrays, tensors and DataFrames whose column names are not all strings (:func:`feature_names_of`) are
    used by position, unchecked. A DataFrame given to a model fitted without names (``feature_names`` None) is
    used by position with a ``UserWarning``, scikit-learn's rule.

    Raises
    ------
    ValueError
        Columns missing, unexpected or in another order; the message names them.
    """
    given = feature_names_of(X)
    if given is None:
        return
    if feature_names is None:
        warnings.warn(f"{name} has feature names ({_names(given)}) but {what} was fitted without feature names; its "
                      f"columns are used by position", UserWarning, stacklevel=3)
        return
    fitted = [str(n) for n in feature_names]
    if given == fitted:
        return
    missing = [n for n in fitted if n not in given]
    extra = [n for n in given if n not in fitted]
    parts = ([f"missing {_names(missing)}"] if missing else []) + ([f"unexpected {_names(extra)}"] if extra else [])
    if not parts:
        parts = [f"the same names in another order ({_names(given)})"]
    raise ValueError(f"{name}'s columns do not match those {what} was fitted with ({_names(fitted)}): "
                     f"{'; '.join(parts)}. Select them by name in that order (X[{fitted!r}]), or pass a plain array "
                     f"(columns by position)")


def _names(names: Sequence[str], shown: int = 8) -> str:
    """``'a', 'b', ...`` for a message: the first ``shown`` names, then how many more."""
    more = len(names) - shown
    return ", ".join(map(repr, names[:shown])) + (f" and {more} more" if more > 0 else "")


def check_finite_prediction(mean: torch.Tensor, var: torch.Tensor, name: str = "X_new", *,
                            what: str = "the predictive") -> None:
    """Refuse a predictive whose mean or variance is not finite, naming the rows of ``name`` that caused it.

    A GP's predictive at finite inputs is finite in exact arithmetic (far from the data it is the prior); NaN or
    inf can only come from float64 overflow in the kernel (e.g. inputs around 1e300). gpvi then raises rather
    than return NaN without a word.

    Raises
    ------
    ValueError
        With the number of affected rows and the first few row indices.
    """
    bad = ~(torch.isfinite(mean) & torch.isfinite(var))
    while bad.dim() > 1:
        bad = bad.any(0)
    if bool(bad.any()):
        rows = bad.nonzero().flatten().tolist()
        shown = ", ".join(map(str, rows[:5])) + (", ..." if len(rows) > 5 else "")
        raise ValueError(f"{what} is not finite at {len(rows)} row(s) of {name} (rows {shown}): those "
                         f"inputs are too large for float64 arithmetic in the kernel; rescale them as the "
                         f"training inputs were")


def check_theta(theta: Any, dim: int, name: str = "theta", *, device: torch.device | str | None = None,
                dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Check a parameter vector ``(D,)`` or a batch ``(S, D)`` with ``D == dim``.

    Tensors that require grad are kept in the autograd graph (only converted if dtype/device differ).
    """
    check_not_meta(theta, name)
    if isinstance(theta, torch.Tensor) and theta.dtype == dtype and theta.is_floating_point():
        t = theta if device is None else theta.to(device)
        if t.dim() not in (1, 2):
            raise ValueError(f"{name} must have shape (D,) or (S, D) with D = {dim}; got shape {tuple(t.shape)}")
    else:
        if isinstance(theta, torch.Tensor) and theta.requires_grad and theta.is_floating_point():
            t = theta.to(dtype=dtype, device=device if device is not None else theta.device)
        else:
            t = as_float_tensor(theta, name, ndim=(1, 2), finite=False, allow_empty=True, device=device, dtype=dtype)
    if t.shape[-1] != dim:
        raise ValueError(f"{name} must have length D = {dim} in its last dimension; got shape {tuple(t.shape)}")
    if t.dim() == 2 and t.shape[0] == 0:
        raise ValueError(f"{name} is an empty batch (shape {tuple(t.shape)})")
    return t


def check_sample_weight(sample_weight: Any, n: int, name: str = "sample_weight", *,
                        device: torch.device | str | None = None) -> torch.Tensor | None:
    """``None``, or ``sample_weight`` as a float64 tensor of shape ``(n,)``: finite, non-negative, positive sum.

    Raises
    ------
    ValueError
        Wrong length or shape, a NaN/inf, a negative weight, or weights that sum to zero (the message names
        ``name``).
    TypeError
        Non-numeric values.
    """
    if sample_weight is None:
        return None
    w = as_float_tensor(sample_weight, name, ndim=1, allow_empty=True, device=device)
    if w.shape[0] != n:
        raise ValueError(f"{name} has {w.shape[0]} values but there are {n} rows")
    if w.numel() and bool((w < 0).any()):
        raise ValueError(f"{name} must be non-negative; got min {float(w.min()):g}")
    if not float(w.sum()) > 0:
        raise ValueError(f"{name}: the weights are all zero; at least one must be positive")
    return w


def check_binary_labels(y: Any, name: str = "y", *, device: torch.device | str | None = None
                        ) -> tuple[torch.Tensor, np.ndarray]:
    """Check binary labels in {0, 1} or {-1, +1} (or booleans).

    Returns
    -------
    y01 : torch.Tensor of shape (n,)
        float64 labels in {0, 1} (0 = the smaller class value).
    classes : numpy.ndarray of shape (2,)
        The two original label values, sorted (``classes[1]`` is the positive class).

    Raises
    ------
    ValueError
        Not 1-D, empty, non-finite, only one class present, more than two classes, or a label set other than
        {0, 1} / {-1, +1}.
    """
    t = as_float_tensor(y, name, ndim=(1, 2), device=device)
    if t.dim() == 2:
        if t.shape[1] != 1:
            raise ValueError(f"{name} must be 1-D (one label per row); got shape {tuple(t.shape)}")
        t = t[:, 0]
    values = sorted(set(torch.unique(t).cpu().tolist()))
    if len(values) > 2:
        shown = ", ".join(f"{v:g}" for v in values[:6])
        raise ValueError(f"{name} must hold two classes, {{0, 1}} or {{-1, +1}}; got {len(values)} distinct "
                         f"values ({shown}{', ...' if len(values) > 6 else ''})")
    if len(values) < 2:
        raise ValueError(f"{name} holds a single class ({values[0]:g}); binary classification needs both classes")
    if values == [0.0, 1.0]:
        classes = np.array([0, 1])
    elif values == [-1.0, 1.0]:
        classes = np.array([-1, 1])
    else:
        raise ValueError(f"{name} must use labels {{0, 1}} or {{-1, +1}}; got {{{values[0]:g}, {values[1]:g}}}")
    y01 = (t == 1.0).to(torch.float64)
    return y01, classes
