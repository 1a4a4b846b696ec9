"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against a direct loop."""
import itertools
from functools import partial

import numpy as np
import pytest

from reference import NodeError
from tests.reference.oneop import run_node

run = partial(run_node, opset=22)  # the opset these tests target unless one says otherwise


rng = np.random.default_rng(3)


def naive_nll(logp, target, weight=None, ignore_index=None, reduction="mean"):
    _n, _c = logp.shape[:2]
    losses = np.zeros(target.shape)
    weights = np.zeros(target.shape)
    for idx in itertools.product(*map(range, target.shape)):
        t = int(target[idx])
        if ignore_index is not None and t == ignore_index:
            continue
        wt = 1.0 if weight is None else float(weight[t])
        losses[idx] = -logp[(idx[0], t) + idx[1:]] * wt
        weights[idx] = wt
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / weights.sum()


def log_softmax64(x):
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [None, 2, -1])
def test_nll_multi_dim(reduction, weighted, ignore_index):
    logp = rng.standard_normal((3, 5, 2, 4)).astype(np.float32)
    target = rng.integers(0, 5, (3, 2, 4)).astype(np.int64)
    if ignore_index == -1:
        target[0, 1, 2] = target[2, 0, 0] = -1  # out of range, but ignored
    weight = rng.random(5).astype(np.float32) if weighted else None
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    y = run("NegativeLogLikelihoodLoss", logp, target, weight, **attrs)
    ref = naive_nll(logp, target, weight, ignore_index, reduction)
    assert y.dtype == np.float32 and y.shape == np.shape(ref)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_nll_hand_checked_weighted_mean():
    logp = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]], np.float32))
    target = np.array([0, 2], np.int64)
    weight = np.array([1.0, 0.0, 3.0], np.float32)
    # (-log 0.5 * 1 + -log 0.8 * 3) / (1 + 3)
    y = run("NegativeLogLikelihoodLoss", logp, target, weight)
    np.testing.assert_allclose(y, (np.log(2) - 3 * np.log(0.8)) / 4, rtol=1e-6)
    assert y.shape == () and isinstance(y, np.ndarray)


def test_nll_target_out_of_range_is_an_error():
    with pytest.raises(NodeError, match="target"):
        run("NegativeLogLikelihoodLoss", np.zeros((2, 3), np.float32), np.array([0, 3], np.int64))


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_softmax_cross_entropy_with_log_prob(reduction):
    scores = rng.standard_normal((4, 3, 5)).astype(np.float32)
    labels = rng.integers(0, 3, (4, 5)).astype(np.int32)
    weights = rng.random(3).astype(np.float32)
    loss, log_prob = run("SoftmaxCrossEntropyLoss", scores, labels, weights, n_out=2,
                         reduction=reduction, ignore_index=1)
    lp = log_softmax64(scores)
    np.testing.assert_allclose(log_prob, lp, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss, naive_nll(lp, labels, weights, 1, reduction), rtol=1e-5, atol=1e-6)
    assert loss.dtype == log_prob.dtype == np.float32


def test_softmax_cross_entropy_large_scores_stay_finite():
    scores = np.array([[1e4, 0.0, -1e4], [3e4, 3e4, 3e4]], np.float32)
    labels = np.array([1, 2], np.int64)
    loss, log_prob = run("SoftmaxCrossEntropyLoss", scores, labels, n_out=2, reduction="none")
    assert np.isfinite(loss).all() and np.isfinite(log_prob).all()
    np.testing.assert_allclose(loss, [1e4, np.log(3)], rtol=1e-6)


def test_softmax_cross_entropy_float64_and_float16():
    scores = rng.standard_normal((3, 4))
    labels = np.array([0, 3, 1], np.int64)
    y = run("SoftmaxCrossEntropyLoss", scores, labels, opset=13)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, naive_nll(log_softmax64(scores), labels), rtol=1e-12)
    h = run("SoftmaxCrossEntropyLoss", scores.astype(np.float16), labels, opset=13)
    assert h.dtype == np.float16
    np.testing.assert_allclose(float(h), naive_nll(log_softmax64(scores), labels), rtol=1e-2)
