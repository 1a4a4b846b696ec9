"""onnxruntime's module-level functions: providers, device, version, build info, logging and
telemetry switches."""
from __future__ import annotations

from importlib import metadata

from .providers import CPU, KNOWN

# onnxruntime's full provider list, so that code which checks a name against it keeps working;
# only KNOWN (CPU, and CUDA where CuPy and a GPU are present) run here.
ALL_PROVIDERS = [
    "TensorrtExecutionProvider", "CUDAExecutionProvider", "MIGraphXExecutionProvider",
    "OpenVINOExecutionProvider", "DnnlExecutionProvider", "VitisAIExecutionProvider",
    "QNNExecutionProvider", "NnapiExecutionProvider", "VSINPUExecutionProvider",
    "JsExecutionProvider", "CoreMLExecutionProvider", "DmlExecutionProvider",
    "RknpuExecutionProvider", "WebNNExecutionProvider", "WebGpuExecutionProvider",
    "XnnpackExecutionProvider", "CANNExecutionProvider", "AzureExecutionProvider",
    "CPUExecutionProvider",
]
_logger = {"severity": 2, "verbosity": 0}


def version() -> str:
    try:
        return metadata.version("onnx-parity")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def get_all_providers() -> list[str]:
    return list(ALL_PROVIDERS)


def get_available_providers() -> list[str]:
    """CUDAExecutionProvider (when a GPU is usable through CuPy) before CPUExecutionProvider."""
    from .cuda.device import gpu_unavailable_reason

    return [p for p in KNOWN if p == CPU or gpu_unavailable_reason() is None]


def get_device() -> str:
    return "GPU" if len(get_available_providers()) > 1 else "CPU"


def get_version_string() -> str:
    return version()


def get_build_info() -> str:
    return f"onnx-parity {version()}: NumPy reference ops, C kernels through cffi, CUDA through CuPy"


def set_default_logger_severity(severity: int) -> None:
    """Accepted; this runtime logs nothing. 0 verbose .. 4 fatal, as onnxruntime checks."""
    if not isinstance(severity, int) or not 0 <= severity <= 4:
        raise RuntimeError(f"Invalid logging severity {severity!r}. 0:Verbose, 1:Info, "
                           f"2:Warning, 3:Error, 4:Fatal")
    _logger["severity"] = severity


def set_default_logger_verbosity(verbosity: int) -> None:
    _logger["verbosity"] = int(verbosity)


def disable_telemetry_events() -> None:
    """Accepted; this runtime sends no telemetry."""


def enable_telemetry_events() -> None:
    """Accepted; this runtime sends no telemetry."""
