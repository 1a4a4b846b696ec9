"""Logical and comparison ops, Where: strings, NaN, legacy broadcasting, narrow floats."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from reference import NodeError
from tests.reference.oneop import arr, run_node, same

# comparisons -----------------------------------------------------------------------------------


def test_comparisons_with_nan_are_false():
    a, b = arr([1.0, np.nan, np.nan, 2.0]), arr([1.0, 1.0, np.nan, 3.0])
    same(run_node("Equal", a, b), arr([True, False, False, False], bool))
    same(run_node("Greater", a, b), arr([False, False, False, False], bool))
    same(run_node("Less", a, b), arr([False, False, False, True], bool))
    same(run_node("GreaterOrEqual", a, b), arr([True, False, False, False], bool))
    same(run_node("LessOrEqual", a, b), arr([True, False, False, True], bool))


def test_equal_strings_broadcast():
    a = np.array([["a", "b"], ["c", ""]], dtype=object)
    b = np.array(["a", ""], dtype=object)
    same(run_node("Equal", a, b), arr([[True, False], [False, True]], bool))


def test_compare_broadcast_higher_rank_unsigned_and_bfloat16():
    a = np.arange(6, dtype=np.uint64).reshape(2, 1, 3)
    b = arr([[1], [4]], np.uint64)  # (2, 1)
    out = run_node("Greater", a, b)
    assert out.shape == (2, 2, 3) and out.dtype == bool
    same(out[1], arr([[True, True, True], [False, False, True]], bool))
    bf = ml_dtypes.bfloat16
    same(run_node("Less", arr([1.0, 2.0], bf), arr([1.5, 1.5], bf)), arr([True, False], bool))


def test_scalar_comparison_is_0d():
    out = run_node("Equal", arr(3, np.int64), arr(3, np.int64))
    assert out.shape == () and out.dtype == bool and bool(out)


def test_legacy_broadcast_comparison():
    a = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    b = arr([5, 10, 20], np.int32)
    out = run_node("Greater", a, b, opset=6, broadcast=1, axis=1)
    same(out, a > b[:, None])
    with pytest.raises(NodeError, match="broadcast=1"):
        run_node("Equal", a, b, opset=6)


# logical ---------------------------------------------------------------------------------------


def test_and_or_xor_not_broadcast():
    a = arr([[True], [False]], bool)
    b = arr([True, False], bool)
    same(run_node("And", a, b), arr([[True, False], [False, False]], bool))
    same(run_node("Or", a, b), arr([[True, True], [True, False]], bool))
    same(run_node("Xor", a, b), arr([[False, True], [True, False]], bool))
    same(run_node("Not", arr([True, False], bool)), arr([False, True], bool))
    same(run_node("Xor", a, b[:1], opset=1, broadcast=1), arr([[False], [True]], bool))


@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(np.int16, (2, 3), elements=st.integers(-5, 5)),
    hnp.arrays(np.int16, (3,), elements=st.integers(-5, 5)),
)
def test_comparison_laws(a, b):
    lt, gt, eq = run_node("Less", a, b), run_node("Greater", b, a), run_node("Equal", a, b)
    same(lt, gt)
    same(run_node("LessOrEqual", a, b), lt | eq)
    same(run_node("GreaterOrEqual", a, b), ~lt)
    x, y = lt, eq
    same(run_node("Xor", x, y),
         run_node("And", run_node("Or", x, y), run_node("Not", run_node("And", x, y))))


# Where -----------------------------------------------------------------------------------------


def test_where_broadcasts_three_ways():
    cond = arr([[True], [False]], bool)  # (2, 1)
    x = arr([1, 2, 3], np.int64)  # (3,)
    y = arr(-1, np.int64)  # ()
    same(run_node("Where", cond, x, y), arr([[1, 2, 3], [-1, -1, -1]], np.int64))


def test_where_strings_and_empty():
    cond = arr([True, False], bool)
    out = run_node("Where", cond, np.array(["x", "y"], dtype=object),
                   np.array(["p", "q"], dtype=object))
    assert out.dtype == object and list(out) == ["x", "q"]
    out = run_node("Where", np.zeros((0, 2), bool), arr([1.0, 2.0], np.float16),
                   arr(0.0, np.float16))
    assert out.shape == (0, 2) and out.dtype == np.float16


def test_where_opset9():
    same(run_node("Where", arr([False, True], bool), arr([1.0, 2.0]), arr([3.0, 4.0]), opset=9),
         arr([3.0, 2.0]))  # fmt: skip
