"""DSVI paper Table 5 and Figure 4: GP regression with hyperparameters by ML-II, DSVI and NUTS (issue 4).

Protocol (everything in one run of this script, on one machine, single-threaded):

* **Data**: Boston (N = 506, d = 13), Bodyfat with the paper's 14 inputs (including ``Density``) and the realistic
  13-input variant without it, Pendulum (630 rows, d = 9). Random seeded splits (``gpvi.datasets``: seeds
  0..K-1, K = 5): Boston and Bodyfat 90/10 (455/51, 227/25), Pendulum 315/315 (its original split is not
  recorded). Inputs and targets standardised with training statistics. Model: ``gpvi.GPRegression`` default,
  ARD squared-exponential kernel + Gaussian noise, prior N(0, 10) on every log-hyperparameter (paper section 3.4).
* **Methods**, on the same splits, each fanned out as one job (``benchmarks/runner.py``):
  ML-II (``gpvi.ML2(num_restarts=3)``, point predictive); DSVI exactly as a user calls it,
  ``gpvi.DSVI(scale="full", seed=0).run(model)`` (defaults: MAP/Laplace start, ``optimizer="natural"``, stop on
  convergence; timed including the MAP, the Laplace Hessian and the final 1000-draw bound estimate);
  NUTS (``gpvi.NUTS``, 2 chains x (300 warm-up + 300 draws) from the ML-II point, per split: enough for test
  metrics, not for ESS targets). Mixture predictives over 200 theta draws (DSVI: draws from q; NUTS: 200 evenly
  spaced draws). SMSE and NLPD on the test rows: NLPD in standardised units and in the original units of y
  (``nlpd + log(y_std)``).
* **Boston split 0, fidelity and timing** (the issue-4 targets): DSVI defaults with seeds 0, 1, 2 (median wall
  time), then a NUTS run as in ``nuts_boston.py`` (4 chains x 800 draws + 500 warm-up from ML-II, extended by 50%
  until every parameter has ESS >= 400), timed in the same process right after. Per hyperparameter: DSVI against
  NUTS (means, sds, difference of means in NUTS sds, sd ratio, 1-D Wasserstein), the density overlay PNG
  (paper Figure 4), and the same for the Laplace approximation at the MAP and for the paper's Algorithm 1
  (``optimizer="sgd"``, 3000 steps from the same start). Whether DSVI has *converged* is checked against a
  4000-step DSVI reference run (Polyak average of the last 2000 iterates); whether its answer is the best
  Gaussian is checked by the bound itself: the Monte Carlo bound (common random numbers) of DSVI's q, of the
  Gaussian with NUTS's mean and covariance, and of Laplace. NUTS's marginals are also described by skewness,
  excess kurtosis and Sarle's bimodality coefficient (> 0.555 suggests two modes), which a Gaussian q cannot
  follow.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.dsvi_table5            # full run (~65 min on 2 busy cores)
    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.dsvi_table5 --quick    # smoke test (~5 min)
    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.dsvi_table5 --rerender # markdown again from the stored JSON
    gpvi bench table5 [--quick]

Writes ``benchmarks/results/dsvi_table5{,_quick}.{md,json}`` and ``dsvi_table5{,_quick}_boston_marginals.png``,
``..._boston_bound.png``.
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
from benchmarks._common import RESULTS, machine_info, write  # noqa: E402
from benchmarks.runner import Job, run_jobs  # noqa: E402
from gpvi.inference.dsvi.engine import DSVI, Convergence  # noqa: E402
from gpvi.inference.laplace import laplace_approximation  # noqa: E402
from gpvi.inference.mcmc import NUTS  # noqa: E402
from gpvi.posteriors import GaussianPosterior  # noqa: E402

# The paper's Table 5 (Titsias & Lazaro-Gredilla 2014): (smse, nlpd) per method.
PAPER = {
    "boston": {"ML-II": (0.0743, 0.1783), "DSVI": (0.0709, 0.1425), "NUTS": (0.0699, 0.1317)},
    "bodyfat": {"ML-II": (0.1992, -0.1284), "DSVI": (0.0726, -2.0750), "NUTS": (0.0726, -2.0746)},
    "pendulum": {"ML-II": (0.2727, 0.4537), "DSVI": (0.2807, 0.4465), "NUTS": (0.2801, 0.4462)},
}
PAPER_TIMES = {"ML-II": "40 s", "DSVI": "30 min", "NUTS": "20 h (their MCMC)"}
DATASETS = ("boston", "bodyfat", "bodyfat13", "pendulum")
LABEL = {"boston": "Boston (d=13)", "bodyfat": "Bodyfat (14 inputs incl. Density, paper's task)",
         "bodyfat13": "Bodyfat (13 inputs, no Density)", "pendulum": "Pendulum (d=9, 315/315)"}
BODYFAT_BAD_ROWS = {41, 47, 75, 95, 181}      # 0-based StatLib cases 42, 48, 76, 96, 182 (PROVENANCE.md)
METHODS = ("ML-II", "DSVI", "NUTS")


def load(name: str, split: int) -> Any:
    if name == "boston":
        return gpvi.datasets.load_boston(seed=split)
    if name == "bodyfat":
        return gpvi.datasets.load_bodyfat(seed=split, include_density=True)
    if name == "bodyfat13":
        return gpvi.datasets.load_bodyfat(seed=split, include_density=False)
    if name == "pendulum":
        return gpvi.datasets.load_pendulum(seed=split)
    raise ValueError(name)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _caught(rec: list) -> list[str]:
    return sorted({f"{w.category.__name__}: {str(w.message)[:160]}" for w in rec})


def scores(post: Any, ds: Any, num_draws: int = 200) -> dict[str, float]:
    pred = post.predict(ds.X_test, num_draws=num_draws)
    nlpd = gpvi.metrics.nlpd(pred, ds.y_test)
    return {"smse": gpvi.metrics.smse(pred, ds.y_test), "nlpd": nlpd,
            "nlpd_orig": nlpd + math.log(ds.y_std)}


def fit_and_score(dataset: str, split: int, method: str, nuts_chains: int, nuts_warmup: int,
                  nuts_draws: int) -> dict[str, Any]:
    """One (dataset, split, method) job: fit, time, score on the test rows."""
    ds = load(dataset, split)
    model = gpvi.GPRegression(ds.X_train, ds.y_train)
    out: dict[str, Any] = {"dataset": dataset, "split": split, "method": method, "n_train": ds.n_train,
                           "n_test": ds.n_test, "D": model.dim, "load_before": _load()}
    if dataset.startswith("bodyfat"):
        out["bad_rows_in_test"] = sorted(set(int(i) for i in ds.test_indices) & BODYFAT_BAD_ROWS)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        if method == "ML-II":
            post = gpvi.ML2(num_restarts=3, seed=split).run(model)
        elif method == "DSVI":
            post = DSVI(scale="full", seed=0, progress_bar=False).run(model)
        else:
            ml2 = gpvi.ML2(num_restarts=3, seed=split).run(model)
            post = NUTS(num_chains=nuts_chains, num_warmup=nuts_warmup, num_draws=nuts_draws, seed=split,
                        progress_bar=False).run(model, init=ml2)
        out["time_s"] = time.perf_counter() - t0
    out.update(scores(post, ds))
    out["warnings"] = _caught(rec)
    if method == "DSVI":
        out.update(steps=post.info["steps"], converged=post.info["converged"], elbo=post.elbo,
                   trust_clips=post.info["trust_clips"], resampled=post.info["resampled_draws"],
                   init_time_s=post.info["init"].get("time_s", math.nan))
    if method == "NUTS":
        out.update(min_ess=float(post.ess().min()), max_r_hat=float(post.r_hat().max()),
                   divergences=post.info["divergences"])
    out["load_after"] = _load()
    return out


def nuts_until_ess(model: gpvi.GPRegression, init: Any, *, chains: int, warmup: int, draws: int,
                   target_ess: float, max_extensions: int, seed: int = 0) -> tuple[Any, dict[str, Any]]:
    """NUTS as in nuts_boston.py: run, and extend by 50% (exact resume) until min ESS >= target_ess."""
    S, state, ext = draws, None, 0
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        while True:
            eng = NUTS(num_chains=chains, num_warmup=warmup, num_draws=S, seed=seed, progress_bar=False)
            mc = eng.run(model, init=init) if state is None else eng.run(model, state=state)
            if float(mc.ess().min()) >= target_ess or ext >= max_extensions:
                break
            state, S, ext = mc.engine_state, int(math.ceil(1.5 * S)), ext + 1
    warm, samp = sum(mc.info["warmup_time_s"]), sum(mc.info["sampling_time_s"])
    ess = mc.ess()
    info = {"chains": chains, "warmup": warmup, "draws": S, "extensions": ext, "wall_s": warm + samp,
            "warmup_s": warm, "sampling_s": samp, "min_ess": float(ess.min()), "median_ess": float(ess.median()),
            "time_for_target_s": warm + samp * target_ess / float(ess.min()),
            "max_r_hat": float(mc.r_hat().max()), "divergences": mc.info["divergences"],
            "evaluations": int(sum(mc.info["num_evaluations"])), "warnings": _caught(rec)}
    return mc, info


def marginal_shape(x: np.ndarray) -> dict[str, float]:
    """Skewness, excess kurtosis and Sarle's bimodality coefficient of one marginal's draws."""
    from scipy import stats
    n = len(x)
    g, k = float(stats.skew(x)), float(stats.kurtosis(x))
    bc = (g * g + 1) / (k + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3)))
    return {"skew": g, "kurt": k, "bimodality": bc}


def boston_fidelity(quick: bool, timing_seeds: int, target_ess: float) -> dict[str, Any]:
    """Boston split 0: DSVI timing (several seeds) then the NUTS >= 400 ESS run; fidelity of DSVI, Laplace, SGD."""
    ds = load("boston", 0)
    model = gpvi.GPRegression(ds.X_train, ds.y_train)
    out: dict[str, Any] = {"load": {"start": _load()}}
    # --- DSVI, as a user calls it, several seeds (timing + the seed-0 posterior)
    dsvi_runs, qs = [], []
    for s in range(timing_seeds):
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            q = DSVI(scale="full", seed=s, progress_bar=False).run(model)
            wall = time.perf_counter() - t0
        qs.append(q)
        dsvi_runs.append({"seed": s, "wall_s": wall, "steps": q.info["steps"], "converged": q.info["converged"],
                          "init_s": q.info["init"]["time_s"], "map_s": q.info["init"].get("map_time_s", math.nan),
                          "elbo": q.elbo, "elbo_se": q.elbo_se, "trust_clips": q.info["trust_clips"],
                          "resampled": q.info["resampled_draws"], "returned": q.info["returned"],
                          "warnings": _caught(rec), "load": _load()})
        print(f"  boston DSVI seed {s}: {wall:.1f} s, {q.info['steps']} steps, converged {q.info['converged']}",
              flush=True)
    out["dsvi_runs"] = dsvi_runs
    out["load"]["after_dsvi"] = _load()
    # --- NUTS to ESS >= target (timed right after, same process)
    t0 = time.perf_counter()
    ml2 = gpvi.ML2(num_restarts=3, seed=0).run(model)
    ml2_s = time.perf_counter() - t0
    if quick:
        mc, ninfo = nuts_until_ess(model, ml2, chains=2, warmup=50, draws=50, target_ess=target_ess,
                                   max_extensions=0)
    else:
        mc, ninfo = nuts_until_ess(model, ml2, chains=4, warmup=500, draws=800, target_ess=target_ess,
                                   max_extensions=4)
    ninfo["ml2_s"] = ml2_s
    out["nuts"] = ninfo
    out["load"]["after_nuts"] = _load()
    print(f"  boston NUTS: {ninfo['wall_s']:.0f} s, min ESS {ninfo['min_ess']:.0f}", flush=True)
    # --- reference DSVI (convergence check), Laplace, Algorithm 1 (SGD) from the same start
    q = qs[0]
    ref_steps, sgd_steps = (400, 300) if quick else (4000, 3000)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = DSVI(scale="full", seed=11, num_steps=ref_steps, convergence=Convergence(stop=False), polyak=0.5,
                   progress_bar=False).run(model)
    ref_s = time.perf_counter() - t0
    lap = laplace_approximation(model)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sgd = DSVI(scale="full", optimizer="sgd", seed=0, num_steps=sgd_steps, progress_bar=False).run(
            model, init=lap)
    sgd_s = time.perf_counter() - t0
    out["reference"] = {"steps": ref_steps, "wall_s": ref_s, "elbo": ref.elbo, "elbo_se": ref.elbo_se}
    out["sgd"] = {"steps": sgd_steps, "wall_s": sgd_s, "lr_mu": sgd.info["lr_mu"], "elbo": sgd.elbo,
                  "elbo_se": sgd.elbo_se}
    # --- bounds with common random numbers: DSVI q, NUTS-moment Gaussian, Laplace, reference, SGD
    X = mc.samples
    m_mc, cov_mc = X.mean(0), torch.cov(X.T)
    nuts_gauss = GaussianPosterior(m_mc, torch.linalg.cholesky(cov_mc), model.names, model)
    n_bound = 200 if quick else 1000
    bounds = {}
    eng = DSVI(progress_bar=False)
    for name, post in {"DSVI (defaults, seed 0)": q, "DSVI reference run": ref, "Laplace at MAP": lap,
                       "Gaussian with NUTS mean and covariance": nuts_gauss, "Algorithm 1 (sgd)": sgd}.items():
        est, se, bad = eng.estimate_bound(model, post.mean, post.scale_tril, num_draws=n_bound, seed=2024)
        bounds[name] = {"bound": est, "se": se, "invalid": bad}
    out["bounds"] = bounds
    out["bound_draws"] = n_bound
    # --- comparisons
    def cmp(a, b):
        t = gpvi.metrics.compare(a, b)
        return {c: t.column(c) for c in ("mean_a", "mean_b", "sd_a", "sd_b", "dmean_sd", "sd_ratio", "w1")}
    out["names"] = list(model.names)
    out["compare"] = {"DSVI vs NUTS": cmp(q, mc), "Laplace vs NUTS": cmp(lap, mc),
                      "Algorithm 1 (sgd) vs NUTS": cmp(sgd, mc), "DSVI vs DSVI reference": cmp(q, ref),
                      "DSVI reference vs NUTS": cmp(ref, mc)}
    out["seed_spread"] = [cmp(qq, ref) for qq in qs[1:]]
    out["nuts_ess"] = mc.ess().tolist()
    out["nuts_shape"] = [marginal_shape(X[:, j].numpy()) for j in range(model.dim)]
    out["load"]["end"] = _load()
    out["scores"] = {"DSVI": scores(q, ds), "NUTS (long run)": scores(mc, ds), "Laplace": scores(lap, ds)}
    out["_posteriors"] = {"q": q, "mc": mc}          # for the figures (dropped before writing JSON)
    return out


# --------------------------------------------------------------------------------------------- report
def _fmt(x: float, nd: int = 4) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def mean_sd(vals: list[float]) -> tuple[float, float]:
    vals = [v for v in vals if v is not None and math.isfinite(v)]
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def table5(results: list[dict[str, Any]], splits: int) -> tuple[list[str], dict[str, Any]]:
    lines = ["## Table 5: test SMSE and NLPD (mean ± sd over splits)", "",
             f"{splits} seeded splits per data set. NLPD in standardised units (`nlpd`) and in the original units of "
             "y (`nlpd + log y_std`); the paper does not say which it reports. Paper numbers from Table 5.", "",
             "| data | method | SMSE | NLPD (std.) | NLPD (orig. units) | paper SMSE | paper NLPD | wall time (s) | "
             "failed jobs |", "|---|---|---|---|---|---|---|---|---|"]
    summary: dict[str, Any] = {}
    for d in DATASETS:
        for m in METHODS:
            rows = [r for r in results if r.get("dataset") == d and r.get("method") == m]
            ok = [r for r in rows if not r.get("error")]
            sm, nl, no, tt = (mean_sd([r.get(k, math.nan) for r in ok]) for k in ("smse", "nlpd", "nlpd_orig", "time_s"))
            paper = PAPER.get(d.replace("13", ""), {}).get(m) if d != "bodyfat13" else None
            summary[f"{d}/{m}"] = {"smse": sm, "nlpd": nl, "nlpd_orig": no, "time_s": tt, "n": len(ok)}
            lines.append(f"| {LABEL[d]} | {m} | {_fmt(sm[0])} ± {_fmt(sm[1])} | {_fmt(nl[0])} ± {_fmt(nl[1])} | "
                         f"{_fmt(no[0])} ± {_fmt(no[1])} | {_fmt(paper[0]) if paper else '–'} | "
                         f"{_fmt(paper[1]) if paper else '–'} | {tt[0]:.1f} ± {tt[1]:.1f} | "
                         f"{len(rows) - len(ok)} |")
    lines.append("")
    lines.append(f"Paper's average training times: ML-II {PAPER_TIMES['ML-II']}, DSVI {PAPER_TIMES['DSVI']}, "
                 f"MCMC {PAPER_TIMES['NUTS']}. Our NUTS rows are short runs (see protocol), not the paper's long MCMC.")
    lines.append("")
    # per split detail
    lines += ["### Per split", "", "| data | split | method | SMSE | NLPD | time (s) | notes |", "|---|---|---|---|---|---|---|"]
    for r in results:
        if "dataset" not in r:
            continue
        note = []
        if r.get("error"):
            note.append("ERROR " + r["error"][:80])
        if r.get("bad_rows_in_test"):
            note.append(f"bad Bodyfat rows in test: {r['bad_rows_in_test']}")
        if r["method"] == "DSVI" and not r.get("error"):
            note.append(f"{r['steps']} steps, converged {r['converged']}")
        if r["method"] == "NUTS" and not r.get("error"):
            note.append(f"min ESS {r['min_ess']:.0f}, R-hat {r['max_r_hat']:.3f}, div {r['divergences']}")
        lines.append(f"| {r['dataset']} | {r['split']} | {r['method']} | {_fmt(r.get('smse', math.nan))} | "
                     f"{_fmt(r.get('nlpd', math.nan))} | {r.get('time_s', math.nan):.1f} | {'; '.join(note)} |")
    lines.append("")
    return lines, summary


def fidelity_report(fb: dict[str, Any], quick: bool, target_ess: float) -> tuple[list[str], dict[str, Any]]:
    names = fb["names"]
    c = fb["compare"]["DSVI vs NUTS"]
    walls = [r["wall_s"] for r in fb["dsvi_runs"]]
    dsvi_med, dsvi_max = statistics.median(walls), max(walls)
    nuts = fb["nuts"]
    ratio = nuts["wall_s"] / dsvi_med
    mean_ok = [abs(x) <= 0.2 for x in c["dmean_sd"]]
    sd_ok = [abs(x - 1) <= 0.25 for x in c["sd_ratio"]]
    targets = {
        "means within 0.2 NUTS sd (all 15)": all(mean_ok),
        "sds within 25% of NUTS sds (all 15)": all(sd_ok),
        "DSVI converged in <= 60 s (median of seeds)": dsvi_med <= 60 and all(r["converged"] for r in fb["dsvi_runs"]),
        f"DSVI <= 1/20 of the NUTS run with ESS >= {target_ess:.0f}": ratio >= 20 and nuts["min_ess"] >= target_ess,
    }
    L = ["## Issue-4 targets on Boston (split 0)", "", "| target | measured | met |", "|---|---|---|"]
    L.append(f"| DSVI marginal means within 0.2 NUTS sd | max \\|Δmean\\|/sd_NUTS = {max(abs(x) for x in c['dmean_sd']):.2f}"
             f"; {sum(mean_ok)}/{len(names)} within | {'yes' if targets['means within 0.2 NUTS sd (all 15)'] else '**no**'} |")
    L.append(f"| DSVI sds within 25% of NUTS sds | sd ratio {min(c['sd_ratio']):.2f}–{max(c['sd_ratio']):.2f}; "
             f"{sum(sd_ok)}/{len(names)} within | {'yes' if targets['sds within 25% of NUTS sds (all 15)'] else '**no**'} |")
    L.append(f"| DSVI converged in <= 60 s | median {dsvi_med:.1f} s, max {dsvi_max:.1f} s over {len(walls)} seeds "
             f"({', '.join(str(r['steps']) for r in fb['dsvi_runs'])} steps; all converged: "
             f"{all(r['converged'] for r in fb['dsvi_runs'])}) | "
             f"{'yes' if targets['DSVI converged in <= 60 s (median of seeds)'] else '**no**'} |")
    L.append(f"| DSVI <= 1/20 of NUTS (ESS >= {target_ess:.0f}) | NUTS {nuts['wall_s']:.0f} s "
             f"(min ESS {nuts['min_ess']:.0f}) / DSVI median {dsvi_med:.1f} s = **{ratio:.1f}x** "
             f"(vs slowest seed {nuts['wall_s'] / dsvi_max:.1f}x) | {'yes' if targets[f'DSVI <= 1/20 of the NUTS run with ESS >= {target_ess:.0f}'] else '**no**'} |")
    L.append("")
    L += [f"Bound trace of the seed-0 run (instantaneous bound and its rolling average over the window of 100): "
          f"![bound](dsvi_table5{'_quick' if quick else ''}_boston_bound.png)", ""]
    L += ["### Timing detail (same process, one after the other)", "",
          "| run | wall (s) | detail | load avg after |", "|---|---|---|---|"]
    for r in fb["dsvi_runs"]:
        L.append(f"| DSVI defaults, seed {r['seed']} | {r['wall_s']:.1f} | {r['steps']} steps, MAP + Laplace "
                 f"{r['init_s']:.2f} s, {r['trust_clips']} trust-region clips, {r['resampled']} redrawn draws, "
                 f"bound {r['elbo']:.2f} ± {r['elbo_se']:.2f}; returned: {r['returned']} | {r['load']} |")
    L.append(f"| NUTS {nuts['chains']} x {nuts['draws']} (+{nuts['warmup']} warm-up), from ML-II "
             f"({nuts['ml2_s']:.1f} s, not counted) | {nuts['wall_s']:.1f} | warm-up {nuts['warmup_s']:.0f} s, "
             f"sampling {nuts['sampling_s']:.0f} s, {nuts['evaluations']} gradient evaluations, extended "
             f"{nuts['extensions']}x; min/median ESS {nuts['min_ess']:.0f}/{nuts['median_ess']:.0f}, max R-hat "
             f"{nuts['max_r_hat']:.3f}, {nuts['divergences']} divergences; time pro-rated to ESS = {target_ess:.0f}: "
             f"{nuts['time_for_target_s']:.0f} s | {fb['load']['after_nuts']} |")
    L.append("")
    # fidelity table
    shape = fb["nuts_shape"]
    L += ["## Fidelity to NUTS (paper Figure 4): DSVI defaults (seed 0) vs the long NUTS run", "",
          f"![marginals](dsvi_table5{'_quick' if quick else ''}_boston_marginals.png)", "",
          "Δmean/sd = (mean_DSVI − mean_NUTS) / sd_NUTS; NUTS Monte Carlo error of a mean is about "
          "1/sqrt(ESS) ≈ 0.03–0.05 of these units. NUTS skew / kurt = skewness and excess kurtosis of the NUTS "
          "draws; bimod. = Sarle's bimodality coefficient (0.555 for a uniform; values near it with small or "
          "negative kurtosis mark flat or two-mode marginals — check the figure, the coefficient is only a hint).",
          "",
          "| hyperparameter | mean DSVI | mean NUTS | sd DSVI | sd NUTS | Δmean/sd | sd ratio | W1 | ESS | NUTS skew | "
          "NUTS kurt | bimod. | targets |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for j, n in enumerate(names):
        ok = ("ok" if mean_ok[j] and sd_ok[j] else ("mean" if not mean_ok[j] else "") +
              (" sd" if not sd_ok[j] else "")).strip()
        L.append(f"| {n} | {c['mean_a'][j]:.3f} | {c['mean_b'][j]:.3f} | {c['sd_a'][j]:.3f} | {c['sd_b'][j]:.3f} | "
                 f"{c['dmean_sd'][j]:+.2f} | {c['sd_ratio'][j]:.2f} | {c['w1'][j]:.3f} | {fb['nuts_ess'][j]:.0f} | "
                 f"{shape[j]['skew']:+.2f} | {shape[j]['kurt']:+.2f} | {shape[j]['bimodality']:.2f} | "
                 f"{ok if ok == 'ok' else '**miss: ' + ok + '**'} |")
    L.append("")
    # other approximations
    L += ["### Other Gaussians against the same NUTS draws", "",
          "| approximation | max \\|Δmean\\|/sd | mean \\|Δmean\\|/sd | sd ratio range | mean W1 | time (s) |",
          "|---|---|---|---|---|---|"]
    times = {"DSVI vs NUTS": dsvi_med, "DSVI reference vs NUTS": fb["reference"]["wall_s"],
             "Laplace vs NUTS": math.nan, "Algorithm 1 (sgd) vs NUTS": fb["sgd"]["wall_s"]}
    labels = {"DSVI vs NUTS": "DSVI defaults (seed 0)",
              "DSVI reference vs NUTS": f"DSVI reference ({fb['reference']['steps']} steps, Polyak)",
              "Laplace vs NUTS": "Laplace at the MAP", "Algorithm 1 (sgd) vs NUTS":
              f"Algorithm 1 (optimizer='sgd', {fb['sgd']['steps']} steps from Laplace, lr auto {fb['sgd']['lr_mu']:.2g})"}
    for k, lab in labels.items():
        cc = fb["compare"][k]
        dm = [abs(x) for x in cc["dmean_sd"]]
        L.append(f"| {lab} | {max(dm):.2f} | {statistics.fmean(dm):.2f} | {min(cc['sd_ratio']):.2f}–"
                 f"{max(cc['sd_ratio']):.2f} | {statistics.fmean(cc['w1']):.3f} | "
                 f"{'–' if math.isnan(times[k]) else f'{times[k]:.1f}'} |")
    sb = fb["bounds"]["Algorithm 1 (sgd)"]
    L += ["", f"The paper's Algorithm 1 (`optimizer='sgd'`, rate from the curvature rule, the paper's 0.95-decay, "
          f"Polyak over the last quarter) started from the same MAP/Laplace point ends near the same Gaussian "
          f"(bound {sb['bound']:.2f} ± {sb['se']:.2f} below) after {fb['sgd']['steps']} steps "
          f"({fb['sgd']['wall_s']:.0f} s, a fixed budget without a stopping rule): `optimizer='natural'` changes the "
          "path and the cost, not the answer (same fixed points).", ""]
    cv = fb["compare"]["DSVI vs DSVI reference"]
    spread = fb["seed_spread"]
    L += ["### Is DSVI converged? Default run vs the long reference run", "",
          f"Max \\|Δmean\\| = {max(abs(x) for x in cv['dmean_sd']):.3f} reference-q sds "
          f"(in NUTS sds: {max(abs(a - b) / s for a, b, s in zip(cv['mean_a'], cv['mean_b'], c['sd_b'])):.3f}); "
          f"sd ratio {min(cv['sd_ratio']):.3f}–{max(cv['sd_ratio']):.3f}."
          + (" Other seeds vs the reference: " + "; ".join(
              f"seed {i + 1}: max \\|Δmean\\| {max(abs(x) for x in s['dmean_sd']):.3f}, sd ratio "
              f"{min(s['sd_ratio']):.3f}–{max(s['sd_ratio']):.3f}" for i, s in enumerate(spread)) + "." if spread else ""),
          "", "Reference-q sds are the reference run's marginal sds; the NUTS sds are larger where the posterior is "
          "skewed or bimodal.", ""]
    L += ["### Is DSVI's q the best Gaussian? The bound (eq. 4) of each Gaussian", "",
          f"Monte Carlo with {fb['bound_draws']} common draws of z per Gaussian (same seed). A higher bound = smaller "
          "KL(q || posterior).", "", "| Gaussian q | bound | se | invalid draws |", "|---|---|---|---|"]
    for k, v in fb["bounds"].items():
        L.append(f"| {k} | {v['bound']:.3f} | {v['se']:.3f} | {v['invalid']} |")
    L.append("")
    sc = fb["scores"]
    L += ["### Boston split 0 test scores of the fidelity runs", "", "| posterior | SMSE | NLPD |", "|---|---|---|"]
    for k, v in sc.items():
        L.append(f"| {k} | {v['smse']:.4f} | {v['nlpd']:.4f} |")
    L.append("")
    data = {"targets": targets, "dsvi_median_s": dsvi_med, "dsvi_max_s": dsvi_max, "nuts_to_dsvi_ratio": ratio}
    return L, data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 split per data set, tiny NUTS: checks the script")
    ap.add_argument("--splits", type=int, default=5)
    ap.add_argument("--nuts-chains", type=int, default=2)
    ap.add_argument("--nuts-warmup", type=int, default=300)
    ap.add_argument("--nuts-draws", type=int, default=300)
    ap.add_argument("--timing-seeds", type=int, default=3)
    ap.add_argument("--target-ess", type=float, default=400.0)
    ap.add_argument("--n-jobs", type=int, default=1, help="joblib workers (1: in process, comparable timings)")
    args = ap.parse_args()
    if args.quick:
        args.splits, args.nuts_chains, args.nuts_warmup, args.nuts_draws, args.timing_seeds = 1, 2, 30, 30, 1
    name = "dsvi_table5" + ("_quick" if args.quick else "")
    load_start = os.getloadavg()
    t_start = time.perf_counter()

    # Boston split 0 fidelity + timing first (its own job), then every (dataset, split, method).
    jobs = [Job(boston_fidelity, {"quick": args.quick, "timing_seeds": args.timing_seeds,
                                  "target_ess": args.target_ess}, name="boston fidelity and timing")]
    for d in DATASETS:
        for split in range(args.splits):
            for m in METHODS:
                if d == "boston" and split == 0 and m == "NUTS":
                    continue                       # scored from the long run of the fidelity job
                jobs.append(Job(fit_and_score, {"dataset": d, "split": split, "method": m,
                                                "nuts_chains": args.nuts_chains, "nuts_warmup": args.nuts_warmup,
                                                "nuts_draws": args.nuts_draws}, name=f"{d}/{split}/{m}"))
    print(f"{len(jobs)} jobs", flush=True)
    results = []
    for job in jobs:                               # one at a time so that progress is visible; same as run_jobs
        res = run_jobs([job], n_jobs=args.n_jobs)[0]
        if res.get("error"):
            print(f"{job.name}: ERROR {res['error']}\n{res.get('traceback', '')}", flush=True)
        else:
            print(f"{job.name}: {res.get('time_s', res.get('job_wall_s', 0)):.1f} s "
                  f"smse {res.get('smse', math.nan):.4f} nlpd {res.get('nlpd', math.nan):.4f}", flush=True)
        results.append(res)
    fb = results[0]
    if fb.get("error"):
        raise RuntimeError(f"the Boston fidelity job failed: {fb['error']}")
    post = fb.pop("_posteriors")
    fb_sc = fb["scores"]["NUTS (long run)"]
    results.append({"dataset": "boston", "split": 0, "method": "NUTS", "time_s": fb["nuts"]["wall_s"], **fb_sc,
                    "min_ess": fb["nuts"]["min_ess"], "max_r_hat": fb["nuts"]["max_r_hat"],
                    "divergences": fb["nuts"]["divergences"], "error": ""})
    rows = [r for r in results[1:]]
    rows.sort(key=lambda r: (DATASETS.index(r["dataset"]), r["split"], METHODS.index(r["method"])))
    load_end = os.getloadavg()
    total = time.perf_counter() - t_start

    # figures
    figs = {}
    try:
        import matplotlib
        matplotlib.use("Agg")
        from gpvi.evaluation.plots import bound, compare_marginals
        f = compare_marginals(post["q"], post["mc"], labels=("DSVI (defaults)", "NUTS"),
                              title="Boston split 0: DSVI marginals (dashed) over NUTS (histogram, KDE)")
        figs["marginals"] = f"{name}_boston_marginals.png"
        f.savefig(RESULTS / figs["marginals"], dpi=70)
        f = bound(post["q"])
        figs["bound"] = f"{name}_boston_bound.png"
        f.savefig(RESULTS / figs["bound"], dpi=70)
    except ImportError:  # pragma: no cover
        pass

    data = {"args": vars(args), "fidelity": fb, "jobs": rows, "load_start": list(load_start),
            "load_end": list(load_end), "total_s": total, "figures": figs, "paper": PAPER}
    md, extra = render(data, machine_info())
    data.update(extra)
    path = write(name, md, data)
    print(md)
    print(f"wrote {path}")


def _header_from(machine: dict[str, Any], title: str) -> str:
    """The same block as ``benchmarks._common.header`` but from a stored machine record."""
    return "\n".join([f"# {title}", ""] + [f"- {k}: {v}" for k, v in machine.items()]) + "\n"


def render(data: dict[str, Any], machine: dict[str, Any], note: str = "") -> tuple[str, dict[str, Any]]:
    """The markdown report from the run's data (also used by ``--rerender`` on a stored JSON)."""
    args = data["args"]
    fb, rows = data["fidelity"], data["jobs"]
    load_start, load_end = data["load_start"], data["load_end"]
    busy = max(load_start[0], load_end[0]) > 1.5
    L = [_header_from(machine, "DSVI paper Table 5 and Figure 4: GP hyperparameters by ML-II, DSVI and NUTS"), ""]
    if note:
        L += [note, ""]
    L += [f"- load average at start / end: {[round(x, 2) for x in load_start]} / {[round(x, 2) for x in load_end]}"
          + (" — **the machine was busy (other jobs running): wall times are inflated, ratios measured in the same "
             "run remain comparable**" if busy else ""),
          f"- total script time {data['total_s'] / 60:.1f} min; {args['splits']} split(s) per data set; NUTS per "
          f"split: {args['nuts_chains']} chains x ({args['nuts_warmup']} warm-up + {args['nuts_draws']} draws) from "
          "ML-II; Boston split 0 NUTS: the long run below",
          "- DSVI: `gpvi.DSVI(scale='full', seed=0).run(model)` with every default (`optimizer='natural'` from the "
          "MAP/Laplace point, stop on convergence; see `gpvi.inference.dsvi.engine.DSVI`)", ""]
    fl, fdata = fidelity_report(fb, args["quick"], args["target_ess"])
    tl, tsum = table5(rows, args["splits"])
    L += summary_section(fb, fdata, args["target_ess"], tsum)
    L += fl
    L += tl
    L += ["## Differences from the paper that we can explain", "",
          "- **Splits.** The paper does not give its splits; ours are 5 seeded random splits (90/10 for Boston and "
          "Bodyfat, 315/315 for Pendulum). With 51 (Boston) or 25 (Bodyfat) test points the split-to-split sd of "
          "SMSE/NLPD is as large as the differences between methods, so single-split numbers are not comparable.",
          "- **Bodyfat.** With Density as an input (the paper's 14 inputs) body fat is almost a deterministic "
          "function of it (Siri's equation), except for the known bad rows (StatLib cases 42, 48, 76, 96, 182, kept "
          "unchanged; see `gpvi/datasets/data/PROVENANCE.md`). Test SMSE/NLPD are dominated by whether those rows "
          "fall in the 25 test points (per-split table). The paper's 0.07 / −2.07 cannot be matched without its "
          "split, and the paper's finding that ML-II overfits Bodyfat (SMSE 0.1992) does not reproduce on our "
          "splits: all three methods are within split-to-split noise of each other.",
          "- **Pendulum.** The original 315/315 split is not recorded in our copy (fold column unused); the data are "
          "centred but unscaled. We use seeded random 315/315 splits.",
          "- **NLPD units.** The paper does not say whether NLPD is on standardised targets; we report both. "
          "Pendulum's original-units NLPD is close to the paper's ~0.45, Boston's standardised NLPD is closer to "
          "theirs — the paper may have standardised differently per data set.",
          "- **MCMC.** The paper's MCMC took 20 h; ours is NUTS with 2 chains x 300 draws per split (4 x ≥800 on "
          "Boston split 0), enough for predictive metrics (a 200-component mixture) but not a gold standard on "
          "every split. Mixing of the short runs (min ESS over parameters, max split R-hat, over splits): "
          + mcmc_quality(rows) + ".",
          "- **Fidelity.** Where the NUTS marginal is skewed or has two modes (Boston lengthscales 4, 7 and 11 in the "
          "figure), a Gaussian q cannot match its mean and sd: DSVI maximises the bound, whose optimum is *not* the "
          "Gaussian with the posterior's moments (the bound table: the moment-matched Gaussian has a lower bound). "
          "The issue's 0.2-sd / 25% targets then fail for reasons of the Gaussian family, not of the optimiser "
          "(which the convergence and bound checks separate). The paper's Figure 4 shows three hyperparameters; "
          "it does not say which.", ""]
    L += ["## Warnings raised during the jobs", ""]
    warn = {f"- {r.get('dataset')}/{r.get('split')}/{r.get('method')}: {w}" for r in rows for w in r.get("warnings", [])}
    warn |= {f"- boston/0/DSVI timing seed {r['seed']}: {w}" for r in fb["dsvi_runs"] for w in r.get("warnings", [])}
    warn |= {f"- boston/0/NUTS long run: {w}" for w in fb["nuts"].get("warnings", [])}
    L += (sorted(warn) or ["- none"]) + [""]
    return "\n".join(L), {"summary": tsum, "targets": fdata}


def summary_section(fb: dict[str, Any], fdata: dict[str, Any], target_ess: float,
                    tsum: dict[str, Any]) -> list[str]:
    """What the numbers say, in a few generated sentences."""
    c = fb["compare"]["DSVI vs NUTS"]
    names = fb["names"]
    cv = fb["compare"]["DSVI vs DSVI reference"]
    rc = fb["compare"]["DSVI reference vs NUTS"]
    b = fb["bounds"]
    q_b, ref_b = b["DSVI (defaults, seed 0)"], b["DSVI reference run"]
    mm_b, lap_b = b["Gaussian with NUTS mean and covariance"], b["Laplace at MAP"]
    misses = [n for j, n in enumerate(names) if abs(c["dmean_sd"][j]) > 0.2 or abs(c["sd_ratio"][j] - 1) > 0.25]
    t = fdata["targets"]
    speed_ok = t["DSVI converged in <= 60 s (median of seeds)"] and fdata["nuts_to_dsvi_ratio"] >= 20
    dm_ref, dsd_ref = max(abs(x) for x in cv["dmean_sd"]), max(abs(x - 1) for x in cv["sd_ratio"])
    conv_ok = dm_ref <= 0.2 and dsd_ref <= 0.1 and abs(q_b["bound"] - ref_b["bound"]) <= 2 * q_b["se"]
    return ["## Summary", "",
            f"- **Speed ({'met' if speed_ok else 'missed'}).** DSVI with every default converged on Boston in a median {fdata['dsvi_median_s']:.1f} s "
            f"(max {fdata['dsvi_max_s']:.1f} s) over {len(fb['dsvi_runs'])} seeds; the NUTS run that reached ESS >= "
            f"{target_ess:.0f} took {fb['nuts']['wall_s']:.0f} s in the same process: **{fdata['nuts_to_dsvi_ratio']:.1f}x**"
            f" (targets: <= 60 s {'met' if t['DSVI converged in <= 60 s (median of seeds)'] else 'missed'}, >= 20x "
            f"{'met' if fdata['nuts_to_dsvi_ratio'] >= 20 else 'missed'}).",
            f"- **Converged ({'yes' if conv_ok else 'not shown'}).** The default run is within {dm_ref:.2f} sds "
            f"(means) and {dsd_ref:.0%} (sds) of a {fb['reference']['steps']}-step reference run, and its bound "
            f"({q_b['bound']:.2f}) vs the reference's ({ref_b['bound']:.2f}): difference "
            f"{q_b['bound'] - ref_b['bound']:+.2f}, se {q_b['se']:.2f} each (common draws); criterion: <= 0.2 sd, "
            f"<= 10%, <= 2 se.",
            f"- **Fidelity to NUTS (missed for {len(misses)} of {len(names)}).** Means within 0.2 NUTS sd for "
            f"{sum(abs(x) <= 0.2 for x in c['dmean_sd'])}/{len(names)} and sds within 25% for "
            f"{sum(abs(x - 1) <= 0.25 for x in c['sd_ratio'])}/{len(names)}; misses: {', '.join(misses) or 'none'}. "
            f"These are the skewed and two-mode marginals (figure) and parameters correlated with them (q sits on "
            f"the main mode). The long reference run misses by as much "
            f"(max |Δmean| {max(abs(x) for x in rc['dmean_sd']):.2f} NUTS sds, sd ratio down to "
            f"{min(rc['sd_ratio']):.2f}), and the Gaussian with NUTS's own mean and covariance has a *lower* bound "
            f"({mm_b['bound']:.2f} ± {mm_b['se']:.2f}) than DSVI's q ({q_b['bound']:.2f}): the maximiser of the DSVI "
            f"bound over Gaussians is not the moment-matched Gaussian, so the 0.2-sd / 25% targets are out of reach "
            f"for any optimiser of this bound here — the miss is the Gaussian family's (KL(q||p) is mode-seeking and "
            f"narrows q on two-mode marginals), not the optimiser's. Laplace at the MAP is further off (bound "
            f"{lap_b['bound']:.2f}).",
            predictions_sentence(tsum), ""]


def mcmc_quality(rows: list[dict[str, Any]]) -> str:
    parts = []
    for d in DATASETS:
        r = [x for x in rows if x.get("dataset") == d and x.get("method") == "NUTS" and not x.get("error")]
        if r:
            parts.append(f"{LABEL[d]}: min ESS {min(x['min_ess'] for x in r):.0f}–{max(x['min_ess'] for x in r):.0f}, "
                         f"R-hat <= {max(x['max_r_hat'] for x in r):.3f}")
    out = "; ".join(parts)
    bad = [x for x in rows if x.get("method") == "NUTS" and not x.get("error") and x["max_r_hat"] > 1.05]
    if bad:
        out += (". Runs with R-hat > 1.05 (" + ", ".join(f"{x['dataset']}/{x['split']}" for x in bad) +
                ") had not mixed: their test metrics are still close to DSVI's, but their marginals are not a reference")
    return out


def predictions_sentence(tsum: dict[str, Any]) -> str:
    """DSVI vs NUTS and ML-II test metrics, in units of the split-to-split sd (generated from the table)."""
    parts, ml_better = [], []
    for d in DATASETS:
        a, b, m = tsum.get(f"{d}/DSVI"), tsum.get(f"{d}/NUTS"), tsum.get(f"{d}/ML-II")
        if not a or not b or not a["n"] or not b["n"]:
            continue
        for k in ("smse", "nlpd"):
            sd = max(a[k][1], b[k][1])
            parts.append(abs(a[k][0] - b[k][0]) / sd if sd > 0 else math.inf)
        if m and m["n"] and m["nlpd"][0] < min(a["nlpd"][0], b["nlpd"][0]):
            ml_better.append(f"{LABEL[d]} (ML-II {m['nlpd'][0]:.3f}, DSVI {a['nlpd'][0]:.3f}, NUTS {b['nlpd'][0]:.3f})")
    if not parts or not all(math.isfinite(x) for x in parts):
        return "- **Predictions.** (needs at least 2 splits per data set for a split-to-split sd)"
    out = (f"- **Predictions.** DSVI's mean test SMSE and NLPD differ from NUTS's by at most {max(parts):.2f} "
           "split-to-split sds on every data set (Table 5 below): the mixture predictive over q is as good as "
           "NUTS's for prediction even where the marginals differ.")
    if ml_better:
        out += (" ML-II's point predictive has the best mean NLPD on " + "; ".join(ml_better) +
                " — the opposite of the paper's Bodyfat finding (see the differences below).")
    return out


def main_rerender() -> None:
    """Re-render the markdown of a finished run from its JSON (same numbers; the report text may have changed)."""
    import json
    path = RESULTS / "dsvi_table5.json"
    stored = json.loads(path.read_text())
    note = (f"*Report text re-rendered on {machine_info()['date']} from `{path.name}` of the run recorded below "
            f"(same numbers; the machine record is that of the run).*")
    md, _ = render(stored["data"], stored["machine"], note=note)
    out = write("dsvi_table5", md)
    print(f"wrote {out}")


if __name__ == "__main__":
    if "--rerender" in sys.argv[1:]:
        main_rerender()
    else:
        main()
