"""com.microsoft contrib operators (spec: onnxruntime's ContribOperators.md).

These ops have no schema in onnx.defs, so the evaluator fills no attribute defaults: every
attribute carries its documented default in the signature.
"""

from __future__ import annotations

import numpy as np

from ..registry import lookup, op
from . import normalization as _normalization
from .ml import _erf

MS = "com.microsoft"


def _f(x):
    """Compute dtype for a float input (float16/bfloat16 go through float32)."""
    return np.float64 if x.dtype == np.float64 else np.float32


def _call(op_type, opset, *inputs, **attrs):
    impl = lookup("", op_type, opset)
    if impl is None:
        raise ValueError(f"{op_type} (ai.onnx) is not available to this contrib op")
    return impl.fn(*inputs, **attrs)


# activations -----------------------------------------------------------------------------------
def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))


def _fast_gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


@op("Gelu", 1, MS)
def gelu(x):
    return _gelu(x.astype(np.float64)).astype(x.dtype)


@op("BiasGelu", 1, MS)
def bias_gelu(a, b):
    return _gelu(a.astype(np.float64) + b).astype(a.dtype)


@op("FastGelu", 1, MS)
def fast_gelu(x, bias=None):
    y = x.astype(np.float64) + (0 if bias is None else bias)
    return _fast_gelu(y).astype(x.dtype)


@op("QuickGelu", 1, MS)
def quick_gelu(x, alpha=1.702):
    x64 = x.astype(np.float64)
    return (x64 / (1.0 + np.exp(-alpha * x64))).astype(x.dtype)


@op("BiasAdd", 1, MS)
def bias_add(x, bias, skip):
    return (x + bias + skip).astype(x.dtype)


@op("BiasSoftmax", 1, MS)
def bias_softmax(data, bias, axis=1, is_inner_broadcast=0):
    axis = axis + data.ndim if axis < 0 else axis
    cols = int(np.prod(data.shape[axis:]))
    rows = data.size // cols if cols else 0
    b = bias.reshape(-1, cols)
    if b.shape[0] == 0 or rows % b.shape[0]:
        raise ValueError(
            f"BiasSoftmax: bias {list(bias.shape)} does not divide data {list(data.shape)}"
        )
    r = np.arange(rows)
    # inner broadcast reuses each bias row for consecutive data rows, outer cycles through them
    which = r // (rows // b.shape[0]) if is_inner_broadcast else r % b.shape[0]
    z = data.reshape(rows, cols).astype(_f(data)) + b[which]
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).reshape(data.shape).astype(data.dtype)


def _activation(y, activation, alpha=None, beta=None, gamma=None, params=()):
    """FusedGemm names the parameters (alpha, beta), FusedConv lists them (params)."""
    params = list(params or [])

    def param(named, index, default):
        if named is not None:
            return named
        return params[index] if len(params) > index else default

    if not activation:
        return y
    if activation == "Relu":
        return np.maximum(y, 0)
    if activation == "Tanh":
        return np.tanh(y)
    if activation == "Sigmoid":
        return 1.0 / (1.0 + np.exp(-y))
    if activation == "LeakyRelu":
        return np.where(y >= 0, y, param(alpha, 0, 0.01) * y)
    if activation == "HardSigmoid":
        return np.clip(param(alpha, 0, 0.2) * y + param(beta, 1, 0.5), 0, 1)
    if activation == "Clip":
        return np.clip(y, param(alpha, 0, -np.inf), param(beta, 1, np.inf))
    raise ValueError(f"activation {activation!r} is not supported")


@op("FusedConv", 1, MS)
def fused_conv(
    x,
    w,
    b=None,
    z=None,
    activation="",
    activation_params=None,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
):
    attrs = {"auto_pad": auto_pad, "group": group}
    for name, value in (
        ("dilations", dilations),
        ("kernel_shape", kernel_shape),
        ("pads", pads),
        ("strides", strides),
    ):
        if value:
            attrs[name] = value
    y = _call("Conv", 11, x, w, *([b] if b is not None else []), **attrs)
    if z is not None:
        y = y + z
    return _activation(y, activation, params=activation_params).astype(x.dtype)


def _gemm(a, b, c, alpha, beta, trans_a, trans_b):
    a = a.T if trans_a else a
    b = b.T if trans_b else b
    y = alpha * (a @ b)
    if c is not None:
        y = y + beta * c
    return y


@op("FusedGemm", 1, MS)
def fused_gemm(
    a,
    b,
    c=None,
    alpha=1.0,
    beta=1.0,
    transA=0,
    transB=0,
    activation="",
    activation_alpha=None,
    activation_beta=None,
    activation_gamma=None,
):
    y = _gemm(a, b, c, alpha, beta, transA, transB)
    y = _activation(y, activation, activation_alpha, activation_beta, activation_gamma)
    return y.astype(a.dtype)


@op("GemmFastGelu", 1, MS)
def gemm_fast_gelu(x, w, bias=None):
    y = x.astype(_f(x)) @ w.astype(_f(x))
    if bias is not None:
        y = y + bias
    return _fast_gelu(y.astype(np.float64)).astype(x.dtype)


@op("FusedMatMul", 1, MS)
def fused_matmul(a, b, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    def prepare(m, trans, trans_batch):
        if m.ndim < 2:
            return m
        if trans_batch and m.ndim > 2:
            # [M, b..., K] -> [b..., M, K]: the first axis moves behind the batch axes
            m = np.moveaxis(m, 0, -2)
        if trans:
            m = np.swapaxes(m, -1, -2)
        return m

    y = np.matmul(prepare(a, transA, transBatchA), prepare(b, transB, transBatchB))
    return (alpha * y).astype(a.dtype)


# normalizations ---------------------------------------------------------------------------------
def _layer_norm(x, axis, epsilon, simplified):
    axes = tuple(range(axis, x.ndim))
    x = x.astype(np.float64)
    mean = (
        np.zeros(x.shape[:axis] + (1,) * len(axes)) if simplified else x.mean(axes, keepdims=True)
    )
    centered = x - mean
    inv_std = 1.0 / np.sqrt((centered * centered).mean(axes, keepdims=True) + epsilon)
    return centered * inv_std, mean, inv_std


def _skip_layer_norm(x, skip, gamma, beta, bias, epsilon, simplified):
    """Outputs: normalized x + skip (+ bias), its mean and inverse std (float32), the sum."""
    s = x + skip + (0 if bias is None else bias)
    normed, mean, inv_std = _layer_norm(s, x.ndim - 1, epsilon, simplified)
    y = normed * gamma + (0 if beta is None else beta)
    return y.astype(x.dtype), mean.astype(np.float32), inv_std.astype(np.float32), s.astype(x.dtype)


@op("SkipLayerNormalization", 1, MS)
def skip_layer_normalization(x, skip, gamma, beta=None, bias=None, epsilon=1e-12):
    return _skip_layer_norm(x, skip, gamma, beta, bias, epsilon, simplified=False)


@op("SkipSimplifiedLayerNormalization", 1, MS)
def skip_simplified_layer_normalization(x, skip, gamma, bias=None, epsilon=1e-12):
    return _skip_layer_norm(x, skip, gamma, None, bias, epsilon, simplified=True)


def simplified_layer_normalization(x, scale, axis=-1, epsilon=1e-5, stash_type=1):
    axis = axis + x.ndim if axis < 0 else axis
    normed, _, inv_std = _layer_norm(x, axis, epsilon, True)
    stash = np.float32 if stash_type == 1 else x.dtype
    return (normed * scale).astype(x.dtype), inv_std.astype(stash)


# onnxruntime registers SimplifiedLayerNormalization in the ai.onnx domain, models use both
op("SimplifiedLayerNormalization", 1, MS)(simplified_layer_normalization)
op("SimplifiedLayerNormalization", 1, "")(simplified_layer_normalization)
# onnxruntime's transformers optimizer writes ai.onnx LayerNormalization into models of any
# opset (onnxruntime registers it from version 1); before opset 17 it is this same op.
op("LayerNormalization", 1, "")(_normalization.layer_normalization)


@op("EmbedLayerNormalization", 1, MS)
def embed_layer_normalization(
    input_ids,
    segment_ids=None,
    word_embedding=None,
    position_embedding=None,
    segment_embedding=None,
    gamma=None,
    beta=None,
    mask=None,
    position_ids=None,
    epsilon=1e-12,
    mask_index_type=1,
):
    batch, seq = input_ids.shape
    if position_ids is None:
        position_ids = np.arange(seq)[None, :]
    emb = (
        word_embedding[input_ids] + position_embedding[np.broadcast_to(position_ids, (batch, seq))]
    )
    if segment_embedding is not None and segment_ids is not None:
        emb = emb + segment_embedding[segment_ids]
    normed, _, _ = _layer_norm(emb, 2, epsilon, False)
    out = (normed * gamma + beta).astype(word_embedding.dtype)
    if mask is not None:
        mask_index = mask.sum(axis=1).astype(np.int32)
    else:
        mask_index = np.zeros(batch, dtype=np.int32)
    return out, mask_index, emb.astype(word_embedding.dtype)


# attention -------------------------------------------------------------------------------------
def _softmax(scores, sink=None):
    """Softmax over the last axis; `sink` adds a virtual logit to the denominator."""
    m = scores.max(axis=-1, keepdims=True)
    if sink is not None:
        m = np.maximum(m, sink)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(scores - m)
    total = e.sum(axis=-1, keepdims=True)
    if sink is not None:
        total = total + np.exp(sink - m)
    return e / np.where(total == 0, 1.0, total)


def _heads(x, n):
    """[B, S, N*H] -> [B, N, S, H]."""
    b, s, hidden = x.shape
    return x.reshape(b, s, n, hidden // n).transpose(0, 2, 1, 3)


def _head_bias(bias, n):
    """A projection bias [N*H] as [N, 1, H], to add to [B, N, S, H]."""
    return _heads(np.asarray(bias)[None, None], n)[0]


def _merge_heads(x):
    b, n, s, h = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, n * h)


def _key_mask(mask, batch, q_len, total, past):
    """Boolean keep-mask [B, 1, S, T] from an Attention mask_index / key padding mask."""
    keep = np.ones((batch, 1, q_len, total), dtype=bool)
    if mask is None:
        return keep
    pos = np.arange(total)
    if mask.ndim == 1 and mask.shape[0] == batch:  # end positions (right padding)
        keep &= (pos[None, :] < mask[:, None])[:, None, None, :]
    elif mask.ndim == 1 and mask.shape[0] == 2 * batch:  # end then start positions
        end, start = mask[:batch], mask[batch:]
        keep &= ((pos[None, :] < end[:, None]) & (pos[None, :] >= start[:, None]))[:, None, None, :]
    elif mask.ndim == 2:  # raw 0/1 mask over keys
        keep &= (mask != 0)[:, None, None, :]
    elif mask.ndim == 3:  # [B, S, T]
        keep &= (mask != 0)[:, None, :, :]
    elif mask.ndim == 4:  # [B, 1, max_S, max_S]
        keep &= mask[:, :, past : past + q_len, :total] != 0
    else:
        raise ValueError(f"mask of shape {list(mask.shape)} is not supported")
    return keep


def _attend(q, k, v, scale, keep, filter_value, bias=None):
    """Scaled dot-product attention; masked scores get filter_value added (or -inf when None)."""
    scores = (q @ np.swapaxes(k, -1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    scores = (
        np.where(keep, scores, scores + filter_value)
        if filter_value is not None
        else np.where(keep, scores, -np.inf)
    )
    probs = _softmax(scores)
    return probs @ v, scores


def _masked_attention(q, k, v, mask, past_len, unidirectional, scale, filter_value, bias, dt):
    """Attention of q [B, N, S, H] over past + new keys k, v [B, N, T, H] under an Attention or
    MultiHeadAttention key mask; returns the output and the masked scores."""
    batch, _, seq, head = q.shape
    total = k.shape[2]
    keep = _key_mask(mask, batch, seq, total, past_len)
    if unidirectional:
        keep = keep & (np.arange(total)[None, :] <= np.arange(seq)[:, None] + past_len)
    scale = scale or 1.0 / np.sqrt(head)
    return _attend(q, k, v, scale, keep, filter_value, None if bias is None else bias.astype(dt))


@op("Attention", 1, MS)
def attention(
    x,
    weights,
    bias=None,
    mask_index=None,
    past=None,
    attention_bias=None,
    past_sequence_length=None,
    num_heads=1,
    qkv_hidden_sizes=None,
    scale=0.0,
    mask_filter_value=-10000.0,
    unidirectional=0,
    do_rotary=0,
    past_present_share_buffer=0,
    rotary_embedding_dim=0,
):
    if do_rotary or past_present_share_buffer:
        raise ValueError("Attention: do_rotary and past_present_share_buffer are not supported")
    dt = _f(x)
    proj = x.astype(dt) @ weights.astype(dt) + (0 if bias is None else bias.astype(dt))
    sizes = list(qkv_hidden_sizes or [weights.shape[1] // 3] * 3)
    q, k, v = np.split(proj, np.cumsum(sizes)[:2], axis=-1)
    q, k, v = _heads(q, num_heads), _heads(k, num_heads), _heads(v, num_heads)
    past_len = 0
    if past is not None:
        past_len = past.shape[3]
        k = np.concatenate([past[0].astype(dt), k], axis=2)
        v = np.concatenate([past[1].astype(dt), v], axis=2)
    # present stacks K and V, so it only exists when they have the same head size
    present = np.stack([k, v]).astype(x.dtype) if k.shape == v.shape else None
    out, _ = _masked_attention(
        q, k, v, mask_index, past_len, unidirectional, scale, mask_filter_value, attention_bias, dt
    )
    return _merge_heads(out).astype(x.dtype), present


@op("MultiHeadAttention", 1, MS)
def multi_head_attention(
    query,
    key=None,
    value=None,
    bias=None,
    key_padding_mask=None,
    attention_bias=None,
    past_key=None,
    past_value=None,
    past_sequence_length=None,
    cache_indirection=None,
    num_heads=1,
    mask_filter_value=-10000.0,
    scale=0.0,
    unidirectional=0,
):
    if cache_indirection is not None:
        raise ValueError("MultiHeadAttention: cache_indirection (beam search) is not supported")
    dt = _f(query)
    n = num_heads
    if query.ndim == 5:  # packed QKV [B, S, N, 3, H]
        q, k, v = (query[:, :, :, i].transpose(0, 2, 1, 3).astype(dt) for i in range(3))
        if bias is not None:
            bq, bk, bv = np.split(bias.astype(dt), 3)
            q, k, v = q + _head_bias(bq, n), k + _head_bias(bk, n), v + _head_bias(bv, n)
    else:
        hidden = query.shape[-1]
        bq = bk = bv = 0
        if bias is not None:
            bq, bk, bv = np.split(bias.astype(dt), [hidden, 2 * hidden])
        q = _heads(query.astype(dt) + bq, n)
        if key.ndim == 5:  # packed KV [B, L, N, 2, H]
            k = key[:, :, :, 0].transpose(0, 2, 1, 3).astype(dt)
            v = key[:, :, :, 1].transpose(0, 2, 1, 3).astype(dt)
            if bias is not None:
                k, v = k + _head_bias(bk, n), v + _head_bias(bv, n)
        elif key.ndim == 4:  # already [B, N, L, H] (cross-attention cache): no bias
            k, v = key.astype(dt), value.astype(dt)
        else:
            k, v = _heads(key.astype(dt) + bk, n), _heads(value.astype(dt) + bv, n)
    past_len = 0
    if past_key is not None:
        k = np.concatenate([past_key.astype(dt), k], axis=2)
        v = np.concatenate([past_value.astype(dt), v], axis=2)
        past_len = k.shape[2] - q.shape[2]
    out, scores = _masked_attention(
        q, k, v, key_padding_mask, past_len, unidirectional, scale, mask_filter_value,
        attention_bias, dt,
    )
    return (
        _merge_heads(out).astype(query.dtype),
        k.astype(query.dtype),
        v.astype(query.dtype),
        scores.astype(query.dtype),
    )


def _rotate(x, cos, sin, interleaved):
    """Rotary embedding of x [..., S, H] with cos/sin [..., S, R/2]; dims past R pass through."""
    rot = 2 * cos.shape[-1]
    xr, rest = x[..., :rot], x[..., rot:]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = np.empty_like(xr)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x2 * cos + x1 * sin
    else:
        x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
        out = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return np.concatenate([out, rest], axis=-1)


@op("RotaryEmbedding", 1, MS)
def rotary_embedding(
    x,
    position_ids,
    cos_cache,
    sin_cache,
    interleaved=0,
    is_packed_batching=0,
    num_heads=0,
    rotary_embedding_dim=0,
    scale=1.0,
):
    dt = _f(x)
    if x.ndim == 4:  # [B, N, S, H]
        bnsh = x.astype(dt)
    else:  # [B, S, N*H]
        head = 2 * cos_cache.shape[1] if not rotary_embedding_dim else None
        n = num_heads or x.shape[-1] // head
        bnsh = _heads(x.astype(dt), n)
    batch, _, seq, _ = bnsh.shape
    if position_ids.size == 1:  # a start offset shared by every batch
        pos = np.broadcast_to(position_ids.reshape(-1)[0] + np.arange(seq), (batch, seq))
    else:
        pos = position_ids.reshape(batch, seq)
    cos = cos_cache.astype(dt)[pos][:, None]  # [B, 1, S, R/2]
    sin = sin_cache.astype(dt)[pos][:, None]
    if rotary_embedding_dim:
        cos, sin = cos[..., : rotary_embedding_dim // 2], sin[..., : rotary_embedding_dim // 2]
    out = _rotate(bnsh, cos, sin, interleaved)
    return (out if x.ndim == 4 else _merge_heads(out)).astype(x.dtype)


@op("GroupQueryAttention", 1, MS)
def group_query_attention(
    query,
    key=None,
    value=None,
    past_key=None,
    past_value=None,
    seqlens_k=None,
    total_sequence_length=None,
    cos_cache=None,
    sin_cache=None,
    position_ids=None,
    attention_bias=None,
    head_sink=None,
    k_scale=None,
    v_scale=None,
    q_norm_weight=None,
    k_norm_weight=None,
    num_heads=1,
    kv_num_heads=1,
    scale=0.0,
    softcap=0.0,
    local_window_size=-1,
    do_rotary=0,
    rotary_interleaved=0,
    smooth_softmax=-1,
    qk_output=0,
    causal=1,
    sliding_window_cache=0,
    qk_norm_epsilon=1e-6,
    k_quant_type="NONE",
    v_quant_type="NONE",
    kv_cache_bit_width=0,
):
    if k_quant_type != "NONE" or v_quant_type != "NONE" or q_norm_weight is not None:
        raise ValueError("GroupQueryAttention: quantized caches and qk-norm are not supported")
    dt = _f(query)
    n, nkv = num_heads, kv_num_heads
    if key is None:  # packed QKV
        head = query.shape[-1] // (n + 2 * nkv)
        q, k, v = np.split(query.astype(dt), [n * head, (n + nkv) * head], axis=-1)
    else:
        q, k, v = query.astype(dt), key.astype(dt), value.astype(dt)
    q, k, v = _heads(q, n), _heads(k, nkv), _heads(v, nkv)
    batch, _, seq, head = q.shape
    total_len = int(np.asarray(total_sequence_length).reshape(-1)[0])
    total_b = np.asarray(seqlens_k).reshape(-1).astype(np.int64) + 1  # valid keys per batch
    first_prompt = past_key is None or past_key.shape[2] == 0 or seq == total_len
    past_b = np.zeros(batch, np.int64) if first_prompt else total_b - seq
    positions = past_b[:, None] + np.arange(seq)[None, :]  # [B, S]
    if do_rotary:
        pos = position_ids.reshape(batch, seq) if position_ids is not None else positions
        cos = cos_cache.astype(dt)[pos][:, None]
        sin = sin_cache.astype(dt)[pos][:, None]
        q = _rotate(q, cos, sin, rotary_interleaved)
        k = _rotate(k, cos, sin, rotary_interleaved)
    past_buf = 0 if past_key is None else past_key.shape[2]
    present_len = max(past_buf, total_len)
    present_k = np.zeros((batch, nkv, present_len, head), dt)
    present_v = np.zeros((batch, nkv, present_len, head), dt)
    for b in range(batch):  # per-batch cache layout (batch count, not elements)
        p = int(past_b[b])
        if p:
            present_k[b, :, :p] = past_key[b, :, :p]
            present_v[b, :, :p] = past_value[b, :, :p]
        present_k[b, :, p : p + seq] = k[b]
        present_v[b, :, p : p + seq] = v[b]
    group = n // nkv
    kk = np.repeat(present_k, group, axis=1)
    vv = np.repeat(present_v, group, axis=1)
    scale = scale or 1.0 / np.sqrt(head)
    scores = (q @ np.swapaxes(kk, -1, -2)) * scale  # [B, N, S, T]
    if softcap > 0:
        scores = softcap * np.tanh(scores / softcap)
    if attention_bias is not None:
        scores = scores + attention_bias.astype(dt)[..., :present_len]
    key_pos = np.arange(present_len)[None, None, :]
    keep = key_pos < total_b[:, None, None]
    if causal:
        keep = keep & (key_pos <= positions[:, :, None])
    if local_window_size > 0:
        keep = keep & (key_pos > positions[:, :, None] - local_window_size)
    scores = np.where(keep[:, None], scores, -np.inf)
    sink = None
    if head_sink is not None:
        sink = head_sink.astype(dt).reshape(1, n, 1, 1)
    elif smooth_softmax == 1:
        sink = np.zeros((1, 1, 1, 1), dt)
    out = _softmax(scores, sink) @ vv
    return (
        _merge_heads(out).astype(query.dtype),
        present_k.astype(query.dtype),
        present_v.astype(query.dtype),
        scores.astype(query.dtype),
    )


# quantization -------------------------------------------------------------------------------------
def _per_axis(param, x, axis):
    """Reshape a scale / zero point to broadcast along `axis` of x (scalars pass through)."""
    param = np.asarray(param)
    if param.size == 1:
        return param.reshape(())
    axis = axis + x.ndim if axis < 0 else axis
    shape = [1] * x.ndim
    shape[axis] = param.size
    return param.reshape(shape)


def _saturate(y, dtype):
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    if info is None:  # int4 / uint4 from ml_dtypes
        import ml_dtypes

        info = ml_dtypes.iinfo(dtype)
    return np.clip(np.rint(y), info.min, info.max).astype(dtype)


@op("QuantizeLinear", 1, MS)
def quantize_linear(x, y_scale, y_zero_point=None, axis=1):
    zp_dtype = y_zero_point.dtype if y_zero_point is not None else np.uint8
    scale = _per_axis(y_scale, x, axis).astype(np.float32)
    zp = 0 if y_zero_point is None else _per_axis(y_zero_point, x, axis).astype(np.float32)
    return _saturate(x.astype(np.float32) / scale + zp, zp_dtype)


@op("DequantizeLinear", 1, MS)
def dequantize_linear(x, x_scale, x_zero_point=None, axis=1):
    scale = _per_axis(x_scale, x, axis)
    zp = 0 if x_zero_point is None else _per_axis(x_zero_point, x, axis).astype(np.float32)
    return ((x.astype(np.float32) - zp) * scale.astype(np.float32)).astype(x_scale.dtype)


def _dq(x, scale, zp):
    return (x.astype(np.float32) - (0 if zp is None else zp.astype(np.float32))) * scale


def _q(y, scale, zp, dtype):
    return _saturate(y / scale + (0 if zp is None else zp.astype(np.float32)), dtype)


@op("QLinearAdd", 1, MS)
def qlinear_add(
    a,
    a_scale,
    a_zero_point=None,
    b=None,
    b_scale=None,
    b_zero_point=None,
    c_scale=None,
    c_zero_point=None,
):
    y = _dq(a, a_scale, a_zero_point) + _dq(b, b_scale, b_zero_point)
    return _q(y, c_scale, c_zero_point, a.dtype)


@op("QLinearMul", 1, MS)
def qlinear_mul(
    a,
    a_scale,
    a_zero_point=None,
    b=None,
    b_scale=None,
    b_zero_point=None,
    c_scale=None,
    c_zero_point=None,
):
    y = _dq(a, a_scale, a_zero_point) * _dq(b, b_scale, b_zero_point)
    return _q(y, c_scale, c_zero_point, a.dtype)


@op("QLinearSigmoid", 1, MS)
def qlinear_sigmoid(x, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None):
    y = 1.0 / (1.0 + np.exp(-_dq(x, x_scale, x_zero_point)))
    return _q(y, y_scale, y_zero_point, x.dtype)


@op("QLinearGlobalAveragePool", 1, MS)
def qlinear_global_average_pool(x, x_scale, x_zero_point, y_scale, y_zero_point, channels_last=0):
    axes = tuple(range(1, x.ndim - 1)) if channels_last else tuple(range(2, x.ndim))
    y = _dq(x, x_scale, x_zero_point).mean(axis=axes, keepdims=True)
    return _q(y, y_scale, y_zero_point, x.dtype)


@op("MatMulIntegerToFloat", 1, MS)
def matmul_integer_to_float(
    a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None
):
    ai = a.astype(np.int64) - (0 if a_zero_point is None else a_zero_point.astype(np.int64))
    bi = b.astype(np.int64) - (0 if b_zero_point is None else b_zero_point.astype(np.int64))
    y = (ai @ bi).astype(np.float64) * a_scale.astype(np.float64) * b_scale.astype(np.float64)
    if bias is not None:
        y = y + bias
    return y.astype(a_scale.dtype)


@op("DynamicQuantizeMatMul", 1, MS)
def dynamic_quantize_matmul(a, b, b_scale, b_zero_point=None, bias=None):
    # A is quantized to uint8 with a range that always contains zero
    lo, hi = min(float(a.min(initial=0.0)), 0.0), max(float(a.max(initial=0.0)), 0.0)
    a_scale = np.float32((hi - lo) / 255.0) if hi > lo else np.float32(1.0)
    a_zp = np.uint8(np.clip(np.rint(-lo / a_scale), 0, 255))
    aq = _saturate(a.astype(np.float32) / a_scale + np.float32(a_zp), np.uint8)
    return matmul_integer_to_float(
        aq, b, np.asarray(a_scale), b_scale, np.asarray(a_zp), b_zero_point, bias
    )


def _unpack_bits(packed, bits, rows):
    """[rows, values] from bytes holding 8 // bits values each, least significant bits first."""
    raw = packed.reshape(rows, -1).astype(np.uint8)
    shifts = np.arange(8 // bits, dtype=np.uint8) * bits
    return ((raw[..., None] >> shifts) & ((1 << bits) - 1)).reshape(rows, -1)


@op("MatMulNBits", 1, MS)
def matmul_nbits(
    a,
    b,
    scales,
    zero_points=None,
    g_idx=None,
    bias=None,
    K=0,
    N=0,
    bits=4,
    block_size=0,
    accuracy_level=0,
    weight_prepacked=0,
):
    w = dequantized_nbits(b, scales, zero_points, g_idx, K=K, N=N, bits=bits,
                          block_size=block_size)
    y = a.astype(np.float32) @ w.T
    if bias is not None:
        y = y + bias
    return y.astype(a.dtype)


def dequantized_nbits(b, scales, zero_points=None, g_idx=None, *, K, N, bits, block_size):
    """MatMulNBits's weights as float32 (N, K): (code - zero point) * scale per block."""
    if bits not in (2, 4, 8):
        raise ValueError(f"MatMulNBits: bits={bits} is not 2, 4 or 8")
    n_blocks = (K + block_size - 1) // block_size
    q = _unpack_bits(b, bits, N)[:, : n_blocks * block_size]
    scale = scales.reshape(N, n_blocks).astype(np.float32)
    if zero_points is None:
        zp = np.full((N, n_blocks), 2 ** (bits - 1), np.float32)
    elif zero_points.dtype == np.uint8:  # packed like B
        zp = _unpack_bits(zero_points, bits, N)[:, :n_blocks].astype(np.float32)
    else:  # float zero points, unpacked, in the quantized domain
        zp = zero_points.reshape(N, n_blocks).astype(np.float32)
    block_of_k = (
        np.asarray(g_idx).reshape(-1)[:K] if g_idx is not None else np.arange(K) // block_size
    )
    return (q[:, :K].astype(np.float32) - zp[:, block_of_k]) * scale[:, block_of_k]
