"""A model with a Loop whose body holds an If, for diffs inside subgraphs."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

TRIPS = 4


def loop_if_model(opset: int = 21):
    """acc_{i+1} = If(i is even, acc_i * 2, acc_i + 1) * w, for i in 0..TRIPS-1.

    The then-branch Mul is named "double" and the else-branch Add "increment"."""
    then_branch = helper.make_graph(
        [helper.make_node("Mul", ["acc_in", "two"], ["doubled"], name="double")],
        "then_branch", [], [helper.make_tensor_value_info("doubled", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    else_branch = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "one"], ["incremented"], name="increment")],
        "else_branch", [], [helper.make_tensor_value_info("incremented", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    body = helper.make_graph(
        [
            helper.make_node("Mod", ["i", "two_i"], ["parity"], name="parity"),
            helper.make_node("Equal", ["parity", "zero_i"], ["is_even"], name="is_even"),
            helper.make_node("If", ["is_even"], ["branched"], name="branch",
                             then_branch=then_branch, else_branch=else_branch),
            helper.make_node("Mul", ["branched", "w"], ["acc_out"], name="scale"),
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going"),
        ],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(np.array(2, np.int64), "two_i"),
         numpy_helper.from_array(np.array(0, np.int64), "zero_i")])
    graph = helper.make_graph(
        [
            helper.make_node("Loop", ["trips", "", "x"], ["acc"], name="loop", body=body),
            helper.make_node("Relu", ["acc"], ["y"], name="relu"),
        ],
        "loop_if",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(np.array(TRIPS, np.int64), "trips"),
         numpy_helper.from_array(np.array([0.5, 1.0, 1.5], np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
