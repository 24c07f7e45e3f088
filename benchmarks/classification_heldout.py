"""GP classification on generator families the speed rule was not tuned on: gpvi against scikit-learn (issue 59).

Issue 41's type-II rule (:class:`gpvi.inference.cvi.typeii.TypeII` under :class:`gpvi.GPClassifier`) was decided on
gpvi's own sets. This benchmark times it on scikit-learn-style generator families, split **before any timing** into
a tuning half (where a change of the rule may be measured and decided) and a held-out half (reported, never tuned
on): ``SPLIT`` in :mod:`benchmarks.heldout_families`.

Binary (section ``binary``): each family at N = 2,000 and 5,000 stratified training rows, 1,000 separate test rows
from the same generator (stratified split of one draw), two noise levels each (``FAMILIES`` there). Inputs
standardised with the training rows' mean and sd (both libraries see the same arrays). gpvi:
``GPClassifier(random_state=0)`` (logit, type-II MAP with the default prior, full-batch CVI). scikit-learn:
``GaussianProcessClassifier(ConstantKernel(1.0) * RBF(ones(d)), random_state=0)`` (Laplace; ARD RBF times a signal
variance, its default ``n_restarts_optimizer=0``). The two fits alternate in one process (gpvi / scikit-learn /
gpvi / scikit-learn ...) after one untimed warm-up fit of each (:func:`warm_up`), one thread; walls are medians over
``--repeats``; the load average is recorded before each fit. gpvi's counts are load-independent: theta phases,
theta evaluations (L-BFGS-B's objective calls) and inner CVI steps per phase (coarse first phase, then fine phases), outer CVI steps; every inner or outer step is one
O(N^3) factorisation.

Multi-class (section ``multiclass``): K = 3-6 (``--classes`` up to 10), N = 100-1,000; ``make_classification`` and
``make_blobs`` families; gpvi type-II (softmax) against scikit-learn's one-vs-rest GPC (same kernel family).

Rule (section ``rule``): gpvi's load-independent counts under the rule before issue 59 (:func:`issue41_rule`) and
after it, on every family at N = 500 (``--sizes``) and the multi-class families at N = 100-300.

Fully Bayesian (section ``bayes``): ``GPClassifier(hyperparameters="bayes")`` against the type-II wall on binary sets
at N = 100-400 (the higher noise level), and on 4 classes at N = 100: ``moons`` and ``mc_blobs`` (held out) by
default, any families with ``--families`` (e.g. the tuning half: ``xor clf8 mc_clf``). Besides the walls, each row
keeps the fit's load-independent counts (EP evaluations and sweeps, the engine's steps) and stage walls
(:func:`bayes_counts`), q(theta)'s means and sds and the test probabilities.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.classification_heldout [--quick] [--sections binary
multiclass bayes rule] [--sizes 2000] [--families moons ...] [--noise 0 1] [--repeats 2] [--no-sklearn] [--name NAME]``.
``--quick``: a smoke test (< 1 min: small N, one family per half, one repeat). Results:
``benchmarks/results/<name>.{md,json}`` (default ``classification_heldout``); rows of an earlier run with the same
name and other keys are kept (so sections and sizes can run one after another).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
import warnings
from typing import Any, Callable

import numpy as np
import torch

from benchmarks._common import RESULTS, header, write
from benchmarks.heldout_families import (FAMILIES, MULTICLASS_SPLIT, SPLIT, binary_data, half_of,
                                         multiclass_data)

def log_loss(P: np.ndarray, y: np.ndarray) -> float:
    """Mean negative log probability of the true labels (nats)."""
    return float(-np.mean(np.log(np.clip(P[np.arange(len(y)), y], 1e-300, None))))


def load() -> float:
    return round(os.getloadavg()[0], 2)


# ---------------------------------------------------------------------------------------------------- gpvi's counts
@contextlib.contextmanager
def phase_log() -> Any:
    """Record, for each L-BFGS-B phase of a type-II fit, its theta evaluations, inner steps, objective gain and the
    outer CVI steps taken before it.

    Wraps :meth:`TypeII.phase` for the duration (the counters are the state's own; nothing else changes)."""
    from gpvi.inference.cvi.typeii import TypeII

    orig = TypeII.phase
    log: list[dict[str, Any]] = []

    def phase(self: Any, model: Any, state: Any, prior: Any, *, coarse: bool = False, **kw: Any) -> Any:
        c = state.counters
        e0, i0, t0, outer = c.get("theta_evaluations", 0), c.get("inner_steps", 0), time.perf_counter(), state.t
        out = orig(self, model, state, prior, coarse=coarse, **kw)
        log.append({"coarse": coarse, "outer_before": outer, "evaluations": c.get("theta_evaluations", 0) - e0,
                    "inner_steps": c.get("inner_steps", 0) - i0, "gain": float(out[3] - out[4]),
                    "stationary": bool(out[5]), "wall_s": round(time.perf_counter() - t0, 3)})
        return out

    TypeII.phase = phase
    try:
        yield log
    finally:
        TypeII.phase = orig


def counts(post: Any, phases: list[dict[str, Any]]) -> dict[str, Any]:
    info = post.info
    c = info.get("counters", {})
    return {"phases": c.get("theta_phases", 0), "evaluations": c.get("theta_evaluations", 0),
            "inner_steps": c.get("inner_steps", 0), "backtracks": c.get("inner_backtracks", 0),
            "outer_steps": info.get("steps"), "restarts": 0, "per_phase": phases,
            "theta_dim": int(post.theta.numel())}


def fit_gpvi(X: np.ndarray, y: np.ndarray, **kw: Any) -> tuple[Any, float, float, dict[str, Any]]:
    from gpvi import GPClassifier

    ld = load()
    with warnings.catch_warnings(), phase_log() as phases:
        warnings.simplefilter("ignore")
        t = time.perf_counter()
        clf = GPClassifier(random_state=0, **kw).fit(X, y)
        wall = time.perf_counter() - t
    return clf, wall, ld, (counts(clf.posterior_, phases) if kw.get("hyperparameters") != "bayes" else
                           {"info_keys": sorted(clf.posterior_.info)})


@contextlib.contextmanager
def sklearn_counts() -> Any:
    """Count scikit-learn's Laplace work during a fit: evaluations of the log marginal likelihood (with gradient:
    each adds about 3.7 N^3 flops of solves) and Cholesky factorisations of B (one per Newton step, N^3/3 each;
    plus one per evaluation). Wraps ``sklearn.gaussian_process._gpc``'s ``cholesky`` and the binary Laplace
    model's ``log_marginal_likelihood`` for the duration; nothing else changes."""
    from sklearn.gaussian_process import _gpc

    c = {"evaluations": 0, "choleskys": 0}
    chol, lml = _gpc.cholesky, _gpc._BinaryGaussianProcessClassifierLaplace.log_marginal_likelihood

    def cholesky(*a: Any, **k: Any) -> Any:
        c["choleskys"] += 1
        return chol(*a, **k)

    def log_marginal_likelihood(self: Any, *a: Any, **k: Any) -> Any:
        c["evaluations"] += 1
        return lml(self, *a, **k)

    _gpc.cholesky = cholesky
    _gpc._BinaryGaussianProcessClassifierLaplace.log_marginal_likelihood = log_marginal_likelihood
    try:
        yield c
    finally:
        _gpc.cholesky = chol
        _gpc._BinaryGaussianProcessClassifierLaplace.log_marginal_likelihood = lml


def fit_sklearn(X: np.ndarray, y: np.ndarray) -> tuple[Any, float, float, dict[str, int]]:
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    ld = load()
    with warnings.catch_warnings(), sklearn_counts() as c:
        warnings.simplefilter("ignore")
        t = time.perf_counter()
        clf = GaussianProcessClassifier(ConstantKernel(1.0) * RBF(np.ones(X.shape[1])), random_state=0).fit(X, y)
        wall = time.perf_counter() - t
    return clf, wall, ld, dict(c)


def compare(data: tuple[np.ndarray, ...], repeats: int, sklearn: bool, **kw: Any) -> dict[str, Any]:
    """gpvi and scikit-learn fits alternated ``repeats`` times; medians, log loss, accuracy, counts."""
    Xtr, ytr, Xte, yte = data
    g_walls, s_walls, loads = [], [], []
    clf = sk = None
    cnt: dict[str, Any] = {}
    for _ in range(repeats):
        clf, w, ld, cnt = fit_gpvi(Xtr, ytr, **kw)
        g_walls.append(round(w, 3))
        loads.append(ld)
        if sklearn:
            sk, w, ld, sk_cnt = fit_sklearn(Xtr, ytr)
            s_walls.append(round(w, 3))
            loads.append(ld)
    P = clf.predict_proba(Xte)
    row = {"gpvi_s": statistics.median(g_walls), "gpvi_walls": g_walls, "gpvi_log_loss": log_loss(P, yte),
           "gpvi_acc": float(np.mean(P.argmax(1) == yte)), "counts": cnt, "loads": loads}
    if sk is not None:
        Ps = sk.predict_proba(Xte)
        row.update({"sklearn_s": statistics.median(s_walls), "sklearn_walls": s_walls, "sklearn_counts": sk_cnt,
                    "sklearn_log_loss": log_loss(Ps, yte), "sklearn_acc": float(np.mean(Ps.argmax(1) == yte))})
        row["ratio"] = row["gpvi_s"] / row["sklearn_s"]
        row["dlogloss"] = row["gpvi_log_loss"] - row["sklearn_log_loss"]
    return row


# ---------------------------------------------------------------------------------------------------- sections
def run_binary(families: list[str], sizes: list[int], levels: list[int], repeats: int, sklearn: bool,
               out: dict[str, Any], save: Callable[[], None]) -> None:
    for n in sizes:
        for fam in families:
            for level in levels:
                key = f"binary/{fam}/{n}/{level}"
                row = compare(binary_data(fam, n, level), repeats, sklearn)
                row.update({"section": "binary", "family": fam, "half": half_of(fam), "N": n, "level": level,
                            "noise": FAMILIES[fam][1][level]})
                out[key] = row
                print(key, _brief(row), flush=True)
                save()


def run_multiclass(families: list[str], sizes: list[int], classes: list[int], levels: list[int], repeats: int,
                   sklearn: bool, out: dict[str, Any], save: Callable[[], None]) -> None:
    for fam in families:
        for k in classes:
            for n in sizes:
                for level in levels:
                    key = f"multiclass/{fam}/{n}/{k}/{level}"
                    row = compare(multiclass_data(fam, n, k, level), repeats, sklearn)
                    row.update({"section": "multiclass", "family": fam, "half": half_of(fam), "N": n, "K": k,
                                "level": level})
                    out[key] = row
                    print(key, _brief(row), flush=True)
                    save()


def bayes_counts(post: Any) -> dict[str, Any]:
    """Load-independent counts and stage walls of a ``hyperparameters="bayes"`` fit (from its ``info``): EP's
    evaluations and sweeps, the engine's steps, the predictive stage's CVI steps, and the seconds per stage."""
    info = post.info
    ep = info.get("ep_counters", {}) or {}
    out = {"ep_evaluations": ep.get("evaluations"), "ep_sweeps": ep.get("sweeps"), "q_steps": info.get("q_steps"),
           "engine_retry": info.get("engine_retry") is not None,
           "predictive_inner_steps": info.get("predictive_inner_steps")}
    for k in ("map_time_s", "ep_map_time_s", "laplace_time_s", "q_time_s", "predictive_time_s", "time_s"):
        if k in info:
            out[k] = round(float(info[k]), 3)
    return out


def run_bayes(sizes: list[int], repeats: int, out: dict[str, Any], save: Callable[[], None],
              four_classes: bool = True, families: list[str] | None = None) -> None:
    """``hyperparameters="bayes"`` against type-II, alternated: binary ``families`` (default moons, held out) at
    ``sizes`` (the higher noise level), and (with ``four_classes``) 4 classes at N = 100 (``mc_blobs`` held out by
    default; a multi-class family in ``families`` replaces it)."""
    fams = families or ["moons", "mc_blobs"]
    binary = [f for f in fams if f in FAMILIES]
    multi = [f for f in fams if f not in FAMILIES] or (["mc_blobs"] if families is None else [])
    cases = [(f, n, 2) for f in binary for n in sizes] + ([(f, 100, 4) for f in multi] if four_classes else [])
    for fam, n, k in cases:
        data = binary_data(fam, n, 1) if k == 2 else multiclass_data(fam, n, k, 0)
        Xtr, ytr, Xte, yte = data
        b_walls, t_walls, loads, b_counts = [], [], [], []
        for _ in range(repeats):
            b, w, ld, _ = fit_gpvi(Xtr, ytr, hyperparameters="bayes")
            b_walls.append(round(w, 3))
            b_counts.append(bayes_counts(b.posterior_))
            loads.append(ld)
            t, w, ld, cnt = fit_gpvi(Xtr, ytr)
            t_walls.append(round(w, 3))
            loads.append(ld)
        Pb, Pt = b.predict_proba(Xte), t.predict_proba(Xte)
        row = {"section": "bayes", "family": fam, "half": half_of(fam), "N": n, "K": k,
               "bayes_s": statistics.median(b_walls), "bayes_walls": b_walls,
               "type2_s": statistics.median(t_walls), "type2_walls": t_walls, "loads": loads,
               "bayes_log_loss": log_loss(Pb, yte), "type2_log_loss": log_loss(Pt, yte), "type2_counts": cnt,
               "bayes_counts": b_counts, "theta_mean": b.posterior_.mean.tolist(),
               "theta_sd": b.posterior_.std.tolist(), "test_proba": np.asarray(Pb).tolist()}
        row["ratio"] = row["bayes_s"] / row["type2_s"]
        key = f"bayes/{fam}/{n}/{k}"
        out[key] = row
        print(key, {k2: v for k2, v in row.items() if k2.endswith("_s") or k2 == "ratio"}, b_counts[-1],
              flush=True)
        save()


@contextlib.contextmanager
def issue41_rule() -> Any:
    """The type-II rule before issue 59: the coarse first CVI run to 1e-6 and the inner runs at the engine's step
    (``inner_beta=None``). Patches :data:`COARSE` and :class:`TypeII`'s default for the duration."""
    from gpvi.inference.cvi import typeii

    init, tol = typeii.TypeII.__init__, typeii.COARSE["cvi_tol"]

    def old_init(self: Any, *a: Any, **k: Any) -> None:
        k.setdefault("inner_beta", None)
        init(self, *a, **k)

    typeii.TypeII.__init__, typeii.COARSE["cvi_tol"] = old_init, 1e-6
    try:
        yield
    finally:
        typeii.TypeII.__init__, typeii.COARSE["cvi_tol"] = init, tol


def run_rule(n: int, out: dict[str, Any], save: Callable[[], None]) -> None:
    """Load-independent counts of the rule before (issue 41) and after issue 59, gpvi only: every binary family at
    ``n`` rows and both noise levels, and both multi-class families at N = 100 (K = 3, 4, 6) and 300 (K = 3)."""
    cases = [(f, n, 2, lv) for f in sorted(FAMILIES) for lv in (0, 1)]
    cases += [(f, m, k, 0) for f in ("mc_clf", "mc_blobs") for m, k in ((100, 3), (100, 4), (100, 6), (300, 3))]
    for fam, m, k, lv in cases:
        data = binary_data(fam, m, lv) if k == 2 else multiclass_data(fam, m, k, lv)
        row: dict[str, Any] = {"section": "rule", "family": fam, "half": half_of(fam), "N": m, "K": k, "level": lv}
        for name in ("issue41", "issue59"):
            with issue41_rule() if name == "issue41" else contextlib.nullcontext():
                clf, _, _, c = fit_gpvi(data[0], data[1])
            row[name] = {**{x: c[x] for x in ("outer_steps", "inner_steps", "evaluations", "backtracks")},
                         "objective": clf.posterior_.info["objective"],
                         "log_loss": log_loss(clf.predict_proba(data[2]), data[3])}
        out[f"rule/{fam}/{m}/{k}/{lv}"] = row
        print(fam, m, k, lv, row["issue41"], row["issue59"], flush=True)
        save()


def _brief(row: dict[str, Any]) -> str:
    c = row["counts"]
    return (f"gpvi {row['gpvi_s']:.1f}s sk {row.get('sklearn_s', float('nan')):.1f}s "
            f"ratio {row.get('ratio', float('nan')):.2f} dll {row.get('dlogloss', float('nan')):+.4f} "
            f"ev {c.get('evaluations')} inner {c.get('inner_steps')} ph {c.get('phases')} "
            f"outer {c.get('outer_steps')} load {row['loads']}")


# ---------------------------------------------------------------------------------------------------- report
def _phase_text(c: dict[str, Any]) -> str:
    return " + ".join(f"{p['evaluations']}/{p['inner_steps']}" for p in c.get("per_phase", []))


def _sk_text(r: dict[str, Any]) -> str:
    c = r.get("sklearn_counts")
    return "-" if not c else f"{c['evaluations']} / {c['choleskys']}"


def _model_ratio(r: dict[str, Any]) -> str:
    """gpvi's over scikit-learn's modelled flops (see the note under the binary table)."""
    c, s = r["counts"], r.get("sklearn_counts")
    if not s:
        return "-"
    g = 2 / 3 * (c["outer_steps"] + c["inner_steps"]) + 4 / 3 * c["evaluations"]
    k = s["choleskys"] / 3 + 14 / 3 * s["evaluations"]
    return f"{g / k:.2f}"


def report(rows: dict[str, Any]) -> str:
    lines = [header("GP classification on held-out generator families: gpvi type-II against scikit-learn (issue 59)"),
             "", f"Split fixed before timing (`SPLIT`): tuning {', '.join(SPLIT['tuning'])}; held out "
             f"{', '.join(SPLIT['heldout'])}. Multi-class: tuning {MULTICLASS_SPLIT['tuning'][0]}, held out "
             f"{MULTICLASS_SPLIT['heldout'][0]}. Walls: medians of the alternated fits (s); load: the 1-min load "
             "average before each fit (min-max). Counts: theta evaluations / inner CVI steps per phase (coarse "
             "first), outer CVI steps. Log loss in nats on 1,000 test rows.", ""]
    bins = [r for r in rows.values() if r["section"] == "binary"]
    if bins:
        lines += ["## Binary: type-II against scikit-learn's GPC", "",
                  "| half | family | noise | N | d | gpvi (s) | sklearn (s) | ratio | log loss gpvi / sklearn | "
                  "acc gpvi / sklearn | evaluations | inner steps | phases (ev/inner) | outer | sklearn ev / chol | "
                  "modelled ratio | load |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(bins, key=lambda r: (r["half"] != "heldout", r["N"], r["family"], r["level"])):
            c = r["counts"]
            lines.append(
                f"| {r['half']} | {r['family']} | {r['noise']:g} | {r['N']} | {c['theta_dim'] - 1} | "
                f"{r['gpvi_s']:.1f} | {r.get('sklearn_s', float('nan')):.1f} | **{r.get('ratio', float('nan')):.2f}** "
                f"| {r['gpvi_log_loss']:.4f} / {r.get('sklearn_log_loss', float('nan')):.4f} | "
                f"{r['gpvi_acc']:.3f} / {r.get('sklearn_acc', float('nan')):.3f} | {c['evaluations']} | "
                f"{c['inner_steps']} | {_phase_text(c)} | {c['outer_steps']} | {_sk_text(r)} | {_model_ratio(r)} | "
                f"{min(r['loads']):.1f}-{max(r['loads']):.1f} |")
        lines += ["", "Modelled ratio: load-independent flops in units of N^3, gpvi (2/3 per outer or inner step: "
                  "Cholesky and triangular inverse; 4/3 per evaluation's gradient: lauum and syrk) over scikit-learn "
                  "(1/3 per Cholesky of B; 14/3 per evaluation: `cho_solve` with N right-hand sides and `solve` "
                  "through an LU factorisation); rough constants, for reading the walls, not a target.", ""]
    mcs = [r for r in rows.values() if r["section"] == "multiclass"]
    if mcs:
        lines += ["## Multi-class: type-II (softmax) against scikit-learn's one-vs-rest GPC", "",
                  "| half | family | K | N | gpvi (s) | sklearn OvR (s) | ratio | log loss gpvi / sklearn | "
                  "acc gpvi / sklearn | evaluations | inner steps | phases (ev/inner) | outer | load |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(mcs, key=lambda r: (r["half"] != "heldout", r["family"], r["K"], r["N"], r["level"])):
            c = r["counts"]
            lines.append(
                f"| {r['half']} | {r['family']}{'' if r['level'] == 0 else ' (noisy)'} | {r['K']} | {r['N']} | "
                f"{r['gpvi_s']:.1f} | {r.get('sklearn_s', float('nan')):.1f} | "
                f"**{r.get('ratio', float('nan')):.2f}** | {r['gpvi_log_loss']:.4f} / "
                f"{r.get('sklearn_log_loss', float('nan')):.4f} | {r['gpvi_acc']:.3f} / "
                f"{r.get('sklearn_acc', float('nan')):.3f} | {c['evaluations']} | {c['inner_steps']} | "
                f"{_phase_text(c)} | {c['outer_steps']} | {min(r['loads']):.1f}-{max(r['loads']):.1f} |")
        lines.append("")
    rule = [r for r in rows.values() if r["section"] == "rule"]
    if rule:
        lines += ["## The rule's counts before (issue 41) and after (issue 59), gpvi only", "",
                  "Work = outer + inner CVI steps + theta evaluations (each about one O(N^3) factorisation; the "
                  "evaluation's gradient about as much). Objective: MAP-II objective after minus before.", "",
                  "| half | family | N | K | noise | before: outer + inner / evaluations | after | work after / "
                  "before | objective after - before |", "|---|---|---|---|---|---|---|---|---|"]
        tot: dict[tuple[str, bool], list[float]] = {}
        for r in sorted(rule, key=lambda r: (r["half"] != "tuning", r["K"] > 2, r["family"], r["N"], r["K"],
                                             r["level"])):
            a, b = r["issue41"], r["issue59"]
            wa, wb = (x["outer_steps"] + x["inner_steps"] + x["evaluations"] for x in (a, b))
            t = tot.setdefault((r["half"], r["K"] > 2), [0.0, 0.0])
            t[0], t[1] = t[0] + wa, t[1] + wb
            lines.append(f"| {r['half']} | {r['family']} | {r['N']} | {r['K']} | {r['level']} | "
                         f"{a['outer_steps']} + {a['inner_steps']} / {a['evaluations']} | {b['outer_steps']} + "
                         f"{b['inner_steps']} / {b['evaluations']} | {wb / wa:.2f} | "
                         f"{b['objective'] - a['objective']:+.1e} |")
        lines += ["", "Totals (work after / before): " + "; ".join(
            f"{h} {'multi-class' if mc else 'binary'} {v[1]:.0f} / {v[0]:.0f} = {v[1] / v[0]:.2f}"
            for (h, mc), v in sorted(tot.items())), ""]
    bay = [r for r in rows.values() if r["section"] == "bayes"]
    if bay:
        lines += ["## Fully Bayesian: hyperparameters=\"bayes\" against type-II", "",
                  "| half | family | K | N | bayes (s) | type-II (s) | ratio | log loss bayes / type-II | EP evaluations "
                  "/ sweeps | engine steps | stages: MAP-II / EP MAP / Laplace / q / predictive (s) | load |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(bay, key=lambda r: (r["half"], r["K"], r["family"], r["N"])):
            c = (r.get("bayes_counts") or [{}])[-1]
            stages = " / ".join(f"{c[k]:.1f}" if k in c else "-" for k in
                                ("map_time_s", "ep_map_time_s", "laplace_time_s", "q_time_s", "predictive_time_s"))
            lines.append(f"| {r['half']} | {r['family']} | {r['K']} | {r['N']} | {r['bayes_s']:.1f} | "
                         f"{r['type2_s']:.2f} | **{r['ratio']:.1f}** | {r['bayes_log_loss']:.4f} / "
                         f"{r['type2_log_loss']:.4f} | {c.get('ep_evaluations', '-')} / {c.get('ep_sweeps', '-')} | "
                         f"{c.get('q_steps', '-')} | {stages} | {min(r['loads']):.1f}-{max(r['loads']):.1f} |")
        lines.append("")
    return "\n".join(lines)


def warm_up() -> None:
    """One untimed fit of each library on a small binary and a small 3-class set: the first fit in a process pays
    one-time costs (imports on first use, first calls into LAPACK and the quadrature rules) that are not the rule's."""
    for data in (binary_data("moons", 60, 0), multiclass_data("mc_blobs", 60, 3, 0)):
        fit_gpvi(data[0], data[1])
        fit_sklearn(data[0], data[1])


def versions() -> dict[str, str]:
    import gpytorch
    import scipy
    import sklearn

    import gpvi

    return {"gpvi": gpvi.__version__, "torch": torch.__version__, "gpytorch": gpytorch.__version__,
            "scikit-learn": sklearn.__version__, "scipy": scipy.__version__, "numpy": np.__version__}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke test: small N, one family per half, one repeat")
    p.add_argument("--sections", nargs="+", default=None, choices=["binary", "multiclass", "bayes", "rule"],
                   help="default: binary (--quick: all three)")
    p.add_argument("--families", nargs="+", default=None, help="binary families (default: all) or multi-class ones")
    p.add_argument("--sizes", nargs="+", type=int, default=None)
    p.add_argument("--classes", nargs="+", type=int, default=[3, 4, 6])
    p.add_argument("--noise", nargs="+", type=int, default=[0, 1], help="noise levels (0 low, 1 high)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--no-sklearn", action="store_true")
    p.add_argument("--name", default="classification_heldout")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.quick:
        a.name = a.name if a.name != "classification_heldout" else "classification_heldout_quick"
    path = RESULTS / f"{a.name}.json"
    rows: dict[str, Any] = json.loads(path.read_text())["data"]["rows"] if path.exists() else {}
    meta = {"versions": versions(), "threads": torch.get_num_threads(), "split": SPLIT,
            "multiclass_split": MULTICLASS_SPLIT}

    def save() -> None:
        write(a.name, report(rows) + "\n- versions: " + json.dumps(meta["versions"]) + "\n",
              {"meta": meta, "rows": rows})

    warm_up()
    for section in a.sections or (["binary", "multiclass", "bayes"] if a.quick else ["binary"]):
        if section == "binary":
            fams = a.families or ([SPLIT["tuning"][1], SPLIT["heldout"][2]] if a.quick else sorted(FAMILIES))
            run_binary(fams, a.sizes or ([300] if a.quick else [2000]), [0] if a.quick else a.noise,
                       a.repeats, not a.no_sklearn, rows, save)
        elif section == "multiclass":
            fams = a.families or ["mc_clf", "mc_blobs"]
            run_multiclass(fams, a.sizes or ([100] if a.quick else [100, 300, 1000]),
                           [3] if a.quick else a.classes, [0] if a.quick else a.noise, a.repeats,
                           not a.no_sklearn, rows, save)
        elif section == "rule":
            run_rule((a.sizes or [500])[0], rows, save)
        else:
            run_bayes(a.sizes or ([50] if a.quick else [100, 200, 400]), a.repeats, rows, save,
                      four_classes=not a.quick, families=a.families)


if __name__ == "__main__":
    main()
