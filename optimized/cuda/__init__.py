"""CUDAExecutionProvider on CuPy.

Importable without CuPy: every module takes an array module `xp` (cupy on a GPU, numpy for the
CPU tests and for the fallback path), and only device.py / arrays.CupyDevice touch CuPy.
"""
from .device import PROVIDER, gpu_unavailable_reason

__all__ = ["PROVIDER", "gpu_unavailable_reason"]
