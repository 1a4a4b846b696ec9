"""GEMV for decoding (csrc/gemv.c) against the BLAS path it replaces, on the weights of a GPT-2
layer, its lm head and a Llama-style lm head, at 1 and 2 threads.

`blas` is kernels.matmul (scipy-openblas32's sgemv/sgemm split by gemm.c), `gemv` is
kernels.gemv on the same K x N weight where it lies, `gemv_nk` on the weight stored N x K (a
Gemm's B with transB, or FusedMatMul transB).  Each benchmark's extra_info holds `gb_per_s`:
weight bytes / median time.  Run:

    pytest benchmarks/test_gemv.py --benchmark-only --benchmark-group-by=group \\
        --benchmark-columns=median,rounds

GEMV_CROSSOVER_MEASURED (optimized/cpu.py GEMV_ROWS_UP_TO): medians in GB/s of weight streamed,
K x N = 768 x 3072, this 2-core machine shared with other work, 1 thread:
    M=1 blas 42.4, gemv 33.4, gemv_nk 37.0
    M=2 blas  9.8, gemv 27.0, gemv_nk 28.3
    M=4 blas  9.9, gemv 12.6, gemv_nk 10.4
and 768 x 768: M=1 blas 33.6, gemv 46.1; M=2 blas 8.9, gemv 24.0; M=4 blas 11.3, gemv 12.9.
At M=1 and 1 thread the BLAS's sgemv and ours are close (either ahead by shape and by run);
from M=2 the BLAS runs its GEMM kernel at a third of the speed, and at 2 threads gemm.c keeps
products under 2^22 flops on one thread, where GEMV splits them.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from optimized import kernels

THREADS = [1, 2]
SETTLE_S = 0.5
WEIGHTS = {  # name: (K, N)
    "768x768": (768, 768),
    "768x3072": (768, 3072),
    "3072x768": (3072, 768),
    "lm_head_768x50257": (768, 50257),
    "llama_head_512x32000": (512, 32000),
}
ROWS = [1, 4]


def rand(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


@pytest.fixture(params=THREADS, ids=lambda n: f"{n}thr")
def threads(request):
    before = kernels.get_num_threads()
    kernels.set_num_threads(request.param)
    time.sleep(SETTLE_S)
    yield request.param
    kernels.set_num_threads(before)


@pytest.mark.parametrize("impl", ["blas", "gemv", "gemv_nk"])
@pytest.mark.parametrize("m", ROWS, ids=lambda m: f"M{m}")
@pytest.mark.parametrize("case", list(WEIGHTS))
def test_gemv(benchmark, case, m, impl, threads):
    k, n = WEIGHTS[case]
    a, b = rand(1, (m, k)), rand(2, (k, n))
    benchmark.group = f"{case} M{m} {threads}thr"
    out = np.empty((m, n), np.float32)
    expected = kernels.matmul(a, b)
    if impl == "blas":
        got = benchmark(kernels.matmul, a, b, out=out)
    elif impl == "gemv":
        got = benchmark(kernels.gemv, a, b, out=out)
    else:
        b_nk = np.ascontiguousarray(b.T)
        got = benchmark(kernels.gemv, a, b_nk, trans_b=True, out=out)
    median = benchmark.stats.stats.median
    benchmark.extra_info["gb_per_s"] = round(k * n * 4 / median / 1e9, 1)
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)
