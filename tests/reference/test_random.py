"""Random generators: shapes, dtypes, ranges, seeds, and laws that hold for any generator."""
from functools import partial

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto

from tests.reference.oneop import run_node

run = partial(run_node, opset=22)  # the opset these tests target


def test_random_uniform_shape_dtype_range_and_seed():
    y = run("RandomUniform", shape=[3, 1000], low=-2.0, high=5.0, seed=3.0)
    assert y.shape == (3, 1000) and y.dtype == np.float32
    assert y.min() >= -2 and y.max() < 5
    assert abs(y.mean() - 1.5) < 0.2
    again = run("RandomUniform", shape=[3, 1000], low=-2.0, high=5.0, seed=3.0)
    np.testing.assert_array_equal(y, again)
    other = run("RandomUniform", shape=[3, 1000], low=-2.0, high=5.0, seed=4.0)
    assert not np.array_equal(y, other)


def test_random_normal_moments_and_dtype():
    y = run("RandomNormal", shape=[20000], mean=3.0, scale=0.5, seed=1.0,
            dtype=TensorProto.DOUBLE)
    assert y.dtype == np.float64 and y.shape == (20000,)
    assert abs(y.mean() - 3) < 0.02 and abs(y.std() - 0.5) < 0.02
    h = run("RandomNormal", shape=[2, 0, 3], dtype=TensorProto.FLOAT16)
    assert h.dtype == np.float16 and h.shape == (2, 0, 3)


def test_like_ops_copy_shape_and_type():
    x = np.zeros((2, 3, 4), dtype=np.float64)
    assert run("RandomUniformLike", x).dtype == np.float64
    assert run("RandomNormalLike", x).shape == (2, 3, 4)
    ints = np.zeros((5,), dtype=np.int32)
    y = run("RandomUniformLike", ints, dtype=TensorProto.BFLOAT16)
    assert y.dtype == ml_dtypes.bfloat16 and y.shape == (5,)
    with pytest.raises(Exception, match="dtype"):
        run("RandomNormalLike", ints)  # an int32 output is not a valid T2


def test_bernoulli_extremes_are_deterministic():
    p = np.array([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]], dtype=np.float32)
    y = run("Bernoulli", p)
    assert y.dtype == np.float32 and y.tolist() == p.tolist()
    b = run("Bernoulli", p.astype(np.float64), dtype=TensorProto.BOOL)
    assert b.dtype == np.bool_ and b.tolist() == p.astype(bool).tolist()


def test_bernoulli_frequency():
    p = np.full(20000, 0.3)
    y = run("Bernoulli", p, seed=7.0, dtype=TensorProto.INT64)
    assert y.dtype == np.int64 and set(np.unique(y)) <= {0, 1}
    assert abs(y.mean() - 0.3) < 0.02


def test_multinomial():
    # class 1 has probability 0 (log-probability -inf); class 2 is three times class 0
    logits = np.log(np.array([[1.0, 0.0, 3.0], [0.0, 1.0, 0.0]], dtype=np.float32))
    y = run("Multinomial", logits, sample_size=8000, seed=2.0)
    assert y.shape == (2, 8000) and y.dtype == np.int32
    assert set(np.unique(y[0])) <= {0, 2}
    assert abs((y[0] == 2).mean() - 0.75) < 0.03
    assert np.all(y[1] == 1)
    y64 = run("Multinomial", logits, dtype=TensorProto.INT64)
    assert y64.dtype == np.int64 and y64.shape == (2, 1)
