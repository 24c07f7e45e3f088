r"""Conjugate-computation variational inference (CVI) for latent GP models (Khan & Lin 2017, sections 3-4).

The engine follows the contract of :mod:`gpvi.inference.engine` and is run by :func:`gpvi.inference.driver.run`:
:meth:`CVI.init` puts the sites at 0 (:math:`q` = prior, Algorithm 1 line 1) or at given sites, :meth:`CVI.step`
is one full-batch step (Algorithm 1, O(N^3)) or one doubly stochastic single-site step (eq. 14, O(N^2) on a cached
factor of :math:`K + S` updated **in place**), the stop rule ends the run when the relative ELBO change between two
checks falls below ``tol``, and :meth:`CVI.result` builds the :class:`~gpvi.posteriors.latent.LatentPosterior`.
The site algebra and the ELBO are in :mod:`gpvi.numerics.sites`, the two steps in
:mod:`gpvi.inference.cvi.steps`, the state in :mod:`gpvi.inference.cvi.state`. Learning the kernel
hyperparameters (type-II maximisation of the ELBO) is an outer loop over CVI runs,
:class:`gpvi.inference.cvi.typeii.TypeII`; the engine itself keeps :math:`\theta` fixed.

Faults: a failed factorisation or a non-finite ELBO inside a step rolls the state back to where the step began
(the generator excepted: its draws are spent), halves the step size for the next step, warns with a
:class:`~gpvi.exceptions.NumericalWarning` and reports ``info["skipped"]``; the driver ends the run with
:class:`~gpvi.exceptions.NumericalFaultError` after ``faults.max_consecutive`` skipped steps in a row.

Names: ``lam1``, ``lam2`` (:math:`\tilde\lambda^{(1)}, \tilde\lambda^{(2)}`), ``beta`` (:math:`\beta_t`), ``theta``
(kernel log-hyperparameters), ``t`` (steps taken).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ...exceptions import ConvergenceWarning, NotPSDError, NumericalWarning
from ...models.classification import LatentGP
from ...numerics.quadrature import Quadrature
from ...posteriors.latent import BernoulliPredictive, LatentPosterior
from ...rng import check_seed, resolve_generator
from ...validation import check_bool, check_choice, check_fraction, check_positive, check_positive_int
from .. import driver
from ...numerics.budget import MemoryBudget
from ..engine import FaultPolicy, RunReport, resume_copy
from ..schedules import rate
from ..init import start_point
from ...numerics import sites
from . import steps
from .options import MonteCarlo, SingleSite, SitesConverged, init_to_sites, latent_init
from ...numerics.sites import site_elbo
from .state import CVIState

__all__ = ["CVI", "CVIState", "LatentPosterior", "BernoulliPredictive", "site_elbo"]

_SNAPSHOT = ("lam1", "lam2", "theta", "t", "sites_updated", "initialised", "factor", "since_refactor", "order",
             "order_pos", "elbo", "beta_scale", "converged")


class CVI:
    r"""Conjugate-computation variational inference for latent GP models (Khan & Lin 2017, Algorithm 1, eq. 13-14).

    Parameters
    ----------
    mode : {"full", "stochastic"}
        Full-batch steps (every site, one O(N^3) factorisation per step) or doubly stochastic single-site steps
        (``single_site.batch_size`` sites per step on a cached, rank-one-updated factor, O(N^2) per step).
    beta : float
        Step size :math:`\beta \in (0, 1]` of eq. 13 (default 0.5).
    estimator : {"quadrature", "mc"} or MonteCarlo
        Gradients of :math:`\mathbb E_q[\log p(y_n \mid f_n)]` by deterministic quadrature or by reparameterised Monte
        Carlo (the paper's default; ``"mc"`` is ``MonteCarlo()``, 10 draws per site). The ELBO is always evaluated
        by quadrature.
    quadrature : Quadrature, optional
        The rule for quadrature gradients, the ELBO and logit predictions (default ``Quadrature(96, "gl-asinh")``;
        see :class:`gpvi.models.likelihoods.Quadrature`).
    single_site : SingleSite, optional
        What a stochastic step does: ``batch_size``, ``refactor_every``, ``factor_update`` (default
        ``SingleSite()``: one site per step, refactorisation once per sweep). Ignored when ``mode="full"``.
    num_steps : int
        Cap on the steps of a run (resumed runs count from step 0). A stochastic sweep is ``ceil(N / batch_size)``
        steps; :func:`gpvi.inference.cvi.options.num_steps_for_sweeps` converts a budget in sweeps.
    tol : float
        Convergence: relative ELBO change between checks below ``tol`` (``|dL| <= tol * max(1, |L|)``); with Monte
        Carlo gradients, the noise-aware form of :class:`~gpvi.inference.cvi.options.SitesConverged` (the mean
        ELBO of the last checks against that of the checks before, within ``tol`` or within their noise). ``0``
        disables the check (the run takes ``num_steps`` steps).
    beta_schedule : {"constant", "robbins_monro"}, callable or None
        :math:`\beta_t = \beta`, :math:`\beta / (1 + t)^{0.6}` with :math:`t` the completed sweeps
        (:class:`~gpvi.inference.schedules.RobbinsMonro` with :math:`\tau = 1`, :math:`\kappa = 0.6`), or
        ``callable(t) -> beta_t`` (e.g. a ``RobbinsMonro`` with other :math:`\tau`, :math:`\kappa`). Default (``None``): ``"constant"`` with quadrature gradients (exact gradients:
        a constant step converges), ``"robbins_monro"`` with Monte Carlo gradients (a constant step leaves the
        sites fluctuating at a noise level proportional to :math:`\beta` and never settles; a decreasing step
        with :math:`\sum\beta_t = \infty`, :math:`\sum\beta_t^2 < \infty` converges).
    invalid : {"shrink", "reject"}
        What to do with a site update that would make :math:`\tilde\lambda^{(2)} \ge 0`.
    faults : FaultPolicy, optional
        Consecutive failed steps (failed factorisation, non-finite ELBO) tolerated before
        :class:`~gpvi.exceptions.NumericalFaultError` (default ``FaultPolicy(max_consecutive=10)``).
    seed : int or None
        Seed of the run's generator (site order, Monte Carlo draws) when ``run`` gets no ``generator``.
    progress_bar : bool

    Examples
    --------
    >>> import gpvi
    >>> from gpvi.models.classification import GPClassification
    >>> from gpvi.inference.cvi import CVI, num_steps_for_sweeps
    >>> ds = gpvi.datasets.load_pima()
    >>> model = GPClassification(ds.X_train, ds.y_train, likelihood="probit")
    >>> post = CVI(mode="stochastic", num_steps=num_steps_for_sweeps(30, model.num_data, mode="stochastic"),
    ...            progress_bar=False).run(model)
    >>> post.link, post.info["mode"]
    ('probit', 'stochastic')
    """

    name = "CVI"

    def __init__(self, mode: str = "full", beta: float = 0.5, estimator: str | MonteCarlo = "quadrature", *,
                 quadrature: Quadrature | None = None, single_site: SingleSite | None = None, num_steps: int = 500,
                 tol: float = 1e-9, beta_schedule: str | Callable[[int], float] | None = None, invalid: str = "shrink",
                 faults: FaultPolicy | None = None, seed: int | None = 0, progress_bar: bool = True) -> None:
        self.mode = check_choice(mode, "mode", ["full", "stochastic"])
        self.beta = check_fraction(beta, "beta")
        if isinstance(estimator, MonteCarlo):
            self.estimator, self.monte_carlo = "mc", estimator
        else:
            self.estimator, self.monte_carlo = check_choice(estimator, "estimator", ["quadrature", "mc"]), MonteCarlo()
        if quadrature is not None and not isinstance(quadrature, Quadrature):
            raise TypeError(f"quadrature must be a gpvi.models.likelihoods.Quadrature; got {type(quadrature).__name__}")
        self.quadrature = quadrature if quadrature is not None else Quadrature()
        if single_site is not None and not isinstance(single_site, SingleSite):
            raise TypeError(f"single_site must be a gpvi.inference.cvi.SingleSite; got {type(single_site).__name__}")
        self.single_site = single_site if single_site is not None else SingleSite()
        self.num_steps = check_positive_int(num_steps, "num_steps")
        self.tol = check_positive(tol, "tol", allow_zero=True)
        if callable(beta_schedule):
            self.beta_schedule: str | Callable[[int], float] = beta_schedule
        elif beta_schedule is None:
            self.beta_schedule = "robbins_monro" if self.estimator == "mc" else "constant"
        else:
            self.beta_schedule = check_choice(beta_schedule, "beta_schedule", ["constant", "robbins_monro"])
        self.invalid = check_choice(invalid, "invalid", ["shrink", "reject"])
        if faults is not None and not isinstance(faults, FaultPolicy):
            raise TypeError(f"faults must be a gpvi.inference.engine.FaultPolicy; got {type(faults).__name__}")
        self.faults = faults if faults is not None else FaultPolicy(max_consecutive=10)
        self.seed = check_seed(seed)
        self.progress_bar = check_bool(progress_bar, "progress_bar")

    # ------------------------------------------------------------------ helpers
    @property
    def beta_rate(self) -> Callable[[int], float]:
        r""":math:`\beta_t` as a function of the completed sweeps (``"robbins_monro"``: :math:`\tau = 1`,
        :math:`\kappa = 0.6`)."""
        return rate(self.beta_schedule, self.beta, tau=1.0, kappa=0.6)

    def __repr__(self) -> str:
        return (f"CVI(mode={self.mode!r}, beta={self.beta:g}, estimator={self.estimator!r}, "
                f"num_steps={self.num_steps}, tol={self.tol:g})")

    def settings(self, num_data: int | None = None) -> dict[str, Any]:
        """The settings as plain values (for ``info``), with what was resolved for ``num_data`` sites."""
        out: dict[str, Any] = {
            "mode": self.mode, "beta": self.beta, "estimator": self.estimator,
            "beta_schedule": self.beta_schedule if isinstance(self.beta_schedule, str) else "callable",
            "quadrature": self.quadrature.spec(), "num_steps": self.num_steps, "tol": self.tol,
            "invalid": self.invalid, "max_consecutive_faults": self.faults.max_consecutive,
            "num_draws": self.monte_carlo.num_draws if self.estimator == "mc" else None,
            "mc_variance_grad": self.monte_carlo.variance_grad if self.estimator == "mc" else None,
            "batch_size": None, "refactor_every": None, "factor_update": None}
        if self.mode == "stochastic":
            out.update(batch_size=self.single_site.batch_size, factor_update=self.single_site.factor_update)
            if num_data is not None:
                out["refactor_every"], out["refactor_every_from"] = self.single_site.refactor_period(num_data)
        return out

    def steps_per_sweep(self, num_data: int) -> int:
        """Steps of one sweep over ``num_data`` sites: 1 (full) or ``ceil(N / batch_size)`` (stochastic)."""
        return 1 if self.mode == "full" else self.single_site.steps_per_sweep(num_data)

    @staticmethod
    def _check_model(model: Any) -> LatentGP:
        if not isinstance(model, LatentGP):
            raise TypeError(f"model must be a gpvi GPClassification / LatentGP; got {type(model).__name__}")
        return model

    # ------------------------------------------------------------------ the engine contract
    def default_init(self, target: Any) -> init_to_sites:
        """Start at ``model.theta`` with the sites at 0 (:math:`q` = prior)."""
        return init_to_sites()

    def init(self, target: Any, start: Any = None, generator: torch.Generator | None = None) -> CVIState:
        """A fresh state at ``start``: a :class:`~gpvi.inference.init.Start` (or anything ``run(init=...)`` takes).

        Parameters
        ----------
        target : LatentGP
        start : Start, optional
            ``start.theta`` are the kernel log-hyperparameters; a
            :class:`~gpvi.inference.cvi.options.SiteStart` may also carry sites. Default: ``model.theta``, sites 0.
        generator : torch.Generator, optional
            The run's random stream (default: a fresh one seeded with ``seed``).
        """
        model = self._check_model(target)
        start = start_point(model, start, self.default_init(model), strategy=latent_init)
        theta = start.theta.detach().to(device=model.device, dtype=torch.float64).clone()
        gen = resolve_generator(self.seed, generator)
        lam1, lam2 = getattr(start, "lam1", None), getattr(start, "lam2", None)
        if lam1 is None:
            z = torch.zeros(model.num_data, dtype=torch.float64, device=model.device)
            return CVIState(z, z.clone(), theta, gen)
        return CVIState(lam1.clone(), lam2.clone(), theta, gen, initialised=True)

    def initial_state(self, model: LatentGP, theta: Any = None, *, lam1: Any = None, lam2: Any = None,
                      generator: torch.Generator | None = None) -> CVIState:
        """A fresh state at ``theta`` (default ``model.theta``) with sites ``lam1``, ``lam2`` (default 0).

        Raises ``ValueError`` for sites of the wrong length or with ``lam2 >= 0``.
        """
        model = self._check_model(model)
        return self.init(model, init_to_sites(theta, lam1, lam2)(model), generator)

    def resume(self, target: Any, state: CVIState | dict[str, Any]) -> CVIState:
        """A checked copy of ``state`` (a :class:`CVIState` or its ``state_dict``) to continue on ``target``."""
        model = self._check_model(target)
        st = resume_copy(state, CVIState)
        if st.num_sites != model.num_data:
            raise ValueError(f"state has {st.num_sites} sites but the model has N = {model.num_data}")
        if st.theta.shape[0] != model.dim:
            raise ValueError(f"state theta has length {st.theta.shape[0]} but the model has D = {model.dim}")
        if st.initialised and not bool((st.lam2 < 0).all()):
            raise ValueError("state has sites with lam2 >= 0; they are not valid Gaussian sites")
        for k in ("lam1", "lam2", "theta", "factor", "order"):          # a state saved on another device
            v = getattr(st, k)
            if v is not None and v.device != model.device:
                setattr(st, k, v.to(model.device))
        return st

    def stop_rule(self) -> SitesConverged:
        """:class:`~gpvi.inference.cvi.options.SitesConverged` with this engine's ``tol`` (noise-aware with Monte
        Carlo gradients)."""
        return SitesConverged(self.tol, noisy=self.estimator == "mc")

    def postfix(self, info: dict[str, Any]) -> dict[str, Any]:
        return {"elbo": info["elbo"]} if "elbo" in info else {}

    def step(self, target: Any, state: CVIState) -> tuple[CVIState, dict[str, Any]]:
        """One step (full-batch, or one stochastic batch), **in place**: returns ``(state, info)``.

        The cached factor is updated in place and never copied. A failed factorisation or a non-finite ELBO rolls
        the state back to where the step began (sites, factor dropped, counters), halves the next step size and
        returns ``info["skipped"] = True``. ``info``: ``beta``, ``sites``, ``checked`` (the step evaluated the ELBO:
        then ``elbo``, ``converged`` and, in full mode, ``residual``; in stochastic mode ``drift``).
        """
        model = target
        t0 = time.perf_counter()
        K = model.kernel_matrix(state.theta)
        snap = {k: getattr(state, k) for k in _SNAPSHOT}
        counters = dict(state.counters)
        try:
            if self.mode == "full":
                info = steps.full_step(self, model, state, K, state.generator)
            else:
                info = steps.stochastic_step(self, model, state, K, state.generator)
        except (sites.SiteFault, NotPSDError) as exc:
            self._restore(state, snap, counters)
            state.factor, state.since_refactor = None, 0
            state.beta_scale *= 0.5
            state.counters["faults"] += 1
            state.t += 1
            state.step_time_s += time.perf_counter() - t0
            warnings.warn(f"CVI: numerical fault ({exc}); rolled back to the last good state and halved the step",
                          NumericalWarning, stacklevel=3)
            return state, {"skipped": True, "fault": str(exc), "beta": state.beta_scale * self.beta,
                           "sites": 0, "checked": False}
        except KeyboardInterrupt:
            dropped = state.factor is None and snap["factor"] is not None
            self._restore(state, snap, counters)
            if dropped:                                # interrupted inside the in-place factor update
                state.factor = None
            raise
        state.beta_scale = 1.0
        state.step_time_s += time.perf_counter() - t0
        if info["checked"]:
            steps.record_check(state, info, self.tol, noisy=self.estimator == "mc")
        return state, info

    @staticmethod
    def _restore(state: CVIState, snap: dict[str, Any], counters: dict[str, float]) -> None:
        for k, v in snap.items():
            setattr(state, k, v)
        state.counters = counters

    def result(self, target: Any, state: CVIState, report: RunReport) -> LatentPosterior | None:
        """The :class:`~gpvi.posteriors.latent.LatentPosterior` of ``state`` (it keeps a copy of the state).

        The ELBO is evaluated by quadrature (deterministic, O(N) memory per quadrature node), also for a partial
        run. For a run that ended on a fault, ``None`` when even the last good sites cannot be factorised.
        """
        return steps.run_result(self, target, state, report)

    def posterior(self, model: LatentGP, state: CVIState, extra: dict[str, Any] | None = None, *,
                  warn: bool = True) -> LatentPosterior:
        r"""The posterior of ``state`` at its :math:`\theta`: factor, marginals and ELBO recomputed (O(N^3)).

        ``extra`` is merged into ``info``; ``warn`` issues the :class:`~gpvi.exceptions.ConvergenceWarning` of a
        run that ended without meeting ``tol``.
        """
        model = self._check_model(model)
        K = model.kernel_matrix(state.theta)
        if not state.initialised:
            # nothing was done: q is the prior; represent it with (numerically) flat sites
            lam1, lam2 = torch.zeros_like(state.lam1), torch.full_like(state.lam2, -1e-12)
        else:
            lam1, lam2 = state.lam1, state.lam2
        ytilde, s = sites.pseudo_data(lam1, lam2)
        L, _ = sites.site_factor(K, s, state.theta)
        m, v, alpha = sites.marginals(K, L, ytilde)
        elbo = float(site_elbo(sites.expected_value_sum(model, m, v, self.quadrature), lam1, lam2, m, v, L, alpha))
        info = {**self.settings(model.num_data), "link": model.link, "learn_hyperparameters": False,
                "steps": state.t, "sweeps": state.sweeps, "converged": state.converged, "interrupted": False,
                "wall_time": state.wall_time, "step_time_s": state.step_time_s, "elbo_method": "quadrature",
                **state.counters, **(extra or {})}
        if warn and not state.converged and self.tol > 0:
            warnings.warn(f"CVI did not converge within {state.t} steps (tol={self.tol:g}); last relative ELBO change "
                          f"above tol", ConvergenceWarning, stacklevel=5)
        return LatentPosterior(model, lam1, lam2, state.theta, m, v, L=L, alpha=alpha, elbo=elbo,
                               converged=state.converged, trace={k: list(x) for k, x in state.trace.items()},
                               info=info, engine_state=state, quadrature=self.quadrature)

    def run(self, model: LatentGP, init: Any = None, *, state: CVIState | dict[str, Any] | None = None,
            generator: torch.Generator | None = None,
            callback: Callable[[CVIState, dict[str, Any]], None] | None = None,
            budget: MemoryBudget | None = None) -> LatentPosterior:
        r"""Run CVI until convergence or ``num_steps`` steps; return the posterior (a ``LatentPosterior``).

        The loop is :func:`gpvi.inference.driver.run` (progress bar, Ctrl-C, fault counting, the stop rule).

        Parameters
        ----------
        model : LatentGP
            E.g. :class:`gpvi.models.classification.GPClassification`.
        init : array-like of shape (D,), LatentPosterior or init strategy, optional
            Kernel log-hyperparameters for a fresh run (default ``model.theta``), a posterior to warm-start from
            (its theta and sites), or a strategy such as :class:`~gpvi.inference.cvi.options.init_to_sites`.
        state : CVIState or dict, optional
            Resume from this state (or its ``state_dict()``); it is not changed (the run continues a copy up to
            ``num_steps`` total steps, bit for bit as an uninterrupted run).
        generator : torch.Generator, optional
            Randomness (site order, Monte Carlo draws); default a generator seeded with ``seed``. Not with ``state``.
        callback : callable, optional
            ``callback(state, info)`` after every step; may raise ``KeyboardInterrupt`` to stop (the partial result
            is returned with an :class:`~gpvi.exceptions.InterruptedRunWarning`).
        budget : MemoryBudget, optional
            Accepted for the contract (CVI's batched evaluations are per site and small).

        Returns
        -------
        LatentPosterior
            Sites, marginals, ELBO, ``trace`` (per check), ``info`` (settings, counters, ``steps``, ``sweeps``,
            ``interrupted``, ``time_s``...) and ``engine_state`` (a copy of the final :class:`CVIState`).

        Raises
        ------
        NumericalFaultError
            After ``faults.max_consecutive`` consecutive failed steps; ``err.state`` is the last good state.
        """
        return driver.run(self, self._check_model(model), latent_init(init), state=state, generator=generator,
                          callback=callback, budget=budget)

    def elbo(self, model: LatentGP, state: CVIState) -> float:
        """ELBO (eq. 5) of the state's :math:`q` by quadrature (O(N^3): one factorisation and the marginals)."""
        model = self._check_model(model)
        K = model.kernel_matrix(state.theta)
        if not state.initialised:
            return float(sites.expected_value_sum(model, torch.zeros_like(state.lam1), K.diagonal().clone(),
                                                  self.quadrature))
        ytilde, s = sites.pseudo_data(state.lam1, state.lam2)
        L, _ = sites.site_factor(K, s, state.theta)
        m, v, alpha = sites.marginals(K, L, ytilde)
        return float(site_elbo(sites.expected_value_sum(model, m, v, self.quadrature), state.lam1, state.lam2, m, v,
                               L, alpha))
