r"""``gpvi.infer``: one call from a target to a hyperparameter posterior whose reliability has been checked.

The recipe (Yao, Vehtari, Simpson & Gelman, *Yes, but did it work?*, ICML 2018; Vehtari et al., *Pareto smoothed
importance sampling*, JMLR 2024):

1. **Variational fit**: DSVI's default Gaussian q (Titsias & Lázaro-Gredilla 2014; for exact GP regression its
   MAP/Laplace start, natural-gradient steps and convergence stop).
2. **Diagnosis**: PSIS of q against the exact (Cholesky) log joint gives :math:`\hat k`
   (:func:`gpvi.posteriors.weighted.psis`).
3. **Answer**: q itself if :math:`\hat k \le 0.5`; the PSIS-weighted draws if :math:`0.5 < \hat k \le 0.7`;
   otherwise NUTS warm-started from q (chains start at draws of q, q's covariance is the inverse mass matrix, only
   the step size is adapted), whose draws are the answer.

The returned posterior carries a :class:`InferenceReport` as ``.report``: :math:`\hat k`, the bound and its
convergence, which answer was chosen and why, and the wall time of each stage.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..rng import check_seed
from ..validation import check_bool, check_nonnegative_int, check_positive, check_positive_int

__all__ = ["infer", "InferenceReport"]


@dataclass
class InferenceReport:
    """What :func:`infer` did and why (prints as one screen; renders as HTML in notebooks).

    Attributes
    ----------
    answer : {"q", "psis", "nuts"}
        Which posterior was returned.
    reason : str
    khat : float
        Pareto :math:`\\hat k` of q's importance weights.
    elbo, elbo_se : float
        DSVI's final bound and its Monte Carlo standard error.
    converged : bool
        DSVI's convergence rule held.
    log_evidence, log_evidence_se : float
        Importance-sampling estimate of :math:`\\log p(y)` from q's draws (reliable only when ``khat`` is small).
    psis_ess : float
        Effective sample size of the PSIS weights.
    q : GaussianPosterior
        The variational posterior that was diagnosed (whatever the answer).
    times : dict of str to float
        Wall time (s) of each stage: ``dsvi``, ``psis``, ``nuts`` (when run).
    nuts : dict
        NUTS diagnostics when it ran: smallest bulk ESS, largest split R-hat, divergences, gradient evaluations.
    starts : list of dict
        DSVI's starts (one per distinct MAP optimum; ``q.info["starts"]``): MAP log joint, final bound, its se.
    starts_agree : bool or None
        Whether the starts' final bounds agree within their Monte Carlo error (``q.info["starts_agree"]``).
    """

    answer: str
    reason: str
    khat: float
    elbo: float
    elbo_se: float
    converged: bool
    log_evidence: float
    log_evidence_se: float
    psis_ess: float
    times: dict[str, float] = field(default_factory=dict)
    nuts: dict[str, Any] = field(default_factory=dict)
    starts: list[dict[str, Any]] = field(default_factory=list)
    starts_agree: bool | None = None
    q: Any = field(default=None, repr=False)

    def lines(self) -> list[str]:
        out = [f"gpvi.infer: answer = {self.answer} ({self.reason})",
               f"  DSVI bound {self.elbo:.3f} +- {self.elbo_se:.3f} (converged: {self.converged})"
               + self._starts_line(),
               f"  PSIS k-hat {self.khat:.2f}, weights' ESS {self.psis_ess:.0f}, "
               f"log evidence {self.log_evidence:.3f} +- {self.log_evidence_se:.3f}"]
        if self.nuts:
            out.append("  NUTS from q: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                                     for k, v in self.nuts.items()))
        out.append("  wall time: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.times.items())
                   + f" (total {sum(self.times.values()):.1f} s)")
        return out

    def _starts_line(self) -> str:
        if len(self.starts) < 2:
            return ""
        bounds = ", ".join(f"{r['elbo']:.2f}" for r in self.starts)
        verdict = "they agree" if self.starts_agree else "they differ: the best is kept"
        return f"; {len(self.starts)} starts (distinct MAP optima), bounds {bounds}: {verdict}"

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        import html
        rows = "".join(f"<li>{html.escape(x.strip())}</li>" for x in self.lines()[1:])
        return f"<b>{html.escape(self.lines()[0])}</b><ul>{rows}</ul>"


def _mixed(d: dict[str, Any], min_ess: float) -> bool:
    """The chains' diagnostics ``d`` meet the targets: every bulk ESS >= ``min_ess`` and R-hat <= 1.01."""
    return bool((d["ess_bulk"] >= min_ess).all()) and bool((d["r_hat"] <= 1.01).all())


def _choose(khat: float) -> tuple[str, str]:
    from ..posteriors.weighted import KHAT_GOOD, KHAT_USABLE
    if math.isfinite(khat) and khat <= KHAT_GOOD:
        return "q", f"k-hat {khat:.2f} <= {KHAT_GOOD}: the variational q is close to the posterior"
    if math.isfinite(khat) and khat <= KHAT_USABLE:
        return "psis", (f"{KHAT_GOOD} < k-hat {khat:.2f} <= {KHAT_USABLE}: q is off, its PSIS-weighted draws "
                        "are reliable")
    return "nuts", f"k-hat {khat:.2f} > {KHAT_USABLE}: q and its weights are unreliable; NUTS warm-started from q"


def infer(target: Any, *, seed: int = 0, num_psis_draws: int = 1000, engine: Any = None, nuts: Any = None,
          min_ess: float = 400.0, max_extensions: int = 3, progress_bar: bool = True) -> Any:
    r"""A posterior over the target's parameters that has been checked against the exact log joint.

    Parameters
    ----------
    target : model or target
        E.g. :class:`gpvi.GPRegression` (parameters: kernel log-hyperparameters); anything with ``names`` and a
        batched ``log_joint``.
    seed : int
        Seed of every stage (DSVI, PSIS draws, NUTS).
    num_psis_draws : int
        Draws of q for PSIS (default 1000).
    engine : {"dsvi", "sk"} or engine, optional
        The variational engine. ``"dsvi"`` (default, also ``None``): ``gpvi.DSVI(scale="full", seed=seed)``, the
        best Gaussian from every distinct MAP optimum with the finish to 0.01 nats. ``"sk"``: Salimans-Knowles'
        Hessian-free variant (``SKGaussian(num_steps=max(250, 20 D), method="gradient", num_draws=4)``) from the
        best MAP optimum with its Laplace scale (DSVI's default start, its alternatives unused): in
        ``benchmarks/results/dsvi_best_gaussian.md`` it reaches the same or a better bound with several times
        fewer log-joint evaluations on GP hyperparameters; it has no stop rule of its own (N is fixed) and ends in
        a :class:`~gpvi.exceptions.NumericalFaultError` rather than a wrong answer when N is too small. An engine
        object is run as it is.
    nuts : optional
        The sampler used when :math:`\hat k > 0.7` (default ``gpvi.NUTS(num_chains=4, num_warmup=200,
        num_draws=500, seed=seed)``: a short warm-up suffices because q supplies the mass matrix).
    min_ess : float
        When NUTS runs: extend the chains (doubling the draws, exactly as an uninterrupted longer run) until the
        smallest bulk ESS reaches ``min_ess`` (default 400, 100 per chain for 4 chains) and split R-hat <= 1.01.
    max_extensions : int
        At most this many doublings (default 3); the report says when the target was not reached.
    progress_bar : bool

    Returns
    -------
    GaussianPosterior, WeightedPosterior or SamplePosterior
        With ``mean``, ``std``, ``summary()``, ``predict`` and the attribute ``report`` (:class:`InferenceReport`).

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
    from ..posteriors.weighted import psis
    from .dsvi.engine import DSVI
    from .mcmc.nuts import NUTS

    seed = check_seed(seed)
    num_psis_draws = check_positive_int(num_psis_draws, "num_psis_draws")
    min_ess = check_positive(min_ess, "min_ess", allow_zero=True)
    max_extensions = check_nonnegative_int(max_extensions, "max_extensions")
    progress_bar = check_bool(progress_bar, "progress_bar")
    init = None
    if engine is None or isinstance(engine, str):
        from ..validation import check_choice
        name = check_choice("dsvi" if engine is None else engine, "engine", ("dsvi", "sk"))
        engine = DSVI(scale="full", seed=seed, progress_bar=progress_bar)
        if name == "sk":
            from .sk.engine import SKGaussian
            init = engine.default_init(target)                 # DSVI's start: the MAP with its Laplace scale
            engine = SKGaussian(num_steps=max(250, 20 * len(target.names)), method="gradient", num_draws=4,
                                seed=seed, progress_bar=progress_bar)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    q = engine.run(target, init=init)
    times["dsvi"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                       # the report says what k-hat means
        w = psis(q, target, num_psis_draws, seed=seed)
    times["psis"] = time.perf_counter() - t0
    answer, reason = _choose(w.khat)
    report = InferenceReport(answer, reason, w.khat, float(q.elbo), float(getattr(q, "elbo_se", math.nan)),
                             bool(q.info.get("converged", False)), w.log_evidence, w.log_evidence_se, w.ess, times,
                             starts=[{k: v for k, v in r.items() if k != "theta"} for r in q.info.get("starts", [])],
                             starts_agree=q.info.get("starts_agree"), q=q)
    post: Any = q if answer == "q" else w
    if answer == "nuts":
        sampler = (NUTS(num_chains=4, num_warmup=200, num_draws=500, seed=seed, progress_bar=progress_bar)
                   if nuts is None else nuts)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")                   # judged below, after any extension
            post = sampler.run(target, init=q)
            d, ext = post.diagnostics(), 0
            while not _mixed(d, min_ess) and ext < max_extensions:
                sampler = copy.copy(sampler)
                sampler.num_draws = 2 * sampler.num_draws
                post = sampler.run(target, state=post.engine_state)
                d, ext = post.diagnostics(), ext + 1
        times["nuts"] = time.perf_counter() - t0
        report.nuts = {"draws per chain": int(post.draws.shape[1]), "extensions": ext,
                       "min ESS": float(d["ess_bulk"].min()), "max R-hat": float(d["r_hat"].max()),
                       "divergences": int(post.stats["diverging"].sum()),
                       "gradient evaluations": int(post.stats["n_steps"].sum())}
        if not _mixed(d, min_ess):
            report.reason += (f"; after {ext} extension(s) the chains still miss min ESS {min_ess:g} / R-hat 1.01: "
                              "run longer (sampler.run(target, state=post.engine_state) with more num_draws)")
    post.report = report
    return post
