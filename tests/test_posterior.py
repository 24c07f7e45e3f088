"""Posterior objects and predictive mixtures: closed forms, shapes, names."""

from __future__ import annotations

import math

import pytest
import torch

import gpvi
from gpvi.metrics import compare, error_rate, log_loss_bits, nlpd, smse
from tests.conftest import make_gp_data


def test_two_component_mixture_nlpd_by_hand():
    means = torch.tensor([[0.0, 1.0], [2.0, 1.0]], dtype=torch.float64)
    variances = torch.tensor([[1.0, 0.5], [4.0, 0.5]], dtype=torch.float64)
    pred = gpvi.MixturePredictive(means, variances)
    y = torch.tensor([0.5, 3.0], dtype=torch.float64)

    def npdf(x, m, v):
        return math.exp(-0.5 * (x - m) ** 2 / v) / math.sqrt(2 * math.pi * v)

    p0 = 0.5 * npdf(0.5, 0.0, 1.0) + 0.5 * npdf(0.5, 2.0, 4.0)
    p1 = 0.5 * npdf(3.0, 1.0, 0.5) + 0.5 * npdf(3.0, 1.0, 0.5)
    assert abs(nlpd(pred, y) - (-(math.log(p0) + math.log(p1)) / 2)) < 1e-12
    # moments by the law of total variance
    assert torch.allclose(pred.mean, torch.tensor([1.0, 1.0], dtype=torch.float64))
    assert abs(float(pred.var[0]) - (0.5 * (1 + 0) + 0.5 * (4 + 4) - 1.0)) < 1e-12
    # smse uses the variance of the test targets
    assert abs(smse(pred, y) - (((0.5 - 1) ** 2 + (3 - 1) ** 2) / 2) / float(y.var(unbiased=False))) < 1e-12


def test_mixture_log_prob_does_not_underflow():
    pred = gpvi.MixturePredictive(torch.zeros(3, 1, dtype=torch.float64), torch.full((3, 1), 1e-4, dtype=torch.float64))
    lp = pred.log_prob(torch.tensor([1.0], dtype=torch.float64))
    assert math.isfinite(float(lp)) and float(lp) < -4000


def _gaussian(D=3, base=None):
    g = torch.Generator().manual_seed(0)
    C = torch.tril(torch.randn(D, D, generator=g, dtype=torch.float64)) * 0.3
    C.diagonal().copy_(torch.rand(D, generator=g, dtype=torch.float64) + 0.5)
    mu = torch.randn(D, generator=g, dtype=torch.float64)
    return gpvi.GaussianPosterior(mu, C, [f"t{i}" for i in range(D)], base=base)


def test_gaussian_posterior_log_prob_and_moments():
    q = _gaussian()
    mvn = torch.distributions.MultivariateNormal(q.mean, scale_tril=q.scale_tril)
    th = mvn.sample((5,))
    assert torch.allclose(q.log_prob(th), mvn.log_prob(th), atol=1e-12)
    assert torch.allclose(q.log_prob(th[0]), mvn.log_prob(th[0]), atol=1e-12)
    assert torch.allclose(q.covariance, q.scale_tril @ q.scale_tril.T)
    draws = q.sample(40000, seed=1)
    # MC error of a mean: sd / sqrt(n) <= 1.5 / 200; allow 5 standard errors
    assert float((draws.mean(0) - q.mean).abs().max()) < 5 * 1.5 / 200
    assert torch.equal(q.sample(10, seed=3), q.sample(10, seed=3))
    t = q.summary()
    assert t.index == q.names and set(["mean", "sd", "q5", "q50", "q95"]) <= set(t.columns)
    sd = torch.sqrt(torch.diagonal(q.covariance))
    assert abs(t["t1"]["q95"] - (float(q.mean[1]) + 1.6448536269514722 * float(sd[1]))) < 1e-9


def test_student_t_base_covariance_and_log_prob():
    base = gpvi.StandardStudentT(3, df=5.0)
    q = _gaussian(base=base)
    assert torch.allclose(q.covariance, q.scale_tril @ q.scale_tril.T * 5.0 / 3.0)
    th = q.sample(4, seed=2)
    z = torch.linalg.solve_triangular(q.scale_tril, (th - q.mean).T, upper=False).T
    ref = torch.distributions.StudentT(5.0).log_prob(z).sum(-1) - torch.log(torch.diagonal(q.scale_tril)).sum()
    assert torch.allclose(q.log_prob(th), ref.to(torch.float64), atol=1e-6)
    draws = base.sample(200000, torch.Generator().manual_seed(0))
    assert abs(float(draws.var()) - 5.0 / 3.0) < 0.05


def test_state_dict_round_trip():
    q = _gaussian()
    q2 = gpvi.GaussianPosterior.from_state_dict(q.state_dict())
    assert torch.equal(q2.mean, q.mean) and torch.equal(q2.scale_tril, q.scale_tril) and q2.names == q.names


def test_to_arviz_round_trips_names_and_shapes():
    q = _gaussian()
    idata = q.to_arviz(num_draws=100)
    assert list(idata.posterior.data_vars) == q.names
    assert idata.posterior["t0"].shape == (1, 100)
    draws = torch.randn(4, 50, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mc = gpvi.SamplePosterior(draws, q.names, stats={"diverging": torch.zeros(4, 50, dtype=torch.bool)})
    idata = mc.to_arviz()
    assert idata.posterior["t2"].shape == (4, 50)
    assert (idata.posterior["t2"].values == draws[:, :, 2].numpy()).all()
    assert "diverging" in idata.sample_stats


def test_sample_posterior_summary_has_diagnostics_and_compare_identical_is_zero():
    draws = torch.randn(4, 200, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mc = gpvi.SamplePosterior(draws, ["a", "b"])
    s = mc.summary()
    assert {"ess", "r_hat"} <= set(s.columns)
    assert 400 < s["a"]["ess"] < 1600 and abs(s["a"]["r_hat"] - 1) < 0.02      # iid draws: ess ~ 800
    t = compare(mc, gpvi.SamplePosterior(draws.clone(), ["a", "b"]))
    assert t.column("dmean_sd") == [0.0, 0.0] and t.column("sd_ratio") == [1.0, 1.0] and t.column("w1") == [0.0, 0.0]
    with pytest.raises(ValueError, match="different parameters"):
        compare(mc, gpvi.SamplePosterior(draws, ["a", "c"]))


def test_summary_natural_scale_for_gp():
    X, y = make_gp_data(20, 1)
    model = gpvi.GPRegression(X, y)
    q = gpvi.GaussianPosterior(torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64),
                               0.1 * torch.eye(3, dtype=torch.float64), model.names, model)
    s = q.summary()
    assert s.column("natural") == ["lengthscale[0]", "signal_var", "noise_var"]
    assert abs(s["log_lengthscale_sq[0]"]["nat_q50"] - 1.0) < 1e-12                 # exp(0/2)
    assert abs(s["log_noise_var"]["nat_q50"] - math.exp(-2.0)) < 1e-12
    # lognormal mean exp(mu + s^2/2) for the variance parameters, MC with 4000 draws: within 1%
    assert abs(s["log_signal_var"]["nat_mean"] / math.exp(1.0 + 0.005) - 1) < 0.01
    pred = q.predict(X[:3], num_draws=7)
    assert pred.num_components == 7 and pred.mean.shape == (3,)


def test_classification_metrics():
    y = torch.tensor([0, 1, 1, 0])
    p = torch.tensor([0.2, 0.9, 0.4, 0.5], dtype=torch.float64)
    assert error_rate(p, y) == 0.25
    expected = -(math.log2(0.8) + math.log2(0.9) + math.log2(0.4) + math.log2(0.5)) / 4
    assert abs(log_loss_bits(p, y) - expected) < 1e-12
    assert error_rate(p, torch.tensor([-1, 1, 1, -1])) == 0.25
    with pytest.raises(ValueError, match="p must hold probabilities"):
        error_rate(p * 2, y)
    with pytest.raises(ValueError, match="three|two classes"):
        error_rate(p, torch.tensor([0, 1, 2, 0]))


def test_state_dicts_load_with_weights_only(tmp_path):
    X, y = make_gp_data(20, 1)
    model = gpvi.GPRegression(X, y)
    fit = gpvi.ML2(num_restarts=2, seed=0).run(model)
    q = _gaussian()
    mc = gpvi.SamplePosterior(torch.zeros(2, 5, 3, dtype=torch.float64), ["a", "b", "c"],
                              info={"table": gpvi.Table(["x"], {"v": [1.0]}), "arr": torch.ones(2)})
    for post in (fit, q, mc):
        torch.save(post.state_dict(), tmp_path / "s.pt")
        loaded = torch.load(tmp_path / "s.pt", weights_only=True)
        assert loaded["kind"] == post.state_dict()["kind"]
    assert torch.load(tmp_path / "s.pt", weights_only=True)["info"]["table"]["columns"]["v"] == [1.0]
