"""The check's defensive proposal (gpvi.inference.check.defensive_proposal): its coordinate components have the
stated moments, and a heavy one-sided tail in one parameter, which a proposal of scaled copies of q never samples, is
not answered by the weighted draws."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import gpvi
from gpvi.inference import check as ck
from gpvi.posteriors import GaussianPosterior
from gpvi.posteriors.weighted import psis

D, TAIL_MASS, TAIL_LOC, TAIL_SD = 8, 0.03, -5.0, 1.5
NAMES = [f"t{i}" for i in range(D)]


def _one_sided_tail(th):
    """theta_0 ~ 0.97 N(0, 1) + 0.03 N(-5, 1.5^2), the others N(0, 1): a tail holding 3% of the mass 5 sds out."""
    a = math.log(1 - TAIL_MASS) - 0.5 * th[..., 0] ** 2
    b = math.log(TAIL_MASS) - 0.5 * ((th[..., 0] - TAIL_LOC) / TAIL_SD) ** 2 - math.log(TAIL_SD)
    return torch.logaddexp(a, b) - 0.5 * (th[..., 1:] ** 2).sum(-1)


def test_each_coordinate_component_is_wide_in_its_coordinate_alone():
    """Component j: sd COORD_SCALE x the base's in theta_j, the base's regression of the others on theta_j and the
    base's conditional covariance given theta_j; weights (1 - beta) alpha_k and beta / D."""
    g = torch.Generator().manual_seed(0)
    A = torch.randn(4, 4, generator=g, dtype=torch.float64)
    S0 = A @ A.T + 4 * torch.eye(4, dtype=torch.float64)
    mu = torch.randn(4, generator=g, dtype=torch.float64)
    base = GaussianPosterior(mu, torch.linalg.cholesky(S0), list("abcd"))
    prop = ck.defensive_proposal(base, None)
    scaled = len(ck.CHECK_SCALES)
    assert len(prop.components) == scaled + 4
    assert len(ck.defensive_proposal(base, None, coord_weight=0.0).components) == scaled
    for bad in ({"coord_weight": 1.0}, {"coord_weight": -0.1}, {"coord_scale": 0.5}, {"coord_scale": math.nan}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ck.defensive_proposal(base, None, **bad)
    expect = [(1 - ck.COORD_WEIGHT) * a for _, a in ck.CHECK_SCALES] + [ck.COORD_WEIGHT / 4] * 4
    assert torch.allclose(prop.weights, torch.tensor(expect, dtype=torch.float64), atol=1e-12)
    for k, (s, _) in enumerate(ck.CHECK_SCALES):
        assert torch.allclose(prop.components[k].covariance, s ** 2 * S0, atol=1e-9)
    for j in range(4):
        Sj = prop.components[scaled + j].covariance
        assert torch.allclose(prop.components[scaled + j].mean, mu)
        assert math.isclose(float(Sj[j, j]), ck.COORD_SCALE ** 2 * float(S0[j, j]), rel_tol=1e-9)
        assert torch.allclose(Sj[:, j] / Sj[j, j], S0[:, j] / S0[j, j], atol=1e-9)
        cond = lambda S: S - torch.outer(S[:, j], S[j, :]) / S[j, j]   # noqa: E731
        assert torch.allclose(cond(Sj), cond(S0), atol=1e-9)


def test_a_heavy_one_sided_tail_is_not_answered_by_the_weighted_draws():
    """q = N(0, I) on a target whose theta_0 holds 3% of its mass about 5 sds out (true sd 1.33). A proposal of
    scaled copies of q alone accepts weighted draws with sd 1.03 at most seeds (the counterfactual, asserted so that
    the test can tell the two apart); the defensive proposal's check fails at every seed, or, if it passes, its answer
    is right."""
    target = gpvi.Target(_one_sided_tail, names=NAMES)
    true_sd = math.sqrt((1 - TAIL_MASS) + TAIL_MASS * (TAIL_SD ** 2 + TAIL_LOC ** 2) - (TAIL_MASS * TAIL_LOC) ** 2)
    eye = torch.eye(D, dtype=torch.float64)
    q = GaussianPosterior(torch.zeros(D, dtype=torch.float64), eye, NAMES, target)
    scaled_only = ck.defensive_proposal(q, target, coord_weight=0.0)
    wrong_before = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in range(5):
            w_old = psis(scaled_only, target, 4000, generator=torch.Generator().manual_seed(seed))
            if ck.check_weighted(w_old, "q", 400.0)["reliable"] and float(w_old.std[0]) < 0.8 * true_sd:
                wrong_before += 1
            w = psis(ck.defensive_proposal(q, target), target, 4000, generator=torch.Generator().manual_seed(seed))
            chk = ck.check_weighted(w, "q", 400.0)
            assert not chk["reliable"] or 0.8 <= float(w.std[0]) / true_sd <= 1.25, (seed, chk, float(w.std[0]))
    assert wrong_before >= 3


def test_a_passed_check_needs_the_second_opinion_of_the_scaled_copies(monkeypatch):
    """The wiring of the second opinion: the check with the coordinate components passes, the scaled copies' alone
    fails, so the answer is NUTS and the report says why; when both pass the weighted answer is the first's."""
    target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=["a", "b"])
    q = GaussianPosterior(torch.zeros(2, dtype=torch.float64), torch.eye(2, dtype=torch.float64), ["a", "b"], target)
    seen: list[float] = []
    real_proposal, real_check = ck.defensive_proposal, ck.check_weighted

    def proposal(base, tgt, *, coord_weight=ck.COORD_WEIGHT, **kw):
        seen.append(coord_weight)
        return real_proposal(base, tgt, coord_weight=coord_weight, **kw)

    def check(w, proposal_name, min_ess, num_batches=ck.CHECK_BATCHES):
        return dict(real_check(w, proposal_name, min_ess, num_batches), reliable=seen[-1] > 0 or passes_second)

    monkeypatch.setattr(ck, "defensive_proposal", proposal)
    monkeypatch.setattr(ck, "check_weighted", check)
    for passes_second in (False, True):
        seen.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            w, _, wb, _, _, _, chk = ck.diagnose(q, target, 0, 100, 50.0)
        assert seen == [ck.COORD_WEIGHT, 0.0]
        assert chk["second"]["reliable"] is passes_second and chk["reliable"] is passes_second
        assert chk["second"]["num_draws"] == 400 == wb.draws.shape[0]
    answer, reason = gpvi.inference.infer._choose(0.3, dict(chk, reliable=False, second=dict(chk["second"],
                                                                                            reliable=False)))
    assert answer == "nuts" and "second opinion" in reason
