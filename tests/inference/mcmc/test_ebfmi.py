"""E-BFMI of NUTS chains: ArviZ's bfmi on the recorded transition energies; flags a funnel, not a Gaussian."""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pytest
import torch

import gpvi


def _run(fn, names, seed=0):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gpvi.NUTS(num_chains=2, num_warmup=150, num_draws=300, seed=seed, progress_bar=False).run(
            gpvi.Target(fn, names=names))


def test_energy_is_the_hamiltonian_and_ebfmi_matches_arviz():
    mc = _run(lambda th: -0.5 * (th ** 2).sum(-1), ["a", "b", "c"])
    E = mc.stats["energy"]
    assert E.shape == (2, 300) and bool(torch.isfinite(E).all())
    # H = U + K >= U = -lp of the start point, and for a standard normal target with unit-scale mass the mean
    # energy is E[U] + E[K] = D/2 + D/2 = D (up to the constant of U, here 0)
    assert abs(float(E.mean()) - 3.0) < 0.6
    np.testing.assert_allclose(mc.info["e_bfmi"], az.bfmi(mc.to_arviz()), rtol=1e-12)
    assert min(mc.info["e_bfmi"]) > 0.5 and not any("E-BFMI" in p for p in mc.info["problems"])


@pytest.mark.slow
def test_ebfmi_flags_neals_funnel():
    def funnel(z):
        v, x = z[..., 0], z[..., 1:]
        return -0.5 * v ** 2 / 9 - 0.5 * (x ** 2).sum(-1) * torch.exp(-v) - 0.5 * x.shape[-1] * v
    mc = _run(funnel, ["v"] + [f"x{i}" for i in range(9)])
    assert max(mc.info["e_bfmi"]) < 0.3
    assert any("E-BFMI" in p for p in mc.info["problems"])
