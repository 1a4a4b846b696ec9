"""Reductions: Reduce*, ArgMax/ArgMin, CumSum/CumProd.

Composite reductions (L1, L2, LogSum, LogSumExp, SumSquare) still apply their elementwise
steps when noop_with_empty_axes makes the reduction itself a no-op.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import is_float
from ..registry import op


def _work_dtype(dtype: np.dtype) -> np.dtype:
    """Accumulate floats narrower than float32 (float16, bfloat16, float8) in float32."""
    if is_float(dtype) and np.dtype(dtype).itemsize < 4:
        return np.dtype(np.float32)
    return np.dtype(dtype)


def _normalize_axes(axes, rank: int, name: str = "axes") -> tuple[int, ...]:
    # A rank-0 input is treated as having the one axis 0 (= -1), which reduces nothing.
    bound = max(rank, 1)
    out = []
    for a in axes:
        a = int(a)
        if not -bound <= a < bound:
            raise ValueError(f"{name} value {a} is out of range for a rank-{rank} input")
        out.append(a % bound)
    if len(set(out)) != len(out):
        raise ValueError(f"{name} {[int(a) for a in axes]} names an axis twice")
    return tuple(out) if rank else ()


def _reduce(kernel, data, axes, keepdims, noop_with_empty_axes):
    """Apply `kernel(x, axis, keepdims)` over the axes the op's inputs and attributes name.

    `axes` is the attribute (a list) up to ReduceSum-11 / Reduce*-13 and the optional input
    from ReduceSum-13 / Reduce*-18.  Absent or empty axes mean every axis, or none at all
    when noop_with_empty_axes is set (that attribute comes with the input form).
    """
    if axes is None or np.size(axes) == 0:
        axis = () if noop_with_empty_axes else None
    else:
        axis = _normalize_axes(np.asarray(axes).reshape(-1), data.ndim)
    x = data.astype(_work_dtype(data.dtype), copy=False)
    return np.asarray(kernel(x, axis, bool(keepdims))).astype(data.dtype, copy=False)


def _sum(x, axis, keepdims):
    return np.sum(x, axis=axis, keepdims=keepdims, dtype=x.dtype)


def _extreme(x, axis, keepdims, largest: bool):
    # The reduction's identity is the result for an empty set: -inf/+inf for floats,
    # the type's min/max for integers, False/True for bool.  NaN propagates.
    if x.dtype == np.bool_:
        initial = not largest
    elif is_float(x.dtype):
        initial = -np.inf if largest else np.inf
    else:
        info = np.iinfo(x.dtype)
        initial = info.min if largest else info.max
    fn = np.max if largest else np.min
    return fn(x, axis=axis, keepdims=keepdims, initial=initial)


# The axes attribute becomes an input at ReduceSum-13 and at Reduce*-18; one function reads
# both forms, so each op is registered at 1 and again where its signature changes.


@op("ReduceSum", 1)
@op("ReduceSum", 13)
def reduce_sum(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    return _reduce(_sum, data, axes, keepdims, noop_with_empty_axes)


@op("ReduceMean", 1)
@op("ReduceMean", 18)
def reduce_mean(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    def mean(x, axis, keepdims):
        # Integer means are computed in float64, then truncated back to the input type.
        dtype = x.dtype if is_float(x.dtype) else np.float64
        return np.mean(x, axis=axis, keepdims=keepdims, dtype=dtype)

    return _reduce(mean, data, axes, keepdims, noop_with_empty_axes)


@op("ReduceProd", 1)
@op("ReduceProd", 18)
def reduce_prod(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    def prod(x, axis, keepdims):
        return np.prod(x, axis=axis, keepdims=keepdims, dtype=x.dtype)

    return _reduce(prod, data, axes, keepdims, noop_with_empty_axes)


@op("ReduceMax", 1)
@op("ReduceMax", 18)
def reduce_max(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    def max_(x, axis, keepdims):
        return _extreme(x, axis, keepdims, largest=True)

    return _reduce(max_, data, axes, keepdims, noop_with_empty_axes)


@op("ReduceMin", 1)
@op("ReduceMin", 18)
def reduce_min(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    def min_(x, axis, keepdims):
        return _extreme(x, axis, keepdims, largest=False)

    return _reduce(min_, data, axes, keepdims, noop_with_empty_axes)


@op("ReduceL1", 1)
@op("ReduceL1", 18)
def reduce_l1(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    def l1(x, axis, keepdims):
        return _sum(np.abs(x), axis, keepdims)

    return _reduce(l1, data, axes, keepdims, noop_with_empty_axes)


@op("ReduceL2", 1)
@op("ReduceL2", 18)
def reduce_l2(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    def l2(x, axis, keepdims):
        return np.sqrt(_sum(np.square(x), axis, keepdims))

    return _reduce(l2, data, axes, keepdims, noop_with_empty_axes)


@op("ReduceSumSquare", 1)
@op("ReduceSumSquare", 18)
def reduce_sum_square(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    def sum_square(x, axis, keepdims):
        return _sum(np.square(x), axis, keepdims)

    return _reduce(sum_square, data, axes, keepdims, noop_with_empty_axes)


@op("ReduceLogSum", 1)
@op("ReduceLogSum", 18)
def reduce_log_sum(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    def log_sum(x, axis, keepdims):
        with np.errstate(divide="ignore", invalid="ignore"):  # log(0) = -inf for an empty set
            return np.log(_sum(x, axis, keepdims))

    return _reduce(log_sum, data, axes, keepdims, noop_with_empty_axes)


@op("ReduceLogSumExp", 1)
@op("ReduceLogSumExp", 18)
def reduce_log_sum_exp(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
    def log_sum_exp(x, axis, keepdims):
        # Shift by the max for stability; a non-finite max (an empty set, all -inf, inf)
        # is left unshifted so that no inf - inf appears.
        m = _extreme(x, axis, True, largest=True)
        m = np.where(np.isfinite(m), m, 0).astype(x.dtype)
        s = np.sum(np.exp(x - m), axis=axis, keepdims=True, dtype=x.dtype)
        with np.errstate(divide="ignore"):
            out = np.log(s) + m
        return out if keepdims else np.squeeze(out, axis=axis)

    return _reduce(log_sum_exp, data, axes, keepdims, noop_with_empty_axes)


# ArgMax / ArgMin ----------------------------------------------------------------------
def _arg(data, axis, keepdims, select_last_index, fn):
    rank = max(data.ndim, 1)
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for a rank-{data.ndim} input")
    axis %= rank
    x = data.astype(_work_dtype(data.dtype), copy=False)
    if data.ndim == 0:
        x = x.reshape(1)
    if x.shape[axis] == 0:
        raise ValueError(f"cannot take {fn.__name__} over the empty axis {axis}")
    if select_last_index:
        idx = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis, keepdims=True)
    else:
        idx = fn(x, axis=axis, keepdims=True)
    if not keepdims:
        idx = np.squeeze(idx, axis=axis)
    return idx.astype(np.int64).reshape(idx.shape if data.ndim else ())


# select_last_index arrives at opset 12; its default is the behaviour before it.
@op("ArgMax", 1)
def argmax(data, *, axis=0, keepdims=1, select_last_index=0):
    return _arg(data, axis, keepdims, select_last_index, np.argmax)


@op("ArgMin", 1)
def argmin(data, *, axis=0, keepdims=1, select_last_index=0):
    return _arg(data, axis, keepdims, select_last_index, np.argmin)


# CumSum / CumProd ---------------------------------------------------------------------
def _cumulative(x, axis, exclusive, reverse, fn, identity):
    axis_v = np.asarray(axis)
    if axis_v.size != 1 or not np.issubdtype(axis_v.dtype, np.integer):
        raise ValueError(f"axis must be a single integer, got {axis_v.dtype}{list(axis_v.shape)}")
    a = int(axis_v.reshape(()))
    rank = max(x.ndim, 1)
    if not -rank <= a < rank:
        raise ValueError(f"axis {a} is out of range for a rank-{x.ndim} input")
    a %= rank
    work = x.astype(_work_dtype(x.dtype), copy=False).reshape(x.shape or (1,))
    if reverse:
        work = np.flip(work, a)
    out = fn(work, axis=a, dtype=work.dtype)
    if exclusive and out.shape[a]:
        # Shift by one along the axis: element j holds the result of the first j-1 elements.
        head = np.full(out.shape[:a] + (1,) + out.shape[a + 1 :], identity, out.dtype)
        body = np.take(out, np.arange(out.shape[a] - 1), axis=a)
        out = np.concatenate([head, body], axis=a)
    if reverse:
        out = np.flip(out, a)
    return out.astype(x.dtype).reshape(x.shape)


@op("CumSum", 11)
def cumsum(x, axis, *, exclusive=0, reverse=0):
    return _cumulative(x, axis, exclusive, reverse, np.cumsum, 0)


@op("CumProd", 26)
def cumprod(x, axis, *, exclusive=0, reverse=0):
    return _cumulative(x, axis, exclusive, reverse, np.cumprod, 1)
