"""onnxruntime's public Python API, member by member, as onnxruntime's API documentation
describes it. Each test runs the same calls against `optimized` and, where it is installed
(the anchors extra), against onnxruntime, and asserts the same results, shapes, types and
exception classes."""
from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import optimized
import reference.errors

F, I64, S = TensorProto.FLOAT, TensorProto.INT64, TensorProto.STRING
ERROR_NAMES = ["Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError", "RuntimeException",
               "InvalidProtobuf", "ModelLoaded", "NotImplemented", "InvalidGraph", "EPFail"]


def _onnxruntime():
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime (anchors extra) is the side-by-side anchor")
    ort.set_default_logger_severity(3)
    return ort


@pytest.fixture(params=["optimized", "onnxruntime"])
def rt(request):
    return optimized if request.param == "optimized" else _onnxruntime()


def _errors(rt):
    if rt is optimized:
        return optimized.capi.onnxruntime_pybind11_state
    from onnxruntime.capi import onnxruntime_pybind11_state
    return onnxruntime_pybind11_state


def _model(nodes, inputs, outputs, initializers=(), opset=17, ir_version=8):
    graph = helper.make_graph(nodes, "api", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)


def affine_model():
    """y = relu(x @ w + b), x of shape [batch, 5] (5 != 3 so an axis mix-up shows)."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3), "w")
    b = numpy_helper.from_array(np.array([0.1, -0.2, 0.3], np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["z"], name="add"),
             helper.make_node("Relu", ["z"], ["y"], name="relu")]
    return _model(nodes, [helper.make_tensor_value_info("x", F, ["batch", 5])],
                  [helper.make_tensor_value_info("y", F, ["batch", 3])], [w, b])


def session(rt, model=None, options=None):
    return rt.InferenceSession((model or affine_model()).SerializeToString(), options,
                               providers=["CPUExecutionProvider"])


X = np.linspace(-2, 2, 10, dtype=np.float32).reshape(2, 5)


def expected(x=X):
    w = np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3)
    return np.maximum(x @ w + np.array([0.1, -0.2, 0.3], np.float32), 0)


# module level -------------------------------------------------------------------------------
def test_module_functions(rt):
    assert rt.get_available_providers()[-1] == "CPUExecutionProvider"
    assert "CPUExecutionProvider" in rt.get_all_providers()
    assert "CUDAExecutionProvider" in rt.get_all_providers()
    assert rt.get_device() == "CPU"
    assert isinstance(rt.get_version_string(), str) and rt.get_version_string() == rt.__version__
    assert isinstance(rt.get_build_info(), str)
    rt.set_default_logger_severity(3)
    with pytest.raises(RuntimeError):
        rt.set_default_logger_severity(7)
    assert rt.disable_telemetry_events() is None and rt.enable_telemetry_events() is None


def test_enums(rt):
    assert [m.name for m in rt.ExecutionMode.__members__.values()] == ["ORT_SEQUENTIAL", "ORT_PARALLEL"]
    levels = {name: int(m) for name, m in rt.GraphOptimizationLevel.__members__.items()}
    assert levels == {"ORT_DISABLE_ALL": 0, "ORT_ENABLE_BASIC": 1, "ORT_ENABLE_EXTENDED": 2,
                      "ORT_ENABLE_LAYOUT": 3, "ORT_ENABLE_ALL": 99}


def test_exception_classes_under_onnxruntimes_names():
    for name in ERROR_NAMES:
        ours = getattr(optimized, name)
        assert ours is getattr(optimized.capi.onnxruntime_pybind11_state, name)
        assert issubclass(ours, Exception)
    # each also is the class raised before, so existing except clauses keep working
    assert issubclass(optimized.InvalidArgument, reference.errors.InvalidFeedError)
    assert issubclass(optimized.InvalidArgument, ValueError)
    assert issubclass(optimized.NoSuchFile, FileNotFoundError)
    assert issubclass(optimized.InvalidGraph, reference.errors.InvalidModelError)
    assert issubclass(optimized.InvalidProtobuf, reference.errors.InvalidModelError)
    assert issubclass(optimized.Fail, reference.errors.NodeError)
    assert issubclass(optimized.NotImplemented, reference.errors.UnsupportedOpError)


# SessionOptions -----------------------------------------------------------------------------
def test_session_options_defaults(rt):
    so = rt.SessionOptions()
    assert so.graph_optimization_level == rt.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert so.execution_mode == rt.ExecutionMode.ORT_SEQUENTIAL
    assert (so.intra_op_num_threads, so.inter_op_num_threads) == (0, 0)
    assert (so.log_severity_level, so.log_verbosity_level, so.logid) == (-1, 0, "")
    assert (so.enable_mem_pattern, so.enable_cpu_mem_arena, so.use_deterministic_compute) == (True, True, False)
    assert (so.enable_profiling, so.optimized_model_filepath) == (False, "")
    assert so.profile_file_prefix == "onnxruntime_profile_"


def test_misspelled_options_raise_attribute_error(rt):
    so, ro = rt.SessionOptions(), rt.RunOptions()
    with pytest.raises(AttributeError):
        so.graph_optimisation_level = 1
    with pytest.raises(AttributeError):
        so.graph_optimisation_level  # noqa: B018
    with pytest.raises(AttributeError):
        ro.tagx = "1"
    with pytest.raises(TypeError):
        so.intra_op_num_threads = "2"


def test_settable_options_hold_their_values(rt):
    so = rt.SessionOptions()
    so.execution_mode = rt.ExecutionMode.ORT_PARALLEL
    so.inter_op_num_threads = 2
    so.log_verbosity_level = 1
    so.enable_mem_pattern = False
    so.enable_cpu_mem_arena = False
    so.use_deterministic_compute = True
    assert so.execution_mode == rt.ExecutionMode.ORT_PARALLEL
    assert (so.inter_op_num_threads, so.log_verbosity_level) == (2, 1)
    assert (so.enable_mem_pattern, so.enable_cpu_mem_arena, so.use_deterministic_compute) == (False, False, True)
    np.testing.assert_allclose(session(rt, options=so).run(None, {"x": X})[0], expected(), rtol=1e-6)


def test_session_config_entries(rt):
    so = rt.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    with pytest.raises(RuntimeError, match="does not have configuration with key"):
        so.get_session_config_entry("session.nope")
    with pytest.raises(TypeError):
        so.add_session_config_entry("session.x", 1)


def test_ort_format_models_are_refused_by_name():
    so = optimized.SessionOptions()
    with pytest.raises(optimized.NotImplemented, match="ORT format"):
        so.add_session_config_entry("session.load_model_format", "ORT")


def test_register_custom_ops_library_is_a_clear_error(rt):
    with pytest.raises(Exception) as info:
        rt.SessionOptions().register_custom_ops_library("/no/such/libcustom.so")
    if rt is optimized:
        assert isinstance(info.value, optimized.NotImplemented)
        assert "custom op libraries" in str(info.value)


def test_free_dimension_overrides(rt):
    so = rt.SessionOptions()
    so.add_free_dimension_override_by_name("batch", 2)
    sess = session(rt, options=so)
    assert sess.get_inputs()[0].shape == [2, 5]
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], expected(), rtol=1e-6)
    with pytest.raises(_errors(rt).InvalidArgument):
        sess.run(None, {"x": np.zeros((3, 5), np.float32)})


def test_free_dimension_override_by_denotation(rt):
    model = affine_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].denotation = "DATA_BATCH"
    so = rt.SessionOptions()
    so.add_free_dimension_override_by_denotation("DATA_BATCH", 2)
    assert session(rt, model, so).get_inputs()[0].shape == [2, 5]


def test_add_initializer_overrides_the_models(rt):
    so = rt.SessionOptions()
    bias = rt.OrtValue.ortvalue_from_numpy(np.array([5, 5, 5], np.float32))
    so.add_initializer("b", bias)
    y = session(rt, options=so).run(None, {"x": X})[0]
    w = np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3)
    np.testing.assert_allclose(y, np.maximum(X @ w + 5, 0), rtol=1e-6)
    with pytest.raises((TypeError, RuntimeError)):  # ours TypeError, onnxruntime's RuntimeError
        so.add_initializer("b", np.ones(3, np.float32))


def _external_model(tmp_path):
    """The affine model with w stored in an external data file."""
    model = affine_model()
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    return onnx.load(str(tmp_path / "m.onnx"), load_external_data=False), (tmp_path / "weights.bin").read_bytes()


def test_add_external_initializers_from_files_in_memory(rt, tmp_path):
    model, data = _external_model(tmp_path)
    so = rt.SessionOptions()
    so.add_external_initializers_from_files_in_memory(["weights.bin"], [np.frombuffer(data, np.uint8)], [len(data)])
    y = rt.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    np.testing.assert_allclose(y, expected(), rtol=1e-6)


def test_add_external_initializers(rt, tmp_path):
    model, _ = _external_model(tmp_path)
    so = rt.SessionOptions()
    values = [rt.OrtValue.ortvalue_from_numpy(np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3)),
              rt.OrtValue.ortvalue_from_numpy(np.array([0.1, -0.2, 0.3], np.float32))]
    so.add_external_initializers(["w", "b"], values)
    y = rt.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    np.testing.assert_allclose(y, expected(), rtol=1e-6)


# RunOptions ---------------------------------------------------------------------------------
def test_run_options(rt):
    ro = rt.RunOptions()
    assert (ro.log_severity_level, ro.log_verbosity_level, ro.logid, ro.terminate) == (-1, 0, "", False)
    ro.logid = "tagged"
    ro.log_severity_level = 3
    ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    assert ro.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
    with pytest.raises(RuntimeError, match="does not have configuration with key"):
        ro.get_run_config_entry("nope")
    sess = session(rt)
    np.testing.assert_allclose(sess.run(None, {"x": X}, ro)[0], expected(), rtol=1e-6)
    ro.terminate = True
    with pytest.raises(_errors(rt).Fail, match="terminate flag"):
        sess.run(None, {"x": X}, ro)


# OrtValue, OrtDevice, OrtMemoryInfo, OrtArenaCfg --------------------------------------------
def test_ortvalue_from_numpy_shares_the_arrays_memory(rt):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    v = rt.OrtValue.ortvalue_from_numpy(x)
    assert v.data_ptr() == x.ctypes.data
    assert (v.shape(), v.data_type(), v.element_type(), v.device_name()) == ([2, 3], "tensor(float)", F, "cpu")
    assert (v.has_value(), v.is_tensor(), v.is_tensor_sequence(), v.tensor_size_in_bytes()) == (True, True, False, 24)
    assert np.shares_memory(v.numpy(), x)
    v.update_inplace(np.ones((2, 3), np.float32))
    assert x.sum() == 6
    np.testing.assert_array_equal(np.asarray(v), np.ones((2, 3)))


def test_ortvalue_from_a_strided_array_is_a_contiguous_copy(rt):
    x = np.arange(6, dtype=np.float64)[::2]
    v = rt.OrtValue.ortvalue_from_numpy(x)
    np.testing.assert_array_equal(v.numpy(), [0, 2, 4])
    assert v.data_type() == "tensor(double)"


@pytest.mark.parametrize("element_type, name", [(np.float32, "tensor(float)"), (I64, "tensor(int64)"),
                                                 (np.int8, "tensor(int8)"), (TensorProto.BFLOAT16, "tensor(bfloat16)")])
def test_ortvalue_from_shape_and_type(rt, element_type, name):
    v = rt.OrtValue.ortvalue_from_shape_and_type([2, 3], element_type)
    assert (v.shape(), v.data_type(), v.device_name()) == ([2, 3], name, "cpu")


def test_ortvalue_with_onnx_type(rt):
    v = rt.OrtValue.ortvalue_from_numpy_with_onnx_type(np.zeros(4, np.uint16), TensorProto.BFLOAT16)
    assert (v.data_type(), v.element_type(), v.shape()) == ("tensor(bfloat16)", TensorProto.BFLOAT16, [4])


def test_ortvalue_on_a_device_this_machine_lacks_is_a_runtime_error(rt):
    if "CUDAExecutionProvider" in rt.get_available_providers():
        pytest.skip("this machine has a usable GPU; the refusal needs one without")
    with pytest.raises(RuntimeError):
        rt.OrtValue.ortvalue_from_numpy(X, "cuda", 0)


def test_session_keywords(rt):
    sess = rt.InferenceSession(affine_model().SerializeToString(), providers=["CPUExecutionProvider"],
                               disabled_optimizers=["ConstantFolding"])
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], expected(), rtol=1e-6)
    if rt is optimized:
        with pytest.raises(TypeError, match="disabled_optimisers"):
            rt.InferenceSession(affine_model().SerializeToString(), disabled_optimisers=[])


def test_ortdevice_and_memory_info(rt):
    d = rt.OrtDevice.make("cpu", 0)
    assert (d.device_type(), d.device_id(), d.device_vendor_id(), d.device_mem_type()) == (0, 0, 0, 0)
    cuda = rt.OrtDevice.make("cuda", 0)
    assert (cuda.device_type(), cuda.device_vendor_id()) == (1, 0x10DE)
    with pytest.raises(Exception, match="tpu"):
        rt.OrtDevice.make("tpu", 0)
    sess = session(rt)
    (info,) = sess.get_input_memory_infos()
    assert (info.name, info.device_id, info.mem_type.name, info.allocator_type.name) == (
        "Cpu", 0, "DEFAULT", "ORT_ARENA_ALLOCATOR")
    assert len(sess.get_output_memory_infos()) == 1
    made = rt.OrtMemoryInfo("Cpu", rt.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, rt.OrtMemType.DEFAULT)
    assert (made.name, made.device_id) == ("Cpu", 0)


def test_arena_cfg(rt):
    cfg = rt.OrtArenaCfg({"max_mem": 16})
    assert (cfg.max_mem, cfg.arena_extend_strategy, cfg.initial_chunk_size_bytes) == (16, -1, -1)
    positional = rt.OrtArenaCfg(0, -1, -1, -1)
    positional.max_mem = 5
    assert positional.max_mem == 5
    with pytest.raises(Exception, match="max_memx"):
        rt.OrtArenaCfg({"max_memx": 16})


def sequence_model():
    nodes = [helper.make_node("SequenceConstruct", ["x", "x"], ["s"]), helper.make_node("Relu", ["x"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [2, 5])],
                  [helper.make_tensor_sequence_value_info("s", F, None), helper.make_tensor_value_info("y", F, [2, 5])])


def test_run_with_ort_values(rt):
    sess = session(rt, sequence_model())
    outputs = sess.run_with_ort_values(None, {"x": rt.OrtValue.ortvalue_from_numpy(X)})
    assert [type(o).__name__ for o in outputs] == ["OrtValue", "OrtValue"]
    seq, y = outputs
    assert (seq.is_tensor(), seq.is_tensor_sequence(), seq.has_value()) == (False, True, True)
    assert (seq.data_type(), seq.element_type()) == ("seq(tensor(float))", F)
    with pytest.raises(RuntimeError):
        seq.numpy()
    np.testing.assert_array_equal(y.numpy(), np.maximum(X, 0))
    (only_y,) = sess.run_with_ort_values(["y"], {"x": rt.OrtValue.ortvalue_from_numpy(X)})
    np.testing.assert_array_equal(only_y.numpy(), np.maximum(X, 0))
    with pytest.raises(_errors(rt).InvalidArgument):
        sess.run_with_ort_values(None, {"x": rt.OrtValue.ortvalue_from_numpy(X.astype(np.float64))})


# InferenceSession ---------------------------------------------------------------------------
def test_run_async_calls_back_on_another_thread(rt):
    sess = session(rt)
    done, calls = threading.Event(), []

    def callback(results, user_data, error):
        calls.append((results, user_data, error, threading.current_thread() is threading.main_thread()))
        done.set()

    sess.run_async(None, {"x": X}, callback, "data")
    assert done.wait(10)
    results, user_data, error, on_main = calls[0]
    np.testing.assert_allclose(results[0], expected(), rtol=1e-6)
    assert (user_data, error, on_main) == ("data", "", False)
    done.clear()
    sess.run_async(None, {"x": X.astype(np.float64)}, callback, "data")
    assert done.wait(10)
    assert calls[1][0] == [] and "tensor(float)" in calls[1][2]


def test_session_inspection(rt):
    so = rt.SessionOptions()
    sess = session(rt, options=so)
    assert sess.get_session_options() is so or rt is not optimized
    assert sess.get_provider_options() == {"CPUExecutionProvider": {}}
    assert sess.get_profiling_start_time_ns() == 0
    sess.set_providers(["CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    sess.disable_fallback()
    sess.enable_fallback()
    np.testing.assert_allclose(sess.run(None, {"x": X})[0], expected(), rtol=1e-6)


def test_profiling_start_time_and_file(rt, tmp_path):
    import json
    import time

    so = rt.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    before = time.time_ns()
    sess = session(rt, options=so)
    assert sess.get_session_options().enable_profiling is True
    start = sess.get_profiling_start_time_ns()  # onnxruntime's is the system clock's, in ns
    assert before <= start <= time.time_ns()
    sess.run(None, {"x": X})
    path = sess.end_profiling()
    assert path.startswith(str(tmp_path / "prof")) and path.endswith(".json")
    with open(path) as f:
        events = json.load(f)
    assert any(e.get("args", {}).get("op_name") == "Relu" for e in events)


def test_provider_graph_assignment_info(rt):
    with pytest.raises(_errors(rt).Fail, match="record_ep_graph_assignment_info"):
        session(rt).get_provider_graph_assignment_info()
    so = rt.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    subgraphs = session(rt, options=so).get_provider_graph_assignment_info()
    assert [s.ep_name for s in subgraphs] == ["CPUExecutionProvider"] * 3
    nodes = [(n.name, n.op_type, n.domain) for s in subgraphs for n in s.get_nodes()]
    assert nodes == [("mm", "MatMul", ""), ("add", "Add", ""), ("relu", "Relu", "")]


def ir3_model():
    """IR version 3, initializer w not listed as a graph input (onnxruntime loads it)."""
    w = numpy_helper.from_array(np.array([1, 2], np.float32), "w")
    return _model([helper.make_node("Add", ["x", "w"], ["y"])], [helper.make_tensor_value_info("x", F, [2])],
                  [helper.make_tensor_value_info("y", F, [2])], [w], opset=7, ir_version=3)


def test_ir3_model_with_unlisted_initializers_loads(rt):
    sess = session(rt, ir3_model())
    np.testing.assert_array_equal(sess.run(None, {"x": np.ones(2, np.float32)})[0], [2, 3])
    assert sess.get_overridable_initializers() == []


def test_overridable_initializers(rt):
    model = ir3_model()
    model.ir_version = 8  # from IR 4, an initializer listed as an input is overridable
    model.graph.input.append(helper.make_tensor_value_info("w", F, [2]))
    sess = session(rt, model)
    assert [(i.name, i.type, i.shape) for i in sess.get_overridable_initializers()] == [("w", "tensor(float)", [2])]
    y = sess.run(None, {"x": np.ones(2, np.float32), "w": np.array([5, 5], np.float32)})[0]
    np.testing.assert_array_equal(y, [6, 6])


def test_output_declared_without_shape_loads_with_the_inferred_shape(rt):
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, [2, 5])],
                   [helper.make_tensor_value_info("y", F, None)])
    sess = session(rt, model)
    (out,) = sess.get_outputs()
    assert (out.type, out.shape) == ("tensor(float)", [2, 5])
    np.testing.assert_array_equal(sess.run(None, {"x": X})[0], np.maximum(X, 0))


def test_nodearg_types_of_sequences_maps_and_optionals(rt):
    optional = helper.make_value_info("o", helper.make_optional_type_proto(helper.make_tensor_type_proto(F, [2, 5])))
    model = _model([helper.make_node("SequenceConstruct", ["x"], ["s"]), helper.make_node("Optional", ["x"], ["o"])],
                   [helper.make_tensor_value_info("x", F, [2, 5])],
                   [helper.make_tensor_sequence_value_info("s", F, None), optional])
    sess = session(rt, model)
    assert [(o.type, o.shape) for o in sess.get_outputs()] == [("seq(tensor(float))", []),
                                                              ("optional(tensor(float))", [2, 5])]


def test_nodearg_type_of_a_map():
    vi = helper.make_value_info("m", helper.make_map_type_proto(S, helper.make_tensor_type_proto(F, [])))
    assert optimized.NodeArg(vi).type == "map(string,tensor(float))"


def test_pass_through_output_is_a_new_array(rt):
    model = _model([helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Reshape", ["x", "shape"], ["r"])],
                   [helper.make_tensor_value_info("x", F, [2, 5])],
                   [helper.make_tensor_value_info("x", F, [2, 5]), helper.make_tensor_value_info("y", F, [2, 5]),
                    helper.make_tensor_value_info("r", F, [10]), helper.make_tensor_value_info("shape", I64, [1])],
                   [numpy_helper.from_array(np.array([10], np.int64), "shape")])
    x = X.copy()
    outputs = session(rt, model).run(None, {"x": x})
    assert not any(np.shares_memory(x, o) for o in outputs)
    assert all(o.flags.writeable for o in outputs)
    x[:] = 0
    np.testing.assert_array_equal(outputs[1], X)


def string_model():
    return _model([helper.make_node("Identity", ["x"], ["y"])], [helper.make_tensor_value_info("x", S, [2])],
                  [helper.make_tensor_value_info("y", S, [2])])


@pytest.mark.parametrize("feed", [["ab", "c"], np.array(["ab", "c"]), np.array(["ab", "c"], dtype=object),
                                  np.array([b"ab", b"cd"], dtype="V2")], ids=["list", "unicode", "object", "void"])
def test_string_feeds_are_converted(rt, feed):
    (y,) = session(rt, string_model()).run(None, {"x": feed})
    assert y.dtype == object and y.tolist() == ["ab", "c" if len(feed[1]) == 1 else "cd"]


def test_numeric_list_feed_is_converted_to_the_inputs_type(rt):
    np.testing.assert_allclose(session(rt).run(None, {"x": X.tolist()})[0], expected(), rtol=1e-6)


# errors -------------------------------------------------------------------------------------
def test_errors_have_onnxruntimes_classes(rt, tmp_path):
    errors, sess = _errors(rt), session(rt)
    with pytest.raises(errors.InvalidArgument):
        sess.run(None, {"x": X.astype(np.float64)})
    with pytest.raises(errors.InvalidArgument):
        sess.run(None, {"x": np.zeros((2, 4), np.float32)})
    with pytest.raises(errors.InvalidArgument):
        sess.run(None, {"x": np.zeros(5, np.float32)})
    with pytest.raises(errors.InvalidArgument):
        sess.run(["nope"], {"x": X})
    with pytest.raises(ValueError):  # a feed name onnxruntime does not know: plain ValueError
        sess.run(None, {"nope": X})
    with pytest.raises(errors.NoSuchFile):
        rt.InferenceSession(str(tmp_path / "missing.onnx"))
    with pytest.raises(errors.InvalidProtobuf):
        rt.InferenceSession(b"not a model")
    unknown_op = _model([helper.make_node("NoSuchOp", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, [2])],
                        [helper.make_tensor_value_info("y", F, [2])])
    with pytest.raises(errors.InvalidGraph):
        session(rt, unknown_op)
    reshape = _model([helper.make_node("Reshape", ["x", "s"], ["y"])],
                     [helper.make_tensor_value_info("x", F, [3]), helper.make_tensor_value_info("s", I64, [1])],
                     [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(errors.Fail):
        session(rt, reshape).run(None, {"x": np.ones(3, np.float32), "s": np.array([4])})


# IOBinding ----------------------------------------------------------------------------------
def test_iobinding_cpu_inputs_and_new_outputs(rt):
    sess = session(rt)
    binding = sess.io_binding()
    binding.bind_cpu_input("x", X)
    binding.bind_output("y")
    binding.synchronize_inputs()
    sess.run_with_iobinding(binding)
    binding.synchronize_outputs()
    (y,) = binding.get_outputs()
    assert type(y).__name__ == "OrtValue" and y.shape() == [2, 3]
    np.testing.assert_allclose(binding.copy_outputs_to_cpu()[0], expected(), rtol=1e-6)


@pytest.mark.parametrize("element_type", [np.float32, F], ids=["numpy-type", "onnx-type"])
def test_iobinding_pointer_input_and_preallocated_output(rt, element_type):
    sess = session(rt)
    binding = sess.io_binding()
    x = np.ascontiguousarray(X)
    binding.bind_input("x", "cpu", 0, element_type, list(x.shape), x.ctypes.data)
    result = np.zeros((2, 3), np.float32)
    binding.bind_output("y", "cpu", 0, element_type, list(result.shape), result.ctypes.data)
    sess.run_with_iobinding(binding)
    np.testing.assert_allclose(result, expected(), rtol=1e-6)
    with pytest.raises(ValueError, match="element_type"):
        binding.bind_output("y", "cpu", 0, None, None, result.ctypes.data)


def test_iobinding_unknown_names(rt):
    sess = session(rt)
    binding = sess.io_binding()
    with pytest.raises(RuntimeError, match="nope"):
        binding.bind_cpu_input("nope", X)
    with pytest.raises(RuntimeError, match="nope"):  # onnxruntime: when the run starts
        binding.bind_output("nope")
        binding.bind_cpu_input("x", X)
        sess.run_with_iobinding(binding)


def test_iobinding_ortvalues(rt):
    sess = session(rt)
    binding = sess.io_binding()
    binding.bind_ortvalue_input("x", rt.OrtValue.ortvalue_from_numpy(X))
    out = rt.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32)
    binding.bind_ortvalue_output("y", out)
    sess.run_with_iobinding(binding)
    np.testing.assert_allclose(out.numpy(), expected(), rtol=1e-6)
    binding.clear_binding_outputs()
    binding.bind_output("y")
    binding.clear_binding_inputs()
    binding.bind_cpu_input("x", 2 * X)
    sess.run_with_iobinding(binding)
    np.testing.assert_allclose(binding.copy_outputs_to_cpu()[0], expected(2 * X), rtol=1e-6)


# LoRA adapters ------------------------------------------------------------------------------
def lora_model():
    """y = x @ (w + a): the adapter parameter a is an input with a default (an overridable
    initializer), as LoRA deltas are."""
    w = numpy_helper.from_array(np.eye(3, dtype=np.float32), "w")
    a = numpy_helper.from_array(np.zeros((3, 3), np.float32), "a")
    nodes = [helper.make_node("Add", ["w", "a"], ["wa"]), helper.make_node("MatMul", ["x", "wa"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3]), helper.make_tensor_value_info("a", F, [3, 3])],
                  [helper.make_tensor_value_info("y", F, [2, 3])], [w, a])


def test_lora_adapter_from_onnxruntimes_file_format(tmp_path):
    ort = _onnxruntime()
    delta = np.arange(9, dtype=np.float32).reshape(3, 3)
    adapter_format = ort.AdapterFormat()
    adapter_format.set_adapter_version(1)
    adapter_format.set_model_version(1)
    adapter_format.set_parameters({"a": ort.OrtValue.ortvalue_from_numpy(delta)})
    path = str(tmp_path / "delta.onnx_adapter")
    adapter_format.export_adapter(path)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    results = []
    for rt in (optimized, ort):
        adapter = rt.LoraAdapter()
        adapter.Load(path)
        ro = rt.RunOptions()
        ro.add_active_adapter(adapter)
        sess = session(rt, lora_model())
        results.append((sess.run(None, {"x": x}, ro)[0], sess.run(None, {"x": x})[0]))
    (ours_on, ours_off), (theirs_on, theirs_off) = results
    np.testing.assert_allclose(ours_on, x @ (np.eye(3) + delta), rtol=1e-6)
    np.testing.assert_array_equal(ours_on, theirs_on)
    np.testing.assert_array_equal(ours_off, theirs_off)


def test_lora_adapter_errors(tmp_path):
    with pytest.raises(optimized.NoSuchFile):
        optimized.LoraAdapter().Load(str(tmp_path / "missing.onnx_adapter"))
    (tmp_path / "bad.onnx_adapter").write_bytes(b"\x08\0\0\0XXXX" + bytes(16))
    with pytest.raises(optimized.InvalidArgument, match="not an onnxruntime LoRA adapter"):
        optimized.LoraAdapter().Load(str(tmp_path / "bad.onnx_adapter"))
