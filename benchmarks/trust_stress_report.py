"""The report of the ``gpvi.infer`` stress suite (``benchmarks/trust_stress.py``, issue 39): the tables of
``results/trust_stress.{md,json}`` from the cached references and cases, and the judgement of the cases of problems
that have a long dispersed NUTS run (``trust_stress_longref.py``) against that run.

Run: ``.venv/bin/python -m benchmarks.trust_stress render`` (or this module's :func:`render`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import header, write
from benchmarks.trust_stress_rules import CACHE, NAME, SD_HI, SD_LO, SEEDS, SEEN, TOL_MEAN, _cell, fidelity


def _range(xs: list[float]) -> str:
    """``min-max`` of ``xs`` rounded to whole seconds (``-`` when empty)."""
    return f"{min(xs):.0f}-{max(xs):.0f}" if xs else "-"


def long_references() -> dict[str, dict[str, Any]]:
    """The long dispersed NUTS runs of ``trust_stress_longref.py`` (committed results), by problem: means and sds."""
    out = {}
    for f in sorted((Path(__file__).resolve().parent / "results").glob("trust_stress_longref_*.json")):
        d = json.loads(f.read_text())["data"]
        out[d["problem"]] = {"mean": [r["mean"] for r in d["rows"]], "sd": [r["sd"] for r in d["rows"]],
                             "wall_s": d["wall_s"]}
    return out


def against_long(c: dict[str, Any], rule: str, ref: dict[str, Any], long: dict[str, Any]) -> dict[str, Any]:
    """Case ``c``'s answer under ``rule`` (its mean, and its sds from the stored ratios to the suite's reference
    ``ref``) judged against the long run ``long``."""
    a = c[rule]
    return fidelity(a["mean"], np.asarray(a["sd_ratio"]) * np.asarray(ref["sd"]), long)


def render(probs: list[dict[str, Any]]) -> None:
    refs, cases = {}, []
    for p in probs:
        rp = CACHE / f"ref_{p['id']}.json"
        if rp.exists():
            refs[p["id"]] = json.loads(rp.read_text())
        for s in SEEDS:
            cp = CACHE / f"case_{p['id']}_{s}.json"
            if cp.exists():
                cases.append(json.loads(cp.read_text()))
    md = [header("gpvi.infer stress suite (issue 39)"), "",
          f"Problems: {len(probs)} ({sum(p['half'] == 'tuning' for p in probs)} tuning, "
          f"{sum(p['half'] == 'held-out' for p in probs)} held out); references done: {len(refs)}; "
          f"(problem, seed) cases done: {len(cases)} of {len(probs) * len(SEEDS)}.", "",
          "Cases done per problem: " + ", ".join(
              f"{p['id']} ({p['half']}) {sum(c['problem'] == p['id'] for c in cases)}"
              for p in probs if any(c["problem"] == p["id"] for c in cases)) + ".", "",
          f"A case is **ok** when every parameter's |Δmean| <= {TOL_MEAN} reference sd and sd ratio in "
          f"[{SD_LO}, {SD_HI}]; a case outside that is **FLAGGED** when the returned posterior says it is not "
          "reliable (``report.trusted`` False) and a **MISS** otherwise (confidently wrong). v1 = the rule before "
          "issue 39, v2 = the rule after; both from the same q (same seed).", "",
          "**How the rule was decided.** v2 was first written before any case ran (an adapted proposal checked by "
          "batch MCSE, run only when q's k-hat > 0.5). After synth-1, boston-0 (seed 0), synth-2 (seeds 0-3, "
          "tuning) and synth-0 (held out, all ok under both versions) had run, synth-2 showed q with k-hat "
          "0.34-0.38 agreeing with its own weighted draws while its sds were 0.63-0.84x the reference's; the check "
          "was changed to the multi-scale defensive proposal, always run (tried offline on the cached q's of those "
          "cases only), and every case was rerun with it. No constant was changed after that.", "",
          "**NUTS targets (this run).** Every unflagged miss of the first 30 cases was a NUTS answer (``infer``'s or "
          "the reference's) that met bulk ESS 400 and R-hat 1.01 with a tail ESS of 142-383 or an MCSE of the sd of "
          "0.10-0.32 sd (a heavy tail not yet pinned down). Both ``infer``'s NUTS route and the references now also "
          "need tail ESS >= 400 and MCSE of every mean and sd <= 0.05 sd (the weighted answer's own tolerance; no "
          "new constant). The diagnostics of every cached NUTS run, held-out ones included, were looked at before "
          "this change, so for it the held-out half is not held out; the references were rerun and every case "
          "re-judged.", "",
          "**The check's proposal (this run).** After the NUTS change the four unflagged misses left (pendulum-1 "
          "seed 2, synth-10 seeds 0 and 2, synth-2 seed 2) were all weighted answers on a posterior with a heavy "
          "one-sided tail in one parameter, and three of them had passed only after the check's refinement. The "
          "variants of `studies/results/trust_stress_tailcheck.md` were compared on all 29 cached weighted cases (held-out ones "
          "included); the proposal's per-coordinate wide components (scale 3, weight 0.2) were chosen and the "
          "refinement kept for the starts' mixture only (every case run so far has one basin, so none is "
          "refined now). Rerun, that rule accepted boston-0 seed 3 (a NUTS answer before) with sds 0.77x the "
          "reference's: the coordinate components had lowered k-hat from 0.80 to 0.48 without reaching the missing "
          "mass. So a passed check now needs a second opinion from the scaled copies alone (new draws, the same "
          "rule): on the 58 cases cached then (`SEEN` in the script), no answer accepted by both is outside the "
          "tolerance. Every case was rerun with it. For these changes no case run before them is held out: the "
          "summary's \"unseen\" rows are the cases run after, held out from every decision.", "",
          "**NUTS route.** ``infer``'s sampler is ``infer.default_nuts`` as of this run's code: since issue 57's "
          "sixteenth session a diagonal metric adapted over 500 warm-up transitions from draws of q (before: q's "
          "covariance fixed as the metric, 200 warm-up transitions; ``trust_stress_lean.md`` and earlier files).", "",
          ("**Partial run.** " if len(cases) < len(probs) * len(SEEDS) else "**Walls.** ")
          + "On this 2-core machine (this suite on one core, one thread, other work on the other: the load heading "
          f"this file is the render's; the run's own is in the CHANGELOG entry) the references took "
          f"{_range([r['wall_s'] for r in refs.values()])} s per problem and NUTS from q "
          f"{_range([c['v2']['times'].get('nuts', 0.0) for c in cases if c['v2']['answer'] == 'nuts'])} s per case "
          "(a run cached under an earlier rule is extended from its cached state, and its wall then adds both)"
          + (", so only the cases listed above were run in the time available; `python -m benchmarks.trust_stress "
             "cases` resumes from the cache." if len(cases) < len(probs) * len(SEEDS) else "."), ""]
    summary = []
    ref_ok = {k: bool(r.get("mixed")) for k, r in refs.items()}
    longs = {k: v for k, v in long_references().items() if k in refs}
    best = {(c["problem"], c["seed"], rule): (against_long(c, rule, refs[c["problem"]], longs[c["problem"]])["within"]
                                             if c["problem"] in longs else c[rule]["within"])
            for c in cases for rule in ("v1", "v2")}
    def unseen(c: dict[str, Any]) -> bool:
        return c["seed"] not in SEEN.get(c["problem"], ())

    for half, sel in (("tuning", "all"), ("held-out", "all"), ("tuning", "ref met"), ("held-out", "ref met"),
                      ("unseen", "all"), ("unseen", "ref met"), ("tuning", "long where run"),
                      ("held-out", "long where run"), ("unseen", "long where run")):
        hc = [c for c in cases if (unseen(c) if half == "unseen" else c["half"] == half)
              and (sel != "ref met" or ref_ok.get(c["problem"], False))]
        for rule in ("v1", "v2"):
            ok = [best[c["problem"], c["seed"], rule] if sel == "long where run" else c[rule]["within"] for c in hc]
            n_ok = sum(ok)
            n_flag = sum((not w) and (not c[rule]["trusted"]) for c, w in zip(hc, ok))
            n_miss = sum((not w) and c[rule]["trusted"] for c, w in zip(hc, ok))
            n_flag_ok = sum(w and not c[rule]["trusted"] for c, w in zip(hc, ok))
            routes = {a: sum(c[rule]["answer"] == a for c in hc) for a in ("q", "psis", "nuts")}
            walls = [c[rule]["wall"] for c in hc]
            summary.append({"half": half, "refs": sel, "rule": rule, "cases": len(hc), "ok": n_ok,
                            "flagged_miss": n_flag,
                            "unflagged_miss": n_miss, "flagged_but_ok": n_flag_ok, "routes": routes,
                            "median_wall": float(np.median(walls)) if walls else math.nan,
                            "total_wall": float(np.sum(walls)) if walls else math.nan})
    md += ["## Summary", "", "Cases of every problem, then only those whose reference met its own targets (bulk and "
           "tail ESS >= 400, R-hat <= 1.01, MCSE of every mean and sd <= 0.05 sd within 3 doublings): against a "
           "reference that did not, an sd ratio outside 0.8-1.25 may be the reference's error. \"long where run\": "
           "every case, judged against the long dispersed NUTS run of `trust_stress_longref.py` (8 chains x "
           "(1,000 + 2,000)) for the problems that have one (" + (", ".join(sorted(longs)) or "none") + ") and "
           "against the suite's reference for the others.", "",
           "| half | references | rule | cases | ok | flagged (not ok) | **unflagged miss** | flagged but ok | "
           "routes q / psis / nuts | median wall (s) | total wall (s) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        md.append(f"| {s['half']} | {s['refs']} | {s['rule']} | {s['cases']} | {s['ok']} | {s['flagged_miss']} | "
                  f"{s['unflagged_miss']} | {s['flagged_but_ok']} | {s['routes']['q']} / {s['routes']['psis']} / "
                  f"{s['routes']['nuts']} | {s['median_wall']:.1f} | {s['total_wall']:.0f} |")
    if longs:
        md += ["", "## Against the long references", "",
               "The cases of the problems with a long dispersed NUTS run, v2's answer judged against the suite's "
               "reference and against the long run (max |Δmean| in that run's sds, sd ratio range).", "",
               "| problem | seed | route | suite reference: Δ, sd ratios, verdict | long run: Δ, sd ratios, verdict |",
               "|---|---|---|---|---|"]
        for c in cases:
            if c["problem"] in longs:
                a, lj = c["v2"], against_long(c, "v2", refs[c["problem"]], longs[c["problem"]])
                md.append(f"| {c['problem']} | {c['seed']} | {a['answer']} | {a['max_dmean_sd']:.2f}, "
                          f"{a['sd_ratio_min']:.2f}-{a['sd_ratio_max']:.2f}, {'ok' if a['within'] else 'out'} | "
                          f"{lj['max_dmean_sd']:.2f}, {lj['sd_ratio_min']:.2f}-{lj['sd_ratio_max']:.2f}, "
                          f"{'ok' if lj['within'] else 'out'} |")
    md += ["", "## References (default NUTS, 4 chains, doubled to bulk and tail ESS >= 400, R-hat <= 1.01 and MCSE "
           "<= 0.05 sd)", "",
           "| problem | half | N | D | draws per chain | min bulk ESS | min tail ESS | max R-hat | max MCSE of a sd "
           "(sd) | met | divergences | largest sd | default NUTS wall to 400 ESS (s) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in probs:
        r = refs.get(p["id"])
        if r:
            md.append(f"| {p['id']} | {p['half']} | {p['n']} | {len(r['names'])} | {r['draws_per_chain']} | "
                      f"{r['min_ess_bulk']:.0f} | {r.get('min_ess_tail', math.nan):.0f} | {r['max_r_hat']:.3f} | "
                      f"{max(np.asarray(r.get('mcse_sd', [math.nan])) / np.asarray(r['sd'])):.3f} | {r['mixed']} | "
                      f"{r['divergences']} | {max(r['sd']):.2f} | {r['wall_to_400']:.0f} |")
    for half in ("tuning", "held-out"):
        md += ["", f"## Cases: {half} half", "",
               "Per cell: route, k̂ and weights' ESS of the answer's proposal, max |Δmean|/sd, sd ratio range, "
               "wall of infer (variational fit included), verdict.", "",
               "| problem | seed | v1 (before) | v2 (after) | v2 reason |", "|---|---|---|---|---|"]
        for c in cases:
            if c["half"] == half:
                md.append(f"| {c['problem']} | {c['seed']} | {_cell(c['v1'])} | {_cell(c['v2'])} | "
                          f"{c['v2']['reason'][:140]} |")
    md += ["", "## Seed spread (v2)", "",
           "Per problem over the seeds: the routes taken, and the spread (max - min over seeds) of each parameter's "
           "answer mean in reference sds (largest over parameters).", "",
           "| problem | half | routes (seeds in order) | spread of means (ref sd) | largest 1-MCSE of a mean reported "
           "(answer sd) |", "|---|---|---|---|---|"]
    for p in probs:
        pc = [c for c in cases if c["problem"] == p["id"]]
        if len(pc) < 2 or p["id"] not in refs:
            continue
        sd = np.asarray(refs[p["id"]]["sd"])
        means = np.array([c["v2"]["mean"] for c in pc]) / sd
        spread = float((means.max(0) - means.min(0)).max())
        routes = ", ".join(c["v2"]["answer"] for c in pc)
        nmcse = max(c["v2"]["mcse_mean"] for c in pc)
        md.append(f"| {p['id']} | {p['half']} | {routes} | {spread:.2f} | {nmcse:.3f} |")
    data = {"problems": probs, "references": refs, "long_references": longs, "cases": cases, "summary": summary,
            "load_after": list(os.getloadavg())}
    write(NAME, "\n".join(md) + "\n", data)
