"""The compiled NUTS trees (gpvi.inference.mcmc.trees) against the NumPy kernel, bit for bit.

With numba installed, gpvi.NUTS hands each transition of a diagonal-metric run to one compiled call a round for all
chains; the NumPy kernel (gpvi.inference.mcmc.kernel.nuts_transition) is the reference it must repeat exactly: the
same draws, statistics and generator states after warm-up and sampling, on a GP's closed form, a correlated
Gaussian, trees cut at their largest depth, divergent transitions and a density with a region of zero density.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import gpvi
from gpvi.inference.mcmc import NUTS, Adaptation
from gpvi.inference.mcmc import nuts as nuts_module
from gpvi.inference.mcmc import trees
from gpvi.inference.mcmc.kernel import Uniforms

pytestmark = pytest.mark.skipif(trees.compiled() is None, reason="numba is not installed")

F64 = {"dtype": torch.float64}


def _gp():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(25, 2, generator=g, **F64)
    y = torch.sin(4 * X[:, 0]) + 0.5 * X[:, 1] + 0.2 * torch.randn(25, generator=g, **F64)
    return gpvi.GPRegression(X, y)


def _gaussian():
    A = torch.tensor([[1.0, 0.9, 0.0], [0.9, 1.0, 0.3], [0.0, 0.3, 4.0]], **F64)
    P = torch.linalg.inv(A)
    return gpvi.Target(lambda th: -0.5 * ((th @ P) * th).sum(-1), names=["a", "b", "c"])


def _cliff():
    """A Gaussian with zero density beyond 1.5 in its first coordinate: transitions that step there diverge."""
    def lj(th):
        v = -0.5 * (th * th).sum(-1)
        return torch.where(th[..., 0] < 1.5, v, torch.full_like(v, -math.inf))
    return gpvi.Target(lj, names=["a", "b"])


def _run_both(monkeypatch, target, **kw):
    """The same seeded run with the compiled trees and with the NumPy kernel."""
    out = []
    for compiled in (trees.compiled, lambda: None):
        monkeypatch.setattr(nuts_module, "compiled", compiled)
        used = []
        real = trees.Trees.begin

        def begin(self, r, req, real=real, used=used):
            used.append(r)
            return real(self, r, req)
        monkeypatch.setattr(trees.Trees, "begin", begin)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            post = NUTS(**{"num_chains": 3, "num_warmup": 60, "num_draws": 40, "seed": 5, "progress_bar": False,
                           **kw}).run(target)
        out.append((post, len(used)))
    (a, na), (b, nb) = out
    assert na > 0 and nb == 0, "the first run compiled, the second did not"
    return a, b


def _assert_same(a, b):
    assert torch.equal(a.draws, b.draws)
    assert a.stats.keys() == b.stats.keys()
    for k in a.stats:
        assert torch.equal(a.stats[k], b.stats[k]), k
    for x, y in zip(a.engine_state.chains, b.engine_state.chains):
        assert torch.equal(x.warmup_draws, y.warmup_draws)
        assert x.step_size == y.step_size
        assert torch.equal(x.inverse_mass_matrix, y.inverse_mass_matrix)
        assert torch.equal(x.rng_state, y.rng_state)
        assert x.num_evaluations == y.num_evaluations


@pytest.mark.parametrize("name", ["gp", "gaussian"])
def test_compiled_trees_repeat_the_numpy_kernel_bit_for_bit(monkeypatch, name):
    a, b = _run_both(monkeypatch, _gp() if name == "gp" else _gaussian())
    _assert_same(a, b)
    assert a.stats["n_steps"].float().mean() > 3                      # real trees, not single steps


def test_trees_cut_at_the_largest_depth_and_tiny_steps(monkeypatch):
    a, b = _run_both(monkeypatch, _gaussian(), max_tree_depth=3, step_size=1e-3,
                     adaptation=Adaptation(adapt_step_size=False))
    _assert_same(a, b)
    assert (a.stats["tree_depth"] == 3).all()


def test_divergent_transitions_and_zero_density(monkeypatch):
    a, b = _run_both(monkeypatch, _cliff(), step_size=2.0, adaptation=Adaptation(adapt_step_size=False))
    _assert_same(a, b)
    assert a.stats["diverging"].any() and not a.stats["diverging"].all()
    assert (a.draws[..., 0] < 1.5).all()


def test_dense_metric_and_deep_limits_use_the_numpy_kernel(monkeypatch):
    for kw in ({"adaptation": Adaptation(dense_mass=True)}, {"max_tree_depth": trees.MAX_DEPTH + 1}):
        used = []
        monkeypatch.setattr(trees.Trees, "begin", lambda self, r, req: used.append(r))
        NUTS(num_chains=2, num_warmup=5, num_draws=5, progress_bar=False, **kw).run(_gaussian())
        assert used == []


def test_the_numba_switch_is_0_or_1(monkeypatch):
    for value, on in (("0", False), ("1", True), (" 1 ", True)):
        monkeypatch.setenv("GPVI_NUMBA", value)
        trees.compiled.cache_clear()
        assert (trees.compiled() is not None) is on
    monkeypatch.setenv("GPVI_NUMBA", "false")
    trees.compiled.cache_clear()
    with pytest.raises(ValueError, match="GPVI_NUMBA"):
        trees.compiled()
    monkeypatch.delenv("GPVI_NUMBA")
    trees.compiled.cache_clear()
    assert trees.compiled() is not None


@pytest.mark.parametrize("seed", range(4))
def test_uniforms_ahead_then_advance_is_the_lazy_stream(seed):
    """Draws through ahead/advance leave the stream exactly where one-by-one uniform() calls leave it."""
    rng = np.random.default_rng(seed)
    lazy, fast = Uniforms(torch.Generator().manual_seed(seed)), Uniforms(torch.Generator().manual_seed(seed))
    for _ in range(30):
        op = rng.integers(3)
        if op == 0:
            assert np.array_equal(lazy.normal(4), fast.normal(4))
        elif op == 1:
            used = int(rng.choice([0, 1, 5, 63, 64, 65, 130, 200]))
            want = [lazy.uniform() for _ in range(used)]
            got = fast.ahead(5)[:used].tolist()
            fast.advance(used)
            assert got == want
        else:
            lazy.reset()
            fast.reset()
        assert lazy.uniform() == fast.uniform()
        assert torch.equal(lazy.g.get_state(), fast.g.get_state())
