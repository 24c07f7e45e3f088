"""The best Gaussian by default (issue 17, item 1): distinct MAP optima as starts, one DSVI run from each, the
best bound kept, and the finish that brings the returned q within 0.01 nats of the bound's optimum.

Independent answers:

* a two-component Gaussian mixture with well separated components: the best Gaussian fitted to component k has
  the bound :math:`\\log w_k` up to the other component's negligible tail (``log Z = 0``), so the run from the
  heavier component wins even though the MAP sits on the lighter, narrower one;
* a correlated Gaussian target: the shortfall of q's bound below the optimum is exactly KL(q || p), in closed form.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import gpvi
from gpvi.inference.dsvi import Convergence
from gpvi.inference.dsvi.convergence import average_gap
from gpvi.inference.dsvi.engine import DSVI
from gpvi.inference.init import Start, init_to_laplace, init_to_map
from gpvi.inference.ml2 import distinct_optima

from tests.conftest import TWO_BASIN_CENTERS as CENTERS, TWO_BASIN_SDS as SDS, TwoBasins as Mixture


def exact_bound(target, q, n: int = 20_000, seed: int = 1) -> float:
    """mean(log g - log q) over n draws of q (no DSVI code): log g - log q is nearly constant here."""
    eps = torch.randn(n, 2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    L = q.scale_tril
    lq = -0.5 * (eps ** 2).sum(-1) - torch.log(torch.diagonal(L)).sum() - math.log(2 * math.pi)
    return float((target.log_joint(q.mean + eps @ L.T) - lq).mean())


@pytest.fixture(scope="module")
def mixture_fit():
    target = Mixture()
    start = init_to_laplace(init_to_map(5, seed=0, max_starts=3))(target)
    q = DSVI(optimizer="natural", seed=0, progress_bar=False).run(target, init=start)
    return target, start, q


def test_distinct_optima_are_grouped_by_theta():
    recs = [{"theta": torch.tensor([0.0, 1.0]), "value": -1.0, "restart": 0, "converged": True},
            {"theta": torch.tensor([0.09, 1.0]), "value": -1.0 + 1e-9, "restart": 1, "converged": True},
            {"theta": torch.tensor([0.0, 1.2]), "value": -0.5, "restart": 2, "converged": True},
            {"theta": torch.tensor([float("nan"), 1.0]), "value": -0.1, "restart": 3, "converged": False}]
    out = distinct_optima(recs, 0.1, lambda g: max(g, key=lambda r: r["value"]))
    assert [o["restarts"] for o in out] == [[2], [0, 1]]              # best first; NaN end point left out
    assert out[1]["restart"] == 1                                    # the group's best member represents it
    assert [o["restarts"] for o in distinct_optima(recs, 0.25, lambda g: g[0])] == [[0, 1, 2]]


def test_map_restarts_find_both_components_with_laplace_scales(mixture_fit):
    _, start, _ = mixture_fit
    assert len(start.info["optima"]) == 2 and start.alternatives
    assert torch.allclose(start.theta, CENTERS[0], atol=1e-4)         # the MAP: the narrow, lighter component
    alt = start.alternatives[0]
    assert torch.allclose(alt.theta, CENTERS[1], atol=1e-4)
    # Laplace scales at each optimum: the component's own sd (the other's tail is negligible there)
    assert torch.allclose(torch.diagonal(start.scale_tril), SDS[0].expand(2), rtol=1e-3)
    assert torch.allclose(torch.diagonal(alt.scale_tril), SDS[1].expand(2), rtol=1e-3)
    # Laplace log evidence = log w_k for a Gaussian component
    assert start.info["laplace_log_evidence"] == pytest.approx(math.log(0.3), abs=1e-3)
    assert alt.info["laplace_log_evidence"] == pytest.approx(math.log(0.7), abs=1e-3)
    # one start only: no alternatives
    assert init_to_map(5, seed=0)(Mixture()).alternatives == ()


def test_dsvi_keeps_the_start_with_the_best_bound(mixture_fit):
    target, _, q = mixture_fit
    recs = q.info["starts"]
    assert len(recs) == 2 and q.info["start_chosen"] == 1 and not q.info["starts_agree"]
    assert torch.allclose(q.mean, CENTERS[1], atol=0.1)               # the heavier component, not the MAP's
    # each run's bound is its component's log weight: Monte Carlo se ~0.03 (1000 draws), 4 se
    assert [r["finished"] for r in recs] == [False, True]            # the lighter one stopped at its plateau
    for r, w in zip(recs, (0.3, 0.7)):
        assert r["elbo"] == pytest.approx(math.log(w), abs=4 * r["elbo_se"] + 0.01)
        assert r["converged"] and not r["interrupted"] and r["failed"] is None
    # the returned q's own bound, by an independent 20000-draw estimate (se < 0.005): log 0.7 - at most 0.02
    assert exact_bound(target, q) == pytest.approx(math.log(0.7), abs=0.02)
    assert q.info["starts_time_s"] >= q.info["time_s"]


def test_interrupt_during_a_later_start_keeps_the_finished_run(mixture_fit):
    target, start, full = mixture_fit
    seen = {"t": 0, "runs": 0}

    def stop_in_second_run(state, info):
        if state.t < seen["t"]:
            seen["runs"] += 1
        seen["t"] = state.t
        if seen["runs"] == 1 and state.t == 50:
            raise KeyboardInterrupt

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = DSVI(optimizer="natural", seed=0, progress_bar=False).run(target, init=start, callback=stop_in_second_run)
    assert q.info["interrupted"] and q.info["start_chosen"] == 0
    assert [r["interrupted"] for r in q.info["starts"]] == [False, True]
    assert torch.allclose(q.mean, CENTERS[0], atol=0.05)
    # the run from the first start is exactly what the uninterrupted fit ran from it
    assert q.info["starts"][0]["elbo"] == full.info["starts"][0]["elbo"]


def test_a_start_without_alternatives_makes_one_run():
    target = Mixture()
    one = Start(CENTERS[1].clone())
    q = DSVI(optimizer="natural", seed=0, progress_bar=False).run(target, init=one)
    assert len(q.info["starts"]) == 1 and q.info["starts_agree"] and q.info["start_chosen"] == 0


# ------------------------------------------------------------------------------------------ the finish
def _gaussian(D: int = 8):
    g = torch.Generator().manual_seed(0)
    A = torch.randn(D, D, generator=g, dtype=torch.float64)
    Sigma = A @ A.T / D + 0.2 * torch.eye(D, dtype=torch.float64)
    m = torch.randn(D, generator=g, dtype=torch.float64)
    P = torch.linalg.inv(Sigma)
    target = gpvi.Target(lambda th: -0.5 * (((th - m) @ P) * (th - m)).sum(-1), names=D)

    def kl(q):
        S, d = q.covariance, m - q.mean
        return 0.5 * float(torch.trace(P @ S) + d @ P @ d - D + torch.logdet(Sigma) - torch.logdet(S))
    return target, kl


def test_the_finish_brings_the_bound_within_its_tolerance_of_the_optimum():
    """Natural DSVI on a correlated Gaussian (D = 8): the exact shortfall KL(q || p) of the returned q.

    Measured over 8 seeds: 0.015-0.026 nats when the run stops at the plateau (gap_tol=None), 0.006-0.011 with
    the finish at gap_tol = 0.01. Allowed here: 0.015 for the finish (the estimate's own error), and the finish
    must beat the plateau stop on the same seed.
    """
    target, kl = _gaussian()
    kw = dict(optimizer="natural", seed=3, progress_bar=False, init_scale=0.3, num_elbo_draws=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        old = DSVI(convergence=Convergence(gap_tol=None), **kw).run(target, init=torch.zeros(8))
        new = DSVI(**kw).run(target, init=torch.zeros(8))
    assert new.info["converged"] and new.info["convergence"]["gap"] <= 0.01
    assert new.info["returned"].startswith("average of the last") and "plateau" in new.info["returned"]
    assert kl(new) < 0.015
    assert kl(new) < kl(old)
    assert new.info["steps"] > old.info["steps"]


def test_average_gap_is_the_curvature_weighted_batch_variance():
    C = torch.tensor([[2.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    mu = torch.zeros(2, dtype=torch.float64)
    d = torch.tensor([0.2, -0.1], dtype=torch.float64)
    A = torch.tensor([[0.1, 0.0], [0.3, -0.2]], dtype=torch.float64)
    b = [{"n": 100, "mu": mu + s * C @ d, "C": C + s * C @ A} for s in (1.0, -1.0)]
    per = 0.5 * float(d @ d) + 0.5 * 0.3 ** 2 + (0.1 ** 2 + 0.2 ** 2)          # in q's own coordinates
    assert average_gap(b, diag=False) == pytest.approx(2 * per / 2)
    assert math.isnan(average_gap(b[:1], diag=False))


@pytest.mark.parametrize("kw, match", [({"gap_tol": 0}, "gap_tol"), ({"min_batches": 1}, "min_batches"),
                                       ({"gap_tol": "x"}, "gap_tol")])
def test_bad_finish_settings_name_the_argument(kw, match):
    with pytest.raises((TypeError, ValueError), match=match):
        Convergence(**kw)
