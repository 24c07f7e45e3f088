"""Side checks of the fully Bayesian classifier's importance step (issue 59, item 3), each small, tuning half only
(``--sections``, in this order by default):

* ``import``: seconds of ``import arviz`` after ``import gpvi`` in a fresh process (what the first accepted fit of
  a process pays for PSIS), three processes;
* ``chunk``: rows per EP call in the step's draws (:class:`gpvi.inference.cvi.importance.ImportanceGaussian`'s
  ``chunk``: 4, 16 (the default), 64) on xor at N = 100 and 400, seed 0, two repeats: the q stage's wall and EP
  sweeps;
* ``bank``: after a rejected step, S&K with the site bank emptied (the default: S&K's fit bit for bit) against the
  bank kept with the step's entries, on tuning fits the step rejects (Ripley seed 1, checkerboard N = 200 seed 1,
  spirals N = 100 seed 0): EP sweeps, the q stage's wall and q's means;
* ``start_tol``: multi-class EP's tolerance in the EP MAP search and the Laplace stage (1e-6, the default, against
  1e-4 and 1e-3) on mc_clf with its first 3 inputs, K = 4, N = 100, the lower noise level, seeds 0-2: the stages'
  walls and q's change (means in the default's sds, |log sd ratio|, largest change of a test probability).

Run: ``OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python -m benchmarks.studies.bayes_side_checks``. Results:
``benchmarks/studies/results/bayes_side_checks_<label>.{md,json}``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import warnings
from typing import Any

import numpy as np
import torch

from benchmarks.studies._common import header, write


def _quiet_fit(fit: Any, model: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit.run(model)


def section_import() -> list[dict[str, Any]]:
    code = "import time, gpvi; t = time.perf_counter(); import arviz; print(time.perf_counter() - t)"
    return [{"section": "import", "seconds": float(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                                                  text=True, check=True).stdout)} for _ in range(3)]


def section_chunk() -> list[dict[str, Any]]:
    import gpvi
    from benchmarks.studies.bayes_psis import case_data
    from gpvi.inference.cvi import importance
    from gpvi.inference.cvi.bayes import FullyBayesianCVI

    rows, real = [], importance.ImportanceGaussian.__init__
    for case in ("xor/100", "xor/400"):
        X, y, *_ = case_data(case)
        model = gpvi.GPClassification(X, y)
        for rep in range(2):
            for chunk in (4, 16, 64):
                def init(self: Any, *a: Any, _c: int = chunk, **k: Any) -> None:
                    real(self, *a, **{**k, "chunk": _c})
                importance.ImportanceGaussian.__init__ = init
                try:
                    p = _quiet_fit(FullyBayesianCVI(seed=0), model)
                finally:
                    importance.ImportanceGaussian.__init__ = real
                rows.append({"section": "chunk", "case": case, "repeat": rep, "chunk": chunk,
                             "engine": p.info["engine"], "q_time_s": p.info["q_time_s"],
                             "sweeps": p.info["ep_counters"]["sweeps"]})
    return rows


def section_bank() -> list[dict[str, Any]]:
    import gpvi
    import gpvi.inference.cvi.ep_evidence as E
    from benchmarks.studies.bayes_psis import case_data
    from gpvi.inference.cvi.bayes import FullyBayesianCVI

    rows, real = [], E.EPEvidenceTarget.start_from_neighbours
    for case, seed in (("ripley", 1), ("checkerboard/200", 1), ("spirals/100", 0)):
        X, y, *_ = case_data(case)
        model = gpvi.GPClassification(X, y)
        for mode in ("emptied", "kept"):
            calls = [0]

            def patched(self: Any, size: int = 128) -> None:
                calls[0] += 1
                if mode == "kept" and calls[0] == 2:     # the second call: the reset after a rejected step
                    return None
                return real(self, size)
            E.EPEvidenceTarget.start_from_neighbours = patched
            try:
                p = _quiet_fit(FullyBayesianCVI(seed=seed), model)
            finally:
                E.EPEvidenceTarget.start_from_neighbours = real
            rows.append({"section": "bank", "case": case, "seed": seed, "mode": mode, "engine": p.info["engine"],
                         "accepted": (p.info["importance"] or {}).get("accepted"), "q_time_s": p.info["q_time_s"],
                         "sweeps": p.info["ep_counters"]["sweeps"], "mean": p.mean.tolist()})
    return rows


def section_start_tol() -> list[dict[str, Any]]:
    from benchmarks.heldout_families import multiclass_data
    from gpvi.inference.cvi.bayes import FullyBayesianCVI
    from gpvi.models.multiclass import GPMulticlass

    class Fit(FullyBayesianCVI):
        def __init__(self, start_tol: float, **kw: Any) -> None:
            super().__init__(**kw)
            self.start_tol = start_tol

        def _ep_start(self, bound: Any, theta_map: torch.Tensor, tol: float) -> Any:
            return super()._ep_start(bound, theta_map, self.start_tol)

    Xtr, ytr, Xte, _ = multiclass_data("mc_clf", 100, 4, 0)
    model = GPMulticlass(Xtr[:, :3], ytr)
    Xt = torch.as_tensor(Xte[:, :3], dtype=torch.float64)
    rows = []
    for seed in (0, 1, 2):
        base = None
        for tol in (1e-6, 1e-4, 1e-3):
            t0 = time.perf_counter()
            p = _quiet_fit(Fit(tol, seed=seed), model)
            wall = time.perf_counter() - t0
            m, s, pr = p.mean.numpy(), p.std.numpy(), p.predict_proba(Xt).numpy()
            base = base or (m, s, pr)
            rows.append({"section": "start_tol", "seed": seed, "tol": tol, "wall_s": wall, "engine": p.info["engine"],
                         **{k: p.info[k] for k in ("ep_map_time_s", "laplace_time_s", "q_time_s")},
                         "change_mean_sd": float(np.abs((m - base[0]) / base[1]).max()),
                         "change_log_sd": float(np.abs(np.log(s / base[1])).max()),
                         "change_p": float(np.abs(pr - base[2]).max())})
    return rows


def report(rows: list[dict[str, Any]], cmd: str) -> str:
    out = [header(f"Side checks of the importance step ({cmd})"),
           "Protocol in the docstring of `benchmarks/studies/bayes_side_checks.py` (one thread, tuning half).", ""]
    imp = [r["seconds"] for r in rows if r["section"] == "import"]
    if imp:
        out += [f"- `import arviz` after `import gpvi`, fresh processes: {', '.join(f'{v:.2f}' for v in imp)} s", ""]
    for sec, cols in (("chunk", ["case", "repeat", "chunk", "engine", "q_time_s", "sweeps"]),
                      ("bank", ["case", "seed", "mode", "engine", "accepted", "q_time_s", "sweeps", "mean"]),
                      ("start_tol", ["seed", "tol", "engine", "wall_s", "ep_map_time_s", "laplace_time_s", "q_time_s",
                                     "change_mean_sd", "change_log_sd", "change_p"])):
        rs = [r for r in rows if r["section"] == sec]
        if not rs:
            continue
        out += [f"## {sec}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in rs:
            cells = [(f"{r[c]:g}" if c == "tol" else f"{r[c]:.3f}" if isinstance(r[c], float) else
                      ", ".join(f"{v:.4f}" for v in r[c]) if isinstance(r[c], list) else str(r[c])) for c in cols]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", nargs="+", default=["import", "chunk", "bank", "start_tol"])
    p.add_argument("--label", default="h59g")
    p.add_argument("--render", action="store_true", help="rewrite the report from the stored JSON")
    a = p.parse_args()
    if a.render:
        import json
        from benchmarks.studies._common import OWN
        stored = json.loads((OWN / f"bayes_side_checks_{a.label}.json").read_text())["data"]
        cmd = "--sections " + " ".join(stored["args"]["sections"])
        write(f"bayes_side_checks_{a.label}", report(stored["rows"], cmd), stored)
        return
    torch.set_num_threads(1)
    import importlib
    importlib.import_module("arviz")                  # the fits below do not pay its import
    rows: list[dict[str, Any]] = []
    cmd = "--sections " + " ".join(a.sections)
    for sec in a.sections:
        rows += globals()[f"section_{sec}"]()
        write(f"bayes_side_checks_{a.label}", report(rows, cmd), {"args": vars(a), "rows": rows})
    print(report(rows, cmd))


if __name__ == "__main__":
    main()
