r"""NUTS references over (theta, latents) for held-out binary families, and the fully Bayesian classifier's q against
them with and without the importance step (issue 59, item 3: the accuracy of held-out cells, which had none).

Per case (``--cases``: a family of ``benchmarks/heldout_families.py`` at N training rows, the higher noise level):
NUTS on :class:`gpvi.models.whitened.WhitenedLatentGP` of ``gpvi.GPClassification(X, y)`` (default prior, 4 chains x
(``--warmup`` + ``--draws``), seed 0; the bar: R-hat <= 1.01 and bulk ESS >= 400 over theta, said plainly where it
is missed), then ``FullyBayesianCVI(seed=s)`` with the importance step (the default) and without it
(``importance=False``: S&K), seeds ``--seeds``. Reported: the largest |mean - NUTS mean| in NUTS sds, q's sds over
NUTS's, and the test probabilities' mean absolute difference from NUTS's (``--pred-draws`` evenly spaced draws).

Run: ``OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python -m benchmarks.studies.bayes_heldout_nuts --cases circles/100``.
Results: ``benchmarks/studies/results/bayes_heldout_nuts_<label>.{md,json}``.
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

import numpy as np
import torch

from benchmarks.heldout_families import binary_data, half_of
from benchmarks.studies._common import header, write


def reference(X: torch.Tensor, y: torch.Tensor, Xt: torch.Tensor, warmup: int, draws: int, pred_draws: int
              ) -> dict[str, Any]:
    import gpvi
    from gpvi.models.whitened import WhitenedLatentGP

    model = gpvi.GPClassification(X, y)
    target = WhitenedLatentGP(model)
    D = model.dim
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mc = gpvi.NUTS(num_chains=4, num_warmup=warmup, num_draws=draws, seed=0, progress_bar=False).run(target)
    d = mc.samples
    diag = mc.diagnostics()
    idx = torch.linspace(0, d.shape[0] - 1, min(pred_draws, d.shape[0])).round().long()
    th = d[:, :D]
    return {"time_s": time.perf_counter() - t0, "mean": th.mean(0).tolist(), "sd": th.std(0).tolist(),
            "rhat_max_theta": float(diag["r_hat"][:D].max()), "ess_bulk_min_theta": float(diag["ess_bulk"][:D].min()),
            "ess_tail_min_theta": float(diag["ess_tail"][:D].min()), "rhat_max_all": float(diag["r_hat"].max()),
            "divergences": mc.info.get("divergences"), "p": target.predict_proba(d[idx], Xt).tolist()}


def study_case(case: str, seeds: list[int], a: argparse.Namespace) -> dict[str, Any]:
    import gpvi
    from gpvi.inference.cvi.bayes import FullyBayesianCVI

    fam, n = case.split("/")
    Xtr, ytr, Xte, _ = binary_data(fam, int(n), 1)
    f64 = torch.float64
    X, y, Xt = (torch.as_tensor(v, dtype=f64) for v in (Xtr, ytr, Xte))
    ref = reference(X, y, Xt, a.warmup, a.draws, a.pred_draws)
    print(case, "NUTS", round(ref["time_s"], 1), "s, R-hat", round(ref["rhat_max_theta"], 3), "ESS",
          round(ref["ess_bulk_min_theta"]), flush=True)
    rm, rs, rp = np.asarray(ref["mean"]), np.asarray(ref["sd"]), np.asarray(ref["p"])
    fits = []
    model = gpvi.GPClassification(X, y)
    for seed in seeds:
        for importance in (True, False):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t0 = time.perf_counter()
                post = FullyBayesianCVI(seed=seed, importance=importance).run(model)
                wall = time.perf_counter() - t0
                p = post.predict_proba(Xt).numpy()
            m, s = post.mean.numpy(), post.std.numpy()
            fits.append({"seed": seed, "importance": importance, "engine": post.info["engine"], "wall_s": wall,
                         "mean_err": float(np.abs((m - rm) / rs).max()), "sd_ratio": (s / rs).tolist(),
                         "p_err": float(np.abs(p - rp).mean())})
            print(case, seed, fits[-1]["engine"], round(wall, 2), round(fits[-1]["mean_err"], 3),
                  round(fits[-1]["p_err"], 4), flush=True)
    return {"case": case, "half": half_of(fam), "D": model.dim, "reference": {k: v for k, v in ref.items() if k != "p"},
            "fits": fits}


def report(rows: list[dict[str, Any]], a: argparse.Namespace) -> str:
    lines = [header("Held-out binary families: NUTS references and the fully Bayesian classifier's q"),
             f"Protocol in the docstring of `benchmarks/studies/bayes_heldout_nuts.py`; NUTS 4 x ({a.warmup} + "
             f"{a.draws}), one thread.", "",
             "| case | half | D | NUTS s | R-hat max theta (all) | bulk / tail ESS min theta | divergences | bar met |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f = r["reference"]
        ok = f["rhat_max_theta"] <= 1.01 and f["ess_bulk_min_theta"] >= 400
        lines.append(f"| {r['case']} | {r['half']} | {r['D']} | {f['time_s']:.0f} | {f['rhat_max_theta']:.3f} "
                     f"({f['rhat_max_all']:.3f}) | {f['ess_bulk_min_theta']:.0f} / {f['ess_tail_min_theta']:.0f} | "
                     f"{f['divergences']} | {'yes' if ok else 'no'} |")
    lines += ["", "| case | seed | engine | wall s | max theta diff (NUTS sd) | q sd / NUTS sd | mean abs diff of p "
              "vs NUTS |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        for f in r["fits"]:
            lines.append(f"| {r['case']} | {f['seed']} | {f['engine']}{'' if f['importance'] else ' (importance=False)'}"
                         f" | {f['wall_s']:.2f} | {f['mean_err']:.3f} | {min(f['sd_ratio']):.2f}-"
                         f"{max(f['sd_ratio']):.2f} | {f['p_err']:.4f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=["circles/100", "clf2/100"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--warmup", type=int, default=800)
    p.add_argument("--draws", type=int, default=1500)
    p.add_argument("--pred-draws", type=int, default=200)
    p.add_argument("--label", default="h59g")
    a = p.parse_args()
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    for case in a.cases:
        rows.append(study_case(case, a.seeds, a))
        write(f"bayes_heldout_nuts_{a.label}", report(rows, a), {"args": vars(a), "rows": rows})
    print(report(rows, a))


if __name__ == "__main__":
    main()
