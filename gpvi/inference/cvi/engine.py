r"""Conjugate-computation variational inference (CVI) for latent GP models (Khan & Lin 2017, sections 3–4).

The variational posterior is a Gaussian :math:`q(\mathbf f) = \mathcal N(\mathbf m, V)` written through
:math:`2N` **site parameters** (Khan & Lin 2017, the display after eq. 13):

.. math::

    q(\mathbf f) \propto \Big[\prod_n \exp\big(\tilde\lambda^{(1)}_n f_n + \tilde\lambda^{(2)}_n f_n^2\big)\Big]
    \,\mathcal N(\mathbf f \mid 0, K), \qquad \tilde\lambda^{(2)}_n < 0.

:math:`V` is never stored. Each site is a Gaussian pseudo-observation: pseudo-target
:math:`\tilde y_n = -\tilde\lambda^{(1)}_n / (2\tilde\lambda^{(2)}_n)` with pseudo-noise variance
:math:`s_n = -1/(2\tilde\lambda^{(2)}_n)`, so **step 4 of Algorithm 1 is GP regression**:

.. math::

    \mathbf m = K (K + S)^{-1}\tilde{\mathbf y},\qquad
    V_{nn} = K_{nn} - \| L^{-1} \mathbf k_n \|^2,\qquad L L^\top = K + S,\; S = \operatorname{diag}(s).

**Step 3** (eq. 13): for each site, the gradients :math:`\hat g^{(1)}_n, \hat g^{(2)}_n` of
:math:`\mathbb E_q[\log p(y_n\mid f_n)]` with respect to the mean parameters :math:`(m_n, V_{nn} + m_n^2)` of the
marginal (:func:`gpvi.expectations.mean_parameter_gradients`), then
:math:`\tilde\lambda_n \leftarrow (1 - \beta_t)\tilde\lambda_n + \beta_t \hat g_n`.

Modes
-----
``mode="full"`` (Algorithm 1): every site every step, one factorisation of :math:`K + S` per step, O(N^3).

``mode="stochastic"`` ("doubly stochastic CVI", eq. 14 and the paragraph after it): each step takes the next
``batch_size`` sites of a random permutation of the sites (a fresh permutation every sweep), computes only their
marginals from the cached factor :math:`L` of :math:`K + S` (one triangular solve with the columns
:math:`\mathbf k_n` and :math:`\tilde{\mathbf y}`, O(N^2)), updates only those sites, and keeps :math:`L` current:
changing site :math:`n` changes one diagonal entry of :math:`K + S`, a rank-one update
:math:`\alpha\, e_n e_n^\top` with :math:`\alpha = s_n^{new} - s_n^{old}`. Only the trailing block
:math:`L_{n:,n:}` changes (the leading rows and the block below them do not), so the update is
:func:`gpvi.linalg.cholesky_update` applied to that block: O((N - n)^2), on average a third of a full-size
update. Every ``refactor_every`` steps (default: one sweep, ``ceil(N / batch_size)`` steps; GPML's sequential EP
also refactorises after every sweep) the factor is recomputed from scratch, the largest entry of
:math:`|L_{updated} - L_{fresh}|` is recorded as the **drift** (``info["max_drift"]``, ``trace["drift"]``), and
the ELBO is evaluated for monitoring and convergence. The run starts with one full-batch step from the prior
(unvisited sites would have infinite pseudo-noise), counted as one sweep.

Step-size rule for single-site steps and why it reaches the full-batch fixed point
---------------------------------------------------------------------------------
A single-site step applies the update of eq. 13 to the selected sites only and leaves the other sites
unchanged: :math:`\tilde\lambda_n \leftarrow (1-\beta_t)\tilde\lambda_n + \beta_t\hat g_n` for :math:`n` in the
batch. (Read literally, eq. 14 also multiplies every unselected site by :math:`1 - \beta_t`; that moves all
:math:`N` sites, costs a refactorisation per step, and without rescaling :math:`\hat g` by :math:`N` has a
different fixed point, so gpvi does not do it.) ``beta_t`` is the constant ``beta`` or, with
``beta_schedule="robbins_monro"``, :math:`\beta (1 + t)^{-0.6}` with :math:`t` the number of completed sweeps
(needed for convergence with Monte Carlo gradients; with exact quadrature gradients a constant step converges).
A full-batch step maps :math:`\tilde\lambda \mapsto (1-\beta)\tilde\lambda + \beta g(\tilde\lambda)`, whose fixed
points are exactly :math:`\tilde\lambda = g(\tilde\lambda)` for any :math:`\beta > 0`. A single-site step leaves
site :math:`n` unchanged iff :math:`\tilde\lambda_n = g_n(\tilde\lambda)`, so the points left unchanged by every
single-site step are the same set. Since :math:`\nabla_\mu \mathcal L = g(\tilde\lambda) - \tilde\lambda` for this
model, these are the stationary points of the ELBO; for log-concave likelihoods (logit, probit) the ELBO has a
unique maximiser, so both modes converge to the same sites and ELBO (checked to 1e-4 in ``tests/test_cvi.py``).

Site validity
-------------
:math:`\tilde\lambda^{(2)}_n` must stay negative. Logit and probit with quadrature or the ``"hessian"`` Monte Carlo
estimator always give :math:`\hat g^{(2)} < 0`, so every convex combination is valid. When an estimate would make
a site invalid (``"reparam"`` Monte Carlo, other likelihoods), ``invalid="shrink"`` shrinks that site's step to
half the distance to the boundary (:math:`\beta' = \tfrac12\,\tilde\lambda^{(2)}/(\tilde\lambda^{(2)} - \hat g^{(2)})`,
so the precision at most halves; counted in ``info["sites_shrunk"]``), ``invalid="reject"`` skips that site's
update (``info["sites_rejected"]``). A site's precision :math:`-2\tilde\lambda^{(2)}_n` is floored at
:math:`10^{-10}/\overline{K_{nn}}` (pseudo-noise at most :math:`10^{10}` times the mean prior variance; such a site
changes :math:`q` by less than 1e-10 relative, and the floor keeps :math:`s_n` finite when
:math:`\mathbb E[h'']` underflows, e.g. for a diverging :math:`\beta = 1` run); floored updates are counted in
``info["sites_floored"]``. Non-finite estimates are skipped (``info["sites_nonfinite"]``) with a
:class:`~gpvi.exceptions.NumericalWarning`; a factorisation or ELBO failure rolls back to the last good state
and halves the step; after ``max_faults`` consecutive faults a :class:`~gpvi.exceptions.NumericalFaultError`
carrying the last good state is raised.

Full-batch factorisation: :math:`K + S` rather than :math:`B = I + W^{1/2} K W^{1/2}`
-------------------------------------------------------------------------------------------
Both have condition number at most :math:`1 + \lambda_{max}(K)\max_n W_n` with :math:`W_n = 1/s_n`: for logit
:math:`-h'' \le 1/4` so :math:`s_n \ge 4`, for probit :math:`s_n \ge 1`, and every convex combination of valid
estimates keeps that bound. :math:`K + S` needs no :math:`W^{1/2}` scaling, is exactly GP regression's matrix (the
conjugacy check reuses the regression formulas), and is the very factor the stochastic mode maintains, so both
modes share one code path and are compared like with like.

ELBO (eq. 5)
------------
With the marginals, :math:`\boldsymbol\alpha = (K+S)^{-1}\tilde{\mathbf y}` and the factor,

.. math::

    \mathcal L = \sum_n \mathbb E_q[\log p(y_n \mid f_n)]
      - \tfrac12\Big[\mathbf m^\top\boldsymbol\alpha - \sum_n \frac{V_{nn}}{s_n} + \log|K+S| - \sum_n\log s_n\Big]

(:func:`site_elbo`; the bracket is :math:`2\,\mathrm{KL}(q\,\|\,p)` since :math:`K^{-1}V = (K+S)^{-1}S`). Given
the factor and the marginals this costs O(N) plus the quadrature; the marginals themselves cost O(N^3)
(:math:`L^{-1}K`), so full-batch mode evaluates the ELBO every step (the marginals are needed anyway) and
stochastic mode once per refactorisation (O(N^3) once per sweep by default, the same order as the sweep's N
single-site steps).

Hyperparameters
---------------
``learn_hyperparameters=True`` maximises the ELBO over the kernel's log-hyperparameters :math:`\theta` (type-II on
the bound). Once the sites have converged, a hyperparameter phase runs L-BFGS-B on the **profiled bound**
:math:`F(\theta) = \max_q \mathcal L(\theta, q)`: each evaluation warm-starts full-batch CVI (quadrature
gradients, step ``beta``) from the current sites at the trial :math:`\theta` and runs it to convergence
(relative ELBO change below ``inner_tol``), then returns the ELBO and its gradient with the converged sites held
fixed. For fixed sites,
:math:`\mathbf m = \tilde{\mathbf y} - S P\tilde{\mathbf y}` and :math:`\operatorname{diag}V = s - s^2\operatorname{diag}P`
with :math:`P = (K+S)^{-1}`, which gives the gradient in closed form,

.. math::

    \frac{\partial\mathcal L}{\partial K} = \operatorname{sym}\Big(P\,(a\odot s)\,\boldsymbol\alpha^\top
      + P\operatorname{diag}(b\odot s^2)P + \tfrac12\boldsymbol\alpha\boldsymbol\alpha^\top - \tfrac12 P\Big),

with :math:`\boldsymbol\alpha = P\tilde{\mathbf y}`, :math:`a_n = \partial_m E_n - \tilde\lambda^{(1)}_n - 2\tilde\lambda^{(2)}_n m_n`,
:math:`b_n = \partial_v E_n - \tilde\lambda^{(2)}_n`; it is pushed through :math:`K(\theta)` by autograd. The
factorisation is the exact Cholesky of :func:`gpvi.linalg.cholesky_with_jitter`. At a CVI fixed point
:math:`a = b = 0`, so this is :math:`dF/d\theta` (envelope theorem). Each evaluation costs a few O(N^3) CVI steps
(warm start) plus about four O(N^3) operations for the gradient; the stochastic mode uses the same full-batch
inner loop, because the gradient in :math:`\theta` costs O(N^3) anyway. (Alternating a few L-BFGS steps with
the sites held fixed and CVI sweeps, variational-EM style, crept towards the optimum with thousands of
evaluations on nearly separable data sets.) The run has converged when the sites have converged and a
hyperparameter phase improves the ELBO by less than ``tol * max(1, |ELBO|)``.

Names: ``lam1``, ``lam2`` (:math:`\tilde\lambda^{(1)}, \tilde\lambda^{(2)}`), ``beta`` (:math:`\beta_t`),
``ytilde`` (:math:`\tilde{\mathbf y}`), ``s`` (pseudo-noise), ``m``, ``var`` (:math:`\operatorname{diag}V`),
``theta`` (kernel log-hyperparameters).
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...models.classification import LatentGP
from ...exceptions import NotPSDError, NumericalFaultError, NumericalWarning
from ...models.likelihoods import (
    Quadrature,
    expected_log_lik,
    gaussian_expectation,
    mean_parameter_gradients,
)
from ...linalg import cholesky_site_update_, cholesky_update, cholesky_with_jitter, logdet_from_cholesky
from ..progress import Progress, warn_interrupted
from ...rng import resolve_generator
from ...evaluation.table import Table
from ...validation import (
    as_float_tensor,
    check_bool,
    check_choice,
    check_fraction,
    check_positive,
    check_positive_int,
)

__all__ = ["CVI", "CVIState", "LatentPosterior", "BernoulliPredictive", "site_elbo", "cholesky_site_update_"]

_LOG_2PI = math.log(2.0 * math.pi)
_COUNTERS = ("sites_shrunk", "sites_rejected", "sites_nonfinite", "sites_floored", "faults", "refactorisations",
             "factor_faults", "jitter_events", "theta_phases")
_MIN_SITE_PRECISION = 1e-10
"""Floor on a site's precision -2 lam2, relative to 1 / mean(diag K) (see the module docstring)."""


# =========================================================================== linear algebra of the sites
def _pseudo(lam1: torch.Tensor, lam2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pseudo-targets ``ytilde = -lam1 / (2 lam2)`` and pseudo-noise variances ``s = -1 / (2 lam2)``."""
    s = -0.5 / lam2
    return s * lam1, s


def _factor(K: torch.Tensor, s: torch.Tensor, theta: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
    """Lower Cholesky factor of ``K + diag(s)`` through the shared jitter policy; returns (L, jitter)."""
    A = K.clone()
    A.diagonal().add_(s)
    res = cholesky_with_jitter(A, theta=theta, what="K + diag(pseudo-noise)")
    return res.L, float(res.jitter)


def _marginals(K: torch.Tensor, L: torch.Tensor, ytilde: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All marginals from the factor: ``m = K alpha``, ``var = diag K - colsum((L^{-1} K)^2)``, and ``alpha``. O(N^3)."""
    alpha = torch.cholesky_solve(ytilde.unsqueeze(-1), L).squeeze(-1)
    m = K @ alpha
    W = torch.linalg.solve_triangular(L, K, upper=False)
    var = K.diagonal() - (W * W).sum(0)
    return m, var, alpha


def site_elbo(value_sum: torch.Tensor, lam1: torch.Tensor, lam2: torch.Tensor, m: torch.Tensor,
              var: torch.Tensor, L: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    r"""The ELBO (Khan & Lin 2017, eq. 5) of the site-parametrised :math:`q` given its marginals and factor.

    With :math:`V = S(K+S)^{-1}K`, :math:`K^{-1}V = (K+S)^{-1}S` and :math:`\mathbf m = K\boldsymbol\alpha`, the
    Gaussian KL divergence needs only the marginals, :math:`\boldsymbol\alpha = (K+S)^{-1}\tilde{\mathbf y}` and
    the factor :math:`L L^\top = K + S`:

    .. math::

        \mathcal L = \sum_n \mathbb E_q[\log p(y_n \mid f_n)] - \tfrac12\Big[\mathbf m^\top\boldsymbol\alpha
          - \sum_n \frac{V_{nn}}{s_n} + \log|K + S| - \sum_n \log s_n\Big]

    (:math:`\operatorname{tr}(K^{-1}V) = N - \sum_n V_{nn}/s_n`, :math:`\log|K| - \log|V| = \log|K+S| - \sum_n\log s_n`).
    This form has no :math:`\tilde y_n^2/s_n` terms, which cancel catastrophically for weak sites (large
    :math:`s_n`). O(N) given its inputs.

    Parameters
    ----------
    value_sum : torch.Tensor of shape ()
        :math:`\sum_n \mathbb E_q[\log p(y_n\mid f_n)]`.
    lam1, lam2, m, var : torch.Tensor of shape (N,)
    L : torch.Tensor of shape (N, N)
        Cholesky factor of :math:`K + S`.
    alpha : torch.Tensor of shape (N,)
        :math:`(K + S)^{-1}\tilde{\mathbf y}`.

    Returns
    -------
    torch.Tensor of shape ()

    Examples
    --------
    >>> import torch
    >>> K = torch.eye(2, dtype=torch.float64); lam1 = torch.zeros(2, dtype=torch.float64)
    >>> lam2 = torch.full((2,), -0.5, dtype=torch.float64)       # s = 1: q = N(0, 0.5 I)
    >>> L = torch.linalg.cholesky(2 * K); z = torch.zeros(2, dtype=torch.float64)
    >>> kl = -site_elbo(torch.tensor(0.0, dtype=torch.float64), lam1, lam2, z, torch.full((2,), 0.5,
    ...                 dtype=torch.float64), L, z)
    >>> round(float(kl), 6) == round(2 * 0.5 * (0.5 - 1 - math.log(0.5)), 6)   # KL(N(0, .5) || N(0, 1)) per site
    True
    """
    s = -0.5 / lam2
    kl2 = (m * alpha).sum() - (var / s).sum() + logdet_from_cholesky(L) - torch.log(s).sum()
    return value_sum - 0.5 * kl2


# =========================================================================== state
@dataclass
class CVIState:
    r"""Evolving state of a CVI run (the engine never modifies a state it was given; steps return new ones).

    Attributes
    ----------
    lam1, lam2 : torch.Tensor of shape (N,)
        Site parameters :math:`\tilde\lambda^{(1)}, \tilde\lambda^{(2)}` (``lam2 < 0`` once initialised).
    theta : torch.Tensor of shape (D,)
        Kernel log-hyperparameters.
    step : int
        Steps taken (a full-batch step or a single-site batch each count as one).
    sites_updated : int
        Site updates so far (``sites_updated / N`` = sweeps).
    initialised : bool
        ``False``: the sites are still 0 and :math:`q` is the prior.
    factor : torch.Tensor of shape (N, N) or None
        The cached (rank-one-updated) Cholesky factor of :math:`K + S` (stochastic mode).
    since_refactor : int
        Single-site steps since the factor was last computed from scratch.
    order : torch.Tensor of shape (N,) or None
        The current sweep's random permutation of the sites; ``order_pos`` the next position in it.
    rng_state : torch.Tensor or None
        ``torch.Generator.get_state()`` after the last step that drew random numbers.
    elbo : float
        ELBO at the last check (nan before the first).
    checks_since_theta : int
        Checks since the last hyperparameter phase.
    beta_scale : float
        Fault back-off: the step size is multiplied by this (1 normally; halved after each fault).
    converged : bool
    counters : dict of str to float
        ``sites_shrunk``, ``sites_rejected``, ``sites_nonfinite``, ``faults``, ``refactorisations``,
        ``factor_faults``, ``jitter_events``, ``theta_phases``, ``max_drift``.
    trace : dict of str to list
        Per-check records: ``step``, ``sweep``, ``elbo``, ``residual`` (:math:`\max_n|\hat g_n - \tilde\lambda_n|`,
        full mode), ``drift`` (stochastic mode), ``time_s``.

    Examples
    --------
    >>> import torch
    >>> st = CVIState(torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64),
    ...               torch.zeros(2, dtype=torch.float64))
    >>> CVIState.from_state_dict(st.state_dict()).step
    0
    """

    lam1: torch.Tensor
    lam2: torch.Tensor
    theta: torch.Tensor
    step: int = 0
    sites_updated: int = 0
    initialised: bool = False
    factor: torch.Tensor | None = None
    since_refactor: int = 0
    order: torch.Tensor | None = None
    order_pos: int = 0
    rng_state: torch.Tensor | None = None
    elbo: float = math.nan
    checks_since_theta: int = 0
    beta_scale: float = 1.0
    converged: bool = False
    counters: dict[str, float] = field(default_factory=lambda: {**{k: 0 for k in _COUNTERS}, "max_drift": 0.0})
    trace: dict[str, list] = field(default_factory=lambda: {k: [] for k in
                                                            ("step", "sweep", "elbo", "residual", "drift", "time_s")})

    @property
    def num_sites(self) -> int:
        return self.lam1.shape[0]

    @property
    def sweeps(self) -> float:
        """Site updates divided by N."""
        return self.sites_updated / max(self.num_sites, 1)

    def copy(self) -> CVIState:
        """A deep copy (tensors cloned, trace lists copied)."""
        d = self.state_dict()
        return CVIState.from_state_dict(d)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume bit for bit (tensors cloned; the factor included when present)."""
        def c(t):
            return None if t is None else t.detach().clone()
        return {"lam1": c(self.lam1), "lam2": c(self.lam2), "theta": c(self.theta), "step": self.step,
                "sites_updated": self.sites_updated, "initialised": self.initialised, "factor": c(self.factor),
                "since_refactor": self.since_refactor, "order": c(self.order), "order_pos": self.order_pos,
                "rng_state": c(self.rng_state), "elbo": self.elbo, "checks_since_theta": self.checks_since_theta,
                "beta_scale": self.beta_scale, "converged": self.converged, "counters": dict(self.counters),
                "trace": {k: list(v) for k, v in self.trace.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> CVIState:
        """Overwrite this state from :meth:`state_dict` output (in place); returns ``self``."""
        new = CVIState.from_state_dict(state)
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(new, f.name))
        return self

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> CVIState:
        """Build a state from :meth:`state_dict` output (e.g. after ``torch.save``/``torch.load``)."""
        missing = {"lam1", "lam2", "theta"} - set(state)
        if missing:
            raise ValueError(f"state is missing {sorted(missing)}")
        lam1 = as_float_tensor(state["lam1"], "state['lam1']", ndim=1)
        lam2 = as_float_tensor(state["lam2"], "state['lam2']", ndim=1)
        if lam1.shape != lam2.shape:
            raise ValueError(f"state['lam1'] and state['lam2'] differ in shape: {tuple(lam1.shape)} vs "
                             f"{tuple(lam2.shape)}")
        theta = as_float_tensor(state["theta"], "state['theta']", ndim=1, allow_empty=True)

        def opt(key, dtype=None):
            v = state.get(key)
            if v is None:
                return None
            v = torch.as_tensor(v)
            return v.clone() if dtype is None else v.to(dtype).clone()
        counters = {**{k: 0 for k in _COUNTERS}, "max_drift": 0.0, **dict(state.get("counters", {}))}
        trace = {k: [] for k in ("step", "sweep", "elbo", "residual", "drift", "time_s")}
        trace.update({k: list(v) for k, v in dict(state.get("trace", {})).items()})
        return cls(lam1.clone(), lam2.clone(), theta.clone(), int(state.get("step", 0)),
                   int(state.get("sites_updated", 0)), bool(state.get("initialised", False)),
                   opt("factor", torch.float64), int(state.get("since_refactor", 0)), opt("order", torch.long),
                   int(state.get("order_pos", 0)), opt("rng_state", torch.uint8), float(state.get("elbo", math.nan)),
                   int(state.get("checks_since_theta", 0)), float(state.get("beta_scale", 1.0)),
                   bool(state.get("converged", False)), counters, trace)


# =========================================================================== results
class BernoulliPredictive:
    r"""Predictive distribution of binary labels: :math:`p_i = p(y_i = 1 \mid \mathcal D)` per test point.

    ``mean`` is the probability vector; ``log_prob(y)`` gives :math:`\log p(y_i \mid \mathcal D)` for labels in
    {0, 1} or {-1, +1}, so :func:`gpvi.metrics.nlpd` works on it.

    Examples
    --------
    >>> import torch
    >>> pred = BernoulliPredictive(torch.tensor([0.9, 0.2], dtype=torch.float64))
    >>> [round(v, 4) for v in pred.log_prob([1, 0]).tolist()]
    [-0.1054, -0.2231]
    """

    def __init__(self, probs: torch.Tensor) -> None:
        self.probs = probs

    @property
    def mean(self) -> torch.Tensor:
        return self.probs

    def log_prob(self, y: Any) -> torch.Tensor:
        from ...validation import check_binary_labels

        yt = as_float_tensor(y, "y", ndim=1)
        if yt.shape[0] != self.probs.shape[0]:
            raise ValueError(f"y has {yt.shape[0]} labels but the prediction has {self.probs.shape[0]}")
        values = set(torch.unique(yt).tolist())
        if values <= {0.0, 1.0}:
            y01 = yt
        elif values <= {-1.0, 1.0}:
            y01 = (yt == 1.0).to(torch.float64)
        else:
            y01, _ = check_binary_labels(yt, "y")
        p = self.probs.to(y01)
        return torch.where(y01 == 1.0, torch.log(p), torch.log1p(-p))


class LatentPosterior:
    r"""The CVI posterior :math:`q(\mathbf f) = \mathcal N(\mathbf m, V)` of a latent GP, in site form.

    Attributes
    ----------
    lam1, lam2 : torch.Tensor of shape (N,)
        Sites :math:`\tilde\lambda^{(1)}, \tilde\lambda^{(2)}`.
    m, var : torch.Tensor of shape (N,)
        Marginal means and variances :math:`m_n`, :math:`V_{nn}` at the training inputs.
    theta : torch.Tensor of shape (D,)
        Kernel log-hyperparameters the posterior was computed at; ``names`` their names.
    link : str
        The likelihood used (``"logit"``, ``"probit"``, ``"gaussian"``).
    elbo : float
        ELBO (eq. 5) of the returned :math:`q`, by quadrature.
    converged : bool
    trace : dict of str to list
        Per-check records (see :class:`CVIState`).
    info : dict
        Settings and counters of the run (``mode``, ``beta``, ``estimator``, ``steps``, ``sweeps``,
        ``sites_shrunk``, ``sites_rejected``, ``max_drift``, ``time_s``...).
    engine_state : CVIState
        The final state, to resume with ``CVI(...).run(model, state=post.engine_state)``.
    model : LatentGP

    Examples
    --------
    >>> import gpvi
    >>> from gpvi.models.classification import GPClassification
    >>> from gpvi.inference.cvi.engine import CVI
    >>> ds = gpvi.datasets.load_pima()
    >>> post = CVI(mode="full", progress_bar=False).run(GPClassification(ds.X_train, ds.y_train))
    >>> post.predict_proba(ds.X_test[:3]).shape
    torch.Size([3])
    """

    def __init__(self, model: LatentGP, lam1: torch.Tensor, lam2: torch.Tensor, theta: torch.Tensor,
                 m: torch.Tensor, var: torch.Tensor, *, L: torch.Tensor, alpha: torch.Tensor, elbo: float,
                 converged: bool = False, trace: dict[str, list] | None = None, info: dict[str, Any] | None = None,
                 engine_state: CVIState | None = None, quadrature: Quadrature | None = None) -> None:
        self.model = model
        self.lam1, self.lam2 = lam1.detach().clone(), lam2.detach().clone()
        self.theta = theta.detach().clone()
        self.m, self.var = m.detach().clone(), var.detach().clone()
        self._L, self._alpha = L, alpha
        self.elbo = float(elbo)
        self.converged = bool(converged)
        self.trace = trace or {}
        self.info = dict(info or {})
        self.engine_state = engine_state
        self.quadrature = quadrature if quadrature is not None else Quadrature()

    # ------------------------------------------------------------------ sites
    @property
    def names(self) -> list[str]:
        return list(self.model.names)

    @property
    def link(self) -> str:
        return self.model.link

    @property
    def sites(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lam1, lam2)``."""
        return self.lam1, self.lam2

    @property
    def pseudo_targets(self) -> torch.Tensor:
        r""":math:`\tilde y_n = -\tilde\lambda^{(1)}_n / (2\tilde\lambda^{(2)}_n)`."""
        return _pseudo(self.lam1, self.lam2)[0]

    @property
    def pseudo_noise(self) -> torch.Tensor:
        r""":math:`s_n = -1/(2\tilde\lambda^{(2)}_n)`."""
        return _pseudo(self.lam1, self.lam2)[1]

    # ------------------------------------------------------------------ prediction
    @torch.no_grad()
    def predict_latent(self, X_new: Any) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Mean and variance of :math:`q(f_*)` at new inputs (GP regression on the pseudo-data).

        .. math::

            m_* = K_{*X}(K + S)^{-1}\tilde{\mathbf y},\qquad v_* = k_{**} - \|L^{-1} K_{X*}\|^2

        Parameters
        ----------
        X_new : array-like of shape (n, n_features)

        Returns
        -------
        mean, var : torch.Tensor of shape (n,)
        """
        Ksx = self.model.cross_covariance(self.theta, X_new)
        kss = self.model.prior_variance(self.theta, X_new)
        mean = Ksx @ self._alpha
        W = torch.linalg.solve_triangular(self._L, Ksx.T, upper=False)
        var = (kss - (W * W).sum(0)).clamp_min(0.0)
        return mean, var

    @torch.no_grad()
    def predict_proba(self, X_new: Any) -> torch.Tensor:
        r""":math:`p(y_* = 1 \mid \mathcal D) = \mathbb E_{q(f_*)}[p(y_* = 1 \mid f_*)]`, shape ``(n,)``.

        Probit: :math:`\Phi(m_*/\sqrt{1 + v_*})` (closed form). Logit: quadrature of :math:`\sigma(f_*)`.
        "1" is the model's positive class (``model.classes[1]``).
        """
        lik = self.model.likelihood
        if not getattr(lik, "binary", False):
            raise TypeError(f"predict_proba needs a binary likelihood; this posterior's is {lik.name!r}")
        mean, var = self.predict_latent(X_new)
        if lik.name == "probit":
            return torch.special.ndtr(mean / torch.sqrt(1.0 + var))
        return gaussian_expectation(lik.response, mean, var, self.quadrature).clamp(0.0, 1.0)

    def predict(self, X_new: Any) -> BernoulliPredictive:
        """The predictive of the labels at ``X_new`` (:class:`BernoulliPredictive`; works with ``gpvi.metrics``)."""
        return BernoulliPredictive(self.predict_proba(X_new))

    # ------------------------------------------------------------------ reporting
    def summary(self) -> Table:
        """One-row-per-quantity table: link, N, ELBO, convergence, sweeps, counters, and the hyperparameters."""
        rows = ["link", "N", "elbo", "converged", "steps", "sweeps", "sites_shrunk", "sites_rejected",
                "max_drift"]
        vals: list[Any] = [self.link, self.model.num_data, self.elbo, self.converged, self.info.get("steps"),
                           self.info.get("sweeps"), self.info.get("sites_shrunk"), self.info.get("sites_rejected"),
                           self.info.get("max_drift")]
        nat = self.model.natural(self.theta)
        for n, v in zip(self.model.natural_names, nat.tolist()):
            rows.append(n)
            vals.append(v)
        return Table(rows, {"value": vals}, title="LatentPosterior (CVI)")

    def __repr__(self) -> str:
        return (f"LatentPosterior(link={self.link!r}, N={self.model.num_data}, elbo={self.elbo:.6g}, "
                f"converged={self.converged}, mode={self.info.get('mode')!r})")

    def state_dict(self) -> dict[str, Any]:
        """Sites, marginals, theta, ELBO, info and the engine state (rebuild with :meth:`from_state_dict`)."""
        out = {"kind": "latent", "link": self.link, "lam1": self.lam1, "lam2": self.lam2, "theta": self.theta,
               "m": self.m, "var": self.var, "elbo": self.elbo, "converged": self.converged, "info": self.info,
               "trace": self.trace}
        if self.engine_state is not None:
            out["engine_state"] = self.engine_state.state_dict()
        return out

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], model: LatentGP) -> LatentPosterior:
        """Rebuild (recomputing the factor of :math:`K + S`) for the same ``model``."""
        if state.get("link") != model.link:
            raise ValueError(f"state was made with likelihood {state.get('link')!r} but model uses {model.link!r}")
        theta = torch.as_tensor(state["theta"], dtype=torch.float64)
        lam1 = torch.as_tensor(state["lam1"], dtype=torch.float64)
        lam2 = torch.as_tensor(state["lam2"], dtype=torch.float64)
        K = model.kernel_matrix(theta)
        ytilde, s = _pseudo(lam1, lam2)
        L, _ = _factor(K, s, theta)
        alpha = torch.cholesky_solve(ytilde.unsqueeze(-1), L).squeeze(-1)
        es = state.get("engine_state")
        return cls(model, lam1, lam2, theta, torch.as_tensor(state["m"]), torch.as_tensor(state["var"]), L=L,
                   alpha=alpha, elbo=state.get("elbo", math.nan), converged=state.get("converged", False),
                   trace=state.get("trace"), info=state.get("info"),
                   engine_state=CVIState.from_state_dict(es) if es is not None else None)


# =========================================================================== the engine
class CVI:
    r"""Conjugate-computation variational inference for latent GP models (Khan & Lin 2017, Algorithm 1, eq. 13–14).

    Parameters
    ----------
    mode : {"full", "stochastic"}
        Full-batch steps (every site, one O(N^3) factorisation per step) or doubly stochastic single-site steps
        (``batch_size`` sites per step on a cached, rank-one-updated factor, O(N^2) per step).
    beta : float
        Step size :math:`\beta \in (0, 1]` of eq. 13 (default 0.5).
    estimator : {"quadrature", "mc"}
        Gradients of :math:`\mathbb E_q[\log p(y_n \mid f_n)]` by deterministic quadrature or by reparameterised
        Monte Carlo (the paper's default). The ELBO is always evaluated by quadrature.
    num_quadrature : int
        Nodes of the quadrature rule (default 96).
    quadrature : {"gl-asinh", "gauss-hermite"}
        The rule (see :class:`gpvi.expectations.Quadrature`; Gauss–Hermite is inaccurate for large variances).
    num_mc : int
        Draws per site for ``estimator="mc"``.
    mc_variance_grad : {"hessian", "reparam"}
        Monte Carlo estimator of :math:`\partial_v E` (see :func:`gpvi.expectations.expected_log_lik`).
    batch_size : int
        Sites per stochastic step.
    refactor_every : int, optional
        Stochastic steps between refactorisations from scratch (each also measures the drift and evaluates the
        ELBO). Default: one sweep, ``ceil(N / batch_size)``.
    max_sweeps : int
        Budget in sweeps (full mode: steps; stochastic: ``max_sweeps * ceil(N / batch_size)`` steps, the initial
        full step included as one sweep).
    num_steps : int, optional
        Exact step budget instead of ``max_sweeps`` (the run still stops early on convergence unless ``tol=0``).
    tol : float
        Convergence: relative ELBO change between checks below ``tol`` (``|dL| <= tol * max(1, |L|)``).
        ``0`` disables the check.
    beta_schedule : {"constant", "robbins_monro"} or callable
        :math:`\beta_t = \beta`, :math:`\beta (1 + t)^{-0.6}` with :math:`t` the completed sweeps, or
        ``callable(t) -> beta_t``.
    invalid : {"shrink", "reject"}
        What to do with a site update that would make :math:`\tilde\lambda^{(2)} \ge 0`.
    max_faults : int
        Consecutive numerical faults (failed factorisation, non-finite ELBO or estimates) tolerated before
        :class:`~gpvi.exceptions.NumericalFaultError`.
    learn_hyperparameters : bool
        Maximise the ELBO over the kernel log-hyperparameters (type-II on the bound, L-BFGS-B on the profiled
        bound once the sites have converged).
    hyper_steps : int
        L-BFGS-B iterations per hyperparameter phase.
    inner_tol : float
        Convergence tolerance (relative ELBO change) of the inner CVI runs of a hyperparameter phase.
    theta_bounds : tuple of float
        Box on every log-hyperparameter during learning (default (-11.5, 11.5), i.e. 1e-5..1e5 on the
        natural scale of variances and squared lengthscales).
    factor_update : {"blocked", "generic"}
        How a single-site step updates the cached factor: :func:`cholesky_site_update_` (in place, blocked,
        default) or :func:`gpvi.linalg.cholesky_update` on the trailing block (allocates N x N temporaries;
        kept for comparison, see ``benchmarks/results/cvi_step_cost.md``).
    seed : int, optional
        Seed of the run's generator (site order, Monte Carlo draws) when ``run`` gets no ``generator``.
    progress_bar : bool

    Examples
    --------
    >>> import gpvi
    >>> from gpvi.models.classification import GPClassification
    >>> from gpvi.inference.cvi.engine import CVI
    >>> ds = gpvi.datasets.load_pima()
    >>> model = GPClassification(ds.X_train, ds.y_train, likelihood="probit")
    >>> post = CVI(mode="stochastic", max_sweeps=30, progress_bar=False).run(model)
    >>> post.link, post.info["mode"]
    ('probit', 'stochastic')
    """

    def __init__(self, mode: str = "full", beta: float = 0.5, estimator: str = "quadrature", *,
                 num_quadrature: int = 96, quadrature: str = "gl-asinh", num_mc: int = 10,
                 mc_variance_grad: str = "hessian", batch_size: int = 1, refactor_every: int | None = None,
                 max_sweeps: int = 500, num_steps: int | None = None, tol: float = 1e-9,
                 beta_schedule: str | Callable[[int], float] = "constant", invalid: str = "shrink",
                 max_faults: int = 10, learn_hyperparameters: bool = False, hyper_steps: int = 100,
                 inner_tol: float = 1e-9, theta_bounds: tuple[float, float] = (-11.5, 11.5),
                 factor_update: str = "blocked", seed: int | None = 0, progress_bar: bool = True) -> None:
        self.mode = check_choice(mode, "mode", ["full", "stochastic"])
        self.beta = check_fraction(beta, "beta")
        self.estimator = check_choice(estimator, "estimator", ["quadrature", "mc"])
        self.quadrature = Quadrature(num_quadrature, quadrature)
        self.num_mc = check_positive_int(num_mc, "num_mc")
        self.mc_variance_grad = check_choice(mc_variance_grad, "mc_variance_grad", ["hessian", "reparam"])
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.refactor_every = None if refactor_every is None else check_positive_int(refactor_every, "refactor_every")
        self.max_sweeps = check_positive_int(max_sweeps, "max_sweeps")
        self.num_steps = None if num_steps is None else check_positive_int(num_steps, "num_steps")
        self.tol = check_positive(tol, "tol", allow_zero=True)
        if callable(beta_schedule):
            self.beta_schedule: str | Callable[[int], float] = beta_schedule
        else:
            self.beta_schedule = check_choice(beta_schedule, "beta_schedule", ["constant", "robbins_monro"])
        self.invalid = check_choice(invalid, "invalid", ["shrink", "reject"])
        self.max_faults = check_positive_int(max_faults, "max_faults")
        self.learn_hyperparameters = check_bool(learn_hyperparameters, "learn_hyperparameters")
        self.hyper_steps = check_positive_int(hyper_steps, "hyper_steps")
        self.inner_tol = check_positive(inner_tol, "inner_tol")
        if (not isinstance(theta_bounds, (tuple, list)) or len(theta_bounds) != 2
                or not float(theta_bounds[0]) < float(theta_bounds[1])):
            raise ValueError(f"theta_bounds must be (low, high) with low < high; got {theta_bounds!r}")
        self.theta_bounds = (float(theta_bounds[0]), float(theta_bounds[1]))
        self.factor_update = check_choice(factor_update, "factor_update", ["blocked", "generic"])
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise ValueError(f"seed must be a non-negative int or None; got {seed!r}")
        self.seed = seed
        self.progress_bar = check_bool(progress_bar, "progress_bar")

    # ------------------------------------------------------------------ helpers
    def __repr__(self) -> str:
        return (f"CVI(mode={self.mode!r}, beta={self.beta:g}, estimator={self.estimator!r}, "
                f"batch_size={self.batch_size}, learn_hyperparameters={self.learn_hyperparameters})")

    def _steps_per_sweep(self, n: int) -> int:
        return 1 if self.mode == "full" else -(-n // self.batch_size)

    def _refactor_every(self, n: int) -> int:
        return self.refactor_every if self.refactor_every is not None else -(-n // self.batch_size)

    def _total_steps(self, n: int) -> int:
        if self.num_steps is not None:
            return self.num_steps
        if self.mode == "full":
            return self.max_sweeps
        return 1 + (self.max_sweeps - 1) * self._steps_per_sweep(n)

    def _beta_t(self, state: CVIState) -> float:
        t = int(state.sites_updated // max(state.num_sites, 1))
        if callable(self.beta_schedule):
            b = float(self.beta_schedule(t))
            if not 0.0 < b <= 1.0:
                raise ValueError(f"beta_schedule({t}) must be in (0, 1]; got {b:g}")
        elif self.beta_schedule == "robbins_monro":
            b = self.beta * (1.0 + t) ** -0.6
        else:
            b = self.beta
        return b * state.beta_scale

    def _check_model(self, model: Any) -> LatentGP:
        if not isinstance(model, LatentGP):
            raise TypeError(f"model must be a gpvi GPClassification / LatentGP; got {type(model).__name__}")
        return model

    def _expectations(self, model: LatentGP, idx: torch.Tensor | None, m: torch.Tensor, v: torch.Tensor,
                      gen: torch.Generator | None, method: str | None = None):
        y = model.y if idx is None else model.y[idx]
        return expected_log_lik(model.likelihood, y, m, v, method=method or self.estimator, quadrature=self.quadrature,
                                num_mc=self.num_mc, mc_variance_grad=self.mc_variance_grad, generator=gen)

    def _elbo_value(self, model: LatentGP, m: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Sum of per-site expected log-likelihoods by quadrature (for the ELBO, whatever the estimator)."""
        return expected_log_lik(model.likelihood, model.y, m, v, quadrature=self.quadrature).value.sum()

    @staticmethod
    def _lam2_cap(K: torch.Tensor) -> float:
        """Largest allowed lam2: site precision -2 lam2 >= 1e-10 / mean(diag K), i.e. s <= 1e10 mean(diag K)."""
        return -0.5 * _MIN_SITE_PRECISION / max(float(K.diagonal().mean()), 1e-300)

    def _site_update(self, lam1: torch.Tensor, lam2: torch.Tensor, g1: torch.Tensor, g2: torch.Tensor,
                     beta: float, counters: dict[str, float], lam2_cap: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 13 on the given sites with the validity rule; returns new (lam1, lam2) for those sites."""
        finite = torch.isfinite(g1) & torch.isfinite(g2)
        b = torch.full_like(lam1, beta)
        new2 = (1.0 - b) * lam2 + b * g2
        bad = finite & ~(new2 < 0)
        if bool(bad.any()):
            if self.invalid == "shrink":
                # half-way to the boundary lam2 = 0 along the segment from lam2 to g2
                crossing = lam2 / (lam2 - g2)
                b = torch.where(bad, 0.5 * torch.minimum(crossing, b), b)
                counters["sites_shrunk"] += int(bad.sum())
            else:
                b = torch.where(bad, torch.zeros_like(b), b)
                counters["sites_rejected"] += int(bad.sum())
        if not bool(finite.all()):
            nbad = int((~finite).sum())
            counters["sites_nonfinite"] += nbad
            warnings.warn(f"CVI: {nbad} site gradient estimate(s) were not finite; those sites were not updated",
                          NumericalWarning, stacklevel=4)
            b = torch.where(finite, b, torch.zeros_like(b))
            g1 = torch.where(finite, g1, torch.zeros_like(g1))
            g2 = torch.where(finite, g2, torch.zeros_like(g2))
        new1, new2 = (1.0 - b) * lam1 + b * g1, (1.0 - b) * lam2 + b * g2
        weak = new2 > lam2_cap
        if bool(weak.any()):
            counters["sites_floored"] += int(weak.sum())
            new2 = torch.where(weak, torch.full_like(new2, lam2_cap), new2)
        return new1, new2

    # ------------------------------------------------------------------ public pieces
    def init(self, model: LatentGP, theta: Any = None, *, lam1: Any = None, lam2: Any = None) -> CVIState:
        r"""The starting state: sites at 0 (:math:`q` = prior, Algorithm 1 line 1) unless given.

        Parameters
        ----------
        model : LatentGP
        theta : array-like of shape (D,), optional
            Kernel log-hyperparameters (default ``model.theta``).
        lam1, lam2 : array-like of shape (N,), optional
            Initial sites (``lam2 < 0`` everywhere), e.g. from a previous fit.

        Returns
        -------
        CVIState
        """
        model = self._check_model(model)
        th = model.check_theta(theta).detach().clone()
        n = model.num_data
        if (lam1 is None) != (lam2 is None):
            raise ValueError("give both lam1 and lam2, or neither")
        if lam1 is None:
            z = torch.zeros(n, dtype=torch.float64, device=model.device)
            return CVIState(z, z.clone(), th)
        l1 = as_float_tensor(lam1, "lam1", ndim=1, device=model.device)
        l2 = as_float_tensor(lam2, "lam2", ndim=1, device=model.device)
        if l1.shape[0] != n or l2.shape[0] != n:
            raise ValueError(f"lam1 and lam2 must have length N = {n}; got {l1.shape[0]} and {l2.shape[0]}")
        if not bool((l2 < 0).all()):
            raise ValueError(f"lam2 must be < 0 for every site; {int((l2 >= 0).sum())} are not")
        return CVIState(l1.clone(), l2.clone(), th, initialised=True)

    def step(self, model: LatentGP, state: CVIState, *, generator: torch.Generator | None = None
             ) -> tuple[CVIState, dict[str, Any]]:
        """One step (full-batch, or one stochastic batch) from ``state``; ``state`` itself is not modified.

        Returns
        -------
        (CVIState, dict)
            The new state and an info record (``elbo`` when this step evaluated it, ``beta``, ``sites``).
        """
        model = self._check_model(model)
        gen = resolve_generator(self.seed, generator)
        if generator is None and state.rng_state is not None:
            gen.set_state(state.rng_state)
        st = state.copy()
        K = model.kernel_matrix(st.theta)
        return self._step(model, st, K, gen, t0=time.perf_counter())

    def elbo(self, model: LatentGP, state: CVIState) -> float:
        """ELBO (eq. 5) of the state's :math:`q` by quadrature (O(N^3): one factorisation and the marginals)."""
        model = self._check_model(model)
        K = model.kernel_matrix(state.theta)
        if not state.initialised:
            return float(self._elbo_value(model, torch.zeros_like(state.lam1), K.diagonal().clone()))
        ytilde, s = _pseudo(state.lam1, state.lam2)
        L, _ = _factor(K, s, state.theta)
        m, v, alpha = _marginals(K, L, ytilde)
        return float(site_elbo(self._elbo_value(model, m, v), state.lam1, state.lam2, m, v, L, alpha))

    # ------------------------------------------------------------------ steps
    def _full_step(self, model: LatentGP, st: CVIState, K: torch.Tensor, gen: torch.Generator | None, t0: float,
                   method: str | None = None) -> tuple[CVIState, dict[str, Any]]:
        """Evaluate the current q (marginals, ELBO), then update every site (eq. 13). Mutates ``st``."""
        n = st.num_sites
        if not st.initialised:
            m = torch.zeros(n, dtype=K.dtype, device=K.device)
            v = K.diagonal().clone()
            elbo = self._elbo_value(model, m, v)            # KL(prior || prior) = 0
        else:
            ytilde, s = _pseudo(st.lam1, st.lam2)
            L, jit = _factor(K, s, st.theta)
            if jit > 0:
                st.counters["jitter_events"] += 1
            m, v, alpha = _marginals(K, L, ytilde)
            elbo = site_elbo(self._elbo_value(model, m, v), st.lam1, st.lam2, m, v, L, alpha)
        elbo_f = float(elbo)
        if not math.isfinite(elbo_f):
            raise _Fault(f"ELBO is not finite ({elbo_f}) at step {st.step}")
        ex = self._expectations(model, None, m, v, gen, method)
        g1, g2 = mean_parameter_gradients(ex.dm, ex.dv, m)
        residual = float(torch.maximum((g1 - st.lam1).abs(), (g2 - st.lam2).abs())
                         .nan_to_num(nan=math.inf).max())
        beta = self._beta_t(st)
        info = {"elbo": elbo_f, "residual": residual, "beta": beta, "sites": n, "checked": True,
                "elbo_step": st.step, "rng_used": self.estimator == "mc"}
        st.lam1, st.lam2 = self._site_update(st.lam1, st.lam2, g1, g2, beta, st.counters, self._lam2_cap(K))
        st.initialised = True
        st.step += 1
        st.sites_updated += n
        st.factor = None
        return st, info

    def _next_batch(self, st: CVIState, gen: torch.Generator) -> tuple[torch.Tensor, bool]:
        n = st.num_sites
        used = False
        if st.order is None or st.order_pos >= n:
            st.order = torch.randperm(n, generator=gen).to(st.lam1.device)
            st.order_pos = 0
            used = True
        idx = st.order[st.order_pos:st.order_pos + self.batch_size]
        st.order_pos += idx.shape[0]
        return idx, used

    def _refactor(self, model: LatentGP, st: CVIState, K: torch.Tensor, *, measure: bool) -> float:
        """Recompute the factor from scratch; return the drift max |L_updated - L_fresh| (nan if not measured)."""
        _, s = _pseudo(st.lam1, st.lam2)
        L, jit = _factor(K, s, st.theta)
        if jit > 0:
            st.counters["jitter_events"] += 1
        drift = math.nan
        if measure and st.factor is not None:
            drift = float((st.factor - L).abs().max())
            st.counters["max_drift"] = max(float(st.counters["max_drift"]), drift)
        st.factor = L.mT.contiguous().mT          # lower factor viewed from contiguous upper storage U
        st.since_refactor = 0
        st.counters["refactorisations"] += 1
        return drift

    def _stochastic_step(self, model: LatentGP, st: CVIState, K: torch.Tensor, gen: torch.Generator, t0: float
                         ) -> tuple[CVIState, dict[str, Any]]:
        """One doubly stochastic step on ``batch_size`` sites with the cached factor. Mutates ``st``."""
        if not st.initialised:
            st, info = self._full_step(model, st, K, gen, t0)
            self._refactor(model, st, K, measure=False)
            return st, info
        if st.factor is None:
            self._refactor(model, st, K, measure=False)
        if not st.factor.mT.is_contiguous():
            st.factor = st.factor.mT.contiguous().mT
        L = st.factor
        U = L.mT
        N = L.shape[0]
        idx, used = self._next_batch(st, gen)
        B = idx.shape[0]
        ytilde, s_old = _pseudo(st.lam1, st.lam2)
        # marginals of the selected sites from the cached factor: one triangular solve, O(N^2 (B + 2)); the
        # extra column L^{-1} e_n is the vector p the factor update needs (first site of the batch)
        e = torch.zeros(N, 1, dtype=L.dtype, device=L.device)
        e[idx[0], 0] = 1.0
        rhs = torch.cat([K[:, idx], ytilde.unsqueeze(-1), e], dim=1)
        R = torch.linalg.solve_triangular(L, rhs, upper=False)
        Vb, w = R[:, :B], R[:, B]
        m_b = Vb.T @ w
        v_b = K.diagonal()[idx] - (Vb * Vb).sum(0)
        ex = self._expectations(model, idx, m_b, v_b, gen)
        g1, g2 = mean_parameter_gradients(ex.dm, ex.dv, m_b)
        beta = self._beta_t(st)
        new1, new2 = self._site_update(st.lam1[idx], st.lam2[idx], g1, g2, beta, st.counters, self._lam2_cap(K))
        lam1, lam2 = st.lam1.clone(), st.lam2.clone()
        lam1[idx], lam2[idx] = new1, new2
        st.lam1, st.lam2 = lam1, lam2
        # keep the factor of K + diag(s) current: one diagonal entry per site, only the trailing block moves
        delta = (-0.5 / new2) - s_old[idx]
        try:
            for i, (j, dlt) in enumerate(zip(idx.tolist(), delta.tolist())):
                if dlt == 0.0:
                    continue
                if self.factor_update == "blocked":
                    cholesky_site_update_(U, j, dlt, p=R[j:, B + 1] if i == 0 else None)
                else:
                    unit = torch.zeros(N - j, dtype=L.dtype, device=L.device)
                    unit[0] = 1.0
                    L[j:, j:] = cholesky_update(L[j:, j:], unit, dlt)
            st.since_refactor += 1
        except NotPSDError:
            st.counters["factor_faults"] += 1
            warnings.warn("CVI: a rank-one downdate of the cached factor failed; refactorising from scratch",
                          NumericalWarning, stacklevel=3)
            self._refactor(model, st, K, measure=False)
        st.step += 1
        st.sites_updated += B
        info: dict[str, Any] = {"beta": beta, "sites": B, "checked": False, "rng_used": used or self.estimator == "mc"}
        if st.since_refactor >= self._refactor_every(st.num_sites):
            drift = self._refactor(model, st, K, measure=True)
            ytilde, _ = _pseudo(st.lam1, st.lam2)
            m, v, alpha = _marginals(K, st.factor, ytilde)
            elbo = float(site_elbo(self._elbo_value(model, m, v), st.lam1, st.lam2, m, v, st.factor, alpha))
            if not math.isfinite(elbo):
                raise _Fault(f"ELBO is not finite ({elbo}) at step {st.step}")
            info.update({"elbo": elbo, "drift": drift, "checked": True, "elbo_step": st.step})
        return st, info

    def _step(self, model: LatentGP, st: CVIState, K: torch.Tensor, gen: torch.Generator, t0: float
              ) -> tuple[CVIState, dict[str, Any]]:
        if self.mode == "full":
            st, info = self._full_step(model, st, K, gen, t0)
        else:
            st, info = self._stochastic_step(model, st, K, gen, t0)
        if info.get("rng_used"):
            st.rng_state = gen.get_state()
        return st, info

    # ------------------------------------------------------------------ hyperparameters
    def _theta_objective(self, model: LatentGP, st: CVIState, theta: torch.Tensor
                         ) -> tuple[float, torch.Tensor | None]:
        """ELBO(theta) with the sites fixed and its gradient (closed form in K, autograd through K(theta))."""
        th = theta.detach().clone().requires_grad_(True)
        K = model.kernel_matrix(th)
        Kd = K.detach()
        ytilde, s = _pseudo(st.lam1, st.lam2)
        try:
            L, _ = _factor(Kd, s, th.detach())
        except NotPSDError:
            return -math.inf, None
        m, v, alpha = _marginals(Kd, L, ytilde)
        ex = expected_log_lik(model.likelihood, model.y, m, v, quadrature=self.quadrature)
        val = site_elbo(ex.value.sum(), st.lam1, st.lam2, m, v, L, alpha)
        if not bool(torch.isfinite(val)):
            return -math.inf, None
        P = torch.cholesky_inverse(L)
        a = ex.dm - st.lam1 - 2.0 * st.lam2 * m
        b = ex.dv - st.lam2
        G = (P @ (a * s)).unsqueeze(-1) * alpha.unsqueeze(0)
        G = G + (P * (b * s * s)) @ P + 0.5 * alpha.unsqueeze(-1) * alpha.unsqueeze(0) - 0.5 * P
        G = 0.5 * (G + G.T)
        (grad,) = torch.autograd.grad(K, th, grad_outputs=G)
        return float(val), grad.detach()

    def _inner_cvi(self, model: LatentGP, st: CVIState, theta: torch.Tensor, lam1: torch.Tensor,
                   lam2: torch.Tensor) -> CVIState:
        """Full-batch quadrature CVI at ``theta`` from the given sites until the relative ELBO change < inner_tol."""
        K = model.kernel_matrix(theta)
        inner = CVIState(lam1, lam2, theta, initialised=True)
        inner.counters = st.counters                     # site counters accumulate into the run's
        prev = math.nan
        for _ in range(max(self.max_sweeps, 50)):
            inner, info = self._full_step(model, inner, K, None, 0.0, method="quadrature")
            elbo = info["elbo"]
            if math.isfinite(prev) and abs(elbo - prev) <= self.inner_tol * max(1.0, abs(elbo)):
                break
            prev = elbo
        st.counters["inner_steps"] = st.counters.get("inner_steps", 0) + inner.step
        return inner

    def _theta_phase(self, model: LatentGP, st: CVIState
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, float]:
        """L-BFGS-B on the profiled bound F(theta) = max_q ELBO, warm-starting CVI from the current sites.

        Returns (theta, lam1, lam2, F at the returned theta, F at the starting theta); the starting point and its
        re-converged sites when no better point was found.
        """
        from scipy.optimize import minimize

        dev = st.theta.device
        cur = {"lam1": st.lam1, "lam2": st.lam2}
        seen: dict[bytes, tuple[float, torch.Tensor, torch.Tensor]] = {}

        def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
            theta = torch.as_tensor(x, dtype=torch.float64, device=dev)
            st.counters["theta_evaluations"] = st.counters.get("theta_evaluations", 0) + 1
            try:
                inner = self._inner_cvi(model, st, theta, cur["lam1"], cur["lam2"])
            except (_Fault, NotPSDError):
                return math.inf, np.zeros_like(x)
            val, grad = self._theta_objective(model, inner, theta)
            if grad is None or not math.isfinite(val) or not bool(torch.isfinite(grad).all()):
                return math.inf, np.zeros_like(x)
            cur["lam1"], cur["lam2"] = inner.lam1, inner.lam2
            seen[x.tobytes()] = (val, inner.lam1, inner.lam2)
            return -val, -grad.cpu().numpy()

        x0 = np.clip(st.theta.detach().cpu().numpy(), *self.theta_bounds)
        f0 = -fun(x0)[0]
        start = seen.get(x0.tobytes())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NumericalWarning)
            res = minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=[self.theta_bounds] * x0.shape[0],
                           options={"maxiter": self.hyper_steps, "ftol": 1e-13, "gtol": 1e-8})
        best = seen.get(np.asarray(res.x, dtype=np.float64).tobytes())
        if best is None and seen:
            key = max(seen, key=lambda k: seen[k][0])
            best, res_x = seen[key], np.frombuffer(key, dtype=np.float64)
        else:
            res_x = res.x
        if best is None or not math.isfinite(best[0]) or start is None or not best[0] > f0:
            if start is None:
                return st.theta, st.lam1, st.lam2, st.elbo, st.elbo
            return st.theta, start[1], start[2], f0, f0
        return torch.as_tensor(np.array(res_x), dtype=torch.float64, device=dev), best[1], best[2], best[0], f0

    # ------------------------------------------------------------------ run
    def run(self, model: LatentGP, *, generator: torch.Generator | None = None,
            callback: Callable[[CVIState, dict[str, Any]], None] | None = None,
            state: CVIState | dict[str, Any] | None = None, theta: Any = None) -> LatentPosterior:
        r"""Run CVI until convergence or the step budget; return the :class:`LatentPosterior`.

        Parameters
        ----------
        model : LatentGP
            E.g. :class:`gpvi.models.classification.GPClassification`.
        generator : torch.Generator, optional
            Randomness (site order, Monte Carlo draws). Default: a generator seeded with ``seed``; when resuming
            from ``state`` without ``generator``, the state's saved generator state is restored, so a resumed run
            equals an uninterrupted one.
        callback : callable, optional
            ``callback(state, info)`` after every step; may raise ``KeyboardInterrupt`` to stop (the partial result
            is returned with an :class:`~gpvi.exceptions.InterruptedRunWarning`).
        state : CVIState or dict, optional
            Resume from this state (or its ``state_dict()``); it is not modified. Budgets count from step 0, so
            resuming an interrupted run with the same settings finishes where the uninterrupted run would.
        theta : array-like of shape (D,), optional
            Kernel log-hyperparameters for a fresh run (default ``model.theta``).

        Returns
        -------
        LatentPosterior

        Raises
        ------
        NumericalFaultError
            After ``max_faults`` consecutive numerical faults; ``err.state`` is the last good state.
        """
        model = self._check_model(model)
        t_start = time.perf_counter()
        if state is None:
            st = self.init(model, theta)
        else:
            st = (CVIState.from_state_dict(state) if isinstance(state, dict) else state.copy())
            if st.num_sites != model.num_data:
                raise ValueError(f"state has {st.num_sites} sites but the model has N = {model.num_data}")
            if st.theta.shape[0] != model.dim:
                raise ValueError(f"state theta has length {st.theta.shape[0]} but the model has D = {model.dim}")
            if st.initialised and not bool((st.lam2 < 0).all()):
                raise ValueError("state has sites with lam2 >= 0; they are not valid Gaussian sites")
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be callable; got {type(callback).__name__}")
        gen = resolve_generator(self.seed, generator)
        if generator is None and st.rng_state is not None:
            gen.set_state(st.rng_state)
        n = model.num_data
        total = self._total_steps(n)
        K = model.kernel_matrix(st.theta)
        interrupted = False
        faults = 0
        elapsed0 = st.trace["time_s"][-1] if st.trace["time_s"] else 0.0
        t_run = time.perf_counter()
        with Progress(total, enabled=self.progress_bar, desc=f"CVI ({self.mode})", initial=min(st.step, total)) as bar:
            try:
                while st.step < total and not st.converged:
                    # steps replace lam1/lam2 by new tensors and only mutate the cached factor in place, so a
                    # shallow snapshot (with the factor dropped on rollback) is a valid last good state
                    good = dataclasses.replace(st, counters=dict(st.counters))
                    try:
                        st, info = self._step(model, st, K, gen, t_run)
                        if info.get("checked"):
                            K = self._after_check(model, st, info, K, elapsed0 + time.perf_counter() - t_run)
                    except (_Fault, NotPSDError) as exc:
                        faults += 1
                        st = dataclasses.replace(good, factor=None, since_refactor=0, counters=dict(good.counters),
                                                 beta_scale=good.beta_scale * 0.5)
                        st.counters["faults"] += 1
                        K = model.kernel_matrix(st.theta)
                        warnings.warn(f"CVI: numerical fault ({exc}); rolled back to the last good state and "
                                      f"halved the step", NumericalWarning, stacklevel=2)
                        if faults >= self.max_faults:
                            raise NumericalFaultError(
                                f"CVI stopped after {faults} consecutive numerical faults (last: {exc}); "
                                f"err.state holds the last good state", state=st.copy()) from exc
                        continue
                    if faults:
                        st.beta_scale = 1.0
                        faults = 0
                    bar.update(1, elbo=st.elbo)
                    if callback is not None:
                        callback(st, info)
            except KeyboardInterrupt:
                interrupted = True
                warn_interrupted("CVI", st.step, total)
        return self._finalise(model, st, interrupted=interrupted, time_s=time.perf_counter() - t_start)

    def _after_check(self, model: LatentGP, st: CVIState, info: dict[str, Any], K: torch.Tensor,
                     elapsed: float) -> torch.Tensor:
        """Record a check, decide convergence, run a hyperparameter phase when due; returns the (new) K."""
        elbo = info["elbo"]
        prev = st.elbo
        tr = st.trace
        tr["step"].append(info.get("elbo_step", st.step))
        tr["sweep"].append(st.sweeps)
        tr["elbo"].append(elbo)
        tr["residual"].append(info.get("residual", math.nan))
        tr["drift"].append(info.get("drift", math.nan))
        tr["time_s"].append(elapsed)
        st.elbo = elbo
        st.checks_since_theta += 1
        sites_converged = (self.tol > 0 and math.isfinite(prev)
                           and abs(elbo - prev) <= self.tol * max(1.0, abs(elbo)))
        if not self.learn_hyperparameters:
            st.converged = sites_converged
            return K
        if sites_converged:
            theta_new, lam1, lam2, elbo_new, elbo_old = self._theta_phase(model, st)
            st.counters["theta_phases"] += 1
            st.checks_since_theta = 0
            if elbo_new - elbo_old <= self.tol * max(1.0, abs(elbo)):
                st.converged = True
            st.lam1, st.lam2 = lam1, lam2
            st.elbo = elbo_new
            if not torch.equal(theta_new, st.theta):
                st.theta = theta_new
                K = model.kernel_matrix(st.theta)
            if st.factor is not None:
                self._refactor(model, st, K, measure=False)
        return K

    def _finalise(self, model: LatentGP, st: CVIState, *, interrupted: bool, time_s: float) -> LatentPosterior:
        K = model.kernel_matrix(st.theta)
        if not st.initialised:
            # nothing was done: q is the prior; represent it with (numerically) flat sites
            lam1 = torch.zeros_like(st.lam1)
            lam2 = torch.full_like(st.lam2, -1e-12)
        else:
            lam1, lam2 = st.lam1, st.lam2
        ytilde, s = _pseudo(lam1, lam2)
        L, _ = _factor(K, s, st.theta)
        m, v, alpha = _marginals(K, L, ytilde)
        elbo = float(site_elbo(self._elbo_value(model, m, v), lam1, lam2, m, v, L, alpha))
        info = {"mode": self.mode, "beta": self.beta, "beta_schedule": self.beta_schedule
                if isinstance(self.beta_schedule, str) else "callable", "estimator": self.estimator,
                "quadrature": self.quadrature.spec(), "num_mc": self.num_mc, "batch_size": self.batch_size,
                "refactor_every": self._refactor_every(model.num_data) if self.mode == "stochastic" else None,
                "learn_hyperparameters": self.learn_hyperparameters, "link": model.link, "steps": st.step,
                "sweeps": st.sweeps, "interrupted": interrupted, "time_s": time_s, **st.counters}
        if not st.converged and not interrupted and self.tol > 0:
            from ...exceptions import ConvergenceWarning
            warnings.warn(f"CVI did not converge within {st.step} steps (tol={self.tol:g}); last relative ELBO change "
                          f"above tol", ConvergenceWarning, stacklevel=3)
        return LatentPosterior(model, lam1, lam2, st.theta, m, v, L=L, alpha=alpha, elbo=elbo,
                               converged=st.converged, trace={k: list(x) for k, x in st.trace.items()}, info=info,
                               engine_state=st, quadrature=self.quadrature)


class _Fault(Exception):
    """Internal: a numerical fault inside a step (rolled back by ``run``)."""
