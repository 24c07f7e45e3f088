"""Where EP's evaluations start in a fully Bayesian classification fit with ``evidence="ep"`` (issue 41: the wall).

Every EP evaluation of the engine starts from one fixed set of sites, so that :math:`\\log Z_{EP}(\\theta)` stays a
deterministic function of :math:`\\theta`. Until this change those were the sites at the CVI MAP-II point (the bound's
anchor); the engine's draws of :math:`\\theta` sit around the EP MAP point, found after, where q starts. This runs
each set's whole fit twice in one process, in alternating order, with the sites at MAP-II ("old") and at the EP MAP
point ("new"), seed 0: the fit's wall, EP's sweeps per evaluation, and how far q(theta)'s means and sds moved (largest
change over the parameters, in q's sds). Decided on synth10b (where the time matters most); the others held out.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.ep_warm_start synth10b synth4 pima ripley``; writes
``results/ep_warm_start_<first set>.{md,json}``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

from gpvi.inference.cvi.bayes import FullyBayesianCVI
from gpvi.inference.cvi.ep_evidence import EPEvidenceTarget

from benchmarks._common import header, write
from benchmarks.studies.ep_map_tol import model_of


def fit(name: str, new: bool) -> dict[str, Any]:
    """One fit; ``new=False`` keeps EP's start at MAP-II (``warm_from`` a no-op, as before the change)."""
    real = EPEvidenceTarget.warm_from
    if not new:
        EPEvidenceTarget.warm_from = lambda self, theta: None
    try:
        t0 = time.perf_counter()
        fb = FullyBayesianCVI(seed=0, evidence="ep").run(model_of(name))
        wall = time.perf_counter() - t0
    finally:
        EPEvidenceTarget.warm_from = real
    c = fb.info["ep_counters"]
    return {"wall_s": wall, "q_time_s": fb.info["q_time_s"], "evaluations": c["evaluations"],
            "sweeps_per_evaluation": c["sweeps"] / max(c["evaluations"], 1), "mean": fb.mean.tolist(),
            "std": fb.std.tolist(), "retry": fb.info.get("engine_retry"), "fallback": fb.info.get("engine_fallback")}


def main(names: list[str]) -> None:
    warnings.simplefilter("ignore")
    out = []
    for i, name in enumerate(names):
        order = ["old", "new"] if i % 2 == 0 else ["new", "old"]
        rec: dict[str, Any] = {"set": name, "order": order}
        for key in order:
            rec[key] = fit(name, key == "new")
            print(name, key, round(rec[key]["wall_s"], 1), round(rec[key]["sweeps_per_evaluation"], 2), flush=True)
        o, n = rec["old"], rec["new"]
        rec["mean_shift_q_sd"] = max(abs(a - b) / s for a, b, s in zip(n["mean"], o["mean"], o["std"]))
        rec["sd_shift_rel"] = max(abs(a / b - 1) for a, b in zip(n["std"], o["std"]))
        out.append(rec)
        rows = ["| set | order | fit wall (s), old / new | q phase (s), old / new | EP sweeps per evaluation, old / new | "
                "q's means moved (q sd) | q's sds moved (relative) |", "|---|---|---|---|---|---|---|"]
        rows += [f"| {r['set']} | {' then '.join(r['order'])} | {r['old']['wall_s']:.1f} / {r['new']['wall_s']:.1f} | "
                 f"{r['old']['q_time_s']:.1f} / {r['new']['q_time_s']:.1f} | "
                 f"{r['old']['sweeps_per_evaluation']:.2f} / {r['new']['sweeps_per_evaluation']:.2f} | "
                 f"{r['mean_shift_q_sd']:.1e} | {r['sd_shift_rel']:.1e} |" for r in out]
        md = [header("Where EP's evaluations start in a fully Bayesian classification fit (issue 41)"), "",
              __doc__.split("\n\n")[1].replace("\n", " "), "", *rows]
        write(f"ep_warm_start_{names[0]}", "\n".join(md) + "\n", out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sets", nargs="+")
    main(ap.parse_args().sets)
