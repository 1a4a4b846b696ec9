"""One node as a standalone model: to re-run it on the other side's inputs, and to hand a user
a repro of the first node where two executions part."""
from __future__ import annotations

import json
import os

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

from reference.types import value_type_proto
from reference.values import EMPTY


def subgraph_outer_names(node) -> list[str]:
    """Names that the node's subgraphs read from the enclosing scope, in first-use order."""
    names: list[str] = []
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            for name in _free_names(g):
                if name not in names:
                    names.append(name)
    return names


def _free_names(graph) -> list[str]:
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    defined |= {i.values.name for i in graph.sparse_initializer}
    free: list[str] = []
    for node in graph.node:
        for name in list(node.input) + subgraph_outer_names(node):
            if name and name not in defined and name not in free:
                free.append(name)
        defined.update(node.output)
    free += [o.name for o in graph.output if o.name not in defined and o.name not in free]
    return free


def node_input_names(node) -> list[str]:
    """Every value a node reads: its inputs, then what its subgraphs read from outside."""
    names = [n for n in node.input if n]
    return names + [n for n in subgraph_outer_names(node) if n not in names]


def node_model(node, values: dict, opset_imports, ir_version: int | None = None,
               initializers: dict | None = None) -> onnx.ModelProto:
    """A model holding only `node`. `values` gives every name it reads (graph inputs);
    names in `initializers` are stored in the model instead."""
    initializers = initializers or {}
    inputs, inits = [], []
    for name in node_input_names(node):
        if name in initializers:
            inits.append(numpy_helper.from_array(np.asarray(initializers[name]), name))
            continue
        if name not in values:
            raise KeyError(f"no value for input {name!r} of node {node.name or node.op_type!r}")
        inputs.append(helper.make_value_info(name, value_type_proto(values[name])))
    outputs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    graph = helper.make_graph([node], f"node_{node.name or node.op_type}", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=list(opset_imports))
    # Initializers need not be graph inputs from IR 4 on; stay below what runtimes accept.
    model.ir_version = max(ir_version or 8, 4)
    types = _inferred_types(model)
    for out in model.graph.output:
        typed = types.get(out.name)
        if typed is not None:
            out.CopyFrom(typed)
    return model


def _inferred_types(model) -> dict:
    """Output types from shape inference; none when it cannot tell (the runtimes cope)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - inference is a nicety here, not a check
        return {}
    return {vi.name: vi for vi in inferred.graph.value_info}


def node_feeds(model: onnx.ModelProto, values: dict) -> dict:
    return {i.name: values[i.name] for i in model.graph.input}


def write_repro(directory: str, model_a, model_b, feeds: dict, info: dict) -> dict:
    """Write model.onnx (side A's node), model_b.onnx when side B's node differs, the inputs as
    inputs.npz and input_N.pb, and repro.json saying how to run it again. Returns the paths."""
    os.makedirs(directory, exist_ok=True)
    paths = {"model": os.path.join(directory, "model.onnx")}
    onnx.save(model_a, paths["model"])
    if model_b is not None and model_b.SerializeToString() != model_a.SerializeToString():
        paths["model_b"] = os.path.join(directory, "model_b.onnx")
        onnx.save(model_b, paths["model_b"])
    tensors = {k: v for k, v in feeds.items() if isinstance(v, np.ndarray)}
    paths["inputs"] = os.path.join(directory, "inputs.npz")
    np.savez(paths["inputs"], **tensors)
    for i, vi in enumerate(model_a.graph.input):
        value = feeds[vi.name]
        if isinstance(value, np.ndarray):
            with open(os.path.join(directory, f"input_{i}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(value, vi.name).SerializeToString())
    models = [paths["model"]] + ([paths["model_b"]] if "model_b" in paths else [])
    sides = ["--a", info["side_a"], "--b", info["side_b"]]
    info = {**info, "command": ["onnx-parity", "diff", *models, *sides,
                                "--inputs", paths["inputs"]]}
    paths["command"] = info["command"]
    with open(os.path.join(directory, "repro.json"), "w") as f:
        json.dump(info, f, indent=2)
    paths["info"] = os.path.join(directory, "repro.json")
    return paths


def is_absent(value) -> bool:
    return value is None or value is EMPTY
