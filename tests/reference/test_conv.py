"""Conv, ConvTranspose, DeformConv, Col2Im against slow direct loops and hand-checked values."""
import itertools
from functools import partial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from reference import NodeError
from tests.reference.oneop import run_node

run = partial(run_node, opset=22)  # the opset these tests target unless one says otherwise


rng = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# slow, obviously-correct anchors -----------------------------------------------------------
def naive_conv(x, w, b, strides, pads, dilations, group):
    n, _c = x.shape[:2]
    m, cg = w.shape[:2]
    k = w.shape[2:]
    rank = len(k)
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(pads[i], pads[i + rank]) for i in range(rank)])
    out = [(xp.shape[2 + i] - (k[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(rank)]
    y = np.zeros((n, m, *out))
    mg = m // group
    for ni, mi in itertools.product(range(n), range(m)):
        g = mi // mg
        for o in itertools.product(*(range(v) for v in out)):
            acc = 0.0
            for ci in range(cg):
                for kk in itertools.product(*(range(v) for v in k)):
                    pos = tuple(o[i] * strides[i] + kk[i] * dilations[i] for i in range(rank))
                    acc += xp[(ni, g * cg + ci) + pos] * w[(mi, ci) + kk]
            y[(ni, mi) + o] = acc + (b[mi] if b is not None else 0)
    return y


def naive_conv_transpose(x, w, b, strides, pads, dilations, group, output_padding):
    n, c = x.shape[:2]
    cg, mg = c // group, w.shape[1]
    k = w.shape[2:]
    rank = len(k)
    ins = x.shape[2:]
    full = [strides[i] * (ins[i] - 1) + output_padding[i] + (k[i] - 1) * dilations[i] + 1
            for i in range(rank)]
    y = np.zeros((n, mg * group, *full))
    for ni, ci in itertools.product(range(n), range(c)):
        g = ci // cg
        for i in itertools.product(*(range(v) for v in ins)):
            for mi in range(mg):
                for kk in itertools.product(*(range(v) for v in k)):
                    pos = tuple(i[a] * strides[a] + kk[a] * dilations[a] for a in range(rank))
                    y[(ni, g * mg + mi) + pos] += x[(ni, ci) + i] * w[(ci, mi) + kk]
    crop = tuple(slice(pads[a], full[a] - pads[a + rank]) for a in range(rank))
    y = y[(slice(None), slice(None)) + crop]
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * rank)
    return y


# Conv ----------------------------------------------------------------------------------------
CONV_CASES = [
    # x shape, w shape, strides, pads, dilations, group
    ((2, 3, 11), (4, 3, 3), [2], [1, 2], [2], 1),
    ((2, 3, 5, 7), (4, 3, 2, 3), [1, 2], [1, 0, 2, 1], [2, 1], 1),
    ((1, 4, 6, 5), (6, 2, 3, 2), [2, 1], [0, 1, 1, 0], [1, 2], 2),        # grouped
    ((2, 6, 5, 7), (6, 1, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 6),        # depthwise
    ((1, 6, 5, 7), (12, 1, 3, 3), [2, 2], [0, 1, 2, 0], [1, 1], 6),       # depthwise, multiplier 2
    ((1, 2, 4, 5, 6), (3, 2, 2, 3, 2), [1, 2, 1], [1, 0, 0, 0, 1, 1], [1, 1, 2], 1),  # 3-D
]


@pytest.mark.parametrize("xs, ws, strides, pads, dilations, group", CONV_CASES)
def test_conv_matches_direct_loop(xs, ws, strides, pads, dilations, group):
    x, w, b = rand(*xs), rand(*ws), rand(ws[0])
    y = run("Conv", x, w, b, strides=strides, pads=pads, dilations=dilations, group=group)
    ref = naive_conv(x, w, b, strides, pads, dilations, group)
    assert y.dtype == np.float32 and y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_conv_hand_checked_1d():
    # x = [1, 2, 3, 4], w = [1, 10], pads [1, 0]: [0,1]->10, [1,2]->21, [2,3]->32, [3,4]->43
    x = np.array([[[1, 2, 3, 4]]], np.float32)
    w = np.array([[[1, 10]]], np.float32)
    np.testing.assert_array_equal(run("Conv", x, w, pads=[1, 0]), [[[10, 21, 32, 43]]])


@pytest.mark.parametrize("auto_pad, begin", [("SAME_UPPER", (1, 0)), ("SAME_LOWER", (2, 1))])
def test_conv_auto_pad_same_splits_odd_padding(auto_pad, begin):
    # H=7, k=4, s=1 -> total pad 3; W=6, k=3, s=2 -> out 3, total pad (3-1)*2+3-6 = 1
    x, w = rand(1, 2, 7, 6), rand(3, 2, 4, 3)
    y = run("Conv", x, w, auto_pad=auto_pad, strides=[1, 2])
    pads = [begin[0], begin[1], 3 - begin[0], 1 - begin[1]]
    np.testing.assert_allclose(y, naive_conv(x, w, None, [1, 2], pads, [1, 1], 1), rtol=1e-4, atol=1e-4)
    assert y.shape == (1, 3, 7, 3)


def test_conv_valid_ignores_pads_and_float64_kept():
    x, w = rand(1, 1, 5, 6, dtype=np.float64), rand(2, 1, 2, 2, dtype=np.float64)
    y = run("Conv", x, w, auto_pad="VALID")
    assert y.dtype == np.float64 and y.shape == (1, 2, 4, 5)
    np.testing.assert_allclose(y, naive_conv(x, w, None, [1, 1], [0] * 4, [1, 1], 1))


def test_conv_float16_dtype_preserved():
    x, w = rand(1, 2, 4, 5).astype(np.float16), rand(3, 2, 3, 3).astype(np.float16)
    y = run("Conv", x, w, pads=[1, 1, 1, 1])
    assert y.dtype == np.float16
    ref = naive_conv(x.astype(np.float64), w.astype(np.float64), None, [1, 1], [1] * 4, [1, 1], 1)
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=1e-2, atol=1e-2)


def test_conv_bad_group_is_an_error():
    with pytest.raises(NodeError, match="group"):
        run("Conv", rand(1, 4, 5, 5), rand(2, 3, 3, 3), group=2)


def test_conv_against_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    x, w, b = rand(2, 6, 9, 8), rand(4, 3, 3, 2), rand(4)
    attrs = {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2], "group": 2}
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info(n, 1, v.shape)
                                            for n, v in (("x", x), ("w", w), ("b", b))],
                              [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = sess.run(None, {"x": x, "w": w, "b": b})[0]
    np.testing.assert_allclose(run("Conv", x, w, b, **attrs), expected, rtol=1e-4, atol=1e-5)


# ConvTranspose -----------------------------------------------------------------------------
CT_CASES = [
    ((2, 3, 4), (3, 2, 3), [2], [1, 0], [1], 1, [1]),
    ((1, 2, 3, 4), (2, 3, 3, 2), [3, 2], [1, 2, 0, 1], [1, 2], 1, [1, 0]),
    ((2, 4, 3, 2), (4, 1, 2, 3), [1, 2], [0, 0, 1, 0], [2, 1], 2, [0, 1]),   # grouped
    ((1, 3, 3, 4), (3, 1, 3, 3), [2, 2], [1, 1, 1, 1], [1, 1], 3, [1, 1]),   # depthwise
    ((1, 2, 2, 3, 2), (2, 2, 2, 2, 3), [2, 1, 2], [0, 1, 0, 1, 0, 1], [1, 1, 1], 1, [1, 0, 0]),
]


@pytest.mark.parametrize("xs, ws, strides, pads, dilations, group, output_padding", CT_CASES)
def test_conv_transpose_matches_direct_loop(xs, ws, strides, pads, dilations, group, output_padding):
    x, w, b = rand(*xs), rand(*ws), rand(ws[1] * group)
    y = run("ConvTranspose", x, w, b, strides=strides, pads=pads, dilations=dilations,
            group=group, output_padding=output_padding)
    ref = naive_conv_transpose(x, w, b, strides, pads, dilations, group, output_padding)
    assert y.shape == ref.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_conv_transpose_hand_checked_1d():
    # x = [1, 2], w = [1, 10, 100], stride 2: [1, 10, 100+2, 20, 200]
    x = np.array([[[1, 2]]], np.float32)
    w = np.array([[[1, 10, 100]]], np.float32)
    np.testing.assert_array_equal(run("ConvTranspose", x, w, strides=[2]), [[[1, 10, 102, 20, 200]]])
    # output_padding adds one (zero) column at the end
    np.testing.assert_array_equal(run("ConvTranspose", x, w, strides=[2], output_padding=[1]),
                                  [[[1, 10, 102, 20, 200, 0]]])


def test_conv_transpose_output_shape_vs_output_padding():
    x, w = rand(1, 2, 3, 4), rand(2, 3, 3, 3)
    # full size: H 2*2+3 = 7, W 3*3+3 = 12; asking for 8 x 12 needs output_padding 1 on H
    by_padding = run("ConvTranspose", x, w, strides=[2, 3], output_padding=[1, 0])
    by_shape = run("ConvTranspose", x, w, strides=[2, 3], output_shape=[8, 12])
    assert by_padding.shape == by_shape.shape == (1, 3, 8, 12)
    np.testing.assert_allclose(by_shape, by_padding)
    # a smaller output_shape crops: total padding 7-6 = 1 on H goes to the start (NOTSET)
    cropped = run("ConvTranspose", x, w, strides=[2, 3], output_shape=[6, 12])
    ref = naive_conv_transpose(x, w, None, [2, 3], [1, 0, 0, 0], [1, 1], 1, [0, 0])
    np.testing.assert_allclose(cropped, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("auto_pad, pads", [("SAME_UPPER", [0, 1, 1, 1]), ("SAME_LOWER", [1, 1, 0, 1])])
def test_conv_transpose_auto_pad_same(auto_pad, pads):
    # out = in * stride: H 3*2 = 6 from full 7 (total 1), W 4*1 = 4 from full 6 (total 2)
    x, w = rand(1, 2, 3, 4), rand(2, 1, 3, 3)
    y = run("ConvTranspose", x, w, strides=[2, 1], auto_pad=auto_pad)
    assert y.shape == (1, 1, 6, 4)
    ref = naive_conv_transpose(x, w, None, [2, 1], pads, [1, 1], 1, [0, 0])
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


# Col2Im ------------------------------------------------------------------------------------
def test_col2im_sums_overlapping_blocks():
    # 1 channel, image 1x4, block 1x2, stride 1: blocks [a0 a1], [b0 b1], [c0 c1] -> a0, a1+b0, b1+c0, c1
    cols = np.array([[[1, 2, 3], [10, 20, 30]]], np.float32)  # (N, C*K, L): rows = kernel offsets
    y = run("Col2Im", cols, np.array([1, 4], np.int64), np.array([1, 2], np.int64), opset=18)
    np.testing.assert_array_equal(y, [[[[1, 12, 23, 30]]]])


def test_col2im_inverts_non_overlapping_im2col():
    x = rand(2, 3, 4, 6)
    # im2col with block 2x3, stride 2x3: (N, C*6, 2*2)
    blocks = x.reshape(2, 3, 2, 2, 2, 3).transpose(0, 1, 3, 5, 2, 4).reshape(2, 18, 4)
    y = run("Col2Im", blocks, np.array([4, 6], np.int64), np.array([2, 3], np.int64),
            strides=[2, 3], opset=18)
    np.testing.assert_array_equal(y, x)


def test_col2im_pads_and_dilations_match_loop():
    n, c, img, k, s, d, pads = 1, 2, (5, 4), (2, 2), (2, 1), (2, 1), [1, 0, 1, 1]
    out = [(img[i] + pads[i] + pads[i + 2] - (k[i] - 1) * d[i] - 1) // s[i] + 1 for i in range(2)]
    cols = rand(n, c * 4, out[0] * out[1])
    y = run("Col2Im", cols, np.array(img, np.int64), np.array(k, np.int64),
            strides=list(s), dilations=list(d), pads=pads, opset=18)
    ref = np.zeros((n, c, img[0] + 2, img[1] + 1))
    cv = cols.reshape(n, c, 2, 2, *out)
    for ci, ki, kj, oi, oj in itertools.product(range(c), range(2), range(2), range(out[0]), range(out[1])):
        ref[0, ci, oi * s[0] + ki * d[0], oj * s[1] + kj * d[1]] += cv[0, ci, ki, kj, oi, oj]
    np.testing.assert_allclose(y, ref[:, :, 1:6, 0:4], rtol=1e-5, atol=1e-6)


# DeformConv --------------------------------------------------------------------------------
def test_deform_conv_zero_offset_is_conv():
    x, w, b = rand(2, 4, 5, 6), rand(6, 2, 3, 2), rand(6)
    attrs = {"strides": [1, 2], "pads": [1, 0, 1, 1], "dilations": [2, 1], "group": 2}
    out = [(5 + 2 - 5) // 1 + 1, (6 + 1 - 2) // 2 + 1]
    offset = np.zeros((2, 2 * 3 * 2 * 2, *out), np.float32)
    y = run("DeformConv", x, w, offset, b, offset_group=2, opset=19, **attrs)
    np.testing.assert_allclose(y, run("Conv", x, w, b, **attrs), rtol=1e-5, atol=1e-5)


def test_deform_conv_integer_offset_shifts_and_mask_scales():
    x, w = rand(1, 1, 4, 5), rand(1, 1, 1, 1)
    # one kernel tap, offset (dy, dx) = (1, -1): y[i, j] = w * x[i+1, j-1] (zero outside)
    offset = np.zeros((1, 2, 4, 5), np.float32)
    offset[0, 0], offset[0, 1] = 1, -1
    mask = np.full((1, 1, 4, 5), 0.5, np.float32)
    y = run("DeformConv", x, w, offset, None, mask, opset=19)
    shifted = np.zeros_like(x)
    shifted[0, 0, :3, 1:] = x[0, 0, 1:, :4]
    np.testing.assert_allclose(y, 0.5 * w[0, 0, 0, 0] * shifted, rtol=1e-6)


def test_deform_conv_half_offset_interpolates():
    x = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    w = np.ones((1, 1, 1, 1), np.float32)
    offset = np.zeros((1, 2, 3, 4), np.float32)
    offset[0, 1] = 0.5  # halfway to the right neighbour: x + 0.5, except the last column (0 beyond)
    y = run("DeformConv", x, w, offset, opset=19)
    expected = x + 0.5
    expected[..., 3] = x[..., 3] * 0.5
    np.testing.assert_allclose(y, expected, rtol=1e-6)


def test_empty_batch_keeps_output_shape():
    y = run("Conv", np.zeros((0, 2, 5, 6), np.float32), rand(3, 2, 3, 3), pads=[1, 0, 1, 0])
    assert y.shape == (0, 3, 5, 4) and y.dtype == np.float32
    t = run("ConvTranspose", np.zeros((0, 2, 3, 4), np.float32), rand(2, 3, 2, 2), strides=[2, 2])
    assert t.shape == (0, 3, 6, 8)


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_conv_transpose_is_the_adjoint_of_conv(data):
    # <Conv(x), y> == <x, ConvTranspose(y)> for the same W, strides, pads, dilations, group
    rank = data.draw(st.integers(1, 3))
    group = data.draw(st.integers(1, 2))
    cg, mg = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
    kernel = [data.draw(st.integers(1, 3)) for _ in range(rank)]
    strides = [data.draw(st.integers(1, 3)) for _ in range(rank)]
    dilations = [data.draw(st.integers(1, 2)) for _ in range(rank)]
    pads = [data.draw(st.integers(0, 2)) for _ in range(2 * rank)]
    size = [data.draw(st.integers((k - 1) * d + 1, 6)) for k, d in zip(kernel, dilations)]
    # only shapes where every input cell is reached and the transpose recovers the input size
    out = [(size[i] + pads[i] + pads[i + rank] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1
           for i in range(rank)]
    opad = [size[i] + pads[i] + pads[i + rank] - ((out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1)
            for i in range(rank)]
    x = rand(2, cg * group, *size).astype(np.float64)
    w = rand(mg * group, cg, *kernel).astype(np.float64)
    y = run("Conv", x, w, strides=strides, pads=pads, dilations=dilations, group=group)
    r = rand(*y.shape).astype(np.float64)
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "group": group}
    if any(opad):
        if any(o >= max(s, d) for o, s, d in zip(opad, strides, dilations)):
            return  # output_padding must stay below stride/dilation
        attrs["output_padding"] = opad
    xt = run("ConvTranspose", r, w, **attrs)
    assert xt.shape == x.shape
    np.testing.assert_allclose((y * r).sum(), (x * xt).sum(), rtol=1e-9, atol=1e-9)


# Conv in float32: bitwise-equal filters give bitwise-equal channels ------------------------
_tie_rng = np.random.default_rng(7)


def test_identical_filters_give_bitwise_identical_channels():
    # a BLAS rounds rows by their place in its tiles; 64 equal filters over 32x3x3 inputs
    # come out one ulp apart without the tie (checked with OpenBLAS, 1 and 2 threads)
    x = _tie_rng.standard_normal((1, 32, 13, 13)).astype(np.float32) * 1e3
    w = np.broadcast_to(_tie_rng.standard_normal((1, 32, 3, 3)), (64, 32, 3, 3)).astype(np.float32)
    y = run("Conv", x, w, pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(y, np.broadcast_to(y[:, :1], y.shape))


def test_tied_filters_only_where_bitwise_equal():
    # rows 0/2 and 1/4 are twins; row 3 has the same values as row 1 in another order (equal
    # integer sums of the bits), so it must keep its own, different result
    a, b = _tie_rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    c = b.reshape(-1)[::-1].reshape(4, 3, 3).copy()
    w = np.stack([a, b, a, c, b] * 16)
    x = _tie_rng.standard_normal((2, 4, 9, 9)).astype(np.float32)
    y = run("Conv", x, w)
    np.testing.assert_array_equal(y[:, 0], y[:, 2])
    np.testing.assert_array_equal(y[:, 1], y[:, 4])
    exact = np.einsum("nchw,mc->nmhw",
                      np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (3, 3), axis=(2, 3))
                      .transpose(0, 1, 4, 5, 2, 3).reshape(2, 36, 7, 7),
                      w.reshape(80, 36).astype(np.float64))
    np.testing.assert_allclose(y, exact, rtol=1e-5, atol=1e-5)
    assert not np.allclose(y[:, 3], y[:, 1])


def test_equal_filters_in_different_groups_are_not_tied():
    # group g sees only its own input channels: equal filters there give different channels
    x = _tie_rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    w = np.ones((4, 2, 3, 3), np.float32)
    y = run("Conv", x, w, group=2)
    np.testing.assert_array_equal(y[:, 0], y[:, 1])
    np.testing.assert_allclose(y[:, 2], y[:, 3])
    windows = np.lib.stride_tricks.sliding_window_view
    expected = [windows(x[0, 2 * g:2 * g + 2].astype(np.float64), (3, 3), axis=(1, 2)).sum(axis=(0, 3, 4))
                for g in (0, 1)]
    np.testing.assert_allclose(y[0, 0], expected[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y[0, 2], expected[1], rtol=1e-5, atol=1e-5)
