"""light_resnet50 (onnx's own light model): a perturbed weight is found where it is made."""
import os

import onnx
import pytest

from conformance.diff import diff_models
from conformance.diff.attribution import INHERITED, MADE

from .faults import LIGHT_RESNET50, scale_constant_of_shape

WEIGHT = "gpu_0/res2_0_branch2c_w_0"  # the weight of one 1x1 Conv in the first residual block


@pytest.fixture(scope="module")
def model():
    if not os.path.exists(LIGHT_RESNET50):
        pytest.skip("the installed onnx does not ship light_resnet50")
    return onnx.load(LIGHT_RESNET50)


@pytest.fixture(scope="module")
def faulty_report(model, tmp_path_factory):
    b = scale_constant_of_shape(model, WEIGHT, 1.001)
    return diff_models(model, b, side_a="reference",
                       extract=str(tmp_path_factory.mktemp("repro")))


def test_the_perturbed_weight_is_where_error_is_made(faulty_report):
    made = faulty_report.made_here
    assert [r.record.name for r in made] == [WEIGHT]
    assert made[0].record.op_type == "ConstantOfShape"
    assert faulty_report.first_divergence is made[0]


def test_everything_downstream_is_inherited(faulty_report, model):
    conv = next(n for n in model.graph.node if WEIGHT in n.input)
    assert faulty_report.row(conv.output[0]).verdict == INHERITED
    divergent = faulty_report.divergent
    assert len(divergent) > 10
    assert all(r.verdict == INHERITED for r in divergent if r.record.name != WEIGHT)


def test_the_repro_reproduces_the_divergence(faulty_report):
    repro = faulty_report.repro
    assert "model_b" in repro  # the two sides' nodes differ in their attribute
    again = diff_models(repro["model"], repro["model_b"], side_a="reference",
                        inputs=repro["inputs"])
    assert again.first_made is not None and again.first_made.verdict == MADE
    assert again.first_made.record.op_type == "ConstantOfShape"
    assert again.exit_code == 1


def test_no_false_positive_reference_against_optimized(model):
    report = diff_models(model)  # reference vs optimized: fused convolutions, C kernels
    assert report.divergent == [] and report.exit_code == 0
    statuses = {r.pair.status for r in report.rows}
    assert statuses <= {"matched", "fused"}  # values the rewrite removed are named as such
    conv = next(r for r in report.rows if r.record.op_type == "Conv")
    assert conv.status.startswith("fused into ")
