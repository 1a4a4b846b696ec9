"""Decoder-only language models with a KV cache, written node by node as torch.onnx's dynamo
exporter writes Hugging Face's Llama and Phi-3, with seeded random weights.

- build_llama: embedding Gather; RMSNorm as Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul/Mul; rotary
  embedding from cos/sin caches gathered by position_ids, rotate_half as two Slices, Neg and
  Concat; grouped-query attention whose K and V go through the cache as Concat(past, new) and
  are repeated by repeat_kv (Unsqueeze/Expand/Reshape); the causal and padding mask applied by
  Where; SiLU MLP as Sigmoid/Mul/Mul; the lm_head MatMul.
- build_phi3: the same decoder with Phi-3's fused projections: one qkv MatMul cut into q, k
  and v, and one gate_up MatMul cut into halves, by Slice (as dynamo writes tensor slicing and
  `chunk`) or by Split (`split="Split"`, as the TorchScript exporter writes `chunk`).
- quantized_4bit: any of them with its MatMuls as com.microsoft MatMulNBits, 4 bits in blocks
  of 32, written by onnxruntime's own MatMulNBitsQuantizer (it needs onnxruntime).

Inputs as the exporter names them: input_ids [batch, seq] and position_ids [batch, seq]
(int64), attention_mask [batch, past + seq] (int64, 1 = attend), past_key_values.N.key and
.value [batch, kv_heads, past, head_dim]; outputs logits [batch, seq, vocab] and present.N.key
and .value [batch, kv_heads, past + seq, head_dim]. A first step feeds an empty past (past = 0).

    python -m benchmarks.decoders llama.onnx --size tiny [--phi3] [--4bit]
"""
from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 18  # torch.onnx dynamo's default: ReduceMean and Split take axes/sizes as inputs
IR_VERSION = 9
INT64_MAX = np.iinfo(np.int64).max
F32_MIN = np.finfo(np.float32).min  # what Hugging Face masks with (not -inf: no NaN rows)


@dataclass(frozen=True)
class DecoderConfig:
    hidden: int = 512
    layers: int = 8
    heads: int = 8
    kv_heads: int = 2
    intermediate: int = 1408
    vocab: int = 32000
    max_positions: int = 1024  # rows of the cos/sin caches
    rope_theta: float = 10000.0
    eps: float = 1e-6
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def check(self) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads or self.head_dim % 2:
            raise ValueError(f"{self}: hidden must split into heads of an even size, and heads "
                             f"into kv_heads groups")


SIZES = {
    # the size the benchmarks use: small enough for this machine, a real decoder's shape
    "bench": DecoderConfig(),
    "tiny": DecoderConfig(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=96, vocab=300,
                          max_positions=256),
}


class _Graph:
    """Nodes and initializers; every name made here is unique."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def _name(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def const(self, value, stem: str = "val") -> str:
        name = self._name(stem)
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def param(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def linear(self, name: str, n_in: int, n_out: int) -> str:
        """A Linear's weight as the exporter stores it for MatMul: [in, out]."""
        w = self.rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)
        return self.param(name, w)

    def op(self, op_type: str, inputs: list[str], n_outputs: int = 1, **attrs):
        outputs = [self._name(op_type.lower()) for _ in range(n_outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs,
                                           name=self._name(f"node_{op_type}"), **attrs))
        return outputs[0] if n_outputs == 1 else outputs


def _rms_norm(g: _Graph, x: str, weight: str, eps: float) -> str:
    variance = g.op("ReduceMean", [g.op("Pow", [x, g.const(np.float32(2.0))]),
                                   g.const(np.array([-1], np.int64))], keepdims=1)
    inverse = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [variance, g.const(np.float32(eps))])])])
    return g.op("Mul", [weight, g.op("Mul", [x, inverse])])


def _slice_last(g: _Graph, x: str, start: int, end: int) -> str:
    return g.op("Slice", [x, g.const(np.array([start], np.int64)),
                          g.const(np.array([end], np.int64)), g.const(np.array([-1], np.int64))])


def _cut(g: _Graph, x: str, sizes: list[int], split: str) -> list[str]:
    """x cut along its last axis into pieces of `sizes`, by Slices or by one Split."""
    if split == "Split":
        return g.op("Split", [x, g.const(np.array(sizes, np.int64))], len(sizes), axis=-1)
    ends = np.cumsum(sizes)
    return [_slice_last(g, x, int(end - size), int(end) if i < len(sizes) - 1 else INT64_MAX)
            for i, (size, end) in enumerate(zip(sizes, ends))]


def _rotary(g: _Graph, x: str, cos: str, sin: str, half: int) -> str:
    """x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[..., half:], x[..., :half])."""
    x1 = g.op("Slice", [x, g.const(np.array([0], np.int64)), g.const(np.array([half], np.int64)),
                        g.const(np.array([3], np.int64))])
    x2 = g.op("Slice", [x, g.const(np.array([half], np.int64)),
                        g.const(np.array([INT64_MAX], np.int64)), g.const(np.array([3], np.int64))])
    rotated = g.op("Concat", [g.op("Neg", [x2]), x1], axis=-1)
    return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rotated, sin])])


@dataclass
class _Shared:
    """Values computed once for every layer, as the exporter's model-level code does."""

    cos: str
    sin: str
    allowed: str  # bool [batch, 1, seq, past + seq]: causal and not padding
    heads_shape: str  # [batch, seq, -1, head_dim]
    merged_shape: str  # [batch, seq, -1]
    expand_shape: str  # [batch, kv_heads, groups, past + seq, head_dim]
    repeated_shape: str  # [batch, heads, past + seq, head_dim]


def _attention(g: _Graph, cfg: DecoderConfig, i: int, h: str, s: _Shared, fused: bool,
               split: str) -> str:
    hd, q_size, kv_size = cfg.head_dim, cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    prefix = f"model.layers.{i}.self_attn"
    if fused:
        qkv = g.op("MatMul", [h, g.linear(f"{prefix}.qkv_proj.weight", cfg.hidden,
                                          q_size + 2 * kv_size)])
        q, k, v = _cut(g, qkv, [q_size, kv_size, kv_size], split)
    else:
        q, k, v = (g.op("MatMul", [h, g.linear(f"{prefix}.{p}_proj.weight", cfg.hidden, size)])
                   for p, size in (("q", q_size), ("k", kv_size), ("v", kv_size)))
    q, k, v = (g.op("Transpose", [g.op("Reshape", [t, s.heads_shape])], perm=[0, 2, 1, 3])
               for t in (q, k, v))
    q = _rotary(g, q, s.cos, s.sin, hd // 2)
    k = _rotary(g, k, s.cos, s.sin, hd // 2)
    g.nodes.append(helper.make_node("Concat", [f"past_key_values.{i}.key", k],
                                    [f"present.{i}.key"], name=f"node_Concat_present_key_{i}",
                                    axis=2))
    g.nodes.append(helper.make_node("Concat", [f"past_key_values.{i}.value", v],
                                    [f"present.{i}.value"], name=f"node_Concat_present_value_{i}",
                                    axis=2))
    k, v = (g.op("Reshape", [g.op("Expand", [g.op("Unsqueeze", [t, g.const(np.array([2], np.int64))]),
                                             s.expand_shape]), s.repeated_shape])
            for t in (f"present.{i}.key", f"present.{i}.value"))
    scores = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                          g.const(np.float32(hd ** -0.5))])
    masked = g.op("Where", [s.allowed, scores, g.const(np.float32(F32_MIN))])
    context = g.op("MatMul", [g.op("Softmax", [masked], axis=-1), v])
    merged = g.op("Reshape", [g.op("Transpose", [context], perm=[0, 2, 1, 3]), s.merged_shape])
    return g.op("MatMul", [merged, g.linear(f"{prefix}.o_proj.weight", q_size, cfg.hidden)])


def _mlp(g: _Graph, cfg: DecoderConfig, i: int, h: str, fused: bool, split: str) -> str:
    prefix = f"model.layers.{i}.mlp"
    if fused:
        gate_up = g.op("MatMul", [h, g.linear(f"{prefix}.gate_up_proj.weight", cfg.hidden,
                                              2 * cfg.intermediate)])
        gate, up = _cut(g, gate_up, [cfg.intermediate, cfg.intermediate], split)
    else:
        gate = g.op("MatMul", [h, g.linear(f"{prefix}.gate_proj.weight", cfg.hidden, cfg.intermediate)])
        up = g.op("MatMul", [h, g.linear(f"{prefix}.up_proj.weight", cfg.hidden, cfg.intermediate)])
    silu = g.op("Mul", [gate, g.op("Sigmoid", [gate])])
    product = g.op("Mul", [up, silu] if fused else [silu, up])
    return g.op("MatMul", [product, g.linear(f"{prefix}.down_proj.weight", cfg.intermediate,
                                             cfg.hidden)])


def _norm_weight(g: _Graph, name: str, size: int) -> str:
    return g.param(name, 1.0 + 0.1 * g.rng.standard_normal(size))


def _shared(g: _Graph, cfg: DecoderConfig) -> _Shared:
    hd = cfg.head_dim
    inv_freq = 1.0 / cfg.rope_theta ** (np.arange(0, hd, 2) / hd)
    freqs = np.outer(np.arange(cfg.max_positions), inv_freq)
    angles = np.concatenate([freqs, freqs], axis=-1)
    cos = g.op("Gather", [g.param("model.rotary_emb.cos_cached", np.cos(angles)), "position_ids"])
    sin = g.op("Gather", [g.param("model.rotary_emb.sin_cached", np.sin(angles)), "position_ids"])
    axis1 = g.const(np.array([1], np.int64))
    cos, sin = g.op("Unsqueeze", [cos, axis1]), g.op("Unsqueeze", [sin, axis1])

    batch = g.op("Shape", ["input_ids"], start=0, end=1)
    seq = g.op("Shape", ["input_ids"], start=1, end=2)
    past = g.op("Shape", ["past_key_values.0.key"], start=2, end=3)
    total = g.op("Add", [past, seq])
    scalar = g.const(np.array([], np.int64))  # Reshape to a 0-d scalar, for Range
    one = g.const(np.int64(1))
    key_pos = g.op("Range", [g.const(np.int64(0)), g.op("Reshape", [total, scalar]), one])
    query_pos = g.op("Range", [g.op("Reshape", [past, scalar]), g.op("Reshape", [total, scalar]), one])
    causal = g.op("LessOrEqual", [key_pos, g.op("Unsqueeze", [query_pos, axis1])])  # [seq, total]
    causal = g.op("Unsqueeze", [causal, g.const(np.array([0, 1], np.int64))])
    padding = g.op("Unsqueeze", [g.op("Cast", ["attention_mask"], to=TensorProto.BOOL),
                                 g.const(np.array([1, 2], np.int64))])
    allowed = g.op("And", [causal, padding])

    def shape(*parts) -> str:
        return g.op("Concat", [p if isinstance(p, str) else g.const(np.array(p, np.int64))
                               for p in parts], axis=0)

    return _Shared(cos, sin, allowed,
                   heads_shape=shape(batch, seq, [-1, hd]),
                   merged_shape=shape(batch, seq, [-1]),
                   expand_shape=shape(batch, [cfg.kv_heads, cfg.heads // cfg.kv_heads], total, [hd]),
                   repeated_shape=shape(batch, [cfg.heads], total, [hd]))


def _build(cfg: DecoderConfig, fused: bool, split: str, name: str) -> onnx.ModelProto:
    cfg.check()
    if split not in ("Slice", "Split"):
        raise ValueError(f"split must be 'Slice' or 'Split', not {split!r}")
    g = _Graph(cfg.seed)
    embedding = g.param("model.embed_tokens.weight", g.rng.standard_normal((cfg.vocab, cfg.hidden)))
    shared = _shared(g, cfg)
    x = g.op("Gather", [embedding, "input_ids"])
    for i in range(cfg.layers):
        h = _rms_norm(g, x, _norm_weight(g, f"model.layers.{i}.input_layernorm.weight", cfg.hidden),
                      cfg.eps)
        x = g.op("Add", [x, _attention(g, cfg, i, h, shared, fused, split)])
        h = _rms_norm(g, x, _norm_weight(g, f"model.layers.{i}.post_attention_layernorm.weight",
                                         cfg.hidden), cfg.eps)
        x = g.op("Add", [x, _mlp(g, cfg, i, h, fused, split)])
    h = _rms_norm(g, x, _norm_weight(g, "model.norm.weight", cfg.hidden), cfg.eps)
    g.nodes.append(helper.make_node("MatMul", [h, g.linear("lm_head.weight", cfg.hidden, cfg.vocab)],
                                    ["logits"], name="node_MatMul_lm_head"))

    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    cache = ["batch", cfg.kv_heads, "past_sequence_length", cfg.head_dim]
    present = ["batch", cfg.kv_heads, "total_sequence_length", cfg.head_dim]
    inputs = [helper.make_tensor_value_info("input_ids", i64, ["batch", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", i64, ["batch", "total_sequence_length"]),
              helper.make_tensor_value_info("position_ids", i64, ["batch", "sequence_length"])]
    outputs = [helper.make_tensor_value_info("logits", f, ["batch", "sequence_length", cfg.vocab])]
    for i in range(cfg.layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", f, cache))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", f, present))
    graph = helper.make_graph(g.nodes, name, inputs, outputs, g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              ir_version=IR_VERSION, producer_name="pytorch")
    onnx.checker.check_model(model)
    return model


def build_llama(cfg: DecoderConfig = SIZES["tiny"]) -> onnx.ModelProto:
    return _build(cfg, fused=False, split="Slice", name="llama")


def build_phi3(cfg: DecoderConfig = SIZES["tiny"], split: str = "Slice") -> onnx.ModelProto:
    return _build(cfg, fused=True, split=split, name=f"phi3_{split.lower()}")


def quantized_4bit(model: onnx.ModelProto, block_size: int = 32,
                   symmetric: bool = False) -> onnx.ModelProto:
    """Every MatMul with a constant weight as com.microsoft MatMulNBits (4 bits, blocks of 32,
    zero points unless symmetric), as onnxruntime's MatMulNBitsQuantizer writes it."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    quantizer = MatMulNBitsQuantizer(onnx.ModelProto.FromString(model.SerializeToString()),
                                     bits=4, block_size=block_size, is_symmetric=symmetric)
    quantizer.process()
    return quantizer.model.model


def config_of(model: onnx.ModelProto) -> dict:
    """layers, kv_heads, head_dim and vocab, read back from a model built here."""
    inputs = {v.name: v for v in model.graph.input}
    dims = inputs["past_key_values.0.key"].type.tensor_type.shape.dim
    logits = model.graph.output[0].type.tensor_type.shape.dim
    return {"layers": sum(n.startswith("past_key_values.") for n in inputs) // 2,
            "kv_heads": dims[1].dim_value, "head_dim": dims[3].dim_value,
            "vocab": logits[2].dim_value}


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the weights a decode step reads: every initializer a MatMul or MatMulNBits node
    takes (codes, scales and zero points included), plus one embedding row per token."""
    sizes = {t.name: _nbytes(t) for t in model.graph.initializer}
    read = {name for n in model.graph.node if n.op_type in ("MatMul", "MatMulNBits")
            for name in n.input[1:] if name in sizes}
    embedding = next(t for t in model.graph.initializer if t.name == "model.embed_tokens.weight")
    return sum(sizes[name] for name in read) + embedding.dims[1] * 4


def _nbytes(tensor: onnx.TensorProto) -> int:
    return int(np.prod(tensor.dims)) * np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize


def empty_past(model: onnx.ModelProto, batch: int = 1) -> dict[str, np.ndarray]:
    c = config_of(model)
    return {f"past_key_values.{i}.{kind}": np.zeros((batch, c["kv_heads"], 0, c["head_dim"]),
                                                    np.float32)
            for i in range(c["layers"]) for kind in ("key", "value")}


def step_feeds(tokens: np.ndarray, past_length: int) -> dict[str, np.ndarray]:
    """input_ids, attention_mask and position_ids for tokens [batch, seq] after past_length
    cached positions, with nothing padded."""
    batch, seq = tokens.shape
    positions = np.arange(past_length, past_length + seq, dtype=np.int64)
    return {"input_ids": tokens.astype(np.int64),
            "attention_mask": np.ones((batch, past_length + seq), np.int64),
            "position_ids": np.broadcast_to(positions, (batch, seq)).copy()}


def random_tokens(model: onnx.ModelProto, shape, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, config_of(model)["vocab"], shape, dtype=np.int64)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path")
    parser.add_argument("--size", choices=list(SIZES), default="tiny")
    parser.add_argument("--phi3", action="store_true")
    parser.add_argument("--split", choices=["Slice", "Split"], default="Slice")
    parser.add_argument("--4bit", dest="four_bit", action="store_true")
    args = parser.parse_args(argv)
    cfg = SIZES[args.size]
    model = build_phi3(cfg, args.split) if args.phi3 else build_llama(cfg)
    if args.four_bit:
        model = quantized_4bit(model)
    onnx.save(model, args.path)
    print(f"{args.path}: {len(model.graph.node)} nodes, {weight_bytes(model) / 1e6:.1f} MB of "
          f"weights read per decode step")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
