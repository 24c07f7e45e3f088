"""The closed-form log joint's kept buffers and cache-sized chunks (``gpvi.models.lean_joint``: ``_buffers``,
``CHUNK_BYTES``) against one pass into fresh tensors, as before.

From about 200 points a call's ``N x N`` temporaries are megabytes. glibc serves them from memory it maps afresh
whenever it has given its heap's top back to the system (``gpvi/allocator.py``), and a large batch's matrices no
longer fit the processor's caches: on Boston (N = 455) a batch of 128 cost more per theta than one theta alone.

* ``chunk`` (decides ``CHUNK_BYTES``): per-theta wall of value + gradient, and of the value alone, for 64 thetas
  evaluated in chunks of 1-64, on Boston's first N training rows, N = 100, 200, 300, 455 (RBF-ARD, D = 15), the
  buffers kept; the chunk sizes interleaved within each of ``--repeats`` rounds, medians. The rule (chunks of at
  most ``CHUNK_BYTES`` a matrix) was read off these rows;
* ``ab`` (held out: other data, kernels and sizes, none used to choose the rule): the library as it is ("new")
  against one pass into fresh tensors ("old": ``_buffers`` patched to return None, ``_chunk`` None), alternated
  ``--repeats`` times in one process, per-theta medians, for batches of 1, 4, 32 and 128 thetas (value + gradient)
  and 128 (value alone); values checked equal bit for bit, gradients' largest relative difference reported;
* ``small`` (decides ``WORKSPACE_MIN_BYTES``): per-call wall at N = 14 (``small_data``'s model) and Boston's first
  56-455 rows, batches of 1 and 4: one pass into fresh tensors, the buffers at every size, and the library;
* ``nuts``: ``gpvi.NUTS(num_chains=2, num_warmup=60, num_draws=40, seed=1)`` on Boston, old and new alternated
  ``--nuts-repeats`` times in one process: wall, per gradient, page faults per gradient, and the draws compared.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.lean_workspace [--repeats 5] [--nuts-repeats 2]
[--sections chunk ab small nuts]``.
Results: ``benchmarks/studies/results/lean_workspace.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
import warnings
from typing import Any

import gpytorch
import torch

import gpvi
import gpvi.models.lean_joint as lj
from benchmarks.small_data import tiny_model
from benchmarks.studies._common import OWN, header, machine_info, median_time, write

F64 = dict(dtype=torch.float64)


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class _Old:
    """One pass into fresh tensors (the library before the buffers and chunks) while active."""

    def __init__(self, lean: Any) -> None:
        self.lean = lean

    def __enter__(self):
        self.chunk, self.buffers = self.lean._chunk, lj._buffers
        self.lean._chunk, lj._buffers = None, (lambda *args: None)

    def __exit__(self, *exc):
        self.lean._chunk, lj._buffers = self.chunk, self.buffers


def _boston(n: int | None = None) -> Any:
    ds = gpvi.datasets.load_boston(seed=0)
    X, y = (ds.X_train, ds.y_train) if n is None else (ds.X_train[:n], ds.y_train[:n])
    return gpvi.GPRegression(X, y)


def _synthetic(n: int, d: int, kernel: Any, seed: int) -> Any:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, **F64) * 4.0
    y = torch.sin(X.sum(-1)) + 0.2 * torch.randn(n, generator=g, **F64)
    return gpvi.GPRegression(X, y, kernel=kernel)


def _thetas(model: Any, s: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return model.initial_theta() + 0.3 * torch.randn(s, model.dim, generator=g, **F64)


def _per_theta(fn, total: int, repeats: int) -> float:
    """Median ms per theta of ``fn()``, which evaluates ``total`` thetas (one warm-up call)."""
    return 1000.0 * median_time(fn, repeats=repeats)[0] / total


def section_chunk(repeats: int) -> list[dict[str, Any]]:
    rows = []
    for n in (100, 200, 300, 455):
        model = _boston(n)
        lean = model.closed_form
        th = _thetas(model, 64)
        saved = lean._chunk
        lean._chunk = None                     # chunks chosen here, by splitting the batch by hand
        chunks = (1, 2, 4, 8, 16, 64)
        times: dict[tuple[int, bool], list[float]] = {(c, g): [] for c in chunks for g in (True, False)}
        try:
            for _ in range(repeats):           # the chunk sizes interleaved within each repeat
                for c in chunks:
                    parts = th.split(c)
                    for grad in (True, False):
                        times[c, grad].append(_per_theta(lambda: [lean.log_joint(p, grad=grad) for p in parts], 64, 1))
        finally:
            lean._chunk = saved
        for c in chunks:
            rows.append({"n": n, "chunk": c, "mib": c * n * n * 8 / 2**20, "grad_ms": statistics.median(times[c, True]),
                         "value_ms": statistics.median(times[c, False])})
            print(rows[-1], flush=True)
    return rows


def _held_out() -> list[tuple[str, Any]]:
    bodyfat = gpvi.datasets.load_bodyfat(seed=0)
    pendulum = gpvi.datasets.load_pendulum(seed=0)
    sk = gpytorch.kernels.ScaleKernel
    return [
        ("Boston, all 455 rows (RBF-ARD)", _boston()),
        ("Bodyfat, training split (RBF-ARD)", gpvi.GPRegression(bodyfat.X_train, bodyfat.y_train)),
        ("pendulum, 315 rows (RBF-ARD)", gpvi.GPRegression(pendulum.X_train, pendulum.y_train)),
        ("synthetic N = 150, d = 4, Matern 5/2 ARD", _synthetic(150, 4, sk(gpytorch.kernels.MaternKernel(
            nu=2.5, ard_num_dims=4)), 1)),
        ("synthetic N = 700, d = 3, RBF + Matern 3/2", _synthetic(700, 3, sk(gpytorch.kernels.RBFKernel(
            ard_num_dims=3)) + sk(gpytorch.kernels.MaternKernel(nu=1.5)), 2)),
        ("synthetic N = 1,000, d = 2, RQ ARD", _synthetic(1000, 2, sk(gpytorch.kernels.RQKernel(ard_num_dims=2)), 3)),
    ]


def section_ab(repeats: int) -> list[dict[str, Any]]:
    rows = []
    for name, model in _held_out():
        lean = model.closed_form
        big = 128 if model.num_data <= 500 else 32           # a one-pass batch of 128 at N = 1,000: 1 GB a matrix
        for s, grad in [(1, True), (4, True), (32, True)] + ([(128, True)] if big == 128 else []) + [(big, False)]:
            th = _thetas(model, s, seed=s)
            with _Old(lean):
                v0, g0 = lean.log_joint(th, grad=grad)
            v1, g1 = lean.log_joint(th, grad=grad)
            old, new = [], []
            for _ in range(repeats):
                with _Old(lean):
                    old.append(_per_theta(lambda: lean.log_joint(th, grad=grad), s, 3 if s > 4 else 10))
                new.append(_per_theta(lambda: lean.log_joint(th, grad=grad), s, 3 if s > 4 else 10))
            rel = 0.0 if g0 is None else float(((g1 - g0).abs() / g0.abs().clamp_min(1e-300)).max())
            rows.append({"problem": name, "n": model.num_data, "S": s, "grad": grad, "chunk": lean._chunk,
                         "old_ms": statistics.median(old), "new_ms": statistics.median(new),
                         "values_equal": bool(torch.equal(v0, v1)), "grad_max_rel_diff": rel})
            print(rows[-1], flush=True)
    return rows


def section_small(repeats: int) -> list[dict[str, Any]]:
    """Per-call wall of one pass into fresh tensors (old), the buffers at every size (``WORKSPACE_MIN_BYTES`` 1) and
    the library, interleaved in each of ``repeats`` rounds of 100 calls: where the buffers pay and where they cost."""
    rows = []
    for n in (14, 56, 100, 160, 200, 455):
        model = tiny_model() if n == 14 else _boston(n)
        for s in (1, 4):
            th = model.initial_theta().expand(s, -1).clone()
            saved = lj.WORKSPACE_MIN_BYTES
            lj.WORKSPACE_MIN_BYTES = 1
            forced = lj.LeanLogJoint.from_model(model)            # built with the buffers at every batch size
            lj.WORKSPACE_MIN_BYTES = saved
            lean = model.closed_form
            times: dict[str, list[float]] = {"old": [], "forced": [], "library": []}
            calls = 100 if n < 400 else 20
            def timed(ev: Any) -> float:
                return _per_theta(lambda: [ev.log_joint(th) for _ in range(calls)], calls, 1)

            for r in range(repeats):
                for mode in (("old", "forced", "library") if r % 2 == 0 else ("library", "forced", "old")):
                    if mode == "old":
                        with _Old(lean):
                            times[mode].append(timed(lean))
                    elif mode == "forced":
                        lj.WORKSPACE_MIN_BYTES = 1
                        try:
                            times[mode].append(timed(forced))
                        finally:
                            lj.WORKSPACE_MIN_BYTES = saved
                    else:
                        times[mode].append(timed(lean))
            rows.append({"n": n, "S": s, "mib": s * n * n * 8 / 2**20,
                         **{f"{k}_ms": statistics.median(v) for k, v in times.items()}})
            print(rows[-1], flush=True)
    return rows


def _nuts(model: Any) -> dict[str, Any]:
    f0, t0 = _faults(), time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mc = gpvi.NUTS(num_chains=2, num_warmup=60, num_draws=40, seed=1, progress_bar=False).run(model)
    wall, ev = time.perf_counter() - t0, sum(mc.info["num_evaluations"])
    return {"wall": wall, "evals": ev, "ms_per_grad": 1000 * wall / ev, "faults_per_grad": (_faults() - f0) / ev,
            "draws": mc.draws}


def section_nuts(repeats: int) -> list[dict[str, Any]]:
    model = _boston()
    lean = model.closed_form
    rows = []
    for r in range(repeats):
        for mode in (("old", "new") if r % 2 == 0 else ("new", "old")):
            if mode == "old":
                with _Old(lean):
                    out = _nuts(model)
            else:
                out = _nuts(model)
            rows.append({"mode": mode, "repeat": r, **out})
    first = rows[0]["draws"]
    same = all(torch.equal(torch.as_tensor(r["draws"]), torch.as_tensor(first)) for r in rows)
    for r in rows:
        del r["draws"]
        print(r, flush=True)
    return [{"same_draws": same}] + rows


def render(data: dict[str, Any]) -> str:
    out = [header("The closed-form log joint's kept buffers and cache-sized chunks"), ""]
    for k, r in data.get("runs", {}).items():
        out.append(f"- section {k}: ended {r['date']}, load {r['load']}, {r['repeats']} repeats")
    out.append("")
    if "chunk" in data:
        out += ["## chunk: per-theta ms for 64 thetas in chunks (Boston rows, buffers kept; decides CHUNK_BYTES)", "",
                "Medians of the interleaved rounds.", "",
                "| N | chunk | MiB a chunk's matrix | value + gradient (ms / theta) | value (ms / theta) |",
                "|---|---|---|---|---|"]
        out += [f"| {r['n']} | {r['chunk']} | {r['mib']:.2f} | {r['grad_ms']:.3f} | {r['value_ms']:.3f} |"
                for r in data["chunk"]]
        out.append("")
    if "ab" in data:
        out += ["## ab (held out): old = one pass into fresh tensors, new = the library; per-theta medians", "",
                "| problem | N | batch | what | chunk | old (ms / theta) | new (ms / theta) | new / old | values equal "
                "| gradients' max rel. diff |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in data["ab"]:
            out.append(f"| {r['problem']} | {r['n']} | {r['S']} | {'value + gradient' if r['grad'] else 'value'} | "
                       f"{r['chunk'] or '-'} | {r['old_ms']:.3f} | {r['new_ms']:.3f} | {r['new_ms'] / r['old_ms']:.2f} "
                       f"| {'yes' if r['values_equal'] else 'NO'} | {r['grad_max_rel_diff']:.1e} |")
        out.append("")
    if "small" in data:
        out += ["## small: ms per call, one pass into fresh tensors (old), the buffers at every size (forced) and the "
                "library (buffers from WORKSPACE_MIN_BYTES = 1 MiB a matrix), interleaved, medians", "",
                "| N | batch | MiB a matrix | old | forced | library | forced / old | library / old |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['n']} | {r['S']} | {r['mib']:.2f} | {r['old_ms']:.3f} | {r['forced_ms']:.3f} | "
                f"{r['library_ms']:.3f} | {r['forced_ms'] / r['old_ms']:.2f} | {r['library_ms'] / r['old_ms']:.2f} |"
                for r in data["small"]]
        out.append("")
    if "nuts" in data:
        same, rows = data["nuts"][0]["same_draws"], data["nuts"][1:]
        out += ["## nuts: gpvi.NUTS on Boston (2 chains x (60 + 40), seed 1), old and new alternated", "",
                f"Draws the same in every run: {'yes' if same else 'NO'}.", "",
                "| run | mode | wall (s) | gradients | ms / gradient | page faults / gradient |",
                "|---|---|---|---|---|---|"]
        out += [f"| {r['repeat']} | {r['mode']} | {r['wall']:.1f} | {r['evals']} | {r['ms_per_grad']:.3f} | "
                f"{r['faults_per_grad']:.0f} |" for r in rows]
        med = {m: statistics.median(r["ms_per_grad"] for r in rows if r["mode"] == m) for m in ("old", "new")}
        out += ["", f"Median ms / gradient: old {med['old']:.3f}, new {med['new']:.3f} "
                f"(new / old {med['new'] / med['old']:.2f})."]
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--nuts-repeats", type=int, default=2)
    p.add_argument("--sections", nargs="*", default=["chunk", "ab", "small", "nuts"])
    a = p.parse_args()
    torch.set_num_threads(1)
    path = OWN / "lean_workspace.json"
    data: dict[str, Any] = json.loads(path.read_text())["data"] if path.exists() else {}   # other sections kept
    for s in a.sections:
        data[s] = {"chunk": section_chunk, "ab": section_ab, "small": section_small, "nuts": section_nuts}[s](
            a.nuts_repeats if s == "nuts" else a.repeats)
        info = machine_info()
        data.setdefault("runs", {})[s] = {"date": info["date"], "load": info["load_avg_1_5_15"],
                                          "repeats": a.nuts_repeats if s == "nuts" else a.repeats}
    write("lean_workspace", render(data), data)


if __name__ == "__main__":
    main()
