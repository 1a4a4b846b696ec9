"""A small BERT-like encoder written node by node the way PyTorch's exporter writes it.

The graph is deliberately decomposed (LayerNormalization as ReduceMean/Sub/Pow/.../Add, Gelu as
Div/Erf/Add/Mul/Mul or its tanh approximation, attention as MatMul/Reshape/Transpose/.../Softmax)
so that onnxruntime's optimizers have something to fuse: the tests run those optimizers and then
check that the fused com.microsoft ops they expect are really in the rewritten model.

    python -m tests.models.build_transformer out.onnx     # writes the float model
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# 17: LayerNormalization exists (the optimizers write it); ReduceMean still takes `axes` as an
# attribute, as in most exported BERTs
OPSET = 17
IR_VERSION = 8
MASK_FILTER = -10000.0


@dataclass(frozen=True)
class EncoderConfig:
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    intermediate: int = 256
    seq: int = 16
    gelu: str = "erf"  # "erf" (BERT) or "tanh" (GPT-2 style approximation)
    epsilon: float = 1e-12
    masked: bool = True  # with an attention_mask input (BERT) or without one
    opset: int = OPSET  # 13..17: Unsqueeze takes axes as an input, ReduceMean as an attribute


class _GraphBuilder:
    """Collects nodes and initializers; every name it makes is unique."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def const(self, stem: str, value) -> str:
        name = self.name(stem)
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, stem: str, shape, scale: float = 0.05) -> str:
        return self.const(stem, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def node(self, op_type: str, inputs: list[str], **attrs) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out + "_node", **attrs))
        return out


def _f32(v: float) -> np.ndarray:
    return np.array(v, np.float32)


def _linear(g: _GraphBuilder, x: str, n_in: int, n_out: int) -> str:
    """MatMul then Add(bias), as torch.nn.Linear exports on 3-D inputs."""
    w = g.weight("weight", (n_in, n_out))
    b = g.weight("bias", (n_out,))
    return g.node("Add", [g.node("MatMul", [x, w]), b])


def _layer_norm(g: _GraphBuilder, x: str, hidden: int, epsilon: float) -> str:
    mean = g.node("ReduceMean", [x], axes=[-1])
    centered = g.node("Sub", [x, mean])
    var = g.node("ReduceMean", [g.node("Pow", [centered, g.const("two", _f32(2.0))])], axes=[-1])
    std = g.node("Sqrt", [g.node("Add", [var, g.const("eps", _f32(epsilon))])])
    normed = g.node("Div", [centered, std])
    gamma = g.const("gamma", (1.0 + 0.1 * g.rng.standard_normal(hidden)).astype(np.float32))
    beta = g.weight("beta", (hidden,), scale=0.1)
    return g.node("Add", [g.node("Mul", [normed, gamma]), beta])


def _gelu_erf(g: _GraphBuilder, x: str) -> str:
    erf = g.node("Erf", [g.node("Div", [x, g.const("sqrt2", _f32(np.sqrt(2.0)))])])
    inner = g.node("Mul", [x, g.node("Add", [erf, g.const("one", _f32(1.0))])])
    return g.node("Mul", [inner, g.const("half", _f32(0.5))])


def _gelu_tanh(g: _GraphBuilder, x: str) -> str:
    cube = g.node("Pow", [x, g.const("three", _f32(3.0))])
    inner = g.node("Add", [x, g.node("Mul", [cube, g.const("c", _f32(0.044715))])])
    scaled = g.node("Mul", [inner, g.const("sqrt_2_over_pi", _f32(np.sqrt(2.0 / np.pi)))])
    plus_one = g.node("Add", [g.node("Tanh", [scaled]), g.const("one", _f32(1.0))])
    return g.node("Mul", [g.node("Mul", [x, g.const("half", _f32(0.5))]), plus_one])


def _attention(g: _GraphBuilder, x: str, additive_mask: str | None, cfg: EncoderConfig) -> str:
    head = cfg.hidden // cfg.heads
    split = g.const("split_heads", np.array([0, 0, cfg.heads, head], np.int64))
    merge = g.const("merge_heads", np.array([0, 0, cfg.hidden], np.int64))

    def project(perm):
        return g.node("Transpose", [g.node("Reshape", [_linear(g, x, cfg.hidden, cfg.hidden),
                                                       split])], perm=perm)

    q = project([0, 2, 1, 3])  # [B, N, S, H]
    k = project([0, 2, 3, 1])  # [B, N, H, S]: K already transposed for Q @ K^T
    v = project([0, 2, 1, 3])
    scores = g.node("Div", [g.node("MatMul", [q, k]), g.const("sqrt_head", _f32(np.sqrt(head)))])
    if additive_mask is not None:
        scores = g.node("Add", [scores, additive_mask])
    probs = g.node("Softmax", [scores], axis=-1)
    context = g.node("Transpose", [g.node("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    return _linear(g, g.node("Reshape", [context, merge]), cfg.hidden, cfg.hidden)


def _additive_mask(g: _GraphBuilder, mask: str) -> str:
    """[B, S] 0/1 int64 -> [B, 1, 1, S] float: 0 where attended, -10000 where masked."""
    expanded = g.node("Unsqueeze", [g.node("Unsqueeze", [mask, g.const("axis1", np.array([1], np.int64))]),
                                    g.const("axis2", np.array([2], np.int64))])
    flipped = g.node("Sub", [g.const("one", _f32(1.0)),
                             g.node("Cast", [expanded], to=TensorProto.FLOAT)])
    return g.node("Mul", [flipped, g.const("filter", _f32(MASK_FILTER))])


def _encoder_layer(g: _GraphBuilder, x: str, additive_mask: str | None, cfg: EncoderConfig) -> str:
    attended = g.node("Add", [_attention(g, x, additive_mask, cfg), x])
    x = _layer_norm(g, attended, cfg.hidden, cfg.epsilon)
    gelu = _gelu_erf if cfg.gelu == "erf" else _gelu_tanh
    ff = _linear(g, gelu(g, _linear(g, x, cfg.hidden, cfg.intermediate)),
                 cfg.intermediate, cfg.hidden)
    return _layer_norm(g, g.node("Add", [ff, x]), cfg.hidden, cfg.epsilon)


def build_encoder(cfg: EncoderConfig = EncoderConfig(), seed: int = 0) -> onnx.ModelProto:
    """Inputs: hidden_states float32 [batch, seq, hidden] (the embeddings' sum) and
    attention_mask int64 [batch, seq]; output: last_hidden_state [batch, seq, hidden]."""
    if cfg.hidden % cfg.heads:
        raise ValueError(f"hidden {cfg.hidden} is not a multiple of heads {cfg.heads}")
    if not 13 <= cfg.opset <= 17:
        raise ValueError(f"opset must be 13..17 for this graph, got {cfg.opset}")
    if cfg.gelu not in ("erf", "tanh"):
        raise ValueError(f"gelu must be 'erf' or 'tanh', got {cfg.gelu!r}")
    g = _GraphBuilder(np.random.default_rng(seed))
    additive_mask = _additive_mask(g, "attention_mask") if cfg.masked else None
    x = _layer_norm(g, "hidden_states", cfg.hidden, cfg.epsilon)  # the embeddings' LayerNorm
    for _ in range(cfg.layers):
        x = _encoder_layer(g, x, additive_mask, cfg)
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
    inputs = [helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT,
                                            ["batch", cfg.seq, cfg.hidden])]
    if cfg.masked:
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                                    ["batch", cfg.seq]))
    graph = helper.make_graph(
        g.nodes,
        "bert_like_encoder",
        inputs,
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                       ["batch", cfg.seq, cfg.hidden])],
        g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", cfg.opset)],
                              producer_name="onnx-parity-tests")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def encoder_feeds(cfg: EncoderConfig, batch: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs; every sequence after the first is right-padded (3 more positions each,
    at least one kept) so that the mask really masks."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, cfg.seq), np.int64)
    for b in range(1, batch):
        mask[b, max(cfg.seq - 3 * b, 1):] = 0
    feeds = {"hidden_states": rng.standard_normal((batch, cfg.seq, cfg.hidden)).astype(np.float32)}
    if cfg.masked:
        feeds["attention_mask"] = mask
    return feeds


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.models.build_transformer OUT.onnx")
    onnx.save(build_encoder(), sys.argv[1])
