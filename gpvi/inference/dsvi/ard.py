r"""DSVI-ARD: hyperparameter-free sparse variational inference (DSVI paper section 3.2, eq. 13-14).

Model. A likelihood :math:`\tilde g(\theta) = p(y \mid \theta)` (e.g. logistic regression) and an ARD prior
:math:`p(\theta) = \mathcal N(0, \Lambda)`, :math:`\Lambda = \operatorname{diag}(\ell_1^2, \dots, \ell_D^2)`, with
a factorised Gaussian :math:`q(\theta) = \prod_d \mathcal N(\theta_d \mid \mu_d, c_d^2)`, i.e.
:math:`\theta = c\circ z + \mu`, :math:`z \sim \mathcal N(0, I)` (diagonal DSVI, eq. 9).

**Derivation.** The bound of eq. (3) splits into the likelihood part, the Gaussian prior part (closed form
under q) and the entropy :math:`\mathcal H[q] = \sum_d \log c_d + \frac D2(1 + \log 2\pi)`:

.. math::

    \mathbb E_q[\log\mathcal N(\theta\mid 0,\Lambda)] = -\frac D2\log 2\pi - \frac12\sum_d\log\ell_d^2
    - \frac12\sum_d\frac{c_d^2 + \mu_d^2}{\ell_d^2},

so (eq. 13) :math:`\mathcal F(\mu, c, \Lambda) = \mathbb E_\phi[\log\tilde g(c\circ z+\mu)] + \frac12\sum_d\log c_d^2
- \frac12\sum_d\log\ell_d^2 - \frac12\sum_d (c_d^2+\mu_d^2)/\ell_d^2 + \frac D2`. Setting
:math:`\partial\mathcal F/\partial\ell_d^2 = -\frac1{2\ell_d^2} + \frac{c_d^2+\mu_d^2}{2\ell_d^4} = 0` gives
:math:`(\ell_d^2)^* = c_d^2 + \mu_d^2`; substituting, the last two terms give :math:`-\frac D2` and cancel the
:math:`+\frac D2`, leaving eq. (14), which is the *exact* bound at the optimal prior (no constant dropped):

.. math::

    \mathcal F(\mu, c) = \mathbb E_{\phi(z)}[\log\tilde g(c\circ z + \mu)]
    + \frac12\sum_{d=1}^D \log\frac{c_d^2}{c_d^2 + \mu_d^2}.

Its gradients, with :math:`g = \nabla_\theta\log\tilde g(\theta)` at :math:`\theta = c\circ z + \mu`
(reparametrisation as in eq. 5-6, and :math:`\frac12\partial_{c}\log c^2 = 1/c`,
:math:`\frac12\partial_c\log(c^2+\mu^2) = c/(c^2+\mu^2)`):

.. math::

    \frac{\partial\mathcal F}{\partial\mu_d} = \mathbb E_\phi[g_d] - \frac{\mu_d}{c_d^2 + \mu_d^2},\qquad
    \frac{\partial\mathcal F}{\partial c_d} = \mathbb E_\phi[g_d\, z_d] + \frac1{c_d} - \frac{c_d}{c_d^2+\mu_d^2}
    = \mathbb E_\phi[g_d\, z_d] + \frac{\mu_d^2}{c_d\,(c_d^2+\mu_d^2)}.

(By the envelope theorem these equal the DSVI gradients of eq. 13 at :math:`\ell_d^2 = c_d^2+\mu_d^2`: the prior
contributes :math:`-\mu_d/\ell_d^2` and :math:`-c_d/\ell_d^2`.) The stochastic iteration ("Algorithm 2" of the
paper's supplement), one or S draws per step:

1. :math:`z \sim \mathcal N(0, I)`, :math:`\theta = c\circ z + \mu`, :math:`g = \nabla_\theta\log\tilde g(\theta)`;
2. :math:`\mu_d \leftarrow \mu_d + \rho_t\,\big(g_d - \mu_d/(c_d^2+\mu_d^2)\big)`;
3. :math:`c_d \leftarrow c_d + 0.1\rho_t\,\big(g_d z_d + \mu_d^2/(c_d(c_d^2+\mu_d^2))\big)` (never letting
   :math:`c_d \le 0`, see :class:`gpvi.inference.dsvi.engine.DSVI`);
4. the optimal prior variances are :math:`\ell_d^2 = c_d^2 + \mu_d^2` at any time.

The regulariser :math:`\frac12\log\frac{c_d^2}{c_d^2+\mu_d^2} \le 0` is largest when :math:`\mu_d = 0`: a weight
that does not improve the likelihood is pulled to zero, which makes :math:`\mu` sparse (the paper's Figure 3).
With a constant-size step the zeroed weights keep rattling at a scale of about :math:`\sqrt{\rho_t}`; the
decaying schedule and the Polyak average of :class:`~gpvi.inference.dsvi.engine.DSVI` shrink that.

Settings follow the paper: :math:`\rho_0 = 0.05/N`, multiplied by 0.95 every 5000 steps, :math:`0.1\rho_t` for
:math:`c`, :math:`10^5` steps. Cost per step: :math:`O(D)` plus the likelihood.

Names: ``mu`` = :math:`\mu`, ``c`` = :math:`c` (``q.stddev``), ``prior_var`` = :math:`\ell^2`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .engine import DSVI, DSVIState
from .options import SGD
from ...posteriors.gaussian import GaussianPosterior
from ...models.minibatch import MinibatchTarget
from ...models.target import as_target
from ...validation import check_positive

__all__ = ["DSVIARD", "ARDTerm", "ard_prior_variance"]


class ARDTerm:
    r"""Closed-form part of the DSVI-ARD bound (eq. 14): :math:`\frac12\sum_d\log\frac{c_d^2}{c_d^2+\mu_d^2}`.

    ``term(mu, c) -> (value, grad_mu, grad_c)`` with :math:`\partial/\partial\mu_d = -\mu_d/(c_d^2+\mu_d^2)` and
    :math:`\partial/\partial c_d = \mu_d^2 / (c_d(c_d^2+\mu_d^2))` (derivation in :mod:`gpvi.inference.dsvi.ard`). It replaces
    DSVI's entropy term: the entropy of q and the optimised Gaussian prior are both inside it.

    Examples
    --------
    >>> import torch
    >>> mu, c = torch.tensor([0.5, 1.0], dtype=torch.float64), torch.tensor([1.0, 1.0], dtype=torch.float64)
    >>> value, gmu, gc = ARDTerm()(mu, c)
    >>> round(value, 6), gmu.tolist(), gc.tolist()
    (-0.458145, [-0.4, -0.5], [0.2, 0.5])
    """

    def __call__(self, mu: torch.Tensor, c: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:
        c2 = c * c
        l2 = c2 + mu * mu
        value = float(0.5 * (torch.log(c2) - torch.log(l2)).sum())
        return value, -mu / l2, (mu * mu) / (c * l2)


def ard_prior_variance(q: GaussianPosterior) -> torch.Tensor:
    r"""Optimal ARD prior variances :math:`\ell_d^2 = c_d^2 + \mu_d^2` for a factorised posterior, shape (D,)."""
    return q.scale_diag ** 2 + q.mean ** 2


class _ARDEngine(DSVI):
    """DSVI on the bound of eq. (14): the closed-form part of the bound is :class:`ARDTerm`."""

    analytic_term = ARDTerm()


class DSVIARD:
    r"""DSVI-ARD (paper section 3.2): sparse Bayesian inference with the ARD prior optimised out analytically.

    Runs diagonal-scale DSVI (:class:`gpvi.inference.dsvi.engine.DSVI` with ``scale="diag"``, standard-normal :math:`\phi`) on the
    bound of eq. (14), whose closed-form part is :class:`ARDTerm`. The target's ``log_joint`` must be the
    **log likelihood** :math:`\log\tilde g(\theta)` alone — the ARD prior is supplied here — e.g.
    ``BayesianLogisticRegression(X, y, prior_var=None)`` or its ``.minibatch(500)`` for large data
    (section 3.3).

    Parameters
    ----------
    num_draws : int
        Draws per step (the paper's algorithm uses one).
    num_steps : int
        Steps (the paper: :math:`10^5`).
    lr : float or "paper"
        :math:`\rho_0` for :math:`\mu`; ``"paper"`` (default) = 0.05 / N with N = ``target.num_data``.
    lr_scale : float
        :math:`\rho_C/\rho_\mu` (paper: 0.1).
    schedule : str or schedule object
        Default ``"decay"``: multiply by 0.95 every ``num_steps // 20`` steps (every 5000 for :math:`10^5`
        steps, as in the paper).
    init_scale : float
        Initial :math:`c_d` (default 0.1).
    **settings
        Any other :class:`~gpvi.inference.dsvi.engine.DSVI` setting (``polyak``, ``convergence``, ``faults``,
        ``num_elbo_draws``, ``seed``, ``progress_bar``). The steps are :class:`~gpvi.inference.dsvi.options.SGD`
        ones with ``lr``, ``lr_scale`` and ``schedule`` above.

    Examples
    --------
    >>> import torch
    >>> from gpvi.inference.dsvi.ard import DSVIARD
    >>> from gpvi.models.logistic import BayesianLogisticRegression
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(60, 30, generator=g, dtype=torch.float64)
    >>> y = (X[:, 0] - X[:, 1] > 0).double()
    >>> lik = BayesianLogisticRegression(X, y, prior_var=None, bias=False)
    >>> q = DSVIARD(num_steps=4000, lr=0.005, progress_bar=False).run(lik)
    >>> sorted(q.mean.abs().topk(2).indices.tolist())
    [0, 1]
    """

    def __init__(self, *, num_draws: int = 1, num_steps: int = 100_000, lr: float | str = "paper",
                 lr_scale: float = 0.1, schedule: Any = "decay", init_scale: float = 0.1, **settings: Any) -> None:
        for bad in ("scale", "base", "optimizer"):
            if bad in settings:
                raise ValueError(f"DSVIARD fixes {bad!r} (diagonal scale, standard-normal base, SGD steps on eq. 14; "
                                 f"set lr, lr_scale and schedule here)")
        if isinstance(lr, str):
            if lr != "paper":
                raise ValueError(f"lr must be a positive float or 'paper' (0.05 / N); got {lr!r}")
        else:
            lr = check_positive(lr, "lr")
        self.lr = lr
        self.init_scale = check_positive(init_scale, "init_scale")
        self._rule = dict(lr_scale=lr_scale, schedule=schedule)
        self._kwargs = dict(num_draws=num_draws, num_steps=num_steps, init_scale=self.init_scale, **settings)
        self._template = self._make(1.0 if lr == "paper" else lr)     # validates every setting now
        self._engines: dict[float, DSVI] = {}

    def _make(self, lr: float) -> DSVI:
        return _ARDEngine("diag", "normal", optimizer=SGD(lr=lr, **self._rule), **self._kwargs)

    def engine(self, target: Any) -> DSVI:
        """The :class:`~gpvi.inference.dsvi.engine.DSVI` engine that runs this target (``lr="paper"`` resolved to
        0.05 / N); built once per resolved rate and reused, so stepping does not rebuild it."""
        lr = self.lr
        if lr == "paper":
            n = getattr(target, "num_data", None)
            if not isinstance(n, int) or n < 1:
                raise ValueError("lr='paper' (0.05 / N) needs target.num_data; pass lr= explicitly for this target")
            lr = 0.05 / n
        cached = self._engines.get(lr)
        if cached is None:
            cached = self._engines[lr] = self._make(lr)
        return cached

    def init(self, target: Any, init: Any = None, *, generator: torch.Generator | None = None) -> DSVIState:
        """Initial state (zeros mean unless ``init``; :math:`c = ` ``init_scale``), see :meth:`DSVI.init`."""
        target = self._check(target)
        if init is None:
            init = torch.zeros(len(target.names), dtype=torch.float64)
        return self.engine(target).init(target, init, generator)

    def step(self, target: Any, state: DSVIState) -> tuple[DSVIState, dict[str, Any]]:
        """One step of the iteration above (see :meth:`DSVI.step`)."""
        return self.engine(target).step(target, state)

    def _check(self, target: Any) -> Any:
        target = as_target(target)
        has_prior = getattr(target, "prior_var", None) is not None or (
            isinstance(target, MinibatchTarget) and target.log_prior is not None)
        if has_prior:
            raise ValueError("DSVI-ARD supplies its own ARD prior: build the target without one "
                             "(e.g. BayesianLogisticRegression(X, y, prior_var=None), or a MinibatchTarget with "
                             "log_prior=None)")
        return target

    def run(self, target: Any, init: Any = None, *, generator: torch.Generator | None = None,
            callback: Callable[[DSVIState, dict[str, Any]], None] | None = None,
            state: DSVIState | dict[str, Any] | None = None) -> GaussianPosterior:
        r"""Maximise eq. (14) and return the factorised Gaussian posterior.

        Parameters
        ----------
        target : target
            Log *likelihood* :math:`\log\tilde g` (no prior), ``(S, D) -> (S,)``; minibatch targets work.
        init : None or array-like of shape (D,)
            Initial mean (default zeros, whatever ``target.initial_theta`` says).
        generator, callback, state
            As in :meth:`gpvi.inference.dsvi.engine.DSVI.run`.

        Returns
        -------
        GaussianPosterior
            Diagonal ``scale_tril``; ``elbo`` estimates eq. (14) itself; ``info["prior_var"]`` holds
            :math:`\ell^2 = c^2 + \mu^2` and ``info["relevance"]`` :math:`\mu_d^2 / \ell_d^2` (1: the weight is
            clearly away from zero, 0: pruned).
        """
        target = self._check(target)
        if init is None and state is None:
            init = torch.zeros(len(target.names), dtype=torch.float64)
        q = self.engine(target).run(target, init, state=state, generator=generator, callback=callback)
        l2 = ard_prior_variance(q)
        q.info["prior_var"] = l2
        q.info["relevance"] = q.mean ** 2 / l2
        q.info["method"] = "DSVI-ARD (eq. 14)"
        return q

    def __repr__(self) -> str:
        lr = self.lr if isinstance(self.lr, str) else f"{self.lr:g}"
        return f"DSVIARD(num_steps={self._kwargs['num_steps']}, lr={lr})"
