"""The names apps import from onnxruntime.capi.onnxruntime_pybind11_state: the exception classes
and the option and value types."""
from ..errors import (EngineError, EPFail, Fail, InvalidArgument, InvalidGraph,  # noqa: F401
                      InvalidProtobuf, ModelLoaded, NoModel, NoSuchFile, NotImplemented,
                      RuntimeException)
from ..options import (ExecutionMode, ExecutionOrder, GraphOptimizationLevel,  # noqa: F401
                       RunOptions, SessionOptions)
from ..ortvalue import (OrtAllocatorType, OrtArenaCfg, OrtDevice, OrtMemoryInfo,  # noqa: F401
                        OrtMemType)
