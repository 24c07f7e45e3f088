"""Type-II rule changes of issue 59, decided on the tuning half: load-independent counts without and with each.

``--setting resolution`` (default): :class:`gpvi.inference.cvi.typeii.TypeII` ends an L-BFGS-B phase at a trial point
whose first-order change from the phase's best point is below the phase's ``ftol`` relative (its module docstring,
"Resolution"); ``fine_fixed``: with the fixed quasi-Monte Carlo rule (K > 3) the coarse phase is the last;
``between_runs``: phases back to back, without the engine's CVI run between them; ``coarse_adaptive``: the coarse
phase's inner tolerance at each trial point from its first-order change (``TypeII(coarse_adaptive=...)``, the value
of ``--value``; without: the fixed ``COARSE["inner_tol"]``). This script fits
``GPClassifier(random_state=0)`` twice per case, without the change and with it, in one process, and records theta
evaluations, inner CVI steps (and backtracks), outer CVI steps, the objective, theta and the test log loss. Walls
are recorded but the decision rests on the counts (every inner or outer step is one O(N^3) factorisation; every
evaluation adds one gradient of about the same cost), since this 2-core machine is shared.

Cases (``benchmarks.heldout_families``; the split ``SPLIT`` / ``MULTICLASS_SPLIT`` fixed before any timing): every
binary family at N = 500 (``--sizes``) and both noise levels; both multi-class families at N = 100 and 300 with
K = 3, 4, 6 and both noise levels. ``--half tuning`` (default) runs the tuning half only, ``--half heldout`` the
other, ``--half all`` both.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.classification_resolution [--half tuning] [--setting S]
[--value V] [--kinds binary multiclass] [--sizes N] [--name NAME]``.
Results: ``benchmarks/results/<name>.{md,json}`` (default ``classification_resolution``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
import warnings
from typing import Any

import numpy as np
import torch

from benchmarks._common import RESULTS, header, write
from benchmarks.classification_heldout import log_loss
from benchmarks.heldout_families import FAMILIES, MULTICLASS_SPLIT, SPLIT, binary_data, half_of, multiclass_data


VALUE = {"coarse_adaptive": 1e-2}
"""The value of a setting with a value (``--value``) when on; off: None."""


@contextlib.contextmanager
def resolution(on: bool, name: str = "resolution") -> Any:
    """:class:`TypeII`'s default of the setting ``name`` (``resolution``; ``fine_fixed``, ``between_runs``: their
    opposite; ``coarse_adaptive``: :data:`VALUE` or None) set to ``on`` for the duration (GPClassifier builds its
    own)."""
    from gpvi.inference.cvi import typeii

    init = typeii.TypeII.__init__

    def patched(self: Any, *a: Any, **k: Any) -> None:
        if name in VALUE:
            k[name] = VALUE[name] if on else None
        else:
            k.setdefault(name, on if name == "resolution" else not on)
        init(self, *a, **k)

    typeii.TypeII.__init__ = patched
    try:
        yield
    finally:
        typeii.TypeII.__init__ = init


def fit(data: tuple[np.ndarray, ...], on: bool, name: str = "resolution") -> dict[str, Any]:
    from gpvi import GPClassifier

    Xtr, ytr, Xte, yte = data
    with warnings.catch_warnings(), resolution(on, name):
        warnings.simplefilter("ignore")
        t = time.perf_counter()
        clf = GPClassifier(random_state=0).fit(Xtr, ytr)
        wall = time.perf_counter() - t
    info = clf.posterior_.info
    c = info.get("counters", {})
    return {"wall_s": round(wall, 3), "evaluations": c.get("theta_evaluations", 0),
            "inner_steps": c.get("inner_steps", 0), "backtracks": c.get("inner_backtracks", 0),
            "outer_steps": info.get("steps"), "stops": c.get("theta_resolution_stops", 0),
            "objective": info["objective"], "theta": clf.posterior_.theta.tolist(),
            "log_loss": log_loss(clf.predict_proba(Xte), yte)}


def cases(half: str, n: int, kinds: tuple[str, ...] = ("binary", "multiclass")) -> list[tuple[str, int, int, int]]:
    out = [(f, n, 2, lv) for f in sorted(FAMILIES) for lv in (0, 1)] if "binary" in kinds else []
    out += [(f, m, k, lv) for f in ("mc_clf", "mc_blobs") for m in (100, 300) for k in (3, 4, 6) for lv in (0, 1)
            if "multiclass" in kinds]
    return [c for c in out if half == "all" or half_of(c[0]) == half]


def work(r: dict[str, Any]) -> int:
    return r["outer_steps"] + r["inner_steps"] + r["evaluations"]


def report(rows: dict[str, Any], name: str = "resolution") -> str:
    what = {"resolution": "resolution stop",
            "fine_fixed": "last phase with the fixed quasi-Monte Carlo rule (K > 3): the coarse one (with) or fine "
                          "ones after it",
            "between_runs": "phases back to back (with) or a CVI run of the engine between them (without)",
            "coarse_adaptive": f"coarse inner tolerance from each trial's first-order change "
                               f"(coarse_adaptive={VALUE['coarse_adaptive']:g})"}[name]
    lines = [header(f"Type-II's {what}: counts without and with it (issue 59)"), "",
             f"Split fixed before timing: tuning {', '.join(SPLIT['tuning'] + MULTICLASS_SPLIT['tuning'])}; held out "
             f"{', '.join(SPLIT['heldout'] + MULTICLASS_SPLIT['heldout'])}. Work = outer + inner CVI steps + theta "
             "evaluations (each about one O(N^3) factorisation or gradient). Objective: MAP-II objective with minus "
             "without; theta: largest absolute difference; log loss in nats on 1,000 test rows. Walls (s) at the "
             "load of the run, for reading only.", "",
             "| half | family | N | K | noise | without: outer + inner (backtracks) / evaluations | with | stops | "
             "work with / without | objective with - without | max abs theta diff | log loss without / with | "
             "wall without / with |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    tot: dict[tuple[str, bool], list[float]] = {}
    for r in sorted(rows.values(), key=lambda r: (r["half"] != "tuning", r["K"] > 2, r["family"], r["N"], r["K"],
                                                  r["level"])):
        a, b = r["without"], r["with"]
        t = tot.setdefault((r["half"], r["K"] > 2), [0.0, 0.0])
        t[0], t[1] = t[0] + work(a), t[1] + work(b)
        dth = max(abs(x - y) for x, y in zip(a["theta"], b["theta"]))
        lines.append(f"| {r['half']} | {r['family']} | {r['N']} | {r['K']} | {r['level']} | "
                     f"{a['outer_steps']} + {a['inner_steps']} ({a['backtracks']}) / {a['evaluations']} | "
                     f"{b['outer_steps']} + {b['inner_steps']} ({b['backtracks']}) / {b['evaluations']} | "
                     f"{b['stops']} | {work(b) / work(a):.2f} | {b['objective'] - a['objective']:+.1e} | {dth:.1e} | "
                     f"{a['log_loss']:.4f} / {b['log_loss']:.4f} | {a['wall_s']:.2f} / {b['wall_s']:.2f} |")
    lines += ["", "Totals (work with / without): " + "; ".join(
        f"{h} {'multi-class' if mc else 'binary'} {v[1]:.0f} / {v[0]:.0f} = {v[1] / v[0]:.2f}"
        for (h, mc), v in sorted(tot.items())), ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--half", choices=["tuning", "heldout", "all"], default="tuning")
    p.add_argument("--sizes", nargs=1, type=int, default=[500], help="binary N")
    p.add_argument("--name", default="classification_resolution")
    p.add_argument("--kinds", nargs="+", choices=["binary", "multiclass"], default=["binary", "multiclass"])
    p.add_argument("--value", type=float, default=None, help="the value of a setting that has one (coarse_adaptive)")
    p.add_argument("--setting", choices=["resolution", "fine_fixed", "between_runs", "coarse_adaptive"],
                   default="resolution",
                   help="the rule compared: the resolution stop, (fine_fixed) the coarse phase as the last with "
                        "the fixed rule (multi-class cases with K > 3 only), or (between_runs) phases back to back "
                        "without the engine's CVI run between them, or (coarse_adaptive) the coarse phase's inner "
                        "tolerance from each trial point's first-order change")
    a = p.parse_args()
    if a.value is not None:
        VALUE[a.setting] = a.value
    torch.set_num_threads(1)
    path = RESULTS / f"{a.name}.json"
    rows: dict[str, Any] = json.loads(path.read_text())["data"]["rows"] if path.exists() else {}
    for fam, n, k, lv in cases(a.half, a.sizes[0], tuple(a.kinds)):
        if a.setting == "fine_fixed" and k <= 3:
            continue
        data = binary_data(fam, n, lv) if k == 2 else multiclass_data(fam, n, k, lv)
        row = {"family": fam, "half": half_of(fam), "N": n, "K": k, "level": lv,
               "without": fit(data, False, a.setting), "with": fit(data, True, a.setting)}
        rows[f"{fam}/{n}/{k}/{lv}"] = row
        print(fam, n, k, lv, {x: row["without"][x] for x in ("evaluations", "inner_steps", "objective")},
              {x: row["with"][x] for x in ("evaluations", "inner_steps", "objective")}, flush=True)
        write(a.name, report(rows, a.setting) + "\n", {"rows": rows, "setting": a.setting})


if __name__ == "__main__":
    main()
