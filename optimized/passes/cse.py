"""Common-subexpression elimination: of two nodes with the same op, inputs and attributes, the
second is dropped and its readers read the first one's outputs."""
from __future__ import annotations

import onnx

from ._graph import copy_model, graph_output_names, holds_subgraph, rename_uses, set_nodes
from .constant_folding import RANDOM_OPS


def eliminate_common_subexpressions(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    outputs = graph_output_names(graph)
    nodes = list(graph.node)
    seen: dict[tuple, object] = {}
    kept = []
    for i, node in enumerate(nodes):
        key = _key(node)
        first = seen.get(key) if key is not None else None
        if first is None or any(o in outputs for o in node.output):
            if key is not None:
                seen.setdefault(key, node)
            kept.append(node)
            continue
        for old, new in zip(node.output, first.output):
            if old:
                rename_uses(nodes[i + 1:], old, new)
    set_nodes(graph, kept)
    return model


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
