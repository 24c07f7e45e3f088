"""``random_state``: an int, None or a ``numpy.random.RandomState`` (scikit-learn's convention), nothing else."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpvi.sklearn import GPClassifier

F64 = torch.float64


def _data(n=30):
    g = torch.Generator().manual_seed(4)
    X = torch.rand((n, 2), generator=g, dtype=F64) * 4 - 2
    y = (torch.rand(n, generator=g, dtype=F64) < torch.sigmoid(3 * X[:, 0])).to(torch.int64)
    return X.numpy(), y.numpy()


def _stochastic(random_state):
    # single-site CVI with Monte Carlo site gradients: the fit depends on the seed through the site order and draws
    return GPClassifier(hyperparameters="fixed", mode="stochastic", estimator="mc", num_draws=2, max_sweeps=2,
                        random_state=random_state)


def _fit(random_state):
    import warnings

    from gpvi.exceptions import ConvergenceWarning

    X, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)       # two sweeps: the run ends on its budget
        return _stochastic(random_state).fit(X, y)


def test_a_random_state_object_gives_reproducible_fits_and_is_drawn_from_at_fit():
    a, b = _fit(np.random.RandomState(0)), _fit(np.random.RandomState(0))
    X, _ = _data()
    assert np.array_equal(a.predict_proba(X), b.predict_proba(X))
    # scikit-learn's semantics: fit draws one seed from the RandomState (and so advances it) ...
    seed = int(np.random.RandomState(0).randint(np.iinfo(np.int32).max))
    assert np.array_equal(_fit(seed).predict_proba(X), a.predict_proba(X))
    # ... so two fits of one estimator sharing a RandomState differ, and another RandomState gives another fit
    rs = np.random.RandomState(0)
    clf = _stochastic(rs)
    first = clf.fit(*_data()).predict_proba(X)
    assert not np.array_equal(clf.fit(*_data()).predict_proba(X), first)
    assert not np.array_equal(_fit(np.random.RandomState(1)).predict_proba(X), a.predict_proba(X))


def test_init_stores_the_random_state_object_and_clone_keeps_it():
    from sklearn.base import clone

    rs = np.random.RandomState(3)
    clf = GPClassifier(random_state=rs)
    assert clf.random_state is rs and clf.get_params()["random_state"] is rs
    assert isinstance(clone(clf).random_state, np.random.RandomState)


@pytest.mark.parametrize("bad", [np.random.default_rng(0), 1.5, "0", True, [0]],
                         ids=["Generator", "float", "str", "bool", "list"])
def test_other_random_states_are_a_type_error_naming_random_state(bad):
    with pytest.raises(TypeError, match=r"random_state must be a non-negative int, a numpy.random.RandomState "
                                        r"or None; got .* of type"):
        GPClassifier(hyperparameters="fixed", random_state=bad).fit(*_data())


def test_a_negative_random_state_is_a_value_error():
    from gpvi.rng import check_random_state

    with pytest.raises(ValueError, match="random_state must be a non-negative int; got -1"):
        check_random_state(-1)


def test_check_random_state_contract():
    from gpvi.rng import check_random_state

    assert check_random_state(None) is None and check_random_state(np.int64(7)) == 7
    rs = np.random.RandomState(0)
    s = check_random_state(rs)
    assert isinstance(s, int) and 0 <= s < 2 ** 31 - 1 and s == np.random.RandomState(0).randint(2 ** 31 - 1)
    assert check_random_state(rs) != s                          # the object was advanced
    with pytest.raises(TypeError, match="seed must be"):
        check_random_state(np.random.default_rng(0), "seed")


def test_a_fit_with_a_random_state_object_saves_and_loads(tmp_path):
    """A ``RandomState`` is not plain data: the fit file keeps ``random_state=None`` (the seed it drew was used up by
    ``fit``; predictions do not depend on it)."""
    from gpvi.io import load_fit, save_fit

    X, y = _data()
    clf = GPClassifier(hyperparameters="fixed", random_state=np.random.RandomState(0)).fit(X, y)
    save_fit(tmp_path / "f.pt", clf)
    back = load_fit(tmp_path / "f.pt")
    assert np.array_equal(back.predict_proba(X), clf.predict_proba(X))
    assert back.classifier.random_state is None
    assert isinstance(clf.random_state, np.random.RandomState)          # the estimator itself is unchanged
