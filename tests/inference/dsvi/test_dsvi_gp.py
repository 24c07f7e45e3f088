"""DSVI on GP hyperparameters (issue 4): the default path (MAP/Laplace start, ``optimizer="natural"``, stop on
convergence) against independent answers, predictions, the natural step's invariants, and bad input.

Independent answers used here:

* the optimum of the *same* Gaussian bound found deterministically: a quasi-Monte Carlo sample-average
  approximation (1024 scrambled-Sobol antithetic draws, fixed) maximised by L-BFGS over (mu, C) — no DSVI code;
* a short ``gpvi.NUTS`` run (marginal means and sds of the exact posterior, with its own Monte Carlo error);
* closed forms (a Gaussian target: the Laplace approximation and the bound optimum are both exact).

Tolerances are derived next to each assertion. All data are seeded; the file runs in ~30 s.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
import torch

import gpvi
from gpvi.inference.dsvi.starts import MAP_RESTARTS
from gpvi.inference.derivatives import finite_difference_hessian
from gpvi.inference.dsvi.engine import DSVI, DSVIState
from gpvi.inference.init import init_to_laplace, init_to_map
from gpvi.inference.laplace import laplace_approximation
from gpvi.exceptions import ConvergenceWarning, NumericalWarning
from gpvi.inference.mcmc.nuts import NUTS
from gpvi.posteriors import PointPosterior
from gpvi.numerics.predictive import MixturePredictive
from gpvi.inference.dsvi import Convergence, Natural
from gpvi.inference.schedules import DecayEveryK, RobbinsMonro

from tests.conftest import make_gp_data


def quiet_run(engine: DSVI, target, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return engine.run(target, *args, **kw)


@pytest.fixture(scope="module")
def synth():
    """N = 60, d = 2 synthetic GP regression (D = 4) and a held-out test set from the same function."""
    X, y = make_gp_data(n=80, d=2, seed=0, noise=0.1)
    model = gpvi.GPRegression(X[:60], y[:60])
    return model, X[60:], y[60:]


@pytest.fixture(scope="module")
def default_q(synth):
    model, _, _ = synth
    return DSVI(scale="full", seed=0, progress_bar=False).run(model)


def saa_optimum(model, num_points: int = 1024, seed: int = 7):
    """Maximise (1/M) sum_m log g(mu + C z_m) + sum_d log C_dd over (mu, C) with fixed QMC draws, by L-BFGS.

    z_m = Phi^-1(u_m) for scrambled Sobol points u_m, in antithetic pairs. C is lower triangular with
    log-parametrised diagonal. Independent of gpvi.inference.dsvi.engine (only model.log_joint and its first derivative).
    """
    from scipy.optimize import minimize

    D = model.dim
    u = torch.quasirandom.SobolEngine(D, scramble=True, seed=seed).draw(num_points // 2, dtype=torch.float64)
    z = torch.special.ndtri(u)
    z = torch.cat([z, -z])
    il = torch.tril_indices(D, D)

    def unpack(x):
        L = torch.zeros(D, D, dtype=torch.float64)
        L = L.index_put((il[0], il[1]), x[D:])
        d = torch.diagonal(L)
        return x[:D], L - torch.diag(d) + torch.diag(torch.exp(d))

    def f(xn):
        x = torch.tensor(xn, dtype=torch.float64, requires_grad=True)
        mu, C = unpack(x)
        val = model.log_joint(mu + z @ C.T).mean() + torch.log(torch.diagonal(C)).sum()
        (g,) = torch.autograd.grad(val, x)
        return -float(val.detach()), -g.numpy()

    lap = laplace_approximation(model)
    L0 = lap.scale_tril.clone()
    L0.diagonal().copy_(torch.log(torch.diagonal(L0)))
    x0 = np.concatenate([lap.mean.numpy(), L0[il[0], il[1]].numpy()])
    res = minimize(f, x0, jac=True, method="L-BFGS-B", options={"maxiter": 500, "gtol": 1e-9})
    mu, C = unpack(torch.tensor(res.x, dtype=torch.float64))
    return mu, C, lap


@pytest.fixture(scope="module")
def saa(synth):
    model, _, _ = synth
    return saa_optimum(model)


# ------------------------------------------------------------------------------------------ the default path
def test_default_gp_run_is_natural_from_laplace_and_stops_converged(synth, default_q):
    model, _, _ = synth
    q = default_q
    assert q.info["optimizer"] == "natural"
    assert q.info["init"]["mean"] == "map" and q.info["init"]["scale"] == "laplace"
    assert q.info["converged"] and q.info["stopped_on_convergence"]
    assert q.info["steps"] < 20_000 and q.info["steps"] % 100 == 0            # checked every window of 100
    assert q.info["returned"].startswith("average of the last 3 window(s) (300 iterates) since the bound's plateau")
    assert q.info["convergence"]["gap"] <= 0.01                              # the finish's estimate, in nats
    # MAP_RESTARTS restarts, all at one optimum: one start, one run
    assert q.info["init"]["optima"][0]["restarts"] == list(range(MAP_RESTARTS))
    assert len(q.info["init"]["optima"]) == 1
    assert len(q.info["starts"]) == 1 and q.info["starts_agree"] and q.info["start_chosen"] == 0
    assert q.info["starts"][0]["elbo"] == q.elbo
    assert isinstance(q.engine_state, DSVIState) and q.engine_state.optimizer == "natural"
    assert isinstance(DSVI().schedule_for(q.engine_state), RobbinsMonro)
    assert q.info["lr_mu"] == pytest.approx(0.05) and q.info["lr_C"] == pytest.approx(0.05)
    assert math.isfinite(q.elbo) and q.elbo_se < 0.1
    assert q.names == model.names and q.mean.dtype == torch.float64
    for k in ("resampled_draws", "dropped_draws", "skipped_steps", "c_shrinks", "c_rejects"):
        assert q.info[k] == 0, k


@pytest.mark.slow
def test_long_natural_run_reaches_the_bound_optimum(synth, saa):
    """DSVI ("natural", 2000 steps, Polyak over the last 1000) vs the deterministic optimum of the same bound.

    Tolerances: the Polyak average over T = 1000 iterates with S = 4 draws has error sd ~ 1/sqrt(S T) = 0.016
    posterior sds in the mean (test_dsvi.py's rule) and a similar relative error in the marginal sds; 5 of those
    = 0.08. The QMC optimum's own error is ~0.01 (1024 Sobol points; it agrees with a 4000-draw Monte Carlo SAA to
    that level). Laplace, the starting point, is 0.28 sd away in log_signal_var, so the check can fail.
    """
    model, _, _ = synth
    mu, C, lap = saa
    sd = torch.sqrt((C ** 2).sum(-1))
    q = DSVI(scale="full", seed=1, num_steps=2000, convergence=Convergence(stop=False), polyak=0.5,
             progress_bar=False).run(model)
    assert q.info["returned"].startswith("Polyak average of the last 1000")
    assert ((q.mean - mu) / sd).abs().max() < 0.08
    assert (q.stddev / sd - 1).abs().max() < 0.08
    cov_err = (q.covariance - C @ C.T) / torch.outer(sd, sd)                 # correlations too
    assert cov_err.abs().max() < 0.1
    assert ((lap.mean - mu) / sd).abs().max() > 0.2                          # the start was elsewhere


def test_default_run_is_close_to_the_bound_optimum(default_q, saa):
    """The stop-on-convergence run (3 windows of 100 iterates averaged) is within 0.2 sd / 10% of the optimum.

    The average of 300 autocorrelated iterates (rho ~ 0.03, autocorrelation ~ 30 steps, S = 4) has error sd
    ~ 0.05 sd per component; 0.2 is 4 of those; the sd tolerance likewise.
    """
    mu, C, _ = saa
    sd = torch.sqrt((C ** 2).sum(-1))
    assert ((default_q.mean - mu) / sd).abs().max() < 0.2
    assert (default_q.stddev / sd - 1).abs().max() < 0.1


@pytest.mark.slow
def test_default_run_agrees_with_nuts(synth, default_q):
    """Marginal means and sds of the default DSVI posterior against a short NUTS run.

    Allowed: |mean_q - mean_mc| / sd_mc <= 0.25 + 3 / sqrt(ESS) and sd_q / sd_mc in
    [0.75 - 3 se, 1.15 + 3 se], se = 1 / sqrt(2 ESS) (relative Monte Carlo error of an sd from ESS draws).
    The 0.25 / [0.75, 1.15] part is the Gaussian-approximation allowance: measured on this data set with a long
    NUTS run (4 x 5000 draws, ESS > 6000), the bound optimum differs from the posterior by at most 0.09 sd in the
    means, with sd ratios 0.88-0.99; plus the default run's own error (<= 0.2 sd, 10%, previous test).
    """
    model, _, _ = synth
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mc = NUTS(num_chains=2, num_warmup=250, num_draws=400, seed=0, progress_bar=False).run(model,
                                                                                               init=default_q)
    ess = mc.ess()
    mean_mc, sd_mc = mc.samples.mean(0), mc.samples.std(0)
    assert float(ess.min()) > 100                                               # the tolerance assumes this
    dmean = (default_q.mean - mean_mc).abs() / sd_mc
    assert bool((dmean <= 0.25 + 3 / ess.sqrt()).all()), dmean
    ratio, se = default_q.stddev / sd_mc, 1 / (2 * ess).sqrt()
    assert bool(((ratio >= 0.75 - 3 * se) & (ratio <= 1.15 + 3 * se)).all()), ratio
    table = gpvi.metrics.compare(default_q, mc)
    assert table.index == model.names


@pytest.mark.slow
def test_paper_sgd_from_the_same_start_has_the_same_fixed_point(synth, saa):
    """optimizer="sgd" (Algorithm 1 exactly) from the Laplace start ends at the same optimum (same bound).

    Algorithm 1 with the curvature rate and the paper's decay; Polyak average over the last 3000 of 6000 steps.
    Tolerance 0.15 sd / 12%: SGD's iterates on this problem (sds 0.2-0.8) are noisier than the natural
    steps' (the smallest-sd direction sets its rate), so twice the natural-step tolerance.
    """
    model, _, lap = synth[0], None, saa[2]
    mu, C, _ = saa
    sd = torch.sqrt((C ** 2).sum(-1))
    q = quiet_run(DSVI(optimizer="sgd", num_steps=6000, polyak=0.5, seed=2, progress_bar=False), model,
                  init=lap)
    assert q.info["optimizer"] == "sgd"
    assert ((q.mean - mu) / sd).abs().max() < 0.15
    assert (q.stddev / sd - 1).abs().max() < 0.12


# ------------------------------------------------------------------------------------------ predictions
def test_mixture_predictive_over_q_draws(synth, default_q):
    model, X_test, y_test = synth
    K = 40
    pred = default_q.predict(X_test, num_draws=K, seed=3)
    assert isinstance(pred, MixturePredictive) and pred.num_components == K
    theta = default_q.sample(K, seed=3)                                         # the same draws
    means = torch.stack([model.predict(t, X_test)[0] for t in theta])
    variances = torch.stack([model.predict(t, X_test)[1] for t in theta])
    assert torch.allclose(pred.mean, means.mean(0), atol=1e-10)
    assert torch.allclose(pred.var, (variances + means ** 2).mean(0) - means.mean(0) ** 2, atol=1e-10)
    lp = torch.logsumexp(torch.distributions.Normal(means, variances.sqrt()).log_prob(y_test), 0) - math.log(K)
    assert torch.allclose(pred.log_prob(y_test), lp, atol=1e-10)
    smse, nlpd = gpvi.metrics.smse(pred, y_test), gpvi.metrics.nlpd(pred, y_test)
    assert 0 < smse < 0.1 and math.isfinite(nlpd)                              # sin(3x) + x^2/2 is easy: SMSE ~ 0.01


def test_point_mass_q_predicts_like_ml2(synth):
    """A q with a negligible scale at the ML-II point gives the ML-II predictive (mixture of equal components)."""
    model, X_test, y_test = synth
    fit = gpvi.ML2(num_restarts=1, seed=0).run(model)
    narrow = gpvi.posteriors.gaussian.GaussianPosterior(fit.theta, 1e-12 * torch.eye(model.dim, dtype=torch.float64),
                                              model.names, model)
    a, b = narrow.predict(X_test, num_draws=5), fit.predict(X_test)
    assert torch.allclose(a.mean, b.mean, atol=1e-8) and torch.allclose(a.var, b.var, rtol=1e-8)
    assert torch.allclose(a.log_prob(y_test), b.log_prob(y_test), atol=1e-8)


def test_summary_by_name_on_both_scales(synth, default_q):
    model, _, _ = synth
    s = default_q.summary()
    assert s.index == model.names
    assert s.column("natural") == model.natural_names
    j = model.names.index("log_noise_var")
    assert s.column("nat_q50")[j] == pytest.approx(math.exp(s.column("q50")[j]), rel=1e-12)


# ------------------------------------------------------------------------------------------ natural step
def gaussian_target(m, Sigma):
    P = torch.linalg.inv(Sigma)

    def fn(th):
        r = th - m
        return -0.5 * ((r @ P) * r).sum(-1)

    return gpvi.Target(fn, names=m.shape[0])


def test_natural_optimizer_recovers_badly_scaled_gaussian_from_a_poor_start():
    """Gaussian target with sds 0.05 and 5 (condition number 1e4) and correlation 0.8, started at 0 with C = I.

    The bound's optimum is (m, Sigma) exactly. Polyak over the last 1500 of 3000 steps, S = 4: error sd of the
    mean ~ 1/sqrt(6000) = 0.013 target sds; assert 0.08 (6 sds). Same for the relative sds and correlation.
    """
    sds = torch.tensor([0.05, 5.0, 1.0], dtype=torch.float64)
    R = torch.tensor([[1.0, 0.8, 0.0], [0.8, 1.0, 0.3], [0.0, 0.3, 1.0]], dtype=torch.float64)
    Sigma = R * torch.outer(sds, sds)
    m = torch.tensor([1.0, -20.0, 3.0], dtype=torch.float64)
    target = gaussian_target(m, Sigma)
    eng = DSVI(optimizer="natural", num_steps=3000, convergence=Convergence(stop=False), polyak=0.5, init_scale=1.0,
               seed=0, progress_bar=False)
    q = quiet_run(eng, target, init=torch.zeros(3, dtype=torch.float64))
    assert q.info["init"]["scale"] == "init_scale" and q.info["init"]["mean"] == "given"
    assert ((q.mean - m) / sds).abs().max() < 0.08
    assert (q.stddev / sds - 1).abs().max() < 0.08
    corr = q.covariance / torch.outer(q.stddev, q.stddev)
    assert (corr - R).abs().max() < 0.08


def test_natural_steps_respect_the_kl_trust_region_and_keep_C_valid():
    """Every accepted step has Gaussian KL(q_new || q_old) <= max_step_kl (computed independently here)."""
    m = torch.tensor([0.0, 2.0], dtype=torch.float64)
    Sigma = torch.tensor([[1.0, 0.5], [0.5, 2.0]], dtype=torch.float64)
    target = gaussian_target(m, Sigma)
    kls, diag_ok = [], []
    prev = {}

    def cb(state, info):
        mu, C = state.mu.clone(), state.C.clone()
        if prev:
            q_new = torch.distributions.MultivariateNormal(mu, scale_tril=C)
            q_old = torch.distributions.MultivariateNormal(prev["mu"], scale_tril=prev["C"])
            kls.append(float(torch.distributions.kl_divergence(q_new, q_old)))
        diag_ok.append(bool((torch.diagonal(C) > 0).all()) and bool((torch.triu(C, 1) == 0).all()))
        prev.update(mu=mu, C=C)

    eng = DSVI(optimizer=Natural(lr=0.5, max_step_kl=0.05), num_steps=200, convergence=Convergence(stop=False),
               init_scale=0.01, seed=0, progress_bar=False)
    q = quiet_run(eng, target, init=torch.tensor([5.0, -5.0], dtype=torch.float64), callback=cb)
    assert max(kls) <= 0.05 * (1 + 1e-9) and all(diag_ok)
    assert q.info["trust_clips"] > 0                                           # the large rate does get clipped


def test_natural_resume_equals_uninterrupted(synth, tmp_path):
    model, _, _ = synth
    kw = dict(num_steps=300, convergence=Convergence(stop=False), polyak=0.5, num_elbo_draws=50, seed=4,
              progress_bar=False)
    # the default's Laplace start at the best MAP point, found once (a run from one start: resume is per run)
    start = dataclasses.replace(init_to_laplace(init_to_map(seed=0))(model), alternatives=())
    full = quiet_run(DSVI(**kw), model, init=start)

    def stop_at_120(state, info):
        if state.t == 120:
            raise KeyboardInterrupt

    with pytest.warns(gpvi.exceptions.InterruptedRunWarning):
        part = DSVI(**kw).run(model, init=start, callback=stop_at_120)
    torch.save(part.engine_state.state_dict(), tmp_path / "s.pt")
    state = DSVIState.from_state_dict(torch.load(tmp_path / "s.pt", weights_only=False))
    assert state.optimizer == "natural" and state.init_info["scale"] == "laplace"
    resumed = quiet_run(DSVI(**kw), model, state=state)
    assert torch.equal(resumed.mean, full.mean) and torch.equal(resumed.scale_tril, full.scale_tril)
    with pytest.raises(ValueError, match="optimizer"):
        DSVI(**{**kw, "optimizer": "sgd"}).run(model, state=part.engine_state.copy())


def test_generic_targets_keep_algorithm_1_defaults():
    target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=3)
    eng = DSVI(num_steps=1000, progress_bar=False)
    state = eng.init(target)
    assert state.optimizer == "sgd" and state.rho0_C == pytest.approx(0.1 * state.rho0_mu)
    assert isinstance(eng.schedule_for(state), DecayEveryK) and state.window.maxlen == 200
    assert torch.equal(state.C, 0.1 * torch.eye(3, dtype=torch.float64))
    assert eng.stop_rule().stops(state.optimizer) is False
    assert state.init_info["mean"] == "zeros"


# ------------------------------------------------------------------------------------------ Laplace helpers
def test_finite_difference_hessian_and_laplace_on_a_gaussian():
    Sigma = torch.tensor([[2.0, 0.6, 0.0], [0.6, 1.0, -0.3], [0.0, -0.3, 0.5]], dtype=torch.float64)
    m = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    target = gaussian_target(m, Sigma)
    H = finite_difference_hessian(target, torch.zeros(3, dtype=torch.float64))
    assert torch.allclose(H, -torch.linalg.inv(Sigma), atol=1e-8)             # quadratic: central differences exact
    lap = laplace_approximation(target)
    assert lap.info["mode"] == "map" and lap.info["scale"] == "laplace"
    assert torch.allclose(lap.mean, m, atol=1e-5)
    assert torch.allclose(lap.covariance, Sigma, atol=1e-6)


def test_laplace_falls_back_to_a_diagonal_when_not_concave():
    """log g = -x0^2/2 + x1^2/2 at 0: -H = diag(1, -1) is not PD -> scale diag(1, fallback)."""
    target = gpvi.Target(lambda th: -0.5 * th[..., 0] ** 2 + 0.5 * th[..., 1] ** 2, names=2)
    lap = laplace_approximation(target, mode=torch.zeros(2), fallback_scale=0.3)
    assert lap.info["scale"] == "laplace_diagonal"
    assert torch.allclose(torch.diagonal(lap.scale_tril), torch.tensor([1.0, 0.3], dtype=torch.float64))
    eng = DSVI(optimizer="natural", num_steps=5, convergence=Convergence(stop=False), num_elbo_draws=0,
               progress_bar=False)
    state = eng.init(target, torch.zeros(2))
    assert state.init_info["scale"] == "laplace_diagonal"
    assert torch.allclose(torch.diagonal(state.C), torch.tensor([1.0, 0.1], dtype=torch.float64))


# ------------------------------------------------------------------------------------------ faults
class FlakyGP:
    """A GP target whose log joint is -inf (a failed Cholesky) for draws with log_noise_var below a threshold."""

    def __init__(self, model, threshold):
        self.model, self.threshold = model, threshold
        self.names = model.names

    def log_marginal_likelihood(self, theta):
        return self.model.log_marginal_likelihood(theta)

    def initial_theta(self):
        return self.model.initial_theta()

    def log_joint(self, theta):
        lj = self.model.log_joint(theta)
        bad = theta[..., -1] < self.threshold
        return torch.where(bad, torch.full_like(lj, -math.inf), lj)


def test_failed_cholesky_draws_are_redrawn_counted_and_warned(synth, default_q):
    model, _, _ = synth
    j = model.names.index("log_noise_var")
    flaky = FlakyGP(model, float(default_q.mean[j] - 2.0 * default_q.stddev[j]))   # ~2% of q's draws fail
    with pytest.warns(NumericalWarning, match="resampled_draws"):
        q = quiet_run(DSVI(seed=0, num_elbo_draws=200, progress_bar=False), flaky,
                      init=default_q.mean)
    assert q.info["optimizer"] == "natural" and q.info["resampled_draws"] > 0
    assert q.info["skipped_steps"] == 0 and bool(torch.isfinite(q.mean).all())
    assert q.info["elbo_invalid"] >= 0 and math.isfinite(q.elbo)


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("make, match", [
    (lambda: DSVI(optimizer="newton"), "optimizer"), (lambda: Natural(max_step_kl=0.0), "max_step_kl"),
    (lambda: Convergence(window="big"), "window"), (lambda: Convergence(stop="yes"), "stop"),
    (lambda: DSVI(init_scale="laplace"), "init_scale"),
    (lambda: Natural(schedule="auto", schedule_options={"tau": 5}), "schedule"),
    (lambda: DSVI(convergence=Convergence), "convergence"),
])
def test_bad_settings_name_the_argument(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_bad_init_and_data(synth):
    model, _, _ = synth
    with pytest.raises(ValueError, match="init"):
        DSVI(progress_bar=False).run(model, init="map")
    with pytest.raises(ValueError, match="init must have length D = 4"):
        DSVI(progress_bar=False).run(model, init=torch.zeros(3))
    X = torch.rand(10, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="constant"):
        gpvi.GPRegression(X, torch.full((10,), 3.0))
    with pytest.raises(ValueError, match="at least 2"):
        gpvi.GPRegression(X[:1], torch.ones(1))
    with pytest.raises(ValueError, match="NaN|finite"):
        gpvi.GPRegression(X, torch.tensor([math.nan] + [1.0] * 9))
    from gpvi.models.minibatch import MinibatchTarget
    names = ["a", "b"]
    mb = MinibatchTarget(lambda th, idx: -0.5 * (th ** 2).sum(-1).unsqueeze(-1).expand(-1, len(idx)), 100, names,
                         batch_size=10)
    with pytest.raises(ValueError, match="laplace"):
        DSVI(progress_bar=False).init(mb, "laplace")
    assert DSVI().resolve_optimizer(mb) == "sgd"
    point = PointPosterior(torch.zeros(5, dtype=torch.float64), [f"p{i}" for i in range(5)])
    with pytest.raises(ValueError, match="D = 4"):
        DSVI(progress_bar=False).run(model, init=point)


def test_hessian_marks_points_where_the_log_joint_fails():
    """A shifted point with log g = -inf (a failed Cholesky gives a zero gradient) must not yield a finite H."""
    def fn(th):
        v = -0.5 * (th ** 2).sum(-1)
        return torch.where(th[..., 1] > 1e-5, torch.full_like(v, -math.inf), v)
    H = finite_difference_hessian(gpvi.Target(fn, names=2), torch.zeros(2))
    assert bool(torch.isnan(H[:, 1]).all()) and H[0, 0] == pytest.approx(-1.0)
    lap = laplace_approximation(gpvi.Target(fn, names=2), mode=torch.zeros(2), fallback_scale=0.2)
    assert lap.info["scale"] == "laplace_diagonal"
    assert torch.allclose(torch.diagonal(lap.scale_tril), torch.tensor([1.0, 0.2], dtype=torch.float64))
