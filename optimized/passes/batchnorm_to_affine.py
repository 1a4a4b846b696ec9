"""An inference BatchNormalization that no Conv absorbed (DenseNet's, after a Concat) becomes
Mul and Add of per-channel constants, s = gamma / sqrt(var + eps) and t = beta - mean * s,
which the plan then fuses with the elementwise nodes around it into one pass over the data."""
from __future__ import annotations

import onnx
from onnx import helper

from ._graph import (
    Constants,
    Shapes,
    Splices,
    add_initializer,
    batchnorm_affine,
    consumers,
    copy_model,
    graph_output_names,
    is_inference_batchnorm,
    opset_version,
    set_nodes,
    taken_names,
    unique_name,
)


def batchnorm_to_affine(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    constants, shapes = Constants(graph), None
    uses, outputs = consumers(graph), graph_output_names(graph)
    opset = opset_version(model)
    if opset < 7:  # Mul and Add broadcast numpy's way only from opset 7
        return model
    nodes, taken = Splices(graph.node), taken_names(graph)
    for bn in list(graph.node):
        if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx"):
            continue
        if not is_inference_batchnorm(bn, uses, outputs, opset):
            continue
        shapes = shapes or Shapes(model)
        affine = _affine(bn, constants, shapes.rank(bn.input[0]))
        if affine is None:
            continue
        scale, shift = (add_initializer(graph, f"{bn.output[0]}_{kind}", v, taken)
                        for kind, v in zip(("bn_scale", "bn_shift"), affine))
        scaled = unique_name(graph, f"{bn.output[0]}_bn_scaled", taken)
        new = [helper.make_node("Mul", [bn.input[0], scale], [scaled], name=f"{bn.name}_scale"),
               helper.make_node("Add", [scaled, shift], [bn.output[0]], name=f"{bn.name}_shift")]
        nodes.replace([bn], new)
    set_nodes(graph, nodes.nodes())
    return model


def _affine(bn, constants, rank):
    """(s, t) shaped [C, 1, ..., 1] for an input of `rank`, in the parameters' dtype, or None."""
    affine = batchnorm_affine(bn, constants)
    dtypes = {constants.get(name).dtype for name in bn.input[1:5]} if affine else set()
    if rank is None or rank < 2 or len(dtypes) != 1:
        return None
    dtype, shape = dtypes.pop(), (-1,) + (1,) * (rank - 2)
    return tuple(v.reshape(shape).astype(dtype) for v in affine)
