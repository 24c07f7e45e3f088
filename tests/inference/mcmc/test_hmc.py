"""NUTS / HMC engines: correctness against known targets, diagnostics, determinism, interruption and resume.

Monte Carlo tolerances are derived from the effective sample size of the very quantity being checked:
``|estimate - truth| <= 4 * sd(f) / sqrt(ESS(f))`` (4 standard errors: a false alarm has probability ~6e-5 per
check under the CLT, and everything is seeded, so the outcome is fixed; breaking the sampler, e.g. scaling the
potential by 0.8, makes these checks fail).
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from pyro.ops.stats import effective_sample_size

import gpvi
from gpvi.exceptions import ConvergenceWarning, InterruptedRunWarning
from gpvi.inference.mcmc import HMC, NUTS, Adaptation, ConvergenceChecks, MCMCState, init_to_chains
from gpvi.evaluation.metrics import compare
from gpvi.posteriors import GaussianPosterior, PointPosterior

from tests.conftest import make_gp_data

MEAN = torch.tensor([1.0, -2.0], dtype=torch.float64)
COV = torch.tensor([[1.0, 1.8], [1.8, 4.0]], dtype=torch.float64)      # correlation 0.9, scales 1 and 2
PREC = torch.linalg.inv(COV)


def gauss_log_joint(theta: torch.Tensor) -> torch.Tensor:
    d = theta - MEAN
    return -0.5 * ((d @ PREC) * d).sum(-1)


@pytest.fixture(scope="module")
def gauss():
    return gpvi.Target(gauss_log_joint, ["a", "b"])


def quiet(engine, *args, **kwargs):
    """Run ignoring ConvergenceWarning (short runs in tests are allowed to have a low ESS)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return engine.run(*args, **kwargs)


def mc_check(draws: torch.Tensor, f, truth: float, what: str) -> None:
    """Assert mean of f(draws) over (C, S) draws is within 4 ESS-based standard errors of truth."""
    vals = f(draws)                                         # (C, S)
    ess = float(effective_sample_size(vals.unsqueeze(-1), chain_dim=0, sample_dim=1)[0])
    est = float(vals.mean())
    se = float(vals.std()) / math.sqrt(ess)
    assert abs(est - truth) <= 4 * se, f"{what}: {est:.4f} vs {truth:.4f} (4 se = {4 * se:.4f}, ess {ess:.0f})"


def check_gaussian_moments(draws: torch.Tensor) -> None:
    for j in range(2):
        mc_check(draws, lambda x, j=j: x[..., j], float(MEAN[j]), f"mean[{j}]")
        mc_check(draws, lambda x, j=j: (x[..., j] - MEAN[j]) ** 2, float(COV[j, j]), f"var[{j}]")
    mc_check(draws, lambda x: (x[..., 0] - MEAN[0]) * (x[..., 1] - MEAN[1]), float(COV[0, 1]), "cov[0,1]")


W_GAUSS, S_GAUSS = 200, 500     # 4 chains: ESS ~ 300 for the means; mc_check scales its 4-se band with the ESS


@pytest.fixture(scope="module")
def gauss_run(gauss):
    return quiet(NUTS(num_chains=4, num_warmup=W_GAUSS, num_draws=S_GAUSS, seed=1, progress_bar=False), gauss)


# ---------------------------------------------------------------------------------------------- correctness
def test_nuts_recovers_correlated_gaussian(gauss_run):
    mc = gauss_run
    assert mc.draws.shape == (4, S_GAUSS, 2)
    assert mc.samples.shape == (4 * S_GAUSS, 2)
    check_gaussian_moments(mc.draws)
    assert mc.info["divergences"] == 0
    # the adapted diagonal inverse mass matrix estimates the marginal variances (1 and 4) from warm-up draws
    inv_mass = mc.info["inverse_mass_matrix"]
    assert inv_mass.shape == (4, 2)
    assert bool((inv_mass[:, 1] > inv_mass[:, 0]).all())


@pytest.mark.slow
def test_hmc_recovers_correlated_gaussian(gauss):
    mc = quiet(HMC(step_size=0.3, num_leapfrog_steps=10, num_chains=2, num_warmup=200, num_draws=1200, seed=3,
                   progress_bar=False), gauss)
    check_gaussian_moments(mc.draws)
    assert "tree_depth" not in mc.stats
    assert set(mc.stats) == {"diverging", "acceptance_rate", "step_size", "n_steps", "lp", "energy"}


@pytest.mark.slow
def test_gp_four_chains_converge():
    X, y = make_gp_data(n=50, d=1, seed=2)
    model = gpvi.GPRegression(X, y)
    # dense mass matrix: log lengthscale and log signal variance are correlated a posteriori
    mc = quiet(NUTS(num_chains=4, num_warmup=150, num_draws=150, seed=0, adaptation=Adaptation(dense_mass=True),
                    progress_bar=False),
               model)
    assert mc.info["inverse_mass_matrix"].shape == (4, model.dim, model.dim)
    rhat = mc.r_hat()
    assert rhat.shape == (model.dim,)
    assert bool((rhat < 1.05).all()), rhat
    table = mc.summary()
    assert table.index == model.names
    assert {"ess_bulk", "ess_tail", "r_hat", "natural", "nat_mean"} <= set(table.columns)
    pred = mc.predict(X[:7], num_draws=25)
    assert pred.mean.shape == (7,)
    assert bool((pred.var > 0).all())
    assert mc.info["divergences"] == 0


def test_stats_shapes_and_meaning(gauss_run):
    mc = gauss_run
    C, S = 4, S_GAUSS
    for k, v in mc.stats.items():
        assert v.shape == (C, S), k
    assert mc.stats["diverging"].dtype == torch.bool
    acc = mc.stats["acceptance_rate"]
    assert bool(((acc >= 0) & (acc <= 1)).all())
    # step size is frozen after warm-up, one value per chain
    eps = mc.stats["step_size"]
    assert torch.equal(eps, eps[:, :1].expand(C, S))
    assert eps[:, 0].tolist() == mc.info["step_size"]
    # tree depth = number of doublings: 2^(depth-1) - 1 < n_steps <= 2^depth - 1
    n, depth = mc.stats["n_steps"], mc.stats["tree_depth"]
    assert bool(((2 ** (depth - 1) - 1 < n) & (n <= 2 ** depth - 1)).all())
    # lp is the log joint at the draw
    torch.testing.assert_close(mc.stats["lp"], gauss_log_joint(mc.draws), rtol=0, atol=1e-10)
    # warm-up is kept for inspection
    assert mc.info["warmup_draws"].shape == (C, W_GAUSS, 2)
    assert mc.info["warmup_stats"]["step_size"].shape == (C, W_GAUSS)
    assert mc.info["chains"].column("draws") == [S] * C


def test_nonfinite_region_is_never_visited():
    """Half-normal: log g = -inf for x_0 <= 0; such proposals are rejected (counted), never returned.

    (A hard wall gives divergent transitions, as in Stan: this checks the handling, not the moments.)
    """
    def f(th):
        lj = -0.5 * (th ** 2).sum(-1)
        return torch.where(th[..., 0] > 0, lj, torch.full_like(lj, -math.inf))
    target = gpvi.Target(f, ["x", "y"])
    mc = quiet(NUTS(num_chains=2, num_warmup=50, num_draws=50, seed=0, progress_bar=False), target,
               init=torch.tensor([1.0, 0.0]))
    assert bool((mc.samples[:, 0] > 0).all())
    assert bool((mc.info["warmup_draws"][..., 0] > 0).all())
    assert sum(mc.info["num_nonfinite"]) > 0
    assert bool(torch.isfinite(mc.stats["lp"]).all())


def test_numerical_warnings_of_the_target_are_counted_and_reported_once():
    def f(th):
        if bool((th[..., 0] > 1.0).any()):
            warnings.warn("jitter added", gpvi.NumericalWarning)
        return -0.5 * (th ** 2).sum(-1)
    target = gpvi.Target(f, ["x", "y"])
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        mc = NUTS(num_chains=2, num_warmup=50, num_draws=100, seed=0, progress_bar=False,
                  checks=ConvergenceChecks(min_ess=0, max_r_hat=10.0)).run(target)
    numerical = [w for w in rec if issubclass(w.category, gpvi.NumericalWarning)]
    assert sum(mc.info["num_numerical_warnings"]) > 0
    assert sum(mc.info["num_numerical_warnings_warmup"]) > 0
    assert len(numerical) == 1 and "while sampling" in str(numerical[0].message)


# ---------------------------------------------------------------------------------------------- determinism
def small(seed=0, **kw):
    return NUTS(num_chains=2, num_warmup=30, num_draws=20, seed=seed, progress_bar=False, **kw)


def test_same_seed_same_draws_and_global_rng_untouched(gauss):
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = quiet(small(seed=5), gauss)
    assert torch.equal(torch.get_rng_state(), before)       # the caller's global RNG is unchanged
    torch.manual_seed(999)                                    # ... and does not influence the draws
    b = quiet(small(seed=5), gauss)
    assert torch.equal(a.draws, b.draws)
    for k in a.stats:
        assert torch.equal(a.stats[k], b.stats[k]), k
    c = quiet(small(seed=6), gauss)
    assert not torch.equal(a.draws, c.draws)
    g = torch.Generator().manual_seed(5)
    d = quiet(small(seed=None), gauss, generator=g)
    e = quiet(small(seed=None), gauss, generator=torch.Generator().manual_seed(5))
    assert torch.equal(d.draws, e.draws)


def test_chains_are_independent_streams(gauss):
    """Chain c's draws do not depend on how many chains run (each chain has its own seeded stream)."""
    a = quiet(small(seed=2), gauss)
    state = MCMCState.from_state_dict(a.engine_state.state_dict())
    init = torch.stack([ch.init for ch in state.chains])
    b = quiet(NUTS(num_chains=2, num_warmup=30, num_draws=20, seed=2, progress_bar=False), gauss, init=init)
    assert torch.equal(a.info["inits"], b.info["inits"])


def test_a_chain_does_not_depend_on_what_the_others_do():
    """The chains advance together (one batched call per round, chain c at row c): chain 0's draws are the same
    whichever start and path chain 1 takes, on a GP model's closed form (as on any row-wise target)."""
    g = torch.Generator().manual_seed(0)
    X = torch.linspace(0.0, 5.0, 12, dtype=torch.float64).unsqueeze(-1)
    model = gpvi.GPRegression(X, torch.sin(X[:, 0]) + 0.2 * torch.randn(12, generator=g, dtype=torch.float64))
    th = model.initial_theta()
    runs = [quiet(NUTS(num_chains=2, num_warmup=40, num_draws=30, seed=3, progress_bar=False), model,
                  init=init_to_chains(torch.stack([th, th + shift])))
            for shift in (0.3, -0.8)]
    assert torch.equal(runs[0].draws[0], runs[1].draws[0])
    assert not torch.equal(runs[0].draws[1], runs[1].draws[1])


def test_chains_of_a_large_model_run_one_after_another(monkeypatch):
    """Above BATCH_MAX_N data points each chain is a batch of one (batching saves nothing there), and chain 1's
    draws do not depend on chain 0's start."""
    from gpvi.inference.mcmc import chains as chains_module
    g = torch.Generator().manual_seed(1)
    X = torch.linspace(0.0, 5.0, 12, dtype=torch.float64).unsqueeze(-1)
    model = gpvi.GPRegression(X, torch.sin(X[:, 0]) + 0.2 * torch.randn(12, generator=g, dtype=torch.float64))
    monkeypatch.setattr(chains_module, "BATCH_MAX_N", 11)
    assert chains_module.chain_groups(model, 2) == [[0], [1]]
    calls = []
    real = chains_module.Potential.__call__
    monkeypatch.setattr(chains_module.Potential, "__call__", lambda self, Z: calls.append(Z.shape[0]) or real(self, Z))
    th = model.initial_theta()
    runs = [quiet(NUTS(num_chains=2, num_warmup=30, num_draws=20, seed=4, progress_bar=False), model,
                  init=init_to_chains(torch.stack([th + shift, th]))) for shift in (0.3, -0.8)]
    assert set(calls) == {1}
    assert torch.equal(runs[0].draws[1], runs[1].draws[1]) and not torch.equal(runs[0].draws[0], runs[1].draws[0])


def test_chains_on_an_accelerator_always_advance_together():
    """The one-after-another rule is a CPU cost rule: a target whose data live on an accelerator keeps every chain in
    one batch at any size (a stand-in target: no accelerator is needed to read the rule)."""
    from types import SimpleNamespace

    from gpvi.inference.mcmc.chains import BATCH_MAX_N, chain_groups
    from gpvi.numerics.budget import MemoryBudget
    big = BATCH_MAX_N + 1
    assert chain_groups(SimpleNamespace(num_data=big, device="cuda"), 3) == [[0, 1, 2]]
    assert chain_groups(SimpleNamespace(num_data=big, device="cpu"), 3) == [[0], [1], [2]]
    assert chain_groups(SimpleNamespace(num_data=big), 2) == [[0], [1]]
    assert chain_groups(SimpleNamespace(num_data=BATCH_MAX_N, device="cpu"), 2) == [[0, 1]]
    # within the memory budget of one call (here 3 of 4 chains' N x N matrices a call)
    budget = MemoryBudget().limit("cpu")
    tight = SimpleNamespace(num_data=BATCH_MAX_N, device="cpu", memory_per_draw=lambda: budget // 3)
    assert chain_groups(tight, 4) == [[0, 1, 2], [3]]


def test_accelerator_budget_is_a_quarter_of_its_free_memory(monkeypatch):
    """On the CPU one call takes at most 1 GiB; on an accelerator a quarter of its free memory, so that many chains
    advance together there (N = 5,000 needs 400 MB a chain: 1 GiB would allow 2 chains a call)."""
    from types import SimpleNamespace

    from gpvi.inference.mcmc.chains import chain_groups
    from gpvi.numerics import budget
    from gpvi.validation import memory
    free = {"cpu": 64 * 2**30, "cuda": 100 * 2**30}
    monkeypatch.setattr(memory, "available_memory_bytes", lambda device: free[device.type])
    monkeypatch.setattr(budget, "available_memory_bytes", lambda device: free[device.type])
    assert budget.MemoryBudget().limit("cpu") == budget.DEFAULT_BUDGET_BYTES == 2**30
    assert budget.MemoryBudget().limit("cuda") == 25 * 2**30
    assert budget.MemoryBudget(max_bytes=2**20).limit("cuda") == 2**20
    per = 400 * 10**6
    big = SimpleNamespace(num_data=5000, device="cuda", memory_per_draw=lambda: per)
    assert chain_groups(big, 64) == [list(range(64))]
    assert chain_groups(SimpleNamespace(num_data=150, device="cpu", memory_per_draw=lambda: per), 4) == [
        [0, 1], [2, 3]]
    free["cpu"] = 2**30                                  # little free memory: a quarter of it on the CPU too
    assert budget.MemoryBudget().limit("cpu") == 2**28


def test_total_time_is_the_wall_of_every_call():
    """``total_time_s`` is the run's own wall for a fresh run (not the chains' overlapping times, which the chains
    advancing together count once each) and the sum of the calls' walls after an extension; a state saved before
    the state kept it reads the chains' times."""
    target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=["a", "b"])
    first = quiet(NUTS(num_chains=3, num_warmup=20, num_draws=10, seed=0, progress_bar=False), target)
    assert first.info.total_time_s == first.info.time_s > 0
    chain_seconds = sum(c.warmup_time_s + c.sampling_time_s for c in first.engine_state.chains)
    assert chain_seconds > first.info.time_s            # three chains' times overlap within one wall
    more = quiet(NUTS(num_chains=3, num_warmup=20, num_draws=20, seed=0, progress_bar=False), target,
                 state=first.engine_state)
    assert more.info.total_time_s == pytest.approx(first.info.time_s + more.info.time_s, rel=1e-12)
    old = first.engine_state.state_dict()
    del old["wall_time"]
    assert MCMCState.from_state_dict(old).wall_time == pytest.approx(chain_seconds, rel=1e-12)


# ---------------------------------------------------------------------------------------------- interruption
class StopAt:
    def __init__(self, chain: int, iteration: int) -> None:
        self.chain, self.iteration = chain, iteration

    def __call__(self, chain, iteration, record):
        assert record["phase"] == ("warmup" if iteration < 30 else "sampling")
        if (chain, iteration) == (self.chain, self.iteration):
            raise KeyboardInterrupt


def small_hmc(seed=0, **kw):
    return HMC(step_size=0.3, num_leapfrog_steps=5, num_chains=2, num_warmup=30, num_draws=20, seed=seed,
               progress_bar=False, **kw)


@pytest.mark.parametrize("small", [small, small_hmc], ids=["NUTS", "HMC"])
def test_interrupt_keeps_draws_and_resume_equals_uninterrupted(gauss, tmp_path, small):
    full = quiet(small(seed=7), gauss)
    with pytest.warns(InterruptedRunWarning, match="1 chain"):
        part = small(seed=7).run(gauss, callback=StopAt(1, 30 + 10))
    assert part.draws.shape == (1, 20, 2)                     # the completed chain
    assert torch.equal(part.draws, full.draws[:1])
    assert part.info["interrupted"]
    st = part.engine_state
    assert st.chains[1].num_draws == 11                       # draw 10 was committed before the callback
    # resume after a round trip through disk (weights-only load: plain tensors and numbers)
    path = tmp_path / "state.pt"
    torch.save(st.state_dict(), path)
    loaded = torch.load(path, weights_only=True)
    resumed = quiet(small(seed=123), gauss, state=loaded)     # seed ignored when resuming
    assert torch.equal(resumed.draws, full.draws)
    for k in full.stats:
        assert torch.equal(resumed.stats[k], full.stats[k]), k
    assert not resumed.info["interrupted"]


def test_interrupt_in_first_chain(gauss):
    with pytest.warns(InterruptedRunWarning):
        part = small(seed=7).run(gauss, callback=StopAt(0, 30 + 4))
    assert part.draws.shape == (1, 5, 2)
    with pytest.raises(KeyboardInterrupt):
        small(seed=7).run(gauss, callback=StopAt(0, 10))      # still in warm-up: nothing to return


def test_interrupt_in_second_chain_then_resume(gauss):
    """The chains advance together: stopping chain 1 at its third draw leaves both chains part-way through their
    draws; the resumed run equals the uninterrupted one, and a stop during warm-up leaves nothing to return."""
    full = quiet(small(seed=8), gauss)
    with pytest.warns(InterruptedRunWarning):
        part = small(seed=8).run(gauss, callback=StopAt(1, 32))
    st = part.engine_state
    assert st.chains[1].num_draws == 3 and all(cs.warmed_up and cs.num_draws < 20 for cs in st.chains)
    k, m = part.draws.shape[:2]                                      # the largest block of the first k chains
    assert k * m == max(j * min(cs.num_draws for cs in st.chains[:j]) for j in (1, 2))
    resumed = quiet(small(seed=8), gauss, state=st)
    assert torch.equal(resumed.draws, full.draws)
    with pytest.raises(KeyboardInterrupt):
        small(seed=8).run(gauss, callback=StopAt(1, 12))


def test_extend_run_equals_longer_run(gauss):
    short = quiet(small(seed=9), gauss)
    longer = quiet(NUTS(num_chains=2, num_warmup=30, num_draws=35, seed=9, progress_bar=False), gauss)
    extended = quiet(NUTS(num_chains=2, num_warmup=30, num_draws=35, progress_bar=False), gauss,
                     state=short.engine_state)
    assert torch.equal(extended.draws, longer.draws)
    assert torch.equal(short.draws, longer.draws[:, :20])


def test_state_mismatch_is_rejected(gauss):
    run = quiet(small(seed=1), gauss)
    with pytest.raises(ValueError, match="num_warmup"):
        NUTS(num_chains=2, num_warmup=31, num_draws=20, progress_bar=False).run(gauss, state=run.engine_state)
    with pytest.raises(ValueError, match="num_draws must be >= 20"):
        NUTS(num_chains=2, num_warmup=30, num_draws=10, progress_bar=False).run(gauss, state=run.engine_state)
    other = gpvi.Target(gauss_log_joint, ["x", "y"])
    with pytest.raises(ValueError, match="parameters"):
        small().run(other, state=run.engine_state)
    with pytest.raises(ValueError, match="MCMCState"):
        small().run(gauss, state={"kind": "dsvi"})


def assert_same_tree(a, b, where="state"):
    """Deep equality of nested dicts / lists / tensors / numbers (tensors bit for bit)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_same_tree(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tree(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    else:
        assert a == b, where


@pytest.mark.parametrize("as_dict", [False, True], ids=["MCMCState", "state_dict"])
def test_run_with_state_never_changes_the_state(gauss, as_dict):
    with pytest.warns(InterruptedRunWarning):
        part = small(seed=7).run(gauss, callback=StopAt(1, 30 + 10))
    given = part.engine_state.state_dict() if as_dict else part.engine_state
    before = copy.deepcopy(given if as_dict else given.state_dict())
    resumed = quiet(NUTS(num_chains=2, num_warmup=30, num_draws=35, progress_bar=False), gauss, state=given)
    assert resumed.draws.shape == (2, 35, 2)
    assert_same_tree(before, given if as_dict else given.state_dict())
    # the posteriors keep their own states: the interrupted one still ends where it was interrupted
    assert part.engine_state.chains[1].num_draws == 11
    assert resumed.engine_state is not given and resumed.engine_state.chains[1].num_draws == 35
    again = quiet(NUTS(num_chains=2, num_warmup=30, num_draws=35, progress_bar=False), gauss,
                  state=resumed.engine_state)
    assert torch.equal(again.draws, resumed.draws)            # nothing left to do: same draws, state untouched
    assert resumed.engine_state.chains[1].num_draws == 35


def test_state_counts_transitions_time_and_evaluations(gauss_run):
    st = gauss_run.engine_state
    assert st.t == 4 * (W_GAUSS + S_GAUSS)
    assert st.wall_time > 0
    assert st.counters["num_evaluations"] == sum(gauss_run.info["num_evaluations"])
    assert st.counters["divergences"] == gauss_run.info["divergences"]
    copied = st.copy()
    assert copied.chains[0].draws is not st.chains[0].draws
    assert torch.equal(copied.chains[0].draws, st.chains[0].draws)


def test_state_with_init_or_generator_is_refused(gauss):
    run = quiet(small(seed=1), gauss)
    with pytest.raises(ValueError, match="state cannot be combined with init or generator"):
        small().run(gauss, init=[0.0, 0.0], state=run.engine_state)
    with pytest.raises(ValueError, match="state cannot be combined with init or generator"):
        small().run(gauss, generator=torch.Generator().manual_seed(0), state=run.engine_state)
    with pytest.raises(TypeError, match="callback"):
        small().run(gauss, callback=3)


# ---------------------------------------------------------------------------------------------- init
def test_init_from_point_gaussian_and_rows(gauss):
    point = PointPosterior(torch.tensor([0.5, 0.5], dtype=torch.float64), ["a", "b"], gauss)
    eng = NUTS(num_chains=3, seed=0, init_scale=0.01, progress_bar=False)
    starts = eng.initial_points(gauss, point)
    assert starts.shape == (3, 2)
    assert float((starts - 0.5).abs().max()) < 0.05           # 5 sd of the jitter
    assert not torch.equal(starts[0], starts[1])
    q = GaussianPosterior(MEAN.clone(), torch.linalg.cholesky(COV), ["a", "b"], gauss)
    starts_q = eng.initial_points(gauss, q)
    assert torch.equal(starts_q, eng.initial_points(gauss, q))   # seeded
    assert not torch.equal(starts_q, eng.initial_points(gauss, q, seed=1))
    rows = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]], dtype=torch.float64)
    assert torch.equal(eng.initial_points(gauss, rows), rows)
    mc = quiet(NUTS(num_chains=3, num_warmup=5, num_draws=5, seed=0, progress_bar=False), gauss, init=rows)
    assert torch.equal(mc.info["inits"], rows)
    # ML-II fit of a GP as init
    X, y = make_gp_data(n=30, d=1)
    model = gpvi.GPRegression(X, y)
    fit = gpvi.ML2(num_restarts=1, seed=0).run(model)
    s = NUTS(num_chains=2, seed=0, progress_bar=False).initial_points(model, fit)
    assert float((s - fit.theta).abs().max()) < 0.5


def test_default_init_uses_initial_theta():
    X, y = make_gp_data(n=30, d=1)
    model = gpvi.GPRegression(X, y)
    s = NUTS(num_chains=2, seed=0, init_scale=0.0, progress_bar=False).initial_points(model)
    assert torch.equal(s, model.initial_theta().expand(2, -1))


def test_laplace_start_draws_from_its_scale_unless_init_scale_is_given(gauss):
    """init="laplace": chain starts theta_c = MAP + C z_c with C C^T = (-Hessian)^-1 (here exactly COV)."""
    eng = NUTS(num_chains=3, num_warmup=5, num_draws=5, seed=0, progress_bar=False)
    starts = eng.initial_points(gauss, "laplace")
    z = torch.randn((3, 2), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(starts, MEAN + z @ torch.linalg.cholesky(COV).T, rtol=0, atol=1e-4)
    mc = quiet(eng, gauss, init="laplace")
    assert mc.info["init"]["chains"] == "draws from the start's scale (laplace)"
    assert mc.info["init"]["mean"] == "map" and mc.info["init"]["scale"] == "laplace"
    assert torch.equal(mc.info["inits"], starts)
    # an explicit init_scale takes precedence over a Laplace scale (0: every chain starts at the MAP)
    at_map = NUTS(num_chains=3, seed=0, init_scale=0.0, progress_bar=False).initial_points(gauss, "laplace")
    assert torch.equal(at_map, at_map[:1].expand(3, -1))
    torch.testing.assert_close(at_map[0], MEAN, rtol=0, atol=1e-4)
    # ... but never over a posterior's (a warm start from DSVI's Gaussian)
    q = GaussianPosterior(MEAN.clone(), torch.linalg.cholesky(COV), ["a", "b"], gauss)
    from_q = NUTS(num_chains=3, seed=0, init_scale=0.0, progress_bar=False).initial_points(gauss, q)
    assert not torch.equal(from_q[0], from_q[1])


def test_init_from_draws_of_another_run(gauss, gauss_run):
    with pytest.raises(TypeError, match=r"sample\(num_chains, seed=...\)"):
        small().run(gauss, init=gauss_run)
    rows = gauss_run.sample(2, seed=0)
    mc = quiet(small(), gauss, init=rows)
    assert torch.equal(mc.info["inits"], rows) and mc.info["init"]["chains"] == "given rows"
    assert torch.equal(small().initial_points(gauss, init_to_chains(rows)), rows)


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("make, match", [
    (lambda: NUTS(num_chains=0), "num_chains"),
    (lambda: NUTS(num_draws=0), "num_draws"),
    (lambda: NUTS(num_warmup=-1), "num_warmup"),
    (lambda: NUTS(max_tree_depth=0), "max_tree_depth"),
    (lambda: NUTS(adaptation=Adaptation(target_accept=1.0)), "target_accept"),
    (lambda: NUTS(step_size=0.0), "step_size"),
    (lambda: NUTS(init_scale=-1.0), "init_scale"),
    (lambda: NUTS(checks=ConvergenceChecks(max_r_hat=0.9)), "max_r_hat"),
    (lambda: NUTS(checks=ConvergenceChecks(min_ess=-1.0)), "min_ess"),
    (lambda: NUTS(seed=-1), "seed"),
], ids=["num_chains", "num_draws", "num_warmup", "max_tree_depth", "target_accept", "step_size", "init_scale",
        "max_r_hat", "min_ess", "seed"])
def test_bad_settings(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_settings_types():
    with pytest.raises(TypeError, match="adaptation"):
        NUTS(adaptation={"target_accept": 0.9})
    with pytest.raises(TypeError, match="checks"):
        NUTS(checks=None)
    with pytest.raises(TypeError, match="dense_mass"):
        Adaptation(dense_mass="yes")
    with pytest.raises(TypeError, match="progress_bar"):
        NUTS(progress_bar="yes")
    with pytest.raises(TypeError, match="num_chains"):
        NUTS(num_chains=2.5)
    with pytest.raises(ValueError, match="num_leapfrog_steps"):
        HMC(num_leapfrog_steps=0)
    with pytest.raises(ValueError, match="step_size"):
        HMC(step_size=-0.1)


def test_bad_init(gauss):
    eng = small()
    with pytest.raises(ValueError, match="init contains .*non-finite"):
        eng.run(gauss, init=[float("nan"), 0.0])
    with pytest.raises(ValueError, match="init must have length D = 2"):
        eng.run(gauss, init=[0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="num_chains = 2 rows"):
        eng.run(gauss, init=torch.zeros(3, 2))
    with pytest.raises(ValueError, match="init is a point estimate over"):
        eng.run(gauss, init=PointPosterior(torch.zeros(2, dtype=torch.float64), ["x", "y"]))
    with pytest.raises(TypeError, match="target"):
        eng.run(object())
    half = gpvi.Target(lambda th: torch.where(th[..., 0] > 0, -(th ** 2).sum(-1), -math.inf), ["a", "b"])
    with pytest.raises(ValueError, match="log joint is -inf at the start"):
        eng.run(half, init=[-1.0, 0.0])


# ---------------------------------------------------------------------------------------------- outputs
def test_convergence_warning_names_the_problem(gauss):
    with pytest.warns(ConvergenceWarning, match="smallest bulk or tail ESS"):
        NUTS(num_chains=2, num_warmup=20, num_draws=20, seed=0, progress_bar=False,
             checks=ConvergenceChecks(min_ess=1e6)).run(gauss)


def test_to_arviz_round_trip(gauss_run):
    az = pytest.importorskip("arviz")
    idata = gauss_run.to_arviz()
    assert isinstance(idata, az.InferenceData)
    assert list(idata.posterior.data_vars) == ["a", "b"]
    assert idata.posterior["a"].shape == (4, S_GAUSS)
    torch.testing.assert_close(torch.as_tensor(idata.posterior["b"].values), gauss_run.draws[:, :, 1])
    assert idata.sample_stats["diverging"].shape == (4, S_GAUSS)
    assert set(gauss_run.stats) <= set(idata.sample_stats.data_vars)
    assert idata.warmup_posterior["a"].shape == (4, W_GAUSS)
    summ = az.summary(idata, kind="diagnostics")
    assert list(summ.index) == ["a", "b"]


def test_compare_identical_sample_sets_is_zero(gauss_run):
    t = compare(gauss_run, gauss_run)
    assert t.index == ["a", "b"]
    assert t.column("dmean_sd") == [0.0, 0.0]
    assert t.column("sd_ratio") == [1.0, 1.0]
    assert t.column("w1") == [0.0, 0.0]


def test_state_dict_is_plain(gauss_run):
    sd = gauss_run.engine_state.state_dict()
    st = MCMCState.from_state_dict(sd)
    assert st.num_chains == 4
    assert torch.equal(st.chains[2].draws, gauss_run.draws[2])
    assert "engine_state" in gauss_run.state_dict()


def test_progress_bar_runs(gauss, capsys):
    quiet(NUTS(num_chains=1, num_warmup=5, num_draws=5, seed=0, progress_bar=True), gauss)
    assert "NUTS chain 1/1" in capsys.readouterr().err
    quiet(NUTS(num_chains=1, num_warmup=5, num_draws=5, seed=0, progress_bar=False), gauss)
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_gp_posterior_agrees_with_pyros_nuts():
    """gpvi's NUTS against Pyro's NUTS kernel (the previous release's sampler) on the same GP log joint (ARD, N = 30,
    D = 5): every mean within 4 combined Monte Carlo standard errors, every sd within 15 %."""
    import pyro
    from pyro.infer.mcmc import MCMC, NUTS as PyroNUTS
    X, y = make_gp_data(n=30, d=3, seed=4)
    model = gpvi.GPRegression(X, y)
    mc = quiet(NUTS(num_chains=4, num_warmup=400, num_draws=800, seed=0, progress_bar=False), model)

    def potential(z):
        return -model.log_joint(z["theta"].unsqueeze(0))[0]

    chains = []
    g = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for c in range(4):
            pyro.set_rng_seed(c)
            init = model.initial_theta() + 0.1 * torch.randn(model.dim, generator=g, dtype=torch.float64)
            run = MCMC(PyroNUTS(potential_fn=potential, use_multinomial_sampling=True), num_samples=800,
                       warmup_steps=400, initial_params={"theta": init}, disable_progbar=True)
            run.run()
            chains.append(run.get_samples()["theta"])
    ref = torch.stack(chains)                                           # (4, 800, D)
    ess_ref = effective_sample_size(ref, chain_dim=0, sample_dim=1)
    flat = ref.reshape(-1, model.dim)
    se = torch.sqrt(mc.std ** 2 / mc.ess() + flat.std(0) ** 2 / ess_ref)
    assert bool(((mc.mean - flat.mean(0)).abs() <= 4 * se).all()), (mc.mean, flat.mean(0), se)
    assert bool(((mc.std / flat.std(0) - 1).abs() < 0.15).all()), (mc.std, flat.std(0))
