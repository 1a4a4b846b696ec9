"""cse: nodes with the same op, inputs and attributes are computed once."""
import numpy as np
from onnx import helper

from optimized.passes.cse import eliminate_common_subexpressions

from .helpers import assert_same_outputs, make_model, op_types


def test_merges_repeated_nodes_and_what_follows_them():
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Relu", ["x"], ["b"]),
             helper.make_node("Exp", ["a"], ["ea"]),
             helper.make_node("Exp", ["b"], ["eb"]),  # same once b is read as a
             helper.make_node("Add", ["ea", "eb"], ["y"])]
    model = make_model(nodes, [("x", [4])], [("y", [4])])
    merged = eliminate_common_subexpressions(model)
    assert op_types(merged) == {"Relu": 1, "Exp": 1, "Add": 1}
    assert list(merged.graph.node[-1].input) == ["ea", "ea"]
    assert_same_outputs(model, merged)


def test_keeps_nodes_with_different_attributes_or_random_values():
    nodes = [helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.1),
             helper.make_node("LeakyRelu", ["x"], ["b"], alpha=0.2),
             helper.make_node("RandomNormalLike", ["x"], ["r1"]),
             helper.make_node("RandomNormalLike", ["x"], ["r2"]),
             helper.make_node("Sum", ["a", "b", "r1", "r2"], ["y"])]
    model = make_model(nodes, [("x", [4])], [("y", [4])])
    assert op_types(eliminate_common_subexpressions(model)) == op_types(model)


def test_keeps_a_duplicate_that_is_a_graph_output():
    nodes = [helper.make_node("Relu", ["x"], ["y1"]), helper.make_node("Relu", ["x"], ["y2"])]
    model = make_model(nodes, [("x", [4])], [("y1", [4]), ("y2", [4])])
    merged = eliminate_common_subexpressions(model)
    assert op_types(merged) == {"Relu": 2}
    assert_same_outputs(model, merged, feeds={"x": np.arange(-2, 2, dtype=np.float32)})
