"""initializer_inputs: IR < 4 models list their weights as inputs; those become constants."""
import numpy as np
from onnx import helper

from optimized.passes.initializer_inputs import freeze_initializer_inputs

from .helpers import assert_same_outputs, make_model


def model_listing_weights(ir_version):
    nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
    return make_model(nodes, [("x", [3]), ("w", [3])], [("y", [3])],
                      {"w": np.arange(3, dtype=np.float32)}, opset=8, ir_version=ir_version)


def test_ir3_weights_stop_being_inputs():
    model = model_listing_weights(3)
    frozen = freeze_initializer_inputs(model)
    assert [i.name for i in frozen.graph.input] == ["x"] and frozen.ir_version == 4
    assert [i.name for i in model.graph.input] == ["x", "w"]  # the original is left alone
    assert_same_outputs(model, frozen, feeds={"x": np.ones(3, np.float32)})


def test_ir4_overridable_initializers_stay_inputs():
    model = model_listing_weights(4)
    assert freeze_initializer_inputs(model) == model
