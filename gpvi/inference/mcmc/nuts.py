r"""NUTS over the unconstrained theta, on the same ``log_joint`` as DSVI and ML-II.

The sampler targets :math:`\pi(\theta) \propto g(\theta) = p(y \mid \theta)\,p(\theta)`, the same log joint
:math:`\log g(\theta)` that DSVI's bound (DSVI paper eq. 3) and ML-II use, with potential energy
:math:`U(\theta) = -\log g(\theta)` and kinetic energy :math:`K(r) = \tfrac12 r^\top M^{-1} r`:

.. math::

    H(\theta, r) = -\log g(\theta) + \tfrac12 r^\top M^{-1} r,\qquad r \sim \mathcal N(0, M),

integrated by the leapfrog (velocity Verlet) scheme with step size :math:`\epsilon` (Neal 2011, eqs. 5.18-5.20).
:class:`NUTS` builds the trajectory by doubling until a U-turn, with multinomial sampling of the next state
(Hoffman & Gelman 2014, Algorithm 3 with the multinomial variant of Betancourt 2017); :class:`~gpvi.inference.mcmc.
hmc.HMC` runs a fixed trajectory length :math:`L\epsilon`. During warm-up the step size is tuned by dual averaging
towards a target acceptance statistic (Hoffman & Gelman 2014, Algorithm 5 / eq. 6) and a diagonal (or dense)
inverse mass matrix :math:`M^{-1}` is estimated from the warm-up draws in Stan's doubling windows
(:class:`~gpvi.inference.mcmc.settings.Adaptation`).

Names: ``theta`` (:math:`\theta`), ``step_size`` (:math:`\epsilon`), ``inverse_mass_matrix`` (:math:`M^{-1}`),
``num_leapfrog_steps`` (:math:`L`), ``target_accept`` (:math:`\delta` of dual averaging), ``num_draws`` (draws per
chain after warm-up), ``num_warmup``, ``num_chains``.

References
----------
R. M. Neal (2011). MCMC using Hamiltonian dynamics. Handbook of Markov Chain Monte Carlo, ch. 5.
M. D. Hoffman and A. Gelman (2014). The No-U-Turn Sampler. JMLR 15, 1593-1623.
M. Betancourt (2017). A conceptual introduction to Hamiltonian Monte Carlo. arXiv:1701.02434.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...validation import check_positive_int
from .chains import tree_depth
from .engine import HamiltonianEngine
from .kernel import Asks, Metric, Uniforms, nuts_transition
from .settings import Adaptation, ConvergenceChecks
from .trees import MAX_DEPTH, compiled, request

__all__ = ["NUTS"]


class NUTS(HamiltonianEngine):
    r"""No-U-Turn sampler over theta with step-size and mass-matrix adaptation (multinomial NUTS in NumPy,
    :mod:`gpvi.inference.mcmc.kernel`; with numba installed, ``pip install gpvi[fast]``, the trees of a diagonal
    metric are compiled, :mod:`gpvi.inference.mcmc.trees`: the same draws, less of the sampler's own time).

    Samples :math:`\pi(\theta) \propto g(\theta)` with potential :math:`U = -\log g(\theta)` (the log joint of
    DSVI paper eq. 3); the trajectory doubles until a U-turn or ``max_tree_depth`` doublings
    (Hoffman & Gelman 2014, Algorithm 3, multinomial variant), and the step size is adapted by dual averaging
    (Hoffman & Gelman 2014, Algorithm 5) during warm-up, in Stan's windows (75-step start buffer, doubling
    mass-matrix windows from 25 steps, 50-step end buffer; scaled down for short warm-ups).

    Parameters
    ----------
    num_chains : int
        Chains (default 4), advancing together in this process: each round, one batched call of the log joint
        answers every chain's next request (:mod:`gpvi.inference.mcmc.chains`), so at tens of data points four
        chains cost little more than one; above ``BATCH_MAX_N`` (200) data points they run one after another
        on the CPU (on an accelerator they always advance together).
    num_warmup : int
        Warm-up (adaptation) transitions per chain, discarded from the posterior (>= 0).
    num_draws : int
        Post-warm-up draws per chain (>= 1).
    seed : int, optional
        Seed of the run (starting points and every chain's RNG stream; default 0); ``run(generator=)``
        overrides it. ``None``: non-deterministic.
    progress_bar : bool
        One tqdm bar per chain (step size, acceptance and divergences in the postfix).
    max_tree_depth : int
        Largest number of trajectory doublings (at most :math:`2^{\text{max\_tree\_depth}} - 1` steps).
    step_size : float
        Initial step size (refined by a doubling/halving search and dual averaging when adapting).
    adaptation : Adaptation
        What the warm-up adapts (step size, diagonal or dense :math:`M^{-1}`) and the target acceptance
        :math:`\delta` (default ``Adaptation()``: both, diagonal, 0.8).
    init_scale : float, optional
        Standard deviation of the per-chain jitter around a point start (log scale); ``None`` (default): 0.1, or
        the start's own scale when it has one (``init="laplace"``); see :mod:`gpvi.inference.mcmc.starts`.
    checks : ConvergenceChecks
        Thresholds of the end-of-run :class:`~gpvi.exceptions.ConvergenceWarning` (default: ESS >= 100 per
        chain, split R-hat <= 1.01).

    See Also
    --------
    HMC : fixed trajectory length.
    gpvi.metrics.compare, gpvi.plots.compare_marginals : DSVI against these draws.

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.inference.mcmc import NUTS, ConvergenceChecks
    >>> target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=["a", "b"])
    >>> mc = NUTS(num_chains=2, num_warmup=100, num_draws=100, progress_bar=False,
    ...           checks=ConvergenceChecks(min_ess=0)).run(target)
    >>> mc.draws.shape, mc.samples.shape
    (torch.Size([2, 100, 2]), torch.Size([200, 2]))
    >>> sorted(mc.stats)
    ['acceptance_rate', 'diverging', 'energy', 'lp', 'n_steps', 'step_size', 'tree_depth']
    """

    name = "NUTS"

    def __init__(self, num_chains: int = 4, num_warmup: int = 500, num_draws: int = 1000, *,
                 seed: int | None = 0, progress_bar: bool = True, max_tree_depth: int = 10, step_size: float = 1.0,
                 adaptation: Adaptation = Adaptation(), init_scale: float | None = None,
                 checks: ConvergenceChecks = ConvergenceChecks()) -> None:
        super().__init__(num_chains, num_warmup, num_draws, seed=seed, progress_bar=progress_bar,
                         step_size=step_size, adaptation=adaptation, init_scale=init_scale, checks=checks)
        self.max_tree_depth = check_positive_int(max_tree_depth, "max_tree_depth")

    def _kernel_settings(self) -> dict[str, Any]:
        return {"max_tree_depth": self.max_tree_depth}

    def _transition(self, z: np.ndarray, lp: float, g: np.ndarray, step_size: float, metric: Metric,
                    rng: Uniforms) -> Asks[tuple[np.ndarray, float, np.ndarray, dict[str, Any]]]:
        if not metric.dense and self.max_tree_depth <= MAX_DEPTH and compiled() is not None:
            return request(z, lp, g, step_size, metric, rng)       # the chains' compiled batch (same transition)
        return nuts_transition(z, lp, g, step_size, metric, self.max_tree_depth, rng)

    def _extra_stats(self, stats: dict[str, torch.Tensor], rows: list[dict[str, Any]] | None = None
                     ) -> dict[str, torch.Tensor]:
        if rows is not None and all("tree_depth" in r for r in rows):
            return {"tree_depth": torch.tensor([int(r["tree_depth"]) for r in rows], dtype=torch.int64, device="cpu")}
        return {"tree_depth": tree_depth(stats["n_steps"])}

    def __repr__(self) -> str:
        return (f"NUTS(num_chains={self.num_chains}, num_warmup={self.num_warmup}, num_draws={self.num_draws}, "
                f"seed={self.seed}, max_tree_depth={self.max_tree_depth}, adaptation={self.adaptation!r})")
