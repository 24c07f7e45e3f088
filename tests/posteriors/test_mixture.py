"""Several basins (issue 17): the mixture of DSVI's starts, its PSIS basin masses, and gpvi.infer's use of them.

Independent answers: closed-form moments and densities of a two-component normal mixture (scipy), and a target
that *is* such a mixture (normalised, log Z = 0), whose basin masses are its component weights and whose mean and
sd are known in closed form. The best single Gaussian of that target sits on the heavier component; PSIS of it
alone cannot see the lighter one (its draws never go there), which is the failure the mixture step exists to catch.
"""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import scipy.optimize
import scipy.stats
import torch

import gpvi
from gpvi.inference.dsvi.engine import DSVI
from gpvi.inference.init import init_to_laplace, init_to_map
from gpvi.posteriors import GaussianPosterior, posterior_from_state_dict, psis
from gpvi.posteriors.mixture import GaussianMixture

from tests.conftest import TWO_BASIN_CENTERS as CENTERS, TWO_BASIN_SDS as SDS, TWO_BASIN_WEIGHTS as W, TwoBasins


class MultiStartDSVI(DSVI):
    """DSVI whose default start is every distinct MAP optimum (as for exact GP targets)."""

    def default_init(self, target):
        return init_to_laplace(init_to_map(5, seed=0, max_starts=3))


def _gauss(mean, sd):
    m = torch.as_tensor(mean, dtype=torch.float64)
    return GaussianPosterior(m, torch.diag(torch.as_tensor(sd, dtype=torch.float64)), ["a", "b"])


@pytest.fixture(scope="module")
def mix():
    return GaussianMixture([_gauss([-1.0, 0.5], [0.5, 1.0]), _gauss([2.0, -0.5], [1.5, 0.3])], torch.log(W))


def test_moments_density_and_quantiles_match_closed_forms(mix):
    w, m1, m2, s1, s2 = 0.3, np.array([-1.0, 0.5]), np.array([2.0, -0.5]), np.array([0.5, 1.0]), np.array([1.5, 0.3])
    mean = w * m1 + (1 - w) * m2
    var = w * (s1 ** 2 + m1 ** 2) + (1 - w) * (s2 ** 2 + m2 ** 2) - mean ** 2
    assert np.allclose(mix.mean.numpy(), mean, atol=1e-12)
    assert np.allclose(mix.std.numpy(), np.sqrt(var), atol=1e-12)
    assert np.allclose(torch.diagonal(mix.covariance).numpy(), var, atol=1e-12)
    x = np.array([[0.1, 0.2], [2.5, -0.4], [-1.0, 3.0]])
    dens = (w * scipy.stats.norm.pdf(x, m1, s1).prod(-1) + (1 - w) * scipy.stats.norm.pdf(x, m2, s2).prod(-1))
    assert np.allclose(mix.log_prob(torch.tensor(x)).numpy(), np.log(dens), atol=1e-10)
    assert mix.log_prob(torch.tensor(x[0])).shape == ()
    for p in (0.05, 0.5, 0.9):
        for j in range(2):
            cdf = lambda t: w * scipy.stats.norm.cdf(t, m1[j], s1[j]) + (1 - w) * scipy.stats.norm.cdf(t, m2[j], s2[j])
            exact = scipy.optimize.brentq(lambda t: cdf(t) - p, -20, 20, xtol=1e-12)
            assert float(mix.quantile(p)[j]) == pytest.approx(exact, abs=1e-8)


def test_draws_follow_the_mixture(mix):
    x = mix.sample(40_000, seed=3)
    assert x.shape == (40_000, 2) and x.dtype == torch.float64
    assert torch.allclose(x.mean(0), mix.mean, atol=4 * float(mix.std.max()) / 200)      # 4 se
    assert float((x[:, 0] < 0.5).double().mean()) == pytest.approx(
        0.3 * scipy.stats.norm.cdf(0.5, -1.0, 0.5) + 0.7 * scipy.stats.norm.cdf(0.5, 2.0, 1.5), abs=0.01)
    assert torch.equal(mix.sample(5, seed=1), mix.sample(5, seed=1))


def test_state_dict_round_trip_and_errors(mix):
    back = posterior_from_state_dict(mix.state_dict())
    assert isinstance(back, GaussianMixture)
    assert torch.allclose(back.weights, mix.weights) and torch.allclose(back.mean, mix.mean)
    with pytest.raises(ValueError, match="log_weights"):
        GaussianMixture(mix.components, [0.0])
    with pytest.raises(ValueError, match="components"):
        GaussianMixture([], [])
    with pytest.raises(TypeError, match="sample and log_prob"):
        GaussianMixture([object()], [0.0])


def test_basin_mass_of_a_two_basin_target_is_its_weights():
    target = TwoBasins()
    comps = [_gauss(CENTERS[k], SDS[k].expand(2)) for k in range(2)]
    mix = GaussianMixture(comps, [0.0, 0.0], target)                 # deliberately wrong weights: PSIS corrects
    w = psis(mix, target, 4000, seed=0)
    assert w.khat < 0.5
    assert torch.allclose(mix.basin_mass(w), W, atol=0.02)


def test_infer_sees_the_basin_the_best_gaussian_leaves_out():
    target = TwoBasins()
    engine = MultiStartDSVI(optimizer="natural", seed=0, progress_bar=False)
    post = gpvi.infer(target, seed=0, engine=engine, num_psis_draws=2000, progress_bar=False)
    rep = post.report
    q = rep.q
    assert torch.allclose(q.mean, CENTERS[1], atol=0.1)              # the best Gaussian: the heavier component
    assert rep.khat <= 0.5                                            # ... and PSIS of it alone sees nothing wrong
    assert len(rep.basin_mass) == 2 and rep.basin_mass[0] == pytest.approx(0.7, abs=0.03)
    assert rep.answer == "psis" and "basins" in rep.reason and rep.khat_mixture <= 0.7
    exact_mean = (W[:, None] * CENTERS).sum(0)
    exact_var = (W[:, None] * (SDS[:, None] ** 2 + CENTERS ** 2)).sum(0) - exact_mean ** 2
    assert torch.allclose(post.mean, exact_mean, atol=0.06)          # raw q is off by 0.9 in theta_a
    assert torch.allclose(post.std, exact_var.sqrt(), atol=0.06)
    assert re.search(r"2 basins holding (69|70|71)% / (29|30|31)%", str(rep))


def test_sk_from_every_map_optimum_finds_both_basins():
    """S&K run from each distinct MAP optimum (what ``gpvi.infer(engine="sk")`` does on GP targets): one Gaussian
    per basin, the best bound first, and PSIS of their mixture gives the basins' masses."""
    from gpvi.inference.dsvi.starts import run_starts
    from gpvi.inference.infer import starts_mixture
    from gpvi.inference.salimans_knowles import SKGaussian
    target = TwoBasins()
    start = init_to_laplace(init_to_map(5, seed=0, max_starts=3))(target)
    q = run_starts(SKGaussian(num_steps=250, method="gradient", num_draws=4, seed=0, progress_bar=False), target,
                   start)
    assert len(q.info["starts"]) >= 2 and not q.info["starts_agree"]
    assert torch.allclose(q.mean, CENTERS[1], atol=0.1)
    mix = starts_mixture(q, target)
    assert mix is not None
    w = psis(mix, target, 2000, seed=0)
    assert mix.basin_mass(w)[0] == pytest.approx(0.7, abs=0.03)


def test_infer_with_one_basin_is_unchanged():
    m = torch.tensor([1.0, -1.0], dtype=torch.float64)
    target = gpvi.Target(lambda th: -0.5 * ((th - m) ** 2).sum(-1), names=["a", "b"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        post = gpvi.infer(target, seed=0, engine=gpvi.DSVI(num_steps=2000, seed=0, progress_bar=False),
                          progress_bar=False)
    assert post.report.answer == "q" and post.report.basin_mass == []
    assert math.isnan(post.report.khat_mixture)


def test_pareto_smooth_with_a_tail_of_tied_ratios_keeps_the_raw_weights():
    from gpvi.posteriors.weighted import pareto_smooth
    lr = np.where(np.arange(1000) % 3 == 0, math.log(1.4), math.log(0.6))
    lw, khat = pareto_smooth(lr)
    assert np.isfinite(lw).all() and np.exp(lw).sum() == pytest.approx(1.0)
    assert np.allclose(np.exp(lw), np.exp(lr) / np.exp(lr).sum())


def test_a_mixture_warm_starts_nuts_with_its_moments():
    target = TwoBasins()
    comps = [_gauss(CENTERS[k], SDS[k].expand(2)) for k in range(2)]
    mix = GaussianMixture(comps, torch.log(W), target)
    assert torch.allclose(mix.scale_tril @ mix.scale_tril.T, mix.covariance, atol=1e-12)
    nuts = gpvi.NUTS(num_chains=2, num_warmup=20, num_draws=20, seed=0, progress_bar=False)
    state = nuts.init(target, nuts._start(target, mix), torch.Generator().manual_seed(0))
    assert torch.allclose(state.init_info["inverse_mass_matrix_init"], mix.covariance, atol=1e-12)
    assert state.init_info["mean"] == "mixture mean" and state.init_info["scale"] == "mixture covariance"


def test_sample_reusing_takes_pooled_draws_and_still_draws_the_mixture():
    """Component 0's first draws come from a pool (with their values), the rest are new: the counts follow the
    weights, the pooled values travel with their draws, and the pooled sample has the mixture's moments (mean 0.8
    within 4 standard errors, variance 0.6 * 0.25 + 0.4 * 1 + 0.6 * 0.4 * 2^2 = 1.51 within 5%)."""
    one = torch.eye(1, dtype=torch.float64)
    mix = GaussianMixture([GaussianPosterior(torch.tensor([0.0], dtype=torch.float64), 0.5 * one, ["a"]),
                           GaussianPosterior(torch.tensor([2.0], dtype=torch.float64), one, ["a"])],
                          [math.log(0.6), math.log(0.4)])
    g = torch.Generator().manual_seed(5)
    pool = 0.5 * torch.randn(3000, 1, generator=g, dtype=torch.float64)       # draws of component 0
    th, vals = mix.sample_reusing(20000, {0: (pool, 3.0 * pool[:, 0])}, seed=1)
    known = ~torch.isnan(vals)
    assert int(known.sum()) == 3000                    # component 0 gets ~12,000 draws: the whole pool is used
    assert torch.equal(vals[known], 3.0 * th[known, 0])
    mean, var = 0.6 * 0.0 + 0.4 * 2.0, 0.6 * 0.25 + 0.4 * 1.0 + 0.6 * 0.4 * 2.0 ** 2
    assert abs(float(th.mean()) - mean) < 4 * math.sqrt(var / 20000)
    assert abs(float(th.var()) - var) < 0.05 * var
    # a pool larger than the count: only as many as the count are taken
    th2, vals2 = mix.sample_reusing(100, {0: (pool, 3.0 * pool[:, 0])}, seed=1)
    assert 30 < int((~torch.isnan(vals2)).sum()) < 90 and th2.shape == (100, 1)
