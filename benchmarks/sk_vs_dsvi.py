"""Salimans-Knowles (Algorithm 2 and its Hessian-free variant) vs DSVI: cost to reach the same Gaussian bound.

Two targets, both engines started from the same point, default settings except ``num_steps``:

* **Pima** Bayesian logistic regression (N = 200, D = 8, prior N(0, I), bias). The bound of any (m, C) is computed
  exactly (64-point Gauss-Hermite per data point), the reference is the deterministic optimum (L-BFGS on that bound,
  ``fit_gaussian_quadrature``), and marginals are compared with gpvi.NUTS (4 x 1000 draws, run here).
* **Boston** GP hyperparameter posterior (N = 455, d = 13, D = 15, prior N(0, 10)), started at ML-II (3 restarts).
  Bounds are Monte Carlo estimates with common random numbers (the same draws of eps for every q), the reference is
  the best bound found by any run, and marginals are compared with the NUTS draws of ``nuts_boston.py``.

For each engine a grid of run lengths N (doubling) is run; each run is timed (``run()`` only, no final bound
estimate) and its log-joint rows counted by a proxy target (every point at which log g and its gradient are
evaluated, whatever the engine does with them; autograd Hessians add D backward passes per step, reported
separately). An engine *reaches* the bound when ``F_ref - F(q) <= tol`` with two tolerances, both "the Monte Carlo
error of the bound": loose = 2 x the standard error of the usual 1000-draw estimate mean(log g) + H[q] (what DSVI
reports as ``elbo_se``) and strict = 2 x the standard error of the lower-variance 1000-draw estimate
mean(log g - log q) (what SKGaussian reports), both at the reference q.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sk_vs_dsvi.py            # full run (~45 min on this machine)
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sk_vs_dsvi.py --quick    # smoke test (~2 min)

Writes ``benchmarks/results/sk_vs_dsvi{,_quick}.{md,json}``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpvi  # noqa: E402
from benchmarks._common import RESULTS, header, write  # noqa: E402
from gpvi.inference.dsvi.engine import DSVI, SGD  # noqa: E402
from gpvi.inference.quadrature_fit import fit_gaussian_quadrature  # noqa: E402
from gpvi.models.logistic import BayesianLogisticRegression  # noqa: E402
from gpvi.posteriors import SamplePosterior  # noqa: E402
from gpvi.inference.salimans_knowles import SKGaussian  # noqa: E402


class Counting:
    """Proxy target counting the rows (points) at which the log joint is evaluated."""

    def __init__(self, target: Any) -> None:
        self._t = target
        self.names = list(target.names)
        self.rows = 0

    def log_joint(self, theta, batch=None):
        self.rows += 1 if theta.dim() == 1 else theta.shape[0]
        return self._t.log_joint(theta) if batch is None else self._t.log_joint(theta, batch=batch)

    def __getattr__(self, name):
        return getattr(self._t, name)


def engines(quick: bool, problem: str) -> dict[str, dict[str, Any]]:
    """name -> {make(N, seed) -> engine, grid of N}. Each engine's defaults except num_steps, plus: the S&K
    Hessian-free variant with 4 draws (2 antithetic pairs) per step, once also with the Laplace start that DSVI's
    GP default uses; DSVI with optimizer='natural' on Pima (its default there is SGD) and with optimizer='sgd' (the
    paper's Algorithm 1) on Boston (its default there is 'natural' with a Laplace start and early stopping)."""
    dsvi_common = dict(progress_bar=False, num_elbo_draws=0)
    sk_common = dict(progress_bar=False, num_elbo_draws=0)
    if problem == "pima":
        specs = {
            "SK Alg. 2 (Hessian, autograd)": ([25, 50, 100, 200, 400, 800, 1600],
                                              lambda N, s: SKGaussian(num_steps=N, seed=s, **sk_common)),
            "SK Hessian-free (S=4)": ([25, 50, 100, 200, 400, 800, 1600],
                                      lambda N, s: SKGaussian(num_steps=N, method="gradient", num_draws=4, seed=s,
                                                              **sk_common)),
            "DSVI (default here: SGD, S=4)": ([250, 500, 1000, 2000, 4000, 8000, 16000, 32000],
                                              lambda N, s: DSVI(num_steps=N, seed=s, **dsvi_common)),
            "DSVI (natural, S=4)": ([100, 200, 400, 800, 1600, 3200, 6400, 12800],
                                    lambda N, s: DSVI(num_steps=N, optimizer="natural", seed=s, **dsvi_common)),
        }
        if quick:
            specs = {k: (g[:3], f) for k, (g, f) in specs.items()}
    else:
        specs = {
            "SK Alg. 2 (Hessian, finite differences)": ([25, 50, 100, 200, 400],
                                                        lambda N, s: SKGaussian(num_steps=N, seed=s, **sk_common)),
            "SK Hessian-free (S=4)": ([50, 125, 250, 500, 1000],
                                      lambda N, s: SKGaussian(num_steps=N, method="gradient", num_draws=4, seed=s,
                                                              **sk_common)),
            "SK Hessian-free (S=4, Laplace start)": ([25, 50, 125, 250, 500],
                                                     lambda N, s: SKGaussian(num_steps=N, method="gradient",
                                                                             num_draws=4, init_scale="laplace",
                                                                             seed=s, **sk_common)),
            "DSVI (default here: natural, Laplace start, S=4)": ([125, 250, 500, 1000, 2000],
                                                                 lambda N, s: DSVI(num_steps=N, seed=s, **dsvi_common)),
            "DSVI (SGD = paper's Alg. 1, S=4)": ([2000, 8000],
                                                 lambda N, s: DSVI(num_steps=N, optimizer="sgd", seed=s,
                                                                   **dsvi_common)),
        }
        if quick:
            specs = {k: ([max(4, g[0] // 5), max(8, g[1] // 5)], f) for k, (g, f) in specs.items()}
    short = {k: ("SK Alg.2" if k.startswith("SK Alg") else "SK HF+Laplace" if "Laplace start" in k and k.startswith("SK")
                 else "SK HF" if k.startswith("SK") else "DSVI " + ("natural" if "natural" in k else "SGD"))
             for k in specs}
    return {k: {"make": f, "grid": g, "short": short[k]} for k, (g, f) in specs.items()}


def timed_run(make, N: int, seed: int, target: Any, init: Any) -> dict[str, Any]:
    eng = make(N, seed)
    proxy = Counting(target)
    failed = None
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        try:
            q = eng.run(proxy, init=init)
        except gpvi.exceptions.NumericalFaultError as err:        # reported as a failed run, not hidden
            q, failed = err.partial, str(err)[:120]
        wall = time.perf_counter() - t0
    msgs = sorted({f"{w.category.__name__}: {str(w.message)[:90]}" for w in rec})
    if failed:
        msgs = [f"FAILED: {failed}"] + msgs
    return {"q": q, "N": N, "seed": seed, "time_s": wall, "rows": proxy.rows, "failed": failed is not None,
            "steps": int(q.info.get("steps", N)),
            "backward": int(q.info.get("hessian_backward_passes", 0)), "warnings": msgs}


def bound_se_two_ways(target: Any, mean: torch.Tensor, C: torch.Tensor, n: int, seed: int) -> tuple[float, float]:
    """Standard errors of mean(log g) + H[q] and of mean(log g - log q) from the same n draws."""
    gen = torch.Generator().manual_seed(seed)
    D = mean.shape[0]
    with torch.no_grad():
        eps = torch.randn(n, D, generator=gen, dtype=torch.float64)
        lg = torch.cat([target.log_joint(mean + e @ C.T) for e in eps.split(250)])
    ok = torch.isfinite(lg)
    lg, eps = lg[ok], eps[ok]
    se_plain = float(lg.std() / math.sqrt(lg.numel()))
    se_low = float((lg + 0.5 * (eps * eps).sum(-1)).std() / math.sqrt(lg.numel()))
    return se_plain, se_low


def reach(runs: dict[str, list[dict]], gap_key: str, tols: dict[str, float]) -> dict[str, dict[str, Any]]:
    """engine -> criterion -> first N whose every seed is within tol (with median steps/time/rows), or None."""
    out: dict[str, dict[str, Any]] = {}
    for name, rs in runs.items():
        out[name] = {}
        for crit, tol in tols.items():
            out[name][crit] = None
            for N in sorted({r["N"] for r in rs}):
                at = [r for r in rs if r["N"] == N]
                if all(r[gap_key] <= tol for r in at):
                    out[name][crit] = {"N": N, "steps": int(statistics.median(r["steps"] for r in at)),
                                       "time_s": statistics.median(r["time_s"] for r in at),
                                       "rows": int(statistics.median(r["rows"] for r in at)),
                                       "backward": int(statistics.median(r["backward"] for r in at))}
                    break
            out[name]["max_N"] = max(r["N"] for r in rs)
    return out


def reach_table(runs: dict[str, list[dict]], gap_key: str, tols: dict[str, float]) -> list[str]:
    res = reach(runs, gap_key, tols)
    lines = ["| engine | criterion | first N reaching | steps run | median wall time s | log-joint rows | "
             "+ Hessian backward passes |", "|---|---|---|---|---|---|---|"]
    for name in runs:
        for crit, tol in tols.items():
            h = res[name][crit]
            if h is None:
                lines.append(f"| {name} | {crit} (tol {tol:.3g}) | not reached by N = {res[name]['max_N']} | - | - | "
                             f"- | - |")
            else:
                lines.append(f"| {name} | {crit} (tol {tol:.3g}) | {h['N']} | {h['steps']} | {h['time_s']:.2f} | "
                             f"{h['rows']} | {h['backward']} |")
    return lines


def headline(res: dict[str, dict[str, Any]], tols: dict[str, float], dsvi_default: str) -> list[str]:
    """One sentence per criterion: the fastest engine and its ratios to DSVI's default."""
    lines = []
    for crit in tols:
        hits = {n: v[crit] for n, v in res.items() if v[crit] is not None}
        if not hits:
            lines.append(f"- {crit}: no engine reached the reference within its grid")
            continue
        best = min(hits, key=lambda n: hits[n]["time_s"])
        fewest = min(hits, key=lambda n: hits[n]["rows"] + hits[n]["backward"])
        d = hits.get(dsvi_default)
        vs = (f"; DSVI's default took {d['time_s']:.2f} s and {d['rows']} rows "
              f"({d['time_s'] / hits[best]['time_s']:.1f}x the time, {d['rows'] / max(hits[best]['rows'], 1):.1f}x "
              f"the rows of the fastest)" if d is not None else
              f"; DSVI's default did not reach it (runs up to N = {res[dsvi_default]['max_N']})")
        lines.append(f"- {crit} (tol {tols[crit]:.3g}): fastest **{best}** ({hits[best]['time_s']:.2f} s, "
                     f"{hits[best]['rows']} rows); fewest evaluations {fewest} ({hits[fewest]['rows']} rows"
                     f"{' + %d backward passes' % hits[fewest]['backward'] if hits[fewest]['backward'] else ''}){vs}")
    return lines


def marginal_table(qs: dict[str, Any], ref: SamplePosterior, names: list[str]) -> list[str]:
    mb, sb = ref._moments()
    cols = list(qs)
    head = "| parameter | NUTS mean (sd) | " + " | ".join(f"{c}: dmean/sd, sd ratio" for c in cols) + " |"
    lines = [head, "|" + "---|" * (2 + len(cols))]
    cmp = {c: gpvi.metrics.compare(q, ref) for c, q in qs.items()}
    for j, n in enumerate(names):
        row = f"| {n} | {float(mb[j]):.3f} ({float(sb[j]):.3f}) | "
        row += " | ".join(f"{cmp[c].column('dmean_sd')[j]:+.2f}, {cmp[c].column('sd_ratio')[j]:.2f}" for c in cols)
        lines.append(row + " |")
    summ = " | ".join(f"{max(abs(v) for v in cmp[c].column('dmean_sd')):.2f}, "
                      f"{min(cmp[c].column('sd_ratio')):.2f}-{max(cmp[c].column('sd_ratio')):.2f}" for c in cols)
    lines.append(f"| **max abs dmean/sd; sd ratio range** | | {summ} |")
    return lines


def cost_table(runs: dict[str, list[dict]]) -> list[str]:
    """Per-step cost from each engine's longest successful run."""
    lines = ["| engine | ms per step | log-joint rows per step | ms per row (incl. engine overhead) |", "|---|---|---|---|"]
    for name, rs in runs.items():
        good = [r for r in rs if not r["failed"]]
        if not good:
            continue
        r = max(good, key=lambda r: (r["steps"], -r["time_s"]))
        lines.append(f"| {name} | {1e3 * r['time_s'] / r['steps']:.2f} | {r['rows'] / r['steps']:.1f} | "
                     f"{1e3 * r['time_s'] / r['rows']:.3f} |")
    return lines


def grid_table(runs: dict[str, list[dict]], gap_key: str, bound_key: str) -> list[str]:
    lines = ["| engine | N | steps run | seeds | median time s | rows | bound (median) | "
             "gap to reference (max over seeds) | warnings |", "|---|---|---|---|---|---|---|---|---|"]
    for name, rs in runs.items():
        for N in sorted({r["N"] for r in rs}):
            at = [r for r in rs if r["N"] == N]
            w = sorted({m for r in at for m in r["warnings"]})
            lines.append(f"| {name} | {N} | {int(statistics.median(r['steps'] for r in at))} | {len(at)} | "
                         f"{statistics.median(r['time_s'] for r in at):.2f} | "
                         f"{int(statistics.median(r['rows'] for r in at))} | "
                         f"{statistics.median(r[bound_key] for r in at):.4f} | {max(r[gap_key] for r in at):.4f} | "
                         f"{'; '.join(w)[:160] or '-'} |")
    return lines


# ------------------------------------------------------------------------------------------------ Pima
def pima(quick: bool) -> tuple[list[str], dict]:
    ds = gpvi.datasets.load_pima()
    model = BayesianLogisticRegression(ds.X_train, ds.y_train)
    ref = fit_gaussian_quadrature(model)
    F_ref = float(ref.elbo)
    se_plain, se_low = bound_se_two_ways(model, ref.mean, ref.scale_tril, 1000, 1)
    tols = {"loose": 2 * se_plain, "strict": 2 * se_low}
    seeds = [0] if quick else [0, 1, 2]
    runs: dict[str, list[dict]] = {}
    specs = engines(quick, "pima")
    for name, spec in specs.items():
        runs[name] = []
        for N in spec["grid"]:
            for s in seeds:
                r = timed_run(spec["make"], N, s, model, None)
                r["bound"] = -math.inf if r["failed"] else float(model.gaussian_bound(r["q"].mean, r["q"].scale_tril))
                r["gap"] = F_ref - r["bound"]
                runs[name].append(r)
            at = [r for r in runs[name] if r["N"] == N]
            print(f"pima {name} N={N}: time {statistics.median(r['time_s'] for r in at):.2f}s "
                  f"max gap {max(r['gap'] for r in at):.4f}", flush=True)
            if all(r["gap"] <= tols["strict"] for r in at) and N >= 4 * spec["grid"][0]:
                break                                     # converged to the strict target: longer runs add nothing
    nuts_kw = dict(num_chains=2, num_warmup=100, num_draws=200) if quick else \
        dict(num_chains=4, num_warmup=500, num_draws=1000)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mc = gpvi.NUTS(seed=0, progress_bar=False, **nuts_kw).run(model)
    t_nuts = time.perf_counter() - t0
    # q used for the marginals: each engine's first run reaching the strict target (else its longest), seed 0
    qs = {}
    for name, rs in runs.items():
        ok = [r for r in rs if r["seed"] == 0 and r["gap"] <= tols["strict"]]
        good = [r for r in rs if r["seed"] == 0 and not r["failed"]]
        if not ok and not good:
            continue
        pick = min(ok, key=lambda r: r["N"]) if ok else max(good, key=lambda r: r["N"])
        qs[f"{specs[name]['short']} N={pick['N']}"] = pick["q"]
    qs["quadrature optimum"] = ref
    lines = [
        "## Pima: Bayesian logistic regression (N = 200, D = 8, prior N(0, I), bias)", "",
        f"- reference: deterministic optimum of the Gaussian bound (L-BFGS on the 64-point quadrature bound): "
        f"F* = {F_ref:.4f}; every run's bound below is computed exactly by the same quadrature (no MC error)",
        f"- tolerances at the optimum (1000 draws): loose = 2 x se[mean(log g) + H] = {tols['loose']:.4f}, "
        f"strict = 2 x se[mean(log g - log q)] = {tols['strict']:.4f}",
        f"- seeds {seeds}; all engines start at theta = 0 with their default initial scale (0.1 I; DSVI natural: "
        f"the Laplace scale at 0)",
        f"- NUTS: {nuts_kw['num_chains']} chains x {nuts_kw['num_draws']} draws (+{nuts_kw['num_warmup']} warm-up), "
        f"{t_nuts:.1f} s, min ESS {float(mc.ess().min()):.0f}, max R-hat {float(mc.r_hat().max()):.3f}", "",
        "### Time and log-joint evaluations to reach the optimum bound", "",
        *headline(reach(runs, "gap", tols), tols, "DSVI (default here: SGD, S=4)"), "",
        *reach_table(runs, "gap", tols), "",
        "### Cost per step", "", *cost_table(runs), "",
        "### All runs", "", *grid_table(runs, "gap", "bound"), "",
        "### Final marginals vs NUTS (seed 0; dmean/sd = (mean_q - mean_NUTS) / sd_NUTS, sd ratio = sd_q / sd_NUTS)",
        "", *marginal_table(qs, mc, model.names), "",
    ]
    data = {"F_ref": F_ref, "tols": tols, "nuts_time_s": t_nuts,
            "runs": {k: [{kk: vv for kk, vv in r.items() if kk != "q"} for r in v] for k, v in runs.items()}}
    return lines, data


# ------------------------------------------------------------------------------------------------ Boston
def boston(quick: bool) -> tuple[list[str], dict]:
    ds = gpvi.datasets.load_boston(seed=0)
    model = gpvi.GPRegression(ds.X_train, ds.y_train)
    t0 = time.perf_counter()
    ml2 = gpvi.ML2(num_restarts=3, seed=0).run(model)
    t_ml2 = time.perf_counter() - t0
    n_bound = 200 if quick else 1000
    est = SKGaussian(num_elbo_draws=n_bound)

    def bound(q):
        F, se, bad = est.estimate_bound(model, q.mean, q.scale_tril, seed=12345)      # common random numbers
        return F, se, bad

    runs: dict[str, list[dict]] = {}
    specs = engines(quick, "boston")
    best = {"F": -math.inf, "se": math.nan}
    order = list(specs)                    # SK engines first: their plateau gives DSVI a target to stop at
    for name in order:
        spec = specs[name]
        runs[name] = []
        prev = None
        for i, N in enumerate(spec["grid"]):
            r = timed_run(spec["make"], N, 0, model, ml2)
            r["bound"], r["bound_se"], r["bound_invalid"] = (-math.inf, math.nan, 0) if r["failed"] else bound(r["q"])
            runs[name].append(r)
            if r["bound"] > best["F"]:
                best = {"F": r["bound"], "se": r["bound_se"], "q": r["q"], "who": f"{name} N={N}"}
            print(f"boston {name} N={N}: {r['time_s']:.1f}s rows {r['rows']} bound {r['bound']:.3f} "
                  f"+- {r['bound_se']:.3f}", flush=True)
            se_ref = best["se"]
            if i >= 2 and prev is not None and math.isfinite(r["bound"]) and abs(r["bound"] - prev) <= 2 * se_ref \
                    and r["bound"] >= best["F"] - 2 * se_ref:
                break                                     # plateau at the best bound: longer runs add nothing
            prev = r["bound"]
    F_ref = best["F"]
    se_plain, se_low = bound_se_two_ways(model, best["q"].mean, best["q"].scale_tril, 1000, 1)
    tols = {"loose": 2 * se_plain, "strict": 2 * se_low}
    for rs in runs.values():
        for r in rs:
            r["gap"] = F_ref - r["bound"]
    nuts_path = RESULTS / "nuts_boston_draws.npz"
    lines = ["## Boston: GP hyperparameter posterior (N = 455, d = 13, D = 15, prior N(0, 10))", "",
             f"- all engines start at the ML-II point (3 restarts, {t_ml2:.1f} s, not included in the times) with "
             f"their default initial scale (S&K: 0.1 I unless 'Laplace start'; DSVI natural: the Laplace scale at the "
             f"start, by finite differences; DSVI SGD: 0.1 I); one seed (0) per run length",
             f"- bounds: {n_bound}-draw Monte Carlo estimates of mean(log g - log q) with common random numbers; "
             f"reference F_ref = {F_ref:.3f} (the best of all runs: {best['who']})",
             f"- tolerances at the reference q (1000 draws): loose = 2 x se[mean(log g) + H] = {tols['loose']:.3f}, "
             f"strict = 2 x se[mean(log g - log q)] = {tols['strict']:.3f}",
             "- S&K Algorithm 2 uses finite-difference Hessians here (GPRegression refuses double backward): "
             "S (2D + 1) = 31 log-joint rows per step, in one batched call", ""]
    lines += ["### Time and log-joint evaluations to reach the best bound", "",
              *headline(reach(runs, "gap", tols), tols, "DSVI (default here: natural, Laplace start, S=4)"), "",
              *reach_table(runs, "gap", tols), "",
              "### Cost per step", "", *cost_table(runs), "",
              "### All runs", "", *grid_table(runs, "gap", "bound"), ""]
    if nuts_path.exists():
        z = np.load(nuts_path)
        draws = torch.from_numpy(z["draws"]).to(torch.float64)
        mc = SamplePosterior(draws, [str(n) for n in z["names"]], model)
        qs = {}
        for name, rs in runs.items():
            ok = [r for r in rs if r["gap"] <= tols["loose"]]
            good = [r for r in rs if not r["failed"]]
            if not ok and not good:
                continue
            pick = min(ok, key=lambda r: r["N"]) if ok else max(good, key=lambda r: r["N"])
            qs[f"{specs[name]['short']} N={pick['N']}"] = pick["q"]
        lines += [f"### Final marginals vs NUTS ({draws.shape[0]} x {draws.shape[1]} draws from nuts_boston.py)", "",
                  *marginal_table(qs, mc, model.names), ""]
    else:
        lines += ["(no NUTS draws found: run benchmarks/nuts_boston.py first)", ""]
    data = {"F_ref": F_ref, "ref": best["who"], "tols": tols, "ml2_time_s": t_ml2,
            "runs": {k: [{kk: vv for kk, vv in r.items() if kk != "q"} for r in v] for k, v in runs.items()}}
    return lines, data


# ------------------------------------------------------------------------------------------------ scaling in D
def scaling(quick: bool) -> tuple[list[str], dict]:
    """Engine cost per step vs D on a Gaussian target whose log joint costs O(S D^2): what the engines add."""
    dims = [10, 50, 200] if quick else [10, 50, 200, 400, 800]
    steps = 20 if quick else 40
    data = []
    for D in dims:
        g = torch.Generator().manual_seed(D)
        A = torch.randn(D, D, generator=g, dtype=torch.float64) / math.sqrt(D)
        Lam = A @ A.T + torch.eye(D, dtype=torch.float64)
        target = gpvi.Target(lambda th, Lam=Lam: -0.5 * ((th @ Lam) * th).sum(-1), names=D)
        cfg = {
            "SK Alg. 2 (autograd Hessian, S=1)": lambda: SKGaussian(num_steps=steps, hessian="autograd",
                                                                   progress_bar=False, num_elbo_draws=0),
            "SK Hessian-free (S=4)": lambda: SKGaussian(num_steps=steps, method="gradient", num_draws=4,
                                                        progress_bar=False, num_elbo_draws=0),
            "DSVI (SGD, full C, S=4)": lambda: DSVI(num_steps=steps, optimizer=SGD(lr=1e-3), progress_bar=False,
                                                     num_elbo_draws=0),
            "DSVI (natural, full C, S=4)": lambda: DSVI(num_steps=steps, optimizer="natural", init_scale=0.1,
                                                         progress_bar=False, num_elbo_draws=0),
        }
        for name, make in cfg.items():
            if name.startswith("SK Alg. 2") and D > 400:
                continue                                   # D backward passes per step: skipped beyond D = 400
            times = []
            for _ in range(3):
                eng = make()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    t0 = time.perf_counter()
                    try:
                        eng.run(target, init=torch.zeros(D, dtype=torch.float64))
                    except gpvi.exceptions.NumericalFaultError:      # too few pairs for D (only the cost matters here)
                        pass
                    times.append((time.perf_counter() - t0) / steps)
            data.append({"D": D, "engine": name, "ms_per_step": 1e3 * statistics.median(times)})
            print(f"scaling D={D} {name}: {data[-1]['ms_per_step']:.2f} ms/step", flush=True)
    names = list(dict.fromkeys(d["engine"] for d in data))
    lines = ["## Cost per step as D grows (Gaussian target, log joint O(S D^2); median of 3 runs of "
             f"{steps} steps, init included)", "",
             "| D | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for D in dims:
        cells = []
        for n in names:
            v = [d["ms_per_step"] for d in data if d["D"] == D and d["engine"] == n]
            cells.append(f"{v[0]:.2f}" if v else "skipped")
        lines.append(f"| {D} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines, {"scaling": data}


def code_state() -> str:
    """Last commits of the two engines and whether the working copy differs (the DSVI engine was still moving)."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    out = []
    for f in ("gpvi/sk.py", "gpvi/dsvi.py"):
        try:
            h = subprocess.run(["git", "log", "-1", "--format=%h", "--", f], cwd=root, capture_output=True,
                               text=True, timeout=10).stdout.strip()
            dirty = subprocess.run(["git", "diff", "--quiet", "--", f], cwd=root, timeout=10).returncode != 0
            out.append(f"{f} at {h or '?'}{' + uncommitted changes' if dirty else ''}")
        except (OSError, subprocess.SubprocessError):  # pragma: no cover
            out.append(f"{f}: git unavailable")
    return "; ".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--part", choices=("all", "pima", "boston", "scaling"), default="all")
    args = ap.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    lines: list[str] = []
    data: dict[str, Any] = {}
    if args.part in ("all", "pima"):
        pl, pd = pima(args.quick)
        lines += pl
        data["pima"] = pd
    if args.part in ("all", "boston"):
        bl, bd = boston(args.quick)
        lines += bl
        data["boston"] = bd
    if args.part in ("all", "scaling"):
        sl, sd = scaling(args.quick)
        lines += sl
        data.update(sd)
    load_after = os.getloadavg()
    busy = max(load_before[0], load_after[0]) > 1.5
    name = "sk_vs_dsvi" + ("_quick" if args.quick else "") + ("" if args.part == "all" else f"_{args.part}")
    head = [header("Salimans-Knowles (Alg. 2, Hessian-free) vs DSVI: cost to reach the same bound"), "",
            f"- load average before / after: {[round(x, 2) for x in load_before]} / "
            f"{[round(x, 2) for x in load_after]}" + (" (machine busy: wall times are inflated, ratios between "
                                                       "engines measured in the same run are more reliable)"
                                                       if busy else ""),
            f"- total benchmark time {time.perf_counter() - t0:.0f} s",
            f"- code: {code_state()}", "",
            "Log-joint rows = points at which log g and its gradient were evaluated (counted by a proxy target). "
            "'First N reaching' = the shortest run (grid of doubling N, every seed) whose bound is within the "
            "tolerance of the reference; its median wall time and rows are the cost.", ""]
    md = "\n".join(head + lines + READING)
    path = write(name, md, data)
    print(md)
    print(f"wrote {path}")


READING = [
    "## Reading", "",
    "**Who wins where** (numbers: the headline lines and tables above).", "",
    "- *Pima* (D = 8, log-concave, autograd Hessians). Both S&K engines reach even the strict tolerance after "
    "N = 50 steps, in a fraction of DSVI's time and with one to two orders of magnitude fewer log-joint rows. "
    "Algorithm 2 needs the fewest rows (one per step) but pays D extra backward passes per step for the Hessian "
    "(8 backward passes, about 1 ms per step here), so the Hessian-free variant is the fastest in wall time. DSVI's default on this "
    "target (SGD) needs thousands of steps for the strict tolerance; DSVI-natural stops on its convergence rule "
    "~0.03 nats below the optimum, inside the loose tolerance but outside the strict one, whatever num_steps is.",
    "- *Boston GP hyperparameters* (D = 15, not log-concave, no autograd Hessians). The Hessian-free S&K variant "
    "(4 rows per step) is the fastest to both tolerances, roughly 2-4x ahead of DSVI's GP default (natural "
    "gradient from a Laplace start), which reaches the loose tolerance and then stops on its convergence rule just "
    "outside the strict one. S&K Algorithm 2 must get its Hessians by finite differences here (2D + 1 = 31 rows "
    "per step, GPRegression refuses double backward), which makes it roughly 20x more expensive than the "
    "Hessian-free variant for the same bound (and slower than DSVI's default). DSVI with plain SGD (the paper's "
    "Algorithm 1) is the slowest by far.",
    "- *Marginals.* At the bound they reach, all Gaussian approximations agree with each other (same optimum) and "
    "with the quadrature optimum on Pima, where they also match NUTS closely (the posterior is nearly Gaussian). "
    "On Boston all of them differ from NUTS in the same way (means up to ~0.8 NUTS sd, sd ratios down to ~0.35 "
    "for skewed lengthscale posteriors): the limits of a Gaussian q on log-lengthscales, not of an engine.", "",
    "**Why.** S&K is a stochastic Newton / natural-gradient method in the precision parametrisation: every step "
    "uses the running curvature P, so its steps are scale free and the conditioning of the posterior does not "
    "matter; the regression of the gradient on the draws is exact on the Gaussian part of log g (the noise-free "
    "property tested in tests/inference/salimans_knowles/test_sk.py), and averaging the statistics, not the iterates, over the second half "
    "removes most of the remaining Monte Carlo noise. DSVI-SGD's step size is capped by the largest curvature "
    "(lr = 0.5 / lambda_max) while the flattest directions (prior-dominated lengthscales on Boston, about 100x "
    "less curved) need ~1 / (rho lambda_min) steps. DSVI-natural preconditions with CC^T and closes most of that "
    "gap; what remains is its deliberately small steps (rho_0 = 0.05 of q's scale with a decaying schedule) and its "
    "stopping rule.", "",
    "**Where S&K loses.** (1) It stores and factorises D x D matrices at every step (P, or A and B for the "
    "Hessian-free variant): O(D^3) per step against O(D^2) for DSVI-SGD with a full C, so with a cheap log joint "
    "and large D DSVI-SGD's per-step cost is an order of magnitude lower (last table; DSVI-natural's trust region "
    "also pays O(D^3)) - the CVI paper's 'slow when D is large because of the stored matrix'. When the log joint is expensive and D moderate (a GP with N >> D), the D^3 algebra is "
    "negligible and the saved evaluations dominate, as on Boston. (2) Finite-difference Hessians cost 2D + 1 "
    "log-joint rows per draw; use the Hessian-free variant when autograd cannot give Hessians. (3) The "
    "Hessian-free variant needs at least ~D antithetic pairs in its averaging window: runs that are too short end "
    "in a clear NumericalFaultError (N = 50 on Boston), not a wrong answer. (4) Like any Newton method it can run "
    "away from a start much wider than the posterior on heavy-tailed targets (tests/inference/salimans_knowles/test_sk.py, Student-t); a "
    "good start (ML-II/MAP point, init_scale='laplace') matters more than for DSVI's small steps.", "",
]


if __name__ == "__main__":
    main()
