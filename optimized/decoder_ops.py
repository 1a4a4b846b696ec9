"""The CPU provider's kernels for decoder attention, with the reference calling convention
(optimized/cpu.py registers them):

- the fused functions rotary_fusion and gqa_fusion write (onnx_parity.fused Rotary,
  RotaryInterleaved, GroupedAttention, GroupedAttentionMasked).  A function node has no
  reference op for the plan to fall back to, so what the C kernels do not take (other types,
  shapes that broadcast another way) runs the function's body here, op by op through the
  reference ops;
- com.microsoft RotaryEmbedding and GroupQueryAttention, as onnxruntime's optimizer writes
  them.  What these do not take returns NotImplemented and runs as the reference op.
"""
from __future__ import annotations

import functools

import numpy as np

from reference.registry import lookup

from . import kernels


def _op(op_type, version=14):
    return lookup("", op_type, version).fn


def _floats(*arrays) -> bool:
    return all(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in arrays)


# rotary embedding ----------------------------------------------------------------------------
def _rotary_body(x, cos, sin, interleaved):
    """The function body: x * cos + rotate(x) * sin."""
    neg, concat, mul, add = _op("Neg", 13), _op("Concat", 13), _op("Mul"), _op("Add")
    half = x.shape[-1] // 2
    if interleaved:
        pairs = x.reshape(x.shape[:-1] + (half, 2))
        rotated = concat(neg(pairs[..., 1:]), pairs[..., :1], axis=-1).reshape(x.shape)
    else:
        rotated = concat(neg(x[..., half:]), x[..., :half], axis=-1)
    return add(mul(x, cos), mul(rotated, sin))


def _rotary(x, cos, sin, interleaved):
    fits = (_floats(x, cos, sin) and 1 <= x.ndim <= 4 and x.shape[-1] % 2 == 0
            and cos.shape == sin.shape and cos.ndim >= 1 and cos.shape[-1] == x.shape[-1]
            and np.broadcast_shapes(x.shape, cos.shape) == x.shape)
    if fits:
        return kernels.rotary(x, cos, sin, interleaved=interleaved)
    return _rotary_body(x, cos, sin, interleaved)


def rotary(x, cos, sin):
    return _rotary(x, cos, sin, False)


def rotary_interleaved(x, cos, sin):
    return _rotary(x, cos, sin, True)


def rotary_embedding(x, position_ids, cos_cache, sin_cache, *, interleaved=0,
                     is_packed_batching=0, num_heads=0, rotary_embedding_dim=0, scale=1.0):
    """com.microsoft RotaryEmbedding: x (B, N, S, H) or (B, S, N*H), caches (positions, R/2)."""
    if is_packed_batching or not _floats(x, cos_cache, sin_cache) or x.ndim not in (3, 4) or (
            cos_cache.ndim != 2 or cos_cache.shape != sin_cache.shape):
        return NotImplemented
    width = rotary_embedding_dim // 2 if rotary_embedding_dim else cos_cache.shape[1]
    if x.ndim == 4:
        batch, seq, head = x.shape[0], x.shape[2], x.shape[3]
        view = x
    else:
        if rotary_embedding_dim and not num_heads:
            return NotImplemented
        heads = num_heads or x.shape[-1] // (2 * width)
        if heads <= 0 or x.shape[-1] % heads:
            return NotImplemented
        batch, seq, head = x.shape[0], x.shape[1], x.shape[-1] // heads
        view = x.reshape(batch, seq, heads, head)
    position_ids = np.asarray(position_ids)
    if position_ids.size == 1:
        pos = position_ids.reshape(-1)[0] + np.arange(seq)[None, :]
    elif position_ids.size == batch * seq:
        pos = position_ids.reshape(batch, seq)
    else:
        return NotImplemented
    if width > cos_cache.shape[1] or 2 * width > head or width == 0 or (
            pos.size and (pos.min() < 0 or pos.max() >= cos_cache.shape[0])):
        return NotImplemented  # the reference op says what is wrong
    cos, sin = cos_cache[pos][..., :width], sin_cache[pos][..., :width]  # (B|1, S, R/2)
    axis = 1 if x.ndim == 4 else 2  # the heads axis, where cos and sin broadcast
    cos, sin = np.expand_dims(cos, axis), np.expand_dims(sin, axis)
    return kernels.rotary(view, cos, sin, interleaved=bool(interleaved)).reshape(x.shape)


# grouped-query attention ---------------------------------------------------------------------
def _attention_body(q, k, v, kv_heads, mask, scale):
    """The function body: K and V gathered per query head, softmax(q k^T * scale + mask) v,
    heads back behind the sequence."""
    gather, transpose, matmul = _op("Gather", 13), _op("Transpose", 13), _op("MatMul", 13)
    k, v = gather(k, kv_heads, axis=1), gather(v, kv_heads, axis=1)
    scores = _op("Mul")(matmul(q, transpose(k, perm=[0, 1, 3, 2])), np.float32(scale))
    if mask is not None:
        scores = _op("Add")(scores, mask)
    probs = _op("Softmax", 13)(scores, axis=-1)
    return transpose(matmul(probs, v), perm=[0, 2, 1, 3])


def _head_table(kv_heads, heads, kv):
    """kv_heads as the C kernel's table, one KV head in [0, kv) per query head, else None."""
    table = np.asarray(kv_heads)
    if table.ndim != 1 or table.dtype.kind not in "iu" or table.size == 0 or kv == 0:
        return None
    return _checked_head_table(table.dtype, table.tobytes(), heads, kv)


@functools.lru_cache(maxsize=64)
def _checked_head_table(dtype, raw: bytes, heads, kv):
    """_head_table's work for a 1-D integer table given as its bytes: a model's constant table
    is worked out once, not on every call.  The result is read-only (it is shared)."""
    table = np.frombuffer(raw, dtype)
    if np.any(table < -kv) or np.any(table >= kv):
        return None
    table = table % kv
    if table.size == 1 and heads > 1:  # one K/V head that MatMul broadcasts over every head
        table = np.zeros(heads, np.int64)
    if table.size != heads:
        return None
    table = np.array(table)
    table.flags.writeable = False
    return table


head_table = _head_table  # the plan's step descriptions (optimized/cpu.py) read it too


def _grouped(q, k, v, kv_heads, mask, scale):
    fits = (_floats(q, k, v) and q.ndim == k.ndim == v.ndim == 4 and q.shape[0] == k.shape[0]
            == v.shape[0] and k.shape[3] == q.shape[3] and v.shape[1:3] == k.shape[1:3]
            and (mask is None or _floats(mask)))
    table = _head_table(kv_heads, q.shape[1], k.shape[1]) if fits else None
    if table is not None:
        try:
            return kernels.grouped_attention(q, k, v, table, mask, scale=scale, empty_nan=True)
        except ValueError:  # a mask that does not broadcast to the scores: the body says so
            pass
    return _attention_body(q, k, v, kv_heads, mask, scale)


def grouped_attention(q, k, v, kv_heads, *, scale=1.0):
    return _grouped(q, k, v, kv_heads, None, scale)


def grouped_attention_masked(q, k, v, kv_heads, mask, *, scale=1.0):
    return _grouped(q, k, v, kv_heads, mask, scale)


# the causal and padding mask (gqa_fusion's CausalPaddingMask) -------------------------------
def _mask_body(attention_mask, start, end, fill):
    """The function body, op by op through the reference ops."""
    unsqueeze = _op("Unsqueeze", 13)
    one = np.ones((), np.asarray(end).dtype)
    keys = _op("Range", 11)(np.zeros((), one.dtype), end, one)
    queries = _op("Range", 11)(start, end, one)
    causal = _op("LessOrEqual", 16)(keys, unsqueeze(queries, np.array([1], np.int64)))
    padding = _op("Cast", 13)(attention_mask, to=9)  # BOOL
    allowed = _op("And", 7)(unsqueeze(causal, np.array([0, 1], np.int64)),
                            unsqueeze(padding, np.array([1, 2], np.int64)))
    return _op("Where", 16)(allowed, np.float32(0.0), np.float32(fill))


def causal_padding_mask(attention_mask, start, end, *, fill):
    """(B, 1, end - start, end): 0 where key j <= start + i and attention_mask[b, j] != 0,
    else fill.  Made at once by csrc/causal_mask.c for a 2-D mask of a type it takes, of the
    keys' width, and int64 scalars; anything else (and bad input, which it reports) goes
    through the body."""
    plain = (isinstance(attention_mask, np.ndarray) and attention_mask.ndim == 2
             and attention_mask.dtype in kernels.CAST_TYPES and all(
                 isinstance(a, np.ndarray) and a.shape == () and a.dtype == np.int64
                 for a in (start, end)))
    made = kernels.causal_padding_mask(attention_mask, start, end, fill) if plain else None
    return _mask_body(attention_mask, start, end, fill) if made is None else made


def group_query_attention(query, key=None, value=None, past_key=None, past_value=None,
                          seqlens_k=None, total_sequence_length=None, cos_cache=None,
                          sin_cache=None, position_ids=None, attention_bias=None,
                          head_sink=None, *rest, num_heads=1, kv_num_heads=1, scale=0.0,
                          softcap=0.0, local_window_size=-1, do_rotary=0, rotary_interleaved=0,
                          smooth_softmax=-1, qk_output=0, causal=1, ctx=None,
                          k_quant_type="NONE", v_quant_type="NONE", **attrs):
    """com.microsoft GroupQueryAttention over float32 (B, S, N*H) inputs: the present cache
    laid out as the reference op lays it, then one grouped-attention kernel call.  Softcap,
    head sinks, smooth softmax, quantized caches, qk-norm and the qk output run as the
    reference op."""
    n_outputs = 3 if ctx is None else ctx.n_outputs
    plain = (head_sink is None and not any(r is not None for r in rest) and softcap == 0
             and smooth_softmax != 1 and k_quant_type == v_quant_type == "NONE"
             and n_outputs <= 3 and query.ndim == 3 and seqlens_k is not None
             and total_sequence_length is not None and num_heads > 0 and kv_num_heads > 0
             and num_heads % kv_num_heads == 0)
    tensors = [t for t in (query, key, value, past_key, past_value, attention_bias)
               if t is not None]
    if not plain or not _floats(*tensors) or (key is None) != (value is None):
        return NotImplemented
    n, nkv = num_heads, kv_num_heads
    batch, seq = query.shape[:2]
    if key is None:
        if query.shape[-1] % (n + 2 * nkv):
            return NotImplemented
        head = query.shape[-1] // (n + 2 * nkv)
        q, k, v = np.split(query, [n * head, (n + nkv) * head], axis=-1)
    else:
        head = query.shape[-1] // n
        q, k, v = query, key, value
    if key is not None and query.shape[-1] != n * head:
        return NotImplemented
    if k.shape != (batch, seq, nkv * head) or v.shape[:2] != (batch, seq) or v.shape[-1] % nkv:
        return NotImplemented
    v_head = v.shape[-1] // nkv
    if v_head != head or (past_key is None) != (past_value is None):
        return NotImplemented
    q = q.reshape(batch, seq, n, head)
    k = k.reshape(batch, seq, nkv, head)
    v = v.reshape(batch, seq, nkv, head)
    total_len = int(np.asarray(total_sequence_length).reshape(-1)[0])
    total_b = np.asarray(seqlens_k).reshape(-1).astype(np.int64) + 1
    if total_b.shape != (batch,):
        return NotImplemented
    past_buf = 0 if past_key is None else past_key.shape[2]
    if past_key is not None and (past_key.shape != (batch, nkv, past_buf, head)
                                 or past_value.shape != past_key.shape):
        return NotImplemented
    first_prompt = past_key is None or past_buf == 0 or seq == total_len
    past_b = np.zeros(batch, np.int64) if first_prompt else total_b - seq
    present_len = max(past_buf, total_len)
    if np.any(past_b < 0) or np.any(past_b + seq > present_len):
        return NotImplemented
    if do_rotary:
        pos = (np.asarray(position_ids).reshape(batch, seq) if position_ids is not None
               else past_b[:, None] + np.arange(seq)[None, :])
        if cos_cache is None or not _floats(cos_cache, sin_cache) or pos.min() < 0 or (
                pos.max() >= cos_cache.shape[0]) or 2 * cos_cache.shape[1] > head:
            return NotImplemented
        cos = cos_cache[pos][:, :, None]  # (B, S, 1, R/2)
        sin = sin_cache[pos][:, :, None]
        q = kernels.rotary(q, cos, sin, interleaved=bool(rotary_interleaved))
        k = kernels.rotary(k, cos, sin, interleaved=bool(rotary_interleaved))
    present_k = np.zeros((batch, nkv, present_len, head), np.float32)
    present_v = np.zeros((batch, nkv, present_len, head), np.float32)
    for b in range(batch):  # per-batch cache layout (a loop over the batch, not elements)
        p = int(past_b[b])
        if p:
            present_k[b, :, :p] = past_key[b, :, :p]
            present_v[b, :, :p] = past_value[b, :, :p]
        present_k[b, :, p:p + seq] = k[b].transpose(1, 0, 2)
        present_v[b, :, p:p + seq] = v[b].transpose(1, 0, 2)
    mask = None
    if attention_bias is not None:
        mask = attention_bias[..., :present_len]
        if mask.shape[-1] != present_len:
            return NotImplemented
    try:
        y = kernels.grouped_attention(
            q, present_k, present_v, None, mask, scale=scale or None, q_layout="bsnh",
            kv_valid=total_b, q_pos=past_b, causal=bool(causal), window=local_window_size)
    except ValueError:
        return NotImplemented
    return y.reshape(batch, seq, n * head), present_k, present_v
