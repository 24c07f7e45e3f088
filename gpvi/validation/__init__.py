"""The input-validation layer used by every public entry point.

Everything that crosses the public boundary (data, hyperparameter vectors, labels, settings) is checked
here and converted once: numeric arrays become float64 tensors on the requested device, never downcast.
Errors are ``TypeError`` (wrong kind of object) or ``ValueError`` (right kind, bad value) and always name
the argument and what was wrong, e.g. ``"X has 120 rows but y has 119"``; work that would not fit in free memory
is refused with a ``MemoryError`` before anything is allocated.

* :mod:`~gpvi.validation.arrays` -- data, targets, labels, weights and parameter vectors;
* :mod:`~gpvi.validation.settings` -- scalar settings (numbers, counts, fractions, choices, flags);
* :mod:`~gpvi.validation.memory` -- free memory and the refusal of work that exceeds it.
"""

from .arrays import (as_float_tensor, check_binary_labels, check_column_spread, check_device, check_feature_columns,
                     check_feature_names, check_finite_prediction, check_not_meta, check_sample_weight, check_theta,
                     check_X, check_X_y, feature_names_of)
from .memory import check_memory
from .settings import (check_bool, check_choice, check_fraction, check_interval, check_nonnegative_int,
                       check_positive, check_positive_int, check_real)

__all__ = ["as_float_tensor", "check_X", "check_X_y", "check_theta", "check_binary_labels", "check_sample_weight",
           "check_real", "check_interval", "check_positive", "check_positive_int", "check_nonnegative_int",
           "check_fraction", "check_choice", "check_bool", "check_memory", "check_device", "check_not_meta",
           "check_column_spread", "feature_names_of", "check_feature_names", "check_feature_columns",
           "check_finite_prediction"]
