"""DevicePlan: optimized.plan.Plan over the placed graph, with device values in the slots.

Nodes placed on cuda run their device kernel; when it declines at run time (NotImplemented) the
node runs on the host through the CPU provider's path, with its inputs and outputs copied and
counted. Copy nodes move values; fused nodes run one generated elementwise kernel.
"""
from __future__ import annotations

import functools

import numpy as np

from reference.evaluator import Result
from reference.registry import canonical_domain

from ..plan import Plan, Step
from .arrays import Device, host_dtype
from .fusion import FUSED_DOMAIN, FUSED_OP, FusionGroup
from .kernels import KERNELS
from .placement import COPY_TO_DEVICE, COPY_TO_HOST, CUDA, place


class PlacementError(AssertionError):
    """Strict mode: a value reached a node on the wrong side (a missing copy)."""


class DevicePlan(Plan):
    """Never asks Plan for its CPU chain fusion (that is for host steps): fusion.py fuses here."""

    def __init__(self, model, cpu_kernels: dict, evaluator, device: Device,
                 device_kernels: dict = KERNELS, strict: bool = False, fuse: bool = True):
        self.device, self.strict = device, strict
        self._cpu_kernels, self._device_kernels = cpu_kernels, device_kernels
        self._compiled: dict = {}
        self._keep: frozenset = frozenset()
        self.declined: set[str] = set()  # device nodes whose kernel declined at run time
        self.placement = place(model, device_kernels, evaluator.functions, fuse=fuse)
        super().__init__(self.placement.model, cpu_kernels, evaluator)
        initial = evaluator.initial_values()
        for name, source in self.placement.resident.items():
            if name in self.index:
                self.template[self.index[name]] = self._adopt(device.to_device(initial[source]))
        self.uploads = device.transfers["to_device"]
        device.transfers.clear()
        self.output_names = [o.name for o in self.graph.output]
        self._read_outputs_on_host()

    def _read_outputs_on_host(self) -> None:
        """Outputs made on the device are returned from their CopyToHost slot, kept to the end."""
        self.output_slots = [self.index.get(f"{n}@host", self.index[n]) for n in self.output_names]
        keep = set(self.output_slots)
        for steps in {id(x): x for x in (self.steps, self.unfused_steps)}.values():
            for step in steps:
                step.release = [s for s in step.release if s not in keep]

    # binding --------------------------------------------------------------------------
    def _bind(self, node, kernels, slot) -> Step:
        inputs = [slot(n) for n in node.input]
        outputs = [slot(n) for n in node.output]
        if node.domain == FUSED_DOMAIN and node.op_type in (COPY_TO_DEVICE, COPY_TO_HOST):
            return Step(node, self._copy_run(node), inputs, outputs, kernel="copy")
        if node.domain == FUSED_DOMAIN and node.op_type == FUSED_OP:
            group = self.placement.groups[node.name]
            reference = self._group_reference(group)
            return Step(node, self._fused_run(group, reference, node.name), inputs, outputs,
                        kernel="cuda", reference=reference)
        host = super()._bind(node, self._cpu_kernels, slot)
        if self.placement.devices[node.name] != CUDA:
            if self.strict and host.run is not None:
                host.run = self._checked(host.run, node, on_device=False)
            return host
        kernel = self._device_kernels[(canonical_domain(node.domain), node.op_type)]
        fn = functools.partial(kernel.fn, self.device.xp)
        step = super()._bind(node, {(canonical_domain(node.domain), node.op_type):
                                    self._device_run(fn, host.run, node)}, slot)
        step.kernel = "cuda"
        if self.strict:
            step.run = self._checked(step.run, node, True, set(kernel.host_inputs))
        return step

    def _device_run(self, fn, host_run, node):
        @functools.wraps(fn)
        def on_device(*values, **attrs):
            result = fn(*values, **attrs)
            if result is NotImplemented:
                self.declined.add(node.name)
                return tuple(self._on_host(host_run or self._unbound(node), values))
            return tuple(self._adopt(r) for r in (result if isinstance(result, tuple) else (result,)))

        return on_device

    @staticmethod
    def _unbound(node):
        def fail(*values):
            raise NotImplementedError(f"{node.op_type}: no host path bound for a declined device kernel")

        return fail

    def _on_host(self, run, values):
        """A declined device node: inputs down, the host path, outputs up (all counted)."""
        outputs = run(*[self.device.to_host(v) for v in values])
        return [self._adopt(self.device.to_device(o)) for o in outputs]

    def _copy_run(self, node):
        device, source = self.device, node.input[0]
        if node.op_type == COPY_TO_DEVICE:
            return lambda value: [self._adopt(device.to_device(value))]

        def to_host(value):
            return [value if source in self._keep else device.to_host(value)]

        return to_host

    def _fused_run(self, group: FusionGroup, reference, name: str):
        def run(*values):
            if group.accepts(host_dtype(v) for v in values):
                return [self._adopt(self._fused_kernel(group, values))]
            self.declined.add(name)
            return self._on_host(reference, values)

        return run

    def _fused_kernel(self, group: FusionGroup, values):
        xp = self.device.xp
        if xp is np or not values:
            return group.evaluate(xp, *values)
        key = (group.output, np.dtype(values[0].dtype).name)
        if key not in self._compiled:
            self._compiled[key] = xp.ElementwiseKernel(**group.cuda_source(values[0].dtype))
        return self._compiled[key](*values)

    def _group_reference(self, group: FusionGroup):
        """The members' reference ops in order: check mode's oracle and the host fallback."""
        calls = [(node, self._reference_call(node)) for node in group.nodes]

        def run(*values):
            env = dict(zip(group.inputs, values)) | dict(group.constants)
            initial = self.evaluator.initial_values()
            for node, call in calls:
                args = [env[n] if n in env else initial[n] for n in node.input]
                env[node.output[0]] = call(*args)[0]
            return [env[group.output]]

        return run

    def _adopt(self, value):
        return self.device.adopt(value) if hasattr(self.device, "adopt") else value

    def _checked(self, run, node, on_device: bool, host_inputs=frozenset()):
        """Strict mode: every input on the side the placement promised."""
        is_device = self.device.is_device_array

        def run_checked(*values, **attrs):
            for i, v in enumerate(values):
                if not isinstance(v, np.ndarray) and not is_device(v):
                    continue
                want = on_device and i not in host_inputs
                if is_device(v) != want and host_dtype(v) in _CHECKED_DTYPES:
                    side = "device" if want else "host"
                    raise PlacementError(f"{node.op_type} {node.name!r}: input {i} "
                                         f"({node.input[i]!r}) is not on the {side}")
            return run(*values, **attrs)

        return run_checked

    # running --------------------------------------------------------------------------
    def run(self, feeds: dict, observer=None, profiler=None, checker=None,
            device_outputs=(), keep_alive: list | None = None) -> list:
        """As Plan.run; outputs named in `device_outputs` stay on the device. `keep_alive`
        collects every value made (CUDA graph capture must keep their memory)."""
        self._keep = frozenset(device_outputs)
        feeds = {name: self._feed(name, value) for name, value in feeds.items()}
        if checker is not None:
            checker = self._host_checker(checker)
        watch = self._observer(observer, keep_alive)
        outputs = super().run(feeds, observer=watch, profiler=profiler, checker=checker)
        return [v if name in self._keep else self.device.to_host(v)
                for name, v in zip(self.output_names, outputs)]

    def _feed(self, name, value):
        if self.device.is_device_array(value) and name in self.placement.host_readers:
            return self.device.to_host(value)
        return value

    def _host_checker(self, checker):
        host = self.device.to_host

        def check(step, values, outputs):
            checker(step, [host(v) for v in values], [host(v) for v in outputs])

        return check

    def _observer(self, observer, keep_alive):
        if observer is None and keep_alive is None:
            return None
        host = self.device.to_host

        def watch(result: Result):
            if keep_alive is not None:
                keep_alive.append(result.value)
            if observer is None or result.node.domain == FUSED_DOMAIN and result.node.op_type != FUSED_OP:
                return
            observer(Result(result.kind, result.name, host(result.value), result.node, result.path))

        return watch


_CHECKED_DTYPES = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int32,
                                                  np.int64, np.bool_, np.int8, np.uint8))
