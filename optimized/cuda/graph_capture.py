"""Planned runs and CUDA graphs over a DevicePlan, one per input-shape signature.

A plan whose every node runs on the device is planned per input-shape signature (planned.py):
buffers from one arena, launches bound once. With enable_cuda_graph the launches are captured
after one eager run (which compiles every kernel) and replayed from then on. What cannot be
planned or captured runs step by step (DevicePlan.run); with enable_cuda_graph that is said
once, in a warning naming the node and the reason.
"""
from __future__ import annotations

import warnings

from .planned import LaunchError, PlanError, PlannedRun, signature


class GraphPlan:
    def __init__(self, plan, enable_cuda_graph: bool = False, max_plans: int = 8):
        self.plan = plan
        self.enable_cuda_graph = enable_cuda_graph
        self.max_plans = max_plans
        self._planned: dict[tuple, PlannedRun | None] = {}
        self._graphs: dict[tuple, object] = {}  # signature -> captured graph
        self.not_planned: str | None = None  # why the last signature ran step by step
        self.not_captured: str | None = None
        self._warned = False

    def __getattr__(self, name):  # placement, steps, output_names, ... of the device plan
        return getattr(self.plan, name)

    def run(self, feeds: dict, observer=None, profiler=None, checker=None, device_outputs=()):
        if observer is not None or profiler is not None or checker is not None:
            return self.plan.run(feeds, observer, profiler, checker, device_outputs)
        key = signature(feeds)
        if key not in self._planned:
            self._planned[key] = self._make(feeds, key)
            if len(self._planned) > self.max_plans:
                oldest = next(iter(self._planned))
                self._planned.pop(oldest)
                self._graphs.pop(oldest, None)
            planned = self._planned[key]
            if planned is not None:
                try:
                    outputs = planned.run(feeds, device_outputs)  # eager: compiles every kernel
                except LaunchError as e:  # a launch the planner did not foresee failing
                    self._planned[key] = None
                    self.not_planned = str(e)
                    self._warn(f"{e.label} cannot be captured: {type(e.error).__name__}: {e.error}")
                    return self.plan.run(feeds, device_outputs=device_outputs)
                if self.enable_cuda_graph:
                    self._capture(planned, key)
                return outputs
        planned = self._planned[key]
        if planned is None:
            return self.plan.run(feeds, device_outputs=device_outputs)
        return planned.run(feeds, device_outputs)

    def _make(self, feeds, key) -> PlannedRun | None:
        try:
            return PlannedRun(self.plan, feeds)
        except PlanError as e:
            self.not_planned = str(e)
            self._warn(f"{e.op_type} node {e.node_name!r} cannot be captured: {e.reason}")
            return None

    def _capture(self, planned: PlannedRun, key) -> None:
        try:
            planned.capture()
        except LaunchError as e:
            planned.graph = None
            self.not_captured = str(e)
            self._warn(f"{e.label} cannot be captured: {type(e.error).__name__}: {e.error}")
            return
        except Exception as e:  # noqa: BLE001 - the driver ending an invalidated capture
            planned.graph = None
            self.not_captured = f"{type(e).__name__}: {e}"
            self._warn(f"capture failed: {type(e).__name__}: {e}")
            return
        self._graphs[key] = planned.graph

    def _warn(self, message: str) -> None:
        if self.enable_cuda_graph and not self._warned:
            self._warned = True
            warnings.warn(f"enable_cuda_graph: {message}; running without a CUDA graph",
                          UserWarning, stacklevel=4)
