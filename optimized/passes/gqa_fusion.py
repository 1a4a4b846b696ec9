"""Grouped-query attention fusion for the decoder attention exporters write for Llama-, Qwen2-,
Mistral- and Phi-3-style models (HF's eager attention and torch's scaled_dot_product_attention
as torch.onnx's TorchScript and dynamo exporters decompose them):

    K, V    [B, KV, T, H] (after rotary, and Concat(past, new) with the present outputs)
    repeat  K and V to N = KV * G heads by torch's repeat_kv (Unsqueeze(2), Expand, Reshape),
            by Tile (of the unsqueezed axis, or of the head axis) or by Gather over the heads
    scores  MatMul(Q, Transpose(K, (0, 1, 3, 2))) scaled by a constant (Mul/Div on the scores,
            or Mul on Q and K^T), masked by Add(mask) or Where(cond, scores, fill)
    out     Transpose(MatMul(Softmax(scores, -1), V), (0, 2, 1, 3))    [B, S, N, H]

becomes `onnx_parity.fused::GroupedAttention(q, k, v, kv_heads)` or, with a mask,
`GroupedAttentionMasked(q, k, v, kv_heads, mask)`, with attribute `scale`: model-local
functions whose bodies compute the same (K and V gathered by the constant head table kv_heads,
Q K^T times scale, plus the additive mask, Softmax, times V, back to [B, S, N, H]), so the
rewritten model is valid ONNX for any runtime.  The CPU provider runs them as one kernel that
reads each K/V head in place (csrc/gqa.c).  The Reshape to [B, S, N*H] after it, and the
Concat that makes the present K and V, stay as they are.

The repeat is checked, not assumed: the Expand must only grow the new axis and the Reshape
must merge it with the heads, by shapes that onnx's inference follows through Shape / Gather /
Concat (symbolic dimensions included), by constant targets, or by targets that take the batch
and the length from the very same computed sizes (see _group_by_shared_sizes).  A Where mask becomes an
additive one, Where(cond, 0, fill), made once per mask and fill: equal when fill is -inf, and
when fill is finite and at most -1e30 (torch.finfo.min) too, for then score + fill rounds to
fill for every |score| < 1e22.  A pattern any of whose values is read elsewhere, or is a graph
output, stays; so does one in another type than float32.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import AttributeProto, helper

from ._graph import (
    FUSED_DOMAIN,
    Constants,
    Shapes,
    add_fused_functions,
    add_initializer,
    attr,
    consumers,
    copy_model,
    graph_output_names,
    opset_version,
    private_values,
    producers,
    scalar_through_cast,
    set_nodes,
    splice,
    unique_name,
)

GROUPED_ATTENTION = "GroupedAttention"
GROUPED_ATTENTION_MASKED = "GroupedAttentionMasked"
CAUSAL_PADDING_MASK = "CausalPaddingMask"
KEY_T = [0, 1, 3, 2]
HEADS_BACK = [0, 2, 1, 3]
LOWEST_FILL = -1e30  # a finite Where fill must be at least this negative (see above)


def fuse_grouped_attention(model: onnx.ModelProto) -> onnx.ModelProto:
    opset = opset_version(model)
    if opset < 13:  # Softmax over the last axis alone, as the bodies write it
        return model
    if not any(n.op_type == "Softmax" for n in model.graph.node):
        return model  # nothing to match: no shape inference for it
    model = copy_model(model)
    graph = model.graph
    view = _View(model)
    nodes = list(graph.node)
    tables: dict[tuple, str] = {}
    additive: dict[tuple, str] = {}
    used: set[str] = set()
    for softmax in list(graph.node):
        if softmax.op_type != "Softmax" or softmax.domain not in ("", "ai.onnx"):
            continue
        match = _match(softmax, view, opset)
        if match is None:
            continue
        pattern, q, k, v, heads, mask, where, scale, y = match
        key = tuple(int(h) for h in heads)
        if key not in tables:
            tables[key] = add_initializer(graph, "kv_heads", np.array(key, np.int64))
        new = []
        if where is not None:
            if where not in additive:
                made = _additive_mask(graph, where, view)
                additive[where] = made.output[0]
                new.append(made)
                if made.op_type == CAUSAL_PADDING_MASK:
                    used.add(CAUSAL_PADDING_MASK)
            mask = additive[where]
        op_type = GROUPED_ATTENTION_MASKED if mask else GROUPED_ATTENTION
        inputs = [q, k, v, tables[key]] + ([mask] if mask else [])
        new.append(helper.make_node(op_type, inputs, [y], domain=FUSED_DOMAIN,
                                    name=softmax.name or y, scale=float(scale)))
        nodes = splice(nodes, pattern, new)
        used.add(op_type)
    if not used:
        return model
    set_nodes(graph, nodes)
    add_fused_functions(model, used, lambda op_type: (
        causal_padding_mask_function(opset) if op_type == CAUSAL_PADDING_MASK
        else grouped_attention_function(op_type, opset)))
    return model


def grouped_attention_function(op_type: str, opset: int) -> onnx.FunctionProto:
    """The body of GroupedAttention(q, k, v, kv_heads[, mask]) with attribute scale."""
    masked = op_type == GROUPED_ATTENTION_MASKED
    scale = helper.make_node("Constant", [], ["scale"])
    scale.attribute.append(helper.make_attribute_ref("value_float", AttributeProto.FLOAT))
    scale.attribute[0].ref_attr_name = "scale"
    body = [helper.make_node("Gather", ["k", "kv_heads"], ["k_heads"], axis=1),
            helper.make_node("Gather", ["v", "kv_heads"], ["v_heads"], axis=1),
            helper.make_node("Transpose", ["k_heads"], ["k_t"], perm=KEY_T),
            helper.make_node("MatMul", ["q", "k_t"], ["qk"]),
            scale,
            helper.make_node("Mul", ["qk", "scale"], ["scaled" if masked else "scores"])]
    if masked:
        body.append(helper.make_node("Add", ["scaled", "mask"], ["scores"]))
    body += [helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
             helper.make_node("MatMul", ["probs", "v_heads"], ["heads_first"]),
             helper.make_node("Transpose", ["heads_first"], ["y"], perm=HEADS_BACK)]
    inputs = ["q", "k", "v", "kv_heads"] + (["mask"] if masked else [])
    return helper.make_function(FUSED_DOMAIN, op_type, inputs, ["y"], body,
                                [helper.make_opsetid("", opset)], attributes=["scale"])


def causal_padding_mask_function(opset: int) -> onnx.FunctionProto:
    """The body of CausalPaddingMask(attention_mask, start, end) with attribute fill: 0 where
    key j (of 0..end-1) is at most query position start + i and attention_mask[b, j] is not 0,
    else fill; shape (B, 1, end - start, end) (the key axis broadcast with the mask's)."""
    fill = helper.make_node("Constant", [], ["fill"])
    fill.attribute.append(helper.make_attribute_ref("value_float", AttributeProto.FLOAT))
    fill.attribute[0].ref_attr_name = "fill"
    body = [_constant("zero", np.int64(0)), _constant("one", np.int64(1)),
            _constant("axes_query", np.array([1], np.int64)),
            _constant("axes_causal", np.array([0, 1], np.int64)),
            _constant("axes_padding", np.array([1, 2], np.int64)),
            _constant("kept", np.float32(0.0)), fill,
            helper.make_node("Range", ["zero", "end", "one"], ["keys"]),
            helper.make_node("Range", ["start", "end", "one"], ["queries"]),
            helper.make_node("Unsqueeze", ["queries", "axes_query"], ["query_column"]),
            helper.make_node("LessOrEqual", ["keys", "query_column"], ["causal"]),
            helper.make_node("Unsqueeze", ["causal", "axes_causal"], ["causal_4d"]),
            helper.make_node("Cast", ["attention_mask"], ["padding"], to=onnx.TensorProto.BOOL),
            helper.make_node("Unsqueeze", ["padding", "axes_padding"], ["padding_4d"]),
            helper.make_node("And", ["causal_4d", "padding_4d"], ["allowed"]),
            helper.make_node("Where", ["allowed", "kept", "fill"], ["y"])]
    return helper.make_function(FUSED_DOMAIN, CAUSAL_PADDING_MASK,
                                ["attention_mask", "start", "end"], ["y"], body,
                                [helper.make_opsetid("", opset)], attributes=["fill"])


def _constant(name: str, value) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name],
                            value=onnx.numpy_helper.from_array(np.array(value), name))


def _causal_padding(cond, view):
    """(attention_mask, start, end) where cond is dynamo's causal-and-padding condition (see
    the module's text) and no piece of it but cond is read elsewhere; else None."""
    both = view.producer(cond, "And")
    if both is None:
        return None
    for causal_4d, padding_4d in (both.input, reversed(both.input)):
        causal_up = _unsqueezed(causal_4d, [0, 1], view)
        padding_up = _unsqueezed(padding_4d, [1, 2], view)
        if causal_up is None or padding_up is None:
            continue
        compare = view.producer(causal_up.input[0], "LessOrEqual")
        cast = view.producer(padding_up.input[0], "Cast")
        if compare is None or cast is None or attr(cast, "to", 0) != onnx.TensorProto.BOOL:
            continue
        column = _unsqueezed(compare.input[1], [1], view)
        keys = view.producer(compare.input[0], "Range")
        queries = view.producer(column.input[0], "Range") if column is not None else None
        if keys is None or queries is None or keys.input[1] != queries.input[1]:
            continue
        if view.ints(keys.input[0]) != [0] or view.ints(keys.input[2]) != [1] or view.ints(
                queries.input[2]) != [1]:
            continue
        attention_mask, start, end = cast.input[0], queries.input[0], keys.input[1]
        if view.shapes.rank(attention_mask) != 2 or any(
                view.shapes.elem_type(n) != onnx.TensorProto.INT64 for n in (start, end)):
            continue
        pieces = [both, causal_up, padding_up, compare, cast, column, keys, queries]
        if private_values(pieces, {cond}, view.uses, view.outputs):
            return attention_mask, start, end
    return None


def _unsqueezed(name, axes, view):
    """The Unsqueeze making `name` when it inserts exactly `axes`, else None."""
    node = view.producer(name, "Unsqueeze")
    if node is None:
        return None
    found = view.ints(node.input[1]) if len(node.input) > 1 else attr(node, "axes", None)
    return node if found is not None and list(found) == axes else None


def _additive_mask(graph, where, view):
    """Where(cond, 0, fill) (kept where cond) or Where(cond, fill, 0) (masked where cond), or
    CausalPaddingMask for dynamo's causal-and-padding cond.  It goes where the first fused
    attention reading it stood: cond is made before that, and every later reader comes after
    it."""
    cond, fill, keep_when_true = where
    causal = _causal_padding(cond, view) if keep_when_true else None
    if causal is not None and cond not in view.outputs and all(
            r.op_type == "Where" for r in view.uses.get(cond, [])):
        out = unique_name(graph, f"{cond}_additive")
        return helper.make_node(CAUSAL_PADDING_MASK, list(causal), [out], name=out,
                                domain=FUSED_DOMAIN, fill=float(fill))
    zero = add_initializer(graph, "mask_zero", np.zeros((), np.float32))
    filled = add_initializer(graph, "mask_fill", np.array(fill, np.float32))
    out = unique_name(graph, f"{cond}_additive")
    inputs = [cond, zero, filled] if keep_when_true else [cond, filled, zero]
    return helper.make_node("Where", inputs, [out], name=out)


class _View:
    def __init__(self, model):
        graph = model.graph
        self.shapes = Shapes(model, data_prop=True)
        self.constants = Constants(graph)
        self.uses, self.outputs = consumers(graph), graph_output_names(graph)
        self.made_by = producers(graph)

    def producer(self, name, op_type):
        p = self.made_by.get(name)
        return p if p is not None and p.op_type == op_type and p.domain in ("", "ai.onnx") else None

    def only_reader(self, name, op_type=None):
        readers = self.uses.get(name, [])
        if name in self.outputs or len(readers) != 1:
            return None
        r = readers[0]
        if op_type is not None and (r.op_type != op_type or r.domain not in ("", "ai.onnx")):
            return None
        return r

    def ints(self, name):
        value = self.constants.get(name) if name else None
        if value is None or value.dtype.kind not in "iu" or value.ndim > 1:
            return None
        return [int(v) for v in value.reshape(-1)]

    def scalar(self, name):
        return scalar_through_cast(self.constants, self.made_by, name)


def _match(softmax, view, opset):
    axis = attr(softmax, "axis", -1)
    if axis not in (-1, 3) or view.shapes.rank(softmax.input[0]) not in (4, None):
        return None
    source = view.made_by.get(softmax.input[0])
    if source is None or view.only_reader(softmax.input[0]) is not softmax:
        return None
    logits, mask, where, mask_nodes = _masked(source, view)
    if logits is None:
        return None
    qk, scale_nodes, scale = _unscaled(logits, view)
    if qk is None:
        return None
    q, q_nodes, q_factor = _peel_scale(qk.input[0], qk, view)
    k_t, k_t_nodes, k_factor = _peel_scale(qk.input[1], qk, view)
    transpose = view.producer(k_t, "Transpose")
    if transpose is None or list(attr(transpose, "perm", [])) != KEY_T or view.only_reader(
            k_t) is not (k_t_nodes or [qk])[0]:
        return None
    key = _repeated(transpose.input[0], view)
    weighted = view.only_reader(softmax.output[0], "MatMul")
    if key is None or weighted is None or weighted.input[0] != softmax.output[0]:
        return None
    value = _repeated(weighted.input[1], view)
    back = view.only_reader(weighted.output[0], "Transpose")
    if value is None or back is None or list(attr(back, "perm", [])) != HEADS_BACK:
        return None
    if not np.array_equal(key[2], value[2]):
        # one head table serves both: where one side's repeat must stay (read elsewhere), the
        # other side's is read as it is too
        key, value = (_as_it_is(transpose.input[0], view),
                      _as_it_is(weighted.input[1], view))
        if key is None or value is None or not np.array_equal(key[2], value[2]):
            return None
    (k, k_nodes, heads), (v, v_nodes, _) = key, value
    if any(view.shapes.elem_type(n) != onnx.TensorProto.FLOAT for n in (q, k, v)):
        return None
    if view.shapes.rank(q) != 4 or view.shapes.rank(k) != 4:
        return None
    pattern = (k_nodes + [transpose] + k_t_nodes + q_nodes + [qk] + scale_nodes + mask_nodes
               + [softmax] + v_nodes + [weighted, back])
    pattern = list({id(n): n for n in pattern}.values())
    if not private_values(pattern, {back.output[0]}, view.uses, view.outputs):
        return None
    return (pattern, q, k, v, heads, mask, where, scale * q_factor * k_factor, back.output[0])


def _masked(source, view):
    """(the logits node, additive mask, where-mask (cond, fill, keep_when_true), [mask nodes])."""
    if source.domain not in ("", "ai.onnx"):
        return None, None, None, []
    if _logits(source, view) is not None:
        return source, None, None, []
    if source.op_type == "Add":
        for i in (0, 1):
            logits = _logits(view.made_by.get(source.input[i]), view)
            if logits is not None and view.only_reader(source.input[i]) is source:
                mask = source.input[1 - i]
                if view.shapes.elem_type(mask) != onnx.TensorProto.FLOAT:
                    return None, None, None, []
                return logits, mask, None, [source]
    if source.op_type == "Where":
        cond = source.input[0]
        for i, keep_when_true in ((1, True), (2, False)):
            logits = _logits(view.made_by.get(source.input[i]), view)
            fill = view.scalar(source.input[3 - i])
            if logits is not None and view.only_reader(source.input[i]) is source and (
                    fill is not None and fill <= LOWEST_FILL) and (
                    view.shapes.elem_type(cond) == onnx.TensorProto.BOOL):
                return logits, None, (cond, fill, keep_when_true), [source]
    return None, None, None, []


def _logits(node, view):
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "MatMul" or (node.op_type in ("Mul", "Div") and _unscaled(
            node, view)[0] is not None):
        return node
    return None


def _unscaled(logits, view):
    """(the Q K^T MatMul, [the node scaling it], the scale)."""
    if logits.op_type == "MatMul":
        return logits, [], 1.0
    for i in ((0,) if logits.op_type == "Div" else (0, 1)):
        qk = view.producer(logits.input[i], "MatMul")
        value = view.scalar(logits.input[1 - i])
        if qk is not None and value and view.only_reader(qk.output[0]) is logits:
            return qk, [logits], 1.0 / value if logits.op_type == "Div" else value
    return None, [], 0.0


def _peel_scale(name, reader, view):
    """(the value before, [the Mul], its factor) when `name` is Mul(value, constant) read by
    `reader` alone, else (name, [], 1.0)."""
    mul = view.producer(name, "Mul")
    if mul is not None and view.only_reader(name) is reader:
        for i in (0, 1):
            value = view.scalar(mul.input[1 - i])
            if value and mul.input[i] not in view.constants:
                return mul.input[i], [mul], value
    return name, [], 1.0


def _repeated(name, view):
    """(K, [the repeating nodes], head table) for K repeated to `name` per query head: head h
    of the result is head table[h] of K.  K itself (no repeat) when its head count is known."""
    reshape = view.producer(name, "Reshape")
    if reshape is not None and view.only_reader(name) is not None:
        found = _repeat_kv(reshape, view)
        if found is not None:
            return found
    gather = view.producer(name, "Gather")
    if gather is not None and attr(gather, "axis", 0) == 1 and view.only_reader(name):
        table = view.ints(gather.input[1])
        k = gather.input[0]
        kv = _dim(view, k, 1)
        if table is not None and len(table) > 0 and kv is not None and all(
                -kv <= t < kv for t in table):
            return k, [gather], np.array([t % kv for t in table])
    tile = view.producer(name, "Tile")
    if tile is not None and view.only_reader(name):
        repeats, k = view.ints(tile.input[1]), tile.input[0]
        kv = _dim(view, k, 1)
        if repeats is not None and len(repeats) == 4 and repeats[0] == repeats[2] == (
                repeats[3]) == 1 and kv is not None and repeats[1] >= 1:
            return k, [tile], np.arange(kv * repeats[1]) % kv
    return _as_it_is(name, view)  # no repeat, or one that must stay


def _as_it_is(name, view):
    """(name, [], 0..N-1): every head of `name` read as it is, when N is known."""
    heads = _dim(view, name, 1)
    return (name, [], np.arange(heads)) if heads is not None else None


def _repeat_kv(reshape, view):
    """torch's repeat_kv: Reshape(Expand(Unsqueeze(k, 2), [B, KV, G, T, H]), [B, KV*G, T, H]),
    or Tile(Unsqueeze(k, 2), [1, 1, G, 1, 1]) in place of the Expand."""
    grow = view.made_by.get(reshape.input[0])
    if grow is None or grow.op_type not in ("Expand", "Tile") or grow.domain not in (
            "", "ai.onnx") or view.only_reader(grow.output[0]) is not reshape:
        return None
    unsqueeze = view.producer(grow.input[0], "Unsqueeze")
    if unsqueeze is None or view.only_reader(unsqueeze.output[0]) is not grow:
        return None
    axes = view.ints(unsqueeze.input[1]) if len(unsqueeze.input) > 1 else attr(
        unsqueeze, "axes", None)
    if axes is None or list(axes) not in ([2], [-3]):
        return None
    k = unsqueeze.input[0]
    k_shape = view.shapes.shape(k)
    if k_shape is None or len(k_shape) != 4 or not isinstance(k_shape[1], int):
        return None
    kv = k_shape[1]
    if grow.op_type == "Tile":
        repeats = view.ints(grow.input[1])
        if repeats is None or len(repeats) != 5 or [repeats[i] for i in (0, 1, 3, 4)] != [1] * 4:
            return None
        group = repeats[2]
    else:
        group = _expanded_group(grow, k_shape, view)
    merges = group is not None and group >= 1 and _merges_heads(reshape, k_shape, kv * group,
                                                                view)
    if not merges and grow.op_type == "Expand":
        group = _group_by_shared_sizes(grow, reshape, k_shape, view)
        merges = group is not None
    if not merges:
        return None
    return k, [unsqueeze, grow, reshape], np.arange(kv * group) // group


def _expanded_group(expand, k_shape, view):
    """G when the Expand of [B, KV, 1, T, H] grows the third axis alone, to G."""
    target = view.ints(expand.input[1])
    if target is not None:
        if len(target) != 5:
            return None
        kept = [target[i] for i in (0, 1, 3, 4)]
        if all(t == 1 or t == d for t, d in zip(kept, k_shape)) and target[2] >= 1:
            return target[2]
        return None
    out = view.shapes.shape(expand.output[0])
    if out is None or len(out) != 5 or not isinstance(out[2], int):
        return None
    if _same_dims(out[:2] + out[3:], k_shape):
        return out[2]
    return None


def _group_by_shared_sizes(expand, reshape, k_shape, view):
    """G when the two targets are [b, KV, G, t, H] and [b, KV*G, t, H], KV and H K's own, G a
    constant, and b and t the very same computed sizes in both (as torch.export computes
    batch and past + seq once from the inputs' shapes, so that shape inference cannot tie
    them to K's).  The Expand then grows the new axis alone, unless K's batch or length is 1
    where b or t is larger: K/V caches of unequal lengths across layers, which no decoder
    step is fed."""
    grown, merged = _target_entries(expand.input[1], view), _target_entries(reshape.input[1],
                                                                             view)
    if grown is None or merged is None or len(grown) != 5 or len(merged) != 4:
        return None
    kv, head = k_shape[1], k_shape[3]
    group = grown[2]
    if not isinstance(group, int) or group < 1 or grown[1] != kv or grown[4] != head:
        return None
    if merged[1] != kv * group or merged[3] != head or attr(reshape, "allowzero", 0):
        return None
    shared = all(isinstance(grown[i], tuple) and grown[i] == merged[j] or (
        isinstance(grown[i], int) and grown[i] == merged[j] == k_shape[i - (i > 2)])
        for i, j in ((0, 0), (3, 2)))
    return group if shared else None


def _target_entries(name, view):
    """A shape target entry by entry: ints where constant, (piece, index) where computed."""
    values = view.ints(name)
    if values is not None:
        return values
    concat = view.producer(name, "Concat")
    if concat is None or attr(concat, "axis", None) != 0:
        return None
    entries = []
    for piece in concat.input:
        values = view.ints(piece)
        if values is not None:
            entries.extend(values)
            continue
        shape = view.shapes.shape(piece)
        if shape is None or len(shape) != 1 or not isinstance(shape[0], int):
            return None
        entries.extend((piece, i) for i in range(shape[0]))
    return entries


def _merges_heads(reshape, k_shape, heads, view) -> bool:
    """The Reshape gives [B, KV*G, T, H] of [B, KV, G, T, H] (a constant target copying or
    naming B, T and H, or a shape inferred equal)."""
    if attr(reshape, "allowzero", 0):
        return False
    out = view.shapes.shape(reshape.output[0])
    want = [k_shape[0], heads, k_shape[2], k_shape[3]]
    if out is not None and _same_dims(out, want):
        return True
    target = view.ints(reshape.input[1])
    if target is None or len(target) != 4 or target[1] != heads:
        return False
    # B, T, H: 0 copies nothing here (the input's axes differ), so each must be known; one -1
    # may stand for a dimension the others fix
    known = [t == d for t, d in zip(target, want) if t != -1]
    return all(known) and target.count(-1) <= 1 and all(
        isinstance(d, int) for t, d in zip(target, want) if t != -1)


def _same_dims(a, b) -> bool:
    return len(a) == len(b) and all(x is not None and x == y for x, y in zip(a, b))


def _dim(view, name, axis):
    shape = view.shapes.shape(name)
    if shape is None or len(shape) != 4 or not isinstance(shape[axis], int):
        return None
    return shape[axis]
