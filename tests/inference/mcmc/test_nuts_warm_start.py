"""NUTS warm-started from a Gaussian q: q's covariance is the sampler's inverse mass matrix (only the step size is
adapted), checked at the transitions themselves, and the draws still target the posterior."""

from __future__ import annotations

import warnings

import pytest
import torch

import gpvi
from gpvi.inference.mcmc import NUTS, Adaptation
from gpvi.posteriors import GaussianPosterior

M = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
L = torch.tensor([[1.0, 0.0, 0.0], [0.95, 0.3, 0.0], [-0.5, 0.4, 0.2]], dtype=torch.float64)   # strongly correlated
SIGMA = L @ L.T
PREC = torch.linalg.inv(SIGMA)
NAMES = ["a", "b", "c"]


def _target():
    return gpvi.Target(lambda th: -0.5 * (((th - M) @ PREC) * (th - M)).sum(-1), names=NAMES)


def _run(init, adaptation=Adaptation(), warmup=60, draws=300, seed=0):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gpvi.NUTS(num_chains=2, num_warmup=warmup, num_draws=draws, seed=seed, progress_bar=False,
                         adaptation=adaptation).run(_target(), init=init)


def _spy_metrics(monkeypatch, seen):
    """Record the inverse mass matrix of every NUTS transition (NumPy or compiled kernel alike)."""
    real = NUTS._transition

    def spy(self, z, lp, g, eps, metric, rng):
        seen.append(torch.from_numpy(metric.inv.copy()))
        return real(self, z, lp, g, eps, metric, rng)

    monkeypatch.setattr(NUTS, "_transition", spy)


def test_q_covariance_is_the_inverse_mass_matrix_the_sampler_uses(monkeypatch):
    q = GaussianPosterior(M + 0.1, 1.1 * L, NAMES)
    seen = []
    _spy_metrics(monkeypatch, seen)                                     # the metric of every transition
    mc = _run(q)
    cov = q.covariance
    assert len(seen) == 2 * (60 + 300)
    assert all(s.shape == (3, 3) and torch.allclose(s, cov, rtol=0, atol=1e-14) for s in seen)
    assert mc.info["init"]["mass_matrix"].startswith("q's covariance")
    assert len(set(mc.stats["step_size"][:, 0].tolist())) == 2          # step size still adapted, per chain


def test_warm_started_draws_target_the_posterior_with_cheaper_trajectories():
    q = GaussianPosterior(M + 0.1, 1.1 * L, NAMES)
    warm = _run(q)
    cold = _run(q, adaptation=Adaptation(mass_from_init=False), draws=30)
    sd = torch.sqrt(torch.diagonal(SIGMA))
    ess = warm.ess()
    assert bool((ess > 100).all())
    err = (warm.mean - M).abs() / sd
    assert bool((err < 4.0 / torch.sqrt(ess)).all())                     # within 4 Monte Carlo standard errors
    assert ((warm.std / sd) - 1).abs().max() < 0.2
    # the correlated target with a diagonal M^-1 learnt in a 60-step warm-up needs longer trajectories
    steps_warm = warm.stats["n_steps"].double().mean()
    steps_cold = cold.stats["n_steps"].double().mean()
    assert steps_warm < 0.5 * steps_cold


def test_resume_of_a_warm_started_run_is_exact():
    q = GaussianPosterior(M, L, NAMES)
    full = _run(q, draws=40)
    part = _run(q, draws=20)
    more = gpvi.NUTS(num_chains=2, num_warmup=60, num_draws=40, seed=0, progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ext = more.run(_target(), state=part.engine_state.state_dict())
    assert torch.equal(ext.draws, full.draws)


def test_a_point_start_keeps_the_usual_adaptation():
    mc = _run(M.clone(), warmup=10, draws=5)
    assert "mass_matrix" not in mc.info["init"]
    with pytest.raises(TypeError):
        Adaptation(mass_from_init="yes")


@pytest.mark.parametrize("dense", [False, True])
def test_mass_start_init_starts_the_adapted_metric_at_q_and_the_windows_replace_it(monkeypatch, dense):
    q = GaussianPosterior(M + 0.1, 1.1 * L, NAMES)
    seen = []
    _spy_metrics(monkeypatch, seen)
    start = q.covariance if dense else torch.diagonal(q.covariance)
    mc = _run(q, adaptation=Adaptation(mass_from_init=False, mass_start="init", dense_mass=dense), draws=5)
    assert torch.allclose(seen[0], start, rtol=0, atol=1e-14)          # the first warm-up transition
    assert not torch.allclose(seen[-1], start, rtol=0, atol=1e-3)       # the windows estimated it from the draws
    assert mc.info["init"]["mass_matrix"].startswith("adapted in windows from q's")
    seen.clear()
    _run(q, adaptation=Adaptation(mass_from_init=False, dense_mass=dense), draws=5)
    assert torch.equal(seen[0], torch.eye(3, dtype=torch.float64) if dense else torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="mass_start"):
        Adaptation(mass_start="q")


def test_mass_estimate_draws_and_gradients_adapts_a_diagonal_metric_and_targets_the_posterior():
    """Adaptation(mass_estimate="draws_and_gradients") (nutpie's estimate) on a Gaussian whose scales differ by 100x:
    the adapted diagonal metric is within 2x of the true variances (Stan's estimate from the same number of draws
    is noisier, not biased), and the draws' means and sds match the closed form; dense metrics refuse it; the
    default leaves a run's stored settings as they were."""
    sd = torch.tensor([0.05, 1.0, 5.0], dtype=torch.float64)
    target = gpvi.Target(lambda th: -0.5 * (((th - M) / sd) ** 2).sum(-1), names=NAMES)
    a = Adaptation(mass_estimate="draws_and_gradients")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mc = gpvi.NUTS(num_chains=2, num_warmup=300, num_draws=1500, seed=3, progress_bar=False,
                       adaptation=a).run(target)
    final = mc.info["inverse_mass_matrix"]
    ratio = final / sd ** 2
    assert bool((ratio > 0.5).all() and (ratio < 2.0).all()), ratio
    assert bool(((mc.mean - M).abs() < 0.2 * sd).all())
    assert torch.allclose(mc.std, sd, rtol=0.1)
    assert "mass_estimate" not in Adaptation().settings() and a.settings()["mass_estimate"] == "draws_and_gradients"
    with pytest.raises(ValueError, match="mass_estimate"):
        Adaptation(mass_estimate="draws_and_gradients", dense_mass=True)
    with pytest.raises(ValueError, match="mass_estimate"):
        Adaptation(mass_estimate="fisher")
