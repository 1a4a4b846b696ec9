"""benchmarks/decoders.py's decoders: the tiny size runs in the reference evaluator and in the
optimized session (levels 0, 2 and 99), which agree; the KV cache is right (a prefill followed
by decode steps gives the logits of one pass over the whole sequence, and a key never sees a
later one); the models have the node pattern they claim; the 4-bit variant is onnxruntime's
quantizer's MatMulNBits form."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

import optimized
from benchmarks import decoders
from reference import ReferenceEvaluator

TINY = decoders.SIZES["tiny"]
# float32 sums of 64 to 300 terms through two layers, ordered differently by the C kernels
RTOL, ATOL = 1e-4, 1e-4

BUILDERS = {
    "llama": lambda: decoders.build_llama(TINY),
    "phi3_slice": lambda: decoders.build_phi3(TINY, "Slice"),
    "phi3_split": lambda: decoders.build_phi3(TINY, "Split"),
}


@pytest.fixture(scope="module", params=list(BUILDERS))
def model(request):
    return BUILDERS[request.param]()


def feeds_for(model, tokens, past_length=0, past=None):
    past = past if past is not None else decoders.empty_past(model, tokens.shape[0])
    return {**decoders.step_feeds(tokens, past_length), **past}


def presents_as_past(model, outputs):
    names = [o.name for o in model.graph.output]
    return {n.replace("present.", "past_key_values."): v for n, v in zip(names, outputs)
            if n.startswith("present.")}


def test_pattern(model):
    ops = Counter(n.op_type for n in model.graph.node)
    layers = TINY.layers
    assert ops["Concat"] >= 2 * layers and ops["Where"] == layers and ops["Softmax"] == layers
    assert ops["Expand"] == 2 * layers and ops["Neg"] == 2 * layers and ops["Sigmoid"] == layers
    assert ops["Reciprocal"] == 2 * layers + 1 and ops["Pow"] == 2 * layers + 1
    fused = model.graph.name.startswith("phi3")
    assert ops["MatMul"] == layers * (4 if fused else 7) + 1 + 2 * layers  # lm_head, scores, context
    if model.graph.name == "phi3_split":
        assert ops["Split"] == 2 * layers
    onnx.checker.check_model(model, full_check=True)


@pytest.mark.parametrize("level", [0, 2, 99])
def test_optimized_agrees_with_reference(model, level):
    tokens = decoders.random_tokens(model, (2, 7), seed=1)
    feeds = feeds_for(model, tokens)
    expected = ReferenceEvaluator(model).run(None, feeds)
    options = optimized.SessionOptions()
    options.graph_optimization_level = level
    got = optimized.InferenceSession(model.SerializeToString(), options).run(None, feeds)
    assert len(got) == 1 + 2 * TINY.layers
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL)


def test_kv_cache_steps_equal_one_pass(model):
    """Prefill 5 tokens, then two steps of one token on the cache: the same logits and cache as
    one pass over the 7 tokens (and the prefill's logits are those of the first 5 positions,
    so no position attends to a later one)."""
    evaluator = ReferenceEvaluator(model)
    tokens = decoders.random_tokens(model, (2, 7), seed=2)
    whole = evaluator.run(None, feeds_for(model, tokens))
    steps = [evaluator.run(None, feeds_for(model, tokens[:, :5]))]
    for t in (5, 6):
        past = presents_as_past(model, steps[-1])
        steps.append(evaluator.run(None, feeds_for(model, tokens[:, t:t + 1], t, past)))
    logits = np.concatenate([s[0] for s in steps], axis=1)
    np.testing.assert_allclose(logits, whole[0], rtol=1e-5, atol=1e-5)
    for got, expected in zip(steps[-1][1:], whole[1:]):
        assert got.shape == expected.shape == (2, TINY.kv_heads, 7, TINY.head_dim)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_padding_mask(model):
    """A left-padded row (attention_mask 0 on its first two positions) gives, at the positions
    after the padding, the logits of the same tokens unpadded (position ids counted from the
    first real token, as generation code feeds them)."""
    evaluator = ReferenceEvaluator(model)
    tokens = decoders.random_tokens(model, (1, 6), seed=3)
    alone = evaluator.run(None, feeds_for(model, tokens[:, 2:]))[0]
    feeds = feeds_for(model, tokens)
    feeds["attention_mask"][0, :2] = 0
    feeds["position_ids"] = np.array([[0, 0, 0, 1, 2, 3]], np.int64)
    padded = evaluator.run(None, feeds)[0]
    np.testing.assert_allclose(padded[:, 2:], alone, rtol=1e-5, atol=1e-5)


def test_weight_bytes():
    model = decoders.build_llama(TINY)
    h, i, v, kv = TINY.hidden, TINY.intermediate, TINY.vocab, TINY.kv_heads * TINY.head_dim
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i
    assert decoders.weight_bytes(model) == 4 * (TINY.layers * per_layer + h * v + h)


def test_4bit_variant_agrees_with_reference():
    pytest.importorskip("onnxruntime", reason="the 4-bit variant is written by onnxruntime's "
                        "quantizer (extra 'anchors')")
    model = decoders.quantized_4bit(decoders.build_llama(TINY))
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 7 * TINY.layers + 1
    attrs = {a.name: a.i for a in nbits[0].attribute}
    assert attrs["bits"] == 4 and attrs["block_size"] == 32 and len(nbits[0].input) == 4
    feeds = feeds_for(model, decoders.random_tokens(model, (1, 5), seed=4))
    expected = ReferenceEvaluator(model).run(None, feeds)
    got = optimized.InferenceSession(model.SerializeToString()).run(None, feeds)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL)
