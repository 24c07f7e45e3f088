"""Where the S&K engine's time goes in the fully Bayesian classifier, and what fewer steps, fewer draws or a looser
EP tolerance cost in accuracy (issue 59, item 3), on the tuning half only.

Per case (``--cases``: a tuning family of ``benchmarks/heldout_families.py`` at N training rows, the higher noise
level, as ``classification_heldout.py --sections bayes``), ``GPClassifier(hyperparameters="bayes")`` runs to the
engine's start (MAP-II, the EP MAP point, the Laplace scale, the site bank switched on); there, instead of the
default engine alone, every engine of ``--settings`` runs from the same start on the same target (the bank emptied
before each run, so each run sees what a fresh fit's engine sees), without the final bound estimate (it does not
change q):

* ``ref``: ``SKGaussian`` with 800 steps (w = 0.035, a window of 400 steps x 4 draws): the Gaussian the
  default estimates, up to a Monte Carlo error about a third of the default's;
* ``default``: the default engine (``FullyBayesianCVI.default_engine``: 100 steps x 4 draws where D <= 4);
* ``draws=2``: the default's steps with 2 draws (one antithetic pair) per step;
* ``steps=K``: K steps (w = 1/sqrt(K), the second half averaged), 4 draws;
* ``burn=K``: the default's step size and averaging window with K steps before the window instead of half the run;
* ``burn_draws=K``: the default engine with K draws per step before the averaging window
  (``SKSchedule(burn_in_draws=K)``);
* ``tol=X``: the default engine with EP's tolerance X in the engine's evaluations (1e-3 by default);
* parts joined by ``+`` combine (``burn_draws=2+tol=3e-3``).

Each non-reference setting runs with ``--seeds`` (the engine's seed: the Sobol scramble). Reported per setting: the
engine's wall and its EP evaluations and sweeps (medians over the seeds; load quoted), and the error against
``ref``: the largest |mean - ref mean| in ref sds and the largest |log sd ratio| over the log-hyperparameters, as
the root mean square over the seeds, and the largest over the seeds.

Run: ``OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python -m benchmarks.studies.bayes_steps --label h59d``. Results:
``benchmarks/studies/results/bayes_steps_<label>.{md,json}``: ``h59d`` (steps, draws, burn-in, EP at 3e-3; load
0.8-2.4), ``h59d_tol`` (EP at 3e-3 / 1e-2 / 3e-2; load 1.9-2.5), ``h59d_burn`` (2 draws before the window, alone
and with the looser tolerances; load 2.8-4.1).

What they showed (errors against the long run, root mean square over seeds 0-2): the engine's evaluations are at
the accuracy's limit, and where its time goes at N = 100 is a step's fixed cost (100 x 2 draws took 0.62 s against
0.76 s for 100 x 4 on xor). 2 draws per step raised the mean error from 0.009 / 0.134 / 0.015 / 0.035 / 0.024 to
0.038 / 0.327 / 0.029 / 0.078 / 0.039 sd (xor N = 100, spirals N = 100, checkerboard N = 200, clf8 N = 100, xor
N = 400), 50 steps to 0.040 / 0.285 / 0.034 / 0.077 / 0.040, a 20-step burn-in to 0.013 / 0.201 / 0.025 / 0.114 /
0.023, 2 draws before the window alone to 0.018 / 0.246 on xor / spirals N = 100 and 0.013 -> 0.019 on spirals
N = 200: all rejected. EP's tolerance in the engine's evaluations is not: 3e-3 left every error within 0.002 sd
(spirals N = 100 0.134 -> 0.122) with 16-23% fewer sweeps, adopted up to D = 10
(:data:`gpvi.inference.cvi.bayes.BINARY_EP_TOL`).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
import warnings
from typing import Any

import torch

from benchmarks.heldout_families import SPLIT, binary_data
from benchmarks.studies._common import header, write
from gpvi.inference.cvi.bayes import FullyBayesianCVI
from gpvi.inference.salimans_knowles import SKGaussian, SKSchedule


REF_SEED = 59
"""The reference run's seed (not one of the seeds of the settings: its Sobol scramble differs from theirs)."""


class _Stop(Exception):
    """Raised after the engines ran: the study skips the predictive."""


def engine_of(setting: str, base: SKGaussian, seed: int) -> tuple[SKGaussian, float | None]:
    """``(engine, EP tolerance or None)`` of ``setting`` (module docstring; parts joined by ``+`` combine), from
    the default engine ``base``."""
    kw = {"method": base.method, "draws": base.draws, "num_elbo_draws": 0, "seed": seed, "progress_bar": False}
    if setting == "ref":
        return SKGaussian(num_steps=800, num_draws=4, **kw), None
    steps, draws, tol, sched = base.num_steps, base.num_draws, None, {}
    for part in setting.split("+"):
        name, _, value = part.partition("=")
        if name == "default":
            continue
        if name == "draws":
            draws = int(value)
        elif name == "steps":
            steps = int(value)
        elif name == "burn":
            window = base.num_steps - base.schedule.window_bounds(base.num_steps)[0]
            steps = window + int(value)
            sched.update(step_size=base.w, average_fraction=window / steps)
        elif name == "burn_draws":
            sched["burn_in_draws"] = int(value)
        elif name == "tol":
            tol = float(value)
        else:
            raise ValueError(f"unknown setting {setting!r}")
    return SKGaussian(num_steps=steps, num_draws=draws, schedule=SKSchedule(**sched), **kw), tol


class _Study(FullyBayesianCVI):
    """Runs every setting's engine from the default's start, records them, then stops the fit."""

    def __init__(self, settings: list[str], seeds: list[int], **kw: Any) -> None:
        super().__init__(**kw)
        self.settings, self.seeds, self.runs = settings, seeds, []

    def _fit_q(self, engine: Any, target: Any, start: Any) -> Any:
        tol0 = target.tol
        for setting in self.settings:
            for seed in ([REF_SEED] if setting == "ref" else self.seeds):
                eng, tol = engine_of(setting, engine, seed)
                target.tol = tol0 if tol is None else tol
                target.start_from_neighbours(self.ep_bank)
                c0 = dict(target.counters)
                load = os.getloadavg()[0]
                t0 = time.perf_counter()
                q = eng.run(target, init=start)
                wall = time.perf_counter() - t0
                self.runs.append({"setting": setting, "seed": seed, "wall_s": wall, "load": load,
                                  "steps": eng.num_steps, "draws": eng.num_draws,
                                  "evaluations": target.counters["evaluations"] - c0["evaluations"],
                                  "sweeps": target.counters["sweeps"] - c0["sweeps"],
                                  "mean": q.mean.tolist(), "sd": q.covariance.diagonal().sqrt().tolist()})
                print(setting, seed, f"{wall:.2f}s", self.runs[-1]["evaluations"], self.runs[-1]["sweeps"],
                      flush=True)
        target.tol = tol0
        raise _Stop


def errors(run: dict[str, Any], ref: dict[str, Any]) -> tuple[float, float]:
    """Largest |mean - ref| in ref sds, largest |log sd ratio|."""
    m, s, mr, sr = (torch.tensor(run[k]) for k in ("mean", "sd")), None, None, None
    m, s = torch.tensor(run["mean"]), torch.tensor(run["sd"])
    mr, sr = torch.tensor(ref["mean"]), torch.tensor(ref["sd"])
    return float(((m - mr).abs() / sr).max()), float((s / sr).log().abs().max())


def study_case(case: str, settings: list[str], seeds: list[int]) -> list[dict[str, Any]]:
    from gpvi import GPClassifier
    import gpvi.sklearn as S

    fam, n = case.split("/")
    Xtr, ytr, _, _ = binary_data(fam, int(n), 1)
    keep = S.FullyBayesianCVI
    study = _Study(settings, seeds)
    S.FullyBayesianCVI = lambda **kw: study
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            GPClassifier(random_state=0, hyperparameters="bayes").fit(Xtr, ytr)
    except _Stop:
        pass
    finally:
        S.FullyBayesianCVI = keep
    ref = next(r for r in study.runs if r["setting"] == "ref")
    rows = []
    for setting in settings:
        if setting == "ref":
            continue
        runs = [r for r in study.runs if r["setting"] == setting]
        err = [errors(r, ref) for r in runs]
        rows.append({"case": case, "D": len(ref["mean"]), "setting": setting, "steps": runs[0]["steps"],
                     "draws": runs[0]["draws"], "wall_s": statistics.median(r["wall_s"] for r in runs),
                     "load": [min(r["load"] for r in runs), max(r["load"] for r in runs)],
                     "evaluations": statistics.median(r["evaluations"] for r in runs),
                     "sweeps": statistics.median(r["sweeps"] for r in runs),
                     "mean_err_rms": math.sqrt(statistics.fmean(e[0] ** 2 for e in err)),
                     "mean_err_max": max(e[0] for e in err),
                     "logsd_err_rms": math.sqrt(statistics.fmean(e[1] ** 2 for e in err)),
                     "logsd_err_max": max(e[1] for e in err), "runs": runs})
    rows.append({"case": case, "setting": "ref", "runs": [ref], "wall_s": ref["wall_s"]})
    return rows


def report(rows: list[dict[str, Any]], cmd: str) -> str:
    lines = [header(f"The S&K engine of the fully Bayesian classifier: steps, draws, EP tolerance ({cmd})"),
             "Protocol in the docstring of `benchmarks/studies/bayes_steps.py` (tuning families only, one thread). "
             "Errors against the 800-step reference run from the same start, over the seeds: root mean square "
             "(largest).", "",
             "| case | D | setting | steps x draws | engine wall s [load] | EP evaluations | sweeps (per evaluation) "
             "| mean error (ref sd) | log sd error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["setting"] == "ref":
            continue
        lines.append(f"| {r['case']} | {r['D']} | {r['setting']} | {r['steps']} x {r['draws']} | {r['wall_s']:.2f} "
                     f"[{r['load'][0]:.1f}-{r['load'][1]:.1f}] | {r['evaluations']:.0f} | {r['sweeps']:.0f} "
                     f"({r['sweeps'] / max(r['evaluations'], 1):.2f}) | {r['mean_err_rms']:.3f} "
                     f"({r['mean_err_max']:.3f}) | {r['logsd_err_rms']:.3f} ({r['logsd_err_max']:.3f}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=["xor/100", "spirals/100", "checkerboard/200", "clf8/100"])
    p.add_argument("--settings", nargs="+", default=["ref", "default", "draws=2", "steps=50", "burn=20", "tol=3e-3"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--label", default="h59d")
    a = p.parse_args()
    for case in a.cases:
        if case.split("/")[0] not in SPLIT["tuning"]:
            raise SystemExit(f"{case}: only tuning families are studied here ({SPLIT['tuning']})")
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    for case in a.cases:
        rows += study_case(case, a.settings, a.seeds)
        write(f"bayes_steps_{a.label}", report(rows, " ".join(os.sys.argv[1:])), {"rows": rows})


if __name__ == "__main__":
    main()
