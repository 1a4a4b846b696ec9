"""Which node runs where, and the copies that follows from it.

Every node whose op has a device kernel (and no subgraph, and no value a subgraph reads) runs on
"cuda"; the rest on "cpu". Elementwise trees on cuda become one fused node each. A value used on
the other side of where it lives gets one copy node, placed before its first such use:
`name@cuda` (CopyToDevice) or `name@host` (CopyToHost). Initializers read on the device are
uploaded once when the plan is built (`resident`), not copied per run. Graph outputs made on the
device get a CopyToHost at the end.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import onnx
from onnx import AttributeProto, helper

from reference.registry import canonical_domain

from ..plan import outer_names
from .arrays import DEVICE_DTYPES
from .fusion import FUSED_DOMAIN, FUSED_OP, FusionGroup, find_groups, initializer_arrays

COPY_TO_DEVICE, COPY_TO_HOST = "CopyToDevice", "CopyToHost"
CUDA, CPU = "cuda", "cpu"


@dataclass(frozen=True)
class Copy:
    value: str
    direction: str  # COPY_TO_DEVICE or COPY_TO_HOST


@dataclass
class Placement:
    model: onnx.ModelProto  # nodes renamed/fused, copy nodes inserted
    devices: dict[str, str]  # node name -> CUDA / CPU (copy nodes are absent)
    copies: list[Copy]  # one per copy node, in order: the copies every run makes
    resident: dict[str, str] = field(default_factory=dict)  # device name -> initializer
    groups: dict[str, FusionGroup] = field(default_factory=dict)  # fused node name -> group
    host_readers: set[str] = field(default_factory=set)  # values read on the host

    @property
    def all_on_device(self) -> bool:
        return all(d == CUDA for d in self.devices.values())

    def count(self, direction: str) -> int:
        return sum(c.direction == direction for c in self.copies)


def place(model: onnx.ModelProto, kernels: dict, functions=(), fuse: bool = True) -> Placement:
    graph = model.graph
    nodes = _named(graph.node)
    dtypes = _known_dtypes(model)
    subgraph_reads = set().union(*(outer_names(n) for n in nodes)) if nodes else set()
    on_device = [_runs_on_device(n, kernels, functions, dtypes, subgraph_reads) for n in nodes]
    groups: dict[str, FusionGroup] = {}
    if fuse:
        nodes, on_device, groups = _fuse(nodes, on_device, graph, subgraph_reads)
    devices = {n.name: CUDA if d else CPU for n, d in zip(nodes, on_device)}
    host_inputs = {n.name: _host_inputs(n, kernels) for n in nodes}
    return _insert_copies(model, nodes, devices, host_inputs, groups)


def _named(nodes) -> list:
    """Copies of the nodes, each with a unique name (the plan keys placement by name)."""
    out, seen = [], set()
    for i, node in enumerate(nodes):
        node = onnx.NodeProto.FromString(node.SerializeToString())
        if not node.name or node.name in seen:
            node.name = f"{node.name or node.op_type}_{i}"
        seen.add(node.name)
        out.append(node)
    return out


def _known_dtypes(model) -> dict:
    """Element types shape inference knows, by value name (empty if inference fails)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - types are a hint; the kernels check again at run time
        inferred = model
    g = inferred.graph
    known = {}
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        kind = vi.type.WhichOneof("value")
        if kind == "tensor_type" and vi.type.tensor_type.elem_type:
            known[vi.name] = vi.type.tensor_type.elem_type
        elif kind is not None and kind != "tensor_type":
            known[vi.name] = None  # a sequence, map or optional: host only
    for t in g.initializer:
        known[t.name] = t.data_type
    return known


def _device_type(elem_type) -> bool:
    if elem_type is None:
        return False
    try:
        return helper.tensor_dtype_to_np_dtype(elem_type) in DEVICE_DTYPES
    except (KeyError, ValueError, TypeError):
        return False


def _runs_on_device(node, kernels, functions, dtypes, subgraph_reads) -> bool:
    key = (canonical_domain(node.domain), node.op_type)
    if key not in kernels or (node.domain, node.op_type) in functions:
        return False
    if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute):
        return False
    if any(o in subgraph_reads for o in node.output):
        return False
    names = [n for n in list(node.input) + list(node.output) if n]
    return all(_device_type(dtypes[n]) for n in names if n in dtypes)


def _host_inputs(node, kernels) -> tuple[int, ...]:
    kernel = kernels.get((canonical_domain(node.domain), node.op_type))
    return kernel.host_inputs if kernel is not None else ()


def _fuse(nodes, on_device, graph, subgraph_reads):
    readers = Counter(n for node in nodes for n in node.input if n)
    readers.update(subgraph_reads)
    outputs = {o.name for o in graph.output}
    found = find_groups(nodes, lambda i: on_device[i], outputs, initializer_arrays(graph), readers)
    member_of = {id(m): g for g in found for m in g.nodes}
    new_nodes, new_devices, groups = [], [], {}
    for node, dev in zip(nodes, on_device):
        group = member_of.get(id(node))
        if group is None:
            new_nodes.append(node)
            new_devices.append(dev)
        elif node is group.nodes[-1]:
            fused = helper.make_node(FUSED_OP, group.inputs, [group.output], domain=FUSED_DOMAIN,
                                     name=f"fused_{node.name}")
            groups[fused.name] = group
            new_nodes.append(fused)
            new_devices.append(True)
    return new_nodes, new_devices, groups


def _insert_copies(model, nodes, devices, host_inputs, groups) -> Placement:
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    overridable = {i.name for i in graph.input} & initializers
    where = {name: CPU for name in initializers | {i.name for i in graph.input}}
    alias: dict[tuple[str, str], str] = {}  # (value, side) -> name of its copy on that side
    resident: dict[str, str] = {}
    copies: list[Copy] = []
    out_nodes = []
    host_readers: set[str] = set()

    def on(name: str, side: str) -> str:
        if not name or where.get(name, CPU) == side:
            return name
        if (name, side) not in alias:
            if side == CUDA and name in initializers and name not in overridable:
                resident[f"{name}@cuda"] = name
                alias[(name, side)] = f"{name}@cuda"
            else:
                op = COPY_TO_DEVICE if side == CUDA else COPY_TO_HOST
                target = f"{name}@cuda" if side == CUDA else f"{name}@host"
                out_nodes.append(helper.make_node(op, [name], [target], domain=FUSED_DOMAIN,
                                                  name=f"{op}_{name}"))
                copies.append(Copy(name, op))
                alias[(name, side)] = target
        return alias[(name, side)]

    for node in nodes:
        side = devices[node.name]
        sides = [CPU if side == CPU or i in host_inputs[node.name] else CUDA
                 for i in range(len(node.input))]
        renamed = [on(n, s) for n, s in zip(node.input, sides)]
        host_readers.update(n for n, s in zip(node.input, sides) if s == CPU)
        del node.input[:]
        node.input.extend(renamed)
        out_nodes.append(node)
        for o in node.output:
            if o:
                where[o] = side
    for out in graph.output:
        if where.get(out.name) == CUDA:
            on(out.name, CPU)
    placed = onnx.ModelProto()
    placed.CopyFrom(model)
    del placed.graph.node[:]
    placed.graph.node.extend(out_nodes)
    return Placement(placed, devices, copies, resident, groups, host_readers)


def host_name(placement: Placement, output: str) -> str:
    """Where a graph output is read on the host after the run."""
    names = {n.output[0] for n in placement.model.graph.node
             if n.domain == FUSED_DOMAIN and n.op_type == COPY_TO_HOST}
    return f"{output}@host" if f"{output}@host" in names else output


def node_counts(plan) -> dict[str, int]:
    """How many of the model's nodes run on the GPU and how many fell back to the host, for a
    DevicePlan (or a GraphPlan over one): fused groups count each member, copies count as
    nothing, and a device kernel that declined at run time counts as a fallback."""
    placement = plan.placement
    declined = set(getattr(plan, "declined", ()))
    counts = {"gpu": 0, "cpu": 0}
    for name, device in placement.devices.items():
        size = len(placement.groups[name].nodes) if name in placement.groups else 1
        counts["gpu" if device == CUDA and name not in declined else "cpu"] += size
    return counts
