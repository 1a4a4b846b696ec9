"""Elementwise chains fused into one C call at plan time: a value that goes through several
elementwise nodes (Add, Mul, Relu, Sigmoid, ...) with no other reader in between is computed
block by block in cache (csrc chain_f32), and one Python call replaces one per node.

The model itself is left as written; the plan keeps the unfused steps too, for check mode and
for iter_results, which need every intermediate value.  A chain whose run-time shapes or dtypes
the C kernel cannot take (a side operand that grows the value, an irregular broadcast, not
float32) runs its nodes one by one.
"""
from __future__ import annotations

import functools
import itertools
import operator
from dataclasses import dataclass

import numpy as np

from . import kernels

MS = "com.microsoft"
ACTIVATION, BINARY = kernels.lib.CHAIN_ACTIVATION, kernels.lib.CHAIN_BINARY
BINARY_OPS = {"Add", "Sub", "Mul", "Div"}


def chain_op(node, attrs: dict) -> tuple[int, int, float, float] | None:
    """(kind, C code, param, param) for a node the chain kernel can run, else None."""
    key = (node.domain if node.domain != "ai.onnx" else "", node.op_type)
    if key[0] == "" and key[1] in BINARY_OPS and "broadcast" not in attrs:
        return BINARY, kernels.BINARY_OPS[key[1]], 0.0, 0.0
    name = {("", "Relu"): "Relu", ("", "Sigmoid"): "Sigmoid", ("", "Tanh"): "Tanh",
            ("", "LeakyRelu"): "LeakyRelu", (MS, "Gelu"): "Gelu"}.get(key)
    params: tuple = ()
    if key == ("", "LeakyRelu"):
        params = (attrs.get("alpha", 0.01),)
    if key == ("", "Gelu") and attrs.get("approximate", "none") in ("none", "tanh"):
        name = "Gelu" if attrs.get("approximate", "none") == "none" else "GeluTanh"
    if name is None or (key[0] == "" and set(attrs) - {"alpha", "approximate"}):
        return None
    code, alpha, beta = kernels._activation(name, params)
    return ACTIVATION, code, alpha, beta


@dataclass
class Link:
    """One member of a chain: its step, op encoding, and which input carries the value."""
    step: object
    op: tuple[int, int, float, float]
    value_input: int  # index into step.inputs of the chained value (0 for the first member)


def find_chains(steps, encodings: list, keep: set[int], readers: dict[int, int]) -> list[list[Link]]:
    """Chains of two or more steps: each member's output is read only by the next member (once),
    and is not a graph output; no step joins two chains (fusion_groups.chains finds them).
    encodings[i] is chain_op's result for steps[i] (or None)."""
    from . import fusion_groups

    graph = fusion_groups.GroupGraph(
        inputs=[step.inputs for step in steps],
        outputs=[step.outputs[0] if len(step.outputs) == 1 else None for step in steps],
        eligible=[e is not None for e in encodings], readers=readers, keep=keep)
    chains = []
    for members in fusion_groups.chains(graph):
        links = [Link(steps[members[0]], encodings[members[0]], 0)]
        links += [Link(steps[j], encodings[j], steps[j].inputs.index(steps[prev].outputs[0]))
                  for prev, j in itertools.pairwise(members)]
        chains.append(links)
    return chains


class FusedChain:
    """The run function of a fused chain's step: inputs are the chain's first value and then the
    side operand of each binary member, in member order."""

    def __init__(self, links: list[Link]):
        self.links = links
        self.ops = [link.op for link in links]
        self.sides = [k for k, link in enumerate(links) if link.op[0] == BINARY]
        self.names = [link.step.node.name or link.step.node.op_type for link in links]
        self._params = kernels.ffi.new("float[]", [p for op in self.ops for p in op[2:]] or [0.0])
        # per member: (kind, C code, which input is the chained value), the geometry's cache key
        self._members = tuple((op[0], op[1], link.value_input) for op, link in zip(self.ops, links))
        self._last_sides: tuple = ()
        self._last_geometry = None
        self._last_table: kernels.PointerTable | None = None

    def inputs(self) -> list[int]:
        first = self.links[0].step
        slots = [first.inputs[0]]
        for k in self.sides:
            link = self.links[k]
            slots.append(link.step.inputs[1 - link.value_input])
        return slots

    def __call__(self, x, *sides):
        if self._reusable(x, sides):
            geometry, side_table = self._last_geometry, self._last_table
        else:
            prepared = self._prepare(x, sides)
            if prepared is None:
                return self.one_by_one(x, *sides)
            geometry, side_table, x = prepared
        shape, _, ops, geo = geometry
        out = np.empty(shape, np.float32)
        kernels.chain(x, out, ops, self._params, side_table, geo)
        return [out]

    def _reusable(self, x, sides) -> bool:
        """Whether this call repeats the last one's shapes and (read-only) side arrays, as every
        run of a static model whose sides are initializers does: then nothing is recomputed."""
        return (self._last_geometry is not None and isinstance(x, np.ndarray)
                and x.dtype == np.float32 and x.shape == self._last_geometry[0]
                and x.flags.c_contiguous and len(sides) == len(self._last_sides)
                and all(map(operator.is_, sides, self._last_sides)))

    def _prepare(self, x, sides):
        """(geometry, side pointer table, first value) for these arrays, or None when the chain
        kernel cannot take them.  Views (slices, transposes, broadcasts, negative strides) are
        copied to C-contiguous arrays; the PointerTable owns those copies, so they live for as
        long as any pointer to them is used."""
        arrays = (x, *sides)
        if not all(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in arrays):
            return None
        arrays = tuple(a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in arrays)
        geometry = _geometry(self._members, tuple(a.shape for a in arrays))
        if geometry is None:
            return None
        start = geometry[1]
        ordered = (arrays[start],) + arrays[:start] + arrays[start + 1:]
        side_table = kernels.PointerTable(len(self.ops), dict(zip(self.sides, ordered[1:])))
        # initializers come back as the same read-only arrays on every run: keep their pointers
        cacheable = start == 0 and all(not a.flags.writeable and a is b
                                       for a, b in zip(ordered[1:], sides))
        self._last_sides = sides if cacheable else ()
        self._last_geometry = geometry if cacheable else None
        self._last_table = side_table if cacheable else None
        return geometry, side_table, ordered[0]

    def plan_layout(self, shapes: tuple):
        """For C-contiguous float32 arrays of these shapes (the chain's inputs): (output shape,
        index of the input the chain starts from, C ops, C params, C side geometry) as
        __call__ would pass them to kernels.chain, or None where it would run one by one."""
        geometry = _geometry(self._members, tuple(tuple(s) for s in shapes))
        if geometry is None:
            return None
        shape, start, ops, geo = geometry
        return shape, start, ops, self._params, geo

    def one_by_one(self, x, *sides):
        value, side_values = x, iter(sides)
        for k, link in enumerate(self.links):
            if link.op[0] == BINARY:
                side = next(side_values)
                pair = [value, side] if (link.value_input == 0) else [side, value]
                value = link.step.run(*pair)[0]
            else:
                value = link.step.run(value)[0]
        return [value]


@functools.lru_cache(maxsize=1024)
def _geometry(members: tuple, shapes: tuple):
    """(output shape, index of the array the chain starts from, C op array, C side geometry),
    or None when the chain kernel cannot run these shapes."""
    try:
        shape = np.broadcast_shapes(*shapes)
    except ValueError:
        return None
    start = 0
    if shapes[0] != shape:  # a first binary member whose other operand has the full shape
        if members[0][0] != BINARY or shapes[1] != shape:
            return None
        start = 1
    ops, geo = [], []
    side_shapes = iter(shapes[:start] + shapes[start + 1:])
    for k, (kind, code, value_input) in enumerate(members):
        swapped = value_input == 1 if k else start == 1
        ops += [kind, code, int(swapped and kind == BINARY)]
        if kind != BINARY:
            geo += [0, 0]
            continue
        period_inner = _period_inner(next(side_shapes), shape)
        if period_inner is None:
            return None
        geo += list(period_inner)
    return (shape, start, kernels.ffi.new("int32_t[]", ops),
            kernels.ffi.new("int64_t[]", geo or [0]))


def _period_inner(side: tuple, shape: tuple) -> tuple[int, int] | None:
    """(period, inner) with side[(i // inner) % period] the side value for output element i."""
    strides = kernels._broadcast_strides(side, shape)
    dims, (merged,) = kernels._collapsed_broadcast(shape, strides)
    inner = 1
    while dims and merged[-1] == 0:
        inner *= dims.pop()
        merged.pop()
    if not dims:
        return 1, 1
    period = dims.pop()
    if merged.pop() != 1 or any(merged):
        return None
    return period, inner
