"""NHWC regions (optimized/onednn_region.py, kernels.OneDNNRegion, csrc/onednn_region.c):
groups of convolutions, activations, adds, concats and pools run in NHWC as
one step, checked against the reference evaluator on whole models and op by op."""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from optimized import InferenceSession, SessionOptions, kernels, onednn_region
from reference import ReferenceEvaluator
from reference.registry import lookup

UNAVAILABLE = kernels.onednn_unavailable()
needs_onednn = pytest.mark.skipif(UNAVAILABLE is not None,
                                  reason=f"oneDNN cannot run here: {UNAVAILABLE}")
pytestmark = needs_onednn
reference_conv = lookup("", "Conv", 22).fn


@pytest.fixture(autouse=True)
def regions_on(monkeypatch):
    """Every region, whatever it transposes: these small models check how regions run (the
    rule that picks the regions that pay has its own tests below)."""
    monkeypatch.setenv(onednn_region.ENV, "all")


def weights(rng, name, shape):
    return numpy_helper.from_array((rng.uniform(-1, 1, shape) / np.sqrt(np.prod(shape[1:])))
                                   .astype(np.float32), name)


def model(nodes, inits, x_shape, outputs):
    graph = helper.make_graph(
        nodes, "region", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def bottleneck(c=12, mid=6, extra_output=True, seed=0):
    """A resnet bottleneck: 1x1, 3x3, 1x1 convolutions, residual Add and Relu; channel counts
    not multiples of 8, so the blocked buffers carry padding channels."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], kernel_shape=[1, 1]),
        helper.make_node("Add", ["c3", "x"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    inits = [weights(rng, "w1", (mid, c, 1, 1)), weights(rng, "b1", (mid,)),
             weights(rng, "w2", (mid, mid, 3, 3)), weights(rng, "b2", (mid,)),
             weights(rng, "w3", (c, mid, 1, 1)), weights(rng, "b3", (c,))]
    return model(nodes, inits, ["N", c, "H", "W"], ["y", "r1"] if extra_output else ["y"])


def fire(c=16, squeeze=8, expand=16, seed=1):
    """A squeezenet fire module with its Concat, then MaxPool, a 1x1 and GlobalAveragePool."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "ws", "bs"], ["sq"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["sq"], ["rs"]),
        helper.make_node("Conv", ["rs", "we1", "be1"], ["e1"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["e1"], ["re1"]),
        helper.make_node("Conv", ["rs", "we3", "be3"], ["e3"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["e3"], ["re3"]),
        helper.make_node("Concat", ["re1", "re3"], ["cat"], axis=1),
        helper.make_node("MaxPool", ["cat"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 1, 1, 0]),
        helper.make_node("Conv", ["mp", "wf", "bf"], ["f"], kernel_shape=[1, 1]),
        helper.make_node("AveragePool", ["f"], ["ap"], kernel_shape=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["ap"], ["y"]),
    ]
    inits = [weights(rng, "ws", (squeeze, c, 1, 1)), weights(rng, "bs", (squeeze,)),
             weights(rng, "we1", (expand, squeeze, 1, 1)), weights(rng, "be1", (expand,)),
             weights(rng, "we3", (expand, squeeze, 3, 3)), weights(rng, "be3", (expand,)),
             weights(rng, "wf", (10, 2 * expand, 1, 1)), weights(rng, "bf", (10,))]
    return model(nodes, inits, ["N", c, "H", "W"], ["y"])


def session(m, threads=1):
    options = SessionOptions()
    options.intra_op_num_threads = threads
    return InferenceSession(m.SerializeToString(), options)


def region_steps(sess):
    return [s for s in sess._plan.steps if s.node.op_type == "OneDNNRegion"]


def planned(sess) -> list:
    """Each region's plans so far (None where oneDNN refused one and its members ran alone)."""
    return [region for step in region_steps(sess) for region in step.run._planned.values()]


def run_compiled(sess, feeds, runs=3):
    """The outputs of the third run: the first two record the plan, the third runs it in C."""
    for _ in range(runs - 1):
        sess.run(None, feeds)
    return sess.run(None, feeds)


def assert_matches(got, want):
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        # float32 sums of up to ~150 products below 1: a few ulps each
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("build, shape", [(bottleneck, (2, 12, 9, 7)), (fire, (2, 16, 11, 9))])
def test_model_matches_reference_as_one_region(build, shape):
    m = build()
    sess = session(m)
    assert len(region_steps(sess)) == 1, [s.node.op_type for s in sess._plan.steps]
    x = np.random.default_rng(3).uniform(-1, 1, shape).astype(np.float32)
    want = ReferenceEvaluator(m).run(None, {"x": x})
    assert_matches(sess.run(None, {"x": x}), want)  # the Python path
    assert_matches(run_compiled(sess, {"x": x}), want)  # the step table
    assert planned(sess) and None not in planned(sess)


def test_value_read_outside_the_region_leaves_it_in_nchw():
    """r1 feeds the next convolution inside the region and is a graph output too, and Sigmoid
    (no region op) reads c2: both leave the region in NCHW."""
    m = bottleneck()
    m.graph.node.append(helper.make_node("Sigmoid", ["c2"], ["sig"]))
    m.graph.output.append(helper.make_tensor_value_info("sig", TensorProto.FLOAT, None))
    sess = session(m)
    step = region_steps(sess)[0]
    assert {sess._plan.names[s] for s in step.outputs} >= {"r1"}
    x = np.random.default_rng(4).uniform(-1, 1, (1, 12, 6, 10)).astype(np.float32)
    assert_matches(run_compiled(sess, {"x": x}), ReferenceEvaluator(m).run(None, {"x": x}))


def test_nan_passes_through_relu_as_onnx_keeps_it():
    m = bottleneck(extra_output=False)
    x = np.random.default_rng(5).uniform(-1, 1, (1, 12, 5, 6)).astype(np.float32)
    x[0, 3, 2, 2] = np.nan
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    sess = session(m)
    got = run_compiled(sess, {"x": x})[0]
    assert np.isnan(want).any() and None not in planned(sess)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=1e-4, atol=2e-5)


def test_nan_in_max_pool_window_gives_nan():
    m = fire()
    x = np.random.default_rng(6).uniform(-1, 1, (1, 16, 11, 9)).astype(np.float32)
    x[0, 0, 4, 4] = np.nan
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    sess = session(m)
    got = run_compiled(sess, {"x": x})[0]
    assert np.isnan(want).any() and None not in planned(sess)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


@pytest.mark.parametrize("build, shape", [(bottleneck, (2, 12, 9, 7)), (fire, (1, 16, 11, 9))])
def test_thread_count_invariance(build, shape):
    m = build()
    x = np.random.default_rng(7).uniform(-1, 1, shape).astype(np.float32)
    one, two = (run_compiled(session(m, threads), {"x": x}) for threads in (1, 2))
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


def test_re_plans_when_the_input_shape_changes():
    m = fire()
    sess, ref = session(m), ReferenceEvaluator(m)
    rng = np.random.default_rng(8)
    for shape in [(1, 16, 11, 9), (2, 16, 7, 13), (1, 16, 11, 9)]:
        x = rng.uniform(-1, 1, shape).astype(np.float32)
        assert_matches(run_compiled(sess, {"x": x}), ref.run(None, {"x": x}))
    run = region_steps(sess)[0].run
    assert sum(region is not None for region in run._planned.values()) == 2


@pytest.mark.parametrize("expand", [12, 7])
def test_concat_of_odd_channel_counts_runs_in_the_region(expand):
    """NHWC concatenates pixel by pixel, so parts of any channel count (12 + 12, 7 + 7, not
    multiples of 8) concatenate inside the region, which is planned."""
    m = fire(expand=expand)
    x = np.random.default_rng(9).uniform(-1, 1, (2, 16, 11, 9)).astype(np.float32)
    sess = session(m)
    assert_matches(run_compiled(sess, {"x": x}), ReferenceEvaluator(m).run(None, {"x": x}))
    assert planned(sess) and None not in planned(sess)


def test_no_cycle_through_a_value_made_outside_from_the_region():
    """FusedConv's residual comes from Sigmoid (outside) of an earlier member's result: the
    FusedConv cannot join that region, which would both feed and wait for Sigmoid."""
    rng = np.random.default_rng(10)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Sigmoid", ["r1"], ["sig"]),
        helper.make_node("FusedConv", ["r1", "w2", "b2", "sig"], ["y"], domain="com.microsoft",
                         kernel_shape=[1, 1], activation="Relu"),
    ]
    m = model(nodes, [weights(rng, "w1", (8, 8, 3, 3)), weights(rng, "w2", (8, 8, 1, 1)),
                      weights(rng, "b2", (8,))], [1, 8, 6, 5], ["y"])
    x = rng.uniform(-1, 1, (1, 8, 6, 5)).astype(np.float32)
    sess = session(m)
    assert_matches(run_compiled(sess, {"x": x}), ReferenceEvaluator(m).run(None, {"x": x}))


@pytest.mark.parametrize("level", ["portable", "avx2", "avx512"])
def test_default_and_overrides(monkeypatch, level):
    previous = kernels.isa()
    try:
        if kernels.ISAS[level] > kernels.ISAS[kernels.limit_isa("avx512")]:
            pytest.skip(f"this CPU has no {level}")
        m = spatial_chain()
        kernels.limit_isa(level)
        monkeypatch.delenv(onednn_region.ENV)
        on = onednn_region.DEFAULT_ON_AVX512 and level == "avx512"
        assert bool(region_steps(session(m))) == on
        monkeypatch.setattr(onednn_region, "DEFAULT_ON_AVX512", True)
        assert bool(region_steps(session(m))) == (level == "avx512")
        monkeypatch.setattr(onednn_region, "DEFAULT_ON_AVX512", False)
        assert not region_steps(session(m))
        monkeypatch.setenv(onednn_region.ENV, "0")
        assert not region_steps(session(m))
        monkeypatch.setenv(onednn_region.ENV, "1")
        assert region_steps(session(m))
    finally:
        kernels.limit_isa(previous)


def spatial_chain(c=8, mid=16, strides=(1, 1), seed=5):
    """Two 3x3 convolutions (oneDNN's one by one, each transposing its input and output)."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                         strides=list(strides)),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    ]
    inits = [weights(rng, "w1", (mid, c, 3, 3)), weights(rng, "b1", (mid,)),
             weights(rng, "w2", (mid, mid, 3, 3)), weights(rng, "b2", (mid,))]
    return model(nodes, inits, ["N", c, "H", "W"], ["y"])


def dense_layer(c=40, mid=16, growth=8, seed=6):
    """densenet's layer: a 1x1 (ours one by one, reading NCHW) narrowing a wide input, a 3x3,
    and the Concat of input and result (not a member: x comes from outside)."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["x", "c2"], ["y"], axis=1),
    ]
    inits = [weights(rng, "w1", (mid, c, 1, 1)), weights(rng, "b1", (mid,)),
             weights(rng, "w2", (growth, mid, 3, 3)), weights(rng, "b2", (growth,))]
    return model(nodes, inits, ["N", c, "H", "W"], ["y"])


def pointwise_chain(c=12, mid=20, seed=7):
    """mobilenet's 1x1 pairs: ours one by one read NCHW and transpose nothing."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], kernel_shape=[1, 1]),
    ]
    inits = [weights(rng, "w1", (mid, c, 1, 1)), weights(rng, "b1", (mid,)),
             weights(rng, "w2", (c, mid, 1, 1)), weights(rng, "b2", (c,))]
    return model(nodes, inits, ["N", c, "H", "W"], ["y"])


def transposed_counts(m) -> list:
    """(region, one by one) values transposed for each region "all" forms in m."""
    counts = []
    original = onednn_region._transposes_less

    def spy(plan, steps, ids, readers):
        counts.append(onednn_region._transposed(plan, steps, ids, readers))
        return original(plan, steps, ids, readers)

    onednn_region._transposes_less = spy
    try:
        os.environ[onednn_region.ENV] = "1"
        session(m)
    finally:
        onednn_region._transposes_less = original
        os.environ[onednn_region.ENV] = "all"
    return counts


def test_transposed_values_counted_by_hand():
    # 3x3 stride 2, 8 -> 16 channels, then 3x3 16 -> 16, in units of x's plane: the region
    # transposes x (8) and y (16 / 4); one by one, 8 + 4 for the first and 4 + 4 the second
    assert transposed_counts(spatial_chain(strides=(2, 2))) == [(12.0, 20.0)]
    # x (40) in, c2 (8) out; one by one only the 3x3 transposes: 16 + 8
    assert transposed_counts(dense_layer()) == [(48.0, 24.0)]
    assert transposed_counts(pointwise_chain()) == [(24.0, 0.0)]


@pytest.mark.parametrize("build, formed", [(spatial_chain, True), (dense_layer, False),
                                           (pointwise_chain, False)])
@pytest.mark.parametrize("batch, height, width", [(1, 7, 5), (2, 6, 9)])
def test_region_forms_only_where_it_transposes_less(monkeypatch, build, formed, batch, height,
                                                    width):
    m = build()
    monkeypatch.setenv(onednn_region.ENV, "1")
    sess = session(m)
    assert bool(region_steps(sess)) == formed
    monkeypatch.setenv(onednn_region.ENV, "all")
    assert region_steps(session(m))  # a region all the same where the rule is off
    channels = m.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    x = np.random.default_rng(8).uniform(-1, 1, (batch, channels, height, width)).astype(np.float32)
    want = ReferenceEvaluator(m).run(None, {"x": x})
    assert_matches(sess.run(None, {"x": x}), want)
    assert_matches(run_compiled(sess, {"x": x}), want)


def test_tied_filters_give_equal_channels():
    """Equal filters (and biases) give bitwise equal channels, as the reference's Conv does."""
    w = np.tile(np.linspace(-1, 1, 16 * 9, dtype=np.float32).reshape(1, 16, 3, 3) / 12, (24, 1, 1, 1))
    w2 = np.full((20, 24, 1, 1), 0.05, np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], kernel_shape=[1, 1])]
    m = model(nodes, [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w2, "w2"),
                      numpy_helper.from_array(np.full(24, 0.1, np.float32), "b")],
              [1, 16, 13, 11], ["y", "r"])
    x = np.random.default_rng(11).uniform(-1, 1, (1, 16, 13, 11)).astype(np.float32)
    sess = session(m)
    y, r = run_compiled(sess, {"x": x})
    assert (y == y[:, :1]).all() and (r == r[:, :1]).all() and None not in planned(sess)


def test_relu_applied_by_the_concat_keeps_nan():
    """A fire module's two Conv+Relu whose only reader is the Concat: the Concat applies their
    Relu as it copies (relu_later), with NaN kept as Relu's comparison keeps it."""
    rng = np.random.default_rng(9)
    w0 = (rng.uniform(-1, 1, (6, 4, 1, 1)) / 2).astype(np.float32)
    w1 = (rng.uniform(-1, 1, (5, 6, 1, 1)) / 3).astype(np.float32)
    w3 = (rng.uniform(-1, 1, (11, 6, 3, 3)) / 9).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["s"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["s"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["e1"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["e1"], ["r1"]),
             helper.make_node("Conv", ["r0", "w3"], ["e3"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["e3"], ["r3"]),
             helper.make_node("Concat", ["r1", "r3"], ["y"], axis=1)]
    m = model(nodes, [numpy_helper.from_array(w, n) for w, n in ((w0, "w0"), (w1, "w1"), (w3, "w3"))],
              [2, 4, 7, 9], ["y"])
    x = rng.uniform(-1, 1, (2, 4, 7, 9)).astype(np.float32)
    x[1, 3, 3, 5] = np.nan
    sess = session(m)
    (y,) = run_compiled(sess, {"x": x})
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    assert None not in planned(sess) and region_steps(sess)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    assert np.isnan(y[1, :, 3, 5]).all() and np.isnan(y[1, 5:, 2:5, 4:7]).all()
    assert (y[~np.isnan(y)] >= 0).all() and (y == 0).any()
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=2e-5)


def test_mixed_tied_filters_give_their_sources_channels():
    """Ties that are not all one filter: twins of one source side by side (copied as one
    broadcast), a run of sources repeated (copied as one block), and twins apart; each channel
    bitwise equal to its source's and all of them the reference's."""
    rng = np.random.default_rng(5)
    distinct = (rng.uniform(-1, 1, (5, 10, 3, 3)) / 9).astype(np.float32)
    source = np.array([0, 1, 2, 0, 1, 2, 3, 3, 3, 4, 1, 4, 0, 2, 3])
    bias = rng.uniform(-0.5, 0.5, 5).astype(np.float32)
    w2 = (rng.uniform(-1, 1, (6, 15, 1, 1)) / 4).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 0, 1, 0]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], kernel_shape=[1, 1])]
    m = model(nodes, [numpy_helper.from_array(distinct[source], "w"),
                      numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(bias[source], "b")],
              [2, 10, 9, 7], ["y", "r"])
    x = rng.uniform(-1, 1, (2, 10, 9, 7)).astype(np.float32)
    x[1, 3, 4, 2] = np.nan  # NaN kept through the conv, Relu and copies to the twins
    sess = session(m)
    y, r = run_compiled(sess, {"x": x})
    first = [int(np.flatnonzero(source == s)[0]) for s in source]
    np.testing.assert_array_equal(r, r[:, first])
    assert np.isnan(r[1, :, 3:6, 1:4]).any(axis=(1, 2)).all()
    assert None not in planned(sess) and region_steps(sess)
    want = ReferenceEvaluator(m).run(None, {"x": x})
    np.testing.assert_allclose(y, want[0], rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(r, want[1], rtol=1e-4, atol=2e-5)


@st.composite
def chain_cases(draw):
    return {
        "batch": draw(st.integers(1, 3)), "cin": draw(st.integers(1, 12)),
        "mid": draw(st.integers(1, 20)), "cout": draw(st.integers(1, 12)),
        "h": draw(st.integers(3, 12)), "w": draw(st.integers(3, 14)),
        "k": draw(st.integers(1, 3)), "strides": [draw(st.integers(1, 2)), draw(st.integers(1, 3))],
        "pads": [draw(st.integers(0, 2)) for _ in range(4)],
        "dilations": [draw(st.integers(1, 2)), 1],
        "residual": draw(st.booleans()), "seed": draw(st.integers(0, 2**16)),
    }


@settings(max_examples=40, deadline=None)
@given(case=chain_cases())
@example(case={"batch": 1, "cin": 1, "mid": 1, "cout": 1, "h": 3, "w": 3, "k": 3,
               "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [2, 1], "residual": False,
               "seed": 0})
def test_conv_chain_matches_reference_conv(case):
    """OneDNNRegion directly: conv (any pads, strides, dilations) -> Relu -> 1x1 conv with the
    block's first result as residual, against the reference Conv in float64."""
    c = case
    # a dilated window taller than the padded input is an error, not a case of this test
    assume((c["k"] - 1) * c["dilations"][0] + 1 <= c["h"] + c["pads"][0] + c["pads"][2])
    rng = np.random.default_rng(c["seed"])
    x = rng.uniform(-1, 1, (c["batch"], c["cin"], c["h"], c["w"])).astype(np.float32)
    w1 = rng.uniform(-1, 1, (c["mid"], c["cin"], c["k"], c["k"])).astype(np.float32)
    b1 = rng.uniform(-1, 1, c["mid"]).astype(np.float32)
    w2 = rng.uniform(-1, 1, (c["mid"], c["mid"], 1, 1)).astype(np.float32)
    attrs = {"strides": c["strides"], "pads": c["pads"], "dilations": c["dilations"]}
    first = reference_conv(x.astype(np.float64), w1.astype(np.float64), b1.astype(np.float64),
                           **attrs)
    if first.size == 0 or min(first.shape[2:]) < 1:
        return
    region = kernels.OneDNNRegion(4)
    region.entry(0, x.shape)
    region.conv(0, -1, 1, w1, b1, **attrs)
    region.activation(1, 2, "Relu")
    region.conv(2, 1 if c["residual"] else -1, 3, w2)
    region.exit(3)
    region.exit(1)
    region.finish()
    y, y1 = region(x)
    want = reference_conv(np.maximum(first, 0), w2.astype(np.float64))
    if c["residual"]:
        want = want + first
    depth = c["cin"] * c["k"] ** 2 + c["mid"]
    np.testing.assert_allclose(y1, first, rtol=1e-4, atol=1e-6 * depth)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=4e-6 * depth)


def test_bad_descriptions_are_named():
    region = kernels.OneDNNRegion(3)
    with pytest.raises(ValueError, match="4-D"):
        region.entry(0, (2, 3))
    region.entry(0, (1, 8, 5, 5))
    with pytest.raises(RuntimeError, match="not defined yet"):
        region.activation(1, 2, "Relu")
    with pytest.raises(ValueError, match="equal shapes"):
        region.conv(0, -1, 1, np.ones((4, 8, 3, 3), np.float32))
        region.add(0, 1, 2)


BUSY_PROBE = """
import numpy as np
from optimized import kernels
from tests.optimized.test_onednn_region import bottleneck, fire, region_steps, run_compiled, session
for build, shape in ((bottleneck, (2, 12, 9, 7)), (fire, (1, 16, 11, 9))):
    x = np.random.default_rng(3).uniform(-1, 1, shape).astype(np.float32)
    one, two = session(build(), 1), session(build(), 2)
    same = all(np.array_equal(a, b) for a, b in zip(run_compiled(one, {"x": x}),
                                                    run_compiled(two, {"x": x}, runs=6)))
    region = next(r for r in region_steps(two)[0].run._planned.values())
    print(int(same), region.single_runs)
"""


@pytest.mark.parametrize("setting, twin_runs", [("0", True), ("ignore", False)])
def test_a_busy_machine_runs_the_single_thread_twin(setting, twin_runs):
    """A region planned for 2 threads runs its one-thread twin where the kernels fall back to
    the calling thread (threads.c's busy check; per-node convolutions do the same), since
    oneDNN's primitives split their work for the team they were built for; same bits."""
    environment = dict(os.environ, ONNX_PARITY_BUSY_MACHINE=setting,
                       ONNX_PARITY_ONEDNN_REGIONS="all")
    done = subprocess.run([sys.executable, "-c", BUSY_PROBE], env=environment, cwd=os.getcwd(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    for line in done.stdout.split("\n")[:2]:
        same, runs = map(int, line.split())
        # the step table runs from the third run on: 4 compiled runs of 6
        assert same == 1 and (runs >= 4 if twin_runs else runs == 0), done.stdout


def test_single_thread_twin_is_checked():
    kernels.set_num_threads(1)
    with pytest.raises(RuntimeError, match="between 1 and the configured"):
        kernels.OneDNNRegion(2, threads=2)
    kernels.set_num_threads(2)
    try:
        regions = []
        for threads in (None, 1, 1):
            region = kernels.OneDNNRegion(2, threads)
            region.entry(0, (1, 8, 5, 5))
            region.activation(0, 1, "Relu")
            region.exit(1)
            regions.append(region)
        main, twin, unfinished = regions
        main.finish()
        twin.finish()
        with pytest.raises(RuntimeError, match="single-thread twin"):
            main.attach_single(unfinished)
        assert main.single_runs == -1
        main.attach_single(twin)
        x = np.full((1, 8, 5, 5), -1.0, np.float32)
        x[0, 3, 2, 1] = np.nan
        y = main(x)[0]
        assert (y[0, :3] == 0).all() and np.isnan(y[0, 3, 2, 1]) and main.single_runs in (0, 1)
    finally:
        kernels.set_num_threads(1)


def test_residual_that_is_the_convolutions_own_source():
    """y = Conv(x) + x with x dying at the convolution: its buffer cannot take the output in
    place, since the convolution still reads it (OneDNNRegion directly, then a model)."""
    rng = np.random.default_rng(12)
    x = rng.uniform(-1, 1, (1, 8, 6, 5)).astype(np.float32)
    w = rng.uniform(-1, 1, (8, 8, 3, 3)).astype(np.float32)
    region = kernels.OneDNNRegion(2)
    region.entry(0, x.shape)
    region.conv(0, 0, 1, w, pads=[1, 1, 1, 1])
    region.exit(1)
    region.finish()
    want = reference_conv(x.astype(np.float64), w.astype(np.float64), pads=[1, 1, 1, 1]) + x
    np.testing.assert_allclose(region(x)[0], want, rtol=1e-4, atol=1e-4)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("FusedConv", ["r1", "w2", "b2", "r1"], ["y"], domain="com.microsoft",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1], activation="Relu"),
    ]
    m = model(nodes, [weights(rng, "w1", (8, 8, 3, 3)), weights(rng, "w2", (8, 8, 3, 3)),
                      weights(rng, "b2", (8,))], [1, 8, 6, 5], ["y"])
    sess = session(m)
    assert len(region_steps(sess)) == 1
    assert_matches(run_compiled(sess, {"x": x}), ReferenceEvaluator(m).run(None, {"x": x}))


def test_constant_residual_is_not_dropped():
    """A FusedConv whose residual Z is an initializer: the region has no value for it, so the
    convolution stays out of the region instead of running without its residual."""
    rng = np.random.default_rng(13)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("FusedConv", ["r1", "w2", "b2", "z"], ["y"], domain="com.microsoft",
                         kernel_shape=[1, 1], activation="Relu"),
    ]
    m = model(nodes, [weights(rng, "w1", (8, 8, 3, 3)), weights(rng, "w2", (8, 8, 1, 1)),
                      weights(rng, "b2", (8,)), weights(rng, "z", (1, 8, 6, 5))],
              [1, 8, 6, 5], ["y"])
    x = rng.uniform(-1, 1, (1, 8, 6, 5)).astype(np.float32)
    assert_matches(run_compiled(session(m), {"x": x}), ReferenceEvaluator(m).run(None, {"x": x}))


@st.composite
def pool_cases(draw):
    k = [draw(st.integers(1, 3)), draw(st.integers(1, 4))]
    return {
        "shape": (draw(st.integers(1, 2)), draw(st.integers(1, 20)), draw(st.integers(4, 12)),
                  draw(st.integers(4, 13))),
        "kernel_shape": k, "strides": [draw(st.integers(1, 3)), draw(st.integers(1, 2))],
        "pads": [draw(st.integers(0, k[0] - 1)), draw(st.integers(0, k[1] - 1)),
                 draw(st.integers(0, k[0] - 1)), draw(st.integers(0, k[1] - 1))],
        "kind": draw(st.sampled_from(["max", "average", "average_with_pads"])),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(max_examples=40, deadline=None)
@given(case=pool_cases())
def test_pool_matches_reference_pool(case):
    """OneDNNRegion's pools (nChw8c, channel counts on and off the block, any pads and
    strides without ceil mode) against the reference MaxPool and AveragePool."""
    x = np.random.default_rng(case["seed"]).uniform(-1, 1, case["shape"]).astype(np.float32)
    attrs = {k: case[k] for k in ("kernel_shape", "strides", "pads")}
    if case["kind"] == "max":
        node = helper.make_node("MaxPool", ["x"], ["y"], **attrs)
    else:
        node = helper.make_node("AveragePool", ["x"], ["y"], **attrs,
                                count_include_pad=int(case["kind"] == "average_with_pads"))
    want = ReferenceEvaluator(model([node], [], list(x.shape), ["y"])).run(None, {"x": x})[0]
    region = kernels.OneDNNRegion(2)
    region.entry(0, x.shape)
    region.pool(0, 1, case["kind"], case["kernel_shape"], case["strides"], case["pads"])
    region.exit(1)
    region.finish()
    np.testing.assert_allclose(region(x)[0], want, rtol=1e-6, atol=1e-6)
