"""Binary EP's sweep at small N (issue 59, item 3): how many rows one call should hold, and the mean by a product with
B^-1 rather than a one-column ``cholesky_solve``. Tuning families only (``xor`` of ``benchmarks/heldout_families.py``).

Two tables, one thread, best of ``--repeats`` per cell (walls with the load quoted):

* **chunks**: the final bound estimate's work, 100 rows of EP's evidence without the gradient
  (``expectation_propagation(..., gradient=False)``) at draws around the anchor of the CVI bound (theta + 0.5 z),
  warm-started from the anchor's EP sites, tolerance 1e-3, run in chunks of 1 ... 100 rows, at N = 100, 200, 400.
  Chosen from it: :data:`gpvi.inference.cvi.ep_evidence.EP_CHUNK_ELEMENTS` and ``EP_CHUNK_ROWS``.
* **solve**: the mean's solve with B in one sweep, batch of 4: ``torch.cholesky_solve`` of one column against the
  product with the inverse that the sweep forms anyway (one batched matrix-vector product).

Run: ``OMP_NUM_THREADS=1 nice .venv/bin/python -m benchmarks.studies.ep_chunks``; writes
``benchmarks/studies/results/ep_chunks.{md,json}``.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from typing import Any

import torch

from benchmarks.heldout_families import SPLIT, binary_data
from benchmarks.studies._common import header, write

CHUNKS = (1, 2, 3, 4, 6, 13, 16, 26, 52, 100)


def best(f: Any, repeats: int) -> float:
    f()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def case(n: int, repeats: int) -> dict[str, Any]:
    import gpvi
    from gpvi.inference.cvi.bound import CVIBoundTarget
    from gpvi.inference.cvi.ep_evidence import EPEvidenceTarget
    from gpvi.numerics.ep import expectation_propagation

    assert "xor" in SPLIT["tuning"]
    Xtr, ytr, _, _ = binary_data("xor", n, 1)
    model = gpvi.GPClassification(torch.as_tensor(Xtr), torch.as_tensor(ytr, dtype=torch.float64))
    bound = CVIBoundTarget(model)
    target = EPEvidenceTarget(bound, tol=1e-3)
    tau, nu = target.warm_sites()
    g = torch.Generator().manual_seed(1)
    theta = bound.anchor[0] + 0.5 * torch.randn(100, bound.dim, generator=g, dtype=torch.float64)
    K = bound._kernel(theta).detach()
    kw = dict(quadrature=target.quadrature, damping=target.damping, tol=1e-3, tau=tau, nu=nu,
              anderson=target.anderson, gradient=False)

    def run(chunk: int) -> None:
        for i in range(0, 100, chunk):
            expectation_propagation(K[i:i + chunk], model.y, model.likelihood, **kw)

    row: dict[str, Any] = {"N": n, "load": round(os.getloadavg()[0], 2)}
    row["chunks_s"] = {c: round(best(lambda: run(c), repeats), 4) for c in CHUNKS}
    # one sweep's solve with B, batch of 4
    sW = target.evidence(theta[:4]).tau.sqrt()
    B = (K[:4] * sW.unsqueeze(-1)) * sW.unsqueeze(-2)
    B.diagonal(dim1=-2, dim2=-1).add_(1.0)
    LB = torch.linalg.cholesky(B)
    Binv = torch.cholesky_inverse(LB)
    v = torch.randn(4, n, 1, generator=g, dtype=torch.float64)
    row["cholesky_solve_ms"] = round(1e3 * best(lambda: torch.cholesky_solve(v, LB), 5 * repeats), 4)
    row["binv_product_ms"] = round(1e3 * best(lambda: Binv @ v, 5 * repeats), 4)
    return row


def report(rows: list[dict[str, Any]]) -> str:
    lines = [header("Binary EP: rows per call and the mean's solve (issue 59)"), "",
             "Protocol in the docstring of `benchmarks/studies/ep_chunks.py` (tuning family xor, one thread, best of "
             "the repeats). Seconds for 100 rows of EP's evidence without the gradient, run in chunks of c rows:",
             "", "| N | " + " | ".join(f"c = {c}" for c in CHUNKS) + " | load |",
             "|---|" + "---|" * (len(CHUNKS) + 1)]
    for r in rows:
        lines.append(f"| {r['N']} | " + " | ".join(f"{r['chunks_s'][c]:.3f}" for c in CHUNKS) + f" | {r['load']} |")
    lines += ["", "The mean's solve with B in one sweep (batch of 4, ms):", "",
              "| N | cholesky_solve, one column | product with B^-1 |", "|---|---|---|"]
    lines += [f"| {r['N']} | {r['cholesky_solve_ms']} | {r['binv_product_ms']} |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", type=int, default=[100, 200, 400])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    rows = []
    for n in a.sizes:
        rows.append(case(n, a.repeats))
        print(rows[-1], flush=True)
    write("ep_chunks", report(rows), {"rows": rows})


if __name__ == "__main__":
    main()
