"""LayerNormalization fusion for the decomposed form exporters write:

    mean = ReduceMean(x)            d = Sub(x, mean)
    var  = ReduceMean(Pow(d, 2))    y = Div(d, Sqrt(Add(var, eps))) * gamma + beta

becomes ai.onnx LayerNormalization-17 when the model imports opset 17 or later. Earlier opsets
have no such op; there, when x is the residual sum Add(a, b) of two 3-D tensors, the whole
becomes com.microsoft SkipLayerNormalization (whose fourth output is that sum), as onnxruntime
writes it, and otherwise the pattern stays.
"""
from __future__ import annotations

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
    producers,
    scalar,
    set_nodes,
    splice,
)


def fuse_layer_norm(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    shapes, constants = Shapes(model), Constants(graph)
    uses, outputs, made_by = consumers(graph), graph_output_names(graph), producers(graph)
    opset = opset_version(model)
    nodes = list(graph.node)
    used_ms = False
    absorbed: set[int] = set()  # residual Adds already inside a SkipLayerNormalization
    for mean in list(nodes):
        if mean.op_type != "ReduceMean" or mean.domain not in ("", "ai.onnx"):
            continue
        match = _match(mean, uses, outputs, constants, shapes, opset)
        if match is None:
            continue
        pattern, x, gamma, beta, eps, axis = match
        if opset >= 17:
            new = [helper.make_node("LayerNormalization", [x, gamma, beta], [pattern[-1].output[0]],
                                    name=mean.name or pattern[-1].name, axis=axis, epsilon=eps)]
        else:
            skip = _skip_sum(made_by.get(x), shapes, axis)
            if skip is None or id(skip) in absorbed or _read_early(nodes, uses.get(x, []),
                                                                   pattern):
                continue
            absorbed.add(id(skip))
            new, old_sum = _skip_layer_norm(skip, pattern, gamma, beta, eps, uses, outputs)
            pattern = pattern + old_sum
            used_ms = True
        nodes = splice(nodes, pattern, new)
    set_nodes(graph, nodes)
    if used_ms:
        ensure_opset(model, MS_DOMAIN, 1)
    return model


def _reader(uses, outputs, node, op_type):
    reader = only_reader(uses, outputs, node.output[0])
    if reader is None or reader.op_type != op_type or reader.domain not in ("", "ai.onnx"):
        return None
    return reader


def _other(node, name):
    """The input of a two-input node that is not `name` (None if both or neither are)."""
    if len(node.input) != 2 or list(node.input).count(name) != 1:
        return None
    return node.input[1] if node.input[0] == name else node.input[0]


def _match(mean, uses, outputs, constants, shapes, opset):
    x = mean.input[0]
    axes = _axes(mean, constants, opset)
    rank = shapes.rank(x)
    if axes is None or rank is None or attr(mean, "keepdims", 1) != 1:
        return None
    axes = sorted(a + rank if a < 0 else a for a in axes)
    if axes != list(range(axes[0], rank)):
        return None  # LayerNormalization normalizes over trailing axes only
    sub = _reader(uses, outputs, mean, "Sub")
    if sub is None or list(sub.input) != [x, mean.output[0]]:
        return None
    readers = uses.get(sub.output[0], [])
    if sub.output[0] in outputs or len(readers) != 2:
        return None
    square = next((n for n in readers if n.op_type == "Pow"), None)
    div = next((n for n in readers if n.op_type == "Div"), None)
    if square is None or div is None or square.input[0] != sub.output[0] or (
            scalar(constants, square.input[1]) != 2.0) or div.input[0] != sub.output[0]:
        return None
    var = _reader(uses, outputs, square, "ReduceMean")
    if var is None or _axes(var, constants, opset) is None or attr(var, "keepdims", 1) != 1:
        return None
    if sorted(a + rank if a < 0 else a for a in _axes(var, constants, opset)) != axes:
        return None
    add_eps = _reader(uses, outputs, var, "Add")
    eps = scalar(constants, _other(add_eps, var.output[0])) if add_eps else None
    sqrt = _reader(uses, outputs, add_eps, "Sqrt") if eps is not None else None
    if sqrt is None or _reader(uses, outputs, sqrt, "Div") is not div or div.input[1] != (
            sqrt.output[0]):
        return None
    mul = _reader(uses, outputs, div, "Mul")
    add = _reader(uses, outputs, mul, "Add") if mul is not None else None
    if add is None:
        return None
    normalized = shapes.shape(x)[axes[0]:]  # leading axes may be symbolic, these may not
    if not all(isinstance(d, int) for d in normalized):
        return None
    gamma = _affine(constants, _other(mul, div.output[0]), normalized)
    beta = _affine(constants, _other(add, mul.output[0]), normalized)
    if gamma is None or beta is None or gamma.dtype != beta.dtype:
        return None
    if shapes.elem_type(x) != onnx.helper.np_dtype_to_tensor_dtype(gamma.dtype):
        return None
    pattern = [mean, sub, square, var, add_eps, sqrt, div, mul, add]
    names = (_other(mul, div.output[0]), _other(add, mul.output[0]))
    return pattern, x, names[0], names[1], eps, axes[0]


def _axes(node, constants, opset):
    if opset >= 18:
        if len(node.input) < 2 or not node.input[1]:
            return None  # no axes: all of them, or none with noop_with_empty_axes
        value = constants.get(node.input[1])
        return None if value is None else [int(a) for a in value.reshape(-1)]
    axes = attr(node, "axes")
    return None if axes is None else list(axes)


def _affine(constants, name, normalized):
    """A constant scale/bias with exactly the normalized shape (leading 1s dropped)."""
    value = constants.get(name) if name else None
    if value is None or normalized is None or value.dtype.kind != "f":
        return None
    shape = list(value.shape)
    while len(shape) > len(normalized) and shape[0] == 1:
        shape.pop(0)
    return value if shape == normalized else None


def _skip_sum(add, shapes, axis):
    """The residual Add feeding the pattern, when SkipLayerNormalization can take its place."""
    if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx") or axis != 2:
        return None
    a, b = add.input
    if shapes.rank(a) != 3 or not shapes.same_shape(a, b):
        return None
    return add


def _read_early(nodes, readers, pattern) -> bool:
    """Some reader outside the pattern runs before the pattern's end, where the fused node goes."""
    position = {id(n): i for i, n in enumerate(nodes)}
    end = max(position[id(n)] for n in pattern)
    inside = {id(n) for n in pattern}
    # a reader no longer in the list was fused into a node that may sit anywhere: count it early
    return any(position.get(id(r), -1) < end for r in readers if id(r) not in inside)


def _skip_layer_norm(add, pattern, gamma, beta, eps, uses, outputs):
    """The SkipLayerNormalization node, and the Add it absorbs."""
    total = add.output[0]
    readers = [n for n in uses.get(total, []) if n is not pattern[0] and n is not pattern[1]]
    sum_output = total if readers or total in outputs else ""
    node = helper.make_node("SkipLayerNormalization", [add.input[0], add.input[1], gamma, beta],
                            [pattern[-1].output[0], "", "", sum_output], domain=MS_DOMAIN,
                            name=pattern[0].name or pattern[-1].name, epsilon=eps)
    return [node], [add]
