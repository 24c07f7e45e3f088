"""The validation layer and a property-based attack on the public API (issue 8).

Hypothesis throws malformed inputs (wrong ndim, empty, NaN/inf, object/str/complex dtypes, mismatched lengths)
at the public entry points and asserts that only clear ``ValueError``/``TypeError`` come out — never a
``RuntimeError`` from inside torch — and that accepted inputs give finite results.
"""

from __future__ import annotations

import math

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
