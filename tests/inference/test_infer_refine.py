"""The check's refinement (gpvi.inference.check.refine): when the defensive proposal around the starts' mixture
fails its check on the batch MCSE alone, a proposal moment-matched to the weighted draws draws new draws, checked by
the same rule; a single q is never refined. Against targets whose moments are known exactly."""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

import gpvi
from gpvi.inference import check as ck
from gpvi.posteriors import GaussianPosterior
from gpvi.posteriors.mixture import GaussianMixture
from gpvi.posteriors.weighted import psis

M = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
NAMES = ["a", "b", "c"]


def _gauss(th):                                   # N(M, I): mean M, sd 1
    return -0.5 * ((th - M) ** 2).sum(-1)


def _two_basins(th):                              # 0.7 N(-3 e1, I) + 0.3 N(3 e1, I) in 2-D
    e = torch.tensor([3.0, 0.0], dtype=torch.float64)
    a = math.log(0.7) - 0.5 * ((th + e) ** 2).sum(-1)
    b = math.log(0.3) - 0.5 * ((th - e) ** 2).sum(-1)
    return torch.logaddexp(a, b)


def _chk(**kw):
    c = {"proposal": "q", "khat": 0.5, "threshold": 0.7, "ess": 900.0, "num_draws": 4000, "mcse_mean": 0.07,
         "mcse_sd": 0.03, "reliable": False}
    c.update(kw)
    return c


def test_only_a_near_miss_on_the_mcse_alone_is_refined():
    assert ck._refinable(_chk(), 400.0)
    assert ck._refinable(_chk(mcse_mean=0.02, mcse_sd=ck.REFINE_REACH * ck.MCSE_TOL), 400.0)
    assert not ck._refinable(_chk(reliable=True, mcse_mean=0.02), 400.0)              # nothing to refine
    assert not ck._refinable(_chk(khat=0.75), 400.0)                                  # k-hat fails
    assert not ck._refinable(_chk(khat=math.nan), 400.0)
    assert not ck._refinable(_chk(ess=300.0), 400.0)                                  # ESS fails
    assert not ck._refinable(_chk(mcse_mean=0.11), 400.0)                             # beyond reach


def test_the_refined_base_holds_the_weighted_moments_of_each_basin():
    """Two off, too narrow Gaussians with equal weights on a 0.7 / 0.3 mixture of unit Gaussians at -3 and 3:
    the refined components sit at the basins' means with unit sds, weighted 0.7 / 0.3; one Gaussian is moved to
    its weighted draws' mean and marginal sds, its correlations kept."""
    target = gpvi.Target(_two_basins, names=2)
    eye = torch.eye(2, dtype=torch.float64)
    comps = [GaussianPosterior(torch.tensor([s * 2.6, 0.3], dtype=torch.float64), 0.7 * eye, ["x", "y"], target)
             for s in (-1.0, 1.0)]
    base = GaussianMixture(comps, [0.0, 0.0], target)
    w = psis(ck.defensive_proposal(base, target), target, 4000, seed=0)
    r = ck.refined_base(base, w, target)
    assert isinstance(r, GaussianMixture) and len(r.components) == 2
    assert torch.allclose(r.weights, torch.tensor([0.7, 0.3], dtype=torch.float64), atol=0.05)
    for c, mu in zip(r.components, (-3.0, 3.0)):
        assert torch.allclose(c.mean, torch.tensor([mu, 0.0], dtype=torch.float64), atol=0.15)
        assert torch.allclose(c.std, torch.ones(2, dtype=torch.float64), atol=0.15)
    # one Gaussian: the weighted mean and marginal sds of all the draws (computed here directly), q's correlations
    L = torch.tensor([[0.8, 0.0, 0.0], [0.4, 0.7, 0.0], [-0.2, 0.1, 0.9]], dtype=torch.float64)
    g = GaussianPosterior(M + 0.4, L, NAMES, gpvi.Target(_gauss, names=NAMES))
    w = psis(ck.defensive_proposal(g, g.target), g.target, 1000, seed=1)
    one = ck.refined_base(g, w, g.target)
    wt, x = w.weights.numpy(), w.draws.numpy()
    mu = wt @ x
    sd = np.sqrt(wt @ (x - mu) ** 2)
    cov = (L @ L.T).numpy()
    corr = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    assert isinstance(one, GaussianPosterior)
    assert np.allclose(one.mean.numpy(), mu, atol=1e-10) and np.allclose(one.std.numpy(), sd, atol=1e-10)
    assert np.allclose(one.covariance.numpy(), corr * np.outer(sd, sd), atol=1e-10)


class _NoNUTS:
    def run(self, *a, **k):
        raise AssertionError("NUTS ran")


def test_a_near_miss_of_the_starts_mixture_is_refined_with_new_draws_and_answers_the_known_moments():
    """Two starts' Gaussians, 0.4 off the basins of 0.7 N(-3 e1, I) + 0.3 N(3 e1, I) and 0.7x too narrow, with equal
    bounds: several basins, so the mixture is the base; its first 400 check draws miss the MCSE target by at most
    2x (k-hat and ESS pass), the refined mixture's new draws pass, and the weighted answer is within 0.1 sd of the
    known moments (mean (-1.2, 0), sds (2.93, 1)) without NUTS."""
    target = gpvi.Target(_two_basins, names=["x", "y"])
    eye = torch.eye(2, dtype=torch.float64)
    q, other = (GaussianPosterior(torch.tensor([s * 2.6, 0.3], dtype=torch.float64), 0.7 * eye, ["x", "y"], target,
                                  elbo=0.0) for s in (-1.0, 1.0))
    q.start_posteriors = [q, other]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        post = gpvi.infer(target, seed=0, q=q, num_psis_draws=100, min_ess=50, nuts=_NoNUTS(), progress_bar=False)
    r = post.report
    first = r.check["first"]
    assert r.check["proposal"] == "mixture" and len(r.basin_mass) == 2
    assert r.check["refined"] >= 1 and first["num_draws"] == 400 and first["khat"] <= 0.7
    assert ck.MCSE_TOL < max(first["mcse_mean"], first["mcse_sd"]) <= ck.REFINE_REACH * ck.MCSE_TOL
    assert r.check["reliable"] and r.answer == "psis" and r.trusted and "refined" in r.reason
    assert post.draws.shape[0] == r.check["num_draws"] == 400 * r.check["refined"]
    assert "first check (mixture proposal, 400 draws)" in str(r) and "check (refined mixture proposal" in str(r)
    sd = torch.tensor([math.sqrt(1 + 9 - 1.2 ** 2), 1.0], dtype=torch.float64)
    assert float(((post.mean - torch.tensor([-1.2, 0.0], dtype=torch.float64)) / sd).abs().max()) < 0.1
    assert float((post.std / sd - 1).abs().max()) < 0.1


def test_a_single_q_is_not_refined():
    """q off by 0.5 and 0.8x too narrow on N(M, I) (a near miss that the refinement used to take): the answer is
    the first check's verdict, weighted draws or NUTS, never a refined proposal's."""
    target = gpvi.Target(_gauss, names=NAMES)
    q = GaussianPosterior(M + 0.5, 0.8 * torch.eye(3, dtype=torch.float64), NAMES, target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w, _, wb, _, _, several, chk = ck.diagnose(q, target, 0, 100, 50.0)
    assert not several and "first" not in chk and "refined" not in chk and chk["num_draws"] == 400


def test_refine_stops_when_the_tolerance_is_out_of_reach_and_keeps_the_first_check():
    """A refined check that fails on k-hat (here: a target far heavier-tailed than any Gaussian) ends the rounds
    at once; the returned check is the refined one, with the first one kept."""
    target = gpvi.Target(lambda th: -2.0 * torch.log1p(th ** 2).sum(-1), names=NAMES)    # Cauchy-like, heavy
    q = GaussianPosterior(torch.zeros(3, dtype=torch.float64), 0.5 * torch.eye(3, dtype=torch.float64), NAMES, target)
    gen = torch.Generator().manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = psis(ck.defensive_proposal(q, target), target, 400, generator=gen)
        first = ck.check_weighted(w, "q", 50.0)
        wr, out = ck.refine(q, w, target, _chk(**{k: first[k] for k in ("khat", "ess", "num_draws")},
                                                 mcse_mean=0.09), 50.0, gen)
    assert out["first"]["num_draws"] == 400 and 1 <= out["refined"] <= ck.REFINE_ROUNDS
    assert wr.draws.shape[0] == 400 * out["refined"] and not torch.equal(wr.draws[:400], w.draws)
    if not out["reliable"]:
        assert out["refined"] < ck.REFINE_ROUNDS or not ck._refinable(out, 50.0)
