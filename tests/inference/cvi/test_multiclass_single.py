"""Single-site (doubly stochastic) multi-class CVI against the full-batch engine: same fixed point (softmax: the
unique optimum; robust-max: a fixed point of the full-batch map), factors kept current by rank-one updates (drift
against fresh factors), bit-for-bit resume, and the scikit-learn interface."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpvi.inference.cvi import SingleSite
from gpvi.inference.cvi.engine import CVI
from gpvi.inference.cvi.state import CVIState
from gpvi.models.multiclass import GPMulticlass
from gpvi.models.multiclass_likelihoods import RobustMax
from gpvi.sklearn import GPClassifier

F64 = torch.float64


def data(n: int = 48, seed: int = 0, classes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 2, generator=g, dtype=F64)
    y = (X[:, 0] > -0.5).long() + (X[:, 1] > 0.5).long()
    if classes == 4:
        y = y + (X[:, 0] > 1.0).long()
    return X, y


def full_run(model, **kw):
    return CVI(tol=1e-13, num_steps=3000, progress_bar=False, **kw).run(model)


def single_run(model, sweeps: int = 200, single_site: SingleSite | None = None, tol: float = 1e-13, **kw):
    ss = single_site if single_site is not None else SingleSite()
    steps = 1 + sweeps * ss.steps_per_sweep(model.num_data)
    return CVI(mode="stochastic", single_site=ss, tol=tol, num_steps=steps, progress_bar=False,
                         **kw).run(model)


@pytest.mark.parametrize("single_site", [SingleSite(), SingleSite(batch_size=5),
                                         SingleSite(batch_size=3, factor_update="generic")],
                         ids=["one-point-blocked", "five-points-blocked", "three-points-generic"])
def test_softmax_single_site_reaches_the_full_batch_optimum(single_site):
    model = GPMulticlass(*data())
    full = full_run(model)
    sto = single_run(model, single_site=single_site)
    assert sto.converged and sto.info["mode"] == "stochastic"
    assert abs(sto.elbo - full.elbo) <= 1e-8 * abs(full.elbo)
    assert float((sto.m - full.m).abs().max()) <= 1e-5
    assert float((sto.var - full.var).abs().max()) <= 1e-5
    # the in-place rank-one updates track the factors: drift against fresh factors at every refactorisation
    assert 0 < sto.info["max_drift"] <= 1e-9
    assert sto.info["refactorisations"] >= 2


def test_softmax_k4_fixed_rule_single_site_matches_full_batch():
    model = GPMulticlass(*data(40, seed=3, classes=4))
    full = full_run(model)
    sto = single_run(model, sweeps=150)
    assert full.info["estimator"] == sto.info["estimator"] == "fixed"
    assert abs(sto.elbo - full.elbo) <= 1e-8 * abs(full.elbo)
    assert float((sto.m - full.m).abs().max()) <= 1e-5


@pytest.mark.slow
def test_robustmax_single_site_ends_on_a_full_batch_fixed_point():
    """The robust-max bound has several fixed points (full-batch CVI from the prior stops at a lower one on this
    set); the single-site answer must be one of the full-batch map's fixed points. Its sites start on the
    precision floor, where rank-one updates would cancel: those steps refactorise (counted)."""
    model = GPMulticlass(*data(), likelihood=RobustMax(0.05))
    sto = single_run(model, sweeps=150, tol=1e-12)
    assert sto.converged
    again = CVI(tol=1e-13, num_steps=200, progress_bar=False).run(model, init=sto)
    assert abs(again.elbo - sto.elbo) <= 1e-9 * abs(sto.elbo)
    assert float((again.m - sto.m).abs().max()) <= 1e-5
    assert sto.info["unstable_updates"] > 0 and sto.info["max_drift"] <= 1e-8


def test_single_site_resume_is_bit_for_bit():
    model = GPMulticlass(*data(30, seed=5))
    eng = CVI(mode="stochastic", single_site=SingleSite(batch_size=2), tol=0, num_steps=70,
                        progress_bar=False, seed=4)
    whole = eng.run(model)
    part = CVI(mode="stochastic", single_site=SingleSite(batch_size=2), tol=0, num_steps=33,
                         progress_bar=False, seed=4).run(model)
    state = CVIState.from_state_dict(part.engine_state.state_dict())
    assert state.factor is not None and state.factor.mT.is_contiguous()
    resumed = eng.run(model, state=state)
    assert torch.equal(resumed.lam1, whole.lam1) and torch.equal(resumed.lam2, whole.lam2)
    assert resumed.engine_state.t == whole.engine_state.t == 70


@pytest.mark.parametrize("layout", ["row-major", "upper"])
@pytest.mark.parametrize("kind", ["binary", "multiclass"])
def test_state_from_dict_owns_its_factor_in_update_layout(kind, layout):
    """A loaded state's factor is a copy (the in-place rank-one updates must not reach the caller's dict) in
    contiguous upper storage, whatever the layout it was saved in; the site arrays keep their dimensions."""
    from gpvi.inference.cvi.state import CVIState

    cls, shape, fshape = ((CVIState, (5,), (5, 5)) if kind == "binary" else (CVIState, (5, 3), (3, 5, 5)))
    lower = torch.tril(torch.ones(fshape, dtype=F64))
    z = torch.zeros(shape, dtype=F64)
    st = cls(z, z.clone(), torch.zeros(2, dtype=F64), torch.Generator().manual_seed(0), factor=lower.clone())
    saved = st.state_dict()
    # row-major, as a hand-made dict would hold it; or already in the update layout (the loader copied nothing)
    saved["factor"] = lower.clone() if layout == "row-major" else lower.mT.contiguous().mT
    back = cls.from_state_dict(saved)
    assert back.factor.mT.is_contiguous() and torch.equal(back.factor, lower)
    back.factor.mul_(2.0)
    assert torch.equal(saved["factor"], lower)
    assert type(back.copy()) is cls and back.copy().lam1.shape == shape
    with pytest.raises(ValueError, match="lam"):
        cls.from_state_dict({**saved, "lam1": torch.zeros(5 if kind == "multiclass" else (5, 3), dtype=F64)})


def test_gpclassifier_stochastic_multiclass_matches_full_mode():
    X, y = data(45, seed=7)
    labels = np.array(["a", "b", "c"])[y.numpy()]
    kw = dict(hyperparameters="fixed", tol=1e-13, max_sweeps=300)
    full = GPClassifier(**kw).fit(X.numpy(), labels)
    sto = GPClassifier(mode="stochastic", batch_size=3, **kw).fit(X.numpy(), labels)
    assert sto.posterior_.info["mode"] == "stochastic" and sto.posterior_.info["batch_size"] == 3
    Xt = np.random.default_rng(0).uniform(-2, 2, (20, 2))
    assert np.abs(sto.predict_proba(Xt) - full.predict_proba(Xt)).max() <= 1e-5


def test_bad_single_site_settings_are_named():
    with pytest.raises(ValueError, match="mode must be one of"):
        CVI(mode="single")
    with pytest.raises(TypeError, match="single_site must be a gpvi.inference.cvi.SingleSite"):
        CVI(mode="stochastic", single_site=3)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        GPClassifier(mode="stochastic", batch_size=0).fit(np.random.rand(12, 2), np.arange(12) % 3)
