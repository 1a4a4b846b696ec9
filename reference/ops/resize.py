"""Resizing and sampling: Resize, Upsample, GridSample, AffineGrid.

Resize is separable: each resized axis is interpolated on its own, by gathering a few taps
per output coordinate and summing them with per-coordinate weights.
"""
from __future__ import annotations

import numpy as np

from ..registry import op

# Resize-13 dropped tf_half_pixel_for_nn from its text, but the opset-13 corpus (onnx 1.9,
# 1.10: test_resize_downsample_sizes_nearest_tf_half_pixel_for_nn) still uses it.
_MODES_11 = {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
             "tf_half_pixel_for_nn", "tf_crop_and_resize"}
_MODES_19 = _MODES_11 | {"half_pixel_symmetric"}


# ---------------------------------------------------------------- coordinate transforms
def _original_coords(out_len, in_len, scale, ctm, roi=(0.0, 1.0), length_resized=None):
    """x_original for every x_resized in [0, out_len), per coordinate_transformation_mode.

    `length_resized` is in_len * scale, which is fractional when it comes from `scales`.
    """
    x = np.arange(out_len, dtype=np.float64)
    if length_resized is None:
        length_resized = in_len * scale
    if ctm == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if ctm == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / length_resized)
        return offset + (x + 0.5) / scale - 0.5
    if ctm == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if length_resized > 1 else np.zeros_like(x)
    if ctm == "align_corners":
        if length_resized == 1:
            return np.zeros_like(x)
        return x * (in_len - 1) / (length_resized - 1)
    if ctm == "asymmetric":
        return x / scale
    if ctm == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    if ctm == "tf_crop_and_resize":
        start, end = roi
        if out_len > 1:
            return start * (in_len - 1) + x * (end - start) * (in_len - 1) / (out_len - 1)
        return np.full_like(x, 0.5 * (start + end) * (in_len - 1))
    raise ValueError(f"unknown coordinate_transformation_mode {ctm!r}")


def _round_nearest(x, nearest_mode):
    if nearest_mode == "round_prefer_floor":
        return np.ceil(x - 0.5)
    if nearest_mode == "round_prefer_ceil":
        return np.floor(x + 0.5)
    if nearest_mode == "floor":
        return np.floor(x)
    if nearest_mode == "ceil":
        return np.ceil(x)
    raise ValueError(f"unknown nearest_mode {nearest_mode!r}")


# ------------------------------------------------------------------------------ kernels
def _linear_kernel(d):
    return np.clip(1 - np.abs(d), 0, None)


def _cubic_kernel(d, a):
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _taps(x, in_len, mode, scale, cubic_coeff_a, exclude_outside, antialias):
    """Input indices (out, T) and weights (out, T) that interpolate at coordinates x."""
    support = 1.0 if mode == "linear" else 2.0
    # antialias stretches the filter by 1/scale when downsampling
    stretch = min(scale, 1.0) if antialias else 1.0
    radius = support / stretch
    offsets = np.arange(int(np.floor(-radius)) + 1, int(np.ceil(radius)) + 1)
    base = np.floor(x)
    idx = base[:, None].astype(np.int64) + offsets
    d = (idx - x[:, None]) * stretch
    w = _linear_kernel(d) if mode == "linear" else _cubic_kernel(d, cubic_coeff_a)
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
    total = w.sum(axis=1, keepdims=True)
    w = w / np.where(total == 0, 1, total)
    return np.clip(idx, 0, in_len - 1), w


def _resize_axis(data, axis, out_len, scale, roi, length_resized, *, mode, ctm, nearest_mode,
                 cubic_coeff_a, exclude_outside, extrapolation_value, antialias,
                 nearest_rule=None):
    in_len = data.shape[axis]
    x = _original_coords(out_len, in_len, scale, ctm, roi, length_resized)
    moved = np.moveaxis(data, axis, -1)
    if mode == "nearest":
        rounded = nearest_rule(x, scale) if nearest_rule else _round_nearest(x, nearest_mode)
        idx = np.clip(rounded, 0, in_len - 1).astype(np.int64)
        out = moved[..., idx]
    elif mode in ("linear", "cubic"):
        idx, w = _taps(x, in_len, mode, scale, cubic_coeff_a, exclude_outside, antialias)
        out = np.einsum("...ot,ot->...o", moved[..., idx], w)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    if ctm == "tf_crop_and_resize":
        outside = (x < 0) | (x > in_len - 1)
        if outside.any():
            out = np.where(outside, np.asarray(extrapolation_value).astype(out.dtype), out)
    return np.moveaxis(out, -1, axis)


def _interpolate(x, out_shape, scales, rois, mode, sized=False, **kw):
    """Resize x to out_shape axis by axis; scales/rois hold one entry per axis.

    With `sized` the output lengths are the exact resized lengths, else in_len * scale is.
    """
    # nearest only gathers, so it keeps any dtype; the filters compute in float64
    y = x if mode == "nearest" else x.astype(np.float64)
    for axis, (n, s, roi) in enumerate(zip(out_shape, scales, rois)):
        identity = n == x.shape[axis] and s == 1 and (
            kw.get("ctm") != "tf_crop_and_resize" or tuple(roi) == (0.0, 1.0))
        if not identity:
            length = n if sized else None
            y = _resize_axis(y, axis, n, s, roi, length, mode=mode, **kw)
    if y.dtype != x.dtype:
        if np.issubdtype(x.dtype, np.integer):  # integers: round to nearest, saturate
            info = np.iinfo(x.dtype)
            y = np.clip(np.rint(y), info.min, info.max)
        y = y.astype(x.dtype)
    return y


# ------------------------------------------------------------------------------- Resize
def _resize(X, roi, scales, sizes, *, mode, coordinate_transformation_mode, nearest_mode,
            cubic_coeff_a, exclude_outside, extrapolation_value, antialias=0, axes=None,
            keep_aspect_ratio_policy="stretch", allowed_ctm=_MODES_19):
    ctm = coordinate_transformation_mode
    if ctm not in allowed_ctm:
        raise ValueError(f"coordinate_transformation_mode {ctm!r} is not valid in this opset")
    if antialias and mode == "nearest":
        antialias = 0  # antialias only applies to linear and cubic
    r = X.ndim
    axes = list(range(r)) if axes is None else [a + r if a < 0 else a for a in axes]
    if any(not 0 <= a < r for a in axes):
        raise ValueError(f"axes {axes} out of range for rank {r}")
    if scales is not None and scales.size == 0:
        scales = None
    if sizes is not None and sizes.size == 0:
        sizes = None
    if (scales is None) == (sizes is None):
        raise ValueError("exactly one of 'scales' and 'sizes' must be given")
    k = len(axes)
    full_roi = [(0.0, 1.0)] * r
    if roi is not None and roi.size and ctm == "tf_crop_and_resize":
        roi = np.asarray(roi, dtype=np.float64).reshape(-1)
        if roi.size != 2 * k:
            raise ValueError(f"roi has {roi.size} values, expected {2 * k}")
        for i, a in enumerate(axes):
            full_roi[a] = (roi[i], roi[k + i])
    in_shape = X.shape
    out_shape = list(in_shape)
    full_scales = [1.0] * r
    if scales is not None:
        scales = np.asarray(scales, dtype=np.float32).astype(np.float64).reshape(-1)
        if scales.size != k:
            raise ValueError(f"scales has {scales.size} values, expected {k}")
        if np.any(scales <= 0):
            raise ValueError(f"scales must be positive, got {scales.tolist()}")
        for i, a in enumerate(axes):
            lo, hi = full_roi[a]
            out_shape[a] = int(np.floor(in_shape[a] * (hi - lo) * scales[i]))
            full_scales[a] = float(scales[i])
    else:
        sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
        if sizes.size != k:
            raise ValueError(f"sizes has {sizes.size} values, expected {k}")
        if keep_aspect_ratio_policy == "stretch":
            for i, a in enumerate(axes):
                out_shape[a] = int(sizes[i])
        elif keep_aspect_ratio_policy in ("not_larger", "not_smaller"):
            ratios = [sizes[i] / in_shape[a] for i, a in enumerate(axes)]
            s = min(ratios) if keep_aspect_ratio_policy == "not_larger" else max(ratios)
            for a in axes:
                out_shape[a] = int(np.floor(s * in_shape[a] + 0.5))
        else:
            raise ValueError(f"unknown keep_aspect_ratio_policy {keep_aspect_ratio_policy!r}")
        for a in axes:
            full_scales[a] = out_shape[a] / in_shape[a] if in_shape[a] else 1.0
    return _interpolate(
        X, out_shape, full_scales, full_roi, mode, sizes is not None, ctm=ctm,
        nearest_mode=nearest_mode, cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
        extrapolation_value=extrapolation_value, antialias=antialias)


def _legacy_nearest(x, scale):
    # Resize-10/Upsample: truncate when upsampling, ceil when downsampling (the opset-10
    # corpus: scales 0.6 on [1,2,3,4] give [1,3])
    return np.ceil(x) if scale < 1 else np.floor(x)


def _resize_legacy(X, scales, mode):
    if mode not in ("nearest", "linear", "bilinear"):
        raise ValueError(f"unknown mode {mode!r}")
    scales = np.asarray(scales, dtype=np.float32).astype(np.float64).reshape(-1)
    if scales.size != X.ndim:
        raise ValueError(f"scales has {scales.size} values, expected rank {X.ndim}")
    out_shape = [int(np.floor(n * s)) for n, s in zip(X.shape, scales)]
    return _interpolate(
        X, out_shape, scales.tolist(), [(0.0, 1.0)] * X.ndim,
        "linear" if mode == "bilinear" else mode, ctm="asymmetric", nearest_mode=None,
        cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, antialias=0,
        nearest_rule=_legacy_nearest)


@op("Resize", 10)
def resize_10(X, scales, *, mode="nearest"):
    return _resize_legacy(X, scales, mode)


@op("Resize", 11)
def resize_11(X, roi, scales, sizes=None, **attrs):
    return _resize(X, roi, scales, sizes, allowed_ctm=_MODES_11, **attrs)


@op("Resize", 13)  # roi and scales become optional
@op("Resize", 18)  # adds axes, antialias, keep_aspect_ratio_policy
def resize_13(X, roi=None, scales=None, sizes=None, **attrs):
    return _resize(X, roi, scales, sizes, allowed_ctm=_MODES_11, **attrs)


@op("Resize", 19)
def resize_19(X, roi=None, scales=None, sizes=None, **attrs):
    return _resize(X, roi, scales, sizes, allowed_ctm=_MODES_19, **attrs)


# ----------------------------------------------------------------------------- Upsample
@op("Upsample", 1)
def upsample_1(X, *, height_scale, width_scale, mode="nearest"):
    if X.ndim != 4:
        raise ValueError(f"Upsample-1 takes a 4-D input, got rank {X.ndim}")
    return _resize_legacy(X, [1.0, 1.0, height_scale, width_scale], mode)


@op("Upsample", 7)
def upsample_7(X, *, scales, mode="nearest"):
    return _resize_legacy(X, scales, mode)


@op("Upsample", 9)
def upsample_9(X, scales, *, mode="nearest"):
    return _resize_legacy(X, scales, mode)


# --------------------------------------------------------------------------- GridSample
def _denormalize(g, n, align_corners):
    return (g + 1) / 2 * (n - 1) if align_corners else ((g + 1) * n - 1) / 2


def _reflect(x, lo, hi):
    span = hi - lo
    if span <= 0:
        return np.zeros_like(x)
    x = np.abs(x - lo)
    flips = np.floor(x / span)
    extra = x - flips * span
    return np.where(flips % 2 == 0, lo + extra, hi - extra)


def _pad_coords(x, n, padding_mode, align_corners):
    """Bring coordinates into range for the border and reflection padding modes."""
    if padding_mode == "border":
        return np.clip(x, 0, n - 1)
    if padding_mode == "reflection":
        if align_corners:
            return _reflect(x, 0.0, n - 1.0)
        return np.clip(_reflect(x, -0.5, n - 0.5), 0, n - 1)
    return x


def _grid_sample(X, grid, mode, padding_mode, align_corners):
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError(f"unknown padding_mode {padding_mode!r}")
    r = X.ndim - 2
    if grid.ndim != r + 2 or grid.shape[-1] != r or grid.shape[0] != X.shape[0]:
        raise ValueError(f"grid shape {grid.shape} does not match input shape {X.shape}")
    spatial = X.shape[2:]
    out_spatial = grid.shape[1:-1]
    g = grid.astype(np.float64)
    taps_idx, taps_w = [], []
    for d in range(r):
        n = spatial[d]
        # grid vectors list the innermost dimension first
        x = _denormalize(g[..., r - 1 - d], n, align_corners)
        if mode == "nearest":
            x = _pad_coords(x, n, padding_mode, align_corners)
            idx = np.rint(x)[..., None]
            w = np.ones_like(idx)
        elif mode == "linear":
            x = _pad_coords(x, n, padding_mode, align_corners)
            base = np.floor(x)
            idx = base[..., None] + np.arange(2)
            w = _linear_kernel(idx - x[..., None])
        elif mode == "cubic":
            base = np.floor(x)
            idx = base[..., None] + np.arange(-1, 3)
            w = _cubic_kernel(idx - x[..., None], -0.75)
            # cubic pads each tap, not the sampling point
            idx = np.rint(_pad_coords(idx, n, padding_mode, align_corners))
        else:
            raise ValueError(f"unknown mode {mode!r}")
        ok = (idx >= 0) & (idx <= n - 1)
        taps_idx.append(np.clip(idx, 0, n - 1).astype(np.int64))
        taps_w.append(np.where(ok, w, 0.0))
    batch = np.arange(X.shape[0]).reshape((-1,) + (1,) * r)
    if mode == "nearest":
        # a plain gather keeps every type exact (strings, bools, int64)
        index = tuple(t[..., 0] for t in taps_idx)
        inside = np.prod([w[..., 0] for w in taps_w], axis=0).astype(bool)
        picked = np.moveaxis(X, 1, -1)[(batch, *index)]
        zero = "" if X.dtype == object else np.zeros((), dtype=X.dtype)
        out = np.where(inside[..., None], picked, zero)
        return np.moveaxis(out, -1, 1).astype(X.dtype)
    data = X.astype(np.complex128 if np.iscomplexobj(X) else np.float64)
    out = np.zeros((X.shape[0], *tuple(out_spatial), X.shape[1]), dtype=data.dtype)
    channels_last = np.moveaxis(data, 1, -1)
    for combo in np.ndindex(*[t.shape[-1] for t in taps_idx]):
        index = tuple(t[..., c] for t, c in zip(taps_idx, combo))
        weight = np.prod([w[..., c] for w, c in zip(taps_w, combo)], axis=0)
        out += channels_last[(batch, *index)] * weight[..., None]
    return np.moveaxis(out, -1, 1).astype(X.dtype)


@op("GridSample", 16)
def grid_sample_16(X, grid, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    if X.ndim != 4:
        raise ValueError(f"GridSample-16 takes a 4-D input, got rank {X.ndim}")
    modes = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
    if mode not in modes:
        raise ValueError(f"unknown mode {mode!r}")
    return _grid_sample(X, grid, modes[mode], padding_mode, align_corners)


@op("GridSample", 20)
def grid_sample_20(X, grid, *, align_corners=0, mode="linear", padding_mode="zeros"):
    return _grid_sample(X, grid, mode, padding_mode, align_corners)


# --------------------------------------------------------------------------- AffineGrid
@op("AffineGrid", 20)
def affine_grid(theta, size, *, align_corners=0):
    size = [int(s) for s in np.asarray(size).reshape(-1)]
    spatial = size[2:]
    r = len(spatial)
    if r not in (2, 3) or theta.shape[1:] != (r, r + 1):
        raise ValueError(f"theta shape {theta.shape} does not match size {size}")
    axes = []
    for n in spatial:
        i = np.arange(n, dtype=np.float64)
        if align_corners:
            axes.append(i * 2 / (n - 1) - 1 if n > 1 else np.zeros(1))
        else:
            axes.append((2 * i + 1) / n - 1)
    # homogeneous positions (x, y[, z], 1), x running over the innermost dimension
    mesh = np.meshgrid(*axes, indexing="ij")
    base = np.stack([*mesh[::-1], np.ones(spatial)], axis=-1)
    grid = np.einsum("...k,nck->n...c", base, theta.astype(np.float64))
    return grid.astype(theta.dtype)
