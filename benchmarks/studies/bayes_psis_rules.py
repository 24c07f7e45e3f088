r"""Which proposals make the fully Bayesian classifier's importance step accept more often without accepting worse
answers (issue 59, item 3), on the tuning half only.

:class:`gpvi.inference.cvi.importance.ImportanceGaussian` (the library's default: rounds ``[(64, 1)], [(64, 1)]``)
rejected 6 of 15 D = 3 tuning fits (``bayes_psis_h59g_rounds.md``), and on the held-out moons at N = 100 and 200 the
rejection cost 13-36 % of the fit. Here each variant's rounds are lists of components ``(M, c)``: M draws of a
Student-t at the weighted mean so far with c times the Cholesky factor of the weighted covariance so far (round 1:
the Laplace start); every draw is weighted against the mixture of all components (the balance heuristic); after each
round from the second on, the check of the library (PSIS k-hat at most ``khat_threshold(n)``, ESS at least 50)
accepts the weighted moments. Variants (fixed before any run):

* ``A``: ``[(64, 1)], [(64, 1)]``, nu = 5 (the library's default);
* ``B``: ``[(64, 1)], [(48, 1), (16, 2)]``: a defensive wide component in round 2 (Hesterberg 1995);
* ``C``: ``[(64, 1)], [(128, 1)]``: more draws in round 2 (the threshold for 192 draws is 0.56);
* ``D``: ``[(48, 1), (16, 2)], [(48, 1), (16, 2)]``: the wide component in both rounds;
* ``E``: ``A`` with nu = 3.

Per case (``--cases``: ``ripley`` and tuning families ``fam/N`` as ``bayes_psis.py``) and seed: ``FullyBayesianCVI``
to its engine's start (MAP-II, EP MAP, Laplace), then every variant from that start on the same target (the site
bank emptied before each, as a fresh fit sees it), and, where no NUTS reference exists, the reference: 1,024 + 1,024
draws of variant A's form (EP's posterior moments; once per case, seed 100). Reported: accepted or not, k-hat, ESS,
EP evaluations, the error of the weighted moments against the reference (in reference sds), the variant's wall.

Run: ``OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python -m benchmarks.studies.bayes_psis_rules``. Results:
``benchmarks/studies/results/bayes_psis_rules_<label>.{md,json}``.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from typing import Any

import numpy as np
import torch

from benchmarks.studies._common import header, write
from benchmarks.studies.bayes_psis import case_data
from gpvi.inference.cvi.bayes import FullyBayesianCVI
from gpvi.inference.cvi.importance import MIN_ESS, t_draws, t_log_density
from gpvi.posteriors.weighted import WeightedPosterior, khat_threshold, pareto_smooth

VARIANTS = {
    "A": ([[(64, 1.0)], [(64, 1.0)]], 5.0),
    "B": ([[(64, 1.0)], [(48, 1.0), (16, 2.0)]], 5.0),
    "C": ([[(64, 1.0)], [(128, 1.0)]], 5.0),
    "D": ([[(48, 1.0), (16, 2.0)], [(48, 1.0), (16, 2.0)]], 5.0),
    "E": ([[(64, 1.0)], [(64, 1.0)]], 3.0),
    "ref": ([[(1024, 1.0)], [(1024, 1.0)]], 5.0),
}


def run_variant(target: Any, m0: torch.Tensor, L0: torch.Tensor, rounds: list[list[tuple[int, float]]], nu: float,
                seed: int) -> dict[str, Any]:
    """The rounds of ``rounds`` from ``(m0, L0)`` (module docstring): the accepted (or last) weighted moments."""
    comps: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    x = torch.empty(0, m0.shape[0], dtype=torch.float64)
    ll = torch.empty(0, dtype=torch.float64)
    m, C, k, ess, ok, n = m0, L0, math.inf, 0.0, True, 0
    base_m, base_C = m0, L0
    for r, spec in enumerate(rounds):
        if r > 0 and ok and k <= 0.7:              # else the previous round's centre and scale again
            base_m, base_C = m, C
        for j, (M, c) in enumerate(spec):
            xr = t_draws(base_m, c * base_C, M, nu, seed + 10 * r + j)
            with torch.no_grad():
                lr = torch.cat([target.log_joint_value(xr[i:i + 16]) for i in range(0, M, 16)])
            lr = torch.where(torch.isfinite(lr), lr, torch.full_like(lr, -math.inf))
            x, ll = torch.cat([x, xr]), torch.cat([ll, lr])
            comps.append((M, base_m, c * base_C))
        n = x.shape[0]
        log_g = torch.logsumexp(torch.stack([math.log(Mk / n) + t_log_density(x, mk, Ck, nu) for Mk, mk, Ck in comps]),
                                0)
        lw, k = pareto_smooth((ll - log_g).numpy())
        w = WeightedPosterior(x, torch.as_tensor(lw), [f"theta[{d}]" for d in range(x.shape[1])], khat=k)
        m, S, ess = w.mean, w.covariance, w.ess
        C, bad = torch.linalg.cholesky_ex(0.5 * (S + S.T))
        ok = int(bad) == 0
        if r >= 1 and ok and k <= khat_threshold(n) and ess >= MIN_ESS:
            return {"accepted": True, "khat": k, "ess": ess, "evaluations": n, "mean": m.tolist(),
                    "sd": S.diagonal().sqrt().tolist()}
    return {"accepted": False, "khat": k, "ess": ess, "evaluations": n, "mean": m.tolist(),
            "sd": S.diagonal().sqrt().tolist()}


class _Stop(Exception):
    pass


class _Study(FullyBayesianCVI):
    def __init__(self, variants: list[str], **kw: Any) -> None:
        super().__init__(importance=False, **kw)
        self.variants, self.runs = variants, {}

    def _fit_q(self, engine: Any, target: Any, start: Any) -> Any:
        s = start(target)
        for v in self.variants:
            rounds, nu = VARIANTS[v]
            target.start_from_neighbours(self.ep_bank)
            t0 = time.perf_counter()
            out = run_variant(target, s.theta, s.scale_tril, rounds, nu, 100 if v == "ref" else self.seed)
            out["wall_s"] = time.perf_counter() - t0
            self.runs[v] = out
            print(v, self.seed, {k: (round(x, 3) if isinstance(x, float) else x) for k, x in out.items()
                                 if k not in ("mean", "sd")}, flush=True)
        raise _Stop


def study_case(case: str, variants: list[str], seeds: list[int]) -> list[dict[str, Any]]:
    import gpvi

    X, y, _, nuts, half = case_data(case)
    model = gpvi.GPClassification(X, y)
    ref = None if nuts is None else {"mean": nuts["mean"], "sd": nuts["std"], "name": "NUTS"}
    rows = []
    for seed in seeds:
        want = variants + (["ref"] if ref is None else [])
        st = _Study(want, seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                st.run(model)
            except _Stop:
                pass
        if ref is None:
            ref = {**st.runs["ref"], "name": "2,048 draws"}
        for v in variants:
            r = st.runs[v]
            rm, rs = np.asarray(ref["mean"]), np.asarray(ref["sd"])
            rows.append({"case": case, "half": half, "seed": seed, "variant": v, **r, "ref": ref["name"],
                         "mean_err": float(np.abs((np.asarray(r["mean"]) - rm) / rs).max()),
                         "logsd_err": float(np.abs(np.log(np.asarray(r["sd"]) / rs)).max())})
    return rows


def report(rows: list[dict[str, Any]], cmd: str) -> str:
    lines = [header(f"The importance step's proposals: acceptance and error ({cmd})"),
             "Protocol in the docstring of `benchmarks/studies/bayes_psis_rules.py` (tuning half, one thread).", "",
             "| variant | accepted | accepted: largest mean error (ref sd) | accepted: largest log sd error | "
             "mean EP evaluations |", "|---|---|---|---|---|"]
    for v in dict.fromkeys(r["variant"] for r in rows):
        rs = [r for r in rows if r["variant"] == v]
        acc = [r for r in rs if r["accepted"]]
        lines.append(f"| {v} | {len(acc)} / {len(rs)} | "
                     f"{max((r['mean_err'] for r in acc), default=float('nan')):.3f} | "
                     f"{max((r['logsd_err'] for r in acc), default=float('nan')):.3f} | "
                     f"{np.mean([r['evaluations'] for r in rs]):.0f} |")
    lines += ["", "| case | seed | variant | accepted | k-hat | ESS | EP evaluations | wall s | ref | mean error | "
              "log sd error |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['seed']} | {r['variant']} | {r['accepted']} | {r['khat']:.2f} | "
                     f"{r['ess']:.0f} | {r['evaluations']} | {r['wall_s']:.2f} | {r['ref']} | {r['mean_err']:.3f} | "
                     f"{r['logsd_err']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=["ripley", "xor/100", "checkerboard/200", "spirals/100",
                                                  "spirals/200", "xor/200"])
    p.add_argument("--variants", nargs="+", default=["A", "B", "C", "D", "E"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--label", default="h59g")
    a = p.parse_args()
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    cmd = "--cases " + " ".join(a.cases)
    for case in a.cases:
        rows += study_case(case, a.variants, a.seeds)
        write(f"bayes_psis_rules_{a.label}", report(rows, cmd), {"args": vars(a), "rows": rows})
    print(report(rows, cmd))


if __name__ == "__main__":
    main()
