"""The reference evaluator against onnx.reference on the light models that ship in onnx.

One benchmark group per model, two benchmarks each, on the input onnx's backend runner feeds
those models (arange(n)/n in float32). Our output is checked against the stored output under
the runner's policy; onnx.reference is only timed, and skipped where it cannot run the model.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from conformance.compare import compare_outputs
from conformance.corpus import light_input
from reference import ReferenceEvaluator

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = sorted(p.stem[len("light_"):] for p in LIGHT.glob("light_*.onnx"))
# onnx.reference takes seconds per run on the larger models: a few rounds are enough
ROUNDS = {"rounds": 3, "iterations": 1}


@functools.cache
def load(name: str):
    """(model, feeds, expected outputs) as onnx's backend runner builds them."""
    model = onnx.load(str(LIGHT / f"light_{name}.onnx"))
    initializers = {i.name for i in model.graph.initializer}
    feeds = {vi.name: light_input(vi) for vi in model.graph.input if vi.name not in initializers}
    expected = [
        numpy_helper.to_array(onnx.load_tensor(str(LIGHT / f"light_{name}_output_{i}.pb")))
        for i in range(len(model.graph.output))
    ]
    return model, feeds, expected


@pytest.fixture(params=MODELS or [pytest.param(None, marks=pytest.mark.skip(
    reason=f"the installed onnx ships no light models under {LIGHT}"))])
def light(request, benchmark):
    benchmark.group = f"light_{request.param}"
    return load(request.param)


def test_reference(benchmark, light):
    model, feeds, expected = light
    ev = ReferenceEvaluator(model)
    outputs = benchmark.pedantic(ev.run, args=(None, feeds), warmup_rounds=1, **ROUNDS)
    compare_outputs(expected, outputs)


def test_onnx_reference(benchmark, light):
    onnx_reference = pytest.importorskip("onnx.reference")
    model, feeds, _ = light
    try:
        ev = onnx_reference.ReferenceEvaluator(model)
        ev.run(None, feeds)  # the warm-up round, outside pedantic so that a failure skips
    except Exception as e:  # noqa: BLE001 - any failure of the anchor only skips its timing
        pytest.skip(f"onnx.reference cannot run this model: {type(e).__name__}: {e}")
    outputs = benchmark.pedantic(ev.run, args=(None, feeds), **ROUNDS)
    assert all(isinstance(o, np.ndarray) for o in outputs)
