"""Issue 58, item 3: regression answers do not depend on the data's units.

A model fitted to ``(a x + b, c y + d)`` must give the same answer in standardised units as on ``(x, y)`` for a, c
over 1e-8..1e8: the log joint up to the constant ``-N log|c|`` at theta shifted by the change of units, ML-II's
optimum, DSVI's seeded q and the predictions. Written the way a user meets it: the same data in other units (the
issue's examples: y in units of 1e-8, x in units of 1e6), no setting changed. Before the fix the default prior
N(0, 10) and ML-II's box +-25 were absolute: ML-II on y x 1e-8 returned a noise variance six orders off and DSVI a
wrong signal variance, without a word.
"""

from __future__ import annotations

import math
import warnings

import gpytorch
import pytest
import torch

import gpvi
from gpvi.exceptions import BoundWarning, ConvergenceWarning

UNITS = [(1.0, 1.0), (1e6, 1.0), (1.0, 1e-8), (1e-8, 1e8), (1e8, 1e-8), (3.7e-3, 2.1e5)]
"""(a, c): inputs x a + 3a, targets y c - 7c (offsets in the data's own units)."""


def _data(n: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=torch.float64) * 4 - 2
    y = torch.sin(X[:, 0] / 0.4) + 0.3 * X[:, 1] + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    return X, y


def _model(a: float, c: float, **kw) -> gpvi.GPRegression:
    X, y = _data()
    return gpvi.GPRegression(X * a + 3 * a, y * c - 7 * c, **kw)


def _shift(a: float, c: float) -> torch.Tensor:
    """theta of the same function in the new units: lengthscale^2 x a^2, variances x c^2."""
    return torch.tensor([2 * math.log(a)] * 2 + [2 * math.log(c)] * 2, dtype=torch.float64)


@pytest.mark.parametrize("a, c", UNITS)
def test_log_joint_moves_with_the_units(a, c):
    unit, other = _model(1.0, 1.0), _model(a, c)
    shift = _shift(a, c)
    assert torch.allclose(other.standard_theta() - unit.standard_theta(), shift, rtol=0, atol=1e-9)
    g = torch.Generator().manual_seed(1)
    theta = unit.initial_theta() + 0.5 * torch.randn(3, unit.dim, generator=g, dtype=torch.float64)
    v1, g1 = unit.log_joint_and_grad(theta)
    v2, g2 = other.log_joint_and_grad(theta + shift)
    n = unit.num_data
    assert torch.allclose(v2 + n * math.log(c), v1, rtol=1e-9, atol=1e-8)
    assert torch.allclose(g2, g1, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("a, c", UNITS[1:])
def test_ml2_and_predictions_do_not_depend_on_the_units(a, c):
    unit, other = _model(1.0, 1.0), _model(a, c)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BoundWarning)          # x in units of 1e6 used to hit the box
        fit1 = gpvi.ML2(num_restarts=2, seed=0).run(unit)
        fit2 = gpvi.ML2(num_restarts=2, seed=0).run(other)
    assert torch.allclose(fit2.theta - _shift(a, c), fit1.theta, rtol=0, atol=1e-4)
    X_new = torch.linspace(-2, 2, 7, dtype=torch.float64).unsqueeze(-1).expand(7, 2)
    m1, v1 = unit.predict(fit1.theta, X_new + 3)                              # unit model: x + 3, y - 7
    m2, v2 = other.predict(fit2.theta, X_new * a + 3 * a)
    assert torch.allclose((m2 + 7 * c) / c, m1 + 7, rtol=0, atol=1e-4)
    assert torch.allclose(v2 / c ** 2, v1, rtol=1e-3, atol=0)


@pytest.mark.parametrize("a, c", [(1.0, 1e-8), (1e-8, 1e8)])
def test_dsvi_seeded_q_does_not_depend_on_the_units(a, c):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        q1 = gpvi.DSVI(num_steps=80, seed=0, progress_bar=False).run(_model(1.0, 1.0))
        q2 = gpvi.DSVI(num_steps=80, seed=0, progress_bar=False).run(_model(a, c))
    # same draws, same steps: equal up to rounding carried through 80 stochastic steps (theta near +-37 in units of
    # 1e8: 1e-6 measured, against posterior sds of 0.3-0.8)
    assert torch.allclose(q2.mean - _shift(a, c), q1.mean, rtol=0, atol=1e-5)
    assert torch.allclose(q2.covariance, q1.covariance, rtol=1e-4, atol=1e-7)


def test_the_issue_example_noise_and_lengthscale_in_tiny_units():
    """y in units of 1e-8: the same lengthscale of x_0 as in unit units and a noise variance 1e-16 times as large."""
    fit1 = gpvi.ML2(num_restarts=2, seed=0).run(_model(1.0, 1.0))
    fit2 = gpvi.ML2(num_restarts=2, seed=0).run(_model(1.0, 1e-8))
    ls1 = math.exp(float(fit1.theta[0]) / 2)
    ls2 = math.exp(float(fit2.theta[0]) / 2)
    assert 0.2 < ls1 < 3.0 and abs(ls2 / ls1 - 1) < 1e-4
    assert abs(math.exp(float(fit2.theta[3] - fit1.theta[3])) / 1e-16 - 1) < 1e-3


def test_y_is_centred_by_default_and_as_given_with_a_zero_mean():
    X, y = _data()
    model = gpvi.GPRegression(X, y + 1e6)
    assert model.y_offset == pytest.approx(float(y.mean()) + 1e6, rel=1e-15)
    zero = gpvi.GPRegression(X, y + 1e6, mean=gpytorch.means.ZeroMean())
    assert zero.y_offset == 0.0 and torch.equal(zero.y, y + 1e6)
    th = model.initial_theta()
    K = zero.covariance(th)
    ref = torch.distributions.MultivariateNormal(torch.zeros(len(y), dtype=torch.float64), K)
    assert abs(float(zero.log_marginal_likelihood(th)) - float(ref.log_prob(y + 1e6))) < 1e-6 * abs(float(
        ref.log_prob(y + 1e6)))
    assert abs(float(model.log_marginal_likelihood(th)) - float(ref.log_prob(y + 1e6 - model.y_offset))) < 1e-8


def test_a_constant_kernel_term_is_the_users_offset_and_y_is_used_as_written():
    """A ConstantKernel term models the offset (a random constant): centring y as well would change the user's model
    (the published model of benchmarks/small_data.py has one)."""
    X, y = _data()
    k = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()) + gpytorch.kernels.ConstantKernel()
    model = gpvi.GPRegression(X, y + 2.0, kernel=k)
    assert model.y_offset == 0.0
    assert gpvi.GPRegression(X, y + 2.0, kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())).y_offset != 0


def test_prior_scaled_and_the_summary_says_what_the_default_is():
    model = _model(1e3, 1e-2)
    summary = model.prior_summary()
    assert all("standardised problem" in v and v.startswith("N(") for v in summary.values()), summary
    scaled = _model(1e3, 1e-2, prior="scaled")
    assert torch.allclose(scaled.prior.base_dist.loc, scaled.scaled_theta())
    assert "'scaled'" in scaled.prior_summary()["log_noise_var"]
    with pytest.raises(ValueError, match="prior must be"):
        _model(1.0, 1.0, prior="wide")


def test_a_constant_mean_prior_scales_with_y():
    """A ConstantMean's constant (no prior of its own): N(mean(y), 10 var(y)), the default on the standardised
    problem."""
    unit = _model(1.0, 1.0, mean=gpytorch.means.ConstantMean())
    other = _model(1.0, 1e5, mean=gpytorch.means.ConstantMean())
    th = unit.initial_theta()
    shift = torch.cat([_shift(1.0, 1e5), torch.zeros(1, dtype=torch.float64)])
    th2 = th + shift
    th2[-1] = th[-1] * 1e5                  # the unit model's targets are y - 7, the other's 1e5 (y - 7)
    assert abs(float(other.log_prior(th2)) + math.log(1e5) - float(unit.log_prior(th))) < 1e-9
