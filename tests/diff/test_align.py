"""Alignment: by name, then by structure; fused-away values are named as such."""
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conformance.diff import ReferenceSide, diff_models
from conformance.diff.align import APPROX, FUSED, MATCHED, ONLY_A, ONLY_B, _edit_alignment
from conformance.diff.capture import Record

X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
FEEDS = {"x": np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5}


def _model(nodes, inits=(), output=Y):
    graph = helper.make_graph(nodes, "g", [X], [output], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _weights():
    rng = np.random.default_rng(0)
    return (numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "W"),
            numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"))


def _statuses(report):
    return {(r.record.name, r.pair.status) for r in report.rows}


def test_renamed_values_are_matched_by_structure():
    a = _model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                helper.make_node("Neg", ["r"], ["n"], name="neg"),
                helper.make_node("Concat", ["n", "n"], ["y0"], axis=1),
                helper.make_node("Slice", ["y0", "s0", "s1", "s2"], ["y"])],
               [numpy_helper.from_array(np.array(v, np.int64), n)
                for n, v in [("s0", [0]), ("s1", [4]), ("s2", [1])]])
    b = _model([helper.make_node("Relu", ["x"], ["relu_out"], name="r2"),
                helper.make_node("Neg", ["relu_out"], ["neg_out"], name="n2"),
                helper.make_node("Concat", ["neg_out", "neg_out"], ["y0"], axis=1),
                helper.make_node("Slice", ["y0", "s0", "s1", "s2"], ["y"])],
               [numpy_helper.from_array(np.array(v, np.int64), n)
                for n, v in [("s0", [0]), ("s1", [4]), ("s2", [1])]])
    report = diff_models(a, b, feeds=FEEDS)
    assert report.row("r").pair.status == APPROX and report.row("r").pair.b.name == "relu_out"
    assert report.row("n").pair.b.name == "neg_out"
    assert report.row("y").pair.status == MATCHED
    assert report.divergent == []


def test_an_inserted_value_is_only_in_b_and_keeps_the_rest_in_line():
    W, _ = _weights()
    a = _model([helper.make_node("MatMul", ["x", "W"], ["y"])], [W])
    b = _model([helper.make_node("Identity", ["x"], ["x_copy"]),
                helper.make_node("MatMul", ["x_copy", "W"], ["y"])], [W])
    report = diff_models(a, b, feeds=FEEDS)
    assert ("x_copy", ONLY_B) in _statuses(report)
    assert report.row("y").pair.status == MATCHED and report.divergent == []
    names = [r.record.name for r in report.rows]
    assert names.index("x") < names.index("x_copy") < names.index("y")


def test_values_a_fusion_removed_are_fused_into_the_node():
    W, b_ = _weights()
    a = _model([helper.make_node("MatMul", ["x", "W"], ["xw"], name="matmul"),
                helper.make_node("Add", ["xw", "b"], ["y"], name="add")], [W, b_])
    b = _model([helper.make_node("Gemm", ["x", "W", "b"], ["y"], name="gemm")], [W, b_])
    report = diff_models(a, b, feeds=FEEDS)
    row = report.row("xw")
    assert row.pair.status == FUSED and row.status == "fused into gemm (Gemm)"
    assert not {s for _, s in _statuses(report)} & {ONLY_A, ONLY_B}
    assert report.row("y").metrics.within_tolerance


def test_folded_weights_of_b_are_fused_not_only_in_b():
    W, _ = _weights()
    a = _model([helper.make_node("MatMul", ["x", "W"], ["xw"], name="matmul"),
                helper.make_node("Mul", ["xw", "two"], ["y"], name="scale")],
               [W, numpy_helper.from_array(np.float32(2.0), "two")])
    folded = numpy_helper.from_array(numpy_helper.to_array(W) * 2, "W_scaled")
    b = _model([helper.make_node("MatMul", ["x", "W_scaled"], ["y"], name="matmul_scaled")],
               [folded])
    report = diff_models(a, b, feeds=FEEDS)
    statuses = _statuses(report)
    assert ("xw", FUSED) in statuses and ("W_scaled", FUSED) in statuses
    assert ("W", FUSED) in statuses and ("two", FUSED) in statuses
    assert report.row("y").metrics.within_tolerance


def _rec(i, name, shape=(2,), sig=(1.0, 0.5), op="Relu", kind="result"):
    return Record(index=i, name=name, kind=kind, type=f"float32{list(shape)}", dtype="float32",
                  shape=shape, op_type=op, signature=sig)


def test_edit_distance_skips_insertions_and_deletions():
    a = [_rec(0, "a0"), _rec(1, "a1", shape=(3,)), _rec(2, "a2", sig=(5.0, 1.0))]
    b = [_rec(0, "b0"), _rec(1, "extra", shape=(7,)), _rec(2, "b2", sig=(5.0, 1.0))]
    pairs = [(x and x.name, y and y.name) for x, y in _edit_alignment(a, b)]
    assert ("a0", "b0") in pairs and ("a2", "b2") in pairs
    assert ("a1", None) in pairs and (None, "extra") in pairs


def test_values_far_apart_are_not_called_a_match():
    a = [_rec(0, "a0", sig=(1.0, 0.5))]
    b = [_rec(0, "b0", sig=(9.0, 3.0))]
    assert _edit_alignment(a, b) in ([(a[0], None), (None, b[0])], [(None, b[0]), (a[0], None)])


def test_a_node_replaced_by_another_op_absorbs_the_values_between():
    W, _ = _weights()
    a = _model([helper.make_node("MatMul", ["x", "W"], ["xw"]),
                helper.make_node("Relu", ["xw"], ["y"])], [W])
    b = _model([helper.make_node("MatMul", ["x", "W"], ["y"])], [W])
    report = diff_models(ReferenceSide(a), ReferenceSide(b), feeds=FEEDS)
    # B's MatMul makes y, which A makes with Relu: A's xw sits between, so it is fused away.
    assert report.row("xw").pair.status == FUSED
    assert report.row("y").diverged  # Relu clipped negatives
    assert report.row("y").metrics.max_rel == np.inf  # B is negative where A is 0
    strict = json.loads(report.to_json(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert next(r for r in strict["rows"] if r["name"] == "y")["metrics"]["max_rel"] == "inf"
    with pytest.raises(KeyError, match="no row"):
        report.row("nothing")


def test_a_model_and_its_rewrite_align_with_only_fused_rows(tmp_path):
    from optimized import InferenceSession, SessionOptions

    from .gpt2_block import gpt2_model

    model = gpt2_model(d=32, heads=2, layers=1)
    options = SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "rewritten.onnx")
    InferenceSession(model.SerializeToString(), sess_options=options)
    rewritten = onnx.load(options.optimized_model_filepath)
    if [n.op_type for n in rewritten.graph.node] == [n.op_type for n in model.graph.node]:
        pytest.skip("the optimized passes rewrote nothing in this model")
    report = diff_models(model, rewritten, dims={"batch": 1, "seq": 8})  # both on the reference
    statuses = {r.pair.status for r in report.rows}
    assert FUSED in statuses and statuses <= {MATCHED, FUSED}
    assert report.divergent == [] and report.exit_code == 0
