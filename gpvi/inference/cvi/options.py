r"""Small frozen settings of the CVI engine, its stop rule, and where a run starts.

* :class:`MonteCarlo` -- Monte Carlo site gradients (``CVI(estimator=MonteCarlo(num_draws=50))``; the string
  ``"mc"`` means ``MonteCarlo()``);
* :class:`SingleSite` -- what a doubly stochastic step does (``CVI(mode="stochastic", single_site=...)``): sites
  per step, refactorisation period, how the cached factor is updated;
* :class:`SitesConverged` -- the stop rule: the relative ELBO change between two checks fell below ``tol``
  (with Monte Carlo gradients, :func:`flat_elbo_window`: the ELBO stopped rising beyond its noise);
* :func:`num_steps_for_sweeps` -- the step budget of a number of sweeps over the data;
* :class:`init_to_sites` -- a start at given kernel hyperparameters and, optionally, given sites (a warm start,
  e.g. from a :class:`~gpvi.posteriors.latent.LatentPosterior`); :func:`latent_init` turns what
  ``CVI.run(init=...)`` accepts into one.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from ...validation import as_float_tensor, check_choice, check_positive, check_positive_int
from ..init import Start

__all__ = ["MonteCarlo", "SingleSite", "SitesConverged", "flat_elbo_window", "num_steps_for_sweeps", "SiteStart",
           "init_to_sites", "latent_init"]


@dataclass(frozen=True)
class MonteCarlo:
    r"""Site gradients by reparameterised Monte Carlo (the paper's default estimator).

    Parameters
    ----------
    num_draws : int
        Draws :math:`f = m_n + \sqrt{v_n}\,\varepsilon` per site and step.
    variance_grad : {"hessian", "reparam"}
        Estimator of :math:`\partial_v E` (see :func:`gpvi.models.likelihoods.expected_log_lik`): ``"hessian"`` averages
        :math:`\tfrac12 h''` (keeps logit/probit sites valid); ``"reparam"`` uses first derivatives only.
    """

    num_draws: int = 10
    variance_grad: str = "hessian"

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_draws", check_positive_int(self.num_draws, "num_draws"))
        check_choice(self.variance_grad, "variance_grad", ["hessian", "reparam"])


@dataclass(frozen=True)
class SingleSite:
    r"""Doubly stochastic (single-site) steps: eq. 14 on a cached, rank-one-updated factor of :math:`K + S`.

    Parameters
    ----------
    batch_size : int
        Sites per step (the next ``batch_size`` of a fresh random permutation each sweep).
    refactor_every : int, optional
        Steps between refactorisations from scratch (each also measures the drift and evaluates the ELBO).
        Default: one sweep, ``ceil(N / batch_size)`` (GPML's sequential EP also refactorises after every sweep).
    factor_update : {"blocked", "generic"}
        :func:`gpvi.linalg.cholesky_site_update_` (in place, blocked; default) or :func:`gpvi.linalg.cholesky_update`
        on the trailing block (allocates N x N temporaries; kept for comparison).
    """

    batch_size: int = 1
    refactor_every: int | None = None
    factor_update: str = "blocked"

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_size", check_positive_int(self.batch_size, "batch_size"))
        if self.refactor_every is not None:
            object.__setattr__(self, "refactor_every", check_positive_int(self.refactor_every, "refactor_every"))
        check_choice(self.factor_update, "factor_update", ["blocked", "generic"])

    def steps_per_sweep(self, num_data: int) -> int:
        """``ceil(N / batch_size)``: the steps of one pass over a permutation of the sites."""
        return -(-int(num_data) // self.batch_size)

    def refactor_period(self, num_data: int) -> tuple[int, str]:
        """The refactorisation period for N sites and why: ``(refactor_every, "given")`` or one sweep."""
        if self.refactor_every is not None:
            return self.refactor_every, "given"
        return self.steps_per_sweep(num_data), "one sweep, ceil(N / batch_size)"


def num_steps_for_sweeps(num_sweeps: int, num_data: int, *, mode: str = "full", batch_size: int = 1) -> int:
    r"""The number of CVI steps that makes ``num_sweeps`` sweeps over ``num_data`` sites.

    A full-batch step is one sweep. A stochastic run starts with one full-batch step from the prior (one sweep),
    then each sweep is ``ceil(N / batch_size)`` steps: :math:`1 + (\text{sweeps} - 1)\lceil N / B\rceil`.

    Examples
    --------
    >>> num_steps_for_sweeps(500, 200), num_steps_for_sweeps(3, 200, mode="stochastic", batch_size=7)
    (500, 59)
    """
    num_sweeps = check_positive_int(num_sweeps, "num_sweeps")
    num_data = check_positive_int(num_data, "num_data")
    check_choice(mode, "mode", ["full", "stochastic"])
    if mode == "full":
        return num_sweeps
    return 1 + (num_sweeps - 1) * SingleSite(batch_size).steps_per_sweep(num_data)


MC_WINDOW = 5
"""Checks per window of the noise-aware stop rule (:func:`flat_elbo_window`)."""


def flat_elbo_window(elbos: list[float], tol: float, window: int = MC_WINDOW) -> bool:
    r"""Whether a noisy ELBO trace has stopped rising: the stop test of Monte Carlo CVI runs.

    With Monte Carlo site gradients the ELBO at a check (always by quadrature, so the value of the current sites
    is exact) still moves from check to check because the sites move with the gradient noise; two consecutive
    checks can come within ``tol`` of each other by chance, long before the run has settled, or never. So the test
    compares the mean :math:`\bar{\mathcal L}_b` of the last ``window`` checks with the mean
    :math:`\bar{\mathcal L}_a` of the ``window`` checks before them, against the noise of the recent checks:

    .. math::

        |\bar{\mathcal L}_b - \bar{\mathcal L}_a| \le \max\Big(\text{tol}\cdot\max(1, |\bar{\mathcal L}_b|),\;
        2\sqrt{2 s_b^2 / w}\Big)

    (:math:`s_b^2` the sample variance of the last ``window`` checks, :math:`w` = ``window``; the earlier window's
    variance is not used because it may still hold the initial rise). A steady rise fails it (for a linear trend
    of slope :math:`d` per check the means differ by :math:`w d`, the bound is about :math:`2 d` for
    :math:`w = 5`); a trace that only fluctuates passes. With a decreasing step the fluctuation shrinks, so the
    stop comes once the ELBO's remaining rise is below the noise of the current step size (measured with the
    default Robbins-Monro step on pima, ionosphere, sonar and ripley at their initial theta, full and stochastic
    mode: stops after 33-79 sweeps, ELBO within 2e-6 to 5e-5 relative of the quadrature run's).

    Parameters
    ----------
    elbos : list of float
        The ELBO at every check so far (``trace["elbo"]``).
    tol : float
    window : int

    Returns
    -------
    bool
        ``False`` until there are ``2 * window`` checks.

    Examples
    --------
    >>> flat_elbo_window([-10.0, -5.0, -3.0, -2.0, -1.5, -1.2, -1.1, -1.05, -1.02, -1.01], 1e-9)
    False
    >>> flat_elbo_window([-1.0, -1.2, -0.9, -1.1, -1.0, -0.95, -1.05, -1.1, -0.9, -1.0], 1e-9)
    True
    """
    if len(elbos) < 2 * window:
        return False
    a, b = elbos[-2 * window:-window], elbos[-window:]
    if not all(math.isfinite(x) for x in a + b):
        return False
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    se = math.sqrt(2.0 * statistics.variance(b) / window)
    return abs(mb - ma) <= max(tol * max(1.0, abs(mb)), 2.0 * se)


class SitesConverged:
    r"""Stop rule: the last check found :math:`|\Delta\mathcal L| \le \text{tol}\cdot\max(1, |\mathcal L|)`.

    The engine evaluates the ELBO at its checks (every full-batch step; every refactorisation of a stochastic
    run) and marks ``info["converged"]``; ``tol = 0`` never stops early. With ``noisy=True`` (Monte Carlo site
    gradients) the engine's test is :func:`flat_elbo_window` instead of the change between two checks.
    """

    def __init__(self, tol: float, *, noisy: bool = False) -> None:
        self.tol = check_positive(tol, "tol", allow_zero=True)
        self.noisy = bool(noisy)
        self.may_stop_early = self.tol > 0

    def __call__(self, state: Any, info: dict[str, Any]) -> bool:
        return bool(info.get("converged", False))

    def __repr__(self) -> str:
        return f"SitesConverged(tol={self.tol:g}{', noisy=True' if self.noisy else ''})"


@dataclass(frozen=True)
class SiteStart(Start):
    """A :class:`~gpvi.inference.init.Start` for CVI: kernel log-hyperparameters ``theta`` and optional sites."""

    lam1: torch.Tensor | None = None
    lam2: torch.Tensor | None = None


class init_to_sites:  # noqa: N801 - strategies read as functions, as in gpvi.inference.init
    """Start at ``theta`` (default: ``model.theta``) with sites ``lam1``, ``lam2`` (default: 0, i.e. q = prior).

    Parameters
    ----------
    theta : array-like of shape (D,), optional
    lam1, lam2 : array-like of the model's ``site_shape``, (N,) or (N, K), optional
        Both or neither; ``lam2 < 0`` everywhere.
    source : str
        Recorded in ``info["init"]["mean"]``.
    sites : str
        Recorded in ``info["init"]["sites"]`` when sites are given (default ``"given"``).
    """

    def __init__(self, theta: Any = None, lam1: Any = None, lam2: Any = None, *, source: str | None = None,
                 sites: str = "given") -> None:
        if (lam1 is None) != (lam2 is None):
            raise ValueError("give both lam1 and lam2, or neither")
        self.theta, self.lam1, self.lam2 = theta, lam1, lam2
        self.source = source or ("model.theta" if theta is None else "given")
        self.sites = sites

    def __call__(self, model: Any) -> SiteStart:
        th = model.check_theta(self.theta).detach().clone()
        if th.dim() != 1 or not bool(torch.isfinite(th).all()):
            raise ValueError("init (theta) must be a finite vector of length D")
        if self.lam1 is None:
            return SiteStart(th, info={"mean": self.source, "sites": "zeros (q = prior)"})
        shape = tuple(model.site_shape)
        l1 = as_float_tensor(self.lam1, "lam1", ndim=len(shape), device=model.device)
        l2 = as_float_tensor(self.lam2, "lam2", ndim=len(shape), device=model.device)
        if tuple(l1.shape) != shape or tuple(l2.shape) != shape:
            what = f"length N = {shape[0]}" if len(shape) == 1 else f"shape (N, K) = {shape}"
            got = (f"{l1.shape[0]} and {l2.shape[0]}" if len(shape) == 1
                   else f"{tuple(l1.shape)}, {tuple(l2.shape)}")
            raise ValueError(f"lam1 and lam2 must have {what}; got {got}")
        if not bool((l2 < 0).all()):
            raise ValueError(f"lam2 must be < 0 for every site; {int((l2 >= 0).sum())} are not")
        return SiteStart(th, info={"mean": self.source, "sites": self.sites}, lam1=l1.clone(), lam2=l2.clone())

    def __repr__(self) -> str:
        return f"init_to_sites(source={self.source!r})"


def latent_init(init: Any) -> Any:
    """What ``CVI.run(init=...)`` accepts, as a strategy: ``None`` (the engine's default), a strategy (itself), a
    :class:`~gpvi.posteriors.latent.LatentPosterior` (its theta and sites), a point posterior (its theta), or an
    array-like theta."""
    if init is None or isinstance(init, init_to_sites):
        return init
    if hasattr(init, "lam1") and hasattr(init, "lam2") and hasattr(init, "theta"):
        return init_to_sites(init.theta, init.lam1, init.lam2, source="posterior")
    if isinstance(getattr(init, "theta", None), torch.Tensor):          # a point estimate of theta (ML-II)
        return init_to_sites(init.theta, source="posterior theta")
    if callable(init) and not isinstance(init, torch.Tensor):
        return init
    return init_to_sites(init)
