"""Logical and comparison ops: And Or Xor Not, Equal Greater GreaterOrEqual Less LessOrEqual,
Where.  Comparisons return bool tensors; opset<7 forms use the legacy `broadcast`/`axis` rule.
"""
from __future__ import annotations

import numpy as np

from ..registry import op
from .math import legacy_broadcast, work


def _compare(fn, a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == object or b.dtype == object:
        return np.asarray(fn(a, b), dtype=bool)
    # narrow floats (bfloat16, float8) compare exactly after widening to float32
    return np.asarray(fn(work(a), work(b)), dtype=bool)


def _register(name, fn, legacy_since=1, since=7):
    def current(a, b):
        return _compare(fn, a, b)

    def legacy(a, b, *, broadcast=0, axis=None):
        return _compare(fn, a, legacy_broadcast(a, b, broadcast, axis))

    current.__name__ = legacy.__name__ = name.lower()
    current.__doc__ = f"{name}(A, B) elementwise with NumPy broadcasting."
    legacy.__doc__ = f"{name}(A, B) elementwise with opset<7 broadcasting."
    if legacy_since is not None:
        op(name, legacy_since)(legacy)
    op(name, since)(current)


_register("And", np.logical_and)
_register("Or", np.logical_or)
_register("Xor", np.logical_xor)
_register("Equal", np.equal)
_register("Greater", np.greater)
_register("Less", np.less)
_register("GreaterOrEqual", np.greater_equal, legacy_since=None, since=12)
_register("LessOrEqual", np.less_equal, legacy_since=None, since=12)


@op("Not", 1)
def not_(x):
    return np.logical_not(x)


@op("Where", 9)
def where(condition, x, y):
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype != y.dtype:
        raise TypeError(f"X and Y must have the same type, got {x.dtype} and {y.dtype}")
    return np.where(np.asarray(condition, dtype=bool), x, y).astype(x.dtype, copy=False)
