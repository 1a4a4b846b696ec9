"""silu_mlp_fusion on the SiLU-gated MLPs torch.onnx writes (Llama/Qwen/Mistral: separate gate
and up projections; Phi-3: one gate_up projection cut by Split or Slice), built node for node
with onnx.helper; patterns left alone; the C kernel behind the fused node."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import optimized
from optimized import kernels
from optimized.passes import optimize
from optimized.passes.silu_mlp_fusion import FUSED_DOMAIN, SILU_MUL, fuse_silu_mlp
from reference import ReferenceEvaluator

from .helpers import op_types

B, S, D, F = 2, 3, 8, 12  # batch, sequence, hidden, intermediate: all different


def value(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, list(shape))


def weight(rng, name, shape, dtype=np.float32):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(dtype), name)


def llama_mlp(opset=14, act_order=("gate", "sig"), product_order=("act", "up"),
              dtype=np.float32):
    """down(silu(gate(x)) * up(x)), silu(g) written Mul(g, Sigmoid(g)) as TorchScript and
    dynamo both write it; operand orders as given."""
    rng = np.random.default_rng(0)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    names = {"gate": "gate", "sig": "sig", "act": "act", "up": "up"}
    nodes = [
        helper.make_node("MatMul", ["x", "w_gate"], ["gate"], name="/mlp/gate_proj/MatMul"),
        helper.make_node("MatMul", ["x", "w_up"], ["up"], name="/mlp/up_proj/MatMul"),
        helper.make_node("Sigmoid", ["gate"], ["sig"], name="/mlp/act_fn/Sigmoid"),
        helper.make_node("Mul", [names[n] for n in act_order], ["act"], name="/mlp/act_fn/Mul"),
        helper.make_node("Mul", [names[n] for n in product_order], ["h"], name="/mlp/Mul"),
        helper.make_node("MatMul", ["h", "w_down"], ["y"], name="/mlp/down_proj/MatMul"),
    ]
    inits = [weight(rng, "w_gate", (D, F), dtype), weight(rng, "w_up", (D, F), dtype),
             weight(rng, "w_down", (F, D), dtype)]
    graph = helper.make_graph(nodes, "mlp", [value("x", (B, S, D), elem)],
                              [value("y", (B, S, D), elem)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def phi3_mlp(cut="Split", opset=14):
    """Phi-3: gate_up = x @ W (2F wide); gate, up = chunk(gate_up, 2); up * silu(gate)."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["x", "w_gate_up"], ["gate_up"])]
    inits = [weight(rng, "w_gate_up", (D, 2 * F)), weight(rng, "w_down", (F, D))]
    if cut == "Split":
        inits.append(numpy_helper.from_array(np.array([F, F], np.int64), "halves"))
        nodes.append(helper.make_node("Split", ["gate_up", "halves"], ["gate", "up"], axis=-1))
    else:
        for name, start, end in (("gate", 0, F), ("up", F, 2 * F)):
            for part, v in (("starts", start), ("ends", end), ("axes", -1)):
                inits.append(numpy_helper.from_array(np.array([v], np.int64), f"{name}_{part}"))
            nodes.append(helper.make_node("Slice", ["gate_up", f"{name}_starts", f"{name}_ends",
                                                    f"{name}_axes"], [name]))
    nodes += [helper.make_node("Sigmoid", ["gate"], ["sig"]),
              helper.make_node("Mul", ["gate", "sig"], ["act"]),
              helper.make_node("Mul", ["up", "act"], ["h"]),
              helper.make_node("MatMul", ["h", "w_down"], ["y"])]
    graph = helper.make_graph(nodes, "phi3_mlp", [value("x", (B, S, D))],
                              [value("y", (B, S, D))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


VARIANTS = {
    "torchscript": lambda: llama_mlp(opset=14),
    "dynamo": lambda: llama_mlp(opset=18, act_order=("gate", "sig"), product_order=("act", "up")),
    "operands_swapped": lambda: llama_mlp(act_order=("sig", "gate"), product_order=("up", "act")),
    "phi3_split": lambda: phi3_mlp("Split"),
    "phi3_slice": lambda: phi3_mlp("Slice"),
}


def feeds_for(model, seed=0):
    rng = np.random.default_rng(seed)
    return {i.name: (rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]) * 2)
            .astype(helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
            for i in model.graph.input}


def assert_same_outputs(original, rewritten, rtol=1e-5, atol=1e-6):
    """Valid ONNX computing what the original computes: by the reference, by onnxruntime with
    its own rewrites off, and by our session at level 99 on the original model."""
    onnx.checker.check_model(rewritten, full_check=True)
    feeds = feeds_for(original)
    [expected] = ReferenceEvaluator(original).run(None, feeds)
    runs = {"reference": ReferenceEvaluator(rewritten).run(None, feeds)[0]}
    options = optimized.SessionOptions()
    options.graph_optimization_level = optimized.GraphOptimizationLevel.ORT_ENABLE_ALL
    runs["optimized"] = optimized.InferenceSession(original.SerializeToString(),
                                                   options).run(None, feeds)[0]
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    if ort is not None:
        ort_options = ort.SessionOptions()
        ort_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        runs["onnxruntime"] = ort.InferenceSession(
            rewritten.SerializeToString(), ort_options,
            providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for name, got in runs.items():
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64),
                                   rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_exporter_variants_fuse(variant):
    model = VARIANTS[variant]()
    fused = fuse_silu_mlp(model)
    counts = op_types(fused)
    assert counts[f"{FUSED_DOMAIN}::{SILU_MUL}"] == 1 and "Sigmoid" not in counts
    assert counts["Mul"] == 0
    [node] = [n for n in fused.graph.node if n.op_type == SILU_MUL]
    assert list(node.input) == ["gate", "up"] and list(node.output) == ["h"]
    assert [f.name for f in fused.functions] == [SILU_MUL]
    assert_same_outputs(model, fused)


def test_float16_runs_the_function_body():
    model = llama_mlp(dtype=np.float16)
    fused = fuse_silu_mlp(model)
    assert op_types(fused)[f"{FUSED_DOMAIN}::{SILU_MUL}"] == 1
    # float16 outputs reach ~16, where one float16 ulp is 1/64: the runtimes round the three
    # MatMuls' products differently, so a few ulps of the largest output are allowed
    assert_same_outputs(model, fused, rtol=1e-2, atol=4 / 64)


def test_two_mlps_share_one_function():
    model = llama_mlp()
    second = onnx.ModelProto()
    second.CopyFrom(model)
    graph = model.graph
    renamed = []
    for node in second.graph.node:
        n = onnx.NodeProto()
        n.CopyFrom(node)
        n.input[:] = [i if i.startswith("w_") else (i if i == "x" else f"{i}2") for i in n.input]
        n.input[:] = ["y" if i == "x2" else i for i in n.input]
        n.output[:] = [f"{o}2" for o in n.output]
        n.name += "_2"
        renamed.append(n)
    graph.node.extend(renamed)
    graph.output[0].name = "y2"
    fused = fuse_silu_mlp(model)
    assert op_types(fused)[f"{FUSED_DOMAIN}::{SILU_MUL}"] == 2 and len(fused.functions) == 1
    assert_same_outputs(model, fused)


@pytest.mark.parametrize("name", ["sig", "act"])
def test_intermediate_graph_output_is_left_alone(name):
    model = llama_mlp()
    model.graph.output.append(value(name, (B, S, F)))
    assert op_types(fuse_silu_mlp(model)) == op_types(model)


def test_intermediate_read_by_another_node_is_left_alone():
    model = llama_mlp()
    model.graph.node.append(helper.make_node("Neg", ["sig"], ["neg"]))
    model.graph.output.append(value("neg", (B, S, F)))
    assert op_types(fuse_silu_mlp(model)) == op_types(model)


def test_broadcast_up_is_left_alone():
    """Mul(act, up) with up broadcast along an axis: not the elementwise product SiluMul takes."""
    model = llama_mlp()
    model.graph.node[1].CopyFrom(helper.make_node("ReduceMean", ["up_in"], ["up"], axes=[1]))
    model.graph.input.append(value("up_in", (B, S, F)))
    assert SILU_MUL not in {n.op_type for n in fuse_silu_mlp(model).graph.node}


def test_level_2_fuses_and_level_1_does_not():
    model = llama_mlp()
    assert SILU_MUL in {n.op_type for n in optimize(model, 2).graph.node}
    assert SILU_MUL not in {n.op_type for n in optimize(model, 1).graph.node}


def test_session_runs_the_c_kernel(monkeypatch):
    calls = []
    real = kernels.silu_mul
    monkeypatch.setattr(kernels, "silu_mul", lambda *a: calls.append(1) or real(*a))
    model = llama_mlp()
    feeds = feeds_for(model)
    options = optimized.SessionOptions()
    options.graph_optimization_level = optimized.GraphOptimizationLevel.ORT_ENABLE_ALL
    got = optimized.InferenceSession(model.SerializeToString(), options).run(None, feeds)[0]
    assert calls, "SiluMul ran through its function body"
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, feeds)[0], rtol=1e-5,
                               atol=1e-6)


def test_kernel_against_float64():
    """Within a few float32 roundings: sigmoid's own error (a few 1e-7, vmath.h) and two
    products."""
    rng = np.random.default_rng(3)
    gate = (rng.standard_normal((4, 5, 33)) * 6).astype(np.float32)
    up = rng.standard_normal((4, 5, 33)).astype(np.float32)
    g64 = gate.astype(np.float64)
    truth = g64 / (1 + np.exp(-g64)) * up
    for got in (kernels.silu_mul(gate, up), kernels.silu_mul(np.concatenate([gate, up], -1))):
        np.testing.assert_allclose(got, truth, rtol=2e-6, atol=1e-30)
    with pytest.raises(ValueError, match="up must have gate's shape"):
        kernels.silu_mul(gate, up[:, :, :5])
    with pytest.raises(ValueError, match="must be even"):
        kernels.silu_mul(gate)


def test_4bit_mlp_from_onnxruntimes_quantizer_fuses_and_agrees():
    """The Llama MLP with its three projections quantized to 4 bits by onnxruntime's
    MatMulNBitsQuantizer: the SiLU product between the MatMulNBits nodes fuses (their output
    shapes come from the passes' stand-in) and the level-99 session agrees with the reference."""
    pytest.importorskip("onnxruntime")
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = llama_mlp(opset=17)
    quantizer = MatMulNBitsQuantizer(model, bits=4, block_size=16, is_symmetric=False)
    quantizer.process()
    quantized = quantizer.model.model
    assert op_types(quantized)["com.microsoft::MatMulNBits"] == 3
    fused = optimize(quantized, 2)
    assert SILU_MUL in {n.op_type for n in fused.graph.node}
    feeds = feeds_for(quantized)
    [expected] = ReferenceEvaluator(quantized).run(None, feeds)
    options = optimized.SessionOptions()
    options.graph_optimization_level = optimized.GraphOptimizationLevel.ORT_ENABLE_ALL
    got = optimized.InferenceSession(quantized.SerializeToString(), options).run(None, feeds)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
