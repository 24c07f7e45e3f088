r"""The surface every posterior over theta shares, and the helpers its implementations use.

Every engine returns a posterior; they all answer the same questions the same way, so benchmark, plotting
and notebook code treats them alike:

=========================  ===========================================================================
``names``, ``dim``          parameter names and their number D
``mean``, ``std``           marginal means and standard deviations, each ``(D,)`` (``stddev``: alias of ``std``)
``sample(n, ...)``          ``(n, D)`` draws; randomness from ``generator`` or ``seed``
``quantile(p)``             marginal quantiles: ``(D,)`` for a number ``p``, ``(len(p), D)`` for a sequence
``marginals()``             one plain description per name of its 1-D marginal (see :meth:`Posterior.marginals`)
``summary()``               a :class:`~gpvi.table.Table` per parameter name (and natural-scale columns)
``predict(X, ...)``         mixture predictive over theta draws, when the target has ``predict(theta, X)``
``to_arviz()``              ``arviz.InferenceData`` with one variable per name
``state_dict()``            plain tensors, numbers, strings, lists and dicts, with ``"kind"`` and ``"version"``
``from_state_dict(d)``      the inverse; :meth:`Posterior.from_state_dict` on the base class picks the kind
``engine_state``            the engine's final state, a private snapshot (``None`` when there is none)
=========================  ===========================================================================

The implementations live in :mod:`~gpvi.posteriors.point` (:class:`PointPosterior`, ML-II / MAP),
:mod:`~gpvi.posteriors.gaussian` (:class:`GaussianPosterior`, DSVI and Salimans-Knowles, with full, diagonal or
low-rank storage) and :mod:`~gpvi.posteriors.samples` (:class:`SamplePosterior`, MCMC). Posteriors never change after the run that made them, and never alias an engine's
live state: ``engine_state`` is copied when the posterior is built.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch

from ..table import Table
from ..validation import check_fraction, check_positive_int
from ..numerics.predictive import MixturePredictive, at_levels
from .info import RunInfo

__all__ = ["Posterior", "posterior_from_state_dict", "STATE_VERSION"]

STATE_VERSION = 1
"""Version written under ``"version"`` by every posterior's ``state_dict``; ``from_state_dict`` reads only it."""

_SUMMARY_SEED = 20140621  # fixed seed for Monte Carlo parts of summaries (deterministic output)
_KINDS: dict[str, type] = {}


def _natural_scale(target: Any, names: list[str]) -> Any:
    """What maps theta to the natural scale for a summary: the target, or the model a target over its
    hyperparameters wraps (``target.model``, ``target.bound.model``), if it has ``natural_names``, ``natural(theta)``
    and the posterior's ``names``; else None."""
    for obj in (target, getattr(target, "model", None), getattr(getattr(target, "bound", None), "model", None)):
        if (obj is not None and hasattr(obj, "natural_names") and callable(getattr(obj, "natural", None))
                and list(getattr(obj, "names", names)) == list(names)):
            return obj
    return None


def _plain(obj: Any) -> Any:
    """Convert to tensors, numbers, strings, lists and dicts only, so ``torch.load(weights_only=True)`` accepts it."""
    if isinstance(obj, Table):
        return {"index": list(obj.index), "columns": {k: _plain(v) for k, v in obj.columns.items()}}
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (torch.Tensor, str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    return repr(obj)


def _quantile_names(prob: float) -> tuple[str, str, str]:
    lo = 100 * (1 - prob) / 2
    return f"q{lo:g}", "q50", f"q{100 - lo:g}"


def snapshot_engine_state(state: Any) -> Any:
    """A private copy of an engine state: ``state.copy()`` when it has one, else a deep copy (dicts included).

    A posterior keeps what the engine had at the end of the run; the engine (or the caller) may go on
    advancing its own state object in place without changing the posterior.
    """
    if state is None:
        return None
    if callable(getattr(state, "copy", None)) and not isinstance(state, dict):
        return state.copy()
    return copy.deepcopy(state)


class Posterior:
    """The shared surface (see the module docstring). Subclasses set ``kind`` and implement ``mean``, ``std``,
    ``sample``, ``_quantiles``, ``_marginal``, ``_state`` and ``_from_state``.

    Parameters
    ----------
    names : list of str
    target : optional
        The model it approximates (needed for ``predict`` and natural-scale summaries).
    info : RunInfo or dict, optional
        How the run went (kept as a :class:`~gpvi.posteriors.info.RunInfo`; a plain dict's entries named like its
        fields fill them, the rest become its ``details``).
    engine_state : optional
        The engine's final state; a private copy is kept (see :func:`snapshot_engine_state`).
    """

    kind: ClassVar[str] = ""
    names: list[str]
    target: Any

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("kind"):
            _KINDS[cls.kind] = cls

    def __init__(self, names: list[str], target: Any = None, info: dict[str, Any] | None = None, *,
                 engine_state: Any = None) -> None:
        self.names = list(names)
        self.target = target
        self.info = RunInfo.of(info)
        self.engine_state = snapshot_engine_state(engine_state)

    @property
    def dim(self) -> int:
        """Number of parameters D."""
        return len(self.names)

    # -- provided by subclasses
    @property
    def mean(self) -> torch.Tensor:
        """Marginal means, shape (D,)."""
        raise NotImplementedError

    @property
    def std(self) -> torch.Tensor:
        """Marginal standard deviations, shape (D,) (``inf`` where the posterior has no variance)."""
        raise NotImplementedError

    def sample(self, n: int, generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
        """``(n, D)`` draws; ``generator`` is used (and advanced) when given, else a fresh one seeded by ``seed``."""
        raise NotImplementedError

    def _quantiles(self, probs: torch.Tensor) -> torch.Tensor:
        """(len(probs), D) marginal quantiles for levels ``probs`` (float64, checked)."""
        raise NotImplementedError

    def _marginal(self, mean: torch.Tensor, sd: torch.Tensor) -> list[dict[str, Any]]:
        """Family-specific entries of :meth:`marginals` (one dict per parameter, without mean and sd)."""
        raise NotImplementedError

    def _state(self) -> dict[str, Any]:
        """Kind-specific entries of :meth:`state_dict`."""
        raise NotImplementedError

    @classmethod
    def _from_state(cls, state: dict[str, Any], target: Any, common: dict[str, Any]) -> Posterior:
        raise NotImplementedError

    # -- shared
    @property
    def stddev(self) -> torch.Tensor:
        """Alias of :attr:`std`."""
        return self.std

    def _moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.mean, self.std

    def quantile(self, p: Any) -> torch.Tensor:
        """Marginal quantiles at the levels ``p`` (:func:`~gpvi.numerics.predictive.at_levels`: a level in (0, 1)
        gives shape ``(D,)``, a sequence of them ``(len(p), D)``; ValueError or TypeError for anything else)."""
        return at_levels(p, self._quantiles)

    def marginals(self) -> dict[str, dict[str, Any]]:
        """A plain description of each parameter's 1-D marginal, keyed by name.

        Every entry has ``"family"`` (str), ``"mean"`` and ``"sd"`` (floats), plus the family's parameters:

        * ``"normal"``: ``loc``, ``scale`` (exact; Gaussian posteriors with a standard-normal base);
        * ``"student_t"``: ``df``, ``loc``, ``scale`` (exact; diagonal Gaussian-family posteriors with a
          Student-t base);
        * ``"location_scale"``: ``loc``, ``scale``, ``component`` (repr of the standard 1-D distribution;
          diagonal posteriors with a factorised base);
        * ``"linear_combination"``: ``loc`` only (a mixture of non-normal components, e.g. a full scale with a
          Student-t base: no closed form, use :meth:`quantile` or :meth:`sample`);
        * ``"point"``: ``value`` (:class:`PointPosterior`);
        * ``"empirical"``: ``num_draws`` (:class:`SamplePosterior`; the draws are ``samples[:, j]``).

        Returns
        -------
        dict of str to dict
            Numbers and strings only (serialisable as is).
        """
        mean, sd = self.mean.tolist(), self.std.tolist()
        extra = self._marginal(self.mean, self.std)
        return {n: {"family": e.pop("family"), "mean": m, "sd": s, **e}
                for n, m, s, e in zip(self.names, mean, sd, extra)}

    def summary(self, prob: float = 0.9, *, natural: bool = True) -> Table:
        """Per-parameter marginal summary.

        Parameters
        ----------
        prob : float
            Central interval mass for the quantile columns (0.9 -> q5, q50, q95).
        natural : bool
            Add natural-scale columns (``natural``, ``nat_mean``, ``nat_q5``, ``nat_q50``, ``nat_q95``) when the
            target provides ``natural_names`` and ``natural(theta)`` (e.g. ``GPRegression``: lengthscales and
            variances), or wraps a model that does (``target.model``, ``target.bound.model``: the CVI bound or EP
            evidence over a classifier's hyperparameters) with the posterior's ``names``. Natural-scale quantiles
            are exact (the transforms are monotone); the natural-scale mean is a Monte Carlo average over 4000
            draws with a fixed seed.

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
        tgt = _natural_scale(self.target, self.names) if natural else None
        if tgt is not None:
            nat_q = tgt.natural(q)
            draws = self.sample(4000, seed=_SUMMARY_SEED)
            nat_mean = tgt.natural(draws).mean(0)
            cols["natural"] = list(tgt.natural_names)
            cols["nat_mean"] = nat_mean.tolist()
            for j, name in enumerate(qn):
                cols["nat_" + name] = nat_q[j].tolist()
        return Table(self.names, cols, title=self._summary_title())

    def _summary_title(self) -> str:
        """The summary's title. A posterior that carries the report of the run that returned it (``gpvi.infer`` sets
        ``report``) tells that report's story, its ``title()``: one story, and an interruption flagged; any other
        tells its own (:meth:`_own_title`)."""
        title = getattr(getattr(self, "report", None), "title", None)
        return f"{type(self).__name__} summary: {title()}" if callable(title) else self._own_title()

    def _own_title(self) -> str:
        return f"{type(self).__name__} summary"

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
        """``arviz.InferenceData`` with one named variable per parameter (draws from the posterior)."""
        import arviz as az                                   # imported on use: importing ArviZ takes seconds
        draws = self._arviz_draws(num_draws, seed)          # (chains, draws, D)
        posterior = {n: draws[:, :, j].cpu().numpy() for j, n in enumerate(self.names)}
        return az.from_dict(posterior=posterior, **self._arviz_extra())

    def _arviz_draws(self, num_draws: int, seed: int) -> torch.Tensor:
        num_draws = check_positive_int(num_draws, "num_draws")
        return self.sample(num_draws, seed=seed).unsqueeze(0)

    def _arviz_extra(self) -> dict[str, Any]:
        return {}

    # -- serialisation
    def _state_info(self) -> dict[str, Any]:
        return self.info

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild the posterior (and resume the run, when an engine state is attached).

        Returns
        -------
        dict
            ``kind``, ``version`` (:data:`STATE_VERSION`), ``names``, the kind's own entries, ``info`` and, when
            there is one, ``engine_state`` (its ``state_dict()``). Only tensors, numbers, strings, lists and
            dicts, so ``torch.save`` it and read it back with ``torch.load(path, weights_only=True)``.
        """
        out: dict[str, Any] = {"kind": self.kind, "version": STATE_VERSION, "names": list(self.names)}
        out.update(self._state())
        out["info"] = _plain(self._state_info())
        es = self.engine_state
        if es is not None:
            if callable(getattr(es, "state_dict", None)):
                out["engine_state"] = es.state_dict()
            elif isinstance(es, dict):
                out["engine_state"] = _plain(es)
        return out

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], target: Any = None) -> Posterior:
        """Rebuild a posterior from :meth:`state_dict` output (e.g. after ``torch.load(..., weights_only=True)``).

        Called on :class:`Posterior` itself, the class is chosen by ``state["kind"]``; called on a subclass, the
        kind must match it. An ``engine_state`` in the dict is kept as that plain dict (engines accept it as
        ``run(..., state=...)``).

        Raises
        ------
        TypeError
            ``state`` is not a dict.
        ValueError
            Unknown or mismatched ``kind``, a ``version`` other than :data:`STATE_VERSION`, or a missing entry.
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be the dict returned by a posterior's state_dict(); got "
                            f"{type(state).__name__}")
        kind = state.get("kind")
        if kind not in _KINDS:
            raise ValueError(f"state has kind {kind!r}; known posterior kinds are {sorted(_KINDS)}")
        if cls.kind and kind != cls.kind:
            raise ValueError(f"state has kind {kind!r} but {cls.__name__} reads kind {cls.kind!r}; use "
                             f"Posterior.from_state_dict to pick the class from the kind")
        version = state.get("version")
        if version != STATE_VERSION:
            raise ValueError(f"state has version {version!r} but this gpvi reads version {STATE_VERSION} only (a "
                             f"state_dict() written by another gpvi: rebuild the posterior and save it again)")
        klass = _KINDS[kind]
        common = {"info": state.get("info"), "engine_state": state.get("engine_state")}
        try:
            return klass._from_state(state, target, common)
        except KeyError as exc:
            raise ValueError(f"state of kind {kind!r} lacks the entry {exc}: not a state_dict() of this gpvi's "
                             f"{klass.__name__}") from None

    def __repr__(self) -> str:
        return repr(self.summary(natural=False))


def posterior_from_state_dict(state: dict[str, Any], target: Any = None) -> Posterior:
    """Rebuild any posterior from its ``state_dict()`` (the class is chosen by ``state["kind"]``)."""
    return Posterior.from_state_dict(state, target)
