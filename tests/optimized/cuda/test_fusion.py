"""Fusion groups: which nodes fuse, and the generated expression (run with numpy) equals the
reference evaluator node by node, for random chains with broadcasting."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

from optimized.cuda.fusion import TEMPLATES, find_groups

from .helpers import model, reference

UNARY = ["Neg", "Abs", "Exp", "Sqrt", "Relu", "Sigmoid", "Tanh", "Erf", "Floor", "Ceil", "Sin",
         "Cos", "LeakyRelu", "Reciprocal", "Log"]
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"]
SAFE_INPUT = {"Sqrt": "Abs", "Log": "Abs", "Reciprocal": "Exp", "Pow": "Abs"}


def _chain(ops, shapes, rng):
    """x0 -op-> ... ; binary ops take a fresh input of a broadcastable shape."""
    nodes, feeds, current, k = [], {"x0": rng.uniform(-2, 2, shapes[0]).astype(np.float32)}, "x0", 1
    for i, op in enumerate(ops):
        if op in SAFE_INPUT:  # keep the operand in the op's domain
            nodes.append(helper.make_node(SAFE_INPUT[op], [current], [f"s{i}"]))
            current = f"s{i}"
        args = [current]
        if TEMPLATES[op][0] == 2:
            name = f"x{k}"
            feeds[name] = rng.uniform(0.5, 2, shapes[k % len(shapes)]).astype(np.float32)
            args = [current, name] if i % 2 == 0 else [name, current]
            if op == "Pow":
                args = [current, name]
            k += 1
        attrs = {"alpha": 0.3} if op == "LeakyRelu" else {}
        nodes.append(helper.make_node(op, args, [f"v{i}"], **attrs))
        current = f"v{i}"
    return nodes, feeds, current


shapes = st.lists(st.sampled_from([(), (1,), (4,), (3, 1), (3, 4), (2, 1, 4), (1, 3, 1)]),
                  min_size=2, max_size=4)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.sampled_from(UNARY + BINARY), min_size=2, max_size=8), shapes=shapes,
       seed=st.integers(0, 2**16))
def test_one_group_evaluates_like_the_nodes_one_by_one(ops, shapes, seed):
    rng = np.random.default_rng(seed)
    nodes, feeds, out = _chain(ops, shapes, rng)
    try:
        np.broadcast_shapes(*(v.shape for v in feeds.values()))
    except ValueError:
        return  # shapes that do not broadcast: not a model
    expected = reference(model(nodes, feeds, [out]), feeds)[0]
    (group,) = find_groups(nodes, lambda i: True, [out], {})
    assert len(group.nodes) == len(nodes) and group.output == out
    got = group.evaluate(np, *[feeds[n] for n in group.inputs])
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-5)


def test_values_read_twice_or_graph_outputs_end_a_group():
    nodes = [helper.make_node("Exp", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"]),  # a is read twice
             helper.make_node("Relu", ["c"], ["d"]), helper.make_node("Tanh", ["d"], ["e"])]
    groups = find_groups(nodes, lambda i: True, ["e", "d"], {})
    assert [[n.op_type for n in g.nodes] for g in groups] == [["Neg", "Add", "Relu"]]  # d ends it
    assert groups[0].inputs == ["a"]


def test_ineligible_nodes_and_non_elementwise_ops_are_left_out():
    nodes = [helper.make_node("Exp", ["x"], ["a"]), helper.make_node("MatMul", ["a", "w"], ["b"]),
             helper.make_node("Neg", ["b"], ["c"]), helper.make_node("Tanh", ["c"], ["d"]),
             helper.make_node("Sigmoid", ["d"], ["e"])]
    groups = find_groups(nodes, lambda i: i != 4, ["e"], {})
    assert [[n.op_type for n in g.nodes] for g in groups] == [["Neg", "Tanh"]]


def test_scalar_initializers_are_inlined_as_typed_literals():
    nodes = [helper.make_node("Mul", ["x", "half"], ["a"]), helper.make_node("Add", ["a", "y"], ["b"])]
    half = np.array(0.5, np.float32)
    (group,) = find_groups(nodes, lambda i: True, ["b"], {"half": half, "y": np.ones(3, np.float32)})
    assert group.expression == "((a0 * F(0.5)) + a1)" and group.inputs == ["x", "y"]
    assert group.accepts([np.dtype(np.float32)] * 2)
    assert not group.accepts([np.dtype(np.float64)] * 2)  # the literal is float32


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_cuda_source_is_built_per_dtype_without_cupy(dtype):
    nodes = [helper.make_node("Tanh", ["x"], ["a"]), helper.make_node("Mul", ["a", "y"], ["b"])]
    (group,) = find_groups(nodes, lambda i: True, ["b"], {})
    src = group.cuda_source(dtype)
    assert src["in_params"] == f"{dtype} in0, {dtype} in1" and src["out_params"] == f"{dtype} out0"
    ctype = "double" if dtype == "float64" else "float"
    assert src["operation"].startswith(f"typedef {ctype} ctype;")
    assert "op_tanh(a0)" in src["operation"] and "op_tanh" in src["preamble"]


def test_float16_is_computed_in_float32_and_rounded_once():
    nodes = [helper.make_node("Mul", ["x", "y"], ["a"]), helper.make_node("Div", ["a", "z"], ["b"])]
    (group,) = find_groups(nodes, lambda i: True, ["b"], {})
    x = y = z = np.full(2, 300, np.float16)
    assert group.evaluate(np, x, y, z).dtype == np.float16
    assert float(group.evaluate(np, x, y, z)[0]) == 300.0  # a float16 x*y would overflow
