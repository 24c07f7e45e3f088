"""The validation layer and a property-based attack on the public API (issue 8).

Hypothesis throws malformed inputs (wrong ndim, empty, NaN/inf, object/str/complex dtypes, mismatched lengths)
at the public entry points and asserts that only clear ``ValueError``/``TypeError`` come out — never a
``RuntimeError`` from inside torch — and that accepted inputs give finite results.
"""

from __future__ import annotations

import math

import gpytorch
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gpvi
from gpvi import validation as V

_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                     derandomize=True)

_dtypes = st.sampled_from([np.float64, np.float32, np.int64, np.int32, np.bool_, np.complex128, np.object_, np.str_])


@st.composite
def arrays(draw, max_dims=3):
    dtype = draw(_dtypes)
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=0, max_side=6))
    if dtype is np.object_:
        return np.array(draw(st.lists(st.one_of(st.floats(), st.text(max_size=2), st.none()), max_size=6)),
                        dtype=object)
    if dtype is np.str_:
        return np.array(draw(st.lists(st.text(max_size=3), max_size=5)))
    elements = st.floats(allow_nan=True, allow_infinity=True, width=32) if dtype in (np.float32,) else None
    return draw(hnp.arrays(dtype, shape, elements=elements))


inputs = st.one_of(arrays(), st.none(), st.text(max_size=3), st.floats(), st.lists(st.floats(), max_size=4))


@_SETTINGS
@given(X=inputs, y=inputs)
def test_gp_regression_rejects_bad_data_cleanly(X, y):
    try:
        model = gpvi.GPRegression(X, y)
    except (ValueError, TypeError):
        return
    # accepted: data must be finite float64 and the log joint finite at a sane theta
    assert model.X.dtype == torch.float64 and bool(torch.isfinite(model.X).all())
    val = model.log_joint(model.initial_theta())
    assert math.isfinite(float(val))


@_SETTINGS
@given(theta=inputs)
def test_log_joint_rejects_bad_theta_cleanly(theta):
    X = torch.linspace(-1, 1, 8, dtype=torch.float64).unsqueeze(-1)
    model = gpvi.GPRegression(X, torch.sin(3 * X[:, 0]))
    try:
        out = model.log_joint(theta)
    except (ValueError, TypeError, gpvi.NotPSDError):
        return
    assert out.dtype == torch.float64
    assert not bool(torch.isnan(out).any())


@_SETTINGS
@given(p=inputs, y=inputs)
def test_metrics_reject_bad_input_cleanly(p, y):
    for fn in (gpvi.metrics.error_rate, gpvi.metrics.log_loss_bits, gpvi.metrics.smse):
        try:
            out = fn(p, y)
        except (ValueError, TypeError):
            continue
        assert math.isfinite(out)


@_SETTINGS
@given(value=st.one_of(st.integers(-5, 5), st.floats(allow_nan=True), st.none(), st.text(max_size=2), st.booleans()))
def test_settings_validation(value):
    for fn in (lambda v: gpvi.ML2(num_restarts=v), lambda v: gpvi.ML2(init_scale=v),
               lambda v: gpvi.datasets.load_boston(seed=v)):
        try:
            fn(value)
        except (ValueError, TypeError):
            continue


def test_messages_name_the_argument():
    with pytest.raises(ValueError, match=r"beta must be in \(0, 1\]; got -0.5"):
        V.check_fraction(-0.5, "beta")
    with pytest.raises(ValueError, match="num_steps must be >= 1; got 0"):
        V.check_positive_int(0, "num_steps")
    with pytest.raises(TypeError, match="lr must be a real number; got str"):
        V.check_positive("0.1", "lr")
    with pytest.raises(ValueError, match="lr must be > 0; got -1"):
        V.check_positive(-1, "lr")
    with pytest.raises(ValueError, match="X has 3 rows but y has 2"):
        V.check_X_y(np.zeros((3, 1)), np.zeros(2))
    with pytest.raises(ValueError, match="y must hold two classes"):
        V.check_binary_labels([0, 1, 2])
    with pytest.raises(ValueError, match="single class"):
        V.check_binary_labels([1, 1, 1])
    with pytest.raises(ValueError, match=r"labels \{0, 1\} or \{-1, \+1\}; got \{1, 2\}"):
        V.check_binary_labels([1, 2, 1])
    with pytest.raises(ValueError, match="integers larger than 2\\*\\*53"):
        V.as_float_tensor(np.array([2**60, 1], dtype=np.int64), "X")
    with pytest.raises(ValueError, match="refusing to downcast"):
        V.as_float_tensor(torch.zeros(2, dtype=torch.float64), "X", dtype=torch.float32)


def test_conversion_keeps_values_exactly():
    a = np.array([[1, 2], [3, 2**53]], dtype=np.int64)
    t = V.as_float_tensor(a, "X")
    assert t.dtype == torch.float64 and t.tolist() == [[1.0, 2.0], [3.0, float(2**53)]]
    f = np.array([0.1, 1e-30, 3.4e38], dtype=np.float32)
    assert V.as_float_tensor(f, "x").tolist() == [float(v) for v in f]
    y01, classes = V.check_binary_labels(np.array([-1, 1, 1]))
    assert y01.tolist() == [0.0, 1.0, 1.0] and classes.tolist() == [-1, 1]


def test_no_global_rng_touched_by_core_stochastic_routines():
    state = torch.random.get_rng_state().clone()
    np_state = np.random.get_state()[1].copy()
    X = torch.linspace(-1, 1, 12, dtype=torch.float64).unsqueeze(-1)
    model = gpvi.GPRegression(X, torch.sin(3 * X[:, 0]))
    gpvi.ML2(num_restarts=2, seed=0).run(model)
    q = gpvi.GaussianPosterior(torch.zeros(3, dtype=torch.float64), torch.eye(3, dtype=torch.float64), model.names,
                               model)
    q.sample(5, seed=1)
    q.predict(X[:2], num_draws=3)
    q.summary()
    gpvi.rng.resolve_generator(None).seed()
    assert torch.equal(state, torch.random.get_rng_state())
    assert np.array_equal(np_state, np.random.get_state()[1])


# ------------------------------------------------------------------------ issue 16, item 3: checks at construction
def _xy(n=12, d=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (n, d))
    return X, np.sin(3 * X[:, 0]) + 0.1 * rng.standard_normal(n)


@pytest.mark.parametrize("make", [
    lambda: gpytorch.kernels.RBFKernel(ard_num_dims=5),
    lambda: gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=5)),
    lambda: gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=2.5, ard_num_dims=1)),
    lambda: gpytorch.kernels.RBFKernel(active_dims=[0, 4]),
    lambda: gpytorch.kernels.AdditiveKernel(gpytorch.kernels.RBFKernel(active_dims=[0]),
                                            gpytorch.kernels.RBFKernel(ard_num_dims=2, active_dims=[1])),
], ids=["rbf-ard5", "scaled-ard5", "matern-ard1", "active-dims-out", "additive-ard-vs-active"])
def test_kernel_dimensions_are_checked_at_construction(make):
    """A kernel that does not fit X's 2 columns is a ValueError naming the sub-kernel, before any evaluation."""
    X, y = _xy()
    with pytest.raises(ValueError, match=r"kernel.*(ard_num_dims|active_dims)") as err:
        gpvi.GPRegression(X, y, kernel=make())
    assert "column" in str(err.value)
    with pytest.raises(ValueError, match=r"kernel.*(ard_num_dims|active_dims)"):
        gpvi.GPClassification(X, (y > 0).astype(int), kernel=make())


def test_kernels_that_fit_are_accepted_and_active_dims_map_names():
    X, y = _xy(d=3)
    ok = [gpytorch.kernels.RBFKernel(ard_num_dims=3), gpytorch.kernels.RBFKernel(),
          gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2, active_dims=[2, 0]))]
    for k in ok:
        model = gpvi.GPRegression(X, y, kernel=k)
        assert math.isfinite(float(model.log_joint(model.initial_theta())))
    # the active_dims [2, 0] lengthscales are named by the columns they act on (order kept)
    sub = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2, active_dims=[2, 0]))
    model = gpvi.GPRegression(X, y, kernel=sub, feature_names=["a", "b", "c"])
    assert model.names[:2] == ["log_lengthscale_sq[c]", "log_lengthscale_sq[a]"]


def test_object_and_string_arrays_are_refused_naming_the_argument():
    X, y = _xy(2)
    with pytest.raises(TypeError, match=r"^X must be an array of numbers"):
        gpvi.GPRegression([[1, "2"], [3, 4]], [1.0, 2.0])
    with pytest.raises(TypeError, match=r"^X .*non-numeric entry '2' of type str"):
        gpvi.GPRegression(np.array([[1, "2"], [3, 4]], dtype=object), [1.0, 2.0])
    with pytest.raises(TypeError, match=r"^y .*non-numeric entry None"):
        gpvi.GPRegression(X, np.array([1.0, None], dtype=object))
    with pytest.raises(TypeError, match=r"^X_new .*non-numeric"):
        gpvi.GPRegression(*_xy()).predict(np.zeros(4), np.array([[0.5, "x"]], dtype=object))
    # an object array of real numbers (numpy scalars, booleans) is fine and exact
    t = V.as_float_tensor(np.array([1, 2.5, np.float32(0.5), True], dtype=object), "x")
    assert t.tolist() == [1.0, 2.5, 0.5, 1.0]


@pytest.mark.parametrize("make", [
    lambda s: gpvi.ML2(seed=s), lambda s: gpvi.DSVI(seed=s), lambda s: gpvi.NUTS(seed=s),
    lambda s: gpvi.CVI(seed=s), lambda s: gpvi.datasets.load_boston(seed=s),
    lambda s: gpvi.GPClassifier(random_state=s).fit(*_cls()),
], ids=["ML2", "DSVI", "NUTS", "CVI", "datasets", "GPClassifier"])
def test_bad_seeds_fail_at_construction(make):
    with pytest.raises(ValueError, match=r"(seed|random_state).*non-negative"):
        make(-1)
    for bad in (1.5, "3", True):
        with pytest.raises((TypeError, ValueError), match=r"seed|random_state"):
            make(bad)


def _cls():
    X, y = _xy(16)
    return X, (y > 0).astype(int)


def test_check_seed_contract():
    from gpvi.rng import check_seed

    assert check_seed(None) is None and check_seed(np.int64(3)) == 3 and check_seed(0) == 0
    with pytest.raises(ValueError, match="seed must be a non-negative int; got -1"):
        check_seed(-1)
    for bad in (1.0, "1", True, [1]):
        with pytest.raises(TypeError, match="seed must be a non-negative int or None"):
            check_seed(bad)
    with pytest.raises(TypeError, match="random_state must be a non-negative int; got None"):
        check_seed(None, "random_state", allow_none=False)


def test_column_whose_spread_overflows_is_an_error_naming_it():
    X, y = _xy(10)
    X[3, 1] = 1e308
    with pytest.raises(ValueError, match=r"X column 1 \('nox'\) has a spread float64 cannot represent"):
        gpvi.GPRegression(X, y, feature_names=["crim", "nox"])
    with pytest.raises(ValueError, match=r"X column 1 has a spread"):
        gpvi.GPClassification(X, (y > 0).astype(int))
    with pytest.raises(ValueError, match=r"^y has a spread float64 cannot represent"):
        gpvi.GPRegression(X[:, :1], np.r_[1e308, y[1:]])
    # the scaled variance: a constant column of huge values (sd 0) and a wide but representable one pass
    V.check_column_spread(np.c_[np.full(5, 1e300), np.linspace(-1e150, 1e150, 5)])
    # bundled-data standardisation refuses it too (naming the data set and the column)
    from gpvi.datasets._dataset import _build

    Xb = np.c_[np.linspace(0, 1, 6), [0, 1, 2, 3, 1e308, 5]]
    with pytest.raises(ValueError, match=r"data set 'toy': input column 1 \('b'\)"):
        _build(name="toy", task="regression", X=Xb, y=np.arange(6.0), feature_names=("a", "b"),
               train=np.arange(5), test=np.array([5]), seed=0, split="x")


def test_predict_inputs_that_overflow_raise_instead_of_nan():
    X, y = _xy()
    model = gpvi.GPRegression(X, y)
    theta = model.initial_theta()
    Xbig = X[:3] * 1e300
    with pytest.raises(ValueError, match=r"predictive is not finite at \d row\(s\) of X_new \(rows 0, "):
        model.predict(theta, Xbig)
    with pytest.raises(ValueError, match="not finite"):
        model.predict(theta, Xbig, full_cov=True)
    fit = gpvi.PointPosterior(theta, model.names, model)
    with pytest.raises(ValueError, match="not finite"):
        fit.predict(Xbig)
    clf_model = gpvi.GPClassification(X, (y > 0).astype(int))
    with pytest.raises(ValueError, match=r"kernel is not finite .* of X_new"):
        clf_model.cross_covariance(clf_model.theta, Xbig)
    # far but representable inputs still predict (the prior: mean y_offset, y's training mean)
    m, v = model.predict(theta, X[:3] * 1e100)
    assert torch.equal(m, torch.full((3,), model.y_offset, dtype=torch.float64)) and bool(torch.isfinite(v).all())


def test_feature_names_from_dataframe_or_argument():
    pd = pytest.importorskip("pandas")
    X, y = _xy(d=3)
    df = pd.DataFrame(X, columns=["age", "nox", "rm"])
    for model in (gpvi.GPRegression(df, y), gpvi.GPRegression(X, y, feature_names=["age", "nox", "rm"])):
        assert model.names[:3] == ["log_lengthscale_sq[age]", "log_lengthscale_sq[nox]", "log_lengthscale_sq[rm]"]
        assert model.natural_names[1] == "lengthscale[nox]" and model.feature_names == ["age", "nox", "rm"]
        assert torch.equal(model.X, torch.as_tensor(X))
    plain = gpvi.GPRegression(X, y)
    assert plain.names[1] == "log_lengthscale_sq[1]" and plain.feature_names is None
    assert gpvi.GPRegression(pd.DataFrame(X), y).names[0] == "log_lengthscale_sq[0]"     # non-string labels
    cls = gpvi.GPClassification(df, (y > 0).astype(int))
    assert cls.names[0] == "log_lengthscale_sq[age]"
    assert list(cls.describe())[:1] == ["lengthscale[age]"]
    with pytest.raises(ValueError, match="feature_names has 2 names but X has 3 columns"):
        gpvi.GPRegression(X, y, feature_names=["a", "b"])
    with pytest.raises(ValueError, match="duplicate names: 'a'"):
        gpvi.GPRegression(X, y, feature_names=["a", "a", "b"])
    with pytest.raises(TypeError, match="feature_names must be a sequence of str"):
        gpvi.GPRegression(X, y, feature_names="abc")
    with pytest.raises(TypeError, match="feature_names must hold strings"):
        gpvi.GPRegression(X, y, feature_names=["a", 1, "b"])
    with pytest.raises(TypeError, match="X must be an array of numbers"):
        gpvi.GPRegression(pd.DataFrame({"a": [1.0, 2.0], "b": ["x", "y"]}), [0.0, 1.0])


def test_interval_settings_are_checked_and_name_the_argument():
    """check_interval (used by ML2, lbfgs_maximise and TypeII) and TypeII's ftol: tried with a scalar, a string,
    a triple, reversed and equal ends and NaN."""
    from gpvi.inference.cvi.typeii import TypeII
    from gpvi.numerics.lbfgs import lbfgs_maximise
    from gpvi.validation import check_interval

    assert check_interval((-1, 2), "b") == (-1.0, 2.0) and check_interval([0.5, 1], "b") == (0.5, 1.0)
    for bad, err in [(3.0, TypeError), ("ab", TypeError), ((1, 2, 3), TypeError), (("a", 1.0), TypeError),
                     ((2.0, 1.0), ValueError), ((1.0, 1.0), ValueError), ((math.nan, 1.0), ValueError)]:
        with pytest.raises(err, match="theta_bounds"):
            TypeII(theta_bounds=bad)
        with pytest.raises(err, match="bounds"):
            lbfgs_maximise(lambda x: (0.0, x), np.zeros(2), bounds=bad, returns_grad=True)
    for bad, err in [(-1e-8, ValueError), (0.0, ValueError), ("1e-8", TypeError), (math.inf, ValueError)]:
        with pytest.raises(err, match="ftol"):
            TypeII(ftol=bad)
    assert TypeII().settings()["ftol"] == 1e-8 and "ftol=1e-08" in repr(TypeII())
