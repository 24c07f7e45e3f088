r"""The posterior of a latent GP's function values (CVI), and the predictive of binary labels.

:class:`LatentPosterior` is the Gaussian :math:`q(\mathbf f) = \mathcal N(\mathbf m, V)` over the latent values at the
N training inputs, held in site form (Khan & Lin 2017): sites :math:`\tilde\lambda^{(1)}, \tilde\lambda^{(2)}`, the
Cholesky factor :math:`L` of :math:`K + S` and :math:`\boldsymbol\alpha = (K + S)^{-1}\tilde{\mathbf y}` at the kernel
log-hyperparameters :math:`\theta`. It offers the common posterior surface (:mod:`gpvi.posteriors.base`) for the
latent values -- ``names`` (``f[0]``, ..., ``f[N-1]``), ``mean`` and ``std`` (:math:`m_n`, :math:`\sqrt{V_{nn}}`),
``sample`` (draws of :math:`\mathbf f`), ``quantile``, ``marginals``, ``summary`` (latent marginals and site statistics),
``state_dict`` / ``from_state_dict`` (kind ``"latent"``) -- plus ``predict_latent`` and ``predict_proba`` at new
inputs and ``predict`` (a :class:`BernoulliPredictive`). The run report (settings, counters, times) is ``info``.

Names: ``lam1``, ``lam2`` (:math:`\tilde\lambda^{(1)}, \tilde\lambda^{(2)}`), ``m``, ``var`` (:math:`m_n`,
:math:`V_{nn}`), ``theta`` (kernel log-hyperparameters), ``L``, ``alpha``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..validation import as_float_tensor, check_positive_int
from .sites import SitePosterior

__all__ = ["LatentPosterior", "BernoulliPredictive"]


class BernoulliPredictive:
    r"""Predictive distribution of binary labels: :math:`p_i = p(y_i = 1 \mid \mathcal D)` per test point.

    ``mean`` is the probability vector; ``log_prob(y)`` gives :math:`\log p(y_i \mid \mathcal D)` for labels in
    {0, 1} or {-1, +1}, so :func:`gpvi.metrics.nlpd` works on it.

    Examples
    --------
    >>> import torch
    >>> pred = BernoulliPredictive(torch.tensor([0.9, 0.2], dtype=torch.float64))
    >>> [round(v, 4) for v in pred.log_prob([1, 0]).tolist()]
    [-0.1054, -0.2231]
    """

    def __init__(self, probs: torch.Tensor) -> None:
        self.probs = probs

    @property
    def mean(self) -> torch.Tensor:
        return self.probs

    def log_prob(self, y: Any) -> torch.Tensor:
        from ..validation import check_binary_labels

        yt = as_float_tensor(y, "y", ndim=1)
        if yt.shape[0] != self.probs.shape[0]:
            raise ValueError(f"y has {yt.shape[0]} labels but the prediction has {self.probs.shape[0]}")
        values = set(torch.unique(yt).tolist())
        if values <= {0.0, 1.0}:
            y01 = yt
        elif values <= {-1.0, 1.0}:
            y01 = (yt == 1.0).to(torch.float64)
        else:
            y01, _ = check_binary_labels(yt, "y")
        p = self.probs.to(y01)
        return torch.where(y01 == 1.0, torch.log(p), torch.log1p(-p))


class LatentPosterior(SitePosterior):
    r"""The CVI posterior :math:`q(\mathbf f) = \mathcal N(\mathbf m, V)` of a latent GP, in site form.

    Parameters
    ----------
    model : LatentGP
    lam1, lam2 : torch.Tensor of shape (N,)
        Sites :math:`\tilde\lambda^{(1)}, \tilde\lambda^{(2)}` (``lam2 < 0``).
    theta : torch.Tensor of shape (D,)
        Kernel log-hyperparameters the posterior was computed at.
    m, var : torch.Tensor of shape (N,)
        Marginal means and variances at the training inputs.
    L : torch.Tensor of shape (N, N)
        Lower Cholesky factor of :math:`K + S`.
    alpha : torch.Tensor of shape (N,)
        :math:`(K + S)^{-1}\tilde{\mathbf y}`.
    elbo : float
        ELBO (eq. 5) of :math:`q`, by quadrature.
    converged : bool
    trace : dict of str to list, optional
        Per-check records of the run (``step``, ``sweep``, ``elbo``, ``residual``, ``drift``, ``time_s``).
    info : dict, optional
        The run report: settings, counters, ``steps``, ``sweeps``, ``interrupted``, ``time_s``...
    engine_state : CVIState, optional
        The final state; a private copy is kept (resume with ``CVI(...).run(model, state=post.engine_state)``).
    quadrature : Quadrature, optional
        The rule for logit predictions (default ``Quadrature()``).

    Attributes
    ----------
    names : list of str
        ``f[0]``, ..., ``f[N-1]``: the latent values at the training inputs (``theta_names`` names theta).
    model : LatentGP
        The model (also ``target``).

    Examples
    --------
    >>> import gpvi
    >>> from gpvi.models.classification import GPClassification
    >>> from gpvi.inference.cvi import CVI
    >>> ds = gpvi.datasets.load_pima()
    >>> post = CVI(mode="full", progress_bar=False).run(GPClassification(ds.X_train, ds.y_train))
    >>> post.predict_proba(ds.X_test[:3]).shape, post.mean.shape, post.sample(4, seed=0).shape
    (torch.Size([3]), torch.Size([200]), torch.Size([4, 200]))
    """

    kind = "latent"

    @staticmethod
    def _latent_names(shape: tuple[int, ...]) -> list[str]:
        return [f"f[{i}]" for i in range(shape[0])]

    @staticmethod
    def _default_quadrature() -> Any:
        from ..numerics.quadrature import Quadrature

        return Quadrature()

    @classmethod
    def _refactor(cls, model: Any, theta: torch.Tensor, lam1: torch.Tensor, lam2: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        from ..numerics.sites import pseudo_data, site_factor

        if lam1.shape[0] != model.num_data:
            raise ValueError(f"state has {lam1.shape[0]} sites but the model has N = {model.num_data}")
        K = model.kernel_matrix(theta)
        ytilde, s = pseudo_data(lam1, lam2)
        L, _ = site_factor(K, s, theta)
        return L, torch.cholesky_solve(ytilde.unsqueeze(-1), L).squeeze(-1)

    def _title(self) -> str:
        return f"LatentPosterior (CVI): latent marginals and sites, link {self.link}"

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
        r"""``(n, N)`` draws of the latent values :math:`\mathbf f \sim q` at the training inputs.

        By conditioning prior draws on the pseudo-data (Matheron's rule; exact for this Gaussian :math:`q`):

        .. math::

            \mathbf f = \mathbf f_0 + K (K + S)^{-1}(\tilde{\mathbf y} - \mathbf f_0 - \boldsymbol\varepsilon),
            \qquad \mathbf f_0 \sim \mathcal N(0, K),\ \boldsymbol\varepsilon \sim \mathcal N(0, S),

        which needs only the factors of :math:`K` (with the shared jitter policy) and of :math:`K + S`, never
        :math:`V` itself (forming :math:`V = K - K(K+S)^{-1}K` cancels badly where the sites are strong).
        """
        from ..linalg import cholesky_with_jitter
        from ..rng import resolve_generator

        n = check_positive_int(n, "n")
        gen = resolve_generator(seed, generator, device=self.m.device)
        K = self.model.kernel_matrix(self.theta)
        Lk = cholesky_with_jitter(K, theta=self.theta, what="kernel matrix").L
        N = self.m.shape[0]
        z = torch.randn((N, n), generator=gen, dtype=self.m.dtype, device=self.m.device)
        eps = torch.randn((N, n), generator=gen, dtype=self.m.dtype, device=self.m.device)
        f0 = Lk @ z
        resid = self.pseudo_targets.unsqueeze(-1) - f0 - torch.sqrt(self.pseudo_noise).unsqueeze(-1) * eps
        return (f0 + K @ torch.cholesky_solve(resid, self._L)).T.contiguous()

    # ------------------------------------------------------------------ prediction
    @torch.no_grad()
    def predict_latent(self, X_new: Any) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Mean and variance of :math:`q(f_*)` at new inputs (GP regression on the pseudo-data).

        .. math::

            m_* = K_{*X}(K + S)^{-1}\tilde{\mathbf y},\qquad v_* = k_{**} - \|L^{-1} K_{X*}\|^2

        Parameters
        ----------
        X_new : array-like of shape (n, n_features)

        Returns
        -------
        mean, var : torch.Tensor of shape (n,)
        """
        Ksx = self.model.cross_covariance(self.theta, X_new)
        kss = self.model.prior_variance(self.theta, X_new)
        mean = Ksx @ self._alpha
        W = torch.linalg.solve_triangular(self._L, Ksx.T, upper=False)
        var = (kss - (W * W).sum(0)).clamp_min(0.0)
        return mean, var

    @torch.no_grad()
    def predict_proba(self, X_new: Any) -> torch.Tensor:
        r""":math:`p(y_* = 1 \mid \mathcal D) = \mathbb E_{q(f_*)}[p(y_* = 1 \mid f_*)]`, shape ``(n,)``.

        Probit: :math:`\Phi(m_*/\sqrt{1 + v_*})` (closed form). Logit: quadrature of :math:`\sigma(f_*)`.
        "1" is the model's positive class (``model.classes[1]``).
        """
        from ..models.likelihoods import gaussian_expectation

        lik = self.model.likelihood
        if not getattr(lik, "binary", False):
            raise TypeError(f"predict_proba needs a binary likelihood; this posterior's is {lik.name!r}")
        mean, var = self.predict_latent(X_new)
        if lik.name == "probit":
            return torch.special.ndtr(mean / torch.sqrt(1.0 + var))
        return gaussian_expectation(lik.response, mean, var, self.quadrature).clamp(0.0, 1.0)

    def predict(self, X_new: Any) -> BernoulliPredictive:  # type: ignore[override]
        """The predictive of the labels at ``X_new`` (:class:`BernoulliPredictive`; works with ``gpvi.metrics``)."""
        return BernoulliPredictive(self.predict_proba(X_new))

    def __repr__(self) -> str:
        return (f"LatentPosterior(link={self.link!r}, N={self.model.num_data}, elbo={self.elbo:.6g}, "
                f"converged={self.converged}, mode={self.info.get('mode')!r})")

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], target: Any = None) -> LatentPosterior:
        """Rebuild from :meth:`state_dict` output for the same model (``target``), recomputing the factor of
        :math:`K + S`; an ``engine_state`` becomes a :class:`~gpvi.inference.cvi.state.CVIState` again."""
        return super().from_state_dict(state, target)    # type: ignore[return-value]
