"""Quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul,
QLinearConv, MatMulInteger, ConvInteger.

Rounding is half to even (np.rint); integer targets saturate at their limits; float targets
(float8, float6, float4) round to nearest even in the cast and, with saturate=1, clip to their
largest finite value first.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ..dtypes import is_float, np_dtype
from ..registry import op

_NATIVE_FLOATS = tuple(
    np.dtype(t) for t in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16))
# Float types with neither infinity nor NaN: they always saturate.
_FINITE_ONLY = tuple(np.dtype(t) for t in (ml_dtypes.float4_e2m1fn, ml_dtypes.float6_e2m3fn,
                                            ml_dtypes.float6_e3m2fn))


def _int_limits(dtype) -> tuple[int, int]:
    try:
        info = np.iinfo(dtype)
    except ValueError:
        info = ml_dtypes.iinfo(dtype)
    return int(info.min), int(info.max)


def _saturate_cast(v: np.ndarray, dtype, saturate: int = 1) -> np.ndarray:
    """Cast real values (already rounded for integer targets) to the quantized type."""
    dtype = np.dtype(dtype)
    if is_float(dtype):
        # ml_dtypes' plain cast gives the non-saturating column of the spec's table
        # (NaN, or inf for e5m2).
        if saturate or dtype in _FINITE_ONLY:
            hi = float(ml_dtypes.finfo(dtype).max)
            v = np.clip(v, -hi, hi)
        return v.astype(dtype)
    lo, hi = _int_limits(dtype)
    return np.clip(v, lo, hi).astype(dtype)


def _normalize_axis(axis: int, rank: int, name: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"'{name}' {axis} is out of range for a rank-{rank} input")
    return axis % rank


def _expand(param: np.ndarray, shape: tuple, axis: int, block_size: int, name: str) -> np.ndarray:
    """Broadcast a per-tensor, per-axis or blocked scale/zero point to the input's shape."""
    param = np.asarray(param)
    if block_size > 0:
        if param.ndim != len(shape):
            raise ValueError(f"blocked quantization needs '{name}' of rank {len(shape)}, "
                             f"got shape {list(param.shape)}")
        axis = _normalize_axis(axis, len(shape))
        expected = list(shape)
        expected[axis] = -(-shape[axis] // block_size)
        if list(param.shape) != expected:
            raise ValueError(f"'{name}' shape {list(param.shape)} does not fit input {list(shape)} "
                             f"with block_size={block_size} on axis {axis} (expected {expected})")
        return np.repeat(param, block_size, axis=axis).take(np.arange(shape[axis]), axis=axis)
    if param.ndim == 0 or param.size == 1 and param.ndim == 1:
        return param.reshape(())
    if param.ndim == 1:
        axis = _normalize_axis(axis, len(shape))
        if param.shape[0] != shape[axis]:
            raise ValueError(f"per-axis '{name}' has {param.shape[0]} values, axis {axis} "
                             f"of the input has {shape[axis]}")
        return param.reshape([-1 if i == axis else 1 for i in range(len(shape))])
    raise ValueError(f"'{name}' must be a scalar, a 1-D tensor or use block_size, "
                     f"got shape {list(param.shape)}")


@op("QuantizeLinear", 10)
def quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, saturate=1, block_size=0,
                    output_dtype=0, precision=0):
    """Versions 10 (per tensor), 13 (axis), 19 (saturate), 21 (block_size, output_dtype),
    23 (precision); 24, 25 and 28 only add types."""
    if output_dtype and y_zero_point is not None and np_dtype(output_dtype) != y_zero_point.dtype:
        raise ValueError(f"output_dtype {np_dtype(output_dtype)} differs from y_zero_point's "
                         f"type {y_zero_point.dtype}")
    out = (np_dtype(output_dtype) if output_dtype
           else y_zero_point.dtype if y_zero_point is not None else np.dtype(np.uint8))
    calc = np_dtype(precision) if precision else y_scale.dtype
    if calc not in _NATIVE_FLOATS:  # int32 or float8e8m0 scales divide in float32
        calc = np.dtype(np.float32)
    scale = _expand(y_scale, x.shape, axis, block_size, "y_scale").astype(calc)
    v = (x.astype(calc) / scale).astype(np.float64)
    if not is_float(out):
        v = np.rint(v)
    if y_zero_point is not None:
        v = v + _expand(y_zero_point, x.shape, axis, block_size, "y_zero_point").astype(np.float64)
    return _saturate_cast(v, out, saturate)


@op("DequantizeLinear", 10)
def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    """Versions 10 (per tensor), 13 (axis), 21 (block_size), 25 (output_dtype); others add types."""
    out = np_dtype(output_dtype) if output_dtype else x_scale.dtype
    if out not in _NATIVE_FLOATS:
        raise ValueError(f"DequantizeLinear cannot output {out}; set output_dtype")
    if x_zero_point is not None and x_zero_point.dtype != x.dtype:
        raise TypeError(f"x_zero_point of {x_zero_point.dtype} does not match x of {x.dtype}")
    v = x.astype(np.float64)
    if x_zero_point is not None:
        v = v - _expand(x_zero_point, x.shape, axis, block_size, "x_zero_point").astype(np.float64)
    # The output type is also the precision of the multiplication.
    return v.astype(out) * _expand(x_scale, x.shape, axis, block_size, "x_scale").astype(out)


@op("DynamicQuantizeLinear", 11)
def dynamic_quantize_linear(x):
    qmin, qmax = 0, 255
    if x.size == 0:
        return np.zeros(x.shape, np.uint8), np.array(0, np.float32), np.array(0, np.uint8)
    lo = np.minimum(np.float32(0), x.min())
    hi = np.maximum(np.float32(0), x.max())
    scale = np.float32((hi - lo) / np.float32(qmax - qmin))
    if scale == 0:  # all-zero input: the formulas divide 0 by 0; every value maps to 0
        return np.zeros(x.shape, np.uint8), np.array(scale), np.array(0, np.uint8)
    zero_point = np.clip(np.rint(np.float32(qmin) - lo / scale), qmin, qmax)
    y = np.clip(np.rint(x / scale) + zero_point, qmin, qmax)
    return y.astype(np.uint8), np.array(scale), np.array(zero_point.astype(np.uint8))


def _centered(q, zero_point) -> np.ndarray:
    """q - zero_point, exactly: int64 for integers, float64 for float8 inputs."""
    kind = np.int64 if not is_float(q.dtype) else np.float64
    v = q.astype(kind)
    return v if zero_point is None else v - np.asarray(zero_point).astype(kind)


def _per_row(param, a_ndim: int) -> np.ndarray:
    # A 1-D per-row parameter of a 2-D matrix [M, K] has M values; it applies along rows.
    param = np.asarray(param)
    if param.ndim == 1 and param.size > 1 and a_ndim == 2:
        return param.reshape(-1, 1)
    return param


def _matmul_exact(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a, b) if a.dtype.kind == "i" and b.dtype.kind == "i" else np.matmul(
        a.astype(np.float64), b.astype(np.float64))


@op("MatMulInteger", 10)
def matmul_integer(A, B, a_zero_point=None, b_zero_point=None):
    a = _centered(A, None if a_zero_point is None else _per_row(a_zero_point, A.ndim))
    b = _centered(B, b_zero_point)
    # Accumulation wraps in 32 bits, as the spec allows.
    return np.matmul(a, b).astype(np.int32)


@op("QLinearMatMul", 10)
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    """Version 21 adds float16/bfloat16 scales and float8 types: same formula."""
    acc = _matmul_exact(_centered(a, _per_row(a_zero_point, a.ndim)), _centered(b, b_zero_point))
    scale = (_per_row(a_scale, a.ndim).astype(np.float64) * np.asarray(b_scale, np.float64)
             / np.asarray(y_scale, np.float64))
    v = acc * scale
    if not is_float(y_zero_point.dtype):
        v = np.rint(v)
    return _saturate_cast(v + np.asarray(y_zero_point).astype(np.float64), y_zero_point.dtype)


def _scalar(v) -> np.float64:
    v = np.asarray(v, np.float64)
    if v.size != 1:
        raise ValueError(f"expected a per-tensor scale, got shape {list(v.shape)}")
    return v.reshape(())[()]


def _conv_pads(in_shape, kernel, strides, dilations, pads, auto_pad) -> list[int]:
    n = len(in_shape)
    if auto_pad in ("", "NOTSET"):
        pads = list(pads) if pads is not None else [0] * 2 * n
        if len(pads) != 2 * n:
            raise ValueError(f"'pads' needs {2 * n} values, got {pads}")
        return pads
    if auto_pad == "VALID":
        return [0] * 2 * n
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise ValueError(f"unknown auto_pad {auto_pad!r}")
    begin, end = [], []
    for size, k, s, d in zip(in_shape, kernel, strides, dilations):
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else large)
        end.append(large if auto_pad == "SAME_UPPER" else small)
    return begin + end


def _conv_exact(x, w, *, group, kernel_shape, pads, strides, dilations, auto_pad) -> np.ndarray:
    """N-D convolution of int64 (or float64) tensors by im2col, without rounding."""
    n_sp = x.ndim - 2
    kernel = list(kernel_shape) if kernel_shape is not None else list(w.shape[2:])
    if kernel != list(w.shape[2:]):
        raise ValueError(f"kernel_shape {kernel} does not match the weights' shape "
                         f"{list(w.shape[2:])}")
    strides = list(strides) if strides is not None else [1] * n_sp
    dilations = list(dilations) if dilations is not None else [1] * n_sp
    pads = _conv_pads(x.shape[2:], kernel, strides, dilations, pads, auto_pad)
    N, C = x.shape[:2]
    M = w.shape[0]
    if C != w.shape[1] * group or M % group:
        raise ValueError(f"input channels {C} and weights {list(w.shape)} do not fit group={group}")
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(pads[:n_sp], pads[n_sp:])))
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    win = np.lib.stride_tricks.sliding_window_view(xp, span, axis=tuple(range(2, x.ndim)))
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)
              + tuple(slice(None, None, d) for d in dilations)]
    out_sp = win.shape[2 : 2 + n_sp]
    # (N, G, Cg, O..., K...) -> (N, G, O, Cg*K) against weights (G, Mg, Cg*K)
    cols = win.reshape(N, group, C // group, int(np.prod(out_sp)), -1)
    cols = cols.transpose(0, 1, 3, 2, 4).reshape(N, group, int(np.prod(out_sp)), -1)
    wk = w.reshape(group, M // group, -1)
    y = np.einsum("ngok,gmk->ngmo", cols, wk)
    return y.reshape((N, M) + tuple(out_sp))


@op("ConvInteger", 10)
def conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET", dilations=None,
                 group=1, kernel_shape=None, pads=None, strides=None):
    per_channel = (-1,) + (1,) * (w.ndim - 1)
    wz = None if w_zero_point is None else np.asarray(w_zero_point).reshape(per_channel)
    y = _conv_exact(_centered(x, x_zero_point), _centered(w, wz), group=group,
                    kernel_shape=kernel_shape, pads=pads, strides=strides, dilations=dilations,
                    auto_pad=auto_pad)
    return y.astype(np.int32)


@op("QLinearConv", 10)
def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None,
                 *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                 strides=None):
    per_channel = (-1,) + (1,) * (w.ndim - 1)
    acc = _conv_exact(_centered(x, x_zero_point),
                      _centered(w, np.asarray(w_zero_point).reshape(per_channel)),
                      group=group, kernel_shape=kernel_shape, pads=pads, strides=strides,
                      dilations=dilations, auto_pad=auto_pad)
    bcast = (1, -1) + (1,) * (x.ndim - 2)
    if B is not None:
        acc = acc + B.astype(np.int64).reshape(bcast)
    w_scale = np.asarray(w_scale, np.float64).reshape(bcast if np.size(w_scale) > 1 else ())
    scale = _scalar(x_scale) * w_scale / _scalar(y_scale)
    v = np.rint(acc * scale) + np.asarray(y_zero_point).astype(np.float64)
    return _saturate_cast(v, y_zero_point.dtype)
