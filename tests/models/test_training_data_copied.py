"""A model owns its training data: editing the caller's array after the model is built changes nothing (before, a
float64 NumPy array or tensor was used in place, so an in-place edit silently changed the fitted model)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gpvi
from gpvi.models.classification import GPClassification
from gpvi.models.logistic import BayesianLogisticRegression
from gpvi.models.multiclass import GPMulticlass


def _data(kind):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((24, 2))
    y = {"regression": np.sin(X[:, 0]), "binary": (X[:, 0] > 0).astype(float),
         "multiclass": np.digitize(X[:, 0], [-0.5, 0.5]).astype(float)}[kind]
    return X, y


@pytest.mark.parametrize("as_tensor", [False, True], ids=["numpy", "tensor"])
@pytest.mark.parametrize("kind, build", [
    ("regression", lambda X, y: gpvi.GPRegression(X, y)),
    ("binary", lambda X, y: GPClassification(X, y)),
    ("multiclass", lambda X, y: GPMulticlass(X, y)),
    ("binary", lambda X, y: BayesianLogisticRegression(X, y)),
], ids=["GPRegression", "GPClassification", "GPMulticlass", "BayesianLogisticRegression"])
def test_editing_the_callers_arrays_does_not_change_the_model(kind, build, as_tensor):
    X, y = _data(kind)
    if as_tensor:
        X, y = torch.from_numpy(X), torch.from_numpy(y)
    model = build(X, y)
    stored = {k: getattr(model, k).clone() for k in ("X", "y", "Phi") if isinstance(getattr(model, k, None),
                                                                               torch.Tensor)}
    theta = model.initial_theta()
    joint = getattr(model, "log_joint", None)
    before = joint(theta) if joint is not None else None
    X[0, 0] += 100.0
    y[0] = y[0] + 100.0 if kind == "regression" else (y[0] + 1) % (2 if kind == "binary" else 3)
    assert stored and all(torch.equal(getattr(model, k), v) for k, v in stored.items())
    if joint is not None:
        assert torch.equal(joint(theta), before)


def test_a_dataframe_is_copied_once_and_not_shared():
    """pandas values (possibly a view of the frame's memory) are not shared either; a float32 array, which the
    conversion copies anyway, is not copied twice (the result is still the model's own)."""
    pd = pytest.importorskip("pandas")
    X, y = _data("regression")
    df = pd.DataFrame(X, columns=["a", "b"])
    model = gpvi.GPRegression(df, y)
    before = model.X.clone()
    df.iloc[0, 0] = 100.0
    assert torch.equal(model.X, before)
    X32 = X.astype(np.float32)
    model32 = gpvi.GPRegression(X32, y)
    X32[0, 0] = 100.0
    assert float(model32.X[0, 0]) != 100.0
