"""Predictive quantiles and intervals (issue 16, item 5): Gaussian against scipy, mixtures against a root of the
mixture CDF found by scipy's brentq and against Monte Carlo draws; errors; no NaN predictive without a word."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gpvi
from gpvi.numerics.predictive import MixturePredictive
from tests.conftest import make_gp_data

st = pytest.importorskip("scipy.stats")


def test_gaussian_quantile_and_interval_match_scipy():
    m = torch.tensor([0.0, -3.0, 1e3], dtype=torch.float64)
    v = torch.tensor([1.0, 0.25, 4e2], dtype=torch.float64)
    pred = MixturePredictive(m, v)
    ps = [1e-9, 0.05, 0.3, 0.5, 0.95, 1 - 1e-9]
    q = pred.quantile(ps)
    ref = st.norm.ppf(np.array(ps)[:, None], m.numpy(), np.sqrt(v.numpy()))
    np.testing.assert_allclose(q.numpy(), ref, rtol=1e-12, atol=1e-12)
    assert pred.quantile(0.5).shape == (3,) and torch.equal(pred.quantile(0.5), m)
    lo, hi = pred.interval(0.9)
    np.testing.assert_allclose(lo.numpy(), st.norm.ppf(0.05, m.numpy(), np.sqrt(v.numpy())), rtol=1e-12)
    np.testing.assert_allclose(hi.numpy(), st.norm.ppf(0.95, m.numpy(), np.sqrt(v.numpy())), rtol=1e-12)


def test_mixture_quantiles_solve_the_mixture_cdf():
    from scipy.optimize import brentq

    g = torch.Generator().manual_seed(0)
    S, n = 40, 6
    means = 3 * torch.randn(S, n, generator=g, dtype=torch.float64)
    variances = 0.05 + torch.rand(S, n, generator=g, dtype=torch.float64)
    means[:, 5] = torch.where(torch.arange(S) < S // 2, -5.0, 5.0)          # a bimodal point: median in the gap
    variances[:, 5] = 0.01
    pred = MixturePredictive(means, variances)
    ps = [1e-6, 0.025, 0.5, 0.9, 0.975]
    q = pred.quantile(ps)
    for i in range(n):
        mu, sd = means[:, i].numpy(), np.sqrt(variances[:, i].numpy())
        for j, p in enumerate(ps):
            # scipy's mixture CDF at gpvi's quantile is p (to rounding) ...
            assert abs(st.norm.cdf(float(q[j, i]), mu, sd).mean() - p) <= 1e-12 * max(p, 1e-3), (i, p)
            if i == 5 and p == 0.5:
                continue        # ... and where the CDF is not flat in float64, the root is brentq's
            ref = brentq(lambda x: st.norm.cdf(x, mu, sd).mean() - p, -60, 60, xtol=1e-14, rtol=1e-15)
            assert abs(float(q[j, i]) - ref) <= 1e-9 * max(1.0, abs(ref)), (i, p, float(q[j, i]), ref)
    np.testing.assert_allclose(pred.cdf(q[3]).numpy(), 0.9, rtol=1e-12)
    assert -5.0 < float(q[2, 5]) < 5.0                                       # a point between the two modes
    # interval = the (1 -+ level)/2 quantiles
    lo, hi = pred.interval(0.95)
    assert torch.allclose(lo, q[1], rtol=0, atol=1e-12) and torch.allclose(hi, q[4], rtol=0, atol=1e-12)


def test_mixture_interval_covers_monte_carlo_draws():
    g = torch.Generator().manual_seed(1)
    means = torch.randn(25, 4, generator=g, dtype=torch.float64)
    variances = 0.1 + torch.rand(25, 4, generator=g, dtype=torch.float64)
    pred = MixturePredictive(means, variances)
    k = torch.randint(0, 25, (200_000,), generator=g)
    draws = means[k] + variances[k].sqrt() * torch.randn(200_000, 4, generator=g, dtype=torch.float64)
    lo, hi = pred.interval(0.8)
    cover = ((draws >= lo) & (draws <= hi)).double().mean(0)
    # binomial sd of a coverage estimate from 200,000 draws: sqrt(0.8 * 0.2 / 2e5) = 0.0009; 5 sd
    assert torch.allclose(cover, torch.full((4,), 0.8, dtype=torch.float64), atol=0.0045), cover
    emp = torch.quantile(draws, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64), dim=0)
    assert torch.allclose(emp, pred.quantile([0.1, 0.5, 0.9]), atol=0.02)


def test_posterior_predict_gives_intervals_from_every_kind():
    X, y = make_gp_data(25, 1, seed=0)
    model = gpvi.GPRegression(X, y)
    theta = model.initial_theta()
    point = gpvi.PointPosterior(theta, model.names, model).predict(X[:4])
    m, v = model.predict(theta, X[:4])
    lo, hi = point.interval(0.9)
    assert torch.allclose(hi - m, 1.6448536269514722 * v.sqrt(), rtol=1e-12)
    q = gpvi.GaussianPosterior(theta, 0.1 * torch.eye(3, dtype=torch.float64), model.names, model)
    mix = q.predict(X[:4], num_draws=30, seed=0)
    lo, hi = mix.interval()
    assert bool((lo < mix.mean).all() and (mix.mean < hi).all())
    assert torch.allclose(mix.cdf(hi) - mix.cdf(lo), torch.full((4,), 0.9, dtype=torch.float64), atol=1e-12)


def test_bad_levels_and_non_finite_predictives_are_refused():
    pred = MixturePredictive(torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
    for bad, err in ((0.0, ValueError), (1.0, ValueError), ([0.5, 1.5], ValueError), ("0.5", TypeError),
                     (True, TypeError), ([[0.1]], ValueError), ([], ValueError)):
        with pytest.raises(err, match="p "):
            pred.quantile(bad)
    for bad, err in ((1.0, ValueError), (0.0, ValueError), ("0.9", TypeError), (float("nan"), ValueError)):
        with pytest.raises(err, match="level"):
            pred.interval(bad)
    with pytest.raises(ValueError, match="not finite .* at 1 test point"):
        MixturePredictive(torch.tensor([0.0, float("nan")], dtype=torch.float64), torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="not finite"):
        MixturePredictive(torch.zeros(2, dtype=torch.float64), torch.tensor([1.0, float("inf")], dtype=torch.float64))


def test_categorical_predictive_log_prob_labels_and_bad_labels():
    from gpvi.posteriors.latent import CategoricalPredictive

    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]], dtype=torch.float64)
    pred = CategoricalPredictive(probs, np.array(["cat", "dog", "emu"]))
    # independent answer: the log of the probability of each point's label, read off by hand
    torch.testing.assert_close(pred.log_prob(["dog", "emu"]), torch.log(torch.tensor([0.2, 0.6], dtype=torch.float64)),
                               rtol=0, atol=1e-15)
    assert pred.labels.tolist() == ["cat", "emu"] and pred.mean is probs
    with pytest.raises(ValueError, match=r"y holds labels that are not among the classes .*'owl'"):
        pred.log_prob(["cat", "owl"])
    with pytest.raises(ValueError, match=r"y must hold 2 labels"):
        pred.log_prob(["cat"])
