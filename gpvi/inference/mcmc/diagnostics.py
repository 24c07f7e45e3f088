r"""Summaries of a NUTS/HMC run: the block of chains returned, ESS / split R-hat, divergences, per-chain table.

ESS is Pyro's ``effective_sample_size`` (Geyer's initial monotone sequence over all chains) and
:math:`\hat R` Pyro's ``split_gelman_rubin``, both over the post-warm-up draws ``(C, S, D)``. The thresholds of the
end-of-run :class:`~gpvi.exceptions.ConvergenceWarning` come from
:class:`~gpvi.inference.mcmc.settings.ConvergenceChecks`.

References
----------
A. Vehtari, A. Gelman, D. Simpson, B. Carpenter, P.-C. Bürkner (2021). Rank-normalization, folding, and
localization: an improved R-hat for assessing convergence of MCMC. Bayesian Analysis 16(2).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from ...evaluation.table import Table
from ...exceptions import ConvergenceWarning
from .settings import ConvergenceChecks
from .state import ChainState

__all__ = ["usable_block", "ess_and_r_hat", "chain_table", "convergence_problems", "warn_convergence"]


def usable_block(chains: list[ChainState], num_draws: int) -> tuple[int, int]:
    """The chains a result is built from: ``(k, length)`` = the first ``k`` chains, each cut to ``length`` draws.

    The chains that finished (a prefix: chains run in order); if none did, the largest rectangular block of draws
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


def ess_and_r_hat(draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ESS and split :math:`\\hat R` per parameter of ``draws`` ``(C, S, D)``; NaN for fewer than 4 draws per chain.

    Returns
    -------
    ess, r_hat : torch.Tensor of shape (D,)
    """
    from pyro.ops.stats import effective_sample_size, split_gelman_rubin

    if draws.shape[1] >= 4:
        return (effective_sample_size(draws, chain_dim=0, sample_dim=1),
                split_gelman_rubin(draws, chain_dim=0, sample_dim=1))
    nan = torch.full((draws.shape[-1],), math.nan, dtype=draws.dtype, device=draws.device)
    return nan, nan.clone()


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
    cols["warmup_s"] = [cs.warmup_time_s for cs in use]
    cols["sampling_s"] = [cs.sampling_time_s for cs in use]
    return Table([str(i) for i in range(C)], cols, title=f"{name} chains"), num_div, depth_hits


def convergence_problems(checks: ConvergenceChecks, ess: torch.Tensor, r_hat: torch.Tensor, divergences: int,
                         depth_hits: list[int] | None, num_chains: int) -> list[str]:
    """What a complete run's diagnostics violate (empty when nothing): R-hat, ESS, divergences, tree depth."""
    problems = []
    if bool((r_hat > checks.max_r_hat).any()):
        problems.append(f"split R-hat up to {float(r_hat.nan_to_num(0).max()):.3f} > {checks.max_r_hat:g}")
    need = checks.min_ess_for(num_chains)
    if bool((ess < need).any()):
        problems.append(f"smallest ESS {float(ess.min()):.0f} < {need:g}")
    if divergences:
        problems.append(f"{divergences} divergent transition(s) after warm-up")
    if depth_hits and sum(depth_hits):
        problems.append(f"{sum(depth_hits)} draw(s) hit the maximum tree depth")
    return problems


def warn_convergence(name: str, problems: list[str], num_chains: int, length: int, *, stacklevel: int = 2) -> None:
    """Issue one :class:`~gpvi.exceptions.ConvergenceWarning` listing ``problems`` (nothing when empty)."""
    if problems:
        warnings.warn(f"{name} diagnostics: " + "; ".join(problems) +
                      f" ({num_chains} chains x {length} draws); see posterior.summary() and "
                      f"posterior.info['chains']", ConvergenceWarning, stacklevel=stacklevel + 1)
