"""Identity and no-op elimination: nodes whose output equals their first input (Identity, Dropout
at inference, Cast to the type it already has, Reshape to the shape it already has, Transpose with
the identity permutation, Mul/Div by 1, Add/Sub of 0) are removed and their readers read the
input directly."""
from __future__ import annotations

import numpy as np
import onnx

from ._graph import (
    Constants,
    Shapes,
    attr,
    copy_model,
    graph_output_names,
    node_inputs,
    producers,
    rename_uses,
    set_nodes,
)

# the op types _passed_through can find passing their input on (any other: None)
MAYBE_NO_OP = frozenset({"Identity", "Dropout", "Cast", "CastLike", "Reshape", "Transpose",
                         "Mul", "Div", "Add", "Sub"})
# ai.onnx op types whose first output has the rank of their first input (Ranks follows them)
SAME_RANK = frozenset({"Relu", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "Clip", "Elu", "Selu",
                       "HardSigmoid", "Softplus", "Abs", "Neg", "Exp", "Log", "Sqrt", "Erf",
                       "Identity", "Dropout", "Cast", "Conv", "BatchNormalization", "MaxPool",
                       "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LRN", "Softmax",
                       "LogSoftmax", "Concat", "Pad"})
# ai.onnx op types whose output has the largest rank of their inputs (multidirectional
# broadcasting)
BROADCAST_RANK = frozenset({"Add", "Sub", "Mul", "Div", "Sum", "Max", "Min", "Mean", "Pow"})


def eliminate_identities(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    shapes = Shapes(model)  # inferred on its first question only
    constants = Constants(graph)
    ranks = Ranks(graph, constants)
    nodes = list(graph.node)
    outputs = graph_output_names(graph)
    _unname_unread_dropout_masks(nodes, outputs)
    for node in list(nodes):
        if node.op_type not in MAYBE_NO_OP or node.domain not in ("", "ai.onnx"):
            continue
        source = _passed_through(node, constants, shapes, model, ranks)
        if source is None:
            continue
        others = [n for n in nodes if n is not node]
        if _bypass(others, outputs, source, node.output[0]):
            nodes = others
    set_nodes(graph, nodes)
    return model


def _unname_unread_dropout_masks(nodes, outputs) -> None:
    """A Dropout's mask output that no node reads and the graph does not return loses its name
    (the light models name it and never read it), so an inference Dropout can go."""
    masks = [node for node in nodes if node.op_type == "Dropout" and len(node.output) > 1]
    if not masks:  # no read names to gather (a walk over every node's inputs)
        return
    read = {name for node in nodes for name in node_inputs(node)} | set(outputs)
    for node in masks:
        if (node.op_type == "Dropout" and node.domain in ("", "ai.onnx")
                and len(node.output) > 1 and node.output[1] and node.output[1] not in read):
            node.output[1] = ""


def _bypass(others, outputs, source, result) -> bool:
    """Route readers of `result` to `source`; False where that cannot be done."""
    if result not in outputs:
        rename_uses(others, result, source)
        return True
    # the result is a graph output: the producer of the input can write that name instead
    producer = next((n for n in others if source in n.output), None)
    if producer is None or source in outputs:
        return False
    for i, name in enumerate(producer.output):
        if name == source:
            producer.output[i] = result
    rename_uses(others, source, result)
    return True


def _passed_through(node, constants, shapes, model, ranks):
    """The input a no-op node passes on unchanged, or None for any other node."""
    if node.op_type in ("Mul", "Div", "Add", "Sub"):
        return _neutral_arithmetic_input(node, constants, shapes)
    if _changes_rank(node, constants, ranks):
        return None  # decided without shape inference (all that light_shufflenet asked it)
    return node.input[0] if _is_no_op(node, constants, shapes, model) else None


def _changes_rank(node, constants, ranks) -> bool:
    """A Reshape to a constant shape of another length than its input's rank, as Ranks
    follows it from the graph's declared inputs and constants."""
    if node.op_type != "Reshape" or len(node.input) < 2 or not node.input[0]:
        return False
    target = constants.get(node.input[1])
    if target is None or target.ndim != 1:
        return False
    rank = ranks.of(node.input[0])
    return rank is not None and rank != target.size


class Ranks:
    """Ranks of a graph's values, followed from its declared inputs and constants through the
    ops whose output rank their input ranks alone decide (None where that does not reach)."""

    def __init__(self, graph, constants):
        self._graph, self._constants = graph, constants
        self._known: dict | None = None

    def of(self, name: str):
        if self._known is None:
            self._known = self._declared()
        made_by, known = producers(self._graph), self._known
        stack = [name]
        while stack:
            top = stack[-1]
            if top in known:
                stack.pop()
                continue
            node = made_by.get(top)
            needed = self._inputs_needed(node, top)
            missing = [n for n in needed if n not in known]
            if missing:
                stack.extend(missing)
                continue
            known[top] = self._rank_of(node, [known[n] for n in needed])
            stack.pop()
        return known[name]

    def _declared(self) -> dict:
        known = {name: len(t.dims) for name, t in self._constants.tensors.items()}
        for i in self._graph.input:
            tensor_type = i.type.tensor_type if i.type.HasField("tensor_type") else None
            known[i.name] = (len(tensor_type.shape.dim)
                             if tensor_type is not None and tensor_type.HasField("shape")
                             else None)
        return known

    @staticmethod
    def _inputs_needed(node, name) -> list:
        """The values whose ranks decide `name`'s (none where no rule follows it)."""
        if node is None or node.domain not in ("", "ai.onnx") or node.output[0] != name:
            return []
        if node.op_type in SAME_RANK or (node.op_type == "Transpose" and attr(node, "perm")
                                          is None):
            return [node.input[0]] if node.input and node.input[0] else []
        if node.op_type in BROADCAST_RANK:
            return [n for n in node.input if n]
        return []

    def _rank_of(self, node, input_ranks: list):
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        op = node.op_type
        if op == "Transpose" and (perm := attr(node, "perm")) is not None:
            return len(perm)
        if op == "Reshape" and len(node.input) > 1:
            shape = self._constants.get(node.input[1])
            return shape.size if shape is not None and shape.ndim == 1 else None
        if op == "Flatten":
            return 2
        if not input_ranks or None in input_ranks:
            return None
        return max(input_ranks)


def _is_no_op(node, constants, shapes, model) -> bool:
    op = node.op_type
    if len([o for o in node.output if o]) != 1 or not node.input or not node.input[0]:
        return op == "Dropout" and _is_inference_dropout(node, constants, model)
    if op == "Identity":
        return True
    if op == "Dropout":
        return _is_inference_dropout(node, constants, model)
    if op in ("Cast", "CastLike"):
        source = shapes.elem_type(node.input[0])
        target = attr(node, "to") if op == "Cast" else shapes.elem_type(node.input[1])
        return source is not None and source == target
    if op == "Reshape":
        shape = shapes.static_shape(node.input[0])
        return shape is not None and shape == shapes.static_shape(node.output[0])
    if op == "Transpose":
        perm = attr(node, "perm")
        if perm is None:  # (a perm decides without shape inference)
            rank = shapes.rank(node.input[0])
            return rank is not None and rank <= 1
        return list(perm) == list(range(len(perm)))
    return False


def _is_inference_dropout(node, constants, model) -> bool:
    if len(node.output) > 1 and node.output[1]:
        return False  # the mask is read
    if attr(node, "is_test") == 0 and _opset(model) < 7:
        return False
    if len(node.input) > 2 and node.input[2]:
        training = constants.get(node.input[2])
        return training is not None and not bool(np.asarray(training).reshape(-1)[0])
    return True


def _opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _neutral_arithmetic_input(node, constants, shapes):
    """x for x * 1, 1 * x, x / 1, x + 0, 0 + x and x - 0, when the constant widens nothing."""
    if len(node.input) != 2:
        return None
    neutral = 1 if node.op_type in ("Mul", "Div") else 0
    x, c = node.input
    value = constants.get(c)
    if value is None and node.op_type in ("Mul", "Add"):
        x, c = c, x
        value = constants.get(c)
    if value is None or value.dtype.kind not in "fiu":
        return None
    if (value.size and value.flat[0] != neutral) or not np.all(value == neutral):
        return None  # (the first value alone turns down most weights and biases)
    # the constant must not widen the result: its broadcast leaves x's shape and type alone
    if shapes.elem_type(x) is None or shapes.elem_type(x) != shapes.elem_type(node.output[0]):
        return None
    rank = shapes.rank(x)
    if rank is not None and value.size == 1 and value.ndim <= rank:
        return x
    return x if shapes.same_shape(x, node.output[0]) else None
