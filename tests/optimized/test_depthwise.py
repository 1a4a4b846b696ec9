"""Depthwise convolutions (one input channel per group, csrc/depthwise.c) against the reference
Conv: every kernel size, stride, dilation and padding that the AVX2 kernel takes (stride 1 or 2
along x, kernels up to 8x8) and those it leaves to the older paths, channel multipliers, batch,
bias, residual and every fused activation, plane widths that end in every partial vector,
non-finite values, and the same bits at 1 and 2 threads."""
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from optimized import kernels

from .test_kernels import ACTIVATION_CASES, ATOL, RTOL, arrays, ref, ref_activation

ACTIVATIONS = [*ACTIVATION_CASES, ("HardSigmoid", ()), ("HardSigmoid", (0.3, 0.4)),
               ("HardSwish", ())]


def fused_reference(x, w, b, residual, act, **attrs):
    y = ref("Conv", x, w, b, **attrs)
    if residual is not None:
        y = y + residual
    name, params = act
    if name == "HardSigmoid" and params:
        return ref("HardSigmoid", y, alpha=params[0], beta=params[1])
    return ref_activation(y, name, params)


def depthwise(x, w, b, residual=None, act=(None, ()), **attrs):
    return kernels.conv2d(x, w, b, residual=residual, activation=act[0],
                          activation_params=act[1], group=x.shape[1], **attrs)


@st.composite
def cases(draw):
    kh, kw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    dil = [draw(st.integers(1, 2)), draw(st.integers(1, 3))]
    pads = [draw(st.integers(0, 3)) for _ in range(4)]
    # rows just tall and wide enough for one window, up to a few vectors wide
    h = draw(st.integers(max(1, (kh - 1) * dil[0] + 1 - pads[0] - pads[2]), 16))
    w = draw(st.integers(max(1, (kw - 1) * dil[1] + 1 - pads[1] - pads[3]), 40))
    return {
        "batch": draw(st.integers(1, 2)), "channels": draw(st.integers(1, 5)),
        "multiplier": draw(st.integers(1, 2)), "h": h, "w": w, "kernel": (kh, kw),
        "strides": [draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 2, 3]))],
        "dilations": dil, "pads": pads, "bias": draw(st.booleans()),
        "residual": draw(st.booleans()), "act": draw(st.sampled_from(ACTIVATIONS)),
        "threads": draw(st.integers(1, 2)), "seed": draw(st.integers(0, 1000)),
    }


# the fixture restores the thread count once, after every example: each example sets its own
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=cases())
def test_matches_reference(c, threads):
    kh, kw = c["kernel"]
    assume(c["h"] + c["pads"][0] + c["pads"][2] >= (kh - 1) * c["dilations"][0] + 1)
    assume(c["w"] + c["pads"][1] + c["pads"][3] >= (kw - 1) * c["dilations"][1] + 1)
    kernels.set_num_threads(c["threads"])
    out_c = c["channels"] * c["multiplier"]
    x = arrays(c["seed"], c["batch"], c["channels"], c["h"], c["w"])
    w = arrays(c["seed"] + 1, out_c, 1, kh, kw)
    b = arrays(c["seed"] + 2, out_c) if c["bias"] else None
    attrs = {"strides": c["strides"], "pads": c["pads"], "dilations": c["dilations"]}
    want = ref("Conv", x, w, b, group=c["channels"], **attrs)
    residual = arrays(c["seed"] + 3, *want.shape) if c["residual"] else None
    want = fused_reference(x, w, b, residual, c["act"], group=c["channels"], **attrs)
    got = depthwise(x, w, b, residual, c["act"], **attrs)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


ROW_CASES = [(3, 1, 1), (3, 2, 1), (5, 1, 2), (5, 2, 2), (3, 1, 0), (4, 2, 3)]  # kernel, stride, pad


@pytest.mark.parametrize("width, kernel, stride, pad",
                         [(wd, *c) for c in ROW_CASES for wd in range(1, 21)
                          if wd + 2 * c[2] >= c[0]])  # a window fits the padded row
def test_every_row_width(width, kernel, stride, pad):
    """Output rows that end in every partial vector (and inputs narrower than the kernel,
    read through the padding), with a residual: rows of 9 outputs, N != C != H != W."""
    x, w, b = arrays(width, 2, 3, 9 * stride, width), arrays(7, 6, 1, kernel, kernel), arrays(8, 6)
    attrs = {"strides": [stride, stride], "pads": [pad] * 4}
    want = ref("Conv", x, w, b, group=3, **attrs)
    residual = arrays(9, *want.shape)
    got = depthwise(x, w, b, residual, ("Relu", ()), **attrs)
    np.testing.assert_allclose(got, ref("Relu", want + residual), rtol=RTOL, atol=ATOL)


# (channels, input h x w, kernel, stride, pads): every depthwise convolution of
# light_shufflenet and mobilenet_v3_small
MODEL_SHAPES = [
    (112, (56, 56), 3, 2, 1), (136, (28, 28), 3, 1, 1), (136, (28, 28), 3, 2, 1),
    (272, (14, 14), 3, 1, 1), (272, (14, 14), 3, 2, 1), (544, (7, 7), 3, 1, 1),
    (8, (112, 112), 3, 2, 1), (40, (56, 56), 3, 2, 1), (48, (28, 28), 3, 1, 1),
    (48, (28, 28), 5, 2, 2), (120, (14, 14), 5, 1, 2), (64, (14, 14), 5, 1, 2),
    (144, (14, 14), 5, 2, 2), (288, (7, 7), 5, 1, 2),
]


@pytest.mark.parametrize("channels, hw, kernel, stride, pad", MODEL_SHAPES)
def test_model_shapes_match_reference_at_one_and_two_threads(channels, hw, kernel, stride, pad,
                                                             threads):
    x, w, b = arrays(1, 1, channels, *hw), arrays(2, channels, 1, kernel, kernel), arrays(3, channels)
    attrs = {"strides": [stride, stride], "pads": [pad] * 4}
    want = ref("HardSwish", ref("Conv", x, w, b, group=channels, **attrs))
    results = []
    for n in (1, 2):
        kernels.set_num_threads(n)
        results.append(depthwise(x, w, b, act=("HardSwish", ()), **attrs))
    np.testing.assert_allclose(results[0], want, rtol=RTOL, atol=ATOL)
    assert results[0].tobytes() == results[1].tobytes()


def test_hand_checked_sums():
    """A 3x3 kernel of ones over a 4x5 plane of ones with one cell of padding counts the
    inputs each window covers: 4 at the corners, 6 along the edges, 9 inside; at stride 2
    along x the even columns of that."""
    x = np.ones((1, 1, 4, 5), np.float32)
    w = np.ones((1, 1, 3, 3), np.float32)
    counts = np.array([[4, 6, 6, 6, 4], [6, 9, 9, 9, 6], [6, 9, 9, 9, 6], [4, 6, 6, 6, 4]])
    np.testing.assert_array_equal(depthwise(x, w, None, pads=[1, 1, 1, 1])[0, 0], counts)
    np.testing.assert_array_equal(depthwise(x, w, None, strides=[1, 2], pads=[1, 1, 1, 1])[0, 0],
                                  counts[:, ::2])
    # a bias of 0.5 and a channel multiplier of 2: the second filter is the first doubled
    w2 = np.concatenate([w, 2 * w])
    got = depthwise(x, w2, np.array([0.5, 0.5], np.float32), pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(got[0, 1], 2 * counts + 0.5)


# the reference's inf weight times its zero padding: the NaN this test checks for
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
def test_non_finite_values_where_the_reference_has_them():
    """NaN in the input reaches exactly the outputs whose windows cover it; an infinite weight
    times the zero padding gives NaN on the border, as the reference's padded input does."""
    x = arrays(11, 1, 2, 9, 12)
    x[0, 0, 4, 6] = np.nan
    w = arrays(12, 2, 1, 3, 3)
    w[1, 0, 0, 0] = np.inf
    for strides in ([1, 1], [2, 2]):
        attrs = {"strides": strides, "pads": [1, 1, 1, 1]}
        want = ref("Conv", x, w, None, group=2, **attrs)
        got = depthwise(x, w, None, **attrs)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
