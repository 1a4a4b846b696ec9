"""Review findings on the plan's step table: each test is a case where a compiled run gave
another answer than the Python plan."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from optimized.cpu import C_STEPS, KERNELS
from optimized.plan import Operand, Plan

F = TensorProto.FLOAT


def test_a_convolution_whose_bias_is_a_feed_keeps_the_bias():
    # Integer-valued data makes our kernel and oneDNN agree bit for bit, so a zero bias in the
    # recorded run cannot tell a step that drops the bias from one that adds it.
    rng = np.random.default_rng(3)
    w = rng.integers(-2, 3, (8, 16, 3, 3)).astype(np.float32)  # a "spatial" convolution
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node], "t", [helper.make_tensor_value_info("x", F, [2, 16, 7, 9]),
                      helper.make_tensor_value_info("b", F, [8])],
        [helper.make_tensor_value_info("y", F, None)],
        initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    in_c, in_python = Plan(model, KERNELS, c_steps=C_STEPS), Plan(model, KERNELS)
    x = rng.integers(-2, 3, (2, 16, 7, 9)).astype(np.float32)
    for b in [np.zeros(8, np.float32)] * 2 + [np.arange(1, 9, dtype=np.float32)]:
        got = in_c.run({"x": x, "b": b})[0]
        want = in_python.run({"x": x, "b": b})[0]
        np.testing.assert_array_equal(got, want)


def one_value_bias_model(w):
    # the reference's Conv broadcasts a bias of one value; our conv2d refuses it (the node
    # falls back to the reference), and C's conv2d_f32 would read M floats from it
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node], "t", [helper.make_tensor_value_info("x", F, [2, 4, 7, 9])],
        [helper.make_tensor_value_info("y", F, None)],
        initializer=[numpy_helper.from_array(w, "w"),
                     numpy_helper.from_array(np.array([0.5], np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_convolution_with_equal_filters_and_a_one_value_bias_runs():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((3, 4, 3, 3)).astype(np.float32)[[0, 1, 0, 2]]
    model = one_value_bias_model(w)
    in_c, in_python = Plan(model, KERNELS, c_steps=C_STEPS), Plan(model, KERNELS)
    x = rng.standard_normal((2, 4, 7, 9)).astype(np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(in_c.run({"x": x})[0], in_python.run({"x": x})[0])


def test_a_bias_that_is_not_one_value_per_output_channel_gets_no_step():
    w = np.ones((5, 4, 3, 3), np.float32)
    x, y = Operand(0, (2, 4, 7, 9), np.float32), Operand(3, (2, 5, 7, 9), np.float32)
    b = Operand(1, (1,), np.float32, np.ones(1, np.float32))
    assert C_STEPS[("", "Conv")]([x, Operand(2, w.shape, np.float32, w), b], [y],
                                 pads=[1, 1, 1, 1]) is None
