r"""EP's approximate evidence as a function of the kernel hyperparameters: a target for a Gaussian :math:`q(\theta)`.

The profiled CVI bound of :class:`gpvi.inference.cvi.bound.CVIBoundTarget` is a *lower* bound on
:math:`\log p(\mathbf y\mid\theta)` whose gap grows with the signal variance: where the likelihood saturates, the
posterior of :math:`\mathbf f` is skewed and the best Gaussian misses ever more of its mass. A :math:`q(\theta)`
fitted on that bound is therefore pulled towards small signal variances. Measured on the Ionosphere subsample of
``benchmarks/classification_evidence.py`` (other hyperparameters at the NUTS posterior mean), the gap grows from
0.2 nats at :math:`\log\sigma_f^2 = 1.7` to 4.8 nats at 4.7 (the NUTS posterior mean) and 10.9 at 6.7, so the bound
peaks at :math:`\log\sigma_f^2 \approx 2.7` where the exact posterior puts its mass near 4.7; importance sampling
from the CVI posterior confirms the gap where its Pareto :math:`\hat k` is below 0.7 and is unusable above.

:class:`EPEvidenceTarget` uses instead EP's approximation :math:`\log Z_{EP}(\theta)`
(:func:`gpvi.numerics.ep.expectation_propagation`; Rasmussen & Williams 2006, eq. 3.65), which for GP
classification tracks the exact evidence closely at every signal variance (Kuss & Rasmussen 2005, figures 4-7;
Nickisch & Rasmussen 2008, section 6), and is neither a lower nor an upper bound:

.. math::

    \log \tilde g(\theta) = \log Z_{EP}(\theta) + \log p(\theta) \approx \log p(\mathbf y, \theta).

A Gaussian engine on it (S&K, DSVI) maximises :math:`\mathbb E_{q(\theta)}[\log\tilde g(\theta)] +
\mathcal H[q(\theta)]`, which approximates the ELBO of :math:`q(\theta)` against the exact hyperparameter posterior
:math:`p(\theta\mid\mathbf y)` (exactly that ELBO where :math:`\log Z_{EP} = \log p(\mathbf y\mid\theta)`).

**Gradient.** At EP's fixed point :math:`\partial\log Z_{EP}/\partial K = \tfrac12(\mathbf b\mathbf b^\top - R)`
with the sites held fixed (R&W eq. 5.27), pushed through :math:`K_\theta` by autograd; ``log_joint`` is
differentiable once, as for the CVI bound. Every evaluation starts EP from the sites EP converged to at one
warm-start point (computed once; the prior's zero sites if that run fails): by default the bound's anchor, and in
:class:`~gpvi.inference.cvi.bayes.FullyBayesianCVI` the EP MAP point once its search is done (:meth:`warm_from`),
around which the engine draws. A fixed warm start keeps ``log_joint`` a deterministic function of :math:`\theta`
(seeded runs repeat bit for bit), and draws of :math:`q(\theta)` near it need fewer sweeps than from the prior: on
the ten-class synth10b 5.9 sweeps per evaluation from the EP MAP point against 6.9 from the CVI MAP-II point (the
fit 0.84x as long; held out, synth4 / synth6 / Pima / Ripley 0.3 / 0.15 / -0.04 / 0.07 fewer, q moved by at most 0.013
of its sds; ``benchmarks/results/ep_warm_start_*.md``). For its engine's evaluations
:class:`~gpvi.inference.cvi.bayes.FullyBayesianCVI` then switches to starts predicted from the converged sites of
earlier evaluations (:meth:`EPEvidenceTarget.start_from_neighbours`, :mod:`gpvi.inference.cvi.ep_starts`): fewer
sweeps to the same stopping rule, the evidence a function of theta only within EP's tolerance; the target it
returns is back on the fixed start.

**Tilted moments** (binary): by the CVI bound's quadrature rule with at most :data:`EP_QUADRATURE_POINTS` nodes
(48: its error is below 1e-6 where EP stops at 1e-3).

**The latent posterior** at a :math:`\theta` (for predictions) stays CVI's :math:`q^*(\mathbf f\mid\theta)`,
from the wrapped :class:`~gpvi.inference.cvi.bound.CVIBoundTarget`: EP only weighs the hyperparameters.

**Multi-class** (a wrapped :class:`~gpvi.inference.cvi.bound.CVIBoundTarget` of a multi-class model, softmax, any
K): EP with a full :math:`K\times K` site per data point (:func:`gpvi.numerics.ep_multiclass.multiclass_ep`),
warm-started in the same way; the tilted moments by the bound's nested softmax rule for K <= 3 and by
multi-class EP's shifted quasi-Monte Carlo rule in the K - 1 differences (2,048 points) for K >= 4. The cost per
sweep is :math:`O((N(K-1))^3)` (the posterior in the complement of the common mode).

Names: ``theta`` (kernel log-hyperparameters), ``bound`` (the wrapped CVI-bound target).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import torch

from ...validation import check_nonnegative_int, check_positive, check_positive_int, check_theta
from .bound import CVIBoundTarget, envelope_log_joint
from ...models.multiclass_likelihoods import Softmax
from ...numerics.ep import expectation_propagation
from ...numerics.ep_multiclass import multiclass_ep
from ...numerics.quadrature import Quadrature
from .ep_starts import SiteBank

__all__ = ["EPEvidenceTarget", "multiclass_ep_applies", "EP_QUADRATURE_POINTS", "EP_CHUNK_ELEMENTS", "EP_CHUNK_ROWS",
           "BANK_DAMPING", "BANK_SWEEPS"]

EP_QUADRATURE_POINTS = 48
r"""Nodes of the asinh-mapped Gauss-Legendre rule of binary EP's tilted moments (:meth:`EPEvidenceTarget.quadrature`):
the CVI bound's rule with at most this many points. Against a 1,000-point rule on 5,820 cavities (means -12..12,
variances 1e-3..1e3), 48 points are off by at most 1.2e-8 in :math:`\log\hat Z_n` (logit; probit 5.3e-8), 7.1e-8
tilted sd in the mean and 4.1e-7 relative in the variance (64 points: 3e-13, 1.4e-12, 1.1e-11; 32: 1.4e-4, 5.4e-4,
2.4e-3), four orders below EP's stopping rule in the engine's evaluations (1e-3) and below that of the EP MAP search
(1e-6) (``benchmarks/studies/bayes_profile.py``). 64 before issue 59's third pass: 48 nodes take 20-28% less time
per tilted-moment pass (400-1,600 cavities), and on the
tuning families (xor N = 100 / 400, spirals N = 100, clf8 N = 100) the fits took the same EP sweeps, q(theta) moved
by at most 4e-11 of its sds and the test probabilities by at most 6e-12
(``benchmarks/studies/results/bayes_nodes_h59c.md``)."""


EP_CHUNK_ELEMENTS = 5 * 2 ** 16
EP_CHUNK_ROWS = 16
"""Binary EP runs the rows of one call in chunks of at most :data:`EP_CHUNK_ROWS` rows and
:data:`EP_CHUNK_ELEMENTS` kernel-matrix entries (2.5 MiB per :math:`S\times N\times N` array in float64; at least
one row): 100 rows of the evidence without the gradient (the final bound estimate's work) took 0.55x the time of
one batch at N = 400 (chunks of 2), 0.79x at N = 200 (chunks of 13) and 0.74x at N = 100 (chunks of 16) (tuning
family xor: ``benchmarks/studies/results/ep_chunks.md``)."""


BANK_DAMPING = 1.0
BANK_SWEEPS = 10
"""EP from a :class:`~gpvi.inference.cvi.ep_starts.SiteBank`'s prediction runs undamped for at most this many sweeps,
then, where a row has not converged, with the target's damping (:meth:`EPEvidenceTarget.start_from_neighbours`):
started that close to its fixed point, undamped EP stopped in 2.4 sweeps per evaluation against 2.7 damped (tuning
family xor, N = 400: :mod:`gpvi.inference.cvi.ep_starts`)."""


def multiclass_ep_applies(model: Any) -> bool:
    """Whether multi-class EP's evidence is available for ``model``: the softmax likelihood, any number of classes
    (tilted moments by nested quadrature for K <= 3, by a shifted quasi-Monte Carlo rule for K >= 4,
    :func:`gpvi.numerics.ep_multiclass.multiclass_ep`). Robust-max has none: its tilted moments under a correlated
    cavity are orthant integrals of dimension K - 1."""

    return isinstance(model.likelihood, Softmax)


class EPEvidenceTarget:
    r"""Target over the kernel log-hyperparameters: :math:`\log Z_{EP}(\theta) + \log p(\theta)` (module docstring).

    ``log_joint(theta)`` maps ``(D,) -> ()`` and ``(S, D) -> (S,)``, differentiable once (R&W eq. 5.27 through
    autograd); a row where EP fails gets ``-inf`` and a zero gradient.

    Parameters
    ----------
    bound : CVIBoundTarget
        Gives the model, the prior, the kernel matrices (the same :math:`K_\theta` as the CVI bound's) and the
        latent posterior at a :math:`\theta` (:meth:`latent_posterior`).
    damping : float, optional
        EP's damping (default 0.8 for binary models, 0.5 for multi-class ones).
    tol : float
        EP's stopping rule on the largest relative site change (default 1e-6; see
        :func:`~gpvi.numerics.ep.expectation_propagation`). The gradient formula holds at the fixed point, with an
        error first order in the sites' error, far below the Monte Carlo noise of the engines' gradients: on the
        100- and 140-row Pima subsamples the default run's q(theta) moved by at most 1e-6 from its tol = 1e-8 run,
        with 19-22% fewer EP sweeps (``benchmarks/results/classification_bayes_speed.md``).
    max_sweeps : int
        Cap on EP's sweeps per evaluation (default 200; rows that reach it are counted in ``unconverged``).
    anderson : int
        Memory of the Anderson acceleration of EP's damped site map (default 5; 0: plain damped sweeps): the same
        fixed point and stop rule in fewer sweeps.

    Attributes
    ----------
    value_tol : float or None
        EP's stopping rule where only the evidence is wanted (``log_joint`` without a gradient):
        ``max(tol, value_tol)``; None (default): ``tol``. :class:`~gpvi.inference.cvi.bayes.FullyBayesianCVI` sets
        it for its engine's phase of a binary model (:data:`~gpvi.inference.cvi.bayes.EP_VALUE_TOL`).
    counters : dict
        ``evaluations`` (rows), ``sweeps`` (EP sweeps over all rows), ``failures`` (rows that returned ``-inf``),
        ``unconverged`` (rows that hit ``max_sweeps``); multi-class also ``anderson_restarts`` (failed Anderson
        extrapolations, :func:`~gpvi.numerics.ep_multiclass.multiclass_ep`).

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.inference.cvi.bound import CVIBoundTarget
    >>> X = torch.linspace(-1, 1, 12, dtype=torch.float64)[:, None]
    >>> target = EPEvidenceTarget(CVIBoundTarget(gpvi.GPClassification(X, (X[:, 0] > 0).double())))
    >>> theta = torch.zeros(3, 2, dtype=torch.float64)
    >>> bool((target.log_joint(theta) >= target.bound.log_joint(theta)).all())   # here above the CVI bound
    True
    """

    def __init__(self, bound: CVIBoundTarget, *, damping: float | None = None, tol: float = 1e-6,
                 max_sweeps: int = 200, anderson: int = 5) -> None:
        if not isinstance(bound, CVIBoundTarget):
            raise TypeError(f"bound must be a gpvi CVIBoundTarget; got "
                            f"{type(bound).__name__}")
        self.bound = bound
        self.multiclass = bool(getattr(bound.model.likelihood, "multiclass", False))
        if self.multiclass and not multiclass_ep_applies(bound.model):
            raise ValueError(f"multi-class EP evidence needs the softmax likelihood; got "
                             f"{type(bound.model.likelihood).__name__} (robust-max's tilted moments under a correlated "
                             f"cavity are {bound.model.num_classes - 1}-dimensional orthant integrals); use the CVI "
                             f"bound (evidence='cvi')")
        self.damping = check_positive(damping if damping is not None else (0.5 if self.multiclass else 0.8),
                                      "damping")
        if self.damping > 1.0:
            raise ValueError(f"damping must be in (0, 1]; got {damping!r}")
        self.tol = check_positive(tol, "tol")
        self.max_sweeps = check_positive_int(max_sweeps, "max_sweeps")
        self.anderson = check_nonnegative_int(anderson, "anderson")
        self.names = list(bound.names)
        self.warm_theta: torch.Tensor | None = None
        self.bank: SiteBank | None = None
        self.value_tol: float | None = None
        self.counters: dict[str, float] = {"evaluations": 0, "sweeps": 0, "failures": 0, "unconverged": 0}
        if self.multiclass:
            self.counters["anderson_restarts"] = 0

    @property
    def model(self) -> Any:
        return self.bound.model

    @property
    def dim(self) -> int:
        """D, the number of kernel log-hyperparameters."""
        return self.bound.dim

    @property
    def device(self) -> torch.device:
        return self.bound.device

    def initial_theta(self) -> torch.Tensor:
        """The wrapped bound's anchor theta (an engine's default start)."""
        return self.bound.initial_theta()

    def evidence(self, theta: torch.Tensor) -> Any:
        r"""EP at the rows of ``theta`` ``(S, D)``: the :class:`~gpvi.numerics.ep.EPResult` (no prior term)."""
        with torch.no_grad():
            return self._run(self.bound._kernel(theta.detach().to(torch.float64)))

    def _run(self, K: torch.Tensor, gradient: bool = True, theta: torch.Tensor | None = None) -> Any:
        """EP on the batched kernel matrices ``K`` ``(S, N, N)``, counted; binary rows in chunks of at most
        :data:`EP_CHUNK_ELEMENTS` matrix entries (``gradient=False``: the evidence alone, ``grad_k`` None), started
        from :meth:`warm_sites`, or with a :attr:`bank` and the rows' ``theta`` from sites predicted by it."""

        if self.multiclass:
            res = self._run_multiclass(K, theta, None if gradient else self._value_tol())
        else:
            warm = self.warm_sites()
            tau, nu = warm or (None, None)
            bank = self.bank if warm is not None and theta is not None else None
            if bank is not None and len(bank):
                res = self._ep_from_bank(K, theta, gradient)
            else:
                res = self._ep_binary_chunked(K, tau, nu, gradient)
            if bank is not None:
                bank.add(theta, res.tau, res.nu, res.ok & res.converged)
        self.counters["evaluations"] += K.shape[0]
        self.counters["sweeps"] += int(res.sweeps.sum())
        self.counters["unconverged"] += int((res.ok & ~res.converged).sum())
        self.counters["failures"] += int((~res.ok).sum())
        return res

    def _value_tol(self) -> float:
        """EP's stopping rule where only the evidence is wanted: ``max(tol, value_tol)``."""
        return self.tol if self.value_tol is None else max(self.tol, self.value_tol)

    def _ep_multiclass(self, K: torch.Tensor, sites: tuple[torch.Tensor, torch.Tensor] | None,
                       tol: float | None = None) -> Any:

        pi, nu = sites if sites is not None else (None, None)
        # the bound's nested rule where its CVI integrates by quadrature (max_quadrature_classes), else EP's QMC rule
        quad = self.bound.cvi.quadrature if self.bound.cvi.elbo_method == "quadrature" else "qmc"
        return multiclass_ep(K, self.model.y, self.model.num_classes, quadrature=quad,
                             damping=self.damping, tol=self.tol if tol is None else tol, max_sweeps=self.max_sweeps,
                             pi=pi, nu=nu,
                             anderson=self.anderson)

    def _ep_binary(self, K: torch.Tensor, tau: torch.Tensor | None, nu: torch.Tensor | None,
                   gradient: bool = True, damping: float | None = None, max_sweeps: int | None = None) -> Any:

        return expectation_propagation(K, self.model.y, self.model.likelihood, quadrature=self.quadrature,
                                       damping=self.damping if damping is None else damping,
                                       tol=self.tol if gradient else self._value_tol(),
                                       max_sweeps=self.max_sweeps if max_sweeps is None else max_sweeps, tau=tau,
                                       nu=nu, anderson=self.anderson, gradient=gradient)

    def _ep_from_bank(self, K: torch.Tensor, theta: torch.Tensor, gradient: bool) -> Any:
        """EP from the :attr:`bank`'s predicted sites: undamped (:data:`BANK_DAMPING`) for at most
        :data:`BANK_SWEEPS` sweeps; rows that have not converged by then go on from where they stopped (a failed
        row from its predicted start) with the target's damping, up to ``max_sweeps`` sweeps in all."""
        tau, nu = self.bank.starts(theta)
        self.counters["bank_starts"] = self.counters.get("bank_starts", 0) + K.shape[0]
        res = self._ep_binary_chunked(K, tau, nu, gradient, BANK_DAMPING, min(BANK_SWEEPS, self.max_sweeps))
        redo = (~res.converged).nonzero().flatten()
        if redo.numel() == 0 or self.max_sweeps <= BANK_SWEEPS:
            return res
        self.counters["bank_redone"] = self.counters.get("bank_redone", 0) + redo.numel()
        ok = res.ok[redo].unsqueeze(-1)
        sub = self._ep_binary_chunked(K[redo], torch.where(ok, res.tau[redo], tau[redo]),
                                      torch.where(ok, res.nu[redo], nu[redo]), gradient, None,
                                      self.max_sweeps - BANK_SWEEPS)
        fields = []
        for name, full, part in zip(res._fields, res, sub):
            if full is None:
                fields.append(None)
                continue
            full = full.clone()
            full[redo] = part + res.sweeps[redo] if name == "sweeps" else part
            fields.append(full)
        return type(res)(*fields)

    def _ep_binary_chunked(self, K: torch.Tensor, tau: torch.Tensor | None, nu: torch.Tensor | None,
                           gradient: bool, damping: float | None = None, max_sweeps: int | None = None) -> Any:
        """:meth:`_ep_binary` on chunks of rows (each row's EP is independent of the others: the same values), the
        results concatenated."""
        S, N = K.shape[0], K.shape[-1]
        step = min(EP_CHUNK_ROWS, max(1, EP_CHUNK_ELEMENTS // (N * N)))
        if S <= step:
            return self._ep_binary(K, tau, nu, gradient, damping, max_sweeps)

        def rows(x: torch.Tensor | None, i: int) -> torch.Tensor | None:
            return x[i:i + step] if x is not None and x.dim() == 2 else x

        parts = [self._ep_binary(K[i:i + step], rows(tau, i), rows(nu, i), gradient, damping, max_sweeps)
                 for i in range(0, S, step)]
        return type(parts[0])(*[None if f[0] is None else torch.cat(f) for f in zip(*parts)])

    @property
    def quadrature(self) -> Quadrature:
        """The rule of binary EP's tilted moments: the bound's CVI rule, an asinh-mapped Gauss-Legendre rule cut to
        :data:`EP_QUADRATURE_POINTS` nodes (other rules as they are)."""
        q = self.bound.cvi.quadrature or Quadrature()
        if getattr(q, "rule", None) != "gl-asinh" or q.num_points <= EP_QUADRATURE_POINTS:
            return q
        if getattr(self, "_quad_for", None) is not q:
            self._quad, self._quad_for = Quadrature(EP_QUADRATURE_POINTS, q.rule, scale=q.scale, width=q.width), q
        return self._quad

    def warm_from(self, theta: torch.Tensor | None) -> None:
        """Start every later evaluation from EP's sites at ``theta`` (``None``: at the bound's anchor, the default);
        :class:`~gpvi.inference.cvi.bayes.FullyBayesianCVI` moves the start to the EP MAP point, where its engine
        starts, before the engine runs."""
        if theta is None:
            self.warm_theta = None
            return
        th = torch.as_tensor(theta, dtype=torch.float64).detach().clone()
        if th.shape != (self.dim,) or not bool(torch.isfinite(th).all()):
            raise ValueError(f"theta must be a finite vector of the {self.dim} log-hyperparameters; got shape "
                             f"{tuple(th.shape)}")
        self.warm_theta = th

    def start_from_neighbours(self, size: int = 128) -> None:
        """Start each later evaluation from sites predicted by the converged sites of the last ``size``
        evaluations (multi-class: the nearest evaluation's sites; :class:`~gpvi.inference.cvi.ep_starts.SiteBank`;
        :meth:`warm_sites` until the first one is stored); ``size=0``: back to :meth:`warm_sites` for every
        evaluation. The evidence then depends on the earlier evaluations within EP's tolerance
        (:mod:`~gpvi.inference.cvi.ep_starts`)."""
        if int(size) <= 0:
            self.bank = None
        else:                                     # multi-class: the nearest entry's sites (a plane of site
            self.bank = SiteBank(size, neighbours=2 ** 62 if self.multiclass else None)   # precisions need not be PSD)

    def warm_sites(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """EP's sites at the warm-start theta (:meth:`warm_from`; by default the bound's anchor theta), run once
        from the prior's sites, then the start of every evaluation: the same start for every theta keeps the evidence
        a deterministic function of theta, and draws of q(theta) near the start need fewer sweeps than from the
        prior; None when that run failed or did not converge (then every evaluation starts from the prior)."""
        theta = self.warm_theta if self.warm_theta is not None else self.bound.anchor[0]
        theta = theta.to(self.bound.anchor[0].device)
        key = theta.detach().cpu().numpy().tobytes()
        if getattr(self, "_warm_key", None) != key:
            with torch.no_grad():
                K = self.bound._kernel(theta.detach().unsqueeze(0))
                if self.multiclass:
                    res = self._ep_multiclass(K[0], None)
                    self._warm = (res.pi, res.nu) if res.ok and res.converged else None
                else:
                    res = self._ep_binary(K, None, None)
                    ok = bool(res.ok[0]) and bool(res.converged[0])
                    self._warm = (res.tau[0], res.nu[0]) if ok else None
            self._warm_key = key
        return self._warm

    def _run_multiclass(self, K: torch.Tensor, theta: torch.Tensor | None = None, tol: float | None = None) -> Any:
        """:func:`~gpvi.numerics.ep_multiclass.multiclass_ep` row by row from :meth:`warm_sites` (with a
        :attr:`bank` and the rows' ``theta``: from the nearest earlier evaluation's sites); the fields the binary
        :class:`~gpvi.numerics.ep.EPResult` has for the evidence and its gradient, plus ``rows``."""

        warm = self.warm_sites()
        S = K.shape[0]
        starts = [warm] * S
        bank = self.bank if warm is not None and theta is not None else None
        if bank is not None and len(bank):
            P, V = bank.starts(theta)
            starts = [(P[i].view_as(warm[0]), V[i].view_as(warm[1])) for i in range(S)]
            self.counters["bank_starts"] = self.counters.get("bank_starts", 0) + S
        rows = [self._ep_multiclass(K[i], starts[i], tol) for i in range(S)]
        self.counters["anderson_restarts"] += sum(r.anderson_restarts for r in rows)
        dev = K.device
        if bank is not None:
            keep = torch.tensor([bool(r.ok and r.converged) for r in rows], device=dev)
            bank.add(theta, torch.stack([r.pi.reshape(-1) for r in rows]),
                     torch.stack([r.nu.reshape(-1) for r in rows]), keep)
        return SimpleNamespace(log_z=torch.stack([r.log_z for r in rows]), grad_k=torch.stack([r.grad_k for r in rows]),
                               sweeps=torch.tensor([r.sweeps for r in rows], device=dev),
                               converged=torch.tensor([r.converged for r in rows], device=dev),
                               ok=torch.tensor([r.ok for r in rows], device=dev), rows=rows)

    def bound_and_grad(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r""":math:`\log Z_{EP}` (without the prior) and its gradient at the rows of ``theta``: ``(S, D) -> ((S,),
        (S, D))``; a row that fails (or holds a non-finite theta) gets ``-inf`` and a zero gradient. (The name is
        the protocol of the autograd function shared with :class:`~gpvi.inference.cvi.bound.CVIBoundTarget`; EP's
        evidence is not a bound.)"""
        th = theta.detach().to(torch.float64)
        vals = torch.full(th.shape[:-1], -math.inf, dtype=torch.float64, device=th.device)
        grads = torch.zeros_like(th)
        idx = torch.isfinite(th).all(-1).nonzero().flatten()
        if idx.numel() == 0:
            return vals, grads
        with torch.enable_grad():                  # one kernel evaluation: EP on its values, the gradient through it
            tg = th[idx].clone().requires_grad_(True)
            K = self.bound._kernel(tg)
            res = self._run(K.detach(), theta=th[idx])
            (g,) = torch.autograd.grad(K, tg, grad_outputs=res.grad_k)
        ok = res.ok & torch.isfinite(g).all(-1)
        vals[idx[ok]], grads[idx[ok]] = res.log_z[ok], g[ok]
        return vals, grads

    def log_prior(self, theta: torch.Tensor) -> torch.Tensor:
        r""":math:`\log p(\theta)` (the wrapped bound's prior), differentiable."""
        return self.bound.log_prior(theta)

    def log_joint(self, theta: torch.Tensor) -> torch.Tensor:
        r""":math:`\log Z_{EP}(\theta) + \log p(\theta)`: ``(D,) -> ()``, ``(S, D) -> (S,)``; differentiable once.

        Where nothing can differentiate the result (autograd off, or a ``theta`` that does not require grad: the
        final bound estimate's draws), binary EP runs without its gradient (:meth:`log_joint_value`): the same
        values without :math:`\partial\log Z_{EP}/\partial K` and the kernel's backward pass."""
        if torch.is_grad_enabled() and isinstance(theta, torch.Tensor) and theta.requires_grad:
            return envelope_log_joint(self, theta)
        return self.log_joint_value(theta)

    def log_joint_value(self, theta: torch.Tensor) -> torch.Tensor:
        r""":math:`\log Z_{EP}(\theta) + \log p(\theta)` without a gradient (``-inf`` where EP fails or a row is not
        finite), the values of :meth:`log_joint`."""
        th = check_theta(theta, self.dim, device=self.device).detach().to(torch.float64)
        single = th.dim() == 1
        tb = th.unsqueeze(0) if single else th
        finite = torch.isfinite(tb).all(-1)
        vals = torch.full(tb.shape[:-1], -math.inf, dtype=torch.float64, device=tb.device)
        idx = finite.nonzero().flatten()
        with torch.no_grad():
            if idx.numel():
                vals[idx] = self._run(self.bound._kernel(tb[idx]), gradient=False, theta=tb[idx]).log_z
            out = vals + self.log_prior(torch.where(finite.unsqueeze(-1), tb, torch.zeros_like(tb)))
        return out[0] if single else out

    def latent_posterior(self, theta: Any) -> Any:
        r"""CVI's :math:`q^*(\mathbf f\mid\theta)` (:meth:`CVIBoundTarget.latent_posterior`)."""
        return self.bound.latent_posterior(theta)

    def __repr__(self) -> str:
        return f"EPEvidenceTarget({self.bound!r}, damping={self.damping:g}, tol={self.tol:g})"
