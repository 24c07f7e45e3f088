r"""Type-II (MAP) estimation of the kernel hyperparameters on the CVI bound: an outer loop around CVI runs.

:class:`TypeII` maximises, over the kernel's log-hyperparameters :math:`\theta`, the **profiled objective**

.. math::

    F(\theta) = \max_q \mathcal L(\theta, q) + \log p(\theta),

the ELBO (Khan & Lin 2017, eq. 5) plus the log prior of :math:`\theta`. The default prior is the one of the
regression engines, independent :math:`\mathcal N(0, 10)` on every log-hyperparameter
(:func:`gpvi.models.priors.default_prior`); ``prior=None`` drops the term (plain type-II maximisation of the bound)
unless the kernel registers priors (``lengthscale_prior=``...): those are always part of the model, so the
maximisation is then MAP-II with them and a flat prior on the other components
(:class:`gpvi.models.model_prior.ModelPrior`). A ``{name: distribution}`` dict puts priors on named natural values
(``{"lengthscale": gpytorch.priors.LogNormalPrior(0.0, 0.5)}``), as for :class:`gpvi.GPRegression`. The same holds
for every latent model: :class:`gpvi.GPClassification`, :class:`gpvi.GPGeneralisedRegression` (whose likelihood's
parameters have their own priors in :class:`gpvi.inference.cvi.LikelihoodTypeII`) and the multi-class models.
The prior is what keeps :math:`F` bounded above on (nearly) separable data: there the ELBO keeps growing as the
signal variance grows and the lengthscales of irrelevant inputs grow, and without it the maximiser runs to the box
``theta_bounds``. It alternates two things:

1. a CVI run (:meth:`gpvi.CVI.run`, through the driver) at the current :math:`\theta` until the sites converge (the
   engine's stop rule) or its step budget is spent;
2. a **hyperparameter phase**: L-BFGS-B (:func:`gpvi.numerics.lbfgs.lbfgs_maximise`) on :math:`F`. Each
   evaluation warm-starts full-batch CVI (deterministic gradients) from the current sites at the trial
   :math:`\theta`, runs it ELBO-monotone until the relative ELBO change is below ``inner_tol``
   (:func:`gpvi.inference.cvi.inner.converge_sites`), then returns the ELBO and its gradient with the converged
   sites held fixed (:func:`gpvi.inference.cvi.inner.theta_objective`; at the fixed point this is
   :math:`dF/d\theta`, the envelope theorem), plus :math:`\log p(\theta)` and its gradient.

The loop ends when a phase improves :math:`F` by less than ``tol * max(1, |F|)``, when a (non-coarse) phase ends
by L-BFGS-B's own stop rule at its best point (a further phase from there would start its inner runs, with the same
rule, at the same stationary point), when the engine's ``num_steps`` (counted over all CVI runs, not the inner
ones) are spent, or on Ctrl-C. The first phase is **coarse** (:data:`COARSE`): far from the optimum the inner
runs need not reach 1e-9, because L-BFGS-B's steps there change the objective by far more than a 1e-6 error.
The same loop serves one latent function and K (class-factorised softmax or robust-max, sharing :math:`\theta`).

Resolution
----------
The objective is known only to its inner runs' accuracy, and with K > 3 classes its gradient only to the fixed
quasi-Monte Carlo rule's: Price's :math:`\partial_v E` is not the derivative of the rule's own value
(:mod:`gpvi.models.multiclass_likelihoods`), so the envelope gradient keeps a floor (norm 0.01-0.04 at the
optimum on ``benchmarks/classification_heldout.py``'s multi-class sets, where the value no longer rises along it).
L-BFGS-B's line search then shrinks its trial steps for up to 20 evaluations, each an inner run, and values that
creep up at the same theta by the inner runs' residual let it go on (29 evaluations at one theta to four
decimals on ``mc_clf``, K = 4, N = 300). So a phase ends, at its best point and as if L-BFGS-B had stopped there,
at a trial point whose first-order change from the best point so far, :math:`\lVert g\rVert\,\lVert\Delta\theta
\rVert`, is at most the phase's ``ftol`` times :math:`\max(1, |F|)`: L-BFGS-B stops on a change of that size
between iterations anyway, and no evaluation there can tell a gain from the objective's own error
The coarse first phase keeps L-BFGS-B's own rules (its ``ftol`` is the inner runs' accuracy already). With the fixed
rule the coarse phase is the last (``fine_fixed``): its ``gtol`` is at the gradient's floor already.
(``resolution=False``: L-BFGS-B's own rules only; ``info["counters"]["theta_resolution_stops"]`` counts such ends.)

"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...exceptions import BoundWarning, NotPSDError, NumericalWarning
from ...models.multiclass_likelihoods import Softmax
from ...models.priors import check_prior_choice, prior_log_prob, prior_name, resolve_prior
from ...numerics import sites
from ...numerics.lbfgs import box_message, ends_on_box, lbfgs_maximise
from ...numerics.quadrature import Quadrature
from ...posteriors.latent import LatentPosterior
from ...validation import (check_bool, check_fraction, check_interval, check_nonnegative_int, check_positive,
                           check_positive_int)
from ..progress import warn_interrupted
from . import steps
from .deferred import built, final_posterior, run_deferred
from .engine import CVI
from .inner import inner_quadrature, profiled_objective, secant_step, trial_tol
from .state import CVIState

__all__ = ["TypeII", "secant_step", "inner_quadrature", "report_box", "COARSE"]

COARSE = {"cvi_tol": 1e-2, "inner_tol": 1e-6, "gtol": 1e-2, "ftol": 1e-6, "max_inner_tol": 1e-3}
"""Settings of :class:`TypeII`'s coarse first phase (``coarse=True``): the first CVI run's ``tol`` (1e-2: the
phase's first evaluation converges the sites from there to ``inner_tol`` with the accelerated inner run, which
takes 2-3 steps more than from sites at 1e-6, where the plain run from the prior took 6-8 more to reach 1e-6:
``benchmarks/results/classification_heldout.md``), the first L-BFGS-B phase's ``inner_tol``, ``gtol`` (on the objective divided by the norm of its first gradient) and
``ftol`` (the relative change between L-BFGS-B iterations below which the phase stops: that of the objective's own
accuracy, ``inner_tol``; at 1e-10 the digits benchmark's coarse phase spent 8 more evaluations of 2 inner steps
each on changes the inner runs cannot resolve). ``max_inner_tol``: the largest inner tolerance of a trial point with
``coarse_adaptive`` (and that of the phase's first point), :func:`gpvi.inference.cvi.inner.trial_tol`."""


class _Resolved(Exception):
    """Raised inside a phase's objective for a trial point below the objective's resolution (ends the phase)."""


def report_box(model: Any, theta: torch.Tensor, theta_bounds: tuple[float, float], prior: Any) -> dict[str, str]:
    """The components of a type-II ``theta`` that ended on ``model``'s box (:meth:`LatentGP.theta_box`), as
    ``info["at_bound"]`` records them, with one :class:`~gpvi.exceptions.BoundWarning` naming them (as
    :class:`gpvi.ML2` does): an irrelevant input's lengthscale at the top under ML-II, or a prior too weak to
    keep theta inside the box."""
    lo, hi = model.theta_box(theta_bounds)
    at_bound = ends_on_box(theta, lo, hi, list(model.names))
    if at_bound:
        warnings.warn(box_message(at_bound, theta_bounds, "ML-II" if prior is None else "MAP-II",
                                  setting="theta_bounds", relative=True), BoundWarning, stacklevel=3)
    return at_bound


class TypeII:
    r"""MAP-II (or type-II) maximisation of the CVI bound over the kernel log-hyperparameters (module docstring).

    Maximises :math:`F(\theta) + \log p(\theta)` with :math:`F(\theta) = \max_q \mathcal L(\theta, q)` (the profiled
    ELBO) by L-BFGS-B, for one latent function (:class:`~gpvi.models.classification.GPClassification`) or K sharing
    :math:`\theta` (:class:`~gpvi.models.multiclass.GPMulticlass`). Each evaluation warm-starts deterministic CVI
    from the current sites at the trial :math:`\theta` until the relative change is below ``inner_tol``, then
    returns the bound plus log prior and its gradient with the sites held fixed
    (:func:`gpvi.inference.cvi.inner.profiled_objective`). CVI runs and such phases alternate until a phase
    improves the objective by less than ``tol`` relative, or a (non-coarse) phase ends by L-BFGS-B's own stop rule
    at its best point.

    Parameters
    ----------
    cvi : CVI, optional
        The engine of the CVI runs (default ``CVI()``); its ``num_steps`` caps the steps of all runs together, its
        ``invalid`` and rule are used by the inner runs too (its ``beta`` where ``inner_beta`` is None).
    prior : "default", "scaled", None or distribution
        ``"default"``: :func:`gpvi.models.priors.default_prior` (:math:`\mathcal N(0, 10 I)` on the
        log-hyperparameters); ``"scaled"``: the same variance centred at the data-scaled ``model.scaled_theta()``
        (:func:`gpvi.models.priors.resolve_prior`); ``None``: no prior (type-II maximum of the bound), or only the
        priors registered on the kernel (MAP-II); a ``{name: distribution}`` dict of priors on named natural values
        (``"lengthscale"``, ``"signal_var"``, ``"signal_sd"``...), the default on the rest; or any object with
        ``log_prob`` over all of theta. Registered priors are always used (with the log-Jacobian of theta -> the
        natural value, :class:`gpvi.models.model_prior.ModelPrior`).
    tol : float
        The loop ends when a phase improves the objective by at most ``tol`` relative (default 1e-7).
    gtol : float
        L-BFGS-B's tolerance on the projected gradient of the objective (default 1e-5).
    inner_quadrature : "auto", Quadrature or None
        The softmax rule of the phases' inner runs and gradients. ``"auto"`` (default):
        :func:`inner_quadrature` (28 nodes per dimension on a window of 6 sd, 784 per site at K = 3, about half
        the cost of the engine's 1600-node rule), unless the engine was given its own ``quadrature``; ``None``:
        the engine's rule. The bound reported, the final posterior and the CVI runs between phases use the
        engine's rule; as the bound is stationary in the sites, sites converged under the cheaper rule give the
        fine rule's bound to second order in the rules' difference, and the optimum in theta moves to first order
        only (measured on iris: objective within 2e-8 of a run with the fine rule throughout).
    ftol : float
        L-BFGS-B's tolerance on the relative change of the objective between its iterations (default 1e-8, ten
        times the default ``inner_tol``). Runs to ``inner_tol`` make the objective reproducible only to about
        1.5 ``inner_tol``, so a tolerance at or below that compares noise (L-BFGS-B then spends evaluations at the
        same theta).
    coarse : bool
        Start with a **coarse phase** (default True): the first CVI run stops at a relative change of
        :data:`COARSE` ``["cvi_tol"]`` (with the inner runs' rule, ``inner_quadrature``: its sites only start the
        coarse phase, whose inner runs use that rule) and the first L-BFGS-B phase uses ``inner_tol`` = :data:`COARSE`
        ``["inner_tol"]``, ``gtol`` = :data:`COARSE` ``["gtol"]`` and ``ftol`` = :data:`COARSE` ``["ftol"]``; the
        phases after it use the settings above,
        and only they can end the loop. Far from the optimum the inner runs need not reach 1e-9: the steps of
        L-BFGS-B there change the objective by far more than a 1e-6 error. The optimum is unchanged (to about
        1e-9 relative on the benchmark splits, ``benchmarks/results/multiclass.md``). ``False``: every phase at the
        settings above.
    inner_beta : float or None
        Step size of the phases' inner runs and of the coarse first CVI run when that is a full-batch run with
        deterministic expectations (default 0.75; ``None``: the engine's ``beta``). The inner runs are monotone in the bound (a step that lowers it is undone and halved), so any
        step in (0, 1] reaches the same fixed point; a longer one takes fewer steps where the bound's curvature
        allows it. Measured on the tuning half of ``benchmarks/classification_heldout.py`` (binary, N = 500) and
        its multi-class tuning family (K = 3-6, N = 100-300): 0.75 took 11% and 12% fewer steps in all than the
        engine's default 0.5 (1.0: 12% fewer on the binary sets but 10% more on the two spirals, with backtracks),
        the same objective to 1e-8 relative (the binary sets; multi-class within 7e-7).
    anderson : int
        Memory of the Anderson acceleration of the inner runs (default 5; 0: plain damped steps). The inner runs
        converge linearly, the bound's gap shrinking by about 0.55 per step on iris (23 steps for the coarse
        phase's 1e-6 after its largest move in theta); extrapolating from the last ``anderson + 1`` steps
        (:class:`gpvi.numerics.anderson.Anderson`, each extrapolation kept only if the bound does not go down:
        :func:`gpvi.inference.cvi.inner.monotone_run`) takes 15 there. Same fixed point and stop rule.
    max_iter : int
        L-BFGS-B iterations per hyperparameter phase.
    inner_tol : float
        Convergence tolerance (relative ELBO change) of the inner CVI runs of a (non-coarse) phase.
    inner_num_steps : int
        Cap on the steps of one inner CVI run.
    resolution : bool
        End a phase at a trial point whose first-order change from the phase's best point is below its ``ftol``
        relative (module docstring, "Resolution"; default True), in the phases after the coarse one (the coarse
        phase ends on its own ``ftol``; stopping it there too left more work to the fine phase on the tuning sets).
        Decided on the tuning half of ``benchmarks/classification_heldout.py``'s families
        (``benchmarks/classification_resolution.py``, ``benchmarks/results/classification_resolution_h59b.md``):
        outer + inner steps + evaluations 0.80 of the rule without it on the multi-class sets (K = 3-6,
        N = 100-300; 0.57-1.00 per set, 11-18 evaluations instead of 18-29 at K > 3), 0.98 on the binary ones
        (N = 500; 0.94-1.00), no set more; objectives within 6e-5 (2e-7 relative), test log loss equal to 4 digits.
    fine_fixed : bool
        Whether the fine phases follow the coarse one when the bound's rule is the fixed quasi-Monte Carlo one
        (softmax with K > 3 classes, ``CVI.elbo_method == "fixed"``). Default False: the coarse phase is the last
        (``coarse=True`` only). There the gradient's floor (module docstring, "Resolution") is at or above the coarse
        phase's ``gtol``, so the coarse phase already ends where the gradient stops meaning anything; on the tuning
        half (``benchmarks/results/classification_resolution_h59b_fine.md``: ``mc_clf``, K = 4, 6, N = 100, 300)
        the fine phases then raised the objective by at most 5e-5 (3e-7 relative), moved theta by at most 3e-3
        and left the test log loss equal to 4 digits, for 6-32% of the fit's steps and evaluations (23% in all).
    between_runs : bool
        A CVI run of the engine (its rule, step and ``tol``) between two phases (default True). False: with a
        full-batch engine of deterministic expectations the next phase starts from the sites the last one ended
        with, whose first evaluation converges them at the same theta with the inner runs' rule and step. Measured
        on the tuning half (``benchmarks/results/classification_resolution_h59b_between.md``): work 0.99 of the
        default's on the binary sets and 1.01 on the multi-class ones (one set one evaluation more), so the run
        stays (the held-out ``mc_blobs`` K = 3, N = 300 spends 12 steps there).
    coarse_adaptive : float or None
        The coarse phase's inner tolerance at each trial point (default 1e-2): this fraction of the first-order change
        from the phase's best point so far, :math:`\lVert g\rVert\,\lVert\Delta\theta\rVert`, relative to
        :math:`\max(1, |F|)`, within :data:`COARSE` ``["inner_tol"]`` and ``["max_inner_tol"]`` (the latter at the
        phase's first point; :func:`gpvi.inference.cvi.inner.trial_tol`). Far from the optimum trial points differ by
        tens of nats and inner runs to 1e-6 spent 4-10 steps each there (2-3 at 1e-3); near it the tolerance is
        ``inner_tol``'s again. ``None``: ``COARSE["inner_tol"]`` at every point. Decided on the tuning half of
        ``benchmarks/classification_heldout.py``'s binary families at N = 2,000
        (``benchmarks/studies/results/typeii_trace_h59c.md``, ``benchmarks/results/classification_resolution_h59c_*``):
        0.1 took more evaluations on the two spirals (the tail's values too coarse for L-BFGS-B), 1e-3 saved less.
    theta_bounds : tuple of float
        Box on every log-hyperparameter during learning (default (-11.5, 11.5), i.e. 1e-5..1e5 on the natural
        scale of variances), relative to the inputs' scale for lengthscales: lengthscale^2 of input j within
        :math:`\operatorname{var}(x_j)\,[e^{-11.5}, e^{11.5}]` (:meth:`~gpvi.models.classification.LatentGP.theta_box`;
        the same box for standardised inputs, and a box that moves with the inputs' units).

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.inference.cvi import CVI, TypeII
    >>> from gpvi.models.multiclass import GPMulticlass
    >>> ds = gpvi.datasets.load_pima()
    >>> post = TypeII(CVI(progress_bar=False)).run(gpvi.GPClassification(ds.X_train, ds.y_train))
    >>> post.info["learn_hyperparameters"], post.converged, post.info["theta_phases"] >= 1
    (True, True, True)
    >>> post.info["objective"] == post.elbo + post.info["log_prior"]
    True
    >>> X = torch.linspace(-2, 2, 30, dtype=torch.float64).unsqueeze(-1)
    >>> y = (X[:, 0] > -0.7).long() + (X[:, 0] > 0.7).long()
    >>> TypeII(CVI(progress_bar=False)).run(GPMulticlass(X, y)).info["theta_phases"] >= 1
    True
    """

    def __init__(self, cvi: CVI | None = None, *, prior: Any = "default", tol: float = 1e-7,
                 gtol: float = 1e-5, max_iter: int = 100, inner_tol: float = 1e-9, inner_num_steps: int = 500,
                 theta_bounds: tuple[float, float] = (-11.5, 11.5), ftol: float = 1e-8,
                 inner_quadrature: Quadrature | str | None = "auto", coarse: bool = True, anderson: int = 5,
                 inner_beta: float | None = 0.75, resolution: bool = True, fine_fixed: bool = False,
                 between_runs: bool = True, coarse_adaptive: float | None = 1e-2) -> None:
        if cvi is not None and not isinstance(cvi, CVI):
            raise TypeError(f"cvi must be a gpvi.CVI engine; got {type(cvi).__name__}")
        self.cvi = cvi if cvi is not None else CVI()
        self.prior = check_prior_choice(prior)
        self.tol = check_positive(tol, "tol")
        self.gtol = check_positive(gtol, "gtol")
        self.ftol = check_positive(ftol, "ftol")
        if not (inner_quadrature is None or isinstance(inner_quadrature, Quadrature) or inner_quadrature == "auto"):
            raise ValueError(f"inner_quadrature must be 'auto', None or a Quadrature; got {inner_quadrature!r}")
        self.inner_quadrature = inner_quadrature
        self.max_iter = check_positive_int(max_iter, "max_iter")
        self.inner_tol = check_positive(inner_tol, "inner_tol")
        self.inner_num_steps = check_positive_int(inner_num_steps, "inner_num_steps")
        self.theta_bounds = check_interval(theta_bounds, "theta_bounds")
        self.coarse = check_bool(coarse, "coarse")
        self.anderson = check_nonnegative_int(anderson, "anderson")
        self.inner_beta = None if inner_beta is None else check_fraction(inner_beta, "inner_beta")
        self.resolution = check_bool(resolution, "resolution")
        self.fine_fixed = check_bool(fine_fixed, "fine_fixed")
        self.between_runs = check_bool(between_runs, "between_runs")
        self.coarse_adaptive = None if coarse_adaptive is None else check_positive(coarse_adaptive, "coarse_adaptive")

    def _prior(self, model: Any) -> Any:
        return resolve_prior(self.prior, model)

    def _inner_engine(self, model: Any) -> CVI:
        """The engine of the phases' inner runs and gradients: ``self.cvi`` with ``inner_quadrature``'s rule."""
        cvi = self.cvi
        cvi._configure(model)
        auto = self.inner_quadrature == "auto"
        if (self.inner_quadrature is None or cvi.elbo_method != "quadrature"
                or not isinstance(model.likelihood, Softmax) or (auto and cvi.user_quadrature is not None)):
            return cvi
        fast = copy.copy(cvi)
        fast.quadrature = (self.inner_quadrature if isinstance(self.inner_quadrature, Quadrature)
                           else inner_quadrature(model.num_classes))
        fast.user_quadrature = fast.quadrature          # kept by a later _configure (e.g. from posterior())
        return fast

    def _phase_engine(self, model: Any) -> CVI:
        """The engine of the phases' inner runs and of the coarse first run: :meth:`_inner_engine` with the step
        size ``inner_beta``."""
        cvi = self._inner_engine(model)
        if self.inner_beta is None or self.inner_beta == cvi.beta:
            return cvi
        fast = copy.copy(cvi)
        fast.beta = self.inner_beta
        return fast

    def __repr__(self) -> str:
        return (f"TypeII({self.cvi!r}, max_iter={self.max_iter}, inner_tol={self.inner_tol:g}, "
                f"inner_num_steps={self.inner_num_steps}, theta_bounds={self.theta_bounds}, "
                f"prior={prior_name(self.prior)!r}, tol={self.tol:g}, ftol={self.ftol:g}, coarse={self.coarse})")

    def settings(self) -> dict[str, Any]:
        return {"tol": self.tol, "gtol": self.gtol, "ftol": self.ftol, "max_iter": self.max_iter,
                "inner_tol": self.inner_tol, "inner_num_steps": self.inner_num_steps,
                "inner_quadrature": (self.inner_quadrature.spec() if isinstance(self.inner_quadrature, Quadrature)
                                     else self.inner_quadrature),
                "theta_bounds": list(self.theta_bounds), "coarse": dict(COARSE) if self.coarse else None,
                "anderson": self.anderson, "inner_beta": self.inner_beta, "resolution": self.resolution,
                "fine_fixed": self.fine_fixed, "between_runs": self.between_runs,
                "coarse_adaptive": self.coarse_adaptive,
                "prior": prior_name(self.prior)}

    def phase(self, model: Any, state: CVIState, prior: Any, *, coarse: bool = False,
              step: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, float, bool,
                                                   float | None, dict[str, Any] | None]:
        r"""L-BFGS-B on the profiled objective from ``state``; returns (theta, lam1, lam2, objective, objective at
        the start, stationary, step, final) (the start when nothing better was found); ``stationary``: L-BFGS-B met
        its own stop rule (projected gradient below ``gtol`` or relative change below ``ftol``) at the point
        returned. ``coarse``: :data:`COARSE`'s ``inner_tol`` and ``gtol``. ``lam1``, ``lam2``: where the point's
        inner run ended; ``final``: :func:`~gpvi.inference.cvi.deferred.final_posterior`'s ``end`` (or None).

        L-BFGS-B's first trial point is :math:`\theta_0 + g_0/c` for an objective divided by :math:`c`. Without
        ``step``, :math:`c = \max(1, \lVert g_0\rVert)` (a first move of length at most 1). With ``step``
        :math:`\gamma` (the returned one of an earlier phase), :math:`c = \max(1/\gamma, \lVert g_0\rVert)`: the
        first move is :math:`\gamma g_0` (at most 1 long), L-BFGS's own initial inverse-Hessian scale
        :math:`\gamma = -s^\top y / y^\top y` from the secant pair :math:`(s, y)` of the phase's two best points
        (differences of theta and of the gradient). A phase that starts near the optimum with a small gradient
        otherwise tried a move of :math:`\lVert g_0\rVert` (0.04 on digits, where the phase then moved 0.001):
        20 and 13 inner steps at the fine ``inner_tol`` to get there and back. ``gtol`` is divided by
        :math:`c` too, so the stop rule is unchanged."""
        cvi, dev, counters = self._phase_engine(model), state.theta.device, state.counters
        ftol = COARSE["ftol"] if coarse else self.ftol
        inner_tol = COARSE["inner_tol"] if coarse else self.inner_tol
        gtol = COARSE["gtol"] if coarse else self.gtol
        cur = {"lam1": state.lam1, "lam2": state.lam2}
        seen: dict[bytes, tuple[Any, ...]] = {}         # value, end sites, evaluated sites
        pairs: list[tuple[float, torch.Tensor, torch.Tensor]] = []         # (value, theta, gradient)
        work: list[Any] = []                                                # the inner runs' N x N buffers
        last: dict[bytes, Any] = {}                         # the last evaluation's pieces (valid until the next)

        def fn(theta: torch.Tensor) -> tuple[float, torch.Tensor]:
            theta = theta.detach()
            counters["theta_evaluations"] = counters.get("theta_evaluations", 0) + 1
            last.clear()
            got: dict[str, Any] = {}
            tol = trial_tol(pairs, theta, inner_tol, self.coarse_adaptive, COARSE["max_inner_tol"]) if (
                coarse and self.coarse_adaptive) else inner_tol
            try:
                inner, val, grad = profiled_objective(cvi, model, theta, cur["lam1"], cur["lam2"], counters,
                                                      tol=tol, max_steps=self.inner_num_steps,
                                                      anderson=self.anderson, prior=prior, work=work,
                                                      evaluated=got)
            except (sites.SiteFault, NotPSDError):
                return -math.inf, torch.zeros_like(theta)
            counters["inner_steps"] = counters.get("inner_steps", 0) + inner.t
            if grad is None or not math.isfinite(val) or not bool(torch.isfinite(grad).all()):
                return -math.inf, torch.zeros_like(theta)
            cur["lam1"], cur["lam2"] = inner.lam1, inner.lam2
            key = theta.cpu().numpy().tobytes()
            seen[key] = (val, inner.lam1, inner.lam2, got.get("lam1"), got.get("lam2"))
            last[key] = got
            pairs.append((val, theta, grad))
            return val, grad

        box = tuple(b.numpy() for b in model.theta_box(self.theta_bounds))
        x0 = np.clip(state.theta.detach().cpu().numpy(), *box)
        f0, g0 = fn(torch.as_tensor(x0, dtype=torch.float64, device=dev))
        start = seen.get(x0.tobytes())
        # L-BFGS-B's first trial point on a box is a full gradient step (x0 + g0): with |g0| ~ 30 on iris it
        # lands on the box (signal variance e^11.5) and the inner run there costs 100+ steps. Dividing the
        # objective by |g0| makes that step 1 in theta; gtol is divided too, so the stop rule is unchanged.
        scale = max(1.0, float(g0.norm())) if math.isfinite(f0) else 1.0
        if step is not None and math.isfinite(f0):
            scale = max(1.0 / step, float(g0.norm()))              # a first move of gamma |g0|, at most 1

        def scaled(theta: torch.Tensor) -> tuple[float, torch.Tensor]:
            key = theta.detach().cpu().numpy().tobytes()
            if key == x0.tobytes():
                return f0 / scale, g0 / scale
            if self.resolution and not coarse and pairs and unresolved(theta.detach()):
                raise _Resolved
            val, grad = fn(theta)
            return val / scale, grad / scale

        def unresolved(theta: torch.Tensor) -> bool:
            # the trial's first-order change from the best point is below ftol relative: no evaluation can tell it
            # from the objective's own error (module docstring, "Resolution")
            val, th, g = max(pairs, key=lambda p: p[0])
            return float(g.norm()) * float((theta.to(th) - th).norm()) <= ftol * max(1.0, abs(val))

        try:
            res = lbfgs_maximise(scaled, x0, bounds=box, max_iter=self.max_iter, gtol=gtol / scale,
                                 ftol=ftol, returns_grad=True, catch=(), ignore_warnings=(NumericalWarning,),
                                 device=dev)
            res_x, converged = res.x.cpu().numpy(), res.converged
        except _Resolved:
            counters["theta_resolution_stops"] = counters.get("theta_resolution_stops", 0) + 1
            res_x, converged = max(pairs, key=lambda p: p[0])[1].cpu().numpy(), True
        step_out = secant_step(pairs)
        best = seen.get(res_x.tobytes())
        stationary = converged and best is not None
        if best is None and seen:
            key = max(seen, key=lambda k: seen[k][0])
            best, res_x = seen[key], np.frombuffer(key, dtype=np.float64)

        def final(key: bytes) -> dict[str, Any] | None:        # pieces: the last evaluation's (buffers reused)
            e = seen[key]
            return None if e[3] is None else {"lam1": e[3], "lam2": e[4], "pieces": last.get(key)}

        if best is None or not math.isfinite(best[0]) or start is None or not best[0] > f0:
            if start is None:
                return state.theta, state.lam1, state.lam2, -math.inf, -math.inf, False, step_out, None
            return state.theta, start[1], start[2], f0, f0, stationary, step_out, final(x0.tobytes())
        return (torch.as_tensor(np.array(res_x), dtype=torch.float64, device=dev), best[1], best[2], best[0], f0,
                stationary, step_out, final(np.array(res_x).tobytes()))

    def run(self, model: Any, init: Any = None, *, state: Any = None,
            generator: torch.Generator | None = None, callback: Callable[..., None] | None = None
            ) -> LatentPosterior:
        r"""CVI runs and hyperparameter phases until a phase stops improving the objective; the final posterior.

        Parameters
        ----------
        model : LatentGP
            :class:`~gpvi.models.classification.GPClassification` or :class:`~gpvi.models.multiclass.GPMulticlass`.
        init, state, generator, callback
            As for :meth:`gpvi.CVI.run` (they go to the first CVI run; ``callback`` to every run).

        Returns
        -------
        LatentPosterior
            At the learned ``theta``; ``info`` adds ``learn_hyperparameters`` (True), ``type_ii`` (the settings),
            ``log_prior`` (:math:`\log p(\theta)`, 0 without a prior), ``objective`` (ELBO + ``log_prior``, what
            was maximised), ``theta_phases``, ``theta_evaluations``, ``inner_steps``, ``inner_backtracks``,
            ``engine`` (``"TypeII"``), ``time_s`` (the whole loop of this call; ``total_time_s`` adds the steps of
            the earlier calls that ``state`` records) and ``at_bound`` (``{name: "lower" | "upper"}`` for the components that ended
            on the box, each named in one :class:`~gpvi.exceptions.BoundWarning`; :func:`report_box`).
        """
        cvi = self.cvi
        cvi._configure(model)
        prior = self._prior(model)
        t0 = time.perf_counter()
        earlier = state.get("wall_time", 0.0) if isinstance(state, dict) else getattr(state, "wall_time", 0.0)
        coarse = self.coarse and state is None
        step = None
        first = cvi
        if coarse:
            plain = cvi.mode == "full" and cvi.estimator != "mc"     # a stochastic first run keeps its own step
            first = copy.copy(self._phase_engine(model) if plain else self._inner_engine(model))
            first.tol = max(cvi.tol, COARSE["cvi_tol"])
        post = run_deferred(first, model, init, state=state, generator=generator, callback=callback)
        straight = not self.between_runs and cvi.mode == "full" and cvi.estimator != "mc"
        carried = None                                         # a phase's end, taken straight to the next phase
        while True:
            st = carried if carried is not None else post.engine_state
            if post.info.get("interrupted") or not st.converged:
                break
            try:
                new = dataclasses.replace(st, counters=dict(st.counters))
                theta, lam1, lam2, obj_new, obj_old, stationary, step, end = self.phase(model, new, prior,
                                                                                        coarse=coarse, step=step)
            except KeyboardInterrupt:
                warn_interrupted("CVI type-II", st.t, cvi.num_steps)
                if carried is not None:
                    post = cvi.posterior(model, st, {"stopped_early": False}, warn=False)
                post = built(post)._with_info({"interrupted": True, "converged": False, "stopped_early": False},
                                           converged=False)
                break
            new.counters["theta_phases"] = new.counters.get("theta_phases", 0) + 1
            converged = (coarse and not self.fine_fixed and cvi.elbo_method == "fixed") or (
                not coarse and (stationary or obj_new - obj_old <= self.tol * max(1.0, abs(obj_old))))
            coarse = False
            new.lam1, new.lam2, new.theta, new.converged = lam1, lam2, theta, converged
            new.factor, new.since_refactor = None, 0           # single-site factors belong to the old theta
            steps.forget_kept(new)                             # and so does the accepted bound
            if converged or new.t >= cvi.num_steps:
                post = final_posterior(cvi, model, new, end, {"interrupted": False, "stopped_early": converged},
                                       warn=not converged, same_rule=self._inner_engine(model) is cvi)
                new.elbo = post.engine_state.elbo = post.elbo       # the bound posterior() evaluated: no second one
                break
            if straight:                                       # the next phase's first evaluation converges them
                new.converged, carried = True, new
                continue
            unscored = cvi.mode == "full" and not steps._centres(cvi, new)      # its first check: the same sites
            new.elbo = math.nan if unscored else steps.elbo_from_sites(cvi, model, lam1, lam2, theta)[0]
            post = run_deferred(cvi, model, state=new, callback=callback, unscored=unscored)
        post = built(post)
        lp = float(prior_log_prob(prior, post.theta)) if prior is not None else 0.0
        wall = time.perf_counter() - t0
        extra = {"engine": "TypeII", "learn_hyperparameters": True, "type_ii": self.settings(), "time_s": wall,
                 "total_time_s": float(earlier) + wall,
                 "log_prior": lp, "objective": post.elbo + lp,
                 "at_bound": report_box(model, post.theta, self.theta_bounds, prior)}
        for k in ("theta_phases", "theta_evaluations", "inner_steps", "inner_backtracks"):
            extra[k] = post.engine_state.counters.get(k, 0) if post.engine_state is not None else 0
        return post._with_info(extra)
