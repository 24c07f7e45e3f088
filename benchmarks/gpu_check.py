"""The stages of ``benchmarks/gpu_check.sh`` (issue 42): one process per stage, results appended as they come.

Each stage appends JSON lines to ``<work>/<tag>.jsonl`` as soon as an item is measured, so a stage killed by its
timeout keeps what it finished; an item that raises is recorded (``{"kind": "error", ...}``) and the stage goes on
with the next one. ``summarize`` merges every stage's lines, the shell's stage table (``stages.tsv``) and pytest's
JUnit XML into ``gpu_check.{json,md}`` and a ``gpu_scaling.{md,json}`` in the format of ``gpu_scaling.py``.

Stages::

    python -m benchmarks.gpu_check env       --work W
    python -m benchmarks.gpu_check logjoint  --work W --tag lj_small --device cuda --sizes 1000 2000 --cpu-sizes 1000
    python -m benchmarks.gpu_check ml2       --work W --device cuda --n 50000 --warm-n 5000,20000 --budget 120
    python -m benchmarks.gpu_check engines   --work W --tag engines_cuda --device cuda --cvi-n 16000
    python -m benchmarks.gpu_check summarize --work W --device cuda

Tests of the fallback: ``GPU_CHECK_FAIL=tag1,tag2`` makes those stages raise at their start (``tag:item``, e.g.
``engines_cuda:cvi``, one item inside a stage), ``GPU_CHECK_HANG=tag`` makes one sleep until its timeout kills it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import sys
import time
import traceback
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

import torch

T_START = time.perf_counter()


class Log:
    """Appends JSON lines to ``<work>/<tag>.jsonl`` (flushed at once) and echoes them to stdout."""

    def __init__(self, work: Path, tag: str) -> None:
        self.path, self.tag = work / f"{tag}.jsonl", tag
        work.mkdir(parents=True, exist_ok=True)

    def __call__(self, kind: str, **rec: Any) -> None:
        rec = {"kind": kind, "stage": self.tag, "t_s": round(time.perf_counter() - T_START, 2), **rec}
        line = json.dumps(rec, default=_plain)
        with self.path.open("a") as fh:
            fh.write(line + "\n")
        print(line, flush=True)

    def attempt(self, item: str, fn: Callable[[], Any]) -> Any:
        """``fn()``; on an exception record it (type, message, last traceback lines) and return None.

        ``GPU_CHECK_FAIL=<stage>:<item>`` makes that item raise (a test of this fallback)."""
        print(f"--- {self.tag}: {item} ({time.perf_counter() - T_START:.1f} s since the stage's start)", flush=True)
        t0 = time.perf_counter()
        try:
            if f"{self.tag}:{item}" in os.environ.get("GPU_CHECK_FAIL", "").split(","):
                raise RuntimeError(f"forced failure of {self.tag}:{item} (GPU_CHECK_FAIL)")
            return fn()
        except BaseException as e:              # noqa: BLE001  (KeyboardInterrupt too: record, then re-raise)
            self("error", item=item, error=f"{type(e).__name__}: {str(e).strip()[:400]}",
                 seconds=round(time.perf_counter() - t0, 2),
                 traceback=traceback.format_exc().splitlines()[-8:])
            if isinstance(e, KeyboardInterrupt):
                raise
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            return None


def _plain(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().tolist()
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return str(x)


def _forced(tag: str) -> None:
    if tag in os.environ.get("GPU_CHECK_FAIL", "").split(","):
        raise RuntimeError(f"forced failure of stage {tag!r} (GPU_CHECK_FAIL)")
    if tag in os.environ.get("GPU_CHECK_HANG", "").split(","):
        print(f"stage {tag!r} hangs on purpose (GPU_CHECK_HANG)", flush=True)
        time.sleep(10**6)


def _sync(dev: str) -> None:
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------------- stages
def stage_env(a: argparse.Namespace, log: Log) -> None:
    import gpytorch
    rec: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                           "gpytorch": gpytorch.__version__, "cpu_count": os.cpu_count(),
                           "torch_threads": torch.get_num_threads(), "cuda_available": torch.cuda.is_available()}
    for mod in ("numpy", "scipy", "linear_operator", "pyro", "arviz", "xarray", "pandas", "sklearn", "gpvi"):
        try:
            m = __import__(mod)
            rec[mod] = getattr(m, "__version__", "?")
        except Exception as e:               # noqa: BLE001
            rec[mod] = f"import failed: {type(e).__name__}: {e}"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        rec.update(name=torch.cuda.get_device_name(), memory_GiB=round(p.total_memory / 2**30, 2),
                   multiprocessors=p.multi_processor_count, capability=f"{p.major}.{p.minor}")
        n = 8192                                             # float64 Cholesky rate, the unit of the cost model
        A = torch.randn(n, n, dtype=torch.float64, device="cuda")
        K = A @ A.T + n * torch.eye(n, dtype=torch.float64, device="cuda")
        del A
        torch.linalg.cholesky(K)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            torch.linalg.cholesky(K)
        torch.cuda.synchronize()
        rec["fp64_cholesky_TFLOPs_at_8192"] = round(3 * n**3 / 3 / (time.perf_counter() - t0) / 1e12, 2)
        del K
        torch.cuda.empty_cache()
    log("env", **rec)


def stage_logjoint(a: argparse.Namespace, log: Log) -> None:
    from benchmarks import gpu_scaling as gs
    plan = [(n, a.device) for n in a.sizes] + [(n, "cpu") for n in a.cpu_sizes if a.device != "cpu"]
    plan.sort(key=lambda t: (t[0], t[1] != a.device))
    for n, dev in plan:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            row = log.attempt(f"logjoint N={n} {dev}", lambda: gs.logjoint_row(n, dev, a.repeats, peer=True))
        if row is not None:
            log("logjoint", row=row)
        if dev.startswith("cuda"):
            torch.cuda.empty_cache()


def stage_ml2(a: argparse.Namespace, log: Log) -> None:
    """ML-II at N = ``--n``: optionally warm-started through the optima on the first ``--warm-n`` rows (a list, each
    fit starting from the last); the fit runs until it converges or an alarm at the end of the budget interrupts it
    (ML2 keeps its best point; its projected gradient is then measured and logged as ``ml2_gradient``)."""
    import gpvi
    from benchmarks import gpu_scaling as gs
    dev, n, t_stage = a.device, a.n, time.perf_counter()
    warnings.simplefilter("ignore")
    X, y = gs.synthetic(n)
    init, rec = None, {"ml2_N": n, "device": dev, "warm_n": a.warm_n, "budget_s": a.budget}
    if a.warm_n:
        t0, its, conv = time.perf_counter(), [], []
        for m in a.warm_n:                      # each subset's optimum starts the next (and the full fit)
            sub = gpvi.GPRegression(X[:m], y[:m], device=dev)
            fit0 = gpvi.ML2(num_restarts=1, seed=0, progress_bar=False).run(sub, init=init)
            _sync(dev)
            init = fit0.theta.detach().cpu()
            its.append(int(fit0.info["records"][0]["iterations"]))
            conv.append(bool(fit0.info["converged"]))
            del sub, fit0
        rec.update(warm_s=time.perf_counter() - t0, warm_iterations=its, warm_converged=conv)
        log("ml2_warm", **rec)
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    model = gpvi.GPRegression(X, y, device=dev)
    th = (model.initial_theta() if init is None else init.to(model.device)).clone().requires_grad_(True)

    def one_eval() -> float:
        t0 = time.perf_counter()
        v = model.log_marginal_likelihood(th)
        torch.autograd.grad(v, th)
        _sync(dev)
        return time.perf_counter() - t0

    first = one_eval()
    t_eval = one_eval()
    # The fit runs to convergence or until an alarm interrupts it (ML2 then returns its best point so far): the
    # stage's budget less the time of the evaluations after it (the record, peak memory, a margin).
    fit_s = max(3 * t_eval, a.budget - (time.perf_counter() - t_stage) - 2 * t_eval - 5)
    rec.update(first_eval_s=first, eval_s=t_eval, fit_budget_s=fit_s, two_buffer=model._lean())
    log("ml2_eval", **rec)

    def alarm(*_):
        raise KeyboardInterrupt("gpu_check: the ML-II stage's budget is spent")
    previous = signal.signal(signal.SIGALRM, alarm)
    t0 = time.perf_counter()
    signal.setitimer(signal.ITIMER_REAL, fit_s)
    try:
        fit = gpvi.ML2(num_restarts=1, max_iter=1000, seed=0, progress_bar=False).run(model, init=init)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    _sync(dev)
    r0 = fit.info["records"][0]
    rec.update(ml2_s=time.perf_counter() - t0, ml2_iterations=int(r0["iterations"]),
               ml2_evaluations=int(r0["evaluations"]), converged=bool(fit.info["converged"]),
               interrupted=bool(fit.info["interrupted"]),
               lbfgs_converged=bool(r0["converged"]), message=str(r0["message"]).strip(),
               projected_gradient=fit.info["projected_gradient"], value=float(fit.value), theta=fit.theta)
    if dev.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated() - base
        rec.update(peak_GiB=peak / 2**30, peak_copies=peak / (8 * n * n),
                   nxn_GiB=8 * n * n / 2**30, device_GiB=torch.cuda.get_device_properties(0).total_memory / 2**30)
    log("ml2", **rec)
    if rec["projected_gradient"] is None:          # ML2 measured none (converged or interrupted): one evaluation
        from gpvi.inference.ml2 import _projected_gradient_max
        g = _projected_gradient_max(model.log_marginal_likelihood, fit.theta, (-25.0, 25.0))
        log("ml2_gradient", projected_gradient=g, converged_if_below=1e-5 * max(1.0, abs(float(fit.value))))
    left = a.budget - (time.perf_counter() - t_stage)
    if a.dsvi_steps and left > (a.dsvi_steps + 3) * 2 * t_eval:
        r = log.attempt("dsvi_large", lambda: gs.dsvi_large(dev, model, fit.theta, steps=a.dsvi_steps, num_draws=1))
        if r is not None:
            log("engine", device=dev, values={**r, "dsvi_large_N": n, "dsvi_large_num_draws": 1})
    else:
        log("note", item="dsvi_large", note=f"skipped: {left:.0f} s left of the stage budget")


def stage_engines(a: argparse.Namespace, log: Log) -> None:
    from benchmarks import gpu_scaling as gs
    dev = a.device
    warnings.simplefilter("ignore")
    box: dict[str, Any] = {}

    def boston():
        if "boston" not in box:
            import gpvi
            ds = gpvi.datasets.load_boston(seed=0)
            box["boston"] = gpvi.GPRegression(ds.X_train[:a.boston_rows], ds.y_train[:a.boston_rows], device=dev)
        return box["boston"]

    def dsvi():
        rec, box["boston"] = gs.dsvi_boston(dev, num_steps=a.dsvi_num_steps, rows=a.boston_rows)
        return {**rec, "boston_N": box["boston"].num_data}

    def nuts():
        return gs.nuts_rate(dev, boston(), warmup=a.nuts_warmup, draws=a.nuts_draws)

    def nuts_chains():                                      # issue 57, item 5: many chains advancing together
        """Batched call rates at both sizes first (cheap), then short NUTS runs with more and more chains on Boston,
        then at ``--chains-big-n``; each result is logged when measured. A run is skipped when, scaled from the
        last run by the call times, it would not end before the stage's end (``GPU_CHECK_STAGE_END``) less what
        the big-N runs keep (``--chains-big-reserve`` seconds)."""
        import gpvi
        end = float(os.environ.get("GPU_CHECK_STAGE_END", "inf"))
        X, y = gs.synthetic(a.chains_big_n)
        sets = [("", boston(), a.chains, a.chains_warmup, a.chains_big_reserve),
                ("big_", gpvi.GPRegression(X, y, device=dev), a.chains_big, a.chains_big_warmup, 0.0)]
        calls = []
        for tag, model, counts, _, _ in sets:
            c = gs.call_rates(dev, model, sorted(set([1] + counts)))
            calls.append(c)
            log("engine", device=dev, values={f"{tag}{k}": v for k, v in {"nuts_chains_N": model.num_data,
                                                                            **c}.items()})
        gs.nuts_chains(dev, sets[0][1], [2], warmup=2, draws=2)     # compiles the trees: not timed, not logged
        for (tag, model, counts, w, reserve), c in zip(sets, calls):
            last = None
            for k in counts:
                if last is not None:
                    guess = 1.5 * last[1] * c[f"call_{k}_ms"] / c[f"call_{last[0]}_ms"]   # more chains, longer tails
                    left = end - time.time() - reserve
                    if guess > left:
                        log("note", item="nuts_chains", note=f"{tag}{k} chains skipped: about {guess:.0f} s "
                            f"needed, {left:.0f} s left")
                        break
                r = gs.nuts_chains(dev, model, [k], warmup=w, draws=w)
                log("engine", device=dev, values={f"{tag}{key}": v for key, v in r.items()})
                last = (k, r[f"nuts_{k}_chains_wall_s"])
        return None

    items = {"dsvi": dsvi,
             "cvi": lambda: gs.cvi_steps(dev, a.cvi_n, full_steps=a.cvi_full_steps, single_steps=a.cvi_single_steps),
             "nuts": nuts, "nuts_chains": nuts_chains}
    for name in a.what:
        r = log.attempt(name, items[name])
        if r is not None:
            log("engine", device=dev, values=r)


# ---------------------------------------------------------------------------------------------------- summary
def _lines(work: Path) -> list[dict[str, Any]]:
    out = []
    for p in sorted(work.glob("*.jsonl")):
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                out.append({"kind": "error", "stage": p.stem, "error": f"unreadable line: {line[:200]}"})
    return out


def _stages(work: Path) -> list[dict[str, Any]]:
    p = work / "stages.tsv"
    if not p.exists():
        return []
    rows = []
    for line in p.read_text().splitlines():
        f = line.split("\t")
        if len(f) >= 5:
            rows.append({"stage": f[0], "status": f[1], "rc": int(f[2]) if f[2].lstrip("-").isdigit() else f[2],
                         "seconds": float(f[3]), "timeout_s": f[4], "tail": f[5] if len(f) > 5 else ""})
    return rows


def _junit(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"present": False}
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        return {"present": True, "error": str(e)}
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    cases = []
    for tc in suite.iter("testcase"):
        outcome = "passed"
        msg = ""
        for tag in ("failure", "error", "skipped"):
            el = tc.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                msg = (el.get("message") or "")[:300]
        cases.append({"test": tc.get("name"), "seconds": float(tc.get("time", 0)), "outcome": outcome,
                      "message": msg})
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return {"present": True, **counts, "seconds": float(suite.get("time", 0)), "cases": cases}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list) and len(v) > 6:
        return "[" + ", ".join(f"{x:.3g}" if isinstance(x, float) else str(x) for x in v) + "]"
    return str(v)


def stage_summarize(a: argparse.Namespace, log: Log) -> None:
    from benchmarks import gpu_scaling as gs
    from benchmarks._common import write
    work, dev = a.work, a.device
    lines = _lines(work)
    env = next((r for r in lines if r["kind"] == "env"), {})
    rows = sorted((r["row"] for r in lines if r["kind"] == "logjoint"), key=lambda r: (r["N"], r["device"] != dev))
    eng: dict[str, dict[str, Any]] = {}
    owner: dict[str, str] = {}                # two engine stages on one device (a CPU rehearsal): "cpu (stage)"
    for r in lines:
        if r["kind"] == "engine":
            key = r["device"]
            if r["stage"] != "ml2_50k" and owner.setdefault(key, r["stage"]) != r["stage"]:
                key = f"{key} ({r['stage']})"
            eng.setdefault(key, {}).update(r["values"])
    ml2 = next((r for r in lines if r["kind"] == "ml2"), None)
    grad = next((r for r in lines if r["kind"] == "ml2_gradient"), None)
    if ml2 is not None and grad is not None:       # an interrupted fit's projected gradient, measured after it
        ml2 = {**ml2, "projected_gradient": grad["projected_gradient"],
               "converged_if_below": grad["converged_if_below"]}
    if ml2 is not None:
        eng.setdefault(ml2["device"], {}).update({k: ml2[k] for k in ("ml2_N", "ml2_s", "ml2_iterations")})
    errors = [r for r in lines if r["kind"] == "error"]
    stages = _stages(work)
    junit = _junit(work / "pytest_cuda.xml")
    record = {"device": dev, "torch": env.get("torch", torch.__version__), "cuda": env.get("cuda", torch.version.cuda),
              "gpytorch": env.get("gpytorch")}
    for k in ("name", "memory_GiB", "fp64_cholesky_TFLOPs_at_8192"):
        if k in env:
            record[k] = env[k]
    data = {"record": record, "logjoint": rows, "engines": eng,
            "crossover_logjoint_N": gs.crossover(rows, "gpvi_s", dev)}
    # the targets, read off what was measured
    on_dev = [r for r in rows if r["device"] == dev]
    targets = {
        "pytest_cuda_all_passed": bool(junit.get("present") and junit.get("failures", 1) == 0
                                       and junit.get("errors", 1) == 0
                                       and junit.get("tests", 0) > junit.get("skipped", 0)),
        "ratio_to_floor_max_N_ge_5000": max((r["ratio"] for r in on_dev if r["N"] >= 5000), default=None),
        "gpytorch_over_gpvi_min": min((r["gpytorch_s"] / r["gpvi_s"] for r in on_dev
                                       if isinstance(r.get("gpytorch_s"), float) and math.isfinite(r["gpytorch_s"])),
                                      default=None),
        "ml2_N": None if ml2 is None else ml2["ml2_N"],
        "ml2_converged": None if ml2 is None else ml2["converged"],
    }
    targets["ratio_within_1.5"] = (None if targets["ratio_to_floor_max_N_ge_5000"] is None
                                   else targets["ratio_to_floor_max_N_ge_5000"] <= 1.5)
    targets["gpytorch_1.5x_slower"] = (None if targets["gpytorch_over_gpvi_min"] is None
                                       else targets["gpytorch_over_gpvi_min"] >= 1.5)
    write(a.name, gs.render(data, dev), data)
    full = {"env": env, "stages": stages, "pytest": junit, "targets": targets, "ml2": ml2, "errors": errors,
            "notes": [r for r in lines if r["kind"] == "note"], "gpu_scaling": data}
    (work / "gpu_check.json").write_text(json.dumps(full, indent=2, default=_plain))
    md = [f"# gpu_check: {env.get('name', dev)}", ""]
    md += [f"- {k}: {env[k]}" for k in ("name", "memory_GiB", "capability", "torch", "cuda", "gpytorch",
                                         "linear_operator", "pyro", "arviz", "numpy", "python",
                                         "fp64_cholesky_TFLOPs_at_8192", "cpu_count") if k in env]
    md += ["", "## Stages", "", "| stage | status | rc | seconds | timeout (s) |", "|---|---|---|---|---|"]
    md += [f"| {s['stage']} | {s['status']} | {s['rc']} | {s['seconds']:.1f} | {s['timeout_s']} |" for s in stages]
    fails = [s for s in stages if s["status"] != "ok"]
    for s in fails:
        md += ["", f"### {s['stage']}: {s['status']} (rc {s['rc']}), last lines", "", "```",
               *s["tail"].split(" \\n "), "```"]
    md += ["", "## Targets", ""] + [f"- {k}: {_fmt(v)}" for k, v in targets.items()]
    if junit.get("present") and "cases" in junit:
        md += ["", f"## pytest -m cuda ({junit['tests']} tests, {junit['failures']} failed, {junit['errors']} errors, "
                   f"{junit['skipped']} skipped, {junit['seconds']:.0f} s)", "", "| test | outcome | s | message |",
               "|---|---|---|---|"]
        md += [f"| {c['test']} | {c['outcome']} | {c['seconds']:.1f} | {c['message'][:120].replace('|', '/')} |"
               for c in junit["cases"]]
    if ml2 is not None:
        md += ["", f"## ML-II at N = {ml2['ml2_N']}", ""] + [f"- {k}: {_fmt(v)}" for k, v in ml2.items()
                                                               if k not in ("kind", "stage")]
    if errors:
        md += ["", "## Errors inside stages", ""] + [f"- {e['stage']} / {e.get('item', '')}: {e['error']}"
                                                     for e in errors]
    md += ["", "## Scaling (gpu_scaling format)", "", gs.render(data, dev).split("\n", 1)[1]]
    (work / "gpu_check.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


# ---------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("stage", choices=["env", "logjoint", "ml2", "engines", "summarize"])
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--tag", default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--sizes", type=int, nargs="*", default=[])
    p.add_argument("--cpu-sizes", type=int, nargs="*", default=[])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--n", type=int, default=50_000)
    p.add_argument("--warm-n", type=lambda v: [int(x) for x in v.split(",") if x], default=[5000],
                   help="comma-separated subset sizes fitted in turn before the full N (empty: no warm start)")
    p.add_argument("--budget", type=float, default=120.0)
    p.add_argument("--dsvi-steps", type=int, default=2)
    p.add_argument("--what", nargs="+", default=["cvi", "nuts", "dsvi"], choices=["dsvi", "cvi", "nuts", "nuts_chains"])
    p.add_argument("--boston-rows", type=int, default=None, help="engines: first rows of Boston only (rehearsal)")
    p.add_argument("--dsvi-num-steps", type=int, default=None, help="engines: cap DSVI's steps on Boston")
    p.add_argument("--cvi-n", type=int, default=16_000)
    p.add_argument("--cvi-full-steps", type=int, default=3)
    p.add_argument("--cvi-single-steps", type=int, default=2000)
    p.add_argument("--nuts-warmup", type=int, default=50)
    p.add_argument("--nuts-draws", type=int, default=50)
    p.add_argument("--chains", type=int, nargs="+", default=[4, 64, 256, 1024], help="nuts_chains: on Boston")
    p.add_argument("--chains-big-n", type=int, default=5000, help="nuts_chains: N of the synthetic set")
    p.add_argument("--chains-big", type=int, nargs="+", default=[4, 16, 64], help="nuts_chains: at --chains-big-n")
    p.add_argument("--chains-warmup", type=int, default=10, help="nuts_chains: warm-up and draws per chain")
    p.add_argument("--chains-big-warmup", type=int, default=5, help="nuts_chains: the same at --chains-big-n")
    p.add_argument("--chains-big-reserve", type=float, default=30.0,
                   help="nuts_chains: seconds of the stage kept for the runs at --chains-big-n")
    p.add_argument("--name", default="gpu_scaling", help="summarize: name of the gpu_scaling-format report")
    a = p.parse_args(argv)
    tag = a.tag or a.stage
    if os.environ.get("GPU_CHECK_DRY") == "1":          # gpu_check.sh's dry run: the arguments parse, nothing runs
        print("dry run:", {k: str(v) for k, v in vars(a).items()}, flush=True)
        return
    # Reports go under the work folder unless GPVI_BENCH_OUT says otherwise (gpu_check.sh sets it): a stage run by
    # hand must not overwrite the committed benchmarks/results/gpu_scaling.*
    os.environ.setdefault("GPVI_BENCH_OUT", str(Path(a.work) / "results"))
    log = Log(a.work, tag)
    _forced(tag)
    {"env": stage_env, "logjoint": stage_logjoint, "ml2": stage_ml2, "engines": stage_engines,
     "summarize": stage_summarize}[a.stage](a, log)


if __name__ == "__main__":
    sys.exit(main())
