"""Constant folding: a node whose inputs are all constants is evaluated once, through the
reference op, and its outputs become initializers. Constant nodes become initializers too."""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from reference import ReferenceEvaluator
from reference.errors import ReferenceError_

from ._graph import Constants, copy_model, graph_output_names, set_nodes, subgraphs

# a different value on every run, so never a constant
RANDOM_OPS = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
              "Multinomial", "Bernoulli", "Dropout"}
# a folded result bigger than this would bloat the saved model more than it saves at run time
MAX_FOLDED_ELEMENTS = 1 << 22


def fold_constants(model: onnx.ModelProto, max_elements: int = MAX_FOLDED_ELEMENTS
                   ) -> onnx.ModelProto:
    model = copy_model(model)
    graph = model.graph
    constants = Constants(graph)
    outputs = graph_output_names(graph)
    kept = []
    for node in graph.node:
        folded = _fold(model, node, constants, outputs, max_elements)
        if folded is None:
            kept.append(node)
            continue
        for name, value in zip(node.output, folded):
            tensor = numpy_helper.from_array(value, name)
            graph.initializer.append(tensor)
            constants.tensors[name] = tensor
    if len(kept) < len(graph.node) and model.ir_version < 4:
        model.ir_version = 4  # before IR 4 every initializer also had to be a graph input
    set_nodes(graph, kept)
    return model


def _fold(model, node, constants, outputs, max_elements):
    """The node's output values, or None where it must stay a node."""
    if node.op_type in RANDOM_OPS or any(True for _ in subgraphs(node)):
        return None
    if any(o in outputs for o in node.output) or not all(node.output):
        return None
    if not node.input and node.op_type != "Constant":
        return None
    if not all(name in constants for name in node.input if name):
        return None
    values = {name: constants.get(name) for name in node.input if name}
    if sum(v.size for v in values.values()) > max_elements:
        return None
    if node.op_type == "ConstantOfShape" and _filled_elements(values, node) > max_elements:
        return None  # not even made once: a large fill would only be dropped again
    try:
        arrays = [np.asarray(r) for r in _evaluate(model, node, values)]
    except (ReferenceError_, TypeError, ValueError):  # the run reports it, naming the node
        return None
    if node.op_type != "Constant" and sum(a.size for a in arrays) > max_elements:
        return None  # checked before any TensorProto copy of a large result is made
    try:
        for a in arrays:
            numpy_helper.from_array(a.reshape(-1)[:0])  # a type no TensorProto holds stays a node
    except (TypeError, ValueError):
        return None
    if any(a.dtype == object for a in arrays) or len(arrays) != len(node.output):
        return None
    return arrays


def _filled_elements(values: dict, node) -> int:
    """Elements a ConstantOfShape makes (0 when its shape input is not a plain vector)."""
    shape = values.get(node.input[0]) if node.input else None
    if shape is None or shape.ndim != 1 or shape.dtype.kind not in "iu":
        return 0
    # Python integers: an int64 product could wrap past the size limit it is checked against
    return math.prod(int(d) for d in shape) if np.all(shape >= 0) else 0


def _evaluate(model, node, values):
    graph = helper.make_graph(
        [node], "fold",
        inputs=[],
        outputs=[onnx.ValueInfoProto(name=o) for o in node.output],
        initializer=[numpy_helper.from_array(v, name) for name, v in values.items()],
    )
    one_node = helper.make_model(graph, opset_imports=list(model.opset_import),
                                 functions=list(model.functions), ir_version=model.ir_version)
    return ReferenceEvaluator(one_node, check=False).run(None, {})
