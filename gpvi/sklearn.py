r"""A scikit-learn style GP classifier over the CVI engines: binary and multi-class, labels of any type.

``GPClassifier`` follows the estimator contract of scikit-learn (which is *not* a runtime dependency of gpvi):
``__init__`` only stores its arguments, ``fit`` validates and runs an engine, fitted state lives in trailing-underscore
attributes, and ``get_params``/``set_params`` come from the signature of ``__init__`` so that ``sklearn.base.clone``,
grid search and pipelines work. It passes scikit-learn's ``check_estimator`` except for the checks listed (with the
reasons) in ``tests/test_sklearn_checks.py``.

What ``fit`` runs, by the number of classes K in ``y`` and the ``likelihood``:

* K = 2 with ``"logit"``/``"probit"`` (``"auto"`` picks logit): one latent GP,
  :class:`gpvi.models.classification.GPClassification`, fitted by :class:`gpvi.inference.cvi.engine.CVI`
  (``hyperparameters="fixed"``) or by the type-II loop :class:`gpvi.inference.cvi.typeii.TypeII` around it;
* K >= 2 with ``"softmax"``/``"robustmax"`` (``"auto"`` picks softmax for K >= 3): K latent GPs sharing one kernel,
  :class:`gpvi.models.multiclass.GPMulticlass`, fitted by :class:`gpvi.inference.cvi.multiclass.MulticlassCVI` or
  :class:`~gpvi.inference.cvi.multiclass_typeii.MulticlassTypeII`, with the same settings.

Inputs may be numpy arrays, pandas DataFrames or torch tensors; outputs are numpy arrays (scikit-learn's convention).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from .inference.cvi.engine import CVI
from .inference.cvi.multiclass import MulticlassCVI
from .inference.cvi.multiclass_typeii import MulticlassTypeII
from .inference.cvi.options import MonteCarlo, SingleSite, num_steps_for_sweeps
from .inference.cvi.typeii import TypeII
from .models.classification import GPClassification
from .models.quadrature import Quadrature
from .models.multiclass import GPMulticlass, default_quadrature
from .models.priors import check_prior_choice
from .rng import check_seed
from .validation import (check_bool, check_choice, check_positive_int, check_sample_weight, check_X,
                         feature_names_of)
from ._sklearn_checks import _check_feature_names, _class_labels, _label_array, _not_fitted_error, _precheck_X

__all__ = ["GPClassifier"]

_BINARY_LINKS = ("logit", "probit")
_MULTICLASS_LINKS = ("softmax", "robustmax")


class GPClassifier:
    r"""GP classifier with a CVI posterior: binary (logit/probit link) or multi-class (softmax/robust-max).

    Binary: latent :math:`f \sim \mathcal{GP}(0, k_\theta)`, :math:`p(y = c_1 \mid f) = \sigma(f)` or
    :math:`\Phi(f)`. Multi-class: K latent :math:`f_k \sim \mathcal{GP}(0, k_\theta)` sharing the kernel,
    :math:`p(y = c_k \mid \mathbf f) = \operatorname{softmax}(\mathbf f)_k` (or robust-max). The posterior over the
    latent values is the Gaussian :math:`q` found by conjugate-computation variational inference (Khan & Lin 2017,
    Algorithm 1, eq. 13; eq. 14 for binary ``mode="stochastic"``); the multi-class :math:`q` is class-factorised,
    :math:`\prod_k q(\mathbf f_k)`. With ``hyperparameters="type2"`` the kernel log-hyperparameters maximise the
    ELBO plus the log prior (default :math:`\mathcal N(0, 10 I)`: MAP-II on the bound; ``prior=None``: the ELBO
    alone, ML-II) between CVI runs.
    Predictions are :math:`p(y_* = c_k \mid \mathcal D) = \mathbb E_{q(\mathbf f_*)}[p(y_* = c_k \mid \mathbf f_*)]`.

    Parameters
    ----------
    kernel : gpytorch.kernels.Kernel, optional
        Covariance function; default ``ScaleKernel(RBFKernel(ard_num_dims=n_features))`` started at
        lengthscale^2 = d var(x_j), signal variance 1. A given kernel starts at its current values.
    likelihood : {"auto", "logit", "probit", "softmax", "robustmax"}
        ``"auto"`` (default): ``"logit"`` for two classes, ``"softmax"`` for more. ``"logit"``/``"probit"`` need
        exactly two classes. ``"softmax"``/``"robustmax"`` work for any K >= 2; with two classes they fit **two**
        latent GPs (``p(y = classes_[1]) = sigma(f_1 - f_0)`` for the softmax: the difference has prior covariance
        2k, and q is factorised over the two functions), which is not the same model as ``"logit"``'s single GP.
        Recorded in ``link_``.
    method : {"cvi"}
        Inference method.
    mode : {"full", "stochastic"}
        Full-batch CVI steps or doubly stochastic single-site steps (``batch_size`` data points per step on
        cached, rank-one-updated factors; multi-class: all K sites of each point, one factor per class).
    learn_hyperparameters : bool, optional
        The older spelling of ``hyperparameters``: True is ``"type2"``, False is ``"fixed"``. Giving both with
        different meanings is a ``ValueError``.
    hyperparameters : {"type2", "fixed", "bayes"}, optional
        ``"type2"`` (the default when neither this nor ``learn_hyperparameters`` is given): MAP-II on the bound
        (:class:`~gpvi.inference.cvi.typeii.TypeII` / :class:`~gpvi.inference.cvi.multiclass_typeii.MulticlassTypeII`,
        prior :math:`\mathcal N(0, 10 I)` on the log-hyperparameters); ``"fixed"``: keep them at their start;
        ``"bayes"`` (binary links, and the softmax with at most 3 classes): integrate over them,
        :class:`~gpvi.inference.cvi.bayes.FullyBayesianCVI` -- a Gaussian :math:`q(\theta)` (Salimans-Knowles
        Hessian-free) on EP's approximate evidence (same prior; the CVI bound before 2026-11-24, whose gap grows
        with the signal variance; multi-class EP with full K x K sites since 2026-11-25), predictions averaged
        over ``num_draws`` draws of it (at least 32) with their CVI posteriors. Slower than ``"type2"`` (every
        step runs EP to convergence at 4 draws of theta; on 2 cores: 11-21 s for binary N = 100, 245 / 299 s on
        3-class iris / wine, N = 105 / 124, where NUTS takes 604 / 821 s); ``mode``, ``beta``, ``estimator`` and
        ``max_sweeps`` do not apply (FullyBayesianCVI's own full-batch engine), and the fit cannot be saved with
        :func:`gpvi.io.save_fit`. Robust-max and K > 3 raise ``ValueError`` (their q(theta) would sit on the
        multi-class CVI bound, which predicted no better than MAP-II in the benchmarks).
    prior : "default", "scaled", None or torch.distributions.Distribution
        Prior :math:`p(\theta)` on the kernel log-hyperparameters (theta's order: ``model_.names``) for ``"type2"``
        and ``"bayes"``; ignored by ``"fixed"``.

        * ``"default"``: independent :math:`\mathcal N(0, 10)` on each (:func:`gpvi.models.priors.default_prior`),
          centred at signal variance 1 and lengthscale 1 on every input (an input whose standard deviation is
          outside [0.1, 10] gets a :class:`gpvi.InputScaleWarning`: standardise the inputs).
        * ``"scaled"``: the same variance, centred at the data-scaled start ``model_.initial_theta()``:
          lengthscale^2 = d var(x_j) on input j (d inputs), signal variance 1
          (:func:`gpvi.models.priors.resolve_prior`). It depends on ``X`` only, not on ``y``.
        * ``None`` (``"type2"`` only; ``"bayes"`` raises ``ValueError``, as a flat prior is improper): maximise the
          ELBO alone (ML-II, as scikit-learn's GPC does with its Laplace evidence); irrelevant inputs may then run to
          the box bound (lengthscale^2 = 1e5 var(x_j)). ``None`` and ``"scaled"`` give the same predictions in any
          units of the inputs (the type-II box moves with each input's scale).
        * Any object with ``log_prob`` on a ``(D,)`` vector.

        With d standardised inputs two points are about 2d apart in squared distance, so at the default prior's
        centre the kernel between them is about :math:`e^{-d}`, and with many inputs and few points that prior
        can outweigh the data; ``"scaled"`` is centred where the kernel between typical points is about
        :math:`e^{-1}`. Measured on the 100-point ``classification_peers`` subsamples (standardised), type-II test
        log loss ``"default"`` / ``None`` / ``"scaled"``: pima (d = 7) 0.506 / 0.480 / 0.490, ionosphere (34)
        0.367 / 0.307 / 0.257, sonar (60) 0.692 / 0.579 / 0.372, ripley (2) 0.282 / 0.276 / 0.281. On sonar the
        default's MAP-II puts all 60 lengthscales near 1 and every prediction near 1/2; NUTS under the same prior
        does the same (``benchmarks/results/classification_bayes.md``), so that is the model's answer, not a
        failed optimisation. With ``"bayes"``, ``"scaled"`` is not yet as trustworthy: on sonar q(theta)'s log
        signal variance is 0.47 NUTS sd low and its test probabilities 0.071 from a long NUTS run's
        (``benchmarks/results/classification_nuts_ref_scaled.md``; pima, ionosphere, ripley within 0.22 sd and
        0.018 of short NUTS runs).
    beta : float
        CVI step size in (0, 1].
    estimator : {"auto", "quadrature", "mc", "fixed"}
        Site gradients. ``"auto"``: quadrature, except for the softmax with K > 3 (``"fixed"``: an average over 1,024
        fixed quasi-Monte Carlo points). ``"mc"``: Monte Carlo (binary any link; multi-class softmax only, with a
        decreasing step).
        ``"fixed"``: multi-class softmax only.
    num_quadrature : int, optional
        Quadrature nodes (per dimension for the softmax); default 96 for the binary links, and the multi-class
        engine's rule (:func:`gpvi.models.multiclass.default_quadrature`) for the softmax. Robust-max has its own
        1-D rule and ignores it.
    num_draws : int
        Monte Carlo draws per site and step for ``estimator="mc"``.
    batch_size : int
        Sites per stochastic step (binary ``mode="stochastic"``).
    max_sweeps : int
        Budget in sweeps over the data (turned into the engine's ``num_steps``, recorded in
        ``posterior_.info["num_steps"]``); with ``"type2"`` also the inner budget (at least 50).
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
    classes_ : numpy.ndarray of shape (K,)
        The labels seen in ``fit``, sorted (any sortable type: ints, strings, booleans...; real labels with integer
        values, as read from a CSV file, are kept as integers). ``predict_proba`` columns follow this order.
    n_classes_ : int
        K.
    link_ : str
        The likelihood used (``"logit"``, ``"probit"``, ``"softmax"`` or ``"robustmax"``).
    posterior_ : LatentPosterior, MulticlassPosterior or BayesClassificationPosterior
        Sites, marginals ``m``/``var`` at the training inputs, ELBO, trace and run info (``"bayes"``: the
        Gaussian :math:`q(\theta)` and the latent posteriors at its draws).
    elbo_ : float
        ELBO of the fitted :math:`q` (nats; ``"bayes"``: the engine's bound on :math:`\log p(\mathbf y)`).
    theta_ : torch.Tensor of shape (D,)
        Fitted (or fixed) kernel log-hyperparameters (``"bayes"``: the mean of :math:`q(\theta)`);
        ``hyperparameters_`` the natural-scale values by name.
    hyperparameter_posterior_ : GaussianPosterior or None
        ``"bayes"``: :math:`q(\theta)` over the log-hyperparameters, ``mean`` and ``std`` in ``theta_``'s order,
        ``summary()`` by name; ``None`` for ``"type2"`` and ``"fixed"`` (point values).
    kernel_ : gpytorch.kernels.Kernel
        A copy of the kernel with the fitted hyperparameters.
    model_ : GPClassification or GPMulticlass
    n_features_in_ : int
    feature_names_in_ : numpy.ndarray of str
        The column names of a pandas DataFrame ``X`` given to ``fit`` (only then, scikit-learn's rule); the
        hyperparameter names (``theta`` names, ``hyperparameters_`` keys) use them: ``lengthscale[nox]``. A
        DataFrame given to ``predict*`` must then have the same columns in the same order.

    Notes
    -----
    ``decision_function`` is the posterior mean of the latent function(s). Its sign (binary) or argmax
    (multi-class) gives ``predict``'s label, up to multi-class cases where a class with a larger latent variance wins
    on probability; but its *ranking* of points differs from ``predict_proba``'s, which also depends on the latent
    variance (:math:`\mathbb E_q[\sigma(f)]` is moderated towards 1/2 where :math:`q(f)` is wide). scikit-learn's
    ROC-AUC scorer uses ``decision_function`` when an estimator has one; pass ``response_method="predict_proba"``
    to rank by the probabilities. ``fit(X, y, sample_weight)`` weights the likelihood terms (an integer weight is a
    repeated row; since 2026-11-25, before which ``fit`` took no weights); ``score`` takes them too.

    Examples
    --------
    >>> import gpvi
    >>> from gpvi.sklearn import GPClassifier
    >>> ds = gpvi.datasets.load_pima()
    >>> clf = GPClassifier(hyperparameters="fixed", progress_bar=False).fit(ds.X_train, ds.y_train)
    >>> clf.predict_proba(ds.X_test).shape
    (332, 2)
    >>> round(clf.score(ds.X_test, ds.y_test), 2)
    0.79
    """

    _estimator_type = "classifier"

    def __init__(self, kernel: Any = None, likelihood: str = "auto", method: str = "cvi", mode: str = "full",
                 learn_hyperparameters: bool | None = None, *, hyperparameters: str | None = None,
                 prior: Any = "default", beta: float = 0.5,
                 estimator: str = "auto", num_quadrature: int | None = None, num_draws: int = 10,
                 batch_size: int = 1, max_sweeps: int = 500, tol: float = 1e-9, theta: Any = None,
                 random_state: int | None = None, progress_bar: bool = True, device: str | None = None) -> None:
        self.kernel = kernel
        self.likelihood = likelihood
        self.method = method
        self.mode = mode
        self.learn_hyperparameters = learn_hyperparameters
        self.hyperparameters = hyperparameters
        self.prior = prior
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
                    classifier_tags=ClassifierTags(multi_class=True))

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

    # ------------------------------------------------------------------ settings
    def _seed(self) -> int | None:
        check_choice(self.method, "method", ["cvi"])
        return check_seed(self.random_state, "random_state")

    def _hyperparameters(self) -> str:
        """``hyperparameters`` and its older spelling ``learn_hyperparameters``, resolved (default: type-II)."""
        learn = None if self.learn_hyperparameters is None else check_bool(self.learn_hyperparameters,
                                                                            "learn_hyperparameters")
        if self.hyperparameters is None:
            return "fixed" if learn is False else "type2"
        hp = check_choice(self.hyperparameters, "hyperparameters", ["type2", "fixed", "bayes"])
        if learn is not None and learn != (hp != "fixed"):
            raise ValueError(f"hyperparameters={hp!r} and learn_hyperparameters={learn} disagree; give one of them "
                             f"(learn_hyperparameters=True means 'type2', False means 'fixed')")
        return hp

    def _link(self, num_classes: int) -> str:
        lik = check_choice(self.likelihood, "likelihood", ["auto", *_BINARY_LINKS, *_MULTICLASS_LINKS])
        if lik == "auto":
            return "logit" if num_classes == 2 else "softmax"
        if lik in _BINARY_LINKS and num_classes != 2:
            raise ValueError(f"likelihood={lik!r} is a binary link but y holds {num_classes} classes; use "
                             f"'softmax' or 'robustmax' (or 'auto') for more than two")
        return lik

    def _num_steps(self, num_data: int, mode: str, batch_size: int) -> int:
        return num_steps_for_sweeps(check_positive_int(self.max_sweeps, "max_sweeps"), num_data, mode=mode,
                                    batch_size=batch_size)

    def _binary_engine(self, num_data: int, seed: int | None) -> CVI:
        mode = check_choice(self.mode, "mode", ["full", "stochastic"])
        batch_size = check_positive_int(self.batch_size, "batch_size")
        estimator = check_choice(self.estimator, "estimator", ["auto", "quadrature", "mc", "fixed"])
        if estimator == "fixed":
            raise ValueError("estimator='fixed' is for the multi-class softmax; binary links use 'quadrature' "
                             "(or 'auto') or 'mc'")
        nq = 96 if self.num_quadrature is None else self.num_quadrature
        return CVI(mode=mode, beta=self.beta,
                   estimator=MonteCarlo(num_draws=self.num_draws) if estimator == "mc" else "quadrature",
                   quadrature=Quadrature(nq), single_site=SingleSite(batch_size=batch_size),
                   num_steps=self._num_steps(num_data, mode, batch_size), tol=self.tol, seed=seed,
                   progress_bar=check_bool(self.progress_bar, "progress_bar"))

    def _multiclass_engine(self, num_data: int, num_classes: int, seed: int | None) -> MulticlassCVI:
        mode = check_choice(self.mode, "mode", ["full", "stochastic"])
        batch_size = check_positive_int(self.batch_size, "batch_size")
        estimator = check_choice(self.estimator, "estimator", ["auto", "quadrature", "mc", "fixed"])
        quad = None
        if self.num_quadrature is not None:
            base = default_quadrature(num_classes)
            quad = Quadrature(self.num_quadrature, base.rule, scale=base.scale, width=base.width)
        return MulticlassCVI(beta=self.beta, estimator=estimator, quadrature=quad, num_draws=self.num_draws,
                             num_steps=self._num_steps(num_data, mode, batch_size), tol=self.tol, seed=seed,
                             progress_bar=check_bool(self.progress_bar, "progress_bar"), mode=mode,
                             single_site=SingleSite(batch_size=batch_size))

    # ------------------------------------------------------------------ fitting
    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> GPClassifier:
        r"""Fit the CVI posterior (and, with ``hyperparameters="type2"``, the kernel hyperparameters).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            numpy array, pandas DataFrame or torch tensor.
        y : array-like of shape (n_samples,)
            Class labels of any sortable type (at least two classes).
        sample_weight : array-like of shape (n_samples,), optional
            Non-negative weights :math:`w_n` of the likelihood terms: the model is
            :math:`\prod_n p(y_n \mid \mathbf f_n)^{w_n}\,p(\mathbf f)`, so an integer weight is the same
            as repeating the row and 0 as removing it (its CVI site stays empty); the data-scaled start and the
            type-II box use the weighted input variances. ``"type2"`` and ``"fixed"`` only (``"bayes"``: its EP
            evidence has no weighted sites).

        Returns
        -------
        GPClassifier
            ``self``.

        Raises
        ------
        ValueError
            NaN/inf in ``X`` or ``y``, a single class in ``y``, real-valued (continuous) ``y``, mismatched lengths,
            a binary link with more than two classes, a negative, non-finite or all-zero ``sample_weight`` (or one
            with ``hyperparameters="bayes"``), bad settings.
        TypeError
            Non-numeric or sparse ``X``, labels that cannot be sorted, settings of the wrong type.
        """
        seed = self._seed()
        hp = self._hyperparameters()
        _precheck_X(X)
        idx, classes = _class_labels(y, self._num_rows(X))
        weights = check_sample_weight(sample_weight, int(idx.shape[0]))
        link = self._link(len(classes))
        names = feature_names_of(X)
        prior = check_prior_choice(self.prior)
        if hp == "bayes" and weights is not None:
            raise ValueError("sample_weight is for hyperparameters='type2' or 'fixed': the fully Bayesian fit's "
                             "evidence (EP) has no weighted sites")
        if hp == "bayes" and prior is None:
            raise ValueError("prior=None (ML-II) is for hyperparameters='type2': with 'bayes' a flat prior on the "
                             "log-hyperparameters is improper; give prior='default', 'scaled' or a distribution")
        if hp == "bayes" and link not in _BINARY_LINKS and not (link == "softmax" and len(classes) <= 3):
            # measured (benchmarks/results/multiclass_bayes_*.md): q(theta) on the multi-class CVI bound (what is
            # left for robust-max and K > 3) takes about 3 min on iris / wine and predicts no better than MAP-II
            raise ValueError(f"hyperparameters='bayes' is for the binary links and the softmax with at most 3 "
                             f"classes (multi-class EP's evidence); the {link!r} likelihood with {len(classes)} "
                             f"classes takes 'type2' or 'fixed'. FullyBayesianCVI().run(GPMulticlass(X, y)) fits "
                             f"q(theta) on the multi-class CVI bound (minutes; biased towards small signal "
                             f"variances), and gpvi.NUTS on gpvi.models.whitened.WhitenedLatentGP(GPMulticlass(X, y)) "
                             f"samples (theta, f) exactly")
        if link in _BINARY_LINKS:
            model: Any = GPClassification(X, idx, kernel=self.kernel, likelihood=link, theta=self.theta,
                                          feature_names=names, device=self.device, weights=weights)
        else:
            model = GPMulticlass(X, classes[idx], kernel=self.kernel, likelihood=link, theta=self.theta,
                                 feature_names=names, device=self.device, weights=weights)
        if hp == "bayes":
            return self._set_fitted(model, self._fully_bayesian(seed, prior).run(model), names, classes)
        if link in _BINARY_LINKS:
            engine: Any = self._binary_engine(model.num_data, seed)
            loop: Any = TypeII
        else:
            engine = self._multiclass_engine(model.num_data, model.num_classes, seed)
            loop = MulticlassTypeII
        if hp == "type2":
            post = loop(engine, inner_num_steps=max(int(self.max_sweeps), 50), prior=prior).run(model)
        else:
            post = engine.run(model)
        return self._set_fitted(model, post, names, classes)

    def _fully_bayesian(self, seed: int | None, prior: Any) -> Any:
        """``hyperparameters="bayes"``: FullyBayesianCVI with its defaults (evidence: EP), this estimator's draws."""
        from .inference.cvi.bayes import FullyBayesianCVI

        return FullyBayesianCVI(prior=prior, num_draws=max(int(self.num_draws), 32), seed=0 if seed is None else seed,
                                progress_bar=self.progress_bar)

    @staticmethod
    def _num_rows(X: Any) -> int | None:
        shape = getattr(X, "shape", None)
        return int(shape[0]) if shape is not None and len(shape) >= 1 else None

    def _set_fitted(self, model: Any, post: Any, names: Any = None, classes: Any = None) -> GPClassifier:
        """Set the fitted attributes from a model, its CVI posterior and the original labels (used by :meth:`fit`
        and by :func:`gpvi.io.load_fit`)."""
        self.model_ = model
        self.posterior_ = post
        self.classes_ = np.asarray(model.classes if classes is None else classes)
        self.n_classes_ = int(self.classes_.shape[0])
        self.link_ = model.link
        self.elbo_ = post.elbo
        q_theta = getattr(post, "q", None)                  # "bayes": q(theta), summarised by its mean
        self.hyperparameter_posterior_ = q_theta
        self.theta_ = (post.theta if q_theta is None else q_theta.mean).detach().clone()
        self.hyperparameters_ = model.describe(self.theta_)
        self.kernel_ = model.kernel_at(self.theta_)
        self.n_features_in_ = int(model.X.shape[1])
        if names is not None:
            self.feature_names_in_ = np.asarray(names, dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        return self

    @property
    def _multiclass(self) -> bool:
        return isinstance(self.model_, GPMulticlass)

    def _check_fitted(self) -> None:
        """scikit-learn's ``NotFittedError`` (a ValueError and AttributeError) before ``fit``."""
        if not hasattr(self, "posterior_"):
            raise _not_fitted_error()("this GPClassifier is not fitted yet; call fit(X, y) first")

    def _check_X(self, X: Any) -> Any:
        """Validated inputs for prediction: columns of a DataFrame must match those seen in ``fit``."""
        self._check_fitted()
        _check_feature_names(getattr(self, "feature_names_in_", None), feature_names_of(X))
        _precheck_X(X, self.n_features_in_)
        return check_X(X, "X", n_features=self.n_features_in_)

    # ------------------------------------------------------------------ prediction
    def predict_proba(self, X: Any) -> np.ndarray:
        r"""Class probabilities :math:`\mathbb E_q[p(y_* = c_k \mid \mathbf f_*)]`, shape ``(n, K)``, columns in
        ``classes_`` order (binary: :math:`[1 - p_*, p_*]`); rows sum to 1.

        Raises ``ValueError`` for malformed ``X``, DataFrame columns other than those seen in ``fit``, or inputs so
        large that the kernel overflows float64 (e.g. ``X * 1e300``): never NaN probabilities without a word.
        """
        Xt = self._check_X(X)
        if self._multiclass:
            return self.posterior_.predict_proba(Xt).cpu().numpy()
        p1 = self.posterior_.predict_proba(Xt).cpu().numpy()
        return np.stack([1.0 - p1, p1], axis=1)

    def predict_log_proba(self, X: Any) -> np.ndarray:
        """Logarithm of :meth:`predict_proba` (``-inf`` where a probability is exactly 0); shape ``(n, K)``."""
        with np.errstate(divide="ignore"):
            return np.log(self.predict_proba(X))

    def predict(self, X: Any) -> np.ndarray:
        """The most probable label (a value of ``classes_``) for each row of ``X``; shape ``(n,)``."""
        proba = self.predict_proba(X)
        if proba.shape[1] == 2:
            return self.classes_[(proba[:, 1] > 0.5).astype(int)]
        return self.classes_[proba.argmax(axis=1)]

    def predict_latent(self, X: Any, return_std: bool = False) -> Any:
        r"""Posterior mean (and standard deviation) of the latent function(s) at ``X``: :math:`q(f_*)`.

        Parameters
        ----------
        X : array-like of shape (n, n_features)
        return_std : bool
            Also return the standard deviations :math:`\sqrt{v_*}`.

        Returns
        -------
        mean : numpy.ndarray of shape (n,) (binary link) or (n, K) (softmax / robust-max, one column per class of
            ``classes_``, also for K = 2)
        std : numpy.ndarray of the same shape
            Only with ``return_std=True``.
        """
        Xt = self._check_X(X)
        mean, var = self.posterior_.predict_latent(Xt)
        mean = mean.cpu().numpy()
        if not check_bool(return_std, "return_std"):
            return mean
        return mean, np.sqrt(np.clip(var.cpu().numpy(), 0.0, None))

    def decision_function(self, X: Any) -> np.ndarray:
        """Posterior mean of the latent function(s) at ``X`` (scikit-learn's shapes).

        Binary link: shape ``(n,)``, positive favours ``classes_[1]``. Softmax / robust-max: shape ``(n, K)``, one
        column per class; with K = 2, the difference of the two columns, shape ``(n,)``. See the class Notes on
        how it ranks points compared with ``predict_proba``.
        """
        mean = self.predict_latent(X)
        if mean.ndim == 2 and mean.shape[1] == 2:
            return mean[:, 1] - mean[:, 0]
        return mean

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Mean accuracy on ``(X, y)`` (labels as at ``fit``), optionally weighted by ``sample_weight``."""
        pred = self.predict(X)
        yt = _label_array(y, "y")
        if yt.shape[0] != pred.shape[0]:
            raise ValueError(f"X has {pred.shape[0]} rows but y has {yt.shape[0]}")
        try:
            seen = np.isin(yt, self.classes_)
        except TypeError:                                   # e.g. strings against numbers: nothing matches
            seen = np.zeros(yt.shape[0], dtype=bool)
        if not seen.all():
            unknown = np.unique(yt[~seen]).tolist()
            shown = ", ".join(map(repr, unknown[:6])) + (", ..." if len(unknown) > 6 else "")
            raise ValueError(f"y holds labels [{shown}] not seen in fit (classes_ = {self.classes_.tolist()})")
        correct = (pred == yt).astype(float)
        if sample_weight is None:
            return float(correct.mean())
        w = check_sample_weight(sample_weight, correct.shape[0]).cpu().numpy()
        return float((w * correct).sum() / w.sum())
