r"""q(theta) of the fully Bayesian classifier by adaptive importance sampling from the Laplace start instead of the
Salimans-Knowles regression (issue 59, item 3): the "Laplace with a PSIS-checked correction" the twentieth session
left to the planners, prototyped and measured before anything is built.

Where the engine starts (the EP MAP point :math:`\hat\theta` and the Laplace covariance :math:`\Sigma_L` of
:math:`\log Z_{EP} + \log p(\theta)` there), the prototype (:func:`psis_gaussian`) runs two rounds of importance
sampling of EP's posterior over theta, :math:`p_{EP}(\theta\mid\mathbf y) \propto Z_{EP}(\theta)p(\theta)`, each
evaluation one value-only EP run (no gradient, started from the site bank as the engine's are):

1. :math:`M_1` draws of a multivariate Student-t :math:`g_1 = t_\nu(\hat\theta, \Sigma_L)` (scrambled Sobol'
   points through the normal and chi-square quantiles; seeded), their PSIS-weighted mean :math:`m_1` and covariance
   :math:`\Sigma_1`;
2. :math:`M_2` draws of :math:`g_2 = t_\nu(m_1, \Sigma_1)` (:math:`g_1` again where round 1's :math:`\hat k` exceeds
   0.7 or :math:`\Sigma_1` is not positive definite);

then every draw is weighted against the mixture :math:`(M_1 g_1 + M_2 g_2)/(M_1 + M_2)` (the balance heuristic),
Pareto-smoothed (:func:`gpvi.posteriors.weighted.pareto_smooth`), and q is the Gaussian with the weighted mean and
covariance: the moment-matched Gaussian of EP's posterior (S&K's q minimises KL(q || p) instead). Reported: the
final :math:`\hat k`, the weights' ESS, EP evaluations, the q stage's wall.

Per case, ``FullyBayesianCVI(seed=s)`` (the default: S&K) and the prototype (``psis``: the same fit with the q stage
replaced; ``psis_ref``: the same with 1,024 + 1,024 draws, the reference of EP's posterior moments where no NUTS
reference exists) from the same MAP-II, EP MAP and Laplace stages, alternated in one process, one thread. Sets:
the N = 100 subsamples with long NUTS references over (theta, latents) (``benchmarks/results/
classification_nuts_ref.json``: Pima and Ripley tune, Ionosphere and Sonar are held out) and the binary families of
``benchmarks/heldout_families.py`` (``fam/N``, the higher noise level; the split of ``SPLIT``). Errors: the largest
|mean - reference mean| in reference sds and the largest |log sd ratio|; test probabilities' mean absolute
difference from the reference's.

Settings ``sk``: S&K alone (``importance=False``); ``lib`` / ``lib=M1,M2[,M3]``: the library's default
(:class:`gpvi.inference.cvi.importance.ImportanceGaussian` first, since this study) with
:data:`gpvi.inference.cvi.importance.DRAWS` set to those rounds; ``default`` is the library's default of the run's
day (S&K alone in ``h59g_tuning`` and ``h59g_inflate``, importance first in ``h59g_rounds``); ``--max-dim``:
:data:`gpvi.inference.cvi.importance.MAX_DIM` for the ``lib`` settings; cases ``clf8:c/N`` keep clf8's first c
inputs (D = c + 1).

Run: ``OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python -m benchmarks.studies.bayes_psis --cases ripley xor/100``.
Results: ``benchmarks/studies/results/bayes_psis_<label>.{md,json}``.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import time
import warnings
from typing import Any

import numpy as np
import torch
from scipy import stats

from benchmarks.studies._common import header, write
from gpvi.inference.cvi import importance
from gpvi.inference.cvi.bayes import FullyBayesianCVI
from gpvi.posteriors.gaussian import GaussianPosterior
from gpvi.posteriors.info import RunInfo
from gpvi.posteriors.weighted import pareto_smooth

NU = 5.0
"""The proposals' degrees of freedom (fixed before any run)."""


def t_draws(m: torch.Tensor, L: torch.Tensor, num: int, nu: float, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """``num`` scrambled-Sobol' draws of :math:`t_\\nu(m, L L^T)` and the Sobol' seed used."""
    D = m.numel()
    u = torch.quasirandom.SobolEngine(D + 1, scramble=True, seed=seed).draw(num, dtype=torch.float64)
    u = u.clamp(1e-12, 1 - 1e-12).numpy()
    z = stats.norm.ppf(u[:, :D])
    w = stats.chi2.ppf(u[:, D], nu) / nu
    x = m.numpy() + (z / np.sqrt(w)[:, None]) @ L.numpy().T
    return torch.as_tensor(x, dtype=torch.float64), u


def t_logpdf(x: np.ndarray, m: np.ndarray, S: np.ndarray, nu: float) -> np.ndarray:
    return stats.multivariate_t.logpdf(x, loc=m, shape=S, df=nu)


def weighted_moments(x: np.ndarray, lw: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Mean, covariance and ESS of draws ``x`` under normalised log weights ``lw``."""
    w = np.exp(lw - lw.max())
    w /= w.sum()
    m = w @ x
    d = x - m
    return m, (w[:, None] * d).T @ d, float(1.0 / (w ** 2).sum())


def psis_gaussian(target: Any, m0: torch.Tensor, L0: torch.Tensor, M1: int, M2: int, seed: int,
                  chunk: int = 16, inflate: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """``(mean, covariance, record)`` of the two-round prototype (module docstring)."""
    def lj(x: torch.Tensor) -> np.ndarray:
        return torch.cat([target.log_joint_value(x[i:i + chunk]) for i in range(0, len(x), chunk)]).numpy()

    S0 = (L0 @ L0.T).numpy()
    x1, _ = t_draws(m0, L0, M1, NU, seed)
    l1 = lj(x1)
    lw1, k1 = pareto_smooth(l1 - t_logpdf(x1.numpy(), m0.numpy(), S0, NU))
    m1, S1, ess1 = weighted_moments(x1.numpy(), lw1)
    try:
        L1 = torch.linalg.cholesky(torch.as_tensor(S1))
        ok = k1 <= 0.7
    except RuntimeError:
        ok = False
    if not ok:
        m1, S1, L1 = m0.numpy(), S0, L0
    else:
        S1, L1 = S1 * inflate ** 2, L1 * inflate
    x2, _ = t_draws(torch.as_tensor(m1), L1, M2, NU, seed + 1)
    l2 = lj(x2)
    x = np.concatenate([x1.numpy(), x2.numpy()])
    ll = np.concatenate([l1, l2])
    lg = np.logaddexp(math.log(M1 / (M1 + M2)) + t_logpdf(x, m0.numpy(), S0, NU),
                      math.log(M2 / (M1 + M2)) + t_logpdf(x, m1, S1, NU))
    lw, k = pareto_smooth(ll - lg)
    m, S, ess = weighted_moments(x, lw)
    rec = {"khat1": k1, "ess1": ess1, "round2_adapted": bool(ok), "khat": k, "ess": ess,
           "nonfinite": int((~np.isfinite(ll)).sum())}
    return torch.as_tensor(m), torch.as_tensor(S), rec


class PSISFit(FullyBayesianCVI):
    """``FullyBayesianCVI`` with its q stage replaced by :func:`psis_gaussian` (``M1`` + ``M2`` draws)."""

    def __init__(self, M1: int, M2: int, inflate: float = 1.0, **kw: Any) -> None:
        super().__init__(importance=False, **kw)      # the library's own importance step would run before _fit_q
        self.inflate = inflate
        self.M1, self.M2 = M1, M2
        self.record: dict[str, Any] = {}

    def _fit_q(self, engine: Any, target: Any, start: Any) -> Any:
        s = start(target)
        c0 = dict(target.counters)
        t0 = time.perf_counter()
        m, S, rec = psis_gaussian(target, s.theta, s.scale_tril, self.M1, self.M2, self.seed, inflate=self.inflate)
        rec["wall_s"] = time.perf_counter() - t0
        rec["evaluations"] = target.counters["evaluations"] - c0["evaluations"]
        rec["sweeps"] = target.counters["sweeps"] - c0["sweeps"]
        self.record = rec
        L = torch.linalg.cholesky(S)
        info = RunInfo(engine="PSIS", converged=True, steps=self.M1 + self.M2, time_s=rec["wall_s"])
        q = GaussianPosterior(m, L, list(target.names), target, info=info)
        return q, "PSIS", None, None


def case_data(case: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any] | None, str]:
    """``(X, y, X_test, NUTS reference or None, half)`` of ``case``."""
    from benchmarks.classification_bayes_speed import data, reference
    from benchmarks.heldout_families import SPLIT, binary_data

    if "/" not in case:
        X, y, Xt = data(case, 100)
        return X, y, Xt, reference(case, 100), ("tuning" if case in ("pima", "ripley") else "heldout")
    fam, n = case.split("/")
    fam, _, cols = fam.partition(":")                 # clf8:c keeps clf8's first c inputs (D = c + 1)
    Xtr, ytr, Xte, _ = binary_data(fam, int(n), 1)
    if cols:
        Xtr, Xte = Xtr[:, :int(cols)], Xte[:, :int(cols)]
    f64 = torch.float64
    half = "tuning" if fam in SPLIT["tuning"] else "heldout"
    return (torch.as_tensor(Xtr, dtype=f64), torch.as_tensor(ytr, dtype=f64), torch.as_tensor(Xte, dtype=f64),
            None, half)


def fitter(setting: str, seed: int) -> FullyBayesianCVI:
    if setting == "default":
        return FullyBayesianCVI(seed=seed)
    if setting.startswith("lib"):
        return FullyBayesianCVI(seed=seed)
    if setting == "sk":
        return FullyBayesianCVI(seed=seed, importance=False)
    if setting == "psis_ref":
        return PSISFit(1024, 1024, seed=seed + 100)
    if setting.startswith("psis"):
        M, _, inflate = (setting.partition("=")[2] or "64").partition(",")
        return PSISFit(int(M), int(M), float(inflate or 1.0), seed=seed)
    raise ValueError(setting)


def study_case(case: str, settings: list[str], seeds: list[int], max_dim: int = importance.MAX_DIM
               ) -> list[dict[str, Any]]:
    import gpvi

    X, y, Xt, nuts, half = case_data(case)
    model = gpvi.GPClassification(X, y)
    rows = []
    for seed in seeds:
        for setting in settings:
            if setting == "psis_ref" and (nuts is not None or seed != seeds[0]):
                continue
            fb = fitter(setting, seed)
            load = os.getloadavg()[0]
            keep, keep_dim = importance.DRAWS, importance.MAX_DIM
            if setting.startswith("lib="):
                importance.DRAWS = tuple(int(v) for v in setting[4:].split(","))
            if setting.startswith("lib"):
                importance.MAX_DIM = max_dim
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    t0 = time.perf_counter()
                    post = fb.run(model)
                    wall = time.perf_counter() - t0
                    p = post.predict_proba(Xt)
            finally:
                importance.DRAWS, importance.MAX_DIM = keep, keep_dim
            if setting.startswith("lib") and post.info["importance"] is not None:
                rec = post.info["importance"]
                fb.record = {"khat": rec["khat"], "ess": rec["ess"], "khat1": rec["rounds"][0]["khat"],
                             "ess1": rec["rounds"][0]["ess"], "accepted": rec["accepted"],
                             "evaluations": rec["evaluations"]}
            c = post.info["ep_counters"]
            row = {"case": case, "half": half, "D": len(model.names), "seed": seed, "setting": setting,
                   "wall_s": wall, "q_time_s": post.info["q_time_s"], "load": load,
                   "evaluations": c["evaluations"], "sweeps": c["sweeps"], "mean": post.mean.tolist(),
                   "sd": post.std.tolist(), "p": p.tolist(), "psis": getattr(fb, "record", None)}
            rows.append(row)
            print(case, setting, seed, f"{wall:.2f}s q {row['q_time_s']:.2f}s", row["psis"] and
                  {k: round(v, 3) if isinstance(v, float) else v for k, v in row["psis"].items()}, flush=True)
    ref = ({"mean": nuts["mean"], "sd": nuts["std"], "p": nuts["prob"], "name": "NUTS"} if nuts is not None else
           next(({**r, "name": "psis_ref"} for r in rows if r["setting"] == "psis_ref"), None))
    for r in rows:
        if ref is None:
            continue
        rm, rs = np.asarray(ref["mean"]), np.asarray(ref["sd"])
        r["ref"] = ref["name"]
        r["mean_err"] = float(np.abs((np.asarray(r["mean"]) - rm) / rs).max())
        r["logsd_err"] = float(np.abs(np.log(np.asarray(r["sd"]) / rs)).max())
        r["p_err"] = float(np.abs(np.asarray(r["p"]) - np.asarray(ref["p"])).mean())
    return rows


def report(rows: list[dict[str, Any]], cmd: str) -> str:
    lines = [header(f"The fully Bayesian classifier's q by two-round PSIS from the Laplace start ({cmd})"),
             "Protocol in the docstring of `benchmarks/studies/bayes_psis.py` (one thread). Errors against the "
             "reference named (NUTS over theta and latents, or 2,048 draws of the prototype: EP's posterior moments).",
             "", "| case | half | D | seed | setting | wall s [load] | q stage s | EP evaluations (sweeps) | "
             "k-hat (round 1) "
             "| ESS (round 1) | ref | mean error (ref sd) | log sd error | mean abs p diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ps = r["psis"] or {}
        k = f"{ps['khat']:.2f} ({ps['khat1']:.2f})" if ps else "-"
        if ps and "accepted" in ps:
            k += (" accepted" if ps["accepted"] else f" rejected after {ps['evaluations']}")
        e = f"{ps['ess']:.0f} ({ps['ess1']:.0f})" if ps else "-"
        err = (f"{r['ref']} | {r['mean_err']:.3f} | {r['logsd_err']:.3f} | {r['p_err']:.4f}" if "ref" in r
               else "- | - | - | -")
        lines.append(f"| {r['case']} | {r['half']} | {r['D']} | {r['seed']} | {r['setting']} | {r['wall_s']:.2f} "
                     f"[{r['load']:.1f}] | {r['q_time_s']:.2f} | {r['evaluations']} ({r['sweeps']}) | {k} | {e} | "
                     f"{err} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=["ripley", "pima", "xor/100", "spirals/100", "clf8/100"])
    p.add_argument("--settings", nargs="+", default=["psis_ref", "default", "psis"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--label", default="h59g")
    p.add_argument("--max-dim", type=int, default=importance.MAX_DIM,
                   help="importance.MAX_DIM for the lib settings (the D up to which the library tries the step)")
    a = p.parse_args()
    torch.set_num_threads(1)
    importlib.import_module("arviz")   # before the first fit: its import is not the method's cost
    rows: list[dict[str, Any]] = []
    cmd = "--cases " + " ".join(a.cases) + " --settings " + " ".join(a.settings)
    for case in a.cases:
        rows += study_case(case, a.settings, a.seeds, a.max_dim)
        write(f"bayes_psis_{a.label}", report(rows, cmd),
              {"args": vars(a), "rows": [{k: v for k, v in r.items() if k != "p"} for r in rows]})
    print(report(rows, cmd))


if __name__ == "__main__":
    main()
