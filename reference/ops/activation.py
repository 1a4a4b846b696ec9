"""Activations: Relu LeakyRelu PRelu Elu Selu Celu Sigmoid HardSigmoid HardSwish Softplus
Softsign Tanh Mish ThresholdedRelu Shrink Gelu Swish SwiGLU, and Softmax LogSoftmax Hardmax.

Each is computed directly, also where newer opsets define it as a function.  Narrow floats are
computed in float32 (`work`) and rounded back to the input's dtype.
"""
from __future__ import annotations

import numpy as np

from ..registry import op
from .math import erf64, unary, work


def _sigmoid(x):
    # exp of -|x| only, so large inputs do not overflow
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


@op("Relu", 1)
def relu(x, *, consumed_inputs=None):
    return unary(np.maximum, x, 0)


@op("LeakyRelu", 1)
def leaky_relu(x, *, alpha=0.01, consumed_inputs=None):
    return unary(lambda x: np.where(x < 0, alpha * x, x), x)


def _broadcasts_to(shape, target):
    try:
        return np.broadcast_shapes(shape, target) == tuple(target)
    except ValueError:
        return False


def _prelu(x, slope):
    with np.errstate(all="ignore"):
        w = work(x)
        return np.where(w < 0, work(slope).astype(w.dtype) * w, w).astype(x.dtype)


@op("PRelu", 1)
def prelu_1(x, slope, *, consumed_inputs=None):
    """Before opset 7 a 1-D slope of length C may also apply per channel (axis 1)."""
    x, slope = np.asarray(x), np.asarray(slope)
    per_channel = slope.ndim == 1 and x.ndim >= 2 and x.shape[1] == slope.shape[0]
    if per_channel and not _broadcasts_to(slope.shape, x.shape):
        slope = slope.reshape((-1,) + (1,) * (x.ndim - 2))
    return prelu(x, slope)


@op("PRelu", 7)
def prelu(x, slope):
    """f(x) = slope * x for x < 0, x otherwise; slope broadcasts unidirectionally to X."""
    x, slope = np.asarray(x), np.asarray(slope)
    if not _broadcasts_to(slope.shape, x.shape):
        raise ValueError(
            f"slope of shape {list(slope.shape)} does not broadcast to X of shape {list(x.shape)}"
        )
    return _prelu(x, slope)


@op("Elu", 1)
def elu(x, *, alpha=1.0, consumed_inputs=None):
    return unary(lambda x: np.where(x < 0, alpha * np.expm1(x), x), x)


@op("Selu", 1)
def selu(
    x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875, consumed_inputs=None
):
    return unary(lambda x: gamma * np.where(x <= 0, alpha * np.exp(x) - alpha, x), x)


@op("Celu", 12)
def celu(x, *, alpha=1.0):
    if alpha == 0:
        raise ValueError("attribute alpha must be nonzero")
    return unary(lambda x: np.maximum(0, x) + np.minimum(0, alpha * np.expm1(x / alpha)), x)


@op("Sigmoid", 1)
def sigmoid(x, *, consumed_inputs=None):
    return unary(_sigmoid, x)


@op("HardSigmoid", 1)
def hard_sigmoid(x, *, alpha=0.2, beta=0.5, consumed_inputs=None):
    return unary(lambda x: np.clip(alpha * x + beta, 0, 1), x)


@op("HardSwish", 14)
def hard_swish(x):
    """x * HardSigmoid(x) with alpha = 1/6, beta = 0.5."""
    return unary(lambda x: x * np.clip(x / 6 + 0.5, 0, 1), x)


@op("Softplus", 1)
def softplus(x):
    """ln(exp(x) + 1), computed without overflow."""
    return unary(np.logaddexp, x, 0)


@op("Softsign", 1)
def softsign(x):
    return unary(lambda x: x / (1 + np.abs(x)), x)


@op("Tanh", 1)
def tanh(x, *, consumed_inputs=None):
    return unary(np.tanh, x)


@op("Mish", 18)
def mish(x):
    return unary(lambda x: x * np.tanh(np.logaddexp(x, 0)), x)


@op("ThresholdedRelu", 10)
def thresholded_relu(x, *, alpha=1.0):
    return unary(lambda x: np.where(x > alpha, x, 0), x)


@op("Shrink", 9)
def shrink(x, *, bias=0.0, lambd=0.5):
    """x + bias below -lambd, x - bias above lambd, 0 between (integers too)."""
    x = np.asarray(x)
    w = x.astype(np.float64) if x.dtype.kind in "iu" else work(x)
    with np.errstate(all="ignore"):
        r = np.where(w < -lambd, w + bias, np.where(w > lambd, w - bias, 0))
        return r.astype(x.dtype)


@op("Gelu", 20)
def gelu(x, *, approximate="none"):
    if approximate == "none":
        return unary(lambda x: 0.5 * x * (1 + erf64(x / np.sqrt(2))), x)
    if approximate == "tanh":
        c = np.sqrt(2 / np.pi)
        return unary(lambda x: 0.5 * x * (1 + np.tanh(c * (x + 0.044715 * x**3))), x)
    raise ValueError(f"attribute approximate must be 'none' or 'tanh', got {approximate!r}")


@op("Swish", 24)
def swish(x, *, alpha=1.0):
    return unary(lambda x: x * _sigmoid(alpha * x), x)


@op("SwiGLU", 28)
def swiglu(a, b, *, alpha=1.0):
    """Swish_alpha(A) * B; A and B must have the same shape (no broadcasting)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(
            f"A and B must have the same shape, got {list(a.shape)} and {list(b.shape)}"
        )
    with np.errstate(all="ignore"):
        wa, wb = work(a), work(b)
        return (wa * _sigmoid(alpha * wa) * wb).astype(a.dtype)


# Softmax family ------------------------------------------------------------------------------


def _axis(axis, rank):
    if not -rank <= axis < rank:
        raise ValueError(f"attribute axis={axis} is out of range for an input of rank {rank}")
    return axis % rank


def _on_2d(fn, x, axis):
    """Opset<13 semantics: `fn` over the input coerced to 2-D at `axis`, i.e. shape
    [prod(shape[:axis]), prod(shape[axis:])], along its second dimension."""
    x = np.asarray(x)
    k = _axis(axis, x.ndim)
    rows, cols = (int(np.prod(s, dtype=np.int64)) for s in (x.shape[:k], x.shape[k:]))
    return fn(x.reshape(rows, cols), 1).reshape(x.shape)


# Softmax and LogSoftmax round every step to the input type, as their function bodies do
# (Exp, ReduceSum, Div in T); float16/bfloat16 results then match a node-by-node evaluation.


def _softmax(x, axis):
    if not x.size:
        return x.copy()
    with np.errstate(all="ignore"):
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax(x, axis):
    if not x.size:
        return x.copy()
    with np.errstate(all="ignore"):
        s = x - np.max(x, axis=axis, keepdims=True)
        return s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True))


def _hardmax(x, axis):
    """1 at the first maximum along `axis`, 0 elsewhere."""
    out = np.zeros_like(x)
    if x.size:
        first = np.expand_dims(np.argmax(work(x), axis=axis), axis)
        np.put_along_axis(out, first, 1, axis=axis)
    return out


@op("Softmax", 1)
def softmax_1(x, *, axis=1):
    return _on_2d(_softmax, x, axis)


@op("Softmax", 13)
def softmax(x, *, axis=-1):
    x = np.asarray(x)
    return _softmax(x, _axis(axis, x.ndim))


@op("LogSoftmax", 1)
def log_softmax_1(x, *, axis=1):
    return _on_2d(_log_softmax, x, axis)


@op("LogSoftmax", 13)
def log_softmax(x, *, axis=-1):
    x = np.asarray(x)
    return _log_softmax(x, _axis(axis, x.ndim))


@op("Hardmax", 1)
def hardmax_1(x, *, axis=1):
    return _on_2d(_hardmax, x, axis)


@op("Hardmax", 13)
def hardmax(x, *, axis=-1):
    x = np.asarray(x)
    return _hardmax(x, _axis(axis, x.ndim))
