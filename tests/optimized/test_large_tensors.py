"""Sizes and offsets at and past 2^31 (issue 12): every C kernel indexes with 64 bits, so a
tensor of more than 2^31 elements, or a window whose pads, strides and dilations add up past
2^31, runs correctly; what the 32-bit BLAS cannot take is refused with an error naming it.

Most tests need almost no memory.  A "zero-page" array is a private anonymous mapping: its
untouched pages all read as the kernel's one zero page, so an 8.6 GB float32 array costs only
the few pages a test writes.  Windows whose geometry passes 2^31 run on tiny inputs and are
checked against window_oracle, ONNX's pooling/convolution rule written out tap by tap.

The tests that need real memory for a result of more than 2^31 elements are marked slow and run
only with ONNX_PARITY_BIG_TESTS=1 (they need about 10 GiB free).
"""
import math
import mmap
import os
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

from optimized import InferenceSession, SessionOptions, cpu, kernels

BIG = 2**31
INT_MAX = 2**31 - 1
# Linux's MAP_NORESERVE (Python's mmap module does not name it): the mapping is not charged
# against the overcommit limit, so a machine with less memory than the array maps it too
NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform == "linux" else 0)


def zero_page_array(shape, dtype=np.float32) -> np.ndarray:
    """A writable C-contiguous array of zeros that takes memory only where it is written."""
    size = math.prod(shape) * np.dtype(dtype).itemsize
    try:
        buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | NORESERVE)
    except (OSError, OverflowError) as e:  # a 32-bit address space, or strict overcommit
        pytest.skip(f"cannot map {size / 2**30:.1f} GiB of address space here: {e}")
    return np.frombuffer(buffer, dtype).reshape(shape)


def window_oracle(x, kernel, strides, dilations, pads, kind, count_include_pad=False):
    """ONNX MaxPool / AveragePool / one-filter Conv (kind "max", "avg", or a weight array)
    over the last two axes of x (N, C, H, W), tap by tap; pads are [top, left, bottom, right].
    Only taps inside the input are visited, so huge pads and dilations cost nothing."""
    n, c, h, w = x.shape
    size = (h, w)
    out = [(size[a] + pads[a] + pads[a + 2] - ((kernel[a] - 1) * dilations[a] + 1)) // strides[a] + 1
           for a in (0, 1)]
    result = np.zeros((n, c, *out), np.float64)
    for oy in range(out[0]):
        for ox in range(out[1]):
            starts = (oy * strides[0] - pads[0], ox * strides[1] - pads[1])
            inside, padded = [], []
            for a in (0, 1):  # taps per axis inside the input, and inside input + pads
                first = max(0, -(-(0 - starts[a]) // dilations[a]))
                last = min(kernel[a], (size[a] - 1 - starts[a]) // dilations[a] + 1)
                inside.append([(t, starts[a] + t * dilations[a]) for t in range(first, last)])
                lo, hi = -pads[a], size[a] + pads[a + 2]
                first = max(0, -(-(lo - starts[a]) // dilations[a]))
                padded.append(max(0, min(kernel[a], (hi - 1 - starts[a]) // dilations[a] + 1) - first))
            cells = [(ty, iy, tx, ix) for ty, iy in inside[0] for tx, ix in inside[1]]
            if isinstance(kind, np.ndarray):  # conv with one input and one output channel
                result[..., oy, ox] = sum(float(kind[0, 0, ty, tx]) * x[..., iy, ix].astype(np.float64)
                                          for ty, iy, tx, ix in cells)
            elif kind == "max":
                result[..., oy, ox] = max(x[..., iy, ix].astype(np.float64) for _, iy, _, ix in cells)
            else:
                count = padded[0] * padded[1] if count_include_pad else len(cells)
                result[..., oy, ox] = sum(x[..., iy, ix].astype(np.float64)
                                          for _, iy, _, ix in cells) / count
    return result


def small_input(shape=(1, 2, 3, 4)):
    return np.arange(1, math.prod(shape) + 1, dtype=np.float32).reshape(shape) * 0.5


# --- window geometry past 2^31 on tiny inputs ----------------------------------------------

WINDOWS = [
    # (kernel, strides, dilations, pads): each one passes 2^31 in a sum or product the C code
    # forms, with every single value within int32 or just past it
    ([1, 2], [1, INT_MAX], [1, INT_MAX - 1], [0, INT_MAX - 1, 0, 0]),  # -offset + stride
    ([1, 3], [1, 1], [1, 2**30], [0, 2**30, 0, 2**30]),  # kx * dilation = 2^31
    ([2, 1], [1, 1], [BIG, 1], [0, 0, BIG, 0]),  # pads and dilation past int32
    ([1, 2], [1, BIG + 7], [1, BIG + 3], [0, BIG + 2, 0, 3]),  # every value past int32
]


@pytest.mark.parametrize("kernel, strides, dilations, pads", WINDOWS)
def test_max_pool_window_past_2_31(kernel, strides, dilations, pads):
    x = small_input()
    got = kernels.max_pool2d(x, kernel, strides=strides, dilations=dilations, pads=pads)
    expected = window_oracle(x, kernel, strides, dilations, pads, "max")
    assert got.shape == expected.shape and got.size < 64
    np.testing.assert_array_equal(got, expected.astype(np.float32))


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("kernel, strides, dilations, pads", WINDOWS)
def test_average_pool_window_past_2_31(kernel, strides, dilations, pads, count_include_pad):
    x = small_input()
    got = kernels.average_pool2d(x, kernel, strides=strides, dilations=dilations, pads=pads,
                                 count_include_pad=count_include_pad)
    expected = window_oracle(x, kernel, strides, dilations, pads, "avg", count_include_pad)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_average_pool_divisor_past_2_31():
    # a 100001 x 100001 window over one pixel, count_include_pad: the divisor is 1.00002e10,
    # which a 32-bit product of the row and column counts wraps
    x = small_input((1, 2, 1, 1))
    k, p = 100001, 50000
    got = kernels.average_pool2d(x, [k, k], pads=[p] * 4, count_include_pad=True)
    np.testing.assert_allclose(got, x / np.float64(k * k), rtol=1e-6)


@pytest.mark.parametrize("kernel, strides, dilations, pads", WINDOWS)
def test_conv_window_past_2_31(kernel, strides, dilations, pads):
    x = small_input((1, 1, 3, 4))
    w = np.array([0.5, -2.0, 3.0][:kernel[0] * kernel[1]], np.float32).reshape(1, 1, *kernel)
    got = kernels.conv2d(x, w, strides=strides, dilations=dilations, pads=pads)
    np.testing.assert_allclose(got, window_oracle(x, kernel, strides, dilations, pads, w),
                               rtol=1e-6)


# --- more than 2^31 elements, read through strided windows (no real memory) -----------------

def test_max_pool_reads_past_element_2_31():
    x = zero_page_array((1, 1, 1, BIG + 8))
    x[0, 0, 0, [0, 2**30, BIG]] = [1.0, 2.0, 3.0]
    got = kernels.max_pool2d(x, [1, 1], strides=[1, 2**30])
    np.testing.assert_array_equal(got.ravel(), [1.0, 2.0, 3.0])
    got = kernels.average_pool2d(x, [1, 2], strides=[1, BIG])
    np.testing.assert_array_equal(got.ravel(), [0.5, 1.5])  # (x[0] + x[1]), (x[2^31] + x[2^31+1])


def test_pooling_plane_offsets_past_2_31():
    # three planes of 2^30 + 3 values: the third plane starts past element 2^31
    x = zero_page_array((3, 1, 1, 2**30 + 3))
    x[:, 0, 0, 0] = [1.0, 2.0, 3.0]
    x[:, 0, 0, 2**30] = [-1.0, -2.0, -3.0]
    got = kernels.max_pool2d(x, [1, 1], strides=[1, 2**30])
    np.testing.assert_array_equal(got[:, 0, 0], [[1.0, -1.0], [2.0, -2.0], [3.0, -3.0]])


# --- what the 32-bit BLAS cannot take: a clear error, and the reference op instead ----------

def test_gemm_dimension_past_2_31_is_refused_by_name():
    a = zero_page_array((BIG, 1))
    with pytest.raises(ValueError, match=r"M=2147483648 exceeds the C kernels' 32-bit int"):
        kernels.gemm(a, np.ones((1, 2), np.float32))
    with pytest.raises(ValueError, match=r"M=2147483648"):
        kernels.matmul(a, np.ones((1, 2), np.float32))
    # the CPU provider's kernel steps aside, so the plan runs the reference op
    assert cpu.KERNELS[("", "Gemm")](a, np.ones((1, 2), np.float32)) is NotImplemented


def test_matmul_batch_past_2_31_is_refused_by_name():
    a = zero_page_array((BIG, 1, 1))
    with pytest.raises(ValueError, match=r"batch=2147483648"):
        kernels.matmul(a, zero_page_array((BIG, 1, 1)))


def test_conv_output_plane_past_2_31_is_refused_by_name():
    x = zero_page_array((1, 1, 2, 2**30 + 1))
    with pytest.raises(ValueError, match=r"output plane=2147483650"):
        kernels.conv2d(x, np.ones((1, 1, 1, 1), np.float32))


def test_attention_past_2_31_elements_is_refused_by_name():
    # its GEMMs take Sk and D as the BLAS's leading dimensions
    q = zero_page_array((1, 1, BIG, 1))
    with pytest.raises(ValueError, match=r"Q size=2147483648"):
        kernels.attention(q, np.ones((1, 1, 2, 1), np.float32), np.ones((1, 1, 2, 1), np.float32))


def test_c_int_arguments_are_checked_both_ways():
    with pytest.raises(ValueError, match="causal_offset=-2147483649"):
        kernels.attention(*(np.ones((1, 1, 2, 3), np.float32),) * 3, causal=True,
                          causal_offset=-BIG - 1)
    got = kernels.attention(*(np.ones((1, 1, 2, 3), np.float32),) * 3, causal=True,
                            causal_offset=-BIG)  # the smallest int32 is fine: no key visible
    np.testing.assert_array_equal(got, np.zeros((1, 1, 2, 3), np.float32))


# --- big: results of more than 2^31 elements (about 9 GiB) ---------------------------------

def _available_gib() -> float:
    with open("/proc/meminfo") as f:
        info = dict(line.split(":", 1) for line in f)
    return int(info["MemAvailable"].split()[0]) / 2**20


big = pytest.mark.skipif(
    os.environ.get("ONNX_PARITY_BIG_TESTS") != "1",
    reason="needs about 10 GiB free and about 3 minutes; set ONNX_PARITY_BIG_TESTS=1 to run")


def _need_memory(gib: float) -> None:
    if _available_gib() < gib:
        pytest.skip(f"needs {gib} GiB available, this machine has {_available_gib():.1f}")


def _session(nodes, dtype, shape, level):
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", dtype, shape)],
                              [helper.make_tensor_value_info("y", dtype, shape)],
                              [helper.make_tensor("s", dtype, [], [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    options = SessionOptions()
    options.graph_optimization_level = level
    return InferenceSession(model.SerializeToString(), options)


def _marked(n, dtype):
    x = zero_page_array((n,), dtype)
    marks = [5, BIG - 1, BIG, BIG + 1, n - 1]
    x[marks] = [1, 2, 4, 8, 16]
    return x, marks


@pytest.mark.slow
@big
def test_uint8_add_of_2_2e9_elements():
    _need_memory(6)
    n = 2_200_000_000
    x, marks = _marked(n, np.uint8)
    y = _session([helper.make_node("Add", ["x", "s"], ["y"])], TensorProto.UINT8, [n], 99).run(
        None, {"x": x})[0]
    assert y.shape == (n,) and y.dtype == np.uint8
    np.testing.assert_array_equal(y[marks], [4, 5, 7, 11, 19])
    assert np.count_nonzero(y != 3) == len(marks)


@pytest.mark.slow
@big
def test_float32_c_kernels_past_2_31_elements():
    _need_memory(10)
    n = BIG + 2**20 + 5  # a partial last block and chunk
    x, marks = _marked(n, np.float32)
    # binary_f32 (Add), then the fused chain (Add -> Relu -> Mul) at level 99
    y = kernels.add(x, np.float32(3))
    np.testing.assert_array_equal(y[marks], [4, 5, 7, 11, 19])
    assert np.count_nonzero(y != 3) == len(marks)
    del y
    nodes = [helper.make_node("Add", ["x", "s"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Mul", ["r", "s"], ["y"])]
    y = _session(nodes, TensorProto.FLOAT, [n], 99).run(None, {"x": x})[0]
    np.testing.assert_array_equal(y[marks], [12, 15, 21, 33, 57])
    assert np.count_nonzero(y != 9) == len(marks)
    del y
    # a reduction over one row of n values (GlobalAveragePool's kernel), accumulated in double
    total = kernels.reduce_last(x.reshape(1, n), "sum")
    np.testing.assert_array_equal(total, [[31.0]])
