"""Is gpvi.infer's S&K run long enough? Its default N against a run 10x longer, from the same start (issue 17).

S&K's number of steps N sets its step size :math:`w = 1/\\sqrt N` and its averaging window (the second half), so it
is part of the algorithm rather than a stop rule: the check of "a natural stop within 0.01 nats of the optimum" is
to run 10x longer and compare. For Boston, Bodyfat (with Density) and pendulum: the best of DSVI's default starts
(the distinct MAP optima of ``MAP_RESTARTS`` restarts, Laplace scale; the start with the highest MAP log joint),
``SKGaussian(num_steps=N, method="gradient", num_draws=4)`` with ``N = max(250, 20 D)`` (``gpvi.infer``'s default)
and with ``10 N``, each bound estimated with ``--elbo-draws`` draws (default 4,000; standard errors reported), and
the two q's compared: bound difference (long - default) with its standard error, largest |Δmean| in the long run's
sds, sd ratio range, wall times. ``--also 600,1200`` adds runs of those lengths from the same start, compared with
the long run the same way. Datasets run earlier keep their rows (results are merged by dataset).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.sk_length [boston bodyfat pendulum]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import warnings

from benchmarks._common import RESULTS, header, write
from benchmarks.nuts_fidelity import model_of
from gpvi.inference.dsvi.engine import DSVI
from gpvi.inference.dsvi.starts import _given
from gpvi.inference.sk import SKGaussian
from gpvi.models.target import as_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("datasets", nargs="*", default=["pendulum", "bodyfat", "boston"])
    ap.add_argument("--elbo-draws", type=int, default=4000)
    ap.add_argument("--factor", type=int, default=10)
    ap.add_argument("--also", default="", help="comma-separated extra lengths")
    args = ap.parse_args()
    also = [int(x) for x in args.also.split(",") if x]
    old = RESULTS / "sk_length.json"
    data = json.loads(old.read_text())["data"] if old.exists() else {}
    for name in args.datasets:
        model = model_of(name)
        D = len(model.names)
        t0 = time.perf_counter()
        start = DSVI(scale="full", seed=0, progress_bar=False).default_init(model)(as_target(model))
        t_start = time.perf_counter() - t0
        n0 = max(250, 20 * D)
        rec: dict = {"D": D, "start_s": t_start, "starts_found": 1 + len(start.alternatives)}
        qs = {}
        for n in (n0, args.factor * n0, *also):
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                q = SKGaussian(num_steps=n, method="gradient", num_draws=4, num_elbo_draws=args.elbo_draws, seed=0,
                               progress_bar=False).run(model, init=_given(start))
            qs[n] = q
            rec[str(n)] = {"elbo": float(q.elbo), "elbo_se": float(q.elbo_se), "wall_s": time.perf_counter() - t0,
                           "mean": q.mean.tolist(), "std": q.std.tolist()}
            print(name, n, rec[str(n)]["elbo"], rec[str(n)]["elbo_se"], round(rec[str(n)]["wall_s"], 1), flush=True)
        b = qs[args.factor * n0]
        rec["long"] = args.factor * n0
        rec["compared"] = {}
        for n in (n0, *also):
            a = qs[n]
            ratio = a.std / b.std
            rec["compared"][str(n)] = {
                "diff": float(b.elbo - a.elbo), "diff_se": math.sqrt(float(a.elbo_se) ** 2 + float(b.elbo_se) ** 2),
                "max_dmean_sd": float(((a.mean - b.mean).abs() / b.std).max()),
                "sd_ratio": [float(ratio.min()), float(ratio.max())]}
        rec["load"] = os.getloadavg()[0]
        data[name] = rec
    rows = []
    for name, rec in data.items():
        nl = rec["long"]
        for n, c in rec["compared"].items():
            r = rec[n]
            rows.append(f"| {name} | {rec['D']} | {n} / {nl} | {r['elbo']:.3f} ({r['elbo_se']:.3f}) | "
                        f"{rec[str(nl)]['elbo']:.3f} ({rec[str(nl)]['elbo_se']:.3f}) | {c['diff']:+.3f} ± "
                        f"{c['diff_se']:.3f} | {c['max_dmean_sd']:.3f} | {c['sd_ratio'][0]:.3f}–{c['sd_ratio'][1]:.3f} "
                        f"| {r['wall_s']:.0f} / {rec[str(nl)]['wall_s']:.0f} | {rec['load']:.1f} |")
    md = header("S&K Hessian-free: gpvi.infer's default length against a run 10x longer") + "\n"
    md += __doc__.split("\n\n", 1)[1].split("\n\nRun:")[0] + "\n\n"
    md += ("| dataset | D | N (this / long) | bound, this N (se) | bound, long (se) | long − this | "
           "max abs Δmean (long sds) | sd ratio this / long | wall s | load |\n"
           "|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    print(write("sk_length", md, data))


if __name__ == "__main__":
    main()
