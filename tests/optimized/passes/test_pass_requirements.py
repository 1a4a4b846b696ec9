"""optimize() runs a pass only where it can change something: the op types it requires are all
in the graph, and a pass that already left these very bytes as they were is not run again."""
import numpy as np
import pytest
from onnx import helper

import optimized.passes
from optimized.passes import PASSES, Pass, optimize
from optimized.passes import op_types as graph_op_types
from optimized.passes.dead_code import eliminate_dead_code

from . import exporter_patterns as patterns
from .helpers import gpt2_block, make_model
from .test_optimize import conv_with_affine_and_batchnorm, without

REQUIRING = [p for p in PASSES if p.requires]


def sample_models():
    """Models holding the patterns of the passes that require op types."""
    models = [conv_with_affine_and_batchnorm(), gpt2_block(opset=17), gpt2_block(opset=13)]
    for cases in (patterns.LAYER_NORM_CASES, patterns.ATTENTION_CASES):
        models.extend(case().model for case in cases.values())
    return models


def test_some_passes_require_op_types():
    assert {p.name for p in REQUIRING} >= {"layer_norm_fusion", "attention_fusion",
                                           "conv_affine_folding"}


@pytest.mark.parametrize("p", REQUIRING, ids=lambda p: p.name)
def test_a_pass_skipped_for_want_of_a_required_op_would_change_nothing(p):
    for model in sample_models():
        for required in sorted(p.requires):
            lacking = without(model, required)
            assert required not in graph_op_types(lacking)
            rewritten = p.function(lacking)
            assert rewritten.SerializeToString() == lacking.SerializeToString(), (
                p.name, required)


@pytest.mark.parametrize("p", REQUIRING, ids=lambda p: p.name)
def test_every_sample_the_pass_rewrites_holds_what_it_requires(p):
    rewritten_any = False
    for model in sample_models():
        before = model.SerializeToString()
        if p.function(model).SerializeToString() != before:
            rewritten_any = True
            assert p.requires <= graph_op_types(model), p.name
    assert rewritten_any, f"no sample model exercises {p.name}"


def softmax_without_matmul():
    """Gemm -> Softmax (a classifier head): attention_fusion requires MatMul and Transpose."""
    nodes = [helper.make_node("Gemm", ["x", "w"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["y"], axis=-1)]
    return make_model(nodes, [("x", [2, 3])], [("y", [2, 5])],
                      {"w": np.arange(15, dtype=np.float32).reshape(3, 5)})


def counting(function, calls):
    def counted(model, *args):
        calls.append(function.__name__)
        return function(model, *args)
    return counted


def test_optimize_does_not_call_a_pass_missing_a_required_op(monkeypatch):
    calls = []
    monkeypatch.setattr(optimized.passes, "PASSES", [
        p._replace(function=counting(p.function, calls)) if p.requires else p for p in PASSES])
    model = softmax_without_matmul()
    assert "Softmax" in graph_op_types(model)
    optimized_model = optimize(model, 99)
    assert "fuse_attention" not in calls and "fold_conv_affine" not in calls
    monkeypatch.setattr(optimized.passes, "PASSES",
                        [p._replace(requires=frozenset()) for p in PASSES])
    calls.clear()
    assert optimize(model, 99).SerializeToString() == optimized_model.SerializeToString()


def test_optimize_calls_a_pass_whose_required_ops_are_all_there(monkeypatch):
    calls = []
    monkeypatch.setattr(optimized.passes, "PASSES", [
        p._replace(function=counting(p.function, calls)) if p.requires else p for p in PASSES])
    optimize(gpt2_block(opset=17), 99)
    assert {"fuse_layer_norm", "fuse_attention"} <= set(calls)


def relu_then_identity():
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Identity", ["h"], ["y"])]
    return make_model(nodes, [("x", [2, 3])], [("y", [2, 3])])


def two_relus():
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    return make_model(nodes, [("x", [2, 3])], [("y", [2, 3])])


def drop_identities(model):
    """A pass that changes the model: Identity nodes become Relu (enough to make a version)."""
    for node in model.graph.node:
        if node.op_type == "Identity":
            node.op_type = "Relu"
    return model


def test_a_repeat_of_a_pass_that_left_these_bytes_as_they_were_does_not_run(monkeypatch):
    calls = []
    dead_code = counting(eliminate_dead_code, calls)
    monkeypatch.setattr(optimized.passes, "PASSES", [
        Pass("dead_code", 1, dead_code), Pass("nothing", 1, lambda model: model),
        Pass("dead_code_again", 1, dead_code, repeats="dead_code")])
    optimize(two_relus(), 1)
    assert calls == ["eliminate_dead_code"]


def test_a_repeat_runs_once_another_pass_changed_the_model(monkeypatch):
    calls = []
    dead_code = counting(eliminate_dead_code, calls)
    monkeypatch.setattr(optimized.passes, "PASSES", [
        Pass("dead_code", 1, dead_code), Pass("changes", 1, drop_identities),
        Pass("dead_code_again", 1, dead_code, repeats="dead_code")])
    rewritten = optimize(relu_then_identity(), 1)
    assert calls == ["eliminate_dead_code"] * 2
    assert [n.op_type for n in rewritten.graph.node] == ["Relu", "Relu"]


def test_the_same_function_twice_runs_twice_unless_named_a_repeat(monkeypatch):
    calls = []
    dead_code = counting(eliminate_dead_code, calls)
    monkeypatch.setattr(optimized.passes, "PASSES", [
        Pass("dead_code", 1, dead_code), Pass("dead_code_again", 1, dead_code)])
    optimize(two_relus(), 1)
    assert calls == ["eliminate_dead_code"] * 2


def test_registered_repeats_name_an_earlier_pass_of_the_same_function():
    names = [p.name for p in PASSES]
    for k, p in enumerate(PASSES):
        if p.repeats:
            earlier = PASSES[names.index(p.repeats)]
            assert names.index(p.repeats) < k and earlier.function is p.function
