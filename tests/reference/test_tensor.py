"""Shape ops: legacy attribute versions, negative axes, empty tensors, scalars, strings."""
from functools import partial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper

from reference import NodeError
from tests.reference.oneop import i64, run_node, same

run_outputs = partial(run_node, as_list=True)


X23 = np.arange(6, dtype=np.float32).reshape(2, 3)


# Concat, Constant, ConstantOfShape, Shape, Size -------------------------------------------------


def test_concat_negative_axis_and_empty_input():
    a, b = np.ones((2, 1), np.int32), np.zeros((2, 0), np.int32)
    same(run_node("Concat", a, b, a, axis=-1), np.array([[1, 1], [1, 1]], np.int32))


def test_concat_strings():
    a, b = np.array(["a"], dtype=object), np.array(["b", "c"], dtype=object)
    assert run_node("Concat", a, b, axis=0).tolist() == ["a", "b", "c"]


@pytest.mark.parametrize("attr, expected", [
    ({"value_float": 1.5}, np.array(1.5, np.float32)),
    ({"value_floats": [1.0, 2.0]}, np.array([1.0, 2.0], np.float32)),
    ({"value_int": 7}, np.array(7, np.int64)),
    ({"value_ints": [3, -4]}, np.array([3, -4], np.int64)),
])
def test_constant_value_attributes(attr, expected):
    same(run_node("Constant", **attr), expected)


def test_constant_string_attributes():
    out = run_node("Constant", value_string="héllo")
    assert out.shape == () and out.dtype == object and out[()] == "héllo"
    assert run_node("Constant", value_strings=["a", "b"]).tolist() == ["a", "b"]


def test_constant_sparse_value():
    sparse = helper.make_sparse_tensor(
        helper.make_tensor("v", TensorProto.FLOAT, [2], [5.0, 6.0]),
        helper.make_tensor("i", TensorProto.INT64, [2], [1, 4]),
        [2, 3],
    )
    out = run_node("Constant", sparse_value=sparse)
    same(out, np.array([[0, 5, 0], [0, 6, 0]], np.float32))


def test_constant_of_shape():
    same(run_node("ConstantOfShape", i64()), np.array(0.0, np.float32))  # empty shape: a scalar
    same(run_node("ConstantOfShape", i64(2, 0)), np.zeros((2, 0), np.float32))
    value = helper.make_tensor("v", TensorProto.INT32, [1], [7])
    same(run_node("ConstantOfShape", i64(2), value=value), np.array([7, 7], np.int32))


@pytest.mark.parametrize("start, end, expected", [
    (None, None, [2, 3, 4, 5]), (1, None, [3, 4, 5]), (-1, None, [5]), (None, -1, [2, 3, 4]),
    (-10, 10, [2, 3, 4, 5]), (3, 1, []),
])
def test_shape_start_end(start, end, expected):
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    same(run_node("Shape", np.zeros((2, 3, 4, 5), np.int8), **attrs), np.array(expected, np.int64))


def test_shape_and_size_of_scalar():
    same(run_node("Shape", np.array(1.0, np.float32)), np.zeros(0, np.int64))
    same(run_node("Size", np.array(1.0, np.float32)), np.array(1, np.int64))
    same(run_node("Size", np.zeros((3, 0), np.float32)), np.array(0, np.int64))


# Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Expand, Tile ---------------------------------


def test_reshape_zero_copies_and_minus_one_infers():
    same(run_node("Reshape", np.zeros((2, 3, 4)), i64(0, -1)), np.zeros((2, 12)))


def test_reshape_allowzero_keeps_zero_dims():
    x = np.zeros((0, 3), np.float32)
    same(run_node("Reshape", x, i64(3, 0), allowzero=1), np.zeros((3, 0), np.float32))
    with pytest.raises(NodeError):  # allowzero=0: the 0 copies dim 1 (3) -> 9 elements
        run_node("Reshape", np.zeros((2, 3), np.float32), i64(3, 0), allowzero=0)


def test_reshape_1_shape_attribute():
    same(run_node("Reshape", X23, shape=[3, -1], opset=1), X23.reshape(3, 2))


@pytest.mark.parametrize("axis, shape", [(0, (1, 24)), (1, (2, 12)), (3, (24, 1)), (-1, (6, 4)),
                                         (-2, (2, 12)), (-3, (1, 24))])
def test_flatten(axis, shape):
    x = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    same(run_node("Flatten", x, axis=axis), x.reshape(shape))


def test_squeeze_versions():
    x = np.zeros((1, 3, 1, 2), np.float32)
    assert run_node("Squeeze", x, i64(-2)).shape == (1, 3, 2)
    assert run_node("Squeeze", x).shape == (3, 2)
    assert run_node("Squeeze", x, axes=[0], opset=11).shape == (3, 1, 2)
    assert run_node("Squeeze", x, opset=1).shape == (3, 2)
    with pytest.raises(NodeError, match="size is not 1"):
        run_node("Squeeze", x, i64(1))


def test_unsqueeze_unsorted_negative_axes():
    x = np.zeros((3, 4), np.float32)
    assert run_node("Unsqueeze", x, i64(-1, 0)).shape == (1, 3, 4, 1)
    assert run_node("Unsqueeze", x, i64(3, 1)).shape == (3, 1, 4, 1)
    assert run_node("Unsqueeze", x, axes=[0, -1], opset=11).shape == (1, 3, 4, 1)
    assert run_node("Unsqueeze", np.array(5, np.int64), i64(0)).shape == (1,)


def test_transpose_default_reverses():
    x = np.arange(24).reshape(2, 3, 4)
    same(run_node("Transpose", x), x.T)
    same(run_node("Transpose", x, perm=[1, 0, 2]), x.transpose(1, 0, 2))


def test_expand_is_bidirectional():
    x = np.array([[1], [2]], np.int32)
    same(run_node("Expand", x, i64(1, 3)), np.array([[1, 1, 1], [2, 2, 2]], np.int32))
    assert run_node("Expand", x, i64(2, 1, 1)).shape == (2, 2, 1)


def test_tile_and_legacy_tile():
    x = np.array([[1, 2]], np.float32)
    same(run_node("Tile", x, i64(2, 2)), np.array([[1, 2, 1, 2], [1, 2, 1, 2]], np.float32))
    same(run_node("Tile", x, i64(3), i64(0), opset=1), np.array([[1, 2]] * 3, np.float32))


# Slice ---------------------------------------------------------------------------------------


def test_slice_negative_steps_and_clamping():
    x = np.arange(10, dtype=np.int32)
    big = np.iinfo(np.int64).max
    same(run_node("Slice", x, i64(-1), i64(-big), i64(0), i64(-1)), x[::-1])
    same(run_node("Slice", x, i64(8), i64(1), i64(0), i64(-3)), np.array([8, 5, 2], np.int32))
    same(run_node("Slice", x, i64(2), i64(big)), x[2:])
    same(run_node("Slice", x, i64(20), i64(30)), np.zeros(0, np.int32))


def test_slice_backward_from_below_minus_d_starts_at_index_0():
    """The spec clamps an adjusted start into [0, d-1] when stepping back, so start=-7 on d=5
    is index 0; Python's slicing would give nothing. Found by the fuzzer (tests/fuzz)."""
    x = np.arange(5, dtype=np.int32)
    same(run_node("Slice", x, i64(-7), i64(-6), i64(0), i64(-1)), np.array([0], np.int32))
    same(run_node("Slice", x, i64(-7), i64(-(2**63) + 1), i64(0), i64(-1)), np.array([0], np.int32))
    same(run_node("Slice", x, i64(9), i64(-9), i64(0), i64(-2)), np.array([4, 2, 0], np.int32))


def test_slice_axes_negative_and_subset():
    x = np.arange(24).reshape(2, 3, 4)
    same(run_node("Slice", x, i64(1), i64(3), i64(-1)), x[:, :, 1:3])
    same(run_node("Slice", x, i64(0, 1), i64(1, -1), i64(-2, 0), i64(1, 1)), x[1:-1, 0:1])


def test_slice_1_attributes():
    x = np.arange(12).reshape(3, 4)
    same(run_node("Slice", x, starts=[1], ends=[1000], axes=[1], opset=1), x[:, 1:])


def test_slice_zero_step_rejected():
    with pytest.raises(NodeError, match="steps"):
        run_node("Slice", np.arange(4), i64(0), i64(4), i64(0), i64(0))


# Split ---------------------------------------------------------------------------------------


def test_split_num_outputs_uneven():
    outs = run_outputs("Split", np.arange(7, dtype=np.float32), n_out=3, num_outputs=3, opset=18)
    assert [o.tolist() for o in outs] == [[0, 1, 2], [3, 4, 5], [6]]


def test_split_even_without_sizes_uses_output_count():
    outs = run_outputs("Split", X23, n_out=3, axis=-1, opset=13)
    assert [o.shape for o in outs] == [(2, 1)] * 3
    with pytest.raises(NodeError):
        run_outputs("Split", X23, n_out=2, axis=1, opset=13)


def test_split_sizes_by_version():
    x = np.arange(6, dtype=np.float32)
    expected = [[0.0], [1.0, 2.0, 3.0], [4.0, 5.0]]
    assert [o.tolist() for o in run_outputs("Split", x, n_out=3, split=[1, 3, 2],
                                            opset=2)] == expected
    assert [o.tolist() for o in run_outputs("Split", x, n_out=3, split=[1, 3, 2],
                                            opset=11)] == expected
    assert [o.tolist() for o in run_outputs("Split", x, i64(1, 3, 2), n_out=3, opset=1)] == expected
    assert [o.tolist() for o in run_outputs("Split", x, i64(1, 3, 2), n_out=3,
                                            opset=18)] == expected
    zero = run_outputs("Split", x, i64(0, 6), n_out=2, opset=13)
    assert zero[0].shape == (0,) and zero[1].shape == (6,)


# Pad, CenterCropPad ----------------------------------------------------------------------------


def test_pad_modes():
    x = np.array([[1, 2, 3], [4, 5, 6]], np.int64)
    pads = i64(0, 2, 0, 1)
    same(run_node("Pad", x, pads, mode="reflect"),
         np.array([[3, 2, 1, 2, 3, 2], [6, 5, 4, 5, 6, 5]]))
    same(run_node("Pad", x, pads, mode="edge"), np.array([[1, 1, 1, 2, 3, 3], [4, 4, 4, 5, 6, 6]]))
    same(run_node("Pad", x, pads, mode="wrap"), np.array([[2, 3, 1, 2, 3, 1], [5, 6, 4, 5, 6, 4]]))
    same(run_node("Pad", x, pads, np.array(9, np.int64)),
         np.array([[9, 9, 1, 2, 3, 9], [9, 9, 4, 5, 6, 9]]))


def test_pad_negative_crops_and_axes():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    # axis -1 (columns): remove 1 at the start, add 2 at the end.
    out = run_node("Pad", x, i64(-1, 2), None, i64(-1))
    same(out, np.concatenate([x[:, 1:], np.zeros((3, 2), np.float32)], axis=1))


def test_pad_strings_and_bool_default_value():
    s = run_node("Pad", np.array(["a"], dtype=object), i64(1, 1))
    assert s.tolist() == ["", "a", ""]
    same(run_node("Pad", np.array([True]), i64(1, 0)), np.array([False, True]))


def test_pad_legacy_attributes():
    x = np.array([[1.0, 2.0]], np.float32)
    same(run_node("Pad", x, pads=[0, 1, 0, 0], value=7.0, opset=2),
         np.array([[7, 1, 2]], np.float32))
    same(run_node("Pad", x, paddings=[1, 0, 0, 0], opset=1), np.array([[0, 0], [1, 2]], np.float32))
    same(run_node("Pad", x, pads=[0, 0, 0, 2], mode="edge", opset=2),
         np.array([[1, 2, 2, 2]], np.float32))


def test_center_crop_pad_odd_differences():
    x = np.arange(5, dtype=np.int32)
    # crop 5 -> 2: start rounded down (1); pad 5 -> 8: the extra zero goes right.
    same(run_node("CenterCropPad", x, i64(2)), np.array([1, 2], np.int32))
    same(run_node("CenterCropPad", x, i64(8)), np.array([0, 0, 1, 2, 3, 4, 0, 0], np.int32))
    y = np.ones((3, 4, 2), np.float32)
    out = run_node("CenterCropPad", y, i64(5, 1), axes=[-3, 1])
    assert out.shape == (5, 1, 2) and out[0].sum() == 0 and out[1:4].sum() == 6


# DepthToSpace, SpaceToDepth ----------------------------------------------------------------


def test_depth_to_space_modes_by_hand():
    x = np.arange(8, dtype=np.float32).reshape(1, 8, 1, 1)
    dcr = run_node("DepthToSpace", x, blocksize=2, mode="DCR")
    crd = run_node("DepthToSpace", x, blocksize=2, mode="CRD")
    # DCR: channel = (by*2+bx)*C + c; CRD: channel = c*4 + by*2 + bx (C = 2 output channels)
    same(dcr, np.array([[[[0, 2], [4, 6]], [[1, 3], [5, 7]]]], np.float32))
    same(crd, np.array([[[[0, 1], [2, 3]], [[4, 5], [6, 7]]]], np.float32))


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 2), c=st.integers(1, 3), h=st.integers(1, 3), w=st.integers(1, 3),
       bs=st.integers(1, 3), mode=st.sampled_from(["DCR", "CRD"]))
def test_space_to_depth_inverts_depth_to_space(b, c, h, w, bs, mode):
    x = np.random.default_rng(0).standard_normal((b, c, h * bs, w * bs)).astype(np.float32)
    y = run_node("SpaceToDepth", x, blocksize=bs, mode=mode)
    assert y.shape == (b, c * bs * bs, h, w)
    same(run_node("DepthToSpace", y, blocksize=bs, mode=mode), x)


# Range, EyeLike, Trilu ---------------------------------------------------------------------------


def test_range():
    same(run_node("Range", *(np.array(v, np.int32) for v in (10, 4, -3))),
         np.array([10, 7], np.int32))
    same(run_node("Range", *(np.array(v, np.float32) for v in (1, 2, 0.25))),
         np.array([1, 1.25, 1.5, 1.75], np.float32))
    same(run_node("Range", *(np.array(v, np.int64) for v in (5, 1, 1))), np.zeros(0, np.int64))


def test_range_float16_stash_type():
    # 2049 is not a float16: accumulating in float32 gives 2048 + 2*i then rounds back.
    args = [np.array(v, np.float16) for v in (2048, 2054, 2)]
    same(run_node("Range", *args, opset=27), np.array([2048, 2050, 2052], np.float16))


def test_eye_like():
    x = np.zeros((2, 4), np.int32)
    same(run_node("EyeLike", x, k=1), np.array([[0, 1, 0, 0], [0, 0, 1, 0]], np.int32))
    same(run_node("EyeLike", x, k=-1, dtype=TensorProto.BOOL),
         np.array([[0, 0, 0, 0], [1, 0, 0, 0]], bool))


def test_trilu_nonsquare_batched_with_k():
    x = np.arange(1, 13, dtype=np.int64).reshape(1, 3, 4)
    same(run_node("Trilu", x, np.array(1, np.int64)),
         np.array([[[0, 2, 3, 4], [0, 0, 7, 8], [0, 0, 0, 12]]]))
    same(run_node("Trilu", x, np.array(-1, np.int64), upper=0),
         np.array([[[0, 0, 0, 0], [5, 0, 0, 0], [9, 10, 0, 0]]]))


@settings(max_examples=25, deadline=None)
@given(x=hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=3, max_side=4),
                    elements=st.floats(-5, 5)), k=st.integers(-4, 4))
def test_trilu_upper_plus_strict_lower_is_input(x, k):
    upper = run_node("Trilu", x, np.array(k, np.int64), upper=1)
    lower = run_node("Trilu", x, np.array(k - 1, np.int64), upper=0)
    np.testing.assert_array_equal(upper + lower, x)


@settings(max_examples=25, deadline=None)
@given(x=hnp.arrays(np.int32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=5)),
       data=st.data())
def test_split_then_concat_is_identity(x, data):
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    n = data.draw(st.integers(1, 3))
    outs = run_outputs("Split", x, n_out=n, axis=axis, num_outputs=n, opset=18)
    same(run_node("Concat", *outs, axis=axis), x)


def test_concat_1_defaults_to_axis_1():
    a = np.ones((2, 1), np.float32)
    assert run_node("Concat", a, a, opset=1).shape == (2, 2)


def test_split_empty_split_input_counts_as_absent():
    outs = run_outputs("Split", np.arange(4, dtype=np.int64), np.zeros(0, np.int64), n_out=2,
                       opset=13)
    assert [o.tolist() for o in outs] == [[0, 1], [2, 3]]
