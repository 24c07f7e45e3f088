r"""Summaries of a NUTS/HMC run: the block of chains returned, divergences, E-BFMI, per-chain table, warnings.

ESS (bulk and tail), :math:`\hat R` and MCSE of the post-warm-up draws ``(C, S, D)`` are
:func:`gpvi.posteriors.diagnostics.diagnostics` (ArviZ's). The thresholds of the end-of-run
:class:`~gpvi.exceptions.ConvergenceWarning` come from :class:`~gpvi.inference.mcmc.settings.ConvergenceChecks`.

References
----------
M. Betancourt (2016). Diagnosing suboptimal cotangent disintegrations in Hamiltonian Monte Carlo. arXiv:1604.00695.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from ...table import Table
from ...exceptions import ConvergenceWarning
from .settings import ConvergenceChecks
from .state import ChainState

__all__ = ["usable_block", "chain_table", "convergence_problems", "warn_convergence",
           "e_bfmi", "MIN_E_BFMI"]

MIN_E_BFMI = 0.3
"""E-BFMI below this (Stan's threshold, Betancourt 2016) flags a chain whose momentum resampling explores the energy
distribution poorly (heavy tails, funnels)."""


def e_bfmi(energy: torch.Tensor) -> list[float]:
    r"""Energy Bayesian fraction of missing information per chain, ArviZ's ``bfmi`` (Betancourt 2016, eq. 3):
    :math:`\sum_n (E_n - E_{n-1})^2 / \sum_n (E_n - \bar E)^2` over a chain's energies ``(C, S)``; NaN where the
    energies were not recorded or a chain has fewer than 3 draws."""
    import arviz as az                                           # imported on use: importing ArviZ takes seconds

    out = []
    for row in energy.detach().cpu().double():
        if row.numel() < 3 or not bool(torch.isfinite(row).all()):
            out.append(math.nan)
            continue
        out.append(float(az.bfmi(row.numpy()[None, :])[0]))
    return out


def usable_block(chains: list[ChainState], num_draws: int) -> tuple[int, int]:
    """The chains a result is built from: ``(k, length)`` = the first ``k`` chains, each cut to ``length`` draws.

    The chains that finished, when they are the first ones; if none did, the largest rectangular block of draws
    (the first ``k`` chains, each cut to the shortest of them). ``length`` is 0 when there is no draw at all.
    """
    finished = [cs.num_draws >= num_draws for cs in chains]
    best_k, length = (finished.index(False) if not all(finished) else len(finished)), num_draws
    if best_k == 0:
        length = 0
        for k in range(1, len(chains) + 1):
            m = min(cs.num_draws for cs in chains[:k])
            if k * m >= best_k * length:
                best_k, length = k, m
    return best_k, length


def chain_table(name: str, use: list[ChainState], stats: dict[str, torch.Tensor], length: int,
                max_tree_depth: int | None) -> tuple[Table, list[int], list[int] | None]:
    """Per-chain table (draws, divergences, acceptance, step size, trajectory lengths, times).

    Returns
    -------
    table : Table
        One row per chain of ``use``.
    num_divergent : list of int
        Divergent transitions after warm-up, per chain.
    depth_hits : list of int or None
        Draws that reached ``max_tree_depth`` per chain (NUTS), else ``None``.
    """
    C = len(use)
    num_div = [int(stats["diverging"][i].sum()) for i in range(C)]
    cols: dict[str, list[Any]] = {
        "draws": [length] * C, "divergent": num_div,
        "accept": [float(stats["acceptance_rate"][i].mean()) for i in range(C)],
        "step_size": [cs.step_size for cs in use],
        "mean_n_steps": [float(stats["n_steps"][i].double().mean()) for i in range(C)],
    }
    depth_hits = None
    if "tree_depth" in stats and max_tree_depth is not None:
        cols["mean_tree_depth"] = [float(stats["tree_depth"][i].double().mean()) for i in range(C)]
        depth_hits = [int((stats["tree_depth"][i] >= max_tree_depth).sum()) for i in range(C)]
        cols["max_depth_hits"] = depth_hits
    if "energy" in stats:
        cols["e_bfmi"] = e_bfmi(stats["energy"])
    cols["warmup_s"] = [cs.warmup_time_s for cs in use]
    cols["sampling_s"] = [cs.sampling_time_s for cs in use]
    return Table([str(i) for i in range(C)], cols, title=f"{name} chains"), num_div, depth_hits


def convergence_problems(checks: ConvergenceChecks, ess: torch.Tensor, r_hat: torch.Tensor, divergences: int,
                         depth_hits: list[int] | None, num_chains: int, bfmi: list[float] | None = None) -> list[str]:
    """What a complete run's diagnostics violate (empty when nothing): R-hat, ESS, divergences, tree depth, E-BFMI."""
    problems = []
    if bool((r_hat > checks.max_r_hat).any()):
        problems.append(f"split R-hat up to {float(r_hat.nan_to_num(0).max()):.3f} > {checks.max_r_hat:g}")
    need = checks.min_ess_for(num_chains)
    if bool((ess < need).any()):
        problems.append(f"smallest bulk or tail ESS {float(ess.min()):.0f} < {need:g}")
    if divergences:
        problems.append(f"{divergences} divergent transition(s) after warm-up")
    if depth_hits and sum(depth_hits):
        problems.append(f"{sum(depth_hits)} draw(s) hit the maximum tree depth")
    low = [i for i, b in enumerate(bfmi or []) if b < MIN_E_BFMI]
    if low:
        problems.append(f"E-BFMI below {MIN_E_BFMI} in chain(s) {low} (min {min(bfmi[i] for i in low):.2f}): the "
                        "energy distribution is explored poorly (heavy tails or a funnel)")
    return problems


def warn_convergence(name: str, problems: list[str], num_chains: int, length: int, *, stacklevel: int = 2) -> None:
    """Issue one :class:`~gpvi.exceptions.ConvergenceWarning` listing ``problems`` (nothing when empty)."""
    if problems:
        warnings.warn(f"{name} diagnostics: " + "; ".join(problems) +
                      f" ({num_chains} chains x {length} draws); see posterior.summary() and "
                      f"posterior.info['chains']", ConvergenceWarning, stacklevel=stacklevel + 1)
