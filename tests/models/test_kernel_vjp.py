"""``LatentGP.kernel_vjp`` (issue 59): the gradient in theta of sum(K_theta * G) from the cached kernel matrix,
against autograd through ``kernel_matrix`` (the paper's fast path: bit for bit; another kernel: autograd itself)."""

from __future__ import annotations

import gpytorch
import numpy as np
import pytest
import torch

from gpvi.models.classification import GPClassification
from gpvi.models.multiclass import GPMulticlass

F64 = torch.float64


def _autograd(model, theta, G):
    th = theta.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        return torch.autograd.grad((model.kernel_matrix(th) * G).sum(), th)[0]


@pytest.mark.parametrize("make", ["binary", "ard3", "multiclass", "matern"])
def test_kernel_vjp_is_autograd_through_the_kernel_matrix(make):
    rng = np.random.default_rng(7)
    X = torch.as_tensor(rng.normal(size=(40, 3)))
    y = torch.as_tensor((rng.uniform(size=40) < 0.5).astype(int))
    if make == "binary":
        model = GPClassification(X[:, :1], y)
    elif make == "ard3":
        model = GPClassification(X, y)
    elif make == "multiclass":
        model = GPMulticlass(X, torch.as_tensor(rng.integers(0, 3, size=40)))
    else:
        kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=2.5, ard_num_dims=3))
        model = GPClassification(X, y, kernel=kernel)
    theta = torch.as_tensor(rng.normal(scale=0.5, size=model.dim))
    G = torch.as_tensor(rng.normal(size=(40, 40)))               # not symmetric, as the summed gradient's T
    model.kernel_matrix(theta)                                    # cached, as after an inner run
    got, ref = model.kernel_vjp(theta, G), _autograd(model, theta, G)
    assert got.shape == theta.shape and not got.requires_grad
    if model.kernel_params.fast_path:
        assert torch.equal(got, ref)
    else:
        assert torch.allclose(got, ref, rtol=1e-13, atol=0)
    # a theta other than the cached one
    other = theta + 0.1
    assert torch.allclose(model.kernel_vjp(other, G), _autograd(model, other, G), rtol=1e-13, atol=0)
