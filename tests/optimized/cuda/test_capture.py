"""Capture safety on the CPU: the fake device's strict capturing mode refuses what CUDA stream
capture refuses (host<->device copies, allocations, synchronize, library GEMMs outside
device.gemm), and every planned kernel is captured and replayed under it."""
import warnings

import numpy as np
import pytest
from onnx import helper

from optimized.cpu import KERNELS as CPU_KERNELS
from optimized.cuda import launches
from optimized.cuda.arrays import CaptureError, FakeDevice
from optimized.cuda.graph_capture import GraphPlan
from optimized.cuda.plan import DevicePlan
from optimized.cuda.raw_kernels import attention_twin
from reference import ReferenceEvaluator

from .helpers import model, rand
from .test_kernels import CASES, _case_model


def _graph_plan(m, **kw):
    plan = DevicePlan(m, CPU_KERNELS, ReferenceEvaluator(m, check=False), FakeDevice(), strict=True)
    return GraphPlan(plan, enable_cuda_graph=True, **kw)


# the strict capturing mode itself --------------------------------------------------------
@pytest.mark.parametrize("what, call", [
    ("host-to-device copy", lambda d, a, b: d.to_device(np.ones(3, np.float32))),
    ("device-to-host copy", lambda d, a, b: d.to_host(a)),
    ("synchronize", lambda d, a, b: d.synchronize()),
    ("allocation", lambda d, a, b: d.empty((2,), np.float32)),
    ("without a device out", lambda d, a, b: a + b),
    ("allocated", lambda d, a, b: a.astype(np.float64)),
    ("reads a host array", lambda d, a, b: np.add(a, np.ones(3, np.float32), out=b)),
    ("library GEMM", lambda d, a, b: np.matmul(a.reshape(3, 1), b.reshape(1, 3), out=d.planned)),
    ("np.pad", lambda d, a, b: np.pad(a, 1)),
    ("without a device out", lambda d, a, b: a.sum()),
])
def test_capture_refuses_what_cuda_stream_capture_refuses(what, call):
    dev = FakeDevice()
    a, b = dev.to_device(np.arange(3, dtype=np.float32)), dev.to_device(np.ones(3, np.float32))
    dev.planned = dev.empty((3, 3), np.float32)
    with pytest.raises(CaptureError, match=what), dev.capture():
        call(dev, a, b)
    assert not dev.capturing
    np.testing.assert_array_equal(a + b, [1, 2, 3])  # outside capture everything works


def test_capture_allows_launches_into_planned_buffers():
    dev = FakeDevice()
    a, b = dev.to_device(np.arange(6, dtype=np.float32).reshape(2, 3)), dev.to_device(np.ones(3, np.float32))
    out, row, out_t = dev.empty((2, 3), np.float32), dev.empty((2, 1), np.float32), dev.empty((3, 2), np.float32)
    gemm_out = dev.empty((2, 2), np.float32)
    gemm = dev.gemm(a, a, gemm_out, trans_b=True)
    with dev.capture() as holder:
        for launch in (lambda: np.add(a, b, out=out), lambda: np.exp(out, out=out),
                       lambda: np.copyto(out_t, a.T), lambda: out.fill(0),
                       lambda: np.sum(a, axis=1, keepdims=True, out=row), gemm):
            launch()
            holder.record(launch)
    np.testing.assert_array_equal(row.view(np.ndarray), [[3], [12]])
    np.testing.assert_array_equal(gemm_out.view(np.ndarray), a.view(np.ndarray) @ a.view(np.ndarray).T)
    gemm_out.view(np.ndarray)[...] = 0
    holder.graph.launch()  # the replay repeats every launch
    np.testing.assert_array_equal(gemm_out.view(np.ndarray), a.view(np.ndarray) @ a.view(np.ndarray).T)


# every planned kernel, captured and replayed -----------------------------------------------
@pytest.mark.parametrize("name", sorted(CASES))
def test_planned_kernel_is_captured_and_replays_like_the_reference(name):
    m, feeds = _case_model(name)
    plan = _graph_plan(m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a plan that cannot be captured warns
        plan.run(feeds)
    assert plan._graphs, plan.not_planned or plan.not_captured
    ev = ReferenceEvaluator(m, check=False)
    for scale in (0.5, -2.0):  # replays read the new feed values
        new = {k: (v * scale).astype(v.dtype) for k, v in feeds.items()}
        for g, e in zip(plan.run(new), ev.run(None, new)):
            assert g.dtype == e.dtype and g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)
    assert len(plan._graphs) == 1


def test_every_device_kernel_has_a_planner():
    from optimized.cuda.kernels import KERNELS

    assert set(KERNELS) - set(launches.PLANNERS) == {("", "Shape")}  # Shape is a plan-time constant


def test_one_graph_per_input_shape_signature():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    rng = np.random.default_rng(3)
    m = model(nodes, {"x": rand(rng, (2, 5))}, ["y"], {"w": rand(rng, (5, 3))})
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    plan = _graph_plan(m)
    ev = ReferenceEvaluator(m)
    for rows in (2, 7, 2, 7):
        x = rand(rng, (rows, 5))
        np.testing.assert_allclose(plan.run({"x": x})[0], ev.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert len(plan._graphs) == 2


def _host_node_model():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Hardmax", ["r"], ["y"], name="hardmax")]
    return model(nodes, {"x": np.zeros((2, 3), np.float32)}, ["y"])


def test_a_plan_that_cannot_be_captured_warns_once_naming_the_node_and_why():
    plan = _graph_plan(_host_node_model())
    x = np.array([[1, -2, 3], [0, 5, -1]], np.float32)
    with pytest.warns(UserWarning, match="Hardmax node 'hardmax' cannot be captured: runs on the host"):
        y = plan.run({"x": x})[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan.run({"x": x})
        plan.run({"x": x[:1]})  # a new signature: still no second warning
    np.testing.assert_array_equal(y, [[0, 0, 1], [0, 1, 0]])
    assert not plan._graphs


def test_a_launch_that_capture_refuses_is_named_in_the_warning(monkeypatch):
    def matmul_through_numpy(dev, node, ins, attrs):  # np.matmul: what cupy.matmul does
        out = launches.Spec(ins[0].shape[:-1] + ins[1].shape[-1:], ins[0].dtype)
        return launches.Planned([out], lambda a, o, s: [lambda: np.matmul(a[0], a[1], out=o[0])])

    monkeypatch.setitem(launches.PLANNERS, ("", "MatMul"), matmul_through_numpy)
    m, feeds = _case_model("matmul")
    plan = _graph_plan(m)
    with pytest.warns(UserWarning, match=r"MatMul .* cannot be captured: CaptureError: np.matmul"):
        first = plan.run(feeds)
    np.testing.assert_allclose(first[0], feeds["in0"] @ CASES["matmul"][2][1], rtol=1e-5)
    assert not plan._graphs
    np.testing.assert_allclose(plan.run(feeds)[0], first[0])  # planned, not captured


# float16: float32 accumulation, checked against the reference -------------------------------
def test_float16_block_on_the_fake_device_matches_the_reference():
    rng = np.random.default_rng(5)
    f16 = np.float16
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "scale", "bias"], ["n"], axis=-1),
             helper.make_node("Softmax", ["n"], ["s"], axis=-1),
             helper.make_node("ReduceMean", ["s", "axes"], ["y"], keepdims=1)]
    inits = {"w": (rand(rng, (64, 24)) * 0.2).astype(f16), "scale": rand(rng, (24,)).astype(f16),
             "bias": rand(rng, (24,)).astype(f16), "axes": np.array([0], np.int64)}
    x = rand(rng, (3, 5, 64)).astype(f16)
    m = model(nodes, {"x": x}, ["y", "s"], inits, out_type=10)
    plan = _graph_plan(m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = plan.run({"x": x})
    assert plan._graphs
    exact = ReferenceEvaluator(_as_float32(m)).run(None, {"x": x.astype(np.float32)})
    for g, e in zip(got, exact):
        assert g.dtype == np.float16
        # float16 storage of float32-accumulated results: within a few float16 ulps
        np.testing.assert_allclose(g.astype(np.float32), e, rtol=4e-3, atol=2e-3)


def _as_float32(m):
    from onnx import TensorProto, numpy_helper

    m = type(m).FromString(m.SerializeToString())
    for t in m.graph.initializer:
        if t.data_type == TensorProto.FLOAT16:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
    for v in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        if v.type.tensor_type.elem_type == TensorProto.FLOAT16:
            v.type.tensor_type.elem_type = TensorProto.FLOAT
    return m


# the attention kernel's algorithm -------------------------------------------------------------
@pytest.mark.parametrize("causal, past", [(0, 0), (1, 0), (1, 250)])
def test_blockwise_online_softmax_attention_equals_the_direct_formula(causal, past):
    rng = np.random.default_rng(7)
    b, n, s, h = 2, 3, 5, 16
    t = past + s
    q, k, v = (rng.standard_normal(shape).astype(np.float32)
               for shape in ((b, n, s, h), (b, n, t, h), (b, n, t, h)))
    bias = rng.standard_normal((b, n, s, t)).astype(np.float32)
    out = np.empty_like(q)
    attention_twin(q, k, v, bias, out, scale=0.25, causal=causal, mask_value=-10000.0,
                   has_bias=1, block=64)  # several tiles of keys when past is 250
    scores = (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) * 0.25 + bias
    if causal:
        scores += np.where(np.arange(t)[None, :] > np.arange(s)[:, None] + past, -10000.0, 0.0)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    want = (weights / weights.sum(axis=-1, keepdims=True)) @ v
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["input_as_output", "initializer_as_output", "empty_tensor"])
def test_planned_outputs_that_are_feeds_initializers_or_empty(case):
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    relu = helper.make_node("Relu", ["x"], ["r"])
    if case == "input_as_output":
        m = model([relu], {"x": x}, ["x", "r", "r"])
    elif case == "initializer_as_output":
        m = model([relu], {"x": x}, ["r", "c"], {"c": np.full(2, 3, np.float32)})
    else:
        x = np.zeros((0, 3), np.float32)
        m = model([relu, helper.make_node("MatMul", ["r", "w"], ["y"])], {"x": x}, ["y"],
                  {"w": np.ones((3, 4), np.float32)})
    plan = _graph_plan(m)
    want = ReferenceEvaluator(m).run(None, {"x": x})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            got = plan.run({"x": x})
            for g, w in zip(got, want, strict=True):
                assert type(g) is np.ndarray and g.shape == w.shape
                np.testing.assert_array_equal(g, w)
    assert plan._graphs


def test_a_value_read_on_the_host_from_a_feed_is_not_planned():
    """Reduce axes given as a graph input: their value is known only at run time."""
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    m = model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
              {"x": x, "axes": np.array([1], np.int64)}, ["y"])
    plan = _graph_plan(m)
    for axes in ([1], [0, 2]):
        feeds = {"x": x, "axes": np.array(axes, np.int64)}
        with pytest.warns(UserWarning, match="reads graph input 'axes' on the host") if axes == [1] \
                else warnings.catch_warnings():
            got = plan.run(feeds)[0]
        np.testing.assert_array_equal(got, x.sum(axis=tuple(axes)))
    assert not plan._graphs


def test_integer_max_pool_pads_with_the_lowest_integer():
    x = np.random.default_rng(4).integers(0, 255, (1, 2, 5, 4), dtype=np.uint8)
    m = model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
              {"x": x}, ["y"], out_type=2)
    plan = _graph_plan(m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = plan.run({"x": x})[0]
    assert plan._graphs
    np.testing.assert_array_equal(got, ReferenceEvaluator(m).run(None, {"x": x})[0])


# channels-last convolutions (the cuDNN path's layout decisions, through its numpy twin) ------
def _conv_net():
    rng = np.random.default_rng(8)
    ms = "com.microsoft"
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="c2", pads=[1, 1, 1, 1]),
             helper.make_node("FusedConv", ["c2", "w3", "b3", "c2"], ["c3"], name="c3", domain=ms,
                              activation="Relu"),
             helper.make_node("MaxPool", ["c3"], ["pooled"], name="pool", kernel_shape=[2, 2]),
             helper.make_node("Conv", ["c3", "w4"], ["c4"], name="c4", pads=[0, 0, 1, 1])]
    inits = {"w1": rand(rng, (4, 3, 3, 3)), "b1": rand(rng, (4,)), "w2": rand(rng, (4, 4, 3, 3)),
             "w3": rand(rng, (4, 4, 1, 1)), "b3": rand(rng, (4,)), "w4": rand(rng, (6, 4, 2, 2))}
    x = rand(rng, (2, 3, 7, 5))
    return model(nodes, {"x": x}, ["pooled", "c3", "c4"], inits, ms=True), x


def test_channels_last_convolutions_pass_nhwc_between_them():
    m, x = _conv_net()
    dev = FakeDevice(channels_last_conv=True, use_tf32=True)
    plan = GraphPlan(DevicePlan(m, CPU_KERNELS, ReferenceEvaluator(m, check=False), dev, strict=True),
                     enable_cuda_graph=True)
    want = ReferenceEvaluator(m).run(None, {"x": x})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            for g, w in zip(plan.run({"x": x}), want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    assert plan._graphs
    (planned,) = plan._planned.values()
    layouts = {node.name: outs[0].spec.layout for node, _, _, outs, _ in planned.bound
               if node.op_type in ("Conv", "FusedConv")}
    assert layouts == {"c1": "nhwc", "c2": "nhwc", "c3": "nhwc", "c4": ""}  # c4: asymmetric pads
    # one (n, c, h, w) copy each for c1 (read by Relu) and c3 (MaxPool and the graph output);
    # c2 reaches c3 as input and residual without one, c4 copies its input itself
    copies = [node.name for node, _, ins, _, _ in planned.bound
              if node.op_type not in ("Conv", "FusedConv")
              and any(getattr(getattr(v, "spec", None), "layout", "") for v in ins)]
    assert sorted(copies) == ["pool", "relu"]  # the first reader of each names the copy


def test_float32_convolutions_stay_off_tf32_unless_asked():
    m, x = _conv_net()
    plan = GraphPlan(DevicePlan(m, CPU_KERNELS, ReferenceEvaluator(m, check=False),
                                FakeDevice(channels_last_conv=True), strict=True))
    plan.run({"x": x})
    (planned,) = plan._planned.values()
    assert not planned._relaid
    assert all(not outs[0].spec.layout for _, _, _, outs, _ in planned.bound if outs and outs[0])


def test_light_resnet50_keeps_activations_channels_last_between_its_convolutions():
    import optimized as ort
    from benchmarks.models import build

    from .test_plan import _without_final_softmax

    m, feeds = build("light_resnet50")
    sess = ort.InferenceSession(_without_final_softmax(m).SerializeToString())
    dev = FakeDevice(channels_last_conv=True, use_tf32=True)
    plan = GraphPlan(DevicePlan(sess.optimized_model, CPU_KERNELS, sess._evaluator, dev, strict=True),
                     enable_cuda_graph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = [plan.run(feeds)[0] for _ in range(2)]
    want = sess.run(None, feeds)[0]
    for g in got:
        np.testing.assert_allclose(g, want, rtol=1e-4)
    (planned,) = plan._planned.values()
    copies = [node.op_type for node, _, ins, _, _ in planned.bound
              if node.op_type not in ("Conv", "FusedConv")
              and any(getattr(getattr(v, "spec", None), "layout", "") for v in ins)]
    assert copies == ["MaxPool", "AveragePool"]  # 53 convolutions, two layout changes


def test_shape_computations_are_worked_out_when_planned():
    """Shape -> Slice -> Concat -> Reshape: the target shape is a plan-time constant."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "one"], ["first"]),
             helper.make_node("Concat", ["first", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["flat"]),
             helper.make_node("Relu", ["flat"], ["y"])]
    i64 = np.int64
    inits = {"zero": np.array([0], i64), "one": np.array([1], i64), "minus_one": np.array([-1], i64)}
    x = np.random.default_rng(9).standard_normal((2, 3, 4)).astype(np.float32)
    m = model(nodes, {"x": x}, ["y", "target"], inits)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    plan = _graph_plan(m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for rows in (2, 5, 5):
            feed = np.random.default_rng(rows).standard_normal((rows, 3, 4)).astype(np.float32)
            y, target = plan.run({"x": feed})
            np.testing.assert_array_equal(y, np.maximum(feed.reshape(rows, 12), 0))
            np.testing.assert_array_equal(target, [rows, -1])
    assert len(plan._graphs) == 2
