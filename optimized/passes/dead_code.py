"""Dead-code elimination: nodes whose outputs reach no graph output, and the initializers and
value_info entries nothing reads any more."""
from __future__ import annotations

import onnx

from ._graph import copy_model, holds_subgraph, node_inputs


def eliminate_dead_code(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    live = {o.name for o in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(o in live for o in node.output if o):
            kept.append(node)
            live.update(node_inputs(node) if holds_subgraph(node) else node.input)
    live.discard("")  # an omitted optional input
    kept.reverse()
    keep_only(graph.node, kept)
    inputs = {i.name for i in graph.input}
    initializers = [i for i in graph.initializer if i.name in live or i.name in inputs]
    keep_only(graph.initializer, initializers)
    if graph.value_info:
        defined = {o for n in kept for o in n.output} | inputs | {i.name for i in initializers}
        keep_only(graph.value_info, [v for v in graph.value_info if v.name in defined])
    return model


def keep_only(entries, kept: list) -> None:
    """The repeated field `entries` holds just `kept`, a subsequence of its own entries (the
    same objects, in order), by deleting the others in place: clearing it and extending it by
    `kept` copied every kept entry back in (a decoder's 156 nodes: 0.2 ms a pass)."""
    if len(kept) == len(entries):
        return
    dropped, k = [], 0
    for i, entry in enumerate(entries):
        if k < len(kept) and entry is kept[k]:
            k += 1
        else:
            dropped.append(i)
    if k != len(kept):  # not a subsequence after all
        del entries[:]
        entries.extend(kept)
        return
    for i in reversed(dropped):
        del entries[i]
