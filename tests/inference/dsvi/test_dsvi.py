"""DSVI engine (Titsias & Lazaro-Gredilla 2014, Algorithm 1): correctness against closed forms and an independent
deterministic optimiser, unbiasedness, invariants, determinism, resume, faults and input validation.

Monte Carlo tolerances are derived next to each assertion. For Polyak averaging over T iterations with S draws
per step on a (near-)Gaussian target, the averaged mean has error covariance ~ Sigma / (S T) (the averaged
gradient noise, cov ~ H Sigma H / S, mapped through H^-1), i.e. sd 1/sqrt(S T) in posterior-sd units; we
assert at 5 of those sds (per-entry false-failure probability ~6e-7).
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import gpvi
from gpvi.inference.contract import FaultPolicy
from gpvi.inference.dsvi import SGD, Adam, BlockDiagonal, Convergence, Natural
from gpvi.inference.dsvi.engine import DSVI, DSVIState
from gpvi.exceptions import ConvergenceWarning, InterruptedRunWarning, NumericalFaultError, NumericalWarning
from gpvi.inference.quadrature_fit import fit_gaussian_quadrature
from gpvi.models.logistic import BayesianLogisticRegression
from gpvi.posteriors import GaussianPosterior, PointPosterior
from gpvi.inference.schedules import Constant, DecayEveryK, RobbinsMonro, make_schedule

ROOT = Path(__file__).resolve().parents[3]


def gaussian_target(m: torch.Tensor, A: torch.Tensor | None = None, normalised: bool = True) -> gpvi.Target:
    """log N(theta | m, A^-1) (A = I by default), batched."""
    D = m.shape[0]
    A = torch.eye(D, dtype=torch.float64) if A is None else A
    const = 0.5 * torch.logdet(A) - 0.5 * D * math.log(2 * math.pi) if normalised else 0.0

    def fn(th: torch.Tensor) -> torch.Tensor:
        r = th - m
        return -0.5 * ((r @ A) * r).sum(-1) + const

    return gpvi.Target(fn, names=D)


def quiet(**kw) -> DSVI:
    kw.setdefault("progress_bar", False)
    return DSVI(**kw)


def run_quiet(engine: DSVI, target, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return engine.run(target, *args, **kw)


# ------------------------------------------------------------------------------------------------ schedules
def test_schedules_values_and_validation():
    rm = RobbinsMonro(0.2, tau=10.0, kappa=1.0)
    assert rm(0) == 0.2 and rm(10) == pytest.approx(0.1) and rm(30) == pytest.approx(0.05)
    # kappa in (0.5, 1]: sum rho = inf, sum rho^2 < inf
    with pytest.raises(ValueError, match="kappa"):
        RobbinsMonro(0.1, kappa=0.5)
    with pytest.raises(ValueError, match="kappa"):
        RobbinsMonro(0.1, kappa=1.2)
    with pytest.raises(ValueError, match="tau"):
        RobbinsMonro(0.1, tau=0.0)
    d = DecayEveryK(1.0, factor=0.95, every=5)
    assert [d(t) for t in (0, 4, 5, 10)] == [1.0, 1.0, 0.95, pytest.approx(0.9025)]
    with pytest.raises(ValueError, match="factor"):
        DecayEveryK(1.0, factor=1.5)
    with pytest.raises(ValueError, match="every"):
        DecayEveryK(1.0, every=0)
    with pytest.raises(ValueError, match="rho0"):
        Constant(-1.0)
    with pytest.raises(ValueError, match="t must be"):
        Constant(1.0)(-1)
    assert make_schedule("decay", 0.1, num_steps=100_000).every == 5000
    with pytest.raises(ValueError, match="schedule"):
        make_schedule("cosine", 0.1)
    with pytest.raises(ValueError, match="unknown options"):
        make_schedule("decay", 0.1, kappa=0.7)


# ------------------------------------------------------------------------------------------------ paper example 1
def test_gaussian_target_recovered_full_scale():
    """Section 2.2 / Figure 1: log g = log N(theta | m, I), D = 10, m = 2*1, mu0 = 0 -> mu = m, CC^T = I."""
    D, S, T, frac = 10, 4, 3000, 0.5
    m = torch.full((D,), 2.0, dtype=torch.float64)
    q = run_quiet(quiet(num_draws=S, num_steps=T, optimizer=SGD(lr=0.5, schedule="constant"), polyak=frac, seed=0),
                  gaussian_target(m), init=torch.zeros(D))
    T_avg = int(frac * T)
    assert q.info["polyak_n"] == T_avg
    # mean: Polyak-averaged error sd = 1/sqrt(S T_avg) = 0.0129 per coordinate; 5 sd
    sd_mu = 1.0 / math.sqrt(S * T_avg)
    assert float((q.mean - m).abs().max()) < 5 * sd_mu
    # covariance: linearising the C update at C = I, the averaged C has sd 1/sqrt(S T_avg) off the diagonal and
    # 1/sqrt(2 S T_avg) on it, so Sigma = CC^T has sd ~1/sqrt(S T_avg) off and 2/sqrt(2 S T_avg) on the diagonal
    err = q.covariance - torch.eye(D, dtype=torch.float64)
    assert float(err.diagonal().abs().max()) < 5 * 2 / math.sqrt(2 * S * T_avg)
    assert float((err - torch.diag(err.diagonal())).abs().max()) < 5 * sd_mu
    # normalised target: the optimal bound is log Z = 0; the final estimate has its own MC standard error
    assert abs(q.elbo) < 5 * q.elbo_se + 0.01
    assert q.trace["bound"].shape == (T,) and q.trace["bound_avg"].shape == (T,)
    # the rolling average of the bound at the (noisy) iterates sits below the optimum 0 by the stationary gap of a
    # constant rate: per coordinate Var(mu_t) = rho / (S (2 - rho)), so E[gap] >= D/2 * 0.083 = 0.42 (mean part);
    # from -20 at mu0 it must reach [-3 * 0.42, 5 * 0.08] (0.08 ~ sd of a 200-window average of a bound with sd 1.1)
    gap = D / 2 * 0.5 / (S * 1.5)
    assert float(q.trace["bound"][0]) < -15
    assert -3 * gap < float(q.trace["bound_avg"][-1]) < 0.4


def test_gaussian_target_recovered_diag_scale():
    """Eq. 9 with a diagonal target: precision diag(1, 4, 9, ...), mean recovered and c_d = 1/sqrt(A_dd)."""
    D, S, T, frac = 6, 4, 3000, 0.5
    prec = torch.arange(1, D + 1, dtype=torch.float64) ** 2 / 4.0
    m = torch.linspace(-2, 2, D, dtype=torch.float64)
    q = run_quiet(quiet(scale="diag", num_draws=S, num_steps=T, optimizer=SGD(schedule="constant"), polyak=frac,
                        seed=1),
                  gaussian_target(m, torch.diag(prec)), init=torch.zeros(D))
    assert torch.count_nonzero(q.scale_tril - torch.diag(torch.diagonal(q.scale_tril))) == 0
    sd_true = prec.rsqrt()
    T_avg = int(frac * T)
    # lr='auto' gives rho = 0.5 / max(prec): the slowest direction has correlation time 2 kappa = 2 * 9 steps,
    # still << T_avg, so the 1/sqrt(S T_avg) sd in posterior units applies
    assert float(((q.mean - m) / sd_true).abs().max()) < 5 / math.sqrt(S * T_avg)
    assert float((q.stddev / sd_true - 1).abs().max()) < 5 / math.sqrt(2 * S * T_avg) + 0.01


# ------------------------------------------------------------------------------------------------ paper example 2
@pytest.fixture(scope="module")
def pima_reference():
    ds = gpvi.datasets.load_pima()
    model = BayesianLogisticRegression(ds.X_train, ds.y_train)
    return model, fit_gaussian_quadrature(model)


def test_pima_quadrature_bound_matches_monte_carlo(pima_reference):
    """The deterministic reference's bound (Gauss-Hermite) equals an MC estimate of eq. 4 at the same (mu, C)."""
    model, ref = pima_reference
    assert ref.info["converged"]
    est, se, bad = quiet().estimate_bound(model, ref.mean, ref.scale_tril, num_draws=20_000, seed=3)
    assert bad == 0
    assert abs(est - ref.elbo) < 5 * se                   # se ~ 0.015 with 20 000 draws


def test_pima_logistic_regression_matches_deterministic_optimum(pima_reference):
    """Section 3.1: concave bound, unique optimum; DSVI's (mu, CC^T) equal L-BFGS + quadrature's."""
    model, ref = pima_reference
    S, T, frac = 4, 4000, 0.5
    q = run_quiet(quiet(num_draws=S, num_steps=T, polyak=frac, seed=0), model)
    T_avg = int(frac * T)
    sd = ref.stddev
    # mean in posterior-sd units: sd 1/sqrt(S T_avg) = 0.0112 (valid as the correlation time 2 kappa << T_avg)
    dmu = (q.mean - ref.mean) / sd
    assert float(dmu.abs().max()) < 5 / math.sqrt(S * T_avg)
    # covariance in correlation units: entries of Sigma fluctuate like those of the Gaussian case above,
    # sd <= 2/sqrt(2 S T_avg) = 0.0158 -> 5 sd
    dSig = (q.covariance - ref.covariance) / (sd[:, None] * sd[None, :])
    assert float(dSig.abs().max()) < 5 * 2 / math.sqrt(2 * S * T_avg)
    # the bound at DSVI's answer is at most the optimum (second-order gap, negligible) within its MC error
    assert abs(q.elbo - ref.elbo) < 5 * q.elbo_se
    # the comparison is able to fail: the initial point is far from the optimum in these units
    assert float(((model.initial_theta() - ref.mean) / sd).abs().max()) > 1.0


# ------------------------------------------------------------------------------------------------ unbiasedness
@pytest.mark.parametrize("scale,base", [("full", "normal"), ("diag", "normal"), ("full", "t")])
def test_stochastic_gradient_is_unbiased_for_quadratic(scale, base):
    """Average of many single-sample DSVI gradients == exact gradient of the bound, log g = -(t-m)^T A (t-m)/2.

    Exact: grad_mu F = -A (mu - m); grad_C F = tril(-A C diag(Var z)) + diag(1/C_dd)  (diag: the diagonal).
    """
    D = 4
    g = torch.Generator().manual_seed(5)
    B = torch.randn(D, D, generator=g, dtype=torch.float64)
    A = B @ B.T / D + torch.eye(D, dtype=torch.float64)
    m = torch.randn(D, generator=g, dtype=torch.float64)
    mu = torch.randn(D, generator=g, dtype=torch.float64)
    C = torch.tril(torch.randn(D, D, generator=g, dtype=torch.float64) * 0.3) + torch.diag(
        torch.rand(D, generator=g, dtype=torch.float64) + 0.5)
    df = 7.0 if base == "t" else None
    eng = quiet(scale=scale, base=("t", df) if df else base, num_draws=1, optimizer=SGD(lr=0.1), init_scale=1.0)
    target = gaussian_target(m, A, normalised=False)
    state = eng.init(target, mu)
    varz = df / (df - 2) if df else 1.0
    if scale == "diag":
        c = torch.diagonal(C)
        state.C = c.clone()
        exact_C = -torch.diagonal(A) * c * varz + 1 / c
    else:
        state.C = C.clone()
        exact_C = torch.tril(-A @ C * varz) + torch.diag(1 / torch.diagonal(C))
    exact_mu = -A @ (mu - m)
    K = 3000
    gm = torch.empty(K, D, dtype=torch.float64)
    gC = torch.empty((K,) + tuple(exact_C.shape), dtype=torch.float64)
    for k in range(K):
        est = eng.estimate_gradient(target, state)
        gm[k], gC[k] = est.grad_mu, est.grad_C
    assert torch.equal(state.mu, mu)                      # estimate_gradient changes nothing but the generator
    se_mu = gm.std(0) / math.sqrt(K)
    assert bool(((gm.mean(0) - exact_mu).abs() <= 5 * se_mu).all())
    se_C = gC.std(0) / math.sqrt(K)
    dev = (gC.mean(0) - exact_C).abs()
    if scale == "full":
        assert torch.count_nonzero(torch.triu(gC.mean(0), 1)) == 0
        low = torch.tril(torch.ones(D, D, dtype=torch.bool))
        assert bool((dev[low] <= 5 * se_C[low] + 1e-12).all())
    else:
        assert bool((dev <= 5 * se_C + 1e-12).all())
    # able to fail: the expected gradient is far from zero compared with its standard error
    assert float((exact_mu.abs() / se_mu).max()) > 10


# ------------------------------------------------------------------------------------------------ invariants
@pytest.mark.parametrize("scale", ["full", "diag"])
def test_C_lower_triangular_with_positive_diagonal_throughout(scale):
    """Aggressive C steps (rho_C * curvature >> 1) trigger the shrink rule; C never loses positivity/shape."""
    D = 5
    A = torch.diag(torch.full((D,), 100.0, dtype=torch.float64))
    target = gaussian_target(torch.zeros(D, dtype=torch.float64), A)
    seen = {"n": 0}

    def check(state: DSVIState, info):
        C = state.C
        if scale == "full":
            assert torch.count_nonzero(torch.triu(C, 1)) == 0
            assert bool((torch.diagonal(C) > 0).all())
        else:
            assert C.shape == (D,) and bool((C > 0).all())
        seen["n"] += 1

    eng = quiet(scale=scale, num_steps=400, optimizer=SGD(lr=1e-3, lr_scale=50.0, schedule="constant"), init_scale=1.0,
                seed=0)
    q = run_quiet(eng, target, init=torch.zeros(D), callback=check)
    assert seen["n"] == 400
    assert q.info["c_shrinks"] > 0                       # the rule was exercised
    assert bool((torch.diagonal(q.scale_tril) > 0).all())


# ------------------------------------------------------------------------------------------------ determinism
def test_identical_seeds_identical_runs_and_no_global_rng():
    m = torch.full((3,), 1.0, dtype=torch.float64)
    target = gaussian_target(m)
    before = torch.random.get_rng_state()
    q1 = run_quiet(quiet(num_steps=300, seed=7), target)
    q2 = run_quiet(quiet(num_steps=300, seed=7), target)
    q3 = run_quiet(quiet(num_steps=300, seed=8), target)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(q1.mean, q2.mean) and torch.equal(q1.scale_tril, q2.scale_tril)
    assert torch.equal(q1.trace["bound"], q2.trace["bound"]) and q1.elbo == q2.elbo
    assert not torch.equal(q1.mean, q3.mean)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(run_quiet(quiet(num_steps=50), target, generator=g1).mean,
                       run_quiet(quiet(num_steps=50), target, generator=g2).mean)
    assert q1.mean.dtype == torch.float64 and q1.scale_tril.dtype == torch.float64


# ------------------------------------------------------------------------------------------------ resume
def _stop_at(t_stop: int):
    def cb(state, info):
        if state.t == t_stop:
            raise KeyboardInterrupt
    return cb


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_resume_equals_uninterrupted_in_process(optimizer):
    m = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    target = gaussian_target(m)
    kw = dict(num_steps=500, optimizer=optimizer, polyak=0.5, convergence=Convergence(window=50), seed=11,
              num_elbo_draws=200)
    full = run_quiet(quiet(**kw), target)
    with pytest.warns(InterruptedRunWarning):
        part = run_quiet(quiet(**kw), target, callback=_stop_at(180))
    assert part.info["interrupted"] and part.info["steps"] == 180
    state = DSVIState.from_state_dict(part.engine_state.state_dict())
    resumed = run_quiet(quiet(**kw), target, state=state)
    assert torch.equal(resumed.mean, full.mean) and torch.equal(resumed.scale_tril, full.scale_tril)
    assert torch.equal(resumed.trace["bound"], full.trace["bound"])
    assert resumed.elbo == full.elbo and resumed.info["steps"] == 500


def test_ctrl_c_inside_a_step_rewinds_its_randomness():
    """A KeyboardInterrupt raised inside log_joint (Ctrl-C mid-step) leaves a state that resumes exactly."""
    m = torch.tensor([0.5, 2.0], dtype=torch.float64)
    base = gaussian_target(m)
    calls = {"n": 0}

    def fn(th):
        calls["n"] += 1
        if calls["n"] == 120:
            raise KeyboardInterrupt
        return base.log_joint(th)

    kw = dict(num_steps=300, seed=2, num_elbo_draws=100)
    full = run_quiet(quiet(**kw), base)
    with pytest.warns(InterruptedRunWarning):
        part = run_quiet(quiet(**kw), gpvi.Target(fn, names=2))
    resumed = run_quiet(quiet(**kw), base, state=part.engine_state)
    assert torch.equal(resumed.mean, full.mean) and torch.equal(resumed.scale_tril, full.scale_tril)


RESUME_SCRIPT = textwrap.dedent("""
    import sys, warnings, torch, gpvi
    from gpvi.inference.dsvi.engine import DSVI
    from gpvi.models.logistic import BayesianLogisticRegression
    warnings.simplefilter("ignore")
    ds = gpvi.datasets.load_pima()
    model = BayesianLogisticRegression(ds.X_train, ds.y_train)
    state = torch.load(sys.argv[1], weights_only=False)
    q = DSVI(num_steps=400, seed=4, progress_bar=False, num_elbo_draws=100).run(model, state=state)
    torch.save({"mean": q.mean, "C": q.scale_tril, "bound": q.trace["bound"], "elbo": q.elbo}, sys.argv[2])
""")


def test_resume_from_disk_in_new_process(tmp_path):
    ds = gpvi.datasets.load_pima()
    model = BayesianLogisticRegression(ds.X_train, ds.y_train)
    kw = dict(num_steps=400, seed=4, num_elbo_draws=100)
    full = run_quiet(quiet(**kw), model)
    with pytest.warns(InterruptedRunWarning):
        part = run_quiet(quiet(**kw), model, callback=_stop_at(150))
    torch.save(part.state_dict()["engine_state"], tmp_path / "state.pt")
    (tmp_path / "resume.py").write_text(RESUME_SCRIPT)
    subprocess.run([sys.executable, str(tmp_path / "resume.py"), str(tmp_path / "state.pt"), str(tmp_path / "out.pt")],
                   check=True, cwd=ROOT, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                              "PYTHONPATH": str(ROOT)}, timeout=120)
    out = torch.load(tmp_path / "out.pt")
    assert torch.equal(out["mean"], full.mean) and torch.equal(out["C"], full.scale_tril)
    assert torch.equal(out["bound"], full.trace["bound"]) and out["elbo"] == full.elbo


# ------------------------------------------------------------------------------------------------ Student-t phi
def test_student_t_base_recovers_student_t_target():
    """Section 2.1: phi = independent t_nu; the target is exactly such a q (m, C_true), so KL = 0 at the optimum."""
    nu, D = 5.0, 3
    m = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    Ct = torch.tensor([[1.0, 0, 0], [0.5, 0.7, 0], [-0.3, 0.2, 1.5]], dtype=torch.float64)
    tdist = torch.distributions.StudentT(torch.tensor(nu, dtype=torch.float64))

    def fn(th):
        z = torch.linalg.solve_triangular(Ct, (th - m).T, upper=False).T
        return tdist.log_prob(z).sum(-1) - torch.log(torch.diagonal(Ct)).sum()

    S, T, frac = 4, 3000, 0.5
    iterates = []
    eng = quiet(base=gpvi.numerics.families.StandardStudentT(D, nu), num_draws=S, num_steps=T, polyak=frac, init_scale=1.0, seed=3)
    q = run_quiet(eng, gpvi.Target(fn, names=D), init=torch.zeros(D),
                  callback=lambda s, i: iterates.append(torch.cat([s.mu, s.C.flatten()])) if s.t > T * (1 - frac)
                  else None)
    # batch means over the Polyak window give the MC standard error of the averaged iterate (20 batches)
    it = torch.stack(iterates)
    se = it.reshape(20, -1, it.shape[1]).mean(1).std(0) / math.sqrt(20)
    got = torch.cat([q.mean, q.scale_tril.flatten()])
    want = torch.cat([m, Ct.flatten()])
    low = torch.cat([torch.ones(D, dtype=torch.bool), torch.tril(torch.ones(D, D, dtype=torch.bool)).flatten()])
    assert bool(((got - want).abs()[low] <= 5 * se[low] + 0.01).all())   # + 0.01: O(rho) bias of constant-ish steps
    assert float(se[low].max()) < 0.02                                   # the check is informative
    assert abs(q.elbo) < 5 * q.elbo_se + 0.01                            # normalised target: optimum bound = 0
    assert isinstance(q.base, gpvi.numerics.families.StandardStudentT)
    assert bool(torch.isinf(q.covariance).any()) is False and q.covariance.shape == (D, D)


# ------------------------------------------------------------------------------------------------ faults
def test_nan_draws_are_resampled_counted_and_warned():
    m = torch.zeros(2, dtype=torch.float64)
    base = gaussian_target(m)

    def fn(th):
        out = base.log_joint(th)
        return torch.where(th[:, 0] > 1.5, torch.full_like(out, math.nan), out)

    eng = quiet(num_steps=400, init_scale=1.0, optimizer=SGD(lr=0.1), seed=0, num_elbo_draws=300)
    with pytest.warns(NumericalWarning):
        q = run_quiet(eng, gpvi.Target(fn, names=2), init=m)
    assert q.info["resampled_draws"] > 0
    assert q.info["log_joint_calls"] > q.info["steps"]          # extra calls only for the redrawn rows
    assert q.info["skipped_steps"] == 0
    assert bool(torch.isfinite(q.mean).all()) and math.isfinite(q.elbo)
    assert q.info["elbo_invalid"] > 0                          # reported, not hidden


def test_log_joint_called_once_per_step_on_whole_batch():
    m = torch.ones(3, dtype=torch.float64)
    base = gaussian_target(m)
    shapes = []

    def fn(th):
        shapes.append(tuple(th.shape))
        return base.log_joint(th)

    run_quiet(quiet(num_steps=50, num_draws=6, seed=0, num_elbo_draws=0, optimizer=SGD(lr=0.1)),
              gpvi.Target(fn, names=3))
    # init probes: 1 call at mu0, 20 power iterations for lr='auto' is skipped here (lr given)
    assert shapes[0] == (1, 3)
    assert shapes[1:] == [(6, 3)] * 50


def test_consecutive_failures_raise_with_last_good_state():
    m = torch.zeros(2, dtype=torch.float64)
    base = gaussian_target(m)
    calls = {"n": 0}
    good = {}

    def fn(th):
        calls["n"] += 1
        out = base.log_joint(th)
        return out if calls["n"] <= 31 else torch.full_like(out, -math.inf)    # 1 probe + 30 good steps

    def cb(state, info):
        if not info["skipped"]:
            good["mu"], good["C"], good["t"] = state.mu.clone(), state.C.clone(), state.t

    eng = quiet(num_steps=1000, optimizer=SGD(lr=0.1), faults=FaultPolicy(max_consecutive=5, max_resample=2), seed=0)
    with pytest.warns(NumericalWarning), pytest.raises(NumericalFaultError, match="consecutive") as exc:
        eng.run(gpvi.Target(fn, names=2), init=m, callback=cb)
    st = exc.value.state
    assert isinstance(st, DSVIState) and good["t"] == 30
    assert torch.equal(st.mu, good["mu"]) and torch.equal(st.C, good["C"])
    assert st.counters["skipped_steps"] == 5 and st.t == 35
    assert isinstance(exc.value.partial, GaussianPosterior)


def test_keyboard_interrupt_returns_partial_posterior():
    target = gaussian_target(torch.zeros(2, dtype=torch.float64))
    with pytest.warns(InterruptedRunWarning):
        q = quiet(num_steps=10_000, seed=0).run(target, callback=_stop_at(25))
    assert q.info["interrupted"] and q.info["steps"] == 25 and q.trace["bound"].shape == (25,)
    assert q.engine_state.t == 25


def test_gp_regression_target_runs():
    """The GP target (issue 4's use): batched Cholesky log joint, -inf rows resampled if any."""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(30, 2, generator=g, dtype=torch.float64)
    y = torch.sin(3 * X[:, 0]) + 0.1 * torch.randn(30, generator=g, dtype=torch.float64)
    model = gpvi.GPRegression(X, y)
    q = run_quiet(quiet(num_steps=200, seed=0, num_elbo_draws=50), model)
    assert q.mean.shape == (model.dim,) and math.isfinite(q.elbo) and q.names == model.names
    assert q.info["lr_mu"] > 0 and q.summary().index == model.names


# ------------------------------------------------------------------------------------------------ structure
def test_blocks_and_fixed_mean_mask():
    D = 5
    B = torch.zeros(D, D, dtype=torch.float64)
    B[:2, :2] = torch.tensor([[2.0, 0.8], [0.8, 1.0]])
    B[2:, 2:] = torch.tensor([[1.0, 0.3, 0.0], [0.3, 1.5, 0.2], [0.0, 0.2, 1.0]])
    m = torch.tensor([1.0, 2.0, 0.0, -1.0, 0.5], dtype=torch.float64)
    fixed = torch.tensor([False, False, True, False, False])
    eng = quiet(scale=BlockDiagonal([2, 3]), num_steps=2000, optimizer=SGD(fixed_mean=fixed), polyak=0.5, seed=0)
    init = torch.zeros(D, dtype=torch.float64)
    q = run_quiet(eng, gaussian_target(m, B), init=init)
    assert float(q.mean[2]) == 0.0                              # held at its initial value (m_2 = 0 anyway)
    assert torch.count_nonzero(q.scale_tril[2:, :2]) == 0       # no cross-block entries
    assert float((q.covariance - torch.linalg.inv(B)).abs().max()) < 0.15   # 5 sd of ~1/sqrt(S T_avg)=0.016 * var
    with pytest.raises(ValueError, match="blocks"):
        quiet(scale=BlockDiagonal([2, 2])).init(gaussian_target(m, B))
    with pytest.raises(ValueError, match="blocks"):
        quiet(scale=BlockDiagonal([[0, 1], [1, 2, 3, 4]])).init(gaussian_target(m, B))
    with pytest.raises(TypeError, match="blocks"):
        BlockDiagonal("ab")


def test_init_options():
    D = 3
    target = gaussian_target(torch.ones(D, dtype=torch.float64))
    eng = quiet(num_steps=10, optimizer=SGD(lr=0.1))
    st = eng.init(target, PointPosterior(torch.full((D,), 0.5, dtype=torch.float64), target.names))
    assert torch.equal(st.mu, torch.full((D,), 0.5, dtype=torch.float64))
    assert torch.equal(st.C, 0.1 * torch.eye(D, dtype=torch.float64))       # default init_scale
    L = torch.tensor([[1.0, 0, 0], [0.2, 0.5, 0], [0.1, 0.1, 2.0]], dtype=torch.float64)
    warm = GaussianPosterior(torch.zeros(D, dtype=torch.float64), L, target.names)
    assert torch.equal(eng.init(target, warm).C, L)
    assert torch.allclose(quiet(scale="diag").init(target, warm).C, torch.sqrt((L ** 2).sum(-1)))
    assert torch.equal(eng.init(target).mu, torch.zeros(D, dtype=torch.float64))   # no initial_theta: zeros


# ------------------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("kwargs,match", [
    (dict(num_steps=0), "num_steps"), (dict(num_draws=0), "num_draws"), (dict(base=("t", -1.0)), "df"),
    (dict(base=("t", 0.0)), "df"), (dict(scale="banana"), "scale"), (dict(polyak=1.5), "polyak"),
    (dict(optimizer="lbfgs"), "optimizer"), (dict(base="laplace"), "base"),
    (dict(faults=FaultPolicy(max_consecutive=5), num_elbo_draws=-1), "num_elbo_draws"),
    (dict(init_scale=0.0), "init_scale"), (dict(seed=-3), "seed"),
])
def test_bad_settings_raise_value_error_naming_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DSVI(**kwargs)


@pytest.mark.parametrize("make,match", [
    (lambda: SGD(lr=-0.1), "lr"), (lambda: SGD(lr=0.0), "lr"), (lambda: Natural(lr="fast"), "lr"),
    (lambda: SGD(lr_scale=-1.0), "lr_scale"), (lambda: Adam(schedule="cosine"), "schedule"),
    (lambda: SGD(schedule=RobbinsMonro(0.1), lr=0.1), "lr"),
    (lambda: SGD(schedule="robbins_monro", schedule_options={"kappa": 0.2}), "kappa"),
    (lambda: SGD(schedule_options={"tau": 5}), "schedule"), (lambda: SGD(fixed_mean=[0.5, 1.0]), "fixed_mean"),
    (lambda: Natural(max_step_kl=0.0), "max_step_kl"), (lambda: Adam(betas=(0.9, 1.0)), "betas"),
    (lambda: Adam(eps=0.0), "eps"), (lambda: Convergence(window=0), "window"), (lambda: Convergence(tol=0.0), "tol"),
    (lambda: Convergence(stop="yes"), "stop"), (lambda: FaultPolicy(max_resample=-1), "max_resample"),
])
def test_bad_option_objects_raise_value_error_naming_the_field(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_constructor_is_small_and_options_read_back():
    import inspect

    assert len(inspect.signature(DSVI).parameters) <= 12
    eng = DSVI(BlockDiagonal([2, 1]), ("t", 4.0), optimizer=Adam(lr=0.02, betas=(0.8, 0.99)),
               convergence=Convergence(window=10, stop=False), faults=FaultPolicy(3, 1), progress_bar=False)
    s = eng.settings()
    assert s["scale"] == "full" and s["blocks"] == [2, 1] and s["base"] == "('t', 4.0)"
    assert s["optimizer"]["name"] == "adam" and s["optimizer"]["betas"] == [0.8, 0.99] and s["window"] == 10
    assert s["max_resample"] == 1 and s["max_consecutive"] == 3 and s["stop"] is False
    assert repr(eng.optimizer) == "Adam(lr=0.02, betas=(0.8, 0.99))"
    assert DSVI(optimizer="natural").optimizer.max_step_kl == 0.1 and DSVI().optimizer == "auto"


# ------------------------------------------------------------------------------------------------ bad starts
def test_a_start_where_the_log_joint_or_its_gradient_fails_is_refused_at_init():
    """Caught once in init (naming the start), not after faults.max_consecutive failed steps."""
    calls = {"n": 0}

    def fn(th):                                  # -inf left of 0 in the first coordinate: log of a negative number
        calls["n"] += 1
        return torch.log(th[:, 0].clamp_min(0.0)) - 0.5 * (th ** 2).sum(-1)

    target = gpvi.Target(fn, names=["a", "b"])
    with pytest.raises(ValueError, match=r"log joint is -inf at the start theta=\[-1, 2\]"):
        quiet(num_steps=100).run(target, init=[-1.0, 2.0])
    assert calls["n"] == 1                                            # one evaluation, no steps
    cusp = gpvi.Target(lambda th: -th[:, 1].abs().sqrt() - th[:, 0] ** 2, names=["a", "b"])   # finite, no slope at b=0
    with pytest.raises(ValueError, match=r"gradient of the log joint is not finite in \['b'\] at the start"):
        quiet().init(cusp, torch.tensor([1.0, 0.0]))
    assert quiet(num_steps=5).init(target, [1.0, 2.0]).t == 0         # a finite start is accepted


def test_bad_run_inputs():
    target = gaussian_target(torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="init"):
        quiet().init(target, torch.zeros(4))
    with pytest.raises(ValueError, match="init"):
        quiet().init(target, torch.tensor([0.0, math.nan, 0.0]))
    with pytest.raises(ValueError, match="fixed_mean"):
        quiet(optimizer=SGD(fixed_mean=[True, False])).init(target)
    with pytest.raises(ValueError, match="init_scale"):
        quiet(init_scale=torch.ones(2)).init(target)
    with pytest.raises(ValueError, match="base"):
        quiet(base=[torch.distributions.Laplace(0.0, 1.0)] * 2).init(target)
    with pytest.raises(TypeError, match="log_joint"):
        quiet().run(object())
    wrong = gpvi.Target(lambda th: th.sum(-1), names=3, batched=True)
    wrong.log_joint = lambda th: th.sum()        # (S, D) -> () instead of (S,)
    with pytest.raises(ValueError, match="log_joint"):
        quiet().init(wrong)
    st = quiet(num_steps=5, optimizer=SGD(lr=0.1)).init(target)
    with pytest.raises(ValueError, match="state"):
        quiet(num_steps=5).run(target, torch.zeros(3), state=st)
    with pytest.raises(ValueError, match="scale"):
        quiet(scale="diag", num_steps=5).run(target, state=st)


# ------------------------------------------------------------------------------------------------ logistic target
def test_logistic_target_log_joint_labels_and_prediction():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(30, 2, generator=g, dtype=torch.float64)
    y01 = (X[:, 0] > 0).double()
    m01 = BayesianLogisticRegression(X, y01, prior_var=2.0)
    mpm = BayesianLogisticRegression(X.numpy(), (2 * y01 - 1).numpy(), prior_var=2.0)   # numpy, {-1, +1}
    theta = torch.randn(4, 3, generator=g, dtype=torch.float64)
    assert m01.names == ["bias", "w[0]", "w[1]"]
    # hand-written: sum_n log sigmoid(y_n x_n^T theta) + log N(theta | 0, 2 I)
    Phi = torch.cat([torch.ones(30, 1, dtype=torch.float64), X], 1)
    yy = 2 * y01 - 1
    manual = torch.log(torch.sigmoid(yy * (theta @ Phi.T))).sum(-1) \
        + torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64), math.sqrt(2.0)).log_prob(theta).sum(-1)
    assert torch.allclose(m01.log_joint(theta), manual, rtol=1e-10)
    assert torch.equal(m01.log_joint(theta), mpm.log_joint(theta))
    assert m01.log_joint(theta[0]).shape == ()
    p = m01.predict_proba(X, theta[0])
    assert torch.allclose(p, torch.sigmoid(Phi @ theta[0]))
    # Gaussian posterior: Gauss-Hermite predictive equals a large Monte Carlo average
    q = GaussianPosterior(theta[0], 0.5 * torch.eye(3, dtype=torch.float64), m01.names)
    mc = torch.sigmoid(q.sample(200_000, seed=1) @ Phi.T).mean(0)
    assert torch.allclose(m01.predict_proba(X, q), mc, atol=5 * 0.5 / math.sqrt(200_000))
    with pytest.raises(ValueError, match="y"):
        BayesianLogisticRegression(X, torch.full((30,), 2.0))
    with pytest.raises(ValueError, match="rows"):
        BayesianLogisticRegression(X, y01[:-1])
    with pytest.raises(ValueError, match="prior_var"):
        BayesianLogisticRegression(X, y01, prior_var=0.0)
    with pytest.raises(ValueError, match="feature_names"):
        BayesianLogisticRegression(X, y01, feature_names=["a"])


def test_logistic_log_joint_blocks_large_batches():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(500, 3, generator=g, dtype=torch.float64)
    model = BayesianLogisticRegression(X, (X[:, 1] > 0).double())
    theta = torch.randn(40, 4, generator=g, dtype=torch.float64, requires_grad=True)
    whole = model.log_joint(theta)
    model.max_block = 1000                       # 25 rows per block at S = 40
    blocked = model.log_joint(theta)
    assert torch.allclose(whole, blocked, rtol=1e-12)
    (ga,) = torch.autograd.grad(whole.sum(), theta)
    (gb,) = torch.autograd.grad(blocked.sum(), theta)
    assert torch.allclose(ga, gb, rtol=1e-12)


def test_factorised_base_runs_and_is_reported():
    """phi = prod_d phi_d with user-given univariate standard distributions (the slides' first tip)."""
    target = gaussian_target(torch.zeros(2, dtype=torch.float64))
    comps = [torch.distributions.Laplace(torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)),
             torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))]
    q = run_quiet(quiet(base=comps, num_steps=300, optimizer=SGD(lr=0.1), seed=0, num_elbo_draws=200), target)
    assert isinstance(q.base, gpvi.numerics.families.Factorised) and math.isfinite(q.elbo)
    # the entropy term of the bound includes H_phi = H(Laplace) + H(Normal) = (1 + log 2) + (1 + log 2 pi) / 2
    assert q.base.entropy() == pytest.approx(1 + math.log(2) + 0.5 * (1 + math.log(2 * math.pi)))


def test_readme_generic_example_emits_no_numerical_warning():
    """The README's 2-D standard-normal example with a Student-t base: damped C steps (c_shrinks) are recorded in
    info but are not numerical faults, so no NumericalWarning."""
    import warnings as _w

    from gpvi.exceptions import NumericalWarning as _NW

    target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=["a", "b"])
    with _w.catch_warnings():
        _w.simplefilter("error", _NW)
        q = gpvi.DSVI(scale="diag", base=("t", 5.0), num_steps=2000, seed=0, progress_bar=False).run(target)
    assert q.info["c_shrinks"] >= 0 and q.info["skipped_steps"] == 0
    assert bool((q.mean.abs() < 0.1).all()) and bool(((q.std - 1).abs() < 0.1).all())
