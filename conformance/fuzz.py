"""Differential fuzzing: hypothesis builds random valid graphs, and the reference evaluator's
outputs are compared with the optimized runtime's at every graph optimization level, and with
onnxruntime's where onnxruntime runs the graph.

The graphs are chains and DAGs over elementwise ops (broadcasting included), reductions,
MatMul, Conv, pooling, Reshape, Transpose, Slice, Gather, Concat and Split, on float32,
float16, int64 and bool, with shapes that include 0 and 1. Slice, Transpose and Split results
are views in NumPy, and graph inputs are fed as transposed, strided, reversed or broadcast
views, so every kernel and fused chain sees non-contiguous operands.

A mismatch is shrunk by hypothesis and saved as a regression folder (model.onnx, inputs.npz,
case.json with each input's memory layout), which tests/test_fuzz.py replays.
"""
from __future__ import annotations

import json
import math
import os
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from reference.agreement import Mismatch, Tolerance, compare_values

OPSET = 21
IR_VERSION = 10  # what onnxruntime >= 1.20 reads; opset 21 needs IR 10
LEVELS = (0, 1, 2, 99)
REPEATS = 3  # runs per optimized session: the first in Python, the later ones planned in C
DTYPES = ("float32", "float16", "int64", "bool")
FLOATS = ("float32", "float16")
ONNX_TYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
             "int64": TensorProto.INT64, "bool": TensorProto.BOOL}
LAYOUTS = ("contiguous", "transposed", "strided", "reversed", "broadcast")

# Whole-graph float comparison: reference/agreement.py's corpus policy with these tolerances.
# Inputs are multiples of 1/4 in [-2, 2] and graphs have at most a dozen ops, so results are O(10)
# before an Exp; a different summation order in MatMul/Conv/reductions (K <= 60 terms) moves a
# float32 result by about K*u*sum|ab| <= 60 * 6e-8 * 100 = 4e-4 near cancellation: atol 1e-3.
# float16 has u = 4.9e-4, and a fused kernel that rounds once where the reference rounds per
# op differs by a few ulps: rtol and atol 2e-2 (about 40 ulps).
TOLERANCES = {
    "float32": Tolerance(rtol=1e-3, atol=1e-3),
    "float16": Tolerance(rtol=2e-2, atol=2e-2),
}


# ---------------------------------------------------------------------------------------------
# the graph builder
# ---------------------------------------------------------------------------------------------
@dataclass
class Value:
    name: str
    dtype: str
    shape: tuple


@dataclass
class InputSpec:
    name: str
    dtype: str
    shape: tuple
    layout: str


@dataclass
class FuzzCase:
    """A model and its feeds; `layouts` says how each feed is laid out in memory."""

    model: onnx.ModelProto
    feeds: dict
    layouts: dict = field(default_factory=dict)

    def describe(self) -> str:
        ops = [n.op_type for n in self.model.graph.node]
        inputs = [f"{k}:{v.dtype}{list(v.shape)}({self.layouts.get(k, 'contiguous')})"
                  for k, v in self.feeds.items()]
        return f"{len(ops)} nodes {ops}; inputs {inputs}"


class Builder:
    def __init__(self, draw, rng: np.random.Generator):
        self.draw = draw
        self.rng = rng
        self.nodes: list = []
        self.inputs: list[InputSpec] = []
        self.initializers: list = []
        self.values: list[Value] = []  # every value an op may read, in the order made
        self.used: set[str] = set()
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    # operands --------------------------------------------------------------------------
    def pick(self, ok=lambda v: True) -> Value | None:
        """A value for an op to read: the latest that fits, half of the time (chains), else any
        that fits (DAGs)."""
        fits = [v for v in self.values if ok(v)]
        if not fits:
            return None
        if self.draw(st.booleans()):
            return fits[-1]
        return fits[self.draw(st.integers(0, len(fits) - 1))]

    def new_input(self, dtype: str, shape: tuple) -> Value:
        layout = "contiguous"
        if shape:
            layout = self.draw(st.sampled_from(LAYOUTS))
        spec = InputSpec(self.name("in"), dtype, tuple(shape), layout)
        self.inputs.append(spec)
        value = Value(spec.name, dtype, tuple(shape))
        self.values.append(value)
        return value

    def constant(self, array: np.ndarray, prefix="c") -> str:
        name = self.name(prefix)
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def operand(self, dtype: str, shape: tuple) -> str:
        """A second operand of a given type and shape: a new graph input or an initializer."""
        if self.draw(st.booleans()):
            return self.new_input(dtype, shape).name
        return self.constant(random_array(self.rng, dtype, shape), "w")

    def node(self, op_type: str, inputs: list[str], outputs: list[tuple[str, tuple]], **attrs) -> list[Value]:
        names = [self.name(op_type.lower()) for _ in outputs]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=f"n{len(self.nodes)}_{op_type}",
                                           **attrs))
        self.used.update(inputs)
        made = [Value(n, dtype, tuple(shape)) for n, (dtype, shape) in zip(names, outputs)]
        self.values.extend(made)
        return made

    # the model -------------------------------------------------------------------------
    def model(self, extra_outputs: list[Value]) -> onnx.ModelProto:
        made = [v for v in self.values if v.name not in {i.name for i in self.inputs}]
        outputs = [v for v in made if v.name not in self.used]
        outputs += [v for v in extra_outputs if v not in outputs and v in made]
        graph = helper.make_graph(
            self.nodes, "fuzz",
            [helper.make_tensor_value_info(i.name, ONNX_TYPE[i.dtype], list(i.shape)) for i in self.inputs],
            [helper.make_tensor_value_info(v.name, ONNX_TYPE[v.dtype], list(v.shape)) for v in outputs],
            self.initializers)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                 ir_version=IR_VERSION, producer_name="onnx-parity fuzz")


def random_array(rng: np.random.Generator, dtype: str, shape: tuple) -> np.ndarray:
    """Multiples of 1/4 in [-2, 2] for floats, small integers, fair booleans."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype == "int64":
        return rng.integers(-6, 7, size=shape).astype(np.int64)
    return (rng.integers(-8, 9, size=shape) / 4).astype(dtype)


def as_layout(array: np.ndarray, layout: str) -> np.ndarray:
    """The same values as `array`, held in memory as `layout` says (a view, not a copy)."""
    if array.ndim == 0 or layout == "contiguous":
        return array.copy(order="C")  # (np.ascontiguousarray makes a 0-d array 1-d)
    if layout == "transposed":
        return np.ascontiguousarray(array.T).T
    if layout == "strided":
        wide = np.zeros(array.shape[:-1] + (2 * array.shape[-1] + 1,), array.dtype)
        wide[..., 1::2] = array
        return wide[..., 1::2]
    if layout == "reversed":
        return np.ascontiguousarray(array[::-1])[::-1]
    if layout == "broadcast":
        if array.shape[0] and not (array == array[:1]).all():
            raise ValueError("a broadcast layout needs values that repeat along axis 0")
        return np.broadcast_to(array[:1], array.shape)
    raise ValueError(f"unknown layout {layout!r}")


def make_feeds(inputs: list[InputSpec], seed: int) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in inputs:
        shape = spec.shape
        if spec.layout == "broadcast":
            row = random_array(rng, spec.dtype, (1,) + shape[1:])
            data = np.broadcast_to(row, shape).copy()
        else:
            data = random_array(rng, spec.dtype, shape)
        feeds[spec.name] = as_layout(data, spec.layout)
    return feeds


# ---------------------------------------------------------------------------------------------
# shapes and ops
# ---------------------------------------------------------------------------------------------
# 1 first, so that hypothesis shrinks towards it; 0 about one dim in 16 (a third of 4-d shapes
# would be empty at 1 in 9, and the empty ones compute nothing).
DIM = st.sampled_from([1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 6, 7, 0])
DTYPE = st.sampled_from(["float32", "float32", "float32", "float16", "int64", "bool"])


def shapes(min_rank=0, max_rank=4):
    return st.lists(DIM, min_size=min_rank, max_size=max_rank).map(tuple)


def broadcast_partner(draw, shape: tuple) -> tuple:
    """A shape that broadcasts against `shape` without changing the result's shape."""
    keep = draw(st.integers(0, len(shape)))
    tail = shape[len(shape) - keep:]
    return tuple(1 if draw(st.booleans()) else d for d in tail)


UNARY = {
    "float": ["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "LeakyRelu", "Softsign", "Sqrt",
              "Gelu", "Floor", "HardSigmoid"],
    "int64": ["Abs", "Neg", "Identity"],
    "bool": ["Not", "Identity"],
}
BINARY = {
    "float": ["Add", "Sub", "Mul", "Div", "Max", "Min"],
    "int64": ["Add", "Sub", "Mul", "Max", "Min"],
    "bool": ["And", "Or", "Xor"],
}


def kind(dtype: str) -> str:
    return "float" if dtype in FLOATS else dtype


def op_unary(b: Builder) -> None:
    v = b.pick()
    op = b.draw(st.sampled_from(UNARY[kind(v.dtype)]))
    attrs = {"alpha": 0.1} if op == "LeakyRelu" else {}
    b.node(op, [v.name], [(v.dtype, v.shape)], **attrs)


def op_binary(b: Builder) -> None:
    a = b.pick()
    op = b.draw(st.sampled_from(BINARY[kind(a.dtype)]))
    partners = [v for v in b.values if v.dtype == a.dtype and _broadcasts(a.shape, v.shape)]
    if partners and b.draw(st.booleans()):
        other = partners[b.draw(st.integers(0, len(partners) - 1))]
        name, shape = other.name, np.broadcast_shapes(a.shape, other.shape)
    else:
        pshape = broadcast_partner(b.draw, a.shape)
        name, shape = b.operand(a.dtype, pshape), a.shape
    inputs = [a.name, name] if b.draw(st.booleans()) else [name, a.name]
    b.node(op, inputs, [(a.dtype, tuple(shape))])


def _broadcasts(x: tuple, y: tuple) -> bool:
    try:
        np.broadcast_shapes(x, y)
        return True
    except ValueError:
        return False


CHAIN_UNARY = ["Relu", "Sigmoid", "Tanh", "LeakyRelu", "Abs", "Neg", "Exp"]


def op_chain(b: Builder) -> None:
    """2-4 elementwise ops in a row on one value, each reading the previous one only (what the
    level-2 fusion runs as one C call), e.g. Split -> Sigmoid -> Mul(by the other half) -> Mul."""
    a = b.pick(lambda v: v.dtype in FLOATS)
    if a is None:
        a = b.new_input(b.draw(st.sampled_from(FLOATS)), b.draw(shapes(1, 4)))
    for _ in range(b.draw(st.integers(2, 4))):
        if b.draw(st.booleans()):
            op = b.draw(st.sampled_from(CHAIN_UNARY))
            a = b.node(op, [a.name], [(a.dtype, a.shape)], **({"alpha": 0.2} if op == "LeakyRelu" else {}))[0]
            continue
        op = b.draw(st.sampled_from(BINARY["float"]))
        same = [v for v in b.values if v.dtype == a.dtype and v.name != a.name
                and _broadcasts(a.shape, v.shape) and np.broadcast_shapes(a.shape, v.shape) == a.shape]
        if same and b.draw(st.booleans()):
            other = same[b.draw(st.integers(0, len(same) - 1))].name
        else:
            other = b.operand(a.dtype, broadcast_partner(b.draw, a.shape))
        inputs = [a.name, other] if b.draw(st.booleans()) else [other, a.name]
        a = b.node(op, inputs, [(a.dtype, a.shape)])[0]


def op_compare(b: Builder) -> None:
    a = b.pick(lambda v: v.dtype != "bool")
    if a is None:
        return op_unary(b)
    op = b.draw(st.sampled_from(["Less", "Greater", "Equal"]))
    name = b.operand(a.dtype, broadcast_partner(b.draw, a.shape))
    b.node(op, [a.name, name], [("bool", a.shape)])


def op_where(b: Builder) -> None:
    a = b.pick(lambda v: v.dtype != "bool")
    if a is None:
        return op_unary(b)
    cond = b.pick(lambda v: v.dtype == "bool" and _broadcasts(v.shape, a.shape)
                  and np.broadcast_shapes(v.shape, a.shape) == a.shape)
    cond_name = cond.name if cond else b.operand("bool", broadcast_partner(b.draw, a.shape))
    other = b.operand(a.dtype, broadcast_partner(b.draw, a.shape))
    b.node("Where", [cond_name, a.name, other], [(a.dtype, a.shape)])


def op_cast(b: Builder) -> None:
    a = b.pick(lambda v: v.dtype in ("int64", "bool"))
    if a is None:
        return op_unary(b)
    to = b.draw(st.sampled_from(["float32", "float16"] + (["int64"] if a.dtype == "bool" else [])))
    b.node("Cast", [a.name], [(to, a.shape)], to=ONNX_TYPE[to])


def op_reduce(b: Builder) -> None:
    a = b.pick(lambda v: v.dtype != "bool" and len(v.shape) >= 1)
    if a is None:
        return op_unary(b)
    ops = ["ReduceSum", "ReduceMax", "ReduceMin"] + (["ReduceMean"] if a.dtype in FLOATS else [])
    op = b.draw(st.sampled_from(ops))
    rank = len(a.shape)
    axes = sorted(set(b.draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank))))
    if op != "ReduceSum" and any(a.shape[x] == 0 for x in axes):
        op = "ReduceSum"  # the others have no value over an empty set that all runtimes share
    keepdims = b.draw(st.sampled_from([0, 1]))
    shape = tuple(1 if i in axes else d for i, d in enumerate(a.shape) if keepdims or i not in axes)
    signed = [x - rank if b.draw(st.booleans()) else x for x in axes]
    axes_name = b.constant(np.array(signed, np.int64), "axes")
    b.node(op, [a.name, axes_name], [(a.dtype, shape)], keepdims=keepdims)


def op_matmul(b: Builder) -> None:
    a = b.pick(lambda v: v.dtype in FLOATS and len(v.shape) >= 1)
    if a is None:
        a = b.new_input(b.draw(st.sampled_from(FLOATS)), b.draw(shapes(1, 3)))
    k = a.shape[-1]
    n = b.draw(DIM)
    batch = ()
    if len(a.shape) >= 3 and b.draw(st.booleans()):
        batch = broadcast_partner(b.draw, a.shape[:-2])
    other = b.operand(a.dtype, batch + (k, n))
    out = np.matmul(np.zeros(a.shape, np.float32), np.zeros(batch + (k, n), np.float32)).shape
    b.node("MatMul", [a.name, other], [(a.dtype, out)])


def _window(b: Builder, size: int, max_kernel: int, dilate: bool, pad_below_kernel: bool):
    """(kernel, stride, dilation, pad_begin, pad_end, out) for one spatial axis, out >= 1."""
    dilation = b.draw(st.sampled_from([1, 1, 2])) if dilate else 1
    kernel = b.draw(st.integers(1, max_kernel))
    pad_max = kernel - 1 if pad_below_kernel else kernel
    pads = (b.draw(st.integers(0, pad_max)), b.draw(st.integers(0, pad_max)))
    stride = b.draw(st.sampled_from([1, 1, 2, 3]))
    span = dilation * (kernel - 1) + 1
    while size + sum(pads) < span and (kernel > 1 or dilation > 1):
        kernel, dilation = max(1, kernel - 1), 1
        span = kernel
        pads = (min(pads[0], kernel - 1), min(pads[1], kernel - 1)) if pad_below_kernel else pads
    if size + sum(pads) < span:
        return None
    out = (size + sum(pads) - span) // stride + 1
    if pad_below_kernel and any(_only_padding(i * stride - pads[0], kernel, dilation, size)
                                for i in range(out)):
        # A pooling window of padding alone has no value the spec gives (onnxruntime says
        # -FLT_MAX, NumPy -inf); exporters never write one.
        if size < span:
            return None
        pads = (0, 0)
        out = (size - span) // stride + 1
    return kernel, stride, dilation, pads[0], pads[1], out


def _only_padding(first: int, kernel: int, dilation: int, size: int) -> bool:
    return not any(0 <= first + j * dilation < size for j in range(kernel))


def _spatial(b: Builder, dtypes) -> Value:
    a = b.pick(lambda v: v.dtype in dtypes and len(v.shape) == 4 and v.shape[1] >= 1
               and v.shape[2] >= 1 and v.shape[3] >= 1)
    if a is None:
        shape = (b.draw(st.sampled_from([0, 1, 2])), b.draw(st.integers(1, 4)),
                 b.draw(st.integers(1, 7)), b.draw(st.integers(1, 6)))
        a = b.new_input(b.draw(st.sampled_from(dtypes)), shape)
    return a


def op_conv(b: Builder) -> None:
    a = _spatial(b, ("float32",))
    n, c, h, w = a.shape
    axes = [_window(b, h, 3, True, False), _window(b, w, 3, True, False)]
    if None in axes:
        return op_unary(b)
    group = b.draw(st.sampled_from([1, c] if c > 1 else [1]))
    m = group * b.draw(st.integers(1, 3))
    weights = random_array(b.rng, "float32", (m, c // group, axes[0][0], axes[1][0]))
    inputs = [a.name, b.constant(weights, "w")]
    if b.draw(st.booleans()):
        inputs.append(b.constant(random_array(b.rng, "float32", (m,)), "bias"))
    b.node("Conv", inputs, [("float32", (n, m, axes[0][5], axes[1][5]))],
           kernel_shape=[axes[0][0], axes[1][0]], strides=[axes[0][1], axes[1][1]],
           dilations=[axes[0][2], axes[1][2]], pads=[axes[0][3], axes[1][3], axes[0][4], axes[1][4]],
           group=group)


def op_pool(b: Builder) -> None:
    op = b.draw(st.sampled_from(["MaxPool", "AveragePool"]))
    a = _spatial(b, FLOATS if op == "MaxPool" else ("float32",))
    n, c, h, w = a.shape
    axes = [_window(b, h, 3, op == "MaxPool", True), _window(b, w, 3, op == "MaxPool", True)]
    if None in axes:
        return op_unary(b)
    attrs = {"kernel_shape": [axes[0][0], axes[1][0]], "strides": [axes[0][1], axes[1][1]],
             "pads": [axes[0][3], axes[1][3], axes[0][4], axes[1][4]]}
    if op == "MaxPool":
        attrs["dilations"] = [axes[0][2], axes[1][2]]
    else:
        attrs["count_include_pad"] = b.draw(st.sampled_from([0, 1]))
    b.node(op, [a.name], [(a.dtype, (n, c, axes[0][5], axes[1][5]))], **attrs)


def op_reshape(b: Builder) -> None:
    a = b.pick()
    total = math.prod(a.shape)
    rank = b.draw(st.integers(1, 4))
    if total == 0:
        shape = [b.draw(st.integers(1, 3)) for _ in range(rank)]
        shape[b.draw(st.integers(0, rank - 1))] = 0
    else:
        shape, left = [], total
        for _ in range(rank - 1):
            divisors = [d for d in range(1, left + 1) if left % d == 0]
            d = b.draw(st.sampled_from(divisors))
            shape.append(d)
            left //= d
        shape.append(left)
    spec = list(shape)
    if total and b.draw(st.booleans()):
        spec[b.draw(st.integers(0, rank - 1))] = -1
    attrs = {"allowzero": 1} if 0 in spec else {}
    b.node("Reshape", [a.name, b.constant(np.array(spec, np.int64), "shape")],
           [(a.dtype, tuple(shape))], **attrs)


def op_transpose(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 2)
    if a is None:
        return op_unary(b)
    perm = b.draw(st.permutations(range(len(a.shape))))
    b.node("Transpose", [a.name], [(a.dtype, tuple(a.shape[p] for p in perm))], perm=list(perm))


BIG = 2**63 - 1


def slice_length(d: int, start: int, end: int, step: int) -> int:
    """ONNX Slice's element count on one axis (the spec's clamping, not Python's)."""
    start = start + d if start < 0 else start
    end = end + d if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), d), min(max(end, 0), d)
    else:
        start, end = min(max(start, 0), d - 1), min(max(end, -1), d - 1)
    return max(0, -(-(end - start) // step))


def op_slice(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1)
    if a is None:
        return op_unary(b)
    rank = len(a.shape)
    axes = sorted(set(b.draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank))))
    starts, ends, steps, shape = [], [], [], list(a.shape)
    for x in axes:
        d = a.shape[x]
        step = b.draw(st.sampled_from([1, 1, 2, -1, -2, 3]))
        # onnxruntime reads INT64_MAX as "to the start" when stepping back (the spec clamps it
        # to d-1); exporters write INT64_MIN there, so that is what backward slices get.
        ends_choice = ([BIG, -BIG] if step > 0 else [-BIG]) if b.draw(st.booleans()) else []
        start = b.draw(st.integers(-d - 2, d + 2))
        end = b.draw(st.sampled_from(ends_choice)) if ends_choice else b.draw(st.integers(-d - 2, d + 2))
        starts.append(start)
        ends.append(end)
        steps.append(step)
        shape[x] = slice_length(d, start, end, step)
    signed = [x - rank if b.draw(st.booleans()) else x for x in axes]
    inputs = [a.name, b.constant(np.array(starts, np.int64), "starts"),
              b.constant(np.array(ends, np.int64), "ends"),
              b.constant(np.array(signed, np.int64), "axes"),
              b.constant(np.array(steps, np.int64), "steps")]
    b.node("Slice", inputs, [(a.dtype, tuple(shape))])


def op_gather(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1)
    if a is None:
        return op_unary(b)
    axis = b.draw(st.integers(0, len(a.shape) - 1))
    d = a.shape[axis]
    ishape = b.draw(shapes(0, 2)) if d else (0,)
    indices = b.rng.integers(-d, d, size=ishape).astype(np.int64) if d else np.zeros(ishape, np.int64)
    out = a.shape[:axis] + tuple(ishape) + a.shape[axis + 1:]
    b.node("Gather", [a.name, b.constant(indices, "idx")], [(a.dtype, out)],
           axis=axis - len(a.shape) if b.draw(st.booleans()) else axis)


def op_concat(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1)
    if a is None:
        return op_unary(b)
    axis = b.draw(st.integers(0, len(a.shape) - 1))
    same = [v for v in b.values if v.dtype == a.dtype and len(v.shape) == len(a.shape)
            and all(p == q for i, (p, q) in enumerate(zip(v.shape, a.shape)) if i != axis)]
    if same and b.draw(st.booleans()):
        other = same[b.draw(st.integers(0, len(same) - 1))]
        name, size = other.name, other.shape[axis]
    else:
        size = b.draw(DIM)
        name = b.operand(a.dtype, a.shape[:axis] + (size,) + a.shape[axis + 1:])
    shape = a.shape[:axis] + (a.shape[axis] + size,) + a.shape[axis + 1:]
    b.node("Concat", [a.name, name], [(a.dtype, shape)], axis=axis)


def op_split(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1)
    if a is None:
        return op_unary(b)
    axis = b.draw(st.integers(0, len(a.shape) - 1))
    d = a.shape[axis]
    parts = b.draw(st.integers(2, 3))
    cuts = sorted(b.draw(st.integers(0, d)) for _ in range(parts - 1))
    sizes = [hi - lo for lo, hi in zip([0] + cuts, cuts + [d])]
    outs = [(a.dtype, a.shape[:axis] + (s,) + a.shape[axis + 1:]) for s in sizes]
    b.node("Split", [a.name, b.constant(np.array(sizes, np.int64), "split")], outs, axis=axis)


OPS = {
    "unary": op_unary, "binary": op_binary, "compare": op_compare, "where": op_where,
    "cast": op_cast, "reduce": op_reduce, "matmul": op_matmul, "conv": op_conv, "pool": op_pool,
    "reshape": op_reshape, "transpose": op_transpose, "slice": op_slice, "gather": op_gather,
    "concat": op_concat, "split": op_split, "chain": op_chain,
}


# Elementwise ops weigh more: chains of them are what the level-2 fusion turns into one C call.
OP_WEIGHTS = {"chain": 3, "unary": 3, "binary": 3, "compare": 1, "where": 1, "cast": 1, "reduce": 1,
              "matmul": 1, "conv": 1, "pool": 1, "reshape": 1, "transpose": 2, "slice": 2,
              "gather": 1, "concat": 1, "split": 2}
OP_CHOICES = st.sampled_from([name for name in sorted(OPS) for _ in range(OP_WEIGHTS[name])])


@st.composite
def cases(draw, max_ops: int = 10) -> FuzzCase:
    """A random valid graph with 1-3 inputs and 1-`max_ops` op steps, and its feeds."""
    b = Builder(draw, np.random.default_rng(draw(st.integers(0, 2**32 - 1))))
    for _ in range(draw(st.integers(1, 3))):
        b.new_input(draw(DTYPE), draw(shapes()))
    for _ in range(draw(st.integers(1, max_ops))):
        OPS[draw(OP_CHOICES)](b)
    made = [v for v in b.values if v.name not in {i.name for i in b.inputs}]
    extra = [v for v in made if draw(st.integers(0, 7)) == 0]
    model = b.model(extra)
    if not model.graph.output:  # every op was skipped: read the first input
        v = b.values[0]
        b.node("Identity", [v.name], [(v.dtype, v.shape)])
        model = b.model([])
    feeds = make_feeds(b.inputs, draw(st.integers(0, 2**32 - 1)))
    return FuzzCase(model, feeds, {i.name: i.layout for i in b.inputs})


# ---------------------------------------------------------------------------------------------
# running and comparing
# ---------------------------------------------------------------------------------------------
def run_reference(model, feeds) -> list:
    from reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, feeds)


class RepeatedRunMismatch(Exception):
    """A session's later run of the same feeds disagrees with its first, or changed it."""


def run_optimized(model_bytes: bytes, feeds, level: int) -> list:
    """The first run's outputs, after REPEATS runs of one session that must all give them
    bit for bit: the plan runs a signature's steps as one C call from its second run on, and
    a later run must not write into the arrays an earlier one returned."""
    from optimized import GraphOptimizationLevel, InferenceSession, SessionOptions

    options = SessionOptions()
    options.graph_optimization_level = GraphOptimizationLevel.from_level(level)
    session = InferenceSession(model_bytes, sess_options=options)
    first = session.run(None, feeds)
    kept = [np.array(o, copy=True) for o in first]
    for run in range(2, REPEATS + 1):
        again = session.run(None, feeds)
        _same_bits(kept, again, f"run {run} differs from run 1")
    _same_bits(kept, first, "run 1's outputs were changed by a later run")
    return first


def _same_bits(expected: list, actual: list, what: str) -> None:
    if len(actual) != len(expected):
        raise RepeatedRunMismatch(f"{what}: {len(actual)} outputs, expected {len(expected)}")
    for i, (e, a) in enumerate(zip(expected, actual)):
        a = np.asarray(a)
        same = (e.shape == a.shape and e.dtype == a.dtype
                and np.array_equal(e, a, equal_nan=e.dtype.kind in "fc"))
        if not same:
            raise RepeatedRunMismatch(f"{what} at output {i}: {_first_difference(e, a)}")


def _first_difference(expected: np.ndarray, actual: np.ndarray) -> str:
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        return f"{actual.dtype}{actual.shape} vs {expected.dtype}{expected.shape}"
    differ = ~((expected == actual) | (np.isnan(expected) & np.isnan(actual))
               if expected.dtype.kind in "fc" else expected == actual)
    where = tuple(int(i) for i in np.argwhere(differ)[0])
    return f"{int(differ.sum())} elements differ, first at {list(where)}: {actual[where]!r} vs {expected[where]!r}"


def run_onnxruntime(model_bytes: bytes, feeds) -> list | None:
    """onnxruntime's outputs, or None where it is not installed or does not run the graph (a
    missing kernel for a dtype): it is an anchor, not the truth."""
    try:
        import onnxruntime
    except ImportError:
        return None
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    try:
        session = onnxruntime.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        return session.run(None, feeds)
    except Exception:  # noqa: BLE001 - a graph it does not run is left out
        return None


def compare(expected: list, actual: list, names: list[str], skip_nan: bool = False) -> str | None:
    """The first difference, under the corpus policy with TOLERANCES for floats, or None.
    `skip_nan` leaves out outputs where the reference has a NaN: ONNX does not say how Max,
    MaxPool or ReduceMax treat NaN, and onnxruntime's ignore it where NumPy's propagate it."""
    if len(expected) != len(actual):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for name, e, a in zip(names, expected, actual):
        e = np.asarray(e)
        if skip_nan and e.dtype.kind == "f" and np.isnan(e).any():
            continue
        tol = TOLERANCES.get(str(e.dtype), Tolerance())
        try:
            compare_values(e, np.asarray(a) if isinstance(a, np.generic) else a, tol, name)
        except Mismatch as m:
            return str(m)
    return None


def check_case(case: FuzzCase, onnxruntime: bool = True) -> list[str]:
    """Every disagreement with the reference, one line each ([] when all agree)."""
    model_bytes = case.model.SerializeToString()
    onnx.shape_inference.infer_shapes(case.model, strict_mode=True)  # the generator's own check
    names = [o.name for o in case.model.graph.output]
    before = {k: v.copy() for k, v in case.feeds.items()}
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # NaN and Inf are legal values here
        return _check_backends(case, model_bytes, names, before, onnxruntime)


def _check_backends(case: FuzzCase, model_bytes: bytes, names: list, before: dict,
                    onnxruntime: bool) -> list[str]:
    expected = run_reference(case.model, case.feeds)
    problems = []
    runs = [(f"optimized level {level}", lambda lv=level: run_optimized(model_bytes, case.feeds, lv))
            for level in LEVELS]
    if onnxruntime:
        runs.append(("onnxruntime", lambda: run_onnxruntime(model_bytes, case.feeds)))
    for label, run in runs:
        try:
            actual = run()
        except Exception as e:  # noqa: BLE001 - the reference ran this graph, so must the backend
            problems.append(f"{label}: raised {type(e).__name__}: {str(e)[:500]}")
            continue
        if actual is None:
            continue
        difference = compare(expected, actual, names, skip_nan=label == "onnxruntime")
        if difference:
            problems.append(f"{label}: {difference}")
        for k, v in before.items():
            if not np.array_equal(v, case.feeds[k], equal_nan=v.dtype.kind == "f"):
                problems.append(f"{label}: wrote into the caller's input {k!r}")
                case.feeds[k] = as_layout(v.copy(), case.layouts.get(k, "contiguous"))
    return problems


# ---------------------------------------------------------------------------------------------
# regressions
# ---------------------------------------------------------------------------------------------
def save_case(case: FuzzCase, folder: str, problems: list[str], note: str = "") -> str:
    os.makedirs(folder, exist_ok=True)
    onnx.save(case.model, os.path.join(folder, "model.onnx"))
    np.savez(os.path.join(folder, "inputs.npz"), **{k: v.copy(order="C") for k, v in case.feeds.items()})
    meta = {"layouts": case.layouts, "problems": problems, "description": case.describe()}
    if note:
        meta["note"] = note
    with open(os.path.join(folder, "case.json"), "w") as f:
        json.dump(meta, f, indent=1)
    return folder


def load_case(folder: str) -> tuple[FuzzCase, dict]:
    with open(os.path.join(folder, "case.json")) as f:
        meta = json.load(f)
    model = onnx.load(os.path.join(folder, "model.onnx"))
    with np.load(os.path.join(folder, "inputs.npz"), allow_pickle=False) as data:
        feeds = {k: as_layout(data[k], meta["layouts"].get(k, "contiguous")) for k in data.files}
    return FuzzCase(model, feeds, meta["layouts"]), meta


def regression_name(case: FuzzCase) -> str:
    import hashlib

    digest = hashlib.sha256(case.model.SerializeToString())
    for k in sorted(case.feeds):
        digest.update(case.feeds[k].tobytes())
    ops = sorted({n.op_type for n in case.model.graph.node})
    return "-".join(ops[:4]).lower() + "-" + digest.hexdigest()[:10]


# ---------------------------------------------------------------------------------------------
# campaigns
# ---------------------------------------------------------------------------------------------
@dataclass
class BatchResult:
    batch: int
    examples: int = 0
    problems: list = field(default_factory=list)
    saved: str = ""
    seconds: float = 0.0
    outcome: str = "ok"  # ok, mismatch, crash, timeout


def run_batch(seed: int, examples: int, out_dir: str, batch: int = 0, onnxruntime: bool = True,
              max_ops: int = 10) -> BatchResult:
    """One hypothesis campaign of up to `examples` graphs; the first mismatch is shrunk and
    saved under `out_dir`."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    start = time.perf_counter()
    result = BatchResult(batch)
    last_failure: list = []
    running = os.path.join(out_dir, ".running", f"batch{batch}")

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None, print_blob=False,
              phases=[Phase.generate, Phase.shrink],
              suppress_health_check=list(HealthCheck))
    @given(cases(max_ops=max_ops))
    def check(case):
        if not last_failure:
            result.examples += 1
        save_case(case, running, [], "in progress (left here if the worker crashed)")
        try:
            problems = check_case(case, onnxruntime=onnxruntime)
        except Exception as e:  # noqa: BLE001 - the reference or the generator failed: keep it too
            problems = [f"harness: {type(e).__name__}: {str(e)[:500]}"]
        if problems:
            last_failure[:] = [case, problems]
            raise AssertionError("\n".join(problems))

    try:
        check()
    except AssertionError:
        case, problems = last_failure
        result.problems = problems
        result.saved = save_case(case, os.path.join(out_dir, regression_name(case)), problems)
        result.outcome = "mismatch"
    _remove_running(out_dir, batch)  # kept only when the worker dies mid-graph
    result.seconds = time.perf_counter() - start
    return result


class BatchHandler:
    """Made once in each worker process (conformance.runner.run_pool)."""

    def __init__(self, config: dict):
        self.config = config

    def __call__(self, task) -> BatchResult:
        batch, seed, examples = task
        return run_batch(seed, examples, self.config["out_dir"], batch, self.config["onnxruntime"])


def plan_batches(examples: int, seed: int, jobs: int, batch_size: int = 50) -> list[tuple]:
    size = max(1, min(batch_size, math.ceil(examples / max(1, jobs))))
    batches, left, i = [], examples, 0
    while left > 0:
        n = min(size, left)
        batches.append((i, seed * 1_000_003 + i, n))
        left -= n
        i += 1
    return batches


def lost_batch(task, outcome: str, message: str, seconds: float) -> BatchResult:
    return BatchResult(task[0], problems=[message], seconds=seconds, outcome=outcome)


def campaign(examples: int, seed: int = 0, jobs: int = 1, out_dir: str = "fuzz-regressions",
             onnxruntime: bool = True, on_result=None, timeout_s: float = 1800.0) -> list[BatchResult]:
    """Spread `examples` graphs over `jobs` worker processes (the conformance runner's pool).
    A batch whose worker crashes keeps the graph it was running, saved as a regression."""
    from .runner import run_pool

    batches = plan_batches(examples, seed, jobs)
    config = {"out_dir": os.path.abspath(out_dir), "onnxruntime": onnxruntime}
    results = run_pool(batches, BatchHandler, config, lost_batch, jobs, timeout_s, on_result)
    for r in results:
        running = os.path.join(config["out_dir"], ".running", f"batch{r.batch}")
        if r.outcome in ("crash", "timeout") and os.path.isdir(running):
            case, _ = load_case(running)
            r.saved = save_case(case, os.path.join(config["out_dir"], regression_name(case)),
                                r.problems, f"the batch ended in a {r.outcome} on this graph")
    _remove_running(config["out_dir"])
    return results


def _remove_running(out_dir: str, batch: int | None = None) -> None:
    """A batch removes its own in-progress folder; the campaign, at the end, the parent
    (a worker must not remove it while another writes into it)."""
    import shutil

    running = os.path.join(out_dir, ".running")
    if batch is None:
        shutil.rmtree(running, ignore_errors=True)
        return
    shutil.rmtree(os.path.join(running, f"batch{batch}"), ignore_errors=True)
