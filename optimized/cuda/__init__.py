"""CUDAExecutionProvider on CuPy.

Importable without CuPy: every module takes an array module `xp` (cupy on a GPU, numpy for the
CPU tests and for the fallback path), and only device.py / arrays.CupyDevice touch CuPy.
"""
from .device import PROVIDER, gpu_unavailable_reason


def node_counts(plan) -> dict[str, int]:
    """{'gpu': nodes run on the GPU, 'cpu': nodes that fell back to the host} of a device plan."""
    from .placement import node_counts as count

    return count(plan)


__all__ = ["PROVIDER", "gpu_unavailable_reason", "node_counts"]
