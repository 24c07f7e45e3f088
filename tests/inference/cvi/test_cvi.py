"""CVI for latent GP models: conjugacy, full vs single-site fixed point, the cached factor (updated in place), an
independent optimiser (GPyTorch), ELBO ascent, the type-II loop and its gradients, faults, interruption/resume,
the latent posterior's common surface and bad input."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import warnings

import pytest
import gpytorch
import torch

import gpvi
from tests.conftest import make_gp_data
from gpvi.models.classification import GPClassification, LatentGP
from gpvi.inference.cvi import CVI, CVIState, MonteCarlo, SingleSite, TypeII, num_steps_for_sweeps
from gpvi.inference.cvi.inner import theta_objective
from gpvi.inference.cvi.typeii import COARSE
from gpvi.numerics.sites import site_elbo
from gpvi.posteriors import LatentPosterior
from gpvi.inference.contract import FaultPolicy
from gpvi.exceptions import InterruptedRunWarning, NotPSDError, NumericalFaultError, NumericalWarning
from gpvi.models.likelihoods import BernoulliLogit, Gaussian, expected_log_lik
from gpvi.linalg import cholesky_site_update_, cholesky_update
from gpvi.models.regression import GPRegression
from gpvi.posteriors.base import Posterior

F64 = torch.float64


def clf_data(n: int = 60, d: int = 2, *, seed: int = 0):
    """Small synthetic binary data with a smooth decision boundary (labels in {0, 1})."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand((n, d), generator=g, dtype=F64) * 4 - 2
    f = torch.sin(2 * X[:, 0]) + (X[:, 1] if d > 1 else 0.0)
    y = (torch.rand(n, generator=g, dtype=F64) < torch.sigmoid(3 * f)).to(F64)
    return X, y


def engine(**kw) -> CVI:
    kw.setdefault("progress_bar", False)
    return CVI(**kw)


def sweeps(k: int, n: int, batch_size: int = 1) -> int:
    """Steps of k sweeps of a stochastic run over n sites."""
    return num_steps_for_sweeps(k, n, mode="stochastic", batch_size=batch_size)


def dense_elbo(model: LatentGP, theta: torch.Tensor, m: torch.Tensor, V: torch.Tensor) -> float:
    """ELBO of a general Gaussian q = N(m, V) with dense matrices (independent of the site formulas)."""
    K = model.kernel_matrix(theta)
    n = K.shape[0]
    E = expected_log_lik(model.likelihood, model.y, m, V.diagonal()).value.sum()
    Lk = torch.linalg.cholesky(K)
    Lv = torch.linalg.cholesky(V)
    Kinv_V = torch.cholesky_solve(V, Lk)
    kl = 0.5 * (Kinv_V.diagonal().sum() + m @ torch.cholesky_solve(m.unsqueeze(-1), Lk).squeeze(-1) - n
                + 2 * torch.log(Lk.diagonal()).sum() - 2 * torch.log(Lv.diagonal()).sum())
    return float(E - kl)


def site_covariance(model: LatentGP, theta: torch.Tensor, lam1: torch.Tensor, lam2: torch.Tensor):
    """Dense m and V of q from the sites: V = (K^-1 + diag(-2 lam2))^-1, m = V lam1."""
    K = model.kernel_matrix(theta)
    W = -2 * lam2
    Ws = torch.sqrt(W)
    B = torch.eye(K.shape[0], dtype=F64) + Ws[:, None] * K * Ws[None, :]
    V = K - (K * Ws[None, :]) @ torch.linalg.solve(B, Ws[:, None] * K)
    V = 0.5 * (V + V.T)
    return V @ lam1, V


# ----------------------------------------------------------------------------------------------- (1) conjugacy
def test_one_beta_one_step_with_gaussian_likelihood_is_exact_gp_regression():
    X, y = make_gp_data(n=40, d=2, seed=0)
    noise = 0.05
    model = LatentGP(X, y, likelihood=Gaussian(noise))
    theta = torch.tensor([0.3, -0.5, 0.2], dtype=F64)
    reg = GPRegression(X, y, mean=gpytorch.means.ZeroMean())          # the latent GP's zero mean, y as given
    theta_reg = torch.cat([theta, torch.tensor([math.log(noise)], dtype=F64)])
    mean_ref, var_ref = reg.predict(theta_reg, X, include_noise=False)
    # before the step q is the prior: far from the regression posterior (the check below is not vacuous)
    prior = engine(mode="full", beta=1.0, num_steps=1, tol=0).initial_state(model, theta)
    assert float((torch.zeros(40, dtype=F64) - mean_ref).abs().max()) > 0.1
    post = engine(mode="full", beta=1.0, num_steps=1, tol=0).run(model, state=prior)
    assert torch.allclose(post.m, mean_ref, rtol=0, atol=1e-10)
    assert torch.allclose(post.var, var_ref, rtol=0, atol=1e-10)
    assert torch.allclose(post.lam1, y / noise, rtol=1e-14) and torch.allclose(post.lam2, torch.full_like(y, -0.5 / noise))
    # at the exact posterior KL(q || p(f | y)) = 0, so the ELBO is the log marginal likelihood
    assert post.elbo == pytest.approx(float(reg.log_marginal_likelihood(theta_reg)), rel=1e-10)
    # the stochastic engine's first step (full, from the prior) is the same step
    post_s = engine(mode="stochastic", beta=1.0, num_steps=1, tol=0).run(model, init=theta)
    assert torch.allclose(post_s.m, mean_ref, rtol=0, atol=1e-10)


def test_site_elbo_matches_the_dense_gaussian_elbo():
    X, y = clf_data(30)
    model = GPClassification(X, y)
    post = engine(mode="full", num_steps=5, tol=0).run(model)
    m, V = site_covariance(model, post.theta, post.lam1, post.lam2)
    assert torch.allclose(post.m, m, atol=1e-10) and torch.allclose(post.var, V.diagonal(), atol=1e-10)
    assert post.elbo == pytest.approx(dense_elbo(model, post.theta, m, V), rel=1e-8)   # float64 reference: cond(K) ~ 1e9
    assert post.elbo == pytest.approx(_dense_elbo_mp(model, post.theta, post.lam1, post.lam2), rel=1e-12)


def _dense_elbo_mp(model, theta, lam1, lam2) -> float:
    """The same dense ELBO with the sites' V, m and the KL in 40-digit arithmetic (mpmath), so that the reference
    is not limited by K's condition number."""
    import mpmath as mp

    mp.mp.dps = 40
    K = mp.matrix(model.kernel_matrix(theta).tolist())
    n = K.rows
    V = (K ** -1 + mp.diag([-2 * mp.mpf(float(v)) for v in lam2])) ** -1
    m = V * mp.matrix([float(v) for v in lam1])
    Kinv = K ** -1
    KinvV = Kinv * V
    kl = 0.5 * (sum(KinvV[i, i] for i in range(n)) + (m.T * Kinv * m)[0] - n + mp.log(mp.det(K))
                - mp.log(mp.det(V)))
    mt = torch.tensor([float(v) for v in m], dtype=F64)
    vt = torch.tensor([float(V[i, i]) for i in range(n)], dtype=F64)
    E = expected_log_lik(model.likelihood, model.y, mt, vt).value.sum()
    return float(E) - float(kl)


# --------------------------------------------------------------------------- (2) full vs single-site fixed point
@pytest.mark.parametrize("link", ["logit", "probit"])
def test_full_batch_and_single_site_reach_the_same_fixed_point(link):
    X, y = clf_data(50, seed=1)
    model = GPClassification(X, y, likelihood=link)
    full = engine(mode="full", beta=0.5, tol=1e-14, num_steps=500).run(model)
    single = engine(mode="stochastic", beta=0.5, tol=1e-14, num_steps=sweeps(400, 50), seed=3).run(model)
    assert full.converged and single.converged
    rel = lambda a, b: float(((a - b).abs() / b.abs().clamp_min(1e-3)).max())  # noqa: E731
    # issue tolerance 1e-4 relative; both converge to ~1e-9 here
    assert rel(single.lam1, full.lam1) < 1e-4
    assert rel(single.lam2, full.lam2) < 1e-4
    assert single.elbo == pytest.approx(full.elbo, rel=1e-4)
    # not vacuous: a few single-site steps are far from the fixed point
    early = engine(mode="stochastic", num_steps=20, tol=0).run(model)
    assert rel(early.lam2, full.lam2) > 1e-2


def test_minibatch_single_site_steps_reach_the_same_fixed_point():
    X, y = clf_data(40, seed=2)
    model = GPClassification(X, y)
    full = engine(mode="full", tol=1e-14).run(model)
    batched = engine(mode="stochastic", single_site=SingleSite(batch_size=7), tol=1e-14,
                     num_steps=sweeps(400, 40, 7)).run(model)
    assert torch.allclose(batched.lam2, full.lam2, rtol=1e-6)
    assert batched.elbo == pytest.approx(full.elbo, rel=1e-9)


# --------------------------------------------------------------------------- (3) the cached factor
def test_rank_one_updated_factor_equals_fresh_cholesky_after_1000_single_site_updates():
    X, y = clf_data(80, seed=4)
    model = GPClassification(X, y)
    post = engine(mode="stochastic", beta=0.7, num_steps=1001, tol=0,
                  single_site=SingleSite(refactor_every=10**6)).run(model)
    st = post.engine_state
    assert st.since_refactor == 1000 and st.counters["refactorisations"] == 1
    K = model.kernel_matrix(st.theta)
    fresh = torch.linalg.cholesky(K + torch.diag(-0.5 / st.lam2))
    drift = float((st.factor - fresh).abs().max())
    assert drift < 1e-8, drift                       # measured ~3e-14
    assert float(st.factor.triu(1).abs().max()) == 0.0


def test_drift_is_measured_at_every_refactorisation():
    X, y = clf_data(40, seed=5)
    post = engine(mode="stochastic", num_steps=sweeps(6, 40), tol=0,
                  single_site=SingleSite(refactor_every=25)).run(GPClassification(X, y))
    drifts = [d for d in post.trace["drift"] if not math.isnan(d)]
    assert len(drifts) >= 8 and post.info["max_drift"] == max(drifts)
    assert 0 < post.info["max_drift"] < 1e-11


@pytest.mark.parametrize("N,block", [(1, None), (2, None), (9, 2), (40, 3), (130, None)])
def test_cholesky_site_update_matches_fresh_factor_and_generic_update(N, block):
    g = torch.Generator().manual_seed(N)
    A = torch.randn(N, N, generator=g, dtype=F64)
    M = A @ A.T / N + 4 * torch.eye(N, dtype=F64)
    U = torch.linalg.cholesky(M).mT.contiguous()
    L = U.mT.clone(memory_format=torch.contiguous_format)       # a separate copy (for N = 1 .contiguous() aliases)
    for it in range(60):
        n = int(torch.randint(N, (1,), generator=g))
        alpha = float(torch.rand(1, generator=g)) * 6 - 3            # updates and downdates
        if M[n, n] + alpha <= 1.0:
            alpha = -alpha
        M[n, n] += alpha
        cholesky_site_update_(U, n, alpha, block=block)
        e = torch.zeros(N - n, dtype=F64)
        e[0] = 1.0
        L[n:, n:] = cholesky_update(L[n:, n:], e, alpha)
    fresh = torch.linalg.cholesky(M)
    assert torch.allclose(U.mT, fresh, atol=1e-12)
    assert torch.allclose(U.mT, L, atol=1e-12)
    assert float(U.tril(-1).abs().max()) == 0.0 if N > 1 else True


def test_cholesky_site_downdate_to_indefinite_raises_and_leaves_factor_unchanged():
    M = torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=F64)
    U = torch.linalg.cholesky(M).mT.contiguous()
    before = U.clone()
    with pytest.raises(NotPSDError, match="indefinite"):
        cholesky_site_update_(U, 1, -1.9)
    assert torch.equal(U, before)


def test_generic_and_blocked_factor_updates_give_the_same_run():
    X, y = clf_data(50, seed=6)
    model = GPClassification(X, y)
    a = engine(mode="stochastic", num_steps=300, tol=0).run(model)
    b = engine(mode="stochastic", num_steps=300, tol=0, single_site=SingleSite(factor_update="generic")).run(model)
    assert torch.allclose(a.lam1, b.lam1, atol=1e-12) and torch.allclose(a.lam2, b.lam2, atol=1e-12)


# ------------------------------------------------------------------ (4) an independent optimiser: GPyTorch VI
def _gpytorch_elbo(X, y, kernel, link: str) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Optimise GPyTorch's CholeskyVariationalDistribution (inducing points = training inputs, fixed; whitened)
    to convergence with L-BFGS at fixed hyperparameters; return (ELBO, m, S) of q(f)."""
    import gpytorch
    from gpytorch.likelihoods.likelihood import _OneDimensionalLikelihood
    from gpytorch.utils.quadrature import GaussHermiteQuadrature1D

    class LogitBernoulli(_OneDimensionalLikelihood):
        def forward(self, function_samples, *args, **kwargs):
            return torch.distributions.Bernoulli(logits=function_samples)

    for p in kernel.parameters():
        p.requires_grad_(False)

    class Model(gpytorch.models.ApproximateGP):
        def __init__(self):
            vd = gpytorch.variational.CholeskyVariationalDistribution(X.shape[0])
            vs = gpytorch.variational.VariationalStrategy(self, X, vd, learn_inducing_locations=False,
                                                          jitter_val=1e-10)
            super().__init__(vs)
            self.mean_module = gpytorch.means.ZeroMean()
            self.covar_module = kernel

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    gm = Model().double()
    lik = (LogitBernoulli() if link == "logit" else gpytorch.likelihoods.BernoulliLikelihood()).double()
    lik.quadrature = GaussHermiteQuadrature1D(num_locs=100)     # GPyTorch's default of 20 is too coarse
    mll = gpytorch.mlls.VariationalELBO(lik, gm, num_data=X.shape[0])
    params = [p for p in gm.parameters() if p.requires_grad]
    opt = torch.optim.LBFGS(params, lr=1, max_iter=5000, history_size=50, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-9, tolerance_change=1e-13)
    with gpytorch.settings.max_cholesky_size(10**6), gpytorch.settings.cholesky_jitter(double_value=1e-10):
        def closure():
            opt.zero_grad()
            loss = -mll(gm(X), y)
            loss.backward()
            return loss
        opt.step(closure)
        with torch.no_grad():
            elbo = float(mll(gm(X), y)) * X.shape[0]
            qf = gm(X)
            return elbo, qf.mean.detach(), qf.covariance_matrix.detach()


@pytest.mark.parametrize("link", ["logit", "probit"])
def test_converged_elbo_equals_gpytorch_variational_gp_on_pima(link):
    ds = gpvi.datasets.load_pima()
    model = GPClassification(ds.X_train, ds.y_train, likelihood=link)
    theta = model.theta.clone()
    theta[-1] = math.log(2.0)                     # fixed: lengthscale^2 = d var(x_j) = 7, signal variance 2
    post = engine(mode="full", tol=1e-12).run(model, init=theta)
    elbo_gp, m_gp, S_gp = _gpytorch_elbo(ds.X_train, ds.y_train, model.kernel_at(theta), link)
    # GPyTorch's q evaluated with gpvi's expectations: the same optimum (measured agreement ~1e-8 relative)
    assert dense_elbo(model, theta, m_gp, S_gp) == pytest.approx(post.elbo, rel=1e-7)
    assert dense_elbo(model, theta, m_gp, S_gp) <= post.elbo + 1e-9 * abs(post.elbo)
    assert torch.allclose(m_gp, post.m, atol=1e-3)
    # GPyTorch's own ELBO (the issue asks for 1e-3 relative). Logit: measured ~1e-8 (its quadrature nodes are
    # float32). Probit: GPyTorch's log_normal_cdf is a rational approximation with errors up to 1.8e-3 (at
    # z = -1), which biases its reported ELBO by ~5e-5 relative here.
    assert elbo_gp == pytest.approx(post.elbo, rel=1e-6 if link == "logit" else 2e-4)


# ------------------------------------------------------------------------------------ (5) ELBO ascent
@pytest.mark.parametrize("link", ["logit", "probit"])
def test_elbo_does_not_decrease_with_exact_gradients_and_small_beta(link):
    ds = gpvi.datasets.load_pima()
    model = GPClassification(ds.X_train, ds.y_train, likelihood=link)
    theta = model.theta.clone()
    theta[-1] = math.log(100.0)                   # large signal variance: beta = 1 diverges here
    post = engine(mode="full", beta=0.2, num_steps=60, tol=0).run(model, init=theta)
    e = torch.tensor(post.trace["elbo"], dtype=F64)
    assert float((e[1:] - e[:-1]).min()) >= -1e-10 * float(e.abs().max())
    # the check can fail: with beta = 1 the ELBO goes down at some step
    big = engine(mode="full", beta=1.0, num_steps=60, tol=0).run(model, init=theta)
    e1 = torch.tensor(big.trace["elbo"], dtype=F64)
    assert float((e1[1:] - e1[:-1]).min()) < -1e-6


# -------------------------------------------------------------------------------- hyperparameters
def test_theta_gradient_of_the_elbo_matches_autograd_through_cholesky_and_finite_differences():
    X, y = clf_data(30, seed=7)
    model = GPClassification(X, y)
    eng = engine(mode="full", num_steps=4, tol=0)
    st = eng.run(model).engine_state                  # not converged: a != 0, b != 0 in the closed form
    theta = st.theta + torch.tensor([0.2, -0.1, 0.3], dtype=F64)
    val, grad = theta_objective(eng, model, st.lam1, st.lam2, theta)

    # independent: autograd through torch.linalg.cholesky and a triangular solve
    th = theta.clone().requires_grad_(True)
    K = model.kernel_matrix(th)
    s = -0.5 / st.lam2
    yt = s * st.lam1
    L = torch.linalg.cholesky(K + torch.diag(s))
    alpha = torch.cholesky_solve(yt.unsqueeze(-1), L).squeeze(-1)
    m = K @ alpha
    W = torch.linalg.solve_triangular(L, K, upper=False)
    v = K.diagonal() - (W * W).sum(0)
    from gpvi.models.likelihoods import expected_log_lik_sum
    E = expected_log_lik_sum(model.likelihood, model.y, m, v)
    ref = site_elbo(E, st.lam1, st.lam2, m, v, L, alpha)
    (g_ref,) = torch.autograd.grad(ref, th)
    assert val == pytest.approx(float(ref.detach()), rel=1e-12)
    assert torch.allclose(grad, g_ref, rtol=1e-8, atol=1e-10)
    eps = 1e-6
    for i in range(3):
        d = torch.zeros(3, dtype=F64)
        d[i] = eps
        fd = (theta_objective(CVI(), model, st.lam1, st.lam2, theta + d)[0]
              - theta_objective(CVI(), model, st.lam1, st.lam2, theta - d)[0]) / (2 * eps)
        assert fd == pytest.approx(float(grad[i]), rel=1e-6, abs=1e-8)


def test_learning_hyperparameters_increases_the_elbo_and_converges():
    ds = gpvi.datasets.load_pima()
    model = GPClassification(ds.X_train, ds.y_train)
    fixed = engine(mode="full", tol=1e-10).run(model)
    learned = TypeII(engine(mode="full", tol=1e-10)).run(model)
    assert learned.converged and learned.info["theta_phases"] >= 2
    assert learned.elbo > fixed.elbo + 1.0
    # at the end the gradient of the objective, ELBO (sites fixed at the CVI fixed point) + log N(theta | 0, 10 I),
    # is small unless at a bound
    st = learned.engine_state
    _, grad = theta_objective(CVI(), model, st.lam1, st.lam2, learned.theta)
    grad = grad - learned.theta / 10.0
    inside = (learned.theta > -11.4) & (learned.theta < 11.4)
    assert float(grad[inside].abs().max()) < 1e-2
    # plain type-II (no prior): the ELBO's own gradient is small
    plain = TypeII(engine(mode="full", tol=1e-10), prior=None).run(model)
    st = plain.engine_state
    _, grad = theta_objective(CVI(), model, st.lam1, st.lam2, plain.theta)
    inside = (plain.theta > -11.4) & (plain.theta < 11.4)
    assert plain.elbo >= learned.elbo and float(grad[inside].abs().max()) < 1e-2


def test_type_ii_loop_is_composed_of_runs_and_an_interrupted_phase_returns_the_last_run(monkeypatch):
    X, y = clf_data(40, seed=21)
    model = GPClassification(X, y)
    eng = engine(mode="full", tol=1e-9)
    runs = []
    real_run = CVI.run

    def counting_run(self, *args, **kwargs):
        runs.append(kwargs.get("state"))
        return real_run(self, *args, **kwargs)

    monkeypatch.setattr(CVI, "run", counting_run)
    post = TypeII(eng).run(model)
    assert len(runs) == post.info["theta_phases"] >= 2 and runs[0] is None
    assert all(isinstance(s, CVIState) for s in runs[1:])
    assert post.info["learn_hyperparameters"] and post.info["type_ii"]["max_iter"] == 100
    assert post.info["steps"] == post.engine_state.t
    monkeypatch.setattr(CVI, "run", real_run)

    def interrupted_phase(self, model, state, *args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(TypeII, "phase", interrupted_phase)
    with pytest.warns(InterruptedRunWarning, match="type-II interrupted"):
        part = TypeII(eng).run(model)
    # the coarse first run: the phases' step size inner_beta, stopped at the coarse tolerance
    fixed = engine(mode="full", tol=COARSE["cvi_tol"], beta=TypeII(eng).inner_beta).run(model)
    assert part.info["interrupted"] and not part.converged and part.info["theta_phases"] == 0
    assert torch.equal(part.theta, fixed.theta) and part.elbo == fixed.elbo


# -------------------------------------------------------------------------------- validity and faults
def test_invalid_site_estimates_are_shrunk_or_rejected_and_counted():
    X, y = clf_data(40, seed=8)
    model = GPClassification(X, y)
    kw = dict(mode="full", beta=1.0, estimator=MonteCarlo(num_draws=1, variance_grad="reparam"), num_steps=8, tol=0)
    shrunk = engine(invalid="shrink", **kw).run(model)
    rejected = engine(invalid="reject", **kw).run(model)
    assert shrunk.info["sites_shrunk"] > 0 and rejected.info["sites_rejected"] > 0
    for post in (shrunk, rejected):
        assert bool((post.lam2 < 0).all()) and math.isfinite(post.elbo)


class _FlakyLikelihood(BernoulliLogit):
    """Logit likelihood whose derivatives are NaN at a few sites on chosen calls (fault injection)."""

    def __init__(self, bad_calls, *, all_sites=False):
        self.calls = 0
        self.bad_calls = set(bad_calls)
        self.all_sites = all_sites

    def derivatives(self, y, f):
        self.calls += 1
        h, h1, h2 = super().derivatives(y, f)
        if self.calls in self.bad_calls:
            sl = slice(None) if self.all_sites else slice(0, 3)
            h, h1, h2 = h.clone(), h1.clone(), h2.clone()
            h1[sl] = float("nan")
            h2[sl] = float("nan")
            if self.all_sites:
                h[sl] = float("nan")
        return h, h1, h2


def test_nonfinite_site_estimates_are_skipped_with_a_warning():
    X, y = clf_data(40, seed=9)
    model = LatentGP(X, y, likelihood=_FlakyLikelihood({4}))
    with pytest.warns(NumericalWarning, match="not finite"):
        post = engine(mode="full", num_steps=10, tol=0).run(model)
    assert post.info["sites_nonfinite"] == 3 and math.isfinite(post.elbo)


def test_a_failing_factorisation_mid_run_is_rolled_back_and_survived(monkeypatch):
    import gpvi.numerics.sites as cvi_mod

    X, y = clf_data(40, seed=10)
    model = GPClassification(X, y)
    ref = engine(mode="full", tol=1e-12).run(model)
    real = cvi_mod.site_factor
    calls = {"n": 0}

    def flaky(K, s, theta=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise NotPSDError("injected failure")
        return real(K, s, theta)

    monkeypatch.setattr(cvi_mod, "site_factor", flaky)
    with pytest.warns(NumericalWarning, match="rolled back"):
        post = engine(mode="full", tol=1e-12).run(model)
    assert post.info["faults"] == 1
    assert post.elbo == pytest.approx(ref.elbo, rel=1e-10)


def test_repeated_faults_raise_numerical_fault_error_keeping_the_last_good_state():
    X, y = clf_data(30, seed=11)
    model = LatentGP(X, y, likelihood=_FlakyLikelihood(set(range(5, 10**6)), all_sites=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumericalWarning)
        with pytest.raises(NumericalFaultError, match="4 consecutive steps failed") as err:
            engine(mode="full", num_steps=50, tol=0, faults=FaultPolicy(4)).run(model)
    st = err.value.state
    assert isinstance(st, CVIState) and st.t >= 1 and bool((st.lam2 < 0).all())
    assert bool(torch.isfinite(st.lam1).all())


# ------------------------------------------------------------------------------ interruption and resume
def _interrupt_at(k):
    def cb(state, info):
        if state.t == k:
            raise KeyboardInterrupt
    return cb


def test_interrupted_run_returns_partial_result_and_resume_equals_uninterrupted(tmp_path):
    X, y = clf_data(50, seed=12)
    model = GPClassification(X, y)
    kw = dict(mode="stochastic", estimator=MonteCarlo(num_draws=4), beta_schedule="robbins_monro",
              num_steps=sweeps(8, 50), tol=0, single_site=SingleSite(refactor_every=17), seed=5)
    full = engine(**kw).run(model)
    with pytest.warns(InterruptedRunWarning, match="interrupted after 150"):
        part = engine(**kw).run(model, callback=_interrupt_at(150))
    assert part.info["interrupted"] and part.engine_state.t == 150 and math.isfinite(part.elbo)
    path = tmp_path / "cvi_state.pt"
    torch.save(part.engine_state.state_dict(), path)
    resumed = engine(**kw).run(model, state=torch.load(path, weights_only=False))
    assert torch.equal(resumed.lam1, full.lam1) and torch.equal(resumed.lam2, full.lam2)
    assert resumed.elbo == full.elbo
    assert resumed.trace["elbo"] == full.trace["elbo"]


# heavy (a second process): make test-slow; the in-process resume from a file on disk is the test above
@pytest.mark.slow
def test_resume_in_a_new_process_equals_the_uninterrupted_run(tmp_path):
    X, y = clf_data(40, seed=13)
    torch.save({"X": X, "y": y}, tmp_path / "data.pt")
    kw = dict(mode="stochastic", estimator="mc", num_steps=sweeps(5, 40), tol=0, seed=9, progress_bar=False)
    model = GPClassification(X, y)
    full = CVI(**kw).run(model)
    with pytest.warns(InterruptedRunWarning):
        part = CVI(**kw).run(model, callback=_interrupt_at(77))
    torch.save(part.engine_state.state_dict(), tmp_path / "state.pt")
    script = textwrap.dedent(f"""
        import torch
        from gpvi.models.classification import GPClassification
        from gpvi.inference.cvi.engine import CVI
        d = torch.load({str(tmp_path / 'data.pt')!r})
        st = torch.load({str(tmp_path / 'state.pt')!r}, weights_only=True)
        post = CVI(**{kw!r}).run(GPClassification(d['X'], d['y']), state=st)
        torch.save({{'lam1': post.lam1, 'lam2': post.lam2}}, {str(tmp_path / 'out.pt')!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, env={"OMP_NUM_THREADS": "1", "PATH": ""},
                   timeout=300)
    out = torch.load(tmp_path / "out.pt")
    assert torch.equal(out["lam1"], full.lam1) and torch.equal(out["lam2"], full.lam2)


def test_same_seed_same_result_and_no_global_rng_use():
    X, y = clf_data(40, seed=14)
    model = GPClassification(X, y)
    kw = dict(mode="stochastic", estimator="mc", num_steps=sweeps(3, 40), tol=0)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    a = engine(seed=1, **kw).run(model)
    assert torch.equal(torch.get_rng_state(), before)
    b = engine(seed=1, **kw).run(model)
    c = engine(seed=2, **kw).run(model)
    d = engine(**kw).run(model, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a.lam1, b.lam1) and not torch.equal(a.lam1, c.lam1) and torch.equal(a.lam1, d.lam1)


def test_step_updates_the_cached_factor_in_place_and_is_deterministic():
    from gpvi.inference.contract import EngineState, IterativeEngine, StopRule

    X, y = clf_data(30, seed=15)
    model = GPClassification(X, y)
    eng = engine(mode="stochastic", tol=0)
    st0 = eng.init(model)
    assert isinstance(eng, IterativeEngine) and isinstance(st0, EngineState) and isinstance(eng.stop_rule(), StopRule)
    st1, info = eng.step(model, st0)                  # the full step from the prior, then the factor
    assert st1 is st0 and st1.initialised and info["checked"] and st1.factor is not None
    twin = st1.copy()
    ptr, before = st1.factor.data_ptr(), st1.factor.clone()
    lam2_before = st1.lam2.clone()
    st2, info2 = eng.step(model, st1)                 # a single-site step: no copy of the N x N factor
    assert st2 is st1 and not info2["checked"] and st2.t == 2
    assert st2.factor.data_ptr() == ptr and not torch.equal(st2.factor, before)
    assert int((st2.lam2 != lam2_before).sum()) == 1
    # the step is a function of the state (its generator included): a copy steps to the same place
    twin, _ = eng.step(model, twin)
    assert torch.equal(twin.lam2, st2.lam2) and torch.equal(twin.factor, st2.factor)
    assert twin.factor.data_ptr() != ptr


def test_run_from_a_state_leaves_the_state_unchanged_and_the_posterior_owns_a_copy():
    X, y = clf_data(30, seed=15)
    model = GPClassification(X, y)
    eng = engine(mode="stochastic", estimator="mc", num_steps=80, tol=0, seed=4)
    with pytest.warns(InterruptedRunWarning):
        st = eng.run(model, callback=_interrupt_at(40)).engine_state
    assert st.t == 40 and st.factor is not None
    snapshot = st.state_dict()
    ptr = st.factor.data_ptr()
    post = eng.run(model, state=st)
    after = st.state_dict()
    for k, v in snapshot.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, after[k]), k
        else:
            assert v == after[k] or (isinstance(v, float) and math.isnan(v) and math.isnan(after[k])), k
    assert st.factor.data_ptr() == ptr
    assert post.info["steps"] == 80 and post.engine_state is not st
    assert post.engine_state.factor.data_ptr() != ptr
    # the posterior's engine state is its own: stepping a resumed copy does not change the posterior
    mine = eng.resume(model, post.engine_state)
    eng.step(model, mine)
    assert post.engine_state.t == 80 and mine.t == 81


def test_interrupt_inside_the_factor_update_rolls_the_step_back(monkeypatch):
    import gpvi.inference.cvi.steps as steps_mod

    X, y = clf_data(40, seed=19)
    model = GPClassification(X, y)
    kw = dict(mode="stochastic", num_steps=sweeps(4, 40), tol=0, seed=2)
    full = engine(**kw).run(model)
    real = steps_mod.cholesky_site_update_
    calls = {"n": 0}

    def interrupted(U, n, alpha, **kwargs):
        calls["n"] += 1
        if calls["n"] == 60:
            U.mul_(2.0)                                # half-done: the factor is no longer K + S's
            raise KeyboardInterrupt
        return real(U, n, alpha, **kwargs)

    monkeypatch.setattr(steps_mod, "cholesky_site_update_", interrupted)
    with pytest.warns(InterruptedRunWarning, match="interrupted after 60"):
        part = engine(**kw).run(model)
    st = part.engine_state
    assert st.t == 60 and st.factor is None and math.isfinite(part.elbo)
    monkeypatch.setattr(steps_mod, "cholesky_site_update_", real)
    resumed = engine(**kw).run(model, state=st)
    # the factor is recomputed from scratch on resume (same refactorisation schedule): equal up to rounding
    assert resumed.trace["step"] == full.trace["step"]
    assert torch.allclose(resumed.lam2, full.lam2, rtol=1e-10, atol=0)
    assert resumed.elbo == pytest.approx(full.elbo, rel=1e-12)


# ------------------------------------------------------------------------------------- results
def test_posterior_predictions_dtypes_and_round_trip():
    X, y = clf_data(40, seed=16)
    model = GPClassification(X.to(torch.float32), y.to(torch.int64), likelihood="probit")
    post = engine(mode="full", tol=1e-10).run(model)
    for t in (post.lam1, post.lam2, post.m, post.var, post.theta):
        assert t.dtype == F64
    mean, var = post.predict_latent(X)
    assert torch.allclose(mean, post.m, atol=1e-10) and torch.allclose(var, post.var, atol=1e-10)
    p = post.predict_proba(X)
    assert torch.allclose(p, torch.special.ndtr(post.m / torch.sqrt(1 + post.var)))
    assert post.link == "probit" and post.info["link"] == "probit"
    pred = post.predict(X)
    assert gpvi.metrics.nlpd(pred, y) == pytest.approx(float(-pred.log_prob(y).mean()))
    again = LatentPosterior.from_state_dict(post.state_dict(), model)
    assert torch.allclose(again.predict_proba(X), p, atol=1e-14)
    table = post.summary()
    assert "link probit" in table.title and len(table) == 40
    assert table["f[3]"]["mean"] == pytest.approx(float(post.m[3])) and table["f[3]"]["lam2"] < 0
    assert "converged=True" in repr(post)


def test_latent_posterior_has_the_common_surface():
    X, y = clf_data(30, seed=20)
    model = GPClassification(X, y)
    post = engine(mode="full", tol=1e-10).run(model)
    N = model.num_data
    assert post.names == [f"f[{i}]" for i in range(N)] and post.dim == N
    assert torch.equal(post.mean, post.m) and torch.allclose(post.std ** 2, post.var)
    q = post.quantile([0.05, 0.5, 0.95])
    assert q.shape == (3, N) and torch.allclose(q[1], post.m)
    assert torch.allclose(q[2] - q[1], 1.6448536269514722 * post.std)
    marg = post.marginals()
    assert marg["f[2]"]["family"] == "normal" and marg["f[2]"]["mean"] == pytest.approx(float(post.m[2]))
    # draws by Matheron's rule against the dense covariance of q (independent formula from the sites)
    S = 20000
    draws = post.sample(S, seed=0)
    assert draws.shape == (S, N) and draws.dtype == F64
    assert torch.equal(draws, post.sample(S, seed=0)) and not torch.equal(draws, post.sample(S, seed=1))
    m, V = site_covariance(model, post.theta, post.lam1, post.lam2)
    sd = V.diagonal().sqrt()
    # mean: 5 standard errors; variance: 5 standard errors of a Gaussian sample variance, sqrt(2/S) relative
    assert float(((draws.mean(0) - m).abs() / (sd / math.sqrt(S))).max()) < 5.0
    assert float(((draws.var(0) / V.diagonal() - 1).abs()).max()) < 5 * math.sqrt(2 / S)
    emp = torch.cov(draws.T)
    assert float((emp - V).abs().max()) < 5 * float(V.diagonal().max()) * math.sqrt(2 / S)
    # state_dict: kind and version; the base class picks the kind
    sd_ = post.state_dict()
    assert sd_["kind"] == "latent" and sd_["version"] >= 1 and sd_["engine_state"]["t"] == post.info["steps"]
    again = Posterior.from_state_dict(sd_, model)
    assert isinstance(again, LatentPosterior) and torch.equal(again.m, post.m)
    assert isinstance(again.engine_state, dict) and again.info["steps"] == post.info["steps"]
    assert engine().resume(model, again.engine_state).t == post.engine_state.t
    assert post.hyperparameters() == model.describe(post.theta)
    # a posterior is a warm start (its theta and sites): the next run converges at its second check
    warm = engine(mode="full", tol=1e-10).run(model, init=post)
    assert warm.info["steps"] == 2 and warm.converged and warm.elbo == pytest.approx(post.elbo, rel=1e-10)


def test_logit_prediction_is_the_quadrature_of_the_sigmoid():
    X, y = clf_data(40, seed=17)
    post = engine(mode="full", tol=1e-10).run(GPClassification(X, y))
    Xs = torch.rand(5, 2, dtype=F64, generator=torch.Generator().manual_seed(1)) * 4 - 2
    mean, var = post.predict_latent(Xs)
    ref = torch.tensor([expected_log_lik(BernoulliLogit(), torch.ones(1, dtype=F64), mean[i:i + 1],
                                         var[i:i + 1]).value.exp() for i in range(5)])
    # E[sigma(f)] != exp(E[log sigma(f)]); check against direct quadrature instead
    from gpvi.models.likelihoods import gaussian_expectation
    direct = gaussian_expectation(torch.sigmoid, mean, var)
    assert torch.allclose(post.predict_proba(Xs), direct, atol=1e-14)
    assert bool((direct > ref).all())                         # Jensen: E[sigma] > exp(E[log sigma])


def test_robbins_monro_monte_carlo_run_gets_close_to_the_quadrature_solution():
    X, y = clf_data(40, seed=18)
    model = GPClassification(X, y)
    exact = engine(mode="full", tol=1e-12).run(model)
    mc = engine(mode="full", estimator=MonteCarlo(num_draws=50), beta_schedule="robbins_monro", num_steps=150,
                tol=0, seed=0).run(model)
    # residual noise of the sites ~ beta_t sd(g) with beta_150 = 0.5 * 151^-0.6 = 0.025: ELBO within 1e-3
    assert mc.elbo == pytest.approx(exact.elbo, rel=1e-3)


def test_monte_carlo_default_step_decreases_and_the_run_stops_by_itself_at_the_quadrature_elbo():
    ds = gpvi.datasets.load_pima()
    idx = torch.arange(0, 200, 2)                          # 100 rows
    model = GPClassification(ds.X_train[idx], ds.y_train[idx])
    exact = engine(mode="full", tol=1e-12).run(model)
    mc = engine(mode="full", estimator="mc", seed=3).run(model)
    assert mc.info["beta_schedule"] == "robbins_monro" and engine().settings()["beta_schedule"] == "constant"
    # the noise-aware stop rule ends the run well inside the budget (measured: 59 of 500 steps)
    assert mc.converged and mc.info["steps"] < 250
    gap = (exact.elbo - mc.elbo) / abs(exact.elbo)
    assert 0.0 <= gap < 1e-3
    # the decreasing step is what brings it close: a constant step stops at its noise floor (measured 2.6e-4,
    # against 1.2e-5 for the default)
    const = engine(mode="full", estimator="mc", beta_schedule="constant", seed=3).run(model)
    assert (exact.elbo - const.elbo) / abs(exact.elbo) > 3 * gap


def test_noisy_stop_rule_rejects_trends_and_accepts_fluctuations():
    from gpvi.inference.cvi.options import flat_elbo_window

    g = torch.Generator().manual_seed(0)
    noise = (1e-3 * torch.randn(10, generator=g, dtype=F64)).tolist()
    assert flat_elbo_window([-5.0 + x for x in noise], 1e-9)
    rising = [-5.0 + 0.01 * k + x for k, x in enumerate(noise)]       # trend 10x the noise per check
    assert not flat_elbo_window(rising, 1e-9)
    assert not flat_elbo_window([-5.0] * 9, 1e-9)                     # fewer than two windows
    assert flat_elbo_window(rising, 0.05)                              # ... unless within tol (0.05 * 4.9)


# ------------------------------------------------------------------------------------- (6) bad input
def test_bad_input_gives_clear_errors():
    X, y = clf_data(20)
    Xnan = X.clone()
    Xnan[3, 1] = float("nan")
    with pytest.raises(ValueError, match="X contains 1 non-finite"):
        GPClassification(Xnan, y)
    with pytest.raises(ValueError, match="y must hold two classes"):
        GPClassification(X, torch.arange(20) % 3)
    with pytest.raises(ValueError, match="y holds a single class"):
        GPClassification(X, torch.ones(20))
    with pytest.raises(ValueError, match="X has 20 rows but y has 19"):
        GPClassification(X, y[:19])
    with pytest.raises(ValueError, match=r"y must use labels \{0, 1\} or \{-1, \+1\}"):
        GPClassification(X, 2 * y + 3)
    with pytest.raises(ValueError, match="likelihood must be a binary likelihood"):
        GPClassification(X, y, likelihood=Gaussian(1.0))
    with pytest.raises(ValueError, match="likelihood must be one of"):
        GPClassification(X, y, likelihood="cloglog")
    with pytest.raises(ValueError, match="theta must have length D = 3"):
        GPClassification(X, y, theta=[0.0, 1.0])
    with pytest.raises(TypeError, match="X must be an array of numbers"):
        GPClassification("abc", y)
    with pytest.raises(ValueError, match=r"beta must be in \(0, 1\]; got -0.5"):
        CVI(beta=-0.5)
    with pytest.raises(ValueError, match=r"beta must be in \(0, 1\]; got 0"):
        CVI(beta=0.0)
    with pytest.raises(ValueError, match=r"beta must be in \(0, 1\]; got 1.5"):
        CVI(beta=1.5)
    with pytest.raises(ValueError, match="mode must be one of"):
        CVI(mode="minibatch")
    with pytest.raises(ValueError, match="estimator must be one of"):
        CVI(estimator="laplace")
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        SingleSite(batch_size=0)
    with pytest.raises(ValueError, match="num_draws must be >= 1"):
        MonteCarlo(num_draws=0)
    with pytest.raises(ValueError, match="tol must be >= 0"):
        CVI(tol=-1.0)
    with pytest.raises(ValueError, match="theta_bounds"):
        TypeII(theta_bounds=(1.0, -1.0))
    with pytest.raises(ValueError, match="num_steps must be >= 1"):
        CVI(num_steps=0)
    with pytest.raises(TypeError, match="faults must be a gpvi.inference.contract.FaultPolicy"):
        CVI(faults=3)
    with pytest.raises(TypeError, match="single_site must be"):
        CVI(single_site=7)
    with pytest.raises(TypeError, match="model must be"):
        CVI(progress_bar=False).run(X)
    model = GPClassification(X, y)
    with pytest.raises(ValueError, match="lam2 must be < 0"):
        CVI().initial_state(model, lam1=torch.zeros(20), lam2=torch.zeros(20))
    with pytest.raises(ValueError, match=r"state has sites of shape \(20,\) but the model's are \(19,\)"):
        CVI(progress_bar=False).run(GPClassification(X[:19], y[:19]), state=CVI().initial_state(model))
    with pytest.raises(ValueError, match="cannot be combined"):
        CVI(progress_bar=False).run(model, init=model.theta, state=CVI().initial_state(model))
    with pytest.raises(TypeError, match="callback must be callable"):
        CVI(progress_bar=False).run(model, callback=3)


def test_exact_inference_on_too_large_n_is_refused_before_allocating():
    n = 2_000_000                                          # K alone would need 32 TB
    X = torch.zeros(n, 1, dtype=F64)
    y = (torch.arange(n) % 2).to(F64)
    with pytest.raises(MemoryError, match="N = 2000000"):
        GPClassification(X, y)


@pytest.mark.parametrize("link", ["logit", "probit"])
def test_inner_step_size_changes_the_path_not_the_optimum(link):
    """Issue 59: the phases' inner runs at inner_beta = 0.75 (default) and at the engine's beta (None) converge the
    same monotone inner runs to the same fixed points, so the loop ends at the same MAP-II point (measured 1e-9
    relative on these sets); the step size is recorded and checked."""
    X, y = clf_data(60, seed=5)
    model = GPClassification(X, y, likelihood=link)
    new = TypeII(engine(mode="full", tol=1e-9)).run(model)
    old = TypeII(engine(mode="full", tol=1e-9), inner_beta=None).run(model)
    assert new.info["type_ii"]["inner_beta"] == 0.75 and old.info["type_ii"]["inner_beta"] is None
    assert new.info["objective"] == pytest.approx(old.info["objective"], rel=1e-7)
    assert torch.allclose(new.theta, old.theta, atol=1e-3)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="inner_beta"):
            TypeII(engine(), inner_beta=bad)
