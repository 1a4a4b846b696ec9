"""CausalPaddingMask in C (csrc/causal_mask.c): the kernel against hand-checked values and the
function body as the reference runs it, the plan step (start and end read at run time; values
that do not give the recorded shape send the run on in Python), and the decode program of a
generation with no Python mask step."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from optimized import cpu, kernels
from optimized.passes.gqa_fusion import CAUSAL_PADDING_MASK, causal_padding_mask_function
from optimized.passes.silu_mlp_fusion import FUSED_DOMAIN
from optimized.plan import PY, C, Plan
from reference import ReferenceEvaluator

KEY = (FUSED_DOMAIN, CAUSAL_PADDING_MASK)
OPSET = 18
MASK_TYPES = {np.dtype(np.bool_): TensorProto.BOOL, np.dtype(np.int32): TensorProto.INT32,
              np.dtype(np.int64): TensorProto.INT64, np.dtype(np.float32): TensorProto.FLOAT,
              np.dtype(np.float64): TensorProto.DOUBLE}


def mask_model(mask_dtype=np.int64, fill=-1e30):
    """One CausalPaddingMask node over graph inputs attention_mask, start and end, its
    function body in the model (the reference runs that body)."""
    node = helper.make_node(CAUSAL_PADDING_MASK, ["attention_mask", "start", "end"], ["y"],
                            domain=FUSED_DOMAIN, fill=float(fill))
    graph = helper.make_graph(
        [node], "mask",
        [helper.make_tensor_value_info("attention_mask", MASK_TYPES[np.dtype(mask_dtype)],
                                       ["batch", "keys"]),
         helper.make_tensor_value_info("start", TensorProto.INT64, []),
         helper.make_tensor_value_info("end", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid(FUSED_DOMAIN, 1)])
    model.functions.append(causal_padding_mask_function(OPSET))
    return model


def body(mask, start, end, fill):
    model = mask_model(mask.dtype, fill)
    feeds = {"attention_mask": mask, "start": np.int64(start), "end": np.int64(end)}
    return ReferenceEvaluator(model).run(None, feeds)[0]


def test_kernel_hand_checked():
    # batch 0 left and right padded, batch 1 a hole; queries at positions 3 and 4 of 5 keys
    mask = np.array([[0, 1, 1, 1, 0], [1, 1, 0, 1, 1]], np.int64)
    f = np.float32(-7.5)
    want = np.array([[[[f, 0, 0, 0, f], [f, 0, 0, 0, f]]],
                     [[[0, 0, f, 0, f], [0, 0, f, 0, 0]]]], np.float32)
    got = kernels.causal_padding_mask(mask, 3, 5, -7.5)
    assert got.dtype == np.float32 and got.shape == (2, 1, 2, 5)
    np.testing.assert_array_equal(got, want)
    # every key masked: every query sees none
    np.testing.assert_array_equal(kernels.causal_padding_mask(np.zeros((1, 3), np.int32), 0, 3,
                                                              -1.0), np.full((1, 1, 3, 3), -1.0))


def test_kernel_takes_a_negative_start_as_the_body_does():
    # Range(-2, 4): six query rows, the first two before every key
    mask = np.array([[1, 0, 1, 1]], np.int64)
    got = kernels.causal_padding_mask(mask, -2, 4, -1e30)
    assert got.shape == (1, 1, 6, 4) and got.tobytes() == body(mask, -2, 4, -1e30).tobytes()
    assert (got[0, 0, :2] == np.float32(-1e30)).all()


@pytest.mark.parametrize("start, end", [(0, 4), (4, 3), (6, 5), (2, 6)])
def test_kernel_refuses_values_other_than_the_masks_width(start, end):
    # the mask is 5 wide: the body broadcasts or fails there, the C kernel takes none of them
    assert kernels.causal_padding_mask(np.ones((2, 5), np.int64), start, end, -1.0) is None


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_kernel_is_the_reference_body(data):
    batch, keys = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 9))
    queries = data.draw(st.integers(1, keys))
    dtype = data.draw(st.sampled_from(sorted(MASK_TYPES, key=str)))
    values = [0, 1] if dtype == np.bool_ else [0, 1, -2, 7] + (
        [0.5, float("nan"), -0.0] if dtype.kind == "f" else [])
    mask = np.array(data.draw(st.lists(st.sampled_from(values), min_size=batch * keys,
                                       max_size=batch * keys)), dtype).reshape(batch, keys)
    fill = data.draw(st.sampled_from([-1e30, float("-inf"), -3.4028234663852886e38, -1.0, 2.5]))
    start = keys - queries
    got = kernels.causal_padding_mask(mask, start, keys, fill)
    want = body(mask, start, keys, fill)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got.tobytes() == want.tobytes()


def plan_with_counted_kernel(monkeypatch, model):
    calls = []
    kernel = cpu.KERNELS[KEY]
    monkeypatch.setitem(cpu.KERNELS, KEY, lambda *a, **k: calls.append(1) or kernel(*a, **k))
    return Plan(model, cpu.KERNELS, c_steps=cpu.C_STEPS), calls


@pytest.fixture(params=[1, 2])
def threads(request):
    before = kernels.get_num_threads()
    kernels.set_num_threads(request.param)
    yield request.param
    kernels.set_num_threads(before)


@pytest.mark.parametrize("batch, keys, queries", [(2, 7, 1), (2, 6, 6), (1, 9, 4)])
def test_plan_runs_the_mask_in_c(monkeypatch, threads, batch, keys, queries):
    model = mask_model()
    plan, calls = plan_with_counted_kernel(monkeypatch, model)
    rng = np.random.default_rng(batch * keys + queries)
    for _ in range(4):  # recorded, compiled, then twice from the table with new values
        mask = rng.integers(0, 2, (batch, keys)).astype(np.int64)
        feeds = {"attention_mask": mask, "start": np.int64(keys - queries),
                 "end": np.int64(keys)}
        (got,) = plan.run(dict(feeds))
        want = body(mask, keys - queries, keys, -1e30)
        assert got.shape == want.shape and got.tobytes() == want.tobytes()
    (compiled,) = [p for p in plan._programs.values() if p is not None]
    assert [op[0] for op in compiled.ops] == [C]
    assert len(calls) == 2  # the first sighting and the run that compiles only


def test_values_off_the_recorded_shape_run_in_python(monkeypatch):
    # recorded and compiled for start 0, end 5 over a (2, 5) mask: start 2 gives 3 query rows,
    # end 3 a key axis the mask does not fit; the step fails and Python answers as the body
    model = mask_model(np.int32, fill=-2.0)
    plan, calls = plan_with_counted_kernel(monkeypatch, model)
    mask = np.array([[1, 1, 0, 1, 1], [0, 1, 1, 1, 1]], np.int32)
    feeds = {"attention_mask": mask, "start": np.int64(0), "end": np.int64(5)}
    for _ in range(3):
        plan.run(dict(feeds))
    assert len(calls) == 2 and any(p is not None for p in plan._programs.values())
    (got,) = plan.run(dict(feeds, start=np.int64(2)))
    assert len(calls) == 3
    want = body(mask, 2, 5, -2.0)
    assert got.shape == (2, 1, 3, 5) and got.tobytes() == want.tobytes()
    with pytest.raises(Exception) as in_c:
        plan.run(dict(feeds, end=np.int64(3)))
    with pytest.raises(Exception) as in_reference:
        body(mask, 0, 3, -2.0)
    assert len(calls) == 4 and type(in_c.value) is type(in_reference.value)


def test_decode_program_makes_the_mask_in_c(monkeypatch):
    """A generation with the tiny Llama: once its decode steps share a GrowingRun, the mask is
    one of its C steps, and every token is the reference's."""
    import optimized
    from benchmarks.decoders import SIZES, build_llama
    from optimized.plan import CompiledRun
    from optimized.plan_shapes import GrowingRun
    from tests.test_generate_example import PROMPT, load_example, reference_generate

    calls = []
    kernel = cpu.KERNELS[KEY]
    monkeypatch.setitem(cpu.KERNELS, KEY, lambda *a, **k: calls.append(1) or kernel(*a, **k))
    ran = []
    real_run = CompiledRun.run
    monkeypatch.setattr(CompiledRun, "run", lambda self, feeds: ran.append(self) or real_run(
        self, feeds))
    model = build_llama(SIZES["tiny"])
    session = optimized.InferenceSession(model.SerializeToString())
    assert load_example().generate(session, PROMPT, 12) == reference_generate(model, PROMPT, 12)
    program = ran[-1]
    assert isinstance(program, GrowingRun) and not program.broken and len(ran) == 8
    in_python = {program.plan.steps[op[1]].node.op_type for op in program.ops if op[0] == PY}
    assert CAUSAL_PADDING_MASK not in in_python
    assert len(calls) == 12 - len(ran)  # the prompt and the decode steps before the program
