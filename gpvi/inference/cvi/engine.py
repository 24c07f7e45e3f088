r"""Conjugate-computation variational inference (CVI) for latent GP models (Khan & Lin 2017, sections 3-4).

One engine, :class:`CVI`, for a model with one latent function (:class:`~gpvi.models.classification.LatentGP`:
binary classification with a logit or probit link, or any factorised likelihood) and for K class-factorised latent
functions (:class:`~gpvi.models.multiclass.GPMulticlass`: softmax or robust-max,
:math:`q(F) = \prod_k q_k(\mathbf f_k)`, GPflow's SVGP with independent latents). The sites have the shape (N,) or
(N, K); their algebra is :mod:`gpvi.numerics.sites`.

The engine follows the contract of :mod:`gpvi.inference.contract` and is run by :func:`gpvi.inference.driver.run`:
:meth:`CVI.init` puts the sites at 0 (:math:`q` = prior, Algorithm 1 line 1), at given sites, or for counts by
default at the sites of the log counts (:meth:`CVI.default_init`), :meth:`CVI.step`
is one full-batch step (Algorithm 1, O(K N^3)) or one doubly stochastic single-site step (eq. 14, O(K N^2) on cached
factors of :math:`K + S_k` updated **in place** by rank-one updates), the stop rule ends the run when the relative
ELBO change between two checks falls below ``tol``, and :meth:`CVI.result` builds the
:class:`~gpvi.posteriors.latent.LatentPosterior`. The steps are in :mod:`gpvi.inference.cvi.steps`, the state in
:mod:`gpvi.inference.cvi.state`. Learning the kernel hyperparameters (type-II maximisation of the ELBO) is an outer
loop over CVI runs (:class:`~gpvi.inference.cvi.typeii.TypeII`); the engine itself keeps :math:`\theta` fixed.

Site gradients (``estimator``): ``"quadrature"`` (deterministic: a 1-D rule for one latent function and robust-max,
an iterated rule over the K - 1 logit differences for the softmax with :math:`K \le` ``max_quadrature_classes``),
``"mc"`` / :class:`~gpvi.inference.cvi.options.MonteCarlo` (reparameterised Monte Carlo, the paper's default; one
latent function or the softmax; with a Robbins-Monro step, :math:`\sum\beta_t = \infty`,
:math:`\sum\beta_t^2 < \infty`, it converges to the fixed point of the exact expectations) or ``"fixed"`` (softmax,
any K: a quasi-Monte Carlo average over fixed Sobol' points); ``"auto"`` is ``"quadrature"`` where it exists, else
``"fixed"`` (:mod:`gpvi.models.multiclass_likelihoods`). The bound reported (``elbo``, the stop rule, the type-II
objective) always uses the deterministic rule (``elbo_method``). With K latent functions each step first moves the
sites to the exact maximiser of the bound along the **common mode** (all classes' means shifted together, along which
softmax and robust-max are flat; :func:`gpvi.inference.cvi.steps.center`), and full-batch quadrature steps
are kept ELBO-monotone.

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
from ...models.multiclass import GPMulticlass
from ...models.multiclass_likelihoods import Softmax
from ...numerics import sites
from ...numerics.budget import MemoryBudget
from ...numerics.quadrature import Quadrature
from ...numerics.softmax_rules import default_quadrature
from ...posteriors.info import RunInfo
from ...posteriors.latent import LatentPosterior
from ...rng import check_seed, resolve_generator
from ...validation import check_bool, check_choice, check_fraction, check_positive, check_positive_int
from .. import driver
from ..contract import FaultPolicy, RunReport, resume_copy
from ..init import start_point
from ..schedules import rate
from . import steps
from .options import MonteCarlo, SingleSite, SitesConverged, init_to_sites, latent_init
from .state import CVIState

__all__ = ["CVI"]

_SNAPSHOT = ("lam1", "lam2", "theta", "t", "sites_updated", "initialised", "factor", "since_refactor", "order",
             "order_pos", "elbo", "beta_scale", "converged", "kept_lam1", "kept_lam2", "redo")

DEFAULT_NUM_STEPS = {False: 500, True: 1000}
"""Default cap on the steps of a run: one latent function, K latent functions."""
ROBBINS_MONRO = {False: (1.0, 0.6), True: (10.0, 0.7)}
r""":math:`(\tau, \kappa)` of ``beta_schedule="robbins_monro"``: one latent function, K latent functions."""


class CVI:
    r"""Conjugate-computation variational inference for latent GP models (Khan & Lin 2017, Algorithm 1, eq. 13-14).

    Parameters
    ----------
    mode : {"full", "stochastic"}
        Full-batch steps (every site, one O(N^3) factorisation per latent function and step) or doubly stochastic
        single-site steps (``single_site.batch_size`` data points per step, all their sites, on cached,
        rank-one-updated factors, O(K N^2) per step). Same fixed point.
    beta : float
        Step size :math:`\beta \in (0, 1]` of eq. 13 (default 0.5). With K latent functions, full-batch quadrature
        runs are ELBO-monotone for any ``beta``: a step that lowers the bound is undone and the step halved, growing
        back by 1.5 per accepted step (``info["backtracks"]``).
    estimator : {"auto", "quadrature", "mc", "fixed"} or MonteCarlo
        Gradients of :math:`\mathbb E_q[\log p(y_n \mid \mathbf f_n)]` (module docstring). ``"mc"`` is
        ``MonteCarlo()`` (10 draws per site); ``MonteCarlo(num_draws, variance_grad)`` sets the draws (its
        ``variance_grad`` applies to one latent function; the softmax uses Price's average).
    quadrature : Quadrature, optional
        The rule for quadrature gradients, the ELBO and predictions (default: ``Quadrature(96, "gl-asinh")`` for one
        latent function, :func:`gpvi.numerics.softmax_rules.default_quadrature` per dimension of the softmax rule).
    single_site : SingleSite, optional
        What a stochastic step does: ``batch_size``, ``refactor_every``, ``factor_update`` (default
        ``SingleSite()``: one data point per step, refactorisation once per sweep). Ignored when ``mode="full"``.
    num_steps : int, optional
        Cap on the steps of a run (resumed runs count from step 0; default 500 for one latent function, 1000 for K).
        A stochastic sweep is ``ceil(N / batch_size)`` steps; :func:`gpvi.inference.cvi.options.num_steps_for_sweeps`
        converts a budget in sweeps.
    tol : float
        Convergence: relative ELBO change between checks below ``tol`` (``|dL| <= tol * max(1, |L|)``); with Monte
        Carlo gradients of one latent function, the noise-aware form of
        :class:`~gpvi.inference.cvi.options.SitesConverged`. ``0`` disables the check (the run takes ``num_steps``).
    beta_schedule : {"auto", "constant", "robbins_monro"} or callable
        :math:`\beta_t = \beta`, or :math:`\beta / (1 + t/\tau)^{\kappa}` with :math:`t` the completed sweeps
        (:class:`~gpvi.inference.schedules.RobbinsMonro`; :math:`\tau = 1`, :math:`\kappa = 0.6` for one latent
        function, :math:`\tau = 10`, :math:`\kappa = 0.7` for K), or ``callable(t) -> beta_t`` (e.g. a
        ``RobbinsMonro`` with other :math:`\tau`, :math:`\kappa`). ``"auto"`` (default): ``"constant"`` with
        deterministic gradients (a constant step converges), ``"robbins_monro"`` with Monte Carlo gradients (a
        constant step leaves the sites fluctuating at a noise level proportional to :math:`\beta`).
    invalid : {"shrink", "reject"}
        What to do with a site update that would make :math:`\tilde\lambda^{(2)} \ge 0`
        (:func:`gpvi.numerics.sites.update_sites`).
    faults : FaultPolicy, optional
        Consecutive failed steps (failed factorisation, non-finite ELBO) tolerated before
        :class:`~gpvi.exceptions.NumericalFaultError` (default ``FaultPolicy(max_consecutive=10)``).
    seed : int or None
        Seed of the run's generator (site order, Monte Carlo draws) when ``run`` gets no ``generator``.
    progress_bar : bool
    center : bool
        K latent functions: before each step, move the sites to the exact maximiser of the bound along the common
        mode (default True). Same fixed point; without it CVI crawls along that mode when the signal variance is
        large.
    max_quadrature_classes : int
        Largest K for softmax quadrature (default 3: :math:`Q^{K-1}` nodes per site).
    num_fixed_draws : int
        Fixed quasi-Monte Carlo points of the ``"fixed"`` rule (default 1024, scrambled Sobol';
        :func:`gpvi.numerics.softmax_rules.fixed_draws`).

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.models.classification import GPClassification
    >>> from gpvi.models.multiclass import GPMulticlass
    >>> from gpvi.inference.cvi import CVI, num_steps_for_sweeps
    >>> ds = gpvi.datasets.load_pima()
    >>> model = GPClassification(ds.X_train, ds.y_train, likelihood="probit")
    >>> post = CVI(mode="stochastic", num_steps=num_steps_for_sweeps(30, model.num_data, mode="stochastic"),
    ...            progress_bar=False).run(model)
    >>> post.link, post.info["mode"]
    ('probit', 'stochastic')
    >>> X = torch.linspace(-2, 2, 30, dtype=torch.float64).unsqueeze(-1)
    >>> y = (X[:, 0] > -0.7).long() + (X[:, 0] > 0.7).long()
    >>> post = CVI(progress_bar=False).run(GPMulticlass(X, y))
    >>> post.converged, post.m.shape
    (True, torch.Size([30, 3]))
    """

    name = "CVI"

    def __init__(self, mode: str = "full", beta: float = 0.5, estimator: str | MonteCarlo = "auto", *,
                 quadrature: Quadrature | None = None, single_site: SingleSite | None = None,
                 num_steps: int | None = None, tol: float = 1e-9,
                 beta_schedule: str | Callable[[int], float] = "auto", invalid: str = "shrink",
                 faults: FaultPolicy | None = None, seed: int | None = 0, progress_bar: bool = True,
                 center: bool = True, max_quadrature_classes: int = 3, num_fixed_draws: int = 1024) -> None:
        self.mode = check_choice(mode, "mode", ["full", "stochastic"])
        self.beta = check_fraction(beta, "beta")
        if isinstance(estimator, MonteCarlo):
            self.requested_estimator, self.monte_carlo = "mc", estimator
        else:
            self.requested_estimator = check_choice(estimator, "estimator", ["auto", "quadrature", "mc", "fixed"])
            self.monte_carlo = MonteCarlo()
        if quadrature is not None and not isinstance(quadrature, Quadrature):
            raise TypeError(f"quadrature must be a gpvi.numerics.quadrature.Quadrature; got {type(quadrature).__name__}")
        self.user_quadrature = quadrature
        if single_site is not None and not isinstance(single_site, SingleSite):
            raise TypeError(f"single_site must be a gpvi.inference.cvi.SingleSite; got {type(single_site).__name__}")
        self.single_site = single_site if single_site is not None else SingleSite()
        self.requested_num_steps = None if num_steps is None else check_positive_int(num_steps, "num_steps")
        self.tol = check_positive(tol, "tol", allow_zero=True)
        if callable(beta_schedule):
            self.requested_schedule: str | Callable[[int], float] = beta_schedule
        else:
            self.requested_schedule = check_choice(beta_schedule, "beta_schedule",
                                                   ["auto", "constant", "robbins_monro"])
        self.invalid = check_choice(invalid, "invalid", ["shrink", "reject"])
        if faults is not None and not isinstance(faults, FaultPolicy):
            raise TypeError(f"faults must be a gpvi.inference.contract.FaultPolicy; got {type(faults).__name__}")
        self.faults = faults if faults is not None else FaultPolicy(max_consecutive=10)
        self.seed = check_seed(seed)
        self.progress_bar = check_bool(progress_bar, "progress_bar")
        self.center = check_bool(center, "center")
        self.max_quadrature_classes = check_positive_int(max_quadrature_classes, "max_quadrature_classes", minimum=2)
        self.num_fixed_draws = check_positive_int(num_fixed_draws, "num_fixed_draws")
        self._one_function_rule = quadrature if quadrature is not None else Quadrature()
        self._resolve(class_factorised=False, quad_ok=True)      # one latent function until a model says otherwise

    # ------------------------------------------------------------------ settings resolved for a model
    def _resolve(self, *, class_factorised: bool, quad_ok: bool) -> None:
        """Set ``estimator``, ``elbo_method``, ``quadrature``, ``beta_schedule``, ``num_steps`` for a model with one
        (``class_factorised=False``) or K latent functions; ``quad_ok``: the likelihood has a quadrature rule at this K."""
        est = self.requested_estimator
        if est == "auto":
            est = "quadrature" if quad_ok else "fixed"
        self.estimator = est
        self.elbo_method = "quadrature" if quad_ok else "fixed"
        self.class_factorised = class_factorised
        self.quadrature = self.user_quadrature if class_factorised else self._one_function_rule
        sched = self.requested_schedule
        if sched == "auto":
            sched = "robbins_monro" if est == "mc" else "constant"
        self.beta_schedule = sched
        self.num_steps = self.requested_num_steps or DEFAULT_NUM_STEPS[class_factorised]

    def _configure(self, model: Any) -> LatentGP:
        """Check ``model`` and resolve the settings that depend on it (its number of latent functions, K and
        likelihood); returns the model."""
        if not isinstance(model, LatentGP):
            raise TypeError(f"model must be a gpvi LatentGP (GPClassification, GPMulticlass); got "
                            f"{type(model).__name__}")
        if not isinstance(model, GPMulticlass):
            if self.requested_estimator == "fixed":
                raise ValueError("estimator='fixed' is for the multi-class softmax; one latent function uses "
                                 "'quadrature' or 'mc'")
            self._resolve(class_factorised=False, quad_ok=True)
            return model
        lik, K = model.likelihood, model.num_classes
        quad_ok = lik.has_quadrature(K, self.max_quadrature_classes)
        if self.requested_estimator == "quadrature" and not quad_ok:
            raise ValueError(f"estimator='quadrature' needs K <= max_quadrature_classes = "
                             f"{self.max_quadrature_classes} for the softmax (K = {K}); use 'mc' or 'fixed'")
        if self.requested_estimator in ("mc", "fixed") and not isinstance(lik, Softmax):
            raise ValueError(f"estimator={self.requested_estimator!r} is for the softmax likelihood; the {lik.name} "
                             f"likelihood uses quadrature (its pathwise derivatives vanish)")
        self._resolve(class_factorised=True, quad_ok=quad_ok)
        if self.quadrature is None:
            self.quadrature = default_quadrature(K)
        return model

    @property
    def num_draws(self) -> int:
        """Monte Carlo draws per site and step (``estimator="mc"``)."""
        return self.monte_carlo.num_draws

    @property
    def beta_rate(self) -> Callable[[int], float]:
        r""":math:`\beta_t` as a function of the completed sweeps (a schedule of :mod:`gpvi.inference.schedules`)."""
        tau, kappa = ROBBINS_MONRO[self.class_factorised]
        return rate(self.beta_schedule, self.beta, tau=tau, kappa=kappa)

    @property
    def monotone(self) -> bool:
        """K latent functions: full-batch steps with quadrature expectations are kept ELBO-monotone
        (:func:`~gpvi.inference.cvi.steps.keep_monotone`); Monte Carlo steps are not (their bound moves
        with the draws)."""
        return self.class_factorised and self.mode == "full" and self.estimator == "quadrature"

    def __repr__(self) -> str:
        est = self.requested_estimator
        return (f"CVI(mode={self.mode!r}, beta={self.beta:g}, estimator={est!r}, "
                f"num_steps={self.requested_num_steps or 'auto'}, tol={self.tol:g})")

    def settings(self, num_data: int | None = None) -> dict[str, Any]:
        """The settings as plain values (for ``info``), with what was resolved for the last model and ``num_data``
        sites."""
        mc = self.estimator == "mc"
        out: dict[str, Any] = {
            "mode": self.mode, "beta": self.beta, "estimator": self.estimator, "elbo_method": self.elbo_method,
            "beta_schedule": self.beta_schedule if isinstance(self.beta_schedule, str) else "callable",
            "quadrature": self.quadrature.spec() if self.quadrature is not None else None,
            "num_steps": self.num_steps, "tol": self.tol, "invalid": self.invalid,
            "max_consecutive_faults": self.faults.max_consecutive,
            "num_draws": self.num_draws if mc else None,
            "mc_variance_grad": self.monte_carlo.variance_grad if mc and not self.class_factorised else None,
            "batch_size": None, "refactor_every": None, "factor_update": None}
        if self.class_factorised:
            out.update(center=self.center, num_fixed_draws=self.num_fixed_draws
                       if "fixed" in (self.estimator, self.elbo_method) else None)
        if self.mode == "stochastic":
            out.update(batch_size=self.single_site.batch_size, factor_update=self.single_site.factor_update)
            if num_data is not None:
                out["refactor_every"], out["refactor_every_from"] = self.single_site.refactor_period(num_data)
        return out

    def steps_per_sweep(self, num_data: int) -> int:
        """Steps of one sweep over ``num_data`` data points: 1 (full) or ``ceil(N / batch_size)`` (stochastic)."""
        return 1 if self.mode == "full" else self.single_site.steps_per_sweep(num_data)

    # ------------------------------------------------------------------ the engine contract
    def default_init(self, target: Any) -> init_to_sites:
        r"""Start at ``model.theta`` with the sites at 0 (:math:`q` = prior, Algorithm 1 line 1), or, for a
        likelihood with ``initial_sites`` (the counts: :class:`~gpvi.models.latent_likelihoods.Poisson`,
        :class:`~gpvi.models.latent_likelihoods.NegativeBinomial`), at its sites: for counts those of the log
        counts (:func:`gpvi.models.latent_likelihoods.log_count_sites`), which CVI needs for counts in the hundreds.
        With ``weights`` :math:`w_n > 0` the sites are :math:`w_n` times those (the weighted likelihood's); a
        weight of 0 (a site that must stay empty) keeps the start at the prior."""
        sites = getattr(getattr(target, "likelihood", None), "initial_sites", None)
        w = getattr(target, "weights", None)
        if sites is None or (w is not None and not bool((w > 0).all())):
            return init_to_sites()
        lam1, lam2 = sites(target.y)
        if w is not None:
            lam1, lam2 = lam1 * w, lam2 * w
        return init_to_sites(lam1=lam1, lam2=lam2, sites=f"{target.likelihood.name}'s initial_sites")

    def init(self, target: Any, start: Any = None, generator: torch.Generator | None = None) -> CVIState:
        """A fresh state at ``start``: a :class:`~gpvi.inference.init.Start` (or anything ``run(init=...)`` takes).

        Parameters
        ----------
        target : LatentGP or GPMulticlass
        start : Start, optional
            ``start.theta`` are the kernel log-hyperparameters; a
            :class:`~gpvi.inference.cvi.options.SiteStart` may also carry sites. Default: ``model.theta``, sites 0.
        generator : torch.Generator, optional
            The run's random stream (default: a fresh one seeded with ``seed``).
        """
        model = self._configure(target)
        start = start_point(model, start, self.default_init(model), strategy=latent_init)
        theta = start.theta.detach().to(device=model.device, dtype=torch.float64).clone()
        gen = resolve_generator(self.seed, generator)
        lam1, lam2 = getattr(start, "lam1", None), getattr(start, "lam2", None)
        if lam1 is None:
            z = torch.zeros(model.site_shape, dtype=torch.float64, device=model.device)
            return CVIState(z, z.clone(), theta, gen)
        return CVIState(lam1.clone(), lam2.clone(), theta, gen, initialised=True)

    def initial_state(self, model: LatentGP, theta: Any = None, *, lam1: Any = None, lam2: Any = None,
                      generator: torch.Generator | None = None) -> CVIState:
        """A fresh state at ``theta`` (default ``model.theta``) with sites ``lam1``, ``lam2`` (default 0).

        Raises ``ValueError`` for sites of the wrong shape or with ``lam2 >= 0``.
        """
        model = self._configure(model)
        return self.init(model, init_to_sites(theta, lam1, lam2)(model), generator)

    def resume(self, target: Any, state: CVIState | dict[str, Any]) -> CVIState:
        """A checked copy of ``state`` (a CVI state or its ``state_dict``) to continue on ``target``."""
        model = self._configure(target)
        st = resume_copy(state, CVIState)
        if tuple(st.lam1.shape) != tuple(model.site_shape):
            raise ValueError(f"state has sites of shape {tuple(st.lam1.shape)} but the model's are "
                             f"{tuple(model.site_shape)}")
        if st.theta.shape[0] != model.dim:
            raise ValueError(f"state theta has length {st.theta.shape[0]} but the model has D = {model.dim}")
        if st.initialised and not bool((st.lam2 < 0).all()):
            raise ValueError("state has sites with lam2 >= 0; they are not valid Gaussian sites")
        for k in ("lam1", "lam2", "theta", "factor", "order", "kept_lam1", "kept_lam2"):   # saved on another device
            v = getattr(st, k, None)
            if v is not None and v.device != model.device:
                setattr(st, k, v.to(model.device))
        return st

    def stop_rule(self) -> SitesConverged:
        """:class:`~gpvi.inference.cvi.options.SitesConverged` with this engine's ``tol`` (noise-aware with Monte
        Carlo gradients of one latent function)."""
        return SitesConverged(self.tol, noisy=self.estimator == "mc" and not self.class_factorised)

    def postfix(self, info: dict[str, Any]) -> dict[str, Any]:
        return {"elbo": info["elbo"]} if "elbo" in info else {}

    def step(self, target: Any, state: CVIState) -> tuple[CVIState, dict[str, Any]]:
        """One step (full-batch, or one stochastic batch), **in place**: returns ``(state, info)``.

        The cached factors are updated in place and never copied. A failed factorisation or a non-finite ELBO rolls
        the state back to where the step began (sites, factors dropped, counters), halves the next step size and
        returns ``info["skipped"] = True``. ``info``: ``beta``, ``sites``, ``checked`` (the step evaluated the
        ELBO: then ``elbo``, ``converged`` and, in full mode, ``residual``; in stochastic mode ``drift``).
        """
        model = target
        t0 = time.perf_counter()
        snap = {k: getattr(state, k) for k in _SNAPSHOT}
        counters = dict(state.counters)
        try:
            K = model.kernel_matrix(state.theta)
            if self.mode == "full":
                info = steps.full_step(self, model, state, K, state.generator)
                if self.monotone:
                    steps.keep_monotone(state, info, self.tol)
            else:
                info = steps.stochastic_step(self, model, state, K, state.generator)
        except (sites.SiteFault, NotPSDError) as exc:
            self._restore(state, snap, counters)
            state.factor, state.since_refactor = None, 0
            state.beta_scale = 0.5 * snap["beta_scale"]
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
        if not self.monotone:
            state.beta_scale = 1.0
        elif info.get("backtracked"):
            state.beta_scale *= 0.5
        else:
            state.beta_scale = min(1.0, 1.5 * state.beta_scale)
        state.step_time_s += time.perf_counter() - t0
        if info["checked"]:
            steps.record_check(state, info, self.tol, noisy=self.estimator == "mc" and not self.class_factorised)
        return state, info

    @staticmethod
    def _restore(state: CVIState, snap: dict[str, Any], counters: dict[str, float]) -> None:
        for k, v in snap.items():
            setattr(state, k, v)
        state.counters = counters

    def result(self, target: Any, state: CVIState, report: RunReport) -> LatentPosterior | None:
        """The :class:`~gpvi.posteriors.latent.LatentPosterior` of ``state`` (it keeps a copy of the state).

        The ELBO is evaluated by the deterministic rule, also for a partial run. For a run that ended on a fault,
        ``None`` when even the last good sites cannot be factorised.
        """
        return steps.run_result(self, target, state, report)

    def posterior(self, model: LatentGP, state: CVIState, extra: dict[str, Any] | None = None, *,
                  warn: bool = True, pieces: dict[str, Any] | None = None) -> LatentPosterior:
        r"""The posterior of ``state`` at its :math:`\theta`: factors, marginals and ELBO recomputed (O(K N^3)).

        ``extra`` is merged into ``info``; ``warn`` issues the :class:`~gpvi.exceptions.ConvergenceWarning` of a
        run that ended without meeting ``tol``. ``pieces``: a full step's ``info["pieces"]`` at this state, reused.
        """
        model = self._configure(model)
        if not state.initialised:
            # nothing was done: q is the prior; represent it with (numerically) flat sites
            lam1, lam2 = torch.zeros_like(state.lam1), torch.full_like(state.lam2, -1e-12)
        else:
            lam1, lam2 = state.lam1, state.lam2
        elbo, parts = (pieces["elbo"], pieces) if pieces else steps.elbo_from_sites(self, model, lam1, lam2,
                                                                                    state.theta)
        L, alpha, m, v = parts["L"], parts["alpha"], parts["m"], parts["v"]
        kind = {"num_classes": model.num_classes, "backtracks": 0} if self.class_factorised else {}
        info = RunInfo(engine="CVI", converged=state.converged, steps=state.t, total_time_s=state.wall_time,
                       settings=self.settings(model.num_data), counters=dict(state.counters),
                       details={"link": model.link, **kind, "learn_hyperparameters": False, "sweeps": state.sweeps,
                                "step_time_s": state.step_time_s})
        info.update(extra or {})
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
        model : LatentGP or GPMulticlass
            E.g. :class:`gpvi.models.classification.GPClassification`.
        init : array-like of shape (D,), LatentPosterior or init strategy, optional
            Kernel log-hyperparameters for a fresh run (default ``model.theta``), a posterior to warm-start from
            (its theta and sites), or a strategy such as :class:`~gpvi.inference.cvi.options.init_to_sites`.
        state : CVI state or dict, optional
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
            Sites, marginals, ELBO, ``trace`` (per check), ``info`` (a :class:`~gpvi.posteriors.info.RunInfo`:
            ``converged``, ``interrupted``, ``steps``, ``time_s``, ``total_time_s``, ``settings``, ``counters``;
            details ``sweeps``, ``link``, ``step_time_s``...) and ``engine_state`` (a copy of the final state).

        Raises
        ------
        NumericalFaultError
            After ``faults.max_consecutive`` consecutive failed steps; ``err.state`` is the last good state.
        """
        return driver.run(self, self._configure(model), latent_init(init), state=state, generator=generator,
                          callback=callback, budget=budget)

    def elbo(self, model: LatentGP, state: CVIState) -> float:
        """ELBO (eq. 5) of the state's :math:`q` by the deterministic rule (O(K N^3): factorisations and marginals)."""
        model = self._configure(model)
        if not (state.initialised or self.class_factorised):
            K = model.kernel_matrix(state.theta)
            m, v = torch.zeros_like(state.lam1), K.diagonal().clone()
            return float(steps.expectations(self, model, m, v, None, self.elbo_method).value.sum())
        return steps.elbo_from_sites(self, model, state.lam1, state.lam2, state.theta)[0]
