"""Likelihoods beyond classification (issue 60): derivatives against finite differences, log densities against
scipy.stats and GPyTorch, expectations and their m, v gradients against Monte Carlo, the GPyTorch mapping, the
model's front door and bad input."""

from __future__ import annotations

import math

import gpytorch
import numpy as np
import pytest
import scipy.stats as st
import torch
from gpytorch.likelihoods.likelihood import _OneDimensionalLikelihood

import gpvi
from gpvi.models.gpytorch_likelihoods import GPyTorchSite, site_likelihood_of_gpytorch
from gpvi.models.latent_likelihoods import Beta, Laplace, NegativeBinomial, Poisson, StudentT
from gpvi.models.likelihoods import expected_log_lik, make_likelihood

F64 = torch.float64


class SoftplusPoisson(_OneDimensionalLikelihood):
    """A user's likelihood: Poisson counts with a softplus rate (GPyTorch's own PoissonLikelihood, written out)."""

    def forward(self, function_samples, *args, **kwargs):
        return torch.distributions.Poisson(torch.nn.functional.softplus(function_samples))


class Detached(_OneDimensionalLikelihood):
    """A likelihood whose log_prob is not differentiable in f (built from a detached copy)."""

    def forward(self, function_samples, *args, **kwargs):
        return torch.distributions.Normal(function_samples.detach(), 1.0)


# (likelihood, targets, scipy log density of y given f)
CASES = {
    "poisson": (Poisson(), [0.0, 3.0, 12.0], lambda y, f: st.poisson.logpmf(y, np.exp(f))),
    "negative_binomial": (NegativeBinomial(2.5), [0.0, 4.0, 30.0],
                          lambda y, f: st.nbinom.logpmf(y, 2.5, 2.5 / (2.5 + np.exp(f)))),
    "student_t": (StudentT(3.0, 0.7), [-2.0, 0.4, 5.0], lambda y, f: st.t.logpdf(y, 3.0, loc=f, scale=0.7)),
    "laplace": (Laplace(0.6), [-1.0, 0.4, 3.0], lambda y, f: st.laplace.logpdf(y, loc=f, scale=0.6)),
    "beta": (Beta(3.0), [0.05, 0.3, 0.9],
             lambda y, f: st.beta.logpdf(y, 3.0 / (1 + np.exp(-f)) + 1, 3.0 / (1 + np.exp(f)) + 1)),
}


def _grid():
    return torch.linspace(-2.5, 2.5, 11, dtype=F64)


@pytest.mark.parametrize("name", list(CASES))
def test_log_density_matches_scipy_and_derivatives_match_central_differences(name):
    lik, ys, ref = CASES[name]
    f = _grid() + 0.013                       # off the Laplace kink
    for y0 in ys:
        y = torch.full_like(f, y0)
        h, h1, h2 = lik.derivatives(y, f)
        np.testing.assert_allclose(h.numpy(), ref(y0, f.numpy()), rtol=1e-12, atol=1e-12)
        assert torch.equal(lik.log_prob(y, f), h)
        eps = 1e-5
        hp, h1p, _ = lik.derivatives(y, f + eps)
        hm, h1m, _ = lik.derivatives(y, f - eps)
        # central differences: truncation ~eps^2 |h'''|, rounding ~1e-16 |h| / eps; measured worst 5e-10
        assert torch.allclose(h1, (hp - hm) / (2 * eps), rtol=1e-7, atol=1e-7)
        assert torch.allclose(h2, (h1p - h1m) / (2 * eps), rtol=1e-7, atol=1e-7)


def test_student_t_curvature_changes_sign_at_scale_times_root_df():
    lik = StudentT(4.0, 0.5)                                  # sigma sqrt(nu) = 1
    _, _, h2 = lik.derivatives(torch.zeros(2, dtype=F64), torch.tensor([0.9, 1.1], dtype=F64))
    assert float(h2[0]) < 0 < float(h2[1])


@pytest.mark.parametrize("name", list(CASES))
def test_expectations_and_their_m_v_gradients_equal_monte_carlo(name):
    """Independent estimators that use h only: E[h], dE/dm = E[h (f - m)] / v, dE/dv = E[h ((f-m)^2 - v)] / (2 v^2)
    (the Gaussian score), 400k seeded draws, each within 3 standard errors."""
    lik, ys, _ = CASES[name]
    g = torch.Generator().manual_seed(60)
    m = torch.tensor([-0.7, 0.2, 1.1], dtype=F64)
    v = torch.tensor([0.3, 1.0, 0.05], dtype=F64)
    y = torch.tensor(ys, dtype=F64)
    ex = expected_log_lik(lik, y, m, v)
    S = 400_000
    eps = torch.randn((3, S), generator=g, dtype=F64)
    f = m[:, None] + v.sqrt()[:, None] * eps
    h = lik.log_prob(y[:, None], f)
    for est, got in ((h, ex.value), (h * (f - m[:, None]) / v[:, None], ex.dm),
                     (h * ((f - m[:, None]) ** 2 - v[:, None]) / (2 * v[:, None] ** 2), ex.dv)):
        se = est.std(-1) / math.sqrt(S)
        assert bool(((est.mean(-1) - got).abs() <= 3 * se).all()), (name, est.mean(-1), got, se)


def test_closed_forms_equal_the_quadrature_rule():
    y = torch.tensor([0.0, 2.0, 7.0], dtype=F64)
    m = torch.tensor([-1.0, 0.5, 2.0], dtype=F64)
    v = torch.tensor([0.2, 1.5, 0.01], dtype=F64)

    class NoClosedForm(Poisson):
        def closed_form(self, y, m, v):
            return None

    a, b = expected_log_lik(Poisson(), y, m, v), expected_log_lik(NoClosedForm(), y, m, v)
    for x, z in zip(a, b):
        assert torch.allclose(x, z, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------ GPyTorch objects
def _gpytorch_objects():
    t = gpytorch.likelihoods.StudentTLikelihood()
    t.deg_free, t.noise = 5.0, 0.3
    la = gpytorch.likelihoods.LaplaceLikelihood()
    la.noise = 0.2
    be = gpytorch.likelihoods.BetaLikelihood()
    be.scale = 4.0
    return [(t, 0.7), (la, -0.4), (be, 0.35)]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_gpytorch_likelihood_objects_map_to_the_same_log_density(index):
    obj, y0 = _gpytorch_objects()[index]
    obj = obj.double()                    # parameters read in float64 (a float32 module's values are float32's)
    lik = site_likelihood_of_gpytorch(obj)
    assert not isinstance(lik, GPyTorchSite)                  # gpvi's own, with the closed form where it has one
    f = _grid()
    with torch.no_grad():
        ref = obj(f).log_prob(torch.full_like(f, y0))
    assert torch.allclose(lik.log_prob(torch.full_like(f, y0), f), ref, rtol=1e-12, atol=1e-12)


def test_generic_one_dimensional_likelihood_by_autograd():
    lik = site_likelihood_of_gpytorch(SoftplusPoisson())
    assert isinstance(lik, GPyTorchSite) and lik.name == "gpytorch:SoftplusPoisson"
    f = _grid()
    y = torch.full_like(f, 3.0)
    h, h1, h2 = lik.derivatives(y, f)
    sp, sig = torch.nn.functional.softplus(f), torch.sigmoid(f)
    assert torch.allclose(h, 3 * torch.log(sp) - sp - math.lgamma(4.0), rtol=1e-13)
    assert torch.allclose(h1, (3 / sp - 1) * sig, rtol=1e-12)
    assert torch.allclose(h2, -3 * (sig / sp) ** 2 + (3 / sp - 1) * sig * (1 - sig), rtol=1e-11)
    # GPyTorch's own PoissonLikelihood (softplus link) goes the same way, its link kept
    own = site_likelihood_of_gpytorch(gpytorch.likelihoods.PoissonLikelihood())
    assert torch.allclose(own.derivatives(y, f)[2], h2, rtol=1e-12)


def test_gpytorch_likelihoods_refused_with_the_argument_named():
    with pytest.raises(ValueError, match="likelihood .*registered prior"):
        site_likelihood_of_gpytorch(gpytorch.likelihoods.StudentTLikelihood(
            noise_prior=gpytorch.priors.GammaPrior(2.0, 1.0)))
    with pytest.raises(ValueError, match="batch of 2"):
        site_likelihood_of_gpytorch(gpytorch.likelihoods.LaplaceLikelihood(batch_shape=torch.Size([2])))
    with pytest.raises(TypeError, match="GaussianLikelihood"):
        site_likelihood_of_gpytorch(gpytorch.likelihoods.GaussianLikelihood())
    X = torch.linspace(0, 1, 5, dtype=F64).unsqueeze(-1)
    with pytest.raises(ValueError, match="likelihood: Detached.forward.*not differentiable"):
        gpvi.GPGeneralisedRegression(X, torch.zeros(5, dtype=F64), likelihood=Detached())
    with pytest.raises(ValueError, match="y must lie in the support"):
        gpvi.GPGeneralisedRegression(X, torch.tensor([0, 1, 2, 3, 0.5], dtype=F64), likelihood=SoftplusPoisson())


# ----------------------------------------------------------------------------------- front door, specs
@pytest.mark.parametrize("name", list(CASES))
def test_spec_rebuilds_the_likelihood(name):
    lik = CASES[name][0]
    again = make_likelihood(lik.spec())
    assert type(again) is type(lik) and again.spec() == lik.spec()
    assert type(make_likelihood(name)) is type(lik)


def test_model_front_door_checks_targets_per_likelihood():
    X = torch.linspace(0, 1, 6, dtype=F64).unsqueeze(-1)
    counts = torch.tensor([0, 1, 4, 2, 0, 7], dtype=F64)
    model = gpvi.GPGeneralisedRegression(X, counts, likelihood="negative_binomial")
    assert model.link == "negative_binomial" and torch.equal(model.y, counts)
    with pytest.raises(ValueError, match=r"y must hold counts .*rows \[2\] hold \[-1.0\]"):
        gpvi.GPGeneralisedRegression(X, [0, 1, -1, 2, 0, 7], likelihood="poisson")
    with pytest.raises(ValueError, match=r"y must hold counts .*rows \[3\] hold \[2.5\]"):
        gpvi.GPGeneralisedRegression(X, [0, 1, 1, 2.5, 0, 7], likelihood=NegativeBinomial(3.0))
    with pytest.raises(ValueError, match=r"y must be strictly between 0 and 1 .*rows \[0, 5\]"):
        gpvi.GPGeneralisedRegression(X, [0.0, 0.2, 0.3, 0.4, 0.5, 1.0], likelihood=Beta(2.0))
    with pytest.raises(ValueError, match="y contains non-finite|y .*finite"):
        gpvi.GPGeneralisedRegression(X, [0.0, 0.2, float("nan"), 0.4, 0.5, 1.0], likelihood="student_t")
    with pytest.raises(ValueError, match="binary: use gpvi.GPClassification"):
        gpvi.GPGeneralisedRegression(X, [0, 1, 0, 1, 0, 1], likelihood="logit")
    with pytest.raises(TypeError, match="likelihood is required"):
        gpvi.GPGeneralisedRegression(X, counts, likelihood=None)
    with pytest.raises(ValueError, match="likelihood must be one of"):
        gpvi.GPGeneralisedRegression(X, counts, likelihood="zip")
    with pytest.raises(ValueError, match="df must be > 0"):
        StudentT(df=-1.0)
    with pytest.raises(ValueError, match="does not fit StudentT"):
        make_likelihood({"name": "student_t", "nu": 3.0})
    # GPClassification still refuses what is not binary, naming the argument
    with pytest.raises(TypeError, match="likelihood is a StudentTLikelihood"):
        gpvi.GPClassification(X, [0, 1, 0, 1, 0, 1], likelihood=gpytorch.likelihoods.StudentTLikelihood())
