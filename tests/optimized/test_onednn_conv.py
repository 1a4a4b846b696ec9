"""Convolution through oneDNN (optimized.kernels.OneDNNConv, csrc/onednn_conv.c) against the
reference Conv, and its dispatch in the CPU provider (optimized.cpu)."""
import gc
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from optimized import InferenceSession, cpu, kernels
from reference import ReferenceEvaluator
from reference.registry import lookup

UNAVAILABLE = kernels.onednn_unavailable()
needs_onednn = pytest.mark.skipif(UNAVAILABLE is not None,
                                  reason=f"oneDNN cannot run here: {UNAVAILABLE}")
hsettings = settings(max_examples=60, deadline=None)

reference_conv = lookup("", "Conv", 22).fn


def erf(x):
    return np.vectorize(math.erf)(x)


# float64 forms of the fused activations, parameters as FusedConv's activation_params
ACTIVATIONS = {
    None: lambda y: y,
    "Relu": lambda y: np.maximum(y, 0),
    "LeakyRelu": lambda y: np.where(y < 0, 0.2 * y, y),
    "Sigmoid": lambda y: 1 / (1 + np.exp(-y)),
    "Tanh": np.tanh,
    "Clip": lambda y: np.clip(y, -0.5, 0.75),
    "Gelu": lambda y: 0.5 * y * (1 + erf(y / math.sqrt(2))),
    "GeluTanh": lambda y: 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3))),
}
PARAMS = {"LeakyRelu": [0.2], "Clip": [-0.5, 0.75]}


def expected(x, w, b, residual, activation, **attrs):
    """The reference Conv in float64, then the residual and the activation."""
    y = reference_conv(x.astype(np.float64), w.astype(np.float64),
                       None if b is None else b.astype(np.float64), **attrs)
    if residual is not None:
        y = y + residual
    return ACTIVATIONS[activation](y)


def assert_close(got, want, depth):
    # float32 sums of `depth` products of values in [-1, 1]: a few ulps per term at most
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=4e-7 * depth + 1e-6)


def constant(a):
    a = np.ascontiguousarray(a, np.float32)
    a.flags.writeable = False  # as an initializer: the provider plans oneDNN only for these
    return a


@st.composite
def conv_cases(draw):
    depthwise = draw(st.booleans())
    group = draw(st.integers(2, 5)) if depthwise else draw(st.integers(1, 3))
    per_group = 1 if depthwise else draw(st.integers(1, 9))
    out_per_group = draw(st.integers(1, 3)) if depthwise else draw(st.integers(1, 9))
    return {
        "batch": draw(st.integers(1, 3)), "group": group, "cin": group * per_group,
        "cout": group * out_per_group, "h": draw(st.integers(1, 11)), "w": draw(st.integers(1, 13)),
        "kh": draw(st.integers(1, 3)), "kw": draw(st.integers(1, 4)),
        "strides": [draw(st.integers(1, 3)), draw(st.integers(1, 2))],
        "dilations": [draw(st.integers(1, 2)), draw(st.integers(1, 3))],
        "pads": [draw(st.integers(0, 2)) for _ in range(4)],
        "bias": draw(st.booleans()), "residual": draw(st.booleans()),
        "activation": draw(st.sampled_from(list(ACTIVATIONS))),
        "layout": draw(st.sampled_from(["blocked", "plain"])),
        "seed": draw(st.integers(0, 2**16)),
    }


def arrays(c):
    rng = np.random.default_rng(c["seed"])
    x = rng.uniform(-1, 1, (c["batch"], c["cin"], c["h"], c["w"])).astype(np.float32)
    w = rng.uniform(-1, 1, (c["cout"], c["cin"] // c["group"], c["kh"], c["kw"])).astype(np.float32)
    b = rng.uniform(-1, 1, c["cout"]).astype(np.float32) if c["bias"] else None
    return x, w, b


@needs_onednn
@hsettings
@given(case=conv_cases())
def test_matches_reference(case):
    c = case
    assume(c["h"] + c["pads"][0] + c["pads"][2] >= (c["kh"] - 1) * c["dilations"][0] + 1)
    assume(c["w"] + c["pads"][1] + c["pads"][3] >= (c["kw"] - 1) * c["dilations"][1] + 1)
    x, w, b = arrays(c)
    attrs = {k: c[k] for k in ("strides", "pads", "dilations", "group")}
    plain = expected(x, w, b, None, None, **attrs)
    residual = (np.random.default_rng(c["seed"] + 1).uniform(-1, 1, plain.shape).astype(np.float32)
                if c["residual"] else None)
    want = expected(x, w, b, residual, c["activation"], **attrs)
    plan = kernels.OneDNNConv(x.shape, w, b, residual=residual is not None,
                              activation=c["activation"],
                              activation_params=PARAMS.get(c["activation"], ()),
                              layout=c["layout"], **attrs)
    assert plan.out_shape == want.shape
    assert_close(plan(x, residual), want, w[0].size)


@needs_onednn
@pytest.mark.parametrize("layout", ["blocked", "plain"])
def test_residual_may_be_the_output(layout):
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (2, 12, 7, 9)).astype(np.float32)
    w = rng.uniform(-1, 1, (10, 12, 3, 3)).astype(np.float32)
    residual = rng.uniform(-1, 1, (2, 10, 7, 9)).astype(np.float32)
    want = expected(x, w, None, residual, "Relu", pads=[1, 1, 1, 1])
    plan = kernels.OneDNNConv(x.shape, w, pads=[1, 1, 1, 1], residual=True, activation="Relu",
                              layout=layout)
    y = plan(x, residual, out=residual)
    assert y is residual
    assert_close(y, want, w[0].size)


@needs_onednn
@pytest.mark.parametrize("activation, params", [("Relu", ()), ("Clip", (-1.0, 1.0)),
                                                ("LeakyRelu", (0.1,)), (None, ())])
def test_nan_and_inf_pass_through_the_activation(activation, params):
    """Relu(NaN) is NaN in ONNX (oneDNN's own Relu and Clip post-ops give 0 and a bound)."""
    x = np.ones((1, 16, 5, 6), np.float32)
    x[0, 0, 2, 2], x[0, 1, 0, 0] = np.nan, np.inf
    w = np.ones((8, 16, 3, 3), np.float32)
    got = kernels.OneDNNConv(x.shape, w, pads=[1] * 4, activation=activation,
                             activation_params=params)(x)
    y = reference_conv(x, w, pads=[1] * 4)
    want = {"Relu": np.maximum(y, 0), "Clip": np.clip(y, -1, 1),
            "LeakyRelu": np.where(y < 0, 0.1 * y, y), None: y}[activation]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got).any() and (activation == "Clip" or np.isinf(got).any())
    np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


@needs_onednn
def test_weights_are_copied_at_plan_time():
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, (1, 16, 6, 5)).astype(np.float32)
    w = rng.uniform(-1, 1, (8, 16, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 8).astype(np.float32)
    want = expected(x, w, b, None, None, pads=[1, 1, 1, 1])
    plan = kernels.OneDNNConv(x.shape, w, b, pads=[1, 1, 1, 1])
    w[:] = 0
    b[:] = 0
    assert_close(plan(x), want, w[0].size)


@needs_onednn
@pytest.mark.parametrize("shape, group", [((1, 32, 15, 11), 1), ((2, 24, 9, 13), 24)])
def test_thread_count_invariance(shape, group):
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    w = rng.uniform(-1, 1, (48, shape[1] // group, 3, 3)).astype(np.float32)
    before = kernels.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            kernels.set_num_threads(threads)
            plan = kernels.OneDNNConv(shape, w, pads=[1, 1, 1, 1], group=group, activation="Relu")
            assert plan.threads == threads
            results.append(plan(x))
    finally:
        kernels.set_num_threads(before)
    # the split across threads leaves each output's sum in the same order
    np.testing.assert_array_equal(results[0], results[1])
    assert_close(results[0], expected(x, w, None, None, "Relu", pads=[1, 1, 1, 1], group=group),
                 w[0].size)


@needs_onednn
@pytest.mark.parametrize("activation", [None, "Relu", "Sigmoid", "Clip"])
@pytest.mark.parametrize("shape, out_c, strides", [((2, 21, 13, 11), 19, [1, 1]),
                                                   ((1, 17, 23, 18), 19, [2, 1]),
                                                   ((3, 8, 9, 2), 19, [1, 2]),
                                                   ((1, 50, 5, 7), 37, [1, 1]),
                                                   ((1, 688, 6, 8), 690, [1, 1])])
def test_nhwc_transposes_at_each_thread_count(shape, out_c, strides, activation):
    """The blocked layout's NCHW <-> NHWC transposes (csrc/onednn_conv.c, with the activation
    in the outgoing one): whole 8x8 tiles and the channels and pixels past them, several
    64-pixel units per image split across threads, a batch, the residual, a strided plane
    whose output has fewer pixels than its input, and a plane smaller than one unit whose
    channels are split across threads instead (where it holds enough values for two threads:
    the last shape)."""
    rng = np.random.default_rng(10)
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    w = rng.uniform(-1, 1, (out_c, shape[1], 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, out_c).astype(np.float32)
    attrs = {"pads": [1, 1, 1, 1], "strides": strides}
    plain = expected(x, w, b, None, None, **attrs)
    residual = rng.uniform(-1, 1, plain.shape).astype(np.float32)
    before = kernels.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            kernels.set_num_threads(threads)
            for z in (None, residual):
                plan = kernels.OneDNNConv(shape, w, b, residual=z is not None,
                                          activation=activation,
                                          activation_params=PARAMS.get(activation, ()), **attrs)
                results.append(plan(x, z))
    finally:
        kernels.set_num_threads(before)
    for got, z in zip(results, (None, residual) * 2):
        assert_close(got, expected(x, w, b, z, activation, **attrs), w[0].size)
    np.testing.assert_array_equal(results[0], results[2])
    np.testing.assert_array_equal(results[1], results[3])


@needs_onednn
def test_native_layout_run_matches():
    rng = np.random.default_rng(6)
    x = rng.uniform(-1, 1, (1, 16, 8, 8)).astype(np.float32)
    w = rng.uniform(-1, 1, (16, 16, 1, 1)).astype(np.float32)
    plan = kernels.OneDNNConv(x.shape, w, layout="plain")
    y = np.empty(plan.native_size("dst"), np.float32)
    plan.run_native(x.reshape(-1), y)  # plain: the native layout is NCHW
    assert_close(y.reshape(plan.out_shape), expected(x, w, None, None, None), 16)


@needs_onednn
def test_bad_arguments_are_named():
    w = np.ones((4, 3, 3, 3), np.float32)
    plan = kernels.OneDNNConv((1, 3, 8, 8), w)
    with pytest.raises(ValueError, match="planned for"):
        plan(np.ones((1, 3, 9, 8), np.float32))
    with pytest.raises(ValueError, match="residual must be given"):
        plan(np.ones((1, 3, 8, 8), np.float32), np.ones((1, 4, 6, 6), np.float32))
    with pytest.raises(ValueError, match="group 2"):
        kernels.OneDNNConv((1, 3, 8, 8), w, group=2)
    with pytest.raises(ValueError, match="layout"):
        kernels.OneDNNConv((1, 3, 8, 8), w, layout="nhwc")
    with pytest.raises(ValueError, match="unknown activation"):
        kernels.OneDNNConv((1, 3, 8, 8), w, activation="Swish")


# --- dispatch in the CPU provider ----------------------------------------------------------

@needs_onednn
def test_provider_plans_per_input_shape(monkeypatch):
    monkeypatch.setitem(cpu.ONEDNN_CONV_RULES, "spatial", "onednn")
    rng = np.random.default_rng(7)
    w = constant(rng.uniform(-1, 1, (12, 10, 3, 3)))
    b = constant(rng.uniform(-1, 1, 12))
    attrs = {"pads": [1, 1, 1, 1], "activation": "Relu"}
    for shape in [(1, 10, 8, 6), (2, 10, 5, 9), (1, 10, 8, 6)]:
        x = rng.uniform(-1, 1, shape).astype(np.float32)
        z = rng.uniform(-1, 1, (shape[0], 12) + shape[2:]).astype(np.float32)
        assert_close(cpu.fused_conv(x, w, b, z, **attrs),
                     expected(x, w, b, z, "Relu", pads=[1, 1, 1, 1]), 90)
    plans = cpu._ONEDNN_PLANS[id(w)]
    assert sorted(key[0] for key in plans) == [(1, 10, 8, 6), (2, 10, 5, 9)]
    assert all(isinstance(plan, kernels.OneDNNConv) for _, plan in plans.values())


@needs_onednn
def test_provider_keeps_our_kernel_where_the_rules_say(monkeypatch):
    monkeypatch.setitem(cpu.ONEDNN_CONV_RULES, "pointwise", "ours")
    w = constant(np.ones((4, 16, 1, 1)))
    x = np.ones((1, 16, 3, 3), np.float32)
    np.testing.assert_array_equal(cpu.conv(x, w), np.full((1, 4, 3, 3), 16, np.float32))
    assert id(w) not in cpu._ONEDNN_PLANS
    writable = np.ones((4, 16, 3, 3), np.float32)  # weights that may change: never planned
    monkeypatch.setitem(cpu.ONEDNN_CONV_RULES, "spatial", "onednn")
    cpu.conv(x, writable, pads=[1, 1, 1, 1])
    assert id(writable) not in cpu._ONEDNN_PLANS


@needs_onednn
@pytest.mark.parametrize("shape", [(0, 10, 5, 7), (2, 10, 0, 7), (2, 10, 5, 0)])
def test_empty_inputs_give_empty_outputs(monkeypatch, shape):
    """oneDNN creates a plan for an empty batch or plane but fails to run it (found by
    fuzzing): such inputs never reach it."""
    monkeypatch.setitem(cpu.ONEDNN_CONV_RULES, "spatial", "onednn")
    w = constant(np.ones((12, 10, 3, 3)))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "empty",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 10, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.ones(shape, np.float32)
    (y,) = InferenceSession(model.SerializeToString()).run(None, {"x": x})
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    assert y.shape == want.shape == (shape[0], 12) + shape[2:]


def test_rules_name_every_class():
    assert set(cpu.ONEDNN_CONV_RULES) == {"spatial", "pointwise", "few-input-channels",
                                           "depthwise", "grouped"}
    assert set(cpu.ONEDNN_CONV_RULES.values()) <= {"onednn", "ours"}
    assert cpu.conv_class(np.zeros((8, 1, 3, 3)), 8) == "depthwise"
    assert cpu.conv_class(np.zeros((8, 2, 3, 3)), 4) == "grouped"
    assert cpu.conv_class(np.zeros((64, 3, 7, 7)), 1) == "few-input-channels"
    assert cpu.conv_class(np.zeros((64, 64, 1, 1)), 1) == "pointwise"
    assert cpu.conv_class(np.zeros((64, 64, 3, 1)), 1) == "spatial"


def conv_model():
    """Conv -> Relu over an input of dynamic height and width, weights as initializers."""
    rng = np.random.default_rng(8)
    w = rng.uniform(-1, 1, (16, 12, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 16).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[1, 2]),
         helper.make_node("Relu", ["c"], ["y"])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 12, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("threads", [1, 2])
def test_session_re_plans_when_the_input_shape_changes(threads):
    """Holds with or without oneDNN: where it is present, the fused Conv runs through it."""
    model = conv_model()
    options = __import__("optimized").SessionOptions()
    options.intra_op_num_threads = threads
    session = InferenceSession(model.SerializeToString(), options)
    reference = ReferenceEvaluator(model)
    rng = np.random.default_rng(9)
    for hw in [(9, 14), (6, 5), (9, 14)]:
        x = rng.uniform(-1, 1, (1, 12) + hw).astype(np.float32)
        # sums of 108 products of terms below 1 in another order: a few float32 ulps of ~10
        np.testing.assert_allclose(session.run(None, {"x": x})[0],
                                   reference.run(None, {"x": x})[0], rtol=1e-4, atol=5e-5)


@needs_onednn
def test_plans_are_freed_with_the_session(monkeypatch):
    monkeypatch.setitem(cpu.ONEDNN_CONV_RULES, "spatial", "onednn")
    gc.collect()
    before = set(cpu._ONEDNN_PLANS)
    session = InferenceSession(conv_model().SerializeToString())
    session.run(None, {"x": np.ones((1, 12, 6, 7), np.float32)})
    added = set(cpu._ONEDNN_PLANS) - before
    assert len(added) == 1  # the one Conv's weights
    del session
    gc.collect()
    assert not added & set(cpu._ONEDNN_PLANS)


def run_without_onednn(code: str, setting: str) -> str:
    env = dict(os.environ, ONNX_PARITY_ONEDNN=setting)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("setting, reason", [("0", "turned it off"),
                                             ("/nonexistent/libdnnl.so.3", "dlopen failed")])
def test_falls_back_to_our_kernel_without_the_library(setting, reason):
    code = """
import numpy as np
from optimized import cpu, kernels
w = np.ones((4, 16, 3, 3), np.float32); w.flags.writeable = False
y = cpu.conv(np.ones((1, 16, 5, 5), np.float32), w, pads=[1, 1, 1, 1])
assert y[0, 0, 2, 2] == 144 and y[0, 0, 0, 0] == 64, y
assert not cpu._ONEDNN_PLANS
print(kernels.onednn_unavailable())
"""
    assert reason in run_without_onednn(code, setting)


# A 2-thread oneDNN plan run in a process that counts the machine as busy (setting "0") or
# never busy ("ignore"): prints whether the plan's result is bit for bit our own 1-thread
# kernel's, whether the result in place is the same, and whether kernel calls were counted
# as dropped to the calling thread (none before the plan runs).
BUSY_PROBE = """
import numpy as np
from optimized import kernels
assert kernels.busy_fallbacks() == 0
kernels.set_num_threads(2)
rng = np.random.default_rng(5)
x = rng.uniform(-1, 1, (2, 24, 11, 13)).astype(np.float32)
w = rng.uniform(-1, 1, (20, 24, 3, 3)).astype(np.float32)
b = rng.uniform(-1, 1, 20).astype(np.float32)
residual = rng.uniform(-1, 1, (2, 20, 11, 13)).astype(np.float32)
plan = kernels.OneDNNConv(x.shape, w, b, pads=[1, 1, 1, 1], residual=True, activation="Relu")
ours = kernels.conv2d(x, w, b, pads=[1, 1, 1, 1], residual=residual, activation="Relu")
y = plan(x, residual)
in_place = residual.copy()
plan(x, in_place, out=in_place)
print(int(np.array_equal(y, ours)), int(np.array_equal(in_place, y)), int(kernels.busy_fallbacks() > 0))
"""


@needs_onednn
@pytest.mark.parametrize("setting, runs_ours", [("0", 1), ("ignore", 0)])
def test_a_busy_machine_runs_our_kernel_on_the_calling_thread(setting, runs_ours):
    # oneDNN's primitive splits its work for the team it was built for: on an oversubscribed
    # machine its barriers would wait for threads without a core (threads.c's check)
    environment = dict(os.environ, ONNX_PARITY_BUSY_MACHINE=setting)
    done = subprocess.run([sys.executable, "-c", BUSY_PROBE], env=environment,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    same_as_ours, in_place_same, counted = map(int, done.stdout.split())
    # oneDNN sums in another order than our kernel, so its bits differ on this many sums
    assert (same_as_ours, in_place_same, counted) == (runs_ours, 1, runs_ours)
