r"""HMC with a fixed trajectory length over theta (:func:`gpvi.inference.mcmc.kernel.hmc_transition`); see :mod:`gpvi.inference.mcmc.nuts`.

Each transition draws :math:`r \sim \mathcal N(0, M)`, takes :math:`L` leapfrog steps of size :math:`\epsilon` on
:math:`H(\theta, r) = -\log g(\theta) + \tfrac12 r^\top M^{-1} r` (Neal 2011, eqs. 5.18-5.20) and accepts with
probability :math:`\min(1, e^{-\Delta H})` (Neal 2011, eq. 5.23).

References
----------
R. M. Neal (2011). MCMC using Hamiltonian dynamics. Handbook of Markov Chain Monte Carlo, ch. 5.
"""

from __future__ import annotations

import math
from typing import Any


import numpy as np

from ...validation import check_positive_int
from .kernel import Asks, Metric, Uniforms, hmc_transition
from .engine import HamiltonianEngine
from .settings import Adaptation, ConvergenceChecks

__all__ = ["HMC"]


class HMC(HamiltonianEngine):
    r"""Hamiltonian Monte Carlo with a fixed trajectory length over theta (:func:`gpvi.inference.mcmc.kernel.hmc_transition`).

    When the step size is adapted, the trajectory length :math:`L\epsilon` = ``step_size * num_leapfrog_steps``
    is kept and :math:`L = \lfloor \text{length} / \epsilon \rfloor` follows :math:`\epsilon`.

    Parameters
    ----------
    step_size : float
        Leapfrog step size :math:`\epsilon` (initial value when adapting).
    num_leapfrog_steps : int
        Leapfrog steps :math:`L` per transition (at the initial step size).
    num_chains, num_warmup, num_draws, seed, progress_bar, adaptation, init_scale, checks
        As for :class:`~gpvi.inference.mcmc.nuts.NUTS`.

    Examples
    --------
    >>> import gpvi
    >>> from gpvi.inference.mcmc import HMC, ConvergenceChecks
    >>> target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=["a", "b"])
    >>> mc = HMC(step_size=0.3, num_leapfrog_steps=5, num_chains=2, num_warmup=50, num_draws=100,
    ...          progress_bar=False, checks=ConvergenceChecks(min_ess=0)).run(target)
    >>> mc.draws.shape
    torch.Size([2, 100, 2])
    """

    name = "HMC"

    def __init__(self, step_size: float = 0.1, num_leapfrog_steps: int = 10, num_chains: int = 4,
                 num_warmup: int = 500, num_draws: int = 1000, *, seed: int | None = 0, progress_bar: bool = True,
                 adaptation: Adaptation = Adaptation(), init_scale: float | None = None,
                 checks: ConvergenceChecks = ConvergenceChecks()) -> None:
        super().__init__(num_chains, num_warmup, num_draws, seed=seed, progress_bar=progress_bar,
                         step_size=step_size, adaptation=adaptation, init_scale=init_scale, checks=checks)
        self.num_leapfrog_steps = check_positive_int(num_leapfrog_steps, "num_leapfrog_steps")
        if not math.isfinite(self.trajectory_length):
            raise ValueError(f"step_size * num_leapfrog_steps must be finite; got {self.step_size:g} * "
                             f"{self.num_leapfrog_steps}")

    @property
    def trajectory_length(self) -> float:
        """:math:`L\\epsilon` at the initial settings (kept fixed while the step size adapts)."""
        return self.step_size * self.num_leapfrog_steps

    def _kernel_settings(self) -> dict[str, Any]:
        return {"num_leapfrog_steps": self.num_leapfrog_steps}

    def _transition(self, z: np.ndarray, lp: float, g: np.ndarray, step_size: float, metric: Metric,
                    rng: Uniforms) -> Asks[tuple[np.ndarray, float, np.ndarray, dict[str, Any]]]:
        steps = max(1, int(math.floor(self.trajectory_length / step_size + 1e-9)))
        return hmc_transition(z, lp, g, step_size, metric, steps, rng)

    def __repr__(self) -> str:
        return (f"HMC(step_size={self.step_size}, num_leapfrog_steps={self.num_leapfrog_steps}, "
                f"num_chains={self.num_chains}, num_warmup={self.num_warmup}, num_draws={self.num_draws}, "
                f"seed={self.seed})")
