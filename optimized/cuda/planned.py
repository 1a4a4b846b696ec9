"""A planned device run: for one input-shape signature, every node's launches bound once to
buffers carved from one arena, so a run is: copy the feeds into their buffers, launch, copy the
outputs back. The launches allocate, copy and synchronize nothing; they can be captured into a
CUDA graph and replayed.

Built from a DevicePlan (placement, copies, fusion groups, bound steps): values are tracked as
device buffers (Spec + lifetime), reshaped views of them, fixed device arrays (initializers
uploaded when the session was made) or host constants (initializers, values derived from
shapes alone, worked out now). A node that cannot be planned (it runs on the host, reads a value
computed at run time on the host, or its planner declines) raises PlanError naming it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from reference.registry import canonical_domain

from ..plan import ABSENT
from .fusion import FUSED_DOMAIN, FUSED_OP
from .launches import (
    LAYOUT_AWARE,
    NHWC,
    PLANNERS,
    Planned,
    Spec,
    View,
    array_module,
    plan_group,
    shape_constant,
)
from .placement import COPY_TO_DEVICE, COPY_TO_HOST, CUDA

ALIGN = 256


class PlanError(Exception):
    def __init__(self, node, reason: str):
        self.node_name = node.name or node.op_type
        self.op_type, self.reason = node.op_type, reason
        super().__init__(f"{node.op_type} {self.node_name!r}: {reason}")


@dataclass(eq=False)
class Buffer:
    spec: Spec
    first: int  # the step that writes it (-1: a feed)
    last: int  # the last step that reads it (a large number: read after the run)
    offset: int = 0


@dataclass(eq=False)
class Ref:
    """A device value: a buffer seen with its own shape, or a fixed array."""
    spec: Spec
    buffer: Buffer | None = None
    fixed: object = None

    def array(self):
        """The device array; a channels-last value as stored, (n, h, w, c)."""
        if self.fixed is not None:
            return self.fixed
        return self.buffer.array.reshape(self.spec.stored_shape)


FOREVER = 1 << 40


class PlannedRun:
    def __init__(self, plan, feeds: dict):
        self.plan, self.device = plan, plan.device
        self.buffers: list[Buffer] = []
        self.inputs: list[tuple[str, Buffer]] = []
        self.graph = None
        values: dict[int, object] = {}  # slot -> Ref or host constant (np.ndarray)
        for slot, value in enumerate(plan.template):
            if value is not None:
                values[slot] = (Ref(_spec_of(value), fixed=value) if self.device.is_device_array(value)
                                else value)
        self.bound: list[tuple] = []  # (node, Planned, input refs/constants, output refs, scratch)
        self._relaid: dict[int, tuple] = {}  # id of a channels-last value -> it, its (n, c, h, w) copy
        for i, step in enumerate(plan.steps):
            self._plan_step(i, step, values, feeds)
        self.outputs: list = []
        for slot in plan.output_slots:
            value = values.get(slot)
            if value is None:  # a graph input that is also a graph output
                value = _Feed(plan.names[slot])
            if isinstance(value, Ref) and value.buffer is not None:
                value.buffer.last = FOREVER
            self.outputs.append(value)
        self.size = self._lay_out()
        self.arena = self.device.empty((max(self.size, 1),), np.uint8)
        for buffer in self.buffers:
            raw = self.arena[buffer.offset:buffer.offset + buffer.spec.nbytes]
            buffer.array = raw.view(buffer.spec.dtype).reshape(buffer.spec.shape)
        self.launches = self._bind()

    # planning -------------------------------------------------------------------------
    def _plan_step(self, i, step, values, feeds) -> None:
        node = step.node
        ins = [values.get(s) if s != ABSENT else None for s in step.inputs]
        if node.domain == FUSED_DOMAIN and node.op_type in (COPY_TO_DEVICE, COPY_TO_HOST):
            self._plan_copy(i, step, ins, values, feeds)
            return
        for s, v in zip(step.inputs, ins):
            if s != ABSENT and v is None:
                name = self.plan.names[s]
                raise PlanError(node, f"reads graph input {name!r} on the host: its value is known "
                                      f"only at run time" if name in feeds else
                                      f"input {name!r} has no value when planned")
        if self.plan.placement.devices.get(node.name) != CUDA:
            raise PlanError(node, "runs on the host (no device kernel for it)")
        host_inputs = self._host_inputs(node)
        if node.op_type == "Shape" and isinstance(ins[0], Ref):
            values[step.outputs[0]] = shape_constant(ins[0].spec, self._attrs(node))
            return
        if all(v is None or not isinstance(v, Ref) or v.fixed is not None for v in ins):
            # constants only (initializers, shapes): the node's value is known now
            outputs = self._on_host_now(step, [v.fixed if isinstance(v, Ref) else v for v in ins])
            for s, v in zip(step.outputs, outputs):
                if s != ABSENT:
                    values[s] = v
            return
        ins = [self._on_device(v) if k not in host_inputs and isinstance(v, np.ndarray) else v
               for k, v in enumerate(ins)]
        if (canonical_domain(node.domain), node.op_type) not in LAYOUT_AWARE:
            ins = [self._channels_first(v, i, node) for v in ins]
        for k, v in enumerate(ins):
            if isinstance(v, Ref) and k in host_inputs:
                raise PlanError(node, f"input {k} is read on the host but computed on the device "
                                      f"at run time")
        specs = [Spec(v.spec.shape, v.spec.dtype, v.fixed is not None, v.spec.layout)
                 if isinstance(v, Ref) else v for v in ins]
        if node.domain == FUSED_DOMAIN and node.op_type == FUSED_OP:
            planned = plan_group(self.device, self.plan.placement.groups[node.name], specs)
        else:
            fn = PLANNERS.get((canonical_domain(node.domain), node.op_type))
            planned = fn(self.device, node, specs, self._attrs(node)) if fn else "no planned kernel"
        if not isinstance(planned, Planned):
            raise PlanError(node, str(planned))
        for v in ins:
            if isinstance(v, Ref) and v.buffer is not None:
                v.buffer.last = max(v.buffer.last, i)
        outs = []
        for s, out in zip(step.outputs, planned.outputs + [None] * len(step.outputs)):
            if out is None or s == ABSENT:
                outs.append(None)
                continue
            if isinstance(out, View):
                source = ins[out.source]
                ref = Ref(Spec(tuple(out.shape), source.spec.dtype), source.buffer, None if source.buffer
                          else source.fixed.reshape(out.shape))
            else:
                ref = Ref(out, self._new_buffer(out, i, i))
            values[s] = ref
            outs.append(ref)
        scratch = [self._new_buffer(spec, i, i) for spec in planned.scratch]
        self.bound.append((node, planned, ins, outs, scratch))

    def _plan_copy(self, i, step, ins, values, feeds) -> None:
        node, source = step.node, ins[0]
        name = self.plan.names[step.inputs[0]]
        if node.op_type == COPY_TO_DEVICE:
            if source is None:  # a feed: its planned input buffer
                feed = feeds[name]
                buffer = self._new_buffer(Spec(tuple(feed.shape), np.dtype(feed.dtype)), -1, FOREVER)
                self.inputs.append((name, buffer))
                values[step.outputs[0]] = Ref(buffer.spec, buffer)
            else:
                values[step.outputs[0]] = self._on_device(source) if isinstance(source, np.ndarray) else source
            return
        if isinstance(source, Ref):
            source = self._channels_first(source, i, node)
            if source.buffer is not None:
                source.buffer.last = FOREVER
            values[step.outputs[0]] = source  # read back after the run
        elif source is not None:
            values[step.outputs[0]] = source
        else:
            raise PlanError(node, f"{name!r} is read on the host before it is made on the device")

    def _channels_first(self, value, i, node):
        """A channels-last value as (n, c, h, w) for a reader that wants it so: one transposing
        copy, made once and shared by every such reader."""
        if not isinstance(value, Ref) or value.spec.layout != NHWC:
            return value
        key = id(value)
        if key not in self._relaid:
            spec = Spec(value.spec.shape, value.spec.dtype)
            copy = Ref(spec, self._new_buffer(spec, i, i))
            value.buffer.last = max(value.buffer.last, i)

            def bind(a, o, s):
                return [lambda: array_module(o[0]).copyto(o[0], a[0].transpose(0, 3, 1, 2))]

            self.bound.append((node, Planned([spec], bind), [value], [copy], []))
            self._relaid[key] = (value, copy)  # the value is kept so its id stays its own
        return self._relaid[key][1]

    def _host_inputs(self, node) -> tuple:
        kernel = self.plan._device_kernels.get((canonical_domain(node.domain), node.op_type))
        return kernel.host_inputs if kernel is not None else ()

    def _attrs(self, node) -> dict:
        return self.plan.static_attributes(node) or {}

    def _on_device(self, value: np.ndarray) -> Ref:
        """A host constant read on the device: uploaded now, while planning."""
        fixed = self.device.to_device(np.ascontiguousarray(value))
        return Ref(_spec_of(fixed), fixed=fixed)

    def _on_host_now(self, step, ins) -> list:
        """A node over constants only (a shape computation): its reference op, now."""
        run = step.reference or self.plan._reference_call(step.node)
        if run is None:
            raise PlanError(step.node, "a constant computation without a plain reference op")
        return [np.asarray(v) for v in run(*[self.device.to_host(v) for v in ins])]

    def _new_buffer(self, spec: Spec, first: int, last: int) -> Buffer:
        buffer = Buffer(Spec(tuple(int(d) for d in spec.stored_shape), np.dtype(spec.dtype)), first, last)
        self.buffers.append(buffer)
        return buffer

    def _lay_out(self) -> int:
        """Offsets in one arena: buffers whose lifetimes overlap never share bytes (largest
        first, each at the lowest offset free of every placed overlapping buffer)."""
        placed: list[Buffer] = []
        top = 0
        for b in sorted(self.buffers, key=lambda b: -b.spec.nbytes):
            size = _aligned(b.spec.nbytes)
            busy = sorted((p.offset, p.offset + _aligned(p.spec.nbytes)) for p in placed
                          if p.first <= b.last and b.first <= p.last)
            offset = 0
            for lo, hi in busy:
                if offset + size <= lo:
                    break
                offset = max(offset, hi)
            b.offset = offset
            top = max(top, offset + size)
            placed.append(b)
        return top

    def _bind(self) -> list[tuple]:
        launches = []
        for node, planned, ins, outs, scratch in self.bound:
            arrays = [v.array() if isinstance(v, Ref) else v for v in ins]
            out_arrays = [o.array() if o is not None else None for o in outs]
            label = f"{node.op_type} {node.name!r}"
            try:
                for launch in planned.bind(arrays, out_arrays, [b.array for b in scratch]):
                    launches.append((label, launch))
            except Exception as e:
                raise PlanError(node, f"binding failed: {type(e).__name__}: {e}") from e
        return launches

    # running --------------------------------------------------------------------------
    def launch_all(self, record=None) -> None:
        for label, launch in self.launches:
            try:
                launch()
            except Exception as e:
                raise LaunchError(label, e) from e
            if record is not None:
                record(launch)

    def capture(self) -> None:
        """Record the launches in a graph (after one eager run compiled every kernel)."""
        device = self.device
        with device.capture() as holder:
            self.launch_all(holder.record)
        self.graph = holder.graph

    def run(self, feeds: dict, device_outputs=()) -> list:
        device = self.device
        for name, buffer in self.inputs:
            device.copy_into(buffer.array, feeds[name])
        with _on_stream(device):
            if self.graph is not None:
                self.graph.launch(getattr(device, "stream", None))
            else:
                self.launch_all()
        names = self.plan.output_names
        results = []
        for name, value in zip(names, self.outputs):
            if isinstance(value, Ref):
                array = value.array()
                results.append(_device_copy(device, array) if name in device_outputs
                                else device.to_host(array))
            elif isinstance(value, _Feed):
                fed = feeds[value.name]
                results.append(fed if name in device_outputs else device.to_host(fed))
            else:
                results.append(np.array(value))
        return results


@dataclass(frozen=True)
class _Feed:
    name: str


class LaunchError(RuntimeError):
    def __init__(self, label: str, error: Exception):
        self.label, self.error = label, error
        super().__init__(f"{label}: {type(error).__name__}: {error}")


def _device_copy(device, array):
    """An output left on the device: its own copy (the arena is rewritten by the next run)."""
    with _on_stream(device):
        return device.adopt(array.copy())


def _on_stream(device):
    stream = getattr(device, "stream", None)
    return stream if stream is not None else contextlib.nullcontext()


def _spec_of(value) -> Spec:
    return Spec(tuple(value.shape), np.dtype(value.dtype))


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def signature(feeds: dict) -> tuple:
    return tuple(sorted((n, tuple(getattr(v, "shape", ())), str(getattr(v, "dtype", type(v).__name__)))
                        for n, v in feeds.items()))
