r"""``gpvi.infer``: one call from a target to a hyperparameter posterior whose reliability has been checked.

The recipe (Yao, Vehtari, Simpson & Gelman, *Yes, but did it work?*, ICML 2018; Vehtari et al., *Pareto smoothed
importance sampling*, JMLR 2024):

0. **Grid** (exact GP targets of at most ``GRID_MAX_D`` = 4 parameters; :mod:`gpvi.inference.grid`): from the
   MAP optima and their Laplace scales, the posterior by quadrature on a lattice flooded outwards until the log
   joint has dropped by ``GRID_DROP`` nats (INLA's exploration of hyperparameters, Rue, Martino & Chopin 2009),
   accepted when the lattice's 2h cosets agree; otherwise the steps below run from the same MAP optima.
1. **Variational fit**: the best Gaussian q. Default engine: Salimans & Knowles' Hessian-free stochastic linear
   regression (2013, section 6.2; :class:`gpvi.SKGaussian`) from every distinct MAP optimum with its Laplace scale
   (DSVI's default starts for exact GP targets), the best final bound kept; ``engine="dsvi"``: DSVI's default
   (Titsias & Lázaro-Gredilla 2014; natural-gradient steps, convergence stop and finish). On Boston, Bodyfat and
   pendulum S&K reaches an equal or higher bound than DSVI in less time, and ``infer``'s answers stay within
   0.2 NUTS sd (``benchmarks/results/nuts_fidelity_engines.md``).
2. **Diagnosis**: PSIS of q against the exact (Cholesky) log joint gives :math:`\hat k`
   (:func:`gpvi.posteriors.weighted.psis`).
3. **Basins**: when the starts (one per distinct MAP optimum) ended in different basins, PSIS cannot see the
   mass the best Gaussian leaves out (its draws never reach the other basins: on Bodyfat :math:`\hat k = 0.41`
   while a second basin holds 27% of the mass). The starts' Gaussians are mixed
   (:class:`~gpvi.posteriors.mixture.GaussianMixture`, weights :math:`\propto e^{\mathcal L_k}`) and PSIS of
   the mixture estimates each basin's posterior mass. If the basins other than the best one hold more than
   ``BASIN_MASS_TOL`` of it, the mixture replaces q in the next step.
4. **Check** (issue 39): the diagnosis draws are not enough to trust a weighted answer, nor a small
   :math:`\hat k` enough to trust q. A Gaussian q that is too narrow for a broad, flat-topped posterior
   (lengthscales of irrelevant inputs at small N) can show :math:`\hat k` 0.3-0.7 from 1,000 draws while q, or
   its weighted draws, have marginal sds 0.4-0.8x the truth: its draws never reach the tail that holds the
   missing mass. So the answer is computed from a **multi-scale defensive proposal** and accepted only when
   **independent batches agree**:

   - the proposal :math:`g = (1-\beta)\sum_k \alpha_k\,\mathcal N(\mu_0, s_k^2\Sigma_0) +
     \tfrac{\beta}{D}\sum_j \mathcal N(\mu_0, \Sigma_j)` around the base :math:`q_0` (q, or the starts' mixture,
     whose component replaces the first term; :math:`\mu_0, \Sigma_0` its moments): scaled copies with
     :math:`s = (1, 1.5, 2.5)`, :math:`\alpha = (0.6, 0.3, 0.1)` (``CHECK_SCALES``), and per coordinate j a
     Gaussian whose sd in :math:`\theta_j` alone is ``COORD_SCALE`` = 3 times the base's,
     :math:`\Sigma_j = \Sigma_0 + 8\,\Sigma_0 e_j e_j^\top\Sigma_0/\Sigma_{0,jj}`, together weighing
     :math:`\beta` = ``COORD_WEIGHT`` = 0.2. The wide components reach a tail q misses and bound the weights there
     (Hesterberg's defensive mixtures, 1995); the coordinate components reach a heavy tail in one parameter (the
     log noise variance towards zero noise at small N) with the other parameters typical;
   - PSIS of g with ``4 x num_psis_draws`` draws, cut into ``CHECK_BATCHES`` batches whose estimates give the
     Monte Carlo error (:func:`~gpvi.posteriors.weighted.batch_mcse`).

   Steps 2-4 and their constants are in :mod:`gpvi.inference.check`; the engine's bound draws are PSIS's draws
   of q and of the starts' Gaussians (their log joints are known: still independent draws of each proposal). The
   weighted answer is **reliable** when :math:`\hat k \le \min(1 - 1/\log_{10}S, 0.7)`, the weights' ESS is at
   least ``min_ess`` and every parameter's batch MCSE of the mean and of the sd is at most ``MCSE_TOL`` of its sd.
   A wide component that finds mass q missed raises :math:`\hat k` or the batch spread, and the answer goes to
   NUTS. A passed check gets a **second opinion** from the scaled copies alone (new draws, the same rule): the
   coordinate components also smooth the weights where they reach nothing, and lower :math:`\hat k` with them;
   the weighted answer is reliable only when both pass (``report.check["second"]``). Importance sampling cannot see
   mass that no proposal draw reaches: ``trust_stress.md`` counts the weighted answers that were still wrong.
   - **Refinement** (the starts' mixture only): when its check fails on the batch MCSE alone (:math:`\hat k` and
     the ESS pass) and that MCSE is at most ``REFINE_REACH`` x ``MCSE_TOL``, each Gaussian of the mixture is moved
     to the weighted mean and marginal sds of the draws it accounts for and its weight to their weighted mass (one
     step of population Monte Carlo, Cappé et al. 2004; correlations kept), the defensive components are kept
     around it, and its own new draws (rounds of ``4 x num_psis_draws``, at most ``REFINE_ROUNDS``) are checked by
     the same rule; they replace the first draws as the weighted answer, and NUTS runs only if they fail too. A
     single q is not refined (:mod:`gpvi.inference.check`).

5. **Answer**: q itself when its :math:`\hat k \le 0.5`, there is one basin, the weighted answer is reliable and
   q agrees with it (every mean within ``Q_AGREE_MEAN`` weighted sd, every sd ratio within ``Q_AGREE_SD``);
   otherwise the reliable weighted answer (``"psis"``); otherwise NUTS warm-started from q (:func:`default_nuts`:
   chains start at draws of q, or of the Gaussian with the mixture's mean and covariance when there are several
   basins; step size and a diagonal inverse mass matrix adapted in Stan's windows over 500 warm-up transitions),
   extended (by the draws the shortfall asks for, :func:`~gpvi.inference.check.extended_length`) until every
   parameter's bulk **and tail** ESS reach ``min_ess``, R-hat 1.01, and every Monte Carlo error of a mean and of a sd is at most
   ``MCSE_TOL`` of the parameter's sd, the tolerance the weighted answer is held to (Vehtari, Gelman, Simpson,
   Carpenter & Bürkner 2021: the tail ESS, of the 5% and 95% quantiles, and the MCSE of the sd are what chains
   that have not yet explored a heavy tail show). NUTS that does not reach them leaves the answer **not trusted**.

The returned posterior carries a :class:`InferenceReport` as ``.report``: :math:`\hat k`, the bound, the answer and
why, ``trusted`` (False also warns; Ctrl-C in any stage returns that stage's partial result, not trusted, with an
:class:`~gpvi.exceptions.InterruptedRunWarning`), the Monte Carlo error of its means and each stage's wall time.
``benchmarks/results/trust_stress.md`` measures the rule on a stress suite against long NUTS runs.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any


from ..exceptions import InterruptedRunWarning, NumericalFaultError, NumericalWarning
from ..models.target import as_target
from ..posteriors.gaussian import GaussianPosterior
from ..posteriors.weighted import KHAT_GOOD
from ..rng import check_seed
from ..validation import check_bool, check_choice, check_nonnegative_int, check_positive, check_positive_int
from .check import (BASIN_MASS_TOL, MCSE_TOL, diagnose, mixed, q_agrees, relative_mcse, run_until_mixed,
                    starts_mixture)
from .dsvi.engine import DSVI
from .dsvi.starts import run_starts
from .grid import GRID_MAX_D, grid_posterior
from .init import init_to_laplace
from .mcmc.nuts import NUTS
from .mcmc.settings import Adaptation
from .report import InferenceReport
from .salimans_knowles.engine import SKGaussian

__all__ = ["infer", "variational_fit", "map_laplace_start", "default_sk", "default_nuts", "InferenceReport",
           "starts_mixture",
           "BASIN_MASS_TOL"]

_FIT_STAGES = {"map": "the MAP restarts of the variational fit's start (q is that start's Gaussian, not fitted "
                      "and unchecked)",
               "laplace": "the Laplace scales of the variational fit's starts (q is the MAP point's Gaussian, not "
                          "fitted and unchecked)",
               "q": "the variational fit (q is partial and unchecked)"}


def _choose(khat_q: float, check: dict[str, Any], *, several: bool = False,
            q_agrees: bool = False) -> tuple[str, str]:
    """The answer (module docstring, step 5): ``"q"``, ``"psis"`` or ``"nuts"`` and the reason."""
    what = "the refined defensive proposal's" if check.get("first") else "the defensive proposal's"
    if check["reliable"]:
        if not several and math.isfinite(khat_q) and khat_q <= KHAT_GOOD and q_agrees:
            return "q", (f"k-hat {khat_q:.2f} <= {KHAT_GOOD} and q agrees with its checked PSIS-weighted draws: "
                         "the variational q is close to the posterior")
        lead = "several basins; " if several else ""
        return "psis", (f"{lead}{what} PSIS-weighted draws pass the check (k-hat "
                        f"{check['khat']:.2f}, ESS {check['ess']:.0f}, batch MCSE <= "
                        f"{max(check['mcse_mean'], check['mcse_sd']):.3f} sd)")
    if check.get("second"):
        t = check["second"]
        return "nuts", (f"q's k-hat {khat_q:.2f}; {what} weighted draws pass the check but the second opinion (the "
                        f"scaled copies alone) fails it (k-hat {t['khat']:.2f} vs {t['threshold']:.2f}, ESS "
                        f"{t['ess']:.0f}, batch MCSE {max(t['mcse_mean'], t['mcse_sd']):.3f} sd): NUTS warm-started "
                        "from q")
    return "nuts", (f"q's k-hat {khat_q:.2f}; {what} weighted draws fail the check (k-hat "
                    f"{check['khat']:.2f} vs {check['threshold']:.2f}, ESS {check['ess']:.0f}, batch MCSE "
                    f"{max(check['mcse_mean'], check['mcse_sd']):.3f} sd): NUTS warm-started from q")


def default_sk(dim: int, *, seed: int = 0, progress_bar: bool = True) -> Any:
    r"""``gpvi.infer``'s variational engine for a D-dimensional target: Salimans-Knowles' Hessian-free variant,
    ``SKGaussian(num_steps=max(500, 40 D), method="gradient", num_draws=4, draws="sobol")``.

    Two antithetic pairs per step, :math:`N = \max(500, 40D)` steps (step size :math:`1/\sqrt N`, the second half
    averaged) and randomised quasi-Monte Carlo draws: from the same start, the bound of the returned q is within
    0.01 nats of a run 10x longer on the pendulum, Bodyfat and Boston GP hyperparameter posteriors
    (``benchmarks/results/sk_length.md``).

    Examples
    --------
    >>> default_sk(15, progress_bar=False)
    SKGaussian(num_steps=600, method='gradient', num_draws=4, draws='sobol', step_size=0.04082)
    """
    return SKGaussian(num_steps=max(500, 40 * dim), method="gradient", num_draws=4, draws="sobol", seed=seed,
                      progress_bar=progress_bar)


def _stopped(post: Any, stage: str, what: str, times: dict[str, float], report: Any = None,
             answer: str = "q") -> Any:
    """Ctrl-C ended ``stage``: ``post`` (the partial result) with a report that says so, and a warning."""
    q = getattr(report, "q", None) or post
    if report is None:
        report = InferenceReport(
            "q", "", math.nan, float(getattr(q, "elbo", math.nan)), float(getattr(q, "elbo_se", math.nan)),
            bool(q.info.get("converged", False)), math.nan, math.nan, math.nan, times, q=q,
            engine=q.info.get("infer", {}).get("engine", type(q).__name__))
    report.answer = answer
    report.interrupted, report.trusted = stage, False
    report.reason = f"interrupted (Ctrl-C) during {what}" + (f"; {report.reason}" if report.reason else "")
    report.times = times
    warnings.warn(f"gpvi.infer: interrupted during {what}; the partial result is flagged (report.trusted False)",
                  InterruptedRunWarning, stacklevel=3)
    post.report = report
    return post


def variational_fit(target: Any, *, seed: int = 0, engine: Any = None, progress_bar: bool = True,
                    start: Any = None) -> Any:
    r"""Step 1 of :func:`infer`: the best Gaussian q (``engine`` as in :func:`infer`; ``start``: the default
    engines' start when already found, :func:`map_laplace_start`'s, which is what they would compute).

    Returns
    -------
    GaussianPosterior
        With ``start_posteriors`` and ``info["infer"]``: the engine's name, any fallback note, the fit's wall time.
    """
    seed = check_seed(seed)
    progress_bar = check_bool(progress_bar, "progress_bar")
    t0 = time.perf_counter()
    fallback = ""
    if engine is not None and not isinstance(engine, str):   # an engine object is run as it is
        q = engine.run(target, init=start)
    else:                                                     # DSVI's default starts: the MAP optima, Laplace scales
        name = check_choice("sk" if engine is None else engine, "engine", ("sk", "dsvi"))
        dsvi = DSVI(scale="full", seed=seed, progress_bar=progress_bar)
        start = dsvi.default_init(target)(as_target(target)) if start is None else start
        engine = default_sk(len(target.names), seed=seed, progress_bar=progress_bar) if name == "sk" else dsvi
        try:
            q = run_starts(engine, target, start)               # from every distinct MAP optimum
        except NumericalFaultError as err:                    # every start's S&K run failed: DSVI, same starts
            if engine is dsvi:
                raise
            fallback = f"S&K failed from every start ({str(err)[:120]}); DSVI from the same starts"
            warnings.warn(f"gpvi.infer: {fallback}", NumericalWarning, stacklevel=3)
            engine = dsvi
            q = run_starts(engine, target, start)
    q.info["infer"] = {"engine": getattr(engine, "name", type(engine).__name__), "fallback": fallback,
                       "wall": time.perf_counter() - t0}
    return q


def map_laplace_start(target: Any, seed: int = 0) -> Any:
    """The MAP optima with their Laplace scales that the default engines start from
    (``DSVI(seed=seed).default_init``), or None for a target they do not start so (not an exact GP target)."""
    init = DSVI(scale="full", seed=seed, progress_bar=False).default_init(target)
    return init(as_target(target)) if isinstance(init, init_to_laplace) else None


def _grid_step(target: Any, seed: int, times: dict[str, float], progress_bar: bool) -> tuple[Any, Any, dict[str, Any]]:
    """Step 0 (:mod:`gpvi.inference.grid`): (the answer when the grid gave one, or Ctrl-C stopped it: the MAP point's
    Laplace Gaussian, flagged; else None, the MAP start for step 1 (None for a target without one), the grid's
    record)."""
    t0 = time.perf_counter()
    start = map_laplace_start(target, seed)
    if start is None:
        return None, None, {}
    post, info = None, {}
    if not start.info.get("interrupted"):
        try:
            post, info = grid_posterior(target, start, progress_bar=progress_bar)
        except KeyboardInterrupt:
            times["grid"] = time.perf_counter() - t0
            q = GaussianPosterior(start.theta, start.scale_tril, list(target.names), target)
            return _stopped(q, "grid", "the grid (the MAP point's Laplace Gaussian is returned)", times), start, {}
    times["grid"] = time.perf_counter() - t0
    if post is not None:
        post.report = InferenceReport("grid", "the lattice quadrature's 2h cosets agree", math.nan, math.nan,
                                      math.nan, True, info["log_evidence"], math.nan, math.nan, times,
                                      engine="grid", mcse_mean=0.0, grid=info)
    return post, start, info


def default_nuts(seed: int = 0, progress_bar: bool = True) -> NUTS:
    r"""The sampler :func:`infer` runs when the weighted draws fail the check:
    ``gpvi.NUTS(num_chains=4, num_warmup=500, num_draws=500, adaptation=Adaptation(mass_from_init=False))``:
    chains start at draws of q; step size and diagonal :math:`M^{-1}` adapted in Stan's windows. NUTS runs exactly
    when q failed its check, and a metric fixed at such a q's covariance collapsed on some fits (divergences, bulk
    ESS below 100, R-hat up to 1.1) where the adapted one mixed (``benchmarks/studies/infer_nuts_metric.py``).

    Examples
    --------
    >>> default_nuts(seed=1, progress_bar=False).num_warmup
    500
    """
    return NUTS(num_chains=4, num_warmup=500, num_draws=500, seed=seed, progress_bar=progress_bar,
                adaptation=Adaptation(mass_from_init=False))


def infer(target: Any, *, seed: int = 0, num_psis_draws: int = 1000, engine: Any = None, nuts: Any = None,
          min_ess: float = 400.0, max_extensions: int = 3, progress_bar: bool = True, q: Any = None,
          grid: bool = True) -> Any:
    r"""A posterior over the target's parameters that has been checked against the exact log joint.

    Parameters
    ----------
    target : model or target
        E.g. :class:`gpvi.GPRegression` (parameters: kernel log-hyperparameters); anything with ``names`` and a
        batched ``log_joint``.
    seed : int
        Seed of every stage (MAP restarts, the variational engine, PSIS draws, NUTS).
    num_psis_draws : int
        Draws of q for the first PSIS diagnosis (default 1000); the check's defensive proposal draws 4x as many, its
        refinement (step 4, the starts' mixture only) up to ``REFINE_ROUNDS`` x 4x as many more, and the second
        opinion as many again (with its own refinement for the starts' mixture).
    engine : {"sk", "dsvi"} or engine, optional
        The variational engine. ``"sk"`` (default, also ``None``): Salimans-Knowles' Hessian-free variant
        (:func:`default_sk`: ``SKGaussian(num_steps=max(500, 40 D), method="gradient", num_draws=4,
        draws="sobol")``) from each of DSVI's default starts (for exact GP targets the distinct MAP optima with
        their Laplace scales; the best final bound wins and the starts' Gaussians enter the basin step): same or
        higher bounds than DSVI's default with fewer log-joint evaluations (``nuts_fidelity_engines.md``). Its
        length N is part of the algorithm, not a stop rule (``sk_length.md``). When it fails from every start
        (:class:`~gpvi.exceptions.NumericalFaultError`), ``infer`` warns and runs DSVI from the same starts (the
        report's ``engine`` and ``reason`` say so). ``"dsvi"``: ``gpvi.DSVI(scale="full", seed=seed)`` from the
        same starts. An engine object is run as it is.
    nuts : optional
        The sampler used when the weighted draws fail the check (default :func:`default_nuts`).
    min_ess : float
        The smallest weights' ESS of a weighted answer; when NUTS runs, extend the chains (by the draws the
        shortfall asks for, exactly as an uninterrupted longer run) until the smallest bulk and tail ESS reach
        ``min_ess`` (default 400), split R-hat <= 1.01 and every MCSE of a mean or sd is at most ``MCSE_TOL`` (0.05)
        of the sd.
    max_extensions : int
        The extended chains hold at most the sampler's draws x 2^max_extensions (default 3: 8x); the report says when
        the targets were not reached.
    progress_bar : bool
    q : GaussianPosterior, optional
        A variational fit to diagnose in place of step 1 (:func:`variational_fit`'s result, with its
        ``start_posteriors``); ``engine`` is then ignored, the grid is not tried and the report's ``times["q"]``
        is 0.
    grid : bool
        Step 0 (default True): for exact GP targets of at most ``GRID_MAX_D`` = 4 parameters, the posterior by
        quadrature on a lattice flooded from the MAP optima (:mod:`gpvi.inference.grid`), returned when its check
        passes (answer ``"grid"``); otherwise the steps below run from the same MAP optima.

    Returns
    -------
    GaussianPosterior, WeightedPosterior or SamplePosterior
        With ``mean``, ``std``, ``summary()``, ``predict`` and the attribute ``report`` (:class:`InferenceReport`).
        The WeightedPosterior holds draws of q, or of the mixture of the starts' Gaussians when they found several
        basins (``report.basin_mass``).

    Examples
    --------
    >>> import torch, gpvi
    >>> m = torch.tensor([1.0, -1.0], dtype=torch.float64)
    >>> target = gpvi.Target(lambda th: -0.5 * ((th - m) ** 2).sum(-1), names=["a", "b"])
    >>> post = gpvi.infer(target, seed=0, engine=gpvi.DSVI(num_steps=2000, seed=0, progress_bar=False),
    ...                   progress_bar=False)
    >>> post.report.answer, bool((post.mean - m).abs().max() < 0.1)
    ('q', True)
    """
    seed = check_seed(seed)
    num_psis_draws = check_positive_int(num_psis_draws, "num_psis_draws")
    min_ess = check_positive(min_ess, "min_ess", allow_zero=True)
    max_extensions = check_nonnegative_int(max_extensions, "max_extensions")
    progress_bar = check_bool(progress_bar, "progress_bar")
    grid = check_bool(grid, "grid")
    times: dict[str, float] = {}
    start, ginfo = None, {}
    if grid and q is None and len(target.names) <= GRID_MAX_D:
        answer, start, ginfo = _grid_step(target, seed, times, progress_bar)
        if answer is not None:                                # the grid's, or Ctrl-C's
            return answer
    t0 = time.perf_counter()
    if q is None:
        q = variational_fit(target, seed=seed, engine=engine, progress_bar=progress_bar, start=start)
    elif not (callable(getattr(q, "sample", None)) and callable(getattr(q, "log_prob", None))):
        raise TypeError(f"q must be a posterior with sample and log_prob (variational_fit's); got {type(q).__name__}")
    times["q"] = time.perf_counter() - t0
    fit = q.info.get("infer", {})
    starts = [p for p in getattr(q, "start_posteriors", None) or [q] if p is not None]
    if q.info.get("interrupted") or any(p.info.get("interrupted") for p in starts):
        stage = q.info.get("interrupted_stage", "q")
        return _stopped(q, stage, _FIT_STAGES.get(stage, _FIT_STAGES["q"]), times)
    t0 = time.perf_counter()
    try:
        w, wm, wb, mix, mass, several, check = diagnose(q, target, seed, num_psis_draws, min_ess)
    except KeyboardInterrupt:
        times["psis"] = time.perf_counter() - t0
        return _stopped(q, "psis", "the PSIS check (q is returned unchecked)", times)
    times["psis"] = time.perf_counter() - t0
    answer, reason = _choose(w.khat, check, several=several, q_agrees=check["reliable"] and q_agrees(q, wb))
    report = InferenceReport(answer, reason, w.khat, float(q.elbo), float(getattr(q, "elbo_se", math.nan)),
                             bool(q.info.get("converged", False)), w.log_evidence, w.log_evidence_se, w.ess, times,
                             starts=[{k: v for k, v in r.items() if k != "theta"} for r in q.info.get("starts", [])],
                             starts_agree=q.info.get("starts_agree"), basin_mass=mass,
                             khat_mixture=math.nan if wm is None else wm.khat,
                             log_evidence_mixture=math.nan if wm is None else wm.log_evidence,
                             log_evidence_mixture_se=math.nan if wm is None else wm.log_evidence_se, q=q,
                             engine=fit.get("engine", type(q).__name__), check=check,
                             mcse_mean=0.0 if answer == "q" else check["mcse_mean"], grid=ginfo)
    if fit.get("fallback"):
        report.reason += f"; {fit['fallback']}"
    post: Any = q if answer == "q" else wb
    if answer == "nuts":
        sampler = default_nuts(seed, progress_bar) if nuts is None else nuts
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")               # judged below, after any extension
                post, d, ext = run_until_mixed(sampler, target, mix if several else q, min_ess=min_ess,
                                               max_extensions=max_extensions)
        except KeyboardInterrupt:                             # before the first draw: the unchecked weighted draws
            times["nuts"] = time.perf_counter() - t0
            return _stopped(wb, "nuts", "NUTS before its first draw (the weighted draws that failed the check are "
                            "returned)", times, report, "psis")
        times["nuts"] = time.perf_counter() - t0
        met = mixed(d, min_ess, post.std)
        report.mcse_mean, mcse_sd = relative_mcse(d, post.std)
        report.nuts = {"draws per chain": int(post.draws.shape[1]), "extensions": ext,
                       "min ESS": float(d["ess_bulk"].min()), "min tail ESS": float(d["ess_tail"].min()),
                       "max R-hat": float(d["r_hat"].max()), "max MCSE of a sd (sd)": mcse_sd,
                       "divergences": int(post.stats["diverging"].sum()),
                       "gradient evaluations": int(sum(post.info["num_evaluations"])),    # warm-up too
                       "draws' gradient evaluations": int(post.stats["n_steps"].sum())}
        if post.info.get("interrupted"):
            return _stopped(post, "nuts", "NUTS (its partial chains are returned)", times, report, "nuts")
        if not met:
            report.trusted = False
            report.reason += (f"; after {ext} extension(s) the chains still miss min bulk / tail ESS {min_ess:g}, "
                              f"R-hat 1.01 or MCSE {MCSE_TOL:g} sd: run longer "
                              "(sampler.run(target, state=post.engine_state) with more num_draws)")
    if not report.trusted:
        warnings.warn(f"gpvi.infer: the answer is not trusted: {report.reason}", NumericalWarning, stacklevel=2)
    post.report = report
    return post
