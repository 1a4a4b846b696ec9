"""gate_up_halves on Phi-3's MLP as the exporters cut its gate_up projection (two Slices, one
Split with sizes or without), the cuts it must leave alone, and the C step that reads the
halves in place (against the reference, shapes and thread counts by hypothesis)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import optimized
from optimized import kernels
from optimized.cpu import C_STEPS, KERNELS
from optimized.passes import optimize
from optimized.passes.gate_up_halves import SILU_MUL_HALVES, fuse_gate_up_halves
from optimized.passes.silu_mlp_fusion import FUSED_DOMAIN, SILU_MUL, fuse_silu_mlp
from optimized.plan import C, Plan
from reference import ReferenceEvaluator

from .helpers import op_types

B, S, D, F = 2, 3, 8, 12  # batch, sequence, hidden, intermediate: all different
INT64_MAX = np.iinfo(np.int64).max


def const(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def phi3_mlp(cut="slices", opset=18, b=B, s=S, d=D, f=F, bounds=((0, F), (F, INT64_MAX)),
             axis=-1, seed=1):
    """down(up * silu(gate)), gate and up cut from gate_up = x @ W (2f wide) as given:
    "slices" (Slice bounds `bounds` on `axis`), "split_sizes" (Split with a sizes input) or
    "split_equal" (no sizes: num_outputs at opset 18, equal parts before)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((d, 2 * f)) * 0.5).astype(np.float32),
                                     "w_gate_up"),
             numpy_helper.from_array((rng.standard_normal((f, d)) * 0.5).astype(np.float32),
                                     "w_down")]
    nodes = [helper.make_node("MatMul", ["x", "w_gate_up"], ["gate_up"])]
    if cut == "slices":
        for name, (start, end) in zip(("gate", "up"), bounds):
            inits += [const(f"{name}_starts", [start]), const(f"{name}_ends", [end]),
                      const(f"{name}_axes", [axis])]
            nodes.append(helper.make_node("Slice", ["gate_up", f"{name}_starts", f"{name}_ends",
                                                    f"{name}_axes"], [name]))
    elif cut == "split_sizes":
        inits.append(const("halves", [f, f]))
        nodes.append(helper.make_node("Split", ["gate_up", "halves"], ["gate", "up"], axis=axis))
    else:
        extra = {"num_outputs": 2} if opset >= 18 else {}
        nodes.append(helper.make_node("Split", ["gate_up"], ["gate", "up"], axis=axis, **extra))
    nodes += [helper.make_node("Sigmoid", ["gate"], ["sig"]),
              helper.make_node("Mul", ["gate", "sig"], ["act"]),
              helper.make_node("Mul", ["up", "act"], ["h"]),
              helper.make_node("MatMul", ["h", "w_down"], ["y"])]
    graph = helper.make_graph(
        nodes, "phi3_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, s, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, s, d])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def feeds_for(model, seed=0):
    [x] = model.graph.input
    shape = [dim.dim_value for dim in x.type.tensor_type.shape.dim]
    return {"x": (np.random.default_rng(seed).standard_normal(shape) * 2).astype(np.float32)}


def session_run(model, feeds, threads=1, runs=4):
    """The last of `runs` runs at level 99 (from the third on, the compiled step table)."""
    options = optimized.SessionOptions()
    options.intra_op_num_threads = threads
    session = optimized.InferenceSession(model.SerializeToString(), options)
    for _ in range(runs):
        got = session.run(None, feeds)[0]
    return got


def assert_same_outputs(original, rewritten):
    """Valid ONNX computing what the original computes: by the reference, by onnxruntime with
    its own rewrites off, and by our session at level 99 on the original model."""
    onnx.checker.check_model(rewritten, full_check=True)
    feeds = feeds_for(original)
    expected = ReferenceEvaluator(original).run(None, feeds)[0]
    runs = {"reference": ReferenceEvaluator(rewritten).run(None, feeds)[0],
            "optimized": session_run(original, feeds)}
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    if ort is not None:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        runs["onnxruntime"] = ort.InferenceSession(
            rewritten.SerializeToString(), options,
            providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for name, got in runs.items():
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=name)


def halves_fused(model):
    return fuse_gate_up_halves(fuse_silu_mlp(model))


VARIANTS = {
    "dynamo_slices": lambda: phi3_mlp("slices"),
    "slices_negative_bounds": lambda: phi3_mlp("slices", bounds=((-2 * F, -F), (-F, 2 * F))),
    "slices_axis_2": lambda: phi3_mlp("slices", axis=2, opset=14),
    "torchscript_split_sizes": lambda: phi3_mlp("split_sizes", opset=14),
    "split_num_outputs": lambda: phi3_mlp("split_equal", opset=18),
    "split_equal_opset13": lambda: phi3_mlp("split_equal", opset=13),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_exporter_cuts_fuse(variant):
    model = VARIANTS[variant]()
    fused = halves_fused(model)
    counts = op_types(fused)
    assert counts[f"{FUSED_DOMAIN}::{SILU_MUL_HALVES}"] == 1
    assert not {"Slice", "Split", f"{FUSED_DOMAIN}::{SILU_MUL}"} & set(counts)
    [node] = [n for n in fused.graph.node if n.op_type == SILU_MUL_HALVES]
    assert list(node.input) == ["gate_up"] and list(node.output) == ["h"]
    assert [f.name for f in fused.functions] == [SILU_MUL, SILU_MUL_HALVES] or (
        [f.name for f in fused.functions] == [SILU_MUL_HALVES])
    assert_same_outputs(model, fused)


def left_alone(model):
    after_silu = fuse_silu_mlp(model)
    assert op_types(after_silu)[f"{FUSED_DOMAIN}::{SILU_MUL}"] == 1
    return op_types(fuse_gate_up_halves(after_silu)) == op_types(after_silu)


@pytest.mark.parametrize("bounds", [((F, 2 * F), (0, F)),  # halves swapped: gate is x[h:]
                                    ((1, F + 1), (F, 2 * F))])  # overlapping, not halves
def test_other_cuts_are_left_alone(bounds):
    model = phi3_mlp("slices", bounds=bounds)
    assert left_alone(model)
    assert_same_outputs(model, halves_fused(model))


def test_cut_on_another_axis_is_left_alone():
    """gate_up 2F wide on its last axis, cut in halves along axis 1 (S = 4 rows)."""
    model = phi3_mlp("slices", s=4, bounds=((0, 2), (2, 4)), axis=1)
    model.graph.node[-1].input[0] = "h_wide"
    graph = model.graph
    graph.initializer.append(numpy_helper.from_array(
        np.random.default_rng(2).standard_normal((2 * F, D)).astype(np.float32), "w_wide"))
    graph.node[-1].CopyFrom(helper.make_node("MatMul", ["h", "w_wide"], ["y"]))
    graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, 2, D]))
    assert left_alone(model)


@pytest.mark.parametrize("half", ["gate", "up"])
def test_half_read_elsewhere_is_left_alone(half):
    model = phi3_mlp("slices")
    model.graph.node.append(helper.make_node("Neg", [half], ["neg"]))
    model.graph.output.append(helper.make_tensor_value_info("neg", TensorProto.FLOAT, [B, S, F]))
    assert left_alone(model)
    assert_same_outputs(model, halves_fused(model))


def test_half_as_graph_output_is_left_alone():
    model = phi3_mlp("split_sizes")
    model.graph.output.append(helper.make_tensor_value_info("up", TensorProto.FLOAT, [B, S, F]))
    assert left_alone(model)


def test_level_2_fuses():
    assert SILU_MUL_HALVES in {n.op_type for n in optimize(phi3_mlp(), 2).graph.node}
    assert SILU_MUL_HALVES not in {n.op_type for n in optimize(phi3_mlp(), 1).graph.node}


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 3), s=st.integers(1, 40), f=st.integers(1, 70),
       threads=st.sampled_from([1, 2]), cut=st.sampled_from(["slices", "split_sizes"]),
       seed=st.integers(0, 2**16))
def test_step_reads_halves_in_place(b, s, f, threads, cut, seed):
    """The plan's step table runs the C step over gate_up's rows (2f apart) and gives the
    Python plan's results bit for bit, and the reference's."""
    model = phi3_mlp(cut, b=b, s=s, f=f, bounds=((0, f), (f, INT64_MAX)), seed=seed)
    fused = optimize(model, 2)
    assert op_types(fused)[f"{FUSED_DOMAIN}::{SILU_MUL_HALVES}"] == 1
    feeds = feeds_for(model, seed)
    in_c, in_python = Plan(fused, KERNELS, c_steps=C_STEPS), Plan(fused, KERNELS)
    before = kernels.get_num_threads()
    kernels.set_num_threads(threads)
    try:
        for _ in range(3):  # the first records, the second compiles, the third runs the table
            got = in_c.run(dict(feeds))[0]
        want = in_python.run(dict(feeds))[0]
    finally:
        kernels.set_num_threads(before)
    key = tuple((n, v.shape, v.dtype) for n, v in feeds.items())
    program = in_c._programs.get(key)
    # one C call for all three steps: a step whose description gives other results than its
    # recorded run runs in Python instead
    assert program is not None and not program.broken and [op[0] for op in program.ops] == [C]
    assert got.tobytes() == want.tobytes()
    # two MatMuls summing up to 140 float32 products of magnitude up to ~10, in another order
    # than numpy's: rounding alone reaches 1e-5 where a sum cancels (b=1, s=16, f=65, seed=1
    # gave 1.06e-5 at a value of 0.019), so the bound is 10x that
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, feeds)[0],
                               rtol=1e-5, atol=1e-4)
