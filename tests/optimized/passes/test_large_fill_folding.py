"""Large ConstantOfShape fills made once into a session's weight store (light_vgg19's Gemm
weights are such fills: made on every run before)."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import optimized
from optimized.passes import optimize
from optimized.passes.large_fill_folding import MIN_FILL_ELEMENTS, fold_large_fills
from reference import ReferenceEvaluator
from reference.weights import WeightStore, is_stub, tensor_array

from .helpers import make_model, op_types

# rows x cols just past the size constant folding leaves to this pass; rows != cols so that a
# transposed fill shows
ROWS, COLS = 1024, MIN_FILL_ELEMENTS // 1024 + 3


def fill_matmul(value=None, shape=(ROWS, COLS), fill_is_output=False):
    """y = x @ ConstantOfShape(shape), x of shape (3, rows)."""
    dtype = np.int64 if isinstance(value, int) else np.float32
    attrs = {} if value is None else {"value": numpy_helper.from_array(np.asarray([value], dtype))}
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["w"], **attrs),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    outputs = [("y", [3, shape[1]])] + ([("w", list(shape))] if fill_is_output else [])
    return make_model(nodes, [("x", [3, shape[0]])], outputs,
                      {"shape": np.asarray(shape, np.int64)})


def test_fill_becomes_a_stored_initializer():
    store = WeightStore()
    folded = fold_large_fills(fill_matmul(0.25), store)
    assert op_types(folded) == {"MatMul": 1}
    (w,) = [t for t in folded.graph.initializer if t.name == "w"]
    assert is_stub(w) and list(w.dims) == [ROWS, COLS] and w.data_type == TensorProto.FLOAT
    value = tensor_array(w)
    assert value.shape == (ROWS, COLS) and value.dtype == np.float32
    assert np.all(value == np.float32(0.25)) and not value.flags.writeable


def test_default_value_is_float_zero_and_integer_values_keep_their_type():
    store = WeightStore()
    default = fold_large_fills(fill_matmul(None), store)
    (w,) = [t for t in default.graph.initializer if t.name == "w"]
    assert w.data_type == TensorProto.FLOAT and not np.any(tensor_array(w))
    model = fill_matmul(7)
    model.graph.node[1].op_type = "Identity"  # an int64 fill read by a type-agnostic op
    del model.graph.node[1].input[0]
    model.graph.node[1].input[0] = "w"
    folded = fold_large_fills(model, store)
    (w,) = [t for t in folded.graph.initializer if t.name == "w"]
    assert w.data_type == TensorProto.INT64
    assert tensor_array(w).dtype == np.int64 and np.all(tensor_array(w) == 7)


def test_without_a_store_small_or_output_fills_stay_nodes():
    model = fill_matmul(0.5)
    assert fold_large_fills(model, None) is model
    small = fill_matmul(0.5, shape=(16, 8))
    assert op_types(fold_large_fills(small, WeightStore())) == op_types(small)
    out = fill_matmul(0.5, fill_is_output=True)
    assert op_types(fold_large_fills(out, WeightStore()))["ConstantOfShape"] == 1


# negative: the run names the bad shape; past 1 GiB: a saved optimized model would pass
# protobuf's 2 GiB limit (and the pass must decline before allocating it)
@pytest.mark.parametrize("shape", [(-1, 4), (2, 3, 4), (1 << 15, 1 << 14)],
                         ids=["negative", "small-3d", "past-1-GiB"])
def test_fills_the_pass_leaves_stay_nodes(shape):
    model = fill_matmul(0.5)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.asarray(shape, np.int64),
                                                                "shape"))
    assert op_types(fold_large_fills(model, WeightStore()))["ConstantOfShape"] == 1


def test_optimize_folds_only_with_a_store():
    assert op_types(optimize(fill_matmul(0.5), 1))["ConstantOfShape"] == 1
    assert "ConstantOfShape" not in op_types(optimize(fill_matmul(0.5), 1, WeightStore()))


@pytest.mark.parametrize("threads", [1, 2])
def test_session_matches_the_reference(threads):
    model = fill_matmul(0.125)
    x = np.random.default_rng(0).standard_normal((3, ROWS)).astype(np.float32)
    options = optimized.SessionOptions()
    options.intra_op_num_threads = threads
    session = optimized.InferenceSession(model.SerializeToString(), options)
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    for _ in range(2):  # the second run goes through the compiled plan
        (y,) = session.run(None, {"x": x})
        # a float32 product over ROWS terms, blocked differently by our GEMM and NumPy's BLAS
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


def test_a_4_bit_fill_stays_a_node_and_matches_the_reference():
    # a store keeps 4-bit tensors as packed bytes (two codes a byte), not as one code a byte
    value = helper.make_tensor("value", TensorProto.INT4, [1], [3])
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["w"], value=value),
             helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["wf", "x"], ["y"])]
    model = make_model(nodes, [("x", [1])], [("y", [ROWS, COLS])],
                       {"shape": np.asarray([ROWS, COLS], np.int64)}, opset=21)
    assert op_types(fold_large_fills(model, WeightStore()))["ConstantOfShape"] == 1
    x = np.ones(1, np.float32)
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    (y,) = optimized.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("data_type", [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64,
                                       TensorProto.INT32, TensorProto.FLOAT16])
@pytest.mark.parametrize("raw", [True, False])
@pytest.mark.parametrize("dims", [[], [1], [1, 1], [2]])
def test_constant_fill_reads_value_and_shape_as_numpy_helper_does(data_type, raw, dims):
    """constant_fill's readings from raw bytes and from typed fields (a one-element value read
    straight from its field, a shape from its raw bytes) against numpy_helper's; a value of
    more than one element is no plain fill."""
    from optimized.passes._graph import Constants
    from optimized.passes.large_fill_folding import constant_fill

    dtype = helper.tensor_dtype_to_np_dtype(data_type)
    values = np.array([-2.75, 3.5][:max(1, int(np.prod(dims)))], dtype).reshape(dims)
    value = helper.make_tensor("v", data_type, dims, values.tobytes() if raw else
                               values.reshape(-1).tolist(), raw=raw)
    sizes = [3, 1, 5, 2]
    shape = helper.make_tensor("shape", TensorProto.INT64, [4],
                               np.array(sizes, np.int64).tobytes() if raw else sizes, raw=raw)
    node = helper.make_node("ConstantOfShape", ["shape"], ["y"], value=value)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", data_type,
                                                                              sizes)], [shape])
    fill = constant_fill(node, Constants(graph))
    if values.size != 1:
        assert fill is None
        return
    assert fill[0] == numpy_helper.to_array(shape).tolist() == sizes
    expected = numpy_helper.to_array(value).reshape(())
    assert fill[1].dtype == expected.dtype and fill[1].shape == ()
    assert fill[1].tobytes() == expected.tobytes() and fill[2] == data_type
