"""gpvi.io: fits saved as tensors + JSON, read back with torch.load(weights_only=True) only.

Round trips for every posterior kind and for classifiers (predictions equal to 1e-12), column validation of
SavedFit.predict, and refusal of every other file — above all crafted pickles whose loading would run code: the
tests check both that load_fit raises and that the code did not run (and, as the control, that an ordinary
unpickler *would* have run it).
"""

from __future__ import annotations

import builtins
import json
import pickle
import pickletools
import warnings
import zipfile

import gpytorch
import numpy as np
import pytest
import torch

import gpvi
import gpvi.cli
from gpvi.io import FORMAT, FORMAT_VERSION, SavedFit, load_fit, save_fit

FLAG: list[str] = []


def _set_flag(*args):
    """Called by a crafted pickle if (and only if) something unpickles it without restrictions."""
    FLAG.append("ran")
    return "ran"


class _OpensMarker:
    """Unpickling this calls ``open(marker, "w")``: the marker file appears."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (builtins.open, (self.marker, "w"))


class _SetsFlag:
    def __reduce__(self):
        return (_set_flag, ("x",))


@pytest.fixture(scope="module")
def reg_data():
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (25, 2))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(25)
    return X, y


@pytest.fixture(scope="module")
def reg_posteriors(reg_data):
    X, y = reg_data
    model = gpvi.GPRegression(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        point = gpvi.ML2(num_restarts=1, seed=0, progress_bar=False).run(model)
        gauss = gpvi.DSVI(scale="full", seed=0, num_steps=20, progress_bar=False).run(model, init=point)
        samples = gpvi.NUTS(1, 5, 6, seed=0, progress_bar=False).run(model, init=point)   # chains, warm-up, draws
    return {"point": point, "gaussian": gauss, "samples": samples}


@pytest.fixture(scope="module")
def cls_data():
    rng = np.random.default_rng(1)
    X = rng.uniform(-2, 2, (30, 2))
    lab = np.where(X[:, 0] + 0.4 * rng.standard_normal(30) > 0, 1, -1)
    return X, lab


# ------------------------------------------------------------------------------------------------ round trips
@pytest.mark.parametrize("kind", ["point", "gaussian", "samples"])
def test_regression_round_trip(kind, reg_posteriors, reg_data, tmp_path):
    X, _ = reg_data
    post = reg_posteriors[kind]
    p = tmp_path / f"{kind}.pt"
    fit = SavedFit("regression", "m", ["a", "b"], "y", x_mean=np.array([0.5, -1.0]), x_std=np.array([2.0, 3.0]),
                   y_mean=10.0, y_std=4.0, posterior=post, extra={"note": "hi", "n": 3})
    save_fit(p, fit)
    payload = torch.load(p, weights_only=True)
    assert set(payload) == {"format", "version", "meta", "tensors"}
    assert payload["format"] == FORMAT and payload["version"] == FORMAT_VERSION
    assert all(isinstance(t, torch.Tensor) for t in payload["tensors"].values())

    def strict(token):
        raise AssertionError(f"non-JSON constant {token}")
    meta = json.loads(payload["meta"], parse_constant=strict)   # plain, strict JSON
    assert meta["kind"] == "regression" and meta["posterior"]["kind"] == post.state_dict()["kind"]

    back = load_fit(p)
    assert back.kind == "regression" and back.features == ["a", "b"] and back.extra == {"note": "hi", "n": 3}
    assert type(back.posterior) is type(post) and back.posterior.names == post.names
    torch.testing.assert_close(back.posterior.target.X, post.target.X, rtol=0, atol=0)
    torch.testing.assert_close(back.posterior.mean, post.mean, rtol=0, atol=1e-12)
    Xraw = X[:6] * np.array([2.0, 3.0]) + np.array([0.5, -1.0])
    mean, var = back.predict(Xraw, num_draws=5, seed=1)
    ref = post.predict(X[:6], num_draws=5, seed=1)
    np.testing.assert_allclose(mean, ref.mean.numpy() * 4.0 + 10.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(var, ref.var.numpy() * 16.0, rtol=1e-12, atol=0)


def test_bare_posterior_is_saved_with_default_names(reg_posteriors, reg_data, tmp_path):
    p = tmp_path / "q.pt"
    save_fit(p, reg_posteriors["gaussian"])
    back = load_fit(p)
    assert back.features == ["x0", "x1"] and back.method == "dsvi"
    np.testing.assert_array_equal(back.x_mean, [0.0, 0.0])
    assert [q.name for q in tmp_path.iterdir()] == ["q.pt"]          # the temporary file was renamed, none left


@pytest.mark.parametrize("settings", [{}, {"likelihood": "probit", "mode": "stochastic", "num_quadrature": 40,
                                           "max_sweeps": 5, "random_state": 3}])
def test_classifier_round_trip_predict_proba_to_1e12(settings, cls_data, tmp_path):
    X, lab = cls_data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = gpvi.GPClassifier(**{"max_sweeps": 30, **settings}).fit(X, lab)
    p = tmp_path / "clf.pt"
    save_fit(p, clf)
    back = load_fit(p)
    c2 = back.classifier
    assert back.kind == "classification" and back.classes == [-1, 1]
    assert isinstance(c2, gpvi.GPClassifier) and c2.get_params() == clf.get_params()
    Xnew = np.random.default_rng(5).uniform(-3, 3, (15, 2))
    for Z in (X, Xnew):
        np.testing.assert_allclose(c2.predict_proba(Z), clf.predict_proba(Z), rtol=0, atol=1e-12)
        np.testing.assert_allclose(c2.decision_function(Z), clf.decision_function(Z), rtol=0, atol=1e-12)
        np.testing.assert_array_equal(c2.predict(Z), clf.predict(Z))
    assert c2.elbo_ == clf.elbo_ and c2.link_ == clf.link_ and c2.n_features_in_ == 2
    torch.testing.assert_close(c2.theta_, clf.theta_, rtol=0, atol=0)
    assert c2.posterior_.quadrature.spec() == clf.posterior_.quadrature.spec()
    np.testing.assert_allclose(back.predict_proba(X), clf.predict_proba(X), rtol=0, atol=1e-12)
    np.testing.assert_allclose(back.predict(X), clf.predict_proba(X)[:, 1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("likelihood", ["softmax", "robustmax"])
def test_multiclass_classifier_round_trip_with_string_labels(likelihood, tmp_path):
    rng = np.random.default_rng(3)
    X = rng.uniform(-2, 2, (24, 2))
    lab = np.array(["ant", "bee", "cat"])[(X[:, 0] > -0.6).astype(int) + (X[:, 0] > 0.6).astype(int)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                      # robust-max needs more than 40 sweeps here
        clf = gpvi.GPClassifier(likelihood=likelihood, hyperparameters="fixed", max_sweeps=40).fit(X, lab)
    p = tmp_path / "mc.pt"
    save_fit(p, clf)
    meta = json.loads(torch.load(p, weights_only=True)["meta"])
    assert meta["classifier"]["classes"] == ["ant", "bee", "cat"] and meta["classifier"]["model"] == "multiclass"
    back = load_fit(p)
    c2 = back.classifier
    assert back.classes == ["ant", "bee", "cat"] and c2.get_params() == clf.get_params()
    assert c2.link_ == likelihood and c2.n_classes_ == 3 and type(c2.posterior_) is type(clf.posterior_)
    Xnew = np.random.default_rng(6).uniform(-3, 3, (15, 2))
    for Z in (X, Xnew):
        np.testing.assert_allclose(c2.predict_proba(Z), clf.predict_proba(Z), rtol=0, atol=1e-12)
        np.testing.assert_allclose(c2.decision_function(Z), clf.decision_function(Z), rtol=0, atol=1e-12)
        np.testing.assert_array_equal(c2.predict(Z), clf.predict(Z))
    assert c2.elbo_ == clf.elbo_
    torch.testing.assert_close(c2.theta_, clf.theta_, rtol=0, atol=0)
    np.testing.assert_allclose(back.predict(Xnew), clf.predict_proba(Xnew), rtol=0, atol=1e-12)   # (n, K)


def test_binary_string_labels_round_trip_and_a_file_without_class_indices_is_refused(cls_data, tmp_path):
    X, lab = cls_data
    words = np.where(lab == 1, "spam", "ham")
    clf = gpvi.GPClassifier(hyperparameters="fixed", max_sweeps=30).fit(X, words)
    save_fit(tmp_path / "w.pt", clf)
    back = load_fit(tmp_path / "w.pt").classifier
    assert back.classes_.tolist() == ["ham", "spam"]
    np.testing.assert_allclose(back.predict_proba(X), clf.predict_proba(X), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(back.predict(X), clf.predict(X))
    # a file whose targets are labels "y" instead of class indices (an earlier layout) is refused, not guessed at
    old = gpvi.GPClassifier(hyperparameters="fixed", max_sweeps=30).fit(X, lab)
    save_fit(tmp_path / "old.pt", old)
    payload = torch.load(tmp_path / "old.pt", weights_only=True)
    meta = json.loads(payload["meta"])
    spec = meta["classifier"]
    tensors = payload["tensors"]
    idx = tensors.pop(spec.pop("y_index")["$tensor"])
    tensors["fit.classifier.y"] = torch.as_tensor(np.array([-1, 1])[idx.numpy()])
    spec["y"] = {"$tensor": "fit.classifier.y"}
    for k in ("model", "likelihood"):
        del spec[k]
    del spec["params"]["hyperparameters"]
    spec["params"]["likelihood"] = "logit"
    payload["meta"] = json.dumps(meta)
    torch.save(payload, tmp_path / "old.pt")
    with pytest.raises(ValueError, match=r"old\.pt: not a valid gpvi fit .*y_index.*save it again"):
        load_fit(tmp_path / "old.pt")


def test_cli_names_are_the_io_objects():
    assert gpvi.cli.load_fit is load_fit and gpvi.cli.SavedFit is SavedFit and gpvi.cli.save_fit is save_fit


# ------------------------------------------------------------------------------------------------ SavedFit.predict
def test_predict_validates_columns(reg_posteriors, cls_data, tmp_path):
    fit = SavedFit("regression", "ml2", ["a", "b"], "y", np.zeros(2), np.ones(2),
                   posterior=reg_posteriors["point"])
    with pytest.raises(ValueError, match=r"X has 3 columns but the fit was made with 2 features \(a, b\)"):
        fit.predict(np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"X must be 2-D of shape \(n, 2\); got 1-D"):
        fit.predict(np.zeros(2))
    with pytest.raises(ValueError, match="NaN or infinite"):
        fit.predict(np.array([[0.0, np.nan]]))
    with pytest.raises(ValueError, match="X has no rows"):
        fit.predict(np.zeros((0, 2)))
    with pytest.raises(TypeError, match="needs a classification fit"):
        fit.predict_proba(np.zeros((1, 2)))
    X, lab = cls_data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = gpvi.GPClassifier(max_sweeps=5, hyperparameters="fixed").fit(X, lab)
    save_fit(tmp_path / "c.pt", clf)
    cfit = load_fit(tmp_path / "c.pt")
    with pytest.raises(ValueError, match=r"X has 1 columns but the fit was made with 2 features \(x0, x1\)"):
        cfit.predict_proba(np.zeros((3, 1)))


# ------------------------------------------------------------------------------------------------ save refusals
def test_save_refuses_what_plain_data_cannot_describe(reg_data, cls_data, tmp_path):
    X, y = reg_data
    Xc, lab = cls_data
    with pytest.raises(ValueError, match="not fitted"):
        save_fit(tmp_path / "a.pt", gpvi.GPClassifier())
    kern = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(ard_num_dims=2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = gpvi.GPClassifier(kernel=kern, max_sweeps=3,
                                hyperparameters="fixed").fit(Xc, lab)
    with pytest.raises(ValueError, match="custom kernel"):
        save_fit(tmp_path / "b.pt", clf)
    model = gpvi.GPRegression(X, y, kernel=kern)
    post = gpvi.PointPosterior(model.initial_theta(), model.names, model)
    with pytest.raises(ValueError, match="custom kernel"):
        save_fit(tmp_path / "c.pt", post)
    laplace = torch.distributions.Laplace(torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64))
    model = gpvi.GPRegression(X, y, prior=laplace)
    with pytest.raises(ValueError, match="only Normal priors"):
        save_fit(tmp_path / "d.pt", gpvi.PointPosterior(model.initial_theta(), model.names, model))
    model = gpvi.GPRegression(X, y, prior={"lengthscale": torch.distributions.HalfNormal(torch.tensor(1.0,
                                                                                                   dtype=torch.float64))})
    with pytest.raises(ValueError, match="named priors, frozen or constrained parameters"):
        save_fit(tmp_path / "f.pt", gpvi.PointPosterior(model.initial_theta(), model.names, model))
    with pytest.raises(TypeError, match="fit must be a SavedFit"):
        save_fit(tmp_path / "e.pt", {"a": 1})
    assert not any(tmp_path.iterdir())                         # nothing written, no temporary files left


def test_save_keeps_a_normal_prior(reg_data, tmp_path):
    X, y = reg_data
    prior = torch.distributions.Normal(torch.full((4,), 0.5, dtype=torch.float64),
                                       torch.full((4,), 2.0, dtype=torch.float64))
    model = gpvi.GPRegression(X, y, prior=prior)
    theta = model.initial_theta()
    save_fit(tmp_path / "p.pt", gpvi.PointPosterior(theta, model.names, model))
    back = load_fit(tmp_path / "p.pt").posterior.target
    torch.testing.assert_close(back.log_joint(theta), model.log_joint(theta), rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------------ load refusals
def _crafted_pickles(tmp_path, marker):
    """Files whose unrestricted unpickling runs code: raw pickles (protocols 2 and 4) and torch zip files."""
    files = {}
    for proto in (2, 4):
        f = tmp_path / f"raw{proto}.pt"
        f.write_bytes(pickle.dumps({"format": FORMAT, "version": FORMAT_VERSION, "meta": "{}",
                                    "tensors": {"x": _OpensMarker(marker)}}, protocol=proto))
        files[f"raw{proto}"] = f
    f = tmp_path / "zip_marker.pt"
    torch.save({"format": FORMAT, "version": FORMAT_VERSION, "meta": "{}", "tensors": {}, "x": _OpensMarker(marker)},
               f)
    files["zip_marker"] = f
    f = tmp_path / "zip_flag.pt"
    torch.save({"format": FORMAT, "version": FORMAT_VERSION, "meta": _SetsFlag(), "tensors": {}}, f)
    files["zip_flag"] = f
    return files


def test_crafted_pickles_are_refused_and_never_run(tmp_path):
    marker = tmp_path / "MARKER"
    FLAG.clear()
    for name, f in _crafted_pickles(tmp_path, marker).items():
        with pytest.raises(ValueError, match=r"refused: not a gpvi fit file \((it refers to the Python object "
                                             r"(io\.open|builtins\.open|\S*_set_flag)|unsupported pickle "
                                             r"operation)") as info:
            load_fit(f)
        assert str(f) in str(info.value) and "could run code" in str(info.value)
        assert not marker.exists() and FLAG == [], f"{name}: the crafted code ran"
    # control: the files really are dangerous; plain pickle / torch.load(weights_only=False) would run them
    pickle.loads((tmp_path / "raw4.pt").read_bytes())
    assert marker.exists()
    marker.unlink()
    torch.load(tmp_path / "zip_flag.pt", weights_only=False)
    assert FLAG == ["ran"]


def _payload(meta: str | None = None, **over):
    p = {"format": FORMAT, "version": FORMAT_VERSION, "meta": meta if meta is not None else "{}", "tensors": {}}
    p.update(over)
    return p


def test_other_files_are_refused_with_the_path_and_why(tmp_path, reg_posteriors):
    good = tmp_path / "good.pt"
    save_fit(good, reg_posteriors["point"])
    blob = good.read_bytes()
    cases = {}

    def put(name, data):
        f = tmp_path / name
        f.write_bytes(data) if isinstance(data, bytes) else torch.save(data, f)
        cases[name] = f

    put("truncated.pt", blob[: len(blob) // 2])
    put("empty.pt", b"")
    put("text.pt", b"mean,sd\n1,2\n")
    put("random.pt", bytes(np.random.default_rng(0).integers(0, 256, 400, dtype=np.uint8)))
    put("other.pt", {"a": torch.zeros(2)})
    put("version1.pt", {"format": "gpvi-fit-1", "kind": "regression"})
    put("version99.pt", _payload(version=99))
    put("extra_entry.pt", _payload(other=1))
    put("meta_not_json.pt", _payload("{not json"))
    put("meta_nan.pt", _payload('{"kind": NaN}'))
    put("meta_list.pt", _payload("[1, 2]"))
    put("missing_ref.pt", _payload('{"kind": "regression", "x": {"$tensor": "nope"}}'))
    put("missing_fields.pt", _payload('{"kind": "regression"}'))
    put("unknown_kind.pt", _payload('{"kind": "quantum", "method": "m", "features": [], "target": "y", '
                                    '"x_mean": [], "x_std": []}'))
    put("numpy_inside.pt", {"format": FORMAT, "version": FORMAT_VERSION, "meta": "{}",
                            "tensors": {"a": np.zeros(3)}})
    expected = {"truncated.pt": "truncated or corrupt", "empty.pt": "truncated or corrupt",
                "text.pt": "not a gpvi fit file", "random.pt": "not a gpvi fit file",
                "other.pt": "not a fit saved by the gpvi command",
                "version1.pt": "not a fit saved by the gpvi command .*'gpvi-fit-1'",
                "version99.pt": "format version 99; this gpvi reads version 2 only",
                "extra_entry.pt": "entries", "meta_not_json.pt": "not a valid gpvi fit",
                "meta_nan.pt": "non-JSON constant NaN", "meta_list.pt": "not a JSON object",
                "missing_ref.pt": "tensor 'nope' that the file does not hold",
                "missing_fields.pt": "missing entry 'features'", "unknown_kind.pt": "unknown kind 'quantum'",
                "numpy_inside.pt": "refused"}
    for name, f in cases.items():
        with pytest.raises(ValueError, match=expected[name]) as info:
            load_fit(f)
        assert str(f) in str(info.value), name
    with pytest.raises(ValueError, match="no such file"):
        load_fit(tmp_path / "absent.pt")
    with pytest.raises(ValueError, match="is a folder"):
        load_fit(tmp_path)
    assert load_fit(good).kind == "regression"


def test_a_file_names_only_torch_tensor_globals(tmp_path, reg_posteriors):
    """The pickled part of a fit refers to torch's tensor-rebuilding functions only (no gpvi class, no numpy)."""
    f = tmp_path / "q.pt"
    save_fit(f, reg_posteriors["samples"])
    with zipfile.ZipFile(f) as z:
        data = next(z.read(n) for n in z.namelist() if n.endswith("data.pkl"))
    names = {str(arg) for op, arg, _ in pickletools.genops(data) if op.name in ("GLOBAL", "STACK_GLOBAL")}
    assert names and all(n.startswith(("torch ", "torch.", "collections OrderedDict")) for n in names), names


def test_feature_names_survive_save_and_load_and_a_missing_folder_is_named(tmp_path):
    from gpvi.io import load_fit, save_fit

    g = torch.Generator().manual_seed(0)
    X = torch.rand(25, 2, generator=g, dtype=torch.float64)
    y = torch.sin(5 * X[:, 0]) + 0.1 * torch.randn(25, generator=g, dtype=torch.float64)
    model = gpvi.GPRegression(X, y, feature_names=["age", "nox"])
    fit = gpvi.ML2(num_restarts=1, seed=0, progress_bar=False).run(model)
    save_fit(tmp_path / "fit.pt", fit)
    back = load_fit(tmp_path / "fit.pt")
    assert back.posterior.target.names == model.names and "log_lengthscale_sq[nox]" in model.names
    with pytest.raises(FileNotFoundError, match="nowhere"):
        save_fit(tmp_path / "nowhere" / "fit.pt", fit)


def test_regression_y_offset_survives_and_old_files_load_as_fitted(reg_data, tmp_path):
    """gpvi centres y at its mean by default (issue 58, data on any scale): a saved fit keeps that, and a file
    written before (no y_offset in it) is rebuilt with the zero mean it was fitted with, not silently re-centred."""
    from gpvi._fit_specs import _regression_from, _regression_spec
    X, y = reg_data
    model = gpvi.GPRegression(X, y + 5.0)
    point = gpvi.ML2(num_restarts=1, seed=0, progress_bar=False).run(model)
    p = tmp_path / "offset.pt"
    save_fit(p, SavedFit("regression", "m", ["a", "b"], "y", x_mean=np.zeros(2), x_std=np.ones(2), y_mean=0.0,
                         y_std=1.0, posterior=point))
    back = load_fit(p).posterior
    assert back.target.y_offset == model.y_offset != 0.0
    torch.testing.assert_close(back.target.predict(point.theta, X[:5])[0], model.predict(point.theta, X[:5])[0],
                               rtol=0, atol=1e-12)
    old = {k: v for k, v in _regression_spec(model).items() if k != "y_offset"}
    rebuilt = _regression_from(old)
    assert rebuilt.y_offset == 0.0
    zero = gpvi.GPRegression(X, y + 5.0, mean=gpytorch.means.ZeroMean())
    assert float(rebuilt.log_marginal_likelihood(point.theta)) == float(zero.log_marginal_likelihood(point.theta))
