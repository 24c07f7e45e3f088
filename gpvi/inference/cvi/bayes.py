r"""Fully Bayesian GP classification: a Gaussian q over the kernel log-hyperparameters, CVI's latent posteriors.

:class:`FullyBayesianCVI` runs MAP-II (:class:`~gpvi.inference.cvi.typeii.TypeII`), a Laplace start, and a Gaussian
variational engine (Salimans-Knowles Hessian-free by default, or DSVI) on EP's approximate evidence
(:class:`gpvi.inference.cvi.ep_evidence.EPEvidenceTarget`, the default where EP applies) or on the profiled CVI bound
(:class:`gpvi.inference.cvi.bound.CVIBoundTarget`); for a multi-class model
(:class:`gpvi.models.multiclass.GPMulticlass`, after the same :class:`~gpvi.inference.cvi.typeii.TypeII`) on
multi-class EP (softmax, any K, the default)
or the profiled multi-class bound (:class:`gpvi.inference.cvi.bound.CVIBoundTarget`). It returns a
:class:`gpvi.posteriors.bayes_classification.BayesClassificationPosterior` (see that module for the bound that is
maximised, what :math:`q(\theta)` approximates, and the predictive).
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import torch

from ...exceptions import NumericalFaultError, NumericalWarning
from ...models.priors import check_prior_choice
from ...posteriors.bayes_classification import BayesClassificationPosterior
from ...rng import check_seed
from ...validation import check_bool, check_choice, check_nonnegative_int, check_positive, check_positive_int
from .engine import CVI
from ..salimans_knowles import SKGaussian
from .typeii import TypeII
from .bound import CVIBoundTarget
from .ep_evidence import multiclass_ep_applies
from ..dsvi import DSVI, Convergence, Natural
from ..init import init_to_value, laplace_scale_at
from .bound import refuse_weights
from ...numerics.lbfgs import lbfgs_maximise
from .ep_evidence import EPEvidenceTarget
from .ep_starts import PLANE_MAX_DIM
from .cubature import try_cubature
from .importance import try_importance

__all__ = ["FullyBayesianCVI", "EP_MAP_GTOL", "EP_MAP_FTOL", "EP_VALUE_TOL", "PREDICTIVE_INNER_TOL",
           "BINARY_PREDICTIVE_INNER_TOL", "BINARY_EP_TOL", "BOUND_DRAWS", "CUBATURE", "IMPORTANCE",
           "MULTICLASS_IMPORTANCE"]

MULTICLASS_IMPORTANCE = True
"""Whether :data:`IMPORTANCE`'s step is tried for a multi-class softmax model too (on multi-class EP's evidence, at
most 4 log-hyperparameters; since issue 59's seventh pass). Decided on the tuning family mc_clf with its first 3
inputs (``benchmarks/studies/results/multiclass_psis_h59g_tuning*.md``, seeds 0-2): accepted in 10 of 12 fits (K = 3
/ 4 / 4 / 6 at N = 100 / 100 / 200 / 100: 3 / 1 / 3 / 3), which then took 0.36-0.54 of S&K's wall, q's means within
0.02-0.10 and log sds within 0.02-0.19 of S&K's (2,048 draws of EP's posterior, K = 4: 0.047 sd against S&K's
0.059). A rejection added 30 % to the fit. Against NUTS (``..._heldout.md``, ``..._k10.md``, seed 0) synth6 / synth10
/ synth10b: 0.12 / 0.18 / 0.35 sd (S&K 0.09 / 0.12 / 0.27; at K = 10 q moves to EP's own posterior, the class
docstring's offset), test probabilities 0.009 / 0.005 / 0.007 from NUTS's (S&K 0.009 / 0.005 / 0.007)."""

IMPORTANCE = True
"""``FullyBayesianCVI(importance=None)``'s value (since issue 59's seventh pass): for a binary model (a softmax one:
:data:`MULTICLASS_IMPORTANCE`) with at most 4 log-hyperparameters on EP's evidence, q is first the moment-matched
Gaussian of two rounds of importance sampling from the Laplace start, 128 value-only EP evaluations
(:class:`~gpvi.inference.cvi.importance.ImportanceGaussian`), accepted where PSIS's k-hat and ESS allow; else S&K
runs exactly as before (the site bank emptied first). On the binary tuning sets (``bayes_psis_h59g_tuning.md`` in
``benchmarks/studies/results``) an accepted q was as near the references as S&K's
(:data:`~gpvi.inference.cvi.importance.MIN_ESS`) with a q stage 3-7x shorter; a rejection adds the draws to S&K's."""

CUBATURE = False
"""``FullyBayesianCVI(cubature=None)``'s value; not the default (why: :data:`gpvi.inference.cvi.cubature.CHECK_TOL`)."""

BOUND_DRAWS: int | str = "window"
"""The default engine's ``num_elbo_draws``: ``"window"`` (since issue 59's fourth pass; 100 new draws of q before,
each an EP evaluation: 4 / 9 / 11% of the fit at xor N = 100 / 200 / 400, ``bayes_profile_h59c.md``): the final
bound estimate reuses the averaging window's draws, importance-weighted to the returned q
(:func:`gpvi.inference.salimans_knowles.estimates.window_bound`). The bound is reported (``elbo``, ``elbo_se``), not
used: q and the predictions do not change."""

BINARY_EP_TOL = 3e-3
"""Binary EP's stopping rule in the engine's evaluations where ``ep_tol`` is not given and the model has at most
:data:`~gpvi.inference.cvi.ep_starts.PLANE_MAX_DIM` (10) log-hyperparameters, where the site bank predicts EP's start
by a plane or quadratic in theta (1e-3 before issue 59's fourth pass, and still for multi-class models and above
that D). Started that close, EP's first sweep often changes the sites by less than this, and the evaluation stops
after one factorisation. Decided on the tuning families (``benchmarks/studies/results/bayes_steps_h59d_tol.md``;
each engine from the same start, errors against an 800-step run, seeds 0-2): q's means 0.009 / 0.134 / 0.013 /
0.016 / 0.035 sd from that run at 1e-3 and 0.010 / 0.122 / 0.014 / 0.017 / 0.036 at 3e-3 (xor N = 100, spirals
N = 100 / 200, checkerboard N = 400, clf8 N = 100, D = 3 or 9) with 18-23% fewer EP sweeps (16% at N = 400); at 1e-2
0.012 / 0.192 / 0.019 / 0.018 / 0.037, at 3e-2 up to 0.030. Against the long NUTS references
(``benchmarks/results/classification_bayes_speed_h59d_nuts.md``, seeds 0 and 1) the Pima, Ripley and Sonar fits
moved by at most 0.005 of q's sds, their distances from NUTS unchanged; on Ionosphere (D = 35, the bank's nearest
entry, 5.3 sweeps per evaluation) 3e-3 moved q by 0.05 sd (NUTS distance 0.08 -> 0.10 at seed 0) and 1e-2 by
0.34-0.39 sd (0.38-0.43): the looser rule is kept to the D the tuning families covered."""

PREDICTIVE_INNER_TOL = 1e-6
"""A multi-class model's predictive: its CVI runs at the draws of q stop at ``max(inner_tol, PREDICTIVE_INNER_TOL)``
(the relative change of the bound; q itself is fitted before, at ``inner_tol``; binary models:
:data:`BINARY_PREDICTIVE_INNER_TOL`). On the tuning families, against ``inner_tol`` 1e-9 (binary at this tolerance too):
the test probabilities moved by at most 1.2e-5 / 3.9e-5 / 1.3e-5 (xor N = 400, clf8 N = 200, spirals N = 100) with
193 -> 139, 323 -> 230, 211 -> 153 inner steps for the 32 draws; multi-class (mc_clf, K = 4, N = 100) by at most
1.1e-4 with 629 -> 350 steps."""

BINARY_PREDICTIVE_INNER_TOL = 1e-4
"""The same for a binary model: its predictive's CVI runs stop at ``max(inner_tol, BINARY_PREDICTIVE_INNER_TOL)``
(1e-6 before issue 59's third pass). On the tuning families, the same 32 draws of the fitted q at 1e-4 against
1e-6 (``benchmarks/studies/results/bayes_predictive_h59c.md``): the test probabilities moved by at most 5.7e-5 /
1.4e-4 / 1.2e-4 / 1.2e-4 / 1.5e-4 (xor N = 100, spirals N = 200, clf8 N = 100, checkerboard N = 200, xor N = 400;
far below the predictive's Monte Carlo error and its distance from NUTS's, 0.007-0.011 on the reference sets) with
157 -> 105, 180 -> 116, 219 -> 157, 160 -> 107, 139 -> 85 inner steps for the 32 draws. Multi-class keeps :data:`PREDICTIVE_INNER_TOL`: at 1e-4 mc_clf's (K = 4,
N = 100) moved by up to 5.2e-3."""

EP_VALUE_TOL = 1e-2
"""Binary EP's stopping rule where only the evidence is wanted in the engine's phase (the final bound estimate's draws;
:attr:`EPEvidenceTarget.value_tol <gpvi.inference.cvi.ep_evidence.EPEvidenceTarget.value_tol>`): the evidence is
stationary in the sites at EP's fixed point, so its error is second order in theirs. On the tuning families, the
same 100 draws of the fitted q at 1e-2 against 1e-3: the bound estimate moved by 5e-5 / 1.4e-3 / 2.3e-4 / 1e-4 nats
(xor N = 400, clf8 N = 200, spirals N = 200, xor N = 100; 0.002-0.017 of its standard error) with 1.8 -> 1.0, 4.6
-> 2.8, 2.1 -> 1.0, 1.9 -> 1.0 sweeps per evaluation; at 3e-2 clf8's moved by 0.17 standard errors. Multi-class
keeps its tolerance (mc_clf, K = 4: 5.7e-3 nats, 0.13 standard errors, at 1e-2). q and the predictions do not use
these evaluations; the default bound (:data:`BOUND_DRAWS`) no longer makes them (an engine given with a number
does)."""

EP_MAP_GTOL, EP_MAP_FTOL = 1e-3, 1e-6
"""L-BFGS-B's tolerances of the EP MAP search (the start of the engine; 1e-6 and 1e-10 before issue 59). The study
``benchmarks/studies/ep_map_tol.py`` measured them: q moved by at most 2.3e-4 of its sds on Pima, Ripley, synth4,
synth6, iris and synth10b with 2-6x fewer search evaluations (``benchmarks/studies/results/ep_map_tol_*.md``);
rechecked on the tuning families of issue 59: xor N = 400 / clf8 N = 200 / mc_clf K = 4 N = 100, q moved by 9e-6 /
4e-5 / 8e-13 of its sds, 514 -> 511, 933 -> 929, 737 -> 723 EP evaluations in the whole fit."""


class FullyBayesianCVI:
    r"""Fit :math:`q(\theta)\,q^*(\mathbf f\mid\theta)` to a latent GP model: MAP-II, Laplace scale, a Gaussian
    variational engine (module docstring).

    Parameters
    ----------
    engine : SKGaussian or DSVI, optional
        The engine for :math:`q(\theta)`, started at the MAP-II point with the Laplace scale. Default for a binary
        model: ``SKGaussian(num_steps=max(100, min(200, 25 D), 4 D), method="gradient", num_draws=4,
        draws="sobol", num_elbo_draws="window", seed=seed)``, Salimans & Knowles' Hessian-free stochastic linear
        regression (section 6.2; D the number of log-hyperparameters: the averaged second half then holds at least
        4 D antithetic pairs, and 100 steps where D <= 4) with randomised quasi-Monte Carlo draws (the rule and
        its accuracy against long NUTS runs: ``benchmarks/results/classification_bayes_speed_*.md``); the same
        for a multi-class model (``benchmarks/results/multiclass_bayes_v2*.md``). Where the default run's
        averaged precision is not positive definite the fit reruns it with twice
        the steps from its last valid :math:`q_t` (:meth:`retry_engine`), and only if that fails too runs
        :meth:`fallback_engine`. Every
        evaluation of the target costs a CVI run, so the engine that needs the fewest is the default: on the
        N = 100 subsamples of ``benchmarks/classification_bayes.py`` S&K reaches a bound as high as DSVI-Natural's
        within its standard error, with the same q, in a third to a twenty-sixth of the target evaluations
        (``benchmarks/results/classification_bayes.md``). Where the posterior is informative in many dimensions
        the default can stop short (the Sonar subsample under ``prior="scaled"``, D = 61:
        ``benchmarks/results/classification_nuts_ref_scaled.md``); pass an engine with more steps there.
    prior : "default", "scaled" or torch.distributions.Distribution
        Prior on the log-hyperparameters (default independent :math:`\mathcal N(0, 10)`; ``"scaled"``: the same
        variance centred at the model's data-scaled start, :func:`gpvi.models.priors.resolve_prior`). ``None`` is
        refused: a flat prior on the log-hyperparameters is improper here (the bound tends to a constant as a
        lengthscale grows without limit), so :math:`q(\theta)` would have nothing to settle on.
    cvi : CVI, optional
        The engine of the inner CVI runs and of MAP-II. Binary default ``CVI(beta=0.7, progress_bar=False)``: the
        inner runs are ELBO-monotone (:func:`~gpvi.inference.cvi.inner.converge_sites` halves the step where a
        full step would lower the ELBO), and a longer step than CVI's default 0.5 reaches ``inner_tol`` in fewer
        steps (measured per draw of :math:`q` at tolerance 1e-9: Pima 8.2 steps at beta 0.8, 14 at 0.5; a
        24-point 1-D set 19 at 0.7, 27 at 0.5 and 26 at 1.0, where beta = 1 keeps backtracking). Multi-class
        default: ``CVI(progress_bar=False)`` (its own default step, 0.5).
    inner_tol : float
        Inner CVI tolerance of the DSVI phase (default 1e-9: gradient error about 1e-5 relative, far below the
        Monte Carlo noise of DSVI's gradient); the predictive's runs use ``max(inner_tol, 1e-4)`` for a binary
        model (:data:`BINARY_PREDICTIVE_INNER_TOL`), ``max(inner_tol, 1e-6)`` for a multi-class one
        (:data:`PREDICTIVE_INNER_TOL`). The Laplace scale uses ``min(inner_tol, 1e-12)`` (finite
        differences of the gradient need it accurate).
    num_draws : int
        Draws of :math:`\theta` in the predictive mixture (default 32).
    evidence : {"auto", "ep", "cvi"}
        What stands in for :math:`\log p(\mathbf y\mid\theta)` in :math:`q(\theta)`'s target. ``"auto"``
        (default): ``"ep"`` wherever EP applies -- binary models and multi-class softmax models -- and ``"cvi"``
        otherwise (robust-max). ``"ep"``: EP's approximation :math:`\log Z_{EP}(\theta)`
        (:class:`~gpvi.inference.cvi.ep_evidence.EPEvidenceTarget`); the run then moves from the CVI MAP-II point to the
        maximiser of :math:`\log Z_{EP} + \log p(\theta)` (L-BFGS-B) and takes the Laplace scale there.
        ``"cvi"``: the profiled CVI bound (:class:`~gpvi.inference.cvi.bound.CVIBoundTarget`),
        a lower bound whose gap grows with the signal variance, so its :math:`q(\theta)` sits at too small signal
        variances where the likelihood saturates (measured against long NUTS runs in
        ``benchmarks/classification_nuts_ref.md``: on Ionosphere 1.5 posterior sds too low). Either way the latent
        posterior at each draw is CVI's :math:`q^*(\mathbf f\mid\theta)`. Multi-class: ``"ep"`` (softmax, else
        ``ValueError``) is multi-class EP with a full K x K site per point
        (:func:`gpvi.numerics.ep_multiclass.multiclass_ep`, Anderson-accelerated; tilted moments by nested
        quadrature for K <= 3, by a shifted quasi-Monte Carlo rule in the differences for K >= 4); ``"cvi"`` the
        profiled bound of the class-factorised family (:class:`~gpvi.inference.cvi.bound.CVIBoundTarget`), with the
        same caveat. Measured against NUTS over :math:`(\theta, V)` on iris and wine
        (``benchmarks/results/multiclass_bayes_v2_iris_wine.md``): on EP, every q(theta) mean within
        0.14 / 0.11 NUTS sd, test probabilities 0.0030 / 0.0098 from NUTS's (MAP-II: 0.0050 / 0.0100), test log
        loss 0.0429 / 0.0645 (MAP-II 0.0475 / 0.0750, NUTS 0.0456 / 0.0793); on the bound
        (``multiclass_bayes_iris.md``, ``..._wine.md``), the log signal variance 0.97 / 1.66 NUTS sd too low,
        test probabilities 0.0075 / 0.0120 from NUTS's. With K = 4, 6, 10 and 10 (synthetic sets synth4,
        synth6, synth10, synth10b, N = 100 / 90 / 100 / 100; ``multiclass_ep_rule_synth10b.md``,
        ``..._synth10.md``), on EP: every mean within 0.37 / 0.09 / 0.13 / 0.27 NUTS sd, all four largest in the
        log signal variance, too low (MAP-II: 1.10 / 0.84 / 1.19 / 1.65), test probabilities 0.013 / 0.009 / 0.005
        / 0.007 from NUTS's, q's sds 0.82-1.00 of NUTS's (EP is :math:`O((N(K-1))^3)` per sweep; wall times in
        ``docs/results.md``). They are not the quasi-Monte Carlo rule's error (with twice its points the means
        move by at most 0.02 sd, :data:`gpvi.numerics.ep_multiclass.NUM_DRAWS`). At K = 10 q sits on EP's own
        posterior over theta (importance-reweighted: -0.12 / -0.32 NUTS sd in the log signal variance), so that
        offset is EP's evidence; on synth4 EP's posterior is at -0.17 +- 0.11 and the exact one (pseudo-marginal
        importance sampling) at -0.12 +- 0.12, so most of q's -0.37 there is the Gaussian family fitted to a
        skewed posterior (``multiclass_ep_reweight_*.md``).
    ep_tol : float, optional
        EP's stopping rule with ``evidence="ep"`` in the engine's evaluations
        (:class:`~gpvi.inference.cvi.ep_evidence.EPEvidenceTarget`'s ``tol``; default 1e-3, and
        :data:`BINARY_EP_TOL` = 3e-3 for a binary model with at most 10 log-hyperparameters); the EP MAP search and
        the Laplace scale use ``min(ep_tol, 1e-6)`` (finite differences of the gradient need it accurate). Binary:
        at 1e-3 rather than 1e-4, q moved by at most 0.002 of its sds on the Pima and Ripley subsamples (seeds
        0-2) and 0.03 / 0.002 on Ionosphere / Sonar (held out), its largest distance from the long NUTS runs' means
        stayed 0.23-0.24 / 0.03-0.04 / 0.08 / 0.03 NUTS sd and its test probabilities' distance from NUTS's
        0.0065-0.0151 (unchanged in the fourth decimal), with 20% fewer EP sweeps per evaluation (4.4 -> 3.5 on
        Pima, 5.7 -> 4.5 on Ripley, 7.0 -> 5.6 on Ionosphere); at 1e-2 Ionosphere's q moved by 0.56 sd (0.60 NUTS
        sd from NUTS's means) (``benchmarks/results/classification_bayes_speed_tol59*.md``). Multi-class EP
        costs :math:`O((N(K-1))^3)` a sweep (measured with the quasi-Monte Carlo rule in the
        K values, before 1.0's rule in the differences): on the K = 4 set of
        ``benchmarks/multiclass_bayes.py`` (8 draws of q(theta), warm-started from the sites at q's mean) 1e-4 /
        1e-3 / 1e-2 took 6.6 / 4.9 / 3.5 sweeps against 12.8 at 1e-8, with the log evidence within 1e-5 / 1.3e-4 /
        2e-3 and the gradient times q's sds within 0.002 / 0.031 / 0.23 (components up to 3.1). Chosen there;
        held out, the fit at 1e-3 moved q's means from the fit at 1e-4 by 0.008 / 0.007 / 0.031 / 0.119 NUTS sd
        (synth6, synth10, iris, wine; on wine its largest distance from NUTS's means fell from 0.106 to 0.085 sd)
        and its test probabilities by at most 8e-4 on average, with 20-27% fewer sweeps
        (``benchmarks/results/multiclass_bayes_v3_tol.md``).
    ep_bank : int
        EP in the engine's evaluations (``evidence="ep"``) starts from sites predicted by the converged sites
        of the last ``ep_bank`` evaluations (default 512; :meth:`EPEvidenceTarget.start_from_neighbours
        <gpvi.inference.cvi.ep_evidence.EPEvidenceTarget.start_from_neighbours>`, :mod:`gpvi.inference.cvi.ep_starts`),
        binary EP undamped for up to 10 sweeps; 0: every evaluation from the EP MAP point's sites, damped, as
        before (the returned target is reset so). The same stopping rule, in fewer sweeps: against ``ep_bank=0``
        on the N = 100 subsamples with long NUTS references
        (``benchmarks/results/classification_bayes_speed_bank59*.md``, ``..._final59.md``) q moved by at most 0.002
        of its sds on Pima and Ripley (seeds 0, 1) and 0.033 / 0.002 on Ionosphere / Sonar (held out), its
        distance from NUTS's means (0.23 / 0.03 / 0.08 / 0.03 NUTS sd) and its test probabilities' distance from
        NUTS's unchanged at the precision reported, with 3.5 -> 2.9 (Pima),
        4.5 -> 3.1 (Ripley), 5.6 -> 5.5 (Ionosphere), 2.8 -> 1.9 (Sonar) EP sweeps per evaluation. Multi-class EP
        starts from the nearest earlier evaluation's sites, at its own damping: on the tuning family mc_clf (K = 4,
        N = 100) 6.61 -> 5.69 sweeps per evaluation, q's means within 0.007 of its sds; on synth4 every mean's
        distance from NUTS's and the test probabilities' (0.0129 against 0.0128) unchanged
        (``benchmarks/results/multiclass_bayes_h59b_synth4_merged.md``). The evidence then depends on the earlier
        evaluations within EP's tolerance (a seeded run still repeats bit for bit).
    importance : bool, optional
        Try :class:`~gpvi.inference.cvi.importance.ImportanceGaussian` first where no ``engine`` is given, the model
        has at most 4 log-hyperparameters and the evidence is EP's (binary or, :data:`MULTICLASS_IMPORTANCE`,
        multi-class; default :data:`IMPORTANCE`, True):
        two rounds of importance sampling from the Laplace start (128 EP evaluations without gradients), q the
        weighted draws' moment-matched Gaussian, accepted where PSIS's k-hat and ESS allow, else the engine runs
        as it would without it (``info["importance"]``: the record, ``accepted``).
    cubature : bool, optional
        Try :class:`~gpvi.inference.cvi.cubature.CubatureGaussian` first where no ``engine`` is given, the model is
        binary with at most 4 log-hyperparameters and the evidence is EP's (default :data:`CUBATURE`, False: less
        accurate than S&K against NUTS): a deterministic fixed point of the same bound in about 100 EP evaluations,
        accepted where 16 antithetic Monte Carlo pairs agree, else S&K follows (``info["cubature"]``).
    seed : int
        Seed of DSVI (when ``dsvi`` is not given) and of the predictive draws.
    progress_bar : bool

    Examples
    --------
    >>> import torch, gpvi
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(20, 1, generator=g, dtype=torch.float64)
    >>> y = (X[:, 0] + 0.5 * torch.randn(20, generator=g, dtype=torch.float64) > 0).double()
    >>> post = FullyBayesianCVI(num_draws=8).run(gpvi.GPClassification(X, y))
    >>> post.info["engine"], post.mean.shape, post.predict_proba(X[:3]).shape
    ('ImportanceGaussian', torch.Size([2]), torch.Size([3]))

    DSVI instead (the Natural rule, stopped by its convergence rule):

    >>> from gpvi.inference.dsvi import DSVI, Natural, Convergence
    >>> fit = FullyBayesianCVI(DSVI(optimizer=Natural(), num_steps=100, num_elbo_draws=20, progress_bar=False,
    ...                             convergence=Convergence(stop=False)), num_draws=8)
    >>> fit.run(gpvi.GPClassification(X, y)).info["engine"]
    'DSVI'
    """

    def __init__(self, engine: Any = None, *, prior: Any = "default", cvi: Any = None, inner_tol: float = 1e-9,
                 num_draws: int = 32, evidence: str = "auto", ep_tol: float | None = None, ep_bank: int = 512,
                 cubature: bool | None = None, importance: bool | None = None, seed: int = 0,
                 progress_bar: bool = False) -> None:

        self.seed = check_seed(seed)
        self.progress_bar = check_bool(progress_bar, "progress_bar")
        if engine is not None and not isinstance(engine, (DSVI, SKGaussian)):
            raise TypeError(f"engine must be a gpvi.SKGaussian or gpvi.DSVI engine; got {type(engine).__name__}")
        if cvi is not None and not isinstance(cvi, CVI):
            raise TypeError(f"cvi must be a gpvi.CVI engine; got {type(cvi).__name__}")
        self.engine = engine
        self.cvi = cvi
        if check_prior_choice(prior) is None:
            raise ValueError("prior=None is an improper (flat) prior on the log-hyperparameters, and q(theta) has "
                             "no proper posterior to approximate; give 'default', 'scaled' or a distribution with "
                             "log_prob")
        self.prior = prior
        self.inner_tol = float(inner_tol)
        if not self.inner_tol > 0:
            raise ValueError(f"inner_tol must be > 0; got {inner_tol!r}")
        self.num_draws = check_positive_int(num_draws, "num_draws")
        self.evidence = check_choice(evidence, "evidence", ["auto", "ep", "cvi"])
        self.ep_tol = None if ep_tol is None else check_positive(ep_tol, "ep_tol")
        self.ep_bank = check_nonnegative_int(ep_bank, "ep_bank")
        self.cubature = CUBATURE if cubature is None else check_bool(cubature, "cubature")
        self.importance = IMPORTANCE if importance is None else check_bool(importance, "importance")

    def __repr__(self) -> str:
        return (f"FullyBayesianCVI({self.engine!r}, inner_tol={self.inner_tol:g}, num_draws={self.num_draws}, "
                f"evidence={self.evidence!r})")

    def _setup(self, model: Any) -> tuple[Any, str]:
        """``(cvi engine, evidence)`` for ``model`` (binary or multi-class);
        ``ValueError`` where the settings do not fit the model."""
        if _is_multiclass(model):
            if self.evidence == "ep" and not multiclass_ep_applies(model):
                raise ValueError("evidence='ep' on a multi-class model needs the softmax likelihood (robust-max has "
                                 "no EP evidence here); use 'cvi' or 'auto'")
            cvi = self.cvi if self.cvi is not None else CVI(progress_bar=False)
            evidence = self.evidence
            if evidence == "auto":
                evidence = "ep" if multiclass_ep_applies(model) else "cvi"
            return cvi, evidence
        if self.cvi is not None and not isinstance(self.cvi, CVI):
            raise TypeError(f"a binary model needs cvi=CVI(...); got {type(self.cvi).__name__}")
        cvi = self.cvi if self.cvi is not None else CVI(beta=0.7, progress_bar=False)
        return cvi, ("ep" if self.evidence == "auto" else self.evidence)

    def default_engine(self, dim: int) -> Any:
        """The default engine for D = ``dim`` log-hyperparameters (see the class docstring)."""

        D = int(dim)
        return SKGaussian(num_steps=max(100, min(200, 25 * D), 4 * D), method="gradient", num_draws=4,
                          draws="sobol", num_elbo_draws=BOUND_DRAWS, seed=self.seed, progress_bar=self.progress_bar)

    def retry_engine(self, engine: SKGaussian) -> SKGaussian:
        """The default engine with twice the steps (a step :math:`\\sqrt 2` smaller, a window twice as long): run
        from the last valid :math:`q_t` of a default run whose window-averaged precision was not positive
        definite (``info["engine_retry"]`` says why). At the KL-optimal Gaussian the expected negative Hessian of
        the target is that Gaussian's precision, positive definite, so an indefinite window average is Monte Carlo
        noise or a window still far from the optimum; a smaller step and a longer window from the last
        :math:`q_t` address both, at twice the default run's cost rather than DSVI's (the old fallback, about 20
        times the default run on the set of issue 41)."""

        return SKGaussian(num_steps=2 * engine.num_steps, method=engine.method, num_draws=engine.num_draws,
                          draws=engine.draws, num_elbo_draws=engine.num_elbo_draws, seed=self.seed,
                          progress_bar=self.progress_bar)

    def fallback_engine(self) -> Any:
        """DSVI-Natural with its convergence rule: run when the default S&K run and its :meth:`retry_engine` run
        both fail with :class:`~gpvi.exceptions.NumericalFaultError` (``info["engine_fallback"]`` says why)."""

        return DSVI(scale="full", optimizer=Natural(), num_draws=4, convergence=Convergence(gap_tol=0.05),
                    num_elbo_draws=100, seed=self.seed, progress_bar=self.progress_bar)

    def run(self, model: Any, init: Any = None) -> BayesClassificationPosterior:
        r"""Fit :math:`q(\theta)` and build the predictive.

        Parameters
        ----------
        model : LatentGP
            :class:`gpvi.GPClassification` or :class:`gpvi.models.multiclass.GPMulticlass`.
        init : LatentPosterior, optional
            A MAP-II posterior to start from (a :class:`~gpvi.inference.cvi.typeii.TypeII` result with the same
            prior); default: one is computed.

        Raises
        ------
        KeyboardInterrupt
            When that start was interrupted (Ctrl-C during the default MAP-II run, or an ``init`` flagged
            ``info["interrupted"]``): nothing after it runs, as NUTS re-raises an interruption before its first
            draw (before, the fit went on from the partial start and did not say so).

        Returns
        -------
        BayesClassificationPosterior
            ``info`` (a :class:`~gpvi.posteriors.info.RunInfo`: ``engine``, ``converged`` and ``steps`` of the
            engine that fitted q(θ), ``time_s`` of the whole fit; details): ``map_theta``, ``map_objective`` (MAP-II on the CVI bound), ``evidence``, with
            ``evidence="ep"`` also ``ep_map_theta``, ``ep_map_objective``, ``ep_map_time_s`` (the start of the
            engine), ``ep_counters`` (EP's evaluations, sweeps, failures, unconverged rows; multi-class also
            Anderson restarts) and ``ep_tol`` (EP's tolerance in the engine's evaluations); ``laplace`` (what the
            Laplace step did), the times
            ``map_time_s``, ``laplace_time_s``, ``q_time_s`` (the engine's run), ``predictive_time_s``, ``time_s``
            (all), ``engine`` (its name), ``engine_retry`` (None, or why the default S&K run was rerun by
            :meth:`retry_engine`), ``engine_fallback`` (None, or why it was replaced by
            :meth:`fallback_engine`), ``q_steps``, ``q_converged`` and the target's counters
            (``evaluations``, ``inner_steps``, ``failures``); ``predictive_inner_steps`` (the inner CVI steps of the
            predictive's draws).
        """


        refuse_weights(model, "FullyBayesianCVI")
        cvi, evidence = self._setup(model)
        t0 = time.perf_counter()
        if init is None:
            init = TypeII(cvi, prior=self.prior).run(model)
        if init.info.get("interrupted"):                  # Ctrl-C in the start: stop, as NUTS does in warm-up
            raise KeyboardInterrupt("FullyBayesianCVI was interrupted during its MAP-II start (or was given an "
                                    "interrupted one as init); nothing after it ran. Run TypeII(...).run(model) "
                                    "to the end and pass its result as init=")
        t_map = time.perf_counter() - t0
        theta_map = init.theta.detach().clone()
        bound = CVIBoundTarget(model, self.prior, cvi=cvi, inner_tol=min(self.inner_tol, 1e-12))
        t1 = time.perf_counter()
        # the anchor: MAP-II's sites re-converged tightly (TypeII's final sites stop at the engine's own tolerance)
        bound.set_anchor(theta_map, init.lam1, init.lam2)
        extra: dict[str, Any] = {"evidence": evidence}
        target, theta_start = bound, theta_map
        if evidence == "ep":
            target, theta_start, ep_info = self._ep_start(bound, theta_map, min(self._ep_tol(model), 1e-6))
            extra.update(ep_info)
        C0, how = laplace_scale_at(target, theta_start)
        t_lap = time.perf_counter() - t1
        bound.inner_tol = self.inner_tol
        if evidence == "ep":
            target.tol = self._ep_tol(model)          # the engine's evaluations (the start used min(., 1e-6))
            target.start_from_neighbours(self.ep_bank)
            if not target.multiclass:             # the final bound estimate's evaluations (values only)
                target.value_tol = EP_VALUE_TOL
        engine = self.engine if self.engine is not None else self.default_engine(target.dim)
        start = init_to_value(theta_start, C0) if C0 is not None else init_to_value(theta_start)
        t2 = time.perf_counter()
        q, extra["importance"], extra["cubature"] = None, None, None
        on_ep = self.engine is None and evidence == "ep"        # the default engine on EP's evidence
        if self.importance and on_ep and (MULTICLASS_IMPORTANCE or not target.multiclass):
            q, extra["importance"] = try_importance(target, start, self.seed)   # None where D > 4 or it is rejected
            if q is None and extra["importance"] is not None:
                target.start_from_neighbours(self.ep_bank)    # the engine's run as without the draws
        if q is None and self.cubature and on_ep and not target.multiclass:
            q, extra["cubature"] = try_cubature(target, start, self.seed)   # None where D > 4 or it is rejected
        if q is not None:
            engine, retry, fallback = q.engine, None, None
        else:
            q, engine, retry, fallback = self._fit_q(engine, target, start)
        t_q = time.perf_counter() - t2
        map_obj = float(bound.log_joint(theta_map))
        if evidence == "ep":
            extra["ep_counters"], extra["ep_tol"] = dict(target.counters), target.tol
        info = {"map_theta": theta_map.tolist(), "map_objective": map_obj, "map_time_s": t_map, **extra,
                "laplace": {k: v for k, v in how.items() if k != "hessian"}, "laplace_time_s": t_lap,
                "engine": type(engine).__name__, "engine_retry": retry, "engine_fallback": fallback, "q_time_s": t_q,
                "converged": q.info.converged, "steps": q.info.steps, "q_steps": q.info.steps,
                "q_converged": q.info.converged,
                **{k: bound.counters[k] for k in ("evaluations", "inner_steps", "failures", "unconverged")}}
        steps0 = bound.counters["inner_steps"]
        floor = PREDICTIVE_INNER_TOL if _is_multiclass(model) else BINARY_PREDICTIVE_INNER_TOL
        bound.inner_tol = max(self.inner_tol, floor)                      # the predictive's CVI runs (q is fitted)
        post = BayesClassificationPosterior(q, target, num_draws=self.num_draws, seed=self.seed, info=info)
        post.info["predictive_inner_steps"] = bound.counters["inner_steps"] - steps0
        # the returned target evaluates as a function of theta again (fixed start, one tolerance)
        bound.inner_tol = self.inner_tol
        if evidence == "ep":
            target.start_from_neighbours(0)
            target.value_tol = None
        post.info["time_s"] = time.perf_counter() - t0
        return post

    def _fit_q(self, engine: Any, target: Any, start: Any) -> tuple[Any, Any, str | None, str | None]:
        """``(q, the engine that fitted it, retry, fallback)``: the engine's run; where the default S&K run fails
        (its window-averaged precision not positive definite, :class:`~gpvi.exceptions.NumericalFaultError`),
        :meth:`retry_engine` from the failed run's last valid :math:`q_t`, and only if that fails too
        :meth:`fallback_engine` from the start. A given ``engine``'s failure is raised."""
        try:
            return engine.run(target, init=start), engine, None, None
        except NumericalFaultError as err:
            if self.engine is not None:
                raise
            first = err
        # a noisy window: the same regression with a smaller step and a longer window, from the last valid q_t
        retry = f"SKGaussian failed ({str(first)[:120]}); rerun with {2 * engine.num_steps} steps from its last q_t"
        warnings.warn(f"FullyBayesianCVI: {retry}", NumericalWarning, stacklevel=3)
        longer = self.retry_engine(engine)
        try:
            warm = first.partial if first.partial is not None else start
            return longer.run(target, init=warm), longer, retry, None
        except NumericalFaultError as err:
            fallback = f"SKGaussian failed twice ({str(err)[:120]}); DSVI-Natural from the same start"
        warnings.warn(f"FullyBayesianCVI: {fallback}", NumericalWarning, stacklevel=3)
        engine = self.fallback_engine()
        return engine.run(target, init=start), engine, retry, fallback

    def _ep_tol(self, model: Any) -> float:
        """EP's tolerance in the engine's evaluations: ``ep_tol``, by default :data:`BINARY_EP_TOL` for a binary
        model with at most 10 log-hyperparameters and 1e-3 otherwise (class docstring)."""
        if self.ep_tol is not None:
            return self.ep_tol
        return BINARY_EP_TOL if not _is_multiclass(model) and len(model.names) <= PLANE_MAX_DIM else 1e-3

    def _ep_start(self, bound: Any, theta_map: torch.Tensor, tol: float
                  ) -> tuple[Any, torch.Tensor, dict[str, Any]]:
        """The EP target at tolerance ``tol``, its MAP point (L-BFGS-B from the CVI MAP-II point; the start of the
        engine) and what the search recorded."""

        target = EPEvidenceTarget(bound, tol=tol)
        t0 = time.perf_counter()
        fit = lbfgs_maximise(target.log_joint, theta_map, bounds=(-25.0, 25.0), gtol=EP_MAP_GTOL, ftol=EP_MAP_FTOL,
                             device=target.device)
        theta = torch.as_tensor(fit.x, dtype=torch.float64, device=target.device)
        if not bool(torch.isfinite(theta).all()) or not math.isfinite(float(fit.value)):
            theta = theta_map
        target.warm_from(theta)    # the engine's draws sit around this point: EP starts from its sites (ep_warm_start)
        return target, theta, {"ep_map_theta": theta.tolist(), "ep_map_objective": float(target.log_joint(theta)),
                               "ep_map_time_s": time.perf_counter() - t0}


def _is_multiclass(model: Any) -> bool:
    """Whether ``model``'s likelihood is a multi-class one (softmax, robust-max)."""
    return bool(getattr(getattr(model, "likelihood", None), "multiclass", False))
