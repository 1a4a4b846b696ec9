"""The kernel benchmarks' `threads` fixture (a file that parametrizes or defines its own keeps that)."""
from __future__ import annotations

import time

import pytest

THREADS = [1, 2]
SETTLE_S = 0.5


@pytest.fixture(params=THREADS, ids=lambda n: f"{n}thr")
def threads(request):
    """The C kernels' thread count for one benchmark, restored after it."""
    from optimized import kernels  # here, not at import: onnxruntime's halves need a process
    #                                without optimized (test_matmul_nbits.alone_in_process)
    before = kernels.get_num_threads()
    kernels.set_num_threads(request.param)
    # let the previous contender's pool threads (OpenBLAS's, onnxruntime's) stop spinning: on a
    # machine with as many cores as threads they would otherwise steal this contender's cores
    time.sleep(SETTLE_S)
    yield request.param
    kernels.set_num_threads(before)
