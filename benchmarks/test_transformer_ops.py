"""The transformer's memory-bound kernels (Gelu, tanh Gelu, Softmax, LayerNormalization) at each
vector-instruction level this CPU runs (kernels.isa_limit), beside onnxruntime's one-node model
with intra_op_num_threads set.  Shapes are the suite's: bert-mini's 128 x 1024 Gelu and
128 x 256 LayerNormalization, gpt2's 128 x 3072 tanh Gelu, 4 heads' 128 x 128 attention scores,
vit's 37 x 192 LayerNormalization.  Every contender's result is checked against ours.

    pytest benchmarks/test_transformer_ops.py --benchmark-only --benchmark-group-by=group
"""
from __future__ import annotations

import gc

import numpy as np
import pytest
from onnx import TensorProto, helper

from optimized import kernels

from .test_kernels import rand

CASES = {  # name: (op, input shape)
    "gelu_128x1024": ("Gelu", (128, 1024)),
    "gelu_tanh_128x3072": ("GeluTanh", (128, 3072)),
    "softmax_512x128": ("Softmax", (512, 128)),
    "layernorm_128x256": ("LayerNormalization", (128, 256)),
    "layernorm_37x192": ("LayerNormalization", (37, 192)),
}
IMPLS = ["avx2", "avx512", "onnxruntime"]  # the portable loops are a fallback, not a contender


def ours(op, x, scale, bias, out):
    if op == "Softmax":
        return lambda: kernels.softmax(x, out=out)
    if op == "LayerNormalization":
        return lambda: kernels.layer_norm(x, scale, bias, out=out)
    return lambda: kernels.activation(x, op, out=out)


def ort_session(node, x, initializers, threads):
    ort = pytest.importorskip("onnxruntime")
    graph = helper.make_graph(
        [node], "bench", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[helper.make_tensor(n, TensorProto.FLOAT, v.shape, v.ravel())
                     for n, v in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)],
                              ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def ort_node(op):
    if op == "LayerNormalization":
        return helper.make_node(op, ["x", "scale", "bias"], ["y"], axis=-1)
    if op in ("Gelu", "GeluTanh"):  # com.microsoft's, as onnxruntime fuses exported graphs
        name = "Gelu" if op == "Gelu" else "FastGelu"
        return helper.make_node(name, ["x"], ["y"], domain="com.microsoft")
    return helper.make_node(op, ["x"], ["y"], axis=-1)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_transformer_op(benchmark, case, impl, threads):
    op, shape = CASES[case]
    x = rand(1, shape) * np.float32(3.0)
    scale, bias = rand(2, shape[-1:]), rand(3, shape[-1:])
    benchmark.group = f"{case} {threads}thr"
    out = np.empty_like(x)
    expected = ours(op, x, scale, bias, np.empty_like(x))()
    if impl == "onnxruntime":
        initializers = {"scale": scale, "bias": bias} if op == "LayerNormalization" else {}
        sess = ort_session(ort_node(op), x, initializers, threads)
        got = benchmark(sess.run, None, {"x": x})[0]
        del sess  # its spinning pool threads would compete with the next benchmarks
        gc.collect()
    else:
        if list(kernels.ISAS).index(impl) > list(kernels.ISAS).index(kernels.cpu_isa()):
            pytest.skip(f"this CPU runs at most {kernels.cpu_isa()}, not {impl}")
        with kernels.isa_limit(impl):
            got = benchmark(ours(op, x, scale, bias, out))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
