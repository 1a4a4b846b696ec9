"""onnx's backend interface over the optimized session (what `onnxruntime.backend` is for
onnxruntime), so that onnx's BackendTest runs it:

    import optimized.backend as backend
    rep = backend.prepare(model, "CPU", graph_optimization_level=99)
    outputs = rep.run([x])

prepare() takes SessionOptions attributes as keyword arguments (graph_optimization_level,
intra_op_num_threads, check_nodes, ...); device "CUDA" selects the CUDA provider.
"""
from __future__ import annotations

from reference.backend import ReferenceBackend, ReferenceRep
from reference.evaluator import load_model

from .info import get_available_providers
from .options import SessionOptions
from .session import InferenceSession

PROVIDERS = {"CPU": ["CPUExecutionProvider"], "CUDA": ["CUDAExecutionProvider", "CPUExecutionProvider"]}


class OptimizedBackend(ReferenceBackend):
    devices = ("CPU", "CUDA")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        if str(device).upper().startswith("CUDA"):
            return "CUDAExecutionProvider" in get_available_providers()
        return super().supports_device(device)

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> ReferenceRep:
        cls._check_device(device)
        options = SessionOptions()
        for key, value in kwargs.items():
            if not hasattr(options, key):
                raise TypeError(f"prepare(): unknown option {key!r}; the SessionOptions "
                                f"attributes are accepted")
            setattr(options, key, value)
        kind = "CUDA" if str(device).upper().startswith("CUDA") else "CPU"
        session = InferenceSession(load_model(model), options,
                                   providers=PROVIDERS[kind])
        names = [i.name for i in session.get_inputs()]
        return ReferenceRep(lambda feeds: session.run(None, feeds), names)


prepare = OptimizedBackend.prepare
run_model = OptimizedBackend.run_model
run_node = OptimizedBackend.run_node
supports_device = OptimizedBackend.supports_device
