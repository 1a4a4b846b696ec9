"""Peak memory of loading a model and running it once: optimized against onnxruntime (issue 16,
item 6; target: optimized's peak at most onnxruntime's, on light_vgg19 and the GPT block at
seq 128 and seq 1, at 1 and 2 threads).

Each load runs in a fresh Python process of its own, which imports the runtime, creates the
session from the model file (written once from benchmarks/models.py) and runs it once on the
benchmark feeds. It reports three peak resident set sizes, each VmHWM from /proc/self/status
(its own address space's high-water mark; ru_maxrss cannot serve, as Linux carries the
launching process's high-water mark into the exec'd child):

- `import_MB`: after the imports, before the session;
- `load_MB`: after the session is created (load only);
- `run_MB`: after the first run (load plus first run: the figure the target is about).

Rounds alternate the runtimes (optimized, onnxruntime, optimized, ...), so that a drifting
load on the shared machine hits both. A benchmark's pytest-benchmark time is the wall time of one
round (two child processes, imports included) and is not a comparison figure; the comparison is
in extra_info: per runtime the medians over the rounds, and `optimized_over_onnxruntime` the
ratios of those medians. optimized runs at level 99 (ORT_ENABLE_ALL), onnxruntime at
ORT_ENABLE_ALL, both with the same intra_op_num_threads.

    python -m pytest benchmarks/test_memory.py --benchmark-only -q \\
        --benchmark-json /tmp/memory.json

Before the figures count, the two runtimes' first outputs must agree (rtol 1e-3, atol 1e-4, as
in test_optimized_vs_ort.py).
"""
from __future__ import annotations

import functools
import os
import sys
import tempfile

import numpy as np
import onnx
import pytest

from benchmarks import models
from benchmarks.child_process import medians, run_json_child

ROUNDS = 3
THREADS = [1, 2]
MODELS = ["light_vgg19", "gpt2_seq128", "gpt2_seq1"]
RUNTIMES = ("optimized", "onnxruntime")
RTOL, ATOL = 1e-3, 1e-4

CHILD = r"""
import json, sys, time
import numpy as np
args = json.loads(sys.argv[1])
if args["runtime"] == "optimized":
    import optimized as rt
    import optimized.cpu  # the kernels' libraries, which a session loads, count as imports
else:
    import onnxruntime as rt
    rt.set_default_logger_severity(3)
def peak_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
feeds = dict(np.load(args["feeds"]))
import_mb = peak_mb()
options = rt.SessionOptions()
options.intra_op_num_threads = args["threads"]
options.inter_op_num_threads = 1  # as every other comparison in benchmarks/ sets both runtimes
options.execution_mode = rt.ExecutionMode.ORT_SEQUENTIAL
start = time.perf_counter()
session = rt.InferenceSession(args["model"], options, providers=["CPUExecutionProvider"])
load_s = time.perf_counter() - start
load_mb = peak_mb()
outputs = session.run(None, feeds)
run_mb = peak_mb()
np.savez(args["output"], *outputs)
print(json.dumps({"import_MB": import_mb, "load_MB": load_mb, "run_MB": run_mb, "load_s": load_s}))
"""


@functools.cache
def model_files(name: str) -> tuple[str, str]:
    """(model path, feeds path), written once per process to a temporary folder."""
    try:
        model, feeds = models.build(name)
    except FileNotFoundError as e:  # an onnx build without the light models
        pytest.skip(str(e))
    folder = tempfile.mkdtemp(prefix=f"memory_{name}_")
    path, feeds_path = os.path.join(folder, "model.onnx"), os.path.join(folder, "feeds.npz")
    onnx.save(model, path)
    np.savez(feeds_path, **feeds)
    return path, feeds_path


def load_in_child(runtime: str, model: str, feeds: str, threads: int, output: str) -> dict:
    args = {"runtime": runtime, "model": model, "feeds": feeds, "threads": threads,
            "output": output}
    return run_json_child(CHILD, args, f"{runtime} child on {model}")


def check_agree(name: str, outputs: dict) -> None:
    ours, theirs = (np.load(outputs[r]) for r in RUNTIMES)
    for key in ours.files:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=RTOL, atol=ATOL,
                                   err_msg=f"{name}: optimized and onnxruntime, output {key}")


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="peak RSS is read from /proc/self/status (Linux only)")
@pytest.mark.parametrize("threads", THREADS, ids=lambda n: f"t{n}")
@pytest.mark.parametrize("name", MODELS)
def test_peak_memory(benchmark, name, threads):
    pytest.importorskip("onnxruntime")  # the anchor
    path, feeds = model_files(name)
    folder = os.path.dirname(path)
    outputs = {r: os.path.join(folder, f"{r}_t{threads}.npz") for r in RUNTIMES}
    results: dict[str, list] = {r: [] for r in RUNTIMES}

    def one_round():
        for runtime in RUNTIMES:
            results[runtime].append(load_in_child(runtime, path, feeds, threads, outputs[runtime]))

    benchmark.group = f"memory-{name}-t{threads}"
    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1, warmup_rounds=0)
    check_agree(name, outputs)
    stats = {r: medians(results[r]) for r in RUNTIMES}
    benchmark.extra_info.update({
        "model": name, "threads": threads, "rounds": ROUNDS,
        "model_MB": os.path.getsize(path) / 2**20,
        **stats,
        "per_round": results,
        "optimized_over_onnxruntime": {
            key: stats["optimized"][key] / stats["onnxruntime"][key] for key in stats["optimized"]},
    })
