"""Long NUTS references for GP classification over (theta, v), and the fully Bayesian answers compared with them.

``classification_bayes.py`` compares fully Bayesian CVI with NUTS runs of 4 x (300 + 500) iterations, which did not
mix on three of the four binary sets (R-hat 1.03-1.06, bulk ESS 73-123). The theta comparison ("within 0.3 NUTS sd")
needs a reference that has mixed, so this script runs NUTS longer on exactly the same problems (the same stratified
training subsample, ``--n-train 100``, seed 0; full test sets; logit link, ScaleKernel(RBF, ARD), prior N(0, 10 I)
on the log-hyperparameters; :class:`gpvi.models.whitened.WhitenedLatentGP`) and records, per set: the diagnostics
over theta and over all D + N coordinates (R-hat <= 1.01 and bulk ESS >= 400 are the bar; said plainly where a set
misses it), theta's posterior means and sds, and the test predictive probabilities from ``--pred-draws`` evenly
spaced draws. Results are merged by dataset, so sets can be run one at a time.

After the reference, type-II (``GPClassifier()``), fully Bayesian CVI (``FullyBayesianCVI()``, defaults: q(theta) on
EP's evidence) and fully Bayesian CVI on the CVI bound (``FullyBayesianCVI(evidence="cvi")``, the default before
2026-11-24) run on the same problem, and the comparison reports their largest |theta - reference mean| in reference
sds, sd ratios and the mean absolute difference of their test probabilities from the reference's; the DSVI-engine
and short NUTS rows of ``classification_bayes.json`` are compared on theta too (their probabilities are not stored).
Wall times of the reference are on this shared 2-core machine and are not a comparison (see
``classification_bayes.md`` for the timed comparison).

``--prior scaled`` (since 2026-11-25) gives NUTS and every method compared the prior ``"scaled"`` and writes
``classification_nuts_ref_scaled`` (compared with ``classification_bayes_scaled``).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.classification_nuts_ref --datasets pima``
(``--rerender`` rebuilds the report from the stored JSON files).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import numpy as np
import torch

from benchmarks._common import RESULTS, header, write
from benchmarks.classification_bayes import DATASETS, problem_args, scores, subsample
import gpvi
from gpvi.inference.mcmc.settings import Adaptation
from gpvi.models.whitened import WhitenedLatentGP

NAME = "classification_nuts_ref"


def run_one(name: str, args: argparse.Namespace) -> dict:
    ds = gpvi.datasets.load(name)
    X, y = subsample(torch.as_tensor(ds.X_train, dtype=torch.float64), torch.as_tensor(ds.y_train, dtype=torch.float64),
                     args.n_train, args.seed)
    Xt, yt = torch.as_tensor(ds.X_test, dtype=torch.float64), torch.as_tensor(ds.y_test, dtype=torch.float64)
    model = gpvi.GPClassification(X, y)
    target = WhitenedLatentGP(model, prior=args.prior)
    D = model.dim
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mc = gpvi.NUTS(num_chains=args.chains, num_warmup=args.warmup, num_draws=args.draws, seed=args.seed,
                       progress_bar=False, adaptation=Adaptation(target_accept=args.target_accept)).run(target)
    tn = time.perf_counter() - t0
    d = mc.samples
    diag = mc.diagnostics()
    rhat, ess, ess_tail = diag["r_hat"], diag["ess_bulk"], diag["ess_tail"]
    idx = torch.linspace(0, d.shape[0] - 1, min(args.pred_draws, d.shape[0])).round().long()
    p = target.predict_proba(d[idx], Xt)
    th = d[:, :D]
    out = {"dataset": name, "N": int(X.shape[0]), "D": D, "names": list(model.names), "time_s": tn,
           "chains": args.chains, "warmup": args.warmup, "draws": args.draws, "target_accept": args.target_accept,
           "prior": args.prior,
           **scores(p, yt),
           "mean": th.mean(0).tolist(), "std": th.std(0).tolist(),
           "q05": th.quantile(0.05, dim=0).tolist(), "q95": th.quantile(0.95, dim=0).tolist(),
           "rhat_max_all": float(rhat.max()), "rhat_max_theta": float(rhat[:D].max()),
           "ess_bulk_min_all": float(ess.min()), "ess_bulk_min_theta": float(ess[:D].min()),
           "ess_tail_min_theta": float(ess_tail[:D].min()), "rhat_theta": rhat[:D].tolist(),
           "ess_bulk_theta": ess[:D].tolist(), "divergences": mc.info.get("divergences"),
           "prob": p.tolist()}
    print(name, "reference NUTS", round(tn, 1), "s; log loss", round(out["log_loss"], 4), "R-hat", out["rhat_max_all"],
          "ESS", out["ess_bulk_min_all"], flush=True)
    methods(out, model, X, y, Xt, yt, p, args)
    out["compared"] = compare(out, None)
    return out


def methods(out: dict, model, X, y, Xt, yt, p: torch.Tensor | None, args: argparse.Namespace) -> None:
    """Type-II and the two fully Bayesian variants on the reference's problem, stored in ``out`` (test-probability
    differences from the reference's ``p`` when given)."""
    from gpvi.inference.cvi.bayes import FullyBayesianCVI
    from gpvi.sklearn import GPClassifier

    def against_ref(prob: torch.Tensor) -> dict:
        return {} if p is None else {"prob_mad_vs_ref": float((prob - p).abs().mean())}

    t0 = time.perf_counter()
    clf = GPClassifier(prior=args.prior).fit(X, y)
    t2 = time.perf_counter() - t0
    p2 = torch.as_tensor(clf.predict_proba(Xt)[:, 1], dtype=torch.float64)
    out["typeii"] = {"time_s": t2, **scores(p2, yt), "theta": clf.theta_.tolist(), **against_ref(p2)}
    # fully Bayesian with the default (EP) evidence, and on the CVI bound (the default before 2026-11-24)
    for key, evidence in (("bayes", "ep"), ("bayes_cvi", "cvi")):
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            post = FullyBayesianCVI(seed=args.seed, evidence=evidence, prior=args.prior).run(model)
        tfb = time.perf_counter() - t0
        pfb = post.predict_proba(Xt)
        out[key] = {"time_s": tfb, **scores(pfb, yt), "mean": post.mean.tolist(), "std": post.std.tolist(),
                    "engine": post.info["engine"], "evidence": evidence, **against_ref(pfb)}
        print(out["dataset"], "fully Bayesian, evidence", evidence, round(tfb, 1), "s; p MAD",
              out[key].get("prob_mad_vs_ref"), flush=True)

def compare(ref: dict, bayes: dict | None) -> list[dict]:
    """Rows against the reference: type-II and fully Bayesian (rerun with the reference; compared when the
    reference is made and stored with it as ``ref["compared"]``), then ``classification_bayes.json``'s
    DSVI-engine and short NUTS rows for this set."""
    rm, rs = np.asarray(ref["mean"]), np.asarray(ref["std"])
    rows = list(ref.get("compared", [])) if bayes is not None else []
    stored = bayes or {}
    done = {r["key"] for r in rows}
    prior = ref.get("prior", "default")
    short = "classification_bayes.json" if prior == "default" else f"classification_bayes_{prior}.json"
    for key, label, src in (("typeii", "type-II", ref),
                            ("bayes", "fully Bayesian (S&K, EP evidence: the default), rerun here", ref),
                            ("bayes_cvi", "fully Bayesian (S&K, CVI bound), rerun here", ref),
                            ("bayes_dsvi", f"fully Bayesian (DSVI, EP evidence), {short}", stored),
                            ("nuts", f"NUTS 4 x (300 + 500), {short}", stored)):
        if key not in src or key in done:
            continue
        m = src[key]
        theta = np.asarray(m["theta"] if key == "typeii" else m["mean"])
        diff = (theta - rm) / rs
        row = {"method": label, "key": key, "max_abs_theta_diff_sd": float(np.abs(diff).max()),
               "worst": ref["names"][int(np.abs(diff).argmax())], "log_loss": m["log_loss"], "time_s": m["time_s"]}
        if "std" in m and key != "typeii":
            ratio = np.asarray(m["std"]) / rs
            row["sd_ratio_min"], row["sd_ratio_max"] = float(ratio.min()), float(ratio.max())
        if "prob_mad_vs_ref" in m:
            row["prob_mad"] = m["prob_mad_vs_ref"]
        rows.append(row)
    return rows


def report(refs: list[dict], bayes: dict[str, dict]) -> str:
    md = header("Long NUTS references for GP classification, and the fully Bayesian answers against them")
    priors = sorted({r.get("prior", "default") for r in refs})
    md += f"\nPrior on the log-hyperparameters (every method): {', '.join(f'`{p}`' for p in priors)}.\n"
    md += ("\nSame problems as `classification_bayes.md` (training subsample of 100, stratified, seed 0; full test "
           "sets; NUTS over (theta, v) on `WhitenedLatentGP`, default adaptation at the target acceptance in the "
           "table). The bar for a reference: R-hat <= 1.01 and bulk ESS >= 400 for every theta coordinate.\n")
    notes = sorted({r["note"] for r in refs if r.get("note")})
    md += "".join(f"\nNote: {n}\n" for n in notes)
    md += ("\n## References\n\n| set | D | chains x (warmup + draws), target accept | wall s | R-hat max theta / all "
           "| bulk ESS min theta / all | tail ESS min theta | divergences | meets the bar (theta) | test log loss | accuracy |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in refs:
        ok = r["rhat_max_theta"] <= 1.01 and r["ess_bulk_min_theta"] >= 400
        md += (f"| {r['dataset']} | {r['D']} | {r['chains']} x ({r['warmup']} + {r['draws']}), "
               f"{r.get('target_accept', 0.8):g} | {r['time_s']:.0f} | "
               f"{r['rhat_max_theta']:.3f} / {r['rhat_max_all']:.3f} | {r['ess_bulk_min_theta']:.0f} / "
               f"{r['ess_bulk_min_all']:.0f} | {r['ess_tail_min_theta']:.0f} | {r['divergences']} | "
               f"{'yes' if ok else 'no'} | {r['log_loss']:.4f} | {r['accuracy']:.3f} |\n")
    md += ("\n## Methods against the reference\n\n"
           "| set | method | max abs theta diff (reference sd) | at | sd ratio q / reference | mean abs diff of test p "
           "vs reference | test log loss | wall s |\n|---|---|---|---|---|---|---|---|\n")
    for r in refs:
        for row in compare(r, bayes.get(r["dataset"], {})):
            sd = (f"{row['sd_ratio_min']:.2f}-{row['sd_ratio_max']:.2f}" if "sd_ratio_min" in row else "")
            mad = f"{row['prob_mad']:.4f}" if "prob_mad" in row else ""
            md += (f"| {r['dataset']} | {row['method']} | {row['max_abs_theta_diff_sd']:.2f} | {row['worst']} | {sd} | "
                   f"{mad} | {row['log_loss']:.4f} | {row['time_s']:.1f} |\n")
    md += "\n## Theta marginals of the references\n\n| set | parameter | mean | sd | 5% | 95% | R-hat | bulk ESS |\n"
    md += "|---|---|---|---|---|---|---|---|\n"
    for r in refs:
        for j, nm in enumerate(r["names"]):
            md += (f"| {r['dataset']} | {nm} | {r['mean'][j]:.3f} | {r['std'][j]:.3f} | {r['q05'][j]:.3f} | "
                   f"{r['q95'][j]:.3f} | {r['rhat_theta'][j]:.3f} | {r['ess_bulk_theta'][j]:.0f} |\n")
    return md


def methods_only(ref: dict, args: argparse.Namespace) -> dict:
    """A copy of a stored reference with its methods rerun (:func:`methods`)."""
    ds = gpvi.datasets.load(ref["dataset"])
    X, y = subsample(torch.as_tensor(ds.X_train, dtype=torch.float64), torch.as_tensor(ds.y_train, dtype=torch.float64),
                     args.n_train, args.seed)
    Xt, yt = torch.as_tensor(ds.X_test, dtype=torch.float64), torch.as_tensor(ds.y_test, dtype=torch.float64)
    out = {k: v for k, v in ref.items() if k not in ("typeii", "bayes", "bayes_cvi", "compared")}
    p = torch.as_tensor(ref["prob"], dtype=torch.float64) if "prob" in ref else None
    methods(out, gpvi.GPClassification(X, y), X, y, Xt, yt, p, args)
    out["compared"] = compare(out, None)
    return out


def load_results(name: str) -> list[dict]:
    """The ``results`` list stored by :func:`benchmarks._common.write` (under ``data``) in ``<name>.json``."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text()).get("data") or {}
    return data.get("results", [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    problem_args(ap, warmup=800, draws=1500, pred_draws=400)
    ap.add_argument("--target-accept", type=float, default=0.8,
                    help="NUTS's target acceptance statistic (dual averaging); raise it where divergences show a "
                         "funnel (pima: 217 divergences at 0.8 in 4 x (1500 + 4000))")
    ap.add_argument("--prior", default="default", choices=["default", "scaled"],
                    help="the prior on theta of NUTS and of the methods compared (scaled: centred at the model's "
                         "initial_theta(); written to classification_nuts_ref_scaled and compared with "
                         "classification_bayes_scaled)")
    ap.add_argument("--rerender", action="store_true", help="rebuild the report from the stored JSON only")
    ap.add_argument("--methods-only", action="store_true",
                    help="rerun only type-II and the fully Bayesian fits against the stored references and write "
                         "them to <name>_methods.{md,json} (test-probability differences where a reference kept "
                         "its probabilities)")
    args = ap.parse_args()
    torch.set_default_dtype(torch.float64)
    suffix = "" if args.prior == "default" else f"_{args.prior}"
    name = NAME + suffix
    stored = {r["dataset"]: r for r in load_results(name)}
    bayes = {r["dataset"]: r for r in load_results("classification_bayes" + suffix)}
    if args.rerender and not stored:
        raise SystemExit(f"--rerender: no stored references in {RESULTS / (name + '.json')}")
    if args.methods_only:
        refs = [methods_only(stored[k], args) for k in DATASETS if k in stored and k in args.datasets]
        md = report(refs, {}).replace("Long NUTS references for GP classification, and the fully Bayesian answers "
                                         "against them", "Fully Bayesian GP classification against the stored long "
                                         "NUTS references (methods rerun)")
        write(name + "_methods", md, {"args": vars(args), "results": refs})
        print(md)
        return
    if not args.rerender:
        for ds_name in args.datasets:
            stored[ds_name] = run_one(ds_name, args)
            refs = [stored[k] for k in DATASETS if k in stored]
            write(name, report(refs, bayes), {"args": vars(args), "results": refs})
    refs = [stored[k] for k in DATASETS if k in stored]
    md = report(refs, bayes)
    write(name, md, {"args": vars(args), "results": refs})
    print(md)


if __name__ == "__main__":
    main()
