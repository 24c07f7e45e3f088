"""The ``gpvi`` command: demo smoke run, CSV fits with --save round trips, one-line errors for bad input, help.

Most cases call :func:`gpvi.cli.main` in-process (fast); a few run ``python -m gpvi`` in a subprocess to check the
real exit status and that stderr holds exactly one line and no traceback.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import gpvi
from gpvi.cli import CLIError, load_csv, load_fit, main

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "gpvi", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("gpvi: error: ") and "Traceback" not in err
    return lines[0]


@pytest.fixture
def reg_csv(tmp_path):
    """40 rows, inputs a, b; y = 100 + 10 sin(a) + noise (offset and scale make unstandardising testable)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (40, 2))
    y = 100 + 10 * np.sin(X[:, 0]) + 0.3 * rng.standard_normal(40)
    p = tmp_path / "reg.csv"
    np.savetxt(p, np.c_[X, y], delimiter=",", header="a,b,y", comments="")
    return p, X, y


@pytest.fixture
def cls_csv(tmp_path):
    """60 rows, labels in {-1, +1} from the sign of a + noise."""
    rng = np.random.default_rng(1)
    X = rng.uniform(-2, 2, (60, 2))
    lab = np.where(X[:, 0] + 0.4 * rng.standard_normal(60) > 0, 1, -1)
    p = tmp_path / "cls.csv"
    np.savetxt(p, np.c_[X, lab], delimiter=",", header="a,b,label", comments="", fmt=["%.6f", "%.6f", "%d"])
    return p, X, lab


# ------------------------------------------------------------------------------------------------ demo
def test_demo_quick_exits_zero_and_prints_the_table():
    r = _run("demo", "--quick", "--no-progress", "--seed", "0")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Summary" in out and "Most relevant hyperparameters" in out
    for row in ("bodyfat  ML-II", "bodyfat  DSVI", "pima  CVI GPClassifier"):
        assert row in out
    for col in ("test SMSE", "test NLPD", "test error", "log-loss (bits)", "time (s)"):
        assert col in out
    # the table holds numbers: Pima's test error is a rate in [0, 1]
    line = next(ln for ln in out.splitlines() if ln.startswith("pima  CVI GPClassifier"))
    err = float(line.split()[5])
    assert 0.0 <= err <= 0.5
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------------------------------------ help
@pytest.mark.parametrize("argv", [["--help"], ["demo", "--help"], ["fit-regression", "--help"],
                                  ["fit-classifier", "--help"], ["bench", "--help"]])
def test_help_everywhere(argv, capsys):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: gpvi")


def test_usage_errors_return_two(capsys):
    assert main([]) == 2                                       # no command
    assert main(["fit-regression", "x.csv"]) == 2             # --target missing
    assert main(["fit-regression", "x.csv", "--target", "y", "--restarts", "0"]) == 2
    err = capsys.readouterr().err
    assert "--target" in err and "positive integer" in err


def test_console_script_declared():
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["scripts"]["gpvi"] == "gpvi.cli:main"
    assert callable(main)


# ------------------------------------------------------------------------------------------------ bad CSVs
BAD = {
    "missing_column": ("a,b,z\n1,2,3\n4,5,6\n", "y", r"no column 'y'; columns are a, b, z"),
    "non_numeric": ("a,b,y\n1,2,3\n4,five,6\n", "y", r"line 3, column 'b': non-numeric value 'five'"),
    "nan": ("a,b,y\n1,2,3\n4,nan,6\n", "y", r"line 3, column 'b': 'nan' is not a finite number"),
    "inf": ("a,b,y\n1,2,inf\n4,5,6\n", "y", r"line 2, column 'y': 'inf' is not a finite number"),
    "empty_cell": ("a,b,y\n1,,3\n4,5,6\n", "y", r"line 2, column 'b': an empty cell"),
    "empty_file": ("", "y", r"the file is empty"),
    "header_only": ("a,b,y\n", "y", r"needs at least 2 data rows; found 0"),
    "ragged": ("a,b,y\n1,2,3\n4,5\n", "y", r"line 3: 2 fields but the header has 3"),
    "no_features": ("y\n1\n2\n", "y", r"needs at least one feature column"),
    "duplicate_header": ("a,a,y\n1,2,3\n4,5,6\n", "y", r"duplicate column name\(s\) 'a'"),
    "constant_target": ("a,y\n1,3\n2,3\n3,3\n", "y", r"the target column is constant"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_csv_regression_in_process(case, tmp_path, capsys):
    text, target, pattern = BAD[case]
    p = tmp_path / f"{case}.csv"
    p.write_text(text)
    assert main(["fit-regression", str(p), "--target", target, "--method", "ml2", "--no-progress"]) == 2
    captured = capsys.readouterr()
    line = _one_error_line(captured.err)
    assert re.search(pattern, line), line
    assert captured.out == ""                                  # nothing was fitted or printed


BAD_LABELS = {
    "three_classes": ("a,label\n1,0\n2,1\n3,2\n", r"must hold two classes, \{0, 1\} or \{-1, \+1\}; got 3 distinct"),
    "one_class": ("a,label\n1,1\n2,1\n3,1\n", r"holds a single class \(1\)"),
    "other_pair": ("a,label\n1,0\n2,2\n3,0\n", r"\{0, 1\} or \{-1, \+1\}"),
}


@pytest.mark.parametrize("case", sorted(BAD_LABELS))
def test_bad_labels_classifier_in_process(case, tmp_path, capsys):
    text, pattern = BAD_LABELS[case]
    p = tmp_path / f"{case}.csv"
    p.write_text(text)
    assert main(["fit-classifier", str(p), "--target", "label", "--no-progress"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert re.search(pattern, line), line


def test_missing_file_and_non_text(tmp_path, capsys):
    assert main(["fit-classifier", str(tmp_path / "nope.csv"), "--target", "label"]) == 2
    assert "no such file" in _one_error_line(capsys.readouterr().err)
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"a,y\n\xff\xfe\x00\x81,1\n")
    assert main(["fit-regression", str(binary), "--target", "y"]) == 2
    assert "not a text (UTF-8) CSV file" in _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("case,command", [("missing_column", "fit-regression"), ("nan", "fit-regression"),
                                          ("three_classes", "fit-classifier")])
def test_bad_csv_subprocess_exit_status_and_one_line(case, command, tmp_path):
    text, pattern = (BAD[case][0], BAD[case][2]) if case in BAD else BAD_LABELS[case]
    target = "label" if command == "fit-classifier" else "y"
    p = tmp_path / f"{case}.csv"
    p.write_text(text)
    r = _run(command, str(p), "--target", target, "--no-progress")
    assert r.returncode == 2
    assert re.search(pattern, _one_error_line(r.stderr))
    assert r.stdout == ""


def test_load_csv_values_and_names(reg_csv):
    p, X, y = reg_csv
    Xl, yl, names = load_csv(p, "y")
    assert names == ["a", "b"] and Xl.dtype == np.float64
    np.testing.assert_allclose(Xl, X, rtol=1e-12)
    np.testing.assert_allclose(yl, y, rtol=1e-12)
    with pytest.raises(CLIError, match="no column 'q'"):
        load_csv(p, "q")


# ------------------------------------------------------------------------------------------------ fits and --save
def test_fit_regression_ml2_save_round_trip(reg_csv, tmp_path, capsys):
    p, X, y = reg_csv
    out = tmp_path / "reg.pt"
    assert main(["fit-regression", str(p), "--target", "y", "--method", "ml2", "--restarts", "2",
                 "--no-progress", "--save", str(out)]) == 0
    text = capsys.readouterr().out
    assert "PointPosterior summary" in text and "inputs: [0] a, [1] b" in text and "saved to" in text
    # regression files hold plain data: readable with weights_only=True
    payload = torch.load(out, weights_only=True)
    assert payload["kind"] == "regression" and payload["method"] == "ml2"
    fit = load_fit(out)
    assert fit.kind == "regression" and fit.features == ["a", "b"] and fit.target == "y"
    # the same fit made directly on the standardised data gives the same theta
    Xs = (X - X.mean(0)) / X.std(0)
    ys = (y - y.mean()) / y.std()
    direct = gpvi.ML2(num_restarts=2, seed=0).run(gpvi.GPRegression(Xs, ys))
    torch.testing.assert_close(fit.posterior.theta, direct.theta, rtol=0, atol=1e-10)
    # predictions in the CSV's units: y ~ 100 + 10 sin(a), noise sd 0.3 -> training RMSE well below 1
    mean, var = fit.predict(X)
    assert mean.shape == (40,) and var.shape == (40,) and (var > 0).all()
    assert math.sqrt(np.mean((mean - y) ** 2)) < 1.0          # unstandardising wrongly would be off by ~100
    assert 0.3 ** 2 / 4 < np.median(var) < 4 * 0.3 ** 2         # variance in original units (noise 0.09)


def test_fit_regression_dsvi_save_round_trip_and_one_line_warning(reg_csv, tmp_path, capsys):
    p, X, y = reg_csv
    out = tmp_path / "dsvi.pt"
    assert main(["fit-regression", str(p), "--target", "y", "--method", "dsvi", "--num-steps", "30",
                 "--restarts", "1", "--no-progress", "--save", str(out)]) == 0
    cap = capsys.readouterr()
    assert "GaussianPosterior summary" in cap.out and "ELBO" in cap.out
    # 30 steps do not converge: the ConvergenceWarning is one line on stderr
    warn_lines = [ln for ln in cap.err.splitlines() if "ConvergenceWarning" in ln]
    assert warn_lines and all(ln.startswith("gpvi: warning: ConvergenceWarning: ") for ln in warn_lines)
    fit = load_fit(out)
    q = fit.posterior
    assert isinstance(q, gpvi.GaussianPosterior) and q.target is not None
    Xs = (X - X.mean(0)) / X.std(0)
    ys = (y - y.mean()) / y.std()
    model = gpvi.GPRegression(Xs, ys)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        point = gpvi.ML2(num_restarts=1, seed=0).run(model)
        direct = gpvi.DSVI(scale="full", seed=0, num_steps=30, progress_bar=False).run(model, init=point)
    torch.testing.assert_close(q.mean, direct.mean, rtol=0, atol=1e-10)
    torch.testing.assert_close(q.scale_tril, direct.scale_tril, rtol=0, atol=1e-10)
    mean, var = fit.predict(X[:5], num_draws=10)
    assert mean.shape == (5,) and np.all(np.abs(mean - 100) < 20)


def test_fit_classifier_save_round_trip(cls_csv, tmp_path, capsys):
    p, X, lab = cls_csv
    out = tmp_path / "cls.pt"
    assert main(["fit-classifier", str(p), "--target", "label", "--no-progress", "--save", str(out)]) == 0
    text = capsys.readouterr().out
    assert "classes [-1, 1] (positive: 1)" in text and "LatentPosterior (CVI)" in text
    printed_err = float(re.search(r"training error (\S+)", text).group(1))
    printed_ll = float(re.search(r"training log-loss (\S+) bits", text).group(1))
    fit = load_fit(out)
    assert fit.kind == "classification" and fit.method == "cvi-full"
    p1 = fit.predict(X)                                   # raw inputs: standardised inside
    y01 = (lab == 1).astype(float)
    assert p1.shape == (60,) and np.all((p1 >= 0) & (p1 <= 1))
    assert gpvi.metrics.error_rate(p1, y01) == pytest.approx(printed_err, abs=5e-5)   # printed to 4 decimals
    assert gpvi.metrics.log_loss_bits(p1, y01) == pytest.approx(printed_ll, abs=5e-5)
    assert printed_err < 0.3


def test_load_fit_rejects_other_files(tmp_path):
    p = tmp_path / "other.pt"
    torch.save({"a": torch.zeros(2)}, p)
    with pytest.raises(ValueError, match="not a fit saved by the gpvi command"):
        load_fit(p)


# ------------------------------------------------------------------------------------------------ bench
def test_bench_unknown_name_is_one_line(capsys):
    assert main(["bench", "no_such_benchmark"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "no benchmark 'no_such_benchmark'" in line and "cvi_classification" in line


def test_bench_groups_name_existing_scripts():
    from gpvi.cli import _BENCH

    for group, scripts in _BENCH.items():
        for s in scripts:
            assert (ROOT / "benchmarks" / f"{s}.py").is_file(), f"gpvi bench {group}: benchmarks/{s}.py missing"


def test_bench_runs_module_with_quick_and_out(tmp_path, monkeypatch, capsys):
    # a fake checkout: benchmarks/fake.py records its arguments and output directory
    pkg = tmp_path / "src" / "benchmarks"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "fake.py").write_text(
        "import os, sys, pathlib\n"
        "out = pathlib.Path(os.environ['GPVI_BENCH_OUT'])\n"
        "(out / 'fake.md').write_text(' '.join(sys.argv[1:]) + ' ' + os.environ['OMP_NUM_THREADS'])\n")
    (pkg / "broken.py").write_text("raise SystemExit(3)\n")
    import gpvi.cli as cli

    monkeypatch.setattr(cli, "_bench_root", lambda: pkg)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    out = tmp_path / "results"
    assert main(["bench", "fake", "--quick", "--out", str(out)]) == 0
    assert (out / "fake.md").read_text() == "--quick 1"
    assert main(["bench", "broken"]) == 2
    assert "benchmarks/broken.py failed with exit status 3" in capsys.readouterr().err
