"""Device follows the data: every engine, run on CPU data with torch's default device set to "meta", must give the
same answer as without it. Any tensor a function creates without an explicit device lands on the meta device and
fails loudly (no data, or a device mismatch), so this CPU-only test catches what would break on a GPU."""

from __future__ import annotations

import warnings

import pytest
import torch

import gpvi
from gpvi.inference.cvi.engine import CVI
from gpvi.models.multiclass import GPMulticlass

G = torch.Generator().manual_seed(0)
X = torch.rand(30, 2, generator=G, dtype=torch.float64)
Y = torch.sin(4 * X[:, 0]) + 0.1 * torch.randn(30, generator=G, dtype=torch.float64)
YC = (X[:, 0] + 0.2 * torch.randn(30, generator=G, dtype=torch.float64) > 0.5).double()
Z4 = torch.zeros(4, dtype=torch.float64)


REG = gpvi.GPRegression(X, Y)                   # models are built on the CPU (GPyTorch's kernels included); only
CLF = gpvi.GPClassification(X, YC)              # the engines and posteriors run under the meta default device
MCL = GPMulticlass(X, (X[:, 0] > 0.3).long() + (X[:, 1] > 0.6).long() + (X[:, 0] > 0.8).long())   # K = 4


def _multiclass(**kw):
    post = CVI(seed=0, progress_bar=False, **kw).run(MCL)
    return [post.m, post.var, post.predict_proba(X[:4])]


def _dsvi_psis_predict():
    q = gpvi.DSVI(num_steps=30, num_elbo_draws=20, seed=0, progress_bar=False).run(REG)
    w = q.psis(num_draws=50, seed=0)
    pred = q.predict(X[:4], num_draws=10)
    return [q.mean, q.scale_tril, w.log_weights, pred.mean, pred.var, q.quantile(0.9)]


CASES = {
    "ml2": lambda: [gpvi.ML2(num_restarts=2, seed=0, progress_bar=False).run(REG).theta],
    "dsvi+psis+predict": _dsvi_psis_predict,
    "dsvi-sgd-mvt": lambda: [gpvi.DSVI(optimizer="sgd", base=("t", 5.0), num_steps=20, num_elbo_draws=20, seed=0,
                                       progress_bar=False).run(REG, init=Z4).mean],
    "sk": lambda: [gpvi.SKGaussian(num_steps=20, num_elbo_draws=20, seed=0, progress_bar=False).run(REG,
                                                                                                     init=Z4).mean],
    "cvi-full": lambda: [gpvi.CVI(num_steps=5, seed=0, progress_bar=False).run(CLF).mean],
    "cvi-single-site": lambda: [gpvi.CVI(mode="stochastic", num_steps=60, seed=0, progress_bar=False).run(CLF).mean],
    "multiclass-full-sobol": lambda: _multiclass(num_steps=5),
    "multiclass-single-site": lambda: _multiclass(mode="stochastic", num_steps=70),
    "nuts": lambda: [gpvi.NUTS(num_chains=1, num_warmup=5, num_draws=5, seed=0, progress_bar=False).run(
        REG, init=Z4).draws],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_engines_create_no_tensor_on_the_default_device(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = CASES[name]()
        torch.set_default_device("meta")
        try:
            got = CASES[name]()
        finally:
            torch.set_default_device(None)
    for a, b in zip(want, got):
        assert b.device.type == "cpu" and torch.equal(a, b)


class _OnMeta:
    """A target whose data would live on another device ("meta" stands in for a GPU on a CPU-only machine)."""

    names = ["a", "b"]
    device = torch.device("meta")

    def log_joint(self, theta):
        return -0.5 * (theta * theta).sum(-1)


def test_starts_move_to_the_target_device():
    """Found on an H200: starts built on the CPU met CUDA data ("Expected all tensors to be on the same device")."""
    from gpvi.inference.init import Start, on_target_device

    s = Start(torch.ones(2, dtype=torch.float64), torch.eye(2, dtype=torch.float64), "given",
              alternatives=(Start(torch.zeros(2, dtype=torch.float64)),))
    moved = on_target_device(s, _OnMeta())
    assert moved.theta.device.type == moved.scale_tril.device.type == moved.alternatives[0].theta.device.type == "meta"
    assert on_target_device(s, gpvi.Target(lambda t: -(t * t).sum(-1), names=2)) is s      # no device: unchanged


def test_draws_come_from_the_generator_device_then_move():
    """A CPU generator serves data on another device (torch.randn refuses it); on the CPU the stream is torch's."""
    from gpvi.rng import randn

    a = randn((3, 2), torch.Generator().manual_seed(5))
    b = torch.randn((3, 2), generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    assert torch.equal(a, b)
    assert randn((3, 2), torch.Generator().manual_seed(5), device="meta").device.type == "meta"
    from gpvi.numerics.families import StandardNormal

    assert StandardNormal(2).sample(3, torch.Generator().manual_seed(5), device="meta").device.type == "meta"


def test_randn_refuses_a_generator_that_is_not_one():
    from gpvi.rng import randn

    with pytest.raises(TypeError, match="generator"):
        randn((2, 2), "seed 0")


# ---------------------------------------------------------------------------------------------- the meta device
# torch's "meta" device holds shapes but no values: data there is refused with a ValueError naming the argument (was a
# RuntimeError or NotImplementedError from deep inside torch), and so is a target whose data say they live there.
XM, YM, YCM = X.to("meta"), Y.to("meta"), YC.to("meta")


@pytest.mark.parametrize("build, name", [
    (lambda: gpvi.GPRegression(XM, YM), "X"),
    (lambda: gpvi.GPRegression(X, YM), "y"),
    (lambda: gpvi.GPRegression(X, Y, device="meta"), "device"),
    (lambda: REG.predict(Z4, XM), "X_new"),
    (lambda: REG.log_joint(torch.zeros(4, dtype=torch.float64, device="meta")), "theta"),
    (lambda: gpvi.GPClassification(XM, YCM), "X"),
    (lambda: gpvi.GPClassifier().fit(XM, YC), "X"),
    (lambda: gpvi.GPClassifier().fit(X, YCM), "y"),
    (lambda: gpvi.GPClassifier().fit(X, YC, sample_weight=torch.ones(30, dtype=torch.float64, device="meta")),
     "sample_weight"),
    (lambda: gpvi.GPClassifier(device="meta").fit(X, YC), "device"),
])
def test_data_on_the_meta_device_is_a_value_error_naming_it(build, name):
    with pytest.raises(ValueError, match=rf"^{name}\b.*'meta'"):
        build()


def test_a_fitted_classifier_refuses_meta_inputs():
    clf = gpvi.GPClassifier(hyperparameters="fixed").fit(X, YC)
    with pytest.raises(ValueError, match=r"^X\b.*'meta'"):
        clf.predict_proba(XM)


@pytest.mark.parametrize("engine", [
    lambda: gpvi.DSVI(num_steps=5, seed=0, progress_bar=False),
    lambda: gpvi.SKGaussian(num_steps=5, seed=0, progress_bar=False),
    lambda: gpvi.NUTS(num_chains=1, num_warmup=5, num_draws=5, seed=0, progress_bar=False),
    lambda: gpvi.ML2(prior=True, seed=0, progress_bar=False),
])
def test_engines_refuse_a_target_on_the_meta_device(engine):
    with pytest.raises(ValueError, match=r"^target\.device 'meta'"):
        engine().run(_OnMeta())
