r"""The joint posterior of kernel hyperparameters and latent values, whitened: the MCMC baseline of latent GPs.

For a latent GP :math:`f \sim \mathcal N(0, K_\theta)` with a factorised likelihood :math:`\prod_n p(y_n\mid f_n)`
(:class:`gpvi.models.classification.LatentGP`), sampling :math:`(\theta, f)` directly is hard: :math:`f`'s scale
changes with :math:`\theta` (Neal's funnel). The standard cure (Murray & Adams 2010; GPflow's ``GPMC``, Stan's latent
GPs) is the **whitened** parametrisation :math:`f = L_\theta v` with :math:`L_\theta L_\theta^\top = K_\theta +
\epsilon\,\overline{\mathrm{diag}K_\theta}\,I` and :math:`v \sim \mathcal N(0, I)` a priori, so that

.. math::

    \log p(y, v, \theta) = \sum_n \log p(y_n \mid (L_\theta v)_n) + \log\mathcal N(v \mid 0, I) + \log p(\theta),

a smooth density over :math:`z = (\theta, v) \in \mathbb R^{D + N}` that :class:`gpvi.NUTS` samples like any target
(no Jacobian term: the map :math:`v \mapsto f` is the reparametrisation of the prior itself). The jitter
:math:`\epsilon` is **fixed** (relative to the mean prior variance), so the target is one smooth function; a
:math:`\theta` whose matrix still cannot be factorised gets :math:`-\infty`.

Predictions from draws :math:`z_s = (\theta_s, v_s)`: :math:`K_\theta^{-1} f = L^{-\top} v`, so

.. math::

    \mathbb E[f_* \mid \theta, f] = K_{*X} L^{-\top} v,\qquad
    \mathrm{Var}[f_* \mid \theta, f] = k_{**} - \lVert L^{-1} K_{X*}\rVert^2,

and :math:`p(y_* = 1 \mid \mathcal D) \approx \frac1S\sum_s \mathbb E[p(y_*=1 \mid f_*) \mid \theta_s, f_s]` (the
inner expectation by quadrature, or closed form for probit).

**The likelihood's parameters** (:class:`gpvi.GPGeneralisedRegression`: negative-binomial dispersion, Student-t df
and scale, Laplace and Beta scale) are sampled too when ``learn_theta`` is set, on the log scale
:math:`\psi = \log\phi`, after :math:`\theta`: :math:`z = (\theta, \psi, v)` and

.. math::

    \log p(y, v, \theta, \psi) = \sum_n \log p(y_n \mid (L_\theta v)_n, e^\psi) + \log\mathcal N(v \mid 0, I)
      + \log p(\theta) + \log p(\psi),

with :math:`p(\psi)` from ``likelihood_priors`` (:class:`gpvi.models.likelihood_priors.LikelihoodPrior`: a prior on
the parameter with the log-Jacobian, or on its log) and, for a parameter given none, gpvi's default
:math:`\mathcal N(0, 10)` on :math:`\psi`, the prior :func:`gpvi.models.priors.default_prior` puts on every
log-hyperparameter (NUTS needs a proper density; the same vague rule as for :math:`\theta` keeps one convention
for every positive quantity, and like it, it suits standardised targets). ``likelihood_params`` chooses which are
sampled; the others stay at the likelihood's values.

Multi-class (:class:`gpvi.models.multiclass.GPMulticlass`: K latent GPs sharing :math:`K_\theta`, softmax or
robust-max): one whitened vector per class, :math:`\mathbf f_k = L_\theta\mathbf v_k`, so
:math:`z = (\theta, \mathbf v_1, \dots, \mathbf v_K) \in \mathbb R^{D + KN}` (class-major) and

.. math::

    \log p(y, V, \theta) = \sum_n \log p(y_n \mid \mathbf f_n) + \sum_k \log\mathcal N(\mathbf v_k \mid 0, I)
      + \log p(\theta),\qquad \mathbf f_n = (f_{n1}, \dots, f_{nK}).

Given a draw, the K latent values at a new input are independent with the per-class mean
:math:`K_{*X}L^{-\top}\mathbf v_k` and the common variance above; :math:`p(y_* = k\mid\mathcal D)` averages the
likelihood's :meth:`~gpvi.models.multiclass_likelihoods.Softmax.predict_proba` of those Gaussians over the draws.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..linalg import cholesky_plain
from .likelihood_priors import LIKELIHOOD_PARAMS, LikelihoodPrior, log_lik_in
from .scaled_rbf import scaled_rbf_covariance
from .priors import prior_log_prob, resolve_prior
from ..numerics.quadrature import Quadrature, gaussian_expectation

__all__ = ["WhitenedLatentGP", "WHITENING_JITTER"]

WHITENING_JITTER = 1e-6
"""Relative jitter :math:`\\epsilon` of the whitening factor (fixed, so the target is one smooth function)."""


class WhitenedLatentGP:
    r"""Target over :math:`z = (\theta, v)` for NUTS: the whitened joint of a latent GP's hyperparameters and values.

    Parameters
    ----------
    model : LatentGP
        E.g. :class:`gpvi.GPClassification` (its data, kernel and likelihood).
    prior : torch.distributions.Distribution, "default" or "scaled", optional
        Prior over the kernel's log-hyperparameters (default N(0, 10 I), as for regression, with the
        :class:`gpvi.exceptions.InputScaleWarning` of :func:`gpvi.models.priors.resolve_prior` for inputs far from unit scale
        (``None`` means the default); ``"scaled"``: centred at ``model.scaled_theta()``, data-scaled).
    learn_theta : bool
        Sample :math:`\theta` too (default); ``False`` keeps ``model.theta`` fixed and samples only :math:`v`.
    likelihood_params : sequence of str, optional
        The likelihood's parameters sampled as :math:`\psi = \log\phi` (module docstring). Default: all of them
        (:data:`gpvi.models.likelihood_priors.LIKELIHOOD_PARAMS`) when ``learn_theta``, none otherwise; ``()``:
        none. The others are held at the likelihood's values (e.g. ``["scale"]`` with a fixed Student-t ``df``).
    likelihood_priors : dict, optional
        Priors on the sampled parameters by name: ``{"df": gpytorch.priors.GammaPrior(2.0, 0.1)}`` on the parameter
        itself (with the log-Jacobian) or ``{"log_df": ...}`` on its log
        (:class:`~gpvi.models.likelihood_priors.LikelihoodPrior`); a sampled parameter not named gets
        :math:`\mathcal N(0, 10)` on its log.

    Raises
    ------
    TypeError
        A model that is not a latent GP, a ``learn_theta`` that is not a bool.
    ValueError
        ``likelihood_params`` naming parameters the likelihood does not have, or given without ``learn_theta``;
        ``likelihood_priors`` naming parameters that are not sampled, or not finite at the likelihood's values.

    Attributes
    ----------
    names : list of str
        ``model.names`` (when ``learn_theta``), then ``log_<parameter>`` for each sampled likelihood parameter, then
        ``v[0] ... v[N-1]`` (multi-class: ``v[k,n]``, class-major).
    likelihood_params : tuple of str
        The sampled likelihood parameters, in :math:`\psi`'s order.
    likelihood_prior : LikelihoodPrior or None
    dim : int
    num_classes : int
        K for a multi-class model, 1 for a binary one (one latent vector per class).

    Examples
    --------
    >>> import torch, gpvi
    >>> X = torch.linspace(-1, 1, 10, dtype=torch.float64)[:, None]
    >>> target = WhitenedLatentGP(gpvi.GPClassification(X, (X[:, 0] > 0).double()))
    >>> target.dim, target.names[:3]
    (12, ['log_lengthscale_sq[0]', 'log_signal_var', 'v[0]'])
    >>> mc = gpvi.NUTS(num_chains=1, num_warmup=50, num_draws=50, seed=0, progress_bar=False).run(target)
    >>> target.predict_proba(mc.samples, X[:2]).shape
    torch.Size([2])
    """

    def __init__(self, model: Any, prior: Any = None, *, learn_theta: bool = True, likelihood_params: Any = None,
                 likelihood_priors: dict | None = None) -> None:
        if not (hasattr(model, "kernel_matrix") and hasattr(model, "likelihood")):
            raise TypeError(f"model must be a latent GP (e.g. gpvi.GPClassification); got {type(model).__name__}")
        if not isinstance(learn_theta, bool):
            raise TypeError(f"learn_theta must be True or False; got {learn_theta!r}")
        self.model = model
        self.learn_theta = learn_theta
        self._set_likelihood_params(likelihood_params, likelihood_priors)
        self.num_theta = (model.dim + len(self.likelihood_params)) if learn_theta else 0
        # None means the default: this target needs a proper prior
        self.prior = resolve_prior("default" if prior is None else prior, model)
        n = model.num_data
        self.num_classes = int(model.num_classes) if getattr(model.likelihood, "multiclass", False) else 1
        if self.num_classes == 1:
            vnames = [f"v[{i}]" for i in range(n)]
        else:
            vnames = [f"v[{k},{i}]" for k in range(self.num_classes) for i in range(n)]
        psi_names = [f"log_{p}" for p in self.likelihood_params]
        self.names = (list(model.names) + psi_names if learn_theta else []) + vnames
        self.dim = self.num_theta + self.num_classes * n

    def _set_likelihood_params(self, params: Any, priors: dict | None) -> None:
        lik = self.model.likelihood
        own = LIKELIHOOD_PARAMS.get(getattr(lik, "name", None), ()) if hasattr(lik, "params") else ()
        if params is None:
            params = own if self.learn_theta else ()
        if isinstance(params, str):
            params = (params,)
        params = tuple(params)
        bad = [p for p in params if p not in own]
        if bad:
            raise ValueError(f"likelihood_params names {bad}, which the {getattr(lik, 'name', '?')!r} likelihood "
                             f"does not have; it has {list(own)}")
        if params and not self.learn_theta:
            raise ValueError("likelihood_params are sampled with theta: set learn_theta=True (or "
                             "likelihood_params=())")
        if priors and not params:
            raise ValueError("likelihood_priors given, but no likelihood parameter is sampled")
        self.likelihood_params: tuple[str, ...] = params
        self.likelihood_prior: LikelihoodPrior | None = None
        if params:
            self.likelihood_prior = LikelihoodPrior(lik.name, params, priors, base="default",
                                                    arg="likelihood_priors")
            self.likelihood_prior.check(self._psi0())

    def _psi0(self) -> torch.Tensor:
        lik = self.model.likelihood
        return torch.tensor([math.log(float(getattr(lik, p))) for p in self.likelihood_params],
                            dtype=torch.float64, device=self.model.X.device)

    @property
    def device(self) -> torch.device:
        return self.model.X.device

    def initial_theta(self) -> torch.Tensor:
        """NUTS's default start: the model's theta and the log of the likelihood's parameters (when sampled) and
        v = 0 (f = 0)."""
        z = torch.zeros(self.dim, dtype=torch.float64, device=self.device)
        if self.learn_theta:
            z[:self.model.dim] = self.model.theta
            z[self.model.dim:self.num_theta] = self._psi0()
        return z

    def split(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(theta, v)`` of ``z``: ``(..., D)`` and ``(..., N)``, multi-class ``(..., K, N)`` (theta is the model's
        when not sampled; the likelihood's parameters: :meth:`likelihood_values`)."""
        v = z[..., self.num_theta:]
        if self.num_classes > 1:
            v = v.reshape(*v.shape[:-1], self.num_classes, self.model.num_data)
        if self.learn_theta:
            return z[..., :self.model.dim], v
        return self.model.theta.expand(*z.shape[:-1], self.model.dim), v

    def likelihood_values(self, z: Any) -> dict[str, torch.Tensor]:
        r"""The likelihood's parameters at ``z`` on their natural scale, ``{name: (...)}`` (``exp`` of the sampled
        :math:`\psi`; the fixed ones at the likelihood's values), e.g. for draws ``(S, dim)``: ``(S,)`` each."""
        z = torch.as_tensor(z, dtype=torch.float64, device=self.device)
        lik, d = self.model.likelihood, self.model.dim
        out = {p: torch.full(z.shape[:-1], float(getattr(lik, p)), dtype=z.dtype, device=z.device)
               for p in LIKELIHOOD_PARAMS.get(lik.name, ())}
        for i, p in enumerate(self.likelihood_params):
            out[p] = torch.exp(z[..., d + i])
        return out

    def factor(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Lower factor of :math:`K_\\theta + \\epsilon\\,\\overline{\\mathrm{diag}K}\\,I` (batched) and success flags."""
        m = self.model
        if m.kernel_params.fast_path and m.use_fast_path:      # + exp(-inf) I: exactly K_theta, batched
            pad = torch.full((*theta.shape[:-1], 1), -math.inf, dtype=theta.dtype, device=theta.device)
            K = scaled_rbf_covariance(torch.cat([theta, pad], -1), m._Xc)
        else:
            K = m.kernel_params.matrix(theta, m._Xc)
        jit = WHITENING_JITTER * K.diagonal(dim1=-2, dim2=-1).mean(-1)
        eye = torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)
        return cholesky_plain(K + jit[..., None, None] * eye)

    def _latent(self, L: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """:math:`L v` with ``L`` (..., N, N): ``(..., N)``; multi-class ``v`` (..., K, N) gives ``(..., N, K)``."""
        if self.num_classes == 1:
            return (L @ v.unsqueeze(-1)).squeeze(-1)
        return L @ v.transpose(-1, -2)

    def latent(self, z: Any) -> torch.Tensor:
        """:math:`f = L_\\theta v` at the training inputs, ``(..., N)`` (multi-class: ``(..., N, K)``)."""
        z = torch.as_tensor(z, dtype=torch.float64, device=self.device)
        theta, v = self.split(z)
        L, _ = self.factor(theta)
        return self._latent(L, v)

    def log_joint(self, z: torch.Tensor) -> torch.Tensor:
        r""":math:`\log p(y, v, \theta)` for ``z`` of shape ``(dim,)`` or ``(S, dim)`` (dim = D + N, multi-class
        D + KN; with P sampled likelihood parameters D + P + N and :math:`\log p(y, v, \theta, \psi)`);
        differentiable. A model with ``weights`` has the weighted likelihood
        :math:`\sum_n w_n \log p(y_n \mid \mathbf f_n)`."""
        single = z.dim() == 1
        zb = z.unsqueeze(0) if single else z
        theta, v = self.split(zb)
        L, ok = self.factor(theta)
        L = torch.where(ok[:, None, None], L, torch.eye(L.shape[-1], dtype=L.dtype, device=L.device))
        f = self._latent(L, v)
        if self.likelihood_params:                                                 # phi per draw: (S, 1)
            params = {p: x.unsqueeze(-1) for p, x in self.likelihood_values(zb).items()}
            per_point = log_lik_in(self.model.likelihood.name, self.model.y, f, params)
        else:
            per_point = self.model.likelihood.log_prob(self.model.y, f)          # (S, N)
        w = getattr(self.model, "weights", None)                                   # likelihood weights, if any
        lik = (per_point if w is None else per_point * w).sum(-1)
        vv = v.reshape(v.shape[0], -1)
        lp = lik - 0.5 * (vv * vv).sum(-1) - 0.5 * vv.shape[-1] * math.log(2 * math.pi)
        if self.learn_theta:
            lp = lp + prior_log_prob(self.prior, theta)
        if self.likelihood_prior is not None:
            lp = lp + self.likelihood_prior.log_prob(zb[:, self.model.dim:self.num_theta])
        lp = torch.where(ok, lp, torch.full_like(lp, -math.inf))
        return lp[0] if single else lp

    def predict_latent(self, draws: Any, X_new: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-draw mean and variance of :math:`f_*` given :math:`(\\theta_s, f_s)`: ``(S, n)`` each (multi-class:
        ``(S, n, K)`` each, the variance the same in every class)."""
        z = torch.as_tensor(draws, dtype=torch.float64, device=self.device).reshape(-1, self.dim)
        theta, v = self.split(z)
        means, variances = [], []
        for th, vs in zip(theta, v):
            L, ok = self.factor(th)
            if not bool(ok):
                raise ValueError(f"draw with theta = {th.tolist()} has a kernel matrix that cannot be factorised")
            Ksx = self.model.cross_covariance(th, X_new)                      # (n, N)
            A = torch.linalg.solve_triangular(L, Ksx.T, upper=False)          # L^{-1} K_{X*}
            var = (self.model.prior_variance(th, X_new) - (A * A).sum(0)).clamp_min(0.0)
            if self.num_classes == 1:
                means.append(A.T @ vs)                                        # K_{*X} L^{-T} v
            else:
                means.append(A.T @ vs.T)                                      # (n, K)
                var = var.unsqueeze(-1).expand(-1, self.num_classes)
            variances.append(var)
        return torch.stack(means), torch.stack(variances)

    def predict_proba(self, draws: Any, X_new: Any) -> torch.Tensor:
        """:math:`p(y_* = 1\\mid\\mathcal D)` averaged over the draws, shape ``(n,)`` (binary likelihoods);
        multi-class: :math:`p(y_* = k\\mid\\mathcal D)`, shape ``(n, K)`` (columns in the order of
        ``model.classes``)."""
        lik = self.model.likelihood
        if self.num_classes > 1:
            m, var = self.predict_latent(draws, X_new)
            return torch.stack([lik.predict_proba(ms, vs) for ms, vs in zip(m, var)]).mean(0)
        if not getattr(lik, "binary", False):
            raise TypeError(f"predict_proba needs a binary or multi-class likelihood; this model's is {lik.name!r}")
        m, var = self.predict_latent(draws, X_new)
        if lik.name == "probit":
            p = torch.special.ndtr(m / torch.sqrt(1.0 + var))
        else:
            p = gaussian_expectation(lik.response, m.reshape(-1), var.reshape(-1), Quadrature()).reshape(m.shape)
        return p.mean(0).clamp(0.0, 1.0)

    def __repr__(self) -> str:
        return f"WhitenedLatentGP(model={self.model!r}, learn_theta={self.learn_theta}, dim={self.dim})"
