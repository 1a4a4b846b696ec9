"""The transformer's memory-bound kernels (activations, softmax, layer norm, the attention
softmax) on every vector-instruction level this CPU runs (kernels.limit_isa): each against the
reference op, over row lengths with tails that are not a multiple of 16, with special values,
and the AVX-512 forms of vmath.h against the AVX2 ones bit for bit where their results are
normal floats."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optimized import kernels

from .conftest import CPU_ISA, CPU_LEVELS
from .test_kernels import ACTIVATION_CASES, ATOL, RTOL, arrays, ref, ref_activation

hsettings = settings(max_examples=25, deadline=None)
TRANSCENDENTAL = ("Sigmoid", "Tanh", "Gelu", "GeluTanh")


def float64_truth(name: str, x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if name == "Sigmoid":
            return 1.0 / (1.0 + np.exp(-x))
        if name == "Tanh":
            return np.tanh(x)
        if name == "Gelu":
            erfc = np.frompyfunc(math.erfc, 1, 1)
            return (0.5 * x * erfc(-x / math.sqrt(2.0)).astype(np.float64))
        u = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
        return 0.5 * x * (1.0 + np.tanh(u))


# --- activations ---------------------------------------------------------------------------

HARD_CASES = [("HardSigmoid", ()), ("HardSwish", ())]


@hsettings
@given(n=st.integers(1, 100), act=st.sampled_from(ACTIVATION_CASES[1:] + HARD_CASES),
       scale=st.sampled_from([1.0, 12.0]), seed=st.integers(0, 1000))
def test_activation_matches_reference_at_each_level(n, act, scale, seed):
    x = arrays(seed, 3, n, scale=scale)
    expected = ref_activation(x, *act)
    for level in CPU_LEVELS:
        with kernels.isa_limit(level):
            got = kernels.activation(x, act[0], act[1])
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL, err_msg=level)


SPECIAL = np.array([np.inf, -np.inf, np.nan, 1e30, -1e30, 100.0, -100.0, 88.8, -88.8, 44.0,
                    -44.0, 9.0, -9.0, 0.0, -0.0, 1e-30, -1e-30, 0.0625, -0.0625, 0.06],
                   np.float32)


@pytest.mark.parametrize("name", TRANSCENDENTAL)
@pytest.mark.parametrize("offset", [0, 7, 16])  # the specials in the vector body and the tail
def test_special_values(isa_level, name, offset):
    # as the reference: NaN stays NaN, and Gelu(-inf) is -inf * 0 = NaN
    x = np.concatenate([np.ones(offset, np.float32), SPECIAL])
    got = kernels.activation(x, name)[offset:]
    want = ref_activation(SPECIAL, name)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_hand_checked_values(isa_level):
    x = np.array([-1.0, 0.0, 1.0, 0.5], np.float32)
    np.testing.assert_allclose(kernels.gelu(x), [-0.15865525, 0.0, 0.84134475, 0.34573123],
                               rtol=1e-6)
    np.testing.assert_allclose(kernels.activation(x, "Tanh"),
                               [-0.76159416, 0.0, 0.76159416, 0.46211716], rtol=1e-6)
    np.testing.assert_allclose(kernels.activation(x, "Sigmoid"),
                               [0.26894142, 0.5, 0.73105858, 0.62245933], rtol=1e-6)


@pytest.mark.parametrize("name, bound", [("Gelu", 13.0), ("GeluTanh", 30.0), ("Tanh", 30.0),
                                         ("Sigmoid", 80.0)])
@pytest.mark.skipif("avx512" not in CPU_LEVELS, reason=f"this CPU runs at most {CPU_ISA}")
def test_avx512_forms_give_the_avx2_bits(name, bound):
    # vmath.h: normal results of the 16-lane forms are bit for bit those of the AVX2 loops
    # (beyond |x| = 13, erf Gelu's results are subnormal and may differ in the last bits)
    x = np.linspace(-bound, bound, 1_000_003, dtype=np.float32)
    with kernels.isa_limit("avx512"):
        wide = kernels.activation(x, name)
    with kernels.isa_limit("avx2"):
        np.testing.assert_array_equal(wide, kernels.activation(x, name))


def test_erf_gelu_within_its_bound(isa_level):
    x = np.linspace(-10, 10, 100_003, dtype=np.float32)
    got, want = kernels.gelu(x).astype(np.float64), float64_truth("Gelu", x)
    assert np.abs(got - want).max() < 5e-7


@pytest.mark.parametrize("name", TRANSCENDENTAL)
def test_same_bits_at_one_and_two_threads(isa_level, threads, name):
    x = arrays(3, 200_003, scale=5.0)
    results = []
    for n in (1, 2):
        threads(n)
        results.append(kernels.activation(x, name).tobytes())
    assert results[0] == results[1]


# --- softmax -------------------------------------------------------------------------------

@hsettings
@given(rows=st.integers(1, 5), cols=st.integers(1, 100), scale=st.sampled_from([1.0, 60.0]),
       seed=st.integers(0, 1000))
def test_softmax_matches_reference_at_each_level(rows, cols, scale, seed):
    x = arrays(seed, rows, cols, scale=scale)
    expected = ref("Softmax", x, opset=13)
    for level in CPU_LEVELS:
        with kernels.isa_limit(level):
            got = kernels.softmax(x)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=level)


@pytest.mark.parametrize("cols", [3, 16, 21, 40])
def test_softmax_special_rows(isa_level, cols):
    x = arrays(cols, 5, cols)
    x[0, -1] = np.nan  # NaN anywhere: the row is NaN
    x[1, :] = -np.inf  # all -inf: 0 / 0
    x[2, 0] = np.inf  # +inf: inf - inf
    x[3, :] = -np.inf
    x[3, cols // 2] = 2.0  # one finite score among -inf: probability 1 there
    got = kernels.softmax(x)
    assert np.isnan(got[:3]).all()
    np.testing.assert_array_equal(got[3], np.eye(cols, dtype=np.float32)[cols // 2])
    np.testing.assert_allclose(got[4], ref("Softmax", x[4:], opset=13)[0], rtol=1e-6)


def test_exp_through_softmax_within_three_ulp(isa_level):
    v = np.linspace(-103, -20, 100_003, dtype=np.float32)  # subnormal results below -87.3
    got = kernels.softmax(np.stack([np.zeros_like(v), v], axis=1))[:, 1].astype(np.float64)
    want = np.exp(v.astype(np.float64))
    want /= 1 + want
    ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
    assert (np.abs(got - want) / ulp).max() <= 3


# --- layer norm ----------------------------------------------------------------------------

@hsettings
@given(rows=st.integers(1, 5), cols=st.integers(1, 100), with_bias=st.booleans(),
       offset=st.sampled_from([0.0, 300.0]), seed=st.integers(0, 1000))
def test_layer_norm_matches_reference_at_each_level(rows, cols, with_bias, offset, seed):
    # offset: a large mean, where a float sum of x^2 - mean^2 would lose the variance
    x = arrays(seed, rows, cols, scale=3.0) + np.float32(offset)
    scale, bias = arrays(seed + 1, cols), (arrays(seed + 2, cols) if with_bias else None)
    expected = ref("LayerNormalization", x, scale, bias, opset=17, n_out=3, epsilon=1e-5)
    for level in CPU_LEVELS:
        with kernels.isa_limit(level):
            got = kernels.layer_norm(x, scale, bias, epsilon=1e-5, return_stats=True)
        # each side rounds the mean to float32 (an output), so x - mean may differ by an ulp
        # of the offset, scaled by inv_std (about 1/3 here) and |scale|
        atol = 1e-5 + np.spacing(np.float32(offset)) * np.abs(scale).max()
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=atol, err_msg=level)


def test_layer_norm_hand_checked_and_in_place(isa_level):
    x = np.array([[1.0, 3.0], [5.0, 5.0]], np.float32)  # mean 2, variance 1; a constant row
    y = kernels.layer_norm(x, np.array([2.0, 1.0], np.float32), np.array([0.0, 10.0], np.float32),
                           epsilon=0.0, out=x)
    assert y is x
    np.testing.assert_allclose(y[0], [-2.0, 11.0], rtol=1e-6)
    assert np.isnan(y[1]).all()  # 0 / sqrt(0): as the reference gives


def test_layer_norm_same_bits_at_one_and_two_threads(isa_level, threads):
    x = arrays(4, 300, 77)
    scale, bias = arrays(5, 77), arrays(6, 77)
    results = []
    for n in (1, 2):
        threads(n)
        results.append(kernels.layer_norm(x, scale, bias).tobytes())
    assert results[0] == results[1]


# --- attention softmax (csrc/attention.c, csrc/gqa.c) -------------------------------------

def attention_truth(q, k, v, mask, scale, causal=False):
    scores = scale * q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2)
    if mask is not None:
        scores = scores + mask
    if causal:
        rows, keys = scores.shape[-2:]
        scores = np.where(np.tri(rows, keys, dtype=bool), scores, -np.inf)
    with np.errstate(invalid="ignore"):
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
    return p @ v


@hsettings
@given(heads=st.integers(1, 3), q_len=st.integers(1, 40), kv_len=st.integers(1, 70),
       causal=st.booleans(), with_mask=st.booleans(), seed=st.integers(0, 1000))
def test_attention_matches_truth_at_each_level(heads, q_len, kv_len, causal, with_mask, seed):
    q, k = arrays(seed, 1, heads, q_len, 8), arrays(seed + 1, 1, heads, kv_len, 8)
    v = arrays(seed + 2, 1, heads, kv_len, 5)
    mask = arrays(seed + 3, 1, 1, q_len, kv_len) if with_mask else None
    if causal and kv_len < q_len:
        kv_len = q_len
        k, v = arrays(seed + 1, 1, heads, kv_len, 8), arrays(seed + 2, 1, heads, kv_len, 5)
        mask = arrays(seed + 3, 1, 1, q_len, kv_len) if with_mask else None
    want = attention_truth(q, k, v, mask, 0.3, causal)
    want_gqa = want.transpose(0, 2, 1, 3)
    for level in CPU_LEVELS:
        with kernels.isa_limit(level):
            got = kernels.attention(q, k, v, mask, scale=0.3, causal=causal)
            got_gqa = kernels.grouped_attention(q, k, v, mask=mask, scale=0.3, causal=causal)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=level)
        np.testing.assert_allclose(got_gqa, want_gqa, rtol=1e-5, atol=1e-5, err_msg=level)


@pytest.mark.parametrize("nan_key", [0, 20, 36])
def test_attention_nan_and_empty_rows(isa_level, nan_key):
    q = arrays(1, 1, 1, 3, 8)
    k, v = arrays(2, 1, 1, 37, 8), arrays(3, 1, 1, 37, 4)
    mask = np.zeros((1, 1, 3, 37), np.float32)
    mask[0, 0, 0, nan_key] = np.nan
    mask[0, 0, 1, :] = -np.inf
    got = kernels.grouped_attention(q, k, v, mask=mask)
    assert np.isnan(got[0, 0]).all()
    np.testing.assert_array_equal(got[0, 1], 0.0)  # sees no key: zeros
    assert np.isnan(kernels.grouped_attention(q, k, v, mask=mask, empty_nan=True)[0, 1]).all()
    np.testing.assert_allclose(got[0, 2, 0], attention_truth(q, k, v, mask, 8**-0.5)[0, 0, 2],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(kernels.attention(q, k, v, mask)[0, 0, 1], 0.0)


# --- RMS norm and the SiLU-gated product (csrc/rmsnorm.c, csrc/gated.c) --------------------

@hsettings
@given(rows=st.integers(1, 5), cols=st.integers(1, 100), with_skip=st.booleans(),
       with_bias=st.booleans(), seed=st.integers(0, 1000))
def test_rms_norm_matches_float64_at_each_level(rows, cols, with_skip, with_bias, seed):
    x, scale = arrays(seed, rows, cols, scale=2.0), arrays(seed + 1, cols)
    skip = arrays(seed + 2, rows, cols) if with_skip else None
    bias = arrays(seed + 3, cols) if with_skip and with_bias else None
    s = x.astype(np.float64) + (0 if skip is None else skip) + (0 if bias is None else bias)
    want = s / np.sqrt((s * s).mean(-1, keepdims=True) + 1e-6) * scale
    for level in CPU_LEVELS:
        with kernels.isa_limit(level):
            got = kernels.rms_norm(x, scale, skip=skip, bias=bias, epsilon=1e-6)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=level)


def silu_mul_float64(gate, up):
    g = gate.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return g / (1.0 + np.exp(-g)) * up


@hsettings
@given(rows=st.integers(1, 4), cols=st.integers(1, 100), halves=st.booleans(),
       seed=st.integers(0, 1000))
def test_silu_mul_matches_float64_at_each_level(rows, cols, halves, seed):
    gate, up = arrays(seed, rows, cols, scale=4.0), arrays(seed + 1, rows, cols)
    want = silu_mul_float64(gate, up)
    for level in CPU_LEVELS:
        with kernels.isa_limit(level):
            got = (kernels.silu_mul(np.concatenate([gate, up], -1)) if halves
                   else kernels.silu_mul(gate, up))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=level)


@pytest.mark.parametrize("offset", [0, 5, 16])
def test_silu_mul_special_values(isa_level, offset):
    gate = np.concatenate([np.ones(offset, np.float32), SPECIAL])
    got = kernels.silu_mul(gate, np.full_like(gate, 2.0))[offset:]
    want = silu_mul_float64(SPECIAL, 2.0)
    want[1] = np.nan  # -inf * sigmoid(-inf) = -inf * 0, as the decomposed graph gives
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
