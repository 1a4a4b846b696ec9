"""A Conv followed by Mul and/or Add of per-output-channel constants (the scale and shift that
Caffe2-era models write after BatchNormalization) becomes one Conv with scaled weights and a
shifted bias."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ._graph import (
    Constants,
    Splices,
    add_initializer,
    consumers,
    copy_model,
    graph_output_names,
    only_reader,
    own_weight,
    set_nodes,
    taken_names,
)


def fold_conv_affine(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    constants = Constants(graph)
    uses, outputs = consumers(graph), graph_output_names(graph)
    nodes, taken = Splices(graph.node), taken_names(graph)
    for conv in list(graph.node):
        if conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx"):
            continue
        weights = _conv_weights(conv, constants)
        if weights is None:
            continue
        w, b = weights
        chain, last, scaled = [], conv, False
        while True:
            step = only_reader(uses, outputs, last.output[0])
            factor = _per_channel(step, last.output[0], constants, w) if step else None
            if factor is None:
                break
            if step.op_type == "Mul":
                # in place once w is a copy of ours, or a weight only this Conv reads
                own = w if scaled else own_weight(constants, conv.input[1], conv, uses, outputs)
                w = np.multiply(w, factor.reshape((-1,) + (1,) * (w.ndim - 1)), out=own)
                scaled, b = True, b * factor
            else:
                b = b + factor
            chain.append(step)
            last = step
        if not chain:
            continue
        inputs = [conv.input[0], add_initializer(graph, conv.input[1] + "_scaled", w, taken),
                  add_initializer(graph, (conv.name or last.output[0]) + "_shifted_bias", b,
                                  taken)]
        fused = helper.make_node("Conv", inputs, [last.output[0]], name=conv.name or last.name)
        fused.attribute.extend(conv.attribute)
        nodes.replace([conv] + chain, [fused])
    set_nodes(graph, nodes.nodes())
    return model


def _conv_weights(conv, constants):
    w = constants.get(conv.input[1])
    if w is None or w.dtype.kind != "f":
        return None
    if len(conv.input) > 2 and conv.input[2]:
        b = constants.get(conv.input[2])
        return None if b is None else (w, b.astype(w.dtype))
    return w, np.zeros(w.shape[0], w.dtype)


def _per_channel(node, name, constants, w):
    """The per-output-channel vector of a Mul/Add constant that `node` applies to `name`."""
    if node.op_type not in ("Mul", "Add") or node.domain not in ("", "ai.onnx"):
        return None
    if len(node.input) != 2 or list(node.input).count(name) != 1:
        return None
    value = constants.get(node.input[1] if node.input[0] == name else node.input[0])
    if value is None or value.dtype != w.dtype or value.ndim > w.ndim:
        return None
    shape = (1,) * (w.ndim - value.ndim) + value.shape
    channels = w.shape[0]
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1), (channels,)).astype(w.dtype)
