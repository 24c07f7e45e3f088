"""The best Gaussian by default (issue 17, item 1): DSVI's multi-start, its finish, and engine cost to one bound.

Three GP hyperparameter posteriors (gpvi.datasets loaders, split 0): Boston (D = 15), Bodyfat (with Density,
D = 16) and pendulum (D = 11). For each:

1. **Starts.** The distinct MAP optima of 5 seeded L-BFGS restarts (DSVI's default start for exact GP targets),
   with each optimum's log joint and Laplace log evidence.
2. **Defaults before / after.** ``gpvi.DSVI(seed=0).run(model)`` as a user calls it, before this change (one MAP
   restart, stop at the bound's plateau: ``init_to_laplace(init_to_map(1))`` and ``Convergence(gap_tol=None)``)
   and after (every distinct optimum, the finish to 0.01 nats, the best kept): wall time, log-joint rows (a
   counting proxy: every point at which log g, and its gradient, was evaluated, the start included) and the bound.
3. **Engines from the same start** (the best MAP optimum with its Laplace scale): DSVI's old stop, DSVI's new
   finish, DSVI natural run 10x longer than the new finish (Polyak average over its last half: the reference of
   the "within 0.01 nats" check), Salimans-Knowles' default (Algorithm 2; finite-difference Hessians on a GP) and
   its Hessian-free variant (4 draws per step, N = 250, 500, 1000).

Every bound is the same estimator: ``n`` fixed standard-normal draws (common random numbers for every q of a
dataset), :math:`\\hat F = \\frac1n\\sum_i [\\log g(m + L\\varepsilon_i) - \\log q(m + L\\varepsilon_i)]` with its
standard error; gaps between two q's are computed with the same draws, so their error is far below the se.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dsvi_best_gaussian.py [--quick] [--datasets boston,bodyfat]
        [--long 10] [--skip-alg2]

or one process per dataset (``--datasets boston`` writes ``dsvi_best_gaussian_boston.*``) and then
``--merge --datasets boston,bodyfat,pendulum`` for the one report. The committed report was made that way with
``--long 2 --skip-alg2`` (Boston), ``--long 3 --skip-alg2`` (Bodyfat) and ``--long 3`` (pendulum).

Writes ``benchmarks/results/dsvi_best_gaussian{,_quick}.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpvi  # noqa: E402
from benchmarks._common import RESULTS, header, write  # noqa: E402
from gpvi.inference.dsvi import Convergence  # noqa: E402
from gpvi.inference.dsvi.engine import DSVI  # noqa: E402
from gpvi.inference.init import Start, init_to_laplace, init_to_map  # noqa: E402
from gpvi.inference.salimans_knowles import SKGaussian  # noqa: E402

LOADERS = {"boston": lambda: gpvi.datasets.load_boston(seed=0),
           "bodyfat": lambda: gpvi.datasets.load_bodyfat(seed=0),
           "pendulum": lambda: gpvi.datasets.load_pendulum(seed=0)}


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


class Bound:
    """mean(log g - log q) over fixed draws eps (common random numbers for every q of one target)."""

    def __init__(self, model: Any, n: int, seed: int = 12345) -> None:
        self.model = model
        self.eps = torch.randn(n, model.dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)

    def values(self, q: Any) -> torch.Tensor:
        m, L = q.mean.detach(), q.scale_tril.detach()
        with torch.no_grad():
            lg = torch.cat([self.model.log_joint(m + e @ L.T) for e in self.eps.split(250)])
        D = m.shape[0]
        log_q = -0.5 * (self.eps ** 2).sum(-1) - torch.log(torch.diagonal(L)).sum() - 0.5 * D * math.log(2 * math.pi)
        return lg - log_q

    def __call__(self, q: Any) -> tuple[float, float, torch.Tensor]:
        v = self.values(q)
        ok = torch.isfinite(v)
        return float(v[ok].mean()), float(v[ok].std() / math.sqrt(int(ok.sum()))), v


def gap(ref_v: torch.Tensor, v: torch.Tensor) -> tuple[float, float]:
    """F(ref) - F(q) from the same draws, and its standard error."""
    d = ref_v - v
    d = d[torch.isfinite(d)]
    return float(d.mean()), float(d.std() / math.sqrt(d.numel()))


def timed(fn, target: Any) -> dict[str, Any]:
    proxy = Counting(target)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        failed = None
        try:
            q = fn(proxy)
        except gpvi.exceptions.NumericalFaultError as err:
            q, failed = err.partial, str(err)[:120]
        wall = time.perf_counter() - t0
    msgs = sorted({f"{w.category.__name__}: {str(w.message)[:80]}" for w in rec
                   if not issubclass(w.category, DeprecationWarning)})
    return {"q": q, "time_s": wall, "rows": proxy.rows, "failed": failed, "warnings": msgs,
            "steps": int(q.info.get("steps", 0)) if q is not None else 0}


def one_dataset(name: str, quick: bool, n_bound: int, long: int, skip_alg2: bool = False
                ) -> tuple[list[str], dict[str, Any]]:
    ds = LOADERS[name]()
    model = gpvi.GPRegression(ds.X_train, ds.y_train)
    bound = Bound(model, n_bound)
    D = model.dim
    out: dict[str, Any] = {"D": D, "N": int(ds.X_train.shape[0])}
    lines = [f"## {name} (N = {out['N']}, D = {D})", ""]

    # 1. the starts
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = DSVI(seed=0).default_init(model)(model)
    t_start = time.perf_counter() - t0
    optima = start.info.get("optima", [])
    starts = [start, *start.alternatives]
    lines += [f"- MAP restarts: 5 (seed 0), {t_start:.1f} s with the Laplace scales; distinct optima "
              f"(|delta theta| > 0.1 in some component): {len(optima)}", "",
              "| optimum | restarts | log joint | Laplace log evidence | max abs delta theta vs best |",
              "|---|---|---|---|---|"]
    for k, s in enumerate(starts):
        o = optima[k] if k < len(optima) else {"restarts": "-", "value": s.info.get("map_value")}
        lines.append(f"| {k} | {o['restarts']} | {o['value']:.3f} | {s.info.get('laplace_log_evidence', math.nan):.3f} "
                     f"| {float((s.theta - start.theta).abs().max()):.2f} |")
    out["optima"] = [{"value": o["value"], "restarts": o["restarts"]} for o in optima]
    best_start = Start(start.theta, start.scale_tril, start.scale_source, start.info)

    runs: dict[str, dict[str, Any]] = {}

    def record(key: str, r: dict[str, Any]) -> None:
        if r["q"] is not None and r["failed"] is None:
            r["F"], r["F_se"], r["v"] = bound(r["q"])
        else:
            r["F"], r["F_se"], r["v"] = -math.inf, math.nan, None
        runs[key] = r
        print(f"{name} {key}: {r['time_s']:.1f} s, {r['rows']} rows, {r['steps']} steps, bound {r['F']:.3f} "
              f"+- {r['F_se']:.3f} {r['failed'] or ''}", flush=True)

    # 2. the defaults, as a user calls them
    old_conv = Convergence(gap_tol=None)
    record("default before", timed(lambda t: DSVI(seed=0, progress_bar=False, convergence=old_conv).run(
        t, init=init_to_laplace(init_to_map(1, seed=0))), model))
    record("default after", timed(lambda t: DSVI(seed=0, progress_bar=False).run(t), model))
    q_after = runs["default after"]["q"]

    # 3. engines from the same start (the best optimum, its Laplace scale); the start's cost is not counted
    record("DSVI old stop", timed(lambda t: DSVI(seed=0, progress_bar=False, convergence=old_conv).run(
        t, init=best_start), model))
    if len(starts) == 1:           # the default's one run *is* the run from this start (same seed and stream)
        runs["DSVI new finish"] = {**runs["default after"], "note": "the default's run (one optimum)"}
    else:
        record("DSVI new finish", timed(lambda t: DSVI(seed=0, progress_bar=False).run(t, init=best_start), model))
    n_new = runs["DSVI new finish"]["steps"]
    n_long = long * n_new
    record(f"DSVI natural {n_long} steps = {long}x (reference)", timed(lambda t: DSVI(
        seed=1, progress_bar=False, num_steps=n_long, polyak=0.5, convergence=Convergence(stop=False)).run(
        t, init=best_start), model))
    sk_grid = [250] if quick else [250, 500, 1000, 2000]
    for N in sk_grid:
        record(f"S&K Hessian-free N={N}", timed(lambda t: SKGaussian(
            num_steps=N, method="gradient", num_draws=4, seed=0, progress_bar=False, num_elbo_draws=0).run(
            t, init=best_start), model))
    for N in ([] if quick or skip_alg2 else [200]):
        record(f"S&K default (Alg. 2, fd Hessians) N={N}", timed(lambda t: SKGaussian(
            num_steps=N, seed=0, progress_bar=False, num_elbo_draws=0).run(t, init=best_start), model))

    ref_key = max((k for k in runs if runs[k]["v"] is not None), key=lambda k: runs[k]["F"])
    ref_v = runs[ref_key]["v"]
    long_key = [k for k in runs if "reference" in k][0]
    lines += ["", f"- bound estimator: {n_bound} fixed draws, mean(log g - log q) (common random numbers); best "
              f"bound of all runs: {runs[ref_key]['F']:.3f} +- {runs[ref_key]['F_se']:.3f} ({ref_key}); gaps are "
              "to it, from the same draws", ""]
    # multi-start record of the default
    recs = q_after.info.get("starts", [])
    lines += ["### DSVI default after: one run per distinct optimum", "",
              "| start | MAP log joint | final bound (DSVI's own estimate) | se | steps | converged | chosen |",
              "|---|---|---|---|---|---|---|"]
    for r in recs:
        lines.append(f"| {r['start']} | {r['map_value']:.3f} | {r['elbo']:.3f} | {r['elbo_se']:.3f} | {r['steps']} | "
                     f"{r['converged']} | {'yes' if r['start'] == q_after.info.get('start_chosen') else ''} |")
    lines += ["", f"- starts agree (bounds within 2 combined se): {q_after.info.get('starts_agree')}", ""]
    lines += ["### Cost and bound", "",
              f"| run | wall s | log-joint rows | steps | bound | se | gap to best (CRN) | gap to the {long}x run (CRN) | "
              "warnings |", "|---|---|---|---|---|---|---|---|---|"]
    for k, r in runs.items():
        if r["v"] is None:
            lines.append(f"| {k} | {r['time_s']:.1f} | {r['rows']} | {r['steps']} | failed | | | | {r['failed']} |")
            continue
        g, gse = gap(ref_v, r["v"])
        gl, glse = gap(runs[long_key]["v"], r["v"]) if runs[long_key]["v"] is not None else (math.nan, math.nan)
        r["gap"], r["gap_se"], r["gap_long"], r["gap_long_se"] = g, gse, gl, glse
        w = "; ".join(r["warnings"])[:120] or "-"
        lines.append(f"| {k} | {r['time_s']:.1f} | {r['rows']} | {r['steps']} | {r['F']:.3f} | {r['F_se']:.3f} | "
                     f"{g:.3f} +- {gse:.3f} | {gl:.3f} +- {glse:.3f} | {w} |")
    est_gap = runs["DSVI new finish"]["q"].info["convergence"].get("gap")
    lines += ["", f"- DSVI new finish: its own gap estimate {est_gap if est_gap is None else round(est_gap, 4)} "
              f"nats; returned: {runs['DSVI new finish']['q'].info['returned']}", ""]
    out["runs"] = {k: {kk: vv for kk, vv in r.items() if kk not in ("q", "v")} for k, r in runs.items()}
    out["starts"] = [{k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in r.items()} for r in recs]
    out["starts_agree"] = q_after.info.get("starts_agree")
    return lines, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--datasets", default="boston,bodyfat,pendulum")
    ap.add_argument("--long", type=int, default=10, help="length of the reference run, in units of the new finish")
    ap.add_argument("--skip-alg2", action="store_true", help="leave out S&K Algorithm 2 (fd Hessians, slow)")
    ap.add_argument("--merge", action="store_true", help="combine the per-dataset results written by earlier runs")
    args = ap.parse_args()
    names = [n for n in args.datasets.split(",") if n]
    stem = "dsvi_best_gaussian" + ("_quick" if args.quick else "")
    title = "DSVI: the best Gaussian by default (multi-start, finish, engine cost)"
    if args.merge:                 # one report from per-dataset runs (run in parallel processes)
        body, data = [], {}
        for name in names:
            part = RESULTS / f"{stem}_{name}.md"
            body.append(part.read_text().split("\n", 1)[1])
            data[name] = json.loads((RESULTS / f"{stem}_{name}.json").read_text())["data"]
        md = header(title) + "\n" + "\n".join(body) + "\n" + READING
        write(stem, md, data)
        for name in names:
            for ext in ("md", "json"):
                (RESULTS / f"{stem}_{name}.{ext}").unlink()
            for old in (RESULTS / "csv").glob(f"{stem}_{name}_[0-9]*_*.csv"):
                old.unlink()
        print(md)
        return
    n_bound = 1000 if args.quick else 4000
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    body, data = [], {}
    for name in names:
        lines, d = one_dataset(name, args.quick, n_bound, 3 if args.quick else args.long, args.skip_alg2)
        body += lines
        data[name] = d
    md = header(title)
    md += (f"\n- load average before / after: {[round(x, 2) for x in load0]} / "
           f"{[round(x, 2) for x in os.getloadavg()]} (a shared 2-core machine: wall times are noisy; rows are "
           f"not)\n- benchmark time {time.perf_counter() - t0:.0f} s\n\n")
    md += "\n".join(body) + "\n"
    print(md)
    write(stem + (f"_{names[0]}" if len(names) == 1 else ""), md, data)


READING = """## Reading

Measured on a shared 2-core machine under a load of 3-8 (other jobs): wall times are inflated and noisy, the
log-joint rows are not. Reference runs: 3x the new finish on pendulum and Bodyfat, 2x on Boston (10x did not fit
the time available on this machine; on the synthetic D = 4 GP of tests/inference/dsvi/test_dsvi_gp.py a 50x run (20000 steps)
was used: the new finish's gaps over 6 seeds were 0.002-0.011 nats, the old stop's 0.006-0.011).

- **The finish does what it says.** Gap of DSVI's returned q to the longer run from the same start (common random
  numbers): pendulum 0.034 (old stop) -> 0.004 (new), Bodyfat 0.070 -> 0.005, Boston 0.068 -> -0.004; the
  finish's own estimate was 0.0095-0.0098 nats each time. Cost: 3.5-4x the old stop's steps on D = 11-16 (the
  averaged steps the 0.01-nat tolerance needs grow like D^2 / (S gap_tol)); on the D = 4 test GP no extra steps.
- **Several optima matter on Boston.** Five MAP restarts find 3 distinct optima on Boston (1 on pendulum and
  Bodyfat with Density). The best bound (-169.53) comes from an optimum that is *not* the best MAP: every engine
  started at the best MAP point (DSVI, its 2x reference, S&K) ends about 0.6 nats lower (-170.12), and the old
  default (one restart) 0.67 nats lower (-170.19): the issue's "about 0.5 nats" is reproduced. The new default
  runs every start to its plateau and finishes only those that can still win. The winning optimum had the
  lowest MAP value of the three but the highest Laplace log evidence (-169.86 against -171.18 and -171.21).
  Cost of the default against the old one (log-joint rows, start included): pendulum 2.9x, Bodyfat 3.4x,
  Boston 5.0x.
- **Engine cost to the same bound.** From the same start, Salimans-Knowles' Hessian-free variant (4 draws per
  step) reaches the bound of DSVI's 0.01-nat finish with N = 250-500 steps = 1,000-2,000 log-joint rows, against
  8,000-15,000 rows for DSVI's finish (4-8x fewer) and 4,600 rows (plus finite-difference Hessians: 23 rows per
  step) for S&K's Algorithm 2 at N = 200. S&K has no stop rule (N is fixed): N = 250 is 0.01-0.04 nats short on
  Bodyfat and Boston, N = 500 within 0.01 nats of the reference on all three. The fastest correct route measured here is
  S&K Hessian-free from every distinct MAP optimum; `gpvi.infer(engine="sk")` offers the single-start version;
  the default stays DSVI (the switch, and multi-start S&K, are for the lead to decide).
"""
"""The reading of the numbers (measured 2026-11-24, see the tables above)."""


if __name__ == "__main__":
    main()
