"""The static execution plan: every node bound to its kernel once, values held in numbered
slots, and each slot released after its last use, so a run is a loop of function calls.

With c_steps (the CPU provider's cpu.C_STEPS), the second run of an input signature (feed
names, shapes, dtypes) is recorded and compiled (CompiledRun): from then on consecutive fast
steps run in one C call over a step table (csrc/plan.c) with their buffers in one arena, and
control comes back to Python only for the steps that have no description there.  Signatures
that differ only in dimensions like a KV cache's length share one (optimized/plan_shapes.py)."""
from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
from onnx import AttributeProto, ModelProto, helper

from reference.errors import NodeError
from reference.evaluator import (
    NOT_PLAIN,
    GraphRunner,
    ReferenceEvaluator,
    Result,
    Scope,
    plain_attribute_value,
)
from reference.functions import schema_for
from reference.registry import OpContext, canonical_domain, lookup
from reference.values import normalize

from . import chains, kernels, onednn_region
from .huge_page_memory import huge_page_buffer
from .output_memory import OutputMemory

log = logging.getLogger(__name__)

ABSENT = -1
ALIAS = "alias"  # a step description (optimized/cpu.py C_STEPS): the output views the input
NOT_COMPILED = object()  # a signature the plan has not compiled (None: could not)
PROGRAMS = 8  # input signatures whose runs a plan keeps compiled (least recently used go)
SIGHTINGS = 64  # signatures seen once, remembered until one comes back
FOLDED_BYTES = 1 << 16  # the largest value worked out once per signature and kept
# ops whose result is not a function of their inputs, never worked out once for all runs
RANDOM_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
              "Multinomial", "Bernoulli", "Dropout"}
SHAPE_OPS = {"Shape", "Size"}


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
                 fuse_chains: bool = False, c_steps: dict | None = None):
        # c_steps: (domain, op_type) -> step description (optimized/cpu.py C_STEPS); with it, a
        # signature's runs after its second go through a compiled step table (CompiledRun)
        self.c_steps = c_steps
        self._programs: OrderedDict = OrderedDict()
        self._sightings: dict = {}
        self._lock = threading.Lock()
        self.evaluator = evaluator or ReferenceEvaluator(model, check=False)
        self.graph = model.graph
        self.opsets = self.evaluator.opsets
        self._runner = GraphRunner(self.evaluator, lambda result: None)
        self._attributes: dict[int, tuple] = {}  # id(node) -> (node, static_attributes)
        self._outer: dict[int, tuple] = {}  # id(node) -> (node, _outer_slots)
        names: list[str] = []
        index: dict[str, int] = {}
        self.index = index

        def slot(name: str) -> int:
            if not name:
                return ABSENT
            found = index.get(name)
            if found is None:
                found = index[name] = len(names)
                names.append(name)
            return found

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
        self._bound = steps
        if fuse_chains:
            grouped = onednn_region.group_steps(self, steps) if c_steps is not None else steps
            self.steps = self._with_releases(self._fuse_chains(grouped))
        else:
            self.steps = self.unfused_steps
        if c_steps is not None:  # programs shared by signatures differing in a cache's length
            from .plan_shapes import ShapePatterns
            self.shapes = ShapePatterns(self)

    @functools.cached_property
    def unfused_steps(self) -> list[Step]:
        """Node by node, for check mode and iter_results, which need every intermediate value
        (a plan that fuses makes them at the first such run, not at creation)."""
        return self._with_releases(self._bound)

    def close(self) -> None:
        """Forget the compiled runs and shape patterns, which refer back to the plan, so that a
        session letting its plan go frees it (weights included) at once instead of at the next
        full garbage collection.  A closed plan still runs, step by step in Python."""
        self.c_steps = None
        self._programs.clear()
        self._sightings.clear()
        self.__dict__.pop("shapes", None)

    # binding --------------------------------------------------------------------------
    def _bind(self, node, kernels: dict, slot) -> Step:
        inputs = [slot(n) for n in node.input]
        outputs = [slot(n) for n in node.output]
        domain = canonical_domain(node.domain)
        attrs = self._shared_attributes(node)
        reference = self._reference_of(node, domain, attrs)
        fast = kernels.get((domain, node.op_type))
        if fast is None:
            return Step(node, reference, inputs, outputs)
        if attrs is None:
            return Step(node, reference, inputs, outputs)
        try:
            takes_context = _takes_context(fast)
        except TypeError:  # an unhashable kernel object
            takes_context = "ctx" in inspect.signature(fast).parameters
        if takes_context:
            opset = self.opsets.get(domain, 0)
            attrs = {**attrs, "ctx": OpContext(opset, node, list(node.output), self.evaluator)}

        def run_fast(*values, _fast=fast, _attrs=attrs, _reference=reference):
            result = _fast(*values, **_attrs)
            if result is NotImplemented:
                return _reference(*values)
            return list(result) if isinstance(result, tuple) else [result]

        return Step(node, run_fast, inputs, outputs, kernel="fast", reference=reference)

    def static_attributes(self, node) -> dict | None:
        """Attributes with schema defaults, converted once per node (a new dict on each call);
        None if the node has subgraphs."""
        attrs = self._shared_attributes(node)
        return None if attrs is None else dict(attrs)

    def _shared_attributes(self, node) -> dict | None:
        """static_attributes' cached dict itself, for readers that never change it (binding
        asks three times a node)."""
        cached = self._attributes.get(id(node))
        if cached is None or cached[0] is not node:
            domain = canonical_domain(node.domain)
            opset = self.opsets.get(domain, 0)
            attrs = _plain_attributes(node, opset, domain)
            if attrs is None and not any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS)
                                         for a in node.attribute):
                schema = schema_for(node.op_type, opset, domain)
                attrs = self._runner.attributes(node, Scope(), (), None, schema)
            cached = self._attributes[id(node)] = (node, attrs)
        return cached[1]

    def _reference_call(self, node):
        return self._reference_of(node, canonical_domain(node.domain), self._shared_attributes(node))

    def _reference_of(self, node, domain: str, attrs: dict | None):
        opset = self.opsets.get(domain)
        impl = lookup(domain, node.op_type, opset) if opset is not None else None
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

    def reads(self, step: Step) -> list[int]:
        used = [s for s in step.inputs if s != ABSENT]
        if not step.node.attribute:  # no subgraph, so no outer names
            return used
        return used + self._outer_slots(step.node)

    def _outer_slots(self, node) -> list[int]:
        """The slots of the names a node's subgraphs read from this graph, once per node."""
        cached = self._outer.get(id(node))
        if cached is None or cached[0] is not node:
            slots = [self.index[n] for n in outer_names(node) if n in self.index]
            cached = self._outer[id(node)] = (node, slots)
        return cached[1]

    def _with_releases(self, steps: list[Step]) -> list[Step]:
        """Copies of the steps, each releasing the slots whose last use it is."""
        steps = [Step(step.node, step.run, step.inputs, step.outputs, [], step.kernel,
                      step.reference) for step in steps]
        keep = set(self.output_slots)
        last_use: dict[int, int] = {}
        for i, step in enumerate(steps):
            for s in self.reads(step):
                last_use[s] = i
        for s, i in last_use.items():
            if s not in keep:
                steps[i].release.append(s)
        return steps

    def _fuse_chains(self, steps: list[Step]) -> list[Step]:
        """Each elementwise chain (optimized/chains.py) as one step, at its last member's place."""
        encodings = [chains.chain_op(step.node, self._shared_attributes(step.node) or {})
                     if step.kernel == "fast" else None for step in steps]
        readers: dict[int, int] = {}
        for step in steps:
            for s in self.reads(step):
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
        """A run: compiled where it can be (a Profiler's run too, timed by the step table),
        else step by step in Python (always with an observer, a checker or another kind of
        profiler hook)."""
        if isinstance(profiler, Profiler):
            return self._profiled_run(feeds, observer, profiler, checker)
        feeds = {name: normalize(value) for name, value in feeds.items()}
        if self.c_steps is not None and observer is None and profiler is None and checker is None:
            outputs = self._run_compiled(feeds)
            if outputs is not None:
                return outputs
        return self._run_in_python(feeds, observer, profiler, checker)

    def _profiled_run(self, feeds: dict, observer, profiler: Profiler, checker) -> list:
        start = time.perf_counter()
        try:
            feeds = {name: normalize(value) for name, value in feeds.items()}
            if self.c_steps is not None and observer is None and checker is None:
                outputs = self._run_compiled(feeds, profiler)
                if outputs is not None:
                    return outputs
            return self._run_in_python(feeds, observer, profiler, checker)
        finally:
            profiler.record_run(start, time.perf_counter())

    def _run_in_python(self, feeds: dict, observer, profiler, checker) -> list:
        slots = self.slots_for(feeds)
        steps = self.steps if observer is None and checker is None else self.unfused_steps
        self.run_steps(slots, steps, 0, observer, profiler, checker)
        return [slots[s] for s in self.output_slots]

    def slots_for(self, feeds: dict) -> list:
        slots = list(self.template)
        for name, value in feeds.items():
            slots[self.index[name]] = value
        return slots

    def run_steps(self, slots: list, steps: list[Step], start: int, observer=None,
                   profiler=None, checker=None, record=None) -> None:
        for i in range(start, len(steps)):
            step = steps[i]
            values = [slots[s] if s != ABSENT else None for s in step.inputs]
            start_time = time.perf_counter() if profiler is not None else 0.0
            outputs = self._call(step, values, slots, observer)
            if profiler is not None:
                profiler.record(step, values, start_time, time.perf_counter())
            if checker is not None and step.reference is not None:
                checker(step, values, outputs)
            if record is not None:
                record(i, step, values, outputs)
            for s, value in zip(step.outputs, outputs):
                if s != ABSENT:
                    slots[s] = value
                    if observer is not None:
                        observer(Result("result", self.names[s], value, node=step.node))
            for s in step.release:
                slots[s] = None

    def _call(self, step: Step, values: list, slots: list, observer=None) -> list:
        try:
            run = step.run or self._scoped_call(step, slots, observer)
            return run(*values)
        except NodeError:
            raise
        except Exception as e:
            raise NodeError(step.node, self.opsets.get(canonical_domain(step.node.domain)),
                            f"{type(e).__name__}: {e}") from e

    def _run_compiled(self, feeds: dict, profiler: Profiler | None = None) -> list | None:
        """The outputs of a run through this signature's CompiledRun; None where the run is
        to go step by step in Python: a signature seen for the first time, one the plan could
        not compile, feeds that are not plain arrays, or another thread running it now."""
        key = _signature(feeds)
        if key is None:
            return None
        program = self._programs.get(key, NOT_COMPILED)  # one lookup: another thread may evict
        if program is not NOT_COMPILED:
            if program is None or not self._lock.acquire(blocking=False):
                return None
            try:
                self._programs.move_to_end(key)
                return program.run(feeds) if profiler is None else program.run(feeds, profiler)
            finally:
                if program.broken:  # a shape the recorded run did not have: never again
                    self._programs[key] = None
                self._lock.release()
        shared = self.shapes.program(key)  # plan_shapes: a pattern's, for a growing KV cache
        if shared is not None and self._lock.acquire(blocking=False):
            try:
                return shared.run(feeds) if profiler is None else shared.run(feeds, profiler)
            finally:
                self._lock.release()
        seen = self._sightings.get(key, 0)
        wanted = self.shapes.wants_recording(key)
        if not seen and not wanted:
            if len(self._sightings) >= SIGHTINGS:
                self._sightings.clear()
            self._sightings[key] = 1
            notes = self.shapes.notes(feeds)  # its shapes, to learn patterns from
            slots = self.slots_for(feeds)
            self.run_steps(slots, self.steps, 0, profiler=profiler, record=notes.record)
            self.shapes.seen(key, notes)
            return [slots[s] for s in self.output_slots]
        if not self._lock.acquire(blocking=False):
            return None
        try:
            recorder = Recorder(self, feeds)
            slots = self.slots_for(feeds)
            self.run_steps(slots, self.steps, 0, profiler=profiler, record=recorder.record)
            outputs = [slots[s] for s in self.output_slots]
            self._sightings.pop(key, None)
            if wanted:
                self.shapes.build(key, recorder)
                return outputs
            self._programs[key] = self._compile(recorder)
            while len(self._programs) > PROGRAMS:
                self._programs.popitem(last=False)
        finally:
            self._lock.release()
        return outputs

    def _compile(self, recorder) -> CompiledRun | None:
        """The signature's CompiledRun, or None (it runs step by step in Python from then on)
        when building it fails: the run that recorded it has its outputs already."""
        try:
            return CompiledRun(self, recorder)
        except Exception as e:  # noqa: BLE001 - a planning gap must not fail a run that worked
            log.debug("plan: signature not compiled: %s: %s", type(e).__name__, e)
            return None

    def _scoped_call(self, step: Step, slots: list, observer=None):
        scope = SlotScope(slots, self.index)
        runner = self._runner if observer is None else GraphRunner(self.evaluator, observer)

        def run(*values):
            return runner.call_op(step.node, list(_trim(values)), scope, self.opsets, (), None)

        return run


def _plain_value(a):
    """An attribute of a plain type as the reference gives it to operators, else NOT_PLAIN
    (also for a reference to a function's attribute, which the reference resolves)."""
    return NOT_PLAIN if a.ref_attr_name else plain_attribute_value(a)


@functools.lru_cache(maxsize=1024)
def _schema_defaults(op_type: str, opset: int, domain: str) -> tuple | None:
    """The schema's attribute defaults as (name, value) pairs, in the schema's order (none
    without a schema: our fused ops, com.microsoft's); None with a default of another type
    (then the reference converts them). onnx builds a new schema object and parses every
    default on each get_schema, or raises for a missing one, once per node before this cache
    (a few microseconds a node)."""
    schema = schema_for(op_type, opset, domain)
    if schema is None:
        return ()
    defaults = []
    for name, spec in schema.attributes.items():
        if spec.default_value.type == AttributeProto.UNDEFINED:
            continue
        value = _plain_value(spec.default_value)
        if value is NOT_PLAIN:
            return None
        defaults.append((name, value))
    return tuple(defaults)


def _plain_attributes(node, opset: int, domain: str) -> dict | None:
    """A node's attributes with its schema's defaults, when all are of plain types (the same
    dict the reference's GraphRunner.attributes makes); else None."""
    attrs = {}
    for a in node.attribute:
        value = _plain_value(a)
        if value is NOT_PLAIN:
            return None
        attrs[a.name] = value
    defaults = _schema_defaults(node.op_type, opset, domain)
    if defaults is None:
        return None
    for name, value in defaults:
        if name not in attrs:
            attrs[name] = list(value) if isinstance(value, list) else value
    return attrs


@functools.lru_cache(maxsize=1024)
def _takes_context(kernel: Callable) -> bool:
    """Whether a fast kernel takes the node's OpContext (`ctx`); inspect.signature took a
    seventh of a small model's session creation when asked once per node."""
    return "ctx" in inspect.signature(kernel).parameters


def outer_names(node) -> set[str]:
    """Names a node's subgraphs read from enclosing scopes (implicit inputs)."""
    names: set[str] = set()
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            graphs = [a.g]
        elif a.type == AttributeProto.GRAPHS:
            graphs = a.graphs
        else:
            continue
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
    """Chrome-trace events in onnxruntime's format: per node run one "Node" event (name, op
    type, input shapes, provider, ts and dur in µs from the profiler's start), per run one
    "Session" event "model_run".

    A compiled run is timed as it runs: the step table (csrc/plan.c plan_run_timed) reads the
    clock after each step, Python steps are timed around their call, both with
    time.perf_counter's clock.  A step made of several nodes is split into one event per
    node, its time shared evenly among them, the events back to back in node order: a fused
    elementwise chain (one pass over the elements, each member one operation per element,
    so alike in cost) and a oneDNN region (its members' shares are not measured apart).  A
    node whose several table entries run one after the other (a Concat's copies) is one event
    from the first's start to the last's end.  Steps worked out once for a signature do not
    run and have no event; nor do views (they copy nothing)."""

    def __init__(self, provider: str = "CPUExecutionProvider"):
        self.events: list[dict] = []
        self.provider = provider
        self.origin_ns = time.perf_counter_ns()

    def record(self, step: Step, values, start: float, end: float) -> None:
        """A step run in Python: its input values, perf_counter() before and after."""
        self.record_shapes(step, [_shape(v) for v in values], round(start * 1e9),
                           round(end * 1e9))

    def record_shapes(self, step: Step, shapes: list, start_ns: int, end_ns: int) -> None:
        """A step: its inputs' {dtype: shape}, perf_counter_ns() before and after."""
        members = _member_steps(step)
        share = (end_ns - start_ns) / len(members)
        for k, member in enumerate(members):
            node = member.node
            self.events.append({
                "cat": "Node", "pid": 1, "tid": 1, "ph": "X",
                "ts": (start_ns + k * share - self.origin_ns) / 1e3, "dur": share / 1e3,
                "name": (node.name or node.op_type) + "_kernel_time",
                "args": {"op_name": node.op_type, "provider": self.provider,
                         "kernel": step.kernel,
                         "input_type_shape": shapes if member is step else
                         _member_shapes(member, step, shapes)},
            })

    def record_run(self, start: float, end: float) -> None:
        self.events.append({"cat": "Session", "pid": 1, "tid": 1, "ph": "X",
                            "ts": (start * 1e9 - self.origin_ns) / 1e3,
                            "dur": (end - start) * 1e6, "name": "model_run", "args": {}})


def _member_steps(step: Step) -> list:
    """The steps of the graph's nodes that a step stands for: a fused chain's links, a oneDNN
    region's members, else the step itself."""
    if isinstance(step.run, chains.FusedChain):
        return [link.step for link in step.run.links]
    if isinstance(step.run, onednn_region.RegionRun):
        return list(step.run.steps)
    return [step]


def _member_shapes(member: Step, step: Step, shapes: list) -> list:
    """A chain or region member's input shapes as far as the whole step's inputs tell: the
    shape of each input the step reads, the step's first input's for values made inside it
    (an elementwise chain's values have its first input's shape, up to broadcasting)."""
    known = dict(zip(step.inputs, shapes))
    inner = shapes[0] if shapes else None
    return [known.get(s, inner) for s in member.inputs if s != ABSENT]


def _shape(value):
    if isinstance(value, np.ndarray):
        return {str(value.dtype): list(value.shape)}
    return type(value).__name__


# compiled runs ------------------------------------------------------------------------------

def _signature(feeds: dict) -> tuple | None:
    """The feeds' names, shapes and dtypes; None unless every feed is a plain array."""
    key = []
    for name, value in feeds.items():
        if not isinstance(value, np.ndarray) or value.dtype.hasobject:
            return None
        key.append((name, value.shape, value.dtype))
    return tuple(key)


def _fixed_size(value) -> bool:
    return isinstance(value, np.ndarray) and value.dtype.kind in "biufc"


class Operand:
    """A value as a step description sees it: its slot, shape and dtype in the recorded run,
    and the value itself where it is the same in every run of the signature."""
    __slots__ = ("dtype", "shape", "slot", "value")

    def __init__(self, slot: int, shape: tuple, dtype, value=None):
        self.slot, self.shape, self.dtype, self.value = slot, tuple(shape), np.dtype(dtype), value


class Recorder:
    """What one run of a signature shows: each value's shape and dtype, which step made it,
    and the values that are the same in every run of the signature (initializers, results of
    deterministic ops over those, Shape and Size)."""

    def __init__(self, plan: Plan, feeds: dict):
        self.plan = plan
        self.unmatched: set[int] = set()  # steps whose description gave other results
        self.specs: dict[int, tuple] = {}
        self.static: dict[int, Any] = {}
        self.producer: dict[int, int] = {}
        self.shape_reads: set[int] = set()  # slots whose shape a worked-out Shape/Size read
        for name, value in feeds.items():
            self._spec(plan.index[name], value)
        fed = {plan.index[name] for name in feeds}
        for slot, value in enumerate(plan.template):
            if value is not None and slot not in fed:
                self._spec(slot, value)
                self.static[slot] = value

    def _spec(self, slot: int, value) -> None:
        if _fixed_size(value):
            self.specs[slot] = (value.shape, value.dtype)

    def record(self, i: int, step: Step, values: list, outputs: list) -> None:
        for s, value in zip(step.outputs, outputs):
            if s != ABSENT:
                self.producer[s] = i
                self._spec(s, value)
        if not self._matches(step, values, outputs):
            self.unmatched.add(i)
            log.debug("plan: step %d (%s %r) runs in Python: its step-table description gave "
                      "other results than its kernel", i, step.node.op_type, step.node.name)
        if self._foldable(step, outputs):
            if step.node.op_type in SHAPE_OPS:
                self.shape_reads.add(step.inputs[0])
            for s, value in zip(step.outputs, outputs):
                if s != ABSENT:
                    # every later run reads it: a copy nobody may write, never the caller's array
                    value = np.array(value, copy=True)
                    value.setflags(write=False)
                    self.static[s] = value

    def _matches(self, step: Step, values: list, outputs: list) -> bool:
        """Whether the step's description, run on its own over this run's inputs, gives this
        run's outputs bit for bit (True where there is no description to run).  This keeps
        the step table to the kernels' results even where a fast kernel changes its path."""
        description = describe_step(self.plan, step, self)
        if not description or description == ALIAS:
            return True
        table = kernels.StepTable(description, len(self.plan.names))
        for s, value in zip(step.inputs, values):
            if s != ABSENT:
                table.bind(s, value if value.flags.c_contiguous else np.ascontiguousarray(value))
        results = []
        for s in step.outputs:
            if s != ABSENT:
                shape, dtype = self.specs[s]
                results.append((s, np.empty(shape, dtype)))
                table.bind(s, results[-1][1])
        if table.run(0, table.count) >= 0:
            return False
        made = {s: v for s, v in zip(step.outputs, outputs)}
        return all(made[s].tobytes() == got.tobytes() for s, got in results)

    def _foldable(self, step: Step, outputs: list) -> bool:
        node = step.node
        if step.run is None or node.domain not in ("", "ai.onnx") or node.op_type in RANDOM_OPS:
            return False
        if not all(_fixed_size(v) and v.nbytes <= FOLDED_BYTES
                   for s, v in zip(step.outputs, outputs) if s != ABSENT):
            return False
        if node.op_type in SHAPE_OPS:
            return bool(step.inputs) and step.inputs[0] in self.specs
        return all(s in self.static for s in step.inputs if s != ABSENT)


def describe_step(plan: Plan, step: Step, rec: Recorder):
    """The step as step-table entries (cpu.C_STEPS, or a fused chain), ALIAS, or None."""
    if isinstance(step.run, chains.FusedChain):
        return _describe_chain(step, rec)
    if isinstance(step.run, onednn_region.RegionRun):
        return step.run.describe([rec.specs.get(s) for s in step.inputs])
    describe = plan.c_steps.get((canonical_domain(step.node.domain), step.node.op_type))
    if describe is None or step.run is None:
        return None
    attrs = plan.static_attributes(step.node)
    if attrs is None:
        return None
    operands = []
    for slots in (step.inputs, step.outputs):
        listed = []
        for s in slots:
            if s == ABSENT:
                listed.append(None)
            elif s in rec.specs:
                listed.append(Operand(s, *rec.specs[s], rec.static.get(s)))
            else:
                return None
        operands.append(listed)
    return describe(*operands, **attrs)


def _describe_chain(step: Step, rec: Recorder):
    """A fused elementwise chain as the one chain_f32 call its FusedChain makes."""
    specs = [rec.specs.get(s) for s in step.inputs]
    if any(spec is None or spec[1] != np.float32 for spec in specs):
        return None
    layout = step.run.plan_layout([shape for shape, _ in specs])
    if layout is None:
        return None
    shape, start, ops, params, geometry = layout
    ordered = [step.inputs[start]] + step.inputs[:start] + step.inputs[start + 1:]
    sides = iter(ordered[1:])
    side_slots = [next(sides) if op[0] == chains.BINARY else -1 for op in step.run.ops]
    if rec.specs.get(step.outputs[0], (None,))[0] != shape:
        return None
    try:
        return [kernels.chain_step(ordered[0], step.outputs[0], int(np.prod(shape)), ops,
                                   params, geometry, side_slots)]
    except ValueError:
        return None


C, PY = 0, 1
ALIGN = 64


def _position(inside: dict[int, tuple[int, int]], slot: int) -> tuple[int, int]:
    """The outermost Concat result that holds slot in place (slot itself where none does), and
    slot's byte offset in it."""
    at = 0
    while slot in inside:
        slot, offset = inside[slot]
        at += offset
    return slot, at


def _side_by_side(inside: dict[int, tuple[int, int]], offsets: list[tuple[int, int]]):
    """(holder, byte offset) where a Concat's result already lies, its inputs (with their byte
    offsets in it) all in place in one holder in this order; else None."""
    if not offsets or any(x not in inside for x, _ in offsets):
        return None
    host, first = _position(inside, offsets[0][0])
    start = first - offsets[0][1]
    if all(_position(inside, x) == (host, start + offset) for x, offset in offsets):
        return host, start
    return None


class CompiledRun:
    """One signature's run: steps whose values were the same in the recorded run are gone
    (their values kept), consecutive steps that C_STEPS describes run in one plan_run call
    over a StepTable, the others one by one in Python.  C writes intermediate values into one
    arena, laid out by liveness; a step's outputs never share memory with its inputs.  A
    Concat's inputs are written where they lie in its result wherever they can be
    (_place_concats), so it copies nothing for them.  Graph outputs that C writes get new
    arrays each run, so no output is overwritten by the next.

    Each value that a Python step makes and C reads (or whose shape was worked out once) is
    checked against the recorded run; on a difference the run goes on in Python from there,
    and the signature is not compiled again (`broken`)."""

    def __init__(self, plan: Plan, rec: Recorder):
        self.plan, self.broken = plan, False
        self.output_memory = OutputMemory()  # this run's new outputs, memory used again
        steps = plan.steps
        outputs = set(plan.output_slots)
        kinds: list[int | None] = []
        described: dict[int, Any] = {}
        for i, step in enumerate(steps):
            made = [s for s in step.outputs if s != ABSENT]
            if made and all(s in rec.static and rec.producer.get(s) == i for s in made):
                kinds.append(None)  # worked out once
                continue
            description = None if i in rec.unmatched else self._describe(step, rec)
            kinds.append(PY if description is None else C)
            if description is not None:
                described[i] = description
        storage: dict[int, Any] = {s: "fixed" for s in rec.static}
        fed = {s for s in rec.specs if s not in rec.static and s not in rec.producer}
        storage.update({s: "feed" for s in fed})
        for i, step in enumerate(steps):
            if kinds[i] is None:
                continue
            made = [s for s in step.outputs if s != ABSENT]
            if kinds[i] == PY:
                storage.update({s: "python" for s in made})
                continue
            if described[i] == ALIAS:
                root = self._root(storage, step.inputs[0])
                y = made[0]
                if storage.get(root) == "arena" and y not in outputs:
                    storage[y] = ("alias", root)
                    described[i] = []
                    continue
                shape, dtype = rec.specs[y]
                try:
                    described[i] = [kernels.copy_step(step.inputs[0], y,
                                                      int(np.prod(shape)) * dtype.itemsize)]
                except ValueError:
                    kinds[i] = PY
                    storage[y] = "python"
                    continue
            storage.update({s: "fresh" if s in outputs or s in self.resized else "arena"
                            for s in made})
        self.storage = storage
        self.specs, self._shapes_of = rec.specs, {}  # for a profile's input shapes
        self.inside = self._place_concats(steps, kinds, described, rec)
        need = self._liveness(steps, kinds, outputs)
        self._layout(steps, kinds, rec, storage, need)
        self._table(steps, kinds, described, rec, storage, need, outputs)

    resized: frozenset = frozenset()  # slots made anew each run, with a shape per run
    #                                   (optimized/plan_shapes.py), never in the arena
    grown_shapes: Mapping = MappingProxyType({})  # this run's shape of each resized slot (for a profile)

    # building -------------------------------------------------------------------------
    def _describe(self, step: Step, rec: Recorder):
        return describe_step(self.plan, step, rec)

    def _place_concats(self, steps, kinds, described, rec) -> dict[int, tuple[int, int]]:
        """{slot: (concat result, byte offset)} for the Concat inputs that C writes straight
        into their place in the result: a Concat whose leading dimensions before its axis are
        all 1 holds each input as one contiguous byte range.  Such an input must be an arena
        value (a C step's whole output, not a view, not a graph output), appear once in that
        Concat and sit in no other.  The last Concat that takes a value gets it (the largest
        where features are concatenated again and again), so a Concat's result may itself sit
        in a later one's, and so may one whose inputs all sit side by side in a later one.
        The Concat keeps copies only of the inputs not in place."""
        inside: dict[int, tuple[int, int]] = {}
        for i in range(len(steps) - 1, -1, -1):
            step = steps[i]
            offsets = self._concat_offsets(step, kinds[i], described.get(i), rec)
            if offsets is None:
                continue
            y = step.outputs[0]
            total = int(np.prod(rec.specs[y][0])) * rec.specs[y][1].itemsize
            sizes = self._sizes(offsets, total)
            if y not in inside:
                spot = _side_by_side(inside, [(x, o) for (x, o), n in zip(offsets, sizes) if n])
                if spot is not None:
                    inside[y] = spot
            for x, offset in offsets:
                if (x != y and x not in inside and step.inputs.count(x) == 1
                        and self.storage.get(x) == "arena" and x not in self.resized):
                    inside[x] = (y, offset)
            host, at = _position(inside, y)
            copies = [(x, offset, nbytes) for (x, offset), nbytes in zip(offsets, sizes)
                      if nbytes and _position(inside, x) != (host, at + offset)]
            for x, offset, nbytes in copies:
                source, start = _position(inside, x)
                if source == host and start < at + offset + nbytes and at + offset < start + nbytes:
                    raise ValueError("a Concat would copy an input onto its own bytes")
            described[i] = [kernels.rows_copy_step(x, y, 1, nbytes, offset, total)
                            for x, offset, nbytes in copies]
        return inside

    def _concat_offsets(self, step: Step, kind, description, rec) -> list[tuple[int, int]] | None:
        """(input, byte offset in the result) for a Concat that C runs, whose result is an arena
        value and whose inputs are each one contiguous byte range of it; else None."""
        node = step.node
        if (kind != C or node.op_type != "Concat" or canonical_domain(node.domain) != ""
                or not isinstance(description, list)):
            return None
        y = step.outputs[0]
        if self.storage.get(y) != "arena" or y in self.resized or ABSENT in step.inputs:
            return None
        if any(s in self.resized for s in step.inputs):
            return None
        shape, dtype = rec.specs[y]
        axis = (self.plan.static_attributes(node) or {}).get("axis")
        if axis is None or not -len(shape) <= axis < len(shape):
            return None
        if int(np.prod(shape[:axis % len(shape)])) != 1:
            return None
        offsets, offset = [], 0
        for x in step.inputs:
            x_shape, x_dtype = rec.specs[x]
            offsets.append((x, offset))
            offset += int(np.prod(x_shape)) * x_dtype.itemsize
        return offsets if offset == int(np.prod(shape)) * dtype.itemsize else None

    def _host(self, slot: int) -> tuple[int, int]:
        return _position(self.inside, slot)

    def _concat_spans(self, steps, need) -> dict[int, int]:
        """{outermost Concat result: the last step that needs it or any value in it}."""
        span: dict[int, int] = {}
        made = {s: i for i, step in enumerate(steps) for s in step.outputs if s != ABSENT}
        for s in self.inside:
            host = self._host(s)[0]
            for value in (s, host):
                span[host] = max(span.get(host, 0), need.get(value, made[value]))
        return span

    @staticmethod
    def _sizes(offsets: list[tuple[int, int]], total: int) -> list[int]:
        ends = [offset for _, offset in offsets[1:]] + [total]
        return [end - offset for (_, offset), end in zip(offsets, ends)]

    @staticmethod
    def _root(storage: dict, slot: int) -> int:
        while isinstance(storage.get(slot), tuple):
            slot = storage[slot][1]
        return slot

    def _liveness(self, steps, kinds, outputs) -> dict[int, int]:
        """The last step that reads each value, or a value that may view it: a Python step's
        result may be a view of its inputs, and an alias is one."""
        end = len(steps)
        need = {s: end for s in outputs}
        for i in range(len(steps) - 1, -1, -1):
            step = steps[i]
            made = [s for s in step.outputs if s != ABSENT]
            extent = max([need.get(s, i) for s in made] + [i])
            viewing = kinds[i] == PY or any(isinstance(self.storage.get(s), tuple) for s in made)
            for s in self.plan.reads(step):
                need[s] = max(need.get(s, i), extent if viewing else i)
        return need

    def _layout(self, steps, kinds, rec, storage, need) -> None:
        """Arena offsets, first fit, for the values C writes: a value's bytes are free again
        after the last step that needs it."""
        placed: list[tuple[int, int, int]] = []  # (offset, size, last step)
        offsets: dict[int, int] = {}
        span = self._concat_spans(steps, need)
        top = 0
        for i, step in enumerate(steps):
            if kinds[i] != C:
                continue
            placed = [p for p in placed if p[2] >= i]
            for s in step.outputs:
                if s in self.inside:
                    s = self._host(s)[0]  # the whole Concat result, from its first input on
                if storage.get(s) != "arena" or s in offsets:
                    continue
                shape, dtype = rec.specs[s]
                size = max(ALIGN, -(-int(np.prod(shape)) * dtype.itemsize // ALIGN) * ALIGN)
                offset = 0
                for o, z, _ in sorted(placed):
                    if offset + size <= o:
                        break
                    offset = max(offset, o + z)
                placed.append((offset, size, span.get(s, need.get(s, i))))
                offsets[s] = offset
                top = max(top, offset + size)
        for s in self.inside:
            host, at = self._host(s)
            offsets[s] = offsets[host] + at
        self.arena = huge_page_buffer(top)  # a cold TLB walks a huge page per 2 MiB
        self.views: dict[int, np.ndarray] = {}
        for s, offset in offsets.items():
            shape, dtype = rec.specs[s]
            nbytes = int(np.prod(shape)) * dtype.itemsize
            self.views[s] = self.arena[offset:offset + nbytes].view(dtype).reshape(shape)
        for s, kind in storage.items():
            if isinstance(kind, tuple):
                self.views[s] = self.views[self._root(storage, s)].reshape(rec.specs[s][0])

    def _table(self, steps, kinds, described, rec, storage, need, outputs) -> None:
        plan = self.plan
        entries: list[dict] = []
        self.entry_step: list[int] = []
        c_reads: set[int] = set()
        for i, step in enumerate(steps):
            if kinds[i] == C:
                entries += described[i]
                self.entry_step += [i] * len(described[i])
                c_reads |= {s for s in step.inputs if s != ABSENT}
        table = kernels.StepTable(entries, len(plan.names))
        self.template = list(plan.template)
        for s, value in rec.static.items():
            self.template[s] = value
            if s in c_reads:
                table.bind(s, value if value.flags.c_contiguous else np.ascontiguousarray(value))
        for s, view in self.views.items():
            self.template[s] = view
            table.bind(s, view)
        self.table = table
        self.feed_binds = [s for s in c_reads if storage.get(s) == "feed"]
        self.fresh = [(s, *rec.specs[s]) for s, kind in storage.items() if kind == "fresh"]
        # slots bound to one run's arrays (feeds, outputs, Python results): let go after it
        self.per_run = sorted({*self.feed_binds, *(s for s, *_ in self.fresh),
                               *(s for s in c_reads if storage.get(s) == "python")})
        self.copied_outputs = {s for s in outputs if storage.get(s) == "fixed"}
        guarded = {s for s in (c_reads | rec.shape_reads) if storage.get(s) == "python"}
        self.ops: list[tuple] = []
        entry = 0
        for i, step in enumerate(steps):
            if kinds[i] == C:
                stop = entry + len(described[i])
                if self.ops and self.ops[-1][0] == C:
                    self.ops[-1] = (C, self.ops[-1][1], stop)
                else:
                    self.ops.append((C, entry, stop))
                entry = stop
            elif kinds[i] == PY:
                guards = [(s, *rec.specs[s], s in c_reads) for s in step.outputs if s in guarded]
                release = [s for s in plan.reads(step)
                           if storage.get(s) in ("python", "feed") and need.get(s) == i
                           and s not in outputs]
                self.ops.append((PY, i, guards, release))

    # running --------------------------------------------------------------------------
    def run(self, feeds: dict, profiler: Profiler | None = None) -> list:
        try:
            return self._run(feeds, profiler)
        finally:
            self.table.release(self.per_run)

    def _run(self, feeds: dict, profiler: Profiler | None = None) -> list:
        plan, table = self.plan, self.table
        slots = list(self.template)
        for name, value in feeds.items():
            slots[plan.index[name]] = value
        for s in self.feed_binds:
            value = slots[s]
            table.bind(s, value if value.flags.c_contiguous else np.ascontiguousarray(value))
        for s, shape, dtype in self.fresh:
            slots[s] = array = self.output_memory.empty(s, shape, dtype)
            table.bind(s, array)
        steps = plan.steps
        for op in self.ops:
            if op[0] == C:
                if profiler is None:
                    failed = table.run(op[1], op[2])
                else:
                    failed = self._timed(op[1], op[2], profiler)
                if failed >= 0:  # the step runs again in Python, which raises the error
                    return self._finish(slots, self.entry_step[failed], profiler)
                continue
            _, i, guards, release = op
            step = steps[i]
            values = [slots[s] if s != ABSENT else None for s in step.inputs]
            start = time.perf_counter() if profiler is not None else 0.0
            outputs = plan._call(step, values, slots)
            if profiler is not None:
                profiler.record(step, values, start, time.perf_counter())
            for s, value in zip(step.outputs, outputs):
                if s != ABSENT:
                    slots[s] = value
            for s, shape, dtype, bind in guards:
                value = slots[s]
                if not isinstance(value, np.ndarray) or value.shape != shape or value.dtype != dtype:
                    self.broken = True
                    return self._finish(slots, i + 1)
                if bind:
                    table.bind(s, value if value.flags.c_contiguous else np.ascontiguousarray(value))
            for s in release:
                slots[s] = None
        return self._outputs(slots)

    def _finish(self, slots: list, start: int, profiler: Profiler | None = None) -> list:
        """The rest of the run step by step in Python (steps worked out once included)."""
        self.plan.run_steps(slots, self.plan.steps, start, profiler=profiler)
        return self._outputs(slots)

    def _timed(self, start: int, stop: int, profiler: Profiler) -> int:
        """table.run(start, stop) with the clock read after each entry (plan_run_timed), and
        one profiler event per step of the entries that ran (not a failed one: it runs again
        in Python, timed there)."""
        times = np.empty(stop - start + 1, np.int64)
        failed = self.table.run(start, stop, times)
        done = stop if failed < 0 else failed
        steps, entry_step = self.plan.steps, self.entry_step
        k = start
        while k < done:
            i, end = entry_step[k], k + 1
            while end < done and entry_step[end] == i:
                end += 1
            profiler.record_shapes(steps[i], self._input_shapes(i), int(times[k - start]),
                                   int(times[end - start]))
            k = end
        return failed

    def _input_shapes(self, i: int) -> list:
        """Step i's inputs as {dtype: shape}, from the recorded run (the same in every run of
        the signature) or, for a slot in `resized`, this run's grown_shapes."""
        shapes = self._shapes_of.get(i)
        if shapes is None:
            inputs = self.plan.steps[i].inputs
            shapes = [{str(self.specs[s][1]): list(self.grown_shapes.get(s, self.specs[s][0]))}
                      if s in self.specs else "NoneType" for s in inputs]
            if not self.resized.intersection(inputs):
                self._shapes_of[i] = shapes
        return shapes

    def _outputs(self, slots: list) -> list:
        return [self._own(slots[s], s in self.copied_outputs) for s in self.plan.output_slots]

    def _own(self, value, copy: bool = False):
        if isinstance(value, list):
            return [self._own(v) for v in value]
        if isinstance(value, np.ndarray) and (copy or np.may_share_memory(value, self.arena)):
            return value.copy()
        return value
