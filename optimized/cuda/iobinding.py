"""GPU memory given by pointer (IOBinding.bind_input/bind_output with a buffer_ptr on "cuda").
The IOBinding itself is optimized/iobinding.py, for both providers."""
from __future__ import annotations

import numpy as np


def device_array_from_pointer(device_id: int, dtype: np.dtype, shape: tuple, buffer_ptr: int):
    """A CuPy array over device memory the caller owns."""
    import cupy

    size = int(np.prod(shape)) * dtype.itemsize
    memory = cupy.cuda.UnownedMemory(int(buffer_ptr), size, None, device_id)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(memory, 0))
