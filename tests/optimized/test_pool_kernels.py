"""csrc/pool.c against the reference MaxPool/AveragePool on rows wide enough for its vector
paths: the padded-row path (any geometry), the AVX2 paths for stride 2 with 2 or 3 taps along x
and for stride 1 along x (their 8-lane loops and masked last lanes), the AVX-512 paths for
stride 2 (rows of up to 32 outputs in registers, longer rows 16 outputs a step, any left pad)
and for "same" 3-tap pools on rows under 8, the flat path
for stride-1 "same" pools (inception's 3x3 pad 1, planes reduced as one run), and one window
over each whole plane.  Also NaN in the last lanes, thread-count invariance, the same bits at
every vector level, and the plan's PLAN_POOL step against the Python kernel bit for bit.

Every test runs at each vector level the CPU has (kernels.limit_isa: portable, avx2, avx512),
so that one AVX-512 machine tests the AVX2 and portable paths too."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from optimized import kernels
from optimized.cpu import C_STEPS, KERNELS
from optimized.kernels import lib
from optimized.plan import Plan
from reference import ReferenceEvaluator

from .conftest import CPU_LEVELS

# the ISA level is set once per test by the isa_level fixture and holds for all its examples
hsettings = settings(max_examples=60, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
pytestmark = pytest.mark.usefixtures("isa_level")


def pool_model(op_type, shape, opset=19, **attrs):
    node = helper.make_node(op_type, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def reference(op_type, x, **attrs):
    return ReferenceEvaluator(pool_model(op_type, list(x.shape), **attrs)).run(None, {"x": x})[0]


@st.composite
def wide_pools(draw):
    """Geometries around the vector paths: widths past 16 columns, stride 2 with 3 taps
    often, N, C, H and W drawn apart."""
    kh, kw = draw(st.integers(1, 4)), draw(st.sampled_from([1, 2, 3, 3, 3, 5]))
    sh, sw = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 2, 3]))
    dh, dw = draw(st.integers(1, 2)), draw(st.sampled_from([1, 1, 2]))
    return {
        "shape": (draw(st.integers(1, 2)), draw(st.integers(1, 5)), draw(st.integers(1, 12)),
                  draw(st.integers(1, 41))),
        "kernel_shape": [kh, kw], "strides": [sh, sw], "dilations": [dh, dw],
        "pads": [draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1)),
                 draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1))],
        "ceil_mode": draw(st.booleans()), "count_include_pad": draw(st.booleans()),
        "seed": draw(st.integers(0, 1000)),
    }


def fits(c):
    _, _, h, w = c["shape"]
    span = [(k - 1) * d + 1 for k, d in zip(c["kernel_shape"], c["dilations"])]
    return h + c["pads"][0] + c["pads"][2] >= span[0] and w + c["pads"][1] + c["pads"][3] >= span[1]


def data(c):
    return np.random.default_rng(c["seed"]).standard_normal(c["shape"]).astype(np.float32)


def window(c):
    return {k: c[k] for k in ("kernel_shape", "strides", "pads", "dilations")}


@hsettings
@given(c=wide_pools())
def test_max_pool_matches_reference(c):
    assume(fits(c))
    x = data(c)
    want = reference("MaxPool", x, ceil_mode=int(c["ceil_mode"]), **window(c))
    got = kernels.max_pool2d(x, ceil_mode=c["ceil_mode"], **window(c))
    np.testing.assert_array_equal(got, want)


@hsettings
@given(c=wide_pools())
def test_average_pool_matches_reference(c):
    assume(fits(c))
    x = data(c)
    want = reference("AveragePool", x, ceil_mode=int(c["ceil_mode"]),
                     count_include_pad=int(c["count_include_pad"]), **window(c))
    got = kernels.average_pool2d(x, ceil_mode=c["ceil_mode"],
                                 count_include_pad=c["count_include_pad"], **window(c))
    # the window's sum is taken rows first, then columns: a few float32 roundings apart
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def check_pool_matches_reference(op_type, x, c):
    """Our pool kernel on x with the drawn window, against the reference op."""
    attrs = dict(window(c), ceil_mode=int(c["ceil_mode"]))
    if op_type == "AveragePool":
        attrs["count_include_pad"] = int(c["count_include_pad"])
    run = kernels.average_pool2d if op_type == "AveragePool" else kernels.max_pool2d
    got = run(x, **attrs)
    want = reference(op_type, x, **attrs)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    # as test_average_pool_matches_reference: rows first, then columns
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@st.composite
def same_pools(draw):
    """Stride 1 with out_w == in_w (the flat path): pads left plus right are k_w - 1, any
    split; rows padded, dilated and counted any way; NaN somewhere now and then."""
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 7))
    left = draw(st.integers(0, kw - 1))
    return {
        "shape": (draw(st.integers(1, 2)), draw(st.integers(1, 5)), draw(st.integers(1, 19)),
                  draw(st.integers(1, 37))),
        "kernel_shape": [kh, kw], "strides": [1, 1], "dilations": [draw(st.integers(1, 2)), 1],
        "pads": [draw(st.integers(0, kh - 1)), left, draw(st.integers(0, kh - 1)), kw - 1 - left],
        "ceil_mode": draw(st.booleans()), "count_include_pad": draw(st.booleans()),
        "seed": draw(st.integers(0, 1000)), "nan": draw(st.booleans()),
    }


@hsettings
@given(c=same_pools())
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_same_stride_1_pools_match_reference(op_type, c):
    assume(fits(c))
    x = data(c)
    if c["nan"]:
        x.reshape(-1)[c["seed"] % x.size] = np.nan
    check_pool_matches_reference(op_type, x, c)


@st.composite
def same_three_tap_pools(draw):
    """same_pools with 3 taps along x and one padding column each side (the flat path's register
    loops: inception's 3x3 pad 1 pools; rows of 8 or more in AVX2, shorter ones in AVX-512);
    rows padded, dilated, counted any way; NaN now and then, often in a first or last column
    (the masked loads)."""
    kh = draw(st.integers(1, 5))
    w = draw(st.one_of(st.integers(8, 37), st.integers(1, 7)))
    return {
        "shape": (draw(st.integers(1, 2)), draw(st.integers(1, 5)), draw(st.integers(1, 19)), w),
        "kernel_shape": [kh, 3], "strides": [1, 1], "dilations": [draw(st.integers(1, 2)), 1],
        "pads": [draw(st.integers(0, kh - 1)), 1, draw(st.integers(0, kh - 1)), 1],
        "ceil_mode": draw(st.booleans()), "count_include_pad": draw(st.booleans()),
        "seed": draw(st.integers(0, 1000)), "nan": draw(st.booleans()),
        "nan_column": draw(st.sampled_from([0, w - 1, None])),
    }


@hsettings
@given(c=same_three_tap_pools())
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_same_three_tap_pools_match_reference(op_type, c):
    assume(fits(c))
    x = data(c)
    if c["nan"]:
        w = x.shape[-1]
        at = c["seed"] % x.size
        if c["nan_column"] is not None:
            at = at - at % w + c["nan_column"]
        x.reshape(-1)[at] = np.nan
    check_pool_matches_reference(op_type, x, c)


@st.composite
def narrow_stride_2_pools(draw):
    """Planes at most 64 wide (and one past), stride 2 along x with 2 or 3 taps and no left pad (the
    register path in 2, 4 or 8 vectors: densenet's 2x2 average pools, inception's 3x3 max pools
    on 14x14 to 56x56 planes, squeezenet's on 55x55); rows padded, strided, dilated and counted
    any way; NaN somewhere now and then, often in a row's last column."""
    kh, kw = draw(st.integers(1, 4)), draw(st.sampled_from([2, 3]))
    return {
        "shape": (draw(st.integers(1, 2)), draw(st.integers(1, 5)), draw(st.integers(1, 13)),
                  draw(st.one_of(st.integers(kw, 33), st.integers(kw, 65)))),
        "kernel_shape": [kh, kw], "strides": [draw(st.integers(1, 3)), 2],
        "dilations": [draw(st.integers(1, 2)), 1],
        "pads": [draw(st.integers(0, kh - 1)), 0, draw(st.integers(0, kh - 1)),
                 draw(st.integers(0, kw - 1))],
        "ceil_mode": draw(st.booleans()), "count_include_pad": draw(st.booleans()),
        "seed": draw(st.integers(0, 1000)), "nan": draw(st.booleans()),
        "nan_at_row_end": draw(st.booleans()),
    }


@hsettings
@given(c=narrow_stride_2_pools())
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_narrow_stride_2_pools_match_reference(op_type, c):
    assume(fits(c))
    x = data(c)
    if c["nan"]:
        at = c["seed"] % x.size
        if c["nan_at_row_end"]:  # the column loaded through the mask
            w = x.shape[-1]
            at = at - at % w + w - 1
        x.reshape(-1)[at] = np.nan
    check_pool_matches_reference(op_type, x, c)


@st.composite
def wide_stride_2_pools(draw):
    """Stride 2 along x with 2 or 3 taps, rows up to 40 columns or from 60 to 140, padded on
    the left or not (the AVX-512 paths: up to 32 outputs a row in registers, in one or two
    sixteens, longer rows 16 outputs a step: squeezenet's 111x111 and the 112x112 max pools, the
    padded 3x3 average pools of shufflenet); rows padded, strided, dilated, counted any way;
    NaN now and then, often in a row's first or last column."""
    kh, kw = draw(st.integers(1, 4)), draw(st.sampled_from([2, 3]))
    return {
        "shape": (draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 9)),
                  draw(st.one_of(st.integers(kw, 40), st.integers(60, 140)))),
        "kernel_shape": [kh, kw], "strides": [draw(st.integers(1, 3)), 2],
        "dilations": [draw(st.integers(1, 2)), 1],
        "pads": [draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1)),
                 draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1))],
        "ceil_mode": draw(st.booleans()), "count_include_pad": draw(st.booleans()),
        "seed": draw(st.integers(0, 1000)), "nan": draw(st.booleans()),
        "nan_column": draw(st.sampled_from(["first", "last", None])),
    }


def nan_in(x, c):
    """x with one NaN where c puts it (a row's first or last column, or anywhere)."""
    if c["nan"]:
        w = x.shape[-1]
        at = c["seed"] % x.size
        if c["nan_column"] == "first":
            at -= at % w
        elif c["nan_column"] == "last":
            at = at - at % w + w - 1
        x.reshape(-1)[at] = np.nan
    return x


@hsettings
@given(c=wide_stride_2_pools())
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_wide_stride_2_pools_match_reference(op_type, c):
    assume(fits(c))
    check_pool_matches_reference(op_type, nan_in(data(c), c), c)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=st.one_of(wide_stride_2_pools(), narrow_stride_2_pools()))
@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_every_vector_level_gives_the_same_bits(op_type, c, isa_level):
    # each path reduces rows first, then columns, in the same order: the same float32 sums
    if isa_level != CPU_LEVELS[0]:
        pytest.skip("runs every level itself, once")
    assume(fits(c))
    x = nan_in(data(c), c) if "nan_column" in c else data(c)
    attrs = dict(window(c), ceil_mode=c["ceil_mode"])
    if op_type == "AveragePool":
        attrs["count_include_pad"] = c["count_include_pad"]
    run = kernels.average_pool2d if op_type == "AveragePool" else kernels.max_pool2d
    results = []
    for level in CPU_LEVELS:
        with kernels.isa_limit(level):
            results.append(run(x, **attrs).tobytes())
    assert all(r == results[0] for r in results)


def test_hand_checked_same_average_pool():
    # a 2x3 plane 0..5, 3x3 windows at stride 1 with one pad cell each side
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    got = kernels.average_pool2d(x, [3, 3], pads=[1, 1, 1, 1])
    np.testing.assert_allclose(got[0, 0], [[2, 2.5, 3], [2, 2.5, 3]])
    got = kernels.average_pool2d(x, [3, 3], pads=[1, 1, 1, 1], count_include_pad=True)
    np.testing.assert_allclose(got[0, 0], [[8 / 9, 15 / 9, 12 / 9], [8 / 9, 15 / 9, 12 / 9]],
                               rtol=1e-6)


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("shape", [(2, 3, 7, 5), (1, 5, 1, 19), (3, 2, 4, 4)])
def test_one_window_over_each_whole_plane(op_type, shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    kernel = list(shape[2:])
    want = reference(op_type, x, kernel_shape=kernel)
    fn = kernels.max_pool2d if op_type == "MaxPool" else kernels.average_pool2d
    # a whole plane's mean is a float32 sum over up to 35 values, in SIMD lanes
    np.testing.assert_allclose(fn(x, kernel), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_hand_checked_dilated_window_as_tall_as_the_plane(op_type):
    # a 2x1 window dilated by 2 over planes of 2 rows, one pad row below: the window's taps
    # are row 0 and the pad row, so each output is row 0 alone (not a whole-plane pool)
    x = np.array([1, 5, 7, -3, -2, 4], dtype=np.float32).reshape(1, 3, 2, 1)
    fn = kernels.max_pool2d if op_type == "MaxPool" else kernels.average_pool2d
    got = fn(x, [2, 1], strides=[1, 1], dilations=[2, 1], pads=[0, 0, 1, 0])
    np.testing.assert_array_equal(got.ravel(), [1, 7, -2])


def test_hand_checked_stride_2():
    # one row 0..18: windows of 3 at stride 2 with one pad cell on the left
    x = np.arange(19, dtype=np.float32).reshape(1, 1, 1, 19)
    got = kernels.max_pool2d(x, [1, 3], strides=[1, 2], pads=[0, 1, 0, 1])
    np.testing.assert_array_equal(got[0, 0, 0], [1, 3, 5, 7, 9, 11, 13, 15, 17, 18])
    got = kernels.average_pool2d(x, [1, 3], strides=[1, 2], pads=[0, 1, 0, 1])
    np.testing.assert_allclose(got[0, 0, 0], [0.5, 2, 4, 6, 8, 10, 12, 14, 16, 17.5])
    got = kernels.average_pool2d(x, [1, 3], strides=[1, 2], pads=[0, 1, 0, 1],
                                 count_include_pad=True)
    # 1/3 and 35/3 are not float32 values: one rounding apart
    np.testing.assert_allclose(got[0, 0, 0], [1 / 3, 2, 4, 6, 8, 10, 12, 14, 16, 35 / 3],
                               rtol=1e-6)


@pytest.mark.parametrize("column", [0, 8, 15, 16, 20, 22])
@pytest.mark.parametrize("strides", [[2, 2], [1, 1]])
def test_max_pool_propagates_nan_in_every_lane(column, strides):
    x = np.random.default_rng(2).standard_normal((1, 2, 5, 23)).astype(np.float32)
    x[0, 1, 2, column] = np.nan
    got = kernels.max_pool2d(x, [3, 3], strides=strides)
    want = reference("MaxPool", x, kernel_shape=[3, 3], strides=strides)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got).any()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op_type", ["MaxPool", "AveragePool"])
def test_same_result_at_one_and_two_threads(op_type):
    x = np.random.default_rng(3).standard_normal((2, 48, 29, 31)).astype(np.float32)
    wide = np.random.default_rng(5).standard_normal((2, 40, 23, 55)).astype(np.float32)
    fn = kernels.max_pool2d if op_type == "MaxPool" else kernels.average_pool2d
    before = kernels.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            kernels.set_num_threads(threads)
            results.append(fn(x, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
            results.append(fn(x[:, :, :14, :13], [3, 3], pads=[1, 1, 1, 1]))  # the flat path
            results.append(fn(x[:, :, :7, :7], [3, 3], pads=[1, 1, 1, 1]))  # rows under 8
            results.append(fn(x[:, :, :, :28], [2, 2], strides=[2, 2]))  # the narrow path
            results.append(fn(wide, [3, 3], strides=[2, 2]))  # narrow in 8 vectors
            results.append(fn(np.concatenate([wide, wide], axis=3), [3, 3], strides=[2, 2],
                              pads=[0, 1, 1, 1]))  # 110 columns: AVX-512's stride 2
    finally:
        kernels.set_num_threads(before)
    for one, two in zip(results[:6], results[6:]):
        assert one.tobytes() == two.tobytes()


@pytest.mark.parametrize("op_type, attrs", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2]}),
    ("MaxPool", {"kernel_shape": [2, 3], "pads": [1, 0, 1, 2], "dilations": [2, 1],
                 "ceil_mode": 1}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 2], "strides": [1, 3], "pads": [2, 1, 0, 1],
                     "count_include_pad": 1, "ceil_mode": 1}),
])
def test_pools_run_in_the_step_table(op_type, attrs):
    model = pool_model(op_type, ["N", 3, "H", "W"], **attrs)
    in_c, in_python = Plan(model, KERNELS, c_steps=C_STEPS), Plan(model, KERNELS)
    for shape in [(2, 3, 13, 27), (1, 3, 6, 9)]:  # planned again for the second shape
        feeds = {"x": np.random.default_rng(4).standard_normal(shape).astype(np.float32)}
        for _ in range(3):
            got = in_c.run(dict(feeds))
        want = in_python.run(dict(feeds))
        assert got[0].tobytes() == want[0].tobytes()
        compiled = in_c._programs[(("x", shape, np.dtype(np.float32)),)]
        kinds = [compiled.table.steps[i].kind for i in range(compiled.table.count)]
        assert kinds == [lib.PLAN_POOL]


def test_max_pool_with_indices_stays_in_python():
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2])
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("i", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    plan = Plan(model, KERNELS, c_steps=C_STEPS)
    x = np.random.default_rng(5).standard_normal((1, 2, 4, 6)).astype(np.float32)
    for _ in range(3):
        y, i = plan.run({"x": x})
    want_y, want_i = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(i, want_i)


@hsettings
@given(n=st.integers(1, 2), c=st.integers(1, 9), h=st.integers(1, 23), w=st.integers(1, 29),
       seed=st.integers(0, 1000), nan=st.booleans())
def test_global_average_pool_matches_reference(n, c, h, w, seed, nan):
    # planes of 1 to 667 values: the sixteen running sums, their tail and NaN anywhere
    x = np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(np.float32) + 3
    if nan:
        x.reshape(-1)[seed % x.size] = np.nan
    want = ReferenceEvaluator(pool_model("GlobalAveragePool", [n, c, h, w])).run(None, {"x": x})[0]
    got = kernels.global_average_pool(x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    # sums in double, then scaled and rounded: within one float32 ulp (2**-23 relative) of the exact
    # mean; the reference's float32 pairwise mean is itself a few ulps off on such planes
    # (seed 175 on 7x25: 3 ulps), so it is held to the float32 sum's error bound
    exact = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(got, exact, rtol=2.0**-23, atol=0)
    np.testing.assert_allclose(got, want, rtol=np.log2(h * w + 1) * 2.0**-23 + 2.0**-24, atol=0)


def test_hand_checked_global_average_pool():
    # 1 + 2 + ... + 35 = 630 over one 5x7 plane (past the sixteen-lane loop, with a tail)
    x = np.arange(1, 36, dtype=np.float32).reshape(1, 1, 5, 7)
    assert kernels.global_average_pool(x)[0, 0, 0, 0] == np.float32(18)
    # values whose float32 running sum loses the small ones: double sums keep them
    x = np.array([2**24] + [1] * 31 + [-2**24], np.float32).reshape(1, 1, 1, 33)
    np.testing.assert_allclose(kernels.global_average_pool(x)[0, 0, 0, 0], 31 / 33, rtol=1e-7)


def test_global_average_pool_same_at_one_and_two_threads():
    x = np.random.default_rng(6).standard_normal((2, 300, 13, 11)).astype(np.float32)
    before = kernels.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            kernels.set_num_threads(threads)
            results.append(kernels.global_average_pool(x).tobytes())
    finally:
        kernels.set_num_threads(before)
    assert results[0] == results[1]
