"""``gpvi.posteriors.diagnostics`` against ArviZ, including ArviZ's Numba path under NumPy >= 2.5.

On the device machine (ArviZ 0.23.4, Numba, NumPy 2.5.2) ``arviz.mcse`` returned ``(1,)`` arrays for the mean and
raised ``TypeError`` for the sd (``float`` of a one-element array); every NUTS run then failed at its diagnostics.
These tests imitate that ArviZ and check that the values are still ArviZ's own.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpvi.posteriors.diagnostics import DIAGNOSTICS, diagnostics, mcse_sd

az = pytest.importorskip("arviz")


def _draws(seed=0, C=4, S=300, D=3):
    g = torch.Generator().manual_seed(seed)
    walk = 0.05 * torch.randn(C, S, D, generator=g, dtype=torch.float64).cumsum(1)     # autocorrelated
    return walk + torch.randn(C, S, D, generator=g, dtype=torch.float64)


def _arviz_mcse_sd(a):
    """``arviz.mcse(a, method="sd")`` by ArviZ's NumPy code: with numba installed (the ``test`` extra has it, for
    gpvi's compiled NUTS trees) ArviZ takes its numba path, which raises on NumPy 2 (what ``mcse_sd`` survives)."""
    on = az.Numba.numba_flag
    az.Numba.disable_numba()
    try:
        return az.mcse(a, method="sd")
    finally:
        if on:
            az.Numba.enable_numba()


def test_matches_arviz_per_parameter():
    x = _draws()
    out = diagnostics(x)
    a = x[:, :, 1].numpy()
    ref = (az.ess(a, method="bulk"), az.ess(a, method="tail"), az.rhat(a), az.mcse(a), _arviz_mcse_sd(a))
    for k, r in zip(DIAGNOSTICS, ref):
        assert float(out[k][1]) == pytest.approx(np.asarray(r).item(), rel=1e-12)   # (1,) on ArviZ's numba path


class _NumbaArviz:
    """ArviZ as it behaved with Numba under NumPy 2.5: (1,) arrays, and a TypeError from ``mcse(method="sd")``."""

    def __getattr__(self, name):
        return getattr(az, name)

    def mcse(self, a, method="mean"):
        if method == "sd":
            raise TypeError("only 0-dimensional arrays can be converted to Python scalars")
        return np.atleast_1d(az.mcse(a, method=method))

    def ess(self, a, method="bulk"):
        return np.atleast_1d(az.ess(a, method=method))


def test_mcse_sd_fallback_is_arvizs_formula():
    a = _draws(seed=1)[:, :, 0].numpy()
    assert mcse_sd(_NumbaArviz(), a) == pytest.approx(float(_arviz_mcse_sd(a)), rel=1e-12)


def test_diagnostics_survive_numba_arviz(monkeypatch):
    import sys

    x = _draws(seed=2)
    want = diagnostics(x)
    monkeypatch.setitem(sys.modules, "arviz", _NumbaArviz())
    got = diagnostics(x)
    for k in DIAGNOSTICS:
        torch.testing.assert_close(got[k], want[k], rtol=1e-12, atol=0.0)
