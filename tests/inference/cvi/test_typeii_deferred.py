"""TypeII's engine runs build their posterior only where it is used, and its final posterior and between-phase runs
reuse what was computed (``gpvi.inference.cvi.deferred``, issue 59): the answers against the loop with every run's
posterior and every between-run's starting bound computed (the engine's own ``run``), the posteriors built, and a
faulted run's partial posterior."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from gpvi.exceptions import NumericalFaultError
from gpvi.inference.cvi import CVI, deferred, steps, typeii
from gpvi.inference.cvi.engine import CVI as Engine
from gpvi.inference.cvi.typeii import TypeII
from gpvi.models.classification import GPClassification
from gpvi.models.multiclass import GPMulticlass
from gpvi.posteriors.latent import LatentPosterior


def _binary(n=90, seed=5):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1.0, 1.0, size=(n, 2))
    y = ((X[:, 0] * X[:, 1] > 0) ^ (rng.uniform(size=n) < 0.05)).astype(int)
    return GPClassification(torch.as_tensor(X), torch.as_tensor(y))


def _three(n=60, seed=2):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2.0, 2.0, size=(n, 1))
    y = (X[:, 0] > -0.6).astype(int) + (X[:, 0] > 0.6).astype(int)
    y[rng.uniform(size=n) < 0.05] = 1
    return GPMulticlass(torch.as_tensor(X), torch.as_tensor(y))


def _eager(engine, model, init=None, *, unscored=False, **kw):
    """The engine's own run, with the bound of a between-run's start computed first (the loop before issue 59's
    deferred runs)."""
    if unscored:
        st = kw["state"]
        st.elbo = steps.elbo_from_sites(engine, model, st.lam1, st.lam2, st.theta)[0]
    return engine.run(model, init, **kw)


def _fit(model, monkeypatch=None, eager=False, **kw):
    """A type-II fit and the number of posteriors built; ``eager``: every run through the engine's own ``run``
    (the loop before the runs' posteriors were deferred)."""
    calls = {"n": 0, "bounds": 0}
    orig, bound = Engine.posterior, steps.elbo_from_sites

    def counted(self, *a, **k):
        calls["n"] += 1
        return orig(self, *a, **k)

    def bounds(*a, **k):
        calls["bounds"] += 1
        return bound(*a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Engine, "posterior", counted)
        mp.setattr(steps, "elbo_from_sites", bounds)
        if eager:
            mp.setattr(typeii, "run_deferred", _eager)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            post = TypeII(CVI(progress_bar=False, **kw)).run(model)
    return post, calls["n"], calls["bounds"]


def _same(a, b):
    assert a.elbo == b.elbo and a.info["objective"] == b.info["objective"]
    assert torch.equal(a.theta, b.theta) and torch.equal(a.lam1, b.lam1) and torch.equal(a.lam2, b.lam2)
    assert torch.equal(a.mean, b.mean) and torch.equal(a.var, b.var)
    for k in ("theta_evaluations", "inner_steps", "theta_phases", "converged", "steps"):
        assert a.info[k] == b.info[k], k


@pytest.mark.parametrize("make", [_binary, _three])
def test_deferred_posteriors_give_the_eager_loops_answer_bit_for_bit(make):
    lazy, n_lazy, b_lazy = _fit(make())
    eager, n_eager, b_eager = _fit(make(), eager=True)
    _same(lazy, eager)
    phases = lazy.info["theta_phases"]
    # eager: one posterior per engine run (the first and one between each two phases) and the final one
    assert n_eager == phases + 1 and n_lazy == 1 and phases >= 2
    # bounds computed outside the steps (posteriors: the engine runs', the final one; between-runs' starts): the
    # binary fit's final posterior from the last evaluation's pieces (both loops) and no between-run start; the
    # softmax's (centred, its cheaper inner rule) the final one and the between-runs' starts
    binary = make is _binary
    assert b_eager == (2 * phases - 1 if binary else 2 * phases) and b_lazy == (0 if binary else phases)


def test_a_run_the_loop_ends_on_is_built_as_the_engine_builds_it():
    # a step budget the first run spends before converging: the loop ends on that run, unconverged
    lazy, n, _ = _fit(_binary(), num_steps=2)
    eager, _, _ = _fit(_binary(), eager=True, num_steps=2)
    assert n == 1 and not lazy.converged and lazy.info["theta_phases"] == 0
    _same(lazy, eager)
    assert lazy.info["steps_this_run"] == eager.info["steps_this_run"] == 2


def test_a_faulted_deferred_run_raises_with_the_partial_posterior(monkeypatch):
    model = _binary()
    engine = CVI(progress_bar=False)

    def skipped(self, target, state):
        state.t += 1
        return state, {"skipped": True, "checked": False, "sites": 0, "beta": 0.0}

    monkeypatch.setattr(Engine, "step", skipped)
    with pytest.raises(NumericalFaultError) as err:
        deferred.run_deferred(engine, model)
    assert isinstance(err.value.partial, LatentPosterior)
    assert not hasattr(engine, "result") or "result" not in vars(engine)        # the engine given is not changed


def test_the_final_posterior_is_of_the_sites_the_objective_was_evaluated_at(monkeypatch):
    """Binary (the inner runs' bound is the engine's): the final posterior is of the best sites the last phase's
    objective evaluated, built from that evaluation's factor and marginals where at hand; against the engine's own
    posterior of the same state (recomputed from the sites) and the objective values L-BFGS-B saw."""
    values: list[list[float]] = []
    po, phase = typeii.profiled_objective, TypeII.phase

    def recording(*a, **kw):
        out = po(*a, **kw)
        values[-1].append(out[1])
        return out

    def tagged(self, *a, **kw):
        values.append([])
        return phase(self, *a, **kw)

    given = []
    orig = Engine.posterior

    def posterior(self, *a, **kw):
        given.append(kw.get("pieces") is not None)
        return orig(self, *a, **kw)

    monkeypatch.setattr(typeii, "profiled_objective", recording)
    monkeypatch.setattr(TypeII, "phase", tagged)
    monkeypatch.setattr(Engine, "posterior", posterior)
    model = _binary()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        post = TypeII(CVI(progress_bar=False)).run(model)
        fresh = CVI(progress_bar=False).posterior(model, post.engine_state)
    assert given == [True, False]                             # the fit's (from the pieces), then the fresh one
    assert post.info["objective"] == max(values[-1])          # the value the last phase maximised
    assert post.elbo == fresh.elbo and torch.equal(post.mean, fresh.mean) and torch.equal(post.var, fresh.var)
    assert torch.equal(post._L.tril(), fresh._L.tril()) and torch.equal(post._alpha, fresh._alpha)
