"""Is gpvi.infer's S&K run long enough? Its default N against a run 10x longer, from the same start (issue 17).

S&K's number of steps N sets its step size :math:`w = 1/\\sqrt N` and its averaging window (the second half), so it
is part of the algorithm rather than a stop rule: the check of "a natural stop within 0.01 nats of the optimum" is
to run 10x longer and compare. For Boston, Bodyfat (with Density) and pendulum: the best of DSVI's default starts
(the distinct MAP optima of ``MAP_RESTARTS`` restarts, Laplace scale; the start with the highest MAP log joint),
and from it

* **default**: ``gpvi.inference.infer.default_sk`` (``SKGaussian(num_steps=max(500, 40 D), method="gradient",
  num_draws=4, draws="sobol")``, ``gpvi.infer``'s engine since 2026-11-25);
* **long**: the same engine with 10x the steps (the reference);
* **before**: the engine ``gpvi.infer`` used before (``max(250, 20 D)`` steps, pseudo-random draws);
* **before, Sobol'** and **default, pseudo-random**: each change alone (``--ablation``, on by default).

Bounds are compared with **common random numbers**: every q's bound is estimated on the same ``--elbo-draws``
standard-normal vectors (default 4,000), :math:`x_i = m + C\\varepsilon_i`, and the difference (long - q) is the
mean of the per-draw differences with its own standard error; independent estimates (as in the first version of
this benchmark, whose differences had standard errors of 0.01-0.03 nats) cannot resolve a 0.01-nat gap. Also: the
largest |Δmean| in the long run's sds, the sd ratio range, wall times (the bound estimate not included).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.sk_length [boston bodyfat pendulum]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import warnings

import torch

from benchmarks._common import RESULTS, header, write
from benchmarks.nuts_fidelity import model_of
from gpvi.inference.dsvi.engine import DSVI
from gpvi.inference.dsvi.starts import _given
from gpvi.inference.infer import default_sk
from gpvi.inference.salimans_knowles import SKGaussian
from gpvi.models.target import as_target

LABELS = {"default": "default (Sobol', max(500, 40 D))", "before": "before (pseudo-random, max(250, 20 D))",
          "before_sobol": "Sobol', max(250, 20 D)", "default_random": "pseudo-random, max(500, 40 D)"}


def per_draw_bound(model, q, eps: torch.Tensor) -> torch.Tensor:
    """log g(x_i) - log q(x_i) at x_i = m + C eps_i (common random numbers across q's)."""
    C = q.scale_tril
    x = q.mean + eps @ C.T
    with torch.no_grad():
        lj = torch.cat([model.log_joint(x[i:i + 250]) for i in range(0, x.shape[0], 250)])
    log_q = (-0.5 * (eps * eps).sum(-1) - 0.5 * eps.shape[1] * math.log(2 * math.pi)
             - torch.log(torch.diagonal(C)).sum())
    return lj - log_q


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("datasets", nargs="*", default=["pendulum", "bodyfat", "boston"])
    ap.add_argument("--elbo-draws", type=int, default=4000)
    ap.add_argument("--factor", type=int, default=10)
    ap.add_argument("--ablation", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()
    torch.set_default_dtype(torch.float64)
    old = RESULTS / "sk_length.json"
    data = json.loads(old.read_text())["data"] if old.exists() else {}
    data = {k: v for k, v in data.items() if "variants" in v}         # rows of the unpaired first version dropped
    for name in args.datasets:
        model = model_of(name)
        D = len(model.names)
        t0 = time.perf_counter()
        start = DSVI(scale="full", seed=0, progress_bar=False).default_init(model)(as_target(model))
        t_start = time.perf_counter() - t0
        new = default_sk(D, seed=0, progress_bar=False)
        n_old = max(250, 20 * D)
        engines = {"default": new, "long": default_sk(D, seed=0, progress_bar=False),
                   "before": SKGaussian(num_steps=n_old, method="gradient", num_draws=4, seed=0, progress_bar=False)}
        engines["long"].num_steps = args.factor * new.num_steps
        if args.ablation:
            engines["before_sobol"] = SKGaussian(num_steps=n_old, method="gradient", num_draws=4, draws="sobol",
                                                 seed=0, progress_bar=False)
            engines["default_random"] = SKGaussian(num_steps=new.num_steps, method="gradient", num_draws=4, seed=0,
                                                   progress_bar=False)
        eps = torch.randn(args.elbo_draws, D, generator=torch.Generator().manual_seed(12345))
        rec: dict = {"D": D, "start_s": t_start, "starts_found": 1 + len(start.alternatives), "variants": {}}
        vals, qs = {}, {}
        for key, eng in engines.items():
            eng.num_elbo_draws = 0
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                q = eng.run(model, init=_given(start))
            wall = time.perf_counter() - t0
            v = per_draw_bound(model, q, eps)
            qs[key], vals[key] = q, v
            rec["variants"][key] = {"num_steps": eng.num_steps, "draws": eng.draws, "wall_s": wall,
                                    "bound": float(v.mean()), "bound_se": float(v.std() / math.sqrt(v.numel())),
                                    "mean": q.mean.tolist(), "std": q.std.tolist()}
            print(name, key, eng.num_steps, round(float(v.mean()), 4), round(wall, 1), flush=True)
        b = qs["long"]
        for key, q in qs.items():
            if key == "long":
                continue
            d = vals["long"] - vals[key]
            ratio = q.std / b.std
            rec["variants"][key].update(
                diff=float(d.mean()), diff_se=float(d.std() / math.sqrt(d.numel())),
                max_dmean_sd=float(((q.mean - b.mean).abs() / b.std).max()),
                sd_ratio=[float(ratio.min()), float(ratio.max())])
        rec["load"] = os.getloadavg()[0]
        data[name] = rec
    rows = []
    for name, rec in data.items():
        lv = rec["variants"]["long"]
        for key, label in LABELS.items():
            if key not in rec["variants"]:
                continue
            r = rec["variants"][key]
            rows.append(f"| {name} | {rec['D']} | {label} | {r['num_steps']} / {lv['num_steps']} | "
                        f"{r['bound']:.3f} | {lv['bound']:.3f} | {r['diff']:+.4f} ± {r['diff_se']:.4f} | "
                        f"{'yes' if r['diff'] <= 0.01 else 'no'} | {r['max_dmean_sd']:.3f} | "
                        f"{r['sd_ratio'][0]:.3f}–{r['sd_ratio'][1]:.3f} | {r['wall_s']:.0f} / {lv['wall_s']:.0f} | "
                        f"{rec['load']:.1f} |")
    md = header("S&K Hessian-free: gpvi.infer's default length against a run 10x longer") + "\n"
    md += __doc__.split("\n\n", 1)[1].split("\n\nRun:")[0] + "\n\n"
    md += ("| dataset | D | engine | N (this / long) | bound, this | bound, long | long − this (paired) | "
           "within 0.01 | max abs Δmean (long sds) | sd ratio this / long | wall s (this / long) | load |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    print(write("sk_length", md, data))


if __name__ == "__main__":
    main()
