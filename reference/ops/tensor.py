"""Shape manipulation: Concat, Reshape, Slice, Split, Pad, Transpose, Tile, ... (issue 3)."""
from __future__ import annotations

import numpy as np

from ..dtypes import STRING, np_dtype
from ..registry import op


def _axis(axis: int, rank: int, what: str = "axis") -> int:
    """`axis` in [-rank, rank-1] as a non-negative axis."""
    axis = int(axis)
    if not -rank <= axis < rank:
        raise ValueError(f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _axes(axes, rank: int, what: str = "axes") -> list[int]:
    out = [_axis(a, rank, what) for a in np.asarray(axes, dtype=np.int64).reshape(-1)]
    if len(set(out)) != len(out):
        raise ValueError(f"{what} {list(map(int, np.asarray(axes).reshape(-1)))} repeat an axis")
    return out


def _ints(x) -> list[int]:
    return [int(v) for v in np.asarray(x).reshape(-1)]


def _zero(dtype):
    """The fill value 'zero' of a type: '' for strings, False for bool, else 0."""
    return "" if dtype == STRING else np.zeros((), dtype=dtype)


# Concat, Identity, Constant, ConstantOfShape, Shape, Size ----------------------------------


@op("Concat", 1)
def concat(*inputs, axis=1):
    if not inputs:
        raise ValueError("Concat needs at least one input")
    return np.concatenate(inputs, axis=_axis(axis, inputs[0].ndim))


@op("Identity", 1)
def identity(x):
    return x


@op("Constant", 1)
def constant(value=None, sparse_value=None, value_float=None, value_floats=None,
             value_int=None, value_ints=None, value_string=None, value_strings=None):
    given = {
        "value": value,
        "sparse_value": sparse_value,
        "value_float": None if value_float is None else np.array(value_float, dtype=np.float32),
        "value_floats": None if value_floats is None else np.array(value_floats, dtype=np.float32),
        "value_int": None if value_int is None else np.array(value_int, dtype=np.int64),
        "value_ints": None if value_ints is None else np.array(value_ints, dtype=np.int64),
        "value_string": None if value_string is None else np.array(value_string, dtype=STRING),
        "value_strings": None if value_strings is None else np.array(value_strings, dtype=STRING),
    }
    set_ = {k: v for k, v in given.items() if v is not None}
    if len(set_) != 1:
        raise ValueError(f"Constant needs exactly one value attribute, got {sorted(set_) or 'none'}")
    (result,) = set_.values()
    return result


@op("ConstantOfShape", 9)
def constant_of_shape(shape, value=None):
    fill = np.zeros(1, dtype=np.float32) if value is None else np.asarray(value).reshape(-1)
    if fill.size != 1:
        raise ValueError(f"ConstantOfShape value must hold one element, got {fill.size}")
    dims = _ints(shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"ConstantOfShape: negative dimension in shape {dims}")
    return np.full(dims, fill[0], dtype=fill.dtype)


@op("Shape", 1)
def shape(data, start=0, end=None):
    rank = data.ndim
    start, end = int(start), rank if end is None else int(end)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return np.array(data.shape[start:end], dtype=np.int64)


@op("Size", 1)
def size(data):
    return np.array(data.size, dtype=np.int64)


# Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Expand, Tile ----------------------------


@op("Reshape", 1)
def reshape_1(data, shape=None, consumed_inputs=None):
    if shape is None:
        raise ValueError("Reshape-1 needs the 'shape' attribute")
    return reshape(data, np.array(shape, dtype=np.int64))


@op("Reshape", 5)
def reshape(data, shape, allowzero=0):
    dims = _ints(shape)
    if not allowzero:
        for i, d in enumerate(dims):
            if d == 0:
                if i >= data.ndim:
                    raise ValueError(f"shape {dims}: 0 at index {i} has no input dimension to copy")
                dims[i] = data.shape[i]
    elif 0 in dims and -1 in dims:
        raise ValueError(f"shape {dims}: with allowzero=1, 0 and -1 cannot be used together")
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise ValueError(f"shape {dims} may hold at most one -1 and no other negative value")
    return np.reshape(data, dims)


@op("Flatten", 1)
def flatten(x, axis=1):
    axis = int(axis)
    if not -x.ndim <= axis <= x.ndim:
        raise ValueError(f"axis {axis} is out of range for rank {x.ndim}")
    axis = axis + x.ndim if axis < 0 else axis
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    inner = int(np.prod(x.shape[axis:], dtype=np.int64))
    return x.reshape(outer, inner)


@op("Squeeze", 1)
def squeeze_1(data, axes=None):
    return squeeze(data, None if axes is None else np.array(axes, dtype=np.int64))


@op("Squeeze", 13)
def squeeze(data, axes=None):
    if axes is None:
        return np.squeeze(data, axis=tuple(i for i, d in enumerate(data.shape) if d == 1))
    axes = _axes(axes, data.ndim)
    bad = [a for a in axes if data.shape[a] != 1]
    if bad:
        raise ValueError(f"cannot squeeze axes {bad} of shape {list(data.shape)}: size is not 1")
    return np.squeeze(data, axis=tuple(axes))


@op("Unsqueeze", 1)
def unsqueeze_1(data, axes=None):
    if axes is None:
        raise ValueError("Unsqueeze-1 needs the 'axes' attribute")
    return unsqueeze(data, np.array(axes, dtype=np.int64))


@op("Unsqueeze", 13)
def unsqueeze(data, axes):
    rank = data.ndim + np.asarray(axes).size
    return np.expand_dims(data, tuple(_axes(axes, rank)))


@op("Transpose", 1)
def transpose(data, perm=None):
    if perm is not None and sorted(perm) != list(range(data.ndim)):
        raise ValueError(f"perm {perm} is not a permutation of the {data.ndim} axes")
    return np.transpose(data, perm)


@op("Expand", 8)
def expand(x, shape):
    out_shape = np.broadcast_shapes(x.shape, tuple(_ints(shape)))
    return np.broadcast_to(x, out_shape).copy()


@op("Tile", 1)
def tile_1(x, tiles, axis):
    reps = [1] * x.ndim
    reps[_axis(int(np.asarray(axis).reshape(-1)[0]), x.ndim)] = int(np.asarray(tiles).reshape(-1)[0])
    return np.tile(x, reps)


@op("Tile", 6)
def tile(x, repeats):
    reps = _ints(repeats)
    if len(reps) != x.ndim or any(r < 0 for r in reps):
        raise ValueError(f"repeats {reps} must hold {x.ndim} non-negative values")
    return np.tile(x, reps)


# Slice, Split ----------------------------------------------------------------------------


@op("Slice", 1)
def slice_1(data, starts=None, ends=None, axes=None):
    if starts is None or ends is None:
        raise ValueError("Slice-1 needs the 'starts' and 'ends' attributes")
    return slice_(data, np.array(starts), np.array(ends), None if axes is None else np.array(axes))


@op("Slice", 10)
def slice_(data, starts, ends, axes=None, steps=None):
    starts, ends = _ints(starts), _ints(ends)
    axes = list(range(len(starts))) if axes is None else _axes(axes, data.ndim)
    steps = [1] * len(starts) if steps is None else _ints(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError("starts, ends, axes and steps must have the same length")
    if 0 in steps:
        raise ValueError("Slice steps cannot be 0")
    index = [slice(None)] * data.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[a] = _spec_slice(data.shape[a], s, e, st)
    return data[tuple(index)].copy()


def _spec_slice(d: int, start: int, end: int, step: int) -> slice:
    """The spec's bounds as a Python slice. Python clamps differently when stepping back: for
    d=5, start=-7 means index 0 to the spec (clamped into [0, d-1]) but nothing to Python."""
    start = start + d if start < 0 else start
    end = end + d if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), d), min(max(end, 0), d), step)
    start, end = min(max(start, 0), d - 1), min(max(end, -1), d - 1)
    return slice(start, None if end < 0 else end, step)


def _split(x, axis, sizes):
    axis = _axis(axis, x.ndim)
    if any(s < 0 for s in sizes) or sum(sizes) != x.shape[axis]:
        raise ValueError(f"split sizes {sizes} must be >= 0 and sum to {x.shape[axis]} (axis {axis})")
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


def _equal_sizes(length, n, *, allow_uneven):
    if n < 1:
        raise ValueError(f"cannot split into {n} outputs")
    if length % n and not allow_uneven:
        raise ValueError(f"axis of size {length} cannot be split evenly into {n} outputs")
    chunk = -(-length // n)
    return [min(chunk, max(length - i * chunk, 0)) for i in range(n)]


@op("Split", 1)
def split_1(x, split_input=None, *, split=None, axis=0, ctx):
    """Split-1 takes the sizes from its second input (also named 'split') or the attribute."""
    sizes = split if split_input is None else _ints(split_input)
    return split_2(x, axis=axis, split=sizes, ctx=ctx)


@op("Split", 2)
def split_2(x, axis=0, split=None, *, ctx):
    axis = _axis(axis, x.ndim)
    if split is None:
        split = _equal_sizes(x.shape[axis], ctx.n_outputs, allow_uneven=False)
    return _split(x, axis, list(split))


def _sizes(split):
    """The 'split' input; an empty tensor counts as absent."""
    return None if split is None or np.asarray(split).size == 0 else _ints(split)


@op("Split", 13)
def split_13(x, split=None, axis=0, *, ctx):
    return split_2(x, axis=axis, split=_sizes(split), ctx=ctx)


@op("Split", 18)
def split_18(x, split=None, axis=0, num_outputs=None, *, ctx):
    axis, split = _axis(axis, x.ndim), _sizes(split)
    if split is not None and num_outputs is not None:
        raise ValueError("Split: give either the 'split' input or 'num_outputs', not both")
    if split is not None:
        return _split(x, axis, split)
    n = ctx.n_outputs if num_outputs is None else int(num_outputs)
    if num_outputs is not None and n != ctx.n_outputs:
        raise ValueError(f"num_outputs={n} but the node has {ctx.n_outputs} outputs")
    return _split(x, axis, _equal_sizes(x.shape[axis], n, allow_uneven=True))


# Pad, CenterCropPad ----------------------------------------------------------------------


def _pad(data, pads, mode, value, axes=None):
    pads = _ints(pads)
    axes = list(range(data.ndim)) if axes is None else _axes(axes, data.ndim)
    if len(pads) != 2 * len(axes):
        raise ValueError(f"pads {pads} must hold 2 values per padded axis ({len(axes)} axes)")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise ValueError(f"unsupported pad mode {mode!r}")
    widths = [(0, 0)] * data.ndim
    for i, a in enumerate(axes):
        widths[a] = (pads[i], pads[i + len(axes)])
    # Negative pads remove elements: pad with the positive parts, then crop.
    grow = [(max(b, 0), max(e, 0)) for b, e in widths]
    if mode == "constant":
        out = np.pad(data, grow, mode="constant", constant_values=value)
    else:  # numpy.pad's reflect, edge and wrap are the spec's modes
        if any(data.shape[a] == 0 and grow[a] != (0, 0) for a in range(data.ndim)):
            raise ValueError(f"cannot pad an empty axis in {mode!r} mode")
        out = np.pad(data, grow, mode=mode)
    crop = tuple(slice(-min(b, 0), out.shape[a] + min(e, 0)) for a, (b, e) in enumerate(widths))
    return out[crop]


@op("Pad", 1)
def pad_1(data, paddings=None, mode="constant", value=0.0):
    return _pad(data, paddings, mode, np.array(value).astype(data.dtype))


@op("Pad", 2)
def pad_2(data, pads=None, mode="constant", value=0.0):
    return _pad(data, pads, mode, np.array(value).astype(data.dtype))


@op("Pad", 11)
def pad(data, pads, constant_value=None, axes=None, mode="constant"):
    """Pad-11 (pads and constant_value inputs); Pad-18 adds 'axes', Pad-19 'wrap' mode."""
    value = _zero(data.dtype) if constant_value is None else np.asarray(constant_value).reshape(-1)[0]
    return _pad(data, pads, mode, value, axes)


@op("CenterCropPad", 18)
def center_crop_pad(input_data, shape, axes=None):
    axes = list(range(input_data.ndim)) if axes is None else _axes(axes, input_data.ndim)
    sizes = _ints(shape)
    if len(sizes) != len(axes):
        raise ValueError(f"shape {sizes} must hold one size per axis {axes}")
    out_shape = list(input_data.shape)
    src, dst = [slice(None)] * input_data.ndim, [slice(None)] * input_data.ndim
    for a, s in zip(axes, sizes):
        d = input_data.shape[a]
        out_shape[a] = s
        if d >= s:  # crop, window start rounded down
            start = (d - s) // 2
            src[a] = slice(start, start + s)
        else:  # pad, the odd extra pixel goes to the right
            start = (s - d) // 2
            dst[a] = slice(start, start + d)
    out = np.full(out_shape, _zero(input_data.dtype), dtype=input_data.dtype)
    out[tuple(dst)] = input_data[tuple(src)]
    return out


# DepthToSpace, SpaceToDepth ----------------------------------------------------------------


@op("DepthToSpace", 1)
def depth_to_space(x, blocksize, mode="DCR"):
    b, c, h, w = x.shape
    bs = int(blocksize)
    if c % (bs * bs):
        raise ValueError(f"channels {c} are not divisible by blocksize**2 = {bs * bs}")
    if mode == "DCR":
        tmp = x.reshape(b, bs, bs, c // bs**2, h, w).transpose(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        tmp = x.reshape(b, c // bs**2, bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        raise ValueError(f"mode must be 'DCR' or 'CRD', got {mode!r}")
    return tmp.reshape(b, c // bs**2, h * bs, w * bs)


@op("SpaceToDepth", 1)
def space_to_depth(x, blocksize, mode="DCR"):
    b, c, h, w = x.shape
    bs = int(blocksize)
    if h % bs or w % bs:
        raise ValueError(f"height {h} and width {w} must be divisible by blocksize {bs}")
    tmp = x.reshape(b, c, h // bs, bs, w // bs, bs)
    if mode == "DCR":
        tmp = tmp.transpose(0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        tmp = tmp.transpose(0, 1, 3, 5, 2, 4)
    else:
        raise ValueError(f"mode must be 'DCR' or 'CRD', got {mode!r}")
    return tmp.reshape(b, c * bs * bs, h // bs, w // bs)


# Range, EyeLike, Trilu -----------------------------------------------------------------------


@op("Range", 11)
def range_(start, limit, delta, stash_type=None):
    dtype = np.asarray(start).dtype
    if np.all(np.asarray(delta) == 0):
        raise ValueError("Range delta cannot be 0")
    work = dtype
    if stash_type == 1 and dtype in (np.dtype(np.float16), np_dtype(16)):
        work = np.dtype(np.float32)  # stash_type=1: compute float16/bfloat16 in float32
    # Scalars by the spec; 1-element tensors are accepted (some function bodies pass them).
    s, l, d = (np.asarray(v).astype(work).reshape(-1)[0] for v in (start, limit, delta))
    if dtype.kind in "iu":
        n = -(-(int(l) - int(s)) // int(d))
    else:
        n = int(np.ceil((float(l) - float(s)) / float(d)))
    n = max(n, 0)
    return (s + np.arange(n).astype(work) * d).astype(dtype)


@op("Range", 27)
def range_27(start, limit, delta, stash_type=1):
    return range_(start, limit, delta, stash_type)


@op("EyeLike", 9)
def eye_like(x, dtype=None, k=0):
    if x.ndim != 2:
        raise ValueError(f"EyeLike input must be 2-D, got shape {list(x.shape)}")
    out_dtype = x.dtype if dtype is None else np_dtype(dtype)
    return np.eye(x.shape[0], x.shape[1], k=int(k), dtype=np.float64).astype(out_dtype)


@op("Trilu", 14)
def trilu(x, k=None, upper=1):
    if x.ndim < 2:
        raise ValueError(f"Trilu input must have rank >= 2, got shape {list(x.shape)}")
    k = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    n, m = x.shape[-2:]
    rows, cols = np.arange(n)[:, None], np.arange(m)[None, :]
    keep = cols - rows >= k if upper else cols - rows <= k
    return np.where(keep, x, _zero(x.dtype)).astype(x.dtype)
