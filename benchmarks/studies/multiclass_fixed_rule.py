"""Accuracy of the multi-class softmax "fixed" rule: scrambled Sobol' points against the pseudo-random draws used
before 2026-11-24.

200 softmax sites with K = 10 classes (means N(0, 2.5^2), variances U(0.05, 3.05), labels uniform; seed 1). For each
rule, :math:`E_n = \\mathbb E[\\log p(y_n \\mid \\mathbf f_n)]`, :math:`\\partial E_n / \\partial m_{nk}` and
:math:`\\partial E_n / \\partial v_{nk}` against a reference: the average of 4 independently scrambled Sobol'
sequences of 65,536 points each (262,144 points). Reported: the largest absolute error over sites (and classes),
the error of the sum of :math:`E_n` over the sites (what the bound sees), and the wall time of one evaluation.
Rules: 2,000 pseudo-random standard-normal draws (the old default, seed ``FIXED_DRAWS_SEED``), and
:func:`gpvi.numerics.softmax_rules.fixed_draws` with 256, 512, 1,024 (the default) and 2,048 points.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.multiclass_fixed_rule``.
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.studies._common import header, write
from gpvi.models.multiclass_likelihoods import Softmax
from gpvi.numerics.softmax_rules import FIXED_DRAWS_SEED, fixed_draws

N, K = 200, 10


def sobol(n: int, seed: int) -> torch.Tensor:
    u = torch.quasirandom.SobolEngine(K, scramble=True, seed=seed).draw(n, dtype=torch.float64)
    tiny = torch.finfo(torch.float64).eps
    return torch.special.ndtri(u.clamp(tiny, 1.0 - tiny))


def main() -> None:
    g = torch.Generator().manual_seed(1)
    m = torch.randn(N, K, generator=g, dtype=torch.float64) * 2.5
    v = torch.rand(N, K, generator=g, dtype=torch.float64) * 3 + 0.05
    y = torch.randint(0, K, (N,), generator=g)
    lik = Softmax()

    def moments(eps: torch.Tensor) -> list[torch.Tensor]:
        import gpvi.models.multiclass as mm
        real = mm.fixed_draws
        mm.fixed_draws = lambda n, k, like: eps.to(like)          # evaluate the rule on exactly these points
        try:
            ex = lik.expected_log_lik(y, m, v, method="fixed", num_draws=eps.shape[0])
        finally:
            mm.fixed_draws = real
        return [ex.value, ex.dm, ex.dv]

    ref = [sum(x) / 4 for x in zip(*(moments(sobol(65536, 1000 + s)) for s in range(4)))]
    rules = {"2,000 pseudo-random draws (before)":
             torch.randn(2000, K, generator=torch.Generator().manual_seed(FIXED_DRAWS_SEED), dtype=torch.float64)}
    for n in (256, 512, 1024, 2048):
        rules[f"{n:,} Sobol' points" + (" (default)" if n == 1024 else "")] = fixed_draws(n, K, m)
    rows, data = [], {}
    for name, eps in rules.items():
        got = moments(eps)
        err = [float((a - b).abs().max()) for a, b in zip(got, ref)]
        sum_err = float((got[0] - ref[0]).sum())
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            moments(eps)
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        data[name] = {"max_err_value": err[0], "max_err_dm": err[1], "max_err_dv": err[2], "sum_err_value": sum_err,
                      "eval_s": t}
        rows.append(f"| {name} | {err[0]:.2e} | {err[1]:.2e} | {err[2]:.2e} | {sum_err:+.3f} | {1e3 * t:.1f} |")
        print(rows[-1], flush=True)
    md = header("Multi-class softmax 'fixed' rule: Sobol' points vs pseudo-random draws (K = 10, 200 sites)") + "\n"
    md += __doc__.split("\n\n", 1)[1].split("\n\nRun:")[0] + "\n\n"
    md += ("| rule | max abs error E_n | max abs error dE/dm | max abs error dE/dv | error of sum E_n | "
           "ms per evaluation |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    print(write("multiclass_fixed_rule", md, data))


if __name__ == "__main__":
    main()
