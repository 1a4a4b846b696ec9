"""Normalizations and Dropout: BatchNormalization, Instance/Layer/Group/RMS normalization,
LRN, LpNormalization, MeanVarianceNormalization, Dropout."""
from __future__ import annotations

import numpy as np

from ..dtypes import np_dtype
from ..registry import op


def _acc(dtype):
    # half-precision inputs are reduced in float32 (BatchNormalization-15 says so explicitly)
    return np.float64 if dtype == np.float64 else np.float32


def _channel(v, ndim):
    """A per-channel vector (C,) shaped to broadcast against (N, C, D1, ...)."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


# BatchNormalization ------------------------------------------------------------------------
def _batch_norm(x, scale, b, mean, var, epsilon, momentum, training, spatial=1):
    ct = _acc(x.dtype)
    xc = x.astype(ct, copy=False)
    # spatial=0 (opsets 1-8): statistics and parameters per activation (C, D1, ...), over N only
    axes = (0,) + tuple(range(2, x.ndim)) if spatial else (0,)
    shape = (lambda v: _channel(v, x.ndim)) if spatial else (lambda v: v.reshape((1,) + x.shape[1:]))
    if training:
        cur_mean = xc.mean(axis=axes)
        cur_var = xc.var(axis=axes)
        m, v = cur_mean, cur_var
    else:
        m, v = mean.astype(ct), var.astype(ct)
    # (x - m) / sqrt(v + eps) * scale + b, folded into one multiply-add per element
    a = scale.astype(ct) / np.sqrt(v + ct(epsilon))
    y = xc * shape(a)
    y += shape(b.astype(ct) - m * a)
    y = y.astype(x.dtype, copy=False)
    if not training:
        return y, None
    running_mean = (mean.astype(ct) * momentum + cur_mean * (1 - momentum)).astype(mean.dtype)
    running_var = (var.astype(ct) * momentum + cur_var * (1 - momentum)).astype(var.dtype)
    return y, (running_mean, running_var, cur_mean.astype(mean.dtype), cur_var.astype(var.dtype))


@op("BatchNormalization", 1)
def batch_normalization_1(x, scale, b, mean, var, *, consumed_inputs=None, epsilon=1e-5,
                          is_test=0, momentum=0.9, spatial=1, ctx):
    # Before opset 7 the mode is is_test; models that leave is_test=0 but ask only for Y
    # (common in old exporters) are run in inference mode, as there is nowhere to put the stats.
    training = not is_test and any(ctx.outputs[1:])
    y, stats = _batch_norm(x, scale, b, mean, var, epsilon, momentum, training, spatial)
    return (y, *stats)[: ctx.n_outputs] if training else y


@op("BatchNormalization", 7)
def batch_normalization_7(x, scale, b, mean, var, *, epsilon=1e-5, momentum=0.9, spatial=1, ctx):
    # opsets 7-13: the outputs asked for select the mode (case #1 training, case #2 test)
    training = any(ctx.outputs[1:])
    y, stats = _batch_norm(x, scale, b, mean, var, epsilon, momentum, training, spatial)
    return (y, *stats)[: ctx.n_outputs] if training else y


@op("BatchNormalization", 14)
def batch_normalization_14(x, scale, b, input_mean, input_var, *, epsilon=1e-5, momentum=0.9,
                           training_mode=0, ctx):
    y, stats = _batch_norm(x, scale, b, input_mean, input_var, epsilon, momentum, bool(training_mode))
    if not training_mode:
        if any(ctx.outputs[1:]):
            raise ValueError("running_mean/running_var outputs need training_mode=1")
        return y
    return (y, stats[0], stats[1])[: ctx.n_outputs]


# per-instance normalizations -----------------------------------------------------------------
@op("InstanceNormalization", 1)
def instance_normalization(x, scale, b, *, epsilon=1e-5, consumed_inputs=None):
    ct = _acc(x.dtype)
    xc = x.astype(ct, copy=False)
    axes = tuple(range(2, x.ndim))
    mean = xc.mean(axis=axes, keepdims=True)
    var = xc.var(axis=axes, keepdims=True)
    y = (xc - mean) / np.sqrt(var + ct(epsilon)) * _channel(scale.astype(ct), x.ndim) \
        + _channel(b.astype(ct), x.ndim)
    return y.astype(x.dtype, copy=False)


def _norm_axes(x, axis):
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for rank {x.ndim}")
    return tuple(range(axis % x.ndim, x.ndim))


@op("LayerNormalization", 17)
def layer_normalization(x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    axes = _norm_axes(x, axis)
    st = np_dtype(stash_type)
    xs = x.astype(st)
    mean = xs.mean(axis=axes, keepdims=True)
    d = xs - mean
    inv_std = (1 / np.sqrt((d * d).mean(axis=axes, keepdims=True) + st.type(epsilon))).astype(st)
    y = (d * inv_std).astype(x.dtype) * scale
    if b is not None:
        y = y + b
    return y.astype(x.dtype, copy=False), mean.astype(st), inv_std


def _group_norm(x, num_groups, epsilon, st):
    n, c = x.shape[:2]
    if num_groups is None or num_groups <= 0 or c % num_groups:
        raise ValueError(f"num_groups={num_groups} must be a positive divisor of channels {c}")
    xs = x.astype(st).reshape(n, num_groups, x.size // max(n * num_groups, 1))
    mean = xs.mean(axis=-1, keepdims=True)
    var = xs.var(axis=-1, keepdims=True)
    return ((xs - mean) / np.sqrt(var + st.type(epsilon))).reshape(x.shape).astype(x.dtype)


@op("GroupNormalization", 18)
def group_normalization_18(x, scale, bias, *, epsilon=1e-5, num_groups=None):
    # opset 18: scale and bias hold one value per group
    normalized = _group_norm(x, num_groups, epsilon, np.dtype(_acc(x.dtype)))
    per_channel = x.shape[1] // num_groups
    s, b = (np.repeat(v, per_channel) for v in (scale, bias))
    return (normalized * _channel(s, x.ndim) + _channel(b, x.ndim)).astype(x.dtype, copy=False)


@op("GroupNormalization", 21)
def group_normalization_21(x, scale, bias, *, epsilon=1e-5, num_groups=None, stash_type=1):
    # opset 21: scale and bias hold one value per channel
    normalized = _group_norm(x, num_groups, epsilon, np_dtype(stash_type))
    return (normalized * _channel(scale, x.ndim) + _channel(bias, x.ndim)).astype(x.dtype, copy=False)


@op("RMSNormalization", 23)
def rms_normalization(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    axes = _norm_axes(x, axis)
    st = np_dtype(stash_type)
    xs = x.astype(st)
    rms = np.sqrt((xs * xs).mean(axis=axes, keepdims=True) + st.type(epsilon))
    return ((xs / rms).astype(x.dtype) * scale).astype(scale.dtype, copy=False)


# LRN, LpNormalization, MeanVarianceNormalization --------------------------------------------
@op("LRN", 1)
def lrn(x, *, alpha=1e-4, beta=0.75, bias=1.0, size=None):
    if not size or size <= 0:
        raise ValueError(f"size must be a positive integer, got {size}")
    ct = _acc(x.dtype)
    xc = x.astype(ct, copy=False)
    # the sum runs over channels [c - floor((size-1)/2), c + ceil((size-1)/2)]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    widths = [(0, 0)] * x.ndim
    widths[1] = (lo, hi)
    padded = np.pad(np.square(xc), widths)
    channels = x.shape[1]
    square_sum = padded[:, :channels].copy()
    for shift in range(1, size):  # one pass per window offset, not a reduction over tiny axes
        square_sum += padded[:, shift:shift + channels]
    y = xc / (ct(bias) + ct(alpha) / size * square_sum) ** ct(beta)
    return y.astype(x.dtype, copy=False)


@op("LpNormalization", 1)
def lp_normalization(x, *, axis=-1, p=2):
    xc = x.astype(_acc(x.dtype), copy=False)
    if p == 1:
        norm = np.abs(xc).sum(axis=axis, keepdims=True)
    elif p == 2:
        norm = np.sqrt(np.square(xc).sum(axis=axis, keepdims=True))
    else:
        raise ValueError(f"p must be 1 or 2, got {p}")
    # a zero norm gives 0, not NaN (as the onnx test data has it)
    safe = np.where(norm == 0, 1, norm)
    return np.where(norm == 0, 0, xc / safe).astype(x.dtype, copy=False)


@op("MeanVarianceNormalization", 9)
def mean_variance_normalization(x, *, axes=(0, 2, 3)):
    # as the schema's function body: (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9)
    axes = tuple(axes)
    ct = _acc(x.dtype)
    xc = x.astype(ct, copy=False)
    mean = xc.mean(axis=axes, keepdims=True)
    var = np.square(xc).mean(axis=axes, keepdims=True) - np.square(mean)
    std = np.sqrt(np.maximum(var, 0))  # rounding can leave a tiny negative variance
    return ((xc - mean) / (std + ct(1e-9))).astype(x.dtype, copy=False)


# Dropout -------------------------------------------------------------------------------------
def _dropout(x, ratio, seed, ctx):
    """Training-mode dropout: keep where uniform[0,1) >= ratio, scaling kept values by 1/(1-ratio)."""
    # a seed reproduces the corpus's draws (NumPy's legacy generator); without one the
    # evaluator's seeded generator keeps the run repeatable
    if seed is not None:
        uniform = np.random.RandomState(seed).uniform(0.0, 1.0, x.shape)
    else:
        uniform = ctx.evaluator.rng.uniform(0.0, 1.0, x.shape)
    mask = uniform >= ratio
    return (x * mask / (1.0 - ratio)).astype(x.dtype, copy=False), mask


@op("Dropout", 1)
def dropout_1(x, *, consumed_inputs=None, is_test=0, ratio=0.5, ctx):
    if is_test or ratio == 0:
        y, mask = x.copy(), np.ones(x.shape, dtype=x.dtype)
    else:
        y, mask = _dropout(x, ratio, None, ctx)
        mask = mask.astype(x.dtype)
    return (y, mask) if ctx.n_outputs > 1 else y


@op("Dropout", 7)
def dropout_7(x, *, ratio=0.5, ctx):
    # opsets 7-11 describe inference only: the output is the input, the mask all ones
    return (x.copy(), np.ones(x.shape, dtype=x.dtype)) if ctx.n_outputs > 1 else x.copy()


@op("Dropout", 10)
def dropout_10(x, *, ratio=0.5, ctx):
    # as opset 7, with a bool mask
    return (x.copy(), np.ones(x.shape, dtype=bool)) if ctx.n_outputs > 1 else x.copy()


@op("Dropout", 12)
def dropout_12(x, ratio=None, training_mode=None, *, seed=None, ctx):
    r = 0.5 if ratio is None else float(ratio)
    if not 0 <= r < 1:
        raise ValueError(f"ratio must be in [0, 1), got {r}")
    if training_mode is None or not bool(training_mode) or r == 0:
        y, mask = x.copy(), np.ones(x.shape, dtype=bool)
    else:
        y, mask = _dropout(x, r, seed, ctx)
    return (y, mask) if ctx.n_outputs > 1 else y
