"""Elementwise arithmetic and math: Add Sub Mul Div Mod Pow, unary math, Max Min Mean Sum, Clip,
IsInf IsNaN, BitShift and the Bitwise* ops.

Integer arithmetic wraps on overflow (NumPy semantics, warnings silenced).  Floats narrower
than float32 (float16, bfloat16, float8) are computed in float32 and rounded back, so every
op returns exactly its input's dtype.
"""
from __future__ import annotations

import functools

import numpy as np

from ..dtypes import is_float
from ..registry import op

# helpers -------------------------------------------------------------------------------


def work(x: np.ndarray) -> np.ndarray:
    """`x` in the dtype to compute in: narrow floats go to float32."""
    if is_float(x.dtype) and x.dtype.itemsize < 4:
        return x.astype(np.float32)
    return x


def unary(fn, x, *args):
    """fn(x, *args) computed in `work` precision, returned in x's dtype."""
    x = np.asarray(x)
    with np.errstate(all="ignore"):
        return np.asarray(fn(work(x), *args)).astype(x.dtype, copy=False)


def binary(fn, a, b):
    """fn(a, b) with NumPy broadcasting, returned in a's dtype."""
    a, b = np.asarray(a), np.asarray(b)
    with np.errstate(all="ignore"):
        return np.asarray(fn(work(a), work(b))).astype(a.dtype, copy=False)


def legacy_broadcast(a, b, broadcast=0, axis=None):
    """B shaped for the opset<7 rule: equal shapes, or with broadcast=1 B's shape is a
    contiguous run of A's shape starting at `axis` (suffix when axis is unset), or B has one
    element."""
    a, b = np.asarray(a), np.asarray(b)
    if not broadcast:
        if a.shape != b.shape:
            raise ValueError(
                f"inputs have shapes {list(a.shape)} and {list(b.shape)}; "
                "set broadcast=1 to broadcast B"
            )
        return b
    if b.size == 1:
        return b.reshape(())
    if b.ndim > a.ndim:
        raise ValueError(f"B of rank {b.ndim} cannot broadcast to A of rank {a.ndim}")
    if axis is None:
        axis = a.ndim - b.ndim
    elif axis < 0:
        axis += a.ndim
    # The text says "1-dim expansion doesn't work yet", but exporters of that era relied on
    # it (the pytorch-operator corpus broadcasts (2, 1) onto (2, 3)), so size-1 dims expand.
    aligned = a.shape[axis : axis + b.ndim]
    if not 0 <= axis <= a.ndim - b.ndim or any(d not in (1, e) for d, e in zip(b.shape, aligned)):
        raise ValueError(
            f"B of shape {list(b.shape)} does not match A's shape {list(a.shape)} at axis {axis}"
        )
    return b.reshape(b.shape + (1,) * (a.ndim - axis - b.ndim))


def _legacy_binary(fn):
    """The opset<7 form of a binary op: legacy `broadcast`/`axis`, ignored `consumed_inputs`."""

    def legacy(a, b, *, broadcast=0, axis=None, consumed_inputs=None):
        return fn(a, legacy_broadcast(a, b, broadcast, axis))

    legacy.__name__ = fn.__name__ + "_legacy"
    legacy.__doc__ = f"{fn.__name__} with opset<7 broadcasting."
    return legacy


# binary arithmetic ---------------------------------------------------------------------


def add(a, b):
    return binary(np.add, a, b)


def sub(a, b):
    return binary(np.subtract, a, b)


def mul(a, b):
    return binary(np.multiply, a, b)


def _trunc_divide(a, b):
    q = np.floor_divide(a, b)
    if a.dtype.kind == "i":
        # floor -> toward zero: step up where the exact quotient is negative and inexact
        q = q + ((np.remainder(a, b) != 0) & ((a < 0) != (b < 0))).astype(q.dtype)
    return q


def div(a, b):
    """Integer division truncates toward zero (C semantics)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "iu":
        with np.errstate(all="ignore"):
            return np.asarray(_trunc_divide(a, b)).astype(a.dtype, copy=False)
    return binary(np.divide, a, b)


for _name, _fn in (("Add", add), ("Sub", sub), ("Mul", mul), ("Div", div)):
    op(_name, 1)(_legacy_binary(_fn))
    op(_name, 7)(_fn)


@op("Mod", 10)
def mod(a, b, *, fmod=0):
    """fmod=0: A - floor(A/B)*B, sign of the divisor; fmod=1: A - trunc(A/B)*B (C fmod),
    sign of the dividend."""
    if fmod not in (0, 1):
        raise ValueError(f"attribute fmod must be 0 or 1, got {fmod}")
    return binary(np.fmod if fmod else np.mod, a, b)


def _int_power(x, y):
    """x ** y for integer x and y; a negative exponent gives trunc(1 / x**|y|)."""
    neg = y < 0
    r = np.power(x, np.where(neg, 0, y).astype(x.dtype))
    if neg.any():
        odd = (np.abs(y) % 2) == 1
        inv = np.where(x == 1, 1, np.where(x == -1, np.where(odd, -1, 1), 0))
        r = np.where(neg, inv, r)
    return r


def pow_(x, y):
    """The result has the base's type, whatever the exponent's type."""
    x, y = np.asarray(x), np.asarray(y)
    with np.errstate(all="ignore"):
        if x.dtype.kind in "iu" and y.dtype.kind in "iu":
            r = _int_power(x, y)
        elif x.dtype.kind in "iu":
            r = np.power(x.astype(np.float64), work(y).astype(np.float64))
        else:
            xw = work(x)
            r = np.power(xw, work(y).astype(xw.dtype))
        return np.asarray(r).astype(x.dtype)


op("Pow", 1)(_legacy_binary(pow_))
op("Pow", 7)(pow_)


# unary math ------------------------------------------------------------------------------


def _unary_op(name, fn, since=1):
    """Register a unary op computing `fn`; opset-1 `consumed_inputs` is accepted and ignored."""

    def impl(x, *, consumed_inputs=None):
        return unary(fn, x)

    impl.__name__ = name.lower()
    impl.__doc__ = f"{name}(x) = {getattr(fn, '__name__', fn)}(x) elementwise."
    op(name, since)(impl)
    return impl


def _erf_series(t):
    """erf(t) for 0 <= t < 3: 2/sqrt(pi) * exp(-t^2) * sum_n 2^n t^(2n+1) / (1*3*...*(2n+1)),
    a series of positive terms (no cancellation), summed until the terms no longer count."""
    term, total, t2 = t, t, 2.0 * t * t
    for n in range(1, 60):
        term = term * t2
        term *= 1.0 / (2 * n + 1)
        total = total + term
        if n % 4 == 0 and np.all(term <= total * 1e-17):
            break
    return 2.0 / np.sqrt(np.pi) * np.exp(-t * t) * total


def _erfc_fraction(z):
    """erfc(z) for z >= 3: exp(-z^2)/sqrt(pi) / (z + (1/2)/(z + 1/(z + (3/2)/(z + ...))))."""
    f = z
    for k in range(30, 0, -1):
        f = z + (k / 2.0) / f
    return np.exp(-z * z) / (np.sqrt(np.pi) * f)


def erf64(x):
    """erf in float64, good to a few ulp; small and large arguments take separate paths."""
    x = np.asarray(x, dtype=np.float64)
    ax = np.abs(x)
    out = np.full(x.shape, np.nan)
    for lo, hi in ((0.0, 1.0), (1.0, 3.0)):  # the series needs fewer terms near 0
        band = (ax >= lo) & (ax < hi)
        out[band] = _erf_series(ax[band])
    large = ax >= 3.0
    out[large] = 1.0 - _erfc_fraction(np.minimum(ax[large], 30.0))
    return np.copysign(out, x)  # NaN stays NaN


abs_ = _unary_op("Abs", np.abs)
neg = _unary_op("Neg", np.negative)
reciprocal = _unary_op("Reciprocal", np.reciprocal)
sqrt = _unary_op("Sqrt", np.sqrt)
exp = _unary_op("Exp", np.exp)
log = _unary_op("Log", np.log)
ceil = _unary_op("Ceil", np.ceil)
floor = _unary_op("Floor", np.floor)
round_ = _unary_op("Round", np.round, 11)  # np.round rounds halves to even
sign = _unary_op("Sign", np.sign, 9)
_unary_op("Erf", erf64, 9)
for _name, _fn, _since in (
    ("Sin", np.sin, 7), ("Cos", np.cos, 7), ("Tan", np.tan, 7),
    ("Asin", np.arcsin, 7), ("Acos", np.arccos, 7), ("Atan", np.arctan, 7),
    ("Sinh", np.sinh, 9), ("Cosh", np.cosh, 9), ("Asinh", np.arcsinh, 9),
    ("Acosh", np.arccosh, 9), ("Atanh", np.arctanh, 9),
):  # fmt: skip
    _unary_op(_name, _fn, _since)


# variadic --------------------------------------------------------------------------------


def _variadic(fn, inputs):
    """fn folded over the inputs in `work` precision, and the dtype to return."""
    if not inputs or any(x is None for x in inputs):
        raise ValueError("expects at least one input, none absent")
    arrays = [np.asarray(x) for x in inputs]
    if any(a.dtype != arrays[0].dtype for a in arrays):
        raise TypeError(f"inputs must share one type, got {[str(a.dtype) for a in arrays]}")
    with np.errstate(all="ignore"):
        return np.asarray(functools.reduce(fn, [work(a) for a in arrays])), arrays[0].dtype


def _signed_zeros(r, a, b, negative):
    """r with the max or min of two zeros made +0 or -0 as `negative` says, which NumPy leaves
    to the code path (float32 vectors give the second operand, float16 scalars the first)."""
    r = np.asarray(r)
    if r.dtype.kind != "f":
        return r
    both = (a == 0) & (b == 0)
    if not np.any(both):
        return r
    zero = np.where(negative(np.signbit(a), np.signbit(b)), r.dtype.type(-0.0), r.dtype.type(0.0))
    return np.where(both, zero, r)


def _maximum(a, b):
    """IEEE 754-2019 maximum: +0 is the larger zero; NaN propagates."""
    return _signed_zeros(np.maximum(a, b), a, b, np.logical_and)


def _minimum(a, b):
    """IEEE 754-2019 minimum: -0 is the smaller zero; NaN propagates."""
    return _signed_zeros(np.minimum(a, b), a, b, np.logical_or)


@op("Max", 1)
def max_(*inputs, consumed_inputs=None):
    """Elementwise max with broadcasting; NaN propagates, and Max(+0, -0) is +0."""
    r, dtype = _variadic(_maximum, inputs)
    return r.astype(dtype)


@op("Min", 1)
def min_(*inputs, consumed_inputs=None):
    """Elementwise min with broadcasting; NaN propagates, and Min(+0, -0) is -0."""
    r, dtype = _variadic(_minimum, inputs)
    return r.astype(dtype)


@op("Sum", 1)
def sum_(*inputs, consumed_inputs=None):
    r, dtype = _variadic(np.add, inputs)
    return r.astype(dtype)


@op("Mean", 1)
def mean(*inputs, consumed_inputs=None):
    r, dtype = _variadic(np.add, inputs)
    return (r / len(inputs)).astype(dtype)


# Clip ------------------------------------------------------------------------------------


def _clip(x, lo, hi):
    x = np.asarray(x)
    w = work(x)
    with np.errstate(all="ignore"):
        if lo is not None:
            w = np.maximum(w, np.asarray(lo).astype(w.dtype))
        if hi is not None:
            w = np.minimum(w, np.asarray(hi).astype(w.dtype))
    return np.asarray(w).astype(x.dtype)


@op("Clip", 1)
def clip_1(x, *, min=None, max=None, consumed_inputs=None):
    """Bounds as attributes; an unset bound does not clip."""
    return _clip(x, min, max)


@op("Clip", 11)
def clip(x, min=None, max=None):
    """Min(max, Max(x, min)): when min > max every value becomes max."""
    for name, bound in (("min", min), ("max", max)):
        if bound is not None and np.asarray(bound).size != 1:
            raise ValueError(f"input {name!r} must be a scalar, got shape {np.shape(bound)}")
    return _clip(
        x,
        None if min is None else np.asarray(min).reshape(()),
        None if max is None else np.asarray(max).reshape(()),
    )


# classification --------------------------------------------------------------------------


@op("IsInf", 10)
def isinf(x, *, detect_negative=1, detect_positive=1):
    w = work(np.asarray(x))
    return np.isinf(w) & (((w > 0) & bool(detect_positive)) | ((w < 0) & bool(detect_negative)))


@op("IsNaN", 9)
def isnan(x):
    return np.isnan(work(np.asarray(x)))


# bitwise -----------------------------------------------------------------------------------


@op("BitShift", 11)
def bitshift(x, y, *, direction):
    """A shift by a negative amount or by at least the bit width leaves only the sign fill."""
    if direction not in ("LEFT", "RIGHT"):
        raise ValueError(f"attribute direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    x, y = np.asarray(x), np.asarray(y)
    bits = x.dtype.itemsize * 8
    out_of_range = (y < 0) | (y >= bits)
    amount = np.where(out_of_range, 0, y).astype(x.dtype)
    if direction == "LEFT":
        r, fill = np.left_shift(x, amount), 0
    else:  # arithmetic shift for signed types: the fill is the sign bit
        r, fill = np.right_shift(x, amount), np.negative((x < 0).astype(x.dtype))
    return np.where(out_of_range, fill, r).astype(x.dtype)


@op("BitwiseAnd", 18)
def bitwise_and(a, b):
    return np.bitwise_and(a, b)


@op("BitwiseOr", 18)
def bitwise_or(a, b):
    return np.bitwise_or(a, b)


@op("BitwiseXor", 18)
def bitwise_xor(a, b):
    return np.bitwise_xor(a, b)


@op("BitwiseNot", 18)
def bitwise_not(x):
    return np.invert(x)
