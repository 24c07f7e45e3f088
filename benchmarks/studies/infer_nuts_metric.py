"""``gpvi.infer``'s NUTS route: which warm-up, from the same q (issue 57; the study behind ``infer.default_nuts``).

For each (problem, seed) of the stress suite's **tuning** half (``trust_stress.py``; the held-out half was not
run) and small_data's 14-point model: ``gpvi.infer``'s variational fit q once, then 4 chains from draws of q,
500 draws a chain, doubled at most 3 times until ``infer``'s targets are met (bulk and tail ESS >= 400, R-hat
<= 1.01, every MCSE of a mean or sd <= 0.05 sd: ``infer._mixed``), per variant:

- ``A_qmass_w200``: q's covariance as a fixed dense metric, step size adapted over 200 warm-up transitions
  (``infer``'s route before this study);
- ``C_dense_w500`` / ``D_diag_w500`` / ``K_diag_w200``: a dense / diagonal metric adapted in Stan's windows over
  500 / 500 / 200 warm-up transitions (q's covariance unused);
- ``E_qmass_w200_t09`` / ``I_qmass_w200_t095``: as A with target acceptance 0.9 / 0.95;
- ``H_diag_w500_t09``: as D with target acceptance 0.9.

Recorded: wall, extensions, whether the targets were met ("mixed"), gradient evaluations, divergences, min bulk and
tail ESS, max R-hat, the largest MCSE of a sd over the sd, the load.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.infer_nuts_metric run A_qmass_w200,D_diag_w500 \\
        synth-2:0 tiny:1
    .venv/bin/python -m benchmarks.studies.infer_nuts_metric render
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gpvi  # noqa: E402
from benchmarks.studies._common import OWN, header, write  # noqa: E402
from gpvi.inference import infer as infer_mod  # noqa: E402
from gpvi.inference.check import mixed, relative_mcse, run_until_mixed  # noqa: E402
from gpvi.inference.mcmc import Adaptation  # noqa: E402

VARIANTS = {
    "A_qmass_w200": dict(num_warmup=200, adaptation=Adaptation()),
    "C_dense_w500": dict(num_warmup=500, adaptation=Adaptation(dense_mass=True, mass_from_init=False)),
    "D_diag_w500": dict(num_warmup=500, adaptation=Adaptation(mass_from_init=False)),
    "E_qmass_w200_t09": dict(num_warmup=200, adaptation=Adaptation(target_accept=0.9)),
    "H_diag_w500_t09": dict(num_warmup=500, adaptation=Adaptation(mass_from_init=False, target_accept=0.9)),
    "I_qmass_w200_t095": dict(num_warmup=200, adaptation=Adaptation(target_accept=0.95)),
    "K_diag_w200": dict(num_warmup=200, adaptation=Adaptation(mass_from_init=False)),
}
LOG = OWN / "infer_nuts_metric.jsonl"


def _model(pid: str):
    from benchmarks.small_data import tiny_model
    from benchmarks.trust_stress import model_of, problems
    if pid == "tiny":
        return tiny_model(), "-"
    p = {q["id"]: q for q in problems()}[pid]
    return model_of(p), p["half"]


def run(names: list[str], cases: list[tuple[str, int]]) -> None:
    for pid, seed in cases:
        model, half = _model(pid)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q = infer_mod.variational_fit(model, seed=seed, progress_bar=False)
        for name in names:
            t0 = time.perf_counter()
            s = gpvi.NUTS(num_chains=4, num_draws=500, seed=seed, progress_bar=False, **VARIANTS[name])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                post, d, ext = run_until_mixed(s, model, q, min_ess=400, max_extensions=3)
            _, mcse_sd = relative_mcse(d, post.std)
            row = dict(case=f"{pid}:{seed}", half=half, variant=name, wall=round(time.perf_counter() - t0, 1),
                       ext=ext, mixed=mixed(d, 400, post.std), grads=int(post.stats["n_steps"].sum()),
                       div=int(post.stats["diverging"].sum()), bulk=round(float(d["ess_bulk"].min())),
                       tail=round(float(d["ess_tail"].min())), rhat=round(float(d["r_hat"].max()), 3),
                       mcse_sd=round(mcse_sd, 3), load=round(os.getloadavg()[0], 2))
            print(json.dumps(row), flush=True)
            with LOG.open("a") as f:
                f.write(json.dumps(row) + "\n")


def render() -> None:
    rows = [json.loads(line) for line in LOG.read_text().splitlines() if line.strip()]
    md = [header("gpvi.infer's NUTS route: fixed q metric against adapted warm-ups (issue 57)"), "",
          "Same q per (problem, seed); 4 chains x 500 draws from draws of q, doubled at most 3 times to `infer`'s "
          "targets. Rows as run (one core, one thread; load in the last column). Stress-suite problems: tuning "
          "half only.", "",
          "| case | half | variant | wall (s) | extensions | targets met | gradients | divergences | min bulk ESS "
          "| min tail ESS | max R-hat | max MCSE of sd / sd | load |", "|---" * 13 + "|"]
    md += [f"| {r['case']} | {r['half']} | {r['variant']} | {r['wall']} | {r['ext']} | "
           f"{'yes' if r['mixed'] else 'no'} | {r['grads']} | {r['div']} | {r['bulk']} | {r['tail']} | "
           f"{r['rhat']} | {r['mcse_sd']} | {r['load']} |"
           for r in rows]
    tot: dict[str, list] = defaultdict(lambda: [0.0, 0, 0, 0])
    stress = sorted({r["case"] for r in rows if r["half"] == "tuning"})
    for r in rows:
        if r["half"] == "tuning" and all(any(x["case"] == c and x["variant"] == r["variant"] for x in rows)
                                         for c in stress):
            t = tot[r["variant"]]
            t[0] += r["wall"]
            t[1] += r["mixed"]
            t[2] += 1
            t[3] += r["div"]
    md += ["", f"Per variant over the {len(stress)} tuning cases every listed variant ran ({', '.join(stress)}):", "",
           "| variant | total wall (s) | targets met | divergences |", "|---|---|---|---|"]
    md += [f"| {v} | {t[0]:.1f} | {t[1]} of {t[2]} | {t[3]} |" for v, t in sorted(tot.items())]
    write("infer_nuts_metric", "\n".join(md) + "\n", rows)


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] == "run":
        run(args[1].split(","), [(a.split(":")[0], int(a.split(":")[1])) for a in args[2:]])
    render()


if __name__ == "__main__":
    main()
