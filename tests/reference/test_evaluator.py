"""The evaluator itself: what iter_results yields, how feeds and models are checked, errors that
name the node, model-local functions with attribute references, and schema function bodies."""

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from onnx import TensorProto, helper, numpy_helper

import reference.evaluator as evaluator_module
from reference import (
    InvalidFeedError,
    InvalidModelError,
    NodeError,
    ReferenceEvaluator,
    UnsupportedOpError,
)

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, initializers=(), opset=18, functions=(), extra_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", opset), *extra_opsets]
    return helper.make_model(graph, opset_imports=opsets, functions=list(functions))


def _affine_model():
    w = numpy_helper.from_array(np.array([2.0, 3.0], np.float32), "w")
    return _model(
        [helper.make_node("Mul", ["x", "w"], ["xw"], name="scale"),
         helper.make_node("Relu", ["xw"], ["y"], name="act")],
        [helper.make_tensor_value_info("x", F, ["n", 2])],
        [helper.make_tensor_value_info("y", F, ["n", 2])], [w])


def test_iter_results_yields_every_value_in_order():
    ev = ReferenceEvaluator(_affine_model())
    x = np.array([[1.0, -1.0]], np.float32)
    results = list(ev.iter_results({"x": x}))
    assert [(r.kind, r.name) for r in results] == [
        ("initializer", "w"), ("input", "x"), ("result", "xw"), ("result", "y"), ("output", "y")]
    assert results[2].node.name == "scale"
    np.testing.assert_array_equal(results[3].value, [[2.0, 0.0]])


def test_run_returns_requested_outputs_in_the_asked_order():
    model = _model([helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Abs", ["x"], ["b"])],
                   [helper.make_tensor_value_info("x", F, [1])],
                   [helper.make_tensor_value_info("a", F, [1]), helper.make_tensor_value_info("b", F, [1])])
    ev = ReferenceEvaluator(model)
    x = np.array([-3.0], np.float32)
    b, a = ev.run(["b", "a"], {"x": x})
    assert b.tolist() == [3.0] and a.tolist() == [3.0]
    with pytest.raises(InvalidFeedError, match="unknown output 'c'"):
        ev.run(["c"], {"x": x})


@pytest.mark.parametrize("feeds, message", [
    ({"x": np.zeros((1, 2), np.float32), "z": np.zeros(1)}, "unknown input 'z'"),
    ({}, "missing input 'x'"),
    ({"x": np.zeros((1, 2), np.float64)}, "input 'x': expected tensor\\(float\\)"),
    ({"x": np.zeros(2, np.float32)}, "input 'x': expected rank 2"),
    ({"x": np.zeros((1, 3), np.float32)}, "input 'x': dimension 1 must be 2"),
])
def test_bad_feeds_are_rejected_before_running_and_name_the_input(feeds, message, monkeypatch):
    ev = ReferenceEvaluator(_affine_model())
    ran = []
    monkeypatch.setattr(evaluator_module.GraphRunner, "run_node", lambda *a, **k: ran.append(a))
    with pytest.raises(InvalidFeedError, match=message):
        ev.run(None, feeds)
    assert not ran


def test_symbolic_dimension_accepts_any_size():
    out, = ReferenceEvaluator(_affine_model()).run(None, {"x": np.ones((5, 2), np.float32)})
    assert out.shape == (5, 2)


def test_numpy_scalar_feed_is_a_0d_tensor():
    model = _model([helper.make_node("Neg", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, [])],
                   [helper.make_tensor_value_info("y", F, [])])
    out, = ReferenceEvaluator(model).run(None, {"x": np.float32(2.0)})
    assert out.shape == () and out.dtype == np.float32 and out == -2.0


def test_node_error_names_node_op_domain_and_version():
    model = _model([helper.make_node("Reshape", ["x", "s"], ["y"], name="bad_reshape")],
                   [helper.make_tensor_value_info("x", F, [6]),
                    helper.make_tensor_value_info("s", TensorProto.INT64, [1])],
                   [helper.make_tensor_value_info("y", F, [4])])
    with pytest.raises(NodeError, match=r"node 'bad_reshape' \(ai\.onnx::Reshape, opset 18\)"):
        ReferenceEvaluator(model).run(None, {"x": np.zeros(6, np.float32), "s": np.array([4])})


def test_unknown_op_is_reported_by_name():
    model = _model([helper.make_node("Frobnicate", ["x"], ["y"], domain="custom.domain")],
                   [helper.make_tensor_value_info("x", F, [1])], [helper.make_tensor_value_info("y", F, [1])],
                   extra_opsets=[helper.make_opsetid("custom.domain", 1)])
    with pytest.raises(UnsupportedOpError, match="custom.domain::Frobnicate"):
        ReferenceEvaluator(model, check=False).run(None, {"x": np.zeros(1, np.float32)})


def test_corrupt_bytes_and_missing_file(tmp_path):
    with pytest.raises(InvalidModelError, match="cannot parse"):
        ReferenceEvaluator(b"\x08\x07garbage\xff\xff")
    with pytest.raises(FileNotFoundError, match="nope.onnx"):
        ReferenceEvaluator(str(tmp_path / "nope.onnx"))


def test_invalid_model_is_rejected_before_running():
    model = _model([helper.make_node("Relu", ["x"], ["y"], alpha=1.0)],
                   [helper.make_tensor_value_info("x", F, [1])], [helper.make_tensor_value_info("y", F, [1])])
    with pytest.raises(InvalidModelError, match="alpha"):
        ReferenceEvaluator(model)


def test_external_data_that_leaves_the_model_folder_is_refused(tmp_path):
    model = _affine_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, location="w.bin", size_threshold=0)
    evil = onnx.load(path, load_external_data=False)
    for entry in evil.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../../etc/passwd"
    onnx.save(evil, tmp_path / "evil.onnx")
    assert ReferenceEvaluator(str(path)).run(None, {"x": np.ones((1, 2), np.float32)})[0].shape == (1, 2)
    with pytest.raises(InvalidModelError, match="outside the directory"):
        ReferenceEvaluator(str(tmp_path / "evil.onnx"))


def test_model_local_function_with_attribute_reference():
    scale = helper.make_node("Constant", [], ["c"], value_float=0.0)
    scale.attribute[0].ref_attr_name = "factor"
    scale.attribute[0].ClearField("f")
    body = [scale, helper.make_node("Mul", ["a", "c"], ["b"])]
    function = helper.make_function("my.fn", "Scale", ["a"], ["b"], body,
                                    [helper.make_opsetid("", 18)], attributes=["factor"])
    node = helper.make_node("Scale", ["x"], ["y"], domain="my.fn", factor=2.5)
    model = _model([node], [helper.make_tensor_value_info("x", F, [2])],
                   [helper.make_tensor_value_info("y", F, [2])], functions=[function],
                   extra_opsets=[helper.make_opsetid("my.fn", 1)])
    out, = ReferenceEvaluator(model).run(None, {"x": np.array([1.0, -2.0], np.float32)})
    np.testing.assert_allclose(out, [2.5, -5.0])


@pytest.mark.parametrize("op, attrs, opset", [("HardSwish", {}, 14),
                                               ("LayerNormalization", {"axis": -1}, 17)])
def test_schema_function_body_matches_the_direct_op(op, attrs, opset, monkeypatch):
    inputs = ["x"] + (["scale", "bias"] if op == "LayerNormalization" else [])
    inits = [numpy_helper.from_array(np.array([1.5, 0.5, 2.0], np.float32), "scale"),
             numpy_helper.from_array(np.array([0.1, 0.0, -0.3], np.float32), "bias")]
    model = _model([helper.make_node(op, inputs, ["y"], **attrs)],
                   [helper.make_tensor_value_info("x", F, [4, 3])], [helper.make_tensor_value_info("y", F, [4, 3])],
                   inits if op == "LayerNormalization" else [], opset=opset)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32) * 3
    direct, = ReferenceEvaluator(model).run(None, {"x": x})
    real_lookup = evaluator_module.lookup
    monkeypatch.setattr(evaluator_module, "lookup",
                        lambda d, o, v: None if o == op else real_lookup(d, o, v))
    via_body, = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(via_body, direct, rtol=1e-5, atol=1e-6)


def test_sparse_initializer_is_densified():
    values = numpy_helper.from_array(np.array([5.0, 7.0], np.float32), "s")
    indices = numpy_helper.from_array(np.array([1, 3], np.int64), "s_idx")
    sparse = helper.make_sparse_tensor(values, indices, [4])
    graph = helper.make_graph([helper.make_node("Add", ["x", "s"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", F, [4])],
                              [helper.make_tensor_value_info("y", F, [4])], sparse_initializer=[sparse])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    out, = ReferenceEvaluator(model).run(None, {"x": np.zeros(4, np.float32)})
    assert out.tolist() == [0.0, 5.0, 0.0, 7.0]


def _one_node(op, inputs, attrs, x, extra=()):
    graph = helper.make_graph([helper.make_node(op, inputs, ["y"], **attrs)], "g",
                              [helper.make_tensor_value_info("x", F, list(x.shape))],
                              [helper.make_tensor_value_info("y", F, None)], list(extra))
    return ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]),
                              check=False)


@settings(max_examples=40, deadline=None)
@given(x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=5, max_side=4),
                    elements=st.floats(-10, 10, width=32)), data=st.data())
def test_transpose_then_inverse_is_identity(x, data):
    perm = data.draw(st.permutations(range(x.ndim)))
    inverse = list(np.argsort(perm))
    y, = _one_node("Transpose", ["x"], {"perm": list(perm)}, x).run(None, {"x": x})
    back, = _one_node("Transpose", ["x"], {"perm": inverse}, y).run(None, {"x": y})
    np.testing.assert_array_equal(back, x)


@settings(max_examples=40, deadline=None)
@given(x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=4, max_side=4),
                    elements=st.floats(-10, 10, width=32)), data=st.data())
def test_reshape_keeps_values_in_order(x, data):
    size = x.size
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    first = data.draw(st.sampled_from(divisors))
    shape = np.array([first, -1], np.int64)
    y, = _one_node("Reshape", ["x", "shape"], {}, x,
                   [numpy_helper.from_array(shape, "shape")]).run(None, {"x": x})
    assert y.shape == (first, size // first)
    np.testing.assert_array_equal(y.reshape(-1), x.reshape(-1))


def test_unseeded_random_ops_are_repeatable_per_run_and_differ_between_nodes():
    nodes = [helper.make_node("RandomUniform", [], [name], shape=[1000]) for name in ("a", "b")]
    model = _model(nodes, [], [helper.make_tensor_value_info(n, F, [1000]) for n in ("a", "b")])
    a1, b1 = ReferenceEvaluator(model).run(None, {})
    a2, b2 = ReferenceEvaluator(model).run(None, {})
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(b1, b2)
    assert not np.array_equal(a1, b1)
    a3, _ = ReferenceEvaluator(model, seed=7).run(None, {})
    assert not np.array_equal(a1, a3)
