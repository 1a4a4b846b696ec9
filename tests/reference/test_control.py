"""If, Loop, Scan: hand-checked values for the edges the corpus covers thinly."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from reference import ReferenceEvaluator
from reference.errors import NodeError

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def vi(name, elem=F, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, opset=16, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run(m, feeds):
    return ReferenceEvaluator(m).run(None, feeds)


def const(name, value):
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(value, name))


# Loop ------------------------------------------------------------------------------------
def doubling_body():
    """x_out = 2 * x_in; cond_out = x_out < 50; scan output: x_out."""
    return helper.make_graph(
        [
            const("two", np.array(2, np.float32)),
            const("fifty", np.array(50, np.float32)),
            helper.make_node("Mul", ["x_in", "two"], ["x_out"]),
            helper.make_node("Less", ["x_out", "fifty"], ["cond_out"]),
            helper.make_node("Identity", ["x_out"], ["scan"]),
        ],
        "body",
        [vi("i", I64, []), vi("cond_in", B, []), vi("x_in", F, [])],
        [vi("cond_out", B, []), vi("x_out", F, []), vi("scan", F, [])],
    )


def loop_model(m_name, cond_name):
    inputs = [vi("x", F, [])]
    if m_name:
        inputs.append(vi(m_name, I64, []))
    if cond_name:
        inputs.append(vi(cond_name, B, []))
    node = helper.make_node(
        "Loop", [m_name, cond_name, "x"], ["x_final", "xs"], body=doubling_body()
    )
    return model([node], inputs, [vi("x_final", F, []), vi("xs", F, ["n"])])


def test_loop_condition_only_runs_until_the_body_says_stop():
    # 1 -> 2, 4, 8, 16, 32 (still < 50), 64 (stop): six iterations
    x_final, xs = run(
        loop_model("", "cond"), {"x": np.array(1, np.float32), "cond": np.array(True)}
    )
    assert x_final.dtype == np.float32 and x_final.shape == ()
    assert x_final == 64
    np.testing.assert_array_equal(xs, np.array([2, 4, 8, 16, 32, 64], np.float32))


def test_loop_condition_only_false_at_start_runs_zero_times():
    x_final, xs = run(
        loop_model("", "cond"), {"x": np.array(3, np.float32), "cond": np.array(False)}
    )
    assert x_final == 3
    assert xs.shape == (0,) and xs.dtype == np.float32


def test_loop_zero_trip_count_keeps_initial_values_and_gives_empty_scan():
    x_final, xs = run(
        loop_model("M", "cond"),
        {"x": np.array(5, np.float32), "M": np.array(0, np.int64), "cond": np.array(True)},
    )
    assert x_final == 5 and x_final.dtype == np.float32
    assert xs.shape == (0,) and xs.dtype == np.float32


def test_loop_trip_count_and_condition_stop_at_whichever_comes_first():
    x_final, xs = run(
        loop_model("M", "cond"),
        {"x": np.array(1, np.float32), "M": np.array(3, np.int64), "cond": np.array(True)},
    )
    assert x_final == 8
    np.testing.assert_array_equal(xs, [2, 4, 8])
    x_final, xs = run(
        loop_model("M", "cond"),
        {"x": np.array(1, np.float32), "M": np.array(100, np.int64), "cond": np.array(True)},
    )
    assert x_final == 64 and len(xs) == 6


def test_loop_without_cond_input_ignores_the_body_condition():
    # The body says stop after 64, but with no 'cond' input only M counts: 1 * 2**8
    x_final, xs = run(
        loop_model("M", ""), {"x": np.array(1, np.float32), "M": np.array(8, np.int64)}
    )
    assert x_final == 256
    np.testing.assert_array_equal(xs, 2.0 ** np.arange(1, 9))


def test_loop_scan_output_keeps_the_per_iteration_rank():
    # per-iteration value of shape [2, 3] stacks to [M, 2, 3]
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["c"], ["c_out"]),
            helper.make_node("Add", ["acc", "w"], ["acc_out"]),
            helper.make_node("Identity", ["acc_out"], ["s"]),
        ],
        "body",
        [vi("i", I64, []), vi("c", B, []), vi("acc", F, [2, 3])],
        [vi("c_out", B, []), vi("acc_out", F, [2, 3]), vi("s", F, [2, 3])],
    )
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    m = model(
        [helper.make_node("Loop", ["M", "", "acc0"], ["acc", "ss"], body=body)],
        [vi("M", I64, []), vi("acc0", F, [2, 3])],
        [vi("acc", F, [2, 3]), vi("ss", F, [3, 2, 3])],
        initializers=[onnx.numpy_helper.from_array(w, "w")],
    )
    acc, ss = run(m, {"M": np.array(3, np.int64), "acc0": np.zeros((2, 3), np.float32)})
    np.testing.assert_array_equal(acc, 3 * w)
    assert ss.shape == (3, 2, 3)
    np.testing.assert_array_equal(ss[1], 2 * w)


def test_loop_scan_output_whose_shape_changes_is_an_error():
    # scan value: Range(0, i) has i elements in iteration i
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["c"], ["c_out"]),
            const("zero", np.array(0, np.int64)),
            const("one", np.array(1, np.int64)),
            helper.make_node("Range", ["zero", "i", "one"], ["r"]),
        ],
        "body",
        [vi("i", I64, []), vi("c", B, [])],
        [vi("c_out", B, []), vi("r", I64, ["k"])],
    )
    m = model(
        [helper.make_node("Loop", ["M", ""], ["rs"], body=body)],
        [vi("M", I64, [])],
        [vi("rs", I64, ["m", "k"])],
    )
    with pytest.raises(NodeError, match="changes across iterations"):
        run(m, {"M": np.array(3, np.int64)})


def test_loop_with_neither_trip_count_nor_condition_is_rejected():
    with pytest.raises(NodeError, match="never ends"):
        run(loop_model("", ""), {"x": np.array(1, np.float32)})


def test_iter_results_yields_loop_body_values_tagged_with_their_iteration():
    ev = ReferenceEvaluator(loop_model("M", ""))
    results = list(ev.iter_results({"x": np.array(1, np.float32), "M": np.array(2, np.int64)}))
    body_values = [r for r in results if r.path and r.kind == "result" and r.name == "x_out"]
    assert [r.path[-1] for r in body_values] == ["iter 0", "iter 1"]
    assert [float(r.value) for r in body_values] == [2.0, 4.0]
    assert all("body" in r.path for r in body_values)
    # the body's values come before the Loop's own result
    loop_result = next(i for i, r in enumerate(results) if r.name == "x_final" and not r.path)
    assert loop_result > max(results.index(r) for r in body_values)


# If --------------------------------------------------------------------------------------
def if_model():
    then_g = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["t"])], "then", [], [vi("t", F, [3])]
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", F, [3])]
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    return model([node], [vi("c", B, ["k"]), vi("x", F, [3])], [vi("y", F, [3])])


def test_if_picks_the_branch_and_sees_outer_values():
    x = np.array([1, -2, 3], np.float32)
    (y,) = run(if_model(), {"c": np.array([True]), "x": x})
    np.testing.assert_array_equal(y, [2, -4, 6])
    (y,) = run(if_model(), {"c": np.array([False]), "x": x})
    np.testing.assert_array_equal(y, [-1, 2, -3])


def test_if_condition_with_several_elements_is_an_error():
    with pytest.raises(NodeError, match="single element"):
        run(if_model(), {"c": np.array([True, False]), "x": np.zeros(3, np.float32)})


# Scan ------------------------------------------------------------------------------------
def running_sum_body(shape):
    return helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
            helper.make_node("Identity", ["s_out"], ["y_t"]),
        ],
        "body",
        [vi("s_in", F, shape), vi("x_t", F, shape)],
        [vi("s_out", F, shape), vi("y_t", F, shape)],
    )


def test_scan9_reverse_input_on_axis_1_and_prepended_output_on_axis_1():
    x = np.array([[1, 2, 3], [10, 20, 30]], np.float32)  # scan axis 1, reversed: columns 3, 2, 1
    node = helper.make_node(
        "Scan",
        ["s0", "x"],
        ["s", "y"],
        body=running_sum_body([2]),
        num_scan_inputs=1,
        scan_input_axes=[-1],
        scan_input_directions=[1],
        scan_output_axes=[1],
        scan_output_directions=[1],
    )
    m = model([node], [vi("s0", F, [2]), vi("x", F, [2, 3])], [vi("s", F, [2]), vi("y", F, [2, 3])])
    s, y = run(m, {"s0": np.zeros(2, np.float32), "x": x})
    np.testing.assert_array_equal(s, [6, 60])
    # running sums in iteration order: [3,30], [5,50], [6,60]; prepended -> reversed; stacked on axis 1
    np.testing.assert_array_equal(y, np.array([[6, 5, 3], [60, 50, 30]], np.float32))


def test_scan9_forward_output_on_last_axis_of_a_rank_3_result():
    x = np.arange(12, dtype=np.float32).reshape(3, 2, 2)  # scan axis 0, three steps
    node = helper.make_node(
        "Scan",
        ["s0", "x"],
        ["s", "y"],
        body=running_sum_body([2, 2]),
        num_scan_inputs=1,
        scan_output_axes=[-1],
    )
    m = model(
        [node],
        [vi("s0", F, [2, 2]), vi("x", F, [3, 2, 2])],
        [vi("s", F, [2, 2]), vi("y", F, [2, 2, 3])],
    )
    s, y = run(m, {"s0": np.zeros((2, 2), np.float32), "x": x})
    np.testing.assert_array_equal(s, x.sum(axis=0))
    assert y.shape == (2, 2, 3)
    np.testing.assert_array_equal(y[..., 1], x[0] + x[1])


def test_scan8_batches_with_sequence_lens_and_reverse_direction():
    x = np.array([[[1], [2], [3]], [[10], [20], [30]]], np.float32)  # [batch 2, seq 3, 1]
    node = helper.make_node(
        "Scan",
        ["lens", "s0", "x"],
        ["s", "y"],
        body=running_sum_body([1]),
        num_scan_inputs=1,
        directions=[1],
    )
    m = model(
        [node],
        [vi("lens", I64, [2]), vi("s0", F, [2, 1]), vi("x", F, [2, 3, 1])],
        [vi("s", F, [2, 1]), vi("y", F, [2, 3, 1])],
        opset=8,
    )
    s, y = run(m, {"lens": np.array([2, 3], np.int64), "s0": np.zeros((2, 1), np.float32), "x": x})
    np.testing.assert_array_equal(s, [[3], [60]])
    # batch 0 scans its first 2 steps backwards (2, 1) and pads the third with 0
    np.testing.assert_array_equal(y[0, :, 0], [2, 3, 0])
    np.testing.assert_array_equal(y[1, :, 0], [30, 50, 60])


def test_loop_inside_if_inside_scan_sees_every_enclosing_scope():
    # Scan over x; per element t: if t > 0 then run a Loop adding `step` (outer scope) t times
    # to the state, else keep the state.  Result: s + t * step for positive t.
    loop_body = helper.make_graph(
        [
            helper.make_node("Identity", ["lc"], ["lc_out"]),
            helper.make_node("Add", ["acc", "step"], ["acc_out"]),
        ],
        "loop_body",
        [vi("i", I64, []), vi("lc", B, []), vi("acc", F, [])],
        [vi("lc_out", B, []), vi("acc_out", F, [])],
    )
    then_g = helper.make_graph(
        [
            helper.make_node("Cast", ["t"], ["n"], to=I64),
            helper.make_node("Loop", ["n", "", "s_in"], ["looped"], body=loop_body),
        ],
        "then",
        [],
        [vi("looped", F, [])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Identity", ["s_in"], ["kept"])], "else", [], [vi("kept", F, [])]
    )
    scan_body = helper.make_graph(
        [
            const("zero", np.array(0, np.float32)),
            helper.make_node("Greater", ["t", "zero"], ["positive"]),
            helper.make_node("If", ["positive"], ["s_out"], then_branch=then_g, else_branch=else_g),
            helper.make_node("Identity", ["s_out"], ["trace"]),
        ],
        "scan_body",
        [vi("s_in", F, []), vi("t", F, [])],
        [vi("s_out", F, []), vi("trace", F, [])],
    )
    node = helper.make_node("Scan", ["s0", "x"], ["s", "trace"], body=scan_body, num_scan_inputs=1)
    m = model(
        [node],
        [vi("s0", F, []), vi("x", F, [4]), vi("step", F, [])],
        [vi("s", F, []), vi("trace", F, [4])],
    )
    s, trace = run(
        m,
        {
            "s0": np.array(0, np.float32),
            "x": np.array([2, -1, 3, 0], np.float32),
            "step": np.array(0.5, np.float32),
        },
    )
    np.testing.assert_array_equal(trace, [1.0, 1.0, 2.5, 2.5])
    assert s == 2.5 and s.dtype == np.float32
