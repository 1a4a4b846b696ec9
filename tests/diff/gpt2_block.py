"""A small GPT-2-like model built as an exporter writes it: LayerNorm, Gelu and attention
decomposed into primitive ops (opset 17), token and position embeddings, causal mask."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

VOCAB = 50
MAX_SEQ = 128


class _Builder:
    def __init__(self, seed: int):
        self.nodes, self.inits = [], []
        self.rng = np.random.default_rng(seed)

    def weight(self, name, shape, scale=0.1):
        self.inits.append(numpy_helper.from_array(
            (self.rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def const(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type, inputs, name, **attrs):
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name


def layer_norm(b: _Builder, x, prefix, d):
    mean = b.op("ReduceMean", [x], f"{prefix}/mean", axes=[-1])
    centred = b.op("Sub", [x, mean], f"{prefix}/centred")
    square = b.op("Pow", [centred, "two"], f"{prefix}/square")
    var = b.op("ReduceMean", [square], f"{prefix}/var", axes=[-1])
    var_eps = b.op("Add", [var, "ln_eps"], f"{prefix}/var_eps")
    std = b.op("Sqrt", [var_eps], f"{prefix}/std")
    normed = b.op("Div", [centred, std], f"{prefix}/normed")
    scaled = b.op("Mul", [normed, b.weight(f"{prefix}.gamma", [d], 0.1)], f"{prefix}/scaled")
    return b.op("Add", [scaled, b.weight(f"{prefix}.beta", [d], 0.1)], f"{prefix}/out")


def gelu_tanh(b: _Builder, x, prefix):
    cube = b.op("Pow", [x, "three"], f"{prefix}/cube")
    inner = b.op("Mul", [cube, "gelu_c"], f"{prefix}/inner")
    summed = b.op("Add", [x, inner], f"{prefix}/summed")
    scaled = b.op("Mul", [summed, "sqrt_2_over_pi"], f"{prefix}/scaled")
    tanh = b.op("Tanh", [scaled], f"{prefix}/tanh")
    one_plus = b.op("Add", [tanh, "one"], f"{prefix}/one_plus")
    half_x = b.op("Mul", [x, "half"], f"{prefix}/half_x")
    return b.op("Mul", [half_x, one_plus], f"{prefix}/out")


def linear(b: _Builder, x, prefix, d_in, d_out):
    mm = b.op("MatMul", [x, b.weight(f"{prefix}.weight", [d_in, d_out])], f"{prefix}/matmul")
    return b.op("Add", [mm, b.weight(f"{prefix}.bias", [d_out], 0.02)], f"{prefix}/out")


def attention(b: _Builder, x, prefix, d, heads, mask):
    head = d // heads
    qkv = linear(b, x, f"{prefix}.c_attn", d, 3 * d)
    b.nodes.append(helper.make_node("Split", [qkv, "qkv_split"],
                                    [f"{prefix}/q", f"{prefix}/k", f"{prefix}/v"],
                                    name=f"{prefix}/split", axis=-1))
    split = {}
    for part in "qkv":
        r = b.op("Reshape", [f"{prefix}/{part}", "heads_shape"], f"{prefix}/{part}_heads")
        perm = [0, 2, 3, 1] if part == "k" else [0, 2, 1, 3]
        split[part] = b.op("Transpose", [r], f"{prefix}/{part}_t", perm=perm)
    scores = b.op("MatMul", [split["q"], split["k"]], f"{prefix}/scores")
    scaled = b.op("Div", [scores, b.const(f"{prefix}.scale", np.float32(np.sqrt(head)))],
                  f"{prefix}/scaled")
    masked = b.op("Where", [mask, scaled, "mask_value"], f"{prefix}/masked")
    probs = b.op("Softmax", [masked], f"{prefix}/softmax", axis=-1)
    context = b.op("MatMul", [probs, split["v"]], f"{prefix}/context")
    merged = b.op("Transpose", [context], f"{prefix}/context_t", perm=[0, 2, 1, 3])
    flat = b.op("Reshape", [merged, "merge_shape"], f"{prefix}/merged")
    return linear(b, flat, f"{prefix}.c_proj", d, d)


def gpt2_model(d: int = 64, heads: int = 4, layers: int = 2, seed: int = 0):
    """input_ids int64[batch, seq] -> logits float32[batch, seq, VOCAB]."""
    b = _Builder(seed)
    for name, value in [("two", 2.0), ("three", 3.0), ("half", 0.5), ("one", 1.0),
                        ("ln_eps", 1e-5), ("gelu_c", 0.044715),
                        ("sqrt_2_over_pi", np.sqrt(2 / np.pi)), ("mask_value", -1e4)]:
        b.const(name, np.float32(value))
    b.const("qkv_split", np.array([d, d, d], np.int64))
    b.const("heads_shape", np.array([0, 0, heads, d // heads], np.int64))
    b.const("merge_shape", np.array([0, 0, d], np.int64))
    b.const("zero", np.array([0], np.int64))
    b.const("one_i", np.array([1], np.int64))
    b.const("causal", np.tril(np.ones((MAX_SEQ, MAX_SEQ), bool)))
    wte = b.weight("wte", [VOCAB, d])
    tokens = b.op("Gather", [wte, "input_ids"], "embed/tokens", axis=0)
    shape = b.op("Shape", ["input_ids"], "embed/shape")
    seq = b.op("Slice", [shape, "one_i", b.const("two_i", np.array([2], np.int64))], "embed/seq")
    positions = b.op("Slice", [b.weight("wpe", [MAX_SEQ, d]), "zero", seq, "zero"],
                     "embed/positions")
    rows = b.op("Slice", ["causal", "zero", seq, "zero"], "mask/rows")
    mask = b.op("Slice", [rows, "zero", seq, "one_i"], "mask/causal")
    x = b.op("Add", [tokens, positions], "embed/out")
    for i in range(layers):
        p = f"h{i}"
        a = attention(b, layer_norm(b, x, f"{p}.ln_1", d), f"{p}.attn", d, heads, mask)
        x = b.op("Add", [x, a], f"{p}/residual_1")
        hidden = linear(b, layer_norm(b, x, f"{p}.ln_2", d), f"{p}.mlp.c_fc", d, 4 * d)
        m = linear(b, gelu_tanh(b, hidden, f"{p}.mlp.gelu"), f"{p}.mlp.c_proj", 4 * d, d)
        x = b.op("Add", [x, m], f"{p}/residual_2")
    x = layer_norm(b, x, "ln_f", d)
    wte_t = b.op("Transpose", [wte], "lm_head/wte_t", perm=[1, 0])
    b.op("MatMul", [x, wte_t], "logits")
    graph = helper.make_graph(
        b.nodes, "gpt2_block",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", VOCAB])],
        b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
