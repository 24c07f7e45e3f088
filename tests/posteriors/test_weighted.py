"""PSIS of a posterior approximation: against closed forms (Gaussian targets) and against ArviZ itself."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import gpvi
from gpvi.exceptions import NumericalWarning
from gpvi.numerics.budget import MemoryBudget
from gpvi.posteriors import GaussianPosterior, Posterior, WeightedPosterior
from gpvi.posteriors.weighted import PSISWarning, batch_mcse, khat_threshold, pareto_smooth, psis

D = 3
M = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
A = torch.tensor([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [-0.3, 0.2, 0.5]], dtype=torch.float64)   # Sigma = A A^T
SIGMA = A @ A.T
PREC = torch.linalg.inv(SIGMA)
LOG_Z = 0.5 * D * math.log(2 * math.pi) + 0.5 * math.log(float(torch.det(SIGMA)))


def _log_joint(th):                              # unnormalised N(M, SIGMA): its evidence is exp(LOG_Z)
    r = th - M
    return -0.5 * ((r @ PREC) * r).sum(-1)


TARGET = gpvi.Target(_log_joint, names=["a", "b", "c"])


def _q(shift=0.3, inflate=1.3):
    return GaussianPosterior(M + shift, inflate * A, ["a", "b", "c"], TARGET)


def test_weighted_moments_and_evidence_match_the_closed_form():
    w = _q().psis(num_draws=20_000, seed=1)
    assert isinstance(w, WeightedPosterior) and w.khat < 0.5
    sd = torch.sqrt(torch.diagonal(SIGMA))
    assert ((w.mean - M).abs() / sd).max() < 0.05                     # q's mean is 0.3 off: the weights fix it
    assert ((w.std / sd) - 1).abs().max() < 0.05
    assert (w.covariance - SIGMA).abs().max() < 0.06
    assert abs(w.log_evidence - LOG_Z) < 4 * w.log_evidence_se + 1e-3
    assert 0 < w.log_evidence_se < 0.05
    from scipy.stats import norm
    q90 = w.quantile([0.05, 0.95])
    exact = torch.stack([M + sd * norm.ppf(0.05), M + sd * norm.ppf(0.95)])
    assert ((q90 - exact).abs() / sd).max() < 0.08


def test_a_too_narrow_q_has_a_large_khat_and_a_warning_that_says_what_to_do():
    narrow = GaussianPosterior(M, 0.25 * A, ["a", "b", "c"], TARGET)
    with pytest.warns(PSISWarning, match="NUTS"):
        w = narrow.psis(num_draws=2000, seed=0)
    assert w.khat > 0.7 and w.ess < 200
    assert "unreliable" in w.summary().title


def test_khat_and_weights_are_arvizs():
    import arviz as az

    q = _q(shift=0.8, inflate=0.9)
    w = q.psis(num_draws=1000, seed=3)
    gen = torch.Generator().manual_seed(3)
    theta = q.sample(1000, generator=gen)
    lr = (_log_joint(theta) - q.log_prob(theta)).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lw, k = az.psislw(lr.copy(), reff=1.0)
    assert torch.equal(w.draws, theta)
    np.testing.assert_allclose(w.log_weights.numpy(), lw, rtol=0, atol=1e-12)
    assert w.khat == pytest.approx(float(k), abs=1e-12)


def test_arviz_stats_path_agrees_when_installed(monkeypatch):
    pytest.importorskip("arviz_stats")
    import arviz as az

    rng = np.random.default_rng(0)
    lr = rng.normal(scale=0.7, size=3000)          # light tail: both versions smooth it the same way
    lw0, k0 = pareto_smooth(lr)
    monkeypatch.delattr(az, "psislw", raising=False)
    lw1, k1 = pareto_smooth(lr)
    assert abs(k0 - k1) < 0.05 and np.abs(np.exp(lw0) / np.exp(lw1) - 1).max() < 0.05


def test_minus_inf_log_joint_gets_weight_zero_and_is_counted():
    def half(th):
        out = _log_joint(th)
        return torch.where(th[:, 0] > 3.0, torch.full_like(out, -math.inf), out)

    q = GaussianPosterior(M, 1.5 * A, ["a", "b", "c"], gpvi.Target(half, names=["a", "b", "c"]))
    with pytest.warns(NumericalWarning, match="-inf"):
        w = q.psis(num_draws=3000, seed=0)
    bad = w.info["nonfinite_log_joint"]
    assert bad > 0 and float(w.weights[w.draws[:, 0] > 3.0].sum()) == 0.0
    assert math.isfinite(w.khat) and math.isfinite(w.log_evidence)


def test_resampling_follows_the_weights_and_the_state_round_trips():
    w = _q().psis(num_draws=2000, seed=0)
    s = w.sample(50_000, seed=0)
    assert ((s.mean(0) - w.mean).abs() / w.std).max() < 0.03
    assert torch.equal(w.sample(10, seed=5), w.sample(10, seed=5))
    back = Posterior.from_state_dict(w.state_dict(), TARGET)
    assert isinstance(back, WeightedPosterior) and torch.equal(back.mean, w.mean) and back.khat == w.khat
    assert back.to_arviz(num_draws=100).posterior["a"].shape == (1, 100)


def test_the_export_never_holds_more_draws_than_the_weights_support():
    """A poor proposal (ESS far below the draws): to_arviz exports at most floor(ESS) resampled draws, so ArviZ's
    ESS cannot read them as 1,000 independent draws, and its attrs carry k-hat, the ESS and the resampling."""
    import arviz as az
    w = _q(shift=1.5, inflate=0.6).psis(num_draws=1000, seed=0)
    assert w.ess < 300
    idata = w.to_arviz(num_draws=1000)
    n = idata.posterior["a"].shape[1]
    assert n == int(math.floor(w.ess))
    assert float(az.ess(idata)["a"]) <= 1.2 * w.ess
    assert idata.attrs["psis_khat"] == w.khat and idata.attrs["psis_ess"] == w.ess
    assert idata.attrs["psis_num_draws"] == 1000 and "resampled" in idata.attrs["draws"]


def test_batch_mcse_matches_the_spread_of_independent_estimates_and_the_khat_threshold():
    """The batch MCSE of a weighted mean is the sd of means of independent runs / sqrt(B) in expectation: for a
    good proposal it is close to sd / sqrt(ESS)."""
    w = _q().psis(num_draws=8000, seed=3)
    m = batch_mcse(w, 8)
    expect = w.std / math.sqrt(w.ess)
    assert bool((m["mean"] < 2.5 * expect).all()) and bool((m["mean"] > 0.3 * expect).all())
    assert m["std"].shape == (3,) and 0 < m["ess_min"] <= w.ess
    assert abs(khat_threshold(1000) - (1 - 1 / 3)) < 1e-12 and khat_threshold(10_000) == 0.7
    with pytest.raises(ValueError, match="num_batches"):
        batch_mcse(w, 1)


def test_gp_regression_goes_through_the_batched_log_joint_in_budgeted_chunks():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, generator=g, dtype=torch.float64)
    y = torch.sin(4 * X[:, 0]) + 0.1 * torch.randn(40, generator=g, dtype=torch.float64)
    model = gpvi.GPRegression(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = gpvi.DSVI(num_steps=200, num_elbo_draws=100, seed=0, progress_bar=False).run(model)
    budget = MemoryBudget(max_bytes=7 * model.memory_per_draw())
    w = psis(q, num_draws=300, seed=0, budget=budget)
    assert w.info["draws_per_call"] == 7
    assert math.isfinite(w.khat) and w.log_evidence >= q.elbo - 3 * (q.elbo_se + w.log_evidence_se)
    pred = w.predict(X[:5], num_draws=50)
    assert pred.mean.shape == (5,) and bool(torch.isfinite(pred.var).all())


def test_bad_arguments_are_named():
    q = _q()
    with pytest.raises(ValueError, match="num_draws"):
        q.psis(num_draws=5)
    with pytest.raises(TypeError, match="log_joint"):
        GaussianPosterior(M, A, ["a", "b", "c"]).psis()
    with pytest.raises(TypeError, match="q must be a posterior"):
        psis(object())
    with pytest.raises(ValueError, match="min_ess"):
        gpvi.infer(TARGET, min_ess=-1)


def test_psis_of_given_draws_with_some_log_joints_known_matches_a_fresh_evaluation():
    """psis(draws=, log_joint=) evaluates only the NaN entries and gives what psis gives on those draws."""
    import torch
    import gpvi
    from gpvi.posteriors import GaussianPosterior
    from gpvi.posteriors.weighted import psis
    calls = {"rows": 0}

    def lj(th):
        calls["rows"] += th.shape[0]
        return -0.5 * ((th - 1.0) ** 2).sum(-1)

    target = gpvi.Target(lj, names=["a", "b"])
    q = GaussianPosterior(torch.zeros(2, dtype=torch.float64), 1.5 * torch.eye(2, dtype=torch.float64),
                          ["a", "b"], target)
    w = psis(q, num_draws=400, seed=0)
    assert calls["rows"] == 400 and torch.equal(w.log_joint, lj(w.draws))
    part = w.log_joint.clone()
    part[::3] = float("nan")
    calls["rows"] = 0
    w2 = psis(q, draws=w.draws, log_joint=part)
    assert calls["rows"] == 134 and w2.info["evaluated"] == 134
    assert torch.allclose(w2.log_weights, w.log_weights, rtol=0, atol=1e-12) and w2.khat == w.khat
    with pytest.raises(ValueError, match="log_joint must have shape"):
        psis(q, draws=w.draws, log_joint=part[:10])
