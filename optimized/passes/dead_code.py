"""Dead-code elimination: nodes whose outputs reach no graph output, and the initializers and
value_info entries nothing reads any more."""
from __future__ import annotations

import onnx

from ._graph import copy_model, holds_subgraph, node_inputs, set_nodes


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
    set_nodes(graph, kept)
    inputs = {i.name for i in graph.input}
    initializers = [i for i in graph.initializer if i.name in live or i.name in inputs]
    _keep_only(graph.initializer, initializers)
    if graph.value_info:
        defined = {o for n in kept for o in n.output} | inputs | {i.name for i in initializers}
        _keep_only(graph.value_info, [v for v in graph.value_info if v.name in defined])
    return model


def _keep_only(entries, kept: list) -> None:
    """The repeated field holds `kept` (a subsequence of it), in order; left alone when that is
    all of it (clearing and extending copies every entry back in)."""
    if len(kept) == len(entries):
        return
    del entries[:]
    entries.extend(kept)
