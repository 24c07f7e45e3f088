"""Scalar settings at the public boundary: numbers, counts, fractions, intervals, choices and flags.

Each check names the argument and returns the value in its plain Python type (``float``, ``int``, ``str``,
``bool``); a bool is never a number here, and NaN never a valid value.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["check_real", "check_interval", "check_positive", "check_positive_int", "check_nonnegative_int",
           "check_fraction", "check_choice", "check_bool"]


def _describe(x: Any) -> str:
    return type(x).__name__


def _is_real_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.is_complex()
    return isinstance(value, numbers.Real)


def check_real(value: Any, name: str, *, allow_inf: bool = True) -> float:
    """Check a real number (not a bool, a string or NaN) and return it as float; ``inf`` only if ``allow_inf``."""
    if not _is_real_number(value):
        raise TypeError(f"{name} must be a real number; got {_describe(value)}")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{name} must be {'a number' if allow_inf else 'finite'}; got {v}")
    return v


def check_interval(value: Any, name: str) -> tuple[float, float]:
    """Check a pair ``(low, high)`` of real numbers with ``low < high`` (a box for every coordinate) and return it
    as floats."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        raise TypeError(f"{name} must be a pair (low, high) of numbers; got {value!r}")
    lo, hi = (check_real(b, name) for b in value)
    if not lo < hi:
        raise ValueError(f"{name} must be (low, high) with low < high; got {value!r}")
    return lo, hi


def check_positive(value: Any, name: str, *, allow_zero: bool = False, allow_inf: bool = False) -> float:
    """Check a positive real setting (step size, variance, tolerance) and return it as float."""
    if not _is_real_number(value):
        raise TypeError(f"{name} must be a real number; got {_describe(value)}")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{name} must be finite; got {v}")
    if v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}; got {v:g}")
    return v


def check_positive_int(value: Any, name: str, *, minimum: int = 1) -> int:
    """Check an integer count (number of steps, draws, chains...) ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise TypeError(f"{name} must be an int; got {_describe(value)}")
    v = int(value)
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {v}")
    return v


def check_nonnegative_int(value: Any, name: str) -> int:
    """Check an integer ``>= 0``."""
    return check_positive_int(value, name, minimum=0)


def check_fraction(value: Any, name: str, *, low_open: bool = True, high_closed: bool = True) -> float:
    """Check a number in (0, 1] (default), e.g. a CVI step size beta or a test fraction."""
    if not _is_real_number(value):
        raise TypeError(f"{name} must be a real number; got {_describe(value)}")
    v = float(value)
    lo_ok = v > 0 if low_open else v >= 0
    hi_ok = v <= 1 if high_closed else v < 1
    if math.isnan(v) or not (lo_ok and hi_ok):
        interval = ("(" if low_open else "[") + "0, 1" + ("]" if high_closed else ")")
        raise ValueError(f"{name} must be in {interval}; got {v:g}")
    return v


def check_choice(value: Any, name: str, choices: Sequence[str]) -> str:
    """Check a string option against its allowed values."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {list(choices)}; got {_describe(value)}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}; got {value!r}")
    return value


def check_bool(value: Any, name: str) -> bool:
    """Check a boolean flag (numpy booleans accepted)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be True or False; got {_describe(value)}")
