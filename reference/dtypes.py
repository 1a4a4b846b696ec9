"""ONNX element types <-> NumPy dtypes (ml_dtypes for bfloat16, float8, int4, float4)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper

STRING = np.dtype(object)


def np_dtype(elem_type: int) -> np.dtype:
    """NumPy dtype for an ONNX TensorProto element type."""
    if elem_type == TensorProto.STRING:
        return STRING
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError) as e:
        raise ValueError(f"unsupported ONNX element type {elem_type}") from e


def onnx_type(dtype) -> int:
    """ONNX element type for a NumPy dtype (object means string)."""
    dtype = np.dtype(dtype)
    if dtype == STRING or dtype.kind in "US":
        return TensorProto.STRING
    return helper.np_dtype_to_tensor_dtype(dtype)


def type_name(elem_type: int) -> str:
    return TensorProto.DataType.Name(elem_type).lower()


FLOAT8_TYPES = tuple(
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
    )
)
INT4_TYPES = (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4))


def is_float(dtype) -> bool:
    """True for every floating type, the ml_dtypes ones included."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return True
    try:
        ml_dtypes.finfo(dtype)
        return True
    except (TypeError, ValueError):
        return False


def is_integer(dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype.kind in "iu" or dtype in INT4_TYPES
