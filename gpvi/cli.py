"""The ``gpvi`` command (``python -m gpvi`` or the ``gpvi`` console script).

Subcommands
-----------
``demo``            the README's main job: ML-II and DSVI on Bodyfat, a CVI classifier on Pima (``--quick``: smoke run)
``fit-regression``  GP regression on a user's CSV (``--target COLUMN``): ML-II, DSVI or NUTS; summary; ``--save``
``fit-classifier``  GP classification with CVI on a user's CSV; summary; ``--save``
``bench``           run a benchmark of ``benchmarks/`` (``table5``, ``cvi``, ``scaling``) from a source checkout

Bad input (a missing file or column, non-numeric cells, NaN, a bad label set) ends with one line
``gpvi: error: ...`` on stderr and exit status 2 — no traceback.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "load_csv", "CLIError"]


class CLIError(Exception):
    """An error reported to the user as one line, exit status 2."""


# --------------------------------------------------------------------------- CSV input
def load_csv(path: str | os.PathLike, target: str) -> tuple[Any, Any, list[str]]:
    """Read a numeric CSV with a header row; return ``(X, y, feature_names)`` as float64 numpy arrays.

    Raises
    ------
    CLIError
        Missing/empty file, missing target column, non-numeric or empty cells, NaN/inf values, fewer than 2 rows
        or no feature columns — the message names the file, column and line.
    """
    import numpy as np

    p = Path(path)
    if not p.is_file():
        raise CLIError(f"{p}: no such file")
    with p.open(newline="") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise CLIError(f"{p}: the file is empty") from None
        except csv.Error as exc:
            raise CLIError(f"{p}: not a CSV file ({exc})") from None
        header = [h.strip() for h in header]
        if target not in header:
            raise CLIError(f"{p}: no column {target!r}; columns are {', '.join(header)}")
        if len(header) < 2:
            raise CLIError(f"{p}: needs at least one feature column besides {target!r}")
        rows = []
        try:
            for lineno, row in enumerate(reader, start=2):
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(header):
                    raise CLIError(f"{p}, line {lineno}: {len(row)} fields but the header has {len(header)}")
                vals = []
                for col, cell in zip(header, row):
                    c = cell.strip()
                    try:
                        v = float(c)
                    except ValueError:
                        raise CLIError(f"{p}, line {lineno}, column {col!r}: non-numeric value {c!r}") from None
                    if not math.isfinite(v):
                        raise CLIError(f"{p}, line {lineno}, column {col!r}: {c!r} is not a finite number")
                    vals.append(v)
                rows.append(vals)
        except csv.Error as exc:
            raise CLIError(f"{p}: malformed CSV ({exc})") from None
    if len(rows) < 2:
        raise CLIError(f"{p}: needs at least 2 data rows; found {len(rows)}")
    data = np.asarray(rows, dtype=np.float64)
    j = header.index(target)
    features = [h for i, h in enumerate(header) if i != j]
    return np.delete(data, j, axis=1), data[:, j], features


def _standardise(X, y=None):
    mu, sd = X.mean(0), X.std(0)
    sd[sd == 0] = 1.0
    Xs = (X - mu) / sd
    if y is None:
        return Xs, None, (mu, sd, 0.0, 1.0)
    ym, ys = float(y.mean()), float(y.std())
    if ys == 0:
        raise CLIError("the target column is constant; there is nothing to regress")
    return Xs, (y - ym) / ys, (mu, sd, ym, ys)


# --------------------------------------------------------------------------- commands
def _cmd_fit_regression(args: argparse.Namespace) -> int:
    import torch

    import gpvi

    X, y, names = load_csv(args.csv, args.target)
    Xs, ys, (mu, sd, ym, ysd) = _standardise(X, y)
    model = gpvi.GPRegression(Xs, ys)
    t0 = time.perf_counter()
    fit = gpvi.ML2(num_restarts=args.restarts, seed=args.seed, progress_bar=not args.no_progress).run(model)
    if args.method == "ml2":
        post = fit
    elif args.method == "dsvi":
        kw = {} if args.num_steps is None else {"num_steps": args.num_steps}
        post = gpvi.DSVI(scale="full", seed=args.seed, progress_bar=not args.no_progress, **kw).run(model, init=fit)
    else:
        kw = {} if args.num_steps is None else {"num_samples": args.num_steps}
        post = gpvi.NUTS(seed=args.seed, progress_bar=not args.no_progress, **kw).run(model, init=fit)
    elapsed = time.perf_counter() - t0
    print(f"GP regression on {args.csv}: N = {len(y)}, d = {X.shape[1]} ({', '.join(names)}), "
          f"method {args.method}, {elapsed:.1f} s. Inputs and target standardised (target mean {ym:.4g}, sd {ysd:.4g}).")
    print(post.summary())
    if args.save:
        payload = {"posterior": post.state_dict(), "features": names, "target": args.target,
                   "x_mean": torch.as_tensor(mu), "x_std": torch.as_tensor(sd), "y_mean": ym, "y_std": ysd,
                   "method": args.method}
        torch.save(payload, args.save)
        print(f"saved to {args.save}")
    return 0


def _cmd_fit_classifier(args: argparse.Namespace) -> int:
    import torch

    import gpvi

    X, y, names = load_csv(args.csv, args.target)
    try:
        y01, classes = gpvi.validation.check_binary_labels(y, f"column {args.target!r}")
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    Xs, _, (mu, sd, _, _) = _standardise(X)
    clf = gpvi.GPClassifier(likelihood=args.likelihood, mode=args.mode, random_state=args.seed,
                            progress_bar=not args.no_progress)
    t0 = time.perf_counter()
    clf.fit(Xs, y)
    elapsed = time.perf_counter() - t0
    p = clf.predict_proba(Xs)[:, 1]
    print(f"GP classification on {args.csv}: N = {len(y)}, d = {X.shape[1]}, link {args.likelihood}, "
          f"CVI mode {args.mode}, {elapsed:.1f} s")
    print(f"ELBO {clf.elbo_:.4f}   training error {gpvi.metrics.error_rate(p, y):.4f}   "
          f"training log-loss {gpvi.metrics.log_loss_bits(p, y):.4f} bits")
    theta = getattr(clf, "theta_", None)
    if theta is not None:
        kp = clf.posterior_.model.kernel_params if hasattr(clf.posterior_, "model") else None
        if kp is not None:
            for n, v in zip(kp.natural_names, kp.natural(torch.as_tensor(theta)).tolist()):
                print(f"  {n:24s} {v:.4g}")
    if args.save:
        torch.save({"classifier": clf, "features": names, "x_mean": mu, "x_std": sd, "classes": classes},
                   args.save)
        print(f"saved to {args.save}")
    return 0


_BENCH = {
    "table5": ["dsvi_table5.py"],
    "cvi": ["cvi_benchmark.py"],
    "scaling": ["logjoint_cost.py", "cvi_step_cost.py"],
}


def _cmd_bench(args: argparse.Namespace) -> int:
    root = Path(__file__).resolve().parents[1] / "benchmarks"
    if not root.is_dir():
        raise CLIError("gpvi bench needs a source checkout (the benchmarks/ folder next to gpvi/)")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    if args.out:
        env["GPVI_BENCH_OUT"] = str(Path(args.out).resolve())
    for script in _BENCH[args.which]:
        path = root / script
        if not path.is_file():
            raise CLIError(f"benchmark script {path} not found")
        cmd = [sys.executable, str(path)] + (["--quick"] if args.quick else [])
        print("running:", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd, env=env)
        if rc != 0:
            raise CLIError(f"{script} failed with exit status {rc}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    return run_demo(quick=args.quick, seed=args.seed, progress_bar=not args.no_progress)


# --------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpvi", description="Gaussian-process inference: DSVI hyperparameter "
                                     "posteriors, CVI classification, ML-II and NUTS baselines.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
        p.add_argument("--no-progress", action="store_true", help="turn progress bars off")

    p = sub.add_parser("demo", help="the main demonstration on bundled data (about 2 minutes)")
    p.add_argument("--quick", action="store_true", help="smoke run with few iterations")
    common(p)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("fit-regression", help="GP regression on a CSV file")
    p.add_argument("csv", help="CSV file with a header row, numeric columns")
    p.add_argument("--target", required=True, help="name of the target column")
    p.add_argument("--method", choices=["ml2", "dsvi", "nuts"], default="dsvi",
                   help="ML-II point estimate, DSVI posterior (default) or NUTS")
    p.add_argument("--restarts", type=int, default=3, help="ML-II restarts (also the DSVI/NUTS initialisation)")
    p.add_argument("--num-steps", type=int, default=None, help="DSVI steps or NUTS draws per chain")
    p.add_argument("--save", metavar="FILE", help="save the posterior (torch.save) to FILE")
    common(p)
    p.set_defaults(func=_cmd_fit_regression)

    p = sub.add_parser("fit-classifier", help="GP classification with CVI on a CSV file")
    p.add_argument("csv", help="CSV file with a header row, numeric columns")
    p.add_argument("--target", required=True, help="name of the label column ({0,1} or {-1,+1})")
    p.add_argument("--likelihood", choices=["logit", "probit"], default="logit")
    p.add_argument("--mode", choices=["full", "stochastic"], default="full")
    p.add_argument("--save", metavar="FILE", help="save the fitted classifier (torch.save) to FILE")
    common(p)
    p.set_defaults(func=_cmd_fit_classifier)

    p = sub.add_parser("bench", help="run a benchmark from benchmarks/ (source checkout)")
    p.add_argument("which", choices=sorted(_BENCH))
    p.add_argument("--out", metavar="DIR", help="write results to DIR instead of benchmarks/results")
    p.add_argument("--quick", action="store_true", help="reduced sizes and repeats")
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except CLIError as exc:
        print(f"gpvi: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, MemoryError) as exc:   # validation errors from the library: one line
        print(f"gpvi: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpvi: interrupted", file=sys.stderr)
        return 130
