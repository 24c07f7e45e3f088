r"""Draws from MCMC (or any sampler) with the common posterior surface.

``draws`` has shape ``(C, S, D)`` (chains, draws per chain, parameters); ``samples`` pools them to
``(C S, D)``. Moments and quantiles are those of the pooled draws (``std`` with Bessel's correction),
``sample(n)`` resamples the pooled draws, and ``summary()`` adds ArviZ's bulk and tail ESS, split R-hat and MCSE.
"""

from __future__ import annotations

from typing import Any

import torch

from ..rng import resolve_generator
from ..validation import check_positive_int
from .base import Posterior, _plain
from .diagnostics import diagnostics

__all__ = ["SamplePosterior"]


class SamplePosterior(Posterior):
    """Draws from MCMC (or any sampler): ``draws`` of shape ``(chains, draws_per_chain, D)``.

    Parameters
    ----------
    draws : torch.Tensor of shape (C, S, D)
    names : list of str
    target : optional
    stats : dict, optional
        Per-chain sampler statistics, each an array of shape ``(C, S)`` (e.g. ``diverging``,
        ``acceptance_rate``, ``step_size``, ``tree_depth``), exported to ArviZ's ``sample_stats``.
    info : dict, optional
        Run details. ``info["warmup_draws"]`` (``(C, W, D)``) and ``info["warmup_stats"]`` (each ``(C, W)``),
        when present, are exported to ArviZ's ``warmup_posterior`` / ``warmup_sample_stats``.
    engine_state : optional
        The sampler's final state (for resuming or extending the run, e.g.
        :class:`gpvi.inference.mcmc.state.MCMCState`); a private copy is kept and ``state_dict()`` includes its
        ``state_dict()``.

    Examples
    --------
    >>> import torch
    >>> from gpvi.posteriors import SamplePosterior
    >>> mc = SamplePosterior(torch.zeros(2, 10, 3, dtype=torch.float64), ["a", "b", "c"])
    >>> mc.samples.shape, mc.quantile(0.5).shape
    (torch.Size([20, 3]), torch.Size([3]))
    """

    kind = "samples"

    def __init__(self, draws: torch.Tensor, names: list[str], target: Any = None, *,
                 stats: dict[str, Any] | None = None, info: dict[str, Any] | None = None,
                 engine_state: Any = None) -> None:
        super().__init__(names, target, info, engine_state=engine_state)
        if draws.dim() != 3 or draws.shape[-1] != len(names):
            raise ValueError(f"draws must have shape (chains, draws, {len(names)}); got {tuple(draws.shape)}")
        if draws.shape[0] == 0 or draws.shape[1] == 0:
            raise ValueError(f"draws is empty (shape {tuple(draws.shape)})")
        self.draws = draws.detach().clone()
        self.stats = dict(stats or {})

    @property
    def samples(self) -> torch.Tensor:
        """All draws pooled, ``(chains * draws, D)``."""
        return self.draws.reshape(-1, self.dim)

    @property
    def num_chains(self) -> int:
        return self.draws.shape[0]

    @property
    def mean(self) -> torch.Tensor:
        """Mean of the pooled draws, shape (D,)."""
        return self.samples.mean(0)

    @property
    def std(self) -> torch.Tensor:
        """Standard deviation of the pooled draws (Bessel-corrected; zeros for a single draw), shape (D,)."""
        s = self.samples
        return s.std(0) if s.shape[0] > 1 else torch.zeros(self.dim, dtype=s.dtype, device=s.device)

    @property
    def covariance(self) -> torch.Tensor:
        """Sample covariance of the pooled draws, shape (D, D)."""
        return torch.cov(self.samples.T).reshape(self.dim, self.dim)

    def sample(self, n: int, generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
        """``n`` rows picked from the pooled draws (without replacement when ``n`` <= the number of draws)."""
        n = check_positive_int(n, "n")
        gen = resolve_generator(seed, generator)
        total = self.samples.shape[0]
        if n <= total:
            idx = torch.randperm(total, generator=gen)[:n]
        else:
            idx = torch.randint(total, (n,), generator=gen)
        return self.samples[idx.to(self.samples.device)]

    def _quantiles(self, probs: torch.Tensor) -> torch.Tensor:
        return torch.quantile(self.samples, probs.to(self.samples), dim=0)

    def _marginal(self, mean, sd):
        n = self.samples.shape[0]
        return [{"family": "empirical", "num_draws": n} for _ in range(self.dim)]

    def _predict_draws(self, num_draws, *, generator, seed):
        num_draws = check_positive_int(num_draws, "num_draws")
        total = self.samples.shape[0]
        if num_draws >= total:
            return self.samples
        # evenly spaced over the pooled chains: deterministic and low-variance
        idx = torch.linspace(0, total - 1, num_draws).round().long()
        return self.samples[idx.to(self.samples.device)]

    def diagnostics(self) -> dict[str, torch.Tensor]:
        """ArviZ's ``ess_bulk``, ``ess_tail``, ``r_hat``, ``mcse_mean``, ``mcse_sd`` per parameter (each ``(D,)``;
        :func:`gpvi.posteriors.diagnostics.diagnostics`)."""
        return diagnostics(self.draws)

    def ess(self, method: str = "bulk") -> torch.Tensor:
        """Effective sample size per parameter, ArviZ's ``"bulk"`` (default) or ``"tail"`` ESS, shape (D,)."""
        if method not in ("bulk", "tail"):
            raise ValueError(f"method must be 'bulk' or 'tail'; got {method!r}")
        return self.diagnostics()["ess_" + method]

    def r_hat(self) -> torch.Tensor:
        """Rank-normalised split R-hat per parameter (ArviZ's ``rhat``), shape (D,); NaN below 4 draws per chain."""
        return self.diagnostics()["r_hat"]

    def _extra_summary_columns(self):
        d = self.diagnostics()
        return {k: d[k].tolist() for k in ("ess_bulk", "ess_tail", "r_hat", "mcse_mean")}

    def _arviz_draws(self, num_draws, seed):
        return self.draws

    def _arviz_extra(self):
        out: dict[str, Any] = {}
        if self.stats:
            out["sample_stats"] = {k: torch.as_tensor(v).cpu().numpy() for k, v in self.stats.items()}
        warm = self.info.get("warmup_draws")
        if isinstance(warm, torch.Tensor) and warm.dim() == 3 and warm.shape[1] > 0:
            out["warmup_posterior"] = {n: warm[:, :, j].cpu().numpy() for j, n in enumerate(self.names)}
            wstats = self.info.get("warmup_stats") or {}
            if wstats:
                out["warmup_sample_stats"] = {k: torch.as_tensor(v).cpu().numpy() for k, v in wstats.items()}
            out["save_warmup"] = True
        return out

    def _state(self) -> dict[str, Any]:
        return {"draws": self.draws, "stats": _plain(self.stats)}

    @classmethod
    def _from_state(cls, state, target, common):
        return cls(state["draws"], list(state["names"]), target, stats=state["stats"], **common)
