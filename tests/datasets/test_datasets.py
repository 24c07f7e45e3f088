"""Tests for gpvi.datasets: bundled files, splits, standardisation and argument checks.

The raw values are re-read here with :class:`csv.DictReader`, independently of the
loaders' own parser, and every property is checked against them.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import math
import random
import re
from importlib import resources

import numpy as np
import pytest
import torch

import gpvi.datasets as datasets
from gpvi.datasets import Dataset

DATA = resources.files("gpvi.datasets").joinpath("data")

CSV_FILES = (
    "boston.csv",
    "bodyfat.csv",
    "pendulum.csv",
    "pima.csv",
    "ionosphere.csv",
    "sonar.csv",
    "ripley_synth.csv",
)

# name -> (loader, n_train, n_test, n_features) with default arguments
EXPECTED = {
    "boston": (datasets.load_boston, 455, 51, 13),
    "bodyfat": (datasets.load_bodyfat, 227, 25, 14),
    "pendulum": (datasets.load_pendulum, 315, 315, 9),
    "pima": (datasets.load_pima, 200, 332, 7),
    "ionosphere": (datasets.load_ionosphere, 246, 105, 34),
    "sonar": (datasets.load_sonar, 146, 62, 60),
    "ripley": (datasets.load_ripley, 250, 1000, 2),
    "breast_cancer": (datasets.load_breast_cancer, 398, 171, 30),
}
SEEDED = ("boston", "bodyfat", "pendulum", "ionosphere", "sonar", "breast_cancer")
REGRESSION = ("boston", "bodyfat", "pendulum")
FILE_OF = {
    "boston": "boston.csv",
    "bodyfat": "bodyfat.csv",
    "pendulum": "pendulum.csv",
    "pima": "pima.csv",
    "ionosphere": "ionosphere.csv",
    "sonar": "sonar.csv",
    "ripley": "ripley_synth.csv",
}


def raw_table(filename: str) -> list[dict[str, str]]:
    text = DATA.joinpath(filename).read_text(encoding="utf-8")
    return list(csv.DictReader(io.StringIO(text, newline="")))


def raw_xy(name: str, ds: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Raw inputs (columns in ds.feature_names order) and raw targets, all source rows."""
    if name == "breast_cancer":
        sklearn_datasets = pytest.importorskip("sklearn.datasets")
        bunch = sklearn_datasets.load_breast_cancer()
        return np.asarray(bunch.data, dtype=float), np.asarray(bunch.target, dtype=float)
    rows = raw_table(FILE_OF[name])
    target = "y" if ds.task == "regression" else "label"
    X = np.array([[float(r[c]) for c in ds.feature_names] for r in rows])
    y = np.array([float(r[target]) for r in rows])
    return X, y


@pytest.fixture(scope="module", params=list(EXPECTED))
def name(request: pytest.FixtureRequest) -> str:
    if request.param == "breast_cancer":
        pytest.importorskip("sklearn")
    return request.param


# ---------------------------------------------------------------------------------------------
# Packaged files


def test_sha256_of_packaged_csvs_match_provenance() -> None:
    text = DATA.joinpath("PROVENANCE.md").read_text(encoding="utf-8")
    listed = dict(
        (m.group(2), m.group(1))
        for m in re.finditer(r"^([0-9a-f]{64})  (\S+\.csv)$", text, flags=re.MULTILINE)
    )
    packaged = sorted(p.name for p in DATA.iterdir() if p.name.endswith(".csv"))
    assert sorted(listed) == sorted(CSV_FILES) == packaged
    for filename, digest in listed.items():
        assert hashlib.sha256(DATA.joinpath(filename).read_bytes()).hexdigest() == digest, filename


def test_provenance_starts_with_gpvi_section_and_keeps_original_note() -> None:
    text = DATA.joinpath("PROVENANCE.md").read_text(encoding="utf-8")
    assert text.startswith("# How gpvi uses these files")
    assert "# Benchmark data sets for the GP toolkit" in text


# ---------------------------------------------------------------------------------------------
# Shapes, dtypes, splits


def test_shapes_dtypes_and_metadata(name: str) -> None:
    loader, n_train, n_test, d = EXPECTED[name]
    ds = loader()
    assert isinstance(ds, Dataset) and ds.name == name
    assert (ds.n_train, ds.n_test, ds.n_features) == (n_train, n_test, d)
    assert ds.X_train.shape == (n_train, d) and ds.X_test.shape == (n_test, d)
    assert ds.y_train.shape == (n_train,) and ds.y_test.shape == (n_test,)
    assert ds.x_mean.shape == (d,) and ds.x_std.shape == (d,)
    for t in (ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.x_mean, ds.x_std):
        assert t.dtype == torch.float64
        assert torch.isfinite(t).all()
    assert len(ds.feature_names) == d and all(isinstance(f, str) for f in ds.feature_names)
    assert isinstance(ds.y_mean, float) and isinstance(ds.y_std, float)
    assert ds.task == ("regression" if name in REGRESSION else "classification")
    if name in SEEDED:
        assert ds.seed == 0 and ds.split.startswith("random")
    else:
        assert ds.seed is None and ds.split == "original"
    if ds.task == "classification":
        assert (ds.y_mean, ds.y_std) == (0.0, 1.0)
        for y in (ds.y_train, ds.y_test):
            assert set(y.unique().tolist()) == {0.0, 1.0}


def test_train_and_test_partition_the_source_rows(name: str) -> None:
    ds = EXPECTED[name][0]()
    X_raw, _ = raw_xy(name, ds)
    train, test = ds.train_indices.tolist(), ds.test_indices.tolist()
    assert not set(train) & set(test)
    assert sorted(train + test) == list(range(len(X_raw)))


def test_boston_split_follows_the_round_half_up_rule() -> None:
    # 90/10 rule: n_test = floor(test_fraction * N + 0.5) = floor(50.6 + 0.5) = 51, n_train = 455.
    assert math.floor(0.1 * 506 + 0.5) == 51
    ds = datasets.load_boston(seed=0)
    assert (ds.n_train, ds.n_test) == (455, 51)
    assert ds.split == "random 90/10 seed=0"
    # An exact half rounds up: 0.25 * 506 = 126.5 -> 127.
    assert datasets.load_boston(test_fraction=0.25).n_test == 127
    assert datasets.load_bodyfat(test_fraction=0.2).n_test == 50  # floor(50.4 + 0.5)


@pytest.mark.parametrize(
    ("loader", "filename", "train_counts", "test_counts"),
    [
        # (n label 1, n label 0) per part, as documented in MASS.
        (datasets.load_pima, "pima.csv", (68, 132), (109, 223)),
        (datasets.load_ripley, "ripley_synth.csv", (125, 125), (500, 500)),
    ],
)
def test_original_splits_sizes_and_class_counts(
    loader, filename, train_counts, test_counts
) -> None:
    ds = loader()
    assert ds.split == "original" and ds.seed is None
    assert (int(ds.y_train.sum()), int((ds.y_train == 0).sum())) == train_counts
    assert (int(ds.y_test.sum()), int((ds.y_test == 0).sum())) == test_counts
    rows = raw_table(filename)
    assert [i for i, r in enumerate(rows) if r["split"] == "train"] == ds.train_indices.tolist()
    assert [i for i, r in enumerate(rows) if r["split"] == "test"] == ds.test_indices.tolist()
    assert "split" not in ds.feature_names and "label" not in ds.feature_names


@pytest.mark.parametrize(
    ("loader", "test_counts"),
    [
        # (label 0, label 1) in the test set: largest-remainder allocation of the total.
        (datasets.load_ionosphere, (38, 67)),  # 105 * (126, 225) / 351 = (37.7, 67.3)
        (datasets.load_sonar, (29, 33)),  # 62 * (97, 111) / 208 = (28.9, 33.1)
    ],
)
def test_stratified_split_class_counts(loader, test_counts) -> None:
    for seed in (0, 1, 7):
        ds = loader(seed=seed)
        assert (int((ds.y_test == 0).sum()), int(ds.y_test.sum())) == test_counts
    plain = loader(seed=0, stratify=False)
    assert plain.n_test == ds.n_test and "stratified" not in plain.split


def test_splits_are_deterministic_given_seed(name: str) -> None:
    if name not in SEEDED:
        a, b = EXPECTED[name][0](), EXPECTED[name][0]()
        assert torch.equal(a.train_indices, b.train_indices)
        return
    loader = EXPECTED[name][0]
    a, b, c = loader(seed=0), loader(seed=0), loader(seed=1)
    for field in ("X_train", "y_train", "X_test", "y_test", "x_mean", "x_std", "train_indices"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert not torch.equal(a.test_indices, c.test_indices)
    assert not torch.equal(a.x_mean, c.x_mean)
    assert c.seed == 1 and c.split.endswith("seed=1")


def test_numpy_integer_seed_is_accepted() -> None:
    a = datasets.load_boston(seed=np.int64(3))
    assert a.seed == 3 and type(a.seed) is int
    assert torch.equal(a.test_indices, datasets.load_boston(seed=3).test_indices)


def test_pendulum_n_train_and_unused_fold_column() -> None:
    ds = datasets.load_pendulum(seed=2, n_train=100)
    assert (ds.n_train, ds.n_test) == (100, 530)
    assert ds.split == "random 100/530 seed=2"
    assert ds.feature_names == tuple(f"x{i}" for i in range(1, 10))


# ---------------------------------------------------------------------------------------------
# Standardisation


def test_train_inputs_are_standardised(name: str) -> None:
    ds = EXPECTED[name][0]()
    X = ds.X_train
    constant = X.max(0).values == X.min(0).values
    varying = X[:, ~constant]
    assert varying.mean(0).abs().max() < 1e-12
    assert (varying.std(0, correction=0) - 1).abs().max() < 1e-12
    assert (X[:, constant] == 0).all() and (ds.x_std[constant] == 1).all()
    if ds.task == "regression":
        assert abs(float(ds.y_train.mean())) < 1e-12
        assert abs(float(ds.y_train.std(correction=0)) - 1) < 1e-12


def test_test_inputs_use_training_statistics(name: str) -> None:
    ds = EXPECTED[name][0]()
    X_raw, y_raw = raw_xy(name, ds)
    train, test = ds.train_indices.numpy(), ds.test_indices.numpy()
    mean, std = X_raw[train].mean(0), X_raw[train].std(0)
    constant = X_raw[train].max(0) == X_raw[train].min(0)
    expected_mean = np.where(constant, X_raw[train][0], mean)
    np.testing.assert_allclose(ds.x_mean.numpy(), expected_mean, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(ds.x_std.numpy(), np.where(constant, 1.0, std), rtol=1e-13)
    expected_test = (X_raw[test] - expected_mean) / np.where(constant, 1.0, std)
    np.testing.assert_allclose(ds.X_test.numpy(), expected_test, rtol=1e-12, atol=1e-12)
    # ... and not the test rows' own statistics (which would centre X_test exactly).
    assert not np.allclose(ds.x_mean.numpy(), X_raw[test].mean(0))
    if ds.task == "regression":
        assert ds.y_mean == pytest.approx(y_raw[train].mean(), rel=1e-13)
        assert ds.y_std == pytest.approx(y_raw[train].std(), rel=1e-13)
        assert ds.y_mean != pytest.approx(y_raw[test].mean(), rel=1e-6)


def test_ionosphere_constant_column_has_unit_std() -> None:
    ds = datasets.load_ionosphere()
    j = ds.feature_names.index("V2")
    assert float(ds.x_std[j]) == 1.0 and float(ds.x_mean[j]) == 0.0
    assert (ds.X_train[:, j] == 0).all() and (ds.X_test[:, j] == 0).all()
    assert (ds.x_std > 0).all()


def test_y_to_original_round_trips_to_raw_values(name: str) -> None:
    ds = EXPECTED[name][0]()
    X_raw, y_raw = raw_xy(name, ds)
    parts = ((ds.X_train, ds.y_train, ds.train_indices), (ds.X_test, ds.y_test, ds.test_indices))
    for X, y, idx in parts:
        rows = idx.numpy()
        back = ds.y_to_original(y)
        assert back.dtype == torch.float64 and back.shape == y.shape
        np.testing.assert_allclose(back.numpy(), y_raw[rows], rtol=1e-12, atol=1e-12)
        X_back = (X * ds.x_std + ds.x_mean).numpy()
        np.testing.assert_allclose(X_back, X_raw[rows], rtol=1e-12, atol=1e-12)
    if ds.task == "classification":
        assert torch.equal(ds.y_to_original(ds.y_test), ds.y_test)  # identity, labels exact


def test_y_to_original_accepts_numpy_and_scalars() -> None:
    ds = datasets.load_boston()
    assert float(ds.y_to_original(0.0)) == ds.y_mean
    out = ds.y_to_original(np.ones((2, 3)))
    assert out.shape == (2, 3) and out.dtype == torch.float64
    assert float(out[0, 0]) == pytest.approx(ds.y_mean + ds.y_std)
    assert ds.y_to_original(torch.zeros(2, dtype=torch.float32)).dtype == torch.float64


# ---------------------------------------------------------------------------------------------
# Bodyfat specifics


def test_bodyfat_include_density_changes_inputs() -> None:
    with_density = datasets.load_bodyfat(seed=0)
    without = datasets.load_bodyfat(seed=0, include_density=False)
    assert (with_density.n_features, without.n_features) == (14, 13)
    assert with_density.feature_names[0] == "Density" and "Density" not in without.feature_names
    assert with_density.feature_names[1:] == without.feature_names
    # Same split either way; the targets are identical.
    assert torch.equal(with_density.test_indices, without.test_indices)
    assert torch.equal(with_density.y_test, without.y_test)
    torch.testing.assert_close(with_density.X_train[:, 1:], without.X_train, rtol=0, atol=0)


def test_bodyfat_known_bad_rows_are_kept() -> None:
    rows = raw_table("bodyfat.csv")
    assert len(rows) == 252
    case = {k: rows[k - 1] for k in (42, 48, 76, 96, 182)}  # 1-based StatLib case numbers
    assert float(case[42]["Height"]) == 29.5
    assert float(case[182]["y"]) == 0.0
    for k in (48, 76, 96):  # Density digit errors: Siri's equation disagrees by > 4 points
        assert abs(495 / float(case[k]["Density"]) - 450 - float(case[k]["y"])) > 4
    ds = datasets.load_bodyfat(seed=3)  # with this seed case 182 is a test row
    assert 181 in ds.test_indices.tolist()
    i = ds.test_indices.tolist().index(181)
    assert float(ds.y_to_original(ds.y_test[i])) == pytest.approx(0.0, abs=1e-12)
    j = ds.train_indices.tolist().index(41)
    height = ds.feature_names.index("Height")
    raw_height = ds.X_train[j, height] * ds.x_std[height] + ds.x_mean[height]
    assert float(raw_height) == pytest.approx(29.5)


def test_breast_cancer_matches_sklearn_and_keeps_its_label_coding() -> None:
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    bunch = sklearn_datasets.load_breast_cancer()
    ds = datasets.load_breast_cancer(seed=0)
    assert ds.feature_names == tuple(bunch.feature_names)
    assert list(bunch.target_names) == ["malignant", "benign"]  # label 1 = benign
    assert int(ds.y_train.sum() + ds.y_test.sum()) == 357
    assert (int((ds.y_test == 0).sum()), int(ds.y_test.sum())) == (64, 107)


# ---------------------------------------------------------------------------------------------
# Arguments and dispatch

SEED_LOADERS = [
    datasets.load_boston,
    datasets.load_bodyfat,
    datasets.load_pendulum,
    datasets.load_ionosphere,
    datasets.load_sonar,
    datasets.load_breast_cancer,
]
FRACTION_LOADERS = [l for l in SEED_LOADERS if l is not datasets.load_pendulum]


@pytest.mark.parametrize("loader", SEED_LOADERS)
@pytest.mark.parametrize(
    ("seed", "error"),
    [(-1, ValueError), (1.5, TypeError), ("0", TypeError), (None, TypeError), (True, TypeError)],
)
def test_bad_seed_raises_naming_seed(loader, seed, error) -> None:
    with pytest.raises(error, match=r"\bseed\b"):
        loader(seed=seed)


@pytest.mark.parametrize("loader", FRACTION_LOADERS)
@pytest.mark.parametrize(
    ("fraction", "error"),
    [
        (0.0, ValueError),
        (1.0, ValueError),
        (-0.1, ValueError),
        (1.5, ValueError),
        (float("nan"), ValueError),
        (1e-6, ValueError),  # rounds to 0 test rows
        (0.99999, ValueError),  # rounds to 0 training rows
        ("0.1", TypeError),
        (None, TypeError),
    ],
)
def test_bad_test_fraction_raises_naming_it(loader, fraction, error) -> None:
    with pytest.raises(error, match="test_fraction"):
        loader(test_fraction=fraction)


@pytest.mark.parametrize(
    ("n_train", "error"),
    [(0, ValueError), (630, ValueError), (-5, ValueError), (315.0, TypeError), (True, TypeError)],
)
def test_bad_n_train_raises_naming_it(n_train, error) -> None:
    with pytest.raises(error, match="n_train"):
        datasets.load_pendulum(n_train=n_train)


def test_n_train_extremes_are_allowed() -> None:
    assert datasets.load_pendulum(n_train=1).n_test == 629
    assert datasets.load_pendulum(n_train=629).n_test == 1


def test_bad_flags_raise_naming_them() -> None:
    with pytest.raises(TypeError, match="include_density"):
        datasets.load_bodyfat(include_density="no")
    with pytest.raises(TypeError, match="stratify"):
        datasets.load_sonar(stratify=1)


def test_load_dispatches_by_name() -> None:
    ds = datasets.load("BodyFat", seed=2, include_density=False)
    assert ds.name == "bodyfat" and ds.seed == 2 and ds.n_features == 13
    assert torch.equal(datasets.load("pima").X_test, datasets.load_pima().X_test)
    with pytest.raises(ValueError, match=r"unknown data set name 'usps'.*'boston'.*'ripley'"):
        datasets.load("usps")
    with pytest.raises(TypeError, match="name must be a str"):
        datasets.load(3)
    with pytest.raises(TypeError):
        datasets.load("pima", seed=0)  # the original split takes no seed


def test_public_api() -> None:
    assert set(datasets.__all__) == {"Dataset", "load"} | {f"load_{n}" for n in EXPECTED}
    for name in datasets.__all__:
        doc = getattr(datasets, name).__doc__
        assert doc and "Examples" in doc, name
        assert "%(" not in doc and ("Raises" in doc or name in ("load_pima", "load_ripley")), name   # parts filled


# ---------------------------------------------------------------------------------------------
# Dataset container


def test_dataset_is_frozen_and_has_short_repr() -> None:
    ds = datasets.load_pima()
    with pytest.raises(dataclasses.FrozenInstanceError):
        ds.seed = 3  # type: ignore[misc]
    expected = "Dataset('pima', classification, train 200 x 7, test 332 x 7, split='original')"
    assert repr(ds) == expected
    assert ds == ds and ds != datasets.load_pima()  # identity comparison, no tensor ambiguity


def test_dataset_validates_its_fields() -> None:
    ds = datasets.load_ripley()
    with pytest.raises(ValueError, match="X_train must be a torch.float64 tensor"):
        dataclasses.replace(ds, X_train=ds.X_train.float())
    with pytest.raises(ValueError, match="task"):
        dataclasses.replace(ds, task="ranking")
    with pytest.raises(ValueError, match="0/1 labels"):
        dataclasses.replace(ds, y_test=ds.y_test * 2)
    with pytest.raises(ValueError, match="rows"):
        dataclasses.replace(ds, y_train=ds.y_train[:-1])


# ---------------------------------------------------------------------------------------------
# Global random state


def test_loaders_do_not_touch_global_rng(name: str) -> None:
    loader = EXPECTED[name][0]
    torch.manual_seed(123)
    np.random.seed(123)
    random.seed(123)
    torch_state = torch.random.get_rng_state()
    np_state = np.random.get_state()
    py_state = random.getstate()
    loader()
    if name in SEEDED:
        loader(seed=5)
    assert torch.equal(torch.random.get_rng_state(), torch_state)
    after = np.random.get_state()
    assert after[0] == np_state[0] and after[2:] == np_state[2:]
    assert np.array_equal(after[1], np_state[1])
    assert random.getstate() == py_state
