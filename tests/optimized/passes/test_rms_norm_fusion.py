"""rms_norm_fusion on RMSNorm as torch.onnx (TorchScript and dynamo) writes it for Llama-, Qwen-
and Phi-3-style models, built node for node with onnx.helper; the fused node each opset gets;
patterns left alone; and the C kernel behind the fused ops (and behind the same ops as
onnxruntime's transformers optimizer writes them), judged by the bound policy of
reference/agreement.py against the reference's SimplifiedLayerNormalization in float64.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import optimized
from optimized import kernels
from optimized.passes import optimize
from optimized.passes.rms_norm_fusion import fuse_rms_norm
from reference import ReferenceEvaluator, agreement
from reference.ops.contrib import simplified_layer_normalization

from .helpers import op_types

B, S, D = 2, 5, 16  # batch, sequence, hidden: all different so an axis mix-up shows
EPS = 1e-6


class Graph:
    """A node list being written the way an exporter writes it."""

    def __init__(self, constants_as_nodes=True):
        self.nodes, self.initializers, self.count = [], [], 0
        self.constants_as_nodes = constants_as_nodes  # TorchScript: Constant nodes

    def node(self, op_type, inputs, domain="", **attrs) -> str:
        self.count += 1
        out = f"{op_type.lower()}_{self.count}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"/{op_type}_{self.count}",
                                           domain=domain, **attrs))
        return out

    def const(self, value, dtype=np.float32) -> str:
        tensor = numpy_helper.from_array(np.asarray(value, dtype))
        if self.constants_as_nodes:
            return self.node("Constant", [], value=tensor)
        tensor.name = f"const_{len(self.initializers)}"
        self.initializers.append(tensor)
        return tensor.name

    def weight(self, rng, dtype=np.float32) -> str:
        tensor = numpy_helper.from_array((1 + 0.1 * rng.standard_normal(D)).astype(dtype),
                                         f"weight_{len(self.initializers)}")
        self.initializers.append(tensor)
        return tensor.name

    def model(self, inputs, outputs, opset):
        graph = helper.make_graph(self.nodes, "decoder", inputs, outputs, self.initializers)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def rms(g, x, rng, *, square="Pow", inverse="Reciprocal", axes_input=False, eps_like=False,
        low=None, weight="before", cast_back_after_weight=False):
    """LlamaRMSNorm: x.float(); x * rsqrt(mean(x^2, -1) + eps); weight * x.to(input_dtype).
    inverse: "Reciprocal" (dynamo), "DivOne" (TorchScript's rsqrt) or "Div" (x / sqrt)."""
    xf = g.node("Cast", [x], to=TensorProto.FLOAT) if low is not None else x
    sq = g.node("Pow", [xf, g.const(2.0)]) if square == "Pow" else g.node("Mul", [xf, xf])
    if axes_input:
        ms = g.node("ReduceMean", [sq, g.const([-1], np.int64)], keepdims=1)
    else:
        ms = g.node("ReduceMean", [sq], axes=[-1], keepdims=1)
    eps = g.node("CastLike", [g.const(EPS, np.float64), ms]) if eps_like else g.const(EPS)
    std = g.node("Sqrt", [g.node("Add", [ms, eps])])
    if inverse == "Div":
        normed = g.node("Div", [xf, std])
    else:
        inv = g.node("Reciprocal", [std]) if inverse == "Reciprocal" else g.node(
            "Div", [g.const(1.0), std])
        normed = g.node("Mul", [xf, inv])
    if low is not None and not cast_back_after_weight:
        normed = g.node("Cast", [normed], to=low)
    if weight == "before":
        normed = g.node("Mul", [g.weight(rng, _np(low)), normed])
    elif weight == "after":
        normed = g.node("Mul", [normed, g.weight(rng, _np(low if not cast_back_after_weight
                                                        else None))])
    if low is not None and cast_back_after_weight:
        normed = g.node("Cast", [normed], to=low)
    return normed


def _np(onnx_type):
    return np.float32 if onnx_type is None else helper.tensor_dtype_to_np_dtype(onnx_type)


def value(name, elem=TensorProto.FLOAT, shape=(B, S, D)):
    return helper.make_tensor_value_info(name, elem, list(shape))


def single_norm(opset=14, low=None, constants_as_nodes=True, **kwargs):
    rng = np.random.default_rng(0)
    g = Graph(constants_as_nodes)
    elem = TensorProto.FLOAT if low is None else low
    y = rms(g, "x", rng, low=low, **kwargs)
    return g.model([value("x", elem)], [value(y, elem)], opset)


def decoder_layer(opset=14, sum_needed=True, **kwargs):
    """h = a + b (the residual); n = RMSNorm(h); out = h + n @ W (when the sum is needed
    downstream) or n @ W."""
    rng = np.random.default_rng(1)
    g = Graph()
    h = g.node("Add", ["a", "b"])
    n = rms(g, h, rng, **kwargs)
    w = numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32) * 0.2, "proj")
    g.initializers.append(w)
    proj = g.node("MatMul", [n, "proj"])
    out = g.node("Add", [h, proj]) if sum_needed else proj
    return g.model([value("a"), value("b")], [value(out)], opset)


VARIANTS = {
    # torch.onnx.export(dynamo=False), opset 14: Constant nodes, axes attribute, rsqrt as
    # Div(1, Sqrt), weight * x
    "torchscript": lambda: single_norm(opset=14, inverse="DivOne"),
    "torchscript_mul_square": lambda: single_norm(opset=14, inverse="DivOne", square="Mul"),
    "torchscript_div": lambda: single_norm(opset=14, inverse="Div", weight="after"),
    "torchscript_no_weight": lambda: single_norm(opset=14, inverse="Div", weight=None),
    # torch.onnx.export(dynamo=True), opset 18: initializers, axes input, CastLike'd literals,
    # Reciprocal
    "dynamo": lambda: single_norm(opset=18, constants_as_nodes=False, axes_input=True,
                                  eps_like=True),
    # half-precision Llama: x.float() ... .to(float16), weight in float16
    "dynamo_fp16": lambda: single_norm(opset=18, constants_as_nodes=False, axes_input=True,
                                       low=TensorProto.FLOAT16),
    "torchscript_fp16_cast_last": lambda: single_norm(opset=17, low=TensorProto.FLOAT16,
                                                      weight="after",
                                                      cast_back_after_weight=True),
}


def fused_ops(model):
    return {k: v for k, v in op_types(model).items()
            if "Normalization" in k}


def check_model(model):
    """onnx's full check; ai.onnx SimplifiedLayerNormalization (onnxruntime's, unknown to onnx)
    checked under a domain of its own."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    if any(n.op_type == "SimplifiedLayerNormalization" and n.domain == "" for n in
           model.graph.node):
        for n in model.graph.node:
            if n.op_type == "SimplifiedLayerNormalization":
                n.domain = "onnxruntime.simplified"
        model.opset_import.append(helper.make_opsetid("onnxruntime.simplified", 1))
    onnx.checker.check_model(model, full_check=True)


def feeds_for(model, seed=0):
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
            .astype(helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
            for i in model.graph.input}


def assert_same_outputs(original, rewritten, rtol=1e-5, atol=1e-5):
    """The rewrite computes what the original computes: by the reference, by onnxruntime with
    its own rewrites off, and by our session at level 99 on the original model."""
    check_model(rewritten)
    feeds = feeds_for(original)
    expected = ReferenceEvaluator(original).run(None, feeds)
    for e, g in zip(expected, ReferenceEvaluator(rewritten).run(None, feeds)):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol,
                                   atol=atol)
    options = optimized.SessionOptions()
    options.graph_optimization_level = optimized.GraphOptimizationLevel.ORT_ENABLE_ALL
    ours = optimized.InferenceSession(original.SerializeToString(), options).run(None, feeds)
    for e, g in zip(expected, ours):
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol,
                                   atol=atol)
    try:
        import onnxruntime as ort
    except ImportError:
        return
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(rewritten.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    for e, g in zip(expected, session.run(None, feeds)):
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol,
                                   atol=atol)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_exporter_variants_fuse(variant):
    model = VARIANTS[variant]()
    fused = fuse_rms_norm(model)
    assert fused_ops(fused) == {"SimplifiedLayerNormalization": 1}, op_types(fused)
    assert not {"Pow", "Sqrt", "ReduceMean", "Reciprocal", "Cast"} & set(op_types(fused))
    [node] = [n for n in fused.graph.node if n.op_type == "SimplifiedLayerNormalization"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["axis"] == 2 and attrs["epsilon"] == pytest.approx(EPS)
    low = "fp16" in variant
    assert_same_outputs(model, fused, rtol=2e-3 if low else 1e-5, atol=2e-3 if low else 1e-5)


def test_opset_23_gets_rms_normalization():
    model = single_norm(opset=23, constants_as_nodes=False, axes_input=True)
    fused = fuse_rms_norm(model)
    assert fused_ops(fused) == {"RMSNormalization": 1}, op_types(fused)
    assert_same_outputs(model, fused)


@pytest.mark.parametrize("opset", [14, 18, 23])
def test_residual_sum_needed_downstream_goes_into_skip_form(opset):
    model = decoder_layer(opset=opset, axes_input=opset >= 18)
    fused = fuse_rms_norm(model)
    assert fused_ops(fused) == {"com.microsoft::SkipSimplifiedLayerNormalization": 1}
    [skip] = [n for n in fused.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    assert list(skip.input[:2]) == ["a", "b"] and len(skip.output) == 4 and skip.output[3]
    # the residual Add now reads the fused node's sum
    assert op_types(fused)["Add"] == 1
    assert_same_outputs(model, fused)


def test_residual_sum_read_only_by_the_norm_leaves_no_sum_output():
    model = decoder_layer(sum_needed=False, inverse="DivOne")
    fused = fuse_rms_norm(model)
    [skip] = [n for n in fused.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    assert list(skip.output[1:]) == [] and "Add" not in op_types(fused)
    assert_same_outputs(model, fused)


def test_residual_sum_read_before_the_norm_ends_keeps_the_add():
    """A reader of the sum that runs before the pattern's last node could not read the fused
    node's output: the Add stays and the norm fuses alone."""
    rng = np.random.default_rng(2)
    g = Graph()
    h = g.node("Add", ["a", "b"])
    early = g.node("Relu", [h])  # before the norm's nodes in the list
    n = rms(g, h, rng)
    model = g.model([value("a"), value("b")], [value(n), value(early)], 14)
    fused = fuse_rms_norm(model)
    assert fused_ops(fused) == {"SimplifiedLayerNormalization": 1}
    assert op_types(fused)["Add"] == 1
    assert_same_outputs(model, fused)


def _with_extra_output(model, name):
    model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    return model


@pytest.mark.parametrize("op_type", ["Sqrt", "Reciprocal", "ReduceMean", "Pow"])
def test_intermediate_read_outside_is_left_alone(op_type):
    model = single_norm(opset=14)
    inner = next(n for n in model.graph.node if n.op_type == op_type)
    model = _with_extra_output(model, inner.output[0])
    fused = fuse_rms_norm(model)
    assert not fused_ops(fused)
    assert op_types(fused) == op_types(model)


def test_intermediate_read_by_another_node_is_left_alone():
    rng = np.random.default_rng(3)
    g = Graph()
    y = rms(g, "x", rng)
    std = next(n for n in g.nodes if n.op_type == "Sqrt").output[0]
    other = g.node("Neg", [std])
    model = g.model([value("x")], [value(y), value(other, shape=(B, S, 1))], 14)
    assert not fused_ops(fuse_rms_norm(model))


def test_mean_over_another_axis_is_left_alone():
    g = Graph()
    sq = g.node("Pow", ["x", g.const(2.0)])
    ms = g.node("ReduceMean", [sq], axes=[1], keepdims=1)
    std = g.node("Sqrt", [g.node("Add", [ms, g.const(EPS)])])
    y = g.node("Div", ["x", std])
    model = g.model([value("x")], [value(y)], 14)
    assert not fused_ops(fuse_rms_norm(model))


def test_level_2_fuses_and_level_1_does_not():
    model = decoder_layer(opset=14)
    assert "com.microsoft::SkipSimplifiedLayerNormalization" in op_types(optimize(model, 2))
    assert not fused_ops(optimize(model, 1))


# the kernel behind the fused ops --------------------------------------------------------------
def assert_agrees(model, feeds, got, truths):
    """The bound policy's verdict on the one node's outputs against float64 truths."""
    node = model.graph.node[0]
    opset = max(o.version for o in model.opset_import)
    verdict = agreement.judge(node, opset, [feeds[name] for name in node.input], got, truths)
    assert verdict.ok, verdict.message()


def one_node_model(op_type, inputs, outputs, opset, domain="", **attrs):
    names = [n for n, _ in inputs]
    node = helper.make_node(op_type, names, [o for o, _ in outputs], domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(v.shape)) for n, v in inputs],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(s)) for o, s in outputs])
    imports = [helper.make_opsetid("", opset)] + (
        [helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=imports)


def run_counting(monkeypatch, model, feeds):
    calls = []
    real = kernels.rms_norm
    monkeypatch.setattr(kernels, "rms_norm", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    outs = optimized.InferenceSession(model.SerializeToString()).run(None, feeds)
    assert calls, "the fused op ran as the reference op"
    return outs


def truth_of(x, scale, axis=-1, skip=None, bias=None):
    s = x.astype(np.float64) + (0 if skip is None else skip) + (0 if bias is None else bias)
    y, inv = simplified_layer_normalization(s, scale.astype(np.float64), axis=axis, epsilon=EPS)
    return y, inv, s


@pytest.mark.parametrize("op_type,domain,opset", [
    ("SimplifiedLayerNormalization", "", 17),  # onnxruntime's optimizer writes this one
    ("SimplifiedLayerNormalization", "com.microsoft", 17),
    ("RMSNormalization", "", 23),
])
def test_kernel_for_written_norms(monkeypatch, op_type, domain, opset):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((B, S, D), dtype=np.float32) * 3
    scale = rng.standard_normal(D, dtype=np.float32)
    outputs = [("y", (B, S, D))] + ([("inv", (B, S, 1))] if op_type != "RMSNormalization" else [])
    model = one_node_model(op_type, [("x", x), ("scale", scale)], outputs, opset, domain,
                           axis=-1, epsilon=EPS)
    feeds = {"x": x, "scale": scale}
    got = run_counting(monkeypatch, model, feeds)
    y, inv, _ = truth_of(x, scale)
    assert [g.shape for g in got] == [(B, S, D), (B, S, 1)][:len(got)]
    assert_agrees(model, feeds, got, [y, inv][:len(got)])


def test_kernel_over_two_trailing_axes(monkeypatch):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((B, S, D), dtype=np.float32)
    scale = rng.standard_normal((S, D), dtype=np.float32)
    model = one_node_model("RMSNormalization", [("x", x), ("scale", scale)],
                           [("y", (B, S, D))], 23, axis=1, epsilon=EPS)
    feeds = {"x": x, "scale": scale}
    got = run_counting(monkeypatch, model, feeds)
    assert_agrees(model, feeds, got, [truth_of(x, scale, axis=1)[0]])


@pytest.mark.parametrize("with_bias", [False, True])
def test_kernel_for_skip_form(monkeypatch, with_bias):
    rng = np.random.default_rng(6)
    x, skip = (rng.standard_normal((B, S, D), dtype=np.float32) for _ in range(2))
    gamma = rng.standard_normal(D, dtype=np.float32)
    bias = rng.standard_normal(D, dtype=np.float32) if with_bias else None
    inputs = [("x", x), ("skip", skip), ("gamma", gamma)] + ([("bias", bias)] if with_bias else [])
    model = one_node_model("SkipSimplifiedLayerNormalization", inputs,
                           [("y", (B, S, D)), ("mean", (B, S, 1)), ("inv", (B, S, 1)),
                            ("sum", (B, S, D))], 17, "com.microsoft", epsilon=EPS)
    got = run_counting(monkeypatch, model, dict(inputs))
    want_y, want_inv, want_sum = truth_of(x, gamma, skip=skip, bias=bias)
    assert_agrees(model, dict(inputs), got, [want_y, np.zeros((B, S, 1)), want_inv, want_sum])
    total = got[3]
    # the sum is two (three) float32 additions, as the reference rounds them
    expected_sum = x + skip + (0 if bias is None else bias)
    np.testing.assert_array_equal(total, expected_sum)


def test_kernel_rejects_bad_arguments():
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match="scale must hold 8 values"):
        kernels.rms_norm(x, np.ones(7, np.float32))
    with pytest.raises(ValueError, match="skip must have the input's shape"):
        kernels.rms_norm(x, np.ones(8, np.float32), skip=np.zeros((2, 7), np.float32))
    with pytest.raises(ValueError, match="belong to the skip form"):
        kernels.rms_norm(x, np.ones(8, np.float32), return_sum=True)
    with pytest.raises(TypeError, match="X must be float32"):
        kernels.rms_norm(x.astype(np.float64), np.ones(8, np.float32))


def test_residual_after_a_4bit_projection_fuses():
    """In a 4-bit model the residual branch ends in com.microsoft MatMulNBits, which onnx's
    shape inference does not know: the passes' shape stand-in lets the norm after it fuse."""
    rng = np.random.default_rng(7)
    g = Graph()
    blocks = (D + 31) // 32
    codes = rng.integers(0, 256, (D, blocks, 16), dtype=np.uint8)
    scales = (rng.random(D * blocks) * 0.1).astype(np.float32)
    g.initializers += [numpy_helper.from_array(codes, "o_proj_q"),
                       numpy_helper.from_array(scales, "o_proj_scales")]
    g.nodes.append(helper.make_node("MatMulNBits", ["x", "o_proj_q", "o_proj_scales"], ["o_proj"],
                                    domain="com.microsoft", K=D, N=D, bits=4, block_size=32))
    h = g.node("Add", ["x", "o_proj"])
    y = rms(g, h, rng)
    out = g.node("Add", [h, y])
    model = g.model([value("x")], [value(out)], 17)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    fused = fuse_rms_norm(model)
    assert fused_ops(fused) == {"com.microsoft::SkipSimplifiedLayerNormalization": 1}
    assert_same_outputs(model, fused)
