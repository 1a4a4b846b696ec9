"""The plan's step table (optimized/plan.py CompiledRun over csrc/plan.c): from the second run
of an input signature on, consecutive fast steps run in one C call.  Its results must be the
Python plan's, bit for bit (the same kernels with the same arguments), whatever the shapes,
thread count, and mix of C and reference-op steps; outputs never share memory with the plan's
buffers; a recorded shape that stops holding sends the run back to Python."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import optimized
from optimized import kernels
from optimized.cpu import C_STEPS, KERNELS
from optimized.plan import PY, C, Plan
from reference.errors import NodeError
from tests.optimized.plan_models import make_model

F = TensorProto.FLOAT


def tensor(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def plans(model):
    """(the plan with its step table, the plan that runs every step in Python)."""
    return Plan(model, KERNELS, c_steps=C_STEPS), Plan(model, KERNELS)


def program(plan, feeds):
    key = tuple((n, v.shape, v.dtype) for n, v in feeds.items())
    return plan._programs.get(key)


def run_both(model, feeds, runs=3):
    """Each plan's outputs of the last of `runs` runs (the first records, the second compiles,
    the third runs the step table), and the compiled program."""
    in_c, in_python = plans(model)
    for _ in range(runs):
        got = in_c.run(dict(feeds))
    want = in_python.run(dict(feeds))
    return got, want, program(in_c, feeds)


def assert_identical(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
        assert g.tobytes() == w.tobytes()  # bit for bit, signed zeros and NaN payloads too


def chain_model(length=40, width=24):
    rng = np.random.default_rng(3)
    nodes, inits, x = [], [], "x"
    for i in range(length):
        op = ["Add", "Mul", "Relu", "Sigmoid", "Sub", "Tanh", "Div"][i % 7]
        if op in ("Add", "Mul", "Sub", "Div"):
            w = f"w{i}"
            inits.append((w, (rng.standard_normal((1, width)) + 2).astype(np.float32)))
            nodes.append(helper.make_node(op, [x, w], [f"v{i}"]))
        else:
            nodes.append(helper.make_node(op, [x], [f"v{i}"]))
        x = f"v{i}"
    nodes[-1].output[0] = "y"
    return make_model(nodes, [tensor("x", [3, width])], [tensor("y", [3, width])], inits)


def test_chain_runs_in_one_c_call_and_matches_the_python_plan():
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 24)).astype(np.float32)}
    got, want, compiled = run_both(chain_model(), feeds)
    assert_identical(got, want)
    assert [op[0] for op in compiled.ops] == [C]
    assert compiled.table.count == 40


def test_first_sighting_runs_in_python_and_the_second_compiles():
    in_c, _ = plans(chain_model())
    feeds = {"x": np.ones((3, 24), np.float32)}
    in_c.run(feeds)
    assert program(in_c, feeds) is None
    in_c.run(feeds)
    assert program(in_c, feeds) is not None


def mixed_model():
    """Fast steps (MatMul, Add, Softmax, LayerNormalization, Relu), views (Reshape,
    Transpose, Gather) and reference-op steps (Neg, Exp, Slice, Cast) in between."""
    rng = np.random.default_rng(5)
    inits = [("w", rng.standard_normal((7, 12)).astype(np.float32)),
             ("b", rng.standard_normal((12,)).astype(np.float32)),
             ("scale", rng.standard_normal((12,)).astype(np.float32) + 1),
             ("shape", np.array([2, 3, 4, 3], np.int64)),
             ("rows", np.array([2, 0, 1, -1], np.int64)),
             ("starts", np.array([1], np.int64)), ("ends", np.array([3], np.int64)),
             ("axes", np.array([1], np.int64))]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Neg", ["a"], ["n"]),                      # reference op
        helper.make_node("Softmax", ["n"], ["s"], axis=-1),
        helper.make_node("Exp", ["s"], ["e"]),                      # reference op
        helper.make_node("LayerNormalization", ["e", "scale"], ["ln"], axis=-1, epsilon=1e-5),
        helper.make_node("Reshape", ["ln", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 3, 1, 2]),
        helper.make_node("Relu", ["t"], ["u"]),
        helper.make_node("Gather", ["u", "rows"], ["g"], axis=2),
        helper.make_node("Slice", ["g", "starts", "ends", "axes"], ["sl"]),  # reference op
        helper.make_node("Sigmoid", ["sl"], ["y"]),
        helper.make_node("Cast", ["u"], ["z"], to=TensorProto.DOUBLE),      # reference op
    ]
    return make_model(nodes, [tensor("x", [6, 7])],
                      [tensor("y", None), tensor("z", None)], inits)


def test_reference_steps_between_fast_steps():
    feeds = {"x": np.random.default_rng(1).standard_normal((6, 7)).astype(np.float32)}
    got, want, compiled = run_both(mixed_model(), feeds)
    assert_identical(got, want)
    kinds = [op[0] for op in compiled.ops]
    assert C in kinds and PY in kinds
    assert sum(op[2] - op[1] for op in compiled.ops if op[0] == C) >= 7


def test_each_signature_is_compiled_again_on_its_own_shapes():
    # non-square everywhere, so a transposed or swapped axis shows
    x, y = "x", "y"
    nodes = [helper.make_node("Transpose", [x], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Mul", ["t", "c"], ["m"]),
             helper.make_node("Softmax", ["m"], ["s"], axis=-1),
             helper.make_node("Add", ["s", "t"], [y])]
    model = make_model(nodes, [tensor(x, ["N", 5, "H", "W"])], [tensor(y, None)],
                       [("c", np.arange(1, 6, dtype=np.float32))])
    in_c, in_python = plans(model)
    rng = np.random.default_rng(2)
    shapes = [(2, 5, 3, 7), (3, 5, 4, 6), (1, 5, 6, 2)]
    for shape in shapes + shapes:
        feeds = {x: rng.standard_normal(shape).astype(np.float32)}
        for _ in range(3):
            got = in_c.run(dict(feeds))
        assert_identical(got, in_python.run(dict(feeds)))
        assert program(in_c, feeds) is not None
    assert len(in_c._programs) == 3


def test_feeds_that_are_views():
    # strided, transposed and negatively strided feeds: C reads a contiguous copy
    base = np.random.default_rng(13).standard_normal((12, 14)).astype(np.float32)
    in_c, in_python = plans(mixed_model())
    for view in (base[::2, 3:10], base[:7, :6].T, base[5::-1, 2:9]):
        assert view.shape == (6, 7) and not view.flags.c_contiguous
        for _ in range(3):
            got = in_c.run({"x": view})
        assert_identical(got, in_python.run({"x": np.ascontiguousarray(view)}))
    assert len(in_c._programs) == 1


def test_same_results_at_one_and_two_threads(threads):
    feeds = {"x": np.random.default_rng(4).standard_normal((6, 7)).astype(np.float32)}
    results = []
    for n in (1, 2):
        kernels.set_num_threads(n)
        got, want, _ = run_both(mixed_model(), feeds)
        assert_identical(got, want)
        results.append(got)
    for one, two in zip(*results):
        np.testing.assert_allclose(one, two, rtol=1e-6, atol=1e-6)


def test_large_values_split_across_threads_match_the_python_plan(threads):
    # big enough that the kernels split the work across both threads
    rng = np.random.default_rng(8)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Sigmoid", ["m"], ["s"]),
             helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    model = make_model(nodes, [tensor("x", [300, 200])], [tensor("y", None)],
                       [("w", rng.standard_normal((200, 260)).astype(np.float32))])
    feeds = {"x": rng.standard_normal((300, 200)).astype(np.float32)}
    kernels.set_num_threads(2)
    got, want, compiled = run_both(model, feeds)
    assert_identical(got, want)
    assert [op[0] for op in compiled.ops] == [C]


def test_outputs_are_never_overwritten_by_the_next_run():
    # y is a C result, z and z2 a reference op's views (Split) of a value C wrote into the arena
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Sigmoid", ["r"], ["y"]),
             helper.make_node("Tanh", ["r"], ["t"]),
             helper.make_node("Split", ["t", "split"], ["z", "z2"], axis=0)]
    model = make_model(nodes, [tensor("x", [4, 6])],
                       [tensor("y", None), tensor("z", None), tensor("z2", None)],
                       [("split", np.array([1, 3], np.int64))])
    in_c, in_python = plans(model)
    rng = np.random.default_rng(6)
    first_feeds = {"x": rng.standard_normal((4, 6)).astype(np.float32)}
    for _ in range(3):
        first = in_c.run(dict(first_feeds))
    kept = [v.copy() for v in first]
    compiled = program(in_c, first_feeds)
    second = in_c.run({"x": rng.standard_normal((4, 6)).astype(np.float32)})
    for before, now in zip(kept, first):
        np.testing.assert_array_equal(before, now)
    for value in first + second:
        assert not np.may_share_memory(value, compiled.arena)
    assert not any(np.may_share_memory(a, b) for a in first for b in second)
    assert_identical(first, in_python.run(dict(first_feeds)))


def test_session_outputs_after_the_step_table_runs():
    model = chain_model(length=12)
    options = optimized.SessionOptions()
    options.graph_optimization_level = optimized.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = optimized.InferenceSession(model.SerializeToString(), options)
    rng = np.random.default_rng(7)
    runs = [rng.standard_normal((3, 24)).astype(np.float32) for _ in range(4)]
    results = [session.run(None, {"x": x})[0] for x in runs]
    expected = [Plan(model, KERNELS).run({"x": x})[0] for x in runs]
    for got, want in zip(results, expected):
        assert_identical([got], [want])
    assert len(session._plan._programs) == 1


def test_a_shape_that_changes_within_a_signature_goes_back_to_python():
    # NonZero's result has a shape of its own in each run: the Transpose that C runs on it
    # was laid out for the recorded one
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["y"], perm=[1, 0])]
    model = make_model(nodes, [tensor("x", [3, 4])], [tensor("y", None, TensorProto.INT64)])
    in_c, in_python = plans(model)
    x = np.zeros((3, 4), np.float32)
    x[0, 1] = x[2, 3] = 1.0
    for _ in range(2):
        in_c.run({"x": x})
    compiled = program(in_c, {"x": x})
    assert [op[0] for op in compiled.ops] == [PY, C]
    other = np.ones((3, 4), np.float32)
    assert_identical(in_c.run({"x": other}), in_python.run({"x": other}))
    assert program(in_c, {"x": other}) is None  # not compiled again for this signature
    assert_identical(in_c.run({"x": x}), in_python.run({"x": x}))


def test_an_index_out_of_range_fails_as_in_python():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Gather", ["r", "i"], ["y"], axis=1)]
    model = make_model(nodes, [tensor("x", [3, 5]), tensor("i", [2], TensorProto.INT64)],
                       [tensor("y", None)])
    in_c, in_python = plans(model)
    x = np.arange(15, dtype=np.float32).reshape(3, 5) - 7
    good = {"x": x, "i": np.array([4, -5], np.int64)}
    for _ in range(3):
        assert_identical(in_c.run(dict(good)), in_python.run(dict(good)))
    assert [op[0] for op in program(in_c, good).ops] == [C]
    bad = {"x": x, "i": np.array([1, 5], np.int64)}
    with pytest.raises(NodeError) as in_python_error:
        in_python.run(dict(bad))
    with pytest.raises(NodeError) as in_c_error:
        in_c.run(dict(bad))
    assert str(in_c_error.value) == str(in_python_error.value)


def test_shape_computations_are_worked_out_once_per_signature():
    # an exporter's dynamic reshape: Shape -> Gather -> Unsqueeze -> Concat -> Reshape
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Gather", ["sh", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
             helper.make_node("Concat", ["n1", "rest"], ["target"], axis=0),
             helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "target"], ["flat"]),
             helper.make_node("Softmax", ["flat"], ["y"], axis=-1)]
    model = make_model(nodes, [tensor("x", ["N", 3, 5])], [tensor("y", None)],
                       [("zero", np.array(0, np.int64)), ("zero1", np.array([0], np.int64)),
                        ("rest", np.array([-1], np.int64))])
    for n in (2, 4):
        feeds = {"x": np.random.default_rng(n).standard_normal((n, 3, 5)).astype(np.float32)}
        got, want, compiled = run_both(model, feeds)
        assert_identical(got, want)
        assert got[0].shape == (n, 15)
        assert [op[0] for op in compiled.ops] == [C]


def test_concat_and_expand_as_a_kv_cache_writes_them():
    # past (a feed) and the new step's keys (a C result) joined on the sequence axis, the
    # key heads then repeated for grouped-query attention
    nodes = [helper.make_node("Relu", ["k"], ["kr"]),
             helper.make_node("Concat", ["past", "kr"], ["present"], axis=2),
             helper.make_node("Unsqueeze", ["present", "two"], ["u"]),
             helper.make_node("Expand", ["u", "repeat"], ["e"]),
             helper.make_node("Sigmoid", ["e"], ["y"])]
    model = make_model(nodes, [tensor("past", [2, 3, "P", 4]), tensor("k", [2, 3, 1, 4])],
                       [tensor("present", None), tensor("y", None)],
                       [("two", np.array([2], np.int64)),
                        ("repeat", np.array([2, 3, 5, 1, 1], np.int64))])
    rng = np.random.default_rng(9)
    for past in (6, 0):
        feeds = {"past": rng.standard_normal((2, 3, past, 4)).astype(np.float32),
                 "k": rng.standard_normal((2, 3, 1, 4)).astype(np.float32)}
        got, want, compiled = run_both(model, feeds)
        assert_identical(got, want)
        assert got[1].shape == (2, 3, 5, past + 1, 4)
        assert [op[0] for op in compiled.ops] == [C]


def test_rms_norms_with_their_extra_outputs():
    rng = np.random.default_rng(10)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("SkipSimplifiedLayerNormalization", ["r", "skip", "gamma"],
                              ["n", "", "inv", "sum"], domain="com.microsoft", epsilon=1e-6),
             helper.make_node("RMSNormalization", ["sum", "gamma"], ["y"], epsilon=1e-5),
             helper.make_node("Tanh", ["n"], ["t"])]
    graph = helper.make_graph(
        nodes, "t", [tensor("x", [2, 5, 8]), tensor("skip", [2, 5, 8])],
        [tensor(n, None) for n in ("y", "t", "inv")],
        initializer=[numpy_helper.from_array(rng.standard_normal(8).astype(np.float32),
                                             "gamma")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23),
                                                    helper.make_opsetid("com.microsoft", 1)])
    feeds = {n: rng.standard_normal((2, 5, 8)).astype(np.float32) for n in ("x", "skip")}
    got, want, compiled = run_both(model, feeds)
    assert_identical(got, want)
    assert [op[0] for op in compiled.ops] == [C]


@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), [
    ([1, -9], [3, 100], [1, -1], None),      # clamped ends, a negative axis
    ([-1, 4], [-100, 0], [2, 1], [-2, -3]),  # stepping back, clamped start
    ([0], [2], None, None),                 # axes left out
])
def test_slice_and_split_copy_what_the_reference_ops_pick(starts, ends, axes, steps):
    names = ["r", "starts", "ends"] + (["axes"] if axes is not None or steps else [])
    names += ["steps"] if steps else []
    inits = [("starts", np.array(starts, np.int64)), ("ends", np.array(ends, np.int64)),
             ("split", np.array([2, 1, 4], np.int64))]
    if "axes" in names:
        inits.append(("axes", np.array(axes if axes is not None else range(len(starts)),
                                       np.int64)))
    if steps:
        inits.append(("steps", np.array(steps, np.int64)))
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Slice", names, ["s"]),
             helper.make_node("Tanh", ["s"], ["y"]),
             helper.make_node("Split", ["r", "split"], ["a", "b", "c"], axis=2),
             helper.make_node("Sigmoid", ["b"], ["z"])]
    model = make_model(nodes, [tensor("x", [3, 5, 7])],
                       [tensor(n, None) for n in ("y", "a", "z", "c")], inits)
    feeds = {"x": np.random.default_rng(11).standard_normal((3, 5, 7)).astype(np.float32)}
    got, want, compiled = run_both(model, feeds)
    assert_identical(got, want)
    assert [op[0] for op in compiled.ops] == [C]


def test_fused_elementwise_chains_run_as_one_chain_step():
    # level 2's chains: sides that are channel vectors, scalars, full feeds, on either side
    rng = np.random.default_rng(12)
    nodes = [helper.make_node("Mul", ["row", "x"], ["a"]),       # starts from the full operand
             helper.make_node("Sub", ["chan", "a"], ["b"]),      # side op value
             helper.make_node("Relu", ["b"], ["c"]),
             helper.make_node("Div", ["c", "two"], ["d"]),
             helper.make_node("Add", ["d", "f"], ["e"]),         # a second feed
             helper.make_node("Tanh", ["e"], ["y"])]
    model = make_model(nodes, [tensor("x", [2, 3, 4, 5]), tensor("f", [2, 3, 4, 5])],
                       [tensor("y", None)],
                       [("row", rng.standard_normal(5).astype(np.float32)),
                        ("chan", rng.standard_normal((3, 1, 1)).astype(np.float32)),
                        ("two", np.array(2.0, np.float32))])
    in_c = Plan(model, KERNELS, fuse_chains=True, c_steps=C_STEPS)
    in_python = Plan(model, KERNELS, fuse_chains=True)
    assert len(in_c.steps) == 1
    feeds = {n: rng.standard_normal((2, 3, 4, 5)).astype(np.float32) for n in ("x", "f")}
    for _ in range(3):
        got = in_c.run(dict(feeds))
    assert_identical(got, in_python.run(dict(feeds)))
    compiled = program(in_c, feeds)
    assert [op[0] for op in compiled.ops] == [C] and compiled.table.count == 1


def test_a_description_that_gives_other_results_is_not_used():
    # as if a fast kernel had changed its arithmetic since its description was written
    def sigmoid_instead(ins, outs, **attrs):
        return C_STEPS[("", "Sigmoid")](ins, outs)

    model = chain_model(length=9)
    in_c = Plan(model, KERNELS, c_steps={**C_STEPS, ("", "Relu"): sigmoid_instead})
    in_python = Plan(model, KERNELS)
    feeds = {"x": np.random.default_rng(14).standard_normal((3, 24)).astype(np.float32)}
    for _ in range(3):
        got = in_c.run(dict(feeds))
    assert_identical(got, in_python.run(dict(feeds)))
    compiled = program(in_c, feeds)
    in_python_steps = [in_c.steps[op[1]].node.op_type for op in compiled.ops if op[0] == PY]
    assert in_python_steps == ["Relu"]


def test_a_busy_plan_runs_the_other_thread_in_python():
    in_c, in_python = plans(chain_model(length=8))
    feeds = {"x": np.ones((3, 24), np.float32)}
    for _ in range(3):
        in_c.run(dict(feeds))
    with in_c._lock:  # as if another thread were running the step table
        got = in_c.run(dict(feeds))
    assert_identical(got, in_python.run(dict(feeds)))


# random graphs ------------------------------------------------------------------------------

UNARY = ["Relu", "Sigmoid", "Tanh"]
BINARY = ["Add", "Sub", "Mul", "Div"]


@st.composite
def graphs(draw):
    """A random chain over a 2-D to 4-D value: elementwise ops with full, row, column or
    scalar operands, MatMuls against fresh weights, Softmax and Transposes."""
    rank = draw(st.integers(2, 4))
    shape = [draw(st.integers(1, 6)) for _ in range(rank)]
    first = tuple(shape)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    nodes, inits, value = [], [], "x"
    for i in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "matmul", "softmax", "transpose"]))
        out = f"v{i}"
        if kind == "unary":
            nodes.append(helper.make_node(draw(st.sampled_from(UNARY)), [value], [out]))
        elif kind == "binary":
            side = [s if draw(st.booleans()) else 1 for s in shape]
            side = side[draw(st.integers(0, len(side))):]
            w = f"w{i}"
            inits.append((w, (rng.standard_normal(side) + 3).astype(np.float32)))
            pair = [value, w] if draw(st.booleans()) else [w, value]
            nodes.append(helper.make_node(draw(st.sampled_from(BINARY)), pair, [out]))
        elif kind == "matmul":
            n = draw(st.integers(1, 7))
            w = f"w{i}"
            inits.append((w, rng.standard_normal((shape[-1], n)).astype(np.float32)))
            nodes.append(helper.make_node("MatMul", [value, w], [out]))
            shape = shape[:-1] + [n]
        elif kind == "softmax":
            nodes.append(helper.make_node("Softmax", [value], [out], axis=-1))
        else:
            perm = list(rng.permutation(len(shape)))
            nodes.append(helper.make_node("Transpose", [value], [out], perm=perm))
            shape = [shape[p] for p in perm]
        value = out
    nodes.append(helper.make_node("Identity", [value], ["y"]))
    return nodes, inits, first


@settings(max_examples=40, deadline=None)
@given(graphs(), st.integers(0, 2**16))
def test_random_graphs_match_the_python_plan(graph, seed):
    nodes, inits, shape = graph
    model = make_model(nodes, [tensor("x", [None] * len(shape))], [tensor("y", None)], inits)
    feeds = {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}
    got, want, _ = run_both(model, feeds)
    assert_identical(got, want)
