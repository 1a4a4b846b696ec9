"""get_provider_graph_assignment_info(): which provider runs which node, as onnxruntime's
OrtEpAssignedSubgraph (ep_name, get_nodes()) and OrtEpAssignedNode (name, op_type, domain)."""
from __future__ import annotations

from dataclasses import dataclass

CPU = "CPUExecutionProvider"


@dataclass(frozen=True)
class OrtEpAssignedNode:
    name: str
    op_type: str
    domain: str


class OrtEpAssignedSubgraph:
    def __init__(self, ep_name: str, nodes: list[OrtEpAssignedNode]):
        self.ep_name = ep_name
        self._nodes = nodes

    def get_nodes(self) -> list[OrtEpAssignedNode]:
        return list(self._nodes)

    def __repr__(self) -> str:
        return f"OrtEpAssignedSubgraph({self.ep_name!r}, {len(self._nodes)} nodes)"


def assignment_info(plan, providers: list[str]) -> list[OrtEpAssignedSubgraph]:
    """One subgraph per node, in plan order, as onnxruntime reports its kernels."""
    placement = getattr(plan, "placement", None)
    if placement is not None:
        nodes = [n for n in placement.model.graph.node if n.name in placement.devices]
        cuda = {n.name for n in nodes if placement.devices[n.name].upper().startswith("CUDA")}
    else:
        nodes, cuda = list(plan.graph.node), set()
    return [OrtEpAssignedSubgraph("CUDAExecutionProvider" if n.name in cuda else CPU,
                                  [OrtEpAssignedNode(n.name, n.op_type, n.domain)]) for n in nodes]
