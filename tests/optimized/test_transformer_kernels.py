"""Attention softmax and GEMV thread crossover details owned by the transformer work (H5):
a NaN score makes its query row NaN (as ONNX Softmax does) while the other rows stay exact,
in rows long enough for the vectorised max and sum loops of csrc/gqa.c."""
import math

import numpy as np
import pytest

from optimized import kernels


def softmax_attention(q, k, v, mask, scale):
    scores = scale * q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2) + mask
    with np.errstate(invalid="ignore"):
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("nan_key", [0, 5, 37, 70])  # in the vector body and in the tail
def test_a_nan_score_makes_only_its_row_nan(nan_key):
    rng = np.random.default_rng(nan_key)
    q = rng.standard_normal((1, 2, 3, 8), np.float32)
    k = rng.standard_normal((1, 2, 71, 8), np.float32)
    v = rng.standard_normal((1, 2, 71, 5), np.float32)
    mask = np.zeros((1, 2, 3, 71), np.float32)
    mask[0, 1, 2, nan_key] = np.nan
    y = kernels.grouped_attention(q, k, v, mask=mask, scale=0.25)
    expected = softmax_attention(q, k, v, mask, 0.25)
    assert np.isnan(y[0, 2, 1]).all()
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)  # NaN where expected NaN


def test_scores_far_above_zero_keep_their_maximum():
    # the max loop sees large positive and negative scores: a wrong max overflows exp
    rng = np.random.default_rng(1)
    q = (60 * rng.standard_normal((1, 1, 4, 16))).astype(np.float32)
    k = (60 * rng.standard_normal((1, 1, 45, 16))).astype(np.float32)
    v = rng.standard_normal((1, 1, 45, 16)).astype(np.float32)
    mask = np.zeros((1, 1, 4, 45), np.float32)
    y = kernels.grouped_attention(q, k, v, mask=mask, scale=1.0)
    np.testing.assert_allclose(y, softmax_attention(q, k, v, mask, 1.0), rtol=1e-4, atol=1e-5)


def test_a_nan_among_masked_keys_is_nan_not_an_empty_row():
    # every other key masked with -inf: without the NaN the row would count as seeing nothing
    q = np.ones((1, 1, 2, 4), np.float32)
    k = np.ones((1, 1, 19, 4), np.float32)
    v = np.ones((1, 1, 19, 4), np.float32)
    mask = np.full((1, 1, 2, 19), -np.inf, np.float32)
    mask[0, 0, 0, 11] = np.nan
    mask[0, 0, 1, 3] = 0.0
    y = kernels.grouped_attention(q, k, v, mask=mask)
    assert np.isnan(y[0, 0]).all()
    np.testing.assert_array_equal(y[0, 1], 1.0)


@pytest.mark.parametrize("heads, q_len", [(3, 37), (1, 50), (2, 130), (5, 17)])
def test_attention_rows_split_for_threads_keep_their_bits(threads, heads, q_len):
    # few heads of few rows are cut into smaller row blocks when threads would idle; each row's
    # sums keep their order, so 1 and 2 threads agree bit for bit (and with the float64 truth)
    rng = np.random.default_rng(heads * q_len)
    q = rng.standard_normal((1, heads, q_len, 24), np.float32)
    k = rng.standard_normal((1, heads, q_len, 24), np.float32)
    v = rng.standard_normal((1, heads, q_len, 40), np.float32)
    mask = np.zeros((1, 1, 1, q_len), np.float32)
    mask[..., -3:] = np.finfo(np.float32).min
    outputs = []
    for n in (1, 2):
        threads(n)
        outputs.append(kernels.grouped_attention(q, k, v, mask=mask, scale=0.2))
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.testing.assert_allclose(outputs[1], softmax_attention(q, k, v, mask, 0.2), rtol=1e-5,
                               atol=1e-6)


# --- csrc/vmath.h: the polynomial Gelu and exp, their Horner steps fused multiply-adds ---------
def erf_gelu_float64(x):
    x = x.astype(np.float64)
    erfc = np.frompyfunc(math.erfc, 1, 1)
    return 0.5 * x * erfc(-x / np.sqrt(2.0)).astype(np.float64)


def test_erf_gelu_over_a_dense_grid_stays_within_its_bound():
    # measured: 7.1e-6 relative at x = -9.93 (where Gelu is 1e-22), 3.9e-7 absolute
    x = np.linspace(-10, 10, 400_001, dtype=np.float32)
    got, want = kernels.gelu(x).astype(np.float64), erf_gelu_float64(x)
    assert np.abs(got - want).max() < 5e-7
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=0)


def test_exp_through_softmax_within_three_ulp():
    # softmax([0, v]) for v <= -20 is e^v / (1 + e^v), within an ulp of e^v: the vm_exp error
    v = np.linspace(-86, -20, 200_001, dtype=np.float32)
    got = kernels.softmax(np.stack([np.zeros_like(v), v], axis=1))[:, 1].astype(np.float64)
    want = np.exp(v.astype(np.float64))
    want /= 1 + want
    ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
    assert (np.abs(got - want) / ulp).max() <= 3


def test_gelu_same_bits_at_one_and_two_threads():
    x = np.random.default_rng(5).standard_normal(300_001).astype(np.float32) * 4
    before = kernels.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            kernels.set_num_threads(threads)
            results.append(kernels.gelu(x).tobytes())
    finally:
        kernels.set_num_threads(before)
    assert results[0] == results[1]
