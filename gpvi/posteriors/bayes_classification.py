r"""Fully Bayesian GP classification: a Gaussian :math:`q(\theta)` over the kernel log-hyperparameters, and
predictions that integrate over :math:`q(\theta)` and over :math:`\mathbf f`.

:class:`gpvi.inference.cvi.bayes.FullyBayesianCVI` fits, for a latent GP model (:class:`gpvi.GPClassification`),

.. math::

    q(\theta, \mathbf f) = q(\theta)\, q^*(\mathbf f\mid\theta),\qquad q(\theta) = \mathcal N(\mu, CC^\top),

where :math:`q^*(\mathbf f\mid\theta)` is the Gaussian CVI converges to at :math:`\theta`, with a Gaussian
variational engine -- Salimans & Knowles' Hessian-free stochastic linear regression (:class:`gpvi.SKGaussian`, the
default) or DSVI (Titsias & Lázaro-Gredilla 2014) -- maximising

.. math::

    \mathcal F(\mu, C) = \mathbb E_{q(\theta)}\big[\ell(\theta) + \log p(\theta)\big] + \mathcal H[q(\theta)],

where :math:`\ell(\theta)` stands in for :math:`\log p(\mathbf y\mid\theta)`:

* ``evidence="ep"`` (the default): EP's approximate evidence :math:`\log Z_{EP}(\theta)`
  (:class:`gpvi.inference.cvi.ep_evidence.EPEvidenceTarget`). :math:`\mathcal F` then approximates the ELBO of
  :math:`q(\theta)` against the exact :math:`p(\theta\mid\mathbf y)` (it is that ELBO where :math:`\log Z_{EP} =
  \log p(\mathbf y\mid\theta)`); it is not a bound.
* ``evidence="cvi"``: the profiled CVI bound :math:`\mathcal L_{CVI}(\theta) \le \log p(\mathbf y\mid\theta)`
  (:class:`gpvi.inference.cvi.bound.CVIBoundTarget`). :math:`\mathcal F \le \log p(\mathbf y)` is then the ELBO of
  the structured family :math:`q(\theta)\,q^*(\mathbf f\mid\theta)`, and :math:`q(\theta)` approximates the
  posterior of :math:`\theta` *under the CVI bound*, pulled towards small signal variances where the likelihood
  saturates (the bound's gap grows with the signal variance: ``benchmarks/classification_evidence.md``).

NUTS over :math:`(\theta, \mathbf v)` (:class:`gpvi.models.whitened.WhitenedLatentGP`) is the reference without
either approximation (``benchmarks/classification_nuts_ref.md``).

The run: (1) MAP-II, the maximiser of :math:`\mathcal L_{CVI}(\theta) + \log p(\theta)`, by
:class:`gpvi.inference.cvi.typeii.TypeII`, and with ``evidence="ep"`` the maximiser of
:math:`\log Z_{EP}(\theta) + \log p(\theta)` from there (L-BFGS-B); (2) the Laplace scale of the target there
(:func:`gpvi.inference.init.laplace_scale_at`, central differences of the gradient); (3) for a model with at most 4
log-hyperparameters on EP's evidence (binary or softmax), two rounds of importance sampling from that start
(:class:`gpvi.inference.cvi.importance.ImportanceGaussian`: q the moment-matched Gaussian of
:math:`Z_{EP}(\theta)p(\theta)`, accepted where PSIS's :math:`\hat k` and ESS allow), else the engine from that
start (default: S&K Hessian-free, max(100, min(200, 25 D), 4 D) steps of 4 draws, the second half averaged; see
:class:`~gpvi.inference.cvi.bayes.FullyBayesianCVI`); (4) ``num_draws`` draws :math:`\theta_s \sim q` with their
converged CVI latent posteriors.

The predictive (:class:`BayesClassificationPosterior`) is the equal-weight mixture over the draws,

.. math::

    p(y_* = 1\mid\mathcal D) \approx \frac1S\sum_{s=1}^S \mathbb E_{q^*(f_*\mid\theta_s)}[\sigma(f_*)],\qquad
    \theta_s\sim q(\theta),

each inner expectation by quadrature (closed form for probit), and the latent predictive
:math:`q(f_*) \approx \frac1S\sum_s \mathcal N(m_{*s}, v_{*s})` reported by its mean and variance. Multi-class
(:class:`gpvi.models.multiclass.GPMulticlass`; q(theta) on multi-class EP for the softmax at any K, or, when asked
for, on the profiled multi-class bound :class:`gpvi.inference.cvi.bound.CVIBoundTarget`): the same mixture of the
K-column class probabilities :math:`\mathbb E_{q^*(\mathbf f_*\mid\theta_s)}[p(y_* = k\mid\mathbf f_*)]`, and per-class latent moments.

Names: ``theta`` (kernel log-hyperparameters), ``q`` (the Gaussian posterior of theta), ``draws`` (:math:`\theta_s`).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from ..rng import check_seed
from ..validation import check_positive_int
from .info import RunInfo
from .latent import BernoulliPredictive

__all__ = ["BayesClassificationPosterior"]


class BayesClassificationPosterior:
    r""":math:`q(\theta)` and the latent posteriors :math:`q^*(\mathbf f\mid\theta_s)` at draws :math:`\theta_s\sim q`.

    Parameters
    ----------
    q : GaussianPosterior
        The posterior of the kernel log-hyperparameters (e.g. S&K's or DSVI's on an
        :class:`~gpvi.inference.cvi.ep_evidence.EPEvidenceTarget` or a :class:`~gpvi.inference.cvi.bound.CVIBoundTarget`).
    target : EPEvidenceTarget or CVIBoundTarget
        Gives the model and the converged CVI latent posterior at each draw (``latent_posterior``).
    num_draws : int
        S, draws of :math:`\theta` in the predictive mixture (default 32).
    seed : int
        Seed of the draws (reproducible predictions).
    info : dict, optional

    Attributes
    ----------
    names : list of str
        The theta names (``model.names``).
    draws : torch.Tensor of shape (S', D)
        The draws whose latent posterior could be computed (S' <= S; ``info["failed_draws"]`` counts the others).
    latents : list of LatentPosterior
        :math:`q^*(\mathbf f\mid\theta_s)`, one per row of ``draws``.

    Examples
    --------
    See :class:`FullyBayesianCVI`.
    """

    def __init__(self, q: Any, target: Any, *, num_draws: int = 32, seed: int = 0,
                 info: dict[str, Any] | None = None) -> None:
        num_draws = check_positive_int(num_draws, "num_draws")
        self.q = q
        self.target = target
        self.names = list(target.names)
        self.info = RunInfo.of(info)
        t0 = time.perf_counter()
        draws = q.sample(num_draws, seed=check_seed(seed)).to(target.device)
        kept, latents = [], []
        for th in draws:
            try:
                latents.append(target.latent_posterior(th))
                kept.append(th)
            except Exception as exc:                       # NotPSDError, SiteFault: leave the draw out, count it
                self.info.setdefault("draw_errors", []).append(str(exc))
        if not latents:
            raise RuntimeError("no draw of q(theta) gave a latent posterior (every CVI run failed)")
        self.draws = torch.stack(kept)
        self.latents = latents
        self.info.update(num_draws=num_draws, failed_draws=num_draws - len(kept), seed=seed,
                         predictive_time_s=time.perf_counter() - t0)

    # ------------------------------------------------------------------ theta
    @property
    def model(self) -> Any:
        return self.target.model

    @property
    def mean(self) -> torch.Tensor:
        r"""Mean of :math:`q(\theta)`, in the model's theta order, shape (D,)."""
        return self.q.mean

    @property
    def std(self) -> torch.Tensor:
        r"""Marginal standard deviations of :math:`q(\theta)`, shape (D,)."""
        return self.q.std

    @property
    def elbo(self) -> float:
        r"""The engine's estimate of :math:`\mathcal F(\mu, C)` (module docstring; a lower bound on
        :math:`\log p(\mathbf y)` only with ``evidence="cvi"``; ``elbo_se`` its standard error)."""
        return float(self.q.elbo)

    @property
    def elbo_se(self) -> float:
        return float(getattr(self.q, "elbo_se", math.nan))

    def summary(self, prob: float = 0.9, *, natural: bool = True) -> Any:
        r"""The marginals of :math:`q(\theta)` by name (:meth:`GaussianPosterior.summary`)."""
        return self.q.summary(prob, natural=natural)

    # ------------------------------------------------------------------ prediction
    @torch.no_grad()
    def predict_latent(self, X_new: Any, *, per_draw: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Mean and variance of the mixture :math:`\frac1S\sum_s q^*(f_*\mid\theta_s)` at new inputs.

        .. math::

            \bar m_* = \frac1S\sum_s m_{*s},\qquad
            \bar v_* = \frac1S\sum_s \big(v_{*s} + m_{*s}^2\big) - \bar m_*^2.

        With ``per_draw=True``, the ``(S', n)`` means and variances of the components instead (multi-class: one
        more axis of K classes, ``(n, K)`` and ``(S', n, K)``).
        """
        parts = [lp.predict_latent(X_new) for lp in self.latents]
        m = torch.stack([p[0] for p in parts])
        v = torch.stack([p[1] for p in parts])
        if per_draw:
            return m, v
        mean = m.mean(0)
        var = (v + m * m).mean(0) - mean * mean
        return mean, var.clamp_min(0.0)

    @property
    def multiclass(self) -> bool:
        """Whether the model is multi-class (K-column probabilities)."""
        return bool(getattr(self.model.likelihood, "multiclass", False))

    @torch.no_grad()
    def predict_proba(self, X_new: Any) -> torch.Tensor:
        r""":math:`p(y_*=1\mid\mathcal D) \approx \frac1S\sum_s \mathbb E_{q^*(f_*\mid\theta_s)}[p(y_*=1\mid f_*)]`,
        shape ``(n,)``; "1" is the model's positive class. Multi-class: :math:`p(y_* = k\mid\mathcal D)`, shape
        ``(n, K)``, columns in ``model.classes`` order, rows summing to 1."""
        p = torch.stack([lp.predict_proba(X_new) for lp in self.latents]).mean(0).clamp(0.0, 1.0)
        return p / p.sum(-1, keepdim=True) if self.multiclass else p

    def predict(self, X_new: Any) -> Any:
        """The predictive of the labels (:class:`~gpvi.posteriors.latent.BernoulliPredictive`); multi-class: the
        most probable labels, as the model's original labels (numpy array)."""
        if self.multiclass:
            return self.model.classes[self.predict_proba(X_new).argmax(-1).cpu().numpy()]
        return BernoulliPredictive(self.predict_proba(X_new))

    def __repr__(self) -> str:
        return (f"BayesClassificationPosterior(D={len(self.names)}, draws={self.draws.shape[0]}, "
                f"elbo={self.elbo:.6g})")
