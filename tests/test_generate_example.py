"""examples/generate.py: greedy generation with the KV cache bound through IOBinding gives
exactly the tokens the reference evaluator gives, at every optimization level, and the same
file runs unchanged on onnxruntime."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import optimized
from benchmarks.decoders import SIZES, build_llama
from reference import ReferenceEvaluator

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "generate.py"
PROMPT = [1, 17, 42, 99, 7, 250, 3, 64]
NEW_TOKENS = 24


def load_example():
    spec = importlib.util.spec_from_file_location("generate_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_generate(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """The same greedy decoding written with plain run() and NumPy values."""
    evaluator = ReferenceEvaluator(model)
    names = [o.name for o in model.graph.output]
    past = {}
    for arg in model.graph.input:
        if arg.name.startswith("past_key_values."):
            _, kv_heads, _, head_dim = (d.dim_value for d in arg.type.tensor_type.shape.dim)
            past[arg.name] = np.zeros((1, kv_heads, 0, head_dim), np.float32)
    tokens, past_length, generated = list(prompt), 0, []
    while len(generated) < max_new_tokens:
        length = past_length + len(tokens)
        feeds = {"input_ids": np.array([tokens], np.int64),
                 "attention_mask": np.ones((1, length), np.int64),
                 "position_ids": np.arange(past_length, length, dtype=np.int64)[None], **past}
        values = dict(zip(names, evaluator.run(None, feeds)))
        generated.append(int(values["logits"][0, -1].argmax()))
        past = {n.replace("present.", "past_key_values."): v for n, v in values.items()
                if n.startswith("present.")}
        tokens, past_length = generated[-1:], length
    return generated


@pytest.fixture(scope="module")
def model():
    return build_llama(SIZES["tiny"])


@pytest.fixture(scope="module")
def expected(model):
    tokens = reference_generate(model, PROMPT, NEW_TOKENS)
    assert len(set(tokens)) > 3, f"a degenerate continuation tests little: {tokens}"
    return tokens


@pytest.mark.parametrize("level", [0, 1, 2, 99])
def test_same_tokens_as_reference(model, expected, level):
    options = optimized.SessionOptions()
    options.graph_optimization_level = level
    session = optimized.InferenceSession(model.SerializeToString(), options)
    assert load_example().generate(session, PROMPT, NEW_TOKENS) == expected


def test_cache_is_handed_on_without_copies(model, monkeypatch):
    """Each step's present OrtValues are bound as the next step's past: the array a step reads
    as past_key_values.0.key is the very array the step before returned as present.0.key."""
    session = optimized.InferenceSession(model.SerializeToString())
    seen = []
    real = session.run_with_iobinding

    def spy(binding, run_options=None):
        seen.append(binding.feeds()["past_key_values.0.key"])
        real(binding, run_options)
        seen.append(dict(zip([o.name for o in session.get_outputs()],
                             binding.get_outputs()))["present.0.key"].value())

    monkeypatch.setattr(session, "run_with_iobinding", spy)
    load_example().generate(session, PROMPT, 4)
    presents, pasts = seen[1::2], seen[0::2]
    assert all(past is present for present, past in zip(presents, pasts[1:]))
    assert [p.shape[2] for p in presents] == [8, 9, 10, 11]


def run_script(*args: str) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLE), "--new-tokens", "12", *args],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return next(line for line in done.stdout.splitlines() if line.startswith("generated:"))


def test_script_runs_unchanged_on_onnxruntime():
    pytest.importorskip("onnxruntime", reason="the anchor runtime (extra 'anchors')")
    assert run_script() == run_script("--onnxruntime")
