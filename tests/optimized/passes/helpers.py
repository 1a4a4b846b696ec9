"""Shared by the pass tests: small model builders and the check every rewrite must pass."""
from __future__ import annotations

import collections
import math
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conformance.inputs import random_inputs
from reference import ReferenceEvaluator

LIGHT_MODELS = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def make_model(nodes, inputs, outputs, initializers=(), opset=17, ir_version=8):
    """inputs/outputs: (name, shape) pairs of float32 tensors, or ValueInfoProtos."""
    def infos(pairs):
        return [p if isinstance(p, onnx.ValueInfoProto)
                else helper.make_tensor_value_info(p[0], TensorProto.FLOAT, p[1]) for p in pairs]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(initializers).items()]
    graph = helper.make_graph(nodes, "g", infos(inputs), infos(outputs), inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=ir_version)


def op_types(model) -> collections.Counter:
    return collections.Counter(
        (f"{n.domain}::" if n.domain not in ("", "ai.onnx") else "") + n.op_type
        for n in model.graph.node)


def check_model(model):
    """onnx's full check. onnx has LayerNormalization from opset 17 only, while onnxruntime (and
    the reference) register it from version 1 and layer_norm_fusion writes it at any opset, as
    onnxruntime's optimizer does: those nodes are checked under a domain of their own."""
    if opset_of(model) < 17 and any(n.op_type == "LayerNormalization" and n.domain in (
            "", "ai.onnx") for n in model.graph.node):
        model = onnx.ModelProto.FromString(model.SerializeToString())
        for node in model.graph.node:
            if node.op_type == "LayerNormalization" and node.domain in ("", "ai.onnx"):
                node.domain = "onnxruntime.layer_norm_v1"
        model.opset_import.append(helper.make_opsetid("onnxruntime.layer_norm_v1", 1))
    onnx.checker.check_model(model, full_check=True)


def opset_of(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def assert_same_outputs(original, rewritten, seed=0, rtol=1e-4, atol=1e-5, feeds=None):
    """The rewrite is valid ONNX and computes what the original computes, by the reference and,
    when it is installed, by onnxruntime (with its own rewrites off)."""
    check_model(rewritten)
    feeds = feeds if feeds is not None else random_inputs(original, seed=seed)
    expected = ReferenceEvaluator(original).run(None, feeds)
    got = ReferenceEvaluator(rewritten).run(None, feeds)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
    try:
        import onnxruntime as ort
    except ImportError:
        return
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(rewritten.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    for e, g in zip(expected, session.run(None, feeds)):
        # onnxruntime rounds every step to float32 where some reference ops compute in float64:
        # after a cancellation the gap is a few ulps of the largest value, not of the result
        finite = np.abs(e[np.isfinite(e)]) if np.issubdtype(e.dtype, np.floating) else np.zeros(0)
        scale = float(finite.max()) if finite.size else 0.0
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol + 1e-6 * scale)


class _Builder:
    def __init__(self, opset, seed=0):
        self.opset, self.rng = opset, np.random.default_rng(seed)
        self.nodes, self.inits, self.count = [], {}, 0

    def name(self, stem):
        self.count += 1
        return f"{stem}{self.count}"

    def const(self, value, stem="c"):
        name = self.name(stem)
        self.inits[name] = np.asarray(value)
        return name

    def weight(self, *shape, scale=0.2):
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32), "w")

    def f32(self, value):
        return self.const(np.float32(value))

    def node(self, op_type, *inputs, **attrs):
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out + "_n", **attrs))
        return out

    def reduce_mean(self, x):
        if self.opset >= 18:
            return self.node("ReduceMean", x, self.const(np.array([-1], np.int64)))
        return self.node("ReduceMean", x, axes=[-1])

    def layer_norm(self, x, d, eps=1e-5):
        """The decomposed LayerNormalization PyTorch's exporter writes."""
        mean = self.reduce_mean(x)
        centered = self.node("Sub", x, mean)
        var = self.reduce_mean(self.node("Pow", centered, self.f32(2.0)))
        std = self.node("Sqrt", self.node("Add", var, self.f32(eps)))
        normed = self.node("Div", centered, std)
        gamma = self.const((1 + 0.1 * self.rng.standard_normal(d)).astype(np.float32))
        beta = self.const((0.1 * self.rng.standard_normal(d)).astype(np.float32))
        return self.node("Add", self.node("Mul", normed, gamma), beta)

    def linear(self, x, d_in, d_out):
        y = self.node("MatMul", x, self.weight(d_in, d_out))
        return self.node("Add", y, self.weight(d_out, scale=0.1))

    def gelu_tanh(self, x):
        """HF GPT-2's NewGELU as exported: 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3)))."""
        half = self.node("Mul", self.f32(0.5), x)
        cube = self.node("Pow", x, self.f32(3.0))
        inner = self.node("Add", x, self.node("Mul", self.f32(0.044715), cube))
        t = self.node("Tanh", self.node("Mul", self.f32(math.sqrt(2 / math.pi)), inner))
        return self.node("Mul", half, self.node("Add", self.f32(1.0), t))

    def gelu_erf(self, x):
        """BERT's exact Gelu as exported: (x * (1 + erf(x / sqrt(2)))) * 0.5."""
        e = self.node("Erf", self.node("Div", x, self.f32(math.sqrt(2.0))))
        return self.node("Mul", self.node("Mul", x, self.node("Add", e, self.f32(1.0))),
                         self.f32(0.5))

    def attention(self, x, d, heads, seq, mask=True):
        head = d // heads
        split = self.const(np.array([0, 0, heads, head], np.int64))

        def heads_of(proj, perm):
            return self.node("Transpose", self.node("Reshape", proj, split), perm=perm)

        q = heads_of(self.linear(x, d, d), [0, 2, 1, 3])
        k_t = heads_of(self.linear(x, d, d), [0, 2, 3, 1])
        v = heads_of(self.linear(x, d, d), [0, 2, 1, 3])
        scores = self.node("Div", self.node("MatMul", q, k_t), self.f32(math.sqrt(head)))
        if mask:
            causal = np.triu(np.full((seq, seq), -10000.0, np.float32), 1)[None, None]
            scores = self.node("Add", scores, self.const(causal, "mask"))
        axis = -1 if self.opset >= 13 else 3
        probs = self.node("Softmax", scores, axis=axis)
        merged = self.node("Transpose", self.node("MatMul", probs, v), perm=[0, 2, 1, 3])
        out = self.node("Reshape", merged, self.const(np.array([0, 0, d], np.int64)))
        return self.linear(out, d, d)


def gpt2_block(opset=17, d=64, heads=4, batch=2, seq=8, gelu="tanh", mask=True, seed=0,
               layers=1):
    """GPT-2-like decoder blocks (pre-LayerNorm, attention, residual, MLP, residual),
    decomposed the way an exporter writes them."""
    b = _Builder(opset, seed)
    x = "x"
    for _ in range(layers):
        attended = b.attention(b.layer_norm(x, d), d, heads, seq, mask)
        residual = b.node("Add", x, attended)
        hidden = b.linear(b.layer_norm(residual, d), d, 4 * d)
        activated = b.gelu_tanh(hidden) if gelu == "tanh" else b.gelu_erf(hidden)
        x = b.node("Add", residual, b.linear(activated, 4 * d, d))
    b.nodes.append(helper.make_node("Identity", [x], ["y"]))
    return make_model(b.nodes, [("x", [batch, seq, d])], [("y", [batch, seq, d])], b.inits,
                      opset=opset)


def light_model(name):
    path = os.path.join(LIGHT_MODELS, f"{name}.onnx")
    return onnx.load(path)
