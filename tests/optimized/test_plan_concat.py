"""Concat in place (optimized/plan.py CompiledRun._place_concats): where a Concat's dimensions
before its axis are all 1, each input is one contiguous byte range of the result, so the step
that makes an input writes it there and the Concat copies nothing for it.  Results must stay
the Python plan's bit for bit, and the reference's; what may not be placed (a feed, a view, a
graph output, a Python step's result, a value concatenated twice, a batch above 1) is copied."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from optimized import kernels
from optimized.cpu import C_STEPS, KERNELS
from optimized.plan import C, Plan
from reference import ReferenceEvaluator
from tests.optimized.plan_models import make_model

F = TensorProto.FLOAT


def tensor(name, shape=None):
    return helper.make_tensor_value_info(name, F, shape)


def compiled_run(model, feeds, runs=3):
    """The step-table plan's outputs of its `runs`-th run (the first records, the second
    compiles), the Python plan's outputs, and the compiled program."""
    in_c, in_python = Plan(model, KERNELS, c_steps=C_STEPS), Plan(model, KERNELS)
    for _ in range(runs):
        got = in_c.run(dict(feeds))
    key = tuple((n, v.shape, v.dtype) for n, v in feeds.items())
    return got, in_python.run(dict(feeds)), in_c._programs.get(key)


def check(model, feeds, runs=3):
    """The compiled run's outputs equal the Python plan's bit for bit and the reference's
    within float32 rounding; returns the program and its in-place values by name."""
    got, want, program = compiled_run(model, feeds, runs)
    assert program is not None and not program.broken
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.tobytes() == w.tobytes()
    for g, r in zip(got, ReferenceEvaluator(model).run(None, feeds)):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
    names = program.plan.names
    return program, {names[s] for s in program.inside}


def concat_entries(program, output: str) -> int:
    """How many step-table entries the Concat that makes `output` has."""
    plan = program.plan
    (at,) = [i for i, step in enumerate(plan.steps)
             if step.node.op_type == "Concat" and step.node.output[0] == output]
    return program.entry_step.count(at)


def conv(name, x, w, relu=True):
    nodes = [helper.make_node("Conv", [x, w, w + "_b"], [name + "_c" if relu else name],
                              pads=[1, 1, 1, 1])]
    if relu:
        nodes.append(helper.make_node("Relu", [name + "_c"], [name]))
    return nodes


def weights(rng, *pairs):
    inits = []
    for name, (m, c) in pairs:
        inits.append((name, rng.standard_normal((m, c, 3, 3)).astype(np.float32) * 0.3))
        inits.append((name + "_b", rng.standard_normal(m).astype(np.float32)))
    return inits


def fire_model(batch=1, concat_is_output=False):
    """A squeeze-expand block: two convolution branches over one value, joined on channels,
    then a convolution over the join (H != W, channels unlike either)."""
    nodes = (conv("s", "x", "ws") + conv("a", "s", "wa") + conv("b", "s", "wb")
             + [helper.make_node("Concat", ["a", "b"], ["cat"], axis=1)] + conv("y", "cat", "wy"))
    outputs = [tensor("y"), tensor("cat")] if concat_is_output else [tensor("y")]
    rng = np.random.default_rng(1)
    inits = weights(rng, ("ws", (3, 2)), ("wa", (5, 3)), ("wb", (4, 3)), ("wy", (6, 9)))
    model = make_model(nodes, [tensor("x", [batch, 2, 7, 11])], outputs, inits)
    feeds = {"x": rng.standard_normal((batch, 2, 7, 11)).astype(np.float32)}
    return model, feeds


def test_branches_are_written_into_the_concat_which_copies_nothing():
    model, feeds = fire_model()
    program, placed = check(model, feeds)
    assert placed == {"a", "b"}
    assert concat_entries(program, "cat") == 0
    assert [op[0] for op in program.ops] == [C]


def test_library_convolutions_write_at_offsets_off_any_alignment():
    # 3x3 convolutions over 9 channels (oneDNN's class where it is available, ours elsewhere):
    # b starts 5*7*9 floats into the result, a multiple of no vector width
    nodes = (conv("s", "x", "ws") + conv("a", "s", "wa") + conv("b", "s", "wb")
             + [helper.make_node("Concat", ["a", "b"], ["cat"], axis=1)] + conv("y", "cat", "wy"))
    rng = np.random.default_rng(10)
    inits = weights(rng, ("ws", (9, 2)), ("wa", (5, 9)), ("wb", (11, 9)), ("wy", (3, 16)))
    model = make_model(nodes, [tensor("x", [1, 2, 7, 9])], [tensor("y")], inits)
    program, placed = check(model, {"x": rng.standard_normal((1, 2, 7, 9)).astype(np.float32)})
    assert placed == {"a", "b"}
    assert concat_entries(program, "cat") == 0


def test_a_batch_above_one_is_copied():
    model, feeds = fire_model(batch=2)  # a's rows and b's rows interleave in the result
    program, placed = check(model, feeds)
    assert placed == set()
    assert concat_entries(program, "cat") == 2


def test_a_concat_that_is_a_graph_output_is_copied():
    model, feeds = fire_model(concat_is_output=True)
    program, placed = check(model, feeds, runs=4)
    assert placed == set()
    assert concat_entries(program, "cat") == 2


def test_placed_values_survive_until_their_last_reader():
    # a and b are read again long after the Concat, with larger values made in between that
    # would take their bytes if only the Concat's own lifetime held them
    nodes = (conv("a", "x", "wa") + conv("b", "x", "wb")
             + [helper.make_node("Concat", ["a", "b"], ["cat"], axis=1)]
             + conv("big", "cat", "wbig") + conv("big2", "big", "wbig2")
             + [helper.make_node("ReduceMean", ["big2", "axes"], ["m"], keepdims=1),
                helper.make_node("Mul", ["a", "m"], ["am"]),
                helper.make_node("Add", ["b", "m"], ["bm"]),
                helper.make_node("Concat", ["am", "bm"], ["y"], axis=1)])
    rng = np.random.default_rng(2)
    inits = weights(rng, ("wa", (3, 2)), ("wb", (5, 2)), ("wbig", (16, 8)), ("wbig2", (16, 16)))
    inits.append(("axes", np.array([1], np.int64)))
    model = make_model(nodes, [tensor("x", [1, 2, 6, 9])], [tensor("y")], inits)
    feeds = {"x": rng.standard_normal((1, 2, 6, 9)).astype(np.float32)}
    program, placed = check(model, feeds)
    assert {"a", "b"} <= placed
    assert concat_entries(program, "cat") == 0


def test_a_value_concatenated_twice_is_copied_and_the_others_placed():
    nodes = (conv("a", "x", "wa") + conv("b", "x", "wb")
             + [helper.make_node("Concat", ["a", "b", "a"], ["cat"], axis=1)]
             + conv("y", "cat", "wy"))
    rng = np.random.default_rng(3)
    inits = weights(rng, ("wa", (3, 2)), ("wb", (4, 2)), ("wy", (2, 10)))
    model = make_model(nodes, [tensor("x", [1, 2, 5, 8])], [tensor("y")], inits)
    program, placed = check(model, {"x": rng.standard_normal((1, 2, 5, 8)).astype(np.float32)})
    assert placed == {"b"}
    assert concat_entries(program, "cat") == 2


def test_feeds_views_graph_outputs_and_python_results_are_copied():
    # x: a feed; v: a view (Reshape) of r; o: a graph output; e: a reference op's result
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["v"]),
             helper.make_node("Sigmoid", ["x"], ["o"]),
             helper.make_node("Erf", ["x"], ["e"]),
             helper.make_node("Tanh", ["x"], ["t"]),
             helper.make_node("Concat", ["x", "v", "o", "e", "t"], ["cat"], axis=1),
             helper.make_node("Mul", ["cat", "cat"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, 3, 4, 5])], [tensor("y"), tensor("o")],
                       [("shape", np.array([1, 3, 4, 5], np.int64))])
    rng = np.random.default_rng(4)
    program, placed = check(model, {"x": rng.standard_normal((1, 3, 4, 5)).astype(np.float32)},
                            runs=4)
    assert placed == {"t"}
    assert concat_entries(program, "cat") == 4


def test_concats_of_concats_nest_in_the_outermost():
    # densenet as caffe2 wrote it: each layer's result joined to the previous join
    nodes = [helper.make_node("Relu", ["x"], ["j0"])]
    rng = np.random.default_rng(5)
    inits = []
    for k in range(1, 4):
        nodes += conv(f"f{k}", f"j{k - 1}", f"w{k}")
        nodes.append(helper.make_node("Concat", [f"j{k - 1}", f"f{k}"], [f"j{k}"], axis=1))
        inits += weights(rng, (f"w{k}", (2, 3 + 2 * (k - 1))))
    nodes.append(helper.make_node("Sigmoid", ["j3"], ["y"]))
    model = make_model(nodes, [tensor("x", [1, 3, 5, 7])], [tensor("y")], inits)
    program, placed = check(model, {"x": rng.standard_normal((1, 3, 5, 7)).astype(np.float32)})
    assert placed == {"j0", "f1", "j1", "f2", "j2", "f3"}
    assert all(concat_entries(program, f"j{k}") == 0 for k in range(1, 4))


def test_a_value_in_two_concats_sits_in_the_later_and_the_earlier_copies_it():
    # densenet as torchvision writes it: every join takes all earlier features again
    nodes = [helper.make_node("Relu", ["x"], ["f0"]),
             helper.make_node("Tanh", ["x"], ["f1"]),
             helper.make_node("Concat", ["f0", "f1"], ["j1"], axis=1),
             helper.make_node("Sigmoid", ["j1"], ["f2"]),
             helper.make_node("Concat", ["f0", "f1", "f2"], ["j2"], axis=1),
             helper.make_node("Mul", ["j2", "j2"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, 2, 3, 4])], [tensor("y")])
    rng = np.random.default_rng(6)
    program, placed = check(model, {"x": rng.standard_normal((1, 2, 3, 4)).astype(np.float32)})
    assert {"f0", "f1", "f2"} <= placed
    assert concat_entries(program, "j2") == 0
    # j1 is f0 and f1 side by side in j2 already: it sits there too
    assert "j1" in placed and concat_entries(program, "j1") == 0


def test_a_value_in_two_concats_apart_is_copied_by_the_earlier():
    nodes = [helper.make_node("Relu", ["x"], ["f0"]),
             helper.make_node("Tanh", ["x"], ["f1"]),
             helper.make_node("Concat", ["f1", "f0"], ["j1"], axis=1),
             helper.make_node("Sigmoid", ["j1"], ["f2"]),
             helper.make_node("Concat", ["f0", "f2", "f1"], ["j2"], axis=1),
             helper.make_node("Mul", ["j2", "j2"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, 2, 3, 4])], [tensor("y")])
    rng = np.random.default_rng(7)
    program, placed = check(model, {"x": rng.standard_normal((1, 2, 3, 4)).astype(np.float32)})
    assert {"f0", "f1", "f2"} <= placed and "j1" not in placed
    assert concat_entries(program, "j2") == 0 and concat_entries(program, "j1") == 2


@pytest.mark.parametrize("shape, axis, in_place", [
    ((1, 1, 3, 4), 2, True),  # every dimension before the axis is 1
    ((1, 2, 3, 4), 2, False),  # rows of each input interleave
    ((1, 2, 3, 4), -3, True),
    ((3, 4), 0, True),
    ((2, 3, 4), 0, True)])
def test_axes_where_the_inputs_are_contiguous(shape, axis, in_place):
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Tanh", ["x"], ["b"]),
             helper.make_node("Concat", ["a", "b"], ["cat"], axis=axis),
             helper.make_node("Sigmoid", ["cat"], ["y"])]
    model = make_model(nodes, [tensor("x", list(shape))], [tensor("y")])
    rng = np.random.default_rng(8)
    program, placed = check(model, {"x": rng.standard_normal(shape).astype(np.float32)})
    assert placed == ({"a", "b"} if in_place else set())
    assert concat_entries(program, "cat") == (0 if in_place else 2)


def test_each_input_shape_is_planned_on_its_own():
    model, _ = fire_model()
    model.graph.input[0].CopyFrom(tensor("x", [1, 2, "H", "W"]))
    in_c, in_python = Plan(model, KERNELS, c_steps=C_STEPS), Plan(model, KERNELS)
    rng = np.random.default_rng(9)
    shapes = [(1, 2, 7, 11), (1, 2, 13, 4), (2, 2, 7, 11), (1, 2, 7, 11)]
    for shape in shapes * 3:
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        got, want = in_c.run(dict(feeds)), in_python.run(dict(feeds))
        assert got[0].tobytes() == want[0].tobytes()
    for shape in shapes[:3]:
        program = in_c._programs[(("x", shape, np.dtype(np.float32)),)]
        placed = {program.plan.names[s] for s in program.inside}
        assert placed == (set() if shape[0] == 2 else {"a", "b"})


def test_same_results_at_one_and_two_threads(threads):
    model, feeds = fire_model()
    results = []
    for n in (1, 2):
        kernels.set_num_threads(n)
        got, _, program = compiled_run(model, feeds)
        assert program.inside
        results.append(got[0].tobytes())
    assert results[0] == results[1]


@st.composite
def concat_graphs(draw):
    """Elementwise values of one feed of shape (n, c, h, w), joined by Concats on channels in
    random groups (repeats and joins of joins included), with random graph outputs."""
    n, h, w = draw(st.sampled_from([1, 1, 2])), draw(st.integers(1, 5)), draw(st.integers(1, 6))
    feed_channels = draw(st.integers(1, 3))
    values = [("x", feed_channels)]
    nodes = []
    for k in range(draw(st.integers(2, 9))):
        if len(values) > 1 and draw(st.booleans()):
            picked = draw(st.lists(st.sampled_from(values), min_size=1, max_size=4))
            name = f"j{k}"
            nodes.append(helper.make_node("Concat", [n for n, _ in picked], [name], axis=1))
            values.append((name, sum(c for _, c in picked)))
        else:
            source, channels = draw(st.sampled_from(values))
            op = draw(st.sampled_from(["Relu", "Tanh", "Sigmoid", "Neg", "Erf", "Identity"]))
            name = f"v{k}"
            nodes.append(helper.make_node(op, [source], [name]))
            values.append((name, channels))
    names = [n for n, _ in values[1:]]
    outputs = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
    if names[-1] not in outputs:
        outputs.append(names[-1])
    model = make_model(nodes, [tensor("x", [n, feed_channels, h, w])],
                       [tensor(name) for name in outputs])
    return model, (n, feed_channels, h, w)


@settings(max_examples=60, deadline=None)
@given(concat_graphs(), st.integers(0, 2**31 - 1))
def test_random_concat_graphs_match_the_python_plan(graph, seed):
    model, shape = graph
    feeds = {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}
    in_c, in_python = Plan(model, KERNELS, c_steps=C_STEPS), Plan(model, KERNELS)
    for _ in range(3):
        got = in_c.run(dict(feeds))
    want = in_python.run(dict(feeds))
    again = in_c.run(dict(feeds))  # a second step-table run over the same arena
    for g, w, a in zip(got, want, again):
        assert g.shape == w.shape and g.tobytes() == w.tobytes() == a.tobytes()
    program = in_c._programs[(("x", shape, np.dtype(np.float32)),)]
    assert program is not None and not program.broken
