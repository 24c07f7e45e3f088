"""Multi-class EP's posterior algebra in N(K - 1) dimensions instead of NK (issue 41: the wall at K = 10).

Every site of multi-class EP has zero precision along the common mode :math:`\\mathbf 1` (the softmax is flat there;
since 1.0's quasi-Monte Carlo rule in the differences this holds to rounding for K >= 4 too), so its root is
:math:`S_n = UR_nU^\\top` with :math:`U` an orthonormal basis of the complement, and the Cholesky factor, the
triangular solve and the marginal blocks of each sweep need only the :math:`N(K-1)` reduced coordinates
(``gpvi.numerics.ep_multiclass._posterior``). This times one posterior computation (the dense part of a sweep) with
the full :math:`NK` algebra (the code before, kept here) and the reduced one at EP's converged sites for each set's
stored q(theta) mean, medians of 5 in one process, and checks that the two agree (stacked mean and marginal blocks),
then times whole EP runs (tol 1e-3 from the prior's sites, as an engine evaluation starts cold) with the library's
code. ``--fit synth10b`` also runs that set's whole fully Bayesian fit (seed 0).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.ep_reduced iris synth4 synth6 synth10b --fit synth10b``;
writes ``results/ep_reduced.{md,json}``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from typing import Any

import torch

import gpvi.numerics.ep_multiclass as em
from benchmarks.studies._common import header, median_time, write
from benchmarks.studies.ep_map_tol import model_of
from benchmarks.studies.multiclass_ep_is import stored
from gpvi.inference.cvi.bayes import FullyBayesianCVI
from gpvi.inference.cvi.bound import CVIBoundTarget
from gpvi.linalg import cholesky_plain

REPEATS = 5


def posterior_full(K: torch.Tensor, pi: torch.Tensor, nu: torch.Tensor):
    """The NK algebra before 1.0 (B = I + S (I_K x K) S in all K values; the stacked mean and the marginal blocks)."""
    N, C, _ = pi.shape
    Sn = em._psd_sqrt(pi)[0]
    B = (torch.einsum("nkl,mlj->knjm", Sn, Sn) * K.view(1, N, 1, N)).reshape(C * N, C * N)
    B.diagonal().add_(1.0)
    LB, _ = cholesky_plain(B, raise_on_failure=True)
    SK = torch.einsum("nkj,nm->knjm", Sn, K).reshape(C * N, C * N)
    V = torch.linalg.solve_triangular(LB, SK, upper=False)
    mu = (K @ nu).T.reshape(-1) - V.mT @ (V @ nu.T.reshape(-1))
    V3 = V.view(C * N, C, N)
    Snn = torch.diag_embed(K.diagonal().unsqueeze(-1).expand(N, C)) - torch.einsum("rkn,rjn->nkj", V3, V3)
    return LB, mu, 0.5 * (Snn + Snn.mT)


def run_set(name: str) -> dict[str, Any]:
    model = model_of(name)
    bound = CVIBoundTarget(model)
    theta = torch.tensor(stored(name)["bayes_ep"]["mean"], dtype=torch.float64)
    K = bound._kernel(theta.unsqueeze(0))[0].detach()
    r = em.multiclass_ep(K, model.y, model.num_classes, tol=1e-8)
    LBf, muf, Sf = posterior_full(K, r.pi, r.nu)
    LBr, _, mur, Sr, _ = em._posterior(K, r.pi, r.nu)
    logdet_diff = float(torch.log(LBf.diagonal()).sum() - torch.log(LBr.diagonal()).sum())
    t_full = median_time(lambda: posterior_full(K, r.pi, r.nu), repeats=REPEATS, warmup=0)[0]
    t_red = median_time(lambda: em._posterior(K, r.pi, r.nu), repeats=REPEATS, warmup=0)[0]
    runs = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        e = em.multiclass_ep(K, model.y, model.num_classes, tol=1e-3)
        runs.append(((time.perf_counter() - t0), e.sweeps))
    out = {"set": name, "K": model.num_classes, "N": int(K.shape[0]), "posterior_full_s": t_full,
           "posterior_reduced_s": t_red, "mean_diff": float((muf - mur).abs().max()),
           "block_diff": float((Sf - Sr).abs().max()), "logdet_diff": logdet_diff,
           "ep_s": statistics.median(t for t, _ in runs), "ep_sweeps": runs[0][1]}
    print(out, flush=True)
    return out


def main(names: list[str], fit: list[str]) -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    out: dict[str, Any] = {"sets": [run_set(n) for n in names], "fits": []}
    for name in fit:
        t0 = time.perf_counter()
        fb = FullyBayesianCVI(seed=0, evidence="ep").run(model_of(name))
        c = fb.info["ep_counters"]
        out["fits"].append({"set": name, "wall_s": time.perf_counter() - t0, "q_time_s": fb.info["q_time_s"],
                            "ep_map_time_s": fb.info["ep_map_time_s"], "evaluations": c["evaluations"],
                            "sweeps_per_evaluation": c["sweeps"] / c["evaluations"], "mean": fb.mean.tolist(),
                            "std": fb.std.tolist(), "load_1min": os.getloadavg()[0]})
        print(out["fits"][-1], flush=True)
    md = [header("Multi-class EP: the posterior algebra in N(K - 1) dimensions (issue 41)"), "",
          __doc__.split("\n\n")[1].replace("\n", " "), "",
          "| set | K | N | posterior, full NK (s) | reduced N(K-1) (s) | ratio | largest difference: mean, blocks, "
          "log|B| | one EP run to 1e-3, cold (s) [sweeps] |", "|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['set']} | {r['K']} | {r['N']} | {r['posterior_full_s']:.4f} | {r['posterior_reduced_s']:.4f} | "
           f"{r['posterior_reduced_s'] / r['posterior_full_s']:.2f} | {r['mean_diff']:.1e}, {r['block_diff']:.1e}, "
           f"{abs(r['logdet_diff']):.1e} | {r['ep_s']:.3f} [{r['ep_sweeps']}] |" for r in out["sets"]]
    if out["fits"]:
        md += ["", "| set | whole fully Bayesian fit (s) [load] | EP MAP (s) | q (s) | EP evaluations | sweeps each |",
               "|---|---|---|---|---|---|"]
        md += [f"| {f['set']} | {f['wall_s']:.1f} [{f['load_1min']:.1f}] | {f['ep_map_time_s']:.1f} | "
               f"{f['q_time_s']:.1f} | {f['evaluations']} | {f['sweeps_per_evaluation']:.2f} |" for f in out["fits"]]
    write("ep_reduced", "\n".join(md) + "\n", out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sets", nargs="+")
    ap.add_argument("--fit", nargs="*", default=[])
    a = ap.parse_args()
    main(a.sets, a.fit)
