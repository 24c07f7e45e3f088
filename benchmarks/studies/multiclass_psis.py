r"""The fully Bayesian classifier's importance step (:class:`gpvi.inference.cvi.importance.ImportanceGaussian`) for
multi-class softmax models (issue 59, item 3): decided on the tuning family, the others reported as measured.

The binary classifier tries the step first since issue 59's seventh pass (:data:`gpvi.inference.cvi.bayes.
IMPORTANCE`); here :data:`gpvi.inference.cvi.bayes.MULTICLASS_IMPORTANCE` switches it on for a multi-class model on
multi-class EP's evidence (at most :data:`~gpvi.inference.cvi.importance.MAX_DIM` log-hyperparameters: 3 inputs with
ARD and the signal variance). Per case and seed, ``FullyBayesianCVI(seed=s)`` with the step off (``sk``: S&K, as
before) and on (``imp``), one after the other in one process, one thread. Cases:

* ``mc_clf:3/N/K`` (tuning, ``benchmarks/heldout_families.py``'s ``MULTICLASS_SPLIT``): mc_clf with its first 3
  inputs, N training rows, K classes, the higher noise level; no NUTS reference, so q's change between the two is
  reported (and, with ``--reference``, 1,024 + 1,024 draws of the step: EP's posterior moments);
* ``mc_blobs/N/K`` (held out): the same;
* ``synth6``, ``synth10``, ``synth10b`` (``benchmarks/multiclass_bayes.py``; 3 inputs, K = 6 / 10 / 10): against
  their stored NUTS runs over (theta, latents), the largest |mean - NUTS mean| in NUTS sds, q's sds over NUTS's and
  the test probabilities' mean absolute difference from NUTS's.

Run: ``OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python -m benchmarks.studies.multiclass_psis --cases mc_clf:3/100/4``.
Results: ``benchmarks/studies/results/multiclass_psis_<label>.{md,json}``.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from typing import Any

import numpy as np
import torch

from benchmarks.studies._common import header, write
from gpvi.inference.cvi import bayes


def case_data(case: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any] | None, str]:
    """``(X, y, X_test, y_test, NUTS row or None, half)``."""
    if "/" not in case:
        from benchmarks.multiclass_bayes import synthetic
        from benchmarks.studies.multiclass_ep_is import stored
        Xtr, Xte, ytr, yte, _ = synthetic(case)
        return Xtr, ytr, Xte, yte, stored(case)["nuts"], "NUTS reference"
    from benchmarks.heldout_families import MULTICLASS_SPLIT, multiclass_data
    fam, n, k = case.split("/")
    fam, _, cols = fam.partition(":")
    Xtr, ytr, Xte, yte = multiclass_data(fam, int(n), int(k), 1)
    if cols:
        Xtr, Xte = Xtr[:, :int(cols)], Xte[:, :int(cols)]
    return Xtr, ytr, Xte, yte, None, ("tuning" if fam in MULTICLASS_SPLIT["tuning"] else "heldout")


def fit(model: Any, Xt: torch.Tensor, setting: str, seed: int) -> dict[str, Any]:
    keep = bayes.MULTICLASS_IMPORTANCE
    bayes.MULTICLASS_IMPORTANCE = setting != "sk"
    try:
        if setting == "ref":
            from gpvi.inference.cvi import importance
            keep_draws, importance.DRAWS = importance.DRAWS, (1024, 1024)
        load = os.getloadavg()[0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            post = bayes.FullyBayesianCVI(seed=seed + (100 if setting == "ref" else 0)).run(model)
            wall = time.perf_counter() - t0
            p = post.predict_proba(Xt)
    finally:
        bayes.MULTICLASS_IMPORTANCE = keep
        if setting == "ref":
            importance.DRAWS = keep_draws
    i = post.info
    rec = i.get("importance") or {}
    return {"setting": setting, "seed": seed, "wall_s": wall, "load": load, "engine": i["engine"],
            "q_time_s": i["q_time_s"], "evaluations": i["ep_counters"]["evaluations"],
            "accepted": rec.get("accepted"), "khat": rec.get("khat"), "ess": rec.get("ess"),
            "mean": post.mean.tolist(), "sd": post.std.tolist(), "p": np.asarray(p).tolist()}


def study_case(case: str, seeds: list[int], reference: bool) -> list[dict[str, Any]]:
    from gpvi.models.multiclass import GPMulticlass

    Xtr, ytr, Xte, yte, nuts, half = case_data(case)
    model = GPMulticlass(Xtr, ytr)
    Xt = torch.as_tensor(Xte, dtype=torch.float64)
    rows = []
    for seed in seeds:
        for setting in ("sk", "imp"):
            r = {"case": case, "half": half, "D": len(model.names), "K": model.num_classes, **fit(model, Xt, setting,
                                                                                                   seed)}
            rows.append(r)
            print(case, setting, seed, f"{r['wall_s']:.1f}s q {r['q_time_s']:.1f}s", r["engine"], r["evaluations"],
                  r["khat"], r["ess"], flush=True)
    ref = None
    if nuts is not None:
        ref = {"mean": nuts["mean"][:len(model.names)], "sd": nuts["std"][:len(model.names)], "p": nuts["p_test"],
               "name": "NUTS"}
    elif reference:
        ref = {**fit(model, Xt, "ref", seeds[0]), "name": "2,048 draws"}
    for seed in seeds:
        sk, imp = (next(r for r in rows if r["seed"] == seed and r["setting"] == s) for s in ("sk", "imp"))
        m0, s0 = np.asarray(sk["mean"]), np.asarray(sk["sd"])
        imp["change_mean_sd"] = float(np.abs((np.asarray(imp["mean"]) - m0) / s0).max())
        imp["change_log_sd"] = float(np.abs(np.log(np.asarray(imp["sd"]) / s0)).max())
        imp["p_change"] = float(np.abs(np.asarray(imp["p"]) - np.asarray(sk["p"])).max())
        for r in (sk, imp):
            if ref is not None:
                rm, rs = np.asarray(ref["mean"]), np.asarray(ref["sd"])
                r["ref"] = ref["name"]
                r["mean_err"] = float(np.abs((np.asarray(r["mean"]) - rm) / rs).max())
                r["sd_ratio"] = [float(v) for v in (np.asarray(r["sd"]) / rs)]
                r["p_err"] = float(np.abs(np.asarray(r["p"]) - np.asarray(ref["p"])).mean())
    return rows


def report(rows: list[dict[str, Any]], cmd: str) -> str:
    lines = [header(f"Multi-class fully Bayesian classifier: S&K against the importance step first ({cmd})"),
             "Protocol in the docstring of `benchmarks/studies/multiclass_psis.py` (one thread). change: the step's "
             "q against S&K's (largest mean change in S&K's sds / largest |log sd ratio|; largest change of a test "
             "probability).", "",
             "| case | half | K | D | seed | setting | engine | wall s [load] | q stage s | EP evaluations | k-hat | "
             "ESS "
             "| change | ref | mean error (ref sd) | sd / ref sd | mean abs p diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ch = (f"{r['change_mean_sd']:.3f} / {r['change_log_sd']:.3f}; {r['p_change']:.4f}" if "change_mean_sd" in r
              else "-")
        k = "-" if r["khat"] is None else f"{r['khat']:.2f}"
        e = "-" if r["ess"] is None else f"{r['ess']:.0f}"
        ref = (f"{r['ref']} | {r['mean_err']:.3f} | {min(r['sd_ratio']):.2f}-{max(r['sd_ratio']):.2f} | "
               f"{r['p_err']:.4f}" if "ref" in r else "- | - | - | -")
        lines.append(f"| {r['case']} | {r['half']} | {r['K']} | {r['D']} | {r['seed']} | {r['setting']} | "
                     f"{r['engine']} | {r['wall_s']:.1f} [{r['load']:.1f}] | {r['q_time_s']:.1f} | {r['evaluations']} "
                     f"| {k} | {e} | {ch} | {ref} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=["mc_clf:3/100/4"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--reference", action="store_true", help="2,048 draws of the step where no NUTS row exists")
    p.add_argument("--label", default="h59g")
    a = p.parse_args()
    torch.set_num_threads(1)
    import importlib
    importlib.import_module("arviz")                  # before the first fit: its import is not the method's cost
    rows: list[dict[str, Any]] = []
    cmd = "--cases " + " ".join(a.cases)
    for case in a.cases:
        rows += study_case(case, a.seeds, a.reference)
        write(f"multiclass_psis_{a.label}", report(rows, cmd),
              {"args": vars(a), "rows": [{k: v for k, v in r.items() if k != "p"} for r in rows]})
    print(report(rows, cmd))


if __name__ == "__main__":
    main()
