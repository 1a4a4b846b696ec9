"""Compiled runs shared by signatures that differ only in some dimensions (optimized/plan_shapes.py):
a decoder's generation, whose KV cache grows by one position a step, runs its steps through one
step table, with results bit for bit those of the plan run step by step in Python; a shape that
the pattern took for fixed and that changes sends the run back to Python."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from benchmarks.decoders import SIZES, build_llama, empty_past, step_feeds
from optimized.cpu import C_STEPS, KERNELS
from optimized.plan import CompiledRun, Plan
from optimized.plan_shapes import canonical, differing, matches, pattern_of

F = TensorProto.FLOAT


def test_pattern_of_a_growing_cache():
    f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
    step_a = (("ids", (1, 1), i64), ("past", (1, 2, 7, 4), f32), ("mask", (1, 8), i64))
    step_b = (("ids", (1, 1), i64), ("past", (1, 2, 8, 4), f32), ("mask", (1, 9), i64))
    pattern = pattern_of(canonical(step_b), canonical(step_a))
    assert pattern == (("ids", (1, 1), i64), ("mask", (1, None), i64),
                       ("past", (1, 2, None, 4), f32))
    later = (("past", (1, 2, 30, 4), f32), ("ids", (1, 1), i64), ("mask", (1, 31), i64))
    assert matches(pattern, canonical(later))  # feeds in another order are the same signature
    prompt = (("ids", (1, 5), i64), ("past", (1, 2, 0, 4), f32), ("mask", (1, 5), i64))
    assert not matches(pattern, canonical(prompt))  # a fixed dimension differs
    other_dtype = (("ids", (1, 1), i64), ("past", (1, 2, 9, 4), np.dtype(np.float16)),
                   ("mask", (1, 10), i64))
    assert not matches(pattern, canonical(other_dtype))
    assert not matches(pattern, canonical(step_a[:2]))  # a feed less


def test_differing_slots():
    f32 = np.dtype(np.float32)
    a = {0: ((1, 3), f32), 1: ((2,), f32), 2: list}
    b = {0: ((1, 4), f32), 1: ((2,), f32), 2: list, 3: ((1,), f32)}
    assert differing(a, b) == {0, 3}


def decode_steps(model, prompt: list[int], steps: int):
    """The feeds of a greedy-like loop (the next token is fixed, so both plans see the same
    feeds): a prompt, then one token a step with the cache of the step before."""
    names = [o.name for o in model.graph.output]
    feeds = {**step_feeds(np.array([prompt], np.int64), 0), **empty_past(model)}
    length = len(prompt)
    for i in range(steps):
        outputs = yield feeds
        past = {n.replace("present.", "past_key_values."): v for n, v in zip(names, outputs)
                if n.startswith("present.")}
        feeds = {**step_feeds(np.array([[3 + i]], np.int64), length), **past}
        length += 1


def count_runs(monkeypatch) -> list:
    """Each CompiledRun that runs, in order."""
    ran = []
    real = CompiledRun.run

    def run(self, feeds):
        ran.append(self)
        return real(self, feeds)

    monkeypatch.setattr(CompiledRun, "run", run)
    return ran


def test_a_generation_runs_through_one_shared_program(monkeypatch):
    model = build_llama(SIZES["tiny"])
    in_c, in_python = Plan(model, KERNELS, c_steps=C_STEPS), Plan(model, KERNELS)
    ran = count_runs(monkeypatch)
    loop = decode_steps(model, [1, 17, 42, 99, 7], 12)
    feeds = next(loop)
    try:
        while True:
            got, want = in_c.run(dict(feeds)), in_python.run(dict(feeds))
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert g.shape == w.shape and g.tobytes() == w.tobytes()
            feeds = loop.send(got)
    except StopIteration:
        pass
    patterns = in_c.shapes._patterns
    assert len(patterns) == 1 and patterns[0].program is not None
    # prompt and two decode steps in Python (their shapes teach the pattern), the third
    # recorded, the other eight through the pattern's program
    assert ran == [patterns[0].program] * 8
    assert not patterns[0].program.broken


def test_prompt_and_decode_step_teach_no_pattern():
    """Nearly every value of a prompt differs in shape from a decode step's: no pattern."""
    model = build_llama(SIZES["tiny"])
    plan = Plan(model, KERNELS, c_steps=C_STEPS)
    loop = decode_steps(model, [1, 17, 42, 99, 7], 2)
    decode = loop.send(plan.run(next(loop)))
    plan.run(decode)
    assert plan.shapes._patterns == []


def slice_model():
    """y = relu(x[:, :4]) through five more elementwise steps, z = sigmoid(x): x's length
    varies, y's is 4 while x has 4 columns or more."""
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"]),
             helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Tanh", ["r"], ["t"]),
             helper.make_node("Mul", ["t", "t"], ["m"]),
             helper.make_node("Add", ["m", "t"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"]),
             helper.make_node("Sigmoid", ["x"], ["z"])]
    ints = [helper.make_tensor(n, TensorProto.INT64, [1], [v])
            for n, v in (("starts", 0), ("ends", 4), ("axes", 1))]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", F, [1, "n"])],
                              [helper.make_tensor_value_info("y", F, [1, None]),
                               helper.make_tensor_value_info("z", F, [1, "n"])],
                              initializer=ints)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_a_shape_taken_for_fixed_that_changes_goes_back_to_python(monkeypatch):
    model = slice_model()
    in_c, in_python = Plan(model, KERNELS, c_steps=C_STEPS), Plan(model, KERNELS)
    ran = count_runs(monkeypatch)
    rng = np.random.default_rng(0)

    def same(n):
        x = rng.standard_normal((1, n)).astype(np.float32)
        got, want = in_c.run({"x": x}), in_python.run({"x": x})
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.tobytes() == w.tobytes()

    for n in (6, 7, 8, 9):  # two teach the pattern (y's length 4 fixed), one records it
        same(n)
    pattern = in_c.shapes._patterns[0]
    assert ran == [pattern.program]
    same(2)  # y has 2 columns: the C steps after the Slice must not run on a 4-column buffer
    assert pattern.program.broken and ran == [pattern.program] * 2
    same(10)  # the pattern is dead: this signature is seen for the first time, in Python
    assert ran == [pattern.program] * 2 and in_c.shapes.program(
        (("x", (1, 11), np.dtype(np.float32)),)) is None


@pytest.mark.parametrize("level", [1, 99])
def test_session_generation_uses_the_shared_program(monkeypatch, level):
    """Through the session API (examples/generate.py's loop), fused graph included."""
    import optimized
    from tests.test_generate_example import PROMPT, load_example, reference_generate

    model = build_llama(SIZES["tiny"])
    options = optimized.SessionOptions()
    options.graph_optimization_level = level
    session = optimized.InferenceSession(model.SerializeToString(), options)
    ran = count_runs(monkeypatch)
    assert load_example().generate(session, PROMPT, 10) == reference_generate(model, PROMPT, 10)
    assert len(ran) == 6 and len(set(map(id, ran))) == 1
