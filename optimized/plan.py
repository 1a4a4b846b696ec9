"""The static execution plan: every node bound to its kernel once, values held in numbered
slots, and each slot released after its last use, so a run is a loop of function calls."""
from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from onnx import AttributeProto, ModelProto, helper

from reference.errors import NodeError
from reference.evaluator import ReferenceEvaluator, Result, Scope, _GraphRunner
from reference.functions import schema_for
from reference.registry import OpContext, canonical_domain, lookup
from reference.values import normalize

from . import chains

ABSENT = -1


@dataclass
class Step:
    node: Any  # NodeProto
    run: Callable[..., list]  # inputs -> outputs
    inputs: list[int]  # slot per input, ABSENT for an omitted optional input
    outputs: list[int]  # slot per output, ABSENT for an omitted optional output
    release: list[int] = field(default_factory=list)  # slots whose last use is this step
    kernel: str = "reference"  # "fast" when a C/NumPy kernel of optimized/ runs it
    reference: Callable[..., list] | None = None  # the reference op, for check mode


class SlotScope(Scope):
    """A Scope over the plan's slots, so subgraph ops see the values of the enclosing graph."""

    def __init__(self, slots: list, index: dict[str, int]):
        super().__init__(None)
        self._slots, self._index = slots, index

    def __contains__(self, name: str) -> bool:
        return name in self.values or (name in self._index and self._slots[self._index[name]] is not None)

    def __getitem__(self, name: str):
        if name in self.values:
            return self.values[name]
        value = self._slots[self._index[name]] if name in self._index else None
        if value is None:
            raise KeyError(name)
        return value


class Plan:
    def __init__(self, model: ModelProto, kernels: dict, evaluator: ReferenceEvaluator | None = None,
                 fuse_chains: bool = False):
        self.evaluator = evaluator or ReferenceEvaluator(model, check=False)
        self.graph = model.graph
        self.opsets = self.evaluator.opsets
        self._runner = _GraphRunner(self.evaluator, lambda result: None)
        names: list[str] = []
        self.index: dict[str, int] = {}

        def slot(name: str) -> int:
            if not name:
                return ABSENT
            if name not in self.index:
                self.index[name] = len(names)
                names.append(name)
            return self.index[name]

        self.template: list = []
        for name, value in self.evaluator.initial_values().items():
            slot(name)
        for info in self.graph.input:
            slot(info.name)
        steps = [self._bind(node, kernels, slot) for node in self.graph.node]
        self.output_slots = [slot(o.name) for o in self.graph.output]
        self.names = names
        self.template = [None] * len(names)
        for name, value in self.evaluator.initial_values().items():
            self.template[self.index[name]] = value
        # node by node, for check mode and iter_results, which need every intermediate value
        self.unfused_steps = self._with_releases(steps)
        self.steps = self.unfused_steps
        if fuse_chains:
            self.steps = self._with_releases(self._fuse_chains(steps))

    # binding --------------------------------------------------------------------------
    def _bind(self, node, kernels: dict, slot) -> Step:
        inputs = [slot(n) for n in node.input]
        outputs = [slot(n) for n in node.output]
        reference = self._reference_call(node)
        fast = kernels.get((canonical_domain(node.domain), node.op_type))
        if fast is None:
            return Step(node, reference, inputs, outputs)
        attrs = self._static_attributes(node)
        if attrs is None:
            return Step(node, reference, inputs, outputs)
        if "ctx" in inspect.signature(fast).parameters:
            opset = self.opsets.get(canonical_domain(node.domain), 0)
            attrs = {**attrs, "ctx": OpContext(opset, node, list(node.output), self.evaluator)}

        def run_fast(*values, _fast=fast, _attrs=attrs, _reference=reference):
            result = _fast(*values, **_attrs)
            if result is NotImplemented:
                return _reference(*values)
            return list(result) if isinstance(result, tuple) else [result]

        return Step(node, run_fast, inputs, outputs, kernel="fast", reference=reference)

    def _static_attributes(self, node) -> dict | None:
        """Attributes with schema defaults, converted once; None if the node has subgraphs."""
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute):
            return None
        domain = canonical_domain(node.domain)
        schema = schema_for(node.op_type, self.opsets.get(domain, 0), domain)
        return self._runner.attributes(node, Scope(), (), None, schema)

    def _reference_call(self, node):
        domain = canonical_domain(node.domain)
        opset = self.opsets.get(domain)
        impl = lookup(domain, node.op_type, opset) if opset is not None else None
        attrs = self._static_attributes(node)
        plain = (impl is not None and attrs is not None
                 and (node.domain, node.op_type) not in self.evaluator.functions)
        if plain:
            if impl.wants_ctx:
                attrs = {**attrs, "ctx": OpContext(opset, node, list(node.output), self.evaluator)}

            def run_op(*values, _fn=impl.fn, _attrs=attrs):
                result = _fn(*_trim(values), **_attrs)
                return [normalize(v) for v in (result if isinstance(result, tuple) else (result,))]

            return run_op
        return None  # bound per run: needs the run's scope (subgraphs, function bodies)

    def _reads(self, step: Step) -> list[int]:
        used = [s for s in step.inputs if s != ABSENT]
        return used + [self.index[n] for n in outer_names(step.node) if n in self.index]

    def _with_releases(self, steps: list[Step]) -> list[Step]:
        """Copies of the steps, each releasing the slots whose last use it is."""
        steps = [replace(step, release=[]) for step in steps]
        keep = set(self.output_slots)
        last_use: dict[int, int] = {}
        for i, step in enumerate(steps):
            for s in self._reads(step):
                last_use[s] = i
        for s, i in last_use.items():
            if s not in keep:
                steps[i].release.append(s)
        return steps

    def _fuse_chains(self, steps: list[Step]) -> list[Step]:
        """Each elementwise chain (optimized/chains.py) as one step, at its last member's place."""
        encodings = [chains.chain_op(step.node, self._static_attributes(step.node) or {})
                     if step.kernel == "fast" else None for step in steps]
        readers: dict[int, int] = {}
        for step in steps:
            for s in self._reads(step):
                readers[s] = readers.get(s, 0) + 1
        found = chains.find_chains(steps, encodings, set(self.output_slots), readers)
        fused_at = {id(links[-1].step): links for links in found}
        members = {id(link.step) for links in found for link in links}
        result = []
        for step in steps:
            if id(step) in fused_at:
                result.append(self._chain_step(chains.FusedChain(fused_at[id(step)])))
            elif id(step) not in members:
                result.append(step)
        return result

    def _chain_step(self, chain) -> Step:
        inputs, output = chain.inputs(), chain.links[-1].step.outputs
        node = helper.make_node("ElementwiseChain", [self.names[s] for s in inputs],
                                [self.names[s] for s in output], name=" > ".join(chain.names),
                                domain="onnx_parity.plan")
        return Step(node, chain, inputs, list(output), kernel="fast")

    # running --------------------------------------------------------------------------
    def run(self, feeds: dict, observer=None, profiler=None, checker=None) -> list:
        slots = list(self.template)
        for name, value in feeds.items():
            slots[self.index[name]] = normalize(value)
        steps = self.steps if observer is None and checker is None else self.unfused_steps
        for step in steps:
            values = [slots[s] if s != ABSENT else None for s in step.inputs]
            start = time.perf_counter() if profiler is not None else 0.0
            try:
                run = step.run or self._scoped_call(step, slots, observer)
                outputs = run(*values)
            except NodeError:
                raise
            except Exception as e:
                raise NodeError(step.node, self.opsets.get(canonical_domain(step.node.domain)),
                                f"{type(e).__name__}: {e}") from e
            if profiler is not None:
                profiler.record(step, values, start, time.perf_counter())
            if checker is not None and step.reference is not None:
                checker(step, values, outputs)
            for s, value in zip(step.outputs, outputs):
                if s != ABSENT:
                    slots[s] = value
                    if observer is not None:
                        observer(Result("result", self.names[s], value, node=step.node))
            for s in step.release:
                slots[s] = None
        return [slots[s] for s in self.output_slots]

    def _scoped_call(self, step: Step, slots: list, observer=None):
        scope = SlotScope(slots, self.index)
        runner = self._runner if observer is None else _GraphRunner(self.evaluator, observer)

        def run(*values):
            return runner.call_op(step.node, list(_trim(values)), scope, self.opsets, (), None)

        return run


def outer_names(node) -> set[str]:
    """Names a node's subgraphs read from enclosing scopes (implicit inputs)."""
    names: set[str] = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            local = {i.name for i in g.input} | {i.name for i in g.initializer}
            for inner in g.node:
                names |= {n for n in inner.input if n and n not in local}
                names |= outer_names(inner) - local
                local |= set(inner.output)
    return names


def _trim(values):
    values = list(values)
    while values and values[-1] is None:
        values.pop()
    return values


class Profiler:
    """Chrome-trace events, one per node run: op type, input shapes and duration."""

    def __init__(self):
        self.events: list[dict] = []
        self.origin = time.perf_counter()

    def record(self, step: Step, values, start: float, end: float) -> None:
        self.events.append({
            "name": step.node.name or step.node.op_type, "cat": "Node", "ph": "X", "pid": 1,
            "tid": 1, "ts": (start - self.origin) * 1e6, "dur": (end - start) * 1e6,
            "args": {"op_name": step.node.op_type, "kernel": step.kernel,
                     "input_type_shape": [_shape(v) for v in values]},
        })


def _shape(value):
    if isinstance(value, np.ndarray):
        return {str(value.dtype): list(value.shape)}
    return type(value).__name__
