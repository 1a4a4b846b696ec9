"""Greedy generation with a KV cache through onnxruntime's API, on a random-weight Llama-style
decoder made here (benchmarks/decoders.py writes it as torch.onnx's dynamo exporter does).

    python examples/generate.py                  # optimized (import optimized as ort)
    python examples/generate.py --onnxruntime    # the same loop on onnxruntime

The cache never leaves the runtime: each step's present.N.key/value outputs come back as
OrtValues and are bound, as they are, as the next step's past_key_values.N.key/value inputs.
Nothing is copied to NumPy but the logits of the last position. On optimized, every step has
a new cache length, so a new input signature: from the fifth run on they all go through one
compiled step table that the plan shares between signatures differing only in that length
(optimized/plan_shapes.py).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ holds the builders
from benchmarks.decoders import SIZES, build_llama


def generate(session, prompt: list[int], max_new_tokens: int) -> list[int]:
    """The greedy continuation of prompt (batch 1): max_new_tokens token ids."""
    names = [o.name for o in session.get_outputs()]
    presents = [n for n in names if n.startswith("present.")]
    binding = session.io_binding()
    for arg in session.get_inputs():
        if arg.name.startswith("past_key_values."):  # an empty cache: [1, kv_heads, 0, head_dim]
            _, kv_heads, _, head_dim = arg.shape
            binding.bind_cpu_input(arg.name, np.zeros((1, kv_heads, 0, head_dim), np.float32))

    tokens, past_length, generated = list(prompt), 0, []
    while len(generated) < max_new_tokens:
        length = past_length + len(tokens)
        binding.bind_cpu_input("input_ids", np.array([tokens], np.int64))
        binding.bind_cpu_input("attention_mask", np.ones((1, length), np.int64))
        binding.bind_cpu_input("position_ids", np.arange(past_length, length, dtype=np.int64)[None])
        for name in names:  # a new OrtValue for each output (onnxruntime would otherwise write
            binding.bind_output(name, "cpu")  # into the last run's, which are bound as the past)
        session.run_with_iobinding(binding)
        values = dict(zip(names, binding.get_outputs()))
        generated.append(int(values["logits"].numpy()[0, -1].argmax()))
        for name in presents:  # this step's cache is the next step's past, not copied
            binding.bind_ortvalue_input(name.replace("present.", "past_key_values."), values[name])
        tokens, past_length = generated[-1:], length
    return generated


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--onnxruntime", action="store_true", help="run on onnxruntime")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.onnxruntime:
        import onnxruntime as ort
    else:
        import optimized as ort

    model = build_llama(SIZES["tiny"])  # 2 layers, hidden 64, vocabulary 300, random weights
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    prompt = [1, 17, 42, 99, 7, 250, 3, 64]
    generate(session, prompt, 2)  # warm-up
    start = time.perf_counter()
    tokens = generate(session, prompt, args.new_tokens)
    seconds = time.perf_counter() - start
    print(f"runtime: {ort.__name__} {ort.__version__}")
    print(f"prompt: {prompt}")
    print(f"generated: {tokens}")
    print(f"{len(tokens)} tokens in {seconds * 1e3:.1f} ms: {len(tokens) / seconds:.0f} tokens/s "
          f"(prefill of {len(prompt)} tokens included)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
