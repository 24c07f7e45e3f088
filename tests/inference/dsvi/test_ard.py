"""DSVI-ARD (paper section 3.2, eq. 13-14): the analytic term, its gradients, unbiasedness and sparsity."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import gpvi
from gpvi.inference.dsvi.ard import ARDTerm, DSVIARD, ard_prior_variance
from gpvi.exceptions import ConvergenceWarning
from gpvi.models.logistic import BayesianLogisticRegression


def eq13_closed_part(mu, c, l2):
    """Closed-form part of eq. 13: 1/2 sum log c^2 - 1/2 sum log l^2 - 1/2 sum (c^2 + mu^2)/l^2 + D/2."""
    return (0.5 * torch.log(c ** 2) - 0.5 * torch.log(l2) - 0.5 * (c ** 2 + mu ** 2) / l2).sum() + 0.5 * mu.shape[0]


def test_ard_term_is_eq13_at_optimal_prior_and_its_gradient():
    g = torch.Generator().manual_seed(0)
    mu = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    c = (torch.rand(6, generator=g, dtype=torch.float64) + 0.1).requires_grad_(True)
    value, gmu, gc = ARDTerm()(mu.detach(), c.detach())
    l2 = (c ** 2 + mu ** 2).detach()
    # eq. 14 is eq. 13 at l^2 = c^2 + mu^2, with nothing dropped
    assert value == pytest.approx(float(eq13_closed_part(mu.detach(), c.detach(), l2)), abs=1e-12)
    # and l^2 = c^2 + mu^2 maximises eq. 13 over l^2 (perturbations in either direction lower it)
    for f in (0.9, 1.1):
        assert float(eq13_closed_part(mu.detach(), c.detach(), l2 * f)) < value
    # gradients against autograd of eq. 14's closed part
    v = (0.5 * torch.log(c ** 2 / (c ** 2 + mu ** 2))).sum()
    amu, ac = torch.autograd.grad(v, (mu, c))
    assert torch.allclose(gmu, amu, rtol=1e-12, atol=1e-14) and torch.allclose(gc, ac, rtol=1e-12, atol=1e-14)


def test_ard_stochastic_gradient_is_unbiased():
    """Quadratic log g~ = -(t - m)^T A (t - m)/2: exact gradients of eq. 14 are
    dF/dmu = -A(mu - m) - mu/(c^2+mu^2),  dF/dc = -diag(A) c + mu^2/(c (c^2+mu^2))."""
    D = 4
    g = torch.Generator().manual_seed(3)
    B = torch.randn(D, D, generator=g, dtype=torch.float64)
    A = B @ B.T / D + torch.eye(D, dtype=torch.float64)
    m = torch.randn(D, generator=g, dtype=torch.float64)
    target = gpvi.Target(lambda th: -0.5 * (((th - m) @ A) * (th - m)).sum(-1), names=D)
    ard = DSVIARD(num_steps=10, lr=0.01, progress_bar=False)
    eng = ard.engine(target)
    state = ard.init(target, torch.randn(D, generator=g, dtype=torch.float64))
    state.C = torch.rand(D, generator=g, dtype=torch.float64) + 0.3
    mu, c = state.mu, state.C
    exact_mu = -A @ (mu - m) - mu / (c ** 2 + mu ** 2)
    exact_c = -torch.diagonal(A) * c + mu ** 2 / (c * (c ** 2 + mu ** 2))
    K = 4000
    est = [eng.estimate_gradient(target, state) for _ in range(K)]
    gm = torch.stack([e.grad_mu for e in est])
    gc = torch.stack([e.grad_C for e in est])
    assert bool(((gm.mean(0) - exact_mu).abs() < 5 * gm.std(0) / math.sqrt(K)).all())
    assert bool(((gc.mean(0) - exact_c).abs() < 5 * gc.std(0) / math.sqrt(K)).all())


def _mean_shift_data(N=60, D=50, k=3, delta=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = (torch.arange(N) % 2).double()[torch.randperm(N, generator=g)]
    rel = torch.randperm(D, generator=g)[:k]
    X = torch.randn(N, D, generator=g, dtype=torch.float64)
    X[:, rel] += delta * (2 * y[:, None] - 1)
    return X, y, rel


def test_ard_finds_relevant_features_and_mu_is_sparse():
    # three features shifted by +-1.5 between the classes (d' = 3 each), 47 pure-noise features, N = 60
    X, y, rel = _mean_shift_data(delta=1.5)
    lik = BayesianLogisticRegression(X, y, prior_var=None, bias=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        q = DSVIARD(num_steps=5000, progress_bar=False, seed=0).run(lik)
    assert q.info["lr_mu"] == pytest.approx(0.05 / 60)            # the paper's rho0 = 0.05 / N
    mu = q.mean.abs()
    assert set(mu.topk(3).indices.tolist()) == set(rel.tolist())
    irrelevant = torch.ones(50, dtype=torch.bool)
    irrelevant[rel] = False
    # sparsity: every pruned weight is at least 10x smaller than the smallest relevant one
    assert float(mu[irrelevant].max()) < 0.1 * float(mu[rel].min())
    l2 = q.info["prior_var"]
    assert torch.allclose(l2, ard_prior_variance(q)) and bool((q.info["relevance"][rel] > 0.5).all())
    assert bool((q.info["relevance"][irrelevant] < 0.5).all())
    assert torch.count_nonzero(q.scale_tril - torch.diag(torch.diagonal(q.scale_tril))) == 0
    assert math.isfinite(q.elbo)


def test_ard_validation():
    X, y, _ = _mean_shift_data(N=20, D=5)
    with pytest.raises(ValueError, match="prior"):
        DSVIARD(num_steps=5).run(BayesianLogisticRegression(X, y))           # has its own N(0, 1) prior
    with pytest.raises(ValueError, match="num_data"):
        DSVIARD(num_steps=5).run(gpvi.Target(lambda th: -(th ** 2).sum(-1), names=2))
    with pytest.raises(ValueError, match="lr"):
        DSVIARD(lr="auto")
    with pytest.raises(ValueError, match="scale"):
        DSVIARD(scale="full")
    with pytest.raises(ValueError, match="optimizer"):
        DSVIARD(optimizer="adam")                                   # SGD steps on eq. 14: lr, lr_scale, schedule
    with pytest.raises(ValueError, match="num_steps"):
        DSVIARD(num_steps=0)


def test_ard_rejects_minibatch_target_with_prior():
    X, y, _ = _mean_shift_data(N=40, D=5)
    with pytest.raises(ValueError, match="prior"):
        DSVIARD(num_steps=5).run(BayesianLogisticRegression(X, y).minibatch(10))
    lik = BayesianLogisticRegression(X, y, prior_var=None, bias=False).minibatch(10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = DSVIARD(num_steps=50, progress_bar=False, num_elbo_draws=20).run(lik)
    assert q.info["lr_mu"] == pytest.approx(0.05 / 40) and q.mean.shape == (5,)
