"""MatMul, Gemm, Einsum, Det: hand-checked values for the edges the corpus covers thinly."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from reference import NodeError
from tests.reference.oneop import op_function, run_node


# MatMul ---------------------------------------------------------------------------------
def test_matmul_1d_operands():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    y = run_node("MatMul", a, a)
    assert y.shape == () and y.dtype == np.float32 and y == 14.0
    b = np.arange(12, dtype=np.float32).reshape(2, 3, 2)  # b[k] = [[0,1],[2,3],[4,5]] + 6k
    y = run_node("MatMul", a, b)
    np.testing.assert_array_equal(y, [[16, 22], [52, 58]])
    y = run_node("MatMul", b.transpose(0, 2, 1), a)
    np.testing.assert_array_equal(y, [[16, 22], [52, 58]])


def test_matmul_batch_broadcast_shape():
    a = np.ones((2, 1, 3, 4), np.float32)
    b = np.ones((5, 4, 2), np.float32)
    y = run_node("MatMul", a, b)
    assert y.shape == (2, 5, 3, 2)
    assert np.all(y == 4.0)


def test_matmul_integer_keeps_dtype():
    a = np.array([[1, 2], [3, 4]], np.int32)
    b = np.array([[5, 6], [7, 8]], np.int32)
    y = run_node("MatMul", a, b)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, [[19, 22], [43, 50]])
    y = run_node("MatMul", np.array([[2**32 - 1]], np.uint32), np.array([[2]], np.uint32))
    assert y.dtype == np.uint32 and y[0, 0] == 2**32 - 2  # wraps like the type


def test_matmul_half_types_keep_dtype():
    a = np.full((1, 3000), 1, np.float16)
    y = run_node("MatMul", a, a.T)
    assert y.dtype == np.float16 and y[0, 0] == 3000  # accumulated wider than float16
    b = np.array([[1, 2]], ml_dtypes.bfloat16)
    y = run_node("MatMul", b, b.T)
    assert y.dtype == ml_dtypes.bfloat16 and float(y[0, 0]) == 5.0


def test_matmul_shape_errors():
    with pytest.raises(NodeError):
        run_node("MatMul", np.ones((2, 3), np.float32), np.ones((2, 3), np.float32))
    with pytest.raises(TypeError, match="element type"):
        op_function("MatMul")(np.ones((2, 2), np.float32), np.ones((2, 2), np.float64))


# Gemm -----------------------------------------------------------------------------------
A = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)  # 2x3
B = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], np.float32)  # 3x2; A @ B = [[4,5],[10,11]]


def test_gemm_transposes_alpha_beta():
    c = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    y = run_node("Gemm", A.T.copy(), B.T.copy(), c, transA=1, transB=1, alpha=2.0, beta=0.5)
    np.testing.assert_array_equal(y, [[8.5, 11.0], [21.5, 24.0]])
    assert y.dtype == np.float32


@pytest.mark.parametrize(
    "c, expected",
    [
        (np.array([10.0, 20.0], np.float32), [[14, 25], [20, 31]]),  # (N,)
        (np.array([[10.0], [20.0]], np.float32), [[14, 15], [30, 31]]),  # (M, 1)
        (np.array(1.0, np.float32), [[5, 6], [11, 12]]),  # scalar
    ],
)
def test_gemm_unidirectional_broadcast_of_c(c, expected):
    np.testing.assert_array_equal(run_node("Gemm", A, B, c), expected)


def test_gemm_c_optional_from_11():
    np.testing.assert_array_equal(run_node("Gemm", A, B, opset=11, alpha=0.5), [[2, 2.5], [5, 5.5]])


def test_gemm_c_must_broadcast_to_mn():
    with pytest.raises(ValueError, match="broadcast"):
        op_function("Gemm")(A, B, np.ones((3, 2), np.float32))


def test_gemm_legacy_broadcast_attribute():
    c = np.array([10.0, 20.0], np.float32)
    y = run_node("Gemm", A, B, c, opset=6, broadcast=1)
    np.testing.assert_array_equal(y, [[14, 25], [20, 31]])
    with pytest.raises(NodeError, match="broadcast"):
        run_node("Gemm", A, B, c, opset=6)
    full = np.ones((2, 2), np.float32)
    np.testing.assert_array_equal(run_node("Gemm", A, B, full, opset=1, beta=2.0),
                                  [[6, 7], [12, 13]])


def test_gemm_integer_keeps_dtype():
    a = A.astype(np.int64)
    b = B.astype(np.int64)
    c = np.array([1, -1], np.int64)
    y = run_node("Gemm", a, b, c, opset=13)
    assert y.dtype == np.int64
    np.testing.assert_array_equal(y, [[5, 4], [11, 10]])


def test_gemm_float16():
    y = run_node("Gemm", A.astype(np.float16), B.astype(np.float16), np.zeros(2, np.float16))
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, [[4, 5], [10, 11]])


# Einsum ---------------------------------------------------------------------------------
def test_einsum_explicit_and_spaces():
    y = run_node("Einsum", A, B, equation=" ij , jk -> ik ")
    np.testing.assert_array_equal(y, [[4, 5], [10, 11]])


def test_einsum_implicit_output_is_sorted_by_ascii():
    # Implicit output: labels seen once, upper case before lower case.
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = run_node("Einsum", x, equation="ba")
    np.testing.assert_array_equal(y, x.T)
    y = run_node("Einsum", x, equation="aB")
    np.testing.assert_array_equal(y, x.T)
    y = run_node("Einsum", x, B, equation="ij,jk")  # j is summed, output ik
    np.testing.assert_array_equal(y, [[2, 3], [8, 9]])


def test_einsum_trace_diagonal_and_ellipsis():
    m = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    y = run_node("Einsum", m, equation="ii")
    assert y.shape == () and y == 5.0
    batch = np.stack([m, 10 * m])
    np.testing.assert_array_equal(run_node("Einsum", batch, equation="...ii->...i"),
                                  [[1, 4], [10, 40]])
    # implicit mode puts the ellipsis dimensions first
    a, b = np.ones((2, 3, 4), np.float32), np.ones((4, 5), np.float32)
    y = run_node("Einsum", a, b, equation="...j,jk")
    assert y.shape == (2, 3, 5) and np.all(y == 4.0)


def test_einsum_outer_product_and_sum():
    u = np.array([1, 2], np.int32)
    v = np.array([3, 4, 5], np.int32)
    y = run_node("Einsum", u, v, equation="i,j->ij")
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, [[3, 4, 5], [6, 8, 10]])
    assert run_node("Einsum", v, equation="i->") == 12


def test_einsum_three_operands_and_bfloat16():
    a = np.ones((2, 3), np.float32)
    y = run_node("Einsum", a, a.T.copy(), a, equation="ij,jk,kl->il")
    np.testing.assert_array_equal(y, np.full((2, 3), 6.0))
    b = np.array([[1, 2], [3, 4]], ml_dtypes.bfloat16)
    y = run_node("Einsum", b, b, equation="ij,ij->i")
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y.astype(np.float32), [5, 25])


def test_einsum_bad_equation():
    with pytest.raises(ValueError, match="operand terms"):
        op_function("Einsum")(np.ones(2), equation="i,i->")


# Det ------------------------------------------------------------------------------------
def test_det_2d_is_scalar():
    y = run_node("Det", np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    assert y.shape == () and y.dtype == np.float32
    np.testing.assert_allclose(y, -2.0, rtol=1e-6)


def test_det_batches():
    x = np.zeros((2, 3, 2, 2), np.float64)
    x[..., 0, 0] = np.arange(6).reshape(2, 3)
    x[..., 1, 1] = 2.0
    y = run_node("Det", x)
    assert y.shape == (2, 3) and y.dtype == np.float64
    np.testing.assert_allclose(y, 2.0 * np.arange(6).reshape(2, 3))


def test_det_float16_and_empty_batch():
    y = run_node("Det", (2 * np.eye(3)).astype(np.float16))
    assert y.dtype == np.float16 and y == 8.0
    assert run_node("Det", np.zeros((0, 3, 3), np.float32)).shape == (0,)


def test_det_needs_square():
    with pytest.raises(ValueError, match=r"\[\*, M, M\]"):
        op_function("Det")(np.ones((2, 3), np.float32))


# properties -----------------------------------------------------------------------------
ints = st.integers(-5, 5)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.data())
def test_matmul_matches_batched_einsum(batch, m, k, n, data):
    a = data.draw(hnp.arrays(np.int64, (batch, m, k), elements=ints))
    b = data.draw(hnp.arrays(np.int64, (k, n), elements=ints))
    y = op_function("MatMul")(a, b)
    np.testing.assert_array_equal(y, op_function("Einsum")(a, b, equation="bmk,kn->bmn"))
    # integer Gemm with alpha = beta = 1 is exact
    c = data.draw(hnp.arrays(np.int64, (n,), elements=ints))
    np.testing.assert_array_equal(op_function("Gemm")(a[0], b, c), y[0] + c)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.data())
def test_det_is_multiplicative(n, data):
    a = data.draw(hnp.arrays(np.float64, (n, n), elements=ints))
    b = data.draw(hnp.arrays(np.float64, (n, n), elements=ints))
    np.testing.assert_allclose(op_function("Det")(a @ b),
                               op_function("Det")(a) * op_function("Det")(b), rtol=1e-6, atol=1e-6)
