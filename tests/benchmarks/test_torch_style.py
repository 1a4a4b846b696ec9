"""benchmarks/torch_style.py and the benchmark models of benchmarks/models.py: node patterns as
the exporter writes them, and optimized agreeing with the reference at tiny sizes."""
from collections import Counter

import numpy as np
import pytest

import optimized
from benchmarks import models, torch_style
from reference import ReferenceEvaluator

LEVELS = [0, 2, 99]


def tiny_bert():
    return torch_style.bert_classifier(layers=2, hidden=24, heads=3, intermediate=40, vocab=50,
                                       max_positions=20, labels=3)


def tiny_vit():
    return torch_style.vit(image=12, patch=4, layers=2, hidden=18, heads=3, mlp=20, classes=5)


def tiny_mobilenet(pool="GlobalAveragePool"):
    return torch_style.mobilenet_v3_small(width=0.25, image=40, classes=7, pool=pool)


def ops(model) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def feeds_for(model, **kwargs):
    if model.graph.input[0].name == "input_ids":
        return torch_style.bert_feeds(model, **kwargs)
    return torch_style.image_feeds(model)


def check_levels(model, feeds):
    expected = ReferenceEvaluator(model).run(None, feeds)
    for level in LEVELS:
        options = optimized.SessionOptions()
        options.graph_optimization_level = optimized.GraphOptimizationLevel(level)
        got = optimized.InferenceSession(model.SerializeToString(), options).run(None, feeds)
        for want, have in zip(expected, got, strict=True):
            np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-5,
                                       err_msg=f"level {level}")
    return expected


def test_bert_pattern_and_agreement():
    model = tiny_bert()
    counts = ops(model)
    assert counts["LayerNormalization"] == 1 + 2 * 2 and counts["Erf"] == 2
    assert counts["Softmax"] == 2 and counts["Tanh"] == 1 and counts["Gemm"] == 2
    assert counts["Shape"] > 0 and counts["Slice"] == 1  # dynamic view() shapes, position ids
    assert [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim] == [
        "batch", "sequence"]
    (logits,) = check_levels(model, torch_style.bert_feeds(model, sequence=9, padding=2))
    assert logits.shape == (1, 3)


def test_bert_padding_mask_hides_the_padded_tokens():
    model = tiny_bert()
    feeds = torch_style.bert_feeds(model, sequence=9, padding=3)
    changed = dict(feeds, input_ids=feeds["input_ids"].copy())
    changed["input_ids"][0, -3:] = (changed["input_ids"][0, -3:] + 1) % 50
    session = optimized.InferenceSession(model.SerializeToString())
    before, after = session.run(None, feeds)[0], session.run(None, changed)[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)
    changed["input_ids"][0, 0] = (changed["input_ids"][0, 0] + 1) % 50
    assert not np.allclose(session.run(None, changed)[0], before)


def test_vit_pattern_and_agreement():
    model = tiny_vit()
    counts = ops(model)
    assert counts["Conv"] == 1 and counts["Concat"] >= 1 and counts["LayerNormalization"] == 5
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    assert next(a.ints for a in conv.attribute if a.name == "strides") == [4, 4]
    (logits,) = check_levels(model, torch_style.image_feeds(model))
    assert logits.shape == (1, 5)


@pytest.mark.parametrize("pool", ["GlobalAveragePool", "ReduceMean"])
def test_mobilenet_pattern_and_agreement(pool):
    model = tiny_mobilenet(pool)
    counts = ops(model)
    assert counts["HardSwish"] > 0 and counts["HardSigmoid"] == 9 and counts[pool] >= 9
    assert "BatchNormalization" not in counts  # folded into the convolutions
    depthwise = [n for n in model.graph.node if n.op_type == "Conv"
                 and next(a.i for a in n.attribute if a.name == "group") > 1]
    assert len(depthwise) == len(torch_style.SMALL_BLOCKS)
    (logits,) = check_levels(model, torch_style.image_feeds(model))
    assert logits.shape == (1, 7)


def test_make_divisible_is_torchvisions():
    assert [torch_style.make_divisible(v) for v in (8.0, 36.0, 44.0, 12.0, 3.0, 288.0)] == [
        8, 40, 48, 16, 8, 288]


def test_bad_sizes_are_named():
    with pytest.raises(ValueError, match="not a multiple of the patch size"):
        torch_style.vit(image=10, patch=4)
    with pytest.raises(ValueError, match="pool must be"):
        torch_style.mobilenet_v3_small(pool="MaxPool")


@pytest.mark.parametrize("name", models.TORCH_STYLE + models.LLAMA)
def test_benchmark_models_build_with_feeds_that_match_their_inputs(name):
    model, feeds = models.build(name)
    assert sorted(feeds) == sorted(i.name for i in model.graph.input)
    for info in model.graph.input:
        dims = info.type.tensor_type.shape.dim
        assert len(dims) == feeds[info.name].ndim
        assert all(not d.dim_value or d.dim_value == n
                   for d, n in zip(dims, feeds[info.name].shape, strict=True))
