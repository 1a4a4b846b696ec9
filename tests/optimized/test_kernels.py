"""The C kernels of optimized/kernels.py against the reference ops, plus hand-checked values,
thread-count invariance and argument errors."""
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import helper

from optimized import kernels
from reference import ReferenceEvaluator
from reference.dtypes import onnx_type

RTOL, ATOL = 1e-4, 1e-5
hsettings = settings(max_examples=40, deadline=None)


def ref(op_type, *inputs, opset=22, n_out=1, **attrs):
    """Run one reference node; None marks an absent optional input."""
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    outs = [f"out{i}" for i in range(n_out)]
    graph = helper.make_graph(
        [helper.make_node(op_type, names, outs, **attrs)],
        "t",
        [helper.make_tensor_value_info(n, onnx_type(v.dtype), v.shape)
         for n, v in zip(names, inputs) if v is not None],
        [helper.make_empty_tensor_value_info(o) for o in outs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {n: v for n, v in zip(names, inputs) if v is not None}
    res = ReferenceEvaluator(model, check=False).run(None, feeds)
    return res[0] if n_out == 1 else res


def ref_activation(y, name, params=()):
    """The reference op behind each fused activation name."""
    f32 = np.float32
    if name is None:
        return y
    if name == "LeakyRelu":
        return ref("LeakyRelu", y, alpha=params[0]) if params else ref("LeakyRelu", y)
    if name == "Clip":
        lo, hi = (list(params) + [None, None])[:2]
        return ref("Clip", y, None if lo is None else f32(lo), None if hi is None else f32(hi))
    if name in ("Gelu", "GeluTanh"):
        return ref("Gelu", y, approximate="none" if name == "Gelu" else "tanh")
    return ref(name, y)


ACTIVATION_CASES = [
    (None, ()), ("Relu", ()), ("LeakyRelu", (0.2,)), ("LeakyRelu", ()), ("Sigmoid", ()),
    ("Tanh", ()), ("Clip", (-0.5, 0.7)), ("Clip", (0.0,)), ("Gelu", ()), ("GeluTanh", ()),
]
activations = st.sampled_from(ACTIVATION_CASES)


def arrays(seed, *shape, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# --- gemm ----------------------------------------------------------------------------------

C_SHAPES = ["none", "scalar", "row", "row2d", "column", "full"]


def c_of_kind(kind, m, n, seed):
    shapes = {"scalar": (), "row": (n,), "row2d": (1, n), "column": (m, 1), "full": (m, n)}
    return None if kind == "none" else arrays(seed, *shapes[kind])


@hsettings
@given(m=st.integers(1, 13), n=st.integers(1, 11), k=st.integers(0, 9),
       trans_a=st.booleans(), trans_b=st.booleans(), c_kind=st.sampled_from(C_SHAPES),
       alpha=st.sampled_from([1.0, 0.5, -2.0]), beta=st.sampled_from([1.0, 0.0, 3.0]),
       act=activations, seed=st.integers(0, 1000))
def test_gemm_matches_reference(m, n, k, trans_a, trans_b, c_kind, alpha, beta, act, seed):
    a = arrays(seed, *((k, m) if trans_a else (m, k)))
    b = arrays(seed + 1, *((n, k) if trans_b else (k, n)))
    c = c_of_kind(c_kind, m, n, seed + 2)
    expected = ref("Gemm", a, b, c, alpha=alpha, beta=beta, transA=int(trans_a),
                   transB=int(trans_b))
    expected = ref_activation(expected, *act)
    got = kernels.gemm(a, b, c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b,
                       activation=act[0], activation_params=act[1])
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("m, k, n", [(1, 700, 900), (900, 700, 1), (300, 200, 250), (130, 90, 260)])
@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_gemm_split_across_threads_matches_reference(m, k, n, trans_a, trans_b, threads):
    # big enough that gemm_parallel splits rows (M >= N) or columns across two threads
    kernels.set_num_threads(2)
    a = arrays(1, *((k, m) if trans_a else (m, k)))
    b = arrays(2, *((n, k) if trans_b else (k, n)))
    c = arrays(3, n)
    expected = ref("Gemm", a, b, c, alpha=0.5, transA=trans_a, transB=trans_b)
    got = kernels.gemm(a, b, c, alpha=0.5, trans_a=trans_a, trans_b=trans_b)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


# --- matmul (batched GEMM) -----------------------------------------------------------------

def ref_fused_matmul(a, b, alpha, trans_a, trans_b):
    graph = helper.make_graph(
        [helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", alpha=alpha,
                          transA=int(trans_a), transB=int(trans_b))], "t",
        [helper.make_tensor_value_info("a", 1, a.shape), helper.make_tensor_value_info("b", 1, b.shape)],
        [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22),
                                                    helper.make_opsetid("com.microsoft", 1)])
    return ReferenceEvaluator(model, check=False).run(None, {"a": a, "b": b})[0]


batch_shapes = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)


@hsettings
@given(batch=batch_shapes, share_a=st.booleans(), b_rank2=st.booleans(),
       m=st.integers(1, 9), n=st.integers(1, 8), k=st.integers(0, 7),
       trans_a=st.booleans(), trans_b=st.booleans(), alpha=st.sampled_from([1.0, 0.125, -2.0]),
       seed=st.integers(0, 1000))
def test_matmul_matches_reference(batch, share_a, b_rank2, m, n, k, trans_a, trans_b, alpha,
                                  seed):
    # b carries the batch or none; a carries it too, or broadcasts over every other axis
    a_batch = tuple(1 if i % 2 else d for i, d in enumerate(batch)) if share_a else batch
    b_batch = () if b_rank2 else batch
    a = arrays(seed, *a_batch, *((k, m) if trans_a else (m, k)))
    b = arrays(seed + 1, *b_batch, *((n, k) if trans_b else (k, n)))
    expected = ref_fused_matmul(a, b, alpha, trans_a, trans_b)
    got = kernels.matmul(a, b, alpha=alpha, trans_a=trans_a, trans_b=trans_b)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_matmul_hand_checked_batches():
    a = np.arange(12, dtype=np.float32).reshape(3, 2, 2)   # three 2x2 matrices
    b = np.array([[0, 1], [1, 0]], np.float32)              # swaps columns
    np.testing.assert_array_equal(kernels.matmul(a, b), a[:, :, ::-1])
    eye = np.stack([np.eye(2, dtype=np.float32), 2 * np.eye(2, dtype=np.float32)])[:, None]
    got = kernels.matmul(eye, np.ones((3, 2, 2), np.float32))  # (2,1,2,2) x (3,2,2)
    assert got.shape == (2, 3, 2, 2)
    np.testing.assert_array_equal(got[1], np.full((3, 2, 2), 2, np.float32))


def test_matmul_refuses_rank_1_and_mismatched_shapes():
    with pytest.raises(ValueError, match="rank >= 2"):
        kernels.matmul(arrays(0, 2), arrays(1, 2, 2))
    with pytest.raises(ValueError, match="inner dimensions"):
        kernels.matmul(arrays(0, 2, 3), arrays(1, 2, 3))
    with pytest.raises(ValueError, match="do not broadcast"):
        kernels.matmul(arrays(0, 2, 2, 2), arrays(1, 3, 2, 2))


def test_gemm_hand_checked_gemv_rows_and_columns():
    a = np.array([[1, 2, 3]], np.float32)            # M = 1: GEMV over B
    b = np.array([[1, 0], [0, 1], [1, 1]], np.float32)
    np.testing.assert_array_equal(kernels.gemm(a, b), [[4, 5]])
    np.testing.assert_array_equal(kernels.gemm(b, a, trans_a=True, trans_b=True), [[4], [5]])
    c = np.array([10, 20], np.float32)
    np.testing.assert_array_equal(kernels.gemm(a, b, c, alpha=2.0, beta=0.5), [[13, 20]])


def test_gemm_relu_fused_after_bias():
    a = np.array([[1.0, -1.0]], np.float32)
    b = np.eye(2, dtype=np.float32)
    c = np.array([-2.0, 0.5], np.float32)
    # 1 - 2 = -1 -> 0, -1 + 0.5 = -0.5 -> 0 under Relu; LeakyRelu 0.1 keeps a tenth
    np.testing.assert_array_equal(kernels.gemm(a, b, c, activation="Relu"), [[0, 0]])
    np.testing.assert_allclose(kernels.gemm(a, b, c, activation="LeakyRelu", activation_params=[0.1]),
                               [[-0.1, -0.05]], rtol=1e-6)


def test_gemm_nan_in_c_survives_beta_zero():
    # ONNX Gemm computes beta * C even when beta is 0, so NaN in C reaches Y as in the reference
    a = np.ones((2, 2), np.float32)
    c = np.array([np.nan, 1.0], np.float32)
    y = kernels.gemm(a, a, c, beta=0.0)
    assert np.isnan(y[:, 0]).all() and (y[:, 1] == 2).all()


# --- conv2d --------------------------------------------------------------------------------

@st.composite
def conv_cases(draw):
    group = draw(st.integers(1, 3))
    case = {
        "batch": draw(st.integers(1, 2)), "group": group,
        "cin": group * draw(st.integers(1, 3)), "cout": group * draw(st.integers(1, 3)),
        "h": draw(st.integers(1, 9)), "w": draw(st.integers(1, 10)),
        "kh": draw(st.integers(1, 3)), "kw": draw(st.integers(1, 4)),
        "strides": [draw(st.integers(1, 3)), draw(st.integers(1, 2))],
        "dilations": [draw(st.integers(1, 2)), draw(st.integers(1, 3))],
        "pads": [draw(st.integers(0, 2)) for _ in range(4)],
        "bias": draw(st.booleans()), "residual": draw(st.booleans()), "act": draw(activations),
        "seed": draw(st.integers(0, 1000)),
    }
    return case


@hsettings
@given(case=conv_cases())
def test_conv2d_matches_reference(case):
    c = case
    eh = (c["kh"] - 1) * c["dilations"][0] + 1
    ew = (c["kw"] - 1) * c["dilations"][1] + 1
    assume(c["h"] + c["pads"][0] + c["pads"][2] >= eh and c["w"] + c["pads"][1] + c["pads"][3] >= ew)
    x = arrays(c["seed"], c["batch"], c["cin"], c["h"], c["w"])
    w = arrays(c["seed"] + 1, c["cout"], c["cin"] // c["group"], c["kh"], c["kw"])
    b = arrays(c["seed"] + 2, c["cout"]) if c["bias"] else None
    expected = ref("Conv", x, w, b, group=c["group"], strides=c["strides"], pads=c["pads"],
                   dilations=c["dilations"])
    residual = arrays(c["seed"] + 3, *expected.shape) if c["residual"] else None
    if residual is not None:
        expected = expected + residual
    expected = ref_activation(expected, *c["act"])
    got = kernels.conv2d(x, w, b, group=c["group"], strides=c["strides"], pads=c["pads"],
                         dilations=c["dilations"], residual=residual, activation=c["act"][0],
                         activation_params=c["act"][1])
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("cin, cout, hw, kernel, pads, dilations, group", [
    (3, 4, (6, 7), (3, 3), [1, 1, 1, 1], [1, 1], 1),    # one GEMM per tap on a padded copy
    (4, 6, (5, 9), (2, 3), [0, 2, 1, 0], [2, 1], 2),    # asymmetric pads, dilation, groups
    (2, 3, (4, 4), (3, 3), [0, 0, 0, 0], [1, 1], 1),    # no padding at all
    (136, 136, (5, 6), (3, 3), [1, 1, 1, 1], [1, 1], 1),  # big weights on a small plane: im2col
])
def test_conv2d_stride_1_paths(cin, cout, hw, kernel, pads, dilations, group):
    x = arrays(1, 2, cin, *hw)
    w = arrays(2, cout, cin // group, *kernel, scale=0.1)
    b, residual = arrays(3, cout), None
    expected = ref("Conv", x, w, b, pads=pads, dilations=dilations, group=group)
    residual = arrays(4, *expected.shape)
    got = kernels.conv2d(x, w, b, pads=pads, dilations=dilations, group=group, residual=residual,
                         activation="Relu")
    np.testing.assert_allclose(got, np.maximum(expected + residual, 0), rtol=RTOL, atol=1e-4)


@pytest.mark.parametrize("hw, strides, pads, dilations, multiplier", [
    ((7, 9), [1, 1], [1, 1, 1, 1], [1, 1], 1),   # the vectorised row kernel
    ((8, 7), [2, 2], [1, 1, 1, 1], [1, 1], 1),
    ((9, 9), [1, 2], [0, 2, 1, 0], [2, 1], 2),    # asymmetric pads, dilation, 2 outputs per channel
    ((3, 3), [1, 1], [0, 0, 0, 0], [1, 1], 1),    # one output
])
def test_conv2d_depthwise_3x3(hw, strides, pads, dilations, multiplier):
    channels = 5
    x = arrays(1, 2, channels, *hw)
    w = arrays(2, channels * multiplier, 1, 3, 3)
    b = arrays(3, channels * multiplier)
    kw = {"group": channels, "strides": strides, "pads": pads, "dilations": dilations}
    np.testing.assert_allclose(kernels.conv2d(x, w, b, **kw), ref("Conv", x, w, b, **kw),
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_conv2d_auto_pad(auto_pad):
    x, w = arrays(1, 1, 3, 7, 6), arrays(2, 4, 3, 2, 3)
    expected = ref("Conv", x, w, auto_pad=auto_pad, strides=[2, 1])
    np.testing.assert_allclose(kernels.conv2d(x, w, auto_pad=auto_pad, strides=[2, 1]), expected,
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("n_threads", [1, 2])
def test_conv2d_in_many_column_blocks(n_threads, threads):
    # depth 40*5*3 = 600 puts ~100 output positions in each im2col block: blocks start and end
    # mid-row, and the last one is partial
    kernels.set_num_threads(n_threads)
    x, w, b = arrays(1, 2, 40, 50, 47), arrays(2, 14, 20, 5, 3), arrays(3, 14)
    attrs = {"group": 2, "strides": [2, 1], "pads": [2, 1, 1, 3], "dilations": [1, 2]}
    expected = ref("Conv", x, w, b, **attrs)
    residual = arrays(4, *expected.shape)
    got = kernels.conv2d(x, w, b, residual=residual, activation="Sigmoid", **attrs)
    np.testing.assert_allclose(got, ref("Sigmoid", expected + residual), rtol=RTOL, atol=ATOL)


def test_conv2d_pointwise_and_depthwise():
    x = arrays(3, 2, 6, 5, 4)
    w1 = arrays(4, 5, 6, 1, 1)  # 1x1: one GEMM per image straight from x
    np.testing.assert_allclose(kernels.conv2d(x, w1), ref("Conv", x, w1), rtol=RTOL, atol=ATOL)
    wd = arrays(5, 6, 1, 3, 3)  # depthwise: one group per channel
    np.testing.assert_allclose(kernels.conv2d(x, wd, group=6, pads=[1, 1, 1, 1]),
                               ref("Conv", x, wd, group=6, pads=[1, 1, 1, 1]), rtol=RTOL, atol=ATOL)


def test_conv2d_hand_checked():
    x = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    w = np.ones((1, 1, 2, 2), np.float32)
    # 2x2 window sums of [[0,1,2],[3,4,5],[6,7,8]]: 8, 12, 20, 24; then + bias 1 - residual 10
    y = kernels.conv2d(x, w, np.array([1], np.float32),
                       residual=np.full((1, 1, 2, 2), -10, np.float32), activation="Relu")
    np.testing.assert_array_equal(y, [[[[0, 3], [11, 15]]]])
    # stride 2 with one pad cell on every side: corners of the padded image
    y = kernels.conv2d(x, w, pads=[1, 1, 1, 1], strides=[2, 2])
    np.testing.assert_array_equal(y, [[[[0, 1 + 2], [3 + 6, 4 + 5 + 7 + 8]]]])


# --- pooling -------------------------------------------------------------------------------

@st.composite
def pool_cases(draw):
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    return {
        "n": draw(st.integers(1, 2)), "c": draw(st.integers(1, 3)),
        "h": draw(st.integers(1, 8)), "w": draw(st.integers(1, 9)), "kernel": [kh, kw],
        "strides": [draw(st.integers(1, 3)), draw(st.integers(1, 2))],
        "dilations": [draw(st.integers(1, 2)), draw(st.integers(1, 2))],
        "pads": [draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1)),
              draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1))],
        "ceil_mode": draw(st.booleans()), "count_include_pad": draw(st.booleans()),
        "seed": draw(st.integers(0, 1000)),
    }


def _pool_fits(c):
    eh = (c["kernel"][0] - 1) * c["dilations"][0] + 1
    ew = (c["kernel"][1] - 1) * c["dilations"][1] + 1
    return c["h"] + c["pads"][0] + c["pads"][2] >= eh and c["w"] + c["pads"][1] + c["pads"][3] >= ew


@hsettings
@given(case=pool_cases())
def test_max_pool2d_matches_reference(case):
    c = case
    assume(_pool_fits(c))
    x = arrays(c["seed"], c["n"], c["c"], c["h"], c["w"])
    attrs = {"kernel_shape": c["kernel"], "strides": c["strides"], "pads": c["pads"],
                 "dilations": c["dilations"], "ceil_mode": int(c["ceil_mode"])}
    expected = ref("MaxPool", x, **attrs)
    got = kernels.max_pool2d(x, c["kernel"], strides=c["strides"], pads=c["pads"],
                             dilations=c["dilations"], ceil_mode=c["ceil_mode"])
    np.testing.assert_array_equal(got, expected)


@hsettings
@given(case=pool_cases())
def test_average_pool2d_matches_reference(case):
    c = case
    assume(_pool_fits(c))
    x = arrays(c["seed"], c["n"], c["c"], c["h"], c["w"])
    attrs = {"kernel_shape": c["kernel"], "strides": c["strides"], "pads": c["pads"],
                 "dilations": c["dilations"], "ceil_mode": int(c["ceil_mode"]),
                 "count_include_pad": int(c["count_include_pad"])}
    expected = ref("AveragePool", x, **attrs)
    got = kernels.average_pool2d(x, c["kernel"], strides=c["strides"], pads=c["pads"],
                                 dilations=c["dilations"], ceil_mode=c["ceil_mode"],
                                 count_include_pad=c["count_include_pad"])
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_pools_hand_checked():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    np.testing.assert_array_equal(kernels.max_pool2d(x, [2, 2], strides=[2, 2]), [[[[5, 7], [13, 15]]]])
    # one pad cell on top/left, 2x2 windows, stride 2: the top-left window holds x[0, 0] only
    got = kernels.average_pool2d(x, [2, 2], strides=[2, 2], pads=[1, 1, 0, 0])
    assert got[0, 0, 0, 0] == 0.0 and got[0, 0, 0, 1] == (1 + 2) / 2
    got = kernels.average_pool2d(x, [2, 2], strides=[2, 2], pads=[1, 1, 0, 0], count_include_pad=True)
    assert got[0, 0, 0, 0] == 0.0 and got[0, 0, 0, 1] == (1 + 2) / 4
    # ceil mode: a 3x3 input with 2x2 stride-2 windows gets a partial last window
    y = kernels.average_pool2d(x[:, :, :3, :3], [2, 2], strides=[2, 2], ceil_mode=True)
    np.testing.assert_array_equal(y, [[[[2.5, 4.0], [8.5, 10]]]])  # [[0,1,2],[4,5,6],[8,9,10]]


def test_max_pool2d_propagates_nan():
    x = np.zeros((1, 1, 2, 2), np.float32)
    x[0, 0, 1, 0] = np.nan
    assert np.isnan(kernels.max_pool2d(x, [2, 2])).all()


def test_global_average_pool():
    x = arrays(7, 2, 3, 5, 4)
    np.testing.assert_allclose(kernels.global_average_pool(x), ref("GlobalAveragePool", x),
                               rtol=1e-6, atol=1e-6)
    assert kernels.global_average_pool(np.ones((1, 2, 3), np.float32)).shape == (1, 2, 1)


# --- elementwise ---------------------------------------------------------------------------

BROADCASTS = [
    ((2, 3, 4, 5), (2, 3, 4, 5)),   # same shape
    ((2, 3, 4, 5), ()),             # scalar
    ((), (3, 4)),                   # scalar on the left
    ((2, 3, 4, 5), (3, 1, 1)),      # per channel
    ((2, 3, 4, 5), (5,)),           # per last axis
    ((4, 1), (1, 6)),               # outer product
    ((2, 1, 4, 1), (1, 3, 1, 5)),   # both broadcast, four loop axes
    ((7,), (7,)),
    ((3, 9000), (9000,)),           # rows longer than one 4096-element task
    ((9000,), ()),
]


@pytest.mark.parametrize("op", sorted(kernels.BINARY_OPS))
@pytest.mark.parametrize("shapes", BROADCASTS)
def test_binary_matches_reference(op, shapes):
    a, b = arrays(1, *shapes[0]), arrays(2, *shapes[1]) + np.float32(3)
    np.testing.assert_allclose(kernels.binary(op, a, b), ref(op, a, b), rtol=1e-6, atol=1e-7)


@given(act=activations, seed=st.integers(0, 100))
@settings(max_examples=20, deadline=None)
def test_binary_fused_activation(act, seed):
    a, b = arrays(seed, 2, 3, 4), arrays(seed + 1, 3, 1)
    expected = ref_activation(ref("Add", a, b), *act)
    got = kernels.add(a, b, activation=act[0], activation_params=act[1])
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_binary_in_place_and_nan():
    a = np.array([1.0, np.nan, 3.0], np.float32)
    b = np.array([2.0, 0.0, np.nan], np.float32)
    for op in ("Max", "Min"):
        y = kernels.binary(op, a, b)
        assert y[0] == (2.0 if op == "Max" else 1.0) and np.isnan(y[1:]).all()
    x = np.ones((3, 4), np.float32)
    kernels.mul(x, np.float32(2) * np.ones(4, np.float32), out=x)
    assert (x == 2).all()


def test_binary_irregular_broadcast_is_refused():
    a, b = arrays(1, 2, 1, 3, 1, 4), arrays(2, 1, 5, 1, 6, 1)
    with pytest.raises(ValueError, match="loop axes"):
        kernels.add(a, b)


@pytest.mark.parametrize("name, params", ACTIVATION_CASES[1:])
def test_activation_matches_reference(name, params):
    x = arrays(3, 3, 1000, scale=4.0)
    x[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    np.testing.assert_allclose(kernels.activation(x, name, params), ref_activation(x, name, params),
                               rtol=RTOL, atol=ATOL)


def test_activations_hand_checked():
    x = np.array([-1.0, 0.0, 1.0], np.float32)
    np.testing.assert_allclose(kernels.gelu(x), [-0.15865525, 0.0, 0.84134475], rtol=1e-6)
    np.testing.assert_allclose(kernels.gelu(x, "tanh"), [-0.15880801, 0.0, 0.84119199], rtol=1e-6)
    np.testing.assert_allclose(kernels.activation(x, "Sigmoid"), [0.26894142, 0.5, 0.73105858], rtol=1e-6)
    # Clip with min > max sets everything to max, as the ONNX spec says
    np.testing.assert_array_equal(kernels.activation(x, "Clip", (2.0, 1.0)), [1, 1, 1])
    np.testing.assert_array_equal(kernels.relu_f32(np.array([-2, np.nan, 3], np.float32))[[0, 2]], [0, 3])


# --- row-wise kernels ----------------------------------------------------------------------

@hsettings
@given(rows=st.integers(1, 7), cols=st.integers(1, 300), kind=st.sampled_from(["sum", "mean", "max"]),
       seed=st.integers(0, 100))
def test_reduce_last_matches_reference(rows, cols, kind, seed):
    x = arrays(seed, 2, rows, cols)
    op = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax"}[kind]
    expected = ref(op, x, np.array([-1], np.int64), opset=18)
    np.testing.assert_allclose(kernels.reduce_last(x, kind), expected, rtol=1e-5, atol=1e-5)
    assert kernels.reduce_last(x, kind, keepdims=False).shape == (2, rows)


@hsettings
@given(rows=st.integers(1, 7), cols=st.integers(1, 300), scale=st.sampled_from([1.0, 50.0]),
       seed=st.integers(0, 100))
def test_softmax_matches_reference(rows, cols, scale, seed):
    x = arrays(seed, rows, 3, cols, scale=scale)
    np.testing.assert_allclose(kernels.softmax(x), ref("Softmax", x, opset=13), rtol=1e-5, atol=1e-6)


def test_softmax_hand_checked_and_stable():
    y = kernels.softmax(np.array([[0.0, math.log(3.0)], [1000.0, 1000.0]], np.float32))
    np.testing.assert_allclose(y, [[0.25, 0.75], [0.5, 0.5]], rtol=1e-6)


def test_exp_keeps_subnormal_results_and_edge_values():
    # softmax([0, v]) = e^v / (1 + e^v): e^-90 = 8.194e-40 is subnormal in float32
    v = np.array([-80.0, -90.0, -100.0, -103.9, -104.0, -np.inf, 88.0, np.nan], np.float32)
    x = np.stack([np.zeros_like(v), v], axis=1)
    got = kernels.softmax(x)[:, 1]
    with np.errstate(over="ignore", invalid="ignore"):
        expected = np.exp(v.astype(np.float64)) / (1 + np.exp(v.astype(np.float64)))
    np.testing.assert_allclose(got[:4], expected[:4].astype(np.float32), rtol=1e-6)
    assert got[4] == 0.0 and got[5] == 0.0  # below the smallest subnormal; e^-inf
    np.testing.assert_allclose(got[6], 1.0, rtol=1e-6)
    assert np.isnan(got[7])


@hsettings
@given(rows=st.integers(1, 9), cols=st.integers(1, 200), with_bias=st.booleans(),
       epsilon=st.sampled_from([1e-5, 1e-2]), seed=st.integers(0, 100))
def test_layer_norm_matches_reference(rows, cols, with_bias, epsilon, seed):
    x = arrays(seed, 2, rows, cols, scale=3.0) + np.float32(1.5)
    scale, bias = arrays(seed + 1, cols), (arrays(seed + 2, cols) if with_bias else None)
    y, mean, inv_std = ref("LayerNormalization", x, scale, bias, opset=17, n_out=3, epsilon=epsilon)
    got = kernels.layer_norm(x, scale, bias, epsilon=epsilon, return_stats=True)
    for g, e in zip(got, (y, mean, inv_std)):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


def test_layer_norm_hand_checked():
    x = np.array([[1.0, 3.0]], np.float32)  # mean 2, variance 1
    y = kernels.layer_norm(x, np.array([2.0, 1.0], np.float32), np.array([0.0, 10.0], np.float32),
                           epsilon=0.0)
    np.testing.assert_allclose(y, [[-2.0, 11.0]], rtol=1e-6)


# --- attention -----------------------------------------------------------------------------

@hsettings
@given(batch=st.integers(1, 2), heads=st.integers(1, 3), q_len=st.integers(1, 6),
       kv_len=st.integers(1, 7), head_size=st.integers(1, 9), v_head_size=st.integers(1, 5),
       mask_shape=st.sampled_from([None, "2d", "4d", "bool"]), causal=st.booleans(),
       scale=st.sampled_from([None, 0.3]), seed=st.integers(0, 100))
def test_attention_matches_reference(batch, heads, q_len, kv_len, head_size, v_head_size,
                                     mask_shape, causal, scale, seed):
    q = arrays(seed, batch, heads, q_len, head_size)
    k = arrays(seed + 1, batch, heads, kv_len, head_size)
    v = arrays(seed + 2, batch, heads, kv_len, v_head_size)
    mask = {None: None, "2d": arrays(seed + 3, q_len, kv_len),
            "4d": arrays(seed + 3, batch, 1, q_len, kv_len),
            "bool": np.random.default_rng(seed).random((q_len, kv_len)) > 0.3}[mask_shape]
    attrs = {"is_causal": int(causal)}
    if scale is not None:
        attrs["scale"] = scale
    expected = ref("Attention", q, k, v, mask, opset=23, **attrs)
    got = kernels.attention(q, k, v, mask, scale=scale, causal=causal)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_attention_causal_offset_is_the_past_length():
    q = arrays(1, 1, 2, 3, 4)
    past_k, past_v = arrays(2, 1, 2, 5, 4), arrays(3, 1, 2, 5, 6)
    new_k, new_v = arrays(4, 1, 2, 3, 4), arrays(5, 1, 2, 3, 6)
    expected = ref("Attention", q, new_k, new_v, None, past_k, past_v, opset=23, n_out=3,
                   is_causal=1)[0]
    got = kernels.attention(q, np.concatenate([past_k, new_k], 2), np.concatenate([past_v, new_v], 2),
                            causal=True, causal_offset=5)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_attention_hand_checked():
    q = np.zeros((1, 1, 2, 2), np.float32)        # equal scores: the mean of the visible values
    k = np.ones((1, 1, 3, 2), np.float32)
    v = np.array([[[[1.0], [2.0], [6.0]]]], np.float32)
    np.testing.assert_allclose(kernels.attention(q, k, v)[0, 0, :, 0], [3.0, 3.0], rtol=1e-6)
    np.testing.assert_allclose(kernels.attention(q, k, v, causal=True)[0, 0, :, 0], [1.0, 1.5], rtol=1e-6)
    # a query that sees no key gets zeros, not NaN
    mask = np.array([[False, False, False], [True, True, True]])
    np.testing.assert_array_equal(kernels.attention(q, k, v, mask)[0, 0, :, 0], [0.0, 3.0])


# --- threads -------------------------------------------------------------------------------

def test_thread_count_does_not_change_results(threads):
    x, w = arrays(1, 2, 16, 40, 36), arrays(2, 32, 8, 3, 3)
    b = arrays(3, 32)
    a, bm = arrays(4, 300, 200), arrays(5, 200, 250)
    s = arrays(6, 64, 512, scale=5.0)
    q, k, v = arrays(7, 2, 4, 64, 32), arrays(8, 2, 4, 80, 32), arrays(9, 2, 4, 80, 32)
    results = []
    for n in (1, 2):
        kernels.set_num_threads(n)
        assert kernels.get_num_threads() == n
        results.append([
            kernels.conv2d(x, w, b, group=2, pads=[1, 1, 1, 1], activation="Relu"),
            kernels.gemm(a, bm), kernels.softmax(s), kernels.layer_norm(s, s[0]),
            kernels.attention(q, k, v, causal=True), kernels.max_pool2d(x, [3, 3]),
            kernels.add(x, b[:16].reshape(16, 1, 1)),
        ])
    for one, two in zip(*results):
        np.testing.assert_allclose(one, two, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [0, -1, 1.5, True])
def test_set_num_threads_rejects_non_positive_integers(n):
    with pytest.raises(ValueError, match="positive integer"):
        kernels.set_num_threads(n)


# --- argument errors -----------------------------------------------------------------------

def f32(*shape):
    return np.zeros(shape, np.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda: kernels.gemm(f32(2, 3).astype(np.float64), f32(3, 2)), TypeError, "A must be float32"),
    (lambda: kernels.gemm([[1.0]], f32(1, 1)), TypeError, "A must be a numpy array"),
    (lambda: kernels.gemm(f32(2, 3), f32(2, 2)), ValueError, "inner dimensions"),
    (lambda: kernels.gemm(f32(2, 3, 1), f32(3, 2)), ValueError, "A must be 2-D"),
    (lambda: kernels.gemm(f32(2, 3), f32(3, 2), f32(3)), ValueError, "does not broadcast"),
    (lambda: kernels.gemm(f32(2, 3), f32(3, 2), out=f32(2, 3)), ValueError, "out has shape"),
    (lambda: kernels.gemm(f32(2, 2), f32(2, 2), activation="Swish"), ValueError, "unknown activation"),
    (lambda: kernels.gemm(f32(2, 2), f32(2, 2), activation="Relu", activation_params=[1]),
     ValueError, "takes 0 parameters"),
    (lambda: kernels.conv2d(f32(1, 4, 5, 5), f32(2, 2, 3, 3), group=3), ValueError, "group 3"),
    (lambda: kernels.conv2d(f32(1, 4, 5, 5), f32(2, 3, 3, 3)), ValueError, "input channels per group"),
    (lambda: kernels.conv2d(f32(1, 2, 2, 2), f32(1, 2, 3, 3)), ValueError, "does not fit"),
    (lambda: kernels.conv2d(f32(1, 2, 5, 5), f32(1, 2, 3, 3), f32(2)), ValueError, "bias must have shape"),
    (lambda: kernels.conv2d(f32(1, 2, 5, 5), f32(1, 2, 3, 3), strides=[0, 1]), ValueError, "strides"),
    (lambda: kernels.conv2d(f32(1, 2, 5, 5), f32(1, 2, 3, 3), pads=[1, 1]), ValueError, "pads"),
    (lambda: kernels.conv2d(f32(1, 2, 5, 5), f32(1, 2, 3, 3), residual=f32(1, 1, 5, 5)),
     ValueError, "residual"),
    (lambda: kernels.conv2d(f32(2, 5, 5), f32(1, 2, 3, 3)), ValueError, "X must be 4-D"),
    (lambda: kernels.max_pool2d(f32(1, 1, 4, 4), None), ValueError, "kernel_shape is required"),
    (lambda: kernels.max_pool2d(f32(1, 1, 4, 4), [2, 2], auto_pad="SAME"), ValueError, "auto_pad"),
    (lambda: kernels.average_pool2d(f32(1, 1, 4, 4), [2, 2], pads=[0, 0, -1, 0]), ValueError, "pads"),
    (lambda: kernels.add(f32(2, 3), f32(4)), ValueError, "do not broadcast"),
    (lambda: kernels.binary("Pow", f32(2), f32(2)), ValueError, "unknown binary op"),
    (lambda: kernels.add(f32(3), f32(2, 3), out=f32(3)), ValueError, "out has shape"),
    (lambda: kernels.reduce_last(f32(2, 0), "max"), ValueError, "empty last axis"),
    (lambda: kernels.reduce_last(f32(2, 3), "min"), ValueError, "unknown reduction"),
    (lambda: kernels.layer_norm(f32(2, 3), f32(4)), ValueError, "Scale must hold 3"),
    (lambda: kernels.attention(f32(1, 1, 2, 4), f32(1, 1, 3, 5), f32(1, 1, 3, 2)), ValueError, "K must be"),
    (lambda: kernels.attention(f32(1, 1, 2, 4), f32(1, 1, 3, 4), f32(1, 1, 3, 2), f32(3, 2)),
     ValueError, "mask of shape"),
    (lambda: kernels.global_average_pool(f32(2, 3)), ValueError, "spatial"),
    (lambda: kernels.gelu(f32(2), approximate="fast"), ValueError, "approximate"),
])
def test_bad_arguments_raise_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_out_that_overlaps_an_input_is_refused():
    a = f32(4, 4)
    with pytest.raises(ValueError, match="overlaps"):
        kernels.gemm(a, a, out=a)
    x = f32(1, 2, 5, 5)
    with pytest.raises(ValueError, match="overlaps"):
        kernels.max_pool2d(x, [1, 1], out=x)
    y = f32(2, 3)  # out may be the full-shape operand, never the broadcast row it would overwrite
    with pytest.raises(ValueError, match="overlaps"):
        kernels.add(y, y[0], out=y)


def test_non_contiguous_inputs_are_copied_not_misread():
    a = arrays(1, 6, 8)[:, ::2]          # strided view
    b = arrays(2, 5, 4).T                # Fortran-ordered view
    np.testing.assert_allclose(kernels.gemm(a, b), a @ b, rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.softmax(f32(3, 4), out=f32(4, 3).T)


def test_binary_keeps_0d_shapes():
    a, b = np.array(2.0, np.float32), np.array(3.0, np.float32)
    out = kernels.binary("Mul", a, b)
    assert out.shape == () and float(out) == 6.0
    assert kernels.binary("Add", a, np.ones((2, 3), np.float32)).shape == (2, 3)


def test_binary_max_and_min_of_signed_zeros_and_nan():
    """The C Max/Min give the reference's IEEE 754-2019 zeros and propagate NaN from either side."""
    a = np.tile(np.array([0.0, -0.0, 0.0, -0.0, np.nan, 1.0, 3.0], np.float32), 9)
    b = np.tile(np.array([-0.0, 0.0, 0.0, -0.0, 1.0, np.nan, 2.0], np.float32), 9)
    mx, mn = kernels.binary("Max", a, b), kernels.binary("Min", a, b)
    assert list(np.signbit(mx[:4])) == [False, False, False, True]
    assert list(np.signbit(mn[:4])) == [True, True, False, True]
    assert np.isnan(mx[4:6]).all() and np.isnan(mn[4:6]).all()
    assert (mx[6], mn[6]) == (3.0, 2.0)
