"""``gpvi fit-regression --likelihood {poisson,negative-binomial,student-t,laplace,beta}`` (issue 60): CVI with
type-II hyperparameters on a CSV file, the summary, ``--save`` and ``gpvi predict`` (mean, sd and the 90% interval in
the CSV's units), the same numbers as the library run directly, and one-line errors for targets the likelihood
cannot take and for the Gaussian fit's options. In-process through :func:`gpvi.cli.main`, one case in a subprocess.
"""

from __future__ import annotations

import csv
import io
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import gpvi
from gpvi.cli import load_fit, main
from gpvi.inference.cvi import LikelihoodTypeII, TypeII
from gpvi.models.latent_likelihoods import StudentT

ROOT = Path(__file__).resolve().parents[2]


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("gpvi: error: ") and "Traceback" not in err
    return lines[0]


def _write(path: Path, X: np.ndarray, y: np.ndarray, fmt: str = "%.17g") -> Path:
    np.savetxt(path, np.c_[X, y], delimiter=",", header="a,b,y", comments="", fmt=fmt)
    return path


def _targets(kind: str, X: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    f = np.sin(X[:, 0])
    if kind in ("poisson", "negative-binomial"):
        return rng.poisson(np.exp(1.0 + f)).astype(float)
    if kind == "beta":
        return 1.0 / (1.0 + np.exp(-(f + 0.3 * rng.standard_normal(len(f)))))
    return 100.0 + 10.0 * f + 0.5 * rng.standard_t(2.0, len(f))      # heavy tails, offset and scale


@pytest.fixture
def data(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, (30, 2))
    return tmp_path, X, rng


def _read(text: str) -> tuple[list[str], np.ndarray]:
    rows = list(csv.reader(io.StringIO(text)))
    return rows[0], np.array(rows[1:], dtype=float)


@pytest.mark.parametrize("kind", ["poisson", "negative-binomial", "student-t", "laplace", "beta"])
def test_fit_save_and_predict_every_likelihood(kind, data, capsys):
    tmp, X, rng = data
    y = _targets(kind, X, rng)
    p = _write(tmp / "d.csv", X, y)
    out = tmp / "fit.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fit-regression", str(p), "--target", "y", "--likelihood", kind, "--no-progress",
                     "--save", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"GP regression with a {kind} likelihood on {p}: N = 30, d = 2" in text and "saved to" in text
    assert "lengthscale[a]" in text and "signal_var" in text and "ELBO" in text
    assert ("learned" in text) == (kind != "poisson")
    fit = load_fit(out)
    assert fit.kind == "generalised_regression" and fit.method == "cvi-type2" and fit.features == ["a", "b"]
    assert fit.extra == {"likelihood": kind}
    standardised = kind in ("student-t", "laplace")
    assert (fit.y_mean, fit.y_std) == ((pytest.approx(y.mean()), pytest.approx(y.std())) if standardised
                                       else (0.0, 1.0))
    assert main(["predict", str(out), str(p)]) == 0
    header, table = _read(capsys.readouterr().out)
    assert header == ["mean", "sd", "q5", "q95"] and table.shape == (30, 4)
    mean, var = fit.predict(X)
    lo, hi = fit.interval(X, 0.9)
    np.testing.assert_allclose(table, np.c_[mean, np.sqrt(var), lo, hi], rtol=1e-15, atol=0)
    assert (lo <= mean).all() and (mean <= hi).all() and (np.sqrt(var) > 0).all()
    if kind in ("poisson", "negative-binomial"):
        assert (lo == np.round(lo)).all() and (hi == np.round(hi)).all()          # integer counts
    if kind == "beta":
        assert (lo > 0).all() and (hi < 1).all()
    if standardised:                                  # the CSV's units: about 100 + 10 sin(a)
        assert np.median(np.abs(mean - (100 + 10 * np.sin(X[:, 0])))) < 2.0


def test_poisson_fit_is_the_library_fit_on_the_standardised_inputs(data, capsys):
    tmp, X, rng = data
    y = _targets("poisson", X, rng)
    out = tmp / "p.pt"
    assert main(["fit-regression", str(_write(tmp / "c.csv", X, y)), "--target", "y", "--likelihood",
                 "poisson", "--no-progress", "--save", str(out)]) == 0
    capsys.readouterr()
    Xs = (X - X.mean(0)) / X.std(0)
    model = gpvi.GPGeneralisedRegression(Xs, y, likelihood="poisson")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        direct = TypeII(gpvi.CVI(progress_bar=False), prior=None).run(model)   # CVI's default start: log counts
    back = load_fit(out).posterior
    torch.testing.assert_close(back.theta, direct.theta, rtol=0, atol=1e-10)
    torch.testing.assert_close(back.m, direct.m, rtol=0, atol=1e-10)


def test_student_t_learns_the_likelihood_on_the_standardised_target(data, capsys):
    tmp, X, rng = data
    y = _targets("student-t", X, rng)
    out = tmp / "t.pt"
    assert main(["fit-regression", str(_write(tmp / "t.csv", X, y)), "--target", "y", "--likelihood", "student-t",
                 "--no-progress", "--save", str(out)]) == 0
    text = capsys.readouterr().out
    lik = load_fit(out).posterior.model.likelihood
    assert re.search(r"likelihood StudentT\(df=\S+, scale=\S+\): df, scale learned \(\d+ rounds, converged\)", text)
    Xs, ys = (X - X.mean(0)) / X.std(0), (y - y.mean()) / y.std()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        direct = LikelihoodTypeII(TypeII(gpvi.CVI(progress_bar=False), prior=None)).run(
            gpvi.GPGeneralisedRegression(Xs, ys, likelihood=StudentT(4.0, 0.5)))
    assert lik.spec() == direct.model.likelihood.spec() and lik.df != 4.0


BAD_TARGETS = {
    "negative_count": ("poisson", [3, -1, 2, 0], r"column 'y' must hold counts \(non-negative integers\); rows \[1\] "
                                                 r"hold \[-1\.0\] \(--likelihood poisson; rows counted from 0"),
    "fractional_count": ("negative-binomial", [3, 1.5, 2, 0], r"column 'y' must hold counts .* rows \[1\] hold \[1\.5\]"
                                                             r" \(--likelihood negative-binomial"),
    "beta_zero": ("beta", [0.2, 0.0, 0.5, 0.7], r"column 'y' must be strictly between 0 and 1 for the Beta likelihood; "
                                                r"rows \[1\] hold \[0\.0\]"),
    "beta_above_one": ("beta", [0.2, 0.4, 1.2, 0.7], r"strictly between 0 and 1 .* rows \[2\] hold \[1\.2\]"),
}


@pytest.mark.parametrize("case", sorted(BAD_TARGETS))
def test_targets_the_likelihood_cannot_take_are_one_line_before_fitting(case, data, capsys):
    tmp, X, _ = data
    kind, y, pattern = BAD_TARGETS[case]
    p = _write(tmp / "bad.csv", X[:4], np.asarray(y, dtype=float))
    out = tmp / "never.pt"
    assert main(["fit-regression", str(p), "--target", "y", "--likelihood", kind, "--save", str(out)]) == 2
    cap = capsys.readouterr()
    line = _one_error_line(cap.err)
    assert line.startswith(f"gpvi: error: {p}: ") and re.search(pattern, line), line
    assert cap.out == "" and not out.exists()


def test_bad_counts_subprocess_exit_status_and_one_line(data):
    tmp, X, _ = data
    p = _write(tmp / "bad.csv", X[:4], np.array([1.0, 2.0, -3.0, 0.0]))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "gpvi", "fit-regression", str(p), "--target", "y", "--likelihood",
                        "poisson"], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert r.returncode == 2 and r.stdout == ""
    assert "must hold counts (non-negative integers); rows [2] hold [-3.0]" in _one_error_line(r.stderr)


@pytest.mark.parametrize("flags", [["--method", "ml2"], ["--method", "dsvi"], ["--restarts", "2"],
                                   ["--num-steps", "10"], ["--num-draws", "10"], ["--chains", "2"], ["--warmup", "0"]])
def test_the_gaussian_fits_options_do_not_apply(flags, data, capsys):
    tmp, X, rng = data
    p = _write(tmp / "c.csv", X, _targets("poisson", X, rng))
    assert main(["fit-regression", str(p), "--target", "y", "--likelihood", "poisson", *flags]) == 2
    cap = capsys.readouterr()
    assert re.search(rf"{flags[0]} applies to --likelihood gaussian only; --likelihood poisson is fitted by CVI "
                     "with type-II hyperparameters", _one_error_line(cap.err)) and cap.out == ""


def test_gaussian_is_the_default_and_keeps_its_options(data, capsys):
    tmp, X, rng = data
    p = _write(tmp / "r.csv", X, _targets("student-t", X, rng))
    args = gpvi.cli.build_parser().parse_args(["fit-regression", str(p), "--target", "y"])
    assert args.likelihood == "gaussian"
    assert main(["fit-regression", str(p), "--target", "y", "--likelihood", "gaussian", "--method", "ml2",
                 "--restarts", "1", "--no-progress"]) == 0
    assert "PointPosterior summary" in capsys.readouterr().out
    assert main(["fit-regression", str(p), "--target", "y", "--likelihood", "cauchy"]) == 2
    assert "invalid choice: 'cauchy'" in capsys.readouterr().err
    assert main(["fit-regression", "--help"]) == 0
    assert "--likelihood {gaussian,poisson,negative-binomial,student-t,laplace,beta}" in capsys.readouterr().out


def test_predict_refuses_num_draws_for_a_generalised_fit(data, capsys):
    tmp, X, rng = data
    p = _write(tmp / "c.csv", X, _targets("poisson", X, rng))
    out = tmp / "p.pt"
    assert main(["fit-regression", str(p), "--target", "y", "--likelihood", "poisson", "--no-progress",
                 "--save", str(out)]) == 0
    capsys.readouterr()
    assert main(["predict", str(out), str(p), "--num-draws", "5"]) == 2
    assert ("--num-draws applies to Gaussian regression fits only; " in
            _one_error_line(capsys.readouterr().err))


def test_ctrl_c_exits_130_and_saves_nothing(data, monkeypatch, capsys):
    from gpvi.inference.progress import Progress

    tmp, X, rng = data
    p = _write(tmp / "t.csv", X, _targets("student-t", X, rng))

    def update(self, n=1, **postfix):
        raise KeyboardInterrupt

    monkeypatch.setattr(Progress, "update", update)
    out = tmp / "fit.pt"
    assert main(["fit-regression", str(p), "--target", "y", "--likelihood", "student-t", "--no-progress",
                 "--save", str(out)]) == 130
    assert capsys.readouterr().err.strip() == "gpvi: interrupted (Ctrl-C); nothing was saved"
    assert sorted(f.name for f in tmp.iterdir()) == ["t.csv"]
