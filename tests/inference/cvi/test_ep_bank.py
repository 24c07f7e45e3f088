"""EP's starts from earlier evaluations (gpvi.inference.cvi.ep_starts.SiteBank, EPEvidenceTarget.start_from_neighbours;
issue 59): the plane through the neighbours against sites that are affine in theta, and the evidence from a bank's
start against EP run to a tight tolerance from the fixed start (an independent answer), in fewer sweeps."""

from __future__ import annotations

import math

import pytest
import torch

import gpvi
from gpvi.inference.cvi import ep_evidence
from gpvi.inference.cvi.bound import CVIBoundTarget
from gpvi.inference.cvi.ep_evidence import EPEvidenceTarget
from gpvi.inference.cvi.ep_starts import SiteBank

F64 = torch.float64


def test_the_bank_predicts_sites_that_are_affine_in_theta_exactly_and_keeps_the_last_entries():
    g = torch.Generator().manual_seed(0)
    D, N = 3, 7
    J, a = torch.randn(2 * N, D, generator=g, dtype=F64), torch.rand(2 * N, generator=g, dtype=F64) + 1.0
    sites = lambda th: (th @ J.T + a)                                      # noqa: E731
    bank = SiteBank(size=20)
    with pytest.raises(ValueError, match="empty"):
        bank.starts(torch.zeros(1, D, dtype=F64))
    th = 0.3 * torch.randn(25, D, generator=g, dtype=F64)
    # fewer entries than the plane needs: the nearest entry's sites
    bank.add(th[:3], sites(th[:3])[:, :N], sites(th[:3])[:, N:], torch.ones(3, dtype=torch.bool))
    new = th[:3] + 1e-3
    tau, nu = bank.starts(new)
    torch.testing.assert_close(tau, sites(th[:3])[:, :N])
    keep = torch.ones(22, dtype=torch.bool)
    keep[5] = False                                                        # a row that is not stored
    bank.add(th[3:], sites(th[3:])[:, :N], sites(th[3:])[:, N:], keep)
    assert len(bank) == 20 and bank.count == 24
    stored = {tuple(r) for r in bank.theta.tolist()}
    assert tuple(th[8].tolist()) not in stored and tuple(th[-1].tolist()) in stored   # the oldest went
    assert tuple(th[3 + 5].tolist()) not in stored
    query = 0.2 * torch.randn(4, D, generator=g, dtype=F64)
    tau, nu = bank.starts(query)
    torch.testing.assert_close(torch.cat([tau, nu], 1), sites(query), rtol=1e-10, atol=1e-10)


def test_the_bank_predicts_sites_that_are_quadratic_in_theta_exactly_once_it_holds_enough_entries():
    """Once the bank holds twice the coefficients of a full quadratic (2 x 10 at D = 3) it fits one; below
    that the plane (exact for affine sites, not for these)."""
    from gpvi.inference.cvi import ep_starts

    g = torch.Generator().manual_seed(3)
    D, N = 3, 5
    J, a = torch.randn(2 * N, D, generator=g, dtype=F64), torch.rand(2 * N, generator=g, dtype=F64) + 1.0
    Q = torch.randn(2 * N, D, D, generator=g, dtype=F64)
    sites = lambda th: th @ J.T + a + 0.5 * torch.einsum("sd,kde,se->sk", th, Q, th)     # noqa: E731
    th = 0.3 * torch.randn(30, D, generator=g, dtype=F64)
    query = 0.2 * torch.randn(4, D, generator=g, dtype=F64)
    bank = SiteBank(size=64)
    bank.add(th[:15], sites(th[:15])[:, :N], sites(th[:15])[:, N:], torch.ones(15, dtype=torch.bool))
    tau, nu = bank.starts(query)                                           # 15 < 20 entries: the plane
    assert float((torch.cat([tau, nu], 1) - sites(query)).abs().max()) > 1e-4
    bank.add(th[15:], sites(th[15:])[:, :N], sites(th[15:])[:, N:], torch.ones(15, dtype=torch.bool))
    tau, nu = bank.starts(query)
    torch.testing.assert_close(torch.cat([tau, nu], 1), sites(query), rtol=1e-9, atol=1e-9)
    assert ep_starts.QUADRATIC_MAX_DIM >= D


def _model(n: int = 60, seed: int = 2) -> gpvi.GPClassification:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=F64) * 4 - 2
    y = (torch.rand(n, generator=g, dtype=F64) < torch.sigmoid(4 * X[:, 0] * X[:, 1])).to(F64)
    return gpvi.GPClassification(X, y)


@pytest.mark.parametrize("undamped_sweeps", [10, 1])
def test_evidence_from_the_bank_matches_tight_ep_in_fewer_sweeps(monkeypatch, undamped_sweeps):
    """A sequence of draws around a point, as an engine makes: from the bank's starts the evidence and its gradient
    stay within EP's tolerance of EP at 1e-10 from the fixed start, and take fewer sweeps than from the fixed start
    (1e-3 both). With one undamped sweep allowed, every row goes on damped (the fallback) to the same answers."""
    monkeypatch.setattr(ep_evidence, "BANK_SWEEPS", undamped_sweeps)
    model = _model()
    bound = CVIBoundTarget(model)
    centre = bound.initial_theta()
    g = torch.Generator().manual_seed(1)
    draws = centre + 0.5 * torch.randn(40, 3, generator=g, dtype=F64)
    fixed, banked, tight = (EPEvidenceTarget(bound, tol=t) for t in (1e-3, 1e-3, 1e-10))
    banked.start_from_neighbours(64)
    for t in (fixed, banked, tight):
        t.warm_from(centre)
    for i in range(0, 40, 4):
        rows = draws[i:i + 4]
        out = []
        for t in (fixed, banked, tight):
            th = rows.clone().requires_grad_(True)
            lj = t.log_joint(th)
            (grad,) = torch.autograd.grad(lj.sum(), th)
            out.append((lj.detach(), grad))
        (lj_b, g_b), (lj_t, g_t) = out[1], out[2]
        assert float((lj_b - lj_t).abs().max()) < 2e-3, i
        assert float(((g_b - g_t).abs() / (1.0 + g_t.abs())).max()) < 2e-2, i
    assert banked.counters["bank_starts"] == 36 and banked.counters["failures"] == 0
    assert banked.counters["unconverged"] == 0
    if undamped_sweeps == 10:
        assert banked.counters["sweeps"] < 0.85 * fixed.counters["sweeps"], (banked.counters, fixed.counters)
    else:                          # a few rows start within the tolerance (the quadratic's starts): one sweep
        assert 30 <= banked.counters["bank_redone"] <= 36
    # the value path uses the bank too, with the same values as tight EP within the tolerance
    with torch.no_grad():
        v = banked.log_joint(draws[:5] + 0.01)
        ref = tight.log_joint(draws[:5] + 0.01)
    assert float((v - ref).abs().max()) < 2e-3
    # back to the fixed start
    banked.start_from_neighbours(0)
    assert banked.bank is None and math.isfinite(float(banked.log_joint(draws[0])))


def test_fully_bayesian_cvi_starts_its_engines_evaluations_from_the_bank_by_default():
    """The default fit's engine evaluations start from the bank (``ep_bank=512``), the EP MAP search and the Laplace
    scale do not (their evaluations stay a function of theta); ``ep_bank=0`` starts none from it. The two fits' q
    agree within EP's tolerance."""
    from gpvi.inference.cvi.bayes import FullyBayesianCVI
    from gpvi.inference.salimans_knowles import SKGaussian

    model = _model(40)
    fits = {}
    for bank in (512, 0):
        engine = SKGaussian(num_steps=24, method="gradient", num_draws=4, draws="sobol", num_elbo_draws=8,
                            progress_bar=False)
        fits[bank] = FullyBayesianCVI(engine, ep_bank=bank, num_draws=4).run(model)
    c = fits[512].info["ep_counters"]
    assert c["bank_starts"] == 24 * 4 + 8 and "bank_starts" not in fits[0].info["ep_counters"]   # after its start check
    assert fits[512].info["ep_map_theta"] == fits[0].info["ep_map_theta"]
    assert float(((fits[512].mean - fits[0].mean) / fits[0].std).abs().max()) < 0.05
    assert c["sweeps"] < fits[0].info["ep_counters"]["sweeps"]
    with pytest.raises(ValueError, match="ep_bank"):
        FullyBayesianCVI(ep_bank=-1)


def test_multiclass_evidence_from_the_nearest_earlier_sites_matches_tight_ep_in_fewer_sweeps():
    """Multi-class EP with a bank starts each evaluation from the nearest earlier evaluation's sites (a plane of site
    precisions need not be positive semi-definite): the evidence within EP's tolerance of EP at 1e-9 from the fixed
    start, in fewer sweeps than from the fixed start."""
    from gpvi.models.multiclass import GPMulticlass

    g = torch.Generator().manual_seed(4)
    X = torch.rand(30, 2, generator=g, dtype=F64) * 4 - 2
    y = (X[:, 0] > -0.5).long() + (X[:, 1] > 0.5).long()
    bound = CVIBoundTarget(GPMulticlass(X, y))
    centre = bound.initial_theta()
    draws = centre + 0.3 * torch.randn(40, bound.dim, generator=g, dtype=F64)
    fixed, banked, tight = (EPEvidenceTarget(bound, tol=t) for t in (1e-3, 1e-3, 1e-9))
    banked.start_from_neighbours(64)
    assert banked.bank.neighbours is not None and banked.bank.neighbours > 10 ** 6     # nearest only
    for i in range(0, 40, 4):
        with torch.no_grad():
            vals = [t.log_joint(draws[i:i + 4]) for t in (fixed, banked, tight)]
        assert float((vals[1] - vals[2]).abs().max()) < 2e-3, i
    assert banked.counters["bank_starts"] == 36 and banked.counters["failures"] == 0
    assert banked.counters["sweeps"] < fixed.counters["sweeps"], (banked.counters, fixed.counters)   # 122 vs 131


def test_the_predictives_looser_cvi_tolerance_keeps_the_probabilities_of_tight_runs():
    """A binary model's predictive CVI runs stop at 1e-4 (BINARY_PREDICTIVE_INNER_TOL; multi-class 1e-6,
    PREDICTIVE_INNER_TOL): its probabilities against the same draws' posteriors converged to 1e-12 (an independent,
    tighter answer) within 1e-3, in fewer inner steps."""
    from gpvi.inference.cvi.bayes import BINARY_PREDICTIVE_INNER_TOL, PREDICTIVE_INNER_TOL, FullyBayesianCVI
    from gpvi.inference.salimans_knowles import SKGaussian
    from gpvi.posteriors.bayes_classification import BayesClassificationPosterior

    assert PREDICTIVE_INNER_TOL == 1e-6 and BINARY_PREDICTIVE_INNER_TOL == 1e-4
    model = _model(50)
    engine = SKGaussian(num_steps=24, method="gradient", num_draws=4, draws="sobol", num_elbo_draws=8,
                        progress_bar=False)
    post = FullyBayesianCVI(engine, num_draws=8).run(model)
    bound = post.target.bound
    assert bound.inner_tol == 1e-9 and post.target.bank is None and post.target.value_tol is None   # reset
    X = torch.linspace(-2, 2, 41, dtype=F64)
    Xt = torch.stack([X, X.flip(0)], 1)
    bound.inner_tol = 1e-4                       # the predictive's tolerance: the same posteriors again
    again = BayesClassificationPosterior(post.q, post.target, num_draws=8, seed=post.info["seed"])
    assert torch.equal(again.predict_proba(Xt), post.predict_proba(Xt))
    bound.inner_tol = 1e-12
    steps0 = bound.counters["inner_steps"]
    tight = BayesClassificationPosterior(post.q, post.target, num_draws=8, seed=post.info["seed"])
    assert torch.equal(tight.draws, post.draws)
    assert bound.counters["inner_steps"] - steps0 > post.info["predictive_inner_steps"]
    gap = float((tight.predict_proba(Xt) - post.predict_proba(Xt)).abs().max())
    assert 0 < gap < 1e-3, gap


def test_the_intercept_weights_by_qr_are_pinvs_row_and_a_rank_deficient_fit_falls_back_to_pinv():
    """``intercept_weights`` (QR and one triangular solve) against the pseudo-inverse's first row it replaces
    (issue 59's fifth pass): the quadratic's weighted design at D = 3 and 9 within 1e-12 relative; a design with
    two equal columns (rank deficient) takes pinv's row, a finite minimum-norm answer, and a batch mixing both kinds
    keeps the full-rank rows' QR answers."""
    from gpvi.inference.cvi.ep_starts import intercept_weights

    g = torch.Generator().manual_seed(5)
    for D in (3, 9):
        p = 1 + D + D * (D + 1) // 2
        dx = 0.3 * torch.randn(4, 2 * p, D, generator=g, dtype=F64)
        w = 1.0 / (dx.norm(dim=-1) + 1e-3)
        iu = torch.triu_indices(D, D)
        X = torch.cat([torch.ones(4, 2 * p, 1, dtype=F64), dx,
                       (dx.unsqueeze(-1) * dx.unsqueeze(-2))[..., iu[0], iu[1]]], -1) * w.unsqueeze(-1)
        ref = torch.linalg.pinv(X)[:, 0, :]
        u = intercept_weights(X)
        assert float((u - ref).abs().max() / ref.abs().max()) < 1e-12, D
        # the fit reproduces an exact quadratic's intercept: u . (X beta) / w = beta_0
        beta = torch.randn(p, generator=g, dtype=F64)
        torch.testing.assert_close((u * (X @ beta)).sum(-1), beta[0].expand(4), rtol=1e-10, atol=1e-10)
    bad = X.clone()
    bad[1, :, 2] = bad[1, :, 1]                                    # row 1: two equal columns
    u = intercept_weights(bad)
    assert bool(torch.isfinite(u).all())
    torch.testing.assert_close(u[1], torch.linalg.pinv(bad[1])[0], rtol=0, atol=0)
    torch.testing.assert_close(u[[0, 2, 3]], intercept_weights(X[[0, 2, 3]]), rtol=0, atol=0)
