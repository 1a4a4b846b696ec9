"""gelu_fusion: the decomposed exact Gelu -> com.microsoft Gelu, the tanh approximation ->
com.microsoft FastGelu; from opset 20, ai.onnx Gelu."""
import math

import numpy as np
import pytest
from onnx import helper

from optimized.passes.gelu_fusion import fuse_gelu
from reference import ReferenceEvaluator

from .helpers import _Builder, assert_same_outputs, make_model, op_types

SQRT2 = math.sqrt(2.0)


def gelu_model(form, opset=17):
    b = _Builder(opset)
    hidden = b.node("Relu", "x")  # x is read by the pattern and by nothing else here
    y = b.gelu_tanh(hidden) if form == "tanh" else b.gelu_erf(hidden)
    b.nodes.append(helper.make_node("Neg", [y], ["y"]))
    return make_model(b.nodes, [("x", [3, 8])], [("y", [3, 8])], b.inits, opset=opset)


def erf_half_first(opset=17, sqrt2=SQRT2):
    """(x * 0.5) * (1 + erf(x / sqrt2)), the other order exporters write."""
    nodes = [helper.make_node("Mul", ["x", "half"], ["h"]),
             helper.make_node("Div", ["x", "sqrt2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]),
             helper.make_node("Mul", ["h", "a"], ["y"])]
    inits = {"half": np.float32(0.5), "sqrt2": np.float32(sqrt2), "one": np.float32(1)}
    return make_model(nodes, [("x", [3, 8])], [("y", [3, 8])], inits, opset=opset)


@pytest.mark.parametrize("form,op_type", [("erf", "com.microsoft::Gelu"),
                                          ("tanh", "com.microsoft::FastGelu")])
def test_becomes_contrib_gelu_before_opset_20(form, op_type):
    model = gelu_model(form)
    fused = fuse_gelu(model)
    assert op_types(fused) == {"Relu": 1, op_type: 1, "Neg": 1}
    assert_same_outputs(model, fused)


@pytest.mark.parametrize("form,approximate", [("erf", "none"), ("tanh", "tanh")])
def test_becomes_onnx_gelu_from_opset_20(form, approximate):
    model = gelu_model(form, opset=20)
    fused = fuse_gelu(model)
    assert op_types(fused) == {"Relu": 1, "Gelu": 1, "Neg": 1}
    gelu = fused.graph.node[1]
    assert helper.get_attribute_value(gelu.attribute[0]) == approximate.encode()
    assert_same_outputs(model, fused)


def test_half_first_order_is_fused():
    model = erf_half_first()
    fused = fuse_gelu(model)
    assert op_types(fused) == {"com.microsoft::Gelu": 1}
    assert list(fused.graph.node[0].input) == ["x"]
    assert_same_outputs(model, fused)


def test_fused_values_by_hand():
    fused = fuse_gelu(erf_half_first())
    x = np.array([[-1.0, 0.0, 1.0] + [2.0] * 5] * 3, np.float32)
    # Gelu(1) = 0.5 * (1 + erf(1/sqrt2)) = 0.841344746...
    y = ReferenceEvaluator(fused).run(None, {"x": x})[0]
    np.testing.assert_allclose(y[0, :3], [-0.15865525, 0.0, 0.84134475], rtol=1e-6)


def test_wrong_constant_is_kept():
    model = erf_half_first(sqrt2=2.0)
    assert op_types(fuse_gelu(model)) == op_types(model)


def test_intermediate_read_elsewhere_is_kept():
    model = erf_half_first()
    model.graph.node.append(helper.make_node("Neg", ["e"], ["z"]))
    model.graph.output.append(helper.make_tensor_value_info("z", 1, [3, 8]))
    assert op_types(fuse_gelu(model)) == op_types(model)
