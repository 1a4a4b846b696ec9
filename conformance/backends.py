"""Backends behind one small protocol: prepare(model) -> runnable; runnable.run(feeds) -> outputs.

Outputs come back in graph-output order as the reference's value kinds: NumPy arrays, lists for
sequences, dicts for maps and reference.values.EMPTY for an empty optional.
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Protocol

import numpy as np
from onnx import ModelProto

from reference.values import EMPTY, normalize


class Prepared(Protocol):
    def run(self, feeds: dict) -> list: ...


class Backend(Protocol):
    name: str
    anchor: bool  # an independent implementation shown beside ours, not held to expectations

    def prepare(self, model: ModelProto) -> Prepared: ...


EXPERIMENTAL_OPS_NOTICE = b"Warning: Model contains experimental ops:"


@contextlib.contextmanager
def without_experimental_ops_notice():
    """onnx's checker prints a notice to C++ std::cout for every model with experimental ops (the
    old corpora have many). Drop exactly those lines; any other output goes through, and errors
    are exceptions, which this does not touch."""
    if os.name != "posix":
        yield
        return
    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    libc.fflush(None)
    saved = os.dup(1)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 1)
        try:
            yield
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True)
                    if not line.startswith(EXPERIMENTAL_OPS_NOTICE)]
            if kept:
                os.write(1, b"".join(kept))


class ReferenceBackend:
    name = "reference"
    anchor = False

    def prepare(self, model):
        from reference import ReferenceEvaluator

        with without_experimental_ops_notice():
            ev = ReferenceEvaluator(model)
        return _Runner(lambda feeds: ev.run(None, feeds))


class OptimizedBackend:
    anchor = False

    def __init__(self, level: int = 99, provider: str = "cpu", check_nodes: bool = False):
        self.level = level
        self.provider = provider
        self.check_nodes = check_nodes
        self.name = "optimized" if provider == "cpu" else f"optimized-{provider}"
        if provider == "cuda":
            from optimized.cuda import gpu_unavailable_reason

            reason = gpu_unavailable_reason()
            if reason is not None:
                raise ValueError(f"--provider cuda needs a usable GPU: {reason}")

    def prepare(self, model):
        import optimized

        options = optimized.SessionOptions()
        options.graph_optimization_level = optimized.GraphOptimizationLevel.from_level(self.level)
        options.check_nodes = self.check_nodes
        providers = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider"]}
        with without_experimental_ops_notice():
            sess = optimized.InferenceSession(
                model.SerializeToString(), options, providers=providers[self.provider]
            )
        runner = _Runner(lambda feeds: sess.run(None, feeds))
        if self.provider == "cuda":  # {'gpu': n, 'cpu': m}: nodes on the GPU, nodes fallen back
            from optimized.cuda import node_counts

            runner.placement = lambda: node_counts(sess._plan)
        return runner


class OnnxruntimeBackend:
    name = "onnxruntime"
    anchor = True

    def prepare(self, model):
        import onnxruntime as ort

        # FATAL only: errors come back as exceptions (kept as the anchor's message); at ERROR
        # level onnxruntime also prints each failed run's colour-coded log line to stderr.
        ort.set_default_logger_severity(4)
        options = ort.SessionOptions()
        options.log_severity_level = 4
        sess = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        return _Runner(lambda feeds: [_from_ort(v) for v in sess.run(None, _to_ort(feeds))])


class OnnxReferenceBackend:
    name = "onnx-reference"
    anchor = True

    def prepare(self, model):
        from onnx.reference import ReferenceEvaluator

        ev = ReferenceEvaluator(model)
        return _Runner(lambda feeds: [_from_ort(v) for v in ev.run(None, _to_ort(feeds))])


class _Runner:
    def __init__(self, fn: Callable[[dict], list]):
        self._fn = fn

    def run(self, feeds: dict) -> list:
        return [normalize(v) for v in self._fn(feeds)]


def _to_ort(feeds: dict) -> dict:
    return {k: (None if v is EMPTY else v) for k, v in feeds.items()}


def _from_ort(value):
    if value is None:
        return EMPTY
    if isinstance(value, list):
        return [_from_ort(v) for v in value]
    if isinstance(value, np.ndarray) and value.dtype.kind in "SU":
        return value.astype(object)
    return value


BACKENDS = {
    "reference": ReferenceBackend,
    "optimized": OptimizedBackend,
    "onnxruntime": OnnxruntimeBackend,
    "onnx-reference": OnnxReferenceBackend,
}
ANCHOR_MODULES = {"onnxruntime": "onnxruntime", "onnx-reference": "onnx.reference"}


def available(name: str) -> bool:
    module = ANCHOR_MODULES.get(name)
    return module is None or importlib.util.find_spec(module.split(".")[0]) is not None


def make_backend(name: str, **options) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    if not available(name):
        raise ValueError(
            f"backend {name!r} needs {ANCHOR_MODULES[name]}, which is not installed "
            f"(pip install 'onnx-parity[anchors]')"
        )
    if name == "optimized":
        return OptimizedBackend(**options)
    return BACKENDS[name]()
