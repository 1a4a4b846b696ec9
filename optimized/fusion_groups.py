"""Which elementwise nodes fuse, for every provider: one module finds the groups, each provider
generates its own code for them (the CPU's C chain kernel in chains.py, the GPU's generated
elementwise kernels in cuda/fusion.py).

Both work on a GroupGraph: nodes in topological order, the values each reads and the one value
each writes, which nodes the provider can fuse, how often each value is read (subgraph reads
included) and which values must stay visible (graph outputs). A value inside a group is read
exactly once, by the next member, and never kept, so fusing it away changes nothing observable.

- `trees`: maximal trees, grown from each root back through its producers (the GPU kernel
  evaluates a whole expression tree);
- `chains`: maximal paths, walked forward from each first member (the CPU kernel carries one
  value through its members and reads the other operands as side inputs).
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field


@dataclass
class GroupGraph:
    inputs: Sequence[Sequence[Hashable]]  # per node, the values it reads
    outputs: Sequence[Hashable | None]  # per node, its single output (None: not one output)
    eligible: Sequence[bool]  # per node, whether the provider can fuse it
    readers: dict  # value -> how many times it is read
    keep: set = field(default_factory=set)  # values that must stay visible

    def __len__(self) -> int:
        return len(self.outputs)


def trees(g: GroupGraph, min_size: int = 2) -> list[list[int]]:
    """Member indices of each tree (topological order, the root last), ordered by root."""
    producer = {out: i for i, out in enumerate(g.outputs) if out is not None}
    taken: set[int] = set()
    found = []
    for root in reversed(range(len(g))):
        if root in taken or not g.eligible[root] or g.outputs[root] is None:
            continue
        members, stack = {root}, [root]
        while stack:
            for value in g.inputs[stack.pop()]:
                i = producer.get(value)
                if (i is None or i in taken or i in members or not g.eligible[i]
                        or g.readers.get(value, 0) != 1 or value in g.keep):
                    continue
                members.add(i)
                stack.append(i)
        if len(members) >= min_size:
            taken |= members
            found.append(sorted(members))
    return sorted(found, key=lambda m: m[-1])


def chains(g: GroupGraph, min_size: int = 2) -> list[list[int]]:
    """Member indices of each chain, in order; each member's output is read only by the next
    member (once); no node joins two chains."""
    consumer: dict = {}
    for i, values in enumerate(g.inputs):
        for value in values:
            consumer[value] = i if value not in consumer else -1  # -1: read by several inputs
    taken: set[int] = set()
    found = []
    for i in range(len(g)):
        if i in taken or not g.eligible[i] or g.outputs[i] is None:
            continue
        members = [i]
        out = g.outputs[i]
        while out not in g.keep and g.readers.get(out, 0) == 1 and consumer.get(out, -1) > members[-1]:
            j = consumer[out]
            if j in taken or not g.eligible[j] or g.outputs[j] is None or list(g.inputs[j]).count(out) != 1:
                break
            members.append(j)
            out = g.outputs[j]
        if len(members) >= min_size:
            found.append(members)
            taken |= set(members)
    return found
