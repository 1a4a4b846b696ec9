"""Small models written node by node the way PyTorch's exporter writes two real architectures,
kept because optimized/ once gave silently wrong answers on both (issue 12): the elementwise
chain fusion read non-contiguous views (Split halves, Transpose outputs) through pointers into
copies that had already been freed.

- build_phi3_mlp: a Phi-3-style decoder MLP.  RMSNorm, then one fused gate/up projection whose
  output is cut in halves (Split, or two Slices as the dynamo exporter writes `chunk`), then
  SiLU(gate) * up as Sigmoid -> Mul -> Mul, the down projection and the residual Add.  Both
  halves of a last-axis Split are strided views, so the chain reads views as its first value
  and as both side operands.
- build_mobilevit_block: a MobileViT (v1) block.  Local 3x3 and 1x1 convolutions, unfolding
  into patches by Reshape/Transpose pairs (ending in a strided view), a pre-norm transformer
  layer whose residual Add reads that transposed value, folding back, a 1x1 projection and the
  3x3 fusion convolution over the block input concatenated with it.

Each builder returns an onnx.ModelProto; random_feeds(model, seed) makes inputs for any of them.

    python -m tests.models.exporter_style phi3.onnx mobilevit.onnx
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # LayerNormalization exists; Split takes its sizes as an input, ReduceMean its
# axes still as an attribute (as in most exported models)
IR_VERSION = 8
F = TensorProto.FLOAT


class _Graph:
    """Collects nodes and initializers; every name it makes is unique."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
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

    def weight(self, stem: str, shape, scale: float) -> str:
        return self.const(stem, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def node(self, op_type: str, inputs: list[str], n_outputs: int = 1, **attrs) -> list[str]:
        outputs = [self.name(op_type.lower()) for _ in range(n_outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=self.name(op_type),
                                           **attrs))
        return outputs

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        return self.node(op_type, list(inputs), **attrs)[0]

    def model(self, name: str, inputs, output: str, output_shape) -> onnx.ModelProto:
        self.nodes[-1].output[0] = "y"
        for node in self.nodes:  # the last node's output is renamed: readers follow it
            node.input[:] = ["y" if i == output else i for i in node.input]
        graph = helper.make_graph(self.nodes, name, inputs,
                                  [helper.make_tensor_value_info("y", F, output_shape)],
                                  self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="pytorch-style", ir_version=IR_VERSION)
        onnx.checker.check_model(model)
        return model


def _layer_norm(g: _Graph, x: str, width: int) -> str:
    scale = g.const("ln_scale", (1.0 + 0.1 * g.rng.standard_normal(width)).astype(np.float32))
    bias = g.weight("ln_bias", (width,), 0.1)
    return g.op("LayerNormalization", x, scale, bias, axis=-1, epsilon=1e-5)


# --- Phi-3 decoder MLP ---------------------------------------------------------------------

@dataclass(frozen=True)
class Phi3MlpConfig:
    batch: int = 2
    seq: int = 7
    hidden: int = 48
    intermediate: int = 80  # the gate/up projection is 2 * intermediate wide
    chunk: str = "split"  # how `gate, up = x.chunk(2, -1)` is exported: "split" or "slice"
    epsilon: float = 1e-5
    seed: int = 0


def build_phi3_mlp(config: Phi3MlpConfig = Phi3MlpConfig()) -> onnx.ModelProto:
    """x (batch, seq, hidden) -> x + down(SiLU(gate) * up), [gate, up] = gate_up(RMSNorm(x))."""
    if config.chunk not in ("split", "slice"):
        raise ValueError(f"chunk must be 'split' or 'slice', got {config.chunk!r}")
    g = _Graph(config.seed)
    h, inter = config.hidden, config.intermediate
    # RMSNorm as exported: x * 1/sqrt(mean(x^2) + eps) * weight
    square = g.op("Pow", "x", g.const("two", np.float32(2.0)))
    mean = g.op("ReduceMean", square, axes=[-1], keepdims=1)
    root = g.op("Sqrt", g.op("Add", mean, g.const("eps", np.float32(config.epsilon))))
    normed = g.op("Mul", g.op("Div", "x", root),
                  g.const("rms_weight", (1.0 + 0.1 * g.rng.standard_normal(h)).astype(np.float32)))
    gate_up = g.op("MatMul", normed, g.weight("gate_up_proj", (h, 2 * inter), h ** -0.5))
    if config.chunk == "split":
        gate, up = g.node("Split", [gate_up, g.const("halves", np.array([inter, inter]))], 2,
                          axis=-1)
    else:
        def half(start, end):
            return g.op("Slice", gate_up, g.const("start", np.array([start])),
                        g.const("end", np.array([end])), g.const("axis", np.array([-1])))
        gate, up = half(0, inter), half(inter, 2 * inter)
    silu = g.op("Mul", gate, g.op("Sigmoid", gate))
    gated = g.op("Mul", up, silu)
    down = g.op("MatMul", gated, g.weight("down_proj", (inter, h), inter ** -0.5))
    out = g.op("Add", "x", down)
    dims = [config.batch, config.seq, h]
    return g.model("phi3_mlp", [helper.make_tensor_value_info("x", F, dims)], out, dims)


# --- MobileViT block -----------------------------------------------------------------------

@dataclass(frozen=True)
class MobileVitConfig:
    batch: int = 1  # with one image, the unfold's last Reshape is a view of a Transpose
    channels: int = 6
    dim: int = 12  # transformer width
    height: int = 8
    width: int = 6
    patch: int = 2  # patch height = patch width
    seed: int = 0


def build_mobilevit_block(config: MobileVitConfig = MobileVitConfig()) -> onnx.ModelProto:
    """x (batch, channels, height, width) -> fusion_conv(Concat(x, fold(transformer(unfold(
    local(x)))))), with MobileViT v1's unfold and fold (Reshape/Transpose pairs) as exported.

    The unfold ends with Transpose(1, 3) and a Reshape that only merges the batch axis; numpy
    gives that Reshape as a strided view, and the transformer layer's first residual Add
    (t + Linear(LN(t))) reads it."""
    c, d, p = config.channels, config.dim, config.patch
    n, hh, ww = config.batch, config.height, config.width
    if hh % p or ww % p:
        raise ValueError(f"height {hh} and width {ww} must be multiples of the patch {p}")
    g = _Graph(config.seed)
    grid_h, grid_w = hh // p, ww // p

    def shape(*dims):
        return g.const("shape", np.array(dims, np.int64))

    def conv(x, c_in, c_out, k, stem):
        w = g.weight(stem, (c_out, c_in, k, k), (c_in * k * k) ** -0.5)
        b = g.weight(stem + "_bias", (c_out,), 0.1)
        return g.op("Conv", x, w, b, kernel_shape=[k, k], pads=[k // 2] * 4)

    def silu(x):
        return g.op("Mul", x, g.op("Sigmoid", x))

    def linear(x, c_in, c_out, stem):
        return g.op("Add", g.op("MatMul", x, g.weight(stem, (c_in, c_out), c_in ** -0.5)),
                    g.weight(stem + "_bias", (c_out,), 0.1))

    local = conv(silu(conv("x", c, c, 3, "conv_kxk")), c, d, 1, "conv_1x1")
    # unfold: (N, D, H, W) -> (N * p*p, patches, D)
    t = g.op("Reshape", local, shape(n * d * grid_h, p, grid_w, p))
    t = g.op("Transpose", t, perm=[0, 2, 1, 3])
    t = g.op("Reshape", t, shape(n, d, grid_h * grid_w, p * p))
    t = g.op("Transpose", t, perm=[0, 3, 2, 1])
    tokens = g.op("Reshape", t, shape(n * p * p, grid_h * grid_w, d))
    # pre-norm transformer layer: the token mixing stands in for attention (a Linear as well)
    hidden = g.op("Add", tokens, linear(_layer_norm(g, tokens, d), d, d, "token_mix"))
    mlp = linear(silu(linear(_layer_norm(g, hidden, d), d, 2 * d, "fc1")), 2 * d, d, "fc2")
    hidden = _layer_norm(g, g.op("Add", hidden, mlp), d)
    # fold: (N * p*p, patches, D) -> (N, D, H, W)
    t = g.op("Reshape", hidden, shape(n, p * p, grid_h * grid_w, d))
    t = g.op("Transpose", t, perm=[0, 3, 2, 1])
    t = g.op("Reshape", t, shape(n * d * grid_h, grid_w, p, p))
    t = g.op("Transpose", t, perm=[0, 2, 1, 3])
    folded = g.op("Reshape", t, shape(n, d, hh, ww))
    projected = silu(conv(folded, d, c, 1, "conv_proj"))
    out = conv(g.op("Concat", "x", projected, axis=1), 2 * c, c, 3, "conv_fusion")
    dims = [n, c, hh, ww]
    return g.model("mobilevit_block", [helper.make_tensor_value_info("x", F, dims)], out, dims)


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal float32 inputs for every graph input of a model with static shapes."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in model.graph.input:
        shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
        feeds[info.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tests.models.exporter_style PHI3.onnx MOBILEVIT.onnx",
              file=sys.stderr)
        return 2
    onnx.save(build_phi3_mlp(), argv[0])
    onnx.save(build_mobilevit_block(), argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
