"""The two-buffer exact log marginal (gpvi.models.scaled_rbf) against the batched path and finite differences."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import gpvi
from gpvi.exceptions import NotPSDError
from gpvi.models.scaled_rbf import largest_n, lean_log_marginal


def _model(n=150, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64) * 4
    y = torch.sin(X).sum(-1) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    return gpvi.GPRegression(X, y)


def _val_grad(model, theta):
    th = theta.clone().requires_grad_(True)
    v = model.log_joint(th)
    (g,) = torch.autograd.grad(v.sum(), th)
    return v.detach(), g


@pytest.mark.parametrize("ard", [True, False])
def test_lean_matches_batched_path_value_and_gradient(ard):
    import gpytorch
    m = _model()
    if not ard:
        k = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
        m = gpvi.GPRegression(m.X, m.y, kernel=k)
    g = torch.Generator().manual_seed(1)
    theta = m.initial_theta() + 0.3 * torch.randn(4, m.dim, generator=g, dtype=torch.float64)
    v0, g0 = _val_grad(m, theta)
    m.lean_min_n = 1
    assert m._lean()
    v1, g1 = _val_grad(m, theta)
    torch.testing.assert_close(v1, v0, rtol=1e-11, atol=1e-9)
    torch.testing.assert_close(g1, g0, rtol=1e-8, atol=1e-8)
    v2, g2 = _val_grad(m, theta[0])                   # single theta
    torch.testing.assert_close(v2, v0[0], rtol=1e-11, atol=1e-9)
    torch.testing.assert_close(g2, g0[0], rtol=1e-8, atol=1e-8)


def test_lean_gradient_against_central_differences():
    m = _model(n=80)
    m.lean_min_n = 1
    theta = m.initial_theta() + 0.2
    _, g = _val_grad(m, theta)
    h = 1e-5
    fd = torch.stack([(m.log_joint(theta + h * e) - m.log_joint(theta - h * e)) / (2 * h)
                      for e in torch.eye(m.dim, dtype=torch.float64)])
    torch.testing.assert_close(g, fd, rtol=1e-6, atol=1e-6)


def test_lean_jitter_and_failure():
    X = torch.zeros(30, 1, dtype=torch.float64)
    X[15:] = 1.0                                      # repeated rows: K_f singular, tiny noise
    y = torch.linspace(0, 1, 30, dtype=torch.float64)
    theta = torch.tensor([0.0, 0.0, -60.0], dtype=torch.float64)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        v = lean_log_marginal(theta, X, y, jitter=1e-10, max_jitter=1e-2)
    assert math.isfinite(float(v)) and any("jitter" in str(x.message) for x in w)
    with pytest.raises(NotPSDError):
        lean_log_marginal(theta, X, y, jitter=1e-30, max_jitter=1e-28)
    th = theta.clone().requires_grad_(True)
    v = lean_log_marginal(th, X, y, jitter=1e-30, max_jitter=1e-28, raise_on_failure=False)
    v.backward()
    assert v.item() == -math.inf and bool((th.grad == 0).all())


def test_lean_is_used_from_lean_min_n_and_budget_follows():
    m = _model(n=60)
    assert not m._lean() and m.memory_per_draw() == 5 * 60 * 60 * 8
    m.lean_min_n = 60
    assert m._lean() and m.memory_per_draw() == 2 * 60 * 60 * 8
    m.use_fast_path = False
    assert not m._lean()


def test_largest_n_formula():
    assert largest_n(40 * 10**9) == 50_000                  # 2 copies x 8 bytes x 50,000^2 = 40 GB
    assert largest_n(0) == 0
    from gpvi.models.scaled_rbf import lean_copies
    assert lean_copies("cpu") == lean_copies(None) == 2 and lean_copies("cuda:0") == 3     # 3 measured on an H200
    assert largest_n(60 * 10**9, copies=lean_copies("cuda")) == 50_000
