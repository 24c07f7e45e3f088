r"""A finite mixture of Gaussian posteriors: the proposal that covers several basins of a posterior.

When DSVI's starts (one per distinct MAP optimum, :mod:`gpvi.inference.dsvi.starts`) end in different basins, the
best single Gaussian leaves the others' mass out, and PSIS of that Gaussian cannot see it: its draws never reach
the other basins, so the importance ratios look well behaved (:math:`\hat k` small) while a marginal misses by
half a posterior sd (Bodyfat in ``benchmarks/results/nuts_fidelity.md``). The mixture

.. math:: q(\theta) = \sum_k \pi_k\, q_k(\theta), \qquad \pi_k \propto \exp \mathcal L_k,

of the starts' Gaussians :math:`q_k` with weights proportional to the exponentiated bounds :math:`\mathcal L_k`
(each :math:`\exp\mathcal L_k` is a lower estimate of the evidence held by its basin when the basins do not
overlap: the weighting of Yao, Vehtari & Gelman, *Stacking for non-mixing Bayesian computations*, JMLR 2022, with
bounds in place of the stacking objective) is the proposal for PSIS (:func:`gpvi.posteriors.weighted.psis`), which
corrects the weights and diagnoses the whole mixture. :meth:`GaussianMixture.basin_mass` turns PSIS weights into
the posterior mass each component accounts for.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..linalg import cholesky_with_jitter
from ..rng import resolve_generator
from ..validation import check_positive_int
from .base import Posterior, posterior_from_state_dict

__all__ = ["GaussianMixture"]

_BISECT_STEPS = 80


class GaussianMixture(Posterior):
    r"""The mixture :math:`\sum_k \pi_k q_k` of posteriors with ``sample`` and ``log_prob`` (Gaussian ones).

    Parameters
    ----------
    components : list of GaussianPosterior
        Same names, device and dtype.
    log_weights : array-like of shape (K,)
        Unnormalised log weights :math:`\log\pi_k` (e.g. the components' bounds).
    target : optional
        The model (default: the first component's).

    Attributes
    ----------
    weights : torch.Tensor of shape (K,)
        Normalised :math:`\pi_k`.

    Examples
    --------
    >>> import torch
    >>> from gpvi.posteriors import GaussianPosterior
    >>> from gpvi.posteriors.mixture import GaussianMixture
    >>> I = torch.eye(1, dtype=torch.float64)
    >>> q = GaussianMixture([GaussianPosterior(torch.tensor([-2.0], dtype=torch.float64), I, ["a"]),
    ...                      GaussianPosterior(torch.tensor([2.0], dtype=torch.float64), I, ["a"])], [0.0, 0.0])
    >>> float(q.mean[0]), round(float(q.std[0]) ** 2, 6)
    (0.0, 5.0)
    """

    kind = "gaussian_mixture"

    def __init__(self, components: list[Any], log_weights: Any, target: Any = None, *,
                 info: dict[str, Any] | None = None) -> None:
        components = list(components)
        if not components:
            raise ValueError("components must hold at least one posterior")
        for c in components:
            if not (callable(getattr(c, "sample", None)) and callable(getattr(c, "log_prob", None))):
                raise TypeError(f"components must have sample and log_prob; got {type(c).__name__}")
            if list(c.names) != list(components[0].names):
                raise ValueError("components must have the same names")
        ref = components[0].mean
        lw = torch.as_tensor(log_weights, dtype=ref.dtype).to(ref.device).reshape(-1)
        if lw.shape[0] != len(components):
            raise ValueError(f"log_weights must have length {len(components)}; got {lw.shape[0]}")
        if not bool(torch.isfinite(lw).any()):
            raise ValueError("log_weights must have at least one finite entry")
        super().__init__(components[0].names, components[0].target if target is None else target, info)
        self.components = components
        self.log_weights = torch.log_softmax(torch.where(torch.isnan(lw), torch.full_like(lw, -math.inf), lw), 0)

    @property
    def weights(self) -> torch.Tensor:
        return torch.exp(self.log_weights)

    @property
    def elbo(self) -> float:
        """The best component's bound (the mixture's own bound is not computed)."""
        return max(float(getattr(c, "elbo", math.nan)) for c in self.components)

    @property
    def mean(self) -> torch.Tensor:
        return sum(w * c.mean for w, c in zip(self.weights, self.components))

    @property
    def covariance(self) -> torch.Tensor:
        r""":math:`\sum_k \pi_k (\Sigma_k + \mu_k\mu_k^\top) - \mu\mu^\top`, (D, D)."""
        m = self.mean
        out = -torch.outer(m, m)
        for w, c in zip(self.weights, self.components):
            out = out + w * (c.covariance + torch.outer(c.mean, c.mean))
        return out

    @property
    def scale_tril(self) -> torch.Tensor:
        """Cholesky factor of :attr:`covariance`, (D, D): the scale of the moment-matched Gaussian, which is how a
        mixture warm-starts an engine (``gpvi.NUTS(...).run(target, init=mixture)``: chains from that Gaussian's
        draws, the mixture's covariance as the dense inverse mass matrix)."""
        return cholesky_with_jitter(self.covariance, what="mixture covariance").L

    @property
    def std(self) -> torch.Tensor:
        m = self.mean
        second = sum(w * (c.std ** 2 + c.mean ** 2) for w, c in zip(self.weights, self.components))
        return torch.sqrt(torch.clamp(second - m * m, min=0.0))

    def sample(self, n: int, generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
        """``(n, D)`` draws: component counts from a multinomial on :math:`\\pi`, then each component's draws,
        shuffled."""
        n = check_positive_int(n, "n")
        gen = resolve_generator(seed, generator)
        idx = torch.multinomial(self.weights.cpu(), n, replacement=True, generator=gen)
        counts = torch.bincount(idx, minlength=len(self.components)).tolist()
        parts = [c.sample(k, generator=gen) for c, k in zip(self.components, counts) if k > 0]
        out = torch.cat(parts)
        perm = torch.randperm(n, generator=gen)
        return out[perm.to(out.device)]

    def sample_reusing(self, n: int, reuse: dict[int, tuple[torch.Tensor, torch.Tensor]], *,
                       generator: torch.Generator | None = None, seed: int | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""``n`` draws as :meth:`sample` (component counts from a multinomial on :math:`\pi`, shuffled), where
        component k's first draws are taken from ``reuse[k] = (draws, values)``, draws of that component made
        earlier with a value each (e.g. the log joint), and only the rest are new.

        The pooled draws are independent of the counts and of the new draws, so the result is distributed as
        ``n`` independent draws of the mixture; a value is carried with each reused draw.

        Returns
        -------
        draws : torch.Tensor of shape (n, D)
        values : torch.Tensor of shape (n,)
            The reused draws' values, NaN for new draws.
        """
        n = check_positive_int(n, "n")
        gen = resolve_generator(seed, generator)
        idx = torch.multinomial(self.weights.cpu(), n, replacement=True, generator=gen)
        counts = torch.bincount(idx, minlength=len(self.components)).tolist()
        parts, vals = [], []
        for k, (c, m) in enumerate(zip(self.components, counts)):
            if m == 0:
                continue
            pool, pool_vals = reuse.get(k, (None, None))
            r = 0 if pool is None else min(m, int(pool.shape[0]))
            if r:
                parts.append(pool[:r])
                vals.append(pool_vals[:r].to(pool))
            if m > r:
                new = c.sample(m - r, generator=gen)
                parts.append(new)
                vals.append(torch.full((m - r,), math.nan, dtype=new.dtype, device=new.device))
        out, values = torch.cat(parts), torch.cat(vals)
        perm = torch.randperm(n, generator=gen).to(out.device)
        return out[perm], values[perm]

    def component_log_probs(self, theta: Any) -> torch.Tensor:
        """``(..., K)``: :math:`\\log\\pi_k + \\log q_k(\\theta)`."""
        return torch.stack([lw + c.log_prob(theta) for lw, c in zip(self.log_weights, self.components)], -1)

    def log_prob(self, theta: Any) -> torch.Tensor:
        """:math:`\\log\\sum_k \\pi_k q_k(\\theta)`; shapes ``(D,) -> ()`` and ``(S, D) -> (S,)``."""
        return torch.logsumexp(self.component_log_probs(theta), -1)

    def responsibilities(self, theta: Any) -> torch.Tensor:
        """``(S, K)``: :math:`\\pi_k q_k(\\theta_s) / q(\\theta_s)`."""
        return torch.softmax(self.component_log_probs(theta), -1)

    def basin_mass(self, weighted: Any) -> torch.Tensor:
        r"""Posterior mass each component accounts for, from PSIS draws of this mixture.

        :math:`\hat m_k = \sum_s w_s\, r_{sk}` with PSIS weights :math:`w_s` and responsibilities
        :math:`r_{sk}` (:meth:`responsibilities`): a self-normalised importance estimate of
        :math:`\mathrm E_p[r_k(\theta)]`, which is the posterior mass of basin k when the components do not overlap.

        Parameters
        ----------
        weighted : WeightedPosterior
            ``psis(self, ...)``.

        Returns
        -------
        torch.Tensor of shape (K,)
        """
        return weighted.weights @ self.responsibilities(weighted.draws)

    def _quantiles(self, probs: torch.Tensor) -> torch.Tensor:
        """Each margin's quantiles by bisection on the mixture of the components' normal CDFs."""
        mus = torch.stack([c.mean for c in self.components])                  # (K, D)
        sds = torch.stack([c.std for c in self.components])
        w = self.weights[:, None, None]                                      # (K, 1, 1)
        p = probs.to(mus)[:, None]                                           # (P, 1)
        lo = (mus - 12 * sds).min(0).values.expand(p.shape[0], -1).clone()
        hi = (mus + 12 * sds).max(0).values.expand(p.shape[0], -1).clone()
        for _ in range(_BISECT_STEPS):
            mid = 0.5 * (lo + hi)
            cdf = (w * torch.special.ndtr((mid[None] - mus[:, None]) / sds[:, None])).sum(0)
            below = cdf < p
            lo = torch.where(below, mid, lo)
            hi = torch.where(below, hi, mid)
        return 0.5 * (lo + hi)

    def _marginal(self, mean, sd):
        return [{"family": "normal_mixture", "weights": self.weights.tolist(),
                 "locs": [float(c.mean[j]) for c in self.components],
                 "scales": [float(c.std[j]) for c in self.components]} for j in range(self.dim)]

    def _state(self) -> dict[str, Any]:
        return {"components": [c.state_dict() for c in self.components], "log_weights": self.log_weights}

    @classmethod
    def _from_state(cls, state, target, common):
        comps = [posterior_from_state_dict(s, target) for s in state["components"]]
        return cls(comps, state["log_weights"], target, info=common.get("info"))

    def __repr__(self) -> str:
        w = ", ".join(f"{float(x):.3f}" for x in self.weights)
        return f"GaussianMixture(D={self.dim}, K={len(self.components)}, weights=[{w}])"
