"""Natural-scale summary columns for a q(theta) whose target wraps a model (the classifier's ``"bayes"`` fit)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import gpvi
from gpvi.inference.cvi.bound import CVIBoundTarget
from gpvi.inference.cvi.ep_evidence import EPEvidenceTarget

F64 = torch.float64


def _data(n=30):
    g = torch.Generator().manual_seed(4)
    X = torch.rand((n, 2), generator=g, dtype=F64) * 4 - 2
    y = (torch.rand(n, generator=g, dtype=F64) < torch.sigmoid(3 * X[:, 0])).to(F64)
    return X, y


@pytest.mark.parametrize("wrap", [lambda m: CVIBoundTarget(m), lambda m: EPEvidenceTarget(CVIBoundTarget(m))],
                         ids=["cvi-bound", "ep-evidence"])
def test_a_target_over_a_classifiers_hyperparameters_gives_natural_columns(wrap):
    model = gpvi.GPClassification(*_data())
    q = gpvi.GaussianPosterior(torch.tensor([0.0, 1.0, -2.0], dtype=F64), 0.1 * torch.eye(3, dtype=F64),
                               model.names, wrap(model))
    s = q.summary()
    assert s.column("natural") == model.natural_names == ["lengthscale[0]", "lengthscale[1]", "signal_var"]
    assert s["log_lengthscale_sq[1]"]["nat_q50"] == pytest.approx(math.exp(0.5), rel=1e-12)     # exp(theta / 2)
    assert s["log_signal_var"]["nat_q50"] == pytest.approx(math.exp(-2.0), rel=1e-12)
    assert "natural" not in q.summary(natural=False).columns


def test_the_fully_bayesian_classifiers_hyperparameter_posterior_has_natural_columns():
    X, y = _data()
    clf = gpvi.GPClassifier(hyperparameters="bayes", random_state=0).fit(X.numpy(), y.numpy().astype(int))
    s = clf.hyperparameter_posterior_.summary()
    assert s.column("natural") == clf.model_.natural_names
    nat = clf.model_.natural(torch.tensor(s.column("q50"), dtype=F64))
    assert np.allclose(s.column("nat_q50"), nat.tolist(), rtol=1e-12)
    assert clf.posterior_.summary().column("natural") == clf.model_.natural_names


def test_natural_columns_need_matching_names():
    """A model whose names are not the posterior's gives no natural columns (they would be mislabelled)."""

    class Wrapper:
        def __init__(self, model):
            self.model, self.names = model, ["a", "b", "c"]

    model = gpvi.GPClassification(*_data())
    q = gpvi.GaussianPosterior(torch.zeros(3, dtype=F64), torch.eye(3, dtype=F64), ["a", "b", "c"], Wrapper(model))
    assert "natural" not in q.summary().columns


def test_a_latent_models_natural_takes_a_batch_of_theta():
    model = gpvi.GPClassification(*_data())
    theta = torch.tensor([[0.0, 1.0, -2.0], [0.5, -1.0, 3.0]], dtype=F64)
    batch = model.natural(theta)
    assert batch.shape == (2, 3) and torch.equal(batch[1], model.natural(theta[1]))
    assert torch.equal(model.natural(), model.natural(model.theta))
    with pytest.raises(ValueError, match="theta must have length D = 3"):
        model.natural(torch.zeros(2, 4, dtype=F64))
