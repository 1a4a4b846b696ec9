"""NumPy-facing wrappers over the C kernels in csrc/ (the cffi extension optimized._kernels)."""
from __future__ import annotations

import numpy as np

try:
    from ._kernels import ffi, lib
except ImportError as e:  # pragma: no cover - only without a built extension
    raise ImportError(
        "optimized._kernels is not built; install the package with `pip install .` "
        "(it compiles csrc/ with cffi)"
    ) from e


def _float_ptr(a: np.ndarray):
    return ffi.cast("float *", ffi.from_buffer(a))


def relu_f32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Relu of a float32 array through the C kernel."""
    if x.dtype != np.float32:
        raise TypeError(f"relu_f32 takes float32, got {x.dtype}")
    x = np.ascontiguousarray(x)
    if out is None:
        out = np.empty_like(x)
    lib.relu_f32(_float_ptr(x), _float_ptr(out), x.size)
    return out
