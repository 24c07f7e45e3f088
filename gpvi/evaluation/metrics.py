r"""Predictive metrics and posterior comparison.

Regression (the DSVI paper's Table 5): standardised mean squared error and mean negative log predictive density

.. math::

    \mathrm{SMSE} = \frac{\frac1n \sum_i (y_i - \bar m_i)^2}{\operatorname{Var}(y_\text{test})},\qquad
    \mathrm{NLPD} = -\frac1n \sum_i \log p(y_i \mid x_i, \mathcal D),

with the variance of the *test* targets in the SMSE denominator and the predictive density of a mixture
evaluated by ``logsumexp``. Both are in the units of the targets given; with the bundled loaders' standardised
targets, NLPD in original units is ``nlpd + log(ds.y_std)`` (SMSE is unit-free).

Classification (the CVI paper's section 5): error rate, and mean log-loss in **bits**,
:math:`-\frac1n\sum_i [y_i \log_2 \hat p_i + (1-y_i)\log_2(1-\hat p_i)]` (1 = a coin toss).

:func:`compare` tabulates two posteriors over the same parameters (e.g. DSVI against NUTS).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..table import Table
from ..validation import as_float_tensor, check_binary_labels, check_positive_int

__all__ = ["mse", "smse", "nlpd", "error_rate", "log_loss_bits", "compare"]


def _mean_of(pred: Any) -> torch.Tensor:
    """Predictive mean of a predictive object (has ``mean`` and ``var``), or an array of means."""
    if not isinstance(pred, (torch.Tensor, np.ndarray, list, tuple)) and hasattr(pred, "mean") and hasattr(pred, "var"):
        return as_float_tensor(pred.mean, "pred.mean", ndim=1)
    return as_float_tensor(pred, "pred", ndim=1)


def _targets(y: Any, n: int) -> torch.Tensor:
    yt = as_float_tensor(y, "y", ndim=1)
    if yt.shape[0] != n:
        raise ValueError(f"y has {yt.shape[0]} values but the prediction has {n}")
    return yt


def mse(pred: Any, y: Any) -> float:
    """Mean squared error of the predictive mean (``pred`` is a predictive object or a mean vector)."""
    m = _mean_of(pred)
    yt = _targets(y, m.shape[0]).to(m.device)
    return float(((yt - m) ** 2).mean())


def smse(pred: Any, y: Any) -> float:
    """Standardised MSE: MSE divided by the variance of the test targets ``y`` (needs >= 2 distinct values)."""
    m = _mean_of(pred)
    yt = _targets(y, m.shape[0]).to(m.device)
    if yt.shape[0] < 2:
        raise ValueError("smse needs at least 2 test targets")
    if float(yt.var(unbiased=False)) == 0.0 or bool((yt == yt[0]).all()):
        raise ValueError("smse is undefined for constant test targets (zero variance)")
    # both squares over one common scale, so targets near the float64 limit (|y| ~ 1e154 and up) cannot overflow
    r, dev = yt - m, yt - yt.mean()
    s = torch.maximum(r.abs().max(), dev.abs().max())
    return float(((r / s) ** 2).mean() / ((dev / s) ** 2).mean())


def nlpd(pred: Any, y: Any) -> float:
    """Mean negative log predictive density; ``pred`` must have ``log_prob(y)`` (one value per test point)."""
    if not callable(getattr(pred, "log_prob", None)):
        raise TypeError(f"pred must have a log_prob(y) method (a predictive object); got {type(pred).__name__}")
    lp = pred.log_prob(y)
    return float(-lp.mean())


def _probs(p: Any, n: int | None = None) -> torch.Tensor:
    pt = as_float_tensor(p, "p", ndim=(1, 2))
    if pt.dim() == 2:
        if pt.shape[1] != 2:
            raise ValueError(f"p must be (n,) probabilities of class 1 or (n, 2); got shape {tuple(pt.shape)}")
        pt = pt[:, 1]
    if bool(((pt < 0) | (pt > 1)).any()):
        raise ValueError("p must hold probabilities in [0, 1]")
    if n is not None and pt.shape[0] != n:
        raise ValueError(f"p has {pt.shape[0]} values but y has {n}")
    return pt


def error_rate(p: Any, y: Any) -> float:
    """Fraction misclassified when predicting class 1 for ``p > 0.5``; ``y`` in {0,1} or {-1,+1}."""
    y01, _ = check_binary_labels(y, "y")
    pt = _probs(p, y01.shape[0]).to(y01.device)
    return float(((pt > 0.5).to(y01.dtype) != y01).to(torch.float64).mean())


def log_loss_bits(p: Any, y: Any, *, eps: float = 1e-15) -> float:
    """Mean log-loss in bits (the CVI paper's test metric): 1.0 equals a coin toss."""
    y01, _ = check_binary_labels(y, "y")
    pt = _probs(p, y01.shape[0]).to(y01.device).clamp(eps, 1 - eps)
    ll = y01 * torch.log2(pt) + (1 - y01) * torch.log2(1 - pt)
    return float(-ll.mean())


def _draws(post: Any, n: int) -> torch.Tensor:
    if hasattr(post, "samples") and isinstance(post.samples, torch.Tensor):
        return post.samples
    return post.sample(n, seed=0)


def compare(a: Any, b: Any, *, num_draws: int = 20000) -> Table:
    r"""Compare two posteriors over the same parameters, ``b`` being the reference (e.g. ``a`` = DSVI, ``b`` = NUTS).

    Columns: ``mean_a, mean_b, sd_a, sd_b``, ``dmean_sd`` = :math:`(\bar\theta_a - \bar\theta_b) / \mathrm{sd}_b`
    (difference of means in units of the reference sd), ``sd_ratio`` = :math:`\mathrm{sd}_a/\mathrm{sd}_b`, and
    ``w1``, the 1-D Wasserstein distance between the marginals (``scipy.stats.wasserstein_distance`` on draws:
    sample-based posteriors use all their draws, others ``num_draws`` draws with seed 0).

    Raises
    ------
    ValueError
        The two posteriors have different parameter names.
    """
    if list(a.names) != list(b.names):
        raise ValueError(f"posteriors have different parameters: {list(a.names)} vs {list(b.names)}")
    num_draws = check_positive_int(num_draws, "num_draws")
    ma, sa = a._moments()
    mb, sb = b._moments()
    da, db = _draws(a, num_draws), _draws(b, num_draws)
    from scipy.stats import wasserstein_distance      # imported on use: scipy.stats takes ~0.5 s

    w1 = [float(wasserstein_distance(da[:, j].cpu().numpy(), db[:, j].cpu().numpy())) for j in range(len(a.names))]
    dmean = [(float(x) - float(y)) / float(s) if float(s) > 0 else (0.0 if float(x) == float(y) else math.inf)
             for x, y, s in zip(ma, mb, sb)]
    ratio = [float(x) / float(y) if float(y) > 0 else (1.0 if float(x) == 0 else math.inf) for x, y in zip(sa, sb)]
    return Table(a.names, {"mean_a": ma.tolist(), "mean_b": mb.tolist(), "sd_a": sa.tolist(), "sd_b": sb.tolist(),
                           "dmean_sd": dmean, "sd_ratio": ratio, "w1": w1},
                 title=f"{type(a).__name__} (a) vs {type(b).__name__} (b)")
