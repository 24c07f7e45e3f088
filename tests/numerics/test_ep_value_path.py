"""Binary EP without its gradient (``gradient=False``), the evidence target's value-only path and its chunks of rows
(issue 59): the same evidence as the gradient path, row by row and batched; failed rows stay ``-inf`` with a zero
gradient."""

from __future__ import annotations

import math

import pytest
import torch

import gpvi
from gpvi.inference.cvi import ep_evidence
from gpvi.inference.cvi.bound import CVIBoundTarget
from gpvi.inference.cvi.ep_evidence import EPEvidenceTarget
from gpvi.models.likelihoods import BernoulliLogit
from gpvi.numerics.ep import expectation_propagation

F64 = torch.float64


def _model(n: int, seed: int = 3) -> gpvi.GPClassification:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=F64) * 4 - 2
    y = (torch.rand(n, generator=g, dtype=F64) < torch.sigmoid(3 * torch.sin(2 * X[:, 0]) * X[:, 1])).to(F64)
    return gpvi.GPClassification(X, y)


def test_ep_without_the_gradient_gives_the_same_evidence_and_sites():
    model = _model(40)
    target = EPEvidenceTarget(CVIBoundTarget(model))
    theta = torch.tensor([[0.0, 0.0, 0.0], [1.0, -0.5, 2.0], [-1.0, 0.5, 3.5]], dtype=F64)
    K = target.bound._kernel(theta).detach()
    for tol, sweeps in ((1e-10, 500), (1e-10, 2)):               # converged rows, and rows stopped by the cap
        full = expectation_propagation(K, model.y, BernoulliLogit(), tol=tol, max_sweeps=sweeps, anderson=5)
        value = expectation_propagation(K, model.y, BernoulliLogit(), tol=tol, max_sweeps=sweeps, anderson=5,
                                        gradient=False)
        assert value.grad_k is None and full.grad_k.shape == (3, 40, 40)
        assert torch.equal(value.sweeps, full.sweeps) and torch.equal(value.converged, full.converged)
        for name in ("log_z", "tau", "nu", "mean", "var"):
            torch.testing.assert_close(getattr(value, name), getattr(full, name), rtol=1e-13, atol=1e-13)


def test_a_failed_row_is_minus_infinity_with_a_zero_gradient_and_the_others_are_unchanged():
    model = _model(30)
    target = EPEvidenceTarget(CVIBoundTarget(model))
    theta = torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.5, 1.0]], dtype=F64)
    K = target.bound._kernel(theta).detach()
    bad = K.clone()
    bad[1, 3, 3] = math.nan
    ref = expectation_propagation(K, model.y, BernoulliLogit(), tol=1e-8)
    for gradient in (True, False):
        res = expectation_propagation(bad, model.y, BernoulliLogit(), tol=1e-8, gradient=gradient)
        assert res.log_z[1] == -math.inf and not bool(res.ok[1])
        assert float(res.log_z[0]) == pytest.approx(float(ref.log_z[0]), abs=1e-12)
        if gradient:
            assert bool((res.grad_k[1] == 0).all())
            torch.testing.assert_close(res.grad_k[0], ref.grad_k[0], rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("rows", [1, 2, 16])
def test_the_targets_value_path_and_its_chunks_give_the_gradient_paths_values(monkeypatch, rows):
    """log_joint where nothing can differentiate it (no_grad, or a theta without requires_grad) skips the gradient;
    its values equal those of the differentiable call (the envelope path) for every chunk size of the rows."""
    model = _model(50)
    target = EPEvidenceTarget(CVIBoundTarget(model), tol=1e-3)
    g = torch.Generator().manual_seed(0)
    theta = target.initial_theta() + 0.6 * torch.randn(7, 3, generator=g, dtype=F64)
    theta[4, 1] = math.nan
    th = theta.clone().requires_grad_(True)
    ref = target.log_joint(th)
    assert ref.requires_grad
    monkeypatch.setattr(ep_evidence, "EP_CHUNK_ROWS", rows)
    with torch.no_grad():
        value = target.log_joint(theta)
    plain = target.log_joint(theta)                                  # grad enabled, theta without requires_grad
    assert not value.requires_grad and not plain.requires_grad
    assert value[4] == -math.inf and ref[4] == -math.inf
    keep = torch.isfinite(ref)
    torch.testing.assert_close(value[keep], ref.detach()[keep], rtol=1e-13, atol=1e-11)
    assert torch.equal(plain, value)
    one = target.log_joint(theta[0])
    assert one.shape == () and float(one) == pytest.approx(float(ref[0]), abs=1e-11)


@pytest.mark.parametrize("likelihood", ["logit", "probit"])
def test_tilted_moments_on_probabilities_match_a_dense_grid_in_the_log_domain(likelihood):
    """Binary EP's tilted moments for the Bernoulli likelihoods are summed on the probabilities (deep-tail sites
    redone in the log domain): against a trapezoid rule on 200,001 points in the log domain, for cavities from the
    far tail (normalisers below 1e-200: the fallback) to saturation, narrow to wide, where the tilted mean lies
    within a few cavity sds of the cavity mean (the rule's window is 8.5 sds)."""
    from gpvi.models.likelihoods import BernoulliProbit
    from gpvi.numerics.ep import _LOW_Z, _tilted
    from gpvi.numerics.quadrature import Quadrature

    lik = BernoulliLogit() if likelihood == "logit" else BernoulliProbit()
    tail = (-480.0, 1e-3) if likelihood == "logit" else (-31.0, 1e-3)
    pairs = [tail, (-480.0, 1.0) if likelihood == "logit" else (-8.75, 1e-3), (-30.0, 1.0) if likelihood == "logit"
             else (-3.0, 1.0), (-8.75, 1e-3), (0.0, 1e-3), (0.0, 1.0), (0.0, 100.0), (5.0, 1.0), (40.0, 1e-3),
             (40.0, 100.0)]
    m = torch.tensor([p[0] for p in pairs], dtype=F64)
    v = torch.tensor([p[1] for p in pairs], dtype=F64)
    y = torch.ones_like(m)
    log_z, mean, var = _tilted(lik, y, m, v, Quadrature(64))
    for i in range(m.numel()):
        sd = math.sqrt(float(v[i]))
        f = torch.linspace(float(m[i]) - 12 * sd, float(m[i]) + 12 * sd, 200_001, dtype=F64)
        lp = lik.log_prob(torch.ones_like(f), f) - 0.5 * (f - m[i]) ** 2 / v[i] - 0.5 * math.log(2 * math.pi * v[i])
        top = lp.max()
        dens = torch.exp(lp - top)
        z = torch.trapezoid(dens, f)
        ref_mean = torch.trapezoid(dens * f, f) / z
        ref_var = torch.trapezoid(dens * (f - ref_mean) ** 2, f) / z
        ref_log_z = float(torch.log(z) + top)
        assert float(log_z[i]) == pytest.approx(ref_log_z, abs=1e-6 * max(1.0, abs(ref_log_z))), (i, m[i], v[i])
        assert abs(float(mean[i] - ref_mean)) < 1e-6 * math.sqrt(float(ref_var)), (i, m[i], v[i])
        assert float(var[i]) == pytest.approx(float(ref_var), rel=1e-5), (i, m[i], v[i])
    assert float(log_z[0]) < math.log(_LOW_Z)                        # the first site took the fallback


def test_value_tol_loosens_only_the_value_path_and_keeps_the_evidence_within_second_order():
    """``value_tol`` applies where no gradient is wanted: the value path stops earlier (fewer sweeps) with the evidence
    close to EP at 1e-10 (the evidence is stationary in the sites at the fixed point: its error is second order);
    the gradient path keeps ``tol``."""
    model = _model(60)
    bound = CVIBoundTarget(model)
    g = torch.Generator().manual_seed(2)
    theta = bound.initial_theta() + 0.5 * torch.randn(6, 3, generator=g, dtype=F64)
    tight, plain, loose = (EPEvidenceTarget(bound, tol=t) for t in (1e-10, 1e-4, 1e-4))
    loose.value_tol = 1e-2
    with torch.no_grad():
        ref, v_plain, v_loose = (t.log_joint(theta) for t in (tight, plain, loose))
    assert loose.counters["sweeps"] < plain.counters["sweeps"], (loose.counters, plain.counters)
    err_plain, err_loose = float((v_plain - ref).abs().max()), float((v_loose - ref).abs().max())
    assert err_loose < 2e-3 and err_plain < 1e-6, (err_plain, err_loose)        # measured 1.6e-4, 1.8e-9
    th = theta.clone().requires_grad_(True)
    a, b = plain.log_joint(th), loose.log_joint(th)
    assert torch.equal(a.detach(), b.detach())                         # the gradient path ignores value_tol
