"""Missing labels (issue 58): ``None``, NaN or ``pandas.NA`` among object labels is a ValueError naming ``y`` and
the rows, not a TypeError from sorting the labels."""

from __future__ import annotations

import numpy as np
import pytest

from gpvi.models.multiclass import GPMulticlass
from gpvi.sklearn import GPClassifier


def _X(n=12):
    return np.random.default_rng(0).uniform(-2, 2, (n, 2))


@pytest.mark.parametrize("missing", [None, float("nan"), np.float32("nan")])
@pytest.mark.parametrize("fit", ["GPClassifier", "GPMulticlass"])
def test_a_missing_label_is_a_clear_error_naming_y(fit, missing):
    y = np.array(["a", "b", "c", missing] * 3, dtype=object)
    with pytest.raises(ValueError, match=r"y contains missing labels \(None or NaN\) at 3 row\(s\) \(3, 7, 11\); "
                                         r"drop those rows or give them a label"):
        if fit == "GPClassifier":
            GPClassifier(hyperparameters="fixed", max_sweeps=2).fit(_X(), y)
        else:
            GPMulticlass(_X(), y)


def test_pandas_missing_labels_are_named_too():
    pd = pytest.importorskip("pandas")
    y = pd.Series(["a", "b", None, "a", "b", pd.NA], dtype=object)
    with pytest.raises(ValueError, match=r"y contains missing labels \(None or NaN\) at 2 row\(s\) \(2, 5\)"):
        GPClassifier(hyperparameters="fixed", max_sweeps=2).fit(_X(6), y)


def test_labels_without_missing_values_still_fit():
    y = np.array(["a", "b", "c"] * 4, dtype=object)
    clf = GPClassifier(hyperparameters="fixed", max_sweeps=2).fit(_X(), y)
    assert list(clf.classes_) == ["a", "b", "c"]
