r"""Saving and loading fits without executing code: :func:`save_fit`, :func:`load_fit`, :class:`SavedFit`.

A fit file is written by :func:`torch.save` and holds exactly four entries:

* ``"format"`` — the string ``"gpvi-fit"``; ``"version"`` — the integer :data:`FORMAT_VERSION`;
* ``"meta"`` — one JSON string (plain ``str``/``int``/``float``/``bool``/``list``/``dict``/``null`` only) that
  describes the fit: kind, method, feature names, standardisation, model settings, the posterior's
  ``state_dict()`` (regression, generalised regression) or the classifier's settings, classes and CVI sites
  (classification). A tensor is
  written in the JSON as ``{"$tensor": KEY}``, a non-finite float as ``{"$float": "nan" | "inf" | "-inf"}``;
* ``"tensors"`` — a flat ``dict`` from those keys to CPU tensors.

:func:`load_fit` reads a file **only** with ``torch.load(path, weights_only=True)``, whose unpickler builds
tensors, numbers, strings and containers and refuses every other Python object, so nothing a file carries is
ever run. It then checks the layout, decodes the JSON and rebuilds the fit from that plain data: the
:class:`gpvi.GPRegression` model and its posterior (through the posteriors' ``from_state_dict``), a fitted
:class:`gpvi.GPClassifier` whose posterior (a :class:`~gpvi.posteriors.latent.LatentPosterior`, for a binary link or the softmax /
robust-max) is refactorised from the
saved sites :math:`\tilde\lambda^{(1)}, \tilde\lambda^{(2)}` and hyperparameters :math:`\theta` exactly as the CVI
run finalised it, so ``predict_proba`` gives the same numbers, or a :class:`gpvi.GPGeneralisedRegression` (counts,
outliers, proportions) and its CVI posterior, rebuilt the same way from its sites, :math:`\theta` and the
likelihood's name and parameters (``likelihood.spec()``, e.g. ``{"name": "student_t", "df": 3.2, "scale": 0.4}``),
so its observation predictive :math:`\int p(y_* \mid f_*)\,q(f_*)\,df_*` is the same. A likelihood that is not one
of gpvi's (:mod:`gpvi.models.latent_likelihoods`) -- a user's GPyTorch ``_OneDimensionalLikelihood`` subclass, whose
``forward`` is code -- cannot be written as plain data: :func:`save_fit` refuses it with a ``TypeError``, and a file
naming a likelihood this gpvi does not know is refused by :func:`load_fit` with a ``ValueError``. A classifier's
labels (``classes_``: strings, numbers or booleans) are saved in the JSON and the training targets as class indices
``y_index`` into them. Any other file — not a gpvi fit, a pickle of other objects, a file whose unpickling would
run code, a truncated or corrupt file, another format version or layout — raises a ``ValueError`` that names the
path and the reason.

What is saved: the training inputs and targets (a GP predicts from them), the hyperparameter posterior or the CVI
sites, the standardisation of the CSV columns, the settings of the model and its likelihood. Models are rebuilt
with the default kernel ``ScaleKernel(RBFKernel(ard_num_dims=d))``; a model with another kernel object cannot be
described as plain data and :func:`save_fit` refuses it. Regression priors are saved when they are the default or a
(possibly ``Independent``) ``Normal``; others are refused.

Names: ``theta`` (log-hyperparameters), ``lam1``/``lam2`` (CVI sites), ``x_mean``/``x_std`` and
``y_mean``/``y_std`` (the standardisation of the CSV's inputs and target).
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import pickle
import re
import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._fit_specs import (_classifier_from, _classifier_spec, _generalised_from, _generalised_spec, _Invalid,
                         _posterior_from, _regression_from, _regression_spec)
from ._saved_fit import KINDS, SavedFit
from .models.generalised import GPGeneralisedRegression

__all__ = ["SavedFit", "save_fit", "load_fit", "FORMAT", "FORMAT_VERSION"]

FORMAT = "gpvi-fit"
"""Value of the ``"format"`` entry of every fit file."""

FORMAT_VERSION = 2
"""Version of the layout; a file of any other version is refused."""

_TENSOR, _FLOAT = "$tensor", "$float"
_TENSOR_DTYPES = (torch.float64, torch.float32, torch.int64, torch.int32, torch.uint8, torch.bool)



# ============================================================================ plain-data encoding
def _encode(obj: Any, tensors: dict[str, torch.Tensor], path: str) -> Any:
    """JSON-ready copy of ``obj``; tensors go to ``tensors`` under their path and are referenced by key."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().clone().contiguous()
        if t.is_sparse or t.dtype not in _TENSOR_DTYPES:
            raise TypeError(f"{path}: cannot save a {t.dtype} tensor{' (sparse)' if t.is_sparse else ''}")
        tensors[path] = t
        return {_TENSOR: path}
    if isinstance(obj, np.ndarray):
        return _encode(torch.from_numpy(np.ascontiguousarray(obj)), tensors, path)
    if isinstance(obj, np.generic):
        obj = obj.item()
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) else {_FLOAT: repr(float(obj))}
    if isinstance(obj, dict):
        if _TENSOR in obj or _FLOAT in obj:
            raise TypeError(f"{path}: keys {_TENSOR!r} and {_FLOAT!r} are reserved")
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError(f"{path}: dict keys must be strings; got {type(k).__name__} {k!r}")
            out[k] = _encode(v, tensors, f"{path}.{k}")
        return out
    if isinstance(obj, (list, tuple)):
        return [_encode(v, tensors, f"{path}.{i}") for i, v in enumerate(obj)]
    if type(obj).__name__ == "Table" and hasattr(obj, "columns") and hasattr(obj, "index"):
        return {"index": _encode(list(obj.index), tensors, f"{path}.index"),
                "columns": _encode(dict(obj.columns), tensors, f"{path}.columns")}
    raise TypeError(f"{path}: cannot save a {type(obj).__name__} as plain data")


def _decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {_TENSOR}:
            key = obj[_TENSOR]
            if not isinstance(key, str) or key not in tensors:
                raise _Invalid(f"the description refers to a tensor {key!r} that the file does not hold")
            return tensors[key].clone()
        if set(obj) == {_FLOAT}:
            if obj[_FLOAT] not in ("nan", "inf", "-inf"):
                raise _Invalid(f"bad special float {obj[_FLOAT]!r}")
            return float(obj[_FLOAT])
        return {k: _decode(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    return obj


def _no_constant(token: str) -> Any:
    raise _Invalid(f"the description holds the non-JSON constant {token}")


# ============================================================================ save / load
def _as_saved_fit(fit: Any) -> SavedFit:
    if isinstance(fit, SavedFit):
        return fit
    if getattr(fit, "kind", None) == "latent" and isinstance(getattr(fit, "model", None), GPGeneralisedRegression):
        d = int(fit.model.X.shape[1])
        return SavedFit("generalised_regression", "cvi", [f"x{j}" for j in range(d)], "y", np.zeros(d), np.ones(d),
                        posterior=fit)
    if callable(getattr(fit, "state_dict", None)) and getattr(fit, "target", None) is not None:
        d = int(fit.target.X.shape[1])
        method = {"point": "ml2", "gaussian": "dsvi", "samples": "nuts"}.get(fit.state_dict().get("kind"), "")
        return SavedFit("regression", method, [f"x{j}" for j in range(d)], "y", np.zeros(d), np.ones(d),
                        posterior=fit)
    from .sklearn import GPClassifier                   # imported on use: scikit-learn takes ~1 s (gpvi/__init__.py)

    if isinstance(fit, GPClassifier):
        if not hasattr(fit, "posterior_"):
            raise ValueError("cannot save a GPClassifier that is not fitted; call fit(X, y) first")
        d = int(fit.n_features_in_)
        return SavedFit("classification", f"cvi-{fit.mode}", [f"x{j}" for j in range(d)], "y", np.zeros(d),
                        np.ones(d), classifier=fit)
    raise TypeError(f"fit must be a SavedFit, a fitted GPClassifier, a posterior with a GPRegression target or the "
                    f"CVI posterior of a GPGeneralisedRegression; got {type(fit).__name__}")


def _installed_version() -> str:
    """The installed gpvi's version (recorded in the file's description), "unknown" when gpvi is not installed."""
    try:
        return importlib.metadata.version("gpvi")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def save_fit(path: str | os.PathLike, fit: Any) -> None:
    """Write a fit as tensors plus a JSON description, readable by :func:`load_fit` without running code.

    Parameters
    ----------
    path : str or path-like
        File to write (replaced atomically if it exists).
    fit : SavedFit, GPClassifier or posterior
        A :class:`SavedFit`; or a fitted :class:`gpvi.GPClassifier`, a regression posterior whose ``target``
        is a :class:`gpvi.GPRegression`, or the CVI posterior (:class:`~gpvi.posteriors.latent.LatentPosterior`) of
        a :class:`gpvi.GPGeneralisedRegression` (each saved with features ``x0, x1, ...`` and no
        standardisation).

    Raises
    ------
    TypeError
        ``fit`` is none of these, or holds data that is not plain (e.g. an object in a posterior's ``info``); a
        generalised regression whose likelihood is not one of gpvi's (a user's GPyTorch likelihood: its class is
        code, which a fit file never holds).
    ValueError
        An unfitted classifier, a custom kernel, or a regression prior that is not Normal.
    OSError
        The file cannot be written.

    Examples
    --------
    >>> import gpvi, tempfile, pathlib
    >>> from gpvi.io import save_fit, load_fit
    >>> ds = gpvi.datasets.load_pima()
    >>> clf = gpvi.GPClassifier(hyperparameters="fixed").fit(ds.X_train, ds.y_train)
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "clf.pt"
    >>> save_fit(p, clf)
    >>> fit = load_fit(p)
    >>> bool(abs(fit.predict_proba(ds.X_test) - clf.predict_proba(ds.X_test)).max() < 1e-12)
    True
    """
    fit = _as_saved_fit(fit)
    if fit.kind not in KINDS:
        raise ValueError(f"fit.kind must be one of {', '.join(map(repr, KINDS))}; got {fit.kind!r}")
    meta: dict[str, Any] = {
        "gpvi_version": _installed_version(), "kind": fit.kind, "method": str(fit.method),
        "features": [str(f) for f in fit.features], "target": str(fit.target),
        "x_mean": torch.as_tensor(np.asarray(fit.x_mean, dtype=np.float64)),
        "x_std": torch.as_tensor(np.asarray(fit.x_std, dtype=np.float64)),
        "y_mean": float(fit.y_mean), "y_std": float(fit.y_std), "extra": dict(fit.extra)}
    if fit.kind == "regression":
        if fit.posterior is None:
            raise ValueError("a regression SavedFit needs a posterior")
        meta["model"] = _regression_spec(fit.posterior.target)
        meta["posterior"] = fit.posterior.state_dict()
    elif fit.kind == "generalised_regression":
        if fit.posterior is None:
            raise ValueError("a generalised_regression SavedFit needs a posterior")
        meta["model"], meta["posterior"] = _generalised_spec(fit.posterior)
    else:
        if fit.classifier is None:
            raise ValueError("a classification SavedFit needs a classifier")
        meta["classifier"] = _classifier_spec(fit.classifier)
    tensors: dict[str, torch.Tensor] = {}
    text = json.dumps(_encode(meta, tensors, "fit"), allow_nan=False, separators=(",", ":"))
    payload = {"format": FORMAT, "version": FORMAT_VERSION, "meta": text, "tensors": tensors}
    target = Path(path)
    if not target.parent.is_dir():
        raise FileNotFoundError(f"cannot save the fit to {str(path)!r}: the folder {str(target.parent)!r} does "
                                "not exist")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")   # same folder: atomic
    try:
        with open(tmp, "xb") as fh:                  # "x": never follows an existing file; mode from the umask
            torch.save(payload, fh)
        os.replace(tmp, target)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise


def _torch_reason(exc: BaseException) -> str:
    m = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
    if m:
        return f"it refers to the Python object {m.group(1)}"
    m = re.search(r"Unsupported operand (\d+)", str(exc))
    return f"unsupported pickle operation {m.group(1)}" if m else "it holds objects other than tensors and plain data"


def _read(path: Path) -> dict[str, Any]:
    """``torch.load(weights_only=True)`` and a check of the four entries; raises ValueError naming ``path``."""
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    if path.is_dir():
        raise ValueError(f"{path}: is a folder, not a fit file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            payload = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        raise ValueError(f"{path}: refused: not a gpvi fit file ({_torch_reason(exc)}; loading it could run code, "
                         "so it was not loaded)") from None
    except MemoryError:
        raise
    except Exception as exc:                  # truncated zip, empty file, text, ...: torch's message varies
        why = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{path}: not a gpvi fit file (unreadable, truncated or corrupt: {why})") from None
    fmt = payload.get("format") if isinstance(payload, dict) else None
    if not isinstance(fmt, str) or fmt != FORMAT:
        extra = f"; it says format {fmt!r}" if isinstance(fmt, str) else ""
        raise ValueError(f"{path}: not a fit saved by the gpvi command (no format {FORMAT!r} entry{extra})")
    version = payload.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version != FORMAT_VERSION:
        raise ValueError(f"{path}: a gpvi fit of format version {version!r}; this gpvi reads version "
                         f"{FORMAT_VERSION} only (fit and save it again)")
    meta, tensors = payload.get("meta"), payload.get("tensors")
    if set(payload) != {"format", "version", "meta", "tensors"} or not isinstance(meta, str) \
            or not isinstance(tensors, dict):
        raise ValueError(f"{path}: not a valid gpvi fit (entries {sorted(map(str, payload))}; expected format, "
                         "version, meta (a JSON string), tensors (a dict))")
    for k, t in tensors.items():
        if not isinstance(k, str) or not isinstance(t, torch.Tensor) or t.dtype not in _TENSOR_DTYPES \
                or t.layout != torch.strided:
            raise ValueError(f"{path}: not a valid gpvi fit (tensor entry {k!r} is a {type(t).__name__})")
    return payload


def load_fit(path: str | os.PathLike) -> SavedFit:
    """Read a fit written by :func:`save_fit` (or ``gpvi fit-regression/fit-classifier --save``).

    The file is read with ``torch.load(path, weights_only=True)`` only, so nothing it carries is executed;
    the fit is rebuilt from its tensors and JSON description.

    Parameters
    ----------
    path : str or path-like

    Returns
    -------
    SavedFit
        Regression: ``posterior`` with its :class:`gpvi.GPRegression` target; classification: a fitted
        ``classifier`` whose ``predict_proba`` equals the saved one's; generalised regression: the CVI
        ``posterior`` of its :class:`gpvi.GPGeneralisedRegression` (``posterior.model``), whose ``predict`` equals
        the saved one's.

    Raises
    ------
    ValueError
        Naming the path and why: no such file, a pickle of other objects (refused unread: loading it could run
        code), a truncated or corrupt file, a file that is not a gpvi fit, another format version, a likelihood this
        gpvi does not know, or a description that does not rebuild.

    Examples
    --------
    >>> from gpvi.io import load_fit
    >>> fit = load_fit("model.pt")            # doctest: +SKIP
    >>> mean, var = fit.predict(X_new)        # doctest: +SKIP
    """
    p = Path(path)
    payload = _read(p)
    try:
        meta = _decode(json.loads(payload["meta"], parse_constant=_no_constant), payload["tensors"])
        if not isinstance(meta, dict):
            raise _Invalid("the description is not a JSON object")
        kind = meta["kind"]
        features = meta["features"]
        if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
            raise _Invalid("features must be a list of strings")
        x_mean = np.asarray(meta["x_mean"], dtype=np.float64)
        x_std = np.asarray(meta["x_std"], dtype=np.float64)
        if x_mean.shape != (len(features),) or x_std.shape != (len(features),):
            raise _Invalid(f"x_mean/x_std have shapes {x_mean.shape}/{x_std.shape} for {len(features)} features")
        common = dict(method=str(meta["method"]), features=list(features), target=str(meta["target"]),
                      x_mean=x_mean, x_std=x_std, extra=dict(meta.get("extra") or {}))
        if kind == "regression":
            model = _regression_from(meta["model"])
            if model.X.shape[1] != len(features):
                raise _Invalid(f"the model has {model.X.shape[1]} inputs but {len(features)} feature names")
            post = _posterior_from(meta["posterior"], model)
            return SavedFit(kind="regression", posterior=post, y_mean=float(meta["y_mean"]),
                            y_std=float(meta["y_std"]), **common)
        if kind == "generalised_regression":
            post = _generalised_from(meta["model"], meta["posterior"])
            if post.model.X.shape[1] != len(features):
                raise _Invalid(f"the model has {post.model.X.shape[1]} inputs but {len(features)} feature names")
            return SavedFit(kind=kind, posterior=post, y_mean=float(meta["y_mean"]), y_std=float(meta["y_std"]),
                            **common)
        if kind == "classification":
            clf = _classifier_from(meta["classifier"])
            if clf.n_features_in_ != len(features):
                raise _Invalid(f"the classifier has {clf.n_features_in_} inputs but {len(features)} feature names")
            return SavedFit(kind="classification", classifier=clf, **common)
        raise _Invalid(f"unknown kind {kind!r}")
    except (_Invalid, KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError,
            RecursionError) as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, KeyError):
            why = f"missing entry {exc}"
        raise ValueError(f"{p}: not a valid gpvi fit ({why})") from None
