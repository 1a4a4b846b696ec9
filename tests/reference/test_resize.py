"""Resize, Upsample, GridSample, AffineGrid: hand-checked values for the tricky semantics."""
import numpy as np
import pytest

from tests.reference.oneop import run_node


def resize(x, scales=None, sizes=None, roi=None, opset=19, **attrs):
    def f32(v):
        return None if v is None else np.asarray(v, dtype=np.float32)
    sizes = None if sizes is None else np.asarray(sizes, dtype=np.int64)
    return run_node("Resize", x, f32(roi), f32(scales), sizes, opset=opset, **attrs)


ROW = np.arange(4, dtype=np.float32).reshape(1, 1, 1, 4)  # value == index: shows x_original


# ------------------------------------------------------------ coordinate transformations
@pytest.mark.parametrize("ctm, expected", [
    # (i + 0.5) / 2 - 0.5, clamped to [0, 3] by edge padding
    ("half_pixel", [0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3]),
    ("pytorch_half_pixel", [0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3]),
    # i * (4 - 1) / (8 - 1)
    ("align_corners", [0, 3 / 7, 6 / 7, 9 / 7, 12 / 7, 15 / 7, 18 / 7, 3]),
    # i / 2
    ("asymmetric", [0, 0.5, 1, 1.5, 2, 2.5, 3, 3]),
])
def test_coordinate_transforms_linear_upsample(ctm, expected):
    y = resize(ROW, scales=[1, 1, 1, 2], mode="linear", coordinate_transformation_mode=ctm)
    assert y.dtype == np.float32 and y.shape == (1, 1, 1, 8)
    np.testing.assert_allclose(y.ravel(), expected, rtol=1e-6)


def test_pytorch_half_pixel_single_output_is_zero():
    # length_resized == 1: pytorch_half_pixel samples x = 0, half_pixel samples (0.5)*4 - 0.5
    y = resize(ROW, sizes=[1, 1, 1, 1], mode="linear",
               coordinate_transformation_mode="pytorch_half_pixel")
    assert y.ravel().tolist() == [0.0]
    y = resize(ROW, sizes=[1, 1, 1, 1], mode="linear", coordinate_transformation_mode="half_pixel")
    assert y.ravel().tolist() == [1.5]


def test_half_pixel_symmetric():
    # in 3, scale 1.5: output width 4.5 -> 4, adjustment 8/9, offset 1.5 * (1/9) = 1/6
    # x = 1/6 + (i + 0.5) / 1.5 - 0.5 = [0, 2/3, 4/3, 2]: symmetric about the centre
    x = np.arange(3, dtype=np.float32).reshape(1, 1, 1, 3)
    y = resize(x, scales=[1, 1, 1, 1.5], mode="linear",
               coordinate_transformation_mode="half_pixel_symmetric")
    np.testing.assert_allclose(y.ravel(), [0, 2 / 3, 4 / 3, 2], rtol=1e-6, atol=1e-7)
    y = resize(x, scales=[1, 1, 1, 1.5], mode="linear", coordinate_transformation_mode="half_pixel")
    # half_pixel: (i + 0.5) / 1.5 - 0.5 = -1/6 (clamped to 0), 1/2, 7/6, 11/6
    np.testing.assert_allclose(y.ravel(), [0, 0.5, 7 / 6, 11 / 6], rtol=1e-6)


def test_align_corners_with_fractional_scale():
    # the resized length is in * scale = 2.4, not floor(2.4): x = i * 3 / 1.4
    y = resize(ROW, scales=[1, 1, 1, 0.6], mode="linear",
               coordinate_transformation_mode="align_corners")
    np.testing.assert_allclose(y.ravel(), [0, 3 / 1.4], rtol=1e-6)


def test_tf_crop_and_resize_roi_and_extrapolation():
    x = np.arange(5, dtype=np.float32).reshape(1, 5)
    # x = 0.25 * 4 + i * 0.5 * 4 / 2 = 1, 2, 3
    y = resize(x, sizes=[3], roi=[0.25, 0.75], axes=[1], mode="linear",
               coordinate_transformation_mode="tf_crop_and_resize")
    assert y.tolist() == [[1.0, 2.0, 3.0]]
    # roi [0.5, 1.5] over length 5: x = 2, 4, 6; 6 lies outside [0, 4]
    y = resize(x, sizes=[3], roi=[0.5, 1.5], axes=[-1], mode="linear",
               coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-7.0)
    assert y.tolist() == [[2.0, 4.0, -7.0]]


@pytest.mark.parametrize("nearest_mode, expected", [
    # asymmetric x = i / 2 = 0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5 (clamped to index 3)
    ("round_prefer_floor", [0, 0, 1, 1, 2, 2, 3, 3]),
    ("round_prefer_ceil", [0, 1, 1, 2, 2, 3, 3, 3]),
    ("floor", [0, 0, 1, 1, 2, 2, 3, 3]),
    ("ceil", [0, 1, 1, 2, 2, 3, 3, 3]),
])
def test_nearest_modes_at_halves(nearest_mode, expected):
    y = resize(ROW, sizes=[1, 1, 1, 8], mode="nearest", nearest_mode=nearest_mode,
               coordinate_transformation_mode="asymmetric")
    assert y.ravel().tolist() == expected


def test_nearest_mode_round_differs_from_floor_off_halves():
    # half_pixel x = (i + 0.5) * 4 / 3 - 0.5 = 0.1667, 1.5, 2.833
    y = resize(ROW, sizes=[1, 1, 1, 3], mode="nearest", nearest_mode="round_prefer_ceil")
    assert y.ravel().tolist() == [0, 2, 3]
    y = resize(ROW, sizes=[1, 1, 1, 3], mode="nearest", nearest_mode="floor")
    assert y.ravel().tolist() == [0, 1, 2]


# ------------------------------------------------------- every mode on a non-square 4-D input
N, C, H, W = 2, 3, 4, 5


def ramp():
    """x[n, c, h, w] = 1000 n + 100 c + 10 h + w: linear in h and w."""
    n, c, h, w = np.meshgrid(*map(np.arange, (N, C, H, W)), indexing="ij")
    return (1000 * n + 100 * c + 10 * h + w).astype(np.float32)


def test_linear_4d_non_square_reproduces_ramp():
    y = resize(ramp(), sizes=[7, 9], axes=[-2, -1], mode="linear",
               coordinate_transformation_mode="align_corners")
    assert y.shape == (N, C, 7, 9) and y.dtype == np.float32
    h = np.arange(7) * (H - 1) / 6
    w = np.arange(9) * (W - 1) / 8
    expected = (1000 * np.arange(N)[:, None, None, None] + 100 * np.arange(C)[None, :, None, None]
                + 10 * h[:, None] + w)
    np.testing.assert_allclose(y, expected, rtol=1e-6)


def test_nearest_4d_non_square_resizes_every_axis():
    # scales on all four axes, asymmetric floor: out[i] = in[floor(i / s)]
    y = resize(ramp(), scales=[1, 2, 0.5, 1.6], mode="nearest", nearest_mode="floor",
               coordinate_transformation_mode="asymmetric")
    assert y.shape == (2, 6, 2, 8)
    c = np.floor(np.arange(6) / 2)
    h = np.floor(np.arange(2) / 0.5)
    w = np.floor(np.arange(8) / np.float64(np.float32(1.6)))
    expected = (1000 * np.arange(2)[:, None, None, None] + 100 * c[None, :, None, None]
                + 10 * h[:, None] + w)
    np.testing.assert_array_equal(y, expected)


def test_cubic_4d_non_square_interior():
    # A = -0.5 reproduces linear functions; taps touch no edge for the interior points
    y = resize(ramp(), scales=[1, 1, 2, 2], mode="cubic", cubic_coeff_a=-0.5,
               coordinate_transformation_mode="asymmetric")
    assert y.shape == (N, C, 8, 10)
    hh, ww = np.arange(2, 5), np.arange(2, 6)  # x = h / 2 in [1, 2.5], taps -1..+2 in range
    expected = (1000 * np.arange(N)[:, None, None, None] + 100 * np.arange(C)[None, :, None, None]
                + 10 * (hh / 2)[:, None] + ww / 2)
    np.testing.assert_allclose(y[:, :, 2:5, 2:6], expected, rtol=1e-6)


def test_cubic_weights_at_half():
    # A = -0.75, t = 0.5: weights w(1.5) = A / 8 = -0.09375 and w(0.5) = 0.59375
    x = np.zeros((1, 1, 1, 6), dtype=np.float32)
    x[..., 2] = 1
    y = resize(x, scales=[1, 1, 1, 2], mode="cubic", coordinate_transformation_mode="asymmetric")
    # output 5 samples x = 2.5 (taps 1..4), output 3 samples x = 1.5 (taps 0..3)
    np.testing.assert_allclose(y[0, 0, 0, [3, 4, 5]], [0.59375, 1.0, 0.59375], rtol=1e-6)
    np.testing.assert_allclose(y[0, 0, 0, 1], -0.09375, rtol=1e-6)  # x = 0.5, taps -1..2


def test_cubic_exclude_outside_renormalises():
    # x = 0 (asymmetric): taps -1..2 with weights w(1), w(0), w(1), w(2) = 0, 1, 0, 0: no change
    # x = 0.5: taps -1, 0, 1, 2 -> tap -1 dropped, the rest renormalised
    x = np.array([[1.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    y = resize(x, scales=[1, 2], mode="cubic", exclude_outside=1,
               coordinate_transformation_mode="asymmetric")
    a = -0.75
    w_half, w_far = 0.59375, a / 8
    np.testing.assert_allclose(y[0, 1], w_half / (w_half + w_half + w_far), rtol=1e-6)
    y_edge = resize(x, scales=[1, 2], mode="cubic", coordinate_transformation_mode="asymmetric")
    np.testing.assert_allclose(y_edge[0, 1], w_far + w_half, rtol=1e-6)  # tap -1 clamps to 0


def test_linear_antialias_widens_the_filter():
    # scale 0.5 stretches the triangle to radius 2: x = 2.5 takes taps 1..4 weighted
    # (0.25, 0.75, 0.75, 0.25) / 2
    x = np.zeros((1, 8), dtype=np.float32)
    x[0, 3] = 1
    y = resize(x, scales=[1, 0.5], mode="linear", antialias=1)
    np.testing.assert_allclose(y.ravel(), [0, 0.375, 0.125, 0], atol=1e-7)
    y = resize(x, scales=[1, 0.5], mode="linear")  # plain: x = 2.5 mixes taps 2 and 3
    np.testing.assert_allclose(y.ravel(), [0, 0.5, 0, 0], atol=1e-7)


def test_keep_aspect_ratio_policy():
    x = np.zeros((1, 1, 4, 6), dtype=np.float32)
    y = resize(x, sizes=[2, 2], axes=[2, 3], keep_aspect_ratio_policy="not_larger")
    assert y.shape == (1, 1, 1, 2)  # scale min(1/2, 1/3): 4/3 -> 1, 6/3 -> 2
    y = resize(x, sizes=[2, 2], axes=[2, 3], keep_aspect_ratio_policy="not_smaller")
    assert y.shape == (1, 1, 2, 3)
    y = resize(x, sizes=[3, 3], axes=[3, 2], keep_aspect_ratio_policy="not_larger")
    assert y.shape == (1, 1, 2, 3)  # scale 1/2: round_int(2.0), round_int(3.0)


def test_output_size_floors_and_dtypes_are_kept():
    x = np.arange(20, dtype=np.float16).reshape(1, 1, 4, 5)
    y = resize(x, scales=[1, 1, 0.6, 0.6], mode="linear")
    assert y.shape == (1, 1, 2, 3) and y.dtype == np.float16
    u = np.array([[0, 255]], dtype=np.uint8)
    y = resize(u, sizes=[1, 4], mode="linear", coordinate_transformation_mode="align_corners")
    assert y.dtype == np.uint8 and y.tolist() == [[0, 85, 170, 255]]


def test_nearest_keeps_non_numeric_types():
    x = np.array([["a", "b"]], dtype=object)
    y = resize(x, scales=[1, 2], mode="nearest", coordinate_transformation_mode="asymmetric")
    assert y.tolist() == [["a", "a", "b", "b"]]


def test_scales_and_sizes_are_exclusive():
    with pytest.raises(Exception, match="scales"):
        resize(ROW, scales=[1, 1, 1, 2], sizes=[1, 1, 1, 8])
    with pytest.raises(Exception, match="scales"):
        resize(ROW)


def test_resize_11_empty_scales_means_sizes():
    y = run_node("Resize", ROW, np.zeros(0, np.float32), np.zeros(0, np.float32),
                 np.array([1, 1, 1, 2], np.int64), opset=11, mode="nearest")
    assert y.ravel().tolist() == [0.0, 2.0]  # half_pixel x = 0.5, 2.5 -> round down


def test_half_pixel_symmetric_needs_opset_19():
    with pytest.raises(Exception, match="half_pixel_symmetric"):
        resize(ROW, scales=[1, 1, 1, 2], opset=18,
               coordinate_transformation_mode="half_pixel_symmetric")


# --------------------------------------------------------------------- Resize-10, Upsample
def test_resize_10_and_upsample_nearest():
    x = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=np.float32).reshape(1, 1, 2, 4)
    scales = np.array([1, 1, 0.6, 0.6], dtype=np.float32)
    assert run_node("Resize", x, scales, opset=10).tolist() == [[[[1.0, 3.0]]]]
    up = np.array([1, 1, 2, 3], dtype=np.float32)
    expected = np.repeat(np.repeat(x, 2, axis=2), 3, axis=3)
    np.testing.assert_array_equal(run_node("Resize", x, up, opset=10), expected)
    np.testing.assert_array_equal(run_node("Upsample", x, up, opset=9), expected)
    np.testing.assert_array_equal(run_node("Upsample", x, opset=7, scales=[1.0, 1.0, 2.0, 3.0]),
                                  expected)


def test_upsample_linear_is_asymmetric():
    x = np.array([[1, 3]], dtype=np.float32)
    y = run_node("Upsample", x, np.array([1, 2], np.float32), opset=9, mode="linear")
    assert y.tolist() == [[1.0, 2.0, 3.0, 3.0]]


# ---------------------------------------------------------------------------- GridSample
def base_grid(h, w, align_corners):
    """Normalised pixel centres of an h x w image, as (x, y) pairs."""
    def axis(n):
        i = np.arange(n)
        return i * 2 / (n - 1) - 1 if align_corners else (2 * i + 1) / n - 1
    y, x = np.meshgrid(axis(h), axis(w), indexing="ij")
    return np.stack([x, y], axis=-1)[None].astype(np.float32)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_gridsample_identity_grid(mode, align_corners):
    x = np.random.default_rng(0).random((1, 3, 4, 5)).astype(np.float32)
    y = run_node("GridSample", x, base_grid(4, 5, align_corners), opset=22, mode=mode,
                 align_corners=align_corners)
    assert y.shape == (1, 3, 4, 5) and y.dtype == np.float32
    np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)


def test_gridsample_padding_modes():
    x = np.array([[[[1.0, 2.0, 3.0]]]], dtype=np.float32)  # W = 3, H = 1
    # align_corners=1, x = (g + 1) / 2 * (W - 1): g = 2 -> x = 3 (one past the last
    # centre), g = -2 -> x = -1
    grid = np.array([[[[2.0, 0.0], [-2.0, 0.0]]]], dtype=np.float32)
    ac = {"align_corners": 1, "mode": "linear"}
    assert run_node("GridSample", x, grid, opset=20, padding_mode="zeros",
                    **ac).ravel().tolist() == [0, 0]
    assert run_node("GridSample", x, grid, opset=20, padding_mode="border",
                    **ac).ravel().tolist() == [3, 1]
    # reflection about the corner centres: 3 -> 1 (value 2), -1 -> 1 (value 2)
    assert run_node("GridSample", x, grid, opset=20, padding_mode="reflection",
                    **ac).ravel().tolist() == [2, 2]
    # zeros padding blends with 0 halfway outside: g = 1.5 -> x = 2.5 -> 0.5 * 3
    half = np.array([[[[1.5, 0.0]]]], dtype=np.float32)
    assert run_node("GridSample", x, half, opset=20, **ac).ravel().tolist() == [1.5]


def test_gridsample_nearest_rounds_half_to_even():
    x = np.array([[[[10.0, 20.0, 30.0, 40.0]]]], dtype=np.float32)
    # align_corners=0, W=4: x = ((g + 1) * 4 - 1) / 2 = 0.5, 1.5, 2.5 -> 0, 2, 2
    grid = np.array([[[[-0.5, 0.0], [0.0, 0.0], [0.5, 0.0]]]], dtype=np.float32)
    y = run_node("GridSample", x, grid, opset=20, mode="nearest")
    assert y.ravel().tolist() == [10.0, 30.0, 30.0]


def test_gridsample_volumetric_and_16():
    x = np.arange(2 * 3 * 4, dtype=np.float64).reshape(1, 1, 2, 3, 4)
    # the grid lists (x, y, z): pick voxel z=1, y=2, x=3 with align_corners=1
    grid = np.array([1.0, 1.0, 1.0]).reshape(1, 1, 1, 1, 3)
    y = run_node("GridSample", x, grid, opset=20, align_corners=1)
    assert y.shape == (1, 1, 1, 1, 1) and y.ravel().tolist() == [23.0]
    x2 = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    g2 = np.array([[[[0.0, -1.0]]]], dtype=np.float32)  # x = 1, y = 0
    assert run_node("GridSample", x2, g2, opset=16, mode="bilinear",
                    align_corners=1).ravel().tolist() == [1.0]


# ---------------------------------------------------------------------------- AffineGrid
def test_affine_grid_identity_and_translation():
    theta = np.array([[[1, 0, 0], [0, 1, 0]], [[1, 0, 0.5], [0, 2, 0]]], dtype=np.float32)
    size = np.array([2, 1, 2, 3], dtype=np.int64)
    g = run_node("AffineGrid", theta, size, opset=20)
    assert g.shape == (2, 2, 3, 2) and g.dtype == np.float32
    xs, ys = [-2 / 3, 0, 2 / 3], [-0.5, 0.5]
    np.testing.assert_allclose(g[0, :, :, 0], [xs, xs], rtol=1e-6)
    np.testing.assert_allclose(g[0, :, :, 1], [[ys[0]] * 3, [ys[1]] * 3], rtol=1e-6)
    np.testing.assert_allclose(g[1, :, :, 0], np.array([xs, xs]) + 0.5, rtol=1e-6)
    np.testing.assert_allclose(g[1, :, :, 1], 2 * np.array([[ys[0]] * 3, [ys[1]] * 3]), rtol=1e-6)
    g = run_node("AffineGrid", theta[:1], np.array([1, 1, 2, 3], np.int64), opset=20,
                 align_corners=1)
    np.testing.assert_allclose(g[0, 0, :, 0], [-1, 0, 1])
