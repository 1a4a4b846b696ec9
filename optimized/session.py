"""InferenceSession with onnxruntime's Python surface (`import optimized as ort`).

load -> validate -> graph rewrites by level (optimized/passes) -> static plan with a kernel per
node (optimized/cpu.py, else the reference op) -> run.
"""
from __future__ import annotations

import enum
import json
import os
import tempfile
import time

import numpy as np
import onnx

from reference import ReferenceEvaluator
from reference.dtypes import type_name
from reference.evaluator import Result, load_model, validate
from reference.types import check_feed
from reference.values import EMPTY

from .plan import Profiler

PROVIDERS = ["CUDAExecutionProvider", "CPUExecutionProvider"]


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
    """The onnxruntime options that apply here, plus `check_nodes` (compare every fast kernel
    with the reference op) and `check_nodes_dir` (where the first mismatch's repro goes)."""

    def __init__(self):
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.intra_op_num_threads = 0
        self.enable_profiling = False
        self.profile_file_prefix = "onnx_parity_profile"
        self.optimized_model_filepath = ""
        self.log_severity_level = 2
        self.check_nodes = False
        self.check_nodes_dir = ""


class RunOptions:
    def __init__(self):
        self.log_severity_level = 2
        self.tag = ""


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


class ModelMetadata:
    def __init__(self, model):
        self.producer_name = model.producer_name
        self.graph_name = model.graph.name
        self.domain = model.domain
        self.description = model.doc_string
        self.graph_description = model.graph.doc_string
        self.version = model.model_version
        self.custom_metadata_map = {p.key: p.value for p in model.metadata_props}


class NodeCheckError(AssertionError):
    """Check mode: a fast kernel's result is past tolerance from the reference op's."""


class InferenceSession:
    def __init__(self, path_or_bytes, sess_options: SessionOptions | None = None,
                 providers=None, provider_options=None, **kwargs):
        self._options = sess_options or SessionOptions()
        from .providers import make_plan, select

        self._providers, self._provider_options = select(providers, provider_options)
        original = load_model(path_or_bytes)
        validate(original)
        self._original = original
        self._model = self._rewrite(original)
        self._evaluator = ReferenceEvaluator(self._model, check=False)
        from .cpu import set_num_threads

        self._set_num_threads = set_num_threads
        set_num_threads(self._options.intra_op_num_threads)
        fuse = self._options.graph_optimization_level >= GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        self._plan = make_plan(self._model, self._evaluator, self._provider_options, fuse)
        self._inputs = [NodeArg(v) for v in self._evaluator.input_infos]
        self._outputs = [NodeArg(v) for v in self._model.graph.output]
        self._profiler = Profiler() if self._options.enable_profiling else None

    def _rewrite(self, model):
        from .passes import optimize

        level = int(self._options.graph_optimization_level)
        rewritten = optimize(model, level) if level > 0 else model
        if self._options.optimized_model_filepath:
            onnx.save(rewritten, self._options.optimized_model_filepath)
        return rewritten

    # onnxruntime's surface ------------------------------------------------------------
    def run(self, output_names, input_feed, run_options=None):
        self._check_feeds(input_feed)
        self._set_num_threads(self._options.intra_op_num_threads)  # sessions may differ
        checker = self._check_node if self._options.check_nodes else None
        outputs = self._plan.run(input_feed, profiler=self._profiler, checker=checker)
        all_names = [o.name for o in self._outputs]
        if not output_names:
            return outputs
        for name in output_names:
            if name not in all_names:
                raise ValueError(f"unknown output {name!r}; the model's outputs are {all_names}")
        return [outputs[all_names.index(n)] for n in output_names]

    @property
    def optimized_model(self):
        """The model after the graph rewrites of this session's level."""
        return self._model

    def iter_results(self, input_feed):
        """Initializers, inputs, every node result (subgraph values with their path) and the
        outputs, as the reference evaluator yields them: the observer hook for diffing."""
        self._check_feeds(input_feed)
        for name, value in self._evaluator.initial_values().items():
            if name not in input_feed:
                yield Result("initializer", name, value)
        for name, value in input_feed.items():
            yield Result("input", name, value)
        produced: list[Result] = []
        outputs = self._plan.run(input_feed, observer=produced.append)
        yield from produced
        for out, value in zip(self._outputs, outputs):
            yield Result("output", out.name, value)

    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def get_overridable_initializers(self):
        return [NodeArg(v) for v in self._evaluator.overridable]

    def get_providers(self):
        return list(self._providers)

    def get_provider_options(self):
        from .providers import as_strings

        return as_strings(self._provider_options)

    def io_binding(self):
        from .cuda.iobinding import IOBinding

        return IOBinding(self)

    def run_with_iobinding(self, iobinding, run_options=None) -> None:
        """Run on the bound inputs; outputs bound to "cuda" stay on the device."""
        names = [o.name for o in self._outputs]
        wanted = iobinding.outputs(names)
        for name, _ in wanted:
            if name not in names:
                raise ValueError(f"unknown output {name!r}; the model's outputs are {names}")
        on_device = [n for n, where in wanted if where == "cuda"]
        if on_device and "CUDAExecutionProvider" not in self._providers:
            raise ValueError(f"outputs {on_device} are bound to cuda, but this session runs on "
                             f"{self._providers}")
        feeds = iobinding.feeds()
        if not on_device and all(isinstance(v, np.ndarray) for v in feeds.values()):
            self._check_feeds(feeds)
        outputs = self._plan.run(feeds, device_outputs=on_device) if on_device else self._plan.run(feeds)
        iobinding.set_results([outputs[names.index(n)] for n, _ in wanted])

    def get_session_options(self):
        return self._options

    def get_modelmeta(self):
        return ModelMetadata(self._original)

    def end_profiling(self) -> str:
        """Write the Chrome-trace JSON of the runs so far; returns its path ('' if disabled)."""
        if self._profiler is None:
            return ""
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
        path = f"{self._options.profile_file_prefix}_{stamp}.json"
        with open(path, "w") as f:
            json.dump(self._profiler.events, f)
        self._profiler = Profiler()
        return path

    # checks ---------------------------------------------------------------------------
    def _check_feeds(self, feeds: dict) -> None:
        known = {i.name: i for i in self._evaluator.input_infos + self._evaluator.overridable}
        for name in feeds:
            if name not in known:
                raise ValueError(
                    f"unknown input {name!r}; the model's inputs are {self._evaluator.input_names}")
        for info in self._evaluator.input_infos:
            if info.name not in feeds:
                raise ValueError(f"missing input {info.name!r}")
        for name, value in feeds.items():
            if hasattr(value, "__cuda_array_interface__"):
                value = self._device_feed_stand_in(name, value)
            elif not isinstance(value, (np.ndarray, np.generic, list, dict)) and value not in (None, EMPTY):
                raise TypeError(f"input {name!r}: expected a numpy array, got {type(value).__name__}")
            check_feed(known[name], np.asarray(value) if isinstance(value, np.generic) else value)

    def _device_feed_stand_in(self, name: str, value) -> np.ndarray:
        """A device array (CuPy) is checked by its dtype and shape, without a copy to the host."""
        if "CUDAExecutionProvider" not in self._providers:
            raise TypeError(f"input {name!r} is a device array ({type(value).__name__}), but this "
                            f"session runs on {self._providers}; pass a numpy array")
        return np.broadcast_to(np.zeros((), dtype=np.dtype(value.dtype)), tuple(value.shape))

    def _check_node(self, step, values, outputs) -> None:
        from conformance.compare import Mismatch, compare_outputs

        expected = step.reference(*values)
        try:
            compare_outputs(expected, outputs, names=[n or "-" for n in step.node.output])
        except Mismatch as e:
            folder = self._options.check_nodes_dir or tempfile.mkdtemp(prefix="onnx_parity_check_")
            write_repro(step.node, values, self._model, folder)
            raise NodeCheckError(
                f"check mode: node {step.node.name!r} ({step.node.op_type}) differs from the "
                f"reference op: {e}; repro in {folder}") from e


def write_repro(node, values, model, folder: str) -> None:
    """The node as a one-node model plus its inputs (inputs.npz and input_N.pb)."""
    from onnx import helper, numpy_helper

    os.makedirs(folder, exist_ok=True)
    names = [f"in{i}" if name else "" for i, name in enumerate(node.input)]
    arrays = {n: v for n, v in zip(names, values) if n and isinstance(v, np.ndarray)}
    inputs = [helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for n, v in arrays.items()]
    clone = helper.make_node(node.op_type, names, [f"out{i}" for i in range(len(node.output))],
                             domain=node.domain, name=node.name)
    clone.attribute.extend(node.attribute)
    outputs = [helper.make_empty_tensor_value_info(f"out{i}") for i in range(len(node.output))]
    graph = helper.make_graph([clone], "repro", inputs, outputs)
    repro = helper.make_model(graph, opset_imports=list(model.opset_import))
    onnx.save(repro, os.path.join(folder, "model.onnx"))
    np.savez(os.path.join(folder, "inputs.npz"), **arrays)
    for i, (name, value) in enumerate(arrays.items()):
        with open(os.path.join(folder, f"input_{i}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(value, name).SerializeToString())
