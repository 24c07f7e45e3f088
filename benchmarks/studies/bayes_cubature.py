"""q(theta) of the fully Bayesian classifier by a deterministic cubature fixed point instead of Salimans-Knowles'
stochastic regression (issue 59, item 3), on the tuning half only: the prototype this study ran, since in gpvi as the opt-in :class:`gpvi.inference.cvi.cubature.CubatureGaussian` (``FullyBayesianCVI(
cubature=True)``, the same algorithm), not the default: held to the long NUTS reference of the Ripley subsample it
moved q by 0.10-0.12 sd (``benchmarks/results/classification_bayes_speed_h59d_cubature.md``).

The Gaussian q = N(m, V) that maximises the bound satisfies E_q[g] = 0 and E_q[H] = -V^-1 (g, H: the gradient and
Hessian of the log joint). By Stein's lemma E_q[H] = E_q[g z^T] C^-1 for x = m + C z, so both conditions need only
gradients. The fixed point (:class:`Cubature`, now the library's iteration with at most 40 rather than 30 halvings
of r, and its check without the acceptance rule) takes these expectations with Stroud's degree-5 fully symmetric rule for
N(0, I_D) (2 D^2 + 1 points; D <= 4, positive weights) and iterates the damped natural-gradient step
P <- (1 - r) P + r P_new, m <- m + r P^-1 E[g] (r = 1, halved while P is not positive definite and, for later steps,
each time the mean's step reverses; at least 1/8) until the mean moves by less than 0.01 sd and every sd by less
than 1% (exact in one step for a Gaussian target). From the converged q, :meth:`Cubature.mc_check` runs the S&K
regression on 16 antithetic Sobol pairs of q (three scrambles): the mean shift and log-sd change it proposes.

Per case (a tuning family at N rows, the higher noise level, as ``bayes_steps.py``), from the same start and target as
the engine of ``GPClassifier(hyperparameters="bayes")``: the 800-step S&K reference, the default engine (seeds 0-2)
and the cubature fixed point, each as EP evaluations, engine wall and the error against the reference (largest mean
difference in reference sds, largest |log sd ratio|); ``--bound``: the bound of the reference's and the cubature's q
by 2,000 draws (which Gaussian is nearer the optimum).

Run: ``OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python -m benchmarks.studies.bayes_cubature --label h59d``. Results:
``benchmarks/studies/results/bayes_cubature_<label>.{md,json}``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
import warnings
from typing import Any

import torch

from benchmarks.heldout_families import SPLIT, binary_data
from benchmarks.studies._common import header, write
from benchmarks.studies.bayes_steps import REF_SEED, engine_of
from gpvi.inference.cvi.bayes import FullyBayesianCVI
from gpvi.inference.cvi.cubature import CubatureGaussian
from gpvi.inference.salimans_knowles import SKGaussian


class Cubature:
    """The damped cubature fixed point of the module docstring, without the library's acceptance rule: gpvi's
    :meth:`~gpvi.inference.cvi.cubature.CubatureGaussian.fixed_point` and its Monte Carlo check."""

    def __init__(self, max_iter: int = 30, tol: float = 0.01) -> None:
        self.max_iter, self.tol = max_iter, tol

    def fit(self, target: Any, m: torch.Tensor, C: torch.Tensor) -> dict[str, Any]:
        m, C, record, _ = CubatureGaussian(tol=self.tol, max_iter=self.max_iter).fixed_point(target, m, C)
        return {"m": m, "C": C, **record}

    @staticmethod
    def mc_check(target: Any, m: torch.Tensor, C: torch.Tensor, pairs: int = 16, seed: int = 0) -> tuple[float, float]:
        """``(mean shift in sds, largest |log sd change|)`` the S&K regression on ``pairs`` antithetic Sobol pairs
        of N(m, CC^T) proposes (the library's check)."""
        return CubatureGaussian(check_pairs=pairs, seed=seed).check(target, m, C)[:2]


class _Stop(Exception):
    pass


def errors(m: torch.Tensor, sd: torch.Tensor, ref: dict[str, Any]) -> tuple[float, float]:
    mr, sr = torch.tensor(ref["mean"]), torch.tensor(ref["sd"])
    return float(((m - mr).abs() / sr).max()), float((sd / sr).log().abs().max())


def study_case(case: str, bound: bool) -> dict[str, Any]:
    from gpvi import GPClassifier
    import gpvi.sklearn as S

    out: dict[str, Any] = {"case": case}

    class Study(FullyBayesianCVI):
        def _fit_q(self, engine: Any, target: Any, start: Any) -> Any:
            st = start(target)
            m0 = st.theta.clone()
            C0 = st.scale_tril.clone() if st.scale_tril.dim() == 2 else torch.diag(st.scale_tril)

            def timed(fn: Any) -> tuple[Any, float, int, int]:
                target.start_from_neighbours(self.ep_bank)
                c0, t0 = dict(target.counters), time.perf_counter()
                res = fn()
                return (res, time.perf_counter() - t0, target.counters["evaluations"] - c0["evaluations"],
                        target.counters["sweeps"] - c0["sweeps"])

            q, wall, ev, sw = timed(lambda: engine_of("ref", engine, REF_SEED)[0].run(target, init=start))
            ref = {"mean": q.mean.tolist(), "sd": q.covariance.diagonal().sqrt().tolist(), "wall_s": wall,
                   "evaluations": ev}
            if bound:
                ref["bound"] = SKGaussian().estimate_bound(target, q.mean, q.scale_tril, num_draws=2000, seed=5)[:2]
            out["ref"], out["default"] = ref, []
            for seed in (0, 1, 2):
                q, wall, ev, sw = timed(lambda: engine_of("default", engine, seed)[0].run(target, init=start))
                err = errors(q.mean, q.covariance.diagonal().sqrt(), ref)
                out["default"].append({"seed": seed, "wall_s": wall, "evaluations": ev, "sweeps": sw,
                                       "mean_err": err[0], "logsd_err": err[1]})
            res, wall, ev, sw = timed(lambda: Cubature().fit(target, m0, C0))
            err = errors(res["m"], res["C"].square().sum(-1).sqrt(), ref)
            out["cubature"] = {"wall_s": wall, "evaluations": ev, "sweeps": sw, "iterations": res["iterations"],
                               "converged": res["converged"], "mean_err": err[0], "logsd_err": err[1],
                               "check": [Cubature.mc_check(target, res["m"], res["C"], seed=s) for s in (0, 1, 2)]
                               if res["converged"] else []}
            if bound:
                out["cubature"]["bound"] = SKGaussian().estimate_bound(target, res["m"], res["C"], num_draws=2000,
                                                                       seed=5)[:2]
            raise _Stop

    fam, n = case.split("/")
    Xtr, ytr, _, _ = binary_data(fam, int(n), 1)
    keep = S.FullyBayesianCVI
    S.FullyBayesianCVI = lambda **kw: Study()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            GPClassifier(random_state=0, hyperparameters="bayes").fit(Xtr, ytr)
    except _Stop:
        pass
    finally:
        S.FullyBayesianCVI = keep
    return out


def report(rows: list[dict[str, Any]], cmd: str) -> str:
    lines = [header(f"A cubature fixed point for q(theta), a prototype ({cmd})"),
             "Protocol in the docstring of `benchmarks/studies/bayes_cubature.py` (tuning families only, one thread). "
             "Errors against the 800-step S&K run from the same start: largest mean difference (reference sds) / "
             "largest |log sd ratio|; default: median wall and evaluations, errors as root mean square over seeds "
             "0-2 (largest). Check: the mean shift / log-sd change 16 antithetic Sobol pairs propose at the "
             "cubature q, three scrambles. Bound: 2,000 draws (se).", "",
             "| case | default: evaluations, wall s | default error | cubature: evaluations (iterations), wall s | "
             "cubature error | check | bound ref / cubature |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        d, c = r["default"], r["cubature"]
        rms = [math.sqrt(statistics.fmean(x[k] ** 2 for x in d)) for k in ("mean_err", "logsd_err")]
        mx = [max(x[k] for x in d) for k in ("mean_err", "logsd_err")]
        chk = ", ".join(f"{a:.3f} / {b:.3f}" for a, b in c["check"]) or "-"
        bnd = (f"{r['ref']['bound'][0]:.3f} ({r['ref']['bound'][1]:.3f}) / {c['bound'][0]:.3f} "
               f"({c['bound'][1]:.3f})" if "bound" in c else "-")
        lines.append(f"| {r['case']} | {statistics.median(x['evaluations'] for x in d):.0f}, "
                     f"{statistics.median(x['wall_s'] for x in d):.2f} | {rms[0]:.3f} ({mx[0]:.3f}) / {rms[1]:.3f} "
                     f"({mx[1]:.3f}) | {c['evaluations']} ({c['iterations']}{'' if c['converged'] else ', failed'})"
                     f", {c['wall_s']:.2f} | {c['mean_err']:.3f} / {c['logsd_err']:.3f} | {chk} | {bnd} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=["xor/100", "spirals/100", "spirals/200", "checkerboard/200",
                                                   "checkerboard/400"])
    p.add_argument("--bound", action="store_true")
    p.add_argument("--label", default="h59d")
    a = p.parse_args()
    for case in a.cases:
        if case.split("/")[0] not in SPLIT["tuning"]:
            raise SystemExit(f"{case}: only tuning families are studied here ({SPLIT['tuning']})")
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    for case in a.cases:
        rows.append(study_case(case, a.bound))
        print(rows[-1], flush=True)
        write(f"bayes_cubature_{a.label}", report(rows, " ".join(os.sys.argv[1:])), {"rows": rows})


if __name__ == "__main__":
    main()
