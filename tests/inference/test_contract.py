"""The engine contract, checked the same way for every iterative engine that runs through the one driver.

For each engine: seeded runs repeat exactly; resuming twice from one state gives identical results and leaves
the earlier posterior (and the state handed in) unchanged; interrupt after k steps then resume equals the
uninterrupted run bit for bit; a start where the log joint is not finite is refused at once; a NaN log joint
injected mid-run is skipped and counted, then reported by a NumericalFaultError that keeps the state; the
progress bar on and off gives the same answer; the final estimate follows the memory budget.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import gpvi
from gpvi.exceptions import InterruptedRunWarning, NumericalFaultError, NumericalWarning
from gpvi.numerics.budget import MemoryBudget
from gpvi.inference.dsvi import SGD
from gpvi.inference.contract import FaultPolicy

M = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)


def _gauss(th: torch.Tensor) -> torch.Tensor:
    return -0.5 * ((th - M) ** 2).sum(-1)


def _lik(th: torch.Tensor) -> torch.Tensor:          # a log likelihood for DSVI-ARD (it brings its own prior)
    return -0.5 * ((th - M) ** 2).sum(-1) * 4.0


def _dsvi(**kw):
    return gpvi.DSVI(optimizer=SGD(lr=0.1), seed=3, progress_bar=False, num_elbo_draws=50, **kw)


def _ard(**kw):
    kw.setdefault("num_steps", 60)
    return gpvi.inference.dsvi.DSVIARD(lr=0.05, seed=3, progress_bar=False, num_elbo_draws=50, **kw)


def _sk(**kw):
    return gpvi.SKGaussian(num_steps=kw.pop("num_steps", 60), seed=3, progress_bar=False, num_elbo_draws=50, **kw)


ENGINES = {
    "sk-gaussian": (_sk, _gauss),
    "dsvi-full": (lambda **kw: _dsvi(num_steps=kw.pop("num_steps", 60), **kw), _gauss),
    "dsvi-diag": (lambda **kw: _dsvi(scale="diag", num_steps=kw.pop("num_steps", 60), **kw), _gauss),
    "dsvi-sgd-t": (lambda **kw: _dsvi(base=("t", 5.0), num_steps=kw.pop("num_steps", 60), **kw), _gauss),
    "dsvi-ard": (_ard, _lik),
}


def _run(engine, target, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return engine.run(target, **kw)


def _stop_at(k):
    def cb(state, info):
        if state.t == k:
            raise KeyboardInterrupt
    return cb


def _same_state(a, b) -> None:
    """Two state_dicts hold equal values (tensors bitwise)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same_state(a[k], b[k])
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same_state(x, y)
    else:
        assert a == b or (a != a and b != b)


def _same(a, b) -> None:
    assert torch.equal(a.mean, b.mean)
    assert torch.equal(a.scale_tril, b.scale_tril)
    assert (math.isnan(a.elbo) and math.isnan(b.elbo)) or a.elbo == b.elbo


@pytest.fixture(params=sorted(ENGINES))
def case(request):
    make, fn = ENGINES[request.param]
    return make, gpvi.Target(fn, names=3)


def test_seeded_runs_repeat_exactly(case):
    make, target = case
    _same(_run(make(), target), _run(make(), target))


def test_resuming_twice_gives_identical_results_and_changes_nothing_handed_in(case):
    make, target = case
    part = _run(make(), target, callback=_stop_at(30))
    before = part.engine_state.state_dict()
    mean_before = part.mean.clone()
    a = _run(make(), target, state=part.engine_state)
    b = _run(make(), target, state=part.engine_state)
    _same(a, b)
    assert part.engine_state.t == 30 and torch.equal(part.mean, mean_before)
    _same_state(part.engine_state.state_dict(), before)


def test_interrupt_then_resume_equals_the_uninterrupted_run(case):
    make, target = case
    full = _run(make(), target)
    with pytest.warns(InterruptedRunWarning):
        part = make().run(target, callback=_stop_at(17))
    assert part.info["interrupted"] and part.engine_state.t == 17
    _same(_run(make(), target, state=part.engine_state.state_dict()), full)


def test_nan_log_joint_mid_run_is_skipped_counted_then_a_fault_error_keeps_the_state(case):
    make, _ = case
    calls = {"n": 0}

    def flaky(th):
        calls["n"] += 1
        out = -0.5 * ((th - M) ** 2).sum(-1)
        return out if calls["n"] <= 12 else torch.full_like(out, math.nan)

    eng = make(num_steps=200, faults=FaultPolicy(max_consecutive=4, max_resample=1))
    with pytest.warns(NumericalWarning), pytest.raises(NumericalFaultError, match="consecutive") as err:
        eng.run(gpvi.Target(flaky, names=3))
    st = err.value.state
    assert st.counters["skipped_steps"] == 4 and st.consecutive_failures == 4
    assert bool(torch.isfinite(getattr(st, "mu", getattr(st, "m", None))).all())
    assert err.value.partial.info["skipped_steps"] == 4


def test_a_start_where_the_log_joint_is_not_finite_is_refused_at_once(case):
    """Every engine checks its start in init (one evaluation, a ValueError naming the point): no steps are taken."""
    make, _ = case
    calls = {"n": 0}

    def fn(th):
        calls["n"] += 1
        return torch.where(th[:, 0] < 0, torch.full_like(th[:, 0], -math.inf), -0.5 * ((th - M) ** 2).sum(-1))

    with pytest.raises(ValueError, match=r"log joint is -inf at the start theta=\[-1, 0, 2\]"):
        make(num_steps=200).run(gpvi.Target(fn, names=3), init=torch.tensor([-1.0, 0.0, 2.0]))
    assert calls["n"] == 1


def test_progress_bar_on_and_off_give_the_same_answer(case, capsys):
    make, target = case
    off = _run(make(), target)
    eng = make()
    eng.progress_bar = True
    on = _run(eng, target)
    _same(on, off)


def test_final_estimate_follows_the_memory_budget():
    class Sized(gpvi.Target):
        def memory_per_draw(self):
            return 1000                      # bytes per draw, as a GP target reports N x N copies

    sizes = []

    def fn(th):
        sizes.append(th.shape[0])
        return _gauss(th)

    target = Sized(fn, names=3)
    q = _run(gpvi.DSVI(optimizer=SGD(lr=0.1), num_steps=10, seed=0, progress_bar=False, num_elbo_draws=40), target,
             budget=MemoryBudget(max_bytes=3500))
    assert q.info["elbo_chunks"]["draws_per_call"] == 3 and q.info["elbo_chunks"]["calls"] == 14
    assert max(sizes[-14:]) == 3 and sum(sizes[-14:]) == 40
    with pytest.raises(ValueError, match="max_bytes"):
        MemoryBudget(max_bytes=0)


def test_gp_regression_reports_its_memory_per_draw():
    X = torch.linspace(0, 1, 50, dtype=torch.float64).unsqueeze(-1)
    model = gpvi.GPRegression(X, torch.sin(6 * X[:, 0]))
    assert model.memory_per_draw() == 5 * 50 * 50 * 8
    assert MemoryBudget(max_bytes=10 * 50 * 50 * 8).draws_per_call(model, 250) == 2


# ------------------------------------------------------------------ CVI: the same contract on a latent GP
def _cvi_model():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, generator=g, dtype=torch.float64)
    y = (X[:, 0] + 0.3 * torch.randn(40, generator=g, dtype=torch.float64) > 0.5).long()
    return gpvi.GPClassification(X, y, likelihood="probit")


def _cvi(mode):
    return lambda **kw: gpvi.CVI(mode=mode, num_steps=kw.pop("num_steps", 60), tol=0, seed=3, progress_bar=False, **kw)


def _same_latent(a, b) -> None:
    assert torch.equal(a.mean, b.mean) and torch.equal(a.std, b.std)
    assert torch.equal(a.sites[0], b.sites[0]) and torch.equal(a.sites[1], b.sites[1])
    assert a.elbo == b.elbo


@pytest.mark.parametrize("mode", ["full", "stochastic"])
def test_cvi_keeps_the_contract(mode):
    make, model = _cvi(mode), _cvi_model()
    full = _run(make(), model)
    _same_latent(_run(make(), model), full)                                  # seeded runs repeat exactly
    eng = make()
    eng.progress_bar = True
    _same_latent(_run(eng, model), full)                                     # bar on or off: same answer
    with pytest.warns(InterruptedRunWarning):
        part = make().run(model, callback=_stop_at(17))
    assert part.info["interrupted"] and part.engine_state.t == 17
    before, mean_before = part.engine_state.state_dict(), part.mean.clone()
    a = _run(make(), model, state=part.engine_state)
    b = _run(make(), model, state=part.engine_state.state_dict())
    _same_latent(a, full)                                                    # interrupt + resume = uninterrupted
    _same_latent(b, full)
    assert part.engine_state.t == 17 and torch.equal(part.mean, mean_before)  # nothing handed in changed
    _same_state(part.engine_state.state_dict(), before)
