"""S&K from several starts (:func:`gpvi.inference.dsvi.starts.run_starts` with an engine without a finish): a run
that joins the basin of an earlier start's q stops at a quarter of its steps; runs in other basins go on."""

from __future__ import annotations

import math

import torch

import gpvi
from gpvi.inference.dsvi.starts import run_starts
from gpvi.inference.init import Start

CENTERS = (torch.tensor([-3.0, 0.0], dtype=torch.float64), torch.tensor([3.0, 0.0], dtype=torch.float64))


def _two_bumps(th):                      # 0.7 N(c0, 0.5^2 I) + 0.3 N(c1, 0.5^2 I): two well-separated basins
    lp = [math.log(w) - 2.0 * ((th - c) ** 2).sum(-1) - 2 * math.log(0.5 * math.sqrt(2 * math.pi))
          for w, c in zip((0.7, 0.3), CENTERS)]
    return torch.logsumexp(torch.stack(lp, -1), -1)


def _engine():
    return gpvi.SKGaussian(num_steps=200, method="gradient", num_draws=4, draws="sobol", num_elbo_draws=200,
                           progress_bar=False, seed=0)


def test_a_start_in_the_basin_of_an_earlier_one_stops_merged_and_other_basins_run_to_the_end():
    target = gpvi.Target(_two_bumps, names=2)
    scale = 0.5 * torch.eye(2, dtype=torch.float64)
    near = Start(CENTERS[0] + torch.tensor([0.4, -0.3], dtype=torch.float64), scale, "given")
    other = Start(CENTERS[1].clone(), scale, "given")
    start = Start(CENTERS[0].clone(), scale, "given", alternatives=(near, other))
    q = run_starts(_engine(), target, start)
    recs = q.info["starts"]
    # the second start (0.8 sd from the first basin's centre) joins it: stopped at N/4 = 50 steps, no bound
    assert recs[1]["merged_into"] == 0 and recs[1]["steps"] == 50 and math.isnan(recs[1]["elbo"])
    assert q.start_posteriors[1] is None
    # the third (the other basin) runs its 200 steps and finds that basin: mean within 0.1 of its centre
    assert recs[2].get("merged_into") is None and recs[2]["steps"] == 200
    assert bool(((q.start_posteriors[2].mean - CENTERS[1]).abs() < 0.1).all())
    # the best bound is the heavier basin's, log 0.7 (within 4 se + 0.02 for N = 200)
    assert q.info["start_chosen"] == 0 and abs(recs[0]["elbo"] - math.log(0.7)) < 4 * recs[0]["elbo_se"] + 0.02
    assert q.info["starts_agree"] is False                      # log 0.3 against log 0.7: the bounds differ
    # the basin step of gpvi.infer mixes the two basins' Gaussians
    mix = gpvi.inference.infer.starts_mixture(q, target)
    assert mix is not None and len(mix.components) == 2
