r"""Step 0 of :func:`gpvi.infer` for targets of at most ``GRID_MAX_D`` parameters: the posterior by quadrature on
a lattice, explored from the MAP optima outwards.

With two to four hyperparameters the posterior is cheaply integrated on a grid, as INLA does for its
hyperparameters (Rue, Martino & Chopin, *Approximate Bayesian inference for latent Gaussian models by using
integrated nested Laplace approximations*, JRSS B 2009, section 3.1: the "z-parametrisation" from the mode and the
Hessian, explored until the log density has dropped by a threshold). Here, with :math:`\theta^*` the MAP optimum and
:math:`LL^\top` its Laplace covariance (:func:`~gpvi.inference.init.init_to_laplace`), the lattice is

.. math:: \theta(z) = \theta^* + hLz, \qquad z \in \mathbb Z^D,

and its cells are explored by flooding: from the cells of the MAP optima (every distinct optimum the restarts found),
each cell whose log joint is within ``GRID_DROP`` of the largest seen has its :math:`3^D - 1` neighbours evaluated,
wave after wave (one batched, exact log-joint call per wave), until none is left. The flood follows a curved ridge or
a long one-sided tail (the log noise variance towards zero noise at small N) wherever it goes, which a box from the
Hessian does not. The answer weighs every evaluated cell by :math:`e^{\log p(y, \theta(z))}` (equal volumes):
a :class:`~gpvi.posteriors.weighted.WeightedPosterior` whose moments and quantiles are the lattice sums, and
:math:`\log p(y) \approx \log\big(h^D |L| \sum_z p(y, \theta(z))\big)`.

**Check.** The lattice is the union of its :math:`2^D` cosets of spacing :math:`2h` (cells whose coordinates have
given parities); each coset is a quadrature rule of its own. The answer is accepted when every coset's means are
within ``GRID_TOL_MEAN`` posterior sd of the full lattice's and its sds within ``GRID_TOL_SD`` (relative): the
lattice sums converge fast in h for smooth log densities (the trapezoid rule on a Gaussian errs by about
:math:`e^{-2\pi^2\sigma^2/h^2}`), so agreement at :math:`2h` bounds the error at h. A failed check halves h once
when the finer lattice fits in ``GRID_MAX_CELLS``; a lattice that outgrows it (an improper or very flat posterior,
or more parameters than quadrature suits), a start without a Laplace scale, or a log joint that fails (NaN) at a
cell next to the mass end the grid step, and :func:`gpvi.infer` goes on to the variational fit as before. Mass no
flood reaches (a basin that no MAP restart found, separated by a valley deeper than ``GRID_DROP``) is not seen, as
it is not by the other routes.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from ..numerics.budget import MemoryBudget
from ..posteriors.weighted import WeightedPosterior, log_joint_at
from ..validation import check_positive, check_positive_int
from .check import MCSE_TOL
from .progress import Progress

__all__ = ["grid_posterior", "GRID_MAX_D", "GRID_STEP", "GRID_DROP", "GRID_MAX_CELLS", "GRID_TOL_MEAN",
           "GRID_TOL_SD"]

GRID_MAX_D = 4
"""Targets of at most this many parameters are tried on the grid first."""
GRID_STEP = 0.7
"""Lattice spacing h in Laplace standard deviations."""
GRID_DROP = 12.0
"""Cells whose log joint is within this many nats of the largest have their neighbours explored."""
GRID_MAX_CELLS = 400_000
"""The grid step gives up (the variational route follows) beyond this many evaluated cells."""
GRID_TOL_MEAN = GRID_TOL_SD = MCSE_TOL
"""Every 2h coset's means within ``GRID_TOL_MEAN`` posterior sd of the lattice's, its sds within ``GRID_TOL_SD``
(relative): 0.05, the tolerance the weighted and NUTS answers' Monte Carlo errors are held to. The spread of the
2h cosets overstates the error of the lattice itself many times over for a smooth log density."""

_BITS, _BIAS = 16, 1 << 15


def _pack(z: np.ndarray) -> np.ndarray:
    """Integer lattice coordinates (n, D) as one int64 key each (16 bits a coordinate)."""
    key = np.zeros(z.shape[0], dtype=np.int64)
    for j in range(z.shape[1]):
        key |= (z[:, j].astype(np.int64) + _BIAS) << (_BITS * j)
    return key


def _unpack(key: np.ndarray, D: int) -> np.ndarray:
    return np.stack([((key >> (_BITS * j)) & 0xFFFF) - _BIAS for j in range(D)], axis=1)


def _flood(target: Any, centre: torch.Tensor, L: torch.Tensor, h: float, seeds: np.ndarray, drop: float,
           max_cells: int, budget: Any, bar: Progress) -> tuple[np.ndarray, torch.Tensor, dict[str, Any]]:
    """Flood the lattice :math:`\theta^* + hLz` from the cells ``seeds`` (module docstring): (keys, log joints,
    info). ``info["stop"]`` is None when the flood ran out, ``"outgrown"`` when it passed ``max_cells`` or the
    coordinates' range, ``"empty"`` when the log joint is -inf at every seed; the keys are then empty."""
    D = L.shape[0]
    offsets = np.stack(np.meshgrid(*[np.array([-1, 0, 1])] * D, indexing="ij"), -1).reshape(-1, D)
    step = _pack(offsets[np.any(offsets != 0, axis=1)]) - _pack(np.zeros((1, D), dtype=np.int64))
    seen = frontier = np.unique(_pack(seeds))
    all_keys: list[np.ndarray] = []
    lps: list[torch.Tensor] = []
    best, faults, stop = -math.inf, 0, None
    while frontier.size and stop is None:
        z = torch.as_tensor(_unpack(frontier, D), dtype=centre.dtype, device=centre.device)
        lp, _ = log_joint_at(target, centre + h * z @ L.T, budget)
        faults += int((torch.isnan(lp) | (lp == math.inf)).sum())
        lp = torch.where(torch.isfinite(lp), lp, torch.full_like(lp, -math.inf))
        all_keys.append(frontier)
        lps.append(lp)
        bar.update(int(frontier.size), h=h, waves=len(lps))
        best = max(best, float(lp.max()))
        if best == -math.inf:                                 # no mass where the flood starts
            stop = "empty"
            break
        inside = frontier[(lp >= best - drop).cpu().numpy()]
        cand = np.sort((inside[:, None] + step[None, :]).ravel())
        cand = cand[np.r_[True, cand[1:] != cand[:-1]]] if cand.size else cand
        at = np.minimum(np.searchsorted(seen, cand), seen.size - 1)
        frontier = cand[seen[at] != cand]                     # sorted, unseen
        seen = np.sort(np.concatenate([seen, frontier]), kind="stable")   # two sorted runs: a merge
        if seen.size > max_cells or (frontier.size and np.abs(_unpack(frontier, D)).max() >= _BIAS - 2):
            stop = "outgrown"
    info = {"cells": int(seen.size), "waves": len(lps), "faults": faults, "stop": stop}
    if stop is not None:
        return np.empty(0, dtype=np.int64), centre.new_empty(0), info
    return np.concatenate(all_keys), torch.cat(lps), info


def _coset_spread(z: np.ndarray, w: torch.Tensor, theta: torch.Tensor) -> tuple[float, float]:
    """Largest |coset mean - mean| / sd and |coset sd / sd - 1| over the lattice's 2^D cosets of spacing 2h."""
    mean = w @ theta
    sd = torch.sqrt(w @ (theta - mean) ** 2)
    code = torch.as_tensor(((z % 2) * (1 << np.arange(z.shape[1]))).sum(1), device=theta.device)
    dm, ds = 0.0, 0.0
    for c in range(1 << z.shape[1]):
        sel = code == c
        wc = w[sel]
        if not float(wc.sum()) > 0:
            return math.inf, math.inf
        wc = wc / wc.sum()
        mc = wc @ theta[sel]
        sc = torch.sqrt(wc @ (theta[sel] - mc) ** 2)
        dm = max(dm, float(((mc - mean).abs() / sd).max()))
        ds = max(ds, float((sc / sd - 1).abs().max()))
    return dm, ds


def grid_posterior(target: Any, start: Any, *, step: float = GRID_STEP, drop: float = GRID_DROP,
                   max_cells: int = GRID_MAX_CELLS, budget: Any = None,
                   progress_bar: bool = False) -> tuple[WeightedPosterior | None, dict[str, Any]]:
    r"""The posterior by quadrature on the lattice around ``start`` (module docstring).

    Parameters
    ----------
    target : model or target
        Anything with ``names`` and a batched ``log_joint``.
    start : Start
        The MAP optimum with its Laplace ``scale_tril`` (:func:`~gpvi.inference.dsvi.starts.map_laplace_starts`);
        its ``alternatives`` (other optima) seed the flood too.
    step, drop, max_cells
        h, the exploration threshold (nats) and the cell budget (``GRID_STEP``, ``GRID_DROP``, ``GRID_MAX_CELLS``).
    budget : MemoryBudget, optional
        Chunks the batched log-joint calls.
    progress_bar : bool
        A bar counting the evaluated cells (no total: the flood's extent is not known in advance).

    Returns
    -------
    (WeightedPosterior or None, dict)
        The lattice's posterior when the check passed (None otherwise) and what was done: ``reliable``,
        ``reason``, ``step`` (the final h), ``cells``, ``waves``, ``coset_mean`` and ``coset_sd`` (the check's
        spreads), ``edge_mass`` (the weight of the evaluated cells below the threshold), ``non_finite`` (cells whose
        log joint was NaN or +inf: the check then fails), ``zero_density`` (cells at -inf), ``log_evidence`` and
        ``wall``.

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.inference.init import Start
    >>> t = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=["a", "b"])
    >>> s = Start(torch.zeros(2, dtype=torch.float64), torch.eye(2, dtype=torch.float64), "laplace")
    >>> post, info = grid_posterior(t, s)
    >>> info["reliable"], round(float(post.std[0]), 4), round(info["log_evidence"], 4)  # log(2 pi) = 1.8379
    (True, 1.0, 1.8379)
    """
    t0 = time.perf_counter()
    step = check_positive(step, "step")
    drop = check_positive(drop, "drop")
    max_cells = check_positive_int(max_cells, "max_cells")
    budget = MemoryBudget() if budget is None else budget       # one budget for every wave's calls
    L = start.scale_tril
    info: dict[str, Any] = {"reliable": False, "step": step, "cells": 0, "waves": 0, "coset_mean": math.nan,
                            "coset_sd": math.nan, "edge_mass": math.nan, "non_finite": 0,
                            "zero_density": 0, "log_evidence": math.nan}
    D = int(start.theta.shape[0])
    if L is None or L.dim() != 2 or not bool(torch.isfinite(L).all()) or D > GRID_MAX_D:
        info.update(reason="no Laplace scale at the MAP optimum" if D <= GRID_MAX_D else
                    f"{D} parameters (the grid takes at most {GRID_MAX_D})", wall=time.perf_counter() - t0)
        return None, info
    centre = start.theta.detach()
    L = L.detach().to(centre)
    Linv = torch.linalg.inv(L)
    thetas = [centre] + [a.theta.detach().to(centre) for a in getattr(start, "alternatives", ())]
    post = None
    for _ in range(2):                                         # h, then h / 2 once
        seeds = np.rint(torch.stack([(Linv @ (t - centre)) / step for t in thetas]).cpu().numpy())
        seeds = seeds[np.all(np.abs(seeds) < _BIAS // 2, axis=1)].astype(np.int64)   # the MAP optimum's cell: 0
        with Progress(None, enabled=progress_bar, desc="grid cells", leave=False) as bar:
            keys, lp, flood = _flood(target, centre, L, step, seeds, drop, max_cells, budget, bar)
        info.update(step=step, cells=flood["cells"], waves=info["waves"] + flood["waves"])
        if flood["stop"] == "outgrown":
            info["reason"] = (f"the lattice outgrew {max_cells:,} cells (h = {step:g} Laplace sd): an improper, very "
                              "flat or wide posterior for quadrature")
            break
        if flood["stop"] == "empty":
            info["reason"] = "the log joint is -inf at every MAP optimum's cell"
            break
        if flood["faults"]:
            info.update(non_finite=flood["faults"], reason=f"the log joint failed (NaN) at {flood['faults']} cells "
                        "next to the mass")
            break
        z = _unpack(keys, D)
        theta = centre + step * torch.as_tensor(z, dtype=centre.dtype, device=centre.device) @ L.T
        top = float(lp.max())
        w = torch.exp(lp - top)
        total = w.sum()
        w = w / total
        info["zero_density"] = int((~torch.isfinite(lp)).sum())
        info["edge_mass"] = float(w[lp < top - drop].sum())
        info["log_evidence"] = float(top + torch.log(total) + D * math.log(step) + torch.logdet(L).item())
        dm, ds = _coset_spread(z, w, theta)
        info.update(coset_mean=dm, coset_sd=ds)
        if dm <= GRID_TOL_MEAN and ds <= GRID_TOL_SD:
            info.update(reliable=True, reason=(f"{flood['cells']:,} cells at h = {step:g} Laplace sd; its 2h cosets "
                                               f"agree (means within {dm:.3f} sd, sds within {ds:.1%})"))
            post = WeightedPosterior(theta, torch.log(w), list(target.names), target, khat=math.nan,
                                     log_evidence=info["log_evidence"], info={"proposal": "grid", "grid": None})
            break
        info["reason"] = (f"the 2h cosets disagree at h = {step:g} Laplace sd (means by {dm:.3f} sd, sds by "
                          f"{ds:.1%})")
        if flood["cells"] * 2 ** D > max_cells:
            break
        step = step / 2
    info["wall"] = time.perf_counter() - t0
    if post is not None:
        post.info["grid"] = dict(info)
    return post, info
