"""The cost of `onnx-parity diff` (reference vs optimized, with attribution) on the GPT-2-like
block at sequence 128, beside the two plain runs it compares.  Issue target: within 3x the
time of the two plain runs.  Peak memory of each is recorded in extra_info (tracemalloc)."""
import tracemalloc

import pytest

from benchmarks.models import build
from conformance.diff import diff_models
from optimized import InferenceSession
from reference import ReferenceEvaluator


@pytest.fixture(scope="module")
def gpt2():
    return build("gpt2_seq128")


def _peak_mb(fn) -> float:
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


@pytest.mark.benchmark(group="diff-gpt2-seq128")
def test_two_plain_runs(benchmark, gpt2):
    """Both sides as a user runs them: load the model, then run (the diff does the same)."""
    model, feeds = gpt2

    def both():
        ReferenceEvaluator(model).run(None, feeds)
        InferenceSession(model.SerializeToString()).run(None, feeds)

    benchmark.extra_info["peak_mb"] = round(_peak_mb(both), 1)
    benchmark.pedantic(both, rounds=5, warmup_rounds=1)


@pytest.mark.benchmark(group="diff-gpt2-seq128")
def test_diff_reference_vs_optimized(benchmark, gpt2):
    model, feeds = gpt2

    def diff():
        report = diff_models(model, feeds=feeds)
        assert report.exit_code == 0, "no fault was planted: the diff must find none"

    benchmark.extra_info["peak_mb"] = round(_peak_mb(diff), 1)
    benchmark.pedantic(diff, rounds=5, warmup_rounds=1)
