"""Fully Bayesian binary GP classification: fit time and accuracy of settings of the default engine (issue 41, item 5).

:class:`gpvi.inference.cvi.bayes.FullyBayesianCVI` under each of ``--settings``, alternated within each repeat in one
process, so that every pair of fits sees the same load:

* ``default``: the defaults of ``FullyBayesianCVI(seed=0)``;
* ``h59c``: the defaults before issue 59's fourth pass (EP at 1e-3 in the engine's evaluations, the final bound
  from 100 new draws, no cubature fixed point: ``cubature=False``);
* ``h59e``: the defaults before issue 59's fifth pass (the site bank's intercept from ``torch.linalg.pinv``
  instead of a QR factorisation; EP's sweeps are bit-identical);
* ``h59g``: the defaults before issue 59's seventh pass (S&K from the start: ``importance=False``, without
  :class:`gpvi.inference.cvi.importance.ImportanceGaussian` tried first);
* ``cubature``: the defaults with ``cubature=True`` (the cubature fixed point first, D <= 4:
  :mod:`gpvi.inference.cvi.cubature`);
* ``before``: the defaults before 2026-11-27 (``SKGaussian(num_steps=max(200, 4 D), method="gradient",
  num_draws=4, num_elbo_draws=100)`` with pseudo-random draws, EP tolerance 1e-6), given explicitly;
* ``tol=X``: the defaults with ``ep_tol=X`` (EP's stopping rule on the largest relative site change,
  :class:`gpvi.inference.cvi.ep_evidence.EPEvidenceTarget`);
* ``draws=K``: the defaults with K draws (K / 2 antithetic pairs) per S&K step instead of 4 (issue 59);
* ``bank=K``: the defaults with ``ep_bank=K`` (EP in the engine's evaluations starts from sites predicted by the
  last K evaluations; 0: from the EP MAP point's sites, damped, as before issue 59's bank).
* ``quad=K``: the defaults with :data:`gpvi.inference.cvi.ep_starts.QUADRATIC_MAX_DIM` = K for the fit (the bank
  fits a quadratic in theta up to K log-hyperparameters; 0: the plane everywhere, as before 2026-11-29).

Sets: the stratified seeded training subsamples of ``benchmarks/classification_bayes.py`` (``--n-train``, seed 0),
and ``binary``: the two-input synthetic set of ``benchmarks/classification_scale.py`` (seed 0, ``--n-train`` rows,
1,000 test rows); logit link, ARD RBF, prior N(0, 10 I). Where the long NUTS reference of
``benchmarks/results/classification_nuts_ref.json`` exists for the same set and subsample size (N = 100 of Pima,
Ripley, Ionosphere and Sonar), every fit is compared with it: theta means in reference sds, q sds as ratios of the
reference's, and the mean absolute difference of the test probabilities.

Reported per fit: wall time, its phases (MAP-II, EP MAP, Laplace, S&K, predictive), EP evaluations and sweeps, the
largest change of q(theta)'s mean (in the first setting's q sds) and the largest log-ratio of its sds against the
first setting's fit (same seed; ``--seeds``: the seeds of the fits), and the comparison with NUTS.

Results: ``benchmarks/results/classification_bayes_speed_defaults.md`` (the sets the binary defaults were decided on:
Pima and Ripley, N = 100, with ``tol=1e-6``), ``..._heldout.md`` (Ionosphere and Sonar, N = 100, held out),
``..._n140.md`` (Pima, N = 140) and ``..._n400.md`` (``binary``, N = 400). ``classification_bayes_speed.md`` is
the earlier form of this benchmark (EP tolerances 1e-8 and 1e-6 only, under the defaults of its day).

Run: ``OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.classification_bayes_speed --datasets pima ripley
--n-train 100 --settings before default tol=1e-6 --name classification_bayes_speed_defaults``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from typing import Any

import numpy as np
import torch

from benchmarks._common import RESULTS, header, write
from benchmarks.classification_bayes import subsample
import gpvi
from gpvi.inference.cvi.bayes import FullyBayesianCVI
from gpvi.inference.salimans_knowles import SKGaussian


def reference(name: str, n: int) -> dict[str, Any] | None:
    """The long NUTS reference of ``name`` at ``n`` training rows, if stored."""
    path = RESULTS / "classification_nuts_ref.json"
    if not path.exists():
        return None
    for r in json.loads(path.read_text())["data"]["results"]:
        if r["dataset"] == name and int(r["N"]) == n:
            return r
    return None


def data(name: str, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(X, y, X_test)`` of set ``name`` with ``n`` training rows."""
    f64 = torch.float64
    if name == "binary":
        from benchmarks.classification_scale import make_data
        X, y, Xt, _ = make_data("binary", n, 0)
        return torch.as_tensor(X, dtype=f64), torch.as_tensor(y, dtype=f64), torch.as_tensor(Xt, dtype=f64)
    ds = gpvi.datasets.load(name)
    X, y = subsample(torch.as_tensor(ds.X_train, dtype=f64), torch.as_tensor(ds.y_train, dtype=f64), n, 0)
    return X, y, torch.as_tensor(ds.X_test, dtype=f64)


def fitter(setting: str, dim: int, seed: int = 0) -> FullyBayesianCVI:
    """The :class:`FullyBayesianCVI` of ``setting`` (module docstring) for ``dim`` log-hyperparameters."""
    if setting == "default":
        return FullyBayesianCVI(seed=seed)
    if setting == "h59c":
        return _H59c(seed=seed)
    if setting == "h59e":
        return _BankPinv(seed=seed)
    if setting == "cubature":
        return FullyBayesianCVI(cubature=True, seed=seed)
    if setting == "h59g":
        return FullyBayesianCVI(importance=False, seed=seed)
    if setting == "before":
        sk = SKGaussian(num_steps=max(200, 4 * dim), method="gradient", num_draws=4, num_elbo_draws=100, seed=seed,
                        progress_bar=False)
        return FullyBayesianCVI(sk, ep_tol=1e-6, seed=seed)
    if setting.startswith("tol="):
        return FullyBayesianCVI(ep_tol=float(setting[4:]), seed=seed)
    if setting.startswith("draws="):
        return _Draws(int(setting[6:]), seed=seed)
    if setting.startswith("bank="):
        return FullyBayesianCVI(ep_bank=int(setting[5:]), seed=seed)
    if setting.startswith("quad="):
        return _Quadratic(int(setting[5:]), seed=seed)
    raise ValueError(f"unknown setting {setting!r}")


class _H59c(FullyBayesianCVI):
    """The defaults before issue 59's fourth pass: EP at 1e-3 in the engine's evaluations, the final bound from 100
    new draws of q (``num_elbo_draws=100``) rather than the window's draws, S&K without the cubature fixed point."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(ep_tol=1e-3, cubature=False, **kw)

    def default_engine(self, dim: int) -> SKGaussian:
        e = super().default_engine(dim)
        return SKGaussian(num_steps=e.num_steps, method=e.method, num_draws=e.num_draws, draws=e.draws,
                          num_elbo_draws=100, seed=self.seed, progress_bar=False)


class _Draws(FullyBayesianCVI):
    """The defaults with ``num_draws`` draws (``num_draws // 2`` antithetic pairs) per S&K step instead of 4; the
    retry (twice the steps) keeps them."""

    def __init__(self, num_draws: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.sk_draws = num_draws

    def default_engine(self, dim: int) -> SKGaussian:
        e = super().default_engine(dim)
        return SKGaussian(num_steps=e.num_steps, method=e.method, num_draws=self.sk_draws, draws=e.draws,
                          num_elbo_draws=e.num_elbo_draws, seed=self.seed, progress_bar=False)


class _Quadratic(FullyBayesianCVI):
    """The defaults with the site bank's quadratic up to ``max_dim`` log-hyperparameters (``quad=K``)."""

    def __init__(self, max_dim: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.max_dim = max_dim

    def run(self, model: Any, init: Any = None) -> Any:
        from gpvi.inference.cvi import ep_starts

        keep = ep_starts.QUADRATIC_MAX_DIM
        ep_starts.QUADRATIC_MAX_DIM = self.max_dim
        try:
            return super().run(model, init)
        finally:
            ep_starts.QUADRATIC_MAX_DIM = keep


class _BankPinv(FullyBayesianCVI):
    """The defaults with the site bank's intercept from ``torch.linalg.pinv`` (``h59e``), as before issue 59's fifth
    pass (:func:`gpvi.inference.cvi.ep_starts.intercept_weights` now: QR and one triangular solve)."""

    def run(self, model: Any, init: Any = None) -> Any:
        from gpvi.inference.cvi import ep_starts

        keep = ep_starts.intercept_weights
        ep_starts.intercept_weights = lambda X: torch.linalg.pinv(X)[:, 0, :]
        try:
            return super().run(model, init)
        finally:
            ep_starts.intercept_weights = keep


def run(name: str, n: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    X, y, Xt = data(name, n)
    model = gpvi.GPClassification(X, y)
    ref = reference(name, n)
    rows = []
    for rep, seed in ((r, s) for r in range(args.repeats) for s in args.seeds):
        first = None
        for setting in args.settings:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t0 = time.perf_counter()
                fb = fitter(setting, len(model.names), seed).run(model)
                wall = time.perf_counter() - t0
                p = fb.predict_proba(Xt)
            c = fb.info["ep_counters"]
            row = {"set": name, "N": n, "repeat": rep, "seed": seed, "setting": setting, "time_s": wall,
                   "load_1min": os.getloadavg()[0], "engine": fb.info["engine"],
                   "engine_retry": fb.info.get("engine_retry"), "engine_fallback": fb.info["engine_fallback"],
                   **{k: fb.info[k] for k in ("map_time_s", "ep_map_time_s", "laplace_time_s", "q_time_s",
                                              "predictive_time_s")},
                   "ep_evaluations": c["evaluations"], "ep_sweeps": c["sweeps"], "mean": fb.mean.tolist(),
                   "std": fb.std.tolist(), "p_test": p.tolist(), "elbo": fb.elbo, "elbo_se": fb.elbo_se}
            if first is None:
                first = row
            row["mean_change_sd"] = float(np.abs(np.subtract(row["mean"], first["mean"]) / first["std"]).max())
            row["std_log_ratio"] = float(np.abs(np.log(np.divide(row["std"], first["std"]))).max())
            if ref is not None:
                rm, rs = np.asarray(ref["mean"]), np.asarray(ref["std"])
                row["theta_diff_sd_max"] = float(np.abs((np.asarray(row["mean"]) - rm) / rs).max())
                row["sd_ratio_min"] = float((np.asarray(row["std"]) / rs).min())
                row["sd_ratio_max"] = float((np.asarray(row["std"]) / rs).max())
                row["prob_mad_vs_nuts"] = float(np.abs(np.asarray(row["p_test"]) - np.asarray(ref["prob"])).mean())
            print(f"{name} N={n} {setting} rep {rep} seed {seed}: {wall:.1f} s (load {row['load_1min']:.1f}), "
                  f"{c['sweeps'] / max(c['evaluations'], 1):.1f} sweeps / evaluation", flush=True)
            rows.append(row)
    return rows


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    md = header("Fully Bayesian binary GP classification: settings of the default engine, fit time and accuracy")
    md += ("\nProtocol in the docstring of `benchmarks/classification_bayes_speed.py`: `FullyBayesianCVI` under each "
           "setting, alternated within each repeat (same process, same seed). Changes of q are against the first "
           "fit of the set and seed (mean in its sds; largest |log| of the sd ratio); seed: the fits' seed. NUTS: "
           "the long reference of `classification_nuts_ref.json` where it exists for the same subsample. Engine: "
           "the engine that fitted q (+ retry: the default S&K run was rerun longer after a non-positive-definite "
           "averaged precision).\n\n"
           "| set | N | rep | seed | setting | engine | wall s [load] | MAP-II | EP MAP | Laplace | q | predictive | "
           "EP evaluations | sweeps / evaluation | change of q mean (sd) / log sd | max theta diff (NUTS sd) | "
           "q sd / NUTS sd | mean abs diff of p vs NUTS | bound (se) |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        nuts = ("| | | " if "theta_diff_sd_max" not in r else
                f"| {r['theta_diff_sd_max']:.2f} | {r['sd_ratio_min']:.2f}-{r['sd_ratio_max']:.2f} | "
                f"{r['prob_mad_vs_nuts']:.4f} ")
        eng = r["engine"] + (" + retry" if r.get("engine_retry") else "") + (" (fallback)" if r["engine_fallback"]
                                                                              else "")
        md += (f"| {r['set']} | {r['N']} | {r['repeat']} | {r.get('seed', 0)} | {r['setting']} | {eng} | "
               f"{r['time_s']:.1f} [{r['load_1min']:.1f}] | {r['map_time_s']:.1f} | {r['ep_map_time_s']:.1f} | "
               f"{r['laplace_time_s']:.1f} | {r['q_time_s']:.1f} | {r['predictive_time_s']:.1f} | "
               f"{r['ep_evaluations']} | {r['ep_sweeps'] / max(r['ep_evaluations'], 1):.1f} | "
               f"{r['mean_change_sd']:.3f} / {r['std_log_ratio']:.3f} {nuts}| "
               f"{r.get('elbo', float('nan')):.3f} ({r.get('elbo_se', float('nan')):.3f}) |\n")
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["pima"])
    ap.add_argument("--n-train", nargs="+", type=int, default=[100])
    ap.add_argument("--settings", nargs="+", default=["before", "default"],
                    help="'default', 'before', 'h59c', 'h59e', 'h59g', 'cubature', 'tol=X', 'draws=K', 'bank=K' or 'quad=K' "
                         "(module docstring)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0], help="seeds of the fits (every setting per seed)")
    ap.add_argument("--name", default="classification_bayes_speed_defaults")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for name in args.datasets:
        for n in args.n_train:
            rows += run(name, n, args)
            write(args.name, report(rows, args), {"args": vars(args), "results": rows})
    print(report(rows, args))


if __name__ == "__main__":
    main()
