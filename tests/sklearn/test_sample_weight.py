"""Likelihood weights (``GPClassifier.fit(sample_weight=...)``, ``LatentGP(weights=...)``), against independent answers.

The weighted model :math:`\\prod_n p(y_n \\mid f_n)^{w_n}\\,p(f)` with an integer weight equals the model with that
row repeated (the repeated rows share one latent value, so their likelihood terms multiply), and a zero weight
equals the row removed. Both are fitted here with the unweighted code on the expanded or reduced data, so the
comparison does not go through the weighting code at all.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import gpvi
from gpvi.inference.cvi import CVI, TypeII
from gpvi.inference.cvi.bayes import FullyBayesianCVI
from gpvi.inference.cvi.bound import CVIBoundTarget
from gpvi.models.multiclass import GPMulticlass
from gpvi.models.whitened import WhitenedLatentGP
from gpvi.sklearn import GPClassifier
from tests.conftest import iris_rows

F64 = torch.float64


def data(multiclass: bool, n: int = 45, seed: int = 1):
    """Iris rows (2 inputs; binary: versicolor vs virginica) and random integer weights 0..3 (some zero)."""
    X, y, _ = iris_rows(150)
    if not multiclass:
        keep = y > 0
        X, y = X[keep], y[keep] - 1
    X, y = X[:n], y[:n]
    w = np.random.default_rng(seed).integers(0, 4, size=len(y))
    assert (w == 0).any() and (w > 1).any()
    return X, y, w


@pytest.mark.parametrize("multiclass", [False, True])
def test_integer_weights_equal_repeated_rows_at_fixed_hyperparameters(multiclass):
    X, y, w = data(multiclass)
    Xr, yr = np.repeat(X, w, axis=0), np.repeat(y, w)
    a = GPClassifier(hyperparameters="fixed").fit(X, y, sample_weight=w)
    b = GPClassifier(hyperparameters="fixed").fit(Xr, yr)
    torch.testing.assert_close(a.theta_, b.theta_, rtol=0, atol=1e-12)       # the weighted data-scaled start
    np.testing.assert_allclose(a.predict_proba(X), b.predict_proba(X), rtol=0, atol=1e-8)
    assert a.elbo_ == pytest.approx(b.elbo_, rel=1e-9)
    ma, va = a.predict_latent(X, return_std=True)
    mb, vb = b.predict_latent(X, return_std=True)
    np.testing.assert_allclose(ma, mb, atol=1e-7)
    np.testing.assert_allclose(va, vb, atol=1e-7)


@pytest.mark.parametrize("multiclass", [False, True])
def test_integer_weights_equal_repeated_rows_under_type_ii(multiclass):
    X, y, w = data(multiclass)
    Xr, yr = np.repeat(X, w, axis=0), np.repeat(y, w)
    a = GPClassifier().fit(X, y, sample_weight=w)
    b = GPClassifier().fit(Xr, yr)
    # the same computation: the inner runs' Anderson steps measure a row of weight w as w repeated rows, so both
    # fits take the same path to the same stopping point (measured: theta within 1.8e-10, probabilities 6e-10
    # relative; with an unweighted least squares 9.4e-6 and 1.7e-5 on the multi-class rows);
    # scikit-learn's check_sample_weight_equivalence_on_dense_data asks for rtol=1e-7
    info_a, info_b = a.posterior_.info, b.posterior_.info
    assert (info_a["theta_evaluations"], info_a["inner_steps"]) == (info_b["theta_evaluations"], info_b["inner_steps"])
    np.testing.assert_allclose(a.theta_.numpy(), b.theta_.numpy(), rtol=0, atol=1e-8)
    np.testing.assert_allclose(a.predict_proba(X), b.predict_proba(X), rtol=1e-7, atol=1e-9)
    assert a.elbo_ == pytest.approx(b.elbo_, rel=1e-10)


def test_zero_weight_equals_the_row_removed_and_ones_equal_no_weights():
    X, y, w = data(False)
    keep = w > 0
    wz = keep.astype(float)
    a = GPClassifier(hyperparameters="fixed").fit(X, y, sample_weight=wz)
    b = GPClassifier(hyperparameters="fixed").fit(X[keep], y[keep])
    np.testing.assert_allclose(a.predict_proba(X), b.predict_proba(X), atol=1e-8)
    # a zero-weight point's site stays empty: floored at the smallest site precision
    lam2 = a.posterior_.engine_state.lam2
    assert float(lam2[~torch.as_tensor(keep)].abs().max()) < 1e-9
    ones = GPClassifier(hyperparameters="fixed").fit(X, y, sample_weight=np.ones(len(y)))
    none = GPClassifier(hyperparameters="fixed").fit(X, y)
    np.testing.assert_allclose(ones.predict_proba(X), none.predict_proba(X), rtol=0, atol=1e-12)


def test_real_weights_scale_the_bound_and_the_stochastic_engine_reaches_the_same_fixed_point():
    """The weighted bound is sum_n w_n E_n - KL: scaling every weight by 2 equals duplicating every row; and the
    single-site engine (rank-one updates) converges to the full-batch engine's weighted fixed point."""
    X, y, _ = data(False, n=30)
    w = np.random.default_rng(3).uniform(0.2, 2.5, size=len(y))
    theta = gpvi.GPClassification(X, y).initial_theta()
    full = CVI(tol=1e-12, progress_bar=False).run(gpvi.GPClassification(X, y, theta=theta, weights=w))
    sto = CVI(mode="stochastic", num_steps=30 * 400, tol=1e-12, seed=0, progress_bar=False).run(
        gpvi.GPClassification(X, y, theta=theta, weights=w))
    np.testing.assert_allclose(sto.predict_proba(X), full.predict_proba(X), atol=1e-6)
    assert sto.elbo == pytest.approx(full.elbo, rel=1e-8)
    double = CVI(tol=1e-12, progress_bar=False).run(gpvi.GPClassification(X, y, theta=theta, weights=2 * w))
    rep = CVI(tol=1e-12, progress_bar=False).run(
        gpvi.GPClassification(np.vstack([X, X]), np.concatenate([y, y]), theta=theta, weights=np.concatenate([w, w])))
    np.testing.assert_allclose(double.predict_proba(X), rep.predict_proba(X), atol=1e-8)
    assert double.elbo == pytest.approx(rep.elbo, rel=1e-9)


def test_the_weighted_input_scale_is_that_of_the_repeated_rows():
    X, y, w = data(True)
    Xr, yr = np.repeat(X, w, axis=0), np.repeat(y, w)
    a, b = GPMulticlass(X, y, weights=w), GPMulticlass(Xr, yr)
    torch.testing.assert_close(a.initial_theta(), b.initial_theta(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a.log_input_scale(), b.log_input_scale(), rtol=1e-12, atol=1e-12)


def test_the_nuts_target_weights_the_likelihood():
    X, y, w = data(False, n=12)
    model = gpvi.GPClassification(X, y, weights=w)
    plain = WhitenedLatentGP(gpvi.GPClassification(X, y))
    target = WhitenedLatentGP(model)
    z = torch.randn(3, target.dim, generator=torch.Generator().manual_seed(0), dtype=F64)
    f = target.latent(z)
    lik = model.likelihood.log_prob(model.y, f)
    expected = plain.log_joint(z) - lik.sum(-1) + (lik * torch.as_tensor(w, dtype=F64)).sum(-1)
    torch.testing.assert_close(target.log_joint(z), expected, rtol=1e-12, atol=1e-10)


def test_bad_weights_and_the_fits_that_take_none_are_refused_clearly():
    X, y, w = data(False, n=20)
    clf = GPClassifier(hyperparameters="fixed")
    # scikit-learn's _check_sample_weight and its messages
    for bad, match in ((-np.ones(20), "Negative values in data passed to `sample_weight`"),
                       (np.zeros(20), "at least one non-zero"), (np.ones(19), r"shape == \(19,\), expected \(20,\)"),
                       (np.r_[np.ones(19), np.nan], "Input sample_weight contains NaN"),
                       (np.ones((20, 2)), "Sample weights must be 1D"), (["a"] * 20, "could not convert")):
        with pytest.raises(ValueError, match=match):
            clf.fit(X, y, sample_weight=bad)
    with pytest.raises(ValueError, match="type2' or 'fixed'"):
        GPClassifier(hyperparameters="bayes").fit(X, y, sample_weight=w)
    model = gpvi.GPClassification(X, y, weights=w)
    with pytest.raises(ValueError, match="FullyBayesianCVI does not take a model with likelihood weights"):
        FullyBayesianCVI().run(model)
    with pytest.raises(ValueError, match="CVIBoundTarget does not take"):
        CVIBoundTarget(model)
    with pytest.raises(ValueError, match="weights"):
        gpvi.GPClassification(X, y, weights=-np.ones(20))


def test_a_weighted_fit_is_saved_and_loaded_with_its_weights(tmp_path):
    X, y, w = data(True, n=30)
    clf = GPClassifier().fit(X, y, sample_weight=w)
    path = tmp_path / "fit.gpvi"
    gpvi.io.save_fit(path, gpvi.io.SavedFit(kind="classification", method="type2", features=["a", "b"],
                                            target="species", x_mean=np.zeros(2), x_std=np.ones(2), classifier=clf))
    back = gpvi.io.load_fit(path).classifier
    torch.testing.assert_close(back.model_.weights, torch.as_tensor(w, dtype=F64))
    np.testing.assert_allclose(back.predict_proba(X), clf.predict_proba(X), rtol=0, atol=1e-12)
    assert math.isfinite(back.score(X, y, sample_weight=w))


def test_type_ii_on_the_model_directly_takes_the_weights():
    X, y, w = data(False)
    post = TypeII(CVI(progress_bar=False)).run(gpvi.GPClassification(X, y, weights=w))
    clf = GPClassifier().fit(X, y, sample_weight=w)
    np.testing.assert_allclose(post.predict_proba(X).numpy(), clf.predict_proba(X)[:, 1], atol=1e-8)


def test_multiclass_single_site_steps_reach_the_weighted_fixed_point():
    """Multi-class single-site steps (K rank-one-updated class factors) with weights 0..3 against full-batch CVI on
    the repeated rows."""
    from gpvi.inference.cvi.engine import CVI

    X, y, w = data(True)
    Xr, yr = np.repeat(X, w, axis=0), np.repeat(y, w)
    model = GPMulticlass(X, y, weights=w)
    sto = CVI(mode="stochastic", num_steps=len(y) * 150, tol=1e-12, seed=0, progress_bar=False).run(model)
    rep = CVI(tol=1e-12, progress_bar=False).run(GPMulticlass(Xr, yr, theta=model.initial_theta()))
    np.testing.assert_allclose(sto.predict_proba(X).numpy(), rep.predict_proba(X).numpy(), atol=1e-5)
    assert sto.elbo == pytest.approx(rep.elbo, rel=1e-7)
