"""Metrics between two values: hand-checked cases and the laws they obey."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conformance.diff.metrics import compare, ordered_bits
from reference.values import EMPTY


def test_hand_checked_float_errors():
    a = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    b = np.array([1.0, 2.5, 3.0, 4.0], np.float32)
    m = compare(a, b, rtol=1e-3, atol=1e-6)
    assert m.status == "diverged"
    assert m.max_abs == 0.5 and m.max_abs_index == (1,)
    assert m.max_rel == pytest.approx(0.25)
    assert m.mean_abs == pytest.approx(0.125)
    assert m.median_abs == 0.0
    assert m.out_of_tolerance == 1
    # 0.5 <= atol + 1e-3 * 2 needs atol >= 0.498; 0.5 <= 1e-6 + rtol * 2 needs rtol >= 0.2499995
    assert m.atol_to_pass == pytest.approx(0.498)
    assert m.rtol_to_pass == pytest.approx(0.2499995)
    assert m.cosine == pytest.approx(31 / np.sqrt(30 * 32.25))  # a.b = 1+5+9+16


def test_index_is_multidimensional():
    a = np.zeros((2, 3), np.float64)
    b = a.copy()
    b[1, 2] = -7.0
    m = compare(a, b)
    assert m.max_abs == 7.0 and m.max_abs_index == (1, 2)
    assert m.max_rel == np.inf  # error where A is zero


def test_nan_equals_nan_but_not_a_number():
    assert compare(np.array([np.nan, 1.0]), np.array([np.nan, 1.0])).status == "equal"
    m = compare(np.array([np.nan, 1.0]), np.array([1.0, 1.0]))
    assert m.status == "diverged" and m.nan_mismatch == 1 and m.out_of_tolerance == 1


def test_infinities_must_have_the_same_sign():
    m = compare(np.array([np.inf, 1.0]), np.array([-np.inf, 1.0]))
    assert m.inf_mismatch == 1 and m.status == "diverged"
    assert compare(np.array([np.inf]), np.array([np.inf])).status == "equal"


def test_within_tolerance_is_close_not_equal():
    m = compare(np.array([1.0], np.float32), np.array([1.0 + 1e-6], np.float32))
    assert m.status == "close" and m.within_tolerance and m.max_ulp == 8


def test_integers_compare_exactly():
    m = compare(np.array([1, 2, 3], np.int64), np.array([1, 5, 3], np.int64))
    assert m.status == "diverged" and m.out_of_tolerance == 1
    assert m.max_abs == 3 and m.max_abs_index == (1,)
    assert compare(np.array([True, False]), np.array([True, False])).status == "equal"


def test_strings_compare_exactly():
    a = np.array(["a", "b"], dtype=object)
    m = compare(a, np.array(["a", "c"], dtype=object))
    assert m.status == "diverged" and "'c'" in m.detail


def test_type_dtype_and_shape_mismatches_say_what_differs():
    assert "dtype" in compare(np.zeros(2, np.float32), np.zeros(2, np.float64)).detail
    assert "shape" in compare(np.zeros(2), np.zeros(3)).detail
    assert compare(np.zeros(2), [np.zeros(2)]).status == "mismatch"
    assert compare(EMPTY, EMPTY).status == "equal"
    assert compare(EMPTY, np.zeros(1)).status == "mismatch"


def test_sequences_report_their_worst_element():
    m = compare([np.zeros(2), np.zeros(2)], [np.zeros(2), np.array([0.0, 3.0])])
    assert m.status == "diverged" and m.max_abs == 3.0
    assert "length" in compare([np.zeros(1)], []).detail


def test_ulp_distance_counts_representable_values():
    one = np.array([1.0], np.float32)
    assert compare(one, np.nextafter(one, np.float32(2))).max_ulp == 1
    # across zero: -min_subnormal .. +min_subnormal is 2 steps
    tiny = np.array([np.float32(1e-45)])
    assert compare(-tiny, tiny, atol=0.0, rtol=0.0).max_ulp == 2
    assert ordered_bits(np.array([-0.0, 0.0], np.float32)).tolist() == [0, 0]
    b = np.array([1.0], ml_dtypes.bfloat16)
    step = np.array([1.0078125], ml_dtypes.bfloat16)  # 1 + 2**-7, the next bfloat16
    assert compare(b, step).max_ulp == 1


finite = hnp.arrays(np.float64, st.integers(1, 30),
                    elements=st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False))


@settings(max_examples=60, deadline=None)
@given(finite, finite)
def test_smallest_tolerances_are_the_ones_that_pass(x, y):
    n = min(x.size, y.size)
    a, b = x[:n], y[:n]
    rtol = 1e-3
    m = compare(a, b, rtol=rtol, atol=1e-7)
    assert compare(a, b, rtol=rtol, atol=m.atol_to_pass * (1 + 1e-9) + 1e-300).within_tolerance
    if m.atol_to_pass > 1e-6:
        assert not compare(a, b, rtol=rtol, atol=m.atol_to_pass * 0.999).within_tolerance


@settings(max_examples=60, deadline=None)
@given(finite)
def test_a_value_equals_itself_and_error_is_symmetric(x):
    m = compare(x, x.copy())
    assert m.status == "equal" and m.max_abs == 0.0 and m.max_ulp == 0
    y = x[::-1].copy()
    assert compare(x, y).max_abs == compare(y, x).max_abs
    assert compare(x, y).max_ulp == compare(y, x).max_ulp
