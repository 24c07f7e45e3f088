r"""The CVI bound as a function of the kernel hyperparameters: a target for a Gaussian :math:`q(\theta)` (S&K, DSVI).

For a latent GP (:class:`gpvi.models.classification.LatentGP`: binary GP classification, or K class-factorised
latent functions sharing the kernel, :class:`gpvi.models.multiclass.GPMulticlass`) with kernel log-hyperparameters
:math:`\theta` and prior :math:`p(\theta)`, the exact hyperparameter posterior needs
:math:`\log p(\mathbf y\mid\theta) = \log\int p(\mathbf y\mid\mathbf f)\,\mathcal N(\mathbf f\mid 0, K_\theta)\,d\mathbf f`,
which has no closed form. :class:`CVIBoundTarget` replaces it by its **profiled CVI bound**

.. math::

    \mathcal L_{CVI}(\theta) = \max_{q(\mathbf f)\ \text{Gaussian}}
      \mathbb E_{q}[\log p(\mathbf y\mid\mathbf f)] - \mathrm{KL}\big(q(\mathbf f)\,\|\,\mathcal N(0, K_\theta)\big)
      \;\le\; \log p(\mathbf y\mid\theta),

the ELBO (Khan & Lin 2017, eq. 5) at the Gaussian :math:`q^*(\mathbf f\mid\theta)` that CVI converges to at that
:math:`\theta` (with K latent functions, :math:`q = \prod_k q_k(\mathbf f_k)` and the KL is
:math:`\sum_k \mathrm{KL}(q_k\,\|\,\mathcal N(0, K_\theta))`), and its ``log_joint`` is

.. math::

    \log \tilde g(\theta) = \mathcal L_{CVI}(\theta) + \log p(\theta) \;\le\; \log p(\mathbf y, \theta).

This is exactly the objective :math:`F(\theta)` that :class:`gpvi.inference.cvi.typeii.TypeII` maximises; its
maximiser is the MAP-II point.

**What a Gaussian engine on this target optimises.** :math:`\tilde g` is an unnormalised density over
:math:`\theta`; DSVI or S&K (:class:`gpvi.DSVI`, :class:`gpvi.SKGaussian`: a Gaussian :math:`q(\theta)`) maximise

.. math::

    \mathcal F(q) = \mathbb E_{q(\theta)}\big[\mathcal L_{CVI}(\theta) + \log p(\theta)\big] + \mathcal H[q(\theta)]
    = \mathrm{ELBO}\big(q(\theta)\,q^*(\mathbf f\mid\theta)\big) \;\le\; \log p(\mathbf y),

the evidence lower bound of the structured family :math:`q(\theta, \mathbf f) = q(\theta)\,q^*(\mathbf f\mid\theta)`
(a Gaussian over :math:`\theta` and, for each :math:`\theta`, the CVI-optimal Gaussian over :math:`\mathbf f`). The
gap to :math:`\log p(\mathbf y)` is :math:`\mathbb E_{q(\theta)}[\log p(\mathbf y\mid\theta) - \mathcal
L_{CVI}(\theta)] + \mathrm{KL}(q(\theta)\,\|\,\tilde p(\theta\mid\mathbf y))` with :math:`\tilde p \propto \tilde g`:
:math:`q(\theta)` approximates the posterior of :math:`\theta` *under the CVI bound*, which is close to the true
:math:`p(\theta\mid\mathbf y)` where the Gaussian latent posterior is accurate (the gap
:math:`\log p(\mathbf y\mid\theta) - \mathcal L_{CVI}(\theta)` then varies little with :math:`\theta`). The
baseline that makes no such approximation is NUTS over :math:`(\theta, \mathbf v)`
(:class:`gpvi.models.whitened.WhitenedLatentGP`); EP's evidence (:mod:`gpvi.inference.cvi.ep_evidence`) is the
alternative evidence. Where the likelihood saturates the gap grows, for K latent functions as for one.

**Gradient: the envelope theorem.** At converged sites :math:`\tilde\lambda^*(\theta)` the ELBO is stationary in the
sites, so :math:`d\mathcal L_{CVI}/d\theta = \partial\mathcal L(\theta, \tilde\lambda)/\partial\theta` at
:math:`\tilde\lambda = \tilde\lambda^*(\theta)`: the gradient with the sites held fixed, in closed form in
:math:`K` (:func:`gpvi.inference.cvi.inner.theta_objective`). ``log_joint`` returns it through a custom autograd
function, so any engine differentiates the target by ``torch.autograd``; the error of the gradient is first order
in the error of the sites, hence the tight default inner tolerance (``inner_tol = 1e-12``: measured on Pima,
relative gradient error about 1e-7 vs 1e-5 at 1e-9, for 20 instead of 13 inner steps). Second derivatives are
not available (Laplace scales use finite differences of the gradient).

**Warm starts.** Each :math:`\theta` runs full-batch monotone CVI (:func:`gpvi.inference.cvi.inner.converge_sites`)
from the sites of a fixed **anchor** (by default converged at ``model.theta``; :meth:`set_anchor` moves it, e.g.
to the MAP-II point). Every evaluation starting from the same sites makes ``log_joint`` a deterministic function of
:math:`\theta` -- independent of the order and batching of earlier calls, so seeded runs repeat bit for bit --
and for draws of a :math:`q(\theta)` centred near the anchor it costs as few inner steps as starting from the
last draw's sites (about 12-20 O(N^3) steps at N = 200). The cost of one ``log_joint`` row is therefore about
20 factorisations of :math:`K + S` plus one gradient (four O(N^3) operations). The rows of an ``(S, D)`` call run
together for one latent function (:func:`gpvi.inference.cvi.bound_batched.batched_bound`), one after the other
for K.

Names: ``theta`` (kernel log-hyperparameters), ``lam1``, ``lam2`` (sites), ``anchor``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...exceptions import NotPSDError
from ...models.classification import LatentGP
from ...models.priors import prior_log_prob, resolve_prior
from ...numerics.sites import SiteFault
from ...validation import check_bool, check_nonnegative_int, check_positive, check_positive_int, check_theta
from .bound_batched import batched_bound, batched_kernel
from .engine import CVI
from .inner import converge_sites, profiled_objective
from .state import COUNTERS
from .typeii import TypeII

__all__ = ["CVIBoundTarget", "refuse_weights", "envelope_log_joint"]


def refuse_weights(model: Any, what: str) -> None:
    """``ValueError`` for a model with likelihood ``weights``: the profiled bound over theta and EP's evidence built
    on it (the fully Bayesian fit's targets) have no weighted sites."""
    if getattr(model, "weights", None) is not None:
        raise ValueError(f"{what} does not take a model with likelihood weights (sample_weight): its evidence has no "
                         f"weighted sites; use type-II (CVI and TypeII weight the sites)")


class _EnvelopeBound(torch.autograd.Function):
    """``(S, D) -> (S,)`` values of the profiled bound, with the envelope-theorem gradient as the backward."""

    @staticmethod
    def forward(ctx: Any, theta: torch.Tensor, target: CVIBoundTarget) -> torch.Tensor:  # type: ignore[override]
        vals, grads = target.bound_and_grad(theta.detach())
        ctx.save_for_backward(grads)
        return vals

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (grads,) = ctx.saved_tensors
        # a row with value -inf has a zero gradient (never NaN: 0 * inf is avoided by construction)
        return grad_out.unsqueeze(-1) * grads, None


class CVIBoundTarget:
    r"""Target over the kernel log-hyperparameters: the profiled CVI bound plus the log prior (module docstring).

    ``log_joint(theta)`` maps ``(D,) -> ()`` and ``(S, D) -> (S,)``; its autograd gradient is the envelope-theorem
    gradient. A :math:`\theta` where :math:`K + S` cannot be factorised or CVI faults gets ``-inf`` (zero gradient),
    which DSVI redraws.

    Parameters
    ----------
    model : LatentGP
        :class:`gpvi.GPClassification` (a binary or other factorised likelihood) or
        :class:`gpvi.models.multiclass.GPMulticlass`.
    prior : "default", torch.distributions.Distribution or None
        Prior on the log-hyperparameters: ``"default"`` is independent :math:`\mathcal N(0, 10)`
        (:func:`gpvi.models.priors.default_prior`); ``None`` drops the term (then :math:`\tilde g` need not be
        integrable: only for point estimates).
    cvi : CVI, optional
        The engine whose ``beta``, estimator and rule the inner runs and the bound use (default
        ``CVI(progress_bar=False)``; K latent functions: quadrature for K <= 3, 1,024 fixed Sobol' points above).
    anchor : array-like of shape (D,) or LatentPosterior, optional
        Where the shared warm-start sites come from: a posterior's theta and sites (e.g. the result of
        :class:`~gpvi.inference.cvi.typeii.TypeII`; its sites are re-converged to ``inner_tol`` on first use), or a
        theta at which they are computed on first use (default ``model.theta``).
    inner_tol : float
        Relative ELBO change at which an inner CVI run stops (default 1e-12; see the module docstring).
    inner_num_steps : int
        Cap on the steps of one inner run.
    batched : bool
        One latent function: run the rows of a ``(S, D)`` call together (default; batched factorisations, the same
        rules as :func:`~gpvi.inference.cvi.inner.converge_sites` row by row), or one after the other. The two
        agree to the inner tolerance, not bit for bit (the batched path factorises without jitter and hands rows
        that need it to the sequential path). K latent functions: always one after the other.
    inner_quadrature : "auto", Quadrature or None
        The softmax rule of the inner runs and of the bound, as for :class:`~gpvi.inference.cvi.typeii.TypeII`:
        ``"auto"`` (default) the cheaper :func:`~gpvi.inference.cvi.typeii.inner_quadrature` (784 nodes per site
        at K = 3, errors about 1e-6 in the bound; on iris 0.4x the time of the engine's rule per evaluation) unless
        ``cvi`` was given its own rule; ``None``: the engine's rule. Other likelihoods: the engine's rule.
    anderson : int
        Memory of the Anderson acceleration of the sequential inner runs (default 5; 0: plain damped steps): the
        same values to the inner tolerance in fewer inner steps.

    Attributes
    ----------
    names : list of str
        ``model.names``.
    counters : dict
        ``evaluations`` (rows evaluated), ``inner_steps``, ``failures`` (rows that returned ``-inf``),
        ``unconverged`` (inner runs that hit ``inner_num_steps``), and the inner runs' CVI site counters.

    Examples
    --------
    >>> import torch, gpvi
    >>> X = torch.linspace(-1, 1, 12, dtype=torch.float64)[:, None]
    >>> target = CVIBoundTarget(gpvi.GPClassification(X, (X[:, 0] > 0).double()))
    >>> target.log_joint(torch.zeros(3, 2, dtype=torch.float64)).shape
    torch.Size([3])
    >>> from gpvi.models.multiclass import GPMulticlass
    >>> X = torch.linspace(-2, 2, 15, dtype=torch.float64)[:, None]
    >>> target = CVIBoundTarget(GPMulticlass(X, (X[:, 0] > -0.7).long() + (X[:, 0] > 0.7).long()))
    >>> target.log_joint(torch.zeros(2, 2, dtype=torch.float64)).shape
    torch.Size([2])
    """

    def __init__(self, model: Any, prior: Any = "default", *, cvi: Any = None, anchor: Any = None,
                 inner_tol: float = 1e-12, inner_num_steps: int = 500, batched: bool = True,
                 inner_quadrature: Any = "auto", anderson: int = 5) -> None:
        if not isinstance(model, LatentGP):
            raise TypeError(f"model must be a gpvi LatentGP (GPClassification, GPMulticlass); got "
                            f"{type(model).__name__}")
        if cvi is not None and not isinstance(cvi, CVI):
            raise TypeError(f"cvi must be a gpvi.CVI engine; got {type(cvi).__name__}")
        refuse_weights(model, type(self).__name__)
        self.model = model
        base = cvi if cvi is not None else CVI(progress_bar=False)
        # the engine of the inner runs and of the bound: ``base`` with TypeII's choice of the softmax rule
        self.cvi = TypeII(base, inner_quadrature=inner_quadrature)._inner_engine(model)
        self.batched = check_bool(batched, "batched")
        self.anderson = check_nonnegative_int(anderson, "anderson")
        self.prior = resolve_prior(prior, model)
        self.inner_tol = check_positive(inner_tol, "inner_tol")
        self.inner_num_steps = check_positive_int(inner_num_steps, "inner_num_steps")
        self.names = list(model.names)
        # the inner runs add CVI's site counters (sites_shrunk, ..., inner_backtracks) to the same dict
        self.counters: dict[str, float] = {**{k: 0 for k in COUNTERS}, "max_drift": 0.0, "evaluations": 0,
                                           "inner_steps": 0, "failures": 0, "unconverged": 0}
        self._anchor: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        if anchor is not None and hasattr(anchor, "lam1"):
            self._anchor_start: tuple[Any, Any, Any] = (anchor.theta, anchor.lam1, anchor.lam2)
        else:
            self._anchor_start = (model.theta if anchor is None else anchor, None, None)

    # ------------------------------------------------------------------ basics
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
        """Converge the sites at ``theta`` to ``inner_tol`` and make them the warm start of every later evaluation.

        The run starts from the sites ``lam1``, ``lam2`` when given (e.g. a MAP-II posterior's), else from a CVI
        run at ``theta`` from the prior (the engine's own stop rule).
        """
        th = self._check(theta, "theta")
        if lam1 is None or lam2 is None:
            post = self.cvi.run(self.model, th)
            lam1, lam2 = post.lam1, post.lam2
        l1 = torch.as_tensor(lam1, dtype=torch.float64, device=self.device).detach()
        l2 = torch.as_tensor(lam2, dtype=torch.float64, device=self.device).detach()
        shape = tuple(self.model.site_shape)
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

    # ------------------------------------------------------------------ one theta
    def _converge(self, theta: torch.Tensor, lam1: torch.Tensor, lam2: torch.Tensor) -> Any:
        """The monotone inner run at ``inner_tol`` from the given sites, counted."""
        return self._count(converge_sites(self.cvi, self.model, theta, lam1, lam2, self.counters,
                                          tol=self.inner_tol, max_steps=self.inner_num_steps,
                                          anderson=self.anderson))

    def _count(self, inner: Any) -> Any:
        """Add an inner run's steps to the counters (and an unconverged run); returns ``inner``."""
        self.counters["inner_steps"] += inner.t
        if inner.t >= self.inner_num_steps:
            self.counters["unconverged"] += 1
        return inner

    def converged_sites(self, theta: Any) -> Any:
        """The CVI state of the sites converged at ``theta`` from the anchor.

        Raises :class:`~gpvi.exceptions.NotPSDError` or :class:`~gpvi.numerics.sites.SiteFault` where CVI
        cannot run at ``theta``.
        """
        th = self._check(theta, "theta")
        _, lam1, lam2 = self.anchor
        return self._converge(th, lam1, lam2)

    # ------------------------------------------------------------------ the target protocol
    def log_prior(self, theta: torch.Tensor) -> torch.Tensor:
        r""":math:`\log p(\theta)` (0 without a prior), differentiable."""
        if self.prior is None:
            return torch.zeros(theta.shape[:-1], dtype=theta.dtype, device=theta.device)
        return prior_log_prob(self.prior, theta)

    def log_joint(self, theta: torch.Tensor) -> torch.Tensor:
        r""":math:`\mathcal L_{CVI}(\theta) + \log p(\theta)`: ``(D,) -> ()``, ``(S, D) -> (S,)``; differentiable
        once by autograd (envelope-theorem gradient)."""
        return envelope_log_joint(self, theta)

    def latent_posterior(self, theta: Any) -> Any:
        r"""The CVI posterior :math:`q^*(\mathbf f\mid\theta)` at ``theta``, from sites converged from the anchor
        (the engine's posterior class)."""
        inner = self.converged_sites(theta)
        inner.converged = True
        return self.cvi.posterior(self.model, inner, {"anchor_warm_start": True}, warn=False)


    def bound_and_grad(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r""":math:`\mathcal L_{CVI}` (without the prior) and its envelope gradient at the rows of ``theta``.

        ``(S, D) -> ((S,), (S, D))``; a row that cannot be evaluated gets ``-inf`` and a zero gradient. The rows
        of one latent function run together (:func:`~gpvi.inference.cvi.bound_batched.batched_bound`, batched
        factorisations: one Python step serves all S rows); a row the batched path cannot finish (a failed plain
        Cholesky, an invalid site update, a non-finite ELBO), and every row of K latent functions, runs alone by
        :func:`~gpvi.inference.cvi.inner.profiled_objective` (jittered factorisation, site validity rules).
        """
        th = theta.detach().to(torch.float64)
        vals = torch.full(th.shape[:-1], -math.inf, dtype=torch.float64, device=th.device)
        grads = torch.zeros_like(th)
        self.counters["evaluations"] += th.shape[0]
        finite = torch.isfinite(th).all(-1)
        redo = finite.clone()
        if self.batched and self._batchable() and bool(finite.any()):
            idx = finite.nonzero().flatten()
            with torch.enable_grad():
                v, g, ok = batched_bound(self, th[idx])
            vals[idx[ok]], grads[idx[ok]] = v[ok], g[ok]
            redo[idx[ok]] = False
        for i in redo.nonzero().flatten().tolist():
            vals[i], grads[i] = self._one(th[i])
        self.counters["failures"] += int((~torch.isfinite(vals)).sum())
        return vals, grads

    def _batchable(self) -> bool:
        cvi = self.cvi
        return (len(self.model.site_shape) == 1 and cvi.beta_schedule == "constant"
                and getattr(cvi.quadrature, "rule", None) is not None)

    def _one(self, theta: torch.Tensor) -> tuple[float, torch.Tensor]:
        """One row by the sequential path; ``(-inf, 0)`` where it fails."""

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

    def _kernel(self, theta: torch.Tensor) -> torch.Tensor:
        r"""Batched :math:`K_\theta` ``(S, N, N)`` at the rows of ``theta`` (differentiable;
        :func:`~gpvi.inference.cvi.bound_batched.batched_kernel`)."""
        return batched_kernel(self, theta)

    def __repr__(self) -> str:
        return (f"CVIBoundTarget(model={self.model!r}, D={self.dim}, inner_tol={self.inner_tol:g}, "
                f"prior={'none' if self.prior is None else type(self.prior).__name__})")


def envelope_log_joint(target: Any, theta: torch.Tensor) -> torch.Tensor:
    """``target.bound_and_grad`` plus ``target.log_prior`` as a differentiable ``log_joint``: ``(D,) -> ()``,
    ``(S, D) -> (S,)``; rows with non-finite entries get ``-inf`` and never reach the prior's checks."""
    theta = check_theta(theta, target.dim, device=target.device)
    single = theta.dim() == 1
    tb = theta.unsqueeze(0) if single else theta
    finite = torch.isfinite(tb.detach()).all(-1, keepdim=True)
    safe = torch.where(finite, tb, torch.zeros_like(tb))
    out = _EnvelopeBound.apply(tb, target) + target.log_prior(safe)
    return out[0] if single else out
