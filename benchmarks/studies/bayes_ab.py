"""The fully Bayesian classifier before and after issue 59's third pass, against type-II, alternated in one process
(issue 59, item 3): the held-out rows, reported as measured.

The third pass changed three constants, so "before" is the same code with them set back for the fit:
:data:`gpvi.inference.cvi.ep_starts.QUADRATIC_MAX_DIM` = 0 (the site bank's plane), :data:`gpvi.inference.cvi.
ep_evidence.EP_QUADRATURE_POINTS` = 64 and :data:`gpvi.inference.cvi.bayes.BINARY_PREDICTIVE_INNER_TOL` = 1e-6
(its other change, in binary EP's sweep, gives bit-identical results). ``--before h59d``: the fourth pass's
instead, :data:`gpvi.inference.cvi.bayes.BINARY_EP_TOL` = 1e-3, :data:`gpvi.inference.cvi.bayes.BOUND_DRAWS` =
100 (the final bound from 100 new draws of q) and :data:`gpvi.inference.cvi.bayes.CUBATURE` = False (S&K from the
start); ``--before h59e``: the fifth pass's site-bank intercept by the pseudo-inverse (:data:`BEFORE_H59E`). Per
case (``--cases``: a binary family of
``benchmarks/heldout_families.py`` at N training rows, the higher noise level, as ``classification_heldout.py
--sections bayes``) and repeat: ``GPClassifier()`` (type-II), ``GPClassifier(hyperparameters="bayes")`` before
and after, in that order, one thread, ``random_state=0``. Reported: median walls, the ratios to type-II's median,
the load before each fit, EP sweeps and the predictive's inner steps, test log loss, and the change of q(theta)
(in its sds) and of the test probabilities between before and after.

Run: ``OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python -m benchmarks.studies.bayes_ab --repeats 3``. Results:
``benchmarks/studies/results/bayes_ab_<label>.{md,json}``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
import warnings
from typing import Any

import numpy as np
import torch

from benchmarks.heldout_families import binary_data, half_of
from benchmarks.studies._common import header, write

BEFORE = {"QUADRATIC_MAX_DIM": 0, "EP_QUADRATURE_POINTS": 64, "BINARY_PREDICTIVE_INNER_TOL": 1e-6}
BEFORE_H59D = {"BINARY_EP_TOL": 1e-3, "BOUND_DRAWS": 100, "CUBATURE": False}
"""``--before h59d``: the fourth pass's constants set back (:data:`gpvi.inference.cvi.bayes.BINARY_EP_TOL`, binary
EP's tolerance in the engine's evaluations, :data:`~gpvi.inference.cvi.bayes.BOUND_DRAWS`, the final bound's new
draws, and :data:`~gpvi.inference.cvi.bayes.CUBATURE`, the cubature fixed point tried first), against the
defaults."""


def _pinv_intercept(X: torch.Tensor) -> torch.Tensor:
    """The site bank's intercept weights before issue 59's fifth pass: the first row of ``torch.linalg.pinv(X)``."""
    return torch.linalg.pinv(X)[:, 0, :]


BEFORE_H59E = {"intercept_weights": _pinv_intercept}
"""``--before h59e``: the site bank's quadratic takes its intercept from the pseudo-inverse (an SVD) again instead of
a QR factorisation (:func:`gpvi.inference.cvi.ep_starts.intercept_weights`); the fifth pass's other changes, inside
binary EP's sweep, give bit-identical results and cannot be set back here (``benchmarks/studies/ep_sweep_lean.py``
replays them)."""
BEFORE_H59G = {"IMPORTANCE": False}
"""``--before h59g``: q(theta) by S&K from the start, without :class:`gpvi.inference.cvi.importance.ImportanceGaussian`
tried first (:data:`gpvi.inference.cvi.bayes.IMPORTANCE`)."""
WHICH = {"third": BEFORE, "h59d": BEFORE_H59D, "h59e": BEFORE_H59E, "h59g": BEFORE_H59G}
PASS = {"third": "third pass", "h59d": "fourth pass (h59d)", "h59e": "fifth pass (h59e: the bank's intercept by QR)",
        "h59g": "seventh pass (h59g: q by importance sampling first)"}
BEFORE_KEY = "third"


@contextlib.contextmanager
def before() -> Any:
    """The constants of ``WHICH[BEFORE_KEY]`` set back (module docstring)."""
    import gpvi.inference.cvi.bayes as B
    import gpvi.inference.cvi.ep_evidence as E
    import gpvi.inference.cvi.ep_starts as S

    values = WHICH[BEFORE_KEY]
    home = {"QUADRATIC_MAX_DIM": S, "EP_QUADRATURE_POINTS": E, "intercept_weights": S}
    mods = {k: home.get(k, B) for k in values}
    keep = {k: getattr(m, k) for k, m in mods.items()}
    for k, m in mods.items():
        setattr(m, k, values[k])
    try:
        yield
    finally:
        for k, m in mods.items():
            setattr(m, k, keep[k])


def fit(Xtr: np.ndarray, ytr: np.ndarray, Xte: np.ndarray, yte: np.ndarray, kind: str) -> dict[str, Any]:
    from gpvi import GPClassifier

    kw = {} if kind == "type2" else {"hyperparameters": "bayes"}
    load = os.getloadavg()[0]
    with before() if kind == "before" else contextlib.nullcontext():
        t0 = time.perf_counter()
        clf = GPClassifier(random_state=0, **kw).fit(Xtr, ytr)
        wall = time.perf_counter() - t0
    p = np.clip(np.asarray(clf.predict_proba(Xte))[:, 1], 1e-15, 1 - 1e-15)
    out = {"kind": kind, "wall_s": wall, "load": load, "p": p,
           "log_loss": float(-np.mean(np.where(yte == 1, np.log(p), np.log1p(-p))))}
    if kind != "type2":
        info = clf.posterior_.info
        out.update(engine=info["engine"], ep_sweeps=info["ep_counters"]["sweeps"],
                   ep_evaluations=info["ep_counters"]["evaluations"],
                   predictive_inner_steps=info["predictive_inner_steps"], mean=clf.posterior_.mean.numpy(),
                   std=clf.posterior_.std.numpy())
    return out


def run_case(case: str, repeats: int) -> dict[str, Any]:
    fam, n = case.split("/")
    Xtr, ytr, Xte, yte = binary_data(fam, int(n), 1)
    fits: dict[str, list[dict[str, Any]]] = {"type2": [], "before": [], "after": []}
    for _ in range(repeats):
        for kind in ("type2", "before", "after"):
            fits[kind].append(fit(Xtr, ytr, Xte, yte, kind))
    med = {k: statistics.median(f["wall_s"] for f in v) for k, v in fits.items()}
    b, a = fits["before"][-1], fits["after"][-1]
    return {"case": case, "half": half_of(fam), "walls": {k: [round(f["wall_s"], 3) for f in v]
                                                          for k, v in fits.items()},
            "median_s": med, "ratio_before": med["before"] / med["type2"], "ratio_after": med["after"] / med["type2"],
            "loads": [round(f["load"], 2) for v in fits.values() for f in v],
            "log_loss": {k: v[-1]["log_loss"] for k, v in fits.items()},
            "ep_sweeps": {k: v[-1]["ep_sweeps"] for k, v in fits.items() if k != "type2"},
            "ep_evaluations": {k: v[-1]["ep_evaluations"] for k, v in fits.items() if k != "type2"},
            "engine": {k: v[-1]["engine"] for k, v in fits.items() if k != "type2"},
            "predictive_inner_steps": {k: v[-1]["predictive_inner_steps"] for k, v in fits.items() if k != "type2"},
            "q_mean_change_sd": float(np.abs((a["mean"] - b["mean"]) / b["std"]).max()),
            "q_log_sd_change": float(np.abs(np.log(a["std"] / b["std"])).max()),
            "p_change_max": float(np.abs(a["p"] - b["p"]).max())}


def report(rows: list[dict[str, Any]], label: str) -> str:
    what = PASS[BEFORE_KEY]
    lines = [header(f"The fully Bayesian classifier before / after issue 59's {what}, against type-II ({label})"),
             "", "Protocol in the docstring of `benchmarks/studies/bayes_ab.py`: type-II, bayes before, bayes after, "
             "alternated in one process, one thread; medians of the repeats; load: the 1-min load average before "
             "each fit (min-max).", "",
             "| half | case | type-II s | bayes before s (ratio) | bayes after s (ratio) | EP sweeps before / after | "
             "predictive inner steps before / after | log loss type-II / before / after | q change (sd) / log sd; "
             "test p change | load |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, ll = r["median_s"], r["log_loss"]
        eng = r.get("engine", {}).get("after", "")
        lines.append(f"| {r['half']} | {r['case']}{' (' + eng + ')' if eng else ''} | {m['type2']:.2f} | "
                     f"{m['before']:.2f} ({r['ratio_before']:.1f}) | "
                     f"**{m['after']:.2f} ({r['ratio_after']:.1f})** | {r['ep_sweeps']['before']} / "
                     f"{r['ep_sweeps']['after']} | {r['predictive_inner_steps']['before']} / "
                     f"{r['predictive_inner_steps']['after']} | {ll['type2']:.4f} / {ll['before']:.4f} / "
                     f"{ll['after']:.4f} | {r['q_mean_change_sd']:.4f} / {r['q_log_sd_change']:.4f}; "
                     f"{r['p_change_max']:.1e} | {min(r['loads']):.1f}-{max(r['loads']):.1f} |")
    lines += ["", "Walls of every fit (s): " + "; ".join(f"{r['case']}: " + ", ".join(
        f"{k} {v}" for k, v in r["walls"].items()) for r in rows)]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["moons/100", "moons/200", "moons/400"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--label", default="h59c")
    ap.add_argument("--before", choices=sorted(WHICH), default="third",
                    help="what 'before' sets back: the third pass's constants, the fourth's (h59d) or the fifth's "
                         "bank intercept (h59e)")
    a = ap.parse_args()
    global BEFORE_KEY
    BEFORE_KEY = a.before
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Xw, yw, Xt, yt = binary_data("xor", 40, 0)
        fit(Xw, yw, Xt, yt, "after")                                      # warm-up, untimed
        for case in a.cases:
            rows.append(run_case(case, a.repeats))
            print({k: v for k, v in rows[-1].items() if k not in ("walls",)}, flush=True)
            write(f"bayes_ab_{a.label}", report(rows, a.label), {"rows": rows})


if __name__ == "__main__":
    main()
