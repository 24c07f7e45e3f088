"""How `gpvi.infer` extends NUTS chains that miss its targets: doubling against an extension sized by the shortfall,
replayed on the stress suite's cached chains (issue 39, item 4: the NUTS route's wall).

``gpvi.infer``'s NUTS route runs 4 chains x (200 + 500) from q and, while the chains miss a target (bulk and tail
ESS >= 400, R-hat <= 1.01, every MCSE of a mean and of a sd <= 0.05 sd), extends them. An extension continues every
chain exactly as an uninterrupted longer run, so the first L draws of a cached run *are* the run that stopped at L:
any extension rule can be replayed on the suite's cached chains (``~/.cache/gpvi/trust_stress/nuts_*.pt``) by
computing the diagnostics on prefixes. Its cost is the gradient evaluations of the draws kept (``n_steps``), the
warm-up being the same for every rule.

Rules replayed (every one stops at 8 x 500 draws per chain, today's cap of 3 doublings):

``double``   today's: L -> 2 L.
``need``     L -> L x clamp(margin x need, 1.25, 2) (rounded up to 50), need = the largest of min_ess / ESS (bulk,
             tail) and (MCSE / 0.05)^2 over the parameters (ESS grows and MCSE^2 falls in proportion to the draws);
             need 2 when R-hat misses. ``margin`` in {1.1, 1.25, 1.5}.

The margin is chosen on the suite's tuning half and reported on the held-out half. A run whose replay would need more
draws than were cached is counted as "not replayable" for that rule.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.nuts_extension
    GPVI_STRESS_CACHE=~/.cache/gpvi/trust_stress_adapted OMP_NUM_THREADS=1 \
        .venv/bin/python -m benchmarks.studies.nuts_extension --out=nuts_extension_adapted
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.studies._common import header, write  # noqa: E402
from benchmarks.trust_stress_rules import CACHE, fidelity  # noqa: E402
from gpvi.inference.check import MCSE_TOL  # noqa: E402
from gpvi.inference.check import mixed, relative_mcse  # noqa: E402
from gpvi.posteriors.diagnostics import diagnostics  # noqa: E402

MIN_ESS, FIRST, CAP = 400.0, 500, 4000
OUT_NAME = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--out=")), "nuts_extension")
"""The report's name (``--out=NAME``); the cached runs replayed are ``benchmarks.trust_stress_rules.CACHE``'s (set
``GPVI_STRESS_CACHE`` to replay another run of the suite, e.g. ``~/.cache/gpvi/trust_stress_adapted``)."""
MARGINS = (1.1, 1.25, 1.5)


class Prefixes:
    """Diagnostics of the first L draws of every chain of a cached run (memoised)."""

    def __init__(self, draws: torch.Tensor) -> None:
        self.draws, self.memo = draws, {}

    def at(self, L: int) -> tuple[dict[str, Any], Any]:
        if L not in self.memo:
            x = self.draws[:, :L]
            self.memo[L] = (diagnostics(x), x.reshape(-1, x.shape[-1]).std(0))
        return self.memo[L]


def need(d: dict[str, Any], std: Any) -> float:
    """How many times the current draws the targets need (module docstring)."""
    if not bool((d["r_hat"] <= 1.01).all()):
        return 2.0
    ess = min(float(d["ess_bulk"].min()), float(d["ess_tail"].min()))
    mcse = max(relative_mcse(d, std))
    return max(MIN_ESS / ess if ess > 0 else math.inf, (mcse / MCSE_TOL) ** 2)


def replay(p: Prefixes, rule: str, margin: float = 1.0) -> dict[str, Any] | None:
    """The rule's lengths on this run: ``{"lengths", "mixed"}``; None when it needs more than the cache holds."""
    n_max, L, lengths = p.draws.shape[1], FIRST, [FIRST]
    while True:
        if L > n_max:
            return None
        d, std = p.at(L)
        if mixed(d, MIN_ESS, std) or L >= CAP:
            return {"lengths": lengths, "mixed": mixed(d, MIN_ESS, std)}
        if rule == "double":
            L = 2 * L
        else:
            f = min(2.0, max(1.25, margin * need(d, std)))
            L = min(CAP, 50 * math.ceil(L * f / 50))
        lengths.append(L)


def main() -> None:
    from benchmarks.trust_stress import problems
    halves = {p["id"]: p["half"] for p in problems()}
    rows = []
    files = sorted(CACHE.glob("nuts_*.pt"))
    rules = [("double", 1.0)] + [("need", m) for m in MARGINS]
    for f in files:
        pid_seed = f.stem[len("nuts_"):]
        pid, seed = pid_seed.rsplit("_", 1)
        blob = torch.load(f, weights_only=False)
        post = blob["post"]
        draws, steps = post.draws.detach().cpu(), post.stats["n_steps"].detach().cpu().double()
        p = Prefixes(draws)
        half = halves[pid]
        ref_path = CACHE / f"ref_{pid}.json"
        ref = json.loads(ref_path.read_text()) if ref_path.exists() else None
        row = {"case": pid_seed, "half": half, "cached": int(draws.shape[1])}
        for rule, m in rules:
            r = replay(p, rule, m)
            key = rule if rule == "double" else f"need x{m:g}"
            if r is None:
                row[key] = None
                continue
            L = r["lengths"][-1]
            x = draws[:, :L].reshape(-1, draws.shape[-1])
            fid = fidelity(x.mean(0), x.std(0), ref) if ref is not None else None
            row[key] = {"L": L, "ext": len(r["lengths"]) - 1, "mixed": r["mixed"],
                        "grads": float(steps[:, :L].sum()), "within": None if fid is None else fid["within"]}
        rows.append(row)
        print(row, flush=True)
    lines = [header("NUTS extensions replayed on the stress suite's cached chains (issue 39)"), "",
             "Gradient evaluations of the draws kept (warm-up excluded: the same for every rule), summed over the "
             "runs every rule can replay; 'mixed' = the final chains meet every target.", ""]
    keys = ["double"] + [f"need x{m:g}" for m in MARGINS]
    lines += ["Misses: runs that meet the targets (mixed) but whose means and sds are outside the stress suite's "
              "tolerance against its reference (``ref_<problem>.json`` in the cache: |Δmean| <= 0.2 sd, sd ratio "
              "0.8-1.25).", "",
              "| half | runs | " + " | ".join(f"{k}: grads, mixed, extensions, misses" for k in keys) + " |",
              "|---|---|" + "---|" * len(keys)]
    for half in ("tuning", "held-out"):
        ok = [r for r in rows if r["half"] == half and all(r[k] is not None for k in keys)]
        cells = []
        for k in keys:
            g = sum(r[k]["grads"] for r in ok)
            base = sum(r["double"]["grads"] for r in ok)
            cells.append(f"{g:,.0f} ({g / base:.2f}), {sum(r[k]['mixed'] for r in ok)}, "
                         f"{sum(r[k]['ext'] for r in ok)}, "
                         f"{sum(1 for r in ok if r[k]['mixed'] and r[k].get('within') is False)}")
        lines.append(f"| {half} | {len(ok)} | " + " | ".join(cells) + " |")
    lines += ["", "Per run (final draws per chain L, extensions, mixed):", "",
              "| case | half | cached | " + " | ".join(keys) + " |", "|---|---|---|" + "---|" * len(keys)]
    for r in rows:
        cells = ["not replayable" if r[k] is None else
                 f"{r[k]['L']} ({r[k]['ext']}){'' if r[k]['mixed'] else ', not mixed'}" for k in keys]
        lines.append(f"| {r['case']} | {r['half']} | {r['cached']} | " + " | ".join(cells) + " |")
    write(OUT_NAME, "\n".join(lines) + "\n", rows)


if __name__ == "__main__":
    main()
