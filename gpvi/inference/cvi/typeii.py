r"""Type-II (MAP) estimation of the kernel hyperparameters on the CVI bound: an outer loop around CVI runs.

:class:`TypeII` maximises, over the kernel's log-hyperparameters :math:`\theta`, the **profiled objective**

.. math::

    F(\theta) = \max_q \mathcal L(\theta, q) + \log p(\theta),

the ELBO (Khan & Lin 2017, eq. 5) plus the log prior of :math:`\theta`. The default prior is the one of the
regression engines, independent :math:`\mathcal N(0, 10)` on every log-hyperparameter
(:func:`gpvi.models.priors.default_prior`); ``prior=None`` drops the term (plain type-II maximisation of the bound).
The prior is what keeps :math:`F` bounded above on (nearly) separable data: there the ELBO keeps growing as the
signal variance grows and the lengthscales of irrelevant inputs grow, and without it the maximiser runs to the box
``theta_bounds``. It alternates two things:

1. a CVI run (:meth:`gpvi.CVI.run`, through the driver) at the current :math:`\theta` until the sites converge (the
   engine's stop rule) or its step budget is spent;
2. a **hyperparameter phase**: L-BFGS-B (:func:`gpvi.numerics.lbfgs.lbfgs_maximise`) on :math:`F`. Each
   evaluation warm-starts full-batch CVI (quadrature gradients) from the current sites at the trial :math:`\theta`,
   runs it until the relative ELBO change is below ``inner_tol`` (:func:`converge_sites`), then returns the ELBO
   and its gradient with the converged sites held fixed (:func:`theta_objective`), plus :math:`\log p(\theta)` and
   its gradient.

The loop ends when a phase improves :math:`F` by less than ``tol * max(1, |F|)`` (the engine's ``tol``), when the
engine's ``num_steps`` (counted over all CVI runs, not the inner ones) are spent, or on Ctrl-C.

Inner runs are monotone
-----------------------
A full-batch CVI step with a constant step size need not increase the ELBO. When the likelihood saturates (large
signal variance, (nearly) separable classes) the damped map
:math:`\tilde\lambda \mapsto (1-\beta)\tilde\lambda + \beta g(\tilde\lambda)` has a Jacobian eigenvalue below
:math:`-1` at its fixed point for ``beta = 0.5``: the fixed point is unstable and the iterates settle on a
**2-cycle** (measured on iris setosa vs versicolor at signal variance 292: the ELBO alternates between -3.7276 and
-3.7288 with the sites' residual stuck at 0.015, while the fixed point has ELBO -3.7160). The relative-change test
then never passes, every inner run spends its whole ``inner_num_steps`` budget (38,000 inner steps, 44 s, for
N = 100), and the gradient returned is not that of :math:`F` (the sites are not at a fixed point). So
:func:`converge_sites` accepts a step only if the ELBO does not go down: an ELBO below the last accepted one
sends the sites back to the last accepted point and halves the step, and each accepted step lets the step grow
back by 1.5 (up to ``beta``). Any ELBO-monotone sequence of steps converges to the fixed point, which is the
unique maximiser for log-concave likelihoods, so the answer is the same; the 2-cycle is gone. The runs converge
linearly (the ELBO's gap shrinks by a roughly constant factor per step), so they are Anderson-accelerated
(``anderson``, :class:`gpvi.numerics.anderson.Anderson`): an extrapolation from the last few steps is kept only
if its ELBO is not below the last accepted one, else the plain step replaces it.

For fixed sites, :math:`\mathbf m = \tilde{\mathbf y} - S P\tilde{\mathbf y}` and
:math:`\operatorname{diag}V = s - s^2\operatorname{diag}P` with :math:`P = (K+S)^{-1}`, which gives the gradient in
closed form,

.. math::

    \frac{\partial\mathcal L}{\partial K} = \operatorname{sym}\Big(P\,(a\odot s)\,\boldsymbol\alpha^\top
      + P\operatorname{diag}(b\odot s^2)P + \tfrac12\boldsymbol\alpha\boldsymbol\alpha^\top - \tfrac12 P\Big),

with :math:`\boldsymbol\alpha = P\tilde{\mathbf y}`, :math:`a_n = \partial_m E_n - \tilde\lambda^{(1)}_n - 2\tilde\lambda^{(2)}_n m_n`,
:math:`b_n = \partial_v E_n - \tilde\lambda^{(2)}_n`; it is pushed through :math:`K(\theta)` by autograd. The
factorisation is the exact Cholesky of :func:`gpvi.linalg.cholesky_with_jitter`. At a CVI fixed point :math:`a = b = 0`,
so this is :math:`dF/d\theta` (envelope theorem). Each evaluation costs a few O(N^3) CVI steps (warm start) plus about
four O(N^3) operations for the gradient; a stochastic engine's phases use the same full-batch inner loop, because the
gradient in :math:`\theta` costs O(N^3) anyway. (Alternating a few L-BFGS steps with the sites held fixed and CVI
sweeps, variational-EM style, crept towards the optimum with thousands of evaluations on nearly separable data.)

Names: ``theta`` (kernel log-hyperparameters), ``lam1``, ``lam2`` (sites), ``s`` (pseudo-noise), ``P``, ``alpha``,
``a``, ``b`` as above.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...exceptions import BoundWarning, NotPSDError, NumericalWarning
from ...numerics.quadrature import Quadrature
from ...models.priors import check_prior_choice, prior_log_prob, prior_name, resolve_prior
from ...posteriors.latent import LatentPosterior
from ...validation import check_interval, check_nonnegative_int, check_positive, check_positive_int
from ...numerics.anderson import Anderson
from ...numerics.lbfgs import box_message, ends_on_box, lbfgs_maximise
from ..progress import warn_interrupted
from ...numerics import sites
from . import steps
from .engine import CVI
from .state import CVIState

__all__ = ["TypeII", "theta_objective", "converge_sites"]


def theta_objective(model: Any, lam1: torch.Tensor, lam2: torch.Tensor, theta: torch.Tensor,
                    quadrature: Quadrature | None = None) -> tuple[float, torch.Tensor | None]:
    r"""The ELBO at ``theta`` with the sites held fixed, and its gradient in ``theta`` (closed form in :math:`K`).

    Returns ``(-inf, None)`` when :math:`K + S` cannot be factorised or the ELBO is not finite.
    """
    quadrature = quadrature if quadrature is not None else Quadrature()
    th = theta.detach().clone().requires_grad_(True)
    K = model.kernel_matrix(th)
    Kd = K.detach()
    ytilde, s = sites.pseudo_data(lam1, lam2)
    try:
        L, _ = sites.site_factor(Kd, s, th.detach())
    except NotPSDError:
        return -math.inf, None
    m, v, alpha = sites.marginals(Kd, L, ytilde)
    ex = model.site_expectations(m, v, quadrature=quadrature)
    val = sites.site_elbo(ex.value.sum(), lam1, lam2, m, v, L, alpha)
    if not bool(torch.isfinite(val)):
        return -math.inf, None
    G = sites.kernel_gradient(L, lam1, lam2, m, alpha, ex.dm, ex.dv)
    (grad,) = torch.autograd.grad(K, th, grad_outputs=G)
    return float(val), grad.detach()


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


def converge_sites(cvi: CVI, model: Any, theta: torch.Tensor, lam1: torch.Tensor, lam2: torch.Tensor,
                   counters: dict[str, float], *, tol: float, max_steps: int, anderson: int = 0) -> CVIState:
    r"""Full-batch quadrature CVI at ``theta`` from the given sites until the relative ELBO change is below ``tol``.

    The steps are kept **monotone in the ELBO** (see the module docstring): a step whose next ELBO is lower than
    the last accepted one by more than ``tol * max(1, |ELBO|)`` is undone -- the sites go back to the last accepted
    point and the step size :math:`\beta_t` is halved -- and each accepted step multiplies :math:`\beta_t` by 1.5,
    up to the engine's ``beta``. Every step (undone ones too) counts towards ``max_steps``.

    Site counters accumulate into ``counters`` (``inner_backtracks`` counts the undone steps); returns the state
    after the last step (its ``t`` = steps taken).
    """
    K = model.kernel_matrix(theta)
    inner = CVIState(lam1, lam2, theta, _NO_DRAWS, initialised=True)
    inner.counters = counters
    return monotone_run(inner, lambda st: steps.full_step(cvi, model, st, K, None, method="quadrature")["elbo"],
                        tol=tol, max_steps=max_steps, anderson=anderson, weights=model.weights)


def monotone_run(inner: Any, step: Callable[[Any], float], *, tol: float, max_steps: int, anderson: int = 0,
                 weights: torch.Tensor | None = None) -> Any:
    r"""The ELBO-monotone loop of :func:`converge_sites` (binary) and
    :func:`gpvi.inference.cvi.multiclass_typeii.converge_sites` (multi-class).

    ``step(inner)`` evaluates the bound of ``inner``'s sites, then updates them in place and returns that bound.
    A step whose bound is lower than the last accepted one is undone (the sites go back to the last accepted
    point, ``inner.beta_scale`` halves, ``inner.counters["inner_backtracks"]`` counts it); each accepted step
    multiplies ``beta_scale`` by 1.5, up to 1. Ends when the relative change is at most ``tol`` or after
    ``max_steps`` steps (undone ones count); returns ``inner``.

    ``anderson`` > 0: Anderson acceleration with that memory (:class:`gpvi.numerics.anderson.Anderson`) of the
    damped CVI map :math:`G`: after an accepted step the next sites are the extrapolation of the last
    ``anderson + 1`` pairs :math:`(x, G(x))` of accepted sites (flattened :math:`\tilde\lambda_1, \tilde\lambda_2`)
    instead of :math:`G(x)`, when it keeps every :math:`\tilde\lambda_2 < 0`. The bound still never goes down: an
    extrapolation whose bound is below the last accepted one is replaced by :math:`G` of the accepted sites (kept
    from that step; no halving, no step lost beyond the one that evaluated it) and the history starts again; a
    plain step that goes down is undone as above. The run ends at :math:`G` of its last accepted sites, as without
    acceleration. ``inner.counters["inner_extrapolations_rejected"]`` counts the replaced extrapolations.

    ``weights`` (the model's likelihood weights :math:`w_n`, shape ``(N,)``): Anderson's least squares measure the
    sites of row :math:`n` scaled by :math:`w_n^{-1/2}`, so that a row of weight :math:`w_n` (site
    :math:`w_n\tilde\lambda`) counts as :math:`w_n` repeated rows (sites :math:`\tilde\lambda` each) do; rows of
    weight 0 (empty sites) take the plain step. An integer weight then gives the extrapolations, and so the run, of
    the repeated rows.
    """
    counters = inner.counters
    prev = math.nan                       # the ELBO of the last accepted sites ...
    keep = (inner.lam1, inner.lam2)       # ... and those sites
    plain = None                          # G(keep): where a rejected extrapolation goes instead
    redo = False
    extrapolated = False                  # the current sites are an extrapolation, not G of accepted sites
    acc = Anderson(anderson) if anderson > 0 else None
    scale = None                          # per flattened site: w_n^(-1/2), 0 for weight 0
    if acc is not None and weights is not None:
        w = weights.to(inner.lam1).reshape(-1, *([1] * (inner.lam1.dim() - 1)))
        d = torch.where(w > 0, w.rsqrt(), torch.zeros_like(w))
        scale = torch.cat([d.expand_as(inner.lam1).reshape(-1), d.expand_as(inner.lam2).reshape(-1)])
    for _ in range(max_steps):
        here = (inner.lam1, inner.lam2)
        elbo = step(inner)
        if redo:                          # the ELBO of the restored sites is prev: nothing learned yet
            redo = False
            continue
        if math.isfinite(prev):
            if abs(elbo - prev) <= tol * max(1.0, abs(elbo)):
                if extrapolated and elbo < prev:   # end at G of accepted sites, as a plain run does
                    inner.lam1, inner.lam2 = plain
                break
            if elbo < prev:
                if extrapolated:          # the extrapolation went down: take the plain step instead
                    inner.lam1, inner.lam2 = plain
                    extrapolated = False
                    acc.clear()
                    counters["inner_extrapolations_rejected"] = counters.get("inner_extrapolations_rejected", 0) + 1
                    continue
                inner.lam1, inner.lam2 = keep  # the last step went down: undo it, halve the step
                inner.beta_scale *= 0.5
                counters["inner_backtracks"] = counters.get("inner_backtracks", 0) + 1
                redo = True
                if acc is not None:
                    acc.clear()
                continue
        prev, keep = elbo, here
        inner.beta_scale = min(1.0, 1.5 * inner.beta_scale)
        extrapolated = False
        if acc is not None:
            plain = (inner.lam1, inner.lam2)
            x = torch.cat([here[0].reshape(-1), here[1].reshape(-1)])
            gx = torch.cat([plain[0].reshape(-1), plain[1].reshape(-1)])
            if scale is None:
                nxt = acc.step(x, gx)
            else:
                nxt = torch.where(scale > 0, acc.step(x * scale, gx * scale) / scale, gx)
            n1, n2 = nxt[:here[0].numel()].view_as(here[0]), nxt[here[0].numel():].view_as(here[1])
            if len(acc.r) > 1 and bool(torch.isfinite(nxt).all()) and bool((n2 < 0).all()):
                inner.lam1, inner.lam2 = n1, n2
                extrapolated = True
    return inner


_NO_DRAWS = torch.Generator()
"""The inner runs draw nothing (quadrature gradients); their states carry this generator, never used."""


class TypeII:
    r"""Type-II (MAP) estimation of the kernel hyperparameters on the CVI bound (see the module docstring).

    Maximises :math:`F(\theta) = \max_q \mathcal L(\theta, q) + \log p(\theta)`: the ELBO plus the log prior of
    the kernel log-hyperparameters (with ``prior=None``, the ELBO alone).

    Parameters
    ----------
    cvi : CVI, optional
        The engine of the CVI runs (default ``CVI()``); its ``tol`` also decides when the phases have converged,
        its ``num_steps`` caps the steps of all runs together, its ``beta``, ``beta_schedule``, ``invalid`` and
        ``quadrature`` are used by the inner runs too.
    max_iter : int
        L-BFGS-B iterations per hyperparameter phase.
    inner_tol : float
        Convergence tolerance (relative ELBO change) of the inner CVI runs of a phase.
    inner_num_steps : int
        Cap on the steps of one inner CVI run.
    anderson : int
        Memory of the Anderson acceleration of the inner runs (default 5; 0: plain damped steps):
        :func:`monotone_run`, each extrapolation kept only if the ELBO does not go down. Same fixed point and stop
        rule, about half the inner steps (``benchmarks/results/classifier_speed.md``).
    ftol : float
        L-BFGS-B's tolerance on the relative change of the objective between its iterations (default 1e-8, ten
        times ``inner_tol``, as :class:`~gpvi.inference.cvi.multiclass_typeii.MulticlassTypeII`'s). Runs to
        ``inner_tol`` reproduce the profiled objective only to about that, so a smaller tolerance compares noise
        (L-BFGS-B then spends evaluations at the same theta).
    theta_bounds : tuple of float
        Box on every log-hyperparameter during learning (default (-11.5, 11.5), i.e. 1e-5..1e5 on the natural
        scale of variances), relative to the inputs' scale for lengthscales: lengthscale^2 of input j within
        :math:`\operatorname{var}(x_j)\,[e^{-11.5}, e^{11.5}]` (:meth:`~gpvi.models.classification.LatentGP.theta_box`;
        the same box for standardised inputs, and a box that moves with the inputs' units).
    prior : "default", "scaled", torch.distributions.Distribution or None
        Prior :math:`p(\theta)` on the kernel log-hyperparameters, added to the objective. ``"default"``:
        independent :math:`\mathcal N(0, 10)` on each (:func:`gpvi.models.priors.default_prior`, the regression
        engines' default); ``"scaled"``: the same variance, centred at the model's data-scaled start
        ``model.initial_theta()`` (lengthscale^2 = d var(x_j), signal variance 1;
        :func:`gpvi.models.priors.resolve_prior`); any object with ``log_prob`` on a ``(D,)`` vector; ``None``: no
        prior (maximise the ELBO).

    Examples
    --------
    >>> import gpvi
    >>> from gpvi.inference.cvi import CVI, TypeII
    >>> ds = gpvi.datasets.load_pima()
    >>> model = gpvi.GPClassification(ds.X_train, ds.y_train)
    >>> post = TypeII(CVI(progress_bar=False)).run(model)
    >>> post.info["learn_hyperparameters"], post.converged, post.info["theta_phases"] >= 1
    (True, True, True)
    >>> post.info["objective"] == post.elbo + post.info["log_prior"]
    True
    """

    def __init__(self, cvi: CVI | None = None, *, max_iter: int = 100, inner_tol: float = 1e-9,
                 inner_num_steps: int = 500, theta_bounds: tuple[float, float] = (-11.5, 11.5),
                 prior: Any = "default", anderson: int = 5, ftol: float = 1e-8) -> None:
        if cvi is not None and not isinstance(cvi, CVI):
            raise TypeError(f"cvi must be a gpvi.CVI engine; got {type(cvi).__name__}")
        self.cvi = cvi if cvi is not None else CVI()
        self.max_iter = check_positive_int(max_iter, "max_iter")
        self.inner_tol = check_positive(inner_tol, "inner_tol")
        self.inner_num_steps = check_positive_int(inner_num_steps, "inner_num_steps")
        self.theta_bounds = check_interval(theta_bounds, "theta_bounds")
        self.ftol = check_positive(ftol, "ftol")
        self.prior = check_prior_choice(prior)
        self.anderson = check_nonnegative_int(anderson, "anderson")

    def _prior_for(self, model: Any) -> Any:
        """The prior object for ``model``'s theta (``None`` for no prior); a user prior is checked on a (D,) theta."""
        return resolve_prior(self.prior, model)

    def __repr__(self) -> str:
        return (f"TypeII({self.cvi!r}, max_iter={self.max_iter}, inner_tol={self.inner_tol:g}, "
                f"inner_num_steps={self.inner_num_steps}, theta_bounds={self.theta_bounds}, "
                f"prior={prior_name(self.prior)!r}, ftol={self.ftol:g})")

    def settings(self) -> dict[str, Any]:
        return {"max_iter": self.max_iter, "inner_tol": self.inner_tol, "inner_num_steps": self.inner_num_steps,
                "theta_bounds": list(self.theta_bounds), "prior": prior_name(self.prior), "anderson": self.anderson,
                "ftol": self.ftol}

    # ------------------------------------------------------------------ one hyperparameter phase
    def phase(self, model: Any, state: CVIState
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, float, float]:
        r"""L-BFGS-B on the profiled objective :math:`F` from ``state`` (its sites converged at its theta).

        Counts ``theta_evaluations`` and ``inner_steps`` in ``state.counters`` (nothing else in ``state`` changes).

        Returns
        -------
        (theta, lam1, lam2, elbo, objective, objective_start)
            The best point found, its re-converged sites, its profiled ELBO and :math:`F` (ELBO + log prior), and
            :math:`F` at the (clipped) starting theta; the starting point and its re-converged sites when no better
            point was found.
        """
        cvi = self.cvi
        dev = state.theta.device
        counters = state.counters
        cur = {"lam1": state.lam1, "lam2": state.lam2}
        seen: dict[bytes, tuple[float, torch.Tensor, torch.Tensor, float]] = {}
        prior = self._prior_for(model)

        def fn(theta: torch.Tensor) -> tuple[float, torch.Tensor]:
            theta = theta.detach()
            counters["theta_evaluations"] = counters.get("theta_evaluations", 0) + 1
            try:
                inner = converge_sites(cvi, model, theta, cur["lam1"], cur["lam2"], counters,
                                       tol=self.inner_tol, max_steps=self.inner_num_steps, anderson=self.anderson)
            except (sites.SiteFault, NotPSDError):
                return -math.inf, torch.zeros_like(theta)
            counters["inner_steps"] = counters.get("inner_steps", 0) + inner.t
            val, grad = theta_objective(model, inner.lam1, inner.lam2, theta, cvi.quadrature)
            if grad is None or not math.isfinite(val) or not bool(torch.isfinite(grad).all()):
                return -math.inf, torch.zeros_like(theta)
            elbo = val
            if prior is not None:
                th = theta.clone().requires_grad_(True)
                lp = prior_log_prob(prior, th)
                (glp,) = torch.autograd.grad(lp, th)
                val, grad = val + float(lp.detach()), grad + glp.detach()
            cur["lam1"], cur["lam2"] = inner.lam1, inner.lam2
            seen[theta.cpu().numpy().tobytes()] = (val, inner.lam1, inner.lam2, elbo)
            return val, grad

        box = tuple(b.numpy() for b in model.theta_box(self.theta_bounds))
        x0 = np.clip(state.theta.detach().cpu().numpy(), *box)
        f0 = fn(torch.as_tensor(x0, dtype=torch.float64, device=dev))[0]
        start = seen.get(x0.tobytes())
        res = lbfgs_maximise(fn, x0, bounds=box, max_iter=self.max_iter, gtol=1e-8, ftol=self.ftol,
                             returns_grad=True, catch=(), ignore_warnings=(NumericalWarning,), device=dev)
        res_x = res.x.cpu().numpy()
        best = seen.get(res_x.tobytes())
        if best is None and seen:
            key = max(seen, key=lambda k: seen[k][0])
            best, res_x = seen[key], np.frombuffer(key, dtype=np.float64)
        if best is None or not math.isfinite(best[0]) or start is None or not best[0] > f0:
            if start is None:
                f = state.elbo + self.log_prior(model, state.theta)
                return state.theta, state.lam1, state.lam2, state.elbo, f, f
            return state.theta, start[1], start[2], start[3], f0, f0
        return (torch.as_tensor(np.array(res_x), dtype=torch.float64, device=dev), best[1], best[2], best[3],
                best[0], f0)

    def log_prior(self, model: Any, theta: torch.Tensor) -> float:
        r""":math:`\log p(\theta)` under this loop's prior (0 with ``prior=None``)."""
        prior = self._prior_for(model)
        return 0.0 if prior is None else float(prior_log_prob(prior, theta.detach()))

    def _after_phase(self, model: Any, state: CVIState) -> tuple[CVIState, bool]:
        """A new state after a phase from ``state`` (never changed: it is a posterior's private copy)."""
        new = dataclasses.replace(state, counters=dict(state.counters))
        theta, lam1, lam2, elbo_new, f_new, f_old = self.phase(model, new)
        new.counters["theta_phases"] = new.counters.get("theta_phases", 0) + 1
        converged = f_new - f_old <= self.cvi.tol * max(1.0, abs(f_old))
        new.lam1, new.lam2, new.elbo, new.converged = lam1, lam2, elbo_new, converged
        if not torch.equal(theta, new.theta):
            new.theta = theta
        if new.factor is not None:
            steps.refactor(new, model.kernel_matrix(new.theta), measure=False)
        return new, converged

    # ------------------------------------------------------------------ the loop
    def run(self, model: Any, init: Any = None, *, state: CVIState | dict[str, Any] | None = None,
            generator: torch.Generator | None = None,
            callback: Callable[[CVIState, dict[str, Any]], None] | None = None) -> LatentPosterior:
        r"""CVI runs and hyperparameter phases until a phase stops improving the objective; the final posterior.

        Parameters
        ----------
        model : LatentGP
        init, state, generator, callback
            As for :meth:`gpvi.CVI.run` (they go to the first CVI run; ``callback`` to every run).

        Returns
        -------
        LatentPosterior
            At the learned ``theta``; ``info`` adds ``learn_hyperparameters`` (True), ``type_ii`` (the settings),
            ``log_prior`` (:math:`\log p(\theta)`, 0 without a prior), ``objective`` (ELBO + ``log_prior``, what
            was maximised), ``theta_phases``, ``theta_evaluations``, ``inner_steps``, ``inner_backtracks``,
            ``time_s`` (the whole loop) and ``at_bound`` (``{name: "lower" | "upper"}`` for the components that ended
            on the box, each named in one :class:`~gpvi.exceptions.BoundWarning`; :func:`report_box`).
        """
        cvi = self.cvi
        model = cvi._configure(model)
        t0 = time.perf_counter()
        post = cvi.run(model, init, state=state, generator=generator, callback=callback)
        while True:
            st = post.engine_state
            if post.info.get("interrupted") or not st.converged:
                break                                   # Ctrl-C, or the budget ended a run (the engine warned)
            try:
                new, converged = self._after_phase(model, st)
            except KeyboardInterrupt:
                warn_interrupted("CVI type-II", st.t, cvi.num_steps)
                post = post._with_info({"interrupted": True, "converged": False, "stopped_early": False},
                                    converged=False)
                break
            if converged or new.t >= cvi.num_steps:
                post = cvi.posterior(model, new, {"interrupted": False, "stopped_early": converged},
                                     warn=not converged)
                break
            post = cvi.run(model, state=new, callback=callback)
        log_prior = self.log_prior(model, post.theta)
        extra = {"learn_hyperparameters": True, "type_ii": self.settings(), "time_s": time.perf_counter() - t0,
                 "log_prior": log_prior, "objective": post.elbo + log_prior,
                 "at_bound": report_box(model, post.theta, self.theta_bounds, self.prior)}
        for k in ("theta_phases", "theta_evaluations", "inner_steps", "inner_backtracks"):
            extra[k] = post.engine_state.counters.get(k, 0) if post.engine_state is not None else 0
        return post._with_info(extra)
