"""Pooling: Average/Max/Lp pools, their Global forms, MaxRoiPool, MaxUnpool, RoiAlign."""
from __future__ import annotations

import numpy as np

from ..registry import op
from .conv import out_geometry, pad_spatial, spatial_attrs, window_offsets, windows


def _geometry(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    if not kernel_shape:
        raise ValueError("kernel_shape is required")
    rank = x.ndim - 2
    kernel, strides, dilations, pads = spatial_attrs(rank, kernel_shape, strides, dilations, pads)
    begin, end, out = out_geometry(x.shape[2:], kernel, strides, dilations, pads, auto_pad, ceil_mode)
    return kernel, strides, dilations, begin, end, out


def _reduce_windows(ufunc, xp, out, kernel, strides, dilations):
    """ufunc-reduce every window of xp (already padded), one kernel offset at a time."""
    acc = None
    for _, view in window_offsets(xp, out, kernel, strides, dilations):
        if acc is None:
            acc = view.copy()
        else:
            ufunc(acc, view, out=acc)
    return acc


def _acc_dtype(dtype):
    return np.float64 if dtype == np.float64 else np.float32


@op("AveragePool", 1)
def average_pool(x, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                 kernel_shape=None, pads=None, strides=None):
    kernel, strides, dilations, begin, end, out = _geometry(
        x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    rank = len(kernel)
    ct = _acc_dtype(x.dtype)
    xp = pad_spatial(x.astype(ct, copy=False), begin, end, out, kernel, strides, dilations, 0)
    total = _reduce_windows(np.add, xp, out, kernel, strides, dilations)
    # divisor: input cells in each window, plus the explicit/auto pads when count_include_pad;
    # the extra cells ceil_mode adds past the end padding never count
    counted = np.ones(x.shape[2:], dtype=ct)
    if count_include_pad:
        counted = np.pad(counted, list(zip(begin, end)), constant_values=1)
        zero = [0] * rank
        counted = pad_spatial(counted, zero, zero, out, kernel, strides, dilations, 0)
    else:
        counted = pad_spatial(counted, begin, end, out, kernel, strides, dilations, 0)
    count = _reduce_windows(np.add, counted, out, kernel, strides, dilations)
    return (total / count).astype(x.dtype, copy=False)


def _lowest(dtype):
    if np.issubdtype(dtype, np.integer):
        return np.iinfo(dtype).min
    return -np.inf


@op("MaxPool", 1)
def max_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None,
             storage_order=0, strides=None, ctx):
    kernel, strides, dilations, begin, end, out = _geometry(
        x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    rank = len(kernel)
    xp = pad_spatial(x, begin, end, out, kernel, strides, dilations, _lowest(x.dtype))
    y = _reduce_windows(np.maximum, xp, out, kernel, strides, dilations)
    if ctx.n_outputs < 2 or not ctx.outputs[1]:
        return y
    v = windows(xp, out, kernel, strides, dilations)
    # Indices: position of the (first) maximum, flattened over the unpadded input
    n, c = x.shape[:2]
    flat = v.reshape(*v.shape[: 2 + rank], int(np.prod(kernel)))
    arg = np.argmax(flat, axis=-1)
    koff = np.unravel_index(arg, kernel)
    spatial = x.shape[2:]
    index = np.zeros(arg.shape, dtype=np.int64)
    coords = []
    for a in range(rank):
        shape = [1] * (2 + rank)
        shape[2 + a] = out[a]
        start = (np.arange(out[a]) * strides[a] - begin[a]).reshape(shape)
        coords.append(start + koff[a] * dilations[a])
    order = range(rank) if not storage_order else reversed(range(rank))
    for a in order:
        index = index * spatial[a] + coords[a]
    nc = (np.arange(n)[:, None] * c + np.arange(c)[None, :]) * int(np.prod(spatial))
    index = index + nc.reshape((n, c) + (1,) * rank)
    return y, index


@op("LpPool", 1)
def lp_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2,
            pads=None, strides=None):
    kernel, strides, dilations, begin, end, out = _geometry(
        x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    ct = _acc_dtype(x.dtype)
    xp = pad_spatial(np.abs(x.astype(ct, copy=False)), begin, end, out, kernel, strides, dilations, 0)
    s = _reduce_windows(np.add, xp ** p, out, kernel, strides, dilations)
    return (s ** (1.0 / p)).astype(x.dtype, copy=False)


@op("GlobalAveragePool", 1)
def global_average_pool(x):
    axes = tuple(range(2, x.ndim))
    return x.mean(axis=axes, keepdims=True, dtype=_acc_dtype(x.dtype)).astype(x.dtype, copy=False)


@op("GlobalMaxPool", 1)
def global_max_pool(x):
    return x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


@op("GlobalLpPool", 1)
def global_lp_pool(x, *, p=2):
    ct = _acc_dtype(x.dtype)
    s = (np.abs(x.astype(ct)) ** p).sum(axis=tuple(range(2, x.ndim)), keepdims=True)
    return (s ** (1.0 / p)).astype(x.dtype, copy=False)


# region pools ------------------------------------------------------------------------------
def _round_half_away(v):
    # C's round (half away from zero), not NumPy's round half to even
    return int(np.copysign(np.floor(abs(v) + 0.5), v))


@op("MaxRoiPool", 1)
def max_roi_pool(x, rois, *, pooled_shape=None, spatial_scale=1.0):
    if not pooled_shape or len(pooled_shape) != 2:
        raise ValueError("pooled_shape must give [pooled_h, pooled_w]")
    ph, pw = pooled_shape
    _n, c, h, w = x.shape
    y = np.zeros((rois.shape[0], c, ph, pw), dtype=x.dtype)
    for r, roi in enumerate(rois):
        batch = int(roi[0])
        x1, y1, x2, y2 = (_round_half_away(float(v) * spatial_scale) for v in roi[1:5])
        masks = []
        for start, end, pooled, size in ((y1, y2, ph, h), (x1, x2, pw, w)):
            bin_size = max(end - start + 1, 1) / pooled
            i = np.arange(pooled)
            lo = np.clip(np.floor(i * bin_size).astype(int) + start, 0, size)
            hi = np.clip(np.ceil((i + 1) * bin_size).astype(int) + start, 0, size)
            pos = np.arange(size)
            masks.append((pos[None, :] >= lo[:, None]) & (pos[None, :] < hi[:, None]))
        mh, mw = masks
        neg = _lowest(x.dtype)
        img = x[batch]  # (C, H, W)
        colmax = np.where(mw[None, None], img[:, :, None, :], neg).max(axis=-1)  # (C, H, pw)
        full = np.where(mh[None, :, :, None], colmax[:, None, :, :], neg).max(axis=2)  # (C, ph, pw)
        empty = ~(mh.any(axis=1)[:, None] & mw.any(axis=1)[None, :])
        y[r] = np.where(empty[None], 0, full)
    return y


@op("MaxUnpool", 9)
def max_unpool(x, i, output_shape=None, *, kernel_shape=None, pads=None, strides=None):
    rank = x.ndim - 2
    kernel, strides, _, pads = spatial_attrs(rank, kernel_shape, strides, None, pads)
    shape = x.shape[:2] + tuple(
        (d - 1) * s + k - pads[a] - pads[a + rank]
        for a, (d, s, k) in enumerate(zip(x.shape[2:], strides, kernel)))
    flat = i.reshape(-1).astype(np.int64)
    size = int(np.prod(shape))
    if flat.size and (flat.min() < 0 or flat.max() >= size):
        raise ValueError(f"indices I must lie in [0, {size}) for the unpooled shape {shape}")
    y = np.zeros(size, dtype=x.dtype)
    y[flat] = x.reshape(-1)
    y = y.reshape(shape)
    if output_shape is None:
        return y
    # I indexes the unpooled shape the attributes give; a different output_shape crops or
    # zero-extends it at the end of each spatial axis (test_maxunpool_export_with_output_shape)
    target = tuple(int(v) for v in output_shape)
    if target[:2] != shape[:2]:
        raise ValueError(f"output_shape {target} does not keep X's batch and channels {shape[:2]}")
    y = y[(Ellipsis,) + tuple(slice(0, t) for t in target[2:])]
    return np.pad(y, [(0, t - d) for t, d in zip(target, y.shape)])


def _bilinear_roi(img, ys, xs):
    """Bilinear samples of img (C, H, W) at the grid ys (P,) x xs (Q,) -> 4 weighted corners.

    Returns (values, weights) of shapes (4, C, P, Q) and (4, P, Q); samples more than one
    pixel outside the image contribute zero.
    """
    _, h, w = img.shape

    def axis(coord, size):
        valid = (coord >= -1.0) & (coord <= size)
        coord = np.maximum(coord, 0)
        lo = np.floor(coord).astype(np.int64)
        at_end = lo >= size - 1
        lo = np.where(at_end, size - 1, lo)
        hi = np.where(at_end, size - 1, lo + 1)
        coord = np.where(at_end, lo, coord)
        frac = coord - lo
        return lo, hi, frac, valid

    yl, yh, fy, vy = axis(ys, h)
    xl, xh, fx, vx = axis(xs, w)
    valid = vy[:, None] & vx[None, :]
    corners = [(yl, xl, (1 - fy)[:, None] * (1 - fx)[None, :]),
               (yl, xh, (1 - fy)[:, None] * fx[None, :]),
               (yh, xl, fy[:, None] * (1 - fx)[None, :]),
               (yh, xh, fy[:, None] * fx[None, :])]
    vals = np.stack([img[:, yi[:, None], xi[None, :]] for yi, xi, _ in corners])
    weights = np.stack([np.where(valid, wt, 0) for _, _, wt in corners])
    return vals, weights


@op("RoiAlign", 10)
def roi_align(x, rois, batch_indices, *, coordinate_transformation_mode="output_half_pixel",
              mode="avg", output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
    # opset 10 has no such attribute and behaves as output_half_pixel; opset 16's schema
    # default (half_pixel) is filled in by the evaluator
    if mode not in ("avg", "max"):
        raise ValueError(f"mode must be 'avg' or 'max', got {mode!r}")
    if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise ValueError(f"unknown coordinate_transformation_mode {coordinate_transformation_mode!r}")
    half = coordinate_transformation_mode == "half_pixel"
    ct = _acc_dtype(x.dtype)
    oh, ow = output_height, output_width
    y = np.zeros((rois.shape[0], x.shape[1], oh, ow), dtype=ct)
    for r in range(rois.shape[0]):
        offset = 0.5 if half else 0.0
        x1, y1, x2, y2 = (float(v) * spatial_scale - offset for v in rois[r])
        rh, rw = y2 - y1, x2 - x1
        if not half:  # legacy mode forces a roi of at least 1x1
            rh, rw = max(rh, 1.0), max(rw, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = sampling_ratio if sampling_ratio > 0 else int(np.ceil(rh / oh))
        gw = sampling_ratio if sampling_ratio > 0 else int(np.ceil(rw / ow))
        gh, gw = max(gh, 1), max(gw, 1)
        ys = y1 + (np.arange(oh)[:, None] * bh + (np.arange(gh)[None, :] + 0.5) * bh / gh).reshape(-1)
        xs = x1 + (np.arange(ow)[:, None] * bw + (np.arange(gw)[None, :] + 0.5) * bw / gw).reshape(-1)
        img = x[int(batch_indices[r])].astype(ct, copy=False)
        vals, weights = _bilinear_roi(img, ys, xs)  # (4, C, oh*gh, ow*gw), (4, oh*gh, ow*gw)
        weighted = (vals * weights[:, None]).reshape(4, -1, oh, gh, ow, gw)
        if mode == "avg":
            y[r] = weighted.sum(axis=0).mean(axis=(2, 4))
        else:
            # max mode takes the largest weighted corner of each sample, then the largest sample
            y[r] = weighted.max(axis=0).max(axis=(2, 4))
    return y.astype(x.dtype, copy=False)

