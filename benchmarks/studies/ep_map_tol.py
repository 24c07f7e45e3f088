"""The EP MAP search of a fully Bayesian classification fit: L-BFGS-B tolerances (issue 41: the fit's wall).

``FullyBayesianCVI`` (evidence EP) starts S&K at the maximiser of :math:`\\log Z_{EP}(\\theta) + \\log p(\\theta)`,
found by L-BFGS-B from the CVI MAP-II point with EP run to tolerance 1e-6 at every evaluation
(``FullyBayesianCVI._ep_start``). On the held-out ten-class set synth10b that search took 71-90 s of a 313-347 s
fit. This runs each set's whole fit twice in one process, in alternating order, with the search's tolerances
(``gtol=1e-6, ftol=1e-10``, "old") and candidate ones (``--gtol``, ``--ftol``, "new"), seed 0: the search's
evaluations and wall, the fit's wall, and how far q(theta)'s means and sds moved (largest change over the
parameters, in q's sds). A candidate is decided on synth10b (where the time was seen); the other sets are held out.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.ep_map_tol --gtol 1e-3 --ftol 1e-6 pima ripley ...``; each
call writes ``results/ep_map_tol_<first set>_gtol<gtol>.{md,json}``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

import gpvi
import gpvi.inference.cvi.bayes as bayes_mod

from benchmarks.studies._common import header, write
from benchmarks.multiclass import load
from benchmarks.multiclass_bayes import SYNTH, synthetic
from gpvi.models.classification import GPClassification
from gpvi.models.multiclass import GPMulticlass

OLD = (1e-6, 1e-10)
BINARY = {"pima": gpvi.datasets.load_pima, "ripley": gpvi.datasets.load_ripley}


def model_of(name: str) -> Any:
    if name in BINARY:
        ds = BINARY[name]()
        return GPClassification(ds.X_train, ds.y_train)
    Xtr, _, ytr, _, _ = synthetic(name) if name in SYNTH else load(name, 300)
    return GPMulticlass(Xtr, ytr)


def fit(name: str, tols: tuple[float, float]) -> dict[str, Any]:
    """One fit with the EP MAP search's (gtol, ftol) = ``tols``, counting the search's evaluations."""
    calls = {"n": 0}
    real = bayes_mod.lbfgs_maximise

    def counted(fn, x0, **kw):
        kw["gtol"], kw["ftol"] = tols

        def f(x):
            calls["n"] += 1
            return fn(x)
        return real(f, x0, **kw)

    bayes_mod.lbfgs_maximise = counted
    try:
        t0 = time.perf_counter()
        fb = bayes_mod.FullyBayesianCVI(seed=0, evidence="ep").run(model_of(name))
        wall = time.perf_counter() - t0
    finally:
        bayes_mod.lbfgs_maximise = real
    return {"gtol": tols[0], "ftol": tols[1], "wall_s": wall, "ep_map_s": fb.info.get("ep_map_time_s"),
            "map_evaluations": calls["n"], "ep_map_theta": fb.info.get("ep_map_theta"),
            "mean": fb.mean.tolist(), "std": fb.std.tolist()}


def main(names: list[str], new: tuple[float, float]) -> None:
    warnings.simplefilter("ignore")
    out = []
    for i, name in enumerate(names):
        order = [("old", OLD), ("new", new)] if i % 2 == 0 else [("new", new), ("old", OLD)]
        rec: dict[str, Any] = {"set": name, "order": [k for k, _ in order]}
        for key, tols in order:
            rec[key] = fit(name, tols)
            print(name, key, {k: v for k, v in rec[key].items() if k in ("wall_s", "ep_map_s", "map_evaluations")},
                  flush=True)
        o, n = rec["old"], rec["new"]
        rec["mean_shift_q_sd"] = max(abs(a - b) / s for a, b, s in zip(n["mean"], o["mean"], o["std"]))
        rec["sd_shift_rel"] = max(abs(a / b - 1) for a, b in zip(n["std"], o["std"]))
        out.append(rec)
        rows = ["| set | order | EP MAP evaluations, old / new | EP MAP wall (s), old / new | "
                "fit wall (s), old / new | q's means moved (q sd) | q's sds moved (relative) |",
                "|---|---|---|---|---|---|---|"]
        rows += [f"| {r['set']} | {' then '.join(r['order'])} | {r['old']['map_evaluations']} / "
                 f"{r['new']['map_evaluations']} | {r['old']['ep_map_s']:.1f} / {r['new']['ep_map_s']:.1f} | "
                 f"{r['old']['wall_s']:.1f} / {r['new']['wall_s']:.1f} | {r['mean_shift_q_sd']:.1e} | "
                 f"{r['sd_shift_rel']:.1e} |" for r in out]
        md = [header("The EP MAP search's L-BFGS-B tolerances in fully Bayesian classification fits (issue 41)"), "",
              __doc__.split("\n\n")[1].replace("\n", " "), "",
              f"Old: gtol {OLD[0]:g}, ftol {OLD[1]:g}; new: gtol {new[0]:g}, ftol {new[1]:g}.", "", *rows]
        write(f"ep_map_tol_{names[0]}_gtol{new[0]:g}", "\n".join(md) + "\n", out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sets", nargs="+")
    ap.add_argument("--gtol", type=float, required=True)
    ap.add_argument("--ftol", type=float, required=True)
    a = ap.parse_args()
    main(a.sets, (a.gtol, a.ftol))
