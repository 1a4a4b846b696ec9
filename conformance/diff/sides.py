"""A side is one execution to compare: a model and the backend that runs it, or a saved run.

Every side yields its values as (name, kind, value, path, node) in the order produced, and most
can re-run a single node on given inputs (for telling an error made from an error inherited)."""
from __future__ import annotations

import json

import numpy as np
import onnx

from reference.evaluator import load_model

from .repro import node_feeds, node_model

SIDE_KINDS = ("reference", "optimized", "onnxruntime")


class SideError(RuntimeError):
    """One side could not run the model (or a node of it); the message names the side."""


class Side:
    label = "side"
    model: onnx.ModelProto | None = None
    can_rerun = False

    def values(self, feeds: dict):
        raise NotImplementedError

    def rerun(self, node, values: dict) -> dict:
        """Outputs of `node` (by name) computed by this side on `values` (every name it reads)."""
        model = node_model(node, values, self.model.opset_import, self.model.ir_version)
        outputs = self.run_model(model, node_feeds(model, values))
        return {o.name: v for o, v in zip(model.graph.output, outputs)}

    def run_model(self, model, feeds: dict) -> list:
        raise NotImplementedError

    def input_names(self) -> list[str]:
        inits = {i.name for i in self.model.graph.initializer}
        return [i.name for i in self.model.graph.input if i.name not in inits]


class ReferenceSide(Side):
    """The reference evaluator; `kernels` overrides ops as ReferenceEvaluator's argument does."""

    can_rerun = True

    def __init__(self, model, kernels: dict | None = None, label: str = "reference"):
        self.model = load_model(model)
        self.kernels = kernels or {}
        self.label = label

    def _evaluator(self, model, check=True):
        from reference import ReferenceEvaluator

        return ReferenceEvaluator(model, kernels=self.kernels, check=check)

    def values(self, feeds):
        for r in self._evaluator(self.model).iter_results(feeds):
            yield r.name, r.kind, r.value, r.path, r.node

    def run_model(self, model, feeds):
        return self._evaluator(model, check=False).run(None, feeds)


class OptimizedSide(Side):
    """optimized.InferenceSession at a graph optimization level. Its values come from the
    session's `iter_results` (initializers, inputs, every node result, then the outputs).
    `model` is the rewritten model, so that fused nodes are seen as such."""

    can_rerun = True

    def __init__(self, model, level: int = 99, label: str = "optimized"):
        self.original = load_model(model)
        self.level = level
        self.label = label
        self.session = self._session(self.original)
        self.model = self.session.optimized_model

    def _session(self, model):
        from optimized import InferenceSession, SessionOptions
        from optimized.session import GraphOptimizationLevel

        options = SessionOptions()
        options.graph_optimization_level = GraphOptimizationLevel.from_level(self.level)
        return InferenceSession(model.SerializeToString(), sess_options=options)

    def values(self, feeds):
        for r in self.session.iter_results(feeds):
            yield r.name, r.kind, r.value, r.path, r.node

    def run_model(self, model, feeds):
        return self._session(model).run(None, feeds)


class OnnxruntimeSide(Side):
    """onnxruntime, capturing intermediates through a copy of the model that lists every value
    of the main graph as an output. Values inside subgraphs are not visible this way."""

    can_rerun = True

    def __init__(self, model, label: str = "onnxruntime"):
        try:
            import onnxruntime  # noqa: F401
        except ImportError as e:
            raise ValueError("side 'onnxruntime' needs the onnxruntime package") from e
        self.model = load_model(model)
        self.label = label

    def _run(self, model, feeds, names):
        import onnxruntime

        session = onnxruntime.InferenceSession(model.SerializeToString(),
                                               providers=["CPUExecutionProvider"])
        return dict(zip(names, session.run(names, feeds)))

    def values(self, feeds):
        from reference.evaluator import sparse_value, tensor_value

        model = expose_every_value(self.model)
        names = [o.name for o in model.graph.output]
        results = self._run(model, feeds, names)
        for init in self.model.graph.initializer:
            if init.name not in feeds:
                yield init.name, "initializer", tensor_value(init), (), None
        for init in self.model.graph.sparse_initializer:
            yield init.values.name, "initializer", sparse_value(init), (), None
        for vi in self.model.graph.input:
            if vi.name in feeds:
                yield vi.name, "input", np.asarray(feeds[vi.name]), (), None
        for node in self.model.graph.node:
            for name in node.output:
                if name and name in results:
                    yield name, "result", _normal(results[name]), (), node
        for out in self.model.graph.output:
            yield out.name, "output", _normal(results[out.name]), (), None

    def run_model(self, model, feeds):
        names = [o.name for o in model.graph.output]
        results = self._run(model, feeds, names)
        return [_normal(results[n]) for n in names]


def _normal(value):
    if isinstance(value, np.ndarray) and value.dtype.kind in "US":
        return value.astype(object)
    return np.asarray(value) if isinstance(value, np.generic) else value


def expose_every_value(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model whose outputs are every value its main graph computes."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(copy)
        types = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    except Exception:  # noqa: BLE001 - without shape inference the outputs stay untyped
        types = {}
    listed = {o.name for o in copy.graph.output}
    for node in copy.graph.node:
        for name in node.output:
            if name and name not in listed:
                vi = types.get(name) or onnx.helper.make_empty_tensor_value_info(name)
                copy.graph.output.append(vi)
                listed.add(name)
    return copy


class SavedRunSide(Side):
    """A run saved by `save_run` (`--save-run`): values by name in the order they were produced.
    It cannot re-run a node; attribution then re-runs the other side's node on its inputs."""

    def __init__(self, path: str, model=None, label: str | None = None):
        self.path = path
        self.model = load_model(model) if model is not None else None
        self.label = label or f"run {path}"
        try:
            with np.load(path, allow_pickle=False) as data:
                self.meta = json.loads(str(data["__meta__"]))
        except (OSError, KeyError, ValueError) as e:
            raise ValueError(f"{path} is not a run saved by onnx-parity diff --save-run: {e}") from e

    def values(self, feeds):
        nodes = _nodes_by_output(self.model) if self.model is not None else {}
        with np.load(self.path, allow_pickle=False) as data:
            for entry in self.meta:
                value = _load_entry(data, entry)
                path = tuple(entry["path"])
                node = nodes.get((path, entry["name"])) if entry["kind"] == "result" else None
                yield entry["name"], entry["kind"], value, path, node


def _nodes_by_output(model) -> dict:
    return {((), o): n for n in model.graph.node for o in n.output}


def _load_entry(data, entry):
    if entry.get("array") is None:
        return None
    value = data[entry["array"]]
    dtype = entry["dtype"]
    if str(value.dtype) != dtype:
        import ml_dtypes

        value = value.view(np.dtype(getattr(ml_dtypes, dtype)))
    return value


def save_run(capture, path: str) -> None:
    """Write every captured tensor of a run (its store must hold them) with its metadata."""
    meta, arrays = [], {}
    for rec in capture.records:
        value = capture.value(rec.key)
        entry = {"name": rec.name, "kind": "output" if rec.is_output and rec.kind != "result"
                 else rec.kind, "path": list(rec.path), "op_type": rec.op_type,
                 "node_name": rec.node_name, "array": None, "dtype": rec.dtype}
        if isinstance(value, np.ndarray) and value.dtype.kind not in "OUS":
            key = f"v{len(arrays)}"
            raw = value
            if value.dtype.kind not in "biufc":  # ml_dtypes: stored as raw bits
                raw = value.view({1: np.uint8, 2: np.uint16}[value.dtype.itemsize])
            arrays[key] = raw
            entry["array"] = key
        meta.append(entry)
        if rec.is_output and rec.kind == "result":
            meta.append({**entry, "kind": "output"})
    np.savez(path, __meta__=np.array(json.dumps(meta)), **arrays)


def make_side(kind: str, model, level: int = 99) -> Side:
    if kind == "reference":
        return ReferenceSide(model)
    if kind == "optimized":
        return OptimizedSide(model, level=level)
    if kind == "onnxruntime":
        return OnnxruntimeSide(model)
    raise ValueError(f"unknown side {kind!r}; choose one of {', '.join(SIDE_KINDS)}")
