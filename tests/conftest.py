"""Shared fixtures. Tests never touch the global RNG: randomness comes from seeded generators."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


@pytest.fixture
def generator() -> torch.Generator:
    """A seeded CPU generator (fresh for every test)."""
    return torch.Generator().manual_seed(1234)


def make_gp_data(n: int = 40, d: int = 2, *, seed: int = 0, noise: float = 0.1):
    """Small synthetic regression data: y = sin(3 x_0) + 0.5 x_1^2 + noise, float64."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand((n, d), generator=g, dtype=torch.float64) * 2 - 1
    f = torch.sin(3 * X[:, 0]) + (0.5 * X[:, 1] ** 2 if d > 1 else 0.0)
    y = f + noise * torch.randn(n, generator=g, dtype=torch.float64)
    return X, y


@pytest.fixture
def gp_data():
    return make_gp_data()
