"""Elementwise fusion: maximal trees of elementwise nodes become one kernel each.

A group is a tree: its root's output leaves the group, and every other member's single output
is read exactly once, by another member (not by a graph output or a subgraph). Elementwise ops
commute with broadcasting, so evaluating the tree on the broadcast inputs equals evaluating it
node by node.

Each group is written once as an expression in a small language that is at the same time a C
expression and a Python expression: names a0.. for the inputs, + - * / and parentheses, calls
of op_* helpers and F(literal) for typed constants. The CUDA kernel compiles it with C helpers
(CUDA_PREAMBLE); `evaluate` runs the very same string with numpy/cupy helpers, so the CPU tests
check the generated expression itself against the reference evaluator.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from reference.weights import tensor_array

from ..fusion_groups import GroupGraph, trees

FUSED_DOMAIN = "onnx_parity.cuda"
FUSED_OP = "FusedElementwise"
FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))

# op type -> (arity, template over the operand expressions)
TEMPLATES = {
    "Add": (2, "({0} + {1})"), "Sub": (2, "({0} - {1})"), "Mul": (2, "({0} * {1})"),
    "Div": (2, "({0} / {1})"), "Pow": (2, "op_pow({0}, {1})"),
    "Max": (2, "op_max({0}, {1})"), "Min": (2, "op_min({0}, {1})"),
    "Neg": (1, "(-{0})"), "Abs": (1, "op_abs({0})"), "Exp": (1, "op_exp({0})"),
    "Log": (1, "op_log({0})"), "Sqrt": (1, "op_sqrt({0})"), "Reciprocal": (1, "(F(1.0) / {0})"),
    "Relu": (1, "op_relu({0})"), "Sigmoid": (1, "op_sigmoid({0})"), "Tanh": (1, "op_tanh({0})"),
    "Erf": (1, "op_erf({0})"), "Floor": (1, "op_floor({0})"), "Ceil": (1, "op_ceil({0})"),
    "Sin": (1, "op_sin({0})"), "Cos": (1, "op_cos({0})"),
    "LeakyRelu": (1, "op_leaky({0}, F({alpha}))"),
}

CUDA_PREAMBLE = r"""
#define F(v) ((ctype)(v))
#define op_pow pow
#define op_abs fabs
#define op_exp exp
#define op_log log
#define op_sqrt sqrt
#define op_tanh tanh
#define op_erf erf
#define op_floor floor
#define op_ceil ceil
#define op_sin sin
#define op_cos cos
template <typename T> __device__ __forceinline__ T op_relu(T x) { return x < T(0) ? T(0) : x; }
template <typename T> __device__ __forceinline__ T op_sigmoid(T x) { return T(1) / (T(1) + exp(-x)); }
template <typename T> __device__ __forceinline__ T op_leaky(T x, T a) { return x >= T(0) ? x : a * x; }
template <typename T> __device__ __forceinline__ T op_max(T a, T b) { return (a != a || a > b) ? a : b; }
template <typename T> __device__ __forceinline__ T op_min(T a, T b) { return (a != a || a < b) ? a : b; }
"""

_C_TYPES = {"float16": "float16", "float32": "float", "float64": "double"}


def compute_dtype(dtype) -> np.dtype:
    """float16 is computed in float32, as the CUDA kernel does."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def fusible(node) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type not in TEMPLATES:
        return False
    arity = TEMPLATES[node.op_type][0]
    return len(node.input) == arity and all(node.input) and len(node.output) == 1


@dataclass
class FusionGroup:
    nodes: list  # the member NodeProtos in topological order; the last is the root
    inputs: list[str]  # a0, a1, ... in order
    expression: str
    output: str
    constants: dict[str, np.ndarray] = field(default_factory=dict)  # inlined scalars

    @property
    def dtype_of_constants(self):
        dtypes = {c.dtype for c in self.constants.values()}
        return dtypes.pop() if len(dtypes) == 1 else None

    def accepts(self, dtypes) -> bool:
        """The fused kernel computes one float dtype; anything else runs node by node."""
        kinds = set(dtypes) | {c.dtype for c in self.constants.values()}
        return len(kinds) == 1 and kinds.pop() in FLOAT_DTYPES

    def evaluate(self, xp, *arrays):
        """The expression run with `xp` (numpy or cupy): the CPU image of the CUDA kernel."""
        dtype = np.dtype(arrays[0].dtype) if arrays else self.dtype_of_constants
        ctype = compute_dtype(dtype)
        names = {f"a{i}": a.astype(ctype, copy=False) for i, a in enumerate(arrays)}
        result = eval(self._code, xp_helpers(xp, ctype), names)
        shape = np.broadcast_shapes(*(a.shape for a in arrays), *(c.shape for c in self.constants.values()))
        return xp.broadcast_to(xp.asarray(result, dtype=ctype), shape).astype(dtype)

    @property
    def _code(self):
        return compile(self.expression, f"<fused {self.output}>", "eval")

    def cuda_source(self, dtype) -> dict:
        """ElementwiseKernel arguments for one dtype (no CuPy needed to build them)."""
        dtype = np.dtype(dtype)
        io = _C_TYPES[dtype.name]
        ctype = _C_TYPES[compute_dtype(dtype).name]
        loads = "".join(f"const ctype a{i} = (ctype)in{i}; " for i in range(len(self.inputs)))
        return {
            "in_params": ", ".join(f"{dtype.name} in{i}" for i in range(len(self.inputs))),
            "out_params": f"{dtype.name} out0",
            "operation": f"typedef {ctype} ctype; {loads}out0 = ({io})({self.expression});",
            "name": f"fused_{_identifier(self.output)}",
            "preamble": CUDA_PREAMBLE,
        }


def _identifier(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)[:48] or "out"


def xp_helpers(xp, ctype) -> dict:
    from .arrays import erf

    ctype = np.dtype(ctype).type
    return {
        "__builtins__": {},
        "F": ctype,
        "op_pow": xp.power, "op_max": xp.maximum, "op_min": xp.minimum, "op_abs": xp.abs,
        "op_exp": xp.exp, "op_log": xp.log, "op_sqrt": xp.sqrt, "op_tanh": xp.tanh,
        "op_erf": lambda x: erf(xp, x), "op_floor": xp.floor, "op_ceil": xp.ceil,
        "op_sin": xp.sin, "op_cos": xp.cos,
        "op_relu": lambda x: xp.where(x < 0, ctype(0), x),
        "op_sigmoid": lambda x: ctype(1) / (ctype(1) + xp.exp(-x)),
        "op_leaky": lambda x, a: xp.where(x >= 0, x, a * x),
    }


# finding the groups -----------------------------------------------------------------------
def find_groups(nodes, eligible, graph_outputs, initializers: dict, readers: Counter | None = None,
                min_size: int = 2) -> list[FusionGroup]:
    """Maximal fusion groups among `nodes` (topological order) for which `eligible(i)` holds:
    the trees fusion_groups finds, each written as one expression.

    `readers` counts every read of a value (node inputs, subgraph reads); built from `nodes`
    when not given. `initializers` maps names to arrays: 0-d float ones are inlined.
    """
    if readers is None:
        readers = Counter(n for node in nodes for n in node.input if n)
    graph = GroupGraph(inputs=[[n for n in node.input if n] for node in nodes],
                       outputs=[node.output[0] if len(node.output) == 1 else None for node in nodes],
                       eligible=[eligible(i) and fusible(node) for i, node in enumerate(nodes)],
                       readers=readers, keep=set(graph_outputs))
    return [_build(members, nodes, initializers) for members in trees(graph, min_size)]


def _build(members: list[int], nodes, initializers: dict) -> FusionGroup:
    inside = {nodes[i].output[0]: nodes[i] for i in members}
    root = nodes[members[-1]]
    inputs: list[str] = []
    constants: dict[str, np.ndarray] = {}

    def operand(name: str) -> str:
        if name in inside:
            return expression(inside[name])
        value = initializers.get(name)
        if _inlinable(value):
            constants[name] = value
            return f"F({float(value)!r})"
        if name not in inputs:
            inputs.append(name)
        return f"a{inputs.index(name)}"

    def expression(node) -> str:
        template = TEMPLATES[node.op_type][1]
        attrs = {a.name: a.f for a in node.attribute}
        alpha = attrs.get("alpha", 0.01)
        return template.format(*(operand(n) for n in node.input), alpha=repr(float(alpha)))

    text = expression(root)
    return FusionGroup([nodes[i] for i in members], inputs, text, root.output[0], constants)


def _inlinable(value) -> bool:
    return (isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype in FLOAT_DTYPES
            and math.isfinite(float(value)))


def initializer_arrays(graph) -> dict[str, np.ndarray]:
    return {t.name: tensor_array(t) for t in graph.initializer}
