r"""Predictions of :class:`gpvi.GPRegression` at new inputs for given hyperparameters (Rasmussen & Williams 2006,
Algorithm 2.1), batched over theta: the mixin :class:`RegressionPrediction`."""

from __future__ import annotations

from typing import Any

import torch

from ..linalg import cholesky_with_jitter
from ..numerics.predictive import MixturePredictive
from .scaled_rbf import centre_inputs
from ..validation import check_feature_columns, check_finite_prediction, check_X

__all__ = ["RegressionPrediction"]


class RegressionPrediction:
    """Mixin of :class:`gpvi.GPRegression`: :meth:`predict` and :meth:`predictive` (needs the model's ``X``,
    ``kernel_params``, ``covariance``, ``noise_var``, ``mean_constant``, ``_centred_y``, ``_centre``, ``_Xc``,
    ``jitter``, ``max_jitter``, ``batch_size``, ``feature_names``, ``y_offset`` and ``_theta``)."""

    def predict(self, theta: Any, X_new: Any, *, include_noise: bool = True,
                full_cov: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Predictive mean and variance at ``X_new`` for given hyperparameters.

        .. math::

            m_* = K_{*X}(K + \sigma^2 I)^{-1} y,\qquad
            v_* = k_{**} - K_{*X}(K + \sigma^2 I)^{-1} K_{X*} \;(+\,\sigma^2 \text{ for } y_*)

        (Rasmussen & Williams 2006, Algorithm 2.1).

        Parameters
        ----------
        theta : array-like of shape (D,) or (S, D)
        X_new : array-like of shape (n, n_features)
            Columns by position; a DataFrame by name (``feature_names``, in order; class docstring).
        include_noise : bool
            Variance of y* (default) or of f*.
        full_cov : bool
            Return the full ``(n, n)`` covariance instead of the variances (single theta only).

        Returns
        -------
        mean, var : torch.Tensor
            ``(n,)`` each for one theta (``var`` is ``(n, n)`` if ``full_cov``); ``(S, n)`` for a batch.

        Raises
        ------
        ValueError
            ``X_new`` malformed (a DataFrame with other columns than ``feature_names``), or a prediction that is
            not finite (inputs so large that the kernel overflows float64, e.g. ``X * 1e300``): an error naming the
            rows, never a NaN returned without a word.
        """
        theta = self._theta(theta).detach()
        if not bool(torch.isfinite(theta).all()):
            raise ValueError("theta contains non-finite values")
        check_feature_columns(X_new, self.feature_names, "X_new")
        Xs = centre_inputs(check_X(X_new, "X_new", n_features=self.X.shape[1], device=self.X.device), self._centre)
        if theta.dim() == 1:
            if full_cov:
                return self._predict_full(theta, Xs, include_noise)
            m, v = self._predict_batch(theta.unsqueeze(0), Xs, include_noise)
            return m[0], v[0]
        if full_cov:
            raise ValueError("full_cov=True needs a single theta of shape (D,)")
        means, variances = [], []
        for chunk in torch.split(theta, self.batch_size):
            m, v = self._predict_batch(chunk, Xs, include_noise)
            means.append(m)
            variances.append(v)
        return torch.cat(means), torch.cat(variances)

    @torch.no_grad()
    def _predict_batch(self, theta: torch.Tensor, Xs: torch.Tensor, include_noise: bool):
        kp = self.kernel_params
        Ky = self.covariance(theta)
        chol = cholesky_with_jitter(Ky, jitter=self.jitter, max_jitter=self.max_jitter, raise_on_failure=True,
                                    theta=theta)
        L = chol.L
        tk, c = theta[:, :kp.dim], self.mean_constant(theta)
        Ksx = kp.matrix(tk, Xs, self._Xc)                    # (S, n, N)
        alpha = torch.cholesky_solve(self._centred_y(theta).expand(theta.shape[0], -1).unsqueeze(-1), L)  # (S, N, 1)
        mean = (Ksx @ alpha).squeeze(-1) + self.y_offset
        if c is not None:
            mean = mean + c.unsqueeze(-1)
        V = torch.linalg.solve_triangular(L, Ksx.transpose(-1, -2), upper=False)          # (S, N, n)
        kss = kp.matrix(tk, Xs, diag=True)                   # (S, n)
        var = (kss - (V * V).sum(-2)).clamp_min(0.0)
        if include_noise:
            var = var + self.noise_var(theta).unsqueeze(-1)
        else:
            var = var.clamp_min(1e-300)
        check_finite_prediction(mean, var, "X_new")     # overflow in the kernel: an error, never NaN
        return mean, var

    @torch.no_grad()
    def _predict_full(self, theta: torch.Tensor, Xs: torch.Tensor, include_noise: bool):
        kp = self.kernel_params
        chol = cholesky_with_jitter(self.covariance(theta), jitter=self.jitter, max_jitter=self.max_jitter,
                                    theta=theta)
        L = chol.L
        tk, c = theta[:kp.dim], self.mean_constant(theta)
        Ksx = kp.matrix(tk, Xs, self._Xc)
        mean = Ksx @ torch.cholesky_solve(self._centred_y(theta).unsqueeze(-1), L).squeeze(-1) + self.y_offset
        if c is not None:
            mean = mean + c
        V = torch.linalg.solve_triangular(L, Ksx.T, upper=False)
        cov = kp.matrix(tk, Xs) - V.T @ V
        if include_noise:
            cov = cov + self.noise_var(theta) * torch.eye(Xs.shape[0], dtype=cov.dtype, device=cov.device)
        check_finite_prediction(mean, cov, "X_new")
        return mean, cov

    def predictive(self, theta: Any, X_new: Any, *, include_noise: bool = True) -> MixturePredictive:
        """Predictive of y* (or f*) as a :class:`~gpvi.numerics.predictive.MixturePredictive` over the given theta rows."""
        mean, var = self.predict(theta, X_new, include_noise=include_noise)
        return MixturePredictive(mean, var)
