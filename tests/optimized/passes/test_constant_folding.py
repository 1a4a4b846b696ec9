"""constant_folding: nodes whose inputs are all constants become initializers."""
import tracemalloc

import numpy as np
from onnx import helper, numpy_helper

from optimized.passes.constant_folding import fold_constants

from .helpers import assert_same_outputs, make_model, op_types


def initializer(model, name):
    return next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == name)


def test_folds_a_chain_of_constant_nodes():
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
            np.array([1.0, 2.0, 3.0], np.float32))),
        helper.make_node("Mul", ["c", "two"], ["c2"]),
        helper.make_node("Sqrt", ["c2"], ["s"]),  # sqrt([2, 4, 6])
        helper.make_node("Add", ["x", "s"], ["y"]),
    ]
    model = make_model(nodes, [("x", [3])], [("y", [3])], {"two": np.float32(2.0)})
    folded = fold_constants(model)
    assert op_types(folded) == {"Add": 1}
    np.testing.assert_allclose(initializer(folded, "s"), [2 ** 0.5, 2.0, 6 ** 0.5], rtol=1e-6)
    assert_same_outputs(model, folded)


def test_folds_shape_arithmetic_with_integer_constants():
    nodes = [helper.make_node("Concat", ["a", "b"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    model = make_model(nodes, [("x", [6])], [("y", [2, 3])],
                       {"a": np.array([2], np.int64), "b": np.array([3], np.int64)})
    folded = fold_constants(model)
    assert op_types(folded) == {"Reshape": 1}
    assert initializer(folded, "shape").tolist() == [2, 3]
    assert_same_outputs(model, folded)


def test_leaves_random_ops_and_graph_inputs_alone():
    nodes = [helper.make_node("RandomUniformLike", ["c"], ["r"], seed=1.0),
             helper.make_node("Mul", ["r", "x"], ["m"]),
             helper.make_node("Add", ["m", "c"], ["y"])]
    model = make_model(nodes, [("x", [2])], [("y", [2])], {"c": np.ones(2, np.float32)})
    assert op_types(fold_constants(model)) == op_types(model)


def test_leaves_overridable_initializers_alone():
    # from IR 4 an initializer that is also a graph input is a default the user may replace
    nodes = [helper.make_node("Neg", ["c"], ["n"]), helper.make_node("Add", ["x", "n"], ["y"])]
    model = make_model(nodes, [("x", [2]), ("c", [2])], [("y", [2])],
                       {"c": np.ones(2, np.float32)})
    assert op_types(fold_constants(model)) == op_types(model)


def test_skips_results_larger_than_the_limit():
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["big"]),
             helper.make_node("Add", ["x", "big"], ["y"])]
    model = make_model(nodes, [("x", [100])], [("y", [100])],
                       {"shape": np.array([100], np.int64)})
    assert op_types(fold_constants(model, max_elements=99)) == op_types(model)
    assert op_types(fold_constants(model, max_elements=100)) == {"Add": 1}


def test_a_fill_is_decided_by_its_elements_and_its_shape_vector_length():
    """A fill folds up to max_elements elements made, and only with a shape input of at most
    max_elements entries (the bound on the inputs of every node)."""
    def fill_add(sizes):
        nodes = [helper.make_node("ConstantOfShape", ["shape"], ["fill"],
                                  value=numpy_helper.from_array(np.array([1.5], np.float32))),
                 helper.make_node("Add", ["x", "fill"], ["y"])]
        return make_model(nodes, [("x", sizes)], [("y", sizes)],
                          {"shape": np.array(sizes, np.int64)})
    model = fill_add([3, 5, 7])
    assert op_types(fold_constants(model, max_elements=104)) == op_types(model)
    folded = fold_constants(model, max_elements=105)
    assert op_types(folded) == {"Add": 1}
    assert initializer(folded, "fill").tobytes() == np.full((3, 5, 7), 1.5, np.float32).tobytes()
    ones = fill_add([1] * 6)
    assert op_types(fold_constants(ones, max_elements=5)) == op_types(ones)
    assert op_types(fold_constants(ones, max_elements=6)) == {"Add": 1}


def test_a_large_result_is_left_without_being_made_or_copied():
    """light_vgg19's 25088 x 4096 fill peaked at three copies while it was made, copied into a
    TensorProto and dropped; a ConstantOfShape past the limit is not even made, and any other
    large result is dropped before it is copied (numpy's allocations are traced)."""
    import tracemalloc

    elements = 1024 * 4096  # 16 MiB of float32, one past the limit below
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["big"]),
             helper.make_node("Tile", ["row", "reps"], ["tiled"]),
             helper.make_node("Add", ["x", "big"], ["s"]),
             helper.make_node("Add", ["s", "tiled"], ["y"])]
    model = make_model(nodes, [("x", [1024, 4096])], [("y", [1024, 4096])],
                       {"shape": np.array([1024, 4096], np.int64),
                        "row": np.ones((1, 4096), np.float32),
                        "reps": np.array([1024, 1], np.int64)})
    tracemalloc.start()
    try:
        folded = fold_constants(model, max_elements=elements - 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert op_types(folded) == op_types(model)
    assert peak < 1.5 * elements * 4  # the Tile result once, no TensorProto copy of it


def test_leaves_a_node_that_would_fail_for_the_run_to_report():
    nodes = [helper.make_node("Reshape", ["c", "bad_shape"], ["r"]),
             helper.make_node("Add", ["x", "r"], ["y"])]
    model = make_model(nodes, [("x", [4])], [("y", [4])],
                       {"c": np.ones(4, np.float32), "bad_shape": np.array([3], np.int64)})
    assert op_types(fold_constants(model)) == op_types(model)


def test_does_not_turn_a_graph_output_into_an_initializer():
    nodes = [helper.make_node("Neg", ["c"], ["y"])]
    model = make_model(nodes, [], [("y", [2])], {"c": np.ones(2, np.float32)})
    assert op_types(fold_constants(model)) == {"Neg": 1}


def test_folding_into_an_ir3_model_moves_it_to_ir4():
    # before IR 4 an initializer had to be listed as a graph input too
    two = numpy_helper.from_array(np.array([2.0], np.float32))
    nodes = [helper.make_node("Constant", [], ["c"], value=two),
             helper.make_node("Mul", ["x", "c"], ["y"])]
    model = make_model(nodes, [("x", [2])], [("y", [2])], opset=7, ir_version=3)
    folded = fold_constants(model)
    assert op_types(folded) == {"Mul": 1} and folded.ir_version == 4
    assert_same_outputs(model, folded)


def test_a_failing_node_leaves_the_others_that_are_evaluated_with_it_folded():
    # the shape arithmetic whose inputs are all constants at once is evaluated as one model;
    # one bad Reshape among them stays a node, as it would node by node, and the rest fold
    nodes = [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(
                 np.array([2, 3], np.int64))),
             helper.make_node("Reshape", ["c", "bad_shape"], ["bad"]),
             helper.make_node("Concat", ["a", "b"], ["shape"], axis=0),
             helper.make_node("Mul", ["k", "one"], ["k1"]),  # reads a Constant node's output
             helper.make_node("Reshape", ["x", "shape"], ["xs"]),
             helper.make_node("Reshape", ["xs", "k1"], ["xk"]),
             helper.make_node("Add", ["x", "bad"], ["z"]),
             helper.make_node("Reshape", ["z", "shape"], ["y"]),
             helper.make_node("Add", ["xk", "y"], ["w"])]
    model = make_model(nodes, [("x", [6])], [("w", [2, 3])],
                       {"a": np.array([2], np.int64), "b": np.array([3], np.int64),
                        "one": np.array([1], np.int64), "c": np.ones(6, np.float32),
                        "bad_shape": np.array([4], np.int64)})
    folded = fold_constants(model)
    assert op_types(folded) == {"Reshape": 4, "Add": 2}
    assert initializer(folded, "shape").tolist() == [2, 3]
    assert initializer(folded, "k1").tolist() == [2, 3]
    assert "bad" not in {i.name for i in folded.graph.initializer}


def test_nodes_evaluated_together_do_not_hold_all_their_large_results_at_once():
    # Expand makes far more than its small inputs hold; eight of them in one wave, each past
    # the folding limit (so all stay nodes), must not all live at once as they would in one
    # model: at most about BATCHED_OUTPUT elements and the node being made
    side = 1024  # each result: 1M float32, 4 MiB
    nodes = [helper.make_node("Expand", [f"v{i}", "shape"], [f"e{i}"]) for i in range(8)]
    nodes += [helper.make_node("Add", ["x", f"e{i}"], [f"y{i}"]) for i in range(8)]
    inits = {f"v{i}": np.array([i], np.float32) for i in range(8)}
    inits["shape"] = np.array([side, side], np.int64)
    model = make_model(nodes, [("x", [side, side])], [(f"y{i}", [side, side]) for i in range(8)],
                       inits)
    tracemalloc.start()
    try:
        folded = fold_constants(model, max_elements=1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert op_types(folded) == {"Expand": 8, "Add": 8}
    one_result = side * side * 4
    assert peak < 4 * one_result, f"peak {peak / one_result:.1f} results"


def test_a_plain_fill_is_made_without_running_a_model(monkeypatch):
    import optimized.passes.constant_folding as folding

    evaluated = []
    real = folding._evaluate
    monkeypatch.setattr(folding, "_evaluate", lambda model, nodes, *rest, **kw: (
        evaluated.extend(n.op_type for n in nodes), real(model, nodes, *rest, **kw))[1])
    shape = numpy_helper.from_array(np.array([2, 3, 4], np.int64))
    nodes = [
        helper.make_node("Constant", [], ["shape"], value=shape),
        helper.make_node("ConstantOfShape", ["shape"], ["sevens"],
                         value=numpy_helper.from_array(np.array([7], np.int32))),
        helper.make_node("ConstantOfShape", ["shape"], ["zeros"]),  # float32 0 by default
        helper.make_node("Cast", ["sevens"], ["sevens_f"], to=1),
        helper.make_node("Add", ["sevens_f", "zeros"], ["c"]),
        helper.make_node("Add", ["x", "c"], ["y"]),
    ]
    model = make_model(nodes, [("x", [2, 3, 4])], [("y", [2, 3, 4])])
    folded = fold_constants(model)
    assert "ConstantOfShape" not in evaluated and "Cast" in evaluated
    sevens, zeros = initializer(folded, "sevens"), initializer(folded, "zeros")
    assert sevens.dtype == np.int32 and sevens.shape == (2, 3, 4) and np.all(sevens == 7)
    assert zeros.dtype == np.float32 and zeros.shape == (2, 3, 4) and not np.any(zeros)
    assert op_types(folded) == {"Add": 1}
    assert_same_outputs(model, folded)


def test_tensor_values_read_as_numpy_helper_reads_them():
    from optimized.passes._graph import tensor_values

    rng = np.random.default_rng(3)
    for dtype in (np.float32, np.float64, np.float16, np.int8, np.int16, np.int32, np.int64,
                  np.uint8, np.uint16, np.uint32, np.uint64, np.bool_):
        for shape in ((), (0,), (3,), (2, 3, 5)):
            array = (rng.standard_normal(shape) * 50).astype(dtype)
            tensor = numpy_helper.from_array(array, "t")
            values = tensor_values(tensor)
            assert values.dtype == array.dtype and values.shape == array.shape
            np.testing.assert_array_equal(values, numpy_helper.to_array(tensor))
            values.reshape(-1)[:0] = 0  # its own array, which a pass may write
    # data not in raw_data (helper.make_tensor's lists) goes through numpy_helper
    listed = helper.make_tensor("t", 7, [2], [5, -3])  # INT64 in int64_data
    np.testing.assert_array_equal(tensor_values(listed), [5, -3])


def test_a_small_fill_is_the_tensor_from_array_makes_of_the_filled_array():
    """Fills of up to SMALL_TENSOR elements are made from their value's bytes (no array): each
    plain type, each value, a non-square shape and shapes around the size, as from_array makes
    the filled array, byte for byte."""
    from reference.weights import SMALL_TENSOR

    cases = [(np.float32, 0.02), (np.float64, -1.5), (np.float16, 3.25), (np.int8, -7),
             (np.int16, 300), (np.int32, -70000), (np.int64, 1 << 40), (np.uint8, 200),
             (np.uint16, 60000), (np.uint32, 1 << 31), (np.uint64, 1 << 63), (np.bool_, True)]
    for shape in ([2, 3, 5], [SMALL_TENSOR], [SMALL_TENSOR + 1], [0, 4], []):
        nodes = [helper.make_node("ConstantOfShape", ["shape"], [f"fill{k}"],
                                  value=numpy_helper.from_array(np.array([v], t)))
                 for k, (t, v) in enumerate(cases)]
        nodes.append(helper.make_node("Add", ["x", "x"], ["y"]))
        model = make_model(nodes, [("x", [2])], [("y", [2])],
                           initializers={"shape": np.array(shape, np.int64)})
        folded = fold_constants(model)
        made = {t.name: t for t in folded.graph.initializer}
        for k, (t, v) in enumerate(cases):
            expected = numpy_helper.from_array(np.full(shape, v, t), f"fill{k}")
            assert made[f"fill{k}"].SerializeToString() == expected.SerializeToString(), (shape, t)
        assert op_types(folded) == {"Add": 1}


def test_constants_fed_to_folded_shape_ops_give_their_values():
    """Per-channel constants unsqueezed, transposed and reshaped (non-square, few elements, so
    evaluated together as the fed inputs of one model; and one past BATCHED, alone): the folded
    values are numpy's, and the constant read by two of them is left as it was."""
    from optimized.passes.constant_folding import BATCHED

    rng = np.random.default_rng(7)
    scale = rng.standard_normal(3).astype(np.float32)
    block = rng.standard_normal((2, 3, 5)).astype(np.float32)
    wide = rng.standard_normal((BATCHED + 3, 2)).astype(np.float32)
    nodes = [
        helper.make_node("Unsqueeze", ["scale", "axes"], ["scale_u"]),
        helper.make_node("Transpose", ["block"], ["block_t"], perm=[2, 0, 1]),
        helper.make_node("Reshape", ["block", "shape"], ["block_r"]),
        helper.make_node("Transpose", ["wide"], ["wide_t"]),
        helper.make_node("Mul", ["scale", "scale"], ["scale_sq"]),
        helper.make_node("Add", ["x", "x"], ["y"]),
    ]
    model = make_model(nodes, [("x", [2])], [("y", [2])], initializers={
        "scale": scale, "axes": np.array([1, 2], np.int64), "block": block,
        "shape": np.array([5, -1], np.int64), "wide": wide})
    folded = fold_constants(model)
    assert op_types(folded) == {"Add": 1}
    np.testing.assert_array_equal(initializer(folded, "scale_u"), scale.reshape(3, 1, 1))
    np.testing.assert_array_equal(initializer(folded, "block_t"), block.transpose(2, 0, 1))
    np.testing.assert_array_equal(initializer(folded, "block_r"), block.reshape(5, 6))
    np.testing.assert_array_equal(initializer(folded, "wide_t"), wide.T)
    np.testing.assert_array_equal(initializer(folded, "scale_sq"), scale * scale)
    np.testing.assert_array_equal(initializer(folded, "scale"), scale)
