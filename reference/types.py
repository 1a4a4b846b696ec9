"""Type checks between runtime values and ONNX TypeProtos."""
from __future__ import annotations

import numpy as np
from onnx import TypeProto, helper

from .dtypes import np_dtype, onnx_type, type_name
from .errors import InvalidFeedError
from .values import EMPTY


def value_type_proto(value) -> TypeProto:
    if isinstance(value, np.ndarray):
        return helper.make_tensor_type_proto(onnx_type(value.dtype), list(value.shape))
    if isinstance(value, list):
        elem = value_type_proto(value[0]) if value else helper.make_tensor_type_proto(1, None)
        return helper.make_sequence_type_proto(elem)
    raise TypeError(f"cannot describe {type(value).__name__} as an ONNX type")


def describe_type(tp: TypeProto) -> str:
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({type_name(tp.tensor_type.elem_type)})"
    if kind == "sequence_type":
        return f"seq({describe_type(tp.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({describe_type(tp.optional_type.elem_type)})"
    if kind == "map_type":
        return f"map({type_name(tp.map_type.key_type)},{describe_type(tp.map_type.value_type)})"
    if kind == "sparse_tensor_type":
        return f"sparse_tensor({type_name(tp.sparse_tensor_type.elem_type)})"
    return "unknown"


def check_value(tp: TypeProto, value, what: str) -> None:
    """Raise InvalidFeedError if `value` does not fit `tp`; `what` names the value."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        if not isinstance(value, np.ndarray):
            raise InvalidFeedError(f"{what}: expected {describe_type(tp)}, got {type(value).__name__}")
        tt = tp.tensor_type
        strings = tt.elem_type == 8 and value.dtype.kind in "OUS"
        if tt.elem_type and np_dtype(tt.elem_type) != value.dtype and not strings:
            raise InvalidFeedError(
                f"{what}: expected {describe_type(tp)}, got an array of {value.dtype}"
            )
        if tt.HasField("shape"):
            dims = tt.shape.dim
            if len(dims) != value.ndim:
                raise InvalidFeedError(
                    f"{what}: expected rank {len(dims)}, got shape {list(value.shape)}"
                )
            for axis, (dim, size) in enumerate(zip(dims, value.shape)):
                if dim.HasField("dim_value") and dim.dim_value != size:
                    raise InvalidFeedError(
                        f"{what}: dimension {axis} must be {dim.dim_value}, got shape {list(value.shape)}"
                    )
    elif kind == "sequence_type":
        if not isinstance(value, list):
            raise InvalidFeedError(f"{what}: expected {describe_type(tp)}, got {type(value).__name__}")
        for i, item in enumerate(value):
            check_value(tp.sequence_type.elem_type, item, f"{what}[{i}]")
    elif kind == "optional_type":
        if value is not EMPTY and value is not None:
            check_value(tp.optional_type.elem_type, value, what)
    elif kind == "map_type" and not isinstance(value, dict):
        raise InvalidFeedError(f"{what}: expected {describe_type(tp)}, got {type(value).__name__}")


def check_feed(value_info, value) -> None:
    check_value(value_info.type, value, f"input {value_info.name!r}")
