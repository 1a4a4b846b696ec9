"""The names apps import from onnxruntime.capi.onnxruntime_pybind11_state: the exception classes
and the option and value types."""
from ..errors import (  # noqa: F401
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
from ..options import (  # noqa: F401
                      ExecutionMode,
                      ExecutionOrder,
                      GraphOptimizationLevel,
                      RunOptions,
                      SessionOptions,
)
from ..ortvalue import OrtAllocatorType, OrtArenaCfg, OrtDevice, OrtMemoryInfo, OrtMemType  # noqa: F401
