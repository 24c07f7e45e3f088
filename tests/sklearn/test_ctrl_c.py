"""Ctrl-C and GPClassifier (issue 58): ``KeyboardInterrupt`` leaves ``fit`` and stops a scikit-learn loop, and the
estimator is then not fitted; the engines called directly keep returning their partial, resumable result."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import cross_val_score
from sklearn.utils.validation import check_is_fitted

from gpvi.exceptions import InterruptedRunWarning
from gpvi.inference.cvi import CVI, TypeII
from gpvi.models.classification import GPClassification
from gpvi.models.multiclass import GPMulticlass
from gpvi.sklearn import GPClassifier

F64 = torch.float64
ROOT = Path(__file__).resolve().parents[2]


def small(n=40, seed=12, multiclass=False):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand((n, 2), generator=g, dtype=F64) * 4 - 2
    y = (torch.rand(n, generator=g, dtype=F64) < torch.sigmoid(3 * (torch.sin(2 * X[:, 0]) + X[:, 1]))).long()
    if multiclass:
        y = (X[:, 0] > -0.5).long() + (X[:, 1] > 0.5).long()
    return X, y


def interrupt(monkeypatch, target, name, allowed):
    """``target.name`` raises KeyboardInterrupt once, on call ``allowed + 1`` (one Ctrl-C); returns the call count."""
    calls = {"n": 0}
    original = getattr(target, name)

    def patched(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == allowed + 1:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, patched)
    return calls


def assert_not_fitted(clf):
    with pytest.raises(NotFittedError):
        check_is_fitted(clf)
    assert not [v for v in vars(clf) if v.endswith("_") and not v.startswith("__")]
    with pytest.raises(NotFittedError):
        clf.predict_proba(np.zeros((2, 2)))


@pytest.mark.parametrize("multiclass", [False, True])
@pytest.mark.parametrize("where", ["phase", "engine step"])
def test_ctrl_c_leaves_fit_and_the_estimator_is_not_fitted(monkeypatch, multiclass, where):
    """A KeyboardInterrupt during a type-II hyperparameter phase, or during a CVI step after the first run: ``fit``
    raises it (no partial fit, no InterruptedRunWarning), also when the estimator held an earlier fit."""
    X, y = small(multiclass=multiclass)
    clf = GPClassifier(hyperparameters="fixed").fit(X, y)            # an earlier fit: it must not survive
    check_is_fitted(clf)
    target, name = (TypeII, "phase") if where == "phase" else (CVI, "step")
    calls = interrupt(monkeypatch, target, name, allowed=0 if where == "phase" else 3)
    clf.set_params(hyperparameters="type2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(KeyboardInterrupt):
            clf.fit(X, y)
    assert not [w for w in caught if issubclass(w.category, InterruptedRunWarning)]   # no "returning the result"
    assert calls["n"] == (1 if where == "phase" else 4)               # stopped at the interrupt, nothing after it
    assert_not_fitted(clf)
    clf.fit(X, y)                                                     # a later fit works as before
    assert clf.predict_proba(X).shape == (40, 3 if multiclass else 2)


@pytest.mark.parametrize("multiclass", [False, True])
@pytest.mark.parametrize("where", ["phase", "engine step"])
def test_the_engines_called_directly_still_return_their_partial_result(monkeypatch, multiclass, where):
    """The engine layer is unchanged: TypeII around CVI, interrupted, warns and returns its partial posterior,
    flagged interrupted and not converged."""
    X, y = small(multiclass=multiclass)
    model = GPMulticlass(X, y) if multiclass else GPClassification(X, y)
    target, name = (TypeII, "phase") if where == "phase" else (CVI, "step")
    calls = interrupt(monkeypatch, target, name, allowed=0 if where == "phase" else 3)
    with pytest.warns(InterruptedRunWarning):
        post = TypeII(CVI()).run(model)
    info = post.info
    assert calls["n"] == (1 if where == "phase" else 4)
    assert info["interrupted"] is True and info["converged"] is False and info["stopped_early"] is False
    assert post.converged is False
    assert post.predict_proba(X).shape == ((40, 3) if multiclass else (40,))     # the partial posterior predicts


def test_a_partial_result_without_its_warning_is_not_kept(monkeypatch):
    """Whatever path a partial result takes (here an engine that returns one without warning), ``fit`` does not
    keep it: ``info["interrupted"]`` is checked too."""
    X, y = small()
    original = CVI.run

    def partial(self, *args, **kwargs):
        post = original(self, *args, **kwargs)
        return post._with_info({"interrupted": True})

    monkeypatch.setattr(CVI, "run", partial)
    clf = GPClassifier(hyperparameters="fixed")
    with pytest.raises(KeyboardInterrupt):
        clf.fit(X, y)
    assert_not_fitted(clf)


def test_ctrl_c_stops_cross_val_score(monkeypatch):
    """The user's loop stops: one Ctrl-C in the second fold of a 5-fold cross-validation leaves ``cross_val_score``
    (today's bug: the fold was scored on a partial fit and the loop went on)."""
    X, y = small(60)
    fits = []
    set_fitted = GPClassifier._set_fitted

    def counting(self, *args, **kwargs):
        fits.append(1)
        return set_fitted(self, *args, **kwargs)

    step = CVI.step

    def ctrl_c_in_fold_two(self, *args, **kwargs):
        if len(fits) == 1:
            raise KeyboardInterrupt
        return step(self, *args, **kwargs)

    monkeypatch.setattr(GPClassifier, "_set_fitted", counting)
    monkeypatch.setattr(CVI, "step", ctrl_c_in_fold_two)
    with pytest.raises(KeyboardInterrupt):
        cross_val_score(GPClassifier(hyperparameters="fixed", max_sweeps=20), X.numpy(), y.numpy(), cv=5)
    assert len(fits) == 1


_SCENARIO = """
import os, signal
signal.signal(signal.SIGINT, signal.default_int_handler)   # as in a terminal (a background job inherits SIG_IGN)
import numpy as np
from sklearn.model_selection import cross_val_score
from gpvi.inference.cvi import CVI
from gpvi.sklearn import GPClassifier

rng = np.random.default_rng(0)
X = rng.uniform(-2, 2, size=(60, 2))
y = (rng.uniform(size=60) < 1 / (1 + np.exp(-3 * (np.sin(2 * X[:, 0]) + X[:, 1])))).astype(int)
fits, step, set_fitted = [], CVI.step, GPClassifier._set_fitted

def counting(self, *args, **kwargs):
    fits.append(1)
    return set_fitted(self, *args, **kwargs)

def step_with_ctrl_c(self, *args, **kwargs):
    if len(fits) == 1 and not getattr(CVI, "pressed", False):   # fold 2: the user presses Ctrl-C once
        CVI.pressed = True
        os.kill(os.getpid(), signal.SIGINT)
    return step(self, *args, **kwargs)

GPClassifier._set_fitted, CVI.step = counting, step_with_ctrl_c
scores = cross_val_score(GPClassifier(hyperparameters="fixed", max_sweeps=20), X, y, cv=5)
print("scores", scores)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to oneself is POSIX")
def test_sigint_in_a_cross_validation_loop_ends_the_program():
    """The scenario as a user meets it: a real SIGINT (Ctrl-C) during fold 2 of ``cross_val_score`` in a Python
    process ends that process with KeyboardInterrupt instead of printing five scores."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_SCENARIO)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert "scores" not in proc.stdout
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr, proc.stderr[-2000:]


def test_ctrl_c_during_the_fully_bayesian_fit_leaves_fit(monkeypatch):
    """``hyperparameters="bayes"``: a Ctrl-C in the q(theta) engine's fifth step (today: the fit went on with the
    partial q(theta) and was "fitted") leaves ``fit``."""
    from gpvi.inference.cvi import bayes
    from gpvi.inference.salimans_knowles.engine import SKGaussian

    X, y = small(20)
    monkeypatch.setattr(bayes, "IMPORTANCE", False)          # S&K from the start (the step tried first: below)
    calls = interrupt(monkeypatch, SKGaussian, "step", allowed=4)
    clf = GPClassifier(hyperparameters="bayes", random_state=0)
    with pytest.raises(KeyboardInterrupt):
        clf.fit(X, y)
    assert calls["n"] == 5
    assert_not_fitted(clf)


@pytest.mark.parametrize("multiclass", [False, True])
def test_ctrl_c_during_the_importance_step_leaves_fit(monkeypatch, multiclass):
    """The same for a Ctrl-C while the importance step tried first evaluates its second chunk of draws (binary and,
    since issue 59's seventh pass, multi-class): nothing after it runs and the estimator is not fitted."""
    from gpvi.inference.cvi.importance import ImportanceGaussian

    X, y = small(20, multiclass=multiclass)
    calls = interrupt(monkeypatch, ImportanceGaussian, "_log_joint", allowed=1)
    clf = GPClassifier(hyperparameters="bayes", random_state=0)
    with pytest.raises(KeyboardInterrupt):
        clf.fit(X, y)
    assert calls["n"] == 2
    assert_not_fitted(clf)
