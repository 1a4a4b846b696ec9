"""cuBLAS through nvmath-python's bindings: one handle per device, created before any capture,
with its own workspace and bound to the session's stream, so its GEMMs can be captured into a
CUDA graph (CuPy's matmul and CuPy's cuBLAS binding refuse to run during capture).

UNTESTED ON A GPU: written from nvmath-python's documented bindings (nvmath.bindings.cublas:
create, set_stream, set_workspace, set_math_mode, gemm_strided_batched_ex). Row-major C = A @ B
is computed as the column-major C^T = B^T @ A^T, so A and B swap places in the call.
"""
from __future__ import annotations

import numpy as np

# cuBLAS / CUDA enum values (cublas_api.h, library_types.h)
OP_N, OP_T = 0, 1
CUDA_R = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.float16): 2}
COMPUTE_32F, COMPUTE_64F, COMPUTE_32F_FAST_TF32 = 68, 70, 77
GEMM_DEFAULT = -1
DEFAULT_MATH, TF32_TENSOR_OP_MATH = 0, 3
WORKSPACE_BYTES = 32 << 20  # what cuBLAS recommends on Hopper


def nvmath_unavailable_reason() -> str | None:
    try:
        from nvmath.bindings import cublas  # noqa: F401
    except Exception as e:  # noqa: BLE001 - missing wheel or CUDA library
        return f"nvmath-python not usable ({type(e).__name__}: {e}); pip install 'onnx-parity[gpu]'"
    return None


def shared_blas(device) -> Blas:
    """The process's handle for this device, stream and math mode (made on first use)."""
    key = (device.device_id, device.use_tf32)
    if key not in _SHARED:
        _SHARED[key] = Blas(device)
    return _SHARED[key]


_SHARED: dict = {}


class Blas:
    def __init__(self, device):
        from nvmath.bindings import cublas

        self.cublas, self.device = cublas, device
        with device.cuda_device:
            self.workspace = device.xp.empty(WORKSPACE_BYTES, device.xp.uint8)
            self.handle = cublas.create()
        cublas.set_stream(self.handle, device.stream.ptr)
        cublas.set_workspace(self.handle, self.workspace.data.ptr, WORKSPACE_BYTES)
        cublas.set_math_mode(self.handle, TF32_TENSOR_OP_MATH if device.use_tf32 else DEFAULT_MATH)

    def plan(self, a, b, out, trans_a, trans_b, alpha, beta):
        """Everything shape-derived worked out now; the launch only calls cuBLAS."""
        dtype = np.dtype(out.dtype)
        if dtype not in CUDA_R or a.dtype != dtype or b.dtype != dtype:
            raise ValueError(f"gemm: dtype {dtype} not supported by the cuBLAS path")
        m, k = (a.shape[-1], a.shape[-2]) if trans_a else a.shape[-2:]
        n = b.shape[-2] if trans_b else b.shape[-1]
        batch = int(np.prod(out.shape[:-2]))
        stride_a = a.shape[-1] * a.shape[-2] if a.ndim > 2 else 0
        stride_b = b.shape[-1] * b.shape[-2] if b.ndim > 2 else 0
        if a.ndim > 2 and b.ndim == 2 and not trans_a:  # (batch, m, k) @ (k, n): one tall GEMM
            m, batch, stride_a = m * batch, 1, 0
        compute = COMPUTE_64F if dtype == np.float64 else (
            COMPUTE_32F_FAST_TF32 if self.device.use_tf32 and dtype == np.float32 else COMPUTE_32F)
        scalar = np.float64 if dtype == np.float64 else np.float32
        scalars = np.array([alpha, beta], scalar)  # host pointer mode: read when enqueued
        alpha_ptr, beta_ptr = scalars.ctypes.data, scalars.ctypes.data + scalars.itemsize
        cublas, handle, kind = self.cublas, self.handle, CUDA_R[dtype]
        args = (handle, OP_T if trans_b else OP_N, OP_T if trans_a else OP_N, n, m, k, alpha_ptr,
                b.data.ptr, kind, b.shape[-1], stride_b, a.data.ptr, kind, a.shape[-1], stride_a,
                beta_ptr, out.data.ptr, kind, n, m * n, batch, compute, GEMM_DEFAULT)

        def launch(_keep=(scalars, a, b, out)):
            cublas.gemm_strided_batched_ex(*args)

        return launch

    def close(self) -> None:
        if self.handle:
            self.cublas.destroy(self.handle)
            self.handle = 0
