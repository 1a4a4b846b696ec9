"""A BERT-like encoder rewritten by onnxruntime's optimizers into com.microsoft fused ops
(Attention, MultiHeadAttention, SkipLayerNormalization, BiasGelu, FastGelu, FusedMatMul), run by
the reference and by onnxruntime.

Float32 tolerances: every fused op here reduces over at most 256 values (hidden 64, intermediate
256, sequence 16) and onnxruntime sums in a different order (and with SIMD exp/erf/tanh), so a
value of size ~1 can move by a few float32 ulps per op: rtol 1e-4 / atol 1e-5 holds a two-layer
run with a wide margin (differences seen are ~1e-6) and still catches any real formula error,
which moves values by 1e-2 or more.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest

from reference import ReferenceEvaluator
from reference.errors import InvalidModelError
from tests.models import float_tolerance, node_mismatches, op_types, ort_session
from tests.models.build_transformer import EncoderConfig, build_encoder, encoder_feeds

ort = pytest.importorskip("onnxruntime")
transformers_optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")
fusion_options = pytest.importorskip("onnxruntime.transformers.fusion_options")

MS = "com.microsoft"
RTOL, ATOL = 1e-4, 1e-5
GELU_OP = {"erf": "BiasGelu", "tanh": "FastGelu"}


def transformers_optimized(cfg: EncoderConfig, tmp_path, *, multi_head: bool,
                           mask_format: int) -> onnx.ModelProto:
    """The encoder after onnxruntime.transformers.optimizer.optimize_model (bert fusions only,
    opt_level=0: onnxruntime's own graph optimizer is a separate test below)."""
    source = tmp_path / "encoder.onnx"
    onnx.save(build_encoder(cfg), source)
    options = fusion_options.FusionOptions("bert")
    options.use_multi_head_attention = multi_head
    options.attention_mask_format = mask_format
    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    optimized = transformers_optimizer.optimize_model(
        str(source), model_type="bert", num_heads=cfg.heads, hidden_size=cfg.hidden,
        optimization_options=options, opt_level=0)
    target = tmp_path / "optimized.onnx"
    optimized.save_model_to_file(str(target))  # adds the com.microsoft opset import
    return onnx.load(target)


def session_optimized(cfg: EncoderConfig, tmp_path) -> onnx.ModelProto:
    """The model onnxruntime writes with ORT_ENABLE_EXTENDED and optimized_model_filepath."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "session_optimized.onnx")
    ort.InferenceSession(build_encoder(cfg).SerializeToString(), options,
                         providers=["CPUExecutionProvider"])
    return onnx.load(options.optimized_model_filepath)


def assert_matches_onnxruntime(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    problems = node_mismatches(model, feeds, float_tolerance(RTOL, ATOL))
    assert not problems, "\n".join(problems)
    ours = ReferenceEvaluator(model).run(None, feeds)[0]
    theirs = ort_session(model).run(None, feeds)[0]
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=ATOL)
    return ours


@pytest.mark.parametrize("gelu", ["erf", "tanh"])
@pytest.mark.parametrize("multi_head", [False, True], ids=["Attention", "MultiHeadAttention"])
@pytest.mark.parametrize("mask_format", [0, 2], ids=["mask_index_end", "raw_mask"])
def test_transformers_optimizer_fusions(gelu, multi_head, mask_format, tmp_path):
    cfg = EncoderConfig(gelu=gelu)
    model = transformers_optimized(cfg, tmp_path, multi_head=multi_head, mask_format=mask_format)
    present = op_types(model)
    attention = "MultiHeadAttention" if multi_head else "Attention"
    for fused in (attention, "SkipLayerNormalization", GELU_OP[gelu]):
        assert (MS, fused) in present, f"the optimizer wrote no {fused}: {sorted(present)}"
    # nothing of the decomposed attention or Gelu is left for the ai.onnx ops to compute
    assert not present & {("", "Softmax"), ("", "Erf"), ("", "Tanh")}, sorted(present)
    # MaskIndexEnd turns the 0/1 mask into end positions (ReduceSum); AttentionMask keeps it raw
    assert (("", "ReduceSum") in present) == (mask_format == 0)

    feeds = encoder_feeds(cfg, batch=3)
    ours = assert_matches_onnxruntime(model, feeds)
    # the rewrite keeps the meaning: the fused model gives the decomposed model's answer
    before = ReferenceEvaluator(build_encoder(cfg)).run(None, feeds)[0]
    np.testing.assert_allclose(ours, before, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("gelu", ["erf", "tanh"])
@pytest.mark.parametrize("masked", [True, False], ids=["masked", "unmasked"])
def test_session_optimizer_fusions(gelu, masked, tmp_path):
    cfg = EncoderConfig(gelu=gelu, masked=masked)
    model = session_optimized(cfg, tmp_path)
    present = op_types(model)
    # onnxruntime's own attention fusion does not take this pattern, so Q @ K^T / sqrt(H)
    # becomes FusedMatMul with alpha = 1 / sqrt(H)
    for fused in ("FusedMatMul", "SkipLayerNormalization", GELU_OP[gelu]):
        assert (MS, fused) in present, f"onnxruntime wrote no {fused}: {sorted(present)}"
    alphas = [a.f for n in model.graph.node if n.op_type == "FusedMatMul"
              for a in n.attribute if a.name == "alpha"]
    assert alphas and all(a == pytest.approx(1 / np.sqrt(cfg.hidden // cfg.heads)) for a in alphas)

    feeds = encoder_feeds(cfg)
    ours = assert_matches_onnxruntime(model, feeds)
    before = ReferenceEvaluator(build_encoder(cfg)).run(None, feeds)[0]
    np.testing.assert_allclose(ours, before, rtol=RTOL, atol=ATOL)


def test_mask_really_masks(tmp_path):
    """Padded key positions must not change the unpadded outputs: the fused Attention gets the
    mask right, not merely the same as onnxruntime."""
    cfg = EncoderConfig()
    model = transformers_optimized(cfg, tmp_path, multi_head=False, mask_format=0)
    feeds = encoder_feeds(cfg, batch=2)
    valid = int(feeds["attention_mask"][1].sum())
    assert valid < cfg.seq
    changed = {k: v.copy() for k, v in feeds.items()}
    changed["hidden_states"][1, valid:] = 100.0  # garbage in the padding
    evaluator = ReferenceEvaluator(model)
    plain, garbled = (evaluator.run(None, f)[0] for f in (feeds, changed))
    np.testing.assert_allclose(garbled[1, :valid], plain[1, :valid], rtol=RTOL, atol=ATOL)
    assert not np.allclose(garbled[1, valid:], plain[1, valid:])


def test_optimizer_output_without_ms_opset_is_rejected(tmp_path):
    """optimize_model's in-memory model lacks the com.microsoft opset import until it is saved;
    such a model is invalid and the evaluator says so instead of guessing a version."""
    source = tmp_path / "encoder.onnx"
    onnx.save(build_encoder(EncoderConfig()), source)
    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    unsaved = transformers_optimizer.optimize_model(str(source), model_type="bert", num_heads=4,
                                                    hidden_size=64, opt_level=0).model
    assert MS not in {o.domain for o in unsaved.opset_import}
    with pytest.raises(InvalidModelError, match="com.microsoft"):
        ReferenceEvaluator(unsaved)


def test_optimized_opset14_export_runs(tmp_path):
    cfg = EncoderConfig(opset=14)  # most exported BERTs are opset 11..14
    model = transformers_optimized(cfg, tmp_path, multi_head=False, mask_format=0)
    assert ("", "LayerNormalization") in op_types(model)
    assert_matches_onnxruntime(model, encoder_feeds(cfg))
