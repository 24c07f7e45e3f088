r"""Doubly stochastic variational inference (Titsias & Lázaro-Gredilla, ICML 2014): Algorithm 1.

The variational family is the location-scale transform of a standard distribution :math:`\phi` (paper eq. 1)

.. math::

    \theta = C z + \mu,\quad z \sim \phi,\qquad q(\theta\mid\mu, C) = \frac{1}{|C|}\,\phi\big(C^{-1}(\theta-\mu)\big),

with :math:`C` lower triangular with a strictly positive diagonal. It maximises the bound (eq. 4)

.. math::

    \mathcal F(\mu, C) = \mathbb E_{\phi(z)}[\log g(Cz + \mu)] + \sum_d \log C_{dd} + \mathcal H_\phi,

by stochastic gradient ascent with the reparametrised gradients (eq. 5-8): for draws
:math:`z_s \sim \phi`, :math:`\theta_s = Cz_s + \mu`, :math:`g_s = \nabla_\theta \log g(\theta_s)`,

.. math::

    \mu \leftarrow \mu + \rho_\mu\,\frac1S\sum_s g_s,\qquad
    C \leftarrow C + \rho_C\Big(\frac1S\sum_s \operatorname{tril}(g_s z_s^\top) + \Delta_C\Big),
    \quad \Delta_C = \operatorname{diag}(1/C_{11}, \dots, 1/C_{DD}),

(Algorithm 1, averaged over :math:`S` draws) and, for a diagonal scale :math:`C = \operatorname{diag}(c)`,
:math:`c_d \leftarrow c_d + \rho_C(\frac1S\sum_s g_{s,d}\, z_{s,d} + 1/c_d)` (eq. 9). The log joint is called
once per step on the whole ``(S, D)`` batch and differentiated by ``torch.autograd.grad`` of its sum.

Cost per step of Algorithm 1, excluding the log joint: :math:`O(SD^2)` for a full scale (the product :math:`Cz`
and the outer products), :math:`O(SD)` for a diagonal one; no matrix is ever inverted or factorised.

Monitoring and the stop rule: :mod:`~gpvi.inference.dsvi.convergence`. The update rules (:class:`SGD` = Algorithm
1, :class:`Natural` = the same gradients preconditioned by q's scale with a KL trust region, :class:`Adam`) are
option objects carrying their step sizes (:mod:`~gpvi.inference.dsvi.options`); their maths and what departs
from the paper is in :mod:`~gpvi.inference.dsvi.updates`.

GP hyperparameters (paper section 3.4): on an exact GP regression target the default ``optimizer="auto"`` runs
:class:`Natural` from the MAP/Laplace starts, stopped by the convergence rule (:class:`DSVI`, Notes); every other
target keeps Algorithm 1 (:class:`SGD`).

Data subsampling (the "doubly" of section 3.3): a target that implements the *minibatch protocol*
(``sample_minibatch(generator)`` and ``log_joint(theta, batch=...)``, e.g. :class:`gpvi.models.minibatch.MinibatchTarget`)
gets a fresh minibatch, drawn from the engine's generator, at every step.

Names in code: ``mu`` = :math:`\mu`; ``C`` = :math:`C` (``(D, D)`` lower triangular for ``scale="full"``,
the ``(D,)`` vector :math:`c` for ``scale="diag"``); ``z``, ``theta``, ``g`` as above; ``rho`` =
:math:`\rho_\mu`, ``rho * lr_scale`` = :math:`\rho_C`; ``S`` = ``num_draws``; ``base`` = :math:`\phi`.

The other modules of the package are listed in :mod:`gpvi.inference.dsvi`; the run loop is
:func:`gpvi.inference.driver.run`.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import torch

from ...models.target import as_target
from ...numerics.budget import MemoryBudget
from ...numerics.families import check_base, make_standard
from ...rng import check_seed, resolve_generator
from ...validation import (check_bool, check_choice, check_fraction, check_nonnegative_int,
                           check_positive, check_positive_int)
from .. import driver
from ..contract import FaultPolicy, RunReport, bound_draws, count_draws, resume_copy, skip_step
from ..init import Start, find_start, init_to_default, start_point
from .convergence import Convergence
from .gradient import estimate_gradient
from .options import OPTIMIZERS, RULES, Adam, BlockDiagonal, Natural, SGD, UpdateRule, as_rule
from .result import build_posterior, check_moments
from .result import estimate_bound as _estimate_bound
from .setup import auto_optimizer, initial_state, resumed_state
from .setup import block_mask as _block_mask
from .starts import map_laplace_starts, run_starts
from .state import DSVIState, EntropyTerm, GradientEstimate
from .updates import keep_diagonal_positive, polyak_update

__all__ = ["DSVI", "DSVIState", "GradientEstimate", "EntropyTerm", "SGD", "Natural", "Adam", "BlockDiagonal",
           "Convergence", "OPTIMIZERS"]


class DSVI:
    r"""Doubly stochastic variational inference (paper Algorithm 1) on any differentiable log joint.

    Parameters
    ----------
    scale : {"full", "diag"} or BlockDiagonal
        Full lower-triangular :math:`C` (:math:`D(D+1)/2` free entries, :math:`O(D^2)` per step), diagonal
        :math:`C = \operatorname{diag}(c)` (eq. 9, :math:`O(D)` per step), or a full :math:`C` whose entries
        linking different groups of parameters stay zero (:class:`BlockDiagonal`).
    base : "normal", ("t", df), sequence of univariate distributions, or a standard-distribution object
        The standard distribution :math:`\phi`: standard normal (default; q is Gaussian and the bound is the
        Gaussian bound eq. 10), a standard Student-t with ``df`` > 0 degrees of freedom (``("t", df)``), a product
        of univariate standard distributions (``torch.distributions`` objects with ``icdf``), or an object such
        as ``gpvi.numerics.families.StandardStudentT(D, df)``; see :func:`gpvi.numerics.families.make_standard`.
    num_draws : int
        S, draws of z per step, averaged (>= 1).
    num_steps : int
        Total number of steps T of the run (a resumed run continues up to T, not T more).
    optimizer : {"auto", "sgd", "natural", "adam"} or SGD, Natural, Adam
        The update rule with its step size :math:`\rho_0`, schedule and knobs (:mod:`~gpvi.inference.dsvi.options`):
        :class:`SGD` is Algorithm 1 exactly; :class:`Natural` preconditions the same gradients by q's scale under
        a KL trust region; :class:`Adam` feeds them to Adam. A name means the rule with its defaults (e.g. SGD's
        curvature-based :math:`\rho_0`). ``"auto"`` (default): ``Natural()`` when the target offers a cheap
        MAP/Laplace start, else ``SGD()`` (:meth:`resolve_optimizer`; recorded in ``info["optimizer"]`` and
        ``info["auto"]``).
    convergence : Convergence, optional
        The rolling bound window and the convergence rule, and whether it ends the run
        (:class:`~gpvi.inference.dsvi.convergence.Convergence`; default ``Convergence()``: W = 100 for
        :class:`Natural` and 200 otherwise, stopping for :class:`Natural` only).
    polyak : float or None
        Average :math:`(\mu, C)` over the last fraction ``polyak`` (in (0, 1]) of the ``num_steps`` steps and
        return the average (Polyak-Ruppert averaging; default 0.25). Not in the paper; it does not change the
        iteration, only what is reported, and removes most of the step-to-step noise of the final iterate.
        ``None``: return the final iterate (the paper's output), which is also what an interrupted run returns
        before the averaging window. A run ended by the convergence rule returns its converged-window average
        instead. ``info["returned"]`` says which.
    init_scale : "auto", float, (D,) or (D, D) array-like
        Initial C when ``init`` is not a Gaussian posterior: ``init_scale * I``, a diagonal, or a lower-triangular
        matrix. ``"auto"`` (default): for :class:`Natural` (and for ``init="laplace"``) the Laplace scale at the
        initial mean, :math:`\operatorname{chol}((-H)^{-1})` with H the Hessian of :math:`\log g` by central
        differences (2D gradient evaluations in batched calls), the diagonal :math:`1/\sqrt{-H_{dd}}` (0.1 where
        :math:`-H_{dd} \le 0`) if :math:`-H` is not positive definite, 0.1 I for D > 200 or minibatch targets;
        for :class:`SGD` and :class:`Adam`, 0.1 I (q starts narrow, which suits log-hyperparameters of GPs and
        standardised regression weights). ``info["init"]`` records what was done.
    faults : FaultPolicy, optional
        ``FaultPolicy(max_consecutive=20, max_resample=10)``: rounds of redrawing invalid draws per step, and the
        number of skipped steps in a row (no valid draw at all) that ends the run with
        :class:`~gpvi.exceptions.NumericalFaultError` carrying the last good state (the driver counts them).
    num_elbo_draws : int
        Draws for the final bound estimate ``elbo`` and its standard error (0: report the rolling average),
        evaluated in chunks that respect the run's memory budget (:class:`~gpvi.numerics.budget.MemoryBudget`).
    seed : int, optional
        Seed of the run's generator (default 0: runs are reproducible); ``run(..., generator=)`` overrides it.
    progress_bar : bool
        tqdm bar with the rolling bound in its postfix.

    Notes
    -----
    *The start.* A start where the log joint or its gradient is NaN/inf is refused at :meth:`init` with a
    ``ValueError`` naming the point (:func:`~gpvi.inference.init.check_start`).

    *Invalid draws.* When :math:`\log g(\theta_s)` or its gradient is NaN/±inf (e.g. a GP kernel matrix that
    fails Cholesky even with jitter: :meth:`gpvi.GPRegression.log_joint` returns -inf for such rows), those draws
    are redrawn up to ``faults.max_resample`` times (counted in ``info["resampled_draws"]``); draws still invalid
    are dropped (``dropped_draws``) and the gradient averages the valid ones, warning once per run. This is an
    unbiased estimate of the gradient of the bound for :math:`q` *restricted to the region where the log joint is
    valid*: if a noticeable fraction of q's mass is invalid the answer is biased, which the counters reveal. A step
    with no valid draw is skipped (``skipped_steps``, :class:`~gpvi.exceptions.NumericalWarning`).

    *Positivity of C.* A C update that would make any diagonal entry non-positive is never applied: the C step
    is scaled down so that no diagonal entry falls below half its current value (``c_shrinks``, recorded in
    ``info`` without a warning: a damped step is part of the iteration, not a fault), or dropped if
    that is impossible (``c_rejects``). The mean update is applied unchanged. (:class:`Natural` steps never need
    this: the KL trust region keeps every :math:`1 + \rho A_{dd}` positive.)

    **GP hyperparameter posterior** (paper section 3.4). ``DSVI(scale="full").run(model)`` on a
    :class:`gpvi.GPRegression` model (:math:`\theta` = log lengthscales², log signal and noise variances, prior
    N(0, 10) each by default; S = 4 draws of :math:`\theta` per step through one batched Cholesky) does, with
    every default: (1) the distinct MAP optima of 30 seeded L-BFGS restarts of ``gpvi.ML2(prior=True)`` (end points
    more than 0.1 apart in some component; at most 3) and (2) :math:`C_0` = the Laplace scale at each -- the init
    strategy ``init_to_laplace(init_to_map(30, seed=seed, max_starts=3, init_scale=(1, 2, 3)))``
    (:mod:`gpvi.inference.init`, :mod:`gpvi.inference.dsvi.starts`) that runs before the engine starts (pass
    ``init=`` to start elsewhere); (3) :class:`Natural` steps with
    :math:`\rho_t = 0.05/(1+t/200)^{0.6}`, trust region 0.1; (4) the convergence rule every 100 steps: once the
    bound stops changing by more than its Monte Carlo error (and q by 0.2 sd) at 3 checks, the run averages its
    windows until the estimated shortfall of the average's bound is at most 0.01 nats
    (:class:`~gpvi.inference.dsvi.convergence.Convergence`, ``gap_tol``) and returns that average; ``num_steps =
    20000`` is only a cap (then a ``ConvergenceWarning``); (5) a final bound estimate from 1000 draws; (6) with
    several optima, one run from each and the best final bound kept (``info["starts"]``,
    ``info["starts_agree"]``; usually every restart finds the same optimum and there is one run). Timings
    against NUTS are in ``benchmarks/results/dsvi_table5.md``, the cost of the finish and of the starts in
    ``benchmarks/results/dsvi_best_gaussian.md``. ``optimizer="sgd"`` runs the paper's Algorithm 1
    (from the same start with ``init="laplace"``, with no automatic stop). Where the posterior has skewed or
    two-mode marginals q, being Gaussian, is narrower than the posterior and centred on the main mode: it is the
    best Gaussian by the bound, not the Gaussian with the posterior's moments. ``q.predict(X_test,
    num_draws=200)`` is the mixture over :math:`\theta \sim q` of the GP predictives and ``q.summary()`` gives
    the marginals by name (example below).

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.inference.dsvi import DSVI, SGD
    >>> m = torch.full((3,), 2.0, dtype=torch.float64)
    >>> target = gpvi.Target(lambda th: -0.5 * ((th - m) ** 2).sum(-1), names=3)
    >>> q = DSVI(num_steps=3000, optimizer=SGD(lr=0.1), polyak=0.5, progress_bar=False, seed=0).run(target)
    >>> bool((q.mean - m).abs().max() < 0.1), bool((q.covariance - torch.eye(3)).abs().max() < 0.15)
    (True, True)

    GP hyperparameter posterior (Bodyfat without Density, D = 15):

    >>> ds = gpvi.datasets.load_bodyfat(seed=0, include_density=False)
    >>> model = gpvi.GPRegression(ds.X_train, ds.y_train)
    >>> q = DSVI(scale="full", seed=0, progress_bar=False).run(model)
    >>> q.info["optimizer"], q.info["init"]["scale"], q.info["converged"]
    ('natural', 'laplace', True)
    >>> pred = q.predict(ds.X_test, num_draws=200)
    >>> round(gpvi.metrics.smse(pred, ds.y_test), 2)
    0.32
    >>> q.summary().index[-2:]
    ['log_signal_var', 'log_noise_var']
    """

    name = "DSVI"
    analytic_term: Callable[..., Any] | None = None
    """The closed-form part of the bound when it is not :class:`EntropyTerm` (DSVI-ARD's engine sets it)."""

    def __init__(self, scale: str | BlockDiagonal = "full", base: Any = "normal", *, num_draws: int = 4,
                 num_steps: int = 20_000, optimizer: str | UpdateRule = "auto", convergence: Convergence | None = None,
                 polyak: float | None = 0.25, init_scale: Any = "auto", faults: FaultPolicy | None = None,
                 num_elbo_draws: int = 1000, seed: int | None = 0, progress_bar: bool = True) -> None:
        self.blocks: list[Any] | None = None
        if isinstance(scale, BlockDiagonal):
            scale, self.blocks = "full", scale.blocks
        self.scale = check_choice(scale, "scale", ("full", "diag"))
        self.base = check_base(base)
        self.num_draws = check_positive_int(num_draws, "num_draws")
        self.num_steps = check_positive_int(num_steps, "num_steps")
        self.optimizer = as_rule(optimizer)
        if convergence is not None and not isinstance(convergence, Convergence):
            raise TypeError(f"convergence must be a gpvi.inference.dsvi.Convergence; got {type(convergence).__name__}")
        self.convergence = Convergence() if convergence is None else convergence
        self.polyak = None if polyak is None else check_fraction(polyak, "polyak")
        if isinstance(init_scale, str):
            check_choice(init_scale, "init_scale", ("auto",))
        elif isinstance(init_scale, numbers.Real) and not isinstance(init_scale, bool):
            check_positive(init_scale, "init_scale")
        self.init_scale = init_scale
        self.faults = FaultPolicy.coerce(faults)
        self.num_elbo_draws = check_nonnegative_int(num_elbo_draws, "num_elbo_draws")
        self.seed = check_seed(seed)
        self.progress_bar = check_bool(progress_bar, "progress_bar")
        self._cache: dict[str, Any] = {}     # derived from settings only (base, term, schedule, block mask, rules)

    # ------------------------------------------------------------------ settings and what they resolve to
    def settings(self) -> dict[str, Any]:
        """The constructor settings as plain values (recorded in ``info["settings"]``)."""
        base = self.base if isinstance(self.base, str) else repr(self.base)
        opt = self.optimizer if isinstance(self.optimizer, str) else self.optimizer.settings()
        return {"scale": self.scale, "blocks": self.blocks, "base": base, "num_draws": self.num_draws,
                "num_steps": self.num_steps, "optimizer": opt, **self.convergence.settings(),
                "polyak": self.polyak,
                "init_scale": self.init_scale if isinstance(self.init_scale, (str, numbers.Real)) else "array",
                "max_resample": self.faults.max_resample, "max_consecutive": self.faults.max_consecutive,
                "num_elbo_draws": self.num_elbo_draws, "seed": self.seed}

    def make_base(self, dim: int) -> Any:
        r"""The standard distribution :math:`\phi` for dimension ``dim`` (built once per dimension, cached)."""
        cached = self._cache.get("base")
        if cached is None or cached[0] != dim:
            cached = self._cache["base"] = (dim, make_standard(self.base, dim))
        return cached[1]

    def term(self, base: Any) -> Callable[..., Any]:
        """The closed-form part of the bound: ``analytic_term`` or :class:`EntropyTerm` of ``base``."""
        if self.analytic_term is not None:
            return self.analytic_term
        term = self._cache.get("term")
        if term is None or term[0] is not base:
            term = self._cache["term"] = (base, EntropyTerm(base.entropy()))
        return term[1]

    def rule_for(self, optimizer: str) -> UpdateRule:
        """The update rule a run with the resolved ``optimizer`` name uses (the given rule, or its defaults)."""
        if not isinstance(self.optimizer, str):
            return self.optimizer
        rules = self._cache.setdefault("rules", {})
        if optimizer not in rules:
            rules[optimizer] = RULES[optimizer]()
        return rules[optimizer]

    def schedule_for(self, state: DSVIState) -> Any:
        r"""The step-size schedule of a run in ``state`` (its rule's, resolved at the state's :math:`\rho_0`)."""
        rule = self.rule_for(state.optimizer)
        if not isinstance(rule.schedule, str):
            return rule.schedule
        key = (state.rho0_mu, state.optimizer)
        cached = self._cache.get("schedule")
        if cached is None or cached[0] != key:
            cached = self._cache["schedule"] = (key, rule.make_schedule(state.rho0_mu, self.num_steps))
        return cached[1]

    def resolve_optimizer(self, target: Any) -> str:
        """The name of the update rule a run on ``target`` uses: the given rule's, or for ``"auto"`` the rule below.

        ``"natural"`` when the target offers a cheap MAP/Laplace start: it has ``log_marginal_likelihood``
        (the ML-II protocol of :class:`gpvi.ML2`, e.g. :class:`gpvi.GPRegression`), is not a minibatch target,
        has D <= 200, and the bound has no analytic term of its own (DSVI-ARD); ``"sgd"`` (Algorithm 1 exactly)
        for every other target. The choice and its reason are recorded in ``info["auto"]``.

        Examples
        --------
        >>> import torch, gpvi
        >>> X = torch.linspace(0, 1, 20, dtype=torch.float64).unsqueeze(-1)
        >>> gp = gpvi.GPRegression(X, torch.sin(6 * X[:, 0]))
        >>> DSVI().resolve_optimizer(gp), DSVI().resolve_optimizer(gpvi.Target(lambda t: -t.pow(2).sum(-1), names=2))
        ('natural', 'sgd')
        """
        return self._resolve(target)[0]

    def _resolve(self, target: Any) -> tuple[str, str]:
        if not isinstance(self.optimizer, str):
            return self.optimizer.name, "given"
        return auto_optimizer(as_target(target), self.analytic_term)

    def _block_mask(self, D: int) -> torch.Tensor | None:
        if self.blocks is None:
            return None
        mask = self._cache.get("mask")
        if mask is None or mask.shape[0] != D:
            mask = self._cache["mask"] = _block_mask(self.blocks, D)
        return mask

    # ------------------------------------------------------------------ the engine contract
    def default_init(self, target: Any) -> Callable[[Any], Start]:
        """For ``"natural"`` runs, the distinct MAP optima of ``MAP_RESTARTS`` seeded restarts spread by
        ``MAP_INIT_SCALE`` (at most ``MAX_STARTS``), each with its Laplace scale: ``init_to_laplace(init_to_map(
        MAP_RESTARTS, seed=seed, max_starts=MAX_STARTS, init_scale=MAP_INIT_SCALE))``; else
        :func:`init_to_default`."""
        if self.resolve_optimizer(target) == "natural":
            return map_laplace_starts(0 if self.seed is None else self.seed)
        return init_to_default()

    def init(self, target: Any, start: Any = None, generator: torch.Generator | None = None) -> DSVIState:
        r"""Initial state at ``start``: :math:`\mu_0`, :math:`C_0`, resolved step sizes and the run's generator.

        ``start`` is a :class:`~gpvi.inference.init.Start`, or anything ``run(init=...)`` accepts (resolved by
        :func:`~gpvi.inference.init.start_point`, default :meth:`default_init`); ``generator`` (default: a fresh
        one seeded with ``seed``) becomes the run's random stream. A start where the log joint or its gradient is
        not finite raises ``ValueError`` (:func:`~gpvi.inference.init.check_start`).
        """
        target = as_target(target)
        start = start_point(target, start, self.default_init(target), seed=self.seed)
        return initial_state(self, target, start, resolve_generator(self.seed, generator))

    def resume(self, target: Any, state: DSVIState | dict[str, Any]) -> DSVIState:
        """A checked copy of ``state`` (a :class:`DSVIState` or its ``state_dict``) to continue on ``target``."""
        return resumed_state(self, resume_copy(state, DSVIState, len(as_target(target).names)))

    def stop_rule(self) -> Convergence:
        """The convergence rule (:class:`~gpvi.inference.dsvi.convergence.Convergence`)."""
        return self.convergence

    def postfix(self, info: dict[str, Any]) -> dict[str, Any]:
        return {"bound": info.get("bound_avg", math.nan)}

    def result(self, target: Any, state: DSVIState, report: RunReport) -> Any:
        """The :class:`~gpvi.posteriors.gaussian.GaussianPosterior` of ``state`` (see :meth:`run`)."""
        return build_posterior(self, target, state, report)

    # ------------------------------------------------------------------ one step of Algorithm 1
    def estimate_gradient(self, target: Any, state: DSVIState, *, base: Any = None) -> GradientEstimate:
        r"""Draw S values of z and return the stochastic gradient of the bound at ``(state.mu, state.C)``.

        Uses (and advances) ``state.generator`` but changes nothing else: :math:`\hat\nabla_\mu =
        \frac1{S'}\sum_s g_s`, :math:`\hat\nabla_C = \frac1{S'}\sum_s\operatorname{tril}(g_s z_s^\top) + \Delta_C`
        (eq. 5-8) over the S' valid draws; invalid draws are redrawn up to ``faults.max_resample`` rounds.
        """
        return estimate_gradient(self, target, state, base)

    def step(self, target: Any, state: DSVIState) -> tuple[DSVIState, dict[str, Any]]:
        r"""One iteration of Algorithm 1 (or of the :class:`Natural` / :class:`Adam` rule): advance ``state`` in place.

        Returns the same state (``t`` + 1) and ``info``: ``t``, ``bound`` (instantaneous bound before the
        update), ``bound_avg``, ``rho``, ``num_valid``, ``resampled``, ``dropped``, ``skipped`` (no valid draw:
        nothing changed but ``t`` and the generator; the driver counts these), ``c_shrink``, ``converged``.

        Examples
        --------
        >>> import torch, gpvi
        >>> from gpvi.inference.init import init_to_value
        >>> target = gpvi.Target(lambda th: -0.5 * ((th - 3.0) ** 2).sum(-1), names=2)
        >>> engine = DSVI(optimizer=SGD(lr=0.2, schedule="constant"))
        >>> state = engine.init(target, init_to_value(torch.zeros(2))(target), torch.Generator().manual_seed(0))
        >>> for _ in range(200):
        ...     state, info = engine.step(target, state)
        >>> bool((state.mu - 3.0).abs().max() < 0.5), info["t"]
        (True, 200)
        """
        t = state.t
        rule = self.rule_for(state.optimizer)
        rho = float(self.schedule_for(state)(t))
        rho_C = rho * (state.rho0_C / state.rho0_mu) if state.rho0_mu > 0 else 0.0
        est = self.estimate_gradient(target, state)
        cnt = state.counters
        info: dict[str, Any] = {"rho": rho, "num_valid": est.num_valid, "resampled": est.resampled,
                                "dropped": est.dropped, "skipped": False, "c_shrink": 1.0}
        count_draws(state, "DSVI", "log joint", resampled=est.resampled, dropped=est.dropped,
                    calls=est.log_joint_calls)
        # one reduction checks both gradients (a sum of finite entries that overflows also counts as a fault)
        if est.num_valid == 0 or not math.isfinite(float(est.grad_mu.sum() + est.grad_C.sum())):
            skip_step(state, info, "DSVI", "log joint and gradient", self.faults.max_resample)
            self.convergence.record(state, math.nan, rho, 0, info)
            return state, info
        diag = state.scale == "diag"
        d_mu, d_C = rule.propose(state, est, rho, rho_C, self._block_mask(state.dim), info)
        new_C = state.C
        if rho_C > 0:                 # never apply a C step that makes a diagonal entry <= 0
            d_C, info["c_shrink"] = keep_diagonal_positive(state.C, d_C, diag)
            if d_C is None:
                cnt["c_rejects"] += 1
            else:
                cnt["c_shrinks"] += info["c_shrink"] < 1.0
                new_C = state.C + d_C
        new_mu = state.mu + d_mu
        if rule.fixed_mean is not None:
            new_mu = torch.where(rule.fixed_mean, state.mu, new_mu)
        state.mu, state.C, state.t = new_mu, new_C, t + 1
        if self.polyak is not None and state.t > int(math.floor((1.0 - self.polyak) * self.num_steps)):
            polyak_update(state, new_mu, new_C)
        self.convergence.accumulate(state)
        self.convergence.record(state, est.bound, rho, est.num_valid, info)
        return state, info

    # ------------------------------------------------------------------ public estimate and run
    def estimate_bound(self, target: Any, mu: Any, C: Any, *, num_draws: int | None = None,
                       generator: torch.Generator | None = None, seed: int | None = None,
                       budget: MemoryBudget | None = None) -> tuple[float, float, int]:
        r"""Monte Carlo estimate of the bound :math:`\mathcal F(\mu, C)` (eq. 4) with its standard error.

        ``C`` is ``(D, D)`` lower triangular or the ``(D,)`` diagonal; ``num_draws`` defaults to
        ``num_elbo_draws``; draws are evaluated in chunks that respect ``budget``. Returns
        ``(estimate, standard_error, num_invalid)`` (invalid draws are left out of the average and counted).

        Examples
        --------
        >>> import math, torch, gpvi
        >>> lognormal = lambda th: -0.5 * (th ** 2).sum(-1) - math.log(2 * math.pi)     # normalised, D = 2
        >>> est, se, bad = DSVI().estimate_bound(gpvi.Target(lognormal, names=2), torch.zeros(2), torch.eye(2),
        ...                                      num_draws=4000)
        >>> abs(est) < 5 * se, bad                      # q = target: the bound is log Z = 0
        (True, 0)
        """
        n = bound_draws(num_draws, self.num_elbo_draws)
        target = as_target(target)
        mu, C = check_moments(target, mu, C)
        base = self.make_base(mu.shape[0])
        gen = resolve_generator(seed if seed is not None else 0, generator)
        est, se, bad, _ = _estimate_bound(target, base, self.term(base), mu, C, n, gen, budget or MemoryBudget())
        return est, se, bad

    def run(self, target: Any, init: Any = None, *, state: DSVIState | dict[str, Any] | None = None,
            generator: torch.Generator | None = None, callback: Callable[[DSVIState, dict[str, Any]], None] | None = None,
            budget: MemoryBudget | None = None) -> Any:
        r"""Run until the stop rule ends the run or ``num_steps`` steps are done; return the posterior.

        Several starts: when the start has :attr:`~gpvi.inference.init.Start.alternatives` (the default start of
        an exact GP target: the distinct MAP optima of several restarts), one run is made from each, in turn, and
        the posterior with the best final bound is returned (:func:`~gpvi.inference.dsvi.starts.run_starts`);
        ``info["starts"]`` records every start's theta, MAP value, final bound and its se, and
        ``info["starts_agree"]`` whether the bounds agree within their Monte Carlo error. Ctrl-C during a later
        start keeps the finished runs (the best is returned, ``info["interrupted"]`` is True).

        The loop is :func:`gpvi.inference.driver.run`: ``init`` (None, "laplace", a point, a posterior or an init
        strategy from :mod:`gpvi.inference.init`) or ``state`` (a :class:`DSVIState` or its ``state_dict``, never
        changed: the run continues a copy up to ``num_steps`` total steps, bit for bit as an uninterrupted run),
        ``generator`` (overrides ``seed``), ``callback(state, info)`` after every step (raising
        ``KeyboardInterrupt`` stops the run like Ctrl-C), ``budget`` (memory of one batched evaluation).

        Returns
        -------
        GaussianPosterior
            ``mean``, ``scale_tril`` (the converged-window average, the Polyak average or the final iterate:
            ``info["returned"]``), ``elbo`` and ``elbo_se`` (``num_elbo_draws`` fresh draws at the returned
            :math:`(\mu, C)`), ``trace`` (``bound``, ``bound_avg``, ``rho``, ``num_valid`` per step), ``info``
            (a :class:`~gpvi.posteriors.info.RunInfo`: ``converged``, ``interrupted``, ``steps``, ``time_s``,
            ``total_time_s``, ``settings``, ``counters``; details ``lr_mu``, ``lr_C``, ``convergence``, ``init``
            with ``auto``, ``elbo_chunks``) and ``engine_state`` (a copy of the final
            :class:`DSVIState`).

        Raises
        ------
        NumericalFaultError
            ``faults.max_consecutive`` consecutive skipped steps; ``err.state`` is the last good state and
            ``err.partial`` the posterior built from it.

        Examples
        --------
        >>> import gpvi
        >>> ds = gpvi.datasets.load_pima()
        >>> model = gpvi.BayesianLogisticRegression(ds.X_train, ds.y_train)
        >>> q = DSVI(num_steps=2000, progress_bar=False).run(model)
        >>> q.mean.shape, q.info["steps"], q.trace["bound_avg"].shape
        (torch.Size([8]), 2000, torch.Size([2000]))
        """
        if state is not None:
            return driver.run(self, target, init, state=state, generator=generator, callback=callback, budget=budget)
        start = find_start(as_target(target), init, self.default_init(target), seed=self.seed)
        return run_starts(self, target, start, generator=generator, callback=callback, budget=budget)

    def __repr__(self) -> str:
        base = self.base if isinstance(self.base, (str, tuple)) else type(self.base).__name__
        scale = self.scale if self.blocks is None else BlockDiagonal(self.blocks)
        return (f"DSVI(scale={scale!r}, base={base!r}, num_draws={self.num_draws}, num_steps={self.num_steps}, "
                f"optimizer={self.optimizer!r})")

