"""Linear algebra: MatMul, Gemm, Einsum, Det."""
from __future__ import annotations

import re

import numpy as np

from ..dtypes import is_float
from ..registry import op


def _work_dtype(dtype) -> np.dtype:
    """Compute floats narrower than float32 (float16, bfloat16) in float32."""
    if is_float(dtype) and np.dtype(dtype).itemsize < 4:
        return np.dtype(np.float32)
    return np.dtype(dtype)


def _same_dtype(name: str, *arrays) -> np.dtype:
    dtypes = {a.dtype for a in arrays if a is not None}
    if len(dtypes) != 1:
        got = sorted(map(str, dtypes))
        raise TypeError(f"{name} inputs must share one element type, got {got}")
    return dtypes.pop()


@op("MatMul", 1)
def matmul(a, b):
    dtype = _same_dtype("MatMul", a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("MatMul inputs must have rank >= 1 (got a scalar)")
    w = _work_dtype(dtype)
    return np.matmul(a.astype(w, copy=False), b.astype(w, copy=False)).astype(dtype, copy=False)


def _scaled(v, factor: float, w: np.dtype):
    """factor * v; alpha and beta are floats, so integer products scale in float64."""
    if factor == 1:
        return v
    scale = w if is_float(w) else np.dtype(np.float64)
    return v.astype(scale, copy=False) * scale.type(factor)


def _gemm(a, b, c, alpha, beta, trans_a, trans_b):
    dtype = _same_dtype("Gemm", a, b, c)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"Gemm A and B must be 2-D, got {list(a.shape)} and {list(b.shape)}")
    w = _work_dtype(dtype)
    a = a.astype(w, copy=False).T if trans_a else a.astype(w, copy=False)
    b = b.astype(w, copy=False).T if trans_b else b.astype(w, copy=False)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"Gemm inner dimensions differ: A' {list(a.shape)}, B' {list(b.shape)}")
    y = a @ b
    if c is not None:
        m, n = y.shape
        if np.broadcast_shapes(c.shape, (m, n)) != (m, n):
            raise ValueError(f"Gemm C of shape {list(c.shape)} does not broadcast to {[m, n]}")
        y = _scaled(y, alpha, w) + _scaled(c.astype(w, copy=False), beta, w)
    else:
        y = _scaled(y, alpha, w)
    return y.astype(dtype)


@op("Gemm", 1)
def gemm_1(a, b, c, *, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):
    # Before opset 7, C must already be (M, N) unless `broadcast` is set.
    if not broadcast:
        m = a.shape[1] if transA else a.shape[0]
        n = b.shape[0] if transB else b.shape[1]
        if c.shape != (m, n):
            raise ValueError(f"Gemm C must be {[m, n]} unless broadcast=1, got {list(c.shape)}")
    return _gemm(a, b, c, alpha, beta, transA, transB)


@op("Gemm", 7)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    # C is required at 7 and 9 and optional (as if 0) from 11; absent C only occurs in 11+.
    return _gemm(a, b, c, alpha, beta, transA, transB)


_TERM = re.compile(r"^([A-Za-z]|\.\.\.)*$")


@op("Einsum", 12)
def einsum(*inputs, equation):
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(inputs):
        raise ValueError(
            f"equation {equation!r} has {len(terms)} operand terms, got {len(inputs)} inputs"
        )
    for term in terms + ([rhs] if arrow else []):
        if not _TERM.match(term):
            raise ValueError(f"equation {equation!r}: bad term {term!r}")
    if arrow and rhs.count("...") > 1:
        raise ValueError(f"equation {equation!r}: the output may contain one ellipsis")
    # NumPy's implicit mode matches the spec: labels seen once, sorted by ASCII code, with
    # the ellipsis dimensions first.
    dtype = _same_dtype("Einsum", *inputs)
    w = _work_dtype(dtype)
    args = [x.astype(w, copy=False) for x in inputs]
    return np.asarray(np.einsum(eq, *args, optimize=len(args) > 1)).astype(dtype, copy=False)


@op("Det", 11)
def det(x):
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"Det input must have shape [*, M, M], got {list(x.shape)}")
    w = np.float64 if x.dtype == np.float64 else np.float32
    return np.asarray(np.linalg.det(x.astype(w, copy=False))).astype(x.dtype)
