"""Decoder language models with a KV cache, optimized against onnxruntime, each runtime in its own
process (benchmarks/isolated.py), rounds alternated.

Models (benchmarks/decoders.py, the "bench" size: hidden 512, 8 layers, 8 query and 2 KV heads,
intermediate 1408, vocabulary 32000, batch 1): `llama` and `phi3` (fused qkv and gate_up
projections cut by Slice) in float32, and `llama_4bit` and `phi3_4bit`, the same models with
every MatMul as com.microsoft MatMulNBits (4 bits, blocks of 32, zero points) written by
onnxruntime's MatMulNBitsQuantizer.

Workloads, each at 1 and 2 threads (group `<model>-<workload>-t<threads>`):
- `prefill`: one run() over a 128-token prompt with an empty cache (all outputs as NumPy);
- `decode`: one decode step of one token after 128 cached positions, as examples/generate.py
  runs it: the cache bound as it is (OrtValues) through IOBinding, new output OrtValues, the
  last logits read as NumPy. extra_info has, per runtime, `tokens_per_s` (1 / median) and
  `weight_GB_per_s`, the bytes of weights a step reads (every MatMul/MatMulNBits initializer,
  codes, scales and zero points, plus one embedding row; decoders.weight_bytes) over the median;
- `generate`: examples/generate.py's greedy loop, 64 new tokens after the 128-token prompt
  (its prefill included); `tokens_per_s` is 64 / median. Unlike `decode`, whose rounds repeat
  one step with the same shapes, every step here has a new cache length (optimized runs them
  through one step table shared by those signatures, optimized/plan_shapes.py, after its
  first generation has taught it the pattern).

optimized runs at level 99 (ORT_ENABLE_ALL); onnxruntime at ORT_ENABLE_ALL, sequential,
inter_op_num_threads 1; both with the same intra_op_num_threads. The test's process builds each
model once (seeded), saves it with its feeds, and computes the reference evaluator's results;
the workers load those files, so no worker imports the other runtime.

Before timing, each runtime's results are checked against the reference evaluator's: prefill's
logits and cache, and the decode step's logits and cache, with rtol=1e-3 and atol=1e-3 (sums of
512 to 1408 float32 products through 8 layers, blocked differently; 4-bit weights dequantized
in another order), and the generated tokens exactly.

    python -m pytest benchmarks/test_decoders_vs_ort.py --benchmark-only -q \\
        -k "llama and decode" --benchmark-json /tmp/decoders.json
"""
from __future__ import annotations

import functools
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from pytest_benchmark.stats import Stats

from benchmarks import decoders
from benchmarks.isolated import IsolatedPair, WorkerSpec, Workload

THREADS = [1, 2]
MODELS = ["llama", "llama_4bit", "phi3", "phi3_4bit"]
PROMPT, NEW_TOKENS = 128, 64
RTOL, ATOL = 1e-3, 1e-3
ROUNDS = {"prefill": 7, "decode": 15, "generate": 3}
ITERATIONS = {"prefill": 1, "decode": 3, "generate": 1}
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "generate.py"
HERE = "benchmarks.test_decoders_vs_ort"


def build_model(name: str) -> onnx.ModelProto:
    cfg = decoders.SIZES["bench"]
    model = decoders.build_phi3(cfg) if name.startswith("phi3") else decoders.build_llama(cfg)
    return decoders.quantized_4bit(model) if name.endswith("_4bit") else model


def load_example():
    spec = importlib.util.spec_from_file_location("generate_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prompt_tokens(model) -> np.ndarray:
    return decoders.random_tokens(model, (1, PROMPT), seed=7)


def prefill_feeds(model) -> dict:
    return {**decoders.step_feeds(prompt_tokens(model), 0), **decoders.empty_past(model)}


def as_past(names: list[str], outputs: list) -> dict:
    return {n.replace("present.", "past_key_values."): v for n, v in zip(names, outputs)
            if n.startswith("present.")}


# workers ------------------------------------------------------------------------------------
def session_for(runtime: str, path: str, threads: int, profile_prefix: str | None = None):
    if runtime == "optimized":
        import optimized as ort

        options = ort.SessionOptions()
    else:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    start = time.perf_counter()
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return session, {"creation_seconds": time.perf_counter() - start, "version": ort.__version__}


def workload(runtime: str, directory: str, kind: str, threads: int) -> Workload:
    """The factory each worker runs: a session of `runtime` over the model saved in directory,
    and a step of `kind` (prefill, decode or generate)."""
    session, info = session_for(runtime, str(Path(directory) / "model.onnx"), threads)
    data = dict(np.load(Path(directory) / "feeds.npz"))
    names = [o.name for o in session.get_outputs()]
    if kind == "prefill":
        feeds = {k[len("prefill/"):]: v for k, v in data.items() if k.startswith("prefill/")}
        return Workload(step=lambda: session.run(None, feeds), info=info)
    if kind == "generate":
        generate, prompt = load_example().generate, data["prompt"][0].tolist()
        return Workload(step=lambda: generate(session, prompt, NEW_TOKENS), info=info)
    binding = session.io_binding()
    for name, value in data.items():
        if name.startswith("decode/"):
            binding.bind_cpu_input(name[len("decode/"):], value)

    def step():
        for name in names:
            binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
        return binding.get_outputs()[0].numpy()[0, -1]

    def all_outputs():
        step()
        return [v.numpy() for v in binding.get_outputs()]

    def profile(runs: int = 10) -> dict:
        return decode_profile(runtime, directory, threads, runs)

    return Workload(step=step, info=info, commands={"all_outputs": all_outputs, "profile": profile})


def decode_profile(runtime: str, directory: str, threads: int, runs: int) -> dict:
    """{op type: {"nodes": node events per step, "us": microseconds per step, "kernels": what
    ran them}} over `runs` decode steps of a profiling session, after one warm-up step (left
    out: the first of every step's events in time order). Steps go through run() with NumPy
    feeds, since optimized profiles run() only."""
    data = dict(np.load(Path(directory) / "feeds.npz"))
    feeds = {k[len("decode/"):]: v for k, v in data.items() if k.startswith("decode/")}
    with tempfile.TemporaryDirectory() as tmp:
        session, _ = session_for(runtime, str(Path(directory) / "model.onnx"), threads,
                                 profile_prefix=str(Path(tmp) / "profile"))
        for _ in range(runs + 1):
            session.run(None, feeds)
        with open(session.end_profiling()) as f:
            events = [e for e in json.load(f) if e.get("cat") == "Node"
                      and not e.get("name", "").endswith(("_fence_before", "_fence_after"))]
    events.sort(key=lambda e: e.get("ts", 0))
    summary: dict = {}
    for event in events[len(events) // (runs + 1):]:
        args = event.get("args", {})
        row = summary.setdefault(args.get("op_name", "?"), {"nodes": 0.0, "us": 0.0, "kernels": []})
        row["nodes"] += 1 / runs
        row["us"] += event.get("dur", 0) / runs
        kernel = args.get("kernel", args.get("provider", ""))
        if kernel not in row["kernels"]:
            row["kernels"].append(kernel)
    return summary


def format_profile(summary: dict, top: int = 15) -> str:
    total = sum(v["us"] for v in summary.values()) or 1.0
    lines = [f"  {'op':<24} {'nodes':>6} {'us/step':>9} {'share':>6}  kernels"]
    for op, v in sorted(summary.items(), key=lambda kv: -kv[1]["us"])[:top]:
        lines.append(f"  {op:<24} {v['nodes']:>6.0f} {v['us']:>9.0f} {v['us'] / total:>6.1%}  "
                     f"{','.join(v['kernels'])}")
    lines.append(f"  {'all node events':<24} {sum(v['nodes'] for v in summary.values()):>6.0f} "
                 f"{total:>9.0f}")
    return "\n".join(lines)


# the test's process ---------------------------------------------------------------------------
@functools.cache
def prepared(name: str, directory: str) -> dict:
    """The model and feeds saved in directory, and the reference evaluator's results."""
    from reference import ReferenceEvaluator

    model = build_model(name)
    onnx.save(model, str(Path(directory) / "model.onnx"))
    evaluator = ReferenceEvaluator(model)
    names = [o.name for o in model.graph.output]
    feeds = prefill_feeds(model)
    prefill = evaluator.run(None, feeds)
    prompt = prompt_tokens(model)
    next_token = np.array([[prefill[0][0, -1].argmax()]], np.int64)
    decode_feeds = {**decoders.step_feeds(next_token, PROMPT), **as_past(names, prefill)}
    decode = evaluator.run(None, decode_feeds)
    np.savez(Path(directory) / "feeds.npz", prompt=prompt,
             **{f"prefill/{k}": v for k, v in feeds.items()},
             **{f"decode/{k}": v for k, v in decode_feeds.items()})
    return {"prefill": prefill, "decode": decode, "weight_bytes": decoders.weight_bytes(model),
            "nodes": len(model.graph.node), "model": model, "prompt": prompt}


@functools.cache
def reference_generation(name: str, directory: str) -> list[int]:
    from reference import ReferenceEvaluator

    files = prepared(name, directory)
    return reference_tokens(ReferenceEvaluator(files["model"]), files["model"], files["prompt"])


def reference_tokens(evaluator, model, prompt: np.ndarray) -> list[int]:
    """The greedy continuation by the reference evaluator (plain run(), NumPy values)."""
    names = [o.name for o in model.graph.output]
    past, tokens, past_length, generated = decoders.empty_past(model), prompt, 0, []
    while len(generated) < NEW_TOKENS:
        values = evaluator.run(None, {**decoders.step_feeds(tokens, past_length), **past})
        generated.append(int(values[0][0, -1].argmax()))
        past, past_length = as_past(names, values), past_length + tokens.shape[1]
        tokens = np.array([[generated[-1]]], np.int64)
    return generated


def check(runtime: str, kind: str, expected, got) -> None:
    if kind == "generate":
        assert got == expected, f"{runtime} generated {got}, the reference {expected}"
        return
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape, f"{runtime} {kind} output {i}: {g.shape}, expected {e.shape}"
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL, err_msg=f"{runtime} {kind} output {i}")


def runtime_record(info: dict, seconds: list[float], kind: str, weight_bytes: int) -> dict:
    stats = Stats()
    for s in seconds:
        stats.update(s)
    record = {**stats.as_dict(), "data": list(seconds), **info}
    tokens = {"prefill": PROMPT, "decode": 1, "generate": NEW_TOKENS}[kind]
    record["tokens_per_s"] = tokens / stats.median
    if kind == "decode":
        record["weight_GB_per_s"] = weight_bytes / stats.median / 1e9
    return record


@pytest.fixture(scope="session")
def directories(tmp_path_factory):
    return {name: str(tmp_path_factory.mktemp(name)) for name in MODELS}


@pytest.mark.parametrize("threads", THREADS, ids=lambda n: f"t{n}")
@pytest.mark.parametrize("kind", list(ROUNDS))
@pytest.mark.parametrize("name", MODELS)
def test_decoder(benchmark, directories, name, kind, threads):
    pytest.importorskip("onnxruntime", reason="the anchor runtime (extra 'anchors')")
    expected = prepared(name, directories[name])
    specs = [WorkerSpec(runtime, f"{HERE}:workload", (runtime, directories[name], kind, threads))
             for runtime in ("optimized", "onnxruntime")]
    benchmark.group = f"{name}-{kind}-t{threads}"
    benchmark.extra_info.update(model=name, workload=kind, threads=threads, nodes=expected["nodes"],
                                weight_bytes=expected["weight_bytes"], prompt=PROMPT,
                                new_tokens=NEW_TOKENS if kind == "generate" else None)
    iterations = ITERATIONS[kind]
    with IsolatedPair(specs) as pair:
        for runtime in pair.names:
            got = (pair.command(runtime, "all_outputs") if kind == "decode"
                   else pair.outputs(runtime))
            check(runtime, kind, reference_generation(name, directories[name])
                  if kind == "generate" else expected[kind], got)
        pair.alternation_step(iterations)  # warm-up, not kept
        times: dict[str, list[float]] = {}
        benchmark.pedantic(pair.alternation_step, kwargs={"iterations": iterations, "into": times},
                           rounds=ROUNDS[kind])
        benchmark.extra_info["runtimes"] = {
            runtime: runtime_record(pair.info(runtime), times[runtime], kind,
                                    expected["weight_bytes"]) for runtime in pair.names}
    medians = {r: v["median"] for r, v in benchmark.extra_info["runtimes"].items()}
    benchmark.extra_info["optimized_over_onnxruntime"] = medians["optimized"] / medians["onnxruntime"]


def main(argv: list[str]) -> int:
    """python -m benchmarks.test_decoders_vs_ort MODEL THREADS [RUNS]: where a decode step's time
    goes in each runtime (each in its own process), by op type."""
    if len(argv) not in (2, 3):
        print("usage: python -m benchmarks.test_decoders_vs_ort MODEL THREADS [RUNS]", file=sys.stderr)
        return 2
    name, threads, runs = argv[0], int(argv[1]), int(argv[2]) if len(argv) == 3 else 10
    with tempfile.TemporaryDirectory() as directory:
        expected = prepared(name, directory)
        specs = [WorkerSpec(runtime, f"{HERE}:workload", (runtime, directory, "decode", threads))
                 for runtime in ("optimized", "onnxruntime")]
        with IsolatedPair(specs) as pair:
            for runtime in pair.names:
                print(f"{runtime}: {name} decode step after {PROMPT} tokens, {threads} thread(s), "
                      f"{expected['nodes']} nodes in the model, mean of {runs} steps")
                print(format_profile(pair.command(runtime, "profile", runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
