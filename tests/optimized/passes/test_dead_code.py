"""dead_code: nodes, initializers and value_info that reach no graph output go."""
import numpy as np
import onnx
from onnx import TensorProto, helper

from optimized.passes.dead_code import eliminate_dead_code, keep_only

from .helpers import assert_same_outputs, make_model, op_types


def test_removes_a_branch_nothing_reads_and_its_weights():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Mul", ["x", "w"], ["unused"]),
             helper.make_node("Neg", ["unused"], ["unused2"]),
             helper.make_node("Abs", ["r"], ["y"])]
    model = make_model(nodes, [("x", [3])], [("y", [3])], {"w": np.ones(3, np.float32)})
    model.graph.value_info.append(helper.make_tensor_value_info("unused", TensorProto.FLOAT, [3]))
    cleaned = eliminate_dead_code(model)
    assert op_types(cleaned) == {"Relu": 1, "Abs": 1}
    assert not cleaned.graph.initializer and not cleaned.graph.value_info
    assert_same_outputs(model, cleaned)


def test_keeps_what_a_subgraph_reads_from_the_outer_scope():
    then_branch = helper.make_graph([helper.make_node("Identity", ["outer"], ["t"])], "then", [],
                                    [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])])
    else_branch = helper.make_graph([helper.make_node("Neg", ["outer"], ["e"])], "else", [],
                                    [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])])
    nodes = [helper.make_node("Relu", ["x"], ["outer"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then_branch,
                              else_branch=else_branch)]
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    model = make_model(nodes, [("x", [3]), cond], [("y", [3])])
    cleaned = eliminate_dead_code(model)
    assert op_types(cleaned) == {"Relu": 1, "If": 1}
    onnx.checker.check_model(cleaned, full_check=True)
    for flag in (True, False):
        feeds = {"x": np.array([-1.0, 0.5, 2.0], np.float32), "cond": np.array(flag)}
        assert_same_outputs(model, cleaned, feeds=feeds)


def test_keeps_graph_inputs_even_when_unused():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = make_model(nodes, [("x", [3]), ("spare", [2])], [("y", [3])])
    assert [i.name for i in eliminate_dead_code(model).graph.input] == ["x", "spare"]


def test_a_model_with_nothing_dead_comes_back_byte_for_byte():
    nodes = [helper.make_node("Clip", ["x", "", "hi"], ["c"]),  # an omitted optional input
             helper.make_node("Mul", ["c", "w"], ["y"])]
    model = make_model(nodes, [("x", [3])], [("y", [3])],
                       {"w": np.full(3, 2.0, np.float32), "hi": np.array(1.5, np.float32)})
    model.graph.value_info.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, [3]))
    before = model.SerializeToString()
    assert eliminate_dead_code(model).SerializeToString() == before


def test_the_initializers_and_value_info_kept_stay_in_their_order():
    nodes = [helper.make_node("Add", ["x", "a"], ["s"]),
             helper.make_node("Mul", ["x", "dead_w"], ["unused"]),
             helper.make_node("Mul", ["s", "b"], ["y"])]
    weights = {name: np.full(3, k + 1.0, np.float32) for k, name in enumerate(["b", "dead_w", "a"])}
    model = make_model(nodes, [("x", [3])], [("y", [3])], weights)
    for name in ("unused", "s"):
        model.graph.value_info.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [3]))
    cleaned = eliminate_dead_code(model)
    assert [i.name for i in cleaned.graph.initializer] == ["b", "a"]
    assert [v.name for v in cleaned.graph.value_info] == ["s"]
    assert_same_outputs(model, cleaned)


def test_keep_only_deletes_in_place_or_rebuilds_from_what_is_not_its_own():
    graph = helper.make_graph([helper.make_node("Relu", [f"v{k}"], [f"v{k + 1}"])
                               for k in range(5)], "g", [], [])
    nodes = list(graph.node)
    keep_only(graph.node, [nodes[1], nodes[3], nodes[4]])
    assert [n.output[0] for n in graph.node] == ["v2", "v4", "v5"]
    assert all(a is b for a, b in zip(graph.node, [nodes[1], nodes[3], nodes[4]]))
    stranger = helper.make_node("Abs", ["v5"], ["w"])  # not one of its entries: a rebuild
    keep_only(graph.node, [nodes[4], stranger])
    assert [n.output[0] for n in graph.node] == ["v5", "w"]
