"""Small models built in code for the tests (no downloads), and the helpers that hold the
reference evaluator against onnxruntime on them.

onnxruntime runs these models with graph optimizations off, so that it executes the very nodes
the model holds and each node can be compared with the reference op on the same inputs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from reference import ReferenceEvaluator


def op_types(model: onnx.ModelProto) -> set[tuple[str, str]]:
    """(domain, op_type) of every node in the main graph; '' is the ai.onnx domain."""
    return {(n.domain if n.domain != "ai.onnx" else "", n.op_type) for n in model.graph.node}


def ort_session(model: onnx.ModelProto, *, optimize: bool = False):
    import onnxruntime as ort

    options = ort.SessionOptions()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def ort_values(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    """Every value of a run under onnxruntime: feeds, initializers and each node's outputs."""
    exposed = copy.deepcopy(model)
    listed = {o.name for o in exposed.graph.output}
    for node in exposed.graph.node:
        for name in node.output:
            if name and name not in listed:
                exposed.graph.output.append(helper.make_empty_tensor_value_info(name))
                listed.add(name)
    session = ort_session(exposed)
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    values.update(feeds)
    values.update(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    return values


def run_reference_node(node: onnx.NodeProto, values: dict, model: onnx.ModelProto) -> list:
    """The reference op of one node of `model`, on the inputs taken from `values`."""
    names = list(dict.fromkeys(n for n in node.input if n))
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(values[n].dtype),
                                            values[n].shape) for n in names]
    outputs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
    single = helper.make_model(helper.make_graph([node], "one_node", inputs, outputs),
                               opset_imports=model.opset_import)
    single.ir_version = model.ir_version
    return ReferenceEvaluator(single, check=False).run(None, {n: values[n] for n in names})


Tolerance = Callable[[onnx.NodeProto, np.ndarray, np.ndarray], np.ndarray]


def float_tolerance(rtol: float, atol: float) -> Tolerance:
    """Integer and bool outputs must be equal; float outputs within atol + rtol * |theirs|."""
    def allowed(node, ours, theirs):
        if ours.dtype.kind in "iub":
            return np.zeros(ours.shape)
        return atol + rtol * np.abs(theirs.astype(np.float64))
    return allowed


def node_mismatches(model: onnx.ModelProto, feeds: dict, tolerance: Tolerance,
                    op_filter: Callable[[onnx.NodeProto], bool] = lambda node: True) -> list[str]:
    """Re-run each node in the reference on onnxruntime's own inputs to that node and list the
    nodes whose outputs differ from onnxruntime's by more than `tolerance` allows. Because the
    inputs are shared, a difference is made at that node, not inherited from an earlier one."""
    values = ort_values(model, feeds)
    problems = []
    for node in model.graph.node:
        if node.op_type == "Constant" or not op_filter(node):
            continue
        ours_all = run_reference_node(node, values, model)
        for name, ours in zip([n for n in node.output if n], ours_all):
            ours, theirs = np.asarray(ours), values[name]
            if ours.dtype != theirs.dtype or ours.shape != theirs.shape:
                problems.append(f"{node.op_type} {node.name} -> {name}: ours {ours.dtype}"
                                f"{list(ours.shape)}, onnxruntime {theirs.dtype}"
                                f"{list(theirs.shape)}")
                continue
            error = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
            over = error > tolerance(node, ours, theirs)
            if over.any():
                at = np.unravel_index(np.argmax(np.where(over, error, -1)), error.shape)
                problems.append(f"{node.op_type} {node.name} -> {name}: {int(over.sum())} of "
                                f"{error.size} values off, e.g. at {tuple(map(int, at))} "
                                f"ours {ours[at]!r} onnxruntime {theirs[at]!r}")
    return problems
