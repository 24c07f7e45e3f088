r"""Latent Gaussian-process models with a factorised non-conjugate likelihood (the CVI paper's "GP example").

.. math::

    p(\mathbf y, \mathbf f) = \Big[\prod_{n=1}^N p(y_n \mid f_n)\Big]\,\mathcal N(\mathbf f \mid 0, K_\theta)

(Khan & Lin 2017, eq. 4). :class:`LatentGP` holds the data, the likelihood and the kernel (through
:class:`gpvi.models.hyperparameters.KernelParametrisation`, so theta is the vector of **log-hyperparameters of the
kernel only**: there is no noise term) and evaluates :math:`K_\theta`. :class:`GPClassification` is the binary
front door: labels are checked by :func:`gpvi.validation.check_binary_labels` ({0, 1} or {-1, +1}) and the link
is ``"logit"`` or ``"probit"``. The inference engine is :class:`gpvi.inference.cvi.engine.CVI`.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import gpytorch
import numpy as np
import torch

from .gpytorch_likelihoods import link_of_gpytorch, site_likelihood_of_gpytorch
from .likelihoods import Likelihood, expected_log_lik, make_likelihood
from .scaled_rbf import centre_inputs, input_centre, scaled_rbf_covariance, scaled_rbf_vjp
from .hyperparameters import KernelParametrisation
from .model_prior import ModelPrior
from .priors import resolve_prior
from ..validation import (as_float_tensor, check_binary_labels, check_column_spread, check_feature_columns,
                          check_feature_names, check_finite_prediction, check_memory, check_sample_weight,
                          check_theta, check_X, feature_names_of)

__all__ = ["LatentGP", "GPClassification"]


class LatentGP:
    r"""A GP prior :math:`f \sim \mathcal{GP}(0, k_\theta)` with a factorised likelihood :math:`\prod_n p(y_n \mid f_n)`.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Training inputs (numpy or torch; converted to float64 without loss).
    y : array-like of shape (n_samples,)
        Targets. For a binary likelihood they must be labels in {0, 1} or {-1, +1} (stored as 0/1 floats);
        otherwise real values.
    kernel : gpytorch.kernels.Kernel, optional
        Covariance function (deep-copied); default ``ScaleKernel(RBFKernel(ard_num_dims=n_features))``. Frozen
        parameters (``requires_grad=False``) are held at their values and are not in theta; registered priors are
        the hyperparameters' prior in the type-II and fully Bayesian fits (:func:`gpvi.models.priors.resolve_prior`);
        ``GreaterThan`` / ``Interval`` constraints are honoured (:mod:`gpvi.models.parameters`).
    likelihood : str, Likelihood or gpytorch.likelihoods.Likelihood
        Site likelihood: a name of :func:`gpvi.models.likelihoods.make_likelihood` (``"logit"``, ``"probit"``,
        ``"poisson"``, ``"student_t"``...), a likelihood object (``Gaussian(noise_var)``,
        :mod:`gpvi.models.latent_likelihoods`) or a one-dimensional GPyTorch likelihood
        (:func:`gpvi.models.gpytorch_likelihoods.site_likelihood_of_gpytorch`; ``BernoulliLikelihood()`` is the
        probit). A likelihood with ``check_targets`` checks ``y`` (counts, proportions).
    theta : array-like of shape (D,), optional
        Log-hyperparameters of the kernel at which :math:`K_\theta` is evaluated by default (the starting
        point when they are learned). Default: :meth:`initial_theta`, the values the user set on the kernel
        (different from GPyTorch's initial values) and data-scaled values for the rest (lengthscale^2 = d
        var(x_j), signal variance 1): the same rule as :meth:`gpvi.GPRegression.initial_theta`.
    device : torch.device or str, optional
    feature_names : sequence of str, optional
        One name per column of ``X`` (default: a pandas DataFrame's string column names); per-column
        lengthscales are then named by column (``log_lengthscale_sq[nox]``). A DataFrame at new inputs (every
        posterior's ``predict*``) must then have these columns in this order, or ``ValueError`` names the
        columns missing, unexpected or out of order; plain arrays and tensors are read by position.
    weights : array-like of shape (n_samples,), optional
        Non-negative weights :math:`w_n` of the likelihood terms, :math:`\prod_n p(y_n \mid f_n)^{w_n}`
        (``GPClassifier.fit``'s ``sample_weight``): an integer weight is the same as repeating the row, 0 as
        removing it (its site stays empty). They also weight the input variances of :meth:`initial_theta` and
        :meth:`log_input_scale`. Used by CVI and type-II; the fully Bayesian fit (EP's evidence) refuses them.

    Raises
    ------
    ValueError
        At construction: a kernel that does not fit ``X``'s columns, a column whose spread overflows float64,
        non-finite or empty data, bad labels.
    TypeError
        Non-numeric data (strings, objects).

    Attributes
    ----------
    X, y : torch.Tensor
        float64 training inputs ``(N, d)`` and targets ``(N,)``.
    likelihood : Likelihood
    link : str
        The likelihood's name (``"logit"``, ``"probit"``, ``"gaussian"``).
    names, natural_names : list of str
        theta's components, e.g. ``["log_lengthscale_sq[0]", ..., "log_signal_var"]``.
    theta : torch.Tensor of shape (D,)
    kernel_params : KernelParametrisation

    Examples
    --------
    >>> import torch
    >>> from gpvi.models.likelihoods import Gaussian
    >>> X = torch.linspace(-1, 1, 8, dtype=torch.float64).unsqueeze(-1)
    >>> model = LatentGP(X, torch.sin(3 * X[:, 0]), likelihood=Gaussian(0.1))
    >>> model.names
    ['log_lengthscale_sq[0]', 'log_signal_var']
    >>> model.kernel_matrix().shape
    torch.Size([8, 8])
    """

    use_fast_path: bool = True
    """Use :func:`gpvi.models.scaled_rbf.scaled_rbf_covariance` for ``ScaleKernel(RBFKernel)`` (exact same values)."""

    def __init__(self, X: Any, y: Any, kernel: gpytorch.kernels.Kernel | None = None,
                 likelihood: str | Likelihood = "logit", theta: Any = None, *,
                 device: torch.device | str | None = None, feature_names: Any = None, weights: Any = None) -> None:
        self.likelihood = make_likelihood(site_likelihood_of_gpytorch(likelihood))
        names_in = feature_names_of(X) if feature_names is None else feature_names
        Xt = check_X(X, "X", device=device, copy=True)
        self._set_targets(y, Xt)
        n, d = Xt.shape
        self.weights = check_sample_weight(weights, n, "weights", device=Xt.device)
        self.feature_names = check_feature_names(names_in, d)
        check_column_spread(Xt, "X", self.feature_names)
        check_memory(n, copies=4, device=Xt.device, what="exact latent-GP inference (CVI)")
        self.X = Xt
        if kernel is None:
            kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=d))
        self.kernel_params = KernelParametrisation(kernel, dtype=torch.float64, device=Xt.device)
        self.kernel_params.bind_inputs(Xt, self.feature_names)
        self.kernel_params.registered_priors()             # a prior gpvi cannot tie to theta: refused here
        self.kernel_template = copy.deepcopy(kernel)
        # stationary kernels see centred inputs (same centre for X_new): shift-exact, see gpvi.models.scaled_rbf
        self._centre = input_centre(Xt, self.kernel_params.kernel)
        self._Xc = centre_inputs(Xt, self._centre)
        self.names = list(self.kernel_params.names)
        self.natural_names = list(self.kernel_params.natural_names)
        if theta is None:
            th = self.initial_theta()
        else:
            th = check_theta(theta, self.dim, "theta", device=Xt.device).detach().clone()
            if th.dim() != 1:
                raise ValueError(f"theta must have shape ({self.dim},); got {tuple(th.shape)}")
            if not bool(torch.isfinite(th).all()):
                raise ValueError("theta contains non-finite values")
        self.theta = th
        self._cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def _set_targets(self, y: Any, X: torch.Tensor) -> None:
        if self.likelihood.binary:
            y01, classes = check_binary_labels(y, "y", device=X.device)
            self.classes = classes
        else:
            y01 = as_float_tensor(y, "y", ndim=(1, 2), device=X.device)
            if y01.dim() == 2:
                if y01.shape[1] != 1:
                    raise ValueError(f"y must be 1-D (one target per row); got shape {tuple(y01.shape)}")
                y01 = y01[:, 0]
            check = getattr(self.likelihood, "check_targets", None)
            if check is not None:                  # counts, proportions, a GPyTorch likelihood's support
                y01 = check(y01, "y")
            self.classes = None
        if y01.shape[0] != X.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows but y has {y01.shape[0]}")
        if X.shape[0] < 2:
            raise ValueError(f"X has {X.shape[0]} row(s); need at least 2 training points")
        self.y = y01

    # ------------------------------------------------------------------ basics
    @property
    def dim(self) -> int:
        """Number of kernel hyperparameters D."""
        return self.kernel_params.dim

    @property
    def num_data(self) -> int:
        """Number of training points N."""
        return self.X.shape[0]

    @property
    def site_shape(self) -> tuple[int, ...]:
        """Shape of CVI's site parameters: ``(N,)`` (one latent function)."""
        return (self.num_data,)

    @property
    def link(self) -> str:
        return self.likelihood.name

    @property
    def device(self) -> torch.device:
        return self.X.device

    def check_theta(self, theta: Any = None, name: str = "theta") -> torch.Tensor:
        """Validated ``(D,)`` theta (``None`` -> the model's theta); keeps autograd graphs."""
        if theta is None:
            return self.theta
        t = check_theta(theta, self.dim, name, device=self.X.device)
        if t.dim() != 1:
            raise ValueError(f"{name} must have shape ({self.dim},); got {tuple(t.shape)}")
        if not bool(torch.isfinite(t.detach()).all()):      # a NaN kernel matrix is never returned without a word
            raise ValueError(f"{name} contains non-finite values: {t.detach().tolist()}")
        return t

    # ------------------------------------------------------------------ kernel matrices
    def _matrix(self, theta: torch.Tensor, X1: torch.Tensor, X2: torch.Tensor | None = None) -> torch.Tensor:
        kp = self.kernel_params
        if X2 is None and kp.fast_path and self.use_fast_path:
            # the fast path builds K + exp(log_noise) I; log_noise = -inf adds exactly 0
            pad = torch.full((1,), -math.inf, dtype=theta.dtype, device=theta.device)
            return scaled_rbf_covariance(torch.cat([theta, pad]), X1)
        return kp.matrix(theta, X1, X2)

    def kernel_matrix(self, theta: Any = None) -> torch.Tensor:
        r""":math:`K_\theta` at the training inputs, ``(N, N)``; differentiable if ``theta`` requires grad.

        The value for the last theta that did not require grad is cached (the engine calls this often).
        """
        t = self.check_theta(theta)
        if t.requires_grad:
            return self._matrix(t, self._Xc)
        if self._cache is not None and torch.equal(self._cache[0], t):
            return self._cache[1]
        with torch.no_grad():
            K = self._matrix(t, self._Xc).contiguous()
        self._cache = (t.detach().clone(), K)
        return K

    def kernel_vjp(self, theta: Any, G: torch.Tensor) -> torch.Tensor:
        r"""The gradient in ``theta`` of :math:`\sum_{ij} (K_\theta)_{ij} G_{ij}` for a matrix ``G`` (N, N): what
        autograd through :meth:`kernel_matrix` gives. On the fast path (:func:`~gpvi.models.scaled_rbf.scaled_rbf_vjp`)
        from the cached :math:`K_\theta` (the same arithmetic as autograd's backward, without building the matrix
        again: the type-II gradient after an inner run at the same theta)."""
        t = self.check_theta(theta).detach()
        if self.kernel_params.fast_path and self.use_fast_path:
            pad = torch.full((1,), -math.inf, dtype=t.dtype, device=t.device)
            return scaled_rbf_vjp(torch.cat([t, pad]), self._Xc, self.kernel_matrix(t), G)[:-1]
        th = t.clone().requires_grad_(True)
        with torch.enable_grad():
            return torch.autograd.grad((self._matrix(th, self._Xc) * G).sum(), th)[0]

    def _new_inputs(self, X_new: Any) -> torch.Tensor:
        """``X_new`` checked against the training columns (a DataFrame's names too: ``feature_names``, in order) and
        centred like them (shift invariance)."""
        check_feature_columns(X_new, self.feature_names, "X_new")
        return centre_inputs(check_X(X_new, "X_new", n_features=self.X.shape[1], device=self.X.device), self._centre)

    def cross_covariance(self, theta: Any, X_new: Any) -> torch.Tensor:
        r""":math:`K_{*X} = k_\theta(X_*, X)`, shape ``(n, N)``."""
        t, Xs = self.check_theta(theta), self._new_inputs(X_new)
        with torch.no_grad():
            K = self.kernel_params.matrix(t.detach(), Xs, self._Xc)
        check_finite_prediction(K.T, K.T, "X_new", what="the kernel")     # overflow: an error, never NaN
        return K

    def prior_variance(self, theta: Any, X_new: Any) -> torch.Tensor:
        r""":math:`k_\theta(x_*, x_*)` for each row of ``X_new``, shape ``(n,)``."""
        t, Xs = self.check_theta(theta), self._new_inputs(X_new)
        with torch.no_grad():
            k = self.kernel_params.matrix(t.detach(), Xs, diag=True)
        check_finite_prediction(k, k, "X_new", what="the kernel")
        return k

    # ------------------------------------------------------------------ helpers
    def initial_theta(self) -> torch.Tensor:
        """The start: values the user set on the kernel (different from GPyTorch's initial values) are kept, the
        rest is :meth:`scaled_theta`'s."""
        return self.kernel_params.initial_theta(self._Xc, self.weights).to(torch.float64)

    def scaled_theta(self) -> torch.Tensor:
        """Data-scaled values whatever the kernel holds: ``lengthscale^2 = d var(x_j)``, signal variance 1 (log 0),
        others 0 (with ``weights``, the weighted variances: weights act as repeated rows); the centre of the
        ``"scaled"`` prior (:func:`gpvi.models.priors.resolve_prior`), which depends on ``X`` only."""
        return self.kernel_params.initial_theta(self._Xc, self.weights, keep_user=False).to(torch.float64)

    def prior_parts(self) -> tuple[list[Any], list[Any]]:
        """theta's blocks and the priors registered on the kernel (:func:`gpvi.models.priors.resolve_prior`)."""
        return list(self.kernel_params.blocks), self.kernel_params.registered_priors()

    def prior_summary(self, prior: Any = "default") -> dict[str, str]:
        """``{theta name: its prior}`` under the prior setting ``prior`` of the type-II and fully Bayesian fits
        (``GPClassifier(prior=...)``: ``"default"``, ``"scaled"``, ``None``, ``{name: distribution}`` or a
        distribution; :func:`gpvi.models.priors.resolve_prior`): registered, named or the base prior of each
        component, and the kernel's frozen parameters as ``"fixed at v"``."""
        p = resolve_prior(prior, self)
        if isinstance(p, ModelPrior):
            out = p.summary()
        else:
            out = dict(zip(self.names, _prior_labels(p, prior, self.dim)))
        out.update({n: f"fixed at {v}" for n, v in self.fixed.items()})
        return out

    @property
    def fixed(self) -> dict:
        """``{natural name: value}`` of the kernel's frozen parameters (held fixed, not in theta)."""
        return dict(self.kernel_params.fixed)

    def log_input_scale(self) -> torch.Tensor:
        """:meth:`~gpvi.models.hyperparameters.KernelParams.log_input_scale` at this model's inputs (weighted as
        :meth:`initial_theta`), shape (D,)."""
        return self.kernel_params.log_input_scale(self._Xc, self.weights).to(torch.float64)

    def site_expectations(self, m: torch.Tensor, v: torch.Tensor, idx: torch.Tensor | None = None, **rule: Any
                          ) -> Any:
        r"""The likelihood terms of the sites ``idx`` (all when None) under their marginals ``m``, ``v``:
        :math:`w_n\,\mathbb E_q[\log p(y_n \mid \mathbf f_n)]` and its derivatives in :math:`m_n, v_n`
        (``(value, dm, dv)``), by the likelihood's rule (``rule``: the keyword arguments of
        :func:`gpvi.models.likelihoods.expected_log_lik`). :math:`w_n` = ``weights`` (1 without): the weighted
        likelihood :math:`\prod_n p(y_n \mid \mathbf f_n)^{w_n}` has these terms in the bound, and CVI's site
        gradients (Khan & Lin 2017, eq. 13) scale with them. Every CVI engine evaluates the model's likelihood
        here."""
        ex = self._expectations(self.y if idx is None else self.y[idx], m, v, **rule)
        if self.weights is None:
            return ex
        w = self.weights if idx is None else self.weights[idx]
        wk = w if ex.dm.dim() == 1 else w.unsqueeze(-1)
        return type(ex)(ex.value * w, ex.dm * wk, ex.dv * wk)

    def _expectations(self, y: torch.Tensor, m: torch.Tensor, v: torch.Tensor, **rule: Any) -> Any:
        return expected_log_lik(self.likelihood, y, m, v, **rule)

    def theta_box(self, bounds: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
        r"""The learning box of every log-hyperparameter, ``(low, high)`` vectors of shape (D,): ``bounds`` shifted
        by :meth:`log_input_scale`, so a lengthscale^2 is kept within
        :math:`\operatorname{var}(x_j)\,[e^{low}, e^{high}]` and variances within :math:`[e^{low}, e^{high}]`.
        For standardised inputs that is ``bounds`` itself; scaling an input moves its lengthscale's box with it.
        """
        lo, hi = bounds
        shift = self.log_input_scale().cpu()
        return shift + float(lo), shift + float(hi)

    def natural(self, theta: Any = None) -> torch.Tensor:
        """Natural-scale values (lengthscales ``exp(theta/2)``, variances ``exp(theta)``), the shape of theta:
        ``(D,)`` (default: the model's theta) or a batch ``(S, D)`` (as ``GPRegression.natural``)."""
        if theta is not None:
            t = check_theta(theta, self.dim, "theta", device=self.X.device)
            if t.dim() == 2:
                return self.kernel_params.natural(t.detach())
        return self.kernel_params.natural(self.check_theta(theta).detach())

    def describe(self, theta: Any = None) -> dict[str, float]:
        """``{natural name: value}`` for theta (default: the model's)."""
        nat = self.natural(theta)
        return {n: float(v) for n, v in zip(self.natural_names, nat)}

    def kernel_at(self, theta: Any = None) -> gpytorch.kernels.Kernel:
        """A copy of the user's (or default) GPyTorch kernel with its hyperparameters set to ``theta``."""
        t = self.check_theta(theta).detach()
        k = copy.deepcopy(self.kernel_template).to(dtype=torch.float64, device=self.X.device)
        for b in self.kernel_params.blocks:
            owner_path, _, pname = b.path.rpartition(".")
            owner = k.get_submodule(owner_path) if owner_path else k
            raw = owner._parameters[pname]
            vals = t[b.start:b.stop].reshape(b.shape).to(raw)
            stem = pname[4:] if pname.startswith("raw_") else pname
            with torch.no_grad():
                if b.log:
                    setattr(owner, stem, torch.exp(b.natural_power * vals))
                elif b.bijection.kind == "raw":
                    raw.copy_(vals)
                else:                           # GreaterThan / Interval: the template's own constraint
                    c = owner.constraint_for_parameter_name(pname)
                    raw.copy_(c.inverse_transform(b.bijection.forward(vals)))
        return k

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(N={self.num_data}, d={self.X.shape[1]}, D={self.dim}, "
                f"likelihood={self.link!r}, kernel={type(self.kernel_params.kernel).__name__})")


class GPClassification(LatentGP):
    r"""Binary GP classification: :math:`p(y_n = 1 \mid f_n) = \sigma(f_n)` (logit) or :math:`\Phi(f_n)` (probit).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    y : array-like of shape (n_samples,)
        Labels in {0, 1} or {-1, +1} (booleans accepted); anything else (NaN, three classes, one class) is a
        ``ValueError`` naming ``y``.
    kernel : gpytorch.kernels.Kernel, optional
        Default ``ScaleKernel(RBFKernel(ard_num_dims=n_features))``.
    likelihood : {"logit", "probit"} or gpytorch.likelihoods.BernoulliLikelihood
        The link (default ``"logit"``, the CVI paper's and scikit-learn's; GPyTorch's ``BernoulliLikelihood()``
        is accepted and is the probit). Every result records it.
    theta : array-like of shape (D,), optional
        Kernel log-hyperparameters; see :class:`LatentGP`.
    device : torch.device or str, optional
    feature_names : sequence of str, optional
        See :class:`LatentGP`.
    weights : array-like of shape (n_samples,), optional
        Likelihood weights; see :class:`LatentGP`.

    Attributes
    ----------
    classes : numpy.ndarray of shape (2,)
        The original label values, sorted (``classes[1]`` is the positive class, ``y = 1`` internally).

    Examples
    --------
    >>> import gpvi
    >>> from gpvi.models.classification import GPClassification
    >>> ds = gpvi.datasets.load_pima()
    >>> model = GPClassification(ds.X_train, ds.y_train, likelihood="probit")
    >>> model.link, model.num_data, model.dim
    ('probit', 200, 8)
    """

    def __init__(self, X: Any, y: Any, kernel: gpytorch.kernels.Kernel | None = None,
                 likelihood: str | Likelihood = "logit", theta: Any = None, *,
                 device: torch.device | str | None = None, feature_names: Any = None, weights: Any = None) -> None:
        lik = make_likelihood(link_of_gpytorch(likelihood))
        if not getattr(lik, "binary", False):
            raise ValueError(f"likelihood must be a binary likelihood ('logit' or 'probit'); got {lik.name!r} "
                             f"(use gpvi.models.classification.LatentGP for other likelihoods)")
        super().__init__(X, y, kernel, lik, theta, device=device, feature_names=feature_names, weights=weights)
        self.classes: np.ndarray


def _prior_labels(p: Any, setting: Any, dim: int) -> list[str]:
    """One label per theta component for a prior over the whole theta: ``N(mean, variance)`` for a normal prior (or
    a multivariate normal's marginal), else the distribution's name with its mean and variance when it has them."""
    if p is None:
        return ["flat (no prior)"] * dim
    tag = {"default": " (gpvi default)", "scaled": " (gpvi 'scaled': centred at the data's scales)"}.get(
        setting if isinstance(setting, str) else "", "")
    base = p.base_dist if isinstance(p, torch.distributions.Independent) else p
    name = type(p).__name__ + (f"({type(base).__name__})" if base is not p else "")
    try:
        mean = p.mean.detach().expand(dim).tolist()
        var = p.variance.detach().expand(dim).tolist()
    except (NotImplementedError, RuntimeError):           # no moments, or not one per component
        return [f"{name} over theta"] * dim
    if isinstance(base, torch.distributions.Normal):
        return [f"N({m:.4g}, {v:.4g}) on theta{tag}" for m, v in zip(mean, var)]
    if isinstance(p, torch.distributions.MultivariateNormal):
        return [f"N({m:.4g}, {v:.4g}) on theta (a marginal of the MultivariateNormal)" for m, v in zip(mean, var)]
    return [f"{name} over theta (mean {m:.4g}, variance {v:.4g})" for m, v in zip(mean, var)]
