"""Fully Bayesian GP classification (q(theta) on EP's evidence, CVI latents) vs type-II CVI vs NUTS over (theta, v).

For each binary set (pima, ionosphere, sonar, ripley; logit link, ScaleKernel(RBF, ARD), prior N(0, 10 I) on the
log-hyperparameters):

* **type-II**: ``gpvi.sklearn.GPClassifier()`` with its defaults (MAP-II on the CVI bound, the same prior);
* **fully Bayesian**: :class:`gpvi.inference.cvi.bayes.FullyBayesianCVI` with its defaults (MAP-II, the EP MAP
  point, Laplace scale, Salimans-Knowles Hessian-free with max(200, 4 D) steps of 4 draws on
  :class:`gpvi.inference.cvi.ep_evidence.EPEvidenceTarget`, 32 predictive draws with CVI latent posteriors; until
  2026-11-24 the target was :class:`gpvi.inference.cvi.bound.CVIBoundTarget`, compared in
  ``classification_nuts_ref.md``);
* **fully Bayesian, DSVI** (``--dsvi-baseline``, on by default): the same with the engine used before 2026-11-24,
  ``DSVI(scale="full", optimizer=Natural(), num_draws=4, convergence=Convergence(gap_tol=0.05),
  num_elbo_draws=100)``, to compare the two engines in the same run;
* **NUTS** on :class:`gpvi.models.whitened.WhitenedLatentGP` (theta and the whitened latent values v, D + N
  dimensions), ``--chains`` chains of ``--warmup`` + ``--draws`` iterations, R-hat and bulk ESS reported over all
  D + N coordinates and over theta; predictive probabilities from ``--pred-draws`` evenly spaced draws.

Reported: test log loss (nats) and accuracy, wall time, the difference of q(theta)'s (and type-II's) theta from
NUTS's posterior mean in NUTS posterior sds, and the mean absolute difference of test predictive probabilities from
NUTS's. ``--n-train`` subsamples the training set (stratified by label, seeded): NUTS over (theta, v) costs one
O(N^3) factorisation per leapfrog step, with trees of tens to hundreds of steps, which does not fit this shared
2-core machine at the full training sizes.

``--prior scaled`` (since 2026-11-25) gives every method the prior ``"scaled"`` (N(theta_0, 10 I) centred at the
model's data-scaled start, :func:`gpvi.models.priors.resolve_prior`) instead of N(0, 10 I).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.classification_bayes --datasets pima --n-train 100``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch

from benchmarks._common import header, nuts_latent_summary, write
import gpvi
from gpvi.models.whitened import WhitenedLatentGP
from gpvi.inference.cvi.bayes import FullyBayesianCVI
from gpvi.sklearn import GPClassifier

DATASETS = ["pima", "ionosphere", "sonar", "ripley"]


def subsample(X: torch.Tensor, y: torch.Tensor, n: int | None, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A stratified seeded subsample of ``n`` rows (all rows when ``n`` is None or >= N)."""
    if n is None or n >= X.shape[0]:
        return X, y
    rng = np.random.default_rng(seed)
    yy = y.numpy()
    idx = []
    for c in np.unique(yy):
        rows = np.flatnonzero(yy == c)
        k = max(1, int(round(n * rows.size / yy.size)))
        idx.extend(rng.choice(rows, size=min(k, rows.size), replace=False).tolist())
    idx = np.sort(np.asarray(idx))
    return X[idx], y[idx]


def scores(p: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    p = p.clamp(1e-12, 1 - 1e-12)
    y01 = (y == y.max()).to(torch.float64)
    ll = -(y01 * torch.log(p) + (1 - y01) * torch.log1p(-p)).mean()
    return {"log_loss": float(ll), "accuracy": float(((p > 0.5).double() == y01).double().mean())}


def run_one(name: str, args: argparse.Namespace) -> dict:
    ds = gpvi.datasets.load(name)
    X, y = subsample(torch.as_tensor(ds.X_train, dtype=torch.float64), torch.as_tensor(ds.y_train, dtype=torch.float64),
                     args.n_train, args.seed)
    Xt, yt = torch.as_tensor(ds.X_test, dtype=torch.float64), torch.as_tensor(ds.y_test, dtype=torch.float64)
    out: dict = {"dataset": name, "N": int(X.shape[0]), "N_full": int(ds.X_train.shape[0]), "n_test": int(Xt.shape[0])}
    # type-II
    t0 = time.perf_counter()
    clf = GPClassifier(prior=args.prior).fit(X, y)
    t2 = time.perf_counter() - t0
    p2 = torch.as_tensor(clf.predict_proba(Xt)[:, 1], dtype=torch.float64)
    out["typeii"] = {"time_s": t2, **scores(p2, yt), "theta": clf.theta_.tolist()}
    print(name, "type-II", round(t2, 1), out["typeii"]["log_loss"], flush=True)
    # fully Bayesian: the default engine, and DSVI (the default before 2026-11-24) for comparison
    model = gpvi.GPClassification(X, y)
    names = list(model.names)
    engines = [("bayes", None)]
    if args.dsvi_baseline:
        from gpvi.inference.dsvi import DSVI, Convergence, Natural
        engines.append(("bayes_dsvi", DSVI(scale="full", optimizer=Natural(), num_draws=4,
                                           convergence=Convergence(gap_tol=0.05), num_elbo_draws=100,
                                           seed=args.seed, progress_bar=False)))
    fb_probs = {}
    for key, engine in engines:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            post = FullyBayesianCVI(engine, prior=args.prior, seed=args.seed).run(model)
        tfb = time.perf_counter() - t0
        fb_probs[key] = (post, post.predict_proba(Xt))
        out[key] = {"time_s": tfb, **scores(fb_probs[key][1], yt), "mean": post.mean.tolist(),
                    "std": post.std.tolist(), "elbo": post.elbo, "elbo_se": post.elbo_se,
                    **{k: post.info[k] for k in ("engine", "evidence", "map_time_s", "laplace_time_s", "q_time_s", "q_steps",
                                                 "q_converged", "evaluations", "inner_steps", "failures",
                                                 "predictive_time_s")},
                    "ep_counters": post.info.get("ep_counters")}
        print(name, key, post.info["engine"], round(tfb, 1), out[key]["log_loss"], post.info["evaluations"],
              flush=True)
    # NUTS
    if args.chains > 0:
        target = WhitenedLatentGP(model, prior=args.prior)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mc = gpvi.NUTS(num_chains=args.chains, num_warmup=args.warmup, num_draws=args.draws, seed=args.seed,
                           progress_bar=False).run(target)
        tn = time.perf_counter() - t0
        pn, nm, ns, diag = nuts_latent_summary(mc, target, Xt, model.dim, args.pred_draws)
        out["nuts"] = {"time_s": tn, **scores(pn, yt), "mean": nm.tolist(), "std": ns.tolist(), **diag}
        for key, (post, pfb) in fb_probs.items():
            out[key]["theta_diff_sd"] = ((post.mean - nm) / ns).tolist()
            out[key]["prob_mad_vs_nuts"] = float((pfb - pn).abs().mean())
        out["typeii"]["theta_diff_sd"] = ((clf.theta_ - nm) / ns).tolist()
        out["typeii"]["prob_mad_vs_nuts"] = float((p2 - pn).abs().mean())
        print(name, "nuts", round(tn, 1), out["nuts"]["log_loss"], "rhat", out["nuts"]["rhat_max_all"],
              "ess", out["nuts"]["ess_bulk_min_all"], flush=True)
    out["names"] = names
    return out


def report(results: list[dict], args: argparse.Namespace) -> str:
    md = header("Fully Bayesian GP classification (q(theta) on EP's evidence) vs type-II vs NUTS over (theta, v)")
    md += (f"\nPrior on the log-hyperparameters (all methods): `--prior {getattr(args, 'prior', 'default')}`.\n")
    md += (f"\nSettings: training subsample `--n-train {args.n_train}` (stratified, seed {args.seed}; full test sets), "
           f"NUTS {args.chains} chains x ({args.warmup} warmup + {args.draws} draws), predictive from "
           f"{args.pred_draws} evenly spaced NUTS draws; fully Bayesian = `FullyBayesianCVI()` defaults (S&K Hessian-free); "
           f"fully Bayesian, DSVI = the DSVI engine of the module docstring; type-II = `GPClassifier()` defaults. Log loss in nats per test point.\n")
    md += "\n## Test metrics and wall time\n\n"
    md += "| set | N | method | log loss | accuracy | time (s) | mean abs diff of p vs NUTS | max abs theta diff (NUTS sd) |\n"
    md += "|---|---|---|---|---|---|---|---|\n"
    for r in results:
        for key, label in (("typeii", "type-II"), ("bayes", "fully Bayesian (S&K)"),
                           ("bayes_dsvi", "fully Bayesian (DSVI)"), ("nuts", "NUTS")):
            if key not in r:
                continue
            m = r[key]
            mad = m.get("prob_mad_vs_nuts")
            td = m.get("theta_diff_sd")
            md += (f"| {r['dataset']} | {r['N']} | {label} | {m['log_loss']:.4f} | {m['accuracy']:.3f} | "
                   f"{m['time_s']:.1f} | {'' if mad is None else f'{mad:.4f}'} | "
                   f"{'' if td is None else f'{max(abs(x) for x in td):.2f}'} |\n")
    md += "\n## NUTS diagnostics\n\n| set | R-hat max (all) | R-hat max (theta) | bulk ESS min (all) | bulk ESS min (theta) |\n|---|---|---|---|---|\n"
    for r in results:
        if "nuts" in r:
            n = r["nuts"]
            md += (f"| {r['dataset']} | {n['rhat_max_all']:.3f} | {n['rhat_max_theta']:.3f} | "
                   f"{n['ess_bulk_min_all']:.0f} | {n['ess_bulk_min_theta']:.0f} |\n")
    md += "\n## Theta marginals: fully Bayesian q vs NUTS\n\n| set | parameter | q mean | q sd | NUTS mean | NUTS sd | diff (NUTS sd) | type-II |\n|---|---|---|---|---|---|---|---|\n"
    for r in results:
        if "nuts" not in r:
            continue
        b, n = r["bayes"], r["nuts"]
        for j, nm in enumerate(r["names"]):
            md += (f"| {r['dataset']} | {nm} | {b['mean'][j]:.3f} | {b['std'][j]:.3f} | {n['mean'][j]:.3f} | "
                   f"{n['std'][j]:.3f} | {b['theta_diff_sd'][j]:+.2f} | {r['typeii']['theta'][j]:.3f} |\n")
    md += ("\n## Fully Bayesian run details\n\n| set | engine | MAP-II (s) | Laplace (s) | q (s) | steps | converged "
           "| bound | bound se | target evaluations | inner steps (EP sweeps) / evaluation |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in results:
        for key in ("bayes", "bayes_dsvi"):
            if key not in r:
                continue
            b = r[key]
            ep = b.get("ep_counters")
            ev, inner = (ep["evaluations"], ep["sweeps"]) if ep else (b["evaluations"], b["inner_steps"])
            md += (f"| {r['dataset']} | {b['engine']} | {b['map_time_s']:.1f} | {b['laplace_time_s']:.1f} | "
                   f"{b['q_time_s']:.1f} | {b['q_steps']} | {b['q_converged']} | {b['elbo']:.3f} | "
                   f"{b['elbo_se']:.3f} | {ev} | {inner / max(ev, 1):.1f} |\n")
    return md


def problem_args(ap: argparse.ArgumentParser, *, warmup: int, draws: int, pred_draws: int) -> None:
    """The options that fix the problems (sets, training subsample, seed) and the NUTS run; shared with
    ``benchmarks.classification_nuts_ref``, which runs the same problems with longer chains."""
    ap.add_argument("--datasets", nargs="+", default=DATASETS, choices=DATASETS)
    ap.add_argument("--n-train", type=int, default=100)
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--draws", type=int, default=draws)
    ap.add_argument("--pred-draws", type=int, default=pred_draws)
    ap.add_argument("--seed", type=int, default=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    problem_args(ap, warmup=300, draws=500, pred_draws=200)
    ap.add_argument("--name", default="classification_bayes")
    ap.add_argument("--dsvi-baseline", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--prior", default="default", choices=["default", "scaled"],
                    help="the prior on theta of every method (default N(0, 10 I); scaled: centred at the model's "
                         "initial_theta())")
    args = ap.parse_args()
    torch.set_default_dtype(torch.float64)
    results = [run_one(name, args) for name in args.datasets]
    write(args.name, report(results, args), {"args": vars(args), "results": results})
    print(report(results, args))


if __name__ == "__main__":
    main()
