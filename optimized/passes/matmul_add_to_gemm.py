"""A 2-D MatMul followed by the Add of a 1-D bias becomes one Gemm."""
from __future__ import annotations

import onnx
from onnx import helper

from ._graph import (
    FLOAT_TYPES,
    Constants,
    Shapes,
    Splices,
    consumers,
    copy_model,
    graph_output_names,
    only_reader,
    set_nodes,
)


def matmul_add_to_gemm(model: onnx.ModelProto) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    shapes, constants = Shapes(model), Constants(graph)
    uses, outputs = consumers(graph), graph_output_names(graph)
    nodes = Splices(graph.node)
    for matmul in list(graph.node):
        if matmul.op_type != "MatMul" or matmul.domain not in ("", "ai.onnx"):
            continue
        add = only_reader(uses, outputs, matmul.output[0])
        if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx"):
            continue
        bias = add.input[1] if add.input[0] == matmul.output[0] else add.input[0]
        if not _fits_gemm(matmul, bias, shapes, constants):
            continue
        gemm = helper.make_node("Gemm", [matmul.input[0], matmul.input[1], bias],
                                [add.output[0]], name=matmul.name or add.name)
        nodes.replace([matmul, add], [gemm])
    set_nodes(graph, nodes.nodes())
    return model


def _fits_gemm(matmul, bias, shapes, constants) -> bool:
    a, b = matmul.input
    if shapes.rank(a) != 2 or shapes.rank(b) != 2 or shapes.elem_type(a) not in FLOAT_TYPES:
        return False
    value = constants.get(bias)
    n = shapes.shape(b)[1]
    # a 1-D bias of N broadcasts over the rows the same way Add and Gemm's C do
    return value is not None and value.ndim == 1 and isinstance(n, int) and value.shape[0] in (
        1, n)
