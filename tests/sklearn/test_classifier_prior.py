"""GPClassifier's ``prior`` setting: MAP-II under the default or a given prior, ML-II with ``None``; checked against
the type-II loops run directly, against the bound it maximises, and on bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gpvi
from gpvi.inference.cvi import CVI, TypeII
from gpvi.models.multiclass import GPMulticlass
from gpvi.models.priors import check_prior_choice, default_prior, resolve_prior, scaled_prior
from gpvi.numerics.quadrature import Quadrature
from gpvi.sklearn import GPClassifier
from tests.conftest import iris_rows

F64 = torch.float64


def relevant_and_irrelevant(n=50, seed=0):
    """Two inputs: the label depends on the first only."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn((n, 2), generator=g, dtype=F64)
    y = (torch.rand(n, generator=g, dtype=F64) < torch.sigmoid(4 * X[:, 0])).to(F64)
    return X, y


def test_prior_none_is_ml_ii_and_the_same_as_the_loop_run_directly():
    X, y = relevant_and_irrelevant()
    ml = GPClassifier(prior=None).fit(X, y)
    info = ml.posterior_.info
    assert info["log_prior"] == 0.0 and info["objective"] == ml.elbo_ and info["type_ii"]["prior"] is None
    direct = TypeII(CVI(num_steps=ml.posterior_.info["num_steps"], progress_bar=False), inner_num_steps=500,
                    prior=None).run(ml.model_)
    assert torch.equal(direct.theta, ml.theta_) and direct.elbo == ml.elbo_
    # ML-II maximises the bound alone: MAP-II's theta is one of the points it could have taken
    mapii = GPClassifier().fit(X, y)
    assert ml.elbo_ >= mapii.elbo_ - 1e-6
    assert mapii.posterior_.info["log_prior"] == pytest.approx(float(default_prior(2 + 1).log_prob(mapii.theta_)),
                                                               rel=1e-12)
    # without the prior's pull the irrelevant input's lengthscale^2 grows further (measured: ML-II 11.5, the box
    # bound, against 3.6 under the default prior, on these 50 rows)
    j = ml.model_.names.index("log_lengthscale_sq[1]")
    assert float(ml.theta_[j]) > float(mapii.theta_[j]) + 1.0


def test_a_given_prior_reaches_the_loop():
    X, y = relevant_and_irrelevant()
    loc = torch.tensor([0.5, 2.0, -0.3], dtype=F64)
    tight = torch.distributions.Independent(torch.distributions.Normal(loc, torch.full((3,), 1e-3, dtype=F64)), 1)
    clf = GPClassifier(prior=tight).fit(X, y)
    assert torch.allclose(clf.theta_, loc, atol=0.01)
    assert clf.posterior_.info["log_prior"] == pytest.approx(float(tight.log_prob(clf.theta_)), rel=1e-12)


def test_multiclass_prior_none_is_the_multiclass_loop_without_prior():
    X2, y2, _ = iris_rows(24)
    clf = GPClassifier(prior=None, num_quadrature=20).fit(X2, y2)
    assert clf.posterior_.info["log_prior"] == 0.0
    eng = CVI(quadrature=Quadrature(20, width=6.5), num_steps=500, progress_bar=False)
    direct = TypeII(eng, inner_num_steps=500, prior=None).run(GPMulticlass(X2, y2))
    assert torch.equal(direct.theta, clf.theta_) and direct.elbo == clf.elbo_
    mapii = GPClassifier(num_quadrature=20).fit(X2, y2)
    assert clf.elbo_ >= mapii.elbo_ - 1e-6 and not torch.equal(clf.theta_, mapii.theta_)


def test_scaled_prior_is_centred_at_the_data_scaled_start():
    X, y = relevant_and_irrelevant()
    X = X * torch.tensor([3.0, 0.2], dtype=F64)             # unequal scales: the centre follows var(x_j)
    model = gpvi.GPClassification(X, y)
    p = resolve_prior("scaled", model)
    th0 = model.initial_theta()
    assert torch.equal(p.mean, th0) and torch.allclose(p.variance, torch.full((3,), 10.0, dtype=F64))
    assert torch.allclose(th0[:2], torch.log(2 * X.var(0, unbiased=False))) and float(th0[2]) == 0.0
    clf = GPClassifier(prior="scaled").fit(X, y)
    assert clf.posterior_.info["type_ii"]["prior"] == "scaled"
    assert clf.posterior_.info["log_prior"] == pytest.approx(float(p.log_prob(clf.theta_)), rel=1e-12)
    direct = TypeII(CVI(num_steps=clf.posterior_.info["num_steps"], progress_bar=False), inner_num_steps=500,
                    prior=scaled_prior(th0)).run(model)
    assert torch.equal(direct.theta, clf.theta_) and direct.elbo == clf.elbo_
    # a user's start (theta=...) moves where the run begins, not where the prior sits
    moved = GPClassifier(prior="scaled", theta=[0.0, 0.0, 1.0]).fit(X, y)
    assert torch.equal(resolve_prior("scaled", moved.model_).mean, th0)


def test_scaled_prior_keeps_sonar_from_the_constant_predictor():
    """Sonar, 100 training rows (d = 60): under N(0, 10 I) MAP-II predicts about 1/2 everywhere (test log loss
    0.692, as NUTS does under that prior); centred at the data-scaled start it predicts (measured 0.372)."""
    from benchmarks.classification_bayes import scores, subsample

    ds = gpvi.datasets.load("sonar")
    X, y = subsample(torch.as_tensor(ds.X_train, dtype=F64), torch.as_tensor(ds.y_train, dtype=F64), 100, 0)
    Xt, yt = torch.as_tensor(ds.X_test, dtype=F64), torch.as_tensor(ds.y_test, dtype=F64)
    loss = {}
    for prior in ("default", "scaled"):
        clf = GPClassifier(prior=prior).fit(X, y)
        loss[prior] = scores(torch.as_tensor(clf.predict_proba(Xt)[:, 1]), yt)["log_loss"]
    assert loss["default"] > 0.68 and loss["scaled"] < 0.45


def test_fixed_hyperparameters_ignore_the_prior():
    X, y = relevant_and_irrelevant(30)
    a = GPClassifier(hyperparameters="fixed", prior=None).fit(X, y)
    b = GPClassifier(hyperparameters="fixed").fit(X, y)
    assert torch.equal(a.posterior_.lam1, b.posterior_.lam1) and torch.equal(a.theta_, b.theta_)


def test_bad_priors_give_clear_errors(tmp_path):
    X, y = relevant_and_irrelevant(30)
    with pytest.raises(ValueError, match="prior must be 'default', 'scaled', None"):
        GPClassifier(prior="vague").fit(X, y)
    with pytest.raises(TypeError, match="prior must have a log_prob"):
        GPClassifier(prior=3.0).fit(X, y)
    with pytest.raises(ValueError, match="prior=None .* improper"):
        GPClassifier(prior=None, hyperparameters="bayes").fit(X, y)
    wrong = default_prior(7)
    with pytest.raises(ValueError, match="log_prob"):
        GPClassifier(prior=wrong).fit(X, y)
    from gpvi.inference.cvi.bayes import FullyBayesianCVI

    with pytest.raises(ValueError, match="improper"):
        FullyBayesianCVI(prior=None)
    with pytest.raises(ValueError, match="prior"):
        FullyBayesianCVI(prior="flat")
    with pytest.raises(TypeError, match="log_prob"):
        check_prior_choice(object())
    model = gpvi.GPClassification(X, y)
    assert resolve_prior(None, model) is None and resolve_prior("default", model).mean.shape == (3,)
    # a prior object is not plain data: saving refuses it, before writing anything
    clf = GPClassifier(prior=default_prior(3), hyperparameters="type2").fit(X, y)
    path = tmp_path / "fit.gpvi"
    with pytest.raises(ValueError, match="prior object"):
        gpvi.io.save_fit(path, clf)
    assert not path.exists()


@pytest.mark.parametrize("prior", [None, "scaled"])
def test_save_and_load_keep_the_prior_setting(tmp_path, prior):
    X, y = relevant_and_irrelevant(30)
    clf = GPClassifier(prior=prior).fit(X, y)
    path = tmp_path / "fit.gpvi"
    gpvi.io.save_fit(path, clf)
    back = gpvi.io.load_fit(path).classifier
    assert back.prior == prior and f"prior={prior!r}" in repr(back)
    np.testing.assert_array_equal(back.predict_proba(X), clf.predict_proba(X))


def test_the_mcmc_baseline_takes_the_same_prior_settings():
    from gpvi.models.whitened import WhitenedLatentGP

    X, y = relevant_and_irrelevant(20)
    model = gpvi.GPClassification(X * 3.0, y)
    assert torch.equal(WhitenedLatentGP(model, prior="scaled").prior.mean, model.initial_theta())
    assert torch.equal(WhitenedLatentGP(model, prior="default").prior.mean, torch.zeros(3, dtype=F64))
    theta = torch.tensor([0.3, 1.2, -0.4], dtype=F64)
    v = torch.zeros(20, dtype=F64)
    a = WhitenedLatentGP(model, prior="scaled").log_joint(torch.cat([theta, v]))
    b = WhitenedLatentGP(model, prior=scaled_prior(model.initial_theta())).log_joint(torch.cat([theta, v]))
    assert float(a) == pytest.approx(float(b), rel=1e-14)
    with pytest.raises(ValueError, match="prior must be"):
        WhitenedLatentGP(model, prior="flat")
