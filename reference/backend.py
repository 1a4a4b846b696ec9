"""onnx's backend interface (onnx.backend.base.Backend) over the reference evaluator, so that
onnx's own BackendTest and any tool written for `onnxruntime.backend` can run it:

    import reference.backend as backend
    rep = backend.prepare(model, "CPU")
    outputs = rep.run([x])                # or rep.run({"x": x}); a list, in graph-output order
    backend.run_node(node, [x, y])        # one node on the latest opsets
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from .dtypes import onnx_type
from .evaluator import ReferenceEvaluator, load_model
from .types import value_type_proto


class ReferenceRep(BackendRep):
    """A prepared model: `run(inputs)` takes a list (in the order of the graph inputs that are
    not initializers), one array, or a dict by name."""

    def __init__(self, runner, input_names: list[str]):
        self._runner = runner  # feeds dict -> list of outputs
        self._input_names = input_names

    def run(self, inputs, **kwargs) -> list:
        return self._runner(feeds_by_name(inputs, self._input_names))


def feeds_by_name(inputs, names: list[str]) -> dict:
    if isinstance(inputs, dict):
        return dict(inputs)
    if isinstance(inputs, np.ndarray):
        inputs = [inputs]
    inputs = list(inputs)
    if len(inputs) > len(names):
        raise ValueError(f"{len(inputs)} inputs given, the model takes {len(names)}: {names}")
    return dict(zip(names, inputs))


class ReferenceBackend(Backend):
    devices = ("CPU",)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        kind = str(device).split(":")[0].upper()
        if not hasattr(DeviceType, kind):
            return False
        return Device(device).type in [getattr(DeviceType, d) for d in cls.devices]

    @classmethod
    def _check_device(cls, device: str) -> None:
        if not cls.supports_device(device):
            raise RuntimeError(f"device {device!r} is not supported by {cls.__name__}; it runs on "
                               f"{list(cls.devices)}")

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> ReferenceRep:
        """`model` is a ModelProto, a path or bytes; validated as the evaluator validates."""
        cls._check_device(device)
        evaluator = ReferenceEvaluator(load_model(model))
        return ReferenceRep(lambda feeds: evaluator.run(None, feeds), evaluator.input_names)

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs) -> list:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device: str = "CPU", outputs_info=None, **kwargs) -> list:
        """One node as a one-node model on the opset given by `opset_version` (else the
        installed onnx's latest), its inputs typed from the values given."""
        model = node_model(node, inputs, outputs_info, kwargs.get("opset_version"))
        return cls.run_model(model, [v for v in inputs if v is not None], device)


def node_model(node, inputs, outputs_info=None, opset_version=None) -> onnx.ModelProto:
    names = [n for n in node.input if n]
    values = [v for v in inputs if v is not None]
    graph_inputs = [helper.make_value_info(n, value_type_proto(np.asarray(v) if np.isscalar(v) else v))
                    for n, v in zip(names, values)]
    graph_outputs = []
    for i, name in enumerate(n for n in node.output if n):
        if outputs_info and i < len(outputs_info):
            dtype, shape = outputs_info[i]
            graph_outputs.append(helper.make_tensor_value_info(name, onnx_type(dtype), shape))
        else:
            graph_outputs.append(helper.make_empty_tensor_value_info(name))
    domain = node.domain if node.domain not in ("", "ai.onnx") else ""
    version = opset_version or onnx.defs.onnx_opset_version()
    opsets = [helper.make_opsetid("", version if domain == "" else onnx.defs.onnx_opset_version())]
    if domain:
        opsets.append(helper.make_opsetid(domain, onnx.defs.get_schema(
            node.op_type, domain=domain).since_version if _has_schema(node, domain) else 1))
    graph = helper.make_graph([node], f"run_node_{node.op_type}", graph_inputs, graph_outputs)
    return with_output_types(helper.make_model(graph, opset_imports=opsets))


def with_output_types(model: onnx.ModelProto) -> onnx.ModelProto:
    """Outputs declared without a type get the type onnx's shape inference gives them."""
    untyped = [o for o in model.graph.output if not o.type.WhichOneof("value")]
    if not untyped:
        return model
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type for v in list(inferred.graph.output) + list(inferred.graph.value_info)}
    for output in untyped:
        if output.name not in types or not types[output.name].WhichOneof("value"):
            raise ValueError(f"run_node: cannot tell the type of output {output.name!r} of "
                             f"{model.graph.node[0].op_type}; give outputs_info")
        output.type.CopyFrom(types[output.name])
    return model


def _has_schema(node, domain: str) -> bool:
    try:
        onnx.defs.get_schema(node.op_type, domain=domain)
        return True
    except onnx.defs.SchemaError:
        return False


prepare = ReferenceBackend.prepare
run_model = ReferenceBackend.run_model
run_node = ReferenceBackend.run_node
supports_device = ReferenceBackend.supports_device
