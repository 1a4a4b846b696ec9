"""Conv/Gemm (bias included) followed by an activation become com.microsoft FusedConv /
FusedGemm, and a MatMul scaled by a constant becomes com.microsoft FusedMatMul, with the
attributes onnxruntime's contrib operator docs define."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ._graph import (
    MS_DOMAIN,
    Constants,
    Shapes,
    attr,
    consumers,
    copy_model,
    ensure_opset,
    graph_output_names,
    only_reader,
    opset_version,
    scalar,
    set_nodes,
    splice,
)

ACTIVATIONS = {
    "Conv": ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid"),
    # onnxruntime's FusedGemm kernel has no Clip
    "Gemm": ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid"),
}


def fuse_bias_activation(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    shapes, constants = Shapes(model), Constants(graph)
    uses, outputs = consumers(graph), graph_output_names(graph)
    opset = opset_version(model)
    nodes = list(graph.node)
    fused_any = False
    consumed: set[int] = set()  # a residual Add read by two Convs goes to the first one only
    for node in list(nodes):
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("Conv", "Gemm", "MatMul"):
            continue
        if shapes.elem_type(node.output[0]) != onnx.TensorProto.FLOAT:
            continue  # onnxruntime's fused kernels are float32 ones
        reader = only_reader(uses, outputs, node.output[0])
        if reader is None or reader.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "MatMul":
            fused, followers = _fused_matmul(node, reader, constants, shapes), [reader]
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
            nodes = splice(nodes, replaced, [fused])
            fused_any = True
    set_nodes(graph, nodes)
    if fused_any:
        ensure_opset(model, MS_DOMAIN, 1)
    return model


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
    if len(add.input) != 2 or len(z) != 1 or not shapes.same_shape(z[0], conv.output[0]):
        return None, []
    act = only_reader(uses, outputs, add.output[0])
    if act is None or act.domain not in ("", "ai.onnx"):
        return None, []
    params = _activation_params("Conv", act, constants, opset)
    if params is None:
        return None, []
    fused = _fused_with_activation(conv, act, params)
    inputs = list(conv.input) + [""] * (3 - len(conv.input))
    del fused.input[:]
    fused.input.extend(inputs[:3] + z)
    return fused, [add, act]


def _fused_with_activation(node, act, params):
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs["activation"] = act.op_type
    if node.op_type == "Conv":
        if params:
            attrs["activation_params"] = [float(p) for p in params]
        op_type = "FusedConv"
    else:
        for name, value in zip(("activation_alpha", "activation_beta"), params):
            attrs[name] = float(value)
        op_type = "FusedGemm"
    return helper.make_node(op_type, list(node.input), [act.output[0]],
                            name=node.name or act.name, domain=MS_DOMAIN, **attrs)


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
