"""Divergence inside If/Loop bodies is shown at the right iteration."""
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from conformance.diff import ReferenceSide, diff_models
from conformance.diff.attribution import INHERITED, MADE_INSIDE
from conformance.diff.sides import SideError

from .control_model import loop_if_model
from .faults import add_with_epsilon

FEEDS = {"x": np.array([1.0, 2.0, 3.0], np.float32)}
ELSE = "loop/body/iter {}/branch/else_branch"
BODY = "loop/body/iter {}"


@pytest.fixture(scope="module")
def model():
    return loop_if_model()


def test_a_wrong_add_shows_first_in_the_else_branch_of_iteration_1(model):
    # Iteration 0 takes the then-branch (i is even), iteration 1 the else-branch with the Add.
    report = diff_models(ReferenceSide(model),
                         ReferenceSide(model, kernels={("", "Add"): add_with_epsilon}),
                         feeds=FEEDS)
    first = report.first_made
    assert (first.record.name, first.record.where) == ("incremented", ELSE.format(1))
    assert [r.record.where for r in report.made_here] == [ELSE.format(1), ELSE.format(3)]
    assert report.row("acc_out", BODY.format(0)).metrics.status == "equal"
    assert report.row("branched", BODY.format(1)).verdict == MADE_INSIDE
    assert report.row("acc_out", BODY.format(1)).verdict == INHERITED
    assert report.row("acc_in", BODY.format(2)).verdict == INHERITED
    assert report.row("doubled", "loop/body/iter 2/branch/then_branch").verdict == INHERITED
    assert report.row("acc").verdict == MADE_INSIDE
    assert report.row("y").verdict == INHERITED
    assert report.first_divergence is first


def test_a_perturbed_constant_in_a_branch_body(model, tmp_path):
    b = onnx.ModelProto()
    b.CopyFrom(model)
    loop = b.graph.node[0]
    if_node = loop.attribute[0].g.node[2]
    else_branch = next(a for a in if_node.attribute if a.name == "else_branch").g
    else_branch.initializer[0].CopyFrom(
        numpy_helper.from_array(np.array(1.001, np.float32), "one"))
    report = diff_models(model, b, feeds=FEEDS, extract=str(tmp_path))
    first = report.first_made
    assert (first.record.name, first.record.kind, first.record.where) == (
        "one", "initializer", ELSE.format(1))
    assert report.row("incremented", ELSE.format(1)).verdict == INHERITED
    # The repro: the Add that reads the constant, each side's constant inside.
    again = diff_models(report.repro["model"], report.repro["model_b"],
                        inputs=report.repro["inputs"])
    assert again.exit_code == 1
    assert again.row("incremented").diverged


@pytest.mark.parametrize("side_b", ["reference", "onnxruntime"])
def test_no_divergence_without_a_fault(model, side_b):
    if side_b == "onnxruntime":
        pytest.importorskip("onnxruntime")
    report = diff_models(model, side_b=side_b, feeds=FEEDS)
    assert report.divergent == [] and report.exit_code == 0
    if side_b == "onnxruntime":  # it shows the main graph only: body rows are A's alone
        assert report.row("acc").pair.status == "matched"
        assert report.row("acc_out", BODY.format(3)).pair.status == "only-A"


def test_a_side_that_fails_is_named(model):
    def broken(a, b):
        raise RuntimeError("boom")

    with pytest.raises(SideError, match=r"side 'broken' failed: .*'increment'.*boom"):
        diff_models(ReferenceSide(model),
                    ReferenceSide(model, kernels={("", "Add"): broken}, label="broken"),
                    feeds=FEEDS)


def test_bad_feeds_are_a_clear_error(model):
    with pytest.raises(ValueError, match=r"input 'x': dimension 0 must be 3"):
        diff_models(model, feeds={"x": np.ones(4, np.float32)})
