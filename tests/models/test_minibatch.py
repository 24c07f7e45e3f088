"""Data subsampling (DSVI paper section 3.3): log g_t = (N/M) sum_batch log p(x_n|theta) + log p(theta)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from gpvi.inference.dsvi.engine import DSVI, SGD
from gpvi.exceptions import ConvergenceWarning
from gpvi.inference.quadrature_fit import fit_gaussian_quadrature
from gpvi.models.logistic import BayesianLogisticRegression
from gpvi.models.minibatch import MinibatchTarget


@pytest.fixture(scope="module")
def logistic_data():
    g = torch.Generator().manual_seed(0)
    N, d = 2000, 3
    X = torch.randn(N, d, generator=g, dtype=torch.float64)
    w = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    y = (torch.rand(N, generator=g, dtype=torch.float64) < torch.sigmoid(X @ w + 0.3)).double()
    return BayesianLogisticRegression(X, y)


def test_full_data_evaluation_streams_exactly(logistic_data):
    model = logistic_data
    mb = model.minibatch(100, chunk_size=37)               # chunks that do not divide N
    theta = torch.randn(5, model.dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert torch.allclose(mb.log_joint(theta), model.log_joint(theta), rtol=1e-12, atol=1e-9)
    assert torch.allclose(mb.log_joint(theta[0]), model.log_joint(theta[0]), rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("replace", [True, False])
def test_minibatch_log_joint_and_gradient_are_unbiased(logistic_data, replace):
    """E_B[log g_t(theta)] = log g(theta) and likewise for the gradient; K minibatches, 5 standard errors."""
    model = logistic_data
    mb = model.minibatch(50, replace=replace)
    gen = torch.Generator().manual_seed(2)
    theta = torch.tensor([[0.2, 0.8, -1.5, 0.4]], dtype=torch.float64, requires_grad=True)
    exact = model.log_joint(theta)
    (gexact,) = torch.autograd.grad(exact.sum(), theta)
    K = 2000
    vals, grads = torch.empty(K, dtype=torch.float64), torch.empty(K, model.dim, dtype=torch.float64)
    for k in range(K):
        b = mb.sample_minibatch(gen)
        if not replace:
            assert b.unique().numel() == b.numel()
        v = mb.log_joint(theta, batch=b)
        (gr,) = torch.autograd.grad(v.sum(), theta)
        vals[k], grads[k] = v.detach()[0], gr[0]
    assert abs(float(vals.mean() - exact.detach()[0])) < 5 * float(vals.std()) / math.sqrt(K)
    se = grads.std(0) / math.sqrt(K)
    assert bool(((grads.mean(0) - gexact[0]).abs() < 5 * se).all())


def test_minibatch_dsvi_reaches_full_batch_answer(logistic_data):
    """Doubly stochastic DSVI (fresh minibatch of M = 100 each step) -> the unique optimum of the concave bound."""
    model = logistic_data
    ref = fit_gaussian_quadrature(model)
    T, frac = 4000, 0.5
    iterates = []
    eng = DSVI(num_steps=T, polyak=frac, optimizer=SGD(lr=0.5 / (0.25 * model.num_data), schedule="constant"),
               seed=0, progress_bar=False, num_elbo_draws=200)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        q = eng.run(model.minibatch(100),
                    callback=lambda s, i: iterates.append(s.mu.clone()) if s.t > T * (1 - frac) else None)
    it = torch.stack(iterates)
    se = it.reshape(20, -1, it.shape[1]).mean(1).std(0) / math.sqrt(20)     # batch means over the Polyak window
    # + 0.1 sd: bias of a constant rate on a non-quadratic bound (O(rho)) is well below this
    assert bool(((q.mean - ref.mean).abs() <= 5 * se + 0.1 * ref.stddev).all())
    assert float(((q.mean - ref.mean) / ref.stddev).abs().max()) < 0.5
    assert q.info["log_joint_calls"] == T                  # one (minibatch) call per step
    assert abs(q.elbo - ref.elbo) < 5 * q.elbo_se + 0.5    # final estimate uses the full data, streamed


def test_minibatch_runs_are_reproducible_and_resumable(logistic_data):
    mb = logistic_data.minibatch(64)
    kw = dict(num_steps=200, seed=5, progress_bar=False, num_elbo_draws=50, optimizer=SGD(lr=1e-3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = DSVI(**kw).run(mb)
        b = DSVI(**kw).run(mb)

        def stop(s, i):
            if s.t == 77:
                raise KeyboardInterrupt
        part = DSVI(**kw).run(mb, callback=stop)
        c = DSVI(**kw).run(mb, state=part.engine_state.copy())
    assert torch.equal(a.mean, b.mean) and torch.equal(a.mean, c.mean) and torch.equal(a.scale_tril, c.scale_tril)


def test_validation():
    lik = lambda th, idx: th[:, :1] * torch.ones(1, idx.shape[0], dtype=th.dtype)
    with pytest.raises(ValueError, match="batch_size"):
        MinibatchTarget(lik, 10, 1, batch_size=11)
    with pytest.raises(ValueError, match="batch_size"):
        MinibatchTarget(lik, 10, 1, batch_size=0)
    with pytest.raises(ValueError, match="num_data"):
        MinibatchTarget(lik, 0, 1)
    with pytest.raises(TypeError, match="log_lik"):
        MinibatchTarget("nope", 10, 1)
    with pytest.raises(TypeError, match="log_prior"):
        MinibatchTarget(lik, 10, 1, log_prior=3)
    bad = MinibatchTarget(lambda th, idx: th[:, 0], 10, 1, batch_size=5)
    with pytest.raises(ValueError, match="log_lik returned shape"):
        bad.log_joint(torch.zeros(2, 1, dtype=torch.float64), batch=torch.arange(5))
    t = MinibatchTarget(lik, 10, ["a"], batch_size=4, replace=False)
    b = t.sample_minibatch(torch.Generator().manual_seed(0))
    assert b.shape == (4,) and b.unique().numel() == 4 and int(b.max()) < 10
    assert t.scale == 2.5 and t.initial_theta().shape == (1,)
