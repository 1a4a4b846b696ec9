"""The packed-GEMM and oneDNN-convolution caches key a weight by its array object, taking a
read-only C-contiguous array as a constant.  A read-only view of memory the caller still
writes is no constant: fed again after its base changed, it must give the new result."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import optimized as ort
from optimized import kernels


def _session(nodes, inputs):
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(model.SerializeToString())


def _read_only_view(base):
    view = base[:]
    view.flags.writeable = False
    return view


def _runs_follow_the_base(session, feeds, weight_name, base, reference):
    view = _read_only_view(base)
    for fill in (1.0, 2.0, -3.0):
        base[:] = fill
        got = session.run(None, {**feeds, weight_name: view})[0]
        np.testing.assert_allclose(got, reference(view), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
def test_read_only_view_of_a_written_base_is_packed_anew(op):
    rows, k, n = 8, 5, 7  # 8 rows: the packed GEMM's range (above the GEMV's)
    session = _session([helper.make_node(op, ["A", "B"], ["Y"])],
                       [helper.make_tensor_value_info("A", TensorProto.FLOAT, [rows, k]),
                        helper.make_tensor_value_info("B", TensorProto.FLOAT, [k, n])])
    a = np.arange(rows * k, dtype=np.float32).reshape(rows, k) / 10
    _runs_follow_the_base(session, {"A": a}, "B", np.zeros((k, n), np.float32),
                          lambda b: a @ b)


@pytest.mark.skipif(kernels.onednn_unavailable() is not None,
                    reason="oneDNN is not built into this extension: its cache is not used")
def test_read_only_view_of_a_written_base_convolves_anew():
    x = np.linspace(-1, 1, 3 * 9 * 7, dtype=np.float32).reshape(1, 3, 9, 7)
    session = _session([helper.make_node("Conv", ["X", "W"], ["Y"], pads=[1, 1, 1, 1])],
                       [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 9, 7]),
                        helper.make_tensor_value_info("W", TensorProto.FLOAT, [5, 3, 3, 3])])

    def reference(w):  # all weights equal: each output is w * (sum of the 3x3x3 window)
        padded = np.pad(x[0], ((0, 0), (1, 1), (1, 1)))
        sums = np.array([[padded[:, i:i + 3, j:j + 3].sum() for j in range(7)]
                         for i in range(9)], np.float32)
        return np.broadcast_to(w.reshape(-1)[0] * sums, (1, 5, 9, 7))

    _runs_follow_the_base(session, {"X": x}, "W", np.zeros((5, 3, 3, 3), np.float32),
                          reference)


def test_initializers_written_as_float_data_stay_constant_weights(monkeypatch):
    """An initializer held in float_data (not raw bytes) is a constant all the same: the
    session's copy of it is read-only down to its memory, so the packed GEMM takes it."""
    rows, k, n = 8, 64, 48  # more than a small tensor's elements: the weight store keeps it
    w = np.linspace(-1, 1, k * n, dtype=np.float32).reshape(k, n)
    weight = helper.make_tensor("W", TensorProto.FLOAT, [k, n], w.reshape(-1).tolist())
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "W"], ["Y"])], "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    packed = []
    real = kernels.gemm_packed
    monkeypatch.setattr(kernels, "gemm_packed", lambda *a, **kw: packed.append(1) or real(*a, **kw))
    a = np.linspace(0, 1, rows * k, dtype=np.float32).reshape(rows, k)
    got = ort.InferenceSession(model.SerializeToString()).run(None, {"A": a})[0]
    np.testing.assert_allclose(got, a @ w, rtol=1e-5, atol=1e-5)
    assert packed  # not the BLAS: the weight counts as a constant


def test_initializers_read_from_a_model_file_stay_constant_weights(monkeypatch, tmp_path):
    """A model given by path has its large raw_data initializers read straight into the weight
    store's buffers (reference/weights.read_model_file): those are read-only down to their
    memory too, so the packed GEMM takes them (it fell back to the BLAS for every MatMul of a
    decoder loaded from a file, and the step table ran them all as Python steps)."""
    rows, k, n = 8, 64, 48
    w = np.linspace(-1, 1, k * n, dtype=np.float32).reshape(k, n)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "W"], ["Y"])], "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "W")])
    path = tmp_path / "matmul.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    packed = []
    real = kernels.gemm_packed
    monkeypatch.setattr(kernels, "gemm_packed", lambda *a, **kw: packed.append(1) or real(*a, **kw))
    a = np.linspace(0, 1, rows * k, dtype=np.float32).reshape(rows, k)
    got = ort.InferenceSession(str(path)).run(None, {"A": a})[0]
    np.testing.assert_allclose(got, a @ w, rtol=1e-5, atol=1e-5)
    assert packed  # not the BLAS: the weight counts as a constant


def test_a_decoder_loaded_from_its_file_runs_in_one_step_table(monkeypatch, tmp_path):
    """The tiny Llama-style decoder given by path: after the recording and compiling runs,
    every step of its prompt runs in C, its MatMuls as packed GEMMs (with weights that were
    not constants they ran as Python steps through the BLAS)."""
    from benchmarks import decoders
    from optimized.plan import C

    built = []
    real_step = kernels.gemm_packed_step
    monkeypatch.setattr(kernels, "gemm_packed_step",
                        lambda *a, **kw: built.append("gemm_packed_step") or real_step(*a, **kw))
    model = decoders.build_llama(decoders.SIZES["tiny"])
    path = tmp_path / "llama.onnx"
    onnx.save(model, path)
    tokens = decoders.random_tokens(model, (1, 12), seed=3)
    feeds = {**decoders.step_feeds(tokens, 0), **decoders.empty_past(model)}
    session = ort.InferenceSession(str(path))
    feeds = {i.name: feeds[i.name] for i in session.get_inputs()}
    first = session.run(None, feeds)
    for _ in range(2):
        last = session.run(None, feeds)
    for a, b in zip(first, last):
        np.testing.assert_array_equal(a, b)
    (compiled,) = [p for p in session._plan._programs.values() if p is not None]
    assert [op[0] for op in compiled.ops] == [C]
    weights = {t.name for t in model.graph.initializer}
    over_weights = sum(n.op_type == "MatMul" and n.input[1] in weights for n in model.graph.node)
    assert over_weights and built.count("gemm_packed_step") >= over_weights  # each described
