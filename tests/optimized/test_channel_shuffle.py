"""Transpose as the plan's strided copy, its axes coalesced (axes of one element dropped, an
axis merged into the one before it where that one steps over it exactly): ShuffleNet's
channel shuffle Reshape [N, g, C/g, H, W] -> Transpose(0, 2, 1, 3, 4) -> Reshape copies whole
H*W planes.  Checked against numpy's transpose bit for bit over random shapes and perms."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from optimized.cpu import C_STEPS, KERNELS
from optimized.kernels import lib
from optimized.plan import Plan


def transpose_model(shape, perm):
    node = helper.make_node("Transpose", ["x"], ["y"], perm=list(perm))
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def shuffle_model(n, groups, channels, h, w):
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "split"], ["a"]),
             helper.make_node("Transpose", ["a"], ["b"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["b", "joined"], ["y"])]
    shape = [n, channels, h, w]
    graph = helper.make_graph(
        nodes, "shuffle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(np.array([n, groups, channels // groups, h, w]), "split"),
                     numpy_helper.from_array(np.array(shape), "joined")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def compiled_run(model, x):
    plan = Plan(model, KERNELS, c_steps=C_STEPS)
    for _ in range(3):
        got = plan.run({"x": x})[0]
    program = plan._programs[(("x", x.shape, x.dtype),)]
    return got, [program.table.steps[i] for i in range(program.table.count)]


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=6), data=st.data())
def test_transpose_matches_numpy(shape, data):
    perm = data.draw(st.permutations(range(len(shape))))
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    got, steps = compiled_run(transpose_model(shape, perm), x)
    assert got.tobytes() == np.ascontiguousarray(x.transpose(perm)).tobytes()
    assert [s.kind for s in steps] == [lib.PLAN_STRIDED_COPY]


def test_a_channel_shuffle_copies_whole_planes():
    n, groups, channels, h, w = 2, 3, 12, 5, 7
    x = np.random.default_rng(0).standard_normal((n, channels, h, w)).astype(np.float32)
    got, steps = compiled_run(shuffle_model(n, groups, channels, h, w), x)
    want = np.maximum(x, 0).reshape(n, groups, channels // groups, h, w)
    want = want.transpose(0, 2, 1, 3, 4).reshape(n, channels, h, w)
    assert got.tobytes() == want.tobytes()
    copy = [s for s in steps if s.kind == lib.PLAN_STRIDED_COPY]
    assert len(copy) == 1
    # (N, C/g, g, H*W): the planes' H and W walked as one contiguous axis
    assert list(copy[0].g[0:6]) == [1, 1, n, channels // groups, groups, h * w]
    assert list(copy[0].g[6:12]) == [0, 0, channels * h * w, h * w, channels // groups * h * w, 1]
