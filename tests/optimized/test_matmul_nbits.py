"""The MatMulNBits C kernel (csrc/matmul_nbits.c) against the reference op, by the bound policy
of reference/agreement.py (reference/bounds.py's MatMulNBits rule: a dot product of length K,
gamma(K + 2) * sum |a_k w_k|); a hand-checked product; onnxruntime's own quantizer output, run
by our session and by onnxruntime. The truth is float64 over the float32 weights that the
reference dequantizes.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import optimized
from optimized import cpu, kernels
from reference import ReferenceEvaluator, agreement
from reference.ops.contrib import dequantized_nbits

from .conftest import ISA_LEVELS

BLOCK_SIZES = [16, 32, 64, 128, 256]
hsettings = settings(max_examples=60, deadline=None)


def quantized(rng, n, k, bits, block_size, zero_points):
    """Random packed codes, scales and zero points in MatMulNBits's layout; zero_points is
    None, "packed" (uint8, each row padded to whole bytes) or "float"."""
    blocks = (k + block_size - 1) // block_size
    b = rng.integers(0, 256, (n, blocks, block_size * bits // 8), dtype=np.uint8)
    scales = (rng.random(n * blocks, dtype=np.float32) + 0.05) * rng.choice([-1, 1], n * blocks)
    scales = scales.astype(np.float32)
    zp = None
    if zero_points == "packed":
        zp = rng.integers(0, 256, n * ((blocks * bits + 7) // 8), dtype=np.uint8)
    elif zero_points == "float":
        zp = (rng.random(n * blocks) * (2**bits - 1)).astype(np.float32)
    return b, scales, zp


def dequantized(b, scales, zp, k, n, bits, block_size):
    """The reference's float32 weights (N x K), in float64."""
    return dequantized_nbits(b, scales, zp, K=k, N=n, bits=bits,
                             block_size=block_size).astype(np.float64)


def assert_agrees(got, a, b, scales, zp, bias, *, k, n, bits, block_size):
    """The bound policy's verdict on `got` against the float64 truth a @ w^T + bias."""
    w = dequantized(b, scales, zp, k, n, bits, block_size)
    truth = a.astype(np.float64) @ w.T + (0.0 if bias is None else bias.astype(np.float64))
    inputs = [a, b, scales, zp, None, bias]
    names = [name if v is not None else "" for name, v in
             zip(["a", "b", "scales", "zero_points", "", "bias"], inputs)]
    node = helper.make_node("MatMulNBits", names, ["y"], domain="com.microsoft", K=k, N=n,
                            bits=bits, block_size=block_size)
    verdict = agreement.judge(node, 1, inputs, [got], [truth])
    assert verdict.ok, verdict.message()


@hsettings
@given(m=st.one_of(st.integers(1, 4), st.integers(5, 40)), n=st.integers(1, 70),
       k=st.integers(1, 300), bits=st.sampled_from([2, 4, 8]),
       block_size=st.sampled_from(BLOCK_SIZES),
       zero_points=st.sampled_from([None, "packed", "float"]), with_bias=st.booleans(),
       simd=st.booleans(), threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**16))
def test_against_reference(m, n, k, bits, block_size, zero_points, with_bias, simd, threads,
                           seed):
    rng = np.random.default_rng(seed)
    b, scales, zp = quantized(rng, n, k, bits, block_size, zero_points)
    a = rng.standard_normal((m, k), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32) if with_bias else None
    kernels.set_num_threads(threads)
    try:
        got = kernels.matmul_nbits(a, b, scales, zp, bias, k=k, n=n, bits=bits,
                                   block_size=block_size, simd=simd)
    finally:
        kernels.set_num_threads(kernels.available_cpus())
    assert got.shape == (m, n) and got.dtype == np.float32
    assert_agrees(got, a, b, scales, zp, bias, k=k, n=n, bits=bits, block_size=block_size)


@pytest.mark.parametrize("m", [1, 2, 5, 8, 48], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("bits,block_size", [(4, 32), (4, 128), (8, 64), (4, 16)])
def test_many_panels_and_threads(m, bits, block_size):
    """Large enough for several dequantized panels split across two threads (prefill), for the
    decode loop's split over N and its passes over 4 rows of A at a time (m = 5, 8); K is not
    a multiple of the block size."""
    rng = np.random.default_rng(m * block_size)
    n, k = 300, 3 * block_size + 7
    b, scales, zp = quantized(rng, n, k, bits, block_size, "packed")
    a = rng.standard_normal((m, k), dtype=np.float32)
    kernels.set_num_threads(2)
    try:
        got = kernels.matmul_nbits(a, b, scales, zp, k=k, n=n, bits=bits, block_size=block_size)
    finally:
        kernels.set_num_threads(kernels.available_cpus())
    assert_agrees(got, a, b, scales, zp, None, k=k, n=n, bits=bits, block_size=block_size)


@pytest.mark.parametrize("simd", [True, False])
def test_hand_checked(simd):
    """Codes 1, 2, 3 (low nibble first), zero point 8 by default, scale 0.5: weights -3.5, -3,
    -2.5; a = (1, 2, 4) gives -3.5 - 6 - 10 = -19.5, plus bias 0.25."""
    b = np.zeros((1, 1, 8), np.uint8)
    b[0, 0, :2] = [0x21, 0x03]
    y = kernels.matmul_nbits(np.array([[1, 2, 4]], np.float32), b, np.array([0.5], np.float32),
                             bias=np.array([0.25], np.float32), k=3, n=1, bits=4, block_size=16,
                             simd=simd)
    assert y.tolist() == [[-19.25]]


def test_packed_zero_points_take_the_high_nibble_for_odd_blocks():
    """Row 0's zero points are 3 (block 0, low nibble) and 5 (block 1, high nibble); codes are
    all 4 and a all ones with scales 1: y = 16 * (4 - 3) + 16 * (4 - 5) + extra block 2."""
    k, bs = 40, 16  # three blocks, the last one partly padding
    b = np.full((1, 3, 8), 0x44, np.uint8)
    zp = np.array([0x53, 0x07], np.uint8)  # block 2's zero point 7, in the padded second byte
    y = kernels.matmul_nbits(np.ones((1, k), np.float32), b, np.ones(3, np.float32), zp,
                             k=k, n=1, bits=4, block_size=bs)
    assert y.tolist() == [[16 * 1 + 16 * -1 + 8 * -3]]


def test_rank3_input_keeps_its_leading_axes():
    rng = np.random.default_rng(1)
    b, scales, zp = quantized(rng, 24, 64, 4, 32, None)
    a = rng.standard_normal((2, 3, 64), dtype=np.float32)
    y = kernels.matmul_nbits(a, b, scales, k=64, n=24, block_size=32)
    assert y.shape == (2, 3, 24)
    assert_agrees(y, a, b, scales, zp, None, k=64, n=24, bits=4, block_size=32)


@pytest.mark.parametrize("change,error", [
    ({"b": np.zeros(10, np.uint8)}, "B must hold 256 bytes"),
    ({"b": np.zeros(256, np.int8)}, "B must be a uint8"),
    ({"scales": np.ones(3, np.float32)}, "scales must hold"),
    ({"zero_points": np.zeros(3, np.uint8)}, "zero_points must hold 8 bytes"),
    ({"zero_points": np.zeros(3, np.float32)}, r"float zero_points must hold N \* blocks = 16"),
    ({"bias": np.zeros(3, np.float32)}, "bias must have shape"),
    ({"block_size": 48}, "power of 2"),
    ({"bits": 3}, "bits must be 2, 4 or 8"),
    ({"a": np.zeros((1, 63), np.float32)}, "last axis must be K=64"),
])
def test_bad_arguments_are_named(change, error):
    args = {"a": np.zeros((1, 64), np.float32), "b": np.zeros((8, 2, 16), np.uint8),
            "scales": np.ones(16, np.float32), "zero_points": None, "bias": None, "k": 64,
            "n": 8, "bits": 4, "block_size": 32}
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=error):
        kernels.matmul_nbits(args.pop("a"), args.pop("b"), args.pop("scales"),
                             args.pop("zero_points"), args.pop("bias"), **args)


def test_provider_leaves_reordered_groups_to_the_reference():
    """A g_idx that is not the plain block order falls back; the plain one runs the kernel."""
    rng = np.random.default_rng(2)
    b, scales, _ = quantized(rng, 8, 64, 4, 32, None)
    a = rng.standard_normal((1, 64), dtype=np.float32)
    attrs = {"K": 64, "N": 8, "bits": 4, "block_size": 32}
    plain = np.arange(64, dtype=np.int32) // 32
    assert cpu.matmul_nbits(a, b, scales, None, plain, **attrs) is not NotImplemented
    assert cpu.matmul_nbits(a, b, scales, None, plain[::-1].copy(), **attrs) is NotImplemented
    assert cpu.matmul_nbits(a.astype(np.float16), b, scales, **attrs) is NotImplemented


# onnxruntime's quantizer -------------------------------------------------------------------------
def matmul_model(k, n, rng):
    w = rng.standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
        [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("m", [1, 7])
@pytest.mark.parametrize("bits,block_size,symmetric",
                         [(4, 32, True), (4, 32, False), (4, 128, False), (8, 64, False),
                          (4, 16, True)])
def test_onnxruntime_quantizer_output(m, bits, block_size, symmetric):
    """A MatMul quantized by onnxruntime's MatMulNBitsQuantizer runs through our session at
    level 99 like onnxruntime runs it (the error bound over the reference's weights), and the
    model really holds a MatMulNBits node in the form asked for."""
    ort = pytest.importorskip("onnxruntime")
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    rng = np.random.default_rng(bits * block_size + m)
    k, n = 200, 48  # K not a multiple of 32, 64 or 128
    quantizer = MatMulNBitsQuantizer(matmul_model(k, n, rng), bits=bits, block_size=block_size,
                                     is_symmetric=symmetric)
    quantizer.process()
    model = quantizer.model.model
    [node] = model.graph.node
    assert node.op_type == "MatMulNBits" and len(node.input) == (3 if symmetric else 4)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    b, scales = inits[node.input[1]], inits[node.input[2]]
    zp = inits[node.input[3]] if len(node.input) > 3 else None

    a = rng.standard_normal((m, k), dtype=np.float32)
    options = optimized.SessionOptions()
    options.graph_optimization_level = optimized.GraphOptimizationLevel.ORT_ENABLE_ALL
    ours = optimized.InferenceSession(model.SerializeToString(), options).run(None, {"a": a})[0]
    theirs = ort.InferenceSession(model.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    attrs = {"k": k, "n": n, "bits": bits, "block_size": block_size}
    assert_agrees(ours, a, b, scales, zp, None, **attrs)
    # onnxruntime against the same truth, with the same bound: both read the weights alike
    assert_agrees(theirs, a, b, scales, zp, None, **attrs)
    reference = ReferenceEvaluator(model).run(None, {"a": a})[0]
    np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-4)


def test_session_runs_the_fast_kernel(monkeypatch):
    """The CPU provider picks the C kernel for MatMulNBits (checked by counting its calls)."""
    rng = np.random.default_rng(3)
    model = matmul_model(64, 16, rng)
    b, scales, _ = quantized(rng, 16, 64, 4, 32, None)
    node = helper.make_node("MatMulNBits", ["a", "b", "s"], ["y"], domain="com.microsoft",
                            K=64, N=16, bits=4, block_size=32)
    graph = helper.make_graph([node], "g", list(model.graph.input), list(model.graph.output),
                              [numpy_helper.from_array(b, "b"), numpy_helper.from_array(scales, "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    calls = []
    real = kernels.matmul_nbits
    monkeypatch.setattr(kernels, "matmul_nbits", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    a = rng.standard_normal((2, 64), dtype=np.float32)
    y = optimized.InferenceSession(model.SerializeToString()).run(None, {"a": a})[0]
    assert calls, "MatMulNBits ran as the reference op"
    assert_agrees(y, a, b, scales, None, None, k=64, n=16, bits=4, block_size=32)
    onnx.checker.check_model(model)


# repacking a DequantizeLinear weight (optimized/passes/qdq_matmul_nbits.py) ----------------------
def raw_codes(codes, bits):
    """Codes as a 4/8-bit tensor's raw data holds them: 4-bit two a byte, low nibble first."""
    flat = codes.reshape(-1).astype(np.uint8) & ((1 << bits) - 1)
    if bits == 8:
        return flat.tobytes()
    flat = np.append(flat, np.zeros(flat.size % 2, np.uint8))
    return (flat[0::2] | (flat[1::2] << 4)).tobytes()


@hsettings
@given(k=st.integers(1, 200), n=st.integers(1, 33), bits=st.sampled_from([4, 8]),
       block_size=st.sampled_from(BLOCK_SIZES), transposed=st.booleans(), signed=st.booleans(),
       seed=st.integers(0, 2**16))
def test_pack_gives_the_reference_weights(k, n, bits, block_size, transposed, signed, seed):
    """Repacked codes [K, N] (or [N, K]) dequantize, by the reference's MatMulNBits reading,
    to the codes moved by 2^(bits-1) when signed, each row in order along K."""
    rng = np.random.default_rng(seed)
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    codes_kn = rng.integers(lo, hi + 1, (k, n))
    src = codes_kn.T if transposed else codes_kn
    b = kernels.matmul_nbits_pack(raw_codes(np.ascontiguousarray(src), bits), k=k, n=n,
                                  bits=bits, block_size=block_size, transposed=transposed,
                                  signed=signed)
    blocks = (k + block_size - 1) // block_size
    assert b.shape == (n, blocks, block_size * bits // 8) and b.dtype == np.uint8
    ones = np.ones(n * blocks, np.float32)
    zero = np.zeros(n * ((blocks * bits + 7) // 8), np.uint8)
    w = dequantized_nbits(b, ones, zero, K=k, N=n, bits=bits, block_size=block_size)
    offset = (1 << (bits - 1)) if signed else 0
    np.testing.assert_array_equal(w, (codes_kn.T + offset).astype(np.float32))
    codes_bytes = (k * bits + 7) // 8  # past them, each row's last block is zeros
    assert not b.reshape(n, -1)[:, codes_bytes:].any()
    if bits == 4 and k % 2:  # and so is the high nibble of the last code's byte
        assert not (b.reshape(n, -1)[:, codes_bytes - 1] >> 4).any()


@pytest.mark.parametrize("k,n", [(255, 130), (256, 131), (130, 200), (64, 64), (300, 514),
                                 (129, 263)])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("transposed", [False, True])
def test_pack_across_tiles(k, n, bits, transposed):
    """Shapes past the C code's tiles (128 codes along K, 256 weight rows): odd and even K and N,
    each of its paths (column pairs, whole rows, code by code)."""
    test_pack_gives_the_reference_weights.hypothesis.inner_test(
        k=k, n=n, bits=bits, block_size=32, transposed=transposed, signed=True, seed=k * n)


@pytest.mark.parametrize("change,error", [
    ({"codes": b"\0" * 5}, "codes must hold 6 bytes"),
    ({"bits": 2}, "bits must be 4 or 8"),
    ({"block_size": 24}, "power of 2"),
])
def test_pack_bad_arguments_are_named(change, error):
    args = {"codes": b"\0" * 6, "k": 3, "n": 4, "bits": 4, "block_size": 16}
    args.update(change)
    with pytest.raises(ValueError, match=error):
        kernels.matmul_nbits_pack(args.pop("codes"), **args)


# the grid issue 14 names, judged as check mode judges a node ---------------------------------------
@pytest.mark.parametrize("zero_points", [None, "packed", "float"],
                         ids=["symmetric", "packed-zp", "float-zp"])
@pytest.mark.parametrize("block_size", [16, 32, 64, 128])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m", [1, 3, 9])
def test_grid_against_the_reference_op(m, bits, block_size, zero_points):
    """K = 200 (no multiple of any block size), N = 37 (odd), M of 1, 3 (decode paths) and 9
    (prefill panels): the kernel's result judged by agreement.check_node against the registered
    reference MatMulNBits op itself (run on the same inputs, then in float64 for the truth), as
    SessionOptions.check_nodes does."""
    from reference.registry import lookup

    rng = np.random.default_rng(m * 1000 + bits * 100 + block_size)
    k, n = 200, 37
    b, scales, zp = quantized(rng, n, k, bits, block_size, zero_points)
    a = rng.standard_normal((m, k), dtype=np.float32)
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block_size}
    got = kernels.matmul_nbits(a, b, scales, zp, k=k, n=n, bits=bits, block_size=block_size)
    names = ["a", "b", "scales"] + (["zero_points"] if zp is not None else [])
    node = helper.make_node("MatMulNBits", names, ["y"], domain="com.microsoft", **attrs)
    op = lookup("com.microsoft", "MatMulNBits", 1).fn
    inputs = [a, b, scales] + ([zp] if zp is not None else [])
    judgement = agreement.check_node(node, 1, inputs, [got],
                                     lambda *values: [op(*values, **attrs)])
    assert judgement.ok, judgement.message()


@pytest.mark.parametrize("bits,block_size", [(4, 32), (8, 64), (4, 128)])
def test_prefill_is_the_same_at_any_thread_count(bits, block_size):
    """The prefill paths (16 weight rows packed for a register tile, on AVX2) sum each output in
    one order whatever the thread count: bit for bit, over panels and row tiles with tails
    (m = 37 rows of a, n = 83 weight rows, k past the last whole block)."""
    rng = np.random.default_rng(bits * block_size)
    m, n, k = 37, 83, 2 * block_size + 9
    b, scales, zp = quantized(rng, n, k, bits, block_size, "packed")
    a = rng.standard_normal((m, k), dtype=np.float32)
    results = matmul_nbits_at_one_and_two_threads(a, b, scales, zp, k=k, n=n, bits=bits,
                                                  block_size=block_size)
    assert results[0].tobytes() == results[1].tobytes()
    assert_agrees(results[0], a, b, scales, zp, None, k=k, n=n, bits=bits, block_size=block_size)


def matmul_nbits_at_one_and_two_threads(a, b, scales, zp, **attributes) -> list:
    """kernels.matmul_nbits's results at 1 and at 2 threads."""
    results = []
    for threads in (1, 2):
        kernels.set_num_threads(threads)
        try:
            results.append(kernels.matmul_nbits(a, b, scales, zp, **attributes))
        finally:
            kernels.set_num_threads(kernels.available_cpus())
    return results


def cpu_has_avx2_fma() -> bool:
    """Whether csrc's AVX2 paths run here (Linux's CPU flags; False where they cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx2" in flags and "fma" in flags


@settings(max_examples=40, deadline=None)
@given(m=st.one_of(st.just(1), st.integers(2, 200)), n=st.integers(1, 600),
       k=st.integers(1, 700),
       bits_block=st.sampled_from([(4, 16), (4, 32), (4, 64), (4, 128), (8, 16), (8, 32),
                                   (8, 64), (8, 128), (2, 32), (2, 64)]),
       zero_points=st.sampled_from([None, "packed", "float"]), seed=st.integers(0, 2**16))
def test_prefill_against_reference_at_any_thread_count(m, n, k, bits_block, zero_points, seed):
    """Prompt-sized shapes, with bits and block sizes whose blocks are whole 8-byte groups of
    codes, which the AVX2 prefill takes (groups of up to 8 panels of 16 weight rows, fewer
    groups at 1 thread than at 2, and k in chunks of whole blocks): within the reference op's
    bound, and with AVX2 bit for bit the same at 1 and 2 threads (the BLAS fallback's panels
    follow the thread count)."""
    bits, block_size = bits_block
    rng = np.random.default_rng(seed)
    b, scales, zp = quantized(rng, n, k, bits, block_size, zero_points)
    a = rng.standard_normal((m, k), dtype=np.float32)
    results = matmul_nbits_at_one_and_two_threads(a, b, scales, zp, k=k, n=n, bits=bits,
                                                  block_size=block_size)
    if cpu_has_avx2_fma():
        assert results[0].tobytes() == results[1].tobytes()
    assert_agrees(results[0], a, b, scales, zp, None, k=k, n=n, bits=bits, block_size=block_size)


def test_prefill_hand_checked():
    """48 rows of a by 20 weight rows (a full panel of 16 and 4 over), 4 bits in blocks of 32,
    every code 9 with zero point 8 and scale 0.5: each weight is 0.5, so y[i][j] is half the sum
    of a's row i, the same in every column."""
    m, n, k, block = 48, 20, 40, 32
    blocks = 2
    b = np.full((n, blocks, block // 2), 0x99, np.uint8)
    scales = np.full(n * blocks, 0.5, np.float32)
    zp = np.full(n * ((blocks * 4 + 7) // 8), 0x88, np.uint8)
    a = (np.arange(m * k, dtype=np.float32).reshape(m, k) % 7) - 3
    got = kernels.matmul_nbits(a, b, scales, zp, k=k, n=n, bits=4, block_size=block)
    want = np.repeat((0.5 * a.sum(axis=1, dtype=np.float64))[:, None], n, axis=1)
    np.testing.assert_array_equal(got, want.astype(np.float32))


def nbits_model(m_shape, k, n, bits, block_size, zero_points, seed, bias=False):
    """One MatMulNBits node over constant weights (initializers), a fed."""
    rng = np.random.default_rng(seed)
    b, scales, zp = quantized(rng, n, k, bits, block_size, zero_points)
    inits = {"b": b, "scales": scales}
    names = ["a", "b", "scales"]
    if zp is not None:
        inits["zp"] = zp
        names.append("zp")
    if bias:
        inits["bias"] = rng.standard_normal(n, dtype=np.float32)
        names += [""] * (5 - len(names)) + ["bias"]
    node = helper.make_node("MatMulNBits", names, ["y"], domain="com.microsoft", K=k, N=n,
                            bits=bits, block_size=block_size)
    graph = helper.make_graph(
        [node], "nbits", [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(m_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(v, name) for name, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid("com.microsoft", 1)])


def compiled_and_python(model, feeds):
    """The step-table plan's outputs on its third run (recorded, compiled, run in C), its
    program, and the Python plan's outputs."""
    from optimized.plan import Plan

    in_c, in_python = Plan(model, cpu.KERNELS, c_steps=cpu.C_STEPS), Plan(model, cpu.KERNELS)
    for _ in range(3):
        got = in_c.run(dict(feeds))
    key = tuple((name, v.shape, v.dtype) for name, v in feeds.items())
    return got, in_c._programs.get(key), in_python.run(dict(feeds))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m_shape", [(1, 1, 80), (2, 13, 80)], ids=["decode", "prefill"])
@pytest.mark.parametrize("bits,block_size,zero_points", [
    (4, 32, "packed"), (4, 16, None), (8, 64, "float"), (2, 32, "packed")])
def test_plan_runs_matmul_nbits_in_the_step_table(m_shape, bits, block_size, zero_points,
                                                  threads):
    """A decode step's and a prompt's MatMulNBits run as one PLAN_MATMUL_NBITS entry, bit for
    bit the Python kernel's, within the reference op's bound (K = 80 is not a whole number of
    blocks; N = 37)."""
    model = nbits_model(m_shape, 80, 37, bits, block_size, zero_points, seed=bits * block_size)
    a = np.random.default_rng(1).standard_normal(m_shape, dtype=np.float32)
    kernels.set_num_threads(threads)
    try:
        got, compiled, want = compiled_and_python(model, {"a": a})
    finally:
        kernels.set_num_threads(kernels.available_cpus())
    assert [compiled.table.steps[i].kind for i in range(compiled.table.count)] == [
        kernels.lib.PLAN_MATMUL_NBITS]
    assert got[0].shape == m_shape[:-1] + (37,) and got[0].tobytes() == want[0].tobytes()
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert_agrees(got[0].reshape(-1, 37), a.reshape(-1, 80), inits["b"], inits["scales"],
                  inits.get("zp"), None, k=80, n=37, bits=bits, block_size=block_size)


def test_plan_leaves_matmul_nbits_with_a_bias_to_python():
    """The step has no bias operand: a node with one runs through the Python kernel."""
    from optimized.plan import PY

    model = nbits_model((1, 2, 64), 64, 20, 4, 32, "packed", seed=3, bias=True)
    a = np.random.default_rng(2).standard_normal((1, 2, 64), dtype=np.float32)
    got, compiled, want = compiled_and_python(model, {"a": a})
    assert [op[0] for op in compiled.ops] == [PY]
    assert got[0].tobytes() == want[0].tobytes()


@pytest.mark.parametrize("simd", [True, False])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m", [2, 12])
def test_infinite_scale_in_the_last_partial_block_gives_inf(m, bits, simd):
    """k = 40 in blocks of 32: the last block's codes past k are padding that a row of a never
    meets. With that block's scale inf, every weight in it is inf (codes 9, zero point 8), so
    y is inf as the reference's sum over k gives it, not NaN from inf padding times a's zeros."""
    n, k, block = 20, 40, 32
    b = np.full((n, 2, block * bits // 8), 0x99 if bits == 4 else 0x81, np.uint8)
    scales = np.tile(np.array([1.0, np.inf], np.float32), n)
    a = np.ones((m, k), np.float32)
    got = kernels.matmul_nbits(a, b, scales, None, k=k, n=n, bits=bits, block_size=block,
                               simd=simd)
    w = dequantized(b, scales, None, k, n, bits, block)
    np.testing.assert_array_equal(got, (a.astype(np.float64) @ w.T).astype(np.float32))
    assert np.isposinf(got).all()


# every vector-instruction level the CPU runs (kernels.limit_isa) ---------------------------------
@pytest.mark.parametrize("level", ISA_LEVELS)
@settings(max_examples=40, deadline=None)
@given(m=st.one_of(st.integers(1, 8), st.integers(9, 40)), n=st.integers(1, 90),
       k=st.integers(1, 300), bits=st.sampled_from([4, 8]),
       block_size=st.sampled_from([16, 32, 64, 128]),
       zero_points=st.sampled_from([None, "packed", "float"]), seed=st.integers(0, 2**16))
def test_each_isa_against_reference(level, m, n, k, bits, block_size, zero_points, seed):
    """Decode (m <= 8: one pass over the weights per 4 rows of a, or per row) and prefill paths
    at each level, k with tails that are no multiple of 16 or of the block: within the
    reference op's bound, and bit for bit the same at 1 and 2 threads (but for the portable
    prefill, whose BLAS panels follow the thread count)."""
    rng = np.random.default_rng(seed)
    b, scales, zp = quantized(rng, n, k, bits, block_size, zero_points)
    a = rng.standard_normal((m, k), dtype=np.float32)
    with kernels.isa_limit(level):
        one, two = matmul_nbits_at_one_and_two_threads(a, b, scales, zp, k=k, n=n, bits=bits,
                                                       block_size=block_size)
    if level != "portable" or m <= 3:
        assert one.tobytes() == two.tobytes()
    assert_agrees(one, a, b, scales, zp, None, k=k, n=n, bits=bits, block_size=block_size)


@pytest.mark.parametrize("level", ISA_LEVELS)
@pytest.mark.parametrize("m", [1, 3, 24])
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_each_isa_hand_checked(level, m, block_size):
    """Row j's codes are 0, 1, ..., 15, 0, 1, ... (low nibble first), zero point j % 16, scale
    0.5; a is all ones over k = 70: y[i, j] = 0.5 * sum over t < 70 of (t % 16 - j % 16), that is
    0.5 * (4 * 120 + (0 + 1 + 2 + 3 + 4 + 5) - 70 * (j % 16)) = 247.5 - 35 * (j % 16)."""
    k, n = 70, 19
    blocks = -(-k // block_size)
    codes = np.arange(blocks * block_size) % 16
    packed = (codes[0::2] | codes[1::2] << 4).astype(np.uint8)
    b = np.tile(packed, (n, 1)).reshape(n, blocks, block_size // 2)
    zp_values = np.arange(n * blocks).reshape(n, blocks) * 0 + (np.arange(n) % 16)[:, None]
    zp = np.zeros((n, (blocks + 1) // 2), np.uint8)
    for blk in range(blocks):
        zp[:, blk // 2] |= (zp_values[:, blk] << (4 * (blk % 2))).astype(np.uint8)
    scales = np.full(n * blocks, 0.5, np.float32)
    a = np.ones((m, k), np.float32)
    with kernels.isa_limit(level):
        got = kernels.matmul_nbits(a, b, scales, zp.reshape(-1), k=k, n=n, bits=4,
                                   block_size=block_size)
    want = 247.5 - 35.0 * (np.arange(n) % 16)
    np.testing.assert_array_equal(got, np.tile(want, (m, 1)).astype(np.float32))


@pytest.mark.parametrize("level", ISA_LEVELS)
@pytest.mark.parametrize("k", [40, 36, 17])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m", [1, 2, 12])
def test_each_isa_infinite_scale_in_a_partial_last_block(level, m, bits, k):
    """As test_infinite_scale_in_the_last_partial_block_gives_inf at each level, with k leaving
    8, 4 or 1 values in the last block: lanes of the last block that hold only padding must not
    make NaN from 0 times the inf scale."""
    n, block = 20, 16 if k == 17 else 32
    blocks = -(-k // block)
    b = np.full((n, blocks, block * bits // 8), 0x99 if bits == 4 else 0x81, np.uint8)
    scales = np.tile(np.array([1.0] * (blocks - 1) + [np.inf], np.float32), n)
    a = np.ones((m, k), np.float32)
    with kernels.isa_limit(level):
        got = kernels.matmul_nbits(a, b, scales, None, k=k, n=n, bits=bits, block_size=block)
    assert np.isposinf(got).all()
