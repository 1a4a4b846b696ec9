"""Runtime values: NumPy arrays, lists for sequences, dicts for maps, EMPTY for an empty optional."""
from __future__ import annotations

import numpy as np


class _EmptyOptional:
    """An optional value that holds nothing (distinct from an absent input, which is None)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "EMPTY"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self):
        return (_EmptyOptional, ())


EMPTY = _EmptyOptional()


def is_tensor(value) -> bool:
    return isinstance(value, np.ndarray)


def normalize(value):
    """NumPy scalars become 0-d arrays; containers are normalized recursively."""
    if isinstance(value, np.generic):
        return np.asarray(value)
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items()}
    return value


def describe(value) -> str:
    """Short human description: 'float32[2,3]', 'seq(3)', 'map(5)', 'optional(empty)'."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype}[{','.join(map(str, value.shape))}]"
    if isinstance(value, list):
        return f"seq({len(value)})"
    if isinstance(value, dict):
        return f"map({len(value)})"
    if value is EMPTY:
        return "optional(empty)"
    if value is None:
        return "absent"
    return type(value).__name__
