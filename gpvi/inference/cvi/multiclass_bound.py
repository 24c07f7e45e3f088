r"""The multi-class CVI bound as a function of the shared kernel hyperparameters: a target for a Gaussian q(theta).

The multi-class counterpart of :class:`gpvi.inference.cvi.bound.CVIBoundTarget` (whose module docstring holds the
argument). For K latent GPs sharing :math:`K_\theta` (:class:`gpvi.models.multiclass.GPMulticlass`) the profiled
bound of the class-factorised family (:mod:`gpvi.inference.cvi.multiclass_sites`),

.. math::

    \mathcal L_{CVI}(\theta) = \max_{q = \prod_k q_k(\mathbf f_k)}
      \sum_n \mathbb E_q[\log p(y_n\mid\mathbf f_n)] - \sum_k \mathrm{KL}\big(q_k\,\|\,\mathcal N(0, K_\theta)\big)
      \;\le\; \log p(\mathbf y\mid\theta),

stands in for the evidence, and ``log_joint`` is :math:`\mathcal L_{CVI}(\theta) + \log p(\theta)`: the objective
that :class:`gpvi.inference.cvi.multiclass_typeii.MulticlassTypeII` maximises (its maximiser is the MAP-II point).
A Gaussian engine on it maximises the ELBO of :math:`q(\theta)\,q^*(F\mid\theta)`, a lower bound on
:math:`\log p(\mathbf y)`; :math:`q(\theta)` approximates the posterior of :math:`\theta` under the bound. Its
gap (the Gaussian, class-factorised :math:`q` against the exact latent posterior) grows where the likelihood
saturates, as in the binary case. NUTS over :math:`(\theta, V)` (:class:`gpvi.models.whitened.WhitenedLatentGP`)
is the reference without it; multi-class EP (:func:`gpvi.numerics.ep_multiclass.multiclass_ep`, softmax,
K <= 3, through :class:`gpvi.inference.cvi.ep_evidence.EPEvidenceTarget`) is the alternative evidence.

Each evaluation runs ELBO-monotone full-batch multi-class CVI
(:func:`gpvi.inference.cvi.multiclass_typeii.converge_sites`) at :math:`\theta` from the sites of a fixed
**anchor** (deterministic in :math:`\theta`, independent of earlier calls), then returns the bound and its
envelope-theorem gradient with the sites held fixed, at the best sites the run evaluated
(:func:`gpvi.inference.cvi.multiclass_typeii.profiled_objective`). Rows of an ``(S, D)`` call run one after the other.

Names: ``theta``, ``lam1``, ``lam2`` (sites, (N, K)), ``anchor``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...exceptions import NotPSDError
from ...validation import check_nonnegative_int
from .bound import AnchoredBoundTarget, refuse_weights
from ...models.multiclass import GPMulticlass
from .engine import CVI
from .multiclass_typeii import MulticlassTypeII
from .multiclass_typeii import converge_sites
from .multiclass_typeii import profiled_objective
from ...numerics.sites import SiteFault

__all__ = ["MulticlassBoundTarget"]


class MulticlassBoundTarget(AnchoredBoundTarget):
    r"""Target over the shared kernel log-hyperparameters of multi-class CVI: the profiled bound plus the log prior.

    ``log_joint(theta)`` maps ``(D,) -> ()`` and ``(S, D) -> (S,)``; its autograd gradient is the envelope-theorem
    gradient. A :math:`\theta` where a factorisation or CVI fails gets ``-inf`` (zero gradient).

    Parameters
    ----------
    model : GPMulticlass
    prior : "default", torch.distributions.Distribution or None
        Prior on the log-hyperparameters (``"default"``: independent :math:`\mathcal N(0, 10)`).
    cvi : CVI, optional
        The engine whose ``beta``, estimator and rule the inner runs and the bound use (default
        ``CVI(progress_bar=False)``: quadrature for K <= 3, 1,024 fixed Sobol' points above).
    inner_quadrature : "auto", Quadrature or None
        The softmax rule of the inner runs and of the bound, as for
        :class:`~gpvi.inference.cvi.multiclass_typeii.MulticlassTypeII`: ``"auto"`` (default) the cheaper
        :func:`~gpvi.inference.cvi.multiclass_typeii.inner_quadrature` (784 nodes per site at K = 3, errors
        about 1e-6 in the bound; measured on iris: 0.22 s against 0.54 s per evaluation) unless ``cvi`` was
        given its own rule; ``None``: the engine's rule.
    anchor : array-like of shape (D,) or LatentPosterior, optional
        Where the shared warm-start sites come from: a posterior's theta and sites (re-converged to ``inner_tol``
        on first use), or a theta at which a CVI run computes them (default ``model.theta``).
    inner_tol : float
        Relative change of the bound at which an inner run stops (default 1e-12: the gradient's error is first
        order in the sites' error, and Laplace scales take finite differences of it).
    inner_num_steps : int
        Cap on the steps of one inner run (default 500).
    anderson : int
        Memory of the Anderson acceleration of the inner runs (default 5; 0: plain damped steps), as for
        :class:`~gpvi.inference.cvi.multiclass_typeii.MulticlassTypeII`: the same values to the inner tolerance in
        fewer inner steps.

    Attributes
    ----------
    names : list of str
        ``model.names``.
    counters : dict
        ``evaluations``, ``inner_steps``, ``failures`` (rows that returned ``-inf``), ``unconverged`` (inner runs
        that hit ``inner_num_steps``), and the inner runs' site counters.

    Examples
    --------
    >>> import torch
    >>> from gpvi.models.multiclass import GPMulticlass
    >>> X = torch.linspace(-2, 2, 15, dtype=torch.float64)[:, None]
    >>> target = MulticlassBoundTarget(GPMulticlass(X, (X[:, 0] > -0.7).long() + (X[:, 0] > 0.7).long()))
    >>> target.log_joint(torch.zeros(2, 2, dtype=torch.float64)).shape
    torch.Size([2])
    """

    def __init__(self, model: GPMulticlass, prior: Any = "default", *, cvi: Any = None, anchor: Any = None,
                 inner_tol: float = 1e-12, inner_num_steps: int = 500, inner_quadrature: Any = "auto",
                 anderson: int = 5) -> None:

        if not isinstance(model, GPMulticlass):
            raise TypeError(f"model must be a gpvi GPMulticlass; got {type(model).__name__}")
        if cvi is not None and not isinstance(cvi, CVI):
            raise TypeError(f"cvi must be a gpvi.CVI engine; got {type(cvi).__name__}")
        refuse_weights(model, type(self).__name__)
        self.model = model
        base = cvi if cvi is not None else CVI(progress_bar=False)
        # the engine of the inner runs and of the bound: ``base`` with MulticlassTypeII's choice of rule
        self.cvi = MulticlassTypeII(base, inner_quadrature=inner_quadrature)._inner_engine(model)
        self.anderson = check_nonnegative_int(anderson, "anderson")
        self._init_anchor(model, prior, anchor, inner_tol, inner_num_steps)

    def _site_shape(self) -> tuple[int, ...]:
        return (self.model.num_data, self.model.num_classes)

    def _converge_sites(self, theta: torch.Tensor, lam1: torch.Tensor, lam2: torch.Tensor) -> Any:

        return converge_sites(self.cvi, self.model, theta, lam1, lam2, self.counters, tol=self.inner_tol,
                              max_steps=self.inner_num_steps, anderson=self.anderson)

    def _one(self, theta: torch.Tensor) -> tuple[float, torch.Tensor]:

        _, lam1, lam2 = self.anchor
        try:
            inner, val, grad = profiled_objective(self.cvi, self.model, theta, lam1, lam2, self.counters,
                                                  tol=self.inner_tol, max_steps=self.inner_num_steps,
                                                  anderson=self.anderson)
            self._count(inner)
        except (SiteFault, NotPSDError, ValueError):
            val, grad = -math.inf, None
        if grad is None or not math.isfinite(val) or not bool(torch.isfinite(grad).all()):
            return -math.inf, torch.zeros_like(theta)
        return val, grad

    def bound_and_grad(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r""":math:`\mathcal L_{CVI}` (without the prior) and its envelope gradient at the rows of ``theta``:
        ``(S, D) -> ((S,), (S, D))``; a row that cannot be evaluated gets ``-inf`` and a zero gradient."""
        th = theta.detach().to(torch.float64)
        vals = torch.full(th.shape[:-1], -math.inf, dtype=torch.float64, device=th.device)
        grads = torch.zeros_like(th)
        self.counters["evaluations"] += th.shape[0]
        for i in range(th.shape[0]):
            if bool(torch.isfinite(th[i]).all()):
                vals[i], grads[i] = self._one(th[i])
        self.counters["failures"] += int((~torch.isfinite(vals)).sum())
        return vals, grads

    def __repr__(self) -> str:
        return (f"MulticlassBoundTarget(model={self.model!r}, D={self.dim}, inner_tol={self.inner_tol:g}, "
                f"prior={'none' if self.prior is None else type(self.prior).__name__})")
