"""Gather/scatter family and friends: Gather*, Scatter*, Compress, NonZero, OneHot, ReverseSequence."""
from __future__ import annotations

import numpy as np

from ..registry import op


def _axis(axis: int, rank: int) -> int:
    axis = int(axis)
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _index(indices, size, what: str = "indices") -> np.ndarray:
    """Indices counted from the back where negative, checked against [-size, size-1]."""
    idx = np.asarray(indices).astype(np.int64)
    if idx.size and (idx.min() < -size or idx.max() >= size):
        bad = idx[(idx < -size) | (idx >= size)].reshape(-1)[0]
        raise ValueError(f"{what} value {bad} is out of bounds for an axis of size {size}")
    return np.where(idx < 0, idx + size, idx)


def _element_index(data, indices, axis):
    """Full index tuple for the element-wise ops: position in `indices`, with `axis` replaced."""
    if indices.ndim != data.ndim:
        raise ValueError(f"indices rank {indices.ndim} != data rank {data.ndim}")
    grid = list(np.indices(indices.shape, sparse=True))
    grid[axis] = _index(indices, data.shape[axis])
    return tuple(grid)


# Gather ----------------------------------------------------------------------------------------


@op("Gather", 1)
def gather(data, indices, axis=0):
    axis = _axis(axis, data.ndim)
    return np.take(data, _index(indices, data.shape[axis]), axis=axis)


@op("GatherElements", 11)
def gather_elements(data, indices, axis=0):
    axis = _axis(axis, data.ndim)
    return data[_element_index(data, indices, axis)]


@op("GatherND", 11)
def gather_nd(data, indices, batch_dims=0):
    b = int(batch_dims)
    k = indices.shape[-1]
    if not b < min(data.ndim, indices.ndim) or data.shape[:b] != indices.shape[:b]:
        raise ValueError(f"batch_dims={b}: the first {b} dims of data {list(data.shape)} and "
                         f"indices {list(indices.shape)} must match, with b < min(ranks)")
    if not 1 <= k <= data.ndim - b:
        raise ValueError(f"indices.shape[-1]={k} must be in [1, {data.ndim - b}]")
    n = int(np.prod(data.shape[:b], dtype=np.int64))
    flat_data = data.reshape((n,) + data.shape[b:])
    flat_idx = indices.reshape((n,) + indices.shape[b:])
    batch = np.arange(n).reshape((n,) + (1,) * (flat_idx.ndim - 2))
    coords = tuple(_index(flat_idx[..., j], data.shape[b + j]) for j in range(k))
    out = flat_data[(batch,) + coords]
    return out.reshape(indices.shape[:-1] + data.shape[b + k:])


# Scatter -----------------------------------------------------------------------------------------

_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter(data, index, updates, reduction):
    out = data.copy()
    if reduction == "none":
        out[index] = updates
    elif reduction in _REDUCE:
        _REDUCE[reduction].at(out, index, updates)
    else:
        raise ValueError(f"unsupported reduction {reduction!r}")
    return out


@op("ScatterElements", 11)
def scatter_elements(data, indices, updates, axis=0, reduction="none"):
    if updates.shape != indices.shape:
        raise ValueError(f"updates shape {list(updates.shape)} != indices shape {list(indices.shape)}")
    axis = _axis(axis, data.ndim)
    return _scatter(data, _element_index(data, indices, axis), updates, reduction)


@op("Scatter", 9)
def scatter(data, indices, updates, axis=0):
    return scatter_elements(data, indices, updates, axis=axis)


@op("ScatterND", 11)
def scatter_nd(data, indices, updates, reduction="none"):
    k = indices.shape[-1]
    if k > data.ndim:
        raise ValueError(f"indices.shape[-1]={k} exceeds data rank {data.ndim}")
    expected = indices.shape[:-1] + data.shape[k:]
    if updates.shape != expected:
        raise ValueError(f"updates shape {list(updates.shape)} != expected {list(expected)}")
    index = tuple(_index(indices[..., j], data.shape[j]) for j in range(k))
    return _scatter(data, index, updates, reduction)


# Compress, NonZero, OneHot, ReverseSequence ------------------------------------------------------


@op("Compress", 9)
def compress(x, condition, axis=None):
    cond = np.asarray(condition).reshape(-1).astype(bool)
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis = _axis(axis, x.ndim)
    if cond.size > x.shape[axis]:
        if cond[x.shape[axis]:].any():
            raise ValueError(f"condition selects past the end of axis {axis} (size {x.shape[axis]})")
        cond = cond[: x.shape[axis]]
    return np.compress(cond, x, axis=axis)


@op("NonZero", 9)
def non_zero(x):
    # A scalar is taken as a 1-element vector.
    nz = np.nonzero(np.atleast_1d(x.astype(bool)))
    return np.array(nz, dtype=np.int64).reshape(len(nz), -1)


def _one_hot(indices, depth, values, axis, negative):
    d = int(np.asarray(depth).reshape(-1)[0])
    if d < 1:
        raise ValueError(f"depth must be positive, got {d}")
    vals = np.asarray(values).reshape(-1)
    if vals.size != 2:
        raise ValueError(f"values must hold [off_value, on_value], got {vals.size} elements")
    idx = np.asarray(indices).astype(np.int64)
    if negative:
        idx = np.where(idx < 0, idx + d, idx)
    axis = int(axis)
    rank = idx.ndim + 1
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for output rank {rank}")
    hot = idx[..., None] == np.arange(d)  # out-of-range indices match nothing
    out = np.where(hot, vals[1], vals[0]).astype(vals.dtype)
    return np.moveaxis(out, -1, axis)


@op("OneHot", 9)
def one_hot_9(indices, depth, values, axis=-1):
    return _one_hot(indices, depth, values, axis, negative=False)


@op("OneHot", 11)
def one_hot(indices, depth, values, axis=-1):
    return _one_hot(indices, depth, values, axis, negative=True)


@op("ReverseSequence", 10)
def reverse_sequence(x, sequence_lens, batch_axis=1, time_axis=0):
    batch_axis, time_axis = _axis(batch_axis, x.ndim), _axis(time_axis, x.ndim)
    if batch_axis == time_axis:
        raise ValueError("batch_axis and time_axis must differ")
    moved = np.moveaxis(x, (batch_axis, time_axis), (0, 1))
    n, t = moved.shape[:2]
    lens = np.asarray(sequence_lens, dtype=np.int64).reshape(-1)
    if lens.size != n or (lens.size and (lens.min() < 0 or lens.max() > t)):
        raise ValueError(f"sequence_lens {lens.tolist()} must hold {n} values in [0, {t}]")
    steps = np.arange(t)[None, :]
    src = np.where(steps < lens[:, None], lens[:, None] - 1 - steps, steps)
    out = moved[np.arange(n)[:, None], src]
    return np.moveaxis(out, (0, 1), (batch_axis, time_axis))
