"""CUDAExecutionProvider on CuPy.

Importable without CuPy: every module takes an array module `xp` (cupy on a GPU, numpy for the
CPU tests and for the fallback path) or a Device (arrays.py: CupyDevice on a GPU, FakeDevice with
its strict capturing mode on the CPU). Only device.py and arrays.CupyDevice touch CuPy, and only
blas.py (nvmath-python) and cudnn.py (nvidia-cudnn-frontend) touch those libraries, on first use.

placement.py places nodes and copies, fusion.py writes elementwise groups as kernels, plan.py
runs node by node (any graph), launches.py + planned.py plan a run per input-shape signature
(one arena, launches only), graph_capture.py captures those runs in CUDA graphs.
"""
from .device import PROVIDER, gpu_unavailable_reason


def node_counts(plan) -> dict[str, int]:
    """{'gpu': nodes run on the GPU, 'cpu': nodes that fell back to the host} of a device plan."""
    from .placement import node_counts as count

    return count(plan)


__all__ = ["PROVIDER", "gpu_unavailable_reason", "node_counts"]
