"""Test graphs in the exact node patterns that exporters write for LayerNorm, Gelu, attention and
bias + activation, built with onnx.helper (no exporter needed to run the tests).

Each builder returns a `Case`: the model, the op types the fusion must leave in it, the op types
it must take out, and the intermediate values that, once read outside the pattern, must keep it
whole. Where each pattern comes from is written beside its builder: torch.onnx's TorchScript
exporter (symbolic_opset9/14 functions), its dynamo exporter (onnxscript's torchlib, which gives
Python literals the input's type with CastLike), tf2onnx / keras2onnx (tf.nn.moments and
tf.nn.batch_normalization, Rsqrt as Reciprocal(Sqrt)), and onnxruntime's transformers optimizer
(whose fusion_layernorm / fusion_gelu / fusion_attention comments draw the graphs they match).
Shapes are non-square (batch 2, sequence 5, hidden 12 or 24) so that an axis mix-up shows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

B, S, D = 2, 5, 12           # batch, sequence, hidden
HEADS, HEAD = 3, 8           # attention: 3 heads of 8, hidden 24
HIDDEN = HEADS * HEAD
PAST = 4                     # cached positions in the GPT-2 past/present form


@dataclass
class Case:
    model: onnx.ModelProto
    fused: dict                      # op type (with "domain::" outside ai.onnx) -> count after
    gone: tuple = ()                 # op types none of which may remain
    intermediates: tuple = ()        # values whose reading elsewhere must keep the pattern
    feeds: dict = field(default_factory=dict)  # inputs random_inputs cannot make well


class Builder:
    """Nodes, initializers and typed inputs of one graph, with fresh names."""

    def __init__(self, opset, seed=0):
        self.opset, self.rng = opset, np.random.default_rng(seed)
        self.nodes, self.inits, self.inputs, self.count = [], [], [], 0
        self.extra_opsets = {}

    def name(self, stem):
        self.count += 1
        return f"{stem}_{self.count}"

    def input(self, name, shape, elem_type=TensorProto.FLOAT):
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def init(self, value, stem="w"):
        """An initializer (weights, as every exporter stores them)."""
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def literal(self, value, dtype=np.float32):
        """A Constant node, as the TorchScript exporter writes Python scalars."""
        return self.node("Constant", value=numpy_helper.from_array(np.asarray(value, dtype)))

    def cast_like(self, value, like):
        """A literal given `like`'s type, as torchlib (the dynamo exporter) writes it."""
        return self.node("CastLike", self.literal(value), like)

    def weight(self, *shape, scale=0.3, offset=0.0):
        return self.init((offset + scale * self.rng.standard_normal(shape)).astype(np.float32))

    def node(self, op_type, *inputs, domain="", outputs=1, **attrs):
        names = [self.name(op_type.lower()) for _ in range(outputs)]
        if domain:
            self.extra_opsets[domain] = 1
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=names[0] + "_n",
                                           domain=domain or None, **attrs))
        return names[0] if outputs == 1 else names

    def reduce_mean(self, x, axes=(-1,)):
        """Axes as an attribute before opset 18, as an int64 input from 18 on."""
        if self.opset >= 18:
            return self.node("ReduceMean", x, self.literal(list(axes), np.int64))
        return self.node("ReduceMean", x, axes=list(axes))

    def model(self, outputs, output_type=TensorProto.FLOAT):
        """outputs: {name: shape}; every output is renamed through Identity to a fixed name so
        the tests can add readers to the pattern's own values."""
        infos = []
        for i, (name, shape) in enumerate(outputs.items()):
            out = f"y{i}"
            self.nodes.append(helper.make_node("Identity", [name], [out]))
            infos.append(helper.make_tensor_value_info(out, output_type, shape))
        opsets = [helper.make_opsetid("", self.opset)] + [
            helper.make_opsetid(d, v) for d, v in self.extra_opsets.items()]
        graph = helper.make_graph(self.nodes, "exporter_pattern", self.inputs, infos, self.inits)
        return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def produced_by(model, name):
    return next(n for n in model.graph.node if name in n.output)


# --- LayerNorm -----------------------------------------------------------------------------
LAYER_NORM_GONE = ("ReduceMean", "Sub", "Pow", "Sqrt", "Div", "Reciprocal")


def _torch_layer_norm(b, x, square="Pow", inverse="Div", affine="both", eps_like=False):
    """torch.onnx's decomposed LayerNorm (TorchScript below opset 17 and hand-written modules
    under either exporter): (x - mean) / sqrt(mean((x - mean)^2) + eps) * gamma + beta.
    Returns (output, {role: value name})."""
    mean = b.reduce_mean(x)
    d = b.node("Sub", x, mean)
    sq = b.node("Pow", d, b.literal(2.0)) if square == "Pow" else b.node("Mul", d, d)
    var = b.reduce_mean(sq)
    eps = b.cast_like(1e-5, var) if eps_like else b.literal(1e-5)
    std = b.node("Sqrt", b.node("Add", var, eps))
    if inverse == "Div":
        normed = b.node("Div", d, std)
    else:  # rsqrt written as Reciprocal(Sqrt), times the centred value
        normed = b.node("Mul", d, b.node("Reciprocal", std))
    y = normed
    if affine in ("both", "scale"):
        y = b.node("Mul", y, b.weight(D, offset=1.0))
    if affine == "both":
        y = b.node("Add", y, b.weight(D, scale=0.1))
    return y, {"mean": mean, "centred": d, "variance": var, "std": std}


def layer_norm_torch(opset=13, **kwargs):
    """TorchScript opsets 11-16 (no LayerNormalization in onnx yet), no residual before it."""
    b = Builder(opset)
    x = b.node("MatMul", b.input("x", [B, S, D]), b.weight(D, D))
    y, roles = _torch_layer_norm(b, x, **kwargs)
    return Case(b.model({y: [B, S, D]}), {"LayerNormalization": 1}, LAYER_NORM_GONE,
                (roles["mean"], roles["centred"], roles["std"]))


def layer_norm_torch_17():
    """TorchScript and dynamo from opset 17 export F.layer_norm as LayerNormalization itself."""
    b = Builder(17)
    y = b.node("LayerNormalization", b.input("x", [B, S, D]), b.weight(D, offset=1.0),
               b.weight(D), axis=-1, epsilon=1e-5)
    return Case(b.model({y: [B, S, D]}), {"LayerNormalization": 1})


def layer_norm_ort_optimizer():
    """onnxruntime's optimizer writes ai.onnx LayerNormalization into opset-13 models (it
    registers the op from version 1)."""
    b = Builder(13)
    y = b.node("LayerNormalization", b.input("x", [B, S, D]), b.weight(D, offset=1.0),
               b.weight(D), axis=-1, epsilon=1e-12)
    return Case(b.model({y: [B, S, D]}), {"LayerNormalization": 1})


def layer_norm_dynamo(square="Pow"):
    """The dynamo exporter (opset 18) on a hand-written LayerNorm module: ReduceMean takes its
    axes as an input, literals arrive through CastLike."""
    b = Builder(18)
    y, roles = _torch_layer_norm(b, b.input("x", [B, S, D]), square=square, eps_like=True)
    return Case(b.model({y: [B, S, D]}), {"LayerNormalization": 1}, LAYER_NORM_GONE,
                (roles["mean"], roles["variance"]))


def layer_norm_dynamo_fp16():
    """A float16 model that normalizes in float32: Cast up, the decomposition, Cast back, then
    the float16 scale and shift (dynamo, opset 18)."""
    b = Builder(18)
    x16 = b.input("x", [B, S, D], TensorProto.FLOAT16)
    x = b.node("Cast", x16, to=TensorProto.FLOAT)
    normed, roles = _torch_layer_norm(b, x, affine="none")
    back = b.node("Cast", normed, to=TensorProto.FLOAT16)
    gamma = b.init((1 + 0.3 * b.rng.standard_normal(D)).astype(np.float16))
    beta = b.init((0.1 * b.rng.standard_normal(D)).astype(np.float16))
    y = b.node("Add", b.node("Mul", back, gamma), beta)
    return Case(b.model({y: [B, S, D]}, TensorProto.FLOAT16), {"LayerNormalization": 1},
                LAYER_NORM_GONE + ("Cast",), (x, roles["centred"]))


def layer_norm_tf(opset=13, scale=True, center=True):
    """tf2onnx / keras2onnx on keras.layers.LayerNormalization: tf.nn.moments (SquaredDifference
    becomes Sub then Mul(d, d)) and tf.nn.batch_normalization, whose rsqrt becomes
    Reciprocal(Sqrt): inv = rsqrt(var + eps) * gamma; y = x * inv + (beta - mean * inv). Without
    `center` the shift is Neg(mean * inv). Axes are written positive."""
    b = Builder(opset)
    x = b.node("Add", b.input("x", [B, S, D]), b.weight(D))
    mean = b.reduce_mean(x, axes=(2,))
    d = b.node("Sub", x, mean)
    var = b.reduce_mean(b.node("Mul", d, d), axes=(2,))
    inv = b.node("Reciprocal", b.node("Sqrt", b.node("Add", var, b.init(np.float32(1e-3)))))
    if scale:
        inv = b.node("Mul", inv, b.weight(D, offset=1.0))
    scaled_mean = b.node("Mul", mean, inv)
    shift = b.node("Sub", b.weight(D), scaled_mean) if center else b.node("Neg", scaled_mean)
    y = b.node("Add", b.node("Mul", x, inv), shift)
    return Case(b.model({y: [B, S, D]}), {"LayerNormalization": 1},
                LAYER_NORM_GONE + ("Neg",), (mean, scaled_mean, var))


def layer_norm_residual(opset=13):
    """The LayerNorm after a residual Add (TorchScript, opset 13): SkipLayerNormalization."""
    b = Builder(opset)
    total = b.node("Add", b.input("x", [B, S, D]), b.input("skip", [B, S, D]))
    y, roles = _torch_layer_norm(b, total)
    return Case(b.model({y: [B, S, D]}), {"com.microsoft::SkipLayerNormalization": 1},
                LAYER_NORM_GONE + ("Add",), (roles["mean"], roles["std"]))


LAYER_NORM_CASES = {
    "torchscript-opset11": lambda: layer_norm_torch(11),
    "torchscript-opset13": lambda: layer_norm_torch(13),
    "torchscript-opset16": lambda: layer_norm_torch(16),
    "torch-opset17-decomposed": lambda: layer_norm_torch(17),
    "torch-no-bias": lambda: layer_norm_torch(13, affine="scale"),
    "torch-no-affine": lambda: layer_norm_torch(17, affine="none"),
    "torch-mul-square": lambda: layer_norm_torch(13, square="Mul"),
    "torch-reciprocal": lambda: layer_norm_torch(17, inverse="Reciprocal"),
    "dynamo-opset18": layer_norm_dynamo,
    "dynamo-opset18-mul-square": lambda: layer_norm_dynamo("Mul"),
    "dynamo-fp16-casts": layer_norm_dynamo_fp16,
    "tf2onnx-opset13": lambda: layer_norm_tf(13),
    "tf2onnx-opset17": lambda: layer_norm_tf(17),
    "keras-no-center": lambda: layer_norm_tf(13, center=False),
    "keras-no-scale": lambda: layer_norm_tf(13, scale=False),
    "residual-opset13": layer_norm_residual,
    "torchscript-opset17-op": layer_norm_torch_17,
    "onnxruntime-optimizer-op": layer_norm_ort_optimizer,
}


# --- Gelu ----------------------------------------------------------------------------------
GELU_GONE = ("Erf", "Tanh", "Div", "Pow")


def _erf_gelu(b, x, order, scaled_by="Div", literal=None):
    """The exact Gelu 0.5 * x * (1 + erf(x / sqrt 2)) in the operand orders exporters write:
      torchscript  Mul(Mul(x, Add(Erf(Div(x, 1.4142)), 1)), 0.5)  (symbolic_opset9.gelu)
      half-first   Mul(Mul(x, 0.5), Add(Erf(..), 1))              (HF's x * 0.5 * (1 + erf))
      half-on-sum  Mul(x, Mul(Add(Erf(..), 1), 0.5))              (onnxruntime's pattern 3)
      reversed     Mul(0.5, Mul(Add(1, Erf(..)), x))              (constants on the left)
      tf           Mul(Mul(0.5, x), Add(1, Erf(..)))              (tf2onnx on tf.nn.gelu)
    scaled_by "Mul" writes x * 0.70710678 for x / sqrt 2."""
    literal = literal or b.literal
    if scaled_by == "Div":
        scaled = b.node("Div", x, literal(1.4142135623730951))
    else:
        scaled = b.node("Mul", literal(0.7071067811865476), x)
    erf = b.node("Erf", scaled)
    if order == "torchscript":
        return b.node("Mul", b.node("Mul", x, b.node("Add", erf, literal(1.0))), literal(0.5))
    if order == "half-first":
        return b.node("Mul", b.node("Mul", x, literal(0.5)), b.node("Add", erf, literal(1.0)))
    if order == "tf":  # tf.nn.gelu: 0.5 * x * (1.0 + erf(x / 1.4142...)), constants left
        return b.node("Mul", b.node("Mul", literal(0.5), x), b.node("Add", literal(1.0), erf))
    if order == "half-on-sum":
        return b.node("Mul", x, b.node("Mul", b.node("Add", erf, literal(1.0)), literal(0.5)))
    return b.node("Mul", literal(0.5), b.node("Mul", b.node("Add", literal(1.0), erf), x))


def _tanh_gelu(b, x, cube="Pow"):
    """The tanh approximation 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))):
      Pow   HF GPT-2's NewGELU: Mul(Mul(0.5, x), Add(1, Tanh(Mul(c, Add(x, Mul(k, Pow(x, 3)))))))
      Mul   TorchScript's F.gelu(approximate="tanh"): the cube as Mul(x, Mul(x, x)) and
            Mul(0.5, Mul(x, Add(1, Tanh(Mul(c, Add(x, Mul(k, cube)))))))
      bloom BLOOM's bloom_gelu_forward, c * x * (1 + k * x * x) factored"""
    if cube == "Pow":
        half = b.node("Mul", b.literal(0.5), x)
        cubed = b.node("Pow", x, b.literal(3.0))
        inner = b.node("Add", x, b.node("Mul", b.literal(0.044715), cubed))
        t = b.node("Tanh", b.node("Mul", b.literal(math.sqrt(2 / math.pi)), inner))
        return b.node("Mul", half, b.node("Add", b.literal(1.0), t))
    if cube == "bloom":  # x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x)))
        poly = b.node("Mul", b.node("Mul", b.literal(0.044715), x), x)
        inner = b.node("Mul", b.node("Mul", b.literal(0.79788456), x),
                       b.node("Add", b.literal(1.0), poly))
        half = b.node("Mul", x, b.literal(0.5))
        return b.node("Mul", half, b.node("Add", b.literal(1.0), b.node("Tanh", inner)))
    cubed = b.node("Mul", x, b.node("Mul", x, x))
    inner = b.node("Mul", b.literal(math.sqrt(2 / math.pi)),
                   b.node("Add", x, b.node("Mul", b.literal(0.044715), cubed)))
    return b.node("Mul", b.literal(0.5),
                  b.node("Mul", x, b.node("Add", b.literal(1.0), b.node("Tanh", inner))))


def _projection(b, width):
    """A 3-D MatMul + bias (a transformer MLP's first layer): the value Gelu reads."""
    x = b.input("x", [B, S, D])
    return b.node("Add", b.node("MatMul", x, b.weight(D, width)), b.weight(width, scale=0.1))


def gelu_erf(order="torchscript", scaled_by="Div", opset=13, dynamo=False):
    b = Builder(opset)
    h = _projection(b, 2 * D)
    literal = (lambda v: b.cast_like(v, h)) if dynamo else None
    y = _erf_gelu(b, h, order, scaled_by, literal)
    fused = {"Gelu": 1} if opset >= 20 else {"com.microsoft::Gelu": 1}
    erf = next(n for n in b.nodes if n.op_type == "Erf")
    return Case(b.model({y: [B, S, 2 * D]}), fused, GELU_GONE, (erf.input[0], erf.output[0]))


def gelu_tanh(cube="Pow", opset=13):
    b = Builder(opset)
    y = _tanh_gelu(b, _projection(b, 2 * D), cube)
    fused = {"Gelu": 1} if opset >= 20 else {"com.microsoft::FastGelu": 1}
    tanh = next(n for n in b.nodes if n.op_type == "Tanh")
    return Case(b.model({y: [B, S, 2 * D]}), fused, GELU_GONE + ("Pow",),
                (tanh.input[0], tanh.output[0]))


def gelu_written_fused(op_type, domain="", **attrs):
    """Gelu as already fused: dynamo's ai.onnx Gelu-20, onnxruntime's optimizer's com.microsoft
    Gelu, FastGelu (with its bias input) and BiasGelu."""
    b = Builder(20 if not domain else 13)
    h = _projection(b, 2 * D)
    inputs = [h] + ([b.weight(2 * D, scale=0.1)] if op_type in ("BiasGelu", "FastGelu") else [])
    y = b.node(op_type, *inputs, domain=domain, **attrs)
    key = f"{domain}::{op_type}" if domain else op_type
    return Case(b.model({y: [B, S, 2 * D]}), {key: 1})


GELU_CASES = {
    "torchscript-erf": lambda: gelu_erf("torchscript"),
    "hf-half-first": lambda: gelu_erf("half-first"),
    "ort-pattern3-half-on-sum": lambda: gelu_erf("half-on-sum"),
    "constants-left": lambda: gelu_erf("reversed"),
    "tf2onnx-erf": lambda: gelu_erf("tf"),
    "mul-by-inverse-sqrt2": lambda: gelu_erf("torchscript", scaled_by="Mul"),
    "half-first-mul-by-inverse-sqrt2": lambda: gelu_erf("half-first", scaled_by="Mul"),
    "dynamo-opset18-castlike": lambda: gelu_erf("half-first", opset=18, dynamo=True),
    "erf-opset20": lambda: gelu_erf("torchscript", opset=20),
    "hf-newgelu-pow": lambda: gelu_tanh("Pow"),
    "torchscript-tanh-mul-cube": lambda: gelu_tanh("Mul"),
    "tanh-opset20": lambda: gelu_tanh("Mul", opset=20),
    "bloom-tanh-factored": lambda: gelu_tanh("bloom"),
    "dynamo-gelu20-op": lambda: gelu_written_fused("Gelu"),
    "dynamo-gelu20-tanh-op": lambda: gelu_written_fused("Gelu", approximate="tanh"),
    "ort-gelu": lambda: gelu_written_fused("Gelu", "com.microsoft"),
    "ort-fastgelu-bias": lambda: gelu_written_fused("FastGelu", "com.microsoft"),
    "ort-biasgelu": lambda: gelu_written_fused("BiasGelu", "com.microsoft"),
}


# --- attention -----------------------------------------------------------------------------
def _linear(b, x, width_in, width_out):
    return b.node("Add", b.node("MatMul", x, b.weight(width_in, width_out, scale=0.2)),
                  b.weight(width_out, scale=0.1))


def _heads(b, proj, perm=(0, 2, 1, 3), explicit=False):
    """torch's view(B, S, N, H) as Reshape, then permute. TorchScript copies the leading
    dimensions with 0; the dynamo exporter, with static shapes, writes them out."""
    target = [B, S, HEADS, HEAD] if explicit else [0, 0, HEADS, HEAD]
    split = b.init(np.array(target, np.int64), "split")
    return b.node("Transpose", b.node("Reshape", proj, split), perm=list(perm))


def _merge(b, ctx, explicit=False):
    merged = b.node("Transpose", ctx, perm=[0, 2, 1, 3])
    target = [B, S, HIDDEN] if explicit else [0, 0, HIDDEN]
    return b.node("Reshape", merged, b.init(np.array(target, np.int64), "merge"))


def attention_bert(key_transposes=1, scale="div"):
    """HF BertSelfAttention as TorchScript writes it: K^T as one Transpose(0, 2, 3, 1) (torch's
    peephole merges the two) or as Transpose(0, 2, 1, 3) then (0, 1, 3, 2); scores / sqrt(H)
    (or, scale "mul-left", Mul(1 / sqrt(H), scores)); the additive mask
    (1 - mask[:, None, None, :]) * -10000 from an int64 padding mask, added on the left."""
    b = Builder(13)
    x = b.input("x", [B, S, HIDDEN])
    mask = b.input("mask", [B, S], TensorProto.INT64)
    q = _heads(b, _linear(b, x, HIDDEN, HIDDEN))
    k_proj = _linear(b, x, HIDDEN, HIDDEN)
    if key_transposes == 1:
        k_t = _heads(b, k_proj, (0, 2, 3, 1))
    else:
        k_t = b.node("Transpose", _heads(b, k_proj), perm=[0, 1, 3, 2])
    v = _heads(b, _linear(b, x, HIDDEN, HIDDEN))
    if scale == "div":
        scores = b.node("Div", b.node("MatMul", q, k_t), b.literal(math.sqrt(HEAD)))
    else:
        scores = b.node("Mul", b.literal(1 / math.sqrt(HEAD)), b.node("MatMul", q, k_t))
    extended = b.node("Cast", b.node("Unsqueeze", b.node("Unsqueeze", mask, b.literal(
        [1], np.int64)), b.literal([2], np.int64)), to=TensorProto.FLOAT)
    additive = b.node("Mul", b.node("Sub", b.literal(1.0), extended), b.literal(-10000.0))
    probs = b.node("Softmax", b.node("Add", additive, scores), axis=-1)
    y = _merge(b, b.node("MatMul", probs, v))
    keep = np.ones((B, S), np.int64)
    keep[0, -2:] = 0
    return Case(b.model({y: [B, S, HIDDEN]}), {"com.microsoft::MultiHeadAttention": 1},
                ("Softmax", "Transpose"), (scores, probs), feeds={"mask": keep})


def attention_bert_dynamic():
    """HF BertSelfAttention as TorchScript writes it with dynamic batch and sequence axes:
    x.view(x.size()[:-1] + (N, H)) becomes Reshape to Concat(Unsqueeze(Gather(Shape(x), 0)),
    Unsqueeze(Gather(Shape(x), 1)), [N], [H]), the merge likewise to (.., .., N*H); shapes
    are symbolic, so the padding mask's rows are expanded to a length read from the query."""
    b = Builder(13)
    x = b.input("x", ["batch", "seq", HIDDEN])
    mask = b.input("mask", ["batch", "seq"], TensorProto.INT64)

    def dims_of(t, tail):
        shape = b.node("Shape", t)
        lead = [b.node("Unsqueeze", b.node("Gather", shape, b.literal(i, np.int64), axis=0),
                       b.literal([0], np.int64)) for i in (0, 1)]
        return b.node("Concat", *lead, *(b.literal([d], np.int64) for d in tail), axis=0)

    def heads(proj):
        split = b.node("Reshape", proj, dims_of(proj, (HEADS, HEAD)))
        return b.node("Transpose", split, perm=[0, 2, 1, 3])

    q = heads(_linear(b, x, HIDDEN, HIDDEN))
    k_t = b.node("Transpose", heads(_linear(b, x, HIDDEN, HIDDEN)), perm=[0, 1, 3, 2])
    v = heads(_linear(b, x, HIDDEN, HIDDEN))
    scores = b.node("Div", b.node("MatMul", q, k_t), b.literal(math.sqrt(HEAD)))
    extended = b.node("Cast", b.node("Unsqueeze", b.node("Unsqueeze", mask, b.literal(
        [1], np.int64)), b.literal([2], np.int64)), to=TensorProto.FLOAT)
    additive = b.node("Mul", b.node("Sub", b.literal(1.0), extended), b.literal(-10000.0))
    probs = b.node("Softmax", b.node("Add", scores, additive), axis=-1)
    ctx = b.node("Transpose", b.node("MatMul", probs, v), perm=[0, 2, 1, 3])
    y = b.node("Reshape", ctx, dims_of(ctx, (HIDDEN,)))
    keep = np.ones((B, S), np.int64)
    keep[1, -3:] = 0
    feeds = {"x": b.rng.standard_normal((B, S, HIDDEN)).astype(np.float32), "mask": keep}
    merge_shape = next(n.output[0] for n in reversed(b.nodes) if n.op_type == "Shape")
    return Case(b.model({y: ["batch", "seq", HIDDEN]}), {"com.microsoft::MultiHeadAttention": 1},
                ("Softmax", "Transpose"), (scores, probs, merge_shape), feeds=feeds)


def _scale_from_shape(b, q):
    """torch's _attention_scale with scale=None: 1 / sqrt(last dimension of Shape(query)), cast
    to the query's type; then, for each of Q and K^T, its Sqrt."""
    last = b.node("Slice", b.node("Shape", q), b.literal([-1], np.int64),
                  b.literal([np.iinfo(np.int64).max], np.int64))
    size = b.node("Cast", last, to=TensorProto.FLOAT)
    scale = b.node("Cast", b.node("Div", b.literal(1.0), b.node("Sqrt", size)),
                   to=TensorProto.FLOAT)
    return lambda: b.node("Sqrt", scale)


def _scale_from_shape_torchlib(b, q):
    """torchlib's _attention_scale (the dynamo exporter, before onnxscript's optimizer folds
    it): Gather(Shape(query), [-1]), CastLike to the query, 1 (CastLike too) / its Sqrt."""
    size = b.node("CastLike", b.node("Gather", b.node("Shape", q),
                                     b.literal([-1], np.int64), axis=0), q)
    scale = b.node("Div", b.node("CastLike", b.literal(1.0), q), b.node("Sqrt", size))
    return lambda: b.node("Sqrt", scale)


def attention_sdpa(opset=14, mask=True, scale_from_shape=False):
    """F.scaled_dot_product_attention as TorchScript (symbolic_opset14) and dynamo (torchlib)
    write it: K^T by Transpose(0, 1, 3, 2), both Q and K^T multiplied by sqrt(scale), MatMul,
    the float attn_mask added, Softmax, MatMul with V; the module splits and merges heads.
    The scale is a literal when the module passes one, else computed from Shape(query)."""
    b = Builder(opset)
    x = b.input("x", [B, S, HIDDEN])
    explicit = opset >= 18  # the dynamo exporter
    q, k, v = (_heads(b, _linear(b, x, HIDDEN, HIDDEN), explicit=explicit) for _ in "qkv")
    if scale_from_shape:
        root_scale = (_scale_from_shape_torchlib if explicit else _scale_from_shape)(b, q)
    else:
        root_scale = lambda: b.literal(math.sqrt(1 / math.sqrt(HEAD)))
    q_scaled = b.node("Mul", q, root_scale())
    k_scaled = b.node("Mul", b.node("Transpose", k, perm=[0, 1, 3, 2]), root_scale())
    scores = b.node("MatMul", q_scaled, k_scaled)
    if mask:
        causal = np.triu(np.full((S, S), -np.inf, np.float32), 1)[None, None]
        scores = b.node("Add", scores, b.init(causal, "attn_mask"))
    probs = b.node("Softmax", scores, axis=-1)
    y = _merge(b, b.node("MatMul", probs, v), explicit=explicit)
    shapes = tuple(n.output[0] for n in b.nodes if n.op_type == "Shape")
    return Case(b.model({y: [B, S, HIDDEN]}), {"com.microsoft::MultiHeadAttention": 1},
                ("Softmax", "Transpose", "Shape", "CastLike"), (q_scaled, probs) + shapes)


def attention_gpt2_past():
    """HF GPT-2 with a KV cache (TorchScript): K, V split into heads with Transpose(0, 2, 1, 3),
    concatenated after the past ones (present_key/value are graph outputs), K^T by
    Transpose(0, 1, 3, 2), scores / sqrt(H) plus an additive causal mask over past + new."""
    b = Builder(13)
    x = b.input("x", [B, S, HIDDEN])
    past_k = b.input("past_key", [B, HEADS, PAST, HEAD])
    past_v = b.input("past_value", [B, HEADS, PAST, HEAD])
    q = _heads(b, _linear(b, x, HIDDEN, HIDDEN))
    k = b.node("Concat", past_k, _heads(b, _linear(b, x, HIDDEN, HIDDEN)), axis=2)
    v = b.node("Concat", past_v, _heads(b, _linear(b, x, HIDDEN, HIDDEN)), axis=2)
    scores = b.node("Div", b.node("MatMul", q, b.node("Transpose", k, perm=[0, 1, 3, 2])),
                    b.literal(math.sqrt(HEAD)))
    causal = np.triu(np.full((S, PAST + S), -10000.0, np.float32), PAST + 1)[None, None]
    probs = b.node("Softmax", b.node("Add", scores, b.init(causal, "causal")), axis=-1)
    y = _merge(b, b.node("MatMul", probs, v))
    cache = [B, HEADS, PAST + S, HEAD]
    return Case(b.model({y: [B, S, HIDDEN], k: cache, v: cache}),
                {"com.microsoft::MultiHeadAttention": 1}, ("Softmax",), (scores, probs))


def attention_onnx23():
    """torch dynamo from opset 23 writes ai.onnx Attention itself: nothing to fuse."""
    b = Builder(23)
    q, k, v = (b.input(n, [B, HEADS, S, HEAD]) for n in ("q", "k", "v"))
    y = b.node("Attention", q, k, v, is_causal=1)
    return Case(b.model({y: [B, HEADS, S, HEAD]}), {"Attention": 1})


ATTENTION_CASES = {
    "bert-torchscript": attention_bert,
    "bert-two-key-transposes": lambda: attention_bert(key_transposes=2),
    "bert-scale-by-mul-on-the-left": lambda: attention_bert(scale="mul-left"),
    "bert-torchscript-dynamic-axes": attention_bert_dynamic,
    "sdpa-torchscript-opset14": attention_sdpa,
    "sdpa-no-mask": lambda: attention_sdpa(mask=False),
    "sdpa-dynamo-opset18": lambda: attention_sdpa(18),
    "sdpa-scale-from-shape": lambda: attention_sdpa(scale_from_shape=True),
    "sdpa-dynamo-scale-from-shape": lambda: attention_sdpa(18, scale_from_shape=True),
}


# --- bias + activation ---------------------------------------------------------------------
def _activation(b, h, activation, opset):
    if activation == "Clip6":  # ReLU6: bounds as inputs from opset 11, attributes before
        if opset >= 11:
            return b.node("Clip", h, b.literal(0.0), b.literal(6.0))
        return b.node("Clip", h, min=0.0, max=6.0)
    if activation == "LeakyRelu":
        return b.node("LeakyRelu", h, alpha=0.1)
    return b.node(activation, h)


def dense_activation(activation, form="gemm", opset=13):
    """A dense layer then its activation, 2-D: torch's Linear is Gemm(transB=1) (form "gemm");
    tf2onnx / keras Dense is MatMul + Add(bias) (form "matmul-add")."""
    b = Builder(opset)
    x = b.input("x", [B * S, D])
    if form == "gemm":
        h = b.node("Gemm", x, b.weight(2 * D, D), b.weight(2 * D, scale=0.1), transB=1)
    else:
        h = b.node("Add", b.node("MatMul", x, b.weight(D, 2 * D)), b.weight(2 * D, scale=0.1))
    y = _activation(b, h, activation, opset)
    return Case(b.model({y: [B * S, 2 * D]}), {"com.microsoft::FusedGemm": 1},
                ("Gemm", "MatMul", "Add", activation), (h,))


def dense_gelu():
    """A dense layer then the exact Gelu (torch Linear, TorchScript's erf decomposition): at
    level 2 Gemm then com.microsoft Gelu, for onnxruntime's FusedGemm has no Gelu activation
    (the plan's elementwise chains run the Gelu in the Gemm's wake)."""
    b = Builder(13)
    x = b.input("x", [B * S, D])
    h = b.node("Add", b.node("MatMul", x, b.weight(D, 2 * D)), b.weight(2 * D, scale=0.1))
    y = _erf_gelu(b, h, "torchscript")
    # no value inside keeps both fusions back (the Gelu family tests the Gelu's own values)
    return Case(b.model({y: [B * S, 2 * D]}), {"Gemm": 1, "com.microsoft::Gelu": 1},
                ("MatMul", "Add", "Erf"))


def conv_activation(activation, bias="input", opset=13):
    """Conv then activation. bias "input": Conv's own bias (torch, tf2onnx); "add": a bias-free
    Conv then Add of a (1, C, 1, 1) constant (keras2onnx / tf2onnx BiasAdd left apart)."""
    b = Builder(opset)
    x = b.input("x", [B, 3, 7, 9])
    w = b.weight(5, 3, 3, 3)
    if bias == "input":
        h = b.node("Conv", x, w, b.weight(5, scale=0.1), pads=[1, 1, 1, 1])
    else:  # "add": the bias as (1, C, 1, 1); "add-c11": as (C, 1, 1)
        shape = (1, 5, 1, 1) if bias == "add" else (5, 1, 1)
        h = b.node("Add", b.node("Conv", x, w, pads=[1, 1, 1, 1]), b.weight(*shape))
    y = _activation(b, h, activation, opset)
    op = "Clip" if activation == "Clip6" else activation
    return Case(b.model({y: [B, 5, 7, 9]}), {"com.microsoft::FusedConv": 1},
                ("Conv", "Add", op), (h,))


BIAS_ACTIVATION_CASES = {
    **{f"torch-linear-{a}": (lambda a=a: dense_activation(a))
       for a in ("Relu", "Sigmoid", "Tanh", "LeakyRelu")},
    **{f"keras-dense-{a}": (lambda a=a: dense_activation(a, "matmul-add"))
       for a in ("Relu", "Sigmoid", "Tanh", "LeakyRelu")},
    **{f"conv-{a}": (lambda a=a: conv_activation(a))
       for a in ("Relu", "Sigmoid", "Tanh", "LeakyRelu")},
    "keras-dense-gelu": dense_gelu,
    "conv-relu6-clip-inputs-opset11": lambda: conv_activation("Clip6", opset=11),
    "conv-relu6-clip-attributes-opset10": lambda: conv_activation("Clip6", opset=10),
    "conv-add-bias-relu": lambda: conv_activation("Relu", bias="add"),
    "conv-add-bias-relu6": lambda: conv_activation("Clip6", bias="add", opset=13),
    "conv-add-bias-c11-leakyrelu": lambda: conv_activation("LeakyRelu", bias="add-c11"),
}
