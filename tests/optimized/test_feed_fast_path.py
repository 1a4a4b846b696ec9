"""session.run's fast path for feeds (plain numpy arrays of each input's dtype, rank and static
dimensions, optimized.feeds.CheckedFeeds) accepts only what the full check accepts, and a session
still rejects bad feeds as before: after many good runs a wrong name, dtype, rank or static
dimension gives a fresh session's error, a new size of a dynamic dimension is accepted, views,
lists and equal dtypes still work, and outputs never alias a feed or an earlier run's output."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import optimized as ort
from optimized.feeds import CheckedFeeds, convert
from reference.types import check_feed

F = TensorProto.FLOAT
WARM_RUNS = 50


def _model(nodes, inputs, outputs):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _session(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _scale_model():
    """y = x * x + b, with x of shape [batch, 3] and b of shape [3]."""
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("Add", ["sq", "b"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", F, ["batch", 3]),
                          helper.make_tensor_value_info("b", F, [3])],
                  [helper.make_tensor_value_info("y", F, ["batch", 3])])


def _feeds(batch=2):
    x = np.arange(batch * 3, dtype=np.float32).reshape(batch, 3) - 2.5
    return {"x": x, "b": np.array([0.5, -1.0, 2.0], dtype=np.float32)}


def _warm(session, feeds):
    for _ in range(WARM_RUNS):
        (y,) = session.run(None, feeds)
    np.testing.assert_allclose(y, feeds["x"] * feeds["x"] + feeds["b"])
    return session


BAD_FEEDS = {
    "dtype": lambda f: {**f, "x": f["x"].astype(np.float64)},
    "int dtype": lambda f: {**f, "b": np.array([1, 2, 3], dtype=np.int32)},
    "rank": lambda f: {**f, "x": f["x"].reshape(-1)},
    "static dim": lambda f: {**f, "b": np.zeros(4, dtype=np.float32)},
    "missing": lambda f: {"x": f["x"]},
    "unknown": lambda f: {**f, "z": f["b"]},
    "not an array": lambda f: {**f, "b": "text"},
    "not a dict": lambda f: [f["x"], f["b"]],
}


@pytest.mark.parametrize("bad", BAD_FEEDS.values(), ids=BAD_FEEDS.keys())
def test_warm_session_rejects_bad_feeds_as_a_fresh_one_does(bad):
    warm = _warm(_session(_scale_model()), _feeds())
    with pytest.raises(Exception) as fresh_error:
        _session(_scale_model()).run(None, bad(_feeds()))
    with pytest.raises(type(fresh_error.value)) as warm_error:
        warm.run(None, bad(_feeds()))
    assert str(warm_error.value) == str(fresh_error.value)


def test_new_size_of_a_dynamic_dimension_is_accepted():
    session = _warm(_session(_scale_model()), _feeds(batch=2))
    for batch in (5, 1, 0, 2):
        feeds = _feeds(batch)
        (y,) = session.run(None, feeds)
        np.testing.assert_allclose(y, feeds["x"] * feeds["x"] + feeds["b"])


def test_views_and_lists_after_many_contiguous_runs():
    session = _warm(_session(_scale_model()), _feeds(batch=3))
    x = (np.arange(9, dtype=np.float32).reshape(3, 3) - 4).T  # same dtype and shape, not contiguous
    b = np.arange(6, dtype=np.float32)[::2]
    (y,) = session.run(None, {"x": x, "b": b})
    np.testing.assert_allclose(y, x * x + b)
    (y,) = session.run(None, {"x": x.tolist(), "b": b.tolist()})
    np.testing.assert_allclose(y, x * x + b)
    other = np.dtype(np.float32, metadata={"note": "an equal dtype, another object"})
    assert other == np.float32 and other is not np.dtype(np.float32)
    (y,) = session.run(None, {"x": x.astype(other), "b": b})
    np.testing.assert_allclose(y, x * x + b)


def test_outputs_never_alias_a_feed_or_an_earlier_output():
    nodes = [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["r"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3])],
                   [helper.make_tensor_value_info("y", F, [2, 3]),
                    helper.make_tensor_value_info("r", F, [2, 3])])
    session = _session(model)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    earlier = [session.run(None, {"x": x}) for _ in range(WARM_RUNS)]
    y, r = session.run(None, {"x": x})
    x[...] = 100
    np.testing.assert_array_equal(y, np.arange(6, dtype=np.float32).reshape(2, 3) - 2)
    y[...] = -7
    r[...] = -7
    for old_y, old_r in earlier:
        assert not np.may_share_memory(old_y, y) and not np.may_share_memory(old_r, r)
        np.testing.assert_array_equal(old_r, np.maximum(np.arange(6, dtype=np.float32).reshape(2, 3) - 2, 0))


def test_output_names_pick_and_order_outputs_on_every_run():
    nodes = [helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Abs", ["x"], ["a"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [4])],
                   [helper.make_tensor_value_info("n", F, [4]), helper.make_tensor_value_info("a", F, [4])])
    session = _session(model)
    x = np.array([-1.5, 0.0, 2.0, -3.0], dtype=np.float32)
    for _ in range(3):
        a, n = session.run(["a", "n"], {"x": x})
        np.testing.assert_array_equal(a, np.abs(x))
        np.testing.assert_array_equal(n, -x)
        (a_again,) = session.run(["a"], {"x": x})
        np.testing.assert_array_equal(a_again, np.abs(x))
    with pytest.raises(ort.InvalidArgument, match="unknown output 'b'; the model's outputs are"):
        session.run(["b"], {"x": x})


class _Subclass(np.ndarray):
    pass


def _input(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def test_table_passes_plain_arrays_of_the_expected_dtype_rank_and_static_dims():
    table = CheckedFeeds([_input("x", F, ["n", 3]), _input("ids", TensorProto.INT64, [2])])
    ids = np.array([4, 5], dtype=np.int64)
    assert table.passed({"x": np.zeros((7, 3), np.float32), "ids": ids})
    assert table.passed({"x": np.zeros((0, 3), np.float32).T.T, "ids": ids})
    assert not table.passed({"x": np.zeros((7, 3), np.float64), "ids": ids})
    assert not table.passed({"x": np.zeros((7, 4), np.float32), "ids": ids})
    assert not table.passed({"x": np.zeros((7, 3, 1), np.float32), "ids": ids})
    assert not table.passed({"x": np.zeros((7, 3), np.float32).view(_Subclass), "ids": ids})
    assert not table.passed({"x": np.zeros((7, 3), np.float32).tolist(), "ids": ids})
    assert not table.passed({"x": np.zeros((7, 3), np.float32)})
    assert not table.passed({"x": np.zeros((7, 3), np.float32), "ids": ids, "extra": ids})
    assert not table.passed({"x": np.zeros((7, 3), np.float32), "idz": ids})


def test_table_on_a_string_input_passes_object_arrays_only():
    table = CheckedFeeds([_input("s", TensorProto.STRING, [2])])
    assert table.passed({"s": np.array(["a", "b"], dtype=object)})
    assert not table.passed({"s": np.array(["a", "b"])})  # converted to objects on the full path


def test_no_table_when_an_input_is_not_a_tensor_of_a_known_type():
    seq = helper.make_tensor_sequence_value_info("s", F, None)
    assert CheckedFeeds([_input("x", F, [2]), seq]).expected is None
    assert CheckedFeeds([_input("x", TensorProto.UNDEFINED, [2])]).expected is None


DTYPES = [np.float32, np.float64, np.int64, np.int32, np.uint8, np.bool_, object]
ELEMS = [F, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.INT32, TensorProto.UINT8,
         TensorProto.BOOL, TensorProto.STRING]


@settings(max_examples=300, deadline=None)
@given(elem=st.sampled_from(ELEMS), dims=st.lists(st.one_of(st.none(), st.integers(0, 3)), max_size=3),
       dtype=st.sampled_from(DTYPES), shape=st.lists(st.integers(0, 3), max_size=3))
def test_table_passes_only_what_the_full_check_accepts(elem, dims, dtype, shape):
    """The fast path never accepts a feed the full check rejects."""
    info = _input("x", elem, [d if d is not None else "dyn" for d in dims])
    value = np.zeros(shape, dtype=dtype)
    if CheckedFeeds([info]).passed({"x": value}):
        check_feed(info, value)
        assert convert(info.type, value) is value
