"""Elementwise math, Clip, IsInf/IsNaN, BitShift, Bitwise*: hand-checked values for the edges the
corpus covers thinly (legacy broadcasting, integer semantics, dtypes, NaN, scalars)."""
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from reference import NodeError
from tests.reference.oneop import arr, run_node, same

# binary arithmetic -------------------------------------------------------------------------


def test_add_broadcasts_higher_rank_and_keeps_dtype():
    a = np.arange(24, dtype=np.float16).reshape(2, 3, 4)
    b = arr([[10], [20], [30]], np.float16)  # (3, 1)
    out = run_node("Add", a, b)
    assert out.dtype == np.float16 and out.shape == (2, 3, 4)
    assert out[1, 2, 3] == 23 + 30 and out[0, 1, 0] == 4 + 20


def test_scalar_inputs_give_0d_array():
    out = run_node("Mul", arr(3.0), arr(4.0))
    assert isinstance(out, np.ndarray) and out.shape == () and out.dtype == np.float32
    assert out == 12


def test_integer_overflow_wraps():
    same(run_node("Add", arr([127, -128], np.int8), arr([1, -1], np.int8)),
         arr([-128, 127], np.int8))
    same(run_node("Mul", arr([200], np.uint8), arr([2], np.uint8)), arr([144], np.uint8))
    same(run_node("Sub", arr([0], np.uint32), arr([1], np.uint32)), arr([2**32 - 1], np.uint32))


def test_integer_div_truncates_toward_zero():
    a = arr([-7, 7, -7, 7, -6, 0], np.int32)
    b = arr([2, 2, -2, -2, 3, -5], np.int32)
    same(run_node("Div", a, b), arr([-3, 3, 3, -3, -2, 0], np.int32))
    same(run_node("Div", arr([7, 255], np.uint8), arr([2, 16], np.uint8)), arr([3, 15], np.uint8))


def test_bfloat16_arithmetic_keeps_dtype():
    bf = ml_dtypes.bfloat16
    out = run_node("Div", arr([1.0, 3.0], bf), arr([4.0, 2.0], bf))
    same(out, arr([0.25, 1.5], bf))


@pytest.mark.parametrize(
    "b_shape, attrs, view",
    [
        ((5,), {}, lambda b: b),  # suffix
        ((4, 5), {}, lambda b: b),
        ((3, 4), {"axis": 1}, lambda b: b[:, :, None]),
        ((2,), {"axis": 0}, lambda b: b[:, None, None, None]),
        ((1, 1), {}, lambda b: b.reshape(())),  # one element
    ],
)
def test_legacy_broadcast_opset6(b_shape, attrs, view):
    a = np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5)
    b = np.arange(1, 1 + math.prod(b_shape), dtype=np.float32).reshape(b_shape)
    out = run_node("Sub", a, b, opset=6, broadcast=1, **attrs)
    same(out, a - view(b))


def test_legacy_broadcast_rejects():
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(NodeError, match="broadcast=1"):
        run_node("Add", a, np.zeros((3,), np.float32), opset=6)  # broadcast unset
    with pytest.raises(NodeError, match="does not match"):
        run_node("Add", a, np.zeros((2,), np.float32), opset=6, broadcast=1)  # suffix is 3
    # the same shapes broadcast NumPy-style from opset 7 on
    same(run_node("Add", a, np.ones((3,), np.float32), opset=7), np.ones((2, 3), np.float32))


def test_legacy_consumed_inputs_accepted():
    same(run_node("Add", arr([1.0]), arr([2.0]), opset=1, consumed_inputs=[0, 0]), arr([3.0]))
    same(run_node("Abs", arr([-1.5]), opset=1, consumed_inputs=[0]), arr([1.5]))


# Mod -----------------------------------------------------------------------------------------


def test_mod_integer_signs():
    a = arr([-4, 7, 5, 4, -7, 8], np.int64)
    b = arr([2, -3, 8, -2, 3, 5], np.int64)
    same(run_node("Mod", a, b), arr([0, -2, 5, 0, 2, 3], np.int64))  # sign of divisor
    same(run_node("Mod", a, b, fmod=1), arr([0, 1, 5, 0, -1, 3], np.int64))  # sign of dividend


def test_mod_float_special_cases():
    x = arr([0.0, -0.0, 0.0, -0.0, -3.0, 3.0, 1.0, np.inf, 1.0, np.nan], np.float64)
    y = arr([-2.0, 2.0, 2.0, -2.0, np.inf, np.inf, -np.inf, 2.0, 0.0, 2.0], np.float64)
    out = run_node("Mod", x, y)
    assert list(np.signbit(out[:4])) == [True, False, False, True]  # zero takes y's sign
    np.testing.assert_array_equal(out[4:7], [np.inf, 3.0, -np.inf])
    assert np.isnan(out[7:]).all()
    out1 = run_node("Mod", arr([-5.5, 5.5, 1.0]), arr([2.0, -2.0, np.inf]), fmod=1)
    same(out1, arr([-1.5, 1.5, 1.0]))


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(np.int32, 6, elements=st.integers(-1000, 1000)),
    hnp.arrays(np.int32, 6, elements=st.integers(1, 50) | st.integers(-50, -1)),
)
def test_div_mod_identities(a, b):
    q = run_node("Div", a, b)
    r_c = run_node("Mod", a, b, fmod=1)
    r_floor = run_node("Mod", a, b)
    np.testing.assert_array_equal(q * b + r_c, a)  # trunc division with C remainder
    assert (np.abs(r_c) < np.abs(b)).all() and ((r_c == 0) | (np.sign(r_c) == np.sign(a))).all()
    assert ((r_floor == 0) | (np.sign(r_floor) == np.sign(b))).all()
    np.testing.assert_array_equal((a - r_floor) % b, 0)


# Pow -----------------------------------------------------------------------------------------


def test_pow_result_has_base_type():
    same(run_node("Pow", arr([2, 3, 4], np.int32), arr([0.5, 2.0, -1.0])), arr([1, 9, 0], np.int32))
    same(run_node("Pow", arr([2.0, 4.0]), arr([3, 2], np.int64)), arr([8.0, 16.0]))
    same(run_node("Pow", arr([2.0], np.float16), arr([10.0])), arr([1024.0], np.float16))


def test_pow_integer_negative_exponent():
    x = arr([2, 1, -1, -1, 3], np.int64)
    y = arr([-1, -3, -3, -2, 2], np.int64)
    same(run_node("Pow", x, y), arr([0, 1, -1, 1, 9], np.int64))


def test_pow_legacy_broadcast():
    out = run_node("Pow", arr([[1.0, 2.0], [3.0, 4.0]]), arr([2.0, 3.0]), opset=6, broadcast=1)
    same(out, arr([[1.0, 8.0], [9.0, 64.0]]))


# unary math ----------------------------------------------------------------------------------


def test_round_half_to_even():
    x = arr([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.3, -2.7, np.nan, -np.inf])
    same(run_node("Round", x), arr([0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 2.0, -3.0, np.nan, -np.inf]))
    assert np.signbit(run_node("Round", arr([-0.4]))[0])


def test_sign_all_kinds():
    same(run_node("Sign", arr([-3, 0, 5], np.int8)), arr([-1, 0, 1], np.int8))
    same(run_node("Sign", arr([0, 7], np.uint16)), arr([0, 1], np.uint16))
    same(run_node("Sign", arr([-0.5, 0.0, 2.0, np.nan])), arr([-1.0, 0.0, 1.0, np.nan]))


def test_unary_empty_and_dtypes():
    for op_type in ("Abs", "Neg", "Sqrt", "Exp", "Log", "Ceil", "Floor", "Erf", "Tanh", "Sin"):
        out = run_node(op_type, np.zeros((0, 3), np.float16))
        assert out.shape == (0, 3) and out.dtype == np.float16, op_type
    same(run_node("Neg", arr([-128, 5], np.int8)), arr([-128, -5], np.int8))
    same(run_node("Abs", arr([-128, -5], np.int8)), arr([-128, 5], np.int8))


def test_inverse_trig_domains():
    out = run_node("Acos", arr([2.0, 1.0, -1.0]))
    assert np.isnan(out[0]) and out[1] == 0 and np.isclose(out[2], np.pi)
    out = run_node("Atanh", arr([1.0, -1.0, 0.5]))
    assert out[0] == np.inf and out[1] == -np.inf
    np.testing.assert_allclose(out[2], 0.5 * math.log(3), rtol=1e-6)
    assert np.isnan(run_node("Acosh", arr([0.5]))[0])


def test_erf_values():
    x = arr([0.0, 0.5, -1.0, 2.0, 3.5, -6.0, np.inf, -np.inf, np.nan, 1e-300], np.float64)
    expected = [math.erf(v) if not np.isnan(v) else np.nan for v in x]
    np.testing.assert_allclose(run_node("Erf", x), expected, rtol=1e-14, atol=0)
    assert run_node("Erf", arr([1.0])).dtype == np.float32


@settings(max_examples=100, deadline=None)
@given(st.floats(-10, 10, allow_nan=False))
def test_erf_matches_math(v):
    got = run_node("Erf", arr([v], np.float64))[0]
    assert abs(got - math.erf(v)) <= 1e-14 * abs(math.erf(v)) + 1e-300


@settings(max_examples=30, deadline=None)
@given(hnp.arrays(np.float64, (3, 2), elements=st.floats(-50, 50)))
def test_sin_cos_identity(x):
    s, c = run_node("Sin", x), run_node("Cos", x)
    np.testing.assert_allclose(s * s + c * c, 1.0, rtol=1e-12)


# variadic ------------------------------------------------------------------------------------


def test_max_min_propagate_nan_and_broadcast():
    a = arr([[1.0], [np.nan], [5.0]])  # (3, 1)
    b = arr([0.0, 2.0, 7.0, -1.0])  # (4,)
    c = arr(3.0)
    mx, mn = run_node("Max", a, b, c), run_node("Min", a, b, c)
    assert mx.shape == (3, 4) and np.isnan(mx[1]).all() and np.isnan(mn[1]).all()
    same(mx[0], arr([3.0, 3.0, 7.0, 3.0]))
    same(mn[2], arr([0.0, 2.0, 3.0, -1.0]))
    same(run_node("Max", arr([1, -5], np.int8), arr([-3, 9], np.int8)), arr([1, 9], np.int8))


def test_sum_mean_variadic():
    a, b, c = arr([1.0, 2.0], np.float16), arr([[3.0], [5.0]], np.float16), arr(6.0, np.float16)
    same(run_node("Sum", a, b, c), arr([[10.0, 11.0], [12.0, 13.0]], np.float16))
    same(run_node("Mean", a, b, c), arr([[10 / 3, 11 / 3], [4.0, 13 / 3]], np.float16))
    single = arr([1.0, 2.0])
    out = run_node("Sum", single)
    same(out, single)
    out[0] = 100  # not an alias of the input
    assert single[0] == 1.0


def test_variadic_requires_same_type():
    from reference.ops.math import max_

    with pytest.raises(TypeError, match="share one type"):
        max_(arr([1.0]), arr([1.0], np.float64))


# Clip ----------------------------------------------------------------------------------------


def test_clip_min_greater_than_max_gives_max():
    same(run_node("Clip", arr([-2.0, 0.0, 6.0]), arr(3.0), arr(1.0)), arr([1.0, 1.0, 1.0]))


def test_clip_optional_bounds_and_nan():
    x = arr([-5.0, np.nan, 5.0])
    same(run_node("Clip", x, None, arr(1.0)), arr([-5.0, np.nan, 1.0]))
    same(run_node("Clip", x, arr(-1.0)), arr([-1.0, np.nan, 5.0]))
    same(run_node("Clip", x), x)
    same(run_node("Clip", arr([-100, 100], np.int8), arr(-3, np.int8), arr(4, np.int8)),
         arr([-3, 4], np.int8))  # fmt: skip


def test_clip_attribute_forms():
    x = arr([-5.0, 0.5, 5.0])
    same(run_node("Clip", x, opset=6, min=-1.0, max=1.0), arr([-1.0, 0.5, 1.0]))
    same(run_node("Clip", x, opset=6, max=0.0), arr([-5.0, 0.0, 0.0]))
    same(run_node("Clip", x, opset=1, min=0.0), arr([0.0, 0.5, 5.0]))  # opset 1: no defaults
    same(run_node("Clip", x.astype(np.float16), opset=6), x.astype(np.float16))


def test_clip_bound_must_be_scalar():
    with pytest.raises(NodeError, match="scalar"):
        run_node("Clip", arr([1.0, 2.0]), arr([0.0, 1.0]))


# IsInf / IsNaN -------------------------------------------------------------------------------


def test_isinf_flags():
    x = arr([-np.inf, np.inf, np.nan, 1.0])
    same(run_node("IsInf", x), arr([True, True, False, False], bool))
    same(run_node("IsInf", x, detect_negative=0), arr([False, True, False, False], bool))
    same(run_node("IsInf", x, detect_positive=0), arr([True, False, False, False], bool))
    same(run_node("IsInf", x.astype(ml_dtypes.bfloat16)), arr([True, True, False, False], bool))


def test_isnan_narrow_types():
    x = arr([np.nan, 1.0, np.inf])
    for dtype in (np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn):
        inf_is_nan = dtype == ml_dtypes.float8_e4m3fn  # it has no infinity
        same(run_node("IsNaN", x.astype(dtype)), arr([True, False, inf_is_nan], bool))
    assert run_node("IsNaN", arr(np.nan)).shape == ()


# BitShift / Bitwise --------------------------------------------------------------------------


def test_bitshift_unsigned():
    same(run_node("BitShift", arr([200, 1, 3], np.uint8), arr([1, 7, 8], np.uint8),
                  direction="LEFT"),
         arr([144, 128, 0], np.uint8))  # fmt: skip
    same(run_node("BitShift", arr([16, 255], np.uint16), arr([2, 16], np.uint16),
                  direction="RIGHT"),
         arr([4, 0], np.uint16))  # fmt: skip
    big = arr([2**64 - 1, 2**63 + 1], np.uint64)  # exact, not through float64
    same(run_node("BitShift", big, arr([1, 64], np.uint64), direction="RIGHT"),
         arr([2**63 - 1, 0], np.uint64))  # fmt: skip


def test_bitshift_signed_opset28():
    x = arr([-8, -8, 8, -1, 64], np.int8)
    y = arr([1, 8, 9, -1, 1], np.int8)
    same(run_node("BitShift", x, y, direction="RIGHT"), arr([-4, -1, 0, -1, 32], np.int8))
    same(run_node("BitShift", x, y, direction="LEFT"), arr([-16, 0, 0, 0, -128], np.int8))


def test_bitwise_ops():
    a, b = arr([12, -1, 0], np.int8), arr([10, 5, -128], np.int8)
    same(run_node("BitwiseAnd", a, b), arr([8, 5, 0], np.int8))
    same(run_node("BitwiseOr", a, b), arr([14, -1, -128], np.int8))
    same(run_node("BitwiseXor", a, b), arr([6, -6, -128], np.int8))
    same(run_node("BitwiseNot", arr([0, 15], np.uint8)), arr([255, 240], np.uint8))
    same(run_node("BitwiseAnd", arr([[6], [3]], np.uint16), arr([5, 1], np.uint16)),
         arr([[4, 0], [1, 1]], np.uint16))  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("size", [1, 40])  # a scalar path and NumPy's vector loops
def test_max_and_min_of_signed_zeros_follow_ieee_754_2019(dtype, size):
    """Max(+0, -0) = +0 and Min(+0, -0) = -0 in either order (the fuzzer found np.maximum
    giving -0 or +0 by dtype and code path, and a Div after it turning that into -inf or +inf)."""
    a = np.tile(arr([0.0, -0.0, 0.0, -0.0, 2.0], dtype), size)
    b = np.tile(arr([-0.0, 0.0, 0.0, -0.0, 2.0], dtype), size)
    for x, y in ((a, b), (b, a)):
        mx, mn = run_node("Max", x, y), run_node("Min", x, y)
        assert list(np.signbit(mx[:5])) == [False, False, False, True, False]
        assert list(np.signbit(mn[:5])) == [True, True, False, True, False]
    three = run_node("Max", arr([-0.0], dtype), arr([-0.0], dtype), arr([0.0], dtype))
    assert not np.signbit(three[0])
