"""Multi-class fully Bayesian CVI: the profiled multi-class bound as a target over theta, and q(theta) on it."""

from __future__ import annotations

import pytest
import torch

from gpvi.inference.cvi.bayes import FullyBayesianCVI
from gpvi.inference.cvi.engine import CVI
from gpvi.inference.cvi.typeii import TypeII
from gpvi.inference.salimans_knowles import SKGaussian
from gpvi.models.multiclass import GPMulticlass
from gpvi.inference.cvi.bound import CVIBoundTarget
from gpvi.inference.cvi.ep_evidence import EPEvidenceTarget

F64 = torch.float64


def _model(n: int = 18) -> GPMulticlass:
    X = torch.linspace(-2, 2, n, dtype=F64)[:, None]
    y = (X[:, 0] > -0.7).long() + (X[:, 0] > 0.7).long()
    y[[2, 9]] = torch.tensor([1, 2])                                # not separable: a finite MAP-II point
    return GPMulticlass(X, y)


@pytest.fixture(scope="module")
def map_fit():
    model = _model()
    return model, TypeII(CVI(progress_bar=False)).run(model)


def test_bound_is_the_type_ii_objective_with_a_finite_difference_exact_envelope_gradient(map_fit):
    """At the MAP-II point: the target's value is TypeII's objective (both with the cheaper inner rule
    against the engine's: within 1e-5) and its gradient vanishes; away from it, autograd's envelope gradient
    matches central differences of the re-converged bound."""
    model, post = map_fit
    tg = CVIBoundTarget(model, anchor=post)
    th = post.theta.clone().requires_grad_(True)
    val = tg.log_joint(th)
    (g,) = torch.autograd.grad(val, th)
    assert float(val.detach()) == pytest.approx(post.info["objective"], abs=1e-5)
    assert float(g.abs().max()) < 1e-3
    at = post.theta + torch.tensor([0.4, -0.3], dtype=F64)
    th = at.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(tg.log_joint(th), th)
    h = 1e-4
    fd = torch.stack([(tg.log_joint(at + h * e) - tg.log_joint(at - h * e)) / (2 * h) for e in torch.eye(2, dtype=F64)])
    torch.testing.assert_close(g, fd, rtol=1e-5, atol=1e-6)
    assert float(tg.log_joint(at)) < float(tg.log_joint(post.theta))


def test_bound_rows_and_bad_arguments(map_fit):
    model, post = map_fit
    tg = CVIBoundTarget(model, anchor=post)
    vals = tg.log_joint(torch.stack([post.theta, torch.tensor([float("nan"), 0.0], dtype=F64)]))
    assert torch.isfinite(vals[0]) and vals[1] == -float("inf")
    assert tg.names == model.names and tg.dim == 2
    with pytest.raises(TypeError, match="GPMulticlass"):
        CVIBoundTarget(object())
    with pytest.raises(TypeError, match="CVI"):
        CVIBoundTarget(model, cvi="cvi")
    with pytest.raises(ValueError, match="anchor sites"):
        tg.set_anchor(post.theta, torch.zeros(3, 3, dtype=F64), -torch.ones(3, 3, dtype=F64))


def test_fully_bayesian_multiclass_is_seeded_and_predicts_k_columns(map_fit):
    """A short S&K run on the multi-class bound (evidence='cvi'): seeded (bit for bit), the evidence is the bound, probabilities
    have K columns summing to 1 and average the per-draw posteriors' probabilities."""
    model, post = map_fit

    def fit():
        sk = SKGaussian(num_steps=16, method="gradient", num_draws=2, num_elbo_draws=10, seed=0, progress_bar=False)
        return FullyBayesianCVI(sk, num_draws=4, seed=0, evidence="cvi").run(model, init=post)

    a, b = fit(), fit()
    assert a.info["evidence"] == "cvi" and torch.equal(a.mean, b.mean)
    Xs = torch.tensor([[-1.5], [0.0], [1.7]], dtype=F64)
    p = a.predict_proba(Xs)
    assert p.shape == (3, 3) and torch.allclose(p.sum(-1), torch.ones(3, dtype=F64))
    torch.testing.assert_close(p, torch.stack([lp.predict_proba(Xs) for lp in a.latents]).mean(0))
    assert a.predict(Xs).tolist() == [0, 1, 2]
    m, v = a.predict_latent(Xs)
    assert m.shape == v.shape == (3, 3) and bool((v > 0).all())


def test_fully_bayesian_multiclass_on_ep_evidence_starts_at_the_ep_map_point(map_fit):
    """evidence='ep' on a 3-class softmax model: q(theta) on multi-class EP's log Z_EP, started at its MAP point
    (a stationary point of log Z_EP + log prior, not below the CVI MAP-II point there); seeded; EP warm-started from
    the anchor's sites gives the same value as EP from the prior's sites."""
    from gpvi.numerics.ep_multiclass import multiclass_ep
    from gpvi.inference.cvi.ep_evidence import EPEvidenceTarget

    model, post = map_fit

    def fit():
        sk = SKGaussian(num_steps=8, method="gradient", num_draws=2, num_elbo_draws=10, seed=0, progress_bar=False)
        return FullyBayesianCVI(sk, num_draws=2, seed=0, evidence="ep").run(model, init=post)

    a, b = fit(), fit()
    assert a.info["evidence"] == "ep" and a.info["ep_counters"]["failures"] == 0 and torch.equal(a.mean, b.mean)
    bound = CVIBoundTarget(model)
    bound.set_anchor(post.theta, post.lam1, post.lam2)
    target = EPEvidenceTarget(bound)
    theta = torch.tensor(a.info["ep_map_theta"], dtype=F64).requires_grad_(True)
    (grad,) = torch.autograd.grad(target.log_joint(theta), theta)
    assert float(grad.abs().max()) < 1e-3
    assert a.info["ep_map_objective"] >= float(target.log_joint(torch.tensor(a.info["map_theta"], dtype=F64))) - 1e-9
    cold = multiclass_ep(model.kernel_matrix(theta.detach()), model.y, 3, quadrature=bound.cvi.quadrature,
                         tol=1e-10, max_sweeps=1000)
    assert abs(float(target.bound_and_grad(theta.detach()[None])[0][0]) - float(cold.log_z)) < 1e-6
    assert a.predict_proba(model.X[:4]).shape == (4, 3)


def test_fully_bayesian_multiclass_refuses_settings_that_do_not_fit(map_fit):
    model, _ = map_fit
    with pytest.raises(ValueError, match="needs the softmax likelihood"):
        FullyBayesianCVI(evidence="ep").run(GPMulticlass(model.X, model.y, likelihood="robustmax"))
    with pytest.raises(TypeError, match="CVI"):
        FullyBayesianCVI(cvi=object()).run(model)


def test_auto_evidence_is_ep_where_multiclass_ep_applies(map_fit):
    """evidence='auto': multi-class EP for the softmax with any K (K >= 4 with the quasi-Monte Carlo tilted
    moments), the CVI bound for robust-max; an explicit choice is kept."""
    model, _ = map_fit
    X4 = torch.linspace(-2, 2, 16, dtype=F64)[:, None]
    auto = FullyBayesianCVI()
    assert auto._setup(model)[1] == "ep"
    assert auto._setup(GPMulticlass(model.X, model.y, likelihood="robustmax"))[1] == "cvi"
    assert auto._setup(GPMulticlass(X4, torch.arange(16) % 4))[1] == "ep"
    assert FullyBayesianCVI(evidence="cvi")._setup(model)[1] == "cvi"


def test_accelerated_inner_runs_give_the_plain_runs_bound_and_gradient(map_fit):
    """CVIBoundTarget(anderson=5) (the default) against anderson=0: the same values to 1e-8 relative and
    gradients to 1e-5 at rows away from the anchor, in fewer inner steps."""
    model, post = map_fit
    g = torch.Generator().manual_seed(0)
    th = post.theta + 0.7 * torch.randn(4, model.dim, generator=g, dtype=F64)
    fast, plain = CVIBoundTarget(model, anchor=post), CVIBoundTarget(model, anchor=post, anderson=0)
    vf, gf = fast.bound_and_grad(th)
    vp, gp = plain.bound_and_grad(th)
    torch.testing.assert_close(vf, vp, rtol=1e-8, atol=0)
    torch.testing.assert_close(gf, gp, rtol=1e-5, atol=1e-6)
    assert fast.counters["inner_steps"] < plain.counters["inner_steps"]
    with pytest.raises(ValueError, match="anderson"):
        CVIBoundTarget(model, anderson=-1)


@pytest.mark.slow
def test_fully_bayesian_four_classes_run_on_ep_evidence():
    """K = 4 (refused before multi-class EP had its quasi-Monte Carlo tilted moments): evidence 'auto' is EP, the
    run is seeded (two runs give the same q), EP never fails, the engine starts where the EP target's gradient
    vanishes, and the predictive has 4 columns."""
    X = torch.linspace(-2, 2, 16, dtype=F64)[:, None]
    y = (X[:, 0] > -1.0).long() + (X[:, 0] > 0.0).long() + (X[:, 0] > 1.0).long()
    y[5] = 3
    model = GPMulticlass(X, y)

    def fit():
        sk = SKGaussian(num_steps=8, method="gradient", num_draws=2, num_elbo_draws=10, seed=0, progress_bar=False)
        return FullyBayesianCVI(sk, num_draws=2, seed=0).run(model)

    a, b = fit(), fit()
    assert a.info["evidence"] == "ep" and a.info["ep_counters"]["failures"] == 0 and torch.equal(a.mean, b.mean)
    bound = CVIBoundTarget(model)
    bound.set_anchor(torch.tensor(a.info["map_theta"], dtype=F64))
    theta = torch.tensor(a.info["ep_map_theta"], dtype=F64).requires_grad_(True)
    (grad,) = torch.autograd.grad(EPEvidenceTarget(bound).log_joint(theta), theta)
    assert float(grad.abs().max()) < 1e-3
    p = a.predict_proba(X[:5])
    assert p.shape == (5, 4) and torch.allclose(p.sum(1), torch.ones(5, dtype=F64))
