"""matmul_add_to_gemm: a 2-D MatMul plus a 1-D bias becomes Gemm."""
import numpy as np
import pytest
from onnx import helper

from optimized.passes.matmul_add_to_gemm import matmul_add_to_gemm

from .helpers import assert_same_outputs, make_model, op_types

RNG = np.random.default_rng(5)


def matmul_add(a_shape=(3, 4), bias_shape=(5,), bias_first=False, extra_reader=False):
    inits = {"w": RNG.standard_normal((4, 5)).astype(np.float32),
             "b": RNG.standard_normal(bias_shape).astype(np.float32)}
    add_inputs = ["b", "mm"] if bias_first else ["mm", "b"]
    nodes = [helper.make_node("MatMul", ["a", "w"], ["mm"]),
             helper.make_node("Add", add_inputs, ["y"])]
    out_shape = list(a_shape[:-1]) + [5]
    outputs = [("y", out_shape)]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["mm"], ["z"]))
        outputs.append(("z", out_shape))
    return make_model(nodes, [("a", list(a_shape))], outputs, inits)


@pytest.mark.parametrize("bias_first", [False, True])
def test_2d_matmul_and_bias_become_gemm(bias_first):
    model = matmul_add(bias_first=bias_first)
    rewritten = matmul_add_to_gemm(model)
    assert op_types(rewritten) == {"Gemm": 1}
    assert list(rewritten.graph.node[0].input) == ["a", "w", "b"]
    assert_same_outputs(model, rewritten)


@pytest.mark.parametrize("kwargs", [
    {"a_shape": (2, 3, 4)},       # 3-D MatMul: Gemm is 2-D only
    {"bias_shape": (3, 5)},       # not a 1-D bias
    {"extra_reader": True},       # the MatMul result is needed on its own
], ids=["3-D", "2-D bias", "shared MatMul"])
def test_not_rewritten(kwargs):
    model = matmul_add(**kwargs)
    assert op_types(matmul_add_to_gemm(model)) == {"MatMul": 1, "Add": 1, **(
        {"Relu": 1} if kwargs.get("extra_reader") else {})}
