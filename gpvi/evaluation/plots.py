r"""Matplotlib helpers: posterior marginals against MCMC, chain traces, bound traces.

matplotlib is an optional extra (``pip install 'gpvi[plots]'``) and is imported only when a function here is
called, so ``import gpvi`` stays light. Every function builds a :class:`matplotlib.figure.Figure` directly
(no ``pyplot`` state: nothing is shown or kept open behind your back) and returns it; in a notebook the
returned figure displays itself, elsewhere call ``fig.savefig(path)``.

* :func:`compare_marginals` — per-parameter density overlays in the style of the DSVI paper's Figure 4: the
  reference posterior (e.g. NUTS) as a histogram with its kernel density estimate as a solid black line, the
  approximation (e.g. DSVI's Gaussian :math:`q`) as a dashed red curve.
* :func:`trace` — per-parameter chain traces and per-chain marginal histograms of a sample posterior.
* :func:`bound` — a DSVI/CVI bound trace (instantaneous values and a rolling-window average; DSVI paper
  Figure 3).
* :func:`observation_predictive` — a one-input :class:`gpvi.GPGeneralisedRegression` fit: the data, the predictive
  mean of the observations and their central interval (:class:`~gpvi.posteriors.observation.ObservationPredictive`),
  optionally the latent mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..numerics.families import StandardNormal
from ..posteriors.gaussian import GaussianPosterior
from ..posteriors.observation import ObservationPredictive
from ..posteriors.point import PointPosterior
from ..validation import as_float_tensor, check_fraction, check_positive_int

__all__ = ["compare_marginals", "trace", "bound", "observation_predictive"]

_COLOURS = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8", "C9")


def _figure(nrows: int, ncols: int, panel: tuple[float, float], **kw: Any):
    try:
        from matplotlib.figure import Figure         # imported on use: matplotlib is an optional extra
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("gpvi.plots needs matplotlib, an optional extra: pip install 'gpvi[plots]'") from exc
    fig = Figure(figsize=(panel[0] * ncols, panel[1] * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def _select(names: Sequence[str], wanted: Sequence[str] | str | None, arg: str = "names") -> list[int]:
    if wanted is None:
        return list(range(len(names)))
    if isinstance(wanted, str):
        wanted = [wanted]
    out = []
    for n in wanted:
        if n not in names:
            raise ValueError(f"{arg} contains {n!r}, which is not a parameter; parameters are {list(names)}")
        out.append(list(names).index(n))
    if not out:
        raise ValueError(f"{arg} is empty")
    return out


def _draws(post: Any, num_draws: int, seed: int) -> torch.Tensor:
    """All draws of a sample posterior, else ``num_draws`` seeded draws; (n, D) float64 on CPU."""
    s = getattr(post, "samples", None)
    if isinstance(s, torch.Tensor):
        return s.detach().cpu().to(torch.float64)
    return post.sample(num_draws, seed=seed).detach().cpu().to(torch.float64)


def _is_gaussian(post: Any) -> bool:
    return isinstance(post, GaussianPosterior) and isinstance(post.base, StandardNormal)


def _kde(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor | None:
    """Gaussian kernel density estimate (Scott's rule) of 1-D draws on ``grid``; None if degenerate."""
    xs = x.numpy()
    if xs.size < 2 or not np.isfinite(xs).all() or float(np.std(xs)) == 0.0:
        return None
    from scipy.stats import gaussian_kde              # imported on use: scipy.stats takes ~0.5 s

    return torch.from_numpy(gaussian_kde(xs)(grid.numpy()))


def compare_marginals(q: Any, mc: Any, names: Sequence[str] | str | None = None, *,
                      labels: tuple[str, str] | None = None, bins: int = 40, kde: bool = True,
                      num_draws: int = 20000, seed: int = 0, ncols: int | None = None,
                      panel_size: tuple[float, float] = (3.2, 2.4), title: str | None = None):
    r"""Per-parameter marginal densities of ``q`` (curve) over those of ``mc`` (histogram), DSVI paper Figure 4.

    For each parameter :math:`\theta_j` the reference ``mc`` is drawn as a density histogram of its draws (and,
    with ``kde``, their Gaussian kernel density estimate as a solid black line, the paper's "ground-truth
    empirical estimate"); ``q`` is drawn as a dashed red curve: the exact marginal
    :math:`\mathcal N(\mu_j, (CC^\top)_{jj})` for a Gaussian :class:`~gpvi.posteriors.gaussian.GaussianPosterior`, a kernel
    density estimate of its draws for any other posterior, or a vertical line for a
    :class:`~gpvi.posteriors.point.PointPosterior` (ML-II).

    Parameters
    ----------
    q : posterior
        The approximation (DSVI, Salimans-Knowles, ML-II, or another sample posterior).
    mc : posterior
        The reference, typically the :class:`~gpvi.posteriors.samples.SamplePosterior` from :class:`gpvi.NUTS`
        (any posterior works: non-sample posteriors contribute ``num_draws`` seeded draws).
    names : str or sequence of str, optional
        Parameters to show (default all), by name.
    labels : (str, str), optional
        Legend labels of ``q`` and ``mc`` (default their class names, e.g. ``GaussianPosterior``).
    bins : int
        Histogram bins.
    kde : bool
        Also draw the kernel density estimate of ``mc``.
    num_draws, seed
        Draws taken from posteriors that are not sample-based.
    ncols : int, optional
        Panels per row (default ``min(4, number of panels)``).
    panel_size : (float, float)
        Width and height of one panel in inches.
    title : str, optional
        Figure title.

    Returns
    -------
    matplotlib.figure.Figure
        One panel per parameter, titled by name, with a legend in the first panel.

    Raises
    ------
    ValueError
        The posteriors have different parameters, or ``names`` holds an unknown name.

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.evaluation.plots import compare_marginals
    >>> q = gpvi.GaussianPosterior(torch.zeros(2, dtype=torch.float64), torch.eye(2, dtype=torch.float64),
    ...                            ["a", "b"])
    >>> mc = gpvi.SamplePosterior(torch.randn(2, 500, 2, dtype=torch.float64,
    ...                                       generator=torch.Generator().manual_seed(0)), ["a", "b"])
    >>> fig = compare_marginals(q, mc, labels=("DSVI", "NUTS"))
    >>> len(fig.axes)
    2
    """
    if list(q.names) != list(mc.names):
        raise ValueError(f"q and mc have different parameters: {list(q.names)} vs {list(mc.names)}")
    bins = check_positive_int(bins, "bins")
    num_draws = check_positive_int(num_draws, "num_draws")
    idx = _select(list(mc.names), names)
    la, lb = labels if labels is not None else (type(q).__name__, type(mc).__name__)
    nc = min(4, len(idx)) if ncols is None else check_positive_int(ncols, "ncols")
    nr = math.ceil(len(idx) / nc)
    fig, axes = _figure(nr, nc, panel_size)
    db = _draws(mc, num_draws, seed)
    gauss = _is_gaussian(q)
    point = isinstance(q, PointPosterior)
    da = None if (gauss or point) else _draws(q, num_draws, seed)
    if gauss:
        mean_a, sd_a = q._moments()
        mean_a, sd_a = mean_a.detach().cpu(), sd_a.detach().cpu()
    for k, j in enumerate(idx):
        ax = axes[k // nc][k % nc]
        xb = db[:, j]
        lo, hi = torch.quantile(xb, torch.tensor([0.001, 0.999], dtype=xb.dtype)).tolist()
        if gauss:
            lo, hi = min(lo, float(mean_a[j] - 4 * sd_a[j])), max(hi, float(mean_a[j] + 4 * sd_a[j]))
        elif point:
            v = float(q.theta[j])
            lo, hi = min(lo, v), max(hi, v)
        else:
            qa = torch.quantile(da[:, j], torch.tensor([0.001, 0.999], dtype=da.dtype)).tolist()
            lo, hi = min(lo, qa[0]), max(hi, qa[1])
        pad = 0.05 * (hi - lo) if hi > lo else 1.0
        grid = torch.linspace(lo - pad, hi + pad, 400, dtype=torch.float64)
        ax.hist(xb.numpy(), bins=bins, range=(lo - pad, hi + pad), density=True, color="0.8",
                edgecolor="0.6", linewidth=0.4, label=f"{lb} (histogram)")
        if kde:
            dens = _kde(xb, grid)
            if dens is not None:
                ax.plot(grid.numpy(), dens.numpy(), color="k", linewidth=1.4, label=lb)
        if gauss:
            m, s = float(mean_a[j]), float(sd_a[j])
            pdf = torch.exp(-0.5 * ((grid - m) / s) ** 2) / (s * math.sqrt(2 * math.pi))
            ax.plot(grid.numpy(), pdf.numpy(), color="r", linestyle="--", linewidth=1.6, label=la)
        elif point:
            ax.axvline(float(q.theta[j]), color="r", linestyle="--", linewidth=1.6, label=la)
        else:
            dens = _kde(da[:, j], grid)
            if dens is not None:
                ax.plot(grid.numpy(), dens.numpy(), color="r", linestyle="--", linewidth=1.6, label=la)
        ax.set_title(mc.names[j], fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_yticks([])
    for k in range(len(idx), nr * nc):
        axes[k // nc][k % nc].set_visible(False)
    axes[0][0].legend(fontsize=7, frameon=False)
    if title:
        fig.suptitle(title)
    return fig


def trace(mc: Any, names: Sequence[str] | str | None = None, *, warmup: bool = False, bins: int = 30,
          panel_size: tuple[float, float] = (7.0, 1.6)):
    """Chain traces (left) and per-chain marginal histograms (right) of a sample posterior, one row per parameter.

    Parameters
    ----------
    mc : SamplePosterior
        Draws ``(C, S, D)`` (e.g. from :class:`gpvi.NUTS`).
    names : str or sequence of str, optional
        Parameters to show (default all).
    warmup : bool
        Prepend the warm-up draws (``mc.info["warmup_draws"]``, shaded) when available.
    bins : int
        Histogram bins.
    panel_size : (float, float)
        Width and height of one row in inches.

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.evaluation.plots import trace
    >>> mc = gpvi.SamplePosterior(torch.randn(3, 100, 2, dtype=torch.float64,
    ...                                       generator=torch.Generator().manual_seed(0)), ["a", "b"])
    >>> len(trace(mc).axes)
    4
    """
    draws = getattr(mc, "draws", None)
    if not isinstance(draws, torch.Tensor) or draws.dim() != 3:
        raise TypeError(f"mc must be a sample posterior with draws of shape (chains, draws, D); "
                        f"got {type(mc).__name__}")
    bins = check_positive_int(bins, "bins")
    idx = _select(list(mc.names), names)
    draws = draws.detach().cpu()
    W = 0
    warm = getattr(mc, "info", {}).get("warmup_draws") if warmup else None
    if isinstance(warm, torch.Tensor) and warm.dim() == 3 and warm.shape[0] == draws.shape[0]:
        W = warm.shape[1]
        series = torch.cat([warm.detach().cpu(), draws], dim=1)
    else:
        series = draws
    fig, axes = _figure(len(idx), 2, (panel_size[0] / 2, panel_size[1]), gridspec_kw={"width_ratios": [3, 1]})
    it = torch.arange(series.shape[1]) - W
    for r, j in enumerate(idx):
        a_tr, a_h = axes[r]
        for c in range(series.shape[0]):
            col = _COLOURS[c % len(_COLOURS)]
            a_tr.plot(it.numpy(), series[c, :, j].numpy(), color=col, linewidth=0.5, alpha=0.8)
            a_h.hist(draws[c, :, j].numpy(), bins=bins, density=True, histtype="step", color=col,
                     orientation="horizontal")
        if W:
            a_tr.axvspan(-W, 0, color="0.9", zorder=0)
        a_tr.set_ylabel(mc.names[j], fontsize=8)
        a_tr.tick_params(labelsize=7)
        a_h.tick_params(labelsize=7)
        a_h.set_xticks([])
        a_h.sharey(a_tr)
    axes[-1][0].set_xlabel("iteration" + (" (warm-up shaded)" if W else ""), fontsize=8)
    return fig


def _series(result: Any, key: str | None) -> tuple[str, list[float], list[float] | None, list[float] | None]:
    """(name, values, given rolling average or None, x or None) from a posterior, dict or sequence."""
    tr = getattr(result, "trace", None)          # (tensors and arrays have a .trace method: not a dict)
    if not isinstance(tr, dict):
        tr = result
    if isinstance(tr, dict):
        if key is None:
            key = next((k for k in ("bound", "elbo") if k in tr and len(tr[k])), None)
            if key is None:
                raise ValueError(f"no bound trace found (looked for 'bound', 'elbo'); keys are {list(tr)}; "
                                 f"pass key=")
        elif key not in tr:
            raise ValueError(f"key {key!r} is not in the trace; keys are {list(tr)}")
        vals = [float(v) for v in tr[key]]
        avg = tr.get(key + "_avg")
        avg = [float(v) for v in avg] if avg is not None and len(avg) == len(vals) else None
        x = tr.get("step")
        x = [float(v) for v in x] if x is not None and len(x) == len(vals) else None
        return key, vals, avg, x
    if not isinstance(tr, (torch.Tensor, Sequence)) and not hasattr(tr, "__array__"):
        raise TypeError(f"result must be a posterior with a trace, a dict of lists, or a sequence of values; "
                        f"got {type(result).__name__}")
    vals = as_float_tensor(tr, "result", ndim=1, finite=False, allow_empty=True)
    return key or "bound", vals.cpu().tolist(), None, None


def bound(result: Any, *, key: str | None = None, window: int = 200,
          panel_size: tuple[float, float] = (6.0, 3.0), ylim_quantile: float | None = 0.02):
    r"""Bound trace of a DSVI/CVI run: instantaneous values and their rolling-window average (DSVI paper Fig. 3).

    .. math::

        \bar{\mathcal L}_t = \frac1{|W_t|}\sum_{s \in W_t} \hat{\mathcal L}_s,\qquad
        W_t = \{\max(1, t - \text{window} + 1), \dots, t\}

    over the finite values (skipped steps are NaN and left out).

    Parameters
    ----------
    result : posterior, dict or sequence
        A result with a ``trace`` dict (DSVI: ``bound`` and ``bound_avg``; CVI: ``elbo``), such a dict, or a
        sequence / 1-D tensor of bound values.
    key : str, optional
        Trace entry to plot (default ``"bound"``, else ``"elbo"``). An entry ``key + "_avg"`` of the same
        length is used as the rolling average; otherwise it is computed with ``window``.
    window : int
        Rolling-window length when the average is computed here.
    panel_size : (float, float)
    ylim_quantile : float or None
        Clip the y-axis to the [q, 1] quantile range of the values (the first steps of a run are often
        orders of magnitude below the rest); ``None`` shows everything.

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> from gpvi.evaluation.plots import bound
    >>> fig = bound([-10.0, -5.0, -3.0, -2.5, -2.4, -2.41], window=2)
    >>> fig.axes[0].get_ylabel()
    'bound'
    """
    window = check_positive_int(window, "window")
    name, vals, avg, x = _series(result, key)
    if not vals:
        raise ValueError("the bound trace is empty")
    v = torch.tensor(vals, dtype=torch.float64)
    if avg is None:
        finite = torch.isfinite(v)
        zero = torch.zeros(1, dtype=torch.float64)
        cs = torch.cat([zero, torch.cumsum(torch.where(finite, v, torch.zeros_like(v)), 0)])
        cn = torch.cat([zero, torch.cumsum(finite.to(torch.float64), 0)])
        t = torch.arange(1, len(v) + 1)
        start = (t - window).clamp_min(0)
        total, count = cs[t] - cs[start], cn[t] - cn[start]
        a = torch.where(count > 0, total / count.clamp_min(1), torch.full_like(total, math.nan))
    else:
        a = torch.tensor(avg, dtype=torch.float64)
    xs = torch.tensor(x, dtype=torch.float64) if x is not None else torch.arange(1, len(v) + 1, dtype=torch.float64)
    fig, axes = _figure(1, 1, panel_size)
    ax = axes[0][0]
    ax.plot(xs.numpy(), v.numpy(), color="0.7", linewidth=0.5, label="instantaneous")
    ax.plot(xs.numpy(), a.numpy(), color="C3", linewidth=1.5,
            label="rolling average" + ("" if avg is not None else f" (window {window})"))
    fin = v[torch.isfinite(v)]
    if ylim_quantile is not None and fin.numel() > 1:
        lo = float(torch.quantile(fin, float(ylim_quantile)))
        hi = float(fin.max())
        if hi > lo:
            ax.set_ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    ax.set_xlabel("step")
    ax.set_ylabel(name)
    ax.legend(fontsize=8, frameon=False)
    return fig


def observation_predictive(post: Any, X: Any = None, y: Any = None, *, grid: Any = None, num_grid: int = 200,
                           level: float = 0.9, latent: bool = False, panel_size: tuple[float, float] = (6.0, 3.2),
                           title: str | None = None):
    r"""A one-input fit with a non-Gaussian likelihood: data, predictive mean and central interval of :math:`y_*`.

    The predictive of a new observation is :math:`p(y_* \mid \mathcal D) = \int p(y_* \mid f_*)\,
    \mathcal N(f_* \mid m_*, v_*)\,df_*` (``post.predict``, an
    :class:`~gpvi.posteriors.observation.ObservationPredictive`); on a grid of inputs the figure shows its mean
    :math:`\mathbb E[y_* \mid \mathcal D]` as a solid line, its central ``level`` interval
    :math:`[F^{-1}(\tfrac{1 - \text{level}}2), F^{-1}(\tfrac{1 + \text{level}}2)]` as a band (integer counts:
    a band of steps), the data as points and, with ``latent``, the latent mean :math:`m_*` on a second axis (for a
    log link it is the log rate, not on the scale of :math:`y`).

    Parameters
    ----------
    post : LatentPosterior
        CVI's posterior of a :class:`gpvi.GPGeneralisedRegression` with one input column.
    X, y : array-like of shape (n, 1) and (n,), optional
        The points to show (default: the model's training data).
    grid : array-like of shape (m,) or (m, 1), optional
        Inputs of the curves (default ``num_grid`` points spanning the data and 5% beyond).
    num_grid : int
        Grid size when ``grid`` is not given.
    level : float
        Mass of the central interval, in (0, 1).
    latent : bool
        Also draw the latent mean :math:`m_*` (dashed, right axis).
    panel_size : (float, float)
    title : str, optional

    Returns
    -------
    matplotlib.figure.Figure
        One axes (two with ``latent``); the mean is the line labelled ``"predictive mean"``.

    Raises
    ------
    TypeError
        ``post`` does not predict observations (a classifier's posterior, a hyperparameter posterior).
    ValueError
        A model with more than one input; ``X`` and ``y`` of different lengths; ``level`` outside (0, 1).

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.evaluation.plots import observation_predictive
    >>> X = torch.linspace(0, 5, 30, dtype=torch.float64).unsqueeze(-1)
    >>> y = torch.poisson(torch.exp(1 + torch.sin(X[:, 0])), generator=torch.Generator().manual_seed(0))
    >>> post = gpvi.CVI(progress_bar=False).run(gpvi.GPGeneralisedRegression(X, y, likelihood="poisson"))
    >>> fig = observation_predictive(post, latent=True)
    >>> [ln.get_label() for ln in fig.axes[0].get_lines()]
    ['predictive mean']
    """
    model = getattr(post, "model", None)
    lik = getattr(model, "likelihood", None)
    if model is None or getattr(lik, "binary", True) or getattr(post, "num_latent", 1) != 1 \
            or not hasattr(lik, "response"):
        raise TypeError(f"post must be CVI's posterior of a GPGeneralisedRegression (its predict gives an "
                        f"ObservationPredictive); got {type(post).__name__}")
    if model.X.shape[1] != 1:
        raise ValueError(f"post's model has {model.X.shape[1]} inputs; observation_predictive draws one-input fits")
    level = check_fraction(level, "level", high_closed=False)
    like = model.X
    Xd = model.X if X is None else as_float_tensor(X, "X", ndim=(1, 2), device=like.device).reshape(-1, 1)
    yd = model.y if y is None else as_float_tensor(y, "y", ndim=1, device=like.device)
    if Xd.shape[0] != yd.shape[0]:
        raise ValueError(f"X has {Xd.shape[0]} rows but y has {yd.shape[0]}")
    if grid is None:
        lo, hi = float(Xd.min()), float(Xd.max())
        pad = 0.05 * (hi - lo) if hi > lo else 1.0
        g = torch.linspace(lo - pad, hi + pad, check_positive_int(num_grid, "num_grid"), dtype=like.dtype,
                           device=like.device)
    else:
        g = as_float_tensor(grid, "grid", ndim=(1, 2), device=like.device).reshape(-1)
    pred = post.predict(g.unsqueeze(-1))
    if not isinstance(pred, ObservationPredictive):
        raise TypeError(f"post.predict gives a {type(pred).__name__}, not an ObservationPredictive")
    lower, upper = pred.interval(level)
    gx = g.detach().cpu().numpy()
    fig, axes = _figure(1, 1, panel_size)
    ax = axes[0][0]
    step = {"step": "mid"} if pred.discrete else {}
    ax.fill_between(gx, lower.detach().cpu().numpy(), upper.detach().cpu().numpy(), color="C0", alpha=0.25,
                    linewidth=0, label=f"{level:.0%} predictive interval", **step)
    ax.plot(gx, pred.mean.detach().cpu().numpy(), color="C0", linewidth=1.8, label="predictive mean")
    ax.scatter(Xd.detach().cpu().numpy()[:, 0], yd.detach().cpu().numpy(), s=12, color="k", zorder=3, label="data")
    names = getattr(model, "feature_names", None)
    ax.set_xlabel(names[0] if names else "x")
    ax.set_ylabel("y")
    handles, labels = ax.get_legend_handles_labels()
    if latent:
        ax2 = ax.twinx()
        line = ax2.plot(gx, pred.latent_mean.detach().cpu().numpy(), color="C3", linestyle="--", linewidth=1.2,
                        label="latent mean")
        ax2.set_ylabel("latent f")
        handles, labels = handles + line, labels + ["latent mean"]
    ax.legend(handles, labels, fontsize=8, frameon=False)
    ax.set_title(title if title is not None else f"{lik.name} likelihood: predictive of y")
    return fig
