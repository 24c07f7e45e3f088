"""Known, heteroskedastic noise in regression: ``gpytorch.likelihoods.FixedNoiseGaussianLikelihood`` (issue 58).

Checked against GPyTorch's own ExactGP with the same likelihood: the exact marginal likelihood (with and without a
learned additional noise) and the predictive of f*; bad noise vectors are refused naming ``likelihood``.
"""

from __future__ import annotations

import warnings

import gpytorch
import pytest
import torch

import gpvi

F64 = torch.float64


def _data(n: int = 25):
    g = torch.Generator().manual_seed(3)
    X = torch.rand(n, 2, generator=g, dtype=F64) * 4 - 2
    noise = 0.01 + 0.2 * torch.rand(n, generator=g, dtype=F64)
    y = torch.sin(X[:, 0]) + noise.sqrt() * torch.randn(n, generator=g, dtype=F64)
    return X, y, noise


class _ExactGP(gpytorch.models.ExactGP):
    def __init__(self, X, y, lik):
        super().__init__(X, y, lik)
        self.mean = gpytorch.means.ZeroMean()
        self.cov = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean(x), self.cov(x))


def _gpytorch(X, y, noise, theta, additional):
    lik = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise=noise, learn_additional_noise=additional)
    gp = _ExactGP(X, y, lik).double()
    gp.cov.base_kernel.lengthscale = torch.exp(0.5 * theta[:2])
    gp.cov.outputscale = torch.exp(theta[2])
    if additional:
        lik.second_noise = 1e-4 + torch.exp(theta[3])
    return gp, lik


@pytest.mark.parametrize("additional", [False, True])
def test_log_marginal_and_prediction_match_gpytorch(additional):
    X, y, noise = _data()
    lik = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise=noise, learn_additional_noise=additional)
    model = gpvi.GPRegression(X, y, likelihood=lik, mean=gpytorch.means.ZeroMean())
    names = ["log_lengthscale_sq[0]", "log_lengthscale_sq[1]", "log_signal_var"]
    assert model.names == names + (["log_excess_noise_var"] if additional else [])
    theta = torch.tensor([0.3, 1.1, -0.2, -3.0][:model.dim], dtype=F64)
    gp, glik = _gpytorch(X, y, noise, theta, additional)
    gp.train()
    with gpytorch.settings.max_cholesky_size(10 ** 6), torch.no_grad():
        ref = float(gpytorch.mlls.ExactMarginalLogLikelihood(glik, gp)(gp(X), y)) * len(y)
    assert abs(float(model.log_marginal_likelihood(theta)) - ref) < 1e-9 * abs(ref)
    X_new = torch.linspace(-2, 2, 9, dtype=F64).unsqueeze(-1).expand(9, 2)
    gp.eval()
    with gpytorch.settings.max_cholesky_size(10 ** 6), gpytorch.settings.fast_pred_var(False), torch.no_grad():
        f = gp(X_new)
    mean, var = model.predict(theta, X_new, include_noise=False)
    torch.testing.assert_close(mean, f.mean, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(var, f.variance, rtol=1e-6, atol=1e-10)
    _, var_y = model.predict(theta, X_new)           # y*: the learned noise only (0 without it)
    extra = model.noise_var(theta) if additional else 0.0
    torch.testing.assert_close(var_y, var + extra, rtol=1e-12, atol=0)


def test_engines_run_on_known_noise():
    X, y, noise = _data()
    model = gpvi.GPRegression(X, y, likelihood=gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise=noise))
    assert model.closed_form is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = gpvi.ML2(num_restarts=2, seed=0, prior=True).run(model)          # MAP: the log joint's optimum
        q = gpvi.DSVI(num_steps=30, seed=0, progress_bar=False).run(model, init=fit)
    v, g = model.log_joint_and_grad(torch.stack([fit.theta, q.mean]))
    assert bool(torch.isfinite(v).all()) and float(g[0].abs().max()) < 1e-3 * max(1.0, float(v[0].abs()))


@pytest.mark.parametrize("noise, match", [
    (torch.full((24,), 0.1, dtype=F64), r"shape \(25,\)"),
    (torch.cat([torch.full((24,), 0.1, dtype=F64), torch.tensor([float("nan")], dtype=F64)]), "finite and >= 0"),
])                                               # (GPyTorch itself raises negative noise to 1e-6, with a warning)
def test_bad_known_noise_is_refused_naming_the_likelihood(noise, match):
    X, y, _ = _data()
    with pytest.raises(ValueError, match="likelihood is a FixedNoiseGaussianLikelihood.*" + match):
        gpvi.GPRegression(X, y, likelihood=gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise=noise))
