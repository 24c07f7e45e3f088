"""Multi-class EP's quasi-Monte Carlo rule (K >= 4) in the K values or in the K - 1 differences (issue 41).

Until this change the tilted moments for K >= 4 were estimated in all K values of a point (``full`` below). The
softmax depends on them only through the K - 1 differences :math:`d_j = f_j - f_y`, so along the common mode the
tilted equals the cavity; in the K values the rule's estimate of the tilted covariance there is off by its Monte
Carlo error, and the new site precision :math:`\\hat C^{-1} - C_{-n}^{-1}` gets small negative eigenvalues that EP
clips to zero. A clipped site no longer matches moments, EP's energy is no longer stationary in the sites, and the
fixed-point gradient of :math:`\\log Z_{EP}` (which assumes stationarity) is wrong. The library's rule now draws
the points in the differences and lifts the moments exactly, as the nested quadrature does for K <= 3
(``differences``).

Part 1: at each set's stored q(theta) mean (the fit with the old rule), EP run to 1e-8 with each rule: the number of
clipped site eigenvalues, the fixed-point gradient against central differences of the same rule's
:math:`\\log Z_{EP}` (h = 1e-3), and the gradient with 32,768 points as the rule-free answer. Part 2: today's fully
Bayesian fit (seed 0, the library's rule) against the stored long NUTS reference and the stored fit with the old
rule. The fault was found on synth10b (its EP MAP search ended at a gradient of 0.49); nothing was chosen on any
set: the number of points (2,048) and every other setting are unchanged.

Part 3 (``--scrambles``): the rule's own error, over 6 other scrambles of its Sobol' points (seeds 100-105), of the
gradient at the stored q mean against the 32,768-point gradient (scramble 12345): largest error per scramble and the
mean error per parameter (a systematic part that more points shrink), for each rule at 2,048 points and for the
new rule at 4,096 and 8,192, with the median seconds per EP sweep.

Part 0 (``--sites``): each rule's tilted moments on 200 random sites against the nested quadrature (40^(K-1) nodes,
K = 3 and 4; diagonal cavities of variance 0.05..5, means of sd 2, labels uniform, seed 0), with the proposal centred
at the nested tilted mean (where EP's fixed point puts it): the largest errors of log Z_hat, of the tilted means (in
cavity sds) and of the tilted variances (relative), the largest and mean absolute error of the new site precision
:math:`\\hat C^{-1} - C_{-n}^{-1}`, and the sites whose update has an eigenvalue below -1e-10 (clipped).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.multiclass_ep_rule synth4 synth10`` (writes
``results/multiclass_ep_rule_<first set>.{md,json}``) or ``... --scrambles synth4 synth10`` (writes
``results/multiclass_ep_rule_scrambles.{md,json}``) or ``... --sites`` (writes
``results/multiclass_ep_rule_sites.{md,json}``) or ``... --fits-only synth4`` (part 2 alone, with the library's
number of points, :data:`gpvi.numerics.ep_multiclass.NUM_DRAWS`; writes ``results/multiclass_ep_rule_fits_<first
set>.{md,json}``).
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from typing import Any

import numpy as np
import torch

import gpvi.numerics.ep_multiclass as em
from benchmarks.studies._common import header, write
from benchmarks.multiclass_bayes import synthetic
from benchmarks.studies.multiclass_ep_is import stored
from gpvi.inference.cvi.bayes import FullyBayesianCVI
from gpvi.inference.cvi.bound import CVIBoundTarget
from gpvi.linalg import cholesky_plain
from gpvi.models.multiclass import GPMulticlass

H = 1e-3
RULE_FREE = 32768


def tilted_full(y: torch.Tensor, mc: torch.Tensor, Cc: torch.Tensor, centre: torch.Tensor, num_draws: int):
    """The old rule: the shifted quasi-Monte Carlo points in all K values (proposal N(centre, Cc))."""
    N, C = mc.shape
    eps = em._qmc_points(num_draws, C, mc)
    S = eps.shape[0]
    Lc, _ = cholesky_plain(Cc, raise_on_failure=True)
    a = torch.linalg.solve_triangular(Lc, (centre - mc).unsqueeze(-1), upper=False).squeeze(-1)
    F = (Lc.reshape(N * C, C) @ eps.T).view(N, C, S).add_(centre.unsqueeze(-1))
    fy = F.gather(1, y.view(-1, 1, 1).expand(-1, 1, S)).squeeze(1)
    mx = F.amax(1)
    lp = fy - mx - torch.log(F.sub_(mx.unsqueeze(1)).exp_().sum(1))
    lp = lp - a @ eps.T - 0.5 * a.square().sum(-1, keepdim=True)
    top = lp.amax(-1, keepdim=True)
    om = torch.exp(lp - top)
    tot = om.sum(-1, keepdim=True)
    log_z = (top + torch.log(tot)).squeeze(-1) - math.log(S)
    om = om / tot
    e1 = om @ eps
    e2 = (om @ (eps.unsqueeze(-1) * eps.unsqueeze(-2)).reshape(S, C * C)).view(N, C, C)
    m_hat = centre + (Lc @ e1.unsqueeze(-1)).squeeze(-1)
    C_hat = Lc @ (e2 - e1.unsqueeze(-1) * e1.unsqueeze(-2)) @ Lc.mT
    return log_z, m_hat, 0.5 * (C_hat + C_hat.mT)


NEW = em._tilted_qmc
RULES = {"full": tilted_full, "differences": NEW}


def use(rule: str) -> None:
    em._tilted_qmc = RULES[rule]


def ep_at(model: Any, bound: Any, theta: torch.Tensor, num_draws: int = 2048) -> tuple[Any, torch.Tensor, Any]:
    tg = theta.clone().requires_grad_(True)
    K = bound._kernel(tg.unsqueeze(0))[0]
    r = em.multiclass_ep(K.detach(), model.y, model.num_classes, tol=1e-8, num_draws=num_draws, max_sweeps=500)
    (g,) = torch.autograd.grad(K, tg, grad_outputs=r.grad_k)
    return r, g, K.detach()


def gradient_check(model: Any, bound: Any, theta: torch.Tensor, rule: str) -> dict[str, Any]:
    use(rule)
    try:
        r, g, K = ep_at(model, bound, theta)
        st = em._sweep(K, model.y, r.pi, r.nu, 2048)
        P_hat = torch.cholesky_inverse(cholesky_plain(st.C_hat, raise_on_failure=True)[0])
        eig = torch.linalg.eigvalsh(P_hat - st.lam_c)
        fd = []
        for i in range(theta.numel()):
            e = torch.zeros_like(theta)
            e[i] = H
            fd.append((float(ep_at(model, bound, theta + e)[0].log_z) - float(ep_at(model, bound, theta - e)[0].log_z))
                      / (2 * H))
        ref = ep_at(model, bound, theta, RULE_FREE)[1]
    finally:
        use("differences")
    return {"log_z": float(r.log_z), "sweeps": r.sweeps, "converged": r.converged,
            "clipped": int((eig < -1e-10).sum()), "clipped_sum": float(eig.clamp_max(0.0).sum()), "grad": g.tolist(),
            "fd": fd, "grad_rule_free": ref.tolist(),
            "grad_vs_fd": float((g - torch.tensor(fd, dtype=g.dtype)).abs().max()),
            "grad_vs_rule_free": float((g - ref).abs().max()),
            "fd_vs_rule_free": float((torch.tensor(fd, dtype=g.dtype) - ref).abs().max())}


def run_set(name: str, fits_only: bool = False) -> dict[str, Any]:
    old = stored(name)
    Xtr, Xte, ytr, _, _ = synthetic(name)
    model = GPMulticlass(Xtr, ytr)
    bound = CVIBoundTarget(model)
    theta = torch.tensor(old["bayes_ep"]["mean"], dtype=torch.float64)
    out: dict[str, Any] = {"set": name, "K": model.num_classes, "names": list(model.names),
                           "num_draws": em.NUM_DRAWS, "check": {} if fits_only else
                           {rule: gradient_check(model, bound, theta, rule) for rule in RULES}}
    for rule, c in out["check"].items():
        print(name, rule, {k: v for k, v in c.items() if k in ("clipped", "grad_vs_fd", "grad_vs_rule_free")},
              flush=True)
    t0 = time.perf_counter()
    fb = FullyBayesianCVI(seed=0, evidence="ep").run(model)
    wall = time.perf_counter() - t0
    p = fb.predict_proba(torch.as_tensor(Xte, dtype=torch.float64)).numpy()
    nm, ns = np.asarray(old["nuts"]["mean"]), np.asarray(old["nuts"]["std"])
    mean, std = fb.mean.numpy(), fb.std.numpy()
    out["fit"] = {"wall_s": wall, "mean": mean.tolist(), "std": std.tolist(),
                  "theta_diff_sd": ((mean - nm) / ns).tolist(), "sd_ratio": (std / ns).tolist(),
                  "prob_mad_vs_nuts": float(np.abs(p - np.asarray(old["nuts"]["p_test"])).mean()),
                  "ep_map_time_s": fb.info.get("ep_map_time_s"), "q_time_s": fb.info.get("q_time_s"),
                  "ep_counters": fb.info.get("ep_counters"), "engine_retry": fb.info.get("engine_retry"),
                  "engine_fallback": fb.info.get("engine_fallback")}
    out["old"] = {"wall_s": old["bayes_ep"]["time_s"], "theta_diff_sd": old["bayes_ep"]["theta_diff_sd"],
                  "sd_ratio": (np.asarray(old["bayes_ep"]["std"]) / ns).tolist(),
                  "prob_mad_vs_nuts": old["bayes_ep"]["prob_mad_vs_nuts"], "nuts_wall_s": old["nuts"]["time_s"]}
    print(name, "fit", round(wall, 1), [round(v, 2) for v in out["fit"]["theta_diff_sd"]],
          round(out["fit"]["prob_mad_vs_nuts"], 4), flush=True)
    return out


def report(out: list[dict[str, Any]]) -> str:
    md = [header("Multi-class EP at K >= 4: the quasi-Monte Carlo rule in the differences (issue 41)"), "",
          __doc__.split("\n\n")[1].replace("\n", " "), "", __doc__.split("\n\n")[2].replace("\n", " "), "",
          "## 1. The fixed-point gradient of log Z_EP at the stored q mean", "",
          f"Largest absolute error over the log-hyperparameters; rule-free: the same rule with {RULE_FREE:,} points.",
          "", "| set | K | rule | clipped site eigenvalues (sum) | sweeps | gradient vs central differences | "
          "gradient vs rule-free | central differences vs rule-free |", "|---|---|---|---|---|---|---|---|"]
    for o in out:
        for rule, c in o["check"].items():
            md.append(f"| {o['set']} | {o['K']} | {rule} | {c['clipped']} ({c['clipped_sum']:.1e}) | {c['sweeps']} | "
                      f"{c['grad_vs_fd']:.3f} | {c['grad_vs_rule_free']:.3f} | {c['fd_vs_rule_free']:.3f} |")
    md += ["", "## 2. Fully Bayesian fit (seed 0) against the stored long NUTS reference", "",
           "| set | rule | theta mean - NUTS mean (NUTS sd), per parameter | largest | q sd / NUTS sd | "
           "test p vs NUTS | wall (s) | NUTS wall (s) |", "|---|---|---|---|---|---|---|---|"]
    for o in out:
        for key, rule in (("old", "full (stored)"), ("fit", "differences")):
            f = o[key]
            d = f["theta_diff_sd"]
            if key == "fit":
                rule = f"differences, {o.get('num_draws', 2048):,} points"
            md.append(f"| {o['set']} | {rule} | {', '.join(f'{v:+.2f}' for v in d)} | {max(abs(v) for v in d):.2f} | "
                      f"{min(f['sd_ratio']):.2f}-{max(f['sd_ratio']):.2f} | {f['prob_mad_vs_nuts']:.4f} | "
                      f"{f['wall_s']:.0f} | {o['old']['nuts_wall_s']:.0f} |")
    md += ["", "Parameters in order: " + "; ".join(f"{o['set']}: {', '.join(o['names'])}" for o in out[:1]) + "."]
    return "\n".join(md) + "\n"


SCRAMBLES = range(100, 106)
SCRAMBLE_RULES = [("full", 2048), ("differences", 2048), ("differences", 4096), ("differences", 8192)]


def scrambled(seed: int):
    """``fixed_draws`` with another scramble of the same Sobol' sequence."""
    def draws(n: int, k: int, like: torch.Tensor) -> torch.Tensor:
        u = torch.quasirandom.SobolEngine(int(k), scramble=True, seed=seed).draw(n, dtype=torch.float64)
        tiny = torch.finfo(torch.float64).eps
        return torch.special.ndtri(u.clamp(tiny, 1.0 - tiny)).to(like)
    return draws


def scramble_set(name: str) -> dict[str, Any]:
    Xtr, _, ytr, _, _ = synthetic(name)
    model = GPMulticlass(Xtr, ytr)
    bound = CVIBoundTarget(model)
    theta = torch.tensor(stored(name)["bayes_ep"]["mean"], dtype=torch.float64)
    real = em.fixed_draws
    out: dict[str, Any] = {"set": name, "K": model.num_classes, "names": list(model.names), "rows": []}
    try:
        em.fixed_draws = scrambled(12345)
        ref = ep_at(model, bound, theta, RULE_FREE)[1]
        out["reference"] = ref.tolist()
        for rule, n in SCRAMBLE_RULES:
            use(rule)
            errs, per_sweep = [], []
            for seed in SCRAMBLES:
                em.fixed_draws = scrambled(seed)
                t0 = time.perf_counter()
                r, g, _ = ep_at(model, bound, theta, n)
                per_sweep.append((time.perf_counter() - t0) / max(r.sweeps, 1))
                errs.append((g - ref).tolist())
            e = np.asarray(errs)
            out["rows"].append({"rule": rule, "num_draws": n, "errors": errs,
                                "largest": np.abs(e).max(1).tolist(), "mean_error": e.mean(0).tolist(),
                                "s_per_sweep": float(np.median(per_sweep))})
            print(name, rule, n, np.abs(e).max(1).round(3), e.mean(0).round(3), flush=True)
    finally:
        em.fixed_draws = real
        use("differences")
    return out


def scramble_report(out: list[dict[str, Any]]) -> str:
    md = [header("Multi-class EP at K >= 4: the quasi-Monte Carlo rule's gradient error over scrambles (issue 41)"),
          "", __doc__.split("\n\n")[3].replace("\n", " "), "",
          "| set | rule | points | largest error per scramble | median | mean error per parameter | s / sweep |",
          "|---|---|---|---|---|---|---|"]
    for o in out:
        for r in o["rows"]:
            md.append(f"| {o['set']} | {r['rule']} | {r['num_draws']:,} | {', '.join(f'{v:.2f}' for v in r['largest'])} | "
                      f"{float(np.median(r['largest'])):.2f} | {', '.join(f'{v:+.3f}' for v in r['mean_error'])} | "
                      f"{r['s_per_sweep']:.3f} |")
    md += ["", "Parameters: " + "; ".join(f"{o['set']}: {', '.join(o['names'])}" for o in out) + "."]
    return "\n".join(md) + "\n"


def sites() -> None:
    from gpvi.numerics.softmax_rules import default_quadrature

    g = torch.Generator().manual_seed(0)
    out = []
    for K in (3, 4):
        N = 200
        y = torch.randint(0, K, (N,), generator=g)
        mc = 2.0 * torch.randn(N, K, generator=g, dtype=torch.float64)
        Cc = torch.diag_embed(0.05 + 4.95 * torch.rand(N, K, generator=g, dtype=torch.float64))
        lz0, m0, C0 = em._tilted(y, mc, Cc, default_quadrature(K))
        P0 = torch.linalg.inv(C0) - torch.linalg.inv(Cc)
        sd = Cc.diagonal(dim1=-2, dim2=-1).sqrt()
        for rule, fn in RULES.items():
            lz, m, C = fn(y, mc, Cc, m0, 2048)
            P = torch.linalg.inv(C) - torch.linalg.inv(Cc)
            dP = (P - P0).abs().amax((1, 2))
            var_err = (C.diagonal(dim1=-2, dim2=-1) / C0.diagonal(dim1=-2, dim2=-1) - 1).abs()
            out.append({"K": K, "rule": rule, "log_z": float((lz - lz0).abs().max()),
                        "mean_cavity_sd": float(((m - m0).abs() / sd).max()), "var_rel": float(var_err.max()),
                        "site_precision_max": float(dP.max()), "site_precision_mean": float(dP.mean()),
                        "site_precision_size_mean": float(P0.abs().amax((1, 2)).mean()),
                        "clipped_sites": int((torch.linalg.eigvalsh(0.5 * (P + P.mT)).amin(-1) < -1e-10).sum())})
            print(out[-1], flush=True)
    md = [header("Multi-class EP's quasi-Monte Carlo tilted moments on random sites, two rules (issue 41)"), "",
          __doc__.split("\n\n")[4].replace("\n", " "), "",
          "| K | rule | log Z_hat | means (cavity sd) | variances (relative) | site precision, largest | "
          "site precision, mean (typical size) | clipped sites |", "|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['K']} | {r['rule']} | {r['log_z']:.1e} | {r['mean_cavity_sd']:.1e} | {r['var_rel']:.1e} | "
           f"{r['site_precision_max']:.1e} | {r['site_precision_mean']:.1e} ({r['site_precision_size_mean']:.2f}) | "
           f"{r['clipped_sites']} of 200 |" for r in out]
    write("multiclass_ep_rule_sites", "\n".join(md) + "\n", out)


def main(names: list[str], scrambles: bool = False, fits_only: bool = False) -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    if scrambles:
        out = []
        for name in names:
            out.append(scramble_set(name))
            write("multiclass_ep_rule_scrambles", scramble_report(out), out)
        return
    out = []
    for name in names:
        out.append(run_set(name, fits_only))
        write(f"multiclass_ep_rule_{'fits_' if fits_only else ''}{names[0]}", report(out), out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sets", nargs="*")
    ap.add_argument("--sites", action="store_true", help="part 0 only: the rules on random sites")
    ap.add_argument("--scrambles", action="store_true", help="part 3 only: the rule's error over scrambles")
    ap.add_argument("--fits-only", action="store_true", help="part 2 only (writes multiclass_ep_rule_fits_<set>)")
    a = ap.parse_args()
    if a.sites:
        sites()
    else:
        main(a.sets, a.scrambles, a.fits_only)
