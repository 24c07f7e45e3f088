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


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("layout", ["column", "row"])
def test_precision_by_potri_against_the_explicit_inverse(batched, layout):
    """marginals(keep_precision=True): P from potri against torch.linalg.inv(K + S) (1e-10 relative to max |P|),
    symmetric bit for bit, written into a given buffer; its diagonal gives the same variances as the triangular
    inverse's column norms (keep_inverse=True) and as the explicit diag(K - K (K + S)^{-1} K), 1e-10 relative; a
    factor of either memory layout (potrf's column-major view or a C-ordered one)."""
    gen = torch.Generator().manual_seed(11)
    N = 90
    X = torch.randn(N, 3, dtype=F64, generator=gen)
    K = 4.0 * torch.exp(-0.5 * torch.cdist(X, X) ** 2)
    s = torch.rand(N, dtype=F64, generator=gen) * 3 + 0.05
    s = torch.stack([s, s.flip(0), 10 * s], 1) if batched else s
    ytilde = torch.randn(s.shape, dtype=F64, generator=gen)
    L, _ = sites.site_factor(K, s)
    L = L if layout == "column" else L.contiguous()
    out = torch.empty(L.shape, dtype=F64)
    m, v, alpha, P = sites.marginals(K, L, ytilde, keep_precision=True, out=out)
    m2, v2, alpha2, Linv = sites.marginals(K, L, ytilde, keep_inverse=True)
    assert P.data_ptr() == out.data_ptr() and torch.equal(P, P.mT)
    for c in range(3 if batched else 1):
        sc = s[:, c] if batched else s
        B = K + torch.diag(sc)
        Pc = P[c] if batched else P
        ref = torch.linalg.inv(B)
        torch.testing.assert_close(Pc, ref, rtol=0, atol=1e-10 * float(ref.abs().max()))
        v_ref = K.diagonal() - (K * (ref @ K)).sum(0)
        vc = v[:, c] if batched else v
        torch.testing.assert_close(vc, v_ref, rtol=1e-10, atol=0)
        Li = Linv[c] if batched else Linv
        torch.testing.assert_close(Li.mT @ Li, ref, rtol=0, atol=1e-10 * float(ref.abs().max()))
    torch.testing.assert_close(v, v2, rtol=1e-12, atol=0)
    assert torch.equal(m, m2) and torch.equal(alpha, alpha2)
    with pytest.raises(ValueError, match="exclusive"):
        sites.marginals(K, L, ytilde, keep_precision=True, keep_inverse=True)


def test_summed_kernel_gradient_from_the_precision_equals_the_one_from_the_inverse():
    """kernel_gradient_summed(P=...) (potri's P) against kernel_gradient_summed(Linv) (lauum of the triangular
    inverse) and the general kernel_gradient with either: 1e-12 relative, three factors and one."""
    gen = torch.Generator().manual_seed(12)
    n, C = 70, 3
    X = torch.randn(n, 2, generator=gen, dtype=F64)
    K = torch.exp(-torch.cdist(X, X) ** 2)
    lam2 = -(torch.rand(C, n, generator=gen, dtype=F64) + 0.1)
    lam1 = torch.randn(C, n, generator=gen, dtype=F64)
    L, _ = sites.site_factor(K, (-0.5 / lam2).T)
    ytilde = (-0.5 / lam2 * lam1).T
    m, _, alpha, P = sites.marginals(K, L, ytilde, keep_precision=True)
    Linv = sites.marginals(K, L, ytilde, keep_inverse=True)[3]
    m = m.T
    dm = lam1 + 2 * lam2 * m + 0.1 * torch.randn(C, n, generator=gen, dtype=F64)
    dv = lam2 + 0.1 * torch.randn(C, n, generator=gen, dtype=F64)
    T_P = sites.kernel_gradient_summed(L, lam1, lam2, m, alpha, dm, dv, P=P)
    T_L = sites.kernel_gradient_summed(L, lam1, lam2, m, alpha, dm, dv, Linv)
    G = sites.kernel_gradient(L, lam1, lam2, m, alpha, dm, dv).sum(0)
    G_P = sites.kernel_gradient(L, lam1, lam2, m, alpha, dm, dv, P=P).sum(0)
    scale = float(G.abs().max())
    for T in (T_P, T_L):
        assert float(((T + T.T) / 2 - G).abs().max()) <= 1e-12 * scale
    assert float((G_P - G).abs().max()) <= 1e-12 * scale
    T1 = sites.kernel_gradient_summed(L[0], lam1[0], lam2[0], m[0], alpha[0], dm[0], dv[0], P=P[0])
    G1 = sites.kernel_gradient(L[0], lam1[0], lam2[0], m[0], alpha[0], dm[0], dv[0])
    assert float(((T1 + T1.T) / 2 - G1).abs().max()) <= 1e-12 * float(G1.abs().max())
    with pytest.raises(ValueError, match="P or Linv"):
        sites.kernel_gradient_summed(L, lam1, lam2, m, alpha, dm, dv)
