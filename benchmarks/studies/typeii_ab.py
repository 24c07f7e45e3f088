"""A binary type-II fit under two commits of gpvi, alternated in fresh processes (issue 59).

Extracts ``gpvi/`` of ``--before`` and ``--after`` (``git archive``) into a temporary folder and fits
``GPClassifier(random_state=0)`` on a family of :mod:`benchmarks.heldout_families` in a new process per fit,
alternating before / after ``--repeats`` times, one thread; each process first fits N = 200 of the same family
untimed (imports, first calls), then times the fit. Records the walls, the 1-min load before each fit, the objective
and the counts (theta evaluations, inner steps): what a change that keeps the counts saves, measured under the same
load for both (the walls against scikit-learn of :mod:`benchmarks.classification_heldout` move with its own wall).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.typeii_ab --before bb2f6ae --after HEAD
--family clf2 --size 2000 --noise 0 --repeats 3 [--name NAME]``. Results: ``benchmarks/studies/results/<name>``
(default ``typeii_ab``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._common import header, write

OUT = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, os, sys, time, warnings
sys.path.insert(0, sys.argv[1]); sys.path.insert(1, sys.argv[2])
import gpvi
assert gpvi.__file__.startswith(sys.argv[1]), gpvi.__file__
from benchmarks.heldout_families import binary_data
from gpvi import GPClassifier
warnings.simplefilter("ignore")
fam, n, lvl = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
Xw, yw, _, _ = binary_data(fam, 200, lvl)
GPClassifier(random_state=0).fit(Xw, yw)
X, y, _, _ = binary_data(fam, n, lvl)
load = os.getloadavg()[0]
t = time.perf_counter()
clf = GPClassifier(random_state=0).fit(X, y)
wall = time.perf_counter() - t
i = clf.posterior_.info
print(json.dumps({"wall_s": wall, "load": load, "objective": i["objective"], "evaluations": i["theta_evaluations"],
                  "inner_steps": i["inner_steps"]}))
"""


def extract(commit: str, folder: Path) -> str:
    """``gpvi/`` of ``commit`` under ``folder``; returns its full hash."""
    full = subprocess.run(["git", "rev-parse", commit], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout.strip()
    folder.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", full, "gpvi"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return full


def fit(tree: Path, family: str, n: int, level: int) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(ROOT), family, str(n), str(level)],
                         check=True, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--family", default="clf2")
    ap.add_argument("--size", type=int, default=2000)
    ap.add_argument("--noise", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", default="typeii_ab")
    args = ap.parse_args()
    rows: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {k: Path(tmp) / k for k in rows}
        commits = {k: extract(getattr(args, k), trees[k]) for k in rows}
        for r in range(args.repeats):
            for k in rows:
                rows[k].append(fit(trees[k], args.family, args.size, args.noise))
                print(k, r, json.dumps(rows[k][-1]), flush=True)
    med = {k: statistics.median(x["wall_s"] for x in v) for k, v in rows.items()}
    pairs = [a["wall_s"] / b["wall_s"] for b, a in zip(rows["before"], rows["after"])]
    md = header("A binary type-II fit under two commits, alternated in fresh processes (issue 59)")
    md += (f"\n{args.family}, N = {args.size}, noise level {args.noise}; {args.repeats} alternated repeats (before "
           f"first), one thread, each process warmed up by an untimed N = 200 fit. Walls in s; load: the 1-min "
           f"average before each fit.\n\n| code | commit | walls (s) | median (s) | load | objective | evaluations / "
           f"inner steps |\n|---|---|---|---|---|---|---|\n")
    for k, v in rows.items():
        walls = ", ".join(f"{x['wall_s']:.1f}" for x in v)
        md += (f"| {k} | {commits[k][:7]} | {walls} | {med[k]:.1f} | "
               f"{min(x['load'] for x in v):.1f}-{max(x['load'] for x in v):.1f} | {v[0]['objective']:.8f} | "
               f"{v[0]['evaluations']} / {v[0]['inner_steps']} |\n")
    md += (f"\nAfter / before: medians {med['after'] / med['before']:.3f}; pairs "
           f"{', '.join(f'{p:.3f}' for p in pairs)}.\n")
    write(args.name, md, {"args": vars(args), "commits": commits, "rows": rows, "pairs": pairs}, folder=OUT)


if __name__ == "__main__":
    main()
