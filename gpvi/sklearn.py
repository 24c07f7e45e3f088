r"""A scikit-learn GP classifier over the CVI engines: binary and multi-class, labels of any type.

``GPClassifier`` is a scikit-learn estimator (``ClassifierMixin``, ``BaseEstimator``): ``__init__`` only stores
its arguments, ``fit`` validates with scikit-learn's own functions (``validate_data``,
``check_classification_targets``, ``_check_sample_weight``) and runs an engine, fitted state lives in
trailing-underscore attributes, and ``get_params``/``set_params``, ``clone``, grid search, pipelines and ``score``
come from scikit-learn. It passes every check of ``sklearn.utils.estimator_checks.check_estimator`` with its
default settings (``tests/sklearn/test_estimator_checks.py``).

What ``fit`` runs, by the number of classes K in ``y`` and the ``likelihood``:

* K = 2 with ``"logit"``/``"probit"`` (``"auto"`` picks logit): one latent GP,
  :class:`gpvi.models.classification.GPClassification`, fitted by :class:`gpvi.inference.cvi.engine.CVI`
  (``hyperparameters="fixed"``) or by the type-II loop :class:`gpvi.inference.cvi.typeii.TypeII` around it;
* K >= 2 with ``"softmax"``/``"robustmax"`` (``"auto"`` picks softmax for K >= 3): K latent GPs sharing one kernel,
  :class:`gpvi.models.multiclass.GPMulticlass`, fitted by the same engine and loop.

Inputs may be numpy arrays, pandas DataFrames or torch tensors; scikit-learn's validation turns them into float64
numpy arrays and the classifier builds float64 tensors on its ``device``. Outputs are numpy arrays.

Ctrl-C: the engines catch ``KeyboardInterrupt`` and return a partial, resumable result with an
:class:`~gpvi.exceptions.InterruptedRunWarning` (for those who call them directly); ``fit`` does not: it runs them
inside :func:`gpvi.inference.progress.interrupt_propagates`, so ``KeyboardInterrupt`` leaves ``fit`` and stops the
caller's loop (``cross_val_score``, a grid search), and the estimator is left not fitted.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, validate_data

from .exceptions import advising
from .inference.cvi.engine import CVI
from .inference.cvi.options import MonteCarlo, SingleSite, num_steps_for_sweeps
from .inference.cvi.typeii import TypeII
from .inference.progress import interrupt_propagates
from .models.classification import GPClassification
from .models.multiclass import GPMulticlass, check_no_missing_labels
from .numerics.softmax_rules import default_quadrature
from .models.gpytorch_likelihoods import link_of_gpytorch
from .models.priors import check_prior_choice
from .numerics.quadrature import Quadrature
from .rng import check_random_state
from .validation import (check_bool, check_choice, check_device, check_nonnegative_int, check_not_meta,
                         check_positive_int)
from .inference.cvi.bayes import FullyBayesianCVI

__all__ = ["GPClassifier"]

_BINARY_LINKS = ("logit", "probit")
_MULTICLASS_LINKS = ("softmax", "robustmax")
_BOX_ADVICE = {True: "see posterior_.info['at_bound']; GPClassifier's box is fixed: prior='default' or 'scaled' keeps "
               "theta inside it", False: "see posterior_.info['at_bound']; GPClassifier's box is fixed: a tighter "
               "prior on those hyperparameters keeps them inside it (prior={name: distribution})"}


def _host(a: Any, name: str) -> Any:
    """A torch tensor as a numpy array on the host (scikit-learn reads numpy; not from ``meta``); others as they are."""
    check_not_meta(a, name)
    return a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else a


class GPClassifier(ClassifierMixin, BaseEstimator):
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
        lengthscale^2 = d var(x_j), signal variance 1. A given kernel starts at the values the user set on it (different
        from GPyTorch's initial values; the others start data-scaled, as the default does); its frozen
        parameters (``requires_grad=False``) stay fixed and are not in ``theta_``; its registered priors
        (``lengthscale_prior=`` ...) are the prior of those hyperparameters (see ``prior``); ``GreaterThan`` /
        ``Interval`` constraints are honoured.
    likelihood : {"auto", "logit", "probit", "softmax", "robustmax"} or a GPyTorch likelihood
        ``gpytorch.likelihoods.BernoulliLikelihood()`` is ``"probit"``, ``SoftmaxLikelihood(num_classes=K,
        mixing_weights=False)`` is ``"softmax"`` (:mod:`gpvi.models.gpytorch_likelihoods`; others are refused).
        ``"auto"`` (default): ``"logit"`` for two classes, ``"softmax"`` for more. ``"logit"``/``"probit"`` need
        exactly two classes. ``"softmax"``/``"robustmax"`` work for any K >= 2; with two classes they fit **two**
        latent GPs (``p(y = classes_[1]) = sigma(f_1 - f_0)`` for the softmax: the difference has prior covariance
        2k, and q is factorised over the two functions), which is not the same model as ``"logit"``'s single GP.
        Recorded in ``link_``.
    mode : {"full", "stochastic"}
        Full-batch CVI steps or doubly stochastic single-site steps (``batch_size`` data points per step on
        cached, rank-one-updated factors; multi-class: all K sites of each point, one factor per class).
    hyperparameters : {"type2", "fixed", "bayes"}
        ``"type2"`` (default): MAP-II on the bound (:class:`~gpvi.inference.cvi.typeii.TypeII`, with ``prior``);
        ``"fixed"``: keep them at
        their start; ``"bayes"`` (binary links, and the softmax with any number of classes): integrate over them,
        :class:`~gpvi.inference.cvi.bayes.FullyBayesianCVI` -- a Gaussian :math:`q(\theta)` (PSIS-checked importance
        sampling where D <= 4, else Salimans-Knowles Hessian-free) on EP's approximate evidence (binary EP,
        or multi-class EP with full K x K sites, at :math:`O((NK)^3)` per sweep), predictions
        averaged over ``num_draws`` draws of it (at least 32) with their CVI posteriors. ``"bayes"`` runs EP to
        convergence at every step and is much slower than ``"type2"``
        (``benchmarks/results/classification_bayes.md``); ``mode``, ``beta``, ``estimator`` and ``max_sweeps`` do
        not apply (FullyBayesianCVI's own full-batch engine), and the fit cannot be saved with
        :func:`gpvi.io.save_fit`. Robust-max raises ``ValueError`` (it has no EP evidence here, and its q(theta)
        would sit on the multi-class CVI bound, biased towards small signal variances in the benchmarks). q(theta)
        is only as good as EP's evidence: with few points per class it understates the signal variance (at 4 to 10
        classes of 10-25 points, 0.07-0.37 posterior sd below NUTS over the hyperparameters and latents, test
        probabilities within 0.013 of NUTS's; ``benchmarks/studies/results/multiclass_ep_rule_*.md``,
        ``multiclass_ep_is.md``).
    prior : "default", "scaled", None, dict or torch.distributions.Distribution
        Prior :math:`p(\theta)` on the kernel log-hyperparameters (theta's order: ``model_.names``) for ``"type2"``
        and ``"bayes"``; ignored by ``"fixed"``. Priors registered on ``kernel`` always apply to their
        hyperparameters; the setting below is the prior of the others (:mod:`gpvi.models.model_prior`).

        * ``"default"``: independent :math:`\mathcal N(0, 10)` on each (:func:`gpvi.models.priors.default_prior`),
          centred at signal variance 1 and lengthscale 1 on every input (an input whose standard deviation is
          outside [0.1, 10] gets a :class:`gpvi.InputScaleWarning`: standardise the inputs).
        * ``"scaled"``: the same variance, centred at the data-scaled values ``model_.scaled_theta()``:
          lengthscale^2 = d var(x_j) on input j (d inputs), signal variance 1
          (:func:`gpvi.models.priors.resolve_prior`). It depends on ``X`` only, not on ``y``.
        * ``None`` (``"type2"`` only; ``"bayes"`` raises ``ValueError``, as a flat prior is improper): maximise the
          ELBO alone (ML-II, as scikit-learn's GPC does with its Laplace evidence); irrelevant inputs may then run to
          the box bound (lengthscale^2 = 1e5 var(x_j)). ``None`` and ``"scaled"`` give the same predictions in any
          units of the inputs (the type-II box moves with each input's scale).
        * ``{name: distribution}``: priors on natural-scale quantities (``"lengthscale"``, ``"lengthscale[nox]"``,
          ``"signal_sd"``, ``"signal_var"``), with the log-Jacobian; ``"default"`` on the rest.
        * Any object with ``log_prob`` on a ``(D,)`` vector (not with registered priors: refused).

        With d standardised inputs two points are about 2d apart in squared distance, so at the default prior's
        centre the kernel between them is about :math:`e^{-d}`, and with many inputs and few points that prior
        can outweigh the data (on sonar, d = 60 and 100 rows, MAP-II then predicts about 1/2 everywhere, as NUTS
        under the same prior does); ``"scaled"`` is centred where the kernel between typical points is about
        :math:`e^{-1}`. The test log losses of the three choices are in
        ``benchmarks/results/classification_peers.md``.
    beta : float
        CVI step size in (0, 1] (``"type2"``: its inner runs step at ``TypeII``'s ``inner_beta``, 0.75).
    estimator : {"auto", "quadrature", "mc", "fixed"}
        Site gradients. ``"auto"``: quadrature, except for the softmax with K > 3 (``"fixed"``: an average over 1,024
        fixed quasi-Monte Carlo points). ``"mc"``: Monte Carlo (binary any link; multi-class softmax only, with a
        decreasing step). ``"fixed"``: multi-class softmax only.
    num_quadrature : int, optional
        Quadrature nodes (per dimension for the softmax); default 96 for the binary links, and the multi-class
        engine's rule (:func:`gpvi.numerics.softmax_rules.default_quadrature`) for the softmax. Robust-max has its own
        1-D rule and ignores it.
    num_draws : int
        Monte Carlo draws per site and step for ``estimator="mc"``.
    batch_size : int
        Sites per stochastic step (``mode="stochastic"``).
    max_sweeps : int
        Budget in sweeps over the data (turned into the engine's ``num_steps``, recorded in
        ``posterior_.info["num_steps"]``); with ``"type2"`` also the inner budget (at least 50).
    tol : float
        Relative ELBO change for convergence.
    theta : array-like of shape (D,), optional
        Starting log-hyperparameters (overrides the kernel's values).
    random_state : int, numpy.random.RandomState or None
        Seed for site order and Monte Carlo draws (``None``: non-deterministic; a ``RandomState``: ``fit`` draws a seed
        from it, scikit-learn's convention), checked by :func:`gpvi.rng.check_random_state` when ``fit`` starts.
    verbose : int
        0 (default): no output during ``fit`` (as inside cross-validation); 1 or more: the engines' tqdm
        progress bars.
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
    posterior_ : LatentPosterior or BayesClassificationPosterior
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
    ``decision_function`` is the log-odds of ``predict_proba`` for two classes and its logarithm for more, so it
    ranks points as the probabilities do (scikit-learn's scorers may use either); the latent posterior itself is
    :meth:`predict_latent`. ``fit(X, y, sample_weight)`` weights the likelihood terms: an integer weight is the
    same model as the repeated row, and the fit is the same computation (the type-II inner runs measure a weighted
    row as that many repeated rows). Ctrl-C during ``fit`` raises ``KeyboardInterrupt`` out of ``fit`` (scikit-learn's
    convention: it stops ``cross_val_score`` or a grid search) and leaves the estimator not fitted (no fitted
    attribute, ``check_is_fitted`` raises); for a partial, resumable run call the engines directly (module docstring).

    Examples
    --------
    >>> import gpvi
    >>> from gpvi.sklearn import GPClassifier
    >>> ds = gpvi.datasets.load_pima()
    >>> clf = GPClassifier(hyperparameters="fixed").fit(ds.X_train, ds.y_train)
    >>> clf.predict_proba(ds.X_test).shape
    (332, 2)
    >>> round(clf.score(ds.X_test, ds.y_test), 2)
    0.79
    """

    def __init__(self, kernel: Any = None, likelihood: str = "auto", *, mode: str = "full",
                 hyperparameters: str = "type2", prior: Any = "default", beta: float = 0.5,
                 estimator: str = "auto", num_quadrature: int | None = None, num_draws: int = 10,
                 batch_size: int = 1, max_sweeps: int = 500, tol: float = 1e-9, theta: Any = None,
                 random_state: Any = None, verbose: int = 0, device: str | None = None) -> None:
        self.kernel = kernel
        self.likelihood = likelihood
        self.mode = mode
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
        self.verbose = verbose
        self.device = device

    # ------------------------------------------------------------------ settings
    def _progress_bar(self) -> bool:
        """``verbose`` >= 1 (a bool counts as 0 or 1): the engines show their progress bars."""
        if isinstance(self.verbose, (bool, np.bool_)):
            return bool(self.verbose)
        return check_nonnegative_int(self.verbose, "verbose") >= 1

    def _link(self, num_classes: int) -> str:
        lik = check_choice(link_of_gpytorch(self.likelihood, num_classes=num_classes), "likelihood",
                           ["auto", *_BINARY_LINKS, *_MULTICLASS_LINKS])
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
                   progress_bar=self._progress_bar())

    def _multiclass_engine(self, num_data: int, num_classes: int, seed: int | None) -> CVI:
        mode = check_choice(self.mode, "mode", ["full", "stochastic"])
        batch_size = check_positive_int(self.batch_size, "batch_size")
        estimator = check_choice(self.estimator, "estimator", ["auto", "quadrature", "mc", "fixed"])
        quad = None
        if self.num_quadrature is not None:
            base = default_quadrature(num_classes)
            quad = Quadrature(self.num_quadrature, base.rule, scale=base.scale, width=base.width)
        return CVI(mode=mode, beta=self.beta,
                   estimator=MonteCarlo(num_draws=self.num_draws) if estimator == "mc" else estimator,
                   quadrature=quad, single_site=SingleSite(batch_size=batch_size),
                   num_steps=self._num_steps(num_data, mode, batch_size), tol=self.tol, seed=seed,
                   progress_bar=self._progress_bar())

    # ------------------------------------------------------------------ fitting
    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> GPClassifier:
        r"""Fit the CVI posterior (and, with ``hyperparameters="type2"``, the kernel hyperparameters).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            numpy array, pandas DataFrame or torch tensor (at least 2 rows).
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
            Malformed ``X`` or ``y`` (scikit-learn's messages: NaN/inf, complex, 1-D or empty ``X``, mismatched
            lengths, continuous ``y``), a single class in ``y``, a binary link with more than two classes, a
            negative, all-zero or misshapen ``sample_weight`` (or one with ``hyperparameters="bayes"``), bad
            settings.
        TypeError
            Sparse ``X``, entries that are not numbers, labels of mixed types, settings of the wrong type.
        KeyboardInterrupt
            Ctrl-C during the fit (an engine's partial result is not kept): the estimator is then not fitted.
        """
        try:
            with interrupt_propagates(), advising(bound=_BOX_ADVICE[self.prior is None]):    # type-II's box
                return self._fit(X, y, sample_weight)
        except KeyboardInterrupt:
            for name in [v for v in vars(self) if v.endswith("_") and not v.startswith("__")]:
                delattr(self, name)                         # not fitted: check_is_fitted raises
            raise

    def _fit(self, X: Any, y: Any, sample_weight: Any) -> GPClassifier:
        seed = check_random_state(self.random_state)
        hp = check_choice(self.hyperparameters, "hyperparameters", ["type2", "fixed", "bayes"])
        prior = check_prior_choice(self.prior)
        if self.device is not None:
            device = check_device(self.device)
        else:
            device = X.device if isinstance(X, torch.Tensor) else torch.device("cpu")
        if isinstance(y, (list, tuple)) or getattr(y, "dtype", None) == object:
            check_no_missing_labels(np.asarray(y, dtype=object), "y")     # before sorting fails on them
        X, y = validate_data(self, _host(X, "X"), _host(y, "y"), dtype=np.float64, order="C", ensure_min_samples=2)
        check_classification_targets(y)
        if y.dtype.kind == "f" and np.abs(y).max() < 2.0 ** 53:
            y = y.astype(np.int64)                          # integer-valued reals (as read from a CSV) are ints
        classes, idx = np.unique(y, return_inverse=True)
        if classes.shape[0] < 2:
            label = classes[0].item() if isinstance(classes[0], np.generic) else classes[0]
            raise ValueError(f"y holds one class only ({label!r}): a classifier needs at least two classes")
        idx = idx.reshape(-1).astype(np.int64)
        weights = None
        if sample_weight is not None:
            weights = _check_sample_weight(_host(sample_weight, "sample_weight"), X, dtype=np.float64,
                                           ensure_non_negative=True)
        link = self._link(len(classes))
        if hp == "bayes" and weights is not None:
            raise ValueError("sample_weight is for hyperparameters='type2' or 'fixed': the fully Bayesian fit's "
                             "evidence (EP) has no weighted sites")
        if hp == "bayes" and prior is None:
            raise ValueError("prior=None (ML-II) is for hyperparameters='type2': with 'bayes' a flat prior on the "
                             "log-hyperparameters is improper; give prior='default', 'scaled' or a distribution")
        if hp == "bayes" and link == "robustmax":
            # no EP evidence for robust-max (its tilted moments under a correlated cavity are orthant integrals), and
            # q(theta) on the class-factorised CVI bound sits at too small signal variances
            # (benchmarks/results/multiclass_bayes_*.md); NUTS cannot check it either (a piecewise-constant likelihood)
            raise ValueError("hyperparameters='bayes' is for the logit, probit and softmax likelihoods (EP's "
                             "evidence); the 'robustmax' likelihood has no EP evidence here and takes 'type2' or "
                             "'fixed'. FullyBayesianCVI(evidence='cvi').run(GPMulticlass(X, y, "
                             "likelihood='robustmax')) fits q(theta) on the multi-class CVI bound (biased towards "
                             "small signal variances)")
        names = getattr(self, "feature_names_in_", None)
        names = None if names is None else [str(n) for n in names]
        Xt = torch.tensor(X, dtype=torch.float64, device=device)     # a copy: X may be a read-only view
        if link in _BINARY_LINKS:
            model: Any = GPClassification(Xt, idx, kernel=self.kernel, likelihood=link, theta=self.theta,
                                          feature_names=names, weights=weights)
        else:
            model = GPMulticlass(Xt, classes[idx], kernel=self.kernel, likelihood=link, theta=self.theta,
                                 feature_names=names, weights=weights)
        if hp == "bayes":
            post = self._fully_bayesian(seed, prior).run(model)
        else:
            if link in _BINARY_LINKS:
                engine: Any = self._binary_engine(model.num_data, seed)
            else:
                engine = self._multiclass_engine(model.num_data, model.num_classes, seed)
            if hp == "type2":
                post = TypeII(engine, inner_num_steps=max(int(self.max_sweeps), 50), prior=prior).run(model)
            else:
                post = engine.run(model)
        # a partial result that reached here without its warning (interrupt_propagates raises at the warning)
        if any(bool(getattr(p, "info", {}).get("interrupted")) for p in (post, getattr(post, "q", None))):
            raise KeyboardInterrupt("the fit was interrupted (Ctrl-C); its partial result is not kept")
        return self._set_fitted(model, post, names, classes)

    def _fully_bayesian(self, seed: int | None, prior: Any) -> Any:
        """``hyperparameters="bayes"``: FullyBayesianCVI with its defaults (evidence: EP), this estimator's draws."""

        return FullyBayesianCVI(prior=prior, num_draws=max(int(self.num_draws), 32), seed=0 if seed is None else seed,
                                progress_bar=self._progress_bar())

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

    def _validated(self, X: Any) -> torch.Tensor:
        """``X`` checked against the fit (scikit-learn's ``validate_data``: features, column names), as float64 on
        the model's device."""
        check_is_fitted(self)
        X = validate_data(self, _host(X, "X"), dtype=np.float64, order="C", reset=False)
        return torch.tensor(X, dtype=torch.float64, device=self.model_.X.device)

    # ------------------------------------------------------------------ prediction
    def predict_proba(self, X: Any) -> np.ndarray:
        r"""Class probabilities :math:`\mathbb E_q[p(y_* = c_k \mid \mathbf f_*)]`, shape ``(n, K)``, columns in
        ``classes_`` order (binary: :math:`[1 - p_*, p_*]`); rows sum to 1.

        Raises ``ValueError`` for malformed ``X``, DataFrame columns other than those seen in ``fit``, or inputs so
        large that the kernel overflows float64 (e.g. ``X * 1e300``): never NaN probabilities without a word.
        """
        Xt = self._validated(X)
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

    def decision_function(self, X: Any) -> np.ndarray:
        r"""Scores that rank points as :meth:`predict_proba` does (scikit-learn's shapes).

        Two classes: the log-odds :math:`\log p_* - \log(1 - p_*)` of ``classes_[1]``, shape ``(n,)`` (positive
        where :meth:`predict` gives ``classes_[1]``). K >= 3 classes: :meth:`predict_log_proba`, shape ``(n, K)``
        (its argmax is :meth:`predict`'s label). For the latent function itself see :meth:`predict_latent`.
        """
        logp = self.predict_log_proba(X)
        if logp.shape[1] == 2:
            return logp[:, 1] - logp[:, 0]
        return logp

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
        Xt = self._validated(X)
        mean, var = self.posterior_.predict_latent(Xt)
        mean = mean.cpu().numpy()
        if not check_bool(return_std, "return_std"):
            return mean
        return mean, np.sqrt(np.clip(var.cpu().numpy(), 0.0, None))
