r"""The multi-class CVI bound as a function of the shared kernel hyperparameters: a target for a Gaussian q(theta).

The multi-class counterpart of :class:`gpvi.models.cvi_bound.CVIBoundTarget` (whose module docstring holds the
argument). For K latent GPs sharing :math:`K_\theta` (:class:`gpvi.models.multiclass.GPMulticlass`) the profiled
bound of the class-factorised family (:mod:`gpvi.inference.cvi.multiclass_sites`),

.. math::

    \mathcal L_{CVI}(\theta) = \max_{q = \prod_k q_k(\mathbf f_k)}
      \sum_n \mathbb E_q[\log p(y_n\mid\mathbf f_n)] - \sum_k \mathrm{KL}\big(q_k\,\|\,\mathcal N(0, K_\theta)\big)
      \;\le\; \log p(\mathbf y\mid\theta),

stands in for the evidence, and ``log_joint`` is :math:`\mathcal L_{CVI}(\theta) + \log p(\theta)`: the objective
that :class:`gpvi.inference.cvi.multiclass_typeii.MulticlassTypeII` maximises (its maximiser is the MAP-II point).
A Gaussian engine on it maximises the ELBO of :math:`q(\theta)\,q^*(F\mid\theta)`, a lower bound on
:math:`\log p(\mathbf y)`; :math:`q(\theta)` approximates the posterior of :math:`\theta` under the bound. There is
no multi-class EP here, so this bound is the only evidence available for multi-class fully Bayesian classification;
its gap (the Gaussian, class-factorised :math:`q` against the exact latent posterior) grows where the likelihood
saturates, as in the binary case. NUTS over :math:`(\theta, V)` (:class:`gpvi.models.whitened.WhitenedLatentGP`)
is the reference without it.

Each evaluation runs ELBO-monotone full-batch multi-class CVI
(:func:`gpvi.inference.cvi.multiclass_typeii.converge_sites`) at :math:`\theta` from the sites of a fixed
**anchor** (deterministic in :math:`\theta`, independent of earlier calls), then returns the bound and its
envelope-theorem gradient with the sites held fixed
(:func:`gpvi.inference.cvi.multiclass_sites.theta_objective`). Rows of an ``(S, D)`` call run one after the other.

Names: ``theta``, ``lam1``, ``lam2`` (sites, (N, K)), ``anchor``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..exceptions import NotPSDError
from ..validation import check_positive, check_positive_int, check_theta
from .cvi_bound import _EnvelopeBound
from .multiclass import GPMulticlass
from .priors import check_prior, default_prior, prior_log_prob

__all__ = ["MulticlassBoundTarget"]


class MulticlassBoundTarget:
    r"""Target over the shared kernel log-hyperparameters of multi-class CVI: the profiled bound plus the log prior.

    ``log_joint(theta)`` maps ``(D,) -> ()`` and ``(S, D) -> (S,)``; its autograd gradient is the envelope-theorem
    gradient. A :math:`\theta` where a factorisation or CVI fails gets ``-inf`` (zero gradient).

    Parameters
    ----------
    model : GPMulticlass
    prior : "default", torch.distributions.Distribution or None
        Prior on the log-hyperparameters (``"default"``: independent :math:`\mathcal N(0, 10)`).
    cvi : MulticlassCVI, optional
        The engine whose ``beta``, estimator and rule the inner runs and the bound use (default
        ``MulticlassCVI(progress_bar=False)``: quadrature for K <= 3, 1,024 fixed Sobol' points above).
    inner_quadrature : "auto", Quadrature or None
        The softmax rule of the inner runs and of the bound, as for
        :class:`~gpvi.inference.cvi.multiclass_typeii.MulticlassTypeII`: ``"auto"`` (default) the cheaper
        :func:`~gpvi.inference.cvi.multiclass_typeii.inner_quadrature` (784 nodes per site at K = 3, errors
        about 1e-6 in the bound; measured on iris: 0.22 s against 0.54 s per evaluation) unless ``cvi`` was
        given its own rule; ``None``: the engine's rule.
    anchor : array-like of shape (D,) or MulticlassPosterior, optional
        Where the shared warm-start sites come from: a posterior's theta and sites (re-converged to ``inner_tol``
        on first use), or a theta at which a CVI run computes them (default ``model.theta``).
    inner_tol : float
        Relative change of the bound at which an inner run stops (default 1e-12: the gradient's error is first
        order in the sites' error, and Laplace scales take finite differences of it).
    inner_num_steps : int
        Cap on the steps of one inner run (default 500).

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
                 inner_tol: float = 1e-12, inner_num_steps: int = 500, inner_quadrature: Any = "auto") -> None:
        from ..inference.cvi.multiclass import MulticlassCVI
        from ..inference.cvi.multiclass_typeii import MulticlassTypeII
        from ..inference.cvi.state import COUNTERS

        if not isinstance(model, GPMulticlass):
            raise TypeError(f"model must be a gpvi GPMulticlass; got {type(model).__name__}")
        if cvi is not None and not isinstance(cvi, MulticlassCVI):
            raise TypeError(f"cvi must be a MulticlassCVI engine; got {type(cvi).__name__}")
        self.model = model
        base = cvi if cvi is not None else MulticlassCVI(progress_bar=False)
        # the engine of the inner runs and of the bound: ``base`` with MulticlassTypeII's choice of rule
        self.cvi = MulticlassTypeII(base, inner_quadrature=inner_quadrature)._inner_engine(model)
        dev = model.device
        if isinstance(prior, str):
            if prior != "default":
                raise ValueError(f"prior must be 'default', None or a distribution with log_prob; got {prior!r}")
            self.prior = default_prior(model.dim, device=dev)
        else:
            self.prior = None if prior is None else check_prior(prior, model.dim, device=dev)
        self.inner_tol = check_positive(inner_tol, "inner_tol")
        self.inner_num_steps = check_positive_int(inner_num_steps, "inner_num_steps")
        self.names = list(model.names)
        self.counters: dict[str, float] = {**{k: 0 for k in COUNTERS}, "max_drift": 0.0, "evaluations": 0,
                                           "inner_steps": 0, "failures": 0, "unconverged": 0}
        self._anchor: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        if anchor is not None and hasattr(anchor, "lam1"):
            self._anchor_start: tuple[Any, Any, Any] = (anchor.theta, anchor.lam1, anchor.lam2)
        else:
            self._anchor_start = (model.theta if anchor is None else anchor, None, None)

    @property
    def dim(self) -> int:
        """D, the number of kernel log-hyperparameters."""
        return len(self.names)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def _check(self, theta: Any, name: str) -> torch.Tensor:
        t = check_theta(theta, self.dim, name, device=self.device).detach().to(torch.float64)
        if t.dim() != 1:
            raise ValueError(f"{name} must have shape ({self.dim},); got {tuple(t.shape)}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} contains non-finite values")
        return t.clone()

    def initial_theta(self) -> torch.Tensor:
        """The anchor's theta (an engine's default start)."""
        th = self._anchor[0] if self._anchor is not None else self._anchor_start[0]
        return self._check(th, "anchor")

    def set_anchor(self, theta: Any, lam1: Any = None, lam2: Any = None) -> None:
        """Converge the sites at ``theta`` to ``inner_tol`` (from ``lam1``, ``lam2`` when given, else from a CVI
        run at ``theta``) and make them the warm start of every later evaluation."""
        th = self._check(theta, "theta")
        if lam1 is None or lam2 is None:
            post = self.cvi.run(self.model, th)
            lam1, lam2 = post.lam1, post.lam2
        shape = (self.model.num_data, self.model.num_classes)
        l1 = torch.as_tensor(lam1, dtype=torch.float64, device=self.device).detach()
        l2 = torch.as_tensor(lam2, dtype=torch.float64, device=self.device).detach()
        if l1.shape != shape or l2.shape != shape:
            raise ValueError(f"anchor sites must have shape {shape}; got {tuple(l1.shape)} and {tuple(l2.shape)}")
        if not bool((l2 < 0).all()):
            raise ValueError("anchor sites have lam2 >= 0; they are not valid Gaussian sites")
        inner = self._converge(th, l1, l2)
        self._anchor = (th, inner.lam1.clone(), inner.lam2.clone())

    @property
    def anchor(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(theta, lam1, lam2)`` of the anchor (converged at first use)."""
        if self._anchor is None:
            self.set_anchor(*self._anchor_start)
        assert self._anchor is not None
        return self._anchor

    def _converge(self, theta: torch.Tensor, lam1: torch.Tensor, lam2: torch.Tensor) -> Any:
        from ..inference.cvi.multiclass_typeii import converge_sites

        inner = converge_sites(self.cvi, self.model, theta, lam1, lam2, self.counters, tol=self.inner_tol,
                               max_steps=self.inner_num_steps)
        self.counters["inner_steps"] += inner.t
        if inner.t >= self.inner_num_steps:
            self.counters["unconverged"] += 1
        return inner

    def converged_sites(self, theta: Any) -> Any:
        """The :class:`~gpvi.inference.cvi.multiclass_sites.MulticlassCVIState` of the sites converged at
        ``theta`` from the anchor (raises :class:`~gpvi.exceptions.NotPSDError` or
        :class:`~gpvi.inference.cvi.sites.SiteFault` where CVI cannot run there)."""
        th = self._check(theta, "theta")
        _, lam1, lam2 = self.anchor
        return self._converge(th, lam1, lam2)

    def _one(self, theta: torch.Tensor) -> tuple[float, torch.Tensor]:
        from ..inference.cvi import multiclass_sites as ms
        from ..inference.cvi.sites import SiteFault

        _, lam1, lam2 = self.anchor
        try:
            inner = self._converge(theta, lam1, lam2)
            val, grad = ms.theta_objective(self.cvi, self.model, inner.lam1, inner.lam2, theta)
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

    def log_prior(self, theta: torch.Tensor) -> torch.Tensor:
        r""":math:`\log p(\theta)` (0 without a prior), differentiable."""
        if self.prior is None:
            return torch.zeros(theta.shape[:-1], dtype=theta.dtype, device=theta.device)
        return prior_log_prob(self.prior, theta)

    def log_joint(self, theta: torch.Tensor) -> torch.Tensor:
        r""":math:`\mathcal L_{CVI}(\theta) + \log p(\theta)`: ``(D,) -> ()``, ``(S, D) -> (S,)``; differentiable
        once by autograd (envelope-theorem gradient)."""
        theta = check_theta(theta, self.dim, device=self.device)
        single = theta.dim() == 1
        tb = theta.unsqueeze(0) if single else theta
        finite = torch.isfinite(tb.detach()).all(-1, keepdim=True)
        safe = torch.where(finite, tb, torch.zeros_like(tb))
        out = _EnvelopeBound.apply(tb, self) + self.log_prior(safe)
        return out[0] if single else out

    def latent_posterior(self, theta: Any) -> Any:
        r"""The multi-class CVI posterior :math:`q^*(F\mid\theta)` (a
        :class:`~gpvi.posteriors.multiclass.MulticlassPosterior`) at ``theta``, from sites converged from the
        anchor."""
        inner = self.converged_sites(theta)
        inner.converged = True
        return self.cvi.posterior(self.model, inner, {"anchor_warm_start": True}, warn=False)

    def __repr__(self) -> str:
        return (f"MulticlassBoundTarget(model={self.model!r}, D={self.dim}, inner_tol={self.inner_tol:g}, "
                f"prior={'none' if self.prior is None else type(self.prior).__name__})")
