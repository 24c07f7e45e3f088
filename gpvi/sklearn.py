r"""A scikit-learn style GP classifier over the CVI engine.

``GPClassifier`` follows the estimator contract of scikit-learn (which is *not* a runtime dependency of gpvi):
``__init__`` only stores its arguments, ``fit`` validates, runs :class:`gpvi.inference.cvi.engine.CVI` (or, with
``learn_hyperparameters=True``, the type-II loop :class:`gpvi.inference.cvi.typeii.TypeII` around it) on a
:class:`gpvi.models.classification.GPClassification` model and sets trailing-underscore attributes, and
``get_params``/``set_params`` are implemented from the signature of ``__init__`` so that
``sklearn.base.clone``, grid search and pipelines work. Inputs may be numpy arrays or torch tensors; outputs of
``predict_proba``/``predict`` are numpy arrays (scikit-learn's convention).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from .inference.cvi.engine import CVI
from .inference.cvi.options import MonteCarlo, SingleSite, num_steps_for_sweeps
from .inference.cvi.typeii import TypeII
from .models.classification import GPClassification
from .models.likelihoods import Quadrature
from .posteriors.latent import LatentPosterior
from .rng import check_seed
from .validation import check_bool, check_choice, check_positive_int, check_X, feature_names_of

__all__ = ["GPClassifier"]


class GPClassifier:
    r"""Binary GP classifier: latent :math:`f \sim \mathcal{GP}(0, k_\theta)`, logit or probit link, CVI posterior.

    The posterior over the latent function is the Gaussian :math:`q(\mathbf f)` found by conjugate-computation
    variational inference (Khan & Lin 2017, Algorithm 1 with eq. 13; eq. 14 in ``mode="stochastic"``), and with
    ``learn_hyperparameters=True`` the kernel's log-hyperparameters maximise the ELBO (eq. 5) in L-BFGS-B phases
    between CVI runs (:class:`gpvi.inference.cvi.typeii.TypeII`).
    Predictions are :math:`p(y_* = 1\mid\mathcal D) = \mathbb E_{q(f_*)}[p(y_* = 1 \mid f_*)]`.

    Parameters
    ----------
    kernel : gpytorch.kernels.Kernel, optional
        Covariance function; default ``ScaleKernel(RBFKernel(ard_num_dims=n_features))`` started at
        lengthscale^2 = d var(x_j), signal variance 1. A given kernel starts at its current values.
    likelihood : {"logit", "probit"}
        Link function (default logit, as in the CVI paper and scikit-learn); recorded in ``link_``.
    method : {"cvi"}
        Inference method.
    mode : {"full", "stochastic"}
        Full-batch CVI steps or doubly stochastic single-site steps (see :class:`gpvi.inference.cvi.engine.CVI`).
    learn_hyperparameters : bool
        Maximise the ELBO over the kernel hyperparameters (type-II on the bound); otherwise keep them fixed.
    beta : float
        CVI step size in (0, 1].
    estimator : {"quadrature", "mc"}
        Site gradients by quadrature or Monte Carlo.
    num_quadrature : int
        Quadrature nodes (gradients, ELBO and logit predictions).
    num_draws : int
        Monte Carlo draws per site and step for ``estimator="mc"``.
    batch_size : int
        Sites per stochastic step.
    max_sweeps : int
        Budget in sweeps over the data (turned into the engine's ``num_steps`` for the training set, recorded in
        ``posterior_.info["num_steps"]``).
    tol : float
        Relative ELBO change for convergence.
    theta : array-like of shape (D,), optional
        Starting log-hyperparameters (overrides the kernel's values).
    random_state : int, optional
        Seed for site order and Monte Carlo draws (``None``: non-deterministic); a non-negative int, checked by
        :func:`gpvi.rng.check_seed` when ``fit`` starts (``__init__`` only stores, scikit-learn's contract).
    progress_bar : bool
        Show a tqdm bar during ``fit``.
    device : str or torch.device, optional
        Where the model and the CVI computations live (e.g. ``"cuda"``); default: the CPU, or the device of a torch
        ``X``. Predictions are returned as numpy arrays on the host either way; a saved fit loads on the CPU.

    Attributes
    ----------
    classes_ : numpy.ndarray of shape (2,)
        The two labels, sorted; ``predict_proba`` columns follow this order.
    link_ : str
        The likelihood used (``"logit"`` or ``"probit"``).
    posterior_ : gpvi.posteriors.latent.LatentPosterior
        Sites, marginals ``m``/``var`` at the training inputs, ELBO, trace and run info.
    elbo_ : float
        ELBO of the fitted :math:`q` (nats).
    theta_ : torch.Tensor of shape (D,)
        Fitted (or fixed) kernel log-hyperparameters; ``hyperparameters_`` the natural-scale values by name.
    kernel_ : gpytorch.kernels.Kernel
        A copy of the kernel with the fitted hyperparameters.
    model_ : gpvi.models.classification.GPClassification
    n_features_in_ : int
    feature_names_in_ : numpy.ndarray of str
        The column names of a pandas DataFrame ``X`` given to ``fit`` (only then, scikit-learn's rule); the
        hyperparameter names (``theta`` names, ``hyperparameters_`` keys) use them: ``lengthscale[nox]``. A
        DataFrame given to ``predict*`` must then have the same columns in the same order.

    Examples
    --------
    >>> import gpvi
    >>> from gpvi.sklearn import GPClassifier
    >>> ds = gpvi.datasets.load_pima()
    >>> clf = GPClassifier(learn_hyperparameters=False, progress_bar=False).fit(ds.X_train, ds.y_train)
    >>> clf.predict_proba(ds.X_test).shape
    (332, 2)
    >>> round(clf.score(ds.X_test, ds.y_test), 2)
    0.79
    """

    _estimator_type = "classifier"

    def __init__(self, kernel: Any = None, likelihood: str = "logit", method: str = "cvi", mode: str = "full",
                 learn_hyperparameters: bool = True, *, beta: float = 0.5, estimator: str = "quadrature",
                 num_quadrature: int = 96, num_draws: int = 10, batch_size: int = 1, max_sweeps: int = 500,
                 tol: float = 1e-9, theta: Any = None, random_state: int | None = None,
                 progress_bar: bool = True, device: str | None = None) -> None:
        self.kernel = kernel
        self.likelihood = likelihood
        self.method = method
        self.mode = mode
        self.learn_hyperparameters = learn_hyperparameters
        self.beta = beta
        self.estimator = estimator
        self.num_quadrature = num_quadrature
        self.num_draws = num_draws
        self.batch_size = batch_size
        self.max_sweeps = max_sweeps
        self.tol = tol
        self.theta = theta
        self.random_state = random_state
        self.progress_bar = progress_bar
        self.device = device

    # ------------------------------------------------------------------ scikit-learn parameter protocol
    @classmethod
    def _get_param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return sorted(p.name for p in sig.parameters.values() if p.name != "self" and p.kind != p.VAR_KEYWORD)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor arguments as a dict (``deep`` is accepted for scikit-learn compatibility)."""
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params: Any) -> GPClassifier:
        """Set constructor arguments; unknown names raise ``ValueError``. Returns ``self``."""
        valid = set(self._get_param_names())
        for key, value in params.items():
            if key not in valid:
                raise ValueError(f"invalid parameter {key!r} for GPClassifier; valid parameters are {sorted(valid)}")
            setattr(self, key, value)
        return self

    def __sklearn_tags__(self):  # pragma: no cover - only used when scikit-learn >= 1.6 is installed
        from sklearn.utils import ClassifierTags, Tags, TargetTags

        return Tags(estimator_type="classifier", target_tags=TargetTags(required=True),
                    classifier_tags=ClassifierTags(multi_class=False))

    def __repr__(self) -> str:
        defaults = {p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()
                    if p.name != "self"}
        changed = []
        for k in self._get_param_names():
            v = getattr(self, k)
            d = defaults.get(k, inspect.Parameter.empty)
            if v is None and d is None:
                continue
            try:
                same = bool(v == d)
            except Exception:
                same = False
            if not same:
                changed.append(f"{k}={v!r}")
        return f"GPClassifier({', '.join(changed)})"

    # ------------------------------------------------------------------ fitting
    def _seed(self) -> int | None:
        check_choice(self.method, "method", ["cvi"])
        return check_seed(self.random_state, "random_state")

    def _engine(self, num_data: int, seed: int | None) -> CVI:
        mode = check_choice(self.mode, "mode", ["full", "stochastic"])
        batch_size = check_positive_int(self.batch_size, "batch_size")
        estimator = check_choice(self.estimator, "estimator", ["quadrature", "mc"])
        num_steps = num_steps_for_sweeps(check_positive_int(self.max_sweeps, "max_sweeps"), num_data, mode=mode,
                                         batch_size=batch_size)
        return CVI(mode=mode, beta=self.beta,
                   estimator=MonteCarlo(num_draws=self.num_draws) if estimator == "mc" else estimator,
                   quadrature=Quadrature(self.num_quadrature), single_site=SingleSite(batch_size=batch_size),
                   num_steps=num_steps, tol=self.tol, seed=seed,
                   progress_bar=check_bool(self.progress_bar, "progress_bar"))

    def fit(self, X: Any, y: Any) -> GPClassifier:
        """Fit the CVI posterior (and, optionally, the kernel hyperparameters) to training data.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            numpy array or torch tensor.
        y : array-like of shape (n_samples,)
            Labels in {0, 1} or {-1, +1}.

        Returns
        -------
        GPClassifier
            ``self``.

        Raises
        ------
        ValueError
            NaN/inf in ``X``, a label set other than two classes {0, 1} / {-1, +1}, mismatched lengths, bad settings.
        """
        seed = self._seed()
        learn = check_bool(self.learn_hyperparameters, "learn_hyperparameters")
        names = feature_names_of(X)
        model = GPClassification(X, y, kernel=self.kernel, likelihood=self.likelihood, theta=self.theta,
                                 feature_names=names, device=self.device)
        engine = self._engine(model.num_data, seed)
        if learn:
            post = TypeII(engine, inner_num_steps=max(int(self.max_sweeps), 50)).run(model)
        else:
            post = engine.run(model)
        return self._set_fitted(model, post, names)

    def _set_fitted(self, model: GPClassification, post: LatentPosterior, names: Any = None) -> GPClassifier:
        """Set the fitted attributes from a model and its CVI posterior (used by :meth:`fit` and by
        :func:`gpvi.io.load_fit`)."""
        self.model_ = model
        self.posterior_: LatentPosterior = post
        self.classes_ = np.asarray(model.classes)
        self.link_ = model.link
        self.elbo_ = post.elbo
        self.theta_ = post.theta.clone()
        self.hyperparameters_ = model.describe(post.theta)
        self.kernel_ = model.kernel_at(post.theta)
        self.n_features_in_ = int(model.X.shape[1])
        if names is not None:
            self.feature_names_in_ = np.asarray(names, dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        return self

    def _check_fitted(self) -> None:
        """scikit-learn's ``NotFittedError`` (a ValueError and AttributeError) before ``fit``."""
        if not hasattr(self, "posterior_"):
            raise _not_fitted_error()("this GPClassifier is not fitted yet; call fit(X, y) first")

    def _check_X(self, X: Any) -> Any:
        """Validated inputs for prediction: columns of a DataFrame must match those seen in ``fit``."""
        self._check_fitted()
        fitted = getattr(self, "feature_names_in_", None)
        names = feature_names_of(X)
        if fitted is not None and names is not None and list(names) != list(fitted):
            raise ValueError(f"X has columns {list(names)} but the classifier was fitted with columns "
                             f"{list(fitted)} (same names, same order)")
        return check_X(X, "X", n_features=self.n_features_in_)

    # ------------------------------------------------------------------ prediction
    def predict_proba(self, X: Any) -> np.ndarray:
        r"""Class probabilities, columns in ``classes_`` order: :math:`[1 - p_*, p_*]`, shape ``(n, 2)``.

        Raises ``ValueError`` for malformed ``X``, DataFrame columns other than those seen in ``fit``, or inputs so
        large that the kernel overflows float64 (e.g. ``X * 1e300``): never NaN probabilities without a word.
        """
        Xt = self._check_X(X)
        p1 = self.posterior_.predict_proba(Xt).cpu().numpy()
        return np.stack([1.0 - p1, p1], axis=1)

    def predict(self, X: Any) -> np.ndarray:
        """The more probable label (a value of ``classes_``) for each row of ``X``; shape ``(n,)``."""
        proba = self.predict_proba(X)
        return self.classes_[(proba[:, 1] > 0.5).astype(int)]

    def decision_function(self, X: Any) -> np.ndarray:
        """Posterior mean of the latent function at ``X`` (positive favours ``classes_[1]``); shape ``(n,)``."""
        mean, _ = self.posterior_.predict_latent(self._check_X(X))
        return mean.cpu().numpy()

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Mean accuracy on ``(X, y)`` (labels in the same coding as at ``fit``)."""
        from .validation import as_float_tensor

        pred = self.predict(X)
        yt = as_float_tensor(y, "y", ndim=1).cpu().numpy()
        if yt.shape[0] != pred.shape[0]:
            raise ValueError(f"X has {pred.shape[0]} rows but y has {yt.shape[0]}")
        unknown = set(np.unique(yt).tolist()) - set(self.classes_.astype(float).tolist())
        if unknown:
            raise ValueError(f"y holds labels {sorted(unknown)} not seen in fit (classes_ = {self.classes_.tolist()})")
        correct = (pred.astype(float) == yt).astype(float)
        if sample_weight is None:
            return float(correct.mean())
        w = as_float_tensor(sample_weight, "sample_weight", ndim=1).cpu().numpy()
        if w.shape[0] != correct.shape[0]:
            raise ValueError(f"sample_weight has {w.shape[0]} values but y has {correct.shape[0]}")
        if bool((w < 0).any()) or not w.sum() > 0:
            raise ValueError("sample_weight must be non-negative with a positive sum; got "
                             f"min {float(w.min()):g}, sum {float(w.sum()):g}")
        return float((w * correct).sum() / w.sum())


class _NotFittedError(ValueError, AttributeError):
    """Stands in for ``sklearn.exceptions.NotFittedError`` when scikit-learn is not installed."""


def _not_fitted_error() -> type:
    try:
        from sklearn.exceptions import NotFittedError
        return NotFittedError
    except ImportError:                          # pragma: no cover - scikit-learn is optional
        return _NotFittedError
