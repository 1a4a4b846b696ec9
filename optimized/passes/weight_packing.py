"""Weight packing (level 99): a MatMul whose B is a large constant float32 matrix and whose A
has a fixed number of rows in the packed GEMM's range becomes
`onnx_parity.fused::PackedMatMul(A, B_panels)`, where B_panels holds B once, already in the
panels that csrc/gemm_packed.c reads (shape (n / 16, k, 16): panel p is columns 16p .. 16p+15,
row after row).  The original B leaves the model and the weight store as soon as it is packed,
so a session holds each such weight once (as onnxruntime drops an initializer it has
prepacked), not the initializer and its packed copy beside it.

PackedMatMul is a model-local function whose body unpacks the panels with Transpose and
Flatten (a copy, bit for bit) and multiplies, so the rewritten model stays valid ONNX that any
runtime, the reference evaluator and check mode run with B's exact values; the CPU provider
runs it as the packed GEMM straight over the panels.

Only a B that every reader takes this way is packed: read by another node, as A, by a
subgraph, or with a row count of A that is unknown or outside the range (a decoder's growing
sequence, a single row that the GEMV takes from B as it is), it stays as it is.  n must be a
multiple of 16 (no padded panel), which every transformer width is.
"""
from __future__ import annotations

import math

import onnx
from onnx import helper

from reference.weights import WeightStore, is_stub, tensor_array

from ._graph import (
    FUSED_DOMAIN,
    Shapes,
    add_fused_functions,
    consumers,
    copy_model,
    graph_output_names,
    initializer,
    opset_version,
    set_nodes,
    taken_names,
    unique_name,
)

PACKED_MATMUL = "PackedMatMul"
PANEL_COLS = 16


def pack_matmul_weights(model: onnx.ModelProto, store: WeightStore | None = None) -> onnx.ModelProto:
    from .. import kernels
    from ..cpu import GEMV_ROWS_UP_TO, PACKED_GEMM_ROWS_UP_TO

    rows_range = range(GEMV_ROWS_UP_TO + 1, PACKED_GEMM_ROWS_UP_TO + 1)
    graph = model.graph
    weights = {t.name: t for t in graph.initializer
               if is_stub(t) and t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2
               and t.dims[1] % PANEL_COLS == 0 and t.dims[0] > 0 and t.dims[1] > 0}
    if not weights:
        return model
    shapes, uses, outputs = Shapes(model), consumers(graph), graph_output_names(graph)
    inputs = {i.name for i in graph.input}
    packable = [name for name in weights
                if name not in outputs and name not in inputs
                and _every_reader_packs(uses.get(name, []), name, shapes, rows_range)]
    if not packable:
        return model
    model = copy_model(model)
    graph = model.graph
    taken = taken_names(graph)
    by_name = {t.name: t for t in graph.initializer}
    panels_of: dict[str, str] = {}
    for name in packable:  # packed and its original dropped one at a time: one weight's peak
        original = by_name[name]
        panels = kernels.pack_b_panels(tensor_array(original))
        panels_name = unique_name(graph, f"{name}_panels", taken)
        graph.initializer.append(initializer(panels_name, panels))
        if store is not None:
            store.release(original)
        panels_of[name] = panels_name
    kept = [t for t in graph.initializer if t.name not in panels_of]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = []
    for node in graph.node:
        if node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and node.input[1] in panels_of:
            node = helper.make_node(PACKED_MATMUL, [node.input[0], panels_of[node.input[1]]],
                                    list(node.output), name=node.name, domain=FUSED_DOMAIN)
        nodes.append(node)
    set_nodes(graph, nodes)
    opset = opset_version(model)
    add_fused_functions(model, [PACKED_MATMUL], lambda _: packed_matmul_function(opset))
    return model


def packed_matmul_function(opset: int) -> onnx.FunctionProto:
    """PackedMatMul(A, B_panels) = MatMul(A, B), B = Flatten(Transpose(B_panels, [1, 0, 2]))."""
    body = [helper.make_node("Transpose", ["B_panels"], ["rows"], perm=[1, 0, 2]),
            helper.make_node("Flatten", ["rows"], ["B"], axis=1),
            helper.make_node("MatMul", ["A", "B"], ["Y"])]
    return helper.make_function(FUSED_DOMAIN, PACKED_MATMUL, ["A", "B_panels"], ["Y"], body,
                                [helper.make_opsetid("", opset)])


def _every_reader_packs(readers, name, shapes, rows_range) -> bool:
    """Every reader of weight `name` is a MatMul taking it as B, A float32 with a fixed number
    of rows in the packed GEMM's range."""
    if not readers:
        return False
    for node in readers:
        if (node.op_type != "MatMul" or node.domain not in ("", "ai.onnx")
                or len(node.input) != 2 or node.input[1] != name or node.input[0] == name):
            return False
        a = node.input[0]
        shape = shapes.shape(a)
        if shapes.elem_type(a) != onnx.TensorProto.FLOAT or not shape or len(shape) < 2:
            return False
        if not all(isinstance(d, int) and d > 0 for d in shape):
            return False
        if math.prod(shape[:-1]) not in rows_range:
            return False
    return True

