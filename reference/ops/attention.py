"""Attention family: Attention, RotaryEmbedding, TensorScatter, LinearAttention,
CausalConvWithState, and FlexAttention (ai.onnx.preview)."""
from __future__ import annotations

import numpy as np

from ..dtypes import np_dtype
from ..registry import op


def _softmax(x):
    """Softmax over the last axis in x's own type, stable for large logits (max subtracted).

    An all -inf row gives NaN; callers that define it otherwise handle it.
    """
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - np.where(m == -np.inf, x.dtype.type(0), m))
    return e / e.sum(axis=-1, keepdims=True)


def _split_heads(x, num_heads, name):
    """(batch, seq, heads * size) -> (batch, heads, seq, size)."""
    if not num_heads or x.shape[-1] % num_heads:
        raise ValueError(
            f"3-D {name} needs a head count dividing its last dimension {x.shape[-1]}, got {num_heads}"
        )
    b, s, _ = x.shape
    return x.reshape(b, s, num_heads, -1).transpose(0, 2, 1, 3)


@op("Attention", 23)
def attention(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
              is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0,
              scale=None, softcap=0.0, softmax_precision=None, left_window_size=-1,
              right_window_size=-1):
    """Scaled dot-product attention (opset 23; 24 adds nonpad_kv_seqlen, 25 the window sizes).

    Every step runs in the input type T1 (the softmax in softmax_precision if given), as the
    spec's pattern does; for float16/bfloat16 that rounding is visible in the results.
    """
    dtype = Q.dtype
    t1 = dtype.type
    three_d = Q.ndim == 3
    if three_d:
        Q = _split_heads(Q, q_num_heads, "Q")
        K = _split_heads(K, kv_num_heads, "K")
        V = _split_heads(V, kv_num_heads, "V")
    elif Q.ndim != 4 or K.ndim != 4 or V.ndim != 4:
        raise ValueError(f"Q, K, V must all be 3-D or 4-D, got ranks {Q.ndim}, {K.ndim}, {V.ndim}")
    if (past_key is None) != (past_value is None):
        raise ValueError("past_key and past_value must be given together")
    past_len = 0
    if past_key is not None:
        past_len = past_key.shape[2]
        K = np.concatenate([past_key, K], axis=2)
        V = np.concatenate([past_value, V], axis=2)
    present_key, present_value = K, V
    batch, hq, sq, head_size = Q.shape
    hkv, total = K.shape[1], K.shape[2]
    if hq % hkv:
        raise ValueError(f"q_num_heads ({hq}) must be a multiple of kv_num_heads ({hkv})")
    # GQA: query head h reads kv head h // (hq / hkv).
    K = np.repeat(K, hq // hkv, axis=1)
    V = np.repeat(V, hq // hkv, axis=1).astype(dtype)
    if scale is None:
        scale = 1 / np.sqrt(head_size)
    # Q and K are each scaled by sqrt(scale): a float32 number rounded to T1.
    root = np.sqrt(np.float32(scale)).astype(dtype)
    qk = ((Q * root) @ (K * root).swapaxes(-1, -2)).astype(dtype)
    qk_out = qk
    if softcap > 0:
        qk = t1(softcap) * np.tanh(qk / t1(softcap))
    if qk_matmul_output_mode == 1:
        qk_out = qk

    # Bias: the causal / window / padding frontier (0 or -inf), plus attn_mask.
    key = np.arange(total)
    if past_key is not None:
        offset = np.full((1, 1, 1, 1), past_len)
    elif nonpad_kv_seqlen is not None:
        offset = (np.asarray(nonpad_kv_seqlen, np.int64) - sq).reshape(-1, 1, 1, 1)
    else:
        offset = np.zeros((1, 1, 1, 1), np.int64)
    pos = offset + np.arange(sq).reshape(1, 1, sq, 1)  # absolute query position
    allowed = np.ones((1, 1, 1, total), bool)
    if is_causal:
        allowed = allowed & (key <= pos)
    if left_window_size >= 0:
        allowed = allowed & (key >= pos - left_window_size)
    if right_window_size >= 0:
        allowed = allowed & (key <= pos + right_window_size)
    if nonpad_kv_seqlen is not None:
        allowed = allowed & (key < np.asarray(nonpad_kv_seqlen).reshape(-1, 1, 1, 1))
    bias = np.where(allowed, t1(0), t1(-np.inf))
    if attn_mask is not None:
        missing = total - attn_mask.shape[-1]
        if missing < 0:
            raise ValueError(f"attn_mask's last dimension {attn_mask.shape[-1]} exceeds {total}")
        if attn_mask.dtype == bool:
            mask = np.where(attn_mask, t1(0), t1(-np.inf))
        else:
            mask = attn_mask.astype(dtype)
        pad = [(0, 0)] * (mask.ndim - 1) + [(0, missing)]
        bias = bias + np.pad(mask, pad, constant_values=-np.inf)
    qk = qk + bias
    if qk_matmul_output_mode == 2:
        qk_out = qk

    sp = np_dtype(softmax_precision) if softmax_precision else dtype
    with np.errstate(invalid="ignore"):  # all -inf rows, replaced just below
        probs = _softmax(qk.astype(sp)).astype(dtype)
    # A row with no allowed key (all of its bias -inf) is zero, not NaN.
    probs = np.where(np.max(bias, axis=-1, keepdims=True) == -np.inf, t1(0), probs)
    if qk_matmul_output_mode == 3:
        qk_out = probs
    elif qk_matmul_output_mode not in (0, 1, 2):
        raise ValueError(f"qk_matmul_output_mode must be 0, 1, 2 or 3, got {qk_matmul_output_mode}")
    Y = (probs @ V).astype(dtype)  # numpy's bfloat16 matmul returns float32
    if three_d:
        Y = Y.transpose(0, 2, 1, 3).reshape(batch, sq, -1)
    return Y, present_key, present_value, qk_out


@op("RotaryEmbedding", 23)
def rotary_embedding(X, cos_cache, sin_cache, position_ids=None, *, interleaved=0,
                     num_heads=None, rotary_embedding_dim=0):
    """Rotate the first rotary_embedding_dim features of each head by position-dependent angles."""
    shape = X.shape
    if X.ndim == 4:  # (batch, heads, seq, head) -> (batch, seq, heads, head)
        x = X.transpose(0, 2, 1, 3)
    elif X.ndim == 3:
        if not num_heads:
            raise ValueError("num_heads is required for a 3-D input")
        x = X.reshape(shape[0], shape[1], num_heads, -1)
    else:
        raise ValueError(f"X must be 3-D or 4-D, got rank {X.ndim}")
    head_size = x.shape[-1]
    dim = rotary_embedding_dim or head_size
    if dim % 2 or dim > head_size:
        raise ValueError(f"rotary_embedding_dim {dim} must be even and at most head_size {head_size}")
    if position_ids is not None:
        cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]
    for name, cache in (("cos_cache", cos_cache), ("sin_cache", sin_cache)):
        if cache.shape[-1] != dim // 2:
            raise ValueError(f"{name}'s last dimension {cache.shape[-1]} must be {dim // 2}")
    cos, sin = cos_cache[:, :, None, :], sin_cache[:, :, None, :]  # broadcast over heads
    rot, keep = x[..., :dim], x[..., dim:]
    x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if interleaved else np.split(rot, 2, axis=-1)
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        rot = np.stack([real, imag], axis=-1).reshape(rot.shape)
    else:
        rot = np.concatenate([real, imag], axis=-1)
    y = np.concatenate([rot, keep], axis=-1).astype(X.dtype)
    return y.transpose(0, 2, 1, 3) if X.ndim == 4 else y.reshape(shape)


@op("TensorScatter", 24)
def tensor_scatter(past_cache, update, write_indices=None, *, axis=-2, mode="linear"):
    """Write `update` into a copy of the cache along `axis`, from each batch's write index."""
    rank = past_cache.ndim
    if not -rank <= axis < rank or axis % rank == 0:
        raise ValueError(f"axis {axis} is out of range or the batch axis for rank {rank}")
    if mode not in ("linear", "circular"):
        raise ValueError(f"mode must be 'linear' or 'circular', got {mode!r}")
    axis %= rank
    batch, max_len, seq_len = past_cache.shape[0], past_cache.shape[axis], update.shape[axis]
    starts = (np.zeros(batch, np.int64) if write_indices is None
              else np.asarray(write_indices, np.int64).reshape(batch))
    idx = starts[:, None] + np.arange(seq_len)  # (batch, seq_len)
    if mode == "circular":
        idx %= max_len
    elif (idx < 0).any() or (idx >= max_len).any():
        raise ValueError(
            f"write_indices + sequence length exceed max_sequence_length {max_len} in linear mode"
        )
    present = past_cache.copy()
    # Move the sequence axis next to the batch axis; views, so assignment writes `present`.
    np.moveaxis(present, axis, 1)[np.arange(batch)[:, None], idx] = np.moveaxis(update, axis, 1)
    return present


@op("LinearAttention", 27)
def linear_attention(query, key, value, past_state=None, decay=None, beta=None, *,
                     chunk_size=64, kv_num_heads, q_num_heads, scale=0.0,
                     update_rule="gated_delta"):
    """Recurrent linear attention, run token by token (chunk_size is only a tuning hint)."""
    rules = ("linear", "gated", "delta", "gated_delta")
    if update_rule not in rules:
        raise ValueError(f"update_rule must be one of {rules}, got {update_rule!r}")
    if q_num_heads <= 0 or kv_num_heads <= 0 or q_num_heads % kv_num_heads:
        raise ValueError(
            f"q_num_heads ({q_num_heads}) must be a positive multiple of kv_num_heads ({kv_num_heads})"
        )
    gated, delta = update_rule in ("gated", "gated_delta"), update_rule in ("delta", "gated_delta")
    if gated and decay is None:
        raise ValueError(f"update_rule {update_rule!r} needs the decay input")
    if delta and beta is None:
        raise ValueError(f"update_rule {update_rule!r} needs the beta input")
    b, t = query.shape[:2]
    work = np.float32
    q = query.astype(work).reshape(b, t, q_num_heads, -1)
    k = key.astype(work).reshape(b, t, kv_num_heads, -1)
    v = value.astype(work).reshape(b, t, kv_num_heads, -1)
    dk, dv = q.shape[-1], v.shape[-1]
    if k.shape[-1] != dk:
        raise ValueError(f"key head size {k.shape[-1]} differs from query head size {dk}")
    if not scale:
        scale = 1 / np.sqrt(dk)
    # decay: per key dimension (B, T, Hkv*dk) or per head (B, T, Hkv); beta: (B, T, Hkv) or (B, T, 1)
    g = None if not gated else np.exp(decay.astype(work).reshape(b, t, kv_num_heads, -1, 1))
    bt = None if not delta else beta.astype(work).reshape(b, t, -1, 1)
    state = (np.zeros((b, kv_num_heads, dk, dv), work) if past_state is None
             else past_state.astype(work))
    group = q_num_heads // kv_num_heads
    out = np.empty((b, t, q_num_heads, dv), work)
    for i in range(t):
        if gated:
            state = g[:, i] * state
        kt, vt = k[:, i], v[:, i]  # (B, Hkv, d)
        write = vt
        if delta:
            write = bt[:, i] * (vt - np.einsum("bhkv,bhk->bhv", state, kt))
        state = state + kt[..., :, None] * write[..., None, :]
        qt = q[:, i].reshape(b, kv_num_heads, group, dk)
        o = scale * np.einsum("bhgk,bhkv->bhgv", qt, state)
        out[:, i] = o.reshape(b, q_num_heads, dv).astype(query.dtype)
    present_dtype = query.dtype if past_state is None else past_state.dtype
    return out.reshape(b, t, -1).astype(query.dtype), state.astype(present_dtype)


@op("CausalConvWithState", 27)
def causal_conv_with_state(input, weight, bias=None, past_state=None, *, activation="none"):
    """Depthwise causal conv over [past_state | input]; the last k-1 positions carry over."""
    if activation not in ("none", "silu", "swish"):
        raise ValueError(f"activation must be 'none', 'silu' or 'swish', got {activation!r}")
    b, c, _ = input.shape
    k = weight.shape[-1]
    if weight.shape != (c, 1, k):
        raise ValueError(f"weight must have shape ({c}, 1, k), got {weight.shape}")
    if past_state is None:
        past_state = np.zeros((b, c, k - 1), input.dtype)
    elif past_state.shape != (b, c, k - 1):
        raise ValueError(f"past_state must have shape ({b}, {c}, {k - 1}), got {past_state.shape}")
    work = np.float32
    padded = np.concatenate([past_state, input], axis=2)
    windows = np.lib.stride_tricks.sliding_window_view(padded.astype(work), k, axis=2)
    out = np.einsum("bclk,ck->bcl", windows, weight[:, 0].astype(work))
    if bias is not None:
        out = out + bias.astype(work)[:, None]
    if activation != "none":  # silu and swish are the same function
        out = out * np.exp(-np.logaddexp(0, -out))  # x * sigmoid(x), stable for large |x|
    return out.astype(input.dtype), padded[:, :, padded.shape[2] - (k - 1):]


@op("FlexAttention", 1, domain="ai.onnx.preview")
def flex_attention(Q, K, V, *, prob_mod=None, scale=None, score_mod=None,
                   softmax_precision=None):
    """softmax(score_mod(Q K^T * scale)) -> prob_mod -> @ V, from the scores on in softmax_precision."""
    if Q.ndim != 4 or K.ndim != 4 or V.ndim != 4:
        raise ValueError(f"Q, K, V must be 4-D, got ranks {Q.ndim}, {K.ndim}, {V.ndim}")
    dtype = Q.dtype
    hq, hkv = Q.shape[1], K.shape[1]
    if hq % hkv:
        raise ValueError(f"q_num_heads ({hq}) must be a multiple of kv_num_heads ({hkv})")
    if softmax_precision:
        sp = np_dtype(softmax_precision)
    else:
        sp = np.dtype(np.float64 if dtype == np.float64 else np.float32)
    K = np.repeat(K, hq // hkv, axis=1)
    V = np.repeat(V, hq // hkv, axis=1)
    if scale is None:
        scale = 1 / np.sqrt(Q.shape[-1])
    # Q and K are each scaled by sqrt(scale) (a float32 number rounded to T1), in T1.
    root = np.sqrt(np.float32(scale)).astype(dtype)
    scores = ((Q * root) @ (K * root).swapaxes(-1, -2)).astype(dtype).astype(sp)
    if score_mod is not None:
        (scores,) = score_mod(scores)
    with np.errstate(invalid="ignore"):  # a row that score_mod masks entirely is NaN
        probs = _softmax(np.asarray(scores, sp))
    if prob_mod is not None:
        (probs,) = prob_mod(probs)
    return (np.asarray(probs, sp) @ V.astype(sp)).astype(dtype)
