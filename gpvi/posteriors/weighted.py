r"""Pareto-smoothed importance sampling (PSIS) of a variational posterior against the exact log joint.

For draws :math:`\theta_s \sim q` (:math:`s = 1..S`) the importance ratios are

.. math:: \log r_s = \log p(y, \theta_s) - \log q(\theta_s),

whose plain average estimates the evidence, :math:`\hat Z = \frac1S\sum_s r_s`, and whose normalised values weight
the draws towards the exact posterior. Pareto smoothing (Vehtari, Simpson, Gelman, Yao & Gabry, *Pareto smoothed
importance sampling*, JMLR 25, 2024) replaces the largest ratios by expected order statistics of a generalised Pareto
fit to the tail; the fitted shape :math:`\hat k` is the diagnostic (Yao, Vehtari, Simpson & Gelman, *Yes, but did it
work?*, ICML 2018): :math:`\hat k \le 0.5` q is close to the posterior and the weighted draws are reliable;
:math:`0.5 < \hat k \le 0.7` the weighted estimates are usable but the raw q is not; :math:`\hat k > 0.7` neither q nor
its importance weights can be trusted and the posterior should be sampled (NUTS warm-started from q).

The smoothing itself is ArviZ's (``arviz.psislw`` in ArviZ 0.x, ``arviz_stats`` from ArviZ 1.0 on), not ours. The
log joint is the target's batched (Cholesky) ``log_joint``, evaluated in chunks that respect the memory budget
(:class:`~gpvi.numerics.budget.MemoryBudget`).

Names: ``log_ratios`` = :math:`\log r_s`; ``log_weights`` = smoothed, normalised log weights
(:math:`\sum_s e^{\mathrm{lw}_s} = 1`); ``khat`` = :math:`\hat k`; ``ess`` = :math:`1/\sum_s w_s^2`.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch

from ..exceptions import NumericalWarning, PSISWarning
from ..models.target import call_log_joint
from ..numerics.budget import MemoryBudget
from ..rng import resolve_generator
from ..validation import check_positive_int
from .base import Posterior

__all__ = ["WeightedPosterior", "PSISWarning", "psis", "log_joint_at", "pareto_smooth", "verdict",
           "verdict_of_draws", "batch_mcse",
           "khat_threshold", "KHAT_GOOD", "KHAT_USABLE"]

KHAT_GOOD = 0.5
"""At or below: q itself is a good approximation (Yao et al. 2018)."""
KHAT_USABLE = 0.7
"""At or below: the PSIS-weighted estimates are reliable; above, sample the posterior instead."""


def pareto_smooth(log_ratios: np.ndarray) -> tuple[np.ndarray, float]:
    """Pareto-smoothed, normalised log weights and :math:`\\hat k` of 1-D log importance ratios, by ArviZ.

    Uses ``arviz.psislw`` (ArviZ 0.x) when it exists, else ``arviz_stats.base.array_stats.psislw`` (ArviZ >= 1.0,
    which takes the negated ratios). Non-finite ratios (a log joint of :math:`-\\infty`) get weight 0 and are left
    out of the tail fit. When the tail holds tied ratios (ratios bounded, taking few values: ArviZ's fit returns
    NaN weights) the raw normalised ratios are the weights.

    Parameters
    ----------
    log_ratios : ndarray of shape (S,)

    Returns
    -------
    log_weights : ndarray of shape (S,)
        :math:`\\log w_s` with :math:`\\sum_s w_s = 1` (``-inf`` where the ratio was not finite).
    khat : float
    """
    lr = np.asarray(log_ratios, dtype=np.float64)
    if lr.ndim != 1:
        raise ValueError(f"log_ratios must be 1-D; got shape {lr.shape}")
    ok = np.isfinite(lr)
    if ok.sum() < 2:
        raise ValueError(f"PSIS needs at least 2 finite log importance ratios; got {int(ok.sum())} of {lr.size}")
    import arviz as az                                           # imported on use: importing ArviZ takes seconds
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                          # ArviZ's own k-hat warning: ours is clearer
        if hasattr(az, "psislw"):
            lw_ok, khat = az.psislw(lr[ok].copy(), reff=1.0)
        else:                                                    # ArviZ >= 1.0
            from arviz_stats.base import array_stats
            lw_ok, khat = array_stats.psislw(-lr[ok], r_eff=1.0, axis=-1)
    lw_ok = np.asarray(lw_ok, dtype=np.float64)
    if not np.isfinite(lw_ok).all():                             # a tail of tied ratios: the Pareto fit degenerates
        raw = lr[ok]                                             # (bounded ratios): the raw weights need no smoothing
        lw_ok = raw - (raw.max() + np.log(np.exp(raw - raw.max()).sum()))
    out = np.full(lr.shape, -np.inf)
    out[ok] = lw_ok
    return out, float(np.asarray(khat))


class WeightedPosterior(Posterior):
    r"""Draws of a proposal q with PSIS weights towards the exact posterior (see the module docstring).

    Estimates are self-normalised importance-sampling averages,
    :math:`\hat{\mathrm E}[f] = \sum_s w_s f(\theta_s)`; quantiles invert the weighted empirical CDF (linear
    interpolation between weighted mid-points); ``sample(n)`` resamples the draws with probabilities :math:`w_s`.

    Attributes
    ----------
    draws : torch.Tensor of shape (S, D)
    log_weights : torch.Tensor of shape (S,)
        Smoothed, normalised.
    khat : float
        Pareto :math:`\hat k` of the ratios (smaller is better; see :data:`KHAT_GOOD`, :data:`KHAT_USABLE`).
    ess : float
        Effective sample size of the weights, :math:`1/\sum_s w_s^2`.
    log_evidence, log_evidence_se : float
        :math:`\log\hat Z = \log\frac1S\sum_s r_s` (raw ratios) and its delta-method standard error
        :math:`\mathrm{sd}(r)/(\sqrt S\,\bar r)`; compare with q's ``elbo`` (:math:`\le \log Z`).
    """

    kind = "weighted"

    def __init__(self, draws: torch.Tensor, log_weights: torch.Tensor, names: list[str], target: Any = None, *,
                 khat: float, log_evidence: float = math.nan, log_evidence_se: float = math.nan,
                 info: dict[str, Any] | None = None) -> None:
        super().__init__(names, target, info)
        if draws.dim() != 2 or draws.shape[1] != len(names):
            raise ValueError(f"draws must have shape (S, {len(names)}); got {tuple(draws.shape)}")
        if log_weights.shape != draws.shape[:1]:
            raise ValueError(f"log_weights must have shape ({draws.shape[0]},); got {tuple(log_weights.shape)}")
        self.draws = draws.detach().clone()
        self.log_weights = log_weights.detach().to(draws).clone()
        self.khat = float(khat)
        self.log_evidence = float(log_evidence)
        self.log_evidence_se = float(log_evidence_se)

    @property
    def weights(self) -> torch.Tensor:
        """Normalised weights :math:`w_s`, shape (S,)."""
        return torch.exp(self.log_weights)

    @property
    def ess(self) -> float:
        """Effective sample size :math:`1/\\sum_s w_s^2`."""
        return float(1.0 / (self.weights ** 2).sum())

    @property
    def mean(self) -> torch.Tensor:
        return self.weights @ self.draws

    @property
    def covariance(self) -> torch.Tensor:
        """Weighted covariance :math:`\\sum_s w_s(\\theta_s - \\hat\\mu)(\\theta_s - \\hat\\mu)^\\top`, (D, D)."""
        r = self.draws - self.mean
        return (r * self.weights[:, None]).T @ r

    @property
    def std(self) -> torch.Tensor:
        r = self.draws - self.mean
        return torch.sqrt(self.weights @ (r * r))

    def sample(self, n: int, generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
        """``n`` draws resampled with probabilities :math:`w_s` (with replacement)."""
        n = check_positive_int(n, "n")
        gen = resolve_generator(seed, generator)
        idx = torch.multinomial(self.weights.cpu(), n, replacement=True, generator=gen)
        return self.draws[idx.to(self.draws.device)]

    def _quantiles(self, probs: torch.Tensor) -> torch.Tensor:
        w = self.weights.cpu().numpy()
        x = self.draws.cpu().numpy()
        p = probs.cpu().numpy()
        out = np.empty((p.size, self.dim))
        for j in range(self.dim):
            order = np.argsort(x[:, j], kind="stable")
            ws = w[order]
            mid = np.cumsum(ws) - 0.5 * ws                       # weighted mid-point CDF
            out[:, j] = np.interp(p, mid, x[order, j])
        return torch.as_tensor(out, dtype=self.draws.dtype, device=self.draws.device)

    def _marginal(self, mean, sd):
        return [{"family": "weighted_empirical", "num_draws": int(self.draws.shape[0]), "ess": self.ess}
                for _ in range(self.dim)]

    def _predict_draws(self, num_draws, *, generator, seed):
        r"""``num_draws`` draws by systematic resampling (stratified, low variance): the mixture predictive over
        them approximates the :math:`w`-weighted mixture over all draws."""
        num_draws = check_positive_int(num_draws, "num_draws")
        gen = resolve_generator(seed, generator)
        u = (torch.arange(num_draws, dtype=torch.float64) + torch.rand((), generator=gen, dtype=torch.float64))
        u = u / num_draws
        cdf = torch.cumsum(self.weights.cpu(), 0)
        idx = torch.searchsorted(cdf, u.clamp(max=float(cdf[-1]) - 1e-15))
        return self.draws[idx.to(self.draws.device)]

    def _own_title(self) -> str:
        """k-hat, the weights' ESS and :func:`verdict`: on q when q was the proposal, else on the weighted draws."""
        S = int(self.draws.shape[0])
        if self.info.get("proposal") == "grid":                  # gpvi.inference.grid: quadrature weights
            return f"WeightedPosterior summary (lattice quadrature over {S} cells, weights' ESS {self.ess:.0f})"
        of_q = self.info.get("proposal", "GaussianPosterior") == "GaussianPosterior"
        return (f"WeightedPosterior summary (PSIS k-hat {self.khat:.2f}, ESS {self.ess:.0f} of {S}, "
                f"{verdict(self.khat) if of_q else verdict_of_draws(self.khat, S)})")

    def _arviz_draws(self, num_draws, seed):
        r"""``to_arviz``: at most :math:`\lfloor\mathrm{ESS}\rfloor` draws resampled with probabilities
        :math:`w_s`, as one chain. ArviZ reads exported draws as independent: 1,000 resampled draws of weights
        whose ESS is 99 would show a bulk ESS near 1,000, so no more than the weights' ESS are exported, and the
        InferenceData's ``attrs`` carry :math:`\hat k`, the weights' ESS and the resampling."""
        n = min(check_positive_int(num_draws, "num_draws"), max(1, int(math.floor(self.ess))))
        return self.sample(n, seed=seed).unsqueeze(0)

    def _arviz_extra(self) -> dict[str, Any]:
        S = int(self.draws.shape[0])
        if self.info.get("proposal") == "grid":
            return {"attrs": {"grid_cells": S, "weights_ess": self.ess,
                              "draws": f"resampled with replacement from {S} lattice cells by their quadrature "
                                       "weights, at most the weights' ESS of them: not independent posterior draws"}}
        return {"attrs": {"psis_khat": self.khat, "psis_ess": self.ess, "psis_num_draws": S,
                          "psis_proposal": str(self.info.get("proposal", "")),
                          "draws": f"resampled with replacement from {S} PSIS-weighted draws, at most the weights' "
                                   "ESS of them: not independent posterior draws"}}

    def _state(self) -> dict[str, Any]:
        return {"draws": self.draws, "log_weights": self.log_weights, "khat": self.khat,
                "log_evidence": self.log_evidence, "log_evidence_se": self.log_evidence_se}

    @classmethod
    def _from_state(cls, state, target, common):
        return cls(state["draws"], state["log_weights"], list(state["names"]), target, khat=state["khat"],
                   log_evidence=state["log_evidence"], log_evidence_se=state["log_evidence_se"],
                   info=common.get("info"))

    def __repr__(self) -> str:
        return (f"WeightedPosterior(D={self.dim}, draws={self.draws.shape[0]}, khat={self.khat:.3f}, "
                f"ess={self.ess:.1f}, log_evidence={self.log_evidence:.4f} +- {self.log_evidence_se:.4f})")


def khat_threshold(num_draws: int) -> float:
    r"""The largest :math:`\hat k` at which PSIS estimates from S draws are reliable (Vehtari et al. 2024,
    section 3.2.5): :math:`\min(1 - 1/\log_{10} S,\ 0.7)`; 0.67 at S = 1,000, 0.7 from S = 2,155 on."""
    num_draws = check_positive_int(num_draws, "num_draws")
    return min(1.0 - 1.0 / math.log10(max(num_draws, 11)), KHAT_USABLE)


def batch_mcse(w: WeightedPosterior, num_batches: int = 8) -> dict[str, torch.Tensor]:
    r"""Monte Carlo standard errors of a weighted posterior's means and sds from independent batches of its draws.

    The S draws (independent draws of the proposal) are cut into B contiguous batches; each batch's weights are
    renormalised, giving estimates :math:`\hat\mu_b, \hat\sigma_b` per parameter, and

    .. math:: \mathrm{mcse}(\hat\mu) = \mathrm{sd}_b(\hat\mu_b)/\sqrt B, \qquad
              \mathrm{mcse}(\hat\sigma) = \mathrm{sd}_b(\hat\sigma_b)/\sqrt B .

    Unlike the delta-method error :math:`\sqrt{\sum_s w_s^2(\theta_s-\hat\mu)^2}` this sees a heavy tail that
    one batch samples and another does not (one large weight moves one batch's estimate).

    Parameters
    ----------
    w : WeightedPosterior
    num_batches : int
        B (at least 2; default 8).

    Returns
    -------
    dict
        ``mean`` and ``std``: the batch MCSEs, shape (D,); ``ess_min``: the smallest batch's weights' ESS.
    """
    num_batches = check_positive_int(num_batches, "num_batches")
    if num_batches < 2 or w.draws.shape[0] < 2 * num_batches:
        raise ValueError(f"num_batches must be at least 2 and at most half the draws; got {num_batches}")
    means, sds, ess = [], [], []
    for x, lw in zip(torch.tensor_split(w.draws, num_batches), torch.tensor_split(w.log_weights, num_batches)):
        wb = torch.softmax(lw, 0)
        m = wb @ x
        means.append(m)
        sds.append(torch.sqrt(wb @ (x - m) ** 2))
        ess.append(float(1.0 / (wb ** 2).sum()))
    root = math.sqrt(num_batches)
    return {"mean": torch.stack(means).std(0) / root, "std": torch.stack(sds).std(0) / root, "ess_min": min(ess)}


def verdict(khat: float) -> str:
    """One phrase on what :math:`\\hat k` says (thresholds of Vehtari et al. 2024)."""
    if not math.isfinite(khat):
        return "k-hat not estimable"
    if khat <= KHAT_GOOD:
        return "q is reliable"
    if khat <= KHAT_USABLE:
        return "use the PSIS-weighted estimates, not raw q"
    return "unreliable: sample the posterior (NUTS from q)"


def verdict_of_draws(khat: float, num_draws: int) -> str:
    """:func:`verdict` for ``num_draws`` weighted draws of a proposal that is not q (a mixture): on the weighted
    draws alone, by :func:`khat_threshold` (q's own k-hat is not known from them)."""
    if not math.isfinite(khat):
        return "k-hat not estimable"
    if khat <= khat_threshold(num_draws):
        return "the weighted draws are reliable"
    return "unreliable: sample the posterior"


def log_joint_at(target: Any, theta: torch.Tensor, budget: Any = None) -> tuple[torch.Tensor, int]:
    """The target's log joint at the rows of ``theta`` (S, D), without gradients, in chunks that respect the memory
    budget (default :class:`~gpvi.numerics.budget.MemoryBudget` ()); returns ``(log_p (S,), rows per call)``."""
    budget = MemoryBudget() if budget is None else budget
    with torch.no_grad():
        chunk = budget.draws_per_call(target, max(int(theta.shape[0]), 1))
        parts = [call_log_joint(target, part, None).detach() for part in torch.split(theta, chunk)]
    return (torch.cat(parts) if parts else theta.new_empty((0,))), chunk


def psis(q: Any, target: Any = None, num_draws: int = 1000, *, seed: int | None = 0,
         generator: torch.Generator | None = None, budget: Any = None, draws: torch.Tensor | None = None,
         log_joint: torch.Tensor | None = None) -> WeightedPosterior:
    r"""Diagnose and correct a posterior approximation q by PSIS against the exact log joint.

    Parameters
    ----------
    q : posterior with ``sample`` and ``log_prob`` (e.g. :class:`~gpvi.posteriors.gaussian.GaussianPosterior`)
    target : model, optional
        Whose ``log_joint`` is the exact unnormalised log posterior (default ``q.target``).
    num_draws : int
        S, draws of q (default 1000; :math:`\hat k` needs a few hundred to be stable).
    seed, generator
        Randomness of the draws.
    budget : MemoryBudget, optional
        Chunks the batched log-joint calls (default: 1 GiB or a quarter of free memory).
    draws : torch.Tensor of shape (S, D), optional
        Independent draws of q made elsewhere, used in place of ``num_draws`` new ones (``seed`` and
        ``generator`` are then unused).
    log_joint : torch.Tensor of shape (S,), optional
        The log joint at ``draws`` where it is already known; NaN entries are evaluated here.

    Returns
    -------
    WeightedPosterior
        With ``khat``, ``ess``, weighted ``mean``/``std``/``covariance``/``quantile``, ``predict``,
        ``log_evidence`` :math:`\pm` ``log_evidence_se``, ``summary()``, ``to_arviz()``; ``info`` records the
        number of non-finite log joints, the log-joint chunking, the rows evaluated here and q's ``elbo``; the
        attribute ``log_joint`` holds the log joint at the draws (not saved by ``state_dict``).

    Warns
    -----
    PSISWarning
        :math:`\hat k > 0.7`, with what to do next.

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.posteriors import GaussianPosterior
    >>> from gpvi.posteriors.weighted import psis
    >>> target = gpvi.Target(lambda th: -0.5 * ((th - 1.0) ** 2).sum(-1), names=["a", "b"])
    >>> q = GaussianPosterior(torch.zeros(2, dtype=torch.float64), 1.5 * torch.eye(2, dtype=torch.float64),
    ...                       ["a", "b"], target)
    >>> w = psis(q, num_draws=4000, seed=0)
    >>> w.khat < 0.5, bool((w.mean - 1.0).abs().max() < 0.1)
    (True, True)
    """
    if not (callable(getattr(q, "log_prob", None)) and callable(getattr(q, "sample", None))):
        raise TypeError(f"q must be a posterior with sample and log_prob (e.g. a GaussianPosterior); got "
                        f"{type(q).__name__}")
    target = getattr(q, "target", None) if target is None else target
    if target is None or not callable(getattr(target, "log_joint", None)):
        raise TypeError("psis needs a target with log_joint(theta) (pass target=, or a posterior that has one)")
    if draws is None:
        num_draws = check_positive_int(num_draws, "num_draws")
    elif not (isinstance(draws, torch.Tensor) and draws.dim() == 2 and draws.shape[1] == len(q.names)):
        raise ValueError(f"draws must be a tensor of shape (S, {len(q.names)})")
    else:
        num_draws = int(draws.shape[0])
    if num_draws < 10:
        raise ValueError(f"num_draws must be at least 10 for a Pareto tail fit; got {num_draws}")
    with torch.no_grad():
        theta = q.sample(num_draws, generator=resolve_generator(seed, generator)) if draws is None else draws
        log_q = q.log_prob(theta)
        if log_joint is None:
            log_p, chunk = log_joint_at(target, theta, budget)
            evaluated = num_draws
        else:
            if tuple(log_joint.shape) != (num_draws,):
                raise ValueError(f"log_joint must have shape ({num_draws},); got {tuple(log_joint.shape)}")
            log_p = log_joint.to(theta).clone()
            todo = torch.isnan(log_p)
            evaluated = int(todo.sum())
            chunk = 0
            if evaluated:
                log_p[todo], chunk = log_joint_at(target, theta[todo], budget)
    if bool(torch.isnan(log_p).any()):
        raise ValueError("the target's log joint is NaN at some draws of q; PSIS needs -inf or a finite value")
    lr = (log_p - log_q).cpu().numpy().astype(np.float64)
    bad = int((~np.isfinite(lr)).sum())
    lw, khat = pareto_smooth(lr)
    ok = lr[np.isfinite(lr)]
    m = ok.max()
    r = np.exp(ok - m)
    r = np.concatenate([r, np.zeros(bad)])
    log_z = float(m + np.log(r.mean()))
    log_z_se = float(r.std(ddof=1) / (math.sqrt(r.size) * r.mean()))
    info = {"num_draws": num_draws, "nonfinite_log_joint": bad, "draws_per_call": chunk, "evaluated": evaluated,
            "elbo_q": float(getattr(q, "elbo", math.nan)), "verdict": verdict(khat),
            "proposal": type(q).__name__}
    if bad:
        warnings.warn(f"PSIS: the log joint is -inf at {bad} of {num_draws} draws of q (weight 0)",
                      NumericalWarning, stacklevel=2)
    out = WeightedPosterior(theta, torch.as_tensor(lw, dtype=theta.dtype, device=theta.device), list(q.names),
                            target, khat=khat, log_evidence=log_z, log_evidence_se=log_z_se, info=info)
    out.log_joint = log_p
    if khat > KHAT_USABLE:
        warnings.warn(f"PSIS k-hat = {khat:.2f} > {KHAT_USABLE}: q is far from the posterior and its importance "
                      f"weights are unreliable (ESS {out.ess:.0f} of {num_draws}); sample the posterior instead, "
                      "warm-started from q: gpvi.NUTS(...).run(target, init=q)", PSISWarning, stacklevel=2)
    return out

