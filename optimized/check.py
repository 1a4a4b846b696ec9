"""Check mode: each fast kernel's result is judged against the reference op on the same inputs
by the bound policy of reference.agreement (its error from the float64 truth against the
error the op's arithmetic allows). The first node past its bound raises NodeCheckError, with
the node and its inputs saved as a one-node repro."""
from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx

from reference.agreement import check_node
from reference.registry import canonical_domain


class NodeCheckError(AssertionError):
    """Check mode: a fast kernel's result is past its error bound from the reference op's."""

    def __init__(self, message: str, node=None, judgement=None, repro: str = ""):
        super().__init__(message)
        self.node, self.judgement, self.repro = node, judgement, repro


def opsets_of(model) -> dict[str, int]:
    return {canonical_domain(o.domain): o.version for o in model.opset_import}


def check_step(step, values: list, outputs: list, model, repro_dir: str = "") -> None:
    """Raise NodeCheckError unless every declared output of the step is within its bound."""
    node = step.node
    opset = opsets_of(model).get(canonical_domain(node.domain), 0)
    judgement = check_node(node, opset, values, outputs, step.reference)
    if judgement.ok:
        return
    folder = repro_dir or tempfile.mkdtemp(prefix="onnx_parity_check_")
    write_repro(node, values, model, folder)
    raise NodeCheckError(
        f"check mode: node {node.name!r} ({node.op_type}) differs from the reference op: "
        f"{judgement.message()}; repro in {folder}", node, judgement, folder)


def write_repro(node, values, model, folder: str) -> None:
    """The node as a one-node model plus its inputs (inputs.npz and input_N.pb)."""
    from onnx import helper, numpy_helper

    os.makedirs(folder, exist_ok=True)
    names = [f"in{i}" if name else "" for i, name in enumerate(node.input)]
    arrays = {n: v for n, v in zip(names, values) if n and isinstance(v, np.ndarray)}
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for n, v in arrays.items()]
    clone = helper.make_node(node.op_type, names, [f"out{i}" if o else ""
                                                   for i, o in enumerate(node.output)],
                             domain=node.domain, name=node.name)
    clone.attribute.extend(node.attribute)
    outputs = [helper.make_empty_tensor_value_info(f"out{i}")
               for i, o in enumerate(node.output) if o]
    graph = helper.make_graph([clone], "repro", inputs, outputs)
    repro = helper.make_model(graph, opset_imports=list(model.opset_import))
    onnx.save(repro, os.path.join(folder, "model.onnx"))
    np.savez(os.path.join(folder, "inputs.npz"), **arrays)
    for i, (name, value) in enumerate(arrays.items()):
        with open(os.path.join(folder, f"input_{i}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(value, name).SerializeToString())
