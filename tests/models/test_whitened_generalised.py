"""NUTS over (theta, the likelihood's log parameters, whitened f) for GPGeneralisedRegression (issue 60, item 3):
the target's layout and errors, priors on the likelihood's parameters in either space, and an independent answer:
a Student-t likelihood with df = 1e7 is Gaussian regression, so NUTS on the whitened target with the scale sampled
gives the kernel hyperparameters' and the noise's marginals of exact GP regression (gpvi.GPRegression, the same
priors, noise variance = scale^2) within Monte Carlo error. benchmarks/latent_nuts_gaussian.py runs it longer."""

from __future__ import annotations

import math
import warnings

import gpytorch
import pytest
import scipy.stats
import torch

import gpvi
from gpvi.models.latent_likelihoods import NegativeBinomial, StudentT
from gpvi.models.whitened import WhitenedLatentGP

F64 = torch.float64
LN = torch.distributions.LogNormal


def _gaussian_data(n: int = 8, noise: float = 0.6):
    g = torch.Generator().manual_seed(1)
    X = torch.linspace(-2, 2, n, dtype=F64).unsqueeze(-1)
    y = torch.sin(1.5 * X[:, 0]) + noise * torch.randn(n, generator=g, dtype=F64)
    return X, y - y.mean()                          # centred: GPRegression's offset is then exactly 0


def test_layout_defaults_and_errors():
    X, y = _gaussian_data()
    model = gpvi.GPGeneralisedRegression(X, y, likelihood=StudentT(4.0, 0.5))
    t = WhitenedLatentGP(model)
    assert t.names[:4] == ["log_lengthscale_sq[0]", "log_signal_var", "log_df", "log_scale"]
    assert t.dim == 4 + 8 and t.likelihood_params == ("df", "scale")
    z = t.initial_theta()
    assert z[2:4].tolist() == pytest.approx([math.log(4.0), math.log(0.5)])
    assert {k: float(v) for k, v in t.likelihood_values(z).items()} == pytest.approx({"df": 4.0, "scale": 0.5})
    fixed = WhitenedLatentGP(model, learn_theta=False)                       # the benchmark's baseline: v only
    assert fixed.dim == 8 and fixed.likelihood_params == ()
    one = WhitenedLatentGP(model, likelihood_params=["scale"])
    assert one.names[2] == "log_scale" and float(one.likelihood_values(one.initial_theta())["df"]) == 4.0
    with pytest.raises(ValueError, match="likelihood_params names \\['dispersion'\\]"):
        WhitenedLatentGP(model, likelihood_params=["dispersion"])
    with pytest.raises(ValueError, match="learn_theta=True"):
        WhitenedLatentGP(model, learn_theta=False, likelihood_params=["df"])
    with pytest.raises(ValueError, match=r"likelihood_priors\['df'\] names no learned parameter"):
        WhitenedLatentGP(model, likelihood_params=["scale"], likelihood_priors={"df": LN(1.0, 1.0)})
    with pytest.raises(ValueError, match="is a Normal"):
        WhitenedLatentGP(model, likelihood_priors={"scale": torch.distributions.Normal(0.0, 1.0)})
    with pytest.raises(ValueError, match="no likelihood parameter is sampled"):
        WhitenedLatentGP(model, learn_theta=False, likelihood_priors={"scale": LN(0.0, 1.0)})


def test_log_joint_with_priors_on_both_scales_is_the_scipy_sum():
    g = torch.Generator().manual_seed(3)
    X = torch.rand(7, 1, generator=g, dtype=F64)
    y = torch.tensor([0.0, 3, 1, 7, 2, 0, 12], dtype=F64)
    model = gpvi.GPGeneralisedRegression(X, y, likelihood=NegativeBinomial(2.0))
    t = WhitenedLatentGP(model, likelihood_priors={"dispersion": gpytorch.priors.GammaPrior(2.0, 0.5)})
    z = t.initial_theta() + 0.2 * torch.randn(t.dim, generator=g, dtype=F64)
    r = math.exp(float(z[2]))
    mu = t.latent(z).exp().numpy()
    want = (scipy.stats.nbinom.logpmf(y.numpy(), r, r / (r + mu)).sum() + scipy.stats.norm.logpdf(z[3:].numpy()).sum()
            + float(t.prior.log_prob(z[:2])) + scipy.stats.gamma.logpdf(r, 2.0, scale=2.0) + math.log(r))
    assert float(t.log_joint(z)) == pytest.approx(want, rel=1e-10)
    t2 = WhitenedLatentGP(model, likelihood_priors={"log_dispersion": torch.distributions.Normal(1.0, 0.5)})
    diff = float(t2.log_joint(z) - t.log_joint(z))
    assert diff == pytest.approx(scipy.stats.norm.logpdf(math.log(r), 1.0, 0.5)
                                 - scipy.stats.gamma.logpdf(r, 2.0, scale=2.0) - math.log(r), rel=1e-10)


def test_nuts_with_a_student_t_of_huge_df_gives_the_marginals_of_exact_gp_regression():
    X, y = _gaussian_data()
    # the same prior on both sides: N(0, 0.5^2) on log l^2 and log signal variance, N(log 0.36, 0.5^2) on the log noise
    # variance, i.e. N(log 0.6, 0.25^2) on log scale (scale^2 = noise variance)
    loc = torch.tensor([0.0, 0.0, math.log(0.36)], dtype=F64)
    exact = gpvi.GPRegression(X, y, prior=torch.distributions.Normal(loc, 0.5))
    model = gpvi.GPGeneralisedRegression(X, y, likelihood=StudentT(1e7, 0.6))
    target = WhitenedLatentGP(model, prior=torch.distributions.Normal(loc[:2], 0.5), likelihood_params=["scale"],
                              likelihood_priors={"log_scale": torch.distributions.Normal(math.log(0.6), 0.25)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = gpvi.NUTS(num_chains=1, num_warmup=150, num_draws=400, seed=0, progress_bar=False).run(exact)
        b = gpvi.NUTS(num_chains=1, num_warmup=150, num_draws=200, seed=0, progress_bar=False).run(target)
    sa, sb = a.samples, b.samples[:, :3].clone()
    sb[:, 2] = 2.0 * sb[:, 2]                        # log noise variance = 2 log scale
    ess_a, ess_b = a.diagnostics()["ess_bulk"], b.diagnostics()["ess_bulk"][:3]
    for j, name in enumerate(exact.names):
        ma, mb, sda, sdb = float(sa[:, j].mean()), float(sb[:, j].mean()), float(sa[:, j].std()), float(sb[:, j].std())
        se = math.sqrt(sda ** 2 / float(ess_a[j]) + sdb ** 2 / float(ess_b[j]))
        assert abs(ma - mb) < 4.0 * se, (name, ma, mb, se)      # 4 Monte Carlo standard errors
        assert 0.7 < sdb / sda < 1.4, (name, sda, sdb)         # sds: with the ESS here (>= 130) each is good to about 6%
