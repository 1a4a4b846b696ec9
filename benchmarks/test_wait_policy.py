"""How long libgomp's idle threads spin, and what that costs on a busy machine.

optimized's OpenMP pool is GNU OpenMP, whose idle threads spin GOMP_SPINCOUNT rounds before
they sleep (optimized/kernels.py sets 1500000 unless the user set OMP_WAIT_POLICY or
GOMP_SPINCOUNT; libgomp's own default is 300000). One benchmark per model and thread count
(group `wait-<model>-t<threads>`): optimized under each setting of SETTINGS and onnxruntime, each
in its own process (benchmarks/isolated.py, the setting in the worker's environment before it
imports optimized), rounds alternated. extra_info holds the load average around the test and,
per runtime, pytest-benchmark's Stats over the worker-measured seconds per call.

    python -m pytest benchmarks/test_wait_policy.py --benchmark-only -q \\
        --benchmark-json /tmp/wait.json
"""
from __future__ import annotations

import os

import pytest

from benchmarks.isolated import IsolatedPair, WorkerSpec
from benchmarks.test_optimized_vs_ort import runtime_record

SETTINGS = {
    "libgomp-default": {"GOMP_SPINCOUNT": "300000"},  # what libgomp does with neither variable
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},  # sleep at once
    "spin1000": {"GOMP_SPINCOUNT": "1000"},
    "spin10000": {"GOMP_SPINCOUNT": "10000"},
    "spin100000": {"GOMP_SPINCOUNT": "100000"},
    "spin1500000": {},  # optimized's default
}
MODELS = ["light_resnet50", "gpt2_seq1", "llama_decode", "llama_prefill"]
ROUNDS = 9
ITERATIONS = {"gpt2_seq1": 5, "llama_decode": 5}


@pytest.mark.parametrize("threads", [1, 2], ids=lambda n: f"t{n}")
@pytest.mark.parametrize("name", MODELS)
def test_wait_policy(benchmark, name, threads):
    pytest.importorskip("onnxruntime", reason="the anchor runtime (extra 'anchors')")
    if any(k in os.environ for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")):
        pytest.skip("OMP_WAIT_POLICY or GOMP_SPINCOUNT is set here; the settings compared "
                    "need an environment without them")
    iterations = ITERATIONS.get(name, 1)
    specs = [WorkerSpec(setting, "benchmarks.sessions:optimized", (name, threads, 99), env=env)
             for setting, env in SETTINGS.items()]
    specs.append(WorkerSpec("onnxruntime", "benchmarks.sessions:onnxruntime", (name, threads)))
    benchmark.group = f"wait-{name}-t{threads}"
    benchmark.extra_info.update(model=name, threads=threads, iterations=iterations,
                                load_average_before=os.getloadavg()[0])
    with IsolatedPair(specs) as pair:
        pair.alternation_step(iterations)  # warm-up, not kept
        times: dict[str, list[float]] = {}
        benchmark.pedantic(pair.alternation_step, kwargs={"iterations": iterations,
                                                          "into": times}, rounds=ROUNDS)
        benchmark.extra_info["runtimes"] = {
            runtime: runtime_record(pair.info(runtime), times[runtime]) for runtime in pair.names}
    benchmark.extra_info["load_average_after"] = os.getloadavg()[0]
