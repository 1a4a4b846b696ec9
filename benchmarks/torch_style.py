"""Small image and text models written node by node as torch.onnx's TorchScript exporter
writes them at opset 17 (eval mode, constant folding on), with seeded random weights.

- bert_classifier: Hugging Face's BertForSequenceClassification (bert-mini's shape by default).
  Embeddings as three Gathers (word, token type, position; the position ids sliced out of a
  [1, max_positions] buffer by the sequence length read with Shape), Add, LayerNormalization;
  the extended attention mask as Unsqueeze, Unsqueeze, Cast, Sub(1, m), Mul(float32 min);
  attention as MatMul+Add projections, heads split by a Reshape whose shape is computed from
  Shape/Gather/Unsqueeze/Concat (the export has dynamic batch and sequence axes), Transpose,
  key transposed again, MatMul, Div by sqrt(head size), Add mask, Softmax, MatMul, Transpose,
  Reshape back; Gelu as Div(sqrt 2), Erf, Add 1, Mul x, Mul 0.5; LayerNormalization after each
  residual Add; the pooler as Gather(index 0 on the sequence axis), Gemm (transB), Tanh; the
  classifier Gemm.
- vit: a ViT for image classification (pre-LN encoder, as timm and Hugging Face write it):
  patch Conv (kernel = stride = patch), Reshape to [1, hidden, patches], Transpose, the class
  token Concat in front, Add position embeddings; blocks of LayerNormalization, attention as
  above without a mask, residual Add, LayerNormalization, MLP with Erf Gelu, residual Add; the
  final LayerNormalization, Gather of the class token, Gemm head.
- mobilenet_v3_small: torchvision's mobilenet_v3_small(width_mult=0.5): each Conv with its
  BatchNormalization folded into weights and bias (what constant folding leaves), HardSwish and
  Relu, depthwise convolutions (group = channels), squeeze-excite as GlobalAveragePool (or
  ReduceMean over H, W with keepdims, as the dynamo exporter writes adaptive_avg_pool2d: pool=
  "ReduceMean"), Conv 1x1, Relu, Conv 1x1, HardSigmoid(alpha 1/6), Mul; residual Adds; the head
  GlobalAveragePool, Flatten, Gemm, HardSwish, Gemm.

Each builder takes its sizes as arguments; the defaults are the benchmark's sizes and the
tests use tiny ones. `feeds(model)` gives seeded inputs for any of them.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper

from benchmarks.models import GraphBuilder

OPSET = 17  # torch.onnx.export's default opset in torch 2.x
IR_VERSION = 8
F32_MIN = float(np.finfo(np.float32).min)  # Hugging Face masks with torch.finfo(dtype).min


def make_model(g: GraphBuilder, name: str, inputs, outputs) -> onnx.ModelProto:
    graph = helper.make_graph(g.nodes, name, inputs, outputs, initializer=g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="pytorch", producer_version="2.5.0")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def linear(g: GraphBuilder, x: str, n_in: int, n_out: int, hint: str) -> str:
    """nn.Linear on a 3-D input: MatMul with the transposed weight folded, then Add bias."""
    w = g.weight((n_in, n_out), 1.0 / math.sqrt(n_in), f"{hint}.weight")
    b = g.weight((n_out,), 0.02, f"{hint}.bias")
    return g.op("Add", g.op("MatMul", x, w), b)


def gemm(g: GraphBuilder, x: str, n_in: int, n_out: int, hint: str) -> str:
    """nn.Linear on a 2-D input: Gemm with the weight as stored, [out, in], transB=1."""
    w = g.weight((n_out, n_in), 1.0 / math.sqrt(n_in), f"{hint}.weight")
    b = g.weight((n_out,), 0.02, f"{hint}.bias")
    return g.op("Gemm", x, w, b, alpha=1.0, beta=1.0, transB=1)


def layer_norm(g: GraphBuilder, x: str, size: int, hint: str, eps: float) -> str:
    gamma = g.weight((size,), 0.1, f"{hint}.weight", offset=1.0)
    beta = g.weight((size,), 0.1, f"{hint}.bias")
    return g.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=eps)


def gelu_erf(g: GraphBuilder, x: str) -> str:
    """torch's exact gelu symbolic: x * 0.5 * (1 + erf(x / sqrt(2)))."""
    erf = g.op("Erf", g.op("Div", x, g.f32(math.sqrt(2.0))))
    return g.op("Mul", g.op("Mul", x, g.op("Add", erf, g.f32(1.0))), g.f32(0.5))


def dim(g: GraphBuilder, x: str, axis: int) -> str:
    """x.size(axis) as the exporter writes it: Shape, Gather(axis), a 0-d int64."""
    return g.op("Gather", g.op("Shape", x), g.i64(axis), axis=0)


def unsqueezed(g: GraphBuilder, scalar: str) -> str:
    return g.op("Unsqueeze", scalar, g.i64([0]))


def shape_of(g: GraphBuilder, *parts: str) -> str:
    """A Reshape target from 0-d dims and 1-element constants, as view(...) exports."""
    return g.op("Concat", *parts, axis=0)


def self_attention(g: GraphBuilder, x: str, hidden: int, heads: int, mask: str | None,
                   hint: str) -> str:
    """Hugging Face's BertSelfAttention / ViTSelfAttention, with view() shapes computed."""
    head = hidden // heads
    batch, seq = dim(g, x, 0), dim(g, x, 1)
    split = shape_of(g, unsqueezed(g, batch), unsqueezed(g, seq), g.i64([heads]), g.i64([head]))

    def heads_of(name: str) -> str:
        return g.op("Transpose", g.op("Reshape", linear(g, x, hidden, hidden, f"{hint}.{name}"),
                                      split), perm=[0, 2, 1, 3])

    q, k, v = heads_of("query"), heads_of("key"), heads_of("value")
    scores = g.op("MatMul", q, g.op("Transpose", k, perm=[0, 1, 3, 2]))
    scores = g.op("Div", scores, g.f32(math.sqrt(head)))
    if mask is not None:
        scores = g.op("Add", scores, mask)
    context = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    merged = shape_of(g, unsqueezed(g, batch), unsqueezed(g, seq), g.i64([hidden]))
    return g.op("Reshape", g.op("Transpose", context, perm=[0, 2, 1, 3]), merged)


# BERT ------------------------------------------------------------------------------------------

def bert_classifier(layers: int = 4, hidden: int = 256, heads: int = 4,
                    intermediate: int = 1024, vocab: int = 8000, max_positions: int = 512,
                    labels: int = 2, seed: int = 20) -> onnx.ModelProto:
    """BertForSequenceClassification; inputs input_ids, attention_mask, token_type_ids
    [batch, sequence] int64; output logits [batch, labels]."""
    g = GraphBuilder(seed)
    eps = 1e-12
    ids, mask_in, types = "input_ids", "attention_mask", "token_type_ids"
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
              for n in (ids, mask_in, types)]
    word = g.weight((vocab, hidden), 0.02, "embeddings.word_embeddings.weight")
    position = g.weight((max_positions, hidden), 0.02, "embeddings.position_embeddings.weight")
    token_type = g.weight((2, hidden), 0.02, "embeddings.token_type_embeddings.weight")
    position_ids = g.const(np.arange(max_positions, dtype=np.int64)[None, :],
                           "embeddings.position_ids")
    seq_end = unsqueezed(g, dim(g, ids, 1))
    positions = g.op("Slice", position_ids, g.i64([0]), seq_end, g.i64([1]), g.i64([1]))
    x = g.op("Add", g.op("Add", g.op("Gather", word, ids), g.op("Gather", token_type, types)),
             g.op("Gather", position, positions))
    x = layer_norm(g, x, hidden, "embeddings.LayerNorm", eps)

    mask = g.op("Unsqueeze", g.op("Unsqueeze", mask_in, g.i64([1])), g.i64([2]))
    mask = g.op("Cast", mask, to=TensorProto.FLOAT)
    mask = g.op("Mul", g.op("Sub", g.f32(1.0), mask), g.f32(F32_MIN))

    for i in range(layers):
        hint = f"encoder.layer.{i}"
        attention = self_attention(g, x, hidden, heads, mask, f"{hint}.attention.self")
        attention = linear(g, attention, hidden, hidden, f"{hint}.attention.output.dense")
        x = layer_norm(g, g.op("Add", attention, x), hidden, f"{hint}.attention.output.LayerNorm",
                       eps)
        inner = gelu_erf(g, linear(g, x, hidden, intermediate, f"{hint}.intermediate.dense"))
        out = linear(g, inner, intermediate, hidden, f"{hint}.output.dense")
        x = layer_norm(g, g.op("Add", out, x), hidden, f"{hint}.output.LayerNorm", eps)

    first = g.op("Gather", x, g.i64(0), axis=1)
    pooled = g.op("Tanh", gemm(g, first, hidden, hidden, "pooler.dense"))
    gemm(g, pooled, hidden, labels, "classifier")
    g.nodes[-1].output[0] = "logits"
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", labels])]
    return make_model(g, "bert_classifier", inputs, outputs)


# ViT -------------------------------------------------------------------------------------------

def vit(image: int = 96, patch: int = 16, layers: int = 4, hidden: int = 192, heads: int = 3,
        mlp: int = 768, classes: int = 100, seed: int = 21) -> onnx.ModelProto:
    """ViTForImageClassification; input pixel_values [1, 3, image, image]; output logits."""
    if image % patch:
        raise ValueError(f"image size {image} is not a multiple of the patch size {patch}")
    g = GraphBuilder(seed)
    eps = 1e-12
    patches = (image // patch) ** 2
    inputs = [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT,
                                            [1, 3, image, image])]
    w = g.weight((hidden, 3, patch, patch), 1.0 / math.sqrt(3 * patch * patch),
                 "embeddings.patch_embeddings.projection.weight")
    b = g.weight((hidden,), 0.02, "embeddings.patch_embeddings.projection.bias")
    x = g.op("Conv", "pixel_values", w, b, kernel_shape=[patch, patch], strides=[patch, patch],
             pads=[0, 0, 0, 0], dilations=[1, 1], group=1)
    x = g.op("Transpose", g.op("Reshape", x, g.i64([1, hidden, patches])), perm=[0, 2, 1])
    cls = g.weight((1, 1, hidden), 0.02, "embeddings.cls_token")
    x = g.op("Concat", cls, x, axis=1)
    x = g.op("Add", x, g.weight((1, patches + 1, hidden), 0.02,
                                "embeddings.position_embeddings"))
    for i in range(layers):
        hint = f"encoder.layer.{i}"
        normed = layer_norm(g, x, hidden, f"{hint}.layernorm_before", eps)
        attention = self_attention(g, normed, hidden, heads, None, f"{hint}.attention.attention")
        x = g.op("Add", linear(g, attention, hidden, hidden, f"{hint}.attention.output.dense"), x)
        normed = layer_norm(g, x, hidden, f"{hint}.layernorm_after", eps)
        inner = gelu_erf(g, linear(g, normed, hidden, mlp, f"{hint}.intermediate.dense"))
        x = g.op("Add", linear(g, inner, mlp, hidden, f"{hint}.output.dense"), x)
    x = layer_norm(g, x, hidden, "layernorm", eps)
    gemm(g, g.op("Gather", x, g.i64(0), axis=1), hidden, classes, "classifier")
    g.nodes[-1].output[0] = "logits"
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])]
    return make_model(g, "vit", inputs, outputs)


# MobileNetV3 -----------------------------------------------------------------------------------

# torchvision's mobilenet_v3_small blocks: input, kernel, expanded, output, squeeze-excite,
# activation (RE: Relu, HS: HardSwish), stride
SMALL_BLOCKS = [
    (16, 3, 16, 16, True, "RE", 2),
    (16, 3, 72, 24, False, "RE", 2),
    (24, 3, 88, 24, False, "RE", 1),
    (24, 5, 96, 40, True, "HS", 2),
    (40, 5, 240, 40, True, "HS", 1),
    (40, 5, 240, 40, True, "HS", 1),
    (40, 5, 120, 48, True, "HS", 1),
    (48, 5, 144, 48, True, "HS", 1),
    (48, 5, 288, 96, True, "HS", 2),
    (96, 5, 576, 96, True, "HS", 1),
    (96, 5, 576, 96, True, "HS", 1),
]


def make_divisible(value: float, divisor: int = 8) -> int:
    """torchvision's _make_divisible: round to a multiple of 8, never down by more than 10%."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def conv(g: GraphBuilder, x: str, c_in: int, c_out: int, kernel: int, stride: int,
         hint: str, group: int = 1) -> str:
    """Conv2d + BatchNorm2d folded: a Conv with bias, 'same' padding of kernel // 2."""
    fan_in = c_in // group * kernel * kernel
    w = g.weight((c_out, c_in // group, kernel, kernel), math.sqrt(2.0 / fan_in), f"{hint}.weight")
    b = g.weight((c_out,), 0.1, f"{hint}.bias")
    pad = kernel // 2
    return g.op("Conv", x, w, b, kernel_shape=[kernel, kernel], strides=[stride, stride],
                pads=[pad] * 4, dilations=[1, 1], group=group)


def activation(g: GraphBuilder, x: str, kind: str) -> str:
    return g.op("Relu", x) if kind == "RE" else g.op("HardSwish", x)


def global_pool(g: GraphBuilder, x: str, pool: str) -> str:
    if pool == "GlobalAveragePool":
        return g.op("GlobalAveragePool", x)
    return g.op("ReduceMean", x, axes=[-1, -2], keepdims=1)


def squeeze_excite(g: GraphBuilder, x: str, channels: int, pool: str, hint: str) -> str:
    squeeze = make_divisible(channels // 4)
    s = conv(g, global_pool(g, x, pool), channels, squeeze, 1, 1, f"{hint}.fc1")
    s = conv(g, g.op("Relu", s), squeeze, channels, 1, 1, f"{hint}.fc2")
    return g.op("Mul", g.op("HardSigmoid", s, alpha=1.0 / 6.0, beta=0.5), x)


def mobilenet_v3_small(width: float = 0.5, image: int = 224, classes: int = 1000,
                       pool: str = "GlobalAveragePool", seed: int = 22) -> onnx.ModelProto:
    """torchvision's mobilenet_v3_small(width_mult=width); input [1, 3, image, image]."""
    if pool not in ("GlobalAveragePool", "ReduceMean"):
        raise ValueError(f"pool must be GlobalAveragePool or ReduceMean, not {pool!r}")
    g = GraphBuilder(seed)
    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, image, image])]
    stem = make_divisible(16 * width)
    x = g.op("HardSwish", conv(g, "input", 3, stem, 3, 2, "features.0.0"))
    c = stem
    for i, (_, kernel, expanded, out, se, act, stride) in enumerate(SMALL_BLOCKS, start=1):
        expanded, out = make_divisible(expanded * width), make_divisible(out * width)
        hint = f"features.{i}.block"
        y = x
        if expanded != c:
            y = activation(g, conv(g, y, c, expanded, 1, 1, f"{hint}.0.0"), act)
        y = activation(g, conv(g, y, expanded, expanded, kernel, stride, f"{hint}.1.0",
                               group=expanded), act)
        if se:
            y = squeeze_excite(g, y, expanded, pool, f"{hint}.2")
        y = conv(g, y, expanded, out, 1, 1, f"{hint}.3.0")
        x = g.op("Add", y, x) if stride == 1 and c == out else y
        c = out
    last_conv = 6 * c
    x = g.op("HardSwish", conv(g, x, c, last_conv, 1, 1, f"features.{len(SMALL_BLOCKS) + 1}.0"))
    x = g.op("Flatten", global_pool(g, x, "GlobalAveragePool"), axis=1)
    x = g.op("HardSwish", gemm(g, x, last_conv, make_divisible(1024 * width), "classifier.0"))
    gemm(g, x, make_divisible(1024 * width), classes, "classifier.3")
    g.nodes[-1].output[0] = "logits"
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])]
    return make_model(g, f"mobilenet_v3_small_{width}", inputs, outputs)


# feeds -----------------------------------------------------------------------------------------

def bert_feeds(model: onnx.ModelProto, sequence: int = 128, padding: int = 16,
               seed: int = 23) -> dict[str, np.ndarray]:
    """Token ids below the vocabulary, one segment, the last `padding` positions masked."""
    vocab = next(t.dims[0] for t in model.graph.initializer
                 if t.name.startswith("embeddings.word_embeddings.weight"))
    rng = np.random.default_rng(seed)
    mask = np.ones((1, sequence), np.int64)
    mask[:, sequence - padding:] = 0
    return {"input_ids": rng.integers(0, vocab, (1, sequence), dtype=np.int64),
            "attention_mask": mask, "token_type_ids": np.zeros((1, sequence), np.int64)}


def image_feeds(model: onnx.ModelProto, seed: int = 24) -> dict[str, np.ndarray]:
    """A standard-normal image of the model's input shape (the size a normalised image has)."""
    (info,) = model.graph.input
    shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
    return {info.name: np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}
