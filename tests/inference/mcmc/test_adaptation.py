"""Warm-up adaptation pieces against independent answers: Stan's documented windows, NumPy's covariance, and dual
averaging reaching the step size whose acceptance is the target on a target where that step size is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpvi.inference.mcmc.adaptation import DualAveraging, Welford, Windows, draws_and_gradients_diagonal


@pytest.mark.parametrize("W, ends", [(1000, [100, 150, 250, 450, 950]),   # Stan's defaults: 75 / 25 / 50
                                     (500, [100, 150, 450]),
                                     (100, [90])])                      # short: 15 % / 75 % / 10 %
def test_windows_are_stans(W, ends):
    w = Windows(W)
    assert w.ends == ends
    assert not w.collects(w.start - 1) and w.collects(w.start) and not w.collects(w.stop)


@pytest.mark.parametrize("dense", [False, True])
def test_welford_matches_numpy_with_stans_shrinkage(dense):
    x = np.random.default_rng(0).normal(size=(40, 3)) @ np.array([[1.0, 0.5, 0], [0, 2.0, 0], [0, 0, 0.3]])
    w = Welford(3, dense)
    for row in x:
        w.add(row)
    cov = np.cov(x.T)
    want = (40 / 45) * (cov if dense else np.diag(cov)) + 1e-3 * (5 / 45) * (np.eye(3) if dense else 1.0)
    assert np.allclose(w.inverse_mass(), want, rtol=1e-12, atol=1e-15)


def test_dual_averaging_finds_the_step_size_of_the_target_acceptance():
    # acceptance a(eps) = exp(-eps): the step size with acceptance 0.8 is -log 0.8; the averaged iterate approaches
    # it as t^(-1/4)-weighted history fades (measured: 2.6 % off after 500 updates, 1.3 % after 2,000)
    want = -math.log(0.8)
    errors = []
    for n in (500, 2000):
        da = DualAveraging(1.0, 0.8)
        for _ in range(n):
            da.update(math.exp(-da.eps))
        errors.append(abs(da.final / want - 1))
    assert errors[1] < 0.02 and errors[1] < errors[0] < 0.04


def test_draws_and_gradients_diagonal_is_the_covariance_of_a_diagonal_gaussian():
    """For x ~ N(m, diag(s^2)) the log-density gradient is -(x - m) / s^2, so sqrt(Var x / Var g) = s^2 exactly
    (whatever the draws), shrunk as Stan's; a coordinate whose gradient never varies keeps the draws' variance."""
    s2 = np.array([1e-4, 1.0, 900.0, 4.0])
    x = np.random.default_rng(1).normal(size=(30, 4)) * np.sqrt(s2) + 3.0
    g = -(x - 3.0) / s2
    g[:, 3] = 0.7                                                 # a flat direction of the log density
    wx, wg = Welford(4, False), Welford(4, False)
    for a, b in zip(x, g):
        wx.add(a)
        wg.add(b)
    got = draws_and_gradients_diagonal(wx, wg)
    want = (30 / 35) * np.array([*s2[:3], np.var(x[:, 3], ddof=1)]) + 1e-3 * 5 / 35
    assert np.allclose(got, want, rtol=1e-10, atol=0)
    assert np.allclose(wx.inverse_mass()[:3], got[:3], rtol=0.6) and not np.allclose(wx.inverse_mass(), got)
