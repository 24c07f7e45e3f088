r"""The Laplace approximation as a posterior: :func:`laplace_approximation`.

At the mode :math:`\hat\theta = \arg\max_\theta \log g(\theta)` of the log joint,

.. math::

    q(\theta) = \mathcal N\big(\hat\theta,\ (-\nabla^2\log g(\hat\theta))^{-1}\big),

with the Hessian by central differences of the autograd gradient and its inverse turned into a lower-triangular
scale by :func:`gpvi.inference.init.laplace_scale` (the one place that does it; the init strategy
:class:`~gpvi.inference.init.init_to_laplace` starts engines from the same scale).
"""

from __future__ import annotations

from typing import Any

import torch

from ..models.target import as_target
from ..posteriors.gaussian import GaussianPosterior
from ..validation import check_positive, check_positive_int
from .init import init_to_map, init_to_posterior, init_to_value, laplace_scale_at

__all__ = ["laplace_approximation"]


def laplace_approximation(target: Any, mode: Any = None, *, map_restarts: int = 1, step: float = 1e-4,
                          fallback_scale: float = 0.1, seed: int = 0) -> GaussianPosterior:
    r"""Laplace approximation :math:`\mathcal N(\hat\theta, (-\nabla^2\log g(\hat\theta))^{-1})` at the MAP.

    The mode :math:`\hat\theta = \arg\max\log g` is found by :class:`~gpvi.inference.init.init_to_map`
    (``gpvi.ML2(prior=True)``) unless ``mode`` is given; the Hessian by central differences of the gradient. When
    :math:`-H` is not positive definite, the scale falls back to a diagonal: :math:`1/\sqrt{-H_{dd}}` where
    :math:`-H_{dd} > 0` and ``fallback_scale`` elsewhere (``info["scale"]``). On GP hyperparameters this is a baseline, not a
    substitute for DSVI: the posterior is skewed, and the Laplace mean is the mode, not the mean.

    Parameters
    ----------
    target : target
    mode : array-like (D,) or PointPosterior, optional
        Point at which to expand (default: the MAP found here).
    map_restarts : int
    step : float
        Relative finite-difference step.
    fallback_scale : float
        Scale of directions with no usable curvature.
    seed : int
        Seed of the MAP restarts.

    Returns
    -------
    GaussianPosterior
        ``info``: ``mode`` ("map" or "given"), ``scale`` ("laplace", "laplace_diagonal" or "fallback"),
        ``map_value``, ``map_time_s``, ``hessian_time_s``, ``hessian`` (D, D), ``map_warnings``.

    Examples
    --------
    >>> import gpvi
    >>> from gpvi.inference.laplace import laplace_approximation
    >>> ds = gpvi.datasets.load_bodyfat(seed=0)
    >>> lap = laplace_approximation(gpvi.GPRegression(ds.X_train, ds.y_train))
    >>> lap.info["scale"], lap.mean.shape
    ('laplace', torch.Size([16]))
    """
    target = as_target(target)
    D = len(target.names)
    map_restarts = check_positive_int(map_restarts, "map_restarts")
    fallback_scale = check_positive(fallback_scale, "fallback_scale")
    if mode is None:
        start = init_to_map(map_restarts, seed=seed)(target)
        info = {k: v for k, v in start.info.items() if k != "mean"}
    else:
        start = init_to_posterior(mode)(target) if hasattr(mode, "theta") else init_to_value(mode)(target)
        info = {"mode": "given"}
    C, how = laplace_scale_at(target, start.theta, fallback_scale=fallback_scale, step=step)
    info.update(how)
    if C is None:
        C = torch.diag(torch.full((D,), fallback_scale, dtype=torch.float64))
    return GaussianPosterior(start.theta, C, list(target.names), target, info=info)

