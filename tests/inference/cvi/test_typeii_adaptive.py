"""TypeII's coarse phase with its inner tolerance from each trial point's first-order change (``coarse_adaptive``,
issue 59): the tolerances its inner runs get, and the optimum of real fits against the fixed coarse tolerance."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from gpvi.inference.cvi import CVI, inner, typeii
from gpvi.inference.cvi.inner import trial_tol
from gpvi.inference.cvi.typeii import COARSE, TypeII
from gpvi.models.classification import GPClassification

F64 = torch.float64


def test_trial_tol_scales_with_the_first_order_change_within_its_bounds():
    g = torch.tensor([3.0, 4.0], dtype=F64)
    best = (-100.0, torch.zeros(2, dtype=F64), g)
    worse = (-200.0, torch.ones(2, dtype=F64), 100.0 * g)
    bad = (-math.inf, torch.full((2,), 9.0, dtype=F64), g)
    pairs = [worse, best, bad]
    th = torch.tensor([0.2, 0.0], dtype=F64)                     # |g| |d| = 1, relative to |F| = 100: 1e-2
    assert trial_tol(pairs, th, 1e-6, 1e-2, 1e-3) == pytest.approx(1e-4)
    assert trial_tol(pairs, th, 1e-6, 1.0, 1e-3) == 1e-3              # capped
    assert trial_tol(pairs, th * 1e-6, 1e-6, 1e-2, 1e-3) == 1e-6      # floored
    assert trial_tol([bad], th, 1e-6, 1e-2, 1e-3) == 1e-3             # no finite point yet: the cap
    assert trial_tol([], th, 1e-6, 1e-2, 1e-9) == 1e-6                # a cap below tol: tol


def _data(n=120, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1.0, 1.0, size=(n, 2))
    y = ((X[:, 0] * X[:, 1] > 0) ^ (rng.uniform(size=n) < 0.05)).astype(int)
    return GPClassification(torch.as_tensor(X), torch.as_tensor(y))


def _fit(monkeypatch, adaptive):
    """A type-II fit recording the inner tolerance of every evaluation with the phase it belongs to."""
    seen = []
    po, phase = typeii.profiled_objective, TypeII.phase
    where = {"coarse": None}

    def recording(*a, **kw):
        seen.append((where["coarse"], kw["tol"]))
        return po(*a, **kw)

    def tagged(self, model, state, prior, *, coarse=False, **kw):
        where["coarse"] = coarse
        return phase(self, model, state, prior, coarse=coarse, **kw)

    monkeypatch.setattr(typeii, "profiled_objective", recording)
    monkeypatch.setattr(TypeII, "phase", tagged)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        post = TypeII(CVI(progress_bar=False), coarse_adaptive=adaptive).run(_data())
    monkeypatch.setattr(typeii, "profiled_objective", po)
    monkeypatch.setattr(TypeII, "phase", phase)
    return post, seen


def test_the_coarse_phase_loosens_its_inner_runs_far_from_the_optimum_only(monkeypatch):
    """The default: the coarse phase's first point at COARSE["max_inner_tol"], every coarse tolerance within
    [COARSE["inner_tol"], COARSE["max_inner_tol"]] and its last ones back at COARSE["inner_tol"]; the fine phases
    at inner_tol. coarse_adaptive=None: COARSE["inner_tol"] throughout the coarse phase. The same optimum (objective
    within 1e-7 relative, theta within 2e-3), fewer inner steps."""
    post, seen = _fit(monkeypatch, TypeII().coarse_adaptive)
    fixed, seen0 = _fit(monkeypatch, None)
    assert TypeII().coarse_adaptive == 1e-2 and post.info["type_ii"]["coarse_adaptive"] == 1e-2
    coarse = [t for c, t in seen if c]
    assert coarse[0] == COARSE["max_inner_tol"] and coarse[-1] == COARSE["inner_tol"]
    assert all(COARSE["inner_tol"] <= t <= COARSE["max_inner_tol"] for t in coarse)
    assert all(t == 1e-9 for c, t in seen if not c) and any(not c for c, _ in seen)
    assert all(t == COARSE["inner_tol"] for c, t in seen0 if c) and fixed.info["type_ii"]["coarse_adaptive"] is None
    assert post.info["objective"] == pytest.approx(fixed.info["objective"], rel=1e-7)
    assert float((post.theta - fixed.theta).abs().max()) < 2e-3
    assert post.info["inner_steps"] < fixed.info["inner_steps"]


def test_coarse_adaptive_is_checked():
    with pytest.raises(ValueError, match="coarse_adaptive"):
        TypeII(coarse_adaptive=0.0)
    assert inner.trial_tol is trial_tol
