"""reference/weights.py: large initializers held once, as arrays in a WeightStore, with stubs in
the model; a model file read straight into those arrays."""
from __future__ import annotations

import gc
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from reference.errors import InvalidModelError
from reference.evaluator import ReferenceEvaluator, tensor_value
from reference.weights import (
    WeightStore,
    attached,
    checkable,
    copy_without_weights,
    detach_initializers,
    is_stub,
    read_model_file,
    tensor_array,
)

RNG = np.random.default_rng(7)


def weight_model() -> onnx.ModelProto:
    """y = (x @ w) + b, with initializers of every kind the reader meets: large raw float32 and
    bfloat16, a large one in float_data (not raw), small int64, a large int4 (packed, stays in
    the model), a string, plus a Constant node and a subgraph initializer."""
    w = RNG.standard_normal((48, 40)).astype(np.float32)  # 1920 elements: detached
    b = RNG.standard_normal(40).astype(np.float32)  # small: stays
    float_data = helper.make_tensor("fd", TensorProto.FLOAT, [33, 37],
                                    RNG.standard_normal(33 * 37).astype(np.float32).tolist())
    bf16 = numpy_helper.from_array(RNG.standard_normal((30, 50)).astype(ml_dtypes.bfloat16), "bf")
    int4 = helper.make_tensor("i4", TensorProto.INT4, [2000], RNG.integers(-8, 8, 2000).tolist())
    strings = numpy_helper.from_array(np.array(["a", "bc"], dtype=object), "s")
    then = helper.make_graph([helper.make_node("Identity", ["inner"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [40, 50])],
                             [numpy_helper.from_array(np.ones((40, 50), np.float32), "inner")])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["y"]),
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(
            np.arange(2000, dtype=np.float32), "kv")),
        helper.make_node("If", ["cond"], ["z"], then_branch=then, else_branch=then),
    ]
    graph = helper.make_graph(
        nodes, "weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 48]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 40]),
         helper.make_tensor_value_info("k", TensorProto.FLOAT, [2000]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [40, 50])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"), float_data, bf16, int4,
         strings])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "weights.onnx"
    onnx.save(weight_model(), path)
    return str(path)


def test_a_file_read_into_the_store_is_the_file_model_with_stubs(model_path):
    store = WeightStore()
    model = read_model_file(model_path, store)
    stubs = {t.name for t in model.graph.initializer if is_stub(t)}
    assert stubs == {"w", "bf"}  # raw and large; float_data, int4, small and strings stay
    assert attached(model).SerializeToString() == onnx.load(model_path).SerializeToString()
    expected = onnx.load(model_path)
    for got, want in zip(model.graph.initializer, expected.graph.initializer):
        value, truth = tensor_array(got), numpy_helper.to_array(want)
        assert value.dtype == truth.dtype and value.shape == truth.shape
        assert np.array_equal(value.view(np.uint8), truth.view(np.uint8)) if value.dtype != object \
            else list(value) == list(truth)


def test_stub_arrays_are_shared_by_model_copies_and_read_only(model_path):
    store = WeightStore()
    model = read_model_file(model_path, store)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    [stub] = [t for t in copy.graph.initializer if t.name == "w"]
    assert len(stub.SerializeToString()) < 200  # the copy carries no weight bytes
    assert tensor_array(stub) is store.arrays[next(iter(store.arrays))]
    assert tensor_value(stub) is tensor_array(stub)  # the evaluator reads the same array
    assert not tensor_array(stub).flags.writeable


def test_file_arrays_start_on_a_cache_line_and_are_read_only_to_their_memory(model_path):
    """Each array read from the file starts on a 64-byte line (the QDQ pass streams whole
    lines into released ones) and is read-only down to the array that owns its memory, as the
    optimized kernels' weight caches require of a constant."""
    store = WeightStore()
    read_model_file(model_path, store)
    assert store.arrays
    for array in store.arrays.values():
        assert array.ctypes.data % 64 == 0
        root = array
        while isinstance(root.base, np.ndarray):
            assert not root.flags.writeable
            root = root.base
        assert root.flags.owndata and not root.flags.writeable


def test_the_evaluator_runs_a_model_with_stubs(model_path):
    store = WeightStore()
    model = read_model_file(model_path, store)
    x = RNG.standard_normal((3, 48)).astype(np.float32)
    feeds = {"x": x, "cond": np.array(True)}
    got = ReferenceEvaluator(model, check=False).run(None, feeds)
    want = ReferenceEvaluator(onnx.load(model_path)).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_a_truncated_file_is_left_to_onnx_load(model_path, tmp_path):
    data = Path(model_path).read_bytes()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) - 100])
    store = WeightStore()
    assert read_model_file(str(cut), store) is None
    assert store.arrays == {}


def test_a_stub_whose_store_is_gone_names_the_tensor(model_path):
    store = WeightStore()
    model = read_model_file(model_path, store)
    del store
    gc.collect()
    [stub] = [t for t in model.graph.initializer if t.name == "w"]
    with pytest.raises(InvalidModelError, match="'w' keeps its data in a session's weight store"):
        tensor_array(stub)


def test_copy_without_weights_leaves_the_callers_model_alone():
    model = weight_model()
    before = model.SerializeToString()
    store = WeightStore()
    copy = copy_without_weights(model, store)
    assert model.SerializeToString() == before
    assert {t.name for t in copy.graph.initializer if is_stub(t)} == {"w", "bf", "fd"}
    restored = attached(copy)  # fd comes back as raw_data, with the same values
    for got, want in zip(restored.graph.initializer, model.graph.initializer):
        if want.data_type != TensorProto.STRING:
            assert got.name == want.name
            assert numpy_helper.to_array(got).tobytes() == numpy_helper.to_array(want).tobytes()


def test_detach_keeps_a_tensor_whose_data_does_not_fit_its_shape():
    model = weight_model()
    [w] = [t for t in model.graph.initializer if t.name == "w"]
    w.raw_data = w.raw_data[:-4]
    detach_initializers(model, WeightStore())
    assert not is_stub(w)  # left for the checker, which names the size
    with pytest.raises(onnx.checker.ValidationError, match="raw_data size"):
        onnx.checker.check_model(checkable(model))


def test_detach_reads_float_data_too_and_checkable_passes_the_checker():
    model = weight_model()
    store = WeightStore()
    detach_initializers(model, store)
    assert {t.name for t in model.graph.initializer if is_stub(t)} == {"w", "bf", "fd"}
    onnx.checker.check_model(checkable(model))
    assert store.nbytes == (48 * 40 + 33 * 37) * 4 + 30 * 50 * 2


def test_retain_drops_arrays_the_model_no_longer_names():
    model = weight_model()
    store = WeightStore()
    detach_initializers(model, store)
    kept = [t for t in model.graph.initializer if t.name != "fd"]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    store.retain(model)
    assert store.nbytes == 48 * 40 * 4 + 30 * 50 * 2


def test_tensor_array_reads_raw_data_as_to_array_does():
    """Plain numeric types in raw_data are read without to_array: same values, type, shape and
    read-only view, for non-square, 0-d and empty shapes; a byte count that does not match the
    shape still raises to_array's error."""
    rng = np.random.default_rng(11)
    for dtype in (np.float32, np.float64, np.float16, np.int8, np.int16, np.int32, np.int64,
                  np.uint8, np.uint16, np.uint32, np.uint64, np.bool_):
        for shape in ((), (0, 3), (2, 3, 5)):
            array = (rng.standard_normal(shape) * 50).astype(dtype)
            tensor = numpy_helper.from_array(array, "t")
            expected = numpy_helper.to_array(tensor)
            values = tensor_array(tensor)
            assert values.dtype == expected.dtype and values.shape == expected.shape
            assert values.flags.writeable == expected.flags.writeable
            np.testing.assert_array_equal(values, array)
    short = numpy_helper.from_array(np.zeros((2, 3), np.float32), "short")
    short.raw_data = short.raw_data[:-4]
    with pytest.raises(ValueError):
        numpy_helper.to_array(short)
    with pytest.raises(ValueError):
        tensor_array(short)
