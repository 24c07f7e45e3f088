r"""The one L-BFGS-B wrapper: SciPy's optimiser on a float64 torch objective, maximised.

ML-II and MAP restarts (:class:`gpvi.ML2`), the deterministic Gaussian bound of Bayesian logistic regression
(:func:`gpvi.inference.quadrature_fit.fit_gaussian_quadrature`) and the type-II phases of CVI
(:mod:`gpvi.inference.cvi.typeii`) all maximise a smooth function of a float64 vector with SciPy's L-BFGS-B
(Byrd, Lu, Nocedal & Zhu 1995) and the exact gradient. :func:`lbfgs_maximise` is the shared code: conversion
between NumPy (SciPy's side) and torch, the gradient by autograd or from the objective itself, an optional box on
every component, and one rule for points where the objective cannot be evaluated -- an exception listed in
``catch`` (by default :class:`~gpvi.exceptions.NotPSDError`, a failed Cholesky) or a non-finite value or
gradient makes the point count as :math:`-\infty` (gradient 0), so the line search backs off instead of failing.
A ``KeyboardInterrupt`` during the run keeps the best point evaluated so far (:class:`LBFGSInterrupted`).

Names: ``fn`` is the objective :math:`f`, ``x0`` the start, ``bounds`` the box ``(low, high)`` applied to every
component, ``max_iter``, ``gtol``, ``ftol`` and ``history`` SciPy's ``maxiter``, ``gtol``, ``ftol`` and ``maxcor``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..exceptions import NotPSDError, advice
from ..validation import check_interval, check_positive, check_positive_int

__all__ = ["lbfgs_maximise", "LBFGSResult", "LBFGSInterrupted"]


@dataclass(frozen=True)
class LBFGSResult:
    """What :func:`lbfgs_maximise` found.

    Attributes
    ----------
    x : torch.Tensor of shape (D,)
        SciPy's final point (float64, on the device the objective was evaluated on).
    value : float
        :math:`f(x)` as SciPy last saw it (``-inf`` when the final point could not be evaluated).
    iterations, evaluations : int
        L-BFGS-B iterations and objective evaluations.
    converged : bool
        SciPy's ``success`` flag, and False when the final point could not be evaluated (SciPy reports success
        there, the gradient being 0 by the failure rule); ``message`` SciPy's reason for stopping.
    """

    x: torch.Tensor
    value: float
    iterations: int
    evaluations: int
    converged: bool
    message: str


class LBFGSInterrupted(KeyboardInterrupt):
    """A ``KeyboardInterrupt`` (Ctrl-C, or SIGINT from a scheduler) that arrived while :func:`lbfgs_maximise` ran,
    carrying what it had found: ``result``, an :class:`LBFGSResult` at the best point evaluated so far
    (``converged`` False, ``message`` ``"interrupted"``). A caller that does not catch it sees a plain
    ``KeyboardInterrupt``; :class:`gpvi.ML2` catches it and keeps the partial restart."""

    def __init__(self, result: LBFGSResult) -> None:
        super().__init__(f"L-BFGS-B interrupted after {result.iterations} iterations, {result.evaluations} "
                         f"evaluations (best value {result.value:.6g})")
        self.result = result


def lbfgs_maximise(fn: Callable[[torch.Tensor], Any], x0: Any, *, bounds: tuple[Any, Any] | None = None,
                   max_iter: int = 1000, gtol: float = 1e-7, ftol: float = 1e-12, history: int = 10,
                   returns_grad: bool = False, catch: tuple[type[BaseException], ...] = (NotPSDError,),
                   ignore_warnings: tuple[type[Warning], ...] = (), device: torch.device | str | None = None
                   ) -> LBFGSResult:
    r"""Maximise ``fn`` with SciPy's L-BFGS-B from ``x0``.

    .. math::

        \hat x = \arg\max_{x \in [\text{low}, \text{high}]^D} f(x)

    Parameters
    ----------
    fn : callable
        ``fn(x)`` for a float64 tensor ``x`` of shape ``(D,)``. With ``returns_grad=False`` (default) it returns a
        scalar tensor and the gradient is taken by autograd (``x`` requires grad); with ``returns_grad=True`` it
        returns ``(value, gradient)`` (a float or scalar tensor, and a ``(D,)`` tensor).
    x0 : array-like of shape (D,)
        The start (clipped into ``bounds``).
    bounds : tuple, optional
        ``(low, high)``: two numbers, the same box for every component, or two ``(D,)`` vectors, one box per
        component (e.g. :meth:`gpvi.models.classification.LatentGP.theta_box`); ``None``: unconstrained.
    max_iter : int
        L-BFGS-B iterations (SciPy's ``maxiter``).
    gtol, ftol : float
        SciPy's tolerances on the projected gradient and on the relative decrease of the objective.
    history : int
        Number of correction pairs kept (SciPy's ``maxcor``).
    returns_grad : bool
        Whether ``fn`` returns its own gradient.
    catch : tuple of exception types
        Exceptions that make a point count as :math:`-\infty` instead of propagating.
    ignore_warnings : tuple of warning categories
        Warnings silenced while the optimiser runs (e.g. ``RuntimeWarning`` from SciPy's line search).
    device : torch.device or str, optional
        Where ``fn`` receives ``x`` (default: the device of ``x0`` when it is a tensor, else the CPU).

    Returns
    -------
    LBFGSResult

    Raises
    ------
    ValueError
        ``bounds`` is not ``(low, high)`` with ``low < high`` (componentwise for vectors of ``x0``'s length), or
        ``x0`` is not a finite vector.
    LBFGSInterrupted
        On a ``KeyboardInterrupt`` after at least one point was evaluated: the best point so far is in its
        ``result`` (before any evaluation the plain ``KeyboardInterrupt`` goes on up).

    Examples
    --------
    >>> import torch
    >>> res = lbfgs_maximise(lambda x: -((x - 3.0) ** 2).sum(), torch.zeros(2, dtype=torch.float64))
    >>> [round(v, 6) for v in res.x.tolist()], res.converged
    ([3.0, 3.0], True)
    """
    from scipy.optimize import minimize                 # imported on use: ~0.1 s that import gpvi need not pay

    max_iter = check_positive_int(max_iter, "max_iter")
    gtol = check_positive(gtol, "gtol")
    ftol = check_positive(ftol, "ftol")
    history = check_positive_int(history, "history")
    if device is None:
        device = x0.device if isinstance(x0, torch.Tensor) else torch.device("cpu")
    start = (x0.detach().cpu().numpy() if isinstance(x0, torch.Tensor) else np.asarray(x0)).astype(np.float64)
    if start.ndim != 1 or not np.isfinite(start).all():
        raise ValueError(f"x0 must be a finite 1-D vector; got shape {start.shape}")
    box = None
    if bounds is not None:
        lo, hi = _box(bounds, start.shape[0])
        start = np.clip(start, lo, hi)
        box = list(zip(lo.tolist(), hi.tolist()))

    best: dict[str, Any] = {"value": -math.inf, "x": None, "evaluations": 0, "iterations": 0}

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        neg, g = _evaluate(x)
        best["evaluations"] += 1
        if -neg > best["value"]:
            best.update(value=-neg, x=x.copy())
        return neg, g

    def _evaluate(x: np.ndarray) -> tuple[float, np.ndarray]:
        xt = torch.tensor(x, dtype=torch.float64, device=device, requires_grad=not returns_grad)
        try:
            if returns_grad:
                val, grad = fn(xt)
                val = float(val)
            else:
                out = fn(xt)
                if not bool(torch.isfinite(out)):
                    return math.inf, np.zeros_like(x)
                (grad,) = torch.autograd.grad(out, xt)
                val = float(out.detach())
        except catch:
            return math.inf, np.zeros_like(x)
        g = grad.detach().cpu().numpy().astype(np.float64)
        if not math.isfinite(val) or not np.isfinite(g).all():
            return math.inf, np.zeros_like(x)
        return -val, -g

    with warnings.catch_warnings():
        for category in ignore_warnings:
            warnings.simplefilter("ignore", category)
        try:
            res = minimize(fun, start, jac=True, method="L-BFGS-B", bounds=box,
                           callback=lambda *_: best.__setitem__("iterations", best["iterations"] + 1),
                           options={"maxiter": max_iter, "gtol": gtol, "ftol": ftol, "maxcor": history})
        except KeyboardInterrupt:
            if best["x"] is None:
                raise
            raise LBFGSInterrupted(LBFGSResult(torch.tensor(best["x"], dtype=torch.float64, device=device),
                                               best["value"], best["iterations"], best["evaluations"], False,
                                               "interrupted")) from None
    value = -float(res.fun) if np.isfinite(res.fun) else -math.inf
    return LBFGSResult(torch.tensor(res.x, dtype=torch.float64, device=device), value, int(res.nit),
                       int(res.nfev), bool(res.success) and math.isfinite(value), str(res.message))


def _float64(x: Any) -> np.ndarray:
    """A number, array or tensor (any device) as a float64 numpy array."""
    return np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x, dtype=np.float64)


def _box(bounds: Any, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """``bounds`` as two ``(dim,)`` float64 arrays: a pair of numbers (checked by ``check_interval``) or a pair of
    vectors of length ``dim`` with finite ``low < high`` componentwise."""
    if isinstance(bounds, (str, bytes)) or not hasattr(bounds, "__len__") or len(bounds) != 2:
        raise TypeError(f"bounds must be a pair (low, high); got {bounds!r}")
    if all(np.ndim(b) == 0 for b in bounds):
        lo, hi = check_interval(bounds, "bounds")
        return np.full(dim, lo), np.full(dim, hi)
    lo, hi = (_float64(b) for b in bounds)
    if lo.shape != (dim,) or hi.shape != (dim,):
        raise ValueError(f"bounds vectors must have shape ({dim},) like x0; got {lo.shape} and {hi.shape}")
    if not (np.isfinite(lo).all() and np.isfinite(hi).all() and (lo < hi).all()):
        raise ValueError("bounds must be finite with low < high in every component")
    return lo, hi


def ends_on_box(theta: Any, low: Any, high: Any, names: list[str], *, tol: float = 1e-6) -> dict[str, str]:
    """``{name: "lower" | "upper"}`` for the components of ``theta`` within ``tol`` of the box ``[low, high]``
    (numbers, or one bound per component)."""
    th = _float64(theta)
    lo, hi = (np.broadcast_to(_float64(b), th.shape) for b in (low, high))
    out = {}
    for name, v, a, b in zip(names, th.tolist(), lo.tolist(), hi.tolist()):
        if v <= a + tol:
            out[name] = "lower"
        elif v >= b - tol:
            out[name] = "upper"
    return out


def box_message(at_bound: dict[str, str], bounds: tuple[float, float], what: str, *, setting: str = "bounds",
                relative: bool = False, centre: dict[str, float] | None = None) -> str:
    """The text of the :class:`~gpvi.exceptions.BoundWarning` for the components in ``at_bound`` (from
    :func:`ends_on_box`) of a point estimate ``what`` ("ML-II", "MAP", ...) searched in ``bounds`` (the argument
    ``setting``); ``relative``: the lengthscales' box is in units of var(x_j) (the classifiers' type-II loops);
    ``centre``: ``{name: c}``, the box of that component is ``c + bounds`` (ML-II's box around the data's scale). The
    text ends with the advice on ``"bound"`` of the layer that runs the search (:func:`gpvi.exceptions.advice`);
    by default: see ``info['at_bound']``, widen ``setting=``."""
    unit = " sd(x_j)" if relative or centre is not None else ""
    parts = []
    irrelevant = [n for n, side in at_bound.items() if side == "upper" and "lengthscale" in n]
    if irrelevant:
        cols = [n[n.index("[") + 1:-1] if n.endswith("]") and "[" in n else n for n in irrelevant]
        parts.append(f"{len(cols)} lengthscale(s) at the upper bound {bounds[1]:g} (lengthscale "
                     f"{math.exp(bounds[1] / 2):.3g}{unit}): the fit does not depend on input(s) {', '.join(cols)} "
                     "(irrelevant inputs)")
    for name, side in at_bound.items():
        if name not in irrelevant:
            value = bounds[0] if side == "lower" else bounds[1]
            shift = " + log var(x_j)" if relative and "lengthscale" in name else ""
            if centre is not None and name in centre:
                value, shift = value + centre[name], f" ({value:+g} around the data's scale, {centre[name]:.4g})"
            parts.append(f"{name} sits at the {side} bound {value:g}{shift} of the search box (the objective still "
                         f"improves beyond it)")
    tail = advice("bound", f"see info['at_bound'] (widen {setting}= to search further)")
    return f"{what}: " + "; ".join(parts) + f"; {tail}"
