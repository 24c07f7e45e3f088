r"""Multi-class CVI (Khan & Lin 2017) for K latent GPs with a softmax or robust-max likelihood, and its type-II loop.

:class:`MulticlassCVI` follows the engine contract of :mod:`gpvi.inference.engine` (``init`` / ``step`` /
``result``, run by :func:`gpvi.inference.driver.run`: progress bar, Ctrl-C, faults, resume). The variational family
is **class-factorised**, :math:`q(F) = \prod_k q_k(\mathbf f_k)` (GPflow's SVGP with independent latents), held in
2NK site numbers (:mod:`gpvi.inference.cvi.multiclass_sites`); a full-batch step costs one Cholesky factorisation
per class (the K factorisations batched), O(K N^3), plus the expectations (:mod:`gpvi.models.multiclass`).

Estimators of the site gradients (``estimator``):

* ``"quadrature"``: deterministic; softmax with :math:`K \le` ``max_quadrature_classes`` (an iterated rule over the
  K - 1 logit differences) and robust-max (a 1-D rule, any K);
* ``"mc"``: reparameterised Monte Carlo (softmax), ``num_draws`` draws per site and step from the run's seeded
  generator on the data's device. With a constant step the sites keep fluctuating, so the default schedule for
  ``"mc"`` decreases the step, :math:`\beta_t = \beta / (1 + t/\tau)^{\kappa}` (:math:`\tau = 10`,
  :math:`\kappa = 0.7`: :math:`\sum\beta_t = \infty`, :math:`\sum\beta_t^2 < \infty`, Robbins-Monro), which
  converges to the fixed point of the exact expectations;
* ``"fixed"``: a deterministic quasi-Monte Carlo average over ``num_fixed_draws`` fixed Sobol' points (softmax,
  any K).

``"auto"`` (default) is ``"quadrature"`` where it exists, else ``"fixed"``. The bound reported (``elbo``, the
stop rule, the type-II objective) always uses the deterministic rule (``elbo_method``).

``mode="stochastic"``: doubly stochastic single-site steps (eq. 14) on the K class factors, cached and kept current
by rank-one updates, O(K N^2) per step (:mod:`gpvi.inference.cvi.multiclass_single`).

:class:`~gpvi.inference.cvi.multiclass_typeii.MulticlassTypeII` (in its own module) learns the shared kernel
log-hyperparameters by MAP-II on the profiled bound.

Each step first moves the sites to the exact maximiser of the bound along the **common mode** (all classes' means
shifted together, along which softmax and robust-max are flat; ``center``,
:func:`gpvi.inference.cvi.multiclass_sites.center`): same fixed point, without the crawl along that mode. Measured
speed is in ``benchmarks/results/multiclass.md``; its history in ``CHANGELOG.md``.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ...exceptions import ConvergenceWarning, NotPSDError, NumericalWarning
from ...posteriors.latent import LatentPosterior
from ...numerics.quadrature import Quadrature
from ...models.multiclass import GPMulticlass
from ...models.multiclass_likelihoods import Softmax
from ...numerics.softmax_rules import default_quadrature
from ...rng import check_seed, resolve_generator
from ...validation import (as_float_tensor, check_bool, check_choice, check_fraction, check_positive,
                           check_positive_int)
from .. import driver
from ...numerics.budget import MemoryBudget
from ..engine import FaultPolicy, RunReport, resume_copy
from ..schedules import rate
from . import multiclass_sites as ms
from ...numerics import sites
from . import steps
from .multiclass_single import stochastic_step
from .options import SingleSite, SitesConverged
from .multiclass_sites import MulticlassCVIState

__all__ = ["MulticlassCVI", "MulticlassCVIState", "LatentPosterior"]

_SNAPSHOT = ("lam1", "lam2", "theta", "t", "sites_updated", "initialised", "elbo", "beta_scale", "converged",
             "factor", "since_refactor", "order", "order_pos", "kept_lam1", "kept_lam2", "redo")


class MulticlassCVI:
    r"""Full-batch CVI for :class:`~gpvi.models.multiclass.GPMulticlass` (Khan & Lin 2017, Algorithm 1, eq. 13).

    Parameters
    ----------
    beta : float
        Step size :math:`\beta \in (0, 1]` (default 0.5). Full-batch quadrature runs are ELBO-monotone for any
        ``beta``: a step that lowers the bound is undone and the step halved, growing back by 1.5 per accepted step
        (``info["backtracks"]`` counts them; the damped map alone can cycle where the signal variance is large and
        ``beta`` near 1).
    estimator : {"auto", "quadrature", "mc", "fixed"}
        See the module docstring.
    quadrature : Quadrature, optional
        The 1-D rule per dimension of the softmax quadrature (default
        :func:`gpvi.numerics.softmax_rules.default_quadrature`).
    max_quadrature_classes : int
        Largest K for softmax quadrature (default 3: :math:`Q^{K-1}` nodes per site).
    num_draws : int
        Monte Carlo draws per site and step (``"mc"``; default 10).
    num_fixed_draws : int
        Fixed quasi-Monte Carlo points of the ``"fixed"`` rule (default 1024, scrambled Sobol'; see
        :func:`gpvi.numerics.softmax_rules.fixed_draws`).
    beta_schedule : {"auto", "constant", "robbins_monro"} or callable
        ``"auto"``: constant for deterministic estimators, ``"robbins_monro"`` for ``"mc"``, which is
        :math:`\beta_t = \beta / (1 + t/\tau)^\kappa` with :math:`\tau = 10`, :math:`\kappa = 0.7`
        (:class:`~gpvi.inference.schedules.RobbinsMonro`); ``callable(t) -> beta_t`` with t the completed sweeps
        (e.g. a ``RobbinsMonro`` with other :math:`\tau`, :math:`\kappa`).
    num_steps : int
        Cap on the steps of a run.
    tol : float
        Stop when the relative change of the bound between steps is at most ``tol`` (0: never).
    invalid : {"shrink", "reject"}
        What to do with a site update that would make :math:`\tilde\lambda^{(2)} \ge 0` (robust-max can produce
        one; see :func:`gpvi.numerics.sites.update_sites`).
    mode : {"full", "stochastic"}
        ``"full"`` (default): every site every step, one batched factorisation of the K matrices :math:`K + S_k`
        per step, O(K N^3). ``"stochastic"``: doubly stochastic single-site steps (``single_site.batch_size`` data
        points per step, all their K sites) on cached class factors kept current by rank-one updates, O(K N^2) per
        step; the bound is checked (and the sites centred) at each refactorisation
        (:mod:`gpvi.inference.cvi.multiclass_single`). Same fixed point. A single-site step is 36-189x cheaper
        than a full-batch one at N = 250-2000 (K = 3), but a sweep costs 7-19 full-batch steps and full-batch CVI
        converges in about 17, so end to end the full-batch run was faster up to N = 1000
        (``benchmarks/results/multiclass_step_cost.md``); single-site steps give progress (and an interruptible
        run) at a cost of O(K N^2) per step where one full-batch step takes too long to wait for.
    single_site : SingleSite, optional
        Batch size and refactorisation period of ``mode="stochastic"`` (default ``SingleSite()``: one data point per
        step, refactorisation once per sweep).
    center : bool
        Before each step, move the sites to the exact maximiser of the bound along the common mode (all classes'
        means shifted together, :func:`gpvi.inference.cvi.multiclass_sites.center`; default True). Same fixed
        point; without it CVI crawls along that mode when the signal variance is large.
    faults : FaultPolicy, optional
    seed : int or None
    progress_bar : bool

    Examples
    --------
    >>> import torch
    >>> from gpvi.models.multiclass import GPMulticlass
    >>> X = torch.linspace(-2, 2, 30, dtype=torch.float64).unsqueeze(-1)
    >>> y = (X[:, 0] > -0.7).long() + (X[:, 0] > 0.7).long()
    >>> post = MulticlassCVI(progress_bar=False).run(GPMulticlass(X, y))
    >>> post.converged, post.m.shape
    (True, torch.Size([30, 3]))
    """

    name = "MulticlassCVI"

    def __init__(self, beta: float = 0.5, estimator: str = "auto", *, quadrature: Quadrature | None = None,
                 max_quadrature_classes: int = 3, num_draws: int = 10, num_fixed_draws: int = 1024,
                 beta_schedule: str | Callable[[int], float] = "auto", num_steps: int = 1000, tol: float = 1e-9, invalid: str = "shrink",
                 faults: FaultPolicy | None = None, seed: int | None = 0, progress_bar: bool = True,
                 center: bool = True, mode: str = "full", single_site: SingleSite | None = None) -> None:
        self.beta = check_fraction(beta, "beta")
        self.requested_estimator = check_choice(estimator, "estimator", ["auto", "quadrature", "mc", "fixed"])
        if quadrature is not None and not isinstance(quadrature, Quadrature):
            raise TypeError(f"quadrature must be a gpvi.models.likelihoods.Quadrature; got {type(quadrature).__name__}")
        self.user_quadrature = quadrature
        self.max_quadrature_classes = check_positive_int(max_quadrature_classes, "max_quadrature_classes", minimum=2)
        self.num_draws = check_positive_int(num_draws, "num_draws")
        self.num_fixed_draws = check_positive_int(num_fixed_draws, "num_fixed_draws")
        if callable(beta_schedule):
            self.requested_schedule: str | Callable[[int], float] = beta_schedule
        else:
            self.requested_schedule = check_choice(beta_schedule, "beta_schedule",
                                                   ["auto", "constant", "robbins_monro"])
        self.num_steps = check_positive_int(num_steps, "num_steps")
        self.tol = check_positive(tol, "tol", allow_zero=True)
        self.invalid = check_choice(invalid, "invalid", ["shrink", "reject"])
        if faults is not None and not isinstance(faults, FaultPolicy):
            raise TypeError(f"faults must be a gpvi.inference.engine.FaultPolicy; got {type(faults).__name__}")
        self.faults = faults if faults is not None else FaultPolicy(max_consecutive=10)
        self.seed = check_seed(seed)
        self.progress_bar = check_bool(progress_bar, "progress_bar")
        self.center = check_bool(center, "center")
        self.mode = check_choice(mode, "mode", ["full", "stochastic"])
        if single_site is not None and not isinstance(single_site, SingleSite):
            raise TypeError(f"single_site must be a gpvi.inference.cvi.SingleSite; got {type(single_site).__name__}")
        self.single_site = single_site if single_site is not None else SingleSite()
        # resolved for a model by _configure (the estimator depends on the likelihood and K)
        self.estimator, self.elbo_method, self.quadrature = "quadrature", "quadrature", quadrature
        self.beta_schedule: str | Callable[[int], float] = "constant"

    def __repr__(self) -> str:
        return (f"MulticlassCVI(mode={self.mode!r}, beta={self.beta:g}, estimator={self.requested_estimator!r}, "
                f"num_steps={self.num_steps}, tol={self.tol:g})")

    # ------------------------------------------------------------------ helpers
    @property
    def beta_rate(self) -> Callable[[int], float]:
        r""":math:`\beta_t` as a function of the completed sweeps (``"robbins_monro"``: :math:`\tau = 10`,
        :math:`\kappa = 0.7`)."""
        return rate(self.beta_schedule, self.beta, tau=10.0, kappa=0.7)

    @property
    def monotone(self) -> bool:
        """Full-batch steps with quadrature expectations are kept ELBO-monotone
        (:func:`~gpvi.inference.cvi.multiclass_sites.keep_monotone`, which says why not on the fixed rule); Monte
        Carlo steps are not (their bound moves with the draws)."""
        return self.mode == "full" and self.estimator == "quadrature"

    def _configure(self, model: Any) -> GPMulticlass:
        if not isinstance(model, GPMulticlass):
            raise TypeError(f"model must be a gpvi GPMulticlass; got {type(model).__name__}")
        lik, K = model.likelihood, model.num_classes
        quad_ok = lik.has_quadrature(K, self.max_quadrature_classes)
        est = self.requested_estimator
        if est == "auto":
            est = "quadrature" if quad_ok else "fixed"
        if est == "quadrature" and not quad_ok:
            raise ValueError(f"estimator='quadrature' needs K <= max_quadrature_classes = "
                             f"{self.max_quadrature_classes} for the softmax (K = {K}); use 'mc' or 'fixed'")
        if est in ("mc", "fixed") and not isinstance(lik, Softmax):
            raise ValueError(f"estimator={est!r} is for the softmax likelihood; the {lik.name} likelihood uses "
                             f"quadrature (its pathwise derivatives vanish)")
        self.estimator = est
        self.elbo_method = "quadrature" if quad_ok else "fixed"
        self.quadrature = self.user_quadrature if self.user_quadrature is not None else default_quadrature(K)
        sched = self.requested_schedule
        if sched == "auto":
            sched = "robbins_monro" if est == "mc" else "constant"
        self.beta_schedule = sched
        return model

    def settings(self, num_data: int | None = None) -> dict[str, Any]:
        out = {"mode": self.mode, "beta": self.beta, "estimator": self.estimator, "elbo_method": self.elbo_method,
                "beta_schedule": self.beta_schedule if isinstance(self.beta_schedule, str) else "callable",
                "quadrature": self.quadrature.spec() if self.quadrature is not None else None,
                "num_draws": self.num_draws if self.estimator == "mc" else None,
                "num_fixed_draws": self.num_fixed_draws if "fixed" in (self.estimator, self.elbo_method) else None,
                "num_steps": self.num_steps, "tol": self.tol, "invalid": self.invalid, "center": self.center,
                "max_consecutive_faults": self.faults.max_consecutive}
        if self.mode == "stochastic":
            out.update(batch_size=self.single_site.batch_size, factor_update=self.single_site.factor_update)
            if num_data is not None:
                out["refactor_every"], out["refactor_every_from"] = self.single_site.refactor_period(num_data)
        return out

    # ------------------------------------------------------------------ the engine contract
    def default_init(self, target: Any) -> Callable[[Any], Any]:
        return _Start()

    def init(self, target: Any, start: Any = None, generator: torch.Generator | None = None) -> MulticlassCVIState:
        """A fresh state: ``start`` is ``None`` (``model.theta``, sites 0: q = prior), a theta, a
        :class:`LatentPosterior` (its theta and sites, a warm start) or a :class:`_Start`."""
        model = self._configure(target)
        if not isinstance(start, _Start):
            start = _Start.of(start)
        theta, lam1, lam2 = start.resolve(model)
        gen = resolve_generator(self.seed, generator)
        if lam1 is None:
            z = torch.zeros(model.num_data, model.num_classes, dtype=torch.float64, device=model.device)
            return MulticlassCVIState(z, z.clone(), theta, gen)
        return MulticlassCVIState(lam1, lam2, theta, gen, initialised=True)

    def resume(self, target: Any, state: Any) -> MulticlassCVIState:
        model = self._configure(target)
        st = resume_copy(state, MulticlassCVIState)
        if tuple(st.lam1.shape) != (model.num_data, model.num_classes):
            raise ValueError(f"state has sites of shape {tuple(st.lam1.shape)} but the model has (N, K) = "
                             f"({model.num_data}, {model.num_classes})")
        if st.theta.shape[0] != model.dim:
            raise ValueError(f"state theta has length {st.theta.shape[0]} but the model has D = {model.dim}")
        for k in ("lam1", "lam2", "theta", "factor", "order", "kept_lam1", "kept_lam2"):
            if getattr(st, k) is not None:
                setattr(st, k, getattr(st, k).to(model.device))
        return st

    def stop_rule(self) -> SitesConverged:
        return SitesConverged(self.tol)

    def postfix(self, info: dict[str, Any]) -> dict[str, Any]:
        return {"elbo": info["elbo"]} if "elbo" in info else {}

    def step(self, target: Any, state: MulticlassCVIState) -> tuple[MulticlassCVIState, dict[str, Any]]:
        """One step (full-batch, or one single-site batch) in place; a failed factorisation or non-finite bound
        rolls back (the cached factors are dropped and recomputed), halves the next step and returns
        ``info["skipped"] = True``. ``info["checked"]``: the step evaluated the bound (every full-batch step; each
        refactorisation of a stochastic run)."""
        model = target
        snap = {k: getattr(state, k) for k in _SNAPSHOT}
        counters = dict(state.counters)
        t0 = time.perf_counter()
        try:
            K = model.kernel_matrix(state.theta)
            if self.mode == "full":
                info = ms.full_step(self, model, state, K, state.generator)
                if self.monotone:
                    ms.keep_monotone(state, info, self.tol)
            else:
                info = stochastic_step(self, model, state, K, state.generator)
        except (sites.SiteFault, NotPSDError) as exc:
            for k, v in snap.items():
                setattr(state, k, v)
            state.factor, state.since_refactor = None, 0
            state.counters = counters
            state.counters["faults"] += 1
            state.t += 1
            state.beta_scale = 0.5 * snap["beta_scale"]
            warnings.warn(f"MulticlassCVI: numerical fault ({exc}); rolled back to the last good state and halved "
                          f"the step", NumericalWarning, stacklevel=3)
            return state, {"skipped": True, "fault": str(exc), "beta": state.beta_scale * self.beta, "sites": 0,
                           "checked": False}
        except KeyboardInterrupt:
            dropped = state.factor is None and snap["factor"] is not None
            for k, v in snap.items():
                setattr(state, k, v)
            if dropped:                                # interrupted inside the in-place factor update
                state.factor = None
            state.counters = counters
            raise
        if not self.monotone:
            state.beta_scale = 1.0
        elif info.get("backtracked"):
            state.beta_scale *= 0.5
        else:
            state.beta_scale = min(1.0, 1.5 * state.beta_scale)
        state.step_time_s += time.perf_counter() - t0
        if info["checked"]:
            steps.record_check(state, info, self.tol)
        return state, info

    def result(self, target: Any, state: MulticlassCVIState, report: RunReport) -> LatentPosterior | None:
        """The :class:`~gpvi.posteriors.latent.LatentPosterior` of ``state`` (as :meth:`gpvi.CVI.result`)."""
        return steps.run_result(self, target, state, report)

    def posterior(self, model: GPMulticlass, state: MulticlassCVIState, extra: dict[str, Any] | None = None, *,
                  warn: bool = True) -> LatentPosterior:
        """The posterior of ``state`` at its theta: factors, marginals and bound recomputed."""
        model = self._configure(model)
        if not state.initialised:
            lam1, lam2 = torch.zeros_like(state.lam1), torch.full_like(state.lam2, -1e-12)
        else:
            lam1, lam2 = state.lam1, state.lam2
        elbo, parts = ms.elbo_from_sites(self, model, lam1, lam2, state.theta)
        info = {**self.settings(model.num_data), "link": model.link, "num_classes": model.num_classes,
                "learn_hyperparameters": False, "steps": state.t, "sweeps": state.sweeps,
                "converged": state.converged, "interrupted": False, "wall_time": state.wall_time,
                "step_time_s": state.step_time_s, "backtracks": 0, **state.counters, **(extra or {})}
        if warn and not state.converged and self.tol > 0:
            warnings.warn(f"MulticlassCVI did not converge within {state.t} steps (tol={self.tol:g})",
                          ConvergenceWarning, stacklevel=5)
        return LatentPosterior(model, lam1, lam2, state.theta, parts["m"], parts["v"], L=parts["L"],
                                   alpha=parts["alpha"], elbo=elbo, converged=state.converged,
                                   trace={k: list(x) for k, x in state.trace.items()}, info=info,
                                   engine_state=state, quadrature=self.quadrature)

    def run(self, model: GPMulticlass, init: Any = None, *, state: Any = None,
            generator: torch.Generator | None = None,
            callback: Callable[[MulticlassCVIState, dict[str, Any]], None] | None = None,
            budget: MemoryBudget | None = None) -> LatentPosterior:
        """Run to convergence or ``num_steps`` steps (through :func:`gpvi.inference.driver.run`).

        ``init``: a theta (D,), a :class:`LatentPosterior` (warm start from its theta and sites) or ``None``;
        ``state``: a :class:`MulticlassCVIState` or its ``state_dict()`` to resume (never changed).
        """
        self._configure(model)
        return driver.run(self, model, None if init is None else _Start.of(init), state=state,
                          generator=generator, callback=callback, budget=budget)

    def elbo(self, model: GPMulticlass, state: MulticlassCVIState) -> float:
        """The bound of the state's q (deterministic rule)."""
        model = self._configure(model)
        return ms.elbo_from_sites(self, model, state.lam1, state.lam2, state.theta)[0]


class _Start:
    """Where a multi-class run starts (an init strategy for the driver: ``strategy(model) -> self`` resolved)."""

    def __init__(self, theta: Any = None, lam1: Any = None, lam2: Any = None, source: str = "model.theta") -> None:
        self.theta, self.lam1, self.lam2, self.source = theta, lam1, lam2, source
        self.info: dict[str, Any] = {"mean": source}

    @classmethod
    def of(cls, init: Any) -> _Start:
        if init is None:
            return cls()
        if isinstance(init, _Start):
            return init
        if isinstance(init, LatentPosterior):
            return cls(init.theta, init.lam1, init.lam2, source="posterior")
        return cls(init, source="given")

    def __call__(self, model: Any) -> _Start:
        return self

    def resolve(self, model: Any) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        th = model.check_theta(self.theta).detach().to(device=model.device, dtype=torch.float64).clone()
        if self.lam1 is None:
            return th, None, None
        shape = (model.num_data, model.num_classes)
        l1 = as_float_tensor(self.lam1, "lam1", ndim=2, device=model.device).clone()
        l2 = as_float_tensor(self.lam2, "lam2", ndim=2, device=model.device).clone()
        if tuple(l1.shape) != shape or tuple(l2.shape) != shape:
            raise ValueError(f"lam1 and lam2 must have shape (N, K) = {shape}; got {tuple(l1.shape)}, "
                             f"{tuple(l2.shape)}")
        if not bool((l2 < 0).all()):
            raise ValueError(f"lam2 must be < 0 for every site; {int((l2 >= 0).sum())} are not")
        return th, l1, l2
