r"""Predictive distributions of test targets: one Gaussian per hyperparameter draw, mixed with equal weights.

For hyperparameter draws :math:`\theta_1, \dots, \theta_S` (from ML-II: S = 1; from DSVI's q or from MCMC:
S draws), the predictive of :math:`y_*` is the mixture

.. math::

    p(y_* \mid x_*, \mathcal D) \approx \frac1S \sum_s \mathcal N(y_* \mid m_s(x_*), v_s(x_*)),

with mean :math:`\bar m = \frac1S\sum_s m_s` and variance
:math:`\frac1S\sum_s (v_s + m_s^2) - \bar m^2` (law of total variance). Its log density is evaluated by
``logsumexp``, never by averaging densities (which underflows).

Quantiles: for one component (ML-II) they are the Gaussian's, :math:`m + \sqrt v\,\Phi^{-1}(p)`; for a mixture the
:math:`p`-quantile solves :math:`F(x) = \frac1S \sum_s \Phi((x - m_s)/\sqrt{v_s}) = p`, found by bisection
between the smallest and the largest component quantile (where :math:`F \le p` and :math:`F \ge p`) until the
bracket is within :math:`2\epsilon(|x| + \min_s \sqrt{v_s})` (float64 :math:`\epsilon`). ``interval(level)`` is the central interval ``(quantile((1 - level)/2), quantile((1 + level)/2))``.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from ..validation import as_float_tensor, check_fraction

__all__ = ["MixturePredictive", "at_levels", "central_interval"]

_BISECTION_STEPS = 200    # a cap: the bracket shrinks to 2 eps (|x| + min_s sd_s) in about 60 halvings


def _check_probs(p: Any) -> tuple[torch.Tensor, bool]:
    """``p`` as a 1-D float64 tensor of levels in (0, 1), and whether it was a single number."""
    msg = "p must be a number in (0, 1) or a 1-D sequence of them"
    if isinstance(p, (bool, str, bytes)):
        raise TypeError(f"{msg}; got {type(p).__name__}")
    try:
        t = torch.as_tensor(p, dtype=torch.float64, device="cpu").detach()
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{msg}; got {type(p).__name__}") from None
    if t.dim() > 1:
        raise ValueError(f"{msg}; got shape {tuple(t.shape)}")
    scalar = t.dim() == 0
    t = t.reshape(-1)
    if t.numel() == 0:
        raise ValueError("p is empty; give at least one level in (0, 1)")
    bad = ~((t > 0) & (t < 1))
    if bool(bad.any()):
        raise ValueError(f"p must be in (0, 1); got {float(t[bad][0]):g}")
    return t, scalar


def at_levels(p: Any, quantiles: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Quantiles at the levels ``p``: the rule every ``quantile(p)`` of gpvi follows (posteriors, predictives).

    Parameters
    ----------
    p : float or sequence of float
        Levels in the open interval (0, 1).
    quantiles : callable
        Maps the checked levels, a float64 tensor of shape (P,), to the quantiles, shape (P, k).

    Returns
    -------
    torch.Tensor
        Shape ``(k,)`` for a single level, ``(len(p), k)`` for a sequence.

    Raises
    ------
    ValueError, TypeError
        A level outside (0, 1), or not a number.
    """
    probs, scalar = _check_probs(p)
    q = quantiles(probs)
    return q[0] if scalar else q


def central_interval(quantile: Any, level: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(1 - level)/2`` and ``(1 + level)/2`` quantiles from ``quantile(levels) -> (2, n)`` (``level`` in (0, 1),
    checked): the central interval of every predictive's ``interval``."""
    level = check_fraction(level, "level", high_closed=False)
    q = quantile([(1 - level) / 2, (1 + level) / 2])
    return q[0], q[1]


class MixturePredictive:
    """Equal-weight mixture of Gaussians per test point.

    Parameters
    ----------
    means, variances : torch.Tensor of shape (S, n) or (n,)
        Component means and variances (float64). ``(n,)`` means a single component.

    Attributes
    ----------
    component_means, component_variances : torch.Tensor of shape (S, n)

    Raises
    ------
    ValueError
        Shapes differ, a variance is not positive, or a mean or variance is not finite (a NaN predictive is
        never returned without a word).

    Examples
    --------
    >>> import torch
    >>> pred = MixturePredictive(torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64))
    >>> lo, hi = pred.interval(0.9)
    >>> [round(v, 4) for v in hi.tolist()]
    [1.6449, 1.6449, 1.6449]
    """

    def __init__(self, means: torch.Tensor, variances: torch.Tensor) -> None:
        if means.dim() == 1:
            means, variances = means.unsqueeze(0), variances.unsqueeze(0)
        if means.shape != variances.shape or means.dim() != 2:
            raise ValueError(f"means and variances must have equal shape (S, n); got {tuple(means.shape)} "
                             f"and {tuple(variances.shape)}")
        finite = torch.isfinite(means) & torch.isfinite(variances)
        if not bool(finite.all()):
            bad = int((~finite.all(0)).sum())
            raise ValueError(f"the predictive is not finite (NaN or inf mean or variance) at {bad} test point(s)")
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

    def cdf(self, y: Any) -> torch.Tensor:
        r"""Predictive CDF :math:`F(y_i) = \frac1S \sum_s \Phi((y_i - m_{s,i}) / \sqrt{v_{s,i}})`, shape (n,)."""
        y = as_float_tensor(y, "y", ndim=1, device=self.component_means.device)
        if y.shape[0] != self.component_means.shape[1]:
            raise ValueError(f"y has {y.shape[0]} values but the predictive has {self.component_means.shape[1]} points")
        return torch.special.ndtr((y - self.component_means) / self.component_variances.sqrt()).mean(0)

    def quantile(self, p: Any) -> torch.Tensor:
        r"""Predictive quantiles at each test point, at the levels ``p`` (:func:`at_levels`: a level in (0, 1) gives
        shape ``(n,)``, a sequence of them ``(len(p), n)``; ValueError or TypeError for anything else).

        Exact for one component (:math:`m + \sqrt v\,\Phi^{-1}(p)`); for a mixture, bisection on the mixture CDF
        (module docstring).
        """
        return at_levels(p, self._quantiles)

    def _quantiles(self, probs: torch.Tensor) -> torch.Tensor:
        """``(P, n)`` quantiles at the checked levels ``probs`` (module docstring)."""
        m, sd = self.component_means, self.component_variances.sqrt()
        probs = probs.to(m)
        z = torch.special.ndtri(probs)[:, None, None]                      # (P, 1, 1)
        comp = m.unsqueeze(0) + z * sd.unsqueeze(0)                         # (P, S, n) component quantiles
        if self.num_components == 1:
            q = comp[:, 0]
        else:
            lo, hi = comp.amin(1), comp.amax(1)                             # F(lo) <= p <= F(hi)
            target = probs[:, None]
            eps = torch.finfo(m.dtype).eps
            floor = sd.amin(0)                                               # (n,) absolute scale near 0
            for _ in range(_BISECTION_STEPS):
                mid = 0.5 * lo + 0.5 * hi
                open_ = (mid > lo) & (mid < hi) & (hi - lo > 2 * eps * (mid.abs() + floor))
                if not bool(open_.any()):
                    break
                F = torch.special.ndtr((mid.unsqueeze(1) - m.unsqueeze(0)) / sd.unsqueeze(0)).mean(1)
                below = (F < target) & open_
                above = (F >= target) & open_
                lo = torch.where(below, mid, lo)
                hi = torch.where(above, mid, hi)
            q = 0.5 * lo + 0.5 * hi
        return q

    def interval(self, level: float = 0.9) -> tuple[torch.Tensor, torch.Tensor]:
        """Central predictive interval holding mass ``level`` at each test point.

        Parameters
        ----------
        level : float
            In (0, 1); 0.9 gives the 5% and 95% quantiles.

        Returns
        -------
        lower, upper : torch.Tensor of shape (n,)
        """
        return central_interval(self.quantile, level)

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
