"""The GPyTorch model the user wrote is the model gpvi fits: registered priors, frozen and constrained parameters,
GaussianLikelihood and ConstantMean objects (issue 40). Independent answers: GPyTorch's ExactMarginalLogLikelihood,
closed-form densities, GPyTorch's own predictive."""

import math
import warnings

import gpytorch
import pytest
import torch
from gpytorch.priors import GammaPrior, HalfCauchyPrior, LogNormalPrior, NormalPrior

import gpvi
from gpvi.io import save_fit
from gpvi.models.model_prior import ModelPrior
from gpvi.models.priors import resolve_prior
from gpvi.models.classification import GPClassification

DT = torch.float64


def _gamma(a, b):
    """A GammaPrior as the model holds it: float32 parameters (GPyTorch's default) moved to float64."""
    return GammaPrior(a, b).double()


def _normal10():
    return torch.distributions.Normal(torch.tensor(0.0, dtype=DT), torch.tensor(math.sqrt(10.0), dtype=DT))


def _data(n=40, seed=1):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 2, dtype=DT, generator=g)
    y = torch.sin(2 * X[:, 0]) + 0.2 * torch.randn(n, dtype=DT, generator=g)
    return X, y


class _Exact(gpytorch.models.ExactGP):
    def __init__(self, X, y, lik, kernel, mean):
        super().__init__(X, y, lik)
        self.kernel, self.mean = kernel, mean

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean(x), self.kernel(x))


def _rq_with_alpha_prior():
    rq = gpytorch.kernels.RQKernel(lengthscale_prior=GammaPrior(2.0, 2.0),
                                   alpha_constraint=gpytorch.constraints.GreaterThan(0.1))
    rq.register_prior("alpha_prior", GammaPrior(2.0, 1.0), lambda m: m.alpha, lambda m, v: m._set_alpha(v))
    return gpytorch.kernels.ScaleKernel(rq, outputscale_prior=GammaPrior(2.0, 0.5))


KERNELS = {
    "rbf_ard": lambda: gpytorch.kernels.ScaleKernel(
        gpytorch.kernels.RBFKernel(ard_num_dims=2, lengthscale_prior=GammaPrior(3.0, 6.0)),
        outputscale_prior=GammaPrior(2.0, 0.15)),
    "matern_interval": lambda: gpytorch.kernels.ScaleKernel(
        gpytorch.kernels.MaternKernel(nu=1.5, lengthscale_prior=LogNormalPrior(0.0, 1.0),
                                      lengthscale_constraint=gpytorch.constraints.Interval(0.05, 20.0)),
        outputscale_prior=HalfCauchyPrior(1.0)),
    "rq_greater_than": _rq_with_alpha_prior,
    "rbf_plus_constant": lambda: gpytorch.kernels.ScaleKernel(
        gpytorch.kernels.RBFKernel(ard_num_dims=2, lengthscale_prior=GammaPrior(3.0, 6.0)),
        outputscale_prior=GammaPrior(2.0, 0.15)) + gpytorch.kernels.ConstantKernel(constant_prior=GammaPrior(2.0, 2.0)),
}


def _set_gpytorch_values(model, theta, kernel, lik, mean):
    """Put gpvi's natural values at theta into the user's GPyTorch modules."""
    nat = model.natural(theta)
    with torch.no_grad():
        for b in model.kernel_params.blocks:
            owner_path, _, pname = b.path.rpartition(".")
            owner = kernel.get_submodule(owner_path) if owner_path else kernel
            c = owner.constraint_for_parameter_name(pname)
            owner._parameters[pname].copy_(c.inverse_transform(nat[b.start:b.stop].reshape(b.shape)))
        lik.noise = model.noise_var(theta)
        mean.constant = model.mean_constant(theta)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_log_joint_is_n_times_exact_mll_plus_jacobian(name):
    X, y = _data()
    kernel = KERNELS[name]()
    lik = gpytorch.likelihoods.GaussianLikelihood(noise_prior=GammaPrior(1.1, 0.05))
    mean = gpytorch.means.ConstantMean(constant_prior=NormalPrior(0.0, 2.0))
    model = gpvi.GPRegression(X, y, kernel=kernel, likelihood=lik, mean=mean)
    assert "uncovered" not in str(model.prior_summary()) and all("registered" in v for v in
                                                               model.prior_summary().values())
    theta = model.initial_theta() + 0.1 * torch.randn(model.dim, dtype=DT, generator=torch.Generator().manual_seed(2))
    gm = _Exact(X, y, lik, kernel, mean).double()
    _set_gpytorch_values(model, theta, kernel, lik, mean)
    gm.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(lik, gm)
    with gpytorch.settings.max_cholesky_size(10**6), gpytorch.settings.fast_computations(False, False, False):
        ref = float(mll(gm(X), y)) * X.shape[0]
    jac = sum(float(b.bijection.log_abs_det(theta[b.start:b.stop]).sum()) for b in model._blocks)
    got = float(model.log_joint(theta))
    assert abs(got - (ref + jac)) < 1e-10 * max(1.0, abs(ref))
    assert abs(float(model.log_prior(theta)) - float(model.log_prior(theta + 0.0))) == 0.0


def test_fast_path_keeps_registered_priors():
    X, y = _data()
    kernel = KERNELS["rbf_ard"]()
    model = gpvi.GPRegression(X, y, kernel=kernel)
    assert model.kernel_params.fast_path
    theta = model.initial_theta()
    slow = gpvi.GPRegression(X, y, kernel=kernel)
    slow.use_fast_path = False
    assert abs(float(model.log_joint(theta)) - float(slow.log_joint(theta))) < 1e-10
    plain = gpvi.GPRegression(X, y)
    ls = torch.exp(theta[:2] / 2)
    expect = (float(_gamma(3.0, 6.0).log_prob(ls).sum()) + float((math.log(0.5) + theta[:2] / 2).sum())
              + float(_gamma(2.0, 0.15).log_prob(torch.exp(theta[2]))) + float(theta[2])
              + float(_normal10().log_prob(theta[3] - model.standard_theta()[3])))   # centred at log var(y)
    assert abs(float(model.log_prior(theta)) - expect) < 1e-12
    assert abs(float(plain.log_prior(theta)) - expect) > 1.0          # the prior is not silently dropped


def test_log_prior_gradient_matches_finite_differences():
    X, y = _data()
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(
        nu=1.5, lengthscale_prior=GammaPrior(2.0, 2.0), lengthscale_constraint=gpytorch.constraints.Interval(0.05, 20.0)),
        outputscale_prior=GammaPrior(2.0, 0.5), outputscale_constraint=gpytorch.constraints.GreaterThan(0.01))
    model = gpvi.GPRegression(X, y, kernel=kernel,
                              prior={"noise_sd": torch.distributions.HalfNormal(torch.tensor(1.0, dtype=DT))})
    assert model.names == ["logit_lengthscale", "log_excess_signal_var", "log_noise_var"]
    theta = model.initial_theta().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: model.log_prior(t), (theta,))
    batch = torch.stack([theta.detach(), theta.detach() + 0.3])
    assert torch.allclose(model.log_prior(batch), torch.stack([model.log_prior(t) for t in batch]), atol=1e-12)


def test_named_priors_closed_form_and_feature_names():
    X, y = _data()
    hn = torch.distributions.HalfNormal(torch.tensor(1.0, dtype=DT))
    model = gpvi.GPRegression(X, y, feature_names=["a", "b"],
                              prior={"lengthscale[b]": hn, "signal_sd": hn, "noise_var": torch.distributions.Gamma(
                                  torch.tensor(2.0, dtype=DT), torch.tensor(4.0, dtype=DT))})
    th = model.initial_theta()
    expect = (float(_normal10().log_prob(th[0] - model.standard_theta()[0]))       # lengthscale[a]: log var(x_a)
              + float(hn.log_prob(torch.exp(th[1] / 2))) + math.log(0.5) + float(th[1]) / 2
              + float(hn.log_prob(torch.exp(th[2] / 2))) + math.log(0.5) + float(th[2]) / 2
              + float(torch.distributions.Gamma(torch.tensor(2.0, dtype=DT), torch.tensor(4.0, dtype=DT)).log_prob(
                  torch.exp(th[3]))) + float(th[3]))
    assert abs(float(model.log_prior(th)) - expect) < 1e-12
    assert "gpvi default" in model.prior_summary()["log_lengthscale_sq[a]"]


@pytest.mark.parametrize("prior, match", [
    (GammaPrior(2.0, 1.0), r"prior \(GammaPrior\).*log_signal_var"),                 # a Gamma on log values
    ({"lengthscale": torch.distributions.Uniform(0.0, 1e-3)}, r"prior: the Uniform .* is -inf"),
    ({"lengthscale": torch.distributions.Normal(0.0, 1.0)}, "positive"),
    ({"lengthscal": torch.distributions.HalfNormal(1.0)}, "names no hyperparameter"),
])
def test_bad_priors_refused_at_construction(prior, match):
    X, y = _data()
    with pytest.raises(ValueError, match=match):
        gpvi.GPRegression(X, y, prior=prior)


def test_conflicting_priors_refused():
    X, y = _data()
    with pytest.raises(ValueError, match="both give a prior"):
        gpvi.GPRegression(X, y, kernel=KERNELS["rbf_ard"](),
                          prior={"lengthscale": torch.distributions.HalfNormal(1.0)})
    with pytest.raises(ValueError, match="over all of theta"):
        gpvi.GPRegression(X, y, kernel=KERNELS["rbf_ard"](), prior=gpvi.models.priors.default_prior(4))


def test_frozen_parameter_is_fixed_and_leaves_names():
    X, y = _data()
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)).double()
    kernel.outputscale = 4.0
    kernel.raw_outputscale.requires_grad_(False)
    model = gpvi.GPRegression(X, y, kernel=kernel)
    assert model.names == ["log_lengthscale_sq[0]", "log_lengthscale_sq[1]", "log_noise_var"]
    assert model.fixed == {"signal_var": pytest.approx(4.0, rel=1e-12)}
    assert "fixed at" in model.prior_summary()["signal_var"]
    theta = model.initial_theta()
    kernel.base_kernel.lengthscale = torch.exp(theta[:2] / 2)
    with torch.no_grad(), gpytorch.settings.lazily_evaluate_kernels(False):
        K = kernel(model._Xc).to_dense() + torch.exp(theta[2]) * torch.eye(X.shape[0], dtype=DT)
    assert torch.allclose(model.covariance(theta), K, rtol=1e-12, atol=1e-12)


def test_frozen_noise_and_likelihood_noise_constraint():
    X, y = _data()
    lik = gpytorch.likelihoods.GaussianLikelihood()
    lik.noise = 0.05
    model = gpvi.GPRegression(X, y, likelihood=lik)
    assert model.names[-1] == "log_excess_noise_var"
    assert abs(float(model.noise_var(model.theta_from_kernel())) - 0.05) < 1e-7
    lik.raw_noise.requires_grad_(False)
    frozen = gpvi.GPRegression(X, y, likelihood=lik)
    assert frozen.names == ["log_lengthscale_sq[0]", "log_lengthscale_sq[1]", "log_signal_var"]
    assert "noise_var" in frozen.fixed


def test_constant_mean_prediction_matches_gpytorch():
    X, y = _data()
    y = y + 3.0
    kernel = KERNELS["rbf_ard"]()
    lik, mean = gpytorch.likelihoods.GaussianLikelihood(), gpytorch.means.ConstantMean()
    model = gpvi.GPRegression(X, y, kernel=kernel, likelihood=lik, mean=mean)
    theta = model.initial_theta()
    assert abs(float(theta[-1]) - float(y.mean())) < 1e-12
    gm = _Exact(X, y, lik, kernel, mean).double()
    _set_gpytorch_values(model, theta, kernel, lik, mean)
    Xs = torch.linspace(-2, 2, 7, dtype=DT).unsqueeze(-1).expand(7, 2).clone()
    gm.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var(False), gpytorch.settings.max_cholesky_size(10**6):
        ref = lik(gm(Xs))
    m, v = model.predict(theta, Xs)
    assert torch.allclose(m, ref.mean, atol=1e-8) and torch.allclose(v, ref.variance, atol=1e-8)


def test_unsupported_objects_refused():
    X, y = _data()
    with pytest.raises(TypeError, match="likelihood"):
        gpvi.GPRegression(X, y, likelihood=gpytorch.likelihoods.StudentTLikelihood())
    with pytest.raises(TypeError, match="mean"):
        gpvi.GPRegression(X, y, mean=gpytorch.means.LinearMean(2))
    k = gpytorch.kernels.RBFKernel(lengthscale_constraint=gpytorch.constraints.LessThan(3.0))
    with pytest.raises(ValueError, match="no lower bound"):
        gpvi.GPRegression(X, y, kernel=k)


def test_save_refuses_what_it_cannot_describe(tmp_path):
    X, y = _data()
    model = gpvi.GPRegression(X, y, kernel=KERNELS["rbf_ard"]())
    post = gpvi.inference.ml2.ML2(num_restarts=1, seed=0).run(model)
    with pytest.raises(ValueError, match="registered or named priors, frozen or constrained"):
        save_fit(tmp_path / "fit.pt", post)


def test_classification_prior_resolved_with_registered_priors():
    X, y = _data()
    kernel = KERNELS["rbf_ard"]()
    model = GPClassification(X, (y > 0).long(), kernel=kernel)
    prior = resolve_prior("default", model)
    assert isinstance(prior, ModelPrior)
    th = model.theta
    expect = (float(_gamma(3.0, 6.0).log_prob(torch.exp(th[:2] / 2)).sum()) + float((math.log(0.5) + th[:2] / 2).sum())
              + float(_gamma(2.0, 0.15).log_prob(torch.exp(th[2]))) + float(th[2]))
    assert abs(float(prior.log_prob(th)) - expect) < 1e-12
    with pytest.raises(ValueError, match="over all of theta"):
        resolve_prior(gpvi.models.priors.default_prior(3), model)
    none = resolve_prior(None, model)                    # ML-II: no default, registered priors stay
    assert abs(float(none.log_prob(th)) - expect) < 1e-12


def test_kernels_with_active_dims_work_batched_and_in_nuts():
    """A kernel on some columns (``active_dims``): the batched log joint (every engine's call; GPyTorch's
    expand_batch used to batch the index buffer, so index_select raised) equals the same kernel on those columns
    given alone, theta by theta."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(20, 3, generator=g, dtype=torch.float64)
    y = torch.sin(X[:, 0]) + 0.1 * torch.randn(20, generator=g, dtype=torch.float64)
    k = gpytorch.kernels
    on_cols = gpvi.GPRegression(X, y, kernel=k.ScaleKernel(k.RBFKernel(active_dims=[0, 2], ard_num_dims=2)))
    alone = gpvi.GPRegression(X[:, [0, 2]], y, kernel=k.ScaleKernel(k.RBFKernel(ard_num_dims=2)))
    theta = on_cols.initial_theta() + 0.3 * torch.randn(3, on_cols.dim, generator=g, dtype=torch.float64)
    v, grad = on_cols.log_joint_and_grad(theta)
    v_ref, g_ref = alone.log_joint_and_grad(theta)
    assert torch.allclose(v, v_ref, rtol=1e-12, atol=0) and torch.allclose(grad, g_ref, rtol=1e-10, atol=1e-12)
    assert torch.allclose(on_cols.log_joint(theta[1]), v_ref[1], rtol=1e-12, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mc = gpvi.NUTS(num_chains=2, num_warmup=10, num_draws=10, progress_bar=False).run(on_cols)
    assert mc.draws.shape == (2, 10, on_cols.dim)
