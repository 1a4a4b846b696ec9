"""What one execution produced: a summary per value, with the tensors kept apart in a store."""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field

import numpy as np

from reference.values import describe


@dataclass
class Record:
    """One value of one execution. `key` is (path, name): unique within a run, because names
    are unique per graph and `path` tells subgraph bodies and loop iterations apart."""

    index: int
    name: str
    kind: str  # initializer, input, result, output
    path: tuple = ()
    type: str = ""  # "float32[1,3]", "seq(2)", ...
    dtype: str = ""
    shape: tuple | None = None
    op_type: str = ""
    node_name: str = ""
    node: object = None  # the NodeProto that produced a result, when the side knows it
    signature: tuple = ()
    is_output: bool = False

    @property
    def key(self) -> tuple:
        return (self.path, self.name)

    @property
    def where(self) -> str:
        return "/".join(self.path)


def signature(value) -> tuple:
    """A few numbers that tell values of the same type apart: mean and spread of the finite part."""
    if not isinstance(value, np.ndarray) or value.size == 0 or value.dtype.kind in "OUSVc":
        return ()
    try:
        mean = float(np.mean(value, dtype=np.float64))
        if not np.isfinite(mean):
            x = value.astype(np.float64).reshape(-1)
            x = x[np.isfinite(x)]
            if x.size == 0:
                return ()
            return (float(x.mean()), float(x.std()))
        return (mean, float(np.std(value, dtype=np.float64)))
    except (TypeError, ValueError):
        return ()


def make_record(index, name, kind, value, path=(), node=None) -> Record:
    is_array = isinstance(value, np.ndarray)
    return Record(
        index=index, name=name, kind=kind, path=tuple(path), type=describe(value),
        dtype=str(value.dtype) if is_array else "", shape=tuple(value.shape) if is_array else None,
        op_type=node.op_type if node is not None else "", node_name=node.name if node is not None else "",
        node=node, signature=signature(value))


class ValueStore:
    """Tensors by record key: in memory, or spilled to a temporary folder so that a large model
    does not hold every intermediate in memory at once."""

    def __init__(self, spill: bool = False):
        self._memory: dict = {}
        self._files: dict = {}
        self._dir = tempfile.mkdtemp(prefix="onnx-parity-diff-") if spill else None

    def put(self, key, value) -> None:
        if self._dir is not None and isinstance(value, np.ndarray) and value.dtype.kind != "O":
            path = os.path.join(self._dir, f"{len(self._files)}.npy")
            np.save(path, value)
            self._files[key] = (path, value.dtype)
        else:
            self._memory[key] = value

    def __contains__(self, key) -> bool:
        return key in self._memory or key in self._files

    def get(self, key, default=None):
        if key in self._memory:
            return self._memory[key]
        if key in self._files:
            path, dtype = self._files[key]
            value = np.load(path, allow_pickle=False)
            return value.view(dtype) if value.dtype != dtype else value
        return default

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._files.clear()


@dataclass
class Capture:
    """The records of one run in the order produced, a key -> record map, and the value store."""

    label: str
    records: list = field(default_factory=list)
    by_key: dict = field(default_factory=dict)
    store: ValueStore | None = None

    def add(self, name, kind, value, path=(), node=None, keep_value=True):
        """Add a value; a graph output that was already produced as a result only marks it."""
        key = (tuple(path), name)
        if kind == "output" and key in self.by_key:
            self.by_key[key].is_output = True
            return self.by_key[key]
        rec = make_record(len(self.records), name, kind, value, path, node)
        rec.is_output = kind == "output"
        self.records.append(rec)
        self.by_key[key] = rec
        if keep_value and self.store is not None:
            self.store.put(key, value)
        return rec

    def value(self, key):
        return self.store.get(key) if self.store is not None else None

    def find(self, name: str, path: tuple):
        """The record that `name` refers to from inside `path`: the innermost enclosing scope."""
        path = tuple(path)
        while True:
            rec = self.by_key.get((path, name))
            if rec is not None:
                return rec
            if not path:
                return None
            path = path[:-1]
