r"""GP regression with all hyperparameters in one unconstrained vector theta.

Model (Rasmussen & Williams 2006, ch. 2 and 5; DSVI paper section 3.4):

.. math::

    y = \bar y + f(X) + \varepsilon,\quad f \sim \mathcal{GP}(0, k_\theta),\quad
    \varepsilon \sim \mathcal N(0, \sigma^2 I),

    \log g(\theta) = \log \mathcal N(y - \bar y \mid 0, K_\theta + \sigma^2 I) + \log p(\theta),

with :math:`\bar y` the training mean of y (``y_offset``), unless the model accounts for a constant itself: then
:math:`\bar y = 0` and y is used as given (a mean object, or a ``ConstantKernel`` term in the kernel, whose
variance is the prior of a random offset).

For the default kernel ``ScaleKernel(RBFKernel(ard_num_dims=d))``,
``theta = [log l_1^2, ..., log l_d^2, log sigma_f^2, log sigma^2]`` exactly as in the paper; other GPyTorch
kernels get their own log-parametrised names (see :mod:`gpvi.models.hyperparameters`). The noise variance is the
model's own component ``log_noise_var`` after the kernel's (no GPyTorch likelihood, hence no hidden noise floor)
unless a ``GaussianLikelihood`` is given: then its noise parameter, with its constraint (``GreaterThan(1e-4)`` by
default: theta = ``log_excess_noise_var`` = log(noise - 1e-4)) and its registered prior. A ``ConstantMean`` adds
its constant :math:`c` as the last component ``mean_constant`` (a hyperparameter with its prior, not integrated
out): :math:`y \sim \mathcal N(c\mathbf 1, K_\theta + \sigma^2 I)`. Priors: :class:`gpvi.models.model_prior.ModelPrior`.

**Units.** The model's answers do not depend on the data's units: fitted to :math:`(a x + b, c y + d)` it gives the
same answer in standardised units as on :math:`(x, y)` (``tests/models/test_scale_equivariance.py``, a and c over
1e-8..1e8). Three things make it so: inputs are centred for stationary kernels, y is centred at its training mean
(not when the model has its own constant: a mean object or a ``ConstantKernel`` term; then an offset d is the
user's model's business), and the default prior and ML-II's box are set from the data, centred at :meth:`standard_theta` (0 on standardised
data, where the default prior is the DSVI paper's :math:`\mathcal N(0, 10 I)` exactly as before). It holds for
gpvi's own noise and the amplitudes and lengthscales of stationary kernels; priors the user gives (registered or
named, on natural values) stay on the user's scale, and so do a GPyTorch likelihood's absolute noise floor
(``GreaterThan(1e-4)``) and the parameters of other kernels.

The marginal likelihood is exact: one Cholesky factorisation per theta, batched for ``(S, D)`` input
(never CG/Lanczos), with the backward pass of :func:`gpvi.linalg.gaussian_log_marginal`.
"""

from __future__ import annotations

import math
from typing import Any

import gpytorch
import torch

from ..linalg import DEFAULT_JITTER, DEFAULT_MAX_JITTER, cholesky_with_jitter, gaussian_log_marginal
from .hyperparameters import KernelParametrisation
from .lean_joint import LEAN_JOINT_MAX_N, LeanLogJoint, lean_apply
from .priors import prior_log_prob
from .regression_parts import NoiseMeanPrior, finite_rows_only
from .regression_predict import RegressionPrediction
from .scaled_rbf import (LEAN_MIN_N, centre_inputs, input_centre, lean_copies, lean_log_marginal,
                         scaled_rbf_covariance)
from ..validation import (check_column_spread, check_feature_names, check_memory, check_positive, check_positive_int,
                          check_theta, check_X_y, feature_names_of)

__all__ = ["GPRegression"]


class GPRegression(NoiseMeanPrior, RegressionPrediction):
    r"""Exact GP regression as an inference target over log-hyperparameters.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Training inputs (numpy or torch; integer/float32 converted to float64 without loss).
    y : array-like of shape (n_samples,)
        Training targets, in any units (see "Units" in the module docstring); centred at their mean unless
        ``mean`` is given or the kernel has a ``ConstantKernel`` term.
    kernel : gpytorch.kernels.Kernel, optional
        Covariance function; default ``ScaleKernel(RBFKernel(ard_num_dims=n_features))``. It is deep-copied;
        hyperparameter values come from theta, except frozen parameters (``requires_grad=False``), held at their
        values (:attr:`fixed`). Values set on it (different from GPyTorch's initial values) are the start,
        :meth:`initial_theta`. Priors registered on it are part of the model's prior; ``GreaterThan`` and
        ``Interval`` constraints are honoured (:mod:`gpvi.models.parameters`).
    prior : {"default", "scaled"}, torch.distributions.Distribution or dict, optional
        Prior over theta (anything with ``log_prob``); or ``{name: distribution}`` on natural-scale quantities
        (``"lengthscale"``, ``"lengthscale[nox]"``, ``"signal_sd"``, ``"signal_var"``, ``"noise_sd"``,
        ``"noise_var"``, ...: :func:`gpvi.models.model_prior.resolve_names`), with the Jacobian, on the user's
        scale. Every component not covered by a registered or named prior gets the base prior: ``None`` or
        ``"default"``, independent :math:`\mathcal N(c_j, 10)` centred at :meth:`standard_theta` (the DSVI paper's
        N(0, 10) on the standardised problem; sd :math:`\sqrt{10}\,\mathrm{sd}(y)` for a mean constant,
        :meth:`standard_scale`); ``"scaled"``, the same centred at :meth:`scaled_theta`, the data-scaled start (as
        ``GPClassifier(prior="scaled")``). The rule: :mod:`gpvi.models.model_prior`. A prior that is -inf or NaN at
        :meth:`initial_theta` is refused.
    likelihood : gpytorch.likelihoods.GaussianLikelihood or FixedNoiseGaussianLikelihood, optional
        The noise, with its constraint, prior or frozen value; default gpvi's own ``log_noise_var`` (no floor). A
        ``FixedNoiseGaussianLikelihood(noise=v)`` gives known per-point noise variances :math:`v_n` (one per training
        row): the covariance is :math:`K_\theta + \operatorname{diag}(v)`, plus a learned homoskedastic
        :math:`\sigma^2` (in theta, with its constraint and prior) when ``learn_additional_noise=True``. It stays
        conjugate and exact; it takes GPyTorch's kernel path (no fast path). The known noise exists at the training
        rows only, so predictions of y* add the learned :math:`\sigma^2` alone (0 without it): give new points'
        known noise yourself.
    mean : gpytorch.means.ConstantMean or ZeroMean, optional
        A constant mean adds its constant to theta (``mean_constant``, with its registered prior); ``ZeroMean()``
        is a zero mean on y as given. Default (None): y centred at its training mean, a fixed offset
        (:attr:`y_offset`, added back to every prediction), unless the kernel has a ``ConstantKernel`` term (the
        user's model of the offset: y as given, as written).
    jitter, max_jitter : float
        Relative jitter policy of :func:`gpvi.linalg.cholesky_with_jitter`.
    batch_size : int
        Largest number of theta processed in one batched factorisation by :meth:`predict`.
    device : torch.device or str, optional
        Where data and computations live (default: the device of ``X`` if a tensor, else CPU).
    feature_names : sequence of str, optional
        One name per column of ``X``; default: the column names of a pandas DataFrame ``X`` (when they are all
        strings), else none. Per-column lengthscales are then named by column: ``log_lengthscale_sq[nox]``. A
        DataFrame at new inputs (:meth:`predict`, every posterior's ``predict``) must then have these columns in this
        order (else ``ValueError`` naming the columns); arrays and tensors are read by position, and so is a DataFrame
        given to a model without names, with a ``UserWarning`` (scikit-learn's rule).

    Raises
    ------
    ValueError
        At construction, never later: a kernel that does not fit ``X``'s columns (``ard_num_dims`` or
        ``active_dims``), a column whose spread overflows float64 (see
        :func:`gpvi.validation.check_column_spread`), non-finite or empty data, constant ``y``.
    TypeError
        Non-numeric data (strings, objects), a kernel that is not a GPyTorch kernel.

    Attributes
    ----------
    names : list of str
        Names of theta's components, e.g. ``["log_lengthscale_sq[0]", ..., "log_signal_var", "log_noise_var"]``.
    feature_names : list of str or None
        The column names, when known.
    natural_names : list of str
        The same on the natural scale (``lengthscale[0]``, ``signal_var``, ``noise_var``).
    dim : int
        D = len(names).
    fixed : dict
        ``{natural name: value}`` of frozen parameters (kernel, likelihood, mean): held fixed, not in theta.
    X, y : torch.Tensor
        Training data (float64), as given.
    y_offset : float
        The training mean of y when ``mean`` is None and the kernel has no ``ConstantKernel`` term (the GP models
        ``y - y_offset``), else 0.

    Examples
    --------
    >>> import gpvi
    >>> ds = gpvi.datasets.load_boston(seed=0)
    >>> model = gpvi.GPRegression(ds.X_train, ds.y_train)
    >>> model.names[-2:]
    ['log_signal_var', 'log_noise_var']
    >>> model.log_joint(model.initial_theta()).shape
    torch.Size([])
    """

    use_fast_path: bool = True
    """Use the closed-form log joint of :mod:`gpvi.models.lean_joint` (stationary kernels, small and moderate N) and
    the hand-written covariance of :mod:`gpvi.models.scaled_rbf` for ``ScaleKernel(RBFKernel)`` (same values and
    gradients as GPyTorch's generic path, which tests check; set False to force the generic path)."""

    lean_min_n: int = LEAN_MIN_N
    """From this N on, the fast path evaluates one theta at a time in two N x N buffers
    (:mod:`gpvi.models.scaled_rbf`); below it, batches of theta go through one batched Cholesky."""

    def __init__(
        self,
        X: Any,
        y: Any,
        kernel: gpytorch.kernels.Kernel | None = None,
        prior: Any = None,
        *,
        jitter: float = DEFAULT_JITTER,
        max_jitter: float = DEFAULT_MAX_JITTER,
        batch_size: int = 32,
        device: torch.device | str | None = None,
        feature_names: Any = None,
        likelihood: Any = None,
        mean: Any = None,
    ) -> None:
        names_in = feature_names_of(X) if feature_names is None else feature_names
        X, y = check_X_y(X, y, device=device)
        n, d = X.shape
        self.feature_names = check_feature_names(names_in, d)
        check_column_spread(X, "X", self.feature_names)
        check_column_spread(y, "y")
        if n < 2:
            raise ValueError(f"X has {n} row(s); GP regression needs at least 2 training points")
        if float(y.std()) == 0.0:
            raise ValueError(f"y is constant (all values {float(y[0]):g}); a GP regression posterior over "
                             f"hyperparameters is not identified for constant targets")
        self.jitter = check_positive(jitter, "jitter")
        self.max_jitter = check_positive(max_jitter, "max_jitter")
        if self.max_jitter < self.jitter:
            raise ValueError(f"max_jitter ({max_jitter:g}) must be >= jitter ({jitter:g})")
        self.batch_size = check_positive_int(batch_size, "batch_size")
        if kernel is None:
            kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=d))
        self.kernel_params = KernelParametrisation(kernel, dtype=torch.float64, device=X.device)
        self.kernel_params.bind_inputs(X, self.feature_names)
        fast = self.kernel_params.fast_path and self.use_fast_path
        check_memory(n, copies=lean_copies(X.device) if fast and n >= self.lean_min_n else 5, device=X.device,
                     what="exact GP regression")
        self.X, self.y = X, y
        own_constant = any(isinstance(m, gpytorch.kernels.ConstantKernel) for m in kernel.modules())
        self.y_offset = float(y.mean()) if mean is None and not own_constant else 0.0
        self._y = y - self.y_offset            # the targets the GP sees (y itself when a mean object is given)
        # stationary kernels see centred inputs (same centre for X_new): shift-exact, see gpvi.models.scaled_rbf
        self._centre = input_centre(X, self.kernel_params.kernel)
        self._Xc = centre_inputs(X, self._centre)
        self._set_noise_and_mean(likelihood, mean)
        self.names = [n for b in self._blocks for n in b.names]
        self.natural_names = [n for b in self._blocks for n in b.natural_names]
        self.fixed = {**self.kernel_params.fixed, **self._lik_fixed, **self._mean_fixed}
        self.prior = self._make_prior(prior)
        if self._noise_diag is not None:
            self.use_fast_path = False            # the fast paths know one noise variance; GPyTorch's path + diag
        self._lean_joint = LeanLogJoint.from_model(self) if n <= LEAN_JOINT_MAX_N and self.use_fast_path else None

    # ------------------------------------------------------------------ basics
    @property
    def dim(self) -> int:
        """Number of hyperparameters D."""
        return sum(b.stop - b.start for b in self._blocks)

    def noise_var(self, theta: torch.Tensor) -> torch.Tensor:
        """The noise variance at theta, shape ``theta.shape[:-1]`` (differentiable)."""
        b = self._noise_block
        if b is None:
            return torch.full(theta.shape[:-1], self._fixed_noise, dtype=theta.dtype, device=theta.device)
        return b.bijection.forward(theta[..., b.start])

    def mean_constant(self, theta: torch.Tensor) -> torch.Tensor | None:
        """The constant mean at theta, shape ``theta.shape[:-1]``; None without a mean."""
        b = self._mean_block
        if b is not None:
            return theta[..., b.start]
        if self._fixed_mean is not None:
            return torch.full(theta.shape[:-1], self._fixed_mean, dtype=theta.dtype, device=theta.device)
        return None

    def _fast_theta(self, theta: torch.Tensor) -> torch.Tensor:
        """``[kernel theta, log noise]`` for the fast path (theta itself for gpvi's own noise and no mean)."""
        kd = self.kernel_params.dim
        if self._noise_block is not None and self._noise_block.bijection.kind == "log" and self.dim == kd + 1:
            return theta
        return torch.cat([theta[..., :kd], torch.log(self.noise_var(theta)).unsqueeze(-1)], -1)

    @property
    def num_data(self) -> int:
        """Number of training points N."""
        return self.X.shape[0]

    @property
    def device(self) -> torch.device:
        return self.X.device

    def memory_per_draw(self) -> int:
        """Bytes one theta of a batched log joint with its gradient needs: about 5 dense N x N matrices.

        (Kernel matrix, its Cholesky factor, the inverse the backward pass needs and the kernel's own
        intermediates; about 3.5 copies were measured at N = 2,000, rounded up.) Engines cut batches of draws by
        this figure so no call exceeds their memory budget (:class:`gpvi.numerics.budget.MemoryBudget`).
        """
        n = self.num_data
        if self._lean():
            return lean_copies(self.X.device) * n * n * self.X.element_size()   # draws one at a time
        if self.closed_form is not None:
            return max(5, self._lean_joint.copies) * n * n * self.X.element_size()
        return 5 * n * n * self.X.element_size()

    def _lean(self) -> bool:
        # the two-buffer path has no gradient in y, so a mean (y - c) takes the batched path
        return bool(self.kernel_params.fast_path and self.use_fast_path and self.num_data >= self.lean_min_n
                    and self.mean_constant(torch.zeros(self.dim, dtype=torch.float64)) is None)

    def _theta(self, theta: Any, name: str = "theta") -> torch.Tensor:
        return check_theta(theta, self.dim, name, device=self.X.device)

    def covariance(self, theta: Any) -> torch.Tensor:
        r"""Training covariance :math:`K_\theta + \sigma^2 I`: ``(N, N)`` or ``(S, N, N)``."""
        theta = self._theta(theta)
        if self.kernel_params.fast_path and self.use_fast_path:
            return scaled_rbf_covariance(self._fast_theta(theta), self._Xc)
        # clone: GPyTorch's output may be an expanded view, or saved by autograd (exp), so never add in place to it
        K = self.kernel_params.matrix(theta[..., :self.kernel_params.dim], self._Xc).clone()
        K.diagonal(dim1=-2, dim2=-1).add_(self.noise_var(theta).unsqueeze(-1))
        if self._noise_diag is not None:
            K.diagonal(dim1=-2, dim2=-1).add_(self._noise_diag)
        return K

    def _centred_y(self, theta: torch.Tensor) -> torch.Tensor:
        c = self.mean_constant(theta)
        return self._y if c is None else self._y - c.unsqueeze(-1)

    # ------------------------------------------------------------------ densities
    def log_marginal_likelihood(self, theta: Any) -> torch.Tensor:
        r"""Exact :math:`\log \mathcal N(y \mid 0, K_\theta + \sigma^2 I)` (no prior).

        Parameters
        ----------
        theta : array-like of shape (D,) or (S, D)

        Returns
        -------
        torch.Tensor of shape () or (S,)
            Differentiable by autograd. For a batch, a member whose matrix cannot be factorised even with
            the maximum jitter gets ``-inf`` (zero gradient); for a single theta a
            :class:`~gpvi.exceptions.NotPSDError` naming theta is raised.
        """
        theta = self._theta(theta)
        if not bool(torch.isfinite(theta).all()):
            return finite_rows_only(self.log_marginal_likelihood, theta)
        if self.closed_form is not None:
            return lean_apply(self._lean_joint, theta, prior=False)
        if self._lean():
            def one(t: torch.Tensor, strict: bool) -> torch.Tensor:
                return lean_log_marginal(self._fast_theta(t), self._Xc, self._y, jitter=self.jitter,
                                         max_jitter=self.max_jitter, raise_on_failure=strict)
            return one(theta, True) if theta.dim() == 1 else torch.stack([one(t, False) for t in theta])
        Ky = self.covariance(theta)
        chol = cholesky_with_jitter(Ky, jitter=self.jitter, max_jitter=self.max_jitter,
                                    raise_on_failure=theta.dim() == 1, theta=theta.detach())
        if theta.dim() == 2 and theta.requires_grad and not bool(chol.ok.all()):
            # Failed members (value -inf) must give zero, not NaN, gradients: rebuild K with those rows detached
            # (0 * inf in a kernel's backward would otherwise produce NaN).
            Ky = self.covariance(torch.where(chol.ok[:, None], theta, theta.detach()))
        return gaussian_log_marginal(Ky, self._centred_y(theta), chol=chol)

    def log_prior(self, theta: Any) -> torch.Tensor:
        """``log p(theta)``: ``(D,) -> ()``, ``(S, D) -> (S,)``."""
        theta = self._theta(theta)
        return prior_log_prob(self.prior, theta)

    def log_joint(self, theta: Any) -> torch.Tensor:
        r"""Log joint :math:`\log \mathcal N(y \mid 0, K_\theta + \sigma^2 I) + \log p(\theta)`.

        Shapes as :meth:`log_marginal_likelihood`; batched input goes through one batched Cholesky.
        """
        theta = self._theta(theta)
        if not bool(torch.isfinite(theta).all()):
            return finite_rows_only(self.log_joint, theta)
        if self.closed_form is not None:
            return lean_apply(self._lean_joint, theta, prior=True)
        return self.log_marginal_likelihood(theta) + self.log_prior(theta)

    def log_joint_and_grad(self, theta: Any) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Log joint and its gradient for a batch, detached: ``(S, D) -> (S,), (S, D)``.

        The closed form of :mod:`gpvi.models.lean_joint` where the kernel is supported (no autograd graph at all),
        else :meth:`log_joint` and autograd. Rows that cannot be factorised, or that are not finite, get ``-inf``
        and a zero gradient. This is what the samplers and the engines' gradient calls use.
        """
        if not (isinstance(theta, torch.Tensor) and theta.dtype == torch.float64 and theta.device == self.X.device):
            theta = self._theta(theta)
        if theta.dim() != 2 or theta.shape[1] != self.dim:
            raise ValueError(f"theta must have shape (S, {self.dim}); got {tuple(theta.shape)}")
        theta = theta.detach()
        lean = self.closed_form
        if lean is not None and (math.isfinite(sum(theta[0].tolist())) if theta.shape[0] == 1 else
                                 bool(torch.isfinite(theta).all())):
            return lean.log_joint(theta)
        with torch.enable_grad():
            t = theta.requires_grad_(True)
            v = self.log_joint(t)
            g = torch.autograd.grad(v.sum(), t)[0] if v.requires_grad else torch.zeros_like(theta)
        return v.detach(), torch.where(torch.isfinite(v)[:, None] & torch.isfinite(g), g, 0.0)

    @property
    def closed_form(self) -> LeanLogJoint | None:
        """The closed-form log joint (:class:`gpvi.models.lean_joint.LeanLogJoint`) this model evaluates through, or
        None when its kernel takes GPyTorch's path (or ``use_fast_path`` is off). Its ``log_joint(theta)`` takes a
        finite float64 ``(S, D)`` batch on the data's device, unchecked: what samplers call in their inner loop."""
        return self._lean_joint if self.use_fast_path else None

    # ------------------------------------------------------------------ helpers
    def natural(self, theta: Any) -> torch.Tensor:
        """Natural-scale values: ``lengthscale = exp(theta/2)``, variances ``exp(theta)`` (constrained parameters
        through their bijections, the mean constant as it is); same shape as theta."""
        theta = self._theta(theta).detach()
        out = torch.empty_like(theta)
        for b in self._blocks:
            out[..., b.start:b.stop] = b.bijection.forward(theta[..., b.start:b.stop])
        return out

    def initial_theta(self) -> torch.Tensor:
        """The start: values the user set on the kernel, likelihood or mean (different from GPyTorch's initial values,
        :attr:`~gpvi.models.parameters.ModuleParametrisation.user_set`) are kept; the rest is :meth:`scaled_theta`'s."""
        return self._data_scaled(keep_user=True)

    def scaled_theta(self) -> torch.Tensor:
        """Data-scaled values whatever the modules hold: ``l_j^2 = d var(x_j)``, ``sigma_f^2 = var(y)``,
        ``sigma^2 = var(y)/10`` (a constrained noise: that value when its constraint allows it, else the likelihood's
        own), the mean constant at ``mean(y)``; other kernel parameters as :meth:`KernelParametrisation.initial_theta`.
        The centre of ``prior="scaled"``."""
        return self._data_scaled(keep_user=False)

    def _data_scaled(self, keep_user: bool) -> torch.Tensor:
        th = torch.zeros(self.dim, dtype=torch.float64, device=self.X.device)
        kp = self.kernel_params
        th[:kp.dim] = kp.initial_theta(self._Xc, keep_user=keep_user)
        vy = float(self.y.var(unbiased=False))
        for b in kp.blocks:
            if b.log and b.path.endswith("raw_outputscale") and not (keep_user and b.path in kp.user_set):
                th[b.start:b.stop] = math.log(vy)
        nb, lik = self._noise_block, self._lik_params
        if nb is not None and lik is not None and lik.user_set and keep_user:
            th[nb.start] = lik.theta_from_module()[0]
        elif nb is not None:
            if nb.bijection.kind == "log":
                th[nb.start] = math.log(0.1 * vy) / nb.bijection.power
            else:
                start = nb.bijection.inverse(torch.tensor(0.1 * vy, dtype=torch.float64))
                th[nb.start] = start if bool(torch.isfinite(start)) else lik.theta_from_module()[0]
        if self._mean_block is not None:
            mp = self._mean_params
            th[self._mean_block.start] = mp.theta_from_module()[0] if mp.user_set and keep_user else \
                float(self.y.mean())
        return th

    def theta_from_kernel(self, noise_var: float | None = None) -> torch.Tensor:
        """theta at the user kernel's current values (and the likelihood's and mean's, when given), with the noise
        variance ``noise_var`` (default: the likelihood's, else 0.1)."""
        th = torch.empty(self.dim, dtype=torch.float64, device=self.X.device)
        kd = self.kernel_params.dim
        th[:kd] = self.kernel_params.theta_from_kernel().to(self.X.device)
        nb = self._noise_block
        if nb is not None:
            if noise_var is None and self._lik_params is not None:
                th[nb.start] = self._lik_params.theta_from_module()[0]
            else:
                v = check_positive(0.1 if noise_var is None else noise_var, "noise_var")
                th[nb.start] = (math.log(v) if nb.bijection.kind == "log" and nb.bijection.power == 1.0 else
                                nb.bijection.inverse(torch.tensor(float(v), dtype=torch.float64)))
                if not bool(torch.isfinite(th[nb.start])):
                    raise ValueError(f"noise_var={v:g} is outside the likelihood's noise constraint")
        if self._mean_block is not None:
            th[self._mean_block.start] = self._mean_params.theta_from_module()[0]
        return th

    def describe(self, theta: Any) -> dict[str, float]:
        """``{name: value}`` on the natural scale for one theta."""
        theta = self._theta(theta)
        if theta.dim() != 1:
            raise ValueError("describe needs a single theta of shape (D,)")
        nat = self.natural(theta)
        return {n: float(v) for n, v in zip(self.natural_names, nat)}

    def __repr__(self) -> str:
        return (f"GPRegression(N={self.num_data}, d={self.X.shape[1]}, D={self.dim}, "
                f"kernel={type(self.kernel_params.kernel).__name__})")

