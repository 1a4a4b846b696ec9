"""OrtValue, OrtDevice, OrtMemoryInfo and OrtArenaCfg with onnxruntime's methods.

An OrtValue holds what a run takes or returns: a NumPy array (sharing the caller's memory, as
onnxruntime's does for a contiguous array), a CuPy array on the CUDA provider, a list of values
(a sequence), a dict (a map) or nothing (an empty optional).
"""
from __future__ import annotations

import enum

import numpy as np

from reference.dtypes import np_dtype, onnx_type, type_name
from reference.values import EMPTY

from .errors import EPFail

DEVICE_TYPES = {"cpu": 0, "gpu": 1, "cuda": 1, "fpga": 2, "npu": 3}
CUDA_VENDOR_ID = 0x10DE  # NVIDIA, as onnxruntime's OrtDevice.make("cuda", ...) reports it


def element_dtype(element_type) -> np.dtype:
    """A NumPy type (np.float32) or an ONNX element-type number (TensorProto.FLOAT)."""
    if isinstance(element_type, (int, np.integer)) and not isinstance(element_type, bool):
        return np_dtype(int(element_type))
    try:
        return np.dtype(element_type)
    except TypeError as e:
        raise TypeError(f"element type {element_type!r}: expected a numpy type or an ONNX "
                        f"element-type number") from e


def describe_value(value) -> str:
    """onnxruntime's type string: 'tensor(float)', 'seq(tensor(int64))', 'map(string,...)'."""
    if isinstance(value, list):
        return f"seq({describe_value(value[0]) if value else 'tensor(float)'})"
    if isinstance(value, dict):
        key = next(iter(value), "")
        item = next(iter(value.values()), np.zeros((), np.float32))
        key_type = "string" if isinstance(key, str) else type_name(onnx_type(np.asarray(key).dtype))
        return f"map({key_type},{describe_value(np.asarray(item))})"
    if value is EMPTY or value is None:
        return "optional(tensor(float))"
    return f"tensor({type_name(onnx_type(value.dtype))})"


class OrtDevice:
    """A device: type (0 cpu, 1 gpu), id, vendor id and memory type."""

    def __init__(self, device_type: int, device_id: int = 0, vendor_id: int = 0, mem_type: int = 0):
        if not isinstance(device_type, int):
            raise TypeError(f"OrtDevice: use OrtDevice.make(name, device_id); got "
                             f"{type(device_type).__name__}")
        self._type, self._id, self._vendor, self._mem = device_type, int(device_id), vendor_id, mem_type

    @staticmethod
    def make(ort_device_name: str, device_id: int, vendor_id: int = -1) -> OrtDevice:
        name = str(ort_device_name).lower()
        if name not in DEVICE_TYPES:
            raise ValueError(f"Unsupported device type: {ort_device_name}; known: "
                             f"{sorted(DEVICE_TYPES)}")
        if vendor_id == -1:
            vendor_id = CUDA_VENDOR_ID if name == "cuda" else 0
        return OrtDevice(DEVICE_TYPES[name], device_id, int(vendor_id))

    # onnxruntime's constants, as methods as on its C OrtDevice
    cpu = staticmethod(lambda: 0)
    gpu = staticmethod(lambda: 1)
    cuda = staticmethod(lambda: 1)
    fpga = staticmethod(lambda: 2)
    npu = staticmethod(lambda: 3)
    default_memory = staticmethod(lambda: 0)

    def device_id(self) -> int:
        return self._id

    def device_type(self) -> int:
        return self._type

    def device_vendor_id(self) -> int:
        return self._vendor

    def device_mem_type(self) -> int:
        return self._mem

    @property
    def name(self) -> str:
        return "cuda" if self._type == 1 else "cpu"

    def __eq__(self, other) -> bool:
        return isinstance(other, OrtDevice) and (self._type, self._id, self._vendor, self._mem) == (
            other._type, other._id, other._vendor, other._mem)

    def __hash__(self) -> int:
        return hash((self._type, self._id, self._vendor, self._mem))

    def __repr__(self) -> str:
        return f"OrtDevice({self.name}, id={self._id})"


class OrtMemType(enum.IntEnum):
    CPU_INPUT = -2
    CPU_OUTPUT = -1
    CPU = -1
    DEFAULT = 0


class OrtAllocatorType(enum.IntEnum):
    INVALID = -1
    ORT_DEVICE_ALLOCATOR = 0
    ORT_ARENA_ALLOCATOR = 1


class OrtDeviceMemoryType(enum.IntEnum):
    DEFAULT = 0
    HOST_ACCESSIBLE = 5


class OrtMemoryInfo:
    """Where a session's input or output lives: onnxruntime's name ('Cpu', 'Cuda'), device id,
    memory type and allocator type."""

    def __init__(self, name: str, alloc_type, device_id: int, mem_type):
        self.name = str(name)
        self.allocator_type = OrtAllocatorType(int(alloc_type))
        self.device_id = int(device_id)
        self.mem_type = OrtMemType(int(mem_type))
        self.device_mem_type = OrtDeviceMemoryType.DEFAULT
        self.device_vendor_id = CUDA_VENDOR_ID if self.name == "Cuda" else 0

    @staticmethod
    def for_provider(provider: str, device_id: int = 0) -> OrtMemoryInfo:
        name = "Cuda" if provider == "CUDAExecutionProvider" else "Cpu"
        return OrtMemoryInfo(name, OrtAllocatorType.ORT_ARENA_ALLOCATOR,
                             device_id if name == "Cuda" else 0, OrtMemType.DEFAULT)

    def __eq__(self, other) -> bool:
        return isinstance(other, OrtMemoryInfo) and vars(self) == vars(other)

    def __repr__(self) -> str:
        return (f"OrtMemoryInfo(name={self.name!r}, device_id={self.device_id}, "
                f"mem_type={self.mem_type.name}, allocator_type={self.allocator_type.name})")


ARENA_KEYS = ("max_mem", "arena_extend_strategy", "initial_chunk_size_bytes",
              "max_dead_bytes_per_chunk", "initial_growth_chunk_size_bytes",
              "max_power_of_two_extend_bytes")


class OrtArenaCfg:
    """Arena settings, accepted and ignored (NumPy and CuPy allocate here)."""

    __slots__ = ARENA_KEYS

    def __init__(self, *args):
        for key in ARENA_KEYS:
            setattr(self, key, -1)
        if len(args) == 1 and isinstance(args[0], dict):
            for key, value in args[0].items():
                if key not in ARENA_KEYS:
                    raise ValueError(f"Invalid OrtArenaCfg option: {key}; known: {list(ARENA_KEYS)}")
                setattr(self, key, int(value))
        elif len(args) == 4:
            for key, value in zip(ARENA_KEYS, args):
                setattr(self, key, int(value))
        elif args:
            raise TypeError("OrtArenaCfg(max_mem, arena_extend_strategy, initial_chunk_size_bytes, "
                            "max_dead_bytes_per_chunk) or OrtArenaCfg(dict)")


CPU_DEVICE = OrtDevice(0)  # the host; one object serves every value there (a device never changes)


class OrtValue:
    """A value for run_with_ort_values and IOBinding. Make one with ortvalue_from_numpy or
    ortvalue_from_shape_and_type."""

    def __init__(self, value, device: OrtDevice | None = None):
        if isinstance(value, OrtValue):
            value, device = value._value, value._device
        self._value = value
        self._device = device or CPU_DEVICE

    # construction ---------------------------------------------------------------------
    @classmethod
    def ortvalue_from_numpy(cls, numpy_obj, device_type: str = "cpu", device_id: int = 0,
                            vendor_id: int = -1) -> OrtValue:
        """On the CPU the OrtValue shares the array's memory when the array is contiguous (else a
        contiguous copy is made); on "cuda" the data is copied to the device."""
        device = OrtDevice.make(device_type, device_id, vendor_id)
        if not isinstance(numpy_obj, (np.ndarray, np.generic)):
            raise TypeError(f"ortvalue_from_numpy: expected a numpy array, got "
                            f"{type(numpy_obj).__name__}")
        array = np.asarray(numpy_obj)
        if array.dtype.kind in "US":
            array = array.astype(object)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        return cls(_to_device(array, device), device)

    @classmethod
    def ortvalue_from_numpy_with_onnx_type(cls, data, onnx_element_type: int) -> OrtValue:
        """`data` reinterpreted as the ONNX element type (e.g. uint16 bits as bfloat16)."""
        array = np.ascontiguousarray(data)
        dtype = element_dtype(onnx_element_type)
        if dtype.itemsize != array.dtype.itemsize:
            raise ValueError(f"ortvalue_from_numpy_with_onnx_type: {array.dtype} has "
                             f"{array.dtype.itemsize} bytes per element, {dtype} needs {dtype.itemsize}")
        return cls(array.view(dtype))

    @classmethod
    def ortvalue_from_shape_and_type(cls, shape, element_type, device_type: str = "cpu",
                                     device_id: int = 0, vendor_id: int = -1) -> OrtValue:
        """A new zero-filled tensor (onnxruntime leaves it uninitialised)."""
        device = OrtDevice.make(device_type, device_id, vendor_id)
        array = np.zeros([int(d) for d in shape], dtype=element_dtype(element_type))
        return cls(_to_device(array, device), device)

    # inspection -----------------------------------------------------------------------
    def _tensor(self, what: str):
        if not self.is_tensor():
            raise RuntimeError(f"OrtValue.{what}: only tensors have it; this holds "
                               f"{self.data_type()}")
        return self._value

    def data_ptr(self) -> int:
        value = self._tensor("data_ptr")
        if hasattr(value, "data") and hasattr(value.data, "ptr"):
            return int(value.data.ptr)
        if value.dtype == object:
            raise RuntimeError("OrtValue.data_ptr: a string tensor has no flat data buffer")
        return int(value.ctypes.data)

    def device_name(self) -> str:
        self._tensor("device_name")
        return self._device.name

    def shape(self) -> list[int]:
        return [int(d) for d in self._tensor("shape").shape]

    def data_type(self) -> str:
        return describe_value(self._value)

    def element_type(self) -> int:
        value = self._value
        while isinstance(value, (list, dict)):
            if not value:
                return 1
            value = value[0] if isinstance(value, list) else next(iter(value.values()))
        if value is EMPTY or value is None:
            return 1
        return onnx_type(value.dtype)

    def tensor_size_in_bytes(self) -> int:
        return int(self._tensor("tensor_size_in_bytes").nbytes)

    def has_value(self) -> bool:
        return self._value is not None and self._value is not EMPTY

    def is_tensor(self) -> bool:
        return hasattr(self._value, "dtype") and hasattr(self._value, "shape")

    def is_sparse_tensor(self) -> bool:
        return False

    def is_tensor_sequence(self) -> bool:
        return isinstance(self._value, list)

    def numpy(self) -> np.ndarray:
        """The tensor as a NumPy array: the same memory on the CPU, a copy from a device."""
        value = self._tensor("numpy")
        return value.get() if hasattr(value, "get") and not isinstance(value, np.ndarray) else value

    def __array__(self, dtype=None, copy=None):
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def update_inplace(self, np_arr) -> None:
        """Copy `np_arr` into this tensor's memory (same shape and dtype)."""
        value = self._tensor("update_inplace")
        source = np.asarray(np_arr)
        if source.shape != value.shape or source.dtype != value.dtype:
            raise ValueError(f"update_inplace: got {source.dtype}{list(source.shape)}, this value "
                             f"is {value.dtype}{list(value.shape)}")
        if isinstance(value, np.ndarray):
            np.copyto(value, source)
        else:
            value.set(source)

    def value(self):
        """What a run takes: the array, list, dict or empty optional held."""
        return self._value

    def device(self) -> OrtDevice:
        return self._device

    def __repr__(self) -> str:
        return f"OrtValue({self.data_type()} on {self._device.name})"


def _to_device(array: np.ndarray, device: OrtDevice):
    if device.device_type() == 0:
        return array
    if device.device_type() != 1:
        raise EPFail(f"no allocator for device {device}: this runtime has the CPU and CUDA providers")
    from .cuda.device import gpu_unavailable_reason

    reason = gpu_unavailable_reason(device.device_id())
    if reason is not None:
        raise EPFail(f"cannot place an OrtValue on cuda:{device.device_id()}: {reason}")
    import cupy

    with cupy.cuda.Device(device.device_id()):
        return cupy.asarray(array)
