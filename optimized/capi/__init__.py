"""Mirrors onnxruntime.capi for apps that import from it (see optimized.register_as_onnxruntime)."""
from . import onnxruntime_inference_collection, onnxruntime_pybind11_state  # noqa: F401
