"""CVI's default start for counts (issue 60): the sites of the log counts (gpvi.models.latent_likelihoods.
log_count_sites), chosen by CVI.default_init for likelihoods with initial_sites. Counts at rates of 200-1000: from
q = prior full-batch CVI fails (the check can fail), from the default start it converges to the optimum that a start
from q = prior reaches where it does converge (negative binomial)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import gpvi
from gpvi.inference.cvi import init_to_sites
from gpvi.models.latent_likelihoods import log_count_sites

F64 = torch.float64


def _large_counts(n: int = 40):
    g = torch.Generator().manual_seed(0)
    X = torch.linspace(0, 10, n, dtype=F64).unsqueeze(-1)
    rate = torch.exp(6.0 + 0.8 * torch.sin(X[:, 0]))                    # 181 .. 898
    return X, torch.poisson(rate, generator=g)


def test_the_default_start_for_counts_is_the_sites_of_the_log_counts():
    X, y = _large_counts()
    cvi = gpvi.CVI(progress_bar=False)
    for lik in ("poisson", "negative_binomial"):
        start = cvi.default_init(gpvi.GPGeneralisedRegression(X, y, likelihood=lik))
        c = y + 0.5
        torch.testing.assert_close(start.lam1, torch.log(c) * c, rtol=0, atol=0)
        torch.testing.assert_close(start.lam2, -0.5 * c, rtol=0, atol=0)
    w = torch.linspace(0.5, 2.0, y.shape[0], dtype=F64)                   # weighted likelihood: weighted sites
    start = cvi.default_init(gpvi.GPGeneralisedRegression(X, y, likelihood="poisson", weights=w))
    torch.testing.assert_close(start.lam2, -0.5 * (y + 0.5) * w, rtol=1e-15, atol=0)
    w[3] = 0.0                                                             # an empty site: the prior start
    assert cvi.default_init(gpvi.GPGeneralisedRegression(X, y, likelihood="poisson", weights=w)).lam1 is None
    for other in ("student_t", "laplace"):
        assert cvi.default_init(gpvi.GPGeneralisedRegression(X, y / 100, likelihood=other)).lam1 is None
    assert cvi.default_init(gpvi.GPClassification(X, (y > 500).double())).lam1 is None
    lam1, lam2 = log_count_sites(torch.tensor([0.0, 4.0], dtype=F64))
    assert lam1.tolist() == pytest.approx([0.5 * math.log(0.5), 4.5 * math.log(4.5)]) and lam2.tolist() == [-0.25, -2.25]


def test_cvi_on_counts_in_the_hundreds_converges_from_the_default_start():
    X, y = _large_counts()
    model = gpvi.GPGeneralisedRegression(X, y, likelihood="poisson")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prior_start = gpvi.CVI(progress_bar=False).run(model, init_to_sites())     # q = prior, as before
    assert not prior_start.info["converged"]                   # measured: ELBO -1e94 after 500 steps
    post = gpvi.CVI(progress_bar=False).run(model)
    assert post.info["converged"] and post.info["steps"] < 50  # measured: 11 steps
    assert math.isfinite(post.elbo) and post.elbo > -300.0
    # the fixed point: the latent mean is the log rate to within the posterior's spread
    assert float(((post.m - torch.log(y)) / post.std).abs().mean()) < 2.0
    # where q = prior does converge (negative binomial), both starts reach the same optimum
    nb = gpvi.GPGeneralisedRegression(X, y, likelihood="negative_binomial")
    a = gpvi.CVI(progress_bar=False, tol=1e-12).run(nb)
    b = gpvi.CVI(progress_bar=False, tol=1e-12).run(nb, init_to_sites())
    assert a.info["converged"] and b.info["converged"]
    assert a.elbo == pytest.approx(b.elbo, abs=1e-8)
    torch.testing.assert_close(a.m, b.m, rtol=0, atol=1e-5)             # measured 2.3e-6 (tol 1e-12 on the ELBO)
