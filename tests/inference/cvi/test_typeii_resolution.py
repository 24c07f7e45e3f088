"""TypeII's resolution stop (issue 59): a phase ends at a trial point whose first-order change from its best point
is below ftol relative, at that best point; the answers of real fits against the rule without it."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gpvi import GPClassifier
from gpvi.inference.cvi import CVI, typeii
from gpvi.inference.cvi.typeii import TypeII
from gpvi.models.classification import GPClassification

F64 = torch.float64


def _phase(monkeypatch: pytest.MonkeyPatch, bias: float, resolution: bool) -> tuple[tuple, dict, list]:
    """TypeII.phase on a quadratic objective whose gradient carries an error of norm ``bias`` at right angles to the
    true gradient (the envelope gradient's floor under the fixed quasi-Monte Carlo rule: near the optimum the value
    no longer rises along it), with the inner runs replaced by the closed form; returns (phase's result, counters,
    evaluated thetas)."""
    X = torch.linspace(-1.0, 1.0, 12, dtype=F64).unsqueeze(-1)
    model = GPClassification(X, (X[:, 0] > 0).long())
    c = torch.tensor([0.3, -0.2], dtype=F64)
    seen: list[torch.Tensor] = []

    def objective(cvi, model, theta, lam1, lam2, counters, **kw):
        seen.append(theta.clone())
        val = -60.0 - 10.0 * float(((theta - c) ** 2).sum())
        r = theta - c
        turn = torch.stack((-r[1], r[0])) / max(float(r.norm()), 1e-300)
        grad = -20.0 * r + bias * turn
        return SimpleNamespace(lam1=lam1, lam2=lam2, t=2), val, grad

    monkeypatch.setattr(typeii, "profiled_objective", objective)
    counters: dict = {}
    state = SimpleNamespace(theta=torch.zeros(2, dtype=F64), lam1=torch.zeros(12, dtype=F64),
                            lam2=torch.full((12,), -0.5, dtype=F64), counters=counters)
    out = TypeII(CVI(progress_bar=False), resolution=resolution).phase(model, state, None)
    return out, counters, seen


def test_a_phase_with_a_gradient_floor_ends_at_the_resolution_at_its_best_point(monkeypatch):
    """A gradient error of norm 0.05 (the objective no longer rises along the gradient near the optimum): without the
    rule L-BFGS-B's line searches spend evaluations at steps it cannot resolve; with it the phase ends as
    stationary, at the best point it evaluated, with fewer evaluations, inside the region where the gradient's
    error is larger than the true gradient (|theta - c| <= 0.05 / 20, value >= -60 - 10 (0.05 / 20)^2), as the
    phase without the rule is (measured: 11 evaluations against 46, values -60.0000313 and -60.0000243)."""
    (th1, _, _, f1, _, stat1, _, _), c1, seen1 = _phase(monkeypatch, 0.05, True)
    (th0, _, _, f0, _, _, _, _), c0, seen0 = _phase(monkeypatch, 0.05, False)
    assert c1["theta_resolution_stops"] == 1 and "theta_resolution_stops" not in c0
    assert stat1 and c1["theta_evaluations"] < c0["theta_evaluations"]
    vals = [-60.0 - 10.0 * float(((t - torch.tensor([0.3, -0.2], dtype=F64)) ** 2).sum()) for t in seen1]
    assert f1 == max(vals) and any(torch.equal(th1, t) for t in seen1)
    floor = -60.0 - 10.0 * (0.05 / 20.0) ** 2
    assert f1 >= floor and f0 >= floor


def test_a_consistent_objective_reaches_its_optimum_with_the_rule(monkeypatch):
    """No gradient error: the rule leaves the optimum where L-BFGS-B finds it (theta within 1e-4, value within
    ftol's change)."""
    (th1, _, _, f1, _, stat1, _, _), _, _ = _phase(monkeypatch, 0.0, True)
    (th0, _, _, f0, _, _, _, _), _, _ = _phase(monkeypatch, 0.0, False)
    c = torch.tensor([0.3, -0.2], dtype=F64)
    assert stat1 and float((th1 - c).abs().max()) < 1e-4 and float((th0 - c).abs().max()) < 1e-4
    assert abs(f1 - f0) <= 1e-8 * 60


def _fit(X, y, resolution):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = GPClassifier(random_state=0)
        clf.fit(X, y)
    return clf


@pytest.mark.parametrize("k", [4])
def test_four_class_fit_with_the_rule_against_the_rule_without_it(monkeypatch, k):
    """A 4-class type-II fit (the fixed quasi-Monte Carlo rule) with its fine phases (``fine_fixed=True``), with
    and without the stop: no more theta evaluations with it, objective within 1e-6 relative, test probabilities
    within 1e-3. The default (``fine_fixed=False``: the coarse phase is the last) against both: one phase, fewer
    evaluations, objective within 1e-6 relative, probabilities within 1e-3."""
    rng = np.random.default_rng(7)
    centres = rng.normal(scale=3.0, size=(k, 2))
    y = np.repeat(np.arange(k), 20)
    X = centres[y] + rng.normal(scale=1.5, size=(y.size, 2))
    Xt = rng.normal(scale=3.0, size=(50, 2))
    out = {}
    for on, fine in ((False, True), (True, True), (True, False)):
        init = TypeII.__init__

        def patched(self, *a, _on=on, _fine=fine, **kw):
            kw.setdefault("resolution", _on)
            kw.setdefault("fine_fixed", _fine)
            init(self, *a, **kw)

        monkeypatch.setattr(TypeII, "__init__", patched)
        clf = _fit(X, y, on)
        monkeypatch.setattr(TypeII, "__init__", init)
        info = clf.posterior_.info
        assert info["type_ii"]["resolution"] is on and info["type_ii"]["fine_fixed"] is fine
        out[on, fine] = (info["theta_evaluations"], info["objective"], clf.predict_proba(Xt), info["theta_phases"])
    assert out[True, True][0] <= out[False, True][0]
    assert out[True, False][3] == 1 and out[True, True][3] >= 2
    assert out[True, False][0] < out[True, True][0]
    for a, b in ((out[True, True], out[False, True]), (out[True, False], out[True, True])):
        assert a[1] == pytest.approx(b[1], rel=1e-6)
        assert np.abs(a[2] - b[2]).max() < 1e-3


def test_three_classes_keep_their_fine_phases():
    """fine_fixed concerns the fixed quasi-Monte Carlo rule only: a 3-class fit (quadrature) runs its fine phase
    after the coarse one whatever the setting."""
    rng = np.random.default_rng(8)
    y = np.repeat(np.arange(3), 15)
    X = rng.normal(scale=3.0, size=(3, 2))[y] + rng.normal(scale=1.5, size=(y.size, 2))
    assert _fit(X, y, True).posterior_.info["theta_phases"] >= 2


def test_phases_back_to_back_without_the_engines_run_between_them():
    """between_runs=False: the same optimum (objective within 1e-7 relative) with fewer outer CVI steps; the
    default keeps the engine's run between phases."""
    rng = np.random.default_rng(9)
    X = rng.normal(size=(60, 2))
    y = (X[:, 0] * X[:, 1] + 0.3 * rng.normal(size=60) > 0).astype(int)
    Xt = torch.as_tensor(X)
    out = {}
    for between in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            post = TypeII(CVI(progress_bar=False), between_runs=between).run(
                GPClassification(Xt, torch.as_tensor(y)))
        out[between] = post
        assert post.info["type_ii"]["between_runs"] is between and post.info["theta_phases"] >= 2
    assert out[False].info["steps"] < out[True].info["steps"]
    assert out[False].info["objective"] == pytest.approx(out[True].info["objective"], rel=1e-7)
