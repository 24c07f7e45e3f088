r"""The likelihood's parameters by type-II on the CVI bound: Student-t df and scale, negative-binomial dispersion,
Laplace scale, Beta scale (issue 60), with the kernel's by :class:`~gpvi.inference.cvi.typeii.TypeII`.

The CVI bound (Khan & Lin 2017, eq. 3) of :class:`gpvi.GPGeneralisedRegression`,

.. math::

    \mathcal L(\theta, \phi, q) = \sum_n \mathbb E_{q(f_n)}[\log p(y_n \mid f_n, \phi)]
    - \mathrm{KL}(q(\mathbf f)\,\|\,\mathcal N(0, K_\theta)),

depends on the likelihood's parameters :math:`\phi` only through the expected log-likelihoods. So with :math:`q`
held fixed the best :math:`\phi` solves a small problem (an **M-step**)

.. math::

    \max_{\psi = \log\phi}\ \sum_n \mathbb E_{\mathcal N(m_n, V_{nn})}[\log p(y_n \mid f_n, e^\psi)]
    + \log p(\psi),

by L-BFGS on :math:`\psi` with the gradient :math:`\partial_\psi\,\mathbb E_q[\log p]` from autograd through the
quadrature rule (Laplace: :math:`b^* = \frac1N\sum_n \mathbb E_q|y_n - f_n|`, the folded-normal mean, exactly).
:class:`LikelihoodTypeII` alternates it with :class:`~gpvi.inference.cvi.typeii.TypeII` (which maximises over
:math:`\theta` and :math:`q` at fixed :math:`\phi`, warm-started from the last sites): a coordinate ascent of one
bound (variational EM), so the bound does not decrease from round to round (but for the inner runs' tolerance,
measured 2e-4 at most); it stops when a round raises the
objective by less than ``tol`` relative.

**Clipped sites.** Where CVI clips a Student-t site's negative precision (gross outliers,
:class:`gpvi.GPGeneralisedRegression`), its fixed point is not the bound's maximiser over :math:`q`, and the
alternation stops where a round no longer raises the bound, short of a stationary point in :math:`\phi` (measured on
40 points with Cauchy noise: :math:`\partial\mathcal L/\partial\log\sigma = 0.13` there, against 0.003 with
Student-t noise of df 4 and no clipping).

**Priors** (MAP-II). Priors registered on the kernel (``lengthscale_prior=``...) or named in ``TypeII(prior=...)``
make the :math:`\theta` step MAP-II (:class:`~gpvi.inference.cvi.typeii.TypeII`); ``priors=`` here puts priors on
the likelihood's parameters, one per name, on the parameter itself (``{"df": gpytorch.priors.GammaPrior(2, 0.1)}``,
entering the density over :math:`\psi` with the log-Jacobian :math:`\psi`) or on its log (``{"log_df": ...}``):
:class:`gpvi.models.likelihood_priors.LikelihoodPrior`. The M-step then maximises the expected log-likelihood plus
:math:`\log p(\psi)`, and the whole loop the bound plus both log priors. Without them the result is the type-II
maximum. A Student-t's :math:`\nu` and :math:`\sigma` are only weakly identified on a few hundred points without
outliers (:math:`\nu \to \infty` is the Gaussian): the bound then rises slowly with :math:`\nu`, and the box
``bounds`` (default :math:`\log\phi \in [\log 10^{-3}, \log 10^3]`) stops it, unless a prior does first.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from ...models.generalised import GPGeneralisedRegression
from ...models.latent_likelihoods import LATENT_LIKELIHOODS
from ...models.likelihood_priors import LIKELIHOOD_PARAMS, LikelihoodPrior, log_lik_in
from ...numerics.quadrature import Quadrature
from ...validation import check_positive, check_positive_int
from .typeii import TypeII

__all__ = ["LikelihoodTypeII", "expected_log_lik_in"]


def expected_log_lik_in(name: str, y: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                        params: dict[str, torch.Tensor], quadrature: Quadrature | None = None) -> torch.Tensor:
    r""":math:`\sum_n \mathbb E_{\mathcal N(m_n, v_n)}[\log p(y_n \mid f_n, \phi)]`, differentiable in ``params``.

    Parameters
    ----------
    name : str
        A key of :data:`gpvi.models.likelihood_priors.LIKELIHOOD_PARAMS`.
    y, m, v : torch.Tensor of shape (N,)
        Targets and the marginals of :math:`q`.
    params : dict of str to torch.Tensor
        The likelihood's parameters (0-d tensors, e.g. with ``requires_grad``).
    quadrature : Quadrature, optional
        The rule (default ``Quadrature()``); Laplace uses its closed form.
    """
    if name == "laplace":
        b = params["scale"]
        s = torch.sqrt(v.clamp_min(torch.finfo(v.dtype).tiny))
        z = (y - m) / s
        absdev = (y - m) * torch.erf(z / math.sqrt(2.0)) + 2.0 * s * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
        return (-torch.log(2.0 * b) - absdev / b).sum()
    f, w = (quadrature or Quadrature()).nodes_by_node(m, v)                   # (Q, N)
    return (w * log_lik_in(name, y.expand_as(f), f, params)).sum()


class LikelihoodTypeII:
    r"""Type-II maximisation of the CVI bound over the kernel's and the likelihood's parameters (module docstring).

    Parameters
    ----------
    typeii : TypeII, optional
        The rule for :math:`\theta` and :math:`q` at fixed likelihood parameters (default ``TypeII(CVI(), prior=None)``
        with ``progress_bar=False``).
    learn : sequence of str, optional
        Which of the likelihood's parameters to learn (default all of
        :data:`gpvi.models.likelihood_priors.LIKELIHOOD_PARAMS` for it).
    priors : dict of str to distribution, "default" or None, optional
        Priors on the learned parameters (:class:`gpvi.models.likelihood_priors.LikelihoodPrior`): by the
        parameter's name on its **natural** value (``{"dispersion": gpytorch.priors.GammaPrior(2.0, 0.5)}``, with the
        log-Jacobian, as GPyTorch's ``deg_free_prior`` / ``noise_prior`` are written), or by ``"log_" + name`` on
        its log (``{"log_df": gpytorch.priors.NormalPrior(2.0, 1.0)}``); objects with ``log_prob``. Parameters not
        named have no prior (the default, ``None``: type-II); ``"default"``: gpvi's :math:`\mathcal N(0, 10)` on
        every learned log parameter, as on the kernel's log-hyperparameters. The kernel's priors are those of
        ``typeii`` (its ``prior`` and the kernel's registered priors).
    tol : float
        Stop when a round raises the objective by less than ``tol`` relative (default 1e-7).
    max_rounds : int
        At most this many rounds of (M-step, TypeII) (default 50).
    bounds : (float, float)
        Box on the log parameters (default :math:`\pm\log 10^3`).

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.inference.cvi.likelihood_params import LikelihoodTypeII
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.rand(40, 1, generator=g, dtype=torch.float64)
    >>> y = torch.sin(6 * X[:, 0]) + 0.1 * torch.randn(40, generator=g, dtype=torch.float64)
    >>> post = LikelihoodTypeII(learn=["scale"]).run(gpvi.GPGeneralisedRegression(X, y, likelihood="laplace"))
    >>> 0.03 < post.model.likelihood.scale < 0.2, post.info["likelihood_rounds"] > 1
    (True, True)
    """

    def __init__(self, typeii: TypeII | None = None, *, learn: Any = None, priors: dict[str, Any] | None = None,
                 tol: float = 1e-7, max_rounds: int = 50, bounds: tuple[float, float] = (-math.log(1e3), math.log(1e3))
                 ) -> None:
        if typeii is None:
            from .engine import CVI
            typeii = TypeII(CVI(progress_bar=False), prior=None)
        self.typeii = typeii
        self.learn = None if learn is None else tuple(learn)
        if not (priors is None or priors == "default" or isinstance(priors, dict)):
            raise TypeError(f"priors must be a dict {{parameter name: distribution}}, 'default' or None; got "
                            f"{type(priors).__name__}")
        self.priors = priors
        self.tol = check_positive(tol, "tol")
        self.max_rounds = check_positive_int(max_rounds, "max_rounds")
        self.bounds = (float(bounds[0]), float(bounds[1]))

    def _names(self, lik: Any) -> tuple[str, ...]:
        name = getattr(lik, "name", None)
        if name not in LIKELIHOOD_PARAMS:
            raise ValueError(f"likelihood {name!r} has no parameters to learn; LikelihoodTypeII learns those of "
                             f"{sorted(LIKELIHOOD_PARAMS)}")
        names = LIKELIHOOD_PARAMS[name] if self.learn is None else self.learn
        bad = [p for p in names if p not in LIKELIHOOD_PARAMS[name]]
        if bad or not names:
            raise ValueError(f"learn must name parameters of {name!r} ({list(LIKELIHOOD_PARAMS[name])}); got "
                             f"{list(names)}")
        return tuple(names)

    def likelihood_prior(self, lik: Any) -> LikelihoodPrior:
        r"""The prior :math:`p(\psi)` of ``lik``'s learned log parameters (``ValueError`` for a key of ``priors``
        that names no learned parameter, or a prior that is not finite at ``lik``'s values)."""
        names = self._names(lik)
        prior = LikelihoodPrior(lik.name, names, self.priors)
        prior.check(self._psi(lik, names))
        return prior

    @staticmethod
    def _psi(lik: Any, names: tuple[str, ...], device: Any = None) -> torch.Tensor:
        return torch.tensor([math.log(float(getattr(lik, p))) for p in names], dtype=torch.float64, device=device)

    def m_step(self, post: Any, names: tuple[str, ...], prior: LikelihoodPrior | None = None
               ) -> tuple[dict[str, float], float]:
        r"""The best likelihood parameters for the marginals of ``post`` (fixed :math:`q`): ``(values, objective)``
        with the objective the expected log-likelihood plus :math:`\log p(\psi)` (``prior``; default: that of
        ``priors``, :meth:`likelihood_prior`)."""
        model = post.model
        if prior is None:
            prior = LikelihoodPrior(model.likelihood.name, names, self.priors)
        lik = model.likelihood
        y, m, v = model.y, post.m.detach(), post.var.detach()
        if getattr(model, "weights", None) is not None:
            raise ValueError("LikelihoodTypeII does not take a model with weights")
        fixed = {p: torch.tensor(float(getattr(lik, p)), dtype=torch.float64, device=y.device)
                 for p in LIKELIHOOD_PARAMS[lik.name] if p not in names}
        psi = self._psi(lik, names, y.device).requires_grad_(True)
        quad = post.quadrature if post.quadrature is not None else Quadrature()

        def objective() -> torch.Tensor:
            lo, hi = self.bounds
            ps = psi.clamp(lo, hi)
            params = {**fixed, **{p: torch.exp(ps[i]) for i, p in enumerate(names)}}
            return expected_log_lik_in(lik.name, y, m, v, params, quad) + prior.log_prob(ps)

        opt = torch.optim.LBFGS([psi], lr=1.0, max_iter=200, tolerance_grad=1e-9, tolerance_change=1e-12,
                                line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = -objective()
            loss.backward()
            return loss

        with torch.enable_grad():
            opt.step(closure)
        with torch.no_grad():
            value = float(objective())
        lo, hi = self.bounds
        return {p: math.exp(min(max(float(psi[i].detach()), lo), hi)) for i, p in enumerate(names)}, value

    def run(self, model: GPGeneralisedRegression, init: Any = None) -> Any:
        r"""Alternate M-steps and :class:`TypeII` until a round stops improving the bound (plus log priors).

        ``init`` goes to the first :class:`TypeII` run (as for :meth:`gpvi.CVI.run`: theta, a posterior or
        :class:`~gpvi.inference.cvi.options.init_to_sites`); the later runs start from the last posterior.

        Returns
        -------
        LatentPosterior
            Of a new :class:`~gpvi.GPGeneralisedRegression` (``post.model``) with the learned likelihood
            (``post.model.likelihood``); ``info`` adds ``likelihood_params`` (``{name: value}``),
            ``likelihood_rounds``, ``likelihood_trace`` (the objective after each round), ``likelihood_converged``,
            ``likelihood_time_s``, ``likelihood_log_prior`` (:math:`\log p(\psi)` at the learned values, 0 without
            priors) and ``likelihood_priors`` (``{parameter: its prior}``); ``objective`` becomes what the
            alternation maximised: the bound plus TypeII's ``log_prior`` (of :math:`\theta`) plus
            ``likelihood_log_prior``.

        Raises
        ------
        ValueError
            A likelihood without parameters, ``learn`` or ``priors`` naming parameters it does not learn, a prior
            that is not finite at the likelihood's starting values, a model with ``weights``.
        """
        if getattr(model, "weights", None) is not None:
            raise ValueError("LikelihoodTypeII does not take a model with weights")
        names = self._names(model.likelihood)
        prior = self.likelihood_prior(model.likelihood)
        t0 = time.perf_counter()
        post = self.typeii.run(model, init)
        trace = [self._objective(post, prior, names)]
        converged = False
        rounds = 0
        for rounds in range(1, self.max_rounds + 1):
            values, _ = self.m_step(post, names, prior)
            name = model.likelihood.name
            lik = LATENT_LIKELIHOODS[name](**{p: values.get(p, getattr(post.model.likelihood, p))
                                              for p in LIKELIHOOD_PARAMS[name]})
            new = GPGeneralisedRegression(model.X, model.y, kernel=model.kernel_template, likelihood=lik,
                                          theta=post.theta, feature_names=model.feature_names)
            post = self.typeii.run(new, init=post)          # warm start: theta and sites
            trace.append(self._objective(post, prior, names))
            if trace[-1] - trace[-2] <= self.tol * max(1.0, abs(trace[-2])):
                converged = True
                break
        final = post.model.likelihood
        lp = float(prior.log_prob(self._psi(final, names)))
        return post._with_info({"likelihood_params": {p: float(getattr(final, p)) for p in names},
                                "likelihood_rounds": rounds, "likelihood_trace": trace,
                                "likelihood_converged": converged, "likelihood_time_s": time.perf_counter() - t0,
                                "likelihood_log_prior": lp, "likelihood_priors": prior.summary(),
                                "objective": self._objective(post, prior, names)})

    def _objective(self, post: Any, prior: LikelihoodPrior, names: tuple[str, ...]) -> float:
        r"""What the alternation maximises: the bound, plus :math:`\log p(\theta)` (TypeII's ``objective``),
        plus :math:`\log p(\psi)`."""
        obj = post.info.get("objective", post.elbo)
        return float(obj) + float(prior.log_prob(self._psi(post.model.likelihood, names)))

    def __repr__(self) -> str:
        return f"LikelihoodTypeII(learn={self.learn}, tol={self.tol:g}, max_rounds={self.max_rounds})"
