"""Convolutions: Conv, ConvTranspose, DeformConv, Col2Im (im2col / col2im over NumPy views)."""
from __future__ import annotations

import itertools

import numpy as np

from ..registry import op


# geometry shared with pool.py --------------------------------------------------------------
def spatial_attrs(rank, kernel_shape, strides, dilations, pads):
    """Fill the per-axis attribute defaults for `rank` spatial axes."""
    strides = list(strides) if strides else [1] * rank
    dilations = list(dilations) if dilations else [1] * rank
    pads = list(pads) if pads else [0] * (2 * rank)
    for name, v, n in (("kernel_shape", kernel_shape, rank), ("strides", strides, rank),
                       ("dilations", dilations, rank), ("pads", pads, 2 * rank)):
        if len(v) != n:
            raise ValueError(f"{name} has {len(v)} values, expected {n} for {rank} spatial axes")
    return list(kernel_shape), strides, dilations, pads


def out_geometry(in_shape, kernel, strides, dilations, pads, auto_pad="NOTSET", ceil_mode=0):
    """(pads_begin, pads_end, out_shape) for a convolution or pooling window."""
    begin, end, out = [], [], []
    for i, size in enumerate(in_shape):
        s, ek = strides[i], (kernel[i] - 1) * dilations[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-size // s)
            total = max(0, (o - 1) * s + ek - size)
            pb = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pe = total - pb
        elif auto_pad == "VALID":
            pb = pe = 0
            o = (-(-(size - ek + 1) // s)) if ceil_mode else (size - ek) // s + 1
        elif auto_pad in ("NOTSET", ""):
            pb, pe = pads[i], pads[i + len(in_shape)]
            span = size + pb + pe - ek
            if ceil_mode:
                o = -(-span // s) + 1
                # a window that would start in the end padding is dropped
                if (o - 1) * s >= size + pb:
                    o -= 1
            else:
                o = span // s + 1
        else:
            raise ValueError(f"auto_pad {auto_pad!r} is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID")
        if o < 0:
            raise ValueError(f"kernel {kernel} with dilations {dilations} is larger than the padded input")
        begin.append(pb)
        end.append(pe)
        out.append(o)
    return begin, end, out


def pad_spatial(x, begin, end, out, kernel, strides, dilations, value):
    """Pad the spatial axes so that every window of `out` fits (ceil mode may need extra)."""
    rank = len(out)
    widths = [(0, 0)] * (x.ndim - rank)
    for i in range(rank):
        need = (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 if out[i] else 0
        size = x.shape[x.ndim - rank + i]
        widths.append((begin[i], max(end[i], need - size - begin[i], 0)))
    if not any(w for pair in widths for w in pair):
        return x
    return np.pad(x, widths, constant_values=value)


def windows(xp, out, kernel, strides, dilations):
    """View of shape (..., o1..on, k1..kn) over the last n (already padded) axes of xp."""
    rank = len(out)
    eks = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    axes = tuple(range(xp.ndim - rank, xp.ndim))
    v = np.lib.stride_tricks.sliding_window_view(xp, eks, axis=axes)
    lead = (slice(None),) * (xp.ndim - rank)
    outs = tuple(slice(0, (o - 1) * s + 1 if o else 0, s) for o, s in zip(out, strides))
    ks = tuple(slice(None, None, d) for d in dilations)
    return v[lead + outs + ks]


def window_offsets(xp, out, kernel, strides, dilations):
    """(offset, view) for each kernel offset: the strided view (..., o1..on) of xp (already
    padded) holding that element of every window. Working offset by offset keeps each step a
    large elementwise pass instead of work over tiny trailing window axes."""
    rank = len(out)
    lead = (slice(None),) * (xp.ndim - rank)
    for offset in itertools.product(*(range(k) for k in kernel)):
        yield offset, xp[lead + tuple(slice(k * d, k * d + (o - 1) * s + 1, s) if o else slice(0, 0)
                                      for k, d, o, s in zip(offset, dilations, out, strides))]


def im2col(xp, out, kernel, strides, dilations, dtype):
    """Columns (N, C*K, O) of xp's windows, rows ordered (c, k...), converted to `dtype` in
    the same single copy."""
    n, c = xp.shape[:2]
    cols = np.empty((n, c, *kernel, *out), dtype=dtype)
    for offset, view in window_offsets(xp, out, kernel, strides, dilations):
        cols[(slice(None), slice(None)) + offset] = view
    return cols.reshape(n, c * int(np.prod(kernel)), int(np.prod(out)))


def _compute_dtype(dtype):
    # ConvTranspose and DeformConv accumulate in float64 whatever the input type: rounding then
    # no longer depends on the BLAS's blocking and threads, and results sit closer to the
    # exact value.
    return np.float64


def _conv_dtype(dtype):
    # Conv, the hot op of every CNN, runs its matmul in float32 (float64 stays float64): half
    # the time of float64. Its rounding then depends on the BLAS's tiling; see tied_filters.
    return np.float64 if dtype == np.float64 else np.float32


def tied_filters(w, group):
    """For each output channel, the first channel of its group whose filter is bitwise equal,
    or None when every filter is distinct.

    A BLAS rounds rows differently depending on where they fall in its tiles, so identical
    filters can give channels one ulp apart. Copying one channel over its twins keeps them
    equal, as they are mathematically. Models with tied filters need this: the light_*
    models' constant weights give logits near 1e10, and one ulp there changes a softmax.
    """
    m = w.shape[0]
    per_group = m // group
    if per_group == 1:
        return None
    bits = np.ascontiguousarray(w).reshape(group, per_group, -1)
    bits = bits.view(np.dtype(f"u{bits.itemsize}"))
    channels = np.arange(m).reshape(group, per_group)
    source = channels.copy()
    for g, rows in enumerate(bits):
        # equal rows have equal (wrapping) integer sums; rows that share a sum are compared in full
        sums = rows.sum(axis=1, dtype=rows.dtype)
        _, first, inverse = np.unique(sums, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        for shared in np.flatnonzero(np.bincount(inverse) > 1):
            members = np.flatnonzero(inverse == shared)
            candidates = rows if len(members) == per_group else rows[members]
            equal = (candidates == rows[first[shared]]).all(axis=1)
            source[g, members[equal]] = channels[g, first[shared]]
    return None if (source == channels).all() else source.reshape(-1)


def grouped_matmul(cols, w, group):
    """cols (N, C*K, O) with C*K ordered (c, k...), w (M, C/group, k...) -> (N, M, O)."""
    n, ck, o = cols.shape
    m = w.shape[0]
    wg = w.reshape(group, m // group, ck // group)
    y = np.matmul(wg, cols.reshape(n, group, ck // group, o))
    return y.reshape(n, m, o)


# Conv ------------------------------------------------------------------------------------
@op("Conv", 1)
def conv(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None):
    rank = x.ndim - 2
    kernel, strides, dilations, pads = spatial_attrs(
        rank, kernel_shape or w.shape[2:], strides, dilations, pads)
    if x.shape[1] != w.shape[1] * group or w.shape[0] % group:
        raise ValueError(f"X channels {x.shape[1]} and W {w.shape} do not fit group={group}")
    if tuple(kernel) != w.shape[2:]:
        raise ValueError(f"kernel_shape {kernel} does not match W spatial shape {w.shape[2:]}")
    ct = _conv_dtype(x.dtype)
    begin, end, out = out_geometry(x.shape[2:], kernel, strides, dilations, pads, auto_pad)
    xp = pad_spatial(x, begin, end, out, kernel, strides, dilations, 0)
    cols = im2col(xp, out, kernel, strides, dilations, ct)
    y = grouped_matmul(cols, w.astype(ct, copy=False), group)
    source = tied_filters(w, group)
    if source is not None:
        y = y[:, source]
    if b is not None:
        y += b.astype(ct).reshape(1, -1, 1)
    return y.reshape((x.shape[0], w.shape[0], *out)).astype(x.dtype, copy=False)


# ConvTranspose ---------------------------------------------------------------------------
def col2im(cols, kernel, strides, dilations, full_shape):
    """Sum cols (N, C, k..., o...) into an image of spatial `full_shape` (one add per offset)."""
    rank = len(kernel)
    n, c = cols.shape[:2]
    out = cols.shape[2 + rank:]
    img = np.zeros((n, c, *full_shape), dtype=cols.dtype)
    if 0 in out:
        return img
    for kk in itertools.product(*(range(k) for k in kernel)):
        dst = tuple(slice(ki * d, ki * d + (o - 1) * s + 1, s)
                    for ki, d, o, s in zip(kk, dilations, out, strides))
        img[(slice(None), slice(None)) + dst] += cols[(slice(None), slice(None)) + kk]
    return img


def _crop(img, begin, out_shape):
    """img[..., begin:begin+out] per spatial axis; negative begins / overruns read zeros."""
    rank = len(out_shape)
    widths = [(0, 0)] * (img.ndim - rank)
    for i in range(rank):
        size = img.shape[img.ndim - rank + i]
        widths.append((max(0, -begin[i]), max(0, begin[i] + out_shape[i] - size)))
    img = np.pad(img, widths)
    idx = tuple(slice(max(b, 0), max(b, 0) + o) for b, o in zip(begin, out_shape))
    return img[(Ellipsis,) + idx]


@op("ConvTranspose", 1)
def conv_transpose(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1,
                   kernel_shape=None, output_padding=None, output_shape=None, pads=None,
                   strides=None):
    rank = x.ndim - 2
    kernel, strides, dilations, pads = spatial_attrs(
        rank, kernel_shape or w.shape[2:], strides, dilations, pads)
    output_padding = list(output_padding) if output_padding else [0] * rank
    n, c = x.shape[:2]
    if c != w.shape[0] or c % group:
        raise ValueError(f"X channels {c} and W {w.shape} do not fit group={group}")
    if tuple(kernel) != w.shape[2:]:
        raise ValueError(f"kernel_shape {kernel} does not match W spatial shape {w.shape[2:]}")
    m = w.shape[1] * group
    in_shape = x.shape[2:]
    full = [s * (i - 1) + op_ + (k - 1) * d + 1
            for s, i, op_, k, d in zip(strides, in_shape, output_padding, kernel, dilations)]
    if output_shape:
        output_shape = list(output_shape)[-rank:]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        output_shape = [i * s for i, s in zip(in_shape, strides)]
    if output_shape:
        total = [f - o for f, o in zip(full, output_shape)]
        if auto_pad == "SAME_UPPER":
            begin = [t // 2 for t in total]
        else:
            begin = [t - t // 2 for t in total]
        out = output_shape
    else:
        if auto_pad == "VALID":
            pads = [0] * (2 * rank)
        begin = pads[:rank]
        out = [f - pads[i] - pads[i + rank] for i, f in enumerate(full)]
    ct = _compute_dtype(x.dtype)
    # cols[n, g*Mg + m, k..., i...] = sum_c W[g*Cg + c, m, k...] * X[n, g*Cg + c, i...]
    k = int(np.prod(kernel))
    wg = w.astype(ct, copy=False).reshape(group, c // group, w.shape[1] * k).transpose(0, 2, 1)
    xg = x.astype(ct, copy=False).reshape(n, group, c // group, int(np.prod(in_shape)))
    cols = np.matmul(wg, xg).reshape(n, m, *kernel, *in_shape)
    img = col2im(cols, kernel, strides, dilations, full)
    y = _crop(img, begin, out)
    if b is not None:
        y = y + b.astype(ct).reshape((1, -1) + (1,) * rank)
    return np.ascontiguousarray(y).astype(x.dtype, copy=False)


# Col2Im ----------------------------------------------------------------------------------
@op("Col2Im", 18)
def col2im_op(x, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    image_shape = [int(v) for v in image_shape]
    kernel = [int(v) for v in block_shape]
    rank = len(image_shape)
    kernel, strides, dilations, pads = spatial_attrs(rank, kernel, strides, dilations, pads)
    n, ck, length = x.shape
    k = int(np.prod(kernel))
    if ck % k:
        raise ValueError(f"input dim 1 ({ck}) is not a multiple of prod(block_shape) ({k})")
    begin, _, out = out_geometry(image_shape, kernel, strides, dilations, pads)
    if int(np.prod(out)) != length:
        raise ValueError(f"input has {length} blocks, image geometry gives {out} = {np.prod(out)}")
    cols = x.reshape(n, ck // k, *kernel, *out)
    padded = [i + pads[a] + pads[a + rank] for a, i in enumerate(image_shape)]
    img = col2im(cols, kernel, strides, dilations, padded)
    idx = tuple(slice(b, b + i) for b, i in zip(begin, image_shape))
    return np.ascontiguousarray(img[(Ellipsis,) + idx])


# DeformConv ------------------------------------------------------------------------------
def _sample(x, pos):
    """Multilinear samples of x (N, G, Cg, *S) at pos (N, G, P, rank); zero outside x."""
    n, g, cg = x.shape[:3]
    spatial = x.shape[3:]
    rank = len(spatial)
    flat = x.reshape(n, g, cg, int(np.prod(spatial)))
    lo = np.floor(pos)
    frac = pos - lo
    lo = lo.astype(np.int64)
    total = 0
    for corner in itertools.product((0, 1), repeat=rank):
        weight = np.ones(pos.shape[:-1], dtype=pos.dtype)
        index = np.zeros(pos.shape[:-1], dtype=np.int64)
        valid = np.ones(pos.shape[:-1], dtype=bool)
        for a in range(rank):
            ia = lo[..., a] + corner[a]
            weight = weight * (frac[..., a] if corner[a] else 1 - frac[..., a])
            valid &= (ia >= 0) & (ia < spatial[a])
            index = index * spatial[a] + np.clip(ia, 0, spatial[a] - 1)
        vals = np.take_along_axis(flat, index[:, :, None, :], axis=3)
        total = total + vals * np.where(valid, weight, 0)[:, :, None, :]
    return total  # (N, G, Cg, P)


@op("DeformConv", 19)
def deform_conv(x, w, offset, b=None, mask=None, *, dilations=None, group=1, kernel_shape=None,
                offset_group=1, pads=None, strides=None):
    rank = x.ndim - 2
    kernel, strides, dilations, pads = spatial_attrs(
        rank, kernel_shape or w.shape[2:], strides, dilations, pads)
    n, c = x.shape[:2]
    if c % offset_group or c != w.shape[1] * group:
        raise ValueError(f"X channels {c} do not fit W {w.shape}, group={group}, offset_group={offset_group}")
    ct = _compute_dtype(x.dtype)
    begin, _, out = out_geometry(x.shape[2:], kernel, strides, dilations, pads)
    k, o = int(np.prod(kernel)), int(np.prod(out))
    # base sampling position of kernel offset kk at output o: o*stride - pad_begin + kk*dilation
    grids = np.meshgrid(*[np.arange(v) for v in kernel], *[np.arange(v) for v in out], indexing="ij")
    base = np.stack([grids[a] * dilations[a] + grids[rank + a] * strides[a] - begin[a]
                     for a in range(rank)], axis=-1).reshape(k, o, rank)
    off = offset.astype(ct).reshape(n, offset_group, k, rank, o).transpose(0, 1, 2, 4, 3)
    pos = (base[None, None] + off).reshape(n, offset_group, k * o, rank)
    xg = x.astype(ct, copy=False).reshape(n, offset_group, c // offset_group, *x.shape[2:])
    vals = _sample(xg, pos).reshape(n, offset_group, c // offset_group, k, o)
    if mask is not None:
        vals = vals * mask.astype(ct).reshape(n, offset_group, 1, k, o)
    y = grouped_matmul(vals.reshape(n, c * k, o), w.astype(ct, copy=False), group)
    if b is not None:
        y += b.astype(ct).reshape(1, -1, 1)
    return y.reshape((n, w.shape[0], *out)).astype(x.dtype, copy=False)
