"""The comparison policy: exact dtype and shape, allclose for floats with NaN equal, exact
integers/bools/strings, and containers compared recursively."""
import ml_dtypes
import numpy as np
import pytest

from conformance.compare import Mismatch, Tolerance, compare_outputs, compare_values
from reference.values import EMPTY

TOL = Tolerance()


def test_float_within_rtol_passes():
    compare_values(np.array([1000.0], np.float32), np.array([1000.9], np.float32))


def test_float_beyond_rtol_fails_and_names_the_index():
    with pytest.raises(Mismatch, match=r"first at \[1\]"):
        compare_values(np.array([1.0, 1000.0], np.float32), np.array([1.0, 1002.0], np.float32))


def test_atol_governs_near_zero():
    compare_values(np.array([0.0]), np.array([5e-8]))
    with pytest.raises(Mismatch):
        compare_values(np.array([0.0]), np.array([5e-7]))


def test_nan_equals_nan_but_not_a_number():
    compare_values(np.array([np.nan, 1.0], np.float32), np.array([np.nan, 1.0], np.float32))
    with pytest.raises(Mismatch):
        compare_values(np.array([np.nan], np.float32), np.array([0.0], np.float32))
    with pytest.raises(Mismatch):
        compare_values(np.array([1.0], np.float32), np.array([np.nan], np.float32))


def test_inf_matches_only_same_sign_inf():
    compare_values(np.array([np.inf, -np.inf]), np.array([np.inf, -np.inf]))
    with pytest.raises(Mismatch):
        compare_values(np.array([np.inf]), np.array([-np.inf]))


def test_dtype_must_match_exactly():
    with pytest.raises(Mismatch, match="dtype"):
        compare_values(np.array([1.0], np.float32), np.array([1.0], np.float64))
    with pytest.raises(Mismatch, match="dtype"):
        compare_values(np.array([1], np.int64), np.array([1], np.int32))


def test_shape_must_match_exactly_even_when_broadcastable():
    with pytest.raises(Mismatch, match="shape"):
        compare_values(np.zeros((2, 3), np.float32), np.zeros((1, 2, 3), np.float32))
    with pytest.raises(Mismatch, match="shape"):
        compare_values(np.zeros((), np.float32), np.zeros((1,), np.float32))


def test_integers_are_exact():
    with pytest.raises(Mismatch):
        compare_values(np.array([1000000], np.int64), np.array([1000001], np.int64))
    compare_values(np.array([-3, 7], np.int8), np.array([-3, 7], np.int8))


def test_bools_are_exact():
    with pytest.raises(Mismatch):
        compare_values(np.array([True, False]), np.array([True, True]))


def test_strings_exact_and_bytes_equal_text():
    compare_values(np.array(["a", "b"], dtype=object), np.array(["a", "b"], dtype=object))
    compare_values(np.array([b"a"], dtype=object), np.array(["a"], dtype=object))
    with pytest.raises(Mismatch, match="strings differ"):
        compare_values(np.array(["a"], dtype=object), np.array(["A"], dtype=object))


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
                                   ml_dtypes.float8_e5m2, np.float16])
def test_low_precision_floats_compare_as_floats(dtype):
    a = np.array([1.0, 2.0, np.nan], dtype)
    compare_values(a, a.copy())
    with pytest.raises(Mismatch):
        compare_values(a, np.array([1.0, 4.0, np.nan], dtype))


@pytest.mark.parametrize("dtype", [ml_dtypes.int4, ml_dtypes.uint4])
def test_int4_exact(dtype):
    compare_values(np.array([1, 2], dtype), np.array([1, 2], dtype))
    with pytest.raises(Mismatch):
        compare_values(np.array([1, 2], dtype), np.array([1, 3], dtype))


def test_complex():
    compare_values(np.array([1 + 2j], np.complex64), np.array([1 + 2j], np.complex64))
    with pytest.raises(Mismatch):
        compare_values(np.array([1 + 2j], np.complex64), np.array([1 + 3j], np.complex64))


def test_sequences_recursive_with_lengths():
    seq = [np.array([1.0], np.float32), np.array([2, 3], np.int64)]
    compare_values(seq, [s.copy() for s in seq])
    with pytest.raises(Mismatch, match="length"):
        compare_values(seq, seq[:1])
    with pytest.raises(Mismatch, match=r"output\[1\]"):
        compare_values(seq, [seq[0], np.array([2, 4], np.int64)])
    with pytest.raises(Mismatch, match="sequence"):
        compare_values(seq, seq[0])


def test_optionals_empty_and_full():
    compare_values(EMPTY, EMPTY)
    compare_values(EMPTY, None)
    with pytest.raises(Mismatch, match="empty optional"):
        compare_values(EMPTY, np.array([1.0]))
    with pytest.raises(Mismatch):
        compare_values(np.array([1.0]), EMPTY)


def test_maps_keys_and_values():
    compare_values({1: np.float32(0.5)}, {1: np.float32(0.5)})
    with pytest.raises(Mismatch, match="keys"):
        compare_values({1: np.float32(0.5)}, {2: np.float32(0.5)})
    with pytest.raises(Mismatch):
        compare_values({"a": np.float32(0.5)}, {"a": np.float32(0.7)})


def test_output_count_must_match():
    with pytest.raises(Mismatch, match="outputs"):
        compare_outputs([np.zeros(1)], [np.zeros(1), np.zeros(1)])


def test_custom_tolerance():
    compare_values(np.array([1.0]), np.array([1.05]), Tolerance(rtol=0.1, atol=0))
    with pytest.raises(Mismatch):
        compare_values(np.array([1.0]), np.array([1.05]), Tolerance(rtol=0.01, atol=0))
