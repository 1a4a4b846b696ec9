"""The CPU provider's fast kernels: (domain, op_type) -> function with the reference calling
convention (inputs positional, attributes as keywords, schema defaults filled in).

A kernel covers float32 and the common layouts; for anything else it returns NotImplemented and
the plan runs the reference op instead.  Wrapper errors (an unsupported broadcast, a rank the C
code does not take) also fall back, so the reference op reports real model errors.
"""
from __future__ import annotations

import functools
import weakref

import numpy as np
from onnx import helper

from reference.ops.conv import tied_filters
from reference.registry import lookup

from . import decoder_ops, kernels
from .passes.fuse_bias_activation import CONV_HARD_SWISH
from .passes.gate_up_halves import SILU_MUL_HALVES
from .passes.gqa_fusion import CAUSAL_PADDING_MASK, GROUPED_ATTENTION, GROUPED_ATTENTION_MASKED
from .passes.rotary_fusion import ROTARY, ROTARY_INTERLEAVED
from .passes.silu_mlp_fusion import FUSED_DOMAIN, SILU_MUL
from .passes.weight_packing import PACKED_MATMUL
from .plan import ALIAS

MS = "com.microsoft"


def float32_only(fn):
    @functools.wraps(fn)
    def kernel(*inputs, **attrs):
        if any(isinstance(x, np.ndarray) and x.dtype != np.float32 for x in inputs):
            return NotImplemented
        try:
            return fn(*inputs, **attrs)
        except (ValueError, TypeError):
            return NotImplemented

    return kernel


# elementwise -------------------------------------------------------------------------------
def _binary(op):
    @float32_only
    def kernel(a, b, **attrs):
        if "broadcast" in attrs and (attrs["broadcast"] or a.shape != b.shape):
            return NotImplemented  # opset<7 binary ops: the reference applies the legacy rule
        return kernels.binary(op, a, b)

    return kernel


def _given_or_default(name, param_names, attrs):
    """The activation's parameters in order, each absent attribute at its default: parameters
    are positional, so a HardSigmoid giving beta alone must still pass alpha first."""
    defaults = kernels.ACTIVATIONS[name][1]
    return [attrs.get(p, d) for p, d in zip(param_names, defaults)]


def _activation(name, *param_names):
    @float32_only
    def kernel(x, **attrs):
        return kernels.activation(x, name, _given_or_default(name, param_names, attrs))

    return kernel


@float32_only
def gelu(x, *, approximate="none"):
    return kernels.gelu(x, approximate)


@float32_only
def fast_gelu(x, bias=None):
    return kernels.gelu(x if bias is None else x + bias, "tanh")


@float32_only
def ms_gelu(x):
    return kernels.gelu(x, "none")


# GEMM and convolution ----------------------------------------------------------------------
# Rows of A (M) up to which MatMul and Gemm with a 2-D B run csrc/gemv.c, which streams B where
# it lies split by output column across the threads, rather than the BLAS (one thread below
# 2^22 flops, and a GEMM kernel made for large M).  Measured with benchmarks/test_gemv.py, see
# GEMV_CROSSOVER_MEASURED there: on one thread even with the BLAS's sgemv at M=1 and ahead of its
# GEMM at M=4 (the most GEMV takes).
GEMV_ROWS_UP_TO = 4


def gemv_rows(a_shape, b_ndim, trans_a) -> int:
    """The rows of A that GEMV would take for this MatMul, or 0 where the BLAS runs it."""
    if b_ndim != 2 or len(a_shape) < 2:
        return 0
    rows = int(np.prod(a_shape[:-2])) * (a_shape[-1] if trans_a else a_shape[-2])
    if trans_a and a_shape[-1] != 1:
        return 0  # A's rows strided: the BLAS reads them in place
    return rows if 1 <= rows <= GEMV_ROWS_UP_TO else 0


# Rows of A from GEMV_ROWS_UP_TO + 1 up to which MatMul and Gemm with a constant 2-D B (and A
# not transposed) run csrc/gemm_packed.c over B packed once per weight, rather than the BLAS,
# which repacks B on every call.  Measured against the BLAS and oneDNN's matmul in
# csrc/gemm_packed.c's docstring and benchmarks/test_kernels.py (test_gemm_packed_vs_blas):
# ahead at every transformer shape there, up to 128 rows; 512 is the most rows measured.
PACKED_GEMM_ROWS_UP_TO = 512

# id(b) -> {trans_b: kernels.PackedWeights}, dropped when b is freed
_PACKED_WEIGHTS: dict[int, dict] = {}


def packed_rows(a_shape, b, trans_a) -> int:
    """The rows of A (all of its leading axes) that the packed GEMM takes for this product,
    or 0 where it does not: B must be a constant 2-D float32 value."""
    if b is None or b.ndim != 2 or b.dtype != np.float32 or trans_a or len(a_shape) < 2:
        return 0
    rows = int(np.prod(a_shape[:-1]))
    return rows if GEMV_ROWS_UP_TO < rows <= PACKED_GEMM_ROWS_UP_TO else 0


def packed_weights(b, trans_b: bool) -> kernels.PackedWeights:
    """b packed once for the packed GEMM (per orientation), kept while b lives."""
    entry = _PACKED_WEIGHTS.get(id(b))
    if entry is None:
        entry = _PACKED_WEIGHTS[id(b)] = {}
        weakref.finalize(b, _PACKED_WEIGHTS.pop, id(b), None)
    packed = entry.get(bool(trans_b))
    if packed is None:
        packed = entry[bool(trans_b)] = kernels.PackedWeights(b, trans_b=bool(trans_b))
    return packed


@float32_only
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, activation=None,
         activation_alpha=None, activation_beta=None, **legacy):
    if legacy:  # Gemm<7's broadcast attribute: the reference keeps its rules
        return NotImplemented
    params = [p for p in (activation_alpha, activation_beta) if p is not None]
    if a.ndim == 2 and gemv_rows(a.shape, b.ndim, transA):
        return kernels.gemv(a.reshape(-1, a.shape[0] if transA else a.shape[1]), b, c,
                            alpha=alpha, beta=beta, trans_b=bool(transB), activation=activation,
                            activation_params=params)
    if a.ndim == 2 and _constant(b) and packed_rows(a.shape, b, transA):
        return kernels.gemm_packed(a, packed_weights(b, transB), c, alpha=alpha, beta=beta,
                                   activation=activation, activation_params=params)
    return kernels.gemm(a, b, c, alpha=alpha, beta=beta, trans_a=bool(transA),
                        trans_b=bool(transB), activation=activation, activation_params=params)


def _matmul(a, b, alpha=1.0, trans_a=False, trans_b=False):
    rows = gemv_rows(a.shape, b.ndim, trans_a)
    packed = _constant(b) and packed_rows(a.shape, b, trans_a)
    if packed:
        y = kernels.gemm_packed(np.ascontiguousarray(a).reshape(packed, a.shape[-1]),
                                packed_weights(b, trans_b), alpha=alpha)
        return y.reshape(a.shape[:-1] + (y.shape[1],))
    if not rows:
        return kernels.matmul(a, b, alpha=alpha, trans_a=trans_a, trans_b=trans_b)
    k = a.shape[-2] if trans_a else a.shape[-1]
    y = kernels.gemv(a.reshape(rows, k), b, alpha=alpha, trans_b=trans_b)
    return y.reshape(a.shape[:-2] + (rows // int(np.prod(a.shape[:-2])), y.shape[1]))


@float32_only
def matmul(a, b):
    return _matmul(a, b)


@float32_only
def packed_matmul(a, panels):
    """PackedMatMul (optimized/passes/weight_packing.py): A times the B that `panels` holds,
    the packed GEMM over the panels as they are, whatever A's rows."""
    if a.dtype != np.float32 or not _takes_panels(a.shape, panels):
        return NotImplemented  # the function body's ops say what is wrong
    packed = kernels.PackedWeights.from_panels(np.ascontiguousarray(panels))
    rows = int(np.prod(a.shape[:-1]))
    y = kernels.gemm_packed(np.ascontiguousarray(a).reshape(rows, a.shape[-1]), packed)
    return y.reshape(a.shape[:-1] + (packed.n,))


def _takes_panels(a_shape, panels) -> bool:
    """Whether the packed GEMM takes A of a_shape times the B that float32 `panels` hold."""
    return (len(a_shape) >= 1 and panels.dtype == np.float32 and panels.ndim == 3
            and panels.shape[2] == kernels.PANEL_COLS and a_shape[-1] == panels.shape[1])


@float32_only
def fused_matmul(a, b, *, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    if transBatchA or transBatchB:
        return NotImplemented
    return _matmul(a, b, alpha=alpha, trans_a=bool(transA), trans_b=bool(transB))


def _conv(x, w, b=None, z=None, *, auto_pad="NOTSET", dilations=None, group=1, pads=None,
          strides=None, activation=None, activation_params=(), kernel_shape=None):
    if x.ndim != 4:
        return NotImplemented
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "group": group,
             "auto_pad": auto_pad, "activation": activation,
             "activation_params": list(activation_params or ())}
    planned = _onednn_conv(x, w, b, z, attrs)
    if planned is not None:
        y = planned(x, residual=z)
    else:
        y = kernels.conv2d(x, w, b, residual=z, **attrs)
    ties = _tied_filters(w, group)
    if ties is not None and (b is None or np.array_equal(b, b[ties])) and z is None:
        y = y[:, ties]  # equal filters give equal channels, as the reference's Conv does
    return y


_TIES: dict[int, tuple] = {}


def _tied_filters(w, group):
    """reference's tied_filters, remembered for read-only weights (initializers)."""
    if w.flags.writeable:
        return tied_filters(w, group)
    cached = _TIES.get(id(w))
    if cached is None or cached[0]() is not w:
        cached = _TIES[id(w)] = (weakref.ref(w), tied_filters(w, group))
    return cached[1]


def conv_class(w, group) -> str:
    """The class of a convolution in ONEDNN_CONV_RULES, from its weights (M, C/group, kH, kW)."""
    _out_c, per_group, k_h, k_w = w.shape
    if group > 1:
        return "depthwise" if per_group == 1 else "grouped"
    if per_group < 8:
        return "few-input-channels"
    return "pointwise" if k_h == k_w == 1 else "spatial"


# id(w) -> {(input shape, threads, attributes, has residual): (bias, OneDNNConv or None)},
# dropped when w is freed
_ONEDNN_PLANS: dict[int, dict] = {}


def _onednn_conv(x, w, b, z, attrs):
    """The oneDNN plan for this convolution when ONEDNN_CONV_RULES chooses oneDNN for its class
    and its weights and bias are constants (read-only C-contiguous arrays, as initializers are;
    not a read-only view such as a broadcast), made on the first call per input shape and thread
    count; else None (our kernel runs it)."""
    if (not _constant(w) or (b is not None and not _constant(b)) or w.ndim != 4
            or x.size == 0 or w.size == 0  # oneDNN refuses empty tensors at run time
            or ONEDNN_CONV_RULES.get(conv_class(w, attrs["group"])) != "onednn"
            or kernels.onednn_unavailable() is not None):
        return None
    plans = _ONEDNN_PLANS.get(id(w))
    if plans is None:
        plans = _ONEDNN_PLANS[id(w)] = {}
        weakref.finalize(w, _ONEDNN_PLANS.pop, id(w), None)
    key = (x.shape, kernels.get_num_threads(), z is not None,
           repr(sorted(attrs.items())))
    entry = plans.get(key)
    if entry is None or entry[0] is not b:
        try:
            plan = kernels.OneDNNConv(x.shape, w, b, residual=z is not None, borrow_weights=True,
                                      **attrs)
        except (RuntimeError, ValueError):
            plan = None  # refused by oneDNN, or bad arguments our kernel reports
        entry = plans[key] = (b, plan)
    return entry[1]


def _constant(a) -> bool:
    """A read-only C-contiguous array over memory nobody writes: the array at the end of its
    chain of bases is read-only too and owns its memory or views immutable bytes (as
    initializers do). A read-only view of a buffer the caller still writes is no constant: the
    caches keyed by the array object would keep its old values."""
    if a.flags.writeable or not a.flags.c_contiguous:
        return False
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    return not root.flags.writeable and (root.base is None or isinstance(root.base, bytes))


def _onednn_rules() -> dict[str, str]:
    """optimized/onednn_conv.toml: per convolution class, "onednn" or "ours"."""
    import importlib.resources

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    text = importlib.resources.files(__package__).joinpath("onednn_conv.toml").read_text()
    return {name: entry["use"] for name, entry in tomllib.loads(text)["class"].items()}


ONEDNN_CONV_RULES = _onednn_rules()

conv = float32_only(lambda x, w, b=None, **attrs: _conv(x, w, b, **attrs))
fused_conv = float32_only(_conv)
conv_hard_swish = float32_only(lambda x, w, b, **attrs: _conv(x, w, b, activation="HardSwish",
                                                            **attrs))


# pooling -----------------------------------------------------------------------------------
@float32_only
def max_pool(x, *, kernel_shape, strides=None, pads=None, dilations=None, ceil_mode=0,
             auto_pad="NOTSET", storage_order=0, ctx=None):
    if x.ndim != 4 or (ctx is not None and ctx.n_outputs > 1):
        return NotImplemented
    return kernels.max_pool2d(x, kernel_shape, strides=strides, pads=pads, dilations=dilations,
                              ceil_mode=bool(ceil_mode), auto_pad=auto_pad)


@float32_only
def average_pool(x, *, kernel_shape, strides=None, pads=None, dilations=None, ceil_mode=0,
                 count_include_pad=0, auto_pad="NOTSET"):
    if x.ndim != 4:
        return NotImplemented
    return kernels.average_pool2d(x, kernel_shape, strides=strides, pads=pads,
                                  dilations=dilations, ceil_mode=bool(ceil_mode),
                                  count_include_pad=bool(count_include_pad), auto_pad=auto_pad)


@float32_only
def global_average_pool(x):
    return kernels.global_average_pool(x)


# row-wise ----------------------------------------------------------------------------------
def _softmax_rows(shape, axis):
    """(rows, cols) of a Softmax over `axis` when every axis after it has size 1: then the
    opset-13 form (one axis) and the older one (all axes from `axis` on) agree; else None."""
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis < len(shape) or any(d != 1 for d in shape[axis + 1:]):
        return None
    return int(np.prod(shape[:axis])), int(shape[axis])


@float32_only
def softmax(x, *, axis=-1):
    rows = _softmax_rows(x.shape, axis)
    if rows is None:
        return NotImplemented
    return kernels.softmax(x.reshape(rows)).reshape(x.shape)


@float32_only
def layer_normalization(x, scale, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1, ctx=None):
    if axis not in (-1, x.ndim - 1) or (ctx is not None and ctx.n_outputs > 1):
        return NotImplemented
    return kernels.layer_norm(x, scale, bias, epsilon=epsilon)


# attention ---------------------------------------------------------------------------------
@float32_only
def multi_head_attention(query, key=None, value=None, bias=None, key_padding_mask=None,
                         attention_bias=None, past_key=None, past_value=None, *rest,
                         num_heads=1, scale=0.0, unidirectional=0, ctx=None, **attrs):
    """The unpacked, cache-free form that attention_fusion emits: [B, S, N*H] query, key and
    value plus an additive attention_bias; the other forms run as the reference op."""
    plain = (query.ndim == 3 and key is not None and key.ndim == 3 and value is not None
             and value.ndim == 3 and bias is None and key_padding_mask is None
             and past_key is None and past_value is None and not any(r is not None for r in rest)
             and not unidirectional and (ctx is None or ctx.n_outputs == 1))
    if not plain or query.shape[-1] % num_heads or value.shape[-1] % num_heads:
        return NotImplemented
    q, k, v = (_split_heads(t, num_heads) for t in (query, key, value))
    y = kernels.attention(q, k, v, attention_bias, scale=scale or None)
    b, n, s, h = y.shape
    return y.transpose(0, 2, 1, 3).reshape(b, s, n * h)


def _split_heads(x, heads):
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


# RMS normalization -------------------------------------------------------------------------
def _rms_rows(x, scale, axis):
    """x as (rows, cols) over the normalized trailing axes from `axis`, when scale has their
    shape (leading 1s aside), else None."""
    axis = axis + x.ndim if axis < 0 else axis
    if not 0 <= axis < x.ndim:
        return None
    normalized = x.shape[axis:]
    shape = list(scale.shape)
    while len(shape) > len(normalized) and shape[0] == 1:
        shape.pop(0)
    return x.reshape(x.shape[:axis] + (-1,)) if tuple(shape) == normalized else None


@float32_only
def rms_normalization(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    rows = _rms_rows(x, scale, axis)
    if rows is None or stash_type != 1:
        return NotImplemented
    return kernels.rms_norm(rows, scale.reshape(-1), epsilon=epsilon).reshape(x.shape)


@float32_only
def simplified_layer_normalization(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1, ctx=None):
    rows = _rms_rows(x, scale, axis)
    if rows is None or stash_type != 1:
        return NotImplemented
    want_inv = ctx is not None and ctx.n_outputs > 1 and bool(ctx.outputs[1])
    if not want_inv:
        return kernels.rms_norm(rows, scale.reshape(-1), epsilon=epsilon).reshape(x.shape)
    y, inv = kernels.rms_norm(rows, scale.reshape(-1), epsilon=epsilon, return_inv_rms=True)
    kept = x.shape[:axis % x.ndim]
    return y.reshape(x.shape), inv.reshape(kept + (1,) * (x.ndim - len(kept)))


@float32_only
def skip_simplified_layer_normalization(x, skip, gamma, bias=None, *, epsilon=1e-12, ctx=None):
    if skip.shape != x.shape or x.ndim < 1:
        return NotImplemented
    n_outputs = 1 if ctx is None else ctx.n_outputs
    if n_outputs == 1:
        return kernels.rms_norm(x, gamma, skip=skip, bias=bias, epsilon=epsilon)
    y, inv, total = kernels.rms_norm(x, gamma, skip=skip, bias=bias, epsilon=epsilon,
                                     return_inv_rms=True, return_sum=True)
    mean = np.zeros(x.shape[:-1] + (1,), np.float32)  # the simplified form centres nothing
    return (y, mean, inv, total)[:n_outputs]


# SiLU-gated product (silu_mlp_fusion's model-local function) --------------------------------
def silu_mul(gate, up):
    """gate * sigmoid(gate) * up.  Other types than float32, or shapes that broadcast, run the
    function's body through the reference ops (a function node has no reference op of its own
    for the plan to fall back to)."""
    if (isinstance(gate, np.ndarray) and isinstance(up, np.ndarray) and gate.shape == up.shape
            and gate.dtype == up.dtype == np.float32):
        return kernels.silu_mul(gate, up)
    sigmoid, mul = lookup("", "Sigmoid", 13).fn, lookup("", "Mul", 14).fn
    return mul(mul(gate, sigmoid(gate)), up)


def silu_mul_halves(gate_up):
    """silu_mul of gate_up's two halves along its last axis (gate_up_halves' function), read
    in place by the kernel; other types run as silu_mul does."""
    if isinstance(gate_up, np.ndarray) and gate_up.dtype == np.float32 and gate_up.ndim >= 1:
        return kernels.silu_mul(gate_up)
    half = np.shape(gate_up)[-1] // 2
    return silu_mul(gate_up[..., :half], gate_up[..., half:])


# quantized weights ---------------------------------------------------------------------------
def matmul_nbits(a, b, scales, zero_points=None, g_idx=None, bias=None, *, K=0, N=0, bits=4,
                 block_size=0, accuracy_level=0, weight_prepacked=0):
    """com.microsoft MatMulNBits with float32 A; accuracy_level only permits lower precision,
    which this kernel never takes.  A g_idx other than the plain block order, and prepacked
    weights, run as the reference op."""
    plain = (a.dtype == np.float32 and scales.dtype == np.float32 and not weight_prepacked
             and (bias is None or bias.dtype == np.float32)
             and (g_idx is None or np.array_equal(np.asarray(g_idx).reshape(-1)[:K],
                                                  np.arange(K) // max(block_size, 1))))
    if not plain:
        return NotImplemented
    try:
        return kernels.matmul_nbits(a, b, scales, zero_points, bias, k=K, n=N, bits=bits,
                                    block_size=block_size)
    except (ValueError, TypeError):
        return NotImplemented


KERNELS = {
    ("", "Add"): _binary("Add"),
    ("", "Sub"): _binary("Sub"),
    ("", "Mul"): _binary("Mul"),
    ("", "Div"): _binary("Div"),
    ("", "Relu"): _activation("Relu"),
    ("", "Sigmoid"): _activation("Sigmoid"),
    ("", "Tanh"): _activation("Tanh"),
    ("", "LeakyRelu"): _activation("LeakyRelu", "alpha"),
    ("", "HardSigmoid"): _activation("HardSigmoid", "alpha", "beta"),
    ("", "HardSwish"): _activation("HardSwish"),
    ("", "Gelu"): gelu,
    (MS, "FastGelu"): fast_gelu,
    (MS, "Gelu"): ms_gelu,
    (MS, "MultiHeadAttention"): multi_head_attention,
    ("", "Gemm"): gemm,
    (MS, "FusedGemm"): gemm,
    ("", "MatMul"): matmul,
    (MS, "FusedMatMul"): fused_matmul,
    (FUSED_DOMAIN, PACKED_MATMUL): packed_matmul,
    ("", "Conv"): conv,
    (MS, "FusedConv"): fused_conv,
    (FUSED_DOMAIN, CONV_HARD_SWISH): conv_hard_swish,
    ("", "MaxPool"): max_pool,
    ("", "AveragePool"): average_pool,
    ("", "GlobalAveragePool"): global_average_pool,
    ("", "Softmax"): softmax,
    ("", "LayerNormalization"): layer_normalization,
    (MS, "MatMulNBits"): matmul_nbits,
    ("", "RMSNormalization"): rms_normalization,
    ("", "SimplifiedLayerNormalization"): simplified_layer_normalization,
    (MS, "SimplifiedLayerNormalization"): simplified_layer_normalization,
    (MS, "SkipSimplifiedLayerNormalization"): skip_simplified_layer_normalization,
    (FUSED_DOMAIN, SILU_MUL): silu_mul,
    (FUSED_DOMAIN, SILU_MUL_HALVES): silu_mul_halves,
    (FUSED_DOMAIN, ROTARY): decoder_ops.rotary,
    (FUSED_DOMAIN, ROTARY_INTERLEAVED): decoder_ops.rotary_interleaved,
    (FUSED_DOMAIN, GROUPED_ATTENTION): decoder_ops.grouped_attention,
    (FUSED_DOMAIN, GROUPED_ATTENTION_MASKED): decoder_ops.grouped_attention_masked,
    (FUSED_DOMAIN, CAUSAL_PADDING_MASK): decoder_ops.causal_padding_mask,
    (MS, "RotaryEmbedding"): decoder_ops.rotary_embedding,
    (MS, "GroupQueryAttention"): decoder_ops.group_query_attention,
}


_threads_in_use = [0]


def set_num_threads(n: int) -> None:
    """intra_op_num_threads (0: every available core) for the C kernels' OpenMP pool and for
    NumPy's BLAS, which the reference ops reach through np.matmul and friends: without the
    limit, that BLAS starts a pool of its own beside OpenMP's and the two fight for the cores."""
    n = n or kernels.available_cpus()
    if n == _threads_in_use[0] == kernels.get_num_threads():
        return
    _numpy_blas().limit(limits=n)
    kernels.set_num_threads(n)  # after the limit, which also reaches our BLAS: back to 1 there
    _threads_in_use[0] = n


@functools.cache
def _numpy_blas():
    import threadpoolctl

    return threadpoolctl.ThreadpoolController().select(user_api="blas")


# the plan's step table ----------------------------------------------------------------------
# C_STEPS[(domain, op_type)](ins, outs, **attrs) describes a node, for one input signature, as
# steps of csrc/plan.c that make the same kernel calls its fast kernel above would make (or, for
# the view ops, that produce the reference op's exact result): a list of kernels.*_step dicts,
# plan.ALIAS (the output is the input seen with the output's shape), or None where the kernel would
# return NotImplemented or the plan cannot take the node.  ins and outs are plan.Operands (None for
# an omitted optional one); shapes and dtypes are those of a run the plan recorded.

F32 = np.dtype(np.float32)


def _float32(ins, outs) -> bool:
    return all(x is None or x.dtype == F32 for x in list(ins) + list(outs))


def _described(fn):
    """fn's steps, or None where the kernel refuses (ValueError/TypeError) or a dtype is not
    float32, as float32_only does."""
    @functools.wraps(fn)
    def describe(ins, outs, **attrs):
        if not _float32(ins, outs) or not outs or outs[0] is None:
            return None
        try:
            steps = fn(ins, outs, **attrs)
        except (ValueError, TypeError):
            return None
        return steps

    return describe


def _binary_steps(op):
    @_described
    def describe(ins, outs, **attrs):
        a, b = ins[:2]
        if "broadcast" in attrs and (attrs["broadcast"] or a.shape != b.shape):
            return None
        return [kernels.binary_step(op, a.slot, a.shape, b.slot, b.shape, outs[0].slot)]

    return describe


def _activation_steps(name, *param_names):
    @_described
    def describe(ins, outs, **attrs):
        params = _given_or_default(name, param_names, attrs)
        return [kernels.activation_step(name, params, ins[0].slot, outs[0].slot, ins[0].shape)]

    return describe


@_described
def _gelu_steps(ins, outs, *, approximate="none"):
    if approximate not in ("none", "tanh"):
        return None
    name = "Gelu" if approximate == "none" else "GeluTanh"
    return [kernels.activation_step(name, (), ins[0].slot, outs[0].slot, ins[0].shape)]


@_described
def _ms_gelu_steps(ins, outs):
    return [kernels.activation_step("Gelu", (), ins[0].slot, outs[0].slot, ins[0].shape)]


def _packs(b) -> bool:
    """Whether a step may pack B once: a constant, as gemm and _matmul ask of it.  Otherwise
    the step table would pack what the Python kernels multiply through the BLAS, the
    recording run would find their results differ, and the step would run in Python."""
    return b.value is not None and _constant(b.value)


@_described
def _gemm_steps(ins, outs, *, alpha=1.0, beta=1.0, transA=0, transB=0, activation=None,
                activation_alpha=None, activation_beta=None, **legacy):
    if legacy:
        return None
    a, b = ins[:2]
    c = ins[2] if len(ins) > 2 else None
    params = [p for p in (activation_alpha, activation_beta) if p is not None]
    if len(a.shape) == 2 and _packs(b) and packed_rows(a.shape, b.value, transA):
        return [kernels.gemm_packed_step(a.slot, a.shape, packed_weights(b.value, transB),
                                         -1 if c is None else c.slot,
                                         None if c is None else c.shape, outs[0].slot,
                                         alpha=alpha, beta=beta, activation=activation,
                                         activation_params=params)]
    if len(a.shape) == 2 and gemv_rows(a.shape, len(b.shape), transA):
        rows = a.shape[1] if transA else a.shape[0]
        return [kernels.gemv_step(a.slot, (rows, int(np.prod(a.shape)) // rows),
                                  b.slot, b.shape, -1 if c is None else c.slot,
                                  None if c is None else c.shape, outs[0].slot, alpha=alpha,
                                  beta=beta, trans_b=bool(transB), activation=activation,
                                  activation_params=params)]
    return [kernels.gemm_step(a.slot, a.shape, b.slot, b.shape, -1 if c is None else c.slot,
                              None if c is None else c.shape, outs[0].slot, alpha=alpha,
                              beta=beta, trans_a=bool(transA), trans_b=bool(transB),
                              activation=activation, activation_params=params)]


@_described
def _matmul_steps(ins, outs, *, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    if transBatchA or transBatchB:
        return None
    a, b = ins[:2]
    packed = _packs(b) and packed_rows(a.shape, b.value, transA)
    if packed:
        return [kernels.gemm_packed_step(a.slot, (packed, a.shape[-1]),
                                         packed_weights(b.value, transB), -1, None,
                                         outs[0].slot, alpha=alpha)]
    rows = gemv_rows(a.shape, len(b.shape), transA)
    if rows:
        return [kernels.gemv_step(a.slot, (rows, int(np.prod(a.shape)) // rows), b.slot, b.shape,
                                  -1, None, outs[0].slot, alpha=alpha, trans_b=bool(transB))]
    return [kernels.matmul_step(a.slot, a.shape, b.slot, b.shape, outs[0].slot, alpha=alpha,
                                trans_a=bool(transA), trans_b=bool(transB))]


@_described
def _packed_matmul_steps(ins, outs):
    a, panels = ins[:2]
    if panels.value is None or not a.shape or not _takes_panels(a.shape, panels.value):
        return None
    packed = kernels.PackedWeights.from_panels(np.ascontiguousarray(panels.value))
    rows = int(np.prod(a.shape[:-1]))
    return [kernels.gemm_packed_step(a.slot, (rows, a.shape[-1]), packed, -1, None,
                                     outs[0].slot)]


@_described
def _softmax_steps(ins, outs, *, axis=-1):
    x = ins[0]
    rows = _softmax_rows(x.shape, axis)
    if rows is None:
        return None
    return [kernels.softmax_step(x.slot, outs[0].slot, rows)]


@_described
def _layer_norm_steps(ins, outs, *, axis=-1, epsilon=1e-5, stash_type=1):
    x, scale = ins[:2]
    bias = ins[2] if len(ins) > 2 else None
    if axis not in (-1, len(x.shape) - 1) or len(outs) > 1:
        return None
    return [kernels.layer_norm_step(x.slot, x.shape, scale.slot, scale.shape,
                                    -1 if bias is None else bias.slot,
                                    None if bias is None else bias.shape, outs[0].slot,
                                    epsilon=epsilon)]


def _rms_shape(x, scale, axis):
    """(rows, cols) of _rms_rows's reshape, or None."""
    axis = axis + len(x.shape) if axis < 0 else axis
    if not 0 <= axis < len(x.shape):
        return None
    normalized = x.shape[axis:]
    shape = list(scale.shape)
    while len(shape) > len(normalized) and shape[0] == 1:
        shape.pop(0)
    if tuple(shape) != normalized:
        return None
    return x.shape[:axis] + (int(np.prod(normalized)),)


def _slot(x) -> int:
    return -1 if x is None else x.slot


@_described
def _rms_norm_steps(ins, outs, *, axis=-1, epsilon=1e-5, stash_type=1):
    x, scale = ins[:2]
    rows = _rms_shape(x, scale, axis)
    if rows is None or stash_type != 1 or len(outs) > 2:
        return None
    inv_rms = outs[1] if len(outs) > 1 else None
    return [kernels.rms_norm_step(x.slot, rows, scale.slot, (int(np.prod(scale.shape)),),
                                  outs[0].slot, epsilon=epsilon, inv_rms=_slot(inv_rms))]


@_described
def _skip_rms_norm_steps(ins, outs, *, epsilon=1e-12):
    """Outputs y, mean (the simplified form's zeros: not taken here), inverse RMS, sum."""
    x, skip, gamma = ins[:3]
    bias = ins[3] if len(ins) > 3 else None
    outs = list(outs) + [None] * (4 - len(outs))
    if skip.shape != x.shape or len(x.shape) < 1 or outs[1] is not None:
        return None
    return [kernels.rms_norm_step(x.slot, x.shape, gamma.slot, gamma.shape, outs[0].slot,
                                  skip=skip.slot, skip_shape=skip.shape, bias=_slot(bias),
                                  bias_shape=None if bias is None else bias.shape,
                                  epsilon=epsilon, total=_slot(outs[3]),
                                  inv_rms=_slot(outs[2]))]


@_described
def _silu_mul_steps(ins, outs):
    gate, up = ins[:2]
    if gate.shape != up.shape:
        return None
    return [kernels.silu_mul_step(gate.slot, up.slot, outs[0].slot, gate.shape)]


@_described
def _silu_mul_halves_steps(ins, outs):
    gate_up = ins[0]
    if len(gate_up.shape) < 1 or gate_up.shape[-1] % 2:
        return None
    return [kernels.silu_mul_halves_step(gate_up.slot, outs[0].slot, gate_up.shape)]


def _declining(fn):
    """fn's steps, or None for a node it cannot read (an older opset's attributes, inputs
    missing): the plan then runs the node in Python, which reports what is wrong with it."""
    @functools.wraps(fn)
    def describe(ins, outs, **attrs):
        try:
            return fn(ins, outs, **attrs)
        except (ValueError, TypeError, IndexError):
            return None

    return describe


def _plain(x) -> bool:
    """A tensor of fixed-size elements (not strings or objects)."""
    return x is not None and x.dtype.kind in "biufc"


def _view_steps(*shape_inputs):
    """Reshape, Flatten, Squeeze, Unsqueeze, Identity: the output is the input's data, seen
    with the output's recorded shape, when the inputs that decide that shape are known."""
    @_declining
    def describe(ins, outs, **attrs):
        x, y = ins[0], outs[0] if outs else None
        if not _plain(x) or y is None or y.dtype != x.dtype or np.prod(y.shape) != np.prod(x.shape):
            return None
        if any(k < len(ins) and ins[k] is not None and ins[k].value is None for k in shape_inputs):
            return None
        return ALIAS

    return describe


@_declining
def _transpose_steps(ins, outs, *, perm=None):
    x, y = ins[0], outs[0] if outs else None
    if not _plain(x) or y is None or y.dtype != x.dtype:
        return None
    perm = list(range(len(x.shape)))[::-1] if perm is None else [int(p) for p in perm]
    strides = [int(np.prod(x.shape[d + 1:])) for d in range(len(x.shape))]
    shape = tuple(x.shape[p] for p in perm)
    if shape != y.shape:
        return None
    try:
        return [kernels.strided_copy_step(x.slot, y.slot, shape, [strides[p] for p in perm], 0,
                                          x.dtype.itemsize)]
    except ValueError:
        return None


@_declining
def _gather_steps(ins, outs, *, axis=0):
    data, indices = ins[:2]
    y = outs[0] if outs else None
    if not _plain(data) or indices.dtype != np.int64 or y is None or y.dtype != data.dtype:
        return None
    axis = axis + len(data.shape) if axis < 0 else axis
    if not 0 <= axis < len(data.shape):
        return None
    shape = data.shape[:axis] + indices.shape + data.shape[axis + 1:]
    if shape != y.shape:
        return None
    try:
        return [kernels.gather_step(data.slot, data.shape, data.dtype.itemsize, indices.slot,
                                    int(np.prod(indices.shape)), y.slot, axis)]
    except ValueError:
        return None


@_declining
def _expand_steps(ins, outs):
    x, shape, y = ins[0], ins[1], outs[0] if outs else None
    if not _plain(x) or shape is None or shape.value is None or y is None or y.dtype != x.dtype:
        return None
    if len(x.shape) > len(y.shape):
        return None
    dims = (1,) * (len(y.shape) - len(x.shape)) + x.shape
    contiguous = [int(np.prod(dims[d + 1:])) for d in range(len(dims))]
    if any(d not in (1, n) for d, n in zip(dims, y.shape)):
        return None
    strides = [s if d == n and d != 1 else 0 for s, d, n in zip(contiguous, dims, y.shape)]
    try:
        return [kernels.strided_copy_step(x.slot, y.slot, y.shape, strides, 0, x.dtype.itemsize)]
    except ValueError:
        return None


@_declining
def _concat_steps(ins, outs, *, axis):
    y = outs[0] if outs else None
    if y is None or any(not _plain(x) or x.dtype != y.dtype for x in ins) or not y.shape:
        return None
    axis = axis + len(y.shape) if axis < 0 else axis
    if not 0 <= axis < len(y.shape) or any(len(x.shape) != len(y.shape) for x in ins):
        return None
    if sum(x.shape[axis] for x in ins) != y.shape[axis]:
        return None
    itemsize, stride = y.dtype.itemsize, int(np.prod(y.shape[axis:])) * y.dtype.itemsize
    steps, offset = [], 0
    for x in ins:
        row_bytes = int(np.prod(x.shape[axis:])) * itemsize
        if row_bytes and np.prod(x.shape[:axis]):
            steps.append(kernels.rows_copy_step(x.slot, y.slot, int(np.prod(x.shape[:axis])),
                                                row_bytes, offset, stride))
        offset += row_bytes
    return steps or None


@_declining
def _split_steps(ins, outs, *, axis=0, **split_attrs):
    """Each output's rows copied out of the input; the sizes are the recorded outputs' (the
    split input, when given, must be the same in every run)."""
    x = ins[0]
    if not _plain(x) or (len(ins) > 1 and ins[1] is not None and ins[1].value is None):
        return None
    axis = axis + len(x.shape) if axis < 0 else axis
    if not 0 <= axis < len(x.shape) or any(y is None or y.dtype != x.dtype for y in outs):
        return None
    if any(y.shape[:axis] != x.shape[:axis] or y.shape[axis + 1:] != x.shape[axis + 1:]
           or len(y.shape) != len(x.shape) for y in outs):
        return None
    if sum(y.shape[axis] for y in outs) != x.shape[axis]:
        return None
    rows, itemsize = int(np.prod(x.shape[:axis])), x.dtype.itemsize
    stride = int(np.prod(x.shape[axis:])) * itemsize
    steps, offset = [], 0
    for y in outs:
        row_bytes = int(np.prod(y.shape[axis:])) * itemsize
        if rows * row_bytes == 0:
            return None  # an empty output: the plan writes no step for it
        steps.append(kernels.rows_copy_step(x.slot, y.slot, rows, row_bytes, 0, row_bytes,
                                            x_offset=offset, x_stride=stride))
        offset += row_bytes
    return steps


@_declining
def _slice_steps(ins, outs):
    """A strided copy, its bounds worked out by the reference Slice itself on each axis's
    indices, so they follow the spec's clamping exactly."""
    x, y = ins[0], outs[0] if outs else None
    if not _plain(x) or y is None or y.dtype != x.dtype or not 0 < len(x.shape) <= 6:
        return None
    if len(ins) < 3 or any(v is not None and v.value is None for v in ins[1:]):
        return None
    starts, ends = ins[1].value, ins[2].value
    axes = ins[3].value if len(ins) > 3 and ins[3] is not None else None
    steps = ins[4].value if len(ins) > 4 and ins[4] is not None else None
    contiguous = [int(np.prod(x.shape[d + 1:])) for d in range(len(x.shape))]
    offset, strides = 0, list(contiguous)
    slice_op = lookup("", "Slice", 13).fn
    starts, ends = np.asarray(starts).reshape(-1), np.asarray(ends).reshape(-1)
    axes = np.arange(len(starts)) if axes is None else np.asarray(axes).reshape(-1)
    steps = None if steps is None else np.asarray(steps).reshape(-1)
    for d, size in enumerate(x.shape):
        chosen = np.arange(size, dtype=np.int64)
        for k in np.flatnonzero(axes % len(x.shape) == d)[:1]:
            chosen = slice_op(chosen, starts[k:k + 1], ends[k:k + 1], np.zeros(1, np.int64),
                              None if steps is None else steps[k:k + 1])
        if len(chosen) != y.shape[d]:
            return None
        if len(chosen):
            offset += int(chosen[0]) * contiguous[d]
        if len(chosen) > 1:
            strides[d] = int(chosen[1] - chosen[0]) * contiguous[d]
    try:
        return [kernels.strided_copy_step(x.slot, y.slot, y.shape, strides, offset,
                                          x.dtype.itemsize)]
    except ValueError:
        return None


@_described
def _fast_gelu_steps(ins, outs):
    """com.microsoft FastGelu: x + bias (numpy's add and C's round alike) then the tanh
    Gelu in place."""
    x, y = ins[0], outs[0]
    bias = ins[1] if len(ins) > 1 else None
    if bias is None:
        return [kernels.activation_step("GeluTanh", (), x.slot, y.slot, x.shape)]
    return [kernels.binary_step("Add", x.slot, x.shape, bias.slot, bias.shape, y.slot),
            kernels.activation_step("GeluTanh", (), y.slot, y.slot, y.shape)]



@_described
def _conv_steps(ins, outs, *, auto_pad="NOTSET", dilations=None, group=1, pads=None,
                strides=None, activation=None, activation_params=(), kernel_shape=None):
    """Conv and FusedConv as _conv runs them: the oneDNN plan that _onednn_conv made for this
    shape in the recorded run, else conv2d; then the channels of equal filters copied from
    the first of each, where _conv picks them."""
    x, w = ins[:2]
    b = ins[2] if len(ins) > 2 else None
    z = ins[3] if len(ins) > 3 else None
    if len(x.shape) != 4 or w.value is None or len(w.shape) != 4:
        return None
    if (b is not None and b.shape != w.shape[:1]) or (z is not None and z.shape != outs[0].shape):
        return None  # one the reference broadcasts: conv2d_f32 would read past its end
    ties = _tied_filters(w.value, group) if z is None else None
    if ties is not None and b is not None:
        if b.value is None:
            return None  # a bias that differs per run decides whether _conv picks channels
        if not np.array_equal(b.value, b.value[ties]):
            ties = None
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "group": group,
             "auto_pad": auto_pad, "activation": activation,
             "activation_params": list(activation_params or ())}
    shaped = np.broadcast_to(np.float32(0), x.shape)  # what _onednn_conv reads of x
    planned = None  # a bias that differs per run: _conv runs ours, and oneDNN's plan holds it
    if b is None or b.value is not None:
        planned = _onednn_conv(shaped, w.value, None if b is None else b.value,
                               None if z is None else shaped, attrs)
    if planned is not None:
        steps = [kernels.onednn_conv_step(planned, x.slot, _slot(z), outs[0].slot)]
    else:
        steps = [kernels.conv_step(x.slot, x.shape, w.slot, w.shape, _slot(b), _slot(z),
                                   outs[0].slot, **attrs)]
    if ties is not None:  # equal filters give equal channels, as the reference's Conv does
        steps.append(kernels.tied_channels_step(outs[0].slot, outs[0].shape, ties))
    return steps


@_described
def _max_pool_steps(ins, outs, *, kernel_shape=None, strides=None, pads=None, dilations=None,
                    ceil_mode=0, auto_pad="NOTSET", storage_order=0):
    if len(outs) > 1 and outs[1] is not None:
        return None  # the Indices output: max_pool does not take it either
    return [kernels.pool_step("max", ins[0].slot, ins[0].shape, outs[0].slot,
                              kernel_shape=kernel_shape, strides=strides, pads=pads,
                              dilations=dilations, ceil_mode=bool(ceil_mode), auto_pad=auto_pad)]


@_described
def _average_pool_steps(ins, outs, *, kernel_shape=None, strides=None, pads=None,
                        dilations=None, ceil_mode=0, count_include_pad=0, auto_pad="NOTSET"):
    return [kernels.pool_step("average", ins[0].slot, ins[0].shape, outs[0].slot,
                              kernel_shape=kernel_shape, strides=strides, pads=pads,
                              dilations=dilations, ceil_mode=bool(ceil_mode),
                              count_include_pad=bool(count_include_pad), auto_pad=auto_pad)]


@_described
def _global_average_pool_steps(ins, outs):
    x = ins[0]
    if len(x.shape) < 3:
        return None
    return [kernels.reduce_last_step("mean", x.slot, outs[0].slot, x.shape[0] * x.shape[1],
                                     int(np.prod(x.shape[2:])))]


def _rotary_steps(interleaved):
    @_described
    def describe(ins, outs):
        """Where decoder_ops._rotary takes the kernel (else its body runs in Python)."""
        x, cos, sin = ins[:3]
        fits = (1 <= len(x.shape) <= 4 and x.shape[-1] % 2 == 0 and cos.shape == sin.shape
                and len(cos.shape) >= 1 and cos.shape[-1] == x.shape[-1]
                and np.broadcast_shapes(x.shape, cos.shape) == x.shape)
        if not fits:
            return None
        return [kernels.rotary_step(x.slot, x.shape, cos.slot, sin.slot, cos.shape,
                                    outs[0].slot, interleaved=interleaved)]

    return describe


@_declining
def _grouped_attention_steps(ins, outs, *, scale=1.0):
    """GroupedAttention(Masked) where decoder_ops._grouped takes the kernel: float32 q, k, v
    (and mask) of rank 4, and a kv_heads table the same in every run."""
    q, k, v, kv_heads = ins[:4]
    mask = ins[4] if len(ins) > 4 else None
    y = outs[0] if outs else None
    if not _float32([q, k, v, mask], [y]) or y is None or kv_heads is None or kv_heads.value is None:
        return None
    fits = (len(q.shape) == len(k.shape) == len(v.shape) == 4
            and q.shape[0] == k.shape[0] == v.shape[0] and k.shape[3] == q.shape[3]
            and v.shape[1:3] == k.shape[1:3])
    table = decoder_ops.head_table(kv_heads.value, q.shape[1], k.shape[1]) if fits else None
    if table is None:
        return None
    if y.shape != (q.shape[0], q.shape[2], q.shape[1], v.shape[3]):
        return None
    try:
        return [kernels.grouped_attention_step(
            q.slot, q.shape, k.slot, k.shape, v.slot, v.shape, table, _slot(mask),
            None if mask is None else mask.shape, y.slot, scale=scale, empty_nan=True)]
    except ValueError:
        return None


@_declining
def _cast_steps(ins, outs, *, to, **rules):
    """Cast between bool, int32, int64, float32 and float64, except float to int: C's
    conversions give the reference's values there (rules such as saturate concern float8)."""
    x, y = ins[0], outs[0] if outs else None
    if not _plain(x) or y is None or y.shape != x.shape:
        return None
    if helper.tensor_dtype_to_np_dtype(to) != y.dtype:
        return None
    return [kernels.cast_step(x.slot, x.dtype, y.slot, y.dtype, int(np.prod(x.shape)))]


@_declining
def _where_steps(ins, outs):
    cond, x, other = ins[:3]
    y = outs[0] if outs else None
    if cond.dtype != np.bool_ or not _plain(x) or y is None or not x.dtype == other.dtype == y.dtype:
        return None
    shapes = [cond.shape, x.shape, other.shape]
    if np.broadcast_shapes(*shapes) != y.shape:
        return None
    return [kernels.select_step("Where", [cond.slot, x.slot, other.slot], shapes, y.slot,
                                x.dtype.itemsize)]


def _logical_steps(op):
    @_declining
    def describe(ins, outs):
        a, b = ins[:2]
        y = outs[0] if outs else None
        if y is None or not a.dtype == b.dtype == y.dtype == np.bool_:
            return None
        if np.broadcast_shapes(a.shape, b.shape) != y.shape:
            return None
        return [kernels.select_step(op, [a.slot, b.slot], [a.shape, b.shape], y.slot)]

    return describe

@_declining
def _matmul_nbits_steps(ins, outs, *, K=0, N=0, bits=4, block_size=0, accuracy_level=0,
                        weight_prepacked=0):
    """Where matmul_nbits takes the kernel, with no g_idx and no bias: float32 a and scales,
    uint8 b, packed uint8 or float32 zero points (or none), each of its layout's size."""
    a, b, scales = ins[:3]
    zp = ins[3] if len(ins) > 3 else None
    if any(x is not None for x in ins[4:]) or weight_prepacked or not outs or outs[0] is None:
        return None
    y = outs[0]
    if not _float32([a, scales], [y]) or b.dtype != np.uint8 or block_size <= 0:
        return None
    blocks = (K + block_size - 1) // block_size
    if int(np.prod(b.shape)) != N * blocks * (block_size * bits // 8) or (
            int(np.prod(scales.shape)) != N * blocks):
        return None
    if zp is not None:
        want = N * blocks if zp.dtype == np.float32 else N * ((blocks * bits + 7) // 8)
        if zp.dtype not in (np.float32, np.uint8) or int(np.prod(zp.shape)) != want:
            return None
    if y.shape != a.shape[:-1] + (N,):
        return None
    return [kernels.matmul_nbits_step(a.slot, a.shape, b.slot, scales.slot, _slot(zp), y.slot,
                                      k=K, n=N, bits=bits, block_size=block_size,
                                      float_zero_points=zp is not None and zp.dtype == np.float32)]


@_declining
def _causal_padding_mask_steps(ins, outs, *, fill):
    """gqa_fusion's CausalPaddingMask over a 2-D mask and int64 scalar start, end: the step
    reads start and end at run time and fails (the node runs in Python) where they do not give
    the recorded shape."""
    mask, start, end = ins[:3]
    y = outs[0] if outs else None
    if y is None or y.dtype != F32 or mask is None or len(mask.shape) != 2 or any(
            v is None or v.shape != () or v.dtype != np.int64 for v in (start, end)):
        return None
    return [kernels.causal_padding_mask_step(mask.slot, mask.shape, mask.dtype, start.slot,
                                             end.slot, y.slot, y.shape, float(fill))]


C_STEPS = {
    ("", "Add"): _binary_steps("Add"),
    ("", "Sub"): _binary_steps("Sub"),
    ("", "Mul"): _binary_steps("Mul"),
    ("", "Div"): _binary_steps("Div"),
    ("", "Relu"): _activation_steps("Relu"),
    ("", "Sigmoid"): _activation_steps("Sigmoid"),
    ("", "Tanh"): _activation_steps("Tanh"),
    ("", "LeakyRelu"): _activation_steps("LeakyRelu", "alpha"),
    ("", "HardSigmoid"): _activation_steps("HardSigmoid", "alpha", "beta"),
    ("", "HardSwish"): _activation_steps("HardSwish"),
    ("", "Gelu"): _gelu_steps,
    (MS, "Gelu"): _ms_gelu_steps,
    ("", "Gemm"): _gemm_steps,
    (MS, "FusedGemm"): _gemm_steps,
    ("", "MatMul"): _matmul_steps,
    (MS, "FusedMatMul"): _matmul_steps,
    (FUSED_DOMAIN, PACKED_MATMUL): _packed_matmul_steps,
    ("", "Softmax"): _softmax_steps,
    ("", "LayerNormalization"): _layer_norm_steps,
    ("", "RMSNormalization"): _rms_norm_steps,
    ("", "SimplifiedLayerNormalization"): _rms_norm_steps,
    (MS, "SimplifiedLayerNormalization"): _rms_norm_steps,
    (MS, "SkipSimplifiedLayerNormalization"): _skip_rms_norm_steps,
    (FUSED_DOMAIN, SILU_MUL): _silu_mul_steps,
    (FUSED_DOMAIN, SILU_MUL_HALVES): _silu_mul_halves_steps,
    ("", "Reshape"): _view_steps(1),
    ("", "Flatten"): _view_steps(),
    ("", "Squeeze"): _view_steps(1),
    ("", "Unsqueeze"): _view_steps(1),
    ("", "Identity"): _view_steps(),
    ("", "Transpose"): _transpose_steps,
    ("", "Gather"): _gather_steps,
    ("", "Expand"): _expand_steps,
    ("", "Concat"): _concat_steps,
    ("", "Split"): _split_steps,
    ("", "Slice"): _slice_steps,
    (MS, "FastGelu"): _fast_gelu_steps,
    ("", "Conv"): _conv_steps,
    (MS, "FusedConv"): _conv_steps,
    (FUSED_DOMAIN, CONV_HARD_SWISH): lambda ins, outs, **attrs: _conv_steps(
        ins, outs, activation="HardSwish", **attrs),
    ("", "GlobalAveragePool"): _global_average_pool_steps,
    ("", "MaxPool"): _max_pool_steps,
    ("", "AveragePool"): _average_pool_steps,
    (FUSED_DOMAIN, ROTARY): _rotary_steps(False),
    (FUSED_DOMAIN, ROTARY_INTERLEAVED): _rotary_steps(True),
    (FUSED_DOMAIN, GROUPED_ATTENTION): _grouped_attention_steps,
    (FUSED_DOMAIN, GROUPED_ATTENTION_MASKED): _grouped_attention_steps,
    ("", "Cast"): _cast_steps,
    ("", "Where"): _where_steps,
    ("", "And"): _logical_steps("And"),
    ("", "Or"): _logical_steps("Or"),
    ("", "Xor"): _logical_steps("Xor"),
    (MS, "MatMulNBits"): _matmul_nbits_steps,
    (FUSED_DOMAIN, CAUSAL_PADDING_MASK): _causal_padding_mask_steps,
}
