"""session.run's fast path for feeds (a numpy array of a dtype and shape that already passed the
full check for that input) accepts and rejects exactly what the full check does: after many
good runs a wrong name, dtype, rank or static dimension gives a fresh session's error, a new
size of a dynamic dimension is accepted, views and lists still work, and outputs never alias a
feed or an earlier run's output."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import optimized as ort
from optimized.feeds import CheckedFeeds

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


def test_table_keeps_only_checked_plain_arrays_and_stays_bounded():
    inputs = [helper.make_tensor_value_info("x", F, ["n"])]
    table = CheckedFeeds(inputs)
    x = np.zeros(3, dtype=np.float32)
    assert not table.passed({"x": x})
    table.remember("x", x.tolist(), x)  # converted from a list: the list is not the array
    assert not table.passed({"x": x})
    table.remember("x", x, x)
    assert table.passed({"x": np.ones(3, dtype=np.float32)})
    assert not table.passed({"x": np.ones(3, dtype=np.float64)})
    assert not table.passed({"x": np.ones(4, dtype=np.float32)})
    assert not table.passed({"x": np.ones(3, dtype=np.float32).view(_Subclass)})
    assert not table.passed({"x": x, "extra": x})
    for n in range(10 * CheckedFeeds.LIMIT):
        z = np.zeros(n, dtype=np.float32)
        table.remember("x", z, z)
    assert len(table.shapes["x"]) <= CheckedFeeds.LIMIT


def test_no_table_when_an_input_is_not_a_tensor():
    seq = helper.make_tensor_sequence_value_info("s", F, None)
    assert CheckedFeeds([seq]).shapes is None
