"""EP's starts in the fully Bayesian classifier's engine phase: the site bank's plane against its quadratic (issue 59,
item 3), on the tuning half only.

Per case (``--cases``: a tuning family of ``benchmarks/heldout_families.py`` at N training rows, the higher noise
level; ``clf8:c`` keeps clf8's first c inputs, for D = c + 1), ``GPClassifier(hyperparameters="bayes",
random_state=0)`` with :data:`gpvi.inference.cvi.ep_starts.QUADRATIC_MAX_DIM` set to 0 (the plane of issue 59's
bank, as before) and to its default, alternated in one process, one thread. For each fit: EP evaluations and sweeps,
the stage walls, q(theta)'s largest change of mean (in the first fit's sds) and of log sd, the test probabilities'
largest change. With ``--first-sweep``, also the relative site change of one undamped sweep from each start
(plane and quadratic, the same bank, every gradient evaluation of the default fit): the smaller it is, the sooner
EP meets its stopping rule (1e-3; one sweep where it is already below).

Run: ``OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python -m benchmarks.studies.bayes_bank --first-sweep``.
Results: ``benchmarks/studies/results/bayes_bank_<label>.{md,json}``.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from typing import Any

import numpy as np
import torch

from benchmarks.heldout_families import SPLIT, binary_data
from benchmarks.studies._common import header, write


def _change(t0: torch.Tensor, n0: torch.Tensor, t1: torch.Tensor, n1: torch.Tensor) -> torch.Tensor:
    """EP's stopping measure: the largest relative site change per row."""
    return torch.maximum(((t1 - t0).abs() / (1 + t0)).amax(-1), ((n1 - n0).abs() / (1 + n0.abs())).amax(-1))


def first_sweeps(store: list[dict[str, torch.Tensor]]) -> Any:
    """Patch ``EPEvidenceTarget._ep_from_bank`` to record, per gradient evaluation, one undamped sweep's change
    from the plane's start and from the quadratic's; returns the original (to restore)."""
    import gpvi.inference.cvi.ep_evidence as E
    import gpvi.inference.cvi.ep_starts as ES
    from gpvi.numerics.ep import expectation_propagation

    orig = E.EPEvidenceTarget._ep_from_bank

    def wrap(self: Any, K: torch.Tensor, theta: torch.Tensor, gradient: bool) -> Any:
        if gradient:
            out = {}
            keep = ES.QUADRATIC_MAX_DIM
            for name, qmax in (("plane", 0), ("quadratic", keep)):
                ES.QUADRATIC_MAX_DIM = qmax
                tau, nu = self.bank.starts(theta)
                r = expectation_propagation(K, self.model.y, self.model.likelihood, quadrature=self.quadrature,
                                            damping=1.0, tol=1e-12, max_sweeps=1, tau=tau, nu=nu, gradient=False)
                out[name] = _change(tau, nu, r.tau, r.nu)
            ES.QUADRATIC_MAX_DIM = keep
            store.append(out)
        return orig(self, K, theta, gradient)

    E.EPEvidenceTarget._ep_from_bank = wrap
    return orig


def fit(Xtr: np.ndarray, ytr: np.ndarray, Xte: np.ndarray, qmax: int) -> dict[str, Any]:
    import gpvi.inference.cvi.ep_starts as ES
    from gpvi import GPClassifier

    keep = ES.QUADRATIC_MAX_DIM
    ES.QUADRATIC_MAX_DIM = qmax
    try:
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        clf = GPClassifier(random_state=0, hyperparameters="bayes").fit(Xtr, ytr)
        wall = time.perf_counter() - t0
    finally:
        ES.QUADRATIC_MAX_DIM = keep
    info = clf.posterior_.info
    c = info["ep_counters"]
    return {"qmax": qmax, "wall_s": round(wall, 3), "load": round(load, 2), "ep_evaluations": c["evaluations"],
            "ep_sweeps": c["sweeps"], "stages": {k: round(float(info[k]), 3) for k in
                                                 ("map_time_s", "ep_map_time_s", "laplace_time_s", "q_time_s",
                                                  "predictive_time_s")},
            "mean": clf.posterior_.mean.tolist(), "std": clf.posterior_.std.tolist(),
            "p_test": np.asarray(clf.predict_proba(Xte))[:, 1].tolist()}


def run_case(case: str, first_sweep: bool) -> dict[str, Any]:
    import gpvi.inference.cvi.ep_evidence as E
    import gpvi.inference.cvi.ep_starts as ES

    fam, n = case.split("/")
    cols = None
    if ":" in fam:
        fam, c = fam.split(":")
        cols = int(c)
    if fam not in SPLIT["tuning"]:
        raise SystemExit(f"{fam} is not in the tuning half: this study decides on tuning families only")
    Xtr, ytr, Xte, _ = binary_data(fam, int(n), 1)
    if cols:
        Xtr, Xte = Xtr[:, :cols], Xte[:, :cols]
    fits = [fit(Xtr, ytr, Xte, 0)]
    store: list[dict[str, torch.Tensor]] = []
    orig = first_sweeps(store) if first_sweep else None
    try:
        fits.append(fit(Xtr, ytr, Xte, ES.QUADRATIC_MAX_DIM))
    finally:
        if orig is not None:
            E.EPEvidenceTarget._ep_from_bank = orig
    m0, s0, p0 = (np.asarray(fits[0][k]) for k in ("mean", "std", "p_test"))
    for f in fits:
        f["mean_change_sd"] = float(np.abs((np.asarray(f["mean"]) - m0) / s0).max())
        f["log_sd_change"] = float(np.abs(np.log(np.asarray(f["std"]) / s0)).max())
        f["p_change_max"] = float(np.abs(np.asarray(f["p_test"]) - p0).max())
        del f["p_test"]
    row: dict[str, Any] = {"case": case, "D": Xtr.shape[1] + 1, "fits": fits}
    if store:
        qs = [0.1, 0.25, 0.5, 0.75, 0.9]
        for name in ("plane", "quadratic"):
            c = torch.cat([r[name] for r in store]).numpy()
            row[f"first_sweep_{name}"] = {"quantiles": np.quantile(c, qs).tolist(),
                                          "below_tol": float((c <= 1e-3).mean())}
    return row


def report(rows: list[dict[str, Any]], label: str) -> str:
    lines = [header(f"EP's starts from the site bank: plane against quadratic ({label})"), "",
             "Protocol in the docstring of `benchmarks/studies/bayes_bank.py` (tuning families only, one thread; "
             "QUADRATIC_MAX_DIM 0 = the plane, as before). Walls are indicative (shared machine; with "
             "`--first-sweep` the quadratic fit's walls include the extra sweeps it measures); the counts and "
             "the changes of q are the comparison.", "",
             "| case | D | start | wall s [load] | MAP-II / EP MAP / Laplace / q / predictive (s) | EP evaluations | "
             "sweeps per evaluation | q mean change (sd) / log sd | test p change (max) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for f in r["fits"]:
            st = " / ".join(f"{v:.2f}" for v in f["stages"].values())
            lines.append(f"| {r['case']} | {r['D']} | {'plane' if f['qmax'] == 0 else 'quadratic'} | "
                         f"{f['wall_s']:.2f} [{f['load']:.1f}] | {st} | {f['ep_evaluations']} | "
                         f"{f['ep_sweeps'] / f['ep_evaluations']:.3f} | {f['mean_change_sd']:.4f} / "
                         f"{f['log_sd_change']:.4f} | {f['p_change_max']:.1e} |")
    if any("first_sweep_plane" in r for r in rows):
        lines += ["", "One undamped sweep from each start, every gradient evaluation of the quadratic fit: quantiles "
                  "(10/25/50/75/90%) of the largest relative site change, and the share at or below EP's 1e-3:", "",
                  "| case | plane | below 1e-3 | quadratic | below 1e-3 |", "|---|---|---|---|---|"]
        for r in rows:
            if "first_sweep_plane" in r:
                a, b = r["first_sweep_plane"], r["first_sweep_quadratic"]
                qa = " / ".join(f"{x:.1e}" for x in a["quantiles"])
                qb = " / ".join(f"{x:.1e}" for x in b["quantiles"])
                lines.append(f"| {r['case']} | {qa} | {a['below_tol']:.3f} | {qb} | {b['below_tol']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=["xor/100", "xor/400", "spirals/200", "checkerboard/200",
                                                    "checkerboard/400", "clf8:3/200", "clf8:4/200", "clf8/100"])
    ap.add_argument("--first-sweep", action="store_true")
    ap.add_argument("--label", default="h59c")
    a = ap.parse_args()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from gpvi import GPClassifier
        X, y, _, _ = binary_data("xor", 40, 0)
        GPClassifier(random_state=0, hyperparameters="bayes").fit(X, y)       # warm-up, untimed
        rows: list[dict[str, Any]] = []
        for case in a.cases:
            rows.append(run_case(case, a.first_sweep))
            print(case, [(f["qmax"], f["wall_s"], round(f["ep_sweeps"] / f["ep_evaluations"], 3),
                          round(f["mean_change_sd"], 4)) for f in rows[-1]["fits"]], flush=True)
            write(f"bayes_bank_{a.label}", report(rows, a.label), {"rows": rows})


if __name__ == "__main__":
    main()
