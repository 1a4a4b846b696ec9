"""Attention fusion for the pattern exporters write for multi-head self-attention:

    q, k, v  [B, S, N*H] --Reshape [B, S, N, H]--Transpose--> [B, N, S, H]  (K: to [B, N, H, S])
    scores = MatMul(q, k^T) scaled by Div/Mul  (+ additive mask)  -> Softmax -> MatMul(., v)
    out    = Transpose [B, S, N, H] -> Reshape [B, S, N*H]

K^T is one Transpose(0, 2, 3, 1) or Transpose(0, 2, 1, 3) then (0, 1, 3, 2). The scale is on
the scores, or split between Q and K^T as Mul by constants (torch's scaled_dot_product_attention
export multiplies both by sqrt(scale), computed from Shape(query) unless given); the fused
scale is their product, its value worked out once when it comes from static shapes.

becomes one com.microsoft MultiHeadAttention(q, k, v, attention_bias=mask) with num_heads and
scale, as onnxruntime's contrib operator docs define it. The projections stay as they are. A
padding mask of shape (B|1, 1, 1, T) is expanded to one row per query first, for attention_bias
must be (B|1, N|1, S, T).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from reference import ReferenceEvaluator
from reference.errors import ReferenceError_

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
    private_values,
    producers,
    reads_type_only,
    scalar,
    set_nodes,
    splice,
)

HEADS_FIRST = [0, 2, 1, 3]
COPY = "copy"  # a Reshape target entry that keeps the input's dimension
# what a scale computed from shapes may be made of, and how many nodes
SHAPE_ARITHMETIC = {"Shape", "Slice", "Gather", "Squeeze", "Unsqueeze", "Cast", "CastLike",
                    "Sqrt", "Reciprocal", "Div", "Mul", "Pow"}
MAX_SCALE_NODES = 12


def fuse_attention(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    m = _Matcher(model)
    nodes = list(graph.node)
    fused_any = False
    expanded: dict[tuple, str] = {}  # one Expand per padding mask, shared by every layer
    for softmax in list(nodes):
        if softmax.op_type != "Softmax" or softmax.domain not in ("", "ai.onnx"):
            continue
        match = m.match(softmax)
        if match is None:
            continue
        pattern, inputs, output, heads, scale, query_rows = match
        new = []
        if query_rows:  # a padding mask (.., 1, T): one row per query, as attention_bias wants
            key = (inputs[5], query_rows)
            if key not in expanded:
                expanded[key] = _expand_rows(graph, nodes, inputs[5], query_rows)
                if not isinstance(query_rows, int):  # S symbolic: read it from the query
                    new.extend(_rows_of(inputs[0], expanded[key], graph))
                new.append(helper.make_node("Expand", [inputs[5], expanded[key] + "_shape"],
                                            [expanded[key]], name=expanded[key]))
            inputs[5] = expanded[key]
        while inputs and not inputs[-1]:
            inputs.pop()
        new.append(helper.make_node("MultiHeadAttention", inputs, [output], domain=MS_DOMAIN,
                                    name=softmax.name or output, num_heads=heads, scale=scale))
        nodes = splice(nodes, pattern, new)
        fused_any = True
    set_nodes(graph, nodes)
    if fused_any:
        ensure_opset(model, MS_DOMAIN, 1)
    return model


def _expand_rows(graph, nodes, mask, rows) -> str:
    """A fresh name for the expanded mask. Its target shape is `<name>_shape`: an initializer
    when `rows` is an int, else made by _rows_of (names `<name>_*` are free for it)."""
    taken = {o for n in nodes for o in n.output} | {i.name for i in graph.initializer}
    taken |= {i.name for i in graph.input}
    name, k = f"{mask}_rows", 0
    while any(t == name or t.startswith(f"{name}_") for t in taken):
        k += 1
        name = f"{mask}_rows_{k}"
    if isinstance(rows, int):
        graph.initializer.append(numpy_helper.from_array(np.array([1, 1, rows, 1], np.int64),
                                                         f"{name}_shape"))
    return name


def _rows_of(query, name, graph) -> list:
    """Nodes making `<name>_shape` = [1, 1, S, 1], S the query's (symbolic) second dim."""
    graph.initializer.extend([
        numpy_helper.from_array(np.array([1], np.int64), f"{name}_one"),
        numpy_helper.from_array(np.array([2], np.int64), f"{name}_two"),
        numpy_helper.from_array(np.array([1, 1], np.int64), f"{name}_ones")])
    return [helper.make_node("Shape", [query], [f"{name}_query_shape"]),
            helper.make_node("Slice", [f"{name}_query_shape", f"{name}_one", f"{name}_two"],
                             [f"{name}_count"]),
            helper.make_node("Concat", [f"{name}_ones", f"{name}_count", f"{name}_one"],
                             [f"{name}_shape"], axis=0)]


class _Matcher:
    def __init__(self, model):
        graph = model.graph
        self.shapes, self.constants = Shapes(model), Constants(graph)
        self.uses, self.outputs = consumers(graph), graph_output_names(graph)
        self.made_by = producers(graph)
        self.opset = opset_version(model)
        self.graph_nodes = list(graph.node)

    def producer(self, name, op_type, reader=None):
        """The ai.onnx `op_type` node making `name`, read only by `reader` when one is given."""
        p = self.made_by.get(name)
        if p is None or p.op_type != op_type or p.domain not in ("", "ai.onnx"):
            return None
        if reader is not None and self._only_reader(name) is not reader:
            return None
        return p

    def _only_reader(self, name):
        """The one reader of `name`, Shape and CastLike(.., name) aside (they read its shape or
        type only; the match takes them in with the scale they compute, or private_values turns
        it down)."""
        readers = [r for r in self.uses.get(name, [])
                   if r.op_type != "Shape" and not reads_type_only(r, name)]
        return readers[0] if len(readers) == 1 and name not in self.outputs else None

    def reader(self, node, op_type):
        r = only_reader(self.uses, self.outputs, node.output[0])
        return r if r is not None and r.op_type == op_type and r.domain in ("", "ai.onnx") else None

    def match(self, softmax):
        if not self._last_axis_softmax(softmax):
            return None
        logits, mask, mask_add = self._scores(softmax)
        if logits is None:
            return None
        qk, scale_nodes, scale = self._unscaled(logits)
        if qk is None:
            return None
        q_name, q_scaled, q_factor = self._peel_scale(qk.input[0], qk)
        k_name, k_scaled, k_factor = self._peel_scale(qk.input[1], qk)
        scale *= q_factor * k_factor
        q = self._split_heads(q_name, (q_scaled or [qk])[0], key=False)
        k = self._split_heads(k_name, (k_scaled or [qk])[0], key=True)
        weighted = self.reader(softmax, "MatMul")
        if q is None or k is None or weighted is None or weighted.input[0] != softmax.output[0]:
            return None
        v = self._split_heads(weighted.input[1], weighted, key=False)
        if v is None:
            return None
        (q_in, q_nodes, heads, head_size), (k_in, k_nodes, *k_dims), (v_in, v_nodes, *v_dims) = (
            q, k, v)
        if k_dims != [heads, head_size] or v_dims != [heads, head_size]:
            return None
        if not self._projections_fit(q_in, k_in, v_in, heads * head_size):
            return None
        merged = self._merge_heads(weighted, heads * head_size, q_in)
        if merged is None:
            return None
        output = merged[1].output[0]
        query_rows = None
        if mask is not None:
            query_rows = self._mask_rows(mask, q_in, k_in, heads)
            if query_rows is None:
                return None
        pattern = (q_nodes + q_scaled + k_nodes + k_scaled + v_nodes + [qk] + scale_nodes
                   + mask_add + [softmax, weighted] + merged)
        pattern = list({id(n): n for n in pattern}.values())  # Q and K^T share a scale
        if not private_values(pattern, {output}, self.uses, self.outputs):
            return None
        inputs = [q_in, k_in, v_in, "", "", mask or ""]
        return pattern, inputs, output, heads, scale, query_rows

    def _unscaled(self, logits):
        """(the MatMul of Q and K^T, [the node scaling its product], the scale) for the logits
        node: Div(MatMul, c), Mul(MatMul, c) in either order, or the MatMul itself (when the
        scale went onto Q and K^T, as torch's scaled_dot_product_attention export writes it)."""
        if logits.op_type == "MatMul":
            return logits, [], 1.0
        for i in ((0,) if logits.op_type == "Div" else (0, 1)):
            qk = self.producer(logits.input[i], "MatMul", logits)
            value = scalar(self.constants, logits.input[1 - i])
            if qk is not None and value:
                return qk, [logits], 1.0 / value if logits.op_type == "Div" else value
        return None, [], 0.0

    def _peel_scale(self, name, reader):
        """(the value before, [the Mul and the nodes computing its factor], the factor) when
        `name` is Mul(value, factor) read by `reader` alone, the factor a constant or computed
        from static shapes, else (name, [], 1.0)."""
        mul = self.producer(name, "Mul", reader)
        if mul is not None:
            for i in (0, 1):
                if self.made_by.get(mul.input[i]) is None:
                    continue
                value = scalar(self.constants, mul.input[1 - i])
                if value:
                    return mul.input[i], [mul], value
                from_shapes = self._scale_from_shapes(mul.input[1 - i])
                if from_shapes is not None and from_shapes[0]:
                    return mul.input[i], [mul] + from_shapes[1], from_shapes[0]
        return name, [], 1.0

    def _scale_from_shapes(self, name):
        """(value, nodes) for a scalar computed from constants and static shapes only, as
        torch's scaled_dot_product_attention export computes sqrt(1 / sqrt(head size)) from
        Shape(query); None otherwise. Evaluated by the reference ops."""
        nodes, leaves, pending = [], {}, [name]
        while pending:
            value_name = pending.pop()
            if value_name in leaves or any(value_name in n.output for n in nodes):
                continue
            if value_name in self.constants:
                leaves[value_name] = self.constants.get(value_name)
                continue
            node = self.made_by.get(value_name)
            if node is None or node.op_type not in SHAPE_ARITHMETIC or node.domain not in (
                    "", "ai.onnx") or len(nodes) >= MAX_SCALE_NODES:
                return None
            nodes.append(node)
            if node.op_type == "Shape":
                shape = self.shapes.static_shape(node.input[0])
                if shape is None:
                    return None
                leaves[value_name] = np.array(shape, np.int64)[attr(node, "start", 0):attr(
                    node, "end", None)]
            elif node.op_type == "CastLike":  # only the type of its second input matters
                pending.append(node.input[0])
                like = self.shapes.elem_type(node.input[1])
                if like is None:
                    return None
                leaves.setdefault(node.input[1], np.zeros((), helper.tensor_dtype_to_np_dtype(
                    like)))
            else:
                pending.extend(n for n in node.input if n)
        computed = [n for n in nodes if n.op_type != "Shape"]
        order = {id(n): i for i, n in enumerate(self.graph_nodes)}
        computed.sort(key=lambda n: order[id(n)])
        graph = helper.make_graph(
            computed, "scale", [], [onnx.ValueInfoProto(name=name)],
            [numpy_helper.from_array(np.asarray(v), k) for k, v in leaves.items()])
        try:
            value = ReferenceEvaluator(helper.make_model(
                graph, opset_imports=[helper.make_opsetid("", self.opset)]), check=False).run(
                    None, {})[0]
        except (ReferenceError_, TypeError, ValueError):
            return None
        value = np.asarray(value)
        if value.size != 1 or value.dtype.kind != "f":
            return None
        return float(value.reshape(-1)[0]), nodes

    def _last_axis_softmax(self, softmax) -> bool:
        """Over the keys of float scores. Where shape inference lost them (Reshape to a
        computed shape), the match itself shows the scores are 4-D and float: Q and K^T come
        from 4-D Reshapes of float [B, S, N*H] projections."""
        axis = attr(softmax, "axis", -1 if self.opset >= 13 else 1)
        scores = softmax.input[0]
        return self.shapes.rank(scores) in (4, None) and axis in (-1, 3) and (
            self.shapes.elem_type(scores) in (onnx.TensorProto.FLOAT, None))

    def _scores(self, softmax):
        """(the node making the unmasked logits, the additive mask or None, [the mask Add]
        or [])."""
        source = self.made_by.get(softmax.input[0])
        if source is None or only_reader(self.uses, self.outputs, softmax.input[0]) is not softmax:
            return None, None, []
        if self._logits(source) is not None:
            return source, None, []
        if source.op_type != "Add" or source.domain not in ("", "ai.onnx"):
            return None, None, []
        for i in (0, 1):
            logits = self._logits(self.made_by.get(source.input[i]))
            if logits is not None and only_reader(
                    self.uses, self.outputs, source.input[i]) is source:
                return logits, source.input[1 - i], [source]
        return None, None, []

    def _logits(self, node):
        """`node` when it makes Q K^T, scaled or not, else None."""
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "MatMul":
            return node
        if node.op_type in ("Div", "Mul") and self._unscaled(node)[0] is not None:
            return node
        return None

    def _split_heads(self, name, reader, key):
        """(the [B, S, N*H] input, the nodes, N, H) for Reshape + Transpose(s) ending at `name`."""
        last = self.producer(name, "Transpose", reader)
        if last is None:
            return None
        nodes = [last]
        perm = list(attr(last, "perm", []))
        if key and perm == [0, 1, 3, 2]:
            first = self.producer(last.input[0], "Transpose", last)
            if first is None or list(attr(first, "perm", [])) != HEADS_FIRST:
                return None
            nodes.insert(0, first)
        elif perm != ([0, 2, 3, 1] if key else HEADS_FIRST):
            return None
        reshape = self.producer(nodes[0].input[0], "Reshape", nodes[0])
        target = self._target(reshape) if reshape is not None else None
        if target is None or len(target[0]) != 4:
            return None
        heads, head_size = target[0][2:]
        if heads == COPY or head_size == COPY or heads <= 0 or head_size <= 0:
            return None
        return reshape.input[0], [reshape] + nodes, heads, head_size

    def _target(self, reshape):
        """(dims, nodes) of a Reshape's target: each dim an int or COPY (0, or the input's own
        dimension read by Shape and Gather, as TorchScript writes x.view(x.size()[:-1] + ...)
        for dynamic axes), and the nodes computing it from that Shape. None if unknown."""
        if attr(reshape, "allowzero", 0):
            return None
        target = self.constants.get(reshape.input[1])
        if target is not None:
            return [COPY if int(t) == 0 else int(t) for t in target.reshape(-1)], []
        concat = self.made_by.get(reshape.input[1])
        if concat is None or concat.op_type != "Concat" or attr(concat, "axis") != 0:
            return None
        dims, nodes = [], [concat]
        for i, piece in enumerate(concat.input):
            value = self.constants.get(piece)
            if value is not None and value.size == 1:
                dims.append(COPY if int(value.reshape(-1)[0]) == 0 else int(value.reshape(-1)[0]))
                continue
            gathered = self._own_dimension(piece, reshape.input[0], i)
            if gathered is None:
                return None
            dims.append(COPY)
            nodes.extend(gathered)
        return dims, nodes

    def _own_dimension(self, name, source, axis):
        """The nodes making `name` = [source.shape[axis]]: Unsqueeze(Gather(Shape(source),
        axis)) or Gather(Shape(source), [axis]); else None."""
        nodes = []
        node = self.made_by.get(name)
        if node is not None and node.op_type == "Unsqueeze":
            nodes.append(node)
            node = self.made_by.get(node.input[0])
        if node is None or node.op_type != "Gather" or attr(node, "axis", 0) != 0:
            return None
        index = self.constants.get(node.input[1])
        shape = self.made_by.get(node.input[0])
        if index is None or index.size != 1 or int(index.reshape(-1)[0]) != axis or (
                index.ndim != (0 if nodes else 1)):
            return None
        if shape is None or shape.op_type != "Shape" or shape.input[0] != source or attr(
                shape, "start", 0) != 0:
            return None
        return nodes + [node, shape]

    def _merge_heads(self, weighted, hidden, query):
        """[the Transpose, the Reshape and the nodes computing its target] back to the query's
        shape [B, S, N*H], or None."""
        transpose = self.reader(weighted, "Transpose")
        if transpose is None or list(attr(transpose, "perm", [])) != HEADS_FIRST:
            return None
        reshape = self._only_reader(transpose.output[0])
        if reshape is None or reshape.op_type != "Reshape" or reshape.domain not in (
                "", "ai.onnx") or reshape.input[0] != transpose.output[0]:
            return None
        target = self._target(reshape)
        # B and S kept and the heads joined, or shapes inferred equal
        kept = target is not None and target[0][:2] == [COPY, COPY] and target[0][2:] in (
            [hidden], [-1])
        if not kept and not self.shapes.same_shape(query, reshape.output[0]):
            return None
        return [transpose, reshape] + (target[1] if target else [])

    def _projections_fit(self, q, k, v, hidden) -> bool:
        shapes = self.shapes
        if any(shapes.rank(n) != 3 or shapes.elem_type(n) != onnx.TensorProto.FLOAT
               for n in (q, k, v)):
            return False
        return all(shapes.shape(n)[2] == hidden for n in (q, k, v))

    def _mask_rows(self, mask, q, k, heads):
        """For an additive mask MultiHeadAttention can take as attention_bias (B|1, N|1, S, T),
        B and S the query's, T the key's (equal dims, or equal names of symbolic ones): 0 when
        it has that shape; when its query axis is 1 and must be expanded to S rows, S (an int,
        or the name of a symbolic S); None when it cannot be used."""
        shape, query, key = self.shapes.shape(mask), self.shapes.shape(q), self.shapes.shape(k)
        if shape is None or len(shape) != 4 or (
                self.shapes.elem_type(mask) != self.shapes.elem_type(q)):
            return None
        batch, rows = query[0], query[1]
        fits = [shape[0] in (1, batch), shape[1] in (1, heads), shape[3] == key[1]]
        if not all(fits) or any(d is None for d in shape):
            return None
        if shape[2] == rows:
            return 0
        if not isinstance(rows, int) and self.opset < 10:
            return None  # the query's length would be read with Slice's inputs (opset 10)
        return rows if shape[2] == 1 and rows is not None else None
