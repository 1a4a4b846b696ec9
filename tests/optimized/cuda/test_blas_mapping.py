"""The cuBLAS call optimized/cuda/blas.py makes, checked on the CPU: a stand-in for
nvmath.bindings.cublas evaluates cublasGemmStridedBatchedEx's column-major definition over numpy
memory, so the row-major -> column-major mapping (operands swapped, leading dimensions, batch
strides, the tall-GEMM shortcut, alpha/beta through host pointers) is tested without a GPU.
What it cannot test is cuBLAS itself: tests/optimized/cuda/test_gpu.py does, on a GPU."""
import contextlib
import ctypes
import sys
import types

import numpy as np
import pytest

from optimized.cuda import blas

MEMORY: dict[int, np.ndarray] = {}


class _Pointer:
    def __init__(self, array):
        self.ptr = id(array)
        MEMORY[self.ptr] = array


class DeviceLike:
    """A numpy array with CuPy's `.data.ptr`."""

    def __init__(self, array):
        self.array = np.ascontiguousarray(array)
        self.data = _Pointer(self.array)
        self.shape, self.dtype, self.ndim = self.array.shape, self.array.dtype, self.array.ndim


def _scalar(ptr, dtype):
    ctype = ctypes.c_double if dtype == np.float64 else ctypes.c_float
    return ctype.from_address(ptr).value


def _gemm_strided_batched_ex(handle, transa, transb, m, n, k, alpha, a, atype, lda, stride_a,
                             b, btype, ldb, stride_b, beta, c, ctype, ldc, stride_c, batch,
                             compute, algo):
    """C_i = alpha op(A_i) op(B_i) + beta C_i, column-major, as cuBLAS defines it."""
    A, B, C = (MEMORY[p].reshape(-1) for p in (a, b, c))
    scalar = np.float64 if C.dtype == np.float64 else np.float32
    al, be = _scalar(alpha, scalar), _scalar(beta, scalar)

    def matrix(flat, offset, rows, cols, ld):
        return np.array([[flat[offset + i + j * ld] for j in range(cols)] for i in range(rows)],
                        np.float64)

    for i in range(batch):
        opa = matrix(A, i * stride_a, m, k, lda) if transa == blas.OP_N else \
            matrix(A, i * stride_a, k, m, lda).T
        opb = matrix(B, i * stride_b, k, n, ldb) if transb == blas.OP_N else \
            matrix(B, i * stride_b, n, k, ldb).T
        old = matrix(C, i * stride_c, m, n, ldc)
        new = al * (opa @ opb) + be * old
        for r in range(m):
            for col in range(n):
                C[i * stride_c + r + col * ldc] = new[r, col]


@pytest.fixture
def fake_cublas(monkeypatch):
    calls = []
    module = types.SimpleNamespace(
        create=lambda: 1, destroy=lambda h: None, set_stream=lambda h, s: calls.append("stream"),
        set_workspace=lambda h, p, n: calls.append(("workspace", n)),
        set_math_mode=lambda h, mode: calls.append(("math", mode)),
        gemm_strided_batched_ex=_gemm_strided_batched_ex)
    bindings = types.SimpleNamespace(cublas=module)
    monkeypatch.setitem(sys.modules, "nvmath", types.SimpleNamespace(bindings=bindings))
    monkeypatch.setitem(sys.modules, "nvmath.bindings", bindings)
    monkeypatch.setitem(sys.modules, "nvmath.bindings.cublas", module)
    return calls


class _Device:
    def __init__(self, use_tf32=False):
        self.use_tf32 = use_tf32
        self.cuda_device = contextlib.nullcontext()
        self.stream = types.SimpleNamespace(ptr=7)
        self.xp = types.SimpleNamespace(uint8=np.uint8, empty=lambda n, dtype: DeviceLike(np.empty(n, dtype)))


@pytest.mark.parametrize("a_shape, b_shape, trans_a, trans_b", [
    ((5, 7), (7, 3), False, False),
    ((7, 5), (7, 3), True, False),
    ((5, 7), (3, 7), False, True),
    ((2, 5, 7), (2, 7, 3), False, False),  # batched
    ((2, 7, 5), (2, 3, 7), True, True),
    ((4, 5, 7), (7, 3), False, False),  # a batch of A against one B: one tall GEMM
    ((5, 7), (2, 7, 3), False, False),  # one A against a batch of B: stride 0 for A
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_major_gemm_maps_onto_column_major_cublas(fake_cublas, a_shape, b_shape, trans_a,
                                                       trans_b, dtype):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(a_shape).astype(dtype), rng.standard_normal(b_shape).astype(dtype)
    want = np.matmul(np.swapaxes(a, -1, -2) if trans_a else a, np.swapaxes(b, -1, -2) if trans_b else b)
    start = rng.standard_normal(want.shape).astype(dtype)
    out = DeviceLike(start.copy())
    launch = blas.Blas(_Device()).plan(DeviceLike(a), DeviceLike(b), out, trans_a, trans_b, 0.5, 2.0)
    launch()
    np.testing.assert_allclose(out.array, 0.5 * want + 2.0 * start, rtol=1e-5, atol=1e-5)
    assert ("workspace", blas.WORKSPACE_BYTES) in fake_cublas and "stream" in fake_cublas


def test_tf32_is_the_math_mode_only_when_asked(fake_cublas):
    blas.Blas(_Device(use_tf32=False))
    blas.Blas(_Device(use_tf32=True))
    modes = [c[1] for c in fake_cublas if isinstance(c, tuple) and c[0] == "math"]
    assert modes == [blas.DEFAULT_MATH, blas.TF32_TENSOR_OP_MATH]
