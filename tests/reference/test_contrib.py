"""com.microsoft contrib ops: one-node models run by the reference and by onnxruntime."""

import numpy as np
import pytest

from reference import ReferenceEvaluator
from reference.ops.ml import _erf
from tests.reference.oneop import one_node_model

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(7)


def model(op_type, inputs, n_out=1, domain="com.microsoft", **attrs):
    return one_node_model(op_type, inputs, n_out=n_out, opset=21, domain=domain, ir_version=10,
                          **attrs)


def both(op_type, inputs, n_out=1, domain="com.microsoft", **attrs):
    m, feeds = model(op_type, inputs, n_out, domain, **attrs)
    ours = ReferenceEvaluator(m, check=False).run(None, feeds)
    try:
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - the op has no CPU kernel in this build
        pytest.skip(f"onnxruntime cannot run {op_type}: {str(e)[:100]}")
    theirs = sess.run(None, feeds)
    return ours, theirs


def check(op_type, inputs, n_out=1, rtol=1e-4, atol=1e-5, domain="com.microsoft", **attrs):
    ours, theirs = both(op_type, inputs, n_out, domain, **attrs)
    for o, t in zip(ours, theirs):
        assert o.dtype == t.dtype
        assert o.shape == t.shape, (o.shape, t.shape)
        if o.dtype.kind in "iu":
            assert np.abs(o.astype(np.int64) - t.astype(np.int64)).max(initial=0) <= 1
        else:
            np.testing.assert_allclose(o, t, rtol=rtol, atol=atol)
    return ours


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_erf_matches_known_values():
    # erf(0.5), erf(1), erf(2), erf(3.5) from tables
    got = _erf(np.array([0.5, 1.0, 2.0, 3.5, -1.0]))
    want = [
        0.5204998778130465,
        0.8427007929497149,
        0.9953222650189527,
        0.9999992569016276,
        -0.8427007929497149,
    ]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("op_type", ["Gelu", "QuickGelu", "FastGelu"])
def test_gelu_family(op_type):
    check(op_type, [f32(2, 3, 8) * 3])


def test_gelu_hand_values():
    (y,), _ = both("Gelu", [np.array([0.0, 1.0, -1.0], np.float32)])
    np.testing.assert_allclose(y, [0.0, 0.8413447, -0.1586553], rtol=1e-6)


def test_quick_gelu_alpha():
    check("QuickGelu", [f32(4, 5)], alpha=1.5)


def test_bias_gelu_and_fast_gelu_bias():
    check("BiasGelu", [f32(2, 3, 8), f32(8)])
    check("FastGelu", [f32(2, 3, 8), f32(8)])


def ours_only(op_type, inputs, n_out=1, **attrs):
    m, feeds = model(op_type, inputs, n_out, **attrs)
    return ReferenceEvaluator(m, check=False).run(None, feeds)


def test_bias_add():
    # onnxruntime has no CPU kernel for BiasAdd: check the definition X + bias + skip
    x, bias, skip = f32(2, 3, 4), f32(4), f32(2, 3, 4)
    (y,) = ours_only("BiasAdd", [x, bias, skip])
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, x + bias + skip, rtol=1e-6)


def _softmax_rows(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("inner", [0, 1])
def test_bias_softmax(inner):
    # no CPU kernel in onnxruntime: softmax(data + bias) over the suffix from axis
    data = f32(2, 3, 4, 5)
    for axis in (3, 2):
        if inner:  # bias broadcast over the dims between batch and axis
            bias = f32(2, 1, 1, 5) if axis == 3 else f32(2, 1, 4, 5)
        else:  # bias broadcast over the leading dims
            bias = f32(1, 3, 4, 5) if axis == 3 else f32(1, 1, 4, 5)
        (y,) = ours_only("BiasSoftmax", [data, bias], axis=axis, is_inner_broadcast=inner)
        z = (data + bias).reshape(2, 3, 4, 5) if axis == 3 else (data + bias).reshape(2, 3, 20)
        np.testing.assert_allclose(y, _softmax_rows(z).reshape(data.shape), rtol=1e-5)


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"transA": 1},
        {"transB": 1, "alpha": 0.5},
        {"transBatchA": 1},
        {"transBatchB": 1, "transB": 1},
    ],
)
def test_fused_matmul(attrs):
    a = f32(2, 3, 4, 5)
    b = f32(2, 3, 5, 6)
    if attrs.get("transA"):
        a = f32(2, 3, 5, 4)
    if attrs.get("transBatchA"):
        a = f32(4, 2, 3, 5)
    if attrs.get("transBatchB"):
        b = f32(6, 2, 3, 5)
    elif attrs.get("transB"):
        b = f32(2, 3, 6, 5)
    check("FusedMatMul", [a, b], **attrs)


def test_skip_layer_normalization_all_outputs():
    x, skip = f32(2, 3, 8), f32(2, 3, 8)
    gamma, beta, bias = f32(8), f32(8), f32(8)
    ours, theirs = both(
        "SkipLayerNormalization", [x, skip, gamma, beta, bias], n_out=4, epsilon=1e-5
    )
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours[3], theirs[3], rtol=1e-6)
    s = x + skip + bias
    mu = s.mean(-1, keepdims=True)
    want = (s - mu) / np.sqrt(s.var(-1, keepdims=True) + 1e-5) * gamma + beta
    np.testing.assert_allclose(ours[0], want, rtol=1e-4, atol=1e-5)


def test_skip_simplified_layer_normalization():
    ours = check(
        "SkipSimplifiedLayerNormalization",
        [f32(2, 3, 8), f32(2, 3, 8), f32(8), f32(8)],
        epsilon=1e-6,
    )
    assert ours[0].shape == (2, 3, 8)


def test_simplified_layer_normalization():
    x, scale = f32(2, 3, 8), f32(8)
    ours = check("SimplifiedLayerNormalization", [x, scale], domain="", axis=-1, epsilon=1e-5)
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * scale
    np.testing.assert_allclose(ours[0], want, rtol=1e-5)


def test_embed_layer_normalization():
    ids = RNG.integers(0, 10, (2, 4)).astype(np.int32)
    seg = RNG.integers(0, 2, (2, 4)).astype(np.int32)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.int32)
    inputs = [ids, seg, f32(10, 8), f32(6, 8), f32(2, 8), f32(8), f32(8), mask]
    ours, theirs = both("EmbedLayerNormalization", inputs, n_out=3, epsilon=1e-5)
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o, t, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask_kind", [None, "1d", "2d", "3d"])
def test_attention(mask_kind):
    b, s, hidden, heads = 2, 3, 8, 2
    x, w, bias = f32(b, s, hidden), f32(hidden, 3 * hidden), f32(3 * hidden)
    mask = {
        None: None,
        "1d": np.array([3, 2], np.int32),
        "2d": np.array([[1, 1, 0], [1, 0, 1]], np.int32),
        "3d": np.ones((b, s, s), np.int32) * np.tri(s, dtype=np.int32),
    }[mask_kind]
    check("Attention", [x, w, bias, mask], n_out=1, num_heads=heads)


def test_attention_unidirectional_with_past():
    b, s, hidden, heads, past = 1, 2, 8, 2, 3
    x, w, bias = f32(b, s, hidden), f32(hidden, 3 * hidden), f32(3 * hidden)
    past_kv = f32(2, b, heads, past, hidden // heads)
    check("Attention", [x, w, bias, None, past_kv], n_out=2, num_heads=heads, unidirectional=1)


def test_multi_head_attention():
    b, s, l, hidden, heads = 2, 3, 4, 8, 2
    q, k, v = f32(b, s, hidden), f32(b, l, hidden), f32(b, l, hidden)
    check("MultiHeadAttention", [q, k, v, f32(3 * hidden)], num_heads=heads)
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], np.int32)
    check("MultiHeadAttention", [q, k, v, None, mask], num_heads=heads)


def test_multi_head_attention_past_and_causal():
    b, s, hidden, heads, past = 1, 2, 8, 2, 3
    q, k, v = f32(b, s, hidden), f32(b, s, hidden), f32(b, s, hidden)
    pk, pv = f32(b, heads, past, 4), f32(b, heads, past, 4)
    check(
        "MultiHeadAttention",
        [q, k, v, None, None, None, pk, pv],
        n_out=3,
        num_heads=heads,
        unidirectional=1,
    )


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding(interleaved):
    b, s, heads, head = 2, 3, 2, 8
    x = f32(b, s, heads * head)
    pos = np.array([[0, 1, 2], [2, 3, 4]], np.int64)
    theta = np.arange(8)[:, None] * (1e-4 ** (np.arange(head // 2) / (head // 2)))[None, :]
    cos, sin = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
    check("RotaryEmbedding", [x, pos, cos, sin], interleaved=interleaved)


def test_rotary_embedding_hand_value():
    # one head of size 2: a plain rotation of (x0, x1) by the angle of the position
    x = np.array([[[1.0, 0.0]]], np.float32)
    angle = np.array([[0.0], [np.pi / 2]], np.float32)
    ours, _ = both("RotaryEmbedding", [x, np.array([[1]], np.int64), np.cos(angle), np.sin(angle)])
    np.testing.assert_allclose(ours[0], [[[0.0, 1.0]]], atol=1e-6)


def test_group_query_attention_prompt():
    b, s, n, nkv, head = 2, 4, 4, 2, 8
    q, k, v = f32(b, s, n * head), f32(b, s, nkv * head), f32(b, s, nkv * head)
    seqlens = np.array([s - 1, s - 2], np.int32)
    total = np.array(s, np.int32)
    ours, theirs = both(
        "GroupQueryAttention",
        [q, k, v, None, None, seqlens, total],
        n_out=3,
        num_heads=n,
        kv_num_heads=nkv,
    )
    np.testing.assert_allclose(ours[0][0], theirs[0][0], rtol=1e-4, atol=1e-5)
    # batch 1 is right-padded: only its valid query rows are defined
    np.testing.assert_allclose(ours[0][1, :3], theirs[0][1, :3], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-6)


def test_group_query_attention_decode_with_rotary():
    b, n, nkv, head, past = 1, 2, 1, 16, 5
    q, k, v = f32(b, 1, n * head), f32(b, 1, nkv * head), f32(b, 1, nkv * head)
    pk, pv = f32(b, nkv, past, head), f32(b, nkv, past, head)
    theta = np.arange(16)[:, None] * (1e-2 ** (np.arange(head // 2) / (head // 2)))[None, :]
    cos, sin = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
    seqlens = np.array([past], np.int32)  # total length - 1
    total = np.array(past + 1, np.int32)
    check(
        "GroupQueryAttention",
        [q, k, v, pk, pv, seqlens, total, cos, sin],
        n_out=3,
        num_heads=n,
        kv_num_heads=nkv,
        do_rotary=1,
    )


def test_quantize_dequantize_linear():
    x = f32(2, 3) * 4
    scale, zp = np.array(0.05, np.float32), np.array(128, np.uint8)
    q = check("QuantizeLinear", [x, scale, zp])[0]
    check("DequantizeLinear", [q, scale, zp])
    # per-axis
    scales, zps = np.array([0.1, 0.2, 0.3], np.float32), np.array([-1, 0, 1], np.int8)
    check("QuantizeLinear", [x, scales, zps], axis=1)
    # round half to even: 0.25 / 0.5 = 0.5 -> 0, 0.75 / 0.5 = 1.5 -> 2
    got = check(
        "QuantizeLinear",
        [np.array([0.25, 0.75], np.float32), np.array(0.5, np.float32), np.array(0, np.uint8)],
    )[0]
    assert got.tolist() == [0, 2]


def test_qlinear_binary_and_sigmoid():
    a = RNG.integers(0, 255, (2, 3, 4)).astype(np.uint8)
    bb = RNG.integers(0, 255, (4,)).astype(np.uint8)
    sa, za = np.array(0.02, np.float32), np.array(120, np.uint8)
    sb, zb = np.array(0.03, np.float32), np.array(130, np.uint8)
    sc, zc = np.array(0.05, np.float32), np.array(125, np.uint8)
    check("QLinearAdd", [a, sa, za, bb, sb, zb, sc, zc])
    check("QLinearMul", [a, sa, za, bb, sb, zb, sc, zc])
    check("QLinearSigmoid", [a, sa, za, np.array(1 / 256, np.float32), np.array(0, np.uint8)])


@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool(channels_last):
    x = RNG.integers(-128, 127, (2, 3, 4, 5)).astype(np.int8)
    check(
        "QLinearGlobalAveragePool",
        [
            x,
            np.array(0.1, np.float32),
            np.array(3, np.int8),
            np.array(0.05, np.float32),
            np.array(-2, np.int8),
        ],
        channels_last=channels_last,
    )


def test_matmul_integer_to_float():
    a = RNG.integers(0, 255, (3, 4)).astype(np.uint8)
    # |b| < 64: onnxruntime's u8s8 kernels may saturate 16-bit pair sums beyond that
    b = RNG.integers(-64, 64, (4, 5)).astype(np.int8)
    check(
        "MatMulIntegerToFloat",
        [a, b, np.array(0.1, np.float32), f32(5) ** 2, np.array(7, np.uint8), None, f32(5)],
    )


def test_dynamic_quantize_matmul():
    a, b = f32(3, 4), RNG.integers(-64, 64, (4, 5)).astype(np.int8)
    check(
        "DynamicQuantizeMatMul",
        [a, b, np.array(0.02, np.float32), None, f32(5)],
        rtol=1e-3,
        atol=1e-3,
    )


@pytest.mark.parametrize("zp_kind", [None, "packed"])
def test_matmul_nbits(zp_kind):
    k, n, block = 32, 6, 16
    a = f32(3, k)
    b = RNG.integers(0, 256, (n, k // block, block // 2)).astype(np.uint8)
    scales = (f32(n * (k // block)) ** 2 + 0.1).astype(np.float32)
    zps = None if zp_kind is None else RNG.integers(0, 256, (n,)).astype(np.uint8)
    check(
        "MatMulNBits", [a, b, scales, zps], K=k, N=n, bits=4, block_size=block, rtol=1e-4, atol=1e-4
    )


def test_fused_gemm_activations():
    a, b, c = f32(3, 4), f32(4, 5), f32(5)
    check("FusedGemm", [a, b, c], activation="Relu")
    check(
        "FusedGemm",
        [a, b.T.copy(), c],
        transB=1,
        activation="LeakyRelu",
        activation_alpha=0.2,
        alpha=0.5,
        beta=2.0,
    )


def test_gemm_fast_gelu():
    # no CPU kernel in onnxruntime: FastGelu(X @ W + bias), FastGelu being onnxruntime's own op
    x, w, bias = f32(3, 4), f32(4, 5), f32(5)
    (y,) = ours_only("GemmFastGelu", [x, w, bias])
    _, (want,) = both("FastGelu", [x @ w + bias])
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_fused_conv():
    pytest.importorskip("reference.ops")
    from reference.registry import lookup

    if lookup("", "Conv", 11) is None:
        pytest.skip("Conv (ai.onnx) is not implemented yet")
    check(
        "FusedConv",
        [f32(1, 2, 5, 5), f32(3, 2, 3, 3), f32(3)],
        activation="Relu",
        pads=[1, 1, 1, 1],
    )


def _gqa_inputs(b=2, s=5, n=4, nkv=2, h=16):
    q, k, v = f32(b, s, n * h), f32(b, s, nkv * h), f32(b, s, nkv * h)
    return [q, k, v, None, None, np.full(b, s - 1, np.int32), np.array(s, np.int32)]


@pytest.mark.parametrize(
    "attrs", [{"local_window_size": 2}, {"softcap": 0.5}, {"smooth_softmax": 1}, {"scale": 0.3}]
)
def test_group_query_attention_options(attrs):
    check("GroupQueryAttention", _gqa_inputs(), n_out=3, num_heads=4, kv_num_heads=2, **attrs)


def test_group_query_attention_packed_and_shared_buffer():
    q, k, v, *rest = _gqa_inputs()
    check(
        "GroupQueryAttention",
        [np.concatenate([q, k, v], -1), None, None] + rest,
        n_out=3,
        num_heads=4,
        kv_num_heads=2,
    )
    # one new token after a past buffer of 8 valid positions: present grows to 9
    q1, k1, v1 = f32(2, 1, 64), f32(2, 1, 32), f32(2, 1, 32)
    pk, pv = f32(2, 2, 8, 16), f32(2, 2, 8, 16)
    out = check(
        "GroupQueryAttention",
        [q1, k1, v1, pk, pv, np.array([8, 8], np.int32), np.array(9, np.int32)],
        n_out=3,
        num_heads=4,
        kv_num_heads=2,
    )
    assert out[1].shape == (2, 2, 9, 16)


def test_attention_bias_2b_mask_and_qkv_sizes():
    b, s, hidden, heads = 2, 3, 8, 2
    x, w, bias = f32(b, s, hidden), f32(hidden, 3 * hidden), f32(3 * hidden)
    check("Attention", [x, w, bias, None, None, f32(b, heads, s, s)], num_heads=heads)
    check("Attention", [x, w, bias, np.array([3, 2, 0, 1], np.int32)], num_heads=heads)
    check(
        "Attention",
        [x, f32(hidden, 2 * hidden + 4), f32(2 * hidden + 4)],
        num_heads=heads,
        qkv_hidden_sizes=[hidden, hidden, 4],
        scale=0.2,
    )


def test_multi_head_attention_layouts():
    b, s, l, heads, h = 2, 3, 4, 2, 4
    q = f32(b, s, heads * h)
    check("MultiHeadAttention", [q, f32(b, heads, l, h), f32(b, heads, l, h)], num_heads=heads)
    check(
        "MultiHeadAttention",
        [q, f32(b, l, 8), f32(b, l, 8), None, np.array([2, 4], np.int32)],
        num_heads=heads,
    )
    check(
        "MultiHeadAttention",
        [q, f32(b, l, 8), f32(b, l, 8), None, None, f32(1, heads, s, l)],
        num_heads=heads,
    )
    # packed layouts (no CPU kernel in onnxruntime): same result as the unpacked inputs
    k, v = f32(b, s, heads * h), f32(b, s, heads * h)
    packed = np.stack([t.reshape(b, s, heads, h) for t in (q, k, v)], axis=3)
    (want,) = ours_only("MultiHeadAttention", [q, k, v], num_heads=heads)
    (got,) = ours_only("MultiHeadAttention", [packed], num_heads=heads)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    (got_kv,) = ours_only("MultiHeadAttention", [q, packed[:, :, :, 1:]], num_heads=heads)
    np.testing.assert_allclose(got_kv, want, rtol=1e-6)


def test_rotary_embedding_4d_and_partial():
    pos = np.array([[0, 1, 2], [1, 2, 3]], np.int64)
    check("RotaryEmbedding", [f32(2, 2, 3, 8), pos, f32(6, 4), f32(6, 4)])
    check(
        "RotaryEmbedding",
        [f32(2, 3, 16), pos, f32(6, 2), f32(6, 2)],
        num_heads=2,
        rotary_embedding_dim=4,
    )


def test_embed_layer_normalization_optional_inputs():
    ids = RNG.integers(0, 10, (2, 4)).astype(np.int32)
    check(
        "EmbedLayerNormalization",
        [
            ids,
            RNG.integers(0, 2, (2, 4)).astype(np.int32),
            f32(10, 8),
            f32(6, 8),
            f32(2, 8),
            f32(8),
            f32(8),
        ],
        n_out=3,
    )
    check(
        "EmbedLayerNormalization",
        [
            ids,
            None,
            f32(10, 8),
            f32(6, 8),
            None,
            f32(8),
            f32(8),
            None,
            np.array([[3, 2, 1, 0], [0, 1, 2, 3]], np.int32),
        ],
        n_out=3,
    )


def test_layer_norm_variants():
    check("SkipLayerNormalization", [f32(2, 3, 8), f32(2, 3, 8), f32(8)], n_out=4)
    check("SkipLayerNormalization", [f32(3, 8), f32(3, 8), f32(8), f32(8)])
    out = check(
        "SimplifiedLayerNormalization", [f32(2, 3, 8), f32(3, 8)], n_out=2, domain="", axis=1
    )
    assert out[1].shape == (2, 1, 1)


def test_matmul_nbits_variants():
    a = f32(3, 32)
    # float zero points live in the quantized domain: w = (q - zp) * scale
    check(
        "MatMulNBits",
        [a, RNG.integers(0, 256, (6, 2, 8)).astype(np.uint8), f32(12) ** 2, f32(12)],
        K=32,
        N=6,
        block_size=16,
        rtol=1e-4,
        atol=1e-4,
    )
    check(
        "MatMulNBits",
        [a, RNG.integers(0, 256, (6, 2, 16)).astype(np.uint8), f32(12) ** 2],
        K=32,
        N=6,
        bits=8,
        block_size=16,
        rtol=1e-4,
        atol=1e-4,
    )
    # K not a multiple of the block: the last block is padded
    check(
        "MatMulNBits",
        [
            f32(3, 20),
            RNG.integers(0, 256, (6, 2, 8)).astype(np.uint8),
            f32(12) ** 2,
            RNG.integers(0, 256, (6,)).astype(np.uint8),
            None,
            f32(6),
        ],
        K=20,
        N=6,
        block_size=16,
        rtol=1e-4,
        atol=1e-4,
    )


def test_quantization_variants():
    check(
        "DequantizeLinear",
        [
            RNG.integers(0, 255, (2, 3, 4)).astype(np.uint8),
            f32(3) ** 2,
            RNG.integers(0, 255, (3,)).astype(np.uint8),
        ],
        axis=1,
    )
    check(
        "QuantizeLinear",
        [f32(3, 4) * 5, np.abs(f32(3)) + 0.1, np.array([1, 2, 3], np.int8)],
        axis=0,
    )
    i8 = lambda: RNG.integers(-128, 127, (3, 4)).astype(np.int8)
    check(
        "QLinearMul",
        [
            i8(),
            np.array(0.05, np.float32),
            np.array(1, np.int8),
            i8(),
            np.array(0.04, np.float32),
            np.array(-1, np.int8),
            np.array(0.2, np.float32),
            np.array(3, np.int8),
        ],
    )


def test_fused_gemm_and_conv_activations():
    check("FusedGemm", [f32(3, 4).T.copy(), f32(4, 5), f32(3, 5)], transA=1, activation="Sigmoid")
    check(
        "FusedGemm",
        [f32(3, 4), f32(4, 5)],
        activation="HardSigmoid",
        activation_alpha=0.3,
        activation_beta=0.4,
    )
    from reference.registry import lookup

    if lookup("", "Conv", 11) is None:
        pytest.skip("Conv (ai.onnx) is not implemented yet")
    check(
        "FusedConv",
        [f32(1, 2, 5, 5), f32(3, 2, 3, 3), f32(3), f32(1, 3, 3, 3)],
        activation="LeakyRelu",
        activation_params=[0.2],
    )
    check(
        "FusedConv",
        [f32(1, 2, 5, 5), f32(3, 2, 3, 3)],
        activation="Clip",
        activation_params=[-0.5, 0.5],
        strides=[2, 2],
    )


def test_group_query_attention_prompt_into_buffer_and_continued_prompt():
    n, nkv, h = 4, 2, 16
    q, k, v = f32(2, 4, n * h), f32(2, 4, nkv * h), f32(2, 4, nkv * h)
    buf = np.zeros((2, nkv, 8, h), np.float32)
    seqlens = np.array([3, 2], np.int32)  # batch 1 is right-padded
    ours, theirs = both(
        "GroupQueryAttention",
        [q, k, v, buf, buf, seqlens, np.array(4, np.int32)],
        n_out=3,
        num_heads=n,
        kv_num_heads=nkv,
    )
    np.testing.assert_allclose(ours[0][0], theirs[0][0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours[0][1, :3], theirs[0][1, :3], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(ours[1], theirs[1])
    # two more tokens after three cached ones
    q2, k2, v2 = f32(1, 2, n * h), f32(1, 2, nkv * h), f32(1, 2, nkv * h)
    past = f32(1, nkv, 3, h)
    out = check(
        "GroupQueryAttention",
        [q2, k2, v2, past, past, np.array([4], np.int32), np.array(5, np.int32)],
        n_out=3,
        num_heads=n,
        kv_num_heads=nkv,
    )
    assert out[1].shape == (1, nkv, 5, h)
