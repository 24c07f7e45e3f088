r"""Init strategies: where an engine starts, as values (after NumPyro's ``init_to_median``, ``init_to_value``).

An engine never runs another engine to find its start: ``engine.run(target, init=...)`` hands ``init`` to
:func:`resolve_init`, which turns it into a strategy; the driver calls the strategy once and gives the engine the
resulting :class:`Start`. A strategy is any callable ``strategy(target) -> Start``:

* :func:`init_to_value` -- a given :math:`\theta` (and optionally a scale);
* :func:`init_to_posterior` -- an earlier posterior (a point's :math:`\theta`; a Gaussian's mean and scale);
* :func:`init_to_default` -- the target's data-scaled ``initial_theta()``, or zeros;
* :func:`init_to_map` -- the MAP by :class:`gpvi.ML2` with ``prior=True`` (L-BFGS-B from seeded restarts);
* :func:`init_to_ml2` -- the type-II maximum likelihood point (``prior=False``);
* :func:`init_to_laplace` -- another strategy's point with the Laplace scale
  :math:`C_0 = \operatorname{chol}((-\nabla^2\log g(\hat\theta))^{-1})` (Hessian by central differences);
* :func:`init_to_prior_draw` -- a seeded draw from the target's prior.

:func:`laplace_scale` is the one place that turns a Hessian into a scale (the Laplace approximation as a posterior
is :func:`gpvi.inference.laplace.laplace_approximation`). Every engine's ``init`` takes its start through
:func:`start_point` (a :class:`Start` as it is, anything else through the strategy ``run(init=...)`` would use,
checked against D), and refuses a start where the log joint cannot be evaluated with :func:`check_start`.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from ..exceptions import InterruptedRunWarning, NumericalWarning
from ..linalg import cholesky_plain
from ..models.target import as_target, is_minibatch_target, target_device
from ..numerics.budget import MemoryBudget
from ..posteriors.base import Posterior
from ..validation import as_float_tensor, check_positive, check_positive_int
from .derivatives import finite_difference_hessian, log_joint_and_grad
from .ml2 import ML2, _check_scales, distinct_optima

__all__ = ["Start", "resolve_init", "find_start", "start_point", "check_start", "init_to_value", "init_to_posterior",
           "init_to_default", "init_to_map", "init_to_ml2", "init_to_laplace", "init_to_prior_draw",
           "laplace_scale", "laplace_scale_at", "check_laplace_possible", "LAPLACE_MAX_DIM", "on_target_device"]

LAPLACE_MAX_DIM = 200
"""Largest D for which a Laplace scale is built by finite differences (2D gradient evaluations)."""


@dataclass(frozen=True)
class Start:
    r"""Where a run starts.

    Attributes
    ----------
    theta : torch.Tensor of shape (D,)
        The starting point (an engine's initial mean).
    scale_tril : torch.Tensor of shape (D, D) or (D,), or None
        A lower-triangular starting scale (a (D,) vector: a diagonal one), when the strategy provides one.
    scale_source : {"posterior", "laplace", "given", None}
        Where ``scale_tril`` comes from: a warm start from a Gaussian posterior is kept by every engine; a Laplace
        or given scale gives way to an engine's explicit ``init_scale``.
    info : dict
        How the start was found (``mean``: "given", "initial_theta", "zeros", "map", "ml2", "prior_draw";
        ``scale``; times, the MAP's value and warnings).
    alternatives : tuple of Start
        Further starts at *other* optima found by the same strategy (:func:`init_to_map` with ``max_starts > 1``),
        best first. An engine's ``init`` starts from ``theta`` alone; an engine that can use several starts
        (:meth:`gpvi.DSVI.run`) runs one fit from each and keeps the best.
    """

    theta: torch.Tensor
    scale_tril: torch.Tensor | None = None
    scale_source: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    alternatives: tuple[Start, ...] = ()


def _point(theta: Any, D: int, name: str) -> torch.Tensor:
    t = as_float_tensor(theta, name, ndim=1).detach()
    if t.shape != (D,):
        raise ValueError(f"{name} must have length D = {D}; got shape {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains non-finite values")
    return t.to(torch.float64).clone()


def _scale(scale: Any, D: int, name: str) -> torch.Tensor:
    s = as_float_tensor(scale, name, ndim=2).detach().to(torch.float64)
    if s.shape != (D, D):
        raise ValueError(f"{name} must be ({D}, {D}); got {tuple(s.shape)}")
    return s.clone()


class init_to_value:  # noqa: N801 - strategies read as functions, as in NumPyro
    """Start at a given ``theta`` (and, optionally, a given lower-triangular ``scale_tril``)."""

    def __init__(self, theta: Any, scale_tril: Any = None) -> None:
        self.theta = theta
        self.scale_tril = scale_tril

    def __call__(self, target: Any) -> Start:
        D = len(as_target(target).names)
        scale = None if self.scale_tril is None else _scale(self.scale_tril, D, "scale_tril")
        return Start(_point(self.theta, D, "init"), scale, None if scale is None else "given", {"mean": "given"})

    def __repr__(self) -> str:
        return "init_to_value(...)"


class init_to_posterior:  # noqa: N801
    """Start from an earlier posterior: a point's ``theta``, a Gaussian's mean and scale (a warm start), or a
    :class:`~gpvi.posteriors.mixture.GaussianMixture`'s mean and the Cholesky factor of its covariance (the Gaussian
    with the mixture's first two moments: it spans all of the mixture's basins)."""

    def __init__(self, posterior: Any) -> None:
        self.posterior = posterior

    def __call__(self, target: Any) -> Start:
        D = len(as_target(target).names)
        post = self.posterior
        if getattr(post, "dim", D) != D:
            raise ValueError(f"init (a {type(post).__name__}) has dimension {post.dim} but the target has D = {D}")
        if hasattr(post, "components") and hasattr(post, "scale_tril"):   # a GaussianMixture: its moments
            return Start(_point(post.mean, D, "init"), _scale(post.scale_tril, D, "init.scale_tril"), "posterior",
                         {"mean": "mixture mean", "scale": "mixture covariance"})
        storage = getattr(post, "storage", None)
        if storage is not None:                 # a Gaussian posterior: keep a diagonal scale as its (D,) vector
            scale = post.scale_diag.detach().to(torch.float64).clone() if storage == "diag" else \
                _scale(post.scale_tril, D, "init.scale_tril")
            return Start(_point(post.mean, D, "init"), scale, "posterior", {"mean": "given", "scale": "given"})
        if hasattr(post, "theta"):
            return Start(_point(post.theta, D, "init"), info={"mean": "given"})
        raise TypeError(f"init must be a PointPosterior or a GaussianPosterior; got {type(post).__name__}")


class init_to_default:  # noqa: N801
    """Start at ``target.initial_theta()`` when the target offers it (a data-scaled guess), else at zeros."""

    def __call__(self, target: Any) -> Start:
        D = len(as_target(target).names)
        if callable(getattr(target, "initial_theta", None)):
            theta = torch.as_tensor(target.initial_theta()).detach().to(torch.float64).cpu()
            return Start(_point(theta, D, "target.initial_theta()"), info={"mean": "initial_theta"})
        return Start(torch.zeros(D, dtype=torch.float64), info={"mean": "zeros"})

    def __repr__(self) -> str:
        return "init_to_default()"


class init_to_map:  # noqa: N801
    """Start at the MAP (``prior=True``) or the type-II ML point: :class:`gpvi.ML2` from seeded restarts.

    ML-II's warnings are recorded in ``info["map_warnings"]`` rather than raised (the point is only a start),
    except Ctrl-C: restarts ended by it give the best point so far (the first starting point when no restart
    ended), no alternatives, ``info["interrupted"] = "map"`` and an
    :class:`~gpvi.exceptions.InterruptedRunWarning`; an engine run from such a start takes no step.

    A restart stops when it comes within ``theta_tol / 2`` of an earlier one's end (``gpvi.ML2(join_tol=...)``).

    With ``max_starts > 1`` the restarts' end points are grouped into *distinct optima*: two end points are the
    same optimum when every component of theta differs by at most ``theta_tol`` (log scale: 0.1 is a 10% change
    of a lengthscale or variance). Each optimum is represented by its best restart (ties as in
    :class:`gpvi.ML2`); the best is the start, up to ``max_starts - 1`` others (by objective value) are
    ``Start.alternatives``. ``info["optima"]`` lists every optimum found (value, restarts, representative).

    Parameters
    ----------
    num_restarts : int
    seed : int
        Seed of the restarts.
    prior : bool
        True: maximise the log joint (MAP); False: the log marginal likelihood (ML-II).
    max_starts : int
        Most distinct optima returned (>= 1; 1: the best only, no alternatives).
    theta_tol : float
        Largest componentwise difference (> 0) of two end points of the same optimum.
    init_scale : float or sequence of float
        Standard deviation of the restarts' perturbations of the first start (``gpvi.ML2(init_scale=...)``: a
        sequence is cycled over the restarts; default 1).
    """

    def __init__(self, num_restarts: int = 1, *, seed: int = 0, prior: bool = True, max_starts: int = 1,
                 theta_tol: float = 0.1, init_scale: float | tuple[float, ...] = 1.0) -> None:
        self.num_restarts = check_positive_int(num_restarts, "num_restarts")
        self.seed = seed
        self.prior = bool(prior)
        self.max_starts = check_positive_int(max_starts, "max_starts")
        self.theta_tol = check_positive(theta_tol, "theta_tol")
        self.init_scale = _check_scales(init_scale)

    def __call__(self, target: Any) -> Start:
        as_target(target)
        t0 = time.perf_counter()
        ml2 = ML2(num_restarts=self.num_restarts, prior=self.prior, seed=self.seed, init_scale=self.init_scale,
                  join_tol=0.5 * self.theta_tol)                # a restart that joins a known optimum stops
        fit = None
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            try:
                fit = ml2.run(target)
            except KeyboardInterrupt:                       # Ctrl-C before the first restart ended
                pass
        mode = "map" if self.prior else "ml2"
        info: dict[str, Any] = {"mode": mode, "mean": mode, "map_time_s": time.perf_counter() - t0,
                                "map_warnings": sorted({f"{w.category.__name__}: {w.message}" for w in rec
                                                        if not issubclass(w.category, InterruptedRunWarning)})}
        if fit is None or fit.info.get("interrupted"):
            return self._interrupted(target, ml2, fit, info)
        info["map_value"] = fit.value
        theta = fit.theta.detach().to(torch.float64).cpu().clone()
        if self.max_starts == 1 or self.num_restarts == 1:
            return Start(theta, info=info)
        optima = distinct_optima(fit.info["records"], self.theta_tol, ml2._choose)
        info["optima"] = [{"value": o["value"], "restarts": o["restarts"], "restart": o["restart"]} for o in optima]
        alternatives = []
        for o in optima[1:self.max_starts]:
            alt_info = {**info, "map_value": o["value"], "map_restart": o["restart"]}
            alternatives.append(Start(o["theta"].detach().to(torch.float64).cpu().clone(), info=alt_info))
        info["map_restart"] = optima[0]["restart"]
        return Start(theta, info=info, alternatives=tuple(alternatives))

    def _interrupted(self, target: Any, ml2: ML2, fit: Any, info: dict[str, Any]) -> Start:
        """Ctrl-C ended the restarts: the best end point so far (else the first starting point), flagged."""
        done = 0 if fit is None else len(fit.info["records"])
        if fit is None:
            theta = ml2.starting_points(target)[0]
            info.update(map_value=math.nan, mean="initial_theta")
        else:
            theta = fit.theta
            info["map_value"] = fit.value
        info.update(interrupted="map", map_restarts_done=done, scale="none (interrupted: no Laplace scale)")
        warnings.warn(f"init_to_map: the {'MAP' if self.prior else 'ML-II'} restarts were interrupted (Ctrl-C) after "
                      f"{done} of {self.num_restarts}; the start is the best point so far, flagged "
                      "(info['interrupted'] = 'map'), and a run from it takes no step", InterruptedRunWarning,
                      stacklevel=3)
        return Start(theta.detach().to(torch.float64).cpu().clone(), info=info)

    def __repr__(self) -> str:
        extra = f", max_starts={self.max_starts}" if self.max_starts > 1 else ""
        extra += f", init_scale={self.init_scale!r}" if self.init_scale != 1.0 else ""
        return f"init_to_map(num_restarts={self.num_restarts}, seed={self.seed}, prior={self.prior}{extra})"


def init_to_ml2(num_restarts: int = 1, *, seed: int = 0) -> init_to_map:
    """Start at the type-II maximum-likelihood point (:func:`init_to_map` with ``prior=False``)."""
    return init_to_map(num_restarts, seed=seed, prior=False)


def laplace_scale(H: torch.Tensor) -> tuple[torch.Tensor | None, str]:
    """The Laplace scale from a Hessian ``H`` of :math:`\\log g`.

    Returns ``(chol((-H)^-1), "laplace")`` when :math:`-H` is finite and positive definite; else
    ``(diag(1/sqrt(-H_dd)) with 0 where -H_dd <= 0, "laplace_diagonal")`` as a ``(D,)`` vector of *precisions*
    ``-H_dd`` (callers choose the scale of directions without curvature); ``(None, reason)`` when no diagonal
    entry is usable.
    """
    P = -H
    L, ok = cholesky_plain(torch.nan_to_num(P, nan=0.0, posinf=0.0, neginf=0.0))
    if bool(torch.isfinite(H).all()) and bool(ok):
        Pinv = torch.cholesky_inverse(L)      # C C^T = P^-1 with C lower triangular (symmetrised inverse)
        C, ok2 = cholesky_plain(0.5 * (Pinv + Pinv.T))
        if bool(ok2) and bool(torch.isfinite(C).all()):
            return C, "laplace"
    d = torch.nan_to_num(torch.diagonal(P), nan=0.0, posinf=0.0, neginf=0.0)
    if bool((d > 0).any()):
        return d, "laplace_diagonal"
    return None, "negative hessian has no positive diagonal entry"


def laplace_scale_at(target: Any, theta: torch.Tensor, *, fallback_scale: float = 0.1, step: float = 1e-4
                     ) -> tuple[torch.Tensor | None, dict[str, Any]]:
    """The ``(D, D)`` Laplace scale of ``target`` at ``theta`` (diagonal fallback), with a record of what was done.

    Returns ``(None, info)`` when no curvature is usable at all (``info["scale_reason"]`` says why).
    """
    t0 = time.perf_counter()
    dev = target_device(target)
    theta = theta if dev is None else theta.to(dev)
    chunk = MemoryBudget().draws_per_call(target, 32)       # the 2D gradient rows, cut by the memory budget
    H = finite_difference_hessian(target, theta, step=step, chunk=chunk)
    C, how = laplace_scale(H)
    info: dict[str, Any] = {"hessian_time_s": time.perf_counter() - t0, "hessian": H}
    if C is None:
        info["scale"], info["scale_reason"] = "fallback", how
        return None, info
    if C.dim() == 1:
        C = torch.diag(torch.where(C > 0, 1.0 / torch.sqrt(C.clamp_min(1e-300)), torch.full_like(C, fallback_scale)))
    info["scale"] = how
    return C, info


def check_laplace_possible(target: Any) -> None:
    """Raise ``ValueError`` unless a Laplace scale can be built: a full-data target with D <= LAPLACE_MAX_DIM."""
    D = len(target.names)
    if is_minibatch_target(target) or D > LAPLACE_MAX_DIM:
        raise ValueError(f"init='laplace' (a Laplace start) needs a full-data target with D <= {LAPLACE_MAX_DIM} "
                         f"(got {'a minibatch target' if is_minibatch_target(target) else f'D = {D}'})")


class init_to_laplace:  # noqa: N801
    """Start at another strategy's point (default: :func:`init_to_map`) with the Laplace scale there.

    Every alternative start (:attr:`Start.alternatives`) gets the Laplace scale at its own point, and each start
    records ``info["laplace_log_evidence"]`` = :math:`\\log g(\\hat\\theta) + \\tfrac12\\log\\det(2\\pi\\Sigma)`,
    the Laplace estimate of :math:`\\log p(y)` (also the Gaussian bound of the Laplace q when
    :math:`\\log g` is quadratic), where the scale is a full Laplace one. Ctrl-C while the point is found (its
    ``info["interrupted"]``) skips the Hessians; Ctrl-C during them returns the point without a scale or
    alternatives, ``info["interrupted"] = "laplace"``, with an :class:`~gpvi.exceptions.InterruptedRunWarning`.
    """

    def __init__(self, at: Callable[[Any], Start] | None = None) -> None:
        self.at = init_to_map() if at is None else at

    def __call__(self, target: Any) -> Start:
        check_laplace_possible(as_target(target))
        start = self.at(target)
        if start.info.get("interrupted"):                   # Ctrl-C while finding the point: no Hessian
            return start
        try:
            alternatives = tuple(self._scaled(target, s) for s in start.alternatives)
            return self._scaled(target, start, alternatives)
        except KeyboardInterrupt:
            warnings.warn("init_to_laplace: the Laplace scales were interrupted (Ctrl-C); the start is the point "
                          "without its scale or alternatives, flagged (info['interrupted'] = 'laplace'), and a run "
                          "from it takes no step", InterruptedRunWarning, stacklevel=2)
            return Start(start.theta, None, None, {**start.info, "interrupted": "laplace",
                                                   "scale": "none (interrupted: no Laplace scale)"})

    @staticmethod
    def _scaled(target: Any, start: Start, alternatives: tuple[Start, ...] = ()) -> Start:
        C, how = laplace_scale_at(target, start.theta)
        info = {**start.info, **{k: v for k, v in how.items() if k != "hessian"}}
        if C is None:
            warnings.warn(f"no Laplace scale at the initial mean ({how['scale_reason']}); the engine's init_scale "
                          "is used", NumericalWarning, stacklevel=4)
            info["scale"] = "init_scale (laplace failed: " + how["scale_reason"] + ")"
            return Start(start.theta, None, None, info, alternatives)
        value = info.get("map_value")
        if how["scale"] == "laplace" and value is not None and math.isfinite(value) and info.get("mode") == "map":
            D = C.shape[0]
            info["laplace_log_evidence"] = float(value) + 0.5 * D * math.log(2 * math.pi) + \
                float(torch.log(torch.diagonal(C)).sum())
        return Start(start.theta, C, "laplace", info, alternatives)

    def __repr__(self) -> str:
        return f"init_to_laplace(at={self.at!r})"


class init_to_prior_draw:  # noqa: N801
    """Start at a seeded draw from the target's ``prior`` (a Normal or independent Normal over theta)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def __call__(self, target: Any) -> Start:
        D = len(as_target(target).names)
        prior = getattr(target, "prior", None)
        base = getattr(prior, "base_dist", prior)
        loc, scale = getattr(base, "loc", None), getattr(base, "scale", None)
        if loc is None or scale is None:
            raise TypeError("init_to_prior_draw needs a target whose prior is a (independent) Normal over theta; "
                            f"got {type(prior).__name__}")
        g = torch.Generator(device=torch.as_tensor(loc).device).manual_seed(int(self.seed))
        z = torch.randn(D, generator=g, dtype=torch.float64, device=torch.as_tensor(loc).device)
        theta = (torch.as_tensor(loc) + torch.as_tensor(scale) * z).to(torch.float64)
        return Start(_point(theta.cpu(), D, "prior draw"), info={"mean": "prior_draw", "seed": self.seed})


class init_to_start:  # noqa: N801
    """The strategy that returns a :class:`Start` found earlier (e.g. to give several runs the same start)."""

    def __init__(self, start: Start) -> None:
        self.start = start

    def __call__(self, target: Any) -> Start:
        return self.start

    def __repr__(self) -> str:
        return "init_to_start(...)"


def resolve_init(init: Any, default: Callable[[Any], Start], *, seed: int = 0) -> Callable[[Any], Start]:
    """Turn what ``run(init=...)`` accepts into a strategy.

    ``None`` -> ``default``; a :class:`Start` -> itself (with its alternatives); ``"laplace"`` -> ``init_to_laplace(init_to_map(seed=seed))``; a posterior ->
    :func:`init_to_posterior`; a callable strategy -> itself; an array-like -> :func:`init_to_value`.
    """
    if init is None:
        return default
    if isinstance(init, Start):
        return init_to_start(init)
    if isinstance(init, str):
        if init != "laplace":
            raise ValueError(f"init must be None, 'laplace', a point, a posterior or an init strategy; got {init!r}")
        return init_to_laplace(init_to_map(seed=seed))
    if isinstance(init, Posterior):
        return init_to_posterior(init)
    if callable(init) and not isinstance(init, torch.Tensor):
        return init
    return init_to_value(init)


def on_target_device(start: Start, target: Any) -> Start:
    """``start`` with its point, scale and alternatives on the device of ``target``'s data
    (:func:`~gpvi.models.target.target_device`; unchanged for a target that names none): an engine's state and
    every draw it makes then live beside the data."""
    dev = target_device(target)
    if dev is None:
        return start
    return replace(start, theta=start.theta.to(dev),
                   scale_tril=None if start.scale_tril is None else start.scale_tril.to(dev),
                   alternatives=tuple(on_target_device(a, target) for a in start.alternatives))


def find_start(target: Any, init: Any, default: Callable[[Any], Start], *, seed: int | None = 0) -> Start:
    """The :class:`Start` a run begins from: ``init`` turned into a strategy by :func:`resolve_init` (``default``
    for ``None``, ``seed`` for ``"laplace"``'s MAP restarts), called once on ``target``; ``info["time_s"]`` is the
    time it took unless the strategy recorded one."""
    strategy = resolve_init(init, default, seed=0 if seed is None else seed)
    t0 = time.perf_counter()
    start = strategy(target)
    start.info.setdefault("time_s", time.perf_counter() - t0)
    return on_target_device(start, target)


def start_point(target: Any, start: Any, default: Callable[[Any], Start], *, seed: int | None = 0,
                strategy: Callable[[Any], Callable[[Any], Start] | None] | None = None) -> Start:
    """The :class:`Start` an engine's ``init(target, start)`` begins from, with ``theta`` of length D checked.

    ``start`` is a :class:`Start` (what the driver passes) or anything ``run(init=...)`` accepts: it is turned
    into a strategy by ``strategy(start)`` when given (``None`` from it means ``default``; CVI's
    :func:`~gpvi.inference.cvi.options.latent_init`), else by :func:`resolve_init` with ``default`` and ``seed``,
    and the strategy is called on ``target``. ``ValueError`` unless ``theta`` has shape ``(D,)``,
    D = ``len(target.names)``.
    """
    if not isinstance(start, Start):
        if strategy is None:
            fn = resolve_init(start, default, seed=0 if seed is None else seed)
        else:
            fn = strategy(start) or default
        start = fn(target)
    D = len(target.names)
    if tuple(start.theta.shape) != (D,):
        raise ValueError(f"init must have length D = {D}; got shape {tuple(start.theta.shape)}")
    return on_target_device(start, target)


def _show(theta: torch.Tensor, most: int = 8) -> str:
    vals = [f"{float(v):.4g}" for v in theta[:most]]
    return "[" + ", ".join(vals) + (", ...]" if theta.shape[0] > most else "]")


def check_start(target: Any, theta: torch.Tensor, batch: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log joint ``(1,)`` and gradient ``(1, D)`` at the start ``theta`` (D,); ``ValueError`` where either is NaN/inf.

    An engine calls this once in ``init``, so a start where the model cannot be evaluated (a kernel matrix that
    fails Cholesky, a log of zero) is refused at once, naming the point, instead of failing step after step until
    the fault policy gives up. ``batch``: the minibatch to evaluate on (``None``: the full data).

    Examples
    --------
    >>> import torch, gpvi
    >>> target = gpvi.Target(lambda th: torch.log(th).sum(-1), names=["a", "b"])
    >>> check_start(target, torch.tensor([1.0, -1.0], dtype=torch.float64))
    Traceback (most recent call last):
        ...
    ValueError: the log joint is nan at the start theta=[1, -1]; start where the model can be evaluated (init=...)
    """
    lj, g = log_joint_and_grad(target, theta.unsqueeze(0), batch)
    value = float(lj[0])
    if not math.isfinite(value):
        raise ValueError(f"the log joint is {value} at the start theta={_show(theta)}; start where the model can be "
                         f"evaluated (init=...)")
    bad = (~torch.isfinite(g[0])).nonzero().flatten().tolist()
    if bad:
        names = [str(target.names[i]) for i in bad[:8]]
        raise ValueError(f"the gradient of the log joint is not finite in {names} at the start theta={_show(theta)} "
                         f"(log joint {value:.6g}); start where the model can be differentiated (init=...)")
    return lj, g
