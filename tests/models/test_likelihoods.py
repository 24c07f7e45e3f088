"""Site expectations for CVI: quadrature against adaptive integration, derivatives, Monte Carlo, likelihoods."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.integrate as si
import scipy.special as sp
import torch

from gpvi.models.likelihoods import (
    BernoulliLogit,
    BernoulliProbit,
    expected_log_lik_sum,
    Gaussian,
    Quadrature,
    expected_log_lik,
    gaussian_expectation,
    make_likelihood,
    mean_parameter_gradients,
)

F64 = torch.float64


def _t(x):
    return torch.tensor(x, dtype=F64)


def _reference(link: str, y: float, m: float, v: float, k: int) -> float:
    """E[h^(k)(f)] for f ~ N(m, v) by adaptive quadrature (scipy.quad), independent of gpvi."""
    s = 2.0 * y - 1.0

    def h(f):
        z = s * f
        if link == "logit":
            return [-np.logaddexp(0.0, -z), s * sp.expit(-z), -sp.expit(f) * sp.expit(-f)][k]
        lz = sp.log_ndtr(z)
        r = np.exp(-0.5 * z * z - 0.5 * np.log(2 * np.pi) - lz)
        return [lz, s * r, -r * (z + r)][k]

    sd = math.sqrt(v)
    lo, hi = m - 12 * sd, m + 12 * sd
    pts = [p for p in sorted({0.0, m}) if lo < p < hi]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return si.quad(lambda f: h(f) * np.exp(-(f - m) ** 2 / (2 * v)) / math.sqrt(2 * math.pi * v), lo, hi,
                       epsabs=1e-16, epsrel=1e-14, limit=2000, points=pts or None)[0]


GRID_M = [-20.0, -1.0, 0.3, 5.0]
GRID_V = [1e-4, 0.5, 10.0, 100.0, 2000.0]


@pytest.mark.parametrize("link,tol", [("logit", 1e-11), ("probit", 2e-9)])
def test_default_quadrature_matches_adaptive_integration_for_all_variances(link, tol):
    # tol: measured worst cases 4e-13 (logit) and 2.4e-10 (probit, v = 2000, limited by the cancellation in
    # h'' = -r (z + r) far in the left tail); a 32-node rule fails these tolerances (3e-4)
    lik = make_likelihood(link)
    mm = [m for m in GRID_M for _ in GRID_V]
    vv = [v for _ in GRID_M for v in GRID_V]
    for y in (0.0, 1.0):
        ex = expected_log_lik(lik, torch.full((len(mm),), y, dtype=F64), _t(mm), _t(vv))
        got = torch.stack([ex.value, ex.dm, 2 * ex.dv])          # E[h], E[h'], E[h'']
        for i, (m, v) in enumerate(zip(mm, vv)):
            for k in range(3):
                ref = _reference(link, y, m, v, k)
                assert abs(float(got[k, i]) - ref) <= tol * (1 + abs(ref)), (link, y, m, v, k)


def test_gauss_hermite_is_inaccurate_at_large_variance_and_the_default_is_not():
    # the documented reason for the default rule: 20-point Gauss-Hermite (GPyTorch's default) errs by > 1e-2
    # at marginal variances 50-400, 100 points still by > 5e-3
    lik = BernoulliLogit()
    m, v = _t([0.5, -1.0, 2.0]), _t([50.0, 100.0, 400.0])
    y = torch.ones(3, dtype=F64)
    ref = torch.tensor([_reference("logit", 1.0, float(a), float(b), 1) for a, b in zip(m, v)], dtype=F64)
    gh20 = expected_log_lik(lik, y, m, v, quadrature=Quadrature(20, "gauss-hermite")).dm
    gh100 = expected_log_lik(lik, y, m, v, quadrature=Quadrature(100, "gauss-hermite")).dm
    default = expected_log_lik(lik, y, m, v).dm
    assert float((gh20 - ref).abs().max()) > 1e-2
    assert float((gh100 - ref).abs().max()) > 5e-3
    assert float((default - ref).abs().max()) < 1e-12


@pytest.mark.parametrize("lik", [BernoulliLogit(), BernoulliProbit()])
def test_derivatives_match_finite_differences_of_the_expectation(lik):
    m = _t([-3.0, -0.2, 0.0, 1.5, 7.0])
    v = _t([0.05, 1.0, 3.0, 20.0, 300.0])
    y = _t([1.0, 0.0, 1.0, 0.0, 1.0])
    ex = expected_log_lik(lik, y, m, v)
    eps = 1e-5

    def E(mm, vv):
        return expected_log_lik(lik, y, mm, vv).value

    fd_m = (E(m + eps, v) - E(m - eps, v)) / (2 * eps)
    fd_v = (E(m, v + eps * v) - E(m, v - eps * v)) / (2 * eps * v)
    # central differences: truncation O(eps^2) ~ 1e-10, rounding ~ 1e-16 / 1e-5 = 1e-11
    assert torch.allclose(ex.dm, fd_m, rtol=1e-7, atol=1e-9)
    assert torch.allclose(ex.dv, fd_v, rtol=1e-7, atol=1e-9)


def test_mean_parameter_gradients_match_differences_in_mean_parameters():
    # E as a function of mu1 = m, mu2 = v + m^2 (Khan & Lin 2017, eq. 13)
    lik = BernoulliLogit()
    m, v, y = _t([0.7, -2.0]), _t([1.3, 4.0]), _t([1.0, 0.0])
    mu1, mu2 = m, v + m * m
    ex = expected_log_lik(lik, y, m, v)
    g1, g2 = mean_parameter_gradients(ex.dm, ex.dv, m)

    def E(a, b):
        return expected_log_lik(lik, y, a, b - a * a).value

    eps = 1e-5
    fd1 = (E(mu1 + eps, mu2) - E(mu1 - eps, mu2)) / (2 * eps)
    fd2 = (E(mu1, mu2 + eps) - E(mu1, mu2 - eps)) / (2 * eps)
    assert torch.allclose(g1, fd1, rtol=1e-7, atol=1e-9)
    assert torch.allclose(g2, fd2, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("lik", [BernoulliLogit(), BernoulliProbit()])
def test_likelihood_derivatives_match_autograd(lik):
    f = torch.linspace(-30, 30, 121, dtype=F64, requires_grad=True)
    for y in (0.0, 1.0):
        yy = torch.full_like(f, y)
        h, h1, h2 = lik.derivatives(yy, f)
        (a1,) = torch.autograd.grad(h.sum(), f, create_graph=True)
        (a2,) = torch.autograd.grad(a1.sum(), f)
        assert torch.allclose(h1, a1.detach(), rtol=1e-10, atol=1e-12)
        # probit h'' = -r(z + r) cancels for z << 0: relative 1e-8 at |z| = 30
        assert torch.allclose(h2, a2, rtol=1e-7, atol=1e-10)


def test_logit_and_probit_log_likelihoods_are_the_textbook_ones():
    f = _t([-2.0, 0.0, 3.0])
    assert torch.allclose(BernoulliLogit().log_prob(torch.ones(3, dtype=F64), f), torch.log(torch.sigmoid(f)))
    assert torch.allclose(BernoulliProbit().log_prob(torch.zeros(3, dtype=F64), f),
                          torch.log(1 - torch.special.ndtr(f)))


def test_gaussian_closed_form_matches_quadrature_of_its_log_density():
    lik = Gaussian(0.3)
    y, m, v = _t([0.5, -1.0, 2.0]), _t([0.1, 0.0, 3.0]), _t([0.2, 1.0, 5.0])
    closed = lik.closed_form(y, m, v)
    f, w = Quadrature(64).nodes(m, v)
    h, h1, h2 = lik.derivatives(y.unsqueeze(-1), f)
    assert torch.allclose(closed[0], (w * h).sum(-1), rtol=1e-12)
    assert torch.allclose(closed[1], (w * h1).sum(-1), rtol=1e-12)
    assert torch.allclose(closed[2], 0.5 * (w * h2).sum(-1), rtol=1e-12)
    g1, g2 = mean_parameter_gradients(closed[1], closed[2], m)
    assert torch.allclose(g1, y / 0.3, rtol=1e-14) and torch.allclose(g2, torch.full_like(m, -0.5 / 0.3))


@pytest.mark.parametrize("grad", ["hessian", "reparam"])
def test_monte_carlo_is_unbiased_within_its_standard_error(grad):
    lik = BernoulliLogit()
    m, v, y = _t([0.4, -1.5, 2.0]), _t([0.5, 3.0, 9.0]), _t([1.0, 1.0, 0.0])
    exact = expected_log_lik(lik, y, m, v)
    S = 20000
    reps = [expected_log_lik(lik, y, m, v, method="mc", num_draws=S // 20, mc_variance_grad=grad,
                             generator=torch.Generator().manual_seed(k)) for k in range(20)]
    for field in ("value", "dm", "dv"):
        est = torch.stack([getattr(r, field) for r in reps])          # 20 independent estimates of S/20 draws
        se = est.std(0) / math.sqrt(20)
        # 5 standard errors (two-sided p ~ 6e-7 per entry); the SE itself is estimated from 20 replicates
        assert bool(((est.mean(0) - getattr(exact, field)).abs() <= 5 * se + 1e-12).all()), field


def test_monte_carlo_is_deterministic_given_a_generator():
    lik = BernoulliProbit()
    m, v, y = _t([0.1, 0.2]), _t([1.0, 2.0]), _t([1.0, 0.0])
    a = expected_log_lik(lik, y, m, v, method="mc", generator=torch.Generator().manual_seed(3))
    b = expected_log_lik(lik, y, m, v, method="mc", generator=torch.Generator().manual_seed(3))
    c = expected_log_lik(lik, y, m, v, method="mc", generator=torch.Generator().manual_seed(4))
    assert torch.equal(a.dm, b.dm) and not torch.equal(a.dm, c.dm)


def test_reparam_estimator_can_give_invalid_precision_and_hessian_cannot():
    lik = BernoulliLogit()
    m = torch.zeros(2000, dtype=F64)
    v = torch.full((2000,), 4.0, dtype=F64)
    y = torch.ones(2000, dtype=F64)
    gen = torch.Generator().manual_seed(0)
    rep = expected_log_lik(lik, y, m, v, method="mc", num_draws=1, mc_variance_grad="reparam", generator=gen)
    hes = expected_log_lik(lik, y, m, v, method="mc", num_draws=1, mc_variance_grad="hessian", generator=gen)
    assert bool((rep.dv >= 0).any())
    assert bool((hes.dv < 0).all())


def test_expected_log_lik_autograd_function_uses_the_quadrature_derivatives():
    lik = BernoulliLogit()
    m = _t([0.3, -1.0]).requires_grad_(True)
    v = _t([2.0, 0.5]).requires_grad_(True)
    y = _t([1.0, 0.0])
    val = expected_log_lik_sum(lik, y, m, v)
    val.backward()
    ex = expected_log_lik(lik, y, m.detach(), v.detach())
    assert float(val.detach()) == pytest.approx(float(ex.value.sum()), rel=1e-15)
    assert torch.equal(m.grad, ex.dm) and torch.equal(v.grad, ex.dv)


def test_probit_predictive_closed_form_equals_quadrature():
    m, v = _t([-2.0, 0.0, 1.0, 4.0]), _t([0.1, 1.0, 30.0, 500.0])
    quad = gaussian_expectation(torch.special.ndtr, m, v)
    assert torch.allclose(quad, torch.special.ndtr(m / torch.sqrt(1 + v)), atol=1e-12)


def test_quadrature_degenerate_variance_is_a_point_mass():
    m, v = _t([0.5, 2.0]), _t([0.0, 1e-40])
    out = gaussian_expectation(torch.sigmoid, m, v)
    assert torch.allclose(out, torch.sigmoid(m), atol=1e-15)


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="likelihood must be one of"):
        make_likelihood("cauchit")
    with pytest.raises(TypeError, match="likelihood must be"):
        make_likelihood(3)
    with pytest.raises(ValueError, match="num_quadrature must be >= 2"):
        Quadrature(1)
    with pytest.raises(ValueError, match="quadrature must be one of"):
        Quadrature(20, "simpson")
    with pytest.raises(ValueError, match="noise_var must be > 0"):
        Gaussian(0.0)
    with pytest.raises(ValueError, match="equal length"):
        expected_log_lik(BernoulliLogit(), _t([1.0]), _t([0.0, 1.0]), _t([1.0, 1.0]))
    with pytest.raises(ValueError, match="estimator must be one of"):
        expected_log_lik(BernoulliLogit(), _t([1.0]), _t([0.0]), _t([1.0]), method="exact")
    with pytest.raises(ValueError, match="num_draws must be >= 1"):
        expected_log_lik(BernoulliLogit(), _t([1.0]), _t([0.0]), _t([1.0]), method="mc", num_draws=0)


@pytest.mark.parametrize("rule", ["gl-asinh", "gauss-hermite"])
def test_nodes_into_fills_the_same_nodes_and_weights_as_nodes_by_node(rule):
    """The in-place fill (no allocation of node-sized arrays) is the same rule: nodes and weights equal
    nodes_by_node's to 1e-14 relative (weights 1e-12), means from -300 to 300 and variances from 1e-6 to 1e4; a degenerate window
    (a zero variance) is refused (False), nodes_by_node handles it."""
    g = torch.Generator().manual_seed(3)
    m = torch.cat([torch.randn(50, generator=g, dtype=torch.float64) * 3, torch.tensor([-300.0, 300.0, 0.0],
                                                                                        dtype=torch.float64)])
    v = torch.exp(torch.empty(53, dtype=torch.float64).uniform_(math.log(1e-6), math.log(1e4), generator=g))
    q = Quadrature(28, rule, width=6.5) if rule == "gl-asinh" else Quadrature(28, rule)
    f, w = q.nodes_by_node(m, v)
    fi, wi, scratch = (torch.full((28, 53), math.nan, dtype=torch.float64) for _ in range(3))
    assert q.nodes_into(m, v, fi, wi, scratch)
    torch.testing.assert_close(fi, f, rtol=1e-14, atol=0.0)
    # the weights' rounding grows with z^2 (42 at the window's edge) and with |m| / sd through f - m
    torch.testing.assert_close(wi, w, rtol=1e-12, atol=1e-300)
    v[0] = 0.0
    assert q.nodes_into(m, v, fi, wi, scratch) is (rule == "gauss-hermite")


def test_probit_response_keeps_its_relative_accuracy_in_the_lower_tail():
    """Phi(f) by erfc against SciPy's ndtr (Cephes, erfc-based in the tails) to 1e-13 relative, from the lower tail
    (Phi(-10) = 7.6e-24, where torch.special.ndtr returns 0) to the upper; the logit's response is the sigmoid."""
    f = torch.linspace(-30.0, 8.0, 381, dtype=torch.float64)
    got = BernoulliProbit().response(f)
    want = torch.from_numpy(sp.ndtr(f.numpy()))
    assert bool((want > 0).all()) and torch.allclose(got, want, rtol=1e-13, atol=0)
    assert float(BernoulliProbit().response(torch.tensor([-10.0], dtype=torch.float64))) > 7e-24
    assert torch.equal(BernoulliLogit().response(f), torch.sigmoid(f))
