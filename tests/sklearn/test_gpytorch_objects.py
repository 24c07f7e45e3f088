"""GPClassifier with the GPyTorch objects a user arrives with (issue 40): registered priors, frozen parameters,
BernoulliLikelihood / SoftmaxLikelihood objects, named priors."""

import gpytorch
import numpy as np
import pytest
import torch
from gpytorch.priors import GammaPrior

import gpvi

DT = torch.float64


def _data(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 2, dtype=DT, generator=g)
    return X.numpy(), (torch.sin(2 * X[:, 0]) > 0).long().numpy()


def test_registered_prior_moves_the_fit():
    X, y = _data()
    tight = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2,
                                                                    lengthscale_prior=GammaPrior(300.0, 3000.0)))
    fit = gpvi.GPClassifier(kernel=tight, max_sweeps=30).fit(X, y)
    ls = [fit.hyperparameters_["lengthscale[0]"], fit.hyperparameters_["lengthscale[1]"]]
    assert ls == pytest.approx([0.1, 0.1], rel=0.02)                  # the prior's mode, 299/3000


def test_frozen_outputscale_stays_fixed():
    X, y = _data()
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))
    kernel.outputscale = 4.0
    kernel.raw_outputscale.requires_grad_(False)
    fit = gpvi.GPClassifier(kernel=kernel, max_sweeps=30).fit(X, y)
    assert fit.model_.names == ["log_lengthscale_sq[0]", "log_lengthscale_sq[1]"]
    assert fit.model_.fixed["signal_var"] == pytest.approx(4.0, rel=1e-6)
    assert float(fit.kernel_.outputscale) == pytest.approx(4.0, rel=1e-6)


def test_bernoulli_likelihood_is_the_probit():
    X, y = _data()
    a = gpvi.GPClassifier(likelihood=gpytorch.likelihoods.BernoulliLikelihood(), hyperparameters="fixed").fit(X, y)
    b = gpvi.GPClassifier(likelihood="probit", hyperparameters="fixed").fit(X, y)
    assert a.link_ == "probit"
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X))


def test_softmax_likelihood_objects():
    X, _ = _data()
    y3 = np.digitize(X[:, 0], [-0.5, 0.5])
    ok = gpytorch.likelihoods.SoftmaxLikelihood(num_classes=3, mixing_weights=False)
    fit = gpvi.GPClassifier(likelihood=ok, hyperparameters="fixed", max_sweeps=10).fit(X, y3)
    assert fit.link_ == "softmax"
    with pytest.raises(ValueError, match="mixing weights"):
        gpvi.GPClassifier(likelihood=gpytorch.likelihoods.SoftmaxLikelihood(num_features=3, num_classes=3)).fit(X, y3)
    with pytest.raises(ValueError, match="num_classes=4"):
        gpvi.GPClassifier(likelihood=gpytorch.likelihoods.SoftmaxLikelihood(num_classes=4, mixing_weights=False)
                          ).fit(X, y3)
    with pytest.raises(TypeError, match="GaussianLikelihood"):
        gpvi.GPClassifier(likelihood=gpytorch.likelihoods.GaussianLikelihood()).fit(X, y3)


def test_named_prior_dict_and_bad_prior_refused():
    X, y = _data()
    hn = torch.distributions.HalfNormal(torch.tensor(0.2, dtype=DT))
    fit = gpvi.GPClassifier(prior={"lengthscale": hn}, max_sweeps=30).fit(X, y)
    free = gpvi.GPClassifier(max_sweeps=30).fit(X, y)
    assert max(fit.hyperparameters_["lengthscale[0]"], fit.hyperparameters_["lengthscale[1]"]) < \
        max(free.hyperparameters_["lengthscale[0]"], free.hyperparameters_["lengthscale[1]"])
    with pytest.raises(ValueError, match="GammaPrior"):
        gpvi.GPClassifier(prior=GammaPrior(2.0, 1.0)).fit(X, y)
