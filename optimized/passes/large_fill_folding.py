"""Large constant fills folded into a session's weight store.

Constant folding leaves a ConstantOfShape whose fill is larger than its size limit as a node,
so that a model saved by `optimize` does not grow by the fill. In a session that node ran on
every run: light_vgg19's 25088x4096 and 4096x4096 Gemm weights are such fills (480 MB made per
run), and the Gemms read weights that were no constants. Here, when a WeightStore holds the
session's weights, the fill is made once, straight into the store (no TensorProto copy of it
is ever made), and the node becomes a stub initializer that every later pass and the plan read
as a constant. Without a store the model is returned unchanged.
"""
from __future__ import annotations

import functools
import math
import sys

import numpy as np
import onnx
from onnx import TensorProto

from reference.dtypes import np_dtype
from reference.weights import WeightStore

from ._graph import Constants, copy_model, graph_output_names, set_nodes, tensor_values

# a fill this large is made once per session instead of on every run (constant folding's own
# limit decides the smaller ones)
MIN_FILL_ELEMENTS = 1 << 22
# a fill past this stays a node: a session saving its optimized model (optimized_model_filepath)
# writes the fill into it, and onnx.save stops at protobuf's 2 GiB
MAX_FILL_BYTES = 1 << 30
# types whose TensorProto packs several elements a byte: a store keeps (4-bit) such tensors as
# their packed bytes, not as one element a byte as numpy's array holds them, so they stay nodes
PACKED_TYPES = {getattr(TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2",
                                                   "FLOAT6E2M3", "FLOAT6E3M2")
                if hasattr(TensorProto, n)}


def fold_large_fills(model: onnx.ModelProto, store: WeightStore | None = None
                     ) -> onnx.ModelProto:
    if store is None:
        return model
    fills = {}
    constants = Constants(model.graph)
    outputs = graph_output_names(model.graph)
    for i, node in enumerate(model.graph.node):
        fill = _fill(node, constants, outputs)
        if fill is not None:
            fills[i] = fill
    if not fills:
        return model
    model = copy_model(model)
    graph = model.graph
    for i in sorted(fills):
        shape, value, data_type = fills[i]
        name = graph.node[i].output[0]
        tensor = TensorProto(name=name, data_type=data_type, dims=shape)
        store.stub(tensor, np.full(shape, value, value.dtype))
        graph.initializer.append(tensor)
    # before IR 4 every initializer also had to be a graph input
    model.ir_version = max(model.ir_version, 4)
    set_nodes(graph, [n for i, n in enumerate(graph.node) if i not in fills])
    return model


def _fill(node, constants: Constants, outputs: set[str]):
    """(shape, one-element value) of a large ConstantOfShape over a constant shape, else None."""
    if len(node.output) != 1 or not node.output[0] or node.output[0] in outputs:
        return None
    fill = constant_fill(node, constants)
    if fill is None or math.prod(fill[0]) < MIN_FILL_ELEMENTS:
        return None
    shape, value, data_type = fill
    if math.prod(shape) * value.dtype.itemsize > MAX_FILL_BYTES:
        return None
    return shape, value, data_type


def constant_fill(node, constants: Constants):
    """(shape, value as a 0-d array, its tensor type) of a ConstantOfShape whose shape is a
    constant vector of int64 sizes and whose value is one element of its own type (float32 0
    by default), else None (the run then judges the node)."""
    if node.op_type != "ConstantOfShape" or node.domain not in ("", "ai.onnx"):
        return None
    if not node.input or not node.input[0] or node.input[0] not in constants:
        return None
    sizes = _sizes(constants, node.input[0])
    if sizes is None:
        return None
    if any(d < 0 for d in sizes):
        return None  # the run reports a bad shape, naming the node
    value, data_type = _value(node)
    if value is None:
        return None
    return sizes, value, data_type


def _sizes(constants: Constants, name: str) -> list[int] | None:
    """A constant int64 vector as Python ints (numpy's reductions cost more than the rest on a
    vector of a few sizes), read from its raw bytes where it has them (a light model's
    hundreds of fill shapes each cost a numpy copy of the tensor), else None."""
    tensor = constants.tensors[name]
    if (tensor.data_type == TensorProto.INT64 and len(tensor.dims) == 1
            and tensor.data_location == TensorProto.DEFAULT and tensor.HasField("raw_data")
            and sys.byteorder == "little" and len(tensor.raw_data) == 8 * tensor.dims[0]):
        return np.frombuffer(tensor.raw_data, np.int64).tolist()
    shape = constants.get(name)
    if shape.ndim != 1 or shape.dtype != np.int64:
        return None
    return shape.tolist()


# a one-element tensor's value in a typed field: numpy reads a protobuf field element by element
# through the sequence protocol, which cost each fill of a light model 10 us
_ONE_TYPED = {TensorProto.FLOAT: ("float_data", np.float32),
              TensorProto.DOUBLE: ("double_data", np.float64),
              TensorProto.INT64: ("int64_data", np.int64)}


def _one_typed_value(tensor):
    """A one-element FLOAT, DOUBLE or INT64 tensor's value from its typed field, as a 0-d
    array, else None."""
    typed = _ONE_TYPED.get(tensor.data_type)
    if (typed is None or tensor.data_location != TensorProto.DEFAULT
            or tensor.HasField("raw_data") or tensor.HasField("segment")
            or math.prod(tensor.dims) != 1):
        return None
    values = getattr(tensor, typed[0])
    return np.array(values[0], typed[1]) if len(values) == 1 else None


# asked once per element type: each fill's value asked it again (a light model has hundreds)
_dtype_of = functools.lru_cache(maxsize=None)(np_dtype)


def _value(node):
    """(the fill value as a 0-d array, its tensor type): float32 0 by default; (None, None)
    for a value the run should judge (not one element, or not held as its own type)."""
    for a in node.attribute:
        if a.name == "value":
            if (a.type != onnx.AttributeProto.TENSOR or a.t.data_type == TensorProto.STRING
                    or a.t.data_type in PACKED_TYPES):
                return None, None
            one = _one_typed_value(a.t)
            if one is not None:
                return one, a.t.data_type
            try:
                value = tensor_values(a.t)
                same_type = value.dtype == _dtype_of(a.t.data_type)
            except (TypeError, ValueError, KeyError):
                return None, None
            if value.size != 1 or not same_type:
                return None, None
            return value.reshape(()), a.t.data_type
    return np.zeros((), np.float32), TensorProto.FLOAT
