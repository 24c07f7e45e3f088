"""NUTS on Boston (N = 455, D = 15): wall time, ESS per parameter and per second, divergences, step size, depth.

This is the MCMC side of the DSVI-vs-MCMC time ratio (issue 4: DSVI wall time <= 1/20 of the NUTS run that
gives >= 400 effective samples for every parameter). The run uses 4 chains, 500 warm-up transitions each, and
starts from the ML-II estimate plus N(0, 0.1^2) jitter. It begins with ``--samples`` draws per chain; if the
smallest ESS is below ``--target-ess`` it is *extended* (resumed from its state, which reproduces a single
longer run exactly) by 50% until the target is met, so the time recorded is that of one run of the final
length. Reference measured in the same process: the median time of one log-joint + gradient evaluation,
which turns NUTS's wall time into a count of gradient evaluations and an overhead ratio.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/nuts_boston.py            # full run (~20-40 min)
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/nuts_boston.py --quick    # smoke test (~1 min)

Writes ``benchmarks/results/nuts_boston{,_quick}.{md,json}``, the draws ``nuts_boston_draws.npz`` (full run
only: ``draws (C, S, D)``, ``names``, per-draw stats) for the DSVI comparison, and a trace plot PNG.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpvi  # noqa: E402
from benchmarks._common import RESULTS, header, machine_info, median_time, write  # noqa: E402
from gpvi.inference.mcmc import NUTS  # noqa: E402


def grad_eval_time(model: gpvi.GPRegression, theta: torch.Tensor) -> float:
    def once():
        x = theta.clone().requires_grad_(True)
        v = model.log_joint(x.unsqueeze(0))[0]
        torch.autograd.grad(v, x)
    t, _ = median_time(once, repeats=21, warmup=3)
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 chains x (50 + 50) transitions: checks the script")
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--samples", type=int, default=800, help="initial draws per chain")
    ap.add_argument("--target-ess", type=float, default=400.0)
    ap.add_argument("--max-extensions", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.quick:
        args.chains, args.warmup, args.samples, args.max_extensions = 2, 50, 50, 0
    name = "nuts_boston" + ("_quick" if args.quick else "")
    load_before = os.getloadavg()

    ds = gpvi.datasets.load_boston(seed=0)
    model = gpvi.GPRegression(ds.X_train, ds.y_train)
    t0 = time.perf_counter()
    ml2 = gpvi.ML2(num_restarts=3, seed=0).run(model)
    ml2_time = time.perf_counter() - t0
    t_eval = grad_eval_time(model, ml2.theta)
    print(f"ML-II {ml2_time:.1f} s; one log-joint + gradient evaluation {1e3 * t_eval:.2f} ms", flush=True)

    S = args.samples
    caught: list[str] = []
    state = None
    extensions = 0
    while True:
        eng = NUTS(num_chains=args.chains, num_warmup=args.warmup, num_draws=S, seed=args.seed,
                   progress_bar=sys.stderr.isatty())
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            mc = eng.run(model, init=ml2) if state is None else eng.run(model, state=state)
        msgs = [f"{w.category.__name__}: {w.message}" for w in rec]
        ess = mc.info["ess_bulk"]
        print(f"{args.chains} x {S} draws: min ESS {float(ess.min()):.0f}, "
              f"time so far {sum(mc.info['warmup_time_s']) + sum(mc.info['sampling_time_s']):.0f} s", flush=True)
        if float(ess.min()) >= args.target_ess or extensions >= args.max_extensions:
            caught = msgs
            break
        state = mc.engine_state
        S = int(math.ceil(1.5 * S))
        extensions += 1

    warm_t = sum(mc.info["warmup_time_s"])
    samp_t = sum(mc.info["sampling_time_s"])
    total = warm_t + samp_t
    evals = sum(mc.info["num_evaluations"])
    ess = mc.info["ess_bulk"]
    rhat = mc.info["r_hat"]
    summ = mc.summary()
    min_ess = float(ess.min())
    # ESS grows linearly with the number of draws: the sampling time that a min ESS of target_ess needs
    t_needed = warm_t + samp_t * args.target_ess / min_ess
    stats = mc.stats
    depth = stats["tree_depth"].double()
    load_after = os.getloadavg()

    lines = [header(f"NUTS on Boston: {args.chains} chains x {S} draws (+{args.warmup} warm-up)"), ""]
    lines += [
        f"- load average before / after: {[round(x, 2) for x in load_before]} / {[round(x, 2) for x in load_after]}"
        + (" (machine busy: times are inflated)" if max(load_before[0], load_after[0]) > 1.5 else ""),
        f"- data: Boston, N = {model.num_data}, d = {model.X.shape[1]}, D = {model.dim}; prior N(0, 10) per "
        f"component; init: ML-II ({ml2_time:.1f} s, 3 restarts) + N(0, 0.1^2) jitter per chain",
        f"- reference (same process): one log-joint + gradient evaluation = {1e3 * t_eval:.2f} ms (median of 21)",
        "",
        "## Headline",
        "",
        "| quantity | value |",
        "|---|---|",
        f"| NUTS wall time (warm-up + sampling, all chains) | **{total:.1f} s** (warm-up {warm_t:.1f} s, "
        f"sampling {samp_t:.1f} s) |",
        f"| draws | {args.chains} x {S} (extended {extensions} time(s) from {args.samples}) |",
        f"| min / median ESS over parameters | {min_ess:.0f} / {float(ess.median()):.0f} |",
        f"| min ESS per second (total wall time) | {min_ess / total:.2f} /s |",
        f"| time that gives ESS >= {args.target_ess:.0f} for every parameter (warm-up + pro-rated sampling) | "
        f"{t_needed:.1f} s |",
        f"| max split R-hat | {float(rhat.max()):.4f} |",
        f"| divergent transitions | {mc.info['divergences']} |",
        f"| step size per chain | {', '.join(f'{e:.3g}' for e in mc.info['step_size'])} |",
        f"| tree depth: mean, max (max allowed {eng.max_tree_depth}) | {float(depth.mean()):.2f}, "
        f"{int(depth.max())} |",
        f"| gradient evaluations (all chains) | {evals} |",
        f"| wall time / (evaluations x eval time): driver + Pyro overhead | {total / (evals * t_eval):.2f} |",
        "",
        "## Per parameter",
        "",
        "| parameter | mean | sd | ESS | ESS/s | R-hat |",
        "|---|---|---|---|---|---|",
    ]
    for j, n in enumerate(model.names):
        lines.append(f"| {n} | {summ.column('mean')[j]:.4f} | {summ.column('sd')[j]:.4f} | {float(ess[j]):.0f} | "
                     f"{float(ess[j]) / total:.2f} | {float(rhat[j]):.4f} |")
    lines += ["", "## Per chain", "", "```", repr(mc.info["chains"]), "```", ""]
    lines += ["## Warnings during the run", ""] + ([f"- {m}" for m in caught] or ["- none"]) + [""]
    lines += ["Notes: ESS is Pyro's `effective_sample_size` (Geyer initial monotone sequence over all chains, "
              "not rank-normalised); R-hat is Pyro's split Gelman-Rubin. Times are single-threaded "
              "(OMP_NUM_THREADS=1) on a shared 2-core machine.", ""]
    md = "\n".join(lines)
    data = {
        "num_chains": args.chains, "num_warmup": args.warmup, "num_samples": S, "extensions": extensions,
        "wall_time_s": total, "warmup_time_s": warm_t, "sampling_time_s": samp_t,
        "time_for_target_ess_s": t_needed, "target_ess": args.target_ess,
        "ess": dict(zip(model.names, ess.tolist())), "r_hat": dict(zip(model.names, rhat.tolist())),
        "ess_per_s": dict(zip(model.names, (ess / total).tolist())),
        "min_ess": min_ess, "divergences": mc.info["divergences"], "step_size": mc.info["step_size"],
        "mean_tree_depth": float(depth.mean()), "max_tree_depth_seen": int(depth.max()),
        "num_evaluations": evals, "eval_time_s": t_eval, "ml2_time_s": ml2_time,
        "mean": dict(zip(model.names, summ.column("mean"))), "sd": dict(zip(model.names, summ.column("sd"))),
        "load_before": load_before, "load_after": load_after, "warnings": caught,
    }
    path = write(name, md, data)
    print(md)
    print(f"wrote {path}")
    if not args.quick:
        np.savez_compressed(RESULTS / "nuts_boston_draws.npz", draws=mc.draws.numpy(), names=np.array(model.names),
                            **{f"stat_{k}": v.numpy() for k, v in stats.items()}, machine=str(machine_info()))
    try:
        import matplotlib
        matplotlib.use("Agg")
        from gpvi.evaluation.plots import trace
        trace(mc, warmup=True).savefig(RESULTS / f"{name}_trace.png", dpi=70)
    except ImportError:  # pragma: no cover
        pass


if __name__ == "__main__":
    main()
