"""Where a binary type-II fit spends its inner steps and its wall, evaluation by evaluation (issue 59).

Fits ``GPClassifier(random_state=0)`` (type-II, :class:`gpvi.inference.cvi.typeii.TypeII`) on families of
:mod:`benchmarks.heldout_families` and records, with the library unchanged (wrappers around
:func:`gpvi.inference.cvi.inner.profiled_objective` as :mod:`~gpvi.inference.cvi.typeii` calls it, around
:meth:`gpvi.CVI.run` and :meth:`gpvi.CVI.posterior`):

* every theta evaluation: its phase (coarse or fine), theta, the objective and its gradient's norm, the inner steps
  and the wall of the evaluation;
* every engine CVI run (the first one, the runs between phases): steps and wall;
* the final posterior's wall, and the fit's total.

``--set KEY=VALUE ...`` overrides an entry of :data:`gpvi.inference.cvi.typeii.COARSE` or a keyword of ``TypeII``
for the duration (a candidate rule, measured here before anything changes in gpvi). Decide only on the tuning
half (``SPLIT`` there). Prototype rules that are no keyword (:data:`PROTOTYPES`): ``coarse_floor_stop=true`` ends
the coarse phase, at its best point, at the first trial point whose adaptive inner tolerance
(:func:`gpvi.inference.cvi.inner.trial_tol`) is at its floor ``COARSE["inner_tol"]`` (there the coarse evaluation
costs about what a fine one does, and the fine phase evaluates that neighbourhood again at ``inner_tol``).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.typeii_trace --families xor clf8 --sizes 2000
[--noise 0] [--set inner_tol=1e-4] [--name NAME]``. Results: ``benchmarks/studies/results/<name>.{md,json}``
(default ``typeii_trace``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
import warnings
from pathlib import Path
from typing import Any

from benchmarks._common import header, write
from benchmarks.classification_heldout import load, log_loss
from benchmarks.heldout_families import FAMILIES, binary_data, half_of

OUT = Path(__file__).resolve().parent / "results"


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` items as a dict (``true``, ``false``, ``none``, numbers)."""
    out: dict[str, Any] = {}
    words = {"true": True, "false": False, "none": None}
    for it in items:
        k, v = it.split("=", 1)
        out[k] = words[v.lower()] if v.lower() in words else (float(v) if any(c in v for c in ".e") else int(v))
    return out


NOTE = ("Each row one fit of ``GPClassifier(random_state=0)`` with the settings of column `set` (``COARSE`` entries, "
        "so ``inner_tol`` is the coarse phase's, or ``TypeII`` keywords; the rest the defaults of the commit that ran it; ``coarse_adaptive=None`` is the "
        "rule before issue 59's adaptive coarse tolerance). Runs: the engine's CVI runs (the first one, those "
        "between phases): steps (wall s). Phases: c(oarse) / f(ine), theta evaluations / inner CVI steps (wall s "
        "of the evaluations). Posterior: walls of the engine's posterior() calls. Walls at the load quoted (1-min "
        "average before the fit), for reading only; the counts do not depend on it. The json holds every "
        "evaluation (theta, value, gradient norm, inner tolerance, inner steps, wall).")


PROTOTYPES = ("coarse_floor_stop",)
"""``--set`` keys that patch the library for the duration instead of naming a ``TypeII`` keyword (module docstring)."""


def _floor_stop(typeii: Any) -> Any:
    """``trial_tol`` that ends the coarse phase (``typeii._Resolved``) where the tolerance is at its floor."""
    orig = typeii.trial_tol

    def trial_tol(pairs: Any, theta: Any, tol: float, ratio: float, cap: float) -> float:
        out = orig(pairs, theta, tol, ratio, cap)
        if pairs and out <= tol:
            raise typeii._Resolved
        return out
    return trial_tol


@contextlib.contextmanager
def traced(sets: dict[str, Any]) -> Any:
    """Record evaluations, engine runs and the final posterior; apply ``sets`` for the duration."""
    from gpvi.inference.cvi import engine, typeii

    log: dict[str, list[dict[str, Any]]] = {"evals": [], "runs": [], "posterior": []}
    orig_po, orig_run, orig_post = typeii.profiled_objective, engine.CVI.run, engine.CVI.posterior
    orig_phase, orig_init, coarse0 = typeii.TypeII.phase, typeii.TypeII.__init__, dict(typeii.COARSE)
    phase_no = {"n": -1, "coarse": False}

    def po(cvi: Any, model: Any, theta: Any, *a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        inner, val, grad = orig_po(cvi, model, theta, *a, **k)
        log["evals"].append({"phase": phase_no["n"], "coarse": phase_no["coarse"], "tol": k.get("tol"),
                             "theta": [round(float(x), 4) for x in theta], "value": val,
                             "gnorm": None if grad is None else float(grad.norm()), "inner": int(inner.t),
                             "wall_s": round(time.perf_counter() - t, 3)})
        return inner, val, grad

    def phase(self: Any, model: Any, state: Any, prior: Any, *, coarse: bool = False, **kw: Any) -> Any:
        phase_no["n"] += 1
        phase_no["coarse"] = coarse
        return orig_phase(self, model, state, prior, coarse=coarse, **kw)

    def run(self: Any, model: Any, init: Any = None, **kw: Any) -> Any:
        t = time.perf_counter()
        st = kw.get("state")
        t0 = 0 if st is None or isinstance(st, dict) else st.t
        post = orig_run(self, model, init, **kw)
        log["runs"].append({"after_phase": phase_no["n"], "steps": int(post.engine_state.t - t0),
                            "tol": self.tol, "wall_s": round(time.perf_counter() - t, 3)})
        return post

    def posterior(self: Any, *a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        out = orig_post(self, *a, **k)
        log["posterior"].append({"wall_s": round(time.perf_counter() - t, 3)})
        return out

    def init(self: Any, *a: Any, **k: Any) -> None:
        for key, v in sets.items():
            if key not in typeii.COARSE and key not in PROTOTYPES:
                k.setdefault(key, v)
        orig_init(self, *a, **k)

    orig_tt = typeii.trial_tol
    if sets.get("coarse_floor_stop"):
        typeii.trial_tol = _floor_stop(typeii)
    typeii.profiled_objective, engine.CVI.run, engine.CVI.posterior = po, run, posterior
    typeii.TypeII.phase, typeii.TypeII.__init__ = phase, init
    typeii.COARSE.update({k: v for k, v in sets.items() if k in typeii.COARSE})
    try:
        yield log
    finally:
        typeii.profiled_objective, engine.CVI.run, engine.CVI.posterior = orig_po, orig_run, orig_post
        typeii.TypeII.phase, typeii.TypeII.__init__ = orig_phase, orig_init
        typeii.trial_tol = orig_tt
        typeii.COARSE.clear()
        typeii.COARSE.update(coarse0)


def fit(family: str, n: int, level: int, sets: dict[str, Any]) -> dict[str, Any]:
    from gpvi import GPClassifier

    Xtr, ytr, Xte, yte = binary_data(family, n, level)
    ld = load()
    with warnings.catch_warnings(), traced(sets) as log:
        warnings.simplefilter("ignore")
        t = time.perf_counter()
        clf = GPClassifier(random_state=0).fit(Xtr, ytr)
        wall = time.perf_counter() - t
    post = clf.posterior_
    ev = log["evals"]
    by_phase: dict[int, dict[str, Any]] = {}
    for e in ev:
        p = by_phase.setdefault(e["phase"], {"coarse": e["coarse"], "evaluations": 0, "inner": 0, "wall_s": 0.0})
        p["evaluations"] += 1
        p["inner"] += e["inner"]
        p["wall_s"] = round(p["wall_s"] + e["wall_s"], 3)
    return {"family": family, "half": half_of(family), "N": n, "level": level, "noise": FAMILIES[family][1][level],
            "sets": sets, "wall_s": round(wall, 3), "load": ld, "objective": float(post.info["objective"]),
            "theta": [round(float(x), 4) for x in post.theta], "log_loss": log_loss(clf.predict_proba(Xte), yte),
            "phases": by_phase, "runs": log["runs"], "posterior": log["posterior"], "evals": ev}


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| family | half | noise | N | set | wall (s) | load | runs: steps (s) | phases: ev / inner (s) | "
           "posterior (s) | objective | log loss |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        runs = ", ".join(f"{x['steps']} ({x['wall_s']:.1f})" for x in r["runs"])
        ph = " + ".join(f"{'c' if p['coarse'] else 'f'} {p['evaluations']}/{p['inner']} ({p['wall_s']:.1f})"
                        for p in r["phases"].values())
        post = ", ".join(f"{x['wall_s']:.1f}" for x in r["posterior"])
        sets = " ".join(f"{k}={v}" for k, v in r["sets"].items()) or "default"
        out.append(f"| {r['family']} | {r['half']} | {r['noise']} | {r['N']} | {sets} | {r['wall_s']:.1f} | "
                   f"{r['load']} | {runs} | {ph} | {post} | {r['objective']:.6f} | {r['log_loss']:.4f} |")
    return out


def render(name: str, rows: list[dict[str, Any]]) -> None:
    md = header("Type-II fits traced evaluation by evaluation (issue 59)")
    md += "\n" + NOTE + "\n\n" + "\n".join(table(rows))
    write(name, md + "\n", {"rows": rows}, folder=OUT)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=["xor", "clf8"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[2000])
    ap.add_argument("--noise", nargs="+", type=int, default=[0])
    ap.add_argument("--set", nargs="*", default=[], dest="sets", help="KEY=VALUE (COARSE entry or TypeII keyword)")
    ap.add_argument("--compare", nargs="*", default=None,
                    help="a second rule as KEY=VALUE items; each case is fitted with --set and with this")
    ap.add_argument("--name", default="typeii_trace")
    ap.add_argument("--render", action="store_true", help="only write the markdown again from the json")
    args = ap.parse_args()
    rules = [parse_sets(args.sets)] + ([parse_sets(args.compare)] if args.compare is not None else [])
    path = OUT / f"{args.name}.json"
    rows = json.loads(path.read_text())["data"]["rows"] if path.exists() else []
    if args.render:
        return render(args.name, rows)
    for fam in args.families:
        for n in args.sizes:
            for lvl in args.noise:
                for sets in rules:
                    r = fit(fam, n, lvl, sets)
                    rows = [x for x in rows if (x["family"], x["N"], x["level"], x["sets"]) !=
                            (fam, n, lvl, r["sets"])] + [r]
                    print("\n".join(table([r])[2:]), flush=True)
                    render(args.name, rows)


if __name__ == "__main__":
    main()
