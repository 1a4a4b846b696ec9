"""optimized.InferenceSession against onnxruntime.InferenceSession, model by model.

For each model of benchmarks/models.py and each thread count in THREADS, one benchmark group
`<model>-t<threads>` holds two benchmarks: `test_optimized` (level 99, i.e. ORT_ENABLE_ALL) and
`test_onnxruntime` (ORT_ENABLE_ALL, sequential execution, inter_op_num_threads 1). Both get the
same feeds and the same intra_op_num_threads; only `run` is timed, after the session is built.

Before timing, each runtime's outputs are checked against the reference evaluator's on the
same feeds with rtol=1e-3 (the ONNX backend runner's) and atol=1e-4. The absolute term is wider
than the runner's 1e-7 because these models sum over 768 to 3072 products in float32, and
runtimes block those sums differently: a result near zero after a residual Add or LayerNorm's
centring keeps an absolute error of about eps(float32) * sqrt(K) * |operands|, 1e-6 to 1e-5
here, which no relative tolerance covers. A wrong kernel misses by far more than 1e-4.

    python -m pytest benchmarks/test_optimized_vs_ort.py --benchmark-only \
        --benchmark-json /tmp/bench.json -q
    python -m benchmarks.results /tmp/bench.json > benchmarks/RESULTS.md
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

import optimized
from benchmarks import models
from reference import ReferenceEvaluator

THREADS = [1, 2]
RTOL, ATOL = 1e-3, 1e-4
# models whose runs take a tenth of a second or more get fewer rounds
HEAVY = {"gpt2_seq128", "bert_layer", "light_resnet50", "light_vgg19", "light_densenet121",
         "light_inception_v2"}
# the chain takes well under a millisecond in onnxruntime: repeat it inside each round
ITERATIONS = {"chain100": 50}


def rounds_for(name: str) -> dict:
    return {"rounds": 7 if name in HEAVY else 15, "iterations": ITERATIONS.get(name, 1),
            "warmup_rounds": 1}


@functools.cache
def build(name: str):
    """(serialized model, feeds, the reference evaluator's outputs), built once per run."""
    model, feeds = models.build(name)
    expected = ReferenceEvaluator(model).run(None, feeds)
    return model.SerializeToString(), feeds, expected


def load(name: str):
    try:
        return build(name)
    except FileNotFoundError as e:  # an onnx build without the light models
        pytest.skip(str(e))


def check_close(name: str, runtime: str, expected: list, actual: list) -> None:
    assert len(actual) == len(expected), f"{runtime} on {name}: {len(actual)} outputs"
    for i, (want, got) in enumerate(zip(expected, actual)):
        got = np.asarray(got)
        assert got.shape == want.shape and got.dtype == want.dtype, (
            f"{runtime} on {name}, output {i}: {got.dtype}{got.shape}, "
            f"expected {want.dtype}{want.shape}")
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL,
                                   err_msg=f"{runtime} on {name}, output {i}")


@pytest.fixture(params=models.NAMES)
def model_name(request):
    return request.param


@pytest.fixture(params=THREADS, ids=lambda n: f"t{n}")
def threads(request):
    return request.param


def describe(benchmark, name: str, threads: int, runtime: str) -> None:
    benchmark.group = f"{name}-t{threads}"
    benchmark.extra_info.update(model=name, threads=threads, runtime=runtime)


def test_optimized(benchmark, model_name, threads):
    describe(benchmark, model_name, threads, "optimized")
    model, feeds, expected = load(model_name)
    options = optimized.SessionOptions()
    options.graph_optimization_level = optimized.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    session = optimized.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    check_close(model_name, "optimized", expected, session.run(None, feeds))
    benchmark.pedantic(session.run, args=(None, feeds), **rounds_for(model_name))


def test_optimized_node_by_node_chain(benchmark, threads):
    """chain100 at level 1: no fusion, so one kernel call per node, for the per-node overhead
    that level 99's chain fusion hides."""
    describe(benchmark, models.CHAIN, threads, "optimized-level1")
    model, feeds, expected = load(models.CHAIN)
    options = optimized.SessionOptions()
    options.graph_optimization_level = optimized.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.intra_op_num_threads = threads
    session = optimized.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    check_close(models.CHAIN, "optimized-level1", expected, session.run(None, feeds))
    benchmark.pedantic(session.run, args=(None, feeds), **rounds_for(models.CHAIN))


def test_onnxruntime(benchmark, model_name, threads):
    ort = pytest.importorskip("onnxruntime")
    describe(benchmark, model_name, threads, "onnxruntime")
    benchmark.extra_info["onnxruntime_version"] = ort.__version__
    model, feeds, expected = load(model_name)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # the light models carry unused initializers it warns about
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    check_close(model_name, "onnxruntime", expected, session.run(None, feeds))
    benchmark.pedantic(session.run, args=(None, feeds), **rounds_for(model_name))
