"""The diff judges rows out of tolerance by each side's error bound: rounding is not a
divergence, and the console lists what diverges first."""
import io

import numpy as np
import pytest
from onnx import helper, numpy_helper

from conformance.diff import OptimizedSide, ReferenceSide, diff_models
from conformance.diff.attribution import INHERITED, MADE, WITHIN
from tests.optimized.passes.helpers import light_model, make_model
from tests.optimized.passes.test_conv_bn_folding import random_weights


def test_reordering_noise_of_level_99_against_level_0_is_no_divergence():
    """light_resnet50 with random weights: the level-99 rewrite (folded BatchNorms, fused
    convolutions, blocked layouts) sums in other orders than level 0, so many values differ
    beyond rtol 1e-4 / atol 1e-5; each is within both sides' error bounds."""
    from optimized.passes.constant_folding import fold_constants
    from optimized.passes.initializer_inputs import freeze_initializer_inputs

    model = random_weights(fold_constants(freeze_initializer_inputs(light_model("light_resnet50"))))
    report = diff_models(OptimizedSide(model, level=0), OptimizedSide(model, level=99))
    assert report.divergent == [] and report.exit_code == 0
    rounding = report.within_bound
    assert len(rounding) > 10  # out of tolerance, explained by rounding
    assert all(r.verdict == WITHIN and 0 <= r.bound_used <= 1 for r in rounding)
    assert "differ beyond rtol/atol only by rounding" in report.summary()


def _pair():
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((8, 6)).astype(np.float32),
             "c": rng.standard_normal(6).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "c"], ["y"], name="add")]
    a = make_model(nodes, [("x", [2, 8])], [("y", [2, 6])], inits)
    b = make_model(nodes, [("x", [2, 8])], [("y", [2, 6])], {**inits, "c": inits["c"] * 1.001})
    for i in range(5):  # constants only B has, as a rewrite adds reshape shapes
        b.graph.initializer.append(numpy_helper.from_array(np.array([i, -1], np.int64), f"s{i}"))
    return a, b


def test_console_lists_divergent_rows_first_and_counts_one_sided_rows():
    from rich.console import Console

    a, b = _pair()
    report = diff_models(ReferenceSide(a), ReferenceSide(b),
                         feeds={"x": np.ones((2, 8), np.float32)})
    assert [r.verdict for r in report.divergent] == [MADE, INHERITED]
    buffer = io.StringIO()
    report.print(Console(file=buffer, width=200))
    text = buffer.getvalue()
    body = [line for line in text.splitlines() if line.startswith("│")]
    assert " c " in body[0] and "made here" in body[0]
    assert not any(f" s{i} " in text for i in range(5))
    assert "not listed: 5 only in B" in text


def test_a_kernel_past_its_bound_is_made_here_though_within_tolerance_nowhere_else():
    a, _ = _pair()

    def add_one_ulp_too_many(x, y):
        z = (x + y).astype(np.float32)
        return np.nextafter(np.nextafter(z, np.float32(np.inf)), np.float32(np.inf))

    # two ulps is well inside rtol 1e-4, so a tight tolerance shows it, the bound judges it
    report = diff_models(ReferenceSide(a), ReferenceSide(a, kernels={("", "Add"): add_one_ulp_too_many}),
                         feeds={"x": np.ones((2, 8), np.float32)}, rtol=0.0, atol=0.0)
    assert [(r.record.name, r.verdict) for r in report.divergent] == [("y", MADE)]
    assert report.divergent[0].bound_used > 1


@pytest.mark.parametrize("perturb", [0.0, 1e-6])
def test_a_right_kernel_on_the_same_inputs_is_within_bound(perturb):
    a, _ = _pair()

    def matmul_other_order(x, w):
        return (x.astype(np.float64) @ w.astype(np.float64)).astype(np.float32) * np.float32(1 + perturb)

    report = diff_models(ReferenceSide(a), ReferenceSide(a, kernels={("", "MatMul"): matmul_other_order}),
                         feeds={"x": np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)},
                         rtol=0.0, atol=0.0)
    h = report.row("h")
    if perturb == 0.0:
        assert h.verdict in ("", WITHIN) and not h.diverged
    else:  # 1e-6 relative is about 17 u: past gamma(8) * sum |x w| for these inputs
        assert h.verdict == MADE
