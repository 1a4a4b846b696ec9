"""conv_affine_folding: Conv then Mul/Add of per-channel constants becomes one Conv."""
import numpy as np
import pytest
from onnx import helper, numpy_helper

from optimized.passes.conv_affine_folding import fold_conv_affine

from .helpers import assert_same_outputs, make_model, op_types

RNG = np.random.default_rng(9)


def conv_then(steps, bias=True):
    """Conv (4 output channels) followed by (op, constant) steps, in order."""
    inits = {"w": RNG.standard_normal((4, 2, 3, 3)).astype(np.float32)}
    if bias:
        inits["b"] = RNG.standard_normal(4).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["t0"])]
    for i, (op_type, value) in enumerate(steps, 1):
        inits[f"c{i}"] = np.asarray(value, np.float32)
        nodes.append(helper.make_node(op_type, [f"t{i - 1}", f"c{i}"], [f"t{i}"]))
    nodes.append(helper.make_node("Identity", [f"t{len(steps)}"], ["y"]))
    return make_model(nodes, [("x", [1, 2, 5, 5])], [("y", [1, 4, 3, 3])], inits)


def test_folded_values_by_hand():
    # w = 1 everywhere, b = 0: y = (conv * [1, 2, 3, 4]) + 10 per channel
    inits = {"w": np.ones((4, 1, 1, 1), np.float32),
             "s": np.arange(1, 5, dtype=np.float32).reshape(4, 1, 1), "t": np.float32(10)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Mul", ["s", "c"], ["m"]),
             helper.make_node("Add", ["m", "t"], ["y"])]
    model = make_model(nodes, [("x", [1, 1, 2, 2])], [("y", [1, 4, 2, 2])], inits)
    folded = fold_conv_affine(model)
    assert op_types(folded) == {"Conv": 1}
    values = {i.name: numpy_helper.to_array(i) for i in folded.graph.initializer}
    w, b = (values[n] for n in folded.graph.node[0].input[1:])
    assert w.reshape(-1).tolist() == [1, 2, 3, 4] and b.tolist() == [10, 10, 10, 10]
    assert_same_outputs(model, folded)


@pytest.mark.parametrize("steps,bias", [
    ([("Mul", np.full((4, 1, 1), 0.5))], True),
    ([("Add", np.arange(4).reshape(1, 4, 1, 1))], False),
    ([("Mul", RNG.random((4, 1, 1))), ("Add", RNG.random((4, 1, 1)))], True),
], ids=["scale", "shift", "scale then shift"])
def test_per_channel_steps_fold_into_the_conv(steps, bias):
    model = conv_then(steps, bias)
    folded = fold_conv_affine(model)
    assert op_types(folded) == {"Conv": 1, "Identity": 1}
    assert_same_outputs(model, folded)


@pytest.mark.parametrize("value", [np.ones((1, 1, 3, 1)), np.ones(3)],
                         ids=["per-row", "per-column"])
def test_constant_that_varies_over_space_is_kept(value):
    model = conv_then([("Mul", value)])
    assert op_types(fold_conv_affine(model)) == op_types(model)
