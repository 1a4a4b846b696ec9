"""_graph's bookkeeping for the passes: Splices gives what splice() one after another gives,
and the views shared between passes are those a fresh build gives."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from optimized.passes._graph import Splices, splice


def _nodes(count, prefix="n"):
    return [helper.make_node("Relu", [f"{prefix}{k}_in"], [f"{prefix}{k}"]) for k in range(count)]


# one replacement: which nodes it replaces (positions into the list of every node made so
# far, so a later one may take nodes an earlier one made, or ones already gone) and how many
# new nodes it puts in their place
_replacement = st.tuples(st.lists(st.integers(0, 60), min_size=1, max_size=4),
                         st.integers(0, 3))


@settings(max_examples=200, deadline=None)
@given(count=st.integers(1, 30), replacements=st.lists(_replacement, max_size=12))
def test_splices_give_what_splice_one_after_another_gives(count, replacements):
    original = _nodes(count)
    made = list(original)  # every node either side may name
    expected, spliced = list(original), Splices(original)
    for r, (picks, new_count) in enumerate(replacements):
        old = [made[p % len(made)] for p in picks]
        new = _nodes(new_count, prefix=f"r{r}_")
        made.extend(new)
        try:
            expected = splice(expected, old, new)
        except ValueError:
            with pytest.raises(ValueError, match="none of the nodes"):
                spliced.replace(old, new)
            continue
        spliced.replace(old, new)
    assert [id(n) for n in spliced.nodes()] == [id(n) for n in expected]


def test_splices_place_each_replacement_where_the_last_of_its_nodes_stood():
    a, b, c, d, e = _nodes(5)
    x, y = _nodes(2, prefix="new")
    spliced = Splices([a, b, c, d, e])
    spliced.replace([d, b], [x])
    spliced.replace([a], [y])
    assert spliced.nodes() == [y, c, x, e]


def test_splices_without_a_replacement_give_the_list_itself():
    nodes = _nodes(3)
    assert Splices(nodes).nodes() == nodes


def _passes_of(monkeypatch, *functions):
    import optimized.passes
    from optimized.passes import Pass

    monkeypatch.setattr(optimized.passes, "PASSES",
                        [Pass(f"pass_{i}", 1, f) for i, f in enumerate(functions)])


def _add_relu_model():
    import numpy as np

    from .helpers import make_model

    nodes = [helper.make_node("Add", ["x", "w"], ["h"]),
             helper.make_node("Constant", [], ["c"], value_float=2.0),
             helper.make_node("Mul", ["h", "c"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    return make_model(nodes, [("x", [2, 3])], [("y", [2, 3])],
                      {"w": np.arange(6, dtype=np.float32).reshape(2, 3)})


def _fresh_constants(graph):
    from optimized.passes._graph import _constant_tensors

    return {name: t.SerializeToString() for name, t in _constant_tensors(graph).items()}


def test_constant_tensors_are_a_fresh_build_after_every_kind_of_edit(monkeypatch):
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from optimized.passes import _graph, optimize

    seen = []

    def look(model):
        found = _graph.constant_tensors(model.graph)
        assert {n: t.SerializeToString() for n, t in found.items()} == _fresh_constants(
            model.graph)
        seen.append(sorted(found))
        found["scribbled"] = None  # the caller's own dict: no later pass sees this
        return model

    def add_initializer(model):
        model = _graph.copy_model(model)
        model.graph.initializer.append(numpy_helper.from_array(np.ones(3, np.float32), "v"))
        return model

    def shadow_by_input(model):  # a graph input of w's name: w is no constant any more
        model = look(_graph.copy_model(model))  # asked before the edit, in the same pass
        model.graph.input.append(onnx.helper.make_tensor_value_info("w", 1, [2, 3]))
        return look(model)  # and after it

    def drop_constant_node(model):
        model = look(_graph.copy_model(model))
        kept = [n for n in model.graph.node if n.op_type != "Constant"]
        _graph.set_nodes(model.graph, kept)
        return look(model)

    _passes_of(monkeypatch, look, look, add_initializer, look, shadow_by_input, look,
               drop_constant_node, look)
    optimize(_add_relu_model(), 1)
    assert seen == [["c", "w"], ["c", "w"], ["c", "v", "w"], ["c", "v", "w"], ["c", "v"],
                    ["c", "v"], ["c", "v"], ["v"], ["v"]]


def test_holds_subgraph_is_whether_subgraphs_yields_any():
    from onnx import AttributeProto

    from optimized.passes._graph import holds_subgraph, subgraphs

    body = helper.make_graph([], "body", [], [])
    branchy = helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)
    listed = helper.make_node("Custom", ["x"], ["y"], domain="example")
    listed.attribute.add(name="bodies", type=AttributeProto.GRAPHS).graphs.append(body)
    empty_list = helper.make_node("Custom", ["x"], ["y"], domain="example")
    empty_list.attribute.add(name="bodies", type=AttributeProto.GRAPHS)
    plain = helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])
    bare = helper.make_node("Relu", ["x"], ["y"])
    for node, holds in ((branchy, True), (listed, True), (empty_list, False), (plain, False),
                        (bare, False)):
        assert holds_subgraph(node) is holds
        assert any(True for _ in subgraphs(node)) is holds


def test_holds_subgraph_reads_the_attributes_of_control_flow_and_other_domains_only():
    from optimized.passes._graph import consumers, holds_subgraph

    # the body reads "outer" from the enclosing graph: consumers must count the node reading it
    body = helper.make_graph([helper.make_node("Add", ["v", "outer"], ["w"])], "body",
                             [helper.make_tensor_value_info("v", 1, [1])],
                             [helper.make_tensor_value_info("w", 1, [1])])
    loop = helper.make_node("Loop", ["n", "", "v0"], ["y"], body=body)
    scan = helper.make_node("Scan", ["v0"], ["y"], body=body, num_scan_inputs=1)
    search = helper.make_node("BeamSearch", ["ids"], ["y"], domain="com.microsoft", decoder=body)
    for node in (loop, scan, search):
        assert holds_subgraph(node)
        graph = helper.make_graph([node], "g", [], [])
        assert consumers(graph)["outer"] == [node]
    # an ai.onnx op with no graph in its schema is not looked into (onnx's checker refuses one)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1], pads=[0, 0, 0, 0])
    assert not holds_subgraph(conv)
