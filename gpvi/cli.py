"""The ``gpvi`` command (``python -m gpvi`` or the ``gpvi`` console script).

Subcommands
-----------
``demo``            the README's main job: ML-II and DSVI on Bodyfat, a CVI classifier on Pima (``--quick``: smoke run)
``fit-regression``  GP regression on a user's CSV (``--target COLUMN``): ML-II, DSVI (``--num-steps``) or NUTS
                    (``--num-draws``, ``--chains``, ``--warmup``); summary; ``--save FILE``. With ``--likelihood
                    poisson|negative-binomial|student-t|laplace|beta``: counts, outliers or proportions
                    (:class:`gpvi.GPGeneralisedRegression`) by CVI, the kernel's and the likelihood's parameters by
                    type-II on the CVI bound (:mod:`gpvi._cli_generalised`)
``fit-classifier``  GP classification with CVI on a user's CSV (``--target COLUMN``: integer or text labels;
                    ``--hyperparameters type2|bayes|fixed``, ``--prior``, ``--weight COLUMN``); a short summary
                    (``--latent``: also the latent marginals and sites at every training point); ``--save FILE``
``predict``         ``gpvi predict FIT NEW.csv [--out OUT.csv]``: predictions of a saved fit at the rows of a CSV
                    that holds the fit's input columns (by name; other columns ignored). Regression: columns
                    ``mean``, ``sd`` in the CSV's units (a mixture over ``--num-draws`` hyperparameter draws for
                    DSVI/NUTS fits, ``--seed``), and for ``--likelihood`` fits also ``q5``, ``q95``, the central 90%
                    predictive interval of the target (integers for counts); classification: ``p_<label>`` per
                    class and the predicted ``label`` (the CSV's own labels, text included)
``bench``           run benchmark scripts of ``benchmarks/`` (``table5``, ``cvi``, ``scaling``, or one script by
                    name) from a source checkout; results go to ``benchmarks/results/`` or ``--out DIR``

Inputs of the fit commands: ``--features COL[,COL...]`` (exactly these, in this order) or ``--exclude
COL[,COL...]`` (every column but these, the target and the ``--weight`` column). Without ``--features``, a row-name
column (header empty, ``rownames``, ``Unnamed: 0``) is left out and an input holding the row numbers 1..N or 0..N-1
gets a warning naming ``--exclude`` (:mod:`gpvi._cli_csv`). A saved fit remembers its input columns; ``predict``
reads those by name.

Bad input (a missing file or column, non-numeric cells, NaN/inf, a column whose standard deviation overflows
float64, a bad label set, a flag that does not apply, a ``--save``/``--out`` path that cannot be written, a file that
is not a gpvi fit) ends with one line ``gpvi: error: ...`` on stderr and exit status 2, before any fitting starts.
Integers on the command line are digits only (``1_000`` is refused). Warnings are one line ``gpvi: warning: ...``
each. Summaries name per-input hyperparameters by the CSV header (``log_lengthscale_sq[nox]``).

Ctrl-C exits with status 130 and one line ``gpvi: interrupted ...``. The engines catch ``KeyboardInterrupt`` and
return their partial result with an :class:`~gpvi.exceptions.InterruptedRunWarning`; the command turns that warning
into an error, so the run stops there and **nothing is saved**. A second Ctrl-C stops at once.

A reader of the output that stops early (``gpvi fit-classifier ... --latent | head``) ends the command quietly with
exit status 141, as a command that SIGPIPE ended (no ``BrokenPipeError`` traceback).

A saved fit holds only tensors and a JSON description and is read back, without executing anything in the file,
by :func:`gpvi.io.load_fit` (``gpvi.cli.load_fit`` and ``gpvi.cli.SavedFit`` are the same objects), which rebuilds
the posterior (regression) or the fitted :class:`gpvi.GPClassifier` and predicts in the CSV's original units.

The fit verbs are :mod:`gpvi._cli_fit`; the CSV files :mod:`gpvi._cli_csv`; signals and warnings
:mod:`gpvi._cli_process`.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np

from . import __version__
from ._cli_csv import CLIError, check_output, load_csv, load_features, write_csv
from ._cli_fit import REGRESSION_ADVICE, advice, classifier_progress, fit_classifier, fit_regression
from ._cli_generalised import LIKELIHOODS, fit_generalised
from ._cli_process import Abort, closed_pipe_status, install_sigint, one_line_warning
from .allocator import set_malloc_thresholds
from .demo import run_demo
from .exceptions import InterruptedRunWarning, NumericalFaultError, advising
from .io import SavedFit, load_fit, save_fit

__all__ = ["main", "build_parser", "load_csv", "load_fit", "save_fit", "SavedFit", "CLIError", "REGRESSION_ADVICE"]

_progress = classifier_progress
"""How ``fit-classifier`` tells :class:`gpvi.GPClassifier` to show progress (:mod:`gpvi._cli_fit`)."""


def _fit_regression(args: argparse.Namespace) -> int:
    """``fit-regression``: the Gaussian model (:func:`gpvi._cli_fit.fit_regression`) or, with ``--likelihood``,
    a latent GP by CVI (:func:`gpvi._cli_generalised.fit_generalised`)."""
    return fit_regression(args) if args.likelihood == "gaussian" else fit_generalised(args)


def _cmd_predict(args: argparse.Namespace) -> int:
    out = check_output(args.out, "--out") if args.out else None
    fit = load_fit(args.fit)                          # ValueError (refused file) -> one line, exit 2
    if fit.kind == "classification" and args.num_draws is not None:
        raise CLIError(f"--num-draws applies to regression fits only; {args.fit} is a classifier")
    if fit.kind == "generalised_regression" and args.num_draws is not None:
        raise CLIError(f"--num-draws applies to Gaussian regression fits only; {args.fit} was fitted with --likelihood "
                       f"{fit.extra.get('likelihood', fit.posterior.model.link)} (CVI, type-II hyperparameters)")
    X = load_features(args.csv, fit.features)
    if fit.kind == "regression":
        mean, var = fit.predict(X, num_draws=200 if args.num_draws is None else args.num_draws, seed=args.seed)
        header = ["mean", "sd"]
        rows = [[repr(float(m)), repr(float(s))] for m, s in zip(mean, np.sqrt(var))]
    elif fit.kind == "generalised_regression":
        mean, var = fit.predict(X)
        lo, hi = fit.interval(X, 0.9)
        header = ["mean", "sd", "q5", "q95"]
        rows = [[repr(float(v)) for v in row] for row in zip(mean, np.sqrt(var), lo, hi)]
    else:
        proba = np.asarray(fit.predict_proba(X))
        classes = fit.classes
        header = [f"p_{c}" for c in classes] + ["label"]
        rows = [[repr(float(v)) for v in row] + [str(classes[int(row.argmax())])] for row in proba]
    write_csv(out, header, rows)
    if out is not None:
        print(f"wrote {len(rows)} predictions ({', '.join(header)}) to {out}")
    return 0


_BENCH = {"table5": ["dsvi_table5"], "cvi": ["cvi_classification"],
          "scaling": ["logjoint_cost", "cvi_step_cost", "dsvi_cost"]}


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
    env.setdefault("GPVI_MALLOC_THRESHOLDS", "1")       # benchmark processes as the results were measured
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
    return run_demo(quick=args.quick, seed=args.seed, progress_bar=not args.no_progress)


# --------------------------------------------------------------------------- parser
_INT = re.compile(r"-?[0-9]+")


def _nonneg_int(s: str) -> int:
    # int() also takes "1_000", " 7 " and non-ASCII digits; the command line takes plain digits only
    if not _INT.fullmatch(s):
        raise argparse.ArgumentTypeError(f"expected an integer written with the digits 0-9 only; got {s!r}")
    v = int(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer; got {v}")
    return v


def _pos_int(s: str) -> int:
    v = _nonneg_int(s)
    if v == 0:
        raise argparse.ArgumentTypeError("expected a positive integer; got 0")
    return v


def _columns(s: str) -> list[str]:
    """``COL[,COL...]``: column names as in the CSV's header (spaces around names ignored)."""
    return [c.strip() for c in s.split(",")]


def build_parser() -> argparse.ArgumentParser:
    """The :class:`argparse.ArgumentParser` of the ``gpvi`` command (all subcommands)."""

    parser = argparse.ArgumentParser(
        prog="gpvi", description="Gaussian-process inference: DSVI hyperparameter posteriors, CVI classification, "
        "ML-II and NUTS baselines. Run 'gpvi COMMAND --help' for the options of a command.")
    parser.add_argument("--version", action="version", version=f"gpvi {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser, inputs: bool = True) -> None:
        p.add_argument("--seed", type=_nonneg_int, default=0, help="random seed (default 0)")
        p.add_argument("--no-progress", action="store_true", help="turn progress bars off")
        if inputs:
            p.add_argument("--save", metavar="FILE", help="save the fit to FILE (checked before fitting; read back "
                           "with gpvi.io.load_fit or 'gpvi predict')")
            g = p.add_mutually_exclusive_group()
            g.add_argument("--features", metavar="COL[,COL...]", type=_columns, help="the input columns, in this "
                           "order (default: every column but the target and --weight, less a row-name column)")
            g.add_argument("--exclude", metavar="COL[,COL...]", type=_columns, help="columns that are not inputs "
                           "(e.g. a row index)")

    p = sub.add_parser("demo", help="the main demonstration on bundled data (about 40 s on one thread)",
                       description="ML-II and DSVI hyperparameter posteriors on Bodyfat (test SMSE/NLPD, the most "
                       "relevant hyperparameter marginals) and a CVI GPClassifier on Pima (test error, log-loss); "
                       "prints a summary table.")
    p.add_argument("--quick", action="store_true", help="smoke run with few iterations (a few seconds)")
    common(p, inputs=False)
    p.set_defaults(func=_cmd_demo)

    def fit_command(name: str, summary: str, description: str, target: str) -> argparse.ArgumentParser:
        """A ``fit-*`` subcommand with the arguments every fit takes first: the CSV file and its ``--target``."""
        p = sub.add_parser(name, help=summary, description=description)
        p.add_argument("csv", help="CSV file with a header row and numeric input columns")
        p.add_argument("--target", required=True, help=target)
        return p

    p = fit_command("fit-regression", "GP regression on a CSV file",
                    "Fit a GP regression (ScaleKernel(RBF, ARD) + Gaussian noise, prior N(0, 10) on the "
                    "log-hyperparameters) to a CSV file with a header row and numeric columns. Inputs and target are "
                    "standardised. With --likelihood other than gaussian: a latent GP with that likelihood (counts: "
                    "poisson, negative-binomial; outliers: student-t, laplace; proportions in (0, 1): beta), fitted by "
                    "CVI with the kernel's and the likelihood's parameters by type-II on the CVI bound (no prior); "
                    "counts and proportions are used as they are, other targets standardised.",
                    target="name of the target column (numeric)")
    p.add_argument("--likelihood", choices=["gaussian", *LIKELIHOODS], default="gaussian",
                   help="gaussian (default: exact GP regression, --method applies) or a non-Gaussian likelihood "
                   "(CVI, type-II)")
    p.add_argument("--method", choices=["ml2", "dsvi", "nuts"], default=None,
                   help="ML-II point estimate, DSVI posterior (default) or NUTS (--likelihood gaussian only)")
    p.add_argument("--restarts", type=_pos_int, default=None,
                   help="ML-II restarts (also the DSVI/NUTS initialisation; default 3; --likelihood gaussian only)")
    p.add_argument("--num-steps", type=_pos_int, default=None,
                   help="DSVI steps (--method dsvi only; default: the engine's default)")
    p.add_argument("--num-draws", type=_pos_int, default=None,
                   help="NUTS draws per chain after warm-up (--method nuts only; default: the engine's default)")
    p.add_argument("--chains", type=_pos_int, default=None, help="NUTS chains (--method nuts only; default 4)")
    p.add_argument("--warmup", type=_nonneg_int, default=None,
                   help="NUTS warm-up transitions per chain (--method nuts only; default 500)")
    common(p)
    p.set_defaults(func=_fit_regression)

    p = fit_command("fit-classifier", "GP classification with CVI on a CSV file",
                    "Fit a GPClassifier (CVI; type-II, integrated-out or fixed hyperparameters) to a CSV file with a "
                    "header row, numeric inputs and a label column (integers or text, two or more classes). Inputs "
                    "are standardised. Prints a short summary.",
                    target="name of the label column (e.g. {0,1}, {-1,+1}, 0..K-1, yes/no)")
    p.add_argument("--likelihood", choices=["auto", "logit", "probit", "softmax", "robustmax"], default="auto",
                   help="auto (default): logit for two classes, softmax for more")
    p.add_argument("--mode", choices=["full", "stochastic"], default="full",
                   help="full-batch CVI (default) or doubly stochastic single-site steps")
    p.add_argument("--hyperparameters", choices=["type2", "bayes", "fixed"], default="type2",
                   help="type2 (default): MAP-II (ML-II with --prior none); bayes: integrate over them (a Gaussian "
                   "q(theta) on EP's evidence; binary, or softmax with any number of classes; not saved); fixed: keep the "
                   "data-scaled start")
    p.add_argument("--prior", choices=["default", "scaled", "none"], default="default", help="prior on the "
                   "log-hyperparameters: N(0, 10 I) (default), scaled (centred at lengthscale^2 = d var), none (ML-II)")
    p.add_argument("--weight", metavar="COLUMN", help="a column of non-negative likelihood weights (an integer weight "
                   "is a repeated row); not an input")
    p.add_argument("--latent", action="store_true", help="also print the latent marginals and sites at every "
                   "training point (N rows, N x K for K classes)")
    common(p)
    p.set_defaults(func=fit_classifier)

    p = sub.add_parser("predict", help="predict with a saved fit at the rows of a CSV file",
                       description="Predict with a fit saved by 'fit-regression --save' or 'fit-classifier --save' "
                       "at the rows of NEW.csv, which must hold the fit's input columns (by name, as chosen when "
                       "fitting; other columns, the target among them, are ignored). Regression: columns mean, sd (predictive of "
                       "y in the CSV's units; with --likelihood also q5, q95: the central 90% predictive interval). "
                       "Classification: p_<label> for each class, and the predicted label. "
                       "Written as CSV to stdout, or to --out.")
    p.add_argument("fit", metavar="FIT", help="a fit file written with --save")
    p.add_argument("csv", metavar="NEW.csv", help="CSV file with a header row and the fit's input columns")
    p.add_argument("--out", metavar="OUT.csv", help="write the predictions to OUT.csv instead of stdout")
    p.add_argument("--num-draws", type=_pos_int, default=None,
                   help="hyperparameter draws of the regression predictive for DSVI/NUTS fits (default 200)")
    p.add_argument("--seed", type=_nonneg_int, default=0, help="seed of those draws (default 0)")
    p.set_defaults(func=_cmd_predict)

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


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpvi`` command: run ``argv`` (default ``sys.argv[1:]``) and return the exit status.

    0 on success; 2 for bad input or a library error (one line ``gpvi: error: ...`` on stderr); 130 after Ctrl-C
    (one line ``gpvi: interrupted ...``; an engine's :class:`~gpvi.exceptions.InterruptedRunWarning` counts as
    Ctrl-C, and nothing is saved); 141 (128 + SIGPIPE), quietly, when the reader of stdout went away (``| head``).
    With ``argv`` None (the console script, ``python -m gpvi``: the process is the command's) it first sets glibc
    malloc's thresholds (:mod:`gpvi.allocator`; ``GPVI_MALLOC_THRESHOLDS=0`` opts out); called with a list from
    Python it leaves the caller's process alone.

    Examples
    --------
    >>> from gpvi.cli import main
    >>> main(["fit-regression", "missing.csv", "--target", "y"])   # prints "gpvi: error: missing.csv: no such file"
    2
    """
    if argv is None:        # the command's own process (console script, python -m gpvi): its allocator, gpvi.allocator
        set_malloc_thresholds()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:           # --help, --version, usage errors: argparse has printed its message
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2

    interrupted: list[bool] = []
    args.interrupted = interrupted
    saves = args.command in ("fit-regression", "fit-classifier") and getattr(args, "save", None)
    stopped = "gpvi: interrupted (Ctrl-C)" + ("; nothing was saved" if saves else "")
    old_handler = install_sigint(interrupted)
    try:
        with warnings.catch_warnings(), advising(**advice(args)):
            warnings.showwarning = one_line_warning
            warnings.simplefilter("error", InterruptedRunWarning)      # an engine's partial result stops the run
            try:
                status = int(args.func(args))
                sys.stdout.flush()                     # a reader gone away (| head) shows here, not at exit
            except BrokenPipeError:
                return closed_pipe_status()
            except CLIError as exc:
                print(f"gpvi: error: {exc}", file=sys.stderr)
                return 2
            except (ValueError, TypeError, MemoryError, NumericalFaultError) as exc:   # library errors: one line
                msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                print(f"gpvi: error: {msg}", file=sys.stderr)
                return 2
            except (KeyboardInterrupt, InterruptedRunWarning, Abort):
                print(stopped, file=sys.stderr)
                return 130
            except Exception:
                if interrupted:         # a library failing on its way out of a Ctrl-C: still an interruption
                    print(stopped, file=sys.stderr)
                    return 130
                raise
            if interrupted:             # a library caught the Ctrl-C and carried on (e.g. the demo's stages)
                print(stopped, file=sys.stderr)
                return 130
            return status
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGINT, old_handler)
