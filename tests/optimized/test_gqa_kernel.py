"""The rotary and grouped-query attention kernels (csrc/rotary.c, csrc/gqa.c) against the
reference ops com.microsoft RotaryEmbedding and GroupQueryAttention, judged by the bound policy
of reference/agreement.py, with hypothesis over batch, query and KV heads, head size, sequence,
past length, padding, sliding window and masks; and small cases worked out by hand."""
import math

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

from optimized import decoder_ops, kernels
from optimized.passes.gqa_fusion import (
    GROUPED_ATTENTION,
    GROUPED_ATTENTION_MASKED,
    grouped_attention_function,
)
from optimized.passes.silu_mlp_fusion import FUSED_DOMAIN
from reference import ReferenceEvaluator
from reference.agreement import check_node
from reference.registry import lookup

MS = "com.microsoft"
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def reference_op(op_type, **attrs):
    fn = lookup(MS, op_type, 1).fn

    def run(*inputs):
        result = fn(*inputs, **attrs)
        return result if isinstance(result, tuple) else (result,)

    return run


def judge(op_type, outputs, inputs, actual, **attrs):
    node = helper.make_node(op_type, [f"in{i}" for i in range(len(inputs))], outputs,
                            domain=MS, name="under_test", **attrs)
    actual = list(actual) if isinstance(actual, tuple) else [actual]
    verdict = check_node(node, 1, list(inputs), actual, reference_op(op_type, **attrs))
    assert verdict.ok, verdict.message()
    return verdict


# --- GroupQueryAttention ----------------------------------------------------------------------
@st.composite
def gqa_cases(draw):
    batch = draw(st.integers(1, 3))
    kv = draw(st.integers(1, 3))
    group = draw(st.integers(1, 4))
    head = draw(st.integers(1, 9))
    seq = draw(st.integers(1, 5))
    past = draw(st.integers(0, 6))
    window = draw(st.sampled_from([-1, 1, 2, 5]))
    total = past + seq
    # right padding: an entry's cache may hold fewer positions than the buffer
    pads = [draw(st.integers(0, past)) for _ in range(batch)]
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    f = np.float32
    inputs = [rng.standard_normal((batch, seq, kv * group * head)).astype(f),
              rng.standard_normal((batch, seq, kv * head)).astype(f),
              rng.standard_normal((batch, seq, kv * head)).astype(f),
              rng.standard_normal((batch, kv, past, head)).astype(f) if past else None,
              rng.standard_normal((batch, kv, past, head)).astype(f) if past else None,
              np.array([total - 1 - p for p in pads], np.int32),
              np.array(total, np.int32)]
    bias = draw(st.booleans())
    if bias:  # attention_bias (B|1, N|1, S, T)
        shape = (draw(st.sampled_from([1, batch])), draw(st.sampled_from([1, kv * group])),
                 seq, total)
        inputs += [None, None, None, rng.standard_normal(shape).astype(f)]
    attrs = {"num_heads": kv * group, "kv_num_heads": kv, "local_window_size": window}
    if draw(st.booleans()):
        attrs["scale"] = draw(st.sampled_from([0.25, 1.5]))
    return inputs, attrs


@SETTINGS
@given(gqa_cases())
def test_group_query_attention_kernel_within_the_bound(case):
    inputs, attrs = case
    got = decoder_ops.group_query_attention(*inputs, **attrs)
    assert got is not NotImplemented
    judge("GroupQueryAttention", ["y", "present_key", "present_value"], inputs, got, **attrs)


@SETTINGS
@given(gqa_cases(), st.booleans())
def test_group_query_attention_with_rotary_matches_the_reference(case, interleaved):
    inputs, attrs = case
    head = inputs[1].shape[-1] // attrs["kv_num_heads"]
    if head % 2:
        return  # rotary pairs need an even head size
    inputs = inputs[:7] + [None, None, None] + inputs[10:]
    rng = np.random.default_rng(head)
    angles = rng.uniform(0, 6, (16, head // 2))
    inputs[7], inputs[8] = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    attrs = {**attrs, "do_rotary": 1, "rotary_interleaved": int(interleaved)}
    got = decoder_ops.group_query_attention(*inputs, **attrs)
    expected = lookup(MS, "GroupQueryAttention", 1).fn(*inputs, **attrs)[:3]
    # no bound is written for the rotary form: the corpus policy's tolerance
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


def test_group_query_attention_decode_by_hand():
    # 2 query heads share 1 KV head; head size 1, scale 1; the new key 1 joins the cached key 0
    q = np.array([[[1.0, 2.0]]], np.float32)           # (B=1, S=1, N*H=2)
    k = np.array([[[1.0]]], np.float32)                 # new key
    v = np.array([[[20.0]]], np.float32)                # new value
    past_k = np.array([[[[0.0]]]], np.float32)
    past_v = np.array([[[[10.0]]]], np.float32)
    y, present_k, present_v = decoder_ops.group_query_attention(
        q, k, v, past_k, past_v, np.array([1], np.int32), np.array(2, np.int32),
        num_heads=2, kv_num_heads=1, scale=1.0)
    # head h: scores [0, q_h], p = softmax, y = 10 p0 + 20 p1
    expected = [10 + 10 * math.exp(s) / (1 + math.exp(s)) for s in (1.0, 2.0)]
    np.testing.assert_allclose(y.reshape(-1), expected, rtol=1e-6)
    np.testing.assert_array_equal(present_k.reshape(-1), [0.0, 1.0])
    np.testing.assert_array_equal(present_v.reshape(-1), [10.0, 20.0])


def test_window_of_one_sees_only_the_query_itself():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 3, 2, 4)).astype(np.float32)   # (B, S, N, H) "bsnh"
    k = rng.standard_normal((1, 1, 5, 4)).astype(np.float32)
    v = rng.standard_normal((1, 1, 5, 4)).astype(np.float32)
    y = kernels.grouped_attention(q, k, v, mask=None, q_layout="bsnh", q_pos=[2], causal=True,
                                  window=1)
    # queries at positions 2, 3, 4 each see their own key alone: the output is its value
    for i in range(3):
        for h in range(2):
            np.testing.assert_array_equal(y[0, i, h], v[0, 0, 2 + i])


def test_head_table_reads_the_named_kv_head():
    # a cyclic table (Tile of the heads axis): query head h reads KV head h % 2
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 4, 3, 5)).astype(np.float32)
    k = rng.standard_normal((2, 2, 6, 5)).astype(np.float32)
    v = rng.standard_normal((2, 2, 6, 7)).astype(np.float32)
    mask = rng.standard_normal((2, 1, 3, 6)).astype(np.float32)
    table = np.array([0, 1, 0, 1])
    y = kernels.grouped_attention(q, k, v, table, mask, scale=0.3)
    kk, vv = k[:, table], v[:, table]
    scores = 0.3 * q.astype(np.float64) @ kk.transpose(0, 1, 3, 2) + mask
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(y, (p @ vv).transpose(0, 2, 1, 3), rtol=1e-5, atol=1e-6)


def test_a_table_changed_in_place_is_read_again():
    # the wrappers keep the checked table of each table value, not of each table object
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 4, 1, 5)).astype(np.float32)
    k = rng.standard_normal((1, 2, 6, 5)).astype(np.float32)
    v = rng.standard_normal((1, 2, 6, 5)).astype(np.float32)
    def expected(table):
        scores = 0.5 * q.astype(np.float64) @ k[:, table].transpose(0, 1, 3, 2)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        return ((p / p.sum(-1, keepdims=True)) @ v[:, table]).transpose(0, 2, 1, 3)

    table = np.array([0, 0, 1, 1])
    for heads in ([0, 0, 1, 1], [1, 1, 0, 0], [1, 0, 1, 0]):
        table[:] = heads
        y = decoder_ops.grouped_attention(q, k, v, table, scale=0.5)
        np.testing.assert_allclose(y, expected(list(heads)), rtol=1e-5, atol=1e-6)
    table[:] = [0, 0, 2, 2]  # out of range for 2 KV heads: refused again, not remembered
    with pytest.raises(ValueError, match="kv_head_of"):
        kernels.grouped_attention(q, k, v, table)
    with pytest.raises(ValueError, match="kv_head_of"):
        kernels.grouped_attention(q, k, v, table)


def test_a_row_that_sees_no_key_is_nan_like_softmax_or_zero():
    q = np.ones((1, 1, 2, 2), np.float32)
    k = np.ones((1, 1, 3, 2), np.float32)
    v = np.ones((1, 1, 3, 2), np.float32)
    mask = np.zeros((1, 1, 2, 3), np.float32)
    mask[0, 0, 1] = -np.inf  # the second query sees nothing
    y = kernels.grouped_attention(q, k, v, mask=mask, empty_nan=True)
    assert np.isnan(y[0, 1]).all() and np.isfinite(y[0, 0]).all()
    y = kernels.grouped_attention(q, k, v, mask=mask)
    np.testing.assert_array_equal(y[0, 1], 0.0)


@pytest.mark.parametrize("bad, message", [
    ({"k": np.zeros((1, 3, 4, 8), np.float32), "v": np.zeros((1, 3, 4, 8), np.float32)},
     "do not group"),
    ({"kv_head_of": [0, 2]}, "kv_head_of"),
    ({"mask": np.zeros((1, 1, 2, 5), np.float32)}, "does not broadcast"),
    ({"v": np.zeros((1, 1, 3, 8), np.float32)}, "V must be"),
    ({"q_layout": "nbsh"}, "q_layout"),
])
def test_bad_arguments_are_named(bad, message):
    args = {"q": np.zeros((1, 2, 2, 8), np.float32), "k": np.zeros((1, 1, 4, 8), np.float32),
            "v": np.zeros((1, 1, 4, 8), np.float32)}
    args.update(bad)
    with pytest.raises(ValueError, match=message):
        kernels.grouped_attention(**args)


# --- rotary embedding -----------------------------------------------------------------------
@st.composite
def rotary_cases(draw):
    batch, seq, heads = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 4))
    half = draw(st.integers(1, 6))
    head = 2 * half + draw(st.sampled_from([0, 0, 2, 4]))  # rotary dim below the head size
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    positions = 16
    angles = rng.uniform(0, 6, (positions, head // 2))
    attrs = {"interleaved": int(draw(st.booleans()))}
    if head != 2 * half:
        attrs["rotary_embedding_dim"] = 2 * half
        attrs["num_heads"] = heads
    if draw(st.booleans()):
        x = rng.standard_normal((batch, heads, seq, head)).astype(np.float32)
    else:
        x = rng.standard_normal((batch, seq, heads * head)).astype(np.float32)
        attrs["num_heads"] = heads
    if draw(st.booleans()):
        position_ids = rng.integers(0, positions, (batch, seq)).astype(np.int64)
    else:
        position_ids = np.array([draw(st.integers(0, positions - seq))], np.int64)
    return [x, position_ids, np.cos(angles).astype(np.float32),
            np.sin(angles).astype(np.float32)], attrs


@SETTINGS
@given(rotary_cases())
def test_rotary_embedding_kernel_within_the_bound(case):
    inputs, attrs = case
    got = decoder_ops.rotary_embedding(*inputs, **attrs)
    assert got is not NotImplemented
    judge("RotaryEmbedding", ["y"], inputs, got, **attrs)


def test_rotary_turns_a_pair_by_hand():
    # x = (1, 2 | 3, 4) with halves (1, 2) and (3, 4): pair (1, 3) turns by 90 degrees,
    # pair (2, 4) by 0: (1, 3) -> (-3, 1); (2, 4) stays
    x = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    cos = np.array([[0.0, 1.0]], np.float32)
    sin = np.array([[1.0, 0.0]], np.float32)
    np.testing.assert_array_equal(kernels.rotary(x, cos, sin), [[-3.0, 2.0, 1.0, 4.0]])
    # interleaved: pairs (1, 2) and (3, 4)
    np.testing.assert_array_equal(kernels.rotary(x, cos, sin, interleaved=True),
                                  [[-2.0, 1.0, 3.0, 4.0]])


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 5), st.integers(1, 6),
       st.booleans(), st.integers(0, 2**16))
def test_full_width_rotary_equals_the_decomposed_graph_bit_for_bit(batch, heads, seq, half,
                                                                   interleaved, seed):
    # what rotary_fusion replaces: x * cos + rotate(x) * sin, each op rounded (no FMA)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, heads, seq, 2 * half)).astype(np.float32)
    cos = rng.standard_normal((batch, 1, seq, 2 * half)).astype(np.float32)
    sin = rng.standard_normal((batch, 1, seq, 2 * half)).astype(np.float32)
    fast = decoder_ops.rotary_interleaved if interleaved else decoder_ops.rotary
    if interleaved:
        pairs = x.reshape(batch, heads, seq, half, 2)
        rotated = np.concatenate([-pairs[..., 1:], pairs[..., :1]], -1).reshape(x.shape)
    else:
        rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
    np.testing.assert_array_equal(fast(x, cos, sin), x * cos + rotated * sin)


def test_rotary_shapes_it_cannot_take_are_named():
    x = np.zeros((2, 3, 8), np.float32)
    with pytest.raises(ValueError, match="fits no rotation"):
        kernels.rotary(x, np.zeros((3, 5), np.float32), np.zeros((3, 5), np.float32))
    with pytest.raises(ValueError, match="do not broadcast"):
        kernels.rotary(x, np.zeros((4, 8), np.float32), np.zeros((4, 8), np.float32))
    with pytest.raises(TypeError, match="float32"):
        kernels.rotary(x.astype(np.float64), np.zeros((3, 8)), np.zeros((3, 8)))


# --- the fused function gqa_fusion writes: kernel against its body ----------------------------
def function_model(masked, scale, shapes):
    op_type = GROUPED_ATTENTION_MASKED if masked else GROUPED_ATTENTION
    names = ["q", "k", "v", "kv_heads"] + (["mask"] if masked else [])
    types = [onnx.TensorProto.FLOAT] * 3 + [onnx.TensorProto.INT64] + [onnx.TensorProto.FLOAT]
    node = helper.make_node(op_type, names, ["y"], domain=FUSED_DOMAIN, scale=scale)
    graph = helper.make_graph(
        [node], "fused", [helper.make_tensor_value_info(n, t, s)
                          for n, t, s in zip(names, types, shapes)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                   helper.make_opsetid(FUSED_DOMAIN, 1)],
                             functions=[grouped_attention_function(op_type, 18)])


@SETTINGS
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.integers(1, 6),
       st.integers(1, 5), st.integers(1, 7), st.sampled_from(["none", "rows", "full", "inf"]),
       st.booleans(), st.integers(0, 2**16))
def test_grouped_attention_kernel_equals_its_function_body(batch, kv, group, head, seq, total,
                                                           mask_kind, cyclic, seed):
    rng = np.random.default_rng(seed)
    heads = kv * group
    q = rng.standard_normal((batch, heads, seq, head)).astype(np.float32)
    k = rng.standard_normal((batch, kv, total, head)).astype(np.float32)
    v = rng.standard_normal((batch, kv, total, head + 1)).astype(np.float32)
    table = (np.arange(heads) % kv if cyclic else np.arange(heads) // group).astype(np.int64)
    mask = None
    if mask_kind == "rows":  # a padding mask over keys, one row for every query
        mask = rng.standard_normal((batch, 1, 1, total)).astype(np.float32)
    elif mask_kind == "full":
        mask = rng.standard_normal((batch, heads, seq, total)).astype(np.float32)
    elif mask_kind == "inf":  # causal with -inf, some rows masked whole (NaN, as Softmax)
        mask = np.where(np.arange(total)[None, :] <= np.arange(seq)[:, None] - 1, 0.0,
                        -np.inf).astype(np.float32)
    scale = 1.0 / np.sqrt(head)
    inputs = [q, k, v, table] + ([mask] if mask is not None else [])
    model = function_model(mask is not None, scale, [list(a.shape) for a in inputs])
    expected = ReferenceEvaluator(model).run(None, dict(zip(["q", "k", "v", "kv_heads", "mask"],
                                                            inputs)))[0]
    fast = (decoder_ops.grouped_attention_masked if mask is not None
            else decoder_ops.grouped_attention)
    got = fast(*inputs, scale=scale)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# --- keys an additive mask drops: left out where that is exact (csrc/gqa.c keys_under_mask) ---
@st.composite
def dropping_masks(draw):
    """A causal and padding mask as exporters write it (0 kept, fill dropped) over past + seq
    keys, padded left, right or with holes; sometimes a NaN or infinity in a dropped key's K or
    V, or a query so large that scores pass the bound where dropping is exact."""
    batch, kv, group = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    head, seq, past = draw(st.integers(1, 8)), draw(st.integers(1, 40)), draw(st.integers(0, 5))
    total = past + seq
    fill = draw(st.sampled_from([-np.inf, float(np.finfo(np.float32).min), -1e30]))
    keep = np.ones((batch, total), bool)
    for b in range(batch):
        left, right = draw(st.integers(0, total)), draw(st.integers(0, total))
        keep[b, :left] = False
        keep[b, total - right:] = False
        for hole in draw(st.lists(st.integers(0, total - 1), max_size=3)):
            keep[b, hole] = False
    causal = np.arange(total)[None, :] <= past + np.arange(seq)[:, None]
    mask = np.where(causal[None, None] & keep[:, None, None, :], 0.0, fill).astype(np.float32)
    poison = draw(st.sampled_from(["none", "none", "nan_k", "inf_v", "huge_q"]))
    return batch, kv, group, head, seq, total, mask, poison, draw(st.integers(0, 2**16))


@SETTINGS
@given(dropping_masks(), st.sampled_from([1, 2]))
def test_keys_a_mask_drops_leave_the_result_as_the_body_gives_it(case, threads):
    batch, kv, group, head, seq, total, mask, poison, seed = case
    rng = np.random.default_rng(seed)
    heads = kv * group
    q = rng.standard_normal((batch, heads, seq, head)).astype(np.float32)
    k = rng.standard_normal((batch, kv, total, head)).astype(np.float32)
    v = rng.standard_normal((batch, kv, total, head + 1)).astype(np.float32)
    if poison == "nan_k":  # the last key: dropped for every row but the last ones
        k[0, 0, -1, 0] = np.nan
    elif poison == "inf_v":
        v[-1, -1, -1, -1] = np.inf
    elif poison == "huge_q":
        q[0, 0] = 4e30  # masked scores of -1e30 fill may now be the largest
    table = (np.arange(heads) // group).astype(np.int64)
    scale = 1.0 / np.sqrt(head)
    inputs = [q, k, v, table, mask]
    model = function_model(True, scale, [list(a.shape) for a in inputs])
    with np.errstate(all="ignore"):
        expected = ReferenceEvaluator(model).run(
            None, dict(zip(["q", "k", "v", "kv_heads", "mask"], inputs)))[0]
    before = kernels.get_num_threads()
    kernels.set_num_threads(threads)
    try:
        got = decoder_ops.grouped_attention_masked(*inputs, scale=scale)
    finally:
        kernels.set_num_threads(before)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_masked_score_above_every_kept_one_still_wins():
    # scale 1, head 1: scores q*k; key 1's score 3e30 under a fill of -1e30 is 2e30, above key
    # 0's 0, so softmax puts all weight on key 1 (as the body does): it is not left out
    q = np.full((1, 1, 2, 1), 1e16, np.float32)
    k = np.array([0.0, 3e14], np.float32).reshape(1, 1, 2, 1)
    v = np.array([5.0, 7.0], np.float32).reshape(1, 1, 2, 1)
    mask = np.array([[0.0, -1e30], [0.0, 0.0]], np.float32).reshape(1, 1, 2, 2)
    got = decoder_ops.grouped_attention_masked(q, k, v, np.zeros(1, np.int64), mask, scale=1.0)
    np.testing.assert_array_equal(got.reshape(-1), [7.0, 7.0])
