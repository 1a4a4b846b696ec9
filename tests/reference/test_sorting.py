"""TopK and Unique: hand-checked values for the edges the corpus covers thinly."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from reference import NodeError
from tests.reference.oneop import op_function, run_node


def k(n):
    return np.array([n], np.int64)


# TopK -----------------------------------------------------------------------------------
def test_topk_ties_lower_index_first():
    x = np.array([3.0, 1.0, 3.0, 2.0, 1.0], np.float32)
    v, i = run_node("TopK", x, k(3), n_out=2)
    np.testing.assert_array_equal(v, [3, 3, 2])
    np.testing.assert_array_equal(i, [0, 2, 3])
    assert v.dtype == np.float32 and i.dtype == np.int64
    v, i = run_node("TopK", x, k(3), n_out=2, largest=0)
    np.testing.assert_array_equal(v, [1, 1, 2])
    np.testing.assert_array_equal(i, [1, 4, 3])


def test_topk_negative_axis_rank3():
    x = np.array([[[4, 9], [7, 1], [7, 5]], [[0, 2], [1, 2], [3, 2]]], np.int32)  # 2x3x2
    v, i = run_node("TopK", x, k(2), axis=-2, n_out=2)
    assert v.shape == (2, 2, 2) and v.dtype == np.int32
    np.testing.assert_array_equal(v, [[[7, 9], [7, 5]], [[3, 2], [1, 2]]])
    np.testing.assert_array_equal(i, [[[1, 0], [2, 2]], [[2, 0], [1, 1]]])


def test_topk_k_attribute_before_10():
    x = np.array([[1.0, 5.0, 3.0], [6.0, 6.0, 0.0]], np.float32)
    v, i = run_node("TopK", x, k=1, opset=1, n_out=2)
    np.testing.assert_array_equal(v, [[5], [6]])
    np.testing.assert_array_equal(i, [[1], [0]])
    v, i = run_node("TopK", x, k(2), axis=0, opset=10, n_out=2)
    np.testing.assert_array_equal(i, [[1, 1, 0], [0, 0, 1]])


def test_topk_k_zero_and_full():
    x = np.array([[2.0, 1.0]], np.float32)
    v, i = run_node("TopK", x, k(0), n_out=2)
    assert v.shape == (1, 0) and i.shape == (1, 0)
    v, i = run_node("TopK", x, k(2), largest=0, n_out=2)
    np.testing.assert_array_equal(v, [[1, 2]])


def test_topk_k_too_large():
    with pytest.raises(NodeError, match="k = 3"):
        run_node("TopK", np.ones(2, np.float32), k(3), n_out=2)


def test_topk_unsigned_extremes_and_bfloat16():
    x = np.array([2**63 + 1, 1, 2**64 - 1, 0], np.uint64)
    v, i = run_node("TopK", x, k(2), n_out=2)
    np.testing.assert_array_equal(v, np.array([2**64 - 1, 2**63 + 1], np.uint64))
    np.testing.assert_array_equal(i, [2, 0])
    v, i = run_node("TopK", x, k(2), largest=0, n_out=2)
    np.testing.assert_array_equal(i, [3, 1])
    b = np.array([0.5, -2, 8], ml_dtypes.bfloat16)
    v, i = run_node("TopK", b, k(2), n_out=2)
    assert v.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(i, [2, 0])


def test_topk_nan_ranks_above_every_number():
    # The spec leaves NaN unordered; NaN is taken as larger than +inf, as NumPy sorts it.
    x = np.array([1.0, np.nan, np.inf, -1.0], np.float32)
    _, i = run_node("TopK", x, k(2), n_out=2)
    np.testing.assert_array_equal(i, [1, 2])
    _v, i = run_node("TopK", x, k(4), largest=0, n_out=2)
    np.testing.assert_array_equal(i, [3, 0, 2, 1])


# Unique ---------------------------------------------------------------------------------
def test_unique_spec_example_1_unsorted():
    x = np.array([2, 1, 1, 3, 4, 3], np.int64)
    y, idx, inv, cnt = run_node("Unique", x, sorted=0, n_out=4)
    np.testing.assert_array_equal(y, [2, 1, 3, 4])
    np.testing.assert_array_equal(idx, [0, 1, 3, 4])
    np.testing.assert_array_equal(inv, [0, 1, 1, 2, 3, 2])
    np.testing.assert_array_equal(cnt, [1, 2, 2, 1])


def test_unique_spec_example_2_flattens():
    y, idx, inv, cnt = run_node("Unique", np.array([[1, 3], [2, 3]], np.float32), n_out=4)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, [1, 2, 3])
    np.testing.assert_array_equal(idx, [0, 2, 1])
    np.testing.assert_array_equal(inv, [0, 2, 1, 2])
    np.testing.assert_array_equal(cnt, [1, 1, 2])


def test_unique_spec_example_4_axis1():
    x = np.array([[[1, 1], [0, 1], [2, 1], [0, 1]], [[1, 1], [0, 1], [2, 1], [0, 1]]], np.float32)
    y, idx, inv, cnt = run_node("Unique", x, axis=1, n_out=4)
    np.testing.assert_array_equal(y, [[[0, 1], [1, 1], [2, 1]], [[0, 1], [1, 1], [2, 1]]])
    np.testing.assert_array_equal(idx, [1, 0, 2])
    np.testing.assert_array_equal(inv, [1, 0, 2, 0])
    np.testing.assert_array_equal(cnt, [2, 1, 1])


def test_unique_negative_axis_unsorted():
    x = np.array([[5, 1, 5, 0], [2, 3, 2, 3]], np.int32)  # columns: (5,2) (1,3) (5,2) (0,3)
    y, idx, inv, cnt = run_node("Unique", x, axis=-1, sorted=0, n_out=4)
    np.testing.assert_array_equal(y, [[5, 1, 0], [2, 3, 3]])
    np.testing.assert_array_equal(idx, [0, 1, 3])
    np.testing.assert_array_equal(inv, [0, 1, 0, 2])
    np.testing.assert_array_equal(cnt, [2, 1, 1])
    y, idx, inv, cnt = run_node("Unique", x, axis=-1, n_out=4)
    np.testing.assert_array_equal(y, [[0, 1, 5], [3, 3, 2]])
    np.testing.assert_array_equal(idx, [3, 1, 0])
    np.testing.assert_array_equal(inv, [2, 1, 2, 0])


def test_unique_strings_and_bool():
    x = np.array(["b", "a", "b", "ab"], dtype=object)
    y, _, inv, cnt = run_node("Unique", x, n_out=4)
    assert y.dtype == object
    np.testing.assert_array_equal(y, np.array(["a", "ab", "b"], dtype=object))
    np.testing.assert_array_equal(inv, [2, 0, 2, 1])
    rows = np.array([["x", "y"], ["x", "y"], ["a", "z"]], dtype=object)
    y, _idx, inv, cnt = run_node("Unique", rows, axis=0, n_out=4)
    np.testing.assert_array_equal(y, np.array([["a", "z"], ["x", "y"]], dtype=object))
    np.testing.assert_array_equal(cnt, [1, 2])
    y = run_node("Unique", np.array([True, False, True]))
    np.testing.assert_array_equal(y, [False, True])


def test_unique_empty_input():
    y, idx, inv, cnt = run_node("Unique", np.zeros((0, 3), np.float32), n_out=4)
    assert y.shape == (0,) and idx.shape == inv.shape == cnt.shape == (0,)
    assert idx.dtype == inv.dtype == cnt.dtype == np.int64
    y, idx, inv, cnt = run_node("Unique", np.zeros((0, 3), np.float32), axis=0, n_out=4)
    assert y.shape == (0, 3)


def test_unique_only_y_requested():
    y = run_node("Unique", np.array([3, 3, 1], np.uint8), sorted=0)
    np.testing.assert_array_equal(y, [3, 1])
    assert y.dtype == np.uint8


# properties -----------------------------------------------------------------------------
small = hnp.arrays(
    np.int32,
    hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5),
    elements=st.integers(-3, 3),
)


@settings(max_examples=40, deadline=None)
@given(small, st.booleans(), st.data())
def test_unique_reconstructs_input(x, is_sorted, data):
    axis = data.draw(st.none() | st.integers(-x.ndim, x.ndim - 1))
    y, idx, inv, cnt = op_function("Unique")(x, axis=axis, sorted=int(is_sorted))
    flat = x.reshape(-1) if axis is None else x
    ax = 0 if axis is None else axis
    np.testing.assert_array_equal(np.take(y, inv, axis=ax), flat)
    np.testing.assert_array_equal(np.take(flat, idx, axis=ax), y)
    assert cnt.sum() == flat.shape[ax]
    np.testing.assert_array_equal(np.bincount(inv, minlength=len(cnt)), cnt)
    # indices are first occurrences: no earlier position maps to the same unique entry
    np.testing.assert_array_equal(np.array([np.argmax(inv == j) for j in range(len(idx))]), idx)
    if not is_sorted:
        assert np.all(np.diff(idx) > 0)


@settings(max_examples=40, deadline=None)
@given(small, st.booleans(), st.data())
def test_topk_matches_stable_sort(x, largest, data):
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    kk = data.draw(st.integers(0, x.shape[axis]))
    v, i = op_function("TopK")(x, k(kk), axis=axis, largest=int(largest))
    key = -x.astype(np.int64) if largest else x
    expected = np.take(np.argsort(key, axis=axis, kind="stable"), np.arange(kk), axis=axis)
    np.testing.assert_array_equal(i, expected)
    np.testing.assert_array_equal(v, np.take_along_axis(x, expected, axis=axis))
