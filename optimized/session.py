"""InferenceSession with onnxruntime's Python surface.

This first version runs the reference evaluator and replaces the ops that have a C kernel
(csrc/, via cffi); graph rewrites and the static plan arrive with the optimized runtime.
"""
from __future__ import annotations

import enum

import numpy as np

from reference import ReferenceEvaluator
from reference.dtypes import type_name

from .kernels import relu_f32

PROVIDERS = ["CPUExecutionProvider"]


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_ALL = 99

    @classmethod
    def from_level(cls, level: int) -> GraphOptimizationLevel:
        for member in sorted(cls, reverse=True):
            if level >= member:
                return member
        return cls.ORT_DISABLE_ALL


class SessionOptions:
    def __init__(self):
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.intra_op_num_threads = 0
        self.enable_profiling = False
        self.optimized_model_filepath = ""
        self.log_severity_level = 2
        self.check_nodes = False


class NodeArg:
    def __init__(self, value_info):
        self.name = value_info.name
        tp = value_info.type
        if tp.WhichOneof("value") == "tensor_type":
            self.type = f"tensor({type_name(tp.tensor_type.elem_type)})"
            self.shape = [
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in tp.tensor_type.shape.dim
            ]
        else:
            self.type = tp.WhichOneof("value") or "unknown"
            self.shape = None

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


def _relu(x):
    if x.dtype != np.float32:
        return NotImplemented
    return relu_f32(x)


FAST_KERNELS = {("", "Relu"): _relu}


class InferenceSession:
    def __init__(self, path_or_bytes, sess_options: SessionOptions | None = None,
                 providers=None, provider_options=None):
        self._options = sess_options or SessionOptions()
        unknown = [p for p in (providers or []) if (p if isinstance(p, str) else p[0]) not in PROVIDERS]
        if unknown:
            raise ValueError(f"unavailable providers {unknown}; available: {PROVIDERS}")
        self._evaluator = ReferenceEvaluator(path_or_bytes, kernels=FAST_KERNELS)
        self._inputs = [NodeArg(v) for v in self._evaluator.input_infos]
        self._outputs = [NodeArg(v) for v in self._evaluator.graph.output]

    def run(self, output_names, input_feed, run_options=None):
        return self._evaluator.run(output_names, input_feed)

    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def get_providers(self):
        return list(PROVIDERS)
