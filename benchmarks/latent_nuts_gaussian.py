"""NUTS over (theta, log scale, whitened f) of a Student-t GP with df = 1e7 against NUTS on exact GP regression.

The baseline of :class:`gpvi.GPGeneralisedRegression` (issue 60) is NUTS on
:class:`gpvi.models.whitened.WhitenedLatentGP` with the kernel's log-hyperparameters and the likelihood's log
parameters sampled with the latent values. With a Student-t likelihood of df = 1e7 (fixed) the model is Gaussian
regression with noise variance scale^2, so the marginals of (log l^2, log signal variance, 2 log scale) must be those
of :class:`gpvi.GPRegression` with the same priors (N(0, 0.5^2) on log l^2 and log signal variance, N(log 0.36, 0.5^2)
on the log noise variance, i.e. N(log 0.6, 0.25^2) on log scale) sampled by gpvi.NUTS on its exact log joint, which
integrates f out in closed form. The data: ``--n`` points of sin(1.5 x) on [-2, 2] with noise sd 0.6, centred.

Reported per component: both means and sds, the difference in Monte Carlo standard errors (from each run's bulk
ESS), the sd ratio, ESS and R-hat; and the wall times. ``tests/models/test_whitened_generalised.py`` runs the same
check with one short chain each (N = 8).

    python -m benchmarks.latent_nuts_gaussian            # 2 x (300 + 1000) whitened, 4 x (500 + 2000) exact
    python -m benchmarks.latent_nuts_gaussian --quick    # 1 x (150 + 200), 1 x (150 + 400): the test's settings
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import torch

import gpvi
from benchmarks._common import header, write
from gpvi.models.latent_likelihoods import StudentT
from gpvi.models.whitened import WhitenedLatentGP

F64 = torch.float64
NAME = "latent_nuts_gaussian"


def data(n: int, noise: float = 0.6, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.linspace(-2, 2, n, dtype=F64).unsqueeze(-1)
    y = torch.sin(1.5 * X[:, 0]) + noise * torch.randn(n, generator=g, dtype=F64)
    return X, y - y.mean()


def run(args: argparse.Namespace) -> tuple[list[dict], dict]:
    X, y = data(args.n)
    loc = torch.tensor([0.0, 0.0, math.log(0.36)], dtype=F64)
    exact = gpvi.GPRegression(X, y, prior=torch.distributions.Normal(loc, 0.5))
    model = gpvi.GPGeneralisedRegression(X, y, likelihood=StudentT(1e7, 0.6))
    target = WhitenedLatentGP(model, prior=torch.distributions.Normal(loc[:2], 0.5), likelihood_params=["scale"],
                              likelihood_priors={"log_scale": torch.distributions.Normal(math.log(0.6), 0.25)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        a = gpvi.NUTS(num_chains=args.exact_chains, num_warmup=args.exact_warmup, num_draws=args.exact_draws,
                      seed=args.seed, progress_bar=False).run(exact)
        t1 = time.perf_counter()
        b = gpvi.NUTS(num_chains=args.chains, num_warmup=args.warmup, num_draws=args.draws, seed=args.seed,
                      progress_bar=False).run(target)
        t2 = time.perf_counter()
    sa, sb = a.samples, b.samples[:, :3].clone()
    sb[:, 2] = 2.0 * sb[:, 2]
    da, db = a.diagnostics(), b.diagnostics()
    rows = []
    for j, name in enumerate(exact.names):
        ma, mb, sda, sdb = (float(sa[:, j].mean()), float(sb[:, j].mean()), float(sa[:, j].std()),
                            float(sb[:, j].std()))
        ea, eb = float(da["ess_bulk"][j]), float(db["ess_bulk"][j])
        se = math.sqrt(sda ** 2 / ea + sdb ** 2 / eb)
        rows.append({"name": name, "mean_exact": ma, "mean_whitened": mb, "sd_exact": sda, "sd_whitened": sdb,
                     "z": (mb - ma) / se, "sd_ratio": sdb / sda, "ess_exact": ea, "ess_whitened": eb,
                     "rhat_whitened": float(db["r_hat"][j])})
    timing = {"exact_s": t1 - t0, "whitened_s": t2 - t1, "whitened_evaluations": b.info.get("num_evaluations"),
              "whitened_divergences": b.info.get("num_divergent"), "rhat_max_whitened": float(db["r_hat"].max()),
              "ess_bulk_min_whitened": float(db["ess_bulk"].min())}
    return rows, timing


def report(rows: list[dict], timing: dict, args: argparse.Namespace) -> str:
    lines = [header("NUTS over (theta, log scale, whitened f), Student-t df = 1e7, against exact GP regression"),
             f"N = {args.n}; whitened: {args.chains} x ({args.warmup} + {args.draws}) in {timing['whitened_s']:.1f} s "
             f"({timing['whitened_evaluations']} evaluations, divergences {timing['whitened_divergences']}, R-hat "
             f"max {timing['rhat_max_whitened']:.3f} and bulk ESS min {timing['ess_bulk_min_whitened']:.0f} over all "
             f"{args.n + 3} coordinates); exact: {args.exact_chains} x ({args.exact_warmup} + {args.exact_draws}) in "
             f"{timing['exact_s']:.1f} s. z: difference of the means in Monte Carlo standard errors "
             "(sqrt(sd_a^2/ESS_a + sd_b^2/ESS_b)).", "",
             "## Marginals", "",
             "| component | mean exact | mean whitened | sd exact | sd whitened | z | sd ratio | ESS exact | "
             "ESS whitened | R-hat whitened |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['mean_exact']:.4f} | {r['mean_whitened']:.4f} | {r['sd_exact']:.4f} | "
                     f"{r['sd_whitened']:.4f} | {r['z']:+.2f} | {r['sd_ratio']:.3f} | {r['ess_exact']:.0f} | "
                     f"{r['ess_whitened']:.0f} | {r['rhat_whitened']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the test's settings: one short chain each")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chains", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--exact-chains", type=int, default=4)
    ap.add_argument("--exact-warmup", type=int, default=500)
    ap.add_argument("--exact-draws", type=int, default=2000)
    args = ap.parse_args(argv)
    if args.quick:
        args.chains, args.warmup, args.draws = 1, 150, 200
        args.exact_chains, args.exact_warmup, args.exact_draws = 1, 150, 400
    rows, timing = run(args)
    md = report(rows, timing, args)
    write(NAME + ("_quick" if args.quick else ""), md, {"settings": vars(args), "rows": rows, "timing": timing})
    print(md)


if __name__ == "__main__":
    main()
