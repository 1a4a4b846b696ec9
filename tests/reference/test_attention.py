"""Attention family: Attention against a direct per-head computation (GQA, causal with cache
offsets, masks, windows, softcap, qk_matmul_output modes), softmax stability with huge logits,
fully-masked rows, RotaryEmbedding, TensorScatter, LinearAttention, CausalConvWithState and
FlexAttention with modifier subgraphs."""
import math
from functools import partial

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from reference import NodeError
from tests.reference.oneop import run_node

run = partial(run_node, as_list=True, opset=25)


def direct_attention(Q, K, V, allowed=None, scale=None, add=None):
    """Per (batch, head, query) loops in float64; kv head of query head h is h // group."""
    b, hq, sq, d = Q.shape
    hkv, sk = K.shape[1], K.shape[2]
    group = hq // hkv
    scale = 1 / math.sqrt(d) if scale is None else scale
    Y = np.zeros((b, hq, sq, V.shape[-1]))
    P = np.zeros((b, hq, sq, sk))
    for n in range(b):
        for h in range(hq):
            kv = h // group
            for i in range(sq):
                s = np.array([Q[n, h, i] @ K[n, kv, j] * scale for j in range(sk)], dtype=float)
                if add is not None:
                    s = s + np.broadcast_to(add, (b, hq, sq, sk))[n, h, i]
                if allowed is not None:
                    s = np.where(np.broadcast_to(allowed, (b, hq, sq, sk))[n, h, i], s, -np.inf)
                if np.all(s == -np.inf):
                    continue  # a fully-masked row is zero
                p = np.exp(s - s.max())
                p /= p.sum()
                P[n, h, i] = p
                Y[n, h, i] = p @ V[n, kv]
    return Y, P


def rand(rng, *shape, dtype=np.float32):
    return rng.random(shape).astype(dtype)


def test_gqa_causal_matches_direct_computation():
    rng = np.random.default_rng(0)
    Q, K, V = rand(rng, 2, 6, 4, 8), rand(rng, 2, 2, 4, 8), rand(rng, 2, 2, 4, 5)
    Y, = run("Attention", Q, K, V, is_causal=1)
    causal = np.tril(np.ones((4, 4), bool))
    eY, _ = direct_attention(Q, K, V, allowed=causal)
    assert Y.dtype == np.float32 and Y.shape == (2, 6, 4, 5)
    np.testing.assert_allclose(Y, eY, rtol=1e-5, atol=1e-6)


def test_3d_inputs_pack_heads_in_last_dimension():
    rng = np.random.default_rng(1)
    Q, K, V = rand(rng, 2, 3, 4 * 6), rand(rng, 2, 5, 2 * 6), rand(rng, 2, 5, 2 * 7)
    Y, = run("Attention", Q, K, V, q_num_heads=4, kv_num_heads=2)
    split = lambda x, h: x.reshape(x.shape[0], x.shape[1], h, -1).transpose(0, 2, 1, 3)
    eY, _ = direct_attention(split(Q, 4), split(K, 2), split(V, 2))
    assert Y.shape == (2, 3, 4 * 7)
    np.testing.assert_allclose(Y, eY.transpose(0, 2, 1, 3).reshape(2, 3, 28), rtol=1e-5, atol=1e-6)


def test_past_and_present_with_causal_offset():
    rng = np.random.default_rng(2)
    Q, K, V = rand(rng, 1, 2, 2, 4), rand(rng, 1, 2, 2, 4), rand(rng, 1, 2, 2, 4)
    pk, pv = rand(rng, 1, 2, 3, 4), rand(rng, 1, 2, 3, 4)
    Y, present_k, present_v, qk = run("Attention", Q, K, V, None, pk, pv, n_out=4, is_causal=1)
    np.testing.assert_array_equal(present_k, np.concatenate([pk, K], axis=2))
    np.testing.assert_array_equal(present_v, np.concatenate([pv, V], axis=2))
    # Bottom-right alignment: query i sees keys j <= i + past_length (3).
    allowed = np.arange(5)[None, :] <= np.arange(2)[:, None] + 3
    eY, _ = direct_attention(Q, present_k, present_v, allowed=allowed)
    np.testing.assert_allclose(Y, eY, rtol=1e-5, atol=1e-6)
    assert qk.shape == (1, 2, 2, 5)


def test_bool_mask_equals_float_mask_and_short_mask_is_padded():
    rng = np.random.default_rng(3)
    Q, K, V = rand(rng, 1, 1, 3, 4), rand(rng, 1, 1, 5, 4), rand(rng, 1, 1, 5, 4)
    bmask = np.array([[True, False, True], [True, True, True], [False, True, False]])
    fmask = np.where(bmask, 0, -np.inf).astype(np.float32)
    Yb, = run("Attention", Q, K, V, bmask)
    Yf, = run("Attention", Q, K, V, fmask)
    np.testing.assert_allclose(Yb, Yf, rtol=1e-6)
    # The two keys past the mask's last dimension are masked out.
    allowed = np.concatenate([bmask, np.zeros((3, 2), bool)], axis=1)
    eY, _ = direct_attention(Q, K, V, allowed=allowed)
    np.testing.assert_allclose(Yb, eY, rtol=1e-5, atol=1e-6)


def test_float_mask_is_added_to_scores():
    rng = np.random.default_rng(4)
    Q, K, V = rand(rng, 2, 2, 3, 4), rand(rng, 2, 2, 3, 4), rand(rng, 2, 2, 3, 4)
    mask = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
    Y, = run("Attention", Q, K, V, mask)
    eY, _ = direct_attention(Q, K, V, add=mask)
    np.testing.assert_allclose(Y, eY, rtol=1e-5, atol=1e-6)


def test_fully_masked_row_is_zero_in_y_and_mode3_output():
    rng = np.random.default_rng(5)
    Q, K, V = rand(rng, 1, 2, 2, 4), rand(rng, 1, 2, 2, 4), rand(rng, 1, 2, 2, 4)
    mask = np.array([[True, False], [False, False]])  # with causal: row 1 allows nothing
    Y, P = run("Attention", Q, K, V, mask, n_out=["out0", "", "", "out3"], is_causal=1,
                     qk_matmul_output_mode=3)
    assert np.isfinite(Y).all() and np.isfinite(P).all()
    np.testing.assert_array_equal(Y[:, :, 1], 0)
    np.testing.assert_array_equal(P[:, :, 1], 0)
    np.testing.assert_array_equal(P[:, :, 0], [[[1, 0], [1, 0]]])  # row 0 sees key 0 only
    np.testing.assert_allclose(Y[:, :, 0], V[:, :, 0], rtol=1e-6)


def test_softmax_is_stable_for_huge_logits():
    # Scores 1e4 and 9.9e3: a naive exp overflows; the stable softmax gives weights (1, e^-100).
    Q = np.array([[[[100.0]]]], np.float32)
    K = np.array([[[[100.0], [99.0]]]], np.float32)
    V = np.array([[[[1.0, 2.0], [30.0, 40.0]]]], np.float32)
    Y, P = run("Attention", Q, K, V, n_out=["out0", "", "", "out3"], scale=1.0,
                     qk_matmul_output_mode=3)
    assert np.isfinite(Y).all()
    np.testing.assert_allclose(P[0, 0, 0], [1.0, 0.0], atol=1e-30)
    np.testing.assert_allclose(Y[0, 0, 0], [1.0, 2.0], rtol=1e-6)
    # Flex attention shares the softmax.
    Yf, = run("FlexAttention", Q, K, V, domain="ai.onnx.preview", scale=1.0)
    np.testing.assert_allclose(Yf[0, 0, 0], [1.0, 2.0], rtol=1e-6)


def test_qk_matmul_output_modes_and_softcap_order():
    rng = np.random.default_rng(6)
    Q, K, V = rand(rng, 1, 1, 2, 4) * 4, rand(rng, 1, 1, 3, 4) * 4, rand(rng, 1, 1, 3, 4)
    mask = np.array([[0.0, -np.inf, 0.5], [0.25, 0.0, 0.0]], np.float32)
    raw = (Q.astype(np.float64) @ K[0, 0].T.astype(np.float64)) * 0.5  # scale = 1/sqrt(4)
    capped = 2.0 * np.tanh(raw / 2.0)
    outs = {}
    for mode in range(4):
        Y, qk = run("Attention", Q, K, V, mask, n_out=["out0", "", "", "out3"],
                          softcap=2.0, qk_matmul_output_mode=mode)
        outs[mode] = qk
        assert qk.dtype == np.float32
    np.testing.assert_allclose(outs[0], raw, rtol=1e-5)
    np.testing.assert_allclose(outs[1], capped, rtol=1e-5)  # softcap before the mask
    np.testing.assert_allclose(outs[2], capped + mask, rtol=1e-5)
    e = np.exp(capped + mask - (capped + mask).max(-1, keepdims=True))
    probs = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(outs[3], probs, rtol=1e-5)
    assert outs[3][0, 0, 0, 1] == 0  # the -inf survives the softcap
    np.testing.assert_allclose(Y, probs @ V.astype(np.float64), rtol=1e-5)


def test_nonpad_kv_seqlen_external_cache_offset():
    # Opset 24: keys past nonpad are padding; causal offset = nonpad - q_len per batch.
    rng = np.random.default_rng(7)
    Q, K, V = rand(rng, 2, 1, 2, 4), rand(rng, 2, 1, 6, 4), rand(rng, 2, 1, 6, 4)
    nonpad = np.array([5, 1], np.int64)
    Y, = run("Attention", Q, K, V, None, None, None, nonpad, is_causal=1, opset=24)
    key = np.arange(6)
    allowed = np.zeros((2, 1, 2, 6), bool)
    for b in range(2):
        for i in range(2):
            allowed[b, 0, i] = (key < nonpad[b]) & (key <= i + nonpad[b] - 2)
    eY, _ = direct_attention(Q, K, V, allowed=allowed)
    np.testing.assert_allclose(Y, eY, rtol=1e-5, atol=1e-6)
    # Batch 1 has offset -1: its first query sees no key and is zero.
    np.testing.assert_array_equal(Y[1, 0, 0], 0)


def test_sliding_window_matches_spec_example():
    # Spec example: S_q=4, S_k=6, left=2, right=1.  Equal scores (Q=0) and one-hot values
    # make each output row the uniform distribution over the keys that query attends.
    Q = np.zeros((1, 1, 4, 2), np.float32)
    K = np.ones((1, 1, 6, 2), np.float32)
    V = np.eye(6, dtype=np.float32)[None, None]
    Y, = run("Attention", Q, K, V, left_window_size=2, right_window_size=1)
    expected = np.zeros((4, 6))
    for i, keys in enumerate([[0, 1], [0, 1, 2], [0, 1, 2, 3], [1, 2, 3, 4]]):
        expected[i, keys] = 1 / len(keys)
    np.testing.assert_allclose(Y[0, 0], expected, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_attention_keeps_input_dtype(dtype):
    rng = np.random.default_rng(8)
    Q, K, V = (rand(rng, 1, 2, 3, 4).astype(dtype) for _ in range(3))
    Y, qk = run("Attention", Q, K, V, n_out=["out0", "", "", "out3"],
                      qk_matmul_output_mode=3, softmax_precision=TensorProto.FLOAT)
    assert Y.dtype == np.dtype(dtype) and qk.dtype == np.dtype(dtype)
    eY, _ = direct_attention(*(x.astype(np.float64) for x in (Q, K, V)))
    np.testing.assert_allclose(Y.astype(np.float64), eY, rtol=2e-2, atol=1e-2)


def test_attention_rejects_bad_heads():
    Q, K = np.zeros((1, 3, 2, 4), np.float32), np.zeros((1, 2, 2, 4), np.float32)
    with pytest.raises(NodeError, match="multiple"):
        run("Attention", Q, K, K)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_attention_probabilities_sum_to_one_and_keys_are_a_set(sq, sk, seed):
    # Laws: each mode-3 row sums to 1; permuting keys and values together changes nothing.
    rng = np.random.default_rng(seed)
    Q, K, V = rand(rng, 1, 2, sq, 3), rand(rng, 1, 1, sk, 3), rand(rng, 1, 1, sk, 2)
    Y, P = run("Attention", Q, K, V, n_out=["out0", "", "", "out3"], qk_matmul_output_mode=3)
    np.testing.assert_allclose(P.sum(-1), 1, rtol=1e-5)
    perm = rng.permutation(sk)
    Yp, = run("Attention", Q, K[:, :, perm], V[:, :, perm])
    np.testing.assert_allclose(Yp, Y, rtol=1e-5, atol=1e-6)


# RotaryEmbedding ----------------------------------------------------------------------------
def test_rotary_rotates_pairs_by_position_angle():
    # head_size 4, non-interleaved: pairs are (x0, x2) and (x1, x3).
    theta = np.array([[0.0, 0.0], [0.3, 1.1], [math.pi / 2, 0.2]], np.float32)
    cos, sin = np.cos(theta), np.sin(theta)
    X = np.array([[[[1.0, 2.0, 0.0, 0.5]]]], np.float32)  # (batch 1, heads 1, seq 1, 4)
    pos = np.array([[1]], np.int64)
    Y, = run("RotaryEmbedding", X, cos, sin, pos)
    c, s = cos[1], sin[1]
    expected = [c[0] * 1 - s[0] * 0, c[1] * 2 - s[1] * 0.5, s[0] * 1 + c[0] * 0, s[1] * 2 + c[1] * 0.5]
    np.testing.assert_allclose(Y[0, 0, 0], expected, rtol=1e-6)
    # Interleaved: pairs are (x0, x1) and (x2, x3).
    Y, = run("RotaryEmbedding", X, cos, sin, pos, interleaved=1)
    expected = [c[0] * 1 - s[0] * 2, s[0] * 1 + c[0] * 2, c[1] * 0 - s[1] * 0.5, s[1] * 0 + c[1] * 0.5]
    np.testing.assert_allclose(Y[0, 0, 0], expected, rtol=1e-6)


def test_rotary_partial_dim_3d_input_and_no_position_ids():
    rng = np.random.default_rng(9)
    X4 = rand(rng, 2, 3, 5, 8)  # (batch, heads, seq, head)
    cos, sin = rand(rng, 2, 5, 2), rand(rng, 2, 5, 2)  # per (batch, seq): rotary dim 4
    Y4, = run("RotaryEmbedding", X4, cos, sin, rotary_embedding_dim=4)
    np.testing.assert_array_equal(Y4[..., 4:], X4[..., 4:])  # past the rotary dim: untouched
    x1, x2 = X4[..., :2], X4[..., 2:4]
    c, s = cos[:, None], sin[:, None]
    np.testing.assert_allclose(Y4[..., :4], np.concatenate([c * x1 - s * x2, s * x1 + c * x2], -1),
                               rtol=1e-6)
    X3 = X4.transpose(0, 2, 1, 3).reshape(2, 5, 24)
    Y3, = run("RotaryEmbedding", X3, cos, sin, rotary_embedding_dim=4, num_heads=3)
    np.testing.assert_allclose(Y3, Y4.transpose(0, 2, 1, 3).reshape(2, 5, 24), rtol=1e-6)


def test_rotary_rejects_mismatched_cache():
    X = np.zeros((1, 1, 2, 8), np.float32)
    with pytest.raises(NodeError, match="cos_cache"):
        run("RotaryEmbedding", X, np.zeros((1, 2, 3), np.float32), np.zeros((1, 2, 3), np.float32))


# TensorScatter ------------------------------------------------------------------------------
def test_tensor_scatter_linear_and_circular():
    past = np.zeros((2, 1, 4, 1), np.float32)  # (batch, heads, max_seq, head)
    update = np.array([[[[1], [2]]], [[[3], [4]]]], np.float32)
    idx = np.array([1, 3], np.int64)
    Y, = run("TensorScatter", past, update, idx, opset=24, mode="circular")
    np.testing.assert_array_equal(Y[:, 0, :, 0], [[0, 1, 2, 0], [4, 0, 0, 3]])
    Y, = run("TensorScatter", past, update, np.array([2, 0], np.int64), opset=24)
    np.testing.assert_array_equal(Y[:, 0, :, 0], [[0, 0, 1, 2], [3, 4, 0, 0]])
    np.testing.assert_array_equal(past, 0)  # the input is not modified
    with pytest.raises(NodeError, match="linear"):
        run("TensorScatter", past, update, idx, opset=24)


def test_tensor_scatter_other_axis_and_default_indices():
    past = np.arange(2 * 3 * 2).reshape(2, 3, 2).astype(np.int64)
    update = -np.ones((2, 2, 2), np.int64)
    Y, = run("TensorScatter", past, update, opset=24, axis=1)
    expected = past.copy()
    expected[:, :2] = -1
    np.testing.assert_array_equal(Y, expected)


# LinearAttention ----------------------------------------------------------------------------
def test_linear_attention_rules_scalar_heads():
    # d_k = d_v = 1, one head: the state is a number, so each rule is checkable by hand.
    q = np.array([[[1.0], [2.0]]], np.float32)
    k = np.array([[[0.5], [1.0]]], np.float32)
    v = np.array([[[2.0], [3.0]]], np.float32)
    g = np.array([[[math.log(0.5)], [math.log(0.5)]]], np.float32)
    beta = np.array([[[1.0], [0.5]]], np.float32)
    s0 = np.array([[[[4.0]]]], np.float32)
    common = {"q_num_heads": 1, "kv_num_heads": 1, "scale": 1.0, "opset": 27, "n_out": 2}
    # linear: S1 = 4 + 1 = 5, S2 = 5 + 3 = 8; o = q * S
    o, s = run("LinearAttention", q, k, v, s0, update_rule="linear", **common)
    np.testing.assert_allclose(o[0, :, 0], [5.0, 16.0])
    np.testing.assert_allclose(s[0, 0, 0, 0], 8.0)
    # gated: S1 = .5*4 + 1 = 3, S2 = .5*3 + 3 = 4.5
    o, s = run("LinearAttention", q, k, v, s0, g, update_rule="gated", **common)
    np.testing.assert_allclose(o[0, :, 0], [3.0, 9.0], rtol=1e-6)
    # delta: S1 = 4 + 1*.5*(2 - 4*.5) = 4, S2 = 4 + .5*1*(3 - 4) = 3.5
    o, s = run("LinearAttention", q, k, v, s0, None, beta, update_rule="delta", **common)
    np.testing.assert_allclose(o[0, :, 0], [4.0, 7.0], rtol=1e-6)
    # gated_delta: D = .5*4 = 2, S1 = 2 + .5*(2 - 2*.5) = 2.5; D = 1.25, S2 = 1.25 + .5*(3 - 1.25)
    o, s = run("LinearAttention", q, k, v, s0, g, beta, update_rule="gated_delta", **common)
    np.testing.assert_allclose(o[0, :, 0], [2.5, 2 * 2.125], rtol=1e-6)
    np.testing.assert_allclose(s[0, 0, 0, 0], 2.125, rtol=1e-6)


def test_linear_attention_gqa_and_default_scale():
    # Two query heads share one kv head; no past state; default scale 1/sqrt(d_k=4).
    rng = np.random.default_rng(10)
    q, k, v = rand(rng, 1, 3, 8), rand(rng, 1, 3, 4), rand(rng, 1, 3, 2)
    o, s = run("LinearAttention", q, k, v, n_out=2, opset=27, q_num_heads=2, kv_num_heads=1,
               update_rule="linear")
    S = np.zeros((4, 2))
    for t in range(3):
        S = S + np.outer(k[0, t], v[0, t])
        for h in range(2):
            np.testing.assert_allclose(o[0, t, 2 * h:2 * h + 2], 0.5 * q[0, t, 4 * h:4 * h + 4] @ S,
                                       rtol=1e-5)
    np.testing.assert_allclose(s[0, 0], S, rtol=1e-5)
    assert o.shape == (1, 3, 4) and s.shape == (1, 1, 4, 2)


# CausalConvWithState ------------------------------------------------------------------------
def test_causal_conv_with_state_hand_checked():
    x = np.array([[[1.0, 2.0, 3.0]]], np.float32)  # (batch 1, channels 1, length 3)
    w = np.array([[[0.5, -1.0, 2.0]]], np.float32)  # k = 3: y[t] = .5 p[t] - p[t+1] + 2 p[t+2]
    past = np.array([[[10.0, 20.0]]], np.float32)
    y, state = run("CausalConvWithState", x, w, np.array([1.0], np.float32), past, n_out=2,
                   opset=27)
    padded = [10, 20, 1, 2, 3]
    expected = [0.5 * padded[t] - padded[t + 1] + 2 * padded[t + 2] + 1 for t in range(3)]
    np.testing.assert_allclose(y[0, 0], expected)
    np.testing.assert_array_equal(state[0, 0], [2.0, 3.0])
    # Input shorter than k - 1: the state keeps part of the past.
    y, state = run("CausalConvWithState", x[..., :1], w, None, past, n_out=2, opset=27,
                   activation="silu")
    pre = 0.5 * 10 - 20 + 2 * 1
    np.testing.assert_allclose(y[0, 0], [pre / (1 + math.exp(-pre))], rtol=1e-6)
    np.testing.assert_array_equal(state[0, 0], [20.0, 1.0])


def test_causal_conv_without_state_is_zero_padded_per_channel():
    x = np.array([[[1.0, 1.0], [2.0, 0.0]]], np.float32)
    w = np.array([[[1.0, 10.0]], [[3.0, 0.0]]], np.float32)
    y, state = run("CausalConvWithState", x, w, n_out=2, opset=27)
    np.testing.assert_allclose(y[0], [[10.0, 11.0], [0.0, 6.0]])
    np.testing.assert_array_equal(state[0], [[1.0], [0.0]])


# FlexAttention ------------------------------------------------------------------------------
def _modifier(op_type, const=None):
    """A one-input graph: x -> op(x[, const])."""
    nodes, inits = [], []
    if const is not None:
        inits.append(helper.make_tensor("c", TensorProto.FLOAT, [], [const]))
        nodes.append(helper.make_node(op_type, ["x", "c"], ["y"]))
    else:
        nodes.append(helper.make_node(op_type, ["x"], ["y"]))
    return helper.make_graph(nodes, "mod", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


def test_flex_attention_default_gqa_and_modifiers():
    rng = np.random.default_rng(11)
    Q, K, V = rand(rng, 1, 4, 3, 4), rand(rng, 1, 2, 5, 4), rand(rng, 1, 2, 5, 3)
    Y, = run("FlexAttention", Q, K, V, domain="ai.onnx.preview")
    eY, _ = direct_attention(Q, K, V)
    np.testing.assert_allclose(Y, eY, rtol=1e-5, atol=1e-6)
    # score_mod Neg: softmax of the negated scores.
    Yn, = run("FlexAttention", Q, K, V, domain="ai.onnx.preview", score_mod=_modifier("Neg"))
    eYn, _ = direct_attention(-Q, K, V)
    np.testing.assert_allclose(Yn, eYn, rtol=1e-5, atol=1e-6)
    # prob_mod Mul 2: twice the output.
    Y2, = run("FlexAttention", Q, K, V, domain="ai.onnx.preview", prob_mod=_modifier("Mul", 2.0))
    np.testing.assert_allclose(Y2, 2 * eY, rtol=1e-5, atol=1e-6)
    assert Y2.dtype == np.float32
