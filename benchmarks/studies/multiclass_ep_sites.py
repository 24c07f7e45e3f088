"""Multi-class EP evidence: full K x K sites against class-factorised sites (issue 41, item 3: why full sites).

EP for the softmax with sites factorised over the classes (:math:`\\tilde t_n(\\mathbf f_n) = \\prod_k
\\exp(\\tilde\\nu_{nk}f_{nk} - \\tfrac12\\tilde\\tau_{nk}f_{nk}^2)`) makes the approximate posterior K independent GPs,
:math:`O(KN^3)` per sweep instead of full sites' :math:`O((NK)^3)`: each class is binary EP's algebra with its own
sites, the cavities are diagonal, and a site update matches the per-class means and variances of the tilted
distribution. Its evidence is binary EP's Gaussian terms summed over the classes plus :math:`\\sum_n\\log\\hat Z_n`
(R&W eq. 3.65 per class). Tilted moments here by the shifted quasi-Monte Carlo rule of
:mod:`gpvi.numerics.ep_multiclass` restricted to a diagonal cavity. This file holds that reference implementation
(it is not part of gpvi: it was measured and not adopted).

Compared at the NUTS posterior mean of iris and wine (``results/multiclass_bayes_<set>.json``) with the log signal
variance moved over NUTS mean + {-2, -1, 0, 1, 2} NUTS sd: :math:`\\log Z_{EP}` with full sites
(:func:`gpvi.numerics.ep_multiclass.multiclass_ep`, which tracks NUTS: q(theta) on it within 0.18 / 0.14 NUTS sd),
with factorised sites, and the profiled CVI bound; sweeps and wall per evaluation (cold start from zero sites), and
where on the grid each curve plus the log prior peaks.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.multiclass_ep_sites``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import warnings
from typing import Any

import torch

from benchmarks.studies._common import RESULTS, header, write
from benchmarks.multiclass import load
from gpvi.inference.cvi.bound import CVIBoundTarget
from gpvi.models.multiclass import GPMulticlass
from gpvi.numerics.anderson import Anderson
from gpvi.numerics.ep import _marginals
from gpvi.numerics.ep_multiclass import multiclass_ep
from gpvi.numerics.softmax_rules import fixed_draws


def _points(num_draws: int, num_classes: int, like: torch.Tensor) -> torch.Tensor:
    """``(2 S, K)`` antithetic Sobol' normal points, each column scaled to unit mean square (module docstring)."""
    half = fixed_draws(num_draws // 2, num_classes, like)
    pts = torch.cat([half, -half], 0)
    return pts / pts.square().mean(0).sqrt()


def _softmax_tilted(y: torch.Tensor, mc: torch.Tensor, vc: torch.Tensor, num_draws: int,
                    centre: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    eps = _points(num_draws, mc.shape[1], mc)                               # (S, K)
    sd = vc.sqrt()
    shift = torch.zeros_like(mc) if centre is None else centre - mc         # proposal N(mc + shift, vc)
    dev = sd.unsqueeze(1) * eps + shift.unsqueeze(1)                        # (N, S, K): f - mc
    f = dev + mc.unsqueeze(1)
    lp = torch.log_softmax(f, -1).gather(-1, y.view(-1, 1, 1).expand(-1, f.shape[1], 1)).squeeze(-1)
    # importance weight N(f; mc, vc) / N(f; mc + shift, vc) = exp(-(eps . shift / sd) - |shift / sd|^2 / 2)
    a = shift / sd
    lp = lp - (eps.unsqueeze(0) * a.unsqueeze(1)).sum(-1) - 0.5 * a.square().sum(-1, keepdim=True)
    log_z = torch.logsumexp(lp, -1) - math.log(f.shape[1])
    om = torch.softmax(lp, -1).unsqueeze(-1)                                # tilted weights (N, S, 1)
    d1 = (om * dev).sum(1)                                                  # tilted mean - cavity mean
    var = (om * (dev - d1.unsqueeze(1)).square()).sum(1)
    return log_z, mc + d1, var



def _evidence(K: torch.Tensor, y: torch.Tensor, tau: torch.Tensor, nu: torch.Tensor, tilted
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:math:`\\log Z_{EP}`, its gradient in K, posterior means and variances (N, K) at the sites (module docstring);
    raises ``LinAlgError`` when a factorisation fails."""
    C, N = tau.shape
    LB, sW, mean, var, ok = _marginals(K.expand(C, N, N), tau, nu)
    if not bool(ok.all()):
        raise torch.linalg.LinAlgError("factorised EP: B not positive definite")
    tc = (1.0 / var - tau).clamp_min(torch.finfo(K.dtype).tiny)
    mc = (mean / var - nu) / tc
    lz_hat, _, _ = tilted(y, mc.T, (1.0 / tc).T, mean.T)
    log_z = (lz_hat.sum() - torch.log(LB.diagonal(dim1=-2, dim2=-1)).sum() + 0.5 * (nu * mean).sum()
             + 0.5 * torch.log1p(tau / tc).sum()
             + ((mc * mc * tau * tc - 2.0 * mc * nu * tc - nu * nu) / (2.0 * (tau + tc))).sum())
    b = nu - tau * mean
    R = sW.unsqueeze(-1) * torch.cholesky_inverse(LB) * sW.unsqueeze(-2)
    grad_k = 0.5 * (b.mT @ b - R.sum(0))
    return log_z, grad_k, mean.T, var.T



def factorised_ep(K: torch.Tensor, y: torch.Tensor, num_classes: int, *, num_draws: int = 2048,
                  damping: float = 0.5, anderson: int = 5, tol: float = 1e-8, max_sweeps: int = 200
                  ) -> dict[str, Any]:
    """Class-factorised EP (module docstring) on one kernel matrix: ``log_z``, ``sweeps``, ``converged``, ``ok``."""
    N, C = K.shape[0], num_classes
    y = y.long()

    def tilted(yy, mc, vc, centre):
        return _softmax_tilted(yy, mc, vc, num_draws, centre)

    zeros = torch.zeros(C, N, dtype=K.dtype, device=K.device)
    tau, nu = zeros.clone(), zeros.clone()
    memory = anderson
    acc = Anderson(memory) if memory > 0 else None
    plain: tuple[torch.Tensor, torch.Tensor] | None = None      # the damped step G(x_k) when x_{k+1} was extrapolated
    sweeps, converged, restarts = 0, False, 0
    Kc = K.expand(C, N, N)
    try:
        with torch.no_grad():
            for sweeps in range(1, max_sweeps + 1):
                _, _, mean, var, ok = _marginals(Kc, tau, nu)
                tc = 1.0 / var - tau
                if not bool(ok.all()) or not bool((tc > 0).all()):
                    if plain is None:
                        raise torch.linalg.LinAlgError("factorised EP: a cavity is not proper")
                    (tau, nu), plain = plain, None
                    restarts += 1
                    if acc is not None:
                        acc = None if restarts >= 3 else acc
                        if acc is not None:
                            acc.clear()
                    continue
                mc = (mean / var - nu) / tc
                _, mh, vh = tilted(y, mc.T, (1.0 / tc).T, mean.T)
                t_new = (1.0 / vh.T - tc).clamp_min(0.0)
                n_new = mh.T / vh.T - tc * mc
                if not (bool(torch.isfinite(t_new).all()) and bool(torch.isfinite(n_new).all())):
                    raise torch.linalg.LinAlgError("factorised EP: non-finite site update")
                change = max(float(((t_new - tau).abs() / (1.0 + tau)).max()),
                             float(((n_new - nu).abs() / (1.0 + nu.abs())).max()))
                if change <= tol:
                    converged = True
                    break
                g_t = (1.0 - damping) * tau + damping * t_new
                g_n = (1.0 - damping) * nu + damping * n_new
                plain = None
                if acc is not None:
                    x = acc.step(torch.cat([tau.reshape(-1), nu.reshape(-1)]),
                                 torch.cat([g_t.reshape(-1), g_n.reshape(-1)]))
                    if bool(torch.isfinite(x).all()) and bool((x[:C * N] >= 0).all()):
                        tau, nu, plain = x[:C * N].view(C, N), x[C * N:].view(C, N), (g_t, g_n)
                        continue
                    acc.clear()
                tau, nu = g_t, g_n
            log_z, grad_k, mean, var = _evidence(K, y, tau, nu, tilted)
    except torch.linalg.LinAlgError:
        return {"log_z": -math.inf, "sweeps": sweeps, "converged": False, "ok": False}
    return {"log_z": float(log_z), "sweeps": sweeps, "converged": converged, "ok": bool(torch.isfinite(log_z))}


def run_set(name: str, offsets: list[float]) -> dict[str, Any]:
    Xtr, _, ytr, _, _ = load(name, 300)
    model = GPMulticlass(Xtr, ytr)
    ref = json.loads((RESULTS / f"multiclass_bayes_{name}.json").read_text())["data"]["results"][0]["nuts"]
    nm = torch.tensor(ref["mean"], dtype=torch.float64)
    ns = torch.tensor(ref["std"], dtype=torch.float64)
    bound = CVIBoundTarget(model)
    rows = []
    for off in offsets:
        th = nm.clone()
        th[-1] += off * ns[-1]
        K = bound._kernel(th.unsqueeze(0))[0].detach()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            full = multiclass_ep(K, model.y, model.num_classes)
            t1 = time.perf_counter()
            fact = factorised_ep(K, model.y, model.num_classes)
            t2 = time.perf_counter()
            cvi = float(bound.log_joint(th) - bound.log_prior(th))
        rows.append({"offset_sd": off, "log_signal_var": float(th[-1]), "log_prior": float(bound.log_prior(th)),
                     "full": float(full.log_z), "full_sweeps": full.sweeps, "full_s": t1 - t0,
                     "factorised": fact["log_z"], "factorised_sweeps": fact["sweeps"], "factorised_s": t2 - t1,
                     "cvi_bound": cvi})
        print(name, rows[-1], flush=True)
    peaks = {k: max(rows, key=lambda r: r[k] + r["log_prior"])["offset_sd"] for k in ("full", "factorised", "cvi_bound")}
    return {"set": name, "N": int(Xtr.shape[0]), "K": model.num_classes, "names": list(model.names),
            "nuts_mean": nm.tolist(), "nuts_std": ns.tolist(), "rows": rows, "peak_offset_sd": peaks}


def report(results: list[dict[str, Any]]) -> str:
    md = header("Multi-class EP evidence: full K x K sites vs class-factorised sites")
    md += ("\nProtocol in the docstring of `benchmarks/studies/multiclass_ep_sites.py`. Theta at the NUTS posterior mean, the "
           "log signal variance moved by the offsets (in NUTS sds); log Z in nats; sweeps and seconds per cold "
           "evaluation (EP from zero sites). Peak: the grid offset where the curve plus the log prior is largest.\n")
    for r in results:
        md += (f"\n## {r['set']} (N = {r['N']}, K = {r['K']}); peaks: full {r['peak_offset_sd']['full']:+g}, factorised "
               f"{r['peak_offset_sd']['factorised']:+g}, CVI bound {r['peak_offset_sd']['cvi_bound']:+g} NUTS sd\n\n"
               "| offset (NUTS sd) | log signal variance | full EP | factorised EP | factorised - full | CVI bound | "
               "sweeps full / factorised | s full / factorised |\n|---|---|---|---|---|---|---|---|\n")
        for x in r["rows"]:
            md += (f"| {x['offset_sd']:+g} | {x['log_signal_var']:.2f} | {x['full']:.3f} | {x['factorised']:.3f} | "
                   f"{x['factorised'] - x['full']:+.3f} | {x['cvi_bound']:.3f} | {x['full_sweeps']} / "
                   f"{x['factorised_sweeps']} | {x['full_s']:.2f} / {x['factorised_s']:.2f} |\n")
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="+", default=["iris", "wine"])
    ap.add_argument("--offsets", nargs="+", type=float, default=[-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0])
    ap.add_argument("--name", default="multiclass_ep_sites")
    args = ap.parse_args()
    results = []
    for name in args.sets:
        results.append(run_set(name, args.offsets))
        write(args.name, report(results), {"args": vars(args), "results": results})
    print(report(results))


if __name__ == "__main__":
    main()
