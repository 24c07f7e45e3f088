r"""GPyTorch likelihood objects where gpvi's classifiers take a link name.

* ``gpytorch.likelihoods.BernoulliLikelihood()`` is :math:`p(y = 1 \mid f) = \Phi(f)`: gpvi's ``"probit"``;
* ``gpytorch.likelihoods.SoftmaxLikelihood(num_classes=K, mixing_weights=False)`` is
  :math:`p(y = k \mid \mathbf f) = e^{f_k} / \sum_j e^{f_j}` over K latent functions: gpvi's ``"softmax"``
  (its ``num_classes`` must be the number of classes in ``y``).

A ``SoftmaxLikelihood`` with mixing weights (latent functions mixed by a learned matrix :math:`W`, the GPyTorch
default) has no gpvi site of that form and is refused, as is any other GPyTorch likelihood object, with an error
naming the argument; nothing is silently replaced.

For latent GPs beyond classification (:func:`site_likelihood_of_gpytorch`, used by
:class:`~gpvi.models.classification.LatentGP` and :class:`~gpvi.models.generalised.GPGeneralisedRegression`):

* ``StudentTLikelihood`` is :class:`~gpvi.models.latent_likelihoods.StudentT` with ``df = deg_free`` and
  ``scale = sqrt(noise)`` (GPyTorch's ``forward``: ``StudentT(df=deg_free, loc=f, scale=noise.sqrt())``);
* ``LaplaceLikelihood`` is :class:`~gpvi.models.latent_likelihoods.Laplace` with ``scale = sqrt(noise)``
  (``Laplace(loc=f, scale=noise.sqrt())``: ``noise`` is the square of the scale, not the scale its docstring names);
* ``BetaLikelihood`` is :class:`~gpvi.models.latent_likelihoods.Beta` with its ``scale``
  (``Beta(s sigmoid(f) + 1, s (1 - sigmoid(f)) + 1)``);
* any other ``_OneDimensionalLikelihood`` (a user's subclass, GPyTorch's ``PoissonLikelihood`` and
  ``NegativeBinomialLikelihood``, whose softplus links are kept) is :class:`GPyTorchSite`: its ``forward(f)``
  distribution's ``log_prob`` with the derivatives in :math:`f` by autograd, and the expectations by gpvi's
  quadrature rule (not GPyTorch's 20-point Gauss-Hermite).

The likelihood's parameters are read once and held fixed; a likelihood with a batch shape or a registered prior is
refused (learning them is not implemented). ``GaussianLikelihood`` belongs to :class:`gpvi.GPRegression`.
"""

from __future__ import annotations

import copy
from typing import Any

import gpytorch
import torch

from .latent_likelihoods import Beta, Laplace, StudentT, describe_rows
from .likelihood_base import Likelihood

__all__ = ["link_of_gpytorch", "site_likelihood_of_gpytorch", "GPyTorchSite"]


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


def _fixed_value(likelihood: Any, attr: str, name: str) -> float:
    """The scalar value of ``likelihood.<attr>``, refusing batch shapes and registered priors."""
    priors = [n for n, *_ in likelihood.named_priors()]
    if priors:
        raise ValueError(f"{name} is a {type(likelihood).__name__} with a registered prior ({', '.join(priors)}); "
                         f"gpvi holds the likelihood's parameters fixed at their values (learning them is not "
                         f"implemented yet): build it without the prior")
    value = getattr(likelihood, attr).detach()
    if value.numel() != 1:
        raise ValueError(f"{name} is a {type(likelihood).__name__} with a batch of {value.numel()} {attr} values; "
                         f"gpvi needs one (batch_shape=torch.Size([]))")
    return float(value.reshape(()))


def site_likelihood_of_gpytorch(likelihood: Any, name: str = "likelihood") -> Any:
    """A gpvi site likelihood for a GPyTorch likelihood object (module docstring); anything else unchanged.

    Bernoulli and softmax objects go through :func:`link_of_gpytorch` (their link names).

    Raises
    ------
    ValueError
        A batch shape or a registered prior on a likelihood parameter.
    TypeError
        A GPyTorch likelihood that is not one-dimensional (Gaussian, multitask, likelihood lists).
    """
    lik = gpytorch.likelihoods
    if isinstance(likelihood, lik.StudentTLikelihood):
        return StudentT(df=_fixed_value(likelihood, "deg_free", name),
                        scale=_fixed_value(likelihood, "noise", name) ** 0.5)
    if isinstance(likelihood, lik.LaplaceLikelihood):
        return Laplace(scale=_fixed_value(likelihood, "noise", name) ** 0.5)
    if isinstance(likelihood, lik.BetaLikelihood):
        return Beta(scale=_fixed_value(likelihood, "scale", name))
    if isinstance(likelihood, (lik.BernoulliLikelihood, lik.SoftmaxLikelihood)):
        return link_of_gpytorch(likelihood, name)
    if isinstance(likelihood, lik._OneDimensionalLikelihood):
        return GPyTorchSite(likelihood, name)
    if isinstance(likelihood, lik.Likelihood):
        raise TypeError(f"{name} is a {type(likelihood).__name__}; latent GPs take one-dimensional GPyTorch "
                        f"likelihoods (StudentTLikelihood, LaplaceLikelihood, BetaLikelihood, BernoulliLikelihood or a "
                        f"_OneDimensionalLikelihood subclass); a GaussianLikelihood is gpvi.GPRegression's")
    return likelihood


class GPyTorchSite(Likelihood):
    r"""A GPyTorch ``_OneDimensionalLikelihood`` as a CVI site: :math:`h(f)` = ``forward(f).log_prob(y)``.

    :math:`h'` and :math:`h''` come from autograd in :math:`f` (double backward); the expectations from gpvi's rule
    (:func:`gpvi.models.likelihoods.expected_log_lik`). The likelihood is deep-copied in float64 with its parameters
    frozen at their values. A ``log_prob`` with a kink in :math:`f` (the Laplace density) has a curvature that
    autograd cannot see (:math:`h'' = 0` beside the kink); GPyTorch's ``LaplaceLikelihood`` is therefore mapped to
    gpvi's closed form, and a user's kinked density is not supported.

    Parameters
    ----------
    likelihood : gpytorch.likelihoods._OneDimensionalLikelihood
    name : str
        The argument's name in error messages.

    Raises
    ------
    ValueError
        (from :meth:`check_targets`, which the models call with the targets) targets outside the distribution's
        support (naming ``y``), or a ``log_prob`` that autograd cannot differentiate in ``f`` (naming ``name``).
    """

    binary = False

    def __init__(self, likelihood: Any, name: str = "likelihood") -> None:
        module = copy.deepcopy(likelihood).to(dtype=torch.float64)
        for p in module.parameters():
            p.requires_grad_(False)
        self.module = module
        self.arg = name
        self.name = f"gpytorch:{type(likelihood).__name__}"

    def _dist(self, f: torch.Tensor) -> Any:
        return self.module.to(device=f.device).forward(f)

    def log_prob(self, y: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self._dist(f).log_prob(y)

    def response(self, f: torch.Tensor) -> Any:
        """:math:`p(y \\mid f)`: the distribution ``forward(f)`` (for the predictive of new targets)."""
        with torch.no_grad():
            return self._dist(f)

    def derivatives(self, y, f):
        with torch.enable_grad():
            fg = f.detach().clone().requires_grad_(True)
            h = self._dist(fg).log_prob(y)
            if not h.requires_grad:
                raise ValueError(f"{self.arg}: {type(self.module).__name__}.forward(f).log_prob(y) is not "
                                 f"differentiable in f (it has no autograd graph); CVI needs its first and second "
                                 f"derivatives in f: write forward with differentiable torch operations")
            h = h.expand(torch.broadcast_shapes(h.shape, fg.shape))
            (h1,) = torch.autograd.grad(h.sum(), fg, create_graph=True)
            if h1.requires_grad:
                (h2,) = torch.autograd.grad(h1.sum(), fg, allow_unused=True)
                h2 = torch.zeros_like(fg) if h2 is None else h2
            else:
                h2 = torch.zeros_like(fg)
        return h.detach(), h1.detach(), h2.detach()

    def check_targets(self, y: torch.Tensor, name: str = "y") -> torch.Tensor:
        """``y`` if it lies in the support of ``forward(f)``; also checks once that ``log_prob`` is differentiable."""
        dist = self._dist(torch.zeros_like(y))
        try:
            support = dist.support
        except NotImplementedError:
            support = None
        if support is not None and hasattr(support, "check"):
            bad = ~support.check(y)
            if bool(bad.any()):
                raise ValueError(f"{name} must lie in the support ({support}) of {type(self.module).__name__}; "
                                 f"{describe_rows(bad, y)}")
        self.derivatives(y, torch.zeros_like(y))
        return y

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "class": f"{type(self.module).__module__}.{type(self.module).__qualname__}"}

    def __repr__(self) -> str:
        return f"GPyTorchSite({type(self.module).__name__})"
