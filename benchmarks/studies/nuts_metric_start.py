"""``gpvi.infer``'s NUTS route: where the adapted diagonal metric starts (issue 57, the Boston lever).

``infer.default_nuts`` adapts a diagonal :math:`M^{-1}` in Stan's windows starting from the identity: the 75-transition
start buffer and the first 25-transition window run with a unit metric, so on a posterior whose sds span a decade
(Boston: 0.13-1.8) the step size is cut to the smallest scale and the early trees are deep. q's marginal variances
are known when NUTS starts (``Adaptation(mass_start="init")``): this study measures what starting there saves, and
whether the answers stay the same.

For each case, ``gpvi.infer``'s variational fit q (stress-suite cases: the cached fit of ``trust_stress.fit_q``;
Boston: a new fit, pickled under ``/tmp``), the chains' start as ``infer`` makes it (``mix if several else q``:
:func:`gpvi.inference.check.basins`), then per variant ``run_until_mixed`` to ``infer``'s targets:

- ``identity_w500``: ``infer.default_nuts`` as it is (identity start, 500 warm-up transitions);
- ``init_w500``: the same with ``mass_start="init"``;
- ``init_w300``: ``mass_start="init"`` with 300 warm-up transitions;
- ``dense_w500``: ``infer.default_nuts`` with a dense adapted metric (``dense_mass=True``, identity start).

Recorded: warm-up and draws' gradient evaluations, extensions, targets met, min bulk / tail ESS, divergences, and the
answer against the reference (stress suite: its long NUTS reference; Boston: the first variant's run): the largest
|mean difference| in reference sds and the range of sd ratios. Gradient counts do not depend on the machine's load.

Cases: the stress suite's tuning problems whose seed-0 case ended on NUTS decide (``--half tuning``); the held-out
ones are reported (``--half held-out``); ``boston`` and ``tiny`` by name.

Finding (2026-11-29, results/nuts_metric_start.md; seeds 0-2 of the 7 tuning problems, seed 0 of the 9 held-out
ones, Boston seed 0): ``init_w500`` cut the warm-up's gradients in every one of the 31 paired runs (median 0.78x,
0.63-0.97x; sums: tuning 768k -> 579k, held out 427k -> 351k, Boston 50.8k -> 39.5k), but not the runs' totals: the
draws' gradients, which depend on how often the chains are extended, vary from run to run by more than the warm-up
saves (totals: tuning 2.148M -> 2.177M, held out 1.331M -> 1.242M, Boston 119.5k -> 140.5k with one more
extension; paired median 0.88x, 0.49-2.93x). Unflagged misses (targets met, outside the suite's tolerance): tuning
pendulum-0 seeds 1 and 2 with the identity start, seed 2 with ``init``; held out boston-3 seed 0 with both. The
pendulum-0 ones are against a reference that missed its own targets (``trust_stress.md``): rerun, the identity run of
seed 1 has log_signal_var's sd 0.343 against the suite reference's 0.702 and the long dispersed reference's 0.396
(``trust_stress_longref_pendulum_0``): 0.87x, inside the tolerance; every other sd within 0.97-1.03x of the long
one. boston-3's is 0.77-0.80x of both references. So
``infer.default_nuts`` keeps the identity start (decided on the tuning totals); ``init_w300`` was dropped after
seed 0 (an unflagged miss on pendulum-0, sd 0.52x).

Boston, seed 0, rerun with ``dense_w500`` beside ``identity_w500`` (issue 57, 2026-11-29; the identity run repeated
the first one's gradient counts exactly): the dense metric's warm-up took more gradients (62.5k against 50.8k), its
trees fewer (15.2 against 17.2 a draw), and its chains met the targets after 750 draws a chain instead of 1,000: 108.2k
gradients in all against 119.5k (0.91x), answers within 0.041 sd of the identity run's (sd ratios 0.95-1.06). Not a
lever for Boston's wall target (458 s would allow about 40k NUTS gradients at N = 455).

Usage::

    GPVI_STRESS_CACHE=~/.cache/gpvi/trust_stress_sized OMP_NUM_THREADS=1 \\
        .venv/bin/python -m benchmarks.studies.nuts_metric_start run tuning
    ... run tuning --seed=1 --variants=identity_w500,init_w500
    .venv/bin/python -m benchmarks.studies.nuts_metric_start render
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.studies._common import OWN, header, write  # noqa: E402
from gpvi.inference import infer as infer_mod  # noqa: E402
from gpvi.inference.check import basins, mixed, run_until_mixed  # noqa: E402
from gpvi.inference.mcmc import Adaptation  # noqa: E402
import gpvi  # noqa: E402

VARIANTS = {"identity_w500": (500, "identity", False), "init_w500": (500, "init", False),
            "init_w300": (300, "init", False), "dense_w500": (500, "identity", True)}
LOG = OWN / "nuts_metric_start.jsonl"


def _case(name: str, seed: int) -> tuple[object, object, dict | None, str]:
    """(model, q, reference or None, half)."""
    from benchmarks.small_data import boston_model, tiny_model
    from benchmarks.trust_stress import fit_q, model_of, problems, reference
    if name in ("boston", "tiny"):
        model = boston_model() if name == "boston" else tiny_model()
        path = Path(f"/tmp/nuts_metric_start_q_{name}_{seed}.pt")
        if path.exists():
            q = torch.load(path, weights_only=False)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                q = infer_mod.variational_fit(model, seed=seed, progress_bar=False)
            torch.save(q, path)
        return model, q, None, "-"
    p = {x["id"]: x for x in problems()}[name]
    return model_of(p), fit_q(p, seed)[0], reference(p), p["half"]


def cases_of(half: str) -> list[str]:
    data = json.loads((Path(__file__).resolve().parents[1] / "results" / "trust_stress.json").read_text())["data"]
    return [r["problem"] for r in data["cases"]
            if r["half"] == half and r["seed"] == 0 and r["v2"]["answer"] == "nuts"]


def run(names: list[str], seed: int = 0, variants: list[str] | None = None) -> None:
    for name in names:
        model, q, ref, half = _case(name, seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, _, mix, _, several = basins(q, model, seed, 1000)
        init = mix if several else q
        first = None
        for variant in variants or VARIANTS:
            warmup, start, dense = VARIANTS[variant]
            s = gpvi.NUTS(num_chains=4, num_warmup=warmup, num_draws=500, seed=seed, progress_bar=False,
                          adaptation=Adaptation(mass_from_init=False, mass_start=start, dense_mass=dense))
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                post, d, ext = run_until_mixed(s, model, init, min_ess=400, max_extensions=3)
            x = post.draws.reshape(-1, post.draws.shape[-1]).cpu().numpy()
            mean, sd = x.mean(0), x.std(0, ddof=1)
            if ref is None:
                ref = first = first or {"mean": mean.tolist(), "sd": sd.tolist()}
            rm, rs = np.asarray(ref["mean"]), np.asarray(ref["sd"])
            total = int(sum(post.info["num_evaluations"]))
            drawn = int(post.stats["n_steps"].sum())
            row = dict(case=name, seed=seed, half=half, several=bool(several), variant=variant,
                       wall=round(time.perf_counter() - t0, 1), ext=ext, mixed=mixed(d, 400, post.std),
                       warmup_grads=total - drawn, draw_grads=drawn, draws=int(post.draws.shape[1]),
                       bulk=round(float(d["ess_bulk"].min())), tail=round(float(d["ess_tail"].min())),
                       div=int(post.stats["diverging"].sum()),
                       dmean=round(float((np.abs(mean - rm) / rs).max()), 3),
                       sd_lo=round(float((sd / rs).min()), 3), sd_hi=round(float((sd / rs).max()), 3),
                       load=round(os.getloadavg()[0], 2))
            print(json.dumps(row), flush=True)
            with LOG.open("a") as f:
                f.write(json.dumps(row) + "\n")


def _misses(rows: list[dict]) -> str:
    """The runs that met ``infer``'s targets but lie outside the stress suite's tolerance (|dmean| <= 0.2 sd, sd
    ratios 0.8-1.25): NUTS answers that would be trusted and are wrong."""
    out = [f"{r['case']}:{r['seed']} ({r['dmean']}, {r['sd_lo']}-{r['sd_hi']})" for r in rows
           if r["mixed"] and not (r["dmean"] <= 0.2 and r["sd_lo"] >= 0.8 and r["sd_hi"] <= 1.25)]
    return ", ".join(out) or "-"


def render() -> None:
    rows = [{"seed": 0, **json.loads(line)} for line in LOG.read_text().splitlines() if line.strip()]
    rows = list({(r["case"], r["seed"], r["variant"]): r for r in rows}.values())   # a repeated run: its last one
    md = [header("gpvi.infer's NUTS route: the adapted diagonal metric started at q's variances (issue 57)"), "",
          "The chains start as `infer` starts them; 4 chains x 500 draws, extended to `infer`'s targets "
          "(`run_until_mixed`). Answers against the stress suite's long reference (Boston, tiny: against the "
          "`identity_w500` run). Gradient counts do not depend on load. pendulum-0's suite reference missed its own targets "
          "(its log_signal_var sd 0.70 against the long dispersed reference's 0.40): its rows' sd ratios are against "
          "that reference (see the module docstring).", "",
          "| case | seed | half | basins | variant | warm-up gradients | draws' gradients | total | extensions | draws "
          "| met | min bulk ESS | min tail ESS | div | max abs dmean (sd) | sd ratios | wall (s) | load |",
          "|---" * 18 + "|"]
    md += [f"| {r['case']} | {r['seed']} | {r['half']} | {'several' if r['several'] else 'one'} | {r['variant']} | "
           f"{r['warmup_grads']} | {r['draw_grads']} | {r['warmup_grads'] + r['draw_grads']} | {r['ext']} | "
           f"{r['draws']} | {'yes' if r['mixed'] else 'no'} | {r['bulk']} | {r['tail']} | {r['div']} | "
           f"{r['dmean']} | {r['sd_lo']}-{r['sd_hi']} | {r['wall']} | {r['load']} |" for r in rows]
    md += ["", "Totals over the (case, seed) pairs both 500-transition variants ran, by half (init_w300: where it ran too):", "",
           "| half | variant | runs | warm-up gradients | total gradients | targets met | met, outside the suite's "
           "tolerance (unflagged miss) |", "|---|---|---|---|---|---|---|"]
    for half in sorted({r["half"] for r in rows}):
        cases = sorted({(r["case"], r["seed"]) for r in rows if r["half"] == half})
        both = ("identity_w500", "init_w500")
        full = [c for c in cases if all(any((r["case"], r["seed"]) == c and r["variant"] == v for r in rows)
                                        for v in both)]
        for v in VARIANTS:
            sel = [r for r in rows if r["half"] == half and r["variant"] == v and (r["case"], r["seed"]) in full]
            if sel:
                md.append(f"| {half} | {v} | {len(sel)} | {sum(r['warmup_grads'] for r in sel)} | "
                          f"{sum(r['warmup_grads'] + r['draw_grads'] for r in sel)} | "
                          f"{sum(r['mixed'] for r in sel)} | "
                          f"{_misses(sel)} |")
    write("nuts_metric_start", "\n".join(md) + "\n", rows)


def main() -> None:
    args = sys.argv[1:]
    if args and args[0] == "run":
        opts = dict(a[2:].split("=", 1) for a in args[1:] if a.startswith("--"))
        names = [n for a in args[1:] if not a.startswith("--")
                 for n in (cases_of(a) if a in ("tuning", "held-out") else [a])]
        run(names, int(opts.get("seed", 0)), opts["variants"].split(",") if "variants" in opts else None)
    render()


if __name__ == "__main__":
    main()
