"""RMSNorm fusion for the decomposed forms exporters write for Llama-, Qwen-, Mistral- and
Phi-3-style models:

    [xf = Cast(x, to=float)]                   torch's x.float() / .to(torch.float32)
    ms  = ReduceMean(Pow(xf, 2) | Mul(xf, xf)) over the last axes, keepdims (axes as attribute
                                               or, from opset 18, as input)
    std = Sqrt(Add(ms, eps))
    normed = Mul(xf, Reciprocal(std)) | Mul(xf, Div(1, std)) | Div(xf, std)
    y = [Cast back to x's type] [Mul(weight)] [Cast back]

Multiplications and additions are matched in either operand order, constants also through
Cast/CastLike (the dynamo exporter writes CastLike(constant, x)).

The fused node is ai.onnx RMSNormalization from opset 23, else ai.onnx
SimplifiedLayerNormalization as onnxruntime's optimizer writes it (onnxruntime and the
reference register it in that domain; onnx's checker does not know it).  When x is a residual
Add of two tensors of one 3-D shape, the Add goes into com.microsoft
SkipSimplifiedLayerNormalization instead, whose fourth output is the sum for the readers that
still need it.  A pattern any of whose intermediate values is read outside it, or is a graph
output, stays as it is.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper

from ._graph import (
    MS_DOMAIN,
    Constants,
    Shapes,
    add_initializer,
    attr,
    consumers,
    copy_model,
    ensure_opset,
    graph_output_names,
    only_reader,
    opset_version,
    private_values,
    producers,
    scalar_through_cast,
    set_nodes,
    splice,
)

FLOAT = onnx.TensorProto.FLOAT


class RmsNorm(NamedTuple):
    nodes: list       # every node the fused one replaces
    x: str            # the normalized input (before any cast up to float32)
    scale: object     # constant name, or numpy array (a new constant)
    epsilon: float
    axis: int
    y: str


def fuse_rms_norm(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    view = _View(model)
    nodes = list(graph.node)
    used_ms = False
    fused: set[int] = set()
    for mean in list(graph.node):
        if mean.op_type != "ReduceMean" or mean.domain not in ("", "ai.onnx"):
            continue
        match = _match(mean, view)
        if match is None or any(id(n) in fused for n in match.nodes):
            continue
        pattern = list(match.nodes)
        scale = match.scale if isinstance(match.scale, str) else add_initializer(
            graph, "rms_norm_scale", match.scale)
        skip = _skip_sum(view.made_by.get(match.x), view, match.axis)
        if skip is not None and id(skip) not in fused and not _read_early(
                nodes, view.uses.get(match.x, []), pattern):
            new = _skip_node(skip, match, scale, view)
            pattern.append(skip)
            used_ms = True
        elif view.opset >= 23:
            new = helper.make_node("RMSNormalization", [match.x, scale], [match.y],
                                   name=mean.name or match.y, axis=match.axis,
                                   epsilon=match.epsilon)
        else:
            new = helper.make_node("SimplifiedLayerNormalization", [match.x, scale], [match.y],
                                   name=mean.name or match.y, axis=match.axis,
                                   epsilon=match.epsilon)
        fused.update(id(n) for n in pattern)
        nodes = splice(nodes, pattern, [new])
    set_nodes(graph, nodes)
    if used_ms:
        ensure_opset(model, MS_DOMAIN, 1)
    return model


class _View:
    """What the matcher reads of the graph, computed once per pass."""

    def __init__(self, model):
        graph = model.graph
        self.shapes, self.constants = Shapes(model), Constants(graph)
        self.uses, self.outputs = consumers(graph), graph_output_names(graph)
        self.made_by = producers(graph)
        self.opset = opset_version(model)

    def only(self, name, *op_types):
        """The one reader of `name`, if it is an ai.onnx node of one of `op_types`."""
        r = only_reader(self.uses, self.outputs, name)
        return r if r is not None and r.op_type in op_types and r.domain in ("", "ai.onnx") else None

    def scalar(self, name):
        return scalar_through_cast(self.constants, self.made_by, name) if name else None


def _other(node, name):
    """The input of a two-input node that is not `name` (None if both or neither are)."""
    if len(node.input) != 2 or list(node.input).count(name) != 1:
        return None
    return node.input[1] if node.input[0] == name else node.input[0]


def _match(mean, view):
    square = view.made_by.get(mean.input[0])
    xf = _squared(square, view)
    if xf is None or view.only(square.output[0], "ReduceMean") is not mean:
        return None
    rank = view.shapes.rank(xf)
    axes = _trailing_axes(mean, view, rank)
    if axes is None:
        return None
    normalized = view.shapes.shape(xf)[axes[0]:]
    if not all(isinstance(n, int) and n > 0 for n in normalized):
        return None
    add_eps, cast_like = _add_epsilon(mean.output[0], view)
    eps = view.scalar(_other(add_eps, mean.output[0])) if add_eps is not None else None
    sqrt = view.only(add_eps.output[0], "Sqrt") if eps is not None and eps >= 0 else None
    if sqrt is None:
        return None
    steps = _divided(xf, sqrt, view)
    if steps is None:
        return None
    nodes = [square, mean] + cast_like + [add_eps, sqrt] + steps
    x, cast_up = xf, _cast_up(xf, view)
    if cast_up is not None:
        nodes, x = [cast_up] + nodes, cast_up.input[0]
    tail, weight, y = _tail(steps[-1].output[0], view, view.shapes.elem_type(x),
                            cast_up is not None)
    if tail is None:
        return None
    nodes += tail
    if not private_values(nodes, {y}, view.uses, view.outputs):
        return None
    scale = _scale(weight, view, view.shapes.elem_type(x), normalized)
    if scale is None:
        return None
    return RmsNorm(nodes, x, scale, eps, axes[0], y)


def _squared(node, view):
    """x of Pow(x, 2) or Mul(x, x), else None."""
    if node is None or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    if node.op_type == "Pow" and view.scalar(node.input[1]) == 2.0:
        return node.input[0]
    if node.op_type == "Mul" and node.input[0] == node.input[1]:
        return node.input[0]
    return None


def _add_epsilon(ms, view):
    """(the Add of epsilon to ms, [the CastLike(eps, ms) giving the literal ms's type] or []):
    the dynamo exporter's CastLike reads ms too, for its type only."""
    readers = view.uses.get(ms, [])
    if ms in view.outputs or not 1 <= len(readers) <= 2:
        return None, []
    add = next((n for n in readers if n.op_type == "Add" and n.domain in ("", "ai.onnx")), None)
    if add is None:
        return None, []
    others = [n for n in readers if n is not add]
    if not others:
        return add, []
    cast_like = others[0]
    if (cast_like.op_type != "CastLike" or cast_like.domain not in ("", "ai.onnx")
            or list(cast_like.input) != [cast_like.input[0], ms]
            or view.only(cast_like.output[0], "Add") is not add):
        return None, []
    return add, [cast_like]


def _trailing_axes(node, view, rank):
    """The reduced axes of a keepdims ReduceMean, when they are the trailing ones, else None."""
    if rank is None or attr(node, "keepdims", 1) != 1:
        return None
    if view.opset >= 18:
        if len(node.input) < 2 or not node.input[1]:
            return None  # no axes: all of them, or none with noop_with_empty_axes
        value = view.constants.get(node.input[1])
        axes = None if value is None else [int(a) for a in value.reshape(-1)]
    else:
        axes = attr(node, "axes")
    if not axes:
        return None
    axes = sorted(a + rank if a < 0 else a for a in axes)
    return axes if axes == list(range(axes[0], rank)) else None


def _divided(xf, sqrt, view):
    """The nodes making xf / std: Div(xf, std), or Mul(xf, Reciprocal(std) | Div(1, std))."""
    std = sqrt.output[0]
    node = view.only(std, "Div", "Reciprocal")
    if node is None:
        return None
    if node.op_type == "Div" and list(node.input) == [xf, std]:
        return [node]
    is_inverse = node.op_type == "Reciprocal" or (
        node.input[1] == std and view.scalar(node.input[0]) == 1.0)
    mul = view.only(node.output[0], "Mul") if is_inverse else None
    if mul is None or _other(mul, node.output[0]) != xf:
        return None
    return [node, mul]


def _cast_up(xf, view):
    """The Cast(to=float) that made xf from a float tensor, else None."""
    node = view.made_by.get(xf)
    if node is None or node.op_type != "Cast" or node.domain not in ("", "ai.onnx") or (
            attr(node, "to") != FLOAT):
        return None
    source = view.shapes.elem_type(node.input[0])
    if source not in (FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
        return None
    return node


def _tail(normed, view, x_type, cast_up):
    """(nodes, weight name or None, output) for `normed [Cast] [* weight] [Cast]`, where a Cast
    must take the float32 result back to x's type; None for nodes when the output's type would
    not be x's."""
    nodes, weight, last, cast_back = [], None, normed, False
    for op_type in ("Cast", "Mul", "Cast"):
        node = view.only(last, op_type)
        if node is None:
            continue
        if op_type == "Cast":
            if not cast_up or cast_back or attr(node, "to") != x_type:
                continue
            cast_back = True
        else:
            other = _other(node, last)
            if other is None or (other not in view.constants and view.scalar(other) is None):
                continue
            weight = other
        nodes.append(node)
        last = node.output[0]
    if cast_up and x_type != FLOAT and not cast_back:
        return None, None, None
    return nodes, weight, last


def _scale(weight, view, x_type, normalized):
    """The scale input: the weight constant's name when it fits as is, else a new array of
    x's type and the normalized shape (ones without a weight); None if it does not fit."""
    if x_type is None:
        return None
    np_dtype = helper.tensor_dtype_to_np_dtype(x_type)
    if weight is None:
        return np.ones(normalized, np_dtype)
    value = view.constants.get(weight)
    if value is None:  # a scalar through Cast/CastLike
        value = np.asarray(view.scalar(weight), np_dtype)
    if value.dtype.kind != "f":
        return None
    if value.size == 1:
        fitted = np.full(normalized, value.reshape(-1)[0], value.dtype)
    else:
        shape = list(value.shape)
        while len(shape) > len(normalized) and shape[0] == 1:
            shape.pop(0)
        if shape != list(normalized):
            return None
        fitted = value.reshape(shape)
    if fitted.dtype == np_dtype and fitted.shape == value.shape and weight in view.constants:
        return weight
    return np.ascontiguousarray(fitted.astype(np_dtype))


def _skip_sum(add, view, axis):
    """The residual Add feeding the pattern, when SkipSimplifiedLayerNormalization can take it."""
    if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx"):
        return None
    a, b = add.input
    rank = view.shapes.rank(a)
    if rank != 3 or axis != 2 or not view.shapes.same_shape(a, b):
        return None
    return add


def _read_early(nodes, readers, pattern) -> bool:
    """Some reader outside the pattern runs before the pattern's end, where the fused node goes."""
    position = {id(n): i for i, n in enumerate(nodes)}
    end = max(position[id(n)] for n in pattern)
    inside = {id(n) for n in pattern}
    # a reader no longer in the list was fused into a node that may sit anywhere: count it early
    return any(position.get(id(r), -1) < end for r in readers if id(r) not in inside)


def _skip_node(add, match, scale, view):
    """The SkipSimplifiedLayerNormalization node that absorbs the residual Add."""
    total = add.output[0]
    inside = {id(n) for n in match.nodes}
    readers = [n for n in view.uses.get(total, []) if id(n) not in inside]
    sum_output = total if readers or total in view.outputs else ""
    outputs = [match.y] + (["", "", sum_output] if sum_output else [])
    return helper.make_node("SkipSimplifiedLayerNormalization",
                            [add.input[0], add.input[1], scale], outputs, domain=MS_DOMAIN,
                            name=match.nodes[0].name or match.y, epsilon=match.epsilon)
