r"""A point estimate of theta (ML-II or MAP) with the common posterior surface.

It is the point mass :math:`\delta_{\hat\theta}`: ``mean`` is :math:`\hat\theta` (``theta``), ``std`` is zero,
every quantile and every draw is :math:`\hat\theta`, and ``predict`` uses the single component at
:math:`\hat\theta`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..validation import check_positive_int, check_theta
from .base import Posterior

__all__ = ["PointPosterior"]


class PointPosterior(Posterior):
    """A point estimate of theta (ML-II or MAP) with the same interface as the other posteriors.

    Parameters
    ----------
    theta : torch.Tensor of shape (D,)
    names : list of str
    target : optional
        The model (needed for ``predict`` and natural-scale summaries).
    value : float
        Objective at ``theta`` (log marginal likelihood for ML-II, log joint for MAP).
    info : dict, optional
        Engine-specific details (e.g. the restarts table of ML-II).
    engine_state : optional
        An engine state to keep (a private copy).

    Attributes
    ----------
    theta : torch.Tensor of shape (D,)
    value : float

    Examples
    --------
    >>> import torch
    >>> from gpvi.posteriors import PointPosterior
    >>> p = PointPosterior(torch.tensor([0.5, -1.0], dtype=torch.float64), ["a", "b"])
    >>> p.quantile([0.1, 0.9]).shape, p.marginals()["b"]["family"]
    (torch.Size([2, 2]), 'point')
    """

    kind = "point"

    def __init__(self, theta: torch.Tensor, names: list[str], target: Any = None, *, value: float = math.nan,
                 info: dict[str, Any] | None = None, engine_state: Any = None) -> None:
        super().__init__(names, target, info, engine_state=engine_state)
        if not isinstance(theta, torch.Tensor):
            theta = torch.as_tensor(theta, dtype=torch.float64)
        if theta.shape != (self.dim,):
            raise ValueError(f"theta must have shape ({self.dim},) for {self.dim} names; got {tuple(theta.shape)}")
        self.theta = theta.detach().clone()
        self.value = float(value)

    @property
    def mean(self) -> torch.Tensor:
        """:math:`\\hat\\theta`, shape (D,)."""
        return self.theta

    @property
    def std(self) -> torch.Tensor:
        """Zeros, shape (D,)."""
        return torch.zeros_like(self.theta)

    def sample(self, n: int, generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
        """``n`` copies of ``theta``, shape (n, D) (``generator`` and ``seed`` are accepted and unused)."""
        n = check_positive_int(n, "n")
        return self.theta.expand(n, -1).clone()

    def _quantiles(self, probs: torch.Tensor) -> torch.Tensor:
        return self.theta.expand(len(probs), -1)

    def _extra_summary_columns(self) -> dict[str, list[Any]]:
        """A ``note`` column when components ended on the search box (``info["at_bound"]``, from :class:`gpvi.ML2`)."""
        at_bound = self.info.get("at_bound") or {}
        if not isinstance(at_bound, dict) or not at_bound:
            return {}
        return {"note": [f"at {at_bound[n]} bound" if n in at_bound else "" for n in self.names]}

    def _marginal(self, mean, sd):
        return [{"family": "point", "value": v} for v in self.theta.tolist()]

    def _predict_draws(self, num_draws, *, generator, seed):
        return self.theta.unsqueeze(0)

    def log_prob(self, theta: Any) -> torch.Tensor:
        """Point mass: 0 at ``theta`` (up to 1e-12), ``-inf`` elsewhere (useful only for checks)."""
        t = check_theta(theta, self.dim, device=self.theta.device)
        hit = (t - self.theta).abs().amax(-1) <= 1e-12
        return torch.where(hit, torch.zeros_like(hit, dtype=t.dtype), torch.full_like(hit, -math.inf, dtype=t.dtype))

    def _state_info(self) -> dict[str, Any]:
        return {k: v for k, v in self.info.items() if k != "records"}

    def _state(self) -> dict[str, Any]:
        return {"theta": self.theta, "value": self.value}

    @classmethod
    def _from_state(cls, state, target, common):
        return cls(state["theta"], list(state["names"]), target, value=state["value"], **common)
