"""Where ``gpvi.NUTS``'s own time goes at N = 56, and what vectorising its trees over the chains could save (issue 57,
item 2: sampler overhead at most 20 % of the gradient cost).

``gpvi.NUTS`` advances its 4 chains together: each round, one batched call of the log joint answers every chain's
next request, and each chain's multinomial tree is NumPy code on vectors of length D
(:mod:`gpvi.inference.mcmc.kernel`). The sampler's own cost is what a round costs besides that call.

Sections (``--sections``, in this order by default):

* ``ops``: microseconds of the NumPy operations a tree is made of, on vectors of length 15 (boston-0's D): a dot
  product, an addition, a scalar times a vector, one ``_Tree`` (the kernel's node), one uniform draw, one leaf
  (``_Integrator.leaf``: a leapfrog step and its node, the log joint answered at once), one ``_merge`` of two nodes
  (the proposal draw and the no-U-turn checks);
* ``vector``: the same leaf and merge vectorised over 4 chains, as a batched kernel would compute them: the leaf's
  arithmetic on ``(4, D)`` arrays, and one merge level on ``(4, D)`` arrays with every result selected row by row
  with ``numpy.where`` (the rows of a level that merge are not the same from round to round), against 4 leaves or
  4 merges of the kernel;
* ``rounds``: ``gpvi.NUTS(num_chains=4, num_warmup=200, num_draws=300, seed=1)`` on boston-0 of the stress suite
  (N = 56, D = 15), the log joint timed around each call: with the model's closed form (the sampler's overhead: wall
  over the time inside the calls, minus 1) and with a Gaussian log joint that costs almost nothing (the sampler's
  own cost per round), 3 repeats each, alternated;
* ``profile``: the Gaussian run under ``cProfile``: the share of the sampler's own time (the profile's total less
  the log joint's) inside the kernel's leaves, inside its merges, and inside the batch's wrapper
  (``chains.Potential.__call__`` less the log joint); the rest is the trees' control flow (``build``,
  ``nuts_transition``), the chains' bookkeeping (``_sample``, ``_warmup``) and the round loop (``_run_group``).
  The profiler inflates Python's per-call costs, so these are shares, not times.

The NumPy kernel is measured even with numba installed (``nuts_compiled`` measures the compiled trees).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.nuts_round_cost``. Results:
``benchmarks/studies/results/nuts_round_cost.{md,json}``.
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from typing import Any

import numpy as np
import torch

from benchmarks.studies._common import header, write

D, C = 15, 4


def _us(fn: Any, number: int = 20000) -> float:
    """Median over 5 repeats of microseconds per call."""
    return statistics.median(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def _nodes(rng: np.random.Generator) -> tuple[Any, Any]:
    """Two kernel nodes whose merge passes every no-U-turn check (the common case: every check is computed)."""
    from gpvi.inference.mcmc.kernel import _Tree

    def node() -> Any:
        v = [rng.standard_normal(D) for _ in range(4)]
        rho = v[0] + 3.0
        return _Tree(v[1], rho.copy(), v[2], v[3], 0.1 * rho, v[2], rho.copy(), 0.9 * rho, rho, -0.3, v[1], -1.0, v[2])
    return node(), node()


def _kernel_leaf(integ: Any, z: np.ndarray, g: np.ndarray) -> Any:
    """One ``_Integrator.leaf`` from ``(z, r = g, g)``, its log joint answered at once: the leaf's node."""
    gen = integ.leaf(z, g, z, True)
    next(gen)
    try:
        gen.send((-1.0, g))
    except StopIteration as stop:
        return stop.value


def section_ops() -> list[dict[str, Any]]:
    from gpvi.inference.mcmc.kernel import Metric, Uniforms, _Integrator, _merge, _Tree

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(D), rng.standard_normal(D)
    old, new = _nodes(rng)
    u = Uniforms(torch.Generator().manual_seed(0))
    integ = _Integrator(0.1, Metric(np.ones(D)), 0.0)

    assert not _merge(old, new, True, False, u).turning
    ops = {"dot": lambda: a.dot(b), "add": lambda: a + b, "scalar x vector": lambda: 0.5 * a,
           "_Tree": lambda: _Tree(a, a, a, a, a, a, a, a, a, 0.0, a, 0.0, a, n=1, accept=0.5),
           "uniform draw": u.uniform, "leaf": lambda: _kernel_leaf(integ, a, b), "merge": lambda: _merge(old, new, True, False, u)}
    return [{"section": "ops", "op": k, "us": _us(f)} for k, f in ops.items()]


def _merge_rows(Old: dict[str, np.ndarray], New: dict[str, np.ndarray], take_u: np.ndarray, mask: np.ndarray,
                Cur: dict[str, np.ndarray]) -> None:
    """One merge level on all rows at once (forward direction), then the merged rows selected into ``Cur``."""
    hi, lo = np.maximum(Old["logw"], New["logw"]), np.minimum(Old["logw"], New["logw"])
    logw = hi + np.log1p(np.exp(lo - hi))
    take = take_u < np.exp(New["logw"] - logw)
    rho = Old["rho"] + New["rho"]
    seam1, seam2 = Old["rho"] + New["rl"], New["rho"] + Old["rr"]
    ok = ((np.vecdot(Old["psl"], rho) > 0) & (np.vecdot(New["psr"], rho) > 0) & (np.vecdot(Old["psl"], seam1) > 0)
          & (np.vecdot(New["psl"], seam1) > 0) & (np.vecdot(Old["psr"], seam2) > 0)
          & (np.vecdot(New["psr"], seam2) > 0))
    t2 = take[:, None]
    merged = {"rl": Old["rl"], "psl": Old["psl"], "rr": New["rr"], "psr": New["psr"], "rho": rho,
              "z": np.where(t2, New["z"], Old["z"]), "g": np.where(t2, New["g"], Old["g"]),
              "lp": np.where(take, New["lp"], Old["lp"]), "logw": logw, "turning": ~ok,
              "n": Old["n"] + New["n"], "accept": Old["accept"] + New["accept"]}
    m2 = mask[:, None]
    for k, v in merged.items():
        Cur[k] = np.where(m2 if v.ndim == 2 else mask, v, Cur[k])


def section_vector() -> list[dict[str, Any]]:
    from gpvi.inference.mcmc.kernel import Metric, Uniforms, _Integrator, _merge

    rng = np.random.default_rng(1)
    vec = {k: rng.standard_normal((C, D)) + 3.0 for k in ("rl", "psl", "rr", "psr", "rho", "z", "g")}
    sca = {"logw": -rng.random(C), "lp": -rng.random(C), "n": np.ones(C, dtype=np.int64), "accept": rng.random(C),
           "turning": np.zeros(C, dtype=bool)}
    Old, New = {**vec, **sca}, {k: v + 0.1 for k, v in {**vec, **sca}.items() if k != "turning"}
    New["n"], New["turning"] = Old["n"].copy(), Old["turning"].copy()
    Cur = {k: v.copy() for k, v in New.items()}
    u, mask = rng.random(C), np.array([True, False, True, True])
    Z, R, G, G1, inv = (rng.standard_normal((C, D)) for _ in range(5))
    eps, h0, lp1 = rng.random(C)[:, None], rng.random(C), -rng.random(C)

    def leaf_rows() -> Any:
        half = 0.5 * eps
        r = R + half * G
        z1 = Z + eps * (inv * r)
        r1 = r + half * G1
        ps = inv * r1
        h = -lp1 + 0.5 * np.vecdot(r1, ps)
        return z1, r1, ps, h - h0

    integ = _Integrator(0.1, Metric(np.ones(D)), 0.0)
    a, b = rng.standard_normal(D), rng.standard_normal(D)

    def leaves() -> None:
        for _ in range(C):
            _kernel_leaf(integ, a, b)

    old, new = _nodes(rng)
    uu = Uniforms(torch.Generator().manual_seed(0))

    def merges() -> None:
        for _ in range(C):
            _merge(old, new, True, False, uu)

    cases = {"leaf: 4 kernel leaves": leaves, "leaf: one (4, D) leapfrog step and energies": leaf_rows,
             "merge: 4 kernel merges": merges,
             "merge: one level on (4, D) arrays, rows selected": lambda: _merge_rows(Old, New, u, mask, Cur)}
    return [{"section": "vector", "op": k, "us": _us(f, 5000)} for k, f in cases.items()]


def _run(model: Any, fn: Any) -> dict[str, float]:
    """``small_data``'s timed NUTS run (4 chains x (200 + 300), seed 1) with ``fn`` as the model's closed form."""
    from benchmarks.small_data import run_gpvi_nuts

    model.closed_form.log_joint = fn                     # an instance attribute; run_gpvi_nuts deletes it at the end
    r = run_gpvi_nuts(model, 200, 300)
    ev, inside = r["evals"], r["logjoint_ms_per_grad"] * r["evals"] / 1000
    return {"wall_s": r["wall"], "inside_s": inside, "evaluations": ev, "overhead": r["overhead"],
            "own_us_per_round": (r["wall"] - inside) / ev * C * 1e6, "call_us_per_round": inside / ev * C * 1e6}


def _boston0() -> tuple[Any, Any]:
    """boston-0 of the stress suite, and a Gaussian log joint of its dimension that costs almost nothing."""
    from benchmarks.small_data import stress

    model = [p for p in stress()[0] if p["id"] == "boston-0"][0]["model"]
    mu = torch.ones(model.dim, dtype=torch.float64)

    def gaussian(theta: torch.Tensor, **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
        d = theta - mu
        return -0.5 * (d * d).sum(-1), -d
    return model, gaussian


def section_rounds() -> list[dict[str, Any]]:
    model, gaussian = _boston0()
    real = model.closed_form.log_joint
    _run(model, gaussian)                                    # warm caches and imports
    rows = []
    for rep in range(3):
        for name, fn in (("closed form", real), ("Gaussian (almost free)", gaussian)):
            rows.append({"section": "rounds", "log joint": name, "repeat": rep, **_run(model, fn)})
    return rows


def section_profile() -> list[dict[str, Any]]:
    import cProfile
    import pstats

    model, gaussian = _boston0()
    _run(model, gaussian)
    prof = cProfile.Profile()
    prof.runcall(_run, model, gaussian)
    st = pstats.Stats(prof).stats                       # (file, line, name) -> (cc, nc, tottime, cumtime, callers)
    cum = {}
    for (file, _, name), v in st.items():
        key = (file.rsplit("/", 1)[-1], name)
        cum[key] = cum.get(key, 0.0) + v[3]
    total = cum[("engine.py", "run")]                   # gpvi.NUTS.run (not the diagnostics computed after it)
    fake = cum[("nuts_round_cost.py", "gaussian")]
    own = total - fake
    parts = {"kernel leaves (_Integrator.leaf)": cum[("kernel.py", "leaf")],
             "kernel merges (_merge)": cum[("kernel.py", "_merge")],
             "batch wrapper (Potential.__call__ less the log joint)": cum[("chains.py", "__call__")] - fake}
    parts["the rest: tree control flow, chain bookkeeping, round loop"] = own - sum(parts.values())
    return [{"section": "profile", "part": k, "share": v / own} for k, v in parts.items()]


def report(rows: list[dict[str, Any]], cmd: str) -> str:
    out = [header(f"NUTS's own cost per round at N = 56, issue 57 ({cmd})"), __doc__.split("\n\n")[1], ""]
    for sec, title in (("ops", "NumPy operations of a tree (microseconds, D = 15)"),
                       ("vector", "Vectorised over 4 chains, against the kernel (microseconds)")):
        rs = [r for r in rows if r["section"] == sec]
        if rs:
            out += [f"## {title}", "", "| operation | us |", "|---|---|"]
            out += [f"| {r['op']} | {r['us']:.2f} |" for r in rs] + [""]
    rs = [r for r in rows if r["section"] == "rounds"]
    if rs:
        out += ["## gpvi.NUTS on boston-0, 4 chains x (200 + 300)", "",
                "| log joint | repeat | wall (s) | inside the calls (s) | evaluations | overhead | sampler's own us per "
                "round | call us per round |", "|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['log joint']} | {r['repeat']} | {r['wall_s']:.2f} | {r['inside_s']:.2f} | {r['evaluations']} | "
                f"{100 * r['overhead']:.0f}% | {r['own_us_per_round']:.0f} | {r['call_us_per_round']:.0f} |"
                for r in rs]
        for name in dict.fromkeys(r["log joint"] for r in rs):
            sel = [r for r in rs if r["log joint"] == name]
            out.append(f"\nMedians, {name}: overhead {100 * statistics.median(r['overhead'] for r in sel):.0f}%, "
                       f"sampler's own {statistics.median(r['own_us_per_round'] for r in sel):.0f} us per round, "
                       f"call {statistics.median(r['call_us_per_round'] for r in sel):.0f} us per round.")
    rs = [r for r in rows if r["section"] == "profile"]
    if rs:
        out += ["", "## Shares of the sampler's own time (cProfile, Gaussian log joint)", "", "| part | share |",
                "|---|---|"] + [f"| {r['part']} | {100 * r['share']:.0f}% |" for r in rs]
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", nargs="+", default=["ops", "vector", "rounds", "profile"])
    a = p.parse_args()
    torch.set_num_threads(1)
    from gpvi.inference.mcmc import nuts
    nuts.compiled = lambda: None          # this study is of the NumPy kernel (nuts_compiled: the compiled trees)
    rows: list[dict[str, Any]] = []
    cmd = "--sections " + " ".join(a.sections)
    for sec in a.sections:
        rows += globals()[f"section_{sec}"]()
    write("nuts_round_cost", report(rows, cmd), {"args": vars(a), "rows": rows})
    print(report(rows, cmd))


if __name__ == "__main__":
    main()
