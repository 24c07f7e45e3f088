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

Monitoring and the stop rule: :mod:`~gpvi.inference.dsvi.convergence`. The update rules (``"sgd"`` = Algorithm 1,
``"natural"`` = the same gradients preconditioned by q's scale with a KL trust region, ``"adam"``):
:mod:`~gpvi.inference.dsvi.updates`, whose docstring gives the maths and what departs from the paper.

GP hyperparameters (paper section 3.4). For an exact GP regression target (:class:`gpvi.GPRegression`), the
default ``optimizer="auto"`` resolves to ``"natural"`` started at the MAP/Laplace point, with
``stop_on_convergence``: the run stops when the convergence rule holds and returns the average of the windows
over which it held. Every other target keeps Algorithm 1 (``"sgd"``). ``info["optimizer"]`` and
``info["auto"]`` record what ``"auto"`` resolved to and why. See the "GP hyperparameter posterior" section of
:class:`DSVI`.

Data subsampling (the "doubly" of section 3.3): a target that implements the *minibatch protocol*
(``sample_minibatch(generator)`` and ``log_joint(theta, batch=...)``, e.g. :class:`gpvi.models.minibatch.MinibatchTarget`)
gets a fresh minibatch, drawn from the engine's generator, at every step.

Names in code: ``mu`` = :math:`\mu`; ``C`` = :math:`C` (``(D, D)`` lower triangular for ``scale="full"``,
the ``(D,)`` vector :math:`c` for ``scale="diag"``); ``z``, ``theta``, ``g`` as above; ``rho`` =
:math:`\rho_\mu`, ``rho * lr_scale`` = :math:`\rho_C`; ``S`` = ``num_draws``; ``base`` = :math:`\phi`.

Modules: :mod:`~gpvi.inference.dsvi.state` (the state), :mod:`~gpvi.inference.dsvi.updates` (update rules),
:mod:`~gpvi.inference.dsvi.convergence` (monitoring and stop rule), :mod:`~gpvi.inference.dsvi.result` (what is
returned, the final bound estimate); the run loop is :func:`gpvi.inference.driver.run`.
"""
from __future__ import annotations

import math
import numbers
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...exceptions import NumericalWarning
from ...models.target import as_target
from ...validation import (as_float_tensor, check_bool, check_choice, check_fraction, check_nonnegative_int,
                           check_positive, check_positive_int)
from ...rng import check_seed, resolve_generator
from .. import driver
from ..budget import MemoryBudget
from ..derivatives import finite_difference_hessian, is_minibatch_target, log_joint_and_grad
from ..engine import FaultPolicy, RunReport
from ..families import make_standard
from ..init import LAPLACE_MAX_DIM, Start, init_to_default, init_to_laplace, init_to_map, laplace_approximation, resolve_init
from ..schedules import SCHEDULES, make_schedule
from .convergence import Convergence
from .result import build_posterior
from .result import estimate_bound as _estimate_bound
from .state import DSVIState, EntropyTerm, GradientEstimate
from .gradient import estimate_gradient
from .setup import block_mask as _block_mask
from .setup import curvature_rate as _curvature_rate
from .setup import initial_moments
from .updates import adam_step, keep_diagonal_positive, natural_step, polyak_update

__all__ = ["DSVI", "DSVIState", "GradientEstimate", "EntropyTerm", "laplace_approximation",
           "finite_difference_hessian"]

OPTIMIZERS = ("auto", "sgd", "natural", "adam")
NATURAL_LR = 0.05
"""Initial step size rho_0 of ``optimizer="natural"`` with ``lr="auto"`` (in units of q's own scale)."""
NATURAL_SCHEDULE = {"tau": 200.0, "kappa": 0.6}
"""Robbins-Monro options of ``optimizer="natural"`` with ``schedule="auto"``: rho_t = rho_0 / (1 + t/200)^0.6."""


class DSVI:
    r"""Doubly stochastic variational inference (paper Algorithm 1) on any differentiable log joint.

    Parameters
    ----------
    scale : {"full", "diag"}
        Full lower-triangular :math:`C` (:math:`D(D+1)/2` free entries, :math:`O(D^2)` per step) or diagonal
        :math:`C = \operatorname{diag}(c)` (eq. 9, :math:`O(D)` per step).
    base : {"normal", "t"}, sequence of univariate distributions, or a standard-distribution object
        The standard distribution :math:`\phi`: standard normal (default; q is Gaussian and the bound is the
        Gaussian bound eq. 10), independent standard Student-t components with ``df`` degrees of freedom, or a
        product of univariate standard distributions (``torch.distributions`` objects with ``icdf``), see
        :mod:`gpvi.inference.families`.
    df : float, optional
        Degrees of freedom :math:`\nu > 0` for ``base="t"`` (required there, rejected otherwise).
    num_draws : int
        S, draws of z per step, averaged (>= 1).
    num_steps : int
        Total number of steps T of the run (a resumed run continues up to T, not T more).
    lr : float or "auto"
        :math:`\rho_0` for :math:`\mu`. ``"auto"`` (default): for ``"natural"``, :math:`\rho_0 = 0.05` (steps are
        in units of q's own scale, so no problem-dependent rate is needed); for SGD, :math:`\rho_0 = 0.5 / \hat\lambda`, where
        :math:`\hat\lambda` is the largest curvature :math:`|\mathrm{eig}(\nabla^2\log g)|` at the initial mean,
        estimated by 20 power iterations with finite-difference Hessian-vector products (2 log-joint evaluations
        each, batched). This keeps the mean update stable whatever the scale of the problem; it is a heuristic
        of gpvi, not the paper's (the paper hand-picks :math:`\rho_0`, e.g. 0.05 / N for DSVI-ARD). For Adam,
        ``"auto"`` means 0.01. The resolved rates are in ``info["lr_mu"]``, ``info["lr_C"]``. With a minibatch
        target the gradient noise grows like :math:`\sqrt{N/M}`: keep ``"auto"`` for a fast transient but let
        the rate decay by about N / M over the run, e.g. ``schedule="robbins_monro",
        schedule_options={"kappa": 1.0, "tau": num_steps * M / N}``, and keep Polyak averaging on; a rate that
        stays large leaves C biased (the :math:`1/C_{dd}` term is non-linear in the noisy C).
    lr_scale : float, optional
        :math:`\rho_C / \rho_\mu`. Default: 0.1 for SGD (the paper's :math:`0.1\rho_t`), 1 for Adam and for
        ``"natural"`` (whose steps are already scale-free). ``0`` keeps C fixed at its initial value.
    schedule : {"auto", "decay", "robbins_monro", "constant"} or schedule object
        Step-size schedule (:mod:`gpvi.schedules`) applied to both rates. ``"auto"`` (default): ``"decay"`` for
        SGD and Adam, and for ``"natural"`` :math:`\rho_t = \rho_0/(1 + t/200)^{0.6}` (Robbins–Monro, independent of
        ``num_steps`` so that a run stopped by the convergence rule does not depend on it). ``"decay"`` is the
        paper's "multiply by 0.95 every k steps" with k = ``num_steps // 20``; ``"robbins_monro"`` is
        :math:`\rho_0/(1+t/\tau)^\kappa` (:math:`\tau` = ``num_steps / 10``, :math:`\kappa = 0.6`);
        ``"constant"`` keeps :math:`\rho_0`. A schedule object carries its own :math:`\rho_0` (then leave ``lr``
        at ``"auto"``).
    schedule_options : dict, optional
        Options of a named schedule (``tau``, ``kappa``, ``factor``, ``every``).
    optimizer : {"auto", "sgd", "natural", "adam"}
        ``"sgd"``: Algorithm 1 exactly. ``"natural"``: Algorithm 1's stochastic gradients preconditioned by q's
        scale, :math:`\mu \leftarrow \mu + \rho CC^\top\hat\nabla_\mu`,
        :math:`C \leftarrow C(I + \rho\operatorname{tril}(C^\top\hat\nabla_C))`, with a KL trust region (see the
        module docstring) — a departure from the paper with the same fixed points. ``"adam"``: the same stochastic
        gradients fed to Adam (Kingma & Ba 2015) with ``adam_betas`` and ``adam_eps`` — a departure from the paper
        (per-coordinate step sizes, no Robbins–Monro guarantee). ``"auto"`` (default): ``"natural"`` when the target
        offers a cheap MAP/Laplace start — it has ``log_marginal_likelihood`` (exact GP regression,
        :class:`gpvi.GPRegression`), is not a minibatch target, has D <= 200, and no ``analytic_term`` is set —
        and ``"sgd"`` otherwise (:meth:`resolve_optimizer`; the resolved rule is ``info["optimizer"]``).
    adam_betas : tuple of float
    adam_eps : float
    max_step_kl : float
        ``"natural"`` only: largest Gaussian KL divergence between q before and after one step (> 0, default 0.1);
        larger proposed steps are halved until they fit (``info["trust_clips"]`` counts them). At the default rate
        it binds only on rare outlying gradient estimates and during the first steps.
    window : int or "auto"
        Length W of the rolling-window average of the instantaneous bound, >= 1; the convergence rule is checked
        every W steps. ``"auto"`` (default): 200 as in the paper, 100 for ``"natural"`` (whose iterates move in
        units of q's scale, so 100 steps suffice to see drift).
    tol : float
        Convergence rule, bound part: successive window averages differ by at most
        ``tol * max(1, |avg|) + 2 * se`` (se = standard error of the difference, from the windows' variances).
    param_tol : float
        Convergence rule, parameter part: the window averages of :math:`\mu` and :math:`C` (over the W steps
        since the last check) moved by at most ``param_tol``: :math:`\max_d |\Delta\bar\mu_d| / \mathrm{sd}_d`
        and :math:`\max_{ij} |\Delta\bar C_{ij}| / \mathrm{sd}_i` (sd = marginal scales of q, the row norms of
        C). Averages over a window measure drift rather than the step-to-step noise of the iterates.
    patience : int
        The rule must hold at ``patience`` consecutive checks for ``converged`` to be True.
    stop_on_convergence : bool or "auto"
        Stop before ``num_steps`` once converged. A run stopped this way returns the average of
        :math:`(\mu, C)` over the last ``patience`` windows (the windows over which the rule held), not the final
        iterate. ``"auto"`` (default): True for ``"natural"``, False otherwise (always run ``num_steps``).
    polyak : float or None
        Average :math:`(\mu, C)` over the last fraction ``polyak`` (in (0, 1]) of the ``num_steps`` steps and
        return the average (Polyak–Ruppert averaging). Default 0.25: the last quarter of the run. Not in the
        paper; it does not change the iteration, only what is reported, and removes most of the step-to-step
        noise of the final iterate. ``None``: return the final iterate (the paper's output), which is also what
        an interrupted run returns before the averaging window. (A run stopped by the convergence rule returns
        its converged-window average instead, see ``stop_on_convergence``.) ``info["returned"]`` says which.
    fixed_mean_mask : array-like of bool, shape (D,), optional
        True where :math:`\mu_d` is held at its initial value (the slides' tip "some components of :math:`\mu`
        can be fixed at zero").
    blocks : sequence, optional
        Block-diagonal structure of C (``scale="full"`` only): a partition of ``range(D)`` into groups of
        indices, or a list of contiguous block sizes. Entries of C linking different groups stay zero.
    init_scale : "auto", float, (D,) or (D, D) array-like
        Initial C when ``init`` is not a Gaussian posterior: ``init_scale * I``, a diagonal, or a lower-triangular
        matrix. ``"auto"`` (default): for ``"natural"`` (and for ``init="laplace"``), the Laplace scale at the
        initial mean, :math:`\operatorname{chol}((-H)^{-1})` with H the Hessian of :math:`\log g` by central
        differences of the gradient (2D gradient evaluations in batched log-joint calls); if :math:`-H` is not
        positive definite, the diagonal :math:`1/\sqrt{-H_{dd}}` (0.1 where :math:`-H_{dd} \le 0`); for D > 200 or
        minibatch targets 0.1 I. For SGD and Adam, 0.1 I (q starts narrow, which suits log-hyperparameters of GPs
        and standardised regression weights). ``info["init"]`` records what was done.
    max_resample : int
        Rounds of redrawing draws whose log joint (or gradient) is NaN/inf, per step (>= 0).
    faults : FaultPolicy
        ``FaultPolicy(max_consecutive=20)``: that many skipped steps in a row (no valid draw at all) end the run
        with :class:`~gpvi.exceptions.NumericalFaultError` carrying the last good state (the driver counts them).
    num_elbo_draws : int
        Draws for the final bound estimate ``elbo`` and its standard error (0: report the rolling average),
        evaluated in chunks that respect the run's memory budget (:class:`~gpvi.inference.budget.MemoryBudget`).
    analytic_term : callable, optional
        Advanced: replaces the closed-form part of the bound (default :class:`EntropyTerm`,
        :math:`\sum\log C_{dd} + \mathcal H_\phi`). Called as ``term(mu, C_diag) -> (value, grad_mu, grad_C_diag)``;
        used by :class:`gpvi.inference.dsvi.ard.DSVIARD`.
    seed : int, optional
        Seed of the run's generator (default 0: runs are reproducible); ``run(..., generator=)`` overrides it.
    progress_bar : bool
        tqdm bar with the rolling bound in its postfix.

    Notes
    -----
    *Invalid draws.* When :math:`\log g(\theta_s)` or its gradient is NaN/±inf (e.g. a GP kernel matrix that
    fails Cholesky: :meth:`gpvi.GPRegression.log_joint` returns -inf for such rows), those draws are redrawn
    up to ``max_resample`` times (counted in ``info["resampled_draws"]``); draws still invalid are dropped
    (``dropped_draws``) and the gradient averages the valid ones. This is an unbiased estimate of the gradient
    of the bound for :math:`q` *restricted to the region where the log joint is valid*, not of the bound for
    q itself: if a noticeable fraction of q's mass is invalid the answer is biased, which the counters reveal.
    A step with no valid draw is skipped (``skipped_steps``, :class:`~gpvi.exceptions.NumericalWarning`).

    *Positivity of C.* A C update that would make any diagonal entry non-positive is never applied: the C step
    is scaled down so that no diagonal entry falls below half its current value (``c_shrinks``), or dropped if
    that is impossible (``c_rejects``). The mean update is applied unchanged. (``"natural"`` steps never need
    this: the KL trust region keeps every :math:`1 + \rho A_{dd}` positive.)

    **GP hyperparameter posterior** (paper section 3.4). ``DSVI(scale="full").run(model)`` on a
    :class:`gpvi.GPRegression` model (:math:`\theta` = log lengthscales², log signal and noise variances, prior
    N(0, 10) each by default; full C over all D = d + 2 components; S = 4 draws of :math:`\theta` per step through
    one batched Cholesky; no data subsampling) does, with every default:

    1. MAP :math:`\hat\theta` by ``gpvi.ML2(num_restarts=1, prior=True, seed=seed)`` (L-BFGS-B from the
       data-scaled ``model.initial_theta()``; under a second on the bundled sets) — or ``init`` if given;
    2. :math:`C_0` = Laplace scale at :math:`\mu_0` (above; :math:`2D` gradients in one batched call);
    3. ``"natural"`` steps with :math:`\rho_t = 0.05/(1+t/200)^{0.6}`, trust region ``max_step_kl = 0.1``;
    4. the convergence rule every 100 steps (bound, :math:`\mu` and C window averages, ``param_tol = 0.2``
       q-sds, ``patience = 3``), stopping when it holds and returning the average of the last 3 windows
       (``info["returned"]``); ``num_steps = 20000`` is only a cap (then a ``ConvergenceWarning``);
    5. a final bound estimate from ``num_elbo_draws = 1000`` draws (``q.elbo``, ``q.elbo_se``).

    Steps 1-2 are the init strategy ``init_to_laplace(init_to_map(seed=seed))`` (:mod:`gpvi.inference.init`),
    which the driver runs before the engine starts; pass ``init=`` to start elsewhere. Timings against NUTS are in
    ``benchmarks/results/dsvi_table5.md``. Any setting can be overridden; ``optimizer="sgd"`` runs the paper's
    Algorithm 1 (from the same start with ``init="laplace"``, with no automatic stop). Where the posterior has skewed or two-mode marginals
    (Boston's lengthscales 4, 7, 11) q, being Gaussian, is narrower than the posterior and centred on the main
    mode: it is the best Gaussian by the bound, not the Gaussian with the posterior's moments.

    *Failed Cholesky draws.* :meth:`gpvi.GPRegression.log_joint` retries a kernel matrix that is not positive
    definite with bounded jitter; a draw of :math:`\theta` whose matrix still fails gets :math:`-\infty`, and
    DSVI *redraws* it (up to ``max_resample`` rounds per step, counted in ``info["resampled_draws"]``), drops
    what is still invalid (``dropped_draws``) and skips a step with no valid draw (``skipped_steps``), warning
    once per run with the counts (policy above). Nothing is dropped silently; non-zero counters on a GP mean q
    puts mass where the model cannot be evaluated, and the answer should be treated with suspicion.

    Predictions: ``q.predict(X_test, num_draws=200)`` is the mixture over :math:`\theta \sim q` of the GP
    predictives (:class:`~gpvi.posteriors.predictive.MixturePredictive`), and ``q.summary()`` gives the marginals by name on
    the log and natural scales (example below).

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.inference.dsvi.engine import DSVI
    >>> m = torch.full((3,), 2.0, dtype=torch.float64)
    >>> target = gpvi.Target(lambda th: -0.5 * ((th - m) ** 2).sum(-1), names=3)
    >>> q = DSVI(num_steps=3000, lr=0.1, polyak=0.5, progress_bar=False, seed=0).run(target)
    >>> bool((q.mean - m).abs().max() < 0.1), bool((q.covariance - torch.eye(3)).abs().max() < 0.15)
    (True, True)

    GP hyperparameter posterior (Bodyfat without Density, D = 15):

    >>> import gpvi
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

    def __init__(self, scale: str = "full", base: Any = "normal", df: float | None = None, *,
                 num_draws: int = 4, num_steps: int = 20_000, lr: float | str = "auto", lr_scale: float | None = None,
                 schedule: Any = "auto", schedule_options: dict[str, Any] | None = None, optimizer: str = "auto",
                 adam_betas: tuple[float, float] = (0.9, 0.999), adam_eps: float = 1e-8, max_step_kl: float = 0.1,
                 window: int | str = "auto", tol: float = 1e-3, param_tol: float = 0.2, patience: int = 3,
                 stop_on_convergence: bool | str = "auto", polyak: float | None = 0.25, fixed_mean_mask: Any = None,
                 blocks: Sequence[Any] | None = None, init_scale: Any = "auto", max_resample: int = 10,
                 faults: FaultPolicy | None = None, num_elbo_draws: int = 1000,
                 analytic_term: Callable[..., Any] | None = None, seed: int | None = 0,
                 progress_bar: bool = True) -> None:
        self.scale = check_choice(scale, "scale", ("full", "diag"))
        if df is not None:
            df = check_positive(df, "df")
        if isinstance(base, str):
            check_choice(base, "base", ("normal", "t"))
            if base == "t" and df is None:
                raise ValueError("df must be given (degrees of freedom nu > 0) when base='t'")
            if base == "normal" and df is not None:
                raise ValueError("df is only used with base='t'; got base='normal'")
        elif base is None:
            raise TypeError("base must be 'normal', 't', a sequence of univariate distributions or a standard "
                            "distribution object; got None")
        self.base, self.df = base, df
        self.num_draws = check_positive_int(num_draws, "num_draws")
        self.num_steps = check_positive_int(num_steps, "num_steps")
        self.optimizer = check_choice(optimizer, "optimizer", OPTIMIZERS)
        self.lr = check_choice(lr, "lr", ("auto",)) if isinstance(lr, str) else check_positive(lr, "lr")
        self.lr_scale = None if lr_scale is None else check_positive(lr_scale, "lr_scale", allow_zero=True)
        self.schedule_options = dict(schedule_options or {})
        if isinstance(schedule, str):
            check_choice(schedule, "schedule", ("auto",) + tuple(SCHEDULES))
            if schedule == "auto" and self.schedule_options:
                raise ValueError("schedule_options need a named schedule (schedule='auto' picks its own options)")
            if schedule != "auto":
                make_schedule(schedule, 1.0, num_steps=self.num_steps, **self.schedule_options)   # validates
        else:
            make_schedule(schedule, 1.0)
            if lr != "auto":
                raise ValueError("lr must be left at 'auto' when schedule is a schedule object (it carries rho0)")
            if self.schedule_options:
                raise ValueError("schedule_options only apply to a named schedule")
        self.schedule = schedule
        if not isinstance(adam_betas, (tuple, list)) or len(adam_betas) != 2:
            raise TypeError("adam_betas must be a pair (beta1, beta2)")
        self.adam_betas = tuple(check_fraction(b, f"adam_betas[{i}]", low_open=False, high_closed=False)
                                for i, b in enumerate(adam_betas))
        self.adam_eps = check_positive(adam_eps, "adam_eps")
        self.max_step_kl = check_positive(max_step_kl, "max_step_kl")
        self.convergence = Convergence(window, tol, param_tol, patience, stop_on_convergence)
        self.polyak = None if polyak is None else check_fraction(polyak, "polyak")
        self.fixed_mean_mask = None
        if fixed_mean_mask is not None:
            t = as_float_tensor(fixed_mean_mask, "fixed_mean_mask", ndim=1)
            if not bool(((t == 0) | (t == 1)).all()):
                raise ValueError("fixed_mean_mask must hold booleans (True = component of mu held fixed)")
            self.fixed_mean_mask = t.bool()
        if blocks is not None and self.scale != "full":
            raise ValueError("blocks needs scale='full' (a diagonal scale has no off-diagonal entries)")
        self.blocks = None if blocks is None else list(blocks)
        if isinstance(init_scale, str):
            check_choice(init_scale, "init_scale", ("auto",))
        elif isinstance(init_scale, numbers.Real) and not isinstance(init_scale, bool):
            check_positive(init_scale, "init_scale")
        self.init_scale = init_scale
        self.max_resample = check_nonnegative_int(max_resample, "max_resample")
        if faults is not None and not isinstance(faults, FaultPolicy):
            raise TypeError(f"faults must be a gpvi.inference.engine.FaultPolicy; got {type(faults).__name__}")
        self.faults = FaultPolicy() if faults is None else faults
        self.num_elbo_draws = check_nonnegative_int(num_elbo_draws, "num_elbo_draws")
        if analytic_term is not None and not callable(analytic_term):
            raise TypeError(f"analytic_term must be callable; got {type(analytic_term).__name__}")
        self.analytic_term = analytic_term
        self.seed = check_seed(seed)
        self.progress_bar = check_bool(progress_bar, "progress_bar")
        self._cache: dict[str, Any] = {}     # derived from settings only (base, term, schedule, block mask)

    # ------------------------------------------------------------------ settings and what they resolve to
    def settings(self) -> dict[str, Any]:
        """The constructor settings as a plain dict (recorded in ``info["settings"]``)."""
        base = self.base if isinstance(self.base, str) else repr(self.base)
        sched = self.schedule if isinstance(self.schedule, str) else repr(self.schedule)
        return {"scale": self.scale, "base": base, "df": self.df, "num_draws": self.num_draws,
                "num_steps": self.num_steps, "lr": self.lr, "lr_scale": self.lr_scale, "schedule": sched,
                "schedule_options": dict(self.schedule_options), "optimizer": self.optimizer,
                "max_step_kl": self.max_step_kl, **self.convergence.settings(),
                "init_scale": self.init_scale if isinstance(self.init_scale, (str, numbers.Real)) else "array",
                "polyak": self.polyak, "max_resample": self.max_resample,
                "max_failed_steps": self.faults.max_consecutive, "seed": self.seed}

    def make_base(self, dim: int) -> Any:
        """The standard distribution :math:`\\phi` for dimension ``dim`` (built once per dimension, cached)."""
        cached = self._cache.get("base")
        if cached is None or cached[0] != dim:
            cached = self._cache["base"] = (dim, make_standard(self.base, dim, df=self.df))
        return cached[1]

    def term(self, base: Any) -> Callable[..., Any]:
        """The closed-form part of the bound: ``analytic_term`` or :class:`EntropyTerm` of ``base``."""
        if self.analytic_term is not None:
            return self.analytic_term
        term = self._cache.get("term")
        if term is None or term[0] is not base:
            term = self._cache["term"] = (base, EntropyTerm(base.entropy()))
        return term[1]

    def schedule_for(self, state: DSVIState) -> Any:
        """The step-size schedule of a run in ``state`` (resolved from ``"auto"`` by its optimizer)."""
        if not isinstance(self.schedule, str):
            return self.schedule
        key = (state.rho0_mu, state.optimizer)
        cached = self._cache.get("schedule")
        if cached is None or cached[0] != key:
            if self.schedule == "auto":
                sched = (make_schedule("robbins_monro", state.rho0_mu, **NATURAL_SCHEDULE)
                         if state.optimizer == "natural" else
                         make_schedule("decay", state.rho0_mu, num_steps=self.num_steps))
            else:
                sched = make_schedule(self.schedule, state.rho0_mu, num_steps=self.num_steps, **self.schedule_options)
            cached = self._cache["schedule"] = (key, sched)
        return cached[1]

    def resolve_optimizer(self, target: Any) -> str:
        """The update rule a run on ``target`` uses: ``optimizer``, or for ``"auto"`` the rule below.

        ``"natural"`` when the target offers a cheap MAP/Laplace start: it has ``log_marginal_likelihood``
        (the ML-II protocol of :class:`gpvi.ML2`, e.g. :class:`gpvi.GPRegression`), is not a minibatch target,
        has D <= 200, and no ``analytic_term`` is set; ``"sgd"`` (Algorithm 1 exactly) for every other target.
        The choice and its reason are recorded in ``info["auto"]``.

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
        if self.optimizer != "auto":
            return self.optimizer, "given"
        target = as_target(target)
        laplace_ok = (self.analytic_term is None and not is_minibatch_target(target)
                      and callable(getattr(target, "log_marginal_likelihood", None))
                      and len(target.names) <= LAPLACE_MAX_DIM)
        if laplace_ok:
            return "natural", "the target has an exact log_marginal_likelihood and D <= 200: MAP/Laplace start"
        return "sgd", "no cheap MAP/Laplace start (not an exact GP target, a minibatch target, D > 200 or an " \
                      "analytic term): Algorithm 1"

    def _lr_scale(self, optimizer: str) -> float:
        if self.lr_scale is not None:
            return self.lr_scale
        return 0.1 if optimizer == "sgd" else 1.0

    def _block_mask(self, D: int) -> torch.Tensor | None:
        if self.blocks is None:
            return None
        mask = self._cache.get("mask")
        if mask is None or mask.shape[0] != D:
            mask = self._cache["mask"] = _block_mask(self.blocks, D)
        return mask

    # ------------------------------------------------------------------ the engine contract
    def default_init(self, target: Any) -> Callable[[Any], Start]:
        """``init_to_laplace(init_to_map(seed=seed))`` for ``"natural"`` runs, else :func:`init_to_default`."""
        if self.resolve_optimizer(target) == "natural":
            return init_to_laplace(init_to_map(seed=0 if self.seed is None else self.seed))
        return init_to_default()

    def init(self, target: Any, start: Any = None, generator: torch.Generator | None = None) -> DSVIState:
        """Initial state at ``start``: :math:`\\mu_0`, :math:`C_0`, resolved step sizes and the run's generator.

        ``start`` is a :class:`~gpvi.inference.init.Start`, or anything ``run(init=...)`` accepts (resolved by
        :func:`~gpvi.inference.init.resolve_init`, default :meth:`default_init`); ``generator`` (default: a fresh
        one seeded with ``seed``) becomes the run's random stream.
        """
        target = as_target(target)
        if not isinstance(start, Start):
            start = resolve_init(start, self.default_init(target), seed=0 if self.seed is None else self.seed)(target)
        if generator is None:
            generator = resolve_generator(self.seed, generator)
        D = len(target.names)
        base = self.make_base(D)
        if self.fixed_mean_mask is not None and self.fixed_mean_mask.shape[0] != D:
            raise ValueError(f"fixed_mean_mask must have length D = {D}; got {self.fixed_mean_mask.shape[0]}")
        if base.dim != D:
            raise ValueError(f"base has dimension {base.dim} but the target has D = {D}")
        optimizer, why = self._resolve(target)
        mu0, C0, init_info = self._initial(target, start, D, optimizer)
        init_info["time_s"] = start.info.get("time_s", init_info.get("time_s", 0.0))
        init_info["auto"] = {"optimizer": optimizer, "why": why}
        batch = target.sample_minibatch(generator) if is_minibatch_target(target) else None
        lj0, _ = log_joint_and_grad(target, mu0.unsqueeze(0), batch)
        if not bool(torch.isfinite(lj0).all()):
            warnings.warn(f"log joint at the initial mean is {float(lj0[0])}; DSVI will try anyway (draws with "
                          f"non-finite values are resampled)", NumericalWarning, stacklevel=3)
        if not isinstance(self.schedule, str):
            rho0 = float(self.schedule.rho0)
        elif self.lr != "auto":
            rho0 = float(self.lr)
        else:
            rho0 = {"adam": 0.01, "natural": NATURAL_LR}.get(optimizer) or _curvature_rate(target, mu0, generator,
                                                                                          batch)
        opt: dict[str, Any] = {}
        if optimizer == "adam":
            opt = {"m_mu": torch.zeros_like(mu0), "v_mu": torch.zeros_like(mu0), "m_C": torch.zeros_like(C0),
                   "v_C": torch.zeros_like(C0), "n": 0}
        return DSVIState(mu=mu0, C=C0, t=0, generator=generator, scale=self.scale, rho0_mu=rho0,
                         rho0_C=rho0 * self._lr_scale(optimizer), opt=opt,
                         window=deque(maxlen=self.convergence.window_for(optimizer)), optimizer=optimizer,
                         init_info=init_info)

    def _initial(self, target: Any, start: Start, D: int, optimizer: str
                 ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        return initial_moments(self, target, start, D, optimizer)

    def resume(self, target: Any, state: DSVIState | dict[str, Any]) -> DSVIState:
        """A checked copy of ``state`` (a :class:`DSVIState` or its ``state_dict``) to continue on ``target``."""
        D = len(as_target(target).names)
        if isinstance(state, dict):
            state = DSVIState.from_state_dict(state)
        elif isinstance(state, DSVIState):
            state = state.copy()
        else:
            raise TypeError(f"state must be a DSVIState or its state_dict; got {type(state).__name__}")
        if state.dim != D:
            raise ValueError(f"state has dimension {state.dim} but the target has D = {D}")
        if state.scale != self.scale:
            raise ValueError(f"state was made with scale={state.scale!r} but this engine has scale={self.scale!r}")
        if self.optimizer != "auto" and state.optimizer != self.optimizer:
            raise ValueError(f"state was made with optimizer={state.optimizer!r} but this engine has "
                             f"optimizer={self.optimizer!r}")
        if state.window.maxlen != self.convergence.window_for(state.optimizer):
            state.window = deque(state.window, maxlen=self.convergence.window_for(state.optimizer))
        state.check["stopped"] = False
        return state

    def stop_rule(self) -> Convergence:
        """The convergence rule (:class:`~gpvi.inference.dsvi.convergence.Convergence`)."""
        return self.convergence

    def postfix(self, info: dict[str, Any]) -> dict[str, Any]:
        return {"bound": info.get("bound_avg", math.nan)}

    def result(self, target: Any, state: DSVIState, report: RunReport) -> Any:
        """The :class:`~gpvi.posteriors.base.GaussianPosterior` of ``state`` (see :meth:`run`)."""
        return build_posterior(self, target, state, report)

    # ------------------------------------------------------------------ one step of Algorithm 1
    def estimate_gradient(self, target: Any, state: DSVIState, *, base: Any = None) -> GradientEstimate:
        r"""Draw S values of z and return the stochastic gradient of the bound at ``(state.mu, state.C)``.

        Uses (and advances) ``state.generator`` but changes nothing else: :math:`\hat\nabla_\mu =
        \frac1{S'}\sum_s g_s`, :math:`\hat\nabla_C = \frac1{S'}\sum_s\operatorname{tril}(g_s z_s^\top) + \Delta_C`
        (eq. 5-8) over the S' valid draws; invalid draws are redrawn up to ``max_resample`` rounds.
        """
        return estimate_gradient(self, target, state, base)

    def step(self, target: Any, state: DSVIState) -> tuple[DSVIState, dict[str, Any]]:
        r"""One iteration of Algorithm 1 (or of the ``"natural"``/``"adam"`` rule): advance ``state`` in place.

        Returns the same state (``t`` + 1) and ``info``: ``t``, ``bound`` (instantaneous bound before the
        update), ``bound_avg``, ``rho``, ``num_valid``, ``resampled``, ``dropped``, ``skipped`` (no valid draw:
        nothing changed but ``t`` and the generator; the driver counts these), ``c_shrink``, ``converged``.

        Examples
        --------
        >>> import torch, gpvi
        >>> from gpvi.inference.init import init_to_value
        >>> target = gpvi.Target(lambda th: -0.5 * ((th - 3.0) ** 2).sum(-1), names=2)
        >>> engine = DSVI(lr=0.2, schedule="constant")
        >>> state = engine.init(target, init_to_value(torch.zeros(2))(target), torch.Generator().manual_seed(0))
        >>> for _ in range(200):
        ...     state, info = engine.step(target, state)
        >>> bool((state.mu - 3.0).abs().max() < 0.5), info["t"]
        (True, 200)
        """
        t = state.t
        rho = float(self.schedule_for(state)(t))
        rho_C = rho * (state.rho0_C / state.rho0_mu) if state.rho0_mu > 0 else 0.0
        est = self.estimate_gradient(target, state)
        cnt = state.counters
        info: dict[str, Any] = {"rho": rho, "num_valid": est.num_valid, "resampled": est.resampled,
                                "dropped": est.dropped, "skipped": False, "c_shrink": 1.0}
        if cnt["resampled_draws"] == 0 and est.resampled > 0:
            warnings.warn(f"DSVI: log joint was NaN/inf for {est.resampled} draw(s) at step {t}; redrawn "
                          f"(counted in info['resampled_draws'])", NumericalWarning, stacklevel=2)
        cnt["resampled_draws"] += est.resampled
        cnt["dropped_draws"] += est.dropped
        cnt["log_joint_calls"] += est.log_joint_calls
        # one reduction checks both gradients (a sum of finite entries that overflows also counts as a fault)
        if est.num_valid == 0 or not math.isfinite(float(est.grad_mu.sum() + est.grad_C.sum())):
            cnt["skipped_steps"] += 1
            info["skipped"] = True
            if state.consecutive_failures == 0:
                warnings.warn(f"DSVI: step {t} skipped (no draw with a finite log joint and gradient after "
                              f"{self.max_resample} resampling rounds)", NumericalWarning, stacklevel=2)
            state.t = t + 1
            self.convergence.record(state, math.nan, rho, 0, info)
            return state, info
        diag = state.scale == "diag"
        if state.optimizer == "sgd":
            d_mu, d_C = rho * est.grad_mu, rho_C * est.grad_C
        elif state.optimizer == "natural":
            d_mu, d_C, shrink = natural_step(state.C, diag, est.grad_mu, est.grad_C, rho, rho_C, self.max_step_kl,
                                             None if diag else self._block_mask(state.dim))
            info["trust_shrink"] = shrink
            if shrink < 1.0:
                cnt["trust_clips"] = cnt.get("trust_clips", 0) + 1
        else:
            d_mu, d_C = adam_step(state.opt, est.grad_mu, est.grad_C, rho, rho_C, self.adam_betas, self.adam_eps)
        new_C = state.C
        if rho_C > 0:                 # never apply a C step that makes a diagonal entry <= 0
            d_C, info["c_shrink"] = keep_diagonal_positive(state.C, d_C, diag)
            if d_C is None:
                cnt["c_rejects"] += 1
            else:
                cnt["c_shrinks"] += info["c_shrink"] < 1.0
                new_C = state.C + d_C
        new_mu = state.mu + d_mu
        if self.fixed_mean_mask is not None:
            new_mu = torch.where(self.fixed_mean_mask, state.mu, new_mu)
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
        n = self.num_elbo_draws if num_draws is None else check_positive_int(num_draws, "num_draws")
        if n == 0:
            raise ValueError("num_draws must be >= 1 for a bound estimate (num_elbo_draws is 0)")
        target = as_target(target)
        mu = as_float_tensor(mu, "mu", ndim=1)
        C = as_float_tensor(C, "C", ndim=(1, 2))
        D = mu.shape[0]
        if D != len(target.names):
            raise ValueError(f"mu has length {D} but the target has D = {len(target.names)}")
        if C.shape not in ((D,), (D, D)):
            raise ValueError(f"C must be ({D}, {D}) lower triangular or ({D},) diagonal; got {tuple(C.shape)}")
        if not bool(((torch.diagonal(C) if C.dim() == 2 else C) > 0).all()):
            raise ValueError("C must have a strictly positive diagonal")
        base = self.make_base(D)
        gen = resolve_generator(seed if seed is not None else 0, generator)
        est, se, bad, _ = _estimate_bound(target, base, self.term(base), mu, C, n, gen, budget or MemoryBudget())
        return est, se, bad

    def run(self, target: Any, init: Any = None, *, state: DSVIState | dict[str, Any] | None = None,
            generator: torch.Generator | None = None, callback: Callable[[DSVIState, dict[str, Any]], None] | None = None,
            budget: MemoryBudget | None = None) -> Any:
        r"""Run until the stop rule ends the run or ``num_steps`` steps are done; return the posterior.

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
            (counters, ``converged``, ``steps``, ``time_s``, ``lr_mu``, ``lr_C``, ``interrupted``, ``settings``,
            ``convergence``, ``init`` with ``auto``, ``elbo_chunks``) and ``engine_state`` (a copy of the final
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
        return driver.run(self, target, init, state=state, generator=generator, callback=callback, budget=budget)

    def __repr__(self) -> str:
        base = self.base if isinstance(self.base, str) else type(self.base).__name__
        return (f"DSVI(scale={self.scale!r}, base={base}, num_draws={self.num_draws}, num_steps={self.num_steps}, "
                f"lr={self.lr!r}, optimizer={self.optimizer!r})")
