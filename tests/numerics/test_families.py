"""The multivariate (elliptical) Student-t standard distribution and the q it gives, against scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats as st
import torch

import gpvi
from gpvi.numerics.families import StandardMultivariateT, StandardStudentT, make_standard


@pytest.mark.parametrize("df", [1.5, 4.0, 30.0])
def test_log_prob_entropy_and_draws_match_scipy(df):
    D = 3
    phi = StandardMultivariateT(D, df)
    ref = st.multivariate_t(loc=np.zeros(D), shape=np.eye(D), df=df)
    z = torch.randn(50, D, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    np.testing.assert_allclose(phi.log_prob(z).numpy(), ref.logpdf(z.numpy()), rtol=1e-12, atol=1e-12)
    assert phi.entropy() == pytest.approx(float(ref.entropy()), rel=1e-10)
    draws = phi.sample(20000, torch.Generator().manual_seed(1))
    f = ((draws ** 2).sum(-1) / D).numpy()                     # ||z||^2 / D ~ F(D, df)
    assert st.kstest(f, st.f(D, df).cdf).pvalue > 0.01
    assert st.kstest(draws[:, 1].numpy(), st.t(df).cdf).pvalue > 0.01   # each component is t_df
    assert torch.equal(phi.sample(5, torch.Generator().manual_seed(2)), phi.sample(5, torch.Generator().manual_seed(2)))


def test_base_t_means_the_multivariate_t():
    assert isinstance(make_standard(("t", 5.0), 4), StandardMultivariateT)
    assert isinstance(make_standard("t", 4, df=5.0), StandardMultivariateT)


def _perm_logprob(base_of, perm):
    g = torch.Generator().manual_seed(0)
    D = 4
    mu = torch.randn(D, generator=g, dtype=torch.float64)
    A = torch.randn(D, D, generator=g, dtype=torch.float64)
    C = torch.linalg.cholesky(A @ A.T + torch.eye(D, dtype=torch.float64))
    q = gpvi.GaussianPosterior(mu, C, list("abcd"), base=base_of(D))
    P = torch.eye(D, dtype=torch.float64)[perm]
    Cp = torch.linalg.cholesky(P @ C @ C.T @ P.T)                  # the same shape matrix, other order
    qp = gpvi.GaussianPosterior(P @ mu, Cp, [list("abcd")[i] for i in perm], base=base_of(D))
    theta = q.sample(200, seed=1)
    return q.log_prob(theta), qp.log_prob(theta[:, perm])


def test_the_multivariate_t_family_does_not_depend_on_the_order_of_theta():
    a, b = _perm_logprob(lambda D: StandardMultivariateT(D, 3.0), [2, 0, 3, 1])
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    a, b = _perm_logprob(lambda D: StandardStudentT(D, 3.0), [2, 0, 3, 1])      # the product t does
    assert (a - b).abs().max() > 1e-3


def test_marginals_and_quantiles_of_a_full_multivariate_t_q_are_exact_student_ts():
    D, df = 3, 5.0
    C = torch.tensor([[1.0, 0, 0], [0.5, 0.7, 0], [-0.3, 0.2, 0.4]], dtype=torch.float64)
    mu = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    q = gpvi.GaussianPosterior(mu, C, ["a", "b", "c"], base=StandardMultivariateT(D, df))
    scales = torch.sqrt((C ** 2).sum(-1))
    m = q.marginals()["b"]
    assert m["family"] == "student_t" and m["df"] == df and m["scale"] == pytest.approx(float(scales[1]))
    qs = q.quantile([0.05, 0.5, 0.95])
    for j in range(D):
        ref = st.t(df, loc=float(mu[j]), scale=float(scales[j])).ppf([0.05, 0.5, 0.95])
        np.testing.assert_allclose(qs[:, j].numpy(), ref, rtol=1e-12)
    assert torch.allclose(q.std, scales * math.sqrt(df / (df - 2)))
    draws = q.sample(40000, seed=0)
    assert ((torch.quantile(draws, 0.95, dim=0) - qs[2]).abs() / scales).max() < 0.05
    back = gpvi.posteriors.Posterior.from_state_dict(q.state_dict())
    assert isinstance(back.base, StandardMultivariateT) and torch.equal(back.log_prob(draws[:5]), q.log_prob(draws[:5]))
