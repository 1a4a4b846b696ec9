"""GEMV for decoding (csrc/gemv.c) against the BLAS path it replaces, on the weights of a GPT-2
layer, its lm head and a Llama-style lm head, at 1 and 2 threads.

`blas` is kernels.matmul (scipy-openblas32's sgemv/sgemm split by gemm.c), `gemv` is
kernels.gemv on the same K x N weight where it lies, `gemv_nk` on the weight stored N x K (a
Gemm's B with transB, or FusedMatMul transB).  Each benchmark's extra_info holds `gb_per_s`:
weight bytes / median time.  Run:

    pytest benchmarks/test_gemv.py --benchmark-only --benchmark-group-by=group \\
        --benchmark-columns=median,rounds

GEMV_CROSSOVER_MEASURED (optimized/cpu.py GEMV_ROWS_UP_TO), this file at ada89cb on this
2-core AMD EPYC while other work kept its load average at 8: GB/s of weight streamed, median
(best round), 1 thread:
    768 x 768    M=1 blas 35.2 (37.1)  gemv 40.7 (42.7) | M=4 blas 12.5 (14.2)  gemv 15.5 (16.4)
    768 x 3072   M=1 blas 45.3 (48.2)  gemv 45.1 (49.6) | M=4 blas 14.1 (15.5)  gemv 16.4 (17.1)
    3072 x 768   M=1 blas 36.8 (40.0)  gemv 35.2 (48.2) | M=4 blas 11.1 (14.0)  gemv 13.6 (19.4)
    768 x 50257  M=1 blas 10.2 (21.2)  gemv  9.7 (14.0) | M=4 blas  8.1 (11.1)  gemv  7.4 (9.5)
    512 x 32000  M=1 blas 10.3 (31.2)  gemv 10.6 (30.5) | M=4 blas  4.6 (10.4)  gemv  5.9 (11.4)
At M=1 the BLAS's sgemv and ours are even on one thread; at M=4 (the BLAS's GEMM kernel) ours
is ahead on all but the lm head, so GEMV takes every M it can.  At 2 threads gemm.c keeps
products under 2^22 flops (every GPT-2 weight at M=1) on one thread, where GEMV splits N; with
the machine this loaded, the second thread often had no core and those rounds are no guide.
"""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.test_kernels import rand
from optimized import kernels

WEIGHTS = {  # name: (K, N)
    "768x768": (768, 768),
    "768x3072": (768, 3072),
    "3072x768": (3072, 768),
    "lm_head_768x50257": (768, 50257),
    "llama_head_512x32000": (512, 32000),
    # the bench Llama's layer (benchmarks/decoders.py): rows short enough that GEMV cuts the
    # weight by rows on more than one thread (csrc/gemv.c GEMV_PART_FLOATS)
    "llama_kv_512x128": (512, 128),
    "llama_q_512x512": (512, 512),
    "llama_gate_512x1408": (512, 1408),
    "llama_down_1408x512": (1408, 512),
}
ROWS = [1, 4]




@pytest.mark.parametrize("impl", ["blas", "gemv", "gemv_nk"])
@pytest.mark.parametrize("m", ROWS, ids=lambda m: f"M{m}")
@pytest.mark.parametrize("case", list(WEIGHTS))
def test_gemv(benchmark, case, m, impl, threads):
    k, n = WEIGHTS[case]
    a, b = rand(1, (m, k)), rand(2, (k, n))
    benchmark.group = f"{case} M{m} {threads}thr"
    out = np.empty((m, n), np.float32)
    expected = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
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
