"""Optimized ONNX runtime with onnxruntime's Python API (`import optimized as ort`)."""
from .session import GraphOptimizationLevel, InferenceSession, NodeArg, SessionOptions

__all__ = ["GraphOptimizationLevel", "InferenceSession", "NodeArg", "SessionOptions"]
