"""Gate and up as the halves of one projection: a SiluMul (silu_mlp_fusion) whose gate and up
are the first and second half of one tensor's last axis, cut by two Slices or one Split (the
Phi-3 MLP's fused gate_up projection, as dynamo and TorchScript write `chunk`), reads that
tensor itself:

    gate, up = x[..., :h], x[..., h:]    y = SiluMul(gate, up)
        ->  y = onnx_parity.fused::SiluMulHalves(x)

so the CPU provider's kernel reads both halves where the projection wrote them (rows 2h apart)
instead of copying each out first.  SiluMulHalves is a model-local function (Split, then
SiluMul's body), so the rewritten model stays valid ONNX.  x's last axis must have a known
even length 2h, and the cut's outputs must be read by that SiluMul alone and be no graph
outputs; anything else stays as it is.
"""
from __future__ import annotations

import onnx
from onnx import helper

from ._graph import (
    FUSED_DOMAIN,
    Constants,
    Shapes,
    Splices,
    add_fused_functions,
    attr,
    consumers,
    copy_model,
    graph_output_names,
    opset_version,
    private_values,
    producers,
    set_nodes,
)
from .silu_mlp_fusion import SILU_MUL

SILU_MUL_HALVES = "SiluMulHalves"
MIN_OPSET = 13  # Split takes its sizes as an input, Slice its bounds, and axes may be negative


def fuse_gate_up_halves(model: onnx.ModelProto) -> onnx.ModelProto:
    opset = opset_version(model)
    if opset < MIN_OPSET or not any(n.op_type == SILU_MUL and n.domain == FUSED_DOMAIN
                                    for n in model.graph.node):
        return model
    model = copy_model(model)
    graph = model.graph
    shapes, constants = Shapes(model), Constants(graph)
    uses, made_by, outputs = consumers(graph), producers(graph), graph_output_names(graph)
    nodes = Splices(graph.node)
    fused = 0
    for silu in list(graph.node):
        if silu.op_type != SILU_MUL or silu.domain != FUSED_DOMAIN or len(silu.input) != 2:
            continue
        match = _halves(silu, made_by, shapes, constants)
        if match is None:
            continue
        x, cut = match
        if not private_values(cut + [silu], set(silu.output), uses, outputs):
            continue
        new = helper.make_node(SILU_MUL_HALVES, [x], list(silu.output), domain=FUSED_DOMAIN,
                               name=silu.name)
        nodes.replace(cut + [silu], [new])
        fused += 1
    if not fused:
        return model
    set_nodes(graph, nodes.nodes())
    add_fused_functions(model, [SILU_MUL_HALVES], lambda _: silu_mul_halves_function(opset))
    return model


def silu_mul_halves_function(opset: int) -> onnx.FunctionProto:
    """SiluMulHalves(gate_up) = SiluMul of gate_up's two halves along its last axis."""
    split = (helper.make_node("Split", ["gate_up"], ["gate", "up"], axis=-1, num_outputs=2)
             if opset >= 18 else helper.make_node("Split", ["gate_up"], ["gate", "up"], axis=-1))
    body = [split,
            helper.make_node("Sigmoid", ["gate"], ["sigmoid"]),
            helper.make_node("Mul", ["gate", "sigmoid"], ["silu"]),
            helper.make_node("Mul", ["silu", "up"], ["y"])]
    return helper.make_function(FUSED_DOMAIN, SILU_MUL_HALVES, ["gate_up"], ["y"], body,
                                [helper.make_opsetid("", opset)])


def _halves(silu, made_by, shapes, constants):
    """(x, the cut's nodes) when SiluMul's gate and up are x's first and second half along its
    last axis, else None."""
    gate, up = silu.input
    first, second = made_by.get(gate), made_by.get(up)
    if first is None or second is None:
        return None
    x = first.input[0] if first.input else None
    shape = shapes.shape(x) if x else None
    if not shape or not isinstance(shape[-1], int) or shape[-1] % 2 or shape[-1] == 0:
        return None
    rank, width = len(shape), shape[-1]
    if first is second:
        return (x, [first]) if _splits_in_halves(first, gate, up, rank, width, constants) else None
    if (first.op_type == second.op_type == "Slice" and first.domain in ("", "ai.onnx")
            and second.domain in ("", "ai.onnx") and second.input[0] == x
            and _slice_of(first, rank, width, constants) == (0, width // 2)
            and _slice_of(second, rank, width, constants) == (width // 2, width)):
        return x, [first, second]
    return None


def _splits_in_halves(node, gate, up, rank, width, constants) -> bool:
    if node.op_type != "Split" or node.domain not in ("", "ai.onnx"):
        return False
    if list(node.output) != [gate, up] or attr(node, "axis", 0) not in (-1, rank - 1):
        return False
    if len(node.input) > 1 and node.input[1]:
        sizes = constants.get(node.input[1])
        return sizes is not None and [int(v) for v in sizes.reshape(-1)] == [width // 2] * 2
    return True  # no sizes: equal parts, one an output


def _slice_of(node, rank, width, constants):
    """[start, end) of a step-1 Slice over x's last axis alone, clamped as Slice clamps them,
    else None."""
    if len(node.input) < 4:
        return None
    values = [constants.get(n) if n else None for n in node.input[1:5]]
    starts, ends, axes = values[:3]
    steps = values[3] if len(node.input) > 4 and node.input[4] else None
    if starts is None or ends is None or axes is None or (
            len(node.input) > 4 and node.input[4] and steps is None):
        return None
    if not starts.size == ends.size == axes.size == 1 or int(axes.reshape(-1)[0]) not in (
            -1, rank - 1) or (steps is not None and steps.reshape(-1).tolist() != [1]):
        return None
    return tuple(_clamp(int(v.reshape(-1)[0]), width) for v in (starts, ends))


def _clamp(index: int, width: int) -> int:
    index = index + width if index < 0 else index
    return min(max(index, 0), width)
