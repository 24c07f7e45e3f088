"""The NUTS tree's pieces against their definitions, bit for bit, and the potential's failed-row handling.

The tree code (gpvi.inference.mcmc.kernel) writes the leapfrog step out inside each leaf and the no-U-turn checks
out inside each merge, and the potential (gpvi.inference.mcmc.chains.Potential) checks a whole batch for
non-finite numbers as a whole before it looks at rows: these tests hold each shortcut to the plain form.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import gpvi
from gpvi.inference.mcmc.chains import Potential
from gpvi.inference.mcmc.kernel import Metric, Uniforms, _Integrator, _leapfrog, _merge, _Tree


def _answer(gen, lp, g):
    """Drive a generator that asks once; its return value."""
    next(gen)
    with pytest.raises(StopIteration) as stop:
        gen.send((lp, g))
    return stop.value.value


@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("forward", [True, False])
def test_a_leaf_is_one_leapfrog_step(forward, dense):
    rng = np.random.default_rng(0)
    d = 5
    inv = np.diag(rng.uniform(0.5, 2.0, d)) if dense else rng.uniform(0.5, 2.0, d)
    if dense:
        inv = inv + 0.1 * np.ones((d, d))
    metric = Metric(inv)
    z, r, g, g1 = (rng.standard_normal(d) for _ in range(4))
    lp1, eps, h0 = -1.3, 0.37, 2.1
    leaf = _answer(_Integrator(eps, metric, h0).leaf(z, r, g, forward), lp1, g1)
    z_ref, r_ref, _, _ = _answer(_leapfrog(z, r, g, eps if forward else -eps, metric), lp1, g1)
    ps = metric.velocity(r_ref)
    delta = -lp1 + 0.5 * float(r_ref @ ps) - h0
    assert np.array_equal(leaf.z, z_ref) and np.array_equal(leaf.rl, r_ref) and np.array_equal(leaf.psr, ps)
    assert leaf.logw == -delta and leaf.accept == math.exp(min(0.0, -delta)) and leaf.lp == lp1


def _tree(rng, d):
    v = [rng.standard_normal(d) for _ in range(9)]
    return _Tree(*v, rng.standard_normal(), v[0], 0.0, v[2], n=1, accept=0.5)


def test_merge_turns_exactly_when_a_no_u_turn_check_fails():
    """Betancourt's criterion on the merged tree and across the seam (Stan >= 2.26), written plainly."""
    def no_uturn(a, b, rho):
        return float(a @ rho) > 0.0 and float(b @ rho) > 0.0

    rng = np.random.default_rng(1)
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(400):
        old, new = _tree(rng, 3), _tree(rng, 3)
        forward = bool(rng.integers(2))
        left, right = (old, new) if forward else (new, old)
        rho = left.rho + right.rho
        expected = not (no_uturn(left.psl, right.psr, rho) and no_uturn(left.psl, right.psl, left.rho + right.rl)
                        and no_uturn(left.psr, right.psr, right.rho + left.rr))
        merged = _merge(old, new, forward, bool(rng.integers(2)), Uniforms(gen))
        assert merged.turning == expected
        assert np.array_equal(merged.rho, rho) and merged.psl is left.psl and merged.psr is right.psr
        seen.add(expected)
    assert seen == {True, False}


def test_the_potential_flags_failed_rows_whichever_way_it_checks():
    """Finite rows, a non-finite row, a row where the density is -inf, and huge finite rows: values, gradients and
    flags as row by row."""
    def f(th):
        lj = -0.5 * (th ** 2).sum(-1) * 1e-300
        return torch.where(th[..., 0] > 0, lj, torch.full_like(lj, -math.inf))

    pot = Potential(gpvi.Target(f, ["a", "b"]))
    Z = np.array([[1.0, 2.0], [0.5, -1.0]])
    lp, grad, bad = pot(Z)
    assert not bad.any() and np.allclose(lp, [-2.5e-300, -0.625e-300], rtol=1e-12, atol=0)
    for Z, want in ((np.array([[1.0, 2.0], [np.nan, 1.0]]), [False, True]),
                    (np.array([[1.0, 2.0], [-1.0, 1.0]]), [False, True]),
                    (np.array([[1e150, -1e150], [1.0, 0.0]]), [False, False])):
        lp, grad, bad = pot(Z)
        assert bad.tolist() == want
        for i, b in enumerate(want):
            if b:
                assert lp[i] == -math.inf and not grad[i].any()
            else:
                t = torch.tensor(Z[i], dtype=torch.float64, requires_grad=True)
                (gi,) = torch.autograd.grad(f(t.unsqueeze(0)).sum(), t)
                assert lp[i] == float(f(t.detach().unsqueeze(0))[0]) and np.array_equal(grad[i], gi.numpy())
