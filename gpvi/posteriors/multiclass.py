r"""The posterior of multi-class CVI: K class-factorised Gaussian processes in site form, and class probabilities.

:class:`MulticlassPosterior` holds :math:`q(F) = \prod_k \mathcal N(\mathbf f_k \mid \mathbf m_k, V_k)` over the latent
values at the N training inputs (the class-factorised family of
:mod:`gpvi.inference.cvi.multiclass_sites`): sites :math:`\tilde\lambda^{(1)}, \tilde\lambda^{(2)}` (N, K), the
Cholesky factors of :math:`K + S_k` and :math:`\boldsymbol\alpha_k = (K + S_k)^{-1}\tilde{\mathbf y}_k` at the kernel
log-hyperparameters :math:`\theta` shared by the classes. The common surface (:mod:`gpvi.posteriors.base`) is over
the NK latent values, named ``f[n,k]`` in row-major order (``mean``, ``std``, ``sample``, ``quantile``,
``marginals``); :meth:`MulticlassPosterior.predict_latent` gives the K latent marginals at new inputs (GP regression on
each class's pseudo-data) and :meth:`MulticlassPosterior.predict_proba` the class probabilities
:math:`p(y_* = k \mid \mathcal D) = \mathbb E_{q(\mathbf f_*)}[p(y_* = k \mid \mathbf f_*)]`.
"""

from __future__ import annotations

from typing import Any

import torch

from ..validation import check_positive_int
from .sites import SitePosterior

__all__ = ["MulticlassPosterior"]


class MulticlassPosterior(SitePosterior):
    r"""The multi-class CVI posterior (see the module docstring).

    Parameters
    ----------
    model : GPMulticlass
    lam1, lam2 : torch.Tensor of shape (N, K)
    theta : torch.Tensor of shape (D,)
    m, var : torch.Tensor of shape (N, K)
        Marginal means and variances at the training inputs.
    L : torch.Tensor of shape (K, N, N)
        Lower Cholesky factors of :math:`K + S_k`.
    alpha : torch.Tensor of shape (K, N)
    elbo : float
        The bound (without the prior on :math:`\theta`; ``info["log_prior"]`` holds it after MAP-II).
    converged : bool
    trace, info, engine_state : optional
    quadrature : Quadrature, optional
        The softmax rule for predictions (default: :func:`gpvi.models.multiclass.default_quadrature`).

    Examples
    --------
    >>> import torch
    >>> from gpvi.models.multiclass import GPMulticlass
    >>> from gpvi.inference.cvi.multiclass import MulticlassCVI
    >>> X = torch.linspace(-2, 2, 30, dtype=torch.float64).unsqueeze(-1)
    >>> y = (X[:, 0] > -0.7).long() + (X[:, 0] > 0.7).long()
    >>> post = MulticlassCVI(progress_bar=False).run(GPMulticlass(X, y))
    >>> p = post.predict_proba(X[:2]); p.shape, bool(torch.allclose(p.sum(-1), torch.ones(2, dtype=torch.float64)))
    (torch.Size([2, 3]), True)
    """

    kind = "multiclass_latent"

    @staticmethod
    def _latent_names(shape: tuple[int, ...]) -> list[str]:
        N, C = shape
        return [f"f[{n},{k}]" for n in range(N) for k in range(C)]

    @classmethod
    def _refactor(cls, model: Any, theta: torch.Tensor, lam1: torch.Tensor, lam2: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        from ..inference.cvi.multiclass_sites import factors, pseudo_data

        if tuple(lam1.shape) != (model.num_data, model.num_classes):
            raise ValueError(f"state has sites of shape {tuple(lam1.shape)} but the model has (N, K) = "
                             f"({model.num_data}, {model.num_classes})")
        K = model.kernel_matrix(theta)
        ytilde, s = pseudo_data(lam1, lam2)
        L, _ = factors(K, s, theta)
        return L, torch.cholesky_solve(ytilde.T.unsqueeze(-1), L).squeeze(-1)

    def _title(self) -> str:
        return f"MulticlassPosterior (CVI): latent marginals and sites, likelihood {self.link}, K = {self.num_classes}"

    @property
    def num_classes(self) -> int:
        return int(self.lam1.shape[1])

    @property
    def classes(self) -> Any:
        """The model's original labels (``classes[k]`` is column k of :meth:`predict_proba`)."""
        return self.model.classes

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
        r"""``(n, N K)`` draws of the latent values (row-major ``f[n,k]``), by Matheron's rule per class."""
        from ..linalg import cholesky_with_jitter
        from ..rng import resolve_generator

        n = check_positive_int(n, "n")
        gen = resolve_generator(seed, generator, device=self.m.device)
        K = self.model.kernel_matrix(self.theta)
        Lk = cholesky_with_jitter(K, theta=self.theta, what="kernel matrix").L
        N, C = self.m.shape
        s, ytilde = self.pseudo_noise, self.pseudo_targets
        z = torch.randn((C, N, n), generator=gen, dtype=self.m.dtype, device=self.m.device)
        eps = torch.randn((C, N, n), generator=gen, dtype=self.m.dtype, device=self.m.device)
        f0 = Lk @ z
        resid = ytilde.T.unsqueeze(-1) - f0 - torch.sqrt(s.T).unsqueeze(-1) * eps
        f = f0 + K @ torch.cholesky_solve(resid, self._L)                        # (C, N, n)
        return f.permute(2, 1, 0).reshape(n, N * C).contiguous()

    # ------------------------------------------------------------------ prediction
    @torch.no_grad()
    def predict_latent(self, X_new: Any) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Means and variances of :math:`q(f_{*k})` for every class, each ``(M, K)``.

        .. math::

            m_{*k} = K_{*X}(K + S_k)^{-1}\tilde{\mathbf y}_k,\qquad v_{*k} = k_{**} - \|L_k^{-1}K_{X*}\|^2
        """
        Ksx = self.model.cross_covariance(self.theta, X_new)
        kss = self.model.prior_variance(self.theta, X_new)
        mean = Ksx @ self._alpha.T
        W = torch.linalg.solve_triangular(self._L, Ksx.T.expand(self.num_classes, -1, -1), upper=False)
        var = (kss.unsqueeze(-1) - (W * W).sum(-2).T).clamp_min(0.0)
        return mean, var

    @torch.no_grad()
    def predict_proba(self, X_new: Any) -> torch.Tensor:
        r""":math:`p(y_* = k \mid \mathcal D) = \mathbb E_{q(\mathbf f_*)}[p(y_* = k \mid \mathbf f_*)]`, ``(M, K)``; rows sum to 1.

        Softmax: the quadrature of :mod:`gpvi.models.multiclass` for :math:`K \le 3`, else 4096 fixed quasi-Monte
        Carlo points (:func:`gpvi.models.multiclass.fixed_draws`). Robust-max: the 1-D Gauss-Hermite formula.
        """
        mean, var = self.predict_latent(X_new)
        return self.model.likelihood.predict_proba(mean, var, quadrature=self.quadrature)

    def predict(self, X_new: Any) -> Any:  # type: ignore[override]
        """The labels of highest predictive probability, as the model's original labels (numpy array)."""
        p = self.predict_proba(X_new)
        return self.model.classes[p.argmax(-1).cpu().numpy()]

    def __repr__(self) -> str:
        return (f"MulticlassPosterior(likelihood={self.link!r}, N={self.lam1.shape[0]}, K={self.num_classes}, "
                f"elbo={self.elbo:.6g}, converged={self.converged})")
