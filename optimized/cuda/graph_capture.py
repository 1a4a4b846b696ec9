"""Whole-graph capture: with static shapes, run the plan once inside CUDA stream capture and
replay the graph afterwards. Feeds are copied into the captured input buffers; outputs are
read from the captured output buffers.

Capture needs every node on the device (a host node or a copy would synchronize inside the
capture) and every value kept alive (the graph holds raw pointers). A plan that cannot be
captured runs step by step, with one warning.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass


@dataclass
class Captured:
    graph: object
    stream: object
    inputs: dict  # name -> device buffer the graph reads
    outputs: list  # device arrays the graph writes
    keep_alive: list


class GraphPlan:
    def __init__(self, plan, max_graphs: int = 8):
        self.plan = plan
        self.device = plan.device
        self.placement = plan.placement
        self.output_names = plan.output_names
        self.max_graphs = max_graphs
        self._graphs: dict[tuple, Captured] = {}
        self.capturable = plan.placement.all_on_device
        if not self.capturable:
            cpu = [n for n, d in plan.placement.devices.items() if d != "cuda"]
            warnings.warn(f"enable_cuda_graph: not every node runs on CUDA ({cpu[:5]}...); "
                          f"running without CUDA graphs", UserWarning, stacklevel=3)

    def run(self, feeds: dict, observer=None, profiler=None, checker=None, device_outputs=()):
        if not self.capturable or observer or profiler or checker:
            return self.plan.run(feeds, observer, profiler, checker, device_outputs)
        key = tuple(sorted((n, tuple(v.shape), str(v.dtype)) for n, v in feeds.items()))
        captured = self._graphs.get(key)
        if captured is None:
            captured = self._capture(feeds)
            if captured is None:
                return self.plan.run(feeds, device_outputs=device_outputs)
            if len(self._graphs) >= self.max_graphs:
                self._graphs.pop(next(iter(self._graphs)))
            self._graphs[key] = captured
        return self._replay(captured, feeds, set(device_outputs))

    def _capture(self, feeds):
        xp = self.device.xp
        static = {n: xp.array(self.device.to_device(v)) for n, v in feeds.items()}
        everything = list(self.output_names)
        self.plan.run(static, device_outputs=everything)  # compiles kernels, fills the pool
        self.device.synchronize()
        stream = xp.cuda.Stream(non_blocking=True)
        keep: list = []
        try:
            with stream:
                stream.begin_capture()
                try:
                    outputs = self.plan.run(static, device_outputs=everything, keep_alive=keep)
                finally:
                    graph = stream.end_capture()
        except Exception as e:  # noqa: BLE001 - anything in the plan that capture rejects
            warnings.warn(f"enable_cuda_graph: capture failed ({type(e).__name__}: {e}); "
                          f"running without CUDA graphs", UserWarning, stacklevel=4)
            self.capturable = False
            return None
        return Captured(graph, stream, static, outputs, keep)

    def _replay(self, captured: Captured, feeds: dict, device_outputs: set) -> list:
        xp, stream = self.device.xp, captured.stream
        with stream:  # the copies go on the stream the graph replays on
            for name, buffer in captured.inputs.items():
                value = feeds[name]
                if self.device.is_device_array(value):
                    xp.copyto(buffer, value)
                else:
                    buffer.set(value, stream=stream)
        captured.graph.launch(stream)
        captured.stream.synchronize()
        return [out.copy() if name in device_outputs else self.device.to_host(out)
                for name, out in zip(self.output_names, captured.outputs)]
