r"""Multi-class GP classification: K latent GPs and a softmax or robust-max likelihood (for multi-class CVI).

.. math::

    p(\mathbf y, F) = \Big[\prod_{n=1}^N p(y_n \mid \mathbf f_n)\Big]\prod_{k=1}^K \mathcal N(\mathbf f_k \mid 0, K_\theta),
    \qquad \mathbf f_n = (f_{n1}, \dots, f_{nK}),

with K latent functions :math:`f_k \sim \mathcal{GP}(0, k_\theta)` that share **one kernel and one** :math:`\theta`
(the default of GPflow's and GPyTorch's multi-output classifiers: the classes differ through their latent values,
not through their length scales). Two likelihoods:

* :class:`~gpvi.models.multiclass_likelihoods.Softmax`: :math:`p(y = k \mid \mathbf f) = e^{f_k} / \sum_j e^{f_j}`;
* :class:`~gpvi.models.multiclass_likelihoods.RobustMax` (GPflow's robust-max, Hernández-Lobato et al. 2011): :math:`p(y = k \mid \mathbf f) = 1 - \epsilon`
  if :math:`k = \arg\max_j f_j`, else :math:`\epsilon / (K - 1)`.

The likelihoods and their expectations for CVI are in :mod:`gpvi.models.multiclass_likelihoods`.
"""

from __future__ import annotations

from typing import Any

import gpytorch
import numpy as np
import torch

from .classification import LatentGP
from .likelihoods import Likelihood
from .gpytorch_likelihoods import link_of_gpytorch
from .multiclass_likelihoods import make_multiclass_likelihood

__all__ = ["GPMulticlass", "check_class_labels", "check_no_missing_labels"]


def check_no_missing_labels(y: np.ndarray, name: str = "y") -> None:
    """``ValueError`` naming ``name`` when an object array of labels holds a missing value (``None``, NaN,
    ``pandas.NA``/``NaT``): a label cannot be missing, and sorting the labels would fail with a ``TypeError``."""
    if y.dtype.kind != "O":
        return
    rows = [i for i, v in enumerate(y.reshape(-1)) if v is None or (isinstance(v, (float, np.floating)) and v != v)
            or type(v).__name__ in ("NAType", "NaTType")]
    if rows:
        shown = ", ".join(map(str, rows[:5])) + (", ..." if len(rows) > 5 else "")
        raise ValueError(f"{name} contains missing labels (None or NaN) at {len(rows)} row(s) ({shown}); drop those "
                         f"rows or give them a label")


def check_class_labels(y: Any, name: str = "y", *, device: torch.device | str | None = None
                       ) -> tuple[torch.Tensor, np.ndarray]:
    """Labels of any type -> ``(indices (N,) int64 in 0..K-1, classes (K,) sorted)``; ``ValueError`` naming ``name``
    for non-1-D labels, missing values or a single class."""
    if isinstance(y, torch.Tensor):
        y = y.detach().cpu().numpy()
    arr = np.asarray(y)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one label per row); got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError(f"{name} is empty")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or infinite labels")
    check_no_missing_labels(arr, name)
    try:
        classes, idx = np.unique(arr, return_inverse=True)
    except TypeError as exc:
        raise TypeError(f"{name} holds labels that cannot be sorted: {exc}") from None
    if classes.shape[0] < 2:
        raise ValueError(f"{name} holds a single class ({classes[0]!r}); classification needs at least two")
    return torch.as_tensor(idx.reshape(-1), dtype=torch.long, device=device), classes


class GPMulticlass(LatentGP):
    r"""K-class GP classification: K latent GPs sharing one kernel and one :math:`\theta`, softmax or robust-max.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    y : array-like of shape (n_samples,)
        Labels of any sortable type (ints, strings...), mapped to 0..K-1 in the order of ``classes``; at least two
        classes.
    kernel : gpytorch.kernels.Kernel, optional
        Shared by the K latent functions; default ``ScaleKernel(RBFKernel(ard_num_dims=n_features))``.
    likelihood : {"softmax", "robustmax"}, Softmax, RobustMax or gpytorch.likelihoods.SoftmaxLikelihood
        Default ``"softmax"``; ``RobustMax(epsilon)`` sets the label-noise probability (default 1e-3). GPyTorch's
        ``SoftmaxLikelihood(num_classes=K, mixing_weights=False)`` is the softmax (with mixing weights: refused;
        :mod:`gpvi.models.gpytorch_likelihoods`).
    theta : array-like of shape (D,), optional
        Kernel log-hyperparameters (see :class:`~gpvi.models.classification.LatentGP`).
    device : torch.device or str, optional
    feature_names : sequence of str, optional
    weights : array-like of shape (n_samples,), optional
        Likelihood weights (:class:`~gpvi.models.classification.LatentGP`); every class of a point shares them.

    Attributes
    ----------
    y : torch.Tensor of shape (N,), int64
        Class indices.
    classes : numpy.ndarray of shape (K,)
        The original labels, sorted; ``classes[k]`` is class ``k``.
    num_classes : int
        K.

    Examples
    --------
    >>> import torch
    >>> X = torch.linspace(0, 1, 9, dtype=torch.float64).unsqueeze(-1)
    >>> model = GPMulticlass(X, ["a", "b", "c"] * 3)
    >>> model.num_classes, model.link, model.classes.tolist(), model.y[:4].tolist()
    (3, 'softmax', ['a', 'b', 'c'], [0, 1, 2, 0])
    """

    def __init__(self, X: Any, y: Any, kernel: gpytorch.kernels.Kernel | None = None,
                 likelihood: str | Likelihood = "softmax", theta: Any = None, *,
                 device: torch.device | str | None = None, feature_names: Any = None, weights: Any = None) -> None:
        if isinstance(likelihood, gpytorch.likelihoods.Likelihood):
            _, classes = check_class_labels(y, "y")
            likelihood = link_of_gpytorch(likelihood, num_classes=len(classes))
        super().__init__(X, y, kernel, make_multiclass_likelihood(likelihood), theta, device=device,
                         feature_names=feature_names, weights=weights)

    def _set_targets(self, y: Any, X: torch.Tensor) -> None:
        idx, classes = check_class_labels(y, "y", device=X.device)
        if idx.shape[0] != X.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows but y has {idx.shape[0]}")
        self.y, self.classes = idx, classes

    @property
    def num_classes(self) -> int:
        """K."""
        return int(self.classes.shape[0])

    @property
    def site_shape(self) -> tuple[int, ...]:
        """Shape of CVI's site parameters: ``(N, K)`` (K class-factorised latent functions)."""
        return (self.num_data, self.num_classes)

    def _expectations(self, y: torch.Tensor, m: torch.Tensor, v: torch.Tensor, **rule: Any) -> Any:
        return self.likelihood.expected_log_lik(y, m, v, **rule)            # (N, K) marginals: Softmax / RobustMax

    def __repr__(self) -> str:
        return (f"GPMulticlass(N={self.num_data}, d={self.X.shape[1]}, K={self.num_classes}, D={self.dim}, "
                f"likelihood={self.link!r})")
