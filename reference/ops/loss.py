"""Losses: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss."""
from __future__ import annotations

import numpy as np

from ..registry import op


def _nll(log_prob, target, weight, ignore_index, reduction):
    """loss[n, d...] = -log_prob[n, target[n, d...], d...] * weight[target], reduced."""
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
    if log_prob.ndim < 2 or target.shape != log_prob.shape[:1] + log_prob.shape[2:]:
        raise ValueError(f"target shape {target.shape} does not match input {log_prob.shape} "
                         "as (N, d1, ...) against (N, C, d1, ...)")
    c = log_prob.shape[1]
    target = target.astype(np.int64)
    keep = np.ones(target.shape, dtype=bool) if ignore_index is None else target != ignore_index
    if np.any((target[keep] < 0) | (target[keep] >= c)):
        raise ValueError(f"target values must lie in [0, {c}) (or equal ignore_index)")
    safe = np.where(keep, target, 0)
    picked = np.take_along_axis(log_prob, safe[:, None], axis=1)[:, 0]
    w = np.ones(target.shape, dtype=log_prob.dtype) if weight is None else weight[safe]
    w = np.where(keep, w, 0).astype(log_prob.dtype)
    loss = -picked * w
    if reduction == "none":
        return loss.astype(log_prob.dtype, copy=False)
    total = loss.sum(dtype=log_prob.dtype)
    if reduction == "sum":
        return np.asarray(total, dtype=log_prob.dtype)
    return np.asarray(total / w.sum(dtype=log_prob.dtype), dtype=log_prob.dtype)


@op("NegativeLogLikelihoodLoss", 12)
def negative_log_likelihood_loss(input, target, weight=None, *, ignore_index=None, reduction="mean"):
    return _nll(input, target, weight, ignore_index, reduction)


@op("SoftmaxCrossEntropyLoss", 12)
def softmax_cross_entropy_loss(scores, labels, weights=None, *, ignore_index=None,
                               reduction="mean", ctx):
    # log_softmax over the class axis, shifted by the max so large scores do not overflow
    ct = np.float64 if scores.dtype == np.float64 else np.float32  # half types in float32
    shifted = scores.astype(ct) - scores.max(axis=1, keepdims=True).astype(ct)
    log_prob = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    log_prob = log_prob.astype(scores.dtype, copy=False)
    loss = _nll(log_prob, labels, weights, ignore_index, reduction)
    return (loss, log_prob) if ctx.n_outputs > 1 else loss
