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
    """One subgraph per run of consecutive nodes on the same provider, in plan order."""
    placement = getattr(plan, "placement", None)
    if placement is not None:
        nodes = [n for n in placement.model.graph.node if n.name in placement.devices]
        where = {n.name: placement.devices[n.name] for n in nodes}
        where = {k: ("CUDAExecutionProvider" if v.upper().startswith("CUDA") else CPU)
                 for k, v in where.items()}
    else:
        nodes = list(plan.graph.node)
        where = {}
    subgraphs: list[OrtEpAssignedSubgraph] = []
    for node in nodes:
        ep = where.get(node.name, CPU)
        item = OrtEpAssignedNode(node.name, node.op_type, node.domain)
        if subgraphs and subgraphs[-1].ep_name == ep:
            subgraphs[-1]._nodes.append(item)
        else:
            subgraphs.append(OrtEpAssignedSubgraph(ep, [item]))
    return subgraphs
