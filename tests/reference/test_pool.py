"""Pools against slow direct loops and hand-checked values."""
import itertools
import math
from functools import partial

import numpy as np
import pytest
from onnx import helper

from reference import NodeError
from tests.reference.oneop import run_node

run = partial(run_node, opset=22)  # the opset these tests target unless one says otherwise


rng = np.random.default_rng(1)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def naive_pool(x, kind, kernel, strides, pads, dilations, ceil_mode=0, count_include_pad=0, p=2):
    """Direct loop over output cells; returns (values, flat argmax index into x) for 'max'."""
    rank = len(kernel)
    sp = x.shape[2:]
    out = []
    for i in range(rank):
        span = sp[i] + pads[i] + pads[i + rank] - (kernel[i] - 1) * dilations[i] - 1
        o = (math.ceil if ceil_mode else math.floor)(span / strides[i]) + 1
        if ceil_mode and (o - 1) * strides[i] >= sp[i] + pads[i]:
            o -= 1
        out.append(o)
    y = np.zeros(x.shape[:2] + tuple(out))
    idx = np.zeros(y.shape, np.int64)
    for n, c in itertools.product(range(x.shape[0]), range(x.shape[1])):
        for o in itertools.product(*(range(v) for v in out)):
            vals, where, inside_pads = [], [], 0
            for kk in itertools.product(*(range(v) for v in kernel)):
                pos = [o[i] * strides[i] - pads[i] + kk[i] * dilations[i] for i in range(rank)]
                if all(0 <= pos[i] < sp[i] for i in range(rank)):
                    vals.append(x[(n, c) + tuple(pos)])
                    where.append(np.ravel_multi_index((n, c) + tuple(pos), x.shape))
                elif all(-pads[i] <= pos[i] < sp[i] + pads[i + rank] for i in range(rank)):
                    inside_pads += 1
            if kind == "max":
                j = int(np.argmax(vals))
                y[(n, c) + o], idx[(n, c) + o] = vals[j], where[j]
            elif kind == "avg":
                y[(n, c) + o] = sum(vals) / (len(vals) + (inside_pads if count_include_pad else 0))
            else:
                y[(n, c) + o] = sum(abs(v) ** p for v in vals) ** (1 / p)
    return y, idx


POOL_CASES = [
    # x shape, kernel, strides, pads, dilations, ceil_mode
    ((2, 3, 9), [3], [2], [1, 2], [1], 0),
    ((2, 3, 5, 7), [2, 3], [2, 1], [1, 0, 0, 2], [1, 2], 0),
    ((1, 2, 6, 5), [3, 2], [2, 2], [0, 1, 1, 0], [1, 1], 1),
    ((1, 2, 7, 8), [2, 2], [3, 3], [1, 1, 0, 1], [2, 1], 1),
    ((1, 2, 4, 5, 3), [2, 3, 2], [1, 2, 1], [0, 1, 1, 1, 0, 0], [1, 1, 1], 0),
]


@pytest.mark.parametrize("xs, kernel, strides, pads, dilations, ceil_mode", POOL_CASES)
def test_max_pool_values_and_indices(xs, kernel, strides, pads, dilations, ceil_mode):
    x = rand(*xs)
    y, i = run("MaxPool", x, n_out=2, kernel_shape=kernel, strides=strides, pads=pads,
               dilations=dilations, ceil_mode=ceil_mode)
    ref, ref_idx = naive_pool(x, "max", kernel, strides, pads, dilations, ceil_mode)
    assert y.shape == ref.shape and y.dtype == np.float32 and i.dtype == np.int64
    np.testing.assert_array_equal(y, ref.astype(np.float32))
    np.testing.assert_array_equal(i, ref_idx)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("xs, kernel, strides, pads, dilations, ceil_mode", POOL_CASES)
def test_average_pool(xs, kernel, strides, pads, dilations, ceil_mode, count_include_pad):
    x = rand(*xs)
    y = run("AveragePool", x, kernel_shape=kernel, strides=strides, pads=pads,
            dilations=dilations, ceil_mode=ceil_mode, count_include_pad=count_include_pad)
    ref, _ = naive_pool(x, "avg", kernel, strides, pads, dilations, ceil_mode, count_include_pad)
    assert y.shape == ref.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(p):
    x = rand(2, 3, 5, 6)
    y = run("LpPool", x, kernel_shape=[2, 3], strides=[1, 2], pads=[1, 0, 0, 1], p=p, dilations=[2, 1])
    ref, _ = naive_pool(x, "lp", [2, 3], [1, 2], [1, 0, 0, 1], [2, 1], p=p)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_average_pool_hand_checked_count_include_pad():
    x = np.array([[[1, 2, 3]]], np.float32)
    # windows of 2 over [pad, 1, 2, 3, pad] with stride 2: [pad,1], [2,3]
    np.testing.assert_allclose(run("AveragePool", x, kernel_shape=[2], strides=[2], pads=[1, 1]),
                               [[[1, 2.5]]])
    np.testing.assert_allclose(run("AveragePool", x, kernel_shape=[2], strides=[2], pads=[1, 1],
                                   count_include_pad=1), [[[0.5, 2.5]]])


def test_max_pool_ceil_mode_drops_window_starting_in_padding():
    # size 4, k 2, s 2, pads [0, 1]: ceil((4+1-2)/2)+1 = 3 windows, the third would start at 4 = size
    x = np.array([[[1, 5, 3, 4]]], np.float32)
    y = run("MaxPool", x, kernel_shape=[2], strides=[2], pads=[0, 1], ceil_mode=1)
    np.testing.assert_array_equal(y, [[[5, 4]]])
    # without end padding, ceil mode keeps a partial window: size 5
    x5 = np.array([[[1, 5, 3, 4, 9]]], np.float32)
    np.testing.assert_array_equal(run("MaxPool", x5, kernel_shape=[2], strides=[2], ceil_mode=1),
                                  [[[5, 4, 9]]])


@pytest.mark.parametrize("auto_pad, expected", [
    ("SAME_UPPER", [[[5, 4, 9]]]),   # pad 1 at the end: [1 5] [3 4] [9 pad]
    ("SAME_LOWER", [[[1, 5, 9]]]),   # pad 1 at the start: [pad 1] [5 3] [4 9]
    ("VALID", [[[5, 4]]]),
])
def test_max_pool_auto_pad(auto_pad, expected):
    x = np.array([[[1, 5, 3, 4, 9]]], np.float32)
    np.testing.assert_array_equal(run("MaxPool", x, kernel_shape=[2], strides=[2], auto_pad=auto_pad),
                                  expected)


def test_max_pool_storage_order_column_major():
    x = rand(2, 3, 4, 5)
    _, row = run("MaxPool", x, n_out=2, kernel_shape=[2, 2], strides=[2, 2])
    _, col = run("MaxPool", x, n_out=2, kernel_shape=[2, 2], strides=[2, 2], storage_order=1)
    # same cell: (n, c, h, w) -> row major n*60 + c*20 + h*5 + w, column major n*60 + c*20 + w*4 + h
    nc, hw = np.divmod(row, 20)
    h, w = np.divmod(hw, 5)
    np.testing.assert_array_equal(col, nc * 20 + w * 4 + h)


def test_max_pool_int8_and_float16_dtypes():
    x = np.array([[[[-128, -5], [-7, -100]]]], np.int8)
    y = run("MaxPool", x, kernel_shape=[2, 2], pads=[1, 1, 0, 0])
    np.testing.assert_array_equal(y, [[[[-128, -5], [-7, -5]]]])
    assert y.dtype == np.int8
    h = rand(1, 1, 4, 4).astype(np.float16)
    assert run("AveragePool", h, kernel_shape=[2, 2]).dtype == np.float16


def test_max_unpool_inverts_max_pool():
    x = np.abs(rand(2, 3, 4, 6)) + 0.1  # positive, so the zeros MaxUnpool adds never win
    y, i = run("MaxPool", x, n_out=2, kernel_shape=[2, 2], strides=[2, 2])
    u = run("MaxUnpool", y, i, kernel_shape=[2, 2], strides=[2, 2])
    assert u.shape == x.shape
    np.testing.assert_array_equal(u, np.where(u != 0, x, 0))
    assert np.count_nonzero(u) == y.size
    np.testing.assert_array_equal(run("MaxPool", u, kernel_shape=[2, 2], strides=[2, 2]), y)


def test_global_pools():
    x = rand(2, 3, 4, 5)
    np.testing.assert_allclose(run("GlobalAveragePool", x), x.mean(axis=(2, 3), keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(run("GlobalMaxPool", x), x.max(axis=(2, 3), keepdims=True))
    np.testing.assert_allclose(run("GlobalLpPool", x, p=3),
                               (np.abs(x) ** 3).sum(axis=(2, 3), keepdims=True) ** (1 / 3), rtol=1e-5)


def test_max_roi_pool_hand_checked():
    x = np.arange(2 * 1 * 4 * 6, dtype=np.float32).reshape(2, 1, 4, 6)
    # batch 1, box x 1..4, y 0..3 (inclusive, 4x4 cells), 2x2 bins: max at each bin's bottom-right
    rois = np.array([[1, 1, 0, 4, 3]], np.float32)
    y = run("MaxRoiPool", x, rois, pooled_shape=[2, 2])
    b = x[1, 0]
    np.testing.assert_array_equal(y, [[[[b[1, 2], b[1, 4]], [b[3, 2], b[3, 4]]]]])


def test_roi_align_constant_image_and_dtype():
    x = np.full((2, 3, 6, 5), 7.0, np.float32)
    rois = np.array([[0.5, 0.5, 3.2, 4.1], [1, 1, 2, 3]], np.float32)
    y = run("RoiAlign", x, rois, np.array([1, 0], np.int64), output_height=3, output_width=2)
    assert y.shape == (2, 3, 3, 2) and y.dtype == np.float32
    np.testing.assert_allclose(y, 7.0, rtol=1e-6)
    ym = run("RoiAlign", x, rois, np.array([1, 0], np.int64), mode="max", output_height=3, output_width=2)
    assert ym.shape == (2, 3, 3, 2)


def test_roi_align_linear_image_half_pixel():
    # x[h, w] = w: the avg of bilinear samples is the mean sample x-coordinate
    x = np.tile(np.arange(8, dtype=np.float32), (1, 1, 6, 1))
    rois = np.array([[2.0, 1.0, 6.0, 5.0]], np.float32)
    y = run("RoiAlign", x, rois, np.array([0], np.int64), output_height=1, output_width=2,
            sampling_ratio=2, coordinate_transformation_mode="half_pixel")
    # x range [1.5, 5.5]: bins [1.5, 3.5], [3.5, 5.5]; samples 2, 3 and 4, 5
    np.testing.assert_allclose(y, [[[[2.5, 4.5]]]], rtol=1e-6)
    y10 = run("RoiAlign", x, rois, np.array([0], np.int64), output_height=1, output_width=2,
              sampling_ratio=2, opset=10)
    # opset 10 (output_half_pixel): range [2, 6], samples 2.5, 3.5 and 4.5, 5.5
    np.testing.assert_allclose(y10, [[[[3.0, 5.0]]]], rtol=1e-6)


def test_roi_align_against_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    x = rand(2, 3, 7, 9)
    rois = np.array([[0.3, 1.2, 6.1, 5.5], [2.0, 0.0, 8.5, 6.9], [-1.0, -1.0, 3.0, 2.0]], np.float32)
    bi = np.array([1, 0, 1], np.int64)
    for mode in ("avg",):
        attrs = {"output_height": 3, "output_width": 4, "sampling_ratio": 0, "spatial_scale": 0.9, "mode": mode}
        node = helper.make_node("RoiAlign", ["x", "r", "b"], ["y"], **attrs)
        graph = helper.make_graph([node], "t", [
            helper.make_tensor_value_info("x", 1, x.shape), helper.make_tensor_value_info("r", 1, rois.shape),
            helper.make_tensor_value_info("b", 7, bi.shape)], [helper.make_tensor_value_info("y", 1, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
        model.ir_version = 8
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        expected = sess.run(None, {"x": x, "r": rois, "b": bi})[0]
        np.testing.assert_allclose(run("RoiAlign", x, rois, bi, opset=16, **attrs), expected,
                                   rtol=1e-4, atol=1e-5)


def test_pool_without_kernel_shape_is_an_error():
    with pytest.raises(NodeError, match="kernel_shape"):
        run("AveragePool", rand(1, 1, 3, 3), kernel_shape=[2], strides=[1, 1])


def test_empty_tensors():
    y, i = run("MaxPool", np.zeros((0, 2, 5, 4), np.float32), kernel_shape=[2, 2], n_out=2)
    assert y.shape == i.shape == (0, 2, 4, 3)
    assert run("AveragePool", np.zeros((2, 0, 5, 4), np.float32), kernel_shape=[3, 1]).shape == (2, 0, 3, 4)
    assert run("GlobalMaxPool", np.zeros((0, 3, 2), np.float32)).shape == (0, 3, 1)
