"""LoraAdapter: LoRA parameters read from onnxruntime's adapter file format, fed by name to a
run whose RunOptions activate the adapter (RunOptions.add_active_adapter).

The file is a FlatBuffer with the identifier "TORT" (onnxruntime's adapter_schema.fbs):
Adapter {format_version, adapter_version, model_version, parameters: [Parameter]} and
Parameter {name, dims: [int64], data_type (an ONNX element type), raw_data: [uint8]}.
"""
from __future__ import annotations

import os
import struct

import numpy as np

from reference.dtypes import np_dtype

from .errors import InvalidArgument, NoSuchFile

IDENTIFIER = b"TORT"


class LoraAdapter:
    def __init__(self):
        self.parameters: dict[str, np.ndarray] = {}
        self.format_version = self.adapter_version = self.model_version = 0

    def Load(self, file_path) -> None:
        path = os.fspath(file_path)
        if not os.path.exists(path):
            raise NoSuchFile(f"LoRA adapter file not found: {path}")
        with open(path, "rb") as f:
            data = f.read()
        try:
            self._read(data)
        except (struct.error, IndexError, ValueError) as e:
            raise InvalidArgument(f"{path} is not an onnxruntime LoRA adapter file: {e}") from e

    def _read(self, data: bytes) -> None:
        if data[4:8] != IDENTIFIER:
            raise ValueError(f"file identifier {data[4:8]!r}, expected {IDENTIFIER!r}")
        root = _Table(data, _u32(data, 0))
        self.format_version = root.int32(0)
        self.adapter_version = root.int32(1)
        self.model_version = root.int32(2)
        self.parameters = {}
        for param in root.tables(3):
            name = param.string(0)
            dims = [int(d) for d in param.vector(1, "<q")]
            dtype = np_dtype(param.int32(2))
            raw = param.bytes(3)
            self.parameters[name] = np.frombuffer(raw, dtype=dtype).reshape(dims).copy()


def adapter_feeds(run_options) -> dict:
    """The parameters of every adapter activated on these RunOptions, by name."""
    feeds: dict = {}
    for adapter in run_options.active_adapters:
        feeds.update(adapter.parameters)
    return feeds


def _u32(data: bytes, at: int) -> int:
    return struct.unpack_from("<I", data, at)[0]


class _Table:
    """One FlatBuffer table: fields found through its vtable."""

    def __init__(self, data: bytes, position: int):
        self.data, self.position = data, position
        self.vtable = position - struct.unpack_from("<i", data, position)[0]
        self.vtable_size = struct.unpack_from("<H", data, self.vtable)[0]

    def _field(self, index: int) -> int:
        entry = 4 + 2 * index
        if entry >= self.vtable_size:
            return 0
        offset = struct.unpack_from("<H", self.data, self.vtable + entry)[0]
        return self.position + offset if offset else 0

    def int32(self, index: int) -> int:
        at = self._field(index)
        return struct.unpack_from("<i", self.data, at)[0] if at else 0

    def _target(self, index: int) -> int:
        at = self._field(index)
        return at + _u32(self.data, at) if at else 0

    def bytes(self, index: int) -> bytes:
        at = self._target(index)
        if not at:
            return b""
        return self.data[at + 4: at + 4 + _u32(self.data, at)]

    def string(self, index: int) -> str:
        return self.bytes(index).decode("utf-8")

    def vector(self, index: int, fmt: str) -> tuple:
        at = self._target(index)
        if not at:
            return ()
        return struct.unpack_from(f"<{_u32(self.data, at)}{fmt[1:]}", self.data, at + 4)

    def tables(self, index: int) -> list[_Table]:
        at = self._target(index)
        if not at:
            return []
        items = [at + 4 + 4 * i for i in range(_u32(self.data, at))]
        return [_Table(self.data, item + _u32(self.data, item)) for item in items]
