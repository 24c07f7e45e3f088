"""Salimans & Knowles (2013) engines: Algorithm 2 (Gaussian, Hessian and Hessian-free), Algorithm 1 (exponential
families). Checked against closed forms (exact recovery), an independent deterministic optimiser (Pima quadrature
optimum), an independent autograd GP log marginal (finite-difference Hessians), plus faults, determinism, resume
and input validation.

Monte Carlo tolerances. Exact-recovery tests have none: the regression is noise free for targets in the family, so
they assert rounding-level agreement (1e-8). For Algorithm 2 on a non-Gaussian target the output is a ratio of
averages over the n = N/2 steps of the averaging window; its error is O(1/sqrt(n)) of the posterior scale times
the relative spread of the per-draw statistics. On Pima (8 seeds, N = 1000, n = 500) the largest errors observed
were 0.010 sd (mean) and 0.012 (covariance, in sd_i sd_j units); asserting 0.05 leaves a factor 4-5 (about 5
standard errors if the observed maximum is ~1 se). Each tolerance is written next to its assertion.
"""

from __future__ import annotations

import io
import math
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy
import pytest
import gpytorch
import torch

import gpvi
from gpvi.exceptions import ConvergenceWarning, InterruptedRunWarning, NumericalFaultError, NumericalWarning
from gpvi.models.logistic import BayesianLogisticRegression
from gpvi.posteriors import GaussianPosterior, PointPosterior
from gpvi.numerics.budget import MemoryBudget
from gpvi.inference.derivatives import value_grad_hessian
from gpvi.inference.driver import run as driver_run
from gpvi.inference.contract import FaultPolicy
from gpvi.inference.quadrature_fit import fit_gaussian_quadrature
from gpvi.inference.salimans_knowles import (
    Exponential,
    Gamma,
    HessianSource,
    Normal,
    SKExpFamily,
    SKFaultPolicy,
    SKGaussian,
    SKSchedule,
    SKState,
)

ROOT = Path(__file__).resolve().parents[3]


def gaussian_target(mu: torch.Tensor, Lam: torch.Tensor, normalised: bool = True) -> gpvi.Target:
    """log N(theta | mu, Lam^-1), batched."""
    D = mu.shape[0]
    const = 0.5 * float(torch.logdet(Lam)) - 0.5 * D * math.log(2 * math.pi) if normalised else 3.0

    def fn(th: torch.Tensor) -> torch.Tensor:
        r = th - mu
        return -0.5 * ((r @ Lam) * r).sum(-1) + const

    return gpvi.Target(fn, names=D)


def correlated_gaussian(D: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(D, D, generator=g, dtype=torch.float64)
    Lam = A @ A.T + 0.5 * torch.eye(D, dtype=torch.float64)
    mu = 3.0 * torch.randn(D, generator=g, dtype=torch.float64)
    return mu, Lam


def quiet(**kw) -> SKGaussian:
    kw.setdefault("progress_bar", False)
    return SKGaussian(**kw)


def run_quiet(engine: SKGaussian, target, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumericalWarning)
        warnings.simplefilter("ignore", ConvergenceWarning)
        return engine.run(target, *args, **kw)


@pytest.fixture(scope="module")
def pima():
    ds = gpvi.datasets.load_pima()
    model = BayesianLogisticRegression(ds.X_train, ds.y_train)
    return model, fit_gaussian_quadrature(model)


# ================================================================================= exact recovery (noise free)
@pytest.mark.parametrize("kw", [dict(hessian="autograd"), dict(hessian="fd"), dict(method="gradient"),
                                dict(method="gradient", num_draws=4),
                                dict(method="gradient", num_draws=4, draws="sobol"),
                                dict(hessian="autograd", draws="sobol")],
                         ids=["autograd", "fd", "grad", "grad-S4", "grad-S4-sobol", "autograd-sobol"])
def test_gaussian_target_recovered_exactly(kw):
    """Paper section 4 / Appendix B: for a Gaussian target H is constant and the gradient linear in x, so the
    averaged regression returns (mu, Lam^-1) exactly, whatever the draws. Rounding-level tolerance: 1e-8."""
    mu, Lam = correlated_gaussian()
    target = gaussian_target(mu, Lam)
    V = torch.linalg.inv(Lam)
    for seed in (0, 1):
        q = run_quiet(quiet(num_steps=50, seed=seed, num_elbo_draws=200, **kw), target)
        assert float((q.mean - mu).abs().max()) < 1e-8 * (1 + float(mu.abs().max()))
        assert float((q.covariance - V).abs().max()) < 1e-8 * float(V.abs().max())
        # log g - log q = log Z = 0 for every draw of the exact q: the bound estimate is 0 with zero spread
        assert abs(q.elbo) < 1e-8 and q.elbo_se < 1e-8
        assert q.info["averaged"] and q.info["num_averaged"] == 25 and q.info["converged"]
    assert q.info["hessian"] == kw.get("hessian")         # None for the gradient variant


def test_exactness_is_not_an_accident_of_the_draws():
    """The iterates q_t are not exact (they mix in the initial V_1 through the running averages), and different
    seeds take different paths; only the second-half regression is exact."""
    mu, Lam = correlated_gaussian()
    target = gaussian_target(mu, Lam)
    eng = quiet(num_steps=50, seed=3)
    state = eng.init(target)
    for _ in range(10):
        state, _ = eng.step(target, state)
    assert float((state.m - mu).abs().max()) > 1e-3        # mid-run iterate still off
    q1 = run_quiet(quiet(num_steps=50, seed=3), target)
    q2 = run_quiet(quiet(num_steps=50, seed=4), target)
    assert not torch.equal(q1.trace["bound"], q2.trace["bound"])
    assert float((q1.mean - q2.mean).abs().max()) < 1e-9


# ================================================================================= Hessians
def test_fd_hessian_matches_autograd_on_logistic(pima):
    """Central differences of the gradient vs double-backward autograd on a target supporting both. FD error:
    O(h^2 f''') + O(eps |g| / h) with h = 1e-4 (1 + |theta|): ~1e-7 relative here; asserted 1e-6 of max |H|."""
    model, _ = pima
    g = torch.Generator().manual_seed(0)
    theta = 0.5 * torch.randn(3, model.dim, generator=g, dtype=torch.float64)
    lj_a, g_a, H_a = value_grad_hessian(model, theta, hessian="autograd")
    lj_f, g_f, H_f = value_grad_hessian(model, theta, hessian="fd")
    assert H_a.shape == (3, model.dim, model.dim)
    assert torch.equal(lj_a, lj_f) and torch.allclose(g_a, g_f, rtol=0, atol=1e-12)
    assert float((H_f - H_a).abs().max()) < 1e-6 * float(H_a.abs().max())
    assert torch.equal(H_f, H_f.transpose(-1, -2))                      # symmetrised
    # the prior alone contributes -I: the likelihood part is non-trivial, so the check has teeth
    assert float((H_a + torch.eye(model.dim, dtype=torch.float64)).abs().max()) > 1.0
    # unbatched input
    _, _, H1 = value_grad_hessian(model, theta[0], hessian="fd")
    assert H1.shape == (model.dim, model.dim)


def _independent_gp_log_joint(X: torch.Tensor, y: torch.Tensor):
    """log N(y | 0, sf2 exp(-|x-x'|^2_l / 2) + sn2 I) + log N(theta | 0, 10 I), through torch's own
    MultivariateNormal (twice differentiable), theta = [log l_1^2, ..., log l_d^2, log sf2, log sn2]."""
    d = X.shape[1]

    def fn(th: torch.Tensor) -> torch.Tensor:
        out = []
        for t in th:
            ls2, sf2, sn2 = torch.exp(t[:d]), torch.exp(t[d]), torch.exp(t[d + 1])
            diff = (X[:, None, :] - X[None, :, :]) ** 2 / ls2
            K = sf2 * torch.exp(-0.5 * diff.sum(-1)) + sn2 * torch.eye(X.shape[0], dtype=X.dtype)
            lml = torch.distributions.MultivariateNormal(torch.zeros_like(y), covariance_matrix=K).log_prob(y)
            prior = (-0.5 * t * t / 10.0).sum() - 0.5 * t.numel() * math.log(2 * math.pi * 10.0)
            out.append(lml + prior)
        return torch.stack(out)

    return gpvi.Target(fn, names=d + 2)


def test_gp_target_auto_uses_fd_hessian_that_matches_an_independent_autograd_hessian():
    g = torch.Generator().manual_seed(1)
    X = torch.rand(25, 2, generator=g, dtype=torch.float64) * 2 - 1
    y = torch.sin(3 * X[:, 0]) + 0.1 * torch.randn(25, generator=g, dtype=torch.float64)
    model = gpvi.GPRegression(X, y, mean=gpytorch.means.ZeroMean(),       # the reference's model: zero mean, N(0, 10 I)
                              prior=gpvi.models.priors.default_prior(4))
    ref = _independent_gp_log_joint(X, y)
    theta = torch.tensor([[-0.5, 0.3, 0.2, -3.0], [0.1, -0.2, -0.4, -2.0]], dtype=torch.float64)
    assert torch.allclose(model.log_joint(theta), ref.log_joint(theta), rtol=1e-10, atol=1e-10)
    # GPRegression refuses double backward (closed-form gradient): 'autograd' says so, 'auto' falls back to FD
    with pytest.raises(ValueError, match="hessian='fd'"):
        value_grad_hessian(model, theta, hessian="autograd")
    _, _, H_fd = value_grad_hessian(model, theta, hessian="auto")
    _, _, H_ad = value_grad_hessian(ref, theta, hessian="autograd")
    # FD truncation ~h^2 (fourth derivatives of the log marginal, O(10) here) -> ~1e-7 relative; asserted 1e-5
    assert float((H_fd - H_ad).abs().max()) < 1e-5 * float(H_ad.abs().max())
    state = quiet(num_steps=10).init(model)
    assert state.hessian == "fd" and "second derivatives" in state.hessian_note
    with pytest.raises(ValueError, match="hessian='fd'"):
        run_quiet(quiet(num_steps=4, hessian="autograd"), model)


# ================================================================================= independent optimum (Pima)
@pytest.mark.parametrize("kw", [dict(), dict(method="gradient", num_draws=4),
                                dict(method="gradient", num_draws=4, draws="sobol")],
                         ids=["hessian", "gradient", "gradient-sobol"])
def test_pima_matches_the_deterministic_gaussian_vi_optimum(pima, kw):
    """Bayesian logistic regression (DSVI paper 3.1): the Gaussian bound is concave with a unique maximiser, found
    independently by L-BFGS on the 64-point quadrature bound. Algorithm 2's fixed point (E_q[g] = 0, P = -E_q[H])
    is that maximiser. Tolerances: see the module docstring (0.05 = ~5x the largest error over 8 seeds)."""
    model, ref = pima
    q = run_quiet(quiet(num_steps=1000, seed=0, num_elbo_draws=500, **kw), model)
    sd = ref.stddev
    assert float(((q.mean - ref.mean) / sd).abs().max()) < 0.05
    assert float(((q.covariance - ref.covariance) / (sd[:, None] * sd[None, :])).abs().max()) < 0.05
    gap = float(ref.elbo - model.gaussian_bound(q.mean, q.scale_tril))
    assert -1e-9 < gap < 0.01                          # exact (quadrature) bound; observed max gap 2e-4
    # the Monte Carlo bound estimate agrees with the quadrature bound within 5 of its standard errors
    assert abs(q.elbo - ref.elbo) < 5 * q.elbo_se + 0.01
    assert q.info["non_pd_steps"] == 0                 # log-concave target: -H is PD at every draw


def test_sobol_draws_lower_the_error_of_the_averaged_regression(pima):
    """Randomised quasi-Monte Carlo draws (one scrambled Sobol' sequence per run) make the window average a QMC
    average: against the exact (quadrature) bound optimum of Pima, N = 200, 2 antithetic pairs per step, 8 seeds
    each, the mean bound gap was 1.8e-4 with pseudo-random draws and 5.6e-5 with Sobol' draws (3.2x smaller; at
    N = 1000, 6.0e-5 vs 4.1e-6). Asserted on 4 seeds: Sobol' at most half of pseudo-random's mean gap, every
    Sobol' gap below 2e-4 (3x its observed maximum 6.5e-5)."""
    model, ref = pima
    gaps = {}
    for draws in ("random", "sobol"):
        gaps[draws] = []
        for seed in range(4):
            q = run_quiet(quiet(num_steps=200, method="gradient", num_draws=4, draws=draws, seed=seed,
                                num_elbo_draws=0), model)
            gaps[draws].append(float(ref.elbo - model.gaussian_bound(q.mean, q.scale_tril)))
    assert min(gaps["sobol"]) > -1e-9 and max(gaps["sobol"]) < 2e-4
    assert sum(gaps["sobol"]) < 0.5 * sum(gaps["random"])


def test_sobol_runs_resume_bit_for_bit_and_refuse_a_pseudo_random_engine(pima):
    """The Sobol' sequence's scramble seed and position are part of the state: an interrupted run resumed from
    its state_dict (through torch.save) equals the uninterrupted one exactly; the seed is drawn from the run's
    generator, so different seeds give different sequences; a state made with one kind of draws is refused by an
    engine with the other."""
    model, _ = pima
    kw = dict(num_steps=100, method="gradient", num_draws=4, draws="sobol", seed=11, num_elbo_draws=100)
    full = run_quiet(quiet(**kw), model)
    with pytest.warns(InterruptedRunWarning):
        part = run_quiet(quiet(**kw), model, callback=_stop_at(70))
    saved = part.engine_state.state_dict()
    assert saved["qmc_seed"] is not None and saved["qmc_drawn"] == 70 * 2
    buf = io.BytesIO()
    torch.save(saved, buf)
    buf.seek(0)
    state = SKState.from_state_dict(torch.load(buf, weights_only=False))
    resumed = run_quiet(quiet(**kw), model, state=state)
    assert torch.equal(resumed.mean, full.mean) and torch.equal(resumed.scale_tril, full.scale_tril)
    assert torch.equal(resumed.trace["bound"], full.trace["bound"]) and resumed.elbo == full.elbo
    other = run_quiet(quiet(**{**kw, "seed": 12}), model)
    assert not torch.equal(other.trace["bound"], full.trace["bound"])
    assert full.info["settings"]["draws"] == "sobol" and "draws='sobol'" in repr(quiet(**kw))
    with pytest.raises(ValueError, match="draws"):
        quiet(**{**kw, "draws": "random"}).run(model, state=part.engine_state)


@pytest.mark.slow
def test_minibatch_subsampling_converges_to_the_full_data_optimum(pima):
    """Section 6.5: statistics linear in log g stay unbiased with a minibatch log joint scaled by N/M (eq. 50).
    M = 100 of N = 200, N_steps = 2000; observed max error over 8 seeds 0.12 sd for the mean (the minibatch noise
    of a_bar enters through P^-1), 0.02 for the covariance; asserted 0.4 and 0.1."""
    model, ref = pima
    mb = model.minibatch(100)
    draws = {"n": 0}
    sample = mb.sample_minibatch

    def counting(gen):
        draws["n"] += 1
        return sample(gen)

    mb.sample_minibatch = counting
    q = run_quiet(quiet(num_steps=2000, seed=0, num_elbo_draws=0), mb)
    assert draws["n"] == 2000 + 1                      # one batch per step (+ the Hessian probe at init)
    sd = ref.stddev
    assert float(((q.mean - ref.mean) / sd).abs().max()) < 0.4
    assert float(((q.covariance - ref.covariance) / (sd[:, None] * sd[None, :])).abs().max()) < 0.1
    assert q.info["hessian"] == "autograd"


# ================================================================================= non-PD precision
def test_heavy_tails_from_a_too_wide_start_is_a_clear_error_and_a_closer_start_fixes_it():
    """Student-t_5 target (log g = -3 log(1 + x^2/5)); Gaussian-VI optimum v* = 1.36277 (1/v = E_q[-H], quadrature).
    Started with sd 3 (V_1 = 9), E_q[-H] < P for q that wide, so single-draw Hessians keep pushing P down: updates
    that would make P indefinite are rejected (counted, warned) and the averaged P_bar ends indefinite -> a clear
    NumericalFaultError (paper section 4: more steps or a better first guess). Started with sd 1 the same run
    converges (N = 400: v within 0.13 of v* over 8 seeds; asserted 0.3)."""
    t5 = gpvi.Target(lambda th: -3.0 * torch.log1p(th[:, 0] ** 2 / 5), names=["x"])
    with pytest.warns(NumericalWarning, match="positive definite"), \
            pytest.raises(NumericalFaultError, match="start closer to the posterior") as exc:
        quiet(num_steps=100, init_scale=3.0, seed=0).run(t5, init=[0.0])
    assert exc.value.state.counters["non_pd_steps"] > 0
    assert bool(torch.isfinite(exc.value.partial.mean).all() and torch.isfinite(exc.value.partial.scale_tril).all())
    q = run_quiet(quiet(num_steps=400, init_scale=1.0, seed=0, num_elbo_draws=0), t5, init=[0.0])
    assert q.info["non_pd_steps"] == 0
    assert abs(float(q.covariance[0, 0]) - 1.36277) < 0.3 and abs(float(q.mean[0])) < 0.3


def test_too_few_steps_is_a_clear_error_and_more_steps_fix_it():
    """Gradient variant with N = 4 on D = 4: the averaging window holds 2 antithetic pairs, fewer than D, so the
    slope regression is rank deficient and P_bar is not positive definite: a NumericalFaultError saying to increase
    num_steps, never a NaN. N = 20 (10 pairs in the window) recovers the Gaussian exactly."""
    mu, Lam = correlated_gaussian()
    target = gaussian_target(mu, Lam)
    with pytest.raises(NumericalFaultError, match="increase num_steps") as exc:
        run_quiet(quiet(num_steps=4, method="gradient", seed=0), target)
    part = exc.value.partial
    assert isinstance(exc.value.state, SKState) and isinstance(part, GaussianPosterior)
    assert bool(torch.isfinite(part.mean).all() and torch.isfinite(part.scale_tril).all())
    q = run_quiet(quiet(num_steps=20, method="gradient", seed=0), target)
    assert float((q.mean - mu).abs().max()) < 1e-8 * (1 + float(mu.abs().max()))


def test_indefinite_curvature_ends_in_a_clear_error_never_a_nan():
    """log g = x0^2 / 2 - x1^2 / 2 is convex in x0 (an improper 'posterior'): H = diag(-1, 1) at every draw, so the
    running P = (1-w)^t P_1 + (1 - (1-w)^t) diag(1, -1) turns indefinite after ~16 steps (w = 0.1) and the
    averaged P_bar = diag(1, -1) is indefinite: a NumericalFaultError with the state, never a NaN."""
    target = gpvi.Target(lambda th: 0.5 * th[:, 0] ** 2 - 0.5 * th[:, 1] ** 2, names=2)
    for on in ("reject", "keep"):
        with pytest.warns(NumericalWarning, match="positive definite"), \
                pytest.raises(NumericalFaultError, match="not positive definite") as exc:
            quiet(num_steps=100, init_scale=0.5, seed=0, faults=SKFaultPolicy(on_non_pd=on)).run(target)
        st, part = exc.value.state, exc.value.partial
        assert st.counters["non_pd_steps"] > 80 and st.t == 100
        assert bool(torch.isfinite(st.m).all() and torch.isfinite(st.L).all())   # the last valid q_t
        assert bool(torch.isfinite(part.mean).all() and torch.isfinite(part.scale_tril).all())
    with pytest.raises(NumericalFaultError, match="on_non_pd") as exc:
        quiet(num_steps=100, init_scale=0.5, seed=0, faults=SKFaultPolicy(on_non_pd="raise")).run(target)
    assert 10 <= exc.value.state.t <= 20               # stopped at the first indefinite update (step ~16)


def test_non_gaussian_target_matches_its_quadrature_optimum():
    """1-D tilted quartic log g = -x^4/4 + x^2/2 + 2x (positive curvature near 0): Gaussian-VI optimum by
    Gauss-Hermite + Nelder-Mead is m* = 1.3723, v* = 0.19144. N = 400 (200 averaged single draws): over 10 seeds
    |m - m*| <= 0.02 and |v - v*| <= 0.02; asserted 0.06 for both (3x)."""
    target = gpvi.Target(lambda th: -th[:, 0] ** 4 / 4 + th[:, 0] ** 2 / 2 + 2 * th[:, 0], names=["x"])
    q = run_quiet(quiet(num_steps=400, init_scale=1.0, seed=0, num_elbo_draws=0), target, init=[0.0])
    assert abs(float(q.mean[0]) - 1.37227) < 0.06
    assert abs(float(q.covariance[0, 0]) - 0.19144) < 0.06


# ================================================================================= numerical faults
def test_nan_draws_are_resampled_counted_and_warned():
    mu, Lam = correlated_gaussian(2)
    base = gaussian_target(mu, Lam)

    def fn(th):
        out = base.log_joint(th)
        return torch.where(th[:, 0] > float(mu[0]) + 0.3, torch.full_like(out, math.nan), out)

    with pytest.warns(NumericalWarning, match="redrawn"):
        q = quiet(num_steps=60, init_scale=0.5, seed=0, num_elbo_draws=200).run(gpvi.Target(fn, names=2), init=mu)
    assert q.info["resampled_draws"] > 0 and q.info["log_joint_calls"] > 60
    assert bool(torch.isfinite(q.mean).all()) and math.isfinite(q.elbo) and q.info["elbo_invalid"] > 0


def test_consecutive_failures_raise_with_last_good_state():
    mu, Lam = correlated_gaussian(2)
    base = gaussian_target(mu, Lam)
    calls = {"n": 0}

    def fn(th):
        calls["n"] += 1
        out = base.log_joint(th)
        return out if calls["n"] <= 22 else torch.full_like(out, -math.inf)     # start check + probe + 20 steps

    with pytest.warns(NumericalWarning), pytest.raises(NumericalFaultError, match="consecutive") as exc:
        quiet(num_steps=200, faults=FaultPolicy(max_consecutive=4, max_resample=1), seed=0).run(
            gpvi.Target(fn, names=2))
    st = exc.value.state
    assert st.t == 24 and st.counters["skipped_steps"] == 4
    assert isinstance(exc.value.partial, GaussianPosterior) and bool(torch.isfinite(exc.value.partial.mean).all())


# ================================================================================= determinism, resume
def test_identical_seeds_identical_runs_and_no_global_rng(pima):
    model, _ = pima
    before = torch.random.get_rng_state()
    q1 = run_quiet(quiet(num_steps=60, seed=7, num_elbo_draws=100), model)
    q2 = run_quiet(quiet(num_steps=60, seed=7, num_elbo_draws=100), model)
    q3 = run_quiet(quiet(num_steps=60, seed=8, num_elbo_draws=100), model)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    q4 = run_quiet(quiet(num_steps=60), model, generator=g1)
    q5 = run_quiet(quiet(num_steps=60), model, generator=g2)
    fam = Gamma()
    r1 = SKExpFamily(fam, 20, seed=1).run(lambda x: 2 * torch.log(x) - 3 * x, fam.natural(1.0, 1.0))
    r2 = SKExpFamily(fam, 20, seed=1).run(lambda x: 2 * torch.log(x) - 3 * x, fam.natural(1.0, 1.0))
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(q1.mean, q2.mean) and torch.equal(q1.scale_tril, q2.scale_tril) and q1.elbo == q2.elbo
    assert torch.equal(q1.trace["bound"], q2.trace["bound"]) and not torch.equal(q1.mean, q3.mean)
    assert torch.equal(q4.mean, q5.mean)
    assert torch.equal(r1.trace["eta"], r2.trace["eta"])
    assert q1.mean.dtype == torch.float64 and q1.scale_tril.dtype == torch.float64


def _stop_at(t_stop: int):
    def cb(state, info):
        if state.t == t_stop:
            raise KeyboardInterrupt
    return cb


@pytest.mark.parametrize("method", ["hessian", "gradient"])
@pytest.mark.parametrize("t_stop", [17, 70], ids=["first-half", "averaging-window"])
def test_resume_equals_uninterrupted_in_process(pima, method, t_stop):
    model, _ = pima
    kw = dict(num_steps=100, method=method, seed=11, num_elbo_draws=100)
    full = run_quiet(quiet(**kw), model)
    with pytest.warns(InterruptedRunWarning):
        part = run_quiet(quiet(**kw), model, callback=_stop_at(t_stop))
    assert part.info["interrupted"] and part.info["steps"] == t_stop
    assert part.info["averaged"] == (t_stop > 50)           # before the window: the current q_t is returned
    buf = io.BytesIO()
    torch.save(part.engine_state.state_dict(), buf)
    buf.seek(0)
    state = SKState.from_state_dict(torch.load(buf, weights_only=False))
    resumed = run_quiet(quiet(**kw), model, state=state)
    assert torch.equal(resumed.mean, full.mean) and torch.equal(resumed.scale_tril, full.scale_tril)
    assert torch.equal(resumed.trace["bound"], full.trace["bound"]) and resumed.elbo == full.elbo
    assert resumed.info["steps"] == 100 and resumed.info["log_joint_evals"] == full.info["log_joint_evals"]


def test_ctrl_c_inside_a_step_rewinds_its_randomness():
    mu, Lam = correlated_gaussian(3)
    base = gpvi.Target(lambda th: gaussian_target(mu, Lam).log_joint(th) - 0.1 * (th ** 4).sum(-1), names=3)
    calls = {"n": 0}

    def fn(th):
        calls["n"] += 1
        if calls["n"] == 30:
            raise KeyboardInterrupt
        return base.log_joint(th)

    kw = dict(num_steps=60, seed=2, num_elbo_draws=50)
    full = run_quiet(quiet(**kw), base)
    with pytest.warns(InterruptedRunWarning):
        part = run_quiet(quiet(**kw), gpvi.Target(fn, names=3))
    assert part.info["steps"] == 27          # start check + Hessian probe + 27 steps done; the 30th call interrupted
    resumed = run_quiet(quiet(**kw), base, state=part.engine_state)
    assert torch.equal(resumed.mean, full.mean) and torch.equal(resumed.scale_tril, full.scale_tril)


RESUME_SCRIPT = textwrap.dedent("""
    import sys, warnings, torch, gpvi
    from gpvi.inference.salimans_knowles import SKGaussian
    from gpvi.models.logistic import BayesianLogisticRegression
    warnings.simplefilter("ignore")
    ds = gpvi.datasets.load_pima()
    model = BayesianLogisticRegression(ds.X_train, ds.y_train)
    state = torch.load(sys.argv[1], weights_only=False)
    q = SKGaussian(num_steps=120, seed=4, progress_bar=False, num_elbo_draws=100).run(model, state=state)
    torch.save({"mean": q.mean, "C": q.scale_tril, "bound": q.trace["bound"], "elbo": q.elbo}, sys.argv[2])
""")


@pytest.mark.slow
def test_resume_from_disk_in_new_process(pima, tmp_path):
    model, _ = pima
    kw = dict(num_steps=120, seed=4, num_elbo_draws=100)
    full = run_quiet(quiet(**kw), model)
    with pytest.warns(InterruptedRunWarning):
        part = run_quiet(quiet(**kw), model, callback=_stop_at(80))
    torch.save(part.state_dict()["engine_state"], tmp_path / "state.pt")
    (tmp_path / "resume.py").write_text(RESUME_SCRIPT)
    subprocess.run([sys.executable, str(tmp_path / "resume.py"), str(tmp_path / "state.pt"), str(tmp_path / "out.pt")],
                   check=True, cwd=ROOT, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                              "PYTHONPATH": str(ROOT)}, timeout=120)
    out = torch.load(tmp_path / "out.pt")
    assert torch.equal(out["mean"], full.mean) and torch.equal(out["C"], full.scale_tril)
    assert torch.equal(out["bound"], full.trace["bound"]) and out["elbo"] == full.elbo


# ================================================================================= posterior object, warm start
def test_gp_posterior_works_with_the_shared_posterior_api(gp_data):
    X, y = gp_data
    model = gpvi.GPRegression(X, y)
    q = run_quiet(quiet(num_steps=30, seed=0, num_elbo_draws=50), model, init=model.initial_theta())
    assert isinstance(q, GaussianPosterior) and q.names == model.names and q.info["hessian"] == "fd"
    assert q.info["log_joint_evals"] == 2 + 30 * (2 * model.dim + 1)      # start check, probe, S (2D + 1) per step
    assert q.summary().index == model.names
    pred = q.predict(X[:5], num_draws=10)
    assert pred.mean.shape == (5,) and bool(torch.isfinite(pred.var).all())
    idata = q.to_arviz(num_draws=50)
    assert set(idata.posterior.data_vars) == set(model.names)
    table = gpvi.metrics.compare(q, q, num_draws=200)
    assert max(abs(v) for v in table.column("dmean_sd")) < 1e-12
    assert "engine_state" in q.state_dict() and q.trace["pd"].shape == (30,)


def test_warm_start_from_posteriors():
    mu, Lam = correlated_gaussian(3)
    target = gaussian_target(mu, Lam)
    C = torch.tensor([[0.5, 0.0, 0.0], [0.1, 0.4, 0.0], [0.0, -0.2, 0.3]], dtype=torch.float64)
    q0 = GaussianPosterior(mu + 1.0, C, target.names, target)
    st = quiet(num_steps=5).init(target, q0)
    assert torch.allclose(st.stats["P"], torch.linalg.inv(C @ C.T), rtol=1e-10)
    assert torch.equal(st.m, mu + 1.0)
    st = quiet(num_steps=5, init_scale=[0.5, 1.0, 2.0]).init(target, PointPosterior(mu, target.names))
    assert torch.allclose(torch.diagonal(st.stats["P"]), torch.tensor([4.0, 1.0, 0.25], dtype=torch.float64))
    t_post = GaussianPosterior(mu, C, target.names, target, base=gpvi.numerics.families.StandardStudentT(3, df=4.0))
    with pytest.raises(ValueError, match="Gaussian"):
        quiet().init(target, t_post)


def test_interrupted_run_before_window_returns_current_q():
    mu, Lam = correlated_gaussian(2)
    with pytest.warns(InterruptedRunWarning):
        q = quiet(num_steps=10_000, seed=0).run(gaussian_target(mu, Lam), callback=_stop_at(5))
    assert q.info["interrupted"] and not q.info["averaged"] and q.info["steps"] == 5
    assert q.info["converged"] is False
    assert torch.equal(q.mean, q.engine_state.m)


def test_converged_is_the_window_split_check(pima):
    """info["converged"] (as DSVI's) is True exactly when the two halves of the averaging window agree within
    drift_tol, i.e. when no ConvergenceWarning is issued; the same run judged with a tolerance below its measured
    drift is not converged."""
    model, _ = pima
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        q = quiet(num_steps=200, seed=0, num_elbo_draws=0).run(model)
    assert q.info["converged"] and 0 < q.info["drift_mean_sd"] <= 0.5 and q.info["drift_log_sd"] <= 0.5
    tight = SKSchedule(drift_tol=0.5 * min(q.info["drift_mean_sd"], q.info["drift_log_sd"]))
    with pytest.warns(ConvergenceWarning, match="halves"):
        q2 = quiet(num_steps=200, seed=0, num_elbo_draws=0, schedule=tight).run(model)
    assert torch.equal(q2.mean, q.mean) and q2.info["converged"] is False


def test_a_start_where_the_log_joint_fails_is_refused_at_init():
    """One full-data evaluation in init (counted), then ValueError naming the start: no step is taken."""
    mu, Lam = correlated_gaussian(2)
    base = gaussian_target(mu, Lam)
    bad = gpvi.Target(lambda th: torch.where(th[:, 0] > 5, torch.full_like(th[:, 0], math.nan), base.log_joint(th)),
                      names=["a", "b"])
    with pytest.raises(ValueError, match=r"log joint is nan at the start theta=\[6, 0\]"):
        quiet(num_steps=50).run(bad, init=[6.0, 0.0])
    st = quiet(num_steps=50, method="gradient").init(bad, torch.zeros(2))
    assert st.counters["log_joint_calls"] == 1 and st.counters["log_joint_evals"] == 1
    with pytest.raises((TypeError, ValueError), match="seed must be a non-negative int"):
        SKGaussian(seed=True)                                  # the one seed check, gpvi.rng.check_seed


class _BigDraws(gpvi.Target):
    """A target that says one draw needs 1 MiB, and records the rows of every log-joint call without gradients."""

    def __init__(self, fn, names):
        super().__init__(fn, names=names)
        self.no_grad_rows: list[int] = []

    def log_joint(self, theta, *args, **kw):
        if not torch.is_grad_enabled():
            self.no_grad_rows.append(theta.shape[0])
        return super().log_joint(theta, *args, **kw)

    def memory_per_draw(self):
        return 1 << 20


def test_final_bound_estimate_is_chunked_by_the_memory_budget_and_does_not_depend_on_it():
    """The final estimate (600 draws) is evaluated in calls of budget.draws_per_call draws (64 for a 64 MiB budget
    at 1 MiB per draw; a 1 GiB budget allows 1024, capped by the block of 250 draws); its draws come in fixed
    blocks, so the estimate is the same bit for bit."""
    mu, Lam = correlated_gaussian(3)
    base = gaussian_target(mu, Lam)
    fn = lambda th: base.log_joint(th) - 0.05 * (th ** 4).sum(-1)     # noqa: E731 - not Gaussian: elbo_se > 0
    out = {}
    for name, budget in (("small", MemoryBudget(max_bytes=64 << 20)), ("default", MemoryBudget(max_bytes=1 << 30))):
        target = _BigDraws(fn, 3)
        q = driver_run(quiet(num_steps=30, seed=1, num_elbo_draws=600), target, budget=budget)
        out[name] = (q, target.no_grad_rows)
    q_small, rows_small = out["small"]
    q_default, rows_default = out["default"]
    assert max(rows_small) == 64 and sum(rows_small) == 600
    assert max(rows_default) == 250 and sum(rows_default) == 600
    assert q_small.elbo == q_default.elbo and q_small.elbo_se == q_default.elbo_se and q_small.elbo_se > 0
    assert q_small.info["memory"]["draws_per_call"] == 64


def test_run_never_changes_the_state_it_resumes_from(pima):
    """run(target, state=s) works on a copy; the posterior keeps a copy of the final state, not the live one."""
    model, _ = pima
    eng = quiet(num_steps=20, seed=5, num_elbo_draws=0)
    with pytest.warns(InterruptedRunWarning):
        part = run_quiet(eng, model, callback=_stop_at(8))
    s = part.engine_state
    before = s.state_dict()
    q = run_quiet(eng, model, state=s)
    after = s.state_dict()
    assert s.t == 8 and q.info["steps"] == 20
    assert torch.equal(before["m"], after["m"]) and torch.equal(before["generator_state"], after["generator_state"])
    assert q.engine_state is not s and q.engine_state.t == 20


# ================================================================================= validation
@pytest.mark.parametrize("kwargs, match", [
    (dict(num_steps=0), "num_steps"), (dict(method="newton"), "method"), (dict(hessian="exact"), "hessian"),
    (dict(method="gradient", hessian="fd"), "hessian"), (dict(num_draws=0), "num_draws"),
    (lambda: dict(schedule=SKSchedule(step_size=0.0)), "step_size"),
    (lambda: dict(schedule=SKSchedule(step_size=1.5)), "step_size"),
    (lambda: dict(schedule=SKSchedule(average_fraction=0.0)), "average_fraction"),
    (lambda: dict(hessian=HessianSource("fd", fd_step=0.0)), "fd_step"),
    (lambda: dict(hessian=HessianSource("fd", fd_step=0.5)), "fd_step"),
    (dict(init_scale=-1.0), "init_scale"), (lambda: dict(faults=SKFaultPolicy(on_non_pd="ignore")), "on_non_pd"),
    (lambda: dict(faults=SKFaultPolicy(max_resample=-1)), "max_resample"),
    (lambda: dict(faults=SKFaultPolicy(max_consecutive=0)), "max_consecutive"),
    (lambda: dict(schedule=SKSchedule(drift_tol=0.0)), "drift_tol"), (dict(window=0), "window"),
    (dict(num_elbo_draws=-1), "num_elbo_draws"), (lambda: dict(faults=gpvi.inference.contract.FaultPolicy(0)),
                                                  "max_consecutive"),
    (dict(seed=-3), "seed"), (dict(init_scale="big"), "init_scale"),
    (dict(method="gradient", num_draws=3), "num_draws"), (dict(draws="halton"), "draws"),
])
def test_bad_settings_raise_value_error_naming_argument(kwargs, match):
    """Option groups are validated where they are built (inside the ``raises`` block: hence the lambdas)."""
    with pytest.raises(ValueError, match=match):
        SKGaussian(**(kwargs() if callable(kwargs) else kwargs))


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_steps=2.5), "num_steps"), (dict(progress_bar="yes"), "progress_bar"),
    (dict(init_scale=None), "init_scale"), (dict(method=3), "method"), (dict(hessian=3), "hessian"),
    (dict(schedule=0.1), "schedule"), (dict(faults=3), "faults"),
])
def test_bad_setting_types_raise_type_error(kwargs, match):
    with pytest.raises(TypeError, match=match):
        SKGaussian(**kwargs)


def test_bad_run_inputs():
    mu, Lam = correlated_gaussian(3)
    target = gaussian_target(mu, Lam)
    with pytest.raises(ValueError, match="init"):
        quiet().init(target, torch.zeros(4))
    with pytest.raises(ValueError, match="init"):
        quiet().init(target, torch.tensor([0.0, math.nan, 0.0]))
    with pytest.raises(ValueError, match="init_scale"):
        quiet(init_scale=torch.ones(2)).init(target)
    with pytest.raises(TypeError, match="log_joint"):
        quiet().run(object())
    with pytest.raises(TypeError, match="callback"):
        quiet(num_steps=2).run(target, callback=3)
    st = quiet(num_steps=5).init(target)
    with pytest.raises(ValueError, match="state"):
        quiet(num_steps=5).run(target, torch.zeros(3), state=st)
    with pytest.raises(ValueError, match="num_steps"):
        quiet(num_steps=6).run(target, state=st)
    with pytest.raises(ValueError, match="method"):
        quiet(num_steps=5, method="gradient").run(target, state=st)
    with pytest.raises(TypeError, match="state"):
        quiet(num_steps=5).run(target, state=[1, 2])
    wrong = gpvi.Target(lambda th: th.sum(-1), names=3)
    wrong.log_joint = lambda th: th.sum()        # (S, D) -> () instead of (S,)
    with pytest.raises(ValueError, match="log_joint"):
        quiet().init(wrong)
    with pytest.raises(ValueError, match="hessian"):
        value_grad_hessian(target, torch.zeros(3), hessian="bfgs")
    with pytest.raises(ValueError, match="theta"):
        value_grad_hessian(target, torch.zeros(4))


# ================================================================================= Algorithm 1
def test_gamma_posterior_recovered_exactly_after_2_k_plus_1_steps():
    """Poisson counts with a Gamma(a0, b0) prior on the rate: the posterior Gamma(a0 + sum y, b0 + n) is in the
    family (k = 2), so Algorithm 1 with N = 2(k+1) = 6 steps recovers it exactly (eq. 13), and section 5's
    evidence estimate (eq. 19, s^2 = 0) equals the exact log marginal likelihood. Rounding-level tolerance."""
    a0, b0 = 2.0, 1.0
    y = torch.tensor([3.0, 1.0, 4.0, 1.0, 5.0], dtype=torch.float64)
    n, sy = y.numel(), float(y.sum())
    log_fact = float(torch.lgamma(y + 1).sum())

    def log_p(lam: torch.Tensor) -> torch.Tensor:     # log Gamma(lam | a0, b0) + sum_i log Poisson(y_i | lam)
        prior = a0 * math.log(b0) - math.lgamma(a0) + (a0 - 1) * torch.log(lam) - b0 * lam
        return prior + sy * torch.log(lam) - n * lam - log_fact

    exact_evidence = (a0 * math.log(b0) - math.lgamma(a0) - log_fact + math.lgamma(a0 + sy)
                      - (a0 + sy) * math.log(b0 + n))
    fam = Gamma()
    for seed in range(5):
        res = SKExpFamily(fam, num_steps=6, seed=seed).run(log_p, fam.natural(shape=a0, rate=b0))
        assert abs(res.params["shape"] - (a0 + sy)) < 1e-8 * (a0 + sy)
        assert abs(res.params["rate"] - (b0 + n)) < 1e-8 * (b0 + n)
        assert abs(res.log_evidence - exact_evidence) < 1e-8 * abs(exact_evidence)
        assert abs(res.log_bound - exact_evidence) < 1e-8 * abs(exact_evidence)
        assert res.r_squared == pytest.approx(1.0, abs=1e-10) and res.kl < 1e-12
        assert res.info["num_averaged"] == 3 and res.info["log_p_evals"] == 6


def test_exponential_example_of_section_4_0_1():
    """p(x) = 2 exp(-2x) (normalised, unknown to the method), q = rate eta, start rate 1 and C = I_2 (the paper's
    set-up): machine-precision recovery in 2(k+1) = 4 steps; the intercept is log 2 - U = 0 evidence."""
    fam = Exponential()
    for seed in range(10):
        res = SKExpFamily(fam, num_steps=4, init_C="identity", seed=seed).run(
            lambda x: math.log(2.0) - 2.0 * x, fam.natural(rate=1.0))
        assert abs(res.params["rate"] - 2.0) < 1e-12
        assert abs(res.log_evidence) < 1e-12


def test_normal_family_on_a_non_gaussian_target_reaches_the_kl_optimum():
    """log p = -x^4 / 4 with q = N(m, v): E_q[log p] = -3 v^2 / 4 (m = 0), so the KL optimum is v* = 1/sqrt(3).
    N = 4000 single draws (2000 averaged; the basic algorithm, no gradients): over 5 seeds |v - v*| <= 0.07 and
    |m| <= 0.043; asserted 0.15 (about 2x). Not in the family, so R^2 < 1 (observed 0.69-0.82) and the evidence
    estimate exceeds the bound (eq. 19)."""
    fam = Normal()
    res = SKExpFamily(fam, num_steps=4000, seed=0).run(lambda x: -x ** 4 / 4, fam.natural(mean=0.5, var=1.0))
    assert abs(res.params["var"] - 1 / math.sqrt(3)) < 0.15
    assert abs(res.params["mean"]) < 0.15
    assert 0.5 < res.r_squared < 1.0 and res.log_evidence > res.log_bound


def test_algorithm_1_faults_and_validation():
    fam = Gamma()
    with pytest.raises(ValueError, match="init"):
        SKExpFamily(fam, 10).run(lambda x: -x, torch.tensor([0.0, 1.0], dtype=torch.float64))   # rate < 0
    with pytest.raises(ValueError, match="init"):
        SKExpFamily(fam, 10).run(lambda x: -x, torch.tensor([0.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="num_steps"):
        SKExpFamily(fam, 1)
    with pytest.raises(ValueError, match="init_C"):
        SKExpFamily(fam, 10, init_C=torch.eye(2))
    with pytest.raises(ValueError, match="init_C"):
        SKExpFamily(fam, 10, init_C="prior")
    with pytest.raises(ValueError, match="rate"):
        fam.natural(shape=1.0, rate=-1.0)
    with pytest.raises(TypeError, match="family"):
        SKExpFamily(object(), 10)
    with pytest.raises(ValueError, match="log_p"):
        SKExpFamily(fam, 10).run(lambda x: x.sum(), fam.natural(1.0, 1.0))
    with pytest.raises(NumericalFaultError, match="non-finite"):
        SKExpFamily(fam, 10).run(lambda x: torch.full_like(x, math.nan), fam.natural(1.0, 1.0))
    # a posterior outside the family's support of proper members: log p increasing in x -> improper, clear error
    with pytest.raises(NumericalFaultError, match="proper"):
        SKExpFamily(Exponential(), 50).run(lambda x: 0.5 * x, Exponential().natural(rate=1.0))


def test_laplace_start_matches_the_curvature_at_the_initial_mean(pima, gp_data):
    """init_scale='laplace' (paper section 4: match the curvature of log g at the mode): V_1 = (-H(m_1))^-1, by
    autograd on logistic regression and by finite differences on a GP target (counted as 2D + 1 rows)."""
    model, _ = pima
    m0 = torch.full((model.dim,), 0.1, dtype=torch.float64)
    st = quiet(num_steps=10, init_scale="laplace").init(model, m0)
    _, _, H = value_grad_hessian(model, m0, hessian="autograd")
    assert torch.allclose(st.stats["P"], -H, rtol=1e-10, atol=1e-10)
    assert st.init_info["scale"] == "laplace" and st.counters["hessian_backward_passes"] == model.dim
    X, y = gp_data
    gp = gpvi.GPRegression(X, y)
    st = quiet(num_steps=10, method="gradient", init_scale="laplace").init(gp)
    _, _, H = value_grad_hessian(gp, gp.initial_theta(), hessian="fd")
    # at the data-scaled initial theta -H is indefinite here: the documented diagonal fallback 1/sqrt(-H_dd)
    assert float(torch.linalg.eigvalsh(-H)[0]) < 0 and st.init_info["scale"].startswith("laplace_diagonal")
    P1 = -st.stats["B"] @ torch.linalg.inv(st.stats["A"])                                  # P_1 = -B A^-1
    assert torch.allclose(P1, torch.diag(-torch.diagonal(H)), rtol=1e-10, atol=1e-10)
    assert st.counters["log_joint_evals"] == 1 + 2 * gp.dim + 1                          # start check + Hessian
    with pytest.raises(ValueError, match="init_scale"):
        SKGaussian(init_scale="mode")


# ================================================================================= draws before the window
def test_burn_in_draws_count_and_leave_the_window_alone():
    """``SKSchedule(burn_in_draws=2)``: 2 draws per step before the averaging window, ``num_draws`` in it (counted
    rows: the start check, then 50 x 2 + 50 x 4); on a Gaussian target the window's regression is still exact (the
    closed form, to rounding), and an odd count is refused for the antithetic pairs of ``method="gradient"``."""
    mu, Lam = correlated_gaussian(3)
    eng = quiet(num_steps=100, method="gradient", num_draws=4, schedule=SKSchedule(burn_in_draws=2),
                num_elbo_draws=0)
    q = eng.run(gaussian_target(mu, Lam), init=torch.zeros(3, dtype=torch.float64))
    assert q.info["log_joint_evals"] == 1 + 50 * 2 + 50 * 4
    assert q.info["settings"]["burn_in_draws"] == 2 and eng.schedule.draws_at(49, 100, 4) == 2
    assert eng.schedule.draws_at(50, 100, 4) == 4 and SKSchedule().draws_at(0, 100, 4) == 4
    assert (q.mean - mu).abs().max() < 1e-8 and (q.covariance - torch.linalg.inv(Lam)).abs().max() < 1e-8
    with pytest.raises(ValueError, match="burn_in_draws"):
        SKGaussian(method="gradient", num_draws=4, schedule=SKSchedule(burn_in_draws=3))
    with pytest.raises(ValueError, match="burn_in_draws"):
        SKSchedule(burn_in_draws=0)


# ================================================================================= the bound from the window's draws
def test_window_bound_matches_quadrature_and_is_exact_for_gaussians():
    """``num_elbo_draws="window"``: the final bound from the window's draws reweighted to the returned q, no new
    evaluation of the target. Gaussian target (normalised): q is exact, so every draw's log g - log q is 0 and so is
    the estimate (rounding). A skewed 2-D target: against the bound of the same q by 60 x 60 Gauss-Hermite
    quadrature (independent of the draws), within 5 of its standard errors (0.018 nats here; the Sobol' draws make
    the actual error smaller: 0.002 when written)."""
    mu, Lam = correlated_gaussian(3)
    eng = quiet(num_steps=60, method="gradient", num_draws=4, num_elbo_draws="window")
    q = eng.run(gaussian_target(mu, Lam), init=torch.zeros(3, dtype=torch.float64))
    assert abs(q.elbo) < 1e-9 and q.info["log_joint_evals"] == 1 + 60 * 4 and q.bound_draws is None
    assert "importance-weighted" in q.info["elbo_method"] and q.info["settings"]["num_elbo_draws"] == "window"

    def skewed(th):
        return -0.5 * th[..., 0] ** 2 - (th[..., 1] - 0.5 * th[..., 0] ** 2) ** 2 - 0.05 * th[..., 0] ** 4

    target = gpvi.Target(skewed, names=2)
    q = run_quiet(quiet(num_steps=400, method="gradient", num_draws=4, draws="sobol", num_elbo_draws="window"),
                  target, init=torch.zeros(2, dtype=torch.float64))
    x, w = (torch.from_numpy(a) for a in numpy.polynomial.hermite_e.hermegauss(60))
    w = w / math.sqrt(2 * math.pi)                                  # probabilists' Hermite: weights of N(0, 1)
    E = torch.stack(torch.meshgrid(x, x, indexing="ij"), -1).reshape(-1, 2)
    W = (w[:, None] * w[None, :]).reshape(-1)
    pts = q.mean + E @ q.scale_tril.T
    log_q = -0.5 * (E * E).sum(-1) - math.log(2 * math.pi) - torch.log(torch.diagonal(q.scale_tril)).sum()
    exact = float((W * (skewed(pts) - log_q)).sum())
    assert 0 < q.elbo_se < 0.05 and abs(q.elbo - exact) < 5 * q.elbo_se, (q.elbo, q.elbo_se, exact)
