"""Reduce*, ArgMax/ArgMin, CumSum/CumProd: hand-checked values for thinly covered edges."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from reference import NodeError
from tests.reference.oneop import op_function, run_node


def axes(*a):
    return np.array(a, dtype=np.int64)


X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


# axes: attribute vs input, negative axes, keepdims ---------------------------------------
def test_sum_axes_input_negative_non_square():
    # sum over axes 0 and 2 of 12i + 4j + k = 60 + 32j
    y = run_node("ReduceSum", X, axes(-1, 0), keepdims=0, opset=13)
    np.testing.assert_array_equal(y, np.array([60, 92, 124], np.float32))
    assert y.dtype == np.float32
    y = run_node("ReduceSum", X, axes(-1, 0), keepdims=1, opset=13)
    assert y.shape == (1, 3, 1)


def test_attribute_axes_before_input_form():
    # ReduceMean-13 and ReduceSum-11 still take axes as an attribute.
    y = run_node("ReduceMean", X, axes=[-2], keepdims=0, opset=13)
    np.testing.assert_array_equal(y, np.array([[4, 5, 6, 7], [16, 17, 18, 19]], np.float32))
    y = run_node("ReduceSum", X, axes=[1, 2], opset=11)
    np.testing.assert_array_equal(y, np.array([[[66]], [[210]]], np.float32))


def test_default_axes_reduce_everything():
    assert run_node("ReduceSum", X, keepdims=0).shape == ()
    assert float(run_node("ReduceSum", X, keepdims=0)) == 276.0
    assert run_node("ReduceMax", X, opset=11).shape == (1, 1, 1)
    assert run_node("ReduceProd", np.array([[2.0, 3.0]], np.float32), axes(), keepdims=0) == 6.0


def test_noop_with_empty_axes_keeps_elementwise_steps():
    x = np.array([[1.0, -2.0], [4.0, 0.5]], np.float32)
    empty = axes()
    np.testing.assert_array_equal(run_node("ReduceSum", x, empty, noop_with_empty_axes=1), x)
    np.testing.assert_array_equal(run_node("ReduceSum", x, noop_with_empty_axes=1), x)
    np.testing.assert_array_equal(run_node("ReduceSumSquare", x, empty, noop_with_empty_axes=1),
                                  x * x)
    np.testing.assert_array_equal(run_node("ReduceL1", x, empty, noop_with_empty_axes=1), np.abs(x))
    y = run_node("ReduceLogSumExp", x, empty, noop_with_empty_axes=1)
    np.testing.assert_allclose(y, x, rtol=1e-6)
    y = run_node("ReduceLogSum", np.abs(x), empty, noop_with_empty_axes=1)
    np.testing.assert_allclose(y, np.log(np.abs(x)), rtol=1e-6)
    # noop_with_empty_axes=0: an empty axes list means every axis
    assert run_node("ReduceSum", x, empty, keepdims=0) == 3.5


def test_scalar_input():
    s = np.array(2.5, np.float32)
    for keepdims in (0, 1):
        y = run_node("ReduceSum", s, keepdims=keepdims)
        assert y.shape == () and y.dtype == np.float32 and y == 2.5
    assert run_node("ReduceSumSquare", s, axes(0)) == 6.25
    assert run_node("ReduceMax", s, opset=13, axes=[-1]) == 2.5


def test_l1_l2_values():
    x = np.array([[3.0, -4.0], [5.0, -12.0]], np.float32)
    np.testing.assert_array_equal(run_node("ReduceL2", x, axes(1), keepdims=0), [5.0, 13.0])
    np.testing.assert_array_equal(run_node("ReduceL1", x, axes(1), keepdims=0), [7.0, 17.0])
    np.testing.assert_array_equal(run_node("ReduceSumSquare", x, axes(0), keepdims=0),
                                  [34.0, 160.0])


# empty sets -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "op_type, expected",
    [
        ("ReduceMax", -np.inf),
        ("ReduceMin", np.inf),
        ("ReduceSum", 0.0),
        ("ReduceProd", 1.0),
        ("ReduceL1", 0.0),
        ("ReduceL2", 0.0),
        ("ReduceSumSquare", 0.0),
        ("ReduceLogSum", -np.inf),
        ("ReduceLogSumExp", -np.inf),
    ],
)
def test_empty_set(op_type, expected):
    x = np.zeros((2, 0, 3), np.float32)
    y = run_node(op_type, x, axes(1))
    assert y.shape == (2, 1, 3) and y.dtype == np.float32
    assert np.all(y == expected)


def test_empty_set_integer_and_bool_extremes():
    x = np.zeros((0, 2), np.int32)
    np.testing.assert_array_equal(run_node("ReduceMax", x, axes(0), keepdims=0), [-(2**31)] * 2)
    np.testing.assert_array_equal(run_node("ReduceMin", x, axes(0), keepdims=0), [2**31 - 1] * 2)
    u = np.zeros((0,), np.uint8)
    assert run_node("ReduceMin", u, axes(0), keepdims=0) == 255
    b = np.zeros((3, 0), np.bool_)
    np.testing.assert_array_equal(run_node("ReduceMax", b, axes(1), keepdims=0), [False] * 3)
    np.testing.assert_array_equal(run_node("ReduceMin", b, axes(1), keepdims=0), [True] * 3)


def test_zero_sized_axis_not_reduced():
    y = run_node("ReduceSum", np.zeros((0, 3), np.float32), axes(1), opset=13)
    assert y.shape == (0, 1)


# NaN, bool, dtypes ----------------------------------------------------------------------
def test_max_min_propagate_nan():
    x = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, -6.0]], np.float32)
    np.testing.assert_array_equal(run_node("ReduceMax", x, axes(1), keepdims=0), [np.nan, 5.0])
    np.testing.assert_array_equal(run_node("ReduceMin", x, axes(-1), keepdims=0), [np.nan, -6.0])
    y = run_node("ReduceMin", x, axes=[0], keepdims=0, opset=13)
    np.testing.assert_array_equal(y, [1.0, np.nan, -6.0])


def test_bool_max_min():
    x = np.array([[True, False], [False, False]])
    np.testing.assert_array_equal(run_node("ReduceMax", x, axes(1), keepdims=0, opset=20),
                                  [True, False])
    y = run_node("ReduceMin", x, axes(0), keepdims=0, opset=20)
    np.testing.assert_array_equal(y, [False, False])


def test_float16_keeps_dtype_and_accumulates_wider():
    x = np.ones(3000, np.float16)  # float16 spacing at 2048 is 2: a float16 running sum stalls
    y = run_node("ReduceSum", x, keepdims=0)
    assert y.dtype == np.float16 and y == 3000
    m = run_node("ReduceMean", np.array([1, 2, 4], np.float16), keepdims=0)
    assert m.dtype == np.float16 and abs(float(m) - 7 / 3) < 2e-3


def test_bfloat16_keeps_dtype():
    x = np.array([[1, 2], [3, 4]], ml_dtypes.bfloat16)
    y = run_node("ReduceSumSquare", x, axes(1), keepdims=0)
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y.astype(np.float32), [5.0, 25.0])


def test_integer_reductions_keep_dtype():
    x = np.array([[1, 2], [3, 6]], np.int32)
    y = run_node("ReduceSum", x, axes(1), keepdims=0)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, [3, 9])
    y = run_node("ReduceMean", x, axes(1), keepdims=0)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, [1, 4])  # 1.5 and 4.5 truncated
    assert run_node("ReduceProd", x, keepdims=0).dtype == np.int32
    y = run_node("ReduceMax", np.array([[1, -3], [7, 0]], np.int8), axes(0), keepdims=0)
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, [7, 0])


def test_log_sum_exp_is_stable():
    x = np.array([[1000.0, 1000.0], [-1000.0, -1000.0], [-np.inf, -np.inf]], np.float32)
    y = run_node("ReduceLogSumExp", x, axes(1), keepdims=0)
    np.testing.assert_allclose(y[:2], [1000 + np.log(2), -1000 + np.log(2)], rtol=1e-6)
    assert y[2] == -np.inf


def test_bad_axes_raise():
    with pytest.raises(NodeError, match="axes"):
        run_node("ReduceSum", X, axes(3))
    with pytest.raises(ValueError, match="twice"):
        op_function("ReduceMax")(X, axes(1, -2))


# ArgMax / ArgMin ------------------------------------------------------------------------
def test_argmax_select_last_index_and_negative_axis():
    x = np.array([[1, 3, 3], [2, 2, 1]], np.int32)
    y = run_node("ArgMax", x, axis=-1, keepdims=0)
    np.testing.assert_array_equal(y, [1, 0])
    assert y.dtype == np.int64
    y = run_node("ArgMax", x, axis=-1, keepdims=0, select_last_index=1)
    np.testing.assert_array_equal(y, [2, 1])
    np.testing.assert_array_equal(run_node("ArgMin", x, axis=1, select_last_index=1), [[0], [2]])


def test_argmin_rank3_keepdims():
    x = np.array([[[5, 1], [0, 1], [3, 0]], [[2, 2], [2, 9], [1, 9]]], np.float32)
    y = run_node("ArgMin", x, axis=1)
    assert y.shape == (2, 1, 2)
    np.testing.assert_array_equal(y[:, 0, :], [[1, 2], [2, 0]])
    y = run_node("ArgMin", x, axis=1, select_last_index=1, keepdims=0)
    np.testing.assert_array_equal(y, [[1, 2], [2, 0]])
    y = run_node("ArgMax", x, axis=-3, keepdims=0, opset=11)
    np.testing.assert_array_equal(y, [[0, 1], [1, 1], [0, 1]])


def test_argmax_bfloat16_default_axis():
    x = np.array([[1, 4], [3, 2]], ml_dtypes.bfloat16)
    np.testing.assert_array_equal(run_node("ArgMax", x), [[1, 0]])


# CumSum / CumProd -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "exclusive, reverse, cumsum, cumprod",
    [
        (0, 0, [1, 3, 6], [1, 2, 6]),
        (1, 0, [0, 1, 3], [1, 1, 2]),
        (0, 1, [6, 5, 3], [6, 6, 3]),
        (1, 1, [5, 3, 0], [6, 3, 1]),
    ],
)
def test_cumulative_spec_examples(exclusive, reverse, cumsum, cumprod):
    x = np.array([1.0, 2.0, 3.0], np.float32)
    axis = np.array(0, np.int64)
    attrs = {"exclusive": exclusive, "reverse": reverse}
    np.testing.assert_array_equal(run_node("CumSum", x, axis, **attrs), cumsum)
    np.testing.assert_array_equal(run_node("CumProd", x, axis, **attrs), cumprod)


def test_cumsum_2d_negative_axis_int():
    x = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    y = run_node("CumSum", x, np.array(-1, np.int32), exclusive=1, reverse=1)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, [[5, 3, 0], [11, 6, 0]])
    y = run_node("CumProd", x, np.array(0, np.int32))
    np.testing.assert_array_equal(y, [[1, 2, 3], [4, 10, 18]])


def test_cumsum_empty_and_float16():
    y = run_node("CumSum", np.zeros((2, 0), np.float32), np.array(1, np.int64), exclusive=1)
    assert y.shape == (2, 0)
    y = run_node("CumSum", np.ones(3000, np.float16), np.array(0, np.int64))
    assert y.dtype == np.float16 and y[-1] == 3000


def test_cumsum_bad_axis():
    with pytest.raises(ValueError, match="axis"):
        op_function("CumSum")(np.ones((2, 2)), np.array(2))


# properties -----------------------------------------------------------------------------
arrays = hnp.arrays(
    np.float64,
    hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=4),
    elements=st.floats(-100, 100),
)


@settings(max_examples=40, deadline=None)
@given(arrays, st.data())
def test_sum_over_axes_is_repeated_sum(x, data):
    ax = data.draw(st.lists(st.integers(0, x.ndim - 1), unique=True, min_size=1))
    y = op_function("ReduceSum")(x, np.array(ax), keepdims=1)
    expected = x
    for a in ax:
        expected = expected.sum(axis=a, keepdims=True)
    np.testing.assert_allclose(y, expected, atol=1e-9)
    z = op_function("ReduceSum")(x, np.array(ax), keepdims=0)
    assert z.shape == tuple(d for i, d in enumerate(x.shape) if i not in ax)


@settings(max_examples=40, deadline=None)
@given(arrays, st.data())
def test_log_sum_exp_matches_definition(x, data):
    a = data.draw(st.integers(-x.ndim, x.ndim - 1))
    y = op_function("ReduceLogSumExp")(x, np.array([a]), keepdims=0)
    with np.errstate(divide="ignore"):
        expected = np.log(np.exp(x).sum(axis=a))
    np.testing.assert_allclose(y, expected, rtol=1e-9, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(arrays, st.data())
def test_exclusive_cumsum_is_inclusive_minus_x(x, data):
    a = data.draw(st.integers(-x.ndim, x.ndim - 1))
    rev = data.draw(st.integers(0, 1))
    inc = op_function("CumSum")(x, np.array(a), reverse=rev)
    exc = op_function("CumSum")(x, np.array(a), exclusive=1, reverse=rev)
    np.testing.assert_allclose(exc, inc - x, atol=1e-9)
    if x.shape[a]:
        last = np.take(inc, 0 if rev else -1, axis=a)
        np.testing.assert_allclose(last, x.sum(axis=a), atol=1e-9)
