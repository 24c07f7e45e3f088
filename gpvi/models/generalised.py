r"""GP regression with a non-Gaussian likelihood: counts, outliers, proportions (issue 60).

.. math::

    p(\mathbf y, \mathbf f) = \Big[\prod_{n=1}^N p(y_n \mid f_n)\Big]\,\mathcal N(\mathbf f \mid 0, K_\theta)

(Khan & Lin 2017, eq. 4) with :math:`p(y_n \mid f_n)` a Poisson or negative-binomial count with a log link, a
Student-t or Laplace observation, a Beta proportion (:mod:`gpvi.models.latent_likelihoods`) or a one-dimensional
GPyTorch likelihood (:mod:`gpvi.models.gpytorch_likelihoods`). The model is a
:class:`~gpvi.models.classification.LatentGP` whose targets are checked by the likelihood; the engine is
:class:`gpvi.CVI` (full-batch or single-site), whose bound and site updates need only the per-site expectations
(:func:`gpvi.models.likelihoods.expected_log_lik`).
"""

from __future__ import annotations

from typing import Any

import gpytorch
import torch

from .classification import LatentGP
from .gpytorch_likelihoods import site_likelihood_of_gpytorch
from .likelihoods import Likelihood, make_likelihood

__all__ = ["GPGeneralisedRegression"]


class GPGeneralisedRegression(LatentGP):
    r"""GP regression with a non-Gaussian likelihood: :math:`y_n \sim p(y \mid f_n)`, :math:`f \sim \mathcal{GP}(0, k)`.

    The name: the target is a value, not a class (hence *regression*, beside :class:`gpvi.GPRegression` and
    :class:`gpvi.GPClassification`), and the likelihood is chosen as in a *generalised* linear model (Poisson,
    negative-binomial, Beta regression; Student-t and Laplace for robust regression): the "generalised GP models"
    of Chan & Dong (2011). :class:`gpvi.GPRegression` remains the exact Gaussian model.

    Inference is CVI (:class:`gpvi.CVI`): each step is a GP-regression prediction with Gaussian pseudo-observations
    (the sites), full-batch (Khan & Lin 2017, Algorithm 1) or one site at a time (eq. 14). The kernel
    hyperparameters are theta (log scale); the likelihood's parameters (``df``, ``scale``, ``dispersion``) are
    fixed at the values given here. Both are learned by type-II on the CVI bound
    (:class:`gpvi.inference.cvi.TypeII`, :class:`gpvi.inference.cvi.LikelihoodTypeII`), MAP-II with priors: those
    registered on the kernel, named ones, and priors on the likelihood's parameters
    (:mod:`gpvi.models.likelihood_priors`); NUTS samples them with the latent values
    (:class:`gpvi.models.whitened.WhitenedLatentGP`). Count likelihoods start CVI from the sites of the log counts
    (:func:`gpvi.models.latent_likelihoods.log_count_sites`).

    **Negative site precisions.** The Student-t likelihood is not log-concave: for an outlying point
    (:math:`|y_n - f_n| > \sigma\sqrt\nu`) :math:`h'' > 0`, and the CVI update (eq. 13)
    :math:`\tilde\lambda^{(2)}_n \leftarrow (1-\beta)\tilde\lambda^{(2)}_n + \beta\,\tfrac12\mathbb E_q[h'']` can
    reach a site precision :math:`-2\tilde\lambda^{(2)}_n \le 0`, which a Gaussian pseudo-observation cannot carry.
    CVI then **damps that site's precision step** (``CVI(invalid="shrink")``, the default: half-way to the
    boundary :math:`\tilde\lambda^{(2)} = 0`, counted in ``info["counters"]["sites_shrunk"]``) and **clips** the
    precision at the floor :math:`10^{-10}/\overline{K_{nn}}` (``sites_floored``), as BayesNewton clips negative site
    precisions, but counted rather than silent; the site's :math:`\tilde\lambda^{(1)}` keeps the full step, towards
    the value that makes the mean stationary for the clipped precision (:mod:`gpvi.numerics.sites`, "Negative
    curvature"). The outlier's site then carries its pull on the mean but no curvature. Why clipping rather than
    negative site precisions: every CVI step is a GP regression on :math:`K + S` with pseudo-noise :math:`S > 0`
    (one Cholesky factor, rank-one updates in single-site mode); a negative entry would make :math:`K + S` indefinite
    even where :math:`q` is valid. The price: where the maximiser of the bound over all Gaussians has a site with
    :math:`\mathbb E_q[h''] > 0`, CVI returns the best mean for the clipped covariance instead (measured: 1e-4 below
    GPyTorch's full-rank optimum on 30 points with two gross outliers, bound -27.9; equal to 1e-8 without them).
    ``CVI(invalid="reject")`` leaves such a site's precision unchanged instead of damping it.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    y : array-like of shape (n_samples,)
        Targets, checked by the likelihood: counts (non-negative integers) for ``"poisson"`` and
        ``"negative_binomial"``, values strictly inside (0, 1) for ``"beta"``, the support of a GPyTorch
        likelihood's distribution; ``ValueError`` naming ``y`` and the rows otherwise.
    kernel : gpytorch.kernels.Kernel, optional
        Default ``ScaleKernel(RBFKernel(ard_num_dims=n_features))``; see :class:`~gpvi.models.classification.LatentGP`.
    likelihood : str, Likelihood, dict or gpytorch.likelihoods._OneDimensionalLikelihood
        Required. A name (``"poisson"``, ``"negative_binomial"``, ``"student_t"``, ``"laplace"``, ``"beta"``, with
        default parameters), an object (``StudentT(df=4, scale=0.5)``, ``NegativeBinomial(dispersion=2)``...), a
        ``spec()`` dict, or a GPyTorch ``StudentTLikelihood``, ``LaplaceLikelihood``, ``BetaLikelihood`` (mapped to
        gpvi's with the same parameters) or other one-dimensional likelihood (through its ``forward``).
        Binary likelihoods are :class:`gpvi.GPClassification`'s.
    theta, device, feature_names, weights
        As for :class:`~gpvi.models.classification.LatentGP`.

    Raises
    ------
    ValueError
        Bad targets for the likelihood (naming ``y``), a binary likelihood, a GPyTorch likelihood with a batch
        shape or a prior; and :class:`~gpvi.models.classification.LatentGP`'s errors.
    TypeError
        No likelihood, or one that is not a likelihood.

    References
    ----------
    Khan, M. E. and Lin, W. (2017). Conjugate-computation variational inference. AISTATS.
    Chan, A. B. and Dong, D. (2011). Generalized Gaussian process models. CVPR.

    Examples
    --------
    >>> import torch, gpvi
    >>> X = torch.linspace(0, 1, 20, dtype=torch.float64).unsqueeze(-1)
    >>> counts = torch.poisson(torch.exp(1 + torch.sin(6 * X[:, 0])), generator=torch.Generator().manual_seed(0))
    >>> model = gpvi.GPGeneralisedRegression(X, counts, likelihood="poisson")
    >>> post = gpvi.CVI(progress_bar=False).run(model)
    >>> model.link, post.info["converged"]
    ('poisson', True)
    """

    def __init__(self, X: Any, y: Any, kernel: gpytorch.kernels.Kernel | None = None, *,
                 likelihood: str | Likelihood | dict | gpytorch.likelihoods.Likelihood, theta: Any = None,
                 device: torch.device | str | None = None, feature_names: Any = None, weights: Any = None) -> None:
        if likelihood is None:
            raise TypeError("likelihood is required: 'poisson', 'negative_binomial', 'student_t', 'laplace', 'beta', "
                            "a likelihood object or a one-dimensional GPyTorch likelihood")
        lik = make_likelihood(site_likelihood_of_gpytorch(likelihood))
        if getattr(lik, "binary", False):
            raise ValueError(f"likelihood {lik.name!r} is binary: use gpvi.GPClassification for labels")
        super().__init__(X, y, kernel, lik, theta, device=device, feature_names=feature_names, weights=weights)
