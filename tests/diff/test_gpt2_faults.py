"""The GPT-2-like block: a wrong Softmax kernel and a perturbed weight are each found where
they are made; everything after them is inherited; the repros reproduce."""
import numpy as np
import pytest

from conformance.diff import ReferenceSide, diff_models
from conformance.diff.attribution import INHERITED

from .faults import scale_initializer, softmax_with_epsilon
from .gpt2_block import gpt2_model

DIMS = {"batch": 2, "seq": 16}
WRONG_SOFTMAX = {("", "Softmax"): softmax_with_epsilon}


@pytest.fixture(scope="module")
def model():
    return gpt2_model(d=64, heads=4, layers=2)


@pytest.fixture(scope="module")
def kernel_fault(model, tmp_path_factory):
    return diff_models(ReferenceSide(model), ReferenceSide(model, kernels=WRONG_SOFTMAX),
                       dims=DIMS, extract=str(tmp_path_factory.mktemp("softmax")))


def test_the_wrong_kernel_is_named_first(kernel_fault):
    made = kernel_fault.made_here
    assert made[0].record.name == "h0.attn/softmax"
    assert [r.record.op_type for r in made] == ["Softmax", "Softmax"]  # one per layer
    assert kernel_fault.first_divergence is made[0]


def test_values_after_the_wrong_kernel_are_inherited(kernel_fault):
    for name in ["h0.attn/context", "h0/residual_1", "h0.ln_2/out", "h1.attn/scores", "logits"]:
        assert kernel_fault.row(name).verdict == INHERITED, name
    assert kernel_fault.row("h0.attn/scores").metrics.status == "equal"
    assert kernel_fault.exit_code == 1


def test_the_kernel_repro_reproduces(kernel_fault):
    repro = kernel_fault.repro
    assert "model_b" not in repro  # the same node on both sides; the kernel differs
    a = ReferenceSide(repro["model"])
    b = ReferenceSide(repro["model"], kernels=WRONG_SOFTMAX)
    again = diff_models(a, b, inputs=repro["inputs"])
    assert [r.record.op_type for r in again.made_here] == ["Softmax"]
    clean = diff_models(a, ReferenceSide(repro["model"]), inputs=repro["inputs"])
    assert clean.divergent == []


def test_a_perturbed_weight_is_made_at_the_initializer(model, tmp_path):
    b = scale_initializer(model, "h1.mlp.c_fc.weight", 1.001)
    report = diff_models(model, b, dims=DIMS, extract=str(tmp_path))
    assert [r.record.name for r in report.made_here] == ["h1.mlp.c_fc.weight"]
    assert report.row("h1.mlp.c_fc/matmul").verdict == INHERITED
    assert report.row("h0/residual_2").metrics.within_tolerance
    # The repro is the MatMul that reads the weight, with each side's weight inside.
    again = diff_models(report.repro["model"], report.repro["model_b"],
                        inputs=report.repro["inputs"])
    assert [r.record.name for r in again.made_here] == ["h1.mlp.c_fc.weight"]
    assert again.row("h1.mlp.c_fc/matmul").verdict == INHERITED
    assert again.exit_code == 1


@pytest.mark.parametrize("side_b", ["optimized", "onnxruntime"])
def test_no_false_positive_without_a_fault(model, side_b):
    if side_b == "onnxruntime":
        pytest.importorskip("onnxruntime")
    report = diff_models(model, side_b=side_b, dims=DIMS)
    assert report.divergent == [] and report.exit_code == 0
    assert not [r for r in report.rows if r.pair.status in ("only-A", "only-B")]


def test_keep_holds_every_tensor(model):
    report = diff_models(ReferenceSide(model), ReferenceSide(model), dims=DIMS, keep=True)
    assert report.values_a is not None
    logits = report.values_a[((), "logits")]
    assert logits.shape == (2, 16, 50) and np.array_equal(logits, report.values_b[((), "logits")])
    plain = diff_models(ReferenceSide(model), ReferenceSide(model), dims=DIMS)
    assert plain.values_a is None
