"""Multi-class CVI (softmax / robust-max): expectations against brute-force Monte Carlo and finite differences, the
full-batch fixed point against an independent optimiser of the same bound, Monte Carlo convergence, iris against
scikit-learn, the engine contract (seeds, interrupt/resume), device discipline and the posterior surface."""

from __future__ import annotations

import math
import time
import warnings

import numpy as np
import pytest
import torch

from gpvi.exceptions import InterruptedRunWarning
from gpvi.inference.cvi.engine import CVI
from gpvi.inference.cvi.options import MonteCarlo
from gpvi.inference.cvi.typeii import TypeII
from gpvi.models.likelihoods import BernoulliLogit, expected_log_lik
from gpvi.models.multiclass import GPMulticlass
from gpvi.models.multiclass_likelihoods import RobustMax, Softmax
from gpvi.numerics.softmax_rules import fixed_draws
from gpvi.posteriors.base import Posterior

F64 = torch.float64


def mc_data(n: int = 24, *, seed: int = 0, K: int = 3):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=F64) * 4 - 2
    F = torch.stack([torch.sin(2 * X[:, 0]), X[:, 1], -X[:, 0] - X[:, 1], X[:, 0] * X[:, 1]][:K], -1)
    y = torch.multinomial(torch.softmax(2 * F, -1), 1, generator=g)[:, 0]
    y[:K] = torch.arange(K)                          # every class present
    return X, y


def engine(**kw) -> CVI:
    kw.setdefault("progress_bar", False)
    return CVI(**kw)


def sites(seed: int, n: int = 6, K: int = 3, scale: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(n, K, generator=g, dtype=F64) * 2
    v = torch.rand(n, K, generator=g, dtype=F64) * scale + 0.05
    y = torch.randint(0, K, (n,), generator=g)
    return y, m, v


# ------------------------------------------------------------------------------------------- expectations
def test_two_class_softmax_expectation_is_the_logit_expectation_of_the_difference():
    y, m, v = sites(0, n=8, K=2, scale=30.0)
    ex = Softmax().expected_log_lik(y, m, v)
    d_m = m.gather(1, y[:, None])[:, 0] - m.gather(1, (1 - y)[:, None])[:, 0]
    ref = expected_log_lik(BernoulliLogit(), torch.ones(8, dtype=F64), d_m, v.sum(1))
    assert torch.allclose(ex.value, ref.value, rtol=0, atol=1e-13)


def test_softmax_quadrature_matches_brute_force_monte_carlo_with_a_million_draws():
    y, m, v = sites(1, n=5, K=3, scale=4.0)
    ex = Softmax().expected_log_lik(y, m, v)
    g = torch.Generator().manual_seed(7)
    eps = torch.randn(5, 10**6, 3, generator=g, dtype=F64)
    F = m[:, None] + v.sqrt()[:, None] * eps
    logp = torch.log_softmax(F, -1)
    h = logp.gather(2, y.view(5, 1, 1).expand(5, 10**6, 1))[..., 0]
    p = logp.exp()
    se = h.std(1) / 1000.0
    assert ((ex.value - h.mean(1)).abs() <= 5 * se).all()
    dm_mc = torch.nn.functional.one_hot(y, 3).to(F64) - p.mean(1)
    se_p = p.std(1) / 1000.0
    assert ((ex.dm - dm_mc).abs() <= 5 * se_p + 1e-12).all()
    assert ((ex.dv + 0.5 * (p * (1 - p)).mean(1)).abs() <= 5 * 0.5 * (p * (1 - p)).std(1) / 1000.0).all()


def test_fixed_sobol_rule_beats_a_pseudo_random_average_of_the_same_size():
    """The ``"fixed"`` rule (1024 scrambled Sobol' points, K = 6) against a million pseudo-random draws: every
    site's E_n and dE/dm within one standard error of a plain 1024-draw average (plus the reference's own 5 se)."""
    K, n = 6, 1024
    y, m, v = sites(4, n=6, K=K, scale=3.0)
    ex = Softmax().expected_log_lik(y, m, v, method="fixed", num_draws=n)
    assert torch.equal(ex.value, Softmax().expected_log_lik(y, m, v, method="fixed", num_draws=n).value)
    g = torch.Generator().manual_seed(9)
    F = m[:, None] + v.sqrt()[:, None] * torch.randn(6, 10**6, K, generator=g, dtype=F64)
    logp = torch.log_softmax(F, -1)
    h = logp.gather(2, y.view(6, 1, 1).expand(6, 10**6, 1))[..., 0]
    p = logp.exp()
    tol_h = h.std(1) * (1 / math.sqrt(n) + 5e-3)
    assert ((ex.value - h.mean(1)).abs() <= tol_h).all()
    dm_ref = torch.nn.functional.one_hot(y, K).to(F64) - p.mean(1)
    assert ((ex.dm - dm_ref).abs() <= p.std(1) * (1 / math.sqrt(n) + 5e-3) + 1e-12).all()


@pytest.mark.parametrize("method", ["fixed", "mc"])
def test_sample_averages_equal_log_softmax_on_the_same_points(method):
    """The class-major averages of ``"fixed"`` and ``"mc"`` against ``torch.log_softmax`` on the very same points
    (the same Sobol' set; the same generator stream for ``"mc"``), with sites far apart in scale (a near-certain
    class included): equal to rounding."""
    from gpvi.numerics.softmax_rules import fixed_draws

    K, n = 5, 256
    y, m, v = sites(11, n=7, K=K, scale=6.0)
    m[0, 0] += 40.0                                                     # p close to 1 at site 0
    g = torch.Generator().manual_seed(3)
    ex = Softmax().expected_log_lik(y, m, v, method=method, num_draws=n, generator=g)
    eps = (fixed_draws(n, K, m).expand(7, n, K) if method == "fixed"
           else torch.randn(7, n, K, generator=torch.Generator().manual_seed(3), dtype=F64))
    logp = torch.log_softmax(m[:, None] + v.sqrt()[:, None] * eps, -1)
    p = logp.exp()
    h = logp.gather(2, y.view(7, 1, 1).expand(7, n, 1))[..., 0].mean(1)
    onehot = torch.nn.functional.one_hot(y, K).to(F64)
    torch.testing.assert_close(ex.value, h, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ex.dm, onehot - p.mean(1), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ex.dv, -0.5 * (p * (1 - p)).mean(1), rtol=1e-10, atol=1e-15)
    assert bool((ex.dv <= 0).all())
    proba = Softmax().predict_proba(m, v, num_draws=n, max_quadrature_classes=2)
    ref = torch.softmax(m[:, None] + v.sqrt()[:, None] * fixed_draws(n, K, m), -1).mean(1)
    torch.testing.assert_close(proba, ref / ref.sum(-1, keepdim=True), rtol=1e-12, atol=1e-14)


def test_scratch_buffer_paths_equal_the_differentiable_paths():
    """Without autograd the softmax averages run in a reused scratch buffer; with it, out of place. Both give the
    same numbers, repeated calls do not alias the buffer, and autograd through the fixed rule's average gives
    Bonnet's dE/dm = e_y - mean_s p(f_s) exactly (the rule's own derivative in m)."""
    from gpvi.models.likelihoods import Quadrature
    from gpvi.numerics.softmax_rules import fixed_draws

    y, m, v = sites(5, n=9, K=3, scale=5.0)
    lik, q = Softmax(), Quadrature(20, width=6.0)
    d, w, _ = lik._reference_moments(y, m, v, q)
    fast = lik._quadrature_moments(d, w)
    slow = lik._quadrature_moments(d.clone().requires_grad_(True), w)
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b.detach(), rtol=1e-13, atol=1e-15)
    first = lik.expected_log_lik(y, m, v, quadrature=q)
    lik.expected_log_lik(*sites(6, n=9, K=3, scale=1.0), quadrature=q)      # reuses the buffer
    assert torch.equal(first.value, lik.expected_log_lik(y, m, v, quadrature=q).value)
    y, m, v = sites(8, n=5, K=6, scale=3.0)
    mg = m.clone().requires_grad_(True)
    value, Ep, Eq = Softmax._sample_moments(y, mg, v, fixed_draws(64, 6, m))
    (g,) = torch.autograd.grad(value.sum(), mg)
    ref = Softmax._sample_moments(y, m, v, fixed_draws(64, 6, m))
    torch.testing.assert_close(g, torch.nn.functional.one_hot(y, 6).to(F64) - ref[1], rtol=1e-12, atol=1e-14)
    for a, b in zip(ref, (value, Ep, Eq)):
        torch.testing.assert_close(a, b.detach(), rtol=1e-12, atol=1e-14)


def test_sample_moments_in_blocks_equal_the_differentiable_path():
    """Without autograd the softmax averages run a few sites at a time, shifted by each site's largest mean (or by
    each point's maximum when a standard deviation exceeds _SHIFT_SAFE_SD): equal to the out-of-place log_softmax
    path to 1e-12 for shared (S, K) points and per-site (N, S, K) draws, many blocks, means hundreds apart
    (saturated probabilities), a standard deviation of 40, and y=None."""
    from gpvi.models import multiclass_likelihoods as mcm

    y, m, v = sites(30, n=53, K=10, scale=3.0)
    m[:5] *= 200.0
    eps2 = fixed_draws(1024, 10, m)
    eps3 = torch.randn(53, 64, 10, generator=torch.Generator().manual_seed(1), dtype=F64)
    assert 53 > mcm._SAMPLE_BLOCK_BYTES // (10 * 1024 * 8) > 1                      # several blocks, a partial one
    for vv in (v, torch.cat([v[:1] * 0 + 1600.0, v[1:]])):
        assert (float(vv.max()) > mcm._SHIFT_SAFE_SD ** 2) is (vv is not v)
        for eps in (eps2, eps3):
            for yy in (y, None):
                fast = Softmax._sample_moments(yy, m, vv, eps)
                slow = Softmax._sample_moments(y if yy is None else yy, m.clone().requires_grad_(True), vv, eps)
                for a, b in list(zip(fast, slow))[0 if yy is not None else 1:]:
                    torch.testing.assert_close(a, b.detach(), rtol=1e-12, atol=1e-14 * max(1.0, float(b.abs().max())))
                if yy is None:
                    assert torch.equal(fast[0], torch.zeros(53, dtype=F64))


def test_robustmax_expectation_matches_brute_force_monte_carlo():
    y, m, v = sites(2, n=5, K=4, scale=2.0)
    lik = RobustMax(0.05)
    ex = lik.expected_log_lik(y, m, v)
    g = torch.Generator().manual_seed(8)
    F = m[:, None] + v.sqrt()[:, None] * torch.randn(5, 10**6, 4, generator=g, dtype=F64)
    h = lik.log_prob(y[:, None].expand(5, 10**6), F)
    # + 1e-9: a site whose class is almost never the argmax (P ~ 1e-10) has no Monte Carlo spread at all
    assert ((ex.value - h.mean(1)).abs() <= 5 * h.std(1) / 1000.0 + 1e-9).all()


@pytest.mark.parametrize("lik", [Softmax(), RobustMax(0.02)], ids=["softmax", "robustmax"])
def test_expectation_derivatives_match_central_finite_differences(lik):
    y, m, v = sites(3, n=4, K=3, scale=2.0)
    ex = lik.expected_log_lik(y, m, v)
    h = 1e-5
    for k in range(3):
        e = torch.zeros_like(m)
        e[:, k] = h
        fd_m = (lik.expected_log_lik(y, m + e, v).value - lik.expected_log_lik(y, m - e, v).value) / (2 * h)
        fd_v = (lik.expected_log_lik(y, m, v + e).value - lik.expected_log_lik(y, m, v - e).value) / (2 * h)
        assert torch.allclose(ex.dm[:, k], fd_m, rtol=0, atol=2e-7)
        assert torch.allclose(ex.dv[:, k], fd_v, rtol=0, atol=2e-7)


# ------------------------------------------------------------- the fixed point vs an independent optimiser
def _dense_elbo(model, theta, lam1, lam2, quad):
    """The class-factorised bound from the sites with dense matrices: V_k = (K^-1 + diag(-2 lam2_k))^-1."""
    K = model.kernel_matrix(theta)
    N, C = lam1.shape
    Lk = torch.linalg.cholesky(K)
    ms, vs, kl = [], [], 0.0
    for k in range(C):
        prec = torch.cholesky_inverse(Lk) + torch.diag(-2 * lam2[:, k])
        V = torch.linalg.inv(prec)
        V = 0.5 * (V + V.T)
        mk = V @ lam1[:, k]
        kl = kl + 0.5 * (torch.cholesky_solve(V, Lk).diagonal().sum() + mk @ torch.cholesky_solve(mk[:, None], Lk)[:, 0]
                         - N + 2 * torch.log(Lk.diagonal()).sum() - torch.logdet(V))
        ms.append(mk)
        vs.append(V.diagonal())
    m, v = torch.stack(ms, -1), torch.stack(vs, -1)
    ex = model.likelihood.expected_log_lik(model.y, m, v, quadrature=quad)
    return ex.value.sum() - kl, m, v


def test_full_batch_optimum_equals_scipy_lbfgs_on_the_same_bound():
    from scipy.optimize import minimize

    X, y = mc_data(10, seed=4)
    model = GPMulticlass(X, y)
    theta = model.theta.clone()
    theta[-1] = math.log(3.0)
    post = engine(tol=1e-13, num_steps=2000).run(model, init=theta)
    quad = post.quadrature
    N, C = 10, 3
    assert model.num_classes == C

    def fun(x):
        t = torch.tensor(x, dtype=F64, requires_grad=True)
        lam1, lam2 = t[:N * C].view(N, C), -torch.exp(t[N * C:].view(N, C))
        # the value's gradient through the quadrature nodes (autograd), independent of CVI's dm/dv identities
        K = model.kernel_matrix(theta)
        Lk = torch.linalg.cholesky(K)
        kl, ms, vs = 0.0, [], []
        for k in range(C):
            V = torch.linalg.inv(torch.cholesky_inverse(Lk) + torch.diag(-2 * lam2[:, k]))
            V = 0.5 * (V + V.T)
            mk = V @ lam1[:, k]
            kl = kl + 0.5 * (torch.cholesky_solve(V, Lk).diagonal().sum()
                             + mk @ torch.cholesky_solve(mk[:, None], Lk)[:, 0] - N
                             + 2 * torch.log(Lk.diagonal()).sum() - torch.logdet(V))
            ms.append(mk)
            vs.append(V.diagonal())
        d, w, _ = Softmax()._reference_moments(model.y, torch.stack(ms, -1), torch.stack(vs, -1), quad)
        value = Softmax()._quadrature_moments(d, w)[0].sum()
        obj = -(value - kl)
        (g,) = torch.autograd.grad(obj, t)
        return float(obj), g.numpy()

    x0 = np.concatenate([np.zeros(N * C), np.log(np.full(N * C, 0.1))])
    res = minimize(fun, x0, jac=True, method="L-BFGS-B", options={"maxiter": 20000, "gtol": 1e-10, "ftol": 1e-15})
    x = torch.tensor(res.x, dtype=F64)
    lam1, lam2 = x[:N * C].view(N, C), -torch.exp(x[N * C:].view(N, C))
    elbo_sp, m_sp, v_sp = _dense_elbo(model, theta, lam1, lam2, quad)
    elbo_cvi, m_cvi, v_cvi = _dense_elbo(model, theta, post.lam1, post.lam2, quad)
    assert float(elbo_cvi) == pytest.approx(post.elbo, rel=1e-10)          # site formulas = dense formulas
    assert float(elbo_sp) == pytest.approx(post.elbo, rel=1e-6)
    assert float(elbo_sp) <= post.elbo + 1e-8 * abs(post.elbo)
    assert torch.allclose(m_sp, post.m, atol=1e-4) and torch.allclose(v_sp, post.var, atol=1e-4)


# ------------------------------------------------------------------ speed: centring, monotone inner runs, inner rule
def test_center_is_the_exact_maximiser_along_the_common_mode():
    from gpvi.inference.cvi import steps as ms

    X, y = mc_data(15, seed=11)
    model = GPMulticlass(X, y)
    eng = engine()
    eng._configure(model)
    theta = model.theta
    g = torch.Generator().manual_seed(3)
    lam1 = torch.randn(15, 3, generator=g, dtype=F64)
    lam2 = -torch.rand(15, 3, generator=g, dtype=F64) - 0.05
    before, parts = ms.elbo_from_sites(eng, model, lam1, lam2, theta)
    new1, m, alpha = ms.center(lam1, lam2, parts["m"], parts["alpha"])
    after, parts2 = ms.elbo_from_sites(eng, model, new1, lam2, theta)
    # the new sites' marginals (recomputed from scratch) are the shifted ones; the class-mean is zero
    assert torch.allclose(parts2["m"], m, atol=1e-9) and torch.allclose(parts2["alpha"], alpha, atol=1e-7)
    assert torch.allclose(parts2["v"], parts["v"], rtol=0, atol=1e-12)
    assert float(m.sum(1).abs().max()) < 1e-12
    # the gain is (C/2) mbar' alpha_bar, and no shift c does better (the data term does not move)
    mbar, abar = parts["m"].mean(1), parts["alpha"].mean(0)
    assert after - before == pytest.approx(1.5 * float(mbar @ abar), rel=1e-6)
    K = model.kernel_matrix(theta)
    for scale in (0.8, 1.2):
        c = scale * mbar
        other = lam1 - torch.linalg.solve(K, c).unsqueeze(-1) + 2 * lam2 * c.unsqueeze(-1)
        assert ms.elbo_from_sites(eng, model, other, lam2, theta)[0] < after


@pytest.mark.parametrize("likelihood", ["softmax", "robustmax"])
def test_centering_changes_the_speed_not_the_fixed_point(likelihood):
    X = torch.linspace(-2, 2, 30, dtype=F64).unsqueeze(-1)
    y = (X[:, 0] > -0.7).long() + (X[:, 0] > 0.7).long()
    model = GPMulticlass(X, y, likelihood=likelihood)
    theta = model.theta.clone()
    theta[-1] = math.log(100.0)                             # a large signal variance: the common mode is slow
    fast = engine(tol=1e-12, num_steps=400).run(model, init=theta)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        slow = engine(tol=1e-12, num_steps=400, center=False).run(model, init=theta)
    # measured: 52 (softmax) and 68 (robust-max) steps; plain CVI 811 and > 3000 (robust-max stalls 7e-4 below)
    assert fast.converged and fast.info["steps"] < 100 and fast.info["center"]
    assert not slow.converged
    assert slow.elbo < fast.elbo
    # the centred fixed point is the optimum: plain CVI started there stays there
    stay = engine(tol=1e-12, num_steps=50, center=False).run(model, init=fast)
    assert stay.elbo == pytest.approx(fast.elbo, rel=1e-10, abs=0) and stay.info["steps"] <= 5
    # the optimum has sum_k m_k = 0 (the last site update follows the last centring: zero to the sites' accuracy)
    assert float(fast.m.sum(1).abs().max()) < 1e-6 * float(fast.m.abs().max()) + 1e-5


def test_inner_quadrature_is_accurate_against_the_fine_rule():
    from gpvi.inference.cvi.typeii import inner_quadrature
    from gpvi.models.likelihoods import Quadrature

    g = torch.Generator().manual_seed(12)
    n = 150
    m = torch.randn(n, 3, generator=g, dtype=F64) * 4
    v = torch.exp(torch.rand(n, 3, generator=g, dtype=F64) * math.log(100.0)) * 0.1      # 0.1 .. 10
    y = torch.randint(0, 3, (n,), generator=g)
    lik = Softmax()
    ref = lik.expected_log_lik(y, m, v, quadrature=Quadrature(160, width=8.5))
    fine = lik.expected_log_lik(y, m, v)
    fast = lik.expected_log_lik(y, m, v, quadrature=inner_quadrature(3))
    # the documented accuracies (means of sd 4, variances 0.1..10; measured: fine 1.4e-6, 1.6e-5, 4.9e-6,
    # inner 2.0e-4, 8.1e-4, 5.6e-5 in E, dE/dm, dE/dv)
    for a, tol_fine, tol_fast in (("value", 3e-6, 4e-4), ("dm", 3e-5, 1.6e-3), ("dv", 1e-5, 1.2e-4)):
        assert float((getattr(fine, a) - getattr(ref, a)).abs().max()) < tol_fine
        assert float((getattr(fast, a) - getattr(ref, a)).abs().max()) < tol_fast
    assert inner_quadrature(3).num_points ** 2 < 0.5 * Quadrature(40).num_points ** 2


def test_map_ii_inner_rule_and_monotone_inner_runs_keep_the_optimum():
    X, y = mc_data(30, seed=13)
    model = GPMulticlass(X, y)
    fast = TypeII(engine()).run(model)
    fine = TypeII(engine(), inner_quadrature=None).run(model)
    assert fast.info["type_ii"]["inner_quadrature"] == "auto" and fine.info["type_ii"]["inner_quadrature"] is None
    assert fast.info["objective"] == pytest.approx(fine.info["objective"], abs=1e-5)
    assert torch.allclose(fast.theta, fine.theta, atol=1e-2)
    # an independent check of the optimum: the profiled objective (fine rule, tight CVI) is not higher nearby
    from gpvi.models.priors import default_prior, prior_log_prob

    eng, prior = engine(tol=1e-12, num_steps=2000), default_prior(model.dim)
    for j in range(model.dim):
        for h in (-0.05, 0.05):
            th = fine.theta.clone()
            th[j] += h
            obj = eng.run(model, init=th).elbo + float(prior_log_prob(prior, th))
            assert obj <= fine.info["objective"] + 1e-7


def test_coarse_first_phase_keeps_the_optimum_with_fewer_inner_steps():
    """The coarse first phase (loose inner runs far from the optimum) ends at the optimum of the loop without it."""
    X, y = mc_data(30, seed=13)
    model = GPMulticlass(X, y)
    coarse = TypeII(engine()).run(model)
    tight = TypeII(engine(), coarse=False).run(model)
    assert coarse.info["type_ii"]["coarse"]["inner_tol"] == 1e-6 and tight.info["type_ii"]["coarse"] is None
    assert coarse.info["objective"] == pytest.approx(tight.info["objective"], abs=1e-6)
    assert torch.allclose(coarse.theta, tight.theta, atol=1e-2)
    assert coarse.info["inner_steps"] < tight.info["inner_steps"]
    with pytest.raises(TypeError, match="coarse"):
        TypeII(engine(), coarse="yes")


def test_isotropic_start_ignores_constant_columns():
    """A shared lengthscale starts at lengthscale^2 = the sum of the non-constant columns' variances."""
    import gpytorch

    X, y = mc_data(30, seed=13)
    Xc = torch.cat([X, torch.full((30, 3), 5.0, dtype=F64)], 1)
    k = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
    th = GPMulticlass(Xc, y, kernel=k).initial_theta()
    assert float(th[0]) == pytest.approx(math.log(float(X.var(0, unbiased=False).sum())), abs=1e-12)
    ard = GPMulticlass(X, y).initial_theta()              # the ARD start: d var(x_j) per column, unchanged
    assert torch.allclose(ard[:2], torch.log(2 * X.var(0, unbiased=False)))


# -------------------------------------------------------------------------------- Monte Carlo converges
def test_monte_carlo_run_converges_to_the_quadrature_bound():
    X, y = mc_data(20, seed=5)
    model = GPMulticlass(X, y)
    exact = engine(tol=1e-12, num_steps=2000).run(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        noisy = engine(estimator=MonteCarlo(num_draws=10), num_steps=400, tol=0, seed=3).run(model)
        const = engine(estimator=MonteCarlo(num_draws=10), num_steps=400, tol=0, seed=3,
                       beta_schedule="constant").run(model)
    assert noisy.info["beta_schedule"] == "robbins_monro"
    gap = abs(noisy.elbo - exact.elbo) / abs(exact.elbo)
    assert noisy.elbo <= exact.elbo + 1e-9 * abs(exact.elbo)
    assert gap < 1e-3
    # the decreasing step is what settles it: the constant step stays further away
    assert abs(const.elbo - exact.elbo) > abs(noisy.elbo - exact.elbo)


# -------------------------------------------------------------------------------- the engine contract
def _stop_at(k):
    def cb(state, info):
        if state.t == k:
            raise KeyboardInterrupt
    return cb


def test_seeded_runs_repeat_and_interrupt_then_resume_equals_the_uninterrupted_run(tmp_path):
    X, y = mc_data(18, seed=6)
    model = GPMulticlass(X, y)
    kw = dict(estimator="mc", num_steps=40, tol=0, seed=11)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    a = engine(**kw).run(model)
    assert torch.equal(torch.get_rng_state(), before)              # no global RNG use
    b = engine(**kw).run(model)
    c = engine(**{**kw, "seed": 12}).run(model)
    assert torch.equal(a.lam1, b.lam1) and torch.equal(a.lam2, b.lam2) and a.elbo == b.elbo
    assert not torch.equal(a.lam1, c.lam1)
    with pytest.warns(InterruptedRunWarning):
        part = engine(**kw).run(model, callback=_stop_at(17))
    assert part.info["interrupted"] and part.engine_state.t == 17
    torch.save(part.engine_state.state_dict(), tmp_path / "st.pt")
    resumed = engine(**kw).run(model, state=torch.load(tmp_path / "st.pt", weights_only=True))
    assert torch.equal(resumed.lam1, a.lam1) and torch.equal(resumed.lam2, a.lam2) and resumed.elbo == a.elbo
    assert part.engine_state.t == 17                                # the state handed in did not change
    eng = engine(**kw)
    eng.progress_bar = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on = eng.run(model)
    assert torch.equal(on.lam1, a.lam1)


def test_engines_create_no_tensor_on_the_default_device():
    X, y = mc_data(12, seed=7)
    model = GPMulticlass(X, y)                    # models are built on the CPU (GPyTorch's kernels included)
    robust = GPMulticlass(X, y, likelihood=RobustMax())

    def fit():
        post = engine(num_steps=5, tol=0).run(model)
        mc = engine(estimator="mc", num_steps=3, tol=0).run(model)
        rm = engine(num_steps=3, tol=0).run(robust)
        return [post.m, post.predict_proba(X[:3]), mc.m, rm.m, rm.predict_proba(X[:3])]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = fit()
        torch.set_default_device("meta")
        try:
            got = fit()
        finally:
            torch.set_default_device(None)
    for a, b in zip(want, got):
        assert b.device.type == "cpu" and torch.equal(a, b)


# -------------------------------------------------------------------------------- posterior surface
def test_posterior_predictions_surface_and_round_trip():
    X, y = mc_data(20, seed=8)
    labels = np.array(["cat", "dog", "emu"])[y.numpy()]
    model = GPMulticlass(X, labels)
    post = engine().run(model)
    assert post.converged and post.m.shape == (20, 3) and post.mean.shape == (60,)
    mean, var = post.predict_latent(X)
    assert torch.allclose(mean, post.m, atol=1e-9) and torch.allclose(var, post.var, atol=1e-9)
    p = post.predict_proba(X[:5])
    assert p.shape == (5, 3) and torch.allclose(p.sum(-1), torch.ones(5, dtype=F64), atol=1e-12)
    assert set(post.predict(X[:5]).labels.tolist()) <= {"cat", "dog", "emu"}
    draws = post.sample(4000, seed=0)
    assert draws.shape == (4000, 60)
    assert torch.allclose(draws.mean(0), post.mean, atol=5 * float(post.std.max()) / math.sqrt(4000))
    assert len(post.summary().index) == 60 and post.hyperparameters().keys() == model.describe().keys()
    back = Posterior.from_state_dict(post.state_dict(), target=model)
    assert torch.equal(back.lam1, post.lam1) and back.elbo == post.elbo
    assert torch.allclose(back.predict_proba(X[:5]), p, atol=1e-12)
    warm = engine().run(model, init=post)                          # a warm start at the optimum stays there
    assert warm.info["steps"] <= 3 and warm.elbo == pytest.approx(post.elbo, rel=1e-8)
    assert warm.elbo >= post.elbo - 1e-12 * abs(post.elbo)


def test_type_ii_with_the_default_prior_increases_the_objective():
    X, y = mc_data(24, seed=9)
    model = GPMulticlass(X, y)
    fixed = engine().run(model)
    learned = TypeII(engine()).run(model)
    none = TypeII(engine(), prior=None).run(model)
    assert learned.info["objective"] > fixed.elbo + learned.info["log_prior"] - 1e-6
    assert none.elbo >= fixed.elbo and none.info["log_prior"] == 0.0
    assert learned.info["theta_phases"] >= 1 and learned.info["learn_hyperparameters"]


def test_bad_input_gives_clear_errors():
    X, y = mc_data(10, seed=10)
    with pytest.raises(ValueError, match="single class"):
        GPMulticlass(X, torch.zeros(10))
    with pytest.raises(ValueError, match="y"):
        GPMulticlass(X, torch.zeros(9))
    with pytest.raises(ValueError, match="likelihood"):
        GPMulticlass(X, y, likelihood="logit")
    with pytest.raises(ValueError, match="estimator"):
        engine(estimator="mc").run(GPMulticlass(X, y, likelihood=RobustMax()))
    with pytest.raises(ValueError, match="max_quadrature_classes"):
        engine(estimator="quadrature", max_quadrature_classes=2).run(GPMulticlass(X, y))
    with pytest.raises(ValueError, match="epsilon"):
        RobustMax(1.5)
    with pytest.raises(TypeError, match="GPMulticlass"):
        engine().run(object())


# -------------------------------------------------------------------------------- iris vs scikit-learn
def _iris():
    from sklearn.datasets import load_iris
    from sklearn.model_selection import train_test_split

    d = load_iris()
    return train_test_split(d.data, d.target, test_size=0.3, random_state=0, stratify=d.target)


def _compare(post, Xte, yte, Xtr, ytr, fit_s, what):
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.metrics import log_loss

    p = post.predict_proba(Xte).numpy()
    t0 = time.perf_counter()
    sk = GaussianProcessClassifier(random_state=0).fit(Xtr, ytr)
    sk_s = time.perf_counter() - t0
    p_sk = sk.predict_proba(Xte)
    acc, acc_sk = (p.argmax(1) == yte).mean(), (p_sk.argmax(1) == yte).mean()
    ll, ll_sk = log_loss(yte, p), log_loss(yte, p_sk)
    print(f"iris ({what}): gpvi acc {acc:.3f} log loss {ll:.4f} fit {fit_s:.2f} s; scikit-learn GPC acc {acc_sk:.3f} "
          f"log loss {ll_sk:.4f} fit {sk_s:.2f} s")
    return acc, acc_sk, ll, ll_sk


def test_iris_at_the_data_scaled_start_is_sane_against_scikit_learn():
    """CVI at the model's data-scaled theta (no hyperparameter learning): a sanity check of predictions."""
    Xtr, Xte, ytr, yte = _iris()
    t0 = time.perf_counter()
    post = engine().run(GPMulticlass(Xtr, ytr))
    acc, acc_sk, ll, ll_sk = _compare(post, Xte, yte, Xtr, ytr, time.perf_counter() - t0, "fixed theta")
    assert post.converged and acc >= 0.9 and acc >= acc_sk - 0.05
    assert ll <= 0.5


@pytest.mark.slow
def test_iris_map_ii_accuracy_and_log_loss_are_sane_against_scikit_learn():
    Xtr, Xte, ytr, yte = _iris()
    t0 = time.perf_counter()
    post = TypeII(engine(), inner_tol=1e-7).run(GPMulticlass(Xtr, ytr))
    acc, acc_sk, ll, ll_sk = _compare(post, Xte, yte, Xtr, ytr, time.perf_counter() - t0, "MAP-II")
    assert acc >= 0.9 and acc >= acc_sk - 0.05
    assert ll <= 0.3 and ll <= ll_sk + 0.05


def _iris_split():
    """The iris split of benchmarks/multiclass.py (stratified 70/30, seed 0, standardised): at its MAP-II theta the
    plain damped CVI map with beta >= 0.8 settles on a 2-cycle."""
    from sklearn.datasets import load_iris
    from sklearn.model_selection import train_test_split

    X, y = load_iris(return_X_y=True)
    Xtr, _, ytr, _ = train_test_split(X, y, test_size=0.3, stratify=y, random_state=0)
    return torch.as_tensor((Xtr - Xtr.mean(0)) / Xtr.std(0)), torch.as_tensor(ytr)


CYCLE_THETA = [3.49, 3.09, 0.28, 0.16, 3.0]


@pytest.mark.parametrize("beta", [0.8, 1.0])
def test_full_batch_cvi_stays_elbo_monotone_where_the_damped_map_cycles(beta):
    """Before 2026-11-25 these runs cycled for 1,000 steps (ELBO -24.6 at beta 0.8, -40,328 at beta 1) and returned
    that state; now a step that lowers the ELBO is undone and the step halved, and the run reaches the fixed point
    of the beta = 0.5 run (ELBO -22.88687) with the accepted ELBOs non-decreasing."""
    model = GPMulticlass(*_iris_split())
    th = torch.tensor(CYCLE_THETA, dtype=F64)
    ref = engine(tol=1e-11).run(model, th)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                       # no ConvergenceWarning
        post = engine(beta=beta, tol=1e-11, num_steps=400).run(model, th)
    assert post.converged and post.info["backtracks"] > 0
    assert abs(post.elbo - ref.elbo) <= 1e-7 * abs(ref.elbo)
    assert float((post.m - ref.m).abs().max()) <= 1e-4
    trace = np.asarray(post.trace["elbo"])
    assert (np.diff(trace) >= -1e-11 * np.abs(trace[1:])).all()
    assert ref.info["backtracks"] == 0                   # the default step never needed it here


def test_monotone_run_resumes_bit_for_bit_across_a_backtrack():
    """The accepted sites, their bound and the redo flag are part of the state: a run split after backtracks
    resumes to the same sites as the run in one go."""
    model = GPMulticlass(*_iris_split())
    th = torch.tensor(CYCLE_THETA, dtype=F64)
    whole = engine(beta=1.0, tol=0, num_steps=60).run(model, th)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        part = engine(beta=1.0, tol=0, num_steps=31).run(model, th)
    assert part.info["backtracks"] > 0
    es = part.engine_state
    state = type(es).from_state_dict(es.state_dict())
    assert state.kept_lam1 is not None and math.isfinite(state.elbo)
    resumed = engine(beta=1.0, tol=0, num_steps=60).run(model, state=state)
    assert torch.equal(resumed.lam1, whole.lam1) and torch.equal(resumed.lam2, whole.lam2)
    assert resumed.info["backtracks"] == whole.info["backtracks"]


def test_map_ii_with_a_large_step_reaches_the_default_optimum():
    """MAP-II with beta = 1 returned an objective of -46,188 on the iris split (its CVI run between phases
    cycled); it now reaches the beta = 0.5 optimum."""
    model = GPMulticlass(*_iris_split())
    ref = TypeII(engine()).run(model)
    post = TypeII(engine(beta=1.0)).run(model)
    assert post.converged
    assert abs(post.info["objective"] - ref.info["objective"]) <= 1e-6 * abs(ref.info["objective"])
    assert float((post.theta - ref.theta).abs().max()) <= 1e-2


def test_anderson_solves_a_linear_fixed_point_that_plain_iteration_crawls_on():
    """Anderson acceleration (memory m) of x -> A x + b is exact after m + 1 steps for a linear map of dimension
    <= m (a Krylov method); the plain iteration with spectral radius 0.95 is still 0.1 away after 40."""
    from gpvi.numerics.anderson import Anderson

    g = torch.Generator().manual_seed(0)
    Q, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=F64))
    A = Q @ torch.diag(torch.tensor([0.95, -0.9, 0.5, 0.1], dtype=F64)) @ Q.T
    b = torch.randn(4, generator=g, dtype=F64)
    star = torch.linalg.solve(torch.eye(4, dtype=F64) - A, b)
    acc, x, plain = Anderson(4), torch.zeros(4, dtype=F64), torch.zeros(4, dtype=F64)
    for _ in range(6):
        x = acc.step(x, A @ x + b)
    for _ in range(40):
        plain = A @ plain + b
    assert float((x - star).abs().max()) < 1e-8 * float(star.abs().max())
    assert float((plain - star).abs().max()) > 1e-2 * float(star.abs().max())
    acc.clear()
    assert torch.equal(acc.step(x, A @ x + b), A @ x + b)          # an empty history: the plain step
    with pytest.raises(ValueError, match="memory"):
        Anderson(-1)


def _inner_start():
    """Sites converged at a coarse theta on the iris split, and the theta of the next L-BFGS-B trial point (the
    largest move of the benchmark's coarse phase)."""
    from gpvi.inference.cvi.inner import converge_sites

    model = GPMulticlass(*_iris_split())
    eng = TypeII(engine())._inner_engine(model)
    th0 = torch.tensor([1.421, 1.507, 1.123, 0.996, 0.874], dtype=F64)
    N = model.num_data
    st = converge_sites(eng, model, th0, torch.zeros(N, 3, dtype=F64), torch.full((N, 3), -0.5, dtype=F64),
                        _counters(), tol=1e-12, max_steps=500)
    return model, eng, st, torch.tensor([2.146, 2.264, 0.258, -0.641, 2.817], dtype=F64)


def _counters() -> dict:
    import collections

    return collections.defaultdict(float)


def test_accelerated_inner_runs_reach_the_plain_runs_fixed_point_in_fewer_steps():
    """converge_sites with Anderson acceleration: the same fixed point as the plain damped run (bound within 1e-9
    relative, latent means within 1e-4), in fewer steps; the accepted bounds never go down (a plain run's bound is
    a lower bound on the accelerated run's at every tolerance)."""
    from gpvi.inference.cvi import steps as ms
    from gpvi.inference.cvi.inner import converge_sites

    model, eng, st, th = _inner_start()
    runs = {}
    for mem in (0, 5):
        c = _counters()
        runs[mem] = converge_sites(eng, model, th, st.lam1, st.lam2, c, tol=1e-10, max_steps=500, anderson=mem), c
    (plain, _), (fast, cf) = runs[0], runs[5]
    e0, p0 = ms.elbo_from_sites(eng, model, plain.lam1, plain.lam2, th)
    e5, p5 = ms.elbo_from_sites(eng, model, fast.lam1, fast.lam2, th)
    assert abs(e5 - e0) <= 1e-9 * abs(e0)
    assert float((p5["m"] - p0["m"]).abs().max()) <= 1e-4
    assert fast.t < 0.7 * plain.t, (fast.t, plain.t)
    assert cf.get("inner_backtracks", 0) == 0
    from gpvi.inference.cvi import TypeII

    for cls in (TypeII, TypeII):
        with pytest.raises(ValueError, match="anderson"):
            cls(anderson=-1)
        with pytest.raises(TypeError, match="anderson"):
            cls(anderson=2.5)


def test_a_rejected_extrapolation_falls_back_to_the_plain_step(monkeypatch):
    """An extrapolation that lowers the bound (here every one overshoots tenfold) is replaced by the plain damped
    step from the accepted sites: counted, no step halved, and the run still ends at the fixed point."""
    from gpvi.numerics import anderson
    from gpvi.inference.cvi import steps as ms
    from gpvi.inference.cvi.inner import converge_sites

    model, eng, st, th = _inner_start()
    monkeypatch.setattr(anderson.Anderson, "step", lambda self, x, g: (self.r.append(g - x), x + 10.0 * (g - x))[1])
    c = _counters()
    out = converge_sites(eng, model, th, st.lam1, st.lam2, c, tol=1e-10, max_steps=500, anderson=5)
    ref = converge_sites(eng, model, th, st.lam1, st.lam2, _counters(), tol=1e-10, max_steps=500)
    assert c["inner_extrapolations_rejected"] > 0 and c.get("inner_backtracks", 0) == 0
    e, _ = ms.elbo_from_sites(eng, model, out.lam1, out.lam2, th)
    e_ref, _ = ms.elbo_from_sites(eng, model, ref.lam1, ref.lam2, th)
    assert abs(e - e_ref) <= 1e-9 * abs(e_ref)


def test_theta_gradient_closed_form_matches_central_differences_at_any_sites():
    """multiclass_sites.theta_objective's gradient (the binary closed form summed over the classes, plus the
    prior's) against central differences of its own value, at sites that are not a fixed point (so the envelope
    theorem plays no part) and an ARD theta away from the optimum."""
    from gpvi.inference.cvi import inner as inner_mod
    from gpvi.models.priors import check_prior

    model, _, st, th = _inner_start()
    eng = engine()
    eng._configure(model)                     # the engine's 1600-node rule: its derivatives are the value's to 1e-7
    prior = check_prior(None, model.dim)
    val, grad = inner_mod.theta_objective(eng, model, st.lam1, st.lam2, th, prior)
    h = 1e-5
    fd = torch.tensor([(inner_mod.theta_objective(eng, model, st.lam1, st.lam2, th + h * e, prior)[0]
                        - inner_mod.theta_objective(eng, model, st.lam1, st.lam2, th - h * e, prior)[0]) / (2 * h)
                       for e in torch.eye(model.dim, dtype=F64)], dtype=F64)
    torch.testing.assert_close(grad, fd, rtol=1e-6, atol=1e-6)
    assert float(grad.abs().max()) > 1.0                             # far from stationary: a real check


def test_profiled_objective_reuses_the_best_evaluated_step_exactly():
    """profiled_objective returns the value and gradient of the best sites its run evaluated, from that step's own
    factors and expectations: the same numbers as theta_objective recomputing them from those sites (centred, as
    evaluated) to 1e-12, one factorisation and one set of expectations fewer per evaluation; within the run's tol of
    the value at the sites it ended at, and its gradient that of the profiled bound (central differences of the
    tightly converged objective)."""
    from gpvi.inference.cvi import inner as inner_mod
    from gpvi.inference.cvi.inner import converge_sites, profiled_objective
    from gpvi.models.multiclass_likelihoods import Softmax
    from gpvi.models.priors import check_prior

    model, eng, st, th = _inner_start()
    prior = check_prior(None, model.dim)
    calls = {"n": 0}
    orig = Softmax.expected_log_lik

    def counted(self, *a, **k):
        calls["n"] += 1
        return orig(self, *a, **k)

    best: dict = {}
    c = _counters()
    inner = converge_sites(eng, model, th, st.lam1, st.lam2, c, tol=1e-10, max_steps=500, anderson=5, best=best)
    Softmax.expected_log_lik = counted
    try:
        c2 = _counters()
        inner2, val, grad = profiled_objective(eng, model, th, st.lam1, st.lam2, c2, tol=1e-10, max_steps=500,
                                               anderson=5, prior=prior)
    finally:
        Softmax.expected_log_lik = orig
    assert calls["n"] == inner2.t                                   # one set of expectations per step, none after
    assert torch.equal(inner2.lam1, inner.lam1) and torch.equal(inner2.lam2, inner.lam2)
    ref_val, ref_grad = inner_mod.theta_objective(eng, model, best["lam1"], best["lam2"], th, prior)
    assert val == pytest.approx(ref_val, rel=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-10)
    end_val, end_grad = inner_mod.theta_objective(eng, model, inner.lam1, inner.lam2, th, prior)
    assert abs(val - end_val) <= 1e-9 * abs(end_val)
    torch.testing.assert_close(grad, end_grad, rtol=1e-4, atol=1e-4)
    h = 1e-4

    def f(t):
        return profiled_objective(eng, model, t, inner.lam1, inner.lam2, _counters(), tol=1e-13, max_steps=500,
                                  anderson=5, prior=prior)[1]

    fd = torch.tensor([(f(th + h * e) - f(th - h * e)) / (2 * h) for e in torch.eye(model.dim, dtype=F64)],
                      dtype=F64)
    torch.testing.assert_close(grad, fd, rtol=1e-3, atol=1e-3)       # 4e-4 off: the inner rule's own error
    assert float(grad.abs().max()) > 0.5


def test_secant_step_is_the_newton_step_on_a_quadratic():
    """secant_step from the two best points of a concave quadratic: with Hessian -a I the step theta + gamma g
    lands on the maximum (gamma = 1/a); with a general Hessian it is s'As / s'A^2 s; None without curvature of a
    maximum or with fewer than two finite points."""
    from gpvi.inference.cvi.typeii import secant_step

    A = torch.tensor([[2.0, 0.3], [0.3, 0.5]], dtype=F64)
    opt = torch.tensor([0.4, -1.0], dtype=F64)

    def point(th, H):
        th = torch.as_tensor(th, dtype=F64)
        return float(-0.5 * (th - opt) @ H @ (th - opt)), th, -H @ (th - opt)

    iso = 3.0 * torch.eye(2, dtype=F64)
    pts = [point([1.0, 1.0], iso), point([0.5, -0.5], iso), point([3.0, 4.0], iso)]
    gamma = secant_step(pts)
    assert gamma == pytest.approx(1.0 / 3.0, rel=1e-12)
    _, th, g = pts[1]
    torch.testing.assert_close(th + gamma * g, opt)
    pts = [point([1.0, 1.0], A), point([0.5, -0.5], A)]
    s = pts[0][1] - pts[1][1]
    assert secant_step(pts) == pytest.approx(float(s @ A @ s) / float(s @ A @ A @ s), rel=1e-12)
    assert secant_step([point([1.0, 1.0], -A), point([0.5, -0.5], -A)]) is None        # a minimum
    assert secant_step([pts[0], (-math.inf, pts[1][1], pts[1][2])]) is None


def test_two_level_moments_equal_the_nested_grid_of_the_same_rule():
    """two_level_moments (K <= 3, level-by-level logistic factorisation) against nested_nodes' full Q^2 grid with
    _quadrature_moments, on the same rule: ordinary sites, means in the hundreds (saturated probabilities), a zero
    variance (a point mass), K = 2 and 3; equal to 1e-12 relative; differentiable (autograd through it gives the
    same gradient of E as through the grid)."""
    from gpvi.models.likelihoods import Quadrature
    from gpvi.numerics.softmax_rules import nested_nodes, two_level_moments

    lik = Softmax()
    for K, mscale, q in [(3, 1.0, Quadrature(28, width=6.0)), (3, 60.0, Quadrature(40, width=6.5)),
                         (2, 1.0, Quadrature(96)), (2, 100.0, Quadrature(96))]:
        y, m, v = sites(11, n=40, K=K, scale=10.0)
        m = m * mscale
        v[0] = 0.0
        v[1, 0] = 0.0
        mu, Lc, _ = lik._differences(y, m, v)
        fast = two_level_moments(mu, Lc, q)
        grid = lik._quadrature_moments(*nested_nodes(mu, Lc, q))
        for a, b in zip(fast, grid):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13 * max(1.0, float(b.abs().max())))
        assert bool((fast[2] >= 0).all()) and bool((fast[1] >= 0).all())
    y, m, v = sites(12, n=10, K=3, scale=4.0)
    q = Quadrature(20, width=6.0)
    grads = []
    for fn in (lambda mu, Lc: two_level_moments(mu, Lc, q), lambda mu, Lc: lik._quadrature_moments(
            *nested_nodes(mu, Lc, q))):
        mg = m.clone().requires_grad_(True)
        mu, Lc, _ = lik._differences(y, mg, v)
        (g,) = torch.autograd.grad(fn(mu, Lc)[0].sum(), mg)
        grads.append(g)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-12)


def test_two_level_moments_in_place_path_equals_the_differentiable_one():
    """Without autograd, K = 3 sums the second level in the reused scratch buffer (nodes_into, logistic parts from
    one exponential); with autograd it takes the out-of-place path. Both are the same rule: equal to 1e-13 on
    ordinary sites, saturated ones (means in the hundreds) and tiny variances, and to the nested grid to 1e-12;
    a zero variance (degenerate window) falls back to the out-of-place path with the same result."""
    from gpvi.models.likelihoods import Quadrature
    from gpvi.numerics.softmax_rules import nested_nodes, two_level_moments

    lik = Softmax()
    q = Quadrature(28, width=6.5)
    for mscale, vscale in [(1.0, 10.0), (80.0, 3.0), (1.0, 1e-6)]:
        y, m, v = sites(21, n=60, K=3, scale=vscale)
        mu, Lc, _ = lik._differences(y, m * mscale, v)
        fast = two_level_moments(mu, Lc, q)
        slow = two_level_moments(mu.clone().requires_grad_(True), Lc, q)
        grid = lik._quadrature_moments(*nested_nodes(mu, Lc, q))
        for a, b, c in zip(fast, slow, grid):
            scale = max(1.0, float(c.abs().max()))
            torch.testing.assert_close(a, b.detach(), rtol=1e-13, atol=1e-14 * scale)
            torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-13 * scale)
    Lc = Lc.clone()
    Lc[0] = 0.0
    torch.testing.assert_close(two_level_moments(mu, Lc, q)[1],
                               two_level_moments(mu.clone().requires_grad_(True), Lc, q)[1].detach(),
                               rtol=1e-13, atol=1e-15)
