"""Decoder attention blocks built node by node in the patterns torch.onnx writes for Llama-,
Qwen2-, Mistral- and Phi-3-style models (HF transformers' modeling code), so the decoder
fusions can be tested without torch:

- the rotary embedding's cos and sin: computed from position_ids (HF >= 4.38:
  inv_freq @ positions, Concat(freqs, freqs), Cos, Sin) under the dynamo exporter, or gathered
  from cos/sin caches by position_ids (older HF, TorchScript); unsqueezed at axis 1 per layer;
- apply_rotary_pos_emb: q * cos + rotate_half(q) * sin with rotate_half as Slices (x[..., :h],
  x[..., h:]), Neg and Concat; or the halves by Split; or GPT-J's interleaved pairs;
- the KV cache: Concat(past, new) along the sequence axis, the present K/V graph outputs;
- repeat_kv: Unsqueeze(2), Expand to (B, KV, G, T, H), Reshape to (B, KV*G, T, H); or Tile, or
  Gather over the heads;
- scores: MatMul(q, Transpose(k, (0, 1, 3, 2))) times the scaling (dynamo writes Mul, the
  TorchScript export of `/ math.sqrt(head_dim)` a Div by a Constant), or sqrt(scaling) on q and
  on k^T (torch's scaled_dot_product_attention as torchlib decomposes it); plus the layer's
  slice of the 4-D additive mask (causal, padding and, for Mistral, the sliding window, built
  once at the top with Where(allowed, 0, finfo.min)), or Where(allowed, scores, -inf);
- Softmax, MatMul with V, Transpose(0, 2, 1, 3), Reshape to (B, S, N*H), o_proj, residual Add.

Qwen2 adds biases to the q/k/v projections; Phi-3 projects q, k and v in one MatMul cut by
Split or by Slices.  Shapes the exporters compute are computed here the same way: dynamo reads
sizes with Shape(x, start, end), TorchScript with Gather(Shape(x), i) and Unsqueeze; with
`dynamic=False` the targets are constants, as when the exporter folds static shapes.  Dimensions
are symbolic (batch, seq, past, total) where the export has dynamic axes.

build_ort_contrib(config) gives what onnxruntime's transformers optimizer and model builder
write instead: com.microsoft RotaryEmbedding and GroupQueryAttention.

    python -m tests.models.decoder_exports llama.onnx     # the default variant, saved
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
INT64_MAX = 2**63 - 1
FLOAT_MIN = float(np.finfo(np.float32).min)


@dataclass(frozen=True)
class DecoderConfig:
    family: str = "llama"        # llama | qwen2 (q/k/v biases) | mistral (window) | phi3 (qkv)
    exporter: str = "dynamo"     # dynamo | torchscript
    batch: int = 2
    seq: int = 5
    past: int = 3                # cached positions; 0: a prompt without cache inputs
    heads: int = 4
    kv_heads: int = 2
    head: int = 8
    layers: int = 2
    window: int = 4              # Mistral's sliding window
    repeat: str = "expand"       # expand | tile | tile_heads | gather
    mask: str = "add"            # add | where | none (sdpa's decode step without padding)
    scale_on: str = "scores"     # scores | qk (sqrt(scaling) on q and on k^T, as sdpa)
    rotary: str = "slices"       # slices | split | interleaved
    qkv: str = "split"           # phi3's fused projection cut by: split | slice
    dynamic: bool = True         # symbolic batch and lengths, shapes computed in the graph
    shared_sizes: bool = False   # past + seq computed once from the inputs' shapes for every
    #                              layer (torch.export's SymInts), not from each layer's K
    max_positions: int = 32      # rows of the cos/sin caches (TorchScript form)
    seed: int = 0

    @property
    def hidden(self) -> int:
        return self.heads * self.head

    @property
    def opset(self) -> int:
        return 18 if self.exporter == "dynamo" else 14


class _Graph:
    def __init__(self, config: DecoderConfig):
        self.c = config
        self.rng = np.random.default_rng(config.seed)
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def name(self, stem):
        self.count += 1
        return f"{stem}_{self.count}"

    def const(self, value, stem="const"):
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def ints(self, *values):
        return self.const(np.array(values, np.int64), "ints")

    def literal(self, value, dtype=np.float32):
        """A Constant node, as the TorchScript exporter writes Python numbers."""
        return self.op("Constant", value=numpy_helper.from_array(np.asarray(value, dtype)))

    def weight(self, *shape):
        return self.const((self.rng.standard_normal(shape) * shape[0] ** -0.5).astype(
            np.float32), "weight")

    def op(self, op_type, *inputs, outputs=1, domain="", **attrs):
        names = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=names[0] + "_n",
                                           domain=domain or None, **attrs))
        return names[0] if outputs == 1 else names

    # sizes as each exporter reads them ---------------------------------------------------
    def size(self, x, axis, static):
        """[x.shape[axis]] as a 1-D int64 tensor."""
        if not self.c.dynamic:
            return self.ints(static)
        if self.c.exporter == "dynamo":
            return self.op("Shape", x, start=axis, end=axis + 1)
        scalar = self.op("Gather", self.op("Shape", x), self.literal(axis, np.int64), axis=0)
        return self.op("Unsqueeze", scalar, self.ints(0))

    def shape_of(self, *pieces):
        """A Reshape/Expand target: ints are constants, strings 1-D sizes already made."""
        if all(isinstance(p, int) for p in pieces):
            return self.ints(*pieces)
        return self.op("Concat", *[self.ints(p) if isinstance(p, int) else p for p in pieces],
                       axis=0)

    def slice_last(self, x, start, end, step=None, rank=4):
        """x[..., start:end:step]: dynamo names the axis -1, TorchScript by its number."""
        axis = -1 if self.c.exporter == "dynamo" else rank - 1
        inputs = [x, self.ints(start), self.ints(end), self.ints(axis)]
        if step is not None or self.c.exporter == "dynamo":
            inputs.append(self.ints(step or 1))
        return self.op("Slice", *inputs)


def _rope_tables(g: _Graph, positions, batch):
    """cos and sin, (B, S, H): dynamo computes them from the positions, TorchScript gathers
    rows of the caches (interleaved: each angle twice, side by side)."""
    c, half = g.c, g.c.head // 2
    inv_freq = 1.0 / (10000.0 ** (np.arange(half, dtype=np.float64) * 2 / c.head))
    if c.exporter == "dynamo" and c.rotary != "interleaved":
        inv = g.const(inv_freq.astype(np.float32).reshape(1, half, 1), "inv_freq")
        expanded = g.op("Expand", inv, g.shape_of(batch, half, 1))
        pos = g.op("Cast", g.op("Unsqueeze", positions, g.ints(1)), to=F)
        freqs = g.op("Transpose", g.op("MatMul", expanded, pos), perm=[0, 2, 1])
        emb = g.op("Concat", freqs, freqs, axis=-1)
        return g.op("Cos", emb), g.op("Sin", emb)
    angles = np.arange(c.max_positions)[:, None] * inv_freq[None, :]
    emb = (np.repeat(angles, 2, axis=1) if c.rotary == "interleaved"
           else np.concatenate([angles, angles], axis=1))
    cos = g.const(np.cos(emb).astype(np.float32), "cos_cached")
    sin = g.const(np.sin(emb).astype(np.float32), "sin_cached")
    return g.op("Gather", cos, positions, axis=0), g.op("Gather", sin, positions, axis=0)


def _rotate(g: _Graph, x):
    """rotate_half(x), or GPT-J's rotate_every_two when interleaved."""
    c, half = g.c, g.c.head // 2
    if c.rotary == "interleaved":
        x1 = g.slice_last(x, 0, INT64_MAX, 2)
        x2 = g.slice_last(x, 1, INT64_MAX, 2)
        last = g.ints(-1 if c.exporter == "dynamo" else 4)
        stacked = g.op("Concat", g.op("Unsqueeze", g.op("Neg", x2), last),
                       g.op("Unsqueeze", x1, last), axis=-1)
        return g.op("Reshape", stacked, g.ints(0, 0, 0, c.head))
    if c.rotary == "split":
        x1, x2 = g.op("Split", x, g.ints(half, half), outputs=2, axis=-1)
    else:
        x1 = g.slice_last(x, 0, half)
        x2 = g.slice_last(x, half, INT64_MAX)
    return g.op("Concat", g.op("Neg", x2), x1, axis=-1)


def _apply_rotary(g: _Graph, x, cos, sin):
    return g.op("Add", g.op("Mul", x, cos), g.op("Mul", _rotate(g, x), sin))


def _repeat_kv(g: _Graph, x, batch, total):
    c = g.c
    group = c.heads // c.kv_heads
    if group == 1:
        return x
    if c.repeat == "gather":
        return g.op("Gather", x, g.ints(*(np.arange(c.heads) // group)), axis=1)
    if c.repeat == "tile_heads":  # x.repeat(1, G, 1, 1): head h reads KV head h % KV
        return g.op("Tile", x, g.ints(1, group, 1, 1))
    unsqueezed = g.op("Unsqueeze", x, g.ints(2))
    if c.repeat == "tile":
        grown = g.op("Tile", unsqueezed, g.ints(1, 1, group, 1, 1))
    else:
        grown = g.op("Expand", unsqueezed, g.shape_of(batch, c.kv_heads, group, total, c.head))
    return g.op("Reshape", grown, g.shape_of(batch, c.heads, total, c.head))


def _mask(g: _Graph, positions, attention_mask):
    """allowed (B, 1, S, T) bool: key j <= the query's position, not padding, and (Mistral)
    within the window; and the additive mask Where(allowed, 0, finfo.min)."""
    c = g.c
    total = g.op("Squeeze", g.size(attention_mask, 1, c.past + c.seq), g.ints(0))
    keys = g.op("Range", g.literal(0, np.int64), total, g.literal(1, np.int64))
    query = g.op("Unsqueeze", positions, g.ints(2))  # (B, S, 1)
    allowed = g.op("LessOrEqual", keys, query)
    if c.family == "mistral":
        allowed = g.op("And", allowed, g.op("Greater", keys, g.op(
            "Sub", query, g.literal(c.window, np.int64))))
    padding = g.op("Unsqueeze", g.op("Cast", attention_mask, to=BOOL), g.ints(1))  # (B, 1, T)
    allowed = g.op("Unsqueeze", g.op("And", allowed, padding), g.ints(1))
    additive = g.op("Where", allowed, g.literal(0.0), g.literal(FLOAT_MIN))
    return allowed, additive


def _projections(g: _Graph, x):
    c = g.c
    kv = c.kv_heads * c.head
    if c.family == "phi3":
        qkv = g.op("MatMul", x, g.weight(c.hidden, c.hidden + 2 * kv))
        if c.qkv == "split":
            return g.op("Split", qkv, g.ints(c.hidden, kv, kv), outputs=3, axis=-1)
        ends = [c.hidden, c.hidden + kv, INT64_MAX]
        starts = [0, c.hidden, c.hidden + kv]
        return [g.slice_last(qkv, s, e, rank=3) for s, e in zip(starts, ends)]
    outs = []
    for width in (c.hidden, kv, kv):
        y = g.op("MatMul", x, g.weight(c.hidden, width))
        if c.family == "qwen2":
            y = g.op("Add", y, g.const((0.1 * g.rng.standard_normal(width)).astype(np.float32),
                                       "bias"))
        outs.append(y)
    return outs


def _attention_layer(g: _Graph, layer, x, cos, sin, allowed, additive, batch, seq,
                     shared_total=None):
    c = g.c
    q, k, v = _projections(g, x)

    def heads_first(y, n):
        return g.op("Transpose", g.op("Reshape", y, g.shape_of(batch, seq, n, c.head)),
                    perm=[0, 2, 1, 3])

    q, k, v = heads_first(q, c.heads), heads_first(k, c.kv_heads), heads_first(v, c.kv_heads)
    cos1, sin1 = g.op("Unsqueeze", cos, g.ints(1)), g.op("Unsqueeze", sin, g.ints(1))
    q, k = _apply_rotary(g, q, cos1, sin1), _apply_rotary(g, k, cos1, sin1)
    if c.past:
        k = g.op("Concat", f"past_key_{layer}", k, axis=2)
        v = g.op("Concat", f"past_value_{layer}", v, axis=2)
    g.nodes.append(helper.make_node("Identity", [k], [f"present_key_{layer}"]))
    g.nodes.append(helper.make_node("Identity", [v], [f"present_value_{layer}"]))
    total = shared_total or g.size(k, 2, c.past + c.seq)
    k_rep, v_rep = _repeat_kv(g, k, batch, total), _repeat_kv(g, v, batch, total)
    k_t = g.op("Transpose", k_rep, perm=[0, 1, 3, 2])
    scaling = c.head ** -0.5
    if c.scale_on == "qk":
        root = g.literal(np.sqrt(scaling))
        scores = g.op("MatMul", g.op("Mul", q, root), g.op("Mul", k_t, root))
    elif c.exporter == "torchscript":
        scores = g.op("Div", g.op("MatMul", q, k_t), g.literal(np.sqrt(c.head)))
    else:
        scores = g.op("Mul", g.op("MatMul", q, k_t), g.const(np.float32(scaling), "scaling"))
    if c.mask == "none":
        pass
    elif c.mask == "where":
        layer_allowed = g.op("Slice", allowed, g.ints(0), total, g.ints(3))
        scores = g.op("Where", layer_allowed, scores, g.literal(-np.inf))
    else:  # HF: causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
        scores = g.op("Add", scores, g.op("Slice", additive, g.ints(0), total, g.ints(3)))
    probs = g.op("Softmax", scores, axis=-1)
    out = g.op("Transpose", g.op("MatMul", probs, v_rep), perm=[0, 2, 1, 3])
    out = g.op("Reshape", out, g.shape_of(batch, seq, c.hidden))
    return g.op("Add", x, g.op("MatMul", out, g.weight(c.hidden, c.hidden)))


def build_decoder(config: DecoderConfig = DecoderConfig()) -> onnx.ModelProto:
    """hidden states (B, S, hidden), position_ids (B, S), attention_mask (B, T) and, with a
    cache, past K/V per layer -> hidden states and present K/V per layer."""
    c = config
    if c.heads % c.kv_heads or c.head % 2:
        raise ValueError(f"{c.heads} heads do not group over {c.kv_heads}, or odd head {c.head}")
    g = _Graph(c)
    dims = ("batch", "seq", "past", "total") if c.dynamic else (
        c.batch, c.seq, c.past, c.past + c.seq)
    b_dim, s_dim, p_dim, t_dim = dims
    batch = g.size("x", 0, c.batch) if c.dynamic else c.batch
    seq = g.size("x", 1, c.seq) if c.dynamic else c.seq
    cos, sin = _rope_tables(g, "position_ids", batch)
    allowed, additive = _mask(g, "position_ids", "attention_mask")
    shared_total = None
    if c.shared_sizes and c.dynamic and c.past:
        shared_total = g.op("Add", g.op("Shape", "past_key_0", start=2, end=3), seq)
    x = "x"
    for layer in range(c.layers):
        x = _attention_layer(g, layer, x, cos, sin, allowed, additive, batch, seq, shared_total)
    g.nodes.append(helper.make_node("Identity", [x], ["y"]))
    kv_shape = [b_dim, c.kv_heads, t_dim, c.head]
    inputs = [helper.make_tensor_value_info("x", F, [b_dim, s_dim, c.hidden]),
              helper.make_tensor_value_info("position_ids", I64, [b_dim, s_dim]),
              helper.make_tensor_value_info("attention_mask", I64, [b_dim, t_dim])]
    outputs = [helper.make_tensor_value_info("y", F, [b_dim, s_dim, c.hidden])]
    for layer in range(c.layers):
        if c.past:
            inputs += [helper.make_tensor_value_info(f"past_{kind}_{layer}", F,
                                                     [b_dim, c.kv_heads, p_dim, c.head])
                       for kind in ("key", "value")]
        outputs += [helper.make_tensor_value_info(f"present_{kind}_{layer}", F, kv_shape)
                    for kind in ("key", "value")]
    graph = helper.make_graph(g.nodes, f"{c.family}_{c.exporter}", inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", c.opset)],
                              producer_name="pytorch-style", ir_version=8)
    onnx.checker.check_model(model)
    return model


def decoder_feeds(config: DecoderConfig, seed: int = 0, padded: bool = True) -> dict:
    """Inputs for build_decoder's model: positions past..past+seq-1; with `padded`, the last
    batch entry's first key is padding (left padding, as a batched generate() gives), unless
    the model applies no mask."""
    c, rng = config, np.random.default_rng(seed)
    padded = padded and c.mask != "none"
    total = c.past + c.seq
    feeds = {"x": rng.standard_normal((c.batch, c.seq, c.hidden)).astype(np.float32),
             "position_ids": np.tile(np.arange(c.past, total, dtype=np.int64), (c.batch, 1)),
             "attention_mask": np.ones((c.batch, total), np.int64)}
    if padded and total > 1:
        feeds["attention_mask"][-1, 0] = 0
    for layer in range(c.layers if c.past else 0):
        for kind in ("key", "value"):
            feeds[f"past_{kind}_{layer}"] = rng.standard_normal(
                (c.batch, c.kv_heads, c.past, c.head)).astype(np.float32)
    return feeds


# The variants the tests run: (config, what the exporter is said to write).
VARIANTS = {
    "llama_dynamo": DecoderConfig(),
    "llama_dynamo_prefill": DecoderConfig(past=0),
    "llama_dynamo_decode": DecoderConfig(seq=1, past=6),
    "llama_dynamo_static": DecoderConfig(dynamic=False),
    "llama_dynamo_shared_sizes": DecoderConfig(shared_sizes=True),
    "llama_torchscript": DecoderConfig(exporter="torchscript"),
    "llama_torchscript_decode": DecoderConfig(exporter="torchscript", seq=1, past=6),
    "llama_sdpa": DecoderConfig(scale_on="qk"),
    "llama_where_mask": DecoderConfig(mask="where", exporter="torchscript"),
    "llama_sdpa_decode_no_mask": DecoderConfig(scale_on="qk", mask="none", seq=1, past=6),
    "llama_tile": DecoderConfig(repeat="tile"),
    "llama_gather": DecoderConfig(repeat="gather"),
    "llama_tile_heads": DecoderConfig(repeat="tile_heads"),
    "llama_rotary_split": DecoderConfig(rotary="split"),
    "llama_mha": DecoderConfig(kv_heads=4),
    "llama_mqa": DecoderConfig(heads=6, kv_heads=1, head=4),
    "gptj_interleaved": DecoderConfig(rotary="interleaved", exporter="torchscript"),
    "qwen2_dynamo": DecoderConfig(family="qwen2"),
    "qwen2_torchscript": DecoderConfig(family="qwen2", exporter="torchscript"),
    "mistral_dynamo": DecoderConfig(family="mistral", seq=6, past=4),
    "mistral_torchscript_decode": DecoderConfig(family="mistral", exporter="torchscript",
                                                seq=1, past=7),
    "phi3_split": DecoderConfig(family="phi3", exporter="torchscript", qkv="split"),
    "phi3_slice": DecoderConfig(family="phi3", qkv="slice"),
    "phi3_slice_decode": DecoderConfig(family="phi3", qkv="slice", seq=1, past=5),
}


# --- onnxruntime's fused form ----------------------------------------------------------------

def build_ort_contrib(config: DecoderConfig = DecoderConfig(dynamic=False),
                      interleaved: bool = False) -> onnx.ModelProto:
    """One attention layer as onnxruntime's optimizer and model builder write it: q/k/v
    projections, com.microsoft RotaryEmbedding (3-D input, caches of half width) on q and k,
    GroupQueryAttention with the cache (past_key/past_value (B, KV, P, H), seqlens_k,
    total_sequence_length), o_proj."""
    c = config
    g = _Graph(c)
    half = c.head // 2
    inv_freq = 1.0 / (10000.0 ** (np.arange(half) * 2 / c.head))
    angles = np.arange(c.max_positions)[:, None] * inv_freq[None, :]
    cos = g.const(np.cos(angles).astype(np.float32), "cos_cache")
    sin = g.const(np.sin(angles).astype(np.float32), "sin_cache")
    ms = "com.microsoft"
    q, k, v = (g.op("MatMul", "x", g.weight(c.hidden, w))
               for w in (c.hidden, c.kv_heads * c.head, c.kv_heads * c.head))
    q = g.op("RotaryEmbedding", q, "position_ids", cos, sin, domain=ms,
             interleaved=int(interleaved), num_heads=c.heads)
    k = g.op("RotaryEmbedding", k, "position_ids", cos, sin, domain=ms,
             interleaved=int(interleaved), num_heads=c.kv_heads)
    attn = helper.make_node(
        "GroupQueryAttention", [q, k, v, "past_key", "past_value", "seqlens_k",
                                "total_sequence_length"],
        ["attn", "present_key", "present_value"], domain=ms, num_heads=c.heads,
        kv_num_heads=c.kv_heads, local_window_size=c.window if c.family == "mistral" else -1)
    g.nodes.append(attn)
    g.nodes.append(helper.make_node("MatMul", ["attn", g.weight(c.hidden, c.hidden)], ["y"]))
    inputs = [helper.make_tensor_value_info("x", F, [c.batch, c.seq, c.hidden]),
              helper.make_tensor_value_info("position_ids", I64, [c.batch, c.seq]),
              helper.make_tensor_value_info("past_key", F, [c.batch, c.kv_heads, c.past, c.head]),
              helper.make_tensor_value_info("past_value", F,
                                            [c.batch, c.kv_heads, c.past, c.head]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [c.batch]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    present = [c.batch, c.kv_heads, c.past + c.seq, c.head]
    outputs = [helper.make_tensor_value_info("y", F, [c.batch, c.seq, c.hidden]),
               helper.make_tensor_value_info("present_key", F, present),
               helper.make_tensor_value_info("present_value", F, present)]
    graph = helper.make_graph(g.nodes, "ort_gqa", inputs, outputs, g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(ms, 1)], ir_version=8)


def ort_contrib_feeds(config: DecoderConfig, seed: int = 0) -> dict:
    """Right-padded batch: the last entry's cache holds one position fewer."""
    c, rng = config, np.random.default_rng(seed)
    total = c.past + c.seq
    seqlens = np.full(c.batch, total - 1, np.int32)
    if c.batch > 1 and c.past:
        seqlens[-1] -= 1
    past_b = seqlens.astype(np.int64) + 1 - c.seq
    return {"x": rng.standard_normal((c.batch, c.seq, c.hidden)).astype(np.float32),
            "position_ids": past_b[:, None] + np.arange(c.seq, dtype=np.int64)[None, :],
            "past_key": rng.standard_normal((c.batch, c.kv_heads, c.past, c.head)).astype(
                np.float32),
            "past_value": rng.standard_normal((c.batch, c.kv_heads, c.past, c.head)).astype(
                np.float32),
            "seqlens_k": seqlens, "total_sequence_length": np.array(total, np.int32)}


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python -m tests.models.decoder_exports OUT.onnx [VARIANT]", file=sys.stderr)
        return 2
    config = VARIANTS[argv[1]] if len(argv) == 2 else DecoderConfig()
    onnx.save(build_decoder(config), argv[0])
    return 0


__all__ = ["VARIANTS", "DecoderConfig", "build_decoder", "build_ort_contrib", "decoder_feeds",
           "ort_contrib_feeds", "replace"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
