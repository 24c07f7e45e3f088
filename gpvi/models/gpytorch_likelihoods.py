r"""GPyTorch likelihood objects where gpvi's classifiers take a link name.

* ``gpytorch.likelihoods.BernoulliLikelihood()`` is :math:`p(y = 1 \mid f) = \Phi(f)`: gpvi's ``"probit"``;
* ``gpytorch.likelihoods.SoftmaxLikelihood(num_classes=K, mixing_weights=False)`` is
  :math:`p(y = k \mid \mathbf f) = e^{f_k} / \sum_j e^{f_j}` over K latent functions: gpvi's ``"softmax"``
  (its ``num_classes`` must be the number of classes in ``y``).

A ``SoftmaxLikelihood`` with mixing weights (latent functions mixed by a learned matrix :math:`W`, the GPyTorch
default) has no gpvi site of that form and is refused, as is any other GPyTorch likelihood object, with an error
naming the argument; nothing is silently replaced.
"""

from __future__ import annotations

from typing import Any

import gpytorch

__all__ = ["link_of_gpytorch"]


def link_of_gpytorch(likelihood: Any, name: str = "likelihood", *, num_classes: int | None = None) -> Any:
    """The gpvi link for a GPyTorch likelihood object (``"probit"`` / ``"softmax"``); anything else unchanged.

    Raises
    ------
    ValueError
        A ``SoftmaxLikelihood`` with mixing weights, or whose ``num_classes`` differs from ``num_classes``.
    TypeError
        Another GPyTorch likelihood.
    """
    if isinstance(likelihood, gpytorch.likelihoods.BernoulliLikelihood):
        return "probit"
    if isinstance(likelihood, gpytorch.likelihoods.SoftmaxLikelihood):
        if getattr(likelihood, "mixing_weights", None) is not None:
            raise ValueError(f"{name} is a SoftmaxLikelihood with mixing weights (a learned {likelihood.num_features}"
                             f" x {likelihood.num_classes} matrix); gpvi's softmax has one latent function per class: "
                             f"build it with SoftmaxLikelihood(num_classes={likelihood.num_classes}, "
                             f"mixing_weights=False)")
        if num_classes is not None and int(likelihood.num_classes) != int(num_classes):
            raise ValueError(f"{name} is a SoftmaxLikelihood with num_classes={likelihood.num_classes} but y holds "
                             f"{num_classes} classes")
        return "softmax"
    if isinstance(likelihood, gpytorch.likelihoods.Likelihood):
        raise TypeError(f"{name} is a {type(likelihood).__name__}; gpvi's classifiers accept "
                        f"gpytorch.likelihoods.BernoulliLikelihood (probit) and SoftmaxLikelihood(num_classes=K, "
                        f"mixing_weights=False), or the names 'logit', 'probit', 'softmax', 'robustmax'")
    return likelihood
