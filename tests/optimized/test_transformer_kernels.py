"""Attention softmax and GEMV thread crossover details owned by the transformer work (H5):
a NaN score makes its query row NaN (as ONNX Softmax does) while the other rows stay exact,
in rows long enough for the vectorised max and sum loops of csrc/gqa.c."""
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


@pytest.fixture
def threads():
    before = kernels.get_num_threads()
    yield kernels.set_num_threads
    kernels.set_num_threads(before)


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
