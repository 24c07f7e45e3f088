"""Step 0 of gpvi.infer: the lattice quadrature (gpvi.inference.grid) against closed forms and a brute-force box."""

import math
import warnings

import gpytorch as gp
import pytest
import torch
from scipy.special import gammaln, polygamma, psi
from scipy.stats import gamma

import gpvi
from gpvi.inference.grid import GRID_STEP, grid_posterior
from gpvi.inference.init import Start

F64 = {"dtype": torch.float64}


def _start(theta, scale):
    return Start(torch.as_tensor(theta, **F64), torch.as_tensor(scale, **F64), "laplace")


def test_a_correlated_gaussian_is_exact():
    """Means, covariance and the evidence of an unnormalised correlated Gaussian (3-D): the lattice sums of a
    Gaussian at h = 0.7 sd err by about exp(-2 pi^2 / h^2), far below the tolerances."""
    m = torch.tensor([1.0, -2.0, 0.5], **F64)
    C = torch.tensor([[1.0, 0.6, 0.2], [0.6, 2.0, -0.3], [0.2, -0.3, 0.5]], **F64)
    P = torch.linalg.inv(C)
    t = gpvi.Target(lambda th: -0.5 * (((th - m) @ P) * (th - m)).sum(-1), names=["a", "b", "c"])
    post, info = grid_posterior(t, _start(m, torch.linalg.cholesky(C)))
    assert info["reliable"] and info["step"] == GRID_STEP and info["non_finite"] == 0
    assert torch.allclose(post.mean, m, atol=1e-8) and torch.allclose(post.covariance, C, atol=1e-7)
    # the flood stops where the density has dropped by GRID_DROP = 12 nats: the mass beyond is P(chi2_3 > 24) = 3e-5
    assert abs(info["log_evidence"] - (1.5 * math.log(2 * math.pi) + 0.5 * math.log(torch.det(C).item()))) < 3e-5
    assert info["edge_mass"] < 1e-4


@pytest.mark.parametrize("a", [0.7, 3.0])
def test_log_gamma_tails_match_the_closed_form(a):
    """theta = log X with X ~ Gamma(a, 1) in each of two coordinates: a skewed density with an exponential tail
    towards -inf (the shape of a log noise variance's tail at small N): mean psi(a), variance psi'(a), evidence
    Gamma(a)^2, from a Laplace start that is too narrow for the tail (sd 1/sqrt(a) against sqrt(psi'(a)))."""
    t = gpvi.Target(lambda th: (a * th - torch.exp(th)).sum(-1), names=["u", "v"])
    post, info = grid_posterior(t, _start([math.log(a)] * 2, torch.eye(2, **F64) / math.sqrt(a)))
    sd = math.sqrt(polygamma(1, a))
    assert info["reliable"]
    assert float((post.mean - psi(a)).abs().max()) < 0.01 * sd
    assert float((post.std / sd - 1).abs().max()) < 0.01
    assert abs(info["log_evidence"] - 2 * gammaln(a)) < 1e-3
    # quantiles of the lattice's weighted cells resolve to about one lattice step (h Laplace sd)
    q = post.quantile(torch.tensor([0.05, 0.5, 0.95], **F64))
    exact = torch.log(torch.as_tensor(gamma.ppf([0.05, 0.5, 0.95], a), **F64))
    assert q.shape == (3, 2) and float((q - exact[:, None]).abs().max()) <= GRID_STEP / math.sqrt(a)


def test_an_improper_or_faulty_target_ends_the_grid_step():
    """A posterior flat in one coordinate outgrows the cell budget; a log joint that is NaN next to the mass
    fails the check; a start without a Laplace scale or with too many parameters is not tried."""
    flat = gpvi.Target(lambda th: -0.5 * th[:, 0] ** 2, names=["a", "b"])
    post, info = grid_posterior(flat, _start([0.0, 0.0], torch.eye(2, **F64)), max_cells=5_000)
    assert post is None and not info["reliable"] and "outgrew" in info["reason"]
    nan = gpvi.Target(lambda th: torch.where(th[:, 0] > 1.5, torch.nan, -0.5 * (th ** 2).sum(-1)), names=["a", "b"])
    post, info = grid_posterior(nan, _start([0.0, 0.0], torch.eye(2, **F64)))
    assert post is None and info["non_finite"] > 0 and "NaN" in info["reason"]
    post, info = grid_posterior(nan, Start(torch.zeros(2, **F64)))
    assert post is None and "Laplace" in info["reason"]
    nowhere = gpvi.Target(lambda th: torch.full_like(th[:, 0], -math.inf), names=["a", "b"])
    post, info = grid_posterior(nowhere, _start([0.0, 0.0], torch.eye(2, **F64)))
    assert post is None and "-inf at every" in info["reason"]
    five = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=list("abcde"))
    post, info = grid_posterior(five, _start([0.0] * 5, torch.eye(5, **F64)))
    assert post is None and "5 parameters" in info["reason"]


def test_a_coarse_lattice_is_refined_once_when_its_cosets_disagree():
    """A start whose scale is 2x too wide makes h = 1.4 true sds: the 2h cosets disagree, h is halved, and the
    finer lattice's answer is accurate; with 4x (h = 2.8 sd) even the halved lattice fails and the step says so."""
    t = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=["a", "b"])
    post, info = grid_posterior(t, _start([0.0, 0.0], 2 * torch.eye(2, **F64)))
    assert info["reliable"] and info["step"] == GRID_STEP / 2
    assert float((post.std - 1).abs().max()) < 0.01
    post, info = grid_posterior(t, _start([0.0, 0.0], 4 * torch.eye(2, **F64)))
    assert post is None and "cosets disagree" in info["reason"] and info["step"] == GRID_STEP / 2


def _tiny():
    """benchmarks/small_data.py's 14-point model (issue 57): half-normal priors, a fixed constant kernel."""
    g = torch.Generator().manual_seed(0)
    X = torch.linspace(0.0, 10.0, 14, **F64).unsqueeze(-1)
    y = torch.sin(X[:, 0]) + 2.0 + 0.3 * torch.randn(14, generator=g, **F64)
    const = gp.kernels.ConstantKernel()
    const.constant = torch.tensor(1.0)
    const.raw_constant.requires_grad_(False)
    hn = torch.distributions.HalfNormal
    prior = {"lengthscale": hn(torch.tensor(5.0, **F64)), "signal_sd": hn(torch.tensor(2.0, **F64)),
             "noise_sd": hn(torch.tensor(1.0, **F64))}
    return gpvi.GPRegression(X, y, kernel=gp.kernels.ScaleKernel(gp.kernels.RBFKernel()) + const, prior=prior)


def test_infer_answers_the_14_point_model_by_the_grid_as_a_brute_force_box_does():
    """gpvi.infer on the issue's 14-point, 3-hyperparameter model: the grid answers (trusted) and agrees with a
    fixed box of 40 x 40 x 110 points over (-14, 8) x (-16, 7) x (-40, 4) (evaluated here, independent of the MAP,
    the Laplace scale and the flood; its edges hold under 1e-4 of the mass) within 0.02 sd and 2% in sd. The long
    tail towards zero noise (log noise variance below -6) holds about 1% of the mass."""
    model = _tiny()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        post = gpvi.infer(model, seed=0, progress_bar=False)
    r = post.report
    assert r.answer == "grid" and r.trusted and r.engine == "grid" and set(r.times) == {"grid"}
    assert "answer = grid" in str(r) and "cosets agree" in str(r) and r.grid["reliable"]
    axes = [torch.linspace(lo, hi, k, **F64) for lo, hi, k in ((-14, 8, 40), (-16, 7, 40), (-40, 4, 110))]
    box = torch.cartesian_prod(*axes)
    with torch.no_grad():
        lp = torch.cat([model.log_joint(part) for part in torch.split(box, 20_000)])
    lp = torch.where(torch.isfinite(lp), lp, torch.full_like(lp, -math.inf))
    w = torch.exp(lp - lp.max())
    w = w / w.sum()
    mean = w @ box
    sd = torch.sqrt(w @ (box - mean) ** 2)
    edge = (box[:, 0] <= -13) | (box[:, 0] >= 7) | (box[:, 1] <= -15) | (box[:, 1] >= 6) | (box[:, 2] <= -39)
    assert float(w[edge].sum()) < 1e-4
    assert float(((post.mean - mean).abs() / sd).max()) < 0.02
    assert float((post.std / sd - 1).abs().max()) < 0.02
    assert 0.003 < float(w[box[:, 2] < -6].sum()) < 0.03
    assert post.predict(torch.tensor([[0.5], [5.0], [12.0]], **F64), num_draws=20).mean.shape == (3,)


def test_ctrl_c_in_the_grid_returns_the_map_points_laplace_gaussian_flagged(monkeypatch):
    """Ctrl-C during the flood (the third batched log-joint call): infer stops there and returns the MAP point's
    Laplace Gaussian, not trusted, the stage named, with an InterruptedRunWarning; nothing runs after it."""
    import gpvi.inference.grid as grid_module
    real, calls = grid_module.log_joint_at, {"n": 0}

    def interrupted(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(grid_module, "log_joint_at", interrupted)
    with pytest.warns(gpvi.exceptions.InterruptedRunWarning, match="grid"):
        post = gpvi.infer(_tiny(), seed=0, progress_bar=False)
    r = post.report
    assert calls["n"] == 3 and isinstance(post, gpvi.GaussianPosterior) and r.interrupted == "grid"
    assert not r.trusted and set(r.times) == {"grid"} and "interrupted (Ctrl-C)" in r.reason


def test_every_map_optimum_seeds_the_flood():
    """Two basins 12 sd apart (the valley between them 18 nats deep, deeper than GRID_DROP) with masses 0.7 and 0.3:
    flooded from the start alone, the grid sees one basin; with the other optimum among the start's alternatives,
    both, with the mixture's exact mean and variance."""
    def log_p(th):
        a = -0.5 * ((th - torch.tensor([6.0, 0.0], **F64)) ** 2).sum(-1) + math.log(0.7)
        b = -0.5 * ((th - torch.tensor([-6.0, 0.0], **F64)) ** 2).sum(-1) + math.log(0.3)
        return torch.logaddexp(a, b)

    t = gpvi.Target(log_p, names=["a", "b"])
    one, _ = grid_posterior(t, _start([6.0, 0.0], torch.eye(2, **F64)))
    assert abs(float(one.mean[0]) - 6.0) < 1e-6
    both, info = grid_posterior(t, Start(torch.tensor([6.0, 0.0], **F64), torch.eye(2, **F64), "laplace",
                                         alternatives=(_start([-6.0, 0.0], torch.eye(2, **F64)),)))
    assert info["reliable"] and abs(float(both.mean[0]) - 2.4) < 1e-4
    assert abs(float(both.covariance[0, 0]) - (37.0 - 2.4 ** 2)) < 1e-3


def test_the_grid_posterior_says_what_it_is_in_its_summary_and_arviz_export():
    t = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=["a", "b"])
    post, info = grid_posterior(t, _start([0.0, 0.0], torch.eye(2, **F64)))
    assert "lattice quadrature" in post._own_title() and "PSIS" not in post._own_title()
    idata = post.to_arviz(num_draws=200, seed=0)
    assert idata.attrs["grid_cells"] == post.draws.shape[0] and "lattice" in idata.attrs["draws"]


def test_bad_settings_are_refused_naming_the_argument():
    t = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=["a", "b"])
    s = _start([0.0, 0.0], torch.eye(2, **F64))
    for kw, err in (({"step": 0.0}, ValueError), ({"step": -0.5}, ValueError), ({"drop": 0.0}, ValueError),
                    ({"max_cells": 0}, ValueError), ({"max_cells": 2.5}, TypeError), ({"step": "0.7"}, TypeError)):
        with pytest.raises(err, match=next(iter(kw))):
            grid_posterior(t, s, **kw)
