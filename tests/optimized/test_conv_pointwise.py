"""conv2d's fused GEMM paths (csrc/conv_pointwise.c) against the reference Conv: 1x1 stride-1
convolutions (grouped or not) and direct convolutions with few input channels (stems), with
bias, residual and every fused activation; tile, block and depth-slice edges; NaN; thread-count
invariance.  Every test runs at each vector level the CPU has (kernels.limit_isa): portable
runs conv.c's other paths, avx2 and avx512 conv_pointwise.c's."""
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from optimized import kernels

from .test_kernels import ACTIVATION_CASES, ATOL, RTOL, arrays, ref

ALL_ACTIVATIONS = ACTIVATION_CASES + [("HardSigmoid", (0.3, 0.4)), ("HardSwish", ())]
hsettings = settings(max_examples=30, deadline=None)
pytestmark = pytest.mark.usefixtures("isa_level")


# Float32 dot products of depth d (summed in any order) are within d * u * sum|w x| of the
# exact value (u = 2^-24); twice that leaves room for the bias and residual additions.  The
# piecewise-linear activations add at most an ulp (1e-6 relative); the C sigmoid, tanh and
# Gelu approximations are held to test_kernels.py's RTOL and ATOL (a float32 Gelu of 0.045 is
# 6e-5 off in relative terms).
U = 2.0 ** -24
SMOOTH = {"Sigmoid", "Tanh", "Gelu", "GeluTanh"}


def expected_and_bound(x, w, b, residual, act, **attrs):
    """The reference's result computed in float64 and the error a float32 kernel may make."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    exact = ref("Conv", x64, w64, None if b is None else b.astype(np.float64), **attrs)
    size = ref("Conv", np.abs(x64), np.abs(w64), None if b is None else np.abs(b.astype(np.float64)),
               **attrs)
    if residual is not None:
        exact = exact + residual
        size = size + np.abs(residual)
    exact = activate64(exact, act)
    depth = w.shape[1] * w.shape[2] * w.shape[3]
    rtol, atol = (RTOL, ATOL) if act[0] in SMOOTH else (1e-6, 1e-30)
    return exact, 2 * (depth + 2) * U * size + rtol * np.abs(exact) + atol


def activate64(y, act):
    name, params = act
    if name is None:
        return y
    if name == "LeakyRelu":
        return ref("LeakyRelu", y, alpha=params[0]) if params else ref("LeakyRelu", y)
    if name == "Clip":
        lo, hi = (list(params) + [None, None])[:2]
        return ref("Clip", y, None if lo is None else np.float64(lo),
                   None if hi is None else np.float64(hi))
    if name in ("Gelu", "GeluTanh"):
        return ref("Gelu", y, approximate="none" if name == "Gelu" else "tanh")
    if name == "HardSigmoid":
        return ref("HardSigmoid", y, alpha=params[0], beta=params[1])
    return ref(name, y)


def check(x, w, b=None, residual=None, act=(None, ()), **attrs):
    exact, bound = expected_and_bound(x, w, b, residual, act, **attrs)
    got = kernels.conv2d(x, w, b, residual=residual, activation=act[0],
                         activation_params=act[1], **attrs)
    assert got.dtype == np.float32 and got.shape == exact.shape
    err = np.abs(got.astype(np.float64) - exact)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), (f"error {err[worst]:.3g} past bound {bound[worst]:.3g} at "
                                  f"{worst}: got {got[worst]}, expected {exact[worst]}")
    return got


@st.composite
def pointwise_cases(draw):
    group = draw(st.sampled_from([1, 1, 2, 3, 4]))
    h = draw(st.integers(1, 19))
    return {
        "batch": draw(st.integers(1, 2)), "group": group,
        "cin": group * draw(st.integers(1, 300 // group)),
        "cout": group * draw(st.integers(1, 40)),
        "h": h, "w": draw(st.integers(1, 23).filter(lambda v: v != h)),
        "bias": draw(st.booleans()), "residual": draw(st.booleans()),
        "act": draw(st.sampled_from(ALL_ACTIVATIONS)), "seed": draw(st.integers(0, 1000)),
    }


@hsettings
@given(case=pointwise_cases())
def test_pointwise_matches_reference(case):
    c = case
    x = arrays(c["seed"], c["batch"], c["cin"], c["h"], c["w"])
    w = arrays(c["seed"] + 1, c["cout"], c["cin"] // c["group"], 1, 1)
    b = arrays(c["seed"] + 2, c["cout"]) if c["bias"] else None
    residual = (arrays(c["seed"] + 3, c["batch"], c["cout"], c["h"], c["w"])
                if c["residual"] else None)
    check(x, w, b, residual, c["act"], group=c["group"])


@st.composite
def stem_cases(draw):
    return {
        "batch": draw(st.integers(1, 2)), "cin": draw(st.integers(1, 7)),
        "cout": draw(st.integers(1, 20)),
        "h": draw(st.integers(1, 30)), "w": draw(st.integers(1, 37)),
        "kh": draw(st.integers(1, 7)), "kw": draw(st.integers(1, 7)),
        "strides": [draw(st.integers(1, 4)), draw(st.integers(1, 4))],
        "dilations": [draw(st.integers(1, 2)), draw(st.integers(1, 3))],
        "pads": [draw(st.integers(0, 3)) for _ in range(4)],
        "bias": draw(st.booleans()), "residual": draw(st.booleans()),
        "act": draw(st.sampled_from(ALL_ACTIVATIONS)), "seed": draw(st.integers(0, 1000)),
    }


@hsettings
@given(case=stem_cases())
def test_stem_matches_reference(case):
    c = case
    eh = (c["kh"] - 1) * c["dilations"][0] + 1
    ew = (c["kw"] - 1) * c["dilations"][1] + 1
    assume(c["h"] + c["pads"][0] + c["pads"][2] >= eh and c["w"] + c["pads"][1] + c["pads"][3] >= ew)
    x = arrays(c["seed"], c["batch"], c["cin"], c["h"], c["w"])
    w = arrays(c["seed"] + 1, c["cout"], c["cin"], c["kh"], c["kw"])
    b = arrays(c["seed"] + 2, c["cout"]) if c["bias"] else None
    attrs = {"strides": c["strides"], "pads": c["pads"], "dilations": c["dilations"]}
    residual = None
    if c["residual"]:
        shape = kernels.conv2d(x, w, **attrs).shape
        residual = arrays(c["seed"] + 3, *shape)
    check(x, w, b, residual, c["act"], **attrs)


@pytest.mark.parametrize("cin, cout, hw", [
    (5, 7, (1, 1)),       # one column: a tile of one lane
    (9, 13, (2, 4)),      # 8 columns: one vector, masked
    (9, 13, (3, 3)),      # 9: two vectors, the second masked
    (6, 6, (4, 4)),       # 16: one whole tile
    (6, 11, (1, 17)),     # 17: a whole tile and a one-lane tail
    (257, 12, (5, 7)),    # depth one past a slice: a second slice of one
    (515, 19, (3, 11)),   # three slices, the last partial
    (40, 25, (37, 41)),   # a plane of several column blocks
    (1024, 8, (6, 5)),    # deep and narrow: column blocks of one tile
    # one or two columns past the last whole tile are dot products over the depth (dot_tail)
    (96, 200, (7, 7)),    # 49 = 3 x 16 + 1, output channels 6 x 33 + 2
    (515, 19, (2, 9)),    # 18 = 16 + 2 over three slices, the last of 3 (no whole vector)
    (300, 13, (1, 2)),    # two columns only; slices of 256 and 44 (5 vectors and 4 more)
    (37, 9, (3, 6)),      # 18 with a depth of 4 vectors and 5 more
    (576, 144, (1, 1)),   # a squeeze-excitation 1x1 on a 1x1 plane
    (1030, 20, (7, 7)),   # deep on a 7x7 plane (was OpenBLAS's): five slices, the last of 6
    # panels packed by rows from a depth of 96 (ROW_ORDER_DEPTH), by panels below it
    (95, 21, (9, 11)),    # 99 = 6 x 16 + 3: by panels, the last tile masked
    (96, 21, (9, 11)),    # the same by rows
    (128, 16, (55, 53)),  # by rows over twelve column blocks, the last of 99 columns
    # each tile row's first tile prefetches the next row's weights, 16 steps of depth a line
    (23, 13, (3, 5)),     # depth 16 + 7; tile rows of 6, 6 and 1 (a next row of one)
    (16, 12, (2, 9)),     # depth one line; the last tile row has no next
    (271, 7, (4, 4)),     # slices of 256 and 15; a next row of one channel in each
])
def test_pointwise_tile_and_slice_edges(cin, cout, hw):
    x = arrays(1, 2, cin, *hw)
    w = arrays(2, cout, cin, 1, 1)
    b = arrays(3, cout)
    residual = arrays(4, 2, cout, *hw)
    check(x, w, b, residual, ("Relu", ()))
    check(x, w, None, None, ("Sigmoid", ()))


@pytest.mark.parametrize("cin, cout, hw, kernel, strides, pads", [
    (3, 64, (31, 45), (3, 3), [2, 2], [0, 0, 0, 0]),   # squeezenet's stem, smaller
    (3, 24, (30, 27), (3, 3), [2, 2], [1, 1, 1, 1]),   # shufflenet's
    (3, 16, (40, 33), (7, 7), [2, 2], [3, 3, 3, 3]),   # resnet's 7x7
    (1, 5, (9, 1300), (3, 3), [1, 1], [1, 1, 1, 1]),   # rows wider than a column block
    (2, 3, (8, 9), (2, 5), [3, 1], [0, 4, 2, 0]),      # pads past the window, stride > kernel
    (3, 10, (9, 33), (3, 3), [2, 2], [1, 1, 1, 1]),    # rows of 17: a column past the tile
])
def test_stem_shapes(cin, cout, hw, kernel, strides, pads):
    x = arrays(5, 2, cin, *hw)
    w = arrays(6, cout, cin, *kernel)
    b = arrays(7, cout)
    check(x, w, b, None, ("Relu", ()), strides=strides, pads=pads)
    check(x, w, None, None, ("HardSwish", ()), strides=strides, pads=pads)


def test_hand_checked_pointwise_and_stem():
    # 1x1: y[m] = sum_c w[m, c] x[c] + b[m], then Relu; x planes are 1..6 and 10..60
    x = np.stack([np.arange(1, 7), np.arange(10, 70, 10)]).reshape(1, 2, 2, 3).astype(np.float32)
    w = np.array([[1, 1], [2, -1], [0, 0]], np.float32).reshape(3, 2, 1, 1)
    y = kernels.conv2d(x, w, np.array([0, 0, -5], np.float32), activation="Relu")
    np.testing.assert_array_equal(y[0, 0], [[11, 22, 33], [44, 55, 66]])
    np.testing.assert_array_equal(y[0, 1], 0)  # 2 x - 10 x < 0
    np.testing.assert_array_equal(y[0, 2], 0)
    # a stride-2 2x2 window of ones over 0..19 (4x5), padded 1 at the left and top
    x = np.arange(20, dtype=np.float32).reshape(1, 1, 4, 5)
    y = kernels.conv2d(x, np.ones((1, 1, 2, 2), np.float32), strides=[2, 2], pads=[1, 1, 0, 0])
    np.testing.assert_array_equal(y[0, 0], [[0, 1 + 2, 3 + 4], [5 + 10, 6 + 7 + 11 + 12,
                                                                8 + 9 + 13 + 14]])


@pytest.mark.parametrize("kernel", [(1, 1), (3, 3)])
def test_nan_propagates_through_relu(kernel):
    x = arrays(8, 1, 3, 6, 17)
    x[0, 1, 2, 5] = np.nan
    w = arrays(9, 7, 3, *kernel)
    y = kernels.conv2d(x, w, arrays(10, 7), activation="Relu")
    expected = ref("Relu", ref("Conv", x, w, arrays(10, 7)))
    np.testing.assert_array_equal(np.isnan(y), np.isnan(expected))
    assert np.isnan(y).any()


@pytest.mark.parametrize("cin, cout, hw, group, kernel, strides, batch", [
    (64, 200, (13, 11), 1, (1, 1), [1, 1], 1),   # one column block: output channels split
    (64, 200, (37, 35), 1, (1, 1), [1, 1], 1),   # three column blocks, split in two chunks each
    (64, 200, (13, 11), 1, (1, 1), [1, 1], 2),   # two images: one task each
    (256, 200, (13, 15), 1, (1, 1), [1, 1], 1),  # column blocks of 112 and 83: channels split too
    (272, 272, (14, 15), 4, (1, 1), [1, 1], 2),  # grouped
    (16, 64, (55, 53), 1, (1, 1), [1, 1], 2),    # many column blocks
    (300, 130, (7, 7), 1, (1, 1), [1, 1], 1),    # a column past the tiles, in dot products
    (576, 144, (1, 1), 1, (1, 1), [1, 1], 2),    # a plane of one column
    (1100, 40, (7, 7), 1, (1, 1), [1, 1], 1),    # deep on a 7x7 plane
    (3, 24, (64, 57), 1, (3, 3), [2, 2], 2),     # a stem: bands of output rows
    (3, 24, (64, 57), 1, (3, 3), [2, 2], 1),     # one image's stem: its layout on one thread
])
def test_thread_count_invariance(cin, cout, hw, group, kernel, strides, batch, threads,
                                 isa_level):
    x = arrays(11, batch, cin, *hw)
    w = arrays(12, cout, cin // group, *kernel)
    b, attrs = arrays(13, cout), {"group": group, "strides": strides}
    results = []
    for n in (1, 2):
        kernels.set_num_threads(n)
        results.append(check(x, w, b, None, ("Relu", ()), **attrs))
    # conv_pointwise.c runs every output's sum over the same depth in the same order on any
    # thread; the portable path's OpenBLAS blocks a GEMM by its thread count, within the bound
    if isa_level != "portable":
        np.testing.assert_array_equal(results[0], results[1])
