"""The reference evaluator: runs an ONNX model node by node with the ops in reference/ops."""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, helper, numpy_helper

from . import ops as _ops  # noqa: F401  (registers every op family)
from .errors import InvalidFeedError, InvalidModelError, NodeError, UnsupportedOpError
from .functions import function_body_from_schema, schema_for
from .loading import check_graph_structure, check_ops_implemented, load_model
from .registry import OpContext, canonical_domain, lookup
from .types import check_feed, value_type_proto
from .values import normalize
from .weights import tensor_array


@dataclass
class Result:
    """One value as it is produced: kind is initializer, input, result or output."""

    kind: str
    name: str
    value: Any
    node: Any = None  # NodeProto for kind == "result"
    path: tuple = ()  # where a subgraph value comes from, e.g. ("loop_1/body", "iter 2")


def tensor_value(tensor) -> np.ndarray:
    return normalize(tensor_array(tensor))  # a stub's array comes from its weight store


def sparse_value(sparse) -> np.ndarray:
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dense = np.zeros(tuple(sparse.dims), dtype=values.dtype)
    if indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return dense


class Scope:
    """Names visible to a graph: its own values, then the enclosing graph's."""

    def __init__(self, parent: Scope | None = None):
        self.values: dict[str, Any] = {}
        self.parent = parent

    def __contains__(self, name: str) -> bool:
        return name in self.values or (self.parent is not None and name in self.parent)

    def __getitem__(self, name: str):
        if name in self.values:
            return self.values[name]
        if self.parent is not None:
            return self.parent[name]
        raise KeyError(name)

    def __setitem__(self, name: str, value) -> None:
        self.values[name] = value


class Subgraph:
    """A graph attribute, bound to the scope it is defined in; call it with the body inputs."""

    def __init__(self, graph: GraphProto, runner: GraphRunner, scope: Scope, path: tuple):
        self.graph = graph
        self._runner = runner
        self._scope = scope
        self._path = path

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.graph.input]

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.graph.output]

    def __call__(self, *inputs, tag: str | None = None) -> list:
        path = self._path + ((tag,) if tag is not None else ())
        return self._runner.run_subgraph(self.graph, self._scope, list(inputs), path)


class GraphRunner:
    """Runs graphs and function bodies, sending every produced value to `emit`."""

    def __init__(self, evaluator: ReferenceEvaluator, emit):
        self.ev = evaluator
        self.emit = emit

    # graphs ---------------------------------------------------------------------------
    def run_subgraph(self, graph: GraphProto, parent: Scope, inputs: list, path: tuple):
        scope = Scope(parent)
        if len(inputs) > len(graph.input):
            raise ValueError(
                f"subgraph {graph.name!r} takes {len(graph.input)} inputs, got {len(inputs)}"
            )
        for vi, value in zip(graph.input, inputs):
            scope[vi.name] = value
            self.emit(Result("input", vi.name, value, path=path))
        self.run_body(graph, scope, self.ev.opsets, path)
        outs = [scope[o.name] for o in graph.output]
        for o, value in zip(graph.output, outs):
            self.emit(Result("output", o.name, value, path=path))
        return outs

    def run_body(self, graph, scope: Scope, opsets: dict, path: tuple, fn_attrs=None):
        for init in graph.initializer:
            value = tensor_value(init)
            scope[init.name] = value
            self.emit(Result("initializer", init.name, value, path=path))
        for init in graph.sparse_initializer:
            value = sparse_value(init)
            scope[init.values.name] = value
            self.emit(Result("initializer", init.values.name, value, path=path))
        for node in graph.node:
            self.run_node(node, scope, opsets, path, fn_attrs)

    # nodes ----------------------------------------------------------------------------
    def run_node(self, node, scope: Scope, opsets: dict, path: tuple, fn_attrs=None):
        inputs = []
        for name in node.input:
            if not name:
                inputs.append(None)
            elif name in scope:
                inputs.append(scope[name])
            else:
                raise NodeError(node, self._version(node, opsets), f"input {name!r} is not defined")
        while inputs and inputs[-1] is None:
            inputs.pop()
        try:
            outputs = self.call_op(node, inputs, scope, opsets, path, fn_attrs)
        except (NodeError, UnsupportedOpError):
            raise
        except Exception as e:
            raise NodeError(node, self._version(node, opsets), f"{type(e).__name__}: {e}") from e
        for name, value in zip(node.output, outputs):
            if name:
                scope[name] = value
                self.emit(Result("result", name, value, node=node, path=path))

    @staticmethod
    def _version(node, opsets) -> int | None:
        return opsets.get(canonical_domain(node.domain))

    def call_op(self, node, inputs, scope, opsets, path, fn_attrs) -> list:
        domain = canonical_domain(node.domain)
        opset = opsets.get(domain)
        function = self.ev.functions.get((node.domain, node.op_type))
        if function is not None:
            attrs = self.attributes(node, scope, path, fn_attrs, schema=None)
            return self.run_function(function, inputs, attrs, path + (node.name or node.op_type,))
        if opset is None:
            raise UnsupportedOpError(
                f"node {node.name!r} uses domain {node.domain!r}, which the model does not import"
            )
        impl = lookup(domain, node.op_type, opset)
        schema = schema_for(node.op_type, opset, domain)
        if impl is None:
            body = function_body_from_schema(schema, node, inputs, opset) if schema else None
            if body is None:
                raise UnsupportedOpError(
                    f"no implementation of {domain or 'ai.onnx'}::{node.op_type} "
                    f"for opset {opset} (node {node.name!r})"
                )
            attrs = self.attributes(node, scope, path, fn_attrs, schema)
            return self.run_function(body, inputs, attrs, path + (node.name or node.op_type,))
        attrs = self.static_attributes(node, scope, path, fn_attrs, schema)
        kernel = self.ev.kernels.get((domain, node.op_type))
        if kernel is not None:
            result = kernel(*inputs, **attrs)
            if result is not NotImplemented:
                outputs = list(result) if isinstance(result, tuple) else [result]
                return [normalize(v) for v in outputs]
        if impl.wants_ctx:
            attrs["ctx"] = OpContext(opset, node, list(node.output), self.ev)
        result = impl.fn(*inputs, **attrs)
        outputs = list(result) if isinstance(result, tuple) else [result]
        return [normalize(v) for v in outputs]

    def run_function(self, function, inputs, attrs, path) -> list:
        scope = Scope()
        for name, value in zip(function.input, inputs):
            if name:
                scope[name] = value
        opsets = {canonical_domain(o.domain): o.version for o in function.opset_import}
        defaults = {a.name: helper.get_attribute_value(a) for a in function.attribute_proto}
        for a in function.attribute_proto:
            if a.type == AttributeProto.GRAPH:
                defaults[a.name] = Subgraph(a.g, self, Scope(), path)
        fn_attrs = {**defaults, **attrs}
        for node in function.node:
            self.run_node(node, scope, opsets, path, fn_attrs)
        return [scope[o] if o in scope else None for o in function.output]  # noqa: SIM401 - a Scope, no get()

    # attributes -----------------------------------------------------------------------
    def static_attributes(self, node, scope, path, fn_attrs, schema) -> dict:
        """attributes(), converted once per node when they cannot change between runs (no
        subgraph, no reference to a function's attribute); tensors come back read-only."""
        if fn_attrs is not None or any(
            a.ref_attr_name or a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS)
            for a in node.attribute
        ):
            return self.attributes(node, scope, path, fn_attrs, schema)
        cached = self.ev._attribute_cache.get(id(node))
        if cached is None or cached[0] is not node:
            attrs = self.attributes(node, scope, path, fn_attrs, schema)
            for value in attrs.values():
                if isinstance(value, np.ndarray):
                    value.setflags(write=False)
            cached = self.ev._attribute_cache[id(node)] = (node, attrs)
        return dict(cached[1])

    def attributes(self, node, scope, path, fn_attrs, schema) -> dict:
        attrs = {}
        for a in node.attribute:
            if a.ref_attr_name:
                if fn_attrs is not None and a.ref_attr_name in fn_attrs:
                    attrs[a.name] = fn_attrs[a.ref_attr_name]
                continue
            attrs[a.name] = self.attribute_value(a, scope, path + (node.name or node.op_type,))
        if schema is not None:
            for name, spec in schema.attributes.items():
                if name not in attrs and spec.default_value.type != AttributeProto.UNDEFINED:
                    attrs[name] = self.attribute_value(
                        spec.default_value, scope, path + (node.name or node.op_type,))
        return attrs

    def attribute_value(self, a, scope, path):
        if a.type == AttributeProto.GRAPH:
            return Subgraph(a.g, self, scope, path + (a.name,))
        if a.type == AttributeProto.GRAPHS:
            return [Subgraph(g, self, scope, path + (a.name,)) for g in a.graphs]
        if a.type == AttributeProto.TENSOR:
            return tensor_value(a.t)
        if a.type == AttributeProto.TENSORS:
            return [tensor_value(t) for t in a.tensors]
        if a.type == AttributeProto.SPARSE_TENSOR:
            return sparse_value(a.sparse_tensor)
        if a.type == AttributeProto.SPARSE_TENSORS:
            return [sparse_value(t) for t in a.sparse_tensors]
        value = plain_attribute_value(a)
        return helper.get_attribute_value(a) if value is NOT_PLAIN else value


NOT_PLAIN = object()  # plain_attribute_value's answer for any other attribute type


def plain_attribute_value(a: AttributeProto):
    """The value of an attribute of a plain type (int, float, string and their lists) as
    operators receive it; NOT_PLAIN for the other types (graphs, tensors, sparse tensors)."""
    kind = a.type
    if kind == AttributeProto.INT:
        return a.i
    if kind == AttributeProto.FLOAT:
        return a.f
    if kind == AttributeProto.INTS:
        return [int(i) for i in a.ints]
    if kind == AttributeProto.FLOATS:
        return [float(f) for f in a.floats]
    if kind == AttributeProto.STRING:
        return a.s.decode("utf-8", errors="surrogateescape")
    if kind == AttributeProto.STRINGS:
        return [s.decode("utf-8", errors="surrogateescape") for s in a.strings]
    return NOT_PLAIN


_UNKNOWN_OP = re.compile(
    r"(?:No Op registered for (\w+) with domain_version of (\d+)"
    r"|Op registered for (\w+) is deprecated in domain_version of (\d+))"
)


def _as_onnxruntime_accepts(model: ModelProto) -> ModelProto:
    """onnxruntime loads two forms that onnx's checker refuses, and so do we: an IR-3 model whose
    initializers are not listed as graph inputs, and a graph input or output declared without a
    shape (unknown rank). The checker sees a copy with those initializers listed as inputs and
    those shapes present; anything else it refuses is still refused."""
    graph = model.graph
    listed = {i.name for i in graph.input}
    unlisted = [t for t in graph.initializer if t.name not in listed] if model.ir_version < 4 else []
    unshaped = [i for i, v in enumerate(list(graph.input) + list(graph.output))
                if v.type.WhichOneof("value") == "tensor_type" and not v.type.tensor_type.HasField("shape")]
    if not unlisted and not unshaped:
        return model
    relaxed = ModelProto()
    relaxed.CopyFrom(model)
    for t in unlisted:
        relaxed.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    values = list(relaxed.graph.input) + list(relaxed.graph.output)
    for i in unshaped:
        values[i].type.tensor_type.shape.SetInParent()
    return relaxed


def validate(model: ModelProto) -> None:
    """onnx's checker, except that an op which the installed onnx no longer defines at that
    version (deprecated, or experimental in an old release) is accepted when we implement it.
    When it refuses the model, the graph's structure is checked first (reference/loading.py
    names cycles and undefined values; a graph it passes has every value defined once and
    before its readers, which is all that walk checks); after it, every op must have an
    implementation, as onnxruntime checks at load."""
    try:
        onnx.checker.check_model(_as_onnxruntime_accepts(model))
    except Exception as e:
        check_graph_structure(model.graph)
        m = _UNKNOWN_OP.search(str(e))
        if m:
            op_type = m.group(1) or m.group(3)
            version = int(m.group(2) or m.group(4))
            domains = {n.domain for n in model.graph.node if n.op_type == op_type}
            if domains and all(lookup(d, op_type, version) for d in domains):
                check_ops_implemented(model)
                return
        raise InvalidModelError(f"invalid model: {e}") from e
    check_ops_implemented(model)


class ReferenceEvaluator:
    """Evaluate an ONNX model with pure-NumPy reference ops.

    >>> ev = ReferenceEvaluator("model.onnx")
    >>> outs = ev.run(None, {"x": x})
    """

    def __init__(self, model, *, check: bool = True, kernels: dict | None = None, seed: int = 0):
        """`kernels` maps (domain, op_type) to a faster function with the op's calling
        convention; it may return NotImplemented to leave a node to the reference op.
        Random ops without a `seed` attribute draw from a generator seeded with `seed`, so
        a run is repeatable."""
        self.model = load_model(model)
        self.kernels = kernels or {}
        self.rng = np.random.default_rng(seed)
        self._initial = None
        self._attribute_cache: dict[int, tuple] = {}
        if check:
            validate(self.model)
        self.graph = self.model.graph
        self.opsets = {canonical_domain(o.domain): o.version for o in self.model.opset_import}
        if "" not in self.opsets and self.model.ir_version < 3:
            self.opsets[""] = 1
        self.functions = {(f.domain, f.name): f for f in self.model.functions}
        initializer_names = {i.name for i in self.graph.initializer}
        initializer_names |= {i.values.name for i in self.graph.sparse_initializer}
        # Before IR 4, initializers are also listed as inputs; those are optional feeds.
        self.input_infos = [i for i in self.graph.input if i.name not in initializer_names]
        self.overridable = [i for i in self.graph.input if i.name in initializer_names]

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.input_infos]

    def initial_values(self) -> dict:
        """The main graph's initializers by name, sparse ones densified (converted once)."""
        if self._initial is None:
            self._initial = {i.name: tensor_value(i) for i in self.graph.initializer}
            self._initial.update(
                {i.values.name: sparse_value(i) for i in self.graph.sparse_initializer})
            for value in self._initial.values():
                value.setflags(write=False)  # shared by every run: an op must not write to it
        return self._initial

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.graph.output]

    def check_feeds(self, feeds: dict) -> None:
        known = {i.name: i for i in self.input_infos + self.overridable}
        for name in feeds:
            if name not in known:
                raise InvalidFeedError(
                    f"unknown input {name!r}; the model's inputs are {self.input_names}"
                )
        for info in self.input_infos:
            if info.name not in feeds:
                raise InvalidFeedError(f"missing input {info.name!r}")
        for name, value in feeds.items():
            check_feed(known[name], normalize(value))

    def iter_results(self, feeds: dict) -> Iterator[Result]:
        """Every initializer, input, node result and graph output, in the order produced."""
        self.check_feeds(feeds)
        produced: list[Result] = []
        runner = GraphRunner(self, produced.append)
        scope = Scope()
        for name, value in feeds.items():
            scope[name] = normalize(value)
        for name, value in self.initial_values().items():
            if name not in feeds:
                scope[name] = value
                yield Result("initializer", name, value)
        for info in self.graph.input:
            if info.name in feeds:
                yield Result("input", info.name, scope[info.name])
        for node in self.graph.node:
            runner.run_node(node, scope, self.opsets, ())
            yield from produced
            produced.clear()
        for out in self.graph.output:
            if out.name not in scope:
                raise InvalidModelError(f"graph output {out.name!r} is never produced")
            yield Result("output", out.name, scope[out.name])

    def run(self, output_names, feeds: dict) -> list:
        """Outputs in graph-output order, or in the order of `output_names` if given."""
        wanted = list(output_names) if output_names else self.output_names
        for name in wanted:
            if name not in self.output_names:
                raise InvalidFeedError(
                    f"unknown output {name!r}; the model's outputs are {self.output_names}"
                )
        outputs = {
            r.name: r.value for r in self.iter_results(feeds) if r.kind == "output" and not r.path
        }
        return [outputs[name] for name in wanted]


def value_type(value):
    """TypeProto describing a runtime value (used for context-dependent function bodies)."""
    return value_type_proto(value)
