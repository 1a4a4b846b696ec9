"""An inference BatchNormalization that no Conv absorbed (DenseNet's, after a Concat) becomes
Mul and Add of per-channel constants, s = gamma / sqrt(var + eps) and t = beta - mean * s,
which the plan then fuses with the elementwise nodes around it into one pass over the data."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ._graph import (
    Constants,
    Shapes,
    add_initializer,
    attr,
    consumers,
    copy_model,
    graph_output_names,
    is_inference_batchnorm,
    opset_version,
    set_nodes,
    splice,
)


def batchnorm_to_affine(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    constants, shapes = Constants(graph), None
    uses, outputs = consumers(graph), graph_output_names(graph)
    opset = opset_version(model)
    if opset < 7:  # Mul and Add broadcast numpy's way only from opset 7
        return model
    nodes = list(graph.node)
    for bn in list(nodes):
        if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx"):
            continue
        if not is_inference_batchnorm(bn, uses, outputs, opset):
            continue
        shapes = shapes or Shapes(model)
        affine = _affine(bn, constants, shapes.rank(bn.input[0]))
        if affine is None:
            continue
        scale, shift = (add_initializer(graph, f"{bn.output[0]}_{kind}", v)
                        for kind, v in zip(("bn_scale", "bn_shift"), affine))
        scaled = f"{bn.output[0]}_bn_scaled"
        new = [helper.make_node("Mul", [bn.input[0], scale], [scaled], name=f"{bn.name}_scale"),
               helper.make_node("Add", [scaled, shift], [bn.output[0]], name=f"{bn.name}_shift")]
        nodes = splice(nodes, [bn], new)
    set_nodes(graph, nodes)
    return model


def _affine(bn, constants, rank):
    """(s, t) shaped [C, 1, ..., 1] for an input of `rank`, or None."""
    params = [constants.get(name) for name in bn.input[1:5]]
    if rank is None or rank < 2 or any(p is None or p.dtype.kind != "f" for p in params):
        return None
    dtype = params[0].dtype
    if any(p.dtype != dtype for p in params):
        return None
    gamma, beta, mean, var = (p.astype(np.float64).reshape(-1) for p in params)
    if len({p.size for p in (gamma, beta, mean, var)}) != 1:
        return None
    s = gamma / np.sqrt(var + attr(bn, "epsilon", 1e-5))
    t = beta - mean * s
    shape = (-1,) + (1,) * (rank - 2)
    return s.reshape(shape).astype(dtype), t.reshape(shape).astype(dtype)
