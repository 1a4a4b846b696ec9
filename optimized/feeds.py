"""Feeds converted as onnxruntime converts them, and outputs that never alias a feed.

onnxruntime takes a Python list where a tensor is expected (as an array of the input's element
type), takes str/bytes/np.void arrays and lists of str for a string input, and unwraps OrtValues.
Its outputs are new arrays: a graph output that passes an input through (or a view of it, or an
initializer) is a copy here too, so writing into a feed never changes an output.

`CheckedFeeds` lets a session skip conversion and the full type check for feeds that are plain
numpy arrays of each input's dtype, rank and static dimensions.
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
    fed = _Fed([v for v in feeds.values() if isinstance(v, np.ndarray)])
    seen: set[int] = set()
    return [_owned(v, fed, seen) for v in outputs]


def _root(a: np.ndarray) -> np.ndarray:
    """The array at the end of a's chain of ndarray bases (a itself when it has none)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class _Fed:
    """The feeds, grouped by the numpy allocation they view, so that an output checks with
    np.may_share_memory only the feeds that could share its memory: two arrays whose roots
    are distinct arrays that each own their data lie in distinct allocations.  A feed or an
    output over memory numpy does not own (a buffer, another library's) is checked against
    everything, as before."""

    def __init__(self, fed: list):
        self.by_root: dict[int, list] = {}
        self.foreign: list = []
        self.all = fed
        for f in fed:
            root = _root(f)
            if root.flags.owndata:
                self.by_root.setdefault(id(root), []).append(f)
            else:
                self.foreign.append(f)

    def shared_by(self, value: np.ndarray) -> bool:
        root = _root(value)
        if root.flags.owndata:
            candidates = self.by_root.get(id(root), ()), self.foreign
        else:
            candidates = (self.all,)
        return any(np.may_share_memory(value, f) for group in candidates for f in group)


def _owned(value, fed: _Fed, seen: set):
    if isinstance(value, np.ndarray):
        if id(value) in seen or not value.flags.writeable or fed.shared_by(value):
            value = value.copy()
        seen.add(id(value))
        return value
    if isinstance(value, list):
        return [_owned(v, fed, seen) for v in value]
    return value


class CheckedFeeds:
    """Each required input's expected dtype object, rank and static dimensions, worked out once
    from its type, so that feeds needing neither conversion nor more than that check pass
    quickly. `passed(feeds)` is True only when the feeds are exactly the required inputs, each a
    plain numpy array whose dtype is the expected object itself (`is` costs less than comparing
    dtypes; an equal dtype that is another object takes the full path) and whose shape has the
    rank and static dimensions of the input's type: what the full check would accept, with
    nothing to convert. Anything else takes the full path, with its errors. A session with an
    input that is not a tensor of a known element type has no table (always the full path)."""

    def __init__(self, input_infos: list):
        expected = [_expected_tensor(i.type) for i in input_infos]
        if any(e is None for e in expected):
            self.expected = None
        else:
            self.expected = {i.name: e for i, e in zip(input_infos, expected)}

    def passed(self, feeds) -> bool:
        expected = self.expected
        if expected is None or type(feeds) is not dict or len(feeds) != len(expected):
            return False
        for name, value in feeds.items():
            wanted = expected.get(name)
            if wanted is None or type(value) is not np.ndarray:
                return False
            dtype, rank, static = wanted
            if value.dtype is not dtype:
                return False
            if rank is not None:
                shape = value.shape
                if len(shape) != rank:
                    return False
                for axis, size in static:
                    if shape[axis] != size:
                        return False
        return True


def _expected_tensor(type_proto):
    """(dtype, rank, ((axis, size), ...)) of a tensor type, rank None where it has no shape;
    None for a type that is not a tensor of a known element type."""
    if type_proto.WhichOneof("value") != "tensor_type" or not type_proto.tensor_type.elem_type:
        return None
    tensor = type_proto.tensor_type
    try:
        dtype = np_dtype(tensor.elem_type)
    except ValueError:
        return None
    if not tensor.HasField("shape"):
        return dtype, None, ()
    dims = tensor.shape.dim
    static = tuple((axis, d.dim_value) for axis, d in enumerate(dims) if d.HasField("dim_value"))
    return dtype, len(dims), static
