"""Quantization: rounding, saturation per target type, granularities, integer matmul/conv."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto

from reference.dtypes import np_dtype
from tests.reference.oneop import op_function

Q, DQ = op_function("QuantizeLinear"), op_function("DequantizeLinear")
f32 = np.float32


# rounding and saturation -----------------------------------------------------------------
def test_rounds_half_to_even_before_adding_the_zero_point():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999], f32)
    y = Q(x, f32(1), np.array(0, np.int8))
    assert y.dtype == np.int8 and y.tolist() == [0, 2, 2, 0, -2, -2, 2]
    # round(2.5) + 1 = 3, not round(3.5) = 4
    assert Q(np.array([2.5], f32), f32(1), np.array(1, np.uint8)).tolist() == [3]


@pytest.mark.parametrize(
    "elem, lo, hi",
    [
        (TensorProto.UINT8, 0, 255),
        (TensorProto.INT8, -128, 127),
        (TensorProto.UINT16, 0, 65535),
        (TensorProto.INT16, -32768, 32767),
        (TensorProto.UINT4, 0, 15),
        (TensorProto.INT4, -8, 7),
        (TensorProto.UINT2, 0, 3),
        (TensorProto.INT2, -2, 1),
    ],
)
def test_integer_targets_saturate_at_their_limits(elem, lo, hi):
    x = np.array([-1e6, lo - 0.6, lo, hi, hi + 0.6, 1e6], f32)
    y = Q(x, f32(1), output_dtype=elem)
    assert y.astype(np.int64).tolist() == [lo, lo, lo, hi, hi, hi]
    assert y.dtype == np_dtype(elem)


def test_default_target_is_uint8():
    y = Q(np.array([-3.0, 300.0], f32), f32(2))
    assert y.dtype == np.uint8 and y.tolist() == [0, 150]


@pytest.mark.parametrize(
    "dtype, big, unsaturated",
    [
        (ml_dtypes.float8_e4m3fn, 448, np.nan),
        (ml_dtypes.float8_e4m3fnuz, 240, np.nan),
        (ml_dtypes.float8_e5m2, 57344, np.inf),
        (ml_dtypes.float8_e5m2fnuz, 57344, np.nan),
    ],
)
def test_float8_saturate_flag(dtype, big, unsaturated):
    zp = np.array(0, dtype)
    x = np.array([1e9, -np.inf, np.nan, 3.0], f32)
    y = Q(x, f32(1), zp).astype(np.float64)
    assert y[0] == big and y[1] == -big and np.isnan(y[2]) and y[3] == 3
    y = Q(x, f32(1), zp, saturate=0).astype(np.float64)
    if np.isnan(unsaturated):
        assert np.isnan(y[0]) and np.isnan(y[1])
    else:
        assert y[0] == np.inf and y[1] == -np.inf


def test_float4_always_saturates_and_rounds_to_even():
    zp = np.array(0, ml_dtypes.float4_e2m1fn)
    x = np.array([100, -100, 2.5, 5.0, 0.25], f32)  # e2m1 values: 0 0.5 1 1.5 2 3 4 6
    for saturate in (0, 1):
        y = Q(x, f32(1), zp, saturate=saturate).astype(np.float64)
        assert y.tolist() == [6, -6, 2, 4, 0]


def test_precision_of_the_division_follows_the_scale_type_unless_given():
    x = np.array([2049.0], f32)  # not representable in float16: rounds to 2048 there
    scale = np.array(1, np.float16)
    assert Q(x, scale, output_dtype=TensorProto.INT16).tolist() == [2048]
    assert Q(x, scale, output_dtype=TensorProto.INT16, precision=TensorProto.FLOAT).tolist() == [
        2049
    ]


def test_output_dtype_must_agree_with_the_zero_point():
    with pytest.raises(ValueError, match="output_dtype"):
        Q(np.zeros(2, f32), f32(1), np.array(0, np.uint8), output_dtype=TensorProto.INT8)


# granularity -----------------------------------------------------------------------------
def test_per_axis_with_negative_axis_on_rank_3():
    x = np.ones((2, 3, 2), f32) * 6
    y = Q(x, np.array([1, 2, 3], f32), np.array([0, 10, 20], np.uint8), axis=-2)
    assert y[:, :, 0].tolist() == [[6, 13, 22], [6, 13, 22]]
    with pytest.raises(ValueError, match="per-axis"):
        Q(x, np.array([1, 2], f32), axis=-2)


def test_blocked_with_a_block_that_does_not_divide_the_axis():
    # axis 1 has 5 elements, block 2: blocks [0,1], [2,3], [4] -> 3 scales per row
    x = np.array([[2, 4, 6, 8, 10], [-2, -4, -6, -8, -10]], f32)
    scale = np.array([[1, 2, 5], [2, 4, 10]], f32)
    zp = np.array([[0, 1, 2], [3, 4, 5]], np.int8)
    y = Q(x, scale, zp, axis=1, block_size=2)
    # row 1: -1, -2, rint(-1.5) = -2, -2, -1 plus zero points 3, 3, 4, 4, 5
    assert y.tolist() == [[2, 4, 4, 5, 4], [2, 1, 2, 2, 4]]
    back = DQ(y, scale, zp, axis=1, block_size=2)
    assert back.dtype == np.float32
    assert back.tolist() == [[2, 4, 6, 8, 10], [-2, -4, -8, -8, -10]]
    with pytest.raises(ValueError, match="block_size"):
        Q(x, scale[:, :2], axis=1, block_size=2)


def test_blocked_along_axis_0_of_int4():
    x = np.array([[1], [2], [3]], ml_dtypes.int4)
    scale = np.array([[0.5], [2.0]], f32)
    zp = np.array([[1], [-1]], ml_dtypes.int4)
    y = DQ(x, scale, zp, axis=0, block_size=2)
    assert y.tolist() == [[0.0], [0.5], [8.0]]


# DequantizeLinear ------------------------------------------------------------------------
def test_dequantize_output_type_and_zero_point():
    x = np.array([0, 128, 255], np.uint8)
    y = DQ(x, np.array(0.5, np.float16), np.array(128, np.uint8))
    assert y.dtype == np.float16 and y.tolist() == [-64, 0, 63.5]
    y = DQ(x, f32(2), output_dtype=TensorProto.BFLOAT16)
    assert y.dtype == ml_dtypes.bfloat16 and y.astype(f32).tolist() == [0, 256, 510]
    y = DQ(np.array([1 << 20], np.int32), f32(0.25))
    assert y.tolist() == [262144.0]


def test_dequantize_float8_and_float4_inputs():
    y = DQ(np.array([1.5, -448], ml_dtypes.float8_e4m3fn), f32(2))
    assert y.dtype == np.float32 and y.tolist() == [3, -896]
    y = DQ(np.array([6, -0.5], ml_dtypes.float4_e2m1fn), f32(1))
    assert y.tolist() == [6, -0.5]


@settings(max_examples=50, deadline=None)
@given(
    hnp.arrays(np.int8, hnp.array_shapes(max_dims=3, max_side=5)),
    st.floats(0.0009765625, 1024.0, width=32),
    st.integers(-128, 127),
)
def test_quantize_inverts_dequantize_on_representable_values(q, scale, zero_point):
    zp = np.array(zero_point, np.int8)
    x = DQ(q, f32(scale), zp)
    np.testing.assert_array_equal(Q(x, f32(scale), zp), q)


# DynamicQuantizeLinear -------------------------------------------------------------------
def test_dynamic_quantize_range_includes_zero():
    y, scale, zp = op_function("DynamicQuantizeLinear")(np.array([-51, 0, 204], f32))
    assert scale.dtype == np.float32 and scale.shape == () and scale == 1
    assert zp.dtype == np.uint8 and zp.shape == () and zp == 51
    assert y.tolist() == [0, 51, 255]
    y, scale, zp = op_function("DynamicQuantizeLinear")(np.array([[2, 4], [6, 10.2]], f32))
    assert scale == np.float32(10.2) / np.float32(255) and zp == 0 and y.shape == (2, 2)
    assert y[1, 1] == 255


def test_dynamic_quantize_all_zero_input():
    y, scale, zp = op_function("DynamicQuantizeLinear")(np.zeros((2, 3), f32))
    assert y.tolist() == [[0] * 3] * 2 and scale == 0 and zp == 0


# integer matmul / conv -------------------------------------------------------------------
def test_matmul_integer_per_row_and_per_column_zero_points():
    a = np.array([[1, 2], [3, 4], [5, 6]], np.uint8)
    b = np.array([[1, 0, 2], [0, 1, 3]], np.int8)
    y = op_function("MatMulInteger")(a, b, np.array([1, 3, 5], np.uint8),
                                     np.array([0, 1, 2], np.int8))
    # a - zp_row = [[0,1],[0,1],[0,1]]; b - zp_col = [[1,-1,0],[0,0,1]]
    assert y.dtype == np.int32 and y.tolist() == [[0, 0, 1]] * 3


def test_qlinear_matmul_per_column_scale_and_saturation():
    a = np.array([[10, 20]], np.uint8)
    b = np.array([[1, 2], [1, 2]], np.int8)
    y = op_function("QLinearMatMul")(
        a,
        f32(0.5),
        np.array(0, np.uint8),
        b,
        np.array([1.0, 100.0], f32),
        np.array(0, np.int8),
        f32(1),
        np.array(-100, np.int8),
    )
    # real = [15, 3000]; 15 - 100 = -85; 3000 saturates at 127
    assert y.dtype == np.int8 and y.tolist() == [[-85, 127]]


CONV = op_function("ConvInteger")


def test_conv_integer_pads_with_the_zero_point():
    x = np.full((1, 1, 3, 3), 5, np.uint8)
    y = CONV(x, np.ones((1, 1, 2, 2), np.uint8), np.array(5, np.uint8), pads=[1, 1, 1, 1])
    assert y.dtype == np.int32 and y.shape == (1, 1, 4, 4) and not y.any()


def test_conv_integer_1d_stride_dilation_padding():
    x = np.array([[[1, 2, 3, 4, 5]]], np.int8)
    w = np.array([[[1, 0, -1]]], np.int8)
    assert CONV(x, w, dilations=[2]).tolist() == [[[-4]]]
    assert CONV(x, w, dilations=[2], strides=[2], pads=[2, 2]).tolist() == [[[-3, -4, 3]]]


def test_conv_integer_auto_pad_same_upper_and_lower():
    x = np.array([[[1, 2, 3, 4]]], np.uint8)
    w = np.ones((1, 1, 2), np.uint8)
    assert CONV(x, w, auto_pad="SAME_UPPER").tolist() == [[[3, 5, 7, 4]]]
    assert CONV(x, w, auto_pad="SAME_LOWER").tolist() == [[[1, 3, 5, 7]]]


def test_conv_integer_groups_and_per_channel_weight_zero_point():
    x = np.array([[[[1, 2]], [[3, 4]]]], np.uint8)  # N=1, C=2, 1x2
    w = np.array([[[[2]]], [[[5]]]], np.uint8)  # M=2, C/group=1, 1x1
    y = CONV(x, w, None, np.array([1, 2], np.uint8), group=2)
    assert y.tolist() == [[[[1, 2]], [[9, 12]]]]


def test_qlinear_conv_bias_and_per_channel_scales():
    x = np.array([[[[10, 20]]]], np.uint8)  # N=1, C=1, 1x2
    w = np.array([[[[1]]], [[[2]]]], np.int8)  # M=2, 1x1
    bias = np.array([4, -40], np.int32)
    y = op_function("QLinearConv")(
        x,
        f32(0.5),
        np.array(0, np.uint8),
        w,
        np.array([1.0, 0.25], f32),
        np.array([0, 0], np.int8),
        f32(1),
        np.array(3, np.uint8),
        bias,
    )
    # channel 0: (10+4, 20+4) * 0.5 = 7, 12; channel 1: (20-40, 40-40) * 0.125 = -2.5 -> -2, 0
    assert y.dtype == np.uint8 and y.tolist() == [[[[10, 15]], [[1, 3]]]]
