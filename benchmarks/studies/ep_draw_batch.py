"""Binary EP over the S&K step's draws: one theta at a time or batched (issue 59, item 3). Tuning families only.

The question: would evaluating the thetas of one Salimans-Knowles step together (one EP run over the S draws with
(S, N, N) kernel matrices, batched factorisations, each row stopping at its own tolerance and starting from its own
bank-predicted sites) cut the q stage of ``GPClassifier(hyperparameters="bayes")`` against running them one after
another?

What the code does already (read before measuring): the engine's step evaluates its draws in one call,
``draw_statistics`` -> ``log_joint_and_grad`` -> ``EPEvidenceTarget.bound_and_grad(theta (S, D))``: one kernel
evaluation for the S rows, ``SiteBank.starts`` for the S rows, and ``expectation_propagation`` on (S, N, N), which
masks converged rows (``active & good``) and factorises the remaining rows of each sweep in one batched Cholesky and
``cholesky_inverse``. Only the chunk rule (:data:`~gpvi.inference.cvi.ep_evidence.EP_CHUNK_ELEMENTS`, 16 rows at most)
splits the step: at N = 400 into two calls of 2 rows, at N = 100 / 200 not at all. So this study measures what that
batching is worth, and what is left to gain beyond it.

Protocol: one ``GPClassifier(random_state=0, hyperparameters="bayes")`` fit per case (``--cases``, tuning half of
``benchmarks/heldout_families.py`` only, the higher noise level), one thread, after a warm-up fit. During the fit
every ``EPEvidenceTarget.bound_and_grad`` call made inside ``SKGaussian.step`` is recorded: its thetas, the sites the
bank predicted for them, EP's settings, and its wall in the fit. After the fit each recorded call is replayed on the
fit's own target with those starts (a stub bank returns the recorded predictions), in rotating order, ``--repeats``
times (the least wall of each call and mode is summed):

* ``batched``: the call as the fit made it (today's path, the chunk rule included);
* ``whole``: the same with the chunk rule off (all S rows in one EP call);
* ``single``: one ``bound_and_grad`` per theta (one kernel evaluation, one bank start, one EP run each): the
  one-theta-at-a-time path;
* the floor of the linear algebra: per call, for each sweep k, forming B, its Cholesky factor and ``cholesky_inverse``
  on the rows still running at sweep k (the rows' sweeps as ``single`` ran them), as one batch (``LA batched``) or row
  by row (``LA single``); timed once per N and row count (best of 30), summed over the calls.

Every replayed row is compared with the ``batched`` replay: the evidence, the gradient in theta, the final sites
(max absolute difference), and the sweeps; ``batched`` is compared with the fit's own values (the replay reproduces
the fit).

Run: ``OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -m benchmarks.studies.ep_draw_batch --label h59f``; writes
``benchmarks/studies/results/ep_draw_batch_<label>.{md,json}``.

Results (``h59f``: xor N = 100 / 200 / 400, spirals N = 200, checkerboard N = 400, clf8 N = 100 / 400; 2 repeats,
load 1.7-2.0). The step's draws are already evaluated together (4 rows per call in every case): one theta at a time
would cost 91 / 57 / 3 / 46 / 6 / 63 / 4 % of the q stage more (1.10 against 0.49 s at xor N = 100; 3.57 against
3.45 s at N = 400, where the batched Cholesky is no cheaper per row: 8.7 against 9.0 ms for 4 rows). Dropping the
chunk rule (all 4 rows in one EP call at N = 400) saved 0.7-2.5 % of q there, inside the replays' noise (whole and
batched are the same code at N = 100 / 200 and differed by 0.5-4.2 %): the bound for any further batching of the
step's EP is well under 15 %, so none was built. Every row equal to the one-at-a-time run to 5e-12 in log Z and 3e-11
in the gradient (clf8 N = 400: 1e-9 / 4e-8), the final sites to 4e-11, each row's sweeps the same. What is left of
the q stage beyond the factorisations ((batched - LA batched) / q, 47-67 %) is not batching: the tilted moments
(7-16 % of q under cProfile), the kernel's forward and backward passes (6-15 %), forming B and the sweep's other
products, Python per sweep; and outside the replayed calls the bank's predictions (the fit's wall in the calls less
the replay's with the stub bank: 0.9 s of clf8 N = 100's 3.0 s q, where D = 9 fits a quadratic through 110 entries;
0.56 s in ``SiteBank.starts`` under cProfile in ``bayes_profile_h59e``).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import time
import warnings
from typing import Any

import torch

from benchmarks.heldout_families import SPLIT, binary_data
from benchmarks.studies._common import header, write

MODES = ("batched", "whole", "single")

PROFILED = {"EP call": "ep.py:expectation_propagation", "marginals": "ep.py:_marginals",
            "Cholesky": "linalg.py:cholesky_plain", "cholesky_inverse": "cholesky_inverse",
            "tilted moments": "ep.py:_tilted", "Anderson": "anderson.py:step", "kernel forward": "bound.py:_kernel",
            "kernel backward": "autograd/__init__.py:grad"}
"""The functions whose cumulative wall the profiled batched replay reports (matched on ``file:function``)."""


@contextlib.contextmanager
def recording() -> Any:
    """Record every ``bound_and_grad`` call made inside an S&K step: thetas, bank starts, settings, wall, values."""
    from gpvi.inference.cvi.ep_evidence import EPEvidenceTarget
    from gpvi.inference.cvi.ep_starts import SiteBank
    from gpvi.inference.salimans_knowles.engine import SKGaussian

    recs: list[dict[str, Any]] = []
    state: dict[str, Any] = {"in_step": False, "cur": None}
    orig = (SKGaussian.step, EPEvidenceTarget.bound_and_grad, SiteBank.starts)

    def step(self: Any, *a: Any, **k: Any) -> Any:
        state["in_step"] = True
        try:
            return orig[0](self, *a, **k)
        finally:
            state["in_step"] = False

    def bag(self: Any, theta: torch.Tensor) -> Any:
        if not state["in_step"]:
            return orig[1](self, theta)
        cur = {"theta": theta.detach().clone(), "tol": self.tol, "value_tol": self.value_tol, "starts": None,
               "target": self}
        state["cur"] = cur
        t0 = time.perf_counter()
        out = orig[1](self, theta)
        cur["fit_s"] = time.perf_counter() - t0
        state["cur"] = None
        cur["vals"], cur["grads"] = out[0].clone(), out[1].clone()
        recs.append(cur)
        return out

    def starts(self: Any, theta: torch.Tensor) -> Any:
        out = orig[2](self, theta)
        if state["cur"] is not None:
            state["cur"]["starts"] = (theta.detach().clone(), out[0].clone(), out[1].clone())
        return out

    SKGaussian.step, EPEvidenceTarget.bound_and_grad, SiteBank.starts = step, bag, starts
    try:
        yield recs
    finally:
        SKGaussian.step, EPEvidenceTarget.bound_and_grad, SiteBank.starts = orig


class StubBank:
    """Returns the recorded bank predictions for the recorded thetas (matched row by row) and keeps what EP adds."""

    def __init__(self, theta: torch.Tensor, tau: torch.Tensor, nu: torch.Tensor) -> None:
        self.theta, self.tau, self.nu = theta, tau, nu
        self.added: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def __len__(self) -> int:
        return 1

    def _rows(self, theta: torch.Tensor) -> torch.Tensor:
        eq = (theta.unsqueeze(1) == self.theta.unsqueeze(0)).all(-1)
        assert bool(eq.any(-1).all()), "a replayed theta was not recorded"
        return eq.float().argmax(-1)

    def starts(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = self._rows(theta)
        return self.tau[r].clone(), self.nu[r].clone()

    def add(self, theta: torch.Tensor, tau: torch.Tensor, nu: torch.Tensor, keep: torch.Tensor) -> None:
        self.added.append((theta.clone(), tau.clone(), nu.clone()))


def replay(rec: dict[str, Any], mode: str) -> dict[str, Any]:
    """One recorded call in ``mode``: wall, values, gradients, final sites and sweeps per row."""
    from gpvi.inference.cvi import ep_evidence

    target = rec["target"]
    th, tau0, nu0 = rec["starts"]
    target.tol, target.value_tol = rec["tol"], rec["value_tol"]
    bank = StubBank(th, tau0, nu0)
    target.bank = bank
    theta = rec["theta"]
    chunk = ep_evidence.EP_CHUNK_ELEMENTS
    sweeps: list[int] = []

    def run(K: torch.Tensor, gradient: bool = True, theta: torch.Tensor | None = None) -> Any:
        res = type(target)._run(target, K, gradient, theta)
        sweeps.extend(int(v) for v in res.sweeps)
        return res

    target._run = run                     # each row's sweeps, in the order of the call's thetas
    try:
        if mode == "whole":
            ep_evidence.EP_CHUNK_ELEMENTS = 1 << 40
        t0 = time.perf_counter()
        if mode == "single":
            outs = []
            for i in range(theta.shape[0]):
                outs.append(target.bound_and_grad(theta[i:i + 1]))
            wall = time.perf_counter() - t0
            vals = torch.cat([o[0] for o in outs])
            grads = torch.cat([o[1] for o in outs])
        else:
            vals, grads = target.bound_and_grad(theta)
            wall = time.perf_counter() - t0
    finally:
        ep_evidence.EP_CHUNK_ELEMENTS = chunk
        target.bank = None
        del target._run
    tau = torch.cat([a[1] for a in bank.added])
    nu = torch.cat([a[2] for a in bank.added])
    order = bank._rows(torch.cat([a[0] for a in bank.added]))
    tau_o, nu_o = torch.empty_like(tau), torch.empty_like(nu)
    tau_o[order], nu_o[order] = tau, nu
    return {"wall": wall, "vals": vals, "grads": grads, "tau": tau_o, "nu": nu_o, "sweeps": sweeps}


def la_time(N: int, rows: int, K: torch.Tensor, tau: torch.Tensor, repeats: int = 30) -> tuple[float, float]:
    """Best wall of forming B, its Cholesky factor and cholesky_inverse for ``rows`` rows: (one batch, row by row)."""
    from gpvi.linalg import cholesky_plain

    Kb, tb = K[:1].expand(rows, N, N).contiguous(), tau[:1].expand(rows, N).contiguous()

    def one(Kx: torch.Tensor, tx: torch.Tensor) -> None:
        sW = tx.sqrt()
        B = (Kx * sW.unsqueeze(-1)).mul_(sW.unsqueeze(-2))
        B.diagonal(dim1=-2, dim2=-1).add_(1.0)
        LB, _ = cholesky_plain(B)
        torch.cholesky_inverse(LB)

    def best(f: Any) -> float:
        f()
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    batched = best(lambda: one(Kb, tb))
    single = best(lambda: [one(Kb[i:i + 1], tb[i:i + 1]) for i in range(rows)])
    return batched, single


def case(name: str, repeats: int) -> dict[str, Any]:
    from gpvi import GPClassifier

    fam, n = name.split("/")
    if fam not in SPLIT["tuning"]:
        raise SystemExit(f"{fam} is not in the tuning half: this study runs tuning families only")
    Xtr, ytr, _, _ = binary_data(fam, int(n), 1)
    load0 = os.getloadavg()[0]
    with warnings.catch_warnings(), recording() as recs:
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        clf = GPClassifier(random_state=0, hyperparameters="bayes").fit(Xtr, ytr)
        wall = time.perf_counter() - t0
    info = clf.posterior_.info
    recs = [r for r in recs if r["starts"] is not None]           # the first step starts from the warm sites
    tot = {m: [float("inf")] * len(recs) for m in MODES}
    ref: list[dict[str, Any]] = [{} for _ in recs]
    diffs = {m: {"log_z": 0.0, "grad": 0.0, "sites": 0.0, "sweeps_differ": 0} for m in MODES}
    diffs["fit"] = {"log_z": 0.0, "grad": 0.0}
    single_sweeps: list[list[int]] = [[] for _ in recs]
    load1 = os.getloadavg()[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for rep in range(repeats):
            for j, rec in enumerate(recs):
                for k in range(len(MODES)):
                    mode = MODES[(j + k + rep) % len(MODES)]
                    out = replay(rec, mode)
                    tot[mode][j] = min(tot[mode][j], out["wall"])
                    if rep:
                        continue
                    if mode == "batched":
                        ref[j]["batched"] = out
                    else:
                        ref[j][mode] = out
                    if mode == "single":
                        single_sweeps[j] = out["sweeps"]
            if rep == 0:
                for j, rec in enumerate(recs):
                    b = ref[j]["batched"]
                    diffs["fit"]["log_z"] = max(diffs["fit"]["log_z"], float((b["vals"] - rec["vals"]).abs().max()))
                    diffs["fit"]["grad"] = max(diffs["fit"]["grad"], float((b["grads"] - rec["grads"]).abs().max()))
                    for m in ("whole", "single"):
                        o = ref[j][m]
                        d = diffs[m]
                        d["log_z"] = max(d["log_z"], float((o["vals"] - b["vals"]).abs().max()))
                        d["grad"] = max(d["grad"], float((o["grads"] - b["grads"]).abs().max()))
                        d["sites"] = max(d["sites"], float((o["tau"] - b["tau"]).abs().max()),
                                         float((o["nu"] - b["nu"]).abs().max()))
                        d["sweeps_differ"] += sum(x != y for x, y in zip(o["sweeps"], b["sweeps"]))
                ref = [{} for _ in recs]
    load2 = os.getloadavg()[0]
    # where the batched replay's time goes: one more pass under cProfile (its overhead included)
    pr = cProfile.Profile()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pr.enable()
        for rec in recs:
            replay(rec, "batched")
        pr.disable()
    prof = {}
    for (path, _, fn), (_, ncalls, _, ct, _) in pstats.Stats(pr).stats.items():
        where = f"{'/'.join(path.split('/')[-2:])}:{fn}"
        for label, key in PROFILED.items():
            if key in where and (label not in prof or ct > prof[label]):
                prof[label] = round(ct, 3)
    prof["all"] = round(sum(v for (p_, _, f), (_, _, _, v, _) in pstats.Stats(pr).stats.items()
                            if f.endswith("bound_and_grad")), 3)
    # the floor of the linear algebra, for the sweep schedules the rows ran
    N = int(n)
    target = recs[0]["target"]
    K = target.bound._kernel(recs[0]["theta"][:1]).detach()
    tau = recs[0]["starts"][1][:1]
    la = {s: la_time(N, s, K, tau) for s in range(1, max(r["theta"].shape[0] for r in recs) + 1)}
    la_b = la_s = 0.0
    for sw in single_sweeps:
        for k in range(1, max(sw) + 1):
            active = sum(1 for s in sw if s >= k)
            la_b += la[active][0]
            la_s += la[active][1]
    evals = sum(r["theta"].shape[0] for r in recs)
    sweeps = sum(sum(s) for s in single_sweeps)
    return {"case": name, "N": N, "D": int(recs[0]["theta"].shape[1]), "wall_s": round(wall, 3),
            "q_s": round(float(info["q_time_s"]), 3), "calls": len(recs),
            "rows_per_call": round(evals / len(recs), 2), "evaluations": evals,
            "sweeps_per_evaluation": round(sweeps / evals, 2), "fit_in_calls_s": round(sum(r["fit_s"] for r in recs), 3),
            "replay_s": {m: round(sum(tot[m]), 3) for m in MODES}, "la_batched_s": round(la_b, 3),
            "la_single_s": round(la_s, 3), "la_ms": {s: [round(1e3 * v, 3) for v in la[s]] for s in la},
            "diffs": diffs, "profile": prof, "load": [round(load0, 2), round(load1, 2), round(load2, 2)]}


def report(rows: list[dict[str, Any]], label: str) -> str:
    lines = [header(f"Binary EP over the S&K step's draws: batched or one theta at a time ({label})"), "",
             "Protocol in the docstring of `benchmarks/studies/ep_draw_batch.py` (tuning families only, one fit each, "
             "one thread; replays: least wall of each call over the repeats, summed). Seconds; q: the fit's q stage; "
             "'in fit': the recorded calls' wall inside the fit; batched = today's path (chunks of at most "
             "EP_CHUNK_ELEMENTS entries), whole = all rows of the step in one EP call, single = one theta per call; "
             "LA = forming B, Cholesky and cholesky_inverse per sweep for the rows still running.", "",
             "| case | N | D | q s | calls (rows each) | sweeps / evaluation | in fit | batched | whole | single | "
             "LA batched | LA single | (single - batched) / q | (batched - LA batched) / q | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rp, q = r["replay_s"], r["q_s"]
        lines.append(f"| {r['case']} | {r['N']} | {r['D']} | {q} | {r['calls']} ({r['rows_per_call']}) | "
                     f"{r['sweeps_per_evaluation']} | {r['fit_in_calls_s']} | {rp['batched']} | {rp['whole']} | "
                     f"{rp['single']} | {r['la_batched_s']} | {r['la_single_s']} | "
                     f"{(rp['single'] - rp['batched']) / q:.0%} | {(rp['batched'] - r['la_batched_s']) / q:.0%} | "
                     f"{'-'.join(str(x) for x in r['load'])} |")
    lines += ["", "Largest absolute differences against the batched replay (evidence, gradient in theta, final "
              "sites; rows whose sweeps differ) and the batched replay against the fit's own values:", "",
              "| case | fit: log Z / grad | whole: log Z / grad / sites / rows | single: log Z / grad / sites / rows |",
              "|---|---|---|---|"]
    for r in rows:
        d = r["diffs"]
        lines.append(f"| {r['case']} | {d['fit']['log_z']:.1e} / {d['fit']['grad']:.1e} | "
                     + " | ".join(f"{d[m]['log_z']:.1e} / {d[m]['grad']:.1e} / {d[m]['sites']:.1e} / "
                                  f"{d[m]['sweeps_differ']}"
                                  for m in ("whole", "single")) + " |")
    lines += ["", "One more batched replay pass under cProfile (cumulative s, its overhead included; 'all': "
              "bound_and_grad):", "", "| case | all | " + " | ".join(PROFILED) + " |",
              "|---|---|" + "---|" * len(PROFILED)]
    for r in rows:
        pf = r["profile"]
        lines.append(f"| {r['case']} | {pf.get('all', '-')} | " + " | ".join(str(pf.get(k, "-")) for k in PROFILED)
                     + " |")
    lines += ["", "Linear algebra of one sweep (ms, best of 30): rows as one batch / row by row:", "",
              "| N | " + " | ".join(f"{s} rows" for s in rows[0]["la_ms"]) + " |",
              "|---|" + "---|" * len(rows[0]["la_ms"])]
    seen = set()
    for r in rows:
        if r["N"] in seen:
            continue
        seen.add(r["N"])
        lines.append(f"| {r['N']} | " + " | ".join(f"{v[0]} / {v[1]}" for v in r["la_ms"].values()) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["xor/100", "xor/200", "xor/400", "clf8/100", "clf8/400"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--label", default="h59f")
    a = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from gpvi import GPClassifier
    X, y, _, _ = binary_data("xor", 40, 0)
    GPClassifier(random_state=0, hyperparameters="bayes").fit(X, y)
    rows = []
    for c in a.cases:
        rows.append(case(c, a.repeats))
        print({k: v for k, v in rows[-1].items() if k != "la_ms"}, flush=True)
    write(f"ep_draw_batch_{a.label}", report(rows, a.label), {"rows": rows})


if __name__ == "__main__":
    main()
