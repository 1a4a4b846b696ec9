"""Logical and comparison ops, Where: strings, NaN, legacy broadcasting, narrow floats."""
import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import helper

from reference import NodeError, ReferenceEvaluator
from reference.dtypes import onnx_type


def run(op_type, *inputs, opset=28, **attrs):
    """Run one node in a model built with onnx.helper; None marks an absent optional input."""
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    graph = helper.make_graph(
        [helper.make_node(op_type, names, ["out"], **attrs)],
        "t",
        [
            helper.make_tensor_value_info(n, onnx_type(v.dtype), v.shape)
            for n, v in zip(names, inputs)
            if v is not None
        ],
        [helper.make_empty_tensor_value_info("out")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = onnx.IR_VERSION
    ctx.opset_imports = {"": opset}
    onnx.checker.check_node(model.graph.node[0], ctx)
    feeds = {n: v for n, v in zip(names, inputs) if v is not None}
    return ReferenceEvaluator(model, check=False).run(None, feeds)[0]


def arr(values, dtype=np.float32):
    return np.array(values, dtype=dtype)


def same(actual, expected):
    """Exact dtype, shape and values (NaN == NaN)."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_array_equal(actual, expected)


# comparisons -----------------------------------------------------------------------------------


def test_comparisons_with_nan_are_false():
    a, b = arr([1.0, np.nan, np.nan, 2.0]), arr([1.0, 1.0, np.nan, 3.0])
    same(run("Equal", a, b), arr([True, False, False, False], bool))
    same(run("Greater", a, b), arr([False, False, False, False], bool))
    same(run("Less", a, b), arr([False, False, False, True], bool))
    same(run("GreaterOrEqual", a, b), arr([True, False, False, False], bool))
    same(run("LessOrEqual", a, b), arr([True, False, False, True], bool))


def test_equal_strings_broadcast():
    a = np.array([["a", "b"], ["c", ""]], dtype=object)
    b = np.array(["a", ""], dtype=object)
    same(run("Equal", a, b), arr([[True, False], [False, True]], bool))


def test_compare_broadcast_higher_rank_unsigned_and_bfloat16():
    a = np.arange(6, dtype=np.uint64).reshape(2, 1, 3)
    b = arr([[1], [4]], np.uint64)  # (2, 1)
    out = run("Greater", a, b)
    assert out.shape == (2, 2, 3) and out.dtype == bool
    same(out[1], arr([[True, True, True], [False, False, True]], bool))
    bf = ml_dtypes.bfloat16
    same(run("Less", arr([1.0, 2.0], bf), arr([1.5, 1.5], bf)), arr([True, False], bool))


def test_scalar_comparison_is_0d():
    out = run("Equal", arr(3, np.int64), arr(3, np.int64))
    assert out.shape == () and out.dtype == bool and bool(out)


def test_legacy_broadcast_comparison():
    a = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    b = arr([5, 10, 20], np.int32)
    out = run("Greater", a, b, opset=6, broadcast=1, axis=1)
    same(out, a > b[:, None])
    with pytest.raises(NodeError, match="broadcast=1"):
        run("Equal", a, b, opset=6)


# logical ---------------------------------------------------------------------------------------


def test_and_or_xor_not_broadcast():
    a = arr([[True], [False]], bool)
    b = arr([True, False], bool)
    same(run("And", a, b), arr([[True, False], [False, False]], bool))
    same(run("Or", a, b), arr([[True, True], [True, False]], bool))
    same(run("Xor", a, b), arr([[False, True], [True, False]], bool))
    same(run("Not", arr([True, False], bool)), arr([False, True], bool))
    same(run("Xor", a, b[:1], opset=1, broadcast=1), arr([[False], [True]], bool))


@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(np.int16, (2, 3), elements=st.integers(-5, 5)),
    hnp.arrays(np.int16, (3,), elements=st.integers(-5, 5)),
)
def test_comparison_laws(a, b):
    lt, gt, eq = run("Less", a, b), run("Greater", b, a), run("Equal", a, b)
    same(lt, gt)
    same(run("LessOrEqual", a, b), lt | eq)
    same(run("GreaterOrEqual", a, b), ~lt)
    x, y = lt, eq
    same(run("Xor", x, y), run("And", run("Or", x, y), run("Not", run("And", x, y))))


# Where -----------------------------------------------------------------------------------------


def test_where_broadcasts_three_ways():
    cond = arr([[True], [False]], bool)  # (2, 1)
    x = arr([1, 2, 3], np.int64)  # (3,)
    y = arr(-1, np.int64)  # ()
    same(run("Where", cond, x, y), arr([[1, 2, 3], [-1, -1, -1]], np.int64))


def test_where_strings_and_empty():
    cond = arr([True, False], bool)
    out = run("Where", cond, np.array(["x", "y"], dtype=object), np.array(["p", "q"], dtype=object))
    assert out.dtype == object and list(out) == ["x", "q"]
    out = run("Where", np.zeros((0, 2), bool), arr([1.0, 2.0], np.float16), arr(0.0, np.float16))
    assert out.shape == (0, 2) and out.dtype == np.float16


def test_where_opset9():
    same(run("Where", arr([False, True], bool), arr([1.0, 2.0]), arr([3.0, 4.0]), opset=9),
         arr([3.0, 2.0]))  # fmt: skip
