"""Cholesky bookkeeping: jitter policy, the analytic-backward Gaussian log density, rank-one updates."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from gpvi.exceptions import NotPSDError, NumericalWarning
from gpvi.linalg import cholesky_update, cholesky_with_jitter, gaussian_log_marginal


def _spd(n, g, shift=1.0):
    A = torch.randn(n, n, generator=g, dtype=torch.float64)
    return A @ A.T / n + shift * torch.eye(n, dtype=torch.float64)


def test_gaussian_log_marginal_matches_torch_mvn_value_and_gradient(generator):
    K = _spd(25, generator)
    y = torch.randn(25, generator=generator, dtype=torch.float64)
    K1 = K.clone().requires_grad_(True)
    v1 = gaussian_log_marginal(K1, y)
    v1.backward()
    K2 = K.clone().requires_grad_(True)
    v2 = torch.distributions.MultivariateNormal(torch.zeros(25, dtype=torch.float64), covariance_matrix=K2).log_prob(y)
    v2.backward()
    assert abs(float((v1 - v2).detach())) < 1e-10 * abs(float(v2.detach()))
    sym = lambda G: 0.5 * (G + G.T)  # noqa: E731 - only symmetric perturbations are meaningful
    assert torch.allclose(sym(K1.grad), sym(K2.grad), rtol=1e-10, atol=1e-12)


def test_gaussian_log_marginal_batched_equals_loop_and_y_gradient(generator):
    Ks = torch.stack([_spd(15, generator) for _ in range(4)])
    y = torch.randn(15, generator=generator, dtype=torch.float64, requires_grad=True)
    vb = gaussian_log_marginal(Ks, y)
    loop = torch.stack([gaussian_log_marginal(K, y) for K in Ks])
    assert torch.allclose(vb, loop, rtol=0, atol=1e-10)
    (gy,) = torch.autograd.grad(vb.sum(), y)
    expected = -sum(torch.linalg.solve(K, y.detach()) for K in Ks)
    assert torch.allclose(gy, expected, atol=1e-10)


def test_jitter_path_warns_and_recovers():
    x = torch.linspace(0, 1, 6, dtype=torch.float64)
    K = torch.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / 10.0)      # numerically singular (rank-deficient)
    K = torch.cat([torch.cat([K, K[:, :1]], 1), torch.cat([K[:1], K[:1, :1]], 1)], 0)   # duplicate a point
    with pytest.warns(NumericalWarning, match="jitter"):
        res = cholesky_with_jitter(K)
    assert bool(res.ok) and float(res.jitter) > 0
    assert torch.allclose(res.L @ res.L.T, K + float(res.jitter) * torch.eye(7, dtype=torch.float64), atol=1e-12)


def test_failure_past_cap_raises_for_single_and_flags_in_batch():
    bad = torch.tensor([[1.0, 0.0], [0.0, -5.0]], dtype=torch.float64)
    good = torch.eye(2, dtype=torch.float64)
    with pytest.raises(NotPSDError, match="theta"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NumericalWarning)
            cholesky_with_jitter(bad, theta=torch.tensor([1.0, 2.0]))
    res = cholesky_with_jitter(torch.stack([good, bad]))
    assert res.ok.tolist() == [True, False]
    vals = gaussian_log_marginal(torch.stack([good, bad]), torch.ones(2, dtype=torch.float64))
    assert math.isfinite(float(vals[0])) and float(vals[1]) == -math.inf


def test_nonfinite_matrix_is_not_fixed_by_jitter():
    K = torch.eye(3, dtype=torch.float64)
    K[1, 0] = K[0, 1] = float("nan")
    res = cholesky_with_jitter(K, raise_on_failure=False)
    assert not bool(res.ok)
    K2 = torch.eye(3, dtype=torch.float64)
    K2[2, 2] = float("inf")
    assert not bool(cholesky_with_jitter(K2, raise_on_failure=False).ok)


def test_failed_batch_member_gets_zero_gradient():
    good = torch.eye(2, dtype=torch.float64) * 2
    bad = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=torch.float64)
    K = torch.stack([good, bad]).requires_grad_(True)
    v = gaussian_log_marginal(K, torch.ones(2, dtype=torch.float64))
    v[0].backward()
    assert bool(torch.isfinite(K.grad).all()) and float(K.grad[1].abs().max()) == 0.0


@pytest.mark.parametrize("alpha", [2.0, 0.3, -0.3])
def test_rank_one_update_single(generator, alpha):
    K = _spd(30, generator)
    L = torch.linalg.cholesky(K)
    x = torch.randn(30, generator=generator, dtype=torch.float64)
    x = x / x.norm()                        # |alpha| x x^T below the smallest eigenvalue (>= 1): stays SPD
    L2 = cholesky_update(L, x, alpha)
    assert torch.equal(L2, torch.tril(L2))
    assert torch.allclose(L2, torch.linalg.cholesky(K + alpha * torch.outer(x, x)), atol=1e-12)


def test_rank_one_update_batched(generator):
    Ks = torch.stack([_spd(12, generator) for _ in range(3)])
    L = torch.linalg.cholesky(Ks)
    x = torch.randn(3, 12, generator=generator, dtype=torch.float64)
    alpha = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    L2 = cholesky_update(L, x, alpha)
    ref = torch.linalg.cholesky(Ks + alpha[:, None, None] * x[:, :, None] * x[:, None, :])
    assert torch.allclose(L2, ref, atol=1e-12)


def test_thousand_diagonal_updates_match_fresh_factor(generator):
    """CVI's use: 1000 single-site changes of a diagonal entry (updates and downdates) stay within 1e-8."""
    n = 200
    X = torch.rand(n, 3, generator=generator, dtype=torch.float64)
    K = torch.exp(-0.5 * torch.cdist(X, X) ** 2 / 0.3) + torch.diag(torch.full((n,), 4.0, dtype=torch.float64))
    L = torch.linalg.cholesky(K)
    sites = torch.randint(n, (1000,), generator=generator)
    deltas = torch.rand(1000, generator=generator, dtype=torch.float64) * 4 - 2   # keep diag >= 4 - cumulative
    e = torch.zeros(n, dtype=torch.float64)
    for i, d in zip(sites.tolist(), deltas.tolist()):
        d = max(d, 1.0 - float(K[i, i]))       # keep the diagonal >= 1 so the matrix stays SPD
        e.zero_()
        e[i] = 1.0
        L = cholesky_update(L, e, d)
        K[i, i] += d
    err = float((L - torch.linalg.cholesky(K)).abs().max())
    assert err < 1e-8, err


def test_downdate_to_indefinite_raises(generator):
    K = torch.eye(4, dtype=torch.float64)
    L = torch.linalg.cholesky(K)
    e = torch.zeros(4, dtype=torch.float64)
    e[2] = 1.0
    with pytest.raises(NotPSDError, match="indefinite"):
        cholesky_update(L, e, -1.5)


def test_cholesky_plain_adds_no_jitter_and_reports_or_raises():
    from gpvi.linalg import cholesky_plain

    A = torch.tensor([[4.0, 2.0], [2.0, 3.0]], dtype=torch.float64)
    bad = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=torch.float64)          # eigenvalues 3 and -1
    L, ok = cholesky_plain(torch.stack([A, bad]))
    assert ok.tolist() == [True, False]
    expected = torch.tensor([[2.0, 0.0], [1.0, math.sqrt(2.0)]], dtype=torch.float64)   # by hand
    torch.testing.assert_close(L[0], expected, rtol=0, atol=1e-15)
    with pytest.raises(torch.linalg.LinAlgError):
        cholesky_plain(bad, raise_on_failure=True)


def test_triangular_inverse_matches_a_general_inverse_batched_and_in_float32(generator):
    """linalg.triangular_inverse (LAPACK trtri on the CPU) against torch.linalg.inv, for one factor, a batch and
    float32; the result is lower triangular and a singular factor is refused."""
    from gpvi.linalg import triangular_inverse

    A = torch.randn(3, 40, 40, dtype=torch.float64, generator=generator)
    L = torch.linalg.cholesky(A @ A.mT + 40 * torch.eye(40, dtype=torch.float64))
    L_before = L.clone()
    inv = triangular_inverse(L)
    assert torch.equal(L, L_before)                       # inverted in a copy, never in the caller's factor
    torch.testing.assert_close(inv, torch.linalg.inv(L), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(triangular_inverse(L.mT.contiguous().mT), inv, rtol=0, atol=0)   # any layout
    assert torch.equal(inv, torch.tril(inv))
    torch.testing.assert_close(triangular_inverse(L[1]), inv[1], rtol=0, atol=0)
    f32 = triangular_inverse(L[0].float())
    assert f32.dtype == torch.float32
    torch.testing.assert_close(f32, torch.linalg.inv(L[0]).float(), rtol=1e-4, atol=1e-6)
    sing = L[0].clone()
    sing[5, 5] = 0.0
    with pytest.raises(NotPSDError, match="singular"):
        triangular_inverse(sing)


def test_sum_of_squares_matches_torch_along_rows_and_columns(generator):
    """linalg.sum_of_squares (numpy.einsum on the CPU) against torch's (A * A).sum, one matrix and a batch, float64
    and float32, a non-contiguous input; under autograd it keeps the graph; a bad dim is refused."""
    from gpvi.linalg import sum_of_squares

    A = torch.randn(3, 30, 20, dtype=torch.float64, generator=generator)
    for X in (A, A[0], A.mT, A.float()):
        for dim in (-1, -2):
            got = sum_of_squares(X, dim)
            assert got.dtype == X.dtype and got.shape == X.sum(dim).shape
            torch.testing.assert_close(got, (X * X).sum(dim))
    B = A[0].clone().requires_grad_(True)
    sum_of_squares(B, -2).sum().backward()
    torch.testing.assert_close(B.grad, 2 * A[0])
    with pytest.raises(ValueError, match="dim"):
        sum_of_squares(A, 0)
