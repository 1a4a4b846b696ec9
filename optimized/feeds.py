"""Feeds converted as onnxruntime converts them, and outputs that never alias a feed.

onnxruntime takes a Python list where a tensor is expected (as an array of the input's element
type), takes str/bytes/np.void arrays and lists of str for a string input, and unwraps OrtValues.
Its outputs are new arrays: a graph output that passes an input through (or a view of it, or an
initializer) is a copy here too, so writing into a feed never changes an output.

`CheckedFeeds` lets a session skip conversion and the type check for a numpy array whose dtype
and shape already passed them for that input: both depend on nothing else.
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
    return [_owned(v, fed, seen) for v in outputs]


def _owned(value, fed: list, seen: set):
    if isinstance(value, np.ndarray):
        if id(value) in seen or not value.flags.writeable or _shares_a_feed(value, fed):
            value = value.copy()
        seen.add(id(value))
        return value
    if isinstance(value, list):
        return [_owned(v, fed, seen) for v in value]
    return value


def _shares_a_feed(value: np.ndarray, fed: list) -> bool:
    for f in fed:
        if np.may_share_memory(value, f):
            return True
    return False


class CheckedFeeds:
    """Per tensor input, the shapes a plain numpy array has passed conversion and the full
    type check with, each with that array's dtype object. `passed(feeds)` is True only when the
    feeds are exactly the required inputs, each a plain numpy array of a known shape whose dtype
    is that very object (`is` costs less than hashing a dtype; an equal dtype that is another
    object only takes the full path); anything else takes the full path, with its errors. A
    session whose required inputs are not all tensors has no table (always the full path). At
    most LIMIT shapes are kept per input (a dynamic dimension may take many)."""

    LIMIT = 64

    def __init__(self, input_infos: list):
        tensors = all(i.type.WhichOneof("value") == "tensor_type" for i in input_infos)
        self.shapes: dict[str, dict] | None = {i.name: {} for i in input_infos} if tensors else None

    def passed(self, feeds) -> bool:
        shapes = self.shapes
        if shapes is None or type(feeds) is not dict or len(feeds) != len(shapes):
            return False
        for name, value in feeds.items():
            known = shapes.get(name)
            if known is None or type(value) is not np.ndarray or known.get(value.shape) is not value.dtype:
                return False
        return True

    def remember(self, name: str, given, checked) -> None:
        """`checked` passed the full check for input `name`; kept when it is `given` itself, a
        plain numpy array (conversion changed nothing)."""
        if self.shapes is None or checked is not given or type(given) is not np.ndarray:
            return
        known = self.shapes.get(name)
        if known is None:
            return
        if len(known) >= self.LIMIT:
            known.clear()
        known[given.shape] = given.dtype
