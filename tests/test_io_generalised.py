"""gpvi.io for GPGeneralisedRegression (issue 60): a CVI fit with any of gpvi's likelihoods, its parameters learned
or given, round-trips through a fit file (predictions equal to 1e-12); a likelihood that is code (a user's GPyTorch
likelihood) is refused when saving with a TypeError, a file naming an unknown likelihood when loading with a
ValueError; the file stays plain data read with weights_only=True.
"""

from __future__ import annotations

import json
import warnings

import gpytorch
import numpy as np
import pytest
import torch

import gpvi
from gpvi.inference.cvi import LikelihoodTypeII, TypeII
from gpvi.io import SavedFit, load_fit, save_fit
from gpvi.models.latent_likelihoods import Beta, Laplace, NegativeBinomial, StudentT

F64 = torch.float64


def _data(kind: str):
    g = torch.Generator().manual_seed(3)
    X = torch.rand(30, 2, generator=g, dtype=F64) * 4 - 2
    f = torch.sin(X[:, 0]) + 0.5 * X[:, 1]
    if kind in ("poisson", "negative_binomial"):
        y = torch.poisson(torch.exp(1.0 + f), generator=g)
    elif kind == "beta":
        y = torch.sigmoid(f + 0.2 * torch.randn(30, generator=g, dtype=F64))
    else:
        y = f + 0.2 * torch.randn(30, generator=g, dtype=F64)
        y[[4, 17]] += torch.tensor([4.0, -5.0], dtype=F64)                  # two outliers
    return X, y


LIKELIHOODS = {"poisson": "poisson", "negative_binomial": NegativeBinomial(2.5), "student_t": StudentT(3.0, 0.3),
               "laplace": Laplace(0.4), "beta": Beta(6.0)}
X_NEW = torch.tensor([[-2.5, 0.0], [0.0, 0.0], [1.0, -1.5], [3.0, 2.5]], dtype=F64)   # inside and outside the data


def _same_predictions(a, b):
    pa, pb = a.predict(X_NEW), b.predict(X_NEW)
    torch.testing.assert_close(pb.latent_mean, pa.latent_mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(pb.latent_var, pa.latent_var, rtol=0, atol=1e-12)
    torch.testing.assert_close(pb.mean, pa.mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pb.var, pa.var, rtol=1e-12, atol=1e-12)
    for x, y in zip(pa.interval(0.9), pb.interval(0.9)):
        torch.testing.assert_close(y, x, rtol=1e-12, atol=1e-12)
    y_obs = pa.quantile(0.3)                                  # in the support of every likelihood
    torch.testing.assert_close(pb.log_prob(y_obs), pa.log_prob(y_obs), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", sorted(LIKELIHOODS))
def test_cvi_fit_round_trips_for_every_likelihood(kind, tmp_path):
    X, y = _data(kind)
    model = gpvi.GPGeneralisedRegression(X, y, likelihood=LIKELIHOODS[kind], theta=torch.tensor([0.5, 1.0, 0.2]))
    post = gpvi.CVI(progress_bar=False).run(model)
    p = tmp_path / f"{kind}.pt"
    save_fit(p, post)
    payload = torch.load(p, weights_only=True)                # plain data: tensors and one JSON string
    meta = json.loads(payload["meta"])
    assert meta["kind"] == "generalised_regression" and meta["model"]["likelihood"] == model.likelihood.spec()
    fit = load_fit(p)
    assert fit.kind == "generalised_regression" and fit.method == "cvi" and fit.features == ["x0", "x1"]
    back = fit.posterior
    assert type(back.model) is gpvi.GPGeneralisedRegression and back.model.likelihood.spec() == model.likelihood.spec()
    torch.testing.assert_close(back.theta, post.theta, rtol=0, atol=0)
    torch.testing.assert_close(back.model.theta, model.theta, rtol=0, atol=0)
    assert back.elbo == post.elbo and back.converged == post.converged
    _same_predictions(post, back)
    mean, var = fit.predict(X_NEW.numpy())                    # no standardisation: the predictive itself
    np.testing.assert_allclose(mean, post.predict(X_NEW).mean.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(var, post.predict(X_NEW).var.numpy(), rtol=1e-12, atol=1e-12)


def test_learned_likelihood_parameters_and_standardisation_survive(tmp_path):
    X, y = _data("student_t")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        post = LikelihoodTypeII(max_rounds=3).run(gpvi.GPGeneralisedRegression(X, y, likelihood=StudentT(4.0, 0.5)))
    learned = post.model.likelihood
    assert (learned.df, learned.scale) != (4.0, 0.5)
    x_mean, x_std, y_mean, y_std = np.array([1.0, -2.0]), np.array([2.0, 0.5]), 10.0, 3.0
    fit = SavedFit("generalised_regression", "cvi-type2", ["a", "b"], "y", x_mean, x_std, y_mean, y_std,
                   posterior=post, extra={"likelihood": "student-t"})
    p = tmp_path / "t.pt"
    save_fit(p, fit)
    back = load_fit(p)
    assert back.features == ["a", "b"] and back.method == "cvi-type2" and back.extra == {"likelihood": "student-t"}
    assert back.posterior.model.likelihood.spec() == learned.spec()
    assert back.posterior.info["likelihood_params"] == post.info["likelihood_params"]
    _same_predictions(post, back.posterior)
    X_raw = X_NEW.numpy() * x_std + x_mean
    mean, var = back.predict(X_raw)
    ref = post.predict(X_NEW)
    np.testing.assert_allclose(mean, ref.mean.numpy() * y_std + y_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(var, ref.var.numpy() * y_std ** 2, rtol=1e-12, atol=1e-12)
    lo, hi = back.interval(X_raw, 0.8)
    rlo, rhi = ref.interval(0.8)
    np.testing.assert_allclose(lo, rlo.numpy() * y_std + y_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(hi, rhi.numpy() * y_std + y_mean, rtol=1e-12, atol=1e-12)
    assert (lo < mean).all() and (mean < hi).all()


def test_type_ii_poisson_fit_with_names_and_weights_round_trips(tmp_path):
    X, y = _data("poisson")
    w = torch.ones(30, dtype=F64)
    w[:5] = 2.0
    model = gpvi.GPGeneralisedRegression(X, y, likelihood="poisson", feature_names=["dose", "age"], weights=w)
    post = TypeII(gpvi.CVI(progress_bar=False), prior=None).run(model)
    p = tmp_path / "p.pt"
    save_fit(p, post)
    back = load_fit(p).posterior
    assert back.model.feature_names == ["dose", "age"] and back.theta_names == post.theta_names
    torch.testing.assert_close(back.model.weights, w, rtol=0, atol=0)
    _same_predictions(post, back)


def test_gpytorch_likelihoods_gpvi_maps_are_saved_and_code_is_refused_naming_fit(tmp_path):
    X, y = _data("student_t")
    mapped = gpytorch.likelihoods.StudentTLikelihood()
    post = gpvi.CVI(progress_bar=False).run(gpvi.GPGeneralisedRegression(X, y, likelihood=mapped))
    save_fit(tmp_path / "mapped.pt", post)                    # StudentTLikelihood is gpvi's StudentT: plain data
    assert load_fit(tmp_path / "mapped.pt").posterior.model.likelihood.name == "student_t"

    class Cauchy(gpytorch.likelihoods._OneDimensionalLikelihood):
        def forward(self, function_samples, *args, **kwargs):
            return torch.distributions.Cauchy(function_samples, 0.3)

    for lik in (Cauchy(), gpytorch.likelihoods.PoissonLikelihood()):
        yy = y if isinstance(lik, Cauchy) else _data("poisson")[1]
        post = gpvi.CVI(progress_bar=False, num_steps=5).run(gpvi.GPGeneralisedRegression(X, yy, likelihood=lik))
        with pytest.raises(TypeError, match=r"^fit: cannot save a GPGeneralisedRegression whose likelihood is "
                                            r"GPyTorchSite\((Cauchy|PoissonLikelihood)\).*loading it never runs code"):
            save_fit(tmp_path / "code.pt", post)
    assert sorted(q.name for q in tmp_path.iterdir()) == ["mapped.pt"]     # nothing written, no temporary file


def test_custom_kernel_is_refused(tmp_path):
    X, y = _data("poisson")
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=2.5, ard_num_dims=2))
    post = gpvi.CVI(progress_bar=False, num_steps=3).run(gpvi.GPGeneralisedRegression(X, y, kernel,
                                                                                     likelihood="poisson"))
    with pytest.raises(ValueError, match="cannot save a GPGeneralisedRegression with a custom kernel"):
        save_fit(tmp_path / "k.pt", post)


def _rewrite(path, edit):
    payload = torch.load(path, weights_only=True)
    meta = json.loads(payload["meta"])
    edit(meta)
    payload["meta"] = json.dumps(meta)
    torch.save(payload, path)


@pytest.mark.parametrize("edit,message", [
    (lambda m: m["model"]["likelihood"].update(name="zeta"),
     r"not a valid gpvi fit \(unknown likelihood 'zeta'; this gpvi rebuilds poisson, negative_binomial, student_t, "
     r"laplace, beta"),
    (lambda m: m["model"].update(likelihood="poisson"), r"not a valid gpvi fit \(unknown likelihood None"),
    (lambda m: m["model"]["likelihood"].update(dispersion=-1.0), r"not a valid gpvi fit \(dispersion must be"),
    (lambda m: m["model"]["likelihood"].update(shape=2.0), r"not a valid gpvi fit \(likelihood spec .* does not fit"),
    (lambda m: m["posterior"].update(link="poisson"), r"not a valid gpvi fit \(state was made with likelihood"),
    (lambda m: m["posterior"].update(kind="gaussian"), r"must be a CVI \(latent\) posterior"),
], ids=["unknown name", "not a spec", "bad parameter", "unknown parameter", "posterior of another likelihood",
        "not a CVI posterior"])
def test_a_file_with_an_unknown_or_bad_likelihood_is_a_value_error(edit, message, tmp_path):
    X, y = _data("negative_binomial")
    post = gpvi.CVI(progress_bar=False, num_steps=5).run(
        gpvi.GPGeneralisedRegression(X, y, likelihood=NegativeBinomial(2.0)))
    p = tmp_path / "nb.pt"
    save_fit(p, post)
    _rewrite(p, edit)
    with pytest.raises(ValueError, match=message) as info:
        load_fit(p)
    assert str(p) in str(info.value)
