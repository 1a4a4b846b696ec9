"""SiLU-gated MLP fusion: the product `silu(gate) * up` of Llama-, Qwen-, Mistral- and
Phi-3-style MLPs, as torch.onnx writes it (TorchScript and dynamo alike spell silu(g) as
`Mul(g, Sigmoid(g))`):

    s = Sigmoid(gate)    act = Mul(gate, s)    y = Mul(act, up)       (either operand order)

becomes one node `onnx_parity.fused::SiluMul(gate, up)`, a model-local function whose body is
those three nodes, so the rewritten model stays valid ONNX that any runtime can run, and the
CPU provider runs it as one C pass.  gate and up must have one known shape (no broadcast); the
Phi-3 form, where both are halves of one gate_up projection cut by Split or Slice, matches as
well.  A pattern whose Sigmoid or first product is read elsewhere, or is a graph output, stays.
"""
from __future__ import annotations

import onnx
from onnx import helper

from ._graph import (
    FUSED_DOMAIN,
    Shapes,
    Splices,
    add_fused_functions,
    consumers,
    copy_model,
    graph_output_names,
    opset_version,
    private_values,
    set_nodes,
)

SILU_MUL = "SiluMul"
FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
          onnx.TensorProto.DOUBLE)


def fuse_silu_mlp(model: onnx.ModelProto) -> onnx.ModelProto:
    opset = opset_version(model)
    if opset < 7:  # Mul takes its numpy broadcasting form (the function body's) from opset 7
        return model
    model = copy_model(model)
    graph = model.graph
    shapes, uses, outputs = Shapes(model), consumers(graph), graph_output_names(graph)
    nodes = Splices(graph.node)
    fused = 0
    for sigmoid in list(graph.node):
        if sigmoid.op_type != "Sigmoid" or sigmoid.domain not in ("", "ai.onnx"):
            continue
        match = _match(sigmoid, uses, outputs, shapes)
        if match is None:
            continue
        pattern, gate, up, y = match
        new = helper.make_node(SILU_MUL, [gate, up], [y], domain=FUSED_DOMAIN,
                               name=sigmoid.name or y)
        nodes.replace(pattern, [new])
        fused += 1
    if not fused:
        return model
    set_nodes(graph, nodes.nodes())
    add_fused_functions(model, [SILU_MUL], lambda _: silu_mul_function(opset))
    return model


def silu_mul_function(opset: int) -> onnx.FunctionProto:
    """SiluMul(gate, up) = gate * Sigmoid(gate) * up, in the model's ai.onnx opset."""
    body = [helper.make_node("Sigmoid", ["gate"], ["sigmoid"]),
            helper.make_node("Mul", ["gate", "sigmoid"], ["silu"]),
            helper.make_node("Mul", ["silu", "up"], ["y"])]
    return helper.make_function(FUSED_DOMAIN, SILU_MUL, ["gate", "up"], ["y"], body,
                                [helper.make_opsetid("", opset)])


def _only_reader(uses, outputs, name, op_type):
    readers = uses.get(name, [])
    if name in outputs or len(readers) != 1:
        return None
    node = readers[0]
    return node if node.op_type == op_type and node.domain in ("", "ai.onnx") else None


def _other(node, name):
    """The input of a two-input node that is not `name` (None if both or neither are)."""
    if len(node.input) != 2 or list(node.input).count(name) != 1:
        return None
    return node.input[1] if node.input[0] == name else node.input[0]


def _match(sigmoid, uses, outputs, shapes):
    gate = sigmoid.input[0]
    act = _only_reader(uses, outputs, sigmoid.output[0], "Mul")
    if act is None or _other(act, sigmoid.output[0]) != gate:
        return None
    product = _only_reader(uses, outputs, act.output[0], "Mul")
    up = _other(product, act.output[0]) if product is not None else None
    if up is None or not shapes.same_shape(gate, up) or shapes.elem_type(gate) not in FLOATS:
        return None
    pattern = [sigmoid, act, product]
    if not private_values(pattern, {product.output[0]}, uses, outputs):
        return None
    return pattern, gate, up, product.output[0]
