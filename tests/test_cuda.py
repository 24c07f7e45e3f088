"""Every engine on a CUDA device agrees with the same run on the CPU (issue "every engine on a GPU").

Marked ``cuda`` and skipped without a GPU. Set ``GPVI_TEST_DEVICE=cpu`` to run the same comparisons CPU against
CPU (a check of the tests themselves, used where no GPU is available).

Tolerances: deterministic engines (ML-II's L-BFGS-B, full-batch CVI with quadrature) must agree to rounding
(1e-6 relative); stochastic ones draw from a generator on the data's device, and CUDA's Philox stream differs from
the CPU's Mersenne twister for the same seed, so their answers agree only to Monte Carlo error: converged means within
0.25 posterior sd, sds within 25% (DSVI, S&K, DSVI-ARD; NUTS with 4 x 400 draws: means within 0.3 sd).
"""

from __future__ import annotations

import math
import os
import warnings

import pytest
import torch

import gpvi

DEVICE = os.environ.get("GPVI_TEST_DEVICE", "cuda")
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="no CUDA device")]


def _data(n=120, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64) * 3
    y = torch.sin(2 * X[:, 0]) + 0.5 * X[:, 1] + 0.2 * torch.randn(n, generator=g, dtype=torch.float64)
    c = (X[:, 0] + 0.3 * torch.randn(n, generator=g, dtype=torch.float64) > 1.5).double()
    return X, y, c


def _both(make):
    """``make(device)`` on the CPU and on DEVICE, warnings silenced; the second result's tensors must be on DEVICE."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make("cpu"), make(DEVICE)


def _on(t, dev=DEVICE):
    assert t.device.type == torch.device(dev).type
    return t.cpu()


def _close_q(a, b, mean_sd=0.25, sd_rel=0.25):
    sd = a.std
    assert bool(((_on(b.mean) - a.mean).abs() <= mean_sd * sd).all()), (a.mean, b.mean, sd)
    assert bool(((_on(b.std) / sd - 1).abs() <= sd_rel).all()), (a.std, b.std)


def reg(dev):
    X, y, _ = _data()
    return gpvi.GPRegression(X, y, device=dev)


def clf(dev):
    X, _, c = _data()
    return gpvi.GPClassification(X, c, device=dev)


def test_ml2():
    a, b = _both(lambda dev: gpvi.ML2(num_restarts=2, seed=0, progress_bar=False).run(reg(dev)))
    torch.testing.assert_close(_on(b.theta), a.theta, rtol=1e-4, atol=1e-4)
    assert b.value == pytest.approx(a.value, rel=1e-8)


def test_dsvi_default_and_psis():
    a, b = _both(lambda dev: gpvi.DSVI(seed=0, progress_bar=False).run(reg(dev)))
    _close_q(a, b)
    assert float(b.elbo) == pytest.approx(float(a.elbo), abs=0.1)
    wa, wb = _both(lambda dev: (a if dev == "cpu" else b).psis(num_draws=500, seed=0))
    assert _on(wb.log_weights).shape == wa.log_weights.shape and math.isfinite(wb.khat)


def test_dsvi_adam_from_a_given_start():
    a, b = _both(lambda dev: gpvi.DSVI(optimizer="adam", num_steps=3000, seed=0, progress_bar=False).run(
        reg(dev), init=reg(dev).initial_theta()))
    _close_q(a, b, mean_sd=0.35, sd_rel=0.35)


def test_dsvi_ard():
    from gpvi.models.logistic import BayesianLogisticRegression
    X, _, c = _data(n=80, d=6)
    a, b = _both(lambda dev: gpvi.inference.dsvi.DSVIARD(num_steps=3000, seed=0, progress_bar=False).run(
        BayesianLogisticRegression(X.to(dev), c.to(dev), prior_var=None, bias=False)))
    assert bool(((_on(b.mean) - a.mean).abs() <= 0.35 * a.std + 0.05).all())


def test_sk_gaussian():
    a, b = _both(lambda dev: gpvi.SKGaussian(seed=0, progress_bar=False).run(reg(dev)))
    _close_q(a, b)


def test_cvi_full_quadrature_is_deterministic_across_devices():
    a, b = _both(lambda dev: gpvi.CVI(seed=0, progress_bar=False).run(clf(dev)))
    assert float(b.elbo) == pytest.approx(float(a.elbo), rel=1e-9)
    torch.testing.assert_close(_on(b.mean), a.mean, rtol=1e-6, atol=1e-8)


def test_cvi_single_site_reaches_the_same_fixed_point():
    a, b = _both(lambda dev: gpvi.CVI(mode="stochastic", num_steps=120 * 60, tol=1e-10, seed=0,
                                      progress_bar=False).run(clf(dev)))
    assert float(b.elbo) == pytest.approx(float(a.elbo), rel=1e-5)


def _mcl(dev):
    from gpvi.models.multiclass import GPMulticlass
    X, _, _ = _data(90)
    y = (X[:, 0] > 1.2).long() + (X[:, 1] > 1.8).long() + (X[:, 0] > 2.2).long()        # K = 4: the Sobol' rule
    return GPMulticlass(X, y, device=dev)


@pytest.mark.parametrize("mode", ["full", "stochastic"])
def test_multiclass_cvi_matches_cpu(mode):
    from gpvi.inference.cvi.engine import CVI
    a, b = _both(lambda dev: CVI(mode=mode, num_steps=1 + 150 * 90, tol=1e-11, seed=0,
                                           progress_bar=False).run(_mcl(dev)))
    assert float(b.elbo) == pytest.approx(float(a.elbo), rel=1e-7)
    torch.testing.assert_close(_on(b.m), a.m, rtol=1e-4, atol=1e-5)


def test_nuts():
    """Two chains of 150 + 300 draws: on a card NUTS is launch-bound (about 130 gradients a second on Boston), and
    4 x 600 iterations ran past 160 s there. Each mean's MCSE is about 0.07 sd, so the difference of two runs has
    an sd of about 0.1 sd: 0.3 sd is 3 of those."""
    a, b = _both(lambda dev: gpvi.NUTS(num_chains=2, num_warmup=150, num_draws=300, seed=0,
                                       progress_bar=False).run(reg(dev)))
    sd = a.samples.std(0)
    assert b.samples.shape == a.samples.shape
    assert bool(((_on(b.samples).mean(0) - a.samples.mean(0)).abs() <= 0.3 * sd).all())


def test_infer():
    a, b = _both(lambda dev: gpvi.infer(reg(dev), seed=0, progress_bar=False))
    assert bool(((_on(b.mean) - a.mean).abs() <= 0.3 * a.std).all())


def test_gp_classifier_device_and_cpu_reload(tmp_path):
    from gpvi.io import load_fit, save_fit
    from gpvi.sklearn import GPClassifier
    X, _, c = _data()
    a, b = _both(lambda dev: GPClassifier(device=dev, random_state=0).fit(X.numpy(), c.numpy()))
    pa, pb = a.predict_proba(X.numpy()), b.predict_proba(X.numpy())
    assert abs(pa - pb).max() < 1e-5
    save_fit(tmp_path / "fit.pt", b)
    back = load_fit(tmp_path / "fit.pt").classifier
    assert back.device is None and back.model_.X.device.type == "cpu"
    assert abs(back.predict_proba(X.numpy()) - pb).max() < 1e-10


def test_large_n_log_joint_draw_by_draw():
    """N = 10,000 with S = 2 draws failed with "CUDA error: invalid argument" when the batch was factorised at once."""
    n = 10_000 if DEVICE == "cuda" else 1_500
    g = torch.Generator().manual_seed(0)
    X = torch.rand(n, 2, generator=g, dtype=torch.float64)
    y = torch.sin(6 * X[:, 0]) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    m = gpvi.GPRegression(X, y, device=DEVICE)
    if DEVICE != "cuda":
        m.lean_min_n = 1000
    assert m._lean()
    th = (m.initial_theta() + torch.tensor([[0.0] * 4, [0.1] * 4], dtype=torch.float64, device=DEVICE)
          ).requires_grad_(True)
    v = m.log_joint(th)
    v.sum().backward()
    assert v.shape == (2,) and bool(torch.isfinite(v).all()) and bool(torch.isfinite(th.grad).all())
    one = m.log_joint(th[1].detach()).detach()
    assert float(one) == pytest.approx(float(v[1]), rel=1e-12)


def test_generalised_regression_predicts_on_the_device_reloads_on_the_cpu_and_plots(tmp_path):
    """Issue 60: a Poisson GPGeneralisedRegression fitted on the device predicts there (mean, integer interval),
    saves, reloads on the CPU with the same predictions, and draws (the plot's grid follows the data's device)."""
    from gpvi.io import load_fit, save_fit

    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 1, generator=g, dtype=torch.float64) * 5
    y = torch.poisson(torch.exp(1 + torch.sin(X[:, 0])), generator=g)
    a, b = _both(lambda dev: gpvi.CVI(progress_bar=False).run(
        gpvi.GPGeneralisedRegression(X, y, likelihood="poisson", device=dev)))
    X_new = torch.linspace(-0.5, 5.5, 9, dtype=torch.float64).unsqueeze(-1)
    pa, pb = a.predict(X_new), b.predict(X_new)
    assert float((_on(pb.mean) - pa.mean).abs().max()) < 1e-6 * float(pa.mean.abs().max())
    lo, hi = pb.interval(0.9)
    assert torch.equal(_on(lo), pa.interval(0.9)[0]) and torch.equal(_on(hi), pa.interval(0.9)[1])
    save_fit(tmp_path / "fit.pt", b)
    back = load_fit(tmp_path / "fit.pt").posterior
    assert back.model.X.device.type == "cpu"
    torch.testing.assert_close(back.predict(X_new).mean, _on(pb.mean), rtol=1e-10, atol=1e-10)
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from gpvi.evaluation.plots import observation_predictive

    line = observation_predictive(b, latent=True).axes[0].get_lines()[0]
    grid = torch.as_tensor(line.get_xdata())
    torch.testing.assert_close(torch.as_tensor(line.get_ydata()), back.predict(grid.unsqueeze(-1)).mean,
                               rtol=1e-9, atol=1e-9)


def test_generalised_priors_count_start_and_whitened_likelihood_parameters_follow_the_device():
    """Issue 60, item 3: LikelihoodTypeII with priors (registered kernel prior, Gamma on the dispersion) from the
    default start for counts, and the whitened target with the dispersion sampled: the device's answers equal the
    CPU's (a deterministic fit to 1e-6 relative, the log joint and its gradient to rounding)."""
    import gpytorch

    from gpvi.inference.cvi import LikelihoodTypeII
    from gpvi.models.latent_likelihoods import NegativeBinomial
    from gpvi.models.whitened import WhitenedLatentGP

    g = torch.Generator().manual_seed(0)
    X = torch.rand(30, 1, generator=g, dtype=torch.float64) * 5
    y = torch.poisson(torch.exp(5 + torch.sin(X[:, 0])), generator=g)          # counts in the hundreds

    def model(dev):
        k = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(
            lengthscale_prior=gpytorch.priors.LogNormalPrior(0.0, 0.5)))
        return gpvi.GPGeneralisedRegression(X, y, kernel=k, likelihood=NegativeBinomial(5.0), device=dev)

    priors = {"dispersion": gpytorch.priors.GammaPrior(2.0, 0.1)}
    a, b = _both(lambda dev: LikelihoodTypeII(priors=priors).run(model(dev)))
    torch.testing.assert_close(_on(b.theta), a.theta, rtol=1e-6, atol=1e-6)
    assert b.info["likelihood_params"]["dispersion"] == pytest.approx(a.info["likelihood_params"]["dispersion"],
                                                                      rel=1e-6)
    ta, tb = (WhitenedLatentGP(model(dev), likelihood_priors=priors) for dev in ("cpu", DEVICE))
    z = ta.initial_theta() + 0.1 * torch.randn(ta.dim, generator=g, dtype=torch.float64)
    za, zb = z.clone().requires_grad_(True), z.to(DEVICE).requires_grad_(True)
    la, lb = ta.log_joint(za), tb.log_joint(zb)
    (ga,), (gb,) = torch.autograd.grad(la, za), torch.autograd.grad(lb, zb)
    assert float(_on(lb.detach())) == pytest.approx(float(la), rel=1e-10)
    torch.testing.assert_close(_on(gb), ga, rtol=1e-8, atol=1e-8)


def test_importance_gaussian_follows_the_device():
    """The fully Bayesian classifier's importance step on DEVICE: its Sobol' points are drawn on the CPU and moved,
    so the same draws give q equal to the CPU's to rounding, on DEVICE."""
    from gpvi.inference.cvi.importance import ImportanceGaussian
    from gpvi.inference.init import Start

    def make(dev):
        mu = torch.tensor([1.0, -0.5], dtype=torch.float64, device=dev)
        prec = torch.tensor([1.0, 4.0], dtype=torch.float64, device=dev)
        target = gpvi.Target(lambda th: -0.5 * ((th - mu) ** 2 * prec).sum(-1), names=2)
        start = Start(torch.full((2,), 0.3, dtype=torch.float64, device=dev),
                      torch.diag(torch.tensor([1.0, 0.5], dtype=torch.float64, device=dev)))
        return ImportanceGaussian(seed=2).run(target, start)

    a, b = _both(make)
    torch.testing.assert_close(_on(b.mean), a.mean, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(_on(b.covariance), a.covariance, rtol=1e-9, atol=1e-9)
