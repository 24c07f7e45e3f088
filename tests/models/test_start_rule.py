"""One start-value convention for regression and classification (issue 40): a value the user set on a GPyTorch
kernel, likelihood or mean (raw parameter not GPyTorch's initial 0) is the start (and the value of
``GPClassifier(hyperparameters="fixed")``); parameters left at GPyTorch's initial values start data-scaled.
Independent answers: the values written on the modules, closed-form data-scaled values, the default models."""

import math

import gpytorch
import numpy as np
import pytest
import torch

import gpvi
from gpvi.models.classification import GPClassification
from gpvi.models.parameters import ModuleParametrisation
from gpvi.models.priors import resolve_prior

DT = torch.float64


def _data(n=30, seed=3):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 2, dtype=DT, generator=g) * torch.tensor([1.0, 3.0], dtype=DT)
    y = torch.sin(2 * X[:, 0]) + 0.3 * torch.randn(n, dtype=DT, generator=g) + 1.5
    return X, y


def _kernel(lengthscale=None, outputscale=None):
    k = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))
    if lengthscale is not None:
        k.base_kernel.lengthscale = lengthscale
    if outputscale is not None:
        k.outputscale = outputscale
    return k


def test_user_set_marks_exactly_the_parameters_moved_from_gpytorch_initial_values():
    assert ModuleParametrisation(_kernel()).user_set == frozenset()
    assert ModuleParametrisation(_kernel(lengthscale=2.0)).user_set == {"base_kernel.raw_lengthscale"}
    frozen = _kernel(lengthscale=2.0, outputscale=3.0)
    frozen.raw_outputscale.requires_grad_(False)            # frozen: not in theta, so not a start
    assert ModuleParametrisation(frozen).user_set == {"base_kernel.raw_lengthscale"}
    interval = gpytorch.kernels.RBFKernel(lengthscale_constraint=gpytorch.constraints.Interval(0.1, 10.0,
                                                                                               initial_value=3.0))
    assert ModuleParametrisation(interval).user_set == {"raw_lengthscale"}      # a constraint's initial_value


def test_regression_starts_at_user_values_and_data_scaled_elsewhere():
    X, y = _data()
    default = gpvi.GPRegression(X, y).initial_theta()
    assert torch.equal(gpvi.GPRegression(X, y, kernel=_kernel()).initial_theta(), default)
    th = gpvi.GPRegression(X, y, kernel=_kernel(lengthscale=torch.tensor([[2.0, 0.5]]))).initial_theta()
    assert torch.allclose(th[:2], torch.tensor([math.log(4.0), math.log(0.25)], dtype=DT), rtol=0, atol=1e-6)
    vy = float(y.var(unbiased=False))
    assert th[2] == pytest.approx(math.log(vy), abs=1e-12)              # outputscale not set: var(y)
    th = gpvi.GPRegression(X, y, kernel=_kernel(outputscale=0.5)).initial_theta()
    assert th[2] == pytest.approx(math.log(0.5), abs=1e-6)
    d, vx = 2, X.var(0, unbiased=False)
    assert torch.allclose(th[:2], torch.log(d * vx), rtol=0, atol=1e-12)   # lengthscales not set: d var(x_j)


def test_regression_likelihood_and_mean_values_are_starts_when_set():
    X, y = _data()
    lik, mean = gpytorch.likelihoods.GaussianLikelihood(), gpytorch.means.ConstantMean()
    model = gpvi.GPRegression(X, y, likelihood=lik, mean=mean)
    th = model.initial_theta()
    assert float(model.noise_var(th)) == pytest.approx(0.1 * float(y.var(unbiased=False)), rel=1e-12)
    assert float(model.mean_constant(th)) == pytest.approx(float(y.mean()), rel=1e-12)
    lik.noise, mean.constant = 0.05, -0.7
    model = gpvi.GPRegression(X, y, likelihood=lik, mean=mean)
    th = model.initial_theta()
    assert float(model.noise_var(th)) == pytest.approx(0.05, rel=1e-6)
    assert float(model.mean_constant(th)) == pytest.approx(-0.7, rel=1e-6)


def test_constrained_lengthscale_left_at_default_starts_data_scaled_when_allowed():
    X, y = _data()
    d, vx = 2, X.var(0, unbiased=False)

    def nat_start(lo, hi):
        k = gpytorch.kernels.RBFKernel(ard_num_dims=2,
                                       lengthscale_constraint=gpytorch.constraints.Interval(lo, hi))
        m = gpvi.GPRegression(X, y, kernel=k)
        return m.natural(m.initial_theta())[:2]

    assert torch.allclose(nat_start(0.05, 20.0), torch.sqrt(d * vx), rtol=1e-10)
    # sqrt(2 var(x_1)) is about 4.2: outside (0.05, 2), so that entry keeps GPyTorch's value, the midpoint
    got = nat_start(0.05, 2.0)
    assert float(got[0]) == pytest.approx(float(torch.sqrt(d * vx[0])), rel=1e-10)
    assert float(got[1]) == pytest.approx(1.025, rel=1e-6)


def test_classification_uses_the_same_rule_and_fixed_keeps_user_values():
    X, y = _data()
    labels = (y > y.median()).long()
    default = GPClassification(X, labels).theta
    assert torch.equal(GPClassification(X, labels, kernel=_kernel()).theta, default)   # GPyTorch defaults: scaled
    m = GPClassification(X, labels, kernel=_kernel(lengthscale=2.0, outputscale=0.5))
    assert torch.allclose(m.theta, torch.tensor([math.log(4.0)] * 2 + [math.log(0.5)], dtype=DT), atol=1e-6)
    clf = gpvi.GPClassifier(kernel=_kernel(outputscale=0.5), hyperparameters="fixed", max_sweeps=5)
    clf.fit(X.numpy(), labels.numpy())
    assert clf.theta_[2] == pytest.approx(math.log(0.5), abs=1e-6)
    assert torch.equal(clf.theta_[:2], default[:2])


def test_scaled_prior_centre_ignores_user_values():
    X, y = _data()
    labels = (y > y.median()).long()
    plain = GPClassification(X, labels)
    user = GPClassification(X, labels, kernel=_kernel(lengthscale=2.0, outputscale=0.5))
    assert torch.equal(user.scaled_theta(), plain.theta)
    lp_user = resolve_prior("scaled", user).log_prob(plain.theta)
    lp_plain = resolve_prior("scaled", plain).log_prob(plain.theta)
    assert float(lp_user) == float(lp_plain) == pytest.approx(3 * -0.5 * math.log(2 * math.pi * 10.0), rel=1e-12)


def test_constant_kernel_is_named_as_a_kernel_variance_and_batches():
    X, y = _data()
    k = _kernel() + gpytorch.kernels.ConstantKernel()
    model = gpvi.GPRegression(X, y, kernel=k)
    assert model.names[3] == "log_constant" and model.natural_names[3] == "constant"
    assert "mean_constant" not in model.natural_names
    thetas = model.initial_theta() + 0.2 * torch.randn(3, model.dim, dtype=DT,
                                                        generator=torch.Generator().manual_seed(0))
    batched = model.log_joint(thetas)
    single = torch.stack([model.log_joint(t) for t in thetas])
    assert torch.allclose(batched, single, rtol=1e-12, atol=0)
    c = float(model.natural(thetas[0])[3])
    K = model.covariance(thetas[0]) - model.covariance(thetas[0] * torch.tensor([1, 1, 1, 0, 1], dtype=DT)
                                                      + torch.tensor([0, 0, 0, -50, 0], dtype=DT))
    assert torch.allclose(K, torch.full_like(K, c), rtol=1e-10, atol=1e-12)   # the constant adds c everywhere
    assert np.isfinite(float(model.log_joint(thetas[0])))
