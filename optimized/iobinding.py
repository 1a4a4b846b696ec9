"""IOBinding with onnxruntime's methods: inputs and outputs bound before a run, on the CPU or
(on the CUDA provider) on the GPU.

    binding = sess.io_binding()
    binding.bind_cpu_input("x", numpy_array)         # or bind_ortvalue_input("x", ortvalue), or
    binding.bind_input("x", "cpu", 0, np.float32, shape, ptr)    # memory the caller owns
    binding.bind_output("y")                         # a new array each run ("cuda": stays there)
    binding.bind_output("y", "cpu", 0, np.float32, shape, ptr)   # written into the caller's buffer
    binding.bind_ortvalue_output("y", ortvalue)      # written into the OrtValue
    sess.run_with_iobinding(binding)
    binding.get_outputs()                            # OrtValues
    binding.copy_outputs_to_cpu()                    # numpy arrays

Element types are numpy types (np.float32) or ONNX element-type numbers (TensorProto.FLOAT).
With no output bound, every output is returned on the CPU.
"""
from __future__ import annotations

import numpy as np

from .errors import InvalidArgument
from .ortvalue import CPU_DEVICE, OrtDevice, OrtValue, element_dtype


class UnknownBindingName(InvalidArgument, RuntimeError):
    """A bound name the model does not have: onnxruntime raises RuntimeError here."""


class IOBinding:
    def __init__(self, session):
        self._session = session
        self._inputs: dict = {}
        self._outputs: dict[str, tuple[OrtDevice, OrtValue | None]] = {}
        self._results: list[OrtValue] = []
        # a generation loop binds ~20 names a step: the model's names are listed once
        self._known_inputs = [i.name for i in session.get_inputs()]
        self._known_inputs += [i.name for i in session.get_overridable_initializers()]
        self._known_outputs = [o.name for o in session.get_outputs()]
        self._input_set, self._output_set = set(self._known_inputs), set(self._known_outputs)

    # inputs ---------------------------------------------------------------------------
    def bind_cpu_input(self, name: str, arr_on_cpu) -> None:
        self._inputs[self._input_name(name)] = arr_on_cpu

    def bind_input(self, name: str, device_type="cpu", device_id: int = 0, element_type=None,
                   shape=None, buffer_ptr=None) -> None:
        """onnxruntime's bind_input(name, device_type, device_id, element_type, shape,
        buffer_ptr), or bind_input(name, array) with a numpy or CuPy array."""
        name = self._input_name(name)
        if hasattr(device_type, "shape") and hasattr(device_type, "dtype"):
            self._inputs[name] = device_type
            return
        device = OrtDevice.make(device_type, device_id)
        if buffer_ptr is None or element_type is None or shape is None:
            raise InvalidArgument(f"bind_input({name!r}): give an array, or device_type, "
                                  f"element_type, shape and buffer_ptr")
        self._inputs[name] = from_pointer(device, element_dtype(element_type), shape, buffer_ptr)

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        if not isinstance(ortvalue, OrtValue):
            raise TypeError(f"bind_ortvalue_input({name!r}): expected an OrtValue, got "
                            f"{type(ortvalue).__name__}")
        self._inputs[self._input_name(name)] = ortvalue.value()

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def synchronize_inputs(self) -> None:
        """Nothing to wait for: bound inputs are read on the run's own stream."""

    # outputs --------------------------------------------------------------------------
    def bind_output(self, name: str, device_type="cpu", device_id: int = 0, element_type=None,
                    shape=None, buffer_ptr=None) -> None:
        name = self._output_name(name)
        if buffer_ptr is None and device_type == "cpu" and device_id == 0:
            self._outputs[name] = (CPU_DEVICE, None)  # a generation loop's every output, each step
            return
        device = OrtDevice.make(device_type, device_id)
        if buffer_ptr is None:
            self._outputs[name] = (device, None)
            return
        if element_type is None or shape is None:
            raise ValueError("`element_type` and `shape` are to be provided if pre-allocated "
                             "memory is provided")
        buffer = from_pointer(device, element_dtype(element_type), shape, buffer_ptr)
        self._outputs[name] = (device, OrtValue(buffer, device))

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        if not isinstance(ortvalue, OrtValue):
            raise TypeError(f"bind_ortvalue_output({name!r}): expected an OrtValue, got "
                            f"{type(ortvalue).__name__}")
        self._outputs[self._output_name(name)] = (ortvalue.device(), ortvalue)

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()

    def synchronize_outputs(self) -> None:
        """Nothing to wait for: run_with_iobinding returns after its stream synchronized."""

    def get_outputs(self) -> list[OrtValue]:
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list:
        return [r.numpy() if r.is_tensor() else r.value() for r in self._results]

    # names ----------------------------------------------------------------------------
    def _input_name(self, name: str) -> str:
        known = self._known_inputs
        if name not in self._input_set:
            raise UnknownBindingName(f"bind: unknown input {name!r}; the model's inputs are {known}")
        return name

    def _output_name(self, name: str) -> str:
        known = self._known_outputs
        if name not in self._output_set:
            raise UnknownBindingName(f"bind: unknown output {name!r}; the model's outputs are {known}")
        return name

    # used by InferenceSession.run_with_iobinding ------------------------------------
    def feeds(self) -> dict:
        return dict(self._inputs)

    def outputs(self, all_names: list[str]) -> list[tuple[str, str]]:
        """(name, device name) of the bound outputs, or of every output on the CPU."""
        if not self._outputs:
            return [(n, "cpu") for n in all_names]
        return [(n, device.name) for n, (device, _) in self._outputs.items()]

    def set_results(self, values: list) -> None:
        """Results of a run: written into preallocated outputs, else wrapped as new OrtValues."""
        names = list(self._outputs) or self._known_outputs
        results = []
        for name, value in zip(names, values):
            device, target = self._outputs.get(name, _UNBOUND)
            if target is None and type(value) is np.ndarray:
                results.append(OrtValue(value, device))
                continue
            if target is None:
                is_device = not isinstance(value, (np.ndarray, list, dict)) and hasattr(value, "shape")
                results.append(OrtValue(value, OrtDevice(1, device.device_id()) if is_device else device))
                continue
            if not target.is_tensor() or target.shape() != list(np.shape(value)):
                raise InvalidArgument(f"output {name!r}: the bound buffer has shape {target.shape()}, "
                                      f"the result {list(np.shape(value))}")
            target.update_inplace(_host(value) if isinstance(target.value(), np.ndarray) else value)
            results.append(target)
        self._results = results


_UNBOUND = (CPU_DEVICE, None)  # an output not bound: a new value on the host


def _host(value):
    return value if isinstance(value, np.ndarray) or not hasattr(value, "get") else value.get()


def from_pointer(device: OrtDevice, dtype: np.dtype, shape, buffer_ptr):
    """An array over memory the caller owns (onnxruntime's buffer_ptr form)."""
    shape = tuple(int(d) for d in shape)
    if device.device_type() == 0:
        import ctypes

        size = int(np.prod(shape)) * dtype.itemsize
        raw = (ctypes.c_byte * size).from_address(int(buffer_ptr))
        return np.frombuffer(raw, dtype=dtype).reshape(shape)
    from .cuda.iobinding import device_array_from_pointer

    return device_array_from_pointer(device.device_id(), dtype, shape, buffer_ptr)
