"""Predictive distributions of test targets: one Gaussian per hyperparameter draw, mixed with equal weights.

For hyperparameter draws :math:`\\theta_1, \\dots, \\theta_S` (from ML-II: S = 1; from DSVI's q or from MCMC:
S draws), the predictive of :math:`y_*` is the mixture

.. math::

    p(y_* \\mid x_*, \\mathcal D) \\approx \\frac1S \\sum_s \\mathcal N(y_* \\mid m_s(x_*), v_s(x_*)),

with mean :math:`\\bar m = \\frac1S\\sum_s m_s` and variance
:math:`\\frac1S\\sum_s (v_s + m_s^2) - \\bar m^2` (law of total variance). Its log density is evaluated by
``logsumexp``, never by averaging densities (which underflows).
"""

from __future__ import annotations

import math

import torch

from ..validation import as_float_tensor

__all__ = ["MixturePredictive"]


class MixturePredictive:
    """Equal-weight mixture of Gaussians per test point.

    Parameters
    ----------
    means, variances : torch.Tensor of shape (S, n) or (n,)
        Component means and variances (float64). ``(n,)`` means a single component.

    Attributes
    ----------
    component_means, component_variances : torch.Tensor of shape (S, n)
    """

    def __init__(self, means: torch.Tensor, variances: torch.Tensor) -> None:
        if means.dim() == 1:
            means, variances = means.unsqueeze(0), variances.unsqueeze(0)
        if means.shape != variances.shape or means.dim() != 2:
            raise ValueError(f"means and variances must have equal shape (S, n); got {tuple(means.shape)} "
                             f"and {tuple(variances.shape)}")
        if bool((variances <= 0).any()):
            raise ValueError("predictive variances must be positive")
        self.component_means = means.detach()
        self.component_variances = variances.detach()

    @property
    def num_components(self) -> int:
        """Number of mixture components S."""
        return self.component_means.shape[0]

    @property
    def mean(self) -> torch.Tensor:
        """Predictive mean, shape (n,)."""
        return self.component_means.mean(0)

    @property
    def var(self) -> torch.Tensor:
        """Predictive variance (law of total variance), shape (n,)."""
        m = self.component_means
        return (self.component_variances + m * m).mean(0) - self.mean ** 2 if self.num_components > 1 \
            else self.component_variances[0]

    @property
    def stddev(self) -> torch.Tensor:
        """Predictive standard deviation, shape (n,)."""
        return self.var.sqrt()

    def log_prob(self, y: torch.Tensor) -> torch.Tensor:
        r"""Log predictive density of each test target, shape (n,).

        .. math:: \log \frac1S \sum_s \mathcal N(y_i \mid m_{s,i}, v_{s,i})
        """
        y = as_float_tensor(y, "y", ndim=1, device=self.component_means.device)
        if y.shape[0] != self.component_means.shape[1]:
            raise ValueError(f"y has {y.shape[0]} values but the predictive has {self.component_means.shape[1]} points")
        v = self.component_variances
        lp = -0.5 * (math.log(2 * math.pi) + torch.log(v) + (y - self.component_means) ** 2 / v)
        return torch.logsumexp(lp, dim=0) - math.log(self.num_components)

    def __repr__(self) -> str:
        return f"MixturePredictive(n={self.component_means.shape[1]}, components={self.num_components})"
