"""Initializer data held outside the ModelProto, so that a runtime keeps one copy of its weights.

A WeightStore holds the large initializers of a model as read-only NumPy arrays, and the model
keeps a stub in place of each: a tensor with its name, type and shape, stored externally at
MEMORY_LOCATION under the store's token and a key. Copying such a model (every graph pass does)
copies no weights; `tensor_array` reads a stub from its store for as long as the store lives.

`read_model_file` reads a model file by walking its protobuf wire format, so that initializer
bytes go from the file into their arrays directly: the file is never held whole in memory, and
no TensorProto ever holds a large initializer's bytes.
"""
from __future__ import annotations

import io
import itertools
import math
import secrets
import sys
import weakref

import numpy as np
from google.protobuf.message import Message
from onnx import ModelProto, TensorProto, helper, numpy_helper

from .dtypes import np_dtype
from .errors import InvalidModelError

MEMORY_LOCATION = "*/onnx-parity-memory/*"
# smaller tensors (shapes, axes, scalars) stay in the model, where shape inference reads them
SMALL_TENSOR = 1024  # elements
# element types packed below a byte per element (2, 4 or 6 bits) in raw_data
_SUB_BYTE = {getattr(TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2",
                                               "FLOAT6E2M3", "FLOAT6E3M2") if hasattr(TensorProto, n)}
# 4-bit integer weights (QDQ models) are stored as their packed raw bytes, two codes a byte
_PACKED_4BIT = {TensorProto.INT4, TensorProto.UINT4}
_NOT_DETACHED = (_SUB_BYTE - _PACKED_4BIT) | {TensorProto.STRING, TensorProto.UNDEFINED}

CACHE_LINE = 64  # bytes

_DATA_FIELDS = {"raw_data", "float_data", "int32_data", "string_data", "int64_data",
                "double_data", "uint64_data"}

_STORES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_TOKENS = itertools.count()


class WeightStore:
    """Arrays by key; a model's stubs name the store by its token."""

    def __init__(self):
        self.token = f"{next(_TOKENS)}-{secrets.token_hex(16)}"  # not to be guessed
        self.arrays: dict[str, np.ndarray] = {}
        _STORES[self.token] = self

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def stub(self, tensor: TensorProto, array: np.ndarray) -> None:
        """Keep `array` as the value of `tensor`, which becomes a stub (in place)."""
        key = str(len(self.arrays))
        while key in self.arrays:
            key += "_"
        array.setflags(write=False)  # shared by every run and every model copy
        self.arrays[key] = array
        for field in _DATA_FIELDS:
            tensor.ClearField(field)
        del tensor.external_data[:]
        tensor.data_location = TensorProto.EXTERNAL
        for k, v in (("location", MEMORY_LOCATION), ("store", self.token), ("key", key)):
            entry = tensor.external_data.add()
            entry.key, entry.value = k, v

    def release(self, tensor: TensorProto) -> None:
        """Drop a stub's array at once: a pass that has replaced the tensor, while it still
        works (retain drops it only once the pass is done)."""
        if is_stub(tensor) and (entries := _stub_entries(tensor))["store"] == self.token:
            self.arrays.pop(entries["key"], None)

    def retain(self, model: ModelProto) -> None:
        """Drop the arrays that no stub of `model`'s main graph names (a pass replaced them)."""
        used = {entries["key"] for t in model.graph.initializer
                if is_stub(t) and (entries := _stub_entries(t))["store"] == self.token}
        for key in [k for k in self.arrays if k not in used]:
            del self.arrays[key]


def _stub_entries(tensor) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def is_stub(tensor: TensorProto) -> bool:
    return (tensor.data_location == TensorProto.EXTERNAL
            and any(e.key == "location" and e.value == MEMORY_LOCATION for e in tensor.external_data))


def tensor_array(tensor: TensorProto) -> np.ndarray:
    """The tensor's value: from its store for a stub (the store's own read-only array; for a
    4-bit type, its codes unpacked from the stored bytes on each call), else
    numpy_helper.to_array."""
    if not is_stub(tensor):
        raw = _raw_array(tensor)
        return numpy_helper.to_array(tensor) if raw is None else raw
    array = stored_array(tensor)
    if tensor.data_type not in _PACKED_4BIT:
        return array
    unpacked = TensorProto()
    _copy_fields(tensor, unpacked, skip={"external_data", "data_location"})
    unpacked.raw_data = array.tobytes()
    values = numpy_helper.to_array(unpacked)
    values.setflags(write=False)
    return values


# element types whose raw_data is the little-endian bytes of the numpy array
RAW_DATA_DTYPES = {helper.np_dtype_to_tensor_dtype(np.dtype(t)): np.dtype(t) for t in (
    np.float32, np.float64, np.float16, np.int8, np.int16, np.int32, np.int64, np.uint8,
    np.uint16, np.uint32, np.uint64, np.bool_)}


def _raw_array(tensor: TensorProto) -> np.ndarray | None:
    """What numpy_helper.to_array gives for a tensor of a plain numeric type held in raw_data
    (the same read-only view of its bytes, without its type lookups, which cost a session's
    creation 0.5 ms on chain100 and 1.2 ms on vit), else None."""
    dtype = RAW_DATA_DTYPES.get(tensor.data_type)
    if (dtype is None or sys.byteorder != "little" or tensor.data_location != TensorProto.DEFAULT
            or not tensor.HasField("raw_data") or tensor.HasField("segment")):
        return None
    raw, shape = tensor.raw_data, tuple(tensor.dims)
    if len(raw) != math.prod(shape) * dtype.itemsize:
        return None  # to_array's own error names the mismatch
    return np.frombuffer(raw, dtype).reshape(shape)


def stored_array(tensor: TensorProto) -> np.ndarray:
    """What a stub's store holds for it: its values, or for a 4-bit type its packed raw bytes
    (uint8), without a copy."""
    entries = _stub_entries(tensor)
    store = _STORES.get(entries.get("store", ""))
    if store is None or entries.get("key") not in store.arrays:
        raise InvalidModelError(
            f"tensor {tensor.name!r} keeps its data in a session's weight store that no longer "
            f"holds it (the session is gone, or a pass dropped the tensor); use the model the "
            f"session gives out (InferenceSession.optimized_model), which carries its weights")
    return store.arrays[entries["key"]]


def store_of(tensor: TensorProto) -> WeightStore | None:
    """The store a stub's data lives in (None for a tensor that is no stub)."""
    return _STORES.get(_stub_entries(tensor).get("store", "")) if is_stub(tensor) else None


def _array_to_store(tensor: TensorProto) -> np.ndarray | None:
    """The array a store keeps for a tensor: its values, or for a 4-bit type its packed raw
    bytes (None when they are not raw: such a tensor stays in the model)."""
    if tensor.data_type in _PACKED_4BIT:
        if not tensor.HasField("raw_data"):
            return None
        return np.frombuffer(tensor.raw_data, np.uint8).copy()
    array = numpy_helper.to_array(tensor)
    # older onnx releases widen bfloat16 and float8 to float32: such an array could not be
    # written back as the tensor's own bytes (attached), so the tensor stays in the model
    if array.dtype != np_dtype(tensor.data_type):
        return None
    # read-only down to its memory (float_data comes back as a view of a new array): a
    # constant by the flags that the optimized kernels' weight caches trust
    root = array
    while isinstance(root.base, np.ndarray):
        root.setflags(write=False)
        root = root.base
    root.setflags(write=False)
    return array


def _detachable(tensor: TensorProto) -> bool:
    if tensor.data_type in _NOT_DETACHED or tensor.data_location == TensorProto.EXTERNAL:
        return False
    if sys.byteorder != "little" or tensor.HasField("segment"):
        return False
    return math.prod(tensor.dims) > SMALL_TENSOR


def _raw_size_fits(tensor: TensorProto, size: int) -> bool:
    if tensor.data_type in _PACKED_4BIT:
        return size == (math.prod(tensor.dims) + 1) // 2
    itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return size == math.prod(tensor.dims) * itemsize


def detach_initializers(model: ModelProto, store: WeightStore) -> None:
    """Move the data of the main graph's large initializers into `store`, leaving stubs. A
    tensor whose data does not match its shape stays as it is, for the checker to name."""
    for tensor in model.graph.initializer:
        if not _detachable(tensor):
            continue
        if tensor.HasField("raw_data") and not _raw_size_fits(tensor, len(tensor.raw_data)):
            continue
        try:
            array = _array_to_store(tensor)
        except ValueError:  # data of another size than the shape: the checker names it
            continue
        if array is not None:
            store.stub(tensor, array)


def attached(model: ModelProto) -> ModelProto:
    """A copy of the model whose stubs hold their data again (to save it or give it out)."""
    copy = ModelProto()
    copy.CopyFrom(model)
    for tensor in copy.graph.initializer:
        if is_stub(tensor):
            array = stored_array(tensor)
            del tensor.external_data[:]
            tensor.ClearField("data_location")
            tensor.raw_data = array.tobytes()
    return copy


def checkable(model: ModelProto) -> ModelProto:
    """A copy for onnx's checker, which reads external data from files: each stub becomes a
    graph input of its type and shape (its data was checked against its shape when stored)."""
    if not any(is_stub(t) for t in model.graph.initializer):
        return model
    copy = ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    listed = {i.name for i in graph.input}
    kept = [t for t in graph.initializer if not is_stub(t)]
    graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                       for t in graph.initializer if is_stub(t) and t.name not in listed)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return copy


def copy_without_weights(model: ModelProto, store: WeightStore) -> ModelProto:
    """A copy of `model` whose large initializers are stubs in `store`, made without a second
    copy of the whole model (the caller's model is left as it is)."""
    copy = ModelProto()
    _copy_fields(model, copy, skip={"graph"})
    if not model.HasField("graph"):
        return copy
    _copy_fields(model.graph, copy.graph, skip={"initializer"})
    for tensor in model.graph.initializer:
        target = copy.graph.initializer.add()
        fits = not tensor.HasField("raw_data") or _raw_size_fits(tensor, len(tensor.raw_data))
        array = _array_to_store(tensor) if _detachable(tensor) and fits else None
        if array is None:
            target.CopyFrom(tensor)  # small, 4-bit and not raw, or a size mismatch the checker names
            continue
        _copy_fields(tensor, target, skip=_DATA_FIELDS)
        store.stub(target, array)
    return copy


def copy_without_initializers(model: ModelProto, dropped: set[str]) -> ModelProto:
    """A copy of `model` without the initializers named in `dropped`, which are never copied
    (a pass that replaces large weights drops them without a transient second copy)."""
    copy = ModelProto()
    _copy_fields(model, copy, skip={"graph"})
    _copy_fields(model.graph, copy.graph, skip={"initializer"})
    copy.graph.initializer.extend(t for t in model.graph.initializer if t.name not in dropped)
    return copy


def _copy_fields(src, dst, skip: set) -> None:
    for field, value in src.ListFields():
        if field.name in skip:
            continue
        if hasattr(value, "extend"):  # a repeated field
            getattr(dst, field.name).extend(value)
        elif isinstance(value, Message):
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


# reading a model file ------------------------------------------------------------------------
class _Unreadable(Exception):
    """The file is not a wire format this reader walks; onnx.load then reads it (or names why not)."""


_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9
_LENGTH_DELIMITED = 2


def _varint(f) -> int:
    result = shift = 0
    while True:
        byte = f.read(1)
        if not byte:
            raise _Unreadable("the file ends inside a varint")
        result |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return result
        shift += 7
        if shift > 63:
            raise _Unreadable("a varint longer than 10 bytes")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _fields(f, end: int):
    """(number, wire type, payload start, payload length) of each field up to `end`; the
    reader's position is the payload's start when a field is yielded."""
    while f.tell() < end:
        key = _varint(f)
        number, wire = key >> 3, key & 7
        if wire == 0:
            start = f.tell()
            _varint(f)
            length = f.tell() - start
            f.seek(start)
        elif wire == 1:
            length = 8
        elif wire == _LENGTH_DELIMITED:
            length = _varint(f)
        elif wire == 5:
            length = 4
        else:
            raise _Unreadable(f"wire type {wire}")
        start = f.tell()
        if number == 0 or start + length > end:
            raise _Unreadable("a field runs past its message")
        yield number, wire, start, length
        f.seek(start + length)


def _field_bytes(number: int, wire: int, payload: bytes) -> bytes:
    header = _encode_varint(number << 3 | wire)
    if wire == _LENGTH_DELIMITED:
        header += _encode_varint(len(payload))
    return header + payload


def _read_exactly(f, start: int, length: int) -> bytes:
    f.seek(start)
    data = f.read(length)
    if len(data) != length:
        raise _Unreadable("the file ends early")
    return data


def _read_tensor(f, start: int, length: int, store: WeightStore) -> bytes:
    """A serialized initializer: a stub when its raw data is large, read straight into an array."""
    skeleton, raw = bytearray(), None
    for number, wire, at, size in _fields(f, start + length):
        if number == _TENSOR_RAW_DATA and wire == _LENGTH_DELIMITED:
            if raw is not None:
                raise _Unreadable("raw_data given twice")
            raw = (at, size)
        else:
            skeleton += _field_bytes(number, wire, _read_exactly(f, at, size))
    tensor = TensorProto.FromString(bytes(skeleton))
    if raw is not None:
        at, size = raw
        if _detachable(tensor) and _raw_size_fits(tensor, size):
            buffer = _line_aligned_empty(size)
            f.seek(at)
            if f.readinto(memoryview(buffer)) != size:
                raise _Unreadable("the file ends early")
            # read-only down to its memory: a constant by the flags that the optimized
            # kernels' weight caches trust (the typed view below is all that stub() sees)
            buffer.setflags(write=False)
            buffer.base.setflags(write=False)
            if tensor.data_type not in _PACKED_4BIT:
                dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
                buffer = buffer.view(dtype).reshape(tuple(tensor.dims))
            store.stub(tensor, buffer)
        else:
            tensor.raw_data = _read_exactly(f, at, size)
    return tensor.SerializeToString()


def _line_aligned_empty(size: int) -> np.ndarray:
    """Uninitialised uint8 memory of `size` bytes that starts on a cache line (NumPy's large
    allocations start 16 bytes past a page): kernels that write whole lines with streaming
    stores (the QDQ pass repacks codes into a released weight's memory) need line-aligned rows."""
    memory = np.empty(size + CACHE_LINE - 1, np.uint8)
    start = -memory.ctypes.data % CACHE_LINE
    return memory[start:start + size]


def _read_graph(f, start: int, length: int, store: WeightStore) -> bytes:
    skeleton = bytearray()
    for number, wire, at, size in _fields(f, start + length):
        if number == _GRAPH_INITIALIZER and wire == _LENGTH_DELIMITED:
            payload = _read_tensor(f, at, size, store)
        else:
            payload = _read_exactly(f, at, size)
        skeleton += _field_bytes(number, wire, payload)
    return bytes(skeleton)


def read_model_file(path: str, store: WeightStore) -> ModelProto | None:
    """The model in `path`, its large main-graph initializers as stubs in `store`; None when the
    file is not a protobuf this reader walks (onnx.load then reads it, or says why it cannot)."""
    with open(path, "rb") as f:
        return _read_model(f, store)


def read_model_bytes(data: bytes, store: WeightStore) -> ModelProto | None:
    """read_model_file over a serialized model in memory: the initializers go from `data` into
    their arrays, with no parsed ModelProto holding a second copy of them meanwhile."""
    return _read_model(io.BytesIO(data), store)  # shares bytes' buffer: no copy


def _read_model(f, store: WeightStore) -> ModelProto | None:
    skeleton = bytearray()
    end = f.seek(0, 2)
    f.seek(0)
    graphs = 0
    try:
        for number, wire, at, size in _fields(f, end):
            if number == _MODEL_GRAPH and wire == _LENGTH_DELIMITED:
                graphs += 1
                if graphs > 1:
                    raise _Unreadable("two graph fields")
                payload = _read_graph(f, at, size, store)
            else:
                payload = _read_exactly(f, at, size)
            skeleton += _field_bytes(number, wire, payload)
        return ModelProto.FromString(bytes(skeleton))
    except Exception:  # noqa: BLE001 - anything odd: onnx.load reads it, or names the fault
        store.arrays.clear()
        return None


__all__ = ["MEMORY_LOCATION", "WeightStore", "attached", "checkable", "copy_without_initializers", "copy_without_weights",
           "detach_initializers", "is_stub", "read_model_bytes", "read_model_file", "store_of", "stored_array",
           "tensor_array"]
