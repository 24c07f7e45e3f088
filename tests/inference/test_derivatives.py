"""The shared derivative helpers (gpvi.inference.derivatives) against closed forms and against each other."""

import math

import pytest
import torch

import gpvi
from gpvi.inference.derivatives import finite_difference_hessian, log_joint_and_grad, value_grad_hessian
from gpvi.models.target import call_log_joint, is_minibatch_target


def _quartic():
    # log g = -1/2 th^T A th - sum th^4 / 12: gradient -A th - th^3 / 3, Hessian -A - diag(th^2)
    A = torch.tensor([[2.0, 0.3, 0.0], [0.3, 1.0, -0.2], [0.0, -0.2, 0.5]], dtype=torch.float64)
    fn = lambda th: -0.5 * ((th @ A) * th).sum(-1) - (th ** 4).sum(-1) / 12  # noqa: E731
    return gpvi.Target(fn, names=3), A


def test_value_and_gradient_match_closed_form_and_chunking_changes_nothing():
    target, A = _quartic()
    th = torch.randn(7, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    v, g = log_joint_and_grad(target, th)
    v2, g2 = log_joint_and_grad(target, th, chunk=2)
    # chunks change the shapes of the matrix products, hence at most the last bits (BLAS kernels differ by CPU)
    torch.testing.assert_close((v2, g2), (v, g), rtol=1e-14, atol=1e-15)
    assert torch.allclose(g, -th @ A - th ** 3 / 3, atol=1e-14)
    assert not v.requires_grad and not g.requires_grad


def test_hessians_agree_with_closed_form():
    target, A = _quartic()
    th = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    exact = -A - torch.diag(th ** 2)
    H_fd = finite_difference_hessian(target, th)
    _, _, H_ad = value_grad_hessian(target, th, hessian="autograd")
    _, _, H_vf = value_grad_hessian(target, th, hessian="fd")
    assert torch.allclose(H_ad, exact, atol=1e-13)
    assert (H_fd - exact).abs().max() < 1e-7 and (H_vf - exact).abs().max() < 1e-7
    assert torch.allclose(H_fd, H_vf, atol=1e-12)       # one implementation behind both


def test_bad_shapes_and_failed_points_are_reported():
    bad = gpvi.Target(lambda th: th.sum(-1, keepdim=True), names=2)
    with pytest.raises(ValueError, match="expected"):
        call_log_joint(bad, torch.zeros(3, 2, dtype=torch.float64))
    fails = gpvi.Target(lambda th: torch.where(th[:, 0] < -1e-6, -math.inf, -(th ** 2).sum(-1)), names=2)
    H = finite_difference_hessian(fails, torch.zeros(2, dtype=torch.float64))
    assert bool(torch.isnan(H[0]).all()) and bool(torch.isnan(H[:, 0]).all()) and H[1, 1] == pytest.approx(-2.0)
    assert not is_minibatch_target(fails)
    with pytest.raises(ValueError, match="step"):
        finite_difference_hessian(fails, torch.zeros(2), step=0.0)
