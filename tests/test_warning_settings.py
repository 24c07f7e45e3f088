"""Every warning names a setting that exists where it is raised (issue 58): the BoundWarning of a type-II search
names ``theta_bounds=`` from :class:`TypeII`, ``bounds=`` from :class:`gpvi.ML2`, ``prior=`` from
:class:`gpvi.GPClassifier` (which has no box setting), and command-line options from the ``gpvi`` command (which
has no Python keywords at all)."""

from __future__ import annotations

import inspect
import re
import warnings

import numpy as np
import pytest

import gpvi
from gpvi.cli import build_parser, main
from gpvi.exceptions import BoundWarning, ConvergenceWarning, advice, advising


def _keywords(message: str) -> set[str]:
    """The ``name=`` settings a message advises."""
    return set(re.findall(r"\b([A-Za-z_]\w*)=", message))


def _options(command: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return set(sub.choices[command]._option_string_actions)


def _irrelevant_input_classification():
    """Input 1 carries no information: ML-II's lengthscale on it runs to the box."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    y = (X[:, 0] > 0).astype(int)
    X[:, 0] += np.where(y == 1, 1.0, -1.0)
    return X, y


def _irrelevant_input_regression():
    """Standardised; input 1 irrelevant (seed 2: ML-II's lengthscale on it ends on the box)."""
    rng = np.random.default_rng(2)
    X = rng.uniform(-2, 2, (40, 2))
    y = 100 + 10 * np.sin(X[:, 0]) + 0.3 * rng.standard_normal(40)
    return X, y


def _caught(fn, category=BoundWarning) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if issubclass(w.category, category)]


def test_gpclassifier_bound_warning_names_its_own_settings():
    X, y = _irrelevant_input_classification()
    clf = gpvi.GPClassifier(prior=None, random_state=0)
    (msg,) = _caught(lambda: clf.fit(X, y))
    assert "lengthscale(s) at the upper bound" in msg and "posterior_.info['at_bound']" in msg
    assert "theta_bounds" not in msg and _keywords(msg) and _keywords(msg) <= set(clf.get_params())


def test_engines_called_directly_name_their_own_box():
    from gpvi.inference.cvi.typeii import TypeII

    X, y = _irrelevant_input_classification()
    (msg,) = _caught(lambda: TypeII(gpvi.CVI(progress_bar=False), prior=None).run(gpvi.GPClassification(X, y)))
    assert "widen theta_bounds=" in msg and "theta_bounds" in inspect.signature(TypeII).parameters
    X, y = _irrelevant_input_regression()
    Xs, ys = (X - X.mean(0)) / X.std(0), (y - y.mean()) / y.std()
    (msg,) = _caught(lambda: gpvi.ML2(num_restarts=3, seed=0, progress_bar=False).run(gpvi.GPRegression(Xs, ys)))
    assert "widen bounds=" in msg and "bounds" in inspect.signature(gpvi.ML2).parameters


def _cli_warnings(capsys, argv) -> list[str]:
    assert main(argv) == 0
    err = capsys.readouterr().err
    return [ln for ln in err.splitlines() if ln.startswith("gpvi: warning:")]


@pytest.mark.parametrize("command", ["fit-regression", "fit-classifier"])
def test_cli_warnings_name_options_of_the_command(tmp_path, capsys, command):
    if command == "fit-regression":
        X, y = _irrelevant_input_regression()
        fmt, extra = "%.17g", ["--method", "ml2"]
    else:
        X, y = _irrelevant_input_classification()
        fmt, extra = ["%.6f", "%.6f", "%d"], ["--prior", "none"]
    p = tmp_path / "data.csv"
    np.savetxt(p, np.c_[X, y], delimiter=",", header="a,b,t", comments="", fmt=fmt)
    lines = _cli_warnings(capsys, [command, str(p), "--target", "t", "--no-progress", *extra])
    (line,) = [ln for ln in lines if "BoundWarning" in ln]
    assert "at the upper bound" in line and "info[" not in line and not _keywords(line)
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", line))
    assert flags and flags <= _options(command)


def test_advice_the_outermost_caller_wins():
    assert advice("bound", "widen bounds= to search further") == "widen bounds= to search further"
    with advising(bound="outer"):
        with advising(bound="inner", other="x"):
            assert advice("bound", "default") == "outer" and advice("other", "default") == "x"
        assert advice("other", "default") == "default"
    assert advice("bound", "default") == "default"


def test_cli_ml2_convergence_advice_names_an_option():
    from gpvi.cli import REGRESSION_ADVICE

    X, y = _irrelevant_input_regression()
    model = gpvi.GPRegression((X - X.mean(0)) / X.std(0), (y - y.mean()) / y.std())
    with advising(**REGRESSION_ADVICE):
        msgs = _caught(lambda: gpvi.ML2(num_restarts=1, max_iter=1, seed=0, progress_bar=False).run(model),
                       ConvergenceWarning)
    (msg,) = msgs
    assert "doubtful" in msg and not _keywords(msg)
    assert set(re.findall(r"--[a-z][a-z-]*", msg)) <= _options("fit-regression")
