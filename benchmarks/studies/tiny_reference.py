"""An exact reference for ``benchmarks/small_data.py``'s 14-point model, and ``gpvi.infer``'s answers against it.

The small-data benchmark times ``gpvi.infer`` on its tiny model (14 points; log squared lengthscale, log signal and
log noise variance under half-normal priors on the sds; a fixed constant kernel) at seeds 0-2, but had no reference
to say whether an answer is right. With three parameters the posterior can be integrated on a grid: the log joint
(the benchmark's own NumPy formula, ``small_data.numpy_log_joint``, batched) at every point of a regular
90 x 90 x 220 grid over (-14, 8) x (-16, 7) x (-40, 4), normalised, its marginal means and sds. The grid's edges hold
under 1e-5 of the mass. Where the Cholesky factorisation fails (long lengthscales with almost no noise), the point is
computed again with a jitter of 1e-10 times the mean diagonal: the largest such log joint is reported against the mode,
to show those points carry no mass.

The posterior has a long tail towards zero noise (short lengthscales that interpolate the data): 0.9% of the mass
lies below a log noise variance of -6, far from the mode at about -2. For comparison, an adaptive random-walk Metropolis
(Haario et al. 2001 over 5,000 warm-up steps, then fixed; 8 dispersed chains x 60,000 steps, seeded) is also run: its diagnostics pass, but it
rarely enters that tail. Each ``infer`` row committed in ``benchmarks/results/small_data.json`` is compared with the
grid: the largest |mean difference| in reference sds and the sd ratios (the stress suite's tolerance: 0.2 sd and
0.8-1.25).

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.tiny_reference
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.small_data import numpy_log_joint, rwm_steps, rwm_warmup, tiny_model  # noqa: E402
from benchmarks.studies._common import RESULTS, header, write  # noqa: E402
from gpvi.inference.check import relative_mcse  # noqa: E402
from gpvi.posteriors.diagnostics import diagnostics  # noqa: E402

CHAINS, WARMUP, STEPS, SEED = 8, 5000, 60000, 123
GRID = ((-14.0, 8.0, 90), (-16.0, 7.0, 90), (-40.0, 4.0, 220))


def _log_joint_rows(T: np.ndarray, D2: np.ndarray, y: np.ndarray, jitter: float = 0.0) -> np.ndarray:
    """The tiny model's log joint at the rows of ``T`` (B, 3), as ``small_data.numpy_log_joint``; -inf where the
    Cholesky factorisation fails."""
    n = y.shape[0]
    e = np.exp(T)
    K = e[:, 1, None, None] * np.exp(-0.5 * D2[None] / e[:, 0, None, None]) + 1.0 + e[:, 2, None, None] * np.eye(n)
    if jitter:
        K = K + jitter * np.trace(K, axis1=1, axis2=2)[:, None, None] / n * np.eye(n)
    ok = np.ones(T.shape[0], dtype=bool)
    try:
        L = np.linalg.cholesky(K)
    except np.linalg.LinAlgError:
        L = np.zeros_like(K)
        for b in range(T.shape[0]):
            try:
                L[b] = np.linalg.cholesky(K[b])
            except np.linalg.LinAlgError:
                ok[b] = False
    out = np.full(T.shape[0], -np.inf)
    a = np.linalg.solve(L[ok], np.broadcast_to(y, (int(ok.sum()), n))[..., None])[..., 0]
    ll = (-0.5 * (a * a).sum(1) - np.log(np.diagonal(L[ok], axis1=1, axis2=2)).sum(1)
          - 0.5 * n * math.log(2 * math.pi))
    t, ee = T[ok], e[ok]
    out[ok] = ll + (-0.5 * ee[:, 0] / 25.0 - 0.5 * ee[:, 1] / 4.0 - 0.5 * ee[:, 2] + 0.5 * t.sum(1)
                    + 1.5 * math.log(2.0 / math.pi) - math.log(5.0) - math.log(2.0) - 3.0 * math.log(2.0))
    return out


def grid_reference() -> dict:
    model = tiny_model()
    X, y = model._Xc.numpy(), model.y.numpy()
    D2 = (X - X.T) ** 2
    f = numpy_log_joint(model, "tiny")
    th = model.initial_theta().numpy()
    t0 = time.perf_counter()
    g = [np.linspace(lo, hi, k) for lo, hi, k in GRID]
    A, B = np.meshgrid(g[1], g[2], indexing="ij")
    LJ = np.empty((len(g[0]), A.shape[0], A.shape[1]))
    failed_max, failed = -np.inf, 0
    for i, a in enumerate(g[0]):
        T = np.stack([np.full(A.size, a), A.ravel(), B.ravel()], 1)
        v = _log_joint_rows(T, D2, y)
        bad = ~np.isfinite(v)
        if bad.any():
            failed += int(bad.sum())
            failed_max = max(failed_max, float(_log_joint_rows(T[bad], D2, y, jitter=1e-10).max()))
        LJ[i] = v.reshape(A.shape)
    assert abs(float(_log_joint_rows(th[None], D2, y)[0]) - f(th)) < 1e-8 * abs(f(th))   # the benchmark's formula
    mode = float(LJ.max())
    P = np.exp(LJ - mode)
    P /= P.sum()
    mean, sd, edge = [], [], []
    for ax in range(3):
        marg = P.sum(axis=tuple(k for k in range(3) if k != ax))
        mu = float((marg * g[ax]).sum())
        mean.append(mu)
        sd.append(math.sqrt(float((marg * (g[ax] - mu) ** 2).sum())))
        edge.append(float(marg[:2].sum() + marg[-2:].sum()))
    return {"names": list(model.names), "mean": mean, "sd": sd, "edge_mass": edge, "mode": mode,
            "failed_points": failed, "points": int(LJ.size), "failed_max_minus_mode": failed_max - mode,
            "tail_mass_noise_below_-6": float(P.sum(axis=(0, 1))[g[2] < -6].sum()),
            "wall": time.perf_counter() - t0}


def rwm_reference() -> dict:
    model = tiny_model()
    f = numpy_log_joint(model, "tiny")
    th0 = model.initial_theta().numpy()
    D = th0.shape[0]
    rng = np.random.default_rng(SEED)
    t0 = time.perf_counter()
    chains = []
    for _ in range(CHAINS):
        x, lp, L = rwm_warmup(f, th0 + 0.5 * rng.standard_normal(D), rng, WARMUP)
        chains.append(rwm_steps(f, x, lp, L, rng, STEPS)[0])
    x = torch.as_tensor(np.array(chains))
    d = diagnostics(x)
    flat = x.reshape(-1, D)
    return {"names": list(model.names), "wall": time.perf_counter() - t0, "mean": flat.mean(0).tolist(),
            "sd": flat.std(0).tolist(), "ess_bulk": d["ess_bulk"].tolist(), "ess_tail": d["ess_tail"].tolist(),
            "r_hat": d["r_hat"].tolist(), "mcse_mean_sd": relative_mcse(d, flat.std(0))}


def _compare(r: dict, m: np.ndarray, s: np.ndarray) -> str:
    dm = float(np.max(np.abs(np.array(r["mean"]) - m) / s))
    return f"{dm:.3f} | " + ", ".join(f"{v:.2f}" for v in np.array(r["sd"]) / s)


def main() -> None:
    ref, rwm = grid_reference(), rwm_reference()
    rows = json.loads((RESULTS / "small_data.json").read_text())["data"].get("infer", [])
    m, s = np.array(ref["mean"]), np.array(ref["sd"])
    md = [header("The 14-point model of small_data.py: an exact grid reference and gpvi.infer's answers (issue 57)"),
          "", f"Grid: {' x '.join(str(k) for *_, k in GRID)} points over "
          f"{' x '.join(f'({lo:g}, {hi:g})' for lo, hi, _ in GRID)}, {ref['wall']:.0f} s; mass within two points of "
          f"an edge {max(ref['edge_mass']):.1e}; {ref['failed_points']:,} of {ref['points']:,} points fail the "
          f"Cholesky factorisation, and with jitter their largest log joint is {-ref['failed_max_minus_mode']:,.0f} "
          f"nats below the mode. Mass below a log noise variance of -6: {ref['tail_mass_noise_below_-6']:.4f}.", "",
          "| parameter | mean | sd | random-walk Metropolis mean | sd |", "|---|---|---|---|---|"]
    md += [f"| {n} | {a:.3f} | {b:.3f} | {c:.3f} | {d:.3f} |"
           for n, a, b, c, d in zip(ref["names"], m, s, rwm["mean"], rwm["sd"])]
    md += ["", f"Random-walk Metropolis: {CHAINS} dispersed chains x {STEPS:,} steps after {WARMUP:,} warm-up "
           f"(seed {SEED}), {rwm['wall']:.0f} s; min bulk / tail ESS {min(rwm['ess_bulk']):,.0f} / "
           f"{min(rwm['ess_tail']):,.0f}, max R-hat {max(rwm['r_hat']):.4f}, largest MCSE of a mean / of a sd "
           f"{rwm['mcse_mean_sd'][0]:.3f} / {rwm['mcse_mean_sd'][1]:.3f} sd. Against the grid: "
           f"max |Δmean| {_compare(rwm, m, s).replace(' | ', ' sd; sd ratios ')}.", "",
           "gpvi.infer's answers (rows of `benchmarks/results/small_data.json`) against the grid:", "",
           "| seed | answer | trusted | max abs(mean diff) (grid sd) | sd ratios |", "|---|---|---|---|---|"]
    for r in rows:
        if r["problem"] == "tiny":
            md.append(f"| {r['seed']} | {r['answer']} | {r['trusted']} | {_compare(r, m, s)} |")
    print(write("tiny_reference", "\n".join(md) + "\n", {"grid": ref, "rwm": rwm, "infer": rows}))


if __name__ == "__main__":
    main()
