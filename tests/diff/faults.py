"""Planted faults: a perturbed constant in a copy of the model, or a slightly wrong kernel."""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import numpy_helper

LIGHT_RESNET50 = os.path.join(os.path.dirname(onnx.__file__),
                              "backend/test/data/light/light_resnet50.onnx")


def scale_constant_of_shape(model: onnx.ModelProto, output: str, factor: float):
    """A copy of the model where the ConstantOfShape making `output` fills with value*factor."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    node = next(n for n in copy.graph.node if output in n.output)
    assert node.op_type == "ConstantOfShape"
    value = node.attribute[0].t
    value.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(value) * np.float32(factor)))
    return copy


def scale_initializer(model: onnx.ModelProto, name: str, factor: float):
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    init = next(i for i in copy.graph.initializer if i.name == name)
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(factor), name))
    return copy


def softmax_with_epsilon(x, axis=-1):
    """Softmax whose denominator carries an epsilon: wrong by about 1e-3 relative."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / (e.sum(axis=axis, keepdims=True) + 1e-3)).astype(x.dtype)


def add_with_epsilon(a, b):
    return (a + b + np.asarray(1e-3, a.dtype)).astype(a.dtype)
