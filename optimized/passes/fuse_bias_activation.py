"""Conv/Gemm (bias included) followed by an activation become com.microsoft FusedConv /
FusedGemm, and a MatMul scaled by a constant becomes com.microsoft FusedMatMul, with the
attributes onnxruntime's contrib operator docs define.

onnxruntime's FusedConv has no HardSwish (MobileNetV3's activation), so a Conv with a bias
followed by HardSwish becomes `onnx_parity.fused::ConvHardSwish(X, W, B)` instead: a
model-local function whose body is those two nodes (the Conv's attributes passed through by
reference), so the rewritten model stays valid ONNX that any runtime can run, and the CPU
provider runs it as one convolution with the activation applied to its output."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ._graph import (
    FUSED_DOMAIN,
    MS_DOMAIN,
    Constants,
    Shapes,
    Splices,
    add_fused_functions,
    attr,
    consumers,
    copy_model,
    ensure_opset,
    graph_output_names,
    only_reader,
    opset_version,
    scalar,
    set_nodes,
)

CONV_HARD_SWISH = "ConvHardSwish"
CONV_ATTRIBUTES = {"auto_pad": onnx.AttributeProto.STRING, "dilations": onnx.AttributeProto.INTS,
                   "group": onnx.AttributeProto.INT, "kernel_shape": onnx.AttributeProto.INTS,
                   "pads": onnx.AttributeProto.INTS, "strides": onnx.AttributeProto.INTS}

ACTIVATIONS = {
    "Conv": ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid"),
    # onnxruntime's FusedGemm kernel has no Clip
    "Gemm": ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid"),
}


def _output_type(node, constants, shapes):
    """The element type of a Conv's, Gemm's or MatMul's output: that of a constant weight B
    where it has one (the op's one type constraint covers its inputs and output), so that a
    convolutional model needs no shape inference here; else as inferred."""
    tensor = constants.tensors.get(node.input[1]) if len(node.input) > 1 else None
    return tensor.data_type if tensor is not None else shapes.elem_type(node.output[0])


def fuse_bias_activation(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    shapes, constants = Shapes(model), Constants(graph)
    uses, outputs = consumers(graph), graph_output_names(graph)
    opset = opset_version(model)
    nodes = Splices(graph.node)
    microsoft = hard_swish = False  # which domains' ops were written
    consumed: set[int] = set()  # a residual Add read by two Convs goes to the first one only
    for node in list(graph.node):
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("Conv", "Gemm", "MatMul"):
            continue
        if _output_type(node, constants, shapes) != onnx.TensorProto.FLOAT:
            continue  # onnxruntime's fused kernels are float32 ones
        reader = only_reader(uses, outputs, node.output[0])
        if reader is None or reader.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "MatMul":
            fused, followers = _fused_matmul(node, reader, constants, shapes), [reader]
        elif node.op_type == "Conv" and reader.op_type == "HardSwish":
            fused, followers = _conv_hard_swish(node, reader), [reader]
        elif node.op_type == "Conv" and reader.op_type in ("Add", "Sum"):
            fused, followers = _fused_conv_residual(node, reader, uses, outputs, constants,
                                                    shapes, opset)
        else:
            params = _activation_params(node.op_type, reader, constants, opset)
            fused = None if params is None else _fused_with_activation(node, reader, params)
            followers = [reader]
        replaced = [node, *followers]
        if fused is not None and not any(id(n) in consumed for n in replaced):
            consumed.update(id(n) for n in replaced)
            nodes.replace(replaced, [fused])
            microsoft |= fused.domain == MS_DOMAIN
            hard_swish |= fused.domain == FUSED_DOMAIN
    set_nodes(graph, nodes.nodes())
    if microsoft:
        ensure_opset(model, MS_DOMAIN, 1)
    if hard_swish:
        add_fused_functions(model, [CONV_HARD_SWISH], lambda _: conv_hard_swish_function(opset))
    return model


def _conv_hard_swish(conv, hard_swish):
    """Conv(X, W, B) + HardSwish as one ConvHardSwish node, or None (no bias: the function
    takes three inputs)."""
    if len(conv.input) != 3 or not conv.input[2]:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    return helper.make_node(CONV_HARD_SWISH, list(conv.input), [hard_swish.output[0]],
                            name=conv.name or hard_swish.name, domain=FUSED_DOMAIN, **attrs)


def conv_hard_swish_function(opset: int) -> onnx.FunctionProto:
    """ConvHardSwish(X, W, B) = HardSwish(Conv(X, W, B)), the Conv's attributes by reference,
    in the model's ai.onnx opset (HardSwish exists from 14)."""
    conv = helper.make_node("Conv", ["X", "W", "B"], ["conv"])
    conv.attribute.extend(helper.make_attribute_ref(name, kind)
                          for name, kind in CONV_ATTRIBUTES.items())
    body = [conv, helper.make_node("HardSwish", ["conv"], ["Y"])]
    return helper.make_function(FUSED_DOMAIN, CONV_HARD_SWISH, ["X", "W", "B"], ["Y"], body,
                                [helper.make_opsetid("", opset)],
                                attributes=list(CONV_ATTRIBUTES))


def _activation_params(fused_op, node, constants, opset):
    """The activation's parameters in the order onnxruntime lists them, or None."""
    op = node.op_type
    if op not in ACTIVATIONS[fused_op]:
        return None
    if op == "LeakyRelu":
        return [attr(node, "alpha", 0.01)]
    if op == "HardSigmoid":
        return [attr(node, "alpha", 0.2), attr(node, "beta", 0.5)]
    if op == "Clip":
        return _clip_bounds(node, constants, opset)
    return []


def _clip_bounds(node, constants, opset):
    if opset < 11:
        return [attr(node, "min", -3.4028234663852886e38), attr(node, "max", 3.4028234663852886e38)]
    bounds = []
    for i, default in ((1, np.finfo(np.float32).min), (2, np.finfo(np.float32).max)):
        if len(node.input) > i and node.input[i]:
            value = scalar(constants, node.input[i])
            if value is None:
                return None
            bounds.append(value)
        else:
            bounds.append(float(default))
    return bounds


def _fused_conv_residual(conv, add, uses, outputs, constants, shapes, opset):
    """Conv + Add(residual) + activation -> FusedConv with the residual as its Z input:
    (the fused node or None, the nodes it replaces after the Conv)."""
    z = [n for n in add.input if n != conv.output[0]]
    if len(add.input) != 2 or len(z) != 1:
        return None, []
    act = only_reader(uses, outputs, add.output[0])
    if act is None or act.domain not in ("", "ai.onnx"):
        return None, []
    params = _activation_params("Conv", act, constants, opset)
    # the shapes last: a residual that no activation follows needs no shape inference
    if params is None or not shapes.same_shape(z[0], conv.output[0]):
        return None, []
    fused = _fused_with_activation(conv, act, params)
    inputs = list(conv.input) + [""] * (3 - len(conv.input))
    del fused.input[:]
    fused.input.extend(inputs[:3] + z)
    return fused, [add, act]


def _fused_with_activation(node, act, params):
    added = {"activation": act.op_type}
    if node.op_type == "Conv":
        if params:
            added["activation_params"] = [float(p) for p in params]
        op_type = "FusedConv"
    else:
        for name, value in zip(("activation_alpha", "activation_beta"), params):
            added[name] = float(value)
        op_type = "FusedGemm"
    # the node's own attributes are copied as they are (remaking each through make_attribute
    # cost densenet121's session 6 ms), in name order as make_node writes them
    attributes = [a for a in node.attribute if a.name not in added]
    attributes += [helper.make_attribute(name, value) for name, value in added.items()]
    fused = onnx.NodeProto(op_type=op_type, domain=MS_DOMAIN, name=node.name or act.name,
                           input=node.input, output=[act.output[0]])
    fused.attribute.extend(sorted(attributes, key=lambda a: a.name))
    return fused


def _fused_matmul(matmul, scale_node, constants, shapes):
    if scale_node.op_type not in ("Mul", "Div") or len(scale_node.input) != 2:
        return None
    a, b = matmul.input
    if (shapes.rank(a) or 0) < 2 or (shapes.rank(b) or 0) < 2:
        return None
    other = [n for n in scale_node.input if n != matmul.output[0]]
    if len(other) != 1 or (scale_node.op_type == "Div" and scale_node.input[1] != other[0]):
        return None
    value = constants.get(other[0])
    if value is None or value.size != 1 or value.ndim > (shapes.rank(matmul.output[0]) or 0) or (
            value.dtype.kind != "f"):
        return None
    factor = float(value.reshape(-1)[0])
    if scale_node.op_type == "Div":
        if factor == 0:
            return None
        factor = 1.0 / factor
    return helper.make_node("FusedMatMul", [a, b], [scale_node.output[0]],
                            name=matmul.name or scale_node.name, domain=MS_DOMAIN, alpha=factor)
