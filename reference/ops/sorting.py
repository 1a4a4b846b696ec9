"""Sorting and selection: TopK, Unique."""
from __future__ import annotations

import numpy as np

from ..dtypes import is_float
from ..registry import op


def _sort_key(x: np.ndarray) -> np.ndarray:
    """An array with the same order as x that NumPy sorts natively (float16/bfloat16 widened)."""
    if is_float(x.dtype) and x.dtype.itemsize < 4:
        return x.astype(np.float32)
    return x


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for a rank-{rank} input")
    return axis % rank


def _topk(x, k, axis, largest):
    if x.ndim == 0:
        raise ValueError("TopK input must have rank >= 1")
    axis = _axis(axis, x.ndim)
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise ValueError(f"k = {k} must be in [0, {n}] (the size of axis {axis})")
    key = _sort_key(x)
    if largest:
        # A stable ascending sort of the reversed axis, read backwards, is descending with
        # ties in ascending index order.  NaN sorts as the largest value.
        order = np.argsort(np.flip(key, axis), axis=axis, kind="stable")
        order = (n - 1 - np.flip(order, axis))
    else:
        order = np.argsort(key, axis=axis, kind="stable")
    indices = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, indices, axis=axis), indices.astype(np.int64)


@op("TopK", 1)
def topk_1(x, *, k, axis=-1):
    return _topk(x, k, axis, largest=True)


@op("TopK", 10)
def topk(x, k, *, axis=-1, largest=1, sorted=1):
    # largest and sorted arrive at opset 11; their defaults are the opset-10 behaviour.
    # sorted=0 leaves the order unspecified, so the sorted order is returned either way.
    k = np.asarray(k)
    if k.size != 1:
        raise ValueError(f"K must hold a single value, got shape {list(k.shape)}")
    return _topk(x, int(k.reshape(())), axis, bool(largest))


@op("Unique", 11)
def unique(x, *, axis=None, sorted=1):
    if axis is None:
        data, axis = x.reshape(-1), 0
    else:
        axis = _axis(axis, x.ndim)
        data = x
    n = data.shape[axis]
    rows = np.moveaxis(data, axis, 0).reshape(n, data.size // n if n else 0)
    # Replace values by their rank among all values, so that rows of any element type
    # (strings, bfloat16, complex) compare as rows of int64.
    _, codes = np.unique(_sort_key(rows).reshape(-1), return_inverse=True)
    codes = codes.reshape(rows.shape)
    if rows.shape[1] == 0:  # subtensors with no elements are all equal
        codes = np.zeros((n, 1), dtype=np.int64)
    _, indices, inverse, counts = np.unique(
        codes, axis=0, return_index=True, return_inverse=True, return_counts=True
    )
    inverse = inverse.reshape(-1)
    if not sorted:
        # First-occurrence order: sort the unique rows by where they first appear.
        order = np.argsort(indices, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        indices, counts, inverse = indices[order], counts[order], rank[inverse]
    y = np.take(data, indices, axis=axis)
    return y, indices.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)
