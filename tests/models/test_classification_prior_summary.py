"""``GPClassification.prior_summary``: each theta component's prior as used, with its numbers."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import Independent, MultivariateNormal, Normal, StudentT

import gpvi
from gpvi.models.multiclass import GPMulticlass

F64 = torch.float64


def _model():
    X = torch.stack([torch.linspace(-1, 1, 12, dtype=F64), torch.linspace(0, 30, 12, dtype=F64) ** 0.5], 1)
    return gpvi.GPClassification(X, (X[:, 0] > 0).double())


def test_the_default_prior_is_named_with_its_numbers():
    m = _model()
    assert m.prior_summary() == {n: "N(0, 10) on theta (gpvi default)" for n in m.names}
    assert set(m.prior_summary(None).values()) == {"flat (no prior)"}


def test_the_scaled_prior_states_each_centre():
    m = _model()
    centre = m.scaled_theta()
    out = m.prior_summary("scaled")
    for name, c in zip(m.names, centre.tolist()):
        assert out[name] == f"N({c:.4g}, 10) on theta (gpvi 'scaled': centred at the data's scales)"
    assert len(set(out.values())) == 3                   # the centres differ: two input scales, the signal at 0


@pytest.mark.parametrize("prior, expected", [
    (Independent(Normal(torch.zeros(3, dtype=F64), 2 * torch.ones(3, dtype=F64)), 1), "N(0, 4) on theta"),
    (Normal(torch.ones(3, dtype=F64), 3 * torch.ones(3, dtype=F64)), "N(1, 9) on theta"),
    (MultivariateNormal(torch.zeros(3, dtype=F64), 5 * torch.eye(3, dtype=F64)), "N(0, 5) on theta (a marginal of the MultivariateNormal)"),
    (Independent(StudentT(4.0, torch.zeros(3, dtype=F64), torch.ones(3, dtype=F64)), 1),
     "Independent(StudentT) over theta (mean 0, variance 2)"),
], ids=["independent-normal", "normal", "mvn", "student-t"])
def test_a_distribution_over_theta_is_described_not_only_named(prior, expected):
    out = _model().prior_summary(prior)
    assert set(out.values()) == {expected}


def test_the_multiclass_model_says_the_same():
    X = torch.linspace(-2, 2, 15, dtype=F64)[:, None]
    m = GPMulticlass(X, (X[:, 0] > -0.7).long() + (X[:, 0] > 0.7).long())
    assert set(m.prior_summary().values()) == {"N(0, 10) on theta (gpvi default)"}
    assert m.prior_summary("scaled")["log_signal_var"] == "N(0, 10) on theta (gpvi 'scaled': centred at the data's scales)"
