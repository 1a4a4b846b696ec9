"""The CPU provider's fast kernels: (domain, op_type) -> function with the reference calling
convention (inputs positional, attributes as keywords).  A kernel returns NotImplemented for a
case it does not cover (another dtype, an unusual attribute); the reference op then runs."""
from __future__ import annotations

import numpy as np

from . import kernels


def relu(x):
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        return NotImplemented
    return kernels.relu_f32(x)


KERNELS = {
    ("", "Relu"): relu,
}


def set_num_threads(n: int) -> None:
    """intra_op_num_threads: 0 leaves the libraries' defaults."""
    setter = getattr(kernels, "set_num_threads", None)
    if n and setter is not None:
        setter(n)
