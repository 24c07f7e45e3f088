"""Units of the inputs: the type-II box moves with each input's scale (so ML-II and the 'scaled' prior give the same
predictions whatever the units), and the default prior, centred at unit lengthscales, warns on inputs far from unit
scale. Checked against the unscaled fit (exact equivariance), closed forms of the box, and L-BFGS-B on a quadratic."""

from __future__ import annotations

import math
import warnings

import gpytorch
import numpy as np
import pytest
import torch

import gpvi
from gpvi.numerics.lbfgs import lbfgs_maximise
from gpvi.models.whitened import WhitenedLatentGP
from gpvi.sklearn import GPClassifier
from tests.conftest import iris_rows

F64 = torch.float64


def two_inputs(n=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn((n, 2), generator=g, dtype=F64)
    y = (torch.rand(n, generator=g, dtype=F64) < torch.sigmoid(4 * X[:, 0] - 2 * X[:, 1])).to(F64)
    return X, y


@pytest.mark.parametrize("prior", [None, "scaled"])
def test_ml_ii_and_the_scaled_prior_give_the_same_answer_in_any_units(prior):
    """Before 2026-11-25 the box was (-11.5, 11.5) in absolute units: inputs x 1e3 ran the lengthscales into it
    (ripley, 100 rows: test log loss 0.2755 -> 0.4038 for ML-II) and x 1e5 predicted 1/2 everywhere."""
    X, y = two_inputs()
    Xt, _ = two_inputs(40, seed=1)
    ref = GPClassifier(prior=prior).fit(X, y)
    p_ref = ref.predict_proba(Xt)
    for s in (torch.tensor([1e3, 1e3]), torch.tensor([1e-3, 1e5]), torch.tensor([7.0, 0.02])):
        s = s.to(F64)
        with warnings.catch_warnings():
            warnings.simplefilter("error")               # no InputScaleWarning: these priors do not assume units
            clf = GPClassifier(prior=prior).fit(X * s, y)
        np.testing.assert_allclose(clf.predict_proba(Xt * s), p_ref, atol=1e-6)
        shift = torch.cat([2 * torch.log(s), torch.zeros(1, dtype=F64)])
        torch.testing.assert_close(clf.theta_, ref.theta_ + shift, atol=1e-4, rtol=0)


def test_multiclass_ml_ii_is_unit_free_too():
    X2, y2, X = iris_rows(30)
    ref = GPClassifier(prior=None, num_quadrature=20).fit(X2, y2)
    s = np.array([1e4, 1e-3])
    clf = GPClassifier(prior=None, num_quadrature=20).fit(X2 * s, y2)
    np.testing.assert_allclose(clf.predict_proba(X[:20] * s), ref.predict_proba(X[:20]), atol=1e-6)


def test_the_box_follows_each_inputs_variance():
    X, y = two_inputs(30)
    s = torch.tensor([10.0, 0.1], dtype=F64)
    model = gpvi.GPClassification(X * s, y)
    lo, hi = model.theta_box((-11.5, 11.5))
    var = (X * s).var(0, unbiased=False)
    torch.testing.assert_close(lo, torch.cat([torch.log(var), torch.zeros(1, dtype=F64)]) - 11.5)
    torch.testing.assert_close(hi - lo, torch.full((3,), 23.0, dtype=F64))
    # a lengthscale shared by the inputs is measured against their mean variance
    iso = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
    m_iso = gpvi.GPClassification(X * s, y, kernel=iso)
    shift = m_iso.log_input_scale()
    j = m_iso.names.index(next(n for n in m_iso.names if "lengthscale" in n))
    assert float(shift[j]) == pytest.approx(math.log(float(var.mean())), rel=1e-12)
    assert float(shift.abs().sum() - shift[j].abs()) == 0.0


def test_the_default_prior_warns_on_inputs_far_from_unit_scale():
    X, y = two_inputs(30)
    with pytest.warns(gpvi.exceptions.InputScaleWarning, match=r"log_lengthscale_sq\[0\] has variance 7.79e\+05"):
        GPClassifier().fit(X * torch.tensor([1e3, 1.0], dtype=F64), y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GPClassifier().fit(X * 3.0, y)      # sd 3: inside [0.1, 10], no warning


def test_the_nuts_baseline_warns_as_the_fits_do_under_the_default_prior():
    """WhitenedLatentGP (the NUTS baseline) resolves its prior as type-II and the fully Bayesian fit do: the default
    (``None`` or ``"default"``) warns on inputs far from unit scale; ``"scaled"`` does not."""
    X, y = two_inputs(30)
    far = gpvi.GPClassification(X * torch.tensor([1e3, 1.0], dtype=F64), y)
    for prior in (None, "default"):
        with pytest.warns(gpvi.exceptions.InputScaleWarning, match=r"log_lengthscale_sq\[0\] has variance 7.79e\+05"):
            target = WhitenedLatentGP(far, prior)
        torch.testing.assert_close(target.prior.mean, torch.zeros(far.dim, dtype=F64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        WhitenedLatentGP(far, "scaled")
        WhitenedLatentGP(gpvi.GPClassification(X * 3.0, y))


def test_lbfgs_takes_a_box_per_component():
    def quad(x):
        return -((x - 3.0) ** 2).sum()

    res = lbfgs_maximise(quad, torch.zeros(3, dtype=F64), bounds=(np.array([0.0, -1.0, 4.0]),
                                                                   torch.tensor([1.0, 5.0, 6.0])))
    np.testing.assert_allclose(res.x.numpy(), [1.0, 3.0, 4.0], atol=1e-8)
    with pytest.raises(ValueError, match="shape \\(3,\\)"):
        lbfgs_maximise(quad, torch.zeros(3, dtype=F64), bounds=(np.zeros(2), np.ones(2)))
    with pytest.raises(ValueError, match="low < high"):
        lbfgs_maximise(quad, torch.zeros(2, dtype=F64), bounds=(np.zeros(2), np.array([1.0, 0.0])))
    with pytest.raises(ValueError, match="finite"):
        lbfgs_maximise(quad, torch.zeros(2, dtype=F64), bounds=(np.zeros(2), np.array([1.0, np.inf])))


def test_a_constant_column_has_no_scale_and_no_warning():
    """A constant input (ionosphere's second column) has no scale: its coordinate is 0, and the default prior does
    not warn about it (it did, with variance 145, the constant column's start rule, before this was fixed)."""
    X, y = two_inputs(30)
    Xc = torch.cat([X, torch.full((30, 1), 5.0, dtype=F64)], dim=1)
    model = gpvi.GPClassification(Xc, y)
    shift = model.log_input_scale()
    assert float(shift[2]) == 0.0
    torch.testing.assert_close(shift[:2], torch.log(X.var(0, unbiased=False)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GPClassifier().fit(Xc, y)
