"""One EP evaluation of the fully Bayesian classifier's q stage, before and after issue 59's fifth pass (tuning
families only): the same calls replayed on both versions of ``gpvi/numerics/ep.py``, and the site bank's intercept
weights by QR against the pseudo-inverse they replace.

The fifth pass removes work inside binary EP's sweeps without changing its answer: the rows still running in a sweep
are a view of the kernel matrices where they are consecutive (the one row left of two at N = 400, where the chunk
rule runs 2 rows per call) instead of a gathered copy, and the gradient :math:`\\tfrac12(\\mathbf b\\mathbf b^\\top -
\\tilde S^{1/2}B^{-1}\\tilde S^{1/2})` is scaled in two passes over :math:`B^{-1}` instead of three (the factor
:math:`-\\tfrac12` folded into :math:`\\tilde S^{1/2}`: exact, a power of two). And the site bank
(:mod:`gpvi.inference.cvi.ep_starts`) takes its quadratic's intercept from a QR factorisation and one triangular
solve instead of the SVD of ``torch.linalg.pinv`` (:func:`gpvi.inference.cvi.ep_starts.intercept_weights`).

Protocol, per case (``--cases``, tuning half of ``benchmarks/heldout_families.py`` only, the higher noise level):
one ``GPClassifier(random_state=0, hyperparameters="bayes")`` fit, one thread, after a warm-up fit. During it

* the first ``--calls`` binary EP calls made from a bank start (the q stage's evaluations) are recorded (kernel
  matrices, starting sites, settings) and afterwards replayed on today's ``expectation_propagation`` and on the one
  of ``--before`` (``git show <commit>:gpvi/numerics/ep.py``, loaded as a module), alternated, ``--repeats`` times
  each (least wall per call, summed); every field of every result is compared (largest absolute difference);
* every call of ``intercept_weights`` also computes the pseudo-inverse's row: the largest relative difference of
  the weights, the range of the designs' condition numbers, the rows that fell back to the pseudo-inverse, and the
  wall of both (summed over the fit's calls).

Run: ``OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.studies.ep_sweep_lean --label h59ep``; writes
``benchmarks/studies/results/ep_sweep_lean_<label>.{md,json}``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from benchmarks.heldout_families import SPLIT, binary_data
from benchmarks.studies._common import header, write

ROOT = Path(__file__).resolve().parents[2]


def old_ep(commit: str) -> Any:
    """``gpvi/numerics/ep.py`` at ``commit`` as a module (relative imports made absolute)."""
    src = subprocess.run(["git", "show", f"{commit}:gpvi/numerics/ep.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    src = (src.replace("from .anderson", "from gpvi.numerics.anderson")
           .replace("from .quadrature", "from gpvi.numerics.quadrature")
           .replace("from ..linalg", "from gpvi.linalg").replace("from ..validation", "from gpvi.validation"))
    path = Path(tempfile.mkdtemp()) / "ep_before.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("ep_before", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ep_before"] = mod
    spec.loader.exec_module(mod)
    return mod


def case(name: str, calls: int, repeats: int, before: Any) -> dict[str, Any]:
    from gpvi import GPClassifier
    from gpvi.inference.cvi import ep_evidence, ep_starts
    from gpvi.numerics import ep as ep_now

    fam, n = name.split("/")
    if fam not in SPLIT["tuning"]:
        raise SystemExit(f"{fam} is not in the tuning half: this study runs tuning families only")
    Xtr, ytr, _, _ = binary_data(fam, int(n), 1)
    recs: list[dict[str, Any]] = []
    bank = {"rows": 0, "diff": 0.0, "cond_min": float("inf"), "cond_max": 0.0, "fallback": 0, "qr_s": 0.0,
            "pinv_s": 0.0}
    run_ep, weights = ep_evidence.expectation_propagation, ep_starts.intercept_weights

    def recording(K: torch.Tensor, y: torch.Tensor, lik: Any, **kw: Any) -> Any:
        if len(recs) < calls and kw.get("tau") is not None and K.shape[0] > 1:
            recs.append({"K": K.clone(), "y": y, "lik": lik,
                         **{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}})
        return run_ep(K, y, lik, **kw)

    def compared(X: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        u = weights(X)
        t1 = time.perf_counter()
        ref = torch.linalg.pinv(X)[:, 0, :]
        t2 = time.perf_counter()
        R = torch.linalg.qr(X)[1].diagonal(dim1=-2, dim2=-1).abs()
        c = torch.linalg.cond(X)
        bank.update(rows=bank["rows"] + X.shape[0], qr_s=bank["qr_s"] + t1 - t0, pinv_s=bank["pinv_s"] + t2 - t1,
                    diff=max(bank["diff"], float(((u - ref).abs().amax(-1) / ref.abs().amax(-1)).max())),
                    cond_min=min(bank["cond_min"], float(c.min())), cond_max=max(bank["cond_max"], float(c.max())),
                    fallback=bank["fallback"] + int((~(R.amin(-1) > ep_starts.RANK_RTOL * R.amax(-1))).sum()))
        return u

    load0 = os.getloadavg()[0]
    ep_evidence.expectation_propagation, ep_starts.intercept_weights = recording, compared
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            clf = GPClassifier(random_state=0, hyperparameters="bayes").fit(Xtr, ytr)
            wall = time.perf_counter() - t0
    finally:
        ep_evidence.expectation_propagation, ep_starts.intercept_weights = run_ep, weights
    best = {"before": [float("inf")] * len(recs), "now": [float("inf")] * len(recs)}
    diff, sweeps = 0.0, 0
    for i, r in enumerate(recs):
        kw = {k: v for k, v in r.items() if k not in ("K", "y", "lik")}
        out = {}
        for rep in range(repeats):
            order = (("before", before), ("now", ep_now)) if rep % 2 == 0 else (("now", ep_now), ("before", before))
            for label, mod in order:
                t0 = time.perf_counter()
                out[label] = mod.expectation_propagation(r["K"], r["y"], r["lik"], **kw)
                best[label][i] = min(best[label][i], time.perf_counter() - t0)
        sweeps += int(out["now"].sweeps.sum())
        for a, b in zip(out["before"], out["now"]):
            if a is None or b is None:
                assert a is None and b is None
                continue
            if not a.dtype.is_floating_point:
                diff = max(diff, float("inf") if bool((a != b).any()) else 0.0)
                continue
            fin = torch.isfinite(a)
            diff = max(diff, 0.0 if torch.equal(fin, torch.isfinite(b)) else float("inf"),
                       float((a[fin] - b[fin]).abs().max()) if bool(fin.any()) else 0.0)
    info = clf.posterior_.info
    return {"case": name, "N": int(n), "D": len(clf.posterior_.mean), "wall_s": wall, "q_s": info["q_time_s"],
            "calls": len(recs), "rows": sum(r["K"].shape[0] for r in recs), "sweeps": sweeps,
            "before_s": sum(best["before"]), "now_s": sum(best["now"]), "max_abs_diff": diff, "bank": bank, "load": [load0, os.getloadavg()[0]]}


def report(rows: list[dict[str, Any]], label: str, before: str) -> str:
    lines = [header(f"One EP evaluation of the q stage before / after issue 59's fifth pass ({label})"), "",
             f"Protocol in the docstring of `benchmarks/studies/ep_sweep_lean.py` (tuning families only; before: "
             f"`gpvi/numerics/ep.py` at {before}). Replay: the first recorded EP calls from a bank start, least wall "
             "of each over the repeats, summed; difference: largest absolute difference of any field of any row "
             "(0: bit for bit). Bank: every `intercept_weights` call of the fit against `pinv(X)[:, 0, :]`.", "",
             "| case | D | fit wall s (q s) | replayed calls (rows, sweeps) | EP before s | EP after s | change | "
             "largest difference | bank rows | weights: largest relative difference | cond(X) | pinv fallbacks | "
             "bank intercept: QR s / pinv s | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r["bank"]
        lines.append(f"| {r['case']} | {r['D']} | {r['wall_s']:.2f} ({r['q_s']:.2f}) | {r['calls']} ({r['rows']}, "
                     f"{r['sweeps']}) | {r['before_s']:.3f} | {r['now_s']:.3f} | "
                     f"{100 * (r['now_s'] / r['before_s'] - 1):+.1f}% | {r['max_abs_diff']:.1e} | {b['rows']} | "
                     f"{b['diff']:.1e} | {b['cond_min']:.0f}-{b['cond_max']:.0f} | {b['fallback']} | "
                     f"{b['qr_s']:.3f} / {b['pinv_s']:.3f} | {r['load'][0]:.2f}-{r['load'][1]:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["xor/200", "xor/400", "spirals/200", "spirals/400",
                                                   "checkerboard/200", "checkerboard/400", "clf8/100"])
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", default="711a5b6", help="the commit whose gpvi/numerics/ep.py is 'before'")
    ap.add_argument("--label", default="h59ep")
    a = ap.parse_args()
    torch.set_num_threads(1)
    before = old_ep(a.before)
    from gpvi import GPClassifier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Xw, yw, _, _ = binary_data("xor", 40, 0)
        GPClassifier(random_state=0, hyperparameters="bayes").fit(Xw, yw)          # warm-up, untimed
    rows: list[dict[str, Any]] = []
    for name in a.cases:
        rows.append(case(name, a.calls, a.repeats, before))
        print({k: v for k, v in rows[-1].items()}, flush=True)
        write(f"ep_sweep_lean_{a.label}", report(rows, a.label, a.before), {"args": vars(a), "rows": rows})


if __name__ == "__main__":
    main()
