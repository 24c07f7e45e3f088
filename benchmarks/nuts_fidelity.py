"""Fidelity of q, PSIS and ``gpvi.infer`` against long NUTS references; NUTS from q vs default NUTS (issue 17).

Two phases, so that the expensive, q-independent reference can be computed once and kept:

``ref``  For Boston, Bodyfat and pendulum: **default NUTS** (``gpvi.NUTS(num_chains=4, seed=1)``: 500 warm-up
         transitions with Stan-window diagonal mass adaptation from the default start, 1,000 draws per chain),
         extended by doubling the draws (a resumed run, identical to a longer one) until every hyperparameter has
         ArviZ bulk ESS >= 400 and rank-normalised split R-hat <= 1.01 (at most 3 doublings; the result says when a
         dataset cannot reach it). These draws are the **reference** and the cost of default NUTS. Written to
         ``results/nuts_fidelity_ref.{json,npz}``.
``q``    On the same datasets: DSVI's default q, PSIS of q (4,000 draws), ``gpvi.infer(model, seed=0)``, and NUTS
         warm-started from q with ``gpvi.infer``'s sampler settings (4 chains x (200 warm-up + 500 draws), q's
         covariance as the dense inverse mass matrix, step size adapted only; extended by doubling like the
         reference). Compares every hyperparameter's mean and sd with the reference: |Δmean| / sd_ref and
         sd / sd_ref for raw q, PSIS-corrected q and gpvi.infer's answer; k-hat; wall times; gradient evaluations.
         Writes ``results/nuts_fidelity.{md,json}`` and one Fig. 4-style overlay per dataset
         (``results/nuts_fidelity_<dataset>.png``).

Cost at equal ESS: gradient (= log-joint + gradient) evaluations are counted by the sampler (warm-up and sampling
separately, ``stats["n_steps"]``); "evaluations to 400 bulk ESS" = warm-up evaluations + sampling evaluations x
400 / (min bulk ESS of the run), i.e. the sampling part pro-rated (bulk ESS grows linearly with the draws of a
mixed chain). The same rule is applied to both samplers. Wall times are measured on a shared 2-core machine (load
recorded); evaluation counts do not depend on load.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/nuts_fidelity.py ref    # ~1-2 h here
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/nuts_fidelity.py q [boston bodyfat pendulum]  # ~15 min each
    # --reuse-nuts: keep the NUTS-from-q row of the last run where gpvi.infer does not itself run NUTS (say so)
    .venv/bin/python benchmarks/nuts_fidelity.py render [DIR ...]   # merge q results written to other folders
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/nuts_fidelity.py seeds [bodyfat ...]  # gpvi.infer, seeds 1-3
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/nuts_fidelity.py mixture [bodyfat boston]  # NUTS from the mixture
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/nuts_fidelity.py engines [dataset ...]  # infer: DSVI vs S&K
    # engines [--seeds 1,2] [--only sk] [--name NAME]: other seeds, one engine, another result file
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
import warnings
from typing import Any

import numpy as np
import torch

import gpvi
from gpvi.inference.infer import default_sk

try:
    from benchmarks._common import RESULTS, header, write
except ImportError:                                   # run as a script from benchmarks/
    from _common import RESULTS, header, write

DATASETS = {"boston": gpvi.datasets.load_boston, "bodyfat": gpvi.datasets.load_bodyfat,
            "pendulum": gpvi.datasets.load_pendulum}
MIN_ESS, MAX_RHAT, MAX_EXT = 400.0, 1.01, 3


def model_of(name: str) -> Any:
    ds = DATASETS[name](seed=0)
    return gpvi.GPRegression(ds.X_train, ds.y_train, feature_names=list(ds.feature_names))


def _mixed(d: Any) -> bool:
    return bool((d["ess_bulk"] >= MIN_ESS).all()) and bool((d["r_hat"] <= MAX_RHAT).all())


def run_to_ess(sampler: Any, model: Any, init: Any = None, mixed: Any = None) -> tuple[Any, dict[str, Any]]:
    """Run ``sampler`` and double its draws (resumed) until min bulk ESS >= 400 and R-hat <= 1.01 (or until
    ``mixed(diagnostics, posterior)`` holds, at most ``MAX_EXT`` doublings); record cost."""
    mixed = (lambda d, mc: _mixed(d)) if mixed is None else mixed
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mc = sampler.run(model, init=init)
        d, ext = mc.diagnostics(), 0
        while not mixed(d, mc) and ext < MAX_EXT:
            sampler = copy.copy(sampler)
            sampler.num_draws = 2 * sampler.num_draws
            mc = sampler.run(model, state=mc.engine_state)
            d, ext = mc.diagnostics(), ext + 1
    return mc, record(mc, time.perf_counter() - t0, ext)


def record(mc: Any, wall: float, ext: int) -> dict[str, Any]:
    """Cost and diagnostics of a finished (possibly extended) NUTS run; sampling evaluations pro-rated to 400 ESS."""
    d = mc.diagnostics()
    warm = mc.info.get("warmup_stats") or {}
    ev_warm = int(torch.as_tensor(warm["n_steps"]).sum()) if "n_steps" in warm else 0
    ev_samp = int(mc.stats["n_steps"].sum())
    min_ess = float(d["ess_bulk"].min())
    return {"draws_per_chain": int(mc.draws.shape[1]), "extensions": ext, "mixed": _mixed(d), "wall_s": wall,
            "evals_warmup": ev_warm, "evals_sampling": ev_samp, "min_ess_bulk": min_ess,
            "min_ess_tail": float(d["ess_tail"].min()), "max_r_hat": float(d["r_hat"].max()),
            "divergences": int(mc.stats["diverging"].sum()),
            "e_bfmi_min": float(min(mc.info.get("e_bfmi") or [math.nan])),
            "evals_to_400": ev_warm + ev_samp * MIN_ESS / min_ess,
            "wall_to_400": wall * (ev_warm + ev_samp * MIN_ESS / min_ess) / max(ev_warm + ev_samp, 1)}


def phase_ref() -> None:
    out, draws = {}, {}
    for name in DATASETS:
        model = model_of(name)
        mc, rec = run_to_ess(gpvi.NUTS(num_chains=4, seed=1, progress_bar=False), model)
        rec["names"] = list(model.names)
        d = mc.diagnostics()
        rec["ess_bulk"] = [float(x) for x in d["ess_bulk"]]
        rec["r_hat"] = [float(x) for x in d["r_hat"]]
        out[name], draws[name] = rec, mc.draws.cpu().numpy()
        print(name, {k: v for k, v in rec.items() if not isinstance(v, list)}, flush=True)
        np.savez_compressed(RESULTS / "nuts_fidelity_ref.npz", **draws)      # keep what is done
        (RESULTS / "nuts_fidelity_ref.json").write_text(json.dumps(
            {"machine": header("nuts_fidelity ref"), "load_after": os.getloadavg(), "datasets": out}, indent=1))


def _cmp(mean: torch.Tensor, sd: torch.Tensor, ref: np.ndarray) -> dict[str, list[float]]:
    rm, rs = ref.mean(0), ref.std(0, ddof=1)
    m, s = mean.detach().cpu().numpy(), sd.detach().cpu().numpy()
    return {"dmean_sd": [float(x) for x in np.abs(m - rm) / rs], "sd_ratio": [float(x) for x in s / rs]}


def overlay(name: str, names: list[str], ref: np.ndarray, q: Any, w: Any, ans: Any) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    D = len(names)
    cols = 4
    rows = math.ceil(D / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    wd, ww = w.draws.cpu().numpy(), w.weights.cpu().numpy()
    qm, qs = q.mean.cpu().numpy(), q.std.cpu().numpy()
    am, as_ = ans.mean.detach().cpu().numpy(), ans.std.detach().cpu().numpy()
    for j in range(rows * cols):
        ax = axes[j // cols][j % cols]
        if j >= D:
            ax.axis("off")
            continue
        lo, hi = np.quantile(ref[:, j], [0.001, 0.999])
        lo, hi = min(lo, qm[j] - 3.5 * qs[j]), max(hi, qm[j] + 3.5 * qs[j])
        bins = np.linspace(lo, hi, 40)
        ax.hist(ref[:, j], bins=bins, density=True, color="0.8", label="NUTS reference")
        ax.hist(wd[:, j], bins=bins, weights=ww, density=True, histtype="step", color="C1", label="PSIS-weighted q")
        g = np.linspace(lo, hi, 200)
        ax.plot(g, np.exp(-0.5 * ((g - qm[j]) / qs[j]) ** 2) / (qs[j] * math.sqrt(2 * math.pi)), "C0", label="raw q")
        ax.axvline(am[j], color="C3", lw=1, label="gpvi.infer mean")
        ax.axvspan(am[j] - as_[j], am[j] + as_[j], color="C3", alpha=0.1)
        ax.set_title(names[j], fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=6)
    fig.suptitle(f"{name}: marginals of log-hyperparameters")
    fig.tight_layout()
    fig.savefig(RESULTS / f"nuts_fidelity_{name}.png", dpi=90)
    plt.close(fig)


def phase_q(names: list[str], reuse_nuts: bool = False) -> None:
    refj = json.loads((RESULTS / "nuts_fidelity_ref.json").read_text())["datasets"]
    refd = np.load(RESULTS / "nuts_fidelity_ref.npz")
    part = RESULTS / "nuts_fidelity.json"                 # results of earlier q runs (other datasets) are kept
    out: dict[str, Any] = json.loads(part.read_text())["data"] if part.exists() else {}
    for name in names:
        if name not in refj:
            print(f"{name}: no reference yet (run the ref phase)", flush=True)
            continue
        model = model_of(name)
        ref = refd[name].reshape(-1, refd[name].shape[-1])
        rec: dict[str, Any] = {"names": list(model.names), "load_before": os.getloadavg(),
                               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        t0 = time.perf_counter()
        ans = gpvi.infer(model, seed=0, progress_bar=False)       # DSVI's default q -> PSIS -> answer
        rec["infer_s"] = time.perf_counter() - t0
        rec["infer_answer"], rec["infer_khat"] = ans.report.answer, ans.report.khat
        rec["basin_mass"], rec["khat_mixture"] = list(ans.report.basin_mass), float(ans.report.khat_mixture)
        rec["infer_report"], rec["infer_times"] = str(ans.report), dict(ans.report.times)
        q = ans.report.q                                          # the q gpvi.infer diagnosed
        rec["dsvi_s"], rec["elbo"], rec["elbo_se"] = ans.report.times["q"], float(q.elbo), float(q.elbo_se)
        plain = {**q.info.counters, **q.info}
        rec["dsvi_info"] = {k: v for k, v in plain.items() if isinstance(v, (int, float, bool, str))}
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            w = q.psis(model, num_draws=4000, seed=0)
        rec["psis_s"], rec["khat"], rec["psis_ess"] = time.perf_counter() - t0, float(w.khat), float(w.ess)
        rec["raw_q"] = _cmp(q.mean, q.std, ref)
        rec["psis"] = _cmp(w.mean, w.std, ref)
        rec["infer"] = _cmp(ans.mean, ans.std, ref)
        if ans.report.answer == "nuts":          # gpvi.infer ran exactly this sampler from this q: reuse it
            rec["nuts_from_q"] = record(ans, ans.report.times["nuts"], int(ans.report.nuts["extensions"]))
        elif reuse_nuts and "nuts_from_q" in out.get(name, {}):
            rec["nuts_from_q"] = {**out[name]["nuts_from_q"],
                                  "reused_from": out[name].get("nuts_from_q", {}).get("reused_from", out[name]["date"])}
        else:
            nuts = gpvi.NUTS(num_chains=4, num_warmup=200, num_draws=500, seed=0, progress_bar=False)
            _, rec["nuts_from_q"] = run_to_ess(nuts, model, init=q)
        rec["nuts_default"] = {k: refj[name][k] for k in ("evals_to_400", "wall_to_400", "wall_s", "min_ess_bulk",
                                                          "max_r_hat", "mixed", "draws_per_chain")}
        overlay(name, list(model.names), ref, q, w, ans)
        rec["load_after"] = os.getloadavg()
        out[name] = rec
        print(name, rec["khat"], rec["infer_answer"], flush=True)
    md = header("Fidelity of q, PSIS and gpvi.infer against long NUTS references; NUTS from q vs default NUTS")
    md += report(out, refj)
    print(write("nuts_fidelity", md, out))


def report(out: dict[str, Any], refj: dict[str, Any]) -> str:
    lines = ["", "Reference: default NUTS, 4 chains, extended until every hyperparameter has bulk ESS >= 400 and "
             "R-hat <= 1.01 (`ref` phase). |Δmean| in reference sds; sd ratio = sd / reference sd. "
             "Monte Carlo error of the reference mean at ESS 400: about 0.05 sd.", "",
             "## Summary per dataset", "",
             "k-hat: PSIS of raw q (the best Gaussian). Basins: when DSVI's starts ended in several basins, the "
             "posterior mass of each (best q's first) and the k-hat of the mixture of their Gaussians "
             "(PSIS of that mixture is then gpvi.infer's weighted answer).", "",
             "| dataset | reference mixed (min ESS, max R-hat) | k-hat | basins: mass (k-hat) | raw q: max abs "
             "Δmean/sd, sd ratio range | PSIS of raw q: max Δmean/sd, sd ratio range | gpvi.infer answer: max "
             "Δmean/sd, sd ratio range | infer wall (s) | default NUTS wall to 400 ESS (s) | ratio |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in out.items():
        ref = refj[name]
        r["reference"] = {k: ref[k] for k in ("wall_s", "evals_warmup", "evals_sampling", "min_ess_bulk",
                                              "max_r_hat", "mixed", "draws_per_chain", "extensions")}

        def rng(c: dict[str, list[float]]) -> str:
            return f"{max(c['dmean_sd']):.2f}, {min(c['sd_ratio']):.2f}–{max(c['sd_ratio']):.2f}"
        lines.append(f"| {name} | {ref['mixed']} ({ref['min_ess_bulk']:.0f}, {ref['max_r_hat']:.3f}) | "
                     f"{r['khat']:.2f} | {basins(r)} | {rng(r['raw_q'])} | {rng(r['psis'])} | {r['infer_answer']}: "
                     f"{rng(r['infer'])} | {r['infer_s']:.0f} | {ref['wall_to_400']:.0f} | "
                     f"{r['infer_s'] / ref['wall_to_400']:.2f} |")
    lines += ["", "## NUTS from q vs default NUTS at equal bulk ESS (gradient evaluations, pro-rated to 400)", "",
              "| dataset | default: evals to 400 | from q: evals to 400 | ratio | default: wall to 400 (s) | "
              "from q: wall to 400 (s) | from q: min ESS, max R-hat, divergences |", "|---|---|---|---|---|---|---|"]
    for name, r in out.items():
        a, b = r["nuts_default"], r["nuts_from_q"]
        reused = f" (measured {b['reused_from']})" if b.get("reused_from") else ""
        lines.append(f"| {name}{reused} | {a['evals_to_400']:.0f} | {b['evals_to_400']:.0f} | "
                     f"{b['evals_to_400'] / a['evals_to_400']:.2f} | {a['wall_to_400']:.0f} | "
                     f"{b['wall_to_400']:.0f} | {b['min_ess_bulk']:.0f}, {b['max_r_hat']:.3f}, "
                     f"{b['divergences']} |")
    for name, r in out.items():
        lines += ["", f"## {name}: per hyperparameter", "", "| θ | raw q Δmean/sd | raw q sd ratio | PSIS Δmean/sd "
                  "| PSIS sd ratio | infer Δmean/sd | infer sd ratio |", "|---|---|---|---|---|---|---|"]
        for j, n in enumerate(r["names"]):
            lines.append(f"| {n} | {r['raw_q']['dmean_sd'][j]:.2f} | {r['raw_q']['sd_ratio'][j]:.2f} | "
                         f"{r['psis']['dmean_sd'][j]:.2f} | {r['psis']['sd_ratio'][j]:.2f} | "
                         f"{r['infer']['dmean_sd'][j]:.2f} | {r['infer']['sd_ratio'][j]:.2f} |")
        lines += ["", f"Run {r['date']}, load average before / after {r['load_before']} / {r['load_after']} "
                  "(2 cores; wall times inflated by other jobs when above 2).",
                  "", f"![{name}](nuts_fidelity_{name}.png)", "", "```", r["infer_report"], "```"]
    return "\n".join(lines) + "\n"


def phase_seeds(names: list[str], seeds: list[int]) -> None:
    """gpvi.infer from several seeds (the MAP restarts that find the basins depend on it): answer, basins, fidelity."""
    refd = np.load(RESULTS / "nuts_fidelity_ref.npz")
    rows: dict[str, Any] = {}
    lines = ["", "gpvi.infer(model, seed=s) for several seeds against the long NUTS references of `nuts_fidelity.md` "
             "(the basins DSVI's starts find depend on the seed of the MAP restarts).", "",
             "| dataset | seed | answer | raw q k-hat | basins: mass (k-hat) | max Δmean/sd | sd ratio range | wall (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for name in names:
        model = model_of(name)
        ref = refd[name].reshape(-1, refd[name].shape[-1])
        for seed in seeds:
            t0 = time.perf_counter()
            ans = gpvi.infer(model, seed=seed, progress_bar=False)
            wall = time.perf_counter() - t0
            c = _cmp(ans.mean, ans.std, ref)
            r = {"answer": ans.report.answer, "khat": ans.report.khat, "basin_mass": list(ans.report.basin_mass),
                 "khat_mixture": float(ans.report.khat_mixture), "wall_s": wall, "load": os.getloadavg(), **c}
            rows[f"{name}/{seed}"] = r
            lines.append(f"| {name} | {seed} | {r['answer']} | {r['khat']:.2f} | {basins(r)} | "
                         f"{max(c['dmean_sd']):.2f} | {min(c['sd_ratio']):.2f}–{max(c['sd_ratio']):.2f} | {wall:.0f} |")
            print(lines[-1], flush=True)
    md = header("gpvi.infer across seeds against the long NUTS references") + "\n".join(lines) + "\n"
    print(write("nuts_fidelity_seeds", md, rows))


def phase_engines(names: list[str], seeds: list[int], engines: tuple[str, ...] = ("dsvi", "sk"),
                  out_name: str = "nuts_fidelity_engines") -> None:
    """gpvi.infer with engine="dsvi" (the default) and engine="sk" (S&K Hessian-free from every distinct MAP
    optimum), same seeds, same run: q's bound, k-hat, answer, fidelity against the reference and wall time."""
    refd = np.load(RESULTS / "nuts_fidelity_ref.npz")
    rows: dict[str, Any] = {}
    lines = ["", "gpvi.infer(model, seed=s, engine=e) for the variational engine e = \"dsvi\" (DSVI's default: natural "
             "steps from every distinct MAP optimum, plateau then finish) and e = \"sk\" (Salimans-Knowles "
             "Hessian-free from the same starts, the second half averaged: `gpvi.inference.infer.default_sk`, at the "
             f"time of this run {default_sk(15, progress_bar=False)!r} for D = 15), against "
             "the long NUTS references of `nuts_fidelity.md`. Bound: the best start's final bound and its standard "
             "error (1,000 draws for DSVI's, 1,000 for S&K's); wall: the variational stage (MAP restarts included) "
             "and all of gpvi.infer.", "",
             "| dataset | seed | engine | bound (se) | starts | raw q max Δmean/sd | raw q k-hat | basins: mass (k-hat) "
             "| answer | max Δmean/sd | sd ratio range | variational stage (s) | infer wall (s) | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        model = model_of(name)
        ref = refd[name].reshape(-1, refd[name].shape[-1])
        for seed in seeds:
            for engine in engines:
                t0 = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ans = gpvi.infer(model, seed=seed, engine=engine, progress_bar=False)
                wall = time.perf_counter() - t0
                q = ans.report.q
                c = _cmp(ans.mean, ans.std, ref)
                raw = _cmp(q.mean, q.std, ref)
                r = {"engine": engine, "answer": ans.report.answer, "khat": ans.report.khat,
                     "raw_q_dmean_sd": raw["dmean_sd"], "raw_q_sd_ratio": raw["sd_ratio"],
                     "basin_mass": list(ans.report.basin_mass), "khat_mixture": float(ans.report.khat_mixture),
                     "elbo": float(q.elbo), "elbo_se": float(q.elbo_se), "starts": len(ans.report.starts),
                     "stage_s": ans.report.times["q"], "wall_s": wall, "load": os.getloadavg(), **c}
                rows[f"{name}/{seed}/{engine}"] = r
                lines.append(f"| {name} | {seed} | {engine} | {r['elbo']:.3f} ({r['elbo_se']:.3f}) | {r['starts']} | "
                             f"{max(raw['dmean_sd']):.2f} | {r['khat']:.2f} | {basins(r)} | {r['answer']} | "
                             f"{max(c['dmean_sd']):.2f} | "
                             f"{min(c['sd_ratio']):.2f}–{max(c['sd_ratio']):.2f} | {r['stage_s']:.0f} | {wall:.0f} | "
                             f"{r['load'][0]:.1f} |")
                print(lines[-1], flush=True)
    md = header("gpvi.infer: DSVI vs S&K Hessian-free as the variational engine") + "\n".join(lines) + "\n"
    print(write(out_name, md, rows))


def phase_mixture(names: list[str]) -> None:
    """NUTS warm-started from the mixture of DSVI's starts (its mean and covariance) vs from q and default NUTS."""
    from gpvi.inference.infer import starts_mixture
    refj = json.loads((RESULTS / "nuts_fidelity_ref.json").read_text())["datasets"]
    prev = json.loads((RESULTS / "nuts_fidelity.json").read_text())["data"]
    rows: dict[str, Any] = {}
    lines = ["", "NUTS (4 chains, 200 warm-up, 500 draws, extended by doubling to bulk ESS >= 400 and R-hat <= 1.01) "
             "started from the Gaussian with the mean and covariance of the mixture of DSVI's starts (its covariance "
             "the dense inverse mass matrix, step size adapted), against default NUTS (the `ref` phase) and NUTS "
             "from q (`nuts_fidelity.md`). Evaluations pro-rated to 400 bulk ESS as there.", "",
             "| dataset | basins | default: evals to 400 | from q | from mixture | mixture / default | from mixture: "
             "min ESS, max R-hat, divergences, wall to 400 (s) |", "|---|---|---|---|---|---|---|"]
    for name in names:
        model = model_of(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q = gpvi.DSVI(scale="full", seed=0, progress_bar=False).run(model)
        mix = starts_mixture(q, model)
        if mix is None:
            print(name, "one basin: nothing to compare", flush=True)
            continue
        nuts = gpvi.NUTS(num_chains=4, num_warmup=200, num_draws=500, seed=0, progress_bar=False)
        _, rec = run_to_ess(nuts, model, init=mix)
        rec["mixture_weights"] = [float(x) for x in mix.weights]
        rows[name] = rec
        a, b = refj[name]["evals_to_400"], prev.get(name, {}).get("nuts_from_q", {}).get("evals_to_400", math.nan)
        lines.append(f"| {name} | {len(mix.components)} | {a:.0f} | {b:.0f} | {rec['evals_to_400']:.0f} | "
                     f"{rec['evals_to_400'] / a:.2f} | {rec['min_ess_bulk']:.0f}, {rec['max_r_hat']:.3f}, "
                     f"{rec['divergences']}, {rec['wall_to_400']:.0f} |")
        print(lines[-1], flush=True)
        md = header("NUTS warm-started from the mixture of DSVI's starts") + "\n".join(lines) + "\n"
        write("nuts_fidelity_mixture", md, rows)


def basins(r: dict[str, Any]) -> str:
    mass = r.get("basin_mass") or []
    if not mass:
        return "one"
    return " / ".join(f"{m:.2f}" for m in mass) + f" ({r['khat_mixture']:.2f})"


def render(dirs: list[str]) -> None:
    """Merge the q-phase results of runs written elsewhere (``GPVI_BENCH_OUT=DIR ... q <datasets>``, e.g. two
    processes side by side) into this results folder and write the report again."""
    import shutil
    from pathlib import Path

    out: dict[str, Any] = {}
    for folder in [RESULTS, *map(Path, dirs)]:
        part = folder / "nuts_fidelity.json"
        if part.exists():
            out.update(json.loads(part.read_text())["data"])
        for png in folder.glob("nuts_fidelity_*.png"):
            if folder != RESULTS:
                shutil.copy(png, RESULTS / png.name)
    out = {n: out[n] for n in DATASETS if n in out}
    refj = json.loads((RESULTS / "nuts_fidelity_ref.json").read_text())["datasets"]
    md = header("Fidelity of q, PSIS and gpvi.infer against long NUTS references; NUTS from q vs default NUTS")
    md += ("\nThe q phase of the datasets may come from separate processes (merged by the `render` phase); each "
           "dataset's section gives its run date and load.\n")
    print(write("nuts_fidelity", md + report(out, refj), out))


if __name__ == "__main__":
    phase = sys.argv[1] if len(sys.argv) > 1 else "q"
    if phase not in ("ref", "q", "render", "seeds", "mixture", "engines"):
        raise SystemExit("usage: nuts_fidelity.py ref | q [--reuse-nuts] [dataset ...] | render [DIR ...] | "
                         "seeds [dataset ...] | mixture [dataset ...] | engines [dataset ...]")
    if phase == "ref":
        phase_ref()
    elif phase == "q":
        args = sys.argv[2:]
        reuse = "--reuse-nuts" in args
        args = [a for a in args if a != "--reuse-nuts"]
        phase_q(args or list(DATASETS), reuse_nuts=reuse)
    elif phase == "mixture":
        phase_mixture(sys.argv[2:] or ["bodyfat", "boston"])
    elif phase == "seeds":
        phase_seeds(sys.argv[2:] or list(DATASETS), [1, 2, 3])
    elif phase == "engines":                  # engines [--seeds 1,2 --only sk --name NAME] [dataset ...]
        args, seeds, only = sys.argv[2:], [0], ("dsvi", "sk")
        name = None
        if "--name" in args:
            i = args.index("--name")
            name = args[i + 1]
            args = args[:i] + args[i + 2:]
        if "--seeds" in args:
            i = args.index("--seeds")
            seeds = [int(x) for x in args[i + 1].split(",")]
            args = args[:i] + args[i + 2:]
        if "--only" in args:
            i = args.index("--only")
            only = (args[i + 1],)
            args = args[:i] + args[i + 2:]
        phase_engines(args or list(DATASETS), seeds, only,
                      name or ("nuts_fidelity_engines" if seeds == [0] else "nuts_fidelity_engines_seeds"))
    else:
        render(sys.argv[2:])
