"""gqa_fusion's CausalPaddingMask: torch.onnx dynamo's causal-and-padding mask of Hugging Face's
decoders (Range, LessOrEqual, Unsqueeze, Cast, And, then Where in each layer), as
benchmarks/decoders.py writes it, becomes one node whose function body is those nodes; where a
piece of the mask is read elsewhere, the mask stays as the exporter wrote it."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import optimized
from benchmarks.decoders import SIZES, build_llama, config_of
from optimized import cpu, decoder_ops
from optimized.passes import optimize
from optimized.passes.gqa_fusion import CAUSAL_PADDING_MASK, fuse_grouped_attention
from optimized.passes.silu_mlp_fusion import FUSED_DOMAIN
from reference import ReferenceEvaluator

from .helpers import assert_same_outputs, op_types

FUSED = "onnx_parity.fused::"
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}  # the fused attention sums in another order
MASK_OPS = ("Range", "LessOrEqual", "And", "Where", "Cast")
BATCH, SEQ, PAST = 2, 5, 3
# attention masks of (BATCH, PAST + SEQ): right padding (batch 1 shorter), left padding,
# a hole, and a batch row with every key masked (every query of it sees no key)
MASKS = {
    "none": [[1] * 8, [1] * 8],
    "right": [[1] * 8, [1] * 6 + [0] * 2],
    "left": [[1] * 8, [0, 0] + [1] * 6],
    "hole": [[1, 1, 0, 1, 1, 1, 1, 1], [1] * 8],
    "all_masked": [[1] * 8, [0] * 8],
}


@pytest.fixture(scope="module")
def model():
    return build_llama(SIZES["tiny"])


def feeds_for(model, mask, batch=BATCH, seq=SEQ, past=PAST, seed=0):
    rng = np.random.default_rng(seed)
    c = config_of(model)
    feeds = {"input_ids": rng.integers(0, c["vocab"], (batch, seq), dtype=np.int64),
             "attention_mask": np.array(mask, np.int64),
             "position_ids": np.broadcast_to(np.arange(past, past + seq), (batch, seq)).copy()}
    for i in range(c["layers"]):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = rng.standard_normal(
                (batch, c["kv_heads"], past, c["head_dim"])).astype(np.float32)
    return feeds


def test_mask_becomes_one_node(model):
    counts = op_types(optimize(model, 2))
    assert counts[FUSED + "CausalPaddingMask"] == 1, counts
    assert counts[FUSED + "GroupedAttentionMasked"] == config_of(model)["layers"], counts
    for op_type in MASK_OPS:
        assert counts[op_type] == 0, (op_type, counts)


@pytest.mark.parametrize("mask", MASKS)
def test_rewritten_model_computes_the_same(model, mask):
    # the function body, run op by op by the reference (and by onnxruntime where installed);
    # level 1 (common subexpressions) makes the two Ranges' ends one value, as in the pipeline
    fused = fuse_grouped_attention(optimize(model, 1))
    assert op_types(fused)[FUSED + "CausalPaddingMask"] == 1
    assert_same_outputs(model, fused, feeds=feeds_for(model, MASKS[mask]), **TOLERANCE)


@pytest.mark.parametrize("mask", MASKS)
def test_session_matches_the_reference(model, mask, monkeypatch):
    calls = []
    key = (FUSED_DOMAIN, CAUSAL_PADDING_MASK)
    kernel = cpu.KERNELS[key]
    monkeypatch.setitem(cpu.KERNELS, key, lambda *a, **k: calls.append(1) or kernel(*a, **k))
    session = optimized.InferenceSession(model.SerializeToString())
    feeds = feeds_for(model, MASKS[mask])
    expected = ReferenceEvaluator(model).run(None, feeds)
    got = session.run(None, feeds)
    assert calls, "the CausalPaddingMask kernel did not run"
    for e, g in zip(expected, got, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, **TOLERANCE)


def test_decode_step_and_empty_cache_match_the_reference(model):
    session = optimized.InferenceSession(model.SerializeToString())
    reference = ReferenceEvaluator(model)
    for batch, seq, past, mask in ((2, 1, 7, [[1] * 8, [1] * 5 + [0] * 3]),
                                   (1, 6, 0, [[1] * 6])):
        feeds = feeds_for(model, mask, batch=batch, seq=seq, past=past, seed=seq)
        for e, g in zip(reference.run(None, feeds), session.run(None, feeds), strict=True):
            np.testing.assert_allclose(g, e, **TOLERANCE)


@pytest.mark.parametrize("piece", ["LessOrEqual", "And", "Cast"])
def test_mask_read_elsewhere_stays(model, piece):
    # a piece of the mask that is also a graph output: the exporter's nodes stay, and each
    # layer's Where becomes an additive mask made from the condition as before
    extra = optimize(model, 1)
    node = next(n for n in extra.graph.node if n.op_type == piece)
    rank = {"LessOrEqual": 2, "And": 4, "Cast": 2}[piece]
    extra.graph.output.append(helper.make_tensor_value_info(
        node.output[0], TensorProto.BOOL, [f"{piece}_{axis}" for axis in range(rank)]))
    fused = fuse_grouped_attention(extra)
    counts = op_types(fused)
    assert counts[FUSED + "CausalPaddingMask"] == 0, counts
    assert counts[FUSED + "GroupedAttentionMasked"] == config_of(model)["layers"], counts
    assert counts[piece] == 1 and counts["Where"] == 1, counts  # the one additive mask
    assert_same_outputs(extra, fused, feeds=feeds_for(extra, MASKS["right"]), **TOLERANCE)


@pytest.mark.parametrize("mask, start, end", [
    ([[1, 1, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0]], 1, 4),   # prompt rows after one cached key
    ([[1, 0, 1]], 2, 3),                                   # one decode row
    ([[1, 1, 1]], 0, 3),                                   # a whole prompt
    ([[True, False]], 0, 2),                               # a bool mask
    ([[1, 1, 1]], 3, 3),                                   # no query rows
    ([[1], [0]], 0, 4),                                    # a mask column broadcast: the body
])
def test_kernel_is_the_body(mask, start, end):
    mask = np.array(mask)
    got = decoder_ops.causal_padding_mask(mask, np.int64(start), np.int64(end), fill=-1e30)
    queries = end - start
    assert got.dtype == np.float32 and got.shape == (mask.shape[0], 1, queries, end)
    for b in range(mask.shape[0]):
        for i in range(queries):
            for j in range(end):
                allowed = j <= start + i and mask[b, j if mask.shape[1] > 1 else 0] != 0
                assert got[b, 0, i, j] == (0.0 if allowed else np.float32(-1e30))
