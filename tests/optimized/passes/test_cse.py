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


def _branch(name):
    return helper.make_graph([helper.make_node("Relu", ["x"], [name])], name, [],
                             [helper.make_tensor_value_info(name, 1, [4])])


def test_keeps_nodes_holding_a_subgraph_and_merges_those_with_attributes_in_another_order():
    nodes = [helper.make_node("If", ["c"], ["i1"], then_branch=_branch("t1"),
                              else_branch=_branch("e1")),
             helper.make_node("If", ["c"], ["i2"], then_branch=_branch("t1"),
                              else_branch=_branch("e1")),
             helper.make_node("Transpose", ["x"], ["p1"], perm=[0]),
             helper.make_node("Transpose", ["x"], ["p2"], perm=[0]),
             helper.make_node("Sum", ["i1", "i2", "p1", "p2"], ["y"])]
    swapped = helper.make_node("Gemm", ["m", "m"], ["g2"], transB=1, alpha=2.0)
    nodes += [helper.make_node("Gemm", ["m", "m"], ["g1"], alpha=2.0, transB=1), swapped,
              helper.make_node("Add", ["g1", "g2"], ["z"])]
    swapped.attribute.sort(key=lambda a: a.name, reverse=True)  # transB before alpha
    model = make_model(nodes, [("x", [4]), ("m", [2, 2])], [("y", [4]), ("z", [2, 2])])
    model.graph.input.append(helper.make_tensor_value_info("c", 9, []))
    merged = eliminate_common_subexpressions(model)
    assert op_types(merged) == {"If": 2, "Transpose": 1, "Sum": 1, "Gemm": 1, "Add": 1}
    assert list(merged.graph.node[-1].input) == ["g1", "g1"]


def test_a_subgraph_reading_a_dropped_duplicate_reads_the_first_one():
    def branch(op, name):
        return helper.make_graph([helper.make_node(op, ["b"], [name])], name, [],
                                 [helper.make_tensor_value_info(name, 1, [4])])
    nodes = [helper.make_node("Neg", ["x"], ["a"]),
             helper.make_node("Neg", ["x"], ["b"]),  # a duplicate of a: dropped
             helper.make_node("If", ["c"], ["y"], then_branch=branch("Relu", "t"),
                              else_branch=branch("Abs", "e"))]
    model = make_model(nodes, [("x", [4])], [("y", [4])])
    model.graph.input.append(helper.make_tensor_value_info("c", 9, []))
    merged = eliminate_common_subexpressions(model)
    assert op_types(merged) == {"Neg": 1, "If": 1}
    branches = [a.g for a in merged.graph.node[-1].attribute]
    assert [list(g.node[0].input) for g in branches] == [["a"], ["a"]]
    for flag in (True, False):
        feeds = {"x": np.array([-1.5, 0.0, 2.0, -3.0], np.float32), "c": np.array(flag)}
        assert_same_outputs(model, merged, feeds=feeds)
