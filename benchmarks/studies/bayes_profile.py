"""Where the time of ``GPClassifier(hyperparameters="bayes")`` goes (issue 59, item 3), on the tuning half only.

One fit per case (``--cases``; default ``xor/100``, ``xor/400`` binary and ``mc_clf/100`` with 4 classes, all from
the tuning half of ``benchmarks/heldout_families.py``'s ``SPLIT``; the held-out families are never profiled here),
one thread, after one untimed warm-up fit (imports, first LAPACK calls). Per fit:

* the stage walls of its ``info`` (MAP-II, EP MAP, Laplace, q by Salimans-Knowles, predictive);
* load-independent counts: EP evaluations (rows) and sweeps, the engine's steps and draws per step, the final bound's
  draws, the predictive stage's CVI runs and their inner steps (the wrapped bound's counters after the fit);
* the factorisations EP did (rows passed to the binary ``_marginals`` or the multi-class ``_posterior``: one
  Cholesky of B each) and the tilted-moment calls, counted by wrapping those functions for the duration;
* cProfile's cumulative seconds in the functions that matter (EP's sweep parts, the bound estimate, the predictive
  CVI runs).

And, outside the fits: the errors of binary EP's tilted moments with 32-96 quadrature nodes
(:func:`quadrature_table`), and (:func:`linalg_table`) the two ways of getting the diagonal of :math:`B^{-1}` from a factor that
binary EP's sweep can take: :func:`gpvi.linalg.triangular_inverse` plus the column norms (SciPy's ``trtri``) against
:func:`torch.cholesky_inverse` (``potri``), best of 20 on a batch of 4 at N = 100, 200, 400.

Run it from a checkout (``PYTHONPATH`` decides which gpvi is profiled; ``--label`` names the report):
``OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python -m benchmarks.studies.bayes_profile --label after``.
Results: ``benchmarks/studies/results/bayes_profile_<label>.{md,json}``: ``before`` (a copy of the tree at a0ed48d,
with the working-tree changes other sessions had made by then, run from that copy) and ``after`` (add7924), one
after the other at load 2.0-2.9: walls are only indicative, the counts are the comparison.

``ep59`` (issue 59's second pass: binary EP's sweep trimmed, the evidence without its gradient for the bound estimate,
tilted moments on probabilities, EP started from the bank of earlier evaluations; before the multi-class bank and the
EP MAP tolerances), load 2.2: xor N = 100 / 400 2.7 -> 1.7 s / 16.9 -> 8.1 s, EP sweeps per evaluation 3.90 -> 2.66 /
3.46 -> 2.23, the bound estimate 3.45 -> 1.22 s at N = 400; mc_clf unchanged. ``ep59b`` (all of issue 59's second
pass: also the multi-class bank, the EP MAP tolerances, EP at 1e-2 for the bound estimate's values, the predictive's
CVI at 1e-6), load 2.2-2.3: xor N = 100 / 400 2.4 / 6.5 s (sweeps per evaluation 2.42 / 2.04), mc_clf 45.7 -> 34.8 s
(6.60 -> 5.50 sweeps per evaluation; EP MAP 2.95 -> 1.12 s, Laplace 3.50 -> 1.53 s, predictive 3.26 -> 1.53 s).
``h59c`` (issue 59's third pass: the site bank's quadratic, 48 tilted nodes, the binary predictive at 1e-4; also
xor N = 200 and the S&K step, the whole of binary EP, the bank's starts and the kernel in the cumulative table).
``h59e`` (after issue 59's fourth pass: EP at 3e-3 in the engine's evaluations, the final bound from the window's
draws), load 1.3-1.4, xor N = 100 / 400, spirals N = 200, clf8 N = 100 / 400 (D = 3 / 3 / 3 / 9 / 9): walls 1.1 /
4.5 / 2.3 / 3.5 / 19.8 s, MAP-II 0.07 / 0.18 / 0.20 / 0.20 / 0.50 s (2.5-9%), q 0.71 / 3.45 / 1.52 / 2.82 / 16.98 s
(65-86%), binary EP 0.45 / 2.73 / 1.08 / 1.81 / 14.57 s of it (its factorisations and marginals 0.15 / 1.87 / 0.55
/ 0.62 / 10.33 s), 1.5-1.7 sweeps per evaluation at D = 3 and 3.3 at D = 9; the predictive 0.24 / 0.61 / 0.43 /
0.31 / 1.50 s.

What they showed (before -> after): binary EP did 6.1 / 5.7 factorisations of B per evaluation (xor N = 100 /
400: one per sweep, 5.1 / 4.6 sweeps, plus one more at the final sites), SciPy's triangular inverse took twice
potri's time at N = 400, and the final bound estimate (100 draws) was a fifth of the evaluations; after the EP
changes and the 1e-3 tolerance, 3.9 / 3.5 sweeps and as many factorisations per evaluation. Multi-class (mc_clf,
K = 4, N = 100): 6.6 sweeps per evaluation, each 9-15 ms, of which the quasi-Monte Carlo tilted moments took two
thirds (its log1p alone 1 ms) and the posterior over a quarter; the EP MAP search and the predictive stage 4-8% each.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import time
import warnings
from typing import Any

import torch

from benchmarks.heldout_families import SPLIT, MULTICLASS_SPLIT, binary_data, multiclass_data
from benchmarks.studies._common import header, write

FUNCS = {"ep.py:_marginals": "EP binary: factor + marginals", "ep.py:_tilted": "EP binary: tilted moments",
         "ep_multiclass.py:_posterior": "EP multi-class: posterior", "ep_multiclass.py:_tilted_qmc":
         "EP multi-class: QMC tilted moments", "ep_multiclass.py:_psd_sqrt": "EP multi-class: block roots (eigh)",
         "estimates.py:estimate_bound": "S&K: final bound estimate", "bound.py:latent_posterior":
         "predictive: CVI runs", "lbfgs.py:lbfgs_maximise": "L-BFGS (MAP-II inner, EP MAP)",
         "salimans_knowles/engine.py:step": "S&K steps (all)", "ep.py:expectation_propagation": "EP binary (all)",
         "ep_starts.py:starts": "EP starts from the bank", "scaled_rbf.py:forward": "kernel forward",
         "scaled_rbf.py:backward": "kernel backward"}


@contextlib.contextmanager
def counting() -> Any:
    """Count the rows EP factorised and the tilted-moment calls, by wrapping the module functions."""
    import gpvi.numerics.ep as ep
    import gpvi.numerics.ep_multiclass as em

    c = {"binary_factorisations": 0, "binary_tilted_calls": 0, "multiclass_factorisations": 0,
         "multiclass_tilted_calls": 0}
    orig = (ep._marginals, ep._tilted, em._posterior, em._tilted_qmc)

    def marg(K: torch.Tensor, *a: Any, **k: Any) -> Any:
        c["binary_factorisations"] += K.shape[0] if K.dim() == 3 else 1
        return orig[0](K, *a, **k)

    def tilt(*a: Any, **k: Any) -> Any:
        c["binary_tilted_calls"] += 1
        return orig[1](*a, **k)

    def post(*a: Any, **k: Any) -> Any:
        c["multiclass_factorisations"] += 1
        return orig[2](*a, **k)

    def qmc(*a: Any, **k: Any) -> Any:
        c["multiclass_tilted_calls"] += 1
        return orig[3](*a, **k)

    ep._marginals, ep._tilted, em._posterior, em._tilted_qmc = marg, tilt, post, qmc
    try:
        yield c
    finally:
        ep._marginals, ep._tilted, em._posterior, em._tilted_qmc = orig


def profile_case(case: str) -> dict[str, Any]:
    from gpvi import GPClassifier

    fam, n = case.split("/")
    k = 2 if fam in SPLIT["tuning"] else 4
    if fam not in SPLIT["tuning"] + MULTICLASS_SPLIT["tuning"]:
        raise SystemExit(f"{fam} is not in the tuning half: this study profiles tuning families only")
    Xtr, ytr, _, _ = binary_data(fam, int(n), 1) if k == 2 else multiclass_data(fam, int(n), k, 0)
    load = os.getloadavg()[0]
    pr = cProfile.Profile()
    with warnings.catch_warnings(), counting() as c:
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        pr.enable()
        clf = GPClassifier(random_state=0, hyperparameters="bayes").fit(Xtr, ytr)
        pr.disable()
        wall = time.perf_counter() - t0
    post = clf.posterior_
    info = post.info
    bound = getattr(post.target, "bound", post.target)
    stats = pstats.Stats(pr)
    cum = {}
    for (path, _, name), (_, ncalls, _, ct, _) in stats.stats.items():
        key = f"{os.path.basename(path)}:{name}"
        long_key = f"{os.path.basename(os.path.dirname(path))}/{key}"
        key = long_key if long_key in FUNCS else key
        if key in FUNCS:
            cum[key] = {"calls": ncalls, "cum_s": round(ct, 3)}
    eng = clf.posterior_.q.info
    ep = info.get("ep_counters", {}) or {}
    return {"case": case, "K": k, "N": int(n), "D": len(post.names), "wall_s": round(wall, 3),
            "load": round(load, 2), "stages": {s: round(float(info[s]), 3) for s in
                                                ("map_time_s", "ep_map_time_s", "laplace_time_s", "q_time_s",
                                                 "predictive_time_s") if s in info},
            "ep_evaluations": ep.get("evaluations"), "ep_sweeps": ep.get("sweeps"),
            "q_steps": info.get("q_steps"), "draws_per_step": (eng.settings or {}).get("num_draws"),
            "bound_draws": (eng.settings or {}).get("num_elbo_draws"),
            "predictive_runs": int(info.get("num_draws", 0)), "bound_counters_after": {
                k2: bound.counters.get(k2) for k2 in ("evaluations", "inner_steps")},
            "counts": dict(c), "profile": cum, "theta_mean": post.mean.tolist(), "theta_sd": post.std.tolist()}


def linalg_table() -> list[dict[str, Any]]:
    """Best-of-20 milliseconds, batch of 4 SPD matrices: Cholesky, trtri + column norms, cholesky_inverse."""
    from gpvi.linalg import cholesky_plain, sum_of_squares, triangular_inverse

    out = []
    g = torch.Generator().manual_seed(0)
    for n in (100, 200, 400):
        A = torch.randn(4, n, n, generator=g, dtype=torch.float64)
        B = A @ A.mT / n + torch.eye(n, dtype=torch.float64)
        L = cholesky_plain(B)[0]

        def best(f: Any) -> float:
            f()
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                f()
                times.append(time.perf_counter() - t0)
            return round(1e3 * min(times), 3)

        out.append({"N": n, "cholesky_ms": best(lambda: cholesky_plain(B)),
                    "trtri_norms_ms": best(lambda: sum_of_squares(triangular_inverse(L), -2)),
                    "cholesky_inverse_ms": best(lambda: torch.cholesky_inverse(L).diagonal(dim1=-2, dim2=-1).clone()),
                    "load": round(os.getloadavg()[0], 2)})
    return out


def quadrature_table() -> list[dict[str, Any]]:
    """Binary EP's tilted moments by the asinh-mapped Gauss-Legendre rule with 32-96 nodes against 1,000 nodes, on
    5,820 cavities (means -12..12, variances 1e-3..1e3), logit and probit: the largest error of log Z_hat, of the
    mean (in tilted sds) and the relative error of the variance."""
    from gpvi.models.likelihoods import BernoulliLogit, BernoulliProbit
    from gpvi.numerics.ep import _tilted
    from gpvi.numerics.quadrature import Quadrature

    m = torch.linspace(-12, 12, 97, dtype=torch.float64).repeat_interleave(60)
    v = torch.logspace(-3, 3, 60, dtype=torch.float64).repeat(97)
    y = (torch.arange(m.numel()) % 2).double()
    out = []
    for lik in (BernoulliLogit(), BernoulliProbit()):
        ref = _tilted(lik, y, m, v, Quadrature(1000))
        for n in (32, 48, 64, 96):
            z, mu, var = _tilted(lik, y, m, v, Quadrature(n))
            out.append({"likelihood": type(lik).__name__, "points": n,
                        "log_z": float((z - ref[0]).abs().max()),
                        "mean_sd": float(((mu - ref[1]).abs() / ref[2].sqrt()).max()),
                        "var_rel": float(((var - ref[2]).abs() / ref[2]).max())})
    return out


def report(rows: list[dict[str, Any]], label: str, lin: list[dict[str, Any]] | None = None,
           quad: list[dict[str, Any]] | None = None) -> str:
    lines = [header(f"Where the fully Bayesian classifier's time goes ({label})"), "",
             "Protocol in the docstring of `benchmarks/studies/bayes_profile.py` (tuning families only, one fit "
             "each, one thread). Stages in s; counts are load-independent.", "",
             "| case | K | D | wall s [load] | MAP-II / EP MAP / Laplace / q / predictive (s) | EP evaluations | "
             "sweeps (per evaluation) | factorisations (per evaluation) | tilted calls | engine steps x draws + "
             "bound draws | predictive CVI runs |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        st = " / ".join(f"{r['stages'].get(s, float('nan')):.2f}" for s in
                        ("map_time_s", "ep_map_time_s", "laplace_time_s", "q_time_s", "predictive_time_s"))
        c = r["counts"]
        fac = c["binary_factorisations"] if r["K"] == 2 else c["multiclass_factorisations"]
        til = c["binary_tilted_calls"] if r["K"] == 2 else c["multiclass_tilted_calls"]
        ev, sw = r["ep_evaluations"] or 0, r["ep_sweeps"] or 0
        lines.append(f"| {r['case']} | {r['K']} | {r['D']} | {r['wall_s']:.1f} [{r['load']:.1f}] | {st} | {ev} | "
                     f"{sw} ({sw / max(ev, 1):.2f}) | {fac} ({fac / max(ev, 1):.2f}) | {til} | "
                     f"{r['q_steps']} x {r['draws_per_step']} + {r['bound_draws']} | {r['predictive_runs']} |")
    lines += ["", "Cumulative seconds (cProfile; its overhead included) in the functions that matter:", "",
              "| case | " + " | ".join(FUNCS.values()) + " |", "|---|" + "---|" * len(FUNCS)]
    for r in rows:
        cells = [f"{r['profile'][f]['cum_s']:.2f} ({r['profile'][f]['calls']})" if f in r["profile"] else "-"
                 for f in FUNCS]
        lines.append(f"| {r['case']} | " + " | ".join(cells) + " |")
    if lin:
        lines += ["", "The diagonal of B^-1 from its factor, batch of 4 (best of 20, ms):", "",
                  "| N | Cholesky | trtri + column norms | cholesky_inverse | load |", "|---|---|---|---|---|"]
        lines += [f"| {r['N']} | {r['cholesky_ms']} | {r['trtri_norms_ms']} | {r['cholesky_inverse_ms']} | "
                  f"{r['load']} |" for r in lin]
    if quad:
        lines += ["", "Binary EP's tilted moments, asinh-mapped Gauss-Legendre with n nodes against 1,000 nodes (largest "
                  "errors over 5,820 cavities):", "", "| likelihood | nodes | log Z_hat | mean (tilted sds) | "
                  "variance (relative) |", "|---|---|---|---|---|"]
        lines += [f"| {r['likelihood']} | {r['points']} | {r['log_z']:.1e} | {r['mean_sd']:.1e} | {r['var_rel']:.1e} |"
                  for r in quad]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["xor/100", "xor/200", "xor/400", "mc_clf/100"])
    ap.add_argument("--label", default="after")
    a = ap.parse_args()
    torch.set_num_threads(1)
    with warnings.catch_warnings():                       # warm-up: imports and first LAPACK calls, untimed
        warnings.simplefilter("ignore")
        from gpvi import GPClassifier
        X, y, _, _ = binary_data("xor", 40, 0)
        GPClassifier(random_state=0, hyperparameters="bayes").fit(X, y)
    lin, quad = linalg_table(), quadrature_table()
    print(lin, quad, flush=True)
    rows: list[dict[str, Any]] = []
    for case in a.cases:
        rows.append(profile_case(case))
        print(rows[-1]["case"], rows[-1]["wall_s"], rows[-1]["stages"], rows[-1]["counts"], flush=True)
        write(f"bayes_profile_{a.label}", report(rows, a.label, lin, quad),
              {"rows": rows, "linalg": lin, "quadrature": quad})


if __name__ == "__main__":
    main()
