"""Cost of one doubly stochastic (single-site) CVI step vs N, next to a full refactorisation and a full-batch step.

Synthetic binary data (d = 3, inputs uniform on [-2, 2]^3, labels ~ Bernoulli(sigmoid(3 (sin 2 x_0 + x_1)))),
logit link, the default kernel at its data-scaled start. For each N:

* single-site step: ``CVI(mode="stochastic").step``, what the driver executes per step (one triangular solve for the
  site's marginal, the site update, the in-place update of the cached factor of K + S), timed in blocks of steps;
  the median per-step time over the blocks. Both factor updates are timed: ``blocked``
  (gpvi.linalg.cholesky_site_update_, the default) and ``generic`` (gpvi.linalg.cholesky_update on the trailing
  block).
* refactorisation: Cholesky of K + S from scratch (gpvi.linalg.cholesky_with_jitter), median of 3.
* full-batch step: one ``CVI(mode="full")`` step (factorisation, all marginals, quadrature, update), median of 3.
* drift: max |L_updated - L_fresh| after 1000 single-site steps without refactorisation (N <= 2000).

The log-log slope of the single-site step cost is a least-squares fit over the N values. Targets:
slope <= 2.2 and, at N = 2000, a single-site step >= 20x cheaper than a full-batch step.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.cvi_step_cost [--quick]``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
import torch

from benchmarks._common import header, median_time, write
from gpvi.inference.cvi import CVI, SingleSite
from gpvi.numerics.sites import pseudo_data, site_factor
from gpvi.models.classification import GPClassification


def make_data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand((n, 3), generator=g, dtype=torch.float64) * 4 - 2
    f = torch.sin(2 * X[:, 0]) + X[:, 1]
    y = (torch.rand(n, generator=g, dtype=torch.float64) < torch.sigmoid(3 * f)).to(torch.float64)
    return X, y


def prepared(model: GPClassification, factor_update: str):
    eng = CVI(mode="stochastic", single_site=SingleSite(refactor_every=10**9, factor_update=factor_update),
              num_steps=10**9, tol=0, progress_bar=False)
    st = eng.init(model, generator=torch.Generator().manual_seed(0))
    st, _ = eng.step(model, st)          # the initial full step from the prior, then the factor
    st, _ = eng.step(model, st)
    return eng, st


def single_site_ms(model: GPClassification, factor_update: str, block: int, blocks: int) -> tuple[float, list]:
    eng, st = prepared(model, factor_update)
    per_step = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(block):
            st, _ = eng.step(model, st)
        per_step.append((time.perf_counter() - t0) / block * 1e3)
    return statistics.median(per_step), per_step


def drift_after(model: GPClassification, steps: int) -> float:
    eng, st = prepared(model, "blocked")
    for _ in range(steps):
        st, _ = eng.step(model, st)
    K = model.kernel_matrix(st.theta)
    fresh = torch.linalg.cholesky(K + torch.diag(-0.5 / st.lam2))
    return float((st.factor - fresh).abs().max())


def slope(ns: list[int], ts: list[float]) -> float:
    return float(np.polyfit(np.log(ns), np.log(ts), 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="N = 500, 1000 only, fewer repeats")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ns = [500, 1000] if args.quick else [500, 1000, 2000, 3000, 4000]
    rows = []
    for n in ns:
        X, y = make_data(n)
        model = GPClassification(X, y)
        block = 40 if n <= 2000 else 15
        blk_ms, blk_all = single_site_ms(model, "blocked", block, 3 if args.quick else 7)
        gen_ms, gen_all = single_site_ms(model, "generic", max(3, block // 4), 3 if args.quick else 5)
        K = model.kernel_matrix(model.theta)
        eng_f = CVI(mode="full", tol=0, progress_bar=False)
        st_f = eng_f.init(model)
        st_f, _ = eng_f.step(model, st_f)
        _, s = pseudo_data(st_f.lam1, st_f.lam2)
        chol_s, chol_all = median_time(lambda: site_factor(K, s), repeats=3, warmup=1)

        def full_step():
            eng_f.step(model, st_f.copy())
        full_s, full_all = median_time(full_step, repeats=3, warmup=1)
        drift = drift_after(model, 1000) if (n <= 2000 and not args.quick) else math.nan
        row = {"N": n, "single_site_blocked_ms": blk_ms, "single_site_generic_ms": gen_ms,
               "refactor_ms": chol_s * 1e3, "full_step_ms": full_s * 1e3,
               "ratio_full_over_single": full_s * 1e3 / blk_ms, "drift_after_1000": drift,
               "all_blocked_ms": blk_all, "all_generic_ms": gen_all, "all_refactor_s": chol_all,
               "all_full_s": full_all}
        rows.append(row)
        print(f"N={n}: single {blk_ms:.2f} ms (generic {gen_ms:.2f}), refactor {chol_s*1e3:.1f} ms, "
              f"full step {full_s*1e3:.1f} ms, ratio {row['ratio_full_over_single']:.1f}, drift {drift:.1e}",
              flush=True)
    nn = [r["N"] for r in rows]
    sl_blk = slope(nn, [r["single_site_blocked_ms"] for r in rows])
    sl_gen = slope(nn, [r["single_site_generic_ms"] for r in rows])
    sl_full = slope(nn, [r["full_step_ms"] for r in rows])
    sl_chol = slope(nn, [r["refactor_ms"] for r in rows])
    big = [r for r in rows if r["N"] >= 1000]
    sl_blk_big = slope([r["N"] for r in big], [r["single_site_blocked_ms"] for r in big]) if len(big) > 1 else math.nan
    r2000 = next((r for r in rows if r["N"] == 2000), None)

    md = header("CVI single-site step cost vs N")
    md += ("\nSynthetic binary data, d = 3, logit link, default kernel at its data-scaled start; float64, one thread. "
           "Per-step times are medians over blocks of consecutive steps (the engine's step, as the driver calls it), "
           "full-batch step and refactorisation medians of 3 after a warm-up.\n\n")
    md += ("| N | single-site step, blocked (ms) | single-site step, generic `cholesky_update` (ms) | "
           "refactorisation: Cholesky of K + S (ms) | full-batch CVI step (ms) | full / single-site | "
           "drift after 1000 updates |\n|---|---|---|---|---|---|---|\n")
    for r in rows:
        md += (f"| {r['N']} | {r['single_site_blocked_ms']:.3f} | {r['single_site_generic_ms']:.3f} | "
               f"{r['refactor_ms']:.1f} | {r['full_step_ms']:.1f} | {r['ratio_full_over_single']:.1f} | "
               f"{r['drift_after_1000']:.1e} |\n")
    md += (f"\nLog-log slopes (least squares over N = {nn}): single-site blocked **{sl_blk:.2f}** "
           f"(N >= 1000: {sl_blk_big:.2f}), single-site generic {sl_gen:.2f}, refactorisation {sl_chol:.2f}, "
           f"full-batch step {sl_full:.2f}.\n\n")
    if r2000 is not None:
        ok_slope = sl_blk <= 2.2
        ok_ratio = r2000["ratio_full_over_single"] >= 20
        md += ("Targets: slope <= 2.2 -> " + ("**met**" if ok_slope else "**not met**") +
               f" ({sl_blk:.2f}); at N = 2000 a single-site step >= 20x cheaper than a full-batch step -> "
               + ("**met**" if ok_ratio else "**not met**") + f" ({r2000['ratio_full_over_single']:.1f}x).\n\n")
    md += ("Notes. The slope below 2 at small N reflects a fixed per-step Python/torch overhead of roughly 0.5-1 ms "
           "(about 60 small tensor operations); above N ~ 2000 the step is memory-bound (the factor no longer "
           "fits in cache), which is where the slope approaches or exceeds 2. The generic rank-one update "
           "allocates several N x N temporaries per call; at large N the page faults of those fresh allocations "
           "cost more than the arithmetic, which is why the single-site path uses the blocked in-place variant.\n")
    path = write("cvi_step_cost" + ("_quick" if args.quick else ""), md, {"rows": rows, "slopes": {"blocked": sl_blk, "blocked_N_ge_1000": sl_blk_big,
                                                                "generic": sl_gen, "refactor": sl_chol,
                                                                "full_step": sl_full}})
    print(md)
    print(f"written {path}")


if __name__ == "__main__":
    main()
