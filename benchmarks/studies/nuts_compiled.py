"""NUTS with each round compiled (numba) against ``gpvi.NUTS``'s NumPy kernel: what a compiled dependency would buy
on issue 57's strict sampler overhead (at most 20 % of the gradient cost at N = 56).

``nuts_round_cost`` found the NumPy kernel's own work at 308 us a round against a 921 us batched call (33 %), and
that vectorising it over the chains in NumPy would leave about 28 %. This study writes the same transition as one
compiled state machine for all chains (:mod:`benchmarks.studies._nuts_numba`: one ``advance`` call a round, the
log joint answering all chains at once in between, through the library's batch wrapper
:class:`gpvi.inference.mcmc.chains.Potential`) and measures:

* ``gaussian``: correctness on a 15-dimensional Gaussian with scales 0.1-10 (closed-form means and sds), the metric
  the true variances and the identity: the compiled kernel's error in units of its Monte Carlo standard error, and
  its gradients per draw and bulk ESS against ``gpvi.NUTS``'s at the same step size and metric;
* ``rounds``: boston-0 of the stress suite (N = 56, D = 15) and ``small_data``'s 14-point model (D = 3). One
  ``gpvi.NUTS`` warm-up (4 chains, 300 warm-up transitions, seed 1) gives each chain's position, step size and
  metric; from there, alternated 3 times, ``gpvi.NUTS`` extends the run by ``--draws`` draws a chain and the
  compiled kernel draws as many. The log joint is timed around every call: overhead = wall over the time inside the
  calls, minus 1 (the sampling phase only, for both; ``gpvi.NUTS``'s wall is its chains' loop, ``info["time_s"]``,
  without the diagnostics of its result). ``gpvi.NUTS``'s repeats are the same seeded draws, the compiled kernel's
  have seeds 0, 1, 2. Each run's answer against the exact one (boston-0: the stress suite's long NUTS reference;
  the 14-point model: ``tiny_reference``'s grid);
* ``long``: the 14-point model, 4 chains x ``--long-draws`` draws a chain from the same warm-up with both
  kernels, against the grid (the short runs above vary by 10-20 % in sd with the seed: this model's log noise
  variance has a long lower tail);
* ``compile``: what a fresh process pays before the first draw, torch and gpvi already imported: importing numba,
  importing the kernel, a first 2-draw run with an empty numba cache (compiling) and with the cache it left
  (loading), and a second run; and the size of the installed ``numba`` and ``llvmlite``.

Needs numba (not a gpvi dependency): ``pip install numba``. Run:
``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.nuts_compiled``. Results:
``benchmarks/studies/results/nuts_compiled.{md,json}``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.studies._common import header, write

MAX_DEPTH = 10


def run_compiled(potential: Any, z0: np.ndarray, eps: np.ndarray, inv: np.ndarray, num_draws: int, seed: int,
                 replay: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:
    """``num_draws`` NUTS draws a chain from ``z0`` (C, D), step sizes ``eps`` (C,), diagonal inverse metric
    ``inv`` (C, D); randomness from ``numpy.random.default_rng([seed, c])`` per chain, or ``replay``: each chain's
    uniforms (C, KU) and standard normals (C, KN, D) in the order they are used (never refilled)."""
    from benchmarks.studies import _nuts_numba as K

    C, D = z0.shape
    b = K.buffers(C, D, MAX_DEPTH)
    rngs = [np.random.default_rng([seed, c]) for c in range(C)]
    KU, KN = 4096, 512
    U = np.stack([r.random(KU) for r in rngs]) if replay is None else replay[0]
    NRM = np.stack([r.standard_normal((KN, D)) for r in rngs]) if replay is None else replay[1]
    if replay is not None:
        KU, KN = 1 << 62, 1 << 62
    inv = np.ascontiguousarray(inv, dtype=np.float64)
    sd = 1.0 / np.sqrt(inv)
    draws, stats = np.zeros((C, num_draws, D)), np.zeros((C, num_draws, 6))
    nd, sc, ist, fst, pend, Zout = (b[k] for k in ("nd", "sc", "ist", "fst", "pend", "Zout"))
    lp, G, _ = potential(np.ascontiguousarray(z0, dtype=np.float64))
    nd[:, 0, K.Z], nd[:, 0, K.G], sc[:, 0, 1] = z0, G, lp
    ist[:, K.PHASE], fst[:, K.EPS] = K.START, eps
    advance, phase, ui, ni = K.advance, ist[:, K.PHASE], ist[:, K.UI], ist[:, K.NI]
    advance(nd, sc, ist, fst, pend, inv, sd, U, NRM, lp, G, Zout, draws, stats, MAX_DEPTH, num_draws)
    rounds = 0
    while (phase != K.DONE).any():
        lp, G, _ = potential(Zout)
        advance(nd, sc, ist, fst, pend, inv, sd, U, NRM, lp, G, Zout, draws, stats, MAX_DEPTH, num_draws)
        rounds += 1
        if ui.max() > KU - 64:
            U[:] = np.stack([r.random(KU) for r in rngs])
            ui[:] = 0
        if ni.max() > KN - 2:
            NRM[:] = np.stack([r.standard_normal((KN, D)) for r in rngs])
            ni[:] = 0
    return {"draws": draws, "lp": stats[..., 0], "acceptance_rate": stats[..., 1], "n_steps": stats[..., 2],
            "tree_depth": stats[..., 3], "diverging": stats[..., 4], "rounds": rounds}


def _ess_bulk(draws: np.ndarray) -> np.ndarray:
    from gpvi.posteriors.diagnostics import diagnostics
    return diagnostics(torch.as_tensor(draws))["ess_bulk"].numpy()


# ------------------------------------------------------------------------------------------------------ gaussian
class _Gauss:
    """A Gaussian target with independent coordinates, scales ``s``: ``(S, D)`` torch rows in, value and gradient."""

    def __init__(self, s: np.ndarray) -> None:
        self.s2 = torch.as_tensor(s ** 2)

    def log_joint(self, theta: torch.Tensor, **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return -0.5 * (theta * theta / self.s2).sum(-1), -theta / self.s2


def _gauss_potential(s: np.ndarray) -> Any:
    from gpvi.inference.mcmc.chains import Potential

    class T:                                             # what Potential needs: closed_form.log_joint
        closed_form = _Gauss(s)
        dim = len(s)
    return Potential(T())


def _gpvi_kernel_draws(s: np.ndarray, z0: np.ndarray, eps: float, inv: np.ndarray, n: int, seed: int) -> dict:
    """The library's NumPy transition (``kernel.nuts_transition``) on the same Gaussian, one chain at a time; with
    the uniforms and normals each chain used, in order (``replay``)."""
    from gpvi.inference.mcmc.kernel import Metric, Uniforms, nuts_transition

    class Recorded(Uniforms):
        def __init__(self, generator: torch.Generator) -> None:
            super().__init__(generator)
            self.us, self.ns = [], []

        def uniform(self) -> float:
            self.us.append(super().uniform())
            return self.us[-1]

        def normal(self, d: int) -> np.ndarray:
            self.ns.append(super().normal(d))
            return self.ns[-1]

    g = _Gauss(s)
    C, D = z0.shape
    out, steps, used = np.zeros((C, n, D)), np.zeros((C, n)), []
    for c in range(C):
        rng, metric = Recorded(torch.Generator().manual_seed(seed * 100 + c)), Metric(inv[c])
        used.append(rng)
        z = z0[c].copy()
        lp, gr = (t.numpy()[0] for t in g.log_joint(torch.as_tensor(z)[None]))
        for m in range(n):
            gen = nuts_transition(z, float(lp), gr, eps, metric, MAX_DEPTH, rng)
            ask = next(gen)
            try:
                while True:
                    v, gg = g.log_joint(torch.as_tensor(ask)[None])
                    ask = gen.send((float(v[0]), gg.numpy()[0]))
            except StopIteration as stop:
                z, lp, gr, st = stop.value
            out[c, m], steps[c, m] = z, st["n_steps"]
    ku, kn = max(len(r.us) for r in used) + 64, max(len(r.ns) for r in used) + 2
    U, NRM = np.zeros((C, ku)), np.zeros((C, kn, D))
    for c, r in enumerate(used):
        U[c, :len(r.us)], NRM[c, :len(r.ns)] = r.us, r.ns
    return {"draws": out, "n_steps": steps, "replay": (U, NRM)}


def section_gaussian(a: argparse.Namespace) -> list[dict[str, Any]]:
    D, C, n = 15, 4, a.gauss_draws
    s = np.geomspace(0.1, 10.0, D)
    rng = np.random.default_rng(3)
    rows = []
    for metric, inv, eps in (("true variances", np.tile(s ** 2, (C, 1)), 0.9), ("identity", np.ones((C, D)), 0.08)):
        z0 = rng.standard_normal((C, D)) * s
        r = run_compiled(_gauss_potential(s), z0, np.full(C, eps), inv, n, seed=5)
        ref = _gpvi_kernel_draws(s, z0, eps, inv, n, seed=5)
        for who, res in (("compiled", r), ("gpvi kernel", ref)):
            dr = res["draws"]
            ess = _ess_bulk(dr)
            flat = dr.reshape(-1, D)
            z_mean = np.abs(flat.mean(0)) / (s / np.sqrt(ess))              # |mean - 0| / MCSE
            sd_ratio = flat.std(0) / s
            rows.append({"section": "gaussian", "metric": metric, "kernel": who, "draws": C * n,
                         "max_abs_mean_over_mcse": float(z_mean.max()), "sd_ratio_min": float(sd_ratio.min()),
                         "sd_ratio_max": float(sd_ratio.max()), "grads_per_draw": float(res["n_steps"].mean()),
                         "min_ess_bulk": float(ess.min()), "ess_per_1k_grads": float(1000 * ess.min()
                                                                                  / res["n_steps"].sum())})
        same = run_compiled(_gauss_potential(s), z0, np.full(C, eps), inv, n, seed=5, replay=ref["replay"])
        diff = np.abs(same["draws"] - ref["draws"]).max(-1)
        rows.append({"section": "replay", "metric": metric, "draws": C * n, "max_abs_diff": float(diff.max()),
                     "differing": int((diff > 1e-8).sum()),
                     "first_differing": int(np.argmax((diff > 1e-8).any(0))) if (diff > 1e-8).any() else None})
    return rows


# -------------------------------------------------------------------------------------------------------- rounds
def _timed(model: Any, spent: list[float]) -> None:
    lean = model.closed_form
    real = type(lean).log_joint.__get__(lean)

    def timed(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        out = real(*args, **kwargs)
        spent[0] += time.perf_counter() - t
        return out
    lean.log_joint = timed


def _problems() -> list[tuple[str, Any]]:
    from benchmarks.small_data import stress, tiny_model
    return [("boston-0", next(p["model"] for p in stress()[0] if p["id"] == "boston-0")), ("tiny", tiny_model())]


def _reference(name: str) -> tuple[np.ndarray, np.ndarray]:
    """The exact answers: boston-0's long NUTS reference of the stress suite, the 14-point model's grid."""
    import json

    from benchmarks.studies._common import OWN, RESULTS
    if name == "tiny":
        ref = json.loads((OWN / "tiny_reference.json").read_text())["data"]["grid"]
    else:
        ref = json.loads((RESULTS / "trust_stress.json").read_text())["data"]["references"][name]
    return np.array(ref["mean"]), np.array(ref["sd"])


def _warm(model: Any, warmup: int) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
    """One ``gpvi.NUTS`` warm-up (4 chains, seed 1) and one draw: its state, and each chain's position, step size and
    diagonal inverse metric."""
    import gpvi

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warm = gpvi.NUTS(num_chains=4, num_warmup=warmup, num_draws=1, seed=1, progress_bar=False).run(model)
    st = warm.engine_state
    inv = np.stack([c.inverse_mass_matrix.numpy() for c in st.chains])
    assert inv.ndim == 2, "a diagonal metric"
    return (st, np.stack([c.position.numpy() for c in st.chains]), np.array([c.step_size for c in st.chains]), inv)


def section_rounds(a: argparse.Namespace) -> list[dict[str, Any]]:
    import gpvi
    from gpvi.inference.mcmc.chains import Potential

    rows = []
    for name, model in _problems():
        st, z0, eps, inv = _warm(model, a.warmup)
        run_compiled(Potential(model), z0, eps, inv, 5, seed=0)             # compile / load, warm caches
        ans = {}
        for rep in range(a.repeats):
            for who in ("gpvi.NUTS", "compiled"):
                spent = [0.0]
                _timed(model, spent)
                try:
                    t0 = time.perf_counter()
                    if who == "gpvi.NUTS":
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            post = gpvi.NUTS(num_chains=4, num_warmup=a.warmup, num_draws=1 + a.draws, seed=1,
                                             progress_bar=False).run(model, state=st)
                        wall = post.info["time_s"]          # the chains' loop (not the result's diagnostics)
                        dr = post.draws.numpy()[:, 1:]
                        grads = int(post.stats["n_steps"][:, 1:].sum())
                    else:
                        r = run_compiled(Potential(model), z0, eps, inv, a.draws, seed=rep)
                        wall = time.perf_counter() - t0
                        dr, grads = r["draws"], int(r["n_steps"].sum())
                finally:
                    del model.closed_form.log_joint
                ess = _ess_bulk(dr)
                ans.setdefault(who, []).append(dr.reshape(-1, dr.shape[-1]))
                rows.append({"section": "rounds", "problem": name, "kernel": who, "repeat": rep, "wall_s": wall,
                             "inside_s": spent[0], "overhead": wall / spent[0] - 1.0, "gradients": grads,
                             "grads_per_draw": grads / dr.shape[0] / dr.shape[1], "min_ess_bulk": float(ess.min()),
                             "min_ess_per_s": float(ess.min() / wall)})
        mean, sd = _reference(name)
        for who, runs in (("gpvi.NUTS", ans["gpvi.NUTS"][:1]), ("compiled", ans["compiled"])):
            for i, dr in enumerate(runs):                      # gpvi.NUTS's repeats are the same draws
                rows.append({"section": "answers", "problem": name, "kernel": who, "run": i, "draws": len(dr),
                             "max_abs_dmean_over_sd": float((np.abs(dr.mean(0) - mean) / sd).max()),
                             "sd_ratios": (dr.std(0) / sd).tolist()})
    return rows


def section_long(a: argparse.Namespace) -> list[dict[str, Any]]:
    import gpvi
    from benchmarks.small_data import tiny_model
    from gpvi.inference.mcmc.chains import Potential

    model, n = tiny_model(), a.long_draws
    st, z0, eps, inv = _warm(model, a.warmup)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        com = run_compiled(Potential(model), z0, eps, inv, n, seed=11)["draws"]
        t1 = time.perf_counter()
        post = gpvi.NUTS(num_chains=4, num_warmup=a.warmup, num_draws=1 + n, seed=1, progress_bar=False
                         ).run(model, state=st)
        t2 = time.perf_counter()
    mean, sd = _reference("tiny")
    rows = []
    for who, dr, wall in (("compiled", com, t1 - t0), ("gpvi.NUTS", post.draws.numpy()[:, 1:], t2 - t1)):
        flat = dr.reshape(-1, dr.shape[-1])
        rows.append({"section": "long", "kernel": who, "draws": len(flat), "wall_s": wall,
                     "min_ess_bulk": float(_ess_bulk(dr).min()), "dmean_over_sd": ((flat.mean(0) - mean) / sd).tolist(),
                     "sd_ratios": (flat.std(0) / sd).tolist()})
    return rows


# ------------------------------------------------------------------------------------------------------- compile
_PROBE = """
import time, numpy as np, torch, gpvi
from benchmarks.studies.nuts_compiled import run_compiled, _gauss_potential
t0 = time.perf_counter()
import numba
t1 = time.perf_counter()
from benchmarks.studies import _nuts_numba
t2 = time.perf_counter()
args = (_gauss_potential(np.ones(3)), np.zeros((4, 3)), np.full(4, 0.5), np.ones((4, 3)), 2)
run_compiled(*args, seed=0)
t3 = time.perf_counter()
run_compiled(*args, seed=1)
t4 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3)
"""


def _size_mb(mod: str) -> float:
    import importlib.util
    root = Path(importlib.util.find_spec(mod).origin).parent
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 2 ** 20


def section_compile(a: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=os.pathsep.join(sys.path))
        for what in ("empty cache (compiling)", "cache left by the first (loading)"):
            out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                                 check=True, cwd=Path(__file__).resolve().parents[2]).stdout.split()
            t = [float(x) for x in out[-4:]]
            rows.append({"section": "compile", "what": what, "import_numba_s": t[0], "import_kernel_s": t[1],
                         "first_run_s": t[2], "second_run_s": t[3]})
    rows += [{"section": "size", "package": m, "mb": _size_mb(m)} for m in ("numba", "llvmlite")]
    return rows


# -------------------------------------------------------------------------------------------------------- report
_ESS_NOTE = ("The ESS columns are not a comparison of the kernels: gpvi.NUTS's three repeats are one seeded run "
             "(the same draws), the compiled kernel's three have seeds 0-2, and 2,000 draws' ESS varies that much with "
             "the seed. Per gradient the two kernels are the same transition (the replay above); what differs is the "
             "wall per gradient, i.e. the overhead.")


def report(rows: list[dict[str, Any]], cmd: str, a: argparse.Namespace) -> str:
    import numba

    out = [header(f"NUTS compiled with numba against gpvi.NUTS's NumPy kernel, issue 57 ({cmd})"),
           f"- numba: {numba.__version__}", "", __doc__.split("\n\n")[1], ""]
    rs = [r for r in rows if r["section"] == "gaussian"]
    if rs:
        out += [f"## A 15-dimensional Gaussian, scales 0.1-10, 4 chains x {a.gauss_draws} draws", "",
                "| metric | kernel | max abs(mean) / MCSE | sd ratio min-max | gradients a draw | min bulk ESS | "
                "ESS per 1k gradients |", "|---|---|---|---|---|---|---|"]
        out += [f"| {r['metric']} | {r['kernel']} | {r['max_abs_mean_over_mcse']:.2f} | {r['sd_ratio_min']:.3f}-"
                f"{r['sd_ratio_max']:.3f} | {r['grads_per_draw']:.1f} | {r['min_ess_bulk']:.0f} | "
                f"{r['ess_per_1k_grads']:.1f} |" for r in rs] + [""]
    rs = [r for r in rows if r["section"] == "replay"]
    if rs:
        out += ["Replay: the compiled kernel fed the uniforms and normals the library's kernel used, in the same "
                "order (the same transitions up to rounding: the dot products are summed in another order):", "",
                "| metric | draws | max abs difference | draws differing by > 1e-8 | first such draw |", "|---|---|---|---|---|"]
        out += [f"| {r['metric']} | {r['draws']} | {r['max_abs_diff']:.1e} | {r['differing']} | "
                f"{r['first_differing']} |" for r in rs] + [""]
    rs = [r for r in rows if r["section"] == "rounds"]
    if rs:
        out += [f"## Sampling phase: {a.draws} draws a chain, 4 chains, from one gpvi.NUTS warm-up ({a.warmup})", "",
                "| problem | kernel | repeat | wall (s) | inside the calls (s) | overhead | gradients | gradients a "
                "draw | min bulk ESS | min ESS/s |", "|---|---|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['problem']} | {r['kernel']} | {r['repeat']} | {r['wall_s']:.2f} | {r['inside_s']:.2f} | "
                f"{100 * r['overhead']:.0f}% | {r['gradients']} | {r['grads_per_draw']:.1f} | {r['min_ess_bulk']:.0f} | "
                f"{r['min_ess_per_s']:.0f} |" for r in rs] + [""]
        for p in dict.fromkeys(r["problem"] for r in rs):
            for k in ("gpvi.NUTS", "compiled"):
                sel = [r for r in rs if r["problem"] == p and r["kernel"] == k]
                own = [(r["wall_s"] - r["inside_s"]) / r["gradients"] * 1e6 for r in sel]
                out.append(f"- {p}, {k}: median overhead {100 * statistics.median(r['overhead'] for r in sel):.0f}%, "
                           f"own work {statistics.median(own):.1f} us a chain-gradient, median min ESS/s "
                           f"{statistics.median(r['min_ess_per_s'] for r in sel):.0f}")
        out += ["", _ESS_NOTE, ""]
    rs = [r for r in rows if r["section"] == "answers"]
    if rs:
        out += ["## Answers against the exact ones (boston-0: the stress suite's long NUTS reference; tiny: the grid "
                "of ``tiny_reference``), each run on its own", "",
                "| problem | kernel | run | draws | max abs(mean - reference) / reference sd | sd ratios |",
                "|---|---|---|---|---|---|"]
        out += [f"| {r['problem']} | {r['kernel']} | {r['run']} | {r['draws']} | {r['max_abs_dmean_over_sd']:.3f} | "
                f"{min(r['sd_ratios']):.3f}-{max(r['sd_ratios']):.3f} |" for r in rs] + [""]
    rs = [r for r in rows if r["section"] == "long"]
    if rs:
        out += [f"## The 14-point model, 4 chains x {a.long_draws} draws, against the grid", "",
                "| kernel | draws | wall (s) | min bulk ESS | (mean - grid) / grid sd | sd / grid sd |",
                "|---|---|---|---|---|---|"]
        out += [f"| {r['kernel']} | {r['draws']} | {r['wall_s']:.1f} | {r['min_ess_bulk']:.0f} | "
                f"{', '.join(f'{x:+.3f}' for x in r['dmean_over_sd'])} | {', '.join(f'{x:.3f}' for x in r['sd_ratios'])} |"
                for r in rs]
        out += ["", "(``tiny_reference``'s 8 x 60,000-step random-walk Metropolis gave sd ratios 0.98, 1.00, 0.95 "
                "against the same grid.)", ""]
    rs = [r for r in rows if r["section"] in ("compile", "size")]
    if rs:
        out += ["## What a fresh process pays first (torch and gpvi already imported), and install size", "",
                "| numba cache | import numba (s) | import the kernel (s) | first run, 2 draws (s) | second run (s) |",
                "|---|---|---|---|---|"]
        out += [f"| {r['what']} | {r['import_numba_s']:.2f} | {r['import_kernel_s']:.2f} | {r['first_run_s']:.2f} | "
                f"{r['second_run_s']:.3f} |" for r in rs if r["section"] == "compile"]
        out += [""] + [f"- installed {r['package']}: {r['mb']:.0f} MB" for r in rs if r["section"] == "size"]
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sections", nargs="+", default=["gaussian", "rounds", "long", "compile"])
    p.add_argument("--draws", type=int, default=500)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--gauss-draws", type=int, default=1000)
    p.add_argument("--long-draws", type=int, default=20000)
    a = p.parse_args()
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    cmd = "--sections " + " ".join(a.sections) + f" --draws {a.draws} --warmup {a.warmup} --repeats {a.repeats}"
    for sec in a.sections:
        rows += globals()[f"section_{sec}"](a)
    text = report(rows, cmd, a)
    write("nuts_compiled", text, {"args": vars(a), "rows": rows})
    print(text)


if __name__ == "__main__":
    main()
