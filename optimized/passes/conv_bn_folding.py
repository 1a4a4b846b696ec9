"""Conv followed by BatchNormalization at inference becomes one Conv whose weights and bias
carry the normalization: W' = W * s, B' = (B - mean) * s + beta with s = gamma / sqrt(var + eps)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ._graph import (
    Constants,
    Splices,
    add_initializer,
    batchnorm_affine,
    consumers,
    copy_model,
    graph_output_names,
    is_inference_batchnorm,
    only_reader,
    opset_version,
    own_weight,
    scale_channels,
    set_nodes,
    taken_names,
)


def fold_conv_batchnorm(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    constants = Constants(graph)
    uses, outputs = consumers(graph), graph_output_names(graph)
    opset = opset_version(model)
    nodes, taken = Splices(graph.node), taken_names(graph)
    for conv in list(graph.node):
        if conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx"):
            continue
        bn = only_reader(uses, outputs, conv.output[0])
        if bn is None or bn.op_type != "BatchNormalization" or not is_inference_batchnorm(bn, uses,
                                                                                  outputs, opset):
            continue
        folded = _folded_weights(conv, bn, constants, uses, outputs)
        if folded is None:
            continue
        w, b = folded
        inputs = [conv.input[0], add_initializer(graph, conv.input[1] + "_bn", w, taken),
                  add_initializer(graph, (conv.name or bn.output[0]) + "_bn_bias", b, taken)]
        fused = helper.make_node("Conv", inputs, [bn.output[0]], name=conv.name or bn.name)
        fused.attribute.extend(conv.attribute)
        nodes.replace([conv, bn], [fused])
    set_nodes(graph, nodes.nodes())
    return model


def _folded_weights(conv, bn, constants, uses, outputs):
    w = constants.get(conv.input[1])
    bias = constants.get(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
    if len(conv.input) > 2 and conv.input[2] and bias is None:
        return None
    affine = batchnorm_affine(bn, constants)
    if w is None or affine is None or w.dtype.kind != "f" or affine[0].size != w.shape[0]:
        return None
    scale, shift = affine
    b = np.zeros(w.shape[0]) if bias is None else bias.astype(np.float64)
    own = own_weight(constants, conv.input[1], conv, uses, outputs)  # scaled in place if so
    return scale_channels(w, scale, out=own), (b * scale + shift).astype(w.dtype)
