r"""ML-II (type-II maximum likelihood) and MAP point estimates of theta, by L-BFGS from seeded restarts.

ML-II maximises the exact log marginal likelihood :math:`\log \mathcal N(y \mid 0, K_\theta + \sigma^2 I)`
(Rasmussen & Williams 2006, section 5.4.1); with ``prior=True`` it maximises the log joint
:math:`\log g(\theta)` instead (MAP). The optimiser is SciPy's L-BFGS-B (:func:`gpvi.inference.lbfgs.lbfgs_maximise`)
on the float64 objective with the exact gradient (one Cholesky and one ``cholesky_inverse`` per evaluation). Each
restart is recorded, and the winner is reported.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..exceptions import ConvergenceWarning, NotPSDError
from ..posteriors.base import PointPosterior
from .lbfgs import lbfgs_maximise
from .progress import Progress, warn_interrupted
from ..rng import resolve_generator
from ..evaluation.table import Table
from ..models.target import as_target
from ..validation import as_float_tensor, check_bool, check_positive, check_positive_int

__all__ = ["ML2"]


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
        Box on every component of theta (log scale); default (-25, 25), i.e. values in about [1e-11, 7e10].
    init_scale : float
        Standard deviation of the restart perturbations.
    seed : int, optional
        Seed of the restart perturbations (or pass ``generator`` to :meth:`run`).
    progress_bar : bool

    Examples
    --------
    >>> import gpvi
    >>> ds = gpvi.datasets.load_bodyfat(seed=0)
    >>> model = gpvi.GPRegression(ds.X_train, ds.y_train)
    >>> fit = gpvi.ML2(num_restarts=2, seed=0).run(model)
    >>> fit.theta.shape == (model.dim,)
    True
    """

    def __init__(self, num_restarts: int = 5, *, prior: bool = False, max_iter: int = 1000, gtol: float = 1e-7,
                 ftol: float = 1e-12, bounds: tuple[float, float] | None = (-25.0, 25.0), init_scale: float = 1.0,
                 seed: int | None = None, progress_bar: bool = False) -> None:
        self.num_restarts = check_positive_int(num_restarts, "num_restarts")
        self.prior = check_bool(prior, "prior")
        self.max_iter = check_positive_int(max_iter, "max_iter")
        self.gtol = check_positive(gtol, "gtol")
        self.ftol = check_positive(ftol, "ftol")
        if bounds is not None:
            if len(bounds) != 2 or not float(bounds[0]) < float(bounds[1]):
                raise ValueError(f"bounds must be (low, high) with low < high; got {bounds}")
        self.bounds = bounds
        self.init_scale = check_positive(init_scale, "init_scale")
        self.seed = seed
        self.progress_bar = check_bool(progress_bar, "progress_bar")

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
            first = torch.zeros(D, dtype=torch.float64)
        gen = resolve_generator(seed if seed is not None else self.seed, generator)
        noise = torch.randn((self.num_restarts - 1, D), generator=gen, dtype=torch.float64) * self.init_scale
        return torch.cat([first.unsqueeze(0).cpu(), first.cpu() + noise])

    def run(self, target: Any, init: Any = None, *, generator: torch.Generator | None = None,
            seed: int | None = None, callback: Callable[[int, dict[str, Any]], None] | None = None
            ) -> PointPosterior:
        """Optimise from every starting point and return the best as a :class:`~gpvi.posteriors.base.PointPosterior`.

        Parameters
        ----------
        target : GPRegression or target
        init : array-like of shape (D,) or (R, D), optional
            First starting point, or all R starting points (then ``num_restarts`` is ignored).
        generator, seed
            Randomness of the restart perturbations.
        callback : callable, optional
            ``callback(restart_index, record)`` after each restart; raising ``KeyboardInterrupt`` stops early
            (the best restart so far is returned, with a warning).

        Returns
        -------
        PointPosterior
            ``theta``, ``value`` (the maximised objective), ``info["restarts"]`` (a Table of every restart),
            ``info["best_restart"]``, ``info["objective"]`` and ``info["time_s"]``.
        """
        target = as_target(target)
        objective = self._objective(target)
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
                    res = lbfgs_maximise(objective, x0, bounds=self.bounds, max_iter=self.max_iter, gtol=self.gtol,
                                         ftol=self.ftol, ignore_warnings=(RuntimeWarning,), device=device)
                    rec = {"restart": r, "value": res.value, "iterations": res.iterations,
                           "evaluations": res.evaluations, "converged": res.converged, "message": res.message,
                           "theta": res.x.cpu(), "start": x0.clone()}
                    records.append(rec)
                    bar.update(1, best=max(x["value"] for x in records))
                    if callback is not None:
                        callback(r, rec)
            except KeyboardInterrupt:
                interrupted = True
                warn_interrupted("ML-II", len(records), starts.shape[0])
        if not records:   # nothing to return: the interruption goes on up to the caller
            raise KeyboardInterrupt("ML-II was interrupted before the first restart finished")
        finite = [rec for rec in records if math.isfinite(rec["value"])]
        if not finite:
            raise NotPSDError("ML-II: the objective could not be evaluated at any restart's end point")
        best = max(finite, key=lambda rec: rec["value"])
        if not best["converged"]:
            warnings.warn(f"ML-II best restart did not report convergence: {best['message']}", ConvergenceWarning,
                          stacklevel=2)
        table = Table([str(rec["restart"]) for rec in records],
                      {"value": [rec["value"] for rec in records],
                       "iterations": [rec["iterations"] for rec in records],
                       "converged": [rec["converged"] for rec in records]}, title="ML-II restarts")
        info = {"restarts": table, "best_restart": best["restart"], "records": records,
                "objective": "log_joint (MAP)" if self.prior else "log_marginal_likelihood (ML-II)",
                "time_s": time.perf_counter() - t0, "interrupted": interrupted}
        theta = best["theta"].to(device)
        return PointPosterior(theta, list(target.names), target, value=best["value"], info=info)
