"""Activations and the Softmax family: hand-checked values, overflow, dtypes, axis semantics
(opset<13 coerces the input to 2-D at `axis`), and laws such as softmax summing to one."""
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from reference import NodeError
from tests.reference.oneop import arr, run_node, same

# pointwise activations -------------------------------------------------------------------------


def test_relu_leaky_thresholded():
    same(run_node("Relu", arr([-3, 0, 4], np.int8)), arr([0, 0, 4], np.int8))
    same(run_node("Relu", arr([-1.5, np.nan, 2.0], np.float16)),
         arr([0.0, np.nan, 2.0], np.float16))
    same(run_node("LeakyRelu", arr([-2.0, 0.0, 3.0]), alpha=0.5), arr([-1.0, 0.0, 3.0]))
    same(run_node("LeakyRelu", arr([-100.0])), arr([-1.0]))  # default alpha 0.01
    same(run_node("ThresholdedRelu", arr([1.0, 1.5, 2.0, -3.0]), alpha=1.5),
         arr([0.0, 0.0, 2.0, 0.0]))


def test_prelu_unidirectional_broadcast_and_ints():
    x = np.arange(-12, 12, dtype=np.float32).reshape(2, 3, 4)
    slope = arr([[0.5], [1.0], [2.0]])  # (3, 1)
    out = run_node("PRelu", x, slope)
    same(out, np.where(x < 0, x * slope, x))
    assert out[0, 2, 0] == -4.0 * 2.0
    same(run_node("PRelu", arr([-4, 3], np.int32), arr([2], np.int32)), arr([-8, 3], np.int32))
    with pytest.raises(NodeError, match="does not broadcast"):
        run_node("PRelu", x, arr([1.0, 2.0, 3.0]))  # (3,) aligns with the last axis (4)


def test_prelu_legacy_per_channel():
    x = -np.ones((2, 3, 2), np.float32)
    out = run_node("PRelu", x, arr([1.0, 2.0, 3.0]), opset=6)
    same(out[1, :, 0], arr([-1.0, -2.0, -3.0]))


def test_elu_selu_celu():
    x = arr([-1.0, 0.0, 2.0])
    e = math.exp(-1) - 1
    np.testing.assert_allclose(run_node("Elu", x, alpha=2.0), [2 * e, 0, 2], rtol=1e-6)
    a, g = 1.67326319217681884765625, 1.05070102214813232421875
    np.testing.assert_allclose(run_node("Selu", x), [g * a * e, 0, 2 * g], rtol=1e-6)
    np.testing.assert_allclose(run_node("Selu", x, alpha=2.0, gamma=3.0), [6 * e, 0, 6], rtol=1e-6)
    np.testing.assert_allclose(
        run_node("Celu", x, alpha=2.0), [2 * (math.exp(-0.5) - 1), 0, 2], rtol=1e-6
    )
    assert run_node("Elu", x.astype(np.float64)).dtype == np.float64


def test_sigmoid_family_saturates_without_overflow():
    x = arr([-1000.0, 0.0, 1000.0])
    same(run_node("Sigmoid", x), arr([0.0, 0.5, 1.0]))
    same(run_node("Softplus", x), arr([0.0, math.log(2), 1000.0]))
    np.testing.assert_allclose(run_node("Sigmoid", arr([1.0], np.float16)),
                               [1 / (1 + math.exp(-1))],
                               rtol=1e-3)  # fmt: skip
    assert run_node("Sigmoid", arr([1.0], np.float16)).dtype == np.float16
    same(run_node("Softsign", arr([-3.0, 0.0, 1.0])), arr([-0.75, 0.0, 0.5]))
    np.testing.assert_allclose(run_node("Tanh", arr([0.5])), [math.tanh(0.5)], rtol=1e-6)


def test_hard_sigmoid_and_swish():
    same(run_node("HardSigmoid", arr([-10.0, 0.0, 1.0, 10.0]), alpha=0.25, beta=0.5),
         arr([0.0, 0.5, 0.75, 1.0]))  # fmt: skip
    np.testing.assert_allclose(
        run_node("HardSwish", arr([-4.0, -3.0, 1.0, 3.0, 5.0])), [0, 0, 1 * (1 / 6 + 0.5), 3, 5],
        rtol=1e-6,
    )


def test_mish_and_swish():
    x = arr([-2.0, 0.0, 1.0, 50.0])
    sp = [math.log1p(math.exp(v)) for v in x]
    np.testing.assert_allclose(run_node("Mish", x), [v * math.tanh(s) for v, s in zip(x, sp)],
                               rtol=1e-6)
    np.testing.assert_allclose(
        run_node("Swish", x, alpha=2.0), [v / (1 + math.exp(-2 * v)) for v in x], rtol=1e-6
    )


def test_shrink_float_and_int():
    x = arr([-3.0, -1.0, 0.0, 1.0, 3.0])
    same(run_node("Shrink", x, lambd=1.5, bias=1.0), arr([-2.0, 0.0, 0.0, 0.0, 2.0]))
    same(run_node("Shrink", x.astype(np.int8), lambd=1.5, bias=1.0), arr([-2, 0, 0, 0, 2], np.int8))
    same(run_node("Shrink", arr([-0.6, 0.5, 0.6])), arr([-0.6, 0.0, 0.6]))  # lambd 0.5, bias 0


def test_gelu_exact_and_tanh():
    x = arr([-1.0, 0.0, 1.0, 3.0], np.float64)
    exact = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x]
    np.testing.assert_allclose(run_node("Gelu", x), exact, rtol=1e-13)
    c = math.sqrt(2 / math.pi)
    approx = [0.5 * v * (1 + math.tanh(c * (v + 0.044715 * v**3))) for v in x]
    np.testing.assert_allclose(run_node("Gelu", x, approximate="tanh"), approx, rtol=1e-13)
    assert abs(run_node("Gelu", arr([1.0]))[0] - 0.8413447) < 1e-6
    with pytest.raises(NodeError, match="approximate"):
        run_node("Gelu", x, approximate="fast")


def test_swiglu():
    a, b = arr([[-1.0, 0.0], [1.0, 2.0]]), arr([[2.0, 5.0], [3.0, -1.0]])
    expected = [[-2 / (1 + math.e), 0.0], [3 / (1 + math.exp(-1)), -2 / (1 + math.exp(-2))]]
    np.testing.assert_allclose(run_node("SwiGLU", a, b), expected, rtol=1e-6)
    with pytest.raises(NodeError, match="same shape"):
        run_node("SwiGLU", a, arr([1.0, 2.0]))


# Softmax family --------------------------------------------------------------------------------


def test_softmax_values_and_large_numbers():
    np.testing.assert_allclose(
        run_node("Softmax", arr([1.0, 2.0, 3.0])), [0.09003057, 0.24472847, 0.66524096], rtol=1e-6
    )
    same(run_node("Softmax", arr([1000.0, 1000.0])), arr([0.5, 0.5]))
    np.testing.assert_allclose(
        run_node("LogSoftmax", arr([1000.0, 1000.0])), [-math.log(2)] * 2, rtol=1e-6
    )


def test_softmax_narrow_types_keep_dtype():
    bf = ml_dtypes.bfloat16
    same(run_node("Softmax", arr([0.0, 0.0, 0.0], bf)), arr([1 / 3] * 3, bf))
    out = run_node("LogSoftmax", arr([[0.0, 0.0]], np.float16), axis=0)
    same(out, arr([[0.0, 0.0]], np.float16))
    same(run_node("Hardmax", arr([1.0, 2.0], bf)), arr([0.0, 1.0], bf))


def test_softmax_axis_opset13_vs_coerced():
    x = np.arange(8, dtype=np.float32).reshape(2, 2, 2)
    new = run_node("Softmax", x, axis=1)  # along axis 1 only
    np.testing.assert_allclose(new.sum(axis=1), 1.0, rtol=1e-6)
    old = run_node("Softmax", x, axis=1, opset=11)  # over the 4 trailing elements per batch row
    np.testing.assert_allclose(old.reshape(2, 4).sum(axis=1), 1.0, rtol=1e-6)
    e = np.exp(np.arange(4) - 3.0)
    np.testing.assert_allclose(old[0].ravel(), e / e.sum(), rtol=1e-6)
    default_old = run_node("Softmax", x, opset=1)  # default axis 1 before 13, -1 from 13
    np.testing.assert_allclose(default_old, old, rtol=1e-6)
    np.testing.assert_allclose(run_node("Softmax", x, axis=-3), run_node("Softmax", x, axis=0),
                               rtol=0)


def test_hardmax_first_maximum():
    x = arr([[1.0, 3.0, 3.0, 2.0], [-1.0, -1.0, -2.0, -5.0]])
    same(run_node("Hardmax", x), arr([[0, 1, 0, 0], [1, 0, 0, 0]], np.float32))
    same(run_node("Hardmax", x, axis=0), arr([[1, 1, 1, 1], [0, 0, 0, 0]], np.float32))
    x3 = arr([[[1.0, 9.0], [2.0, 3.0]], [[5.0, 0.0], [5.0, 1.0]]])
    out = run_node("Hardmax", x3, opset=11)  # axis 1, coerced: one 1 per batch row of 4
    same(out, arr([[[0, 1], [0, 0]], [[1, 0], [0, 0]]], np.float32))


def test_softmax_family_empty_and_errors():
    for op_type in ("Softmax", "LogSoftmax", "Hardmax"):
        out = run_node(op_type, np.zeros((0, 3), np.float16))
        assert out.shape == (0, 3) and out.dtype == np.float16
        out = run_node(op_type, np.zeros((0, 3), np.float32), opset=11)
        assert out.shape == (0, 3)
    with pytest.raises(NodeError, match="axis"):
        run_node("Softmax", arr([[1.0]]), axis=2)


@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(np.float64, (3, 4), elements=st.floats(-30, 30)),
    st.integers(-2, 1),
    st.floats(-100, 100),
)
def test_softmax_laws(x, axis, shift):
    s = run_node("Softmax", x, axis=axis)
    np.testing.assert_allclose(s.sum(axis=axis), 1.0, rtol=1e-12)
    np.testing.assert_allclose(run_node("Softmax", x + shift, axis=axis), s, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(run_node("LogSoftmax", x, axis=axis), np.log(s), rtol=1e-9,
                               atol=1e-12)
    h = run_node("Hardmax", x, axis=axis)
    same(h.sum(axis=axis), np.ones(s.sum(axis=axis).shape))
    first = np.argmax(h, axis=axis, keepdims=True)
    same(np.take_along_axis(x, first, axis=axis), x.max(axis=axis, keepdims=True))
