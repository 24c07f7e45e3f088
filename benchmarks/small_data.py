"""Hyperparameter posteriors on small data (issue 57): the log joint against a bare floor, the sampler's own cost,
bulk ESS per second against Pyro's NUTS, nutpie's NUTS and a NumPy random-walk Metropolis, and ``gpvi.infer``'s
wall.

Problems (fixed before any timing):

``tiny``     14 points, one input on [0, 10], ``y = sin x + 2 + 0.3 e``; ``ScaleKernel(RBF) + ConstantKernel`` with the
             constant frozen at 1; half-normal priors on the lengthscale (scale 5), the signal sd (2) and the noise sd
             (1): 3 hyperparameters (this script's own model, in the spirit of the held-out published model of the
             issue).
``stress``   the 24 problems of ``trust_stress.py`` (20-60 rows, 3-15 hyperparameters, gpvi's defaults).
``boston``   Boston's 455 training rows, 13 inputs, D = 15, defaults.

Sections (each one process, one thread; timings interleaved in rounds, medians):

``logjoint``  per N (14: tiny; 56: stress problem boston-0; 200: Boston's first 200 rows; 455: boston), median ms of
              one value + gradient at the default start: ``floor`` (the faster of two bare analytic torch functions
              written here for exactly that model: squared distances precomputed, or expanded), ``lean``
              (``model.closed_form.log_joint``, what the sampler calls), ``model`` (``GPRegression.log_joint_and_grad``,
              checked), ``potential`` (the sampler's wrapper around it: NumPy in, NumPy out), ``lean4`` (the closed form on
              4 thetas in one call: the sampler's call for 4 chains), ``previous`` (``log_joint`` + autograd with the closed form off:
              the path of the previous release). Values and gradients of floor and lean are checked equal.
``sampler``   gpvi's NUTS (4 chains x (500 warm-up + 1,000 draws), default settings) on every problem: wall, gradient
              evaluations, ms per gradient against the bare ``lean`` call measured in the same process (the sampler's
              overhead), min bulk and tail ESS, bulk ESS per second; against **Pyro's NUTS** (``pyro.infer.mcmc.NUTS``,
              multinomial, diagonal mass, target 0.8, the same 4 x (500 + 1,000)) on the previous log joint + autograd
              (``--pyro`` problems: the previous ``gpvi.NUTS`` was this kernel with per-transition bookkeeping, so this
              baseline is, if anything, faster than it was), against the stress suite's committed references (default
              ``gpvi.NUTS`` of the previous release: wall to 400 ESS), against **nutpie** (Rust NUTS, installed
              with the ``bench`` extra, driving the same closed-form call one theta at a time, ``--pyro`` problems),
              and against an adaptive **random-walk
              Metropolis** in NumPy (4 chains, 2,000 warm-up steps adapting a scaled covariance, then blocks of 2,000
              until min bulk ESS >= 400; its log joint is NumPy + SciPy's Cholesky, checked against gpvi's).
``infer``     ``gpvi.infer`` on tiny (seeds 0-2) and boston (seed 0): wall, stages, answer, trusted.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.small_data            # all sections
    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.small_data logjoint   # one section
    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.small_data --quick    # small runs, results *_quick
    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.small_data sampler --only=boston   # rows replaced
"""

from __future__ import annotations

import importlib
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import gpytorch as gp
import numpy as np
import scipy.linalg as sla
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpvi  # noqa: E402
from benchmarks._common import RESULTS, header, machine_info, write  # noqa: E402
from gpvi.inference.check import mixed  # noqa: E402
from gpvi.inference.mcmc import nuts as nuts_module  # noqa: E402
from gpvi.inference.mcmc.chains import Potential  # noqa: E402
from gpvi.posteriors.diagnostics import diagnostics  # noqa: E402

QUICK = "--quick" in sys.argv
NAME = "small_data_quick" if QUICK else "small_data"
ONLY = next((a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--only=")), None)
"""``--only=ID,...``: the sampler section on these problems only, their rows replacing those of the results file."""
F64 = {"dtype": torch.float64}
PYRO_PROBLEMS = ("tiny", "boston-0", "synth-2", "pendulum-1", "boston-1")
ROUNDS = 10 if QUICK else 30
CALLS = 20 if QUICK else 50


# ---------------------------------------------------------------------------------------------- problems
def tiny_model() -> Any:
    g = torch.Generator().manual_seed(0)
    X = torch.linspace(0.0, 10.0, 14, **F64).unsqueeze(-1)
    y = torch.sin(X[:, 0]) + 2.0 + 0.3 * torch.randn(14, generator=g, **F64)
    const = gp.kernels.ConstantKernel()
    const.constant = torch.tensor(1.0)
    const.raw_constant.requires_grad_(False)
    kernel = gp.kernels.ScaleKernel(gp.kernels.RBFKernel()) + const
    hn = torch.distributions.HalfNormal
    prior = {"lengthscale": hn(torch.tensor(5.0, **F64)), "signal_sd": hn(torch.tensor(2.0, **F64)),
             "noise_sd": hn(torch.tensor(1.0, **F64))}
    return gpvi.GPRegression(X, y, kernel=kernel, prior=prior)


def boston_model(n: int | None = None) -> Any:
    ds = gpvi.datasets.load_boston(seed=0)
    X, y = (ds.X_train, ds.y_train) if n is None else (ds.X_train[:n], ds.y_train[:n])
    return gpvi.GPRegression(X, y)


def stress() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The stress suite's 24 problems (as committed with their references) and the references."""
    from benchmarks.trust_stress import model_of
    data = json.loads((RESULTS / "trust_stress.json").read_text())["data"]
    return [dict(p, model=model_of(p)) for p in data["problems"]], data["references"]


# ---------------------------------------------------------------------------------------------- floors
def floor_default(model: Any, precomputed: bool):
    """Bare value + gradient of ScaleKernel(RBF-ARD) + noise + the default prior N(loc, 10 I), for ``model``'s data
    (loc: the data-scaled centre of issue 58, 0 on standardised data)."""
    X, y = model._Xc, model._y                         # the targets the GP sees (y - y_offset)
    n, d = X.shape
    D2 = (X[:, None, :] - X[None, :, :]).square().reshape(n * n, d) if precomputed else None
    half_log_2pi_n = 0.5 * n * math.log(2 * math.pi)
    prior_const = -0.5 * (d + 2) * math.log(2 * math.pi * 10.0)
    loc = model.prior.base_dist.loc.clone()
    assert torch.allclose(model.prior.base_dist.scale, torch.full_like(loc, math.sqrt(10.0))), "not the default prior"

    def f(th: torch.Tensor):
        ils2 = torch.exp(-th[:d])
        if precomputed:
            Kf = torch.exp(th[d] - 0.5 * (D2 @ ils2)).view(n, n)
        else:
            Xs = X * ils2.sqrt()
            h = -0.5 * (Xs * Xs).sum(-1)
            Kf = torch.addmm(h[:, None] + h[None, :] + th[d], Xs, Xs.T).clamp_max_(float(th[d])).exp_()
        K = Kf.clone()
        K.diagonal().add_(torch.exp(th[d + 1]))
        L = torch.linalg.cholesky(K)
        a = torch.cholesky_solve(y[:, None], L)[:, 0]
        u = th - loc
        val = -0.5 * (y @ a) - torch.log(L.diagonal()).sum() - half_log_2pi_n + prior_const - 0.05 * (u @ u)
        G = torch.cholesky_inverse(L).mul_(-0.5).addr_(a, a, alpha=0.5)
        GK = G * Kf
        g = torch.empty_like(th)
        if precomputed:
            g[:d] = 0.5 * ils2 * (GK.reshape(-1) @ D2)
        else:
            r = GK.sum(-1)
            g[:d] = ils2 * (r @ (X * X) - (X * (GK @ X)).sum(0))
        g[d] = GK.sum()
        g[d + 1] = torch.exp(th[d + 1]) * G.diagonal().sum()
        return val, g - u / 10.0
    return f


def floor_tiny(model: Any):
    """Bare value + gradient of the tiny model: sf2 exp(-r^2 / (2 l^2)) + 1 + noise, half-normal priors on l, sf, sn
    with the Jacobians of theta = (log l^2, log sf2, log sn2)."""
    X, y = model._Xc, model._y                         # the targets the GP sees (y - y_offset)
    n = X.shape[0]
    D2 = (X - X.T).square()
    c = math.log(2.0 / math.pi) * 1.5 - math.log(5.0) - math.log(2.0) - math.log(1.0) - 0.5 * n * math.log(2 * math.pi)
    ones = torch.ones(n, n, **F64)

    def f(th: torch.Tensor):
        e = torch.exp(th)                                     # l^2, sf2, sn2
        E = torch.exp(-0.5 * D2 / e[0])
        Kf = e[1] * E
        K = Kf + ones
        K.diagonal().add_(e[2])
        L = torch.linalg.cholesky(K)
        a = torch.cholesky_solve(y[:, None], L)[:, 0]
        # HalfNormal(s) on u = exp(theta/2): log p = const - u^2 / (2 s^2); Jacobian log(du/dtheta) = theta/2 + log 1/2
        pv = (-0.5 * e[0] / 25.0 + 0.5 * th[0]) + (-0.5 * e[1] / 4.0 + 0.5 * th[1]) + (-0.5 * e[2] + 0.5 * th[2])
        val = -0.5 * (y @ a) - torch.log(L.diagonal()).sum() + c - 3.0 * math.log(2.0) + pv   # 3 Jacobians: log 1/2
        G = torch.cholesky_inverse(L).mul_(-0.5).addr_(a, a, alpha=0.5)
        GK = G * Kf
        g = torch.stack([(GK * D2).sum() * 0.5 / e[0], GK.sum(), e[2] * G.diagonal().sum()])
        return val, g + torch.stack([0.5 - 0.5 * e[0] / 25.0, 0.5 - 0.5 * e[1] / 4.0, 0.5 - 0.5 * e[2]])
    return f


def interleaved(fns: dict[str, Any]) -> dict[str, float]:
    """Median ms per call of each function, measured in interleaved rounds of ``CALLS`` calls."""
    for f in fns.values():
        f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(ROUNDS):
        for k, f in fns.items():
            t0 = time.perf_counter()
            for _ in range(CALLS):
                f()
            times[k].append(1000.0 * (time.perf_counter() - t0) / CALLS)
    return {k: float(np.median(v)) for k, v in times.items()}


def section_logjoint() -> list[dict[str, Any]]:
    probs, _ = stress()
    cases = [("tiny", tiny_model()), ("boston-0", next(p["model"] for p in probs if p["id"] == "boston-0")),
             ("boston-200", boston_model(200)), ("boston", boston_model())]
    rows = []
    for name, model in cases:
        th = model.initial_theta()
        t1 = th.unsqueeze(0)
        lean = model.closed_form
        floors = {"floor_pre": floor_tiny(model)} if name == "tiny" else {
            "floor_pre": floor_default(model, True), "floor_exp": floor_default(model, False)}
        v_ref, g_ref = lean.log_joint(t1)
        for fl in floors.values():
            v, g = fl(th)
            assert abs(float(v) - float(v_ref)) < 1e-9 * abs(float(v_ref)), (name, float(v), float(v_ref))
            assert float((g - g_ref[0]).abs().max()) < 1e-8 * float(g_ref.abs().max()), name
        pot = Potential(model)
        z = th.numpy().copy()
        prev = _previous(model)

        def previous():
            t = t1.clone().requires_grad_(True)
            torch.autograd.grad(prev.log_joint(t).sum(), t)

        t4 = th.unsqueeze(0) + 0.01 * torch.arange(4, **F64).unsqueeze(-1)

        fns = {**{k: (lambda fl=fl: fl(th)) for k, fl in floors.items()},
               "lean": lambda: lean.log_joint(t1), "model": lambda: model.log_joint_and_grad(t1),
               "potential": lambda: pot(z[None, :]), "lean4": lambda: lean.log_joint(t4), "previous": previous}
        ms = interleaved(fns)
        floor = min(ms[k] for k in floors)
        row = {"problem": name, "N": model.num_data, "D": model.dim, **ms, "floor": floor,
               "lean_over_floor": ms["lean"] / floor, "potential_over_floor": ms["potential"] / floor,
               "lean4_over_lean": ms["lean4"] / ms["lean"],
               "previous_over_lean": ms["previous"] / ms["lean"]}
        print(row, flush=True)
        rows.append(row)
    return rows


def _previous(model: Any) -> Any:
    """The same model on the previous release's path: log_joint + autograd, no closed form."""
    import copy
    prev = copy.copy(model)
    prev._lean_joint = None
    return prev


# ---------------------------------------------------------------------------------------------- samplers
def run_gpvi_nuts(model: Any, warmup: int, draws: int, keep_draws: bool = False) -> dict[str, Any]:
    """gpvi's NUTS, with the time spent inside the log joint + gradient calls measured around each call (an
    instance attribute shadows ``model.closed_form.log_joint``, what the sampler calls, for the run): everything
    else is the sampler's own cost. ``keep_draws``: the draws too."""
    lean = model.closed_form
    real, spent = lean.log_joint, [0.0]

    def timed(*args, **kwargs):
        t = time.perf_counter()
        out = real(*args, **kwargs)
        spent[0] += time.perf_counter() - t
        return out

    lean.log_joint = timed
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mc = gpvi.NUTS(num_chains=4, num_warmup=warmup, num_draws=draws, seed=1, progress_bar=False).run(model)
    finally:
        del lean.log_joint
    wall = time.perf_counter() - t0
    ev = sum(mc.info["num_evaluations"])
    d = diagnostics(mc.draws)
    return {"kernel": "compiled" if nuts_module.compiled() is not None else "numpy", "wall": wall, "evals": ev, "ms_per_grad": 1000 * wall / ev, "logjoint_ms_per_grad": 1000 * spent[0] / ev,
            "overhead": wall / spent[0] - 1.0, "min_ess_bulk": float(d["ess_bulk"].min()),
            "min_ess_tail": float(d["ess_tail"].min()), "divergences": int(mc.info["divergences"]),
            "mean": mc.mean.tolist(), "sd": mc.std.tolist(), "max_r_hat": float(d["r_hat"].max()),
            **({"draws": mc.draws} if keep_draws else {})}


def run_pyro_nuts(model: Any, warmup: int, draws: int) -> dict[str, Any]:
    """Pyro's NUTS kernel on the previous log joint + autograd: 4 chains one after another, seeds 1-4."""
    import pyro
    from pyro.infer.mcmc import MCMC, NUTS as PyroNUTS
    prev = _previous(model)
    count = [0]

    def potential(z):
        count[0] += 1
        return -prev.log_joint(z["theta"].unsqueeze(0))[0]

    chains = []
    gen = torch.Generator().manual_seed(1)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for c in range(4):
            pyro.set_rng_seed(c + 1)                    # Pyro draws momenta from torch's global RNG
            init = model.initial_theta() + 0.1 * torch.randn(model.dim, generator=gen, **F64)
            kernel = PyroNUTS(potential_fn=potential, adapt_step_size=True, adapt_mass_matrix=True, full_mass=False,
                              use_multinomial_sampling=True, target_accept_prob=0.8, max_tree_depth=10)
            mcmc = MCMC(kernel, num_samples=draws, warmup_steps=warmup, initial_params={"theta": init},
                        num_chains=1, disable_progbar=True)
            mcmc.run()
            chains.append(mcmc.get_samples()["theta"])
    wall = time.perf_counter() - t0
    d = diagnostics(torch.stack(chains))
    return {"wall": wall, "evals": count[0], "ms_per_grad": 1000 * wall / count[0],
            "min_ess_bulk": float(d["ess_bulk"].min()), "min_ess_tail": float(d["ess_tail"].min())}


def run_nutpie(model: Any, warmup: int, draws: int) -> dict[str, Any] | None:
    """nutpie's NUTS (Rust; ``nutpie.compiled_pyfunc.from_pyfunc``) driving the same closed-form log joint + gradient
    as gpvi's sampler, one theta a call: 4 chains on one core (``cores=1``), diagonal mass matrix adaptation, seed 1.
    None when nutpie is not installed (it is not a dependency of gpvi)."""
    try:
        import nutpie
        from nutpie.compiled_pyfunc import from_pyfunc
    except ImportError:
        return None
    lean, D, count = model.closed_form, model.dim, [0]
    zero = np.zeros(D)

    def make_logp():
        def logp(x):
            count[0] += 1
            v, g = lean.log_joint(torch.from_numpy(np.asarray(x, dtype=np.float64)).unsqueeze(0))
            lp = float(v[0])
            return (lp, g[0].numpy()) if math.isfinite(lp) else (-math.inf, zero)
        return logp

    def make_expand(seed1, seed2, chain):
        return lambda x: {"theta": np.asarray(x, dtype=np.float64).copy()}

    th0 = model.initial_theta().numpy()
    compiled = from_pyfunc(D, make_logp, make_expand, [np.dtype("float64")], [(D,)], ["theta"],
                           make_initial_point_fn=lambda seed: th0 + 0.1 * np.random.default_rng(seed).standard_normal(D))
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = nutpie.sample(compiled, draws=draws, tune=warmup, chains=4, cores=1, seed=1, progress_bar=False)
    wall = time.perf_counter() - t0
    d = diagnostics(torch.as_tensor(trace.posterior["theta"].values))
    return {"wall": wall, "evals": count[0], "ms_per_grad": 1000 * wall / count[0],
            "min_ess_bulk": float(d["ess_bulk"].min()), "min_ess_tail": float(d["ess_tail"].min()),
            "version": nutpie.__version__}


def numpy_log_joint(model: Any, name: str):
    """The model's log joint in NumPy + SciPy (Cholesky), for the random-walk Metropolis."""
    X, y = model._Xc.numpy(), model.y.numpy()
    n = X.shape[0]
    if name == "tiny":
        D2 = (X - X.T) ** 2

        def f(th):
            e = np.exp(th)
            K = e[1] * np.exp(-0.5 * D2 / e[0]) + 1.0 + e[2] * np.eye(n)
            try:
                L = sla.cholesky(K, lower=True, check_finite=False)
            except np.linalg.LinAlgError:
                return -np.inf
            a = sla.cho_solve((L, True), y, check_finite=False)
            lp = -0.5 * y @ a - np.log(np.diag(L)).sum() - 0.5 * n * math.log(2 * math.pi)
            pv = (-0.5 * e[0] / 25.0 - 0.5 * e[1] / 4.0 - 0.5 * e[2] + 0.5 * th.sum()
                  + 1.5 * math.log(2.0 / math.pi) - math.log(5.0) - math.log(2.0) - 3.0 * math.log(2.0))
            return lp + pv
        return f
    d = X.shape[1]
    D2 = (X[:, None, :] - X[None, :, :]) ** 2

    def f(th):
        K = np.exp(th[d] - 0.5 * (D2 @ np.exp(-th[:d]))) + np.exp(th[d + 1]) * np.eye(n)
        try:
            L = sla.cholesky(K, lower=True, check_finite=False)
        except np.linalg.LinAlgError:
            return -np.inf
        a = sla.cho_solve((L, True), y, check_finite=False)
        return (-0.5 * y @ a - np.log(np.diag(L)).sum() - 0.5 * n * math.log(2 * math.pi)
                - 0.05 * th @ th - 0.5 * (d + 2) * math.log(2 * math.pi * 10.0))
    return f


def rwm_warmup(f: Any, x: np.ndarray, rng: np.random.Generator, warmup: int) -> tuple[np.ndarray, float, np.ndarray]:
    """Adaptive random-walk Metropolis warm-up from ``x`` (Haario et al. 2001): the proposal's covariance,
    (2.38^2 / D) times that of the second half of the path, re-estimated every 100 steps from step 200; returns the
    last point, its log density and the proposal's Cholesky factor."""
    D = x.shape[0]
    lp, hist = f(x), []
    L = np.linalg.cholesky(0.1 * np.eye(D))
    for i in range(warmup):
        path, x, lp = rwm_steps(f, x, lp, L, rng, 1)
        hist += path
        if i >= 200 and i % 100 == 0:
            L = np.linalg.cholesky((2.38 ** 2 / D) * np.cov(np.array(hist[i // 2:]).T) + 1e-8 * np.eye(D))
    return x, lp, L


def rwm_steps(f: Any, x: np.ndarray, lp: float, L: np.ndarray, rng: np.random.Generator, n: int
              ) -> tuple[list[np.ndarray], np.ndarray, float]:
    """``n`` random-walk Metropolis steps with proposal factor ``L``: (the path, the last point, its log density)."""
    path = []
    for _ in range(n):
        prop = x + L @ rng.standard_normal(x.shape[0])
        lq = f(prop)
        if math.log(rng.random()) < lq - lp:
            x, lp = prop, lq
        path.append(x)
    return path, x, lp


def run_rwm(model: Any, name: str, *, warmup: int = 2000, block: int = 2000, max_steps: int = 64000,
            target: float = 400.0, infer_targets: bool = False) -> dict[str, Any]:
    """Adaptive random-walk Metropolis (Haario et al. 2001 during warm-up, then fixed) in NumPy: wall to min bulk
    ESS >= ``target`` over 4 chains; with ``infer_targets``, it goes on to the wall at which its chains meet
    ``gpvi.infer``'s own targets for NUTS (:func:`gpvi.inference.check.mixed`: bulk and tail ESS >= ``target``,
    R-hat <= 1.01, every MCSE of a mean and of a sd <= 0.05 sd), checked after each block (``wall_to_targets``)."""
    f = numpy_log_joint(model, name)
    th0 = model.initial_theta().numpy()
    want = float(model.log_joint(model.initial_theta()))
    assert abs(f(th0) - want) < 1e-8 * abs(want), (f(th0), want)
    D = th0.shape[0]
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    chains, states = [], []
    for c in range(4):
        states.append(rwm_warmup(f, th0 + 0.1 * rng.standard_normal(D), rng, warmup))
        chains.append([])
    steps, ess, wall_400, wall_targets = 0, 0.0, math.nan, math.nan
    while steps < max_steps:
        for c in range(4):
            x, lp, L = states[c]
            path, x, lp = rwm_steps(f, x, lp, L, rng, block)
            chains[c] += path
            states[c] = (x, lp, L)
        steps += block
        x = torch.as_tensor(np.array(chains))
        d = diagnostics(x)
        ess = float(d["ess_bulk"].min())
        if ess >= target and math.isnan(wall_400):
            wall_400, steps_400 = time.perf_counter() - t0, steps
        if infer_targets and mixed(d, target, x.reshape(-1, D).std(0)):
            wall_targets = time.perf_counter() - t0
        if not math.isnan(wall_400) and (not infer_targets or not math.isnan(wall_targets)):
            break
    wall = time.perf_counter() - t0
    out = {"wall": wall, "steps_per_chain": steps, "warmup": warmup, "min_ess_bulk": ess,
           "ess_per_s": ess / wall, "wall_to_400": wall_400}
    if infer_targets:
        out.update(wall_to_targets=wall_targets, steps_to_400=steps_400 if not math.isnan(wall_400) else None)
    return out


def section_sampler() -> list[dict[str, Any]]:
    importlib.import_module("arviz")          # gpvi imports it on first use (seconds): paid here, not in a wall
    if nuts_module.compiled() is not None:     # numba's import and the compiled trees' cache load, likewise
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gpvi.NUTS(num_chains=1, num_warmup=2, num_draws=2, progress_bar=False).run(tiny_model())
    probs, refs = stress()
    cases = [{"id": "tiny", "model": tiny_model(), "half": "-"}] + probs + \
        [{"id": "boston", "model": boston_model(), "half": "-"}]
    if QUICK:
        cases = [c for c in cases if c["id"] in ("tiny", "boston-0")]
    if ONLY:
        cases = [c for c in cases if c["id"] in ONLY]
    W, S = (100, 200) if QUICK else (500, 1000)
    rows = []
    for c in cases:
        model = c["model"]
        bare = interleaved({"lean": lambda m=model: m.closed_form.log_joint(m.initial_theta().unsqueeze(0))})["lean"]
        r = run_gpvi_nuts(model, W, S)
        row = {"problem": c["id"], "half": c["half"], "N": model.num_data, "D": model.dim, "bare_ms": bare,
               "gpvi": {k: v for k, v in r.items() if k not in ("mean", "sd")},
               "overhead": r["overhead"], "ess_per_s": r["min_ess_bulk"] / r["wall"]}
        ref = refs.get(c["id"])
        if ref is not None:
            dm = np.abs(np.array(r["mean"]) - ref["mean"]) / np.array(ref["sd"])
            sr = np.array(r["sd"]) / np.array(ref["sd"])
            row["vs_ref"] = {"ref_wall_to_400": ref["wall_to_400"], "max_dmean_sd": float(dm.max()),
                             "sd_ratio_min": float(sr.min()), "sd_ratio_max": float(sr.max())}
        if c["id"] in PYRO_PROBLEMS or (QUICK and c["id"] == "tiny"):
            prev = _previous(model)
            t1 = model.initial_theta().unsqueeze(0)

            def previous():
                t = t1.clone().requires_grad_(True)
                torch.autograd.grad(prev.log_joint(t).sum(), t)

            p = run_pyro_nuts(model, W, S)
            p["previous_bare_ms"] = interleaved({"previous": previous})["previous"]
            row["pyro"] = p
            row["pyro_ess_per_s"] = p["min_ess_bulk"] / p["wall"]
            row["ess_per_s_ratio_vs_pyro"] = row["ess_per_s"] / row["pyro_ess_per_s"]
            npie = run_nutpie(model, W, S)
            if npie is not None:
                row["nutpie"] = npie
                row["nutpie_ess_per_s"] = npie["min_ess_bulk"] / npie["wall"]
            rw = run_rwm(model, "tiny" if c["id"] == "tiny" else "default", max_steps=8000 if QUICK else 64000)
            row["rwm"] = rw
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------- infer
def section_infer() -> list[dict[str, Any]]:
    rows = []
    cases = [("tiny", tiny_model, s) for s in ((0,) if QUICK else (0, 1, 2))]
    if not QUICK:
        cases.append(("boston", boston_model, 0))
    cases = [c for c in cases if ONLY is None or c[0] in ONLY]
    for name, make, seed in cases:
        model = make()
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            post = gpvi.infer(model, seed=seed, progress_bar=False)
        wall = time.perf_counter() - t0
        r = post.report
        row = {"problem": name, "seed": seed, "wall": wall, "answer": r.answer, "trusted": bool(r.trusted),
               "times": {k: float(v) for k, v in r.times.items()}, "mean": post.mean.tolist(), "sd": post.std.tolist(),
               "nuts": {k: (float(v) if isinstance(v, (int, float)) else str(v)) for k, v in (r.nuts or {}).items()}}
        if name == "tiny":
            row["rwm"] = run_rwm(model, "tiny", max_steps=8000 if QUICK else 64000, infer_targets=True)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------- report
def _speedup(r: dict[str, Any]) -> float:
    """The reference's wall to 400 ESS over this run's, both pro-rated by the smaller of bulk and tail ESS (the
    reference's rule)."""
    g = r["gpvi"]
    return r["vs_ref"]["ref_wall_to_400"] / (g["wall"] * 400.0 / max(min(g["min_ess_bulk"], g["min_ess_tail"]), 1.0))


def _rwm_cell(rw: dict[str, Any]) -> str:
    if math.isfinite(rw["wall_to_400"]):
        return f"{rw['wall_to_400']:.1f}"
    return f"> {rw['wall']:.0f} (ESS {rw['min_ess_bulk']:.0f} after {rw['steps_per_chain']:,} steps a chain)"


def render(data: dict[str, Any]) -> str:
    md = [header("Hyperparameter posteriors on small data (issue 57)"), ""]
    for sec, m in data.get("machine_per_section", {}).items():
        md.append(f"- section {sec}: ended {m['date']}, load {m['load_avg_1_5_15']}, {m['command']}")
    md.append("")
    if "logjoint" in data:
        md += ["## Log joint + gradient (ms per call, medians of interleaved rounds)", "",
               "lean x 4 = one call of the closed form on 4 thetas (the sampler's call for 4 chains).", "",
               "| problem | N | D | floor | lean | model | sampler's call | lean x 4 | previous release | lean / floor | "
               "call / floor | lean x 4 / lean | previous / lean |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in data["logjoint"]:
            l4 = (f"{r['lean4']:.3f}", f"{r['lean4_over_lean']:.2f}") if "lean4" in r else ("-", "-")
            md.append(f"| {r['problem']} | {r['N']} | {r['D']} | {r['floor']:.3f} | {r['lean']:.3f} | "
                      f"{r['model']:.3f} | {r['potential']:.3f} | {l4[0]} | {r['previous']:.3f} | "
                      f"{r['lean_over_floor']:.2f} | {r['potential_over_floor']:.2f} | {l4[1]} | "
                      f"{r['previous_over_lean']:.2f} |")
        md.append("")
    if "sampler" in data:
        md += ["## Samplers: 4 chains x (500 warm-up + 1,000 draws)", "",
               "gpvi = `gpvi.NUTS` (up to 200 data points the 4 chains advance together, one "
               "closed-form call on 4 thetas answering every chain's request; Boston's run one after another; "
               "its transitions " + _kernels(data["sampler"]) + "); "
               "ms/grad in NUTS = its wall per gradient of one chain; "
               "overhead = its wall over the time spent inside the log joint + gradient calls (timed around each "
               "call in the same run), minus 1: the sampler's and its wrapper's own work. ms/grad bare = the "
               "closed-form call alone on one theta, timed before the run. nutpie = nutpie's Rust NUTS (diagonal "
               "mass matrix, 4 chains on one core) driving the same closed-form call, one theta a call. Pyro = "
               "Pyro's NUTS on the previous release's log joint + autograd (same chains, warm-up and draws). Speed-up: "
               "the reference's wall to 400 ESS over this run's, both pro-rated by min(bulk, tail ESS) (the "
               "references' rule; they ran at another time and load). vs ref = the stress suite's committed default-NUTS reference of the "
               "previous release (|Δmean| in reference sds, sd ratio range, and speed-up in wall to 400 bulk ESS).", "",
               "| problem | half | N | D | ms/grad bare | ms/grad in NUTS | overhead | min bulk ESS | bulk ESS/s | "
               "vs ref: Δmean, sd ratio | speed-up to 400 ESS vs ref | Pyro ESS/s | gpvi / Pyro | nutpie ESS/s "
               "(ms/grad) | gpvi / nutpie | RWM wall to 400 ESS (s) |",
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in data["sampler"]:
            g, v = r["gpvi"], r.get("vs_ref")
            vs = f"{v['max_dmean_sd']:.2f}, {v['sd_ratio_min']:.2f}-{v['sd_ratio_max']:.2f}" if v else "-"
            sp = f"{_speedup(r):.1f}x" if v else "-"
            py = f"{r['pyro_ess_per_s']:.1f}" if "pyro" in r else "-"
            ratio = f"{r['ess_per_s_ratio_vs_pyro']:.1f}x" if "pyro" in r else "-"
            rw = _rwm_cell(r["rwm"]) if "rwm" in r else "-"
            npie = (f"{r['nutpie_ess_per_s']:.1f} ({r['nutpie']['ms_per_grad']:.3f})",
                    f"{r['ess_per_s'] / r['nutpie_ess_per_s']:.1f}x") if "nutpie" in r else ("-", "-")
            md.append(f"| {r['problem']} | {r['half']} | {r['N']} | {r['D']} | {r['bare_ms']:.3f} | "
                      f"{g['ms_per_grad']:.3f} | {100 * r['overhead']:.0f}% | {g['min_ess_bulk']:.0f} | "
                      f"{r['ess_per_s']:.1f} | {vs} | {sp} | {py} | {ratio} | {npie[0]} | {npie[1]} | {rw} |")
        md.append("")
    if "infer" in data:
        md += ["## gpvi.infer", "", "RWM wall to infer's targets: the same random-walk chains run on until they meet "
               "the targets `infer` holds its NUTS answer to (bulk and tail ESS >= 400, R-hat <= 1.01, every MCSE of a "
               "mean and of a sd <= 0.05 sd; checked every 2,000 steps a chain, at most 64,000).", "",
               "| problem | seed | answer | trusted | wall (s) | grid / q / psis / nuts (s) | RWM wall to 400 ESS (s) | "
               "RWM wall to infer's targets (s) |", "|---|---|---|---|---|---|---|---|"]
        for r in data["infer"]:
            t = r["times"]
            rw = _rwm_cell(r["rwm"]) if "rwm" in r else "-"
            wt = r.get("rwm", {}).get("wall_to_targets")
            wt = "-" if wt is None else f"{wt:.1f}" if math.isfinite(wt) else f"> {r['rwm']['wall']:.0f} (not met)"
            md.append(f"| {r['problem']} | {r['seed']} | {r['answer']} | {r['trusted']} | {r['wall']:.1f} | "
                      f"{t.get('grid', 0):.1f} / {t.get('q', 0):.1f} / {t.get('psis', 0):.1f} / {t.get('nuts', 0):.1f} | "
                      f"{rw} | {wt} |")
        md.append("")
    return "\n".join(md) + "\n"


def _kernels(rows: list[dict[str, Any]]) -> str:
    """Which NUTS kernel measured which rows: numba's compiled trees (``gpvi.inference.mcmc.trees``) or the NumPy
    transitions (rows without a record predate the compiled trees)."""
    comp = [r["problem"] for r in rows if r["gpvi"].get("kernel") == "compiled"]
    if len(comp) == len(rows):
        return "compiled with numba (`gpvi.inference.mcmc.trees`) on every row"
    if not comp:
        return "the NumPy kernel on every row"
    rest = ", ".join(r["problem"] for r in rows if r["problem"] not in comp)
    return f"compiled with numba (`gpvi.inference.mcmc.trees`) except on {rest} (the NumPy kernel, an earlier run)"


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    sections = args or ["logjoint", "sampler", "infer"]
    path = RESULTS / f"{NAME}.json"
    data: dict[str, Any] = {}
    for s in sections:
        result = {"logjoint": section_logjoint, "sampler": section_sampler, "infer": section_infer}[s]()
        if path.exists() and args:                     # read just before writing: sections may run in parallel
            data = json.loads(path.read_text())["data"]
        if ONLY and s in ("sampler", "infer") and s in data:       # these problems' rows replaced, the others kept
            new = {(r["problem"], r.get("seed")): r for r in result}
            result = [new.get((r["problem"], r.get("seed")), r) for r in data[s]]
        data[s] = result
        key = f"{s} --only={','.join(ONLY)}" if ONLY and s in ("sampler", "infer") else s
        data.setdefault("machine_per_section", {})[key] = machine_info()   # each section's own date and load
        write(NAME, render(data), data)


if __name__ == "__main__":
    main()
