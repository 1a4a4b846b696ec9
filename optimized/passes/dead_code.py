"""Dead-code elimination: nodes whose outputs reach no graph output, and the initializers and
value_info entries nothing reads any more."""
from __future__ import annotations

import onnx

from ._graph import copy_model, node_inputs, set_nodes


def eliminate_dead_code(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    live = {o.name for o in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(o in live for o in node.output if o):
            kept.append(node)
            live.update(node_inputs(node))
    kept.reverse()
    set_nodes(graph, kept)
    inputs = {i.name for i in graph.input}
    initializers = [i for i in graph.initializer if i.name in live or i.name in inputs]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    defined = {o for n in kept for o in n.output} | inputs | {i.name for i in initializers}
    infos = [v for v in graph.value_info if v.name in defined]
    del graph.value_info[:]
    graph.value_info.extend(infos)
    return model
