"""Sequence and optional ops: positions, empty sequences, split/concat laws, optionals."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper

from reference import ReferenceEvaluator
from reference.values import EMPTY
from tests.reference.oneop import op_function


def i64(v):
    return np.array(v, dtype=np.int64)


A, B_, C = (np.full((2,), v, np.float32) for v in (1, 2, 3))


# positions -------------------------------------------------------------------------------
def test_insert_default_back_negative_and_n_positions_without_mutating_the_input():
    seq = [A, B_]
    assert [s[0] for s in op_function("SequenceInsert")(seq, C)] == [1, 2, 3]
    assert [s[0] for s in op_function("SequenceInsert")(seq, C, i64(-1))] == [1, 3, 2]
    assert [s[0] for s in op_function("SequenceInsert")(seq, C, i64(2))] == [1, 2, 3]
    assert [s[0] for s in op_function("SequenceInsert")(seq, C, i64(-2))] == [3, 1, 2]
    assert len(seq) == 2
    with pytest.raises(ValueError, match="out of range"):
        op_function("SequenceInsert")(seq, C, i64(3))
    with pytest.raises(TypeError):
        op_function("SequenceInsert")(seq, C.astype(np.int32))


def test_insert_into_an_empty_sequence():
    assert [s[0] for s in op_function("SequenceInsert")([], C, i64(0))] == [3]


def test_erase_default_last_and_negative_position():
    seq = [A, B_, C]
    assert [s[0] for s in op_function("SequenceErase")(seq)] == [1, 2]
    assert [s[0] for s in op_function("SequenceErase")(seq, i64(-3))] == [2, 3]
    assert len(seq) == 3
    with pytest.raises(ValueError, match="out of range"):
        op_function("SequenceErase")(seq, i64(3))
    with pytest.raises(ValueError, match="empty"):
        op_function("SequenceErase")([])


def test_at_negative_and_out_of_range():
    assert op_function("SequenceAt")([A, B_, C], i64(-1))[0] == 3
    assert op_function("SequenceAt")([A, B_, C], np.array(1, np.int32))[0] == 2
    with pytest.raises(ValueError, match="out of range"):
        op_function("SequenceAt")([A], i64(-2))


def test_length_is_an_int64_scalar():
    n = op_function("SequenceLength")([A, B_])
    assert n.shape == () and n.dtype == np.int64 and n == 2
    assert op_function("SequenceLength")(op_function("SequenceEmpty")(dtype=TensorProto.INT32)) == 0


def test_construct_rejects_mixed_types():
    assert len(op_function("SequenceConstruct")(A, B_)) == 2
    with pytest.raises(TypeError, match="mix"):
        op_function("SequenceConstruct")(A, A.astype(np.float64))


# SplitToSequence / ConcatFromSequence ----------------------------------------------------
X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def test_split_default_on_negative_axis_with_and_without_keepdims():
    parts = op_function("SplitToSequence")(X, axis=-2)
    assert [p.shape for p in parts] == [(2, 1, 4)] * 3
    parts = op_function("SplitToSequence")(X, axis=-2, keepdims=0)
    assert [p.shape for p in parts] == [(2, 4)] * 3
    np.testing.assert_array_equal(parts[2], X[:, 2, :])


def test_split_scalar_leaves_a_smaller_last_chunk_and_ignores_keepdims():
    parts = op_function("SplitToSequence")(X, i64(3), axis=2, keepdims=0)
    assert [p.shape for p in parts] == [(2, 3, 3), (2, 3, 1)]
    np.testing.assert_array_equal(parts[1][..., 0], X[..., 3])


def test_split_list_with_an_empty_part():
    parts = op_function("SplitToSequence")(X, i64([1, 0, 3]), axis=-1)
    assert [p.shape for p in parts] == [(2, 3, 1), (2, 3, 0), (2, 3, 3)]
    with pytest.raises(ValueError, match="sum to 4"):
        op_function("SplitToSequence")(X, i64([1, 2]), axis=-1)


def test_concat_new_axis_accepts_rank_as_axis():
    y = op_function("ConcatFromSequence")([A, B_, C], axis=1, new_axis=1)
    np.testing.assert_array_equal(y, [[1, 2, 3], [1, 2, 3]])
    y = op_function("ConcatFromSequence")([A, B_, C], axis=-2, new_axis=1)
    assert y.shape == (3, 2)
    with pytest.raises(ValueError, match="out of range"):
        op_function("ConcatFromSequence")([A, B_], axis=1)
    with pytest.raises(ValueError, match="non-empty"):
        op_function("ConcatFromSequence")([], axis=0)


@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(np.int32, hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4)),
    st.data(),
)
def test_split_then_concat_is_the_identity(x, data):
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    size = data.draw(st.integers(1, 5))
    parts = op_function("SplitToSequence")(x, i64(size), axis=axis)
    assert all(p.dtype == x.dtype for p in parts)
    if parts:
        np.testing.assert_array_equal(op_function("ConcatFromSequence")(parts, axis=axis), x)
        assert len(parts) == -(-x.shape[axis] // size)


# optionals -------------------------------------------------------------------------------
def test_optional_round_trip_and_emptiness():
    assert op_function("Optional")(A) is A
    assert op_function("Optional")(type=helper.make_tensor_type_proto(TensorProto.FLOAT,
                                                                      [2])) is EMPTY
    assert op_function("OptionalHasElement")(EMPTY) == np.array(False)
    assert op_function("OptionalHasElement")() == np.array(False)
    has = op_function("OptionalHasElement")([A])
    assert has.shape == () and has.dtype == np.bool_ and has
    assert op_function("OptionalGetElement")([A])[0] is A
    with pytest.raises(ValueError, match="empty optional"):
        op_function("OptionalGetElement")(EMPTY)


# SequenceMap -----------------------------------------------------------------------------
def test_sequence_map_pairs_sequence_elements_and_repeats_tensors():
    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Shape", ["a"], ["shp"])],
        "body",
        [helper.make_tensor_value_info("a", f, ["n"]), helper.make_tensor_value_info("b", f, [1])],
        [
            helper.make_tensor_value_info("s", f, ["n"]),
            helper.make_tensor_value_info("shp", TensorProto.INT64, [1]),
        ],
    )
    seq_t = helper.make_tensor_sequence_value_info
    graph = helper.make_graph(
        [helper.make_node("SequenceMap", ["xs", "b"], ["ys", "shapes"], body=body)],
        "g",
        [seq_t("xs", f, ["n"]), helper.make_tensor_value_info("b", f, [1])],
        [seq_t("ys", f, ["n"]), seq_t("shapes", TensorProto.INT64, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    xs = [np.array([1, 2, 3], np.float32), np.array([], np.float32), np.array([5], np.float32)]
    ys, shapes = ReferenceEvaluator(model).run(None, {"xs": xs, "b": np.array([10], np.float32)})
    assert isinstance(ys, list) and len(ys) == 3
    np.testing.assert_array_equal(ys[0], [11, 12, 13])
    assert ys[1].shape == (0,)
    assert [int(s[0]) for s in shapes] == [3, 0, 1]
    ys, shapes = ReferenceEvaluator(model).run(None, {"xs": [], "b": np.array([10], np.float32)})
    assert ys == [] and shapes == []
