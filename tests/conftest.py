"""Shared fixtures. Tests never touch the global RNG: randomness comes from seeded generators."""

from __future__ import annotations

import math
import os

import numpy as np
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


TWO_BASIN_WEIGHTS = torch.tensor([0.3, 0.7], dtype=torch.float64)
TWO_BASIN_CENTERS = torch.tensor([[-1.5, 0.0], [1.5, 0.0]], dtype=torch.float64)
TWO_BASIN_SDS = torch.tensor([0.25, 0.6], dtype=torch.float64)


class TwoBasins:
    """p(theta) = 0.3 N((-1.5, 0), 0.25^2 I) + 0.7 N((1.5, 0), 0.6^2 I), normalised (log Z = 0).

    The lighter component has the higher peak (log density -0.27 against -1.17), so it is the MAP; the heavier
    one carries the better Gaussian bound (log 0.7 = -0.357 against log 0.3 = -1.204). ``initial_theta`` sits
    where 5 seeded MAP restarts (seed 0) reach both components.
    """

    names = ["a", "b"]

    def log_joint(self, theta: torch.Tensor) -> torch.Tensor:
        d = theta.unsqueeze(-2) - TWO_BASIN_CENTERS
        comp = (-0.5 * (d ** 2).sum(-1) / TWO_BASIN_SDS ** 2 - 2 * torch.log(TWO_BASIN_SDS) - math.log(2 * math.pi)
                + torch.log(TWO_BASIN_WEIGHTS))
        return torch.logsumexp(comp, -1)

    def initial_theta(self) -> torch.Tensor:
        return torch.tensor([-0.8, 0.0], dtype=torch.float64)


def iris_rows(n: int, columns: int = 2):
    """Iris standardised, integer labels: the first ``n`` rows of a seeded permutation, the first ``columns``
    inputs; and all 150 rows of those inputs."""
    from sklearn.datasets import load_iris

    d = load_iris()
    X = ((d.data - d.data.mean(0)) / d.data.std(0))[:, :columns]
    sub = np.random.default_rng(0).permutation(150)[:n]
    return X[sub], d.target[sub], X
