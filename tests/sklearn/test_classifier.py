"""GPClassifier: the scikit-learn estimator contract, predictions, labels of any type, binary and multi-class fits,
input types and error messages (scikit-learn's own estimator checks: tests/sklearn/test_estimator_checks.py)."""

from __future__ import annotations

import math
import warnings

import gpytorch
import numpy as np
import pytest
import torch

import gpvi
from gpvi.exceptions import ConvergenceWarning
from gpvi.sklearn import GPClassifier

F64 = torch.float64


@pytest.fixture(scope="module")
def pima():
    return gpvi.datasets.load_pima()


def small(n=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand((n, 2), generator=g, dtype=F64) * 4 - 2
    y = (torch.rand(n, generator=g, dtype=F64) < torch.sigmoid(3 * (torch.sin(2 * X[:, 0]) + X[:, 1]))).to(F64)
    return X, y


def fast(**kw) -> GPClassifier:
    kw.setdefault("hyperparameters", "fixed")
    return GPClassifier(**kw)


def test_init_only_stores_and_clone_get_set_params_work():
    from sklearn.base import BaseEstimator, ClassifierMixin, clone, is_classifier

    kern = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=2.5))
    clf = GPClassifier(kernel=kern, likelihood="probit", mode="stochastic", beta=7.0, random_state=3)   # not validated yet
    assert isinstance(clf, BaseEstimator) and isinstance(clf, ClassifierMixin) and is_classifier(clf)
    params = clf.get_params()
    assert params["beta"] == 7.0 and params["kernel"] is kern and params["mode"] == "stochastic"
    assert set(params) == {"kernel", "likelihood", "mode", "hyperparameters", "prior", "beta", "estimator",
                           "num_quadrature", "num_draws", "batch_size", "max_sweeps", "tol", "theta", "random_state",
                           "verbose", "device"}
    assert GPClassifier().get_params()["hyperparameters"] == "type2" and GPClassifier().verbose == 0
    c = clone(clf)
    assert c is not clf and c.get_params()["beta"] == 7.0 and c.get_params()["kernel"] is not kern
    assert clf.set_params(beta=0.3, mode="full") is clf and clf.beta == 0.3
    with pytest.raises(ValueError, match="Invalid parameter 'betta'"):
        clf.set_params(betta=0.3)
    assert "likelihood='probit'" in repr(clf)
    # the arguments that had one allowed value or an older spelling, and the progress switch, are gone
    for gone in ("method", "learn_hyperparameters", "progress_bar"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{gone}'"):
            GPClassifier(**{gone: "cvi"})


def test_fit_returns_self_and_sets_fitted_attributes(pima):
    clf = fast()
    assert clf.fit(pima.X_train, pima.y_train) is clf
    assert clf.classes_.tolist() == [0, 1] and clf.link_ == "logit" and clf.n_features_in_ == 7
    assert clf.elbo_ == clf.posterior_.elbo and math.isfinite(clf.elbo_)
    assert torch.equal(clf.theta_, clf.posterior_.theta)
    assert clf.posterior_.converged and clf.posterior_.info["link"] == "logit"
    # kernel_ is a GPyTorch kernel at the fitted hyperparameters
    K = clf.kernel_(pima.X_train[:5]).to_dense().detach()
    assert torch.allclose(K, clf.model_.kernel_matrix(clf.theta_)[:5, :5], atol=1e-12)
    assert clf.hyperparameters_["signal_var"] == pytest.approx(math.exp(float(clf.theta_[-1])))


def test_predict_proba_predict_and_score(pima):
    clf = fast().fit(pima.X_train, pima.y_train)
    P = clf.predict_proba(pima.X_test)
    assert P.shape == (332, 2) and P.dtype == np.float64
    assert np.allclose(P.sum(1), 1.0) and (P >= 0).all() and (P <= 1).all()
    pred = clf.predict(pima.X_test)
    assert set(np.unique(pred)) <= {0, 1}
    acc = clf.score(pima.X_test, pima.y_test)
    assert acc == pytest.approx(float((pred == pima.y_test.numpy()).mean()))
    assert acc == pytest.approx(1 - gpvi.metrics.error_rate(P[:, 1], pima.y_test))
    # a reasonable classifier on Pima (test error of GP classifiers is ~20%)
    assert 0.74 < acc < 0.85
    assert clf.decision_function(pima.X_test[:4]).shape == (4,)


def test_minus_one_plus_one_labels_and_column_order():
    X, y = small()
    ypm = (2 * y - 1).numpy().astype(int)
    a = fast().fit(X, y)
    b = fast().fit(X.numpy(), ypm)
    assert b.classes_.tolist() == [-1, 1]
    assert np.allclose(a.predict_proba(X), b.predict_proba(X), atol=1e-12)
    assert set(np.unique(b.predict(X))) <= {-1, 1}
    # column 1 is the probability of classes_[1]: high where the label is mostly +1
    p1 = b.predict_proba(X)[:, 1]
    assert p1[ypm == 1].mean() > p1[ypm == -1].mean() + 0.2
    assert b.score(X, ypm) == a.score(X, y)


def test_numpy_and_torch_inputs_agree_and_float32_is_converted():
    X, y = small(seed=1)
    a = fast().fit(X, y)
    b = fast().fit(X.numpy(), y.numpy())
    c = fast().fit(X.to(torch.float32).to(F64), y.to(torch.int32))
    assert np.array_equal(a.predict_proba(X), b.predict_proba(X.numpy()))
    assert np.allclose(a.predict_proba(X), c.predict_proba(X), atol=1e-12)
    assert a.posterior_.m.dtype == F64


def test_probit_and_logit_are_recorded_and_differ():
    X, y = small(seed=2)
    lo = fast(likelihood="logit").fit(X, y)
    pr = fast(likelihood="probit").fit(X, y)
    assert lo.link_ == "logit" and pr.link_ == "probit"
    assert pr.posterior_.link == "probit" and pr.posterior_.info["link"] == "probit"
    assert not np.allclose(lo.predict_proba(X), pr.predict_proba(X), atol=1e-3)


def test_stochastic_mode_matches_full_mode():
    X, y = small(40, seed=3)
    full = fast(mode="full", tol=1e-13).fit(X, y)
    sto = fast(mode="stochastic", tol=1e-13, random_state=0).fit(X, y)
    assert sto.elbo_ == pytest.approx(full.elbo_, rel=1e-8)
    assert np.allclose(sto.predict_proba(X), full.predict_proba(X), atol=1e-6)


def test_learned_hyperparameters_improve_the_bound(pima):
    fixed = fast().fit(pima.X_train, pima.y_train)
    learned = GPClassifier().fit(pima.X_train, pima.y_train)
    assert learned.elbo_ > fixed.elbo_ + 1.0
    assert not torch.equal(learned.theta_, fixed.theta_)
    assert learned.posterior_.info["learn_hyperparameters"] is True


def test_the_classifier_composes_the_engine_and_the_type_ii_loop_and_records_what_it_resolved():
    from gpvi.inference.cvi import CVI, MonteCarlo, SingleSite, TypeII, num_steps_for_sweeps

    X, y = small(40, seed=6)
    with warnings.catch_warnings():                # Monte Carlo sites may end a run on its step budget
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf = GPClassifier(mode="stochastic", batch_size=3, max_sweeps=40, estimator="mc", num_draws=7,
                           random_state=2).fit(X, y)
    info = clf.posterior_.info
    assert info["num_steps"] == num_steps_for_sweeps(40, 40, mode="stochastic", batch_size=3) == 547
    assert info["num_draws"] == 7 and info["batch_size"] == 3 and info["type_ii"]["inner_num_steps"] == 50
    eng = CVI(mode="stochastic", estimator=MonteCarlo(num_draws=7), single_site=SingleSite(batch_size=3),
              num_steps=547, seed=2, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        direct = TypeII(eng, inner_num_steps=50).run(clf.model_)
    assert torch.equal(direct.lam1, clf.posterior_.lam1) and torch.equal(direct.theta, clf.theta_)
    fixed = fast(max_sweeps=40, random_state=2).fit(X, y)
    assert fixed.posterior_.info["learn_hyperparameters"] is False and "type_ii" not in fixed.posterior_.info


def test_fixed_hyperparameters_are_kept_and_theta_and_kernel_values_are_used():
    X, y = small(seed=4)
    theta = torch.tensor([0.5, -0.2, 1.0], dtype=F64)
    clf = fast(theta=theta).fit(X, y)
    assert torch.equal(clf.theta_, theta)
    kern = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
    kern.base_kernel.lengthscale = 0.7
    kern.outputscale = 3.0
    k = fast(kernel=kern).fit(X, y)
    assert k.hyperparameters_["lengthscale"] == pytest.approx(0.7) and k.hyperparameters_["signal_var"] == pytest.approx(3.0)


def test_close_to_scikit_learn_laplace_classifier_at_the_same_hyperparameters(pima):
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    clf = fast().fit(pima.X_train, pima.y_train)
    ls = [clf.hyperparameters_[f"lengthscale[{j}]"] for j in range(7)]
    sk = GaussianProcessClassifier(ConstantKernel(clf.hyperparameters_["signal_var"], "fixed")
                                   * RBF(ls, "fixed"), optimizer=None).fit(pima.X_train.numpy(), pima.y_train.numpy())
    p_sk = sk.predict_proba(pima.X_test.numpy())[:, 1]
    p_cvi = clf.predict_proba(pima.X_test)[:, 1]
    # different approximations (VI vs Laplace), same model: measured max |dp| = 0.010, 99.7% labels agree
    assert np.abs(p_sk - p_cvi).max() < 0.03
    assert (np.round(p_sk) == np.round(p_cvi)).mean() > 0.99


def test_works_inside_scikit_learn_tools():
    from sklearn.model_selection import cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = small(60, seed=5)
    pipe = make_pipeline(StandardScaler(), fast())
    scores = cross_val_score(pipe, X.numpy(), y.numpy().astype(int), cv=3)
    assert scores.shape == (3,) and (scores > 0.5).all()


def test_bad_input_gives_clear_errors():
    X, y = small(20)
    Xn = X.clone()
    Xn[0, 0] = float("nan")
    with pytest.raises(ValueError, match="Input X contains NaN"):
        fast().fit(Xn, y)
    with pytest.raises(ValueError, match="likelihood='logit' is a binary link but y holds 3 classes"):
        fast(likelihood="logit").fit(X, np.arange(20) % 3)
    with pytest.raises(ValueError, match=r"y holds one class only \(0\)"):
        fast().fit(X, np.zeros(20))
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        fast().fit(X, np.linspace(0, 1, 20))
    with pytest.raises(ValueError, match=r"inconsistent numbers of samples: \[20, 18\]"):
        fast().fit(X, y[:18])
    with pytest.raises(ValueError, match=r"beta must be in \(0, 1\]; got 0"):
        fast(beta=0.0).fit(X, y)
    with pytest.raises(ValueError, match=r"beta must be in \(0, 1\]; got -1"):
        fast(beta=-1).fit(X, y)
    with pytest.raises(ValueError, match="mode must be one of"):
        fast(mode="fast").fit(X, y)
    with pytest.raises(ValueError, match="likelihood must be one of"):
        fast(likelihood="gaussian").fit(X, y)
    with pytest.raises(TypeError, match="random_state must be a non-negative int"):
        fast(random_state=1.5).fit(X, y)
    with pytest.raises(TypeError, match="verbose must be an int; got str"):
        fast(verbose="yes").fit(X, y)
    with pytest.raises(ValueError, match="device 'tpu9' is not a device torch knows"):
        fast(device="tpu9").fit(X, y)
    from sklearn.exceptions import NotFittedError

    for method in ("predict", "predict_proba", "predict_log_proba", "decision_function", "predict_latent"):
        with pytest.raises(NotFittedError, match="not fitted"):
            getattr(fast(), method)(X)
    clf = fast().fit(X, y)
    with pytest.raises(ValueError, match="X has 3 features, but GPClassifier is expecting 2 features as input"):
        clf.predict(torch.zeros(4, 3, dtype=F64))
    with pytest.raises(ValueError, match="Expected 2D array, got 1D array"):
        clf.predict_proba(torch.zeros(4, dtype=F64))
    with pytest.raises(ValueError, match="Mix of label input types"):
        clf.fit(X, np.where(y.numpy() > 0, "a", "b")).score(X, y)


# ------------------------------------------------------------------------ property-based: malformed inputs
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def _inputs(draw):
    valid = draw(st.booleans())                            # about half the draws are well formed
    n = draw(st.integers(2, 7)) if valid else draw(st.integers(0, 7))
    d = draw(st.integers(1, 3)) if valid else draw(st.integers(0, 3))
    vals = draw(st.lists(st.floats(-50, 50, allow_nan=False), min_size=n * d, max_size=n * d))
    X: object = np.asarray(vals, dtype=np.float64).reshape(n, d)
    if valid:
        labels = draw(st.sampled_from([(0, 1), (-1, 1), (False, True)]))
        y = np.asarray([labels[0], labels[1]] + draw(st.lists(st.sampled_from(labels), min_size=n - 2,
                                                              max_size=n - 2)))
        if draw(st.booleans()):
            X = torch.as_tensor(X)
        return X, y
    bad_x = draw(st.sampled_from(["none", "none", "nan", "inf", "strings", "1d", "object", "none_value"]))
    if bad_x == "nan" and n * d:
        X[draw(st.integers(0, n - 1)), draw(st.integers(0, d - 1))] = np.nan
    elif bad_x == "inf" and n * d:
        X[0, 0] = -np.inf
    elif bad_x == "strings":
        X = [["a"] * d for _ in range(n)]
    elif bad_x == "1d":
        X = np.asarray(vals, dtype=np.float64)
    elif bad_x == "object":
        X = np.asarray([[{"x": 1}] * d for _ in range(n)], dtype=object)
    elif bad_x == "none_value":
        X = None
    label_set = draw(st.sampled_from([(0, 1), (-1, 1), (0, 1, 2), (5,), (0.5, 1.0), (True, False)]))
    m = draw(st.sampled_from([n, n, max(n - 1, 0), n + 1]))
    y: object = np.asarray(draw(st.lists(st.sampled_from(label_set), min_size=m, max_size=m)))
    if draw(st.booleans()) and m:
        y = y.astype(np.float64)
        y[0] = draw(st.sampled_from([0.0, np.nan, np.inf]))
    return X, y


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_inputs())
def test_malformed_inputs_give_only_clear_errors_and_valid_ones_finite_probabilities(inp):
    X, y = inp
    clf = fast(max_sweeps=3, tol=0)
    try:
        clf.fit(X, y)
    except (ValueError, TypeError) as err:                 # NotPSDError is a ValueError
        assert str(err)
        return
    P = clf.predict_proba(X)
    assert P.dtype == np.float64 and np.isfinite(P).all() and (P >= 0).all() and (P <= 1).all()


def test_dataframe_feature_names_reach_hyperparameter_names():
    """Issue 16: a DataFrame's columns name the lengthscales (scikit-learn's feature_names_in_ rule)."""
    pd = pytest.importorskip("pandas")
    X, y = small(30)
    df = pd.DataFrame(X.numpy(), columns=["glu", "bmi"])
    clf = fast(max_sweeps=20).fit(df, y.numpy())
    assert list(clf.feature_names_in_) == ["glu", "bmi"]
    assert list(clf.hyperparameters_)[:2] == ["lengthscale[glu]", "lengthscale[bmi]"]
    assert clf.model_.names[:2] == ["log_lengthscale_sq[glu]", "log_lengthscale_sq[bmi]"]
    # same numbers as the plain array fit, which keeps positional names and sets no feature_names_in_
    plain = fast(max_sweeps=20).fit(X, y)
    assert not hasattr(plain, "feature_names_in_") and list(plain.hyperparameters_)[0] == "lengthscale[0]"
    np.testing.assert_array_equal(clf.predict_proba(df), plain.predict_proba(X))
    with pytest.raises(ValueError, match="Feature names must be in the same order as they were in fit"):
        clf.predict_proba(df[["bmi", "glu"]])
    clf.fit(X, y)                                          # refit on an array: the names are dropped
    assert not hasattr(clf, "feature_names_in_")


def test_score_is_scikit_learns_weighted_accuracy():
    from sklearn.base import ClassifierMixin
    from sklearn.metrics import accuracy_score

    X, y = small(20)
    clf = fast().fit(X, y)
    assert GPClassifier.score is ClassifierMixin.score
    w = np.linspace(0.1, 2.0, 20)
    assert clf.score(X, y, sample_weight=w) == accuracy_score(y.numpy(), clf.predict(X), sample_weight=w)
    assert clf.score(X, y, sample_weight=np.ones(20)) == clf.score(X, y)


# ------------------------------------------------------------------------ multi-class and labels of any type
@pytest.fixture(scope="module")
def iris():
    """Iris standardised, string labels; a 45-row training subset (15 per class on average) and all 150 rows."""
    from sklearn.datasets import load_iris

    d = load_iris()
    X = (d.data - d.data.mean(0)) / d.data.std(0)
    y = d.target_names[d.target]
    sub = np.random.default_rng(0).permutation(150)[:45]
    return X[sub], y[sub], X, y


@pytest.fixture(scope="module")
def iris_fit(iris):
    Xtr, ytr, _, _ = iris
    return GPClassifier(hyperparameters="fixed").fit(Xtr, ytr)


def test_multiclass_iris_with_string_labels(iris, iris_fit):
    from gpvi.inference.cvi import CVI
    from gpvi.posteriors import LatentPosterior
    from gpvi.models.multiclass import GPMulticlass

    Xtr, ytr, X, y = iris
    clf = iris_fit
    assert clf.classes_.tolist() == ["setosa", "versicolor", "virginica"] and clf.n_classes_ == 3
    assert clf.link_ == "softmax" and isinstance(clf.posterior_, LatentPosterior) and clf.posterior_.converged
    P = clf.predict_proba(X)
    assert P.shape == (150, 3) and P.dtype == np.float64 and (P >= 0).all()
    np.testing.assert_allclose(P.sum(1), 1.0, rtol=0, atol=1e-12)
    pred = clf.predict(X)
    assert pred.dtype.kind == "U" and set(pred) <= set(clf.classes_)
    np.testing.assert_array_equal(pred, clf.classes_[P.argmax(1)])
    assert clf.score(X, y) == pytest.approx(float((pred == y).mean())) and clf.score(X, y) > 0.9
    # column k belongs to classes_[k]: it is the largest, on average, on the rows of that class
    for k, c in enumerate(clf.classes_):
        assert P[y == c].mean(0).argmax() == k
    np.testing.assert_allclose(clf.predict_log_proba(X[:5]), np.log(P[:5]), rtol=1e-12, atol=0)
    # latent means and sds, (n, K) in classes_ order; decision_function is the log-probability (K = 3)
    mean, sd = clf.predict_latent(X, return_std=True)
    assert mean.shape == sd.shape == (150, 3) and (sd > 0).all()
    np.testing.assert_array_equal(clf.decision_function(X), np.log(P))
    np.testing.assert_array_equal(clf.predict_latent(X), mean)
    assert (mean.argmax(1) == P.argmax(1)).mean() > 0.95
    # the classifier is the engine: same model and engine settings give the same posterior, bit for bit
    direct = CVI(num_steps=500, progress_bar=False).run(GPMulticlass(Xtr, ytr))
    assert torch.equal(direct.lam1, clf.posterior_.lam1) and direct.elbo == clf.elbo_


def test_multiclass_columns_follow_the_labels_not_their_positions(iris, iris_fit):
    """Relabel so that the sorted order of the classes reverses: the fit is symmetric in the classes (one shared
    kernel, K i.i.d. latent GPs), so the columns reverse and the probabilities are the same."""
    Xtr, ytr, X, _ = iris
    rename = {"setosa": "c", "versicolor": "b", "virginica": "a"}
    other = GPClassifier(hyperparameters="fixed").fit(Xtr, np.array([rename[v] for v in ytr]))
    assert other.classes_.tolist() == ["a", "b", "c"]
    np.testing.assert_allclose(other.predict_proba(X), iris_fit.predict_proba(X)[:, ::-1], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(other.predict(X), [rename[v] for v in iris_fit.predict(X)])


def test_multiclass_integer_and_text_labels_and_four_classes():
    rng = np.random.default_rng(1)
    X = rng.uniform(-2, 2, (40, 2))
    y = (X[:, 0] > 0).astype(int) + 2 * (X[:, 1] > 0).astype(int) + 10          # labels 10..13
    clf = GPClassifier(hyperparameters="fixed", max_sweeps=200).fit(X, y.astype(float))
    assert clf.classes_.tolist() == [10, 11, 12, 13] and clf.classes_.dtype == np.int64   # CSV-style floats
    assert clf.posterior_.info["estimator"] == "fixed"        # softmax quadrature stops at K = 3
    P = clf.predict_proba(X)
    assert P.shape == (40, 4) and np.allclose(P.sum(1), 1.0, atol=1e-12)
    assert clf.score(X, y) > 0.9 and clf.predict(X).dtype == np.int64
    text = GPClassifier(hyperparameters="fixed", max_sweeps=200).fit(X, y.astype(str).astype(object))
    assert text.classes_.tolist() == ["10", "11", "12", "13"]       # the same order as the numbers
    np.testing.assert_array_equal(text.predict_proba(X), P)
    # scikit-learn's rule: an object array whose first label is not a string is not a label type it reads
    with pytest.raises(ValueError, match="Unknown label type: unknown"):
        GPClassifier(hyperparameters="fixed").fit(X, y.astype(object))


def test_binary_string_labels_give_the_numbers_of_zero_one_labels():
    X, y = small(seed=7)
    a = fast().fit(X, y)
    words = np.where(y.numpy() == 1, "yes", "no")
    b = fast().fit(X, words)
    assert b.classes_.tolist() == ["no", "yes"] and b.n_classes_ == 2 and b.link_ == "logit"
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X))
    np.testing.assert_array_equal(b.predict(X), np.where(a.predict(X) == 1, "yes", "no"))
    assert b.score(X, words) == a.score(X, y)
    w = np.linspace(0.5, 1.5, 60)
    assert b.score(X, words, sample_weight=w) == pytest.approx(a.score(X, y, sample_weight=w))
    c = fast().fit(X, y.numpy().astype(bool))                 # booleans are labels too
    assert c.classes_.tolist() == [False, True]
    np.testing.assert_array_equal(a.predict_proba(X), c.predict_proba(X))


def test_binary_latent_and_decision_function():
    X, y = small(seed=8)
    clf = fast().fit(X, y)
    mean, sd = clf.predict_latent(X, return_std=True)
    m, v = clf.posterior_.predict_latent(torch.as_tensor(X))
    np.testing.assert_array_equal(mean, m.numpy())
    np.testing.assert_array_equal(sd, np.sqrt(v.numpy()))
    assert mean.shape == (60,)
    # for a symmetric link, E_q[sigma(f)] > 1/2 exactly when the latent mean is positive
    np.testing.assert_array_equal(clf.predict(X), clf.classes_[(mean > 0).astype(int)])
    # decision_function: the log-odds of predict_proba, so its sign is predict's label and its ranks the
    # probabilities' (the latent mean ranks points differently where the latent variances differ)
    P = clf.predict_proba(X)
    d = clf.decision_function(X)
    assert d.shape == (60,)
    np.testing.assert_allclose(d, np.log(P[:, 1] / P[:, 0]), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(clf.predict(X), clf.classes_[(d > 0).astype(int)])
    np.testing.assert_array_equal(np.argsort(d, kind="stable"), np.argsort(P[:, 1], kind="stable"))
    with pytest.raises(TypeError, match="return_std must be True or False"):
        clf.predict_latent(X, return_std="yes")


def test_softmax_with_two_classes_is_two_latent_gps():
    """K = 2 with the softmax: p(y = classes_[1]) = E[sigma(f_1 - f_0)] with f_1 - f_0 ~ N(m_1 - m_0, v_0 + v_1)
    under the factorised q, checked against an independent Gauss-Hermite rule on that difference."""
    X, y = small(seed=9)
    clf = fast(likelihood="softmax").fit(X, y)
    assert clf.link_ == "softmax" and clf.n_classes_ == 2 and clf.posterior_.num_classes == 2
    mean, sd = clf.predict_latent(X, return_std=True)
    assert mean.shape == (60, 2)
    d, s = mean[:, 1] - mean[:, 0], np.sqrt(sd[:, 0] ** 2 + sd[:, 1] ** 2)
    x, w = np.polynomial.hermite_e.hermegauss(200)
    p1 = (w / w.sum() * (1 / (1 + np.exp(-(d[:, None] + s[:, None] * x))))).sum(1)
    P = clf.predict_proba(X)
    np.testing.assert_allclose(P[:, 1], p1, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(clf.decision_function(X), np.log(P[:, 1]) - np.log(P[:, 0]))
    np.testing.assert_array_equal(clf.predict(X), clf.classes_[(d > 0).astype(int)])
    # a different model from the logit's single GP, but the same data: labels agree almost everywhere
    assert (clf.predict(X) == fast().fit(X, y).predict(X)).mean() > 0.9


def test_hyperparameters_option():
    X, y = small(30, seed=10)
    fixed = GPClassifier(hyperparameters="fixed").fit(X, y)
    assert fixed.posterior_.info["learn_hyperparameters"] is False
    learned = GPClassifier(hyperparameters="type2").fit(X, y)
    default = GPClassifier().fit(X, y)
    assert learned.posterior_.info["learn_hyperparameters"] is True
    np.testing.assert_array_equal(learned.predict_proba(X), default.predict_proba(X))
    with pytest.raises(ValueError, match=r"hyperparameters must be one of \['type2', 'fixed', 'bayes'\]; got 'ml2'"):
        GPClassifier(hyperparameters="ml2").fit(X, y)


def test_multiclass_type2_is_the_map_ii_loop(iris):
    from gpvi.inference.cvi import CVI, TypeII
    from gpvi.models.multiclass import GPMulticlass

    Xtr, ytr, _, _ = iris
    X2, y2 = Xtr[:24, :2], ytr[:24]
    clf = GPClassifier(hyperparameters="type2", num_quadrature=20).fit(X2, y2)
    info = clf.posterior_.info
    assert info["learn_hyperparameters"] is True and info["theta_phases"] >= 1 and clf.posterior_.converged
    fixed = GPClassifier(hyperparameters="fixed", num_quadrature=20).fit(X2, y2)
    from gpvi.models.priors import default_prior

    prior = default_prior(clf.model_.dim)
    assert float(prior.log_prob(clf.theta_)) == pytest.approx(info["log_prior"], rel=1e-12)
    # the objective it maximised (bound + log prior) went up from the start, where the fixed fit stays (measured
    # gain 0.235 nats on these 24 rows)
    assert clf.elbo_ + info["log_prior"] > fixed.elbo_ + float(prior.log_prob(fixed.theta_)) + 0.1
    assert not torch.equal(clf.theta_, fixed.theta_)
    from gpvi.models.likelihoods import Quadrature

    eng = CVI(quadrature=Quadrature(20, width=6.5), num_steps=500, progress_bar=False)
    direct = TypeII(eng, inner_num_steps=500).run(GPMulticlass(X2, y2))
    assert torch.equal(direct.theta, clf.theta_) and direct.elbo == clf.elbo_


def test_multiclass_settings_that_do_not_apply_are_refused_clearly():
    rng = np.random.default_rng(2)
    X = rng.uniform(-2, 2, (12, 2))
    y = np.arange(12) % 3
    with pytest.raises(ValueError, match="likelihood='probit' is a binary link but y holds 3 classes"):
        fast(likelihood="probit").fit(X, y)
    with pytest.raises(ValueError, match="estimator='mc' is for the softmax likelihood"):
        fast(likelihood="robustmax", estimator="mc").fit(X, y)
    with pytest.raises(ValueError, match="estimator='fixed' is for the multi-class softmax"):
        fast(estimator="fixed").fit(X, y % 2)
    with pytest.raises(ValueError, match="likelihood must be one of"):
        fast(likelihood="multinomial").fit(X, y)
    with pytest.raises(ValueError, match=r"y holds one class only \('a'\)"):
        fast().fit(X, ["a"] * 12)
    with pytest.raises(ValueError, match="Input y contains NaN"):
        fast().fit(X, np.r_[np.nan, y[1:]])
    with pytest.raises(ValueError, match="requires y to be passed"):
        fast().fit(X, None)
    with pytest.raises(ValueError, match="Unknown label type"):
        fast().fit(X, np.array([1, "a"] * 6, dtype=object))
    with pytest.raises(TypeError):
        fast().fit(X, np.array(["a", 1] * 6, dtype=object))


def test_clone_and_set_params_carry_the_new_settings(iris):
    from sklearn.base import clone

    clf = GPClassifier(likelihood="robustmax", hyperparameters="fixed", estimator="quadrature", num_quadrature=30)
    c = clone(clf)
    assert c.get_params() == clf.get_params() and c is not clf
    assert c.set_params(likelihood="softmax", hyperparameters="type2") is c and c.likelihood == "softmax"
    assert "hyperparameters='fixed'" in repr(clf) and "likelihood='robustmax'" in repr(clf)
    Xtr, ytr, X, _ = iris
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fitted = clone(clf).set_params(max_sweeps=50).fit(Xtr, ytr)
    assert fitted.link_ == "robustmax" and fitted.predict_proba(X).shape == (150, 3)
    assert not hasattr(clone(fitted), "posterior_")


# ------------------------------------------------------------------------ output and Ctrl-C
def test_verbose_zero_prints_nothing_and_verbose_one_shows_the_progress_bars(capfd):
    from sklearn.model_selection import cross_val_score

    X, y = small(30, seed=11)
    GPClassifier().fit(X, y)                                  # type-II: CVI runs and phases
    cross_val_score(GPClassifier(), X.numpy(), y.numpy().astype(int), cv=2)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    GPClassifier(verbose=1).fit(X, y)
    out, err = capfd.readouterr()
    assert "CVI" in err and "it" in err                       # the engine's tqdm bar (stderr)
    GPClassifier(verbose=True, hyperparameters="fixed").fit(X, y)
    assert "CVI" in capfd.readouterr().err
