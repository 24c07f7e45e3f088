"""BayesianLogisticRegression takes a DataFrame's column names and refuses, at prediction, a DataFrame whose columns
are not those (a reordered frame would otherwise be read by position: a silently wrong probability)."""

import numpy as np
import pytest
import torch

from gpvi.models.logistic import BayesianLogisticRegression

pd = pytest.importorskip("pandas")


def _frame():
    rng = np.random.default_rng(0)
    X = pd.DataFrame(rng.standard_normal((40, 3)), columns=["age", "bmi", "dose"])
    return X, (X["bmi"] > 0).astype(int)


def test_names_come_from_the_frame_and_predictions_match_the_array():
    X, y = _frame()
    m = BayesianLogisticRegression(X, y)
    assert m.names == ["bias", "age", "bmi", "dose"] and m.feature_names == ["age", "bmi", "dose"]
    theta = torch.tensor([0.1, 0.0, 2.0, -1.0], dtype=torch.float64)
    by_name = m.predict_proba(X.iloc[:5], theta)
    by_position = m.predict_proba(X.iloc[:5].to_numpy(), theta)
    closed = torch.sigmoid(0.1 + torch.as_tensor(X.iloc[:5].to_numpy()) @ theta[1:])
    assert torch.allclose(by_name, closed, rtol=0, atol=1e-15) and torch.equal(by_name, by_position)


def test_a_reordered_or_renamed_frame_is_refused_naming_the_columns():
    X, y = _frame()
    m = BayesianLogisticRegression(X, y)
    theta = torch.zeros(4, dtype=torch.float64)
    with pytest.raises(ValueError, match="another order"):
        m.predict_proba(X[["dose", "bmi", "age"]], theta)
    with pytest.raises(ValueError, match="weight"):
        m.predict_proba(X.rename(columns={"dose": "weight"}), theta)


def test_given_names_win_and_arrays_keep_the_default_names():
    X, y = _frame()
    assert BayesianLogisticRegression(X, y, feature_names=["a", "b", "c"]).names == ["bias", "a", "b", "c"]
    plain = BayesianLogisticRegression(X.to_numpy(), y.to_numpy(), bias=False)
    assert plain.names == ["w[0]", "w[1]", "w[2]"] and plain.feature_names is None
