"""Is CuPy importable and is a CUDA device there: one answer, with the reason when not."""
from __future__ import annotations

import functools

PROVIDER = "CUDAExecutionProvider"


@functools.cache
def gpu_unavailable_reason(device_id: int = 0) -> str | None:
    """None when CuPy can run on CUDA device `device_id`, else why not (one line)."""
    try:
        import cupy
    except ImportError as e:
        return f"CuPy not installed ({e}); pip install 'onnx-parity[gpu]'"
    except Exception as e:  # noqa: BLE001 - a broken CUDA install raises anything at import
        return f"CuPy failed to import: {type(e).__name__}: {e}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - CUDARuntimeError, missing driver library, ...
        return f"no CUDA device: {type(e).__name__}: {e}"
    if count == 0:
        return "no CUDA device"
    if not 0 <= device_id < count:
        return f"device_id {device_id} out of range: {count} CUDA device(s)"
    return None
