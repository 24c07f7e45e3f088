"""Exact GPs on a GPU against the hardware floor, and where the GPU overtakes the CPU (issue "every engine on a GPU").

For each N (synthetic data, d = 8, the paper's ScaleKernel(RBF) with ARD), on ``--device`` and, up to
``--cpu-max-n``, on the CPU of the same machine:

* **log joint + gradient per theta draw** (``model.log_joint`` + ``autograd``; S = 1, and S = 4 below the two-buffer
  threshold) against the **floor**: ``torch.linalg.cholesky`` + ``torch.cholesky_inverse`` of the model's own
  covariance on the same device in the same run (any exact gradient needs :math:`K^{-1}`); ratio = gpvi / floor;
* **GPyTorch's exact marginal likelihood** forward + backward with Cholesky forced (``max_cholesky_size``), the peer;
* peak device memory per call (CUDA only) against :math:`8N^2` bytes per N x N copy;
* **ML-II** at the largest N (one L-BFGS-B fit from the default start, one restart): wall time, evaluations;
* **DSVI**: wall of the default run on Boston; seconds per step (S = 1) on a large synthetic set;
* **CVI**: full-batch step vs single-site step at ``--cvi-n`` (classification labels from the synthetic inputs);
* **NUTS**: gradient evaluations per second on Boston, CPU vs device; many chains advancing together
  (:func:`nuts_chains`: 4 to 1,024 chains at N = 455, fewer at N = 5,000).

The crossover N of each measurement is the smallest N at which the device is faster than the CPU. Every record
holds the device name, torch and CUDA versions. Medians of ``--repeats`` runs (fewer for N >= 20,000).

Usage::

    python benchmarks/gpu_scaling.py --device cuda                          # on a GPU machine
    OMP_NUM_THREADS=1 python benchmarks/gpu_scaling.py --device cpu --sizes 500 1000 2000 --cvi-n 1000 \
        --ml2-n 2000 --out-name gpu_scaling_cpu                             # the CPU-only part, here

Writes ``results/<out-name>.{md,json}`` (default ``gpu_scaling``); commit GPU figures only from a real GPU run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import warnings
from typing import Any, Callable

import gpytorch
import torch

import gpvi

try:
    from benchmarks._common import header, write
except ImportError:                                   # run as a script from benchmarks/
    from _common import header, write


def sync(dev: str) -> None:
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], dev: str, repeats: int) -> float:
    """Median wall seconds of ``fn()`` over ``repeats`` runs after one warm-up run (device synchronised)."""
    fn()
    sync(dev)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(dev)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def synthetic(n: int, d: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    y = torch.sin(6 * X[:, 0]) + X[:, 1] ** 2 + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    return X, y


def peak_bytes(dev: str, fn: Callable[[], Any]) -> float:
    if not dev.startswith("cuda"):
        return math.nan
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return float(torch.cuda.max_memory_allocated() - base)


class _ExactGP(gpytorch.models.ExactGP):
    def __init__(self, X, y, lik):
        super().__init__(X, y, lik)
        self.mean = gpytorch.means.ZeroMean()
        self.cov = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=X.shape[1]))

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean(x), self.cov(x))


def logjoint_row(n: int, dev: str, repeats: int, peer: bool) -> dict[str, Any]:
    X, y = synthetic(n)
    model = gpvi.GPRegression(X, y, device=dev)
    th0 = model.initial_theta()
    row: dict[str, Any] = {"N": n, "device": dev, "two_buffer": model._lean()}

    def lj(S: int) -> Callable[[], Any]:
        th = (th0 if S == 1 else th0 + 0.05 * torch.arange(S, dtype=th0.dtype, device=th0.device)[:, None]
              ).clone().requires_grad_(True)

        def run():
            v = model.log_joint(th)
            torch.autograd.grad(v.sum(), th)
        return run

    with torch.no_grad():
        box = {"K": model.covariance(th0)}

    def floor():
        L = torch.linalg.cholesky(box["K"])
        torch.cholesky_inverse(L)

    r = max(1, repeats if n < 20_000 else 1)
    row["floor_s"] = timed(floor, dev, r)
    box.clear()                                        # free the floor's matrix before gpvi's run
    row["gpvi_s"] = timed(lj(1), dev, r)
    row["ratio"] = row["gpvi_s"] / row["floor_s"]
    row["peak_copies"] = peak_bytes(dev, lj(1)) / (8 * n * n)
    if not model._lean():
        row["gpvi_s_per_draw_S4"] = timed(lj(4), dev, r) / 4
    if peer:
        lik = gpytorch.likelihoods.GaussianLikelihood().double().to(dev)
        gp = _ExactGP(model.X, model.y, lik).double().to(dev)
        gp.train()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(lik, gp)

        def gpy():
            gp.zero_grad()
            with gpytorch.settings.max_cholesky_size(10**9), gpytorch.settings.fast_computations(False, False, False):
                (-mll(gp(model.X), model.y)).backward()
        try:
            row["gpytorch_s"] = timed(gpy, dev, r)
        except (RuntimeError, MemoryError) as e:                   # out of memory: say so
            row["gpytorch_s"], row["gpytorch_error"] = math.nan, str(e).splitlines()[0][:120]
    return row


def dsvi_boston(dev: str, num_steps: int | None = None, rows: int | None = None) -> tuple[dict[str, Any], Any]:
    """Wall of the default DSVI run on Boston (and the Boston model, for NUTS); ``num_steps`` caps the steps,
    ``rows`` keeps the first rows only (a rehearsal's stand-in)."""
    ds = gpvi.datasets.load_boston(seed=0)
    boston = gpvi.GPRegression(ds.X_train[:rows], ds.y_train[:rows], device=dev)
    kw = {} if num_steps is None else {"num_steps": num_steps}
    t0 = time.perf_counter()
    q = gpvi.DSVI(seed=0, progress_bar=False, **kw).run(boston)
    sync(dev)
    out = {"dsvi_boston_s": time.perf_counter() - t0,
           "dsvi_boston_steps": int(q.info.get("steps", q.info.get("num_steps", -1)))}
    return out, boston


def ml2_fit(dev: str, ml2_n: int, *, max_iter: int = 1000, init: Any = None) -> tuple[dict[str, Any], Any, Any]:
    """One L-BFGS-B ML-II fit (one restart) on ``synthetic(ml2_n)``: wall, iterations (and the fit, the model)."""
    X, y = synthetic(ml2_n)
    big = gpvi.GPRegression(X, y, device=dev)
    t0 = time.perf_counter()
    fit = gpvi.ML2(num_restarts=1, max_iter=max_iter, seed=0, progress_bar=False).run(big, init=init)
    sync(dev)
    out = {"ml2_N": ml2_n, "ml2_s": time.perf_counter() - t0,
           "ml2_iterations": int(fit.info["restarts"].columns["iterations"][0])}
    return out, fit, big


def dsvi_large(dev: str, model: Any, theta: Any, steps: int = 5, num_draws: int | None = None) -> dict[str, Any]:
    """Seconds per Adam step of DSVI on a large model, from ``theta`` (``num_draws`` draws a step; DSVI's default
    when None)."""
    kw = {} if num_draws is None else {"num_draws": num_draws}
    t0 = time.perf_counter()
    gpvi.DSVI(optimizer="adam", num_steps=steps, num_elbo_draws=1, seed=0, progress_bar=False, **kw).run(
        model, init=theta)
    sync(dev)
    return {"dsvi_large_s_per_step": (time.perf_counter() - t0) / steps}


def cvi_steps(dev: str, cvi_n: int, *, full_steps: int = 3, single_steps: int | None = None) -> dict[str, Any]:
    """Seconds per full-batch CVI step and per single-site step (``single_steps``, default 2 N) at N = cvi_n."""
    Xc, _ = synthetic(cvi_n, d=2)
    c = (Xc[:, 0] + 0.2 * torch.randn(cvi_n, generator=torch.Generator().manual_seed(1),
                                        dtype=torch.float64) > 0.5).double()
    clf = gpvi.GPClassification(Xc, c, device=dev)
    out: dict[str, Any] = {"cvi_N": cvi_n}
    t0 = time.perf_counter()
    gpvi.CVI(num_steps=full_steps, tol=0, seed=0, progress_bar=False).run(clf)
    sync(dev)
    out["cvi_full_s_per_step"] = (time.perf_counter() - t0) / full_steps
    steps = 2 * cvi_n if single_steps is None else single_steps
    t0 = time.perf_counter()
    gpvi.CVI(mode="stochastic", num_steps=steps, tol=0, seed=0, progress_bar=False).run(clf)
    sync(dev)
    out["cvi_single_site_s_per_step"] = (time.perf_counter() - t0) / steps
    return out


def nuts_rate(dev: str, model: Any, *, warmup: int = 50, draws: int = 50) -> dict[str, Any]:
    """Gradient evaluations per second of one NUTS chain (warm-up included) on ``model``."""
    t0 = time.perf_counter()
    mc = gpvi.NUTS(num_chains=1, num_warmup=warmup, num_draws=draws, seed=0, progress_bar=False).run(model)
    sync(dev)
    ev = int(mc.stats["n_steps"].sum()) + int(torch.as_tensor(mc.info["warmup_stats"]["n_steps"]).sum())
    return {"nuts_grads_per_s": ev / (time.perf_counter() - t0)}


def sampler_call(model: Any) -> tuple[Any, str]:
    """``(owner, name)`` of the batched log joint + gradient that ``gpvi.NUTS`` calls on ``model``
    (``inference.mcmc.chains.Potential``'s rule): the closed form's ``log_joint``, or above ``LEAN_JOINT_MAX_N``
    points (no closed form) the model's ``log_joint_and_grad``."""
    lean = model.closed_form
    return (lean, "log_joint") if lean is not None else (model, "log_joint_and_grad")


def nuts_chains(dev: str, model: Any, chains: list[int], *, warmup: int = 30, draws: int = 30) -> dict[str, Any]:
    """Many chains advancing together (issue 57, item 5): per number of chains, chain-gradients per second and the
    share of the wall spent inside the batched log joint + gradient calls (the rest is the sampler's own work in
    Python, per chain). Short runs: a rate, not a converged posterior."""
    lean, attr = sampler_call(model)
    real, spent = getattr(lean, attr), [0.0]

    def timed_call(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        out = real(*args, **kwargs)
        sync(dev)
        spent[0] += time.perf_counter() - t
        return out

    out: dict[str, Any] = {"nuts_chains_N": model.num_data}
    setattr(lean, attr, timed_call)
    try:
        for c in chains:
            spent[0] = 0.0
            t0 = time.perf_counter()
            mc = gpvi.NUTS(num_chains=c, num_warmup=warmup, num_draws=draws, seed=0, progress_bar=False).run(model)
            sync(dev)
            wall = time.perf_counter() - t0
            ev = sum(mc.info["num_evaluations"])
            out[f"nuts_{c}_chains_grads_per_s"] = ev / wall
            out[f"nuts_{c}_chains_in_log_joint"] = spent[0] / wall
            out[f"nuts_{c}_chains_wall_s"] = wall
    finally:
        delattr(lean, attr)
    return out


def call_rates(dev: str, model: Any, counts: list[int], *, repeats: int = 2) -> dict[str, Any]:
    """One batched call of the log joint + gradient, as the sampler makes it (:func:`sampler_call`), on ``c``
    thetas for each ``c`` in ``counts`` (the thetas spread around the model's initial point): milliseconds a call
    (median of ``repeats`` after one warm-up) and chain-gradients per second, the ceiling of ``c`` chains advancing
    together."""
    call, out = getattr(*sampler_call(model)), {}
    g = torch.Generator().manual_seed(0)
    theta0 = model.initial_theta().detach().to("cpu", torch.float64)
    for c in counts:
        theta = (theta0 + 0.1 * torch.randn(c, theta0.numel(), generator=g, dtype=torch.float64)).to(dev)
        s = timed(lambda: call(theta), dev, repeats)
        out[f"call_{c}_ms"] = 1e3 * s
        out[f"call_{c}_chain_grads_per_s"] = c / s
    return out


def engines(dev: str, cvi_n: int, ml2_n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec, boston = dsvi_boston(dev)
        out.update(rec)
        rec, fit, big = ml2_fit(dev, ml2_n)
        out.update(rec)
        out.update(dsvi_large(dev, big, fit.theta))
        out.update(cvi_steps(dev, cvi_n))
        out.update(nuts_rate(dev, boston))
    return out


def device_record(dev: str) -> dict[str, Any]:
    rec = {"device": dev, "torch": torch.__version__, "cuda": torch.version.cuda, "gpytorch": gpytorch.__version__}
    if dev.startswith("cuda"):
        rec["name"] = torch.cuda.get_device_name()
        rec["memory_GiB"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    return rec


def crossover(rows: list[dict[str, Any]], key: str, dev: str) -> int | None:
    cpu = {r["N"]: r[key] for r in rows if r["device"] == "cpu" and key in r}
    gpu = {r["N"]: r[key] for r in rows if r["device"] == dev and key in r}
    wins = [n for n in sorted(set(cpu) & set(gpu)) if gpu[n] < cpu[n]]
    return wins[0] if wins else None


def render(data: dict[str, Any], dev: str) -> str:
    """The markdown report of ``data`` (``record``, ``logjoint`` rows, ``engines``, ``crossover_logjoint_N``)."""
    md = header(f"Exact GP on {data['record'].get('name', dev)}: log joint + gradient vs the Cholesky floor")
    md += "\n" + "\n".join(f"- {k}: {v}" for k, v in data["record"].items()) + "\n\n"
    md += ("| N | device | two-buffer | floor (s) | gpvi (s) | gpvi / floor | per draw at S=4 (s) | GPyTorch (s) | "
           "peak N x N copies |\n|---|---|---|---|---|---|---|---|---|\n")
    for r in data["logjoint"]:
        md += (f"| {r['N']} | {r['device']} | {r['two_buffer']} | {r['floor_s']:.4g} | {r['gpvi_s']:.4g} | "
               f"{r['ratio']:.2f} | {r.get('gpvi_s_per_draw_S4', math.nan):.4g} | {r.get('gpytorch_s', math.nan):.4g}"
               f" | {r['peak_copies']:.2f} |\n")
    md += f"\nFirst N at which {dev} beats the CPU (log joint + gradient): {data['crossover_logjoint_N']}\n"
    for d, e in data.get("engines", {}).items():
        md += f"\n## Engines on {d}\n\n" + "\n".join(f"- {k}: {v:.4g}" if isinstance(v, float) else f"- {k}: {v}"
                                                   for k, v in e.items()) + "\n"
    return md


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--sizes", type=int, nargs="+",
                   default=[1000, 2000, 5000, 10_000, 20_000, 30_000, 40_000, 50_000])
    p.add_argument("--cpu-max-n", type=int, default=5000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cvi-n", type=int, default=16_000)
    p.add_argument("--ml2-n", type=int, default=50_000)
    p.add_argument("--no-engines", action="store_true")
    p.add_argument("--out-name", default="gpu_scaling")
    a = p.parse_args()
    dev = a.device
    torch.manual_seed(0)
    rows = []
    for n in a.sizes:
        devs = [dev] + (["cpu"] if dev != "cpu" and n <= a.cpu_max_n else [])
        for d in devs:
            rows.append(logjoint_row(n, d, a.repeats, peer=True))
            print(rows[-1], flush=True)
    data: dict[str, Any] = {"record": device_record(dev), "logjoint": rows}
    if not a.no_engines:
        data["engines"] = {dev: engines(dev, a.cvi_n, a.ml2_n)}
        print(data["engines"], flush=True)
        if dev != "cpu":
            data["engines"]["cpu"] = engines("cpu", min(a.cvi_n, 2000), min(a.ml2_n, 2000))
    data["crossover_logjoint_N"] = crossover(rows, "gpvi_s", dev)
    md = render(data, dev)
    print(write(a.out_name, md, data))


if __name__ == "__main__":
    main()
