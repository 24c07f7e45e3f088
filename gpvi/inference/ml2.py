r"""ML-II (type-II maximum likelihood) and MAP point estimates of theta, by L-BFGS from seeded restarts.

ML-II maximises the exact log marginal likelihood :math:`\log \mathcal N(y \mid 0, K_\theta + \sigma^2 I)`
(Rasmussen & Williams 2006, section 5.4.1); with ``prior=True`` it maximises the log joint
:math:`\log g(\theta)` instead (MAP). The optimiser is SciPy's L-BFGS-B (:func:`gpvi.numerics.lbfgs.lbfgs_maximise`)
on the float64 objective with the exact gradient (one Cholesky and one ``cholesky_inverse`` per evaluation). Each
restart is recorded, and the winner is reported.

Choice of the winner: the best value; restarts within a relative ``tie_rtol`` (1e-6) of it reached the same
optimum, and among those a run SciPy reports as converged is preferred (the highest such value), so a run that
ended "ABNORMAL" on the line search at the shared optimum is not chosen over converged ones. A
:class:`~gpvi.exceptions.ConvergenceWarning` is issued only when the chosen optimum itself is doubtful: its run did
not converge *and* the projected gradient there is not small (max-abs above ``1e-5 max(1, |f|)``). Components of
theta that end on the box (within 1e-6 of ``bounds``) are listed in ``info["at_bound"]``, noted in the summary, and
named in one :class:`~gpvi.exceptions.BoundWarning` per run: an ML-II lengthscale at the upper bound (about 2.7e5
input standard deviations for the default box) says the input is irrelevant to the fit, not that a value was
estimated.

The box is relative to the data: ``bounds`` are offsets from the target's ``standard_theta()`` when it has one
(:meth:`gpvi.GPRegression.standard_theta`: log var(x_j) for the lengthscales, log var(y) for the variances, 0 on
standardised data), so the search covers the same functions whatever the data's units; a target without it gets
the box on theta itself.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..exceptions import BoundWarning, ConvergenceWarning, NotPSDError, advice
from ..posteriors.info import RunInfo
from ..posteriors.point import PointPosterior
from ..numerics.lbfgs import LBFGSInterrupted, box_message, ends_on_box, lbfgs_maximise
from .progress import Progress, warn_interrupted
from ..rng import check_seed, resolve_generator
from ..table import Table
from ..models.target import as_target
from ..validation import as_float_tensor, check_bool, check_interval, check_positive, check_positive_int

__all__ = ["ML2", "distinct_optima"]


def _check_scales(init_scale: Any) -> float | tuple[float, ...]:
    """A positive float, or a non-empty tuple of positive floats (``init_scale`` of :class:`ML2`)."""
    if isinstance(init_scale, (list, tuple)):
        if not init_scale:
            raise ValueError("init_scale must be a positive number or a non-empty sequence of them; got []")
        return tuple(check_positive(x, "init_scale") for x in init_scale)
    return check_positive(init_scale, "init_scale")


class ML2:
    """Type-II maximum likelihood (or MAP) with L-BFGS-B from several seeded starting points.

    Parameters
    ----------
    num_restarts : int
        Number of starting points: the target's ``initial_theta()`` (data-scaled) and ``num_restarts - 1``
        perturbations of it by N(0, ``init_scale^2``) noise.
    prior : bool
        False (default): maximise the log marginal likelihood (ML-II). True: maximise the log joint (MAP).
    max_iter : int
        L-BFGS-B iterations per restart.
    gtol, ftol : float
        SciPy's L-BFGS-B tolerances (projected gradient and relative decrease).
    bounds : tuple of float or None
        Box on every component of theta (log scale), as offsets from the target's ``standard_theta()`` where it has
        one (see the module docstring); default (-25, 25), i.e. values within about [1e-11, 7e10] times the data's
        own scale (lengthscales within about [4e-6, 3e5] input standard deviations).
    init_scale : float or sequence of float
        Standard deviation of the restart perturbations; a sequence is cycled over the restarts (restart r >= 1
        uses ``init_scale[(r - 1) % len(init_scale)]``), mixing near and far restarts.
    seed : int, optional
        Seed of the restart perturbations (or pass ``generator`` to :meth:`run`); a non-negative int, checked here
        by :func:`gpvi.rng.check_seed`.
    progress_bar : bool
    join_tol : float, optional
        When set, a restart stops as soon as the optimiser evaluates the objective within ``join_tol`` (max-abs)
        of an earlier restart's end point: it has joined that optimum, whose end point and value its record
        copies (``joined``: the earlier restart). Every distinct optimum is still found by the restart that
        reaches it first; only the approach to known optima is skipped (:func:`gpvi.inference.init.init_to_map`
        uses half its ``theta_tol``). Default None: every restart runs to convergence.

    Attributes
    ----------
    tie_rtol : float
        Relative tolerance under which two restarts' values count as the same optimum (class attribute, 1e-6).

    Examples
    --------
    >>> import gpvi
    >>> ds = gpvi.datasets.load_bodyfat(seed=0)
    >>> model = gpvi.GPRegression(ds.X_train, ds.y_train)
    >>> fit = gpvi.ML2(num_restarts=2, seed=0).run(model)
    >>> fit.theta.shape == (model.dim,)
    True
    """

    tie_rtol: float = 1e-6

    def __init__(self, num_restarts: int = 5, *, prior: bool = False, max_iter: int = 1000, gtol: float = 1e-7,
                 ftol: float = 1e-12, bounds: tuple[float, float] | None = (-25.0, 25.0), init_scale: float = 1.0,
                 seed: int | None = None, progress_bar: bool = False, join_tol: float | None = None) -> None:
        self.num_restarts = check_positive_int(num_restarts, "num_restarts")
        self.prior = check_bool(prior, "prior")
        self.max_iter = check_positive_int(max_iter, "max_iter")
        self.gtol = check_positive(gtol, "gtol")
        self.ftol = check_positive(ftol, "ftol")
        self.bounds = None if bounds is None else check_interval(bounds, "bounds")
        self.init_scale = _check_scales(init_scale)
        self.seed = check_seed(seed)
        self.progress_bar = check_bool(progress_bar, "progress_bar")
        self.join_tol = None if join_tol is None else check_positive(join_tol, "join_tol")

    def _objective(self, target: Any) -> Callable[[torch.Tensor], torch.Tensor]:
        if self.prior:
            return target.log_joint
        fn = getattr(target, "log_marginal_likelihood", None)
        if not callable(fn):
            raise TypeError("ML-II needs a target with log_marginal_likelihood(theta); for a generic target use "
                            "ML2(prior=True) to maximise log_joint (MAP)")
        return fn

    def starting_points(self, target: Any, init: Any = None, *, generator: torch.Generator | None = None,
                        seed: int | None = None) -> torch.Tensor:
        """The ``(R, D)`` starting points :meth:`run` would use."""
        D = len(target.names)
        if init is not None:
            t = as_float_tensor(init, "init", ndim=(1, 2))
            if t.shape[-1] != D:
                raise ValueError(f"init must have length D = {D}; got shape {tuple(t.shape)}")
            if t.dim() == 2:
                return t
            first = t
        elif callable(getattr(target, "initial_theta", None)):
            first = target.initial_theta().detach().to(torch.float64)
        else:
            first = torch.zeros(D, dtype=torch.float64, device="cpu")
        gen = resolve_generator(check_seed(seed) if seed is not None else self.seed, generator)
        noise = torch.randn((self.num_restarts - 1, D), generator=gen, dtype=torch.float64, device=gen.device)
        if isinstance(self.init_scale, tuple):
            sc = [self.init_scale[r % len(self.init_scale)] for r in range(self.num_restarts - 1)]
            noise = noise * torch.tensor(sc, dtype=torch.float64, device=noise.device).unsqueeze(-1)
        else:
            noise = noise * self.init_scale
        return torch.cat([first.unsqueeze(0).cpu(), first.cpu() + noise])

    def run(self, target: Any, init: Any = None, *, generator: torch.Generator | None = None,
            seed: int | None = None, callback: Callable[[int, dict[str, Any]], None] | None = None
            ) -> PointPosterior:
        """Optimise from every starting point and return the best as a :class:`~gpvi.posteriors.point.PointPosterior`.

        Parameters
        ----------
        target : GPRegression or target
        init : array-like of shape (D,) or (R, D), optional
            First starting point, or all R starting points (then ``num_restarts`` is ignored).
        generator, seed
            Randomness of the restart perturbations.
        callback : callable, optional
            ``callback(restart_index, record)`` after each restart; raising ``KeyboardInterrupt`` stops early
            (the best restart so far is returned, with a warning). A ``KeyboardInterrupt`` (Ctrl-C) inside a
            restart stops there too and keeps that restart's best point so far (its record's ``message`` is
            ``"interrupted"``; no further evaluation is made): continue with ``run(target, init=fit.theta)``.

        Returns
        -------
        PointPosterior
            ``theta``, ``value`` (the maximised objective) and ``info``, a :class:`~gpvi.posteriors.info.RunInfo`:
            ``converged`` (the chosen run converged, or ended at a stationary point: projected gradient
            ``info["projected_gradient"]`` small), ``steps`` (optimiser iterations of every restart), ``time_s``;
            details ``restarts`` (a Table of every restart), ``best_restart`` (chosen as described in the module
            docstring), ``at_bound`` (``{name: "lower" | "upper"}``), ``objective``.

        Warns
        -----
        ConvergenceWarning
            Only when the chosen optimum is doubtful (see the module docstring).
        BoundWarning
            Once per run, naming every component of theta that ends on the box.
        """
        target = as_target(target)
        objective = self._objective(target)
        box, centre = self._box(target)
        starts = self.starting_points(target, init, generator=generator, seed=seed)
        if not bool(torch.isfinite(starts).all()):
            raise ValueError("init contains non-finite values")
        device = getattr(target, "device", torch.device("cpu"))
        records: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        interrupted = False
        with Progress(starts.shape[0], enabled=self.progress_bar, desc="ML-II restarts") as bar:
            try:
                for r, x0 in enumerate(starts):
                    watched = _JoinWatch(objective, records, self.join_tol)
                    stopped = False
                    try:
                        res = lbfgs_maximise(watched, x0, bounds=box, max_iter=self.max_iter,
                                             gtol=self.gtol, ftol=self.ftol, ignore_warnings=(RuntimeWarning,),
                                             device=device)
                    except _Joined as j:
                        res = None
                        rec = {**j.record, "restart": r, "iterations": math.nan, "evaluations": watched.calls,
                               "message": f"joined restart {j.record['restart']}", "start": x0.clone(),
                               "joined": j.record["restart"]}
                    except LBFGSInterrupted as stop:     # keep the interrupted restart's best point, then stop
                        res, stopped = stop.result, True
                    if res is not None:
                        rec = {"restart": r, "value": res.value, "iterations": res.iterations,
                               "evaluations": res.evaluations, "converged": res.converged, "message": res.message,
                               "theta": res.x.cpu(), "start": x0.clone(), "joined": None, "interrupted": stopped}
                    records.append(rec)
                    if stopped:
                        raise KeyboardInterrupt
                    bar.update(1, best=max(x["value"] for x in records))
                    if callback is not None:
                        callback(r, rec)
            except KeyboardInterrupt:
                interrupted = True
                warn_interrupted("ML-II", sum(not rec["interrupted"] for rec in records), starts.shape[0],
                                 unit="restarts", resume="continue with run(target, init=fit.theta)")
        if not records:   # nothing to return: the interruption goes on up to the caller
            raise KeyboardInterrupt("ML-II was interrupted before the first restart finished")
        best = self._choose(records)
        theta = best["theta"].to(device)
        converged = bool(best["converged"])
        gradient = None
        if not converged and not best["interrupted"]:   # doubtful only if the point is not stationary either
            gradient = _projected_gradient_max(objective, theta, box)
            converged = gradient <= 1e-5 * max(1.0, abs(best["value"]))
            if not converged:
                warnings.warn(f"ML-II: the chosen restart ({best['restart']}, value {best['value']:.6g}) did not "
                              f"converge ({best['message'].strip() or 'no message'}) and the projected gradient there "
                              f"is {gradient:.2g}; the optimum is doubtful: "
                              + advice("ml2_convergence", "raise max_iter or num_restarts"),
                              ConvergenceWarning, stacklevel=2)
        at_bound = {} if box is None else ends_on_box(best["theta"], *box, list(target.names))
        if at_bound:
            centred = None if centre is None else dict(zip(target.names, centre.tolist()))
            warnings.warn(box_message(at_bound, self.bounds, "MAP" if self.prior else "ML-II", centre=centred),
                          BoundWarning, stacklevel=2)
        table = Table([str(rec["restart"]) for rec in records],
                      {"value": [rec["value"] for rec in records],
                       "iterations": [rec["iterations"] for rec in records],
                       "converged": [rec["converged"] for rec in records]}, title="ML-II restarts")
        wall = time.perf_counter() - t0
        settings = {"num_restarts": self.num_restarts, "prior": self.prior, "max_iter": self.max_iter,
                    "gtol": self.gtol, "ftol": self.ftol, "seed": self.seed, "join_tol": self.join_tol}
        iterations = sum(int(rec["iterations"]) for rec in records if math.isfinite(rec["iterations"]))
        info = RunInfo(engine="ML2", converged=converged, interrupted=interrupted, steps=iterations, time_s=wall,
                       total_time_s=wall,
                       settings=settings, details={
                           "restarts": table, "best_restart": best["restart"], "records": records,
                           "objective": "log_joint (MAP)" if self.prior else "log_marginal_likelihood (ML-II)",
                           "projected_gradient": gradient,
                           "bounds": None if self.bounds is None else list(self.bounds), "at_bound": at_bound,
                           "box_centre": None if centre is None else centre.tolist()})
        return PointPosterior(theta, list(target.names), target, value=best["value"], info=info)

    def _choose(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """The best value; among restarts within ``tie_rtol`` of it, a converged one (the highest) if any."""
        finite = [rec for rec in records if math.isfinite(rec["value"])]
        if not finite:
            raise NotPSDError("ML-II: the objective could not be evaluated at any restart's end point")
        top = max(rec["value"] for rec in finite)
        tied = [rec for rec in finite if rec["value"] >= top - self.tie_rtol * max(1.0, abs(top))]
        converged = [rec for rec in tied if rec["converged"]]
        return max(converged or tied, key=lambda rec: rec["value"])

    def _box(self, target: Any) -> tuple[Any, torch.Tensor | None]:
        """``(box, centre)``: the box on theta, ``bounds`` around the target's ``standard_theta()`` (its centre,
        float64 on the CPU) when it has one, else ``bounds`` itself (centre None); box None without bounds."""
        fn = getattr(target, "standard_theta", None)
        centre = fn().detach().to(torch.float64).cpu() if callable(fn) else None
        if self.bounds is None:
            return None, centre
        if centre is None:
            return self.bounds, None
        return (centre + self.bounds[0], centre + self.bounds[1]), centre


class _Joined(Exception):
    """A restart reached an earlier restart's end point (``record``)."""

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__(f"joined restart {record['restart']}")
        self.record = record


class _JoinWatch:
    """The objective, counting its calls; raises :class:`_Joined` at a point within ``tol`` (max-abs) of an earlier
    restart's (not joined) finite end point in ``records``. ``tol=None``: the objective alone."""

    def __init__(self, objective: Callable[[torch.Tensor], torch.Tensor], records: list[dict[str, Any]],
                 tol: float | None) -> None:
        self.objective, self.tol, self.calls = objective, tol, 0
        self.ends = [] if tol is None else [r for r in records if r.get("joined") is None
                                            and math.isfinite(r["value"])]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.ends:
            xd = x.detach().cpu()
            for r in self.ends:
                if float((xd - r["theta"]).abs().max()) <= self.tol:
                    raise _Joined(r)
        return self.objective(x)


def _projected_gradient_max(objective: Callable[[torch.Tensor], torch.Tensor], theta: torch.Tensor,
                            bounds: tuple[float, float] | None) -> float:
    """Max-abs of the objective's gradient at ``theta``, without components pushing out of the box (inf: failed)."""
    x = theta.detach().clone().requires_grad_(True)
    try:
        (g,) = torch.autograd.grad(objective(x), x)
    except (NotPSDError, RuntimeError, ValueError):
        return math.inf
    g = g.detach()
    if bounds is not None:
        lo, hi = (torch.as_tensor(b, dtype=g.dtype).to(g.device) for b in bounds)
        g = torch.where((x.detach() <= lo + 1e-6) & (g < 0), torch.zeros_like(g), g)
        g = torch.where((x.detach() >= hi - 1e-6) & (g > 0), torch.zeros_like(g), g)
    val = float(g.abs().max()) if g.numel() else 0.0
    return val if math.isfinite(val) else math.inf


def distinct_optima(records: list[dict[str, Any]], theta_tol: float,
                    choose: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> list[dict[str, Any]]:
    """Group optimiser end points (``records`` with ``theta``, ``value``, ``restart``) into distinct optima.

    End points are taken best value first; one joins the first group whose best member is within ``theta_tol``
    in every component, else it opens a new group. Each group is represented by ``choose(members)`` (ML-II's
    rule: the best value, a converged run among ties). Returns the groups best first, each ``{"theta", "value",
    "restart", "restarts"}`` (``restarts``: the indices of its members). Non-finite end points are left out.

    Examples
    --------
    >>> import torch
    >>> recs = [{"theta": torch.tensor([0.0, 1.0]), "value": -1.0, "restart": 0},
    ...         {"theta": torch.tensor([0.05, 1.0]), "value": -1.01, "restart": 1},
    ...         {"theta": torch.tensor([2.0, 1.0]), "value": -3.0, "restart": 2}]
    >>> [(o["restart"], o["restarts"]) for o in distinct_optima(recs, 0.1, lambda m: m[0])]
    [(0, [0, 1]), (2, [2])]
    """
    finite = [r for r in records if math.isfinite(r["value"]) and bool(torch.isfinite(r["theta"]).all())]
    groups: list[list[dict[str, Any]]] = []
    for rec in sorted(finite, key=lambda r: -r["value"]):
        for g in groups:
            if float((rec["theta"] - g[0]["theta"]).abs().max()) <= theta_tol:
                g.append(rec)
                break
        else:
            groups.append([rec])
    out = []
    for g in groups:
        rep = choose(g)
        out.append({"theta": rep["theta"], "value": rep["value"], "restart": rep["restart"],
                    "restarts": sorted(r["restart"] for r in g)})
    return sorted(out, key=lambda o: -o["value"])
