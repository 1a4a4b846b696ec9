"""Cast, CastLike, BitCast: strings, saturation, rounding, sub-byte types, version changes."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto as T

from tests.reference.oneop import run_node, same


def cast(x, to, opset=28, **attrs):
    return run_node("Cast", x, to=to, opset=opset, **attrs)


def f32(*v):
    return np.array(v, dtype=np.float32)


# strings -------------------------------------------------------------------------------------


def test_string_to_float_parses_specials_and_scientific():
    s = np.array(["1e-5", "INF", "-inf", "+INF", "NaN", "nan", "3.14", "1E8"], dtype=object)
    out = cast(s, T.FLOAT)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, f32(1e-5, np.inf, -np.inf, np.inf, np.nan, np.nan, 3.14, 1e8))


def test_string_to_integers_truncates_and_wraps():
    s = np.array(["100.5", "-7", "300", "-2.9"], dtype=object)
    same(cast(s, T.INT32), np.array([100, -7, 300, -2], np.int32))
    same(cast(s, T.INT8), np.array([100, -7, 44, -2], np.int8))
    same(cast(np.array(["18446744073709551615"], dtype=object), T.UINT64),
         np.array([2**64 - 1], np.uint64))


def test_numbers_to_string():
    out = cast(f32(0.1, 1 / 3, np.nan, np.inf, -np.inf, -2.5), T.STRING)
    assert out.dtype == object
    assert out.tolist() == ["0.1", "0.33333334", "NaN", "INF", "-INF", "-2.5"]
    assert cast(np.array([-3, 7], np.int64), T.STRING).tolist() == ["-3", "7"]
    assert cast(np.array([[True, False]]), T.STRING).tolist() == [["1", "0"]]


def test_string_round_trip_is_exact_for_float32():
    x = np.random.default_rng(1).standard_normal(50).astype(np.float32) * 1e6
    same(cast(cast(x, T.STRING), T.FLOAT), x)


# numeric rules ---------------------------------------------------------------------------------


def test_float_to_int_truncates_toward_zero_and_int_wraps():
    same(cast(f32(-2.7, 2.7, -0.5), T.INT32), np.array([-2, 2, 0], np.int32))
    same(cast(np.array([200, -129, 256], np.int16), T.INT8), np.array([-56, 127, 0], np.int8))
    same(cast(np.array([-1], np.int32), T.UINT16), np.array([65535], np.uint16))


def test_to_and_from_bool():
    same(cast(f32(0.0, -0.0, np.nan, 2.0), T.BOOL), np.array([False, False, True, True]))
    same(cast(np.array([True, False]), T.FLOAT16), np.array([1, 0], np.float16))
    same(cast(np.array([0, 36], np.int64), T.BOOL), np.array([False, True]))


def test_float_overflow_gives_infinity():
    same(cast(np.array([1e300, -1e300]), T.FLOAT), f32(np.inf, -np.inf))
    same(cast(np.array([65520.0], np.float32), T.FLOAT16), np.array([np.inf], np.float16))


# float 8 -------------------------------------------------------------------------------------


def test_float8_e4m3fn_saturation():
    x = f32(460, 470, 1e6, -np.inf, np.nan)
    sat = cast(x, T.FLOAT8E4M3FN)
    np.testing.assert_array_equal(sat.astype(np.float32), f32(448, 448, 448, -448, np.nan))
    raw = cast(x, T.FLOAT8E4M3FN, saturate=0)
    # 460 rounds (to nearest even) to 448; 470 rounds to 480, past the maximum: NaN.
    np.testing.assert_array_equal(raw.astype(np.float32), f32(448, np.nan, np.nan, np.nan, np.nan))


def test_float8_e5m2_and_fnuz():
    x = f32(1e6, -np.inf, -0.0)
    same(cast(x, T.FLOAT8E5M2).astype(np.float32), f32(57344, -57344, -0.0))
    same(cast(x, T.FLOAT8E5M2, saturate=0).astype(np.float32), f32(np.inf, -np.inf, -0.0))
    fnuz = cast(x, T.FLOAT8E4M3FNUZ).astype(np.float32)
    same(fnuz, f32(240, -240, 0.0))
    assert not np.signbit(fnuz[2])  # no negative zero in the fnuz types
    assert np.isnan(cast(f32(np.inf), T.FLOAT8E5M2FNUZ, saturate=0).astype(np.float32)).all()


@pytest.mark.parametrize("mode, expected", [
    ("up", [0.5, 0.5, 1.0, 2.0**-127, 2.0**127]),
    ("down", [0.25, 0.25, 1.0, 2.0**-127, 2.0**127]),
    ("nearest", [0.25, 0.5, 1.0, 2.0**-127, 2.0**127]),
])
def test_float8e8m0_round_modes_saturating(mode, expected):
    x = np.array([0.3, 0.4, 1.0, 0.0, np.inf], np.float32)
    out = cast(x, T.FLOAT8E8M0, round_mode=mode)
    assert out.dtype == np.dtype(ml_dtypes.float8_e8m0fnu)
    np.testing.assert_array_equal(out.astype(np.float64), expected)


def test_float8e8m0_without_saturation():
    x = np.array([0.0, np.inf, 2.0**-130, 3.0], np.float32)
    out = cast(x, T.FLOAT8E8M0, saturate=0, round_mode="nearest").astype(np.float64)
    np.testing.assert_array_equal(out, [np.nan, np.nan, np.nan, 4.0])


# sub-byte types and their version changes ----------------------------------------------------------


def test_int4_rounds_to_even_then_wraps_from_cast_24():
    x = f32(2.5, 3.5, -2.5, 8, 9, -9, 15)
    same(cast(x, T.INT4).astype(np.int8), np.array([2, 4, -2, -8, -7, 7, -1], np.int8))
    same(cast(x, T.UINT4).astype(np.int8), np.array([2, 4, 14, 8, 9, 7, 15], np.int8))
    same(cast(np.array([17, -1], np.int32), T.UINT4).astype(np.int8), np.array([1, 15], np.int8))


def test_int4_saturates_before_cast_24():
    x = f32(2.5, 8, 9, -9, 15)
    same(cast(x, T.INT4, opset=21).astype(np.int8), np.array([2, 7, 7, -8, 7], np.int8))
    same(cast(f32(-3, 20), T.UINT4, opset=21).astype(np.int8), np.array([0, 15], np.int8))


def test_int2():
    same(cast(f32(-3, -2, 1, 2), T.INT2).astype(np.int8), np.array([1, -2, 1, -2], np.int8))
    same(cast(np.array([-2, 1], np.int32).astype(ml_dtypes.int2), T.INT8), np.array([-2, 1], np.int8))


def test_float4e2m1():
    x = f32(5, 7, -100, 0.25, 0.75)
    same(cast(x, T.FLOAT4E2M1).astype(np.float32), f32(4, 6, -6, 0, 1))
    assert cast(f32(np.nan), T.FLOAT4E2M1, opset=23).astype(np.float32)[0] == 6
    assert cast(f32(np.nan), T.FLOAT4E2M1, opset=24).astype(np.float32)[0] == 0


def test_bfloat16_rounding_by_version():
    x = f32(0.48033667)
    assert cast(x, T.BFLOAT16, opset=24).astype(np.float32)[0] == 0.48046875  # nearest even
    assert cast(x, T.BFLOAT16, opset=13).astype(np.float32)[0] == 0.478515625  # truncated
    assert np.isnan(cast(f32(np.nan), T.BFLOAT16, opset=13).astype(np.float32)[0])


def test_cast_1_takes_a_type_name():
    same(run_node("Cast", f32(1.9, -1.9), to="INT32", opset=1), np.array([1, -1], np.int32))


def test_cast_like():
    like = np.zeros(0, np.float16)
    same(run_node("CastLike", np.array([1, 2], np.int64), like, opset=15),
         np.array([1, 2], np.float16))
    out = run_node("CastLike", f32(1000.0), np.zeros(1, ml_dtypes.float8_e4m3fn), saturate=0,
                   opset=19)
    assert np.isnan(out.astype(np.float32)[0])


@settings(max_examples=40, deadline=None)
@given(x=hnp.arrays(np.int64, st.integers(0, 6), elements=st.integers(-2**40, 2**40)))
def test_integer_narrowing_keeps_low_bits(x):
    same(cast(x, T.INT8), (((x + 128) % 256) - 128).astype(np.int8))
    same(cast(x, T.UINT16), (x % 65536).astype(np.uint16))


@settings(max_examples=40, deadline=None)
@given(x=hnp.arrays(np.float16, st.integers(0, 6), elements=st.floats(width=16, allow_nan=False)))
def test_widening_and_back_is_exact(x):
    same(cast(cast(x, T.DOUBLE), T.FLOAT16), x)


# BitCast ---------------------------------------------------------------------------------------


def test_bitcast_keeps_bits():
    same(run_node("BitCast", f32(1.0, -0.0), to=T.INT32, opset=26),
         np.array([0x3F800000, -(2**31)], np.int32))
    same(run_node("BitCast", np.array(-1, np.int16), to=T.UINT16, opset=26),
         np.array(65535, np.uint16))
    same(run_node("BitCast", np.array([True, False]), to=T.UINT8, opset=26),
         np.array([1, 0], np.uint8))


def test_bitcast_sub_byte():
    x = np.array([-1, -8, 7], np.int8).astype(ml_dtypes.int4)
    same(run_node("BitCast", x, to=T.UINT4, opset=26).astype(np.int16),
         np.array([15, 8, 7], np.int16))
    f4 = run_node("BitCast", np.array([2, 9], np.int8).astype(ml_dtypes.uint4), to=T.FLOAT4E2M1,
                  opset=26)
    # 0b0010 = 1.0; 0b1001 = -0.5
    np.testing.assert_array_equal(f4.astype(np.float32), f32(1.0, -0.5))


def test_bitcast_width_mismatch_is_an_error():
    from reference import NodeError

    with pytest.raises(NodeError, match="bit-width"):
        run_node("BitCast", f32(1.0), to=T.INT64, opset=26)
