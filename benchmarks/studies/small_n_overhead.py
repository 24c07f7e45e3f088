"""What a NUTS step costs at small N, and how much of it a fused log joint could save (issue 39: the NUTS route's wall
on the stress suite's 20-60-row problems).

At N = 20-60 the exact log joint's algebra (an N x N kernel, its Cholesky, a solve and, for the gradient, the inverse)
takes microseconds; ``GPRegression.log_joint`` + autograd takes about 2 ms, in tensor-op dispatch, validation and
autograd bookkeeping, and Pyro's NUTS adds its own per-leapfrog-step work. This script measures, at N = 25-455 with
8 ARD inputs (the paper's kernel, default N(0, 10) prior), in one process, medians of 200 calls:

``model``   ``model.log_joint(theta[None])`` and ``torch.autograd.grad`` (what NUTS's potential calls);
``fused``   a prototype written here, not in gpvi: one autograd node whose forward computes the value and the
            closed-form gradient (Rasmussen & Williams 2006, eq. 5.9: dlogN/dK = (alpha alpha^T - K^-1)/2, chained
            through the kernel as ``gpvi.models.scaled_rbf`` does) and whose backward only scales it; checked
            against ``model`` to 1e-9 (relative);
``floor``   kernel + Cholesky + solve + ``cholesky_inverse`` with no autograd;
``nuts``    one NUTS chain (100 + 100, seed 0) on the model: wall per gradient evaluation (warm-up included), and
            that minus ``model``: Pyro's own work per leapfrog step.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.small_n_overhead
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gpvi  # noqa: E402
from benchmarks.studies._common import header, median_time, write  # noqa: E402

SIZES = (25, 50, 100, 200, 455)
D_IN = 8


class _FusedLogJoint(torch.autograd.Function):
    """Prototype: log N(y | 0, K + s2 I) + log N(theta | mu0, v I) for theta = (log l^2 (d), log sf2, log s2)."""

    @staticmethod
    def forward(ctx, theta, X, y, mu0, var):  # type: ignore[override]
        d = X.shape[1]
        inv_ls = torch.exp(-0.5 * theta[:d])
        Xs = X * inv_ls
        half_sq = -0.5 * (Xs * Xs).sum(-1)
        log_sf2, noise = theta[d], torch.exp(theta[d + 1])
        E = torch.addmm((half_sq + log_sf2).unsqueeze(-1) + half_sq, Xs, Xs.T)
        Kf = torch.minimum(E, log_sf2).exp_()
        K = Kf.clone()
        K.diagonal().add_(noise)
        L = torch.linalg.cholesky(K)
        alpha = torch.cholesky_solve(y.unsqueeze(-1), L).squeeze(-1)
        n = y.shape[0]
        val = (-0.5 * (y @ alpha) - torch.log(L.diagonal()).sum() - 0.5 * n * math.log(2 * math.pi)
               - 0.5 * ((theta - mu0) ** 2).sum() / var - 0.5 * theta.shape[0] * math.log(2 * math.pi * var))
        W = torch.cholesky_inverse(L).mul_(-0.5).addr_(alpha, alpha, alpha=0.5)     # dlogN/dK
        GK = W * Kf
        r = GK.sum(-1)
        grad = torch.empty_like(theta)
        grad[d] = r.sum()
        grad[d + 1] = noise * W.diagonal().sum()
        per_dim = r @ (X * X) - (X * (GK @ X)).sum(0)              # GK symmetric: (r + c) / 2 = r
        grad[:d] = torch.exp(-theta[:d]) * per_dim
        grad -= (theta - mu0) / var
        ctx.save_for_backward(grad)
        return val

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        (grad,) = ctx.saved_tensors
        return g * grad, None, None, None, None


def _median_ms(fn: Any, n: int = 200) -> float:
    return 1000 * median_time(fn, repeats=n, warmup=5)[0]


def measure(N: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(N)
    X = torch.randn(N, D_IN, generator=g, dtype=torch.float64)
    y = torch.sin(X[:, 0]) + 0.3 * X[:, 1] + 0.1 * torch.randn(N, generator=g, dtype=torch.float64)
    model = gpvi.GPRegression(X, y)
    D = len(model.names)
    th0 = model.initial_theta().detach() + 0.1 * torch.randn(D, generator=g, dtype=torch.float64)
    prior = model.prior.base_dist
    mu0, var = prior.loc.detach(), float(prior.scale[0]) ** 2
    Xc, yc = model._Xc, model._centred_y(th0)

    x = th0.clone().requires_grad_(True)

    def via_model() -> torch.Tensor:
        return torch.autograd.grad(model.log_joint(x.unsqueeze(0))[0], x)[0]

    def via_fused() -> torch.Tensor:
        return torch.autograd.grad(_FusedLogJoint.apply(x, Xc, yc, mu0, var), x)[0]

    def floor() -> None:
        inv_ls = torch.exp(-0.5 * th0[:D_IN])
        Xs = Xc * inv_ls
        K = torch.exp(-0.5 * torch.cdist(Xs, Xs) ** 2 + th0[D_IN])
        K.diagonal().add_(torch.exp(th0[D_IN + 1]))
        L = torch.linalg.cholesky(K)
        torch.cholesky_solve(yc.unsqueeze(-1), L)
        torch.cholesky_inverse(L)

    gm, gf = via_model(), via_fused()
    vm = float(model.log_joint(th0.unsqueeze(0))[0])
    vf = float(_FusedLogJoint.apply(th0, Xc, yc, mu0, var))
    err = max(abs(vm - vf) / abs(vm), float(((gm - gf).abs() / gm.abs().clamp(min=1e-3)).max()))
    out = {"N": N, "D": D, "model_ms": _median_ms(via_model), "fused_ms": _median_ms(via_fused),
           "floor_ms": _median_ms(floor), "max_rel_diff": err}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        mc = gpvi.NUTS(num_chains=1, num_warmup=100, num_draws=100, seed=0, progress_bar=False).run(model)
        wall = time.perf_counter() - t0
    grads = float(mc.info["warmup_stats"]["n_steps"].double().sum() + mc.stats["n_steps"].double().sum())
    out["nuts_ms_per_grad"] = 1000 * wall / grads
    out["pyro_ms_per_step"] = out["nuts_ms_per_grad"] - out["model_ms"]
    print(out, flush=True)
    return out


def main() -> None:
    rows = [measure(N) for N in SIZES]
    lines = [header("A NUTS step at small N: the log joint's overhead and a fused prototype (issue 39)"), "",
             f"{D_IN} ARD inputs (D = {D_IN + 2}), default prior; medians of 200 calls, one process. `fused` is a "
             "prototype in this script, not gpvi code; its value and gradient match `model`'s to the relative "
             "difference shown.", "",
             "| N | model: log joint + gradient (ms) | fused prototype (ms) | floor: kernel, Cholesky, solve, inverse "
             "(ms) | model / fused | NUTS wall per gradient (ms) | of which Pyro (ms) | NUTS step, fused / model "
             "(projected) | max rel. difference |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        proj = (r["fused_ms"] + r["pyro_ms_per_step"]) / r["nuts_ms_per_grad"]
        lines.append(f"| {r['N']} | {r['model_ms']:.3f} | {r['fused_ms']:.3f} | {r['floor_ms']:.3f} | "
                     f"{r['model_ms'] / r['fused_ms']:.2f} | {r['nuts_ms_per_grad']:.3f} | "
                     f"{r['pyro_ms_per_step']:.3f} | {proj:.2f} | {r['max_rel_diff']:.1e} |")
    write("small_n_overhead", "\n".join(lines) + "\n", rows)


if __name__ == "__main__":
    main()
