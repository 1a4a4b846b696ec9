"""MobileNetV3's kernels against the reference ops: HardSigmoid and HardSwish in C (alone, fused
into a convolution, and as plan steps) and the depthwise convolution of any kernel size, stride
and dilation (csrc/conv.c, phase layout), and the 3x3 depthwise kernel's AVX2 row at stride 2
along x (rows wide enough for its 8-lane loop and its masked last lanes)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from optimized import kernels
from optimized.cpu import C_STEPS, KERNELS
from optimized.plan import PY, Plan

from .test_kernels import ATOL, RTOL, arrays, ref

HARD_CASES = [("HardSigmoid", ()), ("HardSigmoid", (0.5, 0.25)), ("HardSigmoid", (1 / 6, 0.5)),
              ("HardSwish", ())]


def ref_hard(y, name, params=()):
    attrs = dict(zip(("alpha", "beta"), params))
    return ref(name, y, **attrs)


@pytest.mark.parametrize("name, params", HARD_CASES)
def test_hard_activations_match_reference(name, params):
    x = arrays(3, 3, 1000, scale=4.0)
    x[0, :7] = [np.nan, np.inf, -np.inf, 0.0, -3.0, 3.0, -0.0]
    got, want = kernels.activation(x, name, params), ref_hard(x, name, params)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)  # NaN where the reference has it


def test_hard_activations_hand_checked():
    x = np.array([-4.0, -3.0, -1.5, 0.0, 1.5, 3.0, 4.0], np.float32)
    np.testing.assert_allclose(kernels.activation(x, "HardSwish"),
                               [0, 0, -0.375, 0, 1.125, 3, 4], rtol=1e-6)
    np.testing.assert_allclose(kernels.activation(x, "HardSigmoid"),
                               [0, 0, 0.2, 0.5, 0.8, 1, 1], rtol=1e-6)  # alpha 0.2, beta 0.5
    np.testing.assert_allclose(kernels.activation(x, "HardSigmoid", (0.25, 0.25)),
                               [0, 0, 0, 0.25, 0.625, 1, 1], rtol=1e-6)
    assert np.isnan(kernels.activation(np.array([np.nan], np.float32), "HardSwish")[0])


@pytest.mark.parametrize("name, params", HARD_CASES)
def test_conv_with_fused_hard_activation(name, params):
    x, w, b = arrays(1, 2, 6, 5, 7), arrays(2, 4, 6, 1, 1), arrays(3, 4)
    want = ref_hard(ref("Conv", x, w, b), name, params)
    got = kernels.conv2d(x, w, b, activation=name, activation_params=params)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_fused_conv_with_hard_sigmoid_runs_the_fast_kernel():
    # squeeze-excite's second convolution, as fuse_bias_activation writes it
    x, w, b = arrays(1, 1, 16, 1, 1), arrays(2, 48, 16, 1, 1), arrays(3, 48)
    got = KERNELS[("com.microsoft", "FusedConv")](
        x, w, b, activation="HardSigmoid", activation_params=[1 / 6, 0.5])
    assert got is not NotImplemented
    np.testing.assert_allclose(got, ref("HardSigmoid", ref("Conv", x, w, b), alpha=1 / 6),
                               rtol=RTOL, atol=ATOL)


def test_hard_activations_run_as_c_steps():
    nodes = [helper.make_node("HardSwish", ["x"], ["a"]),
             helper.make_node("HardSigmoid", ["a"], ["y"], alpha=0.3, beta=0.4)]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 50])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 50])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    feeds = {"x": arrays(5, 3, 50, scale=4.0)}
    in_c, in_python = Plan(model, KERNELS, c_steps=C_STEPS), Plan(model, KERNELS)
    for _ in range(3):
        got = in_c.run(dict(feeds))
    want = in_python.run(dict(feeds))
    assert got[0].tobytes() == want[0].tobytes()
    compiled = in_c._programs[(("x", (3, 50), np.dtype(np.float32)),)]
    assert not [op for op in compiled.ops if op[0] == PY]
    np.testing.assert_allclose(got[0], ref("HardSigmoid", ref("HardSwish", feeds["x"]), alpha=0.3,
                                           beta=0.4), rtol=RTOL, atol=ATOL)


@st.composite
def depthwise_cases(draw):
    return {
        "batch": draw(st.integers(1, 2)), "channels": draw(st.integers(1, 5)),
        "multiplier": draw(st.integers(1, 2)),
        "h": draw(st.integers(1, 12)), "w": draw(st.integers(1, 13)),
        "kh": draw(st.integers(1, 6)), "kw": draw(st.integers(1, 6)),
        "strides": [draw(st.integers(1, 3)), draw(st.integers(1, 3))],
        "dilations": [draw(st.integers(1, 3)), draw(st.integers(1, 2))],
        "pads": [draw(st.integers(0, 3)) for _ in range(4)],
        "bias": draw(st.booleans()), "residual": draw(st.booleans()),
        "act": draw(st.sampled_from([(None, ()), ("Relu", ()), *HARD_CASES])),
        "threads": draw(st.integers(1, 2)), "seed": draw(st.integers(0, 1000)),
    }


# the fixture restores the thread count once, after every example: each example sets its own
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=depthwise_cases())
def test_depthwise_matches_reference(c, threads):
    eh = (c["kh"] - 1) * c["dilations"][0] + 1
    ew = (c["kw"] - 1) * c["dilations"][1] + 1
    assume(c["h"] + c["pads"][0] + c["pads"][2] >= eh and c["w"] + c["pads"][1] + c["pads"][3] >= ew)
    kernels.set_num_threads(c["threads"])
    channels, out_c = c["channels"], c["channels"] * c["multiplier"]
    x = arrays(c["seed"], c["batch"], channels, c["h"], c["w"])
    w = arrays(c["seed"] + 1, out_c, 1, c["kh"], c["kw"])
    b = arrays(c["seed"] + 2, out_c) if c["bias"] else None
    attrs = {"group": channels, "strides": c["strides"], "pads": c["pads"],
             "dilations": c["dilations"]}
    want = ref("Conv", x, w, b, **attrs)
    residual = arrays(c["seed"] + 3, *want.shape) if c["residual"] else None
    if residual is not None:
        want = want + residual
    if c["act"][0] is not None:
        want = ref_hard(want, *c["act"]) if c["act"][0] != "Relu" else ref("Relu", want)
    got = kernels.conv2d(x, w, b, residual=residual, activation=c["act"][0],
                         activation_params=c["act"][1], **attrs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@st.composite
def depthwise3x3_stride2_cases(draw):
    """3x3 at stride 2 along x, outputs 1 to 23 wide; rows stride 1 or 2, dilated or not."""
    return {
        "batch": draw(st.integers(1, 2)), "channels": draw(st.integers(1, 5)),
        "multiplier": draw(st.integers(1, 2)),
        "h": draw(st.integers(3, 11)), "w": draw(st.integers(3, 46)),
        "strides": [draw(st.integers(1, 2)), 2], "dilations": [draw(st.integers(1, 2)), 1],
        "pads": [draw(st.integers(0, 2)) for _ in range(4)],
        "bias": draw(st.booleans()), "nan": draw(st.booleans()), "seed": draw(st.integers(0, 1000)),
    }


@settings(max_examples=60, deadline=None)
@given(c=depthwise3x3_stride2_cases())
def test_depthwise3x3_stride2_matches_reference(c):
    assume(c["h"] + c["pads"][0] + c["pads"][2] >= 2 * c["dilations"][0] + 1)
    channels, out_c = c["channels"], c["channels"] * c["multiplier"]
    x = arrays(c["seed"], c["batch"], channels, c["h"], c["w"])
    if c["nan"]:
        x.reshape(-1)[c["seed"] % x.size] = np.nan
    w = arrays(c["seed"] + 1, out_c, 1, 3, 3)
    b = arrays(c["seed"] + 2, out_c) if c["bias"] else None
    attrs = {"group": channels, "strides": c["strides"], "pads": c["pads"],
             "dilations": c["dilations"]}
    want = ref("Conv", x, w, b, **attrs)
    got = kernels.conv2d(x, w, b, **attrs)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_depthwise3x3_stride2_same_at_one_and_two_threads(threads):
    x, w, b = arrays(4, 2, 36, 15, 29), arrays(5, 36, 1, 3, 3), arrays(6, 36)
    results = []
    for n_threads in (1, 2):
        kernels.set_num_threads(n_threads)
        results.append(kernels.conv2d(x, w, b, group=36, strides=[2, 2], pads=[1, 1, 1, 1]))
    assert results[0].tobytes() == results[1].tobytes()


def test_depthwise3x3_stride2_hand_checked():
    # two channels of one row 0..18 (the second negated), taps (1, 2, 3) at stride 2 with one
    # zero pad cell each side
    x = np.arange(19, dtype=np.float32).reshape(1, 1, 1, 19) * np.array([1, -1], np.float32).reshape(1, 2, 1, 1)
    w = np.zeros((2, 1, 3, 3), np.float32)
    w[:, 0, 1] = [1, 2, 3]
    got = kernels.conv2d(x, w, None, group=2, strides=[1, 2], pads=[1, 1, 1, 1])
    # output o reads x[2o - 1], x[2o], x[2o + 1]
    want = [2 * 0 + 3 * 1] + [(2 * o - 1) + 2 * (2 * o) + 3 * (2 * o + 1) for o in range(1, 9)] \
        + [17 + 2 * 18]
    np.testing.assert_array_equal(got[0, 0, 0], want)
    np.testing.assert_array_equal(got[0, 1, 0], -np.array(want, np.float32))


@pytest.mark.parametrize("channels, hw, kernel, strides, pads", [
    (120, (14, 13), (5, 5), [1, 1], [2, 2, 2, 2]),   # MobileNetV3's 5x5 depthwise
    (48, (28, 27), (5, 5), [2, 2], [2, 2, 2, 2]),
    (40, (9, 11), (3, 3), [2, 2], [1, 1, 1, 1]),     # 3x3 stride 2 stays on its own kernel
    (7, (11, 6), (7, 4), [3, 2], [3, 0, 1, 2]),
])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_depthwise_model_shapes_and_threads(channels, hw, kernel, strides, pads, n_threads, threads):
    kernels.set_num_threads(n_threads)
    x, w, b = arrays(1, 1, channels, *hw), arrays(2, channels, 1, *kernel), arrays(3, channels)
    attrs = {"group": channels, "strides": strides, "pads": pads}
    want = ref("HardSwish", ref("Conv", x, w, b, **attrs))
    got = kernels.conv2d(x, w, b, activation="HardSwish", **attrs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("n_threads", [1, 2])
def test_depthwise_stride_far_past_the_input(n_threads, threads):
    """One output per axis from a stride far past the input: the phase layout would hold
    stride x stride phase planes (2^20 x 2^20 of them, a failed 4 TiB allocation), so such a
    convolution takes the im2col path and gives the reference's values."""
    kernels.set_num_threads(n_threads)
    x, w, b = arrays(1, 2, 3, 5, 4), arrays(2, 6, 1, 1, 2), arrays(3, 6)
    attrs = {"group": 3, "strides": [2**20, 2**20], "pads": [0, 1, 0, 0]}
    want = ref("HardSwish", ref("Conv", x, w, b, **attrs))
    got = kernels.conv2d(x, w, b, activation="HardSwish", **attrs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("kernel, group", [((3, 3), 4), ((5, 5), 4), ((5, 5), 2), ((2, 2), 1),
                                           ((1, 1), 1)])
def test_conv_into_its_residual(kernel, group):
    """out=residual (which conv2d allows) gives act(conv + bias + residual), as a new output
    does: the C kernels write the convolution into y before adding the residual."""
    x, w, b = arrays(1, 2, 4, 6, 7), arrays(2, 4, 4 // group, *kernel), arrays(3, 4)
    pads = [(kernel[0] - 1) // 2, (kernel[1] - 1) // 2, kernel[0] // 2, kernel[1] // 2]
    residual = arrays(4, 2, 4, 6, 7)
    want = ref("Relu", ref("Conv", x, w, b, group=group, pads=pads) + residual)
    got = kernels.conv2d(x, w, b, group=group, pads=pads, residual=residual, out=residual,
                         activation="Relu")
    assert got is residual
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("attrs", [{"beta": 0.3}, {"alpha": 0.3}, {}])
def test_hard_sigmoid_with_some_attributes_given(attrs):
    """A HardSigmoid that sets beta alone keeps alpha's default 0.2 (the given beta is not
    taken for alpha), as a Python kernel and as a C step."""
    graph = helper.make_graph([helper.make_node("HardSigmoid", ["x"], ["y"], **attrs)], "t",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 50])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 50])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    feeds = {"x": arrays(6, 3, 50, scale=4.0)}
    want = ref("HardSigmoid", feeds["x"], **attrs)
    np.testing.assert_allclose(KERNELS[("", "HardSigmoid")](feeds["x"], **attrs), want,
                               rtol=RTOL, atol=ATOL)
    in_c = Plan(model, KERNELS, c_steps=C_STEPS)
    for _ in range(3):
        got = in_c.run(dict(feeds))
    np.testing.assert_allclose(got[0], want, rtol=RTOL, atol=ATOL)
