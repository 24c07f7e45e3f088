"""How a CVI step gets diag((K + S)^-1) and the type-II gradient gets P = (K + S)^-1 (issue 59).

Every full-batch CVI step needs the diagonal of :math:`P = (K + S)^{-1}` from the Cholesky factor :math:`L`; the
type-II gradient needs all of :math:`P` once per evaluation (:func:`gpvi.numerics.sites.kernel_gradient_summed`).
Per evaluation of an inner run with ``s`` steps the candidates cost

* ``potri``: ``s`` x :func:`torch.cholesky_inverse` (:math:`2N^3/3` flops; :math:`P` comes with the best step);
* ``scipy trtri``: ``s`` x (SciPy's ``trtri`` + column norms, :math:`N^3/3`) + one ``lauum`` (:math:`N^3/3`);
* ``blocked``: ``s`` x (:func:`blocked_inverse` here, through torch's BLAS, :math:`N^3/2`, +
  column norms) + one ``lauum``.

Timed here, one thread, the candidates called in turn for ``--repeats`` rounds: medians (ms), with the Cholesky (``potrf``) for scale; one factor and a
batch of 3 (three classes). Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.typeii_inverse``.
Results: ``benchmarks/studies/results/typeii_inverse.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks._common import header, write
from gpvi.linalg import sum_of_squares, triangular_inverse
from gpvi.numerics import sites

OUT = Path(__file__).resolve().parent / "results"


def blocked_inverse(L: torch.Tensor, out: torch.Tensor, leaf: int = 256) -> torch.Tensor:
    r""":math:`L^{-1}` by 2 x 2 blocks through torch's BLAS and LAPACK (:math:`N^3/2` flops): the diagonal blocks
    recursively (directly by a triangular solve with the identity from order ``leaf`` down), the off-diagonal one
    :math:`-C^{-1}(BA^{-1})` by one product and one triangular solve. A candidate only (not in gpvi)."""
    n = L.shape[-1]
    if n <= leaf:
        eye = torch.eye(n, dtype=L.dtype).expand_as(L)
        return out.copy_(torch.linalg.solve_triangular(L, eye, upper=False))
    h = n // 2
    Ai = blocked_inverse(L[..., :h, :h], out[..., :h, :h], leaf)
    blocked_inverse(L[..., h:, h:], out[..., h:, h:], leaf)
    out[..., :h, h:].zero_()
    out[..., h:, :h] = torch.linalg.solve_triangular(L[..., h:, h:], L[..., h:, :h] @ Ai, upper=False).neg_()
    return out


def case(n: int, batch: int, repeats: int) -> dict[str, Any]:
    """One factor (or a batch) of order ``n``: the candidates called in turn, ``repeats`` rounds (alternated, so a
    change of load reaches them alike); median and best per candidate (ms)."""
    g = torch.Generator().manual_seed(n)
    X = torch.randn(n, 3, dtype=torch.float64, generator=g)
    K = torch.exp(-0.5 * torch.cdist(X, X) ** 2)
    s = torch.rand(n, batch, dtype=torch.float64, generator=g) * 4 + 0.5
    L, _ = sites.site_factor(K, s[:, 0] if batch == 1 else s)
    out = torch.empty(L.shape, dtype=torch.float64)
    Linv = triangular_inverse(L)
    B = (L @ L.mT).contiguous()
    fns: dict[str, Callable[[], Any]] = {
        "potrf": lambda: torch.linalg.cholesky(B),
        "potri": lambda: torch.cholesky_inverse(L, out=out),
        "scipy_trtri": lambda: sum_of_squares(triangular_inverse(L, out), -2),
        "blocked": lambda: sum_of_squares(blocked_inverse(L, out), -2),
        "lauum": lambda: sites._gram_of_inverse(Linv)}
    times: dict[str, list[float]] = {k: [] for k in fns}
    loads = []
    for _ in range(repeats):
        loads.append(os.getloadavg()[0])
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(1e3 * (time.perf_counter() - t))
    row: dict[str, Any] = {"N": n, "batch": batch, "load": [round(min(loads), 2), round(max(loads), 2)]}
    for k, v in times.items():
        row[k] = statistics.median(v)
        row[k + "_best"] = min(v)
    return row


def report(rows: list[dict[str, Any]]) -> str:
    lines = [header("diag((K + S)^-1) per CVI step and P per type-II gradient: potri, SciPy's trtri, blocked (issue 59)"),
             "", "Medians of the alternated calls (ms; best in brackets for potri / blocked), one thread. Per "
             "evaluation of s inner steps: potri s x potri; the other two s x (inverse + column norms) + one lauum. "
             "Columns 'per evaluation' for s = 5 (the binary N = 2,000 held-out fits: 63-94 inner steps in 13-19 "
             "evaluations). Rows of separate runs (sizes) are merged; each row's load is its own.", "",
             "| N | batch | potrf | potri | SciPy trtri + norms | blocked + norms | lauum | per evaluation, s = 5: potri / "
             "SciPy / blocked | load |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["N"], r["batch"])):
        ev = (5 * r["potri"], 5 * r["scipy_trtri"] + r["lauum"], 5 * r["blocked"] + r["lauum"])
        lines.append(f"| {r['N']} | {r['batch']} | {r['potrf']:.2f} | {r['potri']:.2f} ({r['potri_best']:.2f}) | "
                     f"{r['scipy_trtri']:.2f} | {r['blocked']:.2f} ({r['blocked_best']:.2f}) | "
                     f"{r['lauum']:.2f} | {ev[0]:.1f} / {ev[1]:.1f} / {ev[2]:.1f} | "
                     f"{r['load'][0]}-{r['load'][1]} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", type=int, default=[300, 768, 1024, 1500, 2000, 3000])
    p.add_argument("--repeats", type=int, default=9)
    a = p.parse_args()
    torch.set_num_threads(1)
    path = OUT / "typeii_inverse.json"
    old = json.loads(path.read_text())["data"]["rows"] if path.exists() else []
    rows = {(r["N"], r["batch"]): r for r in old}
    for n in a.sizes:
        for batch in ((1, 3) if n <= 1024 else (1,)):
            rows[(n, batch)] = case(n, batch, a.repeats)
            print(rows[(n, batch)], flush=True)
            write("typeii_inverse", report(list(rows.values())), {"rows": list(rows.values())}, folder=OUT)


if __name__ == "__main__":
    main()
