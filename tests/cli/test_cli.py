"""The ``gpvi`` command: demo smoke run, CSV fits with --save round trips, ``gpvi predict``, one-line errors for bad
input, refusal of crafted fit files, --save checked before fitting, flags per method, Ctrl-C (exit 130), help.

Most cases call :func:`gpvi.cli.main` in-process (fast); four run ``python -m gpvi`` in a subprocess to check the
real exit status and that stderr holds exactly one line and no traceback (the demo, a bad CSV, a predict round trip,
a real SIGINT).
"""

from __future__ import annotations

import json
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

ROOT = Path(__file__).resolve().parents[2]


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
    "underscore": ("a,b,y\n1,2,3\n4,1_000,6\n", "y", r"line 3, column 'b': non-numeric value '1_000'"),
    "nan": ("a,b,y\n1,2,3\n4,nan,6\n", "y", r"line 3, column 'b': 'nan' is not a finite number"),
    "inf": ("a,b,y\n1,2,inf\n4,5,6\n", "y", r"line 2, column 'y': 'inf' is not a finite number"),
    "empty_cell": ("a,b,y\n1,,3\n4,5,6\n", "y", r"line 2, column 'b': an empty cell"),
    "empty_file": ("", "y", r"the file is empty"),
    "header_only": ("a,b,y\n", "y", r"needs at least 2 data rows; found 0"),
    "ragged": ("a,b,y\n1,2,3\n4,5\n", "y", r"line 3: 2 fields but the header has 3"),
    "no_features": ("y\n1\n2\n", "y", r"needs at least one feature column"),
    "duplicate_header": ("a,a,y\n1,2,3\n4,5,6\n", "y", r"duplicate column name\(s\) 'a'"),
    "constant_target": ("a,y\n1,3\n2,3\n3,3\n", "y", r"the target column is constant"),
    # a finite cell whose column sd overflows float64 would standardise to all zeros: refused, naming the column
    "sd_overflow": ("a,nox,y\n1,2,3\n4,1e308,6\n5,2,1\n", "y",
                    r"input column 1 \('nox'\) has a spread float64 cannot represent"),
    "sd_overflow_target": ("a,y\n1,-1e308\n2,1e308\n3,0\n", "y", r"target column 0 \('y'\) has a spread"),
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
    "one_class": ("a,label\n1,1\n2,1\n3,1\n", r"holds a single class \(1\)"),
    "non_integer": ("a,label\n1,0\n2,0.5\n3,1\n", r"must hold integer class labels or text; got \[0\.5\]"),
    "one_text_class": ("a,label\n1,yes\n2,yes\n3, yes \n", r"holds a single class \(yes\)"),
    "missing_value": ("a,label\n1,yes\n2,NA\n3,no\n", r"line 3, column 'label': 'NA' is a missing value"),
    "empty_label": ("a,label\n1,yes\n2,\n3,no\n", r"line 3, column 'label': an empty cell"),
    "nan_label": ("a,label\n1,0\n2,nan\n3,1\n", r"line 3, column 'label': 'nan' is not a finite number"),
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


@pytest.mark.parametrize("case,command", [("one_class", "fit-classifier")])
def test_bad_csv_subprocess_exit_status_and_one_line(case, command, tmp_path):
    """The real exit status and stderr of ``python -m gpvi`` (one case: every other bad input takes the same path
    out of :func:`gpvi.cli.main`, checked in-process above)."""
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
    # the summary names the lengthscales by the CSV header (issue 16), log and natural scale
    assert "log_lengthscale_sq[a]" in text and "lengthscale[b]" in text and "log_lengthscale_sq[0]" not in text
    # regression files hold plain data: readable with weights_only=True
    payload = torch.load(out, weights_only=True)
    meta = json.loads(payload["meta"])                          # the layout of gpvi.io: tensors + a JSON string
    assert meta["kind"] == "regression" and meta["method"] == "ml2"
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
    assert "classes [-1, 1] (positive: 1)" in text
    # a short summary: no row per training point (--latent prints them); 9 lines with the "saved to" line
    assert "LatentPosterior (CVI)" not in text and "f[0]" not in text and len(text.splitlines()) < 12
    assert "Latent marginals and sites at the 60 training points: --latent prints them" in text
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


@pytest.mark.parametrize("flag, prior", [("none", None), ("scaled", "scaled"), ("default", "default")])
def test_fit_classifier_prior_option_reaches_the_classifier(cls_csv, tmp_path, capsys, flag, prior):
    p, X, lab = cls_csv
    out = tmp_path / "cls.pt"
    assert main(["fit-classifier", str(p), "--target", "label", "--no-progress", "--prior", flag,
                 "--save", str(out)]) == 0
    clf = load_fit(out).classifier
    assert clf.prior == prior and clf.posterior_.info["type_ii"]["prior"] == prior
    assert main(["fit-classifier", str(p), "--target", "label", "--prior", "flat"]) == 2
    assert "invalid choice: 'flat'" in capsys.readouterr().err


@pytest.mark.slow
def test_fit_classifier_integrates_hyperparameters_out_and_refuses_the_flags_that_do_not_apply(cls_csv, tmp_path,
                                                                                                capsys):
    p, X, lab = cls_csv
    assert main(["fit-classifier", str(p), "--target", "label", "--no-progress", "--hyperparameters", "bayes"]) == 0
    text = capsys.readouterr().out
    assert "hyperparameters integrated out (q(theta) on EP's evidence)" in text and "q(theta)'s ELBO" in text
    assert "GaussianPosterior summary" in text and "log_signal_var" in text
    for extra, what in ((["--save", str(tmp_path / "c.pt")], "--save does not apply"),
                        (["--prior", "none"], "--prior none (ML-II) applies"), (["--mode", "stochastic"], "--mode"),
                        (["--weight", "b"], "--weight applies")):
        assert main(["fit-classifier", str(p), "--target", "label", "--hyperparameters", "bayes", *extra]) == 2
        assert what in capsys.readouterr().err
    assert not (tmp_path / "c.pt").exists()


def test_fit_classifier_prints_the_hyperparameters_by_column_and_marks_the_box(tmp_path, capsys):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 2))
    p = tmp_path / "sep.csv"
    np.savetxt(p, np.c_[X, (X[:, 0] > 0).astype(int)], delimiter=",", header="signal,noise,label", comments="",
               fmt=["%.6f", "%.6f", "%d"])
    assert main(["fit-classifier", str(p), "--target", "label", "--no-progress", "--prior", "none"]) == 0
    out = capsys.readouterr().out
    ls = {m.group(1): float(m.group(2)) for m in re.finditer(r"lengthscale\[(\w+)\]\s+(\S+)", out)}
    assert set(ls) == {"signal", "noise"} and ls["signal"] < 10 < ls["noise"]
    assert re.search(r"lengthscale\[noise\]\s+\S+\s+\(at the upper bound\)", out)
    assert "(at the" not in out.split("lengthscale[signal]")[1].split("\n")[0]


def test_fit_classifier_weight_column_equals_repeated_rows(tmp_path, capsys):
    """``--weight COLUMN``: an integer weight is the row repeated (same standardisation, same fit), the column is
    not an input, and a saved weighted fit predicts like the fit on the repeated rows."""
    rng = np.random.default_rng(2)
    X = rng.uniform(-2, 2, (40, 2))
    lab = (X[:, 0] + 0.5 * rng.standard_normal(40) > 0).astype(int)
    w = rng.integers(0, 4, 40)
    pw, pr = tmp_path / "w.csv", tmp_path / "r.csv"
    np.savetxt(pw, np.c_[X, w, lab], delimiter=",", header="a,b,w,label", comments="", fmt="%.6f")
    np.savetxt(pr, np.c_[np.repeat(X, w, 0), np.repeat(lab, w)], delimiter=",", header="a,b,label", comments="",
               fmt="%.6f")
    fw, fr = tmp_path / "w.pt", tmp_path / "r.pt"
    assert main(["fit-classifier", str(pw), "--target", "label", "--weight", "w", "--hyperparameters", "fixed",
                 "--no-progress", "--save", str(fw)]) == 0
    assert "weights from column 'w'" in capsys.readouterr().out
    assert main(["fit-classifier", str(pr), "--target", "label", "--hyperparameters", "fixed", "--no-progress",
                 "--save", str(fr)]) == 0
    a, b = load_fit(fw), load_fit(fr)
    assert a.features == ["a", "b"]
    np.testing.assert_allclose(a.x_mean, b.x_mean, atol=1e-12)
    np.testing.assert_allclose(a.x_std, b.x_std, atol=1e-12)
    np.testing.assert_allclose(a.predict(X), b.predict(X), atol=1e-8)
    for bad, what in ((["--weight", "label"], "is the label column"), (["--weight", "q"], "no column 'q'")):
        assert main(["fit-classifier", str(pw), "--target", "label", "--no-progress", *bad]) == 2
        assert what in capsys.readouterr().err
    neg = tmp_path / "neg.csv"
    np.savetxt(neg, np.c_[X, -np.ones(40), lab], delimiter=",", header="a,b,w,label", comments="", fmt="%.6f")
    assert main(["fit-classifier", str(neg), "--target", "label", "--weight", "w", "--no-progress"]) == 2
    assert "must be non-negative" in capsys.readouterr().err


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
        "(out / 'fake.md').write_text(' '.join(sys.argv[1:]) + ' ' + os.environ['OMP_NUM_THREADS'] + ' '\n"
        "                              + os.environ['GPVI_MALLOC_THRESHOLDS'])\n")
    (pkg / "broken.py").write_text("raise SystemExit(3)\n")
    import gpvi.cli as cli

    monkeypatch.setattr(cli, "_bench_root", lambda: pkg)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("GPVI_MALLOC_THRESHOLDS", raising=False)
    out = tmp_path / "results"
    assert main(["bench", "fake", "--quick", "--out", str(out)]) == 0
    assert (out / "fake.md").read_text() == "--quick 1 1"       # one thread; gpvi.allocator's thresholds asked for
    assert main(["bench", "broken"]) == 2
    assert "benchmarks/broken.py failed with exit status 3" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ gpvi predict
def _new_csv(path: Path, X: np.ndarray, *, order=("b", "a"), extra=True, target=None) -> Path:
    """Features by name in another order, a text column the fit does not use, optionally the target."""
    cols = {"a": X[:, 0], "b": X[:, 1]}
    head = list(order) + (["id"] if extra else []) + ([target] if target else [])
    lines = [",".join(head)]
    for i in range(X.shape[0]):
        row = [repr(float(cols[c][i])) for c in order] + ([f"row{i}"] if extra else []) + (["7"] if target else [])
        lines.append(",".join(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def _read_pred(text: str) -> tuple[list[str], list[list[str]]]:
    rows = [ln.split(",") for ln in text.strip().splitlines()]
    return rows[0], rows[1:]


def test_predict_regression_round_trip_subprocess(reg_csv, tmp_path, capsys):
    p, X, y = reg_csv
    fit_file = tmp_path / "ml2.pt"
    assert main(["fit-regression", str(p), "--target", "y", "--method", "ml2", "--restarts", "1", "--no-progress",
                 "--save", str(fit_file)]) == 0
    capsys.readouterr()
    Xnew = np.random.default_rng(3).uniform(-2, 2, (7, 2))
    new = _new_csv(tmp_path / "new.csv", Xnew, target="y")
    r = _run("predict", str(fit_file), str(new))
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    header, rows = _read_pred(r.stdout)
    assert header == ["mean", "sd"] and len(rows) == 7
    got = np.array([[float(v) for v in row] for row in rows])
    mean, var = load_fit(fit_file).predict(Xnew)
    np.testing.assert_allclose(got[:, 0], mean, rtol=0, atol=1e-12)        # floats written with repr: exact
    np.testing.assert_allclose(got[:, 1], np.sqrt(var), rtol=0, atol=1e-12)
    assert np.all(np.abs(got[:, 0] - (100 + 10 * np.sin(Xnew[:, 0]))) < 3)   # in the CSV's units
    # --out writes the same table and says so on stdout
    out = tmp_path / "pred.csv"
    assert main(["predict", str(fit_file), str(new), "--out", str(out)]) == 0
    assert out.read_text() == r.stdout
    assert "wrote 7 predictions (mean, sd) to" in capsys.readouterr().out


def test_predict_classifier_round_trip(cls_csv, tmp_path, capsys):
    p, X, lab = cls_csv
    fit_file = tmp_path / "cls.pt"
    assert main(["fit-classifier", str(p), "--target", "label", "--no-progress", "--save", str(fit_file)]) == 0
    capsys.readouterr()
    Xnew = np.random.default_rng(4).uniform(-2, 2, (9, 2))
    new = _new_csv(tmp_path / "new.csv", Xnew, order=("a", "b"), extra=False)
    out = tmp_path / "p.csv"
    assert main(["predict", str(fit_file), str(new), "--out", str(out)]) == 0      # the subprocess: regression's
    header, rows = _read_pred(out.read_text())
    assert header == ["p_-1", "p_1", "label"] and len(rows) == 9
    P = np.array([[float(v) for v in row[:2]] for row in rows])
    labels = np.array([int(row[2]) for row in rows])
    fit = load_fit(fit_file)
    np.testing.assert_allclose(P, fit.predict_proba(Xnew), rtol=0, atol=1e-12)
    np.testing.assert_allclose(P.sum(1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(labels, np.where(P[:, 1] > 0.5, 1, -1))
    assert set(labels.tolist()) == {-1, 1}                    # a ~ U(-2, 2) and the label follows the sign of a


def test_predict_dsvi_num_draws_and_seed(reg_csv, tmp_path, capsys):
    p, X, y = reg_csv
    fit_file = tmp_path / "dsvi.pt"
    assert main(["fit-regression", str(p), "--target", "y", "--method", "dsvi", "--num-steps", "20", "--restarts",
                 "1", "--no-progress", "--save", str(fit_file)]) == 0
    new = _new_csv(tmp_path / "new.csv", X[:5])
    capsys.readouterr()
    assert main(["predict", str(fit_file), str(new), "--num-draws", "7", "--seed", "3"]) == 0
    header, rows = _read_pred(capsys.readouterr().out)
    got = np.array([[float(v) for v in row] for row in rows])
    mean, var = load_fit(fit_file).predict(X[:5], num_draws=7, seed=3)
    np.testing.assert_allclose(got, np.c_[mean, np.sqrt(var)], rtol=0, atol=1e-12)
    other, _ = load_fit(fit_file).predict(X[:5], num_draws=7, seed=4)
    assert np.abs(other - mean).max() > 1e-9                  # the seed matters: a mixture over random draws


PREDICT_BAD = {
    "missing_column": ("a,y\n1,2\n", r"no column 'b'; the fit needs a, b and the file has a, y"),
    "non_numeric": ("a,b\n1,2\n3,x\n", r"line 3, column 'b': non-numeric value 'x'"),
    "no_rows": ("a,b\n", r"needs at least 1 data row; found 0"),
    "duplicate_feature": ("a,b,b\n1,2,3\n", r"duplicate column name\(s\) 'b'"),
}


@pytest.mark.parametrize("case", sorted(PREDICT_BAD))
def test_predict_bad_csv_is_one_line(case, reg_csv, tmp_path, capsys):
    p, X, y = reg_csv
    fit_file = tmp_path / "ml2.pt"
    assert main(["fit-regression", str(p), "--target", "y", "--method", "ml2", "--restarts", "1", "--no-progress",
                 "--save", str(fit_file)]) == 0
    capsys.readouterr()
    text, pattern = PREDICT_BAD[case]
    new = tmp_path / "new.csv"
    new.write_text(text)
    assert main(["predict", str(fit_file), str(new)]) == 2
    cap = capsys.readouterr()
    assert re.search(pattern, _one_error_line(cap.err)) and cap.out == ""


def test_predict_option_and_output_errors(cls_csv, tmp_path, capsys):
    p, X, lab = cls_csv
    fit_file = tmp_path / "cls.pt"
    assert main(["fit-classifier", str(p), "--target", "label", "--no-progress", "--save", str(fit_file)]) == 0
    capsys.readouterr()
    assert main(["predict", str(fit_file), str(p), "--num-draws", "5"]) == 2
    assert "--num-draws applies to regression fits only" in _one_error_line(capsys.readouterr().err)
    assert main(["predict", str(fit_file), str(p), "--out", str(tmp_path / "nope" / "p.csv")]) == 2
    assert "does not exist" in _one_error_line(capsys.readouterr().err)
    assert main(["predict", str(tmp_path / "absent.pt"), str(p)]) == 2
    assert "absent.pt: no such file" in _one_error_line(capsys.readouterr().err)


# ------------------------------------------------------------------------------------------------ crafted files
class _OpensMarker:
    """Unpickling this without restrictions calls open(marker, "w")."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import builtins
        return (builtins.open, (self.marker, "w"))


def test_crafted_fit_file_is_refused_by_the_cli_without_running(cls_csv, tmp_path, capsys):
    p, X, lab = cls_csv
    marker = tmp_path / "MARKER"
    evil = tmp_path / "evil.pt"
    torch.save({"format": "gpvi-fit", "version": 2, "meta": "{}", "tensors": {}, "x": _OpensMarker(marker)}, evil)
    assert main(["predict", str(evil), str(p)]) == 2
    cap = capsys.readouterr()
    line = _one_error_line(cap.err)
    assert str(evil) in line and "refused" in line and "could run code" in line
    assert cap.out == "" and not marker.exists()
    torch.load(evil, weights_only=False)                             # control: unrestricted loading runs it
    assert marker.exists()


# ------------------------------------------------------------------------------------------------ --save checks
def test_save_to_a_missing_folder_fails_before_fitting(reg_csv, tmp_path, capsys):
    p, X, y = reg_csv
    target = tmp_path / "no_such_folder" / "fit.pt"
    assert main(["fit-regression", str(p), "--target", "y", "--method", "ml2", "--no-progress", "--save",
                 str(target)]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""                                             # nothing was fitted or printed
    assert "does not exist" in _one_error_line(cap.err) and str(target.parent) in cap.err


def test_save_path_checks_in_process(reg_csv, cls_csv, tmp_path, capsys):
    p, X, y = reg_csv
    assert main(["fit-regression", str(p), "--target", "y", "--method", "ml2", "--save", str(tmp_path)]) == 2
    cap = capsys.readouterr()
    assert "is a folder; give a file name" in _one_error_line(cap.err) and cap.out == ""
    pc, _, _ = cls_csv
    assert main(["fit-classifier", str(pc), "--target", "label", "--save", str(tmp_path / "x" / "c.pt")]) == 2
    cap = capsys.readouterr()
    assert "does not exist" in _one_error_line(cap.err) and cap.out == ""
    # the path is checked before the CSV is read
    assert main(["fit-regression", str(tmp_path / "missing.csv"), "--target", "y", "--save",
                 str(tmp_path / "x" / "f.pt")]) == 2
    assert "does not exist" in _one_error_line(capsys.readouterr().err)


# ------------------------------------------------------------------------------------------------ flags and numbers
@pytest.mark.parametrize("method,flags,message", [
    ("nuts", ["--num-steps", "10"], r"--num-steps sets the DSVI steps and applies to --method dsvi only; got "
                                    r"--method nuts \(NUTS draws per chain: --num-draws\)"),
    ("ml2", ["--num-steps", "10"], r"--num-steps .* applies to --method dsvi only; got --method ml2"),
    ("dsvi", ["--num-draws", "10"], r"--num-draws applies to --method nuts only; got --method dsvi"),
    ("ml2", ["--chains", "2"], r"--chains applies to --method nuts only"),
    ("dsvi", ["--warmup", "0"], r"--warmup applies to --method nuts only"),
])
def test_flags_that_do_not_apply_to_the_method(method, flags, message, reg_csv, capsys):
    p, X, y = reg_csv
    assert main(["fit-regression", str(p), "--target", "y", "--method", method, *flags]) == 2
    cap = capsys.readouterr()
    assert re.search(message, _one_error_line(cap.err)) and cap.out == ""


def test_nuts_num_draws_sets_draws_per_chain(reg_csv, tmp_path, capsys):
    p, X, y = reg_csv
    out = tmp_path / "nuts.pt"
    assert main(["fit-regression", str(p), "--target", "y", "--method", "nuts", "--num-draws", "6", "--chains", "2",
                 "--warmup", "5", "--restarts", "1", "--no-progress", "--save", str(out)]) == 0
    q = load_fit(out).posterior
    assert isinstance(q, gpvi.SamplePosterior) and tuple(q.draws.shape[:2]) == (2, 6)


@pytest.mark.parametrize("flag,value", [("--restarts", "1_000"), ("--seed", "1_0"), ("--num-steps", "2_0"),
                                        ("--restarts", "\u0663"), ("--restarts", " 3")])
def test_numbers_are_plain_digits(flag, value, reg_csv, capsys):
    p, X, y = reg_csv
    assert int(value) > 0                                   # Python's int() accepts all of these
    assert main(["fit-regression", str(p), "--target", "y", flag, value]) == 2
    assert "expected an integer written with the digits 0-9 only" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ Ctrl-C
def _interrupt_on_call(monkeypatch, k: int, how: str = "raise"):
    """Make the k-th progress update (every engine's loop calls it inside its try) act as Ctrl-C."""
    import signal

    from gpvi.inference.progress import Progress

    calls = []

    def update(self, n=1, **postfix):
        calls.append(1)
        if len(calls) >= k:
            if how == "raise":
                raise KeyboardInterrupt
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(Progress, "update", update)
    return calls


@pytest.mark.parametrize("argv,k", [
    (["fit-regression", "{reg}", "--target", "y", "--method", "ml2"], 1),
    (["fit-regression", "{reg}", "--target", "y", "--method", "dsvi", "--num-steps", "50"], 3),
    (["fit-classifier", "{cls}", "--target", "label"], 2),
])
def test_ctrl_c_in_an_engine_exits_130_and_saves_nothing(argv, k, reg_csv, cls_csv, tmp_path, monkeypatch, capsys):
    import signal

    before = signal.getsignal(signal.SIGINT)
    _interrupt_on_call(monkeypatch, k)
    out = tmp_path / "fit.pt"
    argv = [a.format(reg=reg_csv[0], cls=cls_csv[0]) for a in argv]
    assert main([*argv, "--restarts", "1", "--no-progress", "--save", str(out)] if argv[0] == "fit-regression"
                else [*argv, "--no-progress", "--save", str(out)]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "gpvi: interrupted (Ctrl-C); nothing was saved"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["cls.csv", "reg.csv"]     # no fit, no temporary file
    assert signal.getsignal(signal.SIGINT) is before             # main restored the handler


def test_real_sigint_in_process_and_a_second_one_aborts(reg_csv, tmp_path, monkeypatch, capsys):
    # one SIGINT: the handler raises KeyboardInterrupt, ML-II returns its partial result and warns -> 130
    _interrupt_on_call(monkeypatch, 1, how="signal")
    out = tmp_path / "fit.pt"
    assert main(["fit-regression", str(reg_csv[0]), "--target", "y", "--method", "ml2", "--restarts", "2",
                 "--no-progress", "--save", str(out)]) == 130
    assert capsys.readouterr().err.strip() == "gpvi: interrupted (Ctrl-C); nothing was saved" and not out.exists()
    # the demo: one Ctrl-C ends it (the interrupted stage's partial result does not let the next stage start)
    calls = _interrupt_on_call(monkeypatch, 1, how="signal")
    assert main(["demo", "--quick", "--no-progress"]) == 130
    assert capsys.readouterr().err.strip() == "gpvi: interrupted (Ctrl-C)" and len(calls) == 1


def test_ctrl_c_subprocess_exits_130(reg_csv, tmp_path):
    import signal
    import threading
    import time

    p, X, y = reg_csv
    out = tmp_path / "nuts.pt"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "gpvi", "fit-regression", str(p), "--target", "y", "--method",
                             "nuts", "--num-draws", "1000000", "--chains", "1", "--warmup", "5", "--restarts", "1",
                             "--save", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    err = bytearray()

    def read():
        while chunk := proc.stderr.read1(4096):
            err.extend(chunk)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while b"NUTS" not in err and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)                                       # wait for the NUTS progress bar: sampling has begun
    started = b"NUTS" in err
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    stdout = proc.stdout.read()
    rc = proc.wait(timeout=60)
    reader.join(timeout=10)
    text = err.decode(errors="replace")
    assert rc == 130, f"exit {rc}; NUTS had started: {started}; stderr ends: {text[-1500:]!r}"
    assert text.strip().splitlines()[-1] == "gpvi: interrupted (Ctrl-C); nothing was saved"
    assert "Traceback" not in text and b"saved to" not in stdout and not out.exists()


def test_fit_classifier_three_classes_and_predict(tmp_path, capsys):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(45, 2))
    lab = np.repeat([0, 1, 2], 15)
    X[:, 0] += 2.0 * lab
    p = tmp_path / "three.csv"
    p.write_text("a,b,label\n" + "".join(f"{float(a)!r},{float(b)!r},{c}\n" for (a, b), c in zip(X, lab)))
    fit_file = tmp_path / "three.pt"
    assert main(["fit-classifier", str(p), "--target", "label", "--no-progress", "--save", str(fit_file)]) == 0
    out = capsys.readouterr().out
    assert "classes [0, 1, 2], likelihood softmax" in out
    q = tmp_path / "new.csv"
    q.write_text("a,b\n-0.1,0.0\n4.1,0.0\n")
    assert main(["predict", str(fit_file), str(q)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "p_0,p_1,p_2,label"
    rows = [line.split(",") for line in lines[1:]]
    assert [r[-1] for r in rows] == ["0", "2"]
    assert all(abs(sum(float(v) for v in r[:3]) - 1.0) < 1e-9 for r in rows)


def test_a_reader_that_stops_reading_ends_the_command_quietly(cls_csv):
    """``gpvi fit-classifier ... | head``: the reader closes the pipe; the command exits quietly with status 141
    (128 + SIGPIPE, as a command killed by SIGPIPE) instead of a BrokenPipeError traceback (Python docs, "Note on
    SIGPIPE"). The read end is closed before anything is written, so every write fails."""
    import signal

    p, _, _ = cls_csv
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "gpvi", "fit-classifier", str(p), "--target", "label",
                             "--no-progress", "--latent"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=ROOT)
    proc.stdout.close()                                        # as head does after its lines
    err = proc.stderr.read().decode(errors="replace")
    status = proc.wait(timeout=300)
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err
    assert status == 128 + getattr(signal, "SIGPIPE", -127)


def test_predict_to_a_reader_that_stops_reading_ends_quietly(reg_csv, tmp_path, capsys):
    """``gpvi predict FIT NEW.csv | head``: the CSV written to stdout meets a closed pipe; exit status 141 and no
    message (it was "gpvi: error: cannot write None: Broken pipe", exit 2)."""
    import signal

    p, _, _ = reg_csv
    fit = tmp_path / "f.pt"
    assert main(["fit-regression", str(p), "--target", "y", "--method", "ml2", "--restarts", "1", "--no-progress",
                 "--save", str(fit)]) == 0
    capsys.readouterr()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "gpvi", "predict", str(fit), str(p)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=ROOT)
    proc.stdout.close()
    err = proc.stderr.read().decode(errors="replace")
    status = proc.wait(timeout=300)
    assert err == "" and status == 128 + getattr(signal, "SIGPIPE", -127), err
