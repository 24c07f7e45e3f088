"""The stress suite's shared rules (``benchmarks/trust_stress.py``, issue 39): where its cache is, the seeds, the
tolerance a case is judged by, the cases seen when the rule was decided, and how a case's answer is judged and
printed. The suite (``trust_stress.py``) and its report (``trust_stress_report.py``) both import from here.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

QUICK = "--quick" in sys.argv
OUT = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--out=")), None)
NAME = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--name=")),
            "trust_stress_quick" if QUICK else "trust_stress")
"""Name of the results file and of the cache folder (``--name=NAME``: e.g. a rerun beside the committed one)."""
CACHE = Path(os.environ.get("GPVI_STRESS_CACHE") or Path.home() / ".cache" / "gpvi" / NAME)
SEEDS = [0] if QUICK else [0, 1, 2, 3, 4]
TOL_MEAN, SD_LO, SD_HI = 0.2, 0.8, 1.25
SEEN = {**{pid: range(5) for pid in ("boston-0", "bodyfat-0", "pendulum-1", "bodyfat-2", "synth-0", "synth-1",
                                     "synth-2", "synth-3", "synth-5", "synth-7", "synth-10")},
        "synth-4": range(2), "synth-8": range(1)}
"""The (problem, seeds) whose cases had run when the check's second opinion was chosen: every rule decision so far
saw them (held-out half included); the cases outside are held out from every decision ("unseen")."""


def fidelity(mean: Any, sd: Any, ref: dict[str, Any]) -> dict[str, Any]:
    """The answer (``mean``, ``sd``: tensors or arrays) against ``ref``'s means and sds: within the tolerance?"""
    rm, rs = np.asarray(ref["mean"]), np.asarray(ref["sd"])
    m, s = (np.asarray(v.detach().cpu() if isinstance(v, torch.Tensor) else v, dtype=float) for v in (mean, sd))
    dm, sr = np.abs(m - rm) / rs, s / rs
    ok = bool(dm.max() <= TOL_MEAN and sr.min() >= SD_LO and sr.max() <= SD_HI)
    return {"max_dmean_sd": float(dm.max()), "sd_ratio_min": float(sr.min()), "sd_ratio_max": float(sr.max()),
            "within": ok, "dmean_sd": dm.tolist(), "sd_ratio": sr.tolist()}


def _cell(c: dict[str, Any]) -> str:
    mark = "ok" if c["within"] else ("FLAGGED" if not c["trusted"] else "**MISS**")
    if c["within"] and not c["trusted"]:
        mark = "ok (flagged)"
    if mark == "**MISS**" and c["answer"] == "nuts":
        mark = "**MISS** (mixed NUTS vs the reference)"
    kh = "" if not math.isfinite(c["answer_khat"]) else f" k̂ {c['answer_khat']:.2f}"
    return (f"{c['answer']}{kh} ESS {c['answer_ess']:.0f} · Δ {c['max_dmean_sd']:.2f} · "
            f"sd {c['sd_ratio_min']:.2f}–{c['sd_ratio_max']:.2f} · {c['wall']:.0f} s · {mark}")
