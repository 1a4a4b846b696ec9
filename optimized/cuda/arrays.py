"""The device abstraction: where device values live and how they cross to the host.

A Device gives the array module `xp` kernels compute with and the two copies. FakeDevice runs
the whole device path on the CPU with numpy (copies are real array copies, so a value that was
not copied where the plan says it must be is still caught by the tests); CupyDevice is the GPU.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
from collections import Counter

import numpy as np

# dtypes CuPy computes with; bfloat16, float8, int4, strings and objects stay on the host
DEVICE_DTYPES = frozenset(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64))


class CaptureError(RuntimeError):
    """Something CUDA stream capture refuses: a host<->device copy, an allocation, a
    synchronize, or a library call that is not bound to the capturing stream."""


class Device:
    name = "cuda"
    xp = np
    cudnn_conv = None  # a planner of cuDNN convolutions, where the device has cuDNN

    def __init__(self):
        self.transfers: Counter = Counter()  # "to_device" / "to_host" -> count
        self.capturing = False
        self.use_tf32 = False  # fp32 GEMM/convolution on TF32 tensor cores (the user's choice)

    def is_device_array(self, value) -> bool:
        raise NotImplementedError

    def _upload(self, host: np.ndarray):
        raise NotImplementedError

    def _download(self, value) -> np.ndarray:
        raise NotImplementedError

    def _refuse_in_capture(self, what: str) -> None:
        if self.capturing:
            raise CaptureError(f"{what} during capture")

    def to_device(self, value):
        """A device copy of a host tensor; anything else (device arrays, None, sequences) as is."""
        if not isinstance(value, np.ndarray) or self.is_device_array(value):
            return value
        if value.dtype not in DEVICE_DTYPES:
            return value  # the device kernel will decline it and the host path runs
        self._refuse_in_capture("host-to-device copy")
        self.transfers["to_device"] += 1
        return self._upload(value)

    def to_host(self, value):
        if not self.is_device_array(value):
            return value
        self._refuse_in_capture("device-to-host copy")
        self.transfers["to_host"] += 1
        return self._download(value)

    def synchronize(self) -> None:
        self._refuse_in_capture("synchronize")

    def adopt(self, value):
        """A device kernel's result as this device's array type (FakeDevice re-tags numpy)."""
        return value

    # what a planned run is made of: buffers made at plan time, launches on the stream ----------
    def empty(self, shape, dtype):
        self._refuse_in_capture("allocation")
        return self._empty(tuple(shape), np.dtype(dtype))

    def copy_into(self, buffer, value) -> None:
        """A feed into its planned input buffer (before capture or replay, never inside)."""
        raise NotImplementedError

    def gemm(self, a, b, out, trans_a=False, trans_b=False, alpha=1.0, beta=0.0):
        """A launch computing out = alpha * op(a) @ op(b) + beta * out over C-contiguous arrays,
        2-D or batched with equal batch shapes, planned now (shapes, strides, scalars)."""
        raise NotImplementedError

    def kernel(self, spec):
        """A launcher for a hand-written kernel (kernel_sources.RawSpec): CUDA source on the GPU,
        its numpy twin here."""
        raise NotImplementedError

    def elementwise(self, group, inputs, out):
        """A launch of a fusion group's generated kernel writing `out`."""
        raise NotImplementedError

    @contextlib.contextmanager
    def capture(self, label: str = ""):
        """Inside: what a stream capture would refuse raises CaptureError. Yields a holder whose
        `.graph` is set on exit (a replayable graph)."""
        raise NotImplementedError


class DeviceArray(np.ndarray):
    """FakeDevice's device arrays: numpy arrays of a distinct type, so 'is it on the device'
    has an answer on the CPU.  While a FakeDevice captures, every numpy call on them is checked
    as CUDA stream capture would check its CuPy twin: results must go to given device buffers
    (out=), no host array may be read (that is a host-to-device copy) and no library GEMM may
    run (CuPy's cuBLAS calls refuse capture)."""

    def __array_finalize__(self, obj):
        if _capturing.get() and self.base is None:
            raise CaptureError("a device array was allocated during capture")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.get("out")
        if _capturing.get():
            _check_capture_call(f"np.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}"),
                                inputs, out, library=ufunc in _LIBRARY_UFUNCS)
        plain = [_plain(v) for v in inputs]
        if out is not None:
            kwargs["out"] = tuple(_plain(o) for o in out)
        result = getattr(ufunc, method)(*plain, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        if isinstance(result, tuple):
            return tuple(_tag(r) for r in result)
        return _tag(result)

    def __array_function__(self, func, types, args, kwargs):
        if _capturing.get():
            name = func.__name__
            if name not in _CAPTURE_SAFE_FUNCTIONS:
                raise CaptureError(f"np.{name} during capture (it allocates or calls a library; "
                                   f"only {sorted(_CAPTURE_SAFE_FUNCTIONS)} with out= launch)")
            out = args[0] if name == "copyto" else kwargs.get("out")
            rest = args[1:] if name == "copyto" else args
            _check_capture_call(f"np.{name}", list(rest) + [v for k, v in kwargs.items()
                                                             if k not in ("out", "axis", "keepdims",
                                                                          "dtype", "casting")],
                                None if out is None else (out,))
        return super().__array_function__(func, types, args, kwargs)


_capturing: contextvars.ContextVar[bool] = contextvars.ContextVar("fake_capture", default=False)
_LIBRARY_UFUNCS = frozenset({np.matmul, getattr(np, "vecdot", np.matmul)})
_CAPTURE_SAFE_FUNCTIONS = frozenset({"copyto", "sum", "mean", "amax", "amin", "max", "min",
                                     "concatenate", "take"})


def _plain(value):
    return value.view(np.ndarray) if isinstance(value, DeviceArray) else value


def _tag(value):
    return value.view(DeviceArray) if type(value) is np.ndarray else value


def _check_capture_call(name, inputs, out, library=False) -> None:
    if library:
        raise CaptureError(f"{name} during capture: a library GEMM must go through device.gemm "
                           f"(a handle bound to the capturing stream)")
    if out is None or not all(isinstance(o, DeviceArray) for o in out):
        raise CaptureError(f"{name} during capture without a device out= buffer (an allocation)")
    for v in _flat(inputs):
        if isinstance(v, np.ndarray) and not isinstance(v, DeviceArray):
            raise CaptureError(f"{name} during capture reads a host array of shape {v.shape} "
                               f"(a host-to-device copy)")


def _flat(values):
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flat(v)
        else:
            yield v


class FakeGraph:
    """The fake device's captured graph: the launches, replayed under the same checks."""

    def __init__(self, launches):
        self.launches = list(launches)

    def launch(self, stream=None) -> None:
        token = _capturing.set(True)
        try:
            for launch in self.launches:
                launch()
        finally:
            _capturing.reset(token)


class FakeDevice(Device):
    """numpy standing in for CuPy, for the CPU tests of placement, fusion and the device plan.
    Kernels' numpy twins run on plain views of the buffers, as a CUDA kernel runs on raw
    pointers: inside them nothing is checked."""

    def __init__(self, channels_last_conv: bool = False, use_tf32: bool = False):
        super().__init__()
        self.use_tf32 = use_tf32
        if channels_last_conv:  # the cuDNN path's decisions and layouts, over numpy
            from .cudnn import channels_last_twin

            self.cudnn_conv = channels_last_twin(self)

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

    def _empty(self, shape, dtype):
        return np.empty(shape, dtype).view(DeviceArray)

    def copy_into(self, buffer, value) -> None:
        self._refuse_in_capture("a feed copy")
        if not self.is_device_array(value):
            self.transfers["to_device"] += 1
        np.copyto(buffer.view(np.ndarray), _plain(value))

    def gemm(self, a, b, out, trans_a=False, trans_b=False, alpha=1.0, beta=0.0):
        _check_gemm(a, b, out, trans_a, trans_b)
        accumulate = np.float64 if out.dtype == np.float64 else np.float32
        a_, b_, o_ = _plain(a), _plain(b), _plain(out)

        def launch():
            x = a_.astype(accumulate, copy=False)
            y = b_.astype(accumulate, copy=False)
            r = np.matmul(np.swapaxes(x, -1, -2) if trans_a else x, np.swapaxes(y, -1, -2) if trans_b else y)
            if alpha != 1.0:
                r *= accumulate(alpha)
            if beta != 0.0:
                r += accumulate(beta) * o_.astype(accumulate)
            o_[...] = r

        return launch

    def kernel(self, spec):
        def launcher(*args, **params):
            plain = [_plain(a) for a in args]
            return lambda: spec.twin(*plain, **params)

        return launcher

    def elementwise(self, group, inputs, out):
        plain, o_ = [_plain(a) for a in inputs], _plain(out)
        return lambda: np.copyto(o_, group.evaluate(np, *plain))

    @contextlib.contextmanager
    def capture(self, label: str = ""):
        holder = _Captured()
        token = _capturing.set(True)
        self.capturing = True
        try:
            yield holder
        finally:
            _capturing.reset(token)
            self.capturing = False
        holder.graph = FakeGraph(holder.launches)


class _Captured:
    def __init__(self):
        self.launches: list = []
        self.graph = None

    def record(self, launch) -> None:
        """FakeDevice: remember a launch for replay (a CUDA graph records it by itself)."""
        self.launches.append(launch)


def _check_gemm(a, b, out, trans_a, trans_b) -> None:
    """What device.gemm takes: C-contiguous operands of one float dtype, equal batch shapes."""
    for name, v in (("a", a), ("b", b), ("out", out)):
        if v.ndim < 2 or not v.flags.c_contiguous:
            raise ValueError(f"gemm: {name} must be a C-contiguous matrix or batch of them, got "
                             f"shape {v.shape}")
    m, k = (a.shape[-1], a.shape[-2]) if trans_a else a.shape[-2:]
    k2, n = (b.shape[-1], b.shape[-2]) if trans_b else b.shape[-2:]
    batch = [s for s in (a.shape[:-2], b.shape[:-2]) if s]
    if k != k2 or out.shape[-2:] != (m, n) or len(set(batch)) > 1 or \
            int(np.prod(out.shape[:-2])) != int(np.prod(batch[0] if batch else ())):
        raise ValueError(f"gemm: shapes {a.shape} x {b.shape} -> {out.shape} do not match")


@functools.cache
def _device_stream(device_id: int):
    """One non-blocking stream per device, shared by its sessions, so the cuBLAS and cuDNN
    handles bound to it are made once per process (a conformance run makes thousands of
    sessions)."""
    import cupy

    with cupy.cuda.Device(device_id):
        return cupy.cuda.Stream(non_blocking=True)


class CupyDevice(Device):
    def __init__(self, device_id: int = 0, use_tf32: bool = False):
        super().__init__()
        import cupy

        self.xp = cupy
        self.device_id = device_id
        self.cuda_device = cupy.cuda.Device(device_id)
        self.use_tf32 = use_tf32
        self.stream = _device_stream(device_id)  # every launch of the sessions on this device
        self._blas = None
        self._compiled: dict = {}
        from .cudnn import cudnn_planner

        self.cudnn_conv = cudnn_planner(self)  # None without nvidia-cudnn-frontend

    def is_device_array(self, value) -> bool:
        return isinstance(value, self.xp.ndarray)

    def _upload(self, host):
        with self.cuda_device, self.stream:
            return self.xp.asarray(host)

    def _download(self, value):
        host = value.get(stream=self.stream)
        self.stream.synchronize()  # the copy was queued behind the run's launches
        return host

    def synchronize(self) -> None:
        super().synchronize()
        self.stream.synchronize()

    def _empty(self, shape, dtype):
        with self.cuda_device, self.stream:
            return self.xp.empty(shape, dtype)

    def copy_into(self, buffer, value) -> None:
        self._refuse_in_capture("a feed copy")
        if self.is_device_array(value):
            with self.stream:
                self.xp.copyto(buffer, value)
        else:
            self.transfers["to_device"] += 1
            buffer.set(np.ascontiguousarray(value), stream=self.stream)

    def gemm(self, a, b, out, trans_a=False, trans_b=False, alpha=1.0, beta=0.0):
        _check_gemm(a, b, out, trans_a, trans_b)
        if self._blas is None:
            from .blas import shared_blas

            self._blas = shared_blas(self)  # the handle exists before any capture
        return self._blas.plan(a, b, out, trans_a, trans_b, alpha, beta)

    def kernel(self, spec):
        if spec.name not in self._compiled:
            self._compiled[spec.name] = self.xp.RawKernel(spec.source, spec.name)
        raw = self._compiled[spec.name]

        def launcher(*args, **params):
            grid, block, scalars, shared = spec.geometry(*args, **params)
            arguments = tuple(args) + tuple(scalars)
            stream = self.stream

            def launch():
                with stream:  # RawKernel launches on the current stream
                    raw(grid, block, arguments, shared_mem=shared)

            return launch

        return launcher

    def elementwise(self, group, inputs, out):
        key = (group.expression, len(group.inputs), np.dtype(out.dtype).name)  # one compile per code
        if key not in self._compiled:
            self._compiled[key] = self.xp.ElementwiseKernel(**group.cuda_source(out.dtype))
        kernel, stream = self._compiled[key], self.stream

        def launch():
            with stream:
                kernel(*inputs, out)

        return launch

    @contextlib.contextmanager
    def capture(self, label: str = ""):
        holder = _Captured()
        holder.record = lambda launch: None  # the stream records the launches
        self.capturing = True
        try:
            with self.stream:
                self.stream.begin_capture()
                try:
                    yield holder
                finally:
                    holder.graph = self.stream.end_capture()
        finally:
            self.capturing = False


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
