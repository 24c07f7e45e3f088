r"""Posterior objects over theta returned by the inference engines.

* :class:`PointPosterior` — ML-II / MAP: a single theta (a point mass).
* :class:`GaussianPosterior` — DSVI and Salimans-Knowles: :math:`\theta = C z + \mu`, :math:`z \sim \phi`,
  i.e. :math:`q(\theta) = \phi(C^{-1}(\theta - \mu)) / |C|` (DSVI paper eq. 1); Gaussian for the default
  standard-normal :math:`\phi`.
* :class:`SamplePosterior` — MCMC: draws of shape ``(chains, draws, D)``.

They share one interface so benchmark and notebook code treats them alike: ``names``, ``sample(n)``,
``summary()`` (a :class:`~gpvi.evaluation.table.Table` per parameter name, with natural-scale columns when the target
knows its transforms), ``predict(X, num_draws)`` (the mixture predictive over theta draws,
:class:`~gpvi.posteriors.predictive.MixturePredictive`), ``to_arviz()`` and ``state_dict()``. Posteriors never change
after the run that made them.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .predictive import MixturePredictive
from ..rng import resolve_generator
from ..inference.families import StandardNormal, make_standard
from ..evaluation.table import Table
from ..validation import check_fraction, check_positive_int, check_theta

__all__ = ["Posterior", "PointPosterior", "GaussianPosterior", "SamplePosterior"]

_SUMMARY_SEED = 20140621  # fixed seed for Monte Carlo parts of summaries (deterministic output)


def _plain(obj: Any) -> Any:
    """Convert to tensors, numbers, strings, lists and dicts only, so ``torch.load(weights_only=True)`` accepts it."""
    if isinstance(obj, Table):
        return {"index": list(obj.index), "columns": {k: _plain(v) for k, v in obj.columns.items()}}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (torch.Tensor, str, int, float, bool)) or obj is None:
        return obj
    try:
        import numpy as np
        if isinstance(obj, np.ndarray):
            return torch.from_numpy(obj)
        if isinstance(obj, np.generic):
            return obj.item()
    except ImportError:  # pragma: no cover
        pass
    return repr(obj)


def _quantile_names(prob: float) -> tuple[str, str, str]:
    lo = 100 * (1 - prob) / 2
    return f"q{lo:g}", "q50", f"q{100 - lo:g}"


class Posterior:
    """Shared behaviour. Subclasses implement ``sample``, ``_moments`` and ``_quantiles``."""

    names: list[str]
    target: Any

    def __init__(self, names: list[str], target: Any = None, info: dict[str, Any] | None = None) -> None:
        self.names = list(names)
        self.target = target
        self.info = dict(info or {})

    @property
    def dim(self) -> int:
        """Number of parameters D."""
        return len(self.names)

    # -- to be provided by subclasses
    def sample(self, n: int, *, generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
        raise NotImplementedError

    def _moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _quantiles(self, probs: torch.Tensor) -> torch.Tensor:
        """(len(probs), D) marginal quantiles."""
        raise NotImplementedError

    # -- shared
    def summary(self, prob: float = 0.9, *, natural: bool = True) -> Table:
        """Per-parameter marginal summary.

        Parameters
        ----------
        prob : float
            Central interval mass for the quantile columns (0.9 -> q5, q50, q95).
        natural : bool
            Add natural-scale columns (``natural``, ``nat_mean``, ``nat_q5``, ``nat_q50``, ``nat_q95``) when the
            target provides ``natural_names`` and ``natural(theta)`` (e.g. ``GPRegression``: lengthscales and
            variances). Natural-scale quantiles are exact (the transforms are monotone); the natural-scale mean
            is a Monte Carlo average over 4000 draws with a fixed seed.

        Returns
        -------
        Table
            Rows by parameter name; columns ``mean, sd, q.., q50, q..`` (log scale) and natural-scale columns.
        """
        prob = check_fraction(prob, "prob", high_closed=False)
        mean, sd = self._moments()
        qn = _quantile_names(prob)
        probs = torch.tensor([(1 - prob) / 2, 0.5, 1 - (1 - prob) / 2], dtype=torch.float64)
        q = self._quantiles(probs)
        cols: dict[str, list[Any]] = {"mean": mean.tolist(), "sd": sd.tolist()}
        for j, name in enumerate(qn):
            cols[name] = q[j].tolist()
        cols.update(self._extra_summary_columns())
        tgt = self.target
        if natural and tgt is not None and hasattr(tgt, "natural_names") and callable(getattr(tgt, "natural", None)):
            nat_q = tgt.natural(q)
            draws = self.sample(4000, seed=_SUMMARY_SEED)
            nat_mean = tgt.natural(draws).mean(0)
            cols["natural"] = list(tgt.natural_names)
            cols["nat_mean"] = nat_mean.tolist()
            for j, name in enumerate(qn):
                cols["nat_" + name] = nat_q[j].tolist()
        return Table(self.names, cols, title=f"{type(self).__name__} summary")

    def _extra_summary_columns(self) -> dict[str, list[Any]]:
        return {}

    def predict(self, X: Any, num_draws: int = 200, *, generator: torch.Generator | None = None,
                seed: int | None = 0, include_noise: bool = True) -> MixturePredictive:
        """Posterior predictive at ``X``: an equal-weight mixture over ``num_draws`` theta draws.

        Parameters
        ----------
        X : array-like of shape (n, n_features)
        num_draws : int
            Number of theta draws (mixture components). Ignored by :class:`PointPosterior`.
        generator, seed
            Randomness of the draws (default ``seed=0``: predictions are reproducible).
        include_noise : bool
            Predictive of y* (default) or of the latent f*.

        Returns
        -------
        MixturePredictive
            ``.mean``, ``.var``, ``.log_prob(y)``; feed to :func:`gpvi.metrics.smse` / :func:`gpvi.metrics.nlpd`.
        """
        tgt = self.target
        if tgt is None or not callable(getattr(tgt, "predict", None)):
            raise TypeError("predict needs the posterior's target to be a model with predict(theta, X) "
                            f"(e.g. gpvi.GPRegression); this posterior's target is {type(tgt).__name__}")
        theta = self._predict_draws(num_draws, generator=generator, seed=seed)
        mean, var = tgt.predict(theta, X, include_noise=include_noise)
        return MixturePredictive(mean, var)

    def _predict_draws(self, num_draws: int, *, generator, seed) -> torch.Tensor:
        num_draws = check_positive_int(num_draws, "num_draws")
        return self.sample(num_draws, generator=generator, seed=seed)

    def to_arviz(self, num_draws: int = 1000, *, seed: int = 0):
        """``arviz.InferenceData`` with one named variable per parameter (draws from the posterior).

        Requires the optional ``arviz`` extra (``pip install gpvi[arviz]``).
        """
        az = _import_arviz()
        draws = self._arviz_draws(num_draws, seed)          # (chains, draws, D)
        posterior = {n: draws[:, :, j].cpu().numpy() for j, n in enumerate(self.names)}
        return az.from_dict(posterior=posterior, **self._arviz_extra())

    def _arviz_draws(self, num_draws: int, seed: int) -> torch.Tensor:
        num_draws = check_positive_int(num_draws, "num_draws")
        return self.sample(num_draws, seed=seed).unsqueeze(0)

    def _arviz_extra(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return repr(self.summary(natural=False))


def _import_arviz():
    try:
        import arviz as az
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("to_arviz needs ArviZ, an optional extra: pip install 'gpvi[arviz]'") from exc
    return az


class PointPosterior(Posterior):
    """A point estimate of theta (ML-II or MAP) with the same interface as the other posteriors.

    Attributes
    ----------
    theta : torch.Tensor of shape (D,)
    value : float
        Objective at ``theta`` (log marginal likelihood for ML-II, log joint for MAP).
    info : dict
        Engine-specific details (e.g. the restarts table of ML-II).
    """

    def __init__(self, theta: torch.Tensor, names: list[str], target: Any = None, *, value: float = math.nan,
                 info: dict[str, Any] | None = None) -> None:
        super().__init__(names, target, info)
        self.theta = theta.detach().clone()
        self.value = float(value)

    @property
    def mean(self) -> torch.Tensor:
        return self.theta

    def sample(self, n: int, *, generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
        n = check_positive_int(n, "n")
        return self.theta.expand(n, -1).clone()

    def _moments(self):
        return self.theta, torch.zeros_like(self.theta)

    def _quantiles(self, probs):
        return self.theta.expand(len(probs), -1)

    def _predict_draws(self, num_draws, *, generator, seed):
        return self.theta.unsqueeze(0)

    def log_prob(self, theta: Any) -> torch.Tensor:
        """Point mass: 0 at ``theta`` (up to 1e-12), ``-inf`` elsewhere (useful only for checks)."""
        t = check_theta(theta, self.dim, device=self.theta.device)
        hit = (t - self.theta).abs().amax(-1) <= 1e-12
        return torch.where(hit, torch.zeros_like(hit, dtype=t.dtype), torch.full_like(hit, -math.inf, dtype=t.dtype))

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "point", "theta": self.theta, "names": self.names, "value": self.value,
                "info": _plain({k: v for k, v in self.info.items() if k != "records"})}


class GaussianPosterior(Posterior):
    r"""Location-scale posterior :math:`\theta = C z + \mu`, :math:`z \sim \phi` (Gaussian for normal phi).

    Parameters
    ----------
    mean : torch.Tensor of shape (D,)
        :math:`\mu`.
    scale_tril : torch.Tensor of shape (D, D)
        Lower-triangular :math:`C` with positive diagonal.
    names : list of str
    target : optional
        The model it approximates (needed for ``predict`` and natural-scale summaries).
    base : standard distribution, optional
        :math:`\phi` (default :class:`~gpvi.inference.families.StandardNormal`).
    elbo, elbo_se : float, optional
        Final bound estimate and its Monte Carlo standard error.
    trace : dict, optional
        Per-step records of the run (bound, rolling average, ...).
    info : dict, optional
        Counters and settings of the run.
    engine_state : optional
        The engine's final state (for resuming); ``state_dict()`` includes its ``state_dict()``.

    Attributes
    ----------
    covariance : torch.Tensor of shape (D, D)
        :math:`C\,\mathrm{diag}(\mathrm{Var}\,z)\,C^\top` (:math:`CC^\top` for normal phi; infinite entries
        when phi has no variance).
    """

    def __init__(self, mean: torch.Tensor, scale_tril: torch.Tensor, names: list[str], target: Any = None, *,
                 base: Any = None, elbo: float = math.nan, elbo_se: float = math.nan,
                 trace: dict[str, Any] | None = None, info: dict[str, Any] | None = None,
                 engine_state: Any = None) -> None:
        super().__init__(names, target, info)
        D = len(names)
        if mean.shape != (D,) or scale_tril.shape != (D, D):
            raise ValueError(f"mean must be ({D},) and scale_tril ({D}, {D}); got {tuple(mean.shape)} and "
                             f"{tuple(scale_tril.shape)}")
        if not bool((torch.diagonal(scale_tril) > 0).all()):
            raise ValueError("scale_tril must have a strictly positive diagonal")
        self.mean = mean.detach().clone()
        self.scale_tril = torch.tril(scale_tril.detach()).clone()
        self.base = base if base is not None else StandardNormal(D)
        self.elbo = float(elbo)
        self.elbo_se = float(elbo_se)
        self.trace = trace or {}
        self.engine_state = engine_state

    @property
    def covariance(self) -> torch.Tensor:
        v = self.base.variance().to(self.scale_tril)
        C = self.scale_tril
        if bool(torch.isinf(v).any()):
            cov = C @ C.T
            return torch.where(cov != 0, torch.full_like(cov, math.inf), cov)
        return (C * v) @ C.T

    @property
    def stddev(self) -> torch.Tensor:
        return torch.sqrt(torch.diagonal(self.covariance))

    def sample(self, n: int, *, generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
        """Draw ``(n, D)`` values ``mu + C z``."""
        n = check_positive_int(n, "n")
        gen = resolve_generator(seed, generator)
        z = self.base.sample(n, gen, dtype=self.mean.dtype).to(self.mean.device)
        return self.mean + z @ self.scale_tril.T

    def log_prob(self, theta: Any) -> torch.Tensor:
        r""":math:`\log q(\theta) = \log\phi(C^{-1}(\theta-\mu)) - \sum_d \log C_{dd}`; ``(D,) -> ()``, ``(S, D) -> (S,)``."""
        t = check_theta(theta, self.dim, device=self.mean.device)
        z = torch.linalg.solve_triangular(self.scale_tril, (t - self.mean).unsqueeze(-1) if t.dim() == 1
                                          else (t - self.mean).T, upper=False)
        z = z.squeeze(-1) if t.dim() == 1 else z.T
        return self.base.log_prob(z) - torch.log(torch.diagonal(self.scale_tril)).sum()

    def _moments(self):
        return self.mean, self.stddev

    def _quantiles(self, probs):
        if isinstance(self.base, StandardNormal):
            sd = torch.sqrt((self.scale_tril ** 2).sum(-1))
            zq = torch.special.ndtri(probs.to(self.mean))
            return self.mean + zq[:, None] * sd[None, :]
        draws = self.sample(20000, seed=_SUMMARY_SEED)
        return torch.quantile(draws, probs.to(draws), dim=0)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild the posterior (and resume the run, when an engine state is attached)."""
        out = {"kind": "gaussian", "mean": self.mean, "scale_tril": self.scale_tril, "names": self.names,
               "base": _plain(self.base.spec()), "elbo": self.elbo, "elbo_se": self.elbo_se, "info": _plain(self.info)}
        if self.engine_state is not None and callable(getattr(self.engine_state, "state_dict", None)):
            out["engine_state"] = self.engine_state.state_dict()
        return out

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], target: Any = None) -> GaussianPosterior:
        """Rebuild from :meth:`state_dict` (normal and Student-t bases; factorised bases need ``base=``).

        ``state_dict()`` holds only tensors, numbers, strings, lists and dicts, so it can be saved with
        ``torch.save`` and read back with ``torch.load(path, weights_only=True)``.
        """
        spec = state["base"]
        if spec["kind"] == "factorised":
            raise ValueError("a factorised base cannot be rebuilt from its description; construct "
                             "GaussianPosterior(mean, scale_tril, names, base=...) directly")
        base = make_standard(spec["kind"], spec["dim"], df=spec.get("df"))
        return cls(state["mean"], state["scale_tril"], list(state["names"]), target, base=base,
                   elbo=state.get("elbo", math.nan), elbo_se=state.get("elbo_se", math.nan), info=state.get("info"))


class SamplePosterior(Posterior):
    """Draws from MCMC (or any sampler): ``draws`` of shape ``(chains, draws_per_chain, D)``.

    Parameters
    ----------
    draws : torch.Tensor of shape (C, S, D)
    names : list of str
    target : optional
    stats : dict, optional
        Per-chain sampler statistics, each an array of shape ``(C, S)`` (e.g. ``diverging``,
        ``acceptance_rate``, ``step_size``, ``tree_depth``), exported to ArviZ's ``sample_stats``.
    info : dict, optional
        Run details. ``info["warmup_draws"]`` (``(C, W, D)``) and ``info["warmup_stats"]`` (each ``(C, W)``),
        when present, are exported to ArviZ's ``warmup_posterior`` / ``warmup_sample_stats``.
    engine_state : optional
        The sampler's final state (for resuming or extending the run, e.g. :class:`gpvi.inference.mcmc.hmc.MCMCState`);
        ``state_dict()`` includes its ``state_dict()``.
    """

    def __init__(self, draws: torch.Tensor, names: list[str], target: Any = None, *,
                 stats: dict[str, Any] | None = None, info: dict[str, Any] | None = None,
                 engine_state: Any = None) -> None:
        super().__init__(names, target, info)
        if draws.dim() != 3 or draws.shape[-1] != len(names):
            raise ValueError(f"draws must have shape (chains, draws, {len(names)}); got {tuple(draws.shape)}")
        if draws.shape[0] == 0 or draws.shape[1] == 0:
            raise ValueError(f"draws is empty (shape {tuple(draws.shape)})")
        self.draws = draws.detach().clone()
        self.stats = dict(stats or {})
        self.engine_state = engine_state

    @property
    def samples(self) -> torch.Tensor:
        """All draws pooled, ``(chains * draws, D)``."""
        return self.draws.reshape(-1, self.dim)

    @property
    def num_chains(self) -> int:
        return self.draws.shape[0]

    @property
    def mean(self) -> torch.Tensor:
        return self.samples.mean(0)

    @property
    def covariance(self) -> torch.Tensor:
        return torch.cov(self.samples.T).reshape(self.dim, self.dim)

    def sample(self, n: int, *, generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
        """``n`` rows picked from the pooled draws (without replacement when ``n`` <= the number of draws)."""
        n = check_positive_int(n, "n")
        gen = resolve_generator(seed, generator)
        total = self.samples.shape[0]
        if n <= total:
            idx = torch.randperm(total, generator=gen)[:n]
        else:
            idx = torch.randint(total, (n,), generator=gen)
        return self.samples[idx.to(self.samples.device)]

    def _moments(self):
        s = self.samples
        return s.mean(0), s.std(0) if s.shape[0] > 1 else torch.zeros(self.dim, dtype=s.dtype)

    def _quantiles(self, probs):
        return torch.quantile(self.samples, probs.to(self.samples), dim=0)

    def _predict_draws(self, num_draws, *, generator, seed):
        num_draws = check_positive_int(num_draws, "num_draws")
        total = self.samples.shape[0]
        if num_draws >= total:
            return self.samples
        # evenly spaced over the pooled chains: deterministic and low-variance
        idx = torch.linspace(0, total - 1, num_draws).round().long()
        return self.samples[idx]

    def ess(self) -> torch.Tensor:
        """Effective sample size per parameter (Pyro's ``effective_sample_size``, all chains), shape (D,)."""
        from pyro.ops.stats import effective_sample_size
        return effective_sample_size(self.draws, chain_dim=0, sample_dim=1)

    def r_hat(self) -> torch.Tensor:
        """Split R-hat per parameter (Pyro's ``split_gelman_rubin``), shape (D,)."""
        from pyro.ops.stats import split_gelman_rubin
        if self.draws.shape[1] < 4:
            return torch.full((self.dim,), math.nan, dtype=self.draws.dtype)
        return split_gelman_rubin(self.draws, chain_dim=0, sample_dim=1)

    def _extra_summary_columns(self):
        return {"ess": self.ess().tolist(), "r_hat": self.r_hat().tolist()}

    def _arviz_draws(self, num_draws, seed):
        return self.draws

    def _arviz_extra(self):
        out: dict[str, Any] = {}
        if self.stats:
            out["sample_stats"] = {k: torch.as_tensor(v).cpu().numpy() for k, v in self.stats.items()}
        warm = self.info.get("warmup_draws")
        if isinstance(warm, torch.Tensor) and warm.dim() == 3 and warm.shape[1] > 0:
            out["warmup_posterior"] = {n: warm[:, :, j].cpu().numpy() for j, n in enumerate(self.names)}
            wstats = self.info.get("warmup_stats") or {}
            if wstats:
                out["warmup_sample_stats"] = {k: torch.as_tensor(v).cpu().numpy() for k, v in wstats.items()}
            out["save_warmup"] = True
        return out

    def state_dict(self) -> dict[str, Any]:
        out = {"kind": "samples", "draws": self.draws, "names": self.names, "stats": _plain(self.stats),
               "info": _plain(self.info)}
        if self.engine_state is not None and callable(getattr(self.engine_state, "state_dict", None)):
            out["engine_state"] = self.engine_state.state_dict()
        return out
