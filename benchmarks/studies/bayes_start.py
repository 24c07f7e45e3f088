"""Where the fully Bayesian binary classifier's EP MAP search starts (issue 59, item 3): from the CVI MAP-II point
(today) or directly from the model's start, without the CVI MAP-II stage; on the tuning half only.

:class:`gpvi.inference.cvi.bayes.FullyBayesianCVI` (binary, EP evidence) runs (1) MAP-II on the CVI bound
(:class:`~gpvi.inference.cvi.typeii.TypeII`, about one type-II fit), (2) the anchor of the CVI bound (MAP-II's sites
converged to 1e-12 at the MAP-II point; the start of every later CVI run: the predictive's), (3) the EP MAP search
(L-BFGS-B on :math:`\\log Z_{EP} + \\log p(\\theta)`, EP at 1e-6, every evaluation started from EP's sites at the
MAP-II point), (4) the Laplace scale at the EP MAP point, (5) S&K from there, (6) the predictive. Settings
(``--settings``), alternated within each repeat in one process, one thread, through ``GPClassifier`` (the model the
classifier builds, ``random_state`` the fit's seed):

* ``type2``: ``GPClassifier()`` (the wall the 10x target is measured against);
* ``default``: ``GPClassifier(hyperparameters="bayes")``, with the EP MAP search's own counts recorded;
* ``direct``: the same without stage (1): the EP MAP search starts at ``model.theta`` (the start of the type-II
  rule: data-scaled lengthscales, unit signal variance), EP's first evaluation from the prior's sites and every later
  one from the sites of the nearest earlier evaluation (:class:`~gpvi.inference.cvi.ep_starts.SiteBank` with one
  neighbour; a line search's points lie on a line, where the bank's plane is not determined), with the same
  L-BFGS-B tolerances; the CVI bound is then anchored at the EP MAP point, its CVI run started from EP's sites there
  (:math:`\\lambda_1 = \\tilde\\nu`, :math:`\\lambda_2 = -\\tilde\\tau / 2`). Stages (4)-(6) as today, from that point
  (EP's evaluations in S&K start from EP's sites at the EP MAP point as today);
* ``direct2``: ``direct`` with a coarse stage first: EP at 1e-3, L-BFGS-B at ``gtol`` 1e-2 and ``ftol`` 1e-6 (the
  type-II rule's coarse phase's), then the search above from its end;
* ``coarse``: the defaults with MAP-II cut to the type-II rule's coarse phase (:data:`gpvi.inference.cvi.typeii.COARSE`:
  inner runs at 1e-6, ``gtol`` 1e-2; the phase after it runs at the same settings from its end, where L-BFGS-B's rule
  holds at once, and ends the loop); the anchor, the EP MAP search and the rest as today from that point.

Per fit: wall and stages (``start``: MAP-II, or the direct EP MAP search; ``anchor + EP MAP`` is today's; then the
Laplace scale, q, predictive), the EP MAP search's evaluations, sweeps and L-BFGS-B iterations, the CVI inner steps
of the anchor, the EP MAP point and the Laplace sds. Against ``default`` at the same seed: the EP MAP point's change
and q's mean change in default q's sds, the largest |log| ratio of the Laplace sds and of q's sds, the largest change
of the test probabilities; and, as the scale of the Monte Carlo noise of the comparison, the same between
``default`` fits at seeds 0 and 1 (``--seeds``).

Run: ``OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.studies.bayes_start --label h59e``.
Results: ``benchmarks/studies/results/bayes_start_<label>.{md,json}``.

``h59e`` (2026-11-29, 2 cores, one thread, load 1.1-2.9; the 12 tuning cases clf8, xor, spirals, checkerboard at
N = 100 / 200 / 400, 3 alternated repeats, seeds 0 and 1): what the direct start would save is small to begin with.
Per fit, MAP-II took 3-11% of the wall and MAP-II + anchor + EP MAP + Laplace 8-18% (0.09-1.55 s); S&K's q took
63-86% and the predictive 6-25%. MAP-II: 9-18 evaluations / 20-83 inner CVI steps, then the EP MAP search from
its point 2-10 EP evaluations / 2-77 sweeps. The direct search from ``model.theta`` took 7-24 evaluations /
26-195 sweeps (``direct``, EP at 1e-6 throughout) or 8-34 / 19-144 (``direct2``, coarse stage first), the anchor
from EP's sites 6-14 inner steps against 5-7 from MAP-II's: the stages before S&K changed by -0.04 to +0.24 s
(``direct2``: -0.26 to +0.06 s), and the walls by direct / default 0.75-1.14 (median 1.02) and direct2 / default
0.75-1.09 (median 0.99), within the repeats' spread. Results held: the EP MAP point moved by at most 0.015 (direct) /
0.017 (direct2) of default q's sds, the Laplace sds by at most 0.009 / 0.029 in log, q's means by at most 0.0006 /
0.0022 sd and its sds by 0.0005 / 0.0027 in log, the test probabilities by at most 4.3e-4 / 8.1e-4 (the same fits
at seed 1 against seed 0: 0.008-0.34 sd, 1.3e-2-9.3e-2). Not adopted: no wall gain. At this load the ratio to
type-II was 9.7-35x on the tuning cases (type-II 0.06-0.73 s), so the 10x target is far from every lever of this
stage: removing MAP-II and the EP MAP search at no cost would save less than the 8-18% of the stages before S&K
(the Laplace scale stays).

``h59e_coarse`` (the same day, load 1.6-2.0, one fit per setting, seed 0): ``coarse`` cut MAP-II from 9-18
evaluations / 20-83 inner steps to 6-17 / 14-70 (the fine phases had taken 1-6 evaluations; the coarse phase is
most of the stage), and the EP MAP search from the coarse point took the same evaluations and sweeps as from the
MAP-II point on 11 of the 12 cases (checkerboard N = 100: 3 / 5 against 2 / 2). The EP MAP point moved by at most
0.0032 sd, q's means by 0.0034 sd, the test probabilities by 5.2e-4. The saving is at most 6 evaluations / 27 inner
CVI steps at N = 100 (clf8; a few hundredths of a second), below the walls' noise (the stages before S&K moved by
-0.29 to +0.42 s in single fits). Not adopted either.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
import warnings
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from benchmarks.heldout_families import SPLIT, binary_data, half_of
from benchmarks.studies._common import header, write
from gpvi.inference.cvi import bayes as B
from gpvi.inference.cvi.bayes import EP_MAP_FTOL, EP_MAP_GTOL, FullyBayesianCVI
from gpvi.inference.cvi.bound import CVIBoundTarget
from gpvi.inference.cvi.ep_evidence import EPEvidenceTarget
from gpvi.inference.cvi.ep_starts import SiteBank
from gpvi.numerics.lbfgs import lbfgs_maximise

F64 = torch.float64
COARSE_EP_TOL, COARSE_GTOL, COARSE_FTOL = 1e-3, 1e-2, 1e-6
"""``direct2``'s coarse stage: EP's stopping rule, L-BFGS-B's ``gtol`` and ``ftol`` (those of TypeII's coarse
phase, :data:`gpvi.inference.cvi.typeii.COARSE`)."""


class _Recorded(FullyBayesianCVI):
    """:class:`FullyBayesianCVI` (its defaults) recording the EP MAP search's counts and the Laplace sds."""

    map2_class: Any = None

    def run(self, model: Any, init: Any = None) -> Any:
        self.record: dict[str, Any] = {}
        keep = B.laplace_scale_at

        def laplace(target: Any, theta: torch.Tensor, **kw: Any) -> Any:
            C, how = keep(target, theta, **kw)
            self.record["laplace_sd"] = None if C is None else (C @ C.mT).diagonal().sqrt().tolist()
            return C, how

        record = self.record

        class Counted(self.map2_class or B.TypeII):          # MAP-II's own counts (its result unchanged)
            def run(self, *a: Any, **k: Any) -> Any:
                post = super().run(*a, **k)
                record["map2"] = {c: post.info.get(c) for c in ("theta_phases", "theta_evaluations", "inner_steps")}
                return post

        keep_t2, B.laplace_scale_at, B.TypeII = B.TypeII, laplace, Counted
        try:
            post = super().run(model, init)
        finally:
            B.laplace_scale_at, B.TypeII = keep, keep_t2
        post.info["study"] = self.record
        return post

    def _ep_start(self, bound: Any, theta_map: torch.Tensor, tol: float) -> Any:
        target, theta, info = super()._ep_start(bound, theta_map, tol)
        if "search" not in self.record:
            self.record["search"] = {"evaluations": target.counters["evaluations"],
                                     "sweeps": target.counters["sweeps"]}
        return target, theta, info


class _Direct(_Recorded):
    """The defaults without the CVI MAP-II stage (module docstring, ``direct``; ``direct2``: with a coarse stage)."""

    coarse_stage = False

    def run(self, model: Any, init: Any = None) -> Any:
        self._direct = None
        if init is not None or B._is_multiclass(model) or self.evidence == "cvi":
            return super().run(model, init)
        cvi, _ = self._setup(model)
        t0 = time.perf_counter()
        target = EPEvidenceTarget(CVIBoundTarget(model, self.prior, cvi=cvi), tol=min(self._ep_tol(model), 1e-6))
        theta0 = model.theta.detach().clone().to(F64)
        target.warm_from(theta0)                 # the first evaluation's start: EP from the prior's sites at theta0
        target.bank = SiteBank(64, neighbours=2 ** 62)      # then the nearest earlier evaluation's sites
        iterations = 0
        if self.coarse_stage:                    # EP at COARSE_EP_TOL and L-BFGS-B at COARSE_GTOL first
            tol, target.tol = target.tol, COARSE_EP_TOL
            fit = lbfgs_maximise(target.log_joint, theta0, bounds=(-25.0, 25.0), gtol=COARSE_GTOL,
                                 ftol=COARSE_FTOL, device=target.device)
            theta0 = torch.as_tensor(fit.x, dtype=F64, device=target.device)
            target.tol, iterations = tol, fit.iterations
        fit = lbfgs_maximise(target.log_joint, theta0, bounds=(-25.0, 25.0), gtol=EP_MAP_GTOL, ftol=EP_MAP_FTOL,
                             device=target.device)
        theta = torch.as_tensor(fit.x, dtype=F64, device=target.device)
        tau, nu = target.bank.starts(theta.unsqueeze(0))
        search = {"evaluations": target.counters["evaluations"], "sweeps": target.counters["sweeps"],
                  "iterations": iterations + fit.iterations, "time_s": time.perf_counter() - t0}
        self._direct = (theta, search)
        start = SimpleNamespace(theta=theta, lam1=nu[0].clone(), lam2=-0.5 * tau[0].clamp_min(1e-8), info={})
        post = super().run(model, init=start)
        post.info["study"]["direct"] = search
        return post

    def _ep_start(self, bound: Any, theta_map: torch.Tensor, tol: float) -> Any:
        if self._direct is None:
            return super()._ep_start(bound, theta_map, tol)
        theta, search = self._direct
        target = EPEvidenceTarget(bound, tol=tol)
        target.warm_from(theta)
        self.record["search"] = search
        return target, theta, {"ep_map_theta": theta.tolist(), "ep_map_objective": float(target.log_joint(theta)),
                               "ep_map_time_s": search["time_s"]}


class _CoarseTypeII(B.TypeII):
    """TypeII whose every phase runs at the coarse phase's settings: the phase after the coarse one starts at its
    end and stops at once (L-BFGS-B's own rule met there), which ends the loop."""

    def phase(self, *a: Any, coarse: bool = False, **k: Any) -> Any:
        return super().phase(*a, coarse=True, **k)


class _Coarse(_Recorded):
    """``coarse``: the defaults with MAP-II cut to its coarse phase (module docstring)."""

    map2_class = _CoarseTypeII


class _Direct2(_Direct):
    """``direct2``: :class:`_Direct` with a coarse stage first (module docstring)."""

    coarse_stage = True


@contextlib.contextmanager
def bayes_as(cls: type) -> Any:
    """``GPClassifier(hyperparameters="bayes")`` fitting with ``cls`` instead of :class:`FullyBayesianCVI`."""
    import gpvi.sklearn as S

    keep = S.FullyBayesianCVI
    S.FullyBayesianCVI = cls
    try:
        yield
    finally:
        S.FullyBayesianCVI = keep


def fit(Xtr: np.ndarray, ytr: np.ndarray, Xte: np.ndarray, setting: str, seed: int) -> dict[str, Any]:
    from gpvi import GPClassifier

    kw = {} if setting == "type2" else {"hyperparameters": "bayes"}
    cls = {"default": _Recorded, "direct": _Direct, "direct2": _Direct2, "coarse": _Coarse}.get(setting,
                                                                                                 FullyBayesianCVI)
    load = os.getloadavg()[0]
    with bayes_as(cls), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        clf = GPClassifier(random_state=seed, **kw).fit(Xtr, ytr)
        wall = time.perf_counter() - t0
    out = {"setting": setting, "seed": seed, "wall_s": wall, "load": load,
           "p": np.asarray(clf.predict_proba(Xte))[:, 1]}
    if setting == "type2":
        return out
    info = clf.posterior_.info
    st = info["study"]
    direct = st.get("direct")
    out.update(start_s=direct["time_s"] if direct else info["map_time_s"],
               anchor_ep_map_s=info["laplace_time_s"],
               ep_map_s=info["ep_map_time_s"], q_s=info["q_time_s"], predictive_s=info["predictive_time_s"],
               search=st["search"], map2=st.get("map2"), anchor_inner_steps=info["inner_steps"],
               laplace_sd=st.get("laplace_sd"),
               ep_map_theta=info["ep_map_theta"], engine=info["engine"], retry=info.get("engine_retry"),
               ep_evaluations=info["ep_counters"]["evaluations"], ep_sweeps=info["ep_counters"]["sweeps"],
               predictive_inner_steps=info["predictive_inner_steps"],
               mean=clf.posterior_.mean.tolist(), std=clf.posterior_.std.tolist())
    return out


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """``a`` against ``b`` (b's q sds as the unit)."""
    sd = np.asarray(b["std"])
    out = {"ep_map_change_sd": float(np.abs((np.subtract(a["ep_map_theta"], b["ep_map_theta"])) / sd).max()),
           "q_mean_change_sd": float(np.abs(np.subtract(a["mean"], b["mean"]) / sd).max()),
           "q_log_sd": float(np.abs(np.log(np.divide(a["std"], b["std"]))).max()),
           "p_change": float(np.abs(a["p"] - b["p"]).max())}
    if a.get("laplace_sd") and b.get("laplace_sd"):
        out["laplace_log_sd"] = float(np.abs(np.log(np.divide(a["laplace_sd"], b["laplace_sd"]))).max())
    return out


def run_case(case: str, settings: list[str], repeats: int, seeds: list[int]) -> dict[str, Any]:
    fam, n = case.split("/")
    Xtr, ytr, Xte, _ = binary_data(fam, int(n), 1)
    fits: list[dict[str, Any]] = []
    for rep in range(repeats):
        for seed in seeds if rep == 0 else seeds[:1]:
            for s in settings if seed == seeds[0] else [s for s in settings if s != "type2"]:
                f = fit(Xtr, ytr, Xte, s, seed)
                f["repeat"] = rep
                fits.append(f)
                print(f"{case} rep {rep} seed {seed} {s}: {f['wall_s']:.2f} s (load {f['load']:.1f})", flush=True)
    by = {(f["setting"], f["seed"]): f for f in fits if f["repeat"] == 0}
    med = {s: statistics.median(f["wall_s"] for f in fits if f["setting"] == s and f["seed"] == seeds[0])
           for s in settings}
    stages = {s: {k: statistics.median(f[k] for f in fits if f["setting"] == s and f["seed"] == seeds[0])
                  for k in ("start_s", "anchor_ep_map_s", "q_s", "predictive_s")} for s in settings if s != "type2"}
    cmp = {f"{s} seed {seed}": compare(by[(s, seed)], by[("default", seed)])
           for s in settings if s not in ("type2", "default") for seed in seeds}
    if len(seeds) > 1:
        cmp[f"default seed {seeds[1]} vs {seeds[0]}"] = compare(by[("default", seeds[1])], by[("default", seeds[0])])
    for f in fits:                     # the comparisons above use the test probabilities; the report keeps them out
        del f["p"]
    return {"case": case, "half": half_of(fam), "median_s": med, "stages": stages, "compare": cmp,
            "ratio": {s: med[s] / med["type2"] for s in settings if s != "type2"} if "type2" in med else {},
            "loads": [round(f["load"], 2) for f in fits], "fits": fits}


def report(rows: list[dict[str, Any]], label: str, cmd: str) -> str:
    lines = [header(f"Where the fully Bayesian classifier's EP MAP search starts ({label})"), "",
             "Protocol in the docstring of `benchmarks/studies/bayes_start.py` (tuning families only, the higher "
             "noise level; settings alternated in one process, one thread; medians over the repeats at the first "
             "seed; load: the 1-min load average before each fit, min-max). Stages (s): start (MAP-II, or the "
             "direct EP MAP search) / anchor + EP MAP + Laplace (`laplace_time_s`; the direct search is in the "
             "start) / q / predictive. Search: EP evaluations / sweeps (L-BFGS-B iterations) of the EP MAP search "
             "(MAP-II: its evaluations / inner CVI steps); "
             "anchor: the CVI bound's inner steps before the predictive (anchor, MAP objective).", "", f"`{cmd}`", "",
             "| case | setting | wall s (ratio to type-II) | stages s | search | anchor inner steps | EP evaluations / "
             "sweeps in all | engine | load |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for s, m in r["median_s"].items():
            if s == "type2":
                lines.append(f"| {r['case']} | type2 | {m:.2f} | | | | | | {min(r['loads']):.1f}-"
                             f"{max(r['loads']):.1f} |")
                continue
            f = next(x for x in r["fits"] if x["setting"] == s)
            g = r["stages"][s]
            sr = f["search"]
            it = f" ({sr['iterations']})" if "iterations" in sr else ""
            m2 = f.get("map2")
            if m2:
                it += f"; MAP-II {m2['theta_evaluations']} / {m2['inner_steps']}"
            lines.append(f"| {r['case']} | {s} | {m:.2f} ({r['ratio'].get(s, float('nan')):.1f}) | "
                         f"{g['start_s']:.2f} / {g['anchor_ep_map_s']:.2f} / {g['q_s']:.2f} / {g['predictive_s']:.2f}"
                         f" | {sr['evaluations']} / {sr['sweeps']}{it} | {f['anchor_inner_steps']} | "
                         f"{f['ep_evaluations']} / {f['ep_sweeps']} | {f['engine']}{' + retry' if f['retry'] else ''}"
                         f" | |")
    lines += ["", "Against `default` at the same seed (units: default q's sds; Laplace and q sds: largest |log| ratio;"
              " p: largest change of a test probability); the `default` seed 1 vs seed 0 row is the Monte Carlo "
              "scale of such changes.", "",
              "| case | comparison | EP MAP point (sd) | Laplace log sd | q mean (sd) | q log sd | test p |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        for k, c in r["compare"].items():
            lap = c.get("laplace_log_sd", float("nan"))
            lines.append(f"| {r['case']} | {k} | {c['ep_map_change_sd']:.4f} | {lap:.4f}"
                         f" | {c['q_mean_change_sd']:.4f} | {c['q_log_sd']:.4f} | {c['p_change']:.1e} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    import sys

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=[f"{f}/{n}" for f in SPLIT["tuning"] for n in (100, 200, 400)])
    ap.add_argument("--settings", nargs="+", default=["type2", "default", "direct"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--label", default="h59e")
    a = ap.parse_args()
    if any(half_of(c.split("/")[0]) != "tuning" for c in a.cases):
        raise SystemExit("this study runs on the tuning half only")
    torch.set_num_threads(1)
    cmd = "python -m benchmarks.studies.bayes_start " + " ".join(sys.argv[1:])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Xw, yw, Xt, _ = binary_data("xor", 40, 0)
        for s in a.settings:
            fit(Xw, yw, Xt, s, 0)                                     # warm-up, untimed
    rows: list[dict[str, Any]] = []
    for case in a.cases:
        rows.append(run_case(case, a.settings, a.repeats, a.seeds))
        write(f"bayes_start_{a.label}", report(rows, a.label, cmd), {"args": vars(a), "rows": rows})
    print(report(rows, a.label, cmd))


if __name__ == "__main__":
    main()
