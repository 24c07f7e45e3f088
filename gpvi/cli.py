"""The ``gpvi`` command (``python -m gpvi`` or the ``gpvi`` console script).

Subcommands
-----------
``demo``            the README's main job: ML-II and DSVI on Bodyfat, a CVI classifier on Pima (``--quick``: smoke run)
``fit-regression``  GP regression on a user's CSV (``--target COLUMN``): ML-II, DSVI or NUTS; summary; ``--save``
``fit-classifier``  GP classification with CVI on a user's CSV; summary; ``--save``
``bench``           run benchmark scripts of ``benchmarks/`` (``table5``, ``cvi``, ``scaling``, or one script by
                    name) from a source checkout; results go to ``benchmarks/results/`` or ``--out DIR``

Bad input (a missing file or column, an empty file, non-numeric cells, NaN/inf, a bad label set) ends with one
line ``gpvi: error: ...`` on stderr and exit status 2 — no traceback. Library warnings are printed as one line
``gpvi: warning: ...`` each. Ctrl-C exits with status 130.

A saved fit (``--save FILE``) is read back with :func:`load_fit`, which rebuilds the posterior (regression) or the
fitted :class:`gpvi.GPClassifier` and predicts on new inputs in the CSV's original units.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["main", "build_parser", "load_csv", "load_fit", "SavedFit", "CLIError"]

_FORMAT = "gpvi-fit-1"


class CLIError(Exception):
    """An error reported to the user as one line, exit status 2."""


# --------------------------------------------------------------------------- CSV input
def load_csv(path: str | os.PathLike, target: str) -> tuple[Any, Any, list[str]]:
    """Read a numeric CSV with a header row; return ``(X, y, feature_names)`` as float64 numpy arrays.

    Parameters
    ----------
    path : str or path-like
        CSV file: one header row, comma-separated, every cell a finite number. Blank lines are skipped.
    target : str
        Name of the target (or label) column; every other column is an input.

    Returns
    -------
    X : numpy.ndarray of shape (n, d)
    y : numpy.ndarray of shape (n,)
    feature_names : list of str, length d

    Raises
    ------
    CLIError
        Missing/empty/undecodable file, missing target column, duplicate column names, ragged rows, non-numeric or
        empty cells, NaN/inf values, fewer than 2 rows or no feature columns — the message names the file, column
        and line.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from gpvi.cli import load_csv
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "d.csv"
    >>> _ = p.write_text("a,b,y\\n1,2,0.5\\n3,4,1.5\\n")
    >>> X, y, names = load_csv(p, "y")
    >>> X.shape, y.tolist(), names
    ((2, 2), [0.5, 1.5], ['a', 'b'])
    """
    import numpy as np

    p = Path(path)
    if not p.is_file():
        raise CLIError(f"{p}: no such file")
    try:
        with p.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            try:
                header = next(reader)
            except StopIteration:
                raise CLIError(f"{p}: the file is empty") from None
            header = [h.strip() for h in header]
            if target not in header:
                raise CLIError(f"{p}: no column {target!r}; columns are {', '.join(header)}")
            dup = sorted({h for h in header if header.count(h) > 1})
            if dup:
                raise CLIError(f"{p}: duplicate column name(s) {', '.join(map(repr, dup))} in the header")
            if len(header) < 2:
                raise CLIError(f"{p}: needs at least one feature column besides {target!r}")
            rows = []
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
                        what = "an empty cell" if not c else f"non-numeric value {c!r}"
                        raise CLIError(f"{p}, line {lineno}, column {col!r}: {what}") from None
                    if not math.isfinite(v):
                        raise CLIError(f"{p}, line {lineno}, column {col!r}: {c!r} is not a finite number")
                    vals.append(v)
                rows.append(vals)
    except csv.Error as exc:
        raise CLIError(f"{p}: malformed CSV ({exc})") from None
    except UnicodeDecodeError:
        raise CLIError(f"{p}: not a text (UTF-8) CSV file") from None
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


# --------------------------------------------------------------------------- saved fits
@dataclass
class SavedFit:
    """A fit saved by ``gpvi fit-regression/fit-classifier --save FILE`` and read back by :func:`load_fit`.

    Attributes
    ----------
    kind : {"regression", "classification"}
    method : str
        ``"ml2"``, ``"dsvi"`` or ``"nuts"`` (regression) or ``"cvi-full"`` / ``"cvi-stochastic"``.
    features : list of str
        Input column names, in the order :meth:`predict` expects.
    target : str
        Name of the target column.
    posterior : PointPosterior, GaussianPosterior or SamplePosterior, or None
        Regression: the posterior over log-hyperparameters, with its :class:`gpvi.GPRegression` target rebuilt
        on the (standardised) training data, so ``posterior.predict`` and ``posterior.summary()`` work.
    classifier : GPClassifier or None
        Classification: the fitted estimator (it expects standardised inputs; use :meth:`predict`).
    x_mean, x_std : numpy.ndarray of shape (d,)
        Input standardisation of the training CSV.
    y_mean, y_std : float
        Target standardisation (regression; 0 and 1 for classification).
    """

    kind: str
    method: str
    features: list[str]
    target: str
    x_mean: Any
    x_std: Any
    y_mean: float = 0.0
    y_std: float = 1.0
    posterior: Any = None
    classifier: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def predict(self, X: Any, num_draws: int = 200) -> Any:
        """Predict at raw (unstandardised) inputs ``X`` of shape ``(n, d)``.

        Returns
        -------
        (mean, var) : tuple of numpy.ndarray of shape (n,)
            Regression: mean and variance of the predictive of y* in the CSV's units (a mixture over
            ``num_draws`` hyperparameter draws for DSVI/NUTS).
        p : numpy.ndarray of shape (n,)
            Classification: probability of the larger label (``classifier.classes_[1]``).
        """
        import numpy as np

        Xs = (np.asarray(X, dtype=np.float64) - self.x_mean) / self.x_std
        if self.kind == "classification":
            return self.classifier.predict_proba(Xs)[:, 1]
        pred = self.posterior.predict(Xs, num_draws=num_draws)
        mean = pred.mean.detach().cpu().numpy() * self.y_std + self.y_mean
        var = pred.var.detach().cpu().numpy() * self.y_std ** 2
        return mean, var


def load_fit(path: str | os.PathLike) -> SavedFit:
    """Read a file written by ``gpvi fit-regression --save`` or ``gpvi fit-classifier --save``.

    Regression files hold only tensors, numbers and strings and are read with ``torch.load(weights_only=True)``.
    Classification files hold a pickled :class:`gpvi.GPClassifier` and are read with ``weights_only=False``:
    load only files you made yourself.

    Parameters
    ----------
    path : str or path-like

    Returns
    -------
    SavedFit

    Raises
    ------
    ValueError
        The file is not a gpvi fit.

    Examples
    --------
    >>> from gpvi.cli import load_fit
    >>> fit = load_fit("model.pt")            # doctest: +SKIP
    >>> mean, var = fit.predict(X_new)        # doctest: +SKIP
    """
    import numpy as np
    import torch

    import gpvi
    from .posteriors.base import GaussianPosterior, PointPosterior, SamplePosterior

    path = Path(path)
    try:
        payload = torch.load(path, weights_only=True)
    except Exception:
        payload = torch.load(path, weights_only=False)      # classifier files pickle the estimator
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
        raise ValueError(f"{path} is not a fit saved by the gpvi command (format {_FORMAT!r})")
    common = dict(method=payload["method"], features=list(payload["features"]), target=payload["target"],
                  x_mean=np.asarray(payload["x_mean"], dtype=np.float64),
                  x_std=np.asarray(payload["x_std"], dtype=np.float64))
    if payload["kind"] == "classification":
        return SavedFit(kind="classification", classifier=payload["classifier"], **common)
    model = gpvi.GPRegression(payload["X_train"], payload["y_train"])
    st = payload["posterior"]
    if st["kind"] == "point":
        post = PointPosterior(st["theta"], list(st["names"]), model, value=st.get("value", math.nan),
                              info=st.get("info"))
    elif st["kind"] == "gaussian":
        post = GaussianPosterior.from_state_dict(st, target=model)
    else:
        post = SamplePosterior(st["draws"], list(st["names"]), model, info=st.get("info"))
    return SavedFit(kind="regression", posterior=post, y_mean=float(payload["y_mean"]),
                    y_std=float(payload["y_std"]), **common)


# --------------------------------------------------------------------------- commands
def _cmd_fit_regression(args: argparse.Namespace) -> int:
    X, y, names = load_csv(args.csv, args.target)          # bad input fails before any heavy work
    Xs, ys, (mu, sd, ym, ysd) = _standardise(X, y)
    import torch

    import gpvi

    model = gpvi.GPRegression(Xs, ys)
    progress = not args.no_progress
    t0 = time.perf_counter()
    fit = gpvi.ML2(num_restarts=args.restarts, seed=args.seed, progress_bar=progress).run(model)
    if args.method == "ml2":
        post = fit
    elif args.method == "dsvi":
        kw = {} if args.num_steps is None else {"num_steps": args.num_steps}
        post = gpvi.DSVI(scale="full", seed=args.seed, progress_bar=progress, **kw).run(model, init=fit)
    else:
        kw = {} if args.num_steps is None else {"num_samples": args.num_steps}
        post = gpvi.NUTS(num_chains=args.chains, num_warmup=args.warmup, seed=args.seed, progress_bar=progress,
                         **kw).run(model, init=fit)
    elapsed = time.perf_counter() - t0
    print(f"GP regression on {args.csv}: N = {len(y)}, d = {X.shape[1]}, method {args.method}, {elapsed:.1f} s. "
          f"Inputs and target standardised (target mean {ym:.4g}, sd {ysd:.4g}); lengthscales are in units of each "
          "input's training sd.")
    print("inputs: " + ", ".join(f"[{j}] {n}" for j, n in enumerate(names)))
    if args.method == "dsvi":
        print(f"ELBO {post.elbo:.4f} +- {post.elbo_se:.4f}, {post.info['steps']} steps, "
              f"converged: {post.info['converged']}")
    elif args.method == "ml2":
        print(f"log marginal likelihood {post.value:.4f}")
    print(post.summary())
    if args.save:
        payload = {"format": _FORMAT, "kind": "regression", "method": args.method,
                   "posterior": post.state_dict(), "features": names, "target": args.target,
                   "x_mean": torch.as_tensor(mu), "x_std": torch.as_tensor(sd), "y_mean": ym, "y_std": ysd,
                   "X_train": torch.as_tensor(Xs), "y_train": torch.as_tensor(ys)}
        _save(payload, args.save)
    return 0


def _cmd_fit_classifier(args: argparse.Namespace) -> int:
    X, y, names = load_csv(args.csv, args.target)
    import torch

    import gpvi

    try:
        _, classes = gpvi.validation.check_binary_labels(y, f"column {args.target!r}")
    except ValueError as exc:
        raise CLIError(f"{args.csv}: {exc}") from None
    Xs, _, (mu, sd, _, _) = _standardise(X)
    clf = gpvi.GPClassifier(likelihood=args.likelihood, mode=args.mode, random_state=args.seed,
                            progress_bar=not args.no_progress)
    t0 = time.perf_counter()
    clf.fit(Xs, y)
    elapsed = time.perf_counter() - t0
    p = clf.predict_proba(Xs)[:, 1]
    y01 = (y == classes[1]).astype(float)
    print(f"GP classification on {args.csv}: N = {len(y)}, d = {X.shape[1]} ({', '.join(names)}), classes "
          f"{classes.tolist()} (positive: {classes[1]}), link {args.likelihood}, CVI mode {args.mode}, "
          f"{elapsed:.1f} s. Inputs standardised.")
    print(f"ELBO {clf.elbo_:.4f}   training error {gpvi.metrics.error_rate(p, y01):.4f}   "
          f"training log-loss {gpvi.metrics.log_loss_bits(p, y01):.4f} bits")
    print(clf.posterior_.summary())
    if args.save:
        payload = {"format": _FORMAT, "kind": "classification", "method": f"cvi-{args.mode}", "classifier": clf,
                   "features": names, "target": args.target, "x_mean": torch.as_tensor(mu),
                   "x_std": torch.as_tensor(sd), "classes": classes.tolist()}
        _save(payload, args.save)
    return 0


def _save(payload: dict[str, Any], path: str) -> None:
    import torch

    try:
        torch.save(payload, path)
    except OSError as exc:
        raise CLIError(f"cannot write {path}: {exc.strerror or exc}") from None
    print(f"saved to {path} (read it back with gpvi.cli.load_fit)")


_BENCH = {
    "table5": ["dsvi_table5"],
    "cvi": ["cvi_classification"],
    "scaling": ["logjoint_cost", "cvi_step_cost", "dsvi_cost"],
}


def _bench_root() -> Path:
    return Path(__file__).resolve().parents[1] / "benchmarks"


def _bench_scripts() -> list[str]:
    root = _bench_root()
    if not root.is_dir():
        return []
    return sorted(p.stem for p in root.glob("*.py") if not p.stem.startswith("_") and p.stem != "runner")


def _cmd_bench(args: argparse.Namespace) -> int:
    root = _bench_root()
    if not root.is_dir():
        raise CLIError("gpvi bench needs a source checkout (the benchmarks/ folder next to gpvi/)")
    scripts = _BENCH.get(args.which, [args.which])
    available = _bench_scripts()
    for s in scripts:
        if s not in available:
            raise CLIError(f"no benchmark {args.which!r}: benchmarks/{s}.py not found; choose one of "
                           f"{', '.join(sorted(_BENCH))} or a script: {', '.join(available)}")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join([str(root.parent)] + [p for p in [env.get("PYTHONPATH")] if p])
    if args.out:
        out = Path(args.out).resolve()
        out.mkdir(parents=True, exist_ok=True)
        env["GPVI_BENCH_OUT"] = str(out)
    for s in scripts:
        cmd = [sys.executable, "-m", f"benchmarks.{s}"] + (["--quick"] if args.quick else [])
        print("running:", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd, env=env, cwd=str(root.parent))
        if rc != 0:
            raise CLIError(f"benchmarks/{s}.py failed with exit status {rc}")
    where = env.get("GPVI_BENCH_OUT") or str(root / "results")
    print(f"results in {where}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    return run_demo(quick=args.quick, seed=args.seed, progress_bar=not args.no_progress)


# --------------------------------------------------------------------------- parser
def _nonneg_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer; got {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer; got {v}")
    return v


def _pos_int(s: str) -> int:
    v = _nonneg_int(s)
    if v == 0:
        raise argparse.ArgumentTypeError("expected a positive integer; got 0")
    return v


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``gpvi`` command (all subcommands)."""
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="gpvi", description="Gaussian-process inference: DSVI hyperparameter posteriors, CVI classification, "
        "ML-II and NUTS baselines. Run 'gpvi COMMAND --help' for the options of a command.")
    parser.add_argument("--version", action="version", version=f"gpvi {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
        p.add_argument("--no-progress", action="store_true", help="turn progress bars off")

    p = sub.add_parser("demo", help="the main demonstration on bundled data (about 1-2 minutes)",
                       description="ML-II and DSVI hyperparameter posteriors on Bodyfat (test SMSE/NLPD, the most "
                       "relevant hyperparameter marginals) and a CVI GPClassifier on Pima (test error, log-loss); "
                       "prints a summary table.")
    p.add_argument("--quick", action="store_true", help="smoke run with few iterations (a few seconds)")
    common(p)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("fit-regression", help="GP regression on a CSV file",
                       description="Fit a GP regression (ScaleKernel(RBF, ARD) + Gaussian noise, prior N(0, 10) "
                       "on the log-hyperparameters) to a CSV file with a header row and numeric columns. Inputs "
                       "and target are standardised.")
    p.add_argument("csv", help="CSV file with a header row, numeric columns")
    p.add_argument("--target", required=True, help="name of the target column")
    p.add_argument("--method", choices=["ml2", "dsvi", "nuts"], default="dsvi",
                   help="ML-II point estimate, DSVI posterior (default) or NUTS")
    p.add_argument("--restarts", type=_pos_int, default=3,
                   help="ML-II restarts (also the DSVI/NUTS initialisation; default 3)")
    p.add_argument("--num-steps", type=_pos_int, default=None,
                   help="DSVI steps, or NUTS draws per chain (default: the engine's default)")
    p.add_argument("--chains", type=_pos_int, default=4, help="NUTS chains (default 4)")
    p.add_argument("--warmup", type=_nonneg_int, default=500, help="NUTS warm-up transitions per chain (default 500)")
    p.add_argument("--save", metavar="FILE", help="save the posterior to FILE (read back with gpvi.cli.load_fit)")
    common(p)
    p.set_defaults(func=_cmd_fit_regression)

    p = sub.add_parser("fit-classifier", help="GP classification with CVI on a CSV file",
                       description="Fit a GPClassifier (CVI, type-II hyperparameters) to a CSV file with a header "
                       "row, numeric inputs and a binary label column ({0, 1} or {-1, +1}). Inputs are "
                       "standardised.")
    p.add_argument("csv", help="CSV file with a header row, numeric columns")
    p.add_argument("--target", required=True, help="name of the label column ({0,1} or {-1,+1})")
    p.add_argument("--likelihood", choices=["logit", "probit"], default="logit", help="link (default logit)")
    p.add_argument("--mode", choices=["full", "stochastic"], default="full",
                   help="full-batch CVI (default) or doubly stochastic single-site steps")
    p.add_argument("--save", metavar="FILE", help="save the fitted classifier to FILE (read back with "
                   "gpvi.cli.load_fit)")
    common(p)
    p.set_defaults(func=_cmd_fit_classifier)

    scripts = _bench_scripts()
    p = sub.add_parser("bench", help="run a benchmark from benchmarks/ (source checkout)",
                       description="Run benchmark scripts of benchmarks/ (each records date, machine, threads, "
                       "load and command in its result files). Groups: table5 = dsvi_table5; cvi = "
                       "cvi_classification; scaling = logjoint_cost, cvi_step_cost, dsvi_cost. Any script can "
                       "also be named directly" + (f": {', '.join(scripts)}." if scripts else "."))
    p.add_argument("which", metavar="WHICH", help="table5, cvi, scaling, or a script name (without .py)")
    p.add_argument("--out", metavar="DIR", help="write results to DIR instead of benchmarks/results")
    p.add_argument("--quick", action="store_true", help="reduced sizes and repeats")
    p.set_defaults(func=_cmd_bench)
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message).strip().splitlines()[0] if str(message).strip() else ""
    print(f"gpvi: warning: {category.__name__}: {text}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpvi`` command; returns the exit status (0 success, 2 bad input, 130 Ctrl-C).

    Parameters
    ----------
    argv : list of str, optional
        Arguments (default ``sys.argv[1:]``).

    Examples
    --------
    >>> from gpvi.cli import main
    >>> main(["fit-regression", "missing.csv", "--target", "y"])   # prints "gpvi: error: missing.csv: no such file"
    2
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:           # --help, --version, usage errors: argparse has printed its message
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    from .exceptions import NumericalFaultError

    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        try:
            return int(args.func(args))
        except CLIError as exc:
            print(f"gpvi: error: {exc}", file=sys.stderr)
            return 2
        except (ValueError, TypeError, MemoryError, NumericalFaultError) as exc:   # library errors: one line
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            print(f"gpvi: error: {msg}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("gpvi: interrupted", file=sys.stderr)
            return 130
