"""Peak memory of DSVI on a large exact GP (N = 2,000) and of diagonal DSVI-ARD at D = 30,000.

1. DSVI with default settings except the start (given, to skip the MAP search) and a short step cap, on a synthetic
   N = 2,000, d = 8 regression problem: the steps and the default final bound estimate (1,000 draws, chunked by the
   memory budget) run in a fresh process whose peak resident memory (ru_maxrss) is recorded. Before the budget the
   final estimate evaluated 250 draws per call: 250 x N x N doubles = 8 GB at N = 2,000.
2. DSVI-ARD (diagonal scale) on a 200 x 30,000 synthetic logistic problem, 200 steps: peak memory of the run and
   of building the posterior (a dense D x D scale would be 7.2 GB).

Run: ``python -m benchmarks.dsvi_memory [--quick]``; writes benchmarks/results/dsvi_memory.md (not with --quick).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

_CHILD = {
    "dsvi_n2000": r"""
import resource, time, torch, gpvi
g = torch.Generator().manual_seed(0)
N, d = {N}, 8
X = torch.randn(N, d, generator=g, dtype=torch.float64)
y = torch.sin(X[:, 0]) + 0.1 * torch.randn(N, generator=g, dtype=torch.float64)
model = gpvi.GPRegression(X, y)
t0 = time.perf_counter()
q = gpvi.DSVI(num_steps={steps}, seed=0, progress_bar=False).run(model, init=model.initial_theta())
print(repr(dict(time_s=time.perf_counter() - t0, peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                elbo=q.elbo, chunks=q.info["elbo_chunks"], steps=q.info["steps"])))
""",
    "ard_d30000": r"""
import resource, time, torch, gpvi
g = torch.Generator().manual_seed(0)
N, D = 200, {D}
X = torch.randn(N, D, generator=g, dtype=torch.float64)
y = (X[:, 0] - X[:, 1] + 0.5 * X[:, 2] > 0).double()
lik = gpvi.BayesianLogisticRegression(X, y, prior_var=None, bias=False)
t0 = time.perf_counter()
q = gpvi.inference.dsvi.DSVIARD(num_steps={steps}, lr=0.005, seed=0, progress_bar=False, num_elbo_draws=100).run(lik)
sd = q.std if hasattr(q, "std") else q.stddev
print(repr(dict(time_s=time.perf_counter() - t0, peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                storage=getattr(q, "storage", "full"), top=sorted(q.mean.abs().topk(3).indices.tolist()),
                sd_min=float(sd.min()))))
""",
}


def _child(name: str, **kw) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    out = subprocess.run([sys.executable, "-c", _CHILD[name].format(**kw)], capture_output=True, text=True, env=env,
                         timeout=3600)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return eval(out.stdout.strip().splitlines()[-1], {"__builtins__": {}}, {})  # our own child's dict literal


def main(argv: list[str] | None = None) -> int:
    quick = "--quick" in (argv if argv is not None else sys.argv[1:])
    rows = {"dsvi_n2000": _child("dsvi_n2000", N=500 if quick else 2000, steps=5 if quick else 20),
            "ard_d30000": _child("ard_d30000", D=2000 if quick else 30000, steps=20 if quick else 200)}
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.platform(), "cpus": os.cpu_count(),
            "threads": os.environ.get("OMP_NUM_THREADS"), "load": os.getloadavg()[0], "quick": quick}
    print(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    if not quick:
        res = Path(__file__).resolve().parent / "results"
        lines = ["# Peak memory: DSVI at N = 2,000 and DSVI-ARD at D = 30,000", "",
                 f"{meta['date']}, {meta['machine']}, {meta['cpus']} CPUs, OMP_NUM_THREADS={meta['threads']}, "
                 f"load {meta['load']:.2f}. Peak = the child process's ru_maxrss (whole Python process, torch "
                 "included).", "", "| run | peak memory (MB) | time (s) | details |", "|---|---|---|---|"]
        for k, r in rows.items():
            extra = {kk: v for kk, v in r.items() if kk not in ("peak_mb", "time_s")}
            lines.append(f"| {k} | {r.get('peak_mb', float('nan')):.0f} | {r.get('time_s', float('nan')):.1f} | "
                         f"{extra} |")
        (res / "dsvi_memory.md").write_text("\n".join(lines) + "\n")
        (res / "dsvi_memory.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
