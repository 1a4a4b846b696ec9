"""Common-subexpression elimination: of two nodes with the same op, inputs and attributes, the
second is dropped and its readers read the first one's outputs."""
from __future__ import annotations

import onnx

from ._graph import copy_model, graph_output_names, holds_subgraph, rename_uses
from .constant_folding import RANDOM_OPS
from .dead_code import keep_only


def eliminate_common_subexpressions(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    outputs = graph_output_names(graph)
    nodes = list(graph.node)
    seen: dict[tuple, object] = {}
    kept = []
    renamed: dict[str, str] = {}  # a dropped node's output -> the first one's
    for node in nodes:
        if renamed:  # the readers after a dropped node read the first one's outputs
            _read_renamed(node, renamed)
        key = _key(node)
        first = seen.get(key) if key is not None else None
        if first is None or any(o in outputs for o in node.output):
            if key is not None:
                seen.setdefault(key, node)
            kept.append(node)
            continue
        renamed.update((old, new) for old, new in zip(node.output, first.output) if old)
    keep_only(graph.node, kept)
    return model


def _read_renamed(node, renamed: dict[str, str]) -> None:
    """What rename_uses(node, old, new) does for each pair (one pass over the node's inputs;
    the pairs chain nowhere: a new name is a kept node's output, never an old one)."""
    inputs = node.input
    for i, name in enumerate(inputs):
        if name in renamed:
            inputs[i] = renamed[name]
    if holds_subgraph(node):
        for old, new in renamed.items():
            rename_uses([node], old, new)


def _key(node):
    """What makes two nodes compute the same values; None for nodes that must stay apart."""
    if node.op_type in RANDOM_OPS:
        return None
    outputs = node.output
    if not outputs:
        return None
    attributes = node.attribute
    attrs = ()
    if attributes:  # most nodes have none: no sort or serialization for them
        if holds_subgraph(node):
            return None
        attrs = tuple(sorted((a.name, a.SerializeToString(deterministic=True))
                             for a in attributes))
    return (node.domain or "", node.op_type, tuple(node.input), attrs,
            tuple(map(bool, outputs)))
