"""gpvi.numerics.sites: the marginals of site-parametrised q against the direct GP-regression formula."""

from __future__ import annotations

import pytest
import torch

from gpvi.numerics import sites

F64 = torch.float64


@pytest.mark.parametrize("batched", [False, True])
def test_marginals_equal_the_direct_formula_for_strong_and_weak_sites(batched):
    """var = s - s^2 diag((K + S)^{-1}) against diag K - colsum((L^{-1} K)^2), m against K (K + S)^{-1} ytilde,
    with strong sites (s << K_nn), ordinary ones and sites so weak (s = 1e8) that the subtraction would lose every
    digit (the direct formula takes them): 1e-10 relative everywhere, one latent function or three."""
    gen = torch.Generator().manual_seed(3)
    N = 120
    X = torch.randn(N, 2, dtype=F64, generator=gen)
    K = 30.0 * torch.exp(-0.5 * torch.cdist(X, X) ** 2)
    s = torch.cat([torch.full((10,), 0.01, dtype=F64), torch.rand(N - 15, dtype=F64, generator=gen) * 5 + 0.5,
                   torch.full((5,), 1e8, dtype=F64)])
    s = torch.stack([s, s.flip(0), 2 * s], 1) if batched else s
    ytilde = torch.randn(s.shape, dtype=F64, generator=gen)
    L, _ = sites.site_factor(K, s)
    m, v, alpha = sites.marginals(K, L, ytilde)
    for c in range(3 if batched else 1):
        Lc = L[c] if batched else L
        sc, yc = (s[:, c], ytilde[:, c]) if batched else (s, ytilde)
        W = torch.linalg.solve_triangular(Lc, K, upper=False)
        v_ref = K.diagonal() - (W * W).sum(0)
        m_ref = K @ torch.linalg.solve(K + torch.diag(sc), yc)
        vc, mc = (v[:, c], m[:, c]) if batched else (v, m)
        torch.testing.assert_close(vc, v_ref, rtol=1e-10, atol=0)
        torch.testing.assert_close(mc, m_ref, rtol=1e-9, atol=1e-9)
        assert bool((vc[-5:] > 0).all())


def test_sandwich_equals_the_general_product_batched_with_both_signs_and_zeros():
    """sites._sandwich (two symmetric rank-k updates on the CPU) against (P * c) @ P: positive, negative and zero
    c, one matrix and a batch of three, 1e-13 relative."""
    gen = torch.Generator().manual_seed(5)
    A = torch.randn(3, 60, 60, dtype=F64, generator=gen)
    P = A @ A.mT
    c = torch.randn(3, 60, dtype=F64, generator=gen)
    c[1, :20] = 0.0
    c[2] = c[2].abs()
    ref = (P * c.unsqueeze(-2)) @ P
    out = sites._sandwich(P, c)
    torch.testing.assert_close(out, ref, rtol=1e-13, atol=1e-13 * float(ref.abs().max()))
    torch.testing.assert_close(sites._sandwich(P[0], c[0]), ref[0], rtol=1e-13, atol=1e-13 * float(ref.abs().max()))
    assert torch.equal(out, out.mT)
