"""The first fit in a fresh process, with and without gpvi's malloc thresholds (``gpvi/allocator.py``).

Each workload runs in a new Python process (the first fit after ``import gpvi``, as a user's script or notebook
runs it) with ``GPVI_MALLOC_THRESHOLDS=1`` (glibc's ``M_MMAP_THRESHOLD`` 32 MiB and ``M_TRIM_THRESHOLD`` 64 MiB set at
import; opt-in since issue 58, the ``gpvi`` command's default) and ``=0`` (glibc's defaults), the order alternating from workload to
workload; the fit's wall (imports and data excluded) and a digest of its result (which must match).

Workloads: the default multi-class fully Bayesian fit on ``synth4`` (K = 4, N = 100; ``benchmarks/multiclass_bayes.py``),
the default ``GPClassifier`` type-II fit on the binary set of ``benchmarks/classification_scale.py`` at N = 1,500 and
on its 3-class set at N = 1,000, and ``gpvi.infer`` on Bodyfat's training split (seed 0; ``benchmarks/nuts_fidelity.py``'s model).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.malloc_thresholds [--repeats 1]`` (about 8 minutes here).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.studies._common import header, write

ROOT = Path(__file__).resolve().parents[2]

_CLASSIFIER = """
from benchmarks.classification_scale import make_data
from gpvi.sklearn import GPClassifier
X, y, Xt, yt = make_data("{task}", {n})
t0 = time.perf_counter()
c = GPClassifier(random_state=0).fit(X, y)
wall = time.perf_counter() - t0
digest = [round(float(v), 8) for v in c.theta_]
"""
"""A type-II ``GPClassifier`` fit on ``benchmarks/classification_scale.py``'s ``task`` set with ``n`` rows."""

WORKLOADS = {
    "multi-class fully Bayesian, synth4 (K = 4, N = 100)": """
from benchmarks.multiclass_bayes import synthetic
from gpvi.models.multiclass import GPMulticlass
from gpvi.inference.cvi.bayes import FullyBayesianCVI
Xtr, Xte, ytr, yte, _ = synthetic("synth4")
model = GPMulticlass(Xtr, ytr)
t0 = time.perf_counter()
fb = FullyBayesianCVI(seed=0, evidence="ep").run(model)
wall = time.perf_counter() - t0
digest = [round(float(v), 8) for v in fb.mean]
""",
    "GPClassifier type-II, binary, N = 1,500": _CLASSIFIER.format(task="binary", n=1500),
    "GPClassifier type-II, 3 classes, N = 1,000": _CLASSIFIER.format(task="3class", n=1000),
    "gpvi.infer, Bodyfat (N = 252)": """
from benchmarks.nuts_fidelity import model_of
model = model_of("bodyfat")
t0 = time.perf_counter()
post = gpvi.infer(model, seed=0, progress_bar=False)
wall = time.perf_counter() - t0
digest = [round(float(v), 6) for v in post.mean]
""",
}


def run_one(code: str, setting: str) -> dict:
    prog = ("import time, json, warnings\nwarnings.simplefilter('ignore')\nimport gpvi, gpvi.allocator\n" + code +
            "\nprint('RESULT', json.dumps({'wall': wall, 'digest': digest, 'applied': gpvi.allocator.applied}))\n")
    env = {**os.environ, "GPVI_MALLOC_THRESHOLDS": setting}
    out = subprocess.run([sys.executable, "-c", prog], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=None, help="workload names containing these words")
    args = ap.parse_args()
    rows = []
    for i, (name, code) in enumerate(WORKLOADS.items()):
        if args.only and not any(w in name for w in args.only):
            continue
        res: dict[str, list] = {"1": [], "0": []}
        for r in range(args.repeats):
            for setting in (("1", "0") if (i + r) % 2 == 0 else ("0", "1")):
                res[setting].append(run_one(code, setting))
                print(name, setting, res[setting][-1]["wall"], flush=True)
        on, off = (statistics.median(x["wall"] for x in res[s]) for s in ("1", "0"))
        same = all(x["digest"] == res["1"][0]["digest"] for s in ("1", "0") for x in res[s])
        rows.append({"workload": name, "wall_set": on, "wall_default": off, "ratio": on / off, "same_result": same,
                     "runs": res})
    md = [header("The first fit in a fresh process: gpvi's malloc thresholds against glibc's defaults"), "",
          f"Each fit in a new process (imports excluded), {args.repeats} run(s) per setting, order alternating; "
          "\"set\": `GPVI_MALLOC_THRESHOLDS=1` (opt-in for the library since issue 58; the `gpvi` command sets them), "
          "\"glibc default\": `=0`.", "",
          "| workload | wall, thresholds set (s) | wall, glibc default (s) | set / default | same result |",
          "|---|---|---|---|---|"]
    md += [f"| {r['workload']} | {r['wall_set']:.1f} | {r['wall_default']:.1f} | {r['ratio']:.2f} | "
           f"{'yes' if r['same_result'] else 'NO'} |" for r in rows]
    write("malloc_thresholds", "\n".join(md) + "\n", {"rows": rows, "repeats": args.repeats})


if __name__ == "__main__":
    main()
