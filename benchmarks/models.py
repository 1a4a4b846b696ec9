"""The models the optimized-vs-onnxruntime benchmarks time, and the feeds they get.

Built with onnx.helper in the decomposed form a PyTorch exporter writes at opset 17 (LayerNorm
as ReduceMean/Sub/Pow/Sqrt/Div, Gelu as Erf or Tanh arithmetic, attention as Reshape/Transpose
head split, MatMul, scale, mask, Softmax, MatMul and merge), with seeded random float32 weights:

- gpt2_seq128: a GPT-2-small-like decoder (d=768, 12 heads, 2 layers, tanh Gelu) at prefill;
- gpt2_seq1: the same decoder for one new token over a KV cache of 127 past positions;
- bert_layer: a BERT-base-like encoder layer (d=768, 12 heads, FFN 3072, erf Gelu, padding mask);
- chain100: 100 small elementwise ops on a [1, 64] tensor, for per-call overhead;
- the light models that ship in the onnx package (light_resnet50, ...);
- small models as torch.onnx writes them (benchmarks/torch_style.py): bert_classifier
  (bert-mini's shape, sequence 128), vit (96x96 image, 16x16 patches, 4 layers of 192),
  mobilenet_v3_small (width 0.5, 224x224);
- the Llama-style decoder of benchmarks/decoders.py at its "tiny" size: llama_prefill over a
  PROMPT-token prompt with an empty cache, llama_decode for one token after PROMPT cached
  positions (the cache seeded random values).

    python -m benchmarks.models OUT_DIR      # writes every model as OUT_DIR/<name>.onnx
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conformance.corpus import light_input

OPSET = 17
D_MODEL = 768
HEADS = 12
HEAD_DIM = D_MODEL // HEADS
FFN = 3072
GPT2_LAYERS = 2
PAST = 127
SEQ = 128
LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LIGHT_MODELS = ["resnet50", "vgg19", "densenet121", "inception_v2", "squeezenet", "shufflenet"]


class GraphBuilder:
    """Nodes and initializers with unique names, so a block can be written as plain calls."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, value, hint: str = "c") -> str:
        name = self.name(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, shape, scale: float, hint: str, offset: float = 0.0) -> str:
        value = offset + scale * self.rng.standard_normal(shape)
        return self.const(value.astype(np.float32), hint)

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs):
        names = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=names[0], **attrs))
        return names[0] if outputs == 1 else names

    def f32(self, value: float) -> str:
        return self.const(np.array(value, dtype=np.float32))

    def i64(self, values) -> str:
        return self.const(np.array(values, dtype=np.int64), "shape")


# exporter-style building blocks ----------------------------------------------------------------

def linear(g: GraphBuilder, x: str, n_in: int, n_out: int, hint: str) -> str:
    """MatMul + Add, as torch.nn.Linear exports for 3-D inputs."""
    w = g.weight((n_in, n_out), 0.02, f"{hint}_weight")
    b = g.weight((n_out,), 0.02, f"{hint}_bias")
    return g.op("Add", g.op("MatMul", x, w), b)


def layer_norm(g: GraphBuilder, x: str, hint: str, eps: float = 1e-5) -> str:
    mean = g.op("ReduceMean", x, axes=[-1], keepdims=1)
    centred = g.op("Sub", x, mean)
    variance = g.op("ReduceMean", g.op("Pow", centred, g.f32(2.0)), axes=[-1], keepdims=1)
    normed = g.op("Div", centred, g.op("Sqrt", g.op("Add", variance, g.f32(eps))))
    gamma = g.weight((D_MODEL,), 0.1, f"{hint}_gamma", offset=1.0)
    beta = g.weight((D_MODEL,), 0.1, f"{hint}_beta")
    return g.op("Add", g.op("Mul", normed, gamma), beta)


def gelu_tanh(g: GraphBuilder, x: str) -> str:
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), GPT-2's gelu_new."""
    cube = g.op("Mul", g.op("Pow", x, g.f32(3.0)), g.f32(0.044715))
    inner = g.op("Mul", g.op("Add", x, cube), g.f32(math.sqrt(2.0 / math.pi)))
    one_plus = g.op("Add", g.op("Tanh", inner), g.f32(1.0))
    return g.op("Mul", g.op("Mul", g.f32(0.5), x), one_plus)


def gelu_erf(g: GraphBuilder, x: str) -> str:
    """x * 0.5 * (1 + erf(x / sqrt(2))), BERT's exact Gelu."""
    one_plus = g.op("Add", g.op("Erf", g.op("Div", x, g.f32(math.sqrt(2.0)))), g.f32(1.0))
    return g.op("Mul", g.op("Mul", x, one_plus), g.f32(0.5))


def split_heads(g: GraphBuilder, x: str, perm: list[int], batch: int = 1) -> str:
    """[B, S, 768] -> [B, S, 12, 64] -> transposed by perm."""
    return g.op("Transpose", g.op("Reshape", x, g.i64([batch, -1, HEADS, HEAD_DIM])), perm=perm)


def merge_heads(g: GraphBuilder, x: str, batch: int = 1) -> str:
    """[B, 12, S, 64] -> [B, S, 768]."""
    return g.op("Reshape", g.op("Transpose", x, perm=[0, 2, 1, 3]), g.i64([batch, -1, D_MODEL]))


def attend(g: GraphBuilder, q: str, k_transposed: str, v: str, mask: str) -> str:
    """softmax(q k^T / sqrt(64) + mask) v, with q, v as [1, 12, S, 64] and k^T [1, 12, 64, T]."""
    scores = g.op("Div", g.op("MatMul", q, k_transposed), g.f32(math.sqrt(HEAD_DIM)))
    probs = g.op("Softmax", g.op("Add", scores, mask), axis=-1)
    return g.op("MatMul", probs, v)


# GPT-2 -----------------------------------------------------------------------------------------

def causal_mask(seq: int, past: int) -> np.ndarray:
    """Additive mask [1, 1, seq, past+seq]: query i sees keys up to past+i, the rest get -1e4."""
    total = past + seq
    allowed = np.arange(total)[None, :] <= (past + np.arange(seq))[:, None]
    return np.where(allowed, 0.0, -1e4).astype(np.float32).reshape(1, 1, seq, total)


def gpt2_layer(g: GraphBuilder, x: str, mask: str, past: tuple[str, str] | None, i: int,
               batch: int = 1):
    """Pre-LN decoder layer; returns (new hidden, present_key, present_value)."""
    qkv = linear(g, layer_norm(g, x, f"h{i}_ln_1"), D_MODEL, 3 * D_MODEL, f"h{i}_c_attn")
    q, k, v = g.op("Split", qkv, g.i64([D_MODEL] * 3), outputs=3, axis=2)
    q = split_heads(g, q, [0, 2, 1, 3], batch)
    k = split_heads(g, k, [0, 2, 1, 3], batch)
    v = split_heads(g, v, [0, 2, 1, 3], batch)
    if past is not None:
        k = g.op("Concat", past[0], k, axis=2)
        v = g.op("Concat", past[1], v, axis=2)
    k_transposed = g.op("Transpose", k, perm=[0, 1, 3, 2])
    context = merge_heads(g, attend(g, q, k_transposed, v, mask), batch)
    x = g.op("Add", x, linear(g, context, D_MODEL, D_MODEL, f"h{i}_c_proj"))
    hidden = gelu_tanh(g, linear(g, layer_norm(g, x, f"h{i}_ln_2"), D_MODEL, FFN, f"h{i}_c_fc"))
    x = g.op("Add", x, linear(g, hidden, FFN, D_MODEL, f"h{i}_mlp_proj"))
    return x, k, v


def gpt2_block(seq: int, past: int = 0, seed: int = 0, batch: int = 1) -> onnx.ModelProto:
    """A 2-layer GPT-2-small-like decoder over hidden states [1, seq, 768]; with past > 0 it
    takes past_key_i/past_value_i [1, 12, past, 64] and concatenates the new K/V to them.
    Outputs the final LayerNorm's result and present_key_i/present_value_i per layer."""
    g = GraphBuilder(seed)
    inputs = [helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, [batch, seq, D_MODEL])]
    outputs = []
    mask = g.const(causal_mask(seq, past), "causal_mask")
    x = "hidden_states"
    for i in range(GPT2_LAYERS):
        cache = None
        if past:
            cache = (f"past_key_{i}", f"past_value_{i}")
            inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [batch, HEADS, past, HEAD_DIM])
                       for n in cache]
        x, present_k, present_v = gpt2_layer(g, x, mask, cache, i, batch)
        for kind, value in (("key", present_k), ("value", present_v)):
            name = f"present_{kind}_{i}"
            g.nodes.append(helper.make_node("Identity", [value], [name], name=name))
            outputs.append(helper.make_tensor_value_info(
                name, TensorProto.FLOAT, [batch, HEADS, past + seq, HEAD_DIM]))
    g.nodes.append(helper.make_node("Identity", [layer_norm(g, x, "ln_f")], ["last_hidden_state"],
                                    name="last_hidden_state"))
    outputs.insert(0, helper.make_tensor_value_info(
        "last_hidden_state", TensorProto.FLOAT, [batch, seq, D_MODEL]))
    name = f"gpt2_seq{seq}" + (f"_past{past}" if past else "") + (f"_batch{batch}" if batch != 1 else "")
    return make_model(g, name, inputs, outputs)


# BERT ------------------------------------------------------------------------------------------

def bert_layer(seq: int = SEQ, seed: int = 1) -> onnx.ModelProto:
    """One post-LN BERT-base-like encoder layer over hidden states [1, seq, 768] with an int64
    attention_mask [1, seq] (1 = token, 0 = padding), turned into (1 - mask) * -10000."""
    g = GraphBuilder(seed)
    x = "hidden_states"
    inputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, seq, D_MODEL]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, seq])]
    mask = g.op("Unsqueeze", "attention_mask", g.i64([1, 2]))
    mask = g.op("Cast", mask, to=TensorProto.FLOAT)
    mask = g.op("Mul", g.op("Sub", g.f32(1.0), mask), g.f32(-10000.0))
    q = split_heads(g, linear(g, x, D_MODEL, D_MODEL, "query"), [0, 2, 1, 3])
    k = split_heads(g, linear(g, x, D_MODEL, D_MODEL, "key"), [0, 2, 3, 1])
    v = split_heads(g, linear(g, x, D_MODEL, D_MODEL, "value"), [0, 2, 1, 3])
    context = merge_heads(g, attend(g, q, k, v, mask))
    attention = linear(g, context, D_MODEL, D_MODEL, "attention_output")
    x = layer_norm(g, g.op("Add", attention, x), "attention_ln", eps=1e-12)
    hidden = gelu_erf(g, linear(g, x, D_MODEL, FFN, "intermediate"))
    out = layer_norm(g, g.op("Add", linear(g, hidden, FFN, D_MODEL, "output"), x), "output_ln",
                     eps=1e-12)
    g.nodes.append(helper.make_node("Identity", [out], ["last_hidden_state"], name="output"))
    outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                             [1, seq, D_MODEL])]
    return make_model(g, f"bert_layer_seq{seq}", inputs, outputs)


# per-call overhead -----------------------------------------------------------------------------

def elementwise_chain(length: int = 100, width: int = 64, seed: int = 2) -> onnx.ModelProto:
    """Add, Mul, Relu, Sigmoid, Add, ... on [1, width] float32: `length` nodes, each tiny."""
    g = GraphBuilder(seed)
    x = "x"
    cycle = ["Add", "Mul", "Relu", "Sigmoid"]
    for i in range(length):
        op_type = cycle[i % len(cycle)]
        if op_type == "Add":
            x = g.op("Add", x, g.weight((1, width), 0.1, "bias"))
        elif op_type == "Mul":
            x = g.op("Mul", x, g.weight((1, width), 0.1, "scale", offset=1.0))
        else:
            x = g.op(op_type, x)
    g.nodes[-1].output[0] = "y"
    return make_model(g, f"chain{length}", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, width])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, width])])


def make_model(g: GraphBuilder, name: str, inputs, outputs) -> onnx.ModelProto:
    graph = helper.make_graph(g.nodes, name, inputs, outputs, initializer=g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="onnx-parity benchmarks")
    model.ir_version = 8  # what opset 17 exporters write; older onnxruntime builds read it too
    onnx.checker.check_model(model)
    return model


# the light models shipped in onnx ---------------------------------------------------------------

def light_model(name: str) -> onnx.ModelProto:
    path = LIGHT_DIR / f"light_{name}.onnx"
    if not path.exists():
        raise FileNotFoundError(f"the installed onnx ships no {path.name} under {LIGHT_DIR}")
    return onnx.load(str(path))


def light_feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The input onnx's backend runner feeds light models: arange(n)/n in float32."""
    initializers = {i.name for i in model.graph.initializer}
    return {vi.name: light_input(vi) for vi in model.graph.input if vi.name not in initializers}


# every benchmark model with its feeds ------------------------------------------------------------

def gpt2_feeds(seq: int, past: int, seed: int = 10, batch: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {"hidden_states": rng.standard_normal((batch, seq, D_MODEL)).astype(np.float32)}
    for i in range(GPT2_LAYERS if past else 0):
        for kind in ("key", "value"):
            feeds[f"past_{kind}_{i}"] = rng.standard_normal(
                (batch, HEADS, past, HEAD_DIM)).astype(np.float32)
    return feeds


def bert_feeds(seq: int = SEQ, padding: int = 28, seed: int = 11) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((1, seq), dtype=np.int64)
    mask[:, seq - padding:] = 0
    return {"hidden_states": rng.standard_normal((1, seq, D_MODEL)).astype(np.float32),
            "attention_mask": mask}


def chain_feeds(width: int = 64, seed: int = 12) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((1, width)).astype(np.float32)}


def torch_style_model(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    from benchmarks import torch_style

    if name == "bert_classifier":
        model = torch_style.bert_classifier()
        return model, torch_style.bert_feeds(model)
    model = torch_style.vit() if name == "vit" else torch_style.mobilenet_v3_small()
    return model, torch_style.image_feeds(model)


def llama(name: str, seed: int = 13) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    from benchmarks import decoders

    model = decoders.build_llama(decoders.SIZES["tiny"])
    if name == "llama_prefill":
        tokens = decoders.random_tokens(model, (1, PROMPT), seed=seed)
        return model, {**decoders.step_feeds(tokens, 0), **decoders.empty_past(model)}
    rng = np.random.default_rng(seed)
    past = {k: rng.standard_normal(v.shape[:2] + (PROMPT,) + v.shape[3:]).astype(np.float32)
            for k, v in decoders.empty_past(model).items()}
    token = decoders.random_tokens(model, (1, 1), seed=seed)
    return model, {**decoders.step_feeds(token, PROMPT), **past}


def build(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """(model, feeds) for one benchmark model name (see NAMES)."""
    if name in TORCH_STYLE:
        return torch_style_model(name)
    if name in LLAMA:
        return llama(name)
    if name == "gpt2_seq128":
        return gpt2_block(SEQ), gpt2_feeds(SEQ, 0)
    if name == "gpt2_seq1":
        return gpt2_block(1, past=PAST), gpt2_feeds(1, PAST)
    if name == "bert_layer":
        return bert_layer(), bert_feeds()
    if name == "chain100":
        return elementwise_chain(), chain_feeds()
    if name.startswith("light_") and name[len("light_"):] in LIGHT_MODELS:
        model = light_model(name[len("light_"):])
        return model, light_feeds(model)
    raise ValueError(f"unknown benchmark model {name!r}; known: {NAMES}")


CHAIN = "chain100"
PROMPT = 32  # llama_prefill's prompt and llama_decode's cached positions
TORCH_STYLE = ["bert_classifier", "vit", "mobilenet_v3_small"]
LLAMA = ["llama_prefill", "llama_decode"]
NAMES = ["gpt2_seq128", "gpt2_seq1", "bert_layer", CHAIN] + TORCH_STYLE + LLAMA + [
    f"light_{m}" for m in LIGHT_MODELS]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m benchmarks.models OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        model, _ = build(name)
        onnx.save(model, str(out / f"{name}.onnx"))
        print(out / f"{name}.onnx")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
