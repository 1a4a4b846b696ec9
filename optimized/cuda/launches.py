"""Planned device kernels: what a node does, worked out once per input-shape signature.

A planner `plan(dev, node, ins, attrs)` sees its inputs as Specs (device tensors: shape and
dtype) or host arrays (constants: initializers, values derived from shapes), and returns either
Planned or a string saying why it cannot plan this node. Planned names its outputs (a new
buffer, or a reshaped view of an input), the scratch buffers it needs during the step, and
`bind(ins, outs, scratch)`, which returns the step's launches: zero-argument callables that only
launch work on the device's stream (ufuncs and copies into given buffers, device.gemm,
device.kernel, device.elementwise). Nothing shape-derived is computed in a launch, nothing is
allocated, copied to or from the host, or synchronized, so a run can be captured in a CUDA graph.
float16 is computed in float32 scratch where the op accumulates (GEMMs accumulate in float32).
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from onnx import helper

from reference.ops.conv import out_geometry, spatial_attrs

from . import raw_kernels
from .fusion import FLOAT_DTYPES, FusionGroup, find_groups, fusible

MS = "com.microsoft"
F32, F16 = np.dtype(np.float32), np.dtype(np.float16)


@dataclass(frozen=True)
class Spec:
    shape: tuple  # the value's shape as ONNX sees it
    dtype: np.dtype
    constant: bool = False  # the same device array on every run (an initializer)
    layout: str = ""  # "nhwc": a 4-D (n, c, h, w) value stored channels-last, as (n, h, w, c)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def stored_shape(self) -> tuple:
        if self.layout == NHWC:
            n, c, h, w = self.shape
            return (n, h, w, c)
        return tuple(self.shape)


NHWC = "nhwc"


@dataclass(frozen=True)
class View:
    """An output that is input `source` reshaped (no launch, no buffer)."""
    source: int
    shape: tuple


@dataclass
class Planned:
    outputs: list  # Spec | View per node output (None for an omitted optional output)
    bind: Callable  # bind(ins, outs, scratch) -> list of launches
    scratch: list = field(default_factory=list)


PLANNERS: dict[tuple[str, str], Callable] = {}
# planners that read channels-last inputs themselves; every other planner is given (n, c, h, w)
LAYOUT_AWARE = {("", "Conv"), (MS, "FusedConv")}


def planner(domain: str, *op_types: str):
    def wrap(fn):
        for op in op_types:
            PLANNERS[(domain, op)] = fn
        return fn

    return wrap


def _is_spec(v) -> bool:
    return isinstance(v, Spec)


def _ints(value) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _compute(dtype) -> np.dtype:
    return F32 if np.dtype(dtype) == F16 else np.dtype(dtype)


def _need_device(ins, positions, node) -> str | None:
    for i in positions:
        if i < len(ins) and ins[i] is not None and not _is_spec(ins[i]):
            return f"input {i} of {node.op_type} is a host constant where a device tensor is read"
    return None


# elementwise: each node as a one-node fusion group (one generated kernel) -------------------
@planner("", *[op for op in ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Neg", "Abs", "Exp",
                             "Log", "Sqrt", "Reciprocal", "Relu", "Sigmoid", "Tanh", "Erf", "Floor",
                             "Ceil", "Sin", "Cos", "LeakyRelu")])
def plan_elementwise(dev, node, ins, attrs):
    dtypes = {np.dtype(v.dtype) for v in ins if v is not None}
    if not fusible(node) or len(dtypes) != 1 or "broadcast" in attrs:
        return _plan_integer_arith(node, ins, attrs)
    dtype = dtypes.pop()
    if dtype not in FLOAT_DTYPES:
        return _plan_integer_arith(node, ins, attrs)
    group = find_groups([node], lambda i: True, (), {}, min_size=1)[0]
    return plan_group(dev, group, ins)


def plan_group(dev, group: FusionGroup, ins):
    """A fusion group (fusion.py's expression) as one launch of its generated kernel."""
    if any(not _is_spec(v) for v in ins):
        return "a host constant feeds an elementwise kernel"
    dtypes = {np.dtype(v.dtype) for v in ins}
    if not group.accepts(dtypes):
        return f"dtypes {sorted(map(str, dtypes))} are not one float dtype"
    shape = np.broadcast_shapes(*(v.shape for v in ins), *(c.shape for c in group.constants.values()))
    out = Spec(tuple(shape), ins[0].dtype if ins else group.dtype_of_constants)
    return Planned([out], lambda a, o, s: [dev.elementwise(group, a, o[0])])


_INTEGER_UFUNCS = {"Add": "add", "Sub": "subtract", "Mul": "multiply"}


def _plan_integer_arith(node, ins, attrs):
    name = _INTEGER_UFUNCS.get(node.op_type)
    if name is None or "broadcast" in attrs or len({np.dtype(v.dtype) for v in ins}) != 1:
        return f"{node.op_type} on {[str(v.dtype) for v in ins]} has no planned kernel"
    if any(not _is_spec(v) for v in ins):
        return "a host constant feeds an elementwise kernel"
    out = Spec(tuple(np.broadcast_shapes(*(v.shape for v in ins))), ins[0].dtype)

    def bind(a, o, s, _dev=None):
        xp = array_module(o[0])
        return [lambda: getattr(xp, name)(*a, out=o[0])]

    return Planned([out], bind)


def array_module(array):
    """The array module of a device array (numpy for the fake device's arrays)."""
    module = type(array).__module__.split(".")[0]
    if module == "cupy":
        import cupy

        return cupy
    return np


def _gelu_group(approximate: str, with_bias: bool) -> FusionGroup:
    x = "(a0 + a1)" if with_bias else "a0"
    if approximate == "tanh":
        inner = f"F(0.7978845608028654) * ({x} + F(0.044715) * {x} * {x} * {x})"
        text = f"(F(0.5) * {x} * (F(1.0) + op_tanh({inner})))"
    else:
        text = f"(F(0.5) * {x} * (F(1.0) + op_erf({x} * F(0.7071067811865476))))"
    inputs = ["x", "bias"] if with_bias else ["x"]
    return FusionGroup([], inputs, text, f"gelu_{approximate}{'_bias' if with_bias else ''}")


@planner("", "Gelu")
def plan_gelu(dev, node, ins, attrs):
    return plan_group(dev, _gelu_group(attrs.get("approximate", "none"), False), ins[:1])


@planner(MS, "Gelu")
def plan_ms_gelu(dev, node, ins, attrs):
    return plan_group(dev, _gelu_group("none", False), ins[:1])


@planner(MS, "FastGelu")
def plan_fast_gelu(dev, node, ins, attrs):
    with_bias = len(ins) > 1 and ins[1] is not None
    return plan_group(dev, _gelu_group("tanh", with_bias), ins[:2] if with_bias else ins[:1])


# GEMMs ------------------------------------------------------------------------------------
def _matmul_shape(a: Spec, b: Spec, trans_a, trans_b):
    m, k = (a.shape[-1], a.shape[-2]) if trans_a else a.shape[-2:]
    k2, n = (b.shape[-1], b.shape[-2]) if trans_b else b.shape[-2:]
    if k != k2:
        return None
    batch_a, batch_b = a.shape[:-2], b.shape[:-2]
    if batch_a and batch_b and batch_a != batch_b:
        return None
    return tuple(batch_a or batch_b) + (m, n)


def _plan_gemm(dev, a, b, trans_a, trans_b, alpha, node):
    if not (_is_spec(a) and _is_spec(b)) or a.dtype != b.dtype or np.dtype(a.dtype) not in FLOAT_DTYPES:
        return None, f"{node.op_type}: operands must be device tensors of one float dtype"
    if len(a.shape) < 2 or len(b.shape) < 2:
        return None, f"{node.op_type}: 1-D operands are not planned"
    shape = _matmul_shape(a, b, trans_a, trans_b)
    if shape is None:
        return None, f"{node.op_type}: batch shapes {a.shape} x {b.shape} need broadcasting"
    if trans_a and len(a.shape) > 2 and len(b.shape) == 2:
        return None, f"{node.op_type}: transA over a batch is not planned"
    return Spec(shape, a.dtype), None


@planner("", "MatMul")
def plan_matmul(dev, node, ins, attrs):
    out, reason = _plan_gemm(dev, ins[0], ins[1], False, False, 1.0, node)
    return reason or Planned([out], lambda a, o, s: [dev.gemm(a[0], a[1], o[0])])


@planner(MS, "FusedMatMul")
def plan_fused_matmul(dev, node, ins, attrs):
    if attrs.get("transBatchA") or attrs.get("transBatchB"):
        return "FusedMatMul with transBatch is not planned"
    ta, tb, alpha = bool(attrs.get("transA")), bool(attrs.get("transB")), float(attrs.get("alpha", 1.0))
    out, reason = _plan_gemm(dev, ins[0], ins[1], ta, tb, alpha, node)
    return reason or Planned([out], lambda a, o, s: [dev.gemm(a[0], a[1], o[0], ta, tb, alpha)])


@planner("", "Gemm")
@planner(MS, "FusedGemm")
def plan_gemm(dev, node, ins, attrs):
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    ta, tb = bool(attrs.get("transA")), bool(attrs.get("transB"))
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if "broadcast" in attrs or (_is_spec(a) and len(a.shape) != 2):
        return "Gemm: legacy broadcast or non-2-D operands"
    out, reason = _plan_gemm(dev, a, b, ta, tb, alpha, node)
    if reason:
        return reason
    if c is not None and (not _is_spec(c) or c.dtype != a.dtype):
        return "Gemm: C must be a device tensor of A's dtype"
    activation = attrs.get("activation")
    act = _inplace_activation(activation, attrs.get("activation_alpha"))
    if isinstance(act, str):
        return act

    def bind(x, o, s):
        launches = []
        if c is not None:
            xp = array_module(o[0])
            launches.append(lambda: xp.copyto(o[0], x[2]))
        launches.append(dev.gemm(x[0], x[1], o[0], ta, tb, alpha, beta if c is not None else 0.0))
        return launches + _apply(act, o[0], s)

    return Planned([out], bind, [out] if activation == "LeakyRelu" else [])


def _apply(act, y, scratch):
    """An in-place activation's launches; LeakyRelu's take the step's last scratch buffer."""
    import inspect

    if len(inspect.signature(act).parameters) == 2:
        return act(y, scratch[-1])
    return act(y)


def _inplace_activation(name, alpha=None):
    """launches(y) applying a fused activation in place, or why not."""
    if not name:
        return lambda y: []
    if name == "Relu":
        return lambda y: [lambda: array_module(y).maximum(y, 0, out=y)]
    if name == "Tanh":
        return lambda y: [lambda: array_module(y).tanh(y, out=y)]
    if name == "Sigmoid":
        def sigmoid(y):
            xp = array_module(y)
            return [lambda: xp.negative(y, out=y), lambda: xp.exp(y, out=y),
                    lambda: xp.add(y, 1, out=y), lambda: xp.reciprocal(y, out=y)]

        return sigmoid
    if name == "LeakyRelu" and 0.0 <= float(0.01 if alpha is None else alpha) <= 1.0:
        a = float(0.01 if alpha is None else alpha)  # max(y, a*y) for a slope in [0, 1]

        def leaky(y, scratch):
            xp = array_module(y)
            return [lambda: xp.multiply(y, a, out=scratch), lambda: xp.maximum(y, scratch, out=y)]

        return leaky
    return f"fused activation {name!r} is not planned"


# convolution and pooling ------------------------------------------------------------------
def _geometry(shape, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode=0, split=False):
    """kernel, strides, dilations, pad before, pad after, output size; the pad after includes
    the cells ceil_mode adds past the pads (given apart when `split`)."""
    kernel, strides, dilations, pads = spatial_attrs(2, kernel_shape, strides, dilations, pads)
    begin, end, out = out_geometry(shape[2:], kernel, strides, dilations, pads, auto_pad, ceil_mode)
    extra = [max(0, (o - 1) * s + (k - 1) * d + 1 - (size + b + e))
             for o, s, k, d, size, b, e in zip(out, strides, kernel, dilations, shape[2:], begin, end)]
    if split:
        return kernel, strides, dilations, begin, list(end), extra, out
    return kernel, strides, dilations, begin, [e + x for e, x in zip(end, extra)], out


def _padded_spec(x: Spec, begin, end):
    n, c, h, w = x.shape
    return Spec((n, c, h + begin[0] + end[0], w + begin[1] + end[1]), x.dtype)


def _pad_launches(x, padded, begin, fill):
    """Launches filling `padded` with `fill` and copying x into its interior."""
    xp = array_module(padded)
    h, w = x.shape[2:]
    interior = padded[:, :, begin[0]:begin[0] + h, begin[1]:begin[1] + w]
    return [lambda: padded.fill(fill), lambda: xp.copyto(interior, x)]


def _taps(source, kernel, strides, dilations, out):
    """Every kernel offset's strided view of the (padded) input, in (i, j) order."""
    views = []
    for i, j in itertools.product(range(kernel[0]), range(kernel[1])):
        r, c = i * dilations[0], j * dilations[1]
        views.append(source[:, :, r:r + strides[0] * (out[0] - 1) + 1:strides[0],
                            c:c + strides[1] * (out[1] - 1) + 1:strides[1]])
    return views


@planner("", "Conv")
@planner(MS, "FusedConv")
def plan_conv(dev, node, ins, attrs):
    x, w = ins[0], ins[1]
    b = ins[2] if len(ins) > 2 else None
    z = ins[3] if len(ins) > 3 else None
    reason = _need_device(ins, range(len(ins)), node)
    if reason:
        return reason
    if len(x.shape) != 4 or len(w.shape) != 4 or x.dtype != w.dtype:
        return "Conv: only 2-D convolution of one dtype is planned"
    group = int(attrs.get("group", 1))
    n, m, cg = x.shape[0], w.shape[0], w.shape[1]
    kernel, strides, dilations, begin, end, out = _geometry(
        x.shape, attrs.get("kernel_shape") or list(w.shape[2:]), attrs.get("strides"),
        attrs.get("dilations"), attrs.get("pads"), attrs.get("auto_pad", "NOTSET"))
    params = list(attrs.get("activation_params") or ())
    act = _inplace_activation(attrs.get("activation"), *params[:1])
    if isinstance(act, str):
        return act
    y = Spec((n, m, out[0], out[1]), x.dtype)
    if dev.cudnn_conv is not None:  # channels-last convolution (cuDNN), where the device has it
        planned = dev.cudnn_conv(x, w, b, z, y, strides, dilations, begin, end, group,
                                 attrs.get("activation") or "")
        if not isinstance(planned, str):
            return planned
    k_size = cg * kernel[0] * kernel[1]
    pointwise = kernel == [1, 1] and strides == [1, 1] and not any(begin + end)
    scratch = [] if pointwise else [Spec((n, x.shape[1], kernel[0], kernel[1], out[0], out[1]), x.dtype)]
    padded = any(begin + end)
    if padded:
        scratch.append(_padded_spec(x, begin, end))
    # channels-last inputs (made by a channels-last convolution) are copied to (n, c, h, w) first
    relayout = {k: len(scratch) + i for i, k in enumerate(
        k for k in (0, 3) if k < len(ins) and ins[k] is not None and ins[k].layout == NHWC)}
    scratch += [Spec(ins[k].shape, ins[k].dtype) for k in relayout]

    def bind(a, o, s):
        a = list(a)
        launches = []
        for k, at in relayout.items():
            launches.append(lambda d=s[at], v=a[k]: array_module(d).copyto(d, v.transpose(0, 3, 1, 2)))
            a[k] = s[at]
        xv, wv, yv = a[0], a[1], o[0]
        xp = array_module(yv)
        if pointwise:
            cols = xv.reshape(n, group, k_size, out[0] * out[1])
        else:
            source = xv
            if padded:
                launches += _pad_launches(xv, s[1], begin, 0)
                source = s[1]
            cols6 = s[0]
            for (i, j), view in zip(itertools.product(range(kernel[0]), range(kernel[1])),
                                    _taps(source, kernel, strides, dilations, out)):
                launches.append(lambda d=cols6[:, :, i, j], v=view: xp.copyto(d, v))
            cols = cols6.reshape(n, group, k_size, out[0] * out[1])
        weights = wv.reshape(group, m // group, k_size)
        result = yv.reshape(n, group, m // group, out[0] * out[1])
        for image in range(n):
            launches.append(dev.gemm(weights, cols[image], result[image]))
        if b is not None:
            launches.append(lambda: xp.add(yv, a[2].reshape(1, m, 1, 1), out=yv))
        if z is not None:
            launches.append(lambda: xp.add(yv, a[3], out=yv))
        return launches + _apply(act, yv, s)

    if attrs.get("activation") == "LeakyRelu":
        scratch.append(y)
    return Planned([y], bind, scratch)


def _plan_pool(ins, attrs, split=False):
    x = ins[0]
    if not _is_spec(x) or len(x.shape) != 4:
        return None
    return _geometry(x.shape, attrs.get("kernel_shape"), attrs.get("strides"), attrs.get("dilations"),
                     attrs.get("pads"), attrs.get("auto_pad", "NOTSET"), attrs.get("ceil_mode", 0), split)


@planner("", "MaxPool")
def plan_max_pool(dev, node, ins, attrs):
    if len(node.output) > 1 and node.output[1]:
        return "MaxPool with its Indices output is not planned"
    if attrs.get("storage_order"):
        return "MaxPool storage_order is not planned"
    geometry = _plan_pool(ins, attrs)
    if geometry is None:
        return "MaxPool: only 2-D pooling of a device tensor is planned"
    kernel, strides, dilations, begin, end, out = geometry
    x = ins[0]
    y = Spec((x.shape[0], x.shape[1], out[0], out[1]), x.dtype)
    padded = any(begin + end)

    lowest = -np.inf if np.dtype(x.dtype).kind == "f" else np.iinfo(x.dtype).min

    def bind(a, o, s):
        xp, yv = array_module(o[0]), o[0]
        launches = _pad_launches(a[0], s[0], begin, lowest) if padded else []
        taps = _taps(s[0] if padded else a[0], kernel, strides, dilations, out)
        launches.append(lambda: xp.copyto(yv, taps[0]))
        launches += [lambda v=v: xp.maximum(yv, v, out=yv) for v in taps[1:]]
        return launches

    return Planned([y], bind, [_padded_spec(x, begin, end)] if padded else [])


@planner("", "AveragePool")
def plan_average_pool(dev, node, ins, attrs):
    geometry = _plan_pool(ins, attrs, split=True)
    if geometry is None:
        return "AveragePool: only 2-D pooling of a device tensor is planned"
    kernel, strides, dilations, begin, declared_end, extra, out = geometry
    end = [e + x for e, x in zip(declared_end, extra)]
    x = ins[0]
    y = Spec((x.shape[0], x.shape[1], out[0], out[1]), x.dtype)
    work = _compute(x.dtype)
    # how many cells each window counts, worked out now on the host (a plan-time upload)
    ones = np.ones((1, 1) + tuple(x.shape[2:]), np.float64)
    if attrs.get("count_include_pad"):  # the pads count, the cells ceil_mode adds do not
        ones = np.pad(ones, [(0, 0), (0, 0)] + list(zip(begin, declared_end)), constant_values=1)
        ones = np.pad(ones, [(0, 0), (0, 0), (0, extra[0]), (0, extra[1])])
    else:
        ones = np.pad(ones, [(0, 0), (0, 0), (begin[0], end[0]), (begin[1], end[1])])
    count = sum(_taps(ones, kernel, strides, dilations, out))
    divisor = dev.to_device(count.astype(work))
    scratch = [Spec(y.shape, work)]
    padded = any(begin + end)
    if padded:
        scratch.append(_padded_spec(Spec(x.shape, work), begin, end))

    def bind(a, o, s):
        xp, total = array_module(o[0]), s[0]
        launches = []
        source = a[0]
        if padded:
            launches += _pad_launches(a[0], s[1], begin, 0)
            source = s[1]
        taps = _taps(source, kernel, strides, dilations, out)
        launches.append(lambda: xp.copyto(total, taps[0]))
        launches += [lambda v=v: xp.add(total, v, out=total) for v in taps[1:]]
        launches.append(lambda: xp.divide(total, divisor, out=total))
        launches.append(lambda: xp.copyto(o[0], total))
        return launches

    return Planned([y], bind, scratch)


@planner("", "GlobalAveragePool", "GlobalMaxPool")
def plan_global_pool(dev, node, ins, attrs):
    x = ins[0]
    if not _is_spec(x) or len(x.shape) < 3:
        return f"{node.op_type}: a device tensor of rank >= 3"
    axes = tuple(range(2, len(x.shape)))
    y = Spec(tuple(x.shape[:2]) + (1,) * len(axes), x.dtype)
    if node.op_type == "GlobalMaxPool":
        return Planned([y], lambda a, o, s: [lambda: array_module(o[0]).amax(a[0], axis=axes, keepdims=True, out=o[0])])
    work = _compute(x.dtype)

    def bind(a, o, s):
        xp = array_module(o[0])
        if work == x.dtype:
            return [lambda: xp.mean(a[0], axis=axes, keepdims=True, out=o[0])]
        return [lambda: xp.mean(a[0], axis=axes, keepdims=True, dtype=work, out=s[0]),
                lambda: xp.copyto(o[0], s[0])]

    return Planned([y], bind, [] if work == x.dtype else [Spec(y.shape, work)])


# row-wise ---------------------------------------------------------------------------------
@planner("", "Softmax")
def plan_softmax(dev, node, ins, attrs):
    x = ins[0]
    axis = attrs.get("axis", -1)
    if not _is_spec(x) or not x.shape or axis not in (-1, len(x.shape) - 1):
        return "Softmax: only the last axis of a device tensor is planned"
    work = _compute(x.dtype)
    rows = Spec(tuple(x.shape[:-1]) + (1,), work)
    scratch = [rows] + ([Spec(x.shape, work)] if work != x.dtype else [])

    def bind(a, o, s):
        xp, red = array_module(o[0]), s[0]
        e = s[1] if len(s) > 1 else o[0]
        launches = [] if e is o[0] else [lambda: xp.copyto(e, a[0])]
        source = e if e is not o[0] else a[0]
        launches += [lambda: xp.amax(source, axis=-1, keepdims=True, out=red),
                     lambda: xp.subtract(source, red, out=e), lambda: xp.exp(e, out=e),
                     lambda: xp.sum(e, axis=-1, keepdims=True, out=red),
                     lambda: xp.divide(e, red, out=e)]
        if e is not o[0]:
            launches.append(lambda: xp.copyto(o[0], e))
        return launches

    return Planned([Spec(x.shape, x.dtype)], bind, scratch)


@planner("", "LayerNormalization")
def plan_layer_normalization(dev, node, ins, attrs):
    if len(node.output) > 1 and any(node.output[1:]):
        return "LayerNormalization's Mean/InvStdDev outputs are not planned"
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    reason = _need_device(ins, range(len(ins)), node)
    if reason:
        return reason
    axis = attrs.get("axis", -1) % len(x.shape)
    normalized = tuple(x.shape[axis:])
    cols = int(np.prod(normalized))
    for v in (scale, bias):
        if v is not None and np.broadcast_shapes(tuple(v.shape), normalized) != normalized:
            return "LayerNormalization: scale/bias do not broadcast to the normalized axes"
    eps = float(attrs.get("epsilon", 1e-5))
    if np.dtype(x.dtype) not in (F32, F16):
        return f"LayerNormalization on {x.dtype} is not planned"
    cast = x.dtype != F32
    # the kernel reads float32 scale and bias of the normalized size, and float32 rows
    scratch = [Spec((cols,), F32), Spec((cols,), F32)]
    if cast:
        scratch += [Spec(x.shape, F32), Spec(x.shape, F32)]
    launch = dev.kernel(raw_kernels.LAYER_NORM)
    has_bias = int(bias is not None)

    def bind(a, o, s):
        xp = array_module(o[0])
        sc32, b32 = s[0], s[1]
        launches = [lambda: xp.copyto(sc32.reshape(normalized), a[1])]
        if bias is not None:
            launches.append(lambda: xp.copyto(b32.reshape(normalized), a[2]))
        if not cast:
            return launches + [launch(a[0], sc32, b32, o[0], cols=cols, eps=eps, has_bias=has_bias)]
        x32, y32 = s[2], s[3]
        launches.append(lambda: xp.copyto(x32, a[0]))
        launches.append(launch(x32, sc32, b32, y32, cols=cols, eps=eps, has_bias=has_bias))
        return launches + [lambda: xp.copyto(o[0], y32)]

    return Planned([Spec(x.shape, x.dtype)], bind, scratch)


def _plan_reduce(method):
    def plan(dev, node, ins, attrs):
        x = ins[0]
        if not _is_spec(x) or np.dtype(x.dtype) not in FLOAT_DTYPES or 0 in x.shape:
            return f"{node.op_type}: a non-empty float device tensor"
        given = ins[1] if len(ins) > 1 else None
        if _is_spec(given):
            return f"{node.op_type}: axes computed on the device"
        axes = attrs.get("axes") if given is None else _ints(given)
        if not axes:
            if attrs.get("noop_with_empty_axes"):
                return Planned([View(0, tuple(x.shape))], lambda a, o, s: [])
            axes = list(range(len(x.shape)))
        axes = tuple(sorted(a % len(x.shape) for a in axes))
        keep = bool(attrs.get("keepdims", 1))
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)
        work = _compute(x.dtype) if method in ("mean", "sum") else np.dtype(x.dtype)

        def bind(a, o, s):
            xp = array_module(o[0])
            fn = getattr(xp, method)
            if work == x.dtype:
                return [lambda: fn(a[0], axis=axes, keepdims=keep, out=o[0])]
            return [lambda: fn(a[0], axis=axes, keepdims=keep, dtype=work, out=s[0]),
                    lambda: xp.copyto(o[0], s[0])]

        return Planned([Spec(shape, x.dtype)], bind, [] if work == x.dtype else [Spec(shape, work)])

    return plan


for _op, _method in (("ReduceMean", "mean"), ("ReduceSum", "sum"), ("ReduceMax", "amax"),
                     ("ReduceMin", "amin")):
    PLANNERS[("", _op)] = _plan_reduce(_method)


# attention --------------------------------------------------------------------------------
@planner(MS, "MultiHeadAttention")
def plan_attention(dev, node, ins, attrs):
    names = ["query", "key", "value", "bias", "key_padding_mask", "attention_bias", "past_key",
             "past_value", "past_sequence_length", "cache_indirection"]
    given = dict(zip(names, ins))
    if any(given.get(n) is not None for n in ("bias", "key_padding_mask", "past_sequence_length",
                                                "cache_indirection")):
        return "MultiHeadAttention with bias, key_padding_mask or a cache index is not planned"
    q, k, v = given["query"], given.get("key"), given.get("value")
    reason = _need_device(ins, range(len(ins)), node)
    if reason or k is None or v is None:
        return reason or "MultiHeadAttention needs separate key and value"
    if any(len(t.shape) != 3 for t in (q, k, v)) or len({q.dtype, k.dtype, v.dtype}) != 1:
        return "MultiHeadAttention: 3-D query/key/value of one dtype"
    heads = int(attrs.get("num_heads", 1))
    b, s, hidden = q.shape
    h = hidden // heads
    if h > raw_kernels.ATTENTION_MAX_HEAD or v.shape[2] // heads != h:
        return f"MultiHeadAttention: head size {h} > {raw_kernels.ATTENTION_MAX_HEAD} or differs for V"
    past_k, past_v = given.get("past_key"), given.get("past_value")
    if (past_k is None) != (past_v is None):
        return "MultiHeadAttention: past_key without past_value (or the reverse)"
    past = past_k.shape[2] if past_k is not None else 0
    total = past + k.shape[1]
    bias = given.get("attention_bias")
    if bias is not None and np.broadcast_shapes(bias.shape, (b, heads, s, total)) != (b, heads, s, total):
        return "MultiHeadAttention: attention_bias does not broadcast to [B, N, S, T]"
    scale = float(attrs.get("scale") or raw_kernels.default_scale(h))
    causal, mask_value = int(attrs.get("unidirectional", 0)), float(attrs.get("mask_filter_value", -10000.0))
    outputs = [Spec((b, s, hidden), q.dtype)]
    wanted = [i for i, name in enumerate(node.output) if name]
    if any(i > 2 for i in wanted):
        return "MultiHeadAttention: more than three outputs"
    present = Spec((b, heads, total, h), q.dtype)
    outputs += [present if i in wanted else None for i in (1, 2)][:len(node.output) - 1]
    f32 = [Spec((b, heads, s, h), F32), Spec((b, heads, total, h), F32), Spec((b, heads, total, h), F32),
           Spec((b, heads, s, total) if bias is not None else (1,), F32), Spec((b, heads, s, h), F32)]
    launch = dev.kernel(raw_kernels.ATTENTION)

    def bind(a, o, sc):
        xp = array_module(o[0])
        qh, kh, vh, bias32, out32 = sc
        launches = [lambda: xp.copyto(qh, a[0].reshape(b, s, heads, h).transpose(0, 2, 1, 3))]
        for i, (new, old, dest) in enumerate(((a[1], _input(a, 6), kh), (a[2], _input(a, 7), vh))):
            if old is not None:
                launches.append(lambda d=dest, p=old: xp.copyto(d[:, :, :past], p))
            launches.append(lambda d=dest, x=new: xp.copyto(
                d[:, :, past:], x.reshape(b, x.shape[1], heads, h).transpose(0, 2, 1, 3)))
            if i + 1 < len(o) and o[i + 1] is not None:
                launches.append(lambda d=dest, r=o[i + 1]: xp.copyto(r, d))
        if bias is not None:
            launches.append(lambda: xp.copyto(bias32, a[5]))
        launches.append(launch(qh, kh, vh, bias32, out32, scale=scale, causal=causal,
                               mask_value=mask_value, has_bias=int(bias is not None)))
        launches.append(lambda: xp.copyto(o[0].reshape(b, s, heads, h), out32.transpose(0, 2, 1, 3)))
        return launches

    return Planned(outputs, bind, f32)


def _input(arrays, i):
    return arrays[i] if i < len(arrays) else None


# data movement ----------------------------------------------------------------------------
def _view(shape):
    return Planned([View(0, tuple(int(d) for d in shape))], lambda a, o, s: [])


@planner("", "Identity")
def plan_identity(dev, node, ins, attrs):
    return _view(ins[0].shape) if _is_spec(ins[0]) else "Identity of a host value"


@planner("", "Reshape")
def plan_reshape(dev, node, ins, attrs):
    x, shape = ins[0], ins[1] if len(ins) > 1 else None
    if shape is None or _is_spec(shape):
        return "Reshape: the shape must be known when the plan is built"
    target = _ints(shape)
    if not attrs.get("allowzero"):
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    if target.count(-1) == 1:
        known = int(np.prod([d for d in target if d != -1]))
        target[target.index(-1)] = int(np.prod(x.shape)) // known if known else 0
    if int(np.prod(target)) != int(np.prod(x.shape)) or any(d < 0 for d in target):
        return f"Reshape: {x.shape} cannot become {_ints(shape)}"
    return _view(target)


@planner("", "Flatten")
def plan_flatten(dev, node, ins, attrs):
    x = ins[0]
    axis = attrs.get("axis", 1)
    axis = axis + len(x.shape) if axis < 0 else axis
    return _view((int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:]))))


@planner("", "Squeeze", "Unsqueeze")
def plan_squeeze(dev, node, ins, attrs):
    x = ins[0]
    given = ins[1] if len(ins) > 1 else None
    if _is_spec(given):
        return f"{node.op_type}: axes computed on the device"
    axes = attrs.get("axes") if given is None else _ints(given)
    shape = list(x.shape)
    if node.op_type == "Squeeze":
        drop = {a % len(shape) for a in axes} if axes else {i for i, d in enumerate(shape) if d == 1}
        return _view([d for i, d in enumerate(shape) if i not in drop])
    rank = len(shape) + len(axes)
    for a in sorted(a % rank for a in axes):
        shape.insert(a, 1)
    return _view(shape)


@planner("", "Transpose")
def plan_transpose(dev, node, ins, attrs):
    x = ins[0]
    perm = attrs.get("perm") or list(reversed(range(len(x.shape))))
    out = Spec(tuple(x.shape[p] for p in perm), x.dtype)
    return Planned([out], lambda a, o, s: [lambda: array_module(o[0]).copyto(o[0], a[0].transpose(perm))])


@planner("", "Concat")
def plan_concat(dev, node, ins, attrs):
    if any(not _is_spec(v) for v in ins) or len({v.dtype for v in ins}) != 1:
        return "Concat: device tensors of one dtype"
    axis = attrs["axis"] % len(ins[0].shape)
    shape = list(ins[0].shape)
    shape[axis] = sum(v.shape[axis] for v in ins)
    offsets = np.cumsum([0] + [v.shape[axis] for v in ins])

    def bind(a, o, s):
        xp, launches = array_module(o[0]), []
        for lo, hi, part in zip(offsets[:-1], offsets[1:], a):
            index = [slice(None)] * len(shape)
            index[axis] = slice(int(lo), int(hi))
            launches.append(lambda d=o[0][tuple(index)], p=part: xp.copyto(d, p))
        return launches

    return Planned([Spec(tuple(shape), ins[0].dtype)], bind)


@planner("", "Split")
def plan_split(dev, node, ins, attrs):
    x = ins[0]
    sizes = ins[1] if len(ins) > 1 else None
    if _is_spec(sizes):
        return "Split: sizes computed on the device"
    axis = attrs.get("axis", 0) % len(x.shape)
    dim = x.shape[axis]
    parts = _ints(sizes) if sizes is not None else list(attrs.get("split") or [])
    if not parts:
        count = attrs.get("num_outputs") or len(node.output)
        chunk = -(-dim // count)
        parts = [min(chunk, dim - i * chunk) for i in range(count)]
    if sum(parts) != dim or len(parts) != len(node.output):
        return "Split: sizes do not add up"
    offsets = np.cumsum([0] + parts)
    outs = []
    for p in parts:
        shape = list(x.shape)
        shape[axis] = p
        outs.append(Spec(tuple(shape), x.dtype))

    def bind(a, o, s):
        xp, launches = array_module(a[0]), []
        for lo, hi, dest in zip(offsets[:-1], offsets[1:], o):
            index = [slice(None)] * len(x.shape)
            index[axis] = slice(int(lo), int(hi))
            launches.append(lambda d=dest, v=a[0][tuple(index)]: xp.copyto(d, v))
        return launches

    return Planned(outs, bind)


@planner("", "Slice")
def plan_slice(dev, node, ins, attrs):
    x = ins[0]
    if any(_is_spec(v) for v in ins[1:]) or len(ins) < 3:
        return "Slice: starts/ends must be known when the plan is built"
    starts, ends = _ints(ins[1]), _ints(ins[2])
    axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
    steps = _ints(ins[4]) if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    index = [slice(None)] * len(x.shape)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[axis % len(x.shape)] = _slice(start, end, step, x.shape[axis % len(x.shape)])
    shape = np.broadcast_to(np.empty((), np.bool_), x.shape)[tuple(index)].shape  # no memory
    return Planned([Spec(tuple(shape), x.dtype)],
                   lambda a, o, s: [lambda: array_module(o[0]).copyto(o[0], a[0][tuple(index)])])


def _slice(start, end, step, dim) -> slice:
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


@planner("", "Cast")
def plan_cast(dev, node, ins, attrs):
    from .arrays import DEVICE_DTYPES

    target = np.dtype(helper.tensor_dtype_to_np_dtype(attrs["to"]))
    if target not in DEVICE_DTYPES:
        return f"Cast to {target} stays on the host"
    return Planned([Spec(ins[0].shape, target)],
                   lambda a, o, s: [lambda: array_module(o[0]).copyto(o[0], a[0], casting="unsafe")])


@planner("", "Expand")
def plan_expand(dev, node, ins, attrs):
    x, shape = ins[0], ins[1]
    if _is_spec(shape):
        return "Expand: the shape must be known when the plan is built"
    target = tuple(np.broadcast_shapes(tuple(x.shape), tuple(_ints(shape))))
    return Planned([Spec(target, x.dtype)], lambda a, o, s: [lambda: array_module(o[0]).copyto(o[0], a[0])])


@planner("", "Gather")
def plan_gather(dev, node, ins, attrs):
    x, indices = ins
    if not _is_spec(x) or not x.shape:
        return "Gather: a device tensor of rank >= 1"
    axis = attrs.get("axis", 0) % len(x.shape)
    if not _is_spec(indices):
        indices = np.where(indices < 0, indices + x.shape[axis], indices)  # normalised now
        if indices.size and (indices.min() < 0 or indices.max() >= x.shape[axis]):
            return "Gather: an index out of range"
    shape = tuple(x.shape[:axis]) + tuple(indices.shape) + tuple(x.shape[axis + 1:])
    fixed = None if _is_spec(indices) else dev.to_device(np.ascontiguousarray(indices))

    def bind(a, o, s):
        xp, idx = array_module(o[0]), a[1] if fixed is None else fixed
        # cupy.take wraps indices; numpy's default mode buffers `out` (an allocation)
        wrap = {"mode": "wrap"} if xp is np else {}
        return [lambda: xp.take(a[0], idx, axis=axis, out=o[0], **wrap)]

    return Planned([Spec(shape, x.dtype)], bind)


@planner("", "Where")
def plan_where(dev, node, ins, attrs):
    cond, a_, b_ = ins
    if any(not _is_spec(v) for v in ins) or np.dtype(cond.dtype) != np.bool_ or a_.dtype != b_.dtype:
        return "Where: device tensors, a bool condition, one value dtype"
    shape = tuple(np.broadcast_shapes(cond.shape, a_.shape, b_.shape))

    def bind(a, o, s):
        xp = array_module(o[0])
        return [lambda: xp.copyto(o[0], a[2]), lambda: xp.copyto(o[0], a[1], where=a[0])]

    return Planned([Spec(shape, a_.dtype)], bind)


def shape_constant(spec: Spec, attrs) -> np.ndarray:
    """Shape's output for an input of a known shape: a plan-time constant."""
    return np.array(spec.shape[attrs.get("start", 0):attrs.get("end")], np.int64)
