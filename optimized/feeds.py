"""Feeds converted as onnxruntime converts them, and outputs that never alias a feed.

onnxruntime takes a Python list where a tensor is expected (as an array of the input's element
type), takes str/bytes/np.void arrays and lists of str for a string input, and unwraps OrtValues.
Its outputs are new arrays: a graph output that passes an input through (or a view of it, or an
initializer) is a copy here too, so writing into a feed never changes an output.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from reference.dtypes import np_dtype

from .ortvalue import OrtValue


def convert(type_proto, value):
    if isinstance(value, OrtValue):
        value = value.value()
    if isinstance(value, np.generic):
        value = np.asarray(value)
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        return _tensor(type_proto.tensor_type.elem_type, value)
    if kind == "sequence_type" and isinstance(value, list):
        return [convert(type_proto.sequence_type.elem_type, v) for v in value]
    if kind == "optional_type" and value is not None:
        return convert(type_proto.optional_type.elem_type, value)
    return value


def _tensor(elem_type: int, value):
    if elem_type == TensorProto.STRING:
        if isinstance(value, (list, tuple)):
            return as_strings(np.array(value, dtype=object))
        if isinstance(value, np.ndarray) and value.dtype.kind in "USV":
            return as_strings(value)
        return value
    if isinstance(value, (list, tuple)) and elem_type:
        return np.array(value, dtype=np_dtype(elem_type))
    return value


def as_strings(array: np.ndarray) -> np.ndarray:
    """An object array of str: bytes and np.void items decoded as UTF-8, others through str()."""
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(array.reshape(-1)):
        flat[i] = _text(item)
    return out


def _text(item) -> str:
    if isinstance(item, np.void):
        item = bytes(item)
    if isinstance(item, (bytes, bytearray)):
        return bytes(item).decode("utf-8", errors="surrogateescape")
    return item if type(item) is str else str(item)


def unshared_outputs(outputs: list, feeds: dict) -> list:
    """Each output that is (a view of) a feed, read-only (an initializer) or another output's
    very object, copied."""
    fed = [v for v in feeds.values() if isinstance(v, np.ndarray)]
    seen: set[int] = set()

    def own(value):
        if isinstance(value, list):
            return [own(v) for v in value]
        if not isinstance(value, np.ndarray):
            return value
        if (id(value) in seen or not value.flags.writeable
                or any(np.may_share_memory(value, f) for f in fed)):
            value = value.copy()
        seen.add(id(value))
        return value

    return [own(v) for v in outputs]
