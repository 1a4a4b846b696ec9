"""Rotary embedding fusion for the forms exporters write for Llama-, Qwen2-, Mistral- and
Phi-3-style attention (HF's apply_rotary_pos_emb, under torch.onnx's TorchScript and dynamo
exporters alike):

    rotate_half(x) = Concat(Neg(x2), x1, axis=-1)   x1, x2 the halves of the last axis, cut by
                                                     two Slices (x[..., :h], x[..., h:]) or one
                                                     Split
    y = Add(Mul(x, cos), Mul(rotate_half(x), sin))  (operands in either order)

becomes `onnx_parity.fused::Rotary(x, cos, sin)`; and the interleaved form (GPT-J's
rotate_every_two: x[..., 0::2] and x[..., 1::2] by Slices with step 2, stacked as
Concat(Unsqueeze(Neg(x2), -1), Unsqueeze(x1, -1), -1) and flattened back by Reshape) becomes
`onnx_parity.fused::RotaryInterleaved(x, cos, sin)`.  Both are model-local functions whose
bodies compute exactly the matched nodes (halves by an equal Split), so the rewritten model is
valid ONNX for any runtime; the CPU provider runs them as one pass (csrc/rotary.c).  x's last
axis must have a known even length, whose halves the Slices must cut exactly.  cos and sin stay
as the graph computes them (Cos/Sin of the angles, or caches gathered by position_ids).  A
pattern any of whose values is read elsewhere, or is a graph output, stays.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ._graph import (
    FUSED_DOMAIN,
    Constants,
    Shapes,
    add_fused_functions,
    attr,
    consumers,
    copy_model,
    graph_output_names,
    opset_version,
    private_values,
    producers,
    set_nodes,
    splice,
)

ROTARY = "Rotary"
ROTARY_INTERLEAVED = "RotaryInterleaved"
# an end at or past this is "to the end" (torch writes INT64_MAX, some tools INT32_MAX)
TO_THE_END = 2**31 - 1


def fuse_rotary(model: onnx.ModelProto) -> onnx.ModelProto:
    opset = opset_version(model)
    if opset < 13:  # Split's equal halves and Unsqueeze's axes input as the bodies write them
        return model
    if not any(n.op_type == "Neg" for n in model.graph.node):
        return model  # nothing to match: no shape inference for it
    model = copy_model(model)
    graph = model.graph
    view = _View(model)
    nodes = list(graph.node)
    used: set[str] = set()
    taken: set[int] = set()
    for neg in list(graph.node):
        if neg.op_type != "Neg" or neg.domain not in ("", "ai.onnx"):
            continue
        match = _match_halves(neg, view) or _match_pairs(neg, view)
        if match is None or any(id(n) in taken for n in match[0]):
            continue
        pattern, op_type, x, cos, sin, y = match
        taken.update(id(n) for n in pattern)
        nodes = splice(nodes, pattern, [helper.make_node(
            op_type, [x, cos, sin], [y], domain=FUSED_DOMAIN, name=neg.name or y)])
        used.add(op_type)
    if not used:
        return model
    set_nodes(graph, nodes)
    add_fused_functions(model, used, lambda op_type: rotary_function(op_type, opset))
    return model


def rotary_function(op_type: str, opset: int) -> onnx.FunctionProto:
    """y = x * cos + rotate(x) * sin, rotate as Rotary (halves) or RotaryInterleaved (pairs)
    spell it, in the model's ai.onnx opset (>= 13)."""
    split = {"num_outputs": 2} if opset >= 18 else {}
    if op_type == ROTARY:
        body = [helper.make_node("Split", ["x"], ["x1", "x2"], axis=-1, **split),
                helper.make_node("Neg", ["x2"], ["neg"]),
                helper.make_node("Concat", ["neg", "x1"], ["rotated"], axis=-1)]
    else:
        def const(name, values):
            return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
                np.array(values, np.int64), name))
        body = [const("zero", [0]), const("minus_one", [-1]), const("pair", [-1, 2]),
                const("last", [-1]),
                helper.make_node("Shape", ["x"], ["shape"]),
                helper.make_node("Slice", ["shape", "zero", "minus_one"], ["lead"]),
                helper.make_node("Concat", ["lead", "pair"], ["paired_shape"], axis=0),
                helper.make_node("Reshape", ["x", "paired_shape"], ["paired"]),
                helper.make_node("Split", ["paired"], ["x1", "x2"], axis=-1, **split),
                helper.make_node("Neg", ["x2"], ["neg"]),
                helper.make_node("Concat", ["neg", "x1"], ["swapped"], axis=-1),
                helper.make_node("Reshape", ["swapped", "shape"], ["rotated"])]
    body += [helper.make_node("Mul", ["x", "cos"], ["x_cos"]),
             helper.make_node("Mul", ["rotated", "sin"], ["rotated_sin"]),
             helper.make_node("Add", ["x_cos", "rotated_sin"], ["y"])]
    return helper.make_function(FUSED_DOMAIN, op_type, ["x", "cos", "sin"], ["y"], body,
                                [helper.make_opsetid("", opset)])


class _View:
    def __init__(self, model):
        graph = model.graph
        # data_prop: q and k come from Reshapes to shapes the graph computes
        self.shapes, self.constants = Shapes(model, data_prop=True), Constants(graph)
        self.uses, self.outputs = consumers(graph), graph_output_names(graph)
        self.made_by = producers(graph)

    def producer(self, name, op_type):
        p = self.made_by.get(name)
        return p if p is not None and p.op_type == op_type and p.domain in ("", "ai.onnx") else None

    def only_reader(self, name, op_type):
        readers = self.uses.get(name, [])
        if name in self.outputs or len(readers) != 1:
            return None
        r = readers[0]
        return r if r.op_type == op_type and r.domain in ("", "ai.onnx") else None

    def ints(self, name):
        value = self.constants.get(name) if name else None
        if value is None or value.dtype.kind not in "iu" or value.ndim > 1:
            return None
        return [int(v) for v in value.reshape(-1)]

    def last_axis(self, x):
        """(rank, length) of x's last axis when both are known, else None."""
        shape = self.shapes.shape(x)
        if not shape or not isinstance(shape[-1], int):
            return None
        return len(shape), shape[-1]

    def slice_of(self, node, rank):
        """(start, end, step) of a Slice over x's last axis alone (constant inputs), else None."""
        if node is None or len(node.input) < 4:
            return None
        starts, ends, axes = (self.ints(n) for n in node.input[1:4])
        steps = self.ints(node.input[4]) if len(node.input) > 4 and node.input[4] else [1]
        if None in (starts, ends, axes, steps) or not len(starts) == len(ends) == len(axes) == (
                len(steps)) == 1 or axes[0] not in (-1, rank - 1):
            return None
        return starts[0], ends[0], steps[0]


def _other(node, name):
    if len(node.input) != 2 or list(node.input).count(name) != 1:
        return None
    return node.input[1] if node.input[0] == name else node.input[0]


def _last_axis_attr(node, rank) -> bool:
    return attr(node, "axis", None) in (-1, rank - 1)


def _halves(x2, neg, view):
    """(x, x1, [cutting nodes]) when x2 is the second half of x's last axis and x1 its first,
    cut by two Slices or one Split."""
    split = view.producer(x2, "Split")
    if split is not None and len(split.output) == 2 and split.output[1] == x2:
        x = split.input[0]
        dims = view.last_axis(x)
        if dims is None or dims[1] % 2 or not _last_axis_attr(split, dims[0]):
            return None
        sizes = view.ints(split.input[1]) if len(split.input) > 1 and split.input[1] else (
            attr(split, "split", None))
        if sizes is not None and list(sizes) != [dims[1] // 2] * 2:
            return None
        return x, split.output[0], [split]
    second = view.producer(x2, "Slice")
    if second is None:
        return None
    x = second.input[0]
    dims = view.last_axis(x)
    if dims is None or dims[1] % 2:
        return None
    rank, length = dims
    half = length // 2
    cut = view.slice_of(second, rank)
    if cut is None or cut[0] not in (half, half - length) or cut[1] < length or cut[2] != 1:
        return None
    return x, None, [second]


def _match_halves(neg, view):
    found = _halves(neg.input[0], neg, view)
    if found is None:
        return None
    x, x1, cutting = found
    rank, length = view.last_axis(x)
    concat = view.only_reader(neg.output[0], "Concat")
    if concat is None or len(concat.input) != 2 or concat.input[0] != neg.output[0] or (
            not _last_axis_attr(concat, rank)):
        return None
    if x1 is None:  # the Slice form: the first half is another Slice of x
        first = view.producer(concat.input[1], "Slice")
        cut = view.slice_of(first, rank) if first is not None and first.input[0] == x else None
        if cut is None or cut[0] not in (0, -length) or cut[1] not in (length // 2, -length // 2) or (
                cut[2] != 1):
            return None
        cutting.append(first)
    elif concat.input[1] != x1:
        return None
    return _around(cutting + [neg, concat], concat.output[0], x, ROTARY, view)


def _match_pairs(neg, view):
    """The interleaved form: Slices of step 2 from 1 and from 0, each Unsqueezed at the end,
    concatenated there and reshaped back to x's shape."""
    odd = view.producer(neg.input[0], "Slice")
    if odd is None:
        return None
    x = odd.input[0]
    dims = view.last_axis(x)
    if dims is None or dims[1] % 2:
        return None
    rank, length = dims
    cut = view.slice_of(odd, rank)
    if cut is None or cut[0] != 1 or cut[1] < length or cut[2] != 2:
        return None
    neg_up = _unsqueezed_last(neg.output[0], rank, view)
    if neg_up is None:
        return None
    concat = view.only_reader(neg_up.output[0], "Concat")
    if concat is None or len(concat.input) != 2 or concat.input[0] != neg_up.output[0] or (
            attr(concat, "axis", None) not in (-1, rank)):
        return None
    even_up = view.producer(concat.input[1], "Unsqueeze")
    even = view.producer(even_up.input[0], "Slice") if even_up is not None else None
    if even is None or even.input[0] != x or _unsqueezed_last(even.output[0], rank, view) is not (
            even_up):
        return None
    cut = view.slice_of(even, rank)
    if cut is None or cut[0] != 0 or cut[1] < length or cut[2] != 2:
        return None
    flat = view.only_reader(concat.output[0], "Reshape")
    if flat is None or flat.input[0] != concat.output[0] or not _back_to(flat, x, view):
        return None
    pattern = [odd, neg, neg_up, even, even_up, concat, flat]
    return _around(pattern, flat.output[0], x, ROTARY_INTERLEAVED, view)


def _unsqueezed_last(name, rank, view):
    node = view.only_reader(name, "Unsqueeze")
    if node is None:
        return None
    axes = view.ints(node.input[1]) if len(node.input) > 1 else attr(node, "axes", None)
    return node if axes is not None and list(axes) in ([-1], [rank]) else None


def _back_to(reshape, x, view) -> bool:
    """The Reshape gives x's shape back: shapes inferred equal, or a constant target of x's rank
    whose entries copy (0) or equal x's known dimensions, the last x's length."""
    if view.shapes.same_shape(reshape.output[0], x):
        return True
    target, shape = view.ints(reshape.input[1]), view.shapes.shape(x)
    if target is None or shape is None or len(target) != len(shape) or attr(reshape, "allowzero", 0):
        return False
    return target[-1] == shape[-1] and all(t == 0 or t == d for t, d in zip(target, shape))


def _around(pattern, rotated, x, op_type, view):
    """Add(Mul(x, cos), Mul(rotated, sin)) around the rotation, and the match."""
    times_sin = view.only_reader(rotated, "Mul")
    sin = _other(times_sin, rotated) if times_sin is not None else None
    add = view.only_reader(times_sin.output[0], "Add") if sin is not None else None
    times_cos_name = _other(add, times_sin.output[0]) if add is not None else None
    times_cos = view.producer(times_cos_name, "Mul") if times_cos_name else None
    cos = _other(times_cos, x) if times_cos is not None else None
    if cos is None or view.only_reader(times_cos.output[0], "Add") is not add:
        return None
    pattern = pattern + [times_sin, times_cos, add]
    if not private_values(pattern, {add.output[0]}, view.uses, view.outputs):
        return None
    return pattern, op_type, x, cos, sin, add.output[0]
