"""batchnorm_to_affine: an inference BatchNormalization left standing becomes Mul and Add of
per-channel constants."""
import numpy as np
import pytest
from onnx import helper, numpy_helper

from optimized.passes.batchnorm_to_affine import batchnorm_to_affine

from .helpers import assert_same_outputs, make_model, op_types

RNG = np.random.default_rng(5)


def lone_bn(shape, opset=15, **attrs):
    c = shape[1]
    inits = {"gamma": RNG.uniform(0.5, 2, c).astype(np.float32),
             "beta": RNG.standard_normal(c).astype(np.float32),
             "mean": RNG.standard_normal(c).astype(np.float32),
             "var": RNG.uniform(0.5, 2, c).astype(np.float32)}
    nodes = [helper.make_node("BatchNormalization", ["x", "gamma", "beta", "mean", "var"], ["y"],
                              **attrs)]
    return make_model(nodes, [("x", shape)], [("y", shape)], inits, opset=opset)


def test_scale_and_shift_by_hand():
    inits = {"gamma": np.array([3.0, 1.0], np.float32), "beta": np.array([0.5, 0.0], np.float32),
             "mean": np.array([1.0, -2.0], np.float32), "var": np.array([3.0, 0.0], np.float32)}
    nodes = [helper.make_node("BatchNormalization", ["x", "gamma", "beta", "mean", "var"], ["y"],
                              epsilon=1.0)]
    model = make_model(nodes, [("x", [1, 2, 3])], [("y", [1, 2, 3])], inits)
    rewritten = batchnorm_to_affine(model)
    assert op_types(rewritten) == {"Mul": 1, "Add": 1}
    values = {i.name: numpy_helper.to_array(i) for i in rewritten.graph.initializer}
    scale, shift = (values[n.input[1]] for n in rewritten.graph.node)
    # s = gamma / sqrt(var + 1) = [1.5, 1];  t = beta - mean * s = [-1, 2]; shaped [C, 1]
    assert scale.tolist() == [[1.5], [1.0]] and shift.tolist() == [[-1.0], [2.0]]
    assert_same_outputs(model, rewritten)


@pytest.mark.parametrize("shape", [[4, 3], [2, 3, 5], [2, 3, 4, 5], [1, 3, 2, 2, 2]])
def test_same_outputs_for_every_rank(shape):
    model = lone_bn(shape, epsilon=1e-3)
    rewritten = batchnorm_to_affine(model)
    assert "BatchNormalization" not in op_types(rewritten)
    assert_same_outputs(model, rewritten)


def test_training_mode_unknown_rank_and_variable_statistics_are_kept():
    model = lone_bn([2, 3, 4, 4], training_mode=1)
    assert op_types(batchnorm_to_affine(model)) == op_types(model)
    model = lone_bn([2, 3, 4, 4])
    model.graph.input[0].type.tensor_type.ClearField("shape")
    model.graph.output[0].type.tensor_type.ClearField("shape")
    assert op_types(batchnorm_to_affine(model)) == op_types(model)
    model = lone_bn([2, 3, 4, 4])
    model.graph.input.append(helper.make_tensor_value_info("mean", 1, [3]))  # overridable
    assert op_types(batchnorm_to_affine(model)) == op_types(model)


def test_before_opset_7_it_is_kept():
    # Mul and Add there broadcast only with the legacy broadcast/axis attributes
    model = lone_bn([2, 3, 4, 4], opset=6, is_test=1)
    assert op_types(batchnorm_to_affine(model)) == op_types(model)


def test_the_scaled_value_takes_a_name_no_value_of_the_graph_has():
    # a graph input named as the pass would name its Mul's output must keep its own value
    model = lone_bn([2, 3, 4])
    model.graph.input.append(helper.make_tensor_value_info("y_bn_scaled", 1, [2, 3, 4]))
    model.graph.node.append(helper.make_node("Add", ["y", "y_bn_scaled"], ["z"]))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("z", 1, [2, 3, 4]))
    rewritten = batchnorm_to_affine(model)
    assert "BatchNormalization" not in op_types(rewritten)
    assert_same_outputs(model, rewritten)
