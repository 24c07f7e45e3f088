"""The models and posteriors of a fit file as plain data, and back (used by :mod:`gpvi.io`): regression models and
their priors, posteriors by their ``state_dict``, fitted :class:`gpvi.GPClassifier` objects by their settings,
labels and CVI sites, :class:`gpvi.GPGeneralisedRegression` models by their likelihood's name and parameters
(``likelihood.spec()``) with their CVI sites. Only the default kernel can be described; anything else is refused
with a ``ValueError``; a likelihood that is code rather than gpvi's (a user's GPyTorch likelihood) with a
``TypeError``.
"""

from __future__ import annotations

from typing import Any

import gpytorch
import numpy as np
import torch

from .models.classification import GPClassification
from .models.generalised import GPGeneralisedRegression
from .models.latent_likelihoods import LATENT_LIKELIHOODS
from .models.multiclass import GPMulticlass
from .models.regression import GPRegression
from .numerics.quadrature import Quadrature
from .posteriors import posterior_from_state_dict
from .posteriors.latent import LatentPosterior


class _Invalid(Exception):
    """The file's content is not a valid fit (:mod:`gpvi.io` wraps it into a ValueError naming the path)."""


def _check_default_kernel(kernel_params: Any, d: int, what: str) -> None:
    k = kernel_params.kernel
    ok = (type(k) is gpytorch.kernels.ScaleKernel and type(k.base_kernel) is gpytorch.kernels.RBFKernel
          and k.base_kernel.ard_num_dims == d and getattr(k.base_kernel, "active_dims", None) is None)
    if not ok:
        raise ValueError(f"cannot save {what} with a custom kernel ({kernel_params.kernel!r}): a fit file holds "
                         f"only plain data, and only the default ScaleKernel(RBFKernel(ard_num_dims={d})) can be "
                         f"rebuilt from it")


def _prior_spec(prior: Any) -> dict[str, Any]:
    dist = torch.distributions
    independent = isinstance(prior, dist.Independent)
    base = prior.base_dist if independent else prior
    if not isinstance(prior, dist.Distribution):
        raise ValueError("cannot save a GPRegression with GPyTorch-registered or named priors, frozen or constrained "
                         "parameters, or a likelihood or mean object (model.prior_summary() lists them): a fit file "
                         "holds only plain data, and only a Normal prior on theta (the default N(0, 10 I) included) "
                         "with the default kernel can be rebuilt from it")
    if type(base) is not dist.Normal or (independent and prior.reinterpreted_batch_ndims != 1):
        raise ValueError(f"cannot save a GPRegression whose prior is a {type(prior).__name__}: only Normal priors "
                         f"(the default N(0, 10 I) included) can be written as plain data")
    return {"kind": "normal", "independent": independent, "loc": base.loc, "scale": base.scale}


def _regression_spec(model: Any) -> dict[str, Any]:
    if not isinstance(model, GPRegression):
        raise TypeError(f"a regression fit's posterior must have a gpvi.GPRegression target; got "
                        f"{type(model).__name__}")
    _check_default_kernel(model.kernel_params, int(model.X.shape[1]), "a GPRegression")
    return {"X": model.X, "y": model.y, "jitter": model.jitter, "max_jitter": model.max_jitter,
            "batch_size": model.batch_size, "prior": _prior_spec(model.prior), "names": list(model.names),
            "feature_names": _names(model), "y_offset": float(model.y_offset)}


def _regression_from(spec: dict[str, Any]) -> Any:
    pr = spec["prior"]
    if pr.get("kind") != "normal":
        raise _Invalid(f"unknown prior kind {pr.get('kind')!r}")
    prior = torch.distributions.Normal(pr["loc"], pr["scale"])
    if pr["independent"]:
        prior = torch.distributions.Independent(prior, 1)
    # y centred at its mean (y_offset != 0), or as given: a ZeroMean model, or a file written before gpvi centred y
    # (no y_offset), rebuilt as it was fitted
    centred = float(spec.get("y_offset", 0.0)) != 0.0
    model = GPRegression(spec["X"], spec["y"], prior=prior, jitter=float(spec["jitter"]),
                         max_jitter=float(spec["max_jitter"]), batch_size=int(spec["batch_size"]),
                         feature_names=spec.get("feature_names"),
                         mean=None if centred else gpytorch.means.ZeroMean())
    if list(model.names) != list(spec["names"]):
        raise _Invalid(f"the rebuilt model's parameters {model.names} differ from the saved ones {spec['names']}")
    if model.y_offset != float(spec.get("y_offset", 0.0)):
        raise _Invalid(f"the rebuilt model's y offset {model.y_offset} differs from the saved one {spec['y_offset']}")
    return model


def _posterior_from(state: dict[str, Any], model: Any) -> Any:
    if not isinstance(state, dict):
        raise _Invalid("the posterior description is not a dict")
    return posterior_from_state_dict(state, target=model)          # the class is chosen by state["kind"]


_PLAIN_PRIORS = ("default", "scaled", None)
"""The ``GPClassifier(prior=...)`` settings a fit file can hold (a prior object is not plain data)."""


def _classifier_spec(clf: Any) -> dict[str, Any]:
    if not hasattr(clf, "posterior_"):
        raise ValueError("cannot save a GPClassifier that is not fitted; call fit(X, y) first")
    params = clf.get_params()
    if isinstance(params.get("random_state"), np.random.RandomState):
        params["random_state"] = None       # not plain data; fit drew its seed from it, predictions do not use one
    if params.get("device") is not None:
        params["device"] = str(params["device"])            # plain data; loading puts the fit on the CPU
    if params.get("kernel") is not None:
        raise ValueError(f"cannot save a GPClassifier with a custom kernel ({params['kernel']!r}): a fit file holds "
                         "only plain data, and only the default kernel (kernel=None) can be rebuilt from it")
    if params.get("prior", "default") not in _PLAIN_PRIORS:
        raise ValueError(f"cannot save a GPClassifier with a prior object ({type(params['prior']).__name__}): a fit "
                         "file holds only plain data, and only prior='default', 'scaled' or None can be written to it")
    if getattr(clf, "hyperparameter_posterior_", None) is not None:
        raise ValueError("cannot save a GPClassifier(hyperparameters='bayes') fit: its predictive holds a CVI "
                         "posterior per draw of q(theta); save clf.hyperparameter_posterior_.state_dict() with "
                         "torch.save and refit, or fit with hyperparameters='type2'")
    model = clf.model_
    _check_default_kernel(model.kernel_params, int(model.X.shape[1]), "a GPClassifier")
    post = clf.posterior_.state_dict()
    es = post.get("engine_state")
    if isinstance(es, dict) and es.get("factor") is not None:
        post["engine_state"] = {**es, "factor": None}      # N x N and recomputable: not stored
    names = getattr(clf, "feature_names_in_", None)
    multiclass = _is_multiclass(model)
    return {"params": params, "classes": [_label(c) for c in np.asarray(clf.classes_).tolist()], "X": model.X,
            "y_index": model.y.detach().cpu().long(), "weights": model.weights,
            "model": "multiclass" if multiclass else "binary",
            "link": model.link, "likelihood": model.likelihood.spec() if multiclass else model.link,
            "posterior": post, "feature_names": _names(model),
            "feature_names_in": None if names is None else [str(n) for n in names]}


def _label(value: Any) -> Any:
    """A class label as plain data (str, int, float or bool); others cannot be written to the JSON description."""
    if isinstance(value, (str, bool, int, float)):
        return value
    raise TypeError(f"cannot save a GPClassifier whose classes_ hold a {type(value).__name__} label ({value!r}): "
                    "only strings, numbers and booleans are plain data")


def _names(model: Any) -> list[str] | None:
    names = getattr(model, "feature_names", None)
    return None if names is None else [str(n) for n in names]


def _classifier_from(spec: dict[str, Any]) -> Any:
    from .sklearn import GPClassifier                   # imported on use: scikit-learn takes ~1 s (gpvi/__init__.py)

    params = dict(spec["params"])
    if params.get("kernel") is not None:
        raise _Invalid("a saved classifier must use the default kernel")
    valid = set(GPClassifier._get_param_names())
    unknown = set(params) - valid
    if unknown:
        raise _Invalid(f"unknown GPClassifier parameters {sorted(unknown)}")
    if params.get("prior", "default") not in _PLAIN_PRIORS:
        raise _Invalid(f"a saved classifier's prior must be 'default', 'scaled' or null; got {params['prior']!r}")
    params["device"] = None                                 # a fit loads on the CPU, wherever it was fitted
    clf = GPClassifier(**params)
    classes = np.asarray(spec["classes"])
    if classes.ndim != 1 or classes.shape[0] < 2:
        raise _Invalid(f"classes must be a list of at least two labels; got {spec['classes']!r}")
    if "y_index" not in spec:
        raise _Invalid("the classifier's targets are not saved as class indices (y_index): a file written by an "
                       "earlier gpvi; fit the classifier and save it again")
    idx = torch.as_tensor(spec["y_index"])
    if idx.dim() != 1 or idx.dtype != torch.int64 or not bool(((idx >= 0) & (idx < len(classes))).all()):
        raise _Invalid(f"y_index must hold class indices in 0..{len(classes) - 1}")
    kind = spec.get("model")
    if kind == "binary":
        if len(classes) != 2:
            raise _Invalid(f"a binary classifier needs two classes; got {len(classes)}")
        model = GPClassification(spec["X"], idx.numpy(), likelihood=spec["link"], theta=params.get("theta"),
                                 feature_names=spec.get("feature_names"), weights=spec.get("weights"))
    elif kind == "multiclass":
        model = GPMulticlass(spec["X"], classes[idx.numpy()], likelihood=spec["likelihood"],
                             theta=params.get("theta"), feature_names=spec.get("feature_names"),
                             weights=spec.get("weights"))
        if model.num_classes != len(classes):
            raise _Invalid(f"the class indices use {model.num_classes} of the {len(classes)} classes")
    else:
        raise _Invalid(f"unknown classifier model {kind!r}")
    if _is_multiclass(model):
        post = LatentPosterior.from_state_dict(spec["posterior"], target=model)
    else:
        post = LatentPosterior.from_state_dict(spec["posterior"], model)
        q = (post.info or {}).get("quadrature")
        if isinstance(q, dict) and q != post.quadrature.spec():
            post.quadrature = Quadrature(int(q["num_points"]), str(q["rule"]), scale=float(q["scale"]),
                                         width=float(q["width"]))
    return clf._set_fitted(model, post, spec.get("feature_names_in"), classes)


def _is_multiclass(model: Any) -> bool:
    """Whether ``model`` is a K-latent multi-class model (it has ``num_classes``)."""
    return getattr(model, "num_classes", None) is not None


def _generalised_spec(post: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(model, posterior)`` descriptions of the CVI posterior of a :class:`gpvi.GPGeneralisedRegression`."""
    model = getattr(post, "model", None)
    if not isinstance(model, GPGeneralisedRegression) or getattr(post, "kind", None) != "latent":
        raise TypeError(f"a generalised_regression fit's posterior must be the CVI posterior of a "
                        f"gpvi.GPGeneralisedRegression; got {type(post).__name__} of {type(model).__name__}")
    lik = model.likelihood
    if type(lik) is not LATENT_LIKELIHOODS.get(getattr(lik, "name", None)):
        raise TypeError(f"fit: cannot save a GPGeneralisedRegression whose likelihood is {lik!r}, not one of gpvi's "
                        f"({', '.join(LATENT_LIKELIHOODS)}; GPyTorch's StudentTLikelihood, LaplaceLikelihood and "
                        "BetaLikelihood map to them): a fit file holds only plain data and loading it never runs "
                        "code, so a likelihood defined by code (a user's _OneDimensionalLikelihood subclass, whose "
                        "forward is Python) can be neither written to it nor rebuilt from it; save the posterior's "
                        "sites yourself (post.state_dict()) and rebuild the model with that likelihood")
    _check_default_kernel(model.kernel_params, int(model.X.shape[1]), "a GPGeneralisedRegression")
    state = post.state_dict()
    es = state.get("engine_state")
    if isinstance(es, dict) and es.get("factor") is not None:
        state["engine_state"] = {**es, "factor": None}      # N x N and recomputable: not stored
    spec = {"X": model.X, "y": model.y, "likelihood": lik.spec(), "theta": model.theta, "weights": model.weights,
            "feature_names": _names(model)}
    return spec, state


def _generalised_from(spec: dict[str, Any], state: dict[str, Any]) -> Any:
    """The CVI posterior (its ``model`` a :class:`gpvi.GPGeneralisedRegression`) from :func:`_generalised_spec`."""
    lik = spec["likelihood"]
    name = lik.get("name") if isinstance(lik, dict) else None
    if name not in LATENT_LIKELIHOODS:
        raise _Invalid(f"unknown likelihood {name!r}; this gpvi rebuilds {', '.join(LATENT_LIKELIHOODS)} (a file "
                       "written by another gpvi, or edited)")
    model = GPGeneralisedRegression(spec["X"], spec["y"], likelihood=dict(lik), theta=spec.get("theta"),
                                    feature_names=spec.get("feature_names"), weights=spec.get("weights"))
    if not isinstance(state, dict) or state.get("kind") != "latent":
        raise _Invalid("the posterior of a generalised regression must be a CVI (latent) posterior")
    return LatentPosterior.from_state_dict(state, target=model)
