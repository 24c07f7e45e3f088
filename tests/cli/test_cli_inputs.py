"""The ``gpvi`` command's choice of inputs and labels: text class labels (fit and ``predict``), ``--features`` /
``--exclude``, row-name and row-number columns (left out or warned about, never silently fitted on), the saved
fit's input columns in ``predict``, the short classifier summary and ``--latent``.

All in-process through :func:`gpvi.cli.main` on small CSV files in a temporary folder.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import gpvi
import gpvi.cli as cli
from gpvi._cli_csv import InputColumnWarning, read_csv
from gpvi.cli import CLIError, load_csv, load_fit, main


def _error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpvi: error: "), err
    return lines[0]


def _warnings(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("gpvi: warning: InputColumnWarning: ")]


def _write(path: Path, header: list[str], columns: list[list]) -> Path:
    lines = [",".join(header)] + [",".join(str(v) for v in row) for row in zip(*columns)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def text_labels(tmp_path):
    """40 rows: inputs a, b; label 'yes' where a + noise > 0, else 'no'."""
    rng = np.random.default_rng(5)
    X = rng.uniform(-2, 2, (40, 2))
    lab = np.where(X[:, 0] + 0.3 * rng.standard_normal(40) > 0, "yes", "no")
    return _write(tmp_path / "yn.csv", ["a", "b", "label"], [X[:, 0].tolist(), X[:, 1].tolist(), lab.tolist()]), X, lab


@pytest.fixture
def mcycle(tmp_path):
    """mcycle as R's write.csv exports it: a first column with an empty header holding "1".."N" (quoted)."""
    rng = np.random.default_rng(6)
    t = np.sort(rng.uniform(0, 60, 40))
    accel = np.where(t > 15, -100 * np.sin((t - 15) / 8) * np.exp(-(t - 15) / 20), 0) + 5 * rng.standard_normal(40)
    p = tmp_path / "mcycle.csv"
    p.write_text('"","times","accel"\n' + "".join(f'"{i + 1}",{a:.3f},{b:.3f}\n' for i, (a, b) in
                                                 enumerate(zip(t, accel))))
    return p, t, accel


# ------------------------------------------------------------------------------------------------ text labels
def test_text_labels_fit_save_and_predict_prints_them(text_labels, tmp_path, capsys):
    p, X, lab = text_labels
    fit_file = tmp_path / "yn.pt"
    assert main(["fit-classifier", str(p), "--target", "label", "--hyperparameters", "fixed", "--no-progress",
                 "--save", str(fit_file)]) == 0
    out = capsys.readouterr().out
    assert "classes ['no', 'yes'] (positive: yes)" in out
    err = float(re.search(r"training error (\S+)", out).group(1))
    assert err < 0.3
    fit = load_fit(fit_file)
    assert fit.classes == ["no", "yes"] and fit.features == ["a", "b"]
    new = _write(tmp_path / "new.csv", ["b", "a"], [[0.0, 0.0], [1.5, -1.5]])        # by name, other order
    assert main(["predict", str(fit_file), str(new)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "p_no,p_yes,label"
    assert [ln.split(",")[-1] for ln in lines[1:]] == ["yes", "no"]
    P = np.array([[float(v) for v in ln.split(",")[:2]] for ln in lines[1:]])
    np.testing.assert_allclose(P, fit.predict_proba(np.array([[1.5, 0.0], [-1.5, 0.0]])), rtol=0, atol=1e-12)


def test_three_text_classes(tmp_path, capsys):
    rng = np.random.default_rng(0)
    names = np.repeat(["setosa", "versicolor", "virginica"], 12)
    x = rng.normal(size=36) + 3.0 * np.repeat([0, 1, 2], 12)
    p = _write(tmp_path / "iris.csv", ["x", "species"], [x.tolist(), names.tolist()])
    fit_file = tmp_path / "iris.pt"
    assert main(["fit-classifier", str(p), "--target", "species", "--hyperparameters", "fixed", "--no-progress",
                 "--save", str(fit_file)]) == 0
    assert "classes ['setosa', 'versicolor', 'virginica'], likelihood softmax" in capsys.readouterr().out
    new = _write(tmp_path / "new.csv", ["x"], [[0.0, 6.0]])
    assert main(["predict", str(fit_file), str(new)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "p_setosa,p_versicolor,p_virginica,label"
    assert [ln.split(",")[-1] for ln in lines[1:]] == ["setosa", "virginica"]


def test_numeric_labels_stay_integers_and_one_and_one_point_zero_are_one_class(tmp_path):
    p = _write(tmp_path / "l.csv", ["a", "label"], [[1, 2, 3, 4], ["1", "0", "1.0", " 0 "]])
    data = read_csv(p, "label", labels=True)
    assert data.y.dtype == np.int64 and data.y.tolist() == [1, 0, 1, 0]
    q = _write(tmp_path / "m.csv", ["a", "label"], [[1, 2, 3], ["1", "yes", "no"]])
    assert read_csv(q, "label", labels=True).y.tolist() == ["1", "yes", "no"]      # text as soon as one is text


# ------------------------------------------------------------------------------------------------ row names
def test_r_rownames_column_is_left_out_with_a_warning(mcycle, tmp_path, capsys):
    p, t, accel = mcycle
    fit_file = tmp_path / "mc.pt"
    assert main(["fit-regression", str(p), "--target", "accel", "--method", "ml2", "--restarts", "1",
                 "--no-progress", "--save", str(fit_file)]) == 0
    cap = capsys.readouterr()
    (w,) = _warnings(cap.err)
    assert "column '' is taken for row names" in w and "is not an input" in w
    assert "inputs: [0] times\n" in cap.out and "d = 1" in cap.out
    assert load_fit(fit_file).features == ["times"]
    new = _write(tmp_path / "new.csv", ["times"], [[10.0, 30.0]])                     # no index column needed
    assert main(["predict", str(fit_file), str(new)]) == 0
    # a column without a name cannot be an input (the model names its hyperparameters by column)
    assert main(["fit-regression", str(p), "--target", "accel", "--no-progress", "--features", ",times"]) == 2
    assert "has a column with an empty header; give it a name" in _error(capsys.readouterr().err)


@pytest.mark.parametrize("header", ["rownames", "Unnamed: 0", "row.names"])
def test_named_row_index_headers_are_left_out(header, tmp_path):
    p = _write(tmp_path / "r.csv", [header, "a", "y"], [["r1", "r2", "r3", "r4"], [0.1, 0.5, 0.2, 0.9],
                                                         [1.0, 2.0, 1.5, 3.0]])
    data = read_csv(p, "y")                                     # text row names are not even read
    assert data.names == ["a"] and len(data.notes) == 1 and repr(header) in data.notes[0]
    assert "name it in --features to use it" in data.notes[0]
    # named in --features, such a column is an input (the user's choice: no note)
    q = _write(tmp_path / "q.csv", [header, "a", "y"], [[1, 2, 3, 4], [0.1, 0.5, 0.2, 0.9], [1.0, 2.0, 1.5, 3.0]])
    data = read_csv(q, "y", features=[header, "a"])
    assert data.names == [header, "a"] and data.notes == [] and data.X[:, 0].tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("start", [0, 1])
def test_row_number_input_is_warned_about_and_excluded_on_request(start, tmp_path, capsys):
    rng = np.random.default_rng(start)
    n = 30
    x = rng.normal(size=n)
    y = np.sin(x) + 0.1 * rng.normal(size=n)
    p = _write(tmp_path / "id.csv", ["id", "x", "y"], [list(range(start, start + n)), x.tolist(), y.tolist()])
    argv = ["fit-regression", str(p), "--target", "y", "--method", "ml2", "--restarts", "1", "--no-progress"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    (w,) = _warnings(cap.err)
    assert f"'id' holds the row numbers {start}..{start + n - 1} in order" in w and "--exclude id" in w
    assert "inputs: [0] id, [1] x" in cap.out                  # kept (it may be a real input such as time)
    assert main([*argv, "--exclude", "id"]) == 0
    cap = capsys.readouterr()
    assert "inputs: [0] x\n" in cap.out and not _warnings(cap.err)
    shuffled = _write(tmp_path / "s.csv", ["id", "x", "y"], [rng.permutation(n).tolist(), x.tolist(), y.tolist()])
    assert read_csv(shuffled, "y").notes == []                 # out of order: not a row index


def test_a_bad_input_gets_only_its_error_not_the_notes(tmp_path, capsys):
    p = _write(tmp_path / "c.csv", ["", "a", "y"], [[1, 2, 3], [0.1, 0.4, 0.2], [3, 3, 3]])
    assert main(["fit-regression", str(p), "--target", "y", "--no-progress"]) == 2
    assert "the target column is constant" in _error(capsys.readouterr().err)


def test_load_csv_issues_the_notes_as_warnings(mcycle):
    p, t, accel = mcycle
    with pytest.warns(InputColumnWarning, match="row names"):
        X, y, names = load_csv(p, "accel")
    assert names == ["times"] and X.shape == (40, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_csv(p, "accel", exclude=[""])[2] == ["times"]


# ------------------------------------------------------------------------------------------------ --features / --exclude
@pytest.fixture
def abc(tmp_path):
    rng = np.random.default_rng(7)
    X = rng.normal(size=(30, 3))
    y = X[:, 1] + 0.1 * rng.normal(size=30)
    w = rng.integers(1, 3, 30)
    lab = (X[:, 1] > 0).astype(int)
    return _write(tmp_path / "abc.csv", ["a", "b", "c", "w", "y", "label"],
                  [X[:, 0].tolist(), X[:, 1].tolist(), X[:, 2].tolist(), w.tolist(), y.tolist(), lab.tolist()])


def test_features_choose_the_inputs_in_order_and_predict_follows_the_saved_fit(abc, tmp_path, capsys):
    fit_file = tmp_path / "f.pt"
    assert main(["fit-regression", str(abc), "--target", "y", "--method", "ml2", "--restarts", "1", "--no-progress",
                 "--features", "c, b", "--save", str(fit_file)]) == 0
    out = capsys.readouterr().out
    assert "inputs: [0] c, [1] b\n" in out and "lengthscale[c]" in out and "lengthscale[a]" not in out
    fit = load_fit(fit_file)
    assert fit.features == ["c", "b"]
    assert main(["predict", str(fit_file), str(abc)]) == 0      # the training CSV: extra columns ignored
    assert len(capsys.readouterr().out.strip().splitlines()) == 31
    missing = _write(tmp_path / "m.csv", ["a", "c"], [[0.0], [0.0]])
    assert main(["predict", str(fit_file), str(missing)]) == 2
    assert "no column 'b'; the fit needs c, b and the file has a, c" in _error(capsys.readouterr().err)


def test_exclude_and_weight_are_not_inputs(abc, tmp_path, capsys):
    fit_file = tmp_path / "w.pt"
    assert main(["fit-classifier", str(abc), "--target", "label", "--weight", "w", "--exclude", "y,c",
                 "--hyperparameters", "fixed", "--no-progress", "--save", str(fit_file)]) == 0
    out = capsys.readouterr().out
    assert "d = 2 (a, b)" in out and "weights from column 'w'" in out
    assert load_fit(fit_file).features == ["a", "b"]
    assert read_csv(abc, "label", weight="w", labels=True).names == ["a", "b", "c", "y"]


BAD_CHOICES = {
    "unknown_feature": (["--features", "a,zz"], r"--features: \S+ has no column 'zz'; its columns are a, b, c, w, y, "
                                                r"label"),
    "unknown_exclude": (["--exclude", "q"], r"--exclude: \S+ has no column 'q'; its columns are a, b, c, w, y, label"),
    "target_as_feature": (["--features", "a,y"], r"--features names 'y' \(the target column\): not an input"),
    "weight_as_feature": (["--features", "a,w", "--weight", "w"], r"--features names 'w' \(the --weight column\)"),
    "twice": (["--features", "a,b,a"], r"--features names 'a' twice"),
    "nothing_left": (["--exclude", "a,b,c,w,label"], r"needs at least one feature column besides 'y'; left out: "
                                                     r"--exclude a, b, c, w, label"),
}


@pytest.mark.parametrize("case", sorted(BAD_CHOICES))
def test_bad_input_choices_are_one_line(case, abc, capsys):
    extra, pattern = BAD_CHOICES[case]
    command = "fit-classifier" if "--weight" in extra else "fit-regression"
    target = "label" if command == "fit-classifier" else "y"
    assert main([command, str(abc), "--target", target, "--no-progress", *extra]) == 2
    cap = capsys.readouterr()
    assert re.search(pattern, _error(cap.err)), cap.err
    assert cap.out == ""


def test_features_and_exclude_are_mutually_exclusive(abc, capsys):
    assert main(["fit-regression", str(abc), "--target", "y", "--features", "a", "--exclude", "b"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(CLIError, match="cannot be used together"):
        read_csv(abc, "y", features=["a"], exclude=["b"])


# ------------------------------------------------------------------------------------------------ summary
def test_latent_prints_one_row_per_training_point(text_labels, capsys):
    p, X, lab = text_labels
    argv = ["fit-classifier", str(p), "--target", "label", "--hyperparameters", "fixed", "--no-progress"]
    assert main([*argv, "--latent"]) == 0
    out = capsys.readouterr().out
    assert "LatentPosterior (CVI)" in out and "f[39]" in out
    assert len(out.splitlines()) >= 40
    assert main([*argv[:-3], "--hyperparameters", "bayes", "--latent"]) == 2
    assert "--latent applies to --hyperparameters type2 and fixed" in _error(capsys.readouterr().err)


def test_classifier_gets_one_progress_argument_and_no_removed_ones(text_labels, monkeypatch, capsys):
    """The command passes neither ``learn_hyperparameters`` nor ``method``, and progress only through
    :func:`gpvi.cli._progress` (one line to change when GPClassifier takes ``verbose``)."""
    p, X, lab = text_labels
    seen = []
    real = gpvi.GPClassifier

    def spy(**kwargs):
        seen.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(gpvi, "GPClassifier", spy)
    assert main(["fit-classifier", str(p), "--target", "label", "--hyperparameters", "fixed", "--no-progress"]) == 0
    (kw,) = seen
    assert not {"learn_hyperparameters", "method"} & set(kw)
    progress = cli._progress(cli.build_parser().parse_args(["fit-classifier", "x.csv", "--target", "y",
                                                             "--no-progress"]))
    assert len(progress) == 1 and set(progress) <= set(kw)
