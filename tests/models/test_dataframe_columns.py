"""DataFrame columns at new inputs (issue 58): every predict path of every model and posterior takes a DataFrame only
with the columns seen at fit, in that order, and raises a ValueError naming them otherwise; plain arrays and tensors
are read by position; pandas input converts without torch's "not writable" warning."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import gpvi
from gpvi.inference.cvi.bound import CVIBoundTarget
from gpvi.io import SavedFit, load_fit, save_fit
from gpvi.models.multiclass import GPMulticlass
from gpvi.models.whitened import WhitenedLatentGP
from gpvi.posteriors import GaussianMixture, GaussianPosterior, PointPosterior, SamplePosterior, WeightedPosterior
from gpvi.posteriors.bayes_classification import BayesClassificationPosterior
from gpvi.sklearn import GPClassifier

pd = pytest.importorskip("pandas")

NAMES = ["wt", "hp", "qsec"]


def _data(n=30, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n, 3))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(n)
    return pd.DataFrame(X, columns=NAMES), y


def _bad_frames(df):
    """(frame, the words the error must hold): reordered, renamed, a column missing, one column too many."""
    return [(df[["hp", "wt", "qsec"]], r"the same names in another order \('hp', 'wt', 'qsec'\)"),
            (df.rename(columns={"hp": "HP"}), r"missing 'hp'; unexpected 'HP'"),
            (df.rename(columns={"hp": "hp_"})[["wt", "hp_", "qsec"]], r"missing 'hp'; unexpected 'hp_'"),
            (df[["wt", "qsec"]], r"missing 'hp'"),
            (df.assign(extra=1.0), r"unexpected 'extra'")]


def assert_columns_checked(predict, df, *, same=np.testing.assert_array_equal):
    """``predict(df)`` equals ``predict`` on the plain array and the tensor (by position); every wrong frame raises a
    ValueError that names the columns."""
    ref = predict(df)
    same(np.asarray(predict(df.to_numpy())), np.asarray(ref))
    same(np.asarray(predict(torch.as_tensor(np.ascontiguousarray(df.to_numpy())))), np.asarray(ref))
    for frame, words in _bad_frames(df):
        with pytest.raises(ValueError, match=r"X_new's columns do not match those the model was fitted with "
                                             r"\('wt', 'hp', 'qsec'\): " + words):
            predict(frame)


def _first(out):
    """The mean of a predictive, of a ``(mean, var)`` pair, or a tensor, as a numpy array."""
    if isinstance(out, tuple):
        out = out[0]
    if not isinstance(out, (torch.Tensor, np.ndarray)):
        out = out.mean                                                      # a predictive object
    return out.detach().cpu().numpy() if isinstance(out, torch.Tensor) else np.asarray(out)


# ------------------------------------------------------------------------------------------------ regression
@pytest.fixture(scope="module")
def regression():
    df, y = _data()
    model = gpvi.GPRegression(df, y)
    return df, model, model.initial_theta()


def test_regression_predict_reads_a_dataframe_by_name(regression):
    df, model, theta = regression
    assert model.feature_names == NAMES
    assert_columns_checked(lambda X: _first(model.predict(theta, X)), df)
    assert_columns_checked(lambda X: _first(model.predict(theta.expand(3, -1), X)), df)       # a batch of theta
    assert_columns_checked(lambda X: _first(model.predict(theta, X, full_cov=True)), df)
    assert_columns_checked(lambda X: _first(model.predictive(theta, X)), df)


def test_regression_reordered_columns_would_have_given_other_numbers(regression):
    """The silent wrong answer this refuses: the same numbers in another column order predict differently."""
    df, model, theta = regression
    by_position = model.predict(theta, df[["hp", "wt", "qsec"]].to_numpy())[0]
    assert float((by_position - model.predict(theta, df)[0]).abs().max()) > 0.1


def _regression_posteriors(model, theta):
    D, names = model.dim, model.names
    point = PointPosterior(theta, names, model)
    gauss = GaussianPosterior(theta, 0.01 * torch.eye(D, dtype=torch.float64), names, model)
    g = torch.Generator().manual_seed(0)
    draws = theta + 0.01 * torch.randn(2, 5, D, generator=g, dtype=torch.float64)
    samples = SamplePosterior(draws, names, model)
    weighted = WeightedPosterior(draws[0], torch.zeros(5, dtype=torch.float64), names, model, khat=0.1)
    mixture = GaussianMixture([gauss, gauss], torch.log(torch.tensor([0.5, 0.5], dtype=torch.float64)), model)
    return {"point": point, "gaussian": gauss, "samples": samples, "weighted": weighted, "mixture": mixture}


@pytest.mark.parametrize("kind", ["point", "gaussian", "samples", "weighted", "mixture"])
def test_every_regression_posterior_predict_reads_a_dataframe_by_name(regression, kind):
    df, model, theta = regression
    post = _regression_posteriors(model, theta)[kind]
    assert_columns_checked(lambda X: _first(post.predict(X, num_draws=4, seed=0)), df)


def test_a_dataframe_on_a_model_fitted_without_names_is_read_by_position_with_a_warning(regression):
    df, _, theta = regression
    plain = gpvi.GPRegression(df.to_numpy(), _data()[1])
    with pytest.warns(UserWarning, match=r"X_new has feature names \('hp', 'wt', 'qsec'\) but the model was fitted "
                                         r"without feature names; its columns are used by position"):
        by_frame = plain.predict(theta, df[["hp", "wt", "qsec"]])[0]
    assert torch.equal(by_frame, plain.predict(theta, df[["hp", "wt", "qsec"]].to_numpy())[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain.predict(theta, df.to_numpy())                                     # arrays: no warning
        plain.predict(theta, pd.DataFrame(df.to_numpy()))                       # integer column labels: by position


def test_explicit_feature_names_are_checked_like_a_dataframes(regression):
    df, _, theta = regression
    named = gpvi.GPRegression(df.to_numpy(), _data()[1], feature_names=NAMES)
    assert_columns_checked(lambda X: _first(named.predict(theta, X)), df)


def test_pandas_input_converts_quietly_to_a_copy(monkeypatch):
    """pandas hands numpy read-only views; torch warns on a tensor over read-only memory (once per process, so the
    check also watches what reaches ``torch.from_numpy``)."""
    df, y = _data()
    seen = []
    from_numpy = torch.from_numpy

    def watching(a):
        seen.append(a.flags.writeable)
        return from_numpy(a)

    monkeypatch.setattr(torch, "from_numpy", watching)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = gpvi.GPRegression(df, pd.Series(y))
        model.predict(model.initial_theta(), df)
        gpvi.GPClassification(df, (y > 0).astype(int))
    assert not [w for w in caught if "not writable" in str(w.message)]
    assert seen and all(seen)
    assert torch.equal(model.X, torch.as_tensor(df.to_numpy().copy())) and torch.equal(model.y, torch.as_tensor(y))


# ------------------------------------------------------------------------------------------------ classification
@pytest.fixture(scope="module")
def binary():
    df, y = _data(seed=1)
    model = gpvi.GPClassification(df, (y > 0).astype(int))
    post = gpvi.CVI(progress_bar=False).run(model)
    return df, model, post


@pytest.fixture(scope="module")
def multiclass():
    df, y = _data(seed=2)
    model = GPMulticlass(df, np.digitize(y, [-0.5, 0.5]))
    post = gpvi.CVI(progress_bar=False).run(model)
    return df, model, post


@pytest.mark.parametrize("which", ["binary", "multiclass"])
@pytest.mark.parametrize("method", ["predict_latent", "predict_proba", "predict"])
def test_latent_posterior_predict_paths_read_a_dataframe_by_name(request, which, method):
    df, model, post = request.getfixturevalue(which)
    assert model.feature_names == NAMES
    out = (lambda X: getattr(post, method)(X).probs) if method == "predict" else getattr(post, method)
    assert_columns_checked(lambda X: _first(out(X)), df)


@pytest.mark.parametrize("which", ["binary", "multiclass"])
def test_the_fully_bayesian_and_whitened_predictives_read_a_dataframe_by_name(request, which):
    df, model, post = request.getfixturevalue(which)
    D = len(post.theta)
    q = GaussianPosterior(post.theta, 0.01 * torch.eye(D, dtype=torch.float64), model.names)
    bayes = BayesClassificationPosterior(q, CVIBoundTarget(model, cvi=gpvi.CVI(progress_bar=False)), num_draws=2)
    assert_columns_checked(lambda X: _first(bayes.predict_latent(X)), df)
    assert_columns_checked(lambda X: _first(bayes.predict_proba(X)), df)
    whitened = WhitenedLatentGP(model)
    draws = torch.zeros(2, whitened.dim, dtype=torch.float64)
    draws[:, :D] = post.theta
    assert_columns_checked(lambda X: _first(whitened.predict_latent(draws, X)), df)
    assert_columns_checked(lambda X: _first(whitened.predict_proba(draws, X)), df)


@pytest.mark.parametrize("which", ["binary", "multiclass"])
@pytest.mark.parametrize("method", ["predict", "predict_proba", "predict_log_proba", "decision_function",
                                    "predict_latent"])
def test_classifier_predict_paths_refuse_other_columns(request, which, method):
    """GPClassifier refused them before (scikit-learn's check in ``validate_data``); it still does, on every path."""
    df, model, _ = request.getfixturevalue(which)
    clf = GPClassifier(hyperparameters="fixed", max_sweeps=20).fit(df, model.classes[model.y.long().cpu().numpy()])
    ref = getattr(clf, method)(df)
    with pytest.warns(UserWarning, match="X does not have valid feature names"):     # scikit-learn's rule
        np.testing.assert_array_equal(getattr(clf, method)(df.to_numpy()), ref)
    for frame, _ in _bad_frames(df):
        with pytest.raises(ValueError, match="feature names"):
            getattr(clf, method)(frame)


# ------------------------------------------------------------------------------------------------ saved fits
def test_a_saved_fit_reads_a_dataframe_by_name(regression, tmp_path):
    df, model, theta = regression
    fit = SavedFit("regression", "ml2", list(NAMES), "y", np.zeros(3), np.ones(3),
                   posterior=PointPosterior(theta, model.names, gpvi.GPRegression(df.to_numpy(), _data()[1])))
    save_fit(tmp_path / "r.pt", fit)
    back = load_fit(tmp_path / "r.pt")
    ref = back.predict(df)[0]
    np.testing.assert_array_equal(back.predict(df.to_numpy())[0], ref)
    for frame, words in _bad_frames(df):
        with pytest.raises(ValueError, match=r"X's columns do not match those the fit was fitted with "
                                             r"\('wt', 'hp', 'qsec'\): " + words):
            back.predict(frame)
