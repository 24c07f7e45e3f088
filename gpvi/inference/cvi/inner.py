r"""The inner runs of type-II learning on the CVI bound and the profiled objective they give.

For a trial :math:`\theta` the inner run converges the sites by full-batch CVI with deterministic expectations, kept
monotone in the ELBO (:func:`converge_sites`, :func:`monotone_run`); :func:`theta_objective` then returns the ELBO
and its gradient in :math:`\theta` with the sites held fixed, which at the fixed point is :math:`dF/d\theta`
(:func:`profiled_objective`). Sites of one latent function, shape (N,), or of K, shape (N, K).

Inner runs are monotone
-----------------------
A full-batch CVI step with a constant step size need not increase the ELBO. When the likelihood saturates (large
signal variance, (nearly) separable classes) the damped map
:math:`\tilde\lambda \mapsto (1-\beta)\tilde\lambda + \beta g(\tilde\lambda)` has a Jacobian eigenvalue below
:math:`-1` at its fixed point for ``beta = 0.5``: the fixed point is unstable and the iterates settle on a
**2-cycle** (measured on iris setosa vs versicolor at signal variance 292: the ELBO alternates between -3.7276 and
-3.7288 with the sites' residual stuck at 0.015, while the fixed point has ELBO -3.7160). The relative-change test
then never passes, every inner run spends its whole ``inner_num_steps`` budget (38,000 inner steps for
N = 100), and the gradient returned is not that of :math:`F` (the sites are not at a fixed point). So
:func:`converge_sites` accepts a step only if the ELBO does not go down: an ELBO below the last accepted one
sends the sites back to the last accepted point and halves the step, and each accepted step lets the step grow
back by 1.5 (up to ``beta``). Any ELBO-monotone sequence of steps converges to the fixed point, which is the
unique maximiser for log-concave likelihoods, so the answer is the same; the 2-cycle is gone. The runs converge
linearly (the ELBO's gap shrinks by a roughly constant factor per step), so they are Anderson-accelerated
(``anderson``, :class:`gpvi.numerics.anderson.Anderson`): an extrapolation from the last few steps is kept only
if its ELBO is not below the last accepted one, else the plain step replaces it.

For fixed sites, :math:`\mathbf m = \tilde{\mathbf y} - S P\tilde{\mathbf y}` and
:math:`\operatorname{diag}V = s - s^2\operatorname{diag}P` with :math:`P = (K+S)^{-1}`, which gives the gradient in
closed form,

.. math::

    \frac{\partial\mathcal L}{\partial K} = \operatorname{sym}\Big(P\,(a\odot s)\,\boldsymbol\alpha^\top
      + P\operatorname{diag}(b\odot s^2)P + \tfrac12\boldsymbol\alpha\boldsymbol\alpha^\top - \tfrac12 P\Big),

with :math:`\boldsymbol\alpha = P\tilde{\mathbf y}`, :math:`a_n = \partial_m E_n - \tilde\lambda^{(1)}_n - 2\tilde\lambda^{(2)}_n m_n`,
:math:`b_n = \partial_v E_n - \tilde\lambda^{(2)}_n`; it is pushed through :math:`K(\theta)` by autograd's backward
(:meth:`~gpvi.models.classification.LatentGP.kernel_vjp`, from the inner run's kernel matrix). The
factorisation is the exact Cholesky of :func:`gpvi.linalg.cholesky_with_jitter`. At a CVI fixed point :math:`a = b = 0`,
so this is :math:`dF/d\theta` (envelope theorem). Each evaluation costs a few O(N^3) CVI steps (warm start: per
latent function one Cholesky factor, :math:`N^3/3` flops, and :math:`P` by ``potri``, :math:`2N^3/3`, or from
order :data:`gpvi.numerics.sites.INVERSE_MIN` on :math:`L^{-1}` by ``trtri``, :math:`N^3/3`:
:func:`gpvi.numerics.sites.marginals`) plus, for the gradient, one ``syrk`` with the best step's kept :math:`P`
(after one ``lauum`` of its :math:`L^{-1}`, :math:`N^3/3`, where that was kept;
:func:`gpvi.numerics.sites.kernel_gradient_summed`, :math:`N^3`); a stochastic engine's phases use the same full-batch inner
loop, because the gradient in :math:`\theta` costs O(N^3) anyway. (Alternating a few L-BFGS steps with the sites
held fixed and CVI sweeps, variational-EM style, crept towards the optimum with thousands of evaluations on nearly
separable data.)

Names: ``theta`` (kernel log-hyperparameters), ``lam1``, ``lam2`` (sites), ``s`` (pseudo-noise), ``P``, ``alpha``,
``a``, ``b`` as above.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ...exceptions import NotPSDError
from ...models.priors import prior_log_prob
from ...numerics import sites
from ...numerics.anderson import Anderson
from ...numerics.quadrature import Quadrature
from ...numerics.softmax_rules import default_quadrature
from . import steps
from .state import CVIState

__all__ = ["converge_sites", "monotone_run", "theta_objective", "profiled_objective", "trial_tol", "secant_step",
           "inner_quadrature"]

_NO_DRAWS = torch.Generator()
"""The inner runs draw nothing (deterministic expectations); their states carry this generator, never used."""


def _cols(x: torch.Tensor) -> torch.Tensor:
    """Sites (N,) as they are; (N, K) as (K, N), one row per latent function (the batch layout of the factors)."""
    return x if x.dim() == 1 else x.T


def converge_sites(cvi: Any, model: Any, theta: torch.Tensor, lam1: torch.Tensor, lam2: torch.Tensor,
                   counters: dict[str, float], *, tol: float, max_steps: int, anderson: int = 0,
                   best: dict[str, Any] | None = None, work: list[Any] | None = None) -> CVIState:
    r"""Deterministic full-batch CVI at ``theta`` from the given sites until the relative change of the bound is
    below ``tol``; returns the state after the last step (``t`` = steps taken).

    The steps are kept **monotone in the bound** (the module docstring): a step
    whose bound is lower than the last accepted one is undone (the sites go back to the last accepted point) and
    the step size is halved; each accepted step lets it grow back by 1.5, up to the engine's ``beta``. A damped
    CVI map can settle on a 2-cycle instead of its fixed point (an eigenvalue below -1 of its Jacobian, e.g.
    points on a boundary between two classes with ``beta`` near 1; robust-max sites whose variance gradient is
    positive); an ELBO-monotone sequence converges to the fixed point. Every step (undone ones too) counts towards
    ``max_steps``; ``counters["inner_backtracks"]`` counts the undone ones. ``anderson`` > 0: Anderson
    acceleration of the damped map with that memory, each extrapolation guarded by the bound
    (:func:`monotone_run`).

    ``best``: a dict that receives the ``info["pieces"]`` of the evaluated sites with the highest bound (for
    :func:`theta_objective`'s ``evaluated``; see :func:`profiled_objective`).

    ``work``: a list (empty, or from an earlier call with sites of the same shape) of at most two pairs of buffers
    that the steps write their factors and inverses into (``full_step(work=)``), each step into the pair ``best``
    does not hold; a fresh :math:`N\times N` allocation costs about as much as a pass of LAPACK over it
    (page faults), so reusing them across the steps and evaluations of a phase saves two per step.
    """
    K = model.kernel_matrix(theta)
    inner = CVIState(lam1, lam2, theta, _NO_DRAWS, initialised=True)
    inner.counters = counters

    def buffers() -> tuple[torch.Tensor, torch.Tensor] | None:
        if work is None:
            return None
        held = {best[k].data_ptr() for k in ("L", "P", "Linv") if k in best} if best else set()
        for pair in work:
            if not held & {b.data_ptr() for b in pair}:
                return pair
        shape = (K.shape[0], K.shape[0]) if lam1.dim() == 1 else (lam1.shape[1], K.shape[0], K.shape[0])
        work.append(tuple(torch.empty(shape, dtype=K.dtype, device=K.device) for _ in range(2)))
        return work[-1]

    recent: dict[int, Any] = {}     # id of a recent step's input sites -> (those sites, evaluated sites, update)

    def step(st: CVIState) -> float:
        given = st.lam1
        info = steps.full_step(cvi, model, st, K, None, method=cvi.elbo_method, work=buffers())
        if best is not None and info["elbo"] >= best.get("elbo", -math.inf):
            best.update(info["pieces"])
        recent[id(given)] = (given, info["evaluated"], info["update"])
        while len(recent) > 4:
            del recent[next(iter(recent))]
        return info["elbo"]

    def replay(st: CVIState, kept: tuple[torch.Tensor, torch.Tensor]) -> bool:
        # the sites went back to ``kept``: step from them at the halved step size with the gradients of their own
        # evaluation (update_sites is all a step does after evaluating), when that evaluation is still at hand
        held = recent.get(id(kept[0]))
        if held is None or held[0] is not kept[0]:
            return False
        (lam1, lam2), (g1, g2, m, cap) = held[1], held[2]
        st.lam1, st.lam2 = sites.update_sites(lam1, lam2, g1, g2, steps.beta_at(cvi, st), st.counters, cap,
                                              cvi.invalid, m=m)
        return True

    return monotone_run(inner, step, tol=tol, max_steps=max_steps, anderson=anderson, weights=model.weights,
                        replay=replay)


def profiled_objective(cvi: Any, model: Any, theta: torch.Tensor, lam1: torch.Tensor, lam2: torch.Tensor,
                       counters: dict[str, float], *, tol: float, max_steps: int, anderson: int = 0,
                       prior: Any = None, work: list[Any] | None = None, evaluated: dict[str, Any] | None = None
                       ) -> tuple[CVIState, float, torch.Tensor | None]:
    r"""One evaluation of the profiled objective :math:`F(\theta) + \log p(\theta)`: :func:`converge_sites` from
    ``lam1``, ``lam2``, then the bound and its gradient in :math:`\theta` with the sites held fixed
    (:func:`theta_objective`) at the **best sites the run evaluated**;
    returns ``(state, value, gradient)`` (``(state, -inf, None)`` where it cannot be evaluated); the state holds
    the sites the run ended at (one CVI step past those), the warm start of the next evaluation.

    Using the best evaluated sites saves the factorisation, marginals and expectations of the end sites. Both sets
    of sites are within the run's ``tol`` of the fixed point, where the gradient with the sites held fixed is :math:`dF/d\theta` (the
    envelope theorem); the accepted bound of a monotone run is never below the one the run started from.
    ``work``: the buffers of :func:`converge_sites`, kept by the caller across evaluations. ``evaluated``: a dict
    that receives those best sites' pieces (:func:`gpvi.inference.cvi.steps.full_step`'s ``info["pieces"]``: the
    sites, their factor, marginals and bound; the factor in ``work``'s buffers, valid until the next call with them).
    """
    best: dict[str, Any] = {} if evaluated is None else evaluated
    best.clear()
    inner = converge_sites(cvi, model, theta, lam1, lam2, counters, tol=tol, max_steps=max_steps,
                           anderson=anderson, best=best, work=work)
    val, grad = theta_objective(cvi, model, inner.lam1, inner.lam2, theta, prior, evaluated=best or None)
    return inner, val, grad


def secant_step(pairs: list[tuple[float, torch.Tensor, torch.Tensor]]) -> float | None:
    r""":math:`\gamma = -s^\top y / y^\top y` from the two points of highest value among ``pairs``
    (``(value, theta, gradient)`` of a maximised objective): :math:`s` the difference of their thetas, :math:`y` of
    their gradients; the step :math:`\theta + \gamma g` is a Newton step along :math:`s` (L-BFGS's initial
    inverse-Hessian scale). ``None`` with fewer than two finite points, or where the pair shows no curvature of a
    maximum (:math:`s^\top y \ge 0`)."""
    ok = [p for p in pairs if math.isfinite(p[0])]
    if len(ok) < 2:
        return None
    (_, ta, ga), (_, tb, gb) = sorted(ok, key=lambda p: -p[0])[:2]
    s, y = ta - tb, ga - gb
    sy, yy = float(s @ y), float(y @ y)
    if not (sy < 0.0 and yy > 0.0 and math.isfinite(sy / yy)):
        return None
    return -sy / yy


def trial_tol(pairs: list[tuple[float, torch.Tensor, torch.Tensor]], theta: torch.Tensor, tol: float,
              ratio: float, cap: float) -> float:
    r"""The inner runs' tolerance at a trial ``theta``: ``ratio`` times the first-order change
    :math:`\lVert g\rVert\,\lVert\theta - \theta_b\rVert` from the best point so far of ``pairs`` (``(value, theta,
    gradient)``), relative to :math:`\max(1, |F_b|)`, within ``[tol, cap]``; ``cap`` before any point.

    L-BFGS-B compares the values of its trial points and builds its model from their gradients; an inner run stopped
    at a relative change of ``tol`` gives a value low by about that much (the run is monotone in the bound) and a
    gradient off by the sites' residual. Where the trial point's expected change is many times that error the
    comparison and the step are the same, so the run can stop earlier: the coarse phase of
    :class:`~gpvi.inference.cvi.typeii.TypeII` (``coarse_adaptive``), whose first points are tens of nats apart.
    Near the optimum the expected change, and with it the tolerance, falls back to ``tol``.

    >>> g = torch.tensor([30.0, 40.0], dtype=torch.float64)
    >>> pairs = [(-500.0, torch.zeros(2, dtype=torch.float64), g)]
    >>> trial_tol(pairs, torch.tensor([0.0, 0.5], dtype=torch.float64), 1e-6, 1e-2, 1e-3)   # 50 * 0.5 / 500 / 100
    0.0005
    >>> near = torch.tensor([0.0, 1e-3], dtype=torch.float64)
    >>> trial_tol(pairs, near, 1e-6, 1e-2, 1e-3), trial_tol([], near, 1e-6, 1e-2, 1e-3)
    (1e-06, 0.001)
    """
    ok = [p for p in pairs if math.isfinite(p[0])]
    if not ok:
        return max(tol, cap)
    val, th, g = max(ok, key=lambda p: p[0])
    change = float(g.norm()) * float((theta.to(th) - th).norm())
    return min(max(tol, ratio * change / max(1.0, abs(val))), max(tol, cap))


def monotone_run(inner: Any, step: Callable[[Any], float], *, tol: float, max_steps: int, anderson: int = 0,
                 weights: torch.Tensor | None = None,
                 replay: Callable[[Any, tuple[torch.Tensor, torch.Tensor]], bool] | None = None) -> Any:
    r"""The ELBO-monotone loop of :func:`converge_sites`.

    ``step(inner)`` evaluates the bound of ``inner``'s sites, then updates them in place and returns that bound.
    A step whose bound is lower than the last accepted one is undone (the sites go back to the last accepted
    point, ``inner.beta_scale`` halves, ``inner.counters["inner_backtracks"]`` counts it); each accepted step
    multiplies ``beta_scale`` by 1.5, up to 1. Ends when the relative change is at most ``tol`` or after
    ``max_steps`` steps (undone ones count); returns ``inner``.

    ``anderson`` > 0: Anderson acceleration with that memory (:class:`gpvi.numerics.anderson.Anderson`) of the
    damped CVI map :math:`G`: after an accepted step the next sites are the extrapolation of the last
    ``anderson + 1`` pairs :math:`(x, G(x))` of accepted sites (flattened :math:`\tilde\lambda_1, \tilde\lambda_2`)
    instead of :math:`G(x)`, when it keeps every :math:`\tilde\lambda_2 < 0`. The bound still never goes down: an
    extrapolation whose bound is below the last accepted one is replaced by :math:`G` of the accepted sites (kept
    from that step; no halving, no step lost beyond the one that evaluated it) and the history starts again; a
    plain step that goes down is undone as above. The run ends at :math:`G` of its last accepted sites, as without
    acceleration. ``inner.counters["inner_extrapolations_rejected"]`` counts the replaced extrapolations.

    ``weights`` (the model's likelihood weights :math:`w_n`, shape ``(N,)``): Anderson's least squares measure the
    sites of row :math:`n` scaled by :math:`w_n^{-1/2}`, so that a row of weight :math:`w_n` (site
    :math:`w_n\tilde\lambda`) counts as :math:`w_n` repeated rows (sites :math:`\tilde\lambda` each) do; rows of
    weight 0 (empty sites) take the plain step. An integer weight then gives the extrapolations, and so the run, of
    the repeated rows.

    ``replay(inner, kept)``: after an undone step (sites back at ``kept``, ``beta_scale`` halved), set ``inner``'s
    sites to the step from ``kept`` at the new step size without evaluating ``kept`` again and return True (False:
    the next ``step`` evaluates them, as without it). Evaluating them again would give their known bound and the
    same gradients: :func:`converge_sites` keeps those of the step before the last one and saves that factorisation
    (``inner.counters["inner_replays"]`` counts them; the replayed step is not one of ``max_steps``).
    """
    counters = inner.counters
    prev = math.nan                       # the ELBO of the last accepted sites ...
    keep = (inner.lam1, inner.lam2)       # ... and those sites
    plain = None                          # G(keep): where a rejected extrapolation goes instead
    redo = False
    extrapolated = False                  # the current sites are an extrapolation, not G of accepted sites
    acc = Anderson(anderson) if anderson > 0 else None
    scale = None                          # per flattened site: w_n^(-1/2), 0 for weight 0
    if acc is not None and weights is not None:
        w = weights.to(inner.lam1).reshape(-1, *([1] * (inner.lam1.dim() - 1)))
        d = torch.where(w > 0, w.rsqrt(), torch.zeros_like(w))
        scale = torch.cat([d.expand_as(inner.lam1).reshape(-1), d.expand_as(inner.lam2).reshape(-1)])
    for _ in range(max_steps):
        here = (inner.lam1, inner.lam2)
        elbo = step(inner)
        if redo:                          # the ELBO of the restored sites is prev: nothing learned yet
            redo = False
            continue
        if math.isfinite(prev):
            if abs(elbo - prev) <= tol * max(1.0, abs(elbo)):
                if extrapolated and elbo < prev:   # end at G of accepted sites, as a plain run does
                    inner.lam1, inner.lam2 = plain
                break
            if elbo < prev:
                if extrapolated:          # the extrapolation went down: take the plain step instead
                    inner.lam1, inner.lam2 = plain
                    extrapolated = False
                    acc.clear()
                    counters["inner_extrapolations_rejected"] = counters.get("inner_extrapolations_rejected", 0) + 1
                    continue
                inner.lam1, inner.lam2 = keep  # the last step went down: undo it, halve the step
                inner.beta_scale *= 0.5
                counters["inner_backtracks"] = counters.get("inner_backtracks", 0) + 1
                redo = replay is None or not replay(inner, keep)
                if not redo:
                    counters["inner_replays"] = counters.get("inner_replays", 0) + 1
                if acc is not None:
                    acc.clear()
                continue
        prev, keep = elbo, here
        inner.beta_scale = min(1.0, 1.5 * inner.beta_scale)
        extrapolated = False
        if acc is not None:
            plain = (inner.lam1, inner.lam2)
            x = torch.cat([here[0].reshape(-1), here[1].reshape(-1)])
            gx = torch.cat([plain[0].reshape(-1), plain[1].reshape(-1)])
            if scale is None:
                nxt = acc.step(x, gx)
            else:
                nxt = torch.where(scale > 0, acc.step(x * scale, gx * scale) / scale, gx)
            n1, n2 = nxt[:here[0].numel()].view_as(here[0]), nxt[here[0].numel():].view_as(here[1])
            if len(acc.r) > 1 and bool(torch.isfinite(nxt).all()) and bool((n2 < 0).all()):
                inner.lam1, inner.lam2 = n1, n2
                extrapolated = True
    return inner


def theta_objective(cvi: Any, model: Any, lam1: torch.Tensor, lam2: torch.Tensor, theta: torch.Tensor,
                    prior: Any = None, *, evaluated: dict[str, Any] | None = None
                    ) -> tuple[float, torch.Tensor | None]:
    r"""The bound at ``theta`` with the sites held fixed, plus :math:`\log p(\theta)` when ``prior`` is given, and
    its gradient in ``theta``. ``(-inf, None)`` when a factorisation fails or the value is not finite.

    :math:`\partial\mathcal L/\partial K` is the closed form of the module docstring
    (:func:`gpvi.numerics.sites.kernel_gradient`); K latent functions share :math:`K_\theta`, so it is
    :math:`\sum_k G_k` over their factors (:func:`gpvi.numerics.sites.kernel_gradient_summed`, which returns a
    matrix with the same contraction against the symmetric :math:`K_\theta`). It is pushed through
    :math:`K(\theta)` by the model's :meth:`~gpvi.models.classification.LatentGP.kernel_vjp` (autograd's backward,
    from the cached kernel matrix on the fast path; the same gradient as autograd through the Cholesky factors and
    the marginals, to 2e-15 relative, at half the cost).

    ``evaluated``: the ``info["pieces"]`` of a :func:`gpvi.inference.cvi.steps.full_step` at this ``theta`` (its bound, the sites it
    evaluated, their factors, marginals and expectations). Then ``lam1``, ``lam2`` are ignored and nothing is
    factorised or integrated again: the value and gradient are those of the sites that step evaluated.
    """
    K = model.kernel_matrix(theta.detach())
    if evaluated is not None:
        lam1, lam2, L, m, alpha, ex = (evaluated[k] for k in ("lam1", "lam2", "L", "m", "alpha", "ex"))
        P, Linv = evaluated.get("P"), evaluated.get("Linv")
        val = torch.as_tensor(evaluated["elbo"], dtype=K.dtype, device=K.device)
    else:
        ytilde, s = sites.pseudo_data(lam1, lam2)
        try:
            L, _ = sites.site_factor(K, s, theta.detach())
        except NotPSDError:
            return -math.inf, None
        m, v, alpha, P = sites.marginals(K, L, ytilde, keep_precision=True)
        Linv = None
        ex = steps.expectations(cvi, model, m, v, None, cvi.elbo_method)
        val = sites.site_elbo(ex.value.sum(), lam1, lam2, m, v, L, alpha)
    if not bool(torch.isfinite(val)):
        return -math.inf, None
    G = sites.kernel_gradient_summed(L, _cols(lam1), _cols(lam2), _cols(m), alpha, _cols(ex.dm), _cols(ex.dv), Linv, P=P)
    grad = model.kernel_vjp(theta, G)           # from the kernel matrix of the inner run, not built again
    if prior is not None:
        th = theta.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            lp = prior_log_prob(prior, th)
            grad = grad + torch.autograd.grad(lp, th)[0]
        val = val + lp.detach()
    value = float(val)
    if not math.isfinite(value) or not bool(torch.isfinite(grad).all()):
        return -math.inf, None
    return value, grad.detach()


def inner_quadrature(num_classes: int) -> Quadrature:
    r"""The cheaper softmax rule of :class:`~gpvi.inference.cvi.typeii.TypeII`'s inner runs: 28 asinh-mapped
    Gauss-Legendre nodes per dimension on a window of 6 sd (784 per site at K = 3, against 1600 for
    :func:`gpvi.numerics.softmax_rules.default_quadrature`). Largest error in :math:`E_n` and its derivatives
    against a 200-node rule: 6e-6 on iris sites at the MAP-II optimum (2e-6 in the sum over sites); 2e-4 (value), 8e-4
    (:math:`\partial_m`), 6e-5 (:math:`\partial_v`) for means of sd 4 and per-class variances 0.1..10 (the
    1600-node rule: 1.4e-6, 1.6e-5, 4.9e-6)."""
    return Quadrature(28, width=6.0) if num_classes >= 3 else default_quadrature(num_classes)
