"""layer_norm_fusion: the decomposed LayerNorm exporters write -> LayerNormalization-17, or
com.microsoft SkipLayerNormalization before opset 17 when it follows a residual Add."""
import numpy as np
import pytest
from onnx import helper

from optimized.passes.layer_norm_fusion import fuse_layer_norm
from reference import ReferenceEvaluator

from .helpers import _Builder, assert_same_outputs, make_model, op_types

D = 16


def layer_norm_model(opset=17, residual=False, shape=(2, 5, D), gamma_input=False):
    b = _Builder(opset, seed=1)
    x = b.node("Add", "x", "skip") if residual else "x"
    y = b.layer_norm(x, shape[-1], eps=1e-5)
    b.nodes.append(helper.make_node("Identity", [y], ["y"]))
    inputs = [("x", list(shape))] + ([("skip", list(shape))] if residual else [])
    model = make_model(b.nodes, inputs, [("y", list(shape))], b.inits, opset=opset)
    if gamma_input:  # the scale becomes an overridable input, so no constant
        mul = next(n for n in model.graph.node if n.op_type == "Mul")
        model.graph.input.append(helper.make_tensor_value_info(mul.input[1], 1, [shape[-1]]))
    return model


def attrs_of(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("opset", [17, 18])
def test_becomes_layer_normalization_from_opset_17(opset):
    model = layer_norm_model(opset)
    fused = fuse_layer_norm(model)
    assert op_types(fused) == {"LayerNormalization": 1, "Identity": 1}
    attrs = attrs_of(fused.graph.node[0])
    assert attrs["axis"] == 2 and attrs["epsilon"] == pytest.approx(1e-5)
    assert_same_outputs(model, fused)


def test_residual_before_opset_17_becomes_skip_layer_normalization():
    model = layer_norm_model(opset=13, residual=True)
    fused = fuse_layer_norm(model)
    assert op_types(fused) == {"com.microsoft::SkipLayerNormalization": 1, "Identity": 1}
    assert list(fused.graph.node[0].input)[:2] == ["x", "skip"]
    assert_same_outputs(model, fused)


def test_residual_sum_read_elsewhere_comes_from_the_fourth_output():
    model = layer_norm_model(opset=13, residual=True)
    total = model.graph.node[0].output[0]
    model.graph.node.append(helper.make_node("Neg", [total], ["z"]))
    model.graph.output.append(helper.make_tensor_value_info("z", 1, [2, 5, D]))
    fused = fuse_layer_norm(model)
    skip_ln = next(n for n in fused.graph.node if n.op_type == "SkipLayerNormalization")
    assert list(skip_ln.output)[3] == total
    assert_same_outputs(model, fused)


def test_before_opset_17_without_a_residual_becomes_onnxruntimes_layer_normalization():
    # onnx has LayerNormalization from 17; onnxruntime and the reference register it from 1
    model = layer_norm_model(opset=13)
    fused = fuse_layer_norm(model)
    assert op_types(fused) == {"LayerNormalization": 1, "Identity": 1}
    assert fused.opset_import[0].version == 13
    assert_same_outputs(model, fused)


def test_kept_when_the_mean_is_not_over_trailing_axes():
    model = layer_norm_model()
    for node in model.graph.node:
        if node.op_type == "ReduceMean":
            node.attribute[0].ints[:] = [1]
    assert op_types(fuse_layer_norm(model)) == op_types(model)


def test_a_scale_that_is_not_constant_stays_outside():
    # an overridable scale cannot become LayerNormalization's input of a fixed shape: the
    # normalization fuses, the Mul and Add after it stay
    model = layer_norm_model(gamma_input=True)
    fused = fuse_layer_norm(model)
    assert op_types(fused) == {"LayerNormalization": 1, "Mul": 1, "Add": 1, "Identity": 1}
    assert_same_outputs(model, fused)


def test_kept_when_an_intermediate_is_read_elsewhere():
    model = layer_norm_model()
    sqrt = next(n for n in model.graph.node if n.op_type == "Sqrt")
    model.graph.node.append(helper.make_node("Neg", [sqrt.output[0]], ["z"]))
    model.graph.output.append(helper.make_tensor_value_info("z", 1, [2, 5, 1]))
    assert op_types(fuse_layer_norm(model)) == op_types(model)


def test_fused_values_by_hand():
    # one row [1, 2, 3, 4]: mean 2.5, variance 1.25; gamma 2, beta 1, eps 0
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]),
             helper.make_node("Sub", ["x", "mean"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["var_eps"]),
             helper.make_node("Sqrt", ["var_eps"], ["std"]),
             helper.make_node("Div", ["d", "std"], ["normed"]),
             helper.make_node("Mul", ["gamma", "normed"], ["scaled"]),
             helper.make_node("Add", ["beta", "scaled"], ["y"])]
    inits = {"two": np.float32(2), "eps": np.float32(0), "gamma": np.full(4, 2, np.float32),
             "beta": np.ones(4, np.float32)}
    model = make_model(nodes, [("x", [1, 4])], [("y", [1, 4])], inits)
    fused = fuse_layer_norm(model)
    assert op_types(fused) == {"LayerNormalization": 1}
    assert list(fused.graph.node[0].input) == ["x", "gamma", "beta"]
    x = np.array([[1, 2, 3, 4]], np.float32)
    expected = 2 * (x - 2.5) / np.sqrt(1.25) + 1
    np.testing.assert_allclose(ReferenceEvaluator(fused).run(None, {"x": x})[0], expected,
                               rtol=1e-6)


def test_two_layer_norms_of_one_residual_sum_absorb_it_once():
    b = _Builder(13, seed=4)
    total = b.node("Add", "x", "skip")
    first, second = b.layer_norm(total, D), b.layer_norm(total, D)
    b.nodes.append(helper.make_node("Add", [first, second], ["y"]))
    shape = [2, 5, D]
    model = make_model(b.nodes, [("x", shape), ("skip", shape)], [("y", shape)], b.inits,
                       opset=13)
    fused = fuse_layer_norm(model)
    assert op_types(fused)["com.microsoft::SkipLayerNormalization"] == 1
    # the second reads the sum, which the first makes as its fourth output
    assert op_types(fused)["LayerNormalization"] == 1 and "ReduceMean" not in op_types(fused)
    assert_same_outputs(model, fused)
