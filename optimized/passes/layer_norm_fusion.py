"""LayerNormalization fusion for the decomposed forms exporters write. All start alike:

    mean = ReduceMean(x)    d = Sub(x, mean)    var = ReduceMean(Pow(d, 2) | Mul(d, d))
    std  = Sqrt(Add(var, eps))

and end in one of two ways:

    torch.onnx (TorchScript below opset 17, dynamo, hand-written modules):
        normed = Div(d, std) | Mul(d, Reciprocal(std))      y = normed [* gamma] [+ beta]
    tf2onnx / keras2onnx (tf.nn.moments + tf.nn.batch_normalization):
        inv = Reciprocal(std) [* gamma]                    y = x * inv + (beta - mean * inv)
                                                             (or + Neg(mean * inv) without beta)

Multiplications and additions are matched in either operand order, constants also when they
come through Cast/CastLike. A float16/bfloat16 x cast up to float32 before the pattern and
cast back after it fuses with the casts, for LayerNormalization computes in float32 itself.

The result is ai.onnx LayerNormalization-17 when the model imports opset 17 or later. Earlier
opsets have no such op in onnx: there, when x is the residual sum Add(a, b) of two 3-D
tensors, the whole becomes com.microsoft SkipLayerNormalization (whose fourth output is that
sum), and otherwise ai.onnx LayerNormalization as onnxruntime's optimizer writes it (onnxruntime
and the reference register it from version 1; onnx's checker does not know it there).
A pattern any of whose intermediate values is read outside it, or is a graph output, stays.
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
    opset_version,
    private_values,
    producers,
    reads_type_only,
    scalar_through_cast,
    set_nodes,
    splice,
)

LOW_PRECISION = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


class LayerNorm(NamedTuple):
    nodes: list       # every node the fused one replaces
    x: str            # the normalized input (before any cast up to float32)
    scale: object     # constant name or numpy array (a new constant; ones when absent)
    bias: object      # constant name or numpy array, or None
    epsilon: float
    axis: int
    y: str


def fuse_layer_norm(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    view = _View(model)
    nodes = list(graph.node)
    used_ms = False
    absorbed: set[int] = set()  # residual Adds already inside a SkipLayerNormalization
    fused: set[int] = set()
    for mean in list(nodes):
        if mean.op_type != "ReduceMean" or mean.domain not in ("", "ai.onnx"):
            continue
        match = _match(mean, view)
        if match is None or any(id(n) in fused for n in match.nodes):
            continue
        pattern = list(match.nodes)
        scale = _constant_name(graph, match.scale, "layer_norm_scale")
        bias = _constant_name(graph, match.bias, "layer_norm_bias")
        skip = None if view.opset >= 17 else _skip_sum(view.made_by.get(match.x), view,
                                                      match.axis)
        if skip is not None and id(skip) not in absorbed and not _read_early(
                nodes, view.uses.get(match.x, []), pattern):
            absorbed.add(id(skip))
            new = _skip_layer_norm(skip, match, scale, bias, view)
            pattern.append(skip)
            used_ms = True
        else:
            inputs = [match.x, scale] + ([bias] if bias else [])
            new = helper.make_node("LayerNormalization", inputs, [match.y],
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

    def readers(self, name, op_type):
        return [n for n in self.uses.get(name, [])
                if n.op_type == op_type and n.domain in ("", "ai.onnx")]

    def only(self, name, op_type):
        """The one reader of `name` (CastLike reading its type aside), if it is an ai.onnx
        `op_type`."""
        readers = [r for r in self.uses.get(name, []) if not reads_type_only(r, name)]
        if name in self.outputs or len(readers) != 1:
            return None
        r = readers[0]
        return r if r.op_type == op_type and r.domain in ("", "ai.onnx") else None

    def type_readers(self, nodes):
        """The CastLike nodes that take the type of a value `nodes` make."""
        made = {o for n in nodes for o in n.output}
        return [r for name in made for r in self.uses.get(name, []) if reads_type_only(r, name)]

    def scalar(self, name):
        return scalar_through_cast(self.constants, self.made_by, name) if name else None


def _other(node, name):
    """The input of a two-input node that is not `name` (None if both or neither are)."""
    if len(node.input) != 2 or list(node.input).count(name) != 1:
        return None
    return node.input[1] if node.input[0] == name else node.input[0]


def _match(mean, view):
    x = mean.input[0]
    axes = _trailing_axes(mean, view, view.shapes.rank(x))
    if axes is None:
        return None
    sub = next((n for n in view.readers(mean.output[0], "Sub")
                if list(n.input) == [x, mean.output[0]]), None)
    if sub is None:
        return None
    d = sub.output[0]
    square = _square(d, view)
    var = view.only(square.output[0], "ReduceMean") if square is not None else None
    if var is None or _trailing_axes(var, view, view.shapes.rank(x)) != axes:
        return None
    add_eps = view.only(var.output[0], "Add")
    eps = view.scalar(_other(add_eps, var.output[0])) if add_eps is not None else None
    sqrt = view.only(add_eps.output[0], "Sqrt") if eps is not None and eps >= 0 else None
    if sqrt is None:
        return None
    normalized = view.shapes.shape(x)[axes[0]:]  # leading axes may be symbolic, these may not
    if not all(isinstance(n, int) for n in normalized):
        return None
    core = [mean, sub, square, var, add_eps, sqrt]
    tail = _divided(d, sqrt, view, _low_precision_source(x, view)) or _moments_tail(
        x, mean, sqrt, view)
    if tail is None:
        return None
    tail_nodes, scale, bias, y = tail
    return _finish(core + tail_nodes, x, scale, bias, eps, axes[0], y, view, normalized)


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


def _square(d, view):
    """The node squaring `d`: Pow(d, 2) or Mul(d, d)."""
    for node in view.uses.get(d, []):
        if node.domain not in ("", "ai.onnx") or len(node.input) != 2 or node.input[0] != d:
            continue
        if node.op_type == "Pow" and view.scalar(node.input[1]) == 2.0:
            return node
        if node.op_type == "Mul" and node.input[1] == d:
            return node
    return None


def _inverse(sqrt, view):
    """The node making 1 / std: Reciprocal(std) or Div(1, std)."""
    for node in view.uses.get(sqrt.output[0], []):
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "Reciprocal":
            return node
        if node.op_type == "Div" and node.input[1] == sqrt.output[0] and (
                view.scalar(node.input[0]) == 1.0):
            return node
    return None


def _divided(d, sqrt, view, low):
    """torch's ending: d / std (or d * (1 / std)), then the optional scale and shift."""
    div = next((n for n in view.readers(sqrt.output[0], "Div") if list(n.input) == [
        d, sqrt.output[0]]), None)
    if div is not None:
        steps = [div]
    else:
        inverse = _inverse(sqrt, view)
        mul = view.only(inverse.output[0], "Mul") if inverse is not None else None
        if mul is None or _other(mul, inverse.output[0]) != d:
            return None
        steps = [inverse, mul]
    nodes, scale, bias, y = _affine_tail(steps[-1].output[0], view, low)
    return steps + nodes, scale, bias, y


def _affine_tail(normed, view, low):
    """(nodes, scale, bias, output) for `normed [* scale] [+ bias]`; when x was cast up from
    the `low` precision type, with one Cast back to it before or after them. Scale and bias
    are constant names (their shapes checked by _finish) or None."""
    nodes, scale, bias, last = [], None, None, normed
    for op_type in ("Cast", "Mul", "Add", "Cast"):
        node = view.only(last, op_type)
        if node is None:
            continue
        if op_type == "Cast":
            if low is None or attr(node, "to") != low or any(n.op_type == "Cast" for n in nodes):
                continue
        else:
            other = _other(node, last)
            if other is None or (other not in view.constants and view.scalar(other) is None):
                break
            scale, bias = (other, bias) if op_type == "Mul" else (scale, other)
        nodes.append(node)
        last = node.output[0]
    return nodes, scale, bias, last


def _moments_tail(x, mean, sqrt, view):
    """tf's ending: inv = 1 / std [* gamma], y = x * inv + (beta - mean * inv)."""
    inverse = _inverse(sqrt, view)
    if inverse is None:
        return None
    nodes, inv, scale = [inverse], inverse.output[0], None
    scaled = view.only(inv, "Mul")
    if scaled is not None and _other(scaled, inv) in view.constants:
        nodes.append(scaled)
        inv, scale = scaled.output[0], _other(scaled, inv)
    muls = view.readers(inv, "Mul")
    x_scaled = next((n for n in muls if _other(n, inv) == x), None)
    mean_scaled = next((n for n in muls if _other(n, inv) == mean.output[0]), None)
    if x_scaled is None or mean_scaled is None:
        return None
    shift, bias = view.only(mean_scaled.output[0], "Sub"), None
    if shift is not None and shift.input[1] == mean_scaled.output[0] and (
            shift.input[0] in view.constants):
        bias = shift.input[0]
    else:
        shift = view.only(mean_scaled.output[0], "Neg")
    add = view.only(x_scaled.output[0], "Add")
    if shift is None or add is None or _other(add, x_scaled.output[0]) != shift.output[0]:
        return None
    return nodes + [x_scaled, mean_scaled, shift, add], scale, bias, add.output[0]


def _finish(nodes, x, scale, bias, eps, axis, y, view, normalized):
    """The match, once its values are private and its constants fit the normalized shape."""
    cast_back = next((n for n in nodes if n.op_type == "Cast"), None)
    if cast_back is not None:  # the float32 copy of x goes with the pattern
        cast_up = view.made_by[x]
        nodes, x = [cast_up] + nodes, cast_up.input[0]
    nodes = nodes + [n for n in view.type_readers(nodes) if n not in nodes]
    if not private_values(nodes, {y}, view.uses, view.outputs):
        return None
    dtype = view.shapes.elem_type(x)
    if dtype is None:
        return None
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    values = []
    for name in (scale, bias):
        if name is None:
            values.append(None)
            continue
        value = view.constants.get(name)
        if value is None:  # a scalar through Cast/CastLike
            value = np.asarray(view.scalar(name), np_dtype)
        fitted = _fit(value, normalized)
        if fitted is None or fitted.dtype.kind != "f":
            return None
        as_is = fitted.dtype == np_dtype and fitted.shape == value.shape
        values.append(name if as_is else np.ascontiguousarray(fitted.astype(np_dtype)))
    scale = values[0] if values[0] is not None else np.ones(normalized, np_dtype)
    return LayerNorm(nodes, x, scale, values[1], eps, axis, y)


def _low_precision_source(x, view):
    """The float16/bfloat16 type x was cast up to float32 from, else None."""
    node = view.made_by.get(x)
    if node is None or node.op_type != "Cast" or node.domain not in ("", "ai.onnx") or (
            attr(node, "to") != onnx.TensorProto.FLOAT):
        return None
    low = view.shapes.elem_type(node.input[0])
    return low if low in LOW_PRECISION else None


def _fit(value, normalized):
    """`value` as an array of exactly the normalized shape (a scalar is broadcast to it,
    leading 1s dropped), else None."""
    if value is None:
        return None
    if value.size == 1:
        return np.full(normalized, value.reshape(-1)[0], value.dtype)
    shape = list(value.shape)
    while len(shape) > len(normalized) and shape[0] == 1:
        shape.pop(0)
    return value.reshape(shape) if shape == list(normalized) else None


def _constant_name(graph, value, stem):
    if value is None or isinstance(value, str):
        return value
    return add_initializer(graph, stem, value)


def _skip_sum(add, view, axis):
    """The residual Add feeding the pattern, when SkipLayerNormalization can take its place."""
    if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx") or axis != 2:
        return None
    a, b = add.input
    if view.shapes.rank(a) != 3 or not view.shapes.same_shape(a, b):
        return None
    return add


def _read_early(nodes, readers, pattern) -> bool:
    """Some reader outside the pattern runs before the pattern's end, where the fused node goes."""
    position = {id(n): i for i, n in enumerate(nodes)}
    end = max(position[id(n)] for n in pattern)
    inside = {id(n) for n in pattern}
    # a reader no longer in the list was fused into a node that may sit anywhere: count it early
    return any(position.get(id(r), -1) < end for r in readers if id(r) not in inside)


def _skip_layer_norm(add, match, scale, bias, view):
    """The SkipLayerNormalization node that absorbs the residual Add."""
    total = add.output[0]
    inside = {id(n) for n in match.nodes}
    readers = [n for n in view.uses.get(total, []) if id(n) not in inside]
    sum_output = total if readers or total in view.outputs else ""
    inputs = [add.input[0], add.input[1], scale] + ([bias] if bias else [])
    return helper.make_node("SkipLayerNormalization", inputs, [match.y, "", "", sum_output],
                            domain=MS_DOMAIN, name=match.nodes[0].name or match.y,
                            epsilon=match.epsilon)
