"""Random generators: RandomNormal(Like), RandomUniform(Like), Bernoulli, Multinomial.

The spec fixes the distributions, shapes and dtypes but no generator, so values cannot be
compared with another runtime's.  A given `seed` makes the draw reproducible here: it seeds
NumPy's default generator (PCG64) with the seed's float32 bits; without one, the op draws from
the evaluator's own generator (ReferenceEvaluator(seed=...)), so a whole run is repeatable.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import is_float, np_dtype
from ..registry import op


def _rng(seed, ctx=None):
    if seed is None:
        evaluator = getattr(ctx, "evaluator", None)
        return evaluator.rng if evaluator is not None else np.random.default_rng()
    return np.random.default_rng(int(np.float32(seed).view(np.uint32)))


def _float_dtype(dtype, name):
    dt = np_dtype(dtype)
    if not is_float(dt):
        raise TypeError(f"{name}: dtype must be a floating type, got {dt}")
    return dt


def _like_dtype(input, dtype, name):
    return _float_dtype(dtype, name) if dtype is not None else _float_dtype_of(input, name)


def _float_dtype_of(input, name):
    if not is_float(input.dtype):
        raise TypeError(f"{name}: input is {input.dtype}; set 'dtype' to a floating type")
    return input.dtype


@op("RandomNormal", 1)
def random_normal(*, shape, dtype=1, mean=0.0, scale=1.0, seed=None, ctx=None):
    dt = _float_dtype(dtype, "RandomNormal")
    return _rng(seed, ctx).normal(mean, scale, size=tuple(shape)).astype(dt)


@op("RandomNormalLike", 1)
def random_normal_like(input, *, dtype=None, mean=0.0, scale=1.0, seed=None, ctx=None):
    dt = _like_dtype(input, dtype, "RandomNormalLike")
    return _rng(seed, ctx).normal(mean, scale, size=input.shape).astype(dt)


@op("RandomUniform", 1)
def random_uniform(*, shape, dtype=1, low=0.0, high=1.0, seed=None, ctx=None):
    dt = _float_dtype(dtype, "RandomUniform")
    return _rng(seed, ctx).uniform(low, high, size=tuple(shape)).astype(dt)


@op("RandomUniformLike", 1)
def random_uniform_like(input, *, dtype=None, low=0.0, high=1.0, seed=None, ctx=None):
    dt = _like_dtype(input, dtype, "RandomUniformLike")
    return _rng(seed, ctx).uniform(low, high, size=input.shape).astype(dt)


@op("Bernoulli", 15)
def bernoulli(input, *, dtype=None, seed=None, ctx=None):
    p = input.astype(np.float64)
    if np.any((p < 0) | (p > 1)):
        raise ValueError("Bernoulli: input probabilities must lie in [0, 1]")
    dt = input.dtype if dtype is None else np_dtype(dtype)
    return (_rng(seed, ctx).random(size=input.shape) < p).astype(dt)


@op("Multinomial", 7)
def multinomial(input, *, dtype=6, sample_size=1, seed=None, ctx=None):
    if input.ndim != 2:
        raise ValueError(f"Multinomial: input must be [batch_size, class_size], got {input.shape}")
    dt = np_dtype(dtype)
    if dt not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"Multinomial: dtype must be int32 or int64, got {dt}")
    # rows hold unnormalized log-probabilities
    logits = input.astype(np.float64)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    cdf = np.cumsum(p, axis=1)
    cdf /= cdf[:, -1:]
    u = _rng(seed, ctx).random(size=(input.shape[0], sample_size))
    samples = (u[:, :, None] >= cdf[:, None, :]).sum(axis=-1)
    return np.minimum(samples, input.shape[1] - 1).astype(dt)
