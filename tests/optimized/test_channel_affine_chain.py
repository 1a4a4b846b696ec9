"""chain_f32's one-pass path for a chain that starts Mul then Add by channel vectors (an inference
BatchNormalization after batchnorm_to_affine) and ends in activations: the same values as the
reference, bit for bit where the members are Mul, Add and Relu, at 1 and 2 threads."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import optimized
from optimized.cpu import KERNELS
from optimized.plan import Plan
from reference import ReferenceEvaluator

F = TensorProto.FLOAT
TAILS = [[], [("Relu", {})], [("Relu", {}), ("Sigmoid", {})], [("LeakyRelu", {"alpha": 0.2})]]


def affine_chain_model(channels, side_rank, value_left, tail, seed):
    """x * s + t (s, t of shape [C] + [1] * side_rank), then the tail's unary ops."""
    rng = np.random.default_rng(seed)
    shape = (channels,) + (1,) * side_rank
    scale = rng.uniform(-2.0, 2.0, shape).astype(np.float32)
    shift = rng.uniform(-1.0, 1.0, shape).astype(np.float32)
    inits = [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(shift, "t")]
    mul_in, add_in = (["x", "s"], ["m", "t"]) if value_left else (["s", "x"], ["t", "m"])
    nodes = [helper.make_node("Mul", mul_in, ["m"], name="mul")]
    names = ["a"] + [f"u{i}" for i in range(len(tail))]
    nodes.append(helper.make_node("Add", add_in, [names[0]], name="add"))
    for i, (op, attrs) in enumerate(tail):
        nodes.append(helper.make_node(op, [names[i]], [names[i + 1]], name=f"act{i}", **attrs))
    graph = helper.make_graph(nodes, "affine", [helper.make_tensor_value_info("x", F, None)],
                              [helper.make_tensor_value_info(names[-1], F, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])


def inputs(shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, 3)] = [np.nan, -0.0, np.inf]
    return x


# the threads fixture only restores the thread count once the test ends
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 3), c=st.integers(1, 9), h=st.integers(1, 11), w=st.integers(2, 37),
       value_left=st.booleans(), tail=st.sampled_from(TAILS), seed=st.integers(0, 1000))
def test_channel_affine_chain_matches_reference(threads, n, c, h, w, value_left, tail, seed):
    model = affine_chain_model(c, 2, value_left, tail, seed)
    x = inputs((n, c, h, w), seed)
    plan = Plan(model, KERNELS, fuse_chains=True)
    assert [s.node.op_type for s in plan.steps] == ["ElementwiseChain"]
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    results = []
    for count in (1, 2):
        threads(count)
        results.append(plan.run({"x": x})[0])
    np.testing.assert_array_equal(results[0], results[1])
    if all(op == "Relu" for op, _ in tail):  # Mul, Add and Relu round once each, as numpy
        np.testing.assert_array_equal(results[0], expected)
    else:
        np.testing.assert_allclose(results[0], expected, rtol=1e-5, atol=1e-6)


def test_hand_checked_channel_affine_with_relu():
    model = affine_chain_model(2, 2, True, [("Relu", {})], 0)
    s = numpy_helper.to_array(model.graph.initializer[0]).reshape(-1)
    t = numpy_helper.to_array(model.graph.initializer[1]).reshape(-1)
    x = np.array([[[[1.0, -3.0, 0.5]], [[2.0, 4.0, -1.0]]]], np.float32)
    got = Plan(model, KERNELS, fuse_chains=True).run({"x": x})[0]
    want = [[[[max(v * s[ch] + t[ch], 0.0) for v in x[0, ch, 0]]] for ch in range(2)]]
    np.testing.assert_allclose(got, np.array(want, np.float32), rtol=1e-6)


def batchnorm_relu_model(channels, bn_output_too):
    rng = np.random.default_rng(channels)
    params = [rng.uniform(0.5, 1.5, channels), rng.uniform(-0.5, 0.5, channels),
              rng.uniform(-0.5, 0.5, channels), rng.uniform(0.5, 1.5, channels)]
    inits = [numpy_helper.from_array(p.astype(np.float32), name)
             for p, name in zip(params, ("gamma", "beta", "mean", "var"))]
    nodes = [helper.make_node("BatchNormalization", ["x", "gamma", "beta", "mean", "var"], ["b"]),
             helper.make_node("Relu", ["b"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", F, None)]
    if bn_output_too:
        outputs.append(helper.make_tensor_value_info("b", F, None))
    graph = helper.make_graph(nodes, "bn_relu", [helper.make_tensor_value_info("x", F, None)],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


def test_batchnorm_relu_session_with_and_without_an_outside_reader_of_the_batchnorm():
    x = inputs((2, 5, 7, 9), 3)
    for bn_output_too in (False, True):
        model = batchnorm_relu_model(5, bn_output_too)
        got = optimized.InferenceSession(model.SerializeToString()).run(None, {"x": x})
        expected = ReferenceEvaluator(model).run(None, {"x": x})
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
