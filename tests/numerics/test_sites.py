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


@pytest.mark.parametrize("k", [1, 3])
def test_type_ii_objective_is_the_same_with_either_inverse(monkeypatch, k):
    """profiled_objective with the steps keeping P (potri; sites.INVERSE_MIN above N) and keeping L^-1 (trtri, then
    one lauum for the gradient; INVERSE_MIN below N): the same sites, bound and gradient to 1e-10 relative; the
    default marginals() gives the same variances either way."""
    import collections

    from gpvi.inference.cvi import CVI
    from gpvi.inference.cvi.inner import profiled_objective
    from gpvi.models.classification import GPClassification
    from gpvi.models.multiclass import GPMulticlass

    gen = torch.Generator().manual_seed(13)
    X = torch.randn(50, 2, dtype=F64, generator=gen)
    y = (X[:, 0] > 0).long() + (0 if k == 1 else (X[:, 1] > 0).long())
    model = GPClassification(X, y) if k == 1 else GPMulticlass(X, y)
    eng = CVI(progress_bar=False)
    eng._configure(model)
    theta = torch.tensor([0.1, -0.2, 1.0], dtype=F64)
    shape = (50,) if k == 1 else (50, 3)
    lam1, lam2 = torch.zeros(shape, dtype=F64), torch.full(shape, -0.2, dtype=F64)
    out = {}
    for n_min in (10**9, 10):
        monkeypatch.setattr(sites, "INVERSE_MIN", n_min)
        st, val, grad = profiled_objective(eng, model, theta, lam1, lam2, collections.defaultdict(float), tol=1e-9,
                                           max_steps=200, anderson=5)
        L, _ = sites.site_factor(model.kernel_matrix(theta), -0.5 / lam2)
        out[n_min] = (st.lam1, val, grad, sites.marginals(model.kernel_matrix(theta), L, lam1 * 0 + 1.0)[1])
    a, b = out[10**9], out[10]
    torch.testing.assert_close(a[0], b[0], rtol=1e-10, atol=1e-12)
    assert a[1] == pytest.approx(b[1], rel=1e-10)
    torch.testing.assert_close(a[2], b[2], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(a[3], b[3], rtol=1e-10, atol=0)
