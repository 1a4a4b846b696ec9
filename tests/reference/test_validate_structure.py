"""validate() walks the graph's structure (reference/loading.py check_graph_structure) only when
onnx's checker refuses the model: each structural fault that walk names is one the checker
refuses too, so skipping the walk for a model the checker passes changes no verdict, and a
refused model still gets the walk's message (a cycle, an undefined value, an unsorted node)."""
import onnx
import pytest
from onnx import TensorProto, helper

from reference.errors import InvalidModelError
from reference.evaluator import validate


def _vi(name):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3])


def _model(nodes, opset=17):
    graph = helper.make_graph(nodes, "g", [_vi("x")], [_vi("y")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _branch(reads: str):
    return helper.make_graph([helper.make_node("Identity", [reads], ["b"])], "branch", [],
                             [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])


def _if(reads: str, name: str = "choice"):
    return helper.make_node("If", ["c"], ["i"], name=name, then_branch=_branch(reads),
                            else_branch=_branch(reads))


FAULTS = {
    "cycle": ([helper.make_node("Relu", ["b"], ["a"], name="first"),
               helper.make_node("Add", ["a", "x"], ["b"], name="second"),
               helper.make_node("Identity", ["b"], ["y"])], r"has a cycle: node 'second' \(Add\) -> node 'first'"),
    "unsorted": ([helper.make_node("Relu", ["a"], ["y"], name="late_reader"),
                  helper.make_node("Abs", ["x"], ["a"], name="maker")],
                 r"not in topological order: node 'late_reader'"),
    "undefined": ([helper.make_node("Add", ["x", "nowhere"], ["y"], name="adder")],
                  r"'nowhere' of node 'adder' \(Add\) is not defined"),
    "made twice": ([helper.make_node("Relu", ["x"], ["y"], name="one"),
                    helper.make_node("Abs", ["x"], ["y"], name="two")],
                   r"'y' is made more than once: by node 'one'"),
    "subgraph reads a later value": (
        [helper.make_node("Greater", ["x", "x"], ["g"]),
         helper.make_node("ReduceMin", ["g"], ["c"], keepdims=0), _if("late"),
         helper.make_node("Abs", ["x"], ["late"]), helper.make_node("Add", ["i", "late"], ["y"])],
        r"'late'"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_onnx_checker_refuses_each_structural_fault(fault):
    nodes, _ = FAULTS[fault]
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(_model(nodes))


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_structural_fault_is_named_by_the_structure_walk(fault):
    nodes, message = FAULTS[fault]
    with pytest.raises(InvalidModelError, match=message):
        validate(_model(nodes))


def test_the_walk_names_a_fault_after_an_op_the_checker_stops_at():
    """onnx's checker stops at the first node it cannot check (an op it does not define at the
    model's opset); a structural fault after it is still named."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Add", ["r", "nowhere"], ["y"], name="adder")]
    model = _model(nodes)
    model.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(InvalidModelError, match=r"'nowhere' of node 'adder' \(Add\) is not defined"):
        validate(model)


def test_a_sound_graph_with_a_subgraph_passes():
    nodes = [helper.make_node("Greater", ["x", "x"], ["g"]),
             helper.make_node("ReduceMin", ["g"], ["c"], keepdims=0),
             helper.make_node("Abs", ["x"], ["early"]), _if("early"),
             helper.make_node("Add", ["i", "early"], ["y"])]
    validate(_model(nodes))
