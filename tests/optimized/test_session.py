"""The optimized session behaves like onnxruntime's for the calls apps make, rejects bad feeds
before any kernel runs, and its optional outputs (profile, rewritten model, check mode) work."""
import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import optimized as ort
from optimized.session import NodeCheckError

F = TensorProto.FLOAT


def _mlp_model():
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="bias1"),
             helper.make_node("Relu", ["hb"], ["a"], name="relu1"),
             helper.make_node("Identity", ["a"], ["a2"], name="noop"),
             helper.make_node("MatMul", ["a2", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", F, ["batch", 8])],
                              [helper.make_tensor_value_info("y", F, ["batch", 4])], [w1, b1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _session(level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL, **options):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    for k, v in options.items():
        setattr(so, k, v)
    return ort.InferenceSession(_mlp_model().SerializeToString(), so, providers=["CPUExecutionProvider"])


def _expected(x):
    from reference import ReferenceEvaluator

    return ReferenceEvaluator(_mlp_model()).run(None, {"x": x})[0]


def test_api_surface_like_onnxruntime():
    sess = _session()
    (inp,), (out,) = sess.get_inputs(), sess.get_outputs()
    assert (inp.name, inp.type, inp.shape) == ("x", "tensor(float)", ["batch", 8])
    assert (out.name, out.type, out.shape) == ("y", "tensor(float)", ["batch", 4])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert sess.get_modelmeta().graph_name == "mlp"
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _expected(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sess.run(["y"], {"x": x})[0], _expected(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("level", list(ort.GraphOptimizationLevel))
def test_every_level_gives_the_reference_result_and_dynamic_batch_works(level):
    sess = _session(level)
    for batch in (1, 5, 2):
        x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], _expected(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("feeds, error, message", [
    ({"z": np.zeros((1, 8), np.float32)}, ValueError, "unknown input 'z'"),
    ({}, ValueError, "missing input 'x'"),
    ({"x": np.zeros((1, 8), np.float64)}, ValueError, "input 'x': expected tensor\\(float\\)"),
    ({"x": np.zeros(8, np.float32)}, ValueError, "input 'x': expected rank 2"),
    ({"x": np.zeros((1, 9), np.float32)}, ValueError, "input 'x': dimension 1 must be 8"),
    ({"x": [[1.0] * 9]}, ValueError, "input 'x': dimension 1 must be 8"),  # a list converts first
])
def test_bad_feeds_fail_before_any_kernel_runs(feeds, error, message, monkeypatch):
    sess = _session()
    ran = []
    monkeypatch.setattr(sess._plan, "run", lambda *a, **k: ran.append(1))
    with pytest.raises(error, match=message):
        sess.run(None, feeds)
    assert not ran


def test_unknown_provider_is_refused():
    with pytest.raises(ValueError, match="TensorrtExecutinProvider"):  # a typo: no such provider
        ort.InferenceSession(_mlp_model().SerializeToString(), providers=["TensorrtExecutinProvider"])


def test_onnxruntimes_other_providers_warn_and_fall_back_to_the_cpu():
    with pytest.warns(UserWarning, match="'TensorrtExecutionProvider' is not in available provider names"):
        sess = ort.InferenceSession(_mlp_model().SerializeToString(),
                                    providers=["TensorrtExecutionProvider", "CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]


def test_profiling_writes_one_event_per_node(tmp_path):
    sess = _session(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, enable_profiling=True,
                    profile_file_prefix=str(tmp_path / "prof"))
    sess.run(None, {"x": np.ones((2, 8), np.float32)})
    path = sess.end_profiling()
    with open(path) as f:
        events = [e for e in json.load(f) if e["cat"] == "Node"]  # not the run's "Session" event
    assert [e["args"]["op_name"] for e in events] == ["MatMul", "Add", "Relu", "Identity", "MatMul"]
    assert events[0]["args"]["input_type_shape"][0] == {"float32": [2, 8]}
    assert all(e["dur"] >= 0 and e["ph"] == "X" for e in events)


def test_optimized_model_file_is_valid_onnx_that_onnxruntime_loads(tmp_path):
    path = str(tmp_path / "opt.onnx")
    sess = _session(optimized_model_filepath=path)
    saved = onnx.load(path)
    onnx.checker.check_model(saved, full_check=True)
    assert "Identity" not in {n.op_type for n in saved.graph.node}
    assert len(saved.graph.node) < 5
    onnxruntime = pytest.importorskip("onnxruntime")
    x = np.ones((2, 8), np.float32)
    theirs = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(theirs[0], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_check_mode_reports_a_wrong_kernel_with_a_repro(tmp_path, monkeypatch):
    from optimized import cpu

    monkeypatch.setitem(cpu.KERNELS, ("", "Relu"), lambda x: np.maximum(x, 0) + np.float32(1e-3))
    sess = _session(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, check_nodes=True,
                    check_nodes_dir=str(tmp_path / "repro"))
    with pytest.raises(NodeCheckError, match="'relu1' \\(Relu\\)"):
        sess.run(None, {"x": np.ones((2, 8), np.float32)})
    repro = onnx.load(str(tmp_path / "repro" / "model.onnx"))
    assert [n.op_type for n in repro.graph.node] == ["Relu"]
    assert os.path.exists(tmp_path / "repro" / "inputs.npz")


def test_check_mode_is_silent_when_kernels_agree():
    sess = _session(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, check_nodes=True)
    sess.run(None, {"x": np.ones((2, 8), np.float32)})


def test_iter_results_gives_every_value_of_the_plan():
    sess = _session(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    kinds = [(r.kind, r.name) for r in sess.iter_results({"x": np.ones((1, 8), np.float32)})]
    assert kinds[:4] == [("initializer", "w1"), ("initializer", "b1"), ("initializer", "w2"), ("input", "x")]
    assert ("result", "a2") in kinds and kinds[-1] == ("output", "y")


def test_values_are_released_after_last_use():
    sess = _session(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    released = {sess._plan.names[s] for step in sess._plan.steps for s in step.release}
    assert {"h", "hb", "a", "a2"} <= released
    assert "y" not in released


def test_intra_op_threads_govern_numpys_blas_and_the_kernels():
    import threadpoolctl

    from optimized import kernels

    x = np.ones((2, 8), np.float32)
    one, two = _session(intra_op_num_threads=1), _session(intra_op_num_threads=2)
    for sess, n in ((one, 1), (two, 2), (one, 1)):  # each run applies its own session's count
        sess.run(None, {"x": x})
        assert kernels.get_num_threads() == n
        numpy_blas = [i for i in threadpoolctl.threadpool_info()
                      if i["user_api"] == "blas" and "openblas64" in i["filepath"]]
        assert all(i["num_threads"] == n for i in numpy_blas)
        ours = [i for i in threadpoolctl.threadpool_info() if "scipy_openblas32" in i["filepath"]]
        assert all(i["num_threads"] == 1 for i in ours)  # the kernels split GEMMs with OpenMP


class _DeviceArray:
    """Stands in for a CuPy array: the CUDA array interface, a dtype and a shape."""

    def __init__(self):
        self.dtype, self.shape = np.dtype(np.float32), (2, 8)
        self.__cuda_array_interface__ = {"shape": self.shape, "typestr": "<f4",
                                         "data": (0, False), "version": 3}


def test_device_array_feed_on_the_cpu_provider_is_refused_by_name():
    with pytest.raises(TypeError, match="input 'x' is a device array"):
        _session().run(None, {"x": _DeviceArray()})


def test_terminate_set_during_a_run_stops_it_after_the_current_node(monkeypatch):
    from optimized import cpu

    run_options = ort.RunOptions()
    ran = []

    def relu_that_cancels(x):
        run_options.terminate = True  # as another thread would, while the run is under way
        ran.append("relu")
        return np.maximum(x, 0)

    monkeypatch.setitem(cpu.KERNELS, ("", "Relu"), relu_that_cancels)
    monkeypatch.setitem(cpu.KERNELS, ("", "Identity"), lambda x: ran.append("identity") or x)
    sess = _session(ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    with pytest.raises(ort.Fail, match="terminate flag"):
        sess.run(None, {"x": np.ones((2, 8), np.float32)}, run_options)
    assert ran == ["relu"]
