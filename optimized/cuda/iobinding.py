"""IOBinding with onnxruntime's method names: inputs and outputs bound to a device, so a run
reads feeds that are already on the GPU and leaves chosen outputs there.

    binding = sess.io_binding()
    binding.bind_input("x", cupy_array)              # or bind_cpu_input("x", numpy_array), or
    binding.bind_input("x", "cuda", 0, np.float32, shape, ptr)  # onnxruntime's raw form
    binding.bind_output("y", "cuda")                 # "cpu" (default) copies it back
    sess.run_with_iobinding(binding)
    binding.get_outputs()                            # cupy arrays for cuda outputs
    binding.copy_outputs_to_cpu()                    # numpy arrays
"""
from __future__ import annotations

import numpy as np

DEVICE_TYPES = ("cpu", "cuda")


class IOBinding:
    def __init__(self, session):
        self._session = session
        self._inputs: dict = {}
        self._outputs: list[tuple[str, str]] = []
        self._results: list = []

    def bind_cpu_input(self, name: str, arr) -> None:
        self._inputs[name] = np.asarray(arr)

    def bind_input(self, name: str, device_type="cpu", device_id: int = 0, element_type=None,
                   shape=None, buffer_ptr=None) -> None:
        """bind_input(name, array) or onnxruntime's bind_input(name, device_type, device_id,
        element_type, shape, buffer_ptr)."""
        if hasattr(device_type, "shape") and hasattr(device_type, "dtype"):
            self._inputs[name] = device_type
            return
        _check_device_type(device_type)
        if buffer_ptr is None:
            raise ValueError("bind_input: give an array, or device_type, element_type, shape "
                             "and buffer_ptr")
        self._inputs[name] = from_pointer(device_type, device_id, element_type, shape, buffer_ptr)

    def bind_output(self, name: str, device_type="cpu", device_id: int = 0, element_type=None,
                    shape=None, buffer_ptr=None) -> None:
        _check_device_type(device_type)
        if buffer_ptr is not None:
            raise NotImplementedError("bind_output with a preallocated buffer_ptr")
        self._outputs.append((name, device_type))

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()

    def synchronize_inputs(self) -> None:
        pass  # bound inputs are read on the run's stream

    def synchronize_outputs(self) -> None:
        pass  # run_with_iobinding returns after the run's stream synchronized

    def get_outputs(self) -> list:
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list:
        return [_to_numpy(v) for v in self._results]

    # used by InferenceSession.run_with_iobinding -------------------------------------------
    def feeds(self) -> dict:
        return dict(self._inputs)

    def outputs(self, all_names: list[str]) -> list[tuple[str, str]]:
        """Bound outputs, or every output on the host when none is bound."""
        return list(self._outputs) or [(n, "cpu") for n in all_names]

    def set_results(self, values: list) -> None:
        self._results = values


def _check_device_type(device_type) -> None:
    if device_type not in DEVICE_TYPES:
        raise ValueError(f"device_type {device_type!r}: expected one of {DEVICE_TYPES}")


def _to_numpy(value):
    if isinstance(value, np.ndarray) or not hasattr(value, "get"):
        return value
    return value.get()


def from_pointer(device_type, device_id, element_type, shape, buffer_ptr):
    """An array over memory the caller owns (onnxruntime's buffer_ptr form)."""
    dtype = np.dtype(element_type)
    shape = tuple(int(d) for d in shape)
    size = int(np.prod(shape)) * dtype.itemsize
    if device_type == "cpu":
        import ctypes

        raw = (ctypes.c_byte * size).from_address(buffer_ptr)
        return np.frombuffer(raw, dtype=dtype).reshape(shape)
    import cupy

    memory = cupy.cuda.UnownedMemory(buffer_ptr, size, None, device_id)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(memory, 0))
