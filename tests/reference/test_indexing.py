"""Gather/scatter family, Compress, NonZero, OneHot, ReverseSequence."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from reference import NodeError
from tests.reference.oneop import i64, run_node, same

X = np.arange(12, dtype=np.float32).reshape(3, 4)


# Gather ----------------------------------------------------------------------------------------


def test_gather_negative_axis_and_indices():
    same(run_node("Gather", X, i64(-1, 0), axis=-1), X[:, [3, 0]])
    same(run_node("Gather", X, np.array([[2], [-3]], np.int32)), X[[[2], [0]]])


def test_gather_scalar_index_drops_the_axis():
    same(run_node("Gather", X, np.array(1, np.int64), axis=1), X[:, 1])


def test_gather_out_of_bounds_is_an_error():
    with pytest.raises(NodeError, match="out of bounds"):
        run_node("Gather", X, i64(3))


def test_gather_elements_indices_smaller_than_data():
    idx = np.array([[3, -1], [0, 1]], np.int64)
    same(run_node("GatherElements", X, idx, axis=1), np.array([[3, 3], [4, 5]], np.float32))
    same(run_node("GatherElements", X, np.array([[2, 0, 1]], np.int64), axis=-2),
         np.array([[8, 1, 6]], np.float32))


def test_gather_nd_batch_dims():
    data = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    # batch_dims=1: for batch b, gather data[b, i] rows.
    same(run_node("GatherND", data, np.array([[[2]], [[-3]]], np.int64), batch_dims=1),
         np.array([[[8, 9, 10, 11]], [[12, 13, 14, 15]]], np.int32))
    # batch_dims=2: for batch (b, i), gather the element data[b, i, j].
    same(run_node("GatherND", data, np.array([[[0], [1], [2]], [[3], [2], [1]]], np.int64),
                  batch_dims=2),
         np.array([[0, 5, 10], [15, 18, 21]], np.int32))
    same(run_node("GatherND", data, i64(1, 2, 3)), np.array(23, np.int32))


# Scatter ---------------------------------------------------------------------------------------


def test_scatter_elements_reductions_accumulate_duplicates():
    data = np.array([[1.0, 2.0, 3.0]], np.float32)
    idx = np.array([[1, 1, -1]], np.int64)
    upd = np.array([[4.0, 5.0, -6.0]], np.float32)
    same(run_node("ScatterElements", data, idx, upd, axis=1, reduction="add"),
         np.array([[1, 11, -3]], np.float32))
    same(run_node("ScatterElements", data, idx, upd, axis=1, reduction="mul"),
         np.array([[1, 40, -18]], np.float32))
    same(run_node("ScatterElements", data, idx, upd, axis=1, reduction="max"),
         np.array([[1, 5, 3]], np.float32))
    same(run_node("ScatterElements", data, idx, upd, axis=1, reduction="min"),
         np.array([[1, 2, -6]], np.float32))


def test_scatter_elements_partial_indices_and_legacy_scatter():
    data = np.zeros((3, 3), np.int64)
    idx = np.array([[1, 0, 2]], np.int64)
    upd = np.array([[7, 8, 9]], np.int64)
    expected = np.array([[0, 8, 0], [7, 0, 0], [0, 0, 9]])
    same(run_node("ScatterElements", data, idx, upd, axis=0), expected)
    same(run_node("Scatter", data, idx, upd, axis=0, opset=9), expected)


def test_scatter_nd_slices_and_reduction():
    data = np.zeros((2, 3), np.int32)
    same(run_node("ScatterND", data, i64([-1]), np.array([[1, 2, 3]], np.int32)),
         np.array([[0, 0, 0], [1, 2, 3]], np.int32))
    same(run_node("ScatterND", data, i64([0, 1], [0, 1]), np.array([5, 6], np.int32),
                  reduction="add"),
         np.array([[0, 11, 0], [0, 0, 0]], np.int32))


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_scatter_nd_then_gather_nd_returns_updates(data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    k = data.draw(st.integers(1, len(shape)))
    cells = list(np.ndindex(*shape[:k]))
    picked = data.draw(st.lists(st.sampled_from(cells), min_size=1, max_size=len(cells), unique=True))
    idx = np.array(picked, np.int64).reshape(len(picked), k)
    upd = np.random.default_rng(0).standard_normal((len(picked),) + shape[k:])
    out = run_node("ScatterND", np.zeros(shape), idx, upd)
    same(run_node("GatherND", out, idx), upd)
    assert np.count_nonzero(out) == np.count_nonzero(upd)  # nothing else was written


# Compress, NonZero, OneHot, ReverseSequence -------------------------------------------------------


def test_compress():
    same(run_node("Compress", X, np.array([False, True, True]), axis=-2), X[1:])
    same(run_node("Compress", X, np.array([True, False, True])), np.array([0, 2], np.float32))


def test_non_zero():
    x = np.array([[0, 1], [2, 0]], np.int8)
    same(run_node("NonZero", x), np.array([[0, 1], [1, 0]], np.int64))
    same(run_node("NonZero", np.zeros((2, 0), np.float32)), np.zeros((2, 0), np.int64))
    same(run_node("NonZero", np.array([np.nan, 0.0])), np.array([[0]], np.int64))


@pytest.mark.parametrize("axis, expected", [
    (-1, [[0, 0, 5], [0, 0, 0], [5, 0, 0]]),
    (0, [[0, 0, 5], [0, 0, 0], [5, 0, 0]]),
])
def test_one_hot_negative_and_out_of_range(axis, expected):
    idx = np.array([-1, 3, 0], np.int64)
    out = run_node("OneHot", idx, np.array([3.0], np.float32), np.array([0, 5], np.int32),
                   axis=axis)
    same(out, np.array(expected, np.int32) if axis == -1 else np.array(expected, np.int32).T)


def test_one_hot_9_does_not_wrap_negative_indices():
    out = run_node("OneHot", np.array([-1, 1], np.int64), np.array(2, np.int64),
                   np.array([0.0, 1.0], np.float32), opset=9)
    same(out, np.array([[0, 0], [0, 1]], np.float32))


def test_reverse_sequence():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = run_node("ReverseSequence", x, i64(0, 1, 3), batch_axis=0, time_axis=1)
    same(out, np.array([[0, 1, 2, 3], [4, 5, 6, 7], [10, 9, 8, 11]], np.float32))
    out = run_node("ReverseSequence", x[:, :, None], i64(3, 2, 1, 0), batch_axis=1, time_axis=0)
    same(out[:, :, 0], np.array([[8, 5, 2, 3], [4, 1, 6, 7], [0, 9, 10, 11]], np.float32))
