"""Needs a CUDA device and CuPy: the provider end to end, CUDA graphs, IOBinding with device
arrays, and the generated kernels compiled. Skipped with the reason otherwise; NEVER RUN YET."""
import numpy as np
import pytest

import optimized as ort
from optimized.cuda import gpu_unavailable_reason

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
        for g, p in zip(graph.run(None, feeds), plain.run(None, feeds)):
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
    (y,) = binding.get_outputs()
    assert isinstance(y, cupy.ndarray)
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
