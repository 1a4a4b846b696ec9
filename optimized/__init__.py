"""Optimized ONNX runtime with onnxruntime's Python API (`import optimized as ort`)."""
from . import capi
from .errors import (
    EngineError,
    EPFail,
    Fail,
    InvalidArgument,
    InvalidGraph,
    InvalidProtobuf,
    ModelLoaded,
    NoModel,
    NoSuchFile,
    NotImplemented,
    RuntimeException,
)
from .info import (
    disable_telemetry_events,
    enable_telemetry_events,
    get_all_providers,
    get_available_providers,
    get_build_info,
    get_device,
    get_version_string,
    set_default_logger_severity,
    set_default_logger_verbosity,
    version,
)
from .iobinding import IOBinding
from .lora import LoraAdapter
from .options import (
    ExecutionMode,
    ExecutionOrder,
    GraphOptimizationLevel,
    RunOptions,
    SessionOptions,
)
from .ortvalue import (
    OrtAllocatorType,
    OrtArenaCfg,
    OrtDevice,
    OrtDeviceMemoryType,
    OrtMemoryInfo,
    OrtMemType,
    OrtValue,
)
from .session import InferenceSession, ModelMetadata, NodeArg

__version__ = version()

# The onnxruntime module names an app may import, and the module of ours that stands for each.
ONNXRUNTIME_MODULES = {
    "onnxruntime": "optimized",
    "onnxruntime.capi": "optimized.capi",
    "onnxruntime.capi.onnxruntime_pybind11_state": "optimized.capi.onnxruntime_pybind11_state",
    "onnxruntime.capi.onnxruntime_inference_collection": "optimized.capi.onnxruntime_inference_collection",
    "onnxruntime.backend": "optimized.backend",
}


def register_as_onnxruntime() -> None:
    """Make `import onnxruntime` (and its submodules above) give this package, for apps that
    cannot change their imports: call it once before the app imports onnxruntime."""
    import importlib
    import sys

    for theirs, ours in ONNXRUNTIME_MODULES.items():
        sys.modules[theirs] = importlib.import_module(ours)


__all__ = [
    "EPFail", "EngineError", "ExecutionMode", "ExecutionOrder", "Fail", "GraphOptimizationLevel",
    "IOBinding", "InferenceSession", "InvalidArgument", "InvalidGraph", "InvalidProtobuf",
    "LoraAdapter", "ModelLoaded", "ModelMetadata", "NoModel", "NoSuchFile", "NodeArg",
    "NotImplemented", "OrtAllocatorType", "OrtArenaCfg", "OrtDevice", "OrtDeviceMemoryType",
    "OrtMemType", "OrtMemoryInfo", "OrtValue", "RunOptions", "RuntimeException", "SessionOptions",
    "__version__", "capi", "disable_telemetry_events", "enable_telemetry_events",
    "get_all_providers", "get_available_providers", "get_build_info", "get_device",
    "get_version_string", "register_as_onnxruntime", "set_default_logger_severity",
    "set_default_logger_verbosity",
]
