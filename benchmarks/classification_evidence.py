"""How well the CVI bound and EP's evidence track log p(y | theta) in GP classification, and what each costs.

For each binary set (pima, ionosphere, sonar, ripley; the problems of ``classification_nuts_ref.py``: stratified
training subsample of 100, seed 0, logit link, ScaleKernel(RBF, ARD)) theta is set to the long NUTS reference's
posterior mean (``classification_nuts_ref.json``) and the log signal variance is moved over a grid around it. At
each point:

* the profiled CVI bound (``CVIBoundTarget``; a lower bound on log p(y | theta));
* EP's approximate evidence (``EPEvidenceTarget``, ``gpvi.numerics.ep``);
* an importance-sampling estimate of log p(y | theta) with ``--is-draws`` draws from CVI's Gaussian posterior
  (whitened, f = L v; the independent answer where its Pareto k-hat, by ArviZ's ``psislw``, is below 0.7; above,
  the estimate is unreliable and reported only with its k-hat).

Reported: both approximations' offsets from the CVI bound, the estimate and its k-hat, and where along the grid
each curve (plus the N(0, 10) log prior) peaks. Costs: median wall time of one batched evaluation of ``--rows`` rows
(value and gradient) for the CVI bound and for EP, against the floor of the same rows' bare Cholesky factorisations
of K, medians of ``--repeats`` runs.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.classification_evidence``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from benchmarks._common import header, write
from benchmarks.classification_bayes import DATASETS, subsample
from benchmarks.classification_nuts_ref import NAME as REF_NAME, load_results
import gpvi
from gpvi.inference.cvi.engine import CVI
from gpvi.inference.cvi.bound import CVIBoundTarget
from gpvi.inference.cvi.ep_evidence import EPEvidenceTarget
from gpvi.models.whitened import WhitenedLatentGP

NAME = "classification_evidence"


def importance_estimate(bound: CVIBoundTarget, whitened: WhitenedLatentGP, theta: torch.Tensor, draws: int,
                        gen: torch.Generator) -> tuple[float, float]:
    """log p(y | theta) by importance sampling from CVI's posterior in whitened coordinates, and the Pareto k-hat."""
    from arviz import psislw

    model = bound.model
    st = bound.converged_sites(theta)
    L, _ = whitened.factor(theta)
    N = L.shape[0]
    B = torch.eye(N, dtype=L.dtype) + L.T @ ((-2.0 * st.lam2)[:, None] * L)       # precision of v under q
    LB = torch.linalg.cholesky(B)
    mv = torch.cholesky_solve((L.T @ st.lam1)[:, None], LB)[:, 0]
    eps = torch.randn(draws, N, generator=gen, dtype=L.dtype)
    v = mv + torch.linalg.solve_triangular(LB.T, eps.T, upper=True).T
    lw = (model.likelihood.log_prob(model.y, v @ L.T).sum(-1) - 0.5 * (v * v).sum(-1) + 0.5 * (eps * eps).sum(-1)
          - torch.log(LB.diagonal()).sum())
    _, khat = psislw(lw.numpy().copy())
    return float(torch.logsumexp(lw, 0) - math.log(draws)), float(khat)


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_one(name: str, ref: dict, args: argparse.Namespace) -> dict:
    ds = gpvi.datasets.load(name)
    X, y = subsample(torch.as_tensor(ds.X_train, dtype=torch.float64), torch.as_tensor(ds.y_train, dtype=torch.float64),
                     args.n_train, 0)
    model = gpvi.GPClassification(X, y)
    bound = CVIBoundTarget(model, cvi=CVI(beta=0.7, progress_bar=False), inner_tol=1e-10)
    ep = EPEvidenceTarget(bound)
    wh = WhitenedLatentGP(model)
    mu = torch.tensor(ref["mean"], dtype=torch.float64)
    j = ref["names"].index("log_signal_var")
    bound.set_anchor(mu)
    gen = torch.Generator().manual_seed(args.seed)
    rows = []
    for dv in args.offsets:
        th = mu.clone()
        th[j] += dv
        cvi = float(bound.log_joint(th) - bound.log_prior(th))
        epv = float(ep.log_joint(th) - ep.log_prior(th))
        est, khat = importance_estimate(bound, wh, th, args.is_draws, gen)
        rows.append({"log_signal_var": float(th[j]), "cvi": cvi, "ep": epv, "is": est, "khat": khat,
                     "log_prior": float(bound.log_prior(th))})
        print(name, rows[-1], flush=True)
    # cost of one batched evaluation (value and gradient) of `rows` rows around the reference mean
    g = torch.Generator().manual_seed(args.seed + 1)
    batch = mu + 0.3 * torch.randn(args.rows, mu.numel(), generator=g, dtype=torch.float64)

    def grad_of(target):
        th = batch.clone().requires_grad_(True)
        target.log_joint(th).sum().backward()

    def chol():
        with torch.no_grad():
            torch.linalg.cholesky_ex(bound._kernel(batch))

    t_chol = timed(chol, args.repeats)
    t_cvi = timed(lambda: grad_of(bound), args.repeats)
    t_ep = timed(lambda: grad_of(ep), args.repeats)
    sweeps = ep.counters["sweeps"] / max(ep.counters["evaluations"], 1)
    return {"dataset": name, "N": int(X.shape[0]), "D": int(mu.numel()), "ref_mean": float(mu[j]),
            "ref_sd": float(ref["std"][j]), "grid": rows, "time_chol_s": t_chol, "time_cvi_s": t_cvi,
            "time_ep_s": t_ep, "ep_sweeps_per_row": sweeps, "rows": args.rows}


def report(results: list[dict], args: argparse.Namespace) -> str:
    md = header("log p(y | theta) in GP classification: the CVI bound, EP's evidence and importance sampling")
    md += (f"\nTheta at the long NUTS reference's posterior mean (`{REF_NAME}.json`), log signal variance moved "
           f"over the grid; importance sampling with {args.is_draws} draws from CVI's posterior (reliable where "
           "k-hat < 0.7). Values in nats, as offsets from the CVI bound at the same point.\n")
    for r in results:
        md += (f"\n## {r['dataset']} (N = {r['N']}, D = {r['D']}; NUTS: log signal variance {r['ref_mean']:.2f} +- "
               f"{r['ref_sd']:.2f})\n\n| log signal variance | CVI bound | EP - bound | IS - bound | k-hat |\n"
               "|---|---|---|---|---|\n")
        for g in r["grid"]:
            md += (f"| {g['log_signal_var']:.2f} | {g['cvi']:.3f} | {g['ep'] - g['cvi']:+.3f} | "
                   f"{g['is'] - g['cvi']:+.3f} | {g['khat']:.2f} |\n")
        best = {k: max(r["grid"], key=lambda g: g[k] + g["log_prior"])["log_signal_var"] for k in ("cvi", "ep")}
        md += (f"\nOn this grid, with the log prior, the CVI bound peaks at {best['cvi']:.2f} and EP at "
               f"{best['ep']:.2f}.\n")
    md += (f"\n## Cost of one evaluation (value and gradient) of {args.rows} rows, median of {args.repeats}\n\n"
           "| set | N | bare Cholesky of K (ms) | CVI bound (ms) | EP (ms) | EP / CVI | EP / Cholesky | "
           "EP sweeps per row |\n"
           "|---|---|---|---|---|---|---|---|\n")
    for r in results:
        md += (f"| {r['dataset']} | {r['N']} | {1e3 * r['time_chol_s']:.1f} | {1e3 * r['time_cvi_s']:.1f} | "
               f"{1e3 * r['time_ep_s']:.1f} | {r['time_ep_s'] / r['time_cvi_s']:.2f} | "
               f"{r['time_ep_s'] / r['time_chol_s']:.0f} | {r['ep_sweeps_per_row']:.1f} |\n")
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=DATASETS, choices=DATASETS)
    ap.add_argument("--n-train", type=int, default=100)
    ap.add_argument("--offsets", type=float, nargs="+", default=[-3.0, -2.0, -1.0, 0.0, 1.0, 2.0])
    ap.add_argument("--is-draws", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_default_dtype(torch.float64)
    refs = {r["dataset"]: r for r in load_results(REF_NAME)}
    results = [run_one(n, refs[n], args) for n in args.datasets if n in refs]
    md = report(results, args)
    write(NAME, md, {"args": vars(args), "results": results})
    print(md)


if __name__ == "__main__":
    main()
