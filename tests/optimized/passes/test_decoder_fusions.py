"""The rotary and grouped-query attention fusions on decoder blocks in the node patterns
torch.onnx's dynamo and TorchScript exporters write for Llama, Qwen2, Mistral and Phi-3
(tests/models/decoder_exports.py): fused where they should be, left whole where a value inside
a pattern is read outside it, the rewritten model computing what the original computes (by the
reference evaluator, and by onnxruntime when installed), and a level-2 session running the
fused nodes on the C kernels and agreeing with the reference evaluator on the original."""
import numpy as np
import onnx
import pytest
from onnx import helper

import optimized
from optimized import kernels
from optimized.passes import optimize
from optimized.passes.gqa_fusion import fuse_grouped_attention
from optimized.passes.rotary_fusion import fuse_rotary
from reference import ReferenceEvaluator
from tests.models.decoder_exports import (
    VARIANTS,
    DecoderConfig,
    build_decoder,
    build_ort_contrib,
    decoder_feeds,
    ort_contrib_feeds,
)

from .helpers import assert_same_outputs, op_types

FUSED = "onnx_parity.fused::"
# float32 attention: the fused kernel sums in another order than MatMul + Softmax + MatMul
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def attention_op(config):
    return FUSED + ("GroupedAttention" if config.mask == "none" else "GroupedAttentionMasked")


def rotary_op(config):
    return FUSED + ("RotaryInterleaved" if config.rotary == "interleaved" else "Rotary")


def level(n):
    options = optimized.SessionOptions()
    options.graph_optimization_level = n
    return options


@pytest.fixture(scope="module")
def fused_models():
    return {name: optimize(build_decoder(config), 2) for name, config in VARIANTS.items()}


@pytest.mark.parametrize("name", VARIANTS)
def test_fused_as_expected(name, fused_models):
    config = VARIANTS[name]
    counts = op_types(fused_models[name])
    assert counts[rotary_op(config)] == 2 * config.layers, counts  # q and k of every layer
    assert counts[attention_op(config)] == config.layers, counts
    # the rotations, the softmaxes and the repeats of K and V are gone
    for op_type in ("Neg", "Softmax", "Tile"):
        assert counts[op_type] == 0, (op_type, counts)
    if config.repeat == "gather":
        assert counts["Gather"] == (2 if config.exporter == "torchscript" else 0), counts


@pytest.mark.parametrize("name", VARIANTS)
def test_rewritten_model_computes_the_same(name, fused_models):
    config = VARIANTS[name]
    assert_same_outputs(build_decoder(config), fused_models[name], feeds=decoder_feeds(config),
                        **TOLERANCE)


@pytest.mark.parametrize("name", VARIANTS)
def test_fused_attention_has_the_head_table_and_scale(name, fused_models):
    config = VARIANTS[name]
    model = fused_models[name]
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    group = config.heads // config.kv_heads
    table = (np.arange(config.heads) % config.kv_heads if config.repeat == "tile_heads"
             else np.arange(config.heads) // group)
    for node in model.graph.node:
        if node.op_type.startswith("GroupedAttention"):
            np.testing.assert_array_equal(inits[node.input[3]], table)
            scale = helper.get_attribute_value(node.attribute[0])
            assert scale == pytest.approx(config.head ** -0.5, rel=1e-6)


class Counting:
    """Counts the calls of a kernel wrapper."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


@pytest.mark.parametrize("name", VARIANTS)
def test_level_2_session_runs_the_kernels_and_matches_the_reference(name, monkeypatch):
    config = VARIANTS[name]
    model, feeds = build_decoder(config), decoder_feeds(config, seed=4)
    attention = Counting(kernels.grouped_attention)
    rotary = Counting(kernels.rotary)
    monkeypatch.setattr(kernels, "grouped_attention", attention)
    monkeypatch.setattr(kernels, "rotary", rotary)
    session = optimized.InferenceSession(model.SerializeToString(), level(2))
    got = session.run(None, feeds)
    assert attention.calls == config.layers and rotary.calls == 2 * config.layers
    expected = ReferenceEvaluator(model).run(None, feeds)
    for e, g in zip(expected, got, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, **TOLERANCE)


def test_dynamic_axes_hold_at_other_lengths():
    # one model, prompt and decode lengths, batch 1 and 3: the head table and shapes hold
    base = VARIANTS["llama_dynamo"]
    model = build_decoder(base)
    session = optimized.InferenceSession(model.SerializeToString(), level(2))
    reference = ReferenceEvaluator(model)
    for batch, seq, past in ((1, 1, 9), (3, 4, 2), (2, 7, 0)):
        feeds = decoder_feeds(DecoderConfig(batch=batch, seq=seq, past=past), seed=batch)
        if not past:  # the model has cache inputs: an empty cache
            feeds.update({f"past_{kind}_{layer}": np.zeros((batch, base.kv_heads, 0, base.head),
                                                           np.float32)
                          for kind in ("key", "value") for layer in range(base.layers)})
        for e, g in zip(reference.run(None, feeds), session.run(None, feeds), strict=True):
            np.testing.assert_allclose(g, e, **TOLERANCE)


def test_where_mask_becomes_one_additive_mask_per_condition(fused_models):
    # Where(allowed, scores, -inf) = scores + Where(allowed, 0, -inf); layers that read the same
    # condition share one additive mask (here each layer slices its own)
    model = fused_models["llama_where_mask"]
    made = {n.output[0]: n for n in model.graph.node if n.op_type == "Where"
            and n.output[0].endswith("_additive")}
    attention = [n for n in model.graph.node if n.op_type == "GroupedAttentionMasked"]
    assert {n.input[4] for n in attention} == set(made)
    conditions = {made[n.input[4]].input[0] for n in attention}
    assert len(made) == len(conditions) == VARIANTS["llama_where_mask"].layers


def test_shared_condition_gives_one_additive_mask():
    # the same Where condition in two layers: one additive mask, made before both read it
    config = VARIANTS["llama_where_mask"]
    model = optimize(build_decoder(config), 1)
    slices = [n for n in model.graph.node if n.op_type == "Slice" and any(
        r.op_type == "Where" and n.output[0] in r.input for r in model.graph.node)]
    for node in model.graph.node:  # every layer reads the first layer's slice
        if node.op_type == "Where" and node.input[0] == slices[1].output[0]:
            node.input[0] = slices[0].output[0]
    fused = fuse_grouped_attention(model)
    made = [n for n in fused.graph.node if n.op_type == "Where" and n.output[0].endswith(
        "_additive")]
    assert len(made) == 1 and op_types(fused)[FUSED + "GroupedAttentionMasked"] == config.layers
    assert_same_outputs(model, fused, feeds=decoder_feeds(config), **TOLERANCE)


# --- left whole where a value inside the pattern is read outside it ---------------------------
def first_output(model, op_type, reader=None):
    """The output of the first `op_type` node (read by a `reader` node, when given)."""
    readers = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.op_type)
    return next(n.output[0] for n in model.graph.node if n.op_type == op_type and (
        reader is None or reader in readers.get(n.output[0], [])))


INSIDE = {  # what the outside node reads -> (the fusion it stops, in one place)
    "rotate_half": (lambda m: first_output(m, "Concat", "Mul"), "Rotary"),
    "rotated_q_cos": (lambda m: first_output(m, "Mul", "Add"), "Rotary"),
    "scores": (lambda m: scores(m), "GroupedAttentionMasked"),
    "probabilities": (lambda m: first_output(m, "Softmax"), "GroupedAttentionMasked"),
}


def scores(model):
    """Q K^T: the MatMul whose product the scaling Mul or Div reads."""
    try:
        return first_output(model, "MatMul", "Mul")
    except StopIteration:
        return first_output(model, "MatMul", "Div")


def with_outside_reader(model, name):
    model = onnx.ModelProto.FromString(model.SerializeToString())
    model.graph.node.append(helper.make_node("ReduceSum", [name], ["outside"], keepdims=0))
    model.graph.output.append(helper.make_tensor_value_info("outside", onnx.TensorProto.FLOAT,
                                                            []))
    return model


@pytest.mark.parametrize("name", ["llama_dynamo", "phi3_split", "llama_torchscript_decode"])
@pytest.mark.parametrize("inside", INSIDE)
def test_left_whole_when_an_intermediate_is_read_outside(name, inside):
    config = VARIANTS[name]
    model = optimize(build_decoder(config), 1)  # level 1 first, as a session runs the passes
    find, fusion = INSIDE[inside]
    model = with_outside_reader(model, find(model))
    fused = fuse_grouped_attention(fuse_rotary(model))
    counts = op_types(fused)
    expected = {"Rotary": 2 * config.layers - 1, "GroupedAttentionMasked": config.layers - 1}
    assert counts[FUSED + fusion] == expected[fusion], counts
    assert_same_outputs(model, fused, feeds=decoder_feeds(config), **TOLERANCE)


def test_repeated_k_read_outside_stays_and_attention_reads_it_as_it_is():
    # the repeat must stay for its other reader: that layer's attention reads the repeated K
    # head by head (table 0..N-1), the other layer's reads the grouped K in place
    config = VARIANTS["llama_dynamo"]
    model = optimize(build_decoder(config), 1)
    grown = first_output(model, "Expand", "Reshape")  # repeat_kv's, not the rope table's
    repeated = next(n.output[0] for n in model.graph.node if n.input[:1] == [grown])
    model = with_outside_reader(model, repeated)
    fused = fuse_grouped_attention(model)
    tables = {i.name: onnx.numpy_helper.to_array(i) for i in fused.graph.initializer}
    read = {tuple(tables[n.input[3]]) for n in fused.graph.node if n.input[1:2] == [repeated]}
    assert read == {tuple(range(config.heads))}
    assert op_types(fused)[FUSED + "GroupedAttentionMasked"] == config.layers
    assert_same_outputs(model, fused, feeds=decoder_feeds(config), **TOLERANCE)


def test_other_types_are_left_alone():
    # the C kernel is float32; a float64 export keeps its nodes
    model = optimize(build_decoder(VARIANTS["llama_dynamo_static"]), 1)
    for value in list(model.graph.input) + list(model.graph.output):
        if value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            value.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    for init in model.graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT:
            init.CopyFrom(onnx.numpy_helper.from_array(
                onnx.numpy_helper.to_array(init).astype(np.float64), init.name))
    for node in model.graph.node:
        for a in node.attribute:
            if a.name == "value" and a.t.data_type == onnx.TensorProto.FLOAT:
                a.t.CopyFrom(onnx.numpy_helper.from_array(
                    onnx.numpy_helper.to_array(a.t).astype(np.float64)))
    counts = op_types(fuse_grouped_attention(model))
    assert counts[FUSED + "GroupedAttentionMasked"] == 0 and counts["Softmax"] == 2


# --- onnxruntime's fused form ------------------------------------------------------------------
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("config", [
    DecoderConfig(dynamic=False),
    DecoderConfig(dynamic=False, seq=1, past=6),
    DecoderConfig(dynamic=False, family="mistral", seq=6, past=4),
], ids=["prompt_with_cache", "decode", "sliding_window"])
def test_onnxruntime_contrib_form_runs_the_kernels(config, interleaved, monkeypatch):
    model, feeds = build_ort_contrib(config, interleaved), ort_contrib_feeds(config)
    attention = Counting(kernels.grouped_attention)
    rotary = Counting(kernels.rotary)
    monkeypatch.setattr(kernels, "grouped_attention", attention)
    monkeypatch.setattr(kernels, "rotary", rotary)
    got = optimized.InferenceSession(model.SerializeToString(), level(2)).run(None, feeds)
    assert attention.calls == 1 and rotary.calls == 2
    expected = ReferenceEvaluator(model).run(None, feeds)
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_allclose(g, e, **TOLERANCE)
