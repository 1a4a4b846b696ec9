"""The names apps import from onnxruntime.capi.onnxruntime_inference_collection."""
from ..iobinding import IOBinding  # noqa: F401
from ..ortvalue import OrtDevice, OrtValue  # noqa: F401
from ..session import InferenceSession  # noqa: F401
