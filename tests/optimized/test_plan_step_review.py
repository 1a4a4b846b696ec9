"""Review findings on the plan's step table: each test is a case where a compiled run gave
another answer than the Python plan."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from optimized.cpu import C_STEPS, KERNELS
from optimized.plan import Plan

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
