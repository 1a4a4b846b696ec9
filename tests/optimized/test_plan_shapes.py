"""Compiled runs shared by signatures that differ only in some dimensions (optimized/plan_shapes.py):
a decoder's generation, whose KV cache grows by one position a step, runs its steps through one
step table, with results bit for bit those of the plan run step by step in Python; a shape that
the pattern took for fixed and that changes sends the run back to Python."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from benchmarks.decoders import SIZES, build_llama, empty_past, step_feeds
from optimized.cpu import C_STEPS, KERNELS
from optimized.plan import PY, CompiledRun, Plan
from optimized.plan_shapes import GrowingRun, affine, canonical, differing, matches, pattern_of

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


@settings(max_examples=200, deadline=None)
@given(st.integers(-10**6, 10**6), st.integers(-1000, 1000),
       st.lists(st.integers(-10**4, 10**4), min_size=2, max_size=4, unique=True))
def test_affine_finds_the_line_through_its_points(base, slope, ts):
    assert affine(ts, [base + slope * t for t in ts]) == (base, slope)


@settings(max_examples=200, deadline=None)
@given(st.integers(-1000, 1000), st.integers(-100, 100), st.integers(1, 50),
       st.integers(1, 50), st.integers(-5, 5).filter(bool))
def test_affine_refuses_points_off_any_line(base, slope, step_a, step_b, bend):
    t = [0, step_a, step_a + step_b]
    values = [base, base + slope * t[1], base + slope * t[2] + bend]  # the last point bent
    assert affine(t, values) is None


def test_affine_hand_checked():
    assert affine([129, 130, 132], [129 * 256, 130 * 256, 132 * 256]) == (0, 256)
    assert affine([5, 6, 8], [7, 7, 7]) == (7, 0)
    assert affine([5, 6, 8], [1, 2, 5]) is None  # 1, 2 then 5: not a line
    assert affine([2, 4, 6], [0, 1, 2]) is None  # slope 1/2: not whole
    assert affine([3, 3], [1, 2]) is None  # one length: no line to find


def fused_model(tmp_path):
    """The tiny Llama as the session runs it at level 99 (rotary and grouped attention fused)."""
    import onnx

    import optimized

    options = optimized.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "fused.onnx")
    optimized.InferenceSession(build_llama(SIZES["tiny"]).SerializeToString(), options)
    return onnx.load(options.optimized_model_filepath)


def test_cache_concat_and_attention_grow_in_c(monkeypatch):
    """At level 99 the cache Concats and the fused grouped attention read and write values
    whose length grows each step: the shared program runs them in C, with every generated
    token the reference's."""
    import optimized
    from tests.test_generate_example import PROMPT, load_example, reference_generate

    model = build_llama(SIZES["tiny"])
    session = optimized.InferenceSession(model.SerializeToString())
    ran = count_runs(monkeypatch)
    assert load_example().generate(session, PROMPT, 12) == reference_generate(model, PROMPT, 12)
    program = ran[-1]
    assert isinstance(program, GrowingRun) and not program.broken and ran == [program] * 8
    in_python = {program.plan.steps[op[1]].node.op_type for op in program.ops if op[0] == PY}
    assert not in_python & {"Concat", "GroupedAttentionMasked", "GroupedAttention"}
    assert program.c_steps_grown >= 2 * 2 + 2  # two layers: two cache Concats and attention


def run_both(plans, feeds):
    """Each plan's outputs for feeds, checked equal bit for bit (or the same error type)."""
    results = []
    for plan in plans:
        try:
            results.append(plan.run(dict(feeds)))
        except Exception as e:  # noqa: BLE001 - compared below
            results.append(type(e))
    first = results[0]
    for other in results[1:]:
        if isinstance(first, type) or isinstance(other, type):
            assert first == other
            continue
        for g, w in zip(first, other):
            assert g.shape == w.shape and g.tobytes() == w.tobytes()
    return first


def generate_both(plans, model, steps: int) -> dict:
    """decode_steps through both plans; the last feeds."""
    loop = decode_steps(model, [1, 17, 42, 99, 7], steps)
    feeds = next(loop)
    outputs = run_both(plans, feeds)
    try:
        while True:
            feeds = loop.send(outputs)
            outputs = run_both(plans, feeds)
    except StopIteration:
        return feeds


def shared_program_of(plan):
    patterns = plan.shapes._patterns
    assert len(patterns) == 1
    return patterns[0].program


@pytest.mark.parametrize("threads", [1, 2])
def test_growing_program_matches_python_step_by_step(monkeypatch, request, tmp_path,
                                                   threads):
    """Through a generation, then shorter caches than the pattern was learned from (a new
    generation), down to one position (the shortest the program takes) and none (out of its
    range: Python), results bit for bit those of the plan run step by step in Python."""
    from optimized import kernels

    before = kernels.get_num_threads()
    kernels.set_num_threads(threads)
    request.addfinalizer(lambda: kernels.set_num_threads(before))  # later tests keep theirs
    model = fused_model(tmp_path)
    in_c, in_python = Plan(model, KERNELS, c_steps=C_STEPS), Plan(model, KERNELS)
    ran = count_runs(monkeypatch)
    generate_both((in_c, in_python), model, 10)
    program = shared_program_of(in_c)
    assert isinstance(program, GrowingRun) and ran == [program] * 6
    rng = np.random.default_rng(threads)
    for past_length in (3, 1, 0):
        past = {k: rng.standard_normal(v.shape[:2] + (past_length,) + v.shape[3:]).astype(
            np.float32) for k, v in empty_past(model).items()}
        run_both((in_c, in_python), {**step_feeds(np.array([[5]]), past_length), **past})
    assert ran == [program] * 8 and not program.broken  # past 0: t = 1, below its range


def test_feeds_off_the_line_run_in_python(monkeypatch, tmp_path):
    """A mask one position longer than the cache: the feeds match the pattern, but not the
    line the program's sizes follow; the run goes step by step in Python, which says what is
    wrong, as the plan without C steps does."""
    model = fused_model(tmp_path)
    in_c, in_python = Plan(model, KERNELS, c_steps=C_STEPS), Plan(model, KERNELS)
    feeds = generate_both((in_c, in_python), model, 6)
    program = shared_program_of(in_c)
    assert isinstance(program, GrowingRun)
    bad = dict(feeds, attention_mask=np.ones((1, feeds["attention_mask"].shape[1] + 1), np.int64))
    assert program._length(bad) is None
    assert isinstance(run_both((in_c, in_python), bad), type) and not program.broken
