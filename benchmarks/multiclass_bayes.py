r"""Multi-class GP classification with the hyperparameters integrated out: fully Bayesian CVI and MAP-II vs NUTS.

Sets: iris, wine and digits from scikit-learn (the splits of ``benchmarks/multiclass.py``: stratified 70/30, seed
0, inputs standardised with the training rows' mean and sd; digits is its stratified subsample of 300 rows). Model:
``GPMulticlass`` (softmax, K latent GPs sharing one ``ScaleKernel(RBFKernel(ard_num_dims=d))``; on digits one
isotropic lengthscale started at the model's data-scaled theta, as in ``benchmarks/multiclass.py``), prior
N(0, 10 I) on the log-hyperparameters throughout. Synthetic sets ``synth4`` (K = 4, 100 training rows, 5 inputs)
``synth6`` (K = 6, 90 rows, 3 inputs) and ``synth10`` (K = 10, 100 rows, 3 inputs; 10 training and 30 test rows per class), 300 test rows each (:func:`synthetic`). Multi-class EP costs
:math:`O((NK)^3)` per sweep, with quasi-Monte Carlo tilted moments for K >= 4: an EP row on digits (N K = 2,100)
takes hours.

* **MAP-II**: ``TypeII(CVI())`` defaults.
* **Fully Bayesian on the bound** (``--evidence`` includes ``cvi``): ``FullyBayesianCVI(evidence="cvi")`` (the
  default for multi-class models before 2026-11-25): MAP-II, a Laplace start and S&K's Hessian-free Gaussian
  q(theta) on the profiled multi-class CVI bound (:class:`gpvi.inference.cvi.bound.CVIBoundTarget`),
  32 draws of theta in the predictive mixture.
* **Fully Bayesian on EP** (``--evidence`` includes ``ep``): ``FullyBayesianCVI(evidence="ep")``, what
  ``FullyBayesianCVI()`` runs on a softmax model (K = 3 since 2026-11-25, every K since 2026-11-27): the same with
  multi-class EP's :math:`\log Z_{EP}(\theta)` (:func:`gpvi.numerics.ep_multiclass.multiclass_ep`,
  Anderson-accelerated) as the evidence, started at its MAP point.
* **NUTS** over (theta, V), the whitened latent values of every class (:class:`gpvi.models.whitened.WhitenedLatentGP`,
  D + K N dimensions), ``--chains`` chains of ``--warmup`` + ``--draws``; predictive from ``--pred-draws`` evenly
  spaced draws. The reference: no Gaussian or class-factorised approximation.

Reported: test log loss and accuracy, wall time (fit only), theta means against NUTS's in NUTS posterior sds, and
the mean absolute difference of the test class probabilities from NUTS's. Each set is written when it finishes
(``results/<name>.md``/``.json``), so an interrupted run keeps the sets it has done.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.multiclass_bayes [--sets iris wine] [--name multiclass_bayes]``.
The fits of one set can run in two processes on the two cores, e.g. ``--sets digits --evidence cvi --chains 0
--name A`` and ``--sets digits --evidence --name B``, then ``--merge A B --name multiclass_bayes_digits`` joins their
JSONs (each row keeps its own wall time and load) and recomputes the comparisons with NUTS from the stored
probabilities.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from typing import Any

import numpy as np
import torch

from benchmarks._common import header, nuts_latent_summary, write
from benchmarks.multiclass import load, log_loss

SETS = ["iris", "wine", "digits", "synth4", "synth6", "synth10", "synth10b"]
SYNTH = {"synth4": (4, 100, 5), "synth6": (6, 90, 3), "synth10": (10, 100, 3), "synth10b": (10, 100, 3)}
DATA_SEED = {"synth10b": 3}
"""Synthetic sets drawn with a seed other than 0: ``synth10b`` is a second K = 10 set, held out from every choice,
its seed the first from 1 whose rarest class has 20 test rows (seeds 1 and 2 leave 0 and 6), chosen before any fit."""
STRATIFIED = {"synth10", "synth10b"}
"""Sets whose training and test rows are drawn per class (n / K and 300 / K of each) from a pool of 20,000 draws:
the first n draws of ``synth10`` leave a class with no training row."""
"""Synthetic sets: name -> (K, training rows, inputs); 300 test rows each (:func:`synthetic`)."""


def synthetic(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    """A K-class set with nonlinear boundaries: inputs N(0, I_d); class scores
    g_k(x) = 2 sin(w_k^T x + b_k) + a_k^T x (w_k ~ N(0, I / 2), a_k ~ N(0, I / 4), b_k ~ U(0, 2 pi)); label
    argmax_k (g_k(x) + 0.5 Gumbel) (a softmax draw at temperature 0.5); seed 0 (``DATA_SEED``); the training rows are the first
    ``n`` of the draw (not stratified), inputs standardised with the training rows' mean and sd."""
    K, n, d = SYNTH[name]
    seed = DATA_SEED.get(name, 0)
    rng = np.random.default_rng(seed)
    W, A = rng.normal(0, np.sqrt(0.5), (K, d)), rng.normal(0, 0.5, (K, d))
    b = rng.uniform(0, 2 * np.pi, K)
    pool = 20_000 if name in STRATIFIED else n + 300
    X = rng.normal(size=(pool, d))
    g = 2 * np.sin(X @ W.T + b) + X @ A.T + 0.5 * rng.gumbel(size=(pool, K))
    y = g.argmax(1)
    if name in STRATIFIED:                            # the first n // K and next 300 // K rows of each class
        rows = [np.flatnonzero(y == k) for k in range(K)]
        tr = np.concatenate([r[:n // K] for r in rows])
        te = np.concatenate([r[n // K:n // K + 300 // K] for r in rows])
        X, y = np.concatenate([X[tr], X[te]]), np.concatenate([y[tr], y[te]])
        n = len(tr)
    Xtr, Xte, ytr, yte = X[:n], X[n:], y[:n], y[n:]
    mu, sd = Xtr.mean(0), Xtr.std(0)
    return (Xtr - mu) / sd, (Xte - mu) / sd, ytr, yte, f"synthetic, K={K}, d={d}, seed {seed}"
BAYES_KEY = {"cvi": "bayes", "ep": "bayes_ep"}
BAYES_LABEL = {"bayes": "gpvi fully Bayesian (CVI bound)", "bayes_ep": "gpvi fully Bayesian (EP)"}


def scores(p: torch.Tensor, y: np.ndarray) -> dict[str, float]:
    pn = p.cpu().numpy()
    return {"log_loss": log_loss(pn, y), "accuracy": float((pn.argmax(1) == y).mean())}


def run_set(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import gpvi
    from gpvi.inference.cvi.bayes import FullyBayesianCVI
    from gpvi.inference.cvi.engine import CVI
    from gpvi.inference.cvi.typeii import TypeII
    from gpvi.models.multiclass import GPMulticlass
    from gpvi.models.whitened import WhitenedLatentGP

    Xtr, Xte, ytr, yte, note = synthetic(name) if name in SYNTH else load(name, 300)
    model = GPMulticlass(Xtr, ytr)
    if name == "digits":                  # one lengthscale, started as the default kernel (benchmarks/multiclass.py)
        import gpytorch

        kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
        model = GPMulticlass(Xtr, ytr, kernel=kernel, theta=GPMulticlass(Xtr, ytr, kernel=kernel).initial_theta())
    Xt = torch.as_tensor(Xte, dtype=torch.float64)
    out: dict[str, Any] = {"set": name, "N_train": int(Xtr.shape[0]), "N_test": int(Xte.shape[0]),
                           "d": int(Xtr.shape[1]), "K": model.num_classes, "names": list(model.names),
                           "y_test": yte.tolist(), "note": note}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        mp = TypeII(CVI(progress_bar=False)).run(model)
        tm = time.perf_counter() - t0
        p_map = mp.predict_proba(Xt)
        out["map"] = {"time_s": tm, **scores(p_map, yte), "theta": mp.theta.tolist(), "load_1min": os.getloadavg()[0],
                      "p_test": p_map.tolist()}
        print(name, "MAP-II", round(tm, 2), out["map"]["log_loss"], flush=True)
        fbs = {}
        for ev in args.evidence:
            key = BAYES_KEY[ev]
            t0 = time.perf_counter()
            fb = fbs[key] = FullyBayesianCVI(seed=args.seed, evidence=ev).run(model)
            tf = time.perf_counter() - t0
            p_fb = fb.predict_proba(Xt)
            out[key] = {"time_s": tf, **scores(p_fb, yte), "mean": fb.mean.tolist(), "p_test": p_fb.tolist(),
                        "std": fb.std.tolist(), "elbo": fb.elbo, "elbo_se": fb.elbo_se, "load_1min": os.getloadavg()[0],
                        **{k: fb.info.get(k) for k in ("engine", "evidence", "map_time_s", "laplace_time_s", "q_time_s",
                                                       "q_steps", "evaluations", "inner_steps", "failures",
                                                       "unconverged", "predictive_time_s", "failed_draws",
                                                       "ep_map_time_s", "ep_counters")}}
            print(name, "fully Bayesian", ev, round(tf, 1), out[key]["log_loss"], fb.info["evaluations"], flush=True)
        if args.chains > 0:
            target = WhitenedLatentGP(model)
            t0 = time.perf_counter()
            mc = gpvi.NUTS(num_chains=args.chains, num_warmup=args.warmup, num_draws=args.draws, seed=args.seed,
                           progress_bar=False).run(target)
            tn = time.perf_counter() - t0
    if args.chains > 0:
        p_n, nm, ns, diag = nuts_latent_summary(mc, target, Xt, model.dim, args.pred_draws)
        out["nuts"] = {"time_s": tn, **scores(p_n, yte), "mean": nm.tolist(), "std": ns.tolist(), **diag,
                       "load_1min": os.getloadavg()[0], "p_test": p_n.tolist()}
        compare(out)
        print(name, "NUTS", round(tn, 1), out["nuts"]["log_loss"], "rhat", out["nuts"]["rhat_max_all"], "ess",
              out["nuts"]["ess_bulk_min_all"], flush=True)
    return out


def compare(out: dict[str, Any]) -> None:
    """Add to every fitted row of a set its distance from NUTS (theta means in NUTS sds, mean absolute difference of
    the test probabilities), from the stored values; nothing when the set has no NUTS row."""
    if "nuts" not in out:
        return
    nm, ns = np.asarray(out["nuts"]["mean"]), np.asarray(out["nuts"]["std"])
    p_n = np.asarray(out["nuts"]["p_test"])
    for key in ("map", *BAYES_LABEL):
        if key not in out:
            continue
        row = out[key]
        theta = np.asarray(row["theta"] if key == "map" else row["mean"])
        row["theta_diff_sd"] = ((theta - nm) / ns).tolist()
        if "p_test" in row:
            row["prob_mad_vs_nuts"] = float(np.abs(np.asarray(row["p_test"]) - p_n).mean())


def merge(names: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The sets of the committed runs ``names`` (``results/<name>.json``) joined set by set: each fitted row from
    the first run that has it (MAP-II from the first), comparisons recomputed by :func:`compare`. ``args`` takes
    the NUTS settings of the run whose NUTS row is kept and the union of the runs' ``evidence``."""
    import json

    from benchmarks._common import RESULTS

    joined: dict[str, dict[str, Any]] = {}
    args.evidence = []
    for nm in names:
        data = json.loads((RESULTS / f"{nm}.json").read_text())["data"]
        run_args = data["args"]
        args.evidence += [e for e in run_args["evidence"] if e not in args.evidence]
        for r in data["results"]:
            fresh = r["set"] not in joined
            have = joined.setdefault(r["set"], dict(r))
            if "nuts" in r and (fresh or "nuts" not in have) and run_args["chains"] > 0:
                for k in ("chains", "warmup", "draws", "pred_draws", "seed"):   # the run whose NUTS row is kept
                    setattr(args, k, run_args[k])
            for key in ("map", "nuts", *BAYES_LABEL):
                if key in r and key not in have:
                    have[key] = r[key]
            have.setdefault("runs", [])
            have["runs"].append(nm)
    out = list(joined.values())
    for r in out:
        compare(r)
    return out


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    md = header("Multi-class GP classification, hyperparameters integrated out: fully Bayesian CVI, MAP-II, NUTS")
    md += ("\nProtocol in the docstring of `benchmarks/multiclass_bayes.py`: the splits of "
           f"`benchmarks/multiclass.py`; "
           f"NUTS {args.chains} chains x ({args.warmup} warmup + {args.draws} draws) over (theta, V), predictive from "
           f"{args.pred_draws} evenly spaced draws; fully Bayesian = `FullyBayesianCVI(evidence=...)`, S&K on the "
           f"profiled multi-class CVI bound (`\"cvi\"`) or on multi-class EP (`\"ep\"`, the default for the "
           f"softmax: K = 3 since 2026-11-25, every K since 2026-11-27, with quasi-Monte Carlo tilted moments for "
           f"K >= 4). One run each; log loss in nats per test point; 1-minute load after each fit in brackets "
           f"(rows joined by `--merge` come from separate processes: compare their walls with their loads).\n")
    md += ("\n## Test metrics and wall time\n\n| set | method | log loss | accuracy | wall s [load] | mean abs diff of "
           "p vs NUTS | max abs theta diff (NUTS sd) |\n|---|---|---|---|---|---|---|\n")
    for r in results:
        label = f"{r['set']} ({r['N_train']} / {r['N_test']}, d={r['d']}, K={r['K']})"
        for key, name in (("map", "gpvi MAP-II"), *BAYES_LABEL.items(), ("nuts", "NUTS")):
            if key not in r:
                continue
            m = r[key]
            mad, td = m.get("prob_mad_vs_nuts"), m.get("theta_diff_sd")
            md += (f"| {label} | {name} | {m['log_loss']:.4f} | {m['accuracy']:.3f} | {m['time_s']:.1f} "
                   f"[{m['load_1min']:.1f}] | {'' if mad is None else f'{mad:.4f}'} | "
                   f"{'' if td is None else f'{max(abs(x) for x in td):.2f}'} |\n")
    md += ("\n## NUTS diagnostics\n\n| set | R-hat max (all) | R-hat max (theta) | bulk ESS min (all) | bulk ESS min "
           "(theta) | divergences |\n|---|---|---|---|---|---|\n")
    for r in results:
        if "nuts" in r:
            n = r["nuts"]
            md += (f"| {r['set']} | {n['rhat_max_all']:.3f} | {n['rhat_max_theta']:.3f} | {n['ess_bulk_min_all']:.0f} "
                   f"| {n['ess_bulk_min_theta']:.0f} | {n['divergences']} |\n")
    md += ("\n## Theta marginals: fully Bayesian q vs NUTS\n\n| set | evidence | parameter | q mean | q sd | NUTS mean "
           "| NUTS sd | diff (NUTS sd) | MAP-II |\n|---|---|---|---|---|---|---|---|---|\n")
    for r in results:
        if "nuts" not in r:
            continue
        n = r["nuts"]
        for key in BAYES_LABEL:
            if key not in r:
                continue
            b = r[key]
            for j, nm in enumerate(r["names"]):
                md += (f"| {r['set']} | {b['evidence']} | {nm} | {b['mean'][j]:.3f} | {b['std'][j]:.3f} | "
                       f"{n['mean'][j]:.3f} | {n['std'][j]:.3f} | {b['theta_diff_sd'][j]:+.2f} | "
                       f"{r['map']['theta'][j]:.3f} |\n")
    md += ("\n## Fully Bayesian run details\n\nEP: its MAP search (s) and EP sweeps per evaluation; the CVI bound's "
           "target evaluations and inner steps are counted for both (EP's latent posteriors are CVI's).\n\n"
           "| set | evidence | MAP-II (s) | EP MAP (s) | Laplace (s) | q (s) | predictive (s) | steps | "
           "ELBO | ELBO se | target evaluations | inner steps / evaluation | EP evaluations | "
           "EP sweeps / evaluation |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in results:
        for key in BAYES_LABEL:
            if key not in r:
                continue
            b = r[key]
            epc = b.get("ep_counters") or {}
            epm = b.get("ep_map_time_s")
            sweeps = f"{epc['sweeps'] / max(epc['evaluations'], 1):.1f}" if epc else ""
            md += (f"| {r['set']} | {b['evidence']} | {b['map_time_s']:.1f} | "
                   f"{'' if epm is None else f'{epm:.1f}'} | {b['laplace_time_s']:.1f} | {b['q_time_s']:.1f} | "
                   f"{b['predictive_time_s']:.1f} | {b['q_steps']} | {b['elbo']:.3f} | {b['elbo_se']:.3f} | "
                   f"{b['evaluations']} | {b['inner_steps'] / max(b['evaluations'], 1):.1f} | "
                   f"{epc.get('evaluations', '')} | {sweeps} |\n")
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="+", default=SETS, choices=SETS)
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--draws", type=int, default=500)
    ap.add_argument("--pred-draws", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="multiclass_bayes")
    ap.add_argument("--evidence", nargs="*", default=["cvi", "ep"], choices=["cvi", "ep"],
                    help="fully Bayesian rows (none: MAP-II and NUTS only)")
    ap.add_argument("--merge", nargs="+", metavar="RUN", help="join the JSONs of these runs (results/RUN.json) "
                    "into --name; no fits")
    args = ap.parse_args()
    if args.merge:
        results = merge(args.merge, args)
        write(args.name, report(results, args), {"args": vars(args), "results": results})
        print(report(results, args))
        return
    results: list[dict[str, Any]] = []
    for name in args.sets:
        results.append(run_set(name, args))
        write(args.name, report(results, args), {"args": vars(args), "results": results})
    print(report(results, args))


if __name__ == "__main__":
    main()
