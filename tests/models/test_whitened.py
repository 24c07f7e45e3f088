"""The whitened (theta, v) target of GP classification and NUTS on it, against independent answers."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import gpvi
from gpvi.models.multiclass import GPMulticlass
from gpvi.models.whitened import WhitenedLatentGP


def _small(n=6, seed=0):
    X = torch.linspace(-1.5, 1.5, n, dtype=torch.float64)[:, None]
    y = torch.tensor([0, 0, 1, 0, 1, 1][:n], dtype=torch.float64)
    return gpvi.GPClassification(X, y)


def test_log_joint_matches_a_direct_computation_and_gradient_is_finite_difference_exact():
    model = _small()
    t = WhitenedLatentGP(model)
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, t.dim, generator=g, dtype=torch.float64)
    got = t.log_joint(z)
    for s in range(3):
        th, v = z[s, :2], z[s, 2:]
        K = model.kernel_matrix(th) + 1e-6 * model.kernel_matrix(th).diagonal().mean() * torch.eye(6, dtype=torch.float64)
        f = torch.linalg.cholesky(K) @ v
        ll = -torch.nn.functional.binary_cross_entropy_with_logits(f, model.y, reduction="sum")
        lv = torch.distributions.Normal(0.0, 1.0).log_prob(v).sum()
        lt = torch.distributions.Normal(0.0, math.sqrt(10.0)).log_prob(th).sum()
        # K is built by two code paths; with the 1e-6 jitter its condition number can reach 1e6, which amplifies
        # their rounding differences (about 1e-16 each) to ~1e-10 relative in f
        assert float(got[s]) == pytest.approx(float(ll + lv + lt), rel=1e-8)
    zz = z[0].clone().requires_grad_(True)
    (gr,) = torch.autograd.grad(t.log_joint(zz), zz)
    h = 1e-6
    fd = torch.stack([(t.log_joint(z[0] + h * e) - t.log_joint(z[0] - h * e)) / (2 * h)
                      for e in torch.eye(t.dim, dtype=torch.float64)])
    torch.testing.assert_close(gr, fd, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_nuts_on_the_whitened_target_matches_prior_importance_sampling():
    """E[theta | y], E[sigmoid(f) | y] and p(y* | y) by NUTS vs self-normalised importance sampling from the prior.

    Prior N(0, 1) on the log-hyperparameters (a tighter prior than the default keeps the run short); bounded functions
    of f are compared (f's own moments are dominated by its tails)."""
    model = _small()
    prior = torch.distributions.Independent(torch.distributions.Normal(torch.zeros(2, dtype=torch.float64),
                                                                       torch.ones(2, dtype=torch.float64)), 1)
    t = WhitenedLatentGP(model, prior=prior)
    g = torch.Generator().manual_seed(1)
    S = 400_000
    z = torch.randn(S, 8, generator=g, dtype=torch.float64)               # prior draws of (theta, v)
    logw = torch.cat([model.likelihood.log_prob(model.y, t.latent(c)).sum(-1) for c in z.split(50_000)])
    w = torch.softmax(logw, 0)
    assert 1.0 / float((w * w).sum()) > 20_000                            # the IS answer is precise
    p_in_is = w @ torch.cat([torch.sigmoid(t.latent(c)) for c in z.split(50_000)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mc = gpvi.NUTS(num_chains=1, num_warmup=300, num_draws=1000, seed=0, progress_bar=False).run(t)
    d = mc.samples
    # NUTS's Monte Carlo error at its ESS (> 200 here) is < 0.07 sd; allow 0.15 sd
    assert bool(((d[:, :2].mean(0) - w @ z[:, :2]).abs() <= 0.15 * d[:, :2].std(0)).all())
    assert float((torch.sigmoid(t.latent(d)).mean(0) - p_in_is).abs().max()) < 0.03
    Xs = torch.tensor([[-1.0], [0.2], [2.0]], dtype=torch.float64)
    # IS predictive: average over 4,000 draws resampled in proportion to the weights (unbiased); NUTS's from every
    # draw (thinned to 200, its Monte Carlo error alone reached 0.039 on one machine's random stream)
    idx = torch.multinomial(w, 4000, replacement=True, generator=g)
    p_is = t.predict_proba(z[idx], Xs)
    assert float((t.predict_proba(d, Xs) - p_is).abs().max()) < 0.03


def test_fixed_theta_samples_only_v_and_bad_model_is_refused():
    model = _small()
    t = WhitenedLatentGP(model, learn_theta=False)
    assert t.dim == 6 and t.names[0] == "v[0]"
    assert t.log_joint(torch.zeros(6, dtype=torch.float64)).shape == ()
    with pytest.raises(TypeError, match="model"):
        WhitenedLatentGP(object())


def _three_class(n=6):
    X = torch.linspace(-1.5, 1.5, n, dtype=torch.float64)[:, None]
    return GPMulticlass(X, [0, 0, 1, 2, 1, 2][:n])


def test_multiclass_log_joint_matches_a_direct_computation_and_finite_differences():
    """K whitened vectors (class-major): log softmax of f_k = L v_k summed over points, N(0, I) on every v_k."""
    model = _three_class()
    t = WhitenedLatentGP(model)
    assert t.num_classes == 3 and t.dim == 2 + 18 and t.names[2] == "v[0,0]" and t.names[-1] == "v[2,5]"
    g = torch.Generator().manual_seed(3)
    z = torch.randn(3, t.dim, generator=g, dtype=torch.float64)
    got = t.log_joint(z)
    for s in range(3):
        th, V = z[s, :2], z[s, 2:].reshape(3, 6)
        K = model.kernel_matrix(th)
        L = torch.linalg.cholesky(K + 1e-6 * K.diagonal().mean() * torch.eye(6, dtype=torch.float64))
        F = torch.stack([L @ V[k] for k in range(3)], -1)                       # (N, K)
        ll = torch.log_softmax(F, -1)[torch.arange(6), model.y].sum()
        lv = torch.distributions.Normal(0.0, 1.0).log_prob(V).sum()
        lt = torch.distributions.Normal(0.0, math.sqrt(10.0)).log_prob(th).sum()
        assert float(got[s]) == pytest.approx(float(ll + lv + lt), rel=1e-8)
        torch.testing.assert_close(t.latent(z[s]), F, rtol=1e-8, atol=1e-10)
    zz = z[1].clone().requires_grad_(True)
    (gr,) = torch.autograd.grad(t.log_joint(zz), zz)
    h = 1e-6
    fd = torch.stack([(t.log_joint(z[1] + h * e) - t.log_joint(z[1] - h * e)) / (2 * h)
                      for e in torch.eye(t.dim, dtype=torch.float64)])
    torch.testing.assert_close(gr, fd, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_multiclass_nuts_matches_prior_importance_sampling():
    """Three classes: E[theta | y], E[softmax(f) | y] at the data and p(y* = k | y) at new inputs by NUTS vs
    self-normalised importance sampling from the prior (tight N(0, 1) prior on theta, as in the binary test)."""
    model = _three_class()
    prior = torch.distributions.Independent(torch.distributions.Normal(torch.zeros(2, dtype=torch.float64),
                                                                       torch.ones(2, dtype=torch.float64)), 1)
    t = WhitenedLatentGP(model, prior=prior)
    g = torch.Generator().manual_seed(4)
    S = 400_000
    z = torch.randn(S, t.dim, generator=g, dtype=torch.float64)
    logw = torch.cat([torch.log_softmax(t.latent(c), -1)[:, torch.arange(6), model.y].sum(-1)
                      for c in z.split(50_000)])
    w = torch.softmax(logw, 0)
    assert 1.0 / float((w * w).sum()) > 20_000
    p_in_is = torch.einsum("s,snk->nk", w, torch.cat([torch.softmax(t.latent(c), -1) for c in z.split(50_000)]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mc = gpvi.NUTS(num_chains=1, num_warmup=300, num_draws=1000, seed=0, progress_bar=False).run(t)
    d = mc.samples
    assert bool(((d[:, :2].mean(0) - w @ z[:, :2]).abs() <= 0.15 * d[:, :2].std(0)).all())
    assert float((torch.softmax(t.latent(d), -1).mean(0) - p_in_is).abs().max()) < 0.03
    Xs = torch.tensor([[-1.0], [0.2], [2.0]], dtype=torch.float64)
    # Monte Carlo error budget: the reference from 1,000 resampled prior draws was 0.01 off one from 20,000, and
    # NUTS's 1,000 draws thinned to 200 another 0.02 (measured 2026-11-25): 4,000 resamples, every NUTS draw
    idx = torch.multinomial(w, 4000, replacement=True, generator=g)
    p_is = t.predict_proba(z[idx], Xs)
    p_mc = t.predict_proba(d, Xs)
    assert p_mc.shape == (3, 3) and torch.allclose(p_mc.sum(-1), torch.ones(3, dtype=torch.float64))
    assert float((p_mc - p_is).abs().max()) < 0.03
