"""q(theta) by two rounds of importance sampling (gpvi.inference.cvi.importance): a Gaussian target's moments
(closed form), the Student-t proposal's density (SciPy), rejection of a heavy tail, bad settings, and the fully
Bayesian classifier's use of it: accepted q against S&K's, a rejected one leaving S&K's fit bit for bit."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import gpvi
from gpvi.inference.cvi import importance
from gpvi.inference.cvi.bayes import FullyBayesianCVI
from gpvi.inference.cvi.importance import ImportanceGaussian, ImportanceRejected, t_draws, t_log_density, \
    try_importance
from gpvi.inference.init import init_to_value

F64 = torch.float64


def _gaussian(D=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(D, D, generator=g, dtype=F64)
    Lam = A @ A.T + 0.5 * torch.eye(D, dtype=F64)
    mu = torch.linspace(-2.0, 1.0, D, dtype=F64)
    return gpvi.Target(lambda th: -0.5 * (((th - mu) @ Lam) * (th - mu)).sum(-1), names=D), mu, torch.linalg.inv(Lam)


def test_a_gaussian_target_gives_its_moments_and_bound():
    """Started half an sd off the mean with the exact scale (a Laplace start's situation): q's means within 0.1 sd,
    sds within 10 %, correlations within 0.1 of the closed form (the Monte Carlo error at ESS about 100: 0.1 sd and
    7 % before the Sobol' points' gain); the bound within 3 se of E[log g] + H[q] (closed
    form at the exact Gaussian); 128 evaluations, PSIS's k-hat below its threshold."""
    target, mu, S = _gaussian()
    sd = S.diagonal().sqrt()
    L = torch.linalg.cholesky(S)
    q = ImportanceGaussian(seed=3).run(target, init_to_value(mu + 0.5 * sd, L))
    assert float(((q.mean - mu) / sd).abs().max()) < 0.1
    assert float((q.std / sd).log().abs().max()) < 0.1
    R, Rq = S / torch.outer(sd, sd), q.covariance / torch.outer(q.std, q.std)
    assert float((R - Rq).abs().max()) < 0.1
    d = q.info.details
    assert d["khat"] <= d["khat_threshold"] and d["ess"] >= importance.MIN_ESS and q.info["log_joint_evals"] == 128
    exact = -1.5 + 0.5 * float(torch.logdet(2 * math.pi * math.e * S))
    assert abs(q.elbo - exact) < 3 * q.elbo_se + 0.01, (q.elbo, q.elbo_se, exact)
    # the log evidence of the unnormalised target: log of (2 pi)^{D/2} |S|^{1/2}
    assert abs(d["log_evidence"] - 0.5 * float(torch.logdet(2 * math.pi * S))) < 0.02


def test_student_t_draws_and_density_match_scipy():
    from scipy import stats
    m = torch.tensor([0.5, -1.0], dtype=F64)
    L = torch.tensor([[1.0, 0.0], [0.4, 0.7]], dtype=F64)
    x = t_draws(m, L, 16, 5.0, seed=0)
    ref = stats.multivariate_t.logpdf(x.numpy(), loc=m.numpy(), shape=(L @ L.T).numpy(), df=5.0)
    torch.testing.assert_close(t_log_density(x, m, L, 5.0), torch.as_tensor(ref), rtol=1e-12, atol=1e-12)
    big = t_draws(m, L, 4096, 5.0, seed=1)             # Sobol' draws: the t's mean and covariance (nu / (nu - 2))
    torch.testing.assert_close(big.mean(0), m, atol=0.02, rtol=0)
    torch.testing.assert_close(torch.cov(big.T), L @ L.T * 5.0 / 3.0, atol=0.08, rtol=0)


def test_a_heavy_tailed_target_is_rejected_with_its_record():
    """A Cauchy coordinate: the weighted moments do not exist, and the check refuses (k-hat or ESS);
    try_importance then returns None and the record; D > MAX_DIM is not tried."""
    target = gpvi.Target(lambda th: -torch.log1p(th[..., 0] ** 2) - 0.5 * th[..., 1] ** 2, names=2)
    for scale in (0.3, 1.0):
        start = init_to_value(torch.zeros(2, dtype=F64), scale * torch.eye(2, dtype=F64))
        with pytest.raises(ImportanceRejected, match="k-hat") as err:
            ImportanceGaussian().run(target, start)
        assert err.value.details["evaluations"] == 128
        q, rec = try_importance(target, start)
        assert q is None and rec["accepted"] is False and "k-hat" in rec["reason"]
    wide, _, S = _gaussian(D=importance.MAX_DIM + 1)
    assert try_importance(wide, init_to_value(torch.zeros(5, dtype=F64), torch.eye(5, dtype=F64))) == (None, None)


def test_a_start_without_a_scale_is_rejected_not_guessed():
    """A start with no scale (no usable Laplace curvature): rejected with the reason, nothing evaluated."""
    target, mu, _ = _gaussian()
    calls = []
    counted = gpvi.Target(lambda th: calls.append(1) or target.log_joint(th), names=3)
    with pytest.raises(ImportanceRejected, match="no scale"):
        ImportanceGaussian().run(counted, init_to_value(mu))
    assert not calls


def test_bad_settings_are_named():
    with pytest.raises(TypeError, match="draws must be a tuple"):
        ImportanceGaussian(draws=64)
    with pytest.raises(ValueError, match=r"draws\[0\]"):
        ImportanceGaussian(draws=(0, 64))
    with pytest.raises(ValueError, match="nu"):
        ImportanceGaussian(nu=-1.0)
    with pytest.raises(ValueError, match="min_ess"):
        ImportanceGaussian(min_ess=0.0)
    with pytest.raises(TypeError, match="chunk"):
        ImportanceGaussian(chunk=2.5)
    with pytest.raises(TypeError, match="importance"):
        FullyBayesianCVI(importance="yes")


def _model():
    X = torch.linspace(-2, 2, 24, dtype=F64).unsqueeze(-1)
    y = (X[:, 0] + 0.3 * torch.sin(7 * X[:, 0]) > 0).double()
    return gpvi.GPClassification(X, y)


def test_the_classifier_tries_it_first_and_a_rejection_leaves_s_and_k_unchanged(monkeypatch):
    """Default FullyBayesianCVI on a 1-D binary set (D = 2): q by importance sampling where accepted, its means
    within 0.25 and sds within 25 % of S&K's on the same target (importance=False: S&K as before); forced to reject
    (MIN_ESS above the draws), the fit is S&K's bit for bit, with the rejection recorded."""
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sk = FullyBayesianCVI(num_draws=8, importance=False).run(model)
        post = FullyBayesianCVI(num_draws=8).run(model)
    assert sk.info["engine"] == "SKGaussian" and sk.info["importance"] is None
    rec = post.info["importance"]
    assert rec is not None and rec["evaluations"] == 128
    if rec["accepted"]:
        assert post.info["engine"] == "ImportanceGaussian"
        assert float(((post.mean - sk.mean) / sk.std).abs().max()) < 0.25
        assert float((post.std / sk.std).log().abs().max()) < math.log(1.25)
    monkeypatch.setattr(importance, "MIN_ESS", 1e9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rej = FullyBayesianCVI(num_draws=8).run(model)
    assert rej.info["importance"]["accepted"] is False and rej.info["engine"] == "SKGaussian"
    assert torch.equal(rej.mean, sk.mean) and torch.equal(rej.q.scale_tril, sk.q.scale_tril)
    Xs = torch.tensor([[-1.0], [0.5]], dtype=F64)
    assert torch.equal(rej.predict_proba(Xs), sk.predict_proba(Xs))


def test_a_multiclass_fit_tries_it_too():
    """A 3-class softmax model (D = 2, multi-class EP): the step is tried first (MULTICLASS_IMPORTANCE); where
    accepted its q is within 0.3 sd and 30 % of S&K's on the same target, where rejected the fit is S&K's."""
    from gpvi.models.multiclass import GPMulticlass
    X = torch.linspace(-2, 2, 24, dtype=F64)[:, None]
    y = (X[:, 0] > -0.7).long() + (X[:, 0] > 0.7).long()
    y[[2, 9]] = (y[[2, 9]] + 1) % 3
    model = GPMulticlass(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sk = FullyBayesianCVI(num_draws=8, importance=False).run(model)
        post = FullyBayesianCVI(num_draws=8).run(model)
    rec = post.info["importance"]
    assert rec is not None and sk.info["importance"] is None
    if rec["accepted"]:
        assert post.info["engine"] == "ImportanceGaussian"
        assert float(((post.mean - sk.mean) / sk.std).abs().max()) < 0.3
        assert float((post.std / sk.std).log().abs().max()) < math.log(1.3)
    else:
        assert torch.equal(post.mean, sk.mean)
    assert post.predict_proba(X[:3]).shape == (3, 3)
