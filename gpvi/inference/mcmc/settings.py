r"""Grouped settings of the NUTS/HMC engines: warm-up :class:`Adaptation` and end-of-run :class:`ConvergenceChecks`.

Both are small frozen, validated values (after NumPyro's ``NUTS(target_accept_prob=, adapt_step_size=,
adapt_mass_matrix=, dense_mass=)`` and ArviZ's / Vehtari et al.'s diagnostic thresholds), so an engine's
constructor stays short and a setting is checked once, where it is written.

Names: ``target_accept`` is :math:`\delta`, the mean acceptance statistic dual averaging aims at (Hoffman & Gelman
2014, Algorithm 5 / eq. 6); ``dense_mass`` chooses a dense rather than diagonal :math:`M^{-1}`.

References
----------
M. D. Hoffman and A. Gelman (2014). The No-U-Turn Sampler. JMLR 15, 1593-1623.
A. Vehtari, A. Gelman, D. Simpson, B. Carpenter, P.-C. Bürkner (2021). Rank-normalization, folding, and
localization: an improved R-hat for assessing convergence of MCMC. Bayesian Analysis 16(2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...validation import check_bool, check_choice, check_fraction, check_positive

__all__ = ["Adaptation", "ConvergenceChecks"]


@dataclass(frozen=True)
class Adaptation:
    r"""What the warm-up adapts, and towards what (Stan's windowed adaptation, :mod:`gpvi.inference.mcmc.adaptation`).

    During the ``num_warmup`` transitions of each chain the step size :math:`\epsilon` is tuned by dual averaging
    towards a mean acceptance statistic :math:`\delta` = ``target_accept`` (Hoffman & Gelman 2014, Algorithm 5),
    and :math:`M^{-1}` is estimated from the warm-up draws in Stan's windows (75-step start buffer, doubling
    mass-matrix windows from 25 steps, 50-step end buffer; scaled down for short warm-ups). After warm-up both
    are frozen.

    Parameters
    ----------
    target_accept : float
        :math:`\delta` in (0, 1) (default 0.8).
    adapt_step_size : bool
        Tune :math:`\epsilon` during warm-up (default True); otherwise the engine's ``step_size`` is used as is.
    adapt_mass_matrix : bool
        Estimate :math:`M^{-1}` during warm-up (default True); otherwise :math:`M = I`.
    dense_mass : bool
        A dense :math:`M^{-1}` of shape ``(D, D)`` instead of a diagonal ``(D,)`` (default False).
    mass_from_init : bool
        When the chains start from a Gaussian posterior (``run(target, init=q)`` with DSVI's q), use q's
        covariance :math:`CC^\top` as the dense :math:`M^{-1}` and adapt only the step size (default True): q
        has already learnt the scales and correlations the mass-matrix windows would estimate, so the warm-up
        can be short. False: adapt as for any other start.
    mass_start : {"identity", "init"}
        Where the adapted :math:`M^{-1}` starts, before the first window ends (ignored when ``mass_from_init`` fixes
        it): ``"identity"`` (default; Stan's unit metric) or ``"init"``: when the chains start from a Gaussian
        posterior, its marginal variances :math:`\operatorname{diag}(CC^\top)` (its covariance for a dense
        metric), so that the start buffer's trees are as shallow as q's scales allow; the windows then estimate
        :math:`M^{-1}` from the draws as before.
    mass_estimate : {"draws", "draws_and_gradients"}
        How a window estimates a diagonal :math:`M^{-1}`: ``"draws"`` (default; Stan's: the draws' variances) or
        ``"draws_and_gradients"`` (nutpie's: :math:`\sqrt{\operatorname{Var}(x)/\operatorname{Var}(\nabla\log
        p)}` per coordinate, :mod:`gpvi.inference.mcmc.adaptation`). Diagonal metrics only. Opt-in: within Stan's
        windows it did not lower the gradients per ESS of gpvi's regression posteriors in the median
        (``benchmarks/studies/results/nuts_metric_grads.md``).

    Raises
    ------
    ValueError
        ``target_accept`` outside (0, 1); ``mass_estimate="draws_and_gradients"`` with ``dense_mass``.
    TypeError
        A flag that is not a bool.

    Examples
    --------
    >>> from gpvi.inference.mcmc import Adaptation
    >>> a = Adaptation(target_accept=0.9, dense_mass=True)
    >>> a.target_accept, a.dense_mass, a.mass_from_init, a.mass_start
    (0.9, True, True, 'identity')
    """

    target_accept: float = 0.8
    adapt_step_size: bool = True
    adapt_mass_matrix: bool = True
    dense_mass: bool = False
    mass_from_init: bool = True
    mass_start: str = "identity"
    mass_estimate: str = "draws"

    def __post_init__(self) -> None:
        object.__setattr__(self, "mass_start", check_choice(self.mass_start, "mass_start", ("identity", "init")))
        object.__setattr__(self, "mass_estimate", check_choice(self.mass_estimate, "mass_estimate",
                                                               ("draws", "draws_and_gradients")))
        object.__setattr__(self, "target_accept",
                           check_fraction(self.target_accept, "target_accept", high_closed=False))
        for name in ("adapt_step_size", "adapt_mass_matrix", "dense_mass", "mass_from_init"):
            object.__setattr__(self, name, check_bool(getattr(self, name), name))
        if self.dense_mass and self.mass_estimate != "draws":
            raise ValueError(f"mass_estimate={self.mass_estimate!r} estimates a diagonal metric; with "
                             "dense_mass=True use mass_estimate='draws'")

    def settings(self) -> dict[str, Any]:
        """The values as a plain dict (stored in a run's state and compared on resume)."""
        return {"adapt_step_size": self.adapt_step_size, "adapt_mass_matrix": self.adapt_mass_matrix,
                "dense_mass": self.dense_mass, "target_accept": self.target_accept,
                "mass_from_init": self.mass_from_init,
                **({"mass_start": self.mass_start} if self.mass_start != "identity" else {}),
                **({"mass_estimate": self.mass_estimate} if self.mass_estimate != "draws" else {})}


@dataclass(frozen=True)
class ConvergenceChecks:
    r"""Thresholds of the :class:`~gpvi.exceptions.ConvergenceWarning` issued at the end of a complete run.

    The run warns (it never fails) when any split :math:`\hat R` exceeds ``max_r_hat``, the smallest effective
    sample size is below ``min_ess``, a transition after warm-up diverged, or a NUTS draw hit the maximum tree
    depth (:func:`gpvi.inference.mcmc.diagnostics.convergence_problems`).

    Parameters
    ----------
    min_ess : float, optional
        Smallest acceptable ESS over the parameters; ``None`` (default): 100 per chain (400 for 4 chains,
        Vehtari et al. 2021). ``0`` switches the ESS check off.
    max_r_hat : float
        Largest acceptable split :math:`\hat R` (>= 1; default 1.01).

    Raises
    ------
    ValueError
        ``min_ess < 0`` or ``max_r_hat < 1``.

    Examples
    --------
    >>> from gpvi.inference.mcmc import ConvergenceChecks
    >>> ConvergenceChecks().min_ess_for(4), ConvergenceChecks(min_ess=0).min_ess_for(4)
    (400.0, 0.0)
    """

    min_ess: float | None = None
    max_r_hat: float = 1.01

    def __post_init__(self) -> None:
        if self.min_ess is not None:
            object.__setattr__(self, "min_ess", check_positive(self.min_ess, "min_ess", allow_zero=True))
        r = check_positive(self.max_r_hat, "max_r_hat")
        if r < 1:
            raise ValueError(f"max_r_hat must be >= 1; got {r:g}")
        object.__setattr__(self, "max_r_hat", r)

    def min_ess_for(self, num_chains: int) -> float:
        """The ESS threshold for ``num_chains`` chains (``min_ess``, or 100 per chain when it is ``None``)."""
        return 100.0 * num_chains if self.min_ess is None else float(self.min_ess)
