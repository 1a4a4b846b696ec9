"""One com.microsoft MatMulNBits node: optimized against onnxruntime.

4-bit weights in blocks of 32 with packed zero points (the asymmetric form onnxruntime's
MatMulNBitsQuantizer writes), at 1 and 2 threads: decode shapes (M = 1) K=512 -> N=1536 and
K=2048 -> N=8192, and a 128-token prompt's (M = 128) through the bench decoder's MLP,
K=512 -> N=1408 and K=1408 -> N=512.  Groups are `<shape>-t<threads>`; each benchmark's
extra_info holds the packed weight bytes (codes, scales and zero points), `packed_GB_per_s`,
those bytes over the median time, and `GFLOP_per_s`, 2 M N K over it.

Each runtime runs in its own process (two OpenMP runtimes and two thread pools in one process
disturb each other's timings), so a test skips, saying why, when the other runtime is already
loaded in its process.  Run the two halves separately:

    python -m pytest benchmarks/test_matmul_nbits.py --benchmark-only -k optimized \
        --benchmark-json /tmp/nbits_optimized.json -q
    python -m pytest benchmarks/test_matmul_nbits.py --benchmark-only -k onnxruntime \
        --benchmark-json /tmp/nbits_onnxruntime.json -q

Before timing, each runtime's output is checked against the reference evaluator's on the same
input with rtol=1e-3 and atol=1e-3 * max|y| (K-term float32 sums in different orders).
"""
from __future__ import annotations

import functools
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from reference import ReferenceEvaluator

THREADS = [1, 2]
SHAPES = {"k512_n1536": (1, 512, 1536), "k2048_n8192": (1, 2048, 8192),  # (M, K, N)
          "m128_k512_n1408": (128, 512, 1408), "m128_k1408_n512": (128, 1408, 512)}
BITS, BLOCK_SIZE = 4, 32
ROUNDS = {"rounds": 50, "iterations": 1, "warmup_rounds": 5}


@functools.cache
def build(shape: str):
    """(serialized one-node model, feeds, reference output, packed weight bytes)."""
    m, k, n = SHAPES[shape]
    rng = np.random.default_rng(0)
    blocks = (k + BLOCK_SIZE - 1) // BLOCK_SIZE
    b = rng.integers(0, 256, (n, blocks, BLOCK_SIZE * BITS // 8), dtype=np.uint8)
    scales = (rng.random((n, blocks), dtype=np.float32) * 0.02).astype(np.float32)
    zp = rng.integers(0, 256, (n, (blocks * BITS + 7) // 8), dtype=np.uint8)
    node = helper.make_node("MatMulNBits", ["a", "b", "scales", "zp"], ["y"],
                            domain="com.microsoft", K=k, N=n, bits=BITS, block_size=BLOCK_SIZE)
    graph = helper.make_graph(
        [node], "matmul_nbits",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(v, name) for name, v in
         (("b", b), ("scales", scales), ("zp", zp))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    feeds = {"a": rng.standard_normal((m, k), dtype=np.float32)}
    expected = ReferenceEvaluator(model).run(None, feeds)[0]
    return model.SerializeToString(), feeds, expected, b.nbytes + scales.nbytes + zp.nbytes


def alone_in_process(other: str) -> None:
    if other in sys.modules:
        pytest.skip(f"{other} is loaded in this process: run each runtime in its own process "
                    "(-k optimized, then -k onnxruntime)")


def check_close(got, expected) -> None:
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3 * np.abs(expected).max())


@pytest.fixture(params=list(SHAPES))
def shape(request):
    return request.param


@pytest.fixture(params=THREADS, ids=lambda n: f"t{n}")
def threads(request):
    return request.param


def timed(benchmark, run, shape, threads, runtime, nbytes):
    benchmark.group = f"{shape}-t{threads}"
    benchmark.extra_info.update(shape=shape, threads=threads, runtime=runtime,
                                packed_weight_bytes=nbytes)
    benchmark.pedantic(run, **ROUNDS)
    if benchmark.stats is not None:  # None under --benchmark-disable
        median = benchmark.stats.stats.median
        m, k, n = SHAPES[shape]
        benchmark.extra_info["packed_GB_per_s"] = nbytes / median / 1e9
        benchmark.extra_info["GFLOP_per_s"] = 2 * m * k * n / median / 1e9


def test_optimized(benchmark, shape, threads):
    alone_in_process("onnxruntime")
    import optimized

    model, feeds, expected, nbytes = build(shape)
    options = optimized.SessionOptions()
    options.graph_optimization_level = optimized.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    session = optimized.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    check_close(session.run(None, feeds)[0], expected)
    timed(benchmark, lambda: session.run(None, feeds), shape, threads, "optimized", nbytes)


def test_onnxruntime(benchmark, shape, threads):
    alone_in_process("optimized")
    ort = pytest.importorskip("onnxruntime")
    model, feeds, expected, nbytes = build(shape)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    check_close(session.run(None, feeds)[0], expected)
    benchmark.extra_info["onnxruntime_version"] = ort.__version__
    timed(benchmark, lambda: session.run(None, feeds), shape, threads, "onnxruntime", nbytes)


@pytest.mark.parametrize("level", ["avx2", "avx512"])
def test_kernel_by_isa(benchmark, shape, level):
    """The kernel alone (kernels.matmul_nbits, 1 thread) capped at one vector-instruction level,
    to compare the AVX2 and AVX-512 paths on one machine (group `<shape>-isa`; skipped where the
    CPU lacks the level).  Under load, time CPU rather than wall:

        python -m pytest benchmarks/test_matmul_nbits.py --benchmark-only -q -k by_isa \\
            --benchmark-timer time.process_time --benchmark-json /tmp/nbits_isa.json
    """
    alone_in_process("onnxruntime")
    from optimized import kernels

    model, feeds, expected, nbytes = build(shape)
    init = {t.name: numpy_helper.to_array(t)
            for t in onnx.load_from_string(model).graph.initializer}
    _, k, n = SHAPES[shape]
    if list(kernels.ISAS).index(level) > list(kernels.ISAS).index(kernels.cpu_isa()):
        pytest.skip(f"this CPU runs at most {kernels.cpu_isa()}, not {level}")
    threads_before = kernels.get_num_threads()
    kernels.set_num_threads(1)
    try:
        with kernels.isa_limit(level):
            def run():
                return kernels.matmul_nbits(feeds["a"], init["b"], init["scales"], init["zp"],
                                            k=k, n=n, bits=BITS, block_size=BLOCK_SIZE)
            check_close(run(), expected)
            timed(benchmark, run, shape, 1, f"kernel-{level}", nbytes)
            benchmark.group = f"{shape}-isa"
    finally:
        kernels.set_num_threads(threads_before)
