"""Device kernels: (domain, op_type) -> DeviceKernel, in the reference calling convention with
the array module first: fn(xp, *inputs, **attributes).

With xp=cupy they run on the GPU (matmul goes to cuBLAS); with xp=numpy the CPU tests check
them against the reference ops. A kernel returns NotImplemented for what it does not cover
(dtype, layout, an optional output) and the plan runs the node on the host instead.
`host_inputs` are the input positions read as small host values (shapes, axes, starts).
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from reference.ops.conv import out_geometry, spatial_attrs

from .arrays import DEVICE_DTYPES, erf
from .fusion import FLOAT_DTYPES

MS = "com.microsoft"


@dataclass(frozen=True)
class DeviceKernel:
    fn: object
    host_inputs: tuple[int, ...] = ()


KERNELS: dict[tuple[str, str], DeviceKernel] = {}


def register(domain: str, *op_types: str, host_inputs: tuple[int, ...] = ()):
    def wrap(fn):
        for op_type in op_types:
            KERNELS[(domain, op_type)] = DeviceKernel(fn, host_inputs)
        return fn

    return wrap


def _arrays(values):
    return [v for v in values if v is not None and hasattr(v, "dtype")]


def dtypes_in(allowed, first_only=False):
    """Decline (NotImplemented) unless every array input (or the first) has a dtype in `allowed`."""
    def decorate(fn):
        @functools.wraps(fn)
        def kernel(xp, *inputs, **attrs):
            checked = _arrays(inputs[:1] if first_only else inputs)
            if any(np.dtype(a.dtype) not in allowed for a in checked):
                return NotImplemented
            return fn(xp, *inputs, **attrs)

        return kernel

    return decorate


floats = dtypes_in(FLOAT_DTYPES)
any_device_dtype = dtypes_in(DEVICE_DTYPES)


def _ints(value) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _compute(xp, x):
    """float16 is computed in float32, as the fused kernels do."""
    return x.astype(xp.float32) if x.dtype == np.float16 else x


# elementwise, when not part of a fusion group --------------------------------------------
def _ufunc_kernel(name, allowed):
    @dtypes_in(allowed)
    def kernel(xp, *inputs, **attrs):
        if attrs.get("broadcast"):  # opset<7 legacy broadcasting: the host path keeps its rule
            return NotImplemented
        if len({np.dtype(a.dtype) for a in inputs}) != 1:
            return NotImplemented
        return getattr(xp, name)(*inputs)

    return kernel


INTS_AND_FLOATS = frozenset(d for d in DEVICE_DTYPES if d.kind in "iuf")
for _op, _ufunc, _allowed in (("Add", "add", INTS_AND_FLOATS), ("Sub", "subtract", INTS_AND_FLOATS),
                              ("Mul", "multiply", INTS_AND_FLOATS), ("Div", "divide", FLOAT_DTYPES),
                              ("Neg", "negative", FLOAT_DTYPES), ("Exp", "exp", FLOAT_DTYPES),
                              ("Log", "log", FLOAT_DTYPES), ("Sqrt", "sqrt", FLOAT_DTYPES),
                              ("Tanh", "tanh", FLOAT_DTYPES), ("Abs", "abs", FLOAT_DTYPES),
                              ("Pow", "power", FLOAT_DTYPES)):
    KERNELS[("", _op)] = DeviceKernel(_ufunc_kernel(_ufunc, _allowed))


def apply_activation(xp, y, name, alpha=None, beta=None):
    if not name:
        return y
    if name == "Relu":
        return xp.where(y < 0, y.dtype.type(0), y)
    if name == "Sigmoid":
        return 1 / (1 + xp.exp(-y))
    if name == "Tanh":
        return xp.tanh(y)
    if name == "LeakyRelu":
        return xp.where(y >= 0, y, y.dtype.type(0.01 if alpha is None else alpha) * y)
    return NotImplemented


@register("", "Relu", "Sigmoid")
@floats
def _named_activation(xp, x, *, ctx):
    return apply_activation(xp, x, ctx.node.op_type)


@register("", "LeakyRelu")
@floats
def leaky_relu(xp, x, *, alpha=0.01):
    return apply_activation(xp, x, "LeakyRelu", alpha)


# GEMM ------------------------------------------------------------------------------------
@register("", "MatMul")
@floats
def matmul(xp, a, b):
    if a.dtype != b.dtype or a.ndim == 0 or b.ndim == 0:
        return NotImplemented
    return xp.matmul(a, b)


@register(MS, "FusedMatMul")
@floats
def fused_matmul(xp, a, b, *, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    if transBatchA or transBatchB or a.ndim < 2 or b.ndim < 2 or a.dtype != b.dtype:
        return NotImplemented
    y = xp.matmul(xp.swapaxes(a, -1, -2) if transA else a, xp.swapaxes(b, -1, -2) if transB else b)
    return y if alpha == 1.0 else y * y.dtype.type(alpha)


@register("", "Gemm")
@register(MS, "FusedGemm")
@floats
def gemm(xp, a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, activation=None,
         activation_alpha=None, activation_beta=None, activation_gamma=None,
         **legacy):
    if legacy or a.ndim != 2 or b.ndim != 2:
        return NotImplemented
    y = xp.matmul(a.T if transA else a, b.T if transB else b)
    if alpha != 1.0:
        y *= y.dtype.type(alpha)
    if c is not None:
        y = y + (c if beta == 1.0 else c.dtype.type(beta) * c)
    y = apply_activation(xp, y, activation, activation_alpha, activation_beta)
    return y if y is NotImplemented else y.astype(a.dtype, copy=False)


# convolution: im2col + one batched GEMM per group -----------------------------------------
def _windows(xp, x, kernel, strides, dilations, begin, end, out, fill):
    """[N, C, kh*kw, oh, ow]: every kernel offset's strided view of the padded input."""
    extra = [max(0, (o - 1) * s + (k - 1) * d + 1 - (size + b + e))
             for o, s, k, d, size, b, e in zip(out, strides, kernel, dilations, x.shape[2:], begin, end)]
    pads = [(0, 0), (0, 0)] + [(b, e + x_) for b, e, x_ in zip(begin, end, extra)]
    padded = xp.pad(x, pads, constant_values=fill) if any(p != (0, 0) for p in pads) else x
    views = []
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            r, c = i * dilations[0], j * dilations[1]
            views.append(padded[:, :, r:r + strides[0] * (out[0] - 1) + 1:strides[0],
                                c:c + strides[1] * (out[1] - 1) + 1:strides[1]])
    return xp.stack(views, axis=2)


def _geometry(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode=0):
    kernel, strides, dilations, pads = spatial_attrs(2, kernel_shape, strides, dilations, pads)
    begin, end, out = out_geometry(x.shape[2:], kernel, strides, dilations, pads, auto_pad, ceil_mode)
    return kernel, strides, dilations, begin, end, out


@register("", "Conv")
@register(MS, "FusedConv")
@floats
def conv(xp, x, w, b=None, z=None, *, auto_pad="NOTSET", dilations=None, group=1, pads=None,
         strides=None, kernel_shape=None, activation="", activation_params=None):
    if x.ndim != 4 or w.ndim != 4 or x.dtype != w.dtype:
        return NotImplemented
    n, m, cg = x.shape[0], w.shape[0], w.shape[1]
    kernel, strides, dilations, begin, end, out = _geometry(
        x, kernel_shape or list(w.shape[2:]), strides, dilations, pads, auto_pad)
    cols = _windows(xp, x, kernel, strides, dilations, begin, end, out, 0)
    cols = cols.reshape(n, group, cg * kernel[0] * kernel[1], out[0] * out[1])
    y = xp.matmul(w.reshape(group, m // group, -1), cols).reshape(n, m, out[0], out[1])
    if b is not None:
        y += b.reshape(1, m, 1, 1)
    if z is not None:
        y = y + z
    params = list(activation_params or ())
    return apply_activation(xp, y, activation, *params[:2])


# pooling ---------------------------------------------------------------------------------
@register("", "MaxPool")
@floats
def max_pool(xp, x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
             pads=None, storage_order=0, strides=None, ctx):
    if x.ndim != 4 or (ctx.n_outputs > 1 and ctx.outputs[1]):
        return NotImplemented
    kernel, strides, dilations, begin, end, out = _geometry(
        x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    return _windows(xp, x, kernel, strides, dilations, begin, end, out, -np.inf).max(axis=2)


@register("", "AveragePool")
@floats
def average_pool(xp, x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=None, pads=None, strides=None):
    if x.ndim != 4:
        return NotImplemented
    kernel, strides, dilations, begin, end, out = _geometry(
        x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    total = _windows(xp, _compute(xp, x), kernel, strides, dilations, begin, end, out, 0).sum(axis=2)
    ones = xp.ones((1, 1) + x.shape[2:], dtype=total.dtype)
    if count_include_pad:  # the pads count, the cells ceil_mode adds past them do not
        ones = xp.pad(ones, [(0, 0), (0, 0)] + list(zip(begin, end)), constant_values=1)
        begin = end = [0, 0]
    count = _windows(xp, ones, kernel, strides, dilations, begin, end, out, 0).sum(axis=2)
    return (total / count).astype(x.dtype, copy=False)


@register("", "GlobalAveragePool")
@floats
def global_average_pool(xp, x):
    axes = tuple(range(2, x.ndim))
    return _compute(xp, x).mean(axis=axes, keepdims=True).astype(x.dtype, copy=False)


@register("", "GlobalMaxPool")
@floats
def global_max_pool(xp, x):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


# row-wise and reductions -----------------------------------------------------------------
def _softmax_last(xp, x):
    e = xp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@register("", "Softmax")
@floats
def softmax(xp, x, *, axis=-1):
    if x.ndim == 0 or axis not in (-1, x.ndim - 1):  # opset<13 coerces to 2-D: same for the last axis
        return NotImplemented
    return _softmax_last(xp, _compute(xp, x)).astype(x.dtype, copy=False)


@register("", "LayerNormalization")
@floats
def layer_normalization(xp, x, scale, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1, ctx):
    if ctx.n_outputs > 1 and any(ctx.outputs[1:]):
        return NotImplemented
    axes = tuple(range(axis % x.ndim, x.ndim))
    xc = _compute(xp, x)
    mean = xc.mean(axis=axes, keepdims=True)
    centred = xc - mean
    var = (centred * centred).mean(axis=axes, keepdims=True)
    y = centred / xp.sqrt(var + xc.dtype.type(epsilon)) * scale
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype, copy=False)


def _gelu(xp, x, approximate):
    xc = _compute(xp, x)
    t = xc.dtype.type
    if approximate == "tanh":
        inner = t(math.sqrt(2 / math.pi)) * (xc + t(0.044715) * xc * xc * xc)
        y = t(0.5) * xc * (t(1) + xp.tanh(inner))
    else:
        y = t(0.5) * xc * (t(1) + erf(xp, xc * t(1 / math.sqrt(2))))
    return y.astype(x.dtype, copy=False)


@register("", "Gelu")
@floats
def gelu(xp, x, *, approximate="none"):
    return _gelu(xp, x, approximate)


@register(MS, "Gelu")
@floats
def ms_gelu(xp, x):
    return _gelu(xp, x, "none")


@register(MS, "FastGelu")
@floats
def fast_gelu(xp, x, bias=None):
    return _gelu(xp, x if bias is None else x + bias, "tanh")


def _reduce(method):
    @dtypes_in(FLOAT_DTYPES, first_only=True)
    def kernel(xp, x, axes_input=None, *, axes=None, keepdims=1, noop_with_empty_axes=0):
        chosen = axes if axes_input is None else _ints(axes_input)
        if not chosen:
            if noop_with_empty_axes:
                return x
            chosen = list(range(x.ndim))
        if x.size == 0:
            return NotImplemented
        y = getattr(_compute(xp, x), method)(axis=tuple(chosen), keepdims=bool(keepdims))
        return xp.asarray(y).astype(x.dtype, copy=False)

    return kernel


for _op, _method in (("ReduceMean", "mean"), ("ReduceSum", "sum"), ("ReduceMax", "max"),
                     ("ReduceMin", "min")):
    KERNELS[("", _op)] = DeviceKernel(_reduce(_method), host_inputs=(1,))


# attention -------------------------------------------------------------------------------
def _heads(xp, x, n):
    b, s, d = x.shape
    return x.reshape(b, s, n, d // n).transpose(0, 2, 1, 3)


@register(MS, "MultiHeadAttention")
@floats
def multi_head_attention(xp, query, key=None, value=None, bias=None, key_padding_mask=None,
                         attention_bias=None, past_key=None, past_value=None,
                         past_sequence_length=None, cache_indirection=None, *, num_heads=1,
                         mask_filter_value=-10000.0, scale=0.0, unidirectional=0, ctx):
    """softmax(q k^T * scale + attention_bias, causal rows masked) v over past + new keys."""
    unsupported = (bias, key_padding_mask, past_sequence_length, cache_indirection)
    if (any(v is not None for v in unsupported) or key is None or value is None
            or query.ndim != 3 or key.ndim != 3 or value.ndim != 3 or ctx.n_outputs > 3):
        return NotImplemented
    q = _heads(xp, _compute(xp, query), num_heads)
    k = _heads(xp, _compute(xp, key), num_heads)
    v = _heads(xp, _compute(xp, value), num_heads)
    if past_key is not None:
        k = xp.concatenate([_compute(xp, past_key), k], axis=2)
        v = xp.concatenate([_compute(xp, past_value), v], axis=2)
    seq, total = q.shape[2], k.shape[2]
    t = q.dtype.type
    scores = xp.matmul(q, k.transpose(0, 1, 3, 2)) * t(scale or 1.0 / math.sqrt(q.shape[-1]))
    if attention_bias is not None:
        scores = scores + attention_bias.astype(scores.dtype)
    if unidirectional:  # the reference adds mask_filter_value to masked scores, so do we
        past = total - seq
        masked = xp.arange(total)[None, :] > (xp.arange(seq)[:, None] + past)
        scores = scores + xp.where(masked, t(mask_filter_value), t(0))
    out = xp.matmul(_softmax_last(xp, scores), v)
    b, n, s, h = out.shape
    merged = out.transpose(0, 2, 1, 3).reshape(b, s, n * h).astype(query.dtype)
    results = (merged, k.astype(query.dtype), v.astype(query.dtype))
    return results[:max(1, ctx.n_outputs)]


# data movement ---------------------------------------------------------------------------
@register("", "Identity")
@any_device_dtype
def identity(xp, x):
    return x


@register("", "Transpose")
@any_device_dtype
def transpose(xp, x, *, perm=None):
    return xp.ascontiguousarray(x.transpose(perm) if perm else x.transpose())


@register("", "Gather")
@any_device_dtype
def gather(xp, x, indices, *, axis=0):
    if x.ndim == 0:
        return NotImplemented
    dim = x.shape[axis]
    return xp.take(x, xp.where(indices < 0, indices + dim, indices), axis=axis)


@register("", "Concat")
@any_device_dtype
def concat(xp, *inputs, axis):
    if len({np.dtype(a.dtype) for a in inputs}) != 1:
        return NotImplemented
    return xp.concatenate(inputs, axis=axis)


@register("", "Reshape", host_inputs=(1,))
@any_device_dtype
def reshape(xp, x, shape=None, *, allowzero=0, **legacy):
    if shape is None:
        return NotImplemented  # opset<5: shape as an attribute
    target = _ints(shape)
    if not allowzero:
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return x.reshape(target)


@register("", "Flatten")
@any_device_dtype
def flatten(xp, x, *, axis=1):
    axis = axis + x.ndim if axis < 0 else axis
    return x.reshape(int(np.prod(x.shape[:axis])), -1)


@register("", "Squeeze", "Unsqueeze", host_inputs=(1,))
@any_device_dtype
def squeeze(xp, x, axes_input=None, *, axes=None, ctx):
    chosen = axes if axes_input is None else _ints(axes_input)
    if ctx.node.op_type == "Squeeze":
        if not chosen:
            return x.reshape([d for d in x.shape if d != 1])
        return xp.squeeze(x, axis=tuple(a % x.ndim for a in chosen))
    rank = x.ndim + len(chosen)
    shape = list(x.shape)
    for a in sorted(a % rank for a in chosen):
        shape.insert(a, 1)
    return x.reshape(shape)


@register("", "Slice", host_inputs=(1, 2, 3, 4))
@any_device_dtype
def slice_(xp, x, starts=None, ends=None, axes=None, steps=None):
    starts, ends = _ints(starts), _ints(ends)
    axes = _ints(axes) if axes is not None else list(range(len(starts)))
    steps = _ints(steps) if steps is not None else [1] * len(starts)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[axis % x.ndim] = _slice(start, end, step, x.shape[axis % x.ndim])
    return x[tuple(index)]


def _slice(start, end, step, dim) -> slice:
    """ONNX's clamping (end -1 with a negative step means 'past the front') as a Python slice."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


@register("", "Split", host_inputs=(1,))
@any_device_dtype
def split(xp, x, sizes=None, *, axis=0, split=None, num_outputs=None, ctx):
    dim = x.shape[axis]
    parts = _ints(sizes) if sizes is not None else list(split or [])
    if not parts:
        n = num_outputs or ctx.n_outputs
        chunk = -(-dim // n)
        parts = [min(chunk, dim - i * chunk) for i in range(n)]
    if sum(parts) != dim or len(parts) != ctx.n_outputs:
        return NotImplemented
    offsets = np.cumsum([0] + parts)
    index = [slice(None)] * x.ndim
    outs = []
    for lo, hi in itertools.pairwise(offsets):
        index[axis] = slice(int(lo), int(hi))
        outs.append(x[tuple(index)])
    return tuple(outs)


@register("", "Shape")
def shape(xp, x, *, start=0, end=None):
    if not hasattr(x, "shape"):
        return NotImplemented
    return xp.asarray(np.array(x.shape[start:end], dtype=np.int64))


@register("", "Cast")
@any_device_dtype
def cast(xp, x, *, to, saturate=1, round_mode="up"):
    from onnx import helper

    target = np.dtype(helper.tensor_dtype_to_np_dtype(to))
    if target not in DEVICE_DTYPES:
        return NotImplemented
    return x.astype(target)


@register("", "Expand", host_inputs=(1,))
@any_device_dtype
def expand(xp, x, shape):
    target = np.broadcast_shapes(x.shape, tuple(_ints(shape)))
    return xp.ascontiguousarray(xp.broadcast_to(x, target))


@register("", "Where")
@any_device_dtype
def where(xp, condition, a, b):
    if condition.dtype != np.bool_ or a.dtype != b.dtype:
        return NotImplemented
    return xp.where(condition, a, b)
