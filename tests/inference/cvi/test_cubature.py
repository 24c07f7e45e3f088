"""The cubature fixed point for q(theta) (gpvi.inference.cvi.cubature): the rule's moments against the standard
normal's (closed form), exact recovery of a Gaussian target, rejection where its check disagrees, and the classifier's
opt-in use with S&K after a rejection."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import gpvi
from gpvi.inference.cvi.bayes import FullyBayesianCVI
from gpvi.inference.cvi.cubature import CubatureGaussian, CubatureRejected, rule5, try_cubature
from gpvi.inference.init import init_to_value


@pytest.mark.parametrize("D", [1, 2, 3, 4])
def test_rule5_integrates_every_monomial_of_degree_5(D):
    """E[z^a] of N(0, I) for every multi-index |a| <= 5 (closed form: the product of the double factorials (a_i - 1)!!
    for even a_i, 0 if any is odd), to rounding; positive weights."""
    Z, W = rule5(D)
    assert bool((W > 0).all()) and Z.shape[0] == (2 * D * D + 1 if D < 4 else 2 * D * D - 2 * D + 1)

    def exact(a):
        out = 1.0
        for k in a:
            if k % 2:
                return 0.0
            out *= math.prod(range(k - 1, 0, -2)) if k else 1.0
        return out

    import itertools
    for a in itertools.product(range(6), repeat=D):
        if sum(a) <= 5:
            got = float((W * torch.prod(Z ** torch.tensor(a, dtype=torch.float64), -1)).sum())
            assert abs(got - exact(a)) < 1e-12, (a, got)
    with pytest.raises(ValueError, match="D <= 4"):
        rule5(5)


def gaussian_target(mu, Lam):
    return gpvi.Target(lambda th: -0.5 * (((th - mu) @ Lam) * (th - mu)).sum(-1), names=len(mu))


def test_a_gaussian_target_is_recovered_exactly_and_accepted():
    """For a Gaussian target the fixed point is the target itself after one step (the second step moves nothing),
    and the check proposes no move (linear gradient: exact regression)."""
    g = torch.Generator().manual_seed(1)
    A = torch.randn(3, 3, generator=g, dtype=torch.float64)
    Lam = A @ A.T + 0.5 * torch.eye(3, dtype=torch.float64)
    mu = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    q = CubatureGaussian().run(gaussian_target(mu, Lam), init_to_value(torch.zeros(3, dtype=torch.float64),
                                                                       0.3 * torch.eye(3, dtype=torch.float64)))
    assert (q.mean - mu).abs().max() < 1e-10 and (q.covariance - torch.linalg.inv(Lam)).abs().max() < 1e-10
    assert q.info["iterations"] == 2 and q.info["check_mean_sd"] < 1e-10 and q.info["check_log_sd"] < 1e-10
    assert q.info["log_joint_evals"] == 2 * 19 + 32


def test_a_heavy_tailed_target_is_rejected_by_the_check():
    """A Student-t with 1.5 degrees of freedom in one coordinate: the rule sees a different Gaussian than 32 Monte
    Carlo draws do, and the run raises CubatureRejected with the check's record (try_cubature: None and the record)."""
    def logp(th):
        return -1.25 * torch.log1p(th[..., 0] ** 2 / 1.5) - 0.5 * th[..., 1] ** 2

    target = gpvi.Target(logp, names=2)
    start = init_to_value(torch.zeros(2, dtype=torch.float64), torch.eye(2, dtype=torch.float64))
    with pytest.raises(CubatureRejected) as err:
        CubatureGaussian(check_tol=0.05).run(target, start)
    assert "check" in str(err.value) and err.value.details["converged"]
    q, rec = try_cubature(target, start)
    assert (q is None) == (not rec["accepted"]) and "check_mean_sd" in rec


def test_the_classifier_uses_it_only_when_asked():
    """FullyBayesianCVI(cubature=True) on a 1-D binary set (D = 2): the fit's engine is the cubature fixed point
    (or S&K after its rejection, recorded); the default never tries it (importance sampling, tried first by
    default, switched off for both)."""
    X = torch.linspace(-2, 2, 24, dtype=torch.float64).unsqueeze(-1)
    y = (X[:, 0] + 0.3 * torch.sin(7 * X[:, 0]) > 0).double()
    model = gpvi.GPClassification(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        post = FullyBayesianCVI(cubature=True, importance=False, num_draws=4).run(model)
        plain = FullyBayesianCVI(importance=False, num_draws=4).run(model)
    rec = post.info["cubature"]
    assert post.info["engine"] == ("CubatureGaussian" if rec["accepted"] else "SKGaussian")
    assert plain.info["cubature"] is None and plain.info["engine"] == "SKGaussian"
    if rec["accepted"]:
        assert ((post.mean - plain.mean).abs() / plain.std).max() < 0.5     # the same Gaussian, roughly
