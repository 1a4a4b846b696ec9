"""The LayerNorm, Gelu, attention and bias + activation fusions on the node patterns exporters
really write (exporter_patterns): fused where they should be, left whole where a value inside
the pattern is read outside it, and a session at the highest level computes what the reference
evaluator computes on the original model."""
import collections

import numpy as np
import onnx
import pytest
from onnx import helper

import optimized
from conformance.inputs import random_inputs
from optimized.passes import optimize
from optimized.passes.attention_fusion import fuse_attention
from optimized.passes.gelu_fusion import fuse_gelu
from optimized.passes.layer_norm_fusion import fuse_layer_norm
from reference import ReferenceEvaluator

from . import exporter_patterns as patterns
from .helpers import assert_same_outputs, op_types

FAMILIES = {  # cases, the rewrite under test
    "layer_norm": (patterns.LAYER_NORM_CASES, fuse_layer_norm),
    "gelu": (patterns.GELU_CASES, fuse_gelu),
    "attention": (patterns.ATTENTION_CASES, fuse_attention),
    # the bias folds into Conv/Gemm first (conv_affine_folding, matmul_add_to_gemm): level 2
    "bias_activation": (patterns.BIAS_ACTIVATION_CASES, lambda model: optimize(model, 2)),
}
CASES = [(family, name) for family, (cases, _) in FAMILIES.items() for name in cases]
IDS = [f"{family}-{name}" for family, name in CASES]


def build(family, name):
    cases, rewrite = FAMILIES[family]
    return cases[name](), rewrite


def feeds_for(case):
    return {**random_inputs(case.model, seed=3), **case.feeds}


def tolerance(model):
    """float32 by default; the float16 LayerNorm rounds its normalized value once where the
    decomposition rounded it before the scale and shift too."""
    low = any(i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 for i in model.graph.input)
    return {"rtol": 4e-3, "atol": 4e-3} if low else {"rtol": 1e-4, "atol": 1e-5}


@pytest.mark.parametrize("family,name", CASES, ids=IDS)
def test_fused_as_expected(family, name):
    case, rewrite = build(family, name)
    fused = rewrite(case.model)
    counts = op_types(fused)
    for op_type, count in case.fused.items():
        assert counts[op_type] == count, (op_type, counts)
    assert not set(case.gone) & set(counts), counts
    feeds = feeds_for(case)
    assert_same_outputs(case.model, fused, feeds=feeds, **tolerance(case.model))


@pytest.mark.parametrize("family,name", CASES, ids=IDS)
def test_session_matches_the_reference(family, name):
    case, _ = build(family, name)
    feeds = feeds_for(case)
    expected = ReferenceEvaluator(case.model).run(None, feeds)
    options = optimized.SessionOptions()
    options.graph_optimization_level = optimized.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = optimized.InferenceSession(case.model.SerializeToString(), options)
    got = session.run(None, feeds)
    for e, g in zip(expected, got, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, **tolerance(case.model))


def with_outside_reader(model, name):
    """`model` with `name` also read by a node outside the pattern that is a graph output: a Neg,
    or a ReduceSum to a scalar where shape inference does not know the value's shape."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type for v in list(inferred.graph.value_info) + list(
        inferred.graph.input)}
    if types[name].tensor_type.HasField("shape"):
        model.graph.node.append(helper.make_node("Neg", [name], ["outside"]))
        model.graph.output.append(helper.make_value_info("outside", types[name]))
    else:
        model.graph.node.append(helper.make_node("ReduceSum", [name], ["outside"], keepdims=0))
        model.graph.output.append(helper.make_tensor_value_info(
            "outside", types[name].tensor_type.elem_type, []))
    return model


READ_OUTSIDE = [(family, name, i) for family, name in CASES
                for i in range(len(build(family, name)[0].intermediates))]


@pytest.mark.parametrize("family,name,which", READ_OUTSIDE,
                         ids=[f"{f}-{n}-{i}" for f, n, i in READ_OUTSIDE])
def test_left_whole_when_an_intermediate_is_read_outside(family, name, which):
    case, rewrite = build(family, name)
    model = with_outside_reader(case.model, case.intermediates[which])
    rewritten = rewrite(model)
    fused_ops = set(case.fused)
    assert not fused_ops & set(op_types(rewritten)), op_types(rewritten)
    assert_same_outputs(model, rewritten, feeds=feeds_for(case), **tolerance(model))


def test_every_family_has_cases_that_can_be_left_whole():
    # the left-alone test above is not vacuous: each family names intermediates to read
    per_family = collections.Counter(family for family, _, _ in READ_OUTSIDE)
    assert set(per_family) == set(FAMILIES)


# --- what each family leaves as it is, and why -----------------------------------------------
def test_gpt2_past_present_form_is_left_unfused():
    # MultiHeadAttention can take past_key/past_value, but the optimized CPU kernel runs the
    # cache-free form only: the fused node would fall back to the reference op, slower than the
    # separate MatMul/Softmax kernels. Until the kernel takes a cache the pattern stays.
    case = patterns.attention_gpt2_past()
    rewritten = fuse_attention(case.model)
    assert op_types(rewritten) == op_types(case.model)
    assert_same_outputs(case.model, rewritten, feeds=feeds_for(case))


def test_gemm_relu6_keeps_its_clip():
    # onnxruntime's FusedGemm has no Clip activation (its kernel rejects it), so Gemm + Clip stays
    case = patterns.dense_activation("Clip6", opset=13)
    counts = op_types(optimize(case.model, 2))
    assert counts["Gemm"] == 1 and counts["Clip"] == 1


def test_opset_17_layer_norm_needs_no_rewrite_and_keeps_its_attributes():
    case = patterns.layer_norm_torch_17()
    assert fuse_layer_norm(case.model) == case.model


def test_tf_moments_layer_norm_takes_gamma_beta_and_epsilon():
    case = patterns.layer_norm_tf(13)
    fused = fuse_layer_norm(case.model)
    node = next(n for n in fused.graph.node if n.op_type == "LayerNormalization")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["axis"] == 2 and attrs["epsilon"] == pytest.approx(1e-3)
    assert len(node.input) == 3 and node.input[0] == case.model.graph.node[0].output[0]


def attrs_of(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("name", patterns.ATTENTION_CASES)
def test_attention_scale_is_one_over_root_head_size(name):
    # however the exporter spreads it (on the scores, on Q and K^T, computed from Shape(query))
    fused = fuse_attention(patterns.ATTENTION_CASES[name]().model)
    node = next(n for n in fused.graph.node if n.op_type == "MultiHeadAttention")
    attrs = attrs_of(node)
    assert attrs["num_heads"] == patterns.HEADS
    assert attrs["scale"] == pytest.approx(1 / np.sqrt(patterns.HEAD), rel=1e-6)


def test_float16_layer_norm_reads_the_float16_input_and_scale():
    fused = fuse_layer_norm(patterns.layer_norm_dynamo_fp16().model)
    node = next(n for n in fused.graph.node if n.op_type == "LayerNormalization")
    assert node.input[0] == "x"  # the graph input itself, the casts gone
    inits = {i.name: i for i in fused.graph.initializer}
    assert all(inits[name].data_type == onnx.TensorProto.FLOAT16 for name in node.input[1:])


def test_layer_norm_without_affine_gets_a_scale_of_ones_and_no_bias():
    fused = fuse_layer_norm(patterns.layer_norm_torch(17, affine="none").model)
    node = next(n for n in fused.graph.node if n.op_type == "LayerNormalization")
    scale = next(i for i in fused.graph.initializer if i.name == node.input[1])
    assert len(node.input) == 2
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(scale),
                                  np.ones(patterns.D, np.float32))


def test_dynamic_axes_attention_holds_at_other_lengths():
    # the padding mask is expanded to as many rows as this run's query has
    case = patterns.attention_bert_dynamic()
    rng = np.random.default_rng(5)
    keep = (rng.random((3, 7)) > 0.3).astype(np.int64)
    keep[:, 0] = 1
    feeds = {"x": rng.standard_normal((3, 7, patterns.HIDDEN)).astype(np.float32), "mask": keep}
    fused = fuse_attention(case.model)
    assert op_types(fused)["com.microsoft::MultiHeadAttention"] == 1
    assert_same_outputs(case.model, fused, feeds=feeds)
    options = optimized.SessionOptions()
    options.graph_optimization_level = optimized.GraphOptimizationLevel.ORT_ENABLE_ALL
    got = optimized.InferenceSession(case.model.SerializeToString(), options).run(None, feeds)
    np.testing.assert_allclose(got[0], ReferenceEvaluator(case.model).run(None, feeds)[0],
                               rtol=1e-4, atol=1e-5)
