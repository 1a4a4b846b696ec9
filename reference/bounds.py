"""The error each op's arithmetic allows, written beside the op, with the reason.

A bound is an array of absolute errors, one per output element (or broadcastable to it),
that a correct kernel may make in the accumulation type whose unit roundoff is `u`, computed
from the float64 inputs, the float64 truth `y` and the node's attributes. The agreement module
adds the final rounding to the output type (u_out * |y|) and a gradual-underflow floor.

Notation: gamma(n, u) = n*u / (1 - n*u), Higham's bound for n roundings in any order:
|fl(sum x_i) - sum x_i| <= gamma(n-1, u) * sum |x_i| and |fl(a . b) - a . b| <= gamma(n, u) *
sum |a_i b_i| for every summation order (recursive, blocked, pairwise, any BLAS tiling).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from onnx import AttributeProto, helper, numpy_helper

from .registry import canonical_domain, lookup

MS = "com.microsoft"


def gamma(n, u: float):
    n = np.asarray(n, dtype=np.float64)
    nu = n * u
    return np.where(nu < 1, nu / np.maximum(1 - nu, 1e-300), np.inf)


@dataclass(frozen=True)
class Rule:
    bound: Callable | None  # (inputs, y, attrs, opset, u) -> allowed absolute error
    reason: str
    exact: bool = False  # the result must equal the reference op's bit for bit (NaN == NaN)
    truth_in: Callable | None = None  # attrs -> the type the reference op computes its truth in
    outputs: tuple = (0,)  # which outputs the bound covers; others fall back to the corpus rule

    def allowed(self, inputs, y, attrs, opset, u):
        return self.bound(inputs, y, attrs, opset, u)

    def truth_dtype(self, attrs):
        return np.dtype(self.truth_in(attrs)) if self.truth_in is not None else None

    def covers(self, i: int) -> bool:
        return i in self.outputs


RULES: dict[tuple[str, str], Rule] = {}


def rule(*ops, reason: str, domain: str = "", exact: bool = False, truth_in=None):
    def register(fn):
        for op_type in ops:
            RULES[(domain, op_type)] = Rule(fn, reason, exact, truth_in)
        return fn

    return register


def rule_for(node) -> Rule | None:
    return RULES.get((canonical_domain(node.domain), node.op_type))


def node_attributes(node) -> dict:
    """A node's static attributes as Python values (strings decoded, tensors as arrays)."""
    attrs = {}
    for a in node.attribute:
        if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) or a.ref_attr_name:
            continue
        value = helper.get_attribute_value(a)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode() for v in value]
        elif a.type == AttributeProto.TENSOR:
            value = numpy_helper.to_array(value)
        attrs[a.name] = value
    return attrs


# exact ops -------------------------------------------------------------------------------------
for _op in ("Relu", "Abs", "Neg", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
            "Transpose", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND",
            "Expand", "Tile", "Pad", "MaxPool", "GlobalMaxPool", "ReduceMax", "ReduceMin", "Max",
            "Min", "Where", "Cast", "Sign", "Floor", "Ceil", "Round", "DepthToSpace",
            "SpaceToDepth", "ScatterND", "ScatterElements", "TopK", "Clip"):
    RULES[("", _op)] = Rule(None, "moves, selects or compares values, or rounds once to the "
                                  "output type: the result is the reference op's, bit for bit",
                            exact=True)


# elementwise -----------------------------------------------------------------------------------
def _ulps(n: float, magnitude=None):
    """n units of roundoff of `magnitude(inputs, y)` (default: of the result)."""
    def bound(inputs, y, attrs, opset, u):
        return n * u * (np.abs(y) if magnitude is None else magnitude(inputs, y, attrs))

    return bound


# A bound here covers the roundings before the last; the agreement module adds the last, the
# rounding to the output type (u_out |y|). One correctly rounded IEEE operation therefore has
# nothing more to add.
RULES[("", "Add")] = RULES[("", "Sub")] = RULES[("", "Mul")] = Rule(
    _ulps(0), "one IEEE operation, correctly rounded: only the rounding to the output type")
RULES[("", "Div")] = Rule(
    _ulps(1), "a / b, or a * (1/b) as vectorised kernels compute it: one rounding more")
RULES[("", "LeakyRelu")] = Rule(_ulps(0), "alpha * x for x < 0: one rounding, the output's")
RULES[("", "Sigmoid")] = Rule(
    _ulps(4), "1 / (1 + e^-x): exp within 2 ulps, then an add and a divide; no cancellation")
RULES[("", "Exp")] = Rule(_ulps(4), "a libm or vectorised exp is within a few ulps")
RULES[("", "Log")] = Rule(_ulps(4), "a libm log is within a few ulps")
RULES[("", "Sqrt")] = Rule(_ulps(0), "IEEE sqrt is correctly rounded: the output's rounding")
RULES[("", "Reciprocal")] = Rule(_ulps(0), "one correctly rounded division: the output's rounding")
RULES[("", "Erf")] = Rule(_ulps(4), "a libm or polynomial erf is within a few ulps")


def _tanh_magnitude(inputs, y, attrs):
    x = np.abs(inputs[0])
    return np.maximum(np.abs(y), np.minimum(1.0, 64 * x))


RULES[("", "Tanh")] = Rule(
    _ulps(4, _tanh_magnitude),
    "tanh through e = exp(-2|x|) as (1 - e) / (1 + e): the numerator cancels, so the error is a "
    "few u absolute once that formula is used (|x| above about 1/64), and a few ulps of the "
    "result below, where a polynomial in x is")


def _gelu_magnitude(inputs, y, attrs):
    # 0.5 x + 0.5 x erf(x / sqrt 2): the two terms cancel for x < 0, so the error is a few u of
    # |x| / 2, not of the (tiny) result
    return np.abs(y) + 0.5 * np.abs(inputs[0])


def _gelu_bias_magnitude(inputs, y, attrs):
    x = inputs[0] if len(inputs) < 2 or inputs[1] is None else inputs[0] + inputs[1]
    # the bias add's rounding (u |x + b|) passes through a gelu of slope at most 1.13
    return np.abs(y) + 0.5 * np.abs(x) + 1.13 * np.abs(x) / 6


_GELU_REASON = ("0.5 x (1 + erf(x / sqrt 2)) or its tanh form: erf/tanh within a few ulps, "
                "and the sum 0.5 x + 0.5 x erf(...) cancels for x < 0, so a few u of |x| / 2")
RULES[("", "Gelu")] = Rule(_ulps(6, _gelu_magnitude), _GELU_REASON)
RULES[(MS, "Gelu")] = Rule(_ulps(6, _gelu_magnitude), _GELU_REASON)
RULES[(MS, "FastGelu")] = Rule(_ulps(6, _gelu_bias_magnitude),
                               _GELU_REASON + "; x + bias first: one more rounding")
RULES[(MS, "BiasGelu")] = Rule(_ulps(6, _gelu_bias_magnitude),
                               _GELU_REASON + "; x + bias first: one more rounding")


@rule("Sum", reason="an n-ary sum in any order: gamma(n - 1) * sum |x_i|")
def _variadic_sum(inputs, y, attrs, opset, u):
    values = [np.abs(v) for v in inputs if v is not None]
    return gamma(len(values) - 1, u) * sum(values[1:], values[0])


@rule("Mean", reason="an n-ary sum in any order, then one divide: gamma(n) * mean |x_i|")
def _variadic_mean(inputs, y, attrs, opset, u):
    values = [np.abs(v) for v in inputs if v is not None]
    return gamma(len(values), u) * sum(values[1:], values[0]) / len(values)


# dot products: MatMul, Gemm, Conv and their fused forms ---------------------------------------
_LIPSCHITZ = {"": 1.0, "Relu": 1.0, "Tanh": 1.0, "Sigmoid": 0.25, "Clip": 1.0}


def _activation_error(pre_error, y, activation, params, u):
    """An activation after the dot product: the error before it, times the activation's
    largest slope, plus the activation's own few ulps."""
    params = list(params or [])
    if activation in ("LeakyRelu", "HardSigmoid"):
        slope = abs(params[0]) if params else (0.01 if activation == "LeakyRelu" else 0.2)
        slope = max(slope, 1.0) if activation == "LeakyRelu" else slope
    else:
        slope = _LIPSCHITZ.get(activation or "", 1.0)
    own = 0.0 if activation in ("", "Relu", "Clip", None) else 4 * u * np.abs(y)
    return slope * pre_error + own


def _matmul_abs(a, b):
    return np.matmul(np.abs(a), np.abs(b))


@rule("MatMul", reason="each element is a dot product of length K: gamma(K) * sum |a_k b_k|, "
                       "for any summation order")
def _matmul_bound(inputs, y, attrs, opset, u):
    a, b = inputs[0], inputs[1]
    k = a.shape[-1]
    return gamma(k, u) * np.reshape(_matmul_abs(a, b), np.shape(y))


def _swap(m, trans):
    return np.swapaxes(m, -1, -2) if trans and m.ndim >= 2 else m


@rule("FusedMatMul", domain=MS,
      reason="alpha * (A' B'): gamma(K + 1) * |alpha| * sum |a_k b_k| (one more rounding for "
             "alpha)")
def _fused_matmul_bound(inputs, y, attrs, opset, u):
    a = _swap(inputs[0], attrs.get("transA", 0))
    b = _swap(inputs[1], attrs.get("transB", 0))
    if attrs.get("transBatchA") or attrs.get("transBatchB"):
        raise NotImplementedError("transBatch")
    return gamma(a.shape[-1] + 1, u) * abs(attrs.get("alpha", 1.0)) * np.reshape(
        _matmul_abs(a, b), np.shape(y))


def _gemm_bound(inputs, y, attrs, opset, u):
    a = inputs[0].T if attrs.get("transA", 0) else inputs[0]
    b = inputs[1].T if attrs.get("transB", 0) else inputs[1]
    c = inputs[2] if len(inputs) > 2 and inputs[2] is not None else 0.0
    magnitude = abs(attrs.get("alpha", 1.0)) * _matmul_abs(a, b) + \
        abs(attrs.get("beta", 1.0)) * np.abs(c)
    pre = gamma(a.shape[-1] + 2, u) * magnitude
    params = [p for p in (attrs.get("activation_alpha"), attrs.get("activation_beta"))
              if p is not None]
    return _activation_error(pre, y, attrs.get("activation", ""), params, u)


_GEMM_REASON = ("alpha * A' B' + beta * C: a dot product of length K plus two roundings, "
                "gamma(K + 2) * (|alpha| sum |a_k b_k| + |beta c|), for any summation order; a "
                "fused activation multiplies that by its largest slope and adds a few ulps")
RULES[("", "Gemm")] = Rule(_gemm_bound, _GEMM_REASON)
RULES[(MS, "FusedGemm")] = Rule(_gemm_bound, _GEMM_REASON)


def _conv_attrs(attrs):
    return {k: v for k, v in attrs.items()
            if k in ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides") and v}


def _conv_bound(inputs, y, attrs, opset, u):
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
    z = inputs[3] if len(inputs) > 3 and inputs[3] is not None else None
    conv = lookup("", "Conv", 11).fn
    magnitude = conv(np.abs(x), np.abs(w), **_conv_attrs(attrs))
    if b is not None:
        magnitude = magnitude + np.abs(b).reshape((1, -1) + (1,) * (magnitude.ndim - 2))
    if z is not None:
        magnitude = magnitude + np.abs(z)
    k = int(np.prod(w.shape[1:]))
    pre = gamma(k + 2, u) * magnitude
    return _activation_error(pre, y, attrs.get("activation", ""),
                             attrs.get("activation_params"), u)


_CONV_REASON = ("each output is a dot product of length K = C/group * kernel size, plus bias "
                "(and a residual): gamma(K + 2) * (conv(|x|, |w|) + |b| + |z|), for any "
                "summation order or blocking (direct, im2col, GEMM per tap); a fused activation "
                "multiplies by its slope and adds a few ulps")
RULES[("", "Conv")] = Rule(_conv_bound, _CONV_REASON)
RULES[(MS, "FusedConv")] = Rule(_conv_bound, _CONV_REASON)


# row-wise: Softmax, LayerNormalization ---------------------------------------------------------
def _softmax_axes(x, attrs, opset):
    axis = attrs.get("axis", -1 if opset >= 13 else 1)
    axis = axis % max(x.ndim, 1)
    return (axis,) if opset >= 13 else tuple(range(axis, x.ndim))


def softmax_error(x, p, axes, u, exp_ulps=4):
    """exp(x_i - m) / sum_j exp(x_j - m): the rounded argument x_i - m carries u |x_i - m|, so
    its exp a relative u |x_i - m| more than exp's own ulps; the denominator carries the
    p-weighted mean of those plus gamma(N) of its sum; one division."""
    m = np.max(x, axis=axes, keepdims=True)
    with np.errstate(invalid="ignore"):
        d = np.abs(x - m)
    # an element at -inf (a masked position) has p = 0 exactly and adds no error anywhere
    d = np.where(p > 0, d, 0.0)
    n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    weighted = np.sum(p * d, axis=axes, keepdims=True)
    relative = u * (d + weighted) + (2 * exp_ulps + 2) * u + gamma(n, u)
    return p * relative


@rule("Softmax", reason=softmax_error.__doc__)
def _softmax_bound(inputs, y, attrs, opset, u):
    x = inputs[0]
    return softmax_error(x, y, _softmax_axes(x, attrs, opset), u)


def _layer_norm_bound(inputs, y, attrs, opset, u):
    x, scale = inputs[0], inputs[1]
    axis = attrs.get("axis", -1) % x.ndim
    axes = tuple(range(axis, x.ndim))
    eps = attrs.get("epsilon", 1e-5)
    n = int(np.prod(x.shape[axis:]))
    mu = x.mean(axis=axes, keepdims=True)
    d = x - mu
    var = (d * d).mean(axis=axes, keepdims=True)
    r = 1.0 / np.sqrt(var + eps)
    d_mu = gamma(n + 1, u) * np.abs(x).mean(axis=axes, keepdims=True)
    d_d = u * np.abs(d) + d_mu
    # the variance as mean((x - mu)^2) or, in one pass, mean(x^2) - mu^2: gamma(N + 2) of
    # mean(x^2) covers both, plus what the error in mu carries into it
    d_var = gamma(n + 3, u) * (x * x).mean(axis=axes, keepdims=True) + \
        2 * d_mu * np.abs(d).mean(axis=axes, keepdims=True) + u * eps
    d_r = r * (0.5 * d_var / (var + eps) + 3 * u)
    normalized = np.abs(d) * r
    d_norm = d_d * r + np.abs(d) * d_r + u * normalized
    return np.abs(scale) * d_norm + 2 * u * normalized * np.abs(scale)


RULES[("", "LayerNormalization")] = Rule(
    _layer_norm_bound,
    "(x - mu) / sqrt(var + eps) * scale + bias: mu within gamma(N+1) mean|x|; x - mu one "
    "rounding plus mu's error; var within gamma(N+3) mean(x^2) (true of the two-pass and the "
    "one-pass E[x^2] - mu^2 formula) plus twice mu's error times mean|x - mu|; rsqrt half of "
    "var's relative error plus three roundings; the scale and bias two more",
    truth_in=lambda attrs: _stash(attrs))


def _stash(attrs):
    from .dtypes import np_dtype

    return np_dtype(attrs.get("stash_type", 1))


# reductions ------------------------------------------------------------------------------------
def _reduce_axes(x, inputs, attrs, opset):
    axes = inputs[1] if len(inputs) > 1 and inputs[1] is not None else attrs.get("axes")
    if axes is None or np.size(axes) == 0:
        if attrs.get("noop_with_empty_axes", 0):
            return ()
        return tuple(range(x.ndim))
    return tuple(int(a) % max(x.ndim, 1) for a in np.asarray(axes).reshape(-1))


def _reduced(x, inputs, attrs, opset, fn):
    axes = _reduce_axes(x, inputs, attrs, opset)
    n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    keep = bool(attrs.get("keepdims", 1))
    return fn(x, axes, keep), n


def _sum_of(v, axes, keep):
    return np.sum(v, axis=axes, keepdims=keep)


@rule("ReduceSum", "ReduceL1",
      reason="a sum of N terms in any order: gamma(N - 1) * sum |x|")
def _reduce_sum_bound(inputs, y, attrs, opset, u):
    total, n = _reduced(np.abs(inputs[0]), inputs, attrs, opset, _sum_of)
    return gamma(max(n - 1, 0), u) * total


@rule("ReduceMean", reason="a sum of N terms in any order, then one divide: gamma(N) * mean |x|")
def _reduce_mean_bound(inputs, y, attrs, opset, u):
    total, n = _reduced(np.abs(inputs[0]), inputs, attrs, opset, _sum_of)
    return gamma(n, u) * total / max(n, 1)


@rule("ReduceSumSquare", reason="N squares and their sum: gamma(N) * sum x^2")
def _reduce_sum_square_bound(inputs, y, attrs, opset, u):
    total, n = _reduced(inputs[0] ** 2, inputs, attrs, opset, _sum_of)
    return gamma(n, u) * total


@rule("ReduceL2", reason="sqrt of a sum of N squares: half its relative error gamma(N), "
                         "plus the sqrt's rounding")
def _reduce_l2_bound(inputs, y, attrs, opset, u):
    n = _reduced(inputs[0], inputs, attrs, opset, _sum_of)[1]
    return (0.5 * gamma(n, u) + u) * np.abs(y)


@rule("ReduceLogSum", reason="log of a sum: the sum's absolute error gamma(N - 1) sum |x| over "
                             "|sum|, plus the log's few ulps")
def _reduce_log_sum_bound(inputs, y, attrs, opset, u):
    total, n = _reduced(np.abs(inputs[0]), inputs, attrs, opset, _sum_of)
    plain, _ = _reduced(inputs[0], inputs, attrs, opset, _sum_of)
    with np.errstate(divide="ignore", invalid="ignore"):
        return gamma(max(n - 1, 0), u) * total / np.abs(plain) + 4 * u * np.abs(y)


@rule("ReduceLogSumExp", reason="m + log(sum exp(x - m)): the denominator of a softmax (its "
                                "relative error is the log's absolute one), plus the add of m")
def _reduce_log_sum_exp_bound(inputs, y, attrs, opset, u):
    x = inputs[0]
    axes = _reduce_axes(x, inputs, attrs, opset)
    n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    m = np.max(x, axis=axes, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - m)
        p = e / np.sum(e, axis=axes, keepdims=True)
        d = np.where(p > 0, np.abs(x - m), 0.0)
    relative = np.sum(p * u * d, axis=axes, keepdims=True) + 6 * u + gamma(n, u)
    bound = relative + u * np.abs(m) + 4 * u * np.abs(np.log(np.sum(e, axis=axes, keepdims=True)))
    if not attrs.get("keepdims", 1):
        bound = np.squeeze(bound, axis=axes)
    return bound + u * np.abs(y)


@rule("ReduceProd", reason="N - 1 multiplications: gamma(N - 1) * |product|")
def _reduce_prod_bound(inputs, y, attrs, opset, u):
    n = _reduced(inputs[0], inputs, attrs, opset, _sum_of)[1]
    return gamma(max(n - 1, 0), u) * np.abs(y)


# pools -----------------------------------------------------------------------------------------
@rule("AveragePool", reason="a window sum of at most prod(kernel_shape) terms and one divide: "
                            "gamma(K) * average_pool(|x|)")
def _average_pool_bound(inputs, y, attrs, opset, u):
    pool = lookup("", "AveragePool", opset).fn
    magnitude = pool(np.abs(inputs[0]), **{k: v for k, v in attrs.items()})
    return gamma(int(np.prod(attrs["kernel_shape"])), u) * magnitude


@rule("GlobalAveragePool", reason="a sum over H*W and one divide: gamma(H*W) * mean |x|")
def _global_average_pool_bound(inputs, y, attrs, opset, u):
    x = np.abs(inputs[0])
    axes = tuple(range(2, x.ndim))
    n = int(np.prod(x.shape[2:]))
    return gamma(n, u) * x.mean(axis=axes, keepdims=True)


# attention -------------------------------------------------------------------------------------
def _heads(t, n):
    b, s, hidden = t.shape
    return t.reshape(b, s, n, hidden // n).transpose(0, 2, 1, 3)


@rule("MultiHeadAttention", domain=MS,
      reason="softmax(scale Q K^T + bias) V: the scores as dot products of length H "
             "(gamma(H + 2)); softmax moves p_i by p_i (|ds_i| + sum_j p_j |ds_j|) plus its own "
             "error; the product with V is a dot product of length L plus |dP| |V|")
def _mha_bound(inputs, y, attrs, opset, u):
    q, k, v = inputs[0], inputs[1], inputs[2]
    extra = [t for t in inputs[3:5] + inputs[6:] if t is not None]
    if q.ndim != 3 or k is None or k.ndim != 3 or v is None or v.ndim != 3 or extra:
        raise NotImplementedError("only the unpacked [B, S, N*H] form has a written bound")
    n = attrs.get("num_heads", 1)
    bias = inputs[5] if len(inputs) > 5 else None
    qh, kh, vh = _heads(q, n), _heads(k, n), _heads(v, n)
    h = qh.shape[-1]
    scale = attrs.get("scale", 0.0) or 1.0 / np.sqrt(h)
    scores = scale * qh @ np.swapaxes(kh, -1, -2) + (0.0 if bias is None else bias)
    d_scores = gamma(h + 2, u) * (scale * np.abs(qh) @ np.abs(np.swapaxes(kh, -1, -2))
                                  + (0.0 if bias is None else np.abs(bias)))
    e = np.exp(scores - scores.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    d_p = p * (d_scores + np.sum(p * d_scores, -1, keepdims=True)) + \
        softmax_error(scores, p, (scores.ndim - 1,), u)
    d_out = gamma(kh.shape[-2], u) * (p @ np.abs(vh)) + d_p @ np.abs(vh)
    b, heads, s, hv = d_out.shape
    return d_out.transpose(0, 2, 1, 3).reshape(b, s, heads * hv)


# quantized weights, RMS normalization ----------------------------------------------------------
@rule("MatMulNBits", domain=MS,
      reason="a @ w^T + bias with w the dequantized weights ((code - zero point) * scale, one "
             "rounding): a dot product of length K, gamma(K + 2) * sum |a_k w_k| and u |bias|")
def _matmul_nbits_bound(inputs, y, attrs, opset, u):
    from .ops.contrib import dequantized_nbits

    a, b, scales = inputs[0], inputs[1], inputs[2]
    zero_points = inputs[3] if len(inputs) > 3 else None
    g_idx = inputs[4] if len(inputs) > 4 else None
    bias = inputs[5] if len(inputs) > 5 else None
    w = dequantized_nbits(b, scales, zero_points, g_idx, K=attrs["K"], N=attrs["N"],
                          bits=attrs.get("bits", 4), block_size=attrs["block_size"])
    magnitude = np.abs(a) @ np.abs(w.astype(np.float64)).T
    return gamma(a.shape[-1] + 2, u) * magnitude + (0.0 if bias is None else u * np.abs(bias))


def _rms_error(s, y, axes, u, s_error=0.0):
    """y = s / sqrt(mean(s^2) + eps) * scale: the mean of N squares within gamma(N + 1), the
    reciprocal square root half of that plus three roundings, two multiplications; an error
    ds in s moves y_i by ds_i |y_i / s_i| and the rms by sum s_j ds_j / sum s_j^2."""
    n = int(np.prod([s.shape[a] for a in axes]))
    relative = 0.5 * gamma(n + 1, u) + 5 * u
    if np.ndim(s_error) == 0 and s_error == 0.0:
        return relative * np.abs(y)
    squares = np.sum(s * s, axis=axes, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        through_rms = np.where(squares > 0, np.sum(np.abs(s) * s_error, axis=axes,
                                                   keepdims=True) / squares, 0.0)
        per_unit = np.where(s != 0, np.abs(y / s), 0.0)
    return (relative + through_rms) * np.abs(y) + s_error * per_unit


def _rms_bound(inputs, y, attrs, opset, u):
    x = inputs[0]
    axis = attrs.get("axis", -1) % max(x.ndim, 1)
    return _rms_error(x, y, tuple(range(axis, x.ndim)), u)


RULES[("", "RMSNormalization")] = RULES[("", "SimplifiedLayerNormalization")] = RULES[
    (MS, "SimplifiedLayerNormalization")] = Rule(_rms_bound, _rms_error.__doc__)


@rule("SkipSimplifiedLayerNormalization", domain=MS,
      reason="RMS normalization of s = x + skip (+ bias), whose two roundings carry "
             "gamma(2) (|x| + |skip| + |bias|) into it")
def _skip_rms_bound(inputs, y, attrs, opset, u):
    x, skip = inputs[0], inputs[1]
    bias = inputs[3] if len(inputs) > 3 and inputs[3] is not None else 0.0
    s = x + skip + bias
    s_error = gamma(2, u) * (np.abs(x) + np.abs(skip) + np.abs(bias))
    return _rms_error(s, y, (x.ndim - 1,), u, s_error)


# rotary embedding and grouped-query attention ----------------------------------------------------
@rule("RotaryEmbedding", domain=MS,
      reason="each rotated value is x_a cos - x_b sin: two rounded products and a rounded sum, "
             "gamma(2) (|x_a cos| + |x_b sin|); values past the rotary dimension pass through")
def _rotary_embedding_bound(inputs, y, attrs, opset, u):
    rotate = lookup(MS, "RotaryEmbedding", 1).fn
    x, position_ids, cos, sin = (np.abs(t) if i != 1 else t for i, t in enumerate(inputs[:4]))
    with_cos = rotate(x, position_ids, cos, np.zeros_like(sin), **attrs)
    with_sin = rotate(x, position_ids, np.zeros_like(cos), sin, **attrs)
    return gamma(2, u) * (np.abs(with_cos) + np.abs(with_sin))


@rule("GroupQueryAttention", domain=MS,
      reason="softmax(scale Q K^T + bias) V over the present cache, K and V heads shared by "
             "groups of query heads, as for MultiHeadAttention: the scores as dot products of "
             "length H (gamma(H + 2)); softmax moves p_i by p_i (|ds_i| + sum_j p_j |ds_j|) "
             "plus its own error; the product with V a dot product of length T plus |dP| |V|")
def _gqa_bound(inputs, y, attrs, opset, u):
    if attrs.get("do_rotary") or attrs.get("softcap") or any(
            t is not None for t in inputs[11:]) or attrs.get("smooth_softmax", -1) == 1:
        raise NotImplementedError("rotary, softcap, sinks and the other extensions have no "
                                  "written bound")
    query = inputs[0]
    n, nkv = attrs.get("num_heads", 1), attrs.get("kv_num_heads", 1)
    _, present_k, present_v, scores = lookup(MS, "GroupQueryAttention", 1).fn(*inputs, **attrs)
    if inputs[1] is None:  # packed QKV
        query = query[..., : query.shape[-1] // (n + 2 * nkv) * n]
    q = _heads(query, n)
    group = n // nkv
    k = np.repeat(present_k, group, axis=1)
    v = np.repeat(present_v, group, axis=1)
    h = q.shape[-1]
    scale = attrs.get("scale", 0.0) or 1.0 / np.sqrt(h)
    bias = inputs[10] if len(inputs) > 10 and inputs[10] is not None else None
    magnitude = scale * np.abs(q) @ np.abs(np.swapaxes(k, -1, -2))
    if bias is not None:
        magnitude = magnitude + np.abs(bias[..., : k.shape[2]])
    d_scores = gamma(h + 2, u) * magnitude
    visible = np.isfinite(scores)
    m = np.where(visible, scores, -np.inf).max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(visible, np.exp(np.where(visible, scores, 0.0) - m), 0.0)
    total = e.sum(-1, keepdims=True)
    p = e / np.where(total == 0, 1.0, total)
    d_scores = np.where(visible, d_scores, 0.0)
    d_p = p * (d_scores + np.sum(p * d_scores, -1, keepdims=True)) + softmax_error(
        np.where(visible, scores, -np.inf), p, (scores.ndim - 1,), u)
    d_out = gamma(k.shape[-2], u) * (p @ np.abs(v)) + d_p @ np.abs(v)
    b, heads, s, hv = d_out.shape
    return d_out.transpose(0, 2, 1, 3).reshape(b, s, heads * hv)
