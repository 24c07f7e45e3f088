"""GP classification at N = 500 ... 10,000: gpvi's type-II fit against scikit-learn's GPC in the same run (issue 41).

Target (issue 41): the default ``GPClassifier`` type-II fit in at most half of scikit-learn's
``GaussianProcessClassifier`` wall time at N = 2,000 and 5,000, with test log loss within 0.005.

Protocol. Synthetic sets with a nonlinear boundary (seeded, ``numpy.random.default_rng``):

* ``binary``: two inputs uniform on [-2, 2]^2, :math:`p(y=1\\mid x) = \\sigma(3(\\sin 2x_1 + x_2^2/2 - 0.8))`;
* ``3class``: two inputs uniform on [-2, 2]^2, three classes drawn from a softmax of
  :math:`3(\\sin 2x_1, x_2, -x_1 x_2)`.

N training rows and 1,000 test rows from the same generator. gpvi: ``GPClassifier(random_state=0)`` (logit for two
classes, softmax for three; full-batch CVI; type-II with the default N(0, 10 I) prior; ARD RBF kernel with a
signal variance), and with ``--stochastic`` also ``mode="stochastic"``. scikit-learn:
``GaussianProcessClassifier(ConstantKernel() * RBF([1, 1]), random_state=0)`` (Laplace; one-vs-rest for three
classes, so its 3-class model differs from gpvi's). Columns: fit wall time (s; median of ``--repeats`` fits, one
by default since a fit at N = 2,000 takes a minute here), test log loss (nats), the ratio gpvi / scikit-learn, and
gpvi's factorisations of :math:`K + S` (type-II: theta evaluations, inner CVI steps and outer steps; each outer or
inner step is one factorisation per latent function). Threads and load are in the header.

``--fixed``: full-batch against single-site CVI at the kernel's start (``hyperparameters="fixed"``, binary task,
``max_sweeps=200``): wall, steps, sweeps and the ELBO reached, to find where single-site steps pay.

``--probe``: the pieces of a binary type-II fit at each size, for sizes where a whole fit takes too long here
(N = 10,000): the first CVI run at the start theta (coarse tolerance, as the fit's first run), then one evaluation of
the profiled objective at theta + 0.1 (inner run + kernel gradient: the largest buffers of the fit); wall of each
and the process's peak resident memory.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.classification_scale [--sizes 500 1000 2000]
[--tasks binary 3class] [--repeats 1] [--stochastic] [--no-sklearn] [--fixed --name classification_scale_fixed]
[--probe --sizes 10000 --name classification_scale_probe]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np

from benchmarks._common import header, write


def make_data(task: str, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(X_train, y_train, X_test, y_test)``: ``n`` training rows and 1,000 test rows of ``task``."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2.0, 2.0, size=(n + 1000, 2))
    if task == "binary":
        p = 1.0 / (1.0 + np.exp(-3.0 * (np.sin(2.0 * X[:, 0]) + 0.5 * X[:, 1] ** 2 - 0.8)))
        y = (rng.uniform(size=n + 1000) < p).astype(int)
    else:
        f = 3.0 * np.stack([np.sin(2.0 * X[:, 0]), X[:, 1], -X[:, 0] * X[:, 1]], 1)
        P = np.exp(f - f.max(1, keepdims=True))
        P /= P.sum(1, keepdims=True)
        y = (rng.uniform(size=(n + 1000, 1)) > P.cumsum(1)).sum(1)
    return X[:n], y[:n], X[n:], y[n:]


def log_loss(P: np.ndarray, y: np.ndarray) -> float:
    """Mean negative log probability of the true labels."""
    return float(-np.mean(np.log(np.clip(P[np.arange(len(y)), y], 1e-300, None))))


def fit_gpvi(X: np.ndarray, y: np.ndarray, mode: str) -> tuple[object, float]:
    from gpvi import GPClassifier

    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = GPClassifier(mode=mode, random_state=0).fit(X, y)
    return clf, time.perf_counter() - t


def fit_sklearn(X: np.ndarray, y: np.ndarray) -> tuple[object, float]:
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = GaussianProcessClassifier(ConstantKernel(1.0) * RBF([1.0, 1.0]), random_state=0).fit(X, y)
    return clf, time.perf_counter() - t


def run(sizes: list[int], tasks: list[str], repeats: int, stochastic: bool, sklearn: bool) -> tuple[str, list]:
    rows = []
    lines = ["| task | N | gpvi mode | gpvi fit (s) | gpvi log loss | sklearn fit (s) | sklearn log loss | "
             "ratio gpvi/sklearn | theta evaluations | inner steps | outer steps |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for task in tasks:
        for n in sizes:
            Xtr, ytr, Xte, yte = make_data(task, n)
            sk_wall, sk_ll = float("nan"), float("nan")
            if sklearn:
                walls = []
                for _ in range(repeats):
                    sk, w = fit_sklearn(Xtr, ytr)
                    walls.append(w)
                sk_wall, sk_ll = statistics.median(walls), log_loss(sk.predict_proba(Xte), yte)
            for mode in ["full", "stochastic"] if stochastic else ["full"]:
                walls = []
                for _ in range(repeats):
                    clf, w = fit_gpvi(Xtr, ytr, mode)
                    walls.append(w)
                wall, info = statistics.median(walls), clf.posterior_.info
                ll = log_loss(clf.predict_proba(Xte), yte)
                row = {"task": task, "N": n, "mode": mode, "gpvi_s": wall, "gpvi_log_loss": ll,
                       "sklearn_s": sk_wall, "sklearn_log_loss": sk_ll, "ratio": wall / sk_wall,
                       "theta_evaluations": info.get("theta_evaluations"), "inner_steps": info.get("inner_steps"),
                       "steps": info.get("steps"), "walls": walls}
                rows.append(row)
                lines.append(f"| {task} | {n} | {mode} | {wall:.1f} | {ll:.4f} | {sk_wall:.1f} | {sk_ll:.4f} | "
                             f"{row['ratio']:.2f} | {row['theta_evaluations']} | {row['inner_steps']} | "
                             f"{row['steps']} |")
                print(lines[-1], flush=True)
    return "\n".join(lines) + "\n", rows


def run_fixed(sizes: list[int], repeats: int) -> tuple[str, list]:
    """Full-batch against single-site CVI at fixed hyperparameters (the kernel's start), binary task: fit wall,
    steps, sweeps and the ELBO each reaches (issue 41, item 4: where do single-site steps pay?)."""
    from gpvi import GPClassifier

    rows = []
    lines = ["| N | mode | fit (s) | steps | sweeps | ELBO |", "|---|---|---|---|---|---|"]
    for n in sizes:
        Xtr, ytr, _, _ = make_data("binary", n)
        for mode in ("full", "stochastic"):
            walls = []
            for _ in range(repeats):
                t = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    clf = GPClassifier(mode=mode, hyperparameters="fixed", max_sweeps=200,
                                       random_state=0).fit(Xtr, ytr)
                walls.append(time.perf_counter() - t)
            info = clf.posterior_.info
            row = {"N": n, "mode": mode, "s": statistics.median(walls), "steps": info["steps"],
                   "sweeps": info["sweeps"], "elbo": clf.elbo_, "walls": walls}
            rows.append(row)
            lines.append(f"| {n} | {mode} | {row['s']:.2f} | {row['steps']} | {row['sweeps']:.1f} | {row['elbo']:.6f} |")
            print(lines[-1], flush=True)
    return "\n".join(lines) + "\n", rows


def run_probe(sizes: list[int]) -> tuple[str, list]:
    """First CVI run and one profiled-objective evaluation of a binary type-II fit per size: walls, peak memory."""
    import copy
    import resource

    import torch

    from gpvi import GPClassifier
    from gpvi.inference.cvi.inner import profiled_objective
    from gpvi.inference.cvi.typeii import COARSE, TypeII
    from gpvi.models.classification import GPClassification
    from gpvi.models.priors import resolve_prior

    rows = []
    lines = ["| N | first CVI run (s) | its steps | one theta evaluation (s) | its inner steps | peak RSS (GB) |",
             "|---|---|---|---|---|---|"]
    for n in sizes:
        X, y, _, _ = make_data("binary", n)
        model = GPClassification(torch.tensor(X), torch.tensor(y), likelihood="logit")
        engine = GPClassifier(random_state=0)._binary_engine(n, 0)
        loop = TypeII(engine)
        engine._configure(model)
        first = copy.copy(loop._inner_engine(model))
        first.tol = max(engine.tol, COARSE["cvi_tol"])
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            st = first.run(model).engine_state
        t_run = time.perf_counter() - t
        t = time.perf_counter()
        inner, _, _ = profiled_objective(loop._inner_engine(model), model, st.theta + 0.1, st.lam1, st.lam2, {},
                                         tol=COARSE["inner_tol"], max_steps=loop.inner_num_steps,
                                         anderson=loop.anderson, prior=resolve_prior("default", model))
        t_eval = time.perf_counter() - t
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
        row = {"N": n, "first_run_s": t_run, "first_run_steps": st.t, "evaluation_s": t_eval,
               "evaluation_inner_steps": inner.t, "peak_rss_gb": peak}
        rows.append(row)
        lines.append(f"| {n} | {t_run:.1f} | {st.t} | {t_eval:.1f} | {inner.t} | {peak:.2f} |")
        print(lines[-1], flush=True)
    return "\n".join(lines) + "\n", rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[500, 1000, 2000])
    ap.add_argument("--tasks", nargs="+", default=["binary", "3class"], choices=["binary", "3class"])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--stochastic", action="store_true")
    ap.add_argument("--no-sklearn", action="store_true")
    ap.add_argument("--fixed", action="store_true", help="full-batch against single-site CVI at fixed theta")
    ap.add_argument("--probe", action="store_true", help="first CVI run + one theta evaluation: walls, peak memory")
    ap.add_argument("--name", default="classification_scale")
    args = ap.parse_args()
    if args.probe:
        table, rows = run_probe(args.sizes)
        md = header("Binary type-II fit at large N: its first CVI run and one theta evaluation") + "\n" + table
        print(write(args.name, md, {"rows": rows}))
        return
    if args.fixed:
        table, rows = run_fixed(args.sizes, args.repeats)
        md = header("CVI at fixed hyperparameters: full-batch against single-site steps") + "\n" + table
        print(write(args.name, md, {"rows": rows}))
        return
    table, rows = run(args.sizes, args.tasks, args.repeats, args.stochastic, not args.no_sklearn)
    md = header("GP classification at scale: gpvi type-II against scikit-learn's GPC") + "\n" + table
    print(write(args.name, md, {"rows": rows}))


if __name__ == "__main__":
    main()
