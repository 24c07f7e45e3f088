r"""Bayesian logistic regression as an inference target (DSVI paper section 3.1).

Model, with labels :math:`y_n \in \{-1, +1\}` and inputs augmented by a leading one for the bias,
:math:`x_n = [1, \tilde x_n^\top]^\top`:

.. math::

    p(y \mid \theta) = \prod_{n=1}^N s(y_n x_n^\top \theta),\qquad p(\theta) = \mathcal N(0, v I_D),
    \qquad \log g(\theta) = \sum_n \log s(y_n x_n^\top\theta) + \log p(\theta),

where :math:`s(a) = 1/(1+e^{-a})` and :math:`\log s(a) = -\operatorname{softplus}(-a)` is evaluated stably. The
log joint is concave, so the Gaussian variational bound is concave in :math:`(\mu, C)` (paper section 2;
Challis & Barber 2013) and has a unique maximiser.

Besides the target protocol (``names``, ``log_joint`` batched over ``(S, D)``), the class offers

* :meth:`~BayesianLogisticRegression.log_likelihood_terms` — per-datum log likelihoods for minibatching and
  :meth:`~BayesianLogisticRegression.minibatch`, which wraps them in a :class:`gpvi.models.minibatch.MinibatchTarget`;
* :meth:`~BayesianLogisticRegression.gaussian_bound` — the Gaussian bound (paper eq. 10) computed
  deterministically, with Gauss–Hermite quadrature for each one-dimensional
  :math:`\mathbb E_q[\log s(y_n x_n^\top\theta)]`; its maximiser over :math:`(\mu, C)`,
  :func:`gpvi.inference.quadrature_fit.fit_gaussian_quadrature`, is the deterministic reference DSVI is compared
  against (the paper's Figure 2 uses Challis & Barber's code for the same purpose);
* :meth:`~BayesianLogisticRegression.predict_proba` — :math:`p(y_*=1 \mid x_*)` under a point or a posterior.

Names: ``prior_var`` = :math:`v`, ``Phi`` = the design matrix with rows :math:`x_n^\top`, ``y_pm`` = labels in
{-1, +1}.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .minibatch import MinibatchTarget
from ..validation import (
    as_float_tensor,
    check_binary_labels,
    check_bool,
    check_feature_columns,
    check_positive,
    check_positive_int,
    check_theta,
    check_X,
    feature_names_of,
)

__all__ = ["BayesianLogisticRegression", "gauss_hermite"]


def gauss_hermite(num_points: int) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Nodes and weights for :math:`\mathbb E_{a \sim \mathcal N(0,1)}[f(a)] \approx \sum_k w_k f(a_k)`.

    Physicists' Gauss–Hermite rule rescaled: :math:`a_k = \sqrt2 x_k`, :math:`w_k = \omega_k/\sqrt\pi`.

    Examples
    --------
    >>> a, w = gauss_hermite(20)
    >>> round(float((w * a ** 2).sum()), 12)
    1.0
    """
    num_points = check_positive_int(num_points, "num_points")
    x, w = np.polynomial.hermite.hermgauss(num_points)
    return (torch.from_numpy(x * math.sqrt(2.0)), torch.from_numpy(w / math.sqrt(math.pi)))


class BayesianLogisticRegression:
    r"""Bayesian logistic regression target: :math:`\log g(\theta) = \sum_n \log s(y_n x_n^\top\theta) + \log\mathcal N(\theta\mid 0, vI)`.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Inputs (float64 after conversion).
    y : array-like of shape (n_samples,)
        Labels in {0, 1} or {-1, +1} (checked by :func:`gpvi.validation.check_binary_labels`).
    prior_var : float or None
        Prior variance :math:`v` of every weight (the paper uses 1). ``None``: no prior term, so
        ``log_joint`` is the log likelihood alone (what :class:`gpvi.inference.dsvi.ard.DSVIARD` needs).
    bias : bool
        Prepend a constant-one input (weight named ``"bias"``), as in the paper.
    feature_names : sequence of str, optional
        Names of the input columns (default: a DataFrame's string column names, else ``w[0]``, ``w[1]``, ...).
    device : torch.device or str, optional

    Attributes
    ----------
    names : list of str
        ``["bias", <feature names>]`` (D = n_features + 1 with a bias).
    feature_names : list of str or None
        The input columns' names (given, or a DataFrame's), checked against a DataFrame given to
        :meth:`predict_proba`; None when X had none.
    Phi : torch.Tensor of shape (N, D)
        Design matrix.
    y_pm : torch.Tensor of shape (N,)
        Labels in {-1, +1}.

    Examples
    --------
    >>> import gpvi
    >>> from gpvi.models.logistic import BayesianLogisticRegression
    >>> ds = gpvi.datasets.load_pima()
    >>> model = BayesianLogisticRegression(ds.X_train, ds.y_train)
    >>> model.dim, model.log_joint(model.initial_theta()).shape
    (8, torch.Size([]))
    """

    max_block: int = 2 ** 20
    """Largest number of (draw, data point) pairs evaluated at once by :meth:`log_joint` (8 MB per float64
    temporary)."""

    def __init__(self, X: Any, y: Any, *, prior_var: float | None = 1.0, bias: bool = True,
                 feature_names: Sequence[str] | None = None, device: torch.device | str | None = None) -> None:
        Xt = check_X(X, "X", device=device, copy=True)
        y01, classes = check_binary_labels(y, "y", device=Xt.device)
        if y01.shape[0] != Xt.shape[0]:
            raise ValueError(f"X has {Xt.shape[0]} rows but y has {y01.shape[0]}")
        self.bias = check_bool(bias, "bias")
        self.prior_var = None if prior_var is None else check_positive(prior_var, "prior_var")
        n, d = Xt.shape
        if feature_names is None:
            self.feature_names = feature_names_of(X)
        else:
            if isinstance(feature_names, str) or len(feature_names) != d:
                raise ValueError(f"feature_names must be a sequence of {d} names (one per column of X)")
            self.feature_names = [str(f) for f in feature_names]
        self.names = (["bias"] if self.bias else []) + (self.feature_names or [f"w[{j}]" for j in range(d)])
        if len(set(self.names)) != len(self.names):
            raise ValueError("feature_names must be unique and must not be 'bias'")
        self.Phi = torch.cat([torch.ones(n, 1, dtype=Xt.dtype, device=Xt.device), Xt], 1) if self.bias else Xt
        self.y_pm = 2.0 * y01 - 1.0
        self.classes = classes

    # ------------------------------------------------------------------ basics
    @property
    def dim(self) -> int:
        """Number of weights D."""
        return self.Phi.shape[1]

    @property
    def num_data(self) -> int:
        """Number of training points N."""
        return self.Phi.shape[0]

    def design(self, X: Any) -> torch.Tensor:
        """Design matrix ``(n, D)`` for new inputs (bias column prepended when the model has one). A DataFrame
        must have the columns the model was built with, in the same order (``ValueError`` naming them)."""
        check_feature_columns(X, self.feature_names, "X")
        Xt = check_X(X, "X", n_features=self.dim - int(self.bias), device=self.Phi.device)
        if self.bias:
            Xt = torch.cat([torch.ones(Xt.shape[0], 1, dtype=Xt.dtype, device=Xt.device), Xt], 1)
        return Xt

    @property
    def device(self) -> torch.device:
        return self.Phi.device

    def initial_theta(self) -> torch.Tensor:
        """Zeros (the prior mean), shape (D,)."""
        return torch.zeros(self.dim, dtype=torch.float64, device=self.Phi.device)

    # ------------------------------------------------------------------ densities
    def log_likelihood_terms(self, theta: Any, idx: torch.Tensor | None = None) -> torch.Tensor:
        r"""Per-datum :math:`\log s(y_n x_n^\top\theta)`: ``(S, D) -> (S, M)`` (``(D,) -> (M,)``).

        Parameters
        ----------
        theta : array-like of shape (D,) or (S, D)
        idx : LongTensor of shape (M,), optional
            Data indices (default: all N).
        """
        theta = check_theta(theta, self.dim, device=self.Phi.device)
        Phi, y = (self.Phi, self.y_pm) if idx is None else (self.Phi[idx], self.y_pm[idx])
        a = theta @ Phi.T                                   # (S, M) or (M,)
        return -F.softplus(-y * a)

    def log_likelihood(self, theta: Any) -> torch.Tensor:
        """:math:`\\sum_n \\log s(y_n x_n^\\top\\theta)`: ``(D,) -> ()``, ``(S, D) -> (S,)``."""
        return self.log_likelihood_terms(theta).sum(-1)

    def log_prior(self, theta: Any) -> torch.Tensor:
        r""":math:`\log\mathcal N(\theta\mid 0, vI)` (0 when ``prior_var`` is None)."""
        theta = check_theta(theta, self.dim, device=self.Phi.device)
        if self.prior_var is None:
            return theta.new_zeros(theta.shape[:-1]) + 0.0 * theta.sum(-1)
        v = self.prior_var
        return -0.5 * (theta * theta).sum(-1) / v - 0.5 * self.dim * math.log(2 * math.pi * v)

    def log_joint(self, theta: Any) -> torch.Tensor:
        r"""Log joint :math:`\log g(\theta)`: ``(D,) -> ()``, ``(S, D) -> (S,)``.

        One ``(S, D) x (D, N)`` product, done in blocks of data rows when :math:`S N` exceeds ``max_block``
        entries (so a large batch of draws on large data never materialises an ``(S, N)`` matrix).
        """
        theta = check_theta(theta, self.dim, device=self.Phi.device)
        S = 1 if theta.dim() == 1 else theta.shape[0]
        N = self.num_data
        if S * N <= self.max_block:
            return self.log_likelihood_terms(theta).sum(-1) + self.log_prior(theta)
        rows = max(1, self.max_block // S)
        total = self.log_prior(theta)
        for start in range(0, N, rows):
            idx = torch.arange(start, min(start + rows, N), device=self.Phi.device)
            total = total + self.log_likelihood_terms(theta, idx).sum(-1)
        return total

    def minibatch(self, batch_size: int = 500, *, replace: bool = True, chunk_size: int = 10_000):
        r"""This model as a :class:`gpvi.models.minibatch.MinibatchTarget`: :math:`\frac NM\sum_{n\in B_t}\log s(\cdot) + \log p(\theta)`.

        Examples
        --------
        >>> import torch
        >>> from gpvi.models.logistic import BayesianLogisticRegression
        >>> g = torch.Generator().manual_seed(0)
        >>> X = torch.randn(1000, 3, generator=g, dtype=torch.float64)
        >>> m = BayesianLogisticRegression(X, (X[:, 0] > 0).double())
        >>> mb = m.minibatch(100)
        >>> mb.log_joint(torch.zeros(5, 4, dtype=torch.float64), batch=mb.sample_minibatch(g)).shape
        torch.Size([5])
        """
        prior = None if self.prior_var is None else self.log_prior
        return MinibatchTarget(self.log_likelihood_terms, self.num_data, self.names, log_prior=prior,
                               batch_size=batch_size, replace=replace, chunk_size=chunk_size,
                               initial_theta=self.initial_theta())

    # ------------------------------------------------------------------ deterministic Gaussian bound
    def expected_log_likelihood(self, mu: torch.Tensor, C: torch.Tensor, *, num_points: int = 64) -> torch.Tensor:
        r""":math:`\sum_n \mathbb E_{\mathcal N(\theta\mid\mu, CC^\top)}[\log s(y_n x_n^\top\theta)]` by Gauss–Hermite.

        Each expectation is one-dimensional: :math:`a_n = x_n^\top\theta \sim \mathcal N(m_n, s_n^2)` with
        :math:`m_n = x_n^\top\mu`, :math:`s_n = \lVert C^\top x_n\rVert`. Differentiable in ``mu`` and ``C``.
        """
        a, w = gauss_hermite(num_points)
        a, w = a.to(self.Phi), w.to(self.Phi)
        m = self.Phi @ mu
        s = torch.sqrt(((self.Phi @ C) ** 2).sum(-1) + 1e-300)
        act = m[:, None] + s[:, None] * a[None, :]
        return (-F.softplus(-self.y_pm[:, None] * act) @ w).sum()

    def gaussian_bound(self, mu: torch.Tensor, C: torch.Tensor, *, num_points: int = 64) -> torch.Tensor:
        r"""The Gaussian variational bound (paper eq. 10 with :math:`\Sigma = CC^\top`), deterministically.

        .. math::

            \mathcal F(\mu, C) = \sum_n \mathbb E_q[\log s(y_n x_n^\top\theta)]
            - \frac{\lVert\mu\rVert^2 + \lVert C\rVert_F^2}{2v} - \frac D2\log(2\pi v)
            + \sum_d \log C_{dd} + \frac D2(1 + \log 2\pi).

        Parameters
        ----------
        mu : tensor of shape (D,)
        C : tensor of shape (D, D), lower triangular with positive diagonal
        num_points : int
            Gauss–Hermite points per data point.
        """
        D = self.dim
        val = self.expected_log_likelihood(mu, C, num_points=num_points)
        if self.prior_var is not None:
            v = self.prior_var
            val = val - 0.5 * ((mu * mu).sum() + (C * C).sum()) / v - 0.5 * D * math.log(2 * math.pi * v)
        return val + torch.log(torch.diagonal(C)).sum() + 0.5 * D * (1.0 + math.log(2 * math.pi))

    # ------------------------------------------------------------------ prediction
    def predict_proba(self, X: Any, q: Any, *, num_points: int = 64, num_draws: int = 4000,
                      seed: int = 0) -> torch.Tensor:
        r"""Predictive probability :math:`p(y_*=1\mid x_*)` for each row of ``X``, shape ``(n,)``.

        Parameters
        ----------
        X : array-like of shape (n, n_features)
        q : tensor of shape (D,), PointPosterior or GaussianPosterior
            A weight vector gives :math:`s(x_*^\top\theta)`. A Gaussian posterior (standard-normal base) gives
            :math:`\mathbb E_q[s(x_*^\top\theta)]` by Gauss–Hermite on :math:`a_* \sim \mathcal N(x_*^\top\mu,
            \lVert C^\top x_*\rVert^2)`; any other posterior, a Monte Carlo average over ``num_draws`` draws.
        """
        Phi = self.design(X)
        if isinstance(q, torch.Tensor) or isinstance(q, np.ndarray):
            theta = as_float_tensor(q, "q", ndim=1, device=Phi.device)
            if theta.shape[0] != self.dim:
                raise ValueError(f"q must have length D = {self.dim}; got {theta.shape[0]}")
            return torch.sigmoid(Phi @ theta)
        if hasattr(q, "theta") and isinstance(q.theta, torch.Tensor):
            return torch.sigmoid(Phi @ q.theta.to(Phi))
        base = getattr(q, "base", None)
        if getattr(base, "kind", None) == "normal" and callable(getattr(q, "linear_marginals", None)):
            a, w = gauss_hermite(num_points)
            m, s = q.linear_marginals(Phi)
            m, s = m.to(Phi), s.to(Phi)
            return torch.sigmoid(m[:, None] + s[:, None] * a.to(Phi)[None, :]) @ w.to(Phi)
        if not callable(getattr(q, "sample", None)):
            raise TypeError(f"q must be a weight vector or a posterior; got {type(q).__name__}")
        draws = q.sample(check_positive_int(num_draws, "num_draws"), seed=seed).to(Phi)
        return torch.sigmoid(draws @ Phi.T).mean(0)

    def __repr__(self) -> str:
        return (f"BayesianLogisticRegression(N={self.num_data}, D={self.dim}, prior_var={self.prior_var}, "
                f"bias={self.bias})")
