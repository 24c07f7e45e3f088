r"""What NUTS and HMC share: settings, the start, the run over chains, resume and the result.

The engines follow the contract of :mod:`gpvi.inference.contract` except for the step loop, a per-chain loop
(:mod:`gpvi.inference.mcmc.chains`) around the NumPy transitions of :mod:`gpvi.inference.mcmc.kernel` (NUTS's, with
numba installed, compiled for all chains at once by :mod:`gpvi.inference.mcmc.trees`):

.. code-block:: text

    start = find_start(target, init, engine.default_init(target))    # an init strategy, called once
    state = engine.init(target, start, generator)                    # chain starts and per-chain seeds
    all chains together: warm-up, then draws (state.chains[c] is a consistent snapshot at every moment)
    posterior = engine.result(target, state, report)                 # draws, statistics, diagnostics

``run(target, state=s)`` resumes (or extends to a larger ``num_draws``) from a copy of ``s``; ``s`` is never
changed. Ctrl-C (or a callback raising ``KeyboardInterrupt``) returns the partial result with an
:class:`~gpvi.exceptions.InterruptedRunWarning`; the caller's global torch RNG state is unchanged by a run.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...exceptions import NumericalWarning
from ...models.target import as_target
from ...posteriors.point import PointPosterior
from ...posteriors.info import RunInfo
from ...posteriors.samples import SamplePosterior
from ...rng import check_seed, resolve_generator
from ...validation import check_bool, check_nonnegative_int, check_positive, check_positive_int
from ..contract import RunReport
from ..init import Start, find_start, init_to_default
from ..progress import warn_interrupted
from .chains import Potential, run_chains
from .kernel import Asks, Metric, Uniforms
from ...posteriors.diagnostics import diagnostics
from .diagnostics import chain_table, convergence_problems, e_bfmi, usable_block, warn_convergence
from .settings import Adaptation, ConvergenceChecks
from .starts import chain_starts, init_to_chains
from .state import ChainState, MCMCState

__all__ = ["HamiltonianEngine"]


def _ndim(x: Any) -> int | None:
    """Number of dimensions of an array-like ``x`` (``None`` for anything else)."""
    if isinstance(x, torch.Tensor):
        return x.dim()
    if isinstance(x, (np.ndarray, list, tuple)):
        try:
            return int(np.ndim(x))
        except ValueError:
            return None
    return None


class HamiltonianEngine:
    """Shared engine of :class:`~gpvi.inference.mcmc.nuts.NUTS` and :class:`~gpvi.inference.mcmc.hmc.HMC`.

    Holds validated settings only; everything that evolves lives in an
    :class:`~gpvi.inference.mcmc.state.MCMCState`. Subclasses set ``name`` and provide ``_kernel_settings``,
    ``_transition`` and (optionally) ``_extra_stats``.
    """

    name = ""

    def __init__(self, num_chains: int, num_warmup: int, num_draws: int, *, seed: int | None, progress_bar: bool,
                 step_size: float, adaptation: Adaptation, init_scale: float | None,
                 checks: ConvergenceChecks) -> None:
        self.num_chains = check_positive_int(num_chains, "num_chains")
        self.num_warmup = check_nonnegative_int(num_warmup, "num_warmup")
        self.num_draws = check_positive_int(num_draws, "num_draws")
        self.seed = check_seed(seed)
        self.progress_bar = check_bool(progress_bar, "progress_bar")
        self.step_size = check_positive(step_size, "step_size")
        if not isinstance(adaptation, Adaptation):
            raise TypeError(f"adaptation must be a gpvi.inference.mcmc.Adaptation; got {type(adaptation).__name__}")
        self.adaptation = adaptation
        self.init_scale = None if init_scale is None else check_positive(init_scale, "init_scale", allow_zero=True)
        if not isinstance(checks, ConvergenceChecks):
            raise TypeError(f"checks must be a gpvi.inference.mcmc.ConvergenceChecks; got {type(checks).__name__}")
        self.checks = checks

    # -- to be provided by subclasses
    def _kernel_settings(self) -> dict[str, Any]:
        raise NotImplementedError

    def _transition(self, z: np.ndarray, lp: float, g: np.ndarray, step_size: float, metric: Metric,
                    rng: Uniforms) -> Asks[tuple[np.ndarray, float, np.ndarray, dict[str, Any]]]:
        """One transition from ``z`` (a generator of :mod:`gpvi.inference.mcmc.kernel`): next state and its
        statistics."""
        raise NotImplementedError

    def _extra_stats(self, stats: dict[str, torch.Tensor], rows: list[dict[str, Any]] | None = None
                     ) -> dict[str, torch.Tensor]:
        return {}

    # -- settings that must agree between a run and its resumption
    def _settings(self) -> dict[str, Any]:
        return {"kind": self.name, "num_chains": self.num_chains, "num_warmup": self.num_warmup,
                **self.adaptation.settings(), "step_size": self.step_size, **self._kernel_settings()}

    def postfix(self, info: dict[str, Any]) -> dict[str, Any]:
        """Progress-bar postfix of one transition: phase, step size, acceptance (and divergences so far)."""
        out = {"phase": info["phase"], "step_size": info["step_size"], "accept": info["acceptance_rate"]}
        if "divergences" in info:
            out["div"] = info["divergences"]
        return out

    # ------------------------------------------------------------------------------------------ init
    def default_init(self, target: Any) -> Callable[[Any], Start]:
        """:func:`~gpvi.inference.init.init_to_default`: ``target.initial_theta()`` (or zeros), plus jitter."""
        return init_to_default()

    def _start(self, target: Any, init: Any) -> Start:
        """The :class:`Start` for ``init`` (any form :meth:`run` accepts), found once and timed."""
        names = list(target.names)
        init_names = getattr(init, "names", None)
        if init_names is not None and _ndim(init) is None and list(init_names) != names:
            what = "a point estimate" if isinstance(init, PointPosterior) else "a posterior"
            raise ValueError(f"init is {what} over {list(init_names)} but the target's parameters are {names}")
        if init_names is not None and callable(getattr(init, "sample", None)) \
                and not (hasattr(init, "theta") or hasattr(init, "scale_tril")):
            raise TypeError(f"init ({type(init).__name__}) is neither a point nor a Gaussian posterior; to start "
                            f"the chains from its draws pass init={type(init).__name__}.sample(num_chains, seed=...)")
        if _ndim(init) == 2:
            init = init_to_chains(init)
        return find_start(target, init, self.default_init(target), seed=0 if self.seed is None else self.seed)

    def initial_points(self, target: Any, init: Any = None, *, generator: torch.Generator | None = None,
                       seed: int | None = None) -> torch.Tensor:
        r"""The ``(num_chains, D)`` starting points :meth:`run` would use.

        Parameters
        ----------
        target : GPRegression or target
        init : optional
            As for :meth:`run`.
        generator, seed
            Randomness of the jitter / draws (default: a generator seeded with the engine's ``seed``).

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
        return chain_starts(target, self._start(target, init), self.num_chains, self.init_scale, gen)[0]

    def init(self, target: Any, start: Start, generator: torch.Generator) -> MCMCState:
        """A fresh state: one starting point per chain from ``start``, then one seed per chain, from ``generator``."""
        target = as_target(target)
        names = list(target.names)
        inits, how = chain_starts(target, start, self.num_chains, self.init_scale, generator)
        seeds = torch.randint(0, 2**62, (self.num_chains,), generator=generator, dtype=torch.int64,
                              device=generator.device).tolist()
        empty = torch.empty((0, len(names)), dtype=torch.float64, device=inits.device)
        chains = [ChainState(seed=int(s), init=inits[c].clone(), draws=empty.clone(), stats={},
                             warmup_draws=empty.clone(), warmup_stats={}) for c, s in enumerate(seeds)]
        info = {k: v for k, v in start.info.items() if k != "rows"}
        mass = self._mass_from(start)
        if mass is not None:
            info["inverse_mass_matrix_init"] = mass
            how["mass_matrix"] = "q's covariance (dense, fixed); step size adapted"
        elif (self.adaptation.mass_start == "init" and start.scale_source == "posterior"
              and start.scale_tril is not None):
            L = start.scale_tril.detach().to(torch.float64).cpu()
            info["inverse_mass_matrix_start"] = L @ L.T if self.adaptation.dense_mass else (L * L).sum(-1)
            how["mass_matrix"] = "adapted in windows from q's " + ("covariance" if self.adaptation.dense_mass
                                                                    else "marginal variances")
        return MCMCState(names, self._settings(), chains, {**info, **how})

    def _mass_from(self, start: Start) -> torch.Tensor | None:
        r""":math:`M^{-1} = CC^\top` from a Gaussian-posterior start (see ``Adaptation.mass_from_init``), else None."""
        if not self.adaptation.mass_from_init or start.scale_source != "posterior" or start.scale_tril is None:
            return None
        L = start.scale_tril.detach().to(torch.float64).cpu()
        return L @ L.T

    def resume(self, target: Any, state: MCMCState | dict[str, Any]) -> MCMCState:
        """Check ``state`` (an :class:`MCMCState` or its ``state_dict``) against ``target`` and the settings; a copy.

        Raises
        ------
        TypeError
            ``state`` is neither.
        ValueError
            Other parameter names, other settings (``num_draws`` may grow), or more draws than ``num_draws``.
        """
        names = list(as_target(target).names)
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
                             f"settings (num_draws may grow)")
        most = max(c.num_draws for c in state.chains)
        if most > self.num_draws:
            raise ValueError(f"state already holds {most} draws per chain; num_draws must be >= {most}; "
                             f"got {self.num_draws}")
        return state.copy()

    # ------------------------------------------------------------------------------------------ run
    def run(self, target: Any, init: Any = None, *, state: MCMCState | dict[str, Any] | None = None,
            generator: torch.Generator | None = None,
            callback: Callable[[int, int, dict[str, Any]], None] | None = None) -> SamplePosterior:
        r"""Run the chains and return the post-warm-up draws.

        Parameters
        ----------
        target : GPRegression or target
            Anything with ``log_joint(theta)`` (``(S, D) -> (S,)``, differentiable) and ``names``.
        init : optional
            Where the chains start, resolved by :func:`gpvi.inference.init.resolve_init` (``None``:
            :meth:`default_init`, the target's ``initial_theta()`` or zeros): a point (ML-II
            :class:`~gpvi.posteriors.point.PointPosterior`, a ``(D,)`` array, ``init_to_value``, ``init_to_map``)
            plus per-chain jitter :math:`\mathcal N(0, s^2 I)`, :math:`s` = ``init_scale``; a Gaussian posterior
            (DSVI's :class:`~gpvi.posteriors.gaussian.GaussianPosterior`) or ``"laplace"``: one draw per chain from
            it; a ``(num_chains, D)`` array (:class:`~gpvi.inference.mcmc.starts.init_to_chains`): used as is.
            Not with ``state``.
        state : MCMCState or dict, optional
            Resume (or extend to a larger ``num_draws``) the run that produced this state
            (``posterior.engine_state`` or its ``state_dict()``); it is never changed. Chains, warm-up and kernel
            settings must match the state's.
        generator : torch.Generator, optional
            Randomness of the starting points and of every chain's seed (default: a generator seeded with
            ``seed``). Not with ``state``. The caller's global torch RNG state is left unchanged.
        callback : callable, optional
            ``callback(chain, iteration, record)`` after every transition (warm-up included); ``record`` holds
            ``theta``, ``phase`` (``"warmup"``/``"sampling"``) and the statistics of the draw. It may raise
            ``KeyboardInterrupt`` to stop, like Ctrl-C.

        Returns
        -------
        SamplePosterior
            ``draws`` of shape ``(num_chains, num_draws, D)``; ``stats`` (each ``(num_chains, num_draws)``):
            ``diverging``, ``acceptance_rate``, ``step_size``, ``n_steps``, ``lp`` (+ ``tree_depth`` for NUTS);
            ``info`` (a :class:`~gpvi.posteriors.info.RunInfo`: ``converged`` (no problem in the convergence
            checks), ``interrupted``, ``steps`` (transitions over all chains), ``time_s``, ``total_time_s``,
            ``settings``, counter ``divergences``; details ``chains`` (a per-chain :class:`~gpvi.table.Table`),
            ``num_divergent``, ``step_size`` and ``inverse_mass_matrix`` per chain, ``warmup_draws`` ``(C, W, D)``,
            ``warmup_stats``, ``init`` (how the starts were found), per-chain times and evaluation counters,
            ``ess``/``r_hat``); ``engine_state`` (an :class:`MCMCState`) for resuming.

        Raises
        ------
        ValueError
            Bad ``init`` (wrong length, non-finite, zero density at the start), ``state`` together with ``init``
            or ``generator``, or a ``state`` that does not match.
        TypeError
            ``callback`` not callable, or a ``state`` or ``init`` of the wrong kind.
        KeyboardInterrupt
            Re-raised only when interrupted before the first post-warm-up draw (nothing to return).

        Warns
        -----
        ConvergenceWarning
            When any split R-hat exceeds ``checks.max_r_hat`` (1.01), the smallest ESS is below
            ``checks.min_ess`` (default 100 per chain, Vehtari et al. 2021), or there were divergent transitions.
        InterruptedRunWarning
            When interrupted: the chains that finished are returned; if none did, the largest block of the
            first k chains cut to a common length (the first chain's draws so far, in a first run). Everything
            computed, including the unfinished chain's draws, is kept in ``engine_state`` for resuming.
        """
        target = as_target(target)
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be callable; got {type(callback).__name__}")
        if state is not None:
            if init is not None or generator is not None:
                raise ValueError("state cannot be combined with init or generator (the state carries both)")
            st = self.resume(target, state)
        else:
            st = self.init(target, self._start(target, init), resolve_generator(self.seed, generator))
        potential = Potential(target)
        interrupted = False
        t_before, t0 = st.t, time.perf_counter()
        try:
            run_chains(self, st, potential, callback)
        except KeyboardInterrupt:
            interrupted = True
        elapsed = time.perf_counter() - t0
        st.wall_time += elapsed
        report = RunReport(interrupted=interrupted, stopped_early=False, time_s=elapsed,
                           steps_this_run=st.t - t_before, budget=None, progress_bar=self.progress_bar)
        return self.result(target, st, report)

    # ------------------------------------------------------------------------------------------ result
    def result(self, target: Any, state: MCMCState, report: RunReport) -> SamplePosterior:
        """The posterior of the chains in ``state`` (it keeps a copy of the state); end-of-run warnings.

        Raises
        ------
        KeyboardInterrupt
            ``state`` holds no post-warm-up draw (an interruption during the first chain's warm-up).
        """
        S = self.num_draws
        best_k, length = usable_block(state.chains, S)
        if length == 0:
            raise KeyboardInterrupt(f"{self.name} was interrupted before the first post-warm-up draw; "
                                    f"nothing to return")
        use = state.chains[:best_k]
        interrupted = report.interrupted or best_k < len(state.chains) or length < S
        draws = torch.stack([cs.draws[:length] for cs in use])
        stats = {k: torch.stack([cs.stats[k][:length] for cs in use]) for k in use[0].stats}
        W = self.num_warmup
        have_warmup = W > 0 and all(cs.warmup_draws.shape[0] == W for cs in use)
        wdraws = torch.stack([cs.warmup_draws for cs in use]) if have_warmup else None
        wstats = {k: torch.stack([cs.warmup_stats[k] for cs in use]) for k in use[0].warmup_stats} \
            if have_warmup else {}
        diag = diagnostics(draws)
        ess, rhat = torch.minimum(diag["ess_bulk"], diag["ess_tail"]), diag["r_hat"]
        table, num_div, depth_hits = chain_table(self.name, use, stats, length,
                                                 self._kernel_settings().get("max_tree_depth"))
        details: dict[str, Any] = {
            "chains": table, **diag, "num_divergent": num_div,
            "e_bfmi": e_bfmi(stats["energy"]) if "energy" in stats else [math.nan] * len(use),
            "step_size": [cs.step_size for cs in use],
            "inverse_mass_matrix": torch.stack([cs.inverse_mass_matrix for cs in use]),
            "chain_seeds": [cs.seed for cs in use], "inits": torch.stack([cs.init for cs in use]),
            "init": dict(state.init_info),
            "warmup_draws": wdraws, "warmup_stats": wstats,
            "warmup_time_s": [cs.warmup_time_s for cs in use],
            "sampling_time_s": [cs.sampling_time_s for cs in use],
            "num_evaluations": [cs.num_evaluations for cs in use],
            "num_nonfinite": [cs.num_nonfinite for cs in use],
            "num_numerical_warnings": [cs.num_numerical_warnings for cs in use],
            "num_numerical_warnings_warmup": [cs.num_numerical_warnings_warmup for cs in use],
        }
        info = RunInfo(engine=type(self).__name__, converged=False, interrupted=interrupted, steps=state.t,
                       time_s=report.time_s, total_time_s=state.wall_time,
                       settings={**self._settings(), "num_draws": S}, counters={"divergences": sum(num_div)},
                       details=details)
        post = SamplePosterior(draws, list(state.names), target, stats=stats, info=info, engine_state=state)
        n_num = sum(info["num_numerical_warnings"])
        if n_num:
            warnings.warn(f"{self.name}: the log joint raised {n_num} NumericalWarning(s) (e.g. Cholesky jitter) "
                          f"while sampling, over {sum(info['num_evaluations'])} evaluations; counts per chain in "
                          f"posterior.info['num_numerical_warnings']", NumericalWarning, stacklevel=3)
        if interrupted:
            warn_interrupted(f"{self.name} (returning {len(use)} chain(s) x {length} draws of "
                             f"{self.num_chains} x {S})", state.t, self.num_chains * (W + S))
        else:
            problems = convergence_problems(self.checks, ess, rhat, sum(num_div), depth_hits, len(use),
                                            info["e_bfmi"])
            post.info["converged"], post.info["problems"] = not problems, problems
            warn_convergence(self.name, problems, len(use), length, stacklevel=3)
        return post
