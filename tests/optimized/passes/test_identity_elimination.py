"""identity_elimination: Identity, inference Dropout, same-type Cast, same-shape Reshape,
identity Transpose, Mul/Div by 1 and Add/Sub of 0 are bypassed."""
import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from optimized.passes._graph import Constants, working_copy
from optimized.passes.identity_elimination import Ranks, eliminate_identities

from .helpers import assert_same_outputs, make_model, op_types


def chain(op_type, *extra_inputs, shape=(2, 3), out_shape=(2, 3), initializers=None, **attrs):
    """x -> Relu -> op -> Abs -> y: the op under test sits between two ordinary nodes."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node(op_type, ["r", *extra_inputs], ["o"], **attrs),
             helper.make_node("Abs", ["o"], ["y"])]
    return make_model(nodes, [("x", list(shape))], [("y", list(out_shape))], initializers or {})


NO_OPS = {
    "Identity": chain("Identity"),
    "Dropout": chain("Dropout"),
    "Dropout, training_mode false": chain("Dropout", "ratio", "training",
                                          initializers={"ratio": np.float32(0.5),
                                                        "training": np.array(False)}),
    "Cast to float": chain("Cast", to=TensorProto.FLOAT),
    "CastLike a float": chain("CastLike", "like", initializers={"like": np.zeros(1, np.float32)}),
    "Reshape to its shape": chain("Reshape", "s", initializers={"s": np.array([2, -1])}),
    "Transpose identity": chain("Transpose", perm=[0, 1]),
    "Mul by 1": chain("Mul", "one", initializers={"one": np.float32(1.0)}),
    "Div by ones": chain("Div", "one", initializers={"one": np.ones(3, np.float32)}),
    "Add of 0": chain("Add", "zero", initializers={"zero": np.zeros((1, 3), np.float32)}),
    "Sub of 0": chain("Sub", "zero", initializers={"zero": np.float32(0.0)}),
}


@pytest.mark.parametrize("name", NO_OPS)
def test_no_op_is_removed(name):
    model = NO_OPS[name]
    rewritten = eliminate_identities(model)
    assert op_types(rewritten) == {"Relu": 1, "Abs": 1}
    assert_same_outputs(model, rewritten)


KEPT = {
    "Dropout in training": chain("Dropout", "ratio", "training",
                                 initializers={"ratio": np.float32(0.5),
                                               "training": np.array(True)}),
    "Cast to double": chain("Cast", to=TensorProto.DOUBLE),
    "Cast to int": chain("Cast", to=TensorProto.INT32),
    "Reshape to another shape": chain("Reshape", "s", initializers={"s": np.array([3, 2])}),
    "Transpose swapping axes": chain("Transpose", perm=[1, 0]),
    "Mul by 2": chain("Mul", "two", initializers={"two": np.float32(2.0)}),
    "Mul by ones but one": chain("Mul", "w", initializers={"w": np.array([1, 1, 3], np.float32)}),
    "Add of 0 then NaN": chain("Add", "b", initializers={"b": np.array([0, np.nan, 0], np.float32)}),
    "Mul by ones that broadcast wider": chain("Mul", "one", out_shape=(4, 2, 3),
                                              initializers={"one": np.ones((4, 1, 1), np.float32)}),
    "0 minus x": None,
}


@pytest.mark.parametrize("name", KEPT)
def test_op_that_changes_its_input_is_kept(name):
    model = KEPT[name]
    if model is None:  # Sub is not symmetric: 0 - x is no no-op
        nodes = [helper.make_node("Sub", ["zero", "x"], ["y"])]
        model = make_model(nodes, [("x", [3])], [("y", [3])], {"zero": np.float32(0.0)})
    assert op_types(eliminate_identities(model)) == op_types(model)


@pytest.mark.parametrize("op_type,neutral", [("Mul", 1.0), ("Add", 0.0)])
def test_neutral_constant_first_is_removed(op_type, neutral):
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node(op_type, ["c", "r"], ["o"]),
             helper.make_node("Abs", ["o"], ["y"])]
    model = make_model(nodes, [("x", [2, 3])], [("y", [2, 3])], {"c": np.float32(neutral)})
    rewritten = eliminate_identities(model)
    assert op_types(rewritten) == {"Relu": 1, "Abs": 1}
    assert list(rewritten.graph.node[1].input) == ["r"]
    assert_same_outputs(model, rewritten)


def test_identity_between_input_and_output_stays():
    model = make_model([helper.make_node("Identity", ["x"], ["y"])], [("x", [2])], [("y", [2])])
    assert op_types(eliminate_identities(model)) == {"Identity": 1}


def test_identity_onto_a_graph_output_renames_the_producer():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["y"])]
    model = make_model(nodes, [("x", [2])], [("y", [2])])
    rewritten = eliminate_identities(model)
    assert [(n.op_type, list(n.output)) for n in rewritten.graph.node] == [("Relu", ["y"])]
    assert_same_outputs(model, rewritten)


def dropout_with_mask(mask_read: bool, mask_returned: bool = False):
    """x -> Relu -> Dropout (output and mask) -> Abs -> y, the mask read by a Not or not."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Dropout", ["r"], ["o", "mask"], ratio=0.5),
             helper.make_node("Abs", ["o"], ["y"])]
    outputs = [("y", [2, 3])]
    if mask_read:
        nodes.append(helper.make_node("Not", ["mask"], ["kept"]))
        outputs.append(helper.make_tensor_value_info("kept", TensorProto.BOOL, [2, 3]))
    if mask_returned:
        outputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, [2, 3]))
    return make_model(nodes, [("x", [2, 3])], outputs, opset=9)


def test_inference_dropout_with_an_unread_mask_is_removed():
    # the light models' form (squeezenet at opset 9): the mask named, never read
    model = dropout_with_mask(mask_read=False)
    rewritten = eliminate_identities(model)
    assert op_types(rewritten) == {"Relu": 1, "Abs": 1}
    assert_same_outputs(model, rewritten)


@pytest.mark.parametrize("read, returned", [(True, False), (False, True)])
def test_dropout_whose_mask_is_read_or_returned_stays(read, returned):
    model = dropout_with_mask(mask_read=read, mask_returned=returned)
    rewritten = eliminate_identities(model)
    assert op_types(rewritten)["Dropout"] == 1
    assert list(rewritten.graph.node[1].output) == ["o", "mask"]


def _no_shape_inference(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("shape inference was asked")
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", refuse)


def test_reshape_to_another_rank_is_kept_without_shape_inference(monkeypatch):
    # the light models' channel shuffle: [1, 6, 2, 2] -> [1, 2, 3, 2, 2] -> Transpose -> back
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "split"], ["s"]),
             helper.make_node("Transpose", ["s"], ["t"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["t", "merged"], ["y"])]
    model = make_model(nodes, [("x", [1, 6, 2, 2])], [("y", [1, 6, 2, 2])],
                       {"split": np.array([1, 2, 3, 2, 2]), "merged": np.array([1, 6, 2, 2])})
    _no_shape_inference(monkeypatch)
    with working_copy(model) as working:
        rewritten = eliminate_identities(working.model)
    assert op_types(rewritten) == op_types(model)


def test_reshape_of_the_same_rank_still_asks_shape_inference():
    model = chain("Reshape", "s", shape=(2, 3), initializers={"s": np.array([3, 2])})
    with working_copy(model) as working:
        assert op_types(eliminate_identities(working.model))["Reshape"] == 1
    same = chain("Reshape", "s", initializers={"s": np.array([2, 3])})
    with working_copy(same) as working:
        assert op_types(eliminate_identities(working.model)) == {"Relu": 1, "Abs": 1}


# a step of a random chain: (op type, how it changes the shape)
STEPS = ["Relu", "Transpose", "TransposeDefault", "Reshape", "Add", "Flatten", "Concat", "Tile"]


@st.composite
def rank_chains(draw):
    """A chain of rank-changing and rank-keeping ops from a random input shape, with its
    initializers."""
    shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))
    nodes, inits, x, input_shape = [], {}, "x", list(shape)
    for k, step in enumerate(draw(st.lists(st.sampled_from(STEPS), min_size=1, max_size=6))):
        out = f"v{k}"
        if step == "Relu":
            nodes.append(helper.make_node("Relu", [x], [out]))
        elif step == "Transpose":
            perm = draw(st.permutations(range(len(shape))))
            nodes.append(helper.make_node("Transpose", [x], [out], perm=list(perm)))
            shape = [shape[p] for p in perm]
        elif step == "TransposeDefault":
            nodes.append(helper.make_node("Transpose", [x], [out]))
            shape = shape[::-1]
        elif step == "Reshape":
            size = int(np.prod(shape))
            shape = [size] if draw(st.booleans()) else [1, size, 1][:draw(st.integers(2, 3))]
            inits[f"shape{k}"] = np.array(shape, np.int64)
            nodes.append(helper.make_node("Reshape", [x, f"shape{k}"], [out]))
        elif step == "Add":
            rank = draw(st.integers(0, 5))
            inits[f"c{k}"] = np.ones([1] * rank, np.float32)
            nodes.append(helper.make_node("Add", [x, f"c{k}"], [out]))
            shape = [1] * (rank - len(shape)) + shape
        elif step == "Flatten":
            nodes.append(helper.make_node("Flatten", [x], [out]))
            shape = [1, int(np.prod(shape))]
        elif step == "Concat":
            nodes.append(helper.make_node("Concat", [x, x], [out], axis=0))
            shape = [2 * shape[0]] + shape[1:]
        else:  # Tile: no rule follows it
            inits[f"reps{k}"] = np.ones(len(shape), np.int64)
            nodes.append(helper.make_node("Tile", [x, f"reps{k}"], [out]))
        x = out
    return make_model(nodes, [("x", input_shape)], [(x, None)], inits)


@settings(max_examples=60, deadline=None)
@given(rank_chains())
def test_ranks_agree_with_shape_inference(model):
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph
    types = {v.name: v.type for v in [*inferred.value_info, *inferred.output]}
    ranks = Ranks(model.graph, Constants(model.graph))
    after_tile = False  # no rule follows a Tile, nor the ops after it that keep its rank
    for node in model.graph.node:
        name = node.output[0]
        rank = ranks.of(name)
        after_tile |= node.op_type == "Tile"
        if rank is None:
            assert after_tile and node.op_type not in ("Reshape", "Flatten"), node.op_type
        else:
            assert rank == len(types[name].tensor_type.shape.dim), (node.op_type, name)
