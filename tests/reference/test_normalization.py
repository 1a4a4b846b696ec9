"""Normalizations and Dropout: hand-checked formulas, legacy attributes, dtypes, axis mix-ups."""
import itertools
from functools import partial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from reference import NodeError
from tests.reference.oneop import run_node

run = partial(run_node, opset=22)  # the opset these tests target unless one says otherwise


rng = np.random.default_rng(2)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# N != C != H != W throughout, so a mixed-up axis changes the result
X = rand(2, 3, 4, 5)


def per_channel(v):
    return v.reshape(1, -1, 1, 1)


# BatchNormalization ------------------------------------------------------------------------
def test_batch_norm_inference():
    s, b, m, v = rand(3), rand(3), rand(3), np.abs(rand(3)) + 0.1
    y = run("BatchNormalization", X, s, b, m, v, epsilon=1e-3, opset=15)
    ref = (X - per_channel(m)) / np.sqrt(per_channel(v) + 1e-3) * per_channel(s) + per_channel(b)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    assert y.dtype == np.float32


def test_batch_norm_training_mode_outputs():
    s, b, m, v = rand(3), rand(3), rand(3), np.abs(rand(3)) + 0.1
    y, rm, rv = run("BatchNormalization", X, s, b, m, v, training_mode=1, momentum=0.8,
                    n_out=3, opset=15)
    mean = X.mean(axis=(0, 2, 3))
    var = ((X - per_channel(mean)) ** 2).mean(axis=(0, 2, 3))  # population variance
    ref = (X - per_channel(mean)) / np.sqrt(per_channel(var) + 1e-5) * per_channel(s) + per_channel(b)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rm, 0.8 * m + 0.2 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv, 0.8 * v + 0.2 * var, rtol=1e-5, atol=1e-6)


def test_batch_norm_stats_outputs_need_training_mode():
    s, b, m, v = rand(3), rand(3), rand(3), np.abs(rand(3)) + 0.1
    with pytest.raises(NodeError, match="training_mode"):
        run("BatchNormalization", X, s, b, m, v, n_out=3, opset=15)


def test_batch_norm_legacy_opset6_is_test_and_training():
    s, b, m, v = rand(3), rand(3), rand(3), np.abs(rand(3)) + 0.1
    inference = (X - per_channel(m)) / np.sqrt(per_channel(v) + 1e-5) * per_channel(s) + per_channel(b)
    y = run("BatchNormalization", X, s, b, m, v, is_test=1, opset=6)
    np.testing.assert_allclose(y, inference, rtol=1e-5, atol=1e-6)
    y, rm, _rv, sm, _sv = run("BatchNormalization", X, s, b, m, v, is_test=0, opset=6, n_out=5)
    mean = X.mean(axis=(0, 2, 3))
    np.testing.assert_allclose(sm, mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rm, 0.9 * m + 0.1 * mean, rtol=1e-5, atol=1e-6)
    assert not np.allclose(y, inference)


def test_batch_norm_opset7_non_spatial_is_per_activation():
    s, b, m = rand(3, 4, 5), rand(3, 4, 5), rand(3, 4, 5)
    v = np.abs(rand(3, 4, 5)) + 0.1
    y = run("BatchNormalization", X, s, b, m, v, spatial=0, opset=7)
    np.testing.assert_allclose(y, (X - m) / np.sqrt(v + 1e-5) * s + b, rtol=1e-5, atol=1e-6)


def test_batch_norm_float16_and_1d_input():
    x = rand(4, 3).astype(np.float16)
    s, b, m, v = (np.ones(3, np.float16), np.zeros(3, np.float16), np.zeros(3, np.float16),
                  np.ones(3, np.float16))
    y = run("BatchNormalization", x, s, b, m, v, epsilon=0.0, opset=15)
    assert y.dtype == np.float16 and y.shape == (4, 3)
    np.testing.assert_array_equal(y, x)


# instance / layer / group / RMS --------------------------------------------------------------
def test_instance_norm():
    s, b = rand(3), rand(3)
    y = run("InstanceNormalization", X, s, b, epsilon=1e-4)
    mean = X.mean(axis=(2, 3), keepdims=True)
    var = X.var(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(y, (X - mean) / np.sqrt(var + 1e-4) * per_channel(s) + per_channel(b),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("axis", [1, -2, -1, 0])
def test_layer_norm_axes_and_stat_shapes(axis):
    a = axis % 4
    scale, bias = rand(*X.shape[a:]), rand(*X.shape[a:])
    y, mean, inv = run("LayerNormalization", X, scale, bias, axis=axis, n_out=3, opset=17)
    axes = tuple(range(a, 4))
    m = X.mean(axis=axes, keepdims=True)
    inv_ref = 1 / np.sqrt(X.var(axis=axes, keepdims=True) + 1e-5)
    assert mean.shape == X.shape[:a] + (1,) * (4 - a) == inv.shape
    np.testing.assert_allclose(mean, m, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inv, inv_ref, rtol=1e-4)
    np.testing.assert_allclose(y, (X - m) * inv_ref * scale + bias, rtol=1e-4, atol=1e-5)


def test_layer_norm_float16_keeps_stats_in_float32():
    x = rand(3, 4).astype(np.float16)
    y, mean, inv = run("LayerNormalization", x, np.ones(4, np.float16), n_out=3, opset=17)
    assert y.dtype == np.float16 and mean.dtype == np.float32 and inv.dtype == np.float32


def test_group_norm_18_per_group_vs_21_per_channel():
    x = rand(2, 6, 3, 4)
    g_scale, g_bias = rand(3), rand(3)
    y18 = run("GroupNormalization", x, g_scale, g_bias, num_groups=3, opset=18,
             check_schema=False)  # the checker rejects the deprecated opset-18 schema
    y21 = run("GroupNormalization", x, np.repeat(g_scale, 2), np.repeat(g_bias, 2), num_groups=3, opset=21)
    xg = x.reshape(2, 3, -1)
    norm = ((xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    ref = norm * np.repeat(g_scale, 2).reshape(1, 6, 1, 1) + np.repeat(g_bias, 2).reshape(1, 6, 1, 1)
    np.testing.assert_allclose(y18, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y21, ref, rtol=1e-4, atol=1e-5)


def test_group_norm_bad_groups():
    with pytest.raises(NodeError, match="num_groups"):
        run("GroupNormalization", rand(1, 6, 2), rand(6), rand(6), num_groups=4, opset=21)


def test_rms_norm_negative_axis():
    scale = rand(4, 5)
    y = run("RMSNormalization", X, scale, axis=-2, epsilon=1e-6, opset=23)
    rms = np.sqrt((X ** 2).mean(axis=(2, 3), keepdims=True) + 1e-6)
    np.testing.assert_allclose(y, X / rms * scale, rtol=1e-5, atol=1e-6)


# LRN, LpNormalization, MVN -------------------------------------------------------------------
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_lrn_sums_over_channels_only(size):
    x = rand(2, 5, 3, 4)  # N != C != H != W
    y = run("LRN", x, size=size, alpha=0.01, beta=0.6, bias=1.5)
    ref = np.zeros_like(x, dtype=np.float64)
    for n, c, h, w in itertools.product(*map(range, x.shape)):
        lo, hi = max(0, c - (size - 1) // 2), min(5, c + -(-(size - 1) // 2) + 1)
        sq = (x[n, lo:hi, h, w].astype(np.float64) ** 2).sum()
        ref[n, c, h, w] = x[n, c, h, w] / (1.5 + 0.01 / size * sq) ** 0.6
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_lp_normalization():
    x = np.array([[3, 4, 0], [0, 0, 0]], np.float32)
    np.testing.assert_allclose(run("LpNormalization", x, axis=1, p=2), [[0.6, 0.8, 0], [0, 0, 0]])
    np.testing.assert_allclose(run("LpNormalization", x, axis=0, p=1), [[1, 1, 0], [0, 0, 0]])


def test_mean_variance_normalization_default_axes():
    y = run("MeanVarianceNormalization", X, opset=13)
    np.testing.assert_allclose(y.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(y.std(axis=(0, 2, 3)), 1, rtol=1e-4)
    y2 = run("MeanVarianceNormalization", X, axes=[1, 3], opset=13)
    np.testing.assert_allclose(y2.mean(axis=(1, 3)), 0, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=4, max_side=4),
                  elements=st.floats(-1e3, 1e3)))
def test_layer_norm_is_shift_invariant(x):
    scale = np.ones(x.shape[-1])
    y = run("LayerNormalization", x, scale, stash_type=11, opset=17, epsilon=1e-3)
    y2 = run("LayerNormalization", x + 17.0, scale, stash_type=11, opset=17, epsilon=1e-3)
    np.testing.assert_allclose(y, y2, atol=1e-6)
    assert y.dtype == np.float64


# Dropout -----------------------------------------------------------------------------------
def test_dropout_inference_is_identity_with_true_mask():
    y, mask = run("Dropout", X, np.array(0.7, np.float32), n_out=2, opset=13)
    np.testing.assert_array_equal(y, X)
    assert mask.dtype == np.bool_ and mask.all()


def test_dropout_training_scales_kept_values_and_seed_repeats():
    x = np.abs(rand(40, 50)) + 0.5
    r, t = np.array(0.3, np.float32), np.array(True)
    y, mask = run("Dropout", x, r, t, n_out=2, seed=3, opset=13)
    y2, _ = run("Dropout", x, r, t, n_out=2, seed=3, opset=13)
    np.testing.assert_array_equal(y, y2)
    np.testing.assert_allclose(y[mask], x[mask] / 0.7, rtol=1e-6)
    assert (y[~mask] == 0).all() and 0.2 < 1 - mask.mean() < 0.4
    assert y.dtype == np.float32


def test_dropout_legacy_versions():
    y, mask = run("Dropout", X, n_out=2, is_test=1, opset=6)
    np.testing.assert_array_equal(y, X)
    assert mask.dtype == np.float32
    _, mask7 = run("Dropout", X, n_out=2, opset=7)
    assert mask7.dtype == np.float32 and (mask7 == 1).all()
    _, mask10 = run("Dropout", X, n_out=2, opset=10)
    assert mask10.dtype == np.bool_ and mask10.all()
    y6, m6 = run("Dropout", np.ones((30, 40), np.float32), n_out=2, is_test=0, ratio=0.5, opset=6)
    assert set(np.unique(y6)) <= {0.0, 2.0} and ((y6 == 2) == (m6 == 1)).all()


def test_empty_tensors():
    ones = np.ones(3, np.float32)
    assert run("BatchNormalization", np.zeros((0, 3, 2), np.float32), ones, ones, ones, ones).shape == (0, 3, 2)
    y, m, inv = run("LayerNormalization", np.zeros((0, 4), np.float32), np.ones(4, np.float32),
                    n_out=3, opset=17)
    assert y.shape == (0, 4) and m.shape == inv.shape == (0, 1)
    assert run("GroupNormalization", np.zeros((0, 6, 2), np.float32), np.ones(6, np.float32),
               np.ones(6, np.float32), num_groups=3, opset=21).shape == (0, 6, 2)
