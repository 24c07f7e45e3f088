r"""NUTS and HMC over the unconstrained theta, on the same ``log_joint`` as DSVI and ML-II.

The samplers target :math:`\pi(\theta) \propto g(\theta) = p(y \mid \theta)\,p(\theta)`, the same log joint
:math:`\log g(\theta)` that DSVI's bound (DSVI paper eq. 3) and ML-II use, with potential energy
:math:`U(\theta) = -\log g(\theta)` and kinetic energy :math:`K(r) = \tfrac12 r^\top M^{-1} r`:

.. math::

    H(\theta, r) = -\log g(\theta) + \tfrac12 r^\top M^{-1} r,\qquad r \sim \mathcal N(0, M),

integrated by the leapfrog (velocity Verlet) scheme with step size :math:`\epsilon` (Neal 2011, eqs. 5.18-5.20).
:class:`HMC` runs a fixed trajectory length :math:`L\epsilon`; :class:`NUTS` builds the trajectory by doubling
until a U-turn, with multinomial sampling of the next state (Hoffman & Gelman 2014, Algorithm 3 with the
multinomial variant of Betancourt 2017). During warm-up the step size is tuned by dual averaging towards a
target acceptance statistic (Hoffman & Gelman 2014, Algorithm 5 / eq. 6) and a diagonal (or dense) inverse mass
matrix :math:`M^{-1}` is estimated from the warm-up draws in Stan's doubling windows.

The Hamiltonian machinery is Pyro's (``pyro.infer.mcmc.NUTS`` / ``HMC`` with ``potential_fn``); this module
is the driver: chains, seeding, initialisation, per-draw statistics, progress, interruption and resume.

Chains run one after another in this process. Each chain ``c`` has its own seed (drawn once from ``seed`` /
``generator``) and its own RNG stream, so the draws of a chain do not depend on the others, on the number of
chains, on callbacks, or on interruptions. Pyro draws momenta from torch's *global* RNG: every run is wrapped
in :func:`torch.random.fork_rng`, the global state is set from the chain's saved stream before each transition
and read back after it, and the caller's global RNG state is unchanged when ``run`` returns.

After warm-up a chain's adapted step size and inverse mass matrix are frozen and sampling continues with a
fresh non-adapting kernel started at the last warm-up state: that snapshot (state, step size, mass matrix,
RNG state), updated after every draw, is what :class:`MCMCState` stores. Resuming an interrupted run, or
extending a finished one to more draws, therefore reproduces the uninterrupted run exactly. A chain
interrupted during warm-up repeats its warm-up on resume (same result, time lost).

Names: ``theta`` (:math:`\theta`), ``step_size`` (:math:`\epsilon`), ``inverse_mass_matrix``
(:math:`M^{-1}`), ``num_steps`` (:math:`L`), ``target_accept`` (:math:`\delta` of dual averaging).

Pyro internals used (checked by the tests, pyro-ppl 1.9): ``kernel._t``, ``kernel._warmup_steps``,
``kernel._mean_accept_prob``, ``kernel._divergences``, ``kernel._potential_energy_last`` and
``kernel.mass_matrix_adapter.inverse_mass_matrix``.

References
----------
R. M. Neal (2011). MCMC using Hamiltonian dynamics. Handbook of Markov Chain Monte Carlo, ch. 5.
M. D. Hoffman and A. Gelman (2014). The No-U-Turn Sampler. JMLR 15, 1593-1623.
M. Betancourt (2017). A conceptual introduction to Hamiltonian Monte Carlo. arXiv:1701.02434.
A. Vehtari, A. Gelman, D. Simpson, B. Carpenter, P.-C. Bürkner (2021). Rank-normalization, folding, and
localization: an improved R-hat for assessing convergence of MCMC. Bayesian Analysis 16(2).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ...exceptions import ConvergenceWarning, InterruptedRunWarning, NotPSDError, NumericalWarning
from ...posteriors.base import PointPosterior, SamplePosterior
from ..progress import Progress
from ...rng import resolve_generator
from ...evaluation.table import Table
from ...models.target import as_target
from ...validation import (
    as_float_tensor,
    check_bool,
    check_fraction,
    check_nonnegative_int,
    check_positive,
    check_positive_int,
)

__all__ = ["NUTS", "HMC", "MCMCState", "ChainState"]

_SITE = "theta"
_KEY = (_SITE,)
_MAX_INIT_TRIES = 100
_SAMPLE_STATS = ("diverging", "acceptance_rate", "step_size", "n_steps", "lp")
_WARMUP_STATS = ("acceptance_rate", "step_size", "n_steps", "lp")


# ---------------------------------------------------------------------------------------------- state
@dataclass
class ChainState:
    """Progress of one chain (a snapshot; the engines never mutate a state they were given).

    Attributes
    ----------
    seed : int
        Seed of the chain's RNG stream (derived from the run's ``seed`` / ``generator``).
    init : torch.Tensor of shape (D,)
        Starting point of the warm-up.
    draws : torch.Tensor of shape (s, D)
        Post-warm-up draws so far.
    stats : dict of str to torch.Tensor of shape (s,)
        Per-draw statistics: ``diverging`` (bool), ``acceptance_rate`` (mean Metropolis acceptance
        probability over the trajectory, Stan's ``accept_stat``), ``step_size``, ``n_steps`` (gradient
        evaluations), ``lp`` (log joint at the draw) and, for NUTS, ``tree_depth``.
    warmup_draws : torch.Tensor of shape (w, D)
        Warm-up draws (``w = num_warmup`` once the warm-up is complete, else 0).
    warmup_stats : dict of str to torch.Tensor of shape (w,)
        As ``stats`` without ``diverging`` (Pyro records divergences only after warm-up).
    step_size : float or None
        Adapted step size after warm-up; ``None`` while the warm-up is not complete.
    inverse_mass_matrix : torch.Tensor of shape (D,) or (D, D), or None
        Adapted :math:`M^{-1}` after warm-up.
    position : torch.Tensor of shape (D,) or None
        Current state of the chain (the last draw, or the last warm-up state).
    rng_state : torch.Tensor or None
        torch CPU RNG state before the chain's next transition.
    warmup_time_s, sampling_time_s : float
        Wall time spent in warm-up and in sampling.
    num_evaluations : int
        Log-joint gradient evaluations (warm-up and sampling).
    num_nonfinite : int
        Evaluations where the log joint was not finite (counted, handled as zero density).
    num_numerical_warnings, num_numerical_warnings_warmup : int
        :class:`~gpvi.exceptions.NumericalWarning` s raised by the target (e.g. Cholesky jitter) while
        sampling and during warm-up.
    """

    seed: int
    init: torch.Tensor
    draws: torch.Tensor
    stats: dict[str, torch.Tensor]
    warmup_draws: torch.Tensor
    warmup_stats: dict[str, torch.Tensor]
    step_size: float | None = None
    inverse_mass_matrix: torch.Tensor | None = None
    position: torch.Tensor | None = None
    rng_state: torch.Tensor | None = None
    warmup_time_s: float = 0.0
    sampling_time_s: float = 0.0
    num_evaluations: int = 0
    num_nonfinite: int = 0
    num_numerical_warnings: int = 0
    num_numerical_warnings_warmup: int = 0

    @property
    def warmed_up(self) -> bool:
        """Whether the warm-up is complete (adapted step size and mass matrix available)."""
        return self.step_size is not None

    @property
    def num_draws(self) -> int:
        return int(self.draws.shape[0])

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> ChainState:
        return cls(**{k: state[k] for k in cls.__dataclass_fields__})


@dataclass
class MCMCState:
    """Everything needed to resume or extend a NUTS/HMC run (see :meth:`NUTS.run` with ``state=``).

    Attributes
    ----------
    names : list of str
        Parameter names of the target.
    settings : dict
        The sampler settings that must match on resume (kind, chains, warm-up and kernel settings).
    chains : list of ChainState
    """

    names: list[str]
    settings: dict[str, Any]
    chains: list[ChainState] = field(default_factory=list)

    @property
    def num_chains(self) -> int:
        return len(self.chains)

    def state_dict(self) -> dict[str, Any]:
        """Plain dict of tensors, numbers and strings (``torch.save`` it; load with :meth:`from_state_dict`)."""
        return {"kind": "mcmc", "names": list(self.names), "settings": dict(self.settings),
                "chains": [c.state_dict() for c in self.chains]}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> MCMCState:
        if not isinstance(state, dict) or state.get("kind") != "mcmc":
            raise ValueError("state must be an MCMCState or the dict returned by MCMCState.state_dict()")
        return cls(list(state["names"]), dict(state["settings"]),
                   [ChainState.from_state_dict(c) for c in state["chains"]])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace this state's contents by ``state`` (from :meth:`state_dict`)."""
        other = MCMCState.from_state_dict(state)
        self.names, self.settings, self.chains = other.names, other.settings, other.chains


# ---------------------------------------------------------------------------------------------- potential
class _Potential:
    r"""Pyro ``potential_fn``: :math:`U(\theta) = -\log g(\theta)` on ``{"theta": (D,)}``, counting evaluations.

    The target is evaluated as a batch of one (``(1, D) -> (1,)``), so a kernel matrix that cannot be
    factorised gives ``-inf`` (zero density, zero gradient) instead of an exception; Pyro then rejects the
    proposal (or marks the trajectory divergent). :class:`~gpvi.exceptions.NumericalWarning` s raised by the
    target (e.g. Cholesky jitter at extreme theta, common in early warm-up) are counted instead of repeated
    at every leapfrog step; the run reports the counts and warns once if any happened after warm-up.
    """

    def __init__(self, target: Any) -> None:
        self.target = target
        self.evaluations = 0
        self.nonfinite = 0
        self.numerical_warnings = 0

    def __call__(self, z: dict[str, torch.Tensor]) -> torch.Tensor:
        theta = z[_SITE]
        self.evaluations += 1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                lj = self.target.log_joint(theta.unsqueeze(0))[0]
            except NotPSDError:
                lj = None
        for w in caught:
            if issubclass(w.category, NumericalWarning):
                self.numerical_warnings += 1
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        if lj is None:
            self.nonfinite += 1
            return theta.sum() * 0.0 + math.inf
        if not bool(torch.isfinite(lj)):
            self.nonfinite += 1
        return -lj


def _tree_depth(n_steps: torch.Tensor) -> torch.Tensor:
    """Number of trajectory doublings, ``ceil(log2(n_steps + 1))`` (a full tree of depth j has 2^j - 1 steps)."""
    return torch.ceil(torch.log2(n_steps.to(torch.float64) + 1)).to(torch.int64)


def _check_seed(seed: Any) -> int | None:
    if seed is None:
        return None
    resolve_generator(seed)  # type and sign checks
    return int(seed)


# ---------------------------------------------------------------------------------------------- engines
class _Hamiltonian:
    """Shared driver of :class:`NUTS` and :class:`HMC` (settings only; state lives in :class:`MCMCState`)."""

    _kind = ""

    def __init__(self, num_chains: int, num_warmup: int, num_samples: int, *, seed: int | None,
                 progress_bar: bool, step_size: float, adapt_step_size: bool, adapt_mass_matrix: bool,
                 dense_mass: bool, target_accept: float, init_scale: float, min_ess: float | None,
                 max_r_hat: float) -> None:
        self.num_chains = check_positive_int(num_chains, "num_chains")
        self.num_warmup = check_nonnegative_int(num_warmup, "num_warmup")
        self.num_samples = check_positive_int(num_samples, "num_samples")
        self.seed = _check_seed(seed)
        self.progress_bar = check_bool(progress_bar, "progress_bar")
        self.step_size = check_positive(step_size, "step_size")
        self.adapt_step_size = check_bool(adapt_step_size, "adapt_step_size")
        self.adapt_mass_matrix = check_bool(adapt_mass_matrix, "adapt_mass_matrix")
        self.dense_mass = check_bool(dense_mass, "dense_mass")
        self.target_accept = check_fraction(target_accept, "target_accept", high_closed=False)
        self.init_scale = check_positive(init_scale, "init_scale", allow_zero=True)
        self.min_ess = None if min_ess is None else check_positive(min_ess, "min_ess", allow_zero=True)
        self.max_r_hat = check_positive(max_r_hat, "max_r_hat")
        if self.max_r_hat < 1:
            raise ValueError(f"max_r_hat must be >= 1; got {max_r_hat:g}")

    # -- to be provided by subclasses
    def _kernel_settings(self) -> dict[str, Any]:
        raise NotImplementedError

    def _make_kernel(self, potential: _Potential, step_size: float, adapt: bool):
        raise NotImplementedError

    def _extra_stats(self, stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {}

    # -- settings that must agree between a run and its resumption
    def _settings(self) -> dict[str, Any]:
        return {"kind": self._kind, "num_chains": self.num_chains, "num_warmup": self.num_warmup,
                "adapt_step_size": self.adapt_step_size, "adapt_mass_matrix": self.adapt_mass_matrix,
                "dense_mass": self.dense_mass, "target_accept": self.target_accept, "step_size": self.step_size,
                **self._kernel_settings()}

    # ------------------------------------------------------------------------------------------ init
    def initial_points(self, target: Any, init: Any = None, *, generator: torch.Generator | None = None,
                       seed: int | None = None) -> torch.Tensor:
        r"""The ``(num_chains, D)`` starting points :meth:`run` would use.

        Parameters
        ----------
        target : GPRegression or target
        init : optional
            ``None``: ``target.initial_theta()`` if the target has it, else zeros, plus jitter;
            a :class:`~gpvi.posteriors.base.PointPosterior` (ML-II) or a ``(D,)`` array: that point plus jitter
            :math:`\mathcal N(0, \text{init\_scale}^2 I)` per chain; a ``(num_chains, D)`` array: used as is;
            any other posterior with ``sample`` (e.g. DSVI's :class:`~gpvi.posteriors.base.GaussianPosterior`):
            one draw per chain from it.
        generator, seed
            Randomness of the jitter / draws.

        Returns
        -------
        torch.Tensor of shape (num_chains, D)
            Starting points where the log joint is finite (draws where it is not are redrawn, up to 100 times).

        Raises
        ------
        ValueError
            ``init`` has the wrong length or names, non-finite values, or a log joint that is not finite.
        """
        target = as_target(target)
        gen = resolve_generator(seed if seed is not None else self.seed, generator)
        return self._initial_points(target, init, gen)

    def _initial_points(self, target: Any, init: Any, gen: torch.Generator) -> torch.Tensor:
        D, C = len(target.names), self.num_chains

        def lj(theta: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return target.log_joint(theta)

        sampler: Callable[[int], torch.Tensor]
        if init is not None and not isinstance(init, PointPosterior) and callable(getattr(init, "sample", None)):
            names = getattr(init, "names", None)
            if names is not None and list(names) != list(target.names):
                raise ValueError(f"init is a posterior over {list(names)} but the target's parameters are "
                                 f"{list(target.names)}")

            def sampler(n: int) -> torch.Tensor:
                return init.sample(n, generator=gen).detach().to(torch.float64).cpu()
            what = f"draws from init ({type(init).__name__})"
        else:
            if isinstance(init, PointPosterior):
                if list(init.names) != list(target.names):
                    raise ValueError(f"init is a point estimate over {list(init.names)} but the target's "
                                     f"parameters are {list(target.names)}")
                centre = init.theta.detach().to(torch.float64).cpu()
            elif init is None:
                centre = (target.initial_theta().detach().to(torch.float64).cpu()
                          if callable(getattr(target, "initial_theta", None))
                          else torch.zeros(D, dtype=torch.float64))
            else:
                t = as_float_tensor(init, "init", ndim=(1, 2)).cpu()
                if t.shape[-1] != D:
                    raise ValueError(f"init must have length D = {D} (one value per parameter of the target); "
                                     f"got shape {tuple(t.shape)}")
                if t.dim() == 2:
                    if t.shape[0] != C:
                        raise ValueError(f"init of shape (chains, D) must have num_chains = {C} rows; "
                                         f"got {t.shape[0]}")
                    bad = ~torch.isfinite(lj(t))
                    if bool(bad.any()):
                        raise ValueError(f"the log joint is not finite at init rows {bad.nonzero().flatten().tolist()}")
                    return t.clone()
                centre = t
            if not bool(torch.isfinite(centre).all()):
                raise ValueError("init contains non-finite values")
            if not bool(torch.isfinite(lj(centre.unsqueeze(0))[0])):
                raise ValueError(f"the log joint is not finite at init {centre.tolist()}")

            def sampler(n: int) -> torch.Tensor:
                return centre + self.init_scale * torch.randn((n, D), generator=gen, dtype=torch.float64)
            what = "jittered starting points"

        starts = sampler(C)
        if starts.shape != (C, D):
            raise ValueError(f"init.sample({C}) returned shape {tuple(starts.shape)}; expected ({C}, {D})")
        for _ in range(_MAX_INIT_TRIES):
            good = torch.isfinite(starts).all(-1)
            if bool(good.any()):
                good[good.clone()] = torch.isfinite(lj(starts[good]))
            if bool(good.all()):
                return starts
            starts[~good] = sampler(int((~good).sum()))
        raise ValueError(f"could not find finite starting points: the log joint was not finite at {what} "
                         f"after {_MAX_INIT_TRIES} tries")

    # ------------------------------------------------------------------------------------------ run
    def run(self, target: Any, init: Any = None, *, seed: int | None = None,
            generator: torch.Generator | None = None, state: MCMCState | dict[str, Any] | None = None,
            callback: Callable[[int, int, dict[str, Any]], None] | None = None) -> SamplePosterior:
        r"""Run the chains and return the post-warm-up draws.

        Parameters
        ----------
        target : GPRegression or target
            Anything with ``log_joint(theta)`` (``(S, D) -> (S,)``, differentiable) and ``names``.
        init : optional
            Starting points; see :meth:`initial_points` (ML-II ``PointPosterior``, a ``(D,)`` or
            ``(num_chains, D)`` array, or a posterior to draw from such as DSVI's ``GaussianPosterior``).
        seed, generator
            Randomness of the whole run (starting points and every chain's stream); default the engine's
            ``seed``. The caller's global torch RNG state is left unchanged.
        state : MCMCState or dict, optional
            Resume (or extend to a larger ``num_samples``) the run that produced this state
            (``posterior.engine_state`` or its ``state_dict()``); ``init``/``seed``/``generator`` are then
            ignored. Chains, warm-up and kernel settings must match the state's.
        callback : callable, optional
            ``callback(chain, iteration, record)`` after every transition (warm-up included);
            ``record`` holds ``theta``, ``phase`` (``"warmup"``/``"sampling"``) and the statistics of the draw.
            It may raise ``KeyboardInterrupt`` to stop, like Ctrl-C.

        Returns
        -------
        SamplePosterior
            ``draws`` of shape ``(num_chains, num_samples, D)``; ``stats`` (each ``(num_chains, num_samples)``):
            ``diverging``, ``acceptance_rate``, ``step_size``, ``n_steps``, ``lp`` (+ ``tree_depth`` for NUTS);
            ``info``: ``chains`` (a per-chain :class:`~gpvi.evaluation.table.Table`), ``num_divergent``,
            ``step_size`` and ``inverse_mass_matrix`` per chain, ``warmup_draws`` ``(C, W, D)``,
            ``warmup_stats``, times, evaluation counters, ``ess``/``r_hat`` and ``interrupted``;
            ``engine_state`` (an :class:`MCMCState`) for resuming.

        Raises
        ------
        ValueError
            Bad ``init`` (wrong length, non-finite, zero density) or a ``state`` that does not match.
        KeyboardInterrupt
            Re-raised only when interrupted before the first post-warm-up draw (nothing to return).

        Warns
        -----
        ConvergenceWarning
            When any split R-hat exceeds ``max_r_hat`` (1.01), the smallest ESS is below ``min_ess`` (default
            100 per chain, Vehtari et al. 2021), or there were divergent transitions.
        InterruptedRunWarning
            When interrupted: the chains that finished are returned; if none did, the largest block of the
            first k chains cut to a common length (the first chain's draws so far, in a first run). Everything
            computed, including the unfinished chain's draws, is kept in ``engine_state`` for resuming.
        """
        target = as_target(target)
        names = list(target.names)
        if state is not None:
            st = self._check_state(state, names)
        else:
            gen = resolve_generator(seed if seed is not None else self.seed, generator)
            inits = self._initial_points(target, init, gen)
            seeds = torch.randint(0, 2**62, (self.num_chains,), generator=gen, dtype=torch.int64).tolist()
            D = len(names)
            empty = torch.empty((0, D), dtype=torch.float64)
            st = MCMCState(names, self._settings(), [
                ChainState(seed=int(s), init=inits[c].clone(), draws=empty.clone(), stats={},
                           warmup_draws=empty.clone(), warmup_stats={}) for c, s in enumerate(seeds)])
        st = MCMCState(st.names, dict(st.settings), list(st.chains))   # never mutate the caller's state
        potential = _Potential(target)
        interrupted = False
        t0 = time.perf_counter()
        with torch.random.fork_rng(devices=[]):
            for c in range(self.num_chains):
                try:
                    st.chains[c] = self._run_chain(c, st.chains[c], potential, callback, st)
                except KeyboardInterrupt:
                    interrupted = True
                    break
        wall = time.perf_counter() - t0
        return self._posterior(target, st, interrupted, wall)

    def _check_state(self, state: MCMCState | dict[str, Any], names: list[str]) -> MCMCState:
        if isinstance(state, dict):
            state = MCMCState.from_state_dict(state)
        if not isinstance(state, MCMCState):
            raise TypeError(f"state must be an MCMCState or its state_dict(); got {type(state).__name__}")
        if list(state.names) != names:
            raise ValueError(f"state is for parameters {list(state.names)} but the target has {names}")
        mine = self._settings()
        diff = {k: (state.settings.get(k), v) for k, v in mine.items() if state.settings.get(k) != v}
        if diff:
            detail = ", ".join(f"{k}: state {a!r} vs engine {b!r}" for k, (a, b) in diff.items())
            raise ValueError(f"state does not match this engine's settings ({detail}); resume with the same "
                             f"settings (num_samples may grow)")
        most = max(c.num_draws for c in state.chains)
        if most > self.num_samples:
            raise ValueError(f"state already holds {most} draws per chain; num_samples must be >= {most}")
        return state

    # ------------------------------------------------------------------------------------------ one chain
    def _run_chain(self, c: int, cs: ChainState, potential: _Potential, callback: Any,
                   st: MCMCState) -> ChainState:
        W, S = self.num_warmup, self.num_samples
        todo = (0 if cs.warmed_up else W) + (S - cs.num_draws)
        if todo == 0:
            return cs
        desc = f"{self._kind} chain {c + 1}/{self.num_chains}"
        done0 = (W if cs.warmed_up else 0) + cs.num_draws
        with Progress(W + S, enabled=self.progress_bar, desc=desc, initial=done0) as bar:
            if not cs.warmed_up:
                # on interruption the chain keeps no warm-up progress (resume repeats it exactly)
                st.chains[c] = cs
                cs = self._warmup(c, cs, potential, callback, bar)
                st.chains[c] = cs
            return self._sample(c, cs, potential, callback, bar, st)

    def _warmup(self, c: int, cs: ChainState, potential: _Potential, callback: Any, bar: Progress) -> ChainState:
        W = self.num_warmup
        t0 = time.perf_counter()
        e0, n0, w0 = potential.evaluations, potential.nonfinite, potential.numerical_warnings
        torch.default_generator.manual_seed(cs.seed)       # CPU only (fork_rng restores it)
        kernel = self._make_kernel(potential, self.step_size, adapt=True)
        kernel.initial_params = {_SITE: cs.init.clone()}
        kernel.setup(warmup_steps=W)
        z = {_SITE: cs.init.clone()}
        rng = torch.get_rng_state()
        draws: list[torch.Tensor] = []
        rec: dict[str, list[float]] = {k: [] for k in _WARMUP_STATS}
        for i in range(W):
            eps = float(kernel.step_size)
            torch.set_rng_state(rng)
            kernel._mean_accept_prob = 0.0
            e = potential.evaluations
            z = kernel.sample(z)
            rng = torch.get_rng_state()
            # Pyro's running mean over n = t draws, restarted from 0: accept = mean * n
            accept = float(kernel._mean_accept_prob) * kernel._t
            theta = z[_SITE].detach().clone()
            draws.append(theta)
            row = {"acceptance_rate": accept, "step_size": eps, "n_steps": potential.evaluations - e,
                   "lp": -float(kernel._potential_energy_last)}
            for k in _WARMUP_STATS:
                rec[k].append(row[k])
            bar.update(1, phase="warmup", step_size=eps, accept=accept)
            if callback is not None:
                callback(c, i, {"theta": theta, "phase": "warmup", **row})
        wstats = {k: torch.tensor(v, dtype=torch.int64 if k == "n_steps" else torch.float64)
                  for k, v in rec.items()}
        wstats.update(self._extra_stats(wstats))
        D = cs.init.shape[0]
        inv = kernel.mass_matrix_adapter.inverse_mass_matrix[_KEY].detach().clone()
        return replace(cs, warmup_draws=torch.stack(draws) if draws else torch.empty((0, D), dtype=torch.float64),
                       warmup_stats=wstats, step_size=float(kernel.step_size), inverse_mass_matrix=inv,
                       position=z[_SITE].detach().clone(), rng_state=rng,
                       warmup_time_s=time.perf_counter() - t0,
                       num_evaluations=cs.num_evaluations + potential.evaluations - e0,
                       num_nonfinite=cs.num_nonfinite + potential.nonfinite - n0,
                       num_numerical_warnings_warmup=potential.numerical_warnings - w0)

    def _sample(self, c: int, cs: ChainState, potential: _Potential, callback: Any, bar: Progress,
                st: MCMCState) -> ChainState:
        S = self.num_samples
        t0 = time.perf_counter()
        e0, n0, w0 = potential.evaluations, potential.nonfinite, potential.numerical_warnings
        # a fresh, non-adapting kernel at the snapshot: identical for first runs and resumed ones
        kernel = self._make_kernel(potential, cs.step_size, adapt=False)
        kernel.initial_params = {_SITE: cs.position.clone()}
        kernel.setup(warmup_steps=0)
        kernel.mass_matrix_adapter.inverse_mass_matrix = {_KEY: cs.inverse_mass_matrix.clone()}
        z = {_SITE: cs.position.clone()}
        # committed draws: [theta, stats row, RNG state after it]; one list append commits a draw atomically,
        # so an interruption anywhere leaves a consistent snapshot (only the last RNG state is kept)
        committed: list[list[Any]] = []
        num_div = int(cs.stats["diverging"].sum()) if "diverging" in cs.stats else 0
        eps = float(kernel.step_size)

        def snapshot() -> ChainState:
            rows = [e[1] for e in committed]
            new_stats = {k: torch.tensor([r[k] for r in rows], dtype=torch.bool if k == "diverging" else
                                         torch.int64 if k == "n_steps" else torch.float64)
                         for k in _SAMPLE_STATS}
            new_stats.update(self._extra_stats(new_stats))
            stats = ({k: torch.cat([cs.stats[k], v]) for k, v in new_stats.items()} if cs.stats else new_stats)
            new_draws = torch.stack([e[0] for e in committed]) if committed else cs.draws[:0]
            return replace(cs, draws=torch.cat([cs.draws, new_draws]), stats=stats,
                           position=committed[-1][0].clone() if committed else cs.position,
                           rng_state=committed[-1][2] if committed else cs.rng_state,
                           sampling_time_s=cs.sampling_time_s + time.perf_counter() - t0,
                           num_evaluations=cs.num_evaluations + potential.evaluations - e0,
                           num_nonfinite=cs.num_nonfinite + potential.nonfinite - n0,
                           num_numerical_warnings=cs.num_numerical_warnings + potential.numerical_warnings - w0)

        try:
            for i in range(cs.num_draws, S):
                torch.set_rng_state(committed[-1][2] if committed else cs.rng_state)
                kernel._t = kernel._warmup_steps            # Pyro's running means then cover this draw only
                kernel._mean_accept_prob = 0.0
                d0, e = len(kernel._divergences), potential.evaluations
                z = kernel.sample(z)
                theta = z[_SITE].detach().clone()
                row = {"diverging": len(kernel._divergences) > d0,
                       "acceptance_rate": float(kernel._mean_accept_prob), "step_size": eps,
                       "n_steps": potential.evaluations - e, "lp": -float(kernel._potential_energy_last)}
                committed.append([theta, row, torch.get_rng_state()])
                if len(committed) > 1:
                    committed[-2][2] = None
                num_div += int(row["diverging"])
                bar.update(1, phase="sampling", step_size=eps, accept=row["acceptance_rate"], div=num_div)
                if callback is not None:
                    callback(c, self.num_warmup + i, {"theta": theta, "phase": "sampling", **row})
        finally:
            st.chains[c] = snapshot()
        return st.chains[c]

    # ------------------------------------------------------------------------------------------ result
    def _posterior(self, target: Any, st: MCMCState, interrupted: bool, wall: float) -> SamplePosterior:
        from pyro.ops.stats import effective_sample_size, split_gelman_rubin

        S = self.num_samples
        # the chains that finished (a prefix: chains run in order); if none did, the largest rectangular
        # block of draws (the first k chains, each cut to the shortest of them)
        finished = [cs.num_draws >= S for cs in st.chains]
        best_k, length = (finished.index(False) if not all(finished) else len(finished)), S
        if best_k == 0:
            length = 0
            for k in range(1, len(st.chains) + 1):
                m = min(cs.num_draws for cs in st.chains[:k])
                if k * m >= best_k * length:
                    best_k, length = k, m
        if length == 0:
            raise KeyboardInterrupt(f"{self._kind} was interrupted before the first post-warm-up draw; "
                                    f"nothing to return")
        use = st.chains[:best_k]
        if best_k < len(st.chains) or length < S:
            interrupted = True
        draws = torch.stack([cs.draws[:length] for cs in use])
        stat_names = list(use[0].stats)
        stats = {k: torch.stack([cs.stats[k][:length] for cs in use]) for k in stat_names}
        W = self.num_warmup
        have_warmup = W > 0 and all(cs.warmup_draws.shape[0] == W for cs in use)
        wdraws = torch.stack([cs.warmup_draws for cs in use]) if have_warmup else None
        wstats = {k: torch.stack([cs.warmup_stats[k] for cs in use]) for k in use[0].warmup_stats} \
            if have_warmup else {}
        if length >= 4:
            ess = effective_sample_size(draws, chain_dim=0, sample_dim=1)
            rhat = split_gelman_rubin(draws, chain_dim=0, sample_dim=1)
        else:
            ess = rhat = torch.full((draws.shape[-1],), math.nan, dtype=torch.float64)
        num_div = [int(stats["diverging"][i].sum()) for i in range(len(use))]
        cols: dict[str, list[Any]] = {
            "draws": [length] * len(use), "divergent": num_div,
            "accept": [float(stats["acceptance_rate"][i].mean()) for i in range(len(use))],
            "step_size": [cs.step_size for cs in use],
            "mean_n_steps": [float(stats["n_steps"][i].double().mean()) for i in range(len(use))],
        }
        depth_hits = None
        if "tree_depth" in stats:
            max_depth = self._kernel_settings()["max_tree_depth"]
            cols["mean_tree_depth"] = [float(stats["tree_depth"][i].double().mean()) for i in range(len(use))]
            depth_hits = [int((stats["tree_depth"][i] >= max_depth).sum()) for i in range(len(use))]
            cols["max_depth_hits"] = depth_hits
        cols["warmup_s"] = [cs.warmup_time_s for cs in use]
        cols["sampling_s"] = [cs.sampling_time_s for cs in use]
        info: dict[str, Any] = {
            "engine": type(self).__name__, "settings": {**self._settings(), "num_samples": S},
            "interrupted": interrupted, "chains": Table([str(i) for i in range(len(use))], cols,
                                                        title=f"{self._kind} chains"),
            "ess": ess, "r_hat": rhat, "num_divergent": num_div, "divergences": sum(num_div),
            "step_size": [cs.step_size for cs in use],
            "inverse_mass_matrix": torch.stack([cs.inverse_mass_matrix for cs in use]),
            "chain_seeds": [cs.seed for cs in use], "inits": torch.stack([cs.init for cs in use]),
            "warmup_draws": wdraws, "warmup_stats": wstats,
            "warmup_time_s": [cs.warmup_time_s for cs in use],
            "sampling_time_s": [cs.sampling_time_s for cs in use],
            "time_s": wall,
            "num_evaluations": [cs.num_evaluations for cs in use],
            "num_nonfinite": [cs.num_nonfinite for cs in use],
            "num_numerical_warnings": [cs.num_numerical_warnings for cs in use],
            "num_numerical_warnings_warmup": [cs.num_numerical_warnings_warmup for cs in use],
        }
        post = SamplePosterior(draws, list(st.names), target, stats=stats, info=info, engine_state=st)
        n_num = sum(info["num_numerical_warnings"])
        if n_num:
            warnings.warn(f"{self._kind}: the log joint raised {n_num} NumericalWarning(s) (e.g. Cholesky jitter) "
                          f"while sampling, over {sum(info['num_evaluations'])} evaluations; counts per chain in "
                          f"posterior.info['num_numerical_warnings']", NumericalWarning, stacklevel=3)
        if interrupted:
            warnings.warn(f"{self._kind} interrupted: returning {len(use)} chain(s) of {length} draws "
                          f"(of {self.num_chains} x {S}); resume with run(target, state=posterior.engine_state)",
                          InterruptedRunWarning, stacklevel=3)
        else:
            self._warn_diagnostics(ess, rhat, sum(num_div), depth_hits, len(use), length)
        return post

    def _min_ess(self, num_chains: int) -> float:
        return 100.0 * num_chains if self.min_ess is None else self.min_ess

    def _warn_diagnostics(self, ess: torch.Tensor, rhat: torch.Tensor, divergences: int,
                          depth_hits: list[int] | None, num_chains: int, length: int) -> None:
        problems = []
        if bool((rhat > self.max_r_hat).any()):
            problems.append(f"split R-hat up to {float(rhat.nan_to_num(0).max()):.3f} > {self.max_r_hat:g}")
        need = self._min_ess(num_chains)
        if bool((ess < need).any()):
            problems.append(f"smallest ESS {float(ess.min()):.0f} < {need:g}")
        if divergences:
            problems.append(f"{divergences} divergent transition(s) after warm-up")
        if depth_hits and sum(depth_hits):
            problems.append(f"{sum(depth_hits)} draw(s) hit the maximum tree depth")
        if problems:
            warnings.warn(f"{self._kind} diagnostics: " + "; ".join(problems) +
                          f" ({num_chains} chains x {length} draws); see posterior.summary() and "
                          f"posterior.info['chains']", ConvergenceWarning, stacklevel=4)


class NUTS(_Hamiltonian):
    r"""No-U-Turn sampler over theta with step-size and mass-matrix adaptation (Pyro's NUTS kernel).

    Samples :math:`\pi(\theta) \propto g(\theta)` with potential :math:`U = -\log g(\theta)` (the log joint of
    DSVI paper eq. 3); the trajectory doubles until a U-turn or ``max_tree_depth`` doublings
    (Hoffman & Gelman 2014, Algorithm 3, multinomial variant), and the step size is adapted by dual averaging
    (Hoffman & Gelman 2014, Algorithm 5) during warm-up, in Stan's windows (75-step start buffer, doubling
    mass-matrix windows from 25 steps, 50-step end buffer; scaled down for short warm-ups).

    Parameters
    ----------
    num_chains : int
        Chains, run one after another in this process (default 4).
    num_warmup : int
        Warm-up (adaptation) transitions per chain, discarded from the posterior (>= 0).
    num_samples : int
        Post-warm-up draws per chain (>= 1).
    seed : int, optional
        Seed of the run (starting points and every chain's RNG stream); ``run(..., seed=/generator=)``
        overrides it. ``None``: non-deterministic.
    progress_bar : bool
        One tqdm bar per chain (step size, acceptance and divergences in the postfix).
    max_tree_depth : int
        Largest number of trajectory doublings (at most :math:`2^{\text{max\_tree\_depth}} - 1` steps).
    target_accept : float
        Target mean acceptance statistic :math:`\delta` of dual averaging, in (0, 1).
    step_size : float
        Initial step size (refined by a doubling/halving search and dual averaging when adapting).
    adapt_step_size, adapt_mass_matrix : bool
        Adapt during warm-up (both default True).
    dense_mass : bool
        Dense instead of diagonal :math:`M^{-1}` (default diagonal).
    init_scale : float
        Standard deviation of the per-chain jitter added to a point ``init`` (default 0.1, log scale).
    min_ess : float, optional
        ESS below which a :class:`~gpvi.exceptions.ConvergenceWarning` is issued; default 100 per chain
        (400 for 4 chains; Vehtari et al. 2021).
    max_r_hat : float
        Split R-hat above which a ``ConvergenceWarning`` is issued (default 1.01).

    See Also
    --------
    HMC : fixed trajectory length.
    gpvi.metrics.compare, gpvi.plots.compare_marginals : DSVI against these draws.

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.inference.mcmc.hmc import NUTS
    >>> target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=["a", "b"])
    >>> mc = NUTS(num_chains=2, num_warmup=100, num_samples=100, seed=0, progress_bar=False,
    ...           min_ess=0).run(target)
    >>> mc.draws.shape, mc.samples.shape
    (torch.Size([2, 100, 2]), torch.Size([200, 2]))
    >>> sorted(mc.stats)
    ['acceptance_rate', 'diverging', 'lp', 'n_steps', 'step_size', 'tree_depth']
    """

    _kind = "NUTS"

    def __init__(self, num_chains: int = 4, num_warmup: int = 500, num_samples: int = 1000, *,
                 seed: int | None = None, progress_bar: bool = True, max_tree_depth: int = 10,
                 target_accept: float = 0.8, step_size: float = 1.0, adapt_step_size: bool = True,
                 adapt_mass_matrix: bool = True, dense_mass: bool = False, init_scale: float = 0.1,
                 min_ess: float | None = None, max_r_hat: float = 1.01) -> None:
        super().__init__(num_chains, num_warmup, num_samples, seed=seed, progress_bar=progress_bar,
                         step_size=step_size, adapt_step_size=adapt_step_size, adapt_mass_matrix=adapt_mass_matrix,
                         dense_mass=dense_mass, target_accept=target_accept, init_scale=init_scale,
                         min_ess=min_ess, max_r_hat=max_r_hat)
        self.max_tree_depth = check_positive_int(max_tree_depth, "max_tree_depth")

    def _kernel_settings(self) -> dict[str, Any]:
        return {"max_tree_depth": self.max_tree_depth}

    def _make_kernel(self, potential: _Potential, step_size: float, adapt: bool):
        from pyro.infer.mcmc import NUTS as PyroNUTS
        return PyroNUTS(potential_fn=potential, step_size=step_size,
                        adapt_step_size=adapt and self.adapt_step_size,
                        adapt_mass_matrix=adapt and self.adapt_mass_matrix, full_mass=self.dense_mass,
                        use_multinomial_sampling=True, target_accept_prob=self.target_accept,
                        max_tree_depth=self.max_tree_depth)

    def _extra_stats(self, stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"tree_depth": _tree_depth(stats["n_steps"])}

    def __repr__(self) -> str:
        return (f"NUTS(num_chains={self.num_chains}, num_warmup={self.num_warmup}, num_samples={self.num_samples}, "
                f"seed={self.seed}, max_tree_depth={self.max_tree_depth}, target_accept={self.target_accept})")


class HMC(_Hamiltonian):
    r"""Hamiltonian Monte Carlo with a fixed trajectory length over theta (Pyro's HMC kernel).

    Each transition draws :math:`r \sim \mathcal N(0, M)`, takes :math:`L` leapfrog steps of size
    :math:`\epsilon` on :math:`H(\theta, r) = -\log g(\theta) + \tfrac12 r^\top M^{-1} r` (Neal 2011,
    eqs. 5.18-5.20) and accepts with probability :math:`\min(1, e^{-\Delta H})` (Neal 2011, eq. 5.23).
    When the step size is adapted, the trajectory length :math:`L\epsilon` = ``step_size * num_steps`` is
    kept and :math:`L = \lfloor \text{length} / \epsilon \rfloor` follows :math:`\epsilon` (Pyro's rule).

    Parameters
    ----------
    step_size : float
        Leapfrog step size :math:`\epsilon` (initial value when adapting).
    num_steps : int
        Leapfrog steps :math:`L` per transition (at the initial step size).
    num_chains, num_warmup, num_samples, seed, progress_bar, target_accept, adapt_step_size,
    adapt_mass_matrix, dense_mass, init_scale, min_ess, max_r_hat
        As for :class:`NUTS`.

    Examples
    --------
    >>> import gpvi
    >>> from gpvi.inference.mcmc.hmc import HMC
    >>> target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=["a", "b"])
    >>> mc = HMC(step_size=0.3, num_steps=5, num_chains=2, num_warmup=50, num_samples=100, seed=0,
    ...          progress_bar=False, min_ess=0).run(target)
    >>> mc.draws.shape
    torch.Size([2, 100, 2])
    """

    _kind = "HMC"

    def __init__(self, step_size: float = 0.1, num_steps: int = 10, num_chains: int = 4, num_warmup: int = 500,
                 num_samples: int = 1000, *, seed: int | None = None, progress_bar: bool = True,
                 target_accept: float = 0.8, adapt_step_size: bool = True, adapt_mass_matrix: bool = True,
                 dense_mass: bool = False, init_scale: float = 0.1, min_ess: float | None = None,
                 max_r_hat: float = 1.01) -> None:
        super().__init__(num_chains, num_warmup, num_samples, seed=seed, progress_bar=progress_bar,
                         step_size=step_size, adapt_step_size=adapt_step_size, adapt_mass_matrix=adapt_mass_matrix,
                         dense_mass=dense_mass, target_accept=target_accept, init_scale=init_scale,
                         min_ess=min_ess, max_r_hat=max_r_hat)
        self.num_steps = check_positive_int(num_steps, "num_steps")

    @property
    def trajectory_length(self) -> float:
        """:math:`L\\epsilon` at the initial settings (kept fixed while the step size adapts)."""
        return self.step_size * self.num_steps

    def _kernel_settings(self) -> dict[str, Any]:
        return {"num_steps": self.num_steps}

    def _make_kernel(self, potential: _Potential, step_size: float, adapt: bool):
        from pyro.infer.mcmc import HMC as PyroHMC
        return PyroHMC(potential_fn=potential, step_size=step_size, trajectory_length=self.trajectory_length,
                       adapt_step_size=adapt and self.adapt_step_size,
                       adapt_mass_matrix=adapt and self.adapt_mass_matrix, full_mass=self.dense_mass,
                       target_accept_prob=self.target_accept)

    def __repr__(self) -> str:
        return (f"HMC(step_size={self.step_size}, num_steps={self.num_steps}, num_chains={self.num_chains}, "
                f"num_warmup={self.num_warmup}, num_samples={self.num_samples}, seed={self.seed})")
