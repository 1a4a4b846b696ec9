"""The device abstraction: where device values live and how they cross to the host.

A Device gives the array module `xp` kernels compute with and the two copies. FakeDevice runs
the whole device path on the CPU with numpy (copies are real array copies, so a value that was
not copied where the plan says it must be is still caught by the tests); CupyDevice is the GPU.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

# dtypes CuPy computes with; bfloat16, float8, int4, strings and objects stay on the host
DEVICE_DTYPES = frozenset(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64))


class Device:
    name = "cuda"
    xp = np

    def __init__(self):
        self.transfers: Counter = Counter()  # "to_device" / "to_host" -> count

    def is_device_array(self, value) -> bool:
        raise NotImplementedError

    def _upload(self, host: np.ndarray):
        raise NotImplementedError

    def _download(self, value) -> np.ndarray:
        raise NotImplementedError

    def to_device(self, value):
        """A device copy of a host tensor; anything else (device arrays, None, sequences) as is."""
        if not isinstance(value, np.ndarray) or self.is_device_array(value):
            return value
        if value.dtype not in DEVICE_DTYPES:
            return value  # the device kernel will decline it and the host path runs
        self.transfers["to_device"] += 1
        return self._upload(value)

    def to_host(self, value):
        if not self.is_device_array(value):
            return value
        self.transfers["to_host"] += 1
        return self._download(value)

    def synchronize(self) -> None:
        pass

    def adopt(self, value):
        """A device kernel's result as this device's array type (FakeDevice re-tags numpy)."""
        return value


class DeviceArray(np.ndarray):
    """FakeDevice's device arrays: numpy arrays of a distinct type, so 'is it on the device'
    has an answer on the CPU."""


class FakeDevice(Device):
    """numpy standing in for CuPy, for the CPU tests of placement, fusion and the device plan."""

    def is_device_array(self, value) -> bool:
        return isinstance(value, DeviceArray)

    def _upload(self, host):
        return np.array(host).view(DeviceArray)

    def _download(self, value):
        return np.array(value.view(np.ndarray))

    def adopt(self, value):
        if isinstance(value, (np.ndarray, np.generic)) and not isinstance(value, DeviceArray):
            return np.asarray(value).view(DeviceArray)
        return value


class CupyDevice(Device):
    def __init__(self, device_id: int = 0):
        super().__init__()
        import cupy

        self.xp = cupy
        self.device_id = device_id
        self.cuda_device = cupy.cuda.Device(device_id)

    def is_device_array(self, value) -> bool:
        return isinstance(value, self.xp.ndarray)

    def _upload(self, host):
        with self.cuda_device:
            return self.xp.asarray(host)

    def _download(self, value):
        return self.xp.asnumpy(value)

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()


def host_dtype(value):
    """The dtype of a host or device array, None for anything else."""
    dtype = getattr(value, "dtype", None)
    return np.dtype(dtype) if dtype is not None else None


def erf(xp, x):
    """erf for numpy (the reference's float64 erf) or cupy (cupyx.scipy.special)."""
    if xp is np:
        from reference.ops.math import erf64

        return np.asarray(erf64(x)).astype(x.dtype, copy=False)
    from cupyx.scipy.special import erf as cupy_erf

    return cupy_erf(x)
