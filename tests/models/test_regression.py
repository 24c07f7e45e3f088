"""GPRegression: exact log joint over log-hyperparameters, checked against closed forms and two other libraries."""

from __future__ import annotations

import math

import gpytorch
import numpy as np
import pytest
import torch

import gpvi
from gpvi.exceptions import NotPSDError, NumericalWarning
from tests.conftest import make_gp_data


def _rbf_hand(X, theta):
    d = X.shape[1]
    ls2 = torch.exp(theta[:d])
    sq = ((X[:, None, :] - X[None, :, :]) ** 2 / ls2).sum(-1)
    return torch.exp(theta[d]) * torch.exp(-0.5 * sq) + torch.exp(theta[d + 1]) * torch.eye(X.shape[0], dtype=X.dtype)


def _theta(model, seed=3, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    return model.initial_theta() + scale * torch.randn(model.dim, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("fast", [True, False])
def test_default_kernel_names_and_values_match_hand_formula(gp_data, fast):
    X, y = gp_data
    model = gpvi.GPRegression(X, y)
    model.use_fast_path = fast
    assert model.names == ["log_lengthscale_sq[0]", "log_lengthscale_sq[1]", "log_signal_var", "log_noise_var"]
    assert model.natural_names == ["lengthscale[0]", "lengthscale[1]", "signal_var", "noise_var"]
    th = _theta(model)
    assert torch.allclose(model.covariance(th), _rbf_hand(X, th), rtol=1e-13, atol=1e-14)
    Kd = torch.distributions.MultivariateNormal(torch.zeros(len(y), dtype=torch.float64), _rbf_hand(X, th))
    assert model.y_offset == float(y.mean())                        # y is centred at its training mean by default
    assert abs(float(model.log_marginal_likelihood(th)) - float(Kd.log_prob(y - y.mean()))) < 1e-10


def test_generic_path_ignores_module_parameters():
    """GPyTorch's lazy kernels would silently use the module's own values under functional_call (a 1.4 error in
    K seen before any code existed); gpvi evaluates eagerly. Pin it: a user kernel with very different stored
    lengthscale and a Matern kernel, checked against the hand formula at theta."""
    X, y = make_gp_data(30, 2)
    k = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=2.5, ard_num_dims=2))
    k.base_kernel.lengthscale = torch.tensor([[7.0, 0.05]])
    k.outputscale = 3.0
    model = gpvi.GPRegression(X, y, kernel=k)
    th = torch.tensor([0.3, -0.4, 0.2, -2.0], dtype=torch.float64)
    ls = torch.exp(0.5 * th[:2])
    r = torch.sqrt(((X[:, None, :] - X[None, :, :]) ** 2 / ls ** 2).sum(-1) + 0.0)
    s5 = math.sqrt(5.0)
    Kf = math.exp(0.2) * (1 + s5 * r + 5.0 / 3.0 * r ** 2) * torch.exp(-s5 * r)
    expected = Kf + math.exp(-2.0) * torch.eye(30, dtype=torch.float64)
    assert torch.allclose(model.covariance(th), expected, rtol=1e-12, atol=1e-13)
    # and theta_from_kernel reads the user's stored values back exactly
    assert torch.allclose(model.kernel_params.theta_from_kernel(),
                          torch.tensor([math.log(49.0), math.log(0.0025), math.log(3.0)], dtype=torch.float64),
                          atol=1e-6)


@pytest.mark.parametrize("kernel_name", ["rbf", "matern", "sum_periodic", "rq"])
def test_gradient_matches_central_differences(kernel_name):
    X, y = make_gp_data(25, 2, seed=1)
    kernels = {
        "rbf": None,
        "matern": gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=1.5, ard_num_dims=2)),
        "sum_periodic": gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
        + gpytorch.kernels.ScaleKernel(gpytorch.kernels.PeriodicKernel()),
        "rq": gpytorch.kernels.ScaleKernel(gpytorch.kernels.RQKernel()),
    }
    model = gpvi.GPRegression(X, y, kernel=kernels[kernel_name])
    th = _theta(model, seed=5, scale=0.3).requires_grad_(True)
    (grad,) = torch.autograd.grad(model.log_joint(th), th)
    h = 1e-5
    fd = torch.empty(model.dim, dtype=torch.float64)
    with torch.no_grad():
        for i in range(model.dim):
            e = torch.zeros(model.dim, dtype=torch.float64)
            e[i] = h
            fd[i] = (model.log_joint(th + e) - model.log_joint(th - e)) / (2 * h)
    rel = float((grad - fd).norm() / fd.norm())
    assert rel < 1e-6, rel


def test_fast_path_equals_generic_path_value_and_gradient():
    X, y = make_gp_data(50, 3, seed=2)
    model = gpvi.GPRegression(X, y)
    th = torch.stack([_theta(model, seed=s) for s in range(4)]).requires_grad_(True)
    out = {}
    for fast in (True, False):
        model.use_fast_path = fast
        v = model.log_joint(th)
        (g,) = torch.autograd.grad(v.sum(), th)
        out[fast] = (v.detach(), g)
    assert torch.allclose(out[True][0], out[False][0], rtol=1e-12)
    assert torch.allclose(out[True][1], out[False][1], rtol=1e-9, atol=1e-9)


def test_isotropic_rbf_fast_path_gradient():
    X, y = make_gp_data(30, 3, seed=4)
    model = gpvi.GPRegression(X, y, kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()))
    assert model.names == ["log_lengthscale_sq", "log_signal_var", "log_noise_var"]
    th = torch.tensor([0.2, 0.1, -1.0], dtype=torch.float64, requires_grad=True)
    (g1,) = torch.autograd.grad(model.log_joint(th), th)
    model.use_fast_path = False
    (g2,) = torch.autograd.grad(model.log_joint(th), th)
    assert torch.allclose(g1, g2, rtol=1e-10)


def test_matches_gpytorch_exact_mll_and_sklearn():
    X, y = make_gp_data(60, 3, seed=7)
    model = gpvi.GPRegression(X, y, mean=gpytorch.means.ZeroMean())     # the references' zero mean, y as given
    th = torch.tensor([0.4, -0.3, 1.2, 0.5, -2.5], dtype=torch.float64)
    ours = float(model.log_marginal_likelihood(th))
    assert abs(float(model.log_joint(th) - model.log_prior(th)) - ours) < 1e-12

    class ExactGP(gpytorch.models.ExactGP):
        def __init__(self, lik):
            super().__init__(X, y, lik)
            self.mean = gpytorch.means.ZeroMean()
            self.cov = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=3))

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean(x), self.cov(x))

    lik = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(1e-8))
    gp = ExactGP(lik).double()
    gp.cov.base_kernel.lengthscale = torch.exp(0.5 * th[:3])
    gp.cov.outputscale = torch.exp(th[3])
    lik.noise = torch.exp(th[4])
    gp.train()
    with gpytorch.settings.max_cholesky_size(10**6), torch.no_grad():
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(lik, gp)
        gpyt = float(mll(gp(X), y)) * len(y)
    assert abs(ours - gpyt) <= 1e-8 * abs(ours), (ours, gpyt)

    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
    kern = ConstantKernel(math.exp(float(th[3])), "fixed") * RBF(torch.exp(0.5 * th[:3]).numpy(), "fixed") \
        + WhiteKernel(math.exp(float(th[4])), "fixed")
    skl = GaussianProcessRegressor(kern, alpha=0.0, optimizer=None).fit(X.numpy(), y.numpy())
    assert abs(ours - skl.log_marginal_likelihood_value_) <= 1e-8 * abs(ours)
    # predictions agree too
    Xs = make_gp_data(10, 3, seed=8)[0]
    m, v = model.predict(th, Xs, include_noise=False)
    sm, ss = skl.predict(Xs.numpy(), return_std=True)     # sklearn's std includes the WhiteKernel noise
    assert np.allclose(m.numpy(), sm, atol=1e-10)
    _, vy = model.predict(th, Xs)
    assert np.allclose(vy.numpy(), ss ** 2, rtol=1e-7, atol=1e-10)
    assert torch.allclose(vy - v, torch.exp(th[4]).expand(10))


def test_batched_equals_loop():
    X, y = make_gp_data(40, 2, seed=9)
    model = gpvi.GPRegression(X, y)
    th = torch.stack([_theta(model, seed=s) for s in range(6)])
    batched = model.log_joint(th)
    loop = torch.stack([model.log_joint(t) for t in th])
    assert batched.shape == (6,)
    assert torch.allclose(batched, loop, rtol=0, atol=1e-10)
    mb, vb = model.predict(th, X[:5])
    ml = torch.stack([model.predict(t, X[:5])[0] for t in th])
    assert mb.shape == (6, 5) and torch.allclose(mb, ml, atol=1e-10)


def test_predictive_full_cov_consistent_with_variances(gp_data):
    X, y = gp_data
    model = gpvi.GPRegression(X, y)
    th = _theta(model)
    m, cov = model.predict(th, X[:7], full_cov=True)
    m2, v = model.predict(th, X[:7])
    assert torch.allclose(m, m2, atol=1e-12) and torch.allclose(torch.diagonal(cov), v, rtol=1e-9)


def test_duplicated_inputs_with_tiny_noise_use_jitter():
    X, y = make_gp_data(20, 2, seed=3)
    X = torch.cat([X, X])                     # every input twice
    y = torch.cat([y, y])
    model = gpvi.GPRegression(X, y)
    th = torch.tensor([0.0, 0.0, 0.0, math.log(1e-20)], dtype=torch.float64, requires_grad=True)
    with pytest.warns(NumericalWarning, match="jitter"):
        v = model.log_joint(th)
    (g,) = torch.autograd.grad(v, th)
    assert math.isfinite(float(v)) and bool(torch.isfinite(g).all())


def test_unfixable_theta_raises_single_and_minus_inf_in_batch():
    X, y = make_gp_data(15, 2)
    model = gpvi.GPRegression(X, y)
    bad = torch.tensor([0.0, 0.0, 800.0, -2.0], dtype=torch.float64)    # signal variance exp(800) overflows
    with pytest.raises(NotPSDError, match="theta"):
        model.log_joint(bad)
    th = torch.stack([bad, torch.zeros(4, dtype=torch.float64)]).requires_grad_(True)
    out = model.log_joint(th)
    (g,) = torch.autograd.grad(out[1], th)
    assert float(out[0]) == -math.inf and math.isfinite(float(out[1]))
    assert bool(torch.isfinite(g).all()) and float(g[0].abs().max()) == 0.0


def test_nonfinite_theta_in_batch_gets_minus_inf():
    X, y = make_gp_data(15, 2)
    model = gpvi.GPRegression(X, y)
    th = torch.zeros(3, 4, dtype=torch.float64)
    th[1, 0] = float("nan")
    out = model.log_joint(th)
    assert float(out[1]) == -math.inf and bool(torch.isfinite(out[[0, 2]]).all())
    with pytest.raises(ValueError, match="non-finite"):
        model.log_joint(th[1])


def test_default_prior_is_variance_ten_around_the_standardised_origin():
    X, y = make_gp_data(10, 1)
    model = gpvi.GPRegression(X, y)
    c = [math.log(float(X[:, 0].var(unbiased=False))), math.log(float(y.var(unbiased=False)))] * 1
    c = [c[0], c[1], c[1]]                 # log var(x), log var(y) for the signal and the noise variance
    assert model.standard_theta().tolist() == pytest.approx(c, rel=1e-14, abs=1e-14)
    th = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    expected = sum(-0.5 * math.log(2 * math.pi * 10) - (t - ci) ** 2 / 20 for t, ci in zip(th.tolist(), c))
    assert abs(float(model.log_prior(th)) - expected) < 1e-12
    custom = gpvi.GPRegression(X, y, prior=torch.distributions.Normal(torch.zeros(3, dtype=torch.float64), 1.0))
    assert abs(float(custom.log_prior(th)) - sum(-0.5 * math.log(2 * math.pi) - t * t / 2 for t in th.tolist())) < 1e-12


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_float32_and_integer_inputs_become_float64_without_loss(dtype):
    X, y = make_gp_data(12, 2)
    Xc = (X * 100).round().numpy().astype(dtype)
    yc = (y * 100).round().numpy().astype(dtype)
    model = gpvi.GPRegression(Xc, yc)
    assert model.X.dtype == torch.float64 and model.y.dtype == torch.float64
    assert np.array_equal(model.X.numpy(), Xc.astype(np.float64))
    assert model.log_joint(torch.zeros(4)).dtype == torch.float64      # float32 theta is converted too


@pytest.mark.parametrize(
    "X, y, exc, match",
    [
        (np.array([[0.0], [np.nan], [1.0]]), np.array([1.0, 2.0, 3.0]), ValueError, "X contains 1 non-finite"),
        (np.array([[0.0], [1.0], [2.0]]), np.array([1.0, np.inf, 3.0]), ValueError, "y contains 1 non-finite"),
        (np.zeros((3, 2)), np.array([1.0, 2.0]), ValueError, "X has 3 rows but y has 2"),
        (np.array([0.0, 1.0, 2.0]), np.array([1.0, 2.0, 3.0]), ValueError, "X must be 2-D"),
        (np.zeros((0, 2)), np.zeros(0), ValueError, "X is empty"),
        (np.array([["a"], ["b"]]), np.array([1.0, 2.0]), TypeError, "X must be an array of numbers"),
        (np.zeros((3, 1)), np.array([2.0, 2.0, 2.0]), ValueError, "y is constant"),
        (np.zeros((1, 1)), np.array([1.0]), ValueError, "at least 2"),
        (np.zeros((3, 1)), np.zeros((3, 2)), ValueError, "y must be 1-D"),
    ],
)
def test_bad_data_raises_naming_the_argument(X, y, exc, match):
    with pytest.raises(exc, match=match):
        gpvi.GPRegression(X, y)


def test_bad_theta_and_settings():
    X, y = make_gp_data(10, 2)
    model = gpvi.GPRegression(X, y)
    with pytest.raises(ValueError, match="theta must have length D = 4"):
        model.log_joint(torch.zeros(3))
    with pytest.raises(ValueError, match="theta must be 1-D or 2-D"):
        model.log_joint(torch.zeros(2, 2, 4))
    with pytest.raises(ValueError, match="X_new has 3 features but the model was built with 2"):
        model.predict(torch.zeros(4), torch.zeros(5, 3))
    with pytest.raises(ValueError, match="jitter must be > 0"):
        gpvi.GPRegression(X, y, jitter=0.0)
    with pytest.raises(TypeError, match="kernel must be a gpytorch"):
        gpvi.GPRegression(X, y, kernel="rbf")
    with pytest.raises(TypeError, match="prior must have a log_prob"):
        gpvi.GPRegression(X, y, prior=3.0)
    with pytest.raises(ValueError, match="constraint"):          # Interval / GreaterThan are honoured (issue 40)
        gpvi.GPRegression(X, y, kernel=gpytorch.kernels.RBFKernel(
            lengthscale_constraint=gpytorch.constraints.LessThan(10.0)))


def test_memory_guard_refuses_huge_n_before_allocating(monkeypatch):
    from gpvi.validation import memory
    monkeypatch.setattr(memory, "available_memory_bytes", lambda device: 10 * 2**20)   # pretend 10 MiB free
    X, y = make_gp_data(2000, 1)
    with pytest.raises(MemoryError, match="N = 2000"):
        gpvi.GPRegression(X, y)


@pytest.mark.parametrize("fast", [True, False])
def test_second_derivatives_refused_not_silently_wrong(fast):
    """The closed-form backward is not differentiable again; asking for a Hessian must fail loudly."""
    X, y = make_gp_data(10, 2)
    model = gpvi.GPRegression(X, y)
    model.use_fast_path = fast
    with pytest.raises(NotImplementedError, match="second derivatives"):
        torch.autograd.functional.hessian(model.log_joint, model.initial_theta())
