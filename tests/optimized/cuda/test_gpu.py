"""Needs a CUDA device and CuPy: the provider end to end, CUDA graphs, IOBinding with device
arrays, and the generated kernels compiled. Skipped with the reason otherwise. The tests from
'the capture-safe paths' on (planned runs, nvmath cuBLAS, RawKernels, cuDNN) have NEVER RUN."""
import numpy as np
import pytest

import optimized as ort
from optimized.cuda import gpu_unavailable_reason

from .test_kernels import CASES

REASON = gpu_unavailable_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=f"needs a GPU: {REASON}")]
CUDA = "CUDAExecutionProvider"


def _build(name):
    from benchmarks.models import build

    return build(name)


@pytest.mark.parametrize("name", ["gpt2_seq128", "gpt2_seq1", "bert_layer", "chain100",
                                  "light_resnet50"])
def test_cuda_session_matches_the_cpu_session(name):
    m, feeds = _build(name)
    gpu = ort.InferenceSession(m.SerializeToString(), providers=[CUDA, "CPUExecutionProvider"])
    cpu = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    assert gpu.get_providers() == [CUDA, "CPUExecutionProvider"]
    assert gpu._plan.placement.all_on_device
    for g, c in zip(gpu.run(None, feeds), cpu.run(None, feeds)):
        assert isinstance(g, np.ndarray)
        np.testing.assert_allclose(g, c, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name", ["gpt2_seq1", "light_resnet50"])
def test_cuda_graph_replay_matches_step_by_step(name):
    m, feeds = _build(name)
    options = {"enable_cuda_graph": True}
    graph = ort.InferenceSession(m.SerializeToString(), providers=[(CUDA, options)])
    plain = ort.InferenceSession(m.SerializeToString(), providers=[CUDA])
    first = graph.run(None, feeds)  # captures
    assert graph._plan._graphs, "nothing was captured"
    for _ in range(2):  # replays, with new feed values
        feeds = {k: (v * 0.5).astype(v.dtype) for k, v in feeds.items()}
        step_by_step = plain._plan.plan.run(feeds)  # the DevicePlan under the planned runs
        for g, p in zip(graph.run(None, feeds), step_by_step):
            np.testing.assert_allclose(g, p, rtol=1e-4, atol=1e-4)
    assert len(first) == len(m.graph.output)


def test_run_takes_cupy_feeds_and_checks_them_without_a_copy():
    import cupy

    m, feeds = _build("chain100")
    sess = ort.InferenceSession(m.SerializeToString(), providers=[CUDA])
    y = sess.run(None, {"x": cupy.asarray(feeds["x"])})[0]
    np.testing.assert_allclose(y, sess.run(None, feeds)[0], rtol=1e-6)
    from reference.errors import InvalidFeedError

    with pytest.raises(InvalidFeedError, match="'x'"):
        sess.run(None, {"x": cupy.zeros((3, 3), cupy.float32)})


def test_iobinding_with_device_arrays():
    import cupy

    m, feeds = _build("chain100")
    sess = ort.InferenceSession(m.SerializeToString(), providers=[CUDA])
    binding = sess.io_binding()
    x = cupy.asarray(feeds["x"])
    binding.bind_input("x", x)
    binding.bind_output(sess.get_outputs()[0].name, "cuda")
    sess.run_with_iobinding(binding)
    (y,) = binding.get_outputs()  # an OrtValue, as onnxruntime's get_outputs gives
    assert y.device_name() == "cuda" and isinstance(y.value(), cupy.ndarray)
    np.testing.assert_allclose(binding.copy_outputs_to_cpu()[0], sess.run(None, feeds)[0],
                               rtol=1e-5, atol=1e-6)
    binding.clear_binding_inputs()
    binding.bind_input("x", "cuda", 0, np.float32, x.shape, x.data.ptr)
    sess.run_with_iobinding(binding)
    np.testing.assert_allclose(binding.copy_outputs_to_cpu()[0], sess.run(None, feeds)[0],
                               rtol=1e-5, atol=1e-6)


def test_check_mode_on_the_gpu_passes():
    m, feeds = _build("bert_layer")
    so = ort.SessionOptions()
    so.check_nodes = True
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=[CUDA])
    sess.run(None, feeds)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_fused_kernels_compile_and_match_numpy(dtype):
    import cupy
    from onnx import helper

    from optimized.cuda.fusion import TEMPLATES, find_groups

    rng = np.random.default_rng(0)
    for op, (arity, _) in TEMPLATES.items():
        inputs = ["x", "y"][:arity]
        nodes = [helper.make_node("Abs", ["x0"], ["x"]), helper.make_node(op, inputs, ["out"])]
        if arity == 2:
            nodes.insert(1, helper.make_node("Exp", ["y0"], ["y"]))
        (group,) = find_groups(nodes, lambda i: True, ["out"], {})
        arrays = [rng.uniform(0.1, 2, (4, 5)).astype(dtype) for _ in group.inputs]
        kernel = cupy.ElementwiseKernel(**group.cuda_source(dtype))
        got = kernel(*[cupy.asarray(a) for a in arrays]).get()
        np.testing.assert_allclose(got, group.evaluate(np, *arrays), rtol=2e-3, atol=1e-4,
                                   err_msg=op)


# the capture-safe paths (written without a GPU; these tests are their first run) -----------
def _cupy_device(use_tf32=False):
    from optimized.cuda.arrays import CupyDevice

    return CupyDevice(0, use_tf32)


@pytest.mark.parametrize("name", sorted(CASES))
def test_planned_kernel_is_captured_on_the_gpu_and_replays_like_the_reference(name):
    import warnings

    from optimized.cpu import KERNELS as CPU_KERNELS
    from optimized.cuda.graph_capture import GraphPlan
    from optimized.cuda.plan import DevicePlan
    from reference import ReferenceEvaluator

    from .test_kernels import _case_model

    m, feeds = _case_model(name)
    ev = ReferenceEvaluator(m, check=False)
    plan = GraphPlan(DevicePlan(m, CPU_KERNELS, ev, _cupy_device()), enable_cuda_graph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan.run(feeds)
    assert plan._graphs, plan.not_planned or plan.not_captured
    for scale in (0.5, -2.0):
        new = {k: (v * scale).astype(v.dtype) for k, v in feeds.items()}
        for g, e in zip(plan.run(new), ev.run(None, new)):
            assert g.dtype == e.dtype and g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("trans_a, trans_b, batch", [(False, False, ()), (True, False, ()),
                                                     (False, True, (3,)), (True, True, (2,))])
def test_cublas_gemm_through_nvmath_matches_numpy(dtype, trans_a, trans_b, batch):
    pytest.importorskip("nvmath", reason="nvmath-python is not installed (the gpu extra)")
    dev = _cupy_device()
    rng = np.random.default_rng(0)
    m, k, n = 5, 7, 3
    a = rng.standard_normal(batch + ((k, m) if trans_a else (m, k))).astype(dtype)
    b = rng.standard_normal(batch + ((n, k) if trans_b else (k, n))).astype(dtype)
    da, db = dev.to_device(a), dev.to_device(b)
    out = dev.empty(batch + (m, n), dtype)
    launch = dev.gemm(da, db, out, trans_a, trans_b, alpha=0.5)
    with dev.stream:
        launch()
    want = 0.5 * np.matmul(np.swapaxes(a, -1, -2) if trans_a else a,
                           np.swapaxes(b, -1, -2) if trans_b else b).astype(np.float64)
    tol = 2e-3 if dtype == "float16" else 1e-5
    np.testing.assert_allclose(dev.to_host(out), want, rtol=tol, atol=tol)


def test_raw_kernels_match_their_numpy_twins():
    from optimized.cuda import raw_kernels

    dev = _cupy_device()
    rng = np.random.default_rng(1)
    b, n, s, h, past = 2, 3, 5, 64, 200
    t = s + past
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in
              ((b, n, s, h), (b, n, t, h), (b, n, t, h), (b, n, s, t))]
    want = np.empty((b, n, s, h), np.float32)
    params = {"scale": 0.125, "causal": 1, "mask_value": -10000.0, "has_bias": 1}
    raw_kernels.attention_twin(*arrays, want, **params)
    out = dev.empty(want.shape, np.float32)
    dev.kernel(raw_kernels.ATTENTION)(*[dev.to_device(a) for a in arrays], out, **params)()
    np.testing.assert_allclose(dev.to_host(out), want, rtol=1e-4, atol=1e-5)

    x, scale, bias = (rng.standard_normal(shape).astype(np.float32) for shape in ((6, 768), (768,), (768,)))
    want = np.empty_like(x)
    raw_kernels.layer_norm_twin(x, scale, bias, want, cols=768, eps=1e-5, has_bias=1)
    out = dev.empty(x.shape, np.float32)
    dev.kernel(raw_kernels.LAYER_NORM)(dev.to_device(x), dev.to_device(scale), dev.to_device(bias),
                                       out, cols=768, eps=1e-5, has_bias=1)()
    np.testing.assert_allclose(dev.to_host(out), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_cudnn_convolution_matches_the_reference(dtype):
    pytest.importorskip("cudnn", reason="nvidia-cudnn-frontend is not installed (the gpu extra)")
    import warnings

    from onnx import helper

    from optimized.cpu import KERNELS as CPU_KERNELS
    from optimized.cuda.graph_capture import GraphPlan
    from optimized.cuda.plan import DevicePlan
    from reference import ReferenceEvaluator

    from .helpers import model

    rng = np.random.default_rng(2)
    node = helper.make_node("FusedConv", ["x", "w", "b", "z"], ["y"], domain="com.microsoft",
                            activation="Relu", pads=[1, 1, 1, 1])
    x = rng.standard_normal((2, 16, 12, 10)).astype(dtype)
    inits = {"w": (rng.standard_normal((8, 16, 3, 3)) * 0.2).astype(dtype),
             "b": rng.standard_normal(8).astype(dtype), "z": rng.standard_normal((2, 8, 12, 10)).astype(dtype)}
    m = model([node], {"x": x}, ["y"], inits, ms=True, out_type=10 if dtype == "float16" else 1)
    ev = ReferenceEvaluator(m, check=False)
    dev = _cupy_device(use_tf32=True)  # cuDNN's float32 engines are TF32
    assert dev.cudnn_conv is not None
    plan = GraphPlan(DevicePlan(m, CPU_KERNELS, ev, dev), enable_cuda_graph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = plan.run({"x": x})[0]
    assert plan._graphs
    want = ev.run(None, {"x": x})[0]
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("name", ["gpt2_seq1", "bert_layer", "light_resnet50"])
def test_benchmark_models_run_every_node_on_the_gpu_and_capture(name):
    import warnings

    from optimized.cuda import node_counts

    m, feeds = _build(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sess = ort.InferenceSession(m.SerializeToString(),
                                    providers=[(CUDA, {"enable_cuda_graph": True})])
        sess.run(None, feeds)
        sess.run(None, feeds)
    assert sess._plan._graphs
    counts = node_counts(sess._plan)
    assert counts["cpu"] == 0 and counts["gpu"] > 0
