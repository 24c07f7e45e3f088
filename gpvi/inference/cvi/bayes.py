r"""Fully Bayesian GP classification: DSVI over the kernel log-hyperparameters on the profiled CVI bound.

:class:`FullyBayesianCVI` runs MAP-II (:class:`~gpvi.inference.cvi.typeii.TypeII`), a Laplace start, and DSVI on
:class:`gpvi.models.cvi_bound.CVIBoundTarget`; it returns a
:class:`gpvi.posteriors.bayes_classification.BayesClassificationPosterior` (see that module for the bound that is
maximised, what :math:`q(\theta)` approximates, and the predictive).
"""

from __future__ import annotations

import time
from typing import Any


from ...posteriors.bayes_classification import BayesClassificationPosterior
from ...rng import check_seed
from ...validation import check_bool, check_positive_int

__all__ = ["FullyBayesianCVI"]


class FullyBayesianCVI:
    r"""Fit :math:`q(\theta)\,q^*(\mathbf f\mid\theta)` to a latent GP model: MAP-II, Laplace scale, DSVI (module
    docstring).

    Parameters
    ----------
    dsvi : DSVI, optional
        The engine for :math:`q(\theta)`. Default: ``DSVI(scale="full", optimizer=Natural(), num_draws=4,
        convergence=Convergence(gap_tol=0.05), num_elbo_draws=100, seed=seed, progress_bar=progress_bar)`` -- the
        Natural rule with its convergence rule (it ends the run and returns the average of its converged
        windows; a shortfall of 0.05 nats rather than 0.01 for the average: on Pima the plateau came at step 500
        and ``gap_tol=0.01`` averaged until step 1400 for q's moments that moved by < 0.1 sd); 100 draws for the
        final bound estimate, because each costs a CVI run.
    prior : "default", torch.distributions.Distribution or None
        Prior on the log-hyperparameters (default independent :math:`\mathcal N(0, 10)`).
    cvi : CVI, optional
        The engine of the inner CVI runs and of MAP-II. Default ``CVI(beta=0.7, progress_bar=False)``: the
        inner runs are ELBO-monotone (:func:`~gpvi.inference.cvi.typeii.converge_sites` halves the step where a
        full step would lower the ELBO), and a longer step than CVI's default 0.5 reaches ``inner_tol`` in fewer
        steps (measured per draw of :math:`q` at tolerance 1e-9: Pima 8.2 steps at beta 0.8, 14 at 0.5; a
        24-point 1-D set 19 at 0.7, 27 at 0.5 and 26 at 1.0, where beta = 1 keeps backtracking).
    inner_tol : float
        Inner CVI tolerance of the DSVI phase (default 1e-9: gradient error about 1e-5 relative, far below the
        Monte Carlo noise of DSVI's gradient). The Laplace scale uses ``min(inner_tol, 1e-12)`` (finite
        differences of the gradient need it accurate).
    num_draws : int
        Draws of :math:`\theta` in the predictive mixture (default 32).
    seed : int
        Seed of DSVI (when ``dsvi`` is not given) and of the predictive draws.
    progress_bar : bool

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.inference.dsvi import DSVI, Natural, Convergence
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(20, 1, generator=g, dtype=torch.float64)
    >>> y = (X[:, 0] + 0.5 * torch.randn(20, generator=g, dtype=torch.float64) > 0).double()
    >>> fit = FullyBayesianCVI(DSVI(optimizer=Natural(), num_steps=100, num_elbo_draws=20, progress_bar=False,
    ...                             convergence=Convergence(stop=False)), num_draws=8)
    >>> post = fit.run(gpvi.GPClassification(X, y))
    >>> post.mean.shape, post.predict_proba(X[:3]).shape
    (torch.Size([2]), torch.Size([3]))
    """

    def __init__(self, dsvi: Any = None, *, prior: Any = "default", cvi: Any = None, inner_tol: float = 1e-9,
                 num_draws: int = 32, seed: int = 0, progress_bar: bool = False) -> None:
        from .engine import CVI
        from ..dsvi import DSVI, Convergence, Natural

        self.seed = check_seed(seed)
        self.progress_bar = check_bool(progress_bar, "progress_bar")
        if dsvi is None:
            dsvi = DSVI(scale="full", optimizer=Natural(), num_draws=4, convergence=Convergence(gap_tol=0.05),
                        num_elbo_draws=100, seed=self.seed, progress_bar=self.progress_bar)
        elif not isinstance(dsvi, DSVI):
            raise TypeError(f"dsvi must be a gpvi.DSVI engine; got {type(dsvi).__name__}")
        if cvi is not None and not isinstance(cvi, CVI):
            raise TypeError(f"cvi must be a gpvi.CVI engine; got {type(cvi).__name__}")
        self.dsvi = dsvi
        self.cvi = cvi if cvi is not None else CVI(beta=0.7, progress_bar=False)
        self.prior = prior
        self.inner_tol = float(inner_tol)
        if not self.inner_tol > 0:
            raise ValueError(f"inner_tol must be > 0; got {inner_tol!r}")
        self.num_draws = check_positive_int(num_draws, "num_draws")

    def __repr__(self) -> str:
        return f"FullyBayesianCVI({self.dsvi!r}, inner_tol={self.inner_tol:g}, num_draws={self.num_draws})"

    def run(self, model: Any, init: Any = None) -> BayesClassificationPosterior:
        r"""Fit :math:`q(\theta)` and build the predictive.

        Parameters
        ----------
        model : LatentGP
            E.g. :class:`gpvi.GPClassification`.
        init : LatentPosterior, optional
            A MAP-II posterior to start from (a :class:`~gpvi.inference.cvi.typeii.TypeII` result with the same
            prior); default: one is computed.

        Returns
        -------
        BayesClassificationPosterior
            ``info``: ``map_theta``, ``map_objective``, ``laplace`` (what the Laplace step did), the times
            ``map_time_s``, ``laplace_time_s``, ``dsvi_time_s``, ``predictive_time_s``, ``time_s`` (all), and the
            target's counters (``evaluations``, ``inner_steps``, ``failures``).
        """
        from .typeii import TypeII
        from ..init import init_to_value, laplace_scale_at
        from ...models.cvi_bound import CVIBoundTarget

        t0 = time.perf_counter()
        if init is None:
            init = TypeII(self.cvi, prior=self.prior).run(model)
        t_map = time.perf_counter() - t0
        theta_map = init.theta.detach().clone()
        target = CVIBoundTarget(model, self.prior, cvi=self.cvi, inner_tol=min(self.inner_tol, 1e-12))
        t1 = time.perf_counter()
        # the anchor: MAP-II's sites re-converged tightly (TypeII's final sites stop at the engine's own tolerance)
        target.set_anchor(theta_map, init.lam1, init.lam2)
        C0, how = laplace_scale_at(target, theta_map)
        t_lap = time.perf_counter() - t1
        target.inner_tol = self.inner_tol
        t2 = time.perf_counter()
        q = self.dsvi.run(target, init=init_to_value(theta_map, C0) if C0 is not None else init_to_value(theta_map))
        t_dsvi = time.perf_counter() - t2
        map_obj = float(target.log_joint(theta_map))
        info = {"map_theta": theta_map.tolist(), "map_objective": map_obj, "map_time_s": t_map,
                "laplace": {k: v for k, v in how.items() if k != "hessian"}, "laplace_time_s": t_lap,
                "dsvi_time_s": t_dsvi, "dsvi_steps": q.info.get("steps"), "dsvi_converged": q.info.get("converged"),
                **{k: target.counters[k] for k in ("evaluations", "inner_steps", "failures", "unconverged")}}
        post = BayesClassificationPosterior(q, target, num_draws=self.num_draws, seed=self.seed, info=info)
        post.info["time_s"] = time.perf_counter() - t0
        return post
