"""Single convolutions (bias and Relu, batch 1): oneDNN against our own kernel and
onnxruntime, each implementation in its own process, rounds alternated (benchmarks/isolated.py).

Implementations (WORKERS):
- onednn-blocked: optimized.kernels.OneDNNConv with layout "blocked" (oneDNN picks its layout,
  nChw8c on AVX2), NCHW in and out, so each call reorders the input and the output;
- onednn-native: the same primitive on buffers already in its layout (no reorders), what a
  plan that keeps the blocked layout between convolutions would pay;
- onednn-plain: OneDNNConv with layout "plain" (NCHW throughout);
- ours: optimized.kernels.conv2d (csrc/conv.c);
- onnxruntime: a Conv -> Relu model (fused into one FusedConv at ORT_ENABLE_ALL).

For each shape of SHAPES and each thread count, one benchmark
`test_conv[<shape>-t<threads>]`; its extra_info holds, per implementation, the median seconds
per call over the rounds and the GFLOP/s that gives (2 * multiply-adds / median), and the
GFLOP/s of the fastest round.  Outputs of
every NCHW implementation are checked against ours first.

    python -m pytest benchmarks/test_conv_onednn.py --benchmark-only -q \\
        --benchmark-json /tmp/conv.json
    python -m benchmarks.test_conv_onednn /tmp/conv.json     # the GFLOP/s table (Markdown)
"""
from __future__ import annotations

import json
import statistics
import sys

import numpy as np
import pytest

from benchmarks.isolated import IsolatedPair, WorkerSpec, Workload

# name: (in_c, out_c, size, kernel, stride, group); pads keep "same" geometry (kernel // 2)
SHAPES = {
    "3x3_64-64_56": (64, 64, 56, 3, 1, 1),
    "3x3_256-256_14": (256, 256, 14, 3, 1, 1),
    "1x1_64-256_56": (64, 256, 56, 1, 1, 1),
    "3x3_512-512_7": (512, 512, 7, 3, 1, 1),
    "7x7s2_3-64_224": (3, 64, 224, 7, 2, 1),
    "dw3x3_144_56": (144, 144, 56, 3, 1, 144),
    # squeezenet's and shufflenet's 1x1 (grouped too) and stem shapes (csrc/conv_pointwise.c)
    "1x1_16-64_55": (16, 64, 55, 1, 1, 1),
    "1x1_512-1000_13": (512, 1000, 13, 1, 1, 1),
    "1x1g4_272-272_14": (272, 272, 14, 1, 1, 4),
    "1x1g4_544-544_7": (544, 544, 7, 1, 1, 4),
    "3x3s2_3-24_224": (3, 24, 224, 3, 2, 1),
    # squeezenet's and inception_v2's 3x3 (class spatial: oneDNN with our NHWC transposes)
    "3x3_16-64_55": (16, 64, 55, 3, 1, 1),
    "3x3_32-128_27": (32, 128, 27, 3, 1, 1),
    "3x3_48-192_13": (48, 192, 13, 3, 1, 1),
    "3x3_64-192_56": (64, 192, 56, 3, 1, 1),
    "3x3_64-96_28": (64, 96, 28, 3, 1, 1),
    "3x3_128-128_14": (128, 128, 14, 3, 1, 1),
}
# 1x1 convolutions of squeezenet, inception_v2 and resnet50 (csrc/conv_pointwise.c against
# onnxruntime only, test_pointwise): small planes, few input or few output channels.  The
# onnxruntime figure includes its NCHWc reorders of the input and output, which a model run
# pays only at the ends of a chain of convolutions; its profiler's Conv node time is the
# kernel alone.
POINTWISE_SHAPES = {
    "1x1_128-16_55": (128, 16, 55, 1, 1, 1),
    "1x1_64-16_55": (64, 16, 55, 1, 1, 1),
    "1x1_128-32_27": (128, 32, 27, 1, 1, 1),
    "1x1_32-128_27": (32, 128, 27, 1, 1, 1),
    "1x1_256-32_27": (256, 32, 27, 1, 1, 1),
    "1x1_64-256_13": (64, 256, 13, 1, 1, 1),
    "1x1_576-128_14": (576, 128, 14, 1, 1, 1),
    "1x1_576-96_14": (576, 96, 14, 1, 1, 1),
    "1x1_256-64_28": (256, 64, 28, 1, 1, 1),
    "1x1_1024-256_14": (1024, 256, 14, 1, 1, 1),
    "1x1_2048-512_7": (2048, 512, 7, 1, 1, 1),
}
POINTWISE_WORKERS = ["ours", "onnxruntime"]
WORKERS = ["onednn-blocked", "onednn-native", "onednn-plain", "ours", "onnxruntime"]
THREADS = [1, 2]
ROUNDS = 11
ROUND_SECONDS = 0.03  # each round repeats the call about this long (at a guessed 40 GFLOP/s)


def geometry(shape: str):
    in_c, out_c, size, kernel, stride, group = {**SHAPES, **POINTWISE_SHAPES}[shape]
    pad = kernel // 2
    out = (size + 2 * pad - kernel) // stride + 1
    flops = 2 * out_c * out * out * (in_c // group) * kernel * kernel
    return in_c, out_c, size, kernel, stride, group, pad, out, flops


def tensors(shape: str):
    in_c, out_c, size, kernel, _, group, _, _, _ = geometry(shape)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, in_c, size, size), dtype=np.float32)
    w = rng.standard_normal((out_c, in_c // group, kernel, kernel), dtype=np.float32) * 0.1
    b = rng.standard_normal(out_c, dtype=np.float32)
    w.flags.writeable = False
    return x, w, b


def iterations(shape: str) -> int:
    return max(1, int(ROUND_SECONDS * 40e9 / geometry(shape)[-1]))


def conv_workload(shape: str, implementation: str, threads: int) -> Workload:
    """The worker's factory: one convolution by one implementation at `threads` threads."""
    _, _, _, _kernel, stride, group, pad, _, _ = geometry(shape)
    x, w, b = tensors(shape)
    attrs = {"strides": [stride] * 2, "pads": [pad] * 4, "group": group}
    if implementation == "onnxruntime":
        return onnxruntime_workload(x, w, b, attrs, threads)
    from optimized import kernels

    kernels.set_num_threads(threads)
    if implementation == "ours":
        y = np.empty(kernels.conv2d(x, w, b, activation="Relu", **attrs).shape, np.float32)
        return Workload(lambda: kernels.conv2d(x, w, b, activation="Relu", out=y, **attrs))
    layout = "plain" if implementation == "onednn-plain" else "blocked"
    plan = kernels.OneDNNConv(x.shape, w, b, activation="Relu", layout=layout, **attrs)
    info = {"implementation": plan.implementation}
    if implementation == "onednn-native":
        rng = np.random.default_rng(1)
        xn = rng.standard_normal(plan.native_size("src"), dtype=np.float32)
        yn = np.empty(plan.native_size("dst"), np.float32)
        return Workload(lambda: plan.run_native(xn, yn), info)
    y = np.empty(plan.out_shape, np.float32)
    return Workload(lambda: plan(x, out=y), info)


def onnxruntime_workload(x, w, b, attrs, threads: int) -> Workload:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    y_shape = [None] * 4
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
         helper.make_node("Relu", ["c"], ["y"])],
        "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(np.array(w), "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return Workload(lambda: session.run(None, {"x": x})[0])


@pytest.mark.parametrize("threads", THREADS, ids=lambda t: f"t{t}")
@pytest.mark.parametrize("shape", list(SHAPES))
def test_conv(benchmark, shape, threads):
    pytest.importorskip("onnxruntime", reason="the comparison needs onnxruntime (extra bench)")
    from optimized import kernels

    if kernels.onednn_unavailable():
        pytest.skip(f"oneDNN: {kernels.onednn_unavailable()}")
    specs = [WorkerSpec(name, "benchmarks.test_conv_onednn:conv_workload",
                        (shape, name, threads)) for name in WORKERS]
    count = iterations(shape)
    with IsolatedPair(specs) as pair:
        expected = pair.outputs("ours")
        for name in WORKERS:
            if name not in ("ours", "onednn-native"):
                np.testing.assert_allclose(pair.outputs(name), expected, rtol=1e-3, atol=1e-3,
                                           err_msg=name)
        times = timed_rounds(benchmark, pair, count)
        flops = geometry(shape)[-1]
        benchmark.extra_info.update({
            "flops": flops, "threads": threads,
            "implementation": pair.info("onednn-blocked").get("implementation"),
            "plain_implementation": pair.info("onednn-plain").get("implementation"),
            "median_s": {n: statistics.median(t) for n, t in times.items()},
            "gflops": {n: flops / statistics.median(t) / 1e9 for n, t in times.items()},
            # the fastest round: on a machine shared with other work, closer to what the code
            # can do than the median, which the other work's load drags down
            "best_gflops": {n: flops / min(t) / 1e9 for n, t in times.items()},
        })


def timed_rounds(benchmark, pair: IsolatedPair, count: int) -> dict[str, list[float]]:
    """Seconds per call of each worker, one entry per round: a warm-up, then ROUNDS rounds
    with the workers alternating."""
    times: dict[str, list[float]] = {}
    pair.alternation_step(count)  # warm-up
    benchmark.pedantic(pair.alternation_step, args=(count, times), rounds=ROUNDS, iterations=1)
    return times


@pytest.mark.parametrize("threads", THREADS, ids=lambda t: f"t{t}")
@pytest.mark.parametrize("shape", list(POINTWISE_SHAPES))
def test_pointwise(benchmark, shape, threads):
    pytest.importorskip("onnxruntime", reason="the comparison needs onnxruntime (extra bench)")
    specs = [WorkerSpec(name, "benchmarks.test_conv_onednn:conv_workload",
                        (shape, name, threads)) for name in POINTWISE_WORKERS]
    count = iterations(shape)
    with IsolatedPair(specs) as pair:
        np.testing.assert_allclose(pair.outputs("onnxruntime"), pair.outputs("ours"), rtol=1e-3,
                                   atol=1e-3)
        times = timed_rounds(benchmark, pair, count)
        flops = geometry(shape)[-1]
        benchmark.extra_info.update({
            "flops": flops, "threads": threads,
            "median_s": {n: statistics.median(t) for n, t in times.items()},
            "ratio": statistics.median(times["ours"]) / statistics.median(times["onnxruntime"]),
        })


def table(path: str, key: str = "gflops") -> str:
    """A Markdown table of GFLOP/s (median round, or with key="best_gflops" the fastest) from a
    --benchmark-json file of this module's tests."""
    with open(path) as f:
        runs = [b for b in json.load(f)["benchmarks"] if b["name"].startswith("test_conv[")]
    lines = ["| convolution | threads | " + " | ".join(WORKERS) + " | oneDNN kernel (blocked / plain) |",
             "|---" * (len(WORKERS) + 3) + "|"]
    for run in runs:
        info = run["extra_info"]
        shape = run["params"]["shape"]
        cells = " | ".join(f"{info[key][n]:.1f}" for n in WORKERS)
        lines.append(f"| {shape} | {info['threads']} | {cells} | {info['implementation']} / "
                     f"{info['plain_implementation']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print("GFLOP/s of the median round\n")
    print(table(sys.argv[1]))
    print("\nGFLOP/s of the fastest round\n")
    print(table(sys.argv[1], "best_gflops"))
