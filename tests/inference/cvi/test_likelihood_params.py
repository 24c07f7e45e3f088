"""Learning the likelihood's parameters by type-II on the CVI bound (issue 60): the M-step against closed forms and
finite differences, and the alternation's end point a stationary point of the profiled bound in the parameters
(central differences of TypeII runs at perturbed parameters)."""

from __future__ import annotations

import math

import pytest
import torch

import gpvi
from gpvi.inference.cvi.likelihood_params import LikelihoodTypeII, expected_log_lik_in
from gpvi.inference.cvi.typeii import TypeII
from gpvi.models.latent_likelihoods import Beta, Laplace, NegativeBinomial, StudentT
from gpvi.models.likelihoods import expected_log_lik

F64 = torch.float64
N = 40


def _data(kind: str):
    g = torch.Generator().manual_seed(5)
    X = torch.rand(N, 1, generator=g, dtype=F64) * 4
    f = torch.sin(2 * X[:, 0])
    u = torch.rand(N, generator=g, dtype=F64)
    if kind == "negative_binomial":      # gamma-Poisson with exponential mixing: negative binomial with r = 1
        return X, torch.poisson(torch.exp(1 + f) * (-torch.log1p(-u)), generator=g)
    if kind == "beta":
        mu = torch.sigmoid(f)
        return X, (mu + 0.15 * (u - 0.5)).clamp(0.02, 0.98)
    if kind == "laplace":
        return X, f - 0.3 * torch.sign(u - 0.5) * torch.log1p(-(2 * u - 1).abs())
    z = torch.randn(5, N, generator=g, dtype=F64)
    return X, f + 0.2 * z[0] / torch.sqrt((z[1:] ** 2).mean(0))          # Student-t noise, df 4, scale 0.2


def _lik(kind, **kw):
    return {"negative_binomial": NegativeBinomial, "student_t": StudentT, "laplace": Laplace, "beta": Beta}[kind](**kw)


@pytest.mark.parametrize("kind,params", [("negative_binomial", {"dispersion": 1.7}), ("student_t", {"df": 3.0, "scale": 0.4}),
                                         ("laplace", {"scale": 0.6}), ("beta", {"scale": 4.0})])
def test_expected_log_lik_in_the_parameters_equals_the_likelihoods_own(kind, params):
    g = torch.Generator().manual_seed(1)
    X, y = _data(kind)
    m = 0.3 * torch.randn(N, generator=g, dtype=F64)
    v = 0.05 + torch.rand(N, generator=g, dtype=F64)
    want = float(expected_log_lik(_lik(kind, **params), y, m, v).value.sum())
    t = {k: torch.tensor(val, dtype=F64) for k, val in params.items()}
    assert float(expected_log_lik_in(kind, y, m, v, t)) == pytest.approx(want, rel=1e-9)


def test_m_step_laplace_scale_is_the_mean_absolute_deviation_under_q():
    X, y = _data("laplace")
    post = gpvi.CVI(progress_bar=False).run(gpvi.GPGeneralisedRegression(X, y, likelihood=Laplace(1.0)))
    values, _ = LikelihoodTypeII().m_step(post, ("scale",))
    d, s = y - post.m, post.var.sqrt()
    z = d / s
    absdev = d * torch.erf(z / math.sqrt(2)) + 2 * s * torch.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    assert values["scale"] == pytest.approx(float(absdev.mean()), rel=1e-7)


def _profiled(X, y, lik):
    return TypeII(gpvi.CVI(progress_bar=False, tol=1e-12), prior=None, tol=1e-10).run(
        gpvi.GPGeneralisedRegression(X, y, likelihood=lik)).elbo


@pytest.mark.parametrize("kind", ["negative_binomial", "student_t", "laplace", "beta"])
def test_the_learned_parameters_maximise_the_profiled_bound(kind):
    X, y = _data(kind)
    start = {"negative_binomial": {"dispersion": 30.0}, "student_t": {"df": 4.0, "scale": 1.0},
             "laplace": {"scale": 1.0}, "beta": {"scale": 1.0}}[kind]
    post = LikelihoodTypeII().run(gpvi.GPGeneralisedRegression(X, y, likelihood=_lik(kind, **start)))
    assert post.info["likelihood_converged"]
    learned = post.info["likelihood_params"]
    f0 = _profiled(X, y, _lik(kind, **learned))
    assert f0 > post.info["likelihood_trace"][0] + 0.5          # the check can fail: the start is far below
    h = 0.02
    for p in learned:
        up = _profiled(X, y, _lik(kind, **{**learned, p: learned[p] * math.exp(h)}))
        down = _profiled(X, y, _lik(kind, **{**learned, p: learned[p] * math.exp(-h)}))
        assert up <= f0 + 1e-5 and down <= f0 + 1e-5           # a maximum along each log parameter
        assert abs(up - down) / (2 * h) < 0.02                  # d bound / d log phi ~ 0 (measured <= 0.0032)


def test_bad_requests_name_the_argument():
    X, y = _data("negative_binomial")
    with pytest.raises(ValueError, match="has no parameters to learn"):
        LikelihoodTypeII().run(gpvi.GPGeneralisedRegression(X, y, likelihood="poisson"))
    with pytest.raises(ValueError, match="learn must name"):
        LikelihoodTypeII(learn=["df"]).run(gpvi.GPGeneralisedRegression(X, y, likelihood="negative_binomial"))
    with pytest.raises(ValueError, match="names no learned parameter"):
        LikelihoodTypeII(priors={"df": torch.distributions.Normal(0.0, 1.0)}).run(
            gpvi.GPGeneralisedRegression(X, y, likelihood="negative_binomial"))
