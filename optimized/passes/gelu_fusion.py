"""Gelu fusion for the decomposed forms exporters write:

    exact:  0.5 * x * (1 + Erf(x / sqrt(2)))                               -> com.microsoft Gelu
    tanh:   0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))       -> com.microsoft FastGelu

From opset 20 both become ai.onnx Gelu (approximate "none" / "tanh"). Every Mul and Add is
matched in either operand order; x / sqrt(2) also as x * (1 / sqrt(2)); x^3 as Pow(x, 3) or
Mul(x, Mul(x, x)) (TorchScript's tanh Gelu); the 0.5 on x, on the product, or on (1 + ...)
(onnxruntime's three erf patterns); the tanh argument also as BLOOM writes it,
0.79788456 * x * (1 + 0.044715 * x * x); constants also through Cast/CastLike (the dynamo
exporter). A pattern whose intermediate values are read outside it stays.
"""
from __future__ import annotations

import math

import onnx
from onnx import helper

from ._graph import (
    MS_DOMAIN,
    Constants,
    Splices,
    consumers,
    copy_model,
    ensure_opset,
    graph_output_names,
    is_close,
    opset_version,
    private_values,
    producers,
    reads_type_only,
    scalar_through_cast,
    set_nodes,
)


def fuse_gelu(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    constants = Constants(graph)
    ctx = _Context(consumers(graph), graph_output_names(graph), producers(graph), constants)
    opset = opset_version(model)
    nodes = Splices(graph.node)
    used_ms = False
    for node in list(graph.node):
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("Erf", "Tanh"):
            continue
        if node.op_type == "Erf":
            match = _match_erf(node, ctx)
        else:
            match = _match_tanh(node, ctx) or _match_tanh_factored(node, ctx)
        if match is None or not private_values(match[0], {match[2]}, ctx.uses, ctx.outputs):
            continue
        pattern, x, y = match
        name = node.name or y
        if opset >= 20:
            approximate = "none" if node.op_type == "Erf" else "tanh"
            fused = helper.make_node("Gelu", [x], [y], name=name, approximate=approximate)
        else:
            op_type = "Gelu" if node.op_type == "Erf" else "FastGelu"
            fused = helper.make_node(op_type, [x], [y], name=name, domain=MS_DOMAIN)
            used_ms = True
        nodes.replace(pattern, [fused])
    set_nodes(graph, nodes.nodes())
    if used_ms:
        ensure_opset(model, MS_DOMAIN, 1)
    return model


class _Context:
    def __init__(self, uses, outputs, made_by, constants):
        self.uses, self.outputs, self.made_by, self.constants = uses, outputs, made_by, constants

    def reader(self, node, op_type):
        """The only reader of node's output (CastLike reading its type aside), if it is an
        ai.onnx `op_type`."""
        name = node.output[0]
        readers = [r for r in self.uses.get(name, []) if not reads_type_only(r, name)]
        if name in self.outputs or len(readers) != 1:
            return None
        r = readers[0]
        return r if r.op_type == op_type and r.domain in ("", "ai.onnx") else None

    def scalar(self, name):
        return scalar_through_cast(self.constants, self.made_by, name)

    def producer(self, name, op_type):
        p = self.made_by.get(name)
        return p if p is not None and p.op_type == op_type and p.domain in ("", "ai.onnx") else None

    def split_constant(self, node, value):
        """For a binary node with one constant input close to `value`: the other input."""
        if node is None or len(node.input) != 2:
            return None
        for i in (0, 1):
            if is_close(self.scalar(node.input[i]), value, rel=1e-3):
                return node.input[1 - i]
        return None


def _match_erf(erf, ctx):
    scaled = ctx.made_by.get(erf.input[0])
    if scaled is None or ctx.reader(scaled, "Erf") is not erf:
        return None
    if scaled.op_type == "Div" and is_close(ctx.scalar(scaled.input[1]), math.sqrt(2.0)):
        x = scaled.input[0]
    elif scaled.op_type == "Mul":
        x = ctx.split_constant(scaled, 1.0 / math.sqrt(2.0))
    else:
        return None
    return _tail(x, [scaled, erf], ctx) if x else None


def _match_tanh(tanh, ctx):
    scaled = ctx.producer(tanh.input[0], "Mul")
    if scaled is None or ctx.reader(scaled, "Tanh") is not tanh:
        return None
    inner = ctx.producer(ctx.split_constant(scaled, math.sqrt(2.0 / math.pi)) or "", "Add")
    if inner is None or ctx.reader(inner, "Mul") is not scaled:
        return None
    for x, cubic_term in (list(inner.input), list(inner.input)[::-1]):
        cubic_scaled = ctx.producer(cubic_term, "Mul")
        cube = _cube(ctx.split_constant(cubic_scaled, 0.044715) or "", x, ctx)
        if cube is None or ctx.reader(cube[-1], "Mul") is not cubic_scaled or ctx.reader(
                cubic_scaled, "Add") is not inner:
            continue
        return _tail(x, cube + [cubic_scaled, inner, scaled, tanh], ctx)
    return None


def _match_tanh_factored(tanh, ctx):
    """BLOOM's and Megatron's form of the same: tanh(0.79788456 * x * (1 + 0.044715 * x * x))."""
    outer = ctx.producer(tanh.input[0], "Mul")
    if outer is None or ctx.reader(outer, "Tanh") is not tanh:
        return None
    for first, second in (list(outer.input), list(outer.input)[::-1]):
        scaled_x = ctx.producer(first, "Mul")
        x = ctx.split_constant(scaled_x, math.sqrt(2.0 / math.pi)) if scaled_x else None
        one_plus = ctx.producer(second, "Add")
        if x is None or one_plus is None or ctx.reader(scaled_x, "Mul") is not outer or (
                ctx.reader(one_plus, "Mul") is not outer):
            continue
        square = _scaled_square(ctx.split_constant(one_plus, 1.0) or "", x, ctx)
        if square is None or ctx.reader(square[-1], "Add") is not one_plus:
            continue
        return _tail(x, square + [scaled_x, one_plus, outer, tanh], ctx)
    return None


def _scaled_square(name, x, ctx):
    """The two Muls making `name` = 0.044715 * x * x, in any order and grouping."""
    top = ctx.producer(name, "Mul")
    if top is None:
        return None
    for a, b in (list(top.input), list(top.input)[::-1]):
        inner = ctx.producer(a, "Mul")
        if inner is None or ctx.reader(inner, "Mul") is not top:
            continue
        if b == x and ctx.split_constant(inner, 0.044715) == x:  # (k * x) * x
            return [inner, top]
        if list(inner.input) == [x, x] and is_close(ctx.scalar(b), 0.044715):  # k * (x * x)
            return [inner, top]
    return None


def _cube(name, x, ctx):
    """The nodes making `name` = x^3: Pow(x, 3), or Mul(x, Mul(x, x)) in either order."""
    pow_node = ctx.producer(name, "Pow")
    if pow_node is not None:
        if pow_node.input[0] == x and ctx.scalar(pow_node.input[1]) == 3.0:
            return [pow_node]
        return None
    outer = ctx.producer(name, "Mul")
    if outer is None or x not in outer.input:
        return None
    square = ctx.producer(outer.input[1] if outer.input[0] == x else outer.input[0], "Mul")
    if square is None or list(square.input) != [x, x] or ctx.reader(square, "Mul") is not outer:
        return None
    return [square, outer]


def _tail(x, pattern, ctx):
    """Match `0.5 * x * (1 + pattern)` after the Erf/Tanh: (all nodes, x, output name)."""
    plus_one = ctx.reader(pattern[-1], "Add")
    if plus_one is None or ctx.split_constant(plus_one, 1.0) != pattern[-1].output[0]:
        return None
    product = ctx.reader(plus_one, "Mul")
    if product is None:
        return None
    other = product.input[1] if product.input[0] == plus_one.output[0] else product.input[0]
    if other == x:  # (x * (1 + ...)) * 0.5
        half = ctx.reader(product, "Mul")
        if half is None or ctx.split_constant(half, 0.5) != product.output[0]:
            return None
        return pattern + [plus_one, product, half], x, half.output[0]
    if ctx.split_constant(product, 0.5) == plus_one.output[0]:  # x * ((1 + ...) * 0.5)
        outer = ctx.reader(product, "Mul")
        if outer is None or sorted(outer.input) != sorted([x, product.output[0]]):
            return None
        return pattern + [plus_one, product, outer], x, outer.output[0]
    half = ctx.producer(other, "Mul")  # (x * 0.5) * (1 + ...)
    if half is None or ctx.split_constant(half, 0.5) != x or ctx.reader(half, "Mul") is not product:
        return None
    return [half] + pattern + [plus_one, product], x, product.output[0]
