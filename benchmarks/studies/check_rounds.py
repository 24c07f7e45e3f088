"""Issue 57: more draws of a single q's check proposal when the check fails on its batch MCSE alone, measured on the
stress suite's cached variational fits before adoption.

The rule (:func:`more_draws` here; not adopted): when the base of the check is a
single q (one basin) and its check, or the second opinion's, fails on the batch MCSE alone (k-hat and the weights'
ESS pass, the MCSE at most ``REFINE_REACH`` x ``MCSE_TOL``), draw more of the *same* proposal in rounds as large as
the check's, pooled with its draws, at most ``REFINE_ROUNDS`` rounds in all, stopping early when the MCSE falling as
1/sqrt(S) could not reach ``MCSE_TOL``. The starts' mixture keeps its refinement. At the small N of the suite a
round of 4,000 draws costs a fraction of a second against NUTS's tens of seconds.

Protocol, fixed before any variant run: every (problem, seed) of ``trust_stress_sized`` (24 problems x 5 seeds; the
suite's own tuning / held-out split), from its cached q (``q_<problem>_<seed>.pt``), the check as before (must
reproduce the case's stored verdict) and with the rule, from the same generator. A case whose verdict changes from
NUTS to a weighted answer is compared with the suite's reference (0.2 sd, sd ratios 0.8-1.25). **Adopt** only if the
tuning half gains no answer outside the tolerance; then report the held-out half as it falls.

**Decision: not adopted.** On the tuning half the rule turns 11 NUTS answers into weighted ones, two of them
outside the tolerance (synth-4 seeds 3 and 4, sds 0.74x and 0.72x the reference): the MCSE of the second opinion
(or of the first check) was what sent them to NUTS, and more draws of the same proposal shrink it while the draws
still miss the tail. The held-out half (5 gained, none outside) is reported for the record. The batch MCSE of a
single q's check is a signal, not only noise.

Usage::

    GPVI_STRESS_CACHE=~/.cache/gpvi/trust_stress_sized OMP_NUM_THREADS=1 \\
        .venv/bin/python -m benchmarks.studies.check_rounds [problem:seed ...]
    .venv/bin/python -m benchmarks.studies.check_rounds render
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from typing import Any

import torch

from gpvi.inference import check as chk
from gpvi.posteriors.weighted import psis

from benchmarks.studies._common import OWN, header, write
from benchmarks.trust_stress import fit_q, model_of, problems, reference
from benchmarks.trust_stress_rules import CACHE, SEEDS, fidelity

N_PSIS, MIN_ESS = 1000, 400.0
NAME = "check_rounds"


def more_draws(prop: Any, w: Any, target: Any, check: dict[str, Any], min_ess: float,
               generator: torch.Generator) -> tuple[Any, dict[str, Any]]:
    """The rule: rounds of ``len(w.draws)`` new draws of the same proposal pooled with the check's, PSIS of all
    checked after each (batches of the first check's size), until reliable, failing on anything but the MCSE, or
    the MCSE falling as 1/sqrt(S) could not reach ``MCSE_TOL`` within ``REFINE_ROUNDS`` rounds in all."""
    S0, out, wr = int(w.draws.shape[0]), check, w
    draws, log_joint = [w.draws], [w.log_joint]
    for r in range(2, chk.REFINE_ROUNDS + 1):
        mcse = max(out["mcse_mean"], out["mcse_sd"])
        if (out["reliable"] or not chk._refinable(out, min_ess)
                or mcse * math.sqrt((r - 1) / chk.REFINE_ROUNDS) > chk.MCSE_TOL):
            break
        part = psis(prop, target, S0, generator=generator)
        draws.append(part.draws)
        log_joint.append(part.log_joint)
        wr = psis(prop, target, draws=torch.cat(draws), log_joint=torch.cat(log_joint))
        out = dict(chk.check_weighted(wr, check["proposal"], min_ess, chk.CHECK_BATCHES * r), rounds=r)
    return wr, out


def _diagnose(q: Any, model: Any, seed: int, rounds: bool) -> tuple[Any, dict[str, Any], float]:
    """Steps 3-4 of ``check.diagnose`` as it is (``rounds`` False: must reproduce the stored verdict) or with the
    rule (:func:`more_draws` after a single q's failed check and second opinion)."""
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, _, mix, _, several = chk.basins(q, model, seed, N_PSIS)
        base = mix if several else q
        gen = torch.Generator().manual_seed(seed)

        def checked(coord_weight: float) -> tuple[Any, dict[str, Any]]:
            prop = chk.defensive_proposal(base, model, coord_weight=coord_weight)
            wb = psis(prop, model, 4 * N_PSIS, generator=gen)
            c = chk.check_weighted(wb, "mixture" if several else "q", MIN_ESS)
            if several and chk._refinable(c, MIN_ESS):
                wb, c = chk.refine(base, wb, model, c, MIN_ESS, gen, coord_weight=coord_weight)
            elif rounds and chk._refinable(c, MIN_ESS):
                wb, c = more_draws(prop, wb, model, c, MIN_ESS, gen)
            return wb, c

        wb, c = checked(chk.COORD_WEIGHT)
        if c["reliable"]:
            _, second = checked(0.0)
            c["second"] = {k: second[k] for k in second if k != "proposal"}
            c["reliable"] = second["reliable"]
    c["several"] = several
    return wb, c, time.perf_counter() - t0


def _brief(c: dict[str, Any]) -> dict[str, Any]:
    keys = ("khat", "ess", "num_draws", "mcse_mean", "mcse_sd", "reliable", "rounds", "refined")
    out = {k: c[k] for k in keys if k in c}
    if c.get("second"):
        out["second"] = {k: c["second"][k] for k in keys if k in c["second"]}
    return out


def run(keys: list[str]) -> None:
    path = OWN / f"{NAME}.json"
    out = json.loads(path.read_text())["data"] if path.exists() else {}
    probs = {p["id"]: p for p in problems()}
    for key in keys:
        if key in out:
            continue
        pid, seed = key.split(":")
        p, seed = probs[pid], int(seed)
        stored = json.loads((CACHE / f"case_{pid}_{seed}.json").read_text())["v2"]
        q, _ = fit_q(p, seed)
        model, ref = model_of(p), reference(p)
        rec: dict[str, Any] = {"half": p["half"], "N": p["n"], "D": len(model.names),
                               "stored": {"answer": stored["answer"], "reliable": stored["check"]["reliable"],
                                          "within": stored["within"], "trusted": stored["trusted"],
                                          "wall": stored["wall"]}}
        for name, flag in (("before", False), ("rule", True)):
            wb, c, wall = _diagnose(q, model, seed, flag)
            rec[name] = {"check": _brief(c), "several": c["several"], "wall_check": wall,
                         "weighted": {k: v for k, v in fidelity(wb.mean, wb.std, ref).items()
                                      if k not in ("dmean_sd", "sd_ratio")}}
        rec["reproduced"] = rec["before"]["check"]["reliable"] == rec["stored"]["reliable"]
        rec["load"] = list(os.getloadavg())
        print(key, p["half"], "reproduced" if rec["reproduced"] else "NOT REPRODUCED",
              "before", rec["before"]["check"]["reliable"], "rule", rec["rule"]["check"]["reliable"],
              rec["rule"]["weighted"], f"{rec['before']['wall_check']:.1f}/{rec['rule']['wall_check']:.1f} s",
              flush=True)
        out[key] = rec
        write(NAME, report(out), out)


def _mc(c: dict[str, Any]) -> str:
    s = (f"{c['khat']:.2f}, {c['ess']:.0f}, {max(c['mcse_mean'], c['mcse_sd']):.3f}, {c['num_draws']}"
         + ("; " + ("yes" if c["reliable"] else "no")))
    if c.get("second"):
        s += " / 2nd " + _mc(c["second"])
    return s


def report(out: dict[str, Any]) -> str:
    rows = ["| case | half | N | D | before: k-hat, ESS, MCSE, draws; reliable (/ 2nd opinion) | rule: the same | "
            "weighted answer with the rule: Δmean, sd ratios, within | stored answer (wall s) | check wall before / "
            "rule (s) |", "|---|---|---|---|---|---|---|---|---|"]
    for key, r in out.items():
        w = r["rule"]["weighted"]
        rows.append(f"| {key} | {r['half']} | {r['N']} | {r['D']} | {_mc(r['before']['check'])} | "
                    f"{_mc(r['rule']['check'])} | {w['max_dmean_sd']:.2f}, {w['sd_ratio_min']:.2f}-"
                    f"{w['sd_ratio_max']:.2f}, {'yes' if w['within'] else '**no**'} | {r['stored']['answer']} "
                    f"({r['stored']['wall']:.0f}) | {r['before']['wall_check']:.1f} / {r['rule']['wall_check']:.1f} |")
    lines = []
    for half in ("tuning", "held-out"):
        cases = {k: r for k, r in out.items() if r["half"] == half}
        gained = [k for k, r in cases.items()
                  if r["rule"]["check"]["reliable"] and not r["before"]["check"]["reliable"]]
        lost = [k for k, r in cases.items() if r["before"]["check"]["reliable"] and not r["rule"]["check"]["reliable"]]
        missed = [k for k in gained if not cases[k]["rule"]["weighted"]["within"]]
        notrep = [k for k, r in cases.items() if not r["reproduced"]]
        saved = sum(cases[k]["stored"]["wall"] for k in gained)
        lines.append(f"- **{half}** ({len(cases)} cases): weighted answers the rule adds (NUTS before): "
                     f"{len(gained)} ({', '.join(gained) or 'none'}); of them outside the tolerance (new unflagged "
                     f"misses): {', '.join(missed) or 'none'}; lost: {', '.join(lost) or 'none'}; stored walls of "
                     f"the gained cases {saved:.0f} s; verdicts not reproduced: {', '.join(notrep) or 'none'}.")
    return "\n".join([header("gpvi.infer's check: more draws of a single q's proposal (issue 57)"), "",
                      *(__doc__.split("\n\n")[k].replace("\n", " ") + "\n" for k in (1, 2, 3)),
                      *lines, "", *rows]) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["render"]:
        data = json.loads((OWN / f"{NAME}.json").read_text())["data"]
        write(NAME, report(data), data)
    else:
        cases = sorted(problems(), key=lambda p: p["half"] != "tuning")          # the tuning half first
        run(sys.argv[1:] or [f"{p['id']}:{s}" for p in cases for s in SEEDS])
