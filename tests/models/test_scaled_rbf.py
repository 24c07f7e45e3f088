"""Input centring of gpvi.models.scaled_rbf: which kernels are centred, and exactness under shifts on every path.

The property tests (random data, permutations, rescaling) are in ``tests/models/test_invariances.py``; these are the
unit checks: the stationarity rule, the centre itself, and predictions (cross-covariances through GPyTorch's
generic kernels, where ``torch.cdist`` does not centre) at inputs shifted by 1e9.
"""

from __future__ import annotations

import math

import gpytorch
import gpytorch.kernels as gk
import numpy as np
import pytest
import torch

import gpvi
from gpvi.models.classification import GPClassification
from gpvi.models.scaled_rbf import centre_inputs, input_centre, is_stationary, scaled_rbf_covariance

GRID = 2.0 ** -20     # inputs on this grid: X + 1e9 is exact in float64


def _grid_data(n=30, d=2, seed=0):
    rng = np.random.default_rng(seed)
    X = np.round(rng.normal(size=(n, d)) * 3 / GRID) * GRID
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)
    return X, y


class _MyRBF(gk.RBFKernel):
    pass


@pytest.mark.parametrize("kernel, expected", [
    (gk.ScaleKernel(gk.RBFKernel(ard_num_dims=2)), True),
    (gk.MaternKernel(nu=1.5), True),
    (gk.ScaleKernel(gk.PeriodicKernel()), True),
    (gk.AdditiveKernel(gk.RBFKernel(active_dims=[0]), gk.ScaleKernel(gk.RQKernel(active_dims=[1]))), True),
    (gk.ProductKernel(gk.RBFKernel(), gk.CosineKernel()), True),
    (gk.LinearKernel(), False),
    (gk.ScaleKernel(gk.PolynomialKernel(power=2)), False),
    (gk.AdditiveKernel(gk.RBFKernel(), gk.LinearKernel()), False),
    (_MyRBF(), False),                      # a subclass may override forward: not assumed stationary
])
def test_is_stationary(kernel, expected):
    assert is_stationary(kernel) is expected


def test_centre_is_the_column_median_and_only_for_stationary_kernels():
    X = torch.tensor([[3.0, -1.0], [1.0, 5.0], [2.0, 7.0], [10.0, 0.0]], dtype=torch.float64)
    c = input_centre(X, gk.RBFKernel())
    assert c.tolist() == [2.0, 0.0]                 # lower medians: values of the columns themselves
    assert torch.equal(centre_inputs(X, c), X - torch.tensor([2.0, 0.0], dtype=torch.float64))
    assert input_centre(X, gk.LinearKernel()) is None
    assert centre_inputs(X, None) is X


def test_linear_kernel_is_not_centred():
    """Centring would change a kernel x^T x'; the linear model must still depend on the origin."""
    X, y = _grid_data()
    theta = torch.tensor([0.0, math.log(0.1)], dtype=torch.float64)
    a = gpvi.GPRegression(X, y, kernel=gk.LinearKernel(), mean=gpytorch.means.ZeroMean())
    b = gpvi.GPRegression(X + 5.0, y, kernel=gk.LinearKernel(), mean=gpytorch.means.ZeroMean())
    Xt = torch.as_tensor(X)
    K = Xt @ Xt.T + 0.1 * torch.eye(len(y), dtype=torch.float64)   # variance 1
    ref = torch.distributions.MultivariateNormal(torch.zeros(len(y), dtype=torch.float64), K).log_prob(
        torch.as_tensor(y))
    torch.testing.assert_close(a.log_marginal_likelihood(theta), ref, rtol=1e-12, atol=1e-12)
    assert abs(float(b.log_marginal_likelihood(theta)) - float(ref)) > 1e-3


@pytest.mark.parametrize("kernel, fast", [
    (None, True),                                   # default kernel, hand-written covariance
    (None, False),                                  # default kernel through GPyTorch
    (gk.ScaleKernel(gk.MaternKernel(nu=2.5, ard_num_dims=2)), False),
    (gk.ScaleKernel(gk.PeriodicKernel()), False),
    (gk.AdditiveKernel(gk.ScaleKernel(gk.RBFKernel(active_dims=[0])), gk.ScaleKernel(gk.RQKernel(active_dims=[1]))),
     False),
])
def test_regression_predictions_exact_under_shift(kernel, fast):
    X, y = _grid_data()
    shift = np.array([1e9, -3e8])
    out = []
    for XX in (X, X + shift):
        model = gpvi.GPRegression(XX, y, kernel=kernel)
        model.use_fast_path = fast
        th = model.initial_theta()
        mean, var = model.predict(th, XX[:6] + 0.5)
        mf, cov = model.predict(th, XX[:6] + 0.5, full_cov=True)
        out.append((float(model.log_joint(th)), mean, var, mf, cov))
    assert out[0][0] == out[1][0]
    for a, b in zip(out[0][1:], out[1][1:]):
        assert torch.equal(a, b)


def test_classifier_kernel_matrices_exact_under_shift():
    X, y = _grid_data()
    labels = (y > 0).astype(float)
    shift = np.array([-1e9, 1e9])
    mats = []
    for XX in (X, X + shift):
        model = GPClassification(XX, labels)
        mats.append((model.theta, model.kernel_matrix(), model.cross_covariance(None, XX[:5] - 0.25),
                     model.prior_variance(None, XX[:5] - 0.25)))
    for a, b in zip(*mats):
        assert torch.equal(a, b)


def test_uncentred_inputs_are_what_broke():
    """The expansion |x|^2 + |x'|^2 - 2 x.x' on raw inputs far from the origin loses the kernel (the bug this
    centring fixes); on centred inputs it matches the difference formula to rounding."""
    X, _ = _grid_data(n=20, d=1)
    Xt = torch.as_tensor(X)
    theta = torch.tensor([0.0, 0.0, math.log(1e-6)], dtype=torch.float64)
    exact = torch.exp(-0.5 * (Xt - Xt.T) ** 2) + 1e-6 * torch.eye(20, dtype=torch.float64)
    raw = scaled_rbf_covariance(theta, Xt + 1e8)
    centred = scaled_rbf_covariance(theta, centre_inputs(Xt + 1e8, input_centre(Xt + 1e8, gk.RBFKernel())))
    assert float((raw - exact).abs().max()) > 1e-3
    torch.testing.assert_close(centred, exact, rtol=0, atol=1e-14)
