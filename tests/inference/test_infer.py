"""gpvi.infer: Gaussian q (S&K or DSVI) -> PSIS -> (q | weighted | NUTS from q), the choice checked against known
answers."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import gpvi
from gpvi.exceptions import NumericalWarning
from gpvi.inference.infer import _choose
from gpvi.posteriors import GaussianPosterior

NAMES = ["a", "b"]


def _quiet(fn, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*a, **kw)


def test_a_gaussian_target_returns_q_itself():
    m = torch.tensor([1.0, -1.0], dtype=torch.float64)
    eng = gpvi.DSVI(seed=0, num_steps=2000, num_elbo_draws=200, progress_bar=False)
    post = _quiet(gpvi.infer, gpvi.Target(lambda th: -0.5 * ((th - m) ** 2).sum(-1), names=NAMES), seed=0,
                  engine=eng, progress_bar=False)
    r = post.report
    assert r.answer == "q" and isinstance(post, gpvi.GaussianPosterior) and r.khat < 0.5
    assert abs(r.log_evidence - math.log(2 * math.pi)) < 4 * r.log_evidence_se + 1e-3   # Z = 2 pi exactly
    assert set(r.times) == {"q", "psis"} and "answer = q" in str(r) and "<b>" in r._repr_html_()
    assert r.engine == "DSVI" and "DSVI bound" in str(r)


def _funnel(th):                                 # Neal's funnel: v ~ N(0, 9), x_j | v ~ N(0, e^v)
    v, x = th[:, 0], th[:, 1:]
    return -0.5 * v ** 2 / 9.0 - 0.5 * (x ** 2).sum(-1) * torch.exp(-v) - 0.5 * x.shape[1] * v


def test_a_funnel_goes_to_nuts_warm_started_from_q():
    eng = gpvi.DSVI(seed=0, num_steps=2000, num_elbo_draws=200, progress_bar=False)
    nuts = gpvi.NUTS(num_chains=2, num_warmup=50, num_draws=100, seed=0, progress_bar=False)
    post = _quiet(gpvi.infer, gpvi.Target(_funnel, names=3), seed=0, engine=eng, nuts=nuts, min_ess=1e9,
                  max_extensions=1, progress_bar=False)
    r = post.report
    assert r.nuts["extensions"] == 1 and post.draws.shape[1] == 200 and "still miss" in r.reason
    assert r.khat > 0.7 and r.answer == "nuts" and isinstance(post, gpvi.SamplePosterior)
    assert post.info["init"]["mass_matrix"].startswith("q's covariance")
    assert "nuts" in r.times and r.nuts["gradient evaluations"] > 0 and "NUTS from q" in str(r)
    # chains short of min_ess: the answer is flagged, in the report and by a warning
    assert r.trusted is False and str(r).startswith("gpvi.infer: NOT TRUSTED") and r.mcse_mean > 0
    with pytest.warns(NumericalWarning, match="not trusted"):
        gpvi.infer(gpvi.Target(_funnel, names=3), seed=0, q=r.q, nuts=nuts, min_ess=1e9, max_extensions=0,
                   progress_bar=False)


def test_the_default_sampler_adapts_its_metric_from_draws_of_q():
    """infer's own NUTS (``default_nuts``) starts at draws of q but adapts a diagonal metric in Stan's windows:
    q's covariance is not its metric (a metric fixed at a q that failed its check collapsed on some fits)."""
    from gpvi.inference.infer import default_nuts

    s = default_nuts(seed=3, progress_bar=False)
    assert (s.num_chains, s.num_warmup, s.num_draws, s.seed) == (4, 500, 500, 3)
    assert s.adaptation.mass_from_init is False and s.adaptation.dense_mass is False
    eng = gpvi.DSVI(seed=0, num_steps=2000, num_elbo_draws=200, progress_bar=False)
    s.num_warmup, s.num_draws = 60, 40
    post = _quiet(gpvi.infer, gpvi.Target(_funnel, names=3), seed=0, engine=eng, nuts=s, min_ess=1e9,
                  max_extensions=0, progress_bar=False)
    assert post.report.answer == "nuts" and "mass_matrix" not in post.info["init"]
    m = post.info["inverse_mass_matrix"]
    assert m.shape == (4, 3) and not torch.allclose(m[0], torch.ones(3, dtype=m.dtype))   # diagonal, adapted


def test_nuts_counts_as_mixed_only_when_ess_rhat_and_mcse_all_meet_their_targets():
    """A chain that has not explored a heavy tail shows it in the tail ESS (5% / 95% quantiles) and in the Monte
    Carlo error of the sd before the bulk ESS: ``infer`` extends (and otherwise flags) NUTS until bulk and tail ESS
    reach ``min_ess``, R-hat <= 1.01 and every MCSE of a mean or sd is at most MCSE_TOL of the sd."""
    from gpvi.inference.check import MCSE_TOL, mixed

    t = lambda *v: torch.tensor(v, dtype=torch.float64)                      # noqa: E731
    sd = t(2.0, 1.0)
    ok = {"ess_bulk": t(900.0, 500.0), "ess_tail": t(450.0, 400.0), "r_hat": t(1.001, 1.01),
          "mcse_mean": t(0.09, 0.04), "mcse_sd": t(0.1, MCSE_TOL)}
    assert mixed(ok, 400.0, sd)
    assert not mixed({**ok, "ess_tail": t(450.0, 399.0)}, 400.0, sd)        # bulk ample, one tail short
    assert not mixed({**ok, "ess_bulk": t(399.0, 900.0)}, 400.0, sd)
    assert not mixed({**ok, "r_hat": t(1.0, 1.011)}, 400.0, sd)
    assert not mixed({**ok, "mcse_sd": t(0.1, 1.01 * MCSE_TOL)}, 400.0, sd)  # the sd not pinned down
    assert not mixed({**ok, "mcse_mean": t(0.11, 0.04)}, 400.0, sd)
    # on real draws (ArviZ's diagnostics): 4 x 1,000 independent normal draws pass; the same with every 100th draw
    # replaced by +-25 (a heavy tail; ESS and R-hat unchanged) do not: the sd's MCSE is then, in closed form for
    # independent draws, sqrt((mu4 - sigma^4) / n) / (2 sigma) = 0.068 sigma > MCSE_TOL sigma
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 1000, 1, generator=g, dtype=torch.float64)
    assert mixed(gpvi.posteriors.diagnostics.diagnostics(x), 400.0, x.reshape(-1, 1).std(0))
    heavy = x.clone()
    heavy[:, ::100] = 25.0 * torch.sign(x[:, ::100])
    dh, sd_h = gpvi.posteriors.diagnostics.diagnostics(heavy), heavy.reshape(-1, 1).std(0)
    var, mu4 = 0.99 + 0.01 * 25.0 ** 2, 0.99 * 3.0 + 0.01 * 25.0 ** 4
    closed = math.sqrt((mu4 - var ** 2) / 4000) / (2 * var)
    assert abs(float(dh["mcse_sd"][0] / sd_h[0]) - closed) < 0.01 and closed > MCSE_TOL
    assert float(dh["ess_bulk"].min()) >= 400 and float(dh["ess_tail"].min()) >= 400 and float(dh["r_hat"][0]) < 1.01
    assert not mixed(dh, 400.0, sd_h)


class _StubRun:
    """A run whose diagnostics meet the targets once it has ``enough`` draws per chain."""

    def __init__(self, n, enough, interrupted=False):
        self.n, self.enough, self.std = n, enough, torch.ones(1, dtype=torch.float64)
        self.draws = torch.zeros(4, n, 1, dtype=torch.float64)
        self.info, self.engine_state = {"interrupted": interrupted}, ("state", n)

    def diagnostics(self):
        ess = 1000.0 if self.n >= self.enough else 10.0
        one = lambda v: torch.tensor([v], dtype=torch.float64)              # noqa: E731
        return {"ess_bulk": one(ess), "ess_tail": one(ess), "r_hat": one(1.0), "mcse_mean": one(0.01),
                "mcse_sd": one(0.01)}


class _StubSampler:
    def __init__(self, enough, calls, interrupted=False):
        self.num_draws, self.enough, self.calls, self.interrupted = 500, enough, calls, interrupted

    def run(self, target, init=None, state=None):
        self.calls.append((init, state, self.num_draws))
        return _StubRun(self.num_draws, self.enough, self.interrupted)


def test_an_extension_asks_for_the_draws_the_shortfall_needs():
    """L x clamp(1.1 x need, 1.25, 2), rounded up to 50, at most the cap; need from the ESS, the MCSE or R-hat."""
    from gpvi.inference.check import extended_length
    one = lambda v: torch.tensor([v], dtype=torch.float64)                  # noqa: E731
    sd = one(1.0)
    d = {"ess_bulk": one(300.0), "ess_tail": one(900.0), "r_hat": one(1.0), "mcse_mean": one(0.01),
         "mcse_sd": one(0.02)}
    assert extended_length(d, 400.0, sd, 1000, 4000) == 1500                   # 1.1 x 400/300 = 1.467
    assert extended_length({**d, "ess_bulk": one(900.0), "mcse_sd": one(0.06)}, 400.0, sd, 1000, 4000) == 1600
    assert extended_length({**d, "ess_bulk": one(399.0)}, 400.0, sd, 1000, 4000) == 1250        # at least 1.25x
    assert extended_length({**d, "ess_bulk": one(10.0)}, 400.0, sd, 1000, 4000) == 2000         # at most 2x
    assert extended_length({**d, "r_hat": one(1.02)}, 400.0, sd, 1000, 4000) == 2000            # R-hat: 2x
    assert extended_length({**d, "ess_bulk": one(10.0)}, 400.0, sd, 3000, 4000) == 4000         # the cap


def test_run_until_mixed_extends_from_the_last_state_up_to_the_cap():
    from gpvi.inference.check import run_until_mixed
    calls = []
    post, d, ext = run_until_mixed(_StubSampler(1500, calls), "target", "q", min_ess=400.0, max_extensions=3)
    assert ext == 2 and post.n == 2000 and float(d["ess_bulk"][0]) == 1000.0
    assert calls == [("q", None, 500), (None, ("state", 500), 1000), (None, ("state", 1000), 2000)]
    calls.clear()                                                     # never enough: stops after max_extensions
    post, _, ext = run_until_mixed(_StubSampler(10 ** 9, calls), "target", "q", min_ess=400.0, max_extensions=3)
    assert ext == 3 and post.n == 4000 and len(calls) == 4
    calls.clear()                                                     # an interrupted run is never extended
    post, _, ext = run_until_mixed(_StubSampler(10 ** 9, calls, interrupted=True), "t", "q", min_ess=400.0,
                                   max_extensions=3)
    assert ext == 0 and len(calls) == 1
    calls.clear()                                                     # continuing a given run
    post, _, ext = run_until_mixed(_StubSampler(1000, calls), "t", min_ess=400.0, max_extensions=3,
                                   post=_StubRun(500, 1000))
    assert ext == 1 and calls == [(None, ("state", 500), 1000)]


def _chk(reliable, khat=0.4, proposal="adapted"):
    return {"proposal": proposal, "khat": khat, "threshold": 0.7, "ess": 900.0, "num_draws": 4000,
            "mcse_mean": 0.02, "mcse_sd": 0.03, "reliable": reliable}


def test_the_choice_follows_the_check():
    """q only when its k-hat is small, one basin, and it agrees with checked weighted draws; the weighted draws
    only when they pass the check; NUTS otherwise, whatever q's k-hat."""
    assert _choose(0.3, _chk(True), q_agrees=True)[0] == "q"
    assert _choose(0.3, _chk(True), q_agrees=False)[0] == "psis"           # k-hat small, q still off: weighted
    assert _choose(0.3, _chk(True), several=True, q_agrees=True)[0] == "psis"
    assert _choose(0.6, _chk(True), q_agrees=True)[0] == "psis"
    assert _choose(0.3, _chk(False), q_agrees=True)[0] == "nuts"           # a small k-hat is not enough
    assert _choose(0.6, _chk(False))[0] == "nuts" and _choose(math.nan, _chk(False))[0] == "nuts"
    assert "fail the check" in _choose(0.6, _chk(False, khat=0.65))[1]


def _student(th, nu=4.0):                        # product of Student-t(4) marginals: sd sqrt(2), mean 0
    return (-(nu + 1) / 2 * torch.log1p(th ** 2 / nu)).sum(-1)


def test_a_narrow_q_with_a_moderate_khat_is_not_answered_by_its_own_weights():
    """Gaussian q with sd 0.8 on a product of t(4) marginals (sd 1.41): PSIS of q shows a moderate k-hat
    (0.5-0.7 at 1,000 draws) while its weighted sds fall short. The answer is the defensive proposal's weighted
    draws within 0.2 sd and sd ratio 0.8-1.25 of the truth, or NUTS, never q's own weights."""
    target = gpvi.Target(_student, names=6)
    q = GaussianPosterior(torch.zeros(6, dtype=torch.float64), 0.8 * torch.eye(6, dtype=torch.float64),
                          list(target.names), target)
    w = gpvi.posteriors.weighted.psis(q, target, 1000, seed=1)
    assert 0.5 < w.khat <= 0.7 and float(w.std.min()) < 0.8 * math.sqrt(2)     # the trap: q's weights look usable
    nuts = gpvi.NUTS(num_chains=2, num_warmup=50, num_draws=100, seed=1, progress_bar=False)
    post = _quiet(gpvi.infer, target, seed=1, q=q, nuts=nuts, min_ess=100, max_extensions=0, progress_bar=False)
    r = post.report
    assert r.check["proposal"] == "q" and r.check["num_draws"] == 4000 and r.answer in ("psis", "nuts")
    if r.answer == "psis":
        assert r.check["reliable"] and r.trusted
        assert float(post.mean.abs().max()) < 0.2 * math.sqrt(2)
        ratio = post.std / math.sqrt(2)
        assert 0.8 <= float(ratio.min()) and float(ratio.max()) <= 1.25
        assert "check (q proposal" in str(r) and 0 < r.mcse_mean <= 0.05
    with pytest.raises(TypeError, match="q must"):
        gpvi.infer(target, q="not a posterior")


def test_gp_regression_end_to_end_and_bad_arguments():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(30, 1, generator=g, dtype=torch.float64)
    y = torch.sin(6 * X[:, 0]) + 0.1 * torch.randn(30, generator=g, dtype=torch.float64)
    model = gpvi.GPRegression(X, y)
    eng = gpvi.DSVI(seed=0, num_steps=400, num_elbo_draws=200, progress_bar=False)
    nuts = gpvi.NUTS(num_chains=2, num_warmup=30, num_draws=60, seed=0, progress_bar=False)
    post = _quiet(gpvi.infer, model, seed=0, engine=eng, nuts=nuts, num_psis_draws=400, progress_bar=False,
                  grid=False)                              # the variational route (3 parameters: else the grid)
    assert post.report.answer in ("q", "psis", "nuts") and math.isfinite(post.report.khat)
    assert post.predict(X[:3], num_draws=20).mean.shape == (3,)
    # the default engine: S&K Hessian-free from every distinct MAP optimum, each start recorded
    dflt = _quiet(gpvi.infer, model, seed=0, nuts=nuts, num_psis_draws=400, progress_bar=False, grid=False)
    assert dflt.report.engine == "SKGaussian" and type(dflt.report.q.engine_state).__name__ == "SKState"
    assert len(dflt.report.starts) >= 1 and all(math.isfinite(r["elbo"]) for r in dflt.report.starts)
    assert dflt.report.q.info["settings"]["method"] == "gradient"
    with pytest.raises(ValueError, match="seed"):
        gpvi.infer(model, seed=-1)
    with pytest.raises(ValueError, match="num_psis_draws"):
        gpvi.infer(model, num_psis_draws=0)
    with pytest.raises(TypeError, match="grid"):
        gpvi.infer(model, grid="yes")


def test_engine_by_name_sk_and_the_starts_in_the_report():
    """engine="sk": Salimans-Knowles' Hessian-free Gaussian from DSVI's starts, on a correlated Gaussian target
    whose posterior is q's family (mean and sds exact: allowed 0.05 sd, 5%, for N = 250 averaged steps)."""
    m = torch.tensor([1.0, -1.0], dtype=torch.float64)
    P = torch.tensor([[2.0, 0.8], [0.8, 1.0]], dtype=torch.float64)
    target = gpvi.Target(lambda th: -0.5 * (((th - m) @ P) * (th - m)).sum(-1), names=NAMES)
    post = _quiet(gpvi.infer, target, seed=0, engine="sk", progress_bar=False)
    sd = torch.linalg.inv(P).diagonal().sqrt()
    assert type(post.engine_state).__name__ == "SKState" and post.report.answer == "q" and post.report.q is post
    assert bool(((post.mean - m).abs() / sd < 0.05).all()) and bool(((post.stddev / sd - 1).abs() < 0.05).all())
    assert len(post.report.starts) == 1 and post.report.starts_agree      # one start (no MAP for this target)
    with pytest.raises(ValueError, match="engine"):
        gpvi.infer(target, engine="adam")
    # DSVI's starts reach the report (one start here: no extra line)
    q = _quiet(gpvi.infer, target, seed=0, engine=gpvi.DSVI(seed=0, num_steps=2000, progress_bar=False),
               progress_bar=False)
    assert len(q.report.starts) == 1 and q.report.starts_agree and "starts" not in str(q.report)


def test_a_failed_sk_run_falls_back_to_dsvi_from_the_same_starts(monkeypatch):
    """When the default S&K engine fails from every start (NumericalFaultError), infer warns and runs DSVI from
    the same starts; the report says so."""
    import gpvi.inference.infer as infer_module
    from gpvi.exceptions import NumericalFaultError, NumericalWarning
    real = infer_module.run_starts

    def failing(engine, target, start, **kw):
        if type(engine).__name__ == "SKGaussian":
            raise NumericalFaultError("averaged precision not positive definite (forced)")
        return real(engine, target, start, **kw)

    monkeypatch.setattr(infer_module, "run_starts", failing)
    g = torch.Generator().manual_seed(1)
    X = torch.rand(20, 1, generator=g, dtype=torch.float64)
    model = gpvi.GPRegression(X, torch.sin(6 * X[:, 0]) + 0.1 * torch.randn(20, generator=g, dtype=torch.float64))
    with pytest.warns(NumericalWarning, match="S&K failed from every start"):
        post = gpvi.infer(model, seed=0, num_psis_draws=200, progress_bar=False, grid=False,
                          nuts=gpvi.NUTS(num_chains=2, num_warmup=20, num_draws=40, seed=0, progress_bar=False))
    assert post.report.engine == "DSVI" and "DSVI from the same starts" in post.report.reason
    assert type(post.report.q.engine_state).__name__ == "DSVIState"


class _CtrlC:
    """A funnel whose log joint raises KeyboardInterrupt (as Ctrl-C does) at the ``at``-th call of ``kind``
    (``"batch"``: PSIS's calls with many draws; ``"single"``: the sampler's calls, one row per chain)."""

    def __init__(self, kind, at):
        self.kind, self.at, self.calls = kind, at, 0

    def __call__(self, th):
        single = th.dim() == 1 or th.shape[0] <= 2
        if single == (self.kind == "single"):
            self.calls += 1
            if self.calls == self.at:
                raise KeyboardInterrupt
        return _funnel(th.reshape(-1, 3)).reshape(th.shape[:-1])


def test_ctrl_c_in_each_stage_returns_a_flagged_partial_result():
    target = gpvi.Target(_funnel, names=3)
    q = GaussianPosterior(torch.zeros(3, dtype=torch.float64), torch.eye(3, dtype=torch.float64),
                          list(target.names), target)
    nuts = gpvi.NUTS(num_chains=2, num_warmup=30, num_draws=60, seed=0, progress_bar=False)
    # the variational fit was interrupted: q comes back unchecked
    q_int = GaussianPosterior(q.mean, q.scale_tril, list(q.names), q.target, info={"interrupted": True})
    with pytest.warns(gpvi.exceptions.InterruptedRunWarning, match="variational fit"):
        post = gpvi.infer(q.target, q=q_int, progress_bar=False)
    assert post is q_int and post.report.interrupted == "q" and not post.report.trusted
    # PSIS (the first batched log joint after the fit)
    with pytest.warns(gpvi.exceptions.InterruptedRunWarning, match="PSIS"):
        post = gpvi.infer(gpvi.Target(_CtrlC("batch", 2), names=3), q=q, num_psis_draws=200, progress_bar=False)
    assert post is q and post.report.interrupted == "psis" and "NOT TRUSTED" in str(post.report)
    # NUTS, before its first draw (the weighted draws come back) and after some draws (the partial chains)
    for at, answer in ((5, "psis"), (1500, "nuts")):
        with pytest.warns(gpvi.exceptions.InterruptedRunWarning):
            post = gpvi.infer(gpvi.Target(_CtrlC("single", at), names=3), q=q, num_psis_draws=200, nuts=nuts,
                              min_ess=1e9, progress_bar=False)
        r = post.report
        assert r.interrupted == "nuts" and r.answer == answer and not r.trusted and "interrupted" in r.reason


def _small_gp():
    g = torch.Generator().manual_seed(3)
    X = torch.rand(20, 2, generator=g, dtype=torch.float64)
    return gpvi.GPRegression(X, torch.sin(6 * X[:, 0]) + 0.1 * torch.randn(20, generator=g, dtype=torch.float64))


def _interrupt_at(monkeypatch, module, name, at):
    """Make ``module.name`` raise KeyboardInterrupt (as Ctrl-C does) at its ``at``-th call; returns the counter."""
    real, calls = getattr(module, name), {"n": 0}

    def wrapped(*a, **kw):
        calls["n"] += 1
        if calls["n"] == at:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(module, name, wrapped)
    return calls


@pytest.mark.parametrize("stage, module, name, at", [("map", "ml2", "lbfgs_maximise", 3),
                                                     ("map", "ml2", "lbfgs_maximise", 1),
                                                     ("laplace", "init", "finite_difference_hessian", 1)])
def test_ctrl_c_while_the_default_start_is_found_ends_the_call(monkeypatch, stage, module, name, at):
    """Ctrl-C in the MAP restarts (after some restarts, or in the first) or in the Laplace Hessians of DSVI's
    default start: DSVI.run and gpvi.infer take no further step and return the start's Gaussian, flagged (the
    stage named), with an InterruptedRunWarning; the restarts stop at the interruption."""
    import gpvi.inference.dsvi.starts as starts_module
    import gpvi.inference.init as init_module
    import gpvi.inference.ml2 as ml2_module
    mod = {"ml2": ml2_module, "init": init_module}[module]
    monkeypatch.setattr(starts_module, "MAP_RESTARTS", 4)     # 4 restarts instead of 30: the same code path
    model = _small_gp()
    calls = _interrupt_at(monkeypatch, mod, name, at)
    with pytest.warns(gpvi.exceptions.InterruptedRunWarning, match="MAP restarts" if stage == "map" else "Laplace"):
        q = gpvi.DSVI(seed=0, progress_bar=False).run(model)
    assert calls["n"] == at                                  # nothing after the interruption
    assert q.info["interrupted"] and q.info["interrupted_stage"] == stage and q.info["steps"] == 0
    assert len(q.info["starts"]) == 1
    calls["n"] = 0
    with pytest.warns(gpvi.exceptions.InterruptedRunWarning, match="variational fit"):
        post = gpvi.infer(model, seed=0, progress_bar=False)
    r = post.report
    assert calls["n"] == at and post is r.q and r.interrupted == stage and not r.trusted
    assert str(r).startswith("gpvi.infer: NOT TRUSTED") and "interrupted (Ctrl-C)" in r.reason
    assert set(r.times) == {"grid", "q"} and r.grid == {}      # the MAP restarts ran in step 0; no grid after them


def test_ctrl_c_in_a_later_sk_start_ends_infer(monkeypatch):
    """Ctrl-C during the second start's S&K run (the first start finished): infer stops there, flags the fit
    (it used to carry on into PSIS with the first start's q)."""
    import gpvi.inference.dsvi.starts as starts_module
    model = _small_gp()
    real, runs = starts_module.driver.run, {"n": 0}

    def second_run_interrupted(engine, target, init=None, **kw):
        runs["n"] += 1
        if runs["n"] == 2:
            kw["callback"] = lambda state, info: (_ for _ in ()).throw(KeyboardInterrupt) if state.t == 5 else None
        return real(engine, target, init, **kw)

    monkeypatch.setattr(starts_module.driver, "run", second_run_interrupted)
    start = gpvi.inference.init.Start(torch.zeros(4, dtype=torch.float64),
                                      alternatives=(gpvi.inference.init.Start(torch.ones(4, dtype=torch.float64)),))
    with pytest.warns(gpvi.exceptions.InterruptedRunWarning):
        q = starts_module.run_starts(gpvi.SKGaussian(num_steps=100, method="gradient", num_draws=4,
                                                     num_elbo_draws=100, progress_bar=False), model, start)
    assert runs["n"] == 2 and q.info["interrupted"] and q.info["interrupted_stage"] == "q"
    assert q.start_posteriors == [q, None] and q.info["starts"][1]["interrupted"]
    with pytest.warns(gpvi.exceptions.InterruptedRunWarning, match="variational fit"):
        post = gpvi.infer(model, q=q, progress_bar=False)
    assert post is q and post.report.interrupted == "q" and set(post.report.times) == {"q"}
